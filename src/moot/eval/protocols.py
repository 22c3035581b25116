"""What ``--protocols`` names, and how a protocol is fitted to an evaluation item.

A protocol reference is ``NAME``, ``NAME@K``, ``NAME(key=value, ...)`` or a YAML protocol file:

- ``single``, ``society-of-minds``, ``mad(rounds=2)``: a preset with parameters;
- ``vote@5``: self-consistency with 5 samples;
- ``vote@auto``: a vote whose sample count is matched, after the debates ran, to the mean calls
  per item of a debate protocol of the same run (the first one listed, or ``ref=NAME``);
  ``vote@auto(by=tokens)`` matches mean tokens per item instead (k = debate tokens / single tokens);
- ``path/to/protocol.yaml``: any protocol file ``moot run``/``moot debate -p`` accepts.

Fitting an item: every turn or verdict that uses the generic ``answer`` / ``verdict`` schema gets
the item's typed schema (its letters, labels or a number), so constrained decoding can only give a
scorable answer; the turn budget is the run's.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field

from moot.core.schemas import ANSWER_FORMS
from moot.core.spec import Budget, JudgeDecision, Probe, ProtocolSpec
from moot.eval.items import EvalItem, answer_schema_name, direct_schema_name, verdict_schema_name
from moot.protocols import get_preset, preset_names
from moot.protocols.loader import load_protocol
from moot.protocols.refs import ProtocolRefError, parse_call, split_protocols, uab_terms, vote_k

#: Not debates: a vote's budget is never matched to these.
BASELINES = {"single", "vote", "cisc", "direct", "adaptive-consistency", "weighted-vote", "filtered-vote"} | {
    "usc",
    "select",
}


def k_at_budget(budget: float, per_sample: float = 1.0) -> int:
    """The vote's K at a budget: how many samples ``budget`` pays for at ``per_sample`` each (a
    debate's mean calls at one call a sample, or its mean tokens at one sample's tokens), half up
    and at least 1. The one rule of ``vote@auto``, the report's equal-budget baselines and ``moot
    tune``'s vote at a candidate's budget."""
    # Half up, not Python's half to even: a debate of 4.5 calls is matched by a vote of 5, not 4.
    return max(1, math.floor(budget / per_sample + 0.5))


class _Spent(Protocol):
    """What an item's result says of its cost (:class:`moot.eval.store.ItemResult`)."""

    @property
    def status(self) -> str: ...

    @property
    def calls(self) -> int: ...

    @property
    def tokens(self) -> int: ...


class AutoBudget(BaseModel):
    """What a ``vote@auto``'s k comes from: its reference debate's mean calls or tokens per item over
    the items it finished, and, matched by tokens, one sample's mean tokens (the run's ``single``'s,
    :func:`sample_reference`). The run stores k once its debate has all its items; a report prints
    it with these figures."""

    by: Literal["calls", "tokens"]
    reference: str
    reference_items: int
    reference_mean: float
    sample: str | None = None
    sample_items: int = 0
    sample_mean: float | None = None
    k: int


def auto_budget(ref: ProtocolRef, labels: Sequence[str], results_of: Callable[[str], Sequence[_Spent]]) -> AutoBudget:
    """A ``vote@auto``'s k at its debate's budget (:func:`k_at_budget`), from the finished results
    of its reference and, by tokens, of one sample (``results_of(label)``: a run's results); a
    ValueError saying why when there are none to match."""
    assert ref.auto is not None and ref.reference is not None
    debate = [r for r in results_of(ref.reference) if r.status == "ok"]
    if not debate:
        raise ValueError(f"{ref.label}: every item of {ref.reference} failed, so there is no budget to match")
    if ref.auto == "calls":
        mean = statistics.fmean(r.calls for r in debate)
        return AutoBudget(by="calls", reference=ref.reference, reference_items=len(debate), reference_mean=mean,
                          k=k_at_budget(mean))  # fmt: skip
    sample = sample_reference(ref, labels) or "single"
    single = [r for r in results_of(sample) if r.status == "ok"]
    if not single:
        raise ValueError(f"{ref.label}: every item of `{sample}` failed, so there are no tokens per sample")
    mean, per_sample = statistics.fmean(r.tokens for r in debate), statistics.fmean(r.tokens for r in single)
    return AutoBudget(
        by="tokens", reference=ref.reference, reference_items=len(debate), reference_mean=mean, sample=sample,
        sample_items=len(single), sample_mean=per_sample, k=k_at_budget(mean, max(per_sample, 1.0)),
    )  # fmt: skip


