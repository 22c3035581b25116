"""Engine.resume: a debate interrupted mid-round goes on from its recorded transcript, running only
what is missing (the take-over of a debate by another replica of ``moot serve`` rests on it)."""

from __future__ import annotations

import asyncio

import pytest

from moot import ScriptedModel
from moot.core import (
    Budget,
    DebateResult,
    DebateResumed,
    DebateStarted,
    Engine,
    NoDecision,
    Participant,
    Persona,
    ProtocolSpec,
    TurnDone,
    Visibility,
)
from moot.core.events import Event
from moot.models.base import ChatRequest

NAMES = ("Alpha", "Beta", "Gamma")


def speaker_of(request: ChatRequest) -> str:
    system = request.messages[0].content
    return next(n for n in NAMES if n in system)


def echo(request: ChatRequest) -> str:
    return f"{speaker_of(request)} answer (saw {request.messages[1].content.count('(round ')} turns)"


def spec(order: str, visibility: Visibility, *, rounds: int = 3, max_calls: int | None = None) -> ProtocolSpec:
    return ProtocolSpec(
        name="three",
        participants=[Participant(id=n.lower(), persona=Persona(name=n, role=n.lower())) for n in NAMES],
        order=order,  # type: ignore[arg-type]
        visibility=visibility,
        decision=NoDecision(),
        rounds=rounds,
        budget=Budget(max_calls=max_calls, timeout_s=None),
    )


async def interrupted_in_round_2(protocol: ProtocolSpec) -> DebateResult:
    """The debate as its store holds it when its process stops in round 2, once Alpha's turn of round
    2 is done and the others' are in flight: the transcript as a JSON round trip, the cut turns in it."""
    calls: list[str] = []

    async def hang_in_round_2(request: ChatRequest) -> str:
        who = speaker_of(request)
        calls.append(who)
        if calls.count(who) == 2 and who != "Alpha":
            await asyncio.sleep(3600)  # in flight when the process stops
        return echo(request)

    alpha_done = asyncio.Event()

    def on_event(event: Event) -> None:
        if isinstance(event, TurnDone) and event.turn.speaker == "alpha" and event.turn.round == 2:
            alpha_done.set()

    engine = Engine(protocol, ScriptedModel(fn=hang_in_round_2), on_event=on_event)
    state = engine.start("Q?")
    runner = asyncio.create_task(engine.run(state))
    await asyncio.wait_for(alpha_done.wait(), 30)
    await asyncio.sleep(0.05)  # the others are in flight (sequential: Beta is)
    runner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await runner
    return DebateResult.model_validate_json(state.result.model_dump_json())


@pytest.mark.parametrize(
    ("order", "visibility"),
    [
        ("simultaneous", Visibility(who="others", window=1)),
        ("sequential", Visibility(who="all", window=1, same_round=True)),
    ],
)
async def test_a_debate_cut_mid_round_2_resumes_with_exactly_the_missing_calls(
    order: str, visibility: Visibility
) -> None:
    protocol = spec(order, visibility)
    whole = await Engine(protocol, ScriptedModel(fn=echo)).run("Q?")
    stored = await interrupted_in_round_2(protocol)
    kept = [(t.speaker, t.round) for t in stored.turns() if t.ok]
    assert kept == [("alpha", 1), ("beta", 1), ("gamma", 1), ("alpha", 2)]
    assert any((t.error or "").startswith("cancelled:") for t in stored.turns())  # the cut turn(s) are there

    events: list[Event] = []
    model = ScriptedModel(fn=echo)
    engine = Engine(protocol, model, on_event=events.append)
    state = engine.resume(stored)
    assert state.resumed == 4 and state.partial is not None and state.partial.index == 2
    result = await engine.run(state)

    # Only the missing calls: round 2's Beta and Gamma, then round 3; none of the recorded turns again.
    if order == "sequential":
        assert [speaker_of(r) for r in model.requests] == ["Beta", "Gamma", "Alpha", "Beta", "Gamma"]
    assert sorted(speaker_of(r) for r in model.requests) == ["Alpha", "Beta", "Beta", "Gamma", "Gamma"]
    assert result.status == "complete" and len(result.rounds) == 3
    assert all(len(r.turns) == 3 and all(t.ok for t in r.turns) for r in result.rounds)
    # Each saw what it would have seen, had nothing stopped: the same transcript as an uninterrupted run.
    assert [(t.speaker, t.round, t.text) for t in result.turns()] == [
        (t.speaker, t.round, t.text) for t in whole.turns()
    ]
    # The recorded turns are counted once: in the calls, the usage and the budget.
    assert result.llm_calls == whole.llm_calls == 9
    assert result.usage == whole.usage
    # Announced as resumed, never as started again; and the result says so.
    assert not any(isinstance(e, DebateStarted) for e in events)
    first = events[0]
    assert isinstance(first, DebateResumed) and (first.kept_turns, first.round) == (4, 2)
    assert any(w.startswith("resumed after an interruption: 4 finished turn(s) kept, going on in round 2") for w in
               result.warnings)  # fmt: skip


async def test_the_call_budget_counts_the_recorded_turns() -> None:
    # 7 calls: rounds 1 and 2 (6), not round 3. Had the 4 recorded turns not counted, round 3 would run.
    protocol = spec("simultaneous", Visibility(who="others", window=1), max_calls=7)
    stored = await interrupted_in_round_2(protocol)
    model = ScriptedModel(fn=echo)
    engine = Engine(protocol, model)
    result = await engine.run(engine.resume(stored))
    assert len(model.requests) == 2 and result.llm_calls == 6
    assert result.stop_reason == "call_budget" and len(result.rounds) == 2


async def test_a_process_killed_between_rounds_goes_on_with_the_next_round() -> None:
    # A kill -9 leaves no cut turn: the store holds the finished ones only (here, round 1 whole).
    protocol = spec("simultaneous", Visibility(who="others", window=1))
    whole = await Engine(protocol, ScriptedModel(fn=echo)).run("Q?")
    stored = whole.model_copy(deep=True)
    stored.rounds = stored.rounds[:1]
    stored.status = "running"
    model = ScriptedModel(fn=echo)
    engine = Engine(protocol, model)
    state = engine.resume(stored)
    assert state.partial is None and state.resumed == 3
    result = await engine.run(state)
    assert len(model.requests) == 6 and result.llm_calls == 9 and result.status == "complete"
    assert [t.text for t in result.turns()] == [t.text for t in whole.turns()]
