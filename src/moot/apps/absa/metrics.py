"""Metrics of an ABSA run: the task's (aspects, polarities, sentence labels) and the debate's
(seed 001 §9), aggregated from per-sentence :class:`SentenceRecord` s, with warnings.

**Task metrics** (micro-averaged: counts summed over sentences, then P / R / F1):

- ``aspect_term``: a predicted aspect is right when its normalised term
  (:func:`moot.apps.absa.mapping.normalize`) is a gold one; terms are sets per sentence (a term
  predicted twice counts once).
- ``aspect_term_overlap``: the lenient variant: a predicted aspect matches a gold one when both
  have spans that overlap by at least one character, or (either lacks a span) their normalised
  terms are equal; matching is one-to-one, greedy in gold order, each gold aspect taking the
  unmatched prediction with the largest overlap (an equal term counts as the largest).
- ``aspect_polarity``: right when the normalised term and the polarity are both a gold pair.
- ``sentence_accuracy``; ``sentence_macro_f1``: the mean per-label F1 over the labels present in
  the gold labels or the predictions.

Zero denominators: precision (recall) is 0 when nothing was predicted (in the gold), except that
with neither gold nor predicted aspects in the whole set P = R = F1 = 1 (nothing to find, nothing
found wrongly).

**Debate metrics**, over the sentences that have mapping stats (rates are ``None`` when there is no
turn at all): ``debate_mapping_coverage`` = (direct + fallback) / turns; ``..._direct_rate``,
``..._fallback_rate``, ``..._none_rate`` = each / turns; ``debate_fail_{reason}_rate`` = the
reason's count / turns (a turn may count under two reasons, e.g. fallback and neutral stance).
Override counts are summed over the sentences with override stats;
``debate_override_skipped_already_confident_rate`` is skipped_already_confident over all the
override's aspect decisions (applied + the three skips).

**Warnings** (thresholds from ``src/moot/data/absa/debate_thresholds.json``): coverage below
``coverage_warn`` (0.6) warns, below ``coverage_high`` (0.4) is a high warning; the no-match rate
above ``no_match_warn`` (0.3) / ``no_match_high`` (0.5), the neutral-stance rate above
``neutral_warn`` (0.4) / ``neutral_high`` (0.6) likewise. The neutral thresholds sit above 1/3
because the panel has one neutral speaker in three: a neutral rate near 0.33 is its normal state.
Each warning has a message and a tip.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from moot.apps.absa.mapping import normalize
from moot.apps.absa.types import (
    DATA_DIR,
    FAIL_REASONS,
    SENTENCE_LABELS,
    AspectTuple,
    OverrideStats,
    SentenceLabel,
    SentenceRecord,
)
from moot.files import read_json

DEBATE_THRESHOLDS_PATH = DATA_DIR / "debate_thresholds.json"


class DebateThresholds(BaseModel):
    """Warning thresholds of the debate mapping metrics (see the module's rules)."""

    model_config = ConfigDict(extra="forbid")

    coverage_warn: float = Field(default=0.6, ge=0, le=1)
    coverage_high: float = Field(default=0.4, ge=0, le=1)
    no_match_warn: float = Field(default=0.3, ge=0, le=1)
    no_match_high: float = Field(default=0.5, ge=0, le=1)
    neutral_warn: float = Field(default=0.4, ge=0, le=1)
    neutral_high: float = Field(default=0.6, ge=0, le=1)

    @classmethod
    def load(cls, path: str | Path | None = None) -> DebateThresholds:
        """From a JSON object (keys starting with ``_`` are comments); None: the shipped file."""
        data = read_json(path or DEBATE_THRESHOLDS_PATH, "debate thresholds file")
        return cls.model_validate({k: v for k, v in data.items() if not k.startswith("_")})


class MetricWarning(BaseModel):
    metric: str
    level: Literal["warn", "high"]
    value: float
    threshold: float
    message: str
    tip: str

    def __str__(self) -> str:
        return f"[{self.level.upper()}] {self.message} Tip: {self.tip}"


class PRF(BaseModel):
    precision: float
    recall: float
    f1: float
    tp: int
    predicted: int
    gold: int


class TaskMetrics(BaseModel):
    sentences: int
    aspect_term: PRF
    aspect_term_overlap: PRF
    aspect_polarity: PRF
    sentence_accuracy: float
    sentence_macro_f1: float
    sentence_f1: dict[str, float] = Field(default_factory=dict)


class DebateMetrics(BaseModel):
    sentences: int = 0
    turns: int = 0
    debate_mapping_coverage: float | None = None
    debate_mapping_direct_rate: float | None = None
    debate_mapping_fallback_rate: float | None = None
    debate_mapping_none_rate: float | None = None
    debate_fail_no_aspects_rate: float | None = None
    debate_fail_no_match_rate: float | None = None
    debate_fail_neutral_stance_rate: float | None = None
    debate_fail_fallback_used_rate: float | None = None
    debate_override_applied: int = 0
    debate_override_skipped_low_signal: int = 0
    debate_override_skipped_conflict: int = 0
    debate_override_skipped_already_confident: int = 0
    debate_override_skipped_already_confident_rate: float | None = None


class AbsaMetrics(BaseModel):
    task: TaskMetrics
    debate: DebateMetrics
    warnings: list[MetricWarning] = Field(default_factory=list)

    def flat(self) -> dict[str, float | int | None]:
        """One level of named numbers, for a report table."""
        t = self.task
        out: dict[str, float | int | None] = {
            "sentences": t.sentences,
            "aspect_term_f1": t.aspect_term.f1,
            "aspect_term_overlap_f1": t.aspect_term_overlap.f1,
            "aspect_polarity_f1": t.aspect_polarity.f1,
            "sentence_accuracy": t.sentence_accuracy,
            "sentence_macro_f1": t.sentence_macro_f1,
        }
        out.update({k: v for k, v in self.debate.model_dump().items() if k.startswith("debate_")})
        return out


# ------------------------------------------------------------------------------------ counting


def prf(tp: int, predicted: int, gold: int) -> PRF:
    """Precision, recall and F1 from counts (see the module's zero-denominator rule)."""
    if predicted == 0 and gold == 0:
        return PRF(precision=1.0, recall=1.0, f1=1.0, tp=0, predicted=0, gold=0)
    p = tp / predicted if predicted else 0.0
    r = tp / gold if gold else 0.0
    f1 = 2 * p * r / (p + r) if p + r else 0.0
    return PRF(precision=p, recall=r, f1=f1, tp=tp, predicted=predicted, gold=gold)


def term_counts(gold: Sequence[AspectTuple], pred: Sequence[AspectTuple]) -> tuple[int, int, int]:
    """``(tp, predicted, gold)`` of exact normalised terms, as sets."""
    g = {normalize(a.aspect_term) for a in gold}
    p = {normalize(a.aspect_term) for a in pred}
    return len(g & p), len(p), len(g)


def _pairs(tuples: Sequence[AspectTuple]) -> set[tuple[str, str]]:
    return {(normalize(a.aspect_term), a.polarity) for a in tuples}


def pair_counts(gold: Sequence[AspectTuple], pred: Sequence[AspectTuple]) -> tuple[int, int, int]:
    """``(tp, predicted, gold)`` of (normalised term, polarity) pairs, as sets."""
    g, p = _pairs(gold), _pairs(pred)
    return len(g & p), len(p), len(g)


def found_pairs(gold: Sequence[AspectTuple], pred: Sequence[AspectTuple]) -> list[str]:
    """The gold (normalised term, polarity) pairs ``pred`` has, as sorted ``term|polarity`` keys:
    what pairs two runs gold pair by gold pair."""
    return sorted(f"{t}|{pol}" for t, pol in _pairs(gold) & _pairs(pred))


def _overlap(a: AspectTuple, b: AspectTuple) -> int:
    """Characters two aspects share; -1 when they do not match. Equal terms without both spans
    count as a full match (``10**9``)."""
    if a.span is not None and b.span is not None:
        inter = min(a.span[1], b.span[1]) - max(a.span[0], b.span[0])
        return inter if inter > 0 else -1
    return 10**9 if normalize(a.aspect_term) == normalize(b.aspect_term) else -1


def overlap_counts(gold: Sequence[AspectTuple], pred: Sequence[AspectTuple]) -> tuple[int, int, int]:
    """``(tp, predicted, gold)`` of the span-overlap match (one-to-one, greedy in gold order);
    duplicate aspects (same normalised term and span) count once."""

    def unique(items: Sequence[AspectTuple]) -> list[AspectTuple]:
        seen: set[tuple[str, tuple[int, int] | None]] = set()
        out = []
        for a in items:
            key = (normalize(a.aspect_term), a.span)
            if key not in seen:
                seen.add(key)
                out.append(a)
        return out

    g, p = unique(gold), unique(pred)
    free = list(range(len(p)))
    tp = 0
    for a in g:
        best = max(free, key=lambda k: _overlap(a, p[k]), default=None)
        if best is not None and _overlap(a, p[best]) > 0:
            free.remove(best)
            tp += 1
    return tp, len(p), len(g)


def _sum(counts: Sequence[tuple[int, int, int]]) -> PRF:
    return prf(sum(c[0] for c in counts), sum(c[1] for c in counts), sum(c[2] for c in counts))


def sentence_f1(gold: Sequence[SentenceLabel], pred: Sequence[SentenceLabel]) -> dict[str, float]:
    """F1 per label present in ``gold`` or ``pred`` (in the order positive, negative, neutral, mixed)."""
    out: dict[str, float] = {}
    for label in SENTENCE_LABELS:
        if label not in gold and label not in pred:
            continue
        tp = sum(1 for g, p in zip(gold, pred, strict=True) if g == p == label)
        fp = sum(1 for g, p in zip(gold, pred, strict=True) if p == label != g)
        fn = sum(1 for g, p in zip(gold, pred, strict=True) if g == label != p)
        out[label] = 2 * tp / (2 * tp + fp + fn)
    return out


def task_metrics(records: Sequence[SentenceRecord]) -> TaskMetrics:
    gold = [r.gold_label for r in records]
    pred = [r.pred_label for r in records]
    per_label = sentence_f1(gold, pred)
    return TaskMetrics(
        sentences=len(records),
        aspect_term=_sum([term_counts(r.gold_aspects, r.pred_aspects) for r in records]),
        aspect_term_overlap=_sum([overlap_counts(r.gold_aspects, r.pred_aspects) for r in records]),
        aspect_polarity=_sum([pair_counts(r.gold_aspects, r.pred_aspects) for r in records]),
        sentence_accuracy=sum(g == p for g, p in zip(gold, pred, strict=True)) / len(records) if records else 0.0,
        sentence_macro_f1=sum(per_label.values()) / len(per_label) if per_label else 0.0,
        sentence_f1=per_label,
    )


def debate_metrics(records: Sequence[SentenceRecord]) -> DebateMetrics:
    mapped = [r for r in records if r.mapping_stats is not None]
    turns = direct = fallback = none = 0
    reasons = dict.fromkeys(FAIL_REASONS, 0)
    for r in mapped:
        assert r.mapping_stats is not None
        turns += r.mapping_stats.turns
        direct += r.mapping_stats.direct
        fallback += r.mapping_stats.fallback
        none += r.mapping_stats.none
        for k, v in (r.mapping_fail_reasons or {}).items():
            reasons[k] = reasons.get(k, 0) + v
    ov = OverrideStats()
    for r in records:
        if r.override_stats is not None:
            ov = ov + r.override_stats

    def rate(n: int) -> float | None:
        return n / turns if turns else None

    return DebateMetrics(
        sentences=len(mapped),
        turns=turns,
        debate_mapping_coverage=rate(direct + fallback),
        debate_mapping_direct_rate=rate(direct),
        debate_mapping_fallback_rate=rate(fallback),
        debate_mapping_none_rate=rate(none),
        debate_fail_no_aspects_rate=rate(reasons["no_aspects"]),
        debate_fail_no_match_rate=rate(reasons["no_match"]),
        debate_fail_neutral_stance_rate=rate(reasons["neutral_stance"]),
        debate_fail_fallback_used_rate=rate(reasons["fallback_used"]),
        debate_override_applied=ov.applied,
        debate_override_skipped_low_signal=ov.skipped_low_signal,
        debate_override_skipped_conflict=ov.skipped_conflict,
        debate_override_skipped_already_confident=ov.skipped_already_confident,
        debate_override_skipped_already_confident_rate=ov.skipped_already_confident / ov.total if ov.total else None,
    )


TIPS = {
    "coverage": "ask the speakers to fill aspect_refs with Stage 1 aspect terms, and add the words they use to "
    "the synonym patterns (src/moot/data/absa/patterns/*.json).",
    "no_match": "turns talk about aspects Stage 1 did not find, or in words the patterns lack: check Stage 1 ATE "
    "recall and extend the synonym groups.",
    "neutral": "neutral-stance turns carry no polarity and cannot move the override; the panel's analyst is "
    "neutral, so about 1/3 is normal: more means the pro/con speakers are not naming aspects.",
}


def debate_warnings(m: DebateMetrics, th: DebateThresholds | None = None) -> list[MetricWarning]:
    """Warnings for the mapping metrics (see the module's rules); none without turns."""
    t = th or DebateThresholds()
    out: list[MetricWarning] = []

    def check(
        metric: str, value: float | None, warn: float, high: float, low_is_bad: bool, what: str, tip: str
    ) -> None:
        if value is None:
            return
        value = round(value, 9)
        bad_high = value < high if low_is_bad else value > high
        bad_warn = value < warn if low_is_bad else value > warn
        if not (bad_high or bad_warn):
            return
        level: Literal["warn", "high"] = "high" if bad_high else "warn"
        threshold = high if bad_high else warn
        sign = "<" if low_is_bad else ">"
        out.append(
            MetricWarning(
                metric=metric,
                level=level,
                value=value,
                threshold=threshold,
                message=f"{metric} = {value:.2f} {sign} {threshold:.2f}: {what}.",
                tip=tip,
            )
        )

    check(
        "debate_mapping_coverage",
        m.debate_mapping_coverage,
        t.coverage_warn,
        t.coverage_high,
        True,
        "few debate turns were mapped to an aspect",
        TIPS["coverage"],
    )
    check(
        "debate_fail_no_match_rate",
        m.debate_fail_no_match_rate,
        t.no_match_warn,
        t.no_match_high,
        False,
        "many debate turns matched no aspect, even by fallback",
        TIPS["no_match"],
    )
    check(
        "debate_fail_neutral_stance_rate",
        m.debate_fail_neutral_stance_rate,
        t.neutral_warn,
        t.neutral_high,
        False,
        "many mapped turns had a neutral stance",
        TIPS["neutral"],
    )
    return out


def aggregate(records: Sequence[SentenceRecord], thresholds: DebateThresholds | None = None) -> AbsaMetrics:
    """Task and debate metrics over a dataset, with the debate warnings."""
    debate = debate_metrics(records)
    return AbsaMetrics(task=task_metrics(records), debate=debate, warnings=debate_warnings(debate, thresholds))
