"""Any OpenAI-compatible chat endpoint, through the official ``openai`` SDK (async).

OpenAI itself, Ollama, vLLM, a llama.cpp server, LM Studio, OpenRouter: set ``OPENAI_BASE_URL``
(and ``OPENAI_API_KEY`` where the server wants one), or pass ``base_url=`` / ``api_key=``.

The SDK's own retries are turned off (``max_retries=0``) so that one retry policy, moot's, governs
every backend the same way; its exceptions are mapped onto moot's error classes here.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import os
import re
import time
import weakref
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import openai
from openai.types.chat import ChatCompletion

from moot.models.base import (
    BaseChatModel,
    ChatRequest,
    ChatResponse,
    ModelConfigError,
    ModelError,
    ResponseFormatRejected,
    RetryPolicy,
    TokenCallback,
    TokenLogprob,
    TransientModelError,
    Usage,
    approx_tokens,
    chat_payload,
    emit_token,
    messages_tokens,
    token_logprob,
)
from moot.models.openai_http import closed_with, http_client
from moot.secrets import redact

DEFAULT_TIMEOUT_S = 60.0
DEFAULT_CONCURRENCY = 8
#: Calls at once per HTTP client. A client's connection pool (httpcore) goes over all its connections,
#: probing each idle one's socket, at every request and every reply's end: with one pool for 128
#: calls at once that was about 15% of a debate's CPU (docs/benchmarks.md, moot serve), so a model
#: allowed more calls at once has one client per this many, each with its own pool.
CALLS_PER_CLIENT = 16


def _retry_after(exc: openai.APIStatusError) -> float | None:
    headers = exc.response.headers if exc.response is not None else {}
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return float(ms) / 1000.0
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value:
        try:
            return float(value)
        except ValueError:
            pass
        try:  # an HTTP date
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return max(0.0, when.timestamp() - time.time())
    return None


def split_url_secrets(url: str) -> tuple[str, list[str]]:
    """A base URL safe to show (no user, password or query) and the secrets it carried."""
    parts = urlsplit(url)
    secrets = [v for v in (parts.username, parts.password) if v]
    secrets += [v for _, v in parse_qsl(parts.query) if v]
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", "")), secrets


class OpenAICompatModel(BaseChatModel):
    """``openai:MODEL``."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_concurrency: int | None = DEFAULT_CONCURRENCY,
        retry: RetryPolicy | None = None,
    ) -> None:
        if not model:
            raise ModelConfigError("an openai model spec needs a model name, e.g. openai:gpt-4o-mini")
        super().__init__(f"openai:{model}", max_concurrency=max_concurrency, retry=retry)
        self.model = model
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        key = api_key or os.environ.get("OPENAI_API_KEY") or None
        if key is None and self.base_url is None:
            raise ModelConfigError(
                "no API key for openai:" + model + ": set OPENAI_API_KEY, or set OPENAI_BASE_URL to a "
                "local OpenAI-compatible server (Ollama, vLLM, llama.cpp) that needs none"
            )
        # Local servers take any key; the SDK insists on one.
        self._api_key = key or "no-key"
        self._secrets = [key] if key else []
        #: The endpoint as shown in messages: without credentials or query (which may hold a key).
        self.endpoint, url_secrets = split_url_secrets(self.base_url or "https://api.openai.com/v1")
        self._secrets += url_secrets
        self.timeout_s = timeout_s
        # Clients per event loop (an httpx client is bound to the loop it was made on), created on
        # first use, never in __init__: one for every CALLS_PER_CLIENT calls at once, taken in turn.
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[openai.AsyncOpenAI]] = (
            weakref.WeakKeyDictionary()
        )
        #: Per event loop, what closes its clients when the loop shuts down (:func:`.openai_http.closed_with`).
        self._closers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncIterator[None]] = (
            weakref.WeakKeyDictionary()
        )
        self._turn = 0
        self.supports_response_format = True

    def identity(self) -> dict[str, Any]:
        return {**super().identity(), "endpoint": self.endpoint}

    def _get_client(self) -> openai.AsyncOpenAI:
        loop = asyncio.get_running_loop()
        clients = self._clients.get(loop)
        if clients is None:
            count = -(-(self.max_concurrency or DEFAULT_CONCURRENCY) // CALLS_PER_CLIENT)
            clients = [
                openai.AsyncOpenAI(
                    api_key=self._api_key,
                    base_url=self.base_url,
                    timeout=self.timeout_s,
                    max_retries=0,
                    http_client=http_client(self.base_url or "https://api.openai.com/v1"),
                )
                for _ in range(count)
            ]
            self._clients[loop] = clients
            self._closers[loop] = closed_with(loop, clients)
        self._turn = (self._turn + 1) % len(clients)
        return clients[self._turn]

    async def aclose(self) -> None:
        for client in self._clients.pop(asyncio.get_running_loop(), []):
            await client.close()

    def _safe(self, text: str) -> str:
        return redact(text, self._secrets)

    def _map_error(self, exc: Exception, *, with_schema: bool) -> ModelError:
        where = f"{self.endpoint} (model {self.model!r})"
        if isinstance(exc, openai.APITimeoutError):
            return TransientModelError(f"no reply from {where} within the per-call timeout of {self.timeout_s:g} s")
        if isinstance(exc, openai.APIConnectionError):
            return TransientModelError(f"could not connect to {where}: {self._safe(str(exc))}")
        if isinstance(exc, openai.APIResponseValidationError):
            return TransientModelError(f"{where} sent a reply that is not a valid chat completion")
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            body = self._safe(_error_message(exc))
            if status == 429:
                return TransientModelError(
                    f"rate limited by {where} (429): {body}", status=status, retry_after=_retry_after(exc)
                )
            if status >= 500 or status in (408, 409):
                return TransientModelError(f"{where} failed ({status}): {body}", status=status)
            if status in (400, 422) and with_schema:
                return ResponseFormatRejected(f"{where} rejected response_format ({status}): {body}", status=status)
            if status == 401:
                return ModelConfigError(
                    f"{where} rejected the API key (401): check OPENAI_API_KEY (or --api-key)", status=status
                )
            if status == 403:
                return ModelConfigError(
                    f"{where} refused access (403): the key has no access to this model", status=status
                )
            if status == 404:
                return ModelConfigError(
                    f"{where} answered 404: check the model name and the base URL "
                    f"(OPENAI_BASE_URL usually ends in /v1): {body}",
                    status=status,
                )
            return ModelConfigError(f"{where} rejected the request ({status}): {body}", status=status)
        if isinstance(exc, json.JSONDecodeError | ValueError):
            return TransientModelError(f"{where} sent a reply that is not valid JSON")
        return ModelError(f"call to {where} failed: {self._safe(type(exc).__name__ + ': ' + str(exc))}")

    async def _complete_once(self, request: ChatRequest, on_token: TokenCallback | None) -> ChatResponse:
        use_schema = request.response_schema is not None and self.supports_response_format
        try:
            return await self._timed_call(request, on_token, use_schema=use_schema)
        except ResponseFormatRejected:
            # Retried once without response_format, the schema in the prompt; remembered, so the
            # next calls (and retries) to this server do not waste a request on it. If the plain
            # request is refused too, the 400 was about something else: forget the verdict.
            self.supports_response_format = False
            try:
                return await self._timed_call(request, on_token, use_schema=False)
            except ModelConfigError:
                self.supports_response_format = True
                raise

    async def _timed_call(
        self, request: ChatRequest, on_token: TokenCallback | None, *, use_schema: bool
    ) -> ChatResponse:
        """One request under the per-call timeout, which covers the whole reply (a trickling
        stream included), not only the wait for each chunk."""
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._call(request, on_token, use_schema=use_schema)
        except TimeoutError:
            raise TransientModelError(
                f"no complete reply from {self.endpoint} (model {self.model!r}) within the per-call "
                f"timeout of {self.timeout_s:g} s"
            ) from None

    async def _call(self, request: ChatRequest, on_token: TokenCallback | None, *, use_schema: bool) -> ChatResponse:
        payload = chat_payload(request, model=self.model, schema=use_schema)
        client = self._get_client()
        try:
            if on_token is None:
                completion = await client.post("/chat/completions", cast_to=ChatCompletion, body=payload)
                if not getattr(completion, "choices", None):
                    raise TransientModelError(f"{self.endpoint} sent a chat completion without choices")
                choice = completion.choices[0]
                text = choice.message.content or ""
                finish: str | None = choice.finish_reason
                logprobs = _logprobs(getattr(choice, "logprobs", None))
                usage = completion.usage
                used = (
                    Usage.from_openai(usage)
                    if usage is not None
                    else Usage(prompt_tokens=messages_tokens(request.messages), completion_tokens=approx_tokens(text))
                )
            else:
                text, finish, used, logprobs = await self._stream(client, payload, request, on_token)
        except ModelError:
            raise
        except Exception as exc:
            raise self._map_error(exc, with_schema=use_schema) from None
        return ChatResponse(
            text=text,
            usage=used,
            finish_reason=finish,
            model=self.name,
            schema_in_prompt=request.response_schema is not None and not use_schema,
            logprobs=logprobs if request.logprobs is not None else None,
        )

    async def _stream(
        self,
        client: openai.AsyncOpenAI,
        payload: dict[str, Any],
        request: ChatRequest,
        on_token: TokenCallback,
    ) -> tuple[str, str | None, Usage, list[TokenLogprob] | None]:
        """Stream a reply. The SDK makes the request (auth, retries, status errors); the chunks are
        read as plain JSON: building the SDK's typed object for every streamed token was about half
        of a served debate's CPU (docs/benchmarks.md, moot serve)."""
        parts: list[str] = []
        logprobs: list[TokenLogprob] | None = None
        finish: str | None = None
        usage: Usage | None = None
        # The SDK's plain POST (auth, headers, status errors), the body as it is: its typed
        # ``create`` walks the arguments through their annotations first, ~4% of a served call.
        stream = await client.post(
            "/chat/completions",
            cast_to=object,
            body={**payload, "stream": True, "stream_options": {"include_usage": True}},
            stream=True,
            stream_cls=openai.AsyncStream[Any],
        )
        response = stream.response
        try:
            async for event, data in self._guarded(_sse_events(response.aiter_bytes())):
                chunk = json.loads(data)
                if not isinstance(chunk, dict):
                    raise TransientModelError(f"{self.endpoint} sent a stream chunk that is not a JSON object")
                if chunk.get("error") or event == "error":
                    error = chunk.get("error")
                    message = error.get("message") if isinstance(error, dict) else None
                    raise openai.APIError(
                        message=message if isinstance(message, str) else "An error occurred during streaming",
                        request=response.request,
                        body=error,
                    )
                used = chunk.get("usage")
                if isinstance(used, dict):
                    usage = Usage.from_openai(used)
                for choice in chunk.get("choices") or ():
                    delta = choice.get("delta") or {}
                    piece = delta.get("content")
                    if piece:
                        parts.append(piece)
                        await emit_token(on_token, piece)
                    if choice.get("finish_reason"):
                        finish = choice["finish_reason"]
                    tokens = _logprobs(choice.get("logprobs"))
                    if tokens is not None:
                        logprobs = (logprobs or []) + tokens
        finally:
            await stream.close()
        text = "".join(parts)
        if usage is None:
            usage = Usage(prompt_tokens=messages_tokens(request.messages), completion_tokens=approx_tokens(text))
        return text, finish, usage, logprobs

    async def _guarded(self, events: AsyncIterator[tuple[str | None, str]]) -> AsyncIterator[tuple[str | None, str]]:
        """The events of a stream, its transport failures (a cut connection, a read timeout) as the
        SDK's own stream reports them: transient, so the call is retried."""
        where = f"{self.endpoint} (model {self.model!r})"
        try:
            async for item in events:
                yield item
        except _TIMEOUTS:
            raise TransientModelError(
                f"no reply from {where} within the per-call timeout of {self.timeout_s:g} s"
            ) from None
        except _TRANSPORT as exc:
            raise TransientModelError(
                f"the connection to {where} broke mid-reply: {self._safe(type(exc).__name__ + ': ' + str(exc))}"
            ) from None


def _transport_errors() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    """(timeouts, transport errors) of the HTTP library the installed ``openai`` SDK uses (``httpx``
    before 3.x, ``httpx2`` since)."""
    import importlib

    timeouts: list[type[BaseException]] = []
    transport: list[type[BaseException]] = []
    for name in ("httpx", "httpx2"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        timeouts.append(module.TimeoutException)
        transport.append(module.RequestError)
    return tuple(timeouts), tuple(transport)


_TIMEOUTS, _TRANSPORT = _transport_errors()


_LINE_END = re.compile(rb"\r\n|\r|\n")


async def _sse_events(body: AsyncIterator[bytes]) -> AsyncIterator[tuple[str | None, str]]:
    """(event, data) of each server-sent event before ``[DONE]``, read from the body's bytes (the
    WHATWG rules: lines end with CRLF, LF or CR; ``data`` lines joined by newlines, comments and
    ``id``/``retry`` ignored, an event dispatched at a blank line or the end). Reading bytes, not
    the HTTP library's decoded text lines, saves two iterator layers per streamed token (the
    served debate's hottest path: docs/benchmarks.md, moot serve). The body is read to its end even
    after ``[DONE]``, so that the keep-alive connection goes back to the pool."""
    event: str | None = None
    data: list[str] = []
    done = False
    tail = b""

    def field(raw: bytes) -> None:
        nonlocal event
        line = raw.decode("utf-8", "replace")
        if line.startswith(":"):
            return
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value

    async for chunk in body:
        if done:
            continue
        buf = tail + chunk
        # A CR at the end may be the first half of a CRLF: it waits for the next chunk.
        held = buf.endswith(b"\r")
        lines = _LINE_END.split(buf[:-1] if held else buf)
        tail = lines.pop() + (b"\r" if held else b"")  # the line not ended yet
        for raw in lines:
            if raw:
                field(raw)
                continue
            if data:
                joined = "\n".join(data)
                if joined.startswith("[DONE]"):
                    done = True
                    break
                yield event, joined
            event, data = None, []
    if done:
        return
    if tail.rstrip(b"\r"):
        field(tail.rstrip(b"\r"))
    if data and not "\n".join(data).startswith("[DONE]"):
        yield event, "\n".join(data)


def _logprobs(raw: Any) -> list[TokenLogprob] | None:
    """The SDK's ``choice.logprobs`` (an object, or a dict from a lenient server) as moot's tokens."""
    if raw is None:
        return None
    content = raw.get("content") if isinstance(raw, dict) else getattr(raw, "content", None)
    if not content:
        return None
    return [token_logprob(t if isinstance(t, dict) else t.model_dump()) for t in content]


def _error_message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])[:300]
        if isinstance(inner, str):
            return inner[:300]
    return str(exc.message)[:300]
