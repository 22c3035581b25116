"""Exact engine behaviour on the scripted model: order, visibility, budgets, failures, events, typed turns."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

from moot import DebateEngine, DebateFailed, ScriptedModel
from moot.core import (
    Budget,
    DebateDone,
    DebateResult,
    DebateStarted,
    DebateTask,
    Engine,
    NoDecision,
    Participant,
    Persona,
    ProtocolSpec,
    RoundDone,
    TokenDelta,
    TurnDone,
    TurnFormat,
    TurnStarted,
    Visibility,
    load_result,
)
from moot.core.events import Event
from moot.core.spec import Probe, Prompts
from moot.core.state import DebateState
from moot.models.base import ChatRequest, ChatResponse, Message, ModelConfigError, TokenCallback, TransientModelError
from moot.protocols import get_preset, preset_names
from moot.protocols.affirmative_critical import affirmative_critical
from moot.structured import complete_structured, register_schema, shorten_strings


def speaker_of(request: ChatRequest) -> str:
    system = request.messages[0].content
    for name in ("Synthesizer", "Affirmative", "Critical", "Alpha", "Beta", "Gamma"):
        if name in system:
            return name
    return "?"


def echo(request: ChatRequest) -> str:
    rnd = request.messages[1].content.count("(round ")
    return f"{speaker_of(request)} answer (saw {rnd} turns)"


def three_agents(order: str = "simultaneous", visibility: Visibility | None = None, **kw: object) -> ProtocolSpec:
    return ProtocolSpec(
        name="three",
        participants=[
            Participant(id=n.lower(), persona=Persona(name=n, role=n.lower())) for n in ("Alpha", "Beta", "Gamma")
        ],
        order=order,  # type: ignore[arg-type]
        visibility=visibility or Visibility(),
        decision=NoDecision(),
        **kw,  # type: ignore[arg-type]
    )


class Recorder:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def __call__(self, event: Event) -> None:
        self.events.append(event)

    def kinds(self) -> list[str]:
        out = []
        for e in self.events:
            if isinstance(e, TurnStarted):
                out.append(f"start:{e.speaker}:{e.round}")
            elif isinstance(e, TurnDone):
                out.append(f"done:{e.turn.speaker}:{e.turn.round}")
            elif isinstance(e, RoundDone):
                out.append(f"round:{e.round.index}")
        return out


# ------------------------------------------------------------------------------- order & visibility


async def test_simultaneous_speakers_run_concurrently() -> None:
    rec = Recorder()
    model = ScriptedModel(fn=echo, latency=0.05)
    engine = Engine(affirmative_critical(2, timeout_s=None), model, on_event=rec)
    result = await engine.run("Q?")
    kinds = rec.kinds()
    # Both speakers of a round start before either finishes: they are in flight together.
    assert kinds[:2] == ["start:affirmative:1", "start:critical:1"]
    assert {kinds[2], kinds[3]} == {"done:affirmative:1", "done:critical:1"}
    assert kinds[4] == "round:1"
    # (no wall-clock bound: the event order above is the proof, and timings flake on shared cores)
    assert result.status == "complete"
    assert isinstance(rec.events[0], DebateStarted) and isinstance(rec.events[-1], DebateDone)


async def test_sequential_speakers_take_turns_and_see_the_current_round() -> None:
    rec = Recorder()
    model = ScriptedModel(fn=echo)
    spec = three_agents("sequential", Visibility(who="all", window=1, same_round=True), rounds=1)
    result = await Engine(spec, model, on_event=rec).run("Q?")
    assert rec.kinds() == [
        "start:alpha:1", "done:alpha:1", "start:beta:1", "done:beta:1", "start:gamma:1", "done:gamma:1", "round:1",
    ]  # fmt: skip
    assert [t.text for t in result.turns()] == [
        "Alpha answer (saw 0 turns)",
        "Beta answer (saw 1 turns)",
        "Gamma answer (saw 2 turns)",
    ]


@pytest.mark.parametrize(
    ("visibility", "expected_round2"),
    [
        (Visibility(who="all", window=1), {"alpha": 3, "beta": 3, "gamma": 3}),
        (Visibility(who="others", window=1), {"alpha": 2, "beta": 2, "gamma": 2}),
        (Visibility(who="self", window=1), {"alpha": 1, "beta": 1, "gamma": 1}),
        (Visibility(who="none"), {"alpha": 0, "beta": 0, "gamma": 0}),
    ],
)
async def test_who_sees_what(visibility: Visibility, expected_round2: dict[str, int]) -> None:
    model = ScriptedModel(fn=echo)
    result = await Engine(three_agents(visibility=visibility, rounds=2), model).run("Q?")
    seen = {t.speaker: int(t.text.split("saw ")[1].split()[0]) for t in result.rounds[1].turns if t.text}
    assert seen == expected_round2
    assert all("saw 0" in (t.text or "") for t in result.rounds[0].turns)


async def test_window_limits_how_far_back_agents_see() -> None:
    model = ScriptedModel(fn=echo)
    one = await Engine(three_agents(visibility=Visibility(who="all", window=1), rounds=3), model).run("Q?")
    every = await Engine(three_agents(visibility=Visibility(who="all", window=None), rounds=3), model).run("Q?")
    assert {t.text for t in one.rounds[2].turns} == {f"{n} answer (saw 3 turns)" for n in ("Alpha", "Beta", "Gamma")}
    assert {t.text for t in every.rounds[2].turns} == {f"{n} answer (saw 6 turns)" for n in ("Alpha", "Beta", "Gamma")}


@pytest.mark.req("S000-PROMPTS")
async def test_own_previous_answer_is_marked_and_context_is_top_three() -> None:
    model = ScriptedModel(fn=echo)
    context = [{"text": f"passage {i}"} for i in range(1, 6)]
    result = await DebateEngine(model=model).run_debate("Q?", context=context, synthesize=False)
    round2_aff = model.requests[2].messages[1].content
    assert "Your own answer (round 1)" in round2_aff and "The answer of Critical, the critical (round 1)" in round2_aff
    first = model.requests[0].messages[1].content
    assert "[3] passage 3" in first and "passage 4" not in first
    assert result.transcript.warnings == ["5 context passages were given; the protocol uses the first 3"]


# ------------------------------------------------------------------------------------- budgets


@pytest.mark.req("S000-CALLS")
async def test_call_budget_stops_before_a_round_that_does_not_fit() -> None:
    model = ScriptedModel(fn=echo)
    result = await Engine(affirmative_critical(3, max_calls=5, timeout_s=None), model).run("Q?")
    # Round 1 (2 calls) + round 2 (2) + synthesis (1) = 5; round 3 would not leave room to decide.
    assert result.stop_reason == "call_budget"
    assert result.llm_calls == 5 and len(model.requests) == 5
    assert len(result.rounds) == 2 and result.final_answer is not None


async def test_a_call_budget_too_small_for_one_round_and_a_decision_makes_no_call() -> None:
    model = ScriptedModel(fn=echo)
    result = await Engine(affirmative_critical(1, max_calls=2, timeout_s=None), model).run("Q?")
    assert result.llm_calls == 0 and model.requests == []
    assert result.status == "failed" and result.stop_reason == "call_budget"
    assert result.error == (
        "the call budget of 2 calls cannot fit one round (2 calls) plus the decision (1): give at least 3"
    )
    # A vote too (it said "no participant gave a typed answer to vote on": an outside trial's, session 37).
    som = get_preset("society-of-minds")
    som = som.model_copy(update={"budget": som.budget.model_copy(update={"max_calls": 1})})
    voted = await Engine(som, ScriptedModel(fn=echo)).run("Q?")
    assert voted.llm_calls == 0 and voted.error is not None and voted.error.startswith("the call budget of 1 call")


async def test_the_call_budget_is_a_hard_cap_when_a_step_runs_on_its_own() -> None:
    model = ScriptedModel(fn=echo)
    engine = Engine(affirmative_critical(1, max_calls=2, timeout_s=None), model)
    state = engine.start("Q?")
    await engine.run_round(state)  # a caller driving the steps itself (LangGraph) skips check_stop
    await engine.decide(state)
    assert state.result.llm_calls == 2 and len(model.requests) == 2
    assert state.result.decision_turns[0].error == "the call budget of 2 calls is spent"
    assert engine.finish(state).status == "failed"


async def test_token_budget_stops_between_rounds() -> None:
    model = ScriptedModel(fn=echo)
    spec = affirmative_critical(5, timeout_s=None)
    spec.budget = Budget(max_total_tokens=1)
    result = await Engine(spec, model).run("Q?")
    assert result.stop_reason == "token_budget" and len(result.rounds) == 1


@pytest.mark.req("S000-TIMEOUT")
async def test_timeout_cancels_in_flight_calls_and_keeps_the_partial_transcript() -> None:
    # Round 1 answers fast; round 2 is slow: the partial transcript keeps round 1.
    calls = {"n": 0}

    async def slow_later(request: ChatRequest) -> str:
        calls["n"] += 1
        if calls["n"] > 2:
            await asyncio.sleep(5)
        return "fast"

    model = ScriptedModel(fn=slow_later)
    engine = Engine(affirmative_critical(2, timeout_s=0.2), model)
    with pytest.raises(TimeoutError) as info:
        await engine.run("Q?")
    partial = info.value.result  # type: ignore[attr-defined]
    assert [t.text for t in partial.rounds[0].turns] == ["fast", "fast"]
    assert all(t.error for t in partial.rounds[1].turns)
    assert partial.llm_calls == 4


@pytest.mark.req("S000-TOKENS")
async def test_per_turn_max_tokens_is_sent_to_the_model() -> None:
    model = ScriptedModel(fn=echo)
    await Engine(affirmative_critical(1, max_tokens=123, synthesis_max_tokens=77, timeout_s=None), model).run("Q?")
    assert [r.max_tokens for r in model.requests] == [123, 123, 77]


# ------------------------------------------------------------------------------------- failures


async def test_a_failing_participant_is_recorded_and_dropped_for_the_round() -> None:
    def flaky(request: ChatRequest) -> str:
        if speaker_of(request) == "Critical" and "(round " not in request.messages[1].content:
            raise ModelConfigError("critic model is misconfigured")
        return echo(request)

    model = ScriptedModel(fn=flaky)
    result = await Engine(affirmative_critical(2, timeout_s=None), model).run("Q?")
    r1 = {t.speaker: t for t in result.rounds[0].turns}
    assert r1["critical"].error == "critic model is misconfigured" and not r1["critical"].ok
    assert r1["affirmative"].ok
    assert result.status == "complete" and result.final_answer is not None
    # Round 2: the critic recovers and sees only the affirmative's round-1 answer.
    assert result.rounds[1].turns[1].text == "Critical answer (saw 1 turns)"


async def test_all_participants_failing_fails_the_debate_with_the_reason() -> None:
    model = ScriptedModel(fn=lambda r: (_ for _ in ()).throw(ModelConfigError("wrong API key")))
    result = await Engine(affirmative_critical(2, timeout_s=None), model).run("Q?")
    assert result.status == "failed" and result.stop_reason == "all_failed"
    assert result.error == "wrong API key"
    assert len(result.rounds) == 1 and result.llm_calls == 2
    with pytest.raises(DebateFailed, match="wrong API key"):
        await DebateEngine(
            model=ScriptedModel(fn=lambda r: (_ for _ in ()).throw(ModelConfigError("wrong API key")))
        ).run_debate("Q?")


@pytest.mark.req("S000-RETRY")
async def test_transient_errors_are_retried_inside_one_call() -> None:
    model = ScriptedModel([TransientModelError("503"), "A", "B", "S"])
    model.retry = model.retry.model_copy(update={"base_delay_s": 0.0})
    result = await Engine(affirmative_critical(1, timeout_s=None), model).run("Q?")
    assert result.llm_calls == 3 and len(model.requests) == 4
    assert sorted(t.attempts for t in result.turns()) == [1, 2]


async def test_exhausted_script_is_an_explicit_error() -> None:
    result = await Engine(affirmative_critical(1, timeout_s=None), ScriptedModel(["only one"])).run("Q?")
    assert result.status == "failed"
    errors = [t.error for t in [*result.turns(), *result.decision_turns] if t.error]
    assert any("no reply left" in e for e in errors)


# ------------------------------------------------------------------------------------ typed turns


class Answer(BaseModel):
    answer: str = Field(max_length=50)
    confidence: float = Field(ge=0, le=1)


register_schema("test-answer", Answer)


async def test_typed_turns_are_parsed_repaired_or_failed_explicitly() -> None:
    replies = [
        {"answer": "42", "confidence": 0.9},  # alpha: valid
        '{"answer": "7", "confidence": 2.5}',  # beta: invalid, then repaired
        '{"answer": "7", "confidence": 0.5}',
        "I think it is 9",  # gamma: invalid twice -> explicit parse failure
        "still prose",
    ]
    model = ScriptedModel(replies)
    spec = three_agents("sequential", rounds=1, turn=TurnFormat(schema="test-answer", show_field="answer"))
    result = await Engine(spec, model).run("Q?")
    alpha, beta, gamma = result.rounds[0].turns
    assert alpha.parsed == {"answer": "42", "confidence": 0.9} and alpha.text == "42" and alpha.calls == 1
    assert beta.parsed == {"answer": "7", "confidence": 0.5} and beta.calls == 2
    assert gamma.parsed is None and gamma.text is None and not gamma.ok
    assert gamma.parse_failure is not None and gamma.parse_failure.attempts == 2
    assert gamma.parse_failure.raw == "still prose"
    assert result.llm_calls == 5
    # The schema went to the model as response_format; the repair request showed the error.
    assert model.requests[0].response_schema == Answer.model_json_schema()
    assert "confidence" in model.requests[2].messages[-1].content


async def test_typed_repair_respects_the_call_budget() -> None:
    model = ScriptedModel(["not json", "not json either"])
    spec = ProtocolSpec(
        name="one",
        participants=[Participant(id="solo", persona=Persona(name="Alpha"))],
        rounds=1,
        turn=TurnFormat(schema="test-answer"),
        decision=NoDecision(),
        budget=Budget(max_calls=1),
    )
    result = await Engine(spec, model).run("Q?")
    assert result.llm_calls == 1 and len(model.requests) == 1
    assert result.rounds[0].turns[0].parse_failure is not None


async def test_a_reply_cut_at_the_token_limit_is_repaired_by_asking_for_a_shorter_one() -> None:
    class CutFirst(ScriptedModel):
        """The first reply stops at the token limit, as a real server reports it."""

        async def _complete_once(self, request: ChatRequest, on_token: TokenCallback | None) -> ChatResponse:
            response = await super()._complete_once(request, on_token)
            return response.model_copy(update={"finish_reason": "length"}) if len(self.requests) == 1 else response

    model = CutFirst(['{"answer": "4", "reasoning": "first 2 plus 2 is', {"answer": "4", "confidence": 0.8}])
    request = ChatRequest(messages=[Message(role="user", content="2+2?")], max_tokens=40)
    outcome = await complete_structured(model, request, Answer)
    assert outcome.value == {"answer": "4", "confidence": 0.8} and len(outcome.responses) == 2
    # The retry's grammar bounds the free text to the token budget: 40 tokens, 1 string + the JSON.
    assert model.requests[0].response_schema == Answer.model_json_schema()
    assert model.requests[1].response_schema is not None
    assert model.requests[1].response_schema["properties"]["answer"]["maxLength"] == 20
    # The request is asked afresh (the cut reply is not shown back), with a note to keep it short.
    retry = model.requests[1].messages
    assert [m.role for m in retry] == ["user"] and retry[0].content.startswith("2+2?\n\n(An earlier reply")
    assert "cut off at the token limit" in retry[0].content and "Field required" not in retry[0].content
    # A reply that stopped on its own is shown its validation error instead.
    plain = ScriptedModel(['{"answer": "4"}', {"answer": "4", "confidence": 0.8}])
    await complete_structured(plain, ChatRequest(messages=[Message(role="user", content="2+2?")]), Answer)
    ask = plain.requests[1].messages[-1].content
    assert "confidence: Field required" in ask and "token limit" not in ask


async def test_a_reply_cut_inside_its_json_is_repaired_not_read_as_an_answer() -> None:
    """A reply cut at the token limit mid-number ({"answer": 2 of a 260, in a GSM8K run) parsed
    leniently: the closed JSON validated, and the cut value counted as the agent's answer. A reply
    cut before its JSON closed is now repaired; one whose JSON closed as it was cut stands."""

    class CutFirst(ScriptedModel):
        async def _complete_once(self, request: ChatRequest, on_token: TokenCallback | None) -> ChatResponse:
            response = await super()._complete_once(request, on_token)
            return response.model_copy(update={"finish_reason": "length"}) if len(self.requests) == 1 else response

    request = ChatRequest(messages=[Message(role="user", content="2+2?")], max_tokens=40)
    cut = CutFirst(['{"answer": "4", "confidence": 0.', {"answer": "4", "confidence": 0.8}])
    outcome = await complete_structured(cut, request, Answer)
    assert outcome.value == {"answer": "4", "confidence": 0.8} and len(outcome.responses) == 2
    assert "cut off at the token limit" in cut.requests[1].messages[0].content
    # Whole JSON stands, with a BOM, a code fence or prose around it (a model prompted with the schema)
    for text in (
        '{"answer": "4", "confidence": 0.5}',
        '\ufeff```json\n{"answer": "4", "confidence": 0.5}\n``',
        'Here: {"answer": "4", "confidence": 0.5}\n\nBecause 2 and 2 make',
    ):
        closed = CutFirst([text])
        outcome = await complete_structured(closed, request, Answer, repair=False)
        assert outcome.value == {"answer": "4", "confidence": 0.5} and len(outcome.responses) == 1, text
    unrepaired = await complete_structured(
        CutFirst(['{"answer": "4", "confidence": 0.']), request, Answer, repair=False
    )
    assert unrepaired.value is None and unrepaired.failure is not None
    assert "before its JSON closed" in unrepaired.failure.error
    # one cut so early that it does not parse at all says it was cut, not only "got list" (a trial)
    early = await complete_structured(CutFirst(['{\n  "items']), request, Answer, repair=False)
    assert early.failure is not None and early.failure.error.startswith("cut at the token limit before its JSON closed")


async def test_a_reply_cut_at_its_token_limit_is_said_in_the_warnings() -> None:
    """finish_reason "length": the model stopped at max_tokens, so the text may end mid-sentence. The
    turn records it and the result's warnings say so (a reply that stopped by itself is not flagged)."""

    class CutCritic(ScriptedModel):
        async def _complete_once(self, request: ChatRequest, on_token: TokenCallback | None) -> ChatResponse:
            response = await super()._complete_once(request, on_token)
            cut = request.messages[0].content.startswith(("You are the Critical", "You are the Synthesizer"))
            return response.model_copy(update={"finish_reason": "length"}) if cut else response

    model = CutCritic(fn=lambda request: "Yes, because the evidence")
    result = await Engine(affirmative_critical(rounds=1, max_tokens=64), model).run("Q?")
    turns = {t.speaker: t for t in result.turns()}
    assert turns["critical"].finish_reason == "length" and turns["affirmative"].finish_reason == "stop"
    assert [w for w in result.warnings if "finish_reason: length" in w] == [
        "critical's reply in round 1 stopped at its token limit of 64 (finish_reason: length), so it may end "
        "mid-sentence; raise the turn's max_tokens to give it room",
        "the decision's reply (Synthesizer) stopped at its token limit of 800 (finish_reason: length), so it may "
        "end mid-sentence; raise the turn's max_tokens to give it room",
    ]


async def test_a_turns_finish_reason_is_its_replys_not_its_self_checks() -> None:
    """CISC's self-check is a one-token call, so it always stops at its limit: the turn records the
    reply's finish_reason (it was the check's, and every checked turn was reported cut). A reply
    cut at its limit and then repaired still records ``length``: it had too little room."""

    class OneTokenChecks(ScriptedModel):
        async def _complete_once(self, request: ChatRequest, on_token: TokenCallback | None) -> ChatResponse:
            response = await super()._complete_once(request, on_token)
            first_cut = any("cut me" in m.content for m in request.messages) and "cut off" not in str(request.messages)
            cut = request.max_tokens == 1 or first_cut
            return response.model_copy(update={"finish_reason": "length"}) if cut else response

    reply = {"reasoning": "r", "answer": "4", "confidence": 0.9}
    checked = OneTokenChecks(fn=lambda request: "Yes" if request.max_tokens == 1 else reply)
    spec = get_preset("vote", k=2).model_copy(update={"probe": Probe(self_check=True)})  # CISC's samples
    result = await Engine(spec, checked).run("2+2?")
    assert [t.finish_reason for t in result.turns()] == ["stop", "stop"]
    assert all(t.probe_usage is not None for t in result.turns())  # the checks were made
    assert not [w for w in result.warnings if "finish_reason" in w]

    repaired = OneTokenChecks(['{"reasoning": "first 2 plus', reply])
    cut = await Engine(get_preset("single"), repaired).run("cut me: 2+2?")
    (turn,) = cut.turns()
    assert turn.calls == 2 and turn.parsed == reply and turn.finish_reason == "length"
    assert [w for w in cut.warnings if "finish_reason" in w] == [
        "agent1's reply in round 1 stopped at its token limit of 400 (finish_reason: length), so it was repaired "
        "with shorter fields; raise the turn's max_tokens to give it room"
    ]
    # cut again on the retry: a typed reply that never closed gave no answer (it said "may end mid-sentence")
    twice = OneTokenChecks(fn=lambda request: '{"reasoning": "first 2 plus')
    never = await Engine(get_preset("single"), twice).run("cut me: 2+2?")
    assert never.turns()[0].parse_failure is not None
    assert never.error is not None and "it stopped at its token limit (" in never.error
    assert never.error.endswith("raise the turn's max_tokens to give it room")
    assert [w for w in never.warnings if "finish_reason" in w] == [
        "agent1's reply in round 1 stopped at its token limit of 400 (finish_reason: length), so it gave no "
        "readable answer; raise the turn's max_tokens to give it room"
    ]


def test_shorten_strings_bounds_free_text_only_and_keeps_tighter_bounds() -> None:
    schema = {
        "properties": {
            "reasoning": {"type": "string", "maxLength": 1200},
            "answer": {"type": "string", "maxLength": 50},
            "label": {"type": "string", "enum": ["yes", "no"]},
            "date": {"type": "string", "format": "date"},
            "notes": {"type": "array", "items": {"type": "string"}},
            "type": {"type": "integer"},
        }
    }
    short = shorten_strings(schema, 600)
    props = short["properties"]
    # reasoning, answer, and the notes' items up to 3 times (an array is bounded too: a small model
    # repeated its items until the tokens ran out), + a share for the JSON: 600 // 6 = 100.
    assert props["notes"]["maxItems"] == 3
    assert props["reasoning"]["maxLength"] == 100 and props["answer"]["maxLength"] == 50
    assert props["notes"]["items"]["maxLength"] == 100
    assert "maxLength" not in props["label"] and "maxLength" not in props["date"] and "maxLength" not in props["type"]
    assert schema["properties"]["reasoning"]["maxLength"] == 1200  # the original is untouched
    assert "maxItems" not in schema["properties"]["notes"]
    # a floor of 4 (a floor of 16 made a 20-token reply of one string run past its limit again)
    assert shorten_strings({"type": "string"}, 10) == {"type": "string", "maxLength": 5}
    assert shorten_strings({"type": "string"}, 4) == {"type": "string", "maxLength": 4}
    # an array keeps the items its schema asks for at least, and a tighter bound of its own
    nested = {"type": "array", "minItems": 5, "items": {"type": "array", "maxItems": 2, "items": {"type": "string"}}}
    bounded = shorten_strings(nested, 1100)
    assert bounded["maxItems"] == 5 and bounded["items"]["maxItems"] == 2
    assert bounded["items"]["items"]["maxLength"] == 1100 // (5 * 2 + 1)

    # A property named `items` is a property (a review: the retry's schema got a property "maxItems": 3,
    # which llama.cpp refused); a list of sub-models ($defs, through $ref) counts each string 3 times.
    class Point(BaseModel):
        name: str
        why: str

    class Listing(BaseModel):
        items: list[str]
        points: list[Point]
        answer: str

    listed = shorten_strings(Listing.model_json_schema(), 1000)
    assert set(listed["properties"]) == {"items", "points", "answer"}
    assert listed["properties"]["items"]["maxItems"] == listed["properties"]["points"]["maxItems"] == 3
    # items' string 3 times, Point's two strings 3 times each, answer once, + a share for the JSON: 11
    share = 1000 // 11
    assert listed["$defs"]["Point"]["properties"]["why"]["maxLength"] == share
    assert listed["properties"]["answer"]["maxLength"] == share
    recursive = {"$defs": {"N": {"type": "object", "properties": {"t": {"type": "string"},
                 "kids": {"type": "array", "items": {"$ref": "#/$defs/N"}}}}}, "$ref": "#/$defs/N"}  # fmt: skip
    assert shorten_strings(recursive, 100)["$defs"]["N"]["properties"]["t"]["maxLength"] == 50  # (not followed again)


# ------------------------------------------------------------------------------- spec & models


def test_a_schema_is_written_once_per_class_and_each_caller_gets_its_own_copy() -> None:
    """Pydantic wrote a turn's JSON schema anew at every typed call (0.2 ms each)."""
    from pydantic import BaseModel

    from moot.structured import json_schema

    calls = []

    class Reply(BaseModel):
        answer: str

        @classmethod
        def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
            calls.append(1)
            return super().model_json_schema(*args, **kwargs)

    first = json_schema(Reply)
    first["properties"]["answer"]["maxLength"] = 3  # (shorten_strings and others change their copy)
    second = json_schema(Reply)
    assert second == BaseModel.model_json_schema.__func__(Reply)  # type: ignore[attr-defined]
    assert "maxLength" not in second["properties"]["answer"] and len(calls) == 1
    # a caller's schema with an integer past 64 bits (bodies allow 20 digits): orjson cannot write it,
    # and read it back as a float (the cache's first version failed the debate with a 502)
    from moot.structured import with_fixed_schema

    big = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 99999999999999999999}}}
    fixed = with_fixed_schema(Reply, big)
    assert json_schema(fixed) == big and json_schema(fixed)["properties"]["n"]["maximum"] == 99999999999999999999


