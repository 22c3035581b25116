"""LangChain chat models as moot models, on langchain-core's own fake chat models (no mocks)."""

from __future__ import annotations

import asyncio
import importlib
import json
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langchain_core")

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, BaseCallbackHandler, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel as LangChainChatModel
from langchain_core.language_models.fake_chat_models import FakeListChatModel, GenericFakeChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage, SystemMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from pydantic import BaseModel, Field, SecretStr

from moot import DebateEngine
from moot.core import Engine, TokenDelta
from moot.core.events import Event
from moot.integrations import MissingExtra
from moot.integrations.langchain import LangChainModel, as_moot_model, cut_at_stop
from moot.models.base import (
    ChatRequest,
    Message,
    ModelConfigError,
    ModelError,
    RetryPolicy,
    TransientModelError,
    schema_instruction,
)
from moot.models.registry import resolve_model
from moot.protocols import get_preset
from moot.structured import complete_structured

NO_WAIT = RetryPolicy(max_attempts=3, base_delay_s=0, max_delay_s=0)


def ask(text: str = "hi", **kw: Any) -> ChatRequest:
    return ChatRequest(messages=[Message(role="user", content=text)], **kw)


def usage(inp: int, out: int) -> UsageMetadata:
    return UsageMetadata(input_tokens=inp, output_tokens=out, total_tokens=inp + out)


# --------------------------------------------------------------------------------- fake models


class Recording(GenericFakeChatModel):
    """langchain-core's generic fake, recording what each call saw (messages, stop, fields)."""

    max_tokens: int | None = None
    temperature: float | None = None
    seed: int | None = None
    calls: list[dict[str, Any]] = Field(default_factory=list)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.calls.append(
            {
                "messages": messages,
                "stop": stop,
                "kwargs": kwargs,
                "max_tokens": self.max_tokens,
                "temperature": self.temperature,
                "seed": self.seed,
            }
        )
        return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)


class Failing(LangChainChatModel):
    """Raises the given exceptions in order, then answers "ok". Holds an API key, as providers do."""

    errors: list[Any] = Field(default_factory=list)
    api_key: SecretStr = SecretStr("lc-secret-key-123456")
    calls: int = 0

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content="ok"))])

    @property
    def _llm_type(self) -> str:
        return "failing"


class Streaming(LangChainChatModel):
    """Streams its text word by word, reporting usage the way Anthropic does (input tokens on the
    first chunk, output tokens on the last); notes when its stream is closed."""

    text: str
    delay: float = 0.0
    closed: bool = False
    sent: int = 0

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        words = self.text.split(" ")
        try:
            for i, word in enumerate(words):
                if self.delay:
                    await asyncio.sleep(self.delay)
                last = i == len(words) - 1
                self.sent += 1
                yield ChatGenerationChunk(
                    message=AIMessageChunk(
                        content=word if i == 0 else " " + word,
                        usage_metadata=usage(11, 0) if i == 0 else usage(0, 7) if last else None,
                        response_metadata={"stop_reason": "end_turn"} if last else {},
                    )
                )
        finally:
            self.closed = True

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=self.text))])

    @property
    def _llm_type(self) -> str:
        return "streaming"


class RateLimitError(Exception):
    """Shaped like the provider SDKs' 429 errors: a response with a status and headers."""

    class _Response:
        status_code = 429
        headers = {"retry-after": "0"}  # noqa: RUF012

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.response = self._Response()


class StatusError(Exception):
    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


# --------------------------------------------------------------------------------- completions


@pytest.mark.parametrize(
    "metadata", [{"stop_reason": "max_tokens"}, {"finish_reason": "MAX_TOKENS"}, {"finish_reason": "length"}]
)
async def test_a_reply_stopped_at_its_token_limit_is_said_length_whichever_provider(metadata: dict[str, str]) -> None:
    """Anthropic says max_tokens, Google MAX_TOKENS: passed on as they were, the repair of a cut typed
    reply and the turn's warning (which read OpenAI's "length") never saw the cut."""
    chat = Recording(messages=iter([AIMessage(content='{"answer": 2', response_metadata=metadata)]))
    response = await LangChainModel(chat).complete(ChatRequest(messages=[Message(role="user", content="Q?")]))
    assert response.finish_reason == "length"


