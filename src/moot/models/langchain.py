"""Any LangChain chat model as a moot model (``pip install 'moot[langchain]'``).

Teams that configured their providers in LangChain reuse them as they are::

    from langchain_openai import ChatOpenAI
    from moot.integrations.langchain import LangChainModel  # or moot.models.langchain

    model = LangChainModel(ChatOpenAI(model="gpt-4o-mini", max_retries=0))
    result = await Engine(get_preset("panel"), model).run("...")

``Engine``, ``DebateEngine``, ``models=`` and :func:`moot.resolve_model` also take the LangChain
object itself (wrapped once per object, so its agents share one concurrency limit), and the spec
string ``langchain:MODULE:ATTR`` names one by import path (a chat model, or a function returning
one). :class:`LangChainModel` is the typed way in.

What is passed on, and what is best-effort
------------------------------------------

- **Messages**: system, user and assistant messages become ``SystemMessage``, ``HumanMessage`` and
  ``AIMessage``. Exact.
- **max_tokens, temperature, seed**: LangChain has no portable per-call parameters for these. Each
  provider reads them from its own fields, and forwards extra call kwargs to its SDK, where an
  unknown one is an error (``ChatOllama`` would pass ``max_tokens=`` to a client that has no such
  argument, on every call). So a request's values are set on a shallow copy of the wrapped model
  (``model_copy(update=...)``) when it has a field of that name (max tokens: ``max_tokens``,
  ``max_output_tokens``, ``max_new_tokens`` or ``num_predict``), and left out otherwise: best
  effort. A model without such a field answers at its own length; the engine still trims a turn
  past its token budget.
- **stop**: passed as ``ainvoke``/``astream``'s own ``stop`` argument, which every chat model
  receives; the reply is also cut at the first stop sequence, in case the provider ignored it.
- **Typed turns** (``response_schema``): the schema goes in the prompt, as for an OpenAI-compatible
  server without structured outputs; :mod:`moot.structured` parses the reply with json-repair,
  validates it and asks once for a repair. ``with_structured_output`` is not used: per provider it
  is tool calling or a JSON mode, it returns a parsed object instead of the text moot records, and
  it loses streaming and usage.
- **Usage**: the message's ``usage_metadata`` (summed over stream chunks) when the model reports
  it, else moot's conservative estimate (:func:`~moot.models.base.approx_tokens`).
- **Streaming**: with ``on_token``, ``astream`` (a model that cannot stream gives one chunk);
  cancelling the call closes the stream. A model that only implements the synchronous
  ``_generate`` runs in LangChain's thread executor: a cancelled call returns at once, but its
  thread finishes the request.
- **Retries**: moot's :class:`~moot.models.base.RetryPolicy` retries transient errors. Turn off the
  wrapped model's own retries (``max_retries=0`` on ``ChatOpenAI`` / ``ChatAnthropic``), or the
  two multiply. ``timeout_s`` adds a per-call timeout on top of the model's own.
- **Errors**: Python's timeouts and connection errors, HTTP 408/409/429/5xx (an exception's
  ``status_code``, ``response.status_code`` or ``code``) and exceptions whose class names look like
  timeouts, connection failures, rate limits or overload (``RateLimitError``, ``APITimeoutError``,
  ``ReadTimeout``, ``ResourceExhausted``, ...) become :class:`~moot.models.base.TransientModelError`
  and are retried; 401/403/404 become :class:`~moot.models.base.ModelConfigError`; anything else a
  :class:`~moot.models.base.ModelError`. Messages name the wrapped class and are redacted: the
  model's own ``SecretStr`` fields (API keys) and moot's known secrets never appear.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Mapping
from typing import Any

from pydantic import SecretStr

from moot.models.base import BaseChatModel as MootChatModel
from moot.models.base import (
    ChatRequest,
    ChatResponse,
    Message,
    MissingExtra,
    ModelConfigError,
    ModelError,
    RetryPolicy,
    TokenCallback,
    TransientModelError,
    Usage,
    approx_tokens,
    emit_token,
    messages_tokens,
    schema_instruction,
)
from moot.secrets import redact

INSTALL_HINT = "pip install 'moot[langchain]'"

try:
    from langchain_core.language_models import BaseChatModel as LangChainChatModel
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
    from langchain_core.runnables import RunnableConfig
except ImportError as _exc:
    raise MissingExtra(f"LangChain models need langchain-core, which is not installed: {INSTALL_HINT}") from _exc

DEFAULT_CONCURRENCY = 8

#: Where a request's parameters go: the first of these fields the wrapped model has.
PARAM_FIELDS: dict[str, tuple[str, ...]] = {
    "max_tokens": ("max_tokens", "max_output_tokens", "max_new_tokens", "num_predict"),
    "temperature": ("temperature",),
    "seed": ("seed",),
}

# Lower-cased pieces of exception class names (anywhere in the MRO) that mean "try again".
_TRANSIENT_NAMES = (
    "timeout",
    "connection",
    "connecterror",
    "ratelimit",
    "toomanyrequests",
    "overloaded",
    "unavailable",
    "internalserver",
    "resourceexhausted",
    "deadlineexceeded",
)
_MESSAGE_TYPES: dict[str, type[BaseMessage]] = {"system": SystemMessage, "user": HumanMessage, "assistant": AIMessage}


class LangChainModel(MootChatModel):
    """A moot model backed by any ``langchain_core`` chat model (see the module docs for what is
    passed on exactly and what is best-effort).

    ``name`` defaults to ``langchain:CLASS(MODEL)``, e.g. ``langchain:ChatOpenAI(gpt-4o-mini)``.
    ``timeout_s`` (default: none) bounds each attempt; an expired attempt is retried. ``config``
    (callbacks, tags, metadata, ...) goes to every ``ainvoke`` / ``astream``, so LangChain tracing
    sees moot's calls.
    """

    #: The adapter reads no token log-probabilities from a LangChain reply, so a protocol that
    #: weighs its vote by them is refused before any call.
    returns_logprobs: bool | None = False

    def __init__(
        self,
        chat_model: LangChainChatModel,
        *,
        name: str | None = None,
        max_concurrency: int | None = DEFAULT_CONCURRENCY,
        retry: RetryPolicy | None = None,
        timeout_s: float | None = None,
        config: RunnableConfig | None = None,
    ) -> None:
        if not isinstance(chat_model, LangChainChatModel):
            raise ModelConfigError(
                f"LangChainModel wraps a langchain_core chat model (BaseChatModel), not a {type(chat_model).__name__}"
            )
        model_id = _model_id(chat_model)
        label = type(chat_model).__name__
        super().__init__(
            name or (f"langchain:{label}" + (f"({model_id})" if model_id else "")),
            max_concurrency=max_concurrency,
            retry=retry,
        )
        self.chat_model = chat_model
        self.timeout_s = timeout_s
        self.config = config
        #: How the wrapped model is named in error messages.
        self.where = f"LangChain {label}" + (f" (model {model_id!r})" if model_id else "")
        self._secrets = [v.get_secret_value() for v in vars(chat_model).values() if isinstance(v, SecretStr)]

    def _safe(self, text: str) -> str:
        return redact(text, self._secrets)

    def configured(self, request: ChatRequest) -> LangChainChatModel:
        """The wrapped model with the request's max_tokens, temperature and seed set on the fields
        it has (a shallow copy), or the model itself when nothing changes."""
        fields = type(self.chat_model).model_fields
        update: dict[str, Any] = {}
        for param, candidates in PARAM_FIELDS.items():
            value = getattr(request, param)
            field = next((f for f in candidates if f in fields), None)
            if value is not None and field is not None and getattr(self.chat_model, field, None) != value:
                update[field] = value
        return self.chat_model.model_copy(update=update) if update else self.chat_model

    async def _complete_once(self, request: ChatRequest, on_token: TokenCallback | None) -> ChatResponse:
        prompt = list(request.messages)
        if request.response_schema is not None:
            prompt.append(Message(role="user", content=schema_instruction(request.response_schema)))
        messages = [_MESSAGE_TYPES[m.role](content=m.content) for m in prompt]
        stop = list(request.stop) if request.stop else None
        try:
            async with asyncio.timeout(self.timeout_s):
                text, usage, finish = await self._call(self.configured(request), messages, stop, on_token)
        except TimeoutError:
            if self.timeout_s is None:  # not ours (the wrapped model's are mapped in _call)
                raise
            raise TransientModelError(
                f"no complete reply from {self.where} within the per-call timeout of {self.timeout_s:g} s"
            ) from None
        if stop:
            text, was_cut = cut_at_stop(text, stop)
            if was_cut:
                finish = "stop"
        if usage is None:  # the model reported none
            usage = Usage(prompt_tokens=messages_tokens(prompt), completion_tokens=approx_tokens(text))
        return ChatResponse(
            text=text,
            usage=usage,
            finish_reason=finish,
            model=self.name,
            schema_in_prompt=request.response_schema is not None,
        )

    async def _call(
        self,
        chat: LangChainChatModel,
        messages: list[BaseMessage],
        stop: list[str] | None,
        on_token: TokenCallback | None,
    ) -> tuple[str, Usage | None, str | None]:
        """One call: the text, the reported usage (None if none) and the finish reason."""
        try:
            if on_token is None:
                reply = await chat.ainvoke(messages, self.config, stop=stop)
                return _text(reply.content), _usage([reply.usage_metadata]), _finish(reply.response_metadata)
            return await self._stream(chat, messages, stop, on_token)
        except ModelError:
            raise
        except Exception as exc:
            raise self.map_error(exc) from None

    async def _stream(
        self,
        chat: LangChainChatModel,
        messages: list[BaseMessage],
        stop: list[str] | None,
        on_token: TokenCallback,
    ) -> tuple[str, Usage | None, str | None]:
        parts: list[str] = []
        reported: list[Any] = []
        finish: str | None = None
        stream = chat.astream(messages, self.config, stop=stop)
        try:
            async for chunk in stream:
                piece = _text(chunk.content)
                if piece:
                    parts.append(piece)
                    await emit_token(on_token, piece)
                reported.append(chunk.usage_metadata)
                finish = _finish(chunk.response_metadata) or finish
        finally:
            # A cancelled call (the debate's timeout) must not leave the provider's stream open.
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()
        return "".join(parts), _usage(reported), finish

    def map_error(self, exc: Exception) -> ModelError:
        """A LangChain or provider exception as a moot error (transient ones are retried)."""
        detail = self._safe(f"{type(exc).__name__}: {exc}")[:500]
        status = _status(exc)
        client_error = status is not None and 400 <= status < 500 and status not in (408, 409, 429)
        if not client_error and (
            isinstance(exc, TimeoutError | ConnectionError)
            or (status is not None and (status >= 500 or status in (408, 409, 429)))
            or _looks_transient(exc)
        ):
            return TransientModelError(
                f"{self.where} failed (transient): {detail}", status=status, retry_after=_retry_after(exc)
            )
        if status in (401, 403, 404):
            return ModelConfigError(
                f"{self.where} was refused ({status}): check its API key and model name: {detail}", status=status
            )
        return ModelError(f"{self.where} failed: {detail}", status=status)


def as_moot_model(obj: object, **options: Any) -> MootChatModel:
    """A moot model as it is; a LangChain chat model wrapped in :class:`LangChainModel`
    (``options`` go to its constructor). Anything else is a :class:`ModelConfigError`."""
    if isinstance(obj, MootChatModel):
        return obj
    if isinstance(obj, LangChainChatModel):
        return LangChainModel(obj, **options)
    raise ModelConfigError(
        f"a {type(obj).__name__} is not a model: give a spec string, a moot BaseChatModel or a LangChain chat model"
    )


def load_spec(target: str, **options: Any) -> LangChainModel:
    """The model named by ``langchain:MODULE:ATTR``: ATTR (dotted) in the importable MODULE is a
    LangChain chat model, or a callable that returns one when called without arguments."""
    spec = f"langchain:{target}"
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ModelConfigError(f"{spec!r} is not langchain:MODULE:ATTR (e.g. langchain:myproject.models:chat)")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelConfigError(f"{spec}: cannot import {module_name!r}: {exc}") from exc
    except Exception as exc:  # the module's own code failed as it loaded: one line, not its traceback
        raise ModelConfigError(f"{spec}: importing {module_name!r} raised {_raised(exc)}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ModelConfigError(f"{spec}: {module_name!r} has no attribute {attr!r}") from None
    if not isinstance(obj, LangChainChatModel) and callable(obj):
        try:
            obj = obj()
        except Exception as exc:  # the factory's own error (a missing key, a bad option)
            raise ModelConfigError(f"{spec}: calling {attr}() raised {_raised(exc)}") from None
    if not isinstance(obj, LangChainChatModel):
        raise ModelConfigError(f"{spec} is a {type(obj).__name__}, not a LangChain chat model")
    return LangChainModel(obj, name=spec, **options)


def _raised(exc: Exception) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return redact(f"{type(exc).__name__}: {first}" if first else type(exc).__name__)


def cut_at_stop(text: str, stop: list[str]) -> tuple[str, bool]:
    """``text`` up to the first stop sequence, and whether one was found."""
    cuts = [i for s in stop if s and (i := text.find(s)) >= 0]
    return (text[: min(cuts)], True) if cuts else (text, False)


def _model_id(chat: LangChainChatModel) -> str | None:
    for field in ("model_name", "model", "model_id"):
        value = getattr(chat, field, None)
        if isinstance(value, str) and value:
            return value
    return None


def _text(content: str | list[str | dict[Any, Any]]) -> str:
    """The text of a message's content: a string, or the text blocks of a list of content blocks
    (reasoning and tool-call blocks are not part of the reply)."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
            parts.append(block["text"])
    return "".join(parts)


