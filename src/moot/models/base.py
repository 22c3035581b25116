"""The one async chat-model interface every backend implements.

A backend only has to implement :meth:`BaseChatModel._complete_once`: one attempt at one chat
completion. The base class adds what every backend needs the same way: a per-model concurrency
limit, retries of transient failures with capped exponential backoff and jitter, latency
measurement and usage accounting. The models layer knows nothing about debates.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from moot.files import scrub_surrogates
from moot.models.images import IMAGE_TOKENS, ImageInput, text_only

Role = Literal["system", "user", "assistant"]
TokenCallback = Callable[[str], Awaitable[None] | None]
#: Called before a retry with the number of the coming attempt and the error that caused it, so a
#: consumer can discard the tokens the failed attempt had streamed.
RetryCallback = Callable[[int, str], Awaitable[None] | None]


class Message(BaseModel):
    """One chat message; a user message may also show images (sent to a model that reads them:
    :attr:`BaseChatModel.reads_images`)."""

    model_config = ConfigDict(frozen=True)

    role: Role
    content: str
    #: Left out of the message's JSON when there are none: a transcript without images is as before.
    images: tuple[ImageInput, ...] = Field(default=(), exclude_if=lambda v: not v)


class Usage(BaseModel):
    """Token usage of one or more calls."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    #: Of ``prompt_tokens``, those the server read from its prompt cache instead of processing them
    #: (OpenAI's ``prompt_tokens_details.cached_tokens``, llama.cpp's reused KV cache): billed at a
    #: discount by providers that cache, nearly free on the embedded engine. 0 when not reported.
    cached_prompt_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            cached_prompt_tokens=self.cached_prompt_tokens + other.cached_prompt_tokens,
        )

    @classmethod
    def from_openai(cls, usage: Any) -> Usage:
        """From an OpenAI-shaped ``usage`` (a dict, or the SDK's object): the token counts and
        ``prompt_tokens_details.cached_tokens``, which OpenAI-compatible servers (vLLM, llama.cpp)
        report too. Missing or null counts are 0."""

        def get(obj: Any, key: str) -> Any:
            return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)

        details = get(usage, "prompt_tokens_details")
        prompt = int(get(usage, "prompt_tokens") or 0)
        cached = int((get(details, "cached_tokens") if details is not None else None) or 0)
        return cls(
            prompt_tokens=prompt,
            completion_tokens=int(get(usage, "completion_tokens") or 0),
            cached_prompt_tokens=min(max(cached, 0), prompt),
        )


class ChatRequest(BaseModel):
    """What is sent to a model for one completion."""

    messages: list[Message]
    max_tokens: int | None = None
    temperature: float | None = Field(default=None, allow_inf_nan=False)
    seed: int | None = None
    stop: list[str] | None = None
    # A JSON schema the reply must follow (grammar-enforced on llama.cpp, structured outputs on
    # OpenAI-compatible servers). ``schema_name`` names it for servers that want a name.
    response_schema: dict[str, Any] | None = None
    schema_name: str = "reply"
    #: Ask for token log-probabilities with this many alternatives per token (None: none). What a
    #: backend returns is in :attr:`ChatResponse.logprobs`; a backend that has none returns None.
    logprobs: int | None = Field(default=None, ge=0, le=20)


class TokenLogprob(BaseModel):
    """One generated token with its log-probability and the most likely alternatives.

    The probabilities are the model's own (llama.cpp reports them before the grammar and the
    sampler act), so a grammar-constrained reply still carries what the model would have said."""

    token: str
    logprob: float
    top: dict[str, float] = Field(default_factory=dict)


def token_logprob(raw: dict[str, Any]) -> TokenLogprob:
    """One token of an OpenAI-shaped ``logprobs.content`` list (llama.cpp sends the same shape)."""
    return TokenLogprob(
        token=str(raw.get("token", "")),
        logprob=float(raw.get("logprob", 0.0)),
        top={str(t["token"]): float(t["logprob"]) for t in raw.get("top_logprobs") or () if "token" in t},
    )


