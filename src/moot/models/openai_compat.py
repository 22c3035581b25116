"""Any OpenAI-compatible chat endpoint (``POST /chat/completions``, plain and streamed).

OpenAI itself, Ollama, vLLM, a llama.cpp server, LM Studio, OpenRouter: set ``OPENAI_BASE_URL``
(and ``OPENAI_API_KEY`` where the server wants one), or pass ``base_url=`` / ``api_key=``.

The requests go over aiohttp (:mod:`moot.models.openai_http`), not through the ``openai`` SDK's
client, whose request and response objects cost 30% of a streamed call's CPU; what the SDK does for
a call is done here: the key and ``OPENAI_ORG_ID`` / ``OPENAI_PROJECT_ID`` as headers, Basic auth
from the base URL's credentials, the environment's proxy, and the status errors, each mapped onto
moot's error classes. One retry policy, moot's, governs every backend the same way.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import os
import re
import time
import weakref
from collections.abc import AsyncIterator, Mapping
from typing import Any, TypeVar
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

import aiohttp
import orjson

from moot.files import json_bytes
from moot.models import openai_http
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
    UnreachableModelError,
    Usage,
    approx_tokens,
    chat_payload,
    emit_token,
    messages_tokens,
    token_logprob,
)
from moot.secrets import redact

_T = TypeVar("_T")

#: Where ``openai:`` models are served when no base URL is given.
OPENAI_URL = "https://api.openai.com/v1"
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_CONCURRENCY = 8
#: The most schemas one server's refusals of a ``response_format`` are remembered for.
MAX_REFUSED_FORMATS = 256


def _schema_key(schema: dict[str, Any]) -> str:
    """A schema as the refusals remember it: its JSON, keys sorted."""
    return orjson.dumps(schema, option=orjson.OPT_SORT_KEYS).decode()


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """How long a 429 asks to wait: ``retry-after-ms``, or ``retry-after`` in seconds or as an HTTP date."""
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
    # As written and as sent (percent-escapes decoded), and as the Basic header sends them (base64).
    secrets = [v for raw in (parts.username, parts.password) if raw for v in {raw, unquote(raw)}]
    _, basic_auth = openai_http.chat_url(url)
    if basic_auth is not None:
        secrets.append(basic_auth.split(" ", 1)[1])
    secrets += [v for _, v in parse_qsl(parts.query) if v]
    return urlunsplit((parts.scheme, openai_http.host(parts), parts.path, "", "")), secrets


class OpenAICompatModel(BaseChatModel):
    """``openai:MODEL``."""

    #: Images go to the server as ``image_url`` parts: whether its model reads them is its to say.
    reads_images = True

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
        self._secrets = [key] if key else []
        base = self.base_url or OPENAI_URL
        try:
            parts = urlsplit(base)
            usable = parts.scheme in ("http", "https") and bool(parts.hostname)
            usable = usable and (parts.port is None or parts.port > 0)
        except ValueError:  # a port out of 0-65535 or not a number, a broken [IPv6] host
            usable = False
        if not usable:
            # Before any call (it was four attempts at a URL aiohttp cannot use, then exit 1), and
            # shown without its query or credentials (either may hold a key), scheme or none.
            scheme, sep, rest = base.partition("://") if "://" in base else ("", "", base)
            if "@" in scheme or "?" in scheme or "#" in scheme:  # no scheme after all: credentials before a "://"
                scheme, sep, rest = "", "", base
            rest = rest.split("?", 1)[0].split("#", 1)[0].rsplit("@", 1)[-1]
            raise ModelConfigError(
                f"the base URL {scheme + sep + rest!r} is not an http(s) URL with a host (and a port in 1-65535): "
                "give one like http://localhost:11434/v1 (--base-url or OPENAI_BASE_URL)"
            )
        #: The endpoint as shown in messages: without credentials or query (which may hold a key).
        self.endpoint, url_secrets = split_url_secrets(base)
        self._secrets += url_secrets
        self._url, basic_auth = openai_http.chat_url(base)
        # Local servers take any key: "no-key" where none was given.
        self._headers = openai_http.request_headers(key or "no-key", basic_auth)
        self.timeout_s = timeout_s
        # A session per event loop (an aiohttp session is bound to the loop it was made on), made
        # on first use, never in __init__, and closed with its loop (:func:`.openai_http.closed_with`).
        self._sessions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aiohttp.ClientSession] = (
            weakref.WeakKeyDictionary()
        )
        self._closers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncIterator[None]] = (
            weakref.WeakKeyDictionary()
        )
        #: The schemas this server refused as a ``response_format`` (each in the prompt from then on),
        #: by their JSON: a refusal is of one schema, not the server's verdict on every caller's (one
        #: caller's schema it cannot take switched structured output off for every debate). At most
        #: :data:`MAX_REFUSED_FORMATS`, the oldest forgotten.
        self._format_refused: dict[str, None] = {}

    def format_refused(self, schema: dict[str, Any]) -> bool:
        """Whether this server refused ``schema`` as a ``response_format`` (it goes in the prompt)."""
        return bool(self._format_refused) and _schema_key(schema) in self._format_refused

    def identity(self) -> dict[str, Any]:
        return {**super().identity(), "endpoint": self.endpoint}

    def runtime(self) -> dict[str, Any]:
        """Where this session's replies come from, as a run records it (:class:`moot.eval.store.RunSession`):
        the endpoint (no credential in it), which the model spec does not name."""
        return {"endpoint": self.endpoint}

    def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None:
            session = self._sessions[loop] = openai_http.session(self._url)
            self._closers[loop] = openai_http.closed_with(loop, [session])
        return session

    async def aclose(self) -> None:
        session = self._sessions.pop(asyncio.get_running_loop(), None)
        if session is not None:
            await session.close()

    def _safe(self, text: str) -> str:
        return redact(text, self._secrets)

    def _status_error(self, status: int, headers: Mapping[str, str], body: bytes, *, with_schema: bool) -> ModelError:
        """The error of a reply with an HTTP error status, its message the server's (redacted)."""
        where = f"{self.endpoint} (model {self.model!r})"
        message = self._safe(_error_message(body))
        if status == 429:
            return TransientModelError(
                f"rate limited by {where} (429): {message}", status=status, retry_after=_retry_after(headers)
            )
        if status >= 500 or status in (408, 409):
            return TransientModelError(f"{where} failed ({status}): {message}", status=status)
        if status in (400, 422) and with_schema:
            return ResponseFormatRejected(f"{where} rejected response_format ({status}): {message}", status=status)
        if status == 401:
            return ModelConfigError(
                f"{where} rejected the API key (401): check OPENAI_API_KEY (or the key given: --api-key, api_key=)",
                status=status,
            )
        if status == 403:
            return ModelConfigError(f"{where} refused access (403): the key has no access to this model", status=status)
        if status == 404:
            return ModelConfigError(
                f"{where} answered 404: check the model name and the base URL "
                f"(OPENAI_BASE_URL usually ends in /v1): {message}",
                status=status,
            )
        return ModelConfigError(f"{where} rejected the request ({status}): {message}", status=status)

    async def _complete_once(self, request: ChatRequest, on_token: TokenCallback | None) -> ChatResponse:
        schema = request.response_schema
        use_schema = schema is not None and not self.format_refused(schema)
        try:
            return await self._timed_call(request, on_token, use_schema=use_schema)
        except ResponseFormatRejected:
            # Retried once without response_format, the schema in the prompt; remembered for this
            # schema, so the next calls (and retries) with it do not waste a request. If the plain
            # request is refused too, the 400 was about something else: forget the verdict.
            assert schema is not None
            key = _schema_key(schema)
            self._format_refused[key] = None
            while len(self._format_refused) > MAX_REFUSED_FORMATS:
                del self._format_refused[next(iter(self._format_refused))]
            try:
                return await self._timed_call(request, on_token, use_schema=False)
            except ModelConfigError:
                self._format_refused.pop(key, None)
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
        if on_token is not None:
            payload["stream"] = True
            payload["stream_options"] = {"include_usage": True}
        body = json_bytes(payload)
        try:
            async with openai_http.post(self._session(), self._url, body, self._headers) as response:
                if response.status >= 400:
                    error = await self._read(response)
                    raise self._status_error(response.status, response.headers, error, with_schema=use_schema)
                if on_token is None:
                    text, finish, used, logprobs = self._whole(await self._read(response), request)
                else:
                    text, finish, used, logprobs = await self._stream(response, request, on_token)
        except ModelError:
            raise
        except (aiohttp.ClientError, OSError) as exc:  # before the reply began: the reply's own are mapped below
            # No connection made at all (refused, no route, no such host): the endpoint is down, not
            # this call (a run stops on it once the retries are spent; WatchedModel).
            unreachable = isinstance(exc, aiohttp.ClientConnectorError | ConnectionRefusedError)
            raise (UnreachableModelError if unreachable else TransientModelError)(
                f"could not connect to {self.endpoint} (model {self.model!r}): "
                f"{self._safe(type(exc).__name__ + ': ' + str(exc))}"
            ) from None
        if request.logprobs is not None and logprobs is None and text and self.returns_logprobs is None:
            # Asked for and not returned: this server gives none (a client pass: a weighted vote made
            # every sample call before it found no signal, debate after debate). The next debate that
            # needs them is refused before its first call (moot.core.engine.refuse_blind_models).
            self.returns_logprobs = False
        return ChatResponse(
            text=text,
            usage=used,
            finish_reason=finish,
            model=self.name,
            schema_in_prompt=request.response_schema is not None and not use_schema,
            logprobs=logprobs if request.logprobs is not None else None,
        )

    async def _read(self, response: aiohttp.ClientResponse) -> bytes:
        """A whole reply's body, a broken connection as a transient error (the call is retried)."""
        try:
            return await response.read()
        except (aiohttp.ClientError, OSError) as exc:
            raise self._broke(exc) from None

    def _broke(self, exc: BaseException) -> TransientModelError:
        return TransientModelError(
            f"the connection to {self.endpoint} (model {self.model!r}) broke mid-reply: "
            f"{self._safe(type(exc).__name__ + ': ' + str(exc))}"
        )

    def _whole(self, body: bytes, request: ChatRequest) -> tuple[str, str | None, Usage, list[TokenLogprob] | None]:
        """A plain (not streamed) chat completion's text, finish reason, usage and log-probabilities."""
        try:
            completion = json.loads(body)
        except ValueError:
            raise TransientModelError(
                f"{self.endpoint} (model {self.model!r}) sent a reply that is not valid JSON"
            ) from None
        choices = completion.get("choices") if isinstance(completion, dict) else None
        if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
            raise TransientModelError(f"{self.endpoint} sent a chat completion without choices")
        choice = choices[0]
        message = choice.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        text = content if isinstance(content, str) else ""
        finish = choice.get("finish_reason")
        usage = completion.get("usage")
        used = (
            Usage.from_openai(usage)
            if isinstance(usage, dict)
            else Usage(prompt_tokens=messages_tokens(request.messages), completion_tokens=approx_tokens(text))
        )
        return text, finish if isinstance(finish, str) else None, used, _logprobs(choice.get("logprobs"))

    async def _stream(
        self, response: aiohttp.ClientResponse, request: ChatRequest, on_token: TokenCallback
    ) -> tuple[str, str | None, Usage, list[TokenLogprob] | None]:
        """A streamed reply, its chunks read as plain JSON as they come, each piece passed on."""
        parts: list[str] = []
        logprobs: list[TokenLogprob] | None = None
        finish: str | None = None
        usage: Usage | None = None
        # The pieces of the events read together are passed on as one: they arrived at once, and
        # each piece passed on costs the engine an event (a loaded server reads a stream's tokens
        # in bunches: the busier it is, the fewer pieces it handles per token).
        async for batch in self._guarded(_sse_batches(response.content.iter_any())):
            new: list[str] = []
            for event, data in batch:
                try:
                    chunk = _json(data)
                except ValueError:
                    raise TransientModelError(f"{self.endpoint} sent a stream chunk that is not valid JSON") from None
                if not isinstance(chunk, dict):
                    raise TransientModelError(f"{self.endpoint} sent a stream chunk that is not a JSON object")
                if chunk.get("error") or event == "error":
                    if new:  # what came before the error is passed on first
                        await self._passed_on(new, parts, on_token)
                    error = chunk.get("error")
                    message = error.get("message") if isinstance(error, dict) else None
                    raise ModelError(
                        f"call to {self.endpoint} (model {self.model!r}) failed: "
                        + self._safe(message if isinstance(message, str) else "an error occurred during streaming")
                    )
                used = chunk.get("usage")
                if isinstance(used, dict):
                    usage = Usage.from_openai(used)
                for choice in chunk.get("choices") or ():
                    delta = choice.get("delta") or {}
                    piece = delta.get("content")
                    if piece:
                        new.append(piece)
                    if choice.get("finish_reason"):
                        finish = choice["finish_reason"]
                    tokens = _logprobs(choice.get("logprobs"))
                    if tokens is not None:
                        logprobs = (logprobs or []) + tokens
            if new:
                await self._passed_on(new, parts, on_token)
        text = "".join(parts)
        if usage is None:
            usage = Usage(prompt_tokens=messages_tokens(request.messages), completion_tokens=approx_tokens(text))
        return text, finish, usage, logprobs

    @staticmethod
    async def _passed_on(new: list[str], parts: list[str], on_token: TokenCallback) -> None:
        piece = new[0] if len(new) == 1 else "".join(new)
        parts.append(piece)
        await emit_token(on_token, piece)

    async def _guarded(self, events: AsyncIterator[_T]) -> AsyncIterator[_T]:
        """The events of a stream, a connection that broke mid-reply as a transient error (the call
        is retried)."""
        try:
            async for item in events:
                yield item
        except (aiohttp.ClientError, OSError) as exc:
            raise self._broke(exc) from None


