"""A user's own items: a JSONL file, one item a line, its answer kind (choices, a number, a label
set) read from its answers or declared (``--labels``). The named benchmarks are
:mod:`moot.eval.datasets`, which reads a ``.jsonl`` name through :func:`load_jsonl`."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from moot.eval.items import LETTERS, EvalItem


class DatasetError(Exception):
    """A dataset cannot be read: the message names the problem and the fix, in one line."""


#: Label sets a file's answers are read as without being declared: when every answer without
#: choices belongs to one of these, the items are ``label`` items over the smallest such set (the
#: whole set: a file whose answers are all "yes" still offers "no"). Anything else must be
#: declared: ``"labels": [...]`` on the line, or ``--labels``. How few distinct answers a file
#: has says nothing: twelve names of painters are free text, not a label set.
KNOWN_LABELS: tuple[tuple[str, ...], ...] = (
    ("no", "yes"),
    ("false", "true"),
    ("maybe", "no", "yes"),
    ("false", "neither", "true"),
    ("negative", "positive"),
    ("negative", "neutral", "positive"),
    ("contradiction", "entailment", "neutral"),
)
_KNOWN_TEXT = "yes/no, true/false, yes/no/maybe, true/false/neither, positive/negative(/neutral), entailment/..."


def _labels(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or len(value) < 2 or not all(isinstance(v, str | int | float) for v in value):
        example = "yes,no,maybe" if where == "--labels" else '["yes", "no", "maybe"]'
        raise DatasetError(f"{where}: 'labels' must be a list of at least 2 labels, e.g. {example}")
    labels = [str(v).strip().lower() for v in value]
    if len(set(labels)) != len(labels) or not all(labels):
        raise DatasetError(f"{where}: 'labels' must be distinct, non-empty labels")
    return labels


#: The keys a line of a user's JSONL dataset may have.
JSONL_KEYS = frozenset({"id", "question", "choices", "context", "answer", "labels"})


def load_jsonl(path: Path, labels: list[str] | None = None) -> list[EvalItem]:
    """A user's items: one JSON object per line with ``question``, optional ``choices``, ``context``,
    ``id``, ``labels``, and ``answer`` (for choices: the letter, the 0-based index or the option's
    text).

    An item without choices is a ``number`` item when every such answer is a number, and a
    ``label`` item when its labels are declared (the line's ``labels``, else ``labels`` given here:
    ``--labels``) or when every such answer belongs to one known label set (:data:`KNOWN_LABELS`).
    Anything else is refused: free text cannot be scored exactly, and inferring a label set from the
    gold answers would show the model the answers."""
    from moot.files import InputFileError, check_text, first_error, load_json, read_text, text_lines

    try:
        text = read_text(path, "dataset file")
    except InputFileError as exc:
        raise DatasetError(str(exc)) from None
    declared = _labels(labels, "--labels") if labels is not None else None
    raw: list[dict[str, Any]] = []
    for n, line in enumerate(text_lines(text), 1):
        if not line.strip():
            continue
        try:
            obj = load_json(line)
        except json.JSONDecodeError as exc:
            csv = str(path).lower().endswith(".csv")
            kind = " (moot reads JSONL: one JSON object per line, not CSV)" if csv else ""
            raise DatasetError(f"{path}:{n}: not valid JSON ({exc.msg}){kind}") from None
        try:
            check_text(obj, f"{path}:{n}")
        except InputFileError as exc:
            raise DatasetError(str(exc)) from None
        if not isinstance(obj, dict):
            # A JSON array of items (a .json file, say): moot reads one item per line.
            listed = " (moot reads JSONL: one JSON object per line, not a JSON list)" if isinstance(obj, list) else ""
            raise DatasetError(f"{path}:{n}: each line needs an object with 'question' and 'answer'{listed}")
        unknown = sorted(set(obj) - JSONL_KEYS)
        if unknown:  # as in every input file: an unknown key is refused by name (before a missing one: a typo is both)
            raise DatasetError(
                f"{path}:{n}: unknown key {unknown[0]!r}; a line may have {', '.join(sorted(JSONL_KEYS))}"
            )
        missing = [key for key in ("question", "answer") if key not in obj]
        if missing:
            raise DatasetError(
                f"{path}:{n}: {' and '.join(repr(k) for k in missing)} missing: each line needs 'question' and 'answer'"
            )
        if not str(obj["question"]).strip():
            raise DatasetError(f"{path}:{n}: the question is empty")
        answer = obj["answer"]
        if answer is None or (isinstance(answer, str) and not answer.strip()):
            raise DatasetError(
                f"{path}:{n}: the answer is {'null' if answer is None else 'empty'}; give the gold answer (a choice's "
                "letter, index or text, a number, or a label)"
            )
        if isinstance(answer, dict | list):
            raise DatasetError(
                f"{path}:{n}: the answer is a JSON {'object' if isinstance(answer, dict) else 'list'}; give one gold "
                "answer (a choice's letter, index or text, a number, or a label)"
            )
        if _not_finite(answer):  # (JSON's NaN and Infinity, which Python reads: a gold no reply can match)
            raise DatasetError(f"{path}:{n}: the answer is {answer!r}, not a finite number; give the gold answer")
        if "id" in obj and (
            not isinstance(obj["id"], str | int) or isinstance(obj["id"], bool) or not str(obj["id"]).strip()
        ):
            raise DatasetError(
                f"{path}:{n}: the id is {json.dumps(obj['id'])}; give a non-empty text (or number) unique in the file, "
                "or leave 'id' out (the line is then named after the file and its line number)"
            )
        if obj.get("choices") and "labels" in obj:
            raise DatasetError(
                f"{path}:{n}: 'labels' on a line with 'choices' (a multiple-choice item is answered by a choice's "
                "letter); leave one of them out"
            )
        _check_choices(obj.get("choices"), f"{path}:{n}: item {str(obj.get('id', f'{path.stem}-{n}'))!r}")
        raw.append({**obj, "_line": n})
    if not raw:
        raise DatasetError(f"{path} has no items")
    free = [r for r in raw if not r.get("choices") and "labels" not in r]
    inferred: list[str] = []
    if free and declared is None and not all(_is_number(r["answer"]) for r in free):
        answers = {str(r["answer"]).strip().lower() for r in free}
        fitting: list[tuple[str, ...]] = [ls for ls in KNOWN_LABELS if answers <= set(ls)]
        if not fitting:
            shown = ", ".join(repr(a) for a in sorted(answers)[:4]) + (", ..." if len(answers) > 4 else "")
            raise DatasetError(
                f"{path}: answers without choices must be numbers or labels, and its {len(answers)} distinct "
                f"answers ({shown}) are neither all numbers nor one known label set ({_KNOWN_TEXT}); free-text "
                'answers cannot be scored exactly. If they are labels, declare them: "labels": ["a", "b", ...] on '
                "each line, or --labels a,b,... (the agents are shown them)"
            )
        smallest = min(fitting, key=len)
        inferred = sorted(smallest)
    items = []
    for r in raw:
        where = f"{path}:{r['_line']}"
        try:
            choices = [str(c) for c in r.get("choices") or []]
            answer = r["answer"]
            kwargs: dict[str, Any] = {
                "id": str(r.get("id", f"{path.stem}-{r['_line']}")),
                "question": str(r["question"]),
                "context": r.get("context"),
                "source": path.name,
            }
            item_labels = _labels(r["labels"], where) if "labels" in r else declared or inferred
            if choices:
                items.append(EvalItem(choices=choices, answer=_choice_letter(answer, choices, where), kind="letter",
                                      **kwargs))  # fmt: skip
            elif item_labels:
                label = str(answer).strip().lower()
                if label not in item_labels:
                    raise DatasetError(f"{where}: answer {label!r} is not one of the labels {item_labels}")
                items.append(EvalItem(answer=label, kind="label", labels=item_labels, **kwargs))
            else:
                number = str(answer).replace(",", "").strip()
                if not math.isfinite(float(number)):  # ("nan", "Infinity", "1e999": a gold no reply can match)
                    raise DatasetError(f"{where}: the answer is {answer!r}, not a finite number; give the gold answer")
                items.append(EvalItem(answer=number, kind="number", **kwargs))
        except ValidationError as exc:
            raise DatasetError(f"{where}: {first_error(exc)['msg'].removeprefix('Value error, ')}") from None
    first: dict[str, int] = {}
    given = {r["_line"] for r in raw if "id" in r}
    for item, r in zip(items, raw, strict=True):
        if item.id in first:
            # (a line without an id is named after the file and its line: say so, or the clash reads as
            # two ids the user wrote)
            unnamed = [f"line {line} has no 'id' and is named after its line" for line in (first[item.id], r["_line"])
                       if line not in given]  # fmt: skip
            raise DatasetError(
                f"{path}:{r['_line']}: item id {item.id!r} is used twice (lines {first[item.id]} and {r['_line']}"
                + (f"; {', '.join(unnamed)}" if unnamed else "")
                + "); item ids must be unique"
            )
        first[item.id] = r["_line"]
    return items


def _not_finite(value: Any) -> bool:
    """Whether a value is JSON's ``NaN`` or an ``Infinity`` (which Python's reader takes): a text that
    spells one (an option "infinity") is a text."""
    return isinstance(value, float) and not math.isfinite(value)


def _check_choices(choices: Any, where: str) -> None:
    """A line's ``choices`` (None: a number or label item): a list of 2 to 26 options, each named
    by a letter. An empty list is named as such, not found later as an answer without choices."""
    if choices is None:
        return
    if not isinstance(choices, list):
        raise DatasetError(f'{where}: \'choices\' must be a list of options, e.g. ["red", "blue"]')
    if len(choices) < 2:
        raise DatasetError(
            f"{where}: 'choices' is {json.dumps(choices)}; a multiple-choice item needs at least 2 choices (leave "
            "'choices' out for a number or label answer)"
        )
    if len(choices) > len(LETTERS):
        raise DatasetError(
            f"{where}: {len(choices)} choices, more than the {len(LETTERS)} letters A-Z that name them; give at "
            f"most {len(LETTERS)}"
        )


def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    try:
        float(str(value).replace(",", ""))
    except ValueError:
        return False
    return True


def _choice_letter(answer: Any, choices: list[str], where: str) -> str:
    """The letter of the choice ``answer`` names: its 0-based index, its letter, else its text. An index
    or a letter is read as one even where an option's text is also a letter or a number (moot writes
    the parts of a named benchmark it splits with letters: ARC has an option "C")."""
    if isinstance(answer, int) and not isinstance(answer, bool) and 0 <= answer < len(choices):
        return LETTERS[answer]
    text = str(answer).strip()
    if len(text) == 1 and text.upper() in LETTERS[: len(choices)]:
        return text.upper()
    lowered = [c.strip().lower() for c in choices]
    if text.lower() in lowered:
        return LETTERS[lowered.index(text.lower())]
    n = len(choices)
    raise DatasetError(
        f"{where}: answer {text!r} is neither a letter ({LETTERS[0]}-{LETTERS[n - 1]}), an index (0-{n - 1}) nor the "
        "text of one of the choices"
    )
