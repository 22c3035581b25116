"""The evidence ``moot tune`` writes beside the protocol it chose (``tuned.yaml``'s ``tuned:`` block).

A tuned protocol file is an ordinary protocol file (``moot debate -p tuned.yaml`` runs it); the
``tuned:`` block says where it came from and how it did on items its choice never saw.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class HeldOut(BaseModel):
    """The chosen protocol against the vote at its budget on the held-out items, paired."""

    model_config = ConfigDict(extra="forbid")

    items: int
    accuracy: float
    ci_low: float
    ci_high: float
    #: The vote at its budget (``single`` for a plain vote); None when the tune had none to compare
    #: with (a plain vote chosen without ``single`` among the candidates), and so the fields below.
    baseline: str | None
    baseline_accuracy: float | None = None
    diff: float | None = None
    diff_ci_low: float | None = None
    diff_ci_high: float | None = None
    mean_tokens: float
    mean_calls: float
    #: What the held-out run held before this choice was confirmed there: an earlier tune of the same
    #: folder (run again with other candidates or another budget) had run these protocols on the
    #: held-out items, and their results could be seen before this choice was made. Then the items
    #: are not untouched and the numbers above are not a fresh confirmation. Empty when they are.
    seen_before: list[str] = Field(default_factory=list)


class TunedEvidence(BaseModel):
    model_config = ConfigDict(extra="forbid")

    #: The label ``moot tune`` chose (``weighted-vote(signal=answer_prob, softmax_t=0.2)``).
    chosen: str
    model: str
    #: The objective and budget it was chosen by, as given.
    objective: str
    budget: str | None = None
    #: Why this one: a supported winner, or the cheapest within the margin when the data could not
    #: tell the candidates apart.
    reason: str
    #: Its accuracy on the tuning items (an estimate biased upward by the choice itself).
    tuning_accuracy: float
    tuning_items: int
    held_out: HeldOut | None = None
    #: The data's SHA-256 (first 16 hex digits) and when the choice was made (UTC).
    data: str
    data_fingerprint: str
    date: str
