"""Decision variants of a run's debates, derived from their stored transcripts at no new calls.

A debate's decision is a pure function of its transcript when it is a rule over typed answers (a
vote, trajectory scoring): another rule applied to the same transcript is another protocol that
made exactly the same calls. So every debate protocol of a run (one that ran a second round on
some item) is re-decided here
by each variant below, and compared on the same items with the debate's own decision and with
the equal-budget baseline the report chose for it (same calls, so the same budget):

- ``last-round vote``: the majority of the last round (Society of Minds' own rule);
- ``all-rounds vote``: every answer of every round counts once;
- ``trajectory``: Free-MAD-style scoring of each agent's answers over the rounds (kept answers
  gain, abandoned ones lose; :func:`moot.core.decisions.trajectory`);
- ``stated confidence``: the last round weighted by the stated confidence, ReConcile's mapping;
- ``answer probability``: the last round weighted by each answer's own token probability.

A variant a transcript cannot support (no typed answer, no confidence, no log-probabilities)
decides nothing on that item, which counts as wrong, as an unanswered item does everywhere.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel

from moot.core.decisions import DecisionOutcome, trajectory, vote
from moot.core.types import DebateResult
from moot.eval.items import EvalItem
from moot.eval.scoring import score
from moot.stats import paired_test, tie_credit, total

VARIANTS: dict[str, Callable[[DebateResult], DecisionOutcome]] = {
    "last-round vote": lambda r: vote(r),
    "all-rounds vote": lambda r: vote(r, rounds="all"),
    "trajectory": lambda r: trajectory(r, {}),
    "stated confidence": lambda r: vote(r, confidence_field="confidence", calibrate=True),
    "answer probability": lambda r: vote(r, signal="answer_prob"),
}


class Variant(BaseModel):
    protocol: str
    variant: str
    items: int
    accuracy: float
    #: Items on which the variant decided something.
    decided: int
    #: Paired against the protocol's own decision, on the same transcripts.
    diff_vs_protocol: float
    ci_low: float
    ci_high: float
    #: Paired against the equal-budget baseline of the report's comparison (None without one).
    baseline: str | None = None
    diff_vs_baseline: float | None = None
    baseline_ci_low: float | None = None
    baseline_ci_high: float | None = None
    baseline_p_value: float | None = None
    mean_tokens: float = 0.0


def derive_variants(
    label: str,
    transcripts: dict[str, DebateResult],
    items: dict[str, EvalItem],
    own: dict[str, float],
    baseline: tuple[str, dict[str, float]] | None,
    mean_tokens: float,
    only: set[str] | None = None,
) -> list[Variant]:
    """Each variant of protocol ``label`` (its transcripts, its own per-item correctness ``own``, in
    expectation over tie-breaks as every comparison of the report), on the items in ``only`` if given."""
    if only is not None:
        own = {i: ok for i, ok in own.items() if i in only}
        if baseline is not None:
            baseline = (baseline[0], {i: ok for i, ok in baseline[1].items() if i in only})
    # Every transcript with a round counts: a debate that stopped after a unanimous first round
    # (adaptive debate) is decided by that round under every rule.
    usable = {i: r for i, r in transcripts.items() if i in items and r.rounds}
    if not usable:
        return []
    out = []
    for name, rule in VARIANTS.items():
        right: dict[str, float] = {}
        decided = 0
        for item_id in own:
            result = usable.get(item_id)
            outcome = rule(result) if result is not None else None
            answer = outcome.final_answer if outcome is not None else None
            decided += answer is not None
            if outcome is None or answer is None:
                right[item_id] = 0.0
                continue
            tied = outcome.details.get("tied") if outcome.details.get("tie") else None
            right[item_id] = (
                tie_credit([str(a) for a in tied], {str(a): score(items[item_id], str(a)).correct for a in tied})
                if isinstance(tied, list) and len(tied) > 1
                else float(score(items[item_id], answer).correct)
            )
        if not decided:
            continue
        t = paired_test(own, right)
        row = Variant(
            protocol=label, variant=name, items=len(right), accuracy=total(right.values()) / max(1, len(right)),
            decided=decided, diff_vs_protocol=t.diff, ci_low=t.ci_low, ci_high=t.ci_high, mean_tokens=mean_tokens,
        )  # fmt: skip
        if baseline is not None:
            b = paired_test(baseline[1], right)
            row.baseline, row.diff_vs_baseline, row.baseline_ci_low, row.baseline_ci_high = (
                baseline[0], b.diff, b.ci_low, b.ci_high,
            )  # fmt: skip
            row.baseline_p_value = b.p
        out.append(row)
    return out
