"""The decision step (``moot.core.decision_step``) on its own: no engine, a recorded ``ask``.

test_engine.py, test_tools.py and test_beat_the_vote.py hold the decisions through whole debates;
these hold the seam: what the step asks the decision model, and what it does with the answer.
"""

from __future__ import annotations

from typing import Any

from moot.core import decision_step
from moot.core.spec import (
    NoDecision,
    Participant,
    ProtocolSpec,
    SelectDecision,
    SynthesizeDecision,
    TurnFormat,
    VoteDecision,
)
from moot.core.state import DebateState
from moot.core.types import DebateResult, DebateTask, Persona, Round, Turn
from moot.models.base import Message


def debate(decision: Any, *turns: Turn, temperature: float | None = 0.3) -> tuple[ProtocolSpec, DebateState]:
    spec = ProtocolSpec(
        name="d",
        participants=[Participant(id=i, persona=Persona(name=i.upper())) for i in ("a", "b", "c")],
        decision=decision,
        temperature=temperature,
        turn=TurnFormat(schema="answer"),  # the turns below are typed
    )
    result = DebateResult(protocol="d", task=DebateTask(question="What is 17 * 3?"), participants=[])
    result.rounds = [Round(index=1, turns=list(turns))]
    result.stop_reason = "max_rounds"
    return spec, DebateState(result=result)


def turn(speaker: str, answer: str | None, *, error: str | None = None) -> Turn:
    parsed = {"reasoning": f"{speaker} thinks", "answer": answer, "confidence": 0.9} if answer else None
    return Turn(
        speaker=speaker,
        name=speaker.upper(),
        round=1,
        model="m",
        messages=[],
        text=answer,
        parsed=parsed,
        error=error,
    )


class Recorder:
    """An ``Ask`` that records each call and answers with the next of ``replies``."""

    def __init__(self, *replies: Turn) -> None:
        self.replies = list(replies)
        self.calls: list[dict[str, Any]] = []

    async def __call__(
        self,
        *,
        persona: Persona,
        messages: list[Message],
        max_tokens: int,
        turn_format: TurnFormat | None,
        temperature: float | None,
    ) -> Turn:
        self.calls.append(
            {"persona": persona.name, "messages": messages, "max_tokens": max_tokens,
             "format": turn_format, "temperature": temperature}
        )  # fmt: skip
        return self.replies.pop(0)


def reply(text: str | None = None, parsed: dict[str, Any] | None = None, error: str | None = None) -> Turn:
    return Turn(speaker="decision", name="D", round=1, model="m", messages=[], text=text, parsed=parsed, error=error)


async def test_a_synthesis_asks_once_with_the_last_answers_at_the_spec_s_temperature() -> None:
    spec, state = debate(
        SynthesizeDecision(prompt="{question}\n{answers}", max_tokens=77), turn("a", "51"), turn("b", "52")
    )
    ask = Recorder(reply("It is 51."))
    await decision_step.decide(spec, state, ask)
    assert state.result.final_answer == "It is 51." and state.result.error is None
    [call] = ask.calls
    assert (call["persona"], call["max_tokens"], call["format"], call["temperature"]) == ("Synthesizer", 77, None, 0.3)
    assert [m.role for m in call["messages"]] == ["system", "user"]
    assert call["messages"][1].content == (
        'What is 17 * 3?\nThe answer of A:\n"""\n51\n"""\n\nThe answer of B:\n"""\n52\n"""'
    )
    failed = Recorder(reply(error="backend down"))
    spec, state = debate(SynthesizeDecision(), turn("a", "51"))
    await decision_step.decide(spec, state, failed)
    assert state.result.final_answer is None and state.result.error == "the decision step failed: backend down"


async def test_a_selection_naming_no_valid_reply_falls_back_to_the_vote_and_says_why() -> None:
    spec, state = debate(SelectDecision(), turn("a", "51"), turn("b", "52"), turn("c", "51"))
    ask = Recorder(reply("3", parsed={"response": 3}))  # one past the last
    await decision_step.decide(spec, state, ask)
    [call] = ask.calls
    assert call["temperature"] == 0.0 and call["format"].schema_name is not None  # greedy, typed
    # The replies are shown whole but for their stated confidence.
    assert 'Response 0: {"reasoning": "a thinks", "answer": "51"}\n' in call["messages"][-1].content
    decision = state.result.decision
    assert decision is not None and decision["fallback"] == "vote"
    assert decision["fallback_reason"] == "the judge named no valid response: response 3 is not one of 0 to 2"
    assert state.result.final_answer == "51"
    picked = Recorder(reply("1", parsed={"response": 1}))
    spec, state = debate(SelectDecision(), turn("a", "51"), turn("b", "52"), turn("c", "51"))
    await decision_step.decide(spec, state, picked)
    assert state.result.final_answer == "52" and state.result.decision["speaker"] == "b"  # type: ignore[index]


async def test_a_debate_whose_backends_all_failed_spends_nothing_on_its_decision() -> None:
    spec, state = debate(SynthesizeDecision(), turn("a", None, error="first"), turn("b", None, error="second"))
    state.result.stop_reason = "all_failed"
    ask = Recorder()
    await decision_step.decide(spec, state, ask)
    assert ask.calls == [] and state.result.error == "first"
    # Not even a vote: its own complaint (no typed answer) would hide the backends' error.
    spec, state = debate(VoteDecision(), turn("a", None, error="first"), turn("b", None, error="second"))
    state.result.stop_reason = "all_failed"
    await decision_step.decide(spec, state, ask)
    assert state.result.error == "first" and state.result.decision is None
    spec, state = debate(NoDecision(), turn("a", "51"))
    await decision_step.decide(spec, state, ask)
    assert ask.calls == [] and state.result.decision is None and state.result.error is None
