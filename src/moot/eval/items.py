"""The one normalised evaluation item, its typed answer schema and the debate task it becomes.

Every dataset is read into :class:`EvalItem`. An item's *kind* decides how its answer is asked for
and scored: ``letter`` (multiple choice, answered with the option's letter), ``number`` (a numeric
answer) or ``label`` (one of a closed set: yes/no, yes/no/maybe, true/false/neither, ...). Agents
answer through a JSON schema whose ``answer`` field is typed by the kind (an enum of the item's
letters or labels, a JSON number), so that grammar-constrained backends can only produce an answer
the scorer can read.
"""

from __future__ import annotations

import string
from typing import Any, Literal

from pydantic import BaseModel, Field, create_model, model_validator

from moot.core.schemas import Confidence
from moot.core.types import ContextChunk, DebateTask
from moot.structured import get_schema, register_schema

AnswerKind = Literal["letter", "number", "label"]
LETTERS = string.ascii_uppercase


class EvalItem(BaseModel):
    """One benchmark item, whatever its source."""

    id: str = Field(min_length=1)
    question: str = Field(min_length=1)
    choices: list[str] = Field(default_factory=list)
    context: str | None = None
    #: The gold answer in canonical form: a letter (``letter``), a number as text (``number``) or
    #: one of ``labels`` in lower case (``label``).
    answer: str
    kind: AnswerKind
    labels: list[str] = Field(default_factory=list)
    source: str = ""

    @model_validator(mode="after")
    def _consistent(self) -> EvalItem:
        if self.kind == "letter":
            if len(self.choices) < 2:
                raise ValueError(f"item {self.id}: a multiple-choice item needs at least 2 choices")
            if self.answer not in self.letters:
                raise ValueError(f"item {self.id}: answer {self.answer!r} is not one of {''.join(self.letters)}")
        elif self.kind == "label":
            if self.answer not in self.labels:
                raise ValueError(f"item {self.id}: answer {self.answer!r} is not one of {self.labels}")
        else:
            try:
                float(self.answer.replace(",", ""))
            except ValueError:
                raise ValueError(f"item {self.id}: answer {self.answer!r} is not a number") from None
        return self

    @property
    def letters(self) -> list[str]:
        return list(LETTERS[: len(self.choices)])


def reasoning_limit(kind: AnswerKind) -> int:
    """The most characters an answer's ``reasoning`` (a verdict's ``rationale``) may have: the schema's
    ``maxLength``, which grammar-constrained decoding enforces by closing the string there."""
    # The reasoning field is required and comes first, so that grammar-constrained decoding makes
    # small models think before they answer (left optional, they skip it and guess).
    # Arithmetic word problems need room to work; a choice or a label needs a sentence or two.
    return 1200 if kind == "number" else 600


def answer_schema_name(item: EvalItem) -> str:
    """The registered turn schema for this item's answer (created on first use)."""
    if item.kind == "letter":
        name = f"eval-answer-letter-{''.join(item.letters)}"
    elif item.kind == "label":
        name = f"eval-answer-label-{'|'.join(item.labels)}"
    else:
        name = "eval-answer-number"
    try:
        get_schema(name)
    except KeyError:
        register_schema(name, _build_answer_schema(item, verdict=False))
        register_schema(name.replace("eval-answer", "eval-verdict"), _build_answer_schema(item, verdict=True))
        register_schema(
            name.replace("eval-answer", "eval-direct"), _build_answer_schema(item, verdict=False, direct=True)
        )
    return name


def direct_schema_name(item: EvalItem) -> str:
    """The item's answer alone, typed, without reasoning (for the ``direct`` baseline)."""
    return answer_schema_name(item).replace("eval-answer", "eval-direct")


def verdict_schema_name(item: EvalItem) -> str:
    return answer_schema_name(item).replace("eval-answer", "eval-verdict")


def _build_answer_schema(item: EvalItem, *, verdict: bool, direct: bool = False) -> type[BaseModel]:
    answer_type: Any
    if item.kind == "letter":
        answer_type = Literal[tuple(item.letters)]
        describe = "the letter of the correct option"
    elif item.kind == "label":
        answer_type = Literal[tuple(item.labels)]
        describe = "one of: " + ", ".join(item.labels)
    else:
        answer_type = float
        describe = "the final numeric answer only, as a JSON number"
    limit = reasoning_limit(item.kind)
    fields: dict[str, Any]
    if direct:
        fields = {"answer": (answer_type, Field(description=describe))}
    elif verdict:
        fields = {
            "rationale": (str, Field(min_length=1, max_length=limit, description="why this answer")),
            "answer": (answer_type, Field(description=describe)),
            "confidence": (Confidence, Field(default=0.5, ge=0, le=1, description="how sure you are, 0 to 1")),
        }
    else:
        fields = {
            "reasoning": (str, Field(min_length=1, max_length=limit, description="step-by-step reasoning, brief")),
            "answer": (answer_type, Field(description=describe)),
            "confidence": (Confidence, Field(ge=0, le=1, description="how sure you are, 0 to 1")),
        }
    title = "EvalDirect" if direct else "EvalVerdict" if verdict else "EvalAnswer"
    model: type[BaseModel] = create_model(title, **fields)
    return model


def render_question(item: EvalItem) -> str:
    """The question as the agents read it: options lettered, the expected answer form named."""
    parts = [item.question.strip()]
    if item.kind == "letter":
        parts.append("\n".join(f"{letter}. {text}" for letter, text in zip(item.letters, item.choices, strict=True)))
        parts.append(f"Answer with the letter of the correct option ({', '.join(item.letters)}).")
    elif item.kind == "label":
        parts.append(f"Answer with one of: {', '.join(item.labels)}.")
    else:
        # Not "the final number only", which contradicts the reasoning field the schema asks first.
        parts.append("Work it out step by step in your reasoning, then give the final number as the answer.")
    return "\n\n".join(parts)


def to_task(item: EvalItem) -> DebateTask:
    """The debate task for an item. The gold answer goes into ``reference``, which agents never
    see: the engine uses it only for the dynamics (per-round correctness and flips)."""
    context = [ContextChunk(text=item.context, source=item.source or None)] if item.context else []
    return DebateTask(question=render_question(item), context=context, reference=item.answer)
