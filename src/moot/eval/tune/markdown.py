"""``tune.md``: the tune's report in Markdown."""

from __future__ import annotations

from moot.eval.render import model_title
from moot.eval.render_cells import pct
from moot.eval.tune.analyse import TuneReport


def optimism_text(optimism: float) -> str:
    """The tuning estimate against the held-out accuracy, worded by its sign (a choice can do
    better on the held-out items than on those it was chosen on: that is chance, not a cost)."""
    points = round(100 * optimism, 1)
    if points > 0:
        return (
            f"the tuning items' estimate overstated the held-out accuracy by {points:.1f} points (the price of "
            "choosing on them)"
        )
    if points < 0:
        return (
            f"the tuning items' estimate understated the held-out accuracy by {-points:.1f} points (the choice did "
            "better on the held-out items than on those it was chosen on: chance, not a cost of choosing)"
        )
    return "the tuning items' estimate matched the held-out accuracy (to 0.1 points)"


def render_markdown(report: TuneReport, tuned: str = "tuned.yaml") -> str:
    """tune.md; ``tuned``: the tuned file as its commands name it (tune.md, beside it: ``tuned.yaml``;
    the terminal: its path from where the command ran)."""
    cfg = report.config
    lines = [
        f"# moot tune: {cfg.data}",
        "",
        f"- model `{cfg.model}`{model_title(cfg.model)}; objective **{cfg.objective}**"
        + (f", budget {cfg.budget} per item" if cfg.budget else ", no budget")
        + f", margin {100 * cfg.margin:g} points",
        f"- split (seed {cfg.seed}): {len(report.split.tuning)} tuning items, {len(report.split.held_out)} held out; "
        f"data {report.split.data_fingerprint}",
        f"- **chosen: `{report.chosen}`**: {report.reason}.",
    ]
    h = report.held_out
    if h is not None:
        lines.append(
            f"- on the {h.items} held-out items: {pct(h.accuracy)} [{pct(h.ci_low)}, {pct(h.ci_high)}]"
            + (f" against {h.baseline} {pct(h.baseline_accuracy)}: {100 * h.diff:+.1f} points "
               f"[{100 * h.diff_ci_low:+.1f}, {100 * h.diff_ci_high:+.1f}], paired"
               if h.baseline is not None and h.baseline_accuracy is not None and h.diff is not None
               and h.diff_ci_low is not None and h.diff_ci_high is not None
               else ", with no vote at its budget to compare with")
            + f"; {h.mean_calls:.1f} calls and {h.mean_tokens:.0f} tokens an item."
        )  # fmt: skip
    if h is not None and h.seen_before:
        lines.append(
            f"- **not a fresh confirmation:** an earlier tune of this folder had already run "
            f"{', '.join(f'`{p}`' for p in h.seen_before)} on these held-out items, and those results could be "
            "seen before this choice was made. Confirm it on items no run of this folder has touched (new "
            "labelled data)."
        )
    if report.optimism is not None:
        lines.append(f"- {optimism_text(report.optimism)}.")
    # With no budget every candidate fits: the column would say nothing.
    fits = " fits the budget |" if cfg.budget else ""
    lines += ["", "## The candidates on the tuning items", "",
              f"| candidate | accuracy (expected over tie-breaks) | 95% CI | calls/item | tokens/item |{fits}",
              "|---|---|---|---|---|" + ("---|" if fits else "")]  # fmt: skip
    ranked = [c for c in report.candidates if not c.all_failed]
    for c in sorted(ranked, key=lambda c: -c.accuracy):
        lines.append(f"| {c.label} | {pct(c.accuracy)} | [{pct(c.ci_low)}, {pct(c.ci_high)}] | {c.mean_calls:.2f} "
                     f"| {c.mean_tokens:.0f} |" + (f" {'yes' if c.fits else 'no'} |" if fits else ""))  # fmt: skip
    failed = [c for c in report.candidates if c.all_failed]
    if failed:
        lines += ["", "**Failed on every tuning item** (no accuracy measured: not ranked, never chosen):", ""]
        lines += [f"- `{c.label}` failed: {c.failure}" for c in failed]
    partly = [c for c in ranked if c.failed]
    if partly:
        lines += ["", "Failed on some tuning items (each counted wrong in its accuracy):", ""]
        lines += [f"- `{c.label}` failed on {c.failed} of {c.items} items: {c.failure}" for c in partly]
    lines += [
        "",
        f"Run it: `moot debate -p {tuned} ...`; serve it: `moot serve --tuned {tuned}` (as `moot/auto`).",
        "",
    ]
    return "\n".join(lines)
