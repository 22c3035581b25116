"""Prompts fitted by the model's own tokenizer where it has one (a client pass: a long conversation
cut by moot's estimate, which counts words, came to 4,736 tokens of a 4,096-token window, and the
debate failed after its work; English counted 1.2 times the estimate, Latin-like text 1.8)."""

from __future__ import annotations

import asyncio

from moot.core.budget import input_problem
from moot.core.engine import Engine
from moot.core.types import ContextChunk, DebateTask
from moot.models.base import Message, approx_tokens, messages_tokens
from moot.models.scripted import ScriptedModel
from moot.protocols import get_preset

WINDOW = 1_500


class Counting(ScriptedModel):
    """A model whose tokenizer counts twice moot's estimate, with a window."""

    def __init__(self, reply: str = "ok") -> None:
        super().__init__(fn=lambda request: reply)
        self.context_tokens = WINDOW
        self.counted = 0
        self.readied = 0

    def count_tokens(self, text: str) -> int | None:
        self.counted += 1
        return 2 * approx_tokens(text)

    async def ready_to_count(self) -> None:
        self.readied += 1


def test_a_model_that_counts_refuses_what_only_the_estimate_would_fit() -> None:
    spec = get_preset("affirmative-critical")  # 500-token turns: 1,000 of the window for the prompt
    task = DebateTask(question="Q?", context=[ContextChunk(text="word " * 600)])
    plain = ScriptedModel(["x"])
    plain.context_tokens = WINDOW
    assert input_problem(spec, task, {p.id: plain for p in spec.participants}, plain) is None  # 600 < 1,000
    counting = Counting()
    problem = input_problem(spec, task, {p.id: counting for p in spec.participants}, counting)
    assert problem is not None and "context window of 1,500 tokens less the 500-token reply" in problem
    short = DebateTask(question="Q?", context=[ContextChunk(text="word " * 100)])
    assert input_problem(spec, short, {p.id: counting for p in spec.participants}, counting) is None


def test_a_conversation_is_cut_to_what_the_models_tokenizer_counts() -> None:
    from moot.server.policy import fit_conversation

    spec = get_preset("single").model_copy(update={"max_context_chunks": None})  # (as a conversation is read)
    messages = [ContextChunk(text=f"message {i} " + "word " * 40, source="user") for i in range(40)]
    task = DebateTask(question="And now?", context=messages)
    counting = Counting(reply='{"reasoning": "r", "answer": "a", "confidence": 0.5}')
    engine = Engine(spec, counting)
    fitted = fit_conversation(spec, task, engine)
    plain = ScriptedModel(["x"])
    plain.context_tokens = WINDOW
    by_estimate = fit_conversation(spec, task, Engine(spec, plain))
    assert len(fitted.context) < len(by_estimate.context) < len(task.context)  # cut more, by its count
    asyncio.run(engine.run(fitted))
    limit = WINDOW - spec.max_tokens_for(spec.participants[0])
    for request in counting.requests:
        assert messages_tokens(request.messages, counting.count_tokens) <= limit  # what is sent fits


def test_a_debates_history_is_cut_to_what_the_models_tokenizer_counts() -> None:
    """Each turn's prompt, its history cut oldest first, fits the window as the model counts it."""
    spec = get_preset("affirmative-critical", rounds=4)
    counting = Counting(reply="word " * 300)
    result = asyncio.run(Engine(spec, counting).run(DebateTask(question="Is 7 prime?")))
    assert result.status == "complete" and counting.readied
    limit = WINDOW - max(spec.max_tokens_for(p) for p in spec.participants)
    sizes = [messages_tokens(r.messages, counting.count_tokens) for r in counting.requests]
    assert all(size <= limit for size in sizes[:-1]), sizes  # (the last: the decision's, not cut here)
    assert any(t.history_trimmed for rnd in result.rounds for t in rnd.turns)  # by the estimate, none would be
    assert messages_tokens([Message(role="user", content="a b")], None) == 2 + 4  # the estimate, unchanged