def test_spec_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match="unique"):
        ProtocolSpec(name="x", participants=[Participant(id="a", persona=Persona(name="A"))] * 2)
    with pytest.raises(ValueError, match=r"\{answerz\}"):
        ProtocolSpec.model_validate(
            {"name": "x", "participants": [{"id": "a", "persona": {"name": "A"}}], "prompts": {"opening": "{answerz}"}}
        )
    with pytest.raises(ValueError, match="no turn schema named 'nope'"):
        ProtocolSpec(
            name="x", participants=[Participant(id="a", persona=Persona(name="A"))], turn=TurnFormat(schema="nope")
        )
    with pytest.raises(Exception, match="extra"):
        ProtocolSpec.model_validate({"name": "x", "participants": [{"id": "a", "persona": {"name": "A"}}], "roundz": 2})
    # An id shaped like a key would be *** in every stored transcript and served event.
    with pytest.raises(ValueError, match="shape of an API key"):
        Participant(id="sk-agent-alpha-0123", persona=Persona(name="A"))
    assert Participant(id="sk-1", persona=Persona(name="A")).id == "sk-1"  # too short to be one


@pytest.mark.req("S004-ROUTING")
async def test_each_participant_can_run_on_its_own_model() -> None:
    main = ScriptedModel(fn=lambda r: "main", name="main")
    other = ScriptedModel(fn=lambda r: "other", name="other")
    result = await Engine(affirmative_critical(1, timeout_s=None), main, models={"critical": other}).run("Q?")
    assert {t.speaker: t.model for t in result.turns()} == {"affirmative": "main", "critical": "other"}
    assert result.participants[1]["model"] == "other"
    assert result.decision_turns[0].model == "main"
    with pytest.raises(KeyError, match="nobody"):
        Engine(affirmative_critical(1), main, models={"nobody": other})


