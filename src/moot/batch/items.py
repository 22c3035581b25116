"""The inputs of ``moot batch``: one debate per line.

A ``.jsonl`` file holds one object per line::

    {"id": "c1", "question": "Remote work improves productivity.", "context": ["a passage"], "rounds": 2}

``question`` is required. ``id`` defaults to the line number; ``context`` is a string, a list of
strings or of ``{"text": ..., "source": ...}`` objects (no other key); ``reference`` (a known answer, never shown
to the agents) enables the flip counts in the dynamics; ``rounds``, ``max_tokens``, ``max_calls``
and ``timeout`` override the run's settings for that line. Any other key is an error naming the
line and the key, at any depth (a passage's ``src`` too). A ``.txt`` file (or any other) holds one
question per non-empty line.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from moot.core.types import DebateTask, check_passages, check_question
from moot.files import InputFileError, check_text, first_error, load_json, read_text, text_lines
from moot.protocols.loader import InputPassage, unknown_key_message


class BatchInputError(ValueError):
    """A bad input file or line: the message names the line and the fix."""


class BatchItem(BaseModel):
    """One input of a batch: a question and what goes with it."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    id: str = Field(min_length=1)
    question: str = Field(min_length=1)
    context: list[InputPassage] = Field(default_factory=list)
    reference: str | None = None
    rounds: int | None = Field(default=None, ge=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_calls: int | None = Field(default=None, ge=1)
    timeout_s: float | None = Field(default=None, gt=0, alias="timeout")

    @field_validator("id", mode="before")
    @classmethod
    def _id_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("context", mode="before")
    @classmethod
    def _context_list(cls, value: Any) -> Any:
        if value is None:
            return []
        items = [value] if isinstance(value, str | dict) else value
        if not isinstance(items, list):
            return value
        return [{"text": v} if isinstance(v, str) else v for v in items]

    @field_validator("question")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        return check_question(value)

    @field_validator("context")
    @classmethod
    def _no_blank_passage(cls, value: list[InputPassage]) -> list[InputPassage]:
        check_passages(list(value))
        return value

    def task(self) -> DebateTask:
        return DebateTask(question=self.question, context=list(self.context), reference=self.reference)


def _line_error(where: str, exc: ValidationError) -> BatchInputError:
    err = first_error(exc)
    loc = ".".join(str(x) for x in err["loc"])
    if err["type"] == "extra_forbidden":
        return BatchInputError(f"{where}: {unknown_key_message(BatchItem, tuple(err['loc']), top='a line')}")
    if err["type"] == "missing":
        return BatchInputError(f"{where}: {loc!r} is required")
    return BatchInputError(f"{where}: {loc}: {err['msg'].removeprefix('Value error, ')}")


def make_items(rows: Iterable[str | Mapping[str, Any] | BatchItem], source: str = "input") -> list[BatchItem]:
    """Items from questions, objects or items; a missing id is the 1-based position (in a file:
    the line number)."""
    items: list[BatchItem] = []
    for n, row in enumerate(rows, 1):
        where = f"{source} line {n}" if source != "input" else f"input {n}"
        if isinstance(row, BatchItem):
            items.append(row)
            continue
        data: dict[str, Any] = {"question": row} if isinstance(row, str) else dict(row)
        data.setdefault("id", str(n))
        try:
            items.append(BatchItem.model_validate(data))
        except ValidationError as exc:
            raise _line_error(where, exc) from None
    seen: dict[str, int] = {}
    for n, item in enumerate(items, 1):
        if item.id in seen:
            raise BatchInputError(
                f"{source}: id {item.id!r} is used twice (entries {seen[item.id]} and {n}); ids must be unique"
            )
        seen[item.id] = n
    if not items:
        raise BatchInputError(f"{source} has no questions")
    return items


def load_items(path: Path) -> list[BatchItem]:
    """Read a batch input file (``.jsonl`` or ``.ndjson``: objects; ``.json`` is refused, naming the
    fix; anything else: one question per line)."""
    if path.suffix.lower() == ".json":  # (each of its lines was a debate: "[", '{"question": ...},', "]")
        raise BatchInputError(
            f"{path} is a .json file; give the inputs one JSON object per line in a .jsonl file (or a text "
            "file, one question per line)"
        )
    try:
        text = read_text(path, "input file")  # UTF-8 (a BOM is read), else one line naming the file
    except InputFileError as exc:
        raise BatchInputError(str(exc)) from None
    numbered = [(n, line) for n, line in enumerate(text_lines(text), 1) if line.strip()]
    if path.suffix.lower() not in (".jsonl", ".ndjson"):
        return make_items([{"id": str(n), "question": line.strip()} for n, line in numbered], source=str(path))
    rows: list[dict[str, Any]] = []
    for n, line in numbered:
        try:
            value = load_json(line)
        except json.JSONDecodeError as exc:
            raise BatchInputError(f"{path} line {n} is not valid JSON: {exc.msg}") from None
        try:
            check_text(value, f"{path} line {n}")
        except InputFileError as exc:
            raise BatchInputError(str(exc)) from None
        if isinstance(value, str):
            value = {"question": value}
        if not isinstance(value, dict):
            raise BatchInputError(f"{path} line {n}: expected an object with a 'question', got {type(value).__name__}")
        value.setdefault("id", str(n))
        try:
            BatchItem.model_validate(value)
        except ValidationError as exc:
            raise _line_error(f"{path} line {n}", exc) from None
        rows.append(value)
    return make_items(rows, source=str(path))
