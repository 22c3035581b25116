"""The evidence ``moot tune`` writes beside the protocol it chose (``tuned.yaml``'s ``tuned:`` block).

A tuned protocol file is an ordinary protocol file (``moot debate -p tuned.yaml`` runs it); the
``tuned:`` block says where it came from and how it did on items its choice never saw.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import yaml
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
    #: The chosen protocol when it came from a protocol file (``chosen`` is then its path, which
    #: need not exist where the tuned file is used): its whole spec, as the file runs it. Left out
    #: for a preset's label, which names its protocol itself.
    protocol: dict[str, Any] | None = Field(default=None, exclude_if=lambda v: v is None)
    #: The data's SHA-256 (first 16 hex digits) and when the choice was made (UTC).
    data: str
    data_fingerprint: str
    date: str


#: The first line of every ``tuned.yaml`` ``moot tune`` writes.
TUNED_HEADER = "# moot tune: the protocol chosen on the tuning items, confirmed on the held-out items\n"


class TunedFile(BaseModel):
    """A ``tuned.yaml``: the one typed model it is written (``moot tune``) and read through. It is an
    ordinary protocol file (a preset and its parameters under ``with:``, a turn budget) with its
    evidence under ``tuned:``; a file edited by hand may hold other protocol keys, kept as they are
    (:func:`edited_protocol` says what the file then runs)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    preset: str | None = None
    with_: dict[str, Any] | None = Field(default=None, alias="with")
    budget: dict[str, Any] | None = None
    tuned: TunedEvidence

    @classmethod
    def of(cls, evidence: TunedEvidence, max_tokens: int | None = None) -> TunedFile:
        """The file ``moot tune`` writes for its choice (``evidence.chosen``): the chosen protocol
        (:func:`chosen_protocol`), the run's turn budget when it had one, and the evidence."""
        protocol = chosen_protocol(evidence.chosen, evidence.protocol)
        own = protocol.pop("budget", None) or {}  # a protocol file's own budget, kept
        budget = {**own, "max_tokens_per_turn": max_tokens} if max_tokens else (own or None)
        return cls.model_validate({**protocol, "budget": budget, "tuned": evidence})

    def protocol(self) -> dict[str, Any]:
        """The protocol file without its ``tuned:`` block, as the file holds it."""
        out: dict[str, Any] = {}
        if self.preset is not None:
            out["preset"] = self.preset
        if self.with_ is not None:
            out["with"] = self.with_
        if self.budget is not None:
            out["budget"] = self.budget
        return {**out, **(self.model_extra or {})}

    def document(self) -> dict[str, Any]:
        """The whole file as YAML data: the protocol, then ``tuned:``."""
        # Through JSON, as the evidence is stored everywhere else (a float the JSON cannot hold is null).
        return {**self.protocol(), "tuned": json.loads(self.tuned.model_dump_json())}

    def to_yaml(self) -> str:
        return TUNED_HEADER + yaml.safe_dump(self.document(), sort_keys=False, allow_unicode=True)

    @classmethod
    def from_data(cls, data: Any) -> TunedFile:
        """A file's YAML data read back (a pydantic ``ValidationError`` names what is wrong)."""
        return cls.model_validate(data)


def chosen_protocol(chosen: str, protocol: dict[str, Any] | None = None) -> dict[str, Any]:
    """The protocol ``moot tune`` writes for the label it chose: a protocol file's spec (``protocol``,
    :attr:`TunedEvidence.protocol`), else its preset and its parameters under ``with:`` (``vote@3`` is
    ``{preset: vote, with: {k: 3}}``). A :class:`ProtocolRefError` for a label that names no single
    protocol."""
    if protocol is not None:
        return dict(protocol)
    call = parse_call(chosen)
    if call.at in ("auto", "uab"):
        raise ProtocolRefError(f"{chosen!r} is a run-level vote, not a protocol a tuned file can hold")
    params = preset_params(call, chosen)
    return {"preset": call.name, **({"with": params} if params else {})}


def edited_protocol(
    protocol: dict[str, Any], evidence: TunedEvidence, same: Callable[[dict[str, Any], dict[str, Any]], bool]
) -> str | None:
    """What a tuned file runs when it is not what its evidence is about (its ``preset:`` or
    ``with:`` changed by hand, or an override added), in words; None when it runs ``tuned.chosen``,
    however written: ``same`` says whether two protocols (as a file writes them) run the same spec
    (``k: "3"`` is ``k: 3``). Its turn budget (``budget:``) may differ: the evidence does not fix it."""
    runs = {k: v for k, v in protocol.items() if k not in ("budget", "tuned")}
    if "with" in runs and not runs["with"]:
        runs.pop("with")  # `with: {}` gives no parameter
    try:
        expected = {k: v for k, v in chosen_protocol(evidence.chosen, evidence.protocol).items() if k != "budget"}
    except ProtocolRefError as exc:
        return f"tuned.chosen names no protocol it could run ({exc})"
    if runs == expected:
        return None
    if same(runs, expected):
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
