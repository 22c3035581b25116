"""Built-in turn and verdict schemas, registered by name for specs and YAML files."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, Field

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
    """A short answer with a confidence: what votes, consensus and scoring read."""

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


register_schema("answer", AnswerTurn)
register_schema("direct", DirectAnswer)
register_schema("candidates", Candidates)
register_schema("verdict", JudgeVerdict)
