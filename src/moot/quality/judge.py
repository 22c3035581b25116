"""The quality judge: one typed call with a fixed rubric, for what needs judgement (logical
consistency, reasoning depth). The judge model is named in every result it scores."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from moot.core.types import DebateResult, QualityScore
from moot.models.base import BaseChatModel, ChatRequest, Message, ModelError, Usage
from moot.secrets import redact
from moot.structured import complete_structured, register_schema

#: Changes whenever the rubric or the prompt changes: judgements under two rubrics do not compare.
RUBRIC_VERSION = "1"
#: The transcript shown to the judge is cut to this many characters (small models have small windows).
MAX_TRANSCRIPT_CHARS = 6000

RUBRIC = """You rate the quality of a finished debate: how it reasons, not whether you agree with it.

logical_consistency (1 to 5):
5 = no debater contradicts itself or the evidence it cites, and the final answer follows from the arguments;
4 = consistent, with one small slip that does not affect the conclusion;
3 = a noticeable inconsistency, or a final answer only partly supported by the arguments;
2 = a clear contradiction, or a final answer that ignores or goes against the arguments;
1 = incoherent or self-contradictory throughout.

reasoning_depth (1 to 5):
5 = several steps of reasoning, a reason for each claim, and the other side's points answered;
4 = reasons for most claims and some engagement with the other side;
3 = some reasons, but claims are mostly asserted;
2 = one thin reason;
1 = bare assertions with no reasons.

Write a short rationale first, then the two scores, as JSON."""


class QualityJudgement(BaseModel):
    """The judge's verdict on a debate (rationale first: a small model then reasons before it scores)."""

    rationale: str = Field(max_length=600, description="two or three sentences: why these scores")
    logical_consistency: Literal[1, 2, 3, 4, 5] = Field(description="1 to 5, by the rubric")
    reasoning_depth: Literal[1, 2, 3, 4, 5] = Field(description="1 to 5, by the rubric")


register_schema("quality-judgement", QualityJudgement)


def render_debate(result: DebateResult, limit: int = MAX_TRANSCRIPT_CHARS, *, sees_images: bool = True) -> str:
    """The question, the context, every successful turn and the final answer, as the judge reads them.
    ``sees_images``: whether the judge is shown the question's images (a judge that reads text only
    is told that there were some, and that it judges the reasoning, not what they show)."""
    parts = [f"Question: {result.task.question}"]
    if result.task.images and not sees_images:
        n = len(result.task.images)
        parts.append(
            f"({n} image{'s were' if n > 1 else ' was'} shown with the question to the debaters, not to you: "
            "judge how they reason, not what the image shows.)"
        )
    if result.task.context:
        parts.append("Context:\n" + "\n".join(f"[{i}] {c.text}" for i, c in enumerate(result.task.context, 1)))
    turns = [t for t in [*result.turns(), *result.decision_turns] if t.ok]
    shown = "\n\n".join(
        f"{t.name}" + (f" (round {t.round})" if t.kind == "debate" else " (decision)") + f":\n{t.text}" for t in turns
    )
    if len(shown) > limit:
        shown = shown[:limit] + "\n[... the rest of the debate is cut ...]"
    parts.append("The debate:\n" + (shown or "(no turn succeeded)"))
    parts.append(f"Final answer: {result.final_answer if result.final_answer is not None else '(none)'}")
    return "\n\n".join(parts)


class JudgeOutcome(BaseModel):
    """What the judge said, or why it said nothing usable."""

    judgement: QualityJudgement | None = None
    error: str | None = None
    calls: int = 0
    usage: Usage = Field(default_factory=Usage)


async def judge_debate(result: DebateResult, model: BaseChatModel, *, max_tokens: int = 300) -> JudgeOutcome:
    """One typed judge call (and at most one repair). A failure is reported, never scored. A judge that
    reads images is shown the question's, as the debaters were."""
    sees = model.reads_images
    shown = Message(
        role="user",
        content=render_debate(result, sees_images=sees),
        images=tuple(result.task.images) if sees else (),
    )
    request = ChatRequest(
        messages=[Message(role="system", content=RUBRIC), shown],
        max_tokens=max_tokens,
        temperature=0.0,
    )
    try:
        outcome = await complete_structured(model, request, QualityJudgement)
    except ModelError as exc:
        return JudgeOutcome(error=redact(f"the judge {model.name} failed: {exc}"), calls=1)
    usage = Usage()
    for response in outcome.responses:
        usage = usage + response.usage
    calls = len(outcome.responses)
    if outcome.value is None:
        error = outcome.failure.error if outcome.failure is not None else "no reply"
        return JudgeOutcome(error=f"the judge's reply could not be parsed: {error}", calls=calls, usage=usage)
    return JudgeOutcome(judgement=QualityJudgement.model_validate(outcome.value), calls=calls, usage=usage)


def score_of(level: int) -> float:
    """A 1-5 rubric level on the 0-1 scale of every quality dimension."""
    return (level - 1) / 4


def judged_scores(judgement: QualityJudgement) -> dict[str, QualityScore]:
    """The judged dimensions of a judgement as :class:`~moot.core.types.DebateQuality` scores (each
    with its rubric level, the rubric's version and the judge's rationale): the one mapping of
    ``moot debate --quality`` and ``moot eval judge`` alike."""
    j = judgement
    return {
        name: QualityScore(
            value=score_of(level),
            method="judge",
            details={"level": level, "rubric": RUBRIC_VERSION, "rationale": j.rationale},
        )
        for name, level in (("logical_consistency", j.logical_consistency), ("reasoning_depth", j.reasoning_depth))
    }
