"""Seed 004's quality section of the report, rendered: Markdown and HTML tables with every column
explained, and the validation table (the analyses are :mod:`moot.eval.quality`)."""

from __future__ import annotations

import html
from collections.abc import Sequence

from moot.core.types import QUALITY_DIMENSIONS
from moot.eval.quality import POOLED, AurocRow, QualitySection, QualityValidation, TargetRow
from moot.quality.judge import RUBRIC_VERSION
from moot.quality.measures import ONE_AGENT, ONE_ANSWER

# ------------------------------------------------------------------------------------ render

#: What each quality column means, in a line (the definitions: docs/quality.md).
DIMENSION_NOTES = {
    "logical_consistency": "the judge's 1-5 level of consistency, as (level - 1) / 4",
    "evidence_quality": "how far the evidence items are found in the context passages the debate was given",
    "argument_diversity": "the mean word distance between arguments of different debaters",
    "consensus_quality": "the share of the last round's answers that equal the decision",
    "decision_confidence": "the decision's stated confidence, or a vote's winning share",
    "reasoning_depth": "the judge's 1-5 level of reasoning depth, as (level - 1) / 4",
    "overall_quality": "the mean of the seed's five (all but reasoning depth) that were measured",
}

TARGET_HEAD = [
    "metric", "protocol", "measured [95% CI]", "n", "phase 1 target", "phase 1 verdict", "phase 2 target",
    "phase 2 verdict", "seed's single-agent baseline", "how",
]  # fmt: skip

Table = tuple[str, list[str], list[list[str]], list[str]]
"""A rendered table: its title, header, rows, and the notes under it."""


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


class _Reasons:
    """Numbered footnotes for the cells of a dimension that was not measured: one note per reason,
    naming the protocols it applies to. A dimension trivial for one agent reads "n/a — one agent"."""

    def __init__(self) -> None:
        self.numbers: dict[str, int] = {}
        self.where: dict[str, list[str]] = {}

    def cell(self, reason: str | None, protocol: str) -> str:
        reason = reason or "not measured"
        head = reason.split(":", 1)[0] if reason.startswith((ONE_AGENT, ONE_ANSWER)) else "not measured"
        number = self.numbers.setdefault(reason, len(self.numbers) + 1)
        where = self.where.setdefault(reason, [])
        if protocol not in where:
            where.append(protocol)
        return f"{head} ({number})"

    def notes(self, protocols: Sequence[str]) -> list[str]:
        """One line per reason, naming its protocols (``protocols``: every row of the table)."""
        out = []
        for reason, n in sorted(self.numbers.items(), key=lambda kv: kv[1]):
            where = self.where[reason]
            named = "every protocol" if set(protocols) <= set(where) else ", ".join(f"`{p}`" for p in where)
            out.append(f"({n}) {reason} (for {named})")
        return out


def _quality_table(section: QualitySection) -> Table:
    dims = list(QUALITY_DIMENSIONS)
    reasons = _Reasons()
    rows = []
    for p in section.protocols:
        cells = []
        for d in p.dimensions:
            if d.mean is None:
                cells.append(reasons.cell(d.reason, p.label))
            else:
                part = "" if d.measured == d.debates else f", {d.measured}/{d.debates}"
                cells.append(f"{d.mean:.2f} [{d.ci_low:.2f}, {d.ci_high:.2f}{part}]")
        rows.append([p.label, *cells])
    notes = [
        "Each cell: the mean over the protocol's finished debates where the dimension was measured, its 95% "
        "interval, and how many debates that was when not all. A dimension is not measured where it cannot be, "
        "or where it would be trivial: for one agent, one answer agrees with itself and a one-ballot vote has a "
        "winning share of 1, so those cells read n/a rather than 1.00. Columns: "
        + "; ".join(f"{d}: {DIMENSION_NOTES[d]}" for d in dims)
        + ". The overall score averages different dimensions for different protocols (see the notes), so it "
        "ranks protocols only where the same ones were measured; whether each dimension predicts a right "
        "decision is in the next table. Definitions: docs/quality.md.",
        *reasons.notes([p.label for p in section.protocols]),
    ]
    return ("Debate quality (seed 004)", ["protocol", *dims], rows, notes)


