"""A live debate as an OpenAI-shaped stream sends it: the reply as the decision generates it, and,
when the request asks for the trace, every turn of the debate as it is generated.

Read from the debate's in-memory event log (the engine's own events, numbered by the manager), the
same feed ``GET /v1/debates/{id}/events`` serves: no stored JSON is read back, and no JSON this
process encoded is decoded again: each event carries the value its JSON was encoded from
(:func:`value_of`; only an event from another replica, over the bus, is decoded). Both OpenAI
endpoints format what this yields (:class:`Feed`) in their own chunks and events.

**The reply.** A synthesis (or a reply typed to the client's schema, never: its JSON is known when it
is parsed) streams as the decision call generates it, up to the decision's token bound; a vote, a
rule or a judge's pick is known at once when it is made. Stop sequences are cut as the text comes
(text that could start one is held until the next piece). If the decision call is retried after some
of its text was sent and the final text does not go on from it, the feed ends with a failure rather
than a spliced answer.

**The trace.** Turns of one round run at once; a stream that interleaved their pieces could not be
read. So one turn streams at a time, headed by its speaker and round (``**Agent 2** · round 1``):
the first to start streams live, the others' pieces wait and follow when it is done (a waiting turn
that has finished is sent whole). A retried call's text stays, with a note; a turn that failed says
so. The decision's own call is not in the trace: its result is the reply.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TypeVar

from pydantic import BaseModel

from moot.core.spec import SynthesizeDecision
from moot.core.tools import ToolCall
from moot.core.types import DebateResult, Turn
from moot.models.base import approx_tokens
from moot.server.limits import RequestError
from moot.server.openai.asked import Asked, StopCut
from moot.server.schemas import TurnDoneData, TurnRetryData, TurnStartedData, TurnView
from moot.server.state.events import LoggedEvent, Token
from moot.server.state.manager import LiveDebate

Value = TypeVar("Value", bound=Token | BaseModel)


def value_of(event: LoggedEvent, kind: type[Value]) -> Value:
    """An event's data as a ``kind``: the value its JSON was encoded from, when this process's engine
    made it (the live path: nothing decoded), else its JSON decoded (an event another replica made,
    read from the bus or the store)."""
    value = event.value
    if isinstance(value, kind):
        return value
    if issubclass(kind, BaseModel):
        return kind.model_validate_json(event.data)
    return kind(**json.loads(event.data))


@dataclass(frozen=True, slots=True)
class TurnStart:
    """A turn of the trace begins: ``header`` (its speaker and round) is its first text."""

    speaker: str
    name: str
    round: int
    header: str


@dataclass(frozen=True, slots=True)
class TurnText:
    text: str


@dataclass(frozen=True, slots=True)
class TurnEnd:
    """The turn's last text has been sent."""


@dataclass(frozen=True, slots=True)
class AnswerText:
    text: str


Piece = TurnStart | TurnText | TurnEnd | AnswerText


@dataclass
class Outcome:
    """How the reply ends: the text not sent yet and the finish reason, or why there is none."""

    rest: str = ""
    finish: str = "stop"
    failure: RequestError | None = None
    #: The tool call the debate decided on (:attr:`~moot.server.openai.asked.Reply.call`).
    call: ToolCall | None = None


@dataclass
class _Turn:
    speaker: str
    name: str
    round: int
    pieces: list[str] = field(default_factory=list)
    #: Whether any of its text came as token events (else its whole text is sent when it is done).
    streamed: bool = False
    done: bool = False
    text: str = ""
    error: str | None = None


def header(name: str, round_index: int) -> str:
    return f"**{name}** · round {round_index}\n\n"