class ProtocolRef(BaseModel):
    """One entry of ``--protocols``."""

    label: str
    name: str
    k: int | None = None
    auto: Literal["calls", "tokens"] | None = None
    #: ``vote@uab(budget=B, cap=K)``: UAB's allocation (arXiv 2605.26849) of B samples per item on
    #: average, moved between the run's items by their first sample's difficulty, at most K each.
    uab_budget: int | None = None
    uab_cap: int = 8
    reference: str | None = None  # the debate an auto vote is matched to (its label)
    params: dict[str, Any] = Field(default_factory=dict)

    @property
    def is_baseline(self) -> bool:
        return self.name in BASELINES

    def turn_tokens(self, run: int | None) -> int | None:
        """Each turn's token cap in a run whose ``--max-tokens`` is ``run``: the run's, unless the
        protocol names its own (``society-of-minds(wording=du,max_tokens=1024)``), which wins."""
        return None if "max_tokens" in self.params else run

    @property
    def is_file(self) -> bool:
        return self.name.endswith((".yaml", ".yml"))


def parse_ref(text: str) -> ProtocolRef:
    call = parse_call(text)
    name, params = call.name, call.params
    is_file = name.endswith((".yaml", ".yml"))
    if not is_file and name not in preset_names():
        raise ProtocolRefError(f"unknown protocol {name!r}; known: {', '.join(preset_names())}, or a FILE.yaml")
    ref = ProtocolRef(label=text.strip(), name=name)
    if call.at == "uab":
        ref.uab_budget, ref.uab_cap = uab_terms(call, text)
    elif call.at == "auto":
        by = params.pop("by", "calls")
        if by not in ("calls", "tokens"):
            raise ProtocolRefError(f"{text!r}: by= must be calls or tokens")
        ref.auto = by
        ref.reference = params.pop("ref", None)
    elif call.at is not None:
        ref.k = vote_k(call, text)
    ref.params = params
    return ref


#: The parameters of a vote that change what one sample asks (and so its tokens): a token-matched
#: vote takes its tokens per sample from the run's `single` asked the same way.
_STYLE = ("wording", "confidence")


def _answer_style(ref: ProtocolRef) -> dict[str, Any]:
    return {k: v for k, v in ref.params.items() if k in _STYLE}


def sample_reference(ref: ProtocolRef, labels: Sequence[str]) -> str | None:
    """The run's `single` whose tokens are one sample's for a token-matched vote: plain ``single``,
    or ``single(wording=du,...)`` for a vote asked in that wording (None: the run has none)."""
    style = _answer_style(ref)
    for label in labels:
        if label == "single" and not style:
            return label
        if label.startswith("single("):
            other = parse_ref(label)
            if other.name == "single" and other.params == style:
                return label
    return None


def _meaning(ref: ProtocolRef) -> dict[str, Any]:
    """What a reference asks, whatever its spelling (spaces, the order of its parameters, ``vote@3`` or
    ``vote(k=3)``): the spec it builds, and the run-level rule it follows (a vote at a debate's budget,
    and which debate's; UAB's allocation)."""
    spec = base_spec(ref, k=1 if (ref.auto or ref.uab_budget) else None)
    return {
        "spec": spec.model_dump(exclude={"name"}),
        **ref.model_dump(include={"auto", "reference", "uab_budget", "uab_cap"}),
        # a protocol that names its own max_tokens keeps it under the run's --max-tokens (turn_tokens)
        "own_max_tokens": "max_tokens" in ref.params,
    }


