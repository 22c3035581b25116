"""The OpenAI-compatible backend against the loopback fake server: payloads, streaming, retries,
fault mapping, the response_format fallback, secrets, the concurrency limit and the engine path."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from pydantic import BaseModel
from yarl import URL

from moot.core.engine import Engine
from moot.models import openai_http
from moot.models.base import (
    BEFORE_CALL,
    ChatRequest,
    Message,
    ModelConfigError,
    ModelError,
    RetryPolicy,
    TransientModelError,
    schema_instruction,
)
from moot.models.openai_compat import OpenAICompatModel
from moot.protocols.affirmative_critical import affirmative_critical
from moot.structured import complete_structured, json_schema
from moot.testing.fake_openai import FakeOpenAIServer, Fault

KEY = "sk-test-SECRET-1234567890"
FAST: dict[str, Any] = {"base_delay_s": 0.01, "max_delay_s": 0.05}

# Numbers no local estimate would produce: a response carrying them took them from the server.
REPORTED_USAGE: dict[str, Any] = {
    "prompt_tokens": 321,
    "completion_tokens": 17,
    "total_tokens": 338,
    "prompt_tokens_details": {"cached_tokens": 256, "audio_tokens": 0},
}


class UsageReportingServer(FakeOpenAIServer):
    """The fake server, reporting fixed token counts (plain replies and the final stream chunk)."""

    def _usage(self, request: dict[str, Any], text: str) -> dict[str, Any]:
        return dict(REPORTED_USAGE)


class Verdict(BaseModel):
    answer: str
    confidence: float


def ask(text: str = "What is RAG?", **options: Any) -> ChatRequest:
    return ChatRequest(messages=[Message(role="user", content=text)], **options)


ModelFactory = Callable[..., OpenAICompatModel]


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as srv:
        yield srv


@pytest.fixture
def usage_server() -> Iterator[FakeOpenAIServer]:
    with UsageReportingServer(reply=lambda request: "alpha beta gamma delta") as srv:
        yield srv


@pytest.fixture
async def make_model() -> AsyncIterator[ModelFactory]:
    """Build models on a server; every one is closed at the end of the test."""
    models: list[OpenAICompatModel] = []

    def build(
        srv: FakeOpenAIServer,
        *,
        api_key: str | None = KEY,
        timeout_s: float = 5.0,
        max_concurrency: int | None = 8,
        **retry: Any,
    ) -> OpenAICompatModel:
        model = OpenAICompatModel(
            "fake-model",
            base_url=srv.base_url,
            api_key=api_key,
            retry=RetryPolicy(**(FAST | retry)),
            timeout_s=timeout_s,
            max_concurrency=max_concurrency,
        )
        models.append(model)
        return model

    yield build
    for model in models:
        await model.aclose()


# ------------------------------------------------------------------------------ plain and streamed


@pytest.mark.req("S000-METRICS")
async def test_plain_completion(usage_server: FakeOpenAIServer, make_model: ModelFactory) -> None:
    model = make_model(usage_server)
    response = await model.complete(ask("Say hi", max_tokens=64, temperature=0.3, seed=7))

    assert response.text == "alpha beta gamma delta"
    assert response.usage.prompt_tokens == 321
    assert response.usage.completion_tokens == 17
    assert response.usage.cached_prompt_tokens == 256  # prompt_tokens_details.cached_tokens
    assert response.finish_reason == "stop"
    assert response.model == "openai:fake-model"
    assert response.attempts == 1
    assert response.schema_in_prompt is False
    assert len(usage_server.requests) == 1
    sent = usage_server.requests[0]
    assert sent["model"] == "fake-model"
    assert sent["messages"] == [{"role": "user", "content": "Say hi"}]
    assert sent["max_tokens"] == 64
    assert sent["temperature"] == 0.3
    assert sent["seed"] == 7
    assert "stream" not in sent
    assert "response_format" not in sent
    assert usage_server.headers_seen[0]["authorization"] == f"Bearer {KEY}"


@pytest.mark.parametrize("bypass", [False, True])
async def test_the_environments_proxy_is_used_as_httpx_would(monkeypatch: pytest.MonkeyPatch, bypass: bool) -> None:
    """HTTP_PROXY / NO_PROXY are honoured (looked up once per pool, not per request)."""
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:3128")
    monkeypatch.setenv("NO_PROXY", "example.org" if bypass else "elsewhere.org")
    session = openai_http.session("http://example.org/v1")
    try:
        assert session._default_proxy == (None if bypass else URL("http://127.0.0.1:3128"))
    finally:
        await session.close()


@pytest.mark.parametrize(("fails_at", "warm"), [(2, False), (3, False), (3, True), (4, False), (4, True)])
async def test_the_callers_check_runs_again_right_before_the_request_is_written(
    server: FakeOpenAIServer, make_model: ModelFactory, fails_at: int, warm: bool
) -> None:
    """A replica's lease check (:data:`BEFORE_CALL`) passes in ``complete``; the process is stopped
    (SIGSTOP) while the request is built (2: before it is handed to aiohttp), or while a connection
    is taken or opened for it (3: as the pool hands the request its connection, new or kept), or (4)
    after that, before the task aiohttp writes the request from does, and resumes past its lease:
    the check runs again, raises, and no request reaches the model (issue 40, invariant iii)."""
    model = make_model(server)
    if warm:
        assert (await model.complete(ask("Say hi"))).text  # a connection the pool keeps
        server.requests.clear()
    checks: list[int] = []

    def check() -> None:
        checks.append(1)
        if len(checks) >= fails_at:  # the lease went stale between the checks before
            raise asyncio.CancelledError

    token = BEFORE_CALL.set(check)
    try:
        with pytest.raises(asyncio.CancelledError):
            await model.complete(ask("Say hi"))
    finally:
        BEFORE_CALL.reset(token)
    # At 4 on aiohttp the check raises in its writer task, which closes the connection; the request
    # raises what the check raised, on Python 3.11 (the task runs a loop turn later) and 3.12 (it
    # starts eagerly) alike, with no retry.
    assert len(checks) == fails_at
    assert server.requests == []
    assert (await model.complete(ask("Say hi"))).text  # with no check set, calls go out as before


async def test_optional_fields_are_left_out(server: FakeOpenAIServer, make_model: ModelFactory) -> None:
    model = make_model(server)
    response = await model.complete(ask("Say hi"))
    assert response.text == "reply to: Say hi"
    sent = server.requests[0]
    for name in ("max_tokens", "temperature", "seed", "stop", "response_format"):
        assert name not in sent


async def test_streaming_with_a_sync_callback(usage_server: FakeOpenAIServer, make_model: ModelFactory) -> None:
    model = make_model(usage_server)
    tokens: list[str] = []
    usage_server.faults.append(Fault.trickle(0.1))  # each token sent on its own, 0.1 s apart
    response = await model.complete(ask("Stream it"), tokens.append)

    # A piece per token, but those a loaded machine reads together, which come as one.
    assert len(tokens) > 1 and all(t.strip() for t in tokens)
    assert "".join(tokens) == response.text == "alpha beta gamma delta"
    assert response.usage.prompt_tokens == 321
    assert response.usage.completion_tokens == 17
    assert response.usage.cached_prompt_tokens == 256
    assert response.finish_reason == "stop"
    assert response.attempts == 1
    sent = usage_server.requests[0]
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}


async def test_streaming_with_an_async_callback(usage_server: FakeOpenAIServer, make_model: ModelFactory) -> None:
    model = make_model(usage_server)
    tokens: list[str] = []

    async def on_token(piece: str) -> None:
        await asyncio.sleep(0)
        tokens.append(piece)

    usage_server.faults.append(Fault.trickle(0.1))  # each token sent on its own, 0.1 s apart
    response = await model.complete(ask("Stream it"), on_token)

    # A piece per token, but those a loaded machine reads together, which come as one.
    assert len(tokens) > 1 and all(t.strip() for t in tokens)
    assert "".join(tokens) == response.text
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (321, 17)
    assert len(usage_server.requests) == 1


async def test_tokens_that_arrive_together_are_passed_on_as_one_piece(
    server: FakeOpenAIServer, make_model: ModelFactory
) -> None:
    """The fake server sends a reply's 60 chunks at once, without waiting between them: what is
    read together is one piece for the callback (and one event for the engine), the text the same."""
    words = [f"w{i}" for i in range(60)]
    server.reply = lambda request: " ".join(words)
    model = make_model(server)
    pieces: list[str] = []
    response = await model.complete(ask(), pieces.append)
    assert "".join(pieces) == response.text == " ".join(words)
    assert len(pieces) < len(words)


# -------------------------------------------------------------------------------- transient faults


@pytest.mark.req("S000-RETRY")
async def test_429_retry_after_is_honoured(server: FakeOpenAIServer, make_model: ModelFactory) -> None:
    model = make_model(server)
    server.faults.append(Fault.http(429, retry_after=0.2))
    start = time.perf_counter()
    response = await model.complete(ask())
    elapsed = time.perf_counter() - start

    assert response.attempts == 2
    assert response.text == "reply to: What is RAG?"
    assert len(server.requests) == 2
    # The own backoff is at most 0.05 s here: only the Retry-After explains a 0.2 s wait.
    assert 0.19 <= elapsed < 2.0


async def test_429_retry_after_beyond_the_cap_is_not_waited_for(
    server: FakeOpenAIServer, make_model: ModelFactory
) -> None:
    model = make_model(server, max_retry_after_s=1.0)
    server.faults.append(Fault.http(429, message="slow down", retry_after=30))
    start = time.perf_counter()
    with pytest.raises(TransientModelError) as info:
        await model.complete(ask())
    elapsed = time.perf_counter() - start

    assert elapsed < 10.0  # the 30 s Retry-After was not waited for
    assert len(server.requests) == 1
    assert info.value.status == 429
    assert info.value.retry_after == 30.0
    assert "rate limited" in str(info.value)
    assert "slow down" in str(info.value)


@pytest.mark.req("S000-RETRY")
async def test_500_then_success(server: FakeOpenAIServer, make_model: ModelFactory) -> None:
    model = make_model(server)
    server.faults.append(Fault.http(500))
    response = await model.complete(ask())
    assert response.attempts == 2
    assert response.text == "reply to: What is RAG?"
    assert len(server.requests) == 2


async def test_persistent_500_gives_up_after_max_attempts(server: FakeOpenAIServer, make_model: ModelFactory) -> None:
    model = make_model(server, max_attempts=3)
    server.faults.extend(Fault.http(500, message="backend exploded") for _ in range(10))
    with pytest.raises(TransientModelError) as info:
        await model.complete(ask())

    message = str(info.value)
    assert "gave up after 3 attempts" in message
    assert "(500)" in message
    assert "backend exploded" in message
    assert info.value.status == 500
    assert len(server.requests) == 3
    assert len(server.faults) == 7


async def test_reset_connection_then_success(server: FakeOpenAIServer, make_model: ModelFactory) -> None:
    model = make_model(server)
    server.faults.append(Fault.reset())
    response = await model.complete(ask())
    assert response.attempts == 2
    assert response.text == "reply to: What is RAG?"
    assert len(server.requests) == 2


async def test_persistent_reset_is_a_transient_error(server: FakeOpenAIServer, make_model: ModelFactory) -> None:
    model = make_model(server, max_attempts=2)
    server.faults.extend([Fault.reset(), Fault.reset()])
    with pytest.raises(TransientModelError) as info:
        await model.complete(ask())
    assert "could not connect" in str(info.value)
    assert "gave up after 2 attempts" in str(info.value)
    assert len(server.requests) == 2


async def test_slow_reply_times_out_and_is_retried(server: FakeOpenAIServer, make_model: ModelFactory) -> None:
    model = make_model(server, timeout_s=1.5)  # (a loaded machine may take a while to send a request)
    server.faults.append(Fault.delay(60.0))
    start = time.perf_counter()
    response = await model.complete(ask())
    elapsed = time.perf_counter() - start

    assert response.attempts == 2
    assert response.text == "reply to: What is RAG?"
    assert len(server.requests) == 2
    assert 1.5 <= elapsed < 30.0  # the 60 s reply was abandoned, not waited for


async def test_persistent_timeout_names_the_per_call_timeout(
    server: FakeOpenAIServer, make_model: ModelFactory
) -> None:
    model = make_model(server, timeout_s=1.5, max_attempts=2)  # (as above)
    server.faults.extend([Fault.delay(10.0), Fault.delay(10.0)])
    with pytest.raises(TransientModelError) as info:
        await model.complete(ask())
    message = str(info.value)
    assert "per-call timeout of 1.5 s" in message
    assert "gave up after 2 attempts" in message
    assert len(server.requests) == 2


async def test_invalid_json_then_success(server: FakeOpenAIServer, make_model: ModelFactory) -> None:
    model = make_model(server)
    server.faults.append(Fault.invalid_json())
    response = await model.complete(ask())
    assert response.attempts == 2
    assert response.text == "reply to: What is RAG?"
    assert len(server.requests) == 2


async def test_persistent_invalid_json_is_a_transient_error(server: FakeOpenAIServer, make_model: ModelFactory) -> None:
    model = make_model(server, max_attempts=2)
    server.faults.extend([Fault.invalid_json(), Fault.invalid_json()])
    with pytest.raises(TransientModelError) as info:
        await model.complete(ask())
    assert "not valid JSON" in str(info.value)
    assert len(server.requests) == 2


async def test_completion_without_choices_then_success(server: FakeOpenAIServer, make_model: ModelFactory) -> None:
    model = make_model(server)
    server.faults.append(Fault.no_choices())
    response = await model.complete(ask())
    assert response.attempts == 2
    assert response.text == "reply to: What is RAG?"
    assert len(server.requests) == 2


async def test_persistent_completion_without_choices_is_a_transient_error(
    server: FakeOpenAIServer, make_model: ModelFactory
) -> None:
    model = make_model(server, max_attempts=2)
    server.faults.extend([Fault.no_choices(), Fault.no_choices()])
    with pytest.raises(TransientModelError) as info:
        await model.complete(ask())
    assert "without choices" in str(info.value)
    assert "gave up after 2 attempts" in str(info.value)
    assert len(server.requests) == 2


@pytest.mark.parametrize("status", [408, 409, 502, 503])
async def test_other_transient_statuses_are_retried(
    server: FakeOpenAIServer, make_model: ModelFactory, status: int
) -> None:
    model = make_model(server)
    server.faults.append(Fault.http(status))
    response = await model.complete(ask())
    assert response.attempts == 2
    assert len(server.requests) == 2


# ------------------------------------------------------------------------- response_format fallback


def verdict_reply(request: dict[str, Any]) -> str:
    """Valid JSON only when the schema was put in the prompt; prose otherwise."""
    last = str(request["messages"][-1]["content"])
    if "JSON schema" in last:
        return json.dumps({"answer": "yes", "confidence": 0.9})
    return "I would rather talk in prose."


async def test_rejected_response_format_falls_back_to_the_prompt(
    server: FakeOpenAIServer, make_model: ModelFactory
) -> None:
    server.reject_response_format = True
    server.reply = verdict_reply
    model = make_model(server)
    schema = json_schema(Verdict)
    assert model.format_refused(schema) is False

    outcome = await complete_structured(model, ask("Is RAG useful?"), Verdict)

    assert outcome.ok
    assert outcome.value == {"answer": "yes", "confidence": 0.9}
    assert len(outcome.responses) == 1
    response = outcome.responses[0]
    assert response.schema_in_prompt is True
    assert response.attempts == 1
    assert len(server.requests) == 2
    first, retry = server.requests
    assert first["response_format"] == {"type": "json_schema", "json_schema": {"name": "Verdict", "schema": schema}}
    assert first["messages"] == [{"role": "user", "content": "Is RAG useful?"}]
    assert "response_format" not in retry
    assert retry["messages"][0] == {"role": "user", "content": "Is RAG useful?"}
    assert retry["messages"][-1]["role"] == "user"
    assert retry["messages"][-1]["content"] == schema_instruction(schema)
    assert json.dumps(schema, separators=(",", ":")) in retry["messages"][-1]["content"]
    assert model.format_refused(schema) is True

    again = await complete_structured(model, ask("And now?"), Verdict)

    assert again.ok
    assert again.value == {"answer": "yes", "confidence": 0.9}
    assert again.responses[0].schema_in_prompt is True
    assert len(server.requests) == 3
    assert "response_format" not in server.requests[2]
    assert server.requests[2]["messages"][-1]["content"] == schema_instruction(schema)


async def test_accepted_response_format_is_kept(server: FakeOpenAIServer, make_model: ModelFactory) -> None:
    model = make_model(server)  # the default reply answers a response_format with JSON
    outcome = await complete_structured(model, ask("Is RAG useful?"), Verdict)
    assert outcome.value == {"answer": "ok", "confidence": 0.5}
    assert outcome.responses[0].schema_in_prompt is False
    assert len(server.requests) == 1
    assert server.requests[0]["response_format"]["json_schema"]["name"] == "Verdict"
    assert model.format_refused(json_schema(Verdict)) is False


# ---------------------------------------------------------------------------- errors that are final


async def test_401_fails_at_once_and_names_the_key(server: FakeOpenAIServer, make_model: ModelFactory) -> None:
    model = make_model(server)
    server.faults.extend(Fault.http(401) for _ in range(4))
    with pytest.raises(ModelConfigError) as info:
        await model.complete(ask())
    assert len(server.requests) == 1
    assert info.value.status == 401
    assert "OPENAI_API_KEY" in str(info.value)
    assert "401" in str(info.value)


async def test_403_fails_at_once(server: FakeOpenAIServer, make_model: ModelFactory) -> None:
    model = make_model(server)
    server.faults.extend(Fault.http(403) for _ in range(4))
    with pytest.raises(ModelConfigError) as info:
        await model.complete(ask())
    assert len(server.requests) == 1
    assert info.value.status == 403
    assert "403" in str(info.value)
    assert "no access to this model" in str(info.value)


async def test_404_fails_at_once_and_names_model_and_base_url(
    server: FakeOpenAIServer, make_model: ModelFactory
) -> None:
    model = make_model(server)
    server.faults.extend(Fault.http(404, message="model fake-model not found") for _ in range(4))
    with pytest.raises(ModelConfigError) as info:
        await model.complete(ask())
    message = str(info.value)
    assert len(server.requests) == 1
    assert info.value.status == 404
    assert "'fake-model'" in message
    assert server.base_url in message
    assert "model name" in message
    assert "base URL" in message
    assert "model fake-model not found" in message


async def test_400_without_response_format_fails_at_once(server: FakeOpenAIServer, make_model: ModelFactory) -> None:
    model = make_model(server)
    server.faults.extend(Fault.http(400, message="max_tokens is too large") for _ in range(4))
    with pytest.raises(ModelConfigError) as info:
        await model.complete(ask(max_tokens=10**9))
    assert len(server.requests) == 1
    assert info.value.status == 400
    assert "(400)" in str(info.value)
    assert "max_tokens is too large" in str(info.value)
    assert not model._format_refused  # a 400 on a request without one refuses no schema


# ------------------------------------------------------------------------------------------ secrets


@pytest.mark.parametrize("status", [400, 404, 429, 500])
async def test_key_echoed_by_the_server_is_redacted(
    server: FakeOpenAIServer, make_model: ModelFactory, status: int
) -> None:
    model = make_model(server, max_attempts=1)
    server.faults.append(Fault.http(status, message=f"bad request, you sent Authorization: Bearer {KEY}"))
    with pytest.raises((ModelConfigError, TransientModelError)) as info:
        await model.complete(ask())
    assert server.headers_seen[0]["authorization"] == f"Bearer {KEY}"  # the server did see it
    message = str(info.value)
    assert KEY not in message
    assert "***" in message
    assert "you sent Authorization" in message
    cause = info.value.__cause__
    assert cause is None or KEY not in str(cause)
    assert KEY not in repr(model)


async def test_key_of_no_known_shape_is_redacted(
    server: FakeOpenAIServer, make_model: ModelFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Not shaped like sk-..., not in the environment: only the model's own knowledge redacts it.
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    secret = "plain-password-value-42"
    model = make_model(server, api_key=secret, max_attempts=1)
    server.faults.append(Fault.http(500, message=f"unknown key {secret}"))
    with pytest.raises(TransientModelError) as info:
        await model.complete(ask())
    assert secret not in str(info.value)
    assert "unknown key ***" in str(info.value)
    assert secret not in repr(model)


# -------------------------------------------------------------------------------------- concurrency


async def test_concurrency_limit_is_exact(server: FakeOpenAIServer, make_model: ModelFactory) -> None:
    server.latency = 0.05
    model = make_model(server, max_concurrency=3)
    responses = await asyncio.gather(*(model.complete(ask(f"q{i}")) for i in range(12)))
    assert [r.text for r in responses] == [f"reply to: q{i}" for i in range(12)]
    assert len(server.requests) == 12
    assert server.max_in_flight == 3


async def test_without_a_limit_all_calls_overlap(server: FakeOpenAIServer, make_model: ModelFactory) -> None:
    # The counterpart of the test above: the server can see more than 3 at once.
    server.latency = 0.1
    model = make_model(server, max_concurrency=None)
    await asyncio.gather(*(model.complete(ask(f"q{i}")) for i in range(12)))
    assert server.max_in_flight > 3


async def test_many_calls_at_once_share_one_pool_per_event_loop(
    server: FakeOpenAIServer, make_model: ModelFactory
) -> None:
    """40 streamed calls at once go out together on one session's pool, and its connections are
    kept for the next calls (read to their end, not closed)."""
    server.latency = 1.0  # all 40 in flight at once, even on a busy machine
    model = make_model(server, max_concurrency=40)
    for _ in range(2):
        await asyncio.gather(*(model.complete(ask(f"q{i}"), on_token=lambda piece: None) for i in range(40)))
    assert server.max_in_flight == 40
    assert len(model._sessions) == 1
    connector = model._sessions[asyncio.get_running_loop()].connector
    assert connector is not None
    assert sum(len(kept) for kept in connector._conns.values()) == 40  # the second round reused them
    assert server.connections == 40


# ------------------------------------------------------------------------------------ configuration


def test_no_key_and_no_base_url_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ModelConfigError) as info:
        OpenAICompatModel("fake-model")
    assert "OPENAI_API_KEY" in str(info.value)
    assert "OPENAI_BASE_URL" in str(info.value)


def test_empty_model_name_is_a_config_error() -> None:
    with pytest.raises(ModelConfigError, match="model name"):
        OpenAICompatModel("", api_key=KEY)


async def test_base_url_from_the_environment(server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    model = OpenAICompatModel("fake-model", retry=RetryPolicy(**FAST))
    try:
        assert model.endpoint == server.base_url
        response = await model.complete(ask())
        assert response.text == "reply to: What is RAG?"
        assert len(server.requests) == 1
        assert server.headers_seen[0]["authorization"] == "Bearer no-key"
    finally:
        await model.aclose()


# ------------------------------------------------------------------------------------------- engine


async def test_engine_runs_a_debate_on_the_server(server: FakeOpenAIServer, make_model: ModelFactory) -> None:
    model = make_model(server)
    result = await Engine(affirmative_critical(2), model).run("What is RAG?")
    assert result.status == "complete"
    assert result.error is None
    assert result.llm_calls == 5
    assert len(server.requests) == 5
    assert result.final_answer is not None
    assert result.final_answer.startswith("reply to: ")
    assert all(t.model == "openai:fake-model" for t in result.turns())


async def test_engine_reports_a_rejected_key_without_a_traceback(
    server: FakeOpenAIServer, make_model: ModelFactory
) -> None:
    model = make_model(server)
    server.faults.extend(Fault.http(401) for _ in range(20))
    result = await Engine(affirmative_critical(2), model).run("What is RAG?")
    assert result.status == "failed"
    # Both openings fail at once (no retries of a 401) and the debate stops after that round.
    assert len(server.requests) == 2
    assert result.final_answer is None
    for turn in result.turns():
        assert turn.error is not None
        assert "OPENAI_API_KEY" in turn.error
    assert result.error is not None
    assert "OPENAI_API_KEY" in result.error
    assert "Traceback" not in result.error


# ---------------------------------------------------------------------- found in review: the edges


async def test_422_on_response_format_also_falls_back(make_model: ModelFactory) -> None:
    with FakeOpenAIServer(reject_response_format=True, reject_status=422, reply=verdict_reply) as srv:
        model = make_model(srv)
        outcome = await complete_structured(model, ask("Is RAG useful?"), Verdict)
        assert outcome.ok and len(srv.requests) == 2 and model.format_refused(json_schema(Verdict))


async def test_a_400_that_is_not_about_response_format_keeps_the_flag(
    server: FakeOpenAIServer, make_model: ModelFactory
) -> None:
    model = make_model(server)
    server.faults.extend([Fault.http(400, "bad max_tokens"), Fault.http(400, "bad max_tokens")])
    with pytest.raises(ModelConfigError, match="bad max_tokens"):
        await complete_structured(model, ask(), Verdict)
    assert not model.format_refused(json_schema(Verdict))  # both requests failed: it was not the format


async def test_one_schema_refused_as_a_response_format_leaves_the_others_typed(make_model: ModelFactory) -> None:
    """A refusal is of one schema: a caller's schema the server cannot take switched structured output
    off for every debate of the server until its restart (an outside attack, session 38), and the
    victims' typed replies then failed to parse. The next request with another schema still sends it."""

    class Other(BaseModel):
        answer: str

    def refuses_verdict(request: dict[str, Any]) -> bool:
        return "Verdict" in json.dumps(request.get("response_format"))

    with FakeOpenAIServer(reject_response_format=refuses_verdict, reply=verdict_reply) as srv:
        model = make_model(srv)
        assert (await complete_structured(model, ask("Is RAG useful?"), Verdict)).ok
        assert model.format_refused(json_schema(Verdict)) and not model.format_refused(json_schema(Other))
        await complete_structured(model, ask("Name one."), Other)
        assert srv.requests[-1]["response_format"]["json_schema"]["name"] == "Other"
        await complete_structured(model, ask("Again?"), Verdict)
        assert "response_format" not in srv.requests[-1]  # the refused one goes in the prompt at once


