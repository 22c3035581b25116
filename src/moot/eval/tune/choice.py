"""``moot tune``'s selection rule: each candidate's score on the tuning items, the vote at its budget,
and the choice by the stated objective (:func:`choose`), a pure function of the scores."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from pydantic import BaseModel, SerializerFunctionWrapHandler, model_serializer

from moot.eval.goal import GOAL_POINTS
from moot.eval.protocols import k_at_budget, parse_ref
from moot.eval.tune.config import TuneBudget, TuneConfig, TuneRunError
from moot.stats import paired_items_needed, paired_test


class CandidateScore(BaseModel):
    label: str
    items: int
    accuracy: float
    ci_low: float
    ci_high: float
    mean_tokens: float
    mean_calls: float
    usd: float | None = None
    fits: bool = True
    #: The items whose debate failed (counted wrong, as in ``moot eval report``) and the commonest
    #: reason. A candidate that failed on every item (a weighted vote on a model that returns no
    #: log-probabilities) has no accuracy to speak of: it is shown as failed, never ranked or chosen.
    failed: int = 0
    failure: str | None = None

    @property
    def all_failed(self) -> bool:
        return self.items > 0 and self.failed == self.items

    @model_serializer(mode="wrap")
    def _without_no_failures(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A candidate with no failed item is written as before the failures were recorded, so that
        # the committed tunes still re-derive byte for byte.
        data: dict[str, Any] = handler(self)
        if not self.failed:
            data.pop("failed", None)
            data.pop("failure", None)
        return data


class Comparison(BaseModel):
    against: str
    items: int
    diff: float
    ci_low: float
    ci_high: float
    items_needed: int | None = None


Scores = dict[str, tuple[CandidateScore, dict[str, float]]]


class Choice(NamedTuple):
    """What :func:`choose` chose on the tuning items, why, whether the data supports it as a winner,
    and its comparison with the vote at its budget (None: it has none)."""

    label: str
    reason: str
    supported: bool
    comparison: Comparison | None


@dataclass(frozen=True)
class NeedVote:
    """The vote at a candidate's budget that the choice needs and the tuning run does not hold yet."""

    label: str


def _cost(c: CandidateScore, kind: str) -> float:
    if kind == "calls":
        return c.mean_calls
    if kind == "usd":
        return c.usd if c.usd is not None else 0.0
    return c.mean_tokens


def budget_vote(c: CandidateScore, single: CandidateScore | None, budget: TuneBudget | None) -> str:
    """The plain vote at a candidate's budget, fixed before its accuracy is looked at: k = its calls
    (a calls budget, or none), or its tokens over one sample's (a tokens or usd budget)."""
    if budget is not None and budget.kind != "calls" and single is not None and single.mean_tokens:
        return f"vote@{k_at_budget(c.mean_tokens, single.mean_tokens)}"
    return f"vote@{k_at_budget(c.mean_calls)}"


def _whom(against: str) -> str:
    """The baseline a candidate was held to, in words: the vote at its budget, or the single answer that
    stands in for it (for a plain vote at its own budget)."""
    if against != "single":
        return f"{against} (the vote at its budget)"
    return "single (it is itself the vote at its budget)"


def _is_plain_vote(label: str) -> bool:
    ref = parse_ref(label)
    return ref.name == "vote" and not ref.params


