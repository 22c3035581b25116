"""The baselines a debate is measured against: one answer, a direct answer, a vote, a selection (USC)."""

from __future__ import annotations

from moot.core.spec import (
    Budget,
    Prompts,
    ProtocolSpec,
    SelectDecision,
    TurnFormat,
    Visibility,
    VoteDecision,
)
from moot.protocols.presets.shared import (
    Wording,
    _agents,
    _models,
    answer_prompts,
    answer_turn,
)

# -------------------------------------------------------------------------------- baselines


def single(*, max_tokens: int = 400, wording: Wording = "brief", confidence: bool = True) -> ProtocolSpec:
    """One call, one typed answer: the cheapest baseline."""
    return ProtocolSpec(
        name="single",
        description="Baseline: one agent, one call, a typed answer.",
        participants=_agents(1, temperature=None),
        rounds=1,
        visibility=Visibility(who="none"),
        turn=answer_turn("answer", wording=wording, confidence=confidence),
        prompts=answer_prompts(wording, confidence),
        decision=VoteDecision(),
        budget=Budget(max_tokens_per_turn=max_tokens),
    )


DIRECT_OPENING = "Question: {question}\n\nContext:\n{context}\n\nGive the answer only, as JSON."


def direct(*, max_tokens: int = 20) -> ProtocolSpec:
    """One call, the answer alone with no reasoning: for multiple choice about as accurate as
    reasoning first unless the question needs computation, at a fraction of the tokens."""
    return ProtocolSpec(
        name="direct",
        description="Baseline: one call, the typed answer alone (no reasoning).",
        participants=_agents(1, temperature=None),
        rounds=1,
        visibility=Visibility(who="none"),
        turn=TurnFormat(schema="direct", show_field="answer"),
        prompts=Prompts(opening=DIRECT_OPENING, rebuttal=DIRECT_OPENING),
        decision=VoteDecision(),
        budget=Budget(max_tokens_per_turn=max_tokens),
    )


def vote(
    k: int = 5,
    *,
    temperature: float = 0.7,
    max_tokens: int = 400,
    models: list[str] | str | None = None,
    first_seed: int = 1,
    wording: Wording = "brief",
    confidence: bool = True,
) -> ProtocolSpec:
    """Self-consistency: k independent samples (distinct seeds), majority vote. k calls. With
    ``models``, the samples cycle through them: the fair baseline of a heterogeneous debate. With
    ``first_seed``, another draw of samples (the seeds ``first_seed`` to ``first_seed + k - 1``).
    ``wording`` and ``confidence`` as in :func:`society_of_minds`: sample s asks exactly what agent
    s of a debate of the same options asks in its first round."""
    return ProtocolSpec(
        name="vote",
        description=f"Baseline: {k} independent samples, majority vote (self-consistency).",
        participants=_agents(k, temperature=temperature, models=_models(models), first_seed=first_seed),
        rounds=1,
        visibility=Visibility(who="none"),
        turn=answer_turn("answer", wording=wording, confidence=confidence),
        prompts=answer_prompts(wording, confidence),
        decision=VoteDecision(),
        budget=Budget(max_tokens_per_turn=max_tokens),
    )


def usc(
    k: int = 3,
    *,
    temperature: float = 0.7,
    max_tokens: int = 400,
    models: list[str] | str | None = None,
    first_seed: int = 1,
    wording: Wording = "brief",
    confidence: bool = True,
) -> ProtocolSpec:
    """Universal Self-Consistency (Chen et al. 2023): exactly ``vote(k)``'s samples (the same
    requests: a run's cache shares them with ``vote@k``), then one greedy call in which the model
    reads them all and picks the most consistent; its answer is the decision. k + 1 calls. A pick
    that names no sample falls back to the vote, recorded."""
    spec = vote(k, temperature=temperature, max_tokens=max_tokens, models=models, first_seed=first_seed,
                wording=wording, confidence=confidence)  # fmt: skip
    return spec.model_copy(
        update={
            "name": "usc",
            "description": f"Universal Self-Consistency: {k} samples, the model picks the most consistent one.",
            "decision": SelectDecision(mode="consistency"),
        }
    )


def select(
    k: int = 3,
    *,
    temperature: float = 0.7,
    max_tokens: int = 400,
    models: list[str] | str | None = None,
    first_seed: int = 1,
    wording: Wording = "brief",
    confidence: bool = True,
) -> ProtocolSpec:
    """Judge-select: ``vote(k)``'s samples, then one greedy judge call that checks them and picks the
    one it finds correct (not the most common); its answer is the decision. k + 1 calls."""
    spec = usc(k, temperature=temperature, max_tokens=max_tokens, models=models, first_seed=first_seed,
               wording=wording, confidence=confidence)  # fmt: skip
    return spec.model_copy(
        update={
            "name": "select",
            "description": f"Judge-select: {k} samples, a judge picks the one it finds correct.",
            "decision": SelectDecision(mode="judge"),
        }
    )
