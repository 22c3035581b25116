"""Arbitration: one typed verdict per contradiction (a single arbitrator call, or a whole debate run
by the engine), concurrently under a bound, within a call budget and a timeout.

    result = await arbitrate(reports, ArbitrationConfig(source_authority=["GCC-STAT", "World Bank"]))
    result.status, result.resolved_count, result.flagged_count, result.consensus_narrative
    result.adjusted_reports

With no contradictions nothing is resolved or called and the status is ``skipped``. A failed
call, an unparsable verdict, the timeout or a spent budget leaves the contradiction flagged for
review (``status="partial"``): a verdict is never made up.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from moot.apps.arbitration.consensus import apply_outcomes, combine, narrative
from moot.apps.arbitration.detect import detect_contradictions
from moot.apps.arbitration.prompts import (
    ARBITRATOR,
    arbitration_prompt,
    debate_context,
    debate_question,
    judge_prompt,
)
from moot.apps.arbitration.types import (
    ArbitrationConfig,
    ArbitrationResult,
    ArbitrationVerdict,
    ConfigInput,
    Contradiction,
    ReportsInput,
    VerdictSample,
    as_config,
    as_reports,
    verdict_schema,
)
from moot.core.engine import DebateTimeout, Engine
from moot.core.spec import JudgeDecision, ProtocolSpec
from moot.core.types import DebateTask
from moot.models.base import BaseChatModel, ChatRequest, Message, ModelError, Usage
from moot.models.registry import resolve_model
from moot.secrets import redact
from moot.structured import complete_structured, get_schema, register_schema

_PENDING = "pending"


class _CallBudget:
    """Model calls spent by the whole arbitration, shared by every concurrent task. Reservations
    are synchronous (no await between check and count), so concurrent tasks cannot overspend.

    ``owed`` counts the first calls still to be made: a repair request may only use budget beyond
    them, so one arbitrator's repair cannot starve another contradiction of its verdict."""

    def __init__(self, limit: int | None, owed: int = 0) -> None:
        self.limit = limit
        self.used = 0
        self.owed = owed

    def reserve(self, n: int = 1, *, first: bool = False) -> bool:
        if first:
            self.owed = max(0, self.owed - 1)
            margin = 0
        else:
            margin = self.owed
        if self.limit is not None and self.used + n + margin > self.limit:
            return False
        self.used += n
        return True

    def settle(self, reserved: int, actual: int) -> None:
        self.used += actual - reserved


def verdict_schema_name(parties: int) -> str:
    """The registered name of the N-party verdict schema (what a debate's judge answers in)."""
    name = f"arbitration-verdict-{parties}"
    schema = verdict_schema(parties)
    try:
        get_schema(name)
    except KeyError:
        register_schema(name, schema)
    return name


def debate_spec(base: ProtocolSpec, parties: int, cfg: ArbitrationConfig) -> ProtocolSpec:
    """A debate preset turned into an arbitration: its debaters argue over the findings, and its
    decision is replaced by the arbitrator as a judge answering in the verdict schema."""
    decision = JudgeDecision(
        schema=verdict_schema_name(parties),
        answer_field="resolution",
        persona=ARBITRATOR,
        prompt=judge_prompt(parties),
        max_tokens=cfg.max_tokens,
    )
    update: dict[str, Any] = {"decision": decision, "max_context_chunks": None}
    if cfg.rounds is not None:
        update["rounds"] = cfg.rounds
    if cfg.temperature is not None:
        update["temperature"] = cfg.temperature
    return base.model_copy(update=update)


def _resolve_protocol(protocol: str | ProtocolSpec | None) -> ProtocolSpec | None:
    """The debate protocol: a spec or a protocol file keeps its own budget (``budget.timeout_s``
    bounds each debate); a preset named by name does not keep its step timeout (seed 000's 10 s is
    not the user's): the arbitration's own timeout governs."""
    if protocol is None or isinstance(protocol, ProtocolSpec):
        return protocol
    from moot.protocols import preset_names
    from moot.protocols.loader import resolve_protocol

    spec = resolve_protocol(protocol)
    if protocol in preset_names():
        spec = spec.model_copy(update={"budget": spec.budget.model_copy(update={"timeout_s": None})})
    return spec


