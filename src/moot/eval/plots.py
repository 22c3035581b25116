"""The report's figures (matplotlib, the ``eval`` extra): accuracy against tokens, by round, flips."""

from __future__ import annotations

import io
from typing import Any

from moot.eval.report_model import EvalReport

#: What a report without figures says, where matplotlib is not installed.
NO_FIGURES = "the figures are left out: they need matplotlib (pip install 'moot[eval]')"


def figures_available() -> bool:
    """Whether :func:`plots` can draw (matplotlib is installed), without importing it."""
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None


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