async def test_plain_completion_maps_messages_usage_and_finish_reason() -> None:
    reply = AIMessage(
        content="Paris.",
        usage_metadata={**usage(21, 2), "input_token_details": {"cache_read": 16}},
        response_metadata={"finish_reason": "stop"},
    )
    chat = Recording(messages=iter([reply]))
    model = LangChainModel(chat)
    request = ChatRequest(
        messages=[
            Message(role="system", content="You are terse."),
            Message(role="user", content="Capital of France?"),
            Message(role="assistant", content="Which France?"),
            Message(role="user", content="The country."),
        ]
    )
    response = await model.complete(request)
    assert response.text == "Paris."
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (21, 2)
    assert response.usage.cached_prompt_tokens == 16  # LangChain's cache reads, part of input_tokens
    assert response.finish_reason == "stop" and response.attempts == 1
    assert response.model == model.name == "langchain:Recording"
    sent = chat.calls[0]["messages"]
    assert [type(m) for m in sent] == [SystemMessage, HumanMessage, AIMessage, HumanMessage]
    assert [m.content for m in sent] == [m.content for m in request.messages]
    assert chat.calls[0]["kwargs"] == {}  # nothing is forced on the provider's SDK


async def test_content_blocks_give_their_text_only() -> None:
    blocks: list[str | dict[str, Any]] = [
        {"type": "thinking", "thinking": "hmm"},
        {"type": "text", "text": "Yes"},
        ", ",
        {"type": "tool_use", "name": "search"},
        {"type": "text", "text": "indeed."},
    ]
    response = await LangChainModel(Recording(messages=iter([AIMessage(content=blocks)]))).complete(ask())
    assert response.text == "Yes, indeed."


async def test_usage_is_approximated_when_the_model_reports_none() -> None:
    model = LangChainModel(FakeListChatModel(responses=["one two three"]))
    response = await model.complete(ask("a b"))
    assert response.usage.completion_tokens == 3
    assert response.usage.prompt_tokens > 0


async def test_parameters_go_to_the_fields_the_model_has_on_a_copy() -> None:
    chat = Recording(messages=iter(["a", "b"]), temperature=0.1)
    model = LangChainModel(chat)
    await model.complete(ask(max_tokens=42, temperature=0.7, seed=3))
    await model.complete(ask())
    first, second = chat.calls
    assert (first["max_tokens"], first["temperature"], first["seed"]) == (42, 0.7, 3)
    # The wrapped model itself is untouched: the second call sees its own settings.
    assert (second["max_tokens"], second["temperature"], second["seed"]) == (None, 0.1, None)
    assert chat.temperature == 0.1 and chat.max_tokens is None
    # A model without such fields is used as it is (no kwargs its SDK might refuse).
    plain = FakeListChatModel(responses=["x", "y"])
    wrapped = LangChainModel(plain)
    assert wrapped.configured(ask(max_tokens=5, temperature=0.2, seed=1)) is plain
    assert [(await wrapped.complete(ask(max_tokens=5))).text for _ in range(2)] == ["x", "y"]


async def test_stop_sequences_are_passed_and_enforced() -> None:
    chat = Recording(messages=iter(["Answer: yes\nQuestion: next"]))
    response = await LangChainModel(chat).complete(ask(stop=["\nQuestion:"]))
    assert chat.calls[0]["stop"] == ["\nQuestion:"]
    assert response.text == "Answer: yes" and response.finish_reason == "stop"
    assert cut_at_stop("abc", ["x", ""]) == ("abc", False)
    assert cut_at_stop("a-b+c", ["+", "-"]) == ("a", True)


async def test_model_name_includes_the_provider_model_and_can_be_set() -> None:
    class Named(Recording):
        model_name: str = "gpt-test"

    assert LangChainModel(Named(messages=iter([]))).name == "langchain:Named(gpt-test)"
    assert LangChainModel(Named(messages=iter([])), name="mine").name == "mine"
    with pytest.raises(ModelConfigError, match="not a str"):
        LangChainModel("gpt-4o")  # type: ignore[arg-type]


