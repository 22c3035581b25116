"""What a debate cost: tokens per model, in money where the model has a price, and against one call.

Seed 004 monitors "cost per debate vs single-agent decisions". A debate's cost is the sum over its
turns (decision turns included) of each turn's prompt and completion tokens at its model's price
(:class:`~moot.models.pricing.PriceTable`); a turn answered by a request cache counts what it would
have cost alone, as everywhere in moot. A model with no price gives no money figure: the cost is
then in tokens only, and ``unpriced`` names the models that lack a price. Nothing is estimated.

*A single call* is what one agent answering the question alone costs. Within one debate it is
estimated by the mean of the round-1 debate turns that made a call (each answers the question from
the same task and context, before seeing anyone); ``moot eval report`` measures it instead, as the
``single`` protocol's mean on the same items.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from moot.models.pricing import PriceTable

if TYPE_CHECKING:
    from moot.core.types import DebateResult, Turn


class ModelCost(BaseModel):
    """The calls and tokens of one model in a debate, and their price (None: no price)."""

    model: str
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    usd: float | None = None


class DebateCost(BaseModel):
    """A debate's cost, per model and in all."""

    #: US dollars in all; None when a model that was called has no price (see ``unpriced``).
    usd: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    models: list[ModelCost] = Field(default_factory=list)
    #: Models called without a price: their cost is in tokens only.
    unpriced: list[str] = Field(default_factory=list)
    #: A single call's tokens and price: the mean of round 1's turns (None: no such turn).
    single_call_tokens: float | None = None
    single_call_usd: float | None = None
    #: The debate's cost over a single call's, in tokens and (where priced and not free) in money.
    ratio_to_single_tokens: float | None = None
    ratio_to_single_usd: float | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def describe(self) -> str:
        """One line for a person: money (or why not), tokens, and the ratio to a single call."""
        if self.unpriced:
            money = (
                f"tokens only: no price for {', '.join(self.unpriced)} "
                "(give --prices FILE or --price MODEL=INPUT,OUTPUT, USD per million tokens)"
            )
        elif self.usd == 0:
            money = "$0 (embedded models cost 0)" if all(m.model.startswith("embedded") for m in self.models) else "$0"
        else:
            money = f"${self.usd:.6f}" if self.usd is not None and self.usd < 0.01 else f"${self.usd:.4f}"
        ratio = self.ratio_to_single_usd if self.ratio_to_single_usd is not None else self.ratio_to_single_tokens
        basis = "cost" if self.ratio_to_single_usd is not None else "tokens"
        single = f"; {ratio:.1f}x a single call's {basis}" if ratio is not None else ""
        return f"{money}; {self.total_tokens} tokens{single}"


def _turn_usd(turn: Turn, prices: PriceTable) -> float | None:
    price = prices.price_for(turn.model)
    return None if price is None else price.cost(turn.usage.prompt_tokens, turn.usage.completion_tokens)


def debate_cost(result: DebateResult, prices: PriceTable | None = None) -> DebateCost:
    """The cost of ``result`` at ``prices`` (none given: embedded models cost 0, others are unpriced)."""
    table = prices or PriceTable()
    turns = [*result.turns(), *result.decision_turns]
    per_model: dict[str, ModelCost] = {}
    for turn in turns:
        if turn.calls == 0 and turn.usage.total_tokens == 0:
            continue  # a carried answer or a refused call: nothing was spent
        line = per_model.setdefault(turn.model, ModelCost(model=turn.model))
        line.calls += turn.calls
        line.prompt_tokens += turn.usage.prompt_tokens
        line.completion_tokens += turn.usage.completion_tokens
    unpriced = []
    for line in per_model.values():
        price = table.price_for(line.model)
        if price is None:
            unpriced.append(line.model)
        else:
            line.usd = round(price.cost(line.prompt_tokens, line.completion_tokens), 10)
    cost = DebateCost(
        usd=None if unpriced else round(sum(m.usd or 0.0 for m in per_model.values()), 10),
        prompt_tokens=sum(m.prompt_tokens for m in per_model.values()),
        completion_tokens=sum(m.completion_tokens for m in per_model.values()),
        models=sorted(per_model.values(), key=lambda m: m.model),
        unpriced=sorted(unpriced),
    )
    firsts = [t for t in (result.rounds[0].turns if result.rounds else []) if t.calls > 0 and t.error is None]
    if firsts:
        cost.single_call_tokens = sum(t.usage.total_tokens for t in firsts) / len(firsts)
        if cost.single_call_tokens > 0:
            cost.ratio_to_single_tokens = round(cost.total_tokens / cost.single_call_tokens, 6)
        usds = [_turn_usd(t, table) for t in firsts]
        if all(u is not None for u in usds):
            cost.single_call_usd = sum(u or 0.0 for u in usds) / len(usds)
            if cost.usd is not None and cost.single_call_usd > 0:
                cost.ratio_to_single_usd = round(cost.usd / cost.single_call_usd, 6)
    return cost
