"""The report's analyses: pure functions of a loaded run (:class:`moot.eval.loaded.LoadedRun`).

Accuracy is over the finished items of a protocol, a failed item counting as wrong (failures are
also shown on their own); the interval is Wilson's. Every vote (a protocol's or a rule's) breaks a
tie for the answer given first, and the report also gives its expected accuracy over tie-breaks
(a tied item credited by the share of its tied answers that are right); comparisons use the
expected accuracy on both sides, so no comparison rides on one tie-break's luck.

Each debate's baselines are fixed by its budget alone, before any accuracy is looked at: the vote
at its mean calls (``equal-calls vote``) and the vote at its mean tokens (``equal-tokens vote``),
each a ``vote@auto`` of the run matched to it, else a fixed ``vote@K`` at that K, else the vote at
that K derived from the run's pool of samples; Adaptive-Consistency at the threshold its authors
use (0.95), when it spends no more samples than the debate's calls. The paired difference has a
95% interval (Agresti-Min's; on items with a tie, the same over fractional credits) and its
p-value; the goal's family of comparisons is corrected for multiplicity (Holm's p-values and
Bonferroni intervals). Dynamics come from the transcripts: agreement and majority accuracy per
round, and the flips counted against the gold answer.
"""

from __future__ import annotations

import json
import math
import statistics
from datetime import UTC, datetime
from statistics import NormalDist
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from moot.core.answers import answer_of, confidence_of
from moot.core.decisions import selection_of
from moot.core.schemas import ANSWER_FORMS, AnswerForm
from moot.core.spec import SpecError
from moot.core.types import DebateResult
from moot.eval.items import EvalItem, reasoning_limit
from moot.eval.loaded import LoadedRun, as_loaded
from moot.eval.pool import PoolAnalysis, analyse_pool, calibration_of, draw_of, find_pool
from moot.eval.protocols import BASELINES, ProtocolRef, base_spec, fit_to_item, k_at_budget, parse_ref
from moot.eval.quality import QualitySection, quality_section
from moot.eval.scoring import score
from moot.eval.store import ItemResult, RunConfig, RunSession, RunStore
from moot.eval.variants import Variant, derive_variants
from moot.files import InputFileError
from moot.models.pricing import PriceTable
from moot.protocols.refs import ProtocolRefError
from moot.stats import (
    Z95,
    bonferroni_z,
    discordant,
    holm,
    paired_diff_ci,
    paired_items_needed,
    paired_test,
    tie_credit,
    wilson,
)

BUDGET_SLACK = 1.10


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


