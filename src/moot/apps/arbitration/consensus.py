"""From verdicts to a consensus: confidence-weighted decisions, flags, adjusted reports, a narrative.

Pure functions (no model). The rules, per contradiction:

1. The valid verdicts (failed or unparsable ones are not votes) are grouped by ``action`` and
   weighed by their confidence. With several arbitrators, a winning group that does not carry
   more than ``majority`` (0.5) of the weight is a split decision: flagged for review.
2. The outcome's confidence is the winning group's weight over the number of valid verdicts
   (one arbitrator: its verdict's confidence). Below ``min_confidence`` (0.6): flagged.
3. ``flag_for_review`` (and so ``neither_valid``): flagged. A ``use_agentK`` verdict whose
   ``recommended_value`` is not agent K's value (within ``tolerance``) is inconsistent: flagged.
   No verdict at all (every call failed, the timeout, the call budget): flagged.
4. Otherwise resolved: ``use_agentK`` replaces the other parties' findings with agent K's (at the
   recommended value), ``use_both`` keeps every finding and notes why all are valid.

Nothing is ever invented: a flagged contradiction leaves its findings as reported, with a note.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from moot.apps.arbitration.detect import relative_difference
from moot.apps.arbitration.types import (
    AgentReport,
    ArbitrationConfig,
    ArbitrationNote,
    ArbitrationOutcome,
    ArbitrationVerdict,
    Contradiction,
    Finding,
    ReportsInput,
    VerdictSample,
    as_reports,
)


def combine(c: Contradiction, samples: list[VerdictSample], cfg: ArbitrationConfig) -> ArbitrationOutcome:
    """The outcome of one contradiction from its arbitrators' verdicts (see the module's rules)."""
    valid = [s.verdict for s in samples if s.verdict is not None]
    if not valid:
        errors = [s.error for s in samples if s.error]
        reason = errors[0] if errors else "no verdict"
        return ArbitrationOutcome(
            contradiction_id=c.id, status="flagged", flag_reason=f"no verdict: {reason}", samples=samples
        )
    weights: dict[str, float] = {}
    for v in valid:
        weights[v.action] = weights.get(v.action, 0.0) + v.confidence
    ranked = sorted(weights.items(), key=lambda kv: kv[1], reverse=True)
    top_action, top_weight = ranked[0]
    total = sum(weights.values())
    verdict = max((v for v in valid if v.action == top_action), key=lambda v: v.confidence)
    confidence = round(top_weight / len(valid), 6)

    def flagged(reason: str) -> ArbitrationOutcome:
        return ArbitrationOutcome(
            contradiction_id=c.id,
            status="flagged",
            verdict=verdict,
            confidence=confidence,
            flag_reason=reason,
            samples=samples,
        )

    if len(valid) > 1:
        share = top_weight / total if total > 0 else 0.0
        tie = len(ranked) > 1 and ranked[1][1] == top_weight
        if tie or share <= cfg.majority:
            split = ", ".join(f"{a} ({w:.2f})" for a, w in ranked)
            return flagged(f"split decision between the arbitrators: {split}")
    if verdict.action == "flag_for_review":
        # The reason says why, not what: every place that shows it already says "flagged for review".
        why = "the arbitrator found neither finding valid" if verdict.resolution == "neither_valid" else (
            "the arbitrator could not decide"
        )  # fmt: skip
        return flagged(why)
    if confidence < cfg.min_confidence:
        return flagged(f"verdict confidence {confidence:g} is below {cfg.min_confidence:g}")
    winner: str | None = None
    if verdict.winner is not None:
        party = c.parties[verdict.winner - 1]
        winner = party.agent
        rec, own = verdict.recommended_value, party.finding.value
        if rec is not None and (own is None or relative_difference(rec, own) > cfg.tolerance):
            return flagged(
                f"inconsistent verdict: it recommends {rec:g}, but agent {verdict.winner} ({winner}) reported "
                + ("no value" if own is None else f"{own:g}")
            )
    return ArbitrationOutcome(
        contradiction_id=c.id,
        status="resolved",
        verdict=verdict,
        winner=winner,
        confidence=confidence,
        samples=samples,
    )


def _original(
    f: Finding, contradiction_id: str, action: Literal["replaced", "confirmed"], note: str
) -> ArbitrationNote:
    return ArbitrationNote(
        contradiction_id=contradiction_id,
        action=action,
        note=note,
        original_value=f.value,
        original_citation=f.citation,
        original_interpretation=f.interpretation,
        original_confidence=f.confidence,
    )


def apply_outcomes(
    reports: ReportsInput, contradictions: Sequence[Contradiction], outcomes: Sequence[ArbitrationOutcome]
) -> list[AgentReport]:
    """Copies of the reports with every outcome applied to its parties' findings (``reports`` as
    models or their JSON form)."""
    adjusted = [r.model_copy(deep=True) for r in as_reports(reports)]
    for c, o in zip(contradictions, outcomes, strict=True):
        v = o.verdict
        for k, party in enumerate(c.parties, 1):
            findings = adjusted[party.report_index].findings
            f = findings[party.finding_index]
            if o.status == "flagged" or v is None:
                note = ArbitrationNote(
                    contradiction_id=c.id, action="flagged", note=f"{c.metric}: flagged for review: {o.flag_reason}"
                )
                findings[party.finding_index] = f.model_copy(update={"arbitration": note})
            elif v.winner is None:
                every = "both" if len(c.parties) == 2 else f"all {len(c.parties)}"
                note = ArbitrationNote(
                    contradiction_id=c.id, action="kept_both", note=f"{every} findings are valid: {v.explanation}"
                )
                findings[party.finding_index] = f.model_copy(update={"arbitration": note})
            else:
                best = c.parties[v.winner - 1].finding
                value = v.recommended_value if v.recommended_value is not None else best.value
                cite = f" ({v.recommended_citation})" if v.recommended_citation else ""
                action: Literal["replaced", "confirmed"]
                if k == v.winner:
                    action, text = "confirmed", f"confirmed by arbitration{cite}: {v.explanation}"
                else:
                    action = "replaced"
                    text = f"replaced by {o.winner}'s finding{cite}: {v.explanation}"
                update = {
                    "value": value,
                    "unit": best.unit,
                    "interpretation": best.interpretation,
                    "citation": best.citation,
                    "confidence": best.confidence,
                    "arbitration": _original(f, c.id, action, text),
                }
                findings[party.finding_index] = f.model_copy(update=update)
    return adjusted


def _where(f: Finding) -> str:
    c = f.citation
    if c is None:
        return ""
    return f" ({c.source}" + (f", {c.period}" if c.period else "") + ")"


def _val(f: Finding) -> str:
    if f.value is None:
        return f'"{f.interpretation}"' if f.interpretation else "no value"
    return f"{f.value:g}" + (f" {f.unit}" if f.unit else "")


def _sentence(text: str) -> str:
    text = text.strip()
    if not text:
        return ""
    return " " + (text if text[-1] in ".!?。" else text + ".")


def narrative(contradictions: Sequence[Contradiction], outcomes: Sequence[ArbitrationOutcome], n_reports: int) -> str:
    """A plain account of what was found and decided (no model call)."""
    if not contradictions:
        return f"No contradictions among {n_reports} agent reports: nothing to arbitrate."
    resolved = sum(o.status == "resolved" for o in outcomes)
    flagged = len(outcomes) - resolved
    n = len(contradictions)
    parts = [f"{n} contradiction{'s' if n != 1 else ''} found: {resolved} resolved, {flagged} flagged for review."]
    for c, o in zip(contradictions, outcomes, strict=True):
        v: ArbitrationVerdict | None = o.verdict
        findings = [p.finding for p in c.parties]
        if o.status == "flagged" or v is None:
            parts.append(f"{c.metric}: flagged for review ({o.flag_reason}).")
        elif v.winner is None:
            values = [f.value for f in findings if f.value is not None]
            unit = findings[0].unit
            reported = ", ".join(f"{p.agent} reports {_val(p.finding)}{_where(p.finding)}" for p in c.parties)
            if len(set(values)) > 1:
                head = f"{c.metric} ranges {min(values):g}-{max(values):g}{' ' + unit if unit else ''}"
                cited = [f.citation for f in findings if f.citation is not None]
                if len({(x.source, x.period) for x in cited}) > 1:
                    head += " depending on source and period"
            else:
                head = f"{c.metric}: all findings are valid"
            parts.append(f"{head}: {reported}.{_sentence(v.explanation)}")
        else:
            best = c.parties[v.winner - 1]
            others = ", ".join(
                f"{p.agent}'s {_val(p.finding)}{_where(p.finding)}" for k, p in enumerate(c.parties, 1) if k != v.winner
            )
            parts.append(
                f"{c.metric}: {best.agent}'s {_val(best.finding)}{_where(best.finding)} is used over {others} "
                f"(confidence {o.confidence:g}).{_sentence(v.explanation)}"
            )
    return " ".join(parts)
