"""The data of the ABSA debate pipeline (seeds 001 and 002): Stage 1 outputs, Stage 2 reviews, both
debate variants, the moderator, the override and the correction log.

Everything a model or a file gives us is validated with ``extra="forbid"`` (an unknown key is an
error that names it, and a model gets one repair request); what the deterministic code builds is
plain pydantic. Spans are character offsets into the sentence, ``(start, end)`` with ``end``
exclusive (``sentence[start:end]``), ``0 <= start <= end``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from moot.files import InputFileError, read_json

Polarity = Literal["positive", "negative", "neutral"]
SentenceLabel = Literal["positive", "negative", "neutral", "mixed"]

POLARITIES: tuple[Polarity, ...] = ("positive", "negative", "neutral")
SENTENCE_LABELS: tuple[SentenceLabel, ...] = ("positive", "negative", "neutral", "mixed")

DATA_DIR = Path(__file__).resolve().parent.parent.parent / "data" / "absa"
OVERRIDE_THRESHOLDS_PATH = DATA_DIR / "debate_override_thresholds.json"

_FORBID = ConfigDict(extra="forbid", defer_build=True)


def _check_span(span: tuple[int, int]) -> tuple[int, int]:
    if not 0 <= span[0] <= span[1]:
        raise ValueError(f"span {list(span)} must be [start, end] with 0 <= start <= end (end exclusive)")
    return span


#: ``(start, end)`` character offsets, end exclusive, ``0 <= start <= end``.
Span = Annotated[tuple[int, int], AfterValidator(_check_span)]


def _confidence(description: str = "confidence, 0 to 1") -> Any:
    return Field(ge=0, le=1, description=description)


# ---------------------------------------------------------------------------------- Stage 1


class AspectTerm(BaseModel):
    """One aspect term found by ATE."""

    model_config = _FORBID

    term: str = Field(min_length=1, description="the aspect term as written in the sentence")
    span: Span | None = Field(default=None, description="[start, end] character offsets, end exclusive")
    confidence: float = _confidence()


class ATEOutput(BaseModel):
    """Stage 1 aspect term extraction: the aspects, a sentence label and its confidence."""

    model_config = _FORBID

    aspects: list[AspectTerm] = Field(default_factory=list)
    sentence_label: SentenceLabel
    confidence: float = _confidence()

    def signal(self) -> StageSignal:
        """What the moderator reads of it: label and confidence (no span)."""
        return StageSignal(label=self.sentence_label, confidence=self.confidence)


class AspectSentiment(BaseModel):
    """The polarity of one aspect term (ATSA)."""

    model_config = _FORBID

    aspect_term: str = Field(min_length=1)
    span: Span | None = Field(default=None, description="[start, end] of the aspect term, end exclusive")
    polarity: Polarity
    confidence: float = _confidence()


def strongest_span(sentiments: list[AspectSentiment]) -> Span | None:
    """The span of the most confident aspect sentiment that has a span (the first one on a tie);
    None when no sentiment has a span. Sentiments without a span are skipped rather than ending
    the search: a weaker located sentiment says more about *where* the opinion is than none."""
    best: AspectSentiment | None = None
    for s in sentiments:
        if s.span is not None and (best is None or s.confidence > best.confidence):
            best = s
    return best.span if best is not None else None


class ATSAOutput(BaseModel):
    """Stage 1 aspect term sentiment analysis."""

    model_config = _FORBID

    aspect_sentiments: list[AspectSentiment] = Field(default_factory=list)
    sentence_label: SentenceLabel
    confidence: float = _confidence()

    @property
    def candidate_span(self) -> Span | None:
        """The moderator's ATSA span: see :func:`strongest_span`."""
        return strongest_span(self.aspect_sentiments)

    def signal(self) -> StageSignal:
        """The moderator's ``stage1_atsa``: sentence label, confidence and :attr:`candidate_span`."""
        return StageSignal(label=self.sentence_label, confidence=self.confidence, span=self.candidate_span)


IssueType = Literal["negation", "irony", "contrast", "sarcasm", "comparison", "other"]
IssueSeverity = Literal["low", "medium", "high"]


class ValidatorIssue(BaseModel):
    """A risk the validator sees in the sentence (negation, irony, contrast, ...)."""

    model_config = _FORBID

    type: IssueType
    severity: IssueSeverity
    description: str = ""
    aspect_term: str | None = None


