"""A debate's progress as MCP progress notifications: a line per finished turn and round.

The debate's own event log is the progress: :func:`report_progress` follows it and sends a
notification per ``turn_done`` and ``round_done`` until the debate ends (for a ``debate`` call, and
for a task's notifications); :func:`last_progress` is the latest line, for a task's status message.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable

import anyio

from moot.server.mcp.results import cut
from moot.server.openai.debate_feed import value_of
from moot.server.schemas import RoundDoneData, TurnDoneData
from moot.server.state.events import LoggedEvent
from moot.server.state.manager import DebateManager, LiveDebate


def _progress_line(event: LoggedEvent) -> str | None:
    """A progress message for a logged event: each finished turn and round (None: not progress),
    read from its value (:func:`~moot.server.openai.debate_feed.value_of`: decoded only when another
    replica made it)."""
    name = event.name
    if name == "turn_done":
        turn = value_of(event, TurnDoneData).turn
        said = (turn.parsed or {}).get("answer") if turn.parsed else None
        if turn.error:
            what = f"failed ({cut(turn.error, 120)})"
        elif said is not None:
            what = f"answered {cut(str(said), 80)!r}"
        else:
            what = "spoke" if turn.kind == "debate" else "decided"
        where = "the decision" if turn.kind == "decision" else f"round {turn.round}"
        return f"{where}: {turn.name} {what}"
    if name == "round_done":
        rd = value_of(event, RoundDoneData)
        line = f"round {rd.round} done"
        if rd.majority is not None and rd.agreement is not None:
            line += f": majority {cut(rd.majority, 80)!r}, agreement {rd.agreement:.2f}"
        return line
    return None


Progress = Callable[[float, float | None, str | None], Awaitable[None]]


async def report_progress(live: LiveDebate, send: Progress, *, queued: bool = False) -> None:
    """A progress notification per finished turn and round of the debate, until it ends (``send``:
    the call's own, which sends nothing when the caller asked for no progress). ``queued``: it
    waits for a slot (:meth:`DebateManager.waits_for_slot`), said first, then its start."""
    total = float(live.spec.planned_turns() + live.spec.rounds_to_run())  # the events it counts
    done = 0.0
    with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
        await send(0.0, total, f"debate {live.id} {'queued' if queued else 'started'} ({live.spec.name})")
    async for event in live.log.follow(0):
        if queued and event.name == "debate_started":
            queued = False
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                await send(done, total, f"debate {live.id} started ({live.spec.name})")
            continue
        line = _progress_line(event)
        if line is None:
            continue
        done += 1
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            await send(done, max(total, done), line)


def last_progress(manager: DebateManager, debate_id: str) -> str | None:
    """The debate's latest progress line (its last finished turn or round), for a task's status."""
    log = manager.log_of(debate_id)
    for event in reversed(log.shown if log is not None else []):
        line = _progress_line(event)
        if line is not None:
            return line
    return None
