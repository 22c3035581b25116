"""How a debate is decided, as data: a vote, a rule, a selection, a synthesis or a judge
(:data:`Decision`, one of them by its ``kind``), or none. :mod:`moot.core.decision_step` runs them;
:class:`~moot.core.spec.ProtocolSpec` holds one."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from moot.core.spec_base import DECISION_FIELDS, SpecError, check_template
from moot.core.types import Persona


class _LLMDecision(BaseModel):
    """What the LLM decisions share: who decides, the prompt (checked), its budget and model."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    persona: Persona
    prompt: str
    max_tokens: int = Field(default=800, ge=1)
    model: str | None = None

    @field_validator("prompt")
    @classmethod
    def _check_prompt(cls, v: str) -> str:
        check_template(v, DECISION_FIELDS, "decision.prompt")
        return v


class ActionVote(BaseModel):
    """An LLM decision that first votes over the debaters' proposed actions (a protocol with tools:
    :func:`moot.core.tools.with_tools`). Each debater proposes to call one of the caller's tools or
    to answer; every answer is one ballot (the decision writes the answer, not a debater), a call with
    its arguments another. A winning call is the decision, made without the decision's own call; when
    answering wins, the synthesis or judge writes the answer as it would without tools (typed to the
    caller's schema when one is asked for)."""

    model_config = ConfigDict(extra="forbid")

    #: ``last``: the last round's proposals vote; ``all``: every round's.
    rounds: Literal["last", "all"] = "last"


class SynthesizeDecision(_LLMDecision):
    """An LLM combines the participants' last answers into the final answer."""

    kind: Literal["synthesize"] = "synthesize"
    #: The debaters propose actions, voted on first (:class:`ActionVote`); None: they answer.
    actions: ActionVote | None = None
    persona: Persona = Persona(
        name="Synthesizer",
        role="synthesizer",
        instructions=(
            "You are a Synthesizer. Combine the best arguments of the debaters into one balanced, "
            "accurate final answer. Keep what the evidence supports, drop what it does not."
        ),
    )
    prompt: str = "Question: {question}\n\nContext:\n{context}\n\n{answers}\n\nWrite the final answer."


class JudgeDecision(_LLMDecision):
    """An LLM judge reads the debate and returns a typed verdict (a registered schema).

    ``answer_field`` names the verdict field that is the final answer (None: the whole verdict).
    With ``extract_candidates`` the judge first lists the candidate answers (one call), then
    picks one (a second call, ``{candidates}`` in its prompt): MAD's two-step judge.
    """

    kind: Literal["judge"] = "judge"
    persona: Persona = Persona(
        name="Judge",
        role="judge",
        instructions=(
            "You are an impartial judge of a debate. Decide on the evidence and the arguments, not on who spoke last."
        ),
    )
    prompt: str = (
        "Question: {question}\n\nContext:\n{context}\n\nThe debate:\n{transcript}\n\nGive your verdict as JSON."
    )
    schema_name: str = Field(alias="schema")
    answer_field: str | None = "answer"
    extract_candidates: bool = False
    #: The debaters propose actions, voted on first (:class:`ActionVote`); None: they answer.
    actions: ActionVote | None = None


USC_PROMPT = (
    "I have generated the following responses to the question: {question}\n\n{responses}\n\n"
    "Evaluate these responses.\nSelect the most consistent response based on majority consensus.\n"
    'Give your answer as JSON, {"response": X}, where Response X is the most consistent response.'
)
JUDGE_SELECT_PROMPT = (
    "Question: {question}\n\nContext:\n{context}\n\nThese are candidate responses to the question:\n\n"
    "{responses}\n\nEvaluate these responses. Check each one's reasoning step by step and select the "
    "response whose final answer is correct; how many responses agree is not evidence. Give your reasoning, "
    'then the number X of the response you select, as JSON: {"reasoning": ..., "response": X}.'
)


#: Each decision's kind as a noun phrase, for a sentence ("decided by a synthesis", never "a synthesize").
_DECISION_NOUNS = {
    "vote": "a vote",
    "synthesize": "a synthesis",
    "judge": "a judge",
    "select": "a selection",
    "rule": "a rule",
    "none": "no decision",
}


