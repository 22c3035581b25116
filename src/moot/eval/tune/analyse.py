"""``moot tune``'s analysis: its report from the two finished runs alone (no model), what ``run_tune``
writes and what a committed tune is re-derived from."""

from __future__ import annotations

import statistics
from collections import Counter
from datetime import UTC, datetime

from pydantic import BaseModel

from moot.eval.analysis import expected_correctness
from moot.eval.loaded import LoadedRun, as_loaded
from moot.eval.store import RunStore
from moot.eval.tune.choice import CandidateScore, Choice, Comparison, choose, held_out_labels
from moot.eval.tune.config import Split, TuneConfig, TuneError
from moot.models.pricing import PriceTable
from moot.protocols.tuned import HeldOut
from moot.stats import paired_test, total, wilson


class TuneReport(BaseModel):
    config: TuneConfig
    split: Split
    candidates: list[CandidateScore]
    chosen: str
    reason: str
    supported: bool
    tuning_comparison: Comparison | None = None
    held_out: HeldOut | None = None
    #: Tuning accuracy minus held-out accuracy of the choice: how much the choice flattered itself.
    optimism: float | None = None
    generated_at: str


def candidate_scores(
    store: LoadedRun, labels: list[str], prices: PriceTable | None
) -> dict[str, tuple[CandidateScore, dict[str, float]]]:
    items = {i.id: i for i in store.items()}
    out = {}
    for label in labels:
        results = {r.item_id: r for r in store.results(label)}
        if not results:
            continue
        expected = expected_correctness(store, label, items, results)
        rs = list(results.values())
        # The interval of the accuracy it is printed with: the expected one over tie-breaks.
        lo, hi = wilson(total(expected.values()), len(rs))
        failures = Counter(r.error or "no reason recorded" for r in rs if r.status == "failed")
        price = prices.price_for(store.config.model) if prices is not None else None
        usd = (
            statistics.fmean(price.cost(r.prompt_tokens, r.completion_tokens, r.cached_prompt_tokens) for r in rs)
            if price is not None
            else None
        )
        out[label] = (
            CandidateScore(label=label, items=len(rs), accuracy=statistics.fmean(expected.values()), ci_low=lo,
                           ci_high=hi, mean_tokens=statistics.fmean(r.tokens for r in rs),
                           mean_calls=statistics.fmean(r.calls for r in rs), usd=usd, failed=failures.total(),
                           failure=failures.most_common(1)[0][0] if failures else None),
            expected,
        )  # fmt: skip
    return out


def held_before(stored: list[str], labels: list[str]) -> list[str]:
    """What the held-out run held before this choice was confirmed there, from its protocols alone:
    a tune extends it to ``before + [l for l in labels if l not in before]`` (:func:`run_tune`), so
    ``before`` is the shortest prefix of ``stored`` that gives ``stored`` so. Empty for a run made for
    this choice alone (``stored == labels``): a confirmation on fresh items."""
    for i in range(len(stored) + 1):
        before = stored[:i]
        if before + [label for label in labels if label not in before] == stored:
            return before
    return stored  # not made by a tune of these labels: everything in it was there before


def analyse_tune(
    config: TuneConfig,
    split: Split,
    tuning_run: RunStore | LoadedRun,
    holdout_run: RunStore | LoadedRun,
    prices: PriceTable | None = None,
    *,
    generated_at: str | None = None,
) -> tuple[TuneReport, CandidateScore]:
    """The tune's report, and the choice's score on the tuning items, from its two finished runs
    alone (no model): what ``run_tune`` writes, and what a committed tune is re-derived from."""
    tuning, holdout = as_loaded(tuning_run), as_loaded(holdout_run)
    labels = list(tuning.config.protocols)
    scores = candidate_scores(tuning, labels, prices)
    choice = choose(scores, config)
    if not isinstance(choice, Choice):
        raise TuneError(
            f"{tuning.source}: the tuning run lacks {choice.label}, the vote at its choice's budget; run the same "
            "moot tune command again on this folder to add it"
        )
    chosen, reason, supported, comparison = choice
    held_labels = held_out_labels(chosen, comparison)
    held = candidate_scores(holdout, held_labels, prices)
    baseline = held_labels[1] if len(held_labels) > 1 else None
    held_out: HeldOut | None = None
    seen_before = held_before(list(holdout.config.protocols), held_labels)
    if chosen in held and baseline is not None and baseline in held:
        c, mine = held[chosen]
        b, theirs = held[baseline]
        t = paired_test(theirs, mine)
        held_out = HeldOut(items=c.items, accuracy=c.accuracy, ci_low=c.ci_low, ci_high=c.ci_high, baseline=baseline,
                           baseline_accuracy=b.accuracy, diff=t.diff, diff_ci_low=t.ci_low, diff_ci_high=t.ci_high,
                           mean_tokens=c.mean_tokens, mean_calls=c.mean_calls, seen_before=seen_before)  # fmt: skip
    elif chosen in held:
        c = held[chosen][0]
        held_out = HeldOut(items=c.items, accuracy=c.accuracy, ci_low=c.ci_low, ci_high=c.ci_high, baseline=None,
                           mean_tokens=c.mean_tokens, mean_calls=c.mean_calls, seen_before=seen_before)  # fmt: skip
    report = TuneReport(
        config=config, split=split, candidates=[scores[label][0] for label in config.candidates if label in scores],
        chosen=chosen, reason=reason, supported=supported, tuning_comparison=comparison, held_out=held_out,
        optimism=(scores[chosen][0].accuracy - held_out.accuracy) if held_out is not None else None,
        generated_at=generated_at or datetime.now(UTC).isoformat(timespec="seconds"),
    )  # fmt: skip
    return report, scores[chosen][0]