@pytest.mark.req("S000-LOGS")
async def test_tokens_stream_as_events() -> None:
    rec = Recorder()
    await Engine(
        affirmative_critical(1, timeout_s=None), ScriptedModel(fn=lambda r: "one two three"), on_event=rec
    ).run("Q")
    pieces = [e.text for e in rec.events if isinstance(e, TokenDelta) and e.speaker == "affirmative"]
    assert "".join(pieces) == "one two three"


async def test_async_event_handlers_are_awaited() -> None:
    seen: list[str] = []

    async def handler(event: Event) -> None:
        await asyncio.sleep(0)
        seen.append(type(event).__name__)

    await Engine(affirmative_critical(1, timeout_s=None), ScriptedModel(fn=echo), on_event=handler).run("Q")
    assert seen[0] == "DebateStarted" and seen[-1] == "DebateDone" and "TokenDelta" in seen


@pytest.mark.req("S004-AUDIT")
async def test_result_json_round_trips(tmp_path: object) -> None:
    result = await Engine(affirmative_critical(2, timeout_s=None), ScriptedModel(fn=echo)).run(
        DebateTask(question="Q?", context=[{"text": "c", "source": "doc.txt"}])  # type: ignore[list-item]
    )
    from pathlib import Path

    path = Path(str(tmp_path)) / "r.json"
    path.write_text(result.to_json())
    again = load_result(path)
    assert again == result
    data = json.loads(path.read_text())
    assert data["schema_version"] == "moot.debate/1"
    turn = data["rounds"][0]["turns"][0]
    assert {
        "speaker",
        "round",
        "messages",
        "raw",
        "parsed",
        "parse_failure",
        "usage",
        "latency_s",
        "model",
        "error",
    } <= set(turn)
    assert DebateResult.model_validate(data).usage.total_tokens == result.usage.total_tokens


