"""The report's form: ``report.json``'s typed models (a protocol's summary, its comparisons, the
Pareto front, the seed spreads, the debate pairs) and the goal's family every report derives."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from moot.eval.goal import GOAL_TOKEN_SHARE, NON_INFERIORITY, Goal, corrected_family
from moot.eval.pool import PoolAnalysis
from moot.eval.quality import QualitySection
from moot.eval.store import RunConfig, RunSession
from moot.eval.variants import Variant


class Comparison(BaseModel):
    baseline: str
    paired: int
    diff: float
    ci_low: float
    ci_high: float
    p_value: float
    only_debate_right: int
    only_baseline_right: int
    #: ``equal-calls vote`` / ``equal-tokens vote``: the vote at the debate's mean calls / mean
    #: tokens, fixed by its budget alone (see the module docstring); ``adaptive vote``:
    #: Adaptive-Consistency at its authors' threshold on the pool, when it spends no more samples;
    #: ``dearer vote``: a vote that costs the debate's tokens / 0.7 or more (can the debate match it
    #: for less?).
    kind: str = "equal-calls vote"
    #: The baseline's mean tokens per item (for the share of its tokens the debate pays).
    baseline_tokens: float | None = None
    #: Items a paired test needs to detect a true 2-point gain with 80% power at this comparison's
    #: observed share of discordant items (None: no discordant items yet).
    items_needed: int | None = None
    #: The baseline is derived from the run's pool of samples (its k-subsets), not a protocol run.
    derived: bool = False
    #: Items on which the debate's expected correctness is above / below the baseline's: what a
    #: derived baseline has instead of items right under one side only (its per-item value is a mean
    #: over k-subsets, rarely exactly right or wrong). None in reports written before it was counted.
    debate_ahead: int | None = None
    baseline_ahead: int | None = None


class TurnLengths(BaseModel):
    """A protocol's turns that made a call (debate turns and LLM decisions; a carried turn made none):
    how many the token cap cut, and the distribution of their replies' output tokens (a repaired
    turn counts both its replies; a self-check's token is not the reply's). Read it to choose the cap:
    ``p98`` is the cap that cuts 2% of such turns, when the run's own cap cut fewer than that."""

    turns: int
    #: The debate turns' token cap (the largest, if participants differ; None: not known).
    cap: int | None = None
    #: Turns cut by their cap: the reply stopped at the limit (``finish_reason`` ``length``), also
    #: when it was then repaired (:attr:`moot.core.types.Turn.finish_reason`).
    cut: int = 0
    #: The other cap on a typed turn: its ``reasoning`` (``rationale``) field's maxLength in characters
    #: (:func:`moot.eval.items.reasoning_limit`), which the grammar enforces by closing the string
    #: there, with no finish_reason to say so; and the turns whose reasoning reached it.
    reasoning_limit: int | None = None
    at_reasoning_limit: int = 0
    p50: int = 0
    p90: int = 0
    p95: int = 0
    p98: int = 0
    p99: int = 0
    max: int = 0

    @property
    def cut_share(self) -> float:
        return self.cut / self.turns if self.turns else 0.0


class RoundStat(BaseModel):
    round: int
    debates: int
    agreement: float | None = None
    majority_accuracy: float | None = None


#: The most reasons a protocol's failures are summarised by (the rest: ``moot eval export``'s ``error``).
FAILURE_REASONS = 5


