"""Built-in turn and verdict schemas, registered by name for specs and YAML files."""

from __future__ import annotations

from typing import Annotated, Any, Literal, NamedTuple

from pydantic import BaseModel, BeforeValidator, Field, create_model

from moot.structured import register_schema


def percent_as_fraction(value: Any) -> Any:
    """Read a stated confidence leniently, so an answer is never lost over its confidence.

    Small models often state a confidence as a percentage (``95``) although the schema asks for 0 to
    1, so a number in (1, 100] is read as a percentage. llama.cpp's grammar cannot bound a number, so
    a negative confidence (seen from qwen2.5-0.5b on GSM8K) reads as 0 and one above 100 as 1.
    Anything that is not a number is left for validation."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return value
    if value < 0:
        return 0.0
    if value > 100:
        return 1.0
    if value > 1:
        return value / 100
    return value


#: A model's stated confidence, 0 to 1 (read leniently, see :func:`percent_as_fraction`).
Confidence = Annotated[float, BeforeValidator(percent_as_fraction)]


class AnswerTurn(BaseModel):
    """A short answer with a confidence: what votes, consensus and scoring read. Its reasoning may
    be left empty (``schema: answer``, for specs of your own); the presets ask for a
    :data:`ANSWER_FORMS` schema whose reasoning is required."""

    reasoning: str = Field(default="", max_length=1200, description="brief reasoning")
    answer: str = Field(max_length=200, description="the answer only: a number, a letter, yes/no or a few words")
    confidence: Confidence = Field(ge=0, le=1, description="how sure you are, 0 to 1")


class DirectAnswer(BaseModel):
    """The answer alone, no reasoning: one short pass (the "answer directly" baseline)."""

    answer: str = Field(max_length=200, description="the answer only")


class Candidates(BaseModel):
    """The distinct candidate answers found in a debate (the first step of MAD's judge)."""

    candidates: list[str] = Field(max_length=8)


class JudgeVerdict(BaseModel):
    """A judge's pick with its reasons."""

    answer: str = Field(max_length=200)
    rationale: str = Field(default="", max_length=1200)
    confidence: Confidence = Field(default=0.5, ge=0, le=1)


class AnswerForm(NamedTuple):
    """What an answer turn must hold besides its answer: its reasoning (``optional``; ``brief``,
    required, up to 1,200 characters; ``explained``, required, up to 6,000: room for a worked
    solution) and whether it states a confidence."""

    reasoning: Literal["optional", "brief", "explained"] = "brief"
    confidence: bool = True


#: The most characters of reasoning each form allows.
REASONING_ROOM = {"optional": 1200, "brief": 1200, "explained": 6000}
CONFIDENCE_FIELD: tuple[Any, Any] = (Confidence, Field(ge=0, le=1, description="how sure you are, 0 to 1"))


def answer_model(
    form: AnswerForm,
    answer: tuple[Any, Any],
    *,
    title: str = "AnswerTurn",
    room: int | None = None,
    describe: str | None = None,
) -> type[BaseModel]:
    """The one builder of answer-turn schemas, the presets' and ``moot eval``'s typed ones alike:
    the reasoning first, then the answer, then (if the form asks) the confidence. Unless the form's
    reasoning is ``optional`` it is required and non-empty, so that grammar-constrained decoding
    makes a model reason before it answers (left optional, small models skip it: issue 39, S6),
    and an empty one is a parse failure, repaired like any. ``room`` overrides the form's bound."""
    limit = room if room is not None else REASONING_ROOM[form.reasoning]
    describe = describe or ("your reasoning, step by step" if form.reasoning == "explained" else "brief reasoning")
    reasoning = (
        Field(default="", max_length=limit, description=describe)
        if form.reasoning == "optional"
        else Field(min_length=1, max_length=limit, description=describe)
    )
    fields: dict[str, Any] = {"reasoning": (str, reasoning), "answer": answer}
    if form.confidence:
        fields["confidence"] = CONFIDENCE_FIELD
    model: type[BaseModel] = create_model(title, **fields)
    return model


GENERIC_ANSWER: tuple[Any, Any] = (
    str,
    Field(max_length=200, description="the answer only: a number, a letter, yes/no or a few words"),
)


def answer_schema_name(form: AnswerForm) -> str:
    """The registered name of the generic answer schema of ``form`` (``reasoned-answer``,
    ``explained-answer-no-confidence``, ...)."""
    stem = {"optional": "answer", "brief": "reasoned-answer", "explained": "explained-answer"}[form.reasoning]
    return stem if form.confidence else f"{stem}-no-confidence"


#: Every answer-family schema by its registered name, with its form: ``moot eval`` gives each the
#: item's typed answer in the same form (:func:`moot.eval.items.answer_schema_name`).
ANSWER_FORMS: dict[str, AnswerForm] = {
    answer_schema_name(f): f
    for f in (AnswerForm(r, c) for r in ("optional", "brief", "explained") for c in (True, False))
}

register_schema("answer", AnswerTurn)
for _name, _form in ANSWER_FORMS.items():
    if _name != "answer":
        register_schema(_name, answer_model(_form, GENERIC_ANSWER))
register_schema("direct", DirectAnswer)
register_schema("candidates", Candidates)
register_schema("verdict", JudgeVerdict)


def selection_schema_name(mode: Literal["consistency", "judge"], n: int) -> str:
    """The registered schema of a selection judge's reply among ``n`` responses (created on first
    use): ``response``, one of 0 to n - 1 (an enum, so a grammar can only give a valid number);
    in ``judge`` mode after the judge's reasoning."""
    name = f"selection-{mode}-{n}"
    try:
        from moot.structured import get_schema

        get_schema(name)
    except KeyError:
        choice = Literal[tuple(range(n))]  # type: ignore[valid-type]
        fields: dict[str, Any] = {}
        if mode == "judge":
            fields["reasoning"] = (str, Field(min_length=1, max_length=2000, description="your check of the responses"))
        fields["response"] = (choice, Field(description=f"the number of the response you select, 0 to {n - 1}"))
        register_schema(name, create_model("Selection", **fields))
    return name