async def test_the_runnable_config_reaches_langchain_callbacks() -> None:
    class Seen(BaseCallbackHandler):
        def __init__(self) -> None:
            self.starts: list[list[str] | None] = []

        def on_chat_model_start(self, serialized: Any, messages: Any, **kwargs: Any) -> None:
            self.starts.append(kwargs.get("tags"))

    seen = Seen()
    model = LangChainModel(FakeListChatModel(responses=["a"]), config={"callbacks": [seen], "tags": ["moot"]})
    await model.complete(ask())
    await model.complete(ask(), on_token=lambda _: None)
    assert seen.starts == [["moot"], ["moot"]]


# ----------------------------------------------------------------------------------- streaming


async def test_streaming_sends_every_token_and_sums_reported_usage() -> None:
    chat = Streaming(text="the quick brown fox")
    tokens: list[str] = []
    response = await LangChainModel(chat).complete(ask(), on_token=tokens.append)
    assert tokens == ["the", " quick", " brown", " fox"]
    assert response.text == "the quick brown fox"
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (11, 7)
    assert response.finish_reason == "end_turn"
    assert chat.closed


async def test_streaming_async_callbacks_and_models_without_usage() -> None:
    tokens: list[str] = []

    async def on_token(piece: str) -> None:
        tokens.append(piece)

    response = await LangChainModel(FakeListChatModel(responses=["hey you"])).complete(ask(), on_token=on_token)
    assert "".join(tokens) == response.text == "hey you"
    assert response.usage.completion_tokens == 2


async def test_cancelling_a_streaming_call_stops_and_closes_the_stream() -> None:
    chat = Streaming(text=" ".join(f"w{i}" for i in range(200)), delay=0.01)
    tokens: list[str] = []
    three = asyncio.Event()

    def on_token(piece: str) -> None:
        tokens.append(piece)
        if len(tokens) == 3:
            three.set()

    task = asyncio.create_task(LangChainModel(chat).complete(ask(), on_token=on_token))
    await asyncio.wait_for(three.wait(), timeout=10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    seen = len(tokens)
    await asyncio.sleep(0.05)
    assert len(tokens) == seen < 200 and chat.sent < 200
    assert chat.closed


async def test_per_call_timeout_is_transient_and_retried() -> None:
    chat = FakeListChatModel(responses=["slow"], sleep=0.5)
    model = LangChainModel(chat, timeout_s=0.05, retry=RetryPolicy(max_attempts=2, base_delay_s=0))
    with pytest.raises(TransientModelError, match=r"per-call timeout of 0\.05 s.*gave up after 2 attempts"):
        await model.complete(ask(), on_token=lambda _: None)


# -------------------------------------------------------------------------------------- errors


async def test_transient_errors_are_retried_then_succeed() -> None:
    chat = Failing(errors=[TimeoutError("read timed out"), RateLimitError("slow down"), ConnectionError("reset")])
    retries: list[tuple[int, str]] = []
    response = await LangChainModel(chat, retry=RetryPolicy(max_attempts=4, base_delay_s=0)).complete(
        ask(), on_retry=lambda n, err: retries.append((n, err))
    )
    assert response.text == "ok" and response.attempts == 4 and chat.calls == 4
    assert [n for n, _ in retries] == [2, 3, 4]
    assert "LangChain Failing" in retries[1][1] and "RateLimitError: slow down" in retries[1][1]


@pytest.mark.parametrize(
    ("error", "kind", "status"),
    [
        (StatusError("upstream down", 503), TransientModelError, 503),
        (StatusError("too many", 429), TransientModelError, 429),
        (StatusError("bad key", 401), ModelConfigError, 401),
        (StatusError("no such model", 404), ModelConfigError, 404),
        (StatusError("bad request", 400), ModelError, 400),
        (ValueError("unsupported message"), ModelError, None),
    ],
)
async def test_errors_are_mapped_by_status_and_kind(
    error: Exception, kind: type[ModelError], status: int | None
) -> None:
    model = LangChainModel(Failing(errors=[error] * 3), retry=NO_WAIT)
    with pytest.raises(ModelError) as caught:
        await model.complete(ask())
    assert type(caught.value) is kind and caught.value.status == status
    assert "LangChain Failing" in str(caught.value)


def test_rate_limit_errors_carry_retry_after() -> None:
    mapped = LangChainModel(Failing()).map_error(RateLimitError("slow down"))
    assert isinstance(mapped, TransientModelError) and mapped.status == 429 and mapped.retry_after == 0.0


async def test_error_messages_are_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "env-secret-abcdef")
    leak = ValueError("auth failed for lc-secret-key-123456 / env-secret-abcdef / sk-abcdefghijklmnopqrstuvwx")
    with pytest.raises(ModelError) as caught:
        await LangChainModel(Failing(errors=[leak])).complete(ask())
    message = str(caught.value)
    assert "ValueError: auth failed" in message
    assert "lc-secret" not in message and "env-secret" not in message and "sk-abc" not in message
    # The raw exception (and its secrets) is not shown in a traceback.
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


