"""The report's cells: shares, signed differences and intervals as the Markdown and HTML reports
write them, and a section's form (:data:`Section`)."""

from __future__ import annotations

import math

#: A report section: its title, its text, and its table (head, rows) if it has one.
Section = tuple[str, str, tuple[list[str], list[list[str]]] | None]


def pct(x: float | None) -> str:
    """A share as a percentage with one decimal; a dash for none (None, or NaN: nothing measured)."""
    return "–" if x is None or math.isnan(x) else f"{100 * x:.1f}%"


def signed_pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:+.1f}"


def ci(lo: float | None, hi: float | None) -> str:
    return "–" if lo is None or hi is None else f"[{signed_pct(lo)}, {signed_pct(hi)}]"