class ChatResponse(BaseModel):
    """What a model returned for one completion (after any retries)."""

    text: str
    usage: Usage = Field(default_factory=Usage)
    latency_s: float = 0.0
    finish_reason: str | None = None
    model: str = ""
    attempts: int = 1
    # Set by a backend that had to drop ``response_format`` (the server rejected it) and put the
    # schema in the prompt instead.
    schema_in_prompt: bool = False
    #: The generated tokens with their log-probabilities, when the request asked for them.
    logprobs: list[TokenLogprob] | None = None
    #: True when this response was served by a request cache (``moot.models.cache``): no call was
    #: made now, and ``usage`` is what the original call cost.
    cache_hit: bool = False

    @model_validator(mode="before")
    @classmethod
    def _cached_tokens_in_usage(cls, data: Any) -> Any:
        # Responses stored before the count moved into ``usage`` (request caches of earlier runs).
        if isinstance(data, dict) and "cached_prompt_tokens" in data:
            data = dict(data)
            cached = data.pop("cached_prompt_tokens")
            usage = data.get("usage")
            if isinstance(usage, dict) and "cached_prompt_tokens" not in usage:
                data["usage"] = {**usage, "cached_prompt_tokens": cached}
            elif isinstance(usage, Usage) and not usage.cached_prompt_tokens:
                data["usage"] = usage.model_copy(update={"cached_prompt_tokens": cached})
        return data


# --------------------------------------------------------------------------------------------
# Errors: transient ones are retried, the others fail at once with a message that says the fix.
# --------------------------------------------------------------------------------------------


class ModelError(Exception):
    """A model call failed. The message is safe to show: it never contains a secret."""

    transient: bool = False

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class TransientModelError(ModelError):
    """Rate limits, 5xx, connection errors, per-call timeouts: worth another attempt."""

    transient = True

    def __init__(self, message: str, *, status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(message, status=status)
        self.retry_after = retry_after


class UnreachableModelError(TransientModelError):
    """No connection could be made to the model's endpoint (refused, no route, no such host): worth
    another attempt, as a server that is starting; after the last one, a run stops on it as on a
    :class:`ModelConfigError` (:class:`moot.scale.jobs.WatchedModel`), its item not recorded failed."""


class ModelConfigError(ModelError):
    """Wrong key, wrong base URL, unknown model, missing weights: retrying cannot help."""


class MissingExtra(ModelConfigError, ImportError):
    """An optional framework is not installed. The message names the ``pip install`` that fixes it.

    Also an :class:`ImportError`, so ``except ImportError`` around an optional import catches it.
    """


class ModelSpecError(ModelConfigError):
    """The model spec or its options cannot be used (unknown spec, no model name, a missing scripted
    file, no API key): bad input, found when the spec is resolved, before any call."""


class ResponseFormatRejected(ModelError):
    """The server refused the ``response_format`` parameter (400/422)."""


# --------------------------------------------------------------------------------------------
# Retry policy and concurrency limit
# --------------------------------------------------------------------------------------------


class RetryPolicy(BaseModel):
    """Capped exponential backoff with full jitter; honours a server's Retry-After."""

    max_attempts: int = Field(default=4, ge=1)
    base_delay_s: float = Field(default=0.5, ge=0)
    max_delay_s: float = Field(default=8.0, ge=0)
    # A Retry-After longer than this is not waited for: the error is raised instead.
    max_retry_after_s: float = Field(default=60.0, ge=0)

    def delay(self, attempt: int, retry_after: float | None, rng: random.Random) -> float:
        """Seconds to wait before attempt number ``attempt + 1`` (``attempt`` starts at 1)."""
        if retry_after is not None:
            return max(0.0, retry_after)
        cap = min(self.max_delay_s, self.base_delay_s * (2 ** (attempt - 1)))
        return rng.uniform(0, cap)


class ConcurrencyLimiter:
    """At most ``limit`` calls in flight per model, whatever event loop they run on.

    An ``asyncio.Semaphore`` binds to the first loop that waits on it, so one is kept per loop
    (tests and ``asyncio.run`` callers create several loops in one process).
    """

    def __init__(self, limit: int | None) -> None:
        if limit is not None and limit < 1:
            raise ValueError("a concurrency limit must be at least 1 (or None for no limit)")
        self.limit = limit
        self._semaphores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )

    def _semaphore(self) -> asyncio.Semaphore | None:
        if self.limit is None:
            return None
        loop = asyncio.get_running_loop()
        sem = self._semaphores.get(loop)
        if sem is None:
            sem = asyncio.Semaphore(self.limit)
            self._semaphores[loop] = sem
        return sem

    async def __aenter__(self) -> None:
        sem = self._semaphore()
        if sem is not None:
            await sem.acquire()

    async def __aexit__(self, *exc: object) -> None:
        sem = self._semaphore()
        if sem is not None:
            sem.release()


