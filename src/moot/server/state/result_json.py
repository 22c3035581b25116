"""A running debate's transcript as its store keeps it: each finished turn in a row of its own,
written once, and the rest of the result (its *frame*: every field but the turns) written at each
write (:class:`ResultJson`); and the transcript read back whole from the two (:func:`assemble`).

The server stores a debate's transcript at every finished turn and round, so that a replica taking
it over keeps them. Written whole each time, the transcript cost a debate the square of its turns,
in encoding and in the bytes its store wrote: the turns' prompts hold the earlier turns' replies. A
turn is never changed once it is in the result (the engine records it finished;
:meth:`ResultJson.forget` for the one place that marks a cut turn afterwards), so its JSON, redacted,
is made once and written once: the store's ``turns`` rows. A write whose result has no encoder (a
start-up's recovery, a take-over that fails) stores it whole, in the frame's place, with no rows: both
forms read back the same (:func:`assemble`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from moot.core.types import DebateResult, Turn
from moot.secrets import redact_json_of, redacted

#: The ``place`` of a decision's turn (``decision_turns``); a round's turns have their round's index
#: in ``rounds`` (from 0).
DECISION = -1

#: The result's fields but its turns: its rounds' indexes, and no decision turns.
_FRAME: Any = {"rounds": {"__all__": {"turns"}}, "decision_turns": True}


@dataclass(frozen=True)
class Split:
    """One write of a transcript: its frame, the turns the store lacks (or holds otherwise) as
    ``(n, place, JSON)``, ``n`` a turn's place in the result's order (its rounds' turns, then the
    decision's), how many turns it has, and whether the store may hold rows past them (``prune``)."""

    frame: str
    rows: list[tuple[int, int, str]]
    count: int
    prune: bool


class ResultJson:
    """One debate's result as its store keeps it, each finished turn encoded (and redacted) once and
    written once: :meth:`split` before a write, :meth:`stored` once it is committed."""

    __slots__ = ("_known", "_secrets", "_stored", "_turns")

    def __init__(self) -> None:
        #: id of a turn -> (the turn, kept so that its id is not reused; its redacted JSON).
        self._turns: dict[int, tuple[Turn, str]] = {}
        #: The secrets the cached JSON was redacted for: another set (an environment changed) starts over.
        self._secrets: list[str] = []
        #: The rows the store holds, as this debate's writes committed them: n -> (place, JSON), n
        #: from 0 to the number of its turns.
        self._stored: dict[int, tuple[int, str]] = {}
        #: Whether that is known (a write of this server's was committed): else the first prunes.
        self._known = False

    def forget(self) -> None:
        """Encode every turn again at the next write (a turn was changed after it was recorded)."""
        self._turns.clear()

    def split(self, result: DebateResult, secrets: Iterable[str] = ()) -> Split:
        """``result`` redacted with ``secrets`` as its store writes it now: only the turns that are
        not in the store as they are now become rows."""
        known = redacted(secrets)
        if known != self._secrets:
            self.forget()
            self._secrets = known
        placed = [(i, t) for i, r in enumerate(result.rounds) for t in r.turns]
        placed += [(DECISION, t) for t in result.decision_turns]
        rows: list[tuple[int, int, str]] = []
        for n, (place, turn) in enumerate(placed):
            text = self._turn(turn, known)
            stored = self._stored.get(n)
            if stored != (place, text):  # (the same turn's JSON is the same string: compared by identity first)
                rows.append((n, place, text))
        frame = redact_json_of(result.model_dump_json(exclude=_FRAME), known)
        count = len(placed)
        return Split(frame, rows, count, prune=not self._known or count < len(self._stored))

    def stored(self, split: Split) -> None:
        """``split`` was committed: its rows are the store's."""
        for n, place, text in split.rows:
            self._stored[n] = (place, text)
        if split.prune:
            for n in [n for n in self._stored if n >= split.count]:
                del self._stored[n]
        self._known = True

    def _turn(self, turn: Turn, known: list[str]) -> str:
        cached = self._turns.get(id(turn))
        if cached is not None and cached[0] is turn:
            return cached[1]
        encoded = redact_json_of(turn.model_dump_json(), known)
        self._turns[id(turn)] = (turn, encoded)
        return encoded


def assembled(frame: str, rows: Iterable[tuple[int, str]]) -> dict[str, Any]:
    """A stored transcript's JSON value: its frame with its turns' rows ``(place, JSON)``, in their
    order, in their places; or the whole result, stored so (a frame has no ``decision_turns``)."""
    data: dict[str, Any] = json.loads(frame)
    if "decision_turns" in data:
        # Stored whole (a write with no encoder, or a moot before schema 5, which knows no rows: a
        # replica of one still running in a rolling upgrade): rows left from before are not its turns.
        return data
    rounds = data.get("rounds", [])
    for rnd in rounds:
        rnd.setdefault("turns", [])
    decision = data.setdefault("decision_turns", [])
    for place, text in rows:
        (decision if place == DECISION else rounds[place]["turns"]).append(json.loads(text))
    return data


def assemble(frame: str, rows: list[tuple[int, str]]) -> DebateResult:
    """A stored transcript read back (:func:`assembled`), as the result it was."""
    if not rows:
        return DebateResult.model_validate_json(frame)
    return DebateResult.model_validate_json(json.dumps(assembled(frame, rows)))
