"""What the MCP door's tools return: a debate's outcome and the protocol catalogue, with their text.

:func:`outcome_of` reads a debate (live in the manager, or stored) into a :class:`DebateOutcome`:
the decision, the agents' agreement, who dissented and why, a confidence, and the calls, tokens and
cost, redacted as the /v1 routes redact. :func:`protocol_catalogue` is ``list_protocols``'s answer.
:func:`tool_result` wraps either as a ``CallToolResult`` (structured content and a few lines of text).
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import mcp_types as types
from pydantic import BaseModel

from moot.core.answers import answer_of, confidence_of, normalize_answer
from moot.core.dynamics import compute_dynamics
from moot.core.types import DebateResult, Turn
from moot.protocols import get_preset, get_preset_factory, preset_names
from moot.secrets import redact_json
from moot.server.mcp.tools import (
    RESOURCE_PREFIX,
    DebateOutcome,
    Dissent,
    ProtocolCatalogue,
    ProtocolEntry,
    ToolFailure,
)
from moot.server.openai.catalogue import tuned_names
from moot.server.settings import ServerSettings
from moot.server.state.manager import DebateManager

#: The longest reason of a dissenting agent that a result carries (the transcript has it whole).
REASON_CHARS = 400
#: Why a debate is still queued when the server stops (``moot mcp``'s host closed stdin).
STOPPED_QUEUED = (
    "the server stopped before this debate started; it stays queued in the store and runs when a server starts "
    "on it again (moot mcp --db FILE, moot serve)"
)


def outcome_of(manager: DebateManager, debate_id: str) -> DebateOutcome:
    """A debate by its id as the tools report it (a :class:`ToolFailure` when the server has none)."""
    row = manager.store.get(debate_id)
    if row is None:
        shown = cut(repr(debate_id), 80)  # (a megabyte of id came back whole, into the model's context)
        raise ToolFailure(f"no debate {shown} on this server; debate returns the id of each one it starts")
    live = manager.live.get(debate_id)
    status = live.status if live is not None else row.status
    result = live.result if live is not None and live.result is not None else row.result
    outcome = DebateOutcome(
        debate_id=debate_id,
        status=status,
        protocol=row.protocol,
        question=row.question,
        model=row.model,
        error=row.error,
        transcript=RESOURCE_PREFIX + debate_id,
    )
    if result is not None:
        _fill(outcome, result)
        if outcome.status in ("cancelled", "interrupted") and row.error:
            outcome.error = row.error
    if outcome.status == "queued" and manager.stopping:  # (a call waiting for it is answered now)
        outcome.error = STOPPED_QUEUED
    # Redacted as the store and the /v1 routes redact what they give back: a running debate's
    # transcript is read from memory, before the store's redaction.
    return DebateOutcome.model_validate_json(redact_json(outcome.model_dump_json(), manager.store.secrets))


def _fill(outcome: DebateOutcome, result: DebateResult) -> None:
    """The decision, its agreement, dissent and confidence, and the totals, from a transcript."""
    outcome.answer = result.final_answer
    outcome.decision = result.decision
    outcome.stop_reason = result.stop_reason
    outcome.error = result.error or outcome.error
    outcome.warnings = list(result.warnings)
    outcome.rounds = len(result.rounds)
    outcome.calls = result.llm_calls
    outcome.prompt_tokens = result.usage.prompt_tokens
    outcome.completion_tokens = result.usage.completion_tokens
    outcome.tokens = result.usage.total_tokens
    outcome.elapsed_s = round(result.elapsed_s, 3)
    if result.cost is not None:
        outcome.cost_usd = result.cost.usd
        outcome.unpriced = list(result.cost.unpriced)
    if not result.rounds:
        return
    dynamics = result.dynamics if result.dynamics is not None and result.dynamics.rounds else compute_dynamics(result)
    # The last round; while a debate runs, the last whole one (the one under way has only some turns).
    rnd = result.rounds[-1]
    if result.status == "running" and len(result.rounds) > 1 and len(rnd.turns) < len(result.rounds[-2].turns):
        rnd = result.rounds[-2]
    last = next((r for r in dynamics.rounds if r.round == rnd.index), None)
    if last is not None:
        outcome.agreement = last.agreement
    decided = normalize_answer(result.final_answer)
    against = decided if decided is not None else (last.majority if last is not None else None)
    turns = [t for t in rnd.turns if t.kind == "debate"]
    if against is not None:
        for turn in turns:
            answer = answer_of(turn)
            if answer is None or answer == against:
                continue
            raw = (turn.parsed or {}).get("answer")
            outcome.dissent.append(
                Dissent(
                    speaker=turn.speaker,
                    name=turn.name,
                    answer=str(raw if raw is not None else answer),
                    confidence=confidence_of(turn),
                    reason=_reason(turn),
                )
            )
    stated = (result.decision or {}).get("confidence")
    if isinstance(stated, int | float) and not isinstance(stated, bool) and math.isfinite(stated):
        outcome.confidence, outcome.confidence_from = round(float(stated), 4), "the decision"
    elif decided is not None:
        held = [c for t in turns if answer_of(t) == decided and (c := confidence_of(t)) is not None]
        if held:
            outcome.confidence = round(sum(held) / len(held), 4)
            outcome.confidence_from = f"the stated confidence of the {len(held)} agent(s) that gave the answer (mean)"


def outcome_text(o: DebateOutcome) -> str:
    """The outcome in a few lines, for a host that shows text (the structured content has it all)."""
    head = f"Debate {o.debate_id} ({o.protocol}): {o.status}"
    lines = []
    if o.answer is not None:
        lines.append(f"{head}. Answer: {cut(o.answer, 2000)}")
    else:
        lines.append(f"{head}." + (f" {o.error}" if o.error else ""))
    facts = []
    if o.agreement is not None:
        facts.append(f"agreement {o.agreement:.2f}")
    if o.confidence is not None:
        facts.append(f"confidence {o.confidence:.2f}")
    if facts:
        lines.append("; ".join(facts).capitalize() + ".")
    for d in o.dissent:
        why = f": {cut(d.reason, 200)}" if d.reason else ""
        lines.append(f"Dissent: {d.name} answered {cut(d.answer, 120)!r}{why}")
    if o.cost_usd is None or o.cost_usd == 0:
        money = "" if o.cost_usd is None else ", $0"
    else:
        money = f", ${o.cost_usd:.6f}" if o.cost_usd < 0.01 else f", ${o.cost_usd:.4f}"
    lines.append(f"{o.rounds} round(s), {o.calls} calls, {o.tokens} tokens{money}, {o.elapsed_s:.1f} s.")
    lines.append(f"Transcript: {o.transcript}")
    return "\n".join(lines)


def catalogue_text(c: ProtocolCatalogue) -> str:
    lines = [f"{p.name}: {p.calls} calls; {cut(p.description, 160)}" for p in c.protocols]
    lines.append(f"models: {', '.join(c.models)} (the first is the default); default protocol: {c.default_protocol}")
    return "\n".join(lines)


def tool_result(model: BaseModel, text: str, *, error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=model.model_dump(mode="json"),
        is_error=error,
    )


def outcome_result(outcome: DebateOutcome) -> types.CallToolResult:
    """What ``debate`` returns for a debate that ended (an error result unless it is complete)."""
    return tool_result(outcome, outcome_text(outcome), error=outcome.status != "complete")


def protocol_catalogue(settings: ServerSettings) -> ProtocolCatalogue:
    """``list_protocols``'s answer: the tuned protocol (when served) and each preset, and the models."""
    entries = []
    tuned = settings.tuned
    if tuned is not None:
        spec, evidence = tuned.spec(), tuned.evidence_json()
        for name in tuned_names(tuned):
            entries.append(_entry(name, spec, {}, evidence=evidence, line=tuned.summary()))
    for name in preset_names():
        parameters = {
            k: _plain(p.default)
            for k, p in inspect.signature(get_preset_factory(name)).parameters.items()
            if p.default is not inspect.Parameter.empty
        }
        entries.append(_entry(name, get_preset(name), parameters))
    return ProtocolCatalogue(protocols=entries, models=list(settings.models))


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return str(value)


def _entry(
    name: str,
    spec: Any,
    parameters: dict[str, Any],
    *,
    evidence: dict[str, Any] | None = None,
    line: str | None = None,
) -> ProtocolEntry:
    return ProtocolEntry(
        name=name,
        description=line or spec.description or name,
        calls=spec.planned_calls(),
        rounds=spec.rounds,
        participants=[p.persona.name for p in spec.participants],
        decision=spec.decision.kind,
        parameters=parameters,
        tuned=evidence,
        evidence=line,
    )


def cut(text: str, limit: int) -> str:
    """The text on one line, at most ``limit`` characters (cut with an ellipsis)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _reason(turn: Turn) -> str | None:
    parsed = turn.parsed or {}
    for key in ("reasoning", "rationale", "reason", "message", "content"):
        value = parsed.get(key)
        if isinstance(value, str) and value.strip():
            return cut(value, REASON_CHARS)
    return None