class ProtocolSummary(BaseModel):
    label: str
    baseline: bool
    k: int | None = None
    #: For a ``vote@auto``: the debate whose budget it matches (``ref=``, or the run's first debate).
    matched_to: str | None = None
    finished: int = 0
    failed: int = 0
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


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def summarise(run: RunStore | LoadedRun, prices: PriceTable | None = None) -> EvalReport:
    """The whole report of a run, from the run loaded once (:func:`moot.eval.loaded.load_run`; an
    open store is read once here)."""
    store = as_loaded(run)
    config = store.config
    items = {i.id: i for i in store.items()}
    summaries: list[ProtocolSummary] = []
    by_label: dict[str, dict[str, ItemResult]] = {}
    expected: dict[str, dict[str, float]] = {}
    refs = {label: parse_ref(label) for label in config.protocols}
    first_debate = next((label for label, r in refs.items() if not r.is_baseline), None)
    for label in config.protocols:
        ref = refs[label]
        results = {r.item_id: r for r in store.results(label)}
        by_label[label] = results
        rs = list(results.values())
        n = len(rs)
        correct = sum(r.correct for r in rs)
        lo, hi = wilson(correct, n)
        s = ProtocolSummary(
            label=label,
            baseline=ref.name in BASELINES,
            k=store.get_meta(f"auto_k:{label}") if ref.auto else ref.k,
            matched_to=(ref.reference or first_debate) if ref.auto else None,
            finished=n,
            failed=sum(r.status == "failed" for r in rs),
            correct=correct,
            accuracy=correct / n if n else 0.0,
            ci_low=lo,
            ci_high=hi,
            unextractable=sum(r.status == "ok" and r.extracted is None for r in rs),
            parse_failures=sum(r.parse_failures for r in rs),
            mean_calls=_mean([r.calls for r in rs]),
            mean_prompt_tokens=_mean([r.prompt_tokens for r in rs]),
            mean_completion_tokens=_mean([r.completion_tokens for r in rs]),
            mean_latency_s=_mean([r.latency_s for r in rs]),
            mean_cached_calls=_mean([r.cached_calls for r in rs]),
        )
        _dynamics(s, store, label, items)
        limits = {i: reasoning_limit(item.kind, _answer_form(ref)) for i, item in items.items()}
        s.turn_lengths = turn_lengths(store.transcripts(label), _turn_caps(ref, config, store, items), limits)
        expected[label] = expected_correctness(store, label, items, results)
        s.ties = sum(1 for t in store.transcripts(label).values() if (t.decision or {}).get("tie"))
        selections = [selection_of(t.decision) for t in store.transcripts(label).values()]
        if any(sel is not None for sel in selections):
            s.selection_fallbacks = sum(1 for sel in selections if sel is not None and sel.fallback is not None)
        s.expected_accuracy = _mean(list(expected[label].values())) if n else None
        summaries.append(s)
    single = next((s for s in summaries if s.label == "single"), None)
    pool = analyse_pool(store)
    # A debate on another draw of round 1 (first_seed=) gets the derived votes of its own draw's pool.
    pools: dict[int, PoolAnalysis | None] = {1: pool}
    for s in summaries:
        if not s.baseline and s.finished and (draw := draw_of(s.label)) not in pools:
            pool_label = find_pool(store, draw)
            pools[draw] = analyse_pool(store, pool_label) if pool_label is not None else None
    baselines: dict[str, tuple[str, dict[str, float]]] = {}
    for s in summaries:
        if single is not None and s is not single:
            s.improvement_over_single = _paired_gain(by_label[s.label], by_label["single"])
        if not s.baseline and s.finished:
            fair = _fair_comparisons(s, summaries, expected, pools[draw_of(s.label)], single)
            s.comparison = fair.primary
            s.other_comparisons = fair.others
            s.missing_baselines = fair.missing
            if fair.primary is not None:
                baselines[s.label] = (fair.primary.baseline, fair.primary_items)
    variants: list[Variant] = []
    for s in summaries:
        if s.baseline or not s.finished or not any(r.round > 1 for r in s.rounds):
            continue
        variants += derive_variants(
            s.label, store.transcripts(s.label), items, expected[s.label], baselines.get(s.label), s.mean_tokens,
        )  # fmt: skip
    # The Pareto front compares protocols and rules on the same items: those every protocol finished.
    finished = [set(by_label[s.label]) for s in summaries if s.finished]
    common = set.intersection(*finished) if finished else set()
    pareto: list[ParetoPoint] = []
    if common:
        on_common = [
            ParetoPoint(
                name=s.label,
                accuracy=statistics.fmean(float(by_label[s.label][i].correct) for i in common),
                mean_tokens=statistics.fmean(by_label[s.label][i].tokens for i in common),
            )
            for s in summaries
            if s.finished
        ]
        tokens_on_common = {p.name: p.mean_tokens for p in on_common}
        common_variants = [
            v
            for s in summaries
            if not s.baseline and s.finished and any(r.round > 1 for r in s.rounds)
            for v in derive_variants(
                s.label, store.transcripts(s.label), items, expected[s.label], None,
                tokens_on_common[s.label], only=common,
            )
        ]  # fmt: skip
        common_pool = analyse_pool(store, only=common) if pool is not None else None
        pareto = _pareto(on_common, common_pool, common_variants)
    firsts = first_round_votes(store, summaries)
    pairs = debate_pairs(summaries, expected, firsts)
    spreads = seed_spreads(summaries, pairs, firsts)
    return EvalReport(
        sessions=store.sessions(),
        seed_spreads=spreads,
        debate_pairs=pairs,
        config=config,
        items=len(items),
        generated_at=datetime.now(UTC).isoformat(timespec="seconds"),
        quality=quality_section(store, prices),
        protocols=summaries,
        pool=pool,
        variants=variants,
        pareto=pareto,
        pareto_items=len(common),
    )