def _usage(reported: list[Any]) -> Usage | None:
    """The sum of the ``usage_metadata`` entries reported (None if the model reported none)."""
    counts = [u for u in reported if u]
    if not counts:
        return None
    return Usage(
        prompt_tokens=sum(int(u.get("input_tokens") or 0) for u in counts),
        completion_tokens=sum(int(u.get("output_tokens") or 0) for u in counts),
        # LangChain's cache reads are part of input_tokens, as moot's cached prompt tokens are.
        cached_prompt_tokens=sum(int((u.get("input_token_details") or {}).get("cache_read") or 0) for u in counts),
    )


#: A reply stopped at its token limit, as each provider says it: moot's "length" (OpenAI's word),
#: which the repair of a cut typed reply and the turn's warning read.
_AT_LIMIT = {"max_tokens", "MAX_TOKENS", "length"}


def _finish(metadata: Mapping[str, Any]) -> str | None:
    # OpenAI and Google say finish_reason, Anthropic stop_reason, Ollama done_reason.
    for key in ("finish_reason", "stop_reason", "done_reason"):
        value = metadata.get(key)
        if isinstance(value, str) and value:
            return "length" if value in _AT_LIMIT else value
    return None


def _status(exc: Exception) -> int | None:
    response = getattr(exc, "response", None)
    candidates = (getattr(exc, "status_code", None), getattr(response, "status_code", None), getattr(exc, "code", None))
    for value in candidates:
        if isinstance(value, int) and 100 <= value < 600:
            return value
    return None


def _looks_transient(exc: Exception) -> bool:
    names = [cls.__name__.lower() for cls in type(exc).__mro__]
    return any(piece in name for name in names for piece in _TRANSIENT_NAMES)


def _retry_after(exc: Exception) -> float | None:
    headers = getattr(getattr(exc, "response", None), "headers", None)
    if not isinstance(headers, Mapping):
        return None
    value = headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None
