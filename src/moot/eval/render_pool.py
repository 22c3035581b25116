"""The report's sections derived at no new calls: each debate re-decided by other rules (the
variants) and every rule of the run's pool of samples (:mod:`moot.eval.pool`), rendered."""

from __future__ import annotations

from moot.eval.pool import UAB_ORDERS
from moot.eval.render_cells import Section, ci, pct, signed_pct
from moot.eval.report_model import EvalReport


def pool_sections(report: EvalReport) -> list[Section]:
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
            [
                d.signal,
                str(d.pairs),
                str(d.items),
                "–" if d.wqd is None else f"{pct(d.wqd)} [{pct(d.ci_low)}, {pct(d.ci_high)}]",
            ]
            for d in pool.discrimination
        ],
    )
    out.append(("Derived from one pool of samples", intro, None))
    out.append(
        (
            "Can a confidence weight beat the vote? (the pilot)",
            "Over pairs of samples of one item where exactly one is right: how often the right one has the higher "
            "signal (ties count half). At 50% no weighting can beat the vote.",
            disc,
        )
    )
    c = pool.ceiling
    out.append(
        (
            "The ceiling of any re-weighting",
            f"Of {c.items} items, the right answer is in the pool on {c.right_in_pool}; the plurality is right on "
            f"{c.plurality_right}. Re-weighting can only help on the {c.plurality_wrong_right_in_pool} items "
            f"({pct(c.plurality_wrong_right_in_pool / c.items if c.items else 0)}) whose plurality is wrong while the "
            f"right answer is in the pool. {c.unanimous_wrong} {'item is' if c.unanimous_wrong == 1 else 'items are'} "
            f"unanimous and wrong; {c.no_right_answer} {'has' if c.no_right_answer == 1 else 'have'} no right "
            "answer at all: no decision rule reaches those.",
            None,
        )
    )
    rules = sorted({cv.rule for cv in pool.curves}, key=lambda r: (r != "vote", r))
    by = {(cv.rule, cv.k): cv for cv in pool.curves}
    head = ["k"] + [f"{r} expected accuracy" + ("" if r == "vote" else " (vs vote) [95% CI]") for r in rules]
    rows = []
    for k in range(1, pool.k + 1):
        row = [str(k)]
        for r in rules:
            cv = by[(r, k)]
            cell = pct(cv.accuracy)
            if r != "vote":
                cell += f" ({signed_pct(cv.diff_vs_vote)}) {ci(cv.ci_low, cv.ci_high)}"
            row.append(cell)
        rows.append(row)
    fitted = "; ".join(
        f"{f.signal}: median T = {f.median:g} (folds: {', '.join(f'{t:g}' for t in f.per_fold)})" for f in pool.fitted
    )
    out.append(
        (
            "Weighted votes against the plain vote, by samples",
            "CISC is `weighted:p_true` (one self-check call per sample, counted in its cost). `answer_prob` is the "
            "probability of the answer's tokens and `seq_prob` that of the whole reply, both read from the sample "
            f"itself at no cost; `stated` is the confidence the model wrote. Fitted temperatures: {fitted}.",
            (head, rows),
        )
    )
    cost_rows = [
        [f"{r}@{k}", f"{by[(r, k)].mean_calls:g}", f"{by[(r, k)].mean_tokens:.0f}", pct(by[(r, k)].accuracy)]
        for r in rules
        if r in ("vote", "weighted:p_true")
        for k in range(1, pool.k + 1)
    ]
    out.append(
        (
            "Cost of the pool's rules",
            "Mean calls and tokens per item of k samples (CISC adds its checks).",
            (["rule", "calls/item", "tokens/item", "expected accuracy"], cost_rows),
        )
    )
    ad_rows = [
        [
            f"{a.threshold:g}",
            pct(a.accuracy),
            f"{a.mean_samples:.2f}",
            f"{a.mean_tokens:.0f}",
            f"{signed_pct(a.diff_vs_full_vote)} {ci(a.ci_low, a.ci_high)}",
        ]
        for a in pool.adaptive
    ]
    out.append(
        (
            "Adaptive-Consistency (samples drawn until the leading answer is settled)",
            f"Aggarwal et al.'s Beta stopping rule over the pool's samples in order, at most {pool.k}.",
            (
                ["stop at P(mode)", "expected accuracy", "samples/item", "tokens/item", f"vs vote@{pool.k} [95% CI]"],
                ad_rows,
            ),
        )
    )
    if pool.allocation:
        al_rows = [
            [
                str(a.budget),
                pct(a.vote_accuracy),
                pct(a.accuracy),
                f"{signed_pct(a.diff_vs_vote)} {ci(a.ci_low, a.ci_high)}",
                f"{a.vote_mean_tokens:.0f} / {a.mean_tokens:.0f}",
                str(a.max_samples),
                str(a.capped),
            ]
            for a in pool.allocation
        ]
        out.append(
            (
                "A fixed budget moved between items (UAB) against the uniform vote",
                "Same total samples: the uniform vote gives every item b; UAB gives each one sample, rates its "
                "difficulty by that sample's mean negative log-likelihood (p = exp(-ANLL/0.2)), and hands the rest "
                "out one at a time to the item with the largest p(1-p)^n. Both read the same random orders of each "
                f"item's pool ({UAB_ORDERS} orders); an item can get at most the {pool.k} samples its pool holds "
                "(`capped` counts the times one was passed over for that).",
                (
                    [
                        "samples/item b",
                        "vote@b expected accuracy",
                        "UAB expected accuracy",
                        "UAB vs vote [95% CI]",
                        "tokens/item vote / UAB",
                        "most samples to one item",
                        "capped",
                    ],
                    al_rows,
                ),
            )
        )
    cal_rows = [
        [c.signal, str(c.samples), f"{c.mean_confidence:.3f}", pct(c.accuracy), f"{c.ece:.3f}", f"{c.brier:.3f}"]
        for c in pool.calibration
    ]
    out.append(
        (
            "Calibration of the confidence signals (per sample)",
            "Expected calibration error over 10 equal-width bins and Brier score, each sample's answer scored.",
            (["signal", "samples", "mean confidence", "accuracy of the samples", "ECE", "Brier"], cal_rows),
        )
    )
    return out


def variant_section(report: EvalReport) -> list[Section]:
    if not report.variants:
        return []
    rows = [
        [
            v.protocol,
            v.variant,
            f"{pct(v.accuracy)} ({v.decided}/{v.items} decided)",
            f"{signed_pct(v.diff_vs_protocol)} {ci(v.ci_low, v.ci_high)}",
            "–"
            if v.baseline is None
            else f"{signed_pct(v.diff_vs_baseline)} {ci(v.baseline_ci_low, v.baseline_ci_high)} vs {v.baseline} "
            f"(p = {v.baseline_p_value:.2f})",
        ]
        for v in report.variants
    ]
    return [
        (
            "Decision variants of each debate (no new calls)",
            "Each debate re-decided by other rules over its own transcript (one that stopped after round 1, by that "
            "round): the same calls, "
            "so the same budget. Paired with the debate's own decision and with its equal-budget baseline; an item a "
            "variant cannot decide (no typed answer, no confidence, no log-probabilities) counts as wrong.",
            (
                [
                    "protocol",
                    "variant",
                    "expected accuracy",
                    "vs its own decision [95% CI]",
                    "vs the equal-budget baseline",
                ],
                rows,
            ),
        )
    ]