def choose(scores: Scores, config: TuneConfig) -> Choice | NeedVote:
    """The choice on the tuning items (:class:`Choice`), or the vote at a candidate's budget that it
    needs and ``scores`` lacks (:class:`NeedVote`: the run loop runs it on the tuning part and asks
    again). A pure function of the scores: no exception steers it (a :class:`TuneRunError` is an answer
    to the user: nothing to choose from)."""
    budget = config.budget
    kind = budget.kind if budget is not None else "tokens"
    within = " within the budget" if budget is not None else ""
    for c, _ in scores.values():
        c.fits = not c.all_failed and (budget is None or _cost(c, budget.kind) <= budget.limit)
    # Only a candidate is chosen: the votes the tune adds at a candidate's budget are baselines. One
    # that failed on every item is neither chosen nor ranked (its 0% is no measurement).
    offered = [scores[label][0] for label in config.candidates if label in scores]
    candidates = [c for c in offered if not c.all_failed]
    if not candidates:
        reasons = "; ".join(f"{c.label}: {c.failure}" for c in offered)
        raise TuneRunError(f"every candidate failed on every tuning item ({reasons})")
    fitting = [c for c in candidates if c.fits]
    if not fitting:
        cheapest = min(candidates, key=lambda c: _cost(c, kind))
        raise TuneRunError(
            f"--budget {budget}: no candidate fits on the tuning items (the cheapest, {cheapest.label}, spends "
            f"{_cost(cheapest, kind):.4g} {kind} an item)"
        )
    single = scores["single"][0] if "single" in scores and not scores["single"][0].all_failed else None

    def against_vote(c: CandidateScore) -> Comparison | NeedVote | None:
        vote = budget_vote(c, single, budget)
        if _is_plain_vote(c.label) and parse_ref(c.label).k == parse_ref(vote).k:
            if single is None or c.label == "single":
                return None
            vote = "single"
        if vote not in scores:
            return NeedVote(vote)
        t = paired_test(scores[vote][1], scores[c.label][1])
        needed = paired_items_needed(t.differing / t.n, GOAL_POINTS) if t.n else None
        return Comparison(against=vote, items=t.n, diff=t.diff, ci_low=t.ci_low, ci_high=t.ci_high,
                          items_needed=needed)  # fmt: skip

    by_cost = sorted(fitting, key=lambda c: (_cost(c, kind), -c.accuracy))
    if config.objective == "cheapest":
        reference = max((c for c in fitting if _is_plain_vote(c.label)), key=lambda c: _cost(c, kind), default=None)
        if reference is None:
            raise TuneRunError(
                "--objective cheapest compares with the plain vote at the budget, and no vote@K candidate fits it on "
                "the tuning items: add a cheaper vote@K, or raise the budget"
            )
        for c in by_cost:
            t = paired_test(scores[reference.label][1], scores[c.label][1])
            if t.ci_low >= -config.margin:
                why = (f"the cheapest candidate{within} whose accuracy is not worse than {reference.label}'s "
                       f"by more than {100 * config.margin:g} points ({100 * t.diff:+.1f} [{100 * t.ci_low:+.1f}, "
                       f"{100 * t.ci_high:+.1f}] on the tuning items)")  # fmt: skip
                found = against_vote(c)
                return found if isinstance(found, NeedVote) else Choice(c.label, why, True, found)
        return Choice(reference.label, f"no cheaper candidate is non-inferior to {reference.label}", False, None)
    best = max(fitting, key=lambda c: (c.accuracy, -_cost(c, kind)))
    comparison = against_vote(best)
    if isinstance(comparison, NeedVote):
        return comparison
    if comparison is not None and comparison.ci_low > 0:
        why = (f"the most accurate{within}, and it beats {_whom(comparison.against)} on the tuning "
               f"items: {100 * comparison.diff:+.1f} points [{100 * comparison.ci_low:+.1f}, "
               f"{100 * comparison.ci_high:+.1f}]")  # fmt: skip
        return Choice(best.label, why, True, comparison)
    needed = comparison.items_needed if comparison is not None else None
    if comparison is None:
        against = f"the most accurate, {best.label}, has no vote to be compared with"
    else:
        against = (f"the most accurate, {best.label}, is {100 * comparison.diff:+.1f} points "
                   f"[{100 * comparison.ci_low:+.1f}, {100 * comparison.ci_high:+.1f}] against "
                   f"{_whom(comparison.against)}, an interval that does not clear 0")  # fmt: skip
    if len(fitting) == 1:  # nothing to tell apart: the others failed, or cost too much
        gone = " or ".join(dict.fromkeys(
            "failed on every tuning item" if c.all_failed else "do not fit the budget" for c in offered if c is not best
        ))  # fmt: skip
        return Choice(best.label, f"the only candidate left (the others {gone}); {against}", False, comparison)
    near = [c for c in by_cost if c.accuracy >= best.accuracy - config.margin]
    pick = near[0] if near else best
    why = (
        f"the tuning items cannot tell the candidates apart: {against}; so the cheapest candidate within "
        f"{100 * config.margin:g} points of it is chosen"
        + (
            f"; telling a {100 * GOAL_POINTS:g}-point gain apart would take about {needed:,} paired items"
            if needed
            else ""
        )
    )
    found = against_vote(pick)
    return found if isinstance(found, NeedVote) else Choice(pick.label, why, False, found)


def held_out_labels(chosen: str, comparison: Comparison | None) -> list[str]:
    """What runs on the held-out items: the choice, and the vote at its budget it was compared with."""
    baseline = comparison.against if comparison is not None else None
    return [chosen] + ([baseline] if baseline is not None and baseline != chosen else [])
