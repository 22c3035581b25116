"""Core data types. Everything here crosses a boundary (JSON files, the CLI, integrations), so it is
pydantic with a stable, versioned JSON form: a transcript written today can be read, rendered and
re-scored later (:func:`load_result`)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from moot.files import text_problem
from moot.models.base import Message, Usage
from moot.models.images import ImageInput
from moot.secrets import redact_json
from moot.structured import ParseFailure

RESULT_SCHEMA: Literal["moot.debate/1"] = "moot.debate/1"


class Persona(BaseModel):
    """Who an agent is. ``instructions`` (if given) is its whole system prompt."""

    model_config = ConfigDict(extra="forbid")

    name: str
    role: str = ""
    goal: str = ""
    stance: str | None = None
    style: str | None = None
    instructions: str | None = None

    def system_prompt(self) -> str:
        if self.instructions:
            return self.instructions
        lines = [f"You are {self.name}" + (f", {self.role}." if self.role else ".")]
        if self.goal:
            lines.append(f"Your goal: {self.goal}.")
        if self.stance:
            lines.append(f"Your stance: {self.stance}.")
        if self.style:
            lines.append(f"Your style: {self.style}.")
        return " ".join(lines)


class ContextChunk(BaseModel):
    """One retrieved passage given to the debaters."""

    model_config = ConfigDict(extra="allow")

    text: str
    source: str | None = None


def check_question(v: str) -> str:
    """A question must say something, in Unicode text (every input form that carries one checks it
    here: half a surrogate pair, from a JSON escape or a command line's undecodable bytes, could not
    be written to a transcript or a store)."""
    if not v.strip():
        raise ValueError("the question is blank: give a question to debate")
    if (problem := text_problem(v, _TEXT_FIX)) is not None:
        raise ValueError(problem)
    return v


def check_passages(v: list[ContextChunk]) -> list[ContextChunk]:
    """No context passage may be blank (an empty file or line would debate over nothing), nor hold
    anything but Unicode text (:func:`check_question`)."""
    for n, chunk in enumerate(v, 1):
        if not chunk.text.strip():
            raise ValueError(f"passage {n} is blank: give its text or leave it out")
        if (problem := text_problem(chunk.text, _TEXT_FIX)) is not None:
            raise ValueError(f"passage {n} {problem}")
    return v


_TEXT_FIX = "give valid UTF-8 text"


class DebateTask(BaseModel):
    """What is debated: a question, optional context passages, and optional images shown with the
    question (to every agent, and to a decision that calls a model: each must read images,
    :attr:`~moot.models.base.BaseChatModel.reads_images`)."""

    question: str = Field(min_length=1)
    context: list[ContextChunk] = Field(default_factory=list)
    #: Left out of the task's JSON when there are none: a transcript without images is as before.
    images: list[ImageInput] = Field(default_factory=list, exclude_if=lambda v: not v)
    #: The known right answer, when there is one (evaluation): enables flip counts.
    reference: str | None = None

    @field_validator("question", mode="before")
    @classmethod
    def _not_blank(cls, v: Any) -> Any:
        # Before pydantic's own length check, which refuses half a surrogate pair without saying so.
        return check_question(v) if isinstance(v, str) else v

    @field_validator("context", mode="before")
    @classmethod
    def _passages(cls, v: Any) -> Any:
        """A passage may be given as its text alone (``context=["..."]``), as every other door takes it."""
        return [{"text": c} if isinstance(c, str) else c for c in v] if isinstance(v, list | tuple) else v


TurnKind = Literal["debate", "decision"]


class Turn(BaseModel):
    """One agent's contribution: what it was sent, what it said, what it cost."""

    speaker: str
    name: str
    role: str = ""
    round: int
    kind: TurnKind = "debate"
    model: str
    messages: list[Message]
    raw: str | None = None
    #: What other agents and the decision step see: the raw text (trimmed if over budget), or
    #: for a typed turn the validated JSON.
    text: str | None = None
    parsed: dict[str, Any] | None = None
    parse_failure: ParseFailure | None = None
    usage: Usage = Field(default_factory=Usage)
    calls: int = 0
    attempts: int = 0
    latency_s: float = 0.0
    started_s: float = 0.0
    #: Why the turn's reply stopped (the backend's ``finish_reason``): ``length`` when it hit the
    #: turn's token limit, also when a cut reply was then repaired; never a self-check's (CISC's
    #: one-token call). Stores made before this rule kept the self-check's on a checked turn.
    finish_reason: str | None = None
    trimmed: bool = False
    #: Earlier messages (``conversation`` history) or turns (``prompt`` history) missing from this
    #: turn's prompt so that it fits the prompt budget (``Budget.max_prompt_tokens`` or the
    #: model's context window); a conversation counts what its earlier turns left out too, since it
    #: goes on from them. Never silent: also in the result's warnings.
    history_trimmed: int = 0
    error: str | None = None
    #: Confidence signals read from token log-probabilities (``moot.core.probes``): ``answer_prob``,
    #: ``p_true``. Absent when not measured or not measurable, never a default.
    signals: dict[str, float] = Field(default_factory=dict)
    #: Calls of this turn answered by a request cache (counted in ``calls`` and ``usage`` all the
    #: same: the cost is what the turn would have paid alone).
    cached_calls: int = 0
    #: The participant kept its previous answer without a call (``reconsider: minority``).
    carried: bool = False
    #: What the probe's extra calls (CISC's self-check) cost, included in ``usage`` and ``calls``.
    probe_usage: Usage | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.parse_failure is None and self.text is not None