def _answer_form(ref: ProtocolRef) -> AnswerForm | None:
    """The answer form of a protocol's turns (its reasoning's room), None when its spec cannot be
    rebuilt here or its turn is not of the answer family (then the brief form's is assumed)."""
    try:
        spec = base_spec(ref, k=1 if ref.auto or ref.uab_budget else None)
    except (OSError, ValueError, TypeError, ProtocolRefError, SpecError, InputFileError):
        return None
    name = spec.turn.schema_name if spec.turn is not None else None
    return ANSWER_FORMS.get(name) if name is not None else None


def _turn_caps(
    ref: ProtocolRef, config: RunConfig, store: LoadedRun, items: dict[str, EvalItem]
) -> tuple[dict[str, int], int | None, int | None]:
    """(cap per participant, the budget's cap, an LLM decision's cap) of a protocol as the run asked
    it (its spec fitted to an item); empty and None when the spec cannot be rebuilt here (a protocol
    file that is not at hand)."""
    item = next(iter(items.values()), None)
    try:
        k = store.get_meta(f"auto_k:{ref.label}") if ref.auto else None
        spec = base_spec(ref, k=int(k) if k is not None else (1 if ref.auto or ref.uab_budget else None))
        if item is not None:
            spec = fit_to_item(spec, item, max_tokens=ref.turn_tokens(config.max_tokens), timeout_s=config.timeout_s)
    except (OSError, ValueError, TypeError, ProtocolRefError, SpecError, InputFileError):
        return {}, None, None
    decision = getattr(spec.decision, "max_tokens", None)
    return (
        {p.id: spec.max_tokens_for(p) for p in spec.participants},
        spec.budget.max_tokens_per_turn,
        decision if isinstance(decision, int) else None,
    )


def _percentile(ordered: list[int], q: float) -> int:
    """The q-quantile of sorted values, the nearest rank's (a value some turn had)."""
    if not ordered:
        return 0
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def turn_lengths(
    transcripts: dict[str, DebateResult],
    caps: tuple[dict[str, int], int | None, int | None],
    limits: dict[str, int] | None = None,
) -> TurnLengths | None:
    """:class:`TurnLengths` of a protocol's transcripts (None: it has none). A turn is cut when its
    reply stopped at the limit. A turn with a self-check (CISC) stored before the engine recorded
    the reply's own finish_reason carries the check's one-token ``length``: for such a turn the cut
    is read from its reply's tokens reaching the cap instead."""
    per_participant, budget, decision_cap = caps
    lengths: list[int] = []
    cut = at_limit = 0
    for item_id, result in transcripts.items():
        limit = (limits or {}).get(item_id)
        for turn in [*result.turns(), *result.decision_turns]:
            if turn.carried or turn.calls == 0:
                continue
            check = turn.probe_usage.completion_tokens if turn.probe_usage is not None else 0
            tokens = turn.usage.completion_tokens - check
            lengths.append(tokens)
            reasons = [v for k, v in (turn.parsed or {}).items() if k in ("reasoning", "rationale")]
            at_limit += limit is not None and any(isinstance(v, str) and len(v) >= limit for v in reasons)
            if turn.finish_reason != "length":
                continue
            if turn.probe_usage is not None and turn.probe_usage.completion_tokens:
                cap = decision_cap if turn.kind == "decision" else per_participant.get(turn.speaker, budget)
                cut += cap is not None and tokens >= cap
            else:
                cut += 1
    if not lengths:
        return None
    ordered = sorted(lengths)
    debate_caps = set(per_participant.values()) or ({budget} if budget is not None else set())
    known = {limit for item_id, limit in (limits or {}).items() if item_id in transcripts}
    return TurnLengths(
        turns=len(ordered), cap=max(debate_caps) if debate_caps else None, cut=cut,
        reasoning_limit=max(known) if known else None, at_reasoning_limit=at_limit,
        p50=_percentile(ordered, 0.5), p90=_percentile(ordered, 0.9), p95=_percentile(ordered, 0.95),
        p98=_percentile(ordered, 0.98), p99=_percentile(ordered, 0.99), max=ordered[-1],
    )  # fmt: skip


