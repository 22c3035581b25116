"""A debate's budget: one rule, used by every front door.

``moot debate``, ``moot run``, ``moot batch`` (and :func:`moot.run_batch`) and ``moot serve`` (its
JSON API, chat endpoint and viewer) all settle a debate's budget here, the same way:

1. a value the caller gives wins: an option (``--timeout``, ``--max-calls``, ``--max-tokens``,
   ``--rounds``), a batch line's own ``timeout``, a request's ``budget.timeout_s``;
2. else the protocol's own ``budget:`` (a protocol file's ``timeout_s: 300``); the shipped presets
   set no timeout;
3. else, for the timeout, :func:`default_timeout_s`: :data:`TIMEOUT_PER_CALL_S` for each model call
   the protocol plans (``moot protocols`` lists them), 600 s for the default debate.

The default fits the documented hardware with room to spare: a 500-token turn of the shipped 1.5B
model decodes at about 5-10 tokens a second on two CPU cores with other work beside it, so a call
takes up to about 100 s, and the calls of a debate share those cores whether they run at once or in
turn. A server lowers every timeout to its own limit (``moot serve --timeout``).

:class:`~moot.core.engine.Engine` runs a spec as it is (``timeout_s=None``: no timeout of its own);
:func:`budget_for` gives a spec the front doors' budget.
"""

from __future__ import annotations

from moot.core.spec import ProtocolSpec

#: The default timeout's allowance for each planned model call, seconds.
TIMEOUT_PER_CALL_S = 120.0


def default_timeout_s(spec: ProtocolSpec) -> float:
    """The timeout of a debate whose caller and protocol set none: :data:`TIMEOUT_PER_CALL_S` per
    planned call (within the call cap)."""
    calls = spec.planned_calls()
    if spec.budget.max_calls is not None:
        calls = min(calls, spec.budget.max_calls)
    return TIMEOUT_PER_CALL_S * max(1, calls)


def apply_budget(
    spec: ProtocolSpec,
    *,
    rounds: int | None = None,
    timeout_s: float | None = None,
    max_calls: int | None = None,
    max_tokens: int | None = None,
) -> ProtocolSpec:
    """``spec`` with the values the caller gave (None: not given) over the protocol's own budget;
    ``max_tokens`` bounds every turn (each participant's own and an LLM decision's too)."""
    budget = spec.budget.model_copy(
        update={
            **({"timeout_s": timeout_s} if timeout_s is not None else {}),
            **({"max_calls": max_calls} if max_calls is not None else {}),
        }
    )
    spec = spec.model_copy(update={"budget": budget, **({"rounds": rounds} if rounds is not None else {})})
    return spec.with_turn_tokens(max_tokens) if max_tokens is not None else spec


def with_default_timeout(spec: ProtocolSpec) -> ProtocolSpec:
    """``spec`` as it is if it has a timeout, else with :func:`default_timeout_s`."""
    if spec.budget.timeout_s is not None:
        return spec
    budget = spec.budget.model_copy(update={"timeout_s": default_timeout_s(spec)})
    return spec.model_copy(update={"budget": budget})


def budget_for(
    spec: ProtocolSpec,
    *,
    rounds: int | None = None,
    timeout_s: float | None = None,
    max_calls: int | None = None,
    max_tokens: int | None = None,
) -> ProtocolSpec:
    """The front doors' rule in one call: the caller's values, else the protocol's, else the default
    timeout."""
    return with_default_timeout(
        apply_budget(spec, rounds=rounds, timeout_s=timeout_s, max_calls=max_calls, max_tokens=max_tokens)
    )
