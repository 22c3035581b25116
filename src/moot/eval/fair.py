"""Each debate's fair baselines, fixed by its budget alone before any accuracy is looked at (see
:mod:`moot.eval.analysis`): the vote at its calls and at its tokens (a ``vote@auto`` of the run, a
``vote@K``, or the pool's vote at K), Adaptive-Consistency, a dearer vote; each paired with it."""

from __future__ import annotations

import json

from pydantic import BaseModel, Field

from moot.eval.goal import GOAL_POINTS, GOAL_TOKEN_SHARE
from moot.eval.pool import PoolAnalysis, draw_of
from moot.eval.protocols import k_at_budget, parse_ref
from moot.eval.report_model import Comparison, ProtocolSummary
from moot.stats import paired_items_needed, paired_test

BUDGET_SLACK = 1.10


def _plain_vote(summaries: list[ProtocolSummary], k: int, draw: int) -> ProtocolSummary | None:
    """The run's finished plain ``vote@k`` of a draw of round 1 (``vote@k`` or ``vote@k(first_seed=S)``)."""
    for b in summaries:
        ref = parse_ref(b.label)
        if (b.finished and ref.name == "vote" and b.k == k and ref.auto is None
                and set(ref.params) <= {"first_seed"} and draw_of(b.label) == draw):  # fmt: skip
            return b
    return None


def _baseline_key(s: ProtocolSummary) -> str:
    """What a baseline is, beyond its label: a vote is its sample count and parameters (vote@auto
    resolved to k = 6 is vote@6); anything else, or a vote whose k is not known, is its label."""
    ref = parse_ref(s.label)
    if ref.name != "vote" or s.k is None:
        return s.label
    return f"vote@{s.k}:{json.dumps(ref.params, sort_keys=True, default=str)}"


#: Adaptive-Consistency's threshold as its authors use it, fixed before any data is seen.
ADAPTIVE_THRESHOLD = 0.95


class _Fair(BaseModel):
    primary: Comparison | None = None
    primary_items: dict[str, float] = Field(default_factory=dict)
    others: list[Comparison] = Field(default_factory=list)
    missing: list[str] = Field(default_factory=list)


def _budget_vote(
    debate: ProtocolSummary,
    summaries: list[ProtocolSummary],
    expected: dict[str, dict[str, float]],
    pool: PoolAnalysis | None,
    k: int,
    by: str,
) -> tuple[str, dict[str, float], float, bool] | None:
    """The vote at ``k`` samples fixed by the debate's budget (``by`` calls or tokens): the run's
    ``vote@auto`` matched to this debate, else a plain ``vote@k`` of the run, else the pool's vote at
    k (derived from its k-subsets). (name, per-item expected correctness, mean tokens, derived)."""
    for b in summaries:
        ref = parse_ref(b.label)
        if b.finished and ref.auto == by and b.matched_to == debate.label:
            return b.label, expected[b.label], b.mean_tokens, False
    vote = _plain_vote(summaries, k, draw_of(debate.label))
    if vote is not None:
        return vote.label, expected[vote.label], vote.mean_tokens, False
    if pool is not None and k in pool.vote_per_item:
        return f"vote@{k} on {pool.pool}", pool.vote_per_item[k], k * pool.sample_tokens, True
    return None


def _fair_comparisons(
    debate: ProtocolSummary,
    summaries: list[ProtocolSummary],
    expected: dict[str, dict[str, float]],
    pool: PoolAnalysis | None,
    single: ProtocolSummary | None,
) -> _Fair:
    """A debate's baselines, fixed by its budget before any accuracy is looked at (see the module
    docstring), each paired with it on the items both have."""
    fair = _Fair()
    own = expected[debate.label]
    by = {s.label: s for s in summaries}
    # One comparison per baseline: vote@auto at k = 6 is vote@6 (the same spec, the same samples),
    # whichever kind of baseline it comes as.
    seen: set[str] = set()

    def key(name: str) -> str:
        return _baseline_key(by[name]) if name in by else name

    def add(name: str, items: dict[str, float], kind: str, tokens: float, derived: bool) -> Comparison | None:
        if key(name) in seen:
            return None
        seen.add(key(name))
        c = _paired(own, name, items, kind, tokens, derived)
        if c is not None:
            fair.others.append(c)
        return c

    k_calls = k_at_budget(debate.mean_calls)
    calls = _budget_vote(debate, summaries, expected, pool, k_calls, "calls")
    if calls is None:
        other = next((b.label for b in summaries if b.finished and b.k == k_calls and parse_ref(b.label).auto), None)
        also = (
            f" ({other} has {k_calls} samples too, and is paired as the vote at its own budget: add vote@{k_calls} "
            "to pair one at these calls)"
            if other is not None
            else ""
        )
        fair.missing.append(
            f"no vote at its {k_calls} calls: the run has no vote@{k_calls} and no pool that large{also}"
        )
    else:
        fair.primary = _paired(own, calls[0], calls[1], "equal-calls vote", calls[2], calls[3])
        fair.primary_items = calls[1]
        seen.add(key(calls[0]))
    per_sample = single.mean_tokens if single is not None and single.finished else (pool.sample_tokens if pool else 0)
    if per_sample:
        k_tokens = k_at_budget(debate.mean_tokens, per_sample)
        tokens = _budget_vote(debate, summaries, expected, pool, k_tokens, "tokens")
        if tokens is None:
            fair.missing.append(
                f"no vote at its tokens ({k_tokens} samples): add vote@auto(by=tokens, ref={debate.label}) to the run"
            )
        else:
            add(tokens[0], tokens[1], "equal-tokens vote", tokens[2], tokens[3])
    if pool is not None:
        ac = next((a for a in pool.adaptive if a.threshold == ADAPTIVE_THRESHOLD and a.per_item), None)
        if ac is not None and ac.mean_samples <= debate.mean_calls * BUDGET_SLACK:
            add(f"adaptive-consistency({ac.threshold:g}) on {pool.pool}", ac.per_item, "adaptive vote",
                ac.mean_tokens, True)  # fmt: skip
    # Can the debate match a dearer vote for at most 0.7x its tokens?
    for b in summaries:
        ref = parse_ref(b.label)
        if ref.name == "vote" and b.finished and debate.mean_tokens <= GOAL_TOKEN_SHARE * b.mean_tokens:
            add(b.label, expected[b.label], "dearer vote", b.mean_tokens, False)
    return fair


def _paired(
    own: dict[str, float], baseline: str, baseline_items: dict[str, float], kind: str, tokens: float, derived: bool
) -> Comparison | None:
    t = paired_test(baseline_items, own)
    if not t.n:
        return None
    both = own.keys() & baseline_items.keys()
    return Comparison(
        baseline=baseline, paired=t.n, diff=t.diff, ci_low=t.ci_low, ci_high=t.ci_high, p_value=t.p,
        only_debate_right=t.only_second, only_baseline_right=t.only_first, kind=kind, baseline_tokens=tokens,
        items_needed=paired_items_needed(t.differing / t.n, GOAL_POINTS), derived=derived,
        debate_ahead=sum(own[i] > baseline_items[i] for i in both),
        baseline_ahead=sum(own[i] < baseline_items[i] for i in both),
    )  # fmt: skip