async def test_steps_run_one_by_one_give_the_same_result_as_run() -> None:
    engine = Engine(affirmative_critical(2, timeout_s=None), ScriptedModel(fn=echo))
    state = engine.start("Q?")
    while engine.check_stop(state) is None:
        await engine.run_round(state)
    await engine.decide(state)
    stepped = engine.finish(state)
    whole = await engine.run("Q?")
    assert stepped.final_answer == whole.final_answer and stepped.llm_calls == whole.llm_calls == 5
    assert stepped.stop_reason == whole.stop_reason == "max_rounds"


def test_presets_are_listed() -> None:
    assert "affirmative-critical" in preset_names()
    assert get_preset("affirmative-critical").planned_calls() == 5
    with pytest.raises(KeyError, match="known"):
        get_preset("nope")


# ------------------------------------------------------------------------------ found in review


async def test_simultaneous_typed_turns_cannot_starve_each_other_of_the_call_budget() -> None:
    model = ScriptedModel(fn=lambda r: "prose, not JSON")
    spec = three_agents(rounds=1, turn=TurnFormat(schema="test-answer"), budget=Budget(max_calls=3))
    result = await Engine(spec, model).run("Q?")
    turns = result.rounds[0].turns
    # Every participant got its first call; no repair fitted in the budget.
    assert [t.calls for t in turns] == [1, 1, 1] and len(model.requests) == 3
    assert all(t.parse_failure is not None and t.error is None for t in turns)
    assert result.llm_calls == 3


