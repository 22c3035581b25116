"""The presets' shared parts: the typed turns they register, the prompts of answer turns, the agents."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from moot.core.schemas import AnswerForm, Confidence, answer_schema_name
from moot.core.spec import (
    Participant,
    Prompts,
    TurnFormat,
)
from moot.core.spec_base import check_participant_count
from moot.core.types import Persona
from moot.structured import register_schema

# ----------------------------------------------------------------------------- shared schemas


class PanelTurn(BaseModel):
    """Seed 001's DebateTurn: plan, reflect, then speak."""

    speaker: str = Field(max_length=40)
    stance: str = Field(max_length=20)
    planning: str = Field(max_length=600)
    reflection: str = Field(max_length=600)
    message: str = Field(max_length=1200)
    key_points: list[str] = Field(default_factory=list, max_length=5)


class PanelSummary(BaseModel):
    """Seed 001's DebateSummary, the judge's output."""

    winner: str | None = Field(default=None, max_length=40)
    consensus: str = Field(max_length=600)
    key_agreements: list[str] = Field(default_factory=list, max_length=5)
    key_disagreements: list[str] = Field(default_factory=list, max_length=5)
    rationale: str = Field(max_length=800)


class Argument(BaseModel):
    """Seed 004's DebateArgument (the round is the turn's own)."""

    content: str = Field(max_length=1200)
    confidence: Confidence = Field(ge=0, le=1)
    supporting_evidence: list[str] = Field(default_factory=list, max_length=5)


class ModeratorEvaluation(BaseModel):
    """Seed 004's moderator: scores both sides and its own confidence in the current understanding."""

    pro_score: Confidence = Field(ge=0, le=1, description="strength of the arguments FOR, 0 to 1")
    con_score: Confidence = Field(ge=0, le=1, description="strength of the arguments AGAINST, 0 to 1")
    confidence: Confidence = Field(ge=0, le=1, description="confidence in the current understanding, 0 to 1")
    key_points: list[str] = Field(default_factory=list, max_length=5)


class MadModeration(BaseModel):
    """MAD's moderator: does it prefer one side yet?"""

    preference: bool
    supported_side: Literal["affirmative", "negative", ""] = ""
    reason: str = Field(default="", max_length=600)
    debate_answer: str = Field(default="", max_length=200)


class Summary(BaseModel):
    """ChatEval's summarizer output."""

    summary: str = Field(max_length=1200)


_SCHEMAS: dict[str, type[BaseModel]] = {
    "panel-turn": PanelTurn,
    "panel-summary": PanelSummary,
    "argument": Argument,
    "moderator-evaluation": ModeratorEvaluation,
    "mad-moderation": MadModeration,
    "summary": Summary,
}
for _name, _schema in _SCHEMAS.items():
    register_schema(_name, _schema)

ANSWER_OPENING = (
    "Question: {question}\n\nContext:\n{context}\n\n"
    "Answer with brief reasoning, the answer itself (a number, a letter, yes/no or a few words) and "
    "your confidence from 0 to 1, as JSON."
)
ANSWER_REBUTTAL = (
    "Question: {question}\n\nContext:\n{context}\n\nThese are the other agents' recent answers:\n\n{history}\n\n"
    "Using their answers as additional advice, give your updated answer with brief reasoning and your "
    "confidence from 0 to 1, as JSON."
)
ANSWER_PROMPTS = Prompts(opening=ANSWER_OPENING, rebuttal=ANSWER_REBUTTAL)

#: How an answer turn is asked for: ``brief`` (moot's wording: "brief reasoning", the committed
#: runs') or ``du`` (Du et al.'s: "Can you solve the following problem? ... Explain your reasoning.").
Wording = Literal["brief", "du"]

