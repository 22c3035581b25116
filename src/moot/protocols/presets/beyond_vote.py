"""Protocols proposed to beat the vote: CISC, adaptive debate, MAD's conformist variant, Free-MAD."""

from __future__ import annotations

from moot.core.spec import (
    Probe,
    Prompts,
    ProtocolSpec,
    RuleDecision,
    VoteDecision,
)
from moot.core.stop import Consensus
from moot.protocols.presets.baselines import vote
from moot.protocols.presets.literature import (
    Exchange,
    society_of_minds,
)
from moot.protocols.presets.shared import (
    Wording,
    _du_reply,
    without_confidence,
)

# ------------------------------------------------------------------- protocols that beat the vote


def cisc(k: int = 8, *, temperature: float = 0.7, softmax_t: float = 0.2, max_tokens: int = 400) -> ProtocolSpec:
    """Confidence-informed self-consistency (Taubenfeld et al., ACL Findings 2025): k samples as in
    ``vote``, each followed by a one-token self-check whose P(True) weighs it: the answer with the
    largest sum of softmax(P(True) / T) wins. 2k calls (each check is one token, mostly read from the
    prompt cache). Fit T per model on held-out items (``moot eval report`` does, never on the items
    it scores); 0.2 is the authors' value for a 2B model."""
    spec = vote(k, temperature=temperature, max_tokens=max_tokens)
    return spec.model_copy(
        update={
            "name": "cisc",
            "description": f"CISC: {k} samples weighted by their self-checked P(True) (softmax T={softmax_t:g}).",
            "probe": Probe(self_check=True),
            "decision": VoteDecision(signal="p_true", softmax_temperature=softmax_t),
        }
    )


def adaptive_debate(
    agents: int = 3,
    rounds: int = 2,
    *,
    threshold: float = 1.0,
    temperature: float = 0.7,
    exchange: Exchange = "full",
    first_seed: int = 1,
    wording: Wording = "brief",
    confidence: bool = True,
    max_tokens: int = 400,
) -> ProtocolSpec:
    """Debate only when it matters: round 1 is ``agents`` independent answers (a vote); if at least
    ``threshold`` of them agree the vote decides there, otherwise the agents debate (as Society of
    Minds) up to ``rounds``. The same spec as Society of Minds plus one composable stop condition."""
    spec = society_of_minds(agents, rounds, temperature=temperature, exchange=exchange, first_seed=first_seed,
                           wording=wording, confidence=confidence, max_tokens=max_tokens)  # fmt: skip
    return spec.model_copy(
        update={
            "name": "adaptive-debate",
            "description": f"{agents} independent answers; a Society of Minds debate follows only when fewer "
            f"than {threshold:.0%} of them agree.",
            "stop": Consensus(threshold),
        }
    )


def mad_conformist(
    agents: int = 3,
    rounds: int = 2,
    *,
    temperature: float = 0.7,
    exchange: Exchange = "full",
    first_seed: int = 1,
    wording: Wording = "brief",
    confidence: bool = True,
    max_tokens: int = 400,
) -> ProtocolSpec:
    """Choi et al.'s MAD-Conformist: a debate that protects the majority. After round 1 an agent that
    holds the majority answer keeps it (no call); only the others are asked to reconsider, as in
    Society of Minds (the others' whole replies, in their own conversation)."""
    spec = society_of_minds(agents, rounds, temperature=temperature, exchange=exchange, first_seed=first_seed,
                           wording=wording, confidence=confidence, max_tokens=max_tokens)  # fmt: skip
    return spec.model_copy(
        update={
            "name": "mad-conformist",
            "description": "Society of Minds where agents holding the majority keep it; only the others reconsider.",
            "reconsider": "minority",
        }
    )


#: Free-MAD's anti-conformity instruction for the debate round, in substance (the authors' code is
#: not public; this follows a reconstruction of the paper's prompt): analyse the others' reasoning
#: for concrete errors, check your own, and keep your conclusion unless shown it is wrong.
ANTI_CONFORMITY_REBUTTAL = (
    "These are the solutions to the problem from other agents:\n\n{history}\n\n"
    "Some agents may give incorrect answers, so reason as follows. 1. Restate the steps and conclusion of your "
    "own solution. 2. Analyse the other agents' reasoning: say which is correct and which is flawed, naming "
    "concrete errors; the correct answer may not be among them. 3. Check whether you made a similar mistake. "
    "4. Decide whether to revise your conclusion: revise only for a concrete error you can name; if you cannot "
    "show that the others are right, keep your own conclusion. You may not rely on conformity: what the majority "
    "says is not a reason. Give your answer with brief reasoning and your confidence from 0 to 1, as JSON."
)

#: Free-MAD's trajectory score (Algorithm 1 as reconstructed: W = [20, 25, 30, 20], f(k) = 1/(k+1)).
FREE_MAD_WEIGHTS = {"initial": 20.0, "abandon": 25.0, "switch": 30.0, "keep": 20.0, "decay": True}


def free_mad(
    agents: int = 3,
    rounds: int = 2,
    *,
    temperature: float = 0.7,
    exchange: Exchange = "full",
    first_seed: int = 1,
    wording: Wording = "brief",
    confidence: bool = True,
    max_tokens: int = 400,
) -> ProtocolSpec:
    """Free-MAD (Cui et al. 2025): one debate round after the first answers, in which each agent,
    in its own conversation, reads the others' whole replies under an anti-conformity instruction;
    the decision scores the whole trajectory of answers (the ``trajectory`` rule with the paper's
    weights and decay), not the last round's majority. ``wording`` and ``confidence`` as in
    :func:`society_of_minds` (the anti-conformity steps are the same in both wordings)."""
    spec = society_of_minds(agents, rounds, temperature=temperature, exchange=exchange, first_seed=first_seed,
                            wording=wording, confidence=confidence, max_tokens=max_tokens)  # fmt: skip
    rebuttal = ANTI_CONFORMITY_REBUTTAL
    if wording == "du":
        rebuttal = rebuttal.replace(
            "Give your answer with brief reasoning and your confidence from 0 to 1, as JSON.", _du_reply(confidence)
        )
    elif not confidence:
        rebuttal = without_confidence(rebuttal)
    return spec.model_copy(
        update={
            "name": "free-mad",
            "description": "Free-MAD: an anti-conformity debate round, decided on the whole trajectory of answers.",
            "prompts": Prompts(opening=spec.prompts.opening, rebuttal=rebuttal),
            "decision": RuleDecision(name="trajectory", params=dict(FREE_MAD_WEIGHTS)),
        }
    )
