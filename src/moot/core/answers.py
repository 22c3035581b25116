"""Typed answer extraction for votes, consensus and scoring: never a substring test.

An answer is read from a typed turn's field (``answer`` by default) and normalised, so that
``"(B)"``, ``"b."`` and ``"B"`` agree, ``"1,000"`` and ``"1000.0"`` agree, and ``"Yes."`` and
``True`` agree. A free-text turn has no extracted answer: it does not vote.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from moot.core.types import Turn

_LETTER = re.compile(r"^\(?\s*(?:option\s+|answer\s*:?\s*)?([a-j])\s*[\).:]?$", re.IGNORECASE)
_NUMBER = re.compile(r"^[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?$")
_YES = {"yes", "true", "y", "correct", "supported"}
_NO = {"no", "false", "n", "incorrect", "refuted"}


def normalize_answer(value: Any) -> str | None:
    """A canonical string for comparing answers, or None if there is no answer."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        return _canonical_number(str(value))
    text = " ".join(str(value).split()).strip()
    if not text:
        return None
    bare = text.strip(" \"'`*").rstrip(".!")
    if (m := _LETTER.match(bare)) is not None:
        return m.group(1).upper()
    low = bare.lower()
    if low in _YES:
        return "yes"
    if low in _NO:
        return "no"
    money = low.lstrip("$€£").rstrip("%")
    if money and any(c.isdigit() for c in money) and _NUMBER.match(money):
        return _canonical_number(money)
    return low


def _canonical_number(text: str) -> str:
    value = float(text.replace(",", ""))
    if value.is_integer():
        return str(int(value))
    return repr(value)


def answer_of(turn: Turn, field: str = "answer") -> str | None:
    """The normalised answer of a typed turn, or None (free text, parse failure, error)."""
    if not turn.ok or turn.parsed is None:
        return None
    return normalize_answer(turn.parsed.get(field))


def confidence_of(turn: Turn, field: str = "confidence") -> float | None:
    if not turn.ok or turn.parsed is None:
        return None
    value = turn.parsed.get(field)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return max(0.0, min(1.0, float(value)))
    return None