def _round_one(result: DebateResult) -> list[str | None]:
    return [answer_of(t) for t in result.rounds[0].turns] if result.rounds else []


def first_round_votes(store: LoadedRun, summaries: list[ProtocolSummary]) -> dict[str, str]:
    """Each debate whose first round is a plain vote of the run: ``vote@K`` of its draw of round 1
    (``first_seed``; K its first round's agents), with the same answers, agent for agent, on every
    item both finished: checked on the transcripts, not assumed from the labels (a debate at another
    temperature, with other models or personas, has another first round)."""
    out: dict[str, str] = {}
    for d in summaries:
        if d.baseline or not d.finished:
            continue
        mine = store.transcripts(d.label)
        k = next((len(r.rounds[0].turns) for r in mine.values() if r.rounds), 0)
        vote = _plain_vote(summaries, k, draw_of(d.label))
        if vote is None:
            continue
        theirs = store.transcripts(vote.label)
        common = set(mine) & set(theirs)
        if common and all(_round_one(mine[i]) == _round_one(theirs[i]) for i in common):
            out[d.label] = vote.label
    return out


def _plain_vote(summaries: list[ProtocolSummary], k: int, draw: int) -> ProtocolSummary | None:
    """The run's finished plain ``vote@k`` of a draw of round 1 (``vote@k`` or ``vote@k(first_seed=S)``)."""
    for b in summaries:
        ref = parse_ref(b.label)
        if (b.finished and ref.name == "vote" and b.k == k and ref.auto is None
                and set(ref.params) <= {"first_seed"} and draw_of(b.label) == draw):  # fmt: skip
            return b
    return None


def debate_pairs(
    summaries: list[ProtocolSummary], expected: dict[str, dict[str, float]], firsts: dict[str, str] | None = None
) -> list[DebatePair]:
    """Every finished debate against ``single`` and the vote of its own first round (``firsts``:
    :func:`first_round_votes`; when the run has them) and against each debate listed after it, in the
    run's order: the ablations' and the debates' own differences (against that vote: what the later
    rounds add to the first)."""
    debates = [s.label for s in summaries if not s.baseline and s.finished and s.label in expected]
    pairs: list[DebatePair] = []
    for i, debate in enumerate(debates):
        first = (firsts or {}).get(debate)
        anchors = [a for a in ("single", first) if a is not None and expected.get(a)]
        for against in anchors + debates[i + 1 :]:
            t = paired_test(expected[against], expected[debate])
            if t.n:
                pairs.append(DebatePair(protocol=debate, against=against, items=t.n, diff=t.diff, ci_low=t.ci_low,
                                        ci_high=t.ci_high))  # fmt: skip
    return pairs


#: The seed spreads' row for a debate against the vote of its own first round (:func:`first_round_votes`).
FIRST_ROUND = "its first round's vote"


def seed_spreads(
    summaries: list[ProtocolSummary], pairs: list[DebatePair] | None = None, firsts: dict[str, str] | None = None
) -> list[SeedSpread]:
    """For each debate run on two or more draws of round 1 (the same protocol but for ``first_seed``),
    and each kind of budget-matched vote, the paired difference on every draw and its spread; with
    ``pairs`` (:func:`debate_pairs`) and ``firsts`` (:func:`first_round_votes`), also against the
    vote of its own first round."""
    firsts = firsts or {}
    against_first = {(p.protocol, p.against): p for p in pairs or []}
    groups: dict[str, list[tuple[int, ProtocolSummary]]] = {}
    for s in summaries:
        ref = parse_ref(s.label)
        if s.baseline or ref.is_file:
            continue
        rest = {k: v for k, v in ref.params.items() if k != "first_seed"}
        # The group's name: the debate's label but for its draw (society-of-minds(exchange=answer)).
        key = ref.name + (f"({','.join(f'{k}={v}' for k, v in sorted(rest.items()))})" if rest else "")
        groups.setdefault(key, []).append((int(ref.params.get("first_seed", 1)), s))
    out: list[SeedSpread] = []
    for name, members in groups.items():
        if len(members) < 2:
            continue
        by_kind: dict[str, list[tuple[int, float, float, float, int]]] = {}
        for seed, s in sorted(members, key=lambda m: m[0]):
            for c in [s.comparison, *s.other_comparisons]:
                if c is not None and c.kind in ("equal-calls vote", "equal-tokens vote"):
                    by_kind.setdefault(c.kind, []).append((seed, c.diff, c.ci_low, c.ci_high, c.paired))
            first = against_first.get((s.label, firsts.get(s.label, "")))
            if first is not None:
                by_kind.setdefault(FIRST_ROUND, []).append((seed, first.diff, first.ci_low, first.ci_high, first.items))
        for kind, draws in by_kind.items():
            if len(draws) < 2:
                continue
            diffs = [d[1] for d in draws]
            out.append(SeedSpread(protocol=name, kind=kind, draws=draws,
                                  mean=statistics.fmean(diffs), sd=statistics.stdev(diffs), low=min(diffs),
                                  high=max(diffs)))  # fmt: skip
    return out