class CorrectionProposal(BaseModel):
    """A correction the validator proposes, applied first in Stage 2.

    ``FLIP_POLARITY``: ``value`` is the new polarity (absent: positive and negative swap);
    ``DROP_ASPECT``: no value; ``REVISE_SPAN``: ``value`` is the revised aspect term text.
    """

    model_config = _FORBID

    op: Literal["FLIP_POLARITY", "DROP_ASPECT", "REVISE_SPAN"]
    aspect_term: str = Field(min_length=1)
    value: str | None = None
    reason: str = ""


class ValidatorOutput(BaseModel):
    """Stage 1 validator: issues, an optional suggested sentence label, correction proposals."""

    model_config = _FORBID

    issues: list[ValidatorIssue] = Field(default_factory=list)
    suggested_label: SentenceLabel | None = None
    confidence: float = _confidence()
    correction_proposals: list[CorrectionProposal] = Field(default_factory=list)


# ---------------------------------------------------------------------------------- Stage 2


class AspectReviewAction(BaseModel):
    """Stage 2 ATE review of one aspect: ``revise_span`` (``new_term`` and/or ``span``), ``drop``,
    ``add`` (``term``, optional ``span``)."""

    model_config = _FORBID

    action: Literal["revise_span", "drop", "add"]
    term: str = Field(min_length=1)
    new_term: str | None = None
    span: Span | None = None


class ATEReview(BaseModel):
    model_config = _FORBID

    aspect_review: list[AspectReviewAction] = Field(default_factory=list)
    sentence_label: SentenceLabel
    confidence: float = _confidence()

    def signal(self) -> StageSignal:
        return StageSignal(label=self.sentence_label, confidence=self.confidence)


class SentimentReviewAction(BaseModel):
    """Stage 2 ATSA review of one aspect: ``maintain``, ``flip_polarity`` (``polarity``, absent:
    positive and negative swap), ``drop``, ``add`` (``polarity`` required)."""

    model_config = _FORBID

    action: Literal["maintain", "flip_polarity", "drop", "add"]
    aspect_term: str = Field(min_length=1)
    polarity: Polarity | None = None
    confidence: float | None = Field(default=None, ge=0, le=1)


class ATSAReview(BaseModel):
    model_config = _FORBID

    sentiment_review: list[SentimentReviewAction] = Field(default_factory=list)
    sentence_label: SentenceLabel
    confidence: float = _confidence()


# ------------------------------------------------------------------- debate, panel variant (001)


class PanelTurn(BaseModel):
    """One speaker's turn in the persona panel (seed 001's ``DebateTurn``), plus optional
    ``aspect_refs``: the Stage 1 aspect terms the speaker says it is talking about."""

    model_config = _FORBID

    speaker: str = Field(min_length=1)
    stance: str = ""
    planning: str = ""
    reflection: str = ""
    message: str
    key_points: list[str] = Field(default_factory=list)
    aspect_refs: list[str] = Field(default_factory=list)


class PanelJudgeSummary(BaseModel):
    """The panel judge's summary (seed 001's ``DebateSummary``)."""

    model_config = _FORBID

    winner: str | None = None
    consensus: str = ""
    key_agreements: list[str] = Field(default_factory=list)
    key_disagreements: list[str] = Field(default_factory=list)
    rationale: str = ""


ProvenanceHint = Literal["direct", "fallback", "none"]


class RebuttalPoint(BaseModel):
    """A debate turn as Stage 2 sees it: which aspects it is about and which way it pushes."""

    speaker: str
    stance: str
    key_points: list[str] = Field(default_factory=list)
    message: str = ""
    aspect_refs: list[str] = Field(default_factory=list)
    weight: float
    polarity_hint: Polarity
    provenance_hint: ProvenanceHint


class AspectHint(BaseModel):
    """One push on one aspect: who, with what stance and weight, towards which polarity."""

    speaker: str
    stance: str
    weight: float
    polarity_hint: Polarity


class MappingStats(BaseModel):
    """Turns (hint sources, for the patch variant) by provenance."""

    turns: int = 0
    direct: int = 0
    fallback: int = 0
    none: int = 0


FAIL_REASONS: tuple[str, ...] = ("no_aspects", "no_match", "neutral_stance", "fallback_used")


def empty_fail_reasons() -> dict[str, int]:
    return dict.fromkeys(FAIL_REASONS, 0)


class DebateReviewContext(BaseModel):
    """Seed 001 §4: what the panel debate gives Stage 2 (built by
    :func:`moot.apps.absa.mapping.build_review_context`)."""

    summary: dict[str, Any] = Field(default_factory=dict)
    rebuttal_points: list[RebuttalPoint] = Field(default_factory=list)
    aspect_terms: list[str] = Field(default_factory=list)
    synonym_hints: dict[str, list[str]] = Field(default_factory=dict)
    aspect_hints: dict[str, list[AspectHint]] = Field(default_factory=dict)
    mapping_stats: MappingStats = Field(default_factory=MappingStats)
    mapping_fail_reasons: dict[str, int] = Field(default_factory=empty_fail_reasons)
    review_guidance: str = ""
    fallback_mapping_policy: str = ""


