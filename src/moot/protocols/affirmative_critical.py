"""Seed 000: the affirmative/critical debate step of a RAG pipeline.

Round 1: both agents answer independently from the question and the top-3 context passages, in
parallel, citing them as [n] (asked only when passages were given: ``{cite}``). Each later round:
both refine against the opponent's previous answer (and their own), in parallel. A synthesizer
combines the last answers. R rounds make 2R model calls, plus one for the synthesis (R=2: the
seed's 5 calls).
"""

from __future__ import annotations

from moot.core.spec import (
    Budget,
    NoDecision,
    Participant,
    Prompts,
    ProtocolSpec,
    SynthesizeDecision,
    Visibility,
)
from moot.core.types import Persona

AFFIRMATIVE = Persona(
    name="Affirmative",
    role="affirmative",
    goal="give a well-supported answer",
    stance="pro",
    instructions=(
        "You are the Affirmative agent in a two-agent debate. Give a well-supported, direct answer "
        "to the question. Be confident but precise."
    ),
)

CRITICAL = Persona(
    name="Critical",
    role="critical",
    goal="give a skeptical, alternative perspective",
    stance="con",
    instructions=(
        "You are the Critical agent in a two-agent debate. Answer the question from a skeptical, "
        "alternative perspective: challenge common assumptions, highlight uncertainties and gaps, "
        "and question the evidence."
    ),
)

PROMPTS = Prompts(
    opening=(
        "Question: {question}\n\nContext:\n{context}\n\n"
        "Answer the question{using_context}.{cite} At most {max_tokens} tokens."
    ),
    rebuttal=(
        "Question: {question}\n\nContext:\n{context}\n\nThe previous round:\n\n{history}\n\n"
        "Review the other agent's answer: address its valid points, strengthen your weak "
        "arguments, and write your improved answer in plain prose, without headings or quotes.{cite} "
        "At most {max_tokens} tokens."
    ),
)

SYNTHESIS = SynthesizeDecision(
    persona=Persona(
        name="Synthesizer",
        role="synthesizer",
        instructions=(
            "You are the Synthesizer. Combine the best arguments of the Affirmative and the Critical "
            "agent into one balanced final answer. Keep what the evidence supports and state real "
            "uncertainty plainly."
        ),
    ),
    prompt=(
        "Question: {question}\n\nContext:\n{context}\n\n{answers}\n\n"
        "Write the final answer in plain prose, without headings or quotes (at most {max_tokens} tokens).{cite}"
    ),
    max_tokens=800,
)


def affirmative_critical(
    rounds: int = 2,
    *,
    synthesize: bool = True,
    timeout_s: float | None = None,
    max_tokens: int = 500,
    synthesis_max_tokens: int = 800,
    max_calls: int | None = None,
) -> ProtocolSpec:
    """The seed 000 protocol; defaults are the seed's (2 rounds, 500/800 tokens) except the time: a
    preset sets no timeout, so every front door applies the same one (:mod:`moot.core.budget`: the
    caller's, else 120 s per planned call). The seed's 10 s step budget, which a CPU model cannot meet,
    is kept where the seed's API asks for it: ``DebateEngine.run_debate(timeout=10.0)``."""
    return ProtocolSpec(
        name="affirmative-critical",
        description="Seed 000: affirmative vs critical, refine against the opponent, synthesize.",
        participants=[
            Participant(id="affirmative", persona=AFFIRMATIVE),
            Participant(id="critical", persona=CRITICAL),
        ],
        rounds=rounds,
        order="simultaneous",
        visibility=Visibility(who="all", window=1),
        prompts=PROMPTS,
        decision=SYNTHESIS.model_copy(update={"max_tokens": synthesis_max_tokens}) if synthesize else NoDecision(),
        budget=Budget(max_tokens_per_turn=max_tokens, max_calls=max_calls, timeout_s=timeout_s),
        max_context_chunks=3,
    )