class Feed:
    """The pieces of one debate's stream (:meth:`batches`, then :meth:`finish`)."""

    def __init__(self, live: LiveDebate, asked: Asked) -> None:
        self.live = live
        self.asked = asked
        decision = live.spec.decision
        #: Only a synthesis is streamed as it is generated (its token bound: the engine trims there).
        self.token_limit = decision.max_tokens if isinstance(decision, SynthesizeDecision) else None
        self.sent: list[str] = []
        self._count = TokenCount()
        self._holding = self.token_limit is None
        self._in_decision = False
        self._stop = StopCut(asked.stop)
        self._turns: dict[tuple[str, int], _Turn] = {}
        self._current: tuple[str, int] | None = None
        self._waiting: list[tuple[str, int]] = []

    async def batches(self) -> AsyncIterator[list[Piece]]:
        """The pieces of each batch of the debate's events (one write per batch), until it ends."""
        # Wherever the debate runs (it goes on from the bus if another replica takes it over).
        events = self.live.follow(0) if self.live.follow is not None else self.live.log.batches(0)
        async for batch in events:
            out: list[Piece] = []
            for event in batch:
                name = event.name
                if name == "token":
                    if self._in_decision:
                        self._answer(value_of(event, Token).text, out)
                    elif self.asked.trace:
                        token = value_of(event, Token)
                        self._token((token.speaker, token.round), token.text, out)
                elif name == "turn_started":
                    started = value_of(event, TurnStartedData)
                    self._in_decision = started.kind == "decision"
                    if self.asked.trace and not self._in_decision:
                        self._started(started.speaker, started.name, started.round, out)
                elif name == "turn_retry":
                    if self._in_decision:
                        self._holding = True  # the new attempt may say something else: the final text at the end
                    elif self.asked.trace:
                        retry = value_of(event, TurnRetryData)
                        self._retry((retry.speaker, retry.round), out)
                elif name == "turn_done":
                    if self.asked.trace and not self._in_decision:
                        turn = value_of(event, TurnDoneData).turn
                        self._done((turn.speaker, turn.round), turn.text, turn.error, out)
                    self._in_decision = False
            if out:
                yield out

    async def finish(self) -> tuple[list[Piece], Outcome]:
        """Once the debate has ended: the trace's turns cut short, and how the reply ends."""
        await self.live.done.wait()
        if self.live.settle is not None:
            self.live.settle(self.live)  # (ended on another replica: its end as the store has it)
        out: list[Piece] = []
        if self.asked.trace:
            for key in [k for k in (self._current, *self._waiting) if k is not None]:
                turn = self._turns[key]
                if key != self._current:
                    out.append(TurnStart(turn.speaker, turn.name, turn.round, header(turn.name, turn.round)))
                    out += [TurnText(p) for p in turn.pieces]
                out += [TurnText("\n\n_(cut short: the debate ended before this turn did)_"), TurnEnd()]
            self._current, self._waiting = None, []
        live = self.live
        failed = failure(live, self.asked)
        if failed is not None:
            return out, Outcome(failure=failed)
        assert live.result is not None
        reply = self.asked.reply(live.result)
        sent = "".join(self.sent)
        if not reply.text.startswith(sent):
            message = (
                f"the decision of debate {live.id} was generated again after a failed call and differs from the text "
                f"already sent; the answer is in GET /v1/debates/{live.id}"
            )
            return out, Outcome(failure=RequestError(message, status=502, code="stream_diverged"))
        return out, Outcome(rest=reply.text[len(sent) :], finish=reply.finish, call=reply.call)

    # ------------------------------------------------------------------------------------ reply

    def _answer(self, piece: str, out: list[Piece]) -> None:
        if self._holding:
            return
        # A reply longer than the decision's bound is trimmed by the engine: stop before it.
        count = self._count.after(piece)
        if self.token_limit is not None and count >= self.token_limit:
            self._holding = True
            return
        self._count.add(piece, count)
        text = self._stop.feed(piece)
        if self._stop.stopped:
            self._holding = True
        if text:
            self.sent.append(text)
            if out and isinstance(out[-1], AnswerText):
                out[-1] = AnswerText(out[-1].text + text)
            else:
                out.append(AnswerText(text))

    # ------------------------------------------------------------------------------------ trace

    def _started(self, speaker: str, name: str, round_index: int, out: list[Piece]) -> None:
        key = (speaker, round_index)
        self._turns[key] = _Turn(speaker, name, round_index)
        if self._current is None:
            self._current = key
            out.append(TurnStart(speaker, name, round_index, header(name, round_index)))
        else:
            self._waiting.append(key)

    def _token(self, key: tuple[str, int], text: str, out: list[Piece]) -> None:
        turn = self._turns.get(key)
        if turn is None:
            return
        turn.streamed = True
        if key == self._current:
            out.append(TurnText(text))
        else:
            turn.pieces.append(text)

    def _retry(self, key: tuple[str, int], out: list[Piece]) -> None:
        turn = self._turns.get(key)
        if turn is None:
            return
        if key == self._current:
            if turn.streamed:
                out.append(TurnText("\n\n_(the call failed and is made again; its new reply follows)_\n\n"))
        else:
            turn.pieces.clear()
            turn.streamed = False

    def _done(self, key: tuple[str, int], text: str | None, error: str | None, out: list[Piece]) -> None:
        turn = self._turns.get(key)
        if turn is None:
            return
        turn.done, turn.text, turn.error = True, text or "", error
        if key != self._current:
            return
        self._close(turn, out)
        self._current = None
        while self._waiting:
            key = self._waiting.pop(0)
            turn = self._turns[key]
            out.append(TurnStart(turn.speaker, turn.name, turn.round, header(turn.name, turn.round)))
            if turn.pieces:
                out.append(TurnText("".join(turn.pieces)))
                turn.pieces.clear()
            if not turn.done:
                self._current = key
                return
            self._close(turn, out)

    def _close(self, turn: _Turn, out: list[Piece]) -> None:
        if not turn.streamed and turn.text:
            out.append(TurnText(turn.text))
        if turn.error is not None:
            out.append(TurnText(f"\n\n_(this turn failed: {turn.error})_"))
        out.append(TurnEnd())


