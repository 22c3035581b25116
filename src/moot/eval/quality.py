"""Seed 004 in ``moot eval report``: each protocol's debate quality, the seed's performance targets
with their intervals, and the cost per debate in money against a single call.

Self-contained: :func:`quality_section` reads the run's store (transcripts, results, the judge's
stored judgements) and returns a :class:`QualitySection`; :func:`render_quality_markdown` and
:func:`render_quality_html` render it. The judged dimensions need ``moot eval judge RUN
--judge-model MODEL`` first (one judge call per finished transcript, stored in the run, resumable).

Intervals (95%): Wilson's for a proportion (consensus rate); the normal interval of a mean for a
mean score (decision confidence, reasoning depth, the quality dimensions); a seeded paired
bootstrap over items (2,000 resamples) for the relative gains (accuracy improvement, hallucination
reduction), which are ratios. A target is *met* when the whole interval is past it, *not met* when
the whole interval falls short of it, and *inconclusive* otherwise.
"""

from __future__ import annotations

import asyncio
import html
import math
import random
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field

from moot.core.answers import answer_of, confidence_of, normalize_answer
from moot.core.types import QUALITY_DIMENSIONS, DebateQuality, DebateResult, QualityScore
from moot.eval.items import EvalItem
from moot.eval.protocols import BASELINES, parse_ref
from moot.eval.stats import discordant, paired_diff_ci, wilson
from moot.eval.store import ItemResult, RunStore
from moot.models.base import BaseChatModel
from moot.models.pricing import Price, PriceTable
from moot.quality import JUDGED, measure, recompute_overall
from moot.quality.judge import RUBRIC_VERSION, judge_debate, score_of
from moot.runlock import RunLock

Z = 1.959963984540054
BOOTSTRAP = 2000
JUDGEMENTS_TABLE = "quality_judgements"
#: The lock file a judge holds in the run folder (beside the run's own ``run.lock``).
JUDGE_LOCK = "judge.lock"


# ------------------------------------------------------------------------------------- model


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


class QualitySection(BaseModel):
    judges: list[str] = Field(default_factory=list)
    protocols: list[ProtocolQuality] = Field(default_factory=list)
    targets: list[TargetRow] = Field(default_factory=list)
    comparison: list[ComparisonRow] = Field(default_factory=list)
    cost: list[CostRow] = Field(default_factory=list)
    model: str = ""


# ------------------------------------------------------------------------------- statistics


