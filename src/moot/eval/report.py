"""``moot eval report``: load a run once, analyse it, render it (Markdown, HTML, JSON, figures).

The steps are separate modules, as Inspect AI separates a log from its viewers:
:func:`moot.eval.loaded.load_run` reads the run once into a plain value, :mod:`moot.eval.analysis`
computes the report from it with pure functions, :mod:`moot.eval.render` and :mod:`moot.eval.plots`
render it. The names the analyses and renderers define are re-exported here, where they lived.
"""

from __future__ import annotations

from pathlib import Path

from moot.eval.analysis import (  # noqa: F401  (re-exported)
    _correct,
    _dynamics,
    _mean,
    _paired_gain,
    _pareto,
    expected_correctness,
    seed_spreads,
    summarise,
)
from moot.eval.fair import (  # noqa: F401  (re-exported)
    ADAPTIVE_THRESHOLD,
    BUDGET_SLACK,
    _baseline_key,
    _budget_vote,
    _Fair,
    _fair_comparisons,
    _paired,
)
from moot.eval.goal import GOAL_POINTS, GOAL_TOKEN_SHARE, NON_INFERIORITY, Corrected, corrected_family  # noqa: F401
from moot.eval.loaded import load_run
from moot.eval.plots import plots
from moot.eval.render import _goal, render_markdown  # noqa: F401  (_goal: re-exported for the tests)
from moot.eval.render_html import render_html
from moot.eval.report_model import (
    Comparison,
    EvalReport,
    ParetoPoint,
    ProtocolSummary,
    RoundStat,
    SeedSpread,
)
from moot.models.pricing import PriceTable

__all__ = [
    "Comparison",
    "Corrected",
    "EvalReport",
    "ParetoPoint",
    "ProtocolSummary",
    "RoundStat",
    "SeedSpread",
    "corrected_family",
    "expected_correctness",
    "plots",
    "render_html",
    "render_markdown",
    "seed_spreads",
    "summarise",
    "write_report",
]


def write_report(folder: Path, prices: PriceTable | None = None) -> tuple[EvalReport, list[Path]]:
    """Write report.md, report.html (figures embedded), report.json and the PNGs into ``folder``, a
    run folder (holding ``run.sqlite``, or only ``run.sqlite.gz``), its run loaded once
    (:func:`moot.eval.loaded.load_run`, read-only). A location that holds no eval run raises
    :class:`~moot.eval.loaded.RunReadError` in one line."""
    if folder.exists() and not folder.is_dir():  # a run's file: the report is written into its folder
        raise NotADirectoryError(f"{folder} is a file, not a run folder; give its folder (the report is written there)")
    report = summarise(load_run(folder), prices)
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
