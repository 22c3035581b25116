"""The decision step: how a debate whose rounds are over gets its answer.

:func:`decide` dispatches on the spec's decision: a vote or a rule (pure functions of the
transcript, :mod:`moot.core.decisions`), a selection (a judge picks one of the final round's
replies, with the vote as its fallback), a synthesis or a judge (one call, two for a judge that
first lists the candidates), after an action vote when the debaters proposed tool calls
(:mod:`moot.core.tools`). It records the decision, the final answer and why it failed, on the
result.

It is apart from :mod:`moot.core.decisions` because this step calls a model (that module makes no
call), yet it does not make the calls itself: it asks the decision model through an :class:`Ask`
the engine gives it, which runs and records the call as every other turn is (events, call budget,
retries, the transcript's ``decision_turns``), so nothing here knows of the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from moot.core import sight
from moot.core.answers import answer_of
from moot.core.decisions import DecisionOutcome, SelectedReply, Selection, get_rule, vote, voting_turns
from moot.core.schemas import selection_schema_name
from moot.core.spec import (
    JudgeDecision,
    NoDecision,
    ProtocolSpec,
    RuleDecision,
    SelectDecision,
    TurnFormat,
    VoteDecision,
    render,
)
from moot.core.state import DebateState
from moot.core.tools import action_vote
from moot.core.types import DebateResult, Persona, Turn
from moot.models.base import Message
from moot.models.images import ImageInput
from moot.structured import dumps_compact


class Ask(Protocol):
    """One call of the decision model, made and recorded by the engine: the turn it gives
    (``speaker="decision"``, in the result's ``decision_turns``)."""

    async def __call__(
        self,
        *,
        persona: Persona,
        messages: list[Message],
        max_tokens: int,
        turn_format: TurnFormat | None,
        temperature: float | None,
    ) -> Turn: ...


#: How a result's error begins when the decision's own call (a synthesis', a judge's verdict) failed,
#: not a step before it (a judge's list of candidates).
DECISION_FAILED = "the decision step failed"


async def decide(spec: ProtocolSpec, state: DebateState, ask: Ask) -> None:
    """Decide the debate of ``state`` by ``spec``'s decision, its ``stop_reason`` already set;
    the outcome (``decision``, ``final_answer``, ``error``) goes on ``state.result``."""
    res = state.result
    decision = spec.decision
    if isinstance(decision, NoDecision):
        return
    if res.stop_reason == "all_failed":
        res.error = res.error or first_error(res)
        return  # the backends are failing: spend nothing more on them
    if res.stop_reason == "call_budget" and not res.rounds:
        # (the front doors refuse it before any call; a library caller learns it here, whatever the decision)
        res.error = spec.call_budget_problem() or "the call budget was spent before the first round"
        return  # nothing was said: there is nothing to decide on
    if isinstance(decision, SelectDecision):
        await _select(spec, state, decision, ask)
        return
    if isinstance(decision, VoteDecision | RuleDecision):
        if isinstance(decision, VoteDecision):
            outcome = spec_vote(res, decision)
        else:
            outcome = get_rule(decision.name)(res, decision.params)
        res.decision = {"kind": decision.kind, **outcome.details}
        res.final_answer = outcome.final_answer
        if outcome.error:
            res.error = outcome.error
        return
    acted: dict[str, Any] | None = None
    if decision.actions is not None:
        # The debaters proposed actions: a winning tool call is the decision; answering is left to this one.
        outcome = action_vote(res, {"rounds": decision.actions.rounds, "answers": "one"})
        if outcome.error:
            res.error = outcome.error
            return
        res.decision = acted = {"kind": decision.kind, **outcome.details}
        if outcome.details["action"]["type"] == "tool_call":
            res.final_answer = outcome.final_answer
            return
        acted["action"] = {"type": "answer"}  # what the answer is, the decision's call writes
    answers = [(p, res.last_answer(p.id)) for p in spec.participants]
    given = [(p, a) for p, a in answers if a is not None]
    if not given:
        res.error = res.error or first_error(res) or "no participant produced an answer to decide on"
        return
    values = sight.task_values(spec, res.task) | {
        "answers": "\n\n".join(f'The answer of {p.persona.name}:\n"""\n{a}\n"""' for p, a in given),
        "transcript": sight.render_transcript(spec, res),
        "max_tokens": decision.max_tokens,
        "candidates": "",
    }
    if isinstance(decision, JudgeDecision) and decision.extract_candidates:
        first = await _decision_call(
            spec,
            ask,
            decision.persona,
            "Question: {question}\n\nThe debate:\n{transcript}\n\n"
            "List the distinct final answers the debaters proposed, as JSON.",
            values,
            decision.max_tokens,
            TurnFormat(schema="candidates"),
            res.task.images,
        )
        if not first.ok or first.parsed is None:
            res.error = f"the judge could not list the candidate answers: {first.error or first.parse_failure}"
            return
        values["candidates"] = "\n".join(f"- {c}" for c in first.parsed["candidates"])
    fmt = TurnFormat(schema=decision.schema_name) if isinstance(decision, JudgeDecision) else None
    turn = await _decision_call(
        spec, ask, decision.persona, decision.prompt, values, decision.max_tokens, fmt, res.task.images
    )
    if not turn.ok:
        res.error = f"{DECISION_FAILED}: {turn.error or (turn.parse_failure and turn.parse_failure.error)}"
        return
    if isinstance(decision, JudgeDecision) and turn.parsed is not None:
        # After an action vote, the verdict goes beside it (its fields cannot pass for the vote's).
        res.decision = {**acted, "verdict": turn.parsed} if acted is not None else {"kind": "judge", **turn.parsed}
        if decision.answer_field is not None:
            picked = turn.parsed.get(decision.answer_field)
            res.final_answer = None if picked is None else str(picked)
            if picked is None:
                res.error = f"the judge's verdict has no {decision.answer_field!r}"
            return
    res.final_answer = turn.text


def spec_vote(res: DebateResult, decision: VoteDecision) -> DecisionOutcome:
    """The vote ``decision`` describes, over the debate ``res``."""
    return vote(
        res,
        answer_field=decision.answer_field,
        confidence_field=decision.confidence_field if decision.weighted else None,
        calibrate=decision.calibrate,
        rounds=decision.rounds,
        speakers=decision.speakers,
        tie_break=decision.tie_break,
        signal=decision.signal,
        softmax_temperature=decision.softmax_temperature,
        keep=decision.keep,
        filter_signal=decision.filter_signal,
    )


async def _select(spec: ProtocolSpec, state: DebateState, decision: SelectDecision, ask: Ask) -> None:
    """A judge picks one of the final round's replies (one call, greedy by default); the
    decision's answer is that reply's. A judge that names no valid reply, and fewer than two
    replies to choose from, leave it to the fallback vote, recorded with the reason."""
    res = state.result
    replies = [
        t for t in voting_turns(res, "last", decision.speakers) if answer_of(t, decision.answer_field) is not None
    ]
    record = Selection(
        mode=decision.mode,
        responses=[
            SelectedReply(speaker=t.speaker, round=t.round, answer=str(answer_of(t, decision.answer_field)))
            for t in replies
        ],
    )
    reason: str | None = None
    if len(replies) < 2:
        reason = f"{len(replies)} typed repl{'y' if len(replies) == 1 else 'ies'} in the final round: nothing to select"
    else:
        # Each reply whole (its reasoning and answer), as USC shows its samples; a stated
        # confidence is not shown: it is no part of the response the judge weighs.
        shown = "\n\n".join(
            f"Response {i}: "
            + (dumps_compact({k: v for k, v in t.parsed.items() if k != "confidence"}) if t.parsed else t.text or "")
            for i, t in enumerate(replies)
        )
        values = sight.task_values(spec, res.task) | {
            "responses": shown,
            "answers": "",
            "transcript": "",
            "candidates": "",
            "max_tokens": decision.max_tokens,
        }
        persona = decision.persona
        messages = [Message(role="user", content=render(decision.template(), values), images=tuple(res.task.images))]
        if persona.instructions:
            messages.insert(0, Message(role="system", content=persona.system_prompt()))
        turn = await ask(
            persona=persona,
            messages=messages,
            max_tokens=decision.max_tokens,
            turn_format=TurnFormat(schema=selection_schema_name(decision.mode, len(replies))),
            temperature=decision.temperature,
        )
        picked = turn.parsed.get("response") if turn.ok and turn.parsed is not None else None
        if isinstance(picked, int) and not isinstance(picked, bool) and 0 <= picked < len(replies):
            chosen = record.responses[picked]
            record = record.model_copy(update={"selected": picked, "speaker": chosen.speaker, "answer": chosen.answer})
            res.decision = record.model_dump(mode="json")
            res.final_answer = chosen.answer
            return
        failure = turn.error or (turn.parse_failure.error if turn.parse_failure is not None else None)
        failure = failure or f"response {picked!r} is not one of 0 to {len(replies) - 1}"
        reason = f"the judge named no valid response: {failure}"
    outcome = spec_vote(res, decision.fallback)
    record = record.model_copy(update={"fallback": "vote", "fallback_reason": reason, "vote": outcome.details})
    res.decision = record.model_dump(mode="json")
    res.final_answer = outcome.final_answer
    res.warnings.append(f"the selection decision fell back to the vote: {reason}")
    if outcome.error:
        res.error = outcome.error


async def _decision_call(
    spec: ProtocolSpec,
    ask: Ask,
    persona: Persona,
    template: str,
    values: dict[str, Any],
    max_tokens: int,
    turn_format: TurnFormat | None,
    images: Sequence[ImageInput],
) -> Turn:
    """A decision's call, shown the task's ``images`` with its prompt as the debaters were."""
    messages = [
        Message(role="system", content=persona.system_prompt()),
        Message(role="user", content=render(template, values), images=tuple(images)),
    ]
    return await ask(
        persona=persona,
        messages=messages,
        max_tokens=max_tokens,
        turn_format=turn_format,
        temperature=spec.temperature,
    )


def first_error(res: DebateResult) -> str | None:
    """The first failure of the debate's turns, decision turns last: a call's error, or a reply
    that could not be parsed (None: none failed)."""
    for t in [*(t for r in res.rounds for t in r.turns), *res.decision_turns]:
        if t.error:
            return t.error
        if t.parse_failure and t.finish_reason == "length":  # cut, then cut again: the budget is the cause
            return (
                f"{t.name}'s reply could not be parsed: it stopped at its token limit ({t.parse_failure.error}); "
                "raise the turn's max_tokens to give it room"
            )
        if t.parse_failure:
            return f"{t.name}'s reply could not be parsed: {t.parse_failure.error}"
    return None