async def test_a_stream_cut_mid_reply_is_retried_and_consumers_are_told(
    server: FakeOpenAIServer, make_model: ModelFactory
) -> None:
    server.reply = lambda request: "one two three four five"
    model = make_model(server)
    pieces: list[str] = []
    retries: list[tuple[int, str]] = []
    server.faults.append(Fault.cut(after_chunks=2))
    response = await model.complete(
        ask(), lambda p: pieces.append(p), lambda attempt, error: retries.append((attempt, error))
    )
    assert response.text == "one two three four five" and response.attempts == 2
    assert [a for a, _ in retries] == [2]
    assert "broke mid-reply" in retries[0][1]  # a cut, not a timeout (aiohttp's map says timeout)
    # The first attempt streamed two tokens before the cut (one piece or two: read together or
    # not); a consumer that clears on retry keeps only the second attempt's.
    assert "".join(pieces) == "one two" + response.text


async def test_the_per_call_timeout_covers_a_trickling_stream(
    server: FakeOpenAIServer, make_model: ModelFactory
) -> None:
    server.reply = lambda request: " ".join(["word"] * 60)  # 12 s at 0.2 s a chunk
    model = make_model(server, timeout_s=0.5, max_attempts=1)
    server.faults.append(Fault.trickle(0.2))  # every chunk within the read timeout, the whole not
    start = time.perf_counter()
    with pytest.raises(TransientModelError, match=r"per-call timeout of 0\.5 s"):
        await model.complete(ask(), lambda p: None)
    assert time.perf_counter() - start < 6.0  # cut at 0.5 s, not after the 12 s stream


