"""The report's rules (``moot eval report``), as runnable protocols: Adaptive-Consistency, weighted
and filtered votes."""

from __future__ import annotations

from typing import Literal

from moot.core.spec import (
    Budget,
    Probe,
    ProtocolSpec,
    Visibility,
    VoteDecision,
)
from moot.core.stop import Settled
from moot.protocols.presets.baselines import vote
from moot.protocols.presets.shared import (
    ANSWER_PROMPTS,
    _agents,
    answer_turn,
)

# ------------------------------------------------------------ the report's rules, as protocols
#
# Each is the rule ``moot eval report`` derives from a pool of samples, made runnable: the same
# samples (agent s samples with seed s, as sample s of a vote), the same decision, so on a pool the
# protocol decides exactly what the report derived.

Signal = Literal["answer_prob", "seq_prob", "p_true", "stated"]


def adaptive_consistency(
    k: int = 8, *, threshold: float = 0.95, temperature: float = 0.7, max_tokens: int = 400
) -> ProtocolSpec:
    """Adaptive-Consistency (Aggarwal et al., EMNLP 2023): one sample a round, until the Beta rule
    says the leading answer is the mode with probability ``threshold`` (``settled``), at most k;
    the vote counts every sample. Between 2 and k calls (the rule cannot settle on one sample
    below a threshold of 0.75)."""
    return ProtocolSpec(
        name="adaptive-consistency",
        description=f"Adaptive-Consistency: samples one at a time until the plurality is settled (P >= {threshold:g}), "
        f"at most {k}.",
        participants=_agents(k, temperature=temperature),
        rounds=k,
        round_robin=True,
        visibility=Visibility(who="none"),
        turn=answer_turn("answer", wording="brief", confidence=True),
        prompts=ANSWER_PROMPTS,
        stop=Settled(threshold),
        decision=VoteDecision(rounds="all"),
        budget=Budget(max_tokens_per_turn=max_tokens),
    )


def weighted_vote(
    k: int = 8, *, signal: Signal = "answer_prob", softmax_t: float = 0.2, temperature: float = 0.7,
    max_tokens: int = 400,
) -> ProtocolSpec:  # fmt: skip
    """k samples, each answer weighted by softmax(confidence / T) over the question's samples: the
    answer tokens' own probability (``answer_prob``), the whole reply's (``seq_prob``) or the stated
    confidence (``stated``). T = 0.2 is CISC's authors' value; ``moot tune`` fits it on your items.
    Needs a model that returns log-probabilities (except ``stated``)."""
    spec = vote(k, temperature=temperature, max_tokens=max_tokens)
    return spec.model_copy(
        update={
            "name": "weighted-vote",
            "description": f"{k} samples, a vote weighted by softmax({signal} / {softmax_t:g}).",
            "probe": Probe(self_check=signal == "p_true") if signal != "stated" else None,  # P(True): a check each
            "decision": VoteDecision(signal=signal, softmax_temperature=softmax_t),
        }
    )


def filtered_vote(
    k: int = 8, *, keep: float = 0.5, signal: Signal = "seq_prob", temperature: float = 0.7, max_tokens: int = 400
) -> ProtocolSpec:
    """Confidence-filtered voting (DeepConf, ICLR 2026, on short answers): k samples; only the most
    confident ``keep`` share of them (by the whole reply's probability, default) votes. DeepConf
    keeps 10% or 90% of hundreds of long traces; at 8 samples 0.5 keeps 4. Needs log-probabilities
    (except ``stated``)."""
    spec = vote(k, temperature=temperature, max_tokens=max_tokens)
    return spec.model_copy(
        update={
            "name": "filtered-vote",
            "description": f"{k} samples; the most confident {keep:.0%} by {signal} vote.",
            "probe": Probe(self_check=signal == "p_true") if signal != "stated" else None,  # P(True): a check each
            "decision": VoteDecision(keep=keep, filter_signal=signal),
        }
    )