# ------------------------------------------------------------------------------ typed turns


class Verdict(BaseModel):
    answer: str
    confidence: float = Field(ge=0, le=1)


async def test_structured_turns_put_the_schema_in_the_prompt_and_parse() -> None:
    chat = Recording(messages=iter(['```json\n{"answer": "yes", "confidence": 0.8}\n```']))
    outcome = await complete_structured(LangChainModel(chat), ask("Is it?"), Verdict)
    assert outcome.ok and outcome.value == {"answer": "yes", "confidence": 0.8}
    assert outcome.responses[0].schema_in_prompt
    sent = chat.calls[0]["messages"]
    assert isinstance(sent[-1], HumanMessage)
    assert sent[-1].content == schema_instruction(Verdict.model_json_schema())


async def test_structured_turns_get_one_repair_request() -> None:
    chat = Recording(messages=iter(['{"answer": "yes", "confidence": 3}', '{"answer": "yes", "confidence": 0.3}']))
    outcome = await complete_structured(LangChainModel(chat), ask(), Verdict)
    assert outcome.value == {"answer": "yes", "confidence": 0.3} and len(outcome.responses) == 2
    assert "confidence" in chat.calls[1]["messages"][-2].content  # the repair request names the error


# --------------------------------------------------------------------------- debates & registry


async def test_a_whole_debate_runs_on_a_langchain_model_passed_as_is() -> None:
    chat = FakeListChatModel(responses=["Yes: it grounds answers.", "No: retrieval can miss.", "Mostly, with checks."])
    events: list[Event] = []
    # Engine's annotations name moot's types; a LangChain object is accepted at run time
    # (LangChainModel(chat) is the typed way to pass one).
    engine = Engine(get_preset("affirmative-critical", rounds=1), chat, on_event=events.append)  # type: ignore[arg-type]
    models = {*engine.models.values(), engine.decision_model}
    assert len(models) == 1  # one wrapper, one concurrency limit, for every agent
    result = await engine.run("Does RAG stop hallucinations?")
    assert result.status == "complete" and result.llm_calls == 3
    assert result.final_answer == "Mostly, with checks."
    assert {t.text for t in result.turns()} == {"Yes: it grounds answers.", "No: retrieval can miss."}
    assert all(p["model"] == "langchain:FakeListChatModel" for p in result.participants)
    assert sum(t.usage.total_tokens for t in result.turns()) > 0
    streamed = "".join(e.text for e in events if isinstance(e, TokenDelta) and e.speaker == "decision")
    assert streamed == "Mostly, with checks."


async def test_a_typed_preset_runs_on_a_langchain_model() -> None:
    chat = Recording(messages=iter([json.dumps({"reasoning": "2+2", "answer": "4", "confidence": 0.9})]))
    result = await Engine(get_preset("single"), LangChainModel(chat)).run("What is 2+2?")
    assert result.status == "complete" and result.final_answer == "4"
    turn = result.rounds[0].turns[0]
    assert turn.parsed is not None and turn.parsed["confidence"] == 0.9


async def test_the_seed_facade_and_model_routing_take_langchain_models() -> None:
    debaters = FakeListChatModel(responses=["pro", "con"])
    synthesizer = FakeListChatModel(responses=["both"])
    spec = get_preset("affirmative-critical", rounds=1)
    engine = Engine(spec, debaters, models={"decision": synthesizer})  # type: ignore[arg-type, dict-item]
    result = await engine.run("Q?")
    assert result.final_answer == "both"
    facade_model = FakeListChatModel(responses=["x"])
    facade = await DebateEngine(model=facade_model).run_debate("Q?", max_rounds=1)  # type: ignore[arg-type]
    assert facade.final_answer == "x" and facade.llm_calls == 3


