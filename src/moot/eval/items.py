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

from moot.core.schemas import ANSWER_FORMS, REASONING_ROOM, AnswerForm, Confidence, answer_model
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
            if len(self.choices) > len(LETTERS):
                raise ValueError(
                    f"item {self.id}: {len(self.choices)} choices, more than the {len(LETTERS)} letters A-Z that "
                    f"name them; give at most {len(LETTERS)}"
                )
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


def reasoning_limit(kind: AnswerKind, form: AnswerForm | None = None) -> int:
    """The most characters an answer's ``reasoning`` (a verdict's ``rationale``) may have in ``form``
    (the presets' brief one by default): the schema's ``maxLength``, which grammar-constrained
    decoding enforces by closing the string there."""
    # Arithmetic word problems need the form's whole room to work; a choice or a label needs half
    # (a sentence or two in the brief form: 600 characters).
    room = REASONING_ROOM[(form or BRIEF).reasoning]
    return room if kind == "number" else room // 2


#: The presets' form (``reasoned-answer``): its item schemas keep the names and the bytes that the
#: committed runs sent, so their request caches still answer.
BRIEF = AnswerForm("brief", True)


def answer_schema_name(item: EvalItem, form: AnswerForm = BRIEF) -> str:
    """The registered turn schema for this item's answer in ``form`` (created on first use): the
    turn's generic answer schema (:data:`moot.core.schemas.ANSWER_FORMS`) with the item's typed answer."""
    if item.kind == "letter":
        name = f"eval-answer-letter-{''.join(item.letters)}"
    elif item.kind == "label":
        name = f"eval-answer-label-{'|'.join(item.labels)}"
    else:
        name = "eval-answer-number"
    base = name
    if form != BRIEF:
        name += f"~{form.reasoning}" + ("" if form.confidence else "~no-confidence")
    try:
        get_schema(name)
    except KeyError:
        register_schema(name, _build_answer_schema(item, form))
        if form == BRIEF:
            register_schema(base.replace("eval-answer", "eval-verdict"), _build_verdict_schema(item))
            register_schema(base.replace("eval-answer", "eval-direct"), _build_direct_schema(item))
    return name


def register_item_schemas(item: EvalItem) -> None:
    """Every typed schema an item's protocols may name (in the process that runs them: a Ray worker too)."""
    for form in set(ANSWER_FORMS.values()):
        answer_schema_name(item, form)


def direct_schema_name(item: EvalItem) -> str:
    """The item's answer alone, typed, without reasoning (for the ``direct`` baseline)."""
    return answer_schema_name(item).replace("eval-answer", "eval-direct")


def verdict_schema_name(item: EvalItem) -> str:
    return answer_schema_name(item).replace("eval-answer", "eval-verdict")


def _typed_answer(item: EvalItem) -> tuple[Any, str]:
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
    return answer_type, describe


def _build_answer_schema(item: EvalItem, form: AnswerForm) -> type[BaseModel]:
    answer_type, describe = _typed_answer(item)
    reasoning = "step-by-step reasoning, brief" if form.reasoning != "explained" else None
    return answer_model(
        form,
        (answer_type, Field(description=describe)),
        title="EvalAnswer",
        room=reasoning_limit(item.kind, form),
        describe=reasoning,
    )


def _build_verdict_schema(item: EvalItem) -> type[BaseModel]:
    answer_type, describe = _typed_answer(item)
    limit = reasoning_limit(item.kind, BRIEF)
    model: type[BaseModel] = create_model(
        "EvalVerdict",
        rationale=(str, Field(min_length=1, max_length=limit, description="why this answer")),
        answer=(answer_type, Field(description=describe)),
        confidence=(Confidence, Field(default=0.5, ge=0, le=1, description="how sure you are, 0 to 1")),
    )
    return model


def _build_direct_schema(item: EvalItem) -> type[BaseModel]:
    answer_type, describe = _typed_answer(item)
    model: type[BaseModel] = create_model("EvalDirect", answer=(answer_type, Field(description=describe)))
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