async def test_a_later_round_in_which_everyone_fails_spends_nothing_on_the_decision() -> None:
    calls = {"n": 0}

    def fail_later(request: ChatRequest) -> str:
        calls["n"] += 1
        if calls["n"] > 2:
            raise ModelConfigError("the endpoint went away")
        return "early answer"

    model = ScriptedModel(fn=fail_later)
    result = await Engine(affirmative_critical(2, timeout_s=None), model).run("Q?")
    assert result.status == "failed" and result.stop_reason == "all_failed"
    assert len(model.requests) == 4 and result.decision_turns == [] and result.final_answer is None
    assert result.error == "the endpoint went away"


async def test_a_decision_cancelled_by_the_timeout_is_in_the_partial_transcript() -> None:
    async def slow_synthesis(request: ChatRequest) -> str:
        if speaker_of(request) == "Synthesizer":
            await asyncio.sleep(5)
        return "answer"

    engine = Engine(affirmative_critical(1, timeout_s=0.3), ScriptedModel(fn=slow_synthesis))
    with pytest.raises(TimeoutError) as info:
        await engine.run("Q?")
    partial = info.value.result  # type: ignore[attr-defined]
    assert partial.llm_calls == 3
    assert len(partial.decision_turns) == 1 and "cancelled" in (partial.decision_turns[0].error or "")


async def test_a_failing_event_handler_becomes_a_warning_not_a_crash() -> None:
    def broken(event: Event) -> None:
        if isinstance(event, TurnDone):
            raise OSError("disk full")

    result = await Engine(affirmative_critical(1, timeout_s=None), ScriptedModel(fn=echo), on_event=broken).run("Q")
    assert result.status == "complete"
    assert result.warnings == ["event handler failed on TurnDone: OSError: disk full"]


@pytest.mark.parametrize("asynchronous", [False, True])
async def test_a_handler_failing_on_the_streamed_pieces_becomes_a_warning_too(asynchronous: bool) -> None:
    """The pieces a model streams reach the handler without a coroutine of the engine's each (the
    hot path); a sync handler's failure and an async one's are kept as a warning all the same."""
    from moot.core import TokenDelta

    seen: list[str] = []

    def sync_handler(event: Event) -> None:
        if isinstance(event, TokenDelta):
            seen.append(event.text)
            raise OSError("socket gone")

    async def async_handler(event: Event) -> None:
        await asyncio.sleep(0)
        sync_handler(event)

    handler = async_handler if asynchronous else sync_handler
    result = await Engine(affirmative_critical(1, timeout_s=None), ScriptedModel(fn=echo), on_event=handler).run("Q")
    assert result.status == "complete" and seen
    assert result.warnings == ["event handler failed on TokenDelta: OSError: socket gone"]