class Round(BaseModel):
    index: int
    turns: list[Turn] = Field(default_factory=list)

    @property
    def usage(self) -> Usage:
        total = Usage()
        for t in self.turns:
            total = total + t.usage
        return total


#: ``interrupted``: stopped from outside (Ctrl-C) before it ended; the finished turns are kept.
DebateStatus = Literal["running", "complete", "failed", "timeout", "interrupted"]

#: Seed 004's debate-quality dimensions, by the seed's names (``reasoning_depth`` is its comparison
#: with a single agent, scored per debate); ``moot.quality`` measures them.
QUALITY_DIMENSIONS = (
    "logical_consistency",
    "evidence_quality",
    "argument_diversity",
    "consensus_quality",
    "decision_confidence",
    "reasoning_depth",
    "overall_quality",
)
QUALITY_SCHEMA: Literal["moot.quality/1"] = "moot.quality/1"


class QualityScore(BaseModel):
    """One measured quality dimension, 0 (worst) to 1 (best)."""

    value: float = Field(ge=0, le=1)
    #: How it was measured: ``deterministic`` (no model), or ``judge`` (the judge model in
    #: :attr:`DebateQuality.judge`).
    method: Literal["deterministic", "judge"]
    #: The numbers it was computed from, so a reader can check it.
    details: dict[str, Any] = Field(default_factory=dict)


class DebateQuality(BaseModel):
    """Seed 004's quality of one finished debate. A dimension that could not be measured is not in
    ``scores`` but in ``unmeasured``, with the reason: never a made-up default."""

    schema_version: Literal["moot.quality/1"] = QUALITY_SCHEMA
    scores: dict[str, QualityScore] = Field(default_factory=dict)
    unmeasured: dict[str, str] = Field(default_factory=dict)
    #: The judge model of the ``judge`` dimensions (None: no judge was asked), its calls and tokens.
    judge: str | None = None
    judge_calls: int = 0
    judge_usage: Usage = Field(default_factory=Usage)
    warnings: list[str] = Field(default_factory=list)

    def value(self, dimension: str) -> float | None:
        score = self.scores.get(dimension)
        return None if score is None else score.value


# What a debate did to the answers (computed by ``moot.core.dynamics.compute_dynamics``) and what it
# cost (``moot.core.cost.debate_cost``): parts of the record, so defined here, computed there.


class RoundDynamics(BaseModel):
    round: int
    answers: dict[str, str | None]
    majority: str | None = None
    #: Share of the answering agents that give the most common answer.
    agreement: float | None = None
    #: Agents whose answer differs from their own answer in the previous round.
    changed: int = 0
    correct: int | None = None
    parse_failures: int = 0
    errors: int = 0
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


