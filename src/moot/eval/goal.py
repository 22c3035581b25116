"""The goal a protocol or a rule must reach to pay, and the correction of every paired comparison of
a report as one family (Holm's p-values, Bonferroni intervals)."""

from __future__ import annotations

from statistics import NormalDist

from pydantic import BaseModel, Field

from moot.stats import Z95, bonferroni_z, holm

#: The goal a protocol or rule must reach to pay: this many points over its equal-budget baseline with a
#: paired 95% interval above 0, or its baseline's accuracy (within this non-inferiority margin, and not
#: below it on the point estimate by more than half a point) at no more than this share of its tokens.
GOAL_POINTS = 0.02
NON_INFERIORITY = 0.02
GOAL_TOKEN_SHARE = 0.7


class Corrected(BaseModel):
    """One comparison of the goal's family, corrected for the family's size."""

    name: str
    diff: float
    share: float | None
    ci95_low: float
    ci95_high: float
    #: The Bonferroni interval (each of the m comparisons at 1 - 0.05/m) and Holm's p-value.
    low: float
    high: float
    p: float
    p_holm: float
    #: Reaches the goal by its gain (at least ``GOAL_POINTS``, the corrected interval above 0), or by
    #: its cost (its baseline's accuracy, low end at least ``-NON_INFERIORITY``, at no more than
    #: ``GOAL_TOKEN_SHARE`` of the tokens).
    beats: bool = False
    cheaper: bool = False

    def gains(self, *, corrected: bool = True) -> bool:
        """Its gain reaches the goal: at least ``GOAL_POINTS``, its interval above 0 (the family's
        corrected one, or with ``corrected=False`` its 95% interval alone)."""
        return self.diff >= GOAL_POINTS and (self.low if corrected else self.ci95_low) > 0


def corrected_family(rows: list[tuple[str, float, float, float, float | None]]) -> list[Corrected]:
    """(name, difference, 95% low, 95% high, token share) rows, corrected as one family: every
    interval here is its centre plus or minus z times a standard error (Agresti-Min's, or the same
    over fractional credits), so the standard error is read back from the 95% interval, the
    p-value from it, and the interval widened to the Bonferroni level."""
    z_m = bonferroni_z(len(rows))

    out: list[Corrected] = []
    for name, diff, lo, hi, share in rows:
        centre, se = (lo + hi) / 2, (hi - lo) / (2 * Z95)
        p = 1.0 if se <= 0 else min(1.0, 2 * (1 - NormalDist().cdf(abs(centre) / se)))
        low, high = max(-1.0, centre - z_m * se), min(1.0, centre + z_m * se)
        out.append(Corrected(name=name, diff=diff, share=share, ci95_low=lo, ci95_high=hi, low=low, high=high, p=p,
                             p_holm=p))  # fmt: skip
    for c, adjusted in zip(out, holm([c.p for c in out]), strict=True):
        c.p_holm = adjusted
    return out


class Goal(BaseModel):
    """The goal's family: every paired comparison of a run (protocols against their baselines, each
    debate's re-decisions against its baseline, the pool's rules against the vote on the same
    samples), corrected as one family, and which of them reach the goal."""

    comparisons: list[Corrected]
    #: Per protocol comparison: the items a paired test needs to see a true ``GOAL_POINTS`` gain.
    items_needed: list[int] = Field(default_factory=list)
    #: The most items any protocol comparison paired.
    paired: int = 0