def test_one_model_serves_several_event_loops(server: FakeOpenAIServer) -> None:
    # Models are cached per process; asyncio.run makes a new loop each time (the seed's facade).
    from moot import DebateEngine

    for _ in range(3):
        result = asyncio.run(
            DebateEngine(model="openai:fake-model", base_url=server.base_url, api_key=KEY).run_debate("Q?")
        )
        assert result.llm_calls == 5
    assert len(server.requests) == 15


async def test_credentials_in_the_base_url_are_never_shown(make_model: ModelFactory) -> None:
    model = OpenAICompatModel(
        "m", base_url="http://user:pw-secret-123@127.0.0.1:9/v1?api-key=qs-secret-456", api_key=KEY,
        retry=RetryPolicy(max_attempts=1),
    )  # fmt: skip
    assert model.endpoint == "http://127.0.0.1:9/v1"
    with pytest.raises(TransientModelError) as info:
        await model.complete(ask())
    message = str(info.value)
    assert "pw-secret-123" not in message and "qs-secret-456" not in message and "user:" not in message
    await model.aclose()


def test_retry_after_as_an_http_date() -> None:
    import email.utils

    from moot.models.openai_compat import _retry_after

    when = email.utils.formatdate(time.time() + 3, usegmt=True)
    wait = _retry_after({"retry-after": when})
    assert wait is not None and 1.0 <= wait <= 3.5


