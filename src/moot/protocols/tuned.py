"""The evidence ``moot tune`` writes beside the protocol it chose (``tuned.yaml``'s ``tuned:`` block).

A tuned protocol file is an ordinary protocol file (``moot debate -p tuned.yaml`` runs it); the
``tuned:`` block says where it came from and how it did on items its choice never saw.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from moot.protocols.refs import ProtocolRefError, parse_call, preset_params


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


def chosen_protocol(chosen: str) -> dict[str, Any]:
    """The protocol ``moot tune`` writes for the label it chose: its preset, and its parameters under
    ``with:`` (``vote@3`` is ``{preset: vote, with: {k: 3}}``). A :class:`ProtocolRefError` for a
    label that names no single protocol."""
    call = parse_call(chosen)
    if call.at in ("auto", "uab"):
        raise ProtocolRefError(f"{chosen!r} is a run-level vote, not a protocol a tuned file can hold")
    params = preset_params(call, chosen)
    return {"preset": call.name, **({"with": params} if params else {})}


def edited_protocol(protocol: dict[str, Any], evidence: TunedEvidence) -> str | None:
    """What a tuned file runs when it is not what its evidence is about (its ``preset:`` or
    ``with:`` changed by hand, or an override added), in words; None when it runs ``tuned.chosen``.
    Its turn budget (``budget:``) may differ: the evidence does not fix it."""
    runs = {k: v for k, v in protocol.items() if k not in ("budget", "tuned")}
    if "with" in runs and not runs["with"]:
        runs.pop("with")  # `with: {}` gives no parameter
    try:
        expected = chosen_protocol(evidence.chosen)
    except ProtocolRefError as exc:
        return f"tuned.chosen names no protocol it could run ({exc})"
    if runs == expected:
        return None
    preset = runs.get("preset")
    params = runs.get("with")
    said = str(preset) if preset is not None else "an inline protocol (no preset:)"
    if isinstance(params, dict) and params:
        said += "(" + ",".join(f"{k}={v}" for k, v in params.items()) + ")"
    others = sorted(k for k in runs if k not in ("preset", "with"))
    if preset is not None and others:
        said += f" with {', '.join(others)} overridden"
    return f"it runs {said}, not {evidence.chosen}, the protocol its evidence (tuned.chosen) measured"