def validation_table(v: QualityValidation | None) -> Table:
    """The validation as a table: a row per protocol (and the pooled one), a column per dimension that
    was measured for some debate, the notes under it."""
    title = "Does a quality dimension predict a right decision? (AUROC)"
    if v is None:
        return (title, [], [], ["Not computed: it needs numpy (`pip install 'moot[eval]'`)."])
    by_dim: dict[str, list[AurocRow]] = {}
    for row in v.rows:
        by_dim.setdefault(row.dimension, []).append(row)
    shown = [d for d in QUALITY_DIMENSIONS if any(r.measured for r in by_dim.get(d, []))]
    hidden = [d for d in QUALITY_DIMENSIONS if d in by_dim and d not in shown]
    protocols = list(dict.fromkeys(r.protocol for r in v.rows))
    cell: dict[tuple[str, str], AurocRow] = {(r.dimension, r.protocol): r for r in v.rows}
    reasons = _Reasons()
    rows = []
    for label in protocols:
        first = cell.get((QUALITY_DIMENSIONS[0], label))
        cells = [label, str(first.debates) if first is not None else "–"]
        for d in shown:
            r = cell.get((d, label))
            if r is None or not r.measured:
                cells.append(reasons.cell(r.note if r is not None else None, label))
            elif r.auroc is None:
                cells.append(f"– ({r.note})")
            else:
                part = "" if r.measured == r.debates else f", {r.measured}/{r.debates}"
                cells.append(f"{r.auroc:.2f} [{_num(r.ci_low)}, {_num(r.ci_high)}{part}]")
        rows.append(cells)
    notes = [
        "Each cell: the AUROC of the dimension as a predictor that the protocol's decision is right, over its "
        "finished debates where the dimension was measured: the probability that a debate whose decision is right "
        "scores higher than one whose decision is wrong (a tie counts half). 0.50 is chance, 1.00 a perfect "
        "predictor, below 0.50 a predictor the wrong way round (higher scores, more wrong decisions). In brackets: "
        f"the 95% percentile bootstrap interval over items ({v.resamples} resamples, seed {v.seed}), and how many "
        f"debates were measured when not all. `{POOLED}` pools every protocol's debates (resampling items, each "
        "with all its debates). `debates`: the protocol's finished debates. Re-derive with "
        "`moot quality validate RUN`.",
        *reasons.notes(protocols),
    ]
    if hidden:
        why = {d: next((r.note for r in by_dim[d] if r.note), "not measured") for d in hidden}
        notes.append("Not shown, measured for no debate of this run: " + "; ".join(f"{d} ({why[d]})" for d in hidden))
    return (title, ["protocol", "debates", *shown], rows, notes)


def _tables(section: QualitySection) -> list[Table]:
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
    tables: list[Table] = [_quality_table(section)]
    tables.append(validation_table(section.validation))
    tables += [
        (
            "Seed 004's performance targets",
            TARGET_HEAD,
            target_rows,
            [
                "Columns: the metric and the debate protocol it is measured for (baselines have no targets); the "
                "value with its 95% interval and the number of items or debates it is over; the seed's phase 1 and "
                "phase 2 targets, each with its verdict (met when the whole interval is past the target, not met "
                "when the whole interval falls short of it, inconclusive otherwise, not measured without a value); "
                "the value seed 004 states for a single agent, as written in the seed (not measured here: this "
                "run's own `single` is in the comparison table below); how the value was measured, or why it was "
                "not."
            ],
        ),
        (
            "Comparison with a single agent (seed 004)",
            ["metric", "protocol", "debate", "single", "gain [95% CI]", "n", "how"],
            comparison_rows,
            [
                "Columns: the metric; the debate protocol; its value and this run's `single` protocol's on the same "
                "items; the gain of the debate over single (positive: the debate is better) with its 95% interval; "
                "the items compared; how it was measured."
            ],
        ),
        (
            "Cost per debate",
            ["protocol", "items", "tokens/item", "USD/item", "vs single (tokens)", "vs single (USD)", "note"],
            cost_rows,
            [
                "Columns: the protocol; its finished items; mean tokens and US dollars per item; its cost over "
                "`single`'s on the items both finished, in tokens and in dollars; a note when a price or "
                "`single` is missing."
            ],
        ),
    ]
    return tables


def _notes(section: QualitySection) -> list[str]:
    judge = (
        f"The judged dimensions (logical consistency, reasoning depth) are by {', '.join(section.judges)}, rubric "
        f"{RUBRIC_VERSION}."
        if section.judges
        else "No judge has scored this run, so logical consistency and reasoning depth are not measured "
        "(`moot eval judge RUN --judge-model MODEL`)."
    )
    return [
        judge,
        "Targets: relative gains use a seeded paired bootstrap over the items both protocols finished; means the "
        "normal interval; the consensus rate Wilson's (a debate with one answer is not counted: it agrees with "
        "itself).",
        f"Cost: the run's model `{section.model}` at the prices given (embedded models cost 0); the ratio to a single "
        "call is against the `single` protocol on the items both finished.",
    ]


def render_quality_markdown(section: QualitySection | None) -> list[str]:
    if section is None:
        return []
    parts: list[str] = []
    for title, head, rows, notes in _tables(section):
        parts += [f"## {title}", ""]
        if head:
            parts += ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
            parts += ["| " + " | ".join(r) + " |" for r in rows]
            parts.append("")
        for note in notes:
            parts += [note, ""]
    parts += [*_notes(section), ""]
    return parts


def render_quality_html(section: QualitySection | None) -> list[str]:
    if section is None:
        return []
    parts = []
    for title, head, rows, notes in _tables(section):
        parts.append(f"<h2>{html.escape(title)}</h2>")
        if head:
            th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
            body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
            parts.append(f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>")
        parts += [f"<p>{html.escape(n)}</p>" for n in notes]
    parts += [f"<p>{html.escape(n)}</p>" for n in _notes(section)]
    return parts