async def test_server_sent_events_are_read_by_the_whatwg_rules() -> None:
    from moot.models.openai_compat import _sse_events

    lines = [": a comment", "event: ping", "data: {\"a\":", "data: 1}", "", "id: 7", "retry: 10",
             "data:{\"b\": 2}", "", "data: [DONE]", "", "data: {\"after\": 1}", ""]  # fmt: skip
    # multi-line data joined with a newline; the space after "data:" is optional; nothing after [DONE]
    want = [("ping", b'{"a":\n1}'), (None, b'{"b": 2}')]
    consumed: list[bytes] = []

    async def body(text: bytes, size: int) -> Any:
        for i in range(0, len(text), size):
            consumed.append(text[i : i + size])
            yield text[i : i + size]

    for end in ("\n", "\r\n", "\r"):
        text = (end.join(lines) + end).encode()
        # However the body is cut into chunks (a CRLF split between two, a line across several)
        for size in (1, 2, 3, 7, len(text)):
            consumed.clear()
            assert [item async for item in _sse_events(body(text, size))] == want, (end, size)
            assert b"".join(consumed) == text  # read to its end, past [DONE], for the keep-alive
    # The end of the body ends the last event, and a multi-byte character split between chunks is whole.
    text = 'data: {"x": "caf\u00e9 \u2014 ok"}'.encode()
    assert [item async for item in _sse_events(body(text, 1))] == [(None, text[6:])]