class ProtocolSummary(BaseModel):
    label: str
    baseline: bool
    k: int | None = None
    #: For a ``vote@auto``: the debate whose budget it matches (``ref=``, or the run's first debate).
    matched_to: str | None = None
    finished: int = 0
    failed: int = 0
    #: Why its failed items failed: each recorded reason (cut to 200 characters) and how many items
    #: gave it, the most frequent first, at most :data:`FAILURE_REASONS` (left out when none failed).
    failure_reasons: dict[str, int] = Field(default_factory=dict, exclude_if=lambda v: not v)
    correct: int = 0
    accuracy: float = 0.0
    ci_low: float = 0.0
    ci_high: float = 0.0
    #: Accuracy in expectation over tie-breaks (a decided tie credited by the share of its tied
    #: answers that are right); equal to ``accuracy`` when no decision tied.
    expected_accuracy: float | None = None
    #: Items whose decision was a tie broken by the tie rule.
    ties: int = 0
    #: Why a budget-matched vote is missing (the run has no vote at that k and its pool is smaller).
    missing_baselines: list[str] = Field(default_factory=list)
    #: Items whose final answer holds no answer of the item's kind (scored wrong, never dropped).
    unextractable: int = 0
    #: Turns whose reply could not be parsed into its schema (after the repair request, if any).
    parse_failures: int = 0
    #: The turns' lengths against the token cap (None: no transcripts, e.g. a run rebuilt from rows).
    turn_lengths: TurnLengths | None = None
    mean_calls: float = 0.0
    mean_prompt_tokens: float = 0.0
    mean_completion_tokens: float = 0.0
    mean_latency_s: float = 0.0
    comparison: Comparison | None = None
    #: The fair baselines beyond the equal-budget one (see :attr:`Comparison.kind`).
    other_comparisons: list[Comparison] = Field(default_factory=list)
    rounds: list[RoundStat] = Field(default_factory=list)
    right_to_wrong: int | None = None
    wrong_to_right: int | None = None
    decision_confidence: float | None = None
    consensus_rate: float | None = None
    improvement_over_single: float | None = None
    #: Calibration of the confidences the agents stated in their typed turns (every turn's
    #: answer scored against the gold one): expected calibration error and Brier score.
    stated_ece: float | None = None
    stated_brier: float | None = None
    stated_turns: int = 0
    #: Calls answered by the run's request cache (included in ``mean_calls``).
    mean_cached_calls: float = 0.0
    #: Items whose first round was unanimous and wrong: no gate on disagreement reaches them.
    unanimous_wrong_first: int | None = None
    #: Conformity: agents that, in a round, held an answer all their (two or more) peers agreed
    #: against, and of those how many gave the peers' answer in the next round (carried turns do not
    #: count: they made no choice). Near 100% is answer herding.
    outvoted: int | None = None
    adopted_peers: int | None = None
    #: For a protocol decided by a selection judge (``usc``, ``select``, ``decide=``): the items
    #: whose judge named no valid reply, so that the vote decided (None, and left out of the
    #: report: a protocol without a selection).
    selection_fallbacks: int | None = Field(default=None, exclude_if=lambda v: v is None)

    @property
    def mean_tokens(self) -> float:
        return self.mean_prompt_tokens + self.mean_completion_tokens


class ParetoPoint(BaseModel):
    name: str
    accuracy: float
    mean_tokens: float
    derived: bool = False


class SeedSpread(BaseModel):
    """One debate on several draws of its first round (``first_seed=``), each paired with its own
    draw's vote of the same kind: how much of a paired difference is the draw."""

    protocol: str
    kind: str
    #: (first seed, difference, 95% low, 95% high, paired items), one per draw.
    draws: list[tuple[int, float, float, float, int]]
    mean: float
    sd: float
    low: float
    high: float


class DebatePair(BaseModel):
    """A debate against another debate, or against ``single`` or ``vote@3``: the paired difference of
    expected accuracy (over tie-breaks), ``protocol`` minus ``against``, on the items both finished.
    Descriptive (an ablation, the debate against one answer): not in the goal's family, uncorrected."""

    protocol: str
    against: str
    items: int
    diff: float
    ci_low: float
    ci_high: float


#: The version of ``report.json``'s form, its first field (as ``moot.debate/1`` is a transcript's).
REPORT_SCHEMA: Literal["moot.eval-report/1"] = "moot.eval-report/1"


class EvalReport(BaseModel):
    #: A report.json written before the field existed (issue 29's reports) reads as this version.
    schema_version: Literal["moot.eval-report/1"] = REPORT_SCHEMA
    config: RunConfig
    items: int
    generated_at: str
    #: Seed 004: quality per protocol, the performance targets, the cost (``moot.eval.quality``).
    quality: QualitySection | None = None
    protocols: list[ProtocolSummary]
    #: Decision rules derived from the run's pool of samples (``moot.eval.pool``), if it has one.
    pool: PoolAnalysis | None = None
    #: Each debate re-decided by other rules over its own transcripts (``moot.eval.variants``).
    variants: list[Variant] = Field(default_factory=list)
    #: Protocols and derived rules that no other beats on accuracy at equal or fewer tokens, all
    #: measured on the ``pareto_items`` items every protocol finished.
    pareto: list[ParetoPoint] = Field(default_factory=list)
    pareto_items: int = 0
    #: Debates run on several draws of round 1 (``first_seed=``): the spread of their comparisons.
    seed_spreads: list[SeedSpread] = Field(default_factory=list)
    #: Each debate against each other debate, and against ``single`` and ``vote@3`` (descriptive).
    debate_pairs: list[DebatePair] = Field(default_factory=list)
    #: The processes that ran the run and how the model ran in each (llama.cpp threads and slots):
    #: what a seed does not pin down. Empty for a run from before they were recorded.
    sessions: list[RunSession] = Field(default_factory=list)
    #: Every paired comparison of the run as one family, corrected, and what reaches the goal
    #: (derived from the fields above when not given: a report built by hand, or an older report.json).
    goal: Goal | None = None

    @model_validator(mode="after")
    def _goal_of_the_comparisons(self) -> EvalReport:
        if self.goal is None:
            self.goal = goal_family(self.protocols, self.variants, self.pool)
        return self