async def test_retries_are_announced_so_streamed_tokens_can_be_discarded() -> None:
    from moot.core import TurnRetry

    rec = Recorder()
    model = ScriptedModel([TransientModelError("503"), "A", "B", "S"])
    model.retry = model.retry.model_copy(update={"base_delay_s": 0.0})
    await Engine(affirmative_critical(1, timeout_s=None), model, on_event=rec).run("Q?")
    retries = [e for e in rec.events if isinstance(e, TurnRetry)]
    assert len(retries) == 1 and retries[0].attempt == 2 and retries[0].error == "503"


async def test_connection_options_only_reach_openai_participants() -> None:
    spec = affirmative_critical(1, timeout_s=None)
    spec.participants[1].model = "openai:remote-model"
    engine = Engine(spec, ScriptedModel(fn=echo), base_url="http://127.0.0.1:9/v1", api_key="sk-test-1234567890")
    assert engine.models["critical"].name == "openai:remote-model"
    assert engine.models["affirmative"].name == "scripted"


def test_the_default_model_is_not_resolved_when_nobody_uses_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("moot.models.embedded.is_installed", lambda info: False)
    script = tmp_path / "s.json"
    script.write_text('["a", "b"]')
    spec = affirmative_critical(1)
    for p in spec.participants:
        p.model = f"scripted:{script}"
    spec.decision = NoDecision()
    engine = Engine(spec)  # no embedded model installed, and none needed
    assert engine.decision_model is None
    spec.decision = affirmative_critical(1).decision
    with pytest.raises(ModelConfigError, match="no embedded model is installed"):
        Engine(spec)  # the synthesis would use the default model: resolved, and missing


# ------------------------------------------------------------------------------------- stages


async def test_a_round_is_its_stages_and_a_later_stage_sees_this_round() -> None:
    from moot.core import Prompts, Stage

    rec = Recorder()
    moderator = Participant(
        id="gamma",
        persona=Persona(name="Gamma", role="moderator"),
        visibility=Visibility(who="others", window=None, same_round=True),
        prompts=Prompts(opening="Judge: {question}", rebuttal="Judge these:\n{history}"),
        max_tokens=42,
    )
    spec = three_agents(rounds=2).model_copy(
        update={
            "participants": [*three_agents().participants[:2], moderator],
            "stages": [Stage(speakers=["alpha", "beta"]), Stage(speakers=["gamma"])],
        }
    )
    model = ScriptedModel(fn=echo, latency=0.01)
    result = await Engine(spec, model, on_event=rec).run("Q?")
    kinds = rec.kinds()
    assert kinds[:2] == ["start:alpha:1", "start:beta:1"]  # the first stage together
    assert kinds.index("start:gamma:1") > max(kinds.index("done:alpha:1"), kinds.index("done:beta:1"))
    r1 = {t.speaker: t.text for t in result.rounds[0].turns}
    assert r1 == {
        "alpha": "Alpha answer (saw 0 turns)",
        "beta": "Beta answer (saw 0 turns)",
        "gamma": "Gamma answer (saw 2 turns)",  # saw both arguments of this round
    }
    gamma_requests = [r for r in model.requests if speaker_of(r) == "Gamma"]
    assert gamma_requests[0].messages[1].content.startswith("Judge these:") and gamma_requests[0].max_tokens == 42
    assert [t.speaker for t in result.rounds[1].turns] == ["alpha", "beta", "gamma"]
    assert spec.planned_calls() == 6


def test_stages_must_name_known_participants_once() -> None:
    from moot.core import Stage

    with pytest.raises(ValueError, match="unknown participant"):
        ProtocolSpec.model_validate(three_agents().model_dump() | {"stages": [Stage(speakers=["zeta"])]})
    with pytest.raises(ValueError, match="once per round"):
        ProtocolSpec.model_validate(three_agents().model_dump() | {"stages": [{"speakers": ["alpha", "alpha"]}]})


# ------------------------------------------------------------------------- topology and dynamics


def five(vis: Visibility) -> ProtocolSpec:
    return ProtocolSpec(
        name="five",
        participants=[Participant(id=f"p{i}", persona=Persona(name=f"P{i}"), seed=i) for i in range(5)],
        rounds=2,
        visibility=vis,
        decision=NoDecision(),
    )


def seen_by(model: ScriptedModel, name: str, rnd: int) -> list[str]:
    prompts = [r.messages[1].content for r in model.requests if r.messages[0].content.startswith(f"You are {name}.")]
    return sorted(re.findall(r"The answer of (\w+) \(round", prompts[rnd - 1]))


async def test_ring_and_star_topologies() -> None:
    model = ScriptedModel(fn=lambda r: "x")
    await Engine(five(Visibility(who="others", topology="ring")), model).run("Q?")
    assert seen_by(model, "P0", 2) == ["P1", "P4"] and seen_by(model, "P2", 2) == ["P1", "P3"]
    star = ScriptedModel(fn=lambda r: "x")
    await Engine(five(Visibility(who="others", topology="star", hub="p0")), star).run("Q?")
    assert seen_by(star, "P0", 2) == ["P1", "P2", "P3", "P4"] and seen_by(star, "P3", 2) == ["P0"]
    with pytest.raises(ValueError, match="star topology needs hub"):
        five(Visibility(topology="star"))


async def test_only_filters_by_speaker_and_seeds_reach_the_model() -> None:
    model = ScriptedModel(fn=lambda r: "x")
    await Engine(five(Visibility(who="others", only=["p4"])), model).run("Q?")
    assert seen_by(model, "P1", 2) == ["P4"] and seen_by(model, "P4", 2) == []
    assert sorted(r.seed for r in model.requests[:5]) == [0, 1, 2, 3, 4]


async def test_dynamics_count_agreement_changes_and_flips() -> None:
    script = {"P0": ["4", "4"], "P1": ["5", "4"], "P2": ["4", "5"]}

    def reply(request: ChatRequest) -> dict[str, object]:
        return {"answer": script[speaker_name(request)].pop(0), "confidence": 0.5}

    spec = ProtocolSpec(
        name="d",
        participants=[Participant(id=f"p{i}", persona=Persona(name=f"P{i}")) for i in range(3)],
        rounds=2,
        order="sequential",
        turn=TurnFormat(schema="answer"),
        decision=NoDecision(),
    )
    result = await Engine(spec, ScriptedModel(fn=reply)).run(DebateTask(question="2+2?", reference="4"))
    dyn = result.dynamics
    assert dyn is not None
    r1, r2 = dyn.rounds
    assert (
        r1.answers == {"p0": "4", "p1": "5", "p2": "4"} and r1.majority == "4" and r1.agreement == pytest.approx(2 / 3)
    )
    assert r1.correct == 2 and r2.correct == 2 and r2.changed == 2
    assert (dyn.wrong_to_right, dyn.right_to_wrong) == (1, 1) and dyn.unique_first_answers == 2
    assert r1.calls == 3 and r1.prompt_tokens > 0


def speaker_name(request: ChatRequest) -> str:
    return request.messages[0].content.split()[2].rstrip(".")


