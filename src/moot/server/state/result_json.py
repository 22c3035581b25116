"""A running debate's stored JSON, made at each write without encoding its finished turns again
(:class:`ResultJson`).

The server stores a debate's transcript at every finished turn and round, so that a replica taking
it over keeps them. Encoding the whole result each time costs a debate the square of its turns: the
turns' prompts hold the earlier turns' replies. A turn is never changed once it is in the result
(the engine records it finished; :meth:`ResultJson.forget` for the one place that marks a cut turn
afterwards), nor a round's index, so its JSON, redacted, is made once and spliced into each write's:
the same text as :meth:`DebateResult.to_json` (``indent=None``) with no secret in it, the same values
with one (tests/test_result_json.py, and every server test through ``tests/conftest.py``'s check).
"""

from __future__ import annotations

from collections.abc import Iterable

from moot.core.types import DebateResult, Round, Turn
from moot.secrets import redact_json_of, redacted


def _around(model: type[DebateResult] | type[Round], *middle: str) -> tuple[set[str], set[str]]:
    """The fields of ``model`` before ``middle`` (consecutive fields) and those after it."""
    names = list(model.model_fields)
    at = names.index(middle[0])
    if names[at : at + len(middle)] != list(middle):
        raise TypeError(f"{model.__name__}: {middle} are no longer consecutive fields; update ResultJson")
    return set(names[:at]), set(names[at + len(middle) :])


_RESULT_HEAD, _RESULT_TAIL = _around(DebateResult, "rounds", "decision_turns")
_ROUND_HEAD, _ROUND_TAIL = _around(Round, "turns")


def _joined(head: str, middle: str, tail: str) -> str:
    """Two objects' JSON (``{...}``) with ``middle`` (``"key":value`` pairs) between their fields."""
    parts = [p for p in (head[1:-1], middle, tail[1:-1]) if p]
    return "{" + ",".join(parts) + "}"


class ResultJson:
    """One debate's result as its store keeps it, with each finished turn encoded (and redacted) once."""

    __slots__ = ("_rounds", "_secrets", "_turns")

    def __init__(self) -> None:
        #: id of a turn -> (the turn, kept so that its id is not reused; its redacted JSON).
        self._turns: dict[int, tuple[Turn, str]] = {}
        #: id of a round -> (the round; its fields but its turns, before them and after them).
        self._rounds: dict[int, tuple[Round, str, str]] = {}
        #: The secrets the cached JSON was redacted for: another set (an environment changed) starts over.
        self._secrets: list[str] = []

    def forget(self) -> None:
        """Encode every turn again at the next write (a turn was changed after it was recorded)."""
        self._turns.clear()
        self._rounds.clear()

    def encode(self, result: DebateResult, secrets: Iterable[str] = ()) -> str:
        """``result.to_json(indent=None, secrets=secrets)``, its finished turns encoded once."""
        known = redacted(secrets)
        if known != self._secrets:
            self.forget()
            self._secrets = known
        rounds = ",".join(self._round(r, known) for r in result.rounds)
        decision = ",".join(self._turn(t, known) for t in result.decision_turns)
        head = redact_json_of(result.model_dump_json(include=_RESULT_HEAD), known)
        tail = redact_json_of(result.model_dump_json(include=_RESULT_TAIL), known)
        return _joined(head, f'"rounds":[{rounds}],"decision_turns":[{decision}]', tail)

    def _round(self, rnd: Round, known: list[str]) -> str:
        cached = self._rounds.get(id(rnd))
        if cached is None or cached[0] is not rnd:
            head = redact_json_of(rnd.model_dump_json(include=_ROUND_HEAD), known)
            tail = redact_json_of(rnd.model_dump_json(include=_ROUND_TAIL), known) if _ROUND_TAIL else "{}"
            cached = self._rounds[id(rnd)] = (rnd, head, tail)
        turns = ",".join(self._turn(t, known) for t in rnd.turns)
        return _joined(cached[1], f'"turns":[{turns}]', cached[2])

    def _turn(self, turn: Turn, known: list[str]) -> str:
        cached = self._turns.get(id(turn))
        if cached is not None and cached[0] is turn:
            return cached[1]
        encoded = redact_json_of(turn.model_dump_json(), known)
        self._turns[id(turn)] = (turn, encoded)
        return encoded
