"""The data of contradiction arbitration (seed 003). Everything here crosses a boundary (a reports
file, the CLI's JSON, a LangGraph state), so it is pydantic and round-trips through JSON.

Parties of a contradiction are numbered 1..N in the order they are listed; the verdict's
``agentK_correct`` / ``use_agentK`` refer to those numbers. With two parties the verdict the model
is asked for is exactly the seed's schema; see :class:`ArbitrationVerdict` for N > 2.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from moot.core.schemas import Confidence
from moot.core.types import DebateResult
from moot.models.base import Usage
from moot.secrets import redact_json

ARBITRATION_SCHEMA: Literal["moot.arbitration/1"] = "moot.arbitration/1"

ContradictionKind = Literal["value_mismatch", "opposite_interpretation", "confidence_gap", "source_conflict"]
Severity = Literal["high", "medium", "low"]
SEVERITY_ORDER: dict[str, int] = {"high": 0, "medium": 1, "low": 2}

# ------------------------------------------------------------------------------------ reports


class Citation(BaseModel):
    """Where a finding comes from. A bare string is read as the source."""

    model_config = ConfigDict(extra="forbid")

    source: str = Field(min_length=1, description="the publisher or dataset, e.g. GCC-STAT")
    period: str | None = Field(default=None, description="the period the data covers, e.g. Q1-2024")
    url: str | None = None
    #: The verbatim extraction, when the agent kept it ("[Per extraction: '0.10%' from ...]").
    quote: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, data: Any) -> Any:
        return {"source": data} if isinstance(data, str) else data

    def label(self) -> str:
        return f"{self.source}, {self.period}" if self.period else self.source


class ArbitrationNote(BaseModel):
    """What arbitration did to a finding (set only in ``adjusted_reports``)."""

    model_config = ConfigDict(extra="forbid")  # read back with its finding: an input like the rest

    contradiction_id: str
    action: Literal["replaced", "confirmed", "kept_both", "flagged"]
    note: str
    #: The finding as the agent reported it, when arbitration replaced it.
    original_value: float | None = None
    original_citation: Citation | None = None
    original_interpretation: str | None = None
    original_confidence: float | None = None


class Finding(BaseModel):
    """One metric or claim an agent reports."""

    model_config = ConfigDict(extra="forbid")

    metric: str = Field(min_length=1, description="metric or claim name; matched after normalisation")
    value: float | None = Field(default=None, allow_inf_nan=False, description="None for a claim without a number")
    unit: str = ""
    interpretation: str = Field(default="", description="the agent's reading: improving, declining, ...")
    citation: Citation | None = None
    confidence: float = Field(ge=0, le=1, description="the agent's confidence in the finding, 0 to 1")
    arbitration: ArbitrationNote | None = None


class AgentReport(BaseModel):
    """An agent's findings. A report-level ``confidence`` (seed 003's reports carry one:
    "Report 1 (LabourEconomist): ... Confidence: 0.90") is the default confidence of its findings:
    a finding that states its own keeps it."""

    model_config = ConfigDict(extra="forbid")

    agent: str = Field(min_length=1)
    confidence: float | None = Field(
        default=None, ge=0, le=1, description="the report's confidence: the default of its findings' confidence"
    )
    findings: list[Finding] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _default_confidence(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("confidence") is None or not isinstance(data.get("findings"), list):
            return data
        default = data["confidence"]
        findings = [
            {**f, "confidence": default} if isinstance(f, dict) and f.get("confidence") is None else f
            for f in data["findings"]
        ]
        return {**data, "findings": findings}


# ----------------------------------------------------------------------------- contradictions


class Party(BaseModel):
    """One side of a contradiction: a finding and where it sits in the reports."""

    agent: str
    report_index: int = Field(ge=0)
    finding_index: int = Field(ge=0)
    finding: Finding


class Contradiction(BaseModel):
    """Findings about the same (normalised) metric that disagree. One per metric: a three-way
    conflict is one contradiction with three parties.

    ``kind`` is the strongest of ``signals`` (every rule that fired); the severity rules are in
    :func:`moot.apps.arbitration.detect.detect_contradictions`.
    """

    id: str
    kind: ContradictionKind
    signals: list[ContradictionKind]
    metric: str
    parties: list[Party] = Field(min_length=2)
    severity: Severity
    #: Largest pairwise ``|a - b| / max(|a|, |b|)`` of the parties' values (None: fewer than two values).
    relative_difference: float | None = None
    #: Highest minus lowest confidence of the parties.
    confidence_gap: float = 0.0
    details: str = ""

    @property
    def agents(self) -> list[str]:
        return [p.agent for p in self.parties]


# ---------------------------------------------------------------------------------- verdicts

_RESOLUTION = re.compile(r"^(?:agent([1-9][0-9]*)_correct|both_valid|neither_valid)$")
_ACTION = re.compile(r"^(?:use_agent([1-9][0-9]*)|use_both|flag_for_review)$")


def resolutions(parties: int) -> list[str]:
    return [*(f"agent{k}_correct" for k in range(1, parties + 1)), "both_valid", "neither_valid"]


def actions(parties: int) -> list[str]:
    return [*(f"use_agent{k}" for k in range(1, parties + 1)), "use_both", "flag_for_review"]


def _enums(schema: dict[str, Any], cls: type[Any]) -> None:
    """Schema sent to the model: exactly the values that exist for this many parties."""
    parties = getattr(cls, "parties", None)
    if parties is None:
        return
    props = schema["properties"]
    for name, values in (("resolution", resolutions(parties)), ("action", actions(parties))):
        props[name].pop("pattern", None)
        props[name]["enum"] = values


class ArbitrationVerdict(BaseModel):
    """The seed's verdict on one contradiction.

    - ``resolution``: ``agent1_correct`` | ``agent2_correct`` | ``both_valid`` | ``neither_valid``;
    - ``action``: ``use_agent1`` | ``use_agent2`` | ``use_both`` | ``flag_for_review``;
    - ``explanation``, ``recommended_value``, ``recommended_citation``, ``confidence`` (0..1).

    Multi-way: with N > 2 parties, ``agentK_correct`` / ``use_agentK`` go up to K = N, and
    ``both_valid`` / ``use_both`` mean every party's finding is valid. :func:`verdict_schema`
    gives the class for N parties, whose JSON schema lists exactly those values (for N = 2: the
    seed's); this base class accepts any N, which is what stored results need. :attr:`winner` is
    the correct party's number, when there is one.

    The verdict must be consistent: ``agentK_correct`` goes with ``use_agentK``, ``both_valid``
    with ``use_both``, ``neither_valid`` with ``flag_for_review``, and any resolution may be sent
    for review. An inconsistent verdict fails validation, so the model gets one repair request.
    """

    model_config = ConfigDict(title="ArbitrationVerdict", json_schema_extra=_enums)

    #: The number of parties the verdict is about (None: any, the stored form).
    parties: ClassVar[int | None] = None

    resolution: str = Field(
        pattern=_RESOLUTION.pattern, description="agentK_correct (K: the agent's number), both_valid or neither_valid"
    )
    explanation: str = Field(max_length=2000, description="why: sources, periods, definitions, confidence")
    recommended_value: float | None = Field(default=None, description="the value to use, or null")
    recommended_citation: str | None = Field(default=None, max_length=400, description="its citation, or null")
    #: Read leniently, as every stated confidence is (a percentage as a fraction, a negative as 0:
    #: llama.cpp's grammar cannot bound a number; a new-user trial lost 2 of 4 verdicts to one).
    confidence: Confidence = Field(ge=0, le=1, description="confidence in this verdict, 0 to 1")
    action: str = Field(pattern=_ACTION.pattern, description="use_agentK, use_both or flag_for_review")

    @property
    def winner(self) -> int | None:
        """The number (1-based) of the party whose finding is correct, if the verdict names one."""
        match = _RESOLUTION.match(self.resolution)
        return int(match.group(1)) if match and match.group(1) else None

    @model_validator(mode="after")
    def _consistent(self) -> ArbitrationVerdict:
        n = type(self).parties
        if n is not None and (self.resolution not in resolutions(n) or self.action not in actions(n)):
            raise ValueError(f"there are {n} agents: resolution and action must name agent 1 to {n}")
        if self.action == "flag_for_review":
            return self
        expected = {"both_valid": "use_both", "neither_valid": "flag_for_review"}.get(
            self.resolution, f"use_agent{self.winner}"
        )
        if self.action != expected:
            raise ValueError(f"resolution {self.resolution!r} goes with action {expected!r} or 'flag_for_review'")
        return self


@cache
def verdict_schema(parties: int) -> type[ArbitrationVerdict]:
    """The verdict class for a contradiction with ``parties`` parties (cached: one class per N)."""
    if parties < 2:
        raise ValueError("a contradiction has at least two parties")

    class Verdict(ArbitrationVerdict):
        model_config = ConfigDict(title="ArbitrationVerdict")

    Verdict.parties = parties
    Verdict.__name__ = Verdict.__qualname__ = f"ArbitrationVerdict{parties}"
    return Verdict


class VerdictSample(BaseModel):
    """One arbitrator's answer on one contradiction (a call, or a whole debate), or why there is none."""

    verdict: ArbitrationVerdict | None = None
    error: str | None = None
    #: The unparsable reply, when the model's answer could not be read as a verdict.
    raw: str | None = None
    calls: int = 0
    usage: Usage = Field(default_factory=Usage)
    latency_ms: float = 0.0
    #: The debate's transcript, when a debate preset arbitrated.
    transcript: DebateResult | None = None


class ArbitrationOutcome(BaseModel):
    """The decision on one contradiction: resolved (with the verdict applied) or flagged for review."""

    contradiction_id: str
    status: Literal["resolved", "flagged"]
    #: The verdict acted on (the heaviest of the winning group when several arbitrators voted).
    verdict: ArbitrationVerdict | None = None
    #: The winning party's agent, when the verdict names one.
    winner: str | None = None
    #: Confidence-weighted support: the winning verdicts' confidence over every valid verdict
    #: (with one arbitrator, its verdict's confidence).
    confidence: float = 0.0
    #: Why it was flagged (low confidence, split decision, the arbitrator's own flag, a failure).
    flag_reason: str | None = None
    samples: list[VerdictSample] = Field(default_factory=list)

    @property
    def calls(self) -> int:
        return sum(s.calls for s in self.samples)


# ------------------------------------------------------------------------------------- config

DEFAULT_VOCABULARY: list[tuple[str, str]] = [
    ("improving", "declining"),
    ("increase", "decrease"),
    ("up", "down"),
    ("growth", "decline"),
    ("positive", "negative"),
    ("rising", "falling"),
    ("expansion", "contraction"),
    ("개선", "악화"),
    ("증가", "감소"),
    ("상승", "하락"),
]


class ArbitrationConfig(BaseModel):
    """How contradictions are found, arbitrated and turned into a consensus."""

    model_config = ConfigDict(extra="forbid")

    # detection
    tolerance: float = Field(default=0.05, ge=0, description="values further apart than this (relative) conflict")
    high_difference: float = Field(default=0.20, gt=0, description="relative difference from which severity is high")
    confidence_gap: float = Field(default=0.3, gt=0, le=1, description="a confidence gap from which a claim conflicts")
    source_only_conflicts: bool = Field(
        default=False,
        description="also report values within tolerance (not identical) from different sources (low severity)",
    )
    vocabulary: list[tuple[str, str]] = Field(default_factory=lambda: list(DEFAULT_VOCABULARY))
    metric_aliases: dict[str, str] = Field(default_factory=dict, description="metric name -> canonical name")

    # arbitration inputs
    source_authority: list[str] = Field(default_factory=list, description="most authoritative source first")
    prefer_recent: bool = Field(default=True, description="tell the arbitrator more recent data wins ties")

    # arbitration
    model: str | None = Field(default=None, description="model spec (default: $MOOT_MODEL or embedded)")
    protocol: str | None = Field(default=None, description="a debate preset or protocol file instead of one call")
    rounds: int | None = Field(default=None, ge=1, description="debate rounds (default: the protocol's)")
    arbitrators: int = Field(default=1, ge=1, description="independent verdicts per contradiction, weighed together")
    temperature: float | None = Field(default=None, ge=0)
    max_tokens: int = Field(default=600, ge=1)
    concurrency: int = Field(default=10, ge=1, description="contradictions arbitrated at once")
    max_calls: int | None = Field(default=None, ge=1)
    timeout_s: float | None = Field(default=None, gt=0)

    # consensus
    min_confidence: float = Field(default=0.6, ge=0, le=1, description="below this a verdict is flagged")
    majority: float = Field(default=0.5, ge=0, lt=1, description="share of weight the winning verdict must exceed")

    @field_validator("vocabulary")
    @classmethod
    def _pairs(cls, v: list[tuple[str, str]]) -> list[tuple[str, str]]:
        for a, b in v:
            if not a.strip() or not b.strip():
                raise ValueError("vocabulary terms must not be empty")
        return v

    @model_validator(mode="after")
    def _thresholds(self) -> ArbitrationConfig:
        if self.high_difference <= self.tolerance:
            raise ValueError(f"high_difference ({self.high_difference}) must exceed tolerance ({self.tolerance})")
        return self


# ------------------------------------------------------------------------------------- result


class ArbitrationResult(BaseModel):
    """Contradictions, verdicts and the consensus: the seed's ``debate_results`` and more."""

    schema_version: Literal["moot.arbitration/1"] = ARBITRATION_SCHEMA
    #: ``skipped``: no contradictions (no model called); ``complete``: every contradiction got a
    #: verdict; ``partial``: some got none (a failure, the timeout or the call budget).
    status: Literal["skipped", "complete", "partial"]
    contradictions: list[Contradiction] = Field(default_factory=list)
    verdicts: list[ArbitrationOutcome] = Field(default_factory=list)
    resolved_count: int = 0
    flagged_count: int = 0
    consensus_narrative: str = ""
    adjusted_reports: list[AgentReport] = Field(default_factory=list)
    calls: int = 0
    usage: Usage = Field(default_factory=Usage)
    latency_ms: float = 0.0
    warnings: list[str] = Field(default_factory=list)

    @property
    def tokens(self) -> int:
        return self.usage.total_tokens

    def outcome(self, contradiction_id: str) -> ArbitrationOutcome:
        for o in self.verdicts:
            if o.contradiction_id == contradiction_id:
                return o
        raise KeyError(contradiction_id)

    def debate_results(self) -> dict[str, Any]:
        """The seed's ``state["debate_results"]`` dict."""
        out: dict[str, Any] = {
            "contradictions_found": len(self.contradictions),
            "status": self.status,
            "latency_ms": self.latency_ms,
        }
        if self.status != "skipped":
            out |= {
                "resolved": self.resolved_count,
                "flagged_for_review": self.flagged_count,
                "consensus_narrative": self.consensus_narrative,
            }
        return out

    def to_json(self, indent: int | None = 2) -> str:
        """The whole result as JSON, every secret redacted (``moot.secrets.redact_json``)."""
        return redact_json(self.model_dump_json(indent=indent), indent=indent)


#: What the public functions take as reports: the models, or their JSON form (plain dicts).
ReportsInput = Sequence[AgentReport | Mapping[str, Any]]
#: What they take as a config: the model, its JSON form, or None (the defaults).
ConfigInput = ArbitrationConfig | Mapping[str, Any] | None


def as_reports(reports: ReportsInput) -> list[AgentReport]:
    """Reports as :class:`AgentReport` (dicts are validated), so every public function takes the
    same input forms."""
    return [r if isinstance(r, AgentReport) else AgentReport.model_validate(r) for r in reports]


def as_config(config: ConfigInput) -> ArbitrationConfig:
    if config is None:
        return ArbitrationConfig()
    return config if isinstance(config, ArbitrationConfig) else ArbitrationConfig.model_validate(config)