@pytest.mark.req("S004-ROUTING")
async def test_models_are_routed_by_role_and_drops_are_reported() -> None:
    from moot.protocols.presets import moderated

    debaters = ScriptedModel(fn=lambda r: {"content": "c", "confidence": 0.6, "supporting_evidence": []}, name="small")
    judge = ScriptedModel(fn=lambda r: {"pro_score": 1, "con_score": 1, "confidence": 0.9}, name="big")
    engine = Engine(moderated(), debaters, models={"moderator": judge})
    assert {pid: m.name for pid, m in engine.models.items()} == {
        "proponent": "small", "opponent": "small", "moderator": "big",
    }  # fmt: skip
    result = await engine.run("P")
    assert result.stop_reason == "moderator" and result.final_answer == "UNCERTAIN"
    with pytest.raises(KeyError, match="unknown participant"):
        Engine(moderated(), debaters, models={"referee": judge})

    def flaky(request: ChatRequest) -> str:
        if speaker_of(request) == "Critical":
            raise ModelConfigError("critic down")
        return "fine"

    dropped = await Engine(affirmative_critical(1, timeout_s=None), ScriptedModel(fn=flaky)).run("Q")
    assert dropped.warnings == ["critical was dropped from round 1: critic down"]
    assert dropped.status == "complete"


class _Edits(BaseModel):
    edits: list[str] = Field(max_length=4)


register_schema("test-edits", _Edits)


def _edit_lines(parsed: dict[str, object], speaker: str) -> str:
    edits = parsed.get("edits")
    return "\n".join(f"- {speaker}: {e}" for e in edits) if isinstance(edits, list) else ""


async def test_a_registered_view_renders_typed_turns_and_lines_history_shows_them_as_is() -> None:
    from moot.structured import register_view

    register_view("test-edit-lines", _edit_lines)
    spec = ProtocolSpec(
        name="edits",
        participants=[Participant(id="a", persona=Persona(name="A")), Participant(id="b", persona=Persona(name="B"))],
        rounds=1,
        order="sequential",
        visibility=Visibility(who="all", same_round=True),
        turn=TurnFormat(schema="test-edits", view="test-edit-lines"),
        prompts=Prompts(opening="{question}\n[HISTORY]\n{history}", rebuttal="{question}\n{history}"),
        history_style="lines",
        decision=NoDecision(),
    )
    model = ScriptedModel([{"edits": ["drop x", "keep y"]}, {"edits": ["flip z"]}])
    result = await Engine(spec, model).run("Q")
    assert result.rounds[0].turns[0].text == "- a: drop x\n- a: keep y"
    assert model.requests[1].messages[-1].content == "Q\n- a: drop x\n- a: keep y"
    with pytest.raises(ValueError, match="no turn view named 'nope'"):
        ProtocolSpec(name="x", participants=spec.participants, turn=TurnFormat(schema="test-edits", view="nope"))


def test_restrict_turns_named_fields_into_enums_at_any_depth() -> None:
    from moot.structured import restrict

    class Item(BaseModel):
        term: str
        span: tuple[int, int] | None = None

    class Outer(BaseModel):
        items: list[Item] = Field(default_factory=list)
        main: Item | None = None
        label: str

    narrowed = restrict(Outer, {"term": ["pasta", "service"]}, drop={"span"}, require={"items"})
    schema = narrowed.model_json_schema()
    items = [d for d in schema["$defs"].values() if d.get("title") == "Item"]
    assert items and all(d["properties"]["term"]["enum"] == ["pasta", "service"] for d in items)
    assert all("span" not in d["properties"] for d in items)
    assert set(schema["required"]) == {"items", "label"}
    value = narrowed.model_validate({"items": [{"term": "pasta"}], "label": "x"}).model_dump()
    assert Outer.model_validate(value).items[0].term == "pasta"  # what is asked validates as the original
    with pytest.raises(ValueError):
        narrowed.model_validate({"items": [{"term": "pizza"}], "label": "x"})


def test_restrict_bounds_lists_in_the_schema_and_truncate_lists_cuts_them() -> None:
    from moot.structured import restrict, truncate_lists

    class Item(BaseModel):
        term: str
        notes: list[str] = Field(default_factory=list)

    class Outer(BaseModel):
        items: list[Item] = Field(default_factory=list)
        label: str

    narrowed = restrict(Outer, {}, max_items={"items": 2, "notes": 1})
    schema = narrowed.model_json_schema()
    assert schema["properties"]["items"]["maxItems"] == 2
    assert schema["$defs"]["Item"]["properties"]["notes"]["maxItems"] == 1
    assert "maxItems" not in Outer.model_json_schema()["properties"]["items"]  # the original is untouched
    # The bound is asked of the grammar, not enforced by validation: a longer reply still parses ...
    long = {"items": [{"term": t, "notes": ["a", "b"]} for t in "xyz"], "label": "l"}
    assert len(narrowed.model_validate(long).items) == 3
    # ... and is cut to the bound, at any depth, before it is used.
    cut = truncate_lists(long, {"items": 2, "notes": 1})
    assert cut == {"items": [{"term": "x", "notes": ["a"]}, {"term": "y", "notes": ["a"]}], "label": "l"}
    assert truncate_lists([{"items": [1, 2, 3]}], {"items": 0}) == [{"items": []}]


async def test_a_typed_turn_cut_by_the_timeout_counts_the_calls_made_not_its_repair_reservation() -> None:
    answer = {"reasoning": "r", "answer": "A", "confidence": 0.9}

    async def slow_second_round(request: ChatRequest) -> dict[str, object]:
        if any("other agents" in m.content.lower() or "round 2" in m.content.lower() for m in request.messages):
            await asyncio.sleep(5)
        return answer

    model = ScriptedModel(fn=slow_second_round)
    spec = get_preset("society-of-minds").model_copy(deep=True)
    spec.budget.timeout_s = 1.0
    with pytest.raises(TimeoutError) as info:
        await Engine(spec, model).run("Which? A or B")
    partial = info.value.result  # type: ignore[attr-defined]
    cut = [t for r in partial.rounds for t in r.turns if t.error]
    assert cut and all(t.calls == 1 for t in cut)
    assert partial.llm_calls == len(model.requests)  # 6 requests made, 6 counted (was 9)


# ------------------------------------------------------------------ one loop, one stop mechanism


def test_the_limits_are_ordinary_stop_conditions_composed_into_the_spec() -> None:
    from moot.core.stop import Consensus

    spec = get_preset("society-of-minds").model_copy(
        update={"budget": Budget(max_calls=9, max_total_tokens=5000), "stop": Consensus(1.0)}
    )
    assert spec.stop_condition().expr() == (
        "all_failed() | max_rounds(2) | call_budget(9) | token_budget(5000) | consensus(1)"
    )


