"""Typed scoring: read an answer of the item's kind out of a debate's final answer.

Typed turns already constrain the answer (a letter enum, a label enum, a JSON number), so most
final answers are exact. The extraction below also accepts what free-text or judge decisions
produce ("(B)", "B. the option text", "The answer is 42.", "True"); a number is read by
:func:`read_number`, exactly (a fraction), and compared by :func:`same_number`. An answer that
yields nothing of the item's kind is *unextractable*: scored wrong, counted per protocol in the
report, never dropped.
"""

from __future__ import annotations

import re
from fractions import Fraction

from pydantic import BaseModel

from moot.eval.items import EvalItem

_LEAD_LETTER = re.compile(r"^\(?\s*(?:option\s+|answer\s*(?:is)?\s*:?\s*)?([A-Z])\s*(?:[\).:\-]|$|\s)", re.IGNORECASE)
_ANSWER_IS = re.compile(r"\banswer\s*(?:is|:)\s*\(?([A-Z])\b", re.IGNORECASE)
_SYNONYMS = {"true": "yes", "false": "no"}

#: A number as answers write it: a sign (not after a letter, digit or point: "x-5" and "10-2" are
#: not negative), a currency sign before or after the sign, thousands grouped by commas, a decimal
#: part, a fraction (3/4) and an exponent (what a JSON float prints as: 1e-05).
_NUMBER = re.compile(
    r"(?<![\w.])(?P<sign>[-+\u2212])?\s*[$\u20ac\u00a3\u00a5]?\s*(?P<sign2>(?<![\w.])[-+\u2212])?"
    r"(?P<int>(?<!\d)(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?!\d)|(?<!\d)\.\d+)"
    r"(?:\s*/\s*(?P<den>\d+(?:\.\d+)?)(?!\d))?"
    r"(?:[eE](?P<exp>[-+]?\d+)\b)?"
)
#: Where a final answer is announced: the number after the last of these is the answer.
_ANNOUNCED = re.compile(r"(?:\banswer\s*(?:is|was|=|:)|####|\\boxed\{)", re.IGNORECASE)


class Score(BaseModel):
    extracted: str | None
    correct: bool


def extract(item: EvalItem, answer: str | None) -> str | None:
    """The answer in the item's canonical form, or None if it cannot be read."""
    if answer is None:
        return None
    text = " ".join(str(answer).split()).strip()
    if not text:
        return None
    if item.kind == "letter":
        return _letter(item, text)
    if item.kind == "number":
        return _number(text)
    return _label(item, text)


def _letter(item: EvalItem, text: str) -> str | None:
    letters = item.letters
    bare = text.strip(" \"'`*")
    if len(bare) == 1 and bare.upper() in letters:
        return bare.upper()
    lowered = bare.lower().rstrip(".")
    for letter, choice in zip(letters, item.choices, strict=True):
        if lowered == choice.strip().lower().rstrip("."):
            return letter
    m = _LEAD_LETTER.match(bare)
    if m is None:
        m = _ANSWER_IS.search(bare)
    if m is not None and m.group(1).upper() in letters:
        return m.group(1).upper()
    return None


def _number(text: str) -> str | None:
    value = read_number(text)
    return None if value is None else canonical_number(value)


def _to_fraction(m: re.Match[str]) -> Fraction | None:
    value = Fraction(m.group("int").replace(",", ""))
    if m.group("den") is not None:
        den = Fraction(m.group("den"))
        if den == 0:
            return None
        value /= den
    if m.group("exp") is not None:
        value *= Fraction(10) ** int(m.group("exp"))
    signs = (m.group("sign") or "") + (m.group("sign2") or "")
    return -value if signs.count("-") + signs.count("\u2212") == 1 else value


def read_number(text: str | None) -> Fraction | None:
    """The number a numeric answer gives, exactly, or None when it gives none: the one place a
    number item's answer (and its gold answer) is read. It tolerates what worked answers write
    around the number: thousands commas (1,234), units and currency ("18 eggs", "$18", "18 dollars",
    "18%"), a trailing period, a sign (-5, \u22125), decimals (18.0 is 18), fractions (3/4) and
    exponents (1e-05). The number after the last "the answer is" / "answer:" / "####" / "\\boxed{"
    is the answer; without one, the last number ("3 + 4 = 7, so 7" reads 7)."""
    if text is None:
        return None
    text = " ".join(str(text).split())
    announced = list(_ANNOUNCED.finditer(text))
    if announced:
        after = [m for m in _NUMBER.finditer(text, announced[-1].end()) if _to_fraction(m) is not None]
        if after:
            return _to_fraction(after[0])
    found = [v for m in _NUMBER.finditer(text) if (v := _to_fraction(m)) is not None]
    return found[-1] if found else None


def canonical_number(value: Fraction) -> str:
    """A number as the votes write it (:func:`moot.core.answers.normalize_answer`): 18, -2.5."""
    if value.denominator == 1:
        return str(value.numerator)
    return repr(float(value))


def same_number(a: Fraction, b: Fraction) -> bool:
    """Equal, up to a float's rounding (a JSON number's 0.30000000000000004 is 0.3)."""
    return abs(a - b) <= Fraction(1, 10**9) * max(Fraction(1), abs(b))


def _label(item: EvalItem, text: str) -> str | None:
    words = re.findall(r"[a-z]+", text.lower())
    canon = {_SYNONYMS.get(label, label): label for label in item.labels}
    for word in words[:3]:  # "Yes.", "yes, because ...", "The answer: no"
        key = _SYNONYMS.get(word, word)
        if key in canon:
            return canon[key]
    return None


def score(item: EvalItem, answer: str | None) -> Score:
    got = extract(item, answer)
    if got is None:
        return Score(extracted=None, correct=False)
    if item.kind == "number":
        gold, value = read_number(item.answer), read_number(got)
        return Score(extracted=got, correct=gold is not None and value is not None and same_number(value, gold))
    return Score(extracted=got, correct=got == item.answer)
