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

The report's form is :mod:`moot.eval.report_model`, each debate's baselines :mod:`moot.eval.fair`,
the goal and the family's correction :mod:`moot.eval.goal`; their names are re-exported here.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from datetime import UTC, datetime

from moot.core.answers import answer_of, confidence_of
from moot.core.decisions import selection_of, tied_answers
from moot.core.schemas import ANSWER_FORMS, AnswerForm
from moot.core.spec import SpecError
from moot.core.types import DebateResult
from moot.eval.fair import (  # noqa: F401  (re-exported: the baselines were defined here)
    ADAPTIVE_THRESHOLD,
    BUDGET_SLACK,
    _baseline_key,
    _budget_vote,
    _Fair,
    _fair_comparisons,
    _paired,
    _plain_vote,
)
from moot.eval.goal import (
    GOAL_POINTS,
    GOAL_TOKEN_SHARE,
    NON_INFERIORITY,
    Corrected,
    Goal,
    corrected_family,
)
from moot.eval.items import EvalItem, reasoning_limit
from moot.eval.loaded import LoadedRun, as_loaded
from moot.eval.pool import PoolAnalysis, PoolScores, analyse_pool, calibration_of, draw_of, find_pool
from moot.eval.protocols import BASELINES, ProtocolRef, base_spec, fit_to_item, parse_ref
from moot.eval.quality import quality_section
from moot.eval.report_model import (
    FAILURE_REASONS,
    REPORT_SCHEMA,
    Comparison,
    DebatePair,
    EvalReport,
    ParetoPoint,
    ProtocolSummary,
    RoundStat,
    SeedSpread,
    TurnLengths,
    goal_family,
)
from moot.eval.scoring import score
from moot.eval.store import ItemResult, RunConfig, RunStore
from moot.eval.variants import Variant, derive_variants
from moot.files import InputFileError
from moot.models.pricing import PriceTable
from moot.protocols.refs import ProtocolRefError
from moot.stats import (
    discordant,
    paired_diff_ci,
    paired_test,
    tie_credit,
    wilson,
)

#: The report's names, including those now defined in :mod:`moot.eval.report_model`,
#: :mod:`moot.eval.goal` and :mod:`moot.eval.fair`, re-exported here where they were defined.
__all__ = [
    "ADAPTIVE_THRESHOLD",
    "BUDGET_SLACK",
    "FIRST_ROUND",
    "GOAL_POINTS",
    "GOAL_TOKEN_SHARE",
    "NON_INFERIORITY",
    "REPORT_SCHEMA",
    "Comparison",
    "Corrected",
    "DebatePair",
    "EvalReport",
    "Goal",
    "ParetoPoint",
    "ProtocolSummary",
    "RoundStat",
    "SeedSpread",
    "TurnLengths",
    "corrected_family",
    "debate_pairs",
    "expected_correctness",
    "first_round_votes",
    "goal_family",
    "seed_spreads",
    "summarise",
    "tie_outcomes",
    "turn_lengths",
]


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def failure_reasons(results: list[ItemResult]) -> dict[str, int]:
    """Why the failed results failed: each reason (cut to 200 characters) and its count, the most
    frequent first (ties in the order met), at most :data:`FAILURE_REASONS` of them."""
    reasons = Counter(
        cut if len(cut := " ".join((r.error or "no reason recorded").split())) <= 200 else cut[:199] + "…"
        for r in results
        if r.status == "failed"
    )  # (on one line: a table's cell)
    return dict(reasons.most_common(FAILURE_REASONS))


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
        s.failure_reasons = failure_reasons(rs)
        _dynamics(s, store, label, items)
        form = _answer_form(ref)  # the protocol's, once (it rebuilds the spec), not once per item
        limits = {i: reasoning_limit(item.kind, form) for i, item in items.items()}
        s.turn_lengths = turn_lengths(store.transcripts(label), _turn_caps(ref, config, store, items), limits)
        expected[label] = expected_correctness(store, label, items, results)
        s.ties = sum(1 for t in store.transcripts(label).values() if tied_answers(t.decision) is not None)
        selections = [selection_of(t.decision) for t in store.transcripts(label).values()]
        if any(sel is not None for sel in selections):
            s.selection_fallbacks = sum(1 for sel in selections if sel is not None and sel.fallback is not None)
        s.expected_accuracy = _mean(list(expected[label].values())) if n else None
        summaries.append(s)
    single = next((s for s in summaries if s.label == "single"), None)
    scores = PoolScores()  # an item's score under a rule, computed once for every analysis below
    pool = analyse_pool(store, scores=scores)
    # A debate on another draw of round 1 (first_seed=) gets the derived votes of its own draw's pool.
    pools: dict[int, PoolAnalysis | None] = {1: pool}
    for s in summaries:
        if not s.baseline and s.finished and (draw := draw_of(s.label)) not in pools:
            pool_label = find_pool(store, draw)
            pools[draw] = analyse_pool(store, pool_label, scores=scores) if pool_label is not None else None
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
        common_pool = analyse_pool(store, only=common, scores=scores) if pool is not None else None
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
    all right, or all wrong, is still a tie; a selection that fell back to a tied vote is one:
    :func:`~moot.core.decisions.tied_answers`)."""
    transcripts = store.transcripts(label)
    out: dict[str, tuple[float, bool]] = {}
    for item_id, r in results.items():
        value, tie = float(r.correct), False
        t = transcripts.get(item_id)
        tied = tied_answers(t.decision) if t is not None else None
        if r.status == "ok" and tied and item_id in items:
            right = {a: score(items[item_id], a).correct for a in tied}
            value, tie = tie_credit(tied, right), True
        out[item_id] = (value, tie)
    return out