async def test_a_debate_cancelled_from_outside_keeps_its_finished_turns_in_the_state() -> None:
    done: list[str] = []
    round_two = asyncio.Event()

    async def on_event(event: object) -> None:
        if isinstance(event, DebateDone):
            done.append(event.result.status)
        if isinstance(event, RoundDone) and event.round.index == 1:
            round_two.set()

    slow = ScriptedModel(fn=lambda r: {"reasoning": "r", "answer": "4", "confidence": 0.9}, latency=0.05)
    engine = Engine(get_preset("society-of-minds", rounds=3), slow, on_event=on_event)
    state = engine.start("2+2?")
    task = asyncio.create_task(engine.run(state))
    await asyncio.wait_for(round_two.wait(), timeout=60)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert state.result.status == "interrupted" and state.result.stop_reason == "cancelled"
    assert len(state.result.rounds[0].turns) == 3 and all(t.ok for t in state.result.rounds[0].turns)
    assert done == ["interrupted"]


async def test_between_rounds_is_the_explicit_step_that_may_change_the_running_debate() -> None:
    from moot.core.types import ContextChunk

    seen: list[int] = []

    def add_passage(state: DebateState, rnd: Any) -> None:
        seen.append(rnd.index)
        if rnd.index == 1:
            state.result.task.context.append(ContextChunk(text="a passage added between rounds"))

    model = ScriptedModel(fn=lambda r: {"reasoning": "r", "answer": "4", "confidence": 0.9})
    spec = get_preset("society-of-minds", history="prompt")
    result = await Engine(spec, model, between_rounds=add_passage).run("2+2?")
    assert seen == [1, 2] and result.status == "complete"
    round2 = [r for r in model.requests if "a passage added between rounds" in r.messages[-1].content]
    assert len(round2) == 3 and not any("a passage added" in r.messages[-1].content for r in model.requests[:3])


async def test_an_integrators_mistakes_are_refused_in_one_line_and_prices_give_a_cost() -> None:
    """From Python: ``Engine(spec, "embedded:...", max_tokens=16)`` dropped max_tokens without a word
    (an openai: model raised a TypeError naming an internal class); ``Engine("panel", m)`` was an
    AttributeError; and result.cost stayed None whatever the prices (only the CLI, the server and
    batch filled it)."""
    import inspect

    from moot.models.openai_compat import OpenAICompatModel
    from moot.models.pricing import price_table
    from moot.models.registry import OPENAI_OPTIONS

    spec = get_preset("single")
    with pytest.raises(TypeError, match=r"Engine: max_tokens: not a model option .*spec.with_turn_tokens\(n\)"):
        Engine(spec, ScriptedModel(["4"]), max_tokens=16)
    with pytest.raises(TypeError, match=r"Engine takes a ProtocolSpec, not str: moot.protocols.get_preset"):
        Engine("panel", ScriptedModel(["4"]))  # type: ignore[arg-type]
    # the options named are the openai: backend's own
    assert set(inspect.signature(OpenAICompatModel.__init__).parameters) - {"self", "model"} == OPENAI_OPTIONS
    model = ScriptedModel([json.dumps({"reasoning": "r", "answer": "4"})])
    priced = await Engine(spec, model, prices=price_table(None, [f"{model.name}=1,2"])).run("2+2?")
    assert priced.cost is not None and priced.cost.usd == 0.0 and priced.cost.unpriced == []  # (no tokens: $0)
    assert [line.model for line in priced.cost.models] == [model.name]
    unpriced = await Engine(spec, ScriptedModel([json.dumps({"reasoning": "r", "answer": "4"})])).run("2+2?")
    assert unpriced.cost is None  # (as before: left to the caller)


async def test_a_task_takes_its_passages_as_text() -> None:
    """``DebateTask(question=..., context=["plain"])`` was a pydantic error, where the LangGraph state,
    DebateEngine and a batch's inputs take passages as text."""
    from moot.core.types import ContextChunk, DebateTask

    task = DebateTask(question="Q?", context=["a passage", {"text": "another", "source": "notes.md"}])  # type: ignore[list-item]
    assert task.context == [ContextChunk(text="a passage"), ContextChunk(text="another", source="notes.md")]


@pytest.mark.parametrize("preset", ["moderated", "society-of-minds"])
async def test_an_error_that_is_no_models_failure_is_raised_as_it_is(preset: str) -> None:
    """A model raising an exception moot does not know (a bug in it): a RuntimeError under a
    sequential protocol, but 'ExceptionGroup: unhandled errors in a TaskGroup (3 sub-exceptions)'
    under one whose agents speak at once."""

    def broken(request: ChatRequest) -> str:
        raise RuntimeError("the model's own bug")

    with pytest.raises(RuntimeError, match="the model's own bug"):
        await Engine(get_preset(preset), ScriptedModel(fn=broken)).run("Q?")


async def test_a_token_budget_passed_within_a_round_is_said_in_the_warnings() -> None:
    """max_total_tokens is checked before each round: one round of one call ran past it without a word
    (an outside trial's, session 37)."""
    from moot.core.spec import Budget
    from moot.protocols import get_preset

    spec = get_preset("single")
    spec = spec.model_copy(update={"budget": Budget(max_total_tokens=40)})
    reply = '{"reasoning": "' + "word " * 80 + '", "answer": "yes", "confidence": 0.9}'
    result = await Engine(spec, ScriptedModel([reply])).run("Is 7 prime?")
    assert result.usage.total_tokens > 40
    assert any("over budget.max_total_tokens of 40" in w for w in result.warnings), result.warnings
    roomy = spec.model_copy(update={"budget": Budget(max_total_tokens=100_000)})
    assert not any("max_total_tokens" in w for w in (await Engine(roomy, ScriptedModel(["x"])).run("q?")).warnings)


def test_a_prompt_over_a_budget_of_the_users_own_says_to_raise_it_and_by_how_much() -> None:
    """It said "use a model with a larger context window" for a budget the user set, and "more than 1
    tokens" (an outside trial's, session 37)."""
    from moot.core.budget import input_problem
    from moot.core.spec import Budget
    from moot.protocols import get_preset

    task = DebateTask(question="Is the sky blue?")
    for budget, raise_it in (
        (Budget(max_total_tokens=5), "raise budget.max_total_tokens to at least "),
        (Budget(max_prompt_tokens=3), "raise budget.max_prompt_tokens to at least "),
    ):
        spec = get_preset("society-of-minds").model_copy(update={"budget": budget})
        models = {p.id: ScriptedModel(["x"]) for p in spec.participants}
        problem = input_problem(spec, task, models)
        assert problem is not None and raise_it in problem and "larger context window" not in problem, problem
        needed = int(problem.split(raise_it)[1].split(",")[0])
        enough = budget.model_copy(
            update={k: needed for k, v in budget.model_dump().items() if k != "max_tokens_per_turn" and v}
        )
        assert input_problem(spec.model_copy(update={"budget": enough}), task, models) is None, enough
    tight = get_preset("society-of-minds").model_copy(update={"budget": Budget(max_total_tokens=5)})
    assert "more than 1 token," in (
        input_problem(tight, task, {p.id: ScriptedModel(["x"]) for p in tight.participants}) or ""
    )