def _pareto(
    protocols: list[ParetoPoint], pool: PoolAnalysis | None, variants: list[Variant] | None = None
) -> list[ParetoPoint]:
    """The points no other beats on accuracy at equal or fewer tokens (all measured on one item set)."""
    points = list(protocols)
    points += [
        ParetoPoint(name=f"{v.protocol} / {v.variant}", accuracy=v.accuracy, mean_tokens=v.mean_tokens, derived=True)
        for v in variants or []
    ]
    if pool is not None:
        points += [
            ParetoPoint(name=f"{c.rule}@{c.k}", accuracy=c.accuracy, mean_tokens=c.mean_tokens, derived=True)
            for c in pool.curves
        ]
        points += [
            ParetoPoint(name=f"adaptive-consistency({a.threshold:g})", accuracy=a.accuracy, mean_tokens=a.mean_tokens,
                        derived=True)
            for a in pool.adaptive
        ]  # fmt: skip
        points += [
            ParetoPoint(name=f"uab@{a.budget}", accuracy=a.accuracy, mean_tokens=a.mean_tokens, derived=True)
            for a in pool.allocation
        ]
    seen: set[tuple[float, float]] = set()
    unique = []
    for p in points:  # the same accuracy at the same tokens: the first named (a protocol before its variants)
        if (p.accuracy, p.mean_tokens) not in seen:
            seen.add((p.accuracy, p.mean_tokens))
            unique.append(p)
    points = unique
    front = [
        p
        for p in points
        if not any(
            (q.accuracy >= p.accuracy and q.mean_tokens < p.mean_tokens)
            or (q.accuracy > p.accuracy and q.mean_tokens <= p.mean_tokens)
            for q in points
        )
    ]
    return sorted(front, key=lambda p: p.mean_tokens)


def _correct(results: dict[str, ItemResult]) -> dict[str, bool]:
    return {i: r.correct for i, r in results.items()}


def _paired_gain(results: dict[str, ItemResult], single: dict[str, ItemResult]) -> float | None:
    """Seed 004's improvement over a single agent, on the items both finished (None without any)."""
    only_single, only_this, n = discordant(_correct(single), _correct(results))
    return paired_diff_ci(only_single, only_this, n)[0] if n else None


