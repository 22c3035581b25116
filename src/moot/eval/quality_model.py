"""Seed 004's section of the report, its form: the typed rows :mod:`moot.eval.quality` computes and
:mod:`moot.eval.quality_render` renders (quality per protocol, the targets, the comparison with a
single agent, the cost, the validation of each dimension)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from moot.quality.judge import RUBRIC_VERSION
from moot.stats import BOOTSTRAP


class DimensionSummary(BaseModel):
    dimension: str
    #: Debates (finished transcripts) and those on which the dimension was measured.
    debates: int
    measured: int
    mean: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    #: The commonest reason it was not measured, when it was not measured everywhere.
    reason: str | None = None


class ProtocolQuality(BaseModel):
    label: str
    dimensions: list[DimensionSummary]


Verdict = Literal["met", "not met", "inconclusive", "not measured"]


class TargetRow(BaseModel):
    """One of seed 004's performance targets for one protocol."""

    metric: str
    protocol: str
    value: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    n: int = 0
    phase1: str
    phase1_verdict: Verdict = "not measured"
    phase2: str
    phase2_verdict: Verdict = "not measured"
    baseline: str
    #: How it was measured, or why it was not.
    note: str = ""


class ComparisonRow(BaseModel):
    """Seed 004's comparison of a debate with a single agent, on the items both finished."""

    metric: str
    protocol: str
    #: The debate's value, the single agent's, and the gain (positive: the debate is better).
    debate: float | None = None
    single: float | None = None
    gain: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    n: int = 0
    note: str = ""


class CostRow(BaseModel):
    protocol: str
    items: int
    mean_tokens: float
    mean_usd: float | None = None
    #: On the items both this protocol and ``single`` finished: this protocol's cost over single's.
    ratio_tokens: float | None = None
    ratio_usd: float | None = None
    note: str = ""


class AurocRow(BaseModel):
    """How well one quality dimension tells a protocol's right decisions from its wrong ones."""

    dimension: str
    #: A protocol's label, or :data:`POOLED` (every protocol's debates together).
    protocol: str
    #: Finished debates (decided or not); of them, those where the dimension was measured, and of
    #: those, the ones whose decision is right.
    debates: int
    measured: int = 0
    right: int = 0
    #: The probability that a right decision's debate scores higher than a wrong one's (a tie counts
    #: half): 0.5 is chance, 1 a perfect predictor, below 0.5 a predictor the wrong way round.
    auroc: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    #: Why there is no AUROC: the commonest reason the dimension was not measured, or a single class.
    note: str = ""


class QualityValidation(BaseModel):
    """Each quality dimension against what it did not define: whether the decision is right."""

    dataset: str
    model: str
    judges: list[str] = Field(default_factory=list)
    rubric: str = RUBRIC_VERSION
    #: The 95% interval: a percentile bootstrap over items, this many resamples from this seed.
    resamples: int = BOOTSTRAP
    seed: int = 0
    rows: list[AurocRow] = Field(default_factory=list)


class QualitySection(BaseModel):
    judges: list[str] = Field(default_factory=list)
    protocols: list[ProtocolQuality] = Field(default_factory=list)
    targets: list[TargetRow] = Field(default_factory=list)
    comparison: list[ComparisonRow] = Field(default_factory=list)
    cost: list[CostRow] = Field(default_factory=list)
    model: str = ""
    #: Does each dimension predict a right decision in this run? (None: numpy is not installed.)
    validation: QualityValidation | None = None