# ------------------------------------------------------------------- debate, patch variant (002)

EditOp = Literal["set_polarity", "set_aspect_ref", "merge_tuples", "drop_tuple", "confirm_tuple"]


class ProposedEdit(BaseModel):
    """One edit a patch-debate speaker proposes. ``target`` is an ``aspect_ref``: a Stage 1 aspect
    term. ``value``: the new polarity (``set_polarity``), the new aspect ref (``set_aspect_ref``),
    the other tuple's aspect ref (``merge_tuples``); unused by ``drop_tuple`` / ``confirm_tuple``.
    The seed's optional ``polarity`` and ``aspect_term`` stand in for a missing ``value`` of
    ``set_polarity`` and ``set_aspect_ref`` respectively (``value`` wins when both are given)."""

    model_config = _FORBID

    op: EditOp
    target: str = Field(min_length=1, description="aspect_ref: a Stage 1 aspect term")
    value: str | None = None
    evidence: str | None = Field(default=None, description="an exact substring of the sentence")
    confidence: float | None = Field(default=None, ge=0, le=1)
    polarity: Polarity | None = None
    aspect_term: str | None = None


class PatchTurn(BaseModel):
    """A patch-debate turn: only proposed edits."""

    model_config = _FORBID

    agent: str = Field(min_length=1)
    proposed_edits: list[ProposedEdit] = Field(default_factory=list)


class AspectTuple(BaseModel):
    """An aspect-polarity tuple (the patch debate's unit; also the gold form of a dataset)."""

    model_config = _FORBID

    aspect_term: str = Field(min_length=1)
    polarity: Polarity
    span: Span | None = None
    confidence: float | None = Field(default=None, ge=0, le=1)

    @classmethod
    def from_sentiment(cls, s: AspectSentiment) -> AspectTuple:
        return cls(aspect_term=s.aspect_term, polarity=s.polarity, span=s.span, confidence=s.confidence)


class PatchJudgeSummary(BaseModel):
    """The Consistency Judge's output (seed 002 §3.2). Each ``sentence_evidence_spans`` entry must
    be an exact substring of the sentence: pydantic can only check there is at least one, so
    :func:`moot.apps.absa.patch.check_judge_summary` checks the rest against the sentence."""

    model_config = _FORBID

    final_patch: list[ProposedEdit] = Field(default_factory=list)
    final_tuples: list[AspectTuple] = Field(default_factory=list)
    unresolved_conflicts: list[str] = Field(default_factory=list)
    sentence_polarity: SentenceLabel
    sentence_evidence_spans: list[str] = Field(min_length=1)
    aspect_evidence: dict[str, str] | None = None
    rationale: str | None = None


class PatchHints(BaseModel):
    """The patch variant's edits and judge tuples as aspect hints (see
    :func:`moot.apps.absa.mapping.patch_hints`): same shape as the panel's, so the override reads
    both."""

    aspect_hints: dict[str, list[AspectHint]] = Field(default_factory=dict)
    mapping_stats: MappingStats = Field(default_factory=MappingStats)
    mapping_fail_reasons: dict[str, int] = Field(default_factory=empty_fail_reasons)


# ------------------------------------------------------------------------------------ moderator


class StageSignal(BaseModel):
    """A stage's aggregate as the moderator reads it."""

    model_config = _FORBID

    label: SentenceLabel
    confidence: float = _confidence()
    span: Span | None = None


class ModeratorInput(BaseModel):
    """Seed 001 §6.1. ``debate_summary`` is either judge summary as a dict (``model_dump()``)."""

    model_config = _FORBID

    stage1_ate: StageSignal
    stage1_atsa: StageSignal
    stage2_ate: StageSignal | None = None
    stage2_atsa: StageSignal | None = None
    validator: ValidatorOutput | None = None
    final_aspect_sentiments: list[AspectSentiment] = Field(default_factory=list)
    debate_summary: dict[str, Any] | None = None


class ArbiterFlags(BaseModel):
    stage2_rejected_due_to_confidence: bool = False
    validator_override_applied: bool = False
    confidence_margin_used: bool = False


