"""Prompts fitted by the model's own tokenizer where it has one (a client pass: a long conversation
cut by moot's estimate, which counts words, came to 4,736 tokens of a 4,096-token window, and the
debate failed after its work; English counted 1.2 times the estimate, Latin-like text 1.8)."""

from __future__ import annotations

import asyncio

import pytest

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


class Failing(Counting):
    """A model that counts nothing but the empty text (its tokenizer's listener is down)."""

    def count_tokens(self, text: str) -> int | None:
        return 0 if not text else None


def test_a_count_that_fails_leaves_the_estimates_refusal_and_an_empty_joining_is_read() -> None:
    """A review: with the tokenizer's listener down, a 200,000-character word passed (the count fell
    back to a token a word, under the estimate's 4 characters a token); and a protocol whose joining
    prompt was "" was a ValueError (a 500), its prompts counted against a list of templates one short."""
    spec = get_preset("direct")
    huge = DebateTask(question="Q?", context=[ContextChunk(text="x" * 200_000)])
    failing = Failing()
    problem = input_problem(spec, huge, {p.id: failing for p in spec.participants}, failing)
    assert problem is not None and "context window" in problem
    joined = get_preset("affirmative-critical")
    joined = joined.model_copy(update={"prompts": joined.prompts.model_copy(update={"joining": ""})})
    counting = Counting()
    models = {p.id: counting for p in joined.participants}
    assert input_problem(joined, DebateTask(question="Q?"), models, counting) is None


def test_only_the_requests_embedded_models_are_readied_and_a_failed_load_is_no_500(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A review: every OpenAI request loaded every embedded model the server offers, and one that
    could not be loaded made every request a 500, the others' too. Only the models the request's
    debate uses are readied, and a load that fails is logged once and left to the debate's call."""
    from moot.server.openai import submission
    from moot.server.openai.asked import Asked
    from moot.server.schemas import DebateOptions
    from moot.server.settings import ServerSettings

    readied: list[str] = []

    class Broken(ScriptedModel):
        async def ready_to_count(self) -> None:
            readied.append(self.name)
            raise RuntimeError("llama.cpp could not load it")

    monkeypatch.setattr(submission, "resolve_model", lambda name: Broken(["x"], name=name))
    monkeypatch.setattr(submission, "_UNLOADABLE", set())
    settings = ServerSettings(models=["openai:fake", "embedded:smollm2-135m"])
    asked = Asked.__new__(Asked)
    object.__setattr__(asked, "options", DebateOptions())
    asyncio.run(submission.models_ready(settings, asked))  # the default, openai:fake: nothing loaded
    assert readied == []
    object.__setattr__(asked, "options", DebateOptions(model="embedded:smollm2-135m"))
    asyncio.run(submission.models_ready(settings, asked))  # its load fails: no exception
    asyncio.run(submission.models_ready(settings, asked))  # and it is not tried again
    assert readied == ["embedded:smollm2-135m"]


def test_a_spec_resolved_in_several_threads_at_once_is_one_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """A review: debates are built in worker threads now, and resolve_model's cache was checked, then
    set: two threads could build two models of one spec, each with its own concurrency limit and what
    it learnt (a server that gives no log-probabilities)."""
    import threading
    import time

    from moot.models import registry

    built = registry._build

    def slow(spec: str, options: dict[str, object]) -> object:
        time.sleep(0.05)  # (the window two threads met in)
        return built(spec, options)

    monkeypatch.setattr(registry, "_build", slow)
    monkeypatch.setattr(registry, "_cache", {})
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fake-test-key-0123")
    got: list[object] = []
    threads = [
        threading.Thread(
            target=lambda: got.append(registry.resolve_model("openai:fake", base_url="http://127.0.0.1:9/v1"))
        )
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 4 and len({id(m) for m in got}) == 1
