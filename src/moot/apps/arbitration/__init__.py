"""Seed 003: arbitration of contradicting agent reports.

    from moot.apps.arbitration import ArbitrationConfig, arbitrate, detect_contradictions

    contradictions = detect_contradictions(reports)          # pure: no model
    result = await arbitrate(reports, ArbitrationConfig(source_authority=["GCC-STAT", "World Bank"]))

Detection (``detect``) finds value mismatches, opposite interpretations, confidence gaps and
source conflicts per normalised metric; arbitration (``arbitrate``) asks one typed verdict per
contradiction (or runs a debate preset whose judge gives it), concurrently and within a budget;
the consensus (``consensus``) weighs the verdicts, flags what is not settled and adjusts the
reports. See docs/arbitration.md.
"""

from moot.apps.arbitration.arbitrate import arbitrate, debate_spec, verdict_schema_name
from moot.apps.arbitration.consensus import apply_outcomes, combine, narrative
from moot.apps.arbitration.detect import (
    detect_contradictions,
    interpretation_sides,
    normalize_metric,
    normalize_source,
    opposite,
    period_end,
    relative_difference,
)
from moot.apps.arbitration.types import (
    DEFAULT_VOCABULARY,
    AgentReport,
    ArbitrationConfig,
    ArbitrationNote,
    ArbitrationOutcome,
    ArbitrationResult,
    ArbitrationVerdict,
    Citation,
    Contradiction,
    Finding,
    Party,
    VerdictSample,
    verdict_schema,
)

__all__ = [
    "DEFAULT_VOCABULARY",
    "AgentReport",
    "ArbitrationConfig",
    "ArbitrationNote",
    "ArbitrationOutcome",
    "ArbitrationResult",
    "ArbitrationVerdict",
    "Citation",
    "Contradiction",
    "Finding",
    "Party",
    "VerdictSample",
    "apply_outcomes",
    "arbitrate",
    "combine",
    "debate_spec",
    "detect_contradictions",
    "interpretation_sides",
    "narrative",
    "normalize_metric",
    "normalize_source",
    "opposite",
    "period_end",
    "relative_difference",
    "verdict_schema",
    "verdict_schema_name",
]