def _dynamics(s: ProtocolSummary, store: LoadedRun, label: str, items: dict[str, EvalItem]) -> None:
    per_round: dict[int, list[tuple[float | None, bool | None]]] = {}
    r2w = w2r = 0
    flips_known = False
    confidences: list[float] = []
    consensus: list[bool] = []
    stated: list[tuple[float, bool]] = []
    unanimous_wrong: int | None = None
    outvoted: int | None = None
    adopted: int | None = None
    for item_id, result in store.transcripts(label).items():
        item = items.get(item_id)
        if item is None:
            continue
        for turn in result.turns():
            answer, conf = answer_of(turn), confidence_of(turn)
            if answer is not None and conf is not None and not turn.carried:
                stated.append((min(1.0, max(0.0, conf)), score(item, answer).correct))
        decision = result.decision or {}
        conf = decision.get("confidence", decision.get("share"))
        if isinstance(conf, int | float) and not isinstance(conf, bool):
            confidences.append(float(conf))
        for before, after in zip(result.rounds, result.rounds[1:], strict=False):
            held = {t.speaker: answer_of(t) for t in before.turns}
            for t in after.turns:
                mine, peers = held.get(t.speaker), [a for sp, a in held.items() if sp != t.speaker]
                if t.carried or mine is None or len(peers) < 2 or None in peers or len(set(peers)) != 1:
                    continue
                if peers[0] != mine:
                    outvoted = (outvoted or 0) + 1
                    adopted = (adopted or 0) + (answer_of(t) == peers[0])
        dyn = result.dynamics
        if dyn is None:
            continue
        typed = [rd for rd in dyn.rounds if rd.majority is not None]
        # flips are changes between rounds: a one-round protocol (a vote) has none to count
        if len(dyn.rounds) > 1 and dyn.right_to_wrong is not None and dyn.wrong_to_right is not None:
            r2w += dyn.right_to_wrong
            w2r += dyn.wrong_to_right
            flips_known = True
        if typed:
            consensus.append(typed[-1].agreement == 1.0)
            first = typed[0]
            if first.round == 1 and len(result.rounds[0].turns) > 1:
                wrong_first = first.agreement == 1.0 and not score(item, first.majority).correct
                unanimous_wrong = (unanimous_wrong or 0) + wrong_first
        for rd in typed:
            right = score(item, rd.majority).correct
            per_round.setdefault(rd.round, []).append((rd.agreement, right))
    s.rounds = [
        RoundStat(
            round=r,
            debates=len(vals),
            agreement=_mean([a for a, _ in vals if a is not None]),
            majority_accuracy=_mean([float(bool(c)) for _, c in vals]),
        )
        for r, vals in sorted(per_round.items())
    ]
    if flips_known:
        s.right_to_wrong, s.wrong_to_right = r2w, w2r
    s.unanimous_wrong_first = unanimous_wrong
    s.outvoted, s.adopted_peers = outvoted, (adopted or 0) if outvoted else None
    s.decision_confidence = _mean(confidences) if confidences else None
    s.consensus_rate = _mean([float(c) for c in consensus]) if consensus else None
    if stated:
        cal = calibration_of("stated", stated)
        s.stated_ece, s.stated_brier, s.stated_turns = cal.ece, cal.brier, cal.samples


def expected_correctness(
    store: LoadedRun, label: str, items: dict[str, EvalItem], results: dict[str, ItemResult]
) -> dict[str, float]:
    """Each item's correctness in expectation over tie-breaks: a decision that was a tie (a vote's,
    or trajectory scoring's) is credited by the share of its tied answers that are right."""
    return {item_id: value for item_id, (value, _) in tie_outcomes(store, label, items, results).items()}


def tie_outcomes(
    store: LoadedRun, label: str, items: dict[str, EvalItem], results: dict[str, ItemResult]
) -> dict[str, tuple[float, bool]]:
    """Each item's expected correctness over tie-breaks (:func:`expected_correctness`) and whether
    its decision was a tie, as the transcript's decision records it (a tie whose tied answers are
    all right, or all wrong, is still a tie)."""
    transcripts = store.transcripts(label)
    out: dict[str, tuple[float, bool]] = {}
    for item_id, r in results.items():
        value, tie = float(r.correct), False
        t = transcripts.get(item_id)
        decision = (t.decision or {}) if t is not None else {}
        tied = decision.get("tied")
        if r.status == "ok" and decision.get("tie") and isinstance(tied, list) and tied and item_id in items:
            right = {str(a): score(items[item_id], str(a)).correct for a in tied}
            value, tie = tie_credit([str(a) for a in tied], right), True
        out[item_id] = (value, tie)
    return out


def _baseline_key(s: ProtocolSummary) -> str:
    """What a baseline is, beyond its label: a vote is its sample count and parameters (vote@auto
    resolved to k = 6 is vote@6); anything else, or a vote whose k is not known, is its label."""
    ref = parse_ref(s.label)
    if ref.name != "vote" or s.k is None:
        return s.label
    return f"vote@{s.k}:{json.dumps(ref.params, sort_keys=True, default=str)}"