class StreamBodyServer(FakeOpenAIServer):
    """Answers every streamed request with the event stream ``body``, as it is."""

    def __init__(self, body: bytes) -> None:
        super().__init__(reply=lambda request: "unused")
        self.body = body

    async def _stream(self, writer: Any, request: dict[str, Any], text: str, fault: Any = None) -> bool:
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n"
        writer.write(head % len(self.body) + self.body)
        await writer.drain()
        return True


#: A stream that starts, then sends an error object in it (as OpenAI does for a failure mid-stream).
STREAM_ERROR = (
    b'data: {"choices": [{"index": 0, "delta": {"content": "par"}}]}\n\n'
    b'data: {"error": {"message": "the model is overloaded", "type": "server_error"}}\n\n'
)


async def test_an_error_sent_inside_a_stream_is_a_model_error(make_model: ModelFactory) -> None:
    with StreamBodyServer(STREAM_ERROR) as srv:
        model = make_model(srv, max_attempts=1)
        pieces: list[str] = []
        with pytest.raises(ModelError) as err:
            await model.complete(ask(), on_token=pieces.append)
        assert "the model is overloaded" in str(err.value) and pieces == ["par"]


def test_credentials_in_the_base_url_are_sent_as_basic_auth_as_httpx_does(server: FakeOpenAIServer) -> None:
    """aiohttp refuses a URL with credentials beside an Authorization header; httpx sends them as
    Basic auth: so does moot, on either transport."""

    async def call() -> str:
        model = OpenAICompatModel("fake-model", base_url=f"http://user:pw@127.0.0.1:{server.port}/v1", api_key=KEY)
        return (await model.complete(ask("Say hi"))).text

    assert asyncio.run(call()) == "reply to: Say hi"
    assert server.headers_seen[-1]["authorization"] == "Basic dXNlcjpwdw=="


