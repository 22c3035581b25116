"""Stop conditions (composable, parsed from strings) and typed answer normalisation."""

from __future__ import annotations

import re

import pytest
from pydantic import BaseModel

from moot import ScriptedModel
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
from moot.core.stop import StopParseError
from moot.models.base import ChatRequest
from moot.structured import register_schema


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