def test_resolve_model_wraps_each_object_once() -> None:
    chat = FakeListChatModel(responses=["x"])
    model = resolve_model(chat)
    assert isinstance(model, LangChainModel) and model.chat_model is chat
    assert resolve_model(chat) is model
    assert resolve_model(FakeListChatModel(responses=["x"])) is not model
    assert as_moot_model(model) is model
    assert as_moot_model(chat, max_concurrency=2).max_concurrency == 2
    with pytest.raises(ModelConfigError, match="a dict is not a model"):
        resolve_model({"model": "gpt"})
    with pytest.raises(ModelConfigError, match="a int is not a model"):
        as_moot_model(3)


@pytest.fixture
def chat_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = "moot_test_lc_models"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            from langchain_core.language_models.fake_chat_models import FakeListChatModel

            chat = FakeListChatModel(responses=["from a module"])
            not_a_model = 42

            def make():
                return FakeListChatModel(responses=["from a factory"])

            def broken():
                raise ValueError("no key sk-abcdef1234567890abcd set")
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


async def test_langchain_spec_strings(chat_module: str) -> None:
    model = resolve_model(f"langchain:{chat_module}:chat", max_concurrency=3)
    assert isinstance(model, LangChainModel) and model.name == f"langchain:{chat_module}:chat"
    assert model.max_concurrency == 3
    assert (await model.complete(ask())).text == "from a module"
    factory = resolve_model(f"langchain:{chat_module}:make")
    assert (await factory.complete(ask())).text == "from a factory"
    with pytest.raises(ModelConfigError, match="not langchain:MODULE:ATTR"):
        resolve_model(f"langchain:{chat_module}")
    with pytest.raises(ModelConfigError, match="has no attribute 'nope'"):
        resolve_model(f"langchain:{chat_module}:nope")
    with pytest.raises(ModelConfigError, match="is a int, not a LangChain chat model"):
        resolve_model(f"langchain:{chat_module}:not_a_model")
    with pytest.raises(ModelConfigError, match="cannot import 'no_such_module_xyz'"):
        resolve_model("langchain:no_such_module_xyz:chat")
    # the factory's own error: one line, its key redacted (it was a raw traceback)
    with pytest.raises(ModelConfigError, match=r"calling broken\(\) raised ValueError: no key \*\*\* set$"):
        resolve_model(f"langchain:{chat_module}:broken")


# ----------------------------------------------------------------------------- optional extra


def test_a_missing_langchain_core_is_a_clear_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in sys.modules if n == "langchain_core" or n.startswith("langchain_core.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, "moot.integrations.langchain")
    monkeypatch.delitem(sys.modules, "moot.models.langchain")
    with pytest.raises(ModelConfigError) as caught:
        importlib.import_module("moot.integrations.langchain")
    assert isinstance(caught.value, ImportError) and isinstance(caught.value, MissingExtra)
    message = str(caught.value)
    assert "\n" not in message and "pip install 'moot[langchain]'" in message and "langchain-core" in message


def test_the_core_never_imports_langchain() -> None:
    code = (
        "import sys, moot, moot.integrations\n"
        "from moot.models.registry import resolve_model\n"
        "from moot import ScriptedModel\n"
        "assert resolve_model(ScriptedModel(['x'])).name == 'scripted'\n"
        "try:\n"
        "    resolve_model(object())\n"
        "except Exception as exc:\n"
        "    assert 'is not a model' in str(exc), exc\n"
        "assert not [m for m in sys.modules if m.startswith(('langchain', 'langgraph'))], 'langchain imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_vote_weighed_by_log_probabilities_is_refused_on_a_langchain_model_before_any_call() -> None:
    """The adapter reads no log-probabilities, so such a vote would abstain on every sample: refused."""
    from moot.core import Engine
    from moot.core.spec import SpecError
    from moot.protocols import get_preset

    inner = FakeListChatModel(responses=['{"reasoning": "r", "answer": "A", "confidence": 0.5}'])
    model = LangChainModel(inner)
    assert model.returns_logprobs is False
    with pytest.raises(SpecError, match="log-probabilities"):
        Engine(get_preset("weighted-vote"), model)
    assert inner.i == 0  # no call was made
