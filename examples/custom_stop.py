"""A stop condition of your own: end the debate once every answer of the last round was given with
high probability (the ``answer_prob`` signal the model's own token log-probabilities carry).

    python examples/custom_stop.py [MODEL]      # default embedded:qwen2.5-1.5b

A condition reads the growing transcript (``state.result``) and the protocol's plan (``spec``: the
calls a round and the decision need); it returns the reason to stop, which becomes the result's
``stop_reason``, or None to go on. ``register_stop`` makes it readable by name, so a YAML protocol
file or a ``stop=`` string can use it and a saved spec reads back.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass

from moot import (
    DebateState,
    Engine,
    ProtocolSpec,
    RoundPlan,
    StopCondition,
    get_preset,
    register_stop,
    resolve_model,
)
from moot.core import answer_of
from moot.core.spec import Probe


@register_stop("confident_answers")
@dataclass(eq=False)
class ConfidentAnswers(StopCondition):
    """Every participant that answered in the last round did so with ``answer_prob >= min_prob``.
    Backends without log-probabilities give no signal, and then the condition never fires."""

    min_prob: float = 0.9

    def check(self, state: DebateState, spec: RoundPlan) -> str | None:
        if not state.result.rounds:
            return None
        # A turn that gave no answer (an empty one: a tiny model does that) answered nothing to weigh.
        probs = [t.signals.get("answer_prob") for t in state.result.rounds[-1].turns if answer_of(t)]
        if probs and all(p is not None and p >= self.min_prob for p in probs):
            return "confident_answers"
        return None

    def expr(self) -> str:
        return f"confident_answers({self.min_prob})"


async def main(model_spec: str) -> None:
    # The expression is read as a YAML protocol file's would be: by the name registered above.
    fields = {**get_preset("society-of-minds").model_dump(), "stop": "confident_answers(0.9)"}
    spec = ProtocolSpec.model_validate({**fields, "probe": Probe().model_dump()})
    question = "Which gas do plants take in for photosynthesis? (A) oxygen (B) carbon dioxide (C) nitrogen"
    result = await Engine(spec, resolve_model(model_spec)).run(question)
    for r in result.rounds:
        probs = ", ".join(f"{t.speaker} {t.signals.get('answer_prob', float('nan')):.2f}" for t in r.turns)
        print(f"round {r.index}: answer_prob {probs}")
    rounds = f"{len(result.rounds)} round(s) of {spec.rounds}"
    print(f"{result.final_answer!r} after {rounds}; stopped by {result.stop_reason}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "embedded:qwen2.5-1.5b"))
