"""UAB's run planning (arXiv 2605.26849): a fixed budget of samples moved between a run's items by
their difficulty, rated from each item's first sample (``vote@uab(budget=B, cap=K)`` in ``moot eval``
and ``moot batch``). :mod:`moot.eval.pool` scores the same allocation on a pool of samples."""

from __future__ import annotations

import math
from collections.abc import Sequence

from moot.core.spec import SpecError
from moot.core.types import DebateResult
from moot.models.base import BaseChatModel

#: UAB's temperature on the mean negative log-likelihood.
UAB_TEMPERATURE = 0.2


def uab_difficulty(seq_prob: float) -> float:
    """UAB's rating of an item by its first sample's probability exp(-ANLL): p = exp(-ANLL / 0.2)."""
    return math.exp(math.log(max(seq_prob, 1e-300)) / UAB_TEMPERATURE)


def first_sample_prob(transcript: DebateResult | None) -> float | None:
    """The whole reply's probability (``seq_prob``) of a vote's first sample (None: none recorded)."""
    turns = transcript.rounds[0].turns if transcript is not None and transcript.rounds else []
    return turns[0].signals.get("seq_prob") if turns else None


def uab_plan(
    first_probs: dict[str, float], budget: int, cap: int, caps: dict[str, int] | None = None
) -> dict[str, int]:
    """How many samples each item gets under ``vote@uab(budget, cap)``, from its first sample's
    probability: :func:`uab_allocate` of ``budget`` x items over their :func:`uab_difficulty`.
    ``caps``: an item's own lower cap (a batch line's ``max_calls``)."""
    ids = list(first_probs)
    own = [min(cap, (caps or {}).get(i, cap)) for i in ids]
    counts, _ = uab_allocate([uab_difficulty(first_probs[i]) for i in ids], budget * len(ids), own)
    return dict(zip(ids, counts, strict=True))


def refuse_blind_uab(label: str, model: BaseChatModel) -> None:
    """:class:`SpecError` before any call when ``model`` is known to return no log-probabilities:
    UAB rates each item by its first sample's probability."""
    if model.returns_logprobs is False:
        raise SpecError(
            f"{label} rates each item's difficulty by its first sample's probability, read from token "
            f"log-probabilities, and {model.name} returns none: use a model that does (embedded:..., or an "
            "OpenAI-compatible server that returns logprobs) or a fixed vote@K"
        )


def uab_allocate(difficulty: list[float], budget: int, cap: int | Sequence[int]) -> tuple[list[int], int]:
    """UAB's allocation of ``budget`` samples over items whose first sample gave ``difficulty``
    (p = exp(-ANLL/0.2)): one each, then one at a time to the largest p(1-p)^n (ties to the first
    item). The second value counts the items that reached ``cap`` (their pool; or each item's own)
    and were passed over."""
    import heapq

    caps = [cap] * len(difficulty) if isinstance(cap, int) else list(cap)
    n = [1] * len(difficulty)
    heap = [(-p * (1.0 - p), i) for i, p in enumerate(difficulty)]
    heapq.heapify(heap)
    capped = 0
    left = budget - len(difficulty)
    while left > 0 and heap:
        _, i = heapq.heappop(heap)
        if n[i] >= caps[i]:
            capped += 1
            continue
        n[i] += 1
        left -= 1
        p = difficulty[i]
        heapq.heappush(heap, (-p * (1.0 - p) ** n[i], i))
    return n, capped
