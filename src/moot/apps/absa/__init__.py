"""Seeds 001 and 002: aspect-based sentiment analysis with a debate layer.

The deterministic core, no model anywhere:

    from moot.apps.absa import moderate, apply_debate_override, build_review_context, apply_patch

- ``types``: every typed output and input (Stage 1, Stage 2 reviews, both debate variants, the
  moderator, the override, the correction log, evaluation records);
- ``mapping``: debate turns -> aspect hints (the panel's Debate Review Context; the patch
  variant's edits and judge tuples), normalised matching and synonym patterns;
- ``override``: the debate override of Stage 2;
- ``patch``: the patch debate's edits, the judge checks (evidence spans), history lines, and the
  Stage 2 reviews;
- ``moderator``: rules Z, B, M, C, A, D, E;
- ``metrics``: task and debate metrics, warnings.

See docs/absa.md.
"""

from moot.apps.absa.mapping import (
    aspect_terms_of,
    build_review_context,
    expand,
    load_synonyms,
    match_target,
    mentions,
    normalize,
    patch_hints,
    stance_polarity,
    stance_weight,
)
from moot.apps.absa.metrics import (
    AbsaMetrics,
    DebateMetrics,
    DebateThresholds,
    MetricWarning,
    TaskMetrics,
    aggregate,
    debate_metrics,
    debate_warnings,
    task_metrics,
)
from moot.apps.absa.moderator import infer_label_from_debate, is_critical, moderate, span_iou
from moot.apps.absa.override import apply_debate_override
from moot.apps.absa.patch import (
    apply_patch,
    apply_stage2,
    check_judge_summary,
    format_history,
    realign_span,
    validate_evidence_spans,
)
from moot.apps.absa.types import (
    ArbiterFlags,
    AspectHint,
    AspectReviewAction,
    AspectSentiment,
    AspectTerm,
    AspectTuple,
    ATEOutput,
    ATEReview,
    ATSAOutput,
    ATSAReview,
    CorrectionLogEntry,
    CorrectionProposal,
    DebateReviewContext,
    MappingStats,
    ModeratorInput,
    ModeratorOutput,
    OverrideOutcome,
    OverrideResult,
    OverrideStats,
    OverrideThresholds,
    PanelJudgeSummary,
    PanelTurn,
    PatchHints,
    PatchJudgeSummary,
    PatchTurn,
    Polarity,
    ProposedEdit,
    RebuttalPoint,
    SentenceLabel,
    SentenceRecord,
    SentimentReviewAction,
    Stage2Result,
    StageSignal,
    ValidatorIssue,
    ValidatorOutput,
)

__all__ = [
    "ATEOutput",
    "ATEReview",
    "ATSAOutput",
    "ATSAReview",
    "AbsaMetrics",
    "ArbiterFlags",
    "AspectHint",
    "AspectReviewAction",
    "AspectSentiment",
    "AspectTerm",
    "AspectTuple",
    "CorrectionLogEntry",
    "CorrectionProposal",
    "DebateMetrics",
    "DebateReviewContext",
    "DebateThresholds",
    "MappingStats",
    "MetricWarning",
    "ModeratorInput",
    "ModeratorOutput",
    "OverrideOutcome",
    "OverrideResult",
    "OverrideStats",
    "OverrideThresholds",
    "PanelJudgeSummary",
    "PanelTurn",
    "PatchHints",
    "PatchJudgeSummary",
    "PatchTurn",
    "Polarity",
    "ProposedEdit",
    "RebuttalPoint",
    "SentenceLabel",
    "SentenceRecord",
    "SentimentReviewAction",
    "Stage2Result",
    "StageSignal",
    "TaskMetrics",
    "ValidatorIssue",
    "ValidatorOutput",
    "aggregate",
    "apply_debate_override",
    "apply_patch",
    "apply_stage2",
    "aspect_terms_of",
    "build_review_context",
    "check_judge_summary",
    "debate_metrics",
    "debate_warnings",
    "expand",
    "format_history",
    "infer_label_from_debate",
    "is_critical",
    "load_synonyms",
    "match_target",
    "mentions",
    "moderate",
    "normalize",
    "patch_hints",
    "realign_span",
    "span_iou",
    "stance_polarity",
    "stance_weight",
    "task_metrics",
    "validate_evidence_spans",
]