def turn_trace(turn: Turn | TurnView) -> str:
    """One finished turn as the trace shows it: headed by its speaker and round, its reply as the
    model generated it (a typed turn's JSON, as it streams), and its failure if it failed."""
    text = header(turn.name, turn.round) + ((turn.raw if turn.parsed is not None else None) or turn.text or "")
    if turn.error is not None:
        text += f"\n\n_(this turn failed: {turn.error})_"
    return text


def trace_text(result: DebateResult) -> str:
    """The trace of a finished debate, as the stream sends it: every debate turn in order."""
    return "\n\n".join(turn_trace(turn) for rnd in result.rounds for turn in rnd.turns)


def failure(live: LiveDebate, asked: Asked) -> RequestError | None:
    """Why a finished debate has no answer to give ``asked``, or None (a decision the caller's own
    token bound cut is an answer: :meth:`Asked.cut_at_bound`)."""
    result = live.result
    if live.status == "complete" and result is not None and result.final_answer is not None:
        return None
    if live.status == "failed" and result is not None and asked.cut_at_bound(result) is not None:
        return None
    # Handed back at a stop (a shared store), or fenced here and not ended elsewhere when this one stopped
    # following it: either way it goes on at another replica.
    if (live.status == "queued" and live.handed_back) or (live.fenced and not live.settled):
        return RequestError(
            f"the server is stopping: debate {live.id} goes on at another replica (its finished turns kept, if "
            "any); send the request again with the same Idempotency-Key to get its answer (without one, a new "
            f"debate), or read it at GET /v1/debates/{live.id} once it ends",
            status=503,
            code="server_stopping",
        )
    if live.status == "queued":  # the server stopped before it started (a chat completion is not run later)
        return RequestError(
            f"the server is stopping: debate {live.id} never started; send the request again once it is back",
            status=503,
            code="server_stopping",
        )
    reason = (result.error if result else None) or "no decision"
    status = 504 if live.status == "timeout" else 502
    # A debate that failed on its model, timed out or was cancelled would do so again, at the whole
    # debate's cost: the SDKs are told not to retry. One the server interrupted (it stopped) may run.
    return RequestError(
        f"the debate {live.id} ended {live.status}: {reason} (its transcript: GET /v1/debates/{live.id})",
        status=status,
        code=f"debate_{live.status}",
        should_retry=False if live.status in ("failed", "timeout", "cancelled") else None,
    )


class TokenCount:
    """:func:`~moot.models.base.approx_tokens` of a text that grows piece by piece, at the cost of the
    new piece alone (counting the whole text again at every piece was quadratic in its length): a
    word split between two pieces is one token, as in the whole text."""

    def __init__(self) -> None:
        self.count = 0
        self._last = ""

    def after(self, piece: str) -> int:
        """The count of the text with ``piece`` added (not added yet: :meth:`add`)."""
        if not piece:
            return self.count
        joined = self._last and _WORD.match(self._last) and _WORD.match(piece[0])
        return self.count + approx_tokens(piece) - (1 if joined else 0)

    def add(self, piece: str, count: int | None = None) -> None:
        """``count``: :meth:`after`'s for this piece, when it was just asked."""
        if piece:
            self.count = self.after(piece) if count is None else count
            self._last = piece[-1]


_WORD = re.compile(r"\w")