def mean_ci(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean with the normal 95% interval (clipped to [0, 1]; a single value has a zero-width one)."""
    m = statistics.fmean(values)
    half = Z * statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return m, max(0.0, m - half), min(1.0, m + half)


T = TypeVar("T")


def bootstrap(
    rows: Sequence[T], stat: Callable[[Sequence[T]], float | None], seed: int = 0
) -> tuple[float | None, float | None, float | None]:
    """``stat`` on the rows (items), with a seeded percentile bootstrap interval over them
    (resamples where the statistic is undefined are skipped)."""
    value = stat(rows)
    if value is None:
        return None, None, None
    rng = random.Random(seed)
    n = len(rows)
    draws = []
    for _ in range(BOOTSTRAP):
        v = stat([rows[rng.randrange(n)] for _ in range(n)])
        if v is not None:
            draws.append(v)
    if not draws:
        return value, None, None
    draws.sort()
    return value, draws[int(0.025 * (len(draws) - 1))], draws[int(0.975 * (len(draws) - 1))]


#: The paired form: rows are (single right, debate right) per item.
paired_bootstrap = bootstrap


def relative_gain(pairs: Sequence[tuple[bool, bool]]) -> float | None:
    """(accuracy of the second - accuracy of the first) / accuracy of the first."""
    base = sum(s for s, _ in pairs)
    return None if base == 0 else (sum(p for _, p in pairs) - base) / base


def error_reduction(pairs: Sequence[tuple[bool, bool]]) -> float | None:
    """(error rate of the first - error rate of the second) / error rate of the first."""
    base = sum(not s for s, _ in pairs)
    return None if base == 0 else (base - sum(not p for _, p in pairs)) / base


def verdict(low: float | None, high: float | None, target: float) -> Verdict:
    if low is None or high is None:
        return "not measured"
    if low > target:
        return "met"
    if high < target:
        return "not met"
    return "inconclusive"


# -------------------------------------------------------------------------------- judgements


def _ensure_table(store: RunStore) -> None:
    store.conn.execute(
        f"CREATE TABLE IF NOT EXISTS {JUDGEMENTS_TABLE} (protocol TEXT NOT NULL, item_id TEXT NOT NULL, "
        "judge TEXT NOT NULL, rubric TEXT NOT NULL, json TEXT NOT NULL, PRIMARY KEY (protocol, item_id, judge, rubric))"
    )


def judgements(store: RunStore) -> dict[tuple[str, str], DebateQuality]:
    """The stored judged dimensions per (protocol, item): the latest judge's, if several judged."""
    _ensure_table(store)
    rows = store.conn.execute(
        f"SELECT protocol, item_id, json FROM {JUDGEMENTS_TABLE} WHERE rubric = ? ORDER BY rowid", (RUBRIC_VERSION,)
    ).fetchall()
    return {(p, i): DebateQuality.model_validate_json(text) for p, i, text in rows}


async def judge_run(
    folder: Path, judge: BaseChatModel, *, concurrency: int = 4, on_done: Callable[[int, int], None] | None = None
) -> tuple[int, int, list[str]]:
    """Judge every finished transcript of the run that this judge has not judged yet. A judgement is
    stored as it comes; a failed one (a model error, an unparsable reply) is not, so running the
    command again retries it. Returns (judged now, judged before, the errors of the failed ones)."""
    store = RunStore.open(folder)
    try:
        # Two judges on one run would both pay for every judgement: one at a time (a run may go on).
        lock = RunLock.acquire(folder, JUDGE_LOCK, hint="judge another run")
    except BaseException:
        store.close()
        raise
    try:
        _ensure_table(store)
        done = {
            (p, i)
            for p, i in store.conn.execute(
                f"SELECT protocol, item_id FROM {JUDGEMENTS_TABLE} WHERE judge = ? AND rubric = ?",
                (judge.name, RUBRIC_VERSION),
            )
        }
        todo = [
            (label, item_id, result)
            for label in store.config.protocols
            for item_id, result in store.transcripts(label).items()
            if (label, item_id) not in done and result.status != "running"
        ]
        gate = asyncio.Semaphore(max(1, concurrency))
        errors: list[str] = []
        judged = 0

        async def one(label: str, item_id: str, result: Any) -> None:
            nonlocal judged
            async with gate:
                outcome = await judge_debate(result, judge)
            if outcome.judgement is None:
                errors.append(f"{label} {item_id}: {outcome.error}")
                return
            quality = DebateQuality(judge=judge.name, judge_calls=outcome.calls, judge_usage=outcome.usage)
            j = outcome.judgement
            for name, level in (("logical_consistency", j.logical_consistency), ("reasoning_depth", j.reasoning_depth)):
                quality.scores[name] = QualityScore(
                    value=score_of(level), method="judge", details={"level": level, "rubric": RUBRIC_VERSION}
                )
            with store.conn:
                store.conn.execute(
                    f"INSERT OR REPLACE INTO {JUDGEMENTS_TABLE} (protocol, item_id, judge, rubric, json) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (label, item_id, judge.name, RUBRIC_VERSION, quality.model_dump_json()),
                )
            judged += 1
            if on_done is not None:
                on_done(judged, len(todo))

        await asyncio.gather(*(one(*job) for job in todo))
        return judged, len(done), errors
    finally:
        store.close()
        lock.release()


# ----------------------------------------------------------------------------------- section


def _qualities(store: RunStore, label: str, judged: dict[tuple[str, str], DebateQuality]) -> dict[str, DebateQuality]:
    out: dict[str, DebateQuality] = {}
    for item_id, result in store.transcripts(label).items():
        if result.status == "running":
            continue
        quality = measure(result)
        stored = judged.get((label, item_id))
        if stored is not None:
            quality.judge = stored.judge
            for name in JUDGED:
                quality.unmeasured.pop(name, None)
                if name in stored.scores:
                    quality.scores[name] = stored.scores[name]
                else:
                    quality.unmeasured[name] = stored.unmeasured.get(name, "the judge gave no judgement")
            recompute_overall(quality)
        out[item_id] = quality
    return out


def _dimensions(qualities: list[DebateQuality]) -> list[DimensionSummary]:
    rows = []
    for dim in QUALITY_DIMENSIONS:
        values = [q.scores[dim].value for q in qualities if dim in q.scores]
        reasons = Counter(q.unmeasured[dim] for q in qualities if dim in q.unmeasured)
        row = DimensionSummary(dimension=dim, debates=len(qualities), measured=len(values))
        if values:
            row.mean, row.ci_low, row.ci_high = (round(x, 6) for x in mean_ci(values))
        if reasons:
            row.reason = reasons.most_common(1)[0][0]
        rows.append(row)
    return rows


def _pairs(a: dict[str, ItemResult], b: dict[str, ItemResult]) -> list[tuple[bool, bool]]:
    return [(a[i].correct, b[i].correct) for i in sorted(a.keys() & b.keys())]


def _targets(
    label: str,
    dataset: str,
    results: dict[str, dict[str, ItemResult]],
    qualities: list[DebateQuality],
    consensus: list[bool],
) -> list[TargetRow]:
    rows = []
    single = results.get("single")
    acc = TargetRow(metric="accuracy improvement over single", protocol=label, phase1="+30%", phase2="+40%",
                    baseline="0%")  # fmt: skip
    if single is None:
        acc.note = "no `single` protocol in the run to compare with"
    else:
        pairs = _pairs(single, results[label])
        acc.n = len(pairs)
        acc.value, acc.ci_low, acc.ci_high = paired_bootstrap(pairs, relative_gain)
        acc.note = "relative: (debate - single) / single accuracy, on the items both finished"
        if acc.value is None:
            acc.note = "single got no item right: a relative gain is undefined"
        acc.phase1_verdict, acc.phase2_verdict = (
            verdict(acc.ci_low, acc.ci_high, 0.30),
            verdict(acc.ci_low, acc.ci_high, 0.40),
        )
    rows.append(acc)
    hal = TargetRow(metric="hallucination reduction (truthfulqa-mc)", protocol=label, phase1="60%", phase2="70%",
                    baseline="0%")  # fmt: skip
    if dataset != "truthfulqa-mc":
        hal.note = f"measured on truthfulqa-mc runs; this run is {dataset}"
    elif single is None:
        hal.note = "no `single` protocol in the run to compare with"
    else:
        pairs = _pairs(single, results[label])
        hal.n = len(pairs)
        hal.value, hal.ci_low, hal.ci_high = paired_bootstrap(pairs, error_reduction)
        hal.note = "(single's false-answer rate - the debate's) / single's, on the items both finished"
        hal.phase1_verdict, hal.phase2_verdict = (
            verdict(hal.ci_low, hal.ci_high, 0.60),
            verdict(hal.ci_low, hal.ci_high, 0.70),
        )
    rows.append(hal)
    for metric, dim, p1, p2, base in (
        ("decision confidence", "decision_confidence", 0.8, 0.85, "0.6"),
        ("reasoning depth score", "reasoning_depth", 0.8, 0.9, "0.5"),
    ):
        values = [q.scores[dim].value for q in qualities if dim in q.scores]
        row = TargetRow(
            metric=metric, protocol=label, phase1=f"> {p1:g}", phase2=f"> {p2:g}", baseline=base, n=len(values)
        )
        if values:
            row.value, row.ci_low, row.ci_high = mean_ci(values)
            row.phase1_verdict, row.phase2_verdict = (
                verdict(row.ci_low, row.ci_high, p1),
                verdict(row.ci_low, row.ci_high, p2),
            )
            row.note = "mean over the debates where it was measured"
        else:
            reasons = Counter(q.unmeasured.get(dim, "") for q in qualities)
            row.note = (reasons.most_common(1)[0][0] if reasons else "no finished debate") + (
                "; run `moot eval judge RUN --judge-model MODEL`" if dim == "reasoning_depth" else ""
            )
        rows.append(row)
    rate = TargetRow(metric="consensus rate", protocol=label, phase1="> 70%", phase2="> 80%", baseline="n/a",
                     n=len(consensus))  # fmt: skip
    if consensus:
        agreed = sum(consensus)
        rate.value = agreed / len(consensus)
        rate.ci_low, rate.ci_high = wilson(agreed, len(consensus))
        rate.phase1_verdict, rate.phase2_verdict = (
            verdict(rate.ci_low, rate.ci_high, 0.7),
            verdict(rate.ci_low, rate.ci_high, 0.8),
        )
        rate.note = "debates whose last round's typed answers are unanimous"
    else:
        rate.note = "no debate with typed answers to agree on"
    rows.append(rate)
    return rows


def bias(answers: Sequence[str | None], gold: Sequence[str]) -> float:
    """Total variation distance between the distribution of the given answers (an unreadable answer
    is its own category) and that of the gold answers: 0 when the protocol picks each letter or label
    as often as it is right, up to 1 when it always picks one the gold never is."""
    n = len(gold)
    given = Counter(a if a is not None else "(none)" for a in answers)
    truth = Counter(gold)
    return 0.5 * sum(abs(given[k] - truth[k]) for k in given.keys() | truth.keys()) / n


def ece(confidences: Sequence[float], correct: Sequence[bool], bins: int = 10) -> float:
    """Expected calibration error: over equal-width confidence bins, the gap between the mean
    confidence and the accuracy, weighted by the bin's share of the items."""
    n = len(confidences)
    total = 0.0
    for b in range(bins):
        members = [i for i, c in enumerate(confidences) if min(int(c * bins), bins - 1) == b]
        if members:
            gap = statistics.fmean(confidences[i] for i in members) - statistics.fmean(correct[i] for i in members)
            total += len(members) / n * abs(gap)
    return total


def stated_confidence(result: DebateResult) -> float | None:
    """The confidence behind a decision: the decision's own (a judge, seed 004's argument strength),
    else the mean stated confidence of the last round's typed turns that give the final answer
    (a single agent: its own confidence)."""
    decision = result.decision or {}
    value = decision.get("confidence")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    final = normalize_answer(result.final_answer)
    if final is None or not result.rounds:
        return None
    stated = [c for t in result.rounds[-1].turns if answer_of(t) == final and (c := confidence_of(t)) is not None]
    return statistics.fmean(stated) if stated else None


def _comparison(
    label: str,
    store: RunStore,
    items: dict[str, EvalItem],
    results: dict[str, dict[str, ItemResult]],
    qualities: dict[str, dict[str, DebateQuality]],
) -> list[ComparisonRow]:
    single = results.get("single")
    names = ("accuracy (points)", "reasoning depth", "answer bias reduction", "calibration (ECE reduction)")
    if single is None:
        return [ComparisonRow(metric=m, protocol=label, note="no `single` protocol in the run") for m in names]
    ids = sorted(i for i in results[label].keys() & single.keys() if i in items)
    rows = []
    # accuracy: the paired difference, with its Agresti-Min interval
    b, c, n = discordant({i: single[i].correct for i in ids}, {i: results[label][i].correct for i in ids})
    diff, lo, hi = paired_diff_ci(b, c, n)
    acc = ComparisonRow(metric=names[0], protocol=label, n=n, note="paired difference, Agresti-Min interval")
    if n:
        acc.debate = statistics.fmean(results[label][i].correct for i in ids)
        acc.single = statistics.fmean(single[i].correct for i in ids)
        acc.gain, acc.ci_low, acc.ci_high = diff, lo, hi
    rows.append(acc)
    # reasoning depth: the judge's, paired by item
    depth = ComparisonRow(metric=names[1], protocol=label)
    pairs = [
        (qualities["single"][i].value("reasoning_depth"), qualities[label][i].value("reasoning_depth"))
        for i in ids
        if i in qualities.get("single", {}) and i in qualities.get(label, {})
    ]
    both = [(s, d) for s, d in pairs if s is not None and d is not None]
    if both:
        depth.n = len(both)
        depth.single = statistics.fmean(s for s, _ in both)
        depth.debate = statistics.fmean(d for _, d in both)
        diffs = [d - s for s, d in both]
        m = statistics.fmean(diffs)
        half = Z * statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else 0.0
        depth.gain, depth.ci_low, depth.ci_high = m, m - half, m + half
        depth.note = "the judge's reasoning depth, paired by item, normal interval"
    else:
        depth.note = "not judged: moot eval judge RUN --judge-model MODEL"
    rows.append(depth)
    # answer bias: how far the distribution of answers is from the gold's
    chosen = [i for i in ids if items[i].kind in ("letter", "label")]
    bias_row = ComparisonRow(metric=names[2], protocol=label, n=len(chosen))
    if chosen:

        def reduction(sample: Sequence[str]) -> float:
            gold = [items[i].answer for i in sample]
            before = bias([single[i].extracted for i in sample], gold)
            return before - bias([results[label][i].extracted for i in sample], gold)

        gold = [items[i].answer for i in chosen]
        bias_row.single = bias([single[i].extracted for i in chosen], gold)
        bias_row.debate = bias([results[label][i].extracted for i in chosen], gold)
        bias_row.gain, bias_row.ci_low, bias_row.ci_high = bootstrap(chosen, reduction)
        bias_row.note = "total variation distance of the answers from the gold answers, single minus debate"
    else:
        bias_row.note = "the items' answers are numbers: no answer distribution to be biased"
    rows.append(bias_row)
    # calibration: ECE of the confidence behind each decision, single minus debate
    cal = ComparisonRow(metric=names[3], protocol=label)
    t_single, t_debate = store.transcripts("single"), store.transcripts(label)
    known: list[tuple[float, float, str]] = []
    for i in ids:
        if i in t_single and i in t_debate:
            s_conf, d_conf = stated_confidence(t_single[i]), stated_confidence(t_debate[i])
            if s_conf is not None and d_conf is not None:
                known.append((s_conf, d_conf, i))
    if len(known) >= 2:

        def ece_gain(sample: Sequence[tuple[float, float, str]]) -> float:
            before = ece([s for s, _, _ in sample], [single[i].correct for _, _, i in sample])
            return before - ece([d for _, d, _ in sample], [results[label][i].correct for _, _, i in sample])

        cal.n = len(known)
        cal.single = ece([s for s, _, _ in known], [single[i].correct for _, _, i in known])
        cal.debate = ece([d for _, d, _ in known], [results[label][i].correct for _, _, i in known])
        cal.gain, cal.ci_low, cal.ci_high = bootstrap(known, ece_gain)
        cal.note = "expected calibration error (10 bins) of the confidence behind each decision, single minus debate"
    else:
        cal.note = "fewer than two items where both decisions state a confidence"
    rows.append(cal)
    return rows


def _usd(price: Price, r: ItemResult) -> float:
    return price.cost(r.prompt_tokens, r.completion_tokens, r.cached_prompt_tokens)


def _cost(label: str, results: dict[str, dict[str, ItemResult]], model: str, prices: PriceTable) -> CostRow:
    rs = [r for r in results[label].values() if r.status == "ok"]
    price = prices.price_for(model)
    row = CostRow(protocol=label, items=len(rs), mean_tokens=statistics.fmean([r.tokens for r in rs]) if rs else 0.0)
    if price is not None and rs:
        row.mean_usd = statistics.fmean([_usd(price, r) for r in rs])
    elif price is None:
        hint = "moot eval report RUN --prices FILE or --price MODEL=IN,OUT[,CACHED_IN]"
        row.note = f"tokens only: no price for {model} ({hint})"
    single = results.get("single")
    if single is None:
        row.note = (row.note + "; " if row.note else "") + "no `single` protocol to compare with"
        return row
    both = sorted(
        i for i in results[label].keys() & single.keys() if results[label][i].status == single[i].status == "ok"
    )
    tokens_single = sum(single[i].tokens for i in both)
    if both and tokens_single:
        row.ratio_tokens = sum(results[label][i].tokens for i in both) / tokens_single
        if price is not None:
            usd_single = sum(_usd(price, single[i]) for i in both)
            usd = sum(_usd(price, results[label][i]) for i in both)
            row.ratio_usd = usd / usd_single if usd_single else None
    return row


def quality_section(store: RunStore, prices: PriceTable | None = None) -> QualitySection:
    """Seed 004's section of the report, from the run's store."""
    config = store.config
    table = prices or PriceTable()
    judged = judgements(store)
    section = QualitySection(judges=sorted({q.judge for q in judged.values() if q.judge}), model=config.model)
    results = {label: {r.item_id: r for r in store.results(label)} for label in config.protocols}
    items = {i.id: i for i in store.items()}
    by_item = {label: _qualities(store, label, judged) for label in config.protocols}
    for label in config.protocols:
        qualities = list(by_item[label].values())
        section.protocols.append(ProtocolQuality(label=label, dimensions=_dimensions(qualities)))
        if parse_ref(label).name not in BASELINES:
            consensus = []
            for result in store.transcripts(label).values():
                typed = [rd for rd in (result.dynamics.rounds if result.dynamics else []) if rd.majority is not None]
                if typed:
                    consensus.append(typed[-1].agreement == 1.0)
            section.targets += _targets(label, config.dataset, results, qualities, consensus)
            section.comparison += _comparison(label, store, items, results, by_item)
        section.cost.append(_cost(label, results, config.model, table))
    return section


# ------------------------------------------------------------------------------------ render


def _num(x: float | None, pct: bool = False, signed: bool = False) -> str:
    if x is None:
        return "–"
    if pct:
        return f"{100 * x:+.1f}%" if signed else f"{100 * x:.1f}%"
    return f"{x:.2f}"


def _interval(row: TargetRow) -> str:
    pct = row.metric in ("consensus rate",) or row.metric.startswith(("accuracy", "hallucination"))
    signed = row.metric.startswith("accuracy")
    if row.value is None:
        return "–"
    return f"{_num(row.value, pct, signed)} [{_num(row.ci_low, pct, signed)}, {_num(row.ci_high, pct, signed)}]"


def _tables(section: QualitySection) -> list[tuple[str, list[str], list[list[str]]]]:
    dims = list(QUALITY_DIMENSIONS)
    quality_rows = []
    for p in section.protocols:
        cells = []
        for d in p.dimensions:
            if d.mean is None:
                cells.append("– (not measured)")
            else:
                part = "" if d.measured == d.debates else f", {d.measured}/{d.debates}"
                cells.append(f"{d.mean:.2f} [{d.ci_low:.2f}, {d.ci_high:.2f}{part}]")
        quality_rows.append([p.label, *cells])
    target_rows = [
        [t.metric, t.protocol, _interval(t), str(t.n), t.phase1, t.phase1_verdict, t.phase2, t.phase2_verdict,
         t.baseline, t.note]
        for t in section.targets
    ]  # fmt: skip
    comparison_rows = []
    for c in section.comparison:
        pct = c.metric.startswith("accuracy")

        def fmt(x: float | None, signed: bool = False, pct: bool = pct) -> str:
            if x is None:
                return "–"
            if pct:
                return f"{100 * x:+.1f}" if signed else f"{100 * x:.1f}%"
            return f"{x:+.3f}" if signed else f"{x:.3f}"

        gain = "–" if c.gain is None else f"{fmt(c.gain, True)} [{fmt(c.ci_low, True)}, {fmt(c.ci_high, True)}]"
        comparison_rows.append([c.metric, c.protocol, fmt(c.debate), fmt(c.single), gain, str(c.n), c.note])
    cost_rows = [
        [c.protocol, str(c.items), f"{c.mean_tokens:.0f}", "–" if c.mean_usd is None else f"${c.mean_usd:.6f}",
         "–" if c.ratio_tokens is None else f"{c.ratio_tokens:.2f}x",
         "–" if c.ratio_usd is None else f"{c.ratio_usd:.2f}x", c.note]
        for c in section.cost
    ]  # fmt: skip
    return [
        ("Debate quality (seed 004)", ["protocol", *dims], quality_rows),
        (
            "Seed 004's performance targets",
            ["metric", "protocol", "measured [95% CI]", "n", "phase 1", "", "phase 2", "", "single agent", "how"],
            target_rows,
        ),
        (
            "Comparison with a single agent (seed 004)",
            ["metric", "protocol", "debate", "single", "gain [95% CI]", "n", "how"],
            comparison_rows,
        ),
        (
            "Cost per debate",
            ["protocol", "items", "tokens/item", "USD/item", "vs single (tokens)", "vs single (USD)", "note"],
            cost_rows,
        ),
    ]


def _notes(section: QualitySection) -> list[str]:
    judge = (
        f"The judged dimensions (logical consistency, reasoning depth) are by {', '.join(section.judges)}, rubric "
        f"{RUBRIC_VERSION}."
        if section.judges
        else "No judge has scored this run, so logical consistency and reasoning depth are not measured "
        "(`moot eval judge RUN --judge-model MODEL`)."
    )
    return [
        "Quality cells: the mean over the finished debates where the dimension could be measured, its 95% interval, "
        "and how many of the debates that was when not all (definitions: docs/quality.md). " + judge,
        "Targets: a target is met when the whole 95% interval is past it, not met when it falls short of it, "
        "inconclusive otherwise. Relative gains use a seeded paired bootstrap over the items both protocols finished; "
        "means the normal interval; the consensus rate Wilson's.",
        f"Cost: the run's model `{section.model}` at the prices given (embedded models cost 0); the ratio to a single "
        "call is against the `single` protocol on the items both finished.",
    ]


def render_quality_markdown(section: QualitySection | None) -> list[str]:
    if section is None:
        return []
    parts: list[str] = []
    for title, head, rows in _tables(section):
        parts += [f"## {title}", "", "| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        parts += ["| " + " | ".join(r) + " |" for r in rows]
        parts.append("")
    parts += [*_notes(section), ""]
    return parts


def render_quality_html(section: QualitySection | None) -> list[str]:
    if section is None:
        return []
    parts = []
    for title, head, rows in _tables(section):
        th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
        parts += [f"<h2>{html.escape(title)}</h2>", f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"]
    parts += [f"<p>{html.escape(n)}</p>" for n in _notes(section)]
    return parts