#: Adaptive-Consistency's threshold as its authors use it, fixed before any data is seen.
ADAPTIVE_THRESHOLD = 0.95


class _Fair(BaseModel):
    primary: Comparison | None = None
    primary_items: dict[str, float] = Field(default_factory=dict)
    others: list[Comparison] = Field(default_factory=list)
    missing: list[str] = Field(default_factory=list)


def _budget_vote(
    debate: ProtocolSummary,
    summaries: list[ProtocolSummary],
    expected: dict[str, dict[str, float]],
    pool: PoolAnalysis | None,
    k: int,
    by: str,
) -> tuple[str, dict[str, float], float, bool] | None:
    """The vote at ``k`` samples fixed by the debate's budget (``by`` calls or tokens): the run's
    ``vote@auto`` matched to this debate, else a plain ``vote@k`` of the run, else the pool's vote at
    k (derived from its k-subsets). (name, per-item expected correctness, mean tokens, derived)."""
    for b in summaries:
        ref = parse_ref(b.label)
        if b.finished and ref.auto == by and b.matched_to == debate.label:
            return b.label, expected[b.label], b.mean_tokens, False
    vote = _plain_vote(summaries, k, draw_of(debate.label))
    if vote is not None:
        return vote.label, expected[vote.label], vote.mean_tokens, False
    if pool is not None and k in pool.vote_per_item:
        return f"vote@{k} on {pool.pool}", pool.vote_per_item[k], k * pool.sample_tokens, True
    return None


def _fair_comparisons(
    debate: ProtocolSummary,
    summaries: list[ProtocolSummary],
    expected: dict[str, dict[str, float]],
    pool: PoolAnalysis | None,
    single: ProtocolSummary | None,
) -> _Fair:
    """A debate's baselines, fixed by its budget before any accuracy is looked at (see the module
    docstring), each paired with it on the items both have."""
    fair = _Fair()
    own = expected[debate.label]
    by = {s.label: s for s in summaries}
    # One comparison per baseline: vote@auto at k = 6 is vote@6 (the same spec, the same samples),
    # whichever kind of baseline it comes as.
    seen: set[str] = set()

    def key(name: str) -> str:
        return _baseline_key(by[name]) if name in by else name

    def add(name: str, items: dict[str, float], kind: str, tokens: float, derived: bool) -> Comparison | None:
        if key(name) in seen:
            return None
        seen.add(key(name))
        c = _paired(own, name, items, kind, tokens, derived)
        if c is not None:
            fair.others.append(c)
        return c

    k_calls = k_at_budget(debate.mean_calls)
    calls = _budget_vote(debate, summaries, expected, pool, k_calls, "calls")
    if calls is None:
        fair.missing.append(f"no vote at its {k_calls} calls: the run has no vote@{k_calls} and no pool that large")
    else:
        fair.primary = _paired(own, calls[0], calls[1], "equal-calls vote", calls[2], calls[3])
        fair.primary_items = calls[1]
        seen.add(key(calls[0]))
    per_sample = single.mean_tokens if single is not None and single.finished else (pool.sample_tokens if pool else 0)
    if per_sample:
        k_tokens = k_at_budget(debate.mean_tokens, per_sample)
        tokens = _budget_vote(debate, summaries, expected, pool, k_tokens, "tokens")
        if tokens is None:
            fair.missing.append(
                f"no vote at its tokens ({k_tokens} samples): add vote@auto(by=tokens, ref={debate.label}) to the run"
            )
        else:
            add(tokens[0], tokens[1], "equal-tokens vote", tokens[2], tokens[3])
    if pool is not None:
        ac = next((a for a in pool.adaptive if a.threshold == ADAPTIVE_THRESHOLD and a.per_item), None)
        if ac is not None and ac.mean_samples <= debate.mean_calls * BUDGET_SLACK:
            add(f"adaptive-consistency({ac.threshold:g}) on {pool.pool}", ac.per_item, "adaptive vote",
                ac.mean_tokens, True)  # fmt: skip
    # Can the debate match a dearer vote for at most 0.7x its tokens?
    for b in summaries:
        ref = parse_ref(b.label)
        if ref.name == "vote" and b.finished and debate.mean_tokens <= GOAL_TOKEN_SHARE * b.mean_tokens:
            add(b.label, expected[b.label], "dearer vote", b.mean_tokens, False)
    return fair