class ModeratorOutput(BaseModel):
    final_label: SentenceLabel
    confidence: float
    #: The rationale strings of the rules that changed or confirmed the decision, in order, joined by a space.
    rationale: str
    selected_stage: Literal["stage1", "stage2"]
    applied_rules: list[str] = Field(default_factory=list)
    arbiter_flags: ArbiterFlags = Field(default_factory=ArbiterFlags)
    final_aspects: list[AspectSentiment] = Field(default_factory=list)


# ------------------------------------------------------------------------------------- override


class OverrideThresholds(BaseModel):
    """Seed 001 §5.1: the debate override's thresholds."""

    model_config = _FORBID

    min_total: float = Field(default=1.6, ge=0, description="minimum pos + neg hint weight")
    min_margin: float = Field(default=0.8, ge=0, description="minimum |pos - neg|")
    min_target_conf: float = Field(default=0.7, ge=0, le=1, description="confidence an overridden aspect gets")

    @classmethod
    def load(cls, path: str | Path | None = None) -> OverrideThresholds:
        """From a JSON object (keys starting with ``_`` are comments); None: the shipped file."""
        data = _json_object(read_json(path or OVERRIDE_THRESHOLDS_PATH, "override thresholds file"), path)
        return cls.model_validate({k: v for k, v in data.items() if not k.startswith("_")})


def _json_object(data: Any, path: str | Path | None) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise InputFileError(f"thresholds file {str(path)!r} must hold a JSON object of thresholds")
    return data


OverrideStatus = Literal["applied", "skipped_low_signal", "skipped_conflict", "skipped_already_confident"]


class OverrideOutcome(BaseModel):
    """What the override did to one aspect, and why."""

    aspect_term: str
    status: OverrideStatus
    pos_score: float
    neg_score: float
    #: The side the debate pushes towards (None when the signal is too weak or split).
    debate_polarity: Polarity | None = None
    before: Polarity | None = None
    after: Polarity | None = None
    confidence_before: float | None = None
    confidence_after: float | None = None


class OverrideStats(BaseModel):
    applied: int = 0
    skipped_low_signal: int = 0
    skipped_conflict: int = 0
    skipped_already_confident: int = 0

    def __add__(self, other: OverrideStats) -> OverrideStats:
        return OverrideStats(
            applied=self.applied + other.applied,
            skipped_low_signal=self.skipped_low_signal + other.skipped_low_signal,
            skipped_conflict=self.skipped_conflict + other.skipped_conflict,
            skipped_already_confident=self.skipped_already_confident + other.skipped_already_confident,
        )

    @property
    def total(self) -> int:
        return self.applied + self.skipped_low_signal + self.skipped_conflict + self.skipped_already_confident


class CorrectionLogEntry(BaseModel):
    """One change made to the aspects: ``kind`` is ``DEBATE_OVERRIDE``, a validator op
    (``FLIP_POLARITY``, ``DROP_ASPECT``, ``REVISE_SPAN``), a Stage 2 review action
    (``ATE_REVISE_SPAN``, ``ATE_DROP``, ``ATE_ADD``, ``ATSA_FLIP_POLARITY``, ``ATSA_DROP``,
    ``ATSA_ADD``, ``ATSA_MAINTAIN``) or a patch op upper-cased (``SET_POLARITY``, ...)."""

    kind: str
    aspect_term: str
    before: str | None = None
    after: str | None = None
    reason: str = ""


class OverrideResult(BaseModel):
    sentiments: list[AspectSentiment]
    outcomes: list[OverrideOutcome] = Field(default_factory=list)
    stats: OverrideStats = Field(default_factory=OverrideStats)
    log: list[CorrectionLogEntry] = Field(default_factory=list)


class Stage2Result(BaseModel):
    """The aspects after the Stage 2 reviews (:func:`moot.apps.absa.patch.apply_stage2`)."""

    aspects: list[AspectTerm]
    sentiments: list[AspectSentiment]
    log: list[CorrectionLogEntry] = Field(default_factory=list)
    rejected: list[str] = Field(default_factory=list)


# -------------------------------------------------------------------------------------- records


class SentenceRecord(BaseModel):
    """One evaluated sentence: gold and predicted aspects and labels, and (when a debate ran) its
    mapping and override counts. The unit :func:`moot.apps.absa.metrics.aggregate` sums over."""

    model_config = _FORBID

    id: str = ""
    gold_aspects: list[AspectTuple] = Field(default_factory=list)
    pred_aspects: list[AspectTuple] = Field(default_factory=list)
    gold_label: SentenceLabel
    pred_label: SentenceLabel
    mapping_stats: MappingStats | None = None
    mapping_fail_reasons: dict[str, int] | None = None
    override_stats: OverrideStats | None = None
