"""Test doubles: replies given in order, or computed by a function. Exact and offline."""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

from moot.files import load_yaml
from moot.models.base import (
    BaseChatModel,
    ChatRequest,
    ChatResponse,
    ModelConfigError,
    ModelError,
    TokenCallback,
    Usage,
    approx_tokens,
    emit_token,
    messages_tokens,
)

Reply = str | dict[str, Any] | BaseException
ReplyFn = Callable[[ChatRequest], Reply | Awaitable[Reply]]


class ScriptExhausted(ModelError):
    """The scripted model was asked for more replies than it was given."""


class ScriptedModel(BaseChatModel):
    """Returns the given replies in order, or whatever ``fn(request)`` computes (never with
    log-probabilities).

    - a ``str`` reply is returned as the text; a ``dict`` is returned as its JSON;
    - an exception instance is raised (to test failures and retries);
    - ``latency`` seconds pass before each reply (``asyncio.sleep``, so cancellation is prompt);
    - every request is recorded in :attr:`requests` for exact assertions.

    Usage is counted with :func:`approx_tokens`. Like a real server, the reply is streamed to
    ``on_token`` word by word; unlike a real server it ignores ``max_tokens``, so the engine's own
    trimming can be tested.
    """

    returns_logprobs: bool | None = False
    #: It reads nothing it is sent: a script's replies are the same with images or without.
    reads_images = True

    def __init__(
        self,
        replies: Iterable[Reply] | None = None,
        *,
        fn: ReplyFn | None = None,
        latency: float = 0.0,
        name: str = "scripted",
        max_concurrency: int | None = None,
    ) -> None:
        if (replies is None) == (fn is None):
            raise ValueError("give ScriptedModel either a list of replies or fn=, not both")
        super().__init__(name, max_concurrency=max_concurrency)
        self._replies = list(replies) if replies is not None else None
        self._fn = fn
        self.latency = latency
        self.requests: list[ChatRequest] = []

    @property
    def remaining(self) -> int | None:
        return None if self._replies is None else len(self._replies)

    async def _next_reply(self, request: ChatRequest) -> Reply:
        if self._fn is not None:
            value = self._fn(request)
            if inspect.isawaitable(value):
                value = await value
            return value
        assert self._replies is not None
        if not self._replies:
            raise ScriptExhausted(
                f"scripted model {self.name!r} has no reply left for call {len(self.requests)}; give it more replies"
            )
        return self._replies.pop(0)

    async def _complete_once(self, request: ChatRequest, on_token: TokenCallback | None) -> ChatResponse:
        self.requests.append(request)
        if self.latency:
            await asyncio.sleep(self.latency)
        reply = await self._next_reply(request)
        if isinstance(reply, BaseException):
            raise reply
        text = json.dumps(reply) if isinstance(reply, dict) else str(reply)
        if on_token is not None:
            for i, word in enumerate(text.split(" ")):
                await emit_token(on_token, word if i == 0 else " " + word)
        return ChatResponse(
            text=text,
            usage=Usage(prompt_tokens=messages_tokens(request.messages), completion_tokens=approx_tokens(text)),
            finish_reason="stop",
            model=self.name,
        )


def load_script(path: str | Path) -> ScriptedModel:
    """A scripted model whose replies come from a JSON or YAML list in a file (``scripted:FILE``)."""
    from moot.files import InputFileError, read_text

    p = Path(path)
    if not str(path):
        raise ModelConfigError("a scripted model spec needs a file: scripted:FILE (a JSON or YAML list of replies)")
    try:
        data = load_yaml(read_text(p, "scripted model file"))
    except InputFileError as exc:
        raise ModelConfigError(f"{exc}; give a JSON or YAML list of replies") from None
    except yaml.YAMLError as exc:
        raise ModelConfigError(f"scripted model file {str(p)!r} is not valid YAML/JSON: {exc}") from None
    if not isinstance(data, list) or not all(isinstance(x, str | dict) for x in data):
        raise ModelConfigError(f"scripted model file {str(p)!r} must hold a list of replies (strings or JSON objects)")
    if not data:  # it would fail at its first call
        raise ModelConfigError(f"scripted model file {str(p)!r} holds no reply: give at least one")
    return ScriptedModel(data, name=f"scripted:{p}")