def _paired(
    own: dict[str, float], baseline: str, baseline_items: dict[str, float], kind: str, tokens: float, derived: bool
) -> Comparison | None:
    t = paired_test(baseline_items, own)
    if not t.n:
        return None
    both = own.keys() & baseline_items.keys()
    return Comparison(
        baseline=baseline, paired=t.n, diff=t.diff, ci_low=t.ci_low, ci_high=t.ci_high, p_value=t.p,
        only_debate_right=t.only_second, only_baseline_right=t.only_first, kind=kind, baseline_tokens=tokens,
        items_needed=paired_items_needed(t.differing / t.n, GOAL_POINTS), derived=derived,
        debate_ahead=sum(own[i] > baseline_items[i] for i in both),
        baseline_ahead=sum(own[i] < baseline_items[i] for i in both),
    )  # fmt: skip


#: The goal a protocol or rule must reach to pay: this many points over its equal-budget baseline with a
#: paired 95% interval above 0, or its baseline's accuracy (within this non-inferiority margin, and not
#: below it on the point estimate by more than half a point) at no more than this share of its tokens.
GOAL_POINTS = 0.02


NON_INFERIORITY = 0.02


GOAL_TOKEN_SHARE = 0.7


class Corrected(BaseModel):
    """One comparison of the goal's family, corrected for the family's size."""

    name: str
    diff: float
    share: float | None
    ci95_low: float
    ci95_high: float
    #: The Bonferroni interval (each of the m comparisons at 1 - 0.05/m) and Holm's p-value.
    low: float
    high: float
    p: float
    p_holm: float
    #: Reaches the goal by its gain (at least ``GOAL_POINTS``, the corrected interval above 0), or by
    #: its cost (its baseline's accuracy, low end at least ``-NON_INFERIORITY``, at no more than
    #: ``GOAL_TOKEN_SHARE`` of the tokens).
    beats: bool = False
    cheaper: bool = False


def corrected_family(rows: list[tuple[str, float, float, float, float | None]]) -> list[Corrected]:
    """(name, difference, 95% low, 95% high, token share) rows, corrected as one family: every
    interval here is its centre plus or minus z times a standard error (Agresti-Min's, or the same
    over fractional credits), so the standard error is read back from the 95% interval, the
    p-value from it, and the interval widened to the Bonferroni level."""
    z_m = bonferroni_z(len(rows))

    out: list[Corrected] = []
    for name, diff, lo, hi, share in rows:
        centre, se = (lo + hi) / 2, (hi - lo) / (2 * Z95)
        p = 1.0 if se <= 0 else min(1.0, 2 * (1 - NormalDist().cdf(abs(centre) / se)))
        low, high = max(-1.0, centre - z_m * se), min(1.0, centre + z_m * se)
        out.append(Corrected(name=name, diff=diff, share=share, ci95_low=lo, ci95_high=hi, low=low, high=high, p=p,
                             p_holm=p))  # fmt: skip
    for c, adjusted in zip(out, holm([c.p for c in out]), strict=True):
        c.p_holm = adjusted
    return out


class Goal(BaseModel):
    """The goal's family: every paired comparison of a run (protocols against their baselines, each
    debate's re-decisions against its baseline, the pool's rules against the vote on the same
    samples), corrected as one family, and which of them reach the goal."""

    comparisons: list[Corrected]
    #: Per protocol comparison: the items a paired test needs to see a true ``GOAL_POINTS`` gain.
    items_needed: list[int] = Field(default_factory=list)
    #: The most items any protocol comparison paired.
    paired: int = 0


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
        f.beats = f.diff >= GOAL_POINTS and f.low > 0
        f.cheaper = (
            f.share is not None and f.share <= GOAL_TOKEN_SHARE and f.diff >= -0.005 and f.low >= -NON_INFERIORITY
        )
    return Goal(
        comparisons=family,
        items_needed=sorted(needed),
        paired=paired,
    )