class EchoingAuthServer(FakeOpenAIServer):
    """A server that refuses the key, repeating the Authorization header it was sent (as some do)."""

    async def _respond(self, method: str, path: str, headers: dict[str, str], body: bytes, writer: Any) -> bool:
        message = f"Incorrect API key provided: {headers.get('authorization')}"
        await self._send(writer, 500, json.dumps({"error": {"message": message}}).encode())
        return True


async def test_basic_auth_from_the_base_url_is_never_shown(make_model: ModelFactory) -> None:
    """The base URL's user and password go upstream as a Basic header: a server that repeats that
    header in its error shows ``***``, not the credentials in base64 (nor percent-escaped or decoded)."""
    with EchoingAuthServer() as srv:
        model = OpenAICompatModel(
            "m", base_url=f"http://ap%40user:BASE-PASS-secret-77@127.0.0.1:{srv.port}/v1", api_key=KEY,
            retry=RetryPolicy(max_attempts=1),
        )  # fmt: skip
        with pytest.raises(TransientModelError) as info:
            await model.complete(ask())
        await model.aclose()
    message = str(info.value)
    assert "Incorrect API key provided: Basic ***" in message, message
    assert "BASE-PASS" not in message and "YXBAdXNlcjpCQVNFLVBBU1Mtc2VjcmV0LTc3" not in message


