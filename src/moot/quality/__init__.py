"""Seed 004's debate quality: every dimension of its ``DebateQualityEvaluator`` for a finished
debate, by the seed's names, each with a documented definition (docs/quality.md).

- ``evidence_quality``, ``argument_diversity``, ``consensus_quality``, ``decision_confidence``:
  deterministic (no model): evidence against the context passages the debate was given, diversity
  between the debaters' arguments, consensus and confidence from the typed answers and the decision;
- ``logical_consistency``, ``reasoning_depth``: a typed judge with a fixed rubric
  (:mod:`moot.quality.judge`), named in the result;
- ``overall_quality``: the mean of the seed's five dimensions that were measured.

A dimension that cannot be measured for a debate is absent from ``scores`` and present in
``unmeasured`` with the reason. How far each measure agrees with hand labels:
``moot quality agreement`` (:mod:`moot.quality.agreement`).
"""

from __future__ import annotations

from moot.core.types import QUALITY_DIMENSIONS, DebateQuality, DebateResult, QualityScore
from moot.models.base import BaseChatModel
from moot.models.registry import resolve_model
from moot.quality.judge import RUBRIC_VERSION, QualityJudgement, judge_debate, judged_scores
from moot.quality.measures import (
    ONE_AGENT,
    argument_diversity,
    consensus_quality,
    decision_confidence,
    evidence_quality,
)
from moot.stats import total

#: The seed's five dimensions, whose mean is ``overall_quality``.
SEED_DIMENSIONS = (
    "logical_consistency",
    "evidence_quality",
    "argument_diversity",
    "consensus_quality",
    "decision_confidence",
)
JUDGED = ("logical_consistency", "reasoning_depth")

__all__ = [
    "JUDGED",
    "QUALITY_DIMENSIONS",
    "RUBRIC_VERSION",
    "SEED_DIMENSIONS",
    "DebateQuality",
    "QualityJudgement",
    "QualityScore",
    "assess",
    "keep_judged",
    "measure",
    "recompute_overall",
]


def measure(result: DebateResult) -> DebateQuality:
    """The deterministic dimensions only (no model is called); the judged ones are unmeasured."""
    quality = DebateQuality()
    for name, fn in (
        ("evidence_quality", evidence_quality),
        ("argument_diversity", argument_diversity),
        ("consensus_quality", consensus_quality),
        ("decision_confidence", decision_confidence),
    ):
        outcome = fn(result)
        if isinstance(outcome, str):
            quality.unmeasured[name] = outcome
        else:
            quality.scores[name] = outcome
    for name in JUDGED:
        quality.unmeasured[name] = "no judge model was given (--judge-model MODEL)"
    recompute_overall(quality)
    return quality


async def assess(
    result: DebateResult, judge: str | BaseChatModel | None = None, *, max_tokens: int = 300
) -> DebateQuality:
    """Every dimension of ``result``: the deterministic ones, and with a ``judge`` model (a spec or a
    model) the judged ones. Nothing but the judge's one call (and at most one repair) is made."""
    quality = measure(result)
    if judge is None:
        return quality
    model = resolve_model(judge)
    quality.judge = model.name
    outcome = await judge_debate(result, model, max_tokens=max_tokens)
    quality.judge_calls, quality.judge_usage = outcome.calls, outcome.usage
    for name in JUDGED:
        quality.unmeasured.pop(name, None)
    if outcome.judgement is None:
        for name in JUDGED:
            quality.unmeasured[name] = outcome.error or "the judge gave no judgement"
    else:
        quality.scores.update(judged_scores(outcome.judgement))
    recompute_overall(quality)
    return quality


def keep_judged(quality: DebateQuality, earlier: DebateQuality | None) -> DebateQuality:
    """``quality`` (measured without a judge) with the judged dimensions ``earlier`` holds, and
    its judge: scoring a saved debate again without a judge keeps what a judge gave it."""
    if earlier is None or quality.judge is not None or not any(d in earlier.scores for d in JUDGED):
        return quality
    for name in JUDGED:
        if name in earlier.scores:
            quality.scores[name] = earlier.scores[name]
            quality.unmeasured.pop(name, None)
    quality.judge, quality.judge_calls, quality.judge_usage = earlier.judge, earlier.judge_calls, earlier.judge_usage
    recompute_overall(quality)
    return quality


def recompute_overall(quality: DebateQuality) -> None:
    """Set ``overall_quality`` from the seed's dimensions measured in ``quality`` (and keep the seed's order)."""
    quality.scores.pop("overall_quality", None)
    quality.unmeasured.pop("overall_quality", None)
    measured = [d for d in SEED_DIMENSIONS if d in quality.scores]
    if not measured:
        why = "none of the seed's five dimensions could be measured"
        trivial = next((r for d in SEED_DIMENSIONS if (r := quality.unmeasured.get(d, "")).startswith(ONE_AGENT)), None)
        quality.unmeasured["overall_quality"] = f"{ONE_AGENT}: {why} for one agent" if trivial else why
        return
    quality.scores["overall_quality"] = QualityScore(
        value=round(total(quality.scores[d].value for d in measured) / len(measured), 6),
        method="judge" if any(quality.scores[d].method == "judge" for d in measured) else "deterministic",
        details={"mean_of": measured, "missing": [d for d in SEED_DIMENSIONS if d not in measured]},
    )
    # keep the seed's order: the five, reasoning depth, then the overall score
    quality.scores = {d: quality.scores[d] for d in QUALITY_DIMENSIONS if d in quality.scores}
    quality.unmeasured = {d: quality.unmeasured[d] for d in QUALITY_DIMENSIONS if d in quality.unmeasured}