_LINE_END = re.compile(rb"\r\n|\r|\n")


def _json(data: bytes) -> Any:
    """A stream chunk's JSON: orjson (a quarter of ``json.loads``'s time per chunk, one per streamed
    token), and the standard library for what orjson refuses and it takes (an escaped lone
    surrogate, which the reply's text has scrubbed later; bytes that are not UTF-8, replaced)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data.decode("utf-8", "replace"))


async def _sse_batches(body: AsyncIterator[bytes]) -> AsyncIterator[list[tuple[str | None, bytes]]]:
    """The server-sent events before ``[DONE]`` as (event, data), a list of them per piece of the
    body read that ended any (the WHATWG rules: lines end with CRLF, LF or CR; ``data`` lines
    joined by newlines, comments and ``id``/``retry`` ignored, an event dispatched at a blank line
    or the end). The data stays bytes, as JSON parsers take them: reading bytes, not the HTTP
    library's decoded text lines, and not decoding a line that only carries data, saves most of the
    reader's work per streamed token (the served debate's hottest path: docs/benchmarks.md, moot
    serve). The body is read to its end even after ``[DONE]``, so that the keep-alive connection
    goes back to the pool."""
    event: str | None = None
    data: list[bytes] = []
    done = False
    tail = b""

    def field(raw: bytes) -> None:
        nonlocal event
        if raw.startswith(b"data:"):
            data.append(raw[6:] if raw.startswith(b"data: ") else raw[5:])
            return
        if raw.startswith(b":"):
            return
        name, _, value = raw.partition(b":")
        value = value[1:] if value.startswith(b" ") else value
        if name == b"data":
            data.append(value)
        elif name == b"event":
            event = value.decode("utf-8", "replace")

    async for chunk in body:
        if done:
            continue
        buf = tail + chunk if tail else chunk
        if b"\r" in buf:
            # A CR at the end may be the first half of a CRLF: it waits for the next chunk.
            held = buf.endswith(b"\r")
            lines = _LINE_END.split(buf[:-1] if held else buf)
            tail = lines.pop() + (b"\r" if held else b"")  # the line not ended yet
        else:
            lines = buf.split(b"\n")
            tail = lines.pop()
        batch: list[tuple[str | None, bytes]] = []
        for raw in lines:
            if raw:
                field(raw)
                continue
            if data:
                joined = data[0] if len(data) == 1 else b"\n".join(data)
                if joined.startswith(b"[DONE]"):
                    done = True
                    break
                batch.append((event, joined))
            event, data = None, []
        if batch:
            yield batch
    if done:
        return
    if tail.rstrip(b"\r"):
        field(tail.rstrip(b"\r"))
    if data and not b"\n".join(data).startswith(b"[DONE]"):
        yield [(event, b"\n".join(data))]


async def _sse_events(body: AsyncIterator[bytes]) -> AsyncIterator[tuple[str | None, bytes]]:
    """The events of :func:`_sse_batches` one by one."""
    async for batch in _sse_batches(body):
        for item in batch:
            yield item


def _logprobs(raw: Any) -> list[TokenLogprob] | None:
    """The SDK's ``choice.logprobs`` (an object, or a dict from a lenient server) as moot's tokens."""
    if raw is None:
        return None
    content = raw.get("content") if isinstance(raw, dict) else getattr(raw, "content", None)
    if not content:
        return None
    return [token_logprob(t if isinstance(t, dict) else t.model_dump()) for t in content]


def _error_message(body: bytes) -> str:
    """An error reply's message: OpenAI's ``{"error": {"message": ...}}``, a bare string or
    ``message``, else the body as text (a proxy's HTML page), cut to 300 characters."""
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        inner = parsed.get("error", parsed)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])[:300]
        if isinstance(inner, str):
            return inner[:300]
    return body.decode("utf-8", "replace").strip()[:300]
