"""Stop conditions (composable, parsed from strings) and typed answer normalisation."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TypeVar

import httpx
import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

import moot.core.stop as stop_module
from moot import ScriptedModel
from moot.cli.main import app
from moot.core import (
    Budget,
    Consensus,
    Engine,
    MaxRounds,
    ModeratorVerdict,
    NoDecision,
    Participant,
    Persona,
    ProtocolSpec,
    StableAnswers,
    TokenBudget,
    TurnFormat,
    Visibility,
    normalize_answer,
    parse_stop,
)
from moot.core.stop import MAX_DEPTH, MAX_TERMS, AllOf, AnyOf, StopCondition, StopParseError
from moot.models.base import ChatRequest
from moot.server import ServerSettings
from moot.structured import register_schema
from moot.testing.fake_openai import FakeOpenAIServer
from serving import FAKE_KEY, ServerThread


class Vote(BaseModel):
    answer: str
    confidence: float = 0.5


class Verdict(BaseModel):
    confidence: float
    conclude: bool = False


register_schema("test-vote", Vote)
register_schema("test-verdict", Verdict)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("(B)", "B"), ("b.", "B"), ("Answer: c", "C"), ("option D", "D"), ("1,000", "1000"), ("1000.0", "1000"),
        (" $42 ", "42"), ("3.50", "3.5"), (7, "7"), (2.0, "2"), ("Yes.", "yes"), (True, "yes"), ("FALSE", "no"),
        ("  Paris  ", "paris"), ("", None), (None, None), ("maybe", "maybe"),
    ],
)  # fmt: skip
def test_answers_are_normalised(raw: object, expected: str | None) -> None:
    assert normalize_answer(raw) == expected


def test_expressions_parse_round_trip_and_compose() -> None:
    cond = parse_stop("max_rounds(3) | consensus(0.8) & stable_answers()")
    assert cond == MaxRounds(3) | (Consensus(0.8) & StableAnswers())
    assert parse_stop(cond.expr()) == cond
    assert parse_stop("moderator('moderator', 'confidence', 0.8)") == ModeratorVerdict("moderator", "confidence", 0.8)
    assert parse_stop("token_budget(20_000)") == TokenBudget(20000)
    assert (MaxRounds(2) | TokenBudget(5) | Consensus(1.0)).expr() == "max_rounds(2) | token_budget(5) | consensus(1)"
    for bad, message in [
        ("max_round(3)", "unknown stop condition 'max_round'"),
        ("max_rounds(3) |", "expected more"),
        ("max_rounds(3))", "unexpected ')'"),
        ("max_rounds(3, 4, 5)", "wrong arguments"),
        ("import os", "unknown stop condition 'import'"),
        ("open('x').read()", "cannot read stop condition"),
        # Arguments a condition could never act on (an outside trial: each was taken silently)
        ("max_rounds(0)", "max_rounds takes a whole number of at least 1, not 0"),
        ("max_rounds(-3)", "not -3"),
        ("max_rounds(2.5)", "not 2.5"),
        ("token_budget(-5)", "token_budget takes a whole number of at least 1"),
        ("call_budget(0)", "call_budget takes a whole number of at least 1"),
        ("consensus(1.8)", "consensus takes a share above 0 and at most 1, not 1.8"),
        ("consensus(-1)", "not -1"),
        ("consensus(0.8, 3)", "consensus takes the answer's field as a quoted name (e.g. 'answer'), not 3"),
        ("settled(2)", "settled takes a share above 0 and at most 1"),
        ("stable_answers(5)", "stable_answers takes the answer's field as a quoted name"),
        ("timeout(0)", "timeout takes seconds above 0"),
        ("moderator(1)", "moderator takes the speaker and its field as quoted names"),
        ("never(5)", "wrong arguments for never(...)"),
    ]:
        with pytest.raises(StopParseError, match=re.escape(message)):
            parse_stop(bad)
    # A field other than 'answer' is written back inside the call, and read back the same.
    for text in ("consensus(0.8, 'verdict')", "settled(0.9, 'verdict')", "stable_answers('verdict')"):
        assert parse_stop(text).expr() == text and parse_stop(parse_stop(text).expr()) == parse_stop(text)


def nested(depth: int) -> str:
    return "(" * depth + "max_rounds(1)" + ")" * depth


def chain(op: str, terms: int) -> str:
    return f" {op} ".join(f"max_rounds({n + 1})" for n in range(terms))


DEEP = f"parentheses nest deeper than {MAX_DEPTH} levels; remove redundant ones"
LONG = f"more than {MAX_TERMS} conditions; combine at most {MAX_TERMS}"


def test_an_expression_nested_too_deep_is_refused_in_one_line() -> None:
    """400 levels of parentheses raised a RecursionError: a 500 from moot serve, a traceback from
    moot debate (a security review's). Now it is a syntax error like any other, named, one line."""
    assert MAX_DEPTH == 32 and MAX_TERMS == 256  # as docs/architecture.md and the README say
    assert parse_stop(nested(MAX_DEPTH)) == MaxRounds(1)
    assert parse_stop(f"{'(' * MAX_DEPTH}max_rounds(1) | consensus(0.5){')' * MAX_DEPTH} & timeout(9)") == (
        (MaxRounds(1) | Consensus(0.5)) & stop_module.Timeout(9)
    )
    for depth in (MAX_DEPTH + 1, 400, 100_000):
        with pytest.raises(StopParseError, match=re.escape(DEEP)) as refused:
            parse_stop(nested(depth))
        message = str(refused.value)
        assert "\n" not in message and len(message) < 200, message  # the expression's start, not all of it
    # A call's own parentheses are not a level: 32 groups around a call are allowed, 33 are not.
    with pytest.raises(StopParseError, match=re.escape(DEEP)):
        parse_stop("(" * (MAX_DEPTH + 1) + "never()" + ")" * (MAX_DEPTH + 1))


T = TypeVar("T")


def with_frames_left(left: int, call: Callable[[], T]) -> T:
    """``call()`` run where only about ``left`` more Python frames fit under the recursion limit."""
    frame: FrameType | None = sys._getframe()
    depth = 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1

    def down(n: int) -> T:
        return call() if n <= 0 else down(n - 1)

    return down(sys.getrecursionlimit() - depth - left)


def test_the_depth_limit_is_met_long_before_the_recursion_limit() -> None:
    """The deepest expression allowed parses with 150 frames to spare (the parser takes three a
    level), and one of any depth is refused by the limit, not by Python's RecursionError, however
    deep the caller already is."""
    assert with_frames_left(150, lambda: parse_stop(nested(MAX_DEPTH))) == MaxRounds(1)
    with pytest.raises(StopParseError, match=re.escape(DEEP)):
        with_frames_left(150, lambda: parse_stop(nested(100_000)))


@pytest.mark.parametrize(("op", "kind"), [("|", AnyOf), ("&", AllOf)])
def test_a_long_chain_is_read_in_one_pass_up_to_the_limit(
    op: str, kind: type[AnyOf] | type[AllOf], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each ``|`` copied the list of the terms before it: 70,000 terms (980 KB) took seconds of a
    server's event loop. A chain is now one list built once, and at most MAX_TERMS long."""
    handed: list[int] = []  # the conditions each AnyOf/AllOf made while parsing is given

    class Counted(kind):  # type: ignore[valid-type,misc]
        def __init__(self, conditions: list[StopCondition]) -> None:
            handed.append(len(conditions))
            super().__init__(conditions)

    monkeypatch.setattr(stop_module, kind.__name__, Counted)
    longest = parse_stop(chain(op, MAX_TERMS))
    assert isinstance(longest, kind) and longest.conditions[-1] == MaxRounds(MAX_TERMS)
    assert [c.expr() for c in longest.conditions] == [f"max_rounds({n + 1})" for n in range(MAX_TERMS)]
    assert handed == [MAX_TERMS]  # (it was 2, 3, ..., 256: 33,000 conditions copied for 256)
    monkeypatch.undo()
    assert parse_stop(longest.expr()) == longest
    for terms in (MAX_TERMS + 1, 70_000):
        with pytest.raises(StopParseError, match=re.escape(LONG)) as refused:
            parse_stop(chain(op, terms))
        assert len(str(refused.value)) < 200
    # Groups are flattened into the chain they are part of, and their terms count alike.
    half = chain(op, MAX_TERMS // 2)
    halves = parse_stop(f"({half}) {op} ({half})")
    assert isinstance(halves, kind) and halves.expr() == f"{half} {op} {half}" and len(halves.conditions) == MAX_TERMS
    with pytest.raises(StopParseError, match=re.escape(LONG)):
        parse_stop(f"({half}) {op} ({half}) {op} never()")


@pytest.mark.parametrize(
    ("expression", "said"),
    [(nested(400), DEEP), (chain("|", MAX_TERMS + 1), LONG), ("max_rounds(", "expected )")],
    ids=["deep", "long", "syntax"],
)
def test_moot_serve_refuses_a_stop_over_the_limits_naming_protocol_stop(
    expression: str, said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    with FakeOpenAIServer() as fake:
        settings = ServerSettings(db=tmp_path / "moot.sqlite", models=["openai:fake"], base_url=fake.base_url)
        with ServerThread(settings) as server:
            body = {"protocol": {"preset": "vote", "stop": expression}, "question": "q?"}
            response = httpx.post(server.url + "/v1/debates", json=body)
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["param"] == "protocol.stop" and error["message"].startswith("protocol.stop: in stop condition")
            assert said in error["message"] and "\n" not in error["message"] and "Traceback" not in response.text
        assert fake.requests == []  # nothing ran


@pytest.mark.parametrize(
    ("expression", "said"), [(nested(400), DEEP), (chain("|", 70_000), LONG)], ids=["deep", "long"]
)
def test_moot_debate_refuses_a_protocol_files_stop_over_the_limits_in_one_line(
    expression: str, said: str, tmp_path: Path
) -> None:
    protocol = tmp_path / "deep.yaml"
    protocol.write_text(f"preset: vote\nstop: '{expression}'\n", encoding="utf-8")
    replies = tmp_path / "replies.json"
    replies.write_text('["unused"]', encoding="utf-8")
    result = CliRunner().invoke(app, ["debate", "--protocol", str(protocol), "-m", f"scripted:{replies}", "Q?"])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and said in errors[0] and "stop: in stop condition" in errors[0], result.output
    assert "Traceback" not in result.output and len(result.output) < 400, result.output


def voters(*, stop: object, rounds: int = 5, extra: list[Participant] | None = None) -> ProtocolSpec:
    return ProtocolSpec.model_validate(
        {
            "name": "voters",
            "participants": [Participant(id=n, persona=Persona(name=n.title())) for n in ("ann", "bob", "cat")]
            + (extra or []),
            "rounds": rounds,
            "visibility": Visibility(who="others", window=1),
            "turn": TurnFormat(schema="test-vote"),
            "decision": NoDecision(),
            "stop": stop,
        }
    )


def scripted_votes(script: dict[str, list[str]]) -> ScriptedModel:
    def reply(request: ChatRequest) -> dict[str, object]:
        name = request.messages[0].content.split()[2].rstrip(".")
        if name == "Mod":
            conf = script["mod"].pop(0)
            return {"confidence": float(conf)}
        return {"answer": script[name.lower()].pop(0), "confidence": 0.9}

    return ScriptedModel(fn=reply)


async def test_consensus_stops_when_enough_agree() -> None:
    model = scripted_votes({"ann": ["A", "B", "B"], "bob": ["C", "B", "B"], "cat": ["D", "A", "B"]})
    result = await Engine(voters(stop="consensus(0.66)"), model).run("Q?")
    assert result.stop_reason == "consensus" and len(result.rounds) == 2  # B, B, A = 2/3 >= 0.66


async def test_unanimity_needs_everyone() -> None:
    model = scripted_votes({"ann": ["A", "B", "B"], "bob": ["C", "B", "B"], "cat": ["A", "A", "B"]})
    result = await Engine(voters(stop=Consensus(1.0)), model).run("Q?")
    assert result.stop_reason == "consensus" and len(result.rounds) == 3


async def test_stable_answers_stop_when_nobody_changes() -> None:
    model = scripted_votes({"ann": ["A", "B", "B"], "bob": ["C", "C", "C"], "cat": ["A", "A", "A"]})
    result = await Engine(voters(stop=StableAnswers()), model).run("Q?")
    assert result.stop_reason == "stable_answers" and len(result.rounds) == 3


async def test_the_round_cap_always_holds_and_any_of_names_what_fired() -> None:
    model = scripted_votes({"ann": ["A", "B"], "bob": ["C", "D"], "cat": ["E", "F"]})
    result = await Engine(voters(stop="consensus(1) | stable_answers()", rounds=2), model).run("Q?")
    assert result.stop_reason == "max_rounds" and len(result.rounds) == 2


async def test_all_of_needs_every_condition() -> None:
    model = scripted_votes({"ann": ["A", "A", "A"], "bob": ["A", "A", "A"], "cat": ["B", "A", "A"]})
    result = await Engine(voters(stop="consensus(0.6) & stable_answers()"), model).run("Q?")
    assert result.stop_reason == "consensus+stable_answers" and len(result.rounds) == 3


@pytest.mark.req("S004-PHASE1")
async def test_moderator_confidence_ends_the_debate() -> None:
    moderator = Participant(
        id="mod", persona=Persona(name="Mod"), turn=TurnFormat(schema="test-verdict"),
        visibility=Visibility(who="others", window=None, same_round=True),
    )  # fmt: skip
    spec = voters(stop="moderator('mod', 'confidence', 0.8)", extra=[moderator])
    spec.stages = None
    model = scripted_votes({"ann": ["A"] * 5, "bob": ["B"] * 5, "cat": ["C"] * 5, "mod": ["0.5", "0.85"]})
    result = await Engine(spec, model).run("Q?")
    assert result.stop_reason == "moderator" and len(result.rounds) == 2


async def test_token_budget_condition_and_spec_round_trip() -> None:
    spec = voters(stop=TokenBudget(1))
    model = scripted_votes({"ann": ["A"] * 5, "bob": ["B"] * 5, "cat": ["C"] * 5})
    result = await Engine(spec, model).run("Q?")
    assert result.stop_reason == "token_budget" and len(result.rounds) == 1
    dumped = spec.model_dump(mode="json", by_alias=True)
    assert dumped["stop"] == "token_budget(1)"
    assert ProtocolSpec.model_validate(dumped) == spec


def test_a_bad_stop_expression_is_a_spec_error() -> None:
    with pytest.raises(ValueError, match="unknown stop condition 'sometimes'"):
        voters(stop="sometimes()")
    assert Budget().max_tokens_per_turn == 500


def test_a_confidence_is_read_leniently_and_never_fails_the_answer() -> None:
    from pydantic import ValidationError

    from moot.core.schemas import AnswerTurn

    assert AnswerTurn.model_validate({"answer": "B", "confidence": 95}).confidence == 0.95
    assert AnswerTurn.model_validate({"answer": "B", "confidence": 1}).confidence == 1.0
    assert AnswerTurn.model_validate({"answer": "B", "confidence": 0.4}).confidence == 0.4
    assert AnswerTurn.model_validate({"answer": "B", "confidence": 0}).confidence == 0.0
    assert AnswerTurn.model_validate({"answer": "B", "confidence": -0.1}).confidence == 0.0
    assert AnswerTurn.model_validate({"answer": "B", "confidence": -40}).confidence == 0.0
    assert AnswerTurn.model_validate({"answer": "B", "confidence": 150}).confidence == 1.0
    assert AnswerTurn.model_validate({"answer": "B", "confidence": 100.5}).confidence == 1.0
    for bad in ("sure", None):
        with pytest.raises(ValidationError):
            AnswerTurn.model_validate({"answer": "B", "confidence": bad})
