"""``moot eval report``: what each protocol bought, at what cost, as Markdown and as HTML.

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
Bonferroni intervals).
Dynamics come from the transcripts: agreement and majority accuracy per round, and the flips
(an agent moving from the right answer to a wrong one, or back) counted against the gold answer.
"""

from __future__ import annotations

import base64
import html
import io
import json
import statistics
from datetime import UTC, datetime
from pathlib import Path
from statistics import NormalDist
from typing import Any

from pydantic import BaseModel, Field

from moot.core.answers import answer_of, confidence_of
from moot.eval.items import EvalItem
from moot.eval.pool import UAB_ORDERS, PoolAnalysis, analyse_pool, calibration_of
from moot.eval.protocols import BASELINES, parse_ref
from moot.eval.quality import QualitySection, quality_section, render_quality_html, render_quality_markdown
from moot.eval.scoring import score
from moot.eval.stats import (
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
from moot.eval.store import ItemResult, RunConfig, RunStore
from moot.eval.variants import Variant, derive_variants
from moot.models.pricing import PriceTable

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
    unextractable: int = 0
    parse_failures: int = 0
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


class EvalReport(BaseModel):
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


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def summarise(store: RunStore, prices: PriceTable | None = None) -> EvalReport:
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
        expected[label] = expected_correctness(store, label, items, results)
        s.ties = sum(1 for t in store.transcripts(label).values() if (t.decision or {}).get("tie"))
        s.expected_accuracy = _mean(list(expected[label].values())) if n else None
        summaries.append(s)
    single = next((s for s in summaries if s.label == "single"), None)
    pool = analyse_pool(store)
    baselines: dict[str, tuple[str, dict[str, float]]] = {}
    for s in summaries:
        if single is not None and s is not single:
            s.improvement_over_single = _paired_gain(by_label[s.label], by_label["single"])
        if not s.baseline and s.finished:
            fair = _fair_comparisons(s, summaries, expected, pool, single)
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
    spreads = seed_spreads(summaries)
    return EvalReport(
        seed_spreads=spreads,
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


def seed_spreads(summaries: list[ProtocolSummary]) -> list[SeedSpread]:
    """For each debate run on two or more draws of round 1 (the same protocol but for ``first_seed``),
    and each kind of budget-matched vote, the paired difference on every draw and its spread."""
    groups: dict[str, list[tuple[int, ProtocolSummary]]] = {}
    for s in summaries:
        ref = parse_ref(s.label)
        if s.baseline or ref.is_file:
            continue
        rest = {k: v for k, v in ref.params.items() if k != "first_seed"}
        key = ref.name + (json.dumps(rest, sort_keys=True) if rest else "")
        groups.setdefault(key, []).append((int(ref.params.get("first_seed", 1)), s))
    out: list[SeedSpread] = []
    for members in groups.values():
        if len(members) < 2:
            continue
        by_kind: dict[str, list[tuple[int, float, float, float, int]]] = {}
        for seed, s in sorted(members, key=lambda m: m[0]):
            for c in [s.comparison, *s.other_comparisons]:
                if c is not None and c.kind in ("equal-calls vote", "equal-tokens vote"):
                    by_kind.setdefault(c.kind, []).append((seed, c.diff, c.ci_low, c.ci_high, c.paired))
        for kind, draws in by_kind.items():
            if len(draws) < 2:
                continue
            diffs = [d[1] for d in draws]
            out.append(SeedSpread(protocol=parse_ref(members[0][1].label).name, kind=kind, draws=draws,
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


def _dynamics(s: ProtocolSummary, store: RunStore, label: str, items: dict[str, EvalItem]) -> None:
    per_round: dict[int, list[tuple[float | None, bool | None]]] = {}
    r2w = w2r = 0
    flips_known = False
    confidences: list[float] = []
    consensus: list[bool] = []
    stated: list[tuple[float, bool]] = []
    unanimous_wrong: int | None = None
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
    s.decision_confidence = _mean(confidences) if confidences else None
    s.consensus_rate = _mean([float(c) for c in consensus]) if consensus else None
    if stated:
        cal = calibration_of("stated", stated)
        s.stated_ece, s.stated_brier, s.stated_turns = cal.ece, cal.brier, cal.samples


def expected_correctness(
    store: RunStore, label: str, items: dict[str, EvalItem], results: dict[str, ItemResult]
) -> dict[str, float]:
    """Each item's correctness in expectation over tie-breaks: a decision that was a tie (a vote's,
    or trajectory scoring's) is credited by the share of its tied answers that are right."""
    transcripts = store.transcripts(label)
    out: dict[str, float] = {}
    for item_id, r in results.items():
        value = float(r.correct)
        t = transcripts.get(item_id)
        decision = (t.decision or {}) if t is not None else {}
        tied = decision.get("tied")
        if r.status == "ok" and decision.get("tie") and isinstance(tied, list) and tied and item_id in items:
            right = {str(a): score(items[item_id], str(a)).correct for a in tied}
            value = tie_credit([str(a) for a in tied], right)
        out[item_id] = value
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


def _half_up(x: float) -> int:
    # Half up, not Python's half to even: 4.5 calls are matched by a vote of 5, as vote@auto is.
    return max(1, int(x + 0.5))


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
    draw = parse_ref(debate.label).params.get("first_seed", 1)
    for b in summaries:
        ref = parse_ref(b.label)
        same_draw = set(ref.params) <= {"first_seed"} and ref.params.get("first_seed", 1) == draw
        if b.finished and ref.name == "vote" and same_draw and b.k == k and ref.auto is None:
            return b.label, expected[b.label], b.mean_tokens, False
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

    k_calls = _half_up(debate.mean_calls)
    calls = _budget_vote(debate, summaries, expected, pool, k_calls, "calls")
    if calls is None:
        fair.missing.append(f"no vote at its {k_calls} calls: the run has no vote@{k_calls} and no pool that large")
    else:
        fair.primary = _paired(own, calls[0], calls[1], "equal-calls vote", calls[2], calls[3])
        fair.primary_items = calls[1]
        seen.add(key(calls[0]))
    per_sample = single.mean_tokens if single is not None and single.finished else (pool.sample_tokens if pool else 0)
    if per_sample:
        k_tokens = _half_up(debate.mean_tokens / per_sample)
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
    return Comparison(
        baseline=baseline, paired=t.n, diff=t.diff, ci_low=t.ci_low, ci_high=t.ci_high, p_value=t.p,
        only_debate_right=t.only_second, only_baseline_right=t.only_first, kind=kind, baseline_tokens=tokens,
        items_needed=paired_items_needed(t.differing / t.n, GOAL_POINTS), derived=derived,
    )  # fmt: skip


# ------------------------------------------------------------------------------------- plots


def plots(report: EvalReport) -> dict[str, bytes]:
    """PNG figures: accuracy vs tokens (Pareto), accuracy by round, flips. Empty without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}
    out: dict[str, bytes] = {}
    done = [s for s in report.protocols if s.finished]
    palette = plt.get_cmap("tab10")
    # one colour per protocol, the same in every figure
    colour = {s.label: palette(i % 10) for i, s in enumerate(report.protocols)}

    def png(fig: Any) -> bytes:
        buf = io.BytesIO()
        fig.tight_layout()
        fig.savefig(buf, format="png", dpi=110)
        plt.close(fig)
        return buf.getvalue()

    if done:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for s in done:
            x, y = s.mean_tokens, s.accuracy
            # a legend, not labels on the points: protocols at equal budget sit on top of each other
            # clamped: at 0% or 100% float rounding can put the Wilson bound a hair past the point
            err = [[max(0.0, y - s.ci_low)], [max(0.0, s.ci_high - y)]]
            ax.errorbar([x], [y], yerr=err, fmt="s" if s.baseline else "o", capsize=3, color=colour[s.label],
                        label=s.label)  # fmt: skip
        ax.legend(fontsize=8, loc="best")
        if all(s.mean_tokens > 0 for s in done):  # a protocol whose every item failed spent no token
            ax.set_xscale("log")
            ax.set_xlabel("mean tokens per item (prompt + completion, log scale)")
        else:
            ax.set_xlabel("mean tokens per item (prompt + completion)")
        ax.set_ylabel("accuracy (95% Wilson interval)")
        ax.set_title("Accuracy against cost (squares: baselines, circles: debates)", fontsize=10)
        ax.grid(alpha=0.3)
        out["pareto.png"] = png(fig)
    multi = [s for s in done if len(s.rounds) > 1]
    if multi:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(8.4, 3.6))
        for s in multi:
            rounds = [r.round for r in s.rounds]
            a1.plot(rounds, [r.majority_accuracy for r in s.rounds], marker="o", label=s.label, color=colour[s.label])
            a2.plot(rounds, [r.agreement for r in s.rounds], marker="o", label=s.label, color=colour[s.label])
        a1.set_title("majority accuracy by round", fontsize=10)
        a2.set_title("agreement by round", fontsize=10)
        for a in (a1, a2):
            a.set_xlabel("round")
            a.grid(alpha=0.3)
            a.set_xticks(sorted({r.round for s in multi for r in s.rounds}))
        a1.legend(fontsize=8)
        out["rounds.png"] = png(fig)
    flips = [s for s in done if s.right_to_wrong is not None and len(s.rounds) > 1]
    if flips:
        fig, ax = plt.subplots(figsize=(6.4, 3.6))
        xs = range(len(flips))
        ax.bar([x - 0.2 for x in xs], [s.wrong_to_right or 0 for s in flips], width=0.4, label="wrong → right",
               color="#2b8a3e")  # fmt: skip
        ax.bar([x + 0.2 for x in xs], [s.right_to_wrong or 0 for s in flips], width=0.4, label="right → wrong",
               color="#c92a2a")  # fmt: skip
        ax.set_xticks(list(xs), [s.label for s in flips], fontsize=8)
        ax.set_ylabel("agent answer changes")
        ax.set_title("Flips between rounds, against the gold answer", fontsize=10)
        ax.legend(fontsize=8)
        out["flips.png"] = png(fig)
    return out


# ------------------------------------------------------------------------------------ render


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def _signed_pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:+.1f}"


def _rows(report: EvalReport) -> tuple[list[str], list[list[str]]]:
    head = ["protocol", "accuracy [95% CI]", "expected over tie-breaks (ties)", "completed", "failed",
            "unextractable", "calls/item", "prompt tok/item", "completion tok/item",
            "latency/item in this run (cache hits take 0 s)", "parse failures"]  # fmt: skip
    rows = []
    for s in report.protocols:
        name = s.label + (f" (k={s.k})" if s.k and "auto" in s.label else "")
        rows.append([
            name, f"{_pct(s.accuracy)} [{_pct(s.ci_low)}, {_pct(s.ci_high)}]" if s.finished else "– (none finished)",
            f"{_pct(s.expected_accuracy)} ({s.ties})" if s.expected_accuracy is not None else "–",
            f"{s.finished - s.failed}/{report.items}",
            str(s.failed), str(s.unextractable), f"{s.mean_calls:.2f}", f"{s.mean_prompt_tokens:.0f}",
            f"{s.mean_completion_tokens:.0f}", f"{s.mean_latency_s:.1f} s", str(s.parse_failures),
        ])  # fmt: skip
    return head, rows


def _comparison_rows(report: EvalReport) -> tuple[list[str], list[list[str]]]:
    head = ["debate", "vs baseline", "kind", "tokens vs baseline", "paired items", "difference (points) [95% CI]",
            "only debate right / only baseline right", "p", "items for 80% power at +2 points"]  # fmt: skip
    rows = []
    for s in report.protocols:
        if s.baseline:
            continue
        for why in s.missing_baselines:
            rows.append([s.label, why, "–", "–", "–", "–", "–", "–", "–"])
        for c in ([s.comparison] if s.comparison is not None else []) + s.other_comparisons:
            share = f"{s.mean_tokens / c.baseline_tokens:.2f}x" if c.baseline_tokens else "–"
            rows.append([
                s.label, c.baseline + (" (derived)" if c.derived else ""), c.kind, share, str(c.paired),
                f"{_signed_pct(c.diff)} [{_signed_pct(c.ci_low)}, {_signed_pct(c.ci_high)}]",
                f"{c.only_debate_right} / {c.only_baseline_right}", f"{c.p_value:.3f}",
                f"{c.items_needed:,}" if c.items_needed is not None else "–",
            ])  # fmt: skip
    return head, rows


def _seed_rows(report: EvalReport) -> tuple[list[str], list[list[str]]]:
    head = ["debate", "against", "difference by draw (first seed: points [95% CI])", "mean", "SD", "range"]
    rows = [
        [sp.protocol, sp.kind,
         "; ".join(f"{seed}: {_signed_pct(d)} [{_signed_pct(lo)}, {_signed_pct(hi)}]"
                   for seed, d, lo, hi, _ in sp.draws),
         _signed_pct(sp.mean), f"{100 * sp.sd:.1f}", f"{_signed_pct(sp.low)} to {_signed_pct(sp.high)}"]
        for sp in report.seed_spreads
    ]  # fmt: skip
    return head, rows


def _dynamics_rows(report: EvalReport) -> tuple[list[str], list[list[str]]]:
    head = ["protocol", "majority accuracy by round", "agreement by round", "wrong → right", "right → wrong",
            "decision confidence", "consensus rate", "vs single, paired (points)",
            "stated confidence: ECE / Brier (turns)", "calls from the cache/item",
            "first round unanimous and wrong"]  # fmt: skip
    rows = []
    for s in report.protocols:
        rows.append([
            s.label,
            " → ".join(_pct(r.majority_accuracy) for r in s.rounds) or "–",
            " → ".join(_pct(r.agreement) for r in s.rounds) or "–",
            "–" if s.wrong_to_right is None else str(s.wrong_to_right),
            "–" if s.right_to_wrong is None else str(s.right_to_wrong),
            "–" if s.decision_confidence is None else f"{s.decision_confidence:.2f}",
            _pct(s.consensus_rate),
            _signed_pct(s.improvement_over_single),
            "–" if s.stated_ece is None else f"{s.stated_ece:.3f} / {s.stated_brier:.3f} ({s.stated_turns})",
            f"{s.mean_cached_calls:.2f}",
            "–" if s.unanimous_wrong_first is None else str(s.unanimous_wrong_first),
        ])  # fmt: skip
    return head, rows


Section = tuple[str, str, tuple[list[str], list[list[str]]] | None]


def _ci(lo: float | None, hi: float | None) -> str:
    return "–" if lo is None or hi is None else f"[{_signed_pct(lo)}, {_signed_pct(hi)}]"


def _pool_sections(report: EvalReport) -> list[Section]:
    """(title, text, table) of everything derived from the run's pool of samples."""
    pool = report.pool
    if pool is None:
        return []
    out: list[Section] = []
    intro = (
        f"Every rule below is derived from the same {pool.k} samples per item of `{pool.pool}` ({pool.items} "
        f"items), at no new calls. Accuracies at k < {pool.k} average {pool.draws} random subsets of k samples "
        "per item (all subsets when there are fewer); differences are paired per item over the same subsets, "
        "with a 95% interval over items (adjusted as Agresti and Min adjust paired proportions, so that items that "
        "all agree do not give an interval of zero width). Softmax temperatures are fitted per tenth of the "
        "items on the other nine tenths, never on the items scored."
    )
    disc = (
        ["signal", "(right, wrong) pairs", "items with a pair", "right one more confident [95% CI]"],
        [
            [d.signal, str(d.pairs), str(d.items),
             "–" if d.wqd is None else f"{_pct(d.wqd)} [{_pct(d.ci_low)}, {_pct(d.ci_high)}]"]
            for d in pool.discrimination
        ],
    )  # fmt: skip
    out.append(("Derived from one pool of samples", intro, None))
    out.append((
        "Can a confidence weight beat the vote? (the pilot)",
        "Over pairs of samples of one item where exactly one is right: how often the right one has the higher "
        "signal (ties count half). At 50% no weighting can beat the vote.",
        disc,
    ))  # fmt: skip
    c = pool.ceiling
    out.append((
        "The ceiling of any re-weighting",
        f"Of {c.items} items, the right answer is in the pool on {c.right_in_pool}; the plurality is right on "
        f"{c.plurality_right}. Re-weighting can only help on the {c.plurality_wrong_right_in_pool} items "
        f"({_pct(c.plurality_wrong_right_in_pool / c.items if c.items else 0)}) whose plurality is wrong while the "
        f"right answer is in the pool. {c.unanimous_wrong} {'item is' if c.unanimous_wrong == 1 else 'items are'} "
        f"unanimous and wrong; {c.no_right_answer} {'has' if c.no_right_answer == 1 else 'have'} no right answer at "
        "all: no decision rule reaches those.",
        None,
    ))  # fmt: skip
    rules = sorted({cv.rule for cv in pool.curves}, key=lambda r: (r != "vote", r))
    by = {(cv.rule, cv.k): cv for cv in pool.curves}
    head = ["k"] + [f"{r} accuracy" + ("" if r == "vote" else " (vs vote) [95% CI]") for r in rules]
    rows = []
    for k in range(1, pool.k + 1):
        row = [str(k)]
        for r in rules:
            cv = by[(r, k)]
            cell = _pct(cv.accuracy)
            if r != "vote":
                cell += f" ({_signed_pct(cv.diff_vs_vote)}) {_ci(cv.ci_low, cv.ci_high)}"
            row.append(cell)
        rows.append(row)
    fitted = "; ".join(f"{f.signal}: median T = {f.median:g} (folds: {', '.join(f'{t:g}' for t in f.per_fold)})"
                       for f in pool.fitted)  # fmt: skip
    out.append((
        "Weighted votes against the plain vote, by samples",
        "CISC is `weighted:p_true` (one self-check call per sample, counted in its cost). `answer_prob` is the "
        "probability of the answer's tokens and `seq_prob` that of the whole reply, both read from the sample "
        f"itself at no cost; `stated` is the confidence the model wrote. Fitted temperatures: {fitted}.",
        (head, rows),
    ))  # fmt: skip
    cost_rows = [
        [f"{r}@{k}", f"{by[(r, k)].mean_calls:g}", f"{by[(r, k)].mean_tokens:.0f}", _pct(by[(r, k)].accuracy)]
        for r in rules if r in ("vote", "weighted:p_true") for k in range(1, pool.k + 1)
    ]  # fmt: skip
    out.append(("Cost of the pool's rules", "Mean calls and tokens per item of k samples (CISC adds its checks).",
                (["rule", "calls/item", "tokens/item", "accuracy"], cost_rows)))  # fmt: skip
    ad_rows = [
        [f"{a.threshold:g}", _pct(a.accuracy), f"{a.mean_samples:.2f}", f"{a.mean_tokens:.0f}",
         f"{_signed_pct(a.diff_vs_full_vote)} {_ci(a.ci_low, a.ci_high)}"]
        for a in pool.adaptive
    ]  # fmt: skip
    out.append((
        "Adaptive-Consistency (samples drawn until the leading answer is settled)",
        f"Aggarwal et al.'s Beta stopping rule over the pool's samples in order, at most {pool.k}.",
        (["stop at P(mode)", "accuracy", "samples/item", "tokens/item", f"vs vote@{pool.k} [95% CI]"], ad_rows),
    ))  # fmt: skip
    if pool.allocation:
        al_rows = [
            [str(a.budget), _pct(a.vote_accuracy), _pct(a.accuracy),
             f"{_signed_pct(a.diff_vs_vote)} {_ci(a.ci_low, a.ci_high)}",
             f"{a.vote_mean_tokens:.0f} / {a.mean_tokens:.0f}", str(a.max_samples), str(a.capped)]
            for a in pool.allocation
        ]  # fmt: skip
        out.append((
            "A fixed budget moved between items (UAB) against the uniform vote",
            "Same total samples: the uniform vote gives every item b; UAB gives each one sample, rates its "
            "difficulty by that sample's mean negative log-likelihood (p = exp(-ANLL/0.2)), and hands the rest "
            "out one at a time to the item with the largest p(1-p)^n. Both read the same random orders of each "
            f"item's pool ({UAB_ORDERS} orders); an item can get at most the {pool.k} samples its pool holds "
            "(`capped` counts the times one was passed over for that).",
            (["samples/item b", "vote@b", "UAB", "UAB vs vote [95% CI]", "tokens/item vote / UAB",
              "most samples to one item", "capped"], al_rows),
        ))  # fmt: skip
    cal_rows = [
        [c.signal, str(c.samples), f"{c.mean_confidence:.3f}", _pct(c.accuracy), f"{c.ece:.3f}", f"{c.brier:.3f}"]
        for c in pool.calibration
    ]
    out.append((
        "Calibration of the confidence signals (per sample)",
        "Expected calibration error over 10 equal-width bins and Brier score, each sample's answer scored.",
        (["signal", "samples", "mean confidence", "accuracy", "ECE", "Brier"], cal_rows),
    ))  # fmt: skip
    return out


def _variant_section(report: EvalReport) -> list[Section]:
    if not report.variants:
        return []
    rows = [
        [v.protocol, v.variant, f"{_pct(v.accuracy)} ({v.decided}/{v.items} decided)",
         f"{_signed_pct(v.diff_vs_protocol)} {_ci(v.ci_low, v.ci_high)}",
         "–" if v.baseline is None else
         f"{_signed_pct(v.diff_vs_baseline)} {_ci(v.baseline_ci_low, v.baseline_ci_high)} vs {v.baseline} "
         f"(p = {v.baseline_p_value:.2f})"]
        for v in report.variants
    ]  # fmt: skip
    return [(
        "Decision variants of each debate (no new calls)",
        "Each debate re-decided by other rules over its own transcript (one that stopped after round 1, by that "
        "round): the same calls, "
        "so the same budget. Paired with the debate's own decision and with its equal-budget baseline; an item a "
        "variant cannot decide (no typed answer, no confidence, no log-probabilities) counts as wrong.",
        (["protocol", "variant", "accuracy", "vs its own decision [95% CI]", "vs the equal-budget baseline"], rows),
    )]  # fmt: skip


def _pareto_rows(report: EvalReport) -> tuple[list[str], list[list[str]]]:
    return (
        ["protocol or derived rule", "accuracy", "tokens/item"],
        [
            [p.name + (" (derived)" if p.derived else ""), _pct(p.accuracy), f"{p.mean_tokens:.0f}"]
            for p in report.pareto
        ],
    )


def _md_table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _verdicts(report: EvalReport) -> list[str]:
    out = []
    for s in report.protocols:
        c = s.comparison
        if c is None:
            continue
        if c.p_value < 0.05:
            word = "beats" if c.diff > 0 else "loses to"
            out.append(f"- **{s.label}** {word} {c.baseline} (the vote at its calls) by {abs(100 * c.diff):.1f} "
                       f"points (p = {c.p_value:.3f}, before correction for the run's other comparisons).")  # fmt: skip
        else:
            out.append(
                f"- **{s.label}** is not distinguishable from {c.baseline}, the vote at its calls "
                f"({_signed_pct(c.diff)} points, p = {c.p_value:.2f}), at {s.mean_calls:.1f} calls per item."
            )
    return out


#: The goal a protocol or rule must reach to pay: this many points over its equal-budget baseline with a
#: paired 95% interval above 0, or its baseline's accuracy (within this non-inferiority margin, and not
#: below it on the point estimate by more than half a point) at no more than this share of its tokens.
GOAL_POINTS = 0.02
NON_INFERIORITY = 0.02
GOAL_TOKEN_SHARE = 0.7


def _goal(report: EvalReport) -> list[str]:
    """Does anything in this run reach the goal? Every paired comparison the report has: protocols
    against their baselines, and the pool's rules against the vote on the same samples."""
    rows: list[tuple[str, float, float, float, float | None]] = []
    by_label = {s.label: s for s in report.protocols}
    needed: list[int] = []
    paired = 0
    for s in report.protocols:
        for c in ([s.comparison] if s.comparison is not None else []) + s.other_comparisons:
            share = s.mean_tokens / c.baseline_tokens if c.baseline_tokens else None
            against = f"{c.baseline} ({c.kind})"
            rows.append((f"{s.label} against {against}", c.diff, c.ci_low, c.ci_high, share))
            if c.items_needed is not None:
                needed.append(c.items_needed)
            paired = max(paired, c.paired)
    for v in report.variants:
        if v.baseline is None or v.diff_vs_baseline is None:
            continue
        base = by_label.get(v.baseline)
        share = v.mean_tokens / base.mean_tokens if base is not None and base.mean_tokens else None
        lo, hi = v.baseline_ci_low or 0.0, v.baseline_ci_high or 0.0
        rows.append((f"{v.protocol} / {v.variant} against {v.baseline}", v.diff_vs_baseline, lo, hi, share))
    pool = report.pool
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
        return []
    family = corrected_family(rows)
    wins = [f for f in family if f.diff >= GOAL_POINTS and f.low > 0]
    cheaper = [
        f for f in family
        if f.share is not None and f.share <= GOAL_TOKEN_SHARE and f.diff >= -0.005 and f.low >= -NON_INFERIORITY
    ]  # fmt: skip
    goal = (
        f"The goal: at least {100 * GOAL_POINTS:g} points over the equal-budget baseline with a paired interval "
        f"above 0, or the baseline's accuracy (interval's low end no worse than -{100 * NON_INFERIORITY:g} points) "
        f"at no more than {GOAL_TOKEN_SHARE:g}x its tokens; the intervals are corrected for the {len(rows)} paired "
        f"comparisons of this run (Bonferroni: each at {100 * (1 - 0.05 / len(rows)):.2f}%), and p-values are "
        "Holm's. Of those comparisons:"
    )
    out = [f"- {goal}"]
    for f in wins:
        out.append(f"  - **{f.name}**: {_signed_pct(f.diff)} points {_ci(f.low, f.high)} (Holm p = {f.p_holm:.3f}; "
                   "beats it).")  # fmt: skip
    for f in cheaper:
        out.append(f"  - **{f.name}**: {_signed_pct(f.diff)} points {_ci(f.low, f.high)} at {f.share:.2f}x its "
                   "tokens.")  # fmt: skip
    if wins or cheaper:
        out.append("  - A result counts for the goal when the same comparison holds on a second benchmark.")
    if not wins and not cheaper:
        best = max(family, key=lambda f: f.diff)
        uncorrected = [f for f in family if f.diff >= GOAL_POINTS and f.ci95_low > 0]
        out.append(
            f"  - nothing reaches it. The largest gain is {best.name}: {_signed_pct(best.diff)} points "
            f"{_ci(best.low, best.high)} corrected ({_ci(best.ci95_low, best.ci95_high)} at 95% alone)."
            + (f" {len(uncorrected)} comparison(s) would clear 0 at an uncorrected 95%; with {len(rows)} "
               f"comparisons about {len(rows) / 40:.1f} would by chance alone." if uncorrected else "")
        )  # fmt: skip
    if needed:
        needed.sort()
        out.append(
            f"- How many items a paired test needs: to detect a true {100 * GOAL_POINTS:g}-point gain with 80% power "
            f"(two-sided, 5%), at the share of items each comparison above got right under exactly one of its two "
            f"sides, from {needed[0]:,} to {needed[-1]:,} items (median {int(statistics.median(needed)):,}); "
            f"these comparisons paired {paired} items. An interval that spans 0 at this n says the run is too small "
            "to tell, "
            "not that the two are equal."
        )
    if report.pareto:
        front = sorted(report.pareto, key=lambda p: -p.accuracy)
        out.append(
            f"- Pareto-best on accuracy against tokens (on the {report.pareto_items} items every protocol finished): "
            + ", ".join(f"{p.name} ({_pct(p.accuracy)}, {p.mean_tokens:.0f} tokens)" for p in front)
            + "."
        )
    return out


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


def _header(report: EvalReport) -> list[str]:
    cfg = report.config
    subject = f" ({cfg.subject})" if cfg.subject else ""
    return [
        f"dataset **{cfg.dataset}**{subject}, {report.items} items (seed {cfg.seed}), model `{cfg.model}`, "
        f"max tokens per turn {cfg.max_tokens or 'protocol default'}",
        f"generated {report.generated_at}",
        *_saved(report),
    ]


def _saved(report: EvalReport) -> list[str]:
    """The calls the run's request cache saved: reported, never subtracted from a protocol's cost."""
    calls = sum(s.mean_calls * s.finished for s in report.protocols)
    cached = sum(s.mean_cached_calls * s.finished for s in report.protocols)
    if not cached:
        return []
    return [
        f"calls saved by the run's request cache: {cached:,.0f} of {calls:,.0f} reported "
        f"({100 * cached / calls:.0f}%); "
        "every protocol's calls and tokens below are what it would have paid alone"
    ]


def render_markdown(report: EvalReport, figures: dict[str, str]) -> str:
    parts = [f"# moot eval: {report.config.dataset}", "", *[f"- {h}" for h in _header(report)], ""]
    if verdicts := _verdicts(report) + _goal(report):
        parts += ["## Does debate pay for itself?", "", *verdicts, ""]
    parts += ["## Accuracy and cost", "", _md_table(*_rows(report)), ""]
    parts += [
        "## Paired comparisons: the votes at the debate's calls and tokens, the adaptive vote, dearer votes",
        "",
        _md_table(*_comparison_rows(report)),
        "",
    ]
    parts += ["## Debate dynamics", "", _md_table(*_dynamics_rows(report)), ""]
    if report.seed_spreads:
        parts += [
            "## Draws of round 1: the same debate on other seeds",
            "",
            "Each row is one debate run on several draws of its first round (`first_seed=`), each draw paired with "
            "its own draw's vote of that kind: how much of a paired difference is the draw, not the debate.",
            "",
            _md_table(*_seed_rows(report)),
            "",
        ]
    for title, text, table in _variant_section(report) + _pool_sections(report):
        parts += [f"## {title}", "", text, ""] + ([_md_table(*table), ""] if table else [])
    if report.pareto:
        parts += [
            f"## Pareto front: accuracy against tokens (on the {report.pareto_items} items every protocol finished)",
            "",
            _md_table(*_pareto_rows(report)),
            "",
        ]
    if figures:
        parts += ["## Figures", ""] + [f"![{name}]({path})" for name, path in figures.items()] + [""]
    parts += render_quality_markdown(report.quality)
    parts += [
        "Accuracy counts a failed item as wrong; *unextractable* answers (no answer of the item's kind) are wrong "
        "too. Latency is per item under the run's concurrency. A tie of a vote goes to the answer given first; the "
        "expected accuracy credits a tie by the share of its tied answers that are right, and every comparison "
        "uses it on both sides. A debate's baselines are fixed by its budget before any accuracy is looked at: "
        "the vote at its calls, the vote at its tokens (tokens per sample: `single`'s, else the pool's), each the "
        "run's own when it has one, else derived from the pool's k-subsets (marked derived). Comparisons pair the "
        "items both finished; the interval is Agresti and Min's for paired proportions (Wald's after adding 1/2 "
        "to each cell; over fractional credits where a tie is), p its normal p-value; the goal's family is "
        "corrected (Bonferroni intervals, Holm p-values).",
        "",
    ]
    return "\n".join(parts)


def _html_table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


_CSS = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:14px}th,td{border:1px solid #ccc;padding:4px 8px;text-align:left}
th{background:#f3f3f3}img{max-width:100%;border:1px solid #eee;margin:.5em 0}code{background:#f3f3f3;padding:0 3px}
"""


def render_html(report: EvalReport, images: dict[str, bytes]) -> str:
    import re

    def md_inline(text: str) -> str:
        escaped = html.escape(text)
        escaped = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", escaped)
        return re.sub(r"`(.+?)`", r"<code>\1</code>", escaped)

    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>moot eval: {html.escape(report.config.dataset)}"
             f"</title><style>{_CSS}</style></head><body>", f"<h1>moot eval: {html.escape(report.config.dataset)}</h1>",
             "<ul>" + "".join(f"<li>{md_inline(h)}</li>" for h in _header(report)) + "</ul>"]  # fmt: skip
    if verdicts := _verdicts(report) + _goal(report):
        parts.append("<h2>Does debate pay for itself?</h2><ul>")
        parts += [f"<li>{md_inline(v.strip().removeprefix('- '))}</li>" for v in verdicts]
        parts.append("</ul>")
    parts += ["<h2>Accuracy and cost</h2>", _html_table(*_rows(report))]
    parts += [
        "<h2>Paired comparisons: the equal-budget baseline, the adaptive vote, dearer votes</h2>",
        _html_table(*_comparison_rows(report)),
    ]
    parts += ["<h2>Debate dynamics</h2>", _html_table(*_dynamics_rows(report))]
    if report.seed_spreads:
        parts += ["<h2>Draws of round 1: the same debate on other seeds</h2>", _html_table(*_seed_rows(report))]
    for title, text, table in _variant_section(report) + _pool_sections(report):
        parts += [f"<h2>{html.escape(title)}</h2>", f"<p>{md_inline(text)}</p>"]
        parts += [_html_table(*table)] if table else []
    if report.pareto:
        parts += [
            f"<h2>Pareto front: accuracy against tokens (on the {report.pareto_items} items every protocol "
            "finished)</h2>",
            _html_table(*_pareto_rows(report)),
        ]
    if images:
        parts.append("<h2>Figures</h2>")
        for name, data in images.items():
            parts.append(f"<img alt='{name}' src='data:image/png;base64,{base64.b64encode(data).decode()}'>")
    else:
        parts.append("<p>(Figures need matplotlib: <code>pip install 'moot[eval]'</code>.)</p>")
    parts += render_quality_html(report.quality)
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(folder: Path, prices: PriceTable | None = None) -> tuple[EvalReport, list[Path]]:
    """Write report.md, report.html (figures embedded), report.json and the PNGs into ``folder``."""
    store = RunStore.open(folder)
    try:
        report = summarise(store, prices)
    finally:
        store.close()
    images = plots(report)
    written = []
    plot_dir = folder / "plots"
    if images:
        plot_dir.mkdir(exist_ok=True)
    for name, data in images.items():
        (plot_dir / name).write_bytes(data)
        written.append(plot_dir / name)
    for name, text in (
        ("report.md", render_markdown(report, {n: f"plots/{n}" for n in images})),
        ("report.html", render_html(report, images)),
        ("report.json", report.model_dump_json(indent=2)),
    ):
        (folder / name).write_text(text, encoding="utf-8")
        written.append(folder / name)
    return report, written