class _Runner:
    def __init__(self, cfg: ArbitrationConfig, model: BaseChatModel, protocol: ProtocolSpec | None) -> None:
        self.cfg = cfg
        self.model = model
        self.protocol = protocol
        self.budget = _CallBudget(cfg.max_calls)
        self.timed_out = False

    async def run(self, contradictions: Sequence[Contradiction]) -> dict[str, list[VerdictSample]]:
        cfg = self.cfg
        slots = {c.id: [VerdictSample(error=_PENDING) for _ in range(cfg.arbitrators)] for c in contradictions}
        self.budget.owed = sum(len(samples) for samples in slots.values())
        bound = asyncio.Semaphore(cfg.concurrency)

        async def one(c: Contradiction, slot: VerdictSample, k: int) -> None:
            async with bound:
                slot.error = None
                t0 = time.perf_counter()
                try:
                    if self.protocol is None:
                        await self._call(c, slot, k)
                    else:
                        await self._debate(c, slot, self.protocol)
                finally:
                    slot.latency_ms = (time.perf_counter() - t0) * 1000

        try:
            async with asyncio.timeout(cfg.timeout_s) as scope, asyncio.TaskGroup() as tg:
                for c in contradictions:
                    for k, slot in enumerate(slots[c.id]):
                        tg.create_task(one(c, slot, k))
        except TimeoutError:
            if not scope.expired():
                raise
            self.timed_out = True
        for samples in slots.values():
            for s in samples:
                if s.error == _PENDING:
                    s.error = f"not arbitrated: the timeout of {cfg.timeout_s:g} s expired first"
        return slots

    def _timeout_error(self) -> str:
        return f"timed out after {self.cfg.timeout_s:g} s during arbitration"

    async def _call(self, c: Contradiction, slot: VerdictSample, k: int) -> None:
        cfg = self.cfg
        if not self.budget.reserve(first=True):
            calls = "call" if cfg.max_calls == 1 else "calls"
            slot.error = f"not arbitrated: the call budget of {cfg.max_calls} {calls} is spent"
            return
        repair = self.budget.reserve()  # a repair request only if the budget has room for it
        request = ChatRequest(
            messages=[
                Message(role="system", content=ARBITRATOR.system_prompt()),
                Message(role="user", content=arbitration_prompt(c, cfg)),
            ],
            max_tokens=cfg.max_tokens,
            temperature=cfg.temperature,
            seed=k if cfg.arbitrators > 1 else None,
        )
        slot.calls = 1
        try:
            outcome = await complete_structured(self.model, request, verdict_schema(len(c.parties)), repair=repair)
        except ModelError as exc:
            slot.error = redact(str(exc))
            self.budget.settle(int(repair), 0)
            return
        except asyncio.CancelledError:
            slot.error = self._timeout_error()
            self.budget.settle(int(repair), 0)
            raise
        self.budget.settle(int(repair), len(outcome.responses) - 1)
        slot.calls = len(outcome.responses)
        usage = Usage()
        for r in outcome.responses:
            usage = usage + r.usage
        slot.usage = usage
        if outcome.value is not None:
            slot.verdict = ArbitrationVerdict.model_validate(outcome.value)
        else:
            assert outcome.failure is not None
            slot.error = f"unparsable verdict after {outcome.failure.attempts} attempt(s): {outcome.failure.error}"
            slot.raw = outcome.failure.raw

    async def _debate(self, c: Contradiction, slot: VerdictSample, base: ProtocolSpec) -> None:
        cfg = self.cfg
        spec = debate_spec(base, len(c.parties), cfg)
        planned = spec.planned_calls()
        if not self.budget.reserve(planned, first=True):
            calls = "call" if cfg.max_calls == 1 else "calls"
            slot.error = (
                f"not arbitrated: the call budget of {cfg.max_calls} {calls} cannot fit a debate of {planned} calls"
            )
            return
        if cfg.max_calls is not None:
            spec = spec.model_copy(update={"budget": spec.budget.model_copy(update={"max_calls": planned})})
        engine = Engine(spec, self.model)
        # Our own state: however the debate is stopped, its partial transcript and calls are kept.
        state = engine.start(DebateTask(question=debate_question(c), context=debate_context(c, cfg)))
        own = spec.budget.timeout_s
        try:
            result = await engine.run(state)
        except DebateTimeout:
            error = f"the debate did not finish within its protocol's timeout of {own:g} s"
            state.result.error = error
            slot.transcript = state.result
            slot.error = error
            slot.calls = state.result.llm_calls
            slot.usage = state.result.usage
            self.budget.settle(planned, state.result.llm_calls)
            return
        except asyncio.CancelledError:
            # The arbitration's own timeout: the engine finished the transcript as interrupted.
            state.result.stop_reason = "timeout"
            state.result.status = "timeout"
            state.result.error = self._timeout_error()
            slot.transcript = state.result
            slot.error = self._timeout_error()
            slot.calls = state.result.llm_calls
            slot.usage = state.result.usage
            self.budget.settle(planned, state.result.llm_calls)
            raise
        self.budget.settle(planned, result.llm_calls)
        slot.transcript = result
        slot.calls = result.llm_calls
        slot.usage = result.usage
        parsed = result.decision_turns[-1].parsed if result.decision_turns else None
        if result.status != "complete" or parsed is None:
            slot.error = f"the debate reached no verdict: {result.error or 'no decision'}"
        else:
            slot.verdict = ArbitrationVerdict.model_validate(parsed)


