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

from moot.core.types import DebateCost, DebateResult, ModelCost, Turn
from moot.models.pricing import PriceTable
from moot.stats import total

__all__ = ["DebateCost", "ModelCost", "debate_cost"]


def _turn_usd(turn: Turn, prices: PriceTable) -> float | None:
    price = prices.price_for(turn.model)
    u = turn.usage
    return None if price is None else price.cost(u.prompt_tokens, u.completion_tokens, u.cached_prompt_tokens)


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
        line.cached_prompt_tokens += turn.usage.cached_prompt_tokens
    unpriced = []
    for line in per_model.values():
        price = table.price_for(line.model)
        if price is None:
            unpriced.append(line.model)
        else:
            line.usd = round(price.cost(line.prompt_tokens, line.completion_tokens, line.cached_prompt_tokens), 10)
    cost = DebateCost(
        usd=None if unpriced else round(total(m.usd or 0.0 for m in per_model.values()), 10),
        prompt_tokens=sum(m.prompt_tokens for m in per_model.values()),
        completion_tokens=sum(m.completion_tokens for m in per_model.values()),
        cached_prompt_tokens=sum(m.cached_prompt_tokens for m in per_model.values()),
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
            cost.single_call_usd = total(u or 0.0 for u in usds) / len(usds)
            if cost.usd is not None and cost.single_call_usd > 0:
                cost.ratio_to_single_usd = round(cost.usd / cost.single_call_usd, 6)
    return cost