def test_a_models_clients_are_closed_with_their_event_loop() -> None:
    """A caller that never closes the model (``asyncio.run(engine.run(...))``) gets no "Unclosed
    client session" from aiohttp: the clients close as the loop shuts down."""
    import gc

    seen: list[str] = []

    async def call() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: seen.append(context["message"]))
        with FakeOpenAIServer() as srv:
            model = OpenAICompatModel("fake-model", base_url=srv.base_url, api_key=KEY)
            assert (await model.complete(ask("Say hi"), on_token=lambda piece: None)).text

    asyncio.run(call())
    gc.collect()
    assert not [m for m in seen if "Unclosed" in m]


def test_the_base_urls_path_and_query_are_kept_and_the_sdks_headers_sent(
    server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request goes to ``{base}/chat/completions`` with the base URL's query (an
    ``api-version``), percent-escaped credentials are sent decoded as Basic auth, and the
    organization and project of the environment are sent as the ``openai`` SDK sends them."""
    monkeypatch.setenv("OPENAI_ORG_ID", "org-123")
    monkeypatch.setenv("OPENAI_PROJECT_ID", "proj-456")

    async def call() -> str:
        base = f"http://us%40er:p%3Aw@127.0.0.1:{server.port}/v1/?api-version=2024-10-21"
        model = OpenAICompatModel("fake-model", base_url=base, api_key=KEY)
        try:
            return (await model.complete(ask("Say hi"))).text
        finally:
            await model.aclose()

    assert asyncio.run(call()) == "reply to: Say hi"
    assert server.paths == ["/v1/chat/completions?api-version=2024-10-21"]
    headers = server.headers_seen[0]
    assert headers["authorization"] == "Basic " + base64.b64encode(b"us@er:p:w").decode()
    assert headers["openai-organization"] == "org-123" and headers["openai-project"] == "proj-456"
    assert headers["content-type"] == "application/json"


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize(
    ("fault", "error", "words"),
    [
        (Fault.http(429, message="slow down"), TransientModelError, "rate limited"),
        (Fault.http(503, message="backend down"), TransientModelError, "backend down"),
        (Fault.http(401), ModelConfigError, "OPENAI_API_KEY"),
        (Fault.reset(), TransientModelError, "could not connect"),
    ],
)
async def test_faults_of_a_streamed_call_map_as_those_of_a_plain_one(
    server: FakeOpenAIServer,
    make_model: ModelFactory,
    fault: Fault,
    error: type[ModelError],
    words: str,
    streamed: bool,
) -> None:
    model = make_model(server, max_attempts=1)
    server.faults.append(fault)
    with pytest.raises(error, match=words):
        await model.complete(ask(), on_token=(lambda piece: None) if streamed else None)
    assert not server.faults  # the fault was used by this call
    assert (await model.complete(ask(), on_token=(lambda piece: None) if streamed else None)).text


class HtmlErrorServer(FakeOpenAIServer):
    """A proxy in front of the model answering 502 with an HTML page."""

    async def _respond(self, method: str, path: str, headers: dict[str, str], body: bytes, writer: Any) -> bool:
        self.requests.append(json.loads(body))
        await self._send(writer, 502, b"<html><body>Bad gateway: upstream timed out</body></html>\n")
        return True


async def test_an_error_page_that_is_not_json_is_shown_as_text(make_model: ModelFactory) -> None:
    with HtmlErrorServer() as srv:
        model = make_model(srv, max_attempts=1)
        with pytest.raises(TransientModelError, match=r"failed \(502\): <html><body>Bad gateway: upstream timed out"):
            await model.complete(ask(), on_token=lambda piece: None)


async def test_a_stream_chunk_that_is_not_json_is_a_transient_error(make_model: ModelFactory) -> None:
    # The second chunk is not JSON.
    with StreamBodyServer(
        b'data: {"choices": [{"index": 0, "delta": {"content": "par"}}]}\n\ndata: {not json\n\n'
    ) as srv:
        model = make_model(srv, max_attempts=2)
        with pytest.raises(TransientModelError, match="stream chunk that is not valid JSON"):
            await model.complete(ask(), on_token=lambda piece: None)
        assert len(srv.requests) == 2  # retried once


def test_a_request_body_orjson_refuses_is_written_by_the_standard_library() -> None:
    """The request's JSON (moot.files.json_bytes): orjson's compact UTF-8, and the standard library's
    escapes for what orjson refuses (a lone surrogate, an integer past 64 bits): either way the same
    value is sent."""
    from moot.files import json_bytes

    plain = {"messages": [{"role": "user", "content": "café, 7?"}], "max_tokens": 40, "stream": True}
    assert (
        json_bytes(plain)
        == '{"messages":[{"role":"user","content":"café, 7?"}],"max_tokens":40,"stream":true}'.encode()
    )
    for refused in ({"content": "x\ud800y"}, {"seed": 2**70}):
        assert json.loads(json_bytes(refused)) == refused and json_bytes(refused).isascii()


async def test_the_request_sent_is_the_payload_built(server: FakeOpenAIServer, make_model: ModelFactory) -> None:
    """What the fake server reads back is what moot built, a non-ASCII question included."""
    await make_model(server).complete(ask("Ist 7 prim? Größe: ½"))
    assert server.requests[-1]["messages"][-1]["content"] == "Ist 7 prim? Größe: ½"


def test_a_chunk_orjson_refuses_is_read_as_the_standard_library_reads_it() -> None:
    """An escaped lone surrogate (scrubbed from the reply's text later) and bytes that are not
    UTF-8 are read, not taken for a broken chunk; what neither parser takes is a ValueError."""
    from moot.models.openai_compat import _json

    assert _json(b'{"a": "x\\ud800y"}') == {"a": "x\ud800y"}
    assert _json(b'{"a": "caf\xe9"}') == {"a": "caf\ufffd"}
    assert _json(b'{"a": [1, 2]}') == {"a": [1, 2]}
    with pytest.raises(ValueError):
        _json(b"{not json")


async def test_a_server_that_returns_no_logprobs_asked_for_is_known_to_return_none(
    server: FakeOpenAIServer, make_model: ModelFactory
) -> None:
    """A client pass: a weighted vote on a server that returns no log-probabilities made every sample
    call before finding no signal, debate after debate. Asked for them and given none, the model knows
    it returns none, and the next debate that needs them is refused before its first call."""
    from moot.core.engine import Engine
    from moot.core.spec import SpecError
    from moot.models.base import ChatRequest, Message
    from moot.protocols import get_preset

    model = make_model(server)
    assert model.returns_logprobs is None  # not known before a call
    plain = ChatRequest(messages=[Message(role="user", content="hi")])
    await model.complete(plain)
    assert model.returns_logprobs is None  # not asked: nothing learnt
    await model.complete(plain.model_copy(update={"logprobs": 5}))
    assert model.returns_logprobs is False
    with pytest.raises(SpecError, match="returns none"):
        Engine(get_preset("cisc", k=2), model)
    calls = len(server.requests)
    assert calls == 2