#: Du et al.'s opening (``gsm/gen_gsm.py``, the task words "math problem" made "problem"), the
#: answer asked as JSON instead of "in the form \\boxed{answer}, at the end of your response".
DU_OPENING = "Can you solve the following problem? {question}{context_block} Explain your reasoning. {reply}"
#: Du et al.'s later-round message of ``gsm/gen_gsm.py`` (it restates the problem), likewise.
DU_GSM_REBUTTAL = (
    "These are the solutions to the problem from other agents:\n\n{history}\n\n"
    "Using the solutions from other agents as additional information, can you provide your answer to the "
    "problem?\nThe original problem is {question}. {reply}"
)
#: ``history=together``: the same message, the agent's own previous solution quoted first.
DU_TOGETHER = DU_GSM_REBUTTAL.replace(
    "These are the solutions to the problem from other agents:",
    "Here are your previous solution and the solutions to the problem from other agents:",
)


def _du_reply(confidence: bool) -> str:
    then = ", then your confidence from 0 to 1" if confidence else ""
    return f"Give your reasoning first, then your final answer alone as the answer{then}, as JSON."


#: What each brief prompt says about confidence, and what it says without (``confidence=false``).
_CONFIDENCE_ASKS = [
    (" the answer itself (a number, a letter, yes/no or a few words) and your confidence from 0 to 1, as JSON.",
     " and the answer itself (a number, a letter, yes/no or a few words), as JSON."),
    ("with brief reasoning and your confidence from 0 to 1, as JSON.", "with brief reasoning, as JSON."),
]  # fmt: skip


def without_confidence(text: str) -> str:
    """A brief prompt with its request for a confidence taken out (the first asks ", ... and your
    confidence"; every later one "with brief reasoning and your confidence")."""
    out = text.replace(
        "Answer with brief reasoning," + _CONFIDENCE_ASKS[0][0], "Answer with brief reasoning" + _CONFIDENCE_ASKS[0][1]
    )
    out = out.replace(*_CONFIDENCE_ASKS[1])
    if out == text:
        raise ValueError("this prompt asks for no confidence to take out")
    return out


def answer_turn(exchange: str | None, *, wording: Wording, confidence: bool) -> TurnFormat:
    """An answer turn whose reasoning is required (non-empty, before the answer: issue 39, S6):
    brief reasoning (1,200 characters) with moot's wording, room for a worked solution (6,000)
    with Du et al.'s, which asks to explain it; a confidence only when asked for."""
    form = AnswerForm("explained" if wording == "du" else "brief", confidence)
    return TurnFormat(schema=answer_schema_name(form), show_field=exchange)


def answer_prompts(wording: Wording = "brief", confidence: bool = True) -> Prompts:
    """The independent answer's prompts (a vote's samples, round 1 of a debate)."""
    if wording == "du":
        opening = DU_OPENING.replace("{reply}", _du_reply(confidence))
        return Prompts(opening=opening, rebuttal=opening)
    if confidence:
        return ANSWER_PROMPTS
    return Prompts(opening=without_confidence(ANSWER_OPENING), rebuttal=without_confidence(ANSWER_REBUTTAL))


def _agents(
    n: int,
    *,
    temperature: float | None,
    prefix: str = "agent",
    models: list[str] | None = None,
    first_seed: int = 1,
) -> list[Participant]:
    """n solver agents with distinct seeds (independent samples): the i-th samples with seed
    s = ``first_seed + i - 1`` and is Agent s, so another ``first_seed`` is another draw, and Agent s
    asks exactly what sample s of a vote or a pool asks (one request in a run's cache). With
    ``models``, the i-th runs on ``models[(i - 1) % len(models)]``: a heterogeneous panel."""
    check_participant_count(n, "the protocol")
    return [
        Participant(
            id=f"{prefix}{s}",
            persona=Persona(
                name=f"Agent {s}",
                role="solver",
                instructions=f"You are Agent {s}, a careful problem solver. Think step by step, then answer.",
            ),
            model=models[(i - 1) % len(models)] if models else None,
            temperature=temperature,
            seed=s,
        )
        for i, s in enumerate(range(first_seed, first_seed + n), start=1)
    ]


def _models(models: list[str] | str | None) -> list[str] | None:
    """``models=`` as a list or a ``+``-separated string (``embedded:qwen2.5-1.5b+openai:gpt-4o-mini``)."""
    if isinstance(models, str):
        models = [m.strip() for m in models.split("+") if m.strip()]
    return list(models) if models else None