async def arbitrate(
    reports: ReportsInput,
    config: ConfigInput = None,
    *,
    model: str | BaseChatModel | None = None,
    protocol: str | ProtocolSpec | None = None,
) -> ArbitrationResult:
    """Detect the contradictions among ``reports``, arbitrate each, and build the consensus.

    ``model`` (a spec or a model) overrides ``config.model``; ``protocol`` (a preset name, a
    protocol file or a spec) overrides ``config.protocol`` and makes each arbitration a debate
    whose judge gives the verdict. The model is resolved only if there is something to arbitrate.
    """
    t0 = time.perf_counter()
    cfg = as_config(config)
    given = as_reports(reports)
    spec = _resolve_protocol(protocol if protocol is not None else cfg.protocol)
    contradictions = detect_contradictions(given, cfg)
    if not contradictions:
        return ArbitrationResult(
            status="skipped",
            consensus_narrative=narrative([], [], len(given)),
            adjusted_reports=[r.model_copy(deep=True) for r in given],
            latency_ms=(time.perf_counter() - t0) * 1000,
        )
    runner = _Runner(cfg, resolve_model(model if model is not None else cfg.model), spec)
    samples = await runner.run(contradictions)
    outcomes = [combine(c, samples[c.id], cfg) for c in contradictions]

    warnings: list[str] = []
    if cfg.arbitrators > 1 and not cfg.temperature:
        warnings.append(
            f"{cfg.arbitrators} arbitrators at temperature {cfg.temperature or 'default'}: "
            "independent verdicts need a temperature above 0 to differ"
        )
    if runner.timed_out:
        warnings.append(f"the arbitration timeout of {cfg.timeout_s:g} s expired")
    for c in contradictions:
        for k, s in enumerate(samples[c.id], 1):
            if s.error is not None:
                who = f"arbitrator {k}" if cfg.arbitrators > 1 else "the arbitrator"
                warnings.append(f"{c.id} ({c.metric}): {who} gave no verdict: {s.error}")
    usage = Usage()
    for ss in samples.values():
        for s in ss:
            usage = usage + s.usage
    complete = all(any(s.verdict is not None for s in samples[c.id]) for c in contradictions)
    resolved = sum(o.status == "resolved" for o in outcomes)
    return ArbitrationResult(
        status="complete" if complete else "partial",
        contradictions=contradictions,
        verdicts=outcomes,
        resolved_count=resolved,
        flagged_count=len(outcomes) - resolved,
        consensus_narrative=narrative(contradictions, outcomes, len(given)),
        adjusted_reports=apply_outcomes(given, contradictions, outcomes),
        calls=runner.budget.used,
        usage=usage,
        latency_ms=(time.perf_counter() - t0) * 1000,
        warnings=warnings,
    )
