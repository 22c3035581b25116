"""Events the engine emits while a debate runs. The CLI renders them, integrations forward them.

Events are small frozen dataclasses (token events are frequent). Each carries ``result``: the
live :class:`~moot.core.types.DebateResult`, so a sink can write the transcript as it grows.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from moot.core.types import DebateResult, Round, Turn


@dataclass(frozen=True, slots=True)
class DebateStarted:
    result: DebateResult


@dataclass(frozen=True, slots=True)
class DebateResumed:
    """A debate goes on from its recorded transcript (:meth:`~moot.core.engine.Engine.resume`),
    announced instead of :class:`DebateStarted`: ``kept_turns`` finished turns were kept, and it
    goes on in round ``round``."""

    result: DebateResult
    kept_turns: int
    round: int


@dataclass(frozen=True, slots=True)
class TurnStarted:
    result: DebateResult
    speaker: str
    name: str
    round: int
    kind: str


@dataclass(frozen=True, slots=True)
class TokenDelta:
    result: DebateResult
    speaker: str
    round: int
    text: str


@dataclass(frozen=True, slots=True)
class TurnRetry:
    """A call of this turn failed transiently and is tried again: discard its streamed tokens."""

    result: DebateResult
    speaker: str
    round: int
    attempt: int
    error: str


@dataclass(frozen=True, slots=True)
class TurnDone:
    result: DebateResult
    turn: Turn


@dataclass(frozen=True, slots=True)
class RoundDone:
    result: DebateResult
    round: Round


@dataclass(frozen=True, slots=True)
class DebateDone:
    result: DebateResult


Event = DebateStarted | DebateResumed | TurnStarted | TokenDelta | TurnRetry | TurnDone | RoundDone | DebateDone
EventHandler = Callable[[Event], Awaitable[None] | None]
