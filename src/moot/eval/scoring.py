"""Typed scoring: read an answer of the item's kind out of a debate's final answer.

Typed turns already constrain the answer (a letter enum, a label enum, a JSON number), so most
final answers are exact. The extraction below also accepts what free-text or judge decisions
produce ("(B)", "B. the option text", "The answer is 42.", "True"). An answer that yields nothing
of the item's kind is *unextractable*: scored wrong and counted separately.
"""

from __future__ import annotations

import re

from pydantic import BaseModel

from moot.core.answers import normalize_answer
from moot.eval.items import EvalItem

_LEAD_LETTER = re.compile(r"^\(?\s*(?:option\s+|answer\s*(?:is)?\s*:?\s*)?([A-Z])\s*(?:[\).:\-]|$|\s)", re.IGNORECASE)
_ANSWER_IS = re.compile(r"\banswer\s*(?:is|:)\s*\(?([A-Z])\b", re.IGNORECASE)
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_SYNONYMS = {"true": "yes", "false": "no"}


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
    found = _NUMBER.findall(text.replace("$", "").replace("€", "").replace("£", ""))
    if not found:
        return None
    return normalize_answer(found[-1])  # the last number: "... 3 + 4 = 7, so 7" reads 7


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
        gold = normalize_answer(item.answer)
        try:
            correct = abs(float(got) - float(gold or "nan")) <= 1e-9 * max(1.0, abs(float(gold or "0")))
        except ValueError:
            correct = False
        return Score(extracted=got, correct=correct)
    return Score(extracted=got, correct=got == item.answer)
