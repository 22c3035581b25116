"""The call budget's bookkeeping: every model call is counted before it is made, and refused when
the budget has no room for it.

A round's first calls are *owed* (``DebateState.owed_calls``): a repair or a self-check may only
use the budget beyond them, so one participant's repair cannot starve another's turn. A typed
turn reserves its repair call up front and gives it back unless the repair is made.
"""

from __future__ import annotations

from dataclasses import dataclass

from moot.core.state import DebateState
from moot.models.base import ModelError


class CallBudgetExhausted(ModelError):
    """Raised instead of making a model call the budget does not allow."""


@dataclass
class CallLedger:
    """The budget of one debate, over its state's call count."""

    state: DebateState
    limit: int | None

    def spend(self, *, first: bool) -> None:
        """Count a call about to be made (a round's ``first`` call pays what it owed), or refuse it."""
        if first and self.state.owed_calls > 0:
            self.state.owed_calls -= 1
        if not self.reserve(owed=self.state.owed_calls):
            calls = "call" if self.limit == 1 else "calls"
            raise CallBudgetExhausted(f"the call budget of {self.limit} {calls} is spent")

    def reserve(self, *, owed: int | None = None) -> bool:
        """Count one more call if the budget has room for it beyond the calls still owed."""
        res = self.state.result
        if self.limit is not None and res.llm_calls + (self.state.owed_calls if owed is None else owed) >= self.limit:
            return False
        res.llm_calls += 1
        return True

    def refund(self) -> None:
        """A counted call that was not made after all."""
        self.state.result.llm_calls -= 1


@dataclass
class TurnCalls:
    """One turn's calls: its first call, and a typed turn's repair (reserved, refunded if unused)."""

    ledger: CallLedger
    made: int = 0
    reserved: bool = False

    def first(self, *, first: bool) -> None:
        self.ledger.spend(first=first)
        self.made = 1

    def reserve_repair(self) -> bool:
        """Reserve the repair call if the budget has room (a typed reply may need one)."""
        self.reserved = self.ledger.reserve()
        return self.reserved

    def repairing(self) -> None:
        """The repair is being made: the reservation is used."""
        self.made = 2

    def settle(self, responses: int) -> None:
        """The typed call is done: an unused reservation goes back."""
        if self.reserved and responses == 1:
            self.ledger.refund()
        self.reserved = False

    def abort(self) -> None:
        """The turn was cut (failed, cancelled) before its repair was asked: the reservation goes back."""
        if self.reserved and self.made < 2:
            self.ledger.refund()
        self.reserved = False