# --------------------------------------------------------------------------------------------
# Token counting used where a backend gives no count, and for trimming over-long replies
# --------------------------------------------------------------------------------------------

_PIECE = re.compile(r"\w+|[^\w\s]", re.UNICODE)


def approx_tokens(text: str) -> int:
    """A conservative token estimate: every word and every punctuation mark counts as one.

    Real tokenizers split at least this finely for English, so a text of at most N pieces is at
    most N whitespace-separated words.
    """
    return len(_PIECE.findall(text))


_SPACES = " \t\n\r\x0b\x0c\u3000"
#: Characters a tokenizer gives about a token each or more (real ones: 0.6 to 1.5 a character): the
#: CJK scripts (Han, kana, Hangul, their radicals and symbols) and the full-width forms.
_WIDE = re.compile(
    "[\u1100-\u11ff\u2e80-\u9fff\ua960-\ua97f\uac00-\ud7af\uf900-\ufaff\uff00-\uffef\U00020000-\U0003ffff]+"
)
_CHUNK = 1 << 20


def least_tokens(text: str, cap: int | None = None) -> int:
    """The estimate a refusal rests on (a prompt too large to send, :func:`moot.core.budget.input_problem`):
    the more of :func:`approx_tokens` (a word or a punctuation mark each) and one token per 4
    characters that are not spaces, a CJK or full-width character counting 2 (half a token: real
    tokenizers give 0.6 to 1.5). A text without spaces (a 50 MB line, base64, a page of Japanese) so
    counts as what it holds, not as one word; English prose counts about as real tokenizers count it
    (four characters a token), never far above, so what is refused does not fit.

    With ``cap``, counting stops once past it (``cap + 1`` is returned): a 50 MB text is not scanned."""
    weight = 0
    for start in range(0, len(text), _CHUNK):
        chunk = text[start : start + _CHUNK]
        weight += len(chunk) - sum(chunk.count(c) for c in _SPACES)
        if not chunk.isascii():
            weight += sum(len(run) for run in _WIDE.findall(chunk)) - chunk.count("\u3000")
        if cap is not None and -(-weight // 4) > cap:
            return cap + 1
    # The words without the spaces between them (no piece spans a space), so a text of spaces is not
    # scanned piece by piece; past the loop above it holds at most 4 * cap characters.
    compact = " ".join(text.split()) if weight else ""
    words = approx_tokens(compact)
    if cap is not None and words > cap:
        return cap + 1  # more than cap words (or marks)
    return max(words, -(-weight // 4))


def trim_to_tokens(text: str, max_tokens: int) -> str:
    """Cut ``text`` after its ``max_tokens``-th piece (see :func:`approx_tokens`)."""
    if max_tokens <= 0:
        return ""
    for count, match in enumerate(_PIECE.finditer(text), start=1):
        if count == max_tokens:
            return text[: match.end()]
    return text


#: What a chat template adds to each message (its role and markers), counted with a tokenizer's count
#: of the message's text (Qwen's and SmolLM's ``<|im_start|>role\n``...``<|im_end|>\n``: 5), and
#: once more for the reply's opening.
TEMPLATE_TOKENS = 6


def messages_tokens(messages: list[Message], count: Callable[[str], int | None] | None = None) -> int:
    """The tokens of a prompt: by ``count`` (a model's own tokenizer, :meth:`BaseChatModel.count_tokens`)
    where it counts every message, else moot's estimate (:func:`approx_tokens`)."""
    counted = counted_tokens(messages, count) if count is not None else None
    if counted is not None:
        return counted
    return sum(approx_tokens(m.content) + 4 + IMAGE_TOKENS * len(m.images) for m in messages)


def counted_tokens(messages: list[Message], count: Callable[[str], int | None]) -> int | None:
    """The tokens of a prompt by ``count`` (a model's own tokenizer), its chat template's markers
    included; None if it could not count one of its messages (then no count is given at all)."""
    total = TEMPLATE_TOKENS
    for m in messages:
        n = count(m.content)
        if n is None:
            return None
        total += n + TEMPLATE_TOKENS + IMAGE_TOKENS * len(m.images)
    return total


def message_payload(m: Message) -> dict[str, Any]:
    """A message in the chat-completions shape: its images after its text as ``image_url`` parts."""
    if not m.images:
        return {"role": m.role, "content": m.content}
    parts: list[dict[str, Any]] = [{"type": "text", "text": m.content}]
    parts += [{"type": "image_url", "image_url": {"url": i.url, "detail": i.detail}} for i in m.images]
    return {"role": m.role, "content": parts}


def schema_instruction(schema: dict[str, Any]) -> str:
    """The instruction added as a last user message when a backend cannot enforce a schema itself
    (the reply is then parsed leniently and validated by :mod:`moot.structured`)."""
    return "Reply with a single JSON object and nothing else. It must match this JSON schema:\n" + json.dumps(
        schema, separators=(",", ":")
    )


def chat_payload(
    request: ChatRequest,
    *,
    model: str | None = None,
    schema: bool = True,
    temperature: float | None = None,
    seed: int | None = None,
) -> dict[str, Any]:
    """The chat-completions body of ``request``: the one builder of every backend that speaks the
    OpenAI shape (an OpenAI-compatible server, the embedded llama.cpp). ``model`` names the model
    when the wire wants one; ``temperature`` and ``seed`` are the backend's own defaults for a
    request that sets none (None: leave it to the server). With ``schema=False`` a response schema
    is asked for in a last user message instead of ``response_format`` (a server that refused it)."""
    messages = [message_payload(m) for m in request.messages]
    if request.response_schema is not None and not schema:
        messages.append({"role": "user", "content": schema_instruction(request.response_schema)})
    payload: dict[str, Any] = {"model": model} if model is not None else {}
    payload["messages"] = messages
    if request.max_tokens is not None:
        payload["max_tokens"] = request.max_tokens
    if (t := temperature if request.temperature is None else request.temperature) is not None:
        payload["temperature"] = t
    if (s := seed if request.seed is None else request.seed) is not None:
        payload["seed"] = s
    if request.stop:
        payload["stop"] = request.stop
    if request.logprobs is not None:
        payload["logprobs"] = True
        payload["top_logprobs"] = request.logprobs
    if request.response_schema is not None and schema:
        payload["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": request.schema_name, "schema": request.response_schema},
        }
    return payload


# --------------------------------------------------------------------------------------------
# The interface
# --------------------------------------------------------------------------------------------


#: Called in the task that makes a model call right before each attempt is sent (inside the
#: concurrency limit, nothing awaited in between, retries included); it raises to stop the call.
#: ``moot serve`` sets it in each debate's task: a replica whose lease of the debate may have passed
#: to another (it was stopped, SIGSTOP, past the lease) sends no call for it.
BEFORE_CALL: ContextVar[Callable[[], None] | None] = ContextVar("moot_before_call", default=None)


class BaseChatModel(ABC):
    """Base of every backend: limit, retry and timing around one attempt."""

    #: The spec string this model was resolved from (``embedded:qwen2.5-1.5b``, ``openai:gpt-4o``).
    name: str
    #: How many tokens one request may hold, prompt and reply (None: not known to moot). The
    #: engine trims a debate's history to fit it (see ``Budget.max_prompt_tokens``).
    context_tokens: int | None = None
    #: Whether the backend returns token log-probabilities when asked (None: not known before a
    #: call, as for an OpenAI-compatible server). A protocol that weighs votes by them is refused up
    #: front on a model that returns none.
    returns_logprobs: bool | None = None
    #: Whether the backend may be sent images (:attr:`Message.images`): an OpenAI-compatible server
    #: may (whether its model reads them is its to say); a text-only model is never sent one
    #: (:func:`moot.core.budget.input_problem` refuses the debate before any call).
    reads_images: bool = False

    def count_tokens(self, text: str) -> int | None:
        """``text``'s tokens in this model's own tokenizer, where its backend can tell (an embedded
        model, once loaded: llama.cpp's); None: moot's estimates are used (:func:`least_tokens` to
        refuse what cannot fit, :func:`approx_tokens` to cut a history). Where the context window is
        known, a prompt fitted by an estimate below the tokenizer's count is one the model refuses (a
        client pass: English counted 1.2 times moot's estimate, Latin-like text 1.8)."""
        return None

    async def ready_to_count(self) -> None:
        """Whatever :meth:`count_tokens` needs before it can count (an embedded model: its weights
        loaded, in a thread, as its first call would load them); nothing by default."""
        return None

    def __init__(
        self,
        name: str,
        *,
        max_concurrency: int | None = None,
        retry: RetryPolicy | None = None,
        seed: int | None = None,
    ) -> None:
        self.name = name
        self.limiter = ConcurrencyLimiter(max_concurrency)
        self.retry = retry or RetryPolicy()
        self._rng = random.Random(seed)

    @property
    def max_concurrency(self) -> int | None:
        return self.limiter.limit

    def identity(self) -> dict[str, Any]:
        """What makes this model's replies this model's: the key of a request cache includes it, so
        that one model's replies are never served as another's. Backends add what their name does
        not say (an endpoint, a weights hash)."""
        return {"backend": type(self).__name__, "name": self.name}

    @abstractmethod
    async def _complete_once(self, request: ChatRequest, on_token: TokenCallback | None) -> ChatResponse:
        """One attempt. Raise :class:`TransientModelError` for failures worth retrying."""

    async def complete(
        self,
        request: ChatRequest,
        on_token: TokenCallback | None = None,
        on_retry: RetryCallback | None = None,
    ) -> ChatResponse:
        """Run one chat completion under the model's concurrency limit, retrying transient errors.
        The reply's text (and each streamed piece) holds no lone surrogate: a backend's ``"\\udfff"``
        escape becomes U+FFFD, so that the transcript can be written (:func:`moot.files.scrub_surrogates`)."""
        if not self.reads_images and (shown := sum(len(m.images) for m in request.messages)):
            raise ModelConfigError(text_only(self.name, shown))
        attempt = 0
        pieces = on_token

        if on_token is not None:
            emit = on_token

            def pieces(piece: str) -> Any:
                return emit(scrub_surrogates(piece))

        while True:
            attempt += 1
            try:
                async with self.limiter:
                    check = BEFORE_CALL.get()
                    if check is not None:
                        check()
                    start = time.perf_counter()
                    response = await self._complete_once(request, pieces)
                    response.latency_s = time.perf_counter() - start
                response.text = scrub_surrogates(response.text)
                response.attempts = attempt
                if not response.model:
                    response.model = self.name
                return response
            except TransientModelError as exc:
                if attempt >= self.retry.max_attempts:
                    gave_up = UnreachableModelError if isinstance(exc, UnreachableModelError) else TransientModelError
                    raise gave_up(f"{exc} (gave up after {attempt} attempts)", status=exc.status) from exc
                if exc.retry_after is not None and exc.retry_after > self.retry.max_retry_after_s:
                    raise
                await asyncio.sleep(self.retry.delay(attempt, exc.retry_after, self._rng))
                if on_retry is not None:
                    outcome = on_retry(attempt + 1, str(exc))
                    if outcome is not None:
                        await outcome

    async def aclose(self) -> None:  # noqa: B027 - optional hook, most backends hold nothing
        """Release network clients and the like."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class WrappedModel(BaseChatModel):
    """A model in front of another (a cache, a watch): same name and identity, the whole call
    (concurrency limit and retries included) left to ``inner``; subclasses override :meth:`complete`."""

    def __init__(self, inner: BaseChatModel) -> None:
        super().__init__(inner.name)
        self.inner = inner

    def identity(self) -> dict[str, Any]:
        return self.inner.identity()

    @property  # a layer's context window is its inner model's
    def context_tokens(self) -> int | None:  # type: ignore[override]
        return self.inner.context_tokens

    @property
    def returns_logprobs(self) -> bool | None:  # type: ignore[override]
        return self.inner.returns_logprobs

    @property
    def reads_images(self) -> bool:  # type: ignore[override]
        return self.inner.reads_images

    def count_tokens(self, text: str) -> int | None:
        return self.inner.count_tokens(text)

    async def ready_to_count(self) -> None:
        await self.inner.ready_to_count()

    def around(self, model: BaseChatModel) -> BaseChatModel:
        """The same layers, this one and those under it, in front of another ``model`` (a
        heterogeneous panel's second model in a run), sharing their state: one request cache, one
        watch."""
        inner = self.inner.around(model) if isinstance(self.inner, WrappedModel) else model
        return self._layer(inner)

    def _layer(self, inner: BaseChatModel) -> WrappedModel:
        """This layer in front of ``inner``, sharing this layer's state (subclasses with state)."""
        return WrappedModel(inner)

    async def _complete_once(self, request: ChatRequest, on_token: TokenCallback | None) -> ChatResponse:
        return await self.complete(request, on_token)

    async def complete(
        self, request: ChatRequest, on_token: TokenCallback | None = None, on_retry: RetryCallback | None = None
    ) -> ChatResponse:
        return await self.inner.complete(request, on_token, on_retry)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def emit_token(on_token: TokenCallback | None, piece: str) -> None:
    """Call a token callback that may or may not be a coroutine function."""
    if on_token is None:
        return
    result = on_token(piece)
    if result is not None:
        await result