class Dynamics(BaseModel):
    rounds: list[RoundDynamics] = Field(default_factory=list)
    unique_first_answers: int = 0
    right_to_wrong: int | None = None
    wrong_to_right: int | None = None
    parse_failures: int = 0


class ModelCost(BaseModel):
    """The calls and tokens of one model in a debate, and their price (None: no price)."""

    model: str
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    #: Of ``prompt_tokens``, those the server read from its prompt cache (priced at ``cached_input``).
    cached_prompt_tokens: int = 0
    usd: float | None = None


class DebateCost(BaseModel):
    """A debate's cost, per model and in all."""

    #: US dollars in all; None when a model that was called has no price (see ``unpriced``).
    usd: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    models: list[ModelCost] = Field(default_factory=list)
    #: Models called without a price: their cost is in tokens only.
    unpriced: list[str] = Field(default_factory=list)
    #: A single call's tokens and price: the mean of round 1's turns (None: no such turn).
    single_call_tokens: float | None = None
    single_call_usd: float | None = None
    #: The debate's cost over a single call's, in tokens and (where priced and not free) in money.
    ratio_to_single_tokens: float | None = None
    ratio_to_single_usd: float | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def describe(self) -> str:
        """One line for a person: money (or why not), tokens, and the ratio to a single call."""
        if self.unpriced:
            money = (
                f"tokens only: no price for {', '.join(self.unpriced)} "
                "(give --prices FILE or --price MODEL=INPUT,OUTPUT[,CACHED_INPUT], USD per million tokens)"
            )
        elif self.usd == 0:
            money = "$0 (embedded models cost 0)" if all(m.model.startswith("embedded") for m in self.models) else "$0"
        else:
            money = f"${self.usd:.6f}" if self.usd is not None and self.usd < 0.01 else f"${self.usd:.4f}"
        ratio = self.ratio_to_single_usd if self.ratio_to_single_usd is not None else self.ratio_to_single_tokens
        basis = "cost" if self.ratio_to_single_usd is not None else "tokens"
        single = f"; {ratio:.1f}x a single call's {basis}" if ratio is not None else ""
        return f"{money}; {self.total_tokens} tokens{single}"


class DebateResult(BaseModel):
    """A whole debate: also its transcript while it runs (``status == "running"``)."""

    schema_version: Literal["moot.debate/1"] = RESULT_SCHEMA
    protocol: str
    task: DebateTask
    participants: list[dict[str, Any]] = Field(default_factory=list)
    status: DebateStatus = "running"
    stop_reason: str | None = None
    rounds: list[Round] = Field(default_factory=list)
    decision_turns: list[Turn] = Field(default_factory=list)
    final_answer: str | None = None
    decision: dict[str, Any] | None = None
    usage: Usage = Field(default_factory=Usage)
    llm_calls: int = 0
    elapsed_s: float = 0.0
    error: str | None = None
    warnings: list[str] = Field(default_factory=list)
    #: Debate dynamics (see ``moot.core.dynamics``), filled in when the debate ends.
    dynamics: Dynamics | None = None
    #: What the debate cost (``moot.core.cost.debate_cost``), when a caller priced it.
    cost: DebateCost | None = None
    #: Seed 004's quality dimensions (``moot.quality.assess``), when a caller asked for them.
    quality: DebateQuality | None = None

    def turns(self, speaker: str | None = None) -> list[Turn]:
        return [t for r in self.rounds for t in r.turns if speaker is None or t.speaker == speaker]

    def last_answer(self, speaker: str) -> str | None:
        """The last successful answer of a participant, or None."""
        for turn in reversed(self.turns(speaker)):
            if turn.ok:
                return turn.text
        return None

    def to_json(self, indent: int | None = 2, secrets: Iterable[str] = ()) -> str:
        """The versioned JSON form, with every secret redacted (``moot.secrets``: the keys in the
        environment, anything shaped like one, and ``secrets``): a key typed into a question stays out
        of every transcript file and store, as it stays out of logs and spans."""
        return redact_json(self.model_dump_json(indent=indent), secrets, indent=indent)


def load_result(path: str | Path) -> DebateResult:
    """Read a result or partial transcript written by moot."""
    from moot.files import read_json

    return DebateResult.model_validate(read_json(path, "result file"))
