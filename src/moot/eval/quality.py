"""Seed 004 in ``moot eval report``: each protocol's debate quality, how well each quality dimension
predicts a right decision (:func:`validate`, also ``moot quality validate RUN``), the seed's
performance targets with their intervals, and the cost per debate in money against a single call.

Self-contained: :func:`quality_section` reads the loaded run (transcripts, results, the judge's
stored judgements) and returns a :class:`QualitySection`; :func:`render_quality_markdown` and
:func:`render_quality_html` render it, every column explained under its table. The judged
dimensions need ``moot eval judge RUN --judge-model MODEL`` first (:mod:`moot.eval.judging`: one judge call per
finished transcript, its whole output stored in the run by :meth:`RunStore.save_judgement`, resumable).

The validation's intervals are a percentile bootstrap over items (numpy's generator, seeded): an
AUROC is a ratio of ranks, which a normal interval describes badly near 0 or 1 and with ties.

Intervals (95%): Wilson's for a proportion (consensus rate); the normal interval of a mean for a
mean score (decision confidence, reasoning depth, the quality dimensions); a seeded paired
bootstrap over items (2,000 resamples) for the relative gains (accuracy improvement, hallucination
reduction), which are ratios. A target is *met* when the whole interval is past it, *not met* when
the whole interval falls short of it, and *inconclusive* otherwise.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence

from moot.core.answers import answer_of, confidence_of, normalize_answer
from moot.core.types import QUALITY_DIMENSIONS, DebateQuality, DebateResult
from moot.eval.items import EvalItem
from moot.eval.judging import JUDGE_LOCK, JudgeRequestError, judge_run
from moot.eval.loaded import LoadedRun, RunReadError, as_loaded
from moot.eval.protocols import BASELINES, parse_ref
from moot.eval.quality_model import (
    AurocRow,
    ComparisonRow,
    CostRow,
    DimensionSummary,
    ProtocolQuality,
    QualitySection,
    QualityValidation,
    TargetRow,
    Verdict,
)
from moot.eval.store import ItemResult, RunStore
from moot.models.pricing import Price, PriceTable
from moot.quality import JUDGED, measure, recompute_overall
from moot.quality.judge import RUBRIC_VERSION
from moot.stats import (
    BOOTSTRAP,
    Z,
    auroc_ci,
    bootstrap,
    discordant,
    ece,
    mean_ci,
    paired_bootstrap,
    paired_diff_ci,
    total,
    wilson,
)

#: The section's names, including its form (:mod:`moot.eval.quality_model`) and the judging run
#: (:mod:`moot.eval.judging`), re-exported here where they were defined.
__all__ = [
    "JUDGE_LOCK",
    "NOT_JUDGED",
    "POOLED",
    "AurocRow",
    "ComparisonRow",
    "CostRow",
    "DimensionSummary",
    "JudgeRequestError",
    "ProtocolQuality",
    "QualitySection",
    "QualityValidation",
    "RunReadError",
    "TargetRow",
    "Verdict",
    "bias",
    "error_reduction",
    "judge_run",
    "judgements",
    "quality_section",
    "relative_gain",
    "stated_confidence",
    "validate",
    "verdict",
]

#: Why a judged dimension is not measured for a debate of a run no judge has scored.
NOT_JUDGED = "not judged: `moot eval judge RUN --judge-model MODEL` scores the run and stores the judge's outputs in it"


# ------------------------------------------------------------------------------- statistics


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


def judgements(store: LoadedRun) -> dict[tuple[str, str], DebateQuality]:
    """The stored judged dimensions per (protocol, item) under the current rubric: the latest judge's,
    if several judged."""
    return store.judgements(RUBRIC_VERSION)


# ----------------------------------------------------------------------------------- section


def _qualities(store: LoadedRun, label: str, judged: dict[tuple[str, str], DebateQuality]) -> dict[str, DebateQuality]:
    out: dict[str, DebateQuality] = {}
    for item_id, result in store.transcripts(label).items():
        if result.status == "running":
            continue
        quality = measure(result)
        stored = judged.get((label, item_id))
        if stored is None:
            for name in JUDGED:
                quality.unmeasured[name] = NOT_JUDGED
        else:
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
            row.note = reasons.most_common(1)[0][0] if reasons else "no finished debate"
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
    return 0.5 * total(abs(given[k] - truth[k]) for k in given.keys() | truth.keys()) / n


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
    store: LoadedRun,
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
            usd_single = total(_usd(price, single[i]) for i in both)
            usd = total(_usd(price, results[label][i]) for i in both)
            row.ratio_usd = usd / usd_single if usd_single else None
    return row


# -------------------------------------------------------------------------------- validation

#: The label of the rows that pool every protocol's debates.
POOLED = "every protocol"


def _auroc_row(
    dimension: str,
    protocol: str,
    cases: list[tuple[str, DebateQuality, bool]],
    resamples: int,
    seed: int,
) -> AurocRow:
    """``cases``: (item id, the debate's quality, its decision is right)."""
    scored = [(item, q.scores[dimension].value, ok) for item, q, ok in cases if dimension in q.scores]
    row = AurocRow(dimension=dimension, protocol=protocol, debates=len(cases), measured=len(scored))
    row.right = sum(ok for _, _, ok in scored)
    if not scored:
        reasons = Counter(q.unmeasured.get(dimension, "") for _, q, _ in cases)
        row.note = reasons.most_common(1)[0][0] if reasons else "no finished debate"
        return row
    value, low, high = auroc_ci(
        [v for _, v, _ in scored],
        [ok for _, _, ok in scored],
        [item for item, _, _ in scored] if protocol == POOLED else None,
        resamples=resamples,
        seed=seed,
    )
    if value is None:
        row.note = "every measured decision is right" if row.right else "every measured decision is wrong"
        return row
    row.auroc, row.ci_low, row.ci_high = (round(v, 4) if v is not None else None for v in (value, low, high))
    return row


def validate(
    run: RunStore | LoadedRun,
    *,
    resamples: int = BOOTSTRAP,
    seed: int = 0,
    qualities: dict[str, dict[str, DebateQuality]] | None = None,
) -> QualityValidation:
    """How well each quality dimension predicts that the decision is right, per protocol and pooled over
    the protocols: its AUROC over the finished debates where it was measured, with a 95% bootstrap
    interval over items (the pooled rows resample items with every protocol's debate of each). The
    judged dimensions come from the judgements ``moot eval judge`` stored in the run. A debate is a
    *finished* one when its protocol ran to a result (``status`` ``ok``); one without an answer is wrong.
    Needs numpy (``moot[eval]``)."""
    import numpy  # noqa: F401  (a missing numpy is told here, before any work)

    store = as_loaded(run)
    config = store.config
    judged = judgements(store)
    by_item = qualities or {label: _qualities(store, label, judged) for label in config.protocols}
    out = QualityValidation(
        dataset=config.dataset,
        model=config.model,
        judges=sorted({q.judge for q in judged.values() if q.judge}),
        resamples=resamples,
        seed=seed,
    )
    per_protocol: dict[str, list[tuple[str, DebateQuality, bool]]] = {}
    for label in config.protocols:
        results = {r.item_id: r for r in store.results(label) if r.status == "ok"}
        per_protocol[label] = [
            (item, q, results[item].correct) for item, q in sorted(by_item.get(label, {}).items()) if item in results
        ]
    pooled = [case for cases in per_protocol.values() for case in cases]
    for dim in QUALITY_DIMENSIONS:
        for label, cases in per_protocol.items():
            out.rows.append(_auroc_row(dim, label, cases, resamples, seed))
        if len(per_protocol) > 1:
            out.rows.append(_auroc_row(dim, POOLED, pooled, resamples, seed))
    return out


def quality_section(run: RunStore | LoadedRun, prices: PriceTable | None = None) -> QualitySection:
    """Seed 004's section of the report, from the loaded run (an open store is read once here)."""
    store = as_loaded(run)
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
                # One answer is unanimous by construction: such a debate is not counted (docs/quality.md).
                if typed and sum(a is not None for a in typed[-1].answers.values()) >= 2:
                    consensus.append(typed[-1].agreement == 1.0)
            section.targets += _targets(label, config.dataset, results, qualities, consensus)
            section.comparison += _comparison(label, store, items, results, by_item)
        section.cost.append(_cost(label, results, config.model, table))
    try:
        section.validation = validate(store, qualities=by_item)
    except ImportError:
        section.validation = None  # the note says numpy is needed
    return section
