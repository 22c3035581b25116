"""The state of one running debate, and what a stop condition may read of its protocol.

This module sits below both the engine, which builds and advances a :class:`DebateState`, and the
stop conditions (:mod:`moot.core.stop`), which read it between rounds; neither has to import the
other, and a stop condition does not import the spec that holds it (it reads the protocol through
:class:`RoundPlan`, which :class:`~moot.core.spec.ProtocolSpec` satisfies).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from moot.core.types import DebateResult, Round


@dataclass
class DebateState:
    """Everything the steps need between them. ``result`` is the growing transcript."""

    result: DebateResult
    t0: float = field(default_factory=time.perf_counter)
    #: First calls the current round has still to make: a repair call may only use budget
    #: beyond them, so one participant's repair cannot starve another's turn.
    owed_calls: int = 0
    #: A debate resumed from its recorded transcript (:meth:`~moot.core.engine.Engine.resume`): the
    #: finished turns it kept (None: a new debate).
    resumed: int | None = None
    #: The last round as the interruption cut it: the next ``run_round`` completes it, running only
    #: the speakers with no finished turn in it, instead of starting a new round.
    partial: Round | None = None

    @property
    def round_count(self) -> int:
        return len(self.result.rounds)

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0


class RoundPlan(Protocol):
    """What a stop condition may read of the protocol it runs in: the calls a round and the
    decision need. :class:`~moot.core.spec.ProtocolSpec` is one."""

    @property
    def decision_calls(self) -> int: ...

    def speakers_per_round(self) -> int: ...

    def round_calls(self) -> int: ...