def parse_protocols(text: str | list[str]) -> list[ProtocolRef]:
    entries = split_protocols(text) if isinstance(text, str) else [t for p in text for t in split_protocols(p)]
    if not entries:
        raise ProtocolRefError("--protocols is empty: name at least one, e.g. single,vote@5,society-of-minds")
    refs = [parse_ref(e) for e in entries]
    labels = [r.label for r in refs]
    if len(set(labels)) != len(labels):
        raise ProtocolRefError(f"a protocol is listed twice in {', '.join(labels)}")
    debates = [r for r in refs if not r.is_baseline]
    for r in refs:
        if r.auto is None:
            continue
        if r.reference is None:
            if not debates:
                raise ProtocolRefError(f"{r.label} matches a debate's budget, but no debate protocol is listed")
            r.reference = debates[0].label
        else:
            # ref= names one of the run's protocols, as written there or another way (spaces, order)
            named = next((o.label for o in refs if o.label == r.reference), None)
            if named is None:
                try:
                    meant: dict[str, Any] | None = _meaning(parse_ref(r.reference))
                except ProtocolRefError:
                    meant = None
                named = next((o.label for o in refs if meant is not None and _meaning(o) == meant), None)
            if named is None or named == r.label:
                others = ", ".join(o.label for o in refs if o is not r)
                raise ProtocolRefError(
                    f"{r.label}: ref={r.reference} is not another protocol of this run; its others: {others}"
                )
            r.reference = named
        if r.auto == "tokens" and sample_reference(r, labels) is None:
            style = ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in _answer_style(r).items())
            wanted = f"single({style})" if style else "single"
            raise ProtocolRefError(f"{r.label}: matching tokens needs `{wanted}` in the run (tokens per sample)")
    # Built once here so that a bad parameter fails before any call is made; the same protocol written
    # two ways (spaces, the order of its parameters, its ref=) would run, and count in the
    # comparisons' family, twice.
    meanings = [_meaning(r) for r in refs]
    for i, r in enumerate(refs):
        same = next((refs[j] for j in range(i) if meanings[j] == meanings[i]), None)
        if same is not None:
            raise ProtocolRefError(f"{r.label!r} is the same protocol as {same.label!r}: list it once")
    return refs


def base_spec(ref: ProtocolRef, *, k: int | None = None) -> ProtocolSpec:
    """The protocol's spec before it is fitted to an item (``k`` resolves ``vote@auto``)."""
    try:
        if ref.is_file:
            spec = load_protocol(Path(ref.name))
            return spec.model_copy(update=ref.params) if ref.params else spec
        params = dict(ref.params)
        if ref.name == "vote":
            params["k"] = k if (ref.auto or ref.uab_budget) else (ref.k or params.get("k", 5))
        return get_preset(ref.name, **params)
    except TypeError as exc:
        raise ProtocolRefError(f"protocol {ref.label}: {exc}") from None


def fit_to_item(spec: ProtocolSpec, item: EvalItem, *, max_tokens: int | None, timeout_s: float | None) -> ProtocolSpec:
    """The spec with the item's typed answer schema and the run's budget."""
    verdict, direct = verdict_schema_name(item), direct_schema_name(item)

    def swap(name: str | None) -> str | None:
        # An answer turn keeps its form (its reasoning required or not, its room, its confidence:
        # the spec's, not the run's); only its answer becomes the item's typed one.
        if name in ANSWER_FORMS:
            return answer_schema_name(item, ANSWER_FORMS[name])
        return {"verdict": verdict, "direct": direct}.get(name or "", name)

    turn = spec.turn.model_copy(update={"schema_name": swap(spec.turn.schema_name)})
    participants = [
        p.model_copy(update={"turn": p.turn.model_copy(update={"schema_name": swap(p.turn.schema_name)})})
        if p.turn is not None
        else p
        for p in spec.participants
    ]
    decision = spec.decision
    if isinstance(decision, JudgeDecision):
        decision = decision.model_copy(update={"schema_name": swap(decision.schema_name)})
    budget: Budget = spec.budget.model_copy(
        update={
            **({"max_tokens_per_turn": max_tokens} if max_tokens else {}),
            **({"timeout_s": timeout_s} if timeout_s else {}),
        }
    )
    # Every typed turn records the probability of its answer (free: the reply's own logprobs), so
    # that confidence-weighted decisions can be derived from any run; the same request for all
    # protocols keeps the run's request cache exact across them.
    probe = spec.probe or Probe()
    return spec.model_copy(
        update={"turn": turn, "participants": participants, "decision": decision, "budget": budget, "probe": probe}
    )


def rotate_seeds(spec: ProtocolSpec, offset: int) -> ProtocolSpec:
    """The spec with every participant's seed shifted by ``offset`` (``--seed-stride`` times the
    item's position in the run); a participant without a seed keeps none. Applied to every protocol
    of an item alike, so that agent s of a debate and sample s of a vote still make one request.
    ``offset`` 0 returns the spec itself: the requests are the very ones a run without a stride makes."""
    if not offset:
        return spec
    participants = [
        p.model_copy(update={"seed": p.seed + offset}) if p.seed is not None else p for p in spec.participants
    ]
    return spec.model_copy(update={"participants": participants})