def goal_family(protocols: list[ProtocolSummary], variants: list[Variant], pool: PoolAnalysis | None) -> Goal | None:
    """Every paired comparison the report has, corrected as one family (None: there is none)."""
    rows: list[tuple[str, float, float, float, float | None]] = []
    by_label = {s.label: s for s in protocols}
    needed: list[int] = []
    paired = 0
    for s in protocols:
        for c in ([s.comparison] if s.comparison is not None else []) + s.other_comparisons:
            share = s.mean_tokens / c.baseline_tokens if c.baseline_tokens else None
            rows.append((f"{s.label} against {c.baseline} ({c.kind})", c.diff, c.ci_low, c.ci_high, share))
            if c.items_needed is not None:
                needed.append(c.items_needed)
            paired = max(paired, c.paired)
    for v in variants:
        if v.baseline is None or v.diff_vs_baseline is None:
            continue
        base = by_label.get(v.baseline)
        share = v.mean_tokens / base.mean_tokens if base is not None and base.mean_tokens else None
        lo, hi = v.baseline_ci_low or 0.0, v.baseline_ci_high or 0.0
        rows.append((f"{v.protocol} / {v.variant} against {v.baseline}", v.diff_vs_baseline, lo, hi, share))
    if pool is not None:
        curve = {(cv.rule, cv.k): cv for cv in pool.curves}
        vote = curve.get(("vote", pool.k))
        for (rule, k), cv in curve.items():
            if rule == "vote" or k != pool.k or cv.diff_vs_vote is None or cv.ci_low is None or cv.ci_high is None:
                continue
            share = cv.mean_tokens / vote.mean_tokens if vote is not None and vote.mean_tokens else None
            rows.append((f"{rule}@{k} against vote@{k}", cv.diff_vs_vote, cv.ci_low, cv.ci_high, share))
        for (rule, k), cv in curve.items():
            # CISC's claim: the whole pool's vote matched with fewer samples.
            if rule == "vote" or k >= pool.k or vote is None or not vote.mean_tokens:
                continue
            if cv.diff_vs_full_vote is None or cv.full_ci_low is None or cv.full_ci_high is None:
                continue
            share = cv.mean_tokens / vote.mean_tokens
            if share <= GOAL_TOKEN_SHARE:
                rows.append((f"{rule}@{k} against vote@{pool.k}", cv.diff_vs_full_vote, cv.full_ci_low,
                             cv.full_ci_high, share))  # fmt: skip
        for a in pool.allocation:
            share = a.mean_tokens / a.vote_mean_tokens if a.vote_mean_tokens else None
            rows.append((f"uab@{a.budget} against vote@{a.budget}", a.diff_vs_vote, a.ci_low, a.ci_high, share))
        for ad in pool.adaptive:
            share = ad.mean_tokens / vote.mean_tokens if vote is not None and vote.mean_tokens else None
            rows.append((f"adaptive-consistency({ad.threshold:g}) against vote@{pool.k}", ad.diff_vs_full_vote,
                         ad.ci_low, ad.ci_high, share))  # fmt: skip
    if not rows:
        return None
    family = corrected_family(rows)
    for f in family:
        f.beats = f.gains()
        f.cheaper = (
            f.share is not None and f.share <= GOAL_TOKEN_SHARE and f.diff >= -0.005 and f.low >= -NON_INFERIORITY
        )
    return Goal(
        comparisons=family,
        items_needed=sorted(needed),
        paired=paired,
    )