def decision_noun(kind: str) -> str:
    """A decision's kind in words: ``synthesize`` is "a synthesis", ``select`` "a selection"."""
    return _DECISION_NOUNS.get(kind, f"a {kind}")


class SelectDecision(_LLMDecision):
    """A judge reads the final round's replies (a vote's samples, a debate's last answers) and
    picks one; the decision's answer is that reply's answer. ``consistency``: Universal
    Self-Consistency (Chen et al. 2023), the reply most consistent with the others; ``judge``:
    the reply the judge finds correct (judge-select). The judge answers in typed JSON whose
    ``response`` is one of the replies' numbers (grammar-constrained), greedy by default. A judge
    that names no valid reply (a failed call, a reply that does not parse) leaves the decision to
    ``fallback``, and the decision records that it did and why (``fallback``, ``fallback_reason``)."""

    kind: Literal["select"] = "select"
    mode: Literal["consistency", "judge"] = "consistency"
    persona: Persona = Persona(name="Selector", role="selector", instructions="")
    #: None: the mode's prompt (:data:`USC_PROMPT`, :data:`JUDGE_SELECT_PROMPT`).
    prompt: str = ""
    temperature: float | None = 0.0
    answer_field: str = "answer"
    #: Whose replies are read (default: every typed turn of the final round).
    speakers: list[str] | None = None
    fallback: VoteDecision = Field(default_factory=lambda: VoteDecision())

    @field_validator("prompt")
    @classmethod
    def _check_prompt(cls, v: str) -> str:
        check_template(v, DECISION_FIELDS, "decision.prompt")
        return v

    def template(self) -> str:
        return self.prompt or (USC_PROMPT if self.mode == "consistency" else JUDGE_SELECT_PROMPT)


class VoteDecision(BaseModel):
    """Majority vote over typed answers; with ``weighted`` each vote counts its confidence
    (``calibrate``: ReConcile's mapping of stated confidence to weight); with ``signal`` each vote
    counts a confidence read from log-probabilities (see :class:`Probe`), and with
    ``softmax_temperature`` CISC's weights: softmax(signal / T) over the question's votes."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["vote"] = "vote"
    answer_field: str = "answer"
    weighted: bool = False
    confidence_field: str = "confidence"
    calibrate: bool = False
    #: ``last``: the last round's answers; ``all``: every round's (trajectory voting).
    rounds: Literal["last", "all"] = "last"
    #: Who votes (default: every turn with a typed answer).
    speakers: list[str] | None = None
    tie_break: Literal["first", "none"] = "first"
    #: Weight by a confidence of the turn: a probe signal (``p_true``, CISC's self-check;
    #: ``answer_prob``, the answer tokens' probability; ``seq_prob``, the whole reply's) or
    #: ``stated`` (the confidence the turn states). A turn without it does not vote (CISC drops
    #: samples without a confidence).
    signal: Literal["p_true", "answer_prob", "seq_prob", "stated"] | None = None
    softmax_temperature: float | None = Field(default=None, gt=0)
    #: Confidence-filtered voting (DeepConf-style): only the most confident ``keep`` share of the
    #: voting turns vote (at least one), ranked by ``filter_signal``; the rest abstain.
    keep: float | None = Field(default=None, gt=0, le=1)
    filter_signal: Literal["p_true", "answer_prob", "seq_prob", "stated"] = "seq_prob"


class RuleDecision(BaseModel):
    """A deterministic rule registered with ``moot.core.decisions.register_rule``."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["rule"] = "rule"
    name: str
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        from moot.core.decisions import get_rule

        try:
            get_rule(v)
        except KeyError as exc:
            raise SpecError(str(exc.args[0])) from None
        return v


class NoDecision(BaseModel):
    """No decision step: the transcript is the product (``final_answer`` stays empty)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["none"] = "none"


Decision = Annotated[
    SynthesizeDecision | JudgeDecision | SelectDecision | VoteDecision | RuleDecision | NoDecision,
    Field(discriminator="kind"),
]
