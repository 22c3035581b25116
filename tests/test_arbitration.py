"""Seed 003: contradiction detection, arbitration, consensus and ``moot arbitrate``, exact on the
scripted model."""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from moot.apps.arbitration import (
    AgentReport,
    ArbitrationConfig,
    ArbitrationResult,
    ArbitrationVerdict,
    Citation,
    Finding,
    arbitrate,
    detect_contradictions,
    interpretation_sides,
    normalize_metric,
    normalize_source,
    opposite,
    period_end,
    relative_difference,
    verdict_schema,
)
from moot.apps.arbitration.prompts import authority_rank
from moot.cli.main import app
from moot.models.base import ChatRequest, ModelConfigError, TransientModelError
from moot.models.scripted import ScriptedModel
from moot.protocols.loader import ProtocolFileError

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "reports.json"
runner = CliRunner()


def finding(
    metric: str = "qatar_unemployment_rate",
    value: float | None = 0.10,
    source: str | None = "GCC-STAT",
    period: str | None = "Q1-2024",
    confidence: float = 0.9,
    interpretation: str = "",
    unit: str = "%",
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "metric": metric,
        "value": value,
        "unit": unit,
        "interpretation": interpretation,
        "confidence": confidence,
    }
    if source is not None:
        out["citation"] = {"source": source, "period": period}
    return out


def report(agent: str, *findings: dict[str, Any]) -> AgentReport:
    return AgentReport.model_validate({"agent": agent, "findings": list(findings)})


def verdict(
    resolution: str = "agent1_correct",
    action: str | None = None,
    confidence: float = 0.8,
    value: float | None = None,
    citation: str | None = None,
    explanation: str = "Because.",
) -> dict[str, Any]:
    if action is None:
        action = {"both_valid": "use_both", "neither_valid": "flag_for_review"}.get(
            resolution, "use_" + resolution.removesuffix("_correct")
        )
    return {
        "resolution": resolution,
        "explanation": explanation,
        "recommended_value": value,
        "recommended_citation": citation,
        "confidence": confidence,
        "action": action,
    }


def user_prompt(request: ChatRequest) -> str:
    return next(m.content for m in request.messages if m.role == "user")


def pair(a: float, b: float, **cfg: Any) -> list[Any]:
    """The contradictions between two agents' values of one metric (same source)."""
    reports = [report("A", finding(value=a)), report("B", finding(value=b))]
    return detect_contradictions(reports, ArbitrationConfig(**cfg))


# ------------------------------------------------------------------------------- detection


@pytest.mark.req("S003-REAL")
def test_agreeing_reports_are_not_contradictions() -> None:
    reports = [
        report(
            "LabourEconomist",
            finding(value=0.10, confidence=0.9, interpretation="improving"),
            finding(metric="gdp growth", value=2.4, source="GCC-STAT", period="2024"),
        ),
        report(
            "NationalStrategy",
            finding(metric="Qatar Unemployment Rate", value=0.10, source="World Bank", confidence=0.8),
            finding(metric="GDP-Growth", value=2.45, source="GCC-STAT", period="2024", interpretation="up"),
        ),
        report(
            "SkillsAnalyst",
            finding(metric="qatar unemployment rate.", value=0.1, confidence=0.7, interpretation="improved further"),
            finding(metric="gdp_growth", value=2.5, source="IMF", period="2024", interpretation="rising"),
        ),
    ]
    assert detect_contradictions(reports) == []


@pytest.mark.req("S003-SKIP")
def test_no_contradiction_skips_without_calling_the_model() -> None:
    reports = [report(a, finding(value=0.10)) for a in ("A", "B", "C")]
    model = ScriptedModel([])
    result = asyncio.run(arbitrate(reports, model=model))
    assert result.status == "skipped"
    assert model.requests == []
    assert result.calls == 0 and result.tokens == 0 and result.contradictions == []
    assert result.resolved_count == 0 and result.flagged_count == 0
    assert result.adjusted_reports == reports
    assert result.consensus_narrative == "No contradictions among 3 agent reports: nothing to arbitrate."
    assert result.latency_ms < 1000
    assert result.debate_results() == {"contradictions_found": 0, "status": "skipped", "latency_ms": result.latency_ms}


@pytest.mark.req("S003-SKIP")
def test_skipping_never_resolves_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOOT_MODEL", "nonsense:model")  # would fail if it were resolved
    result = asyncio.run(arbitrate([report("A", finding())]))
    assert result.status == "skipped"


@pytest.mark.req("S003-REAL")
def test_metric_names_are_normalised() -> None:
    names = [
        "Qatar Unemployment-Rate.",
        "qatar_unemployment_rate",
        "  QATAR  unemployment   rate ",
        "Qatar—unemployment rate",
    ]
    assert {normalize_metric(n) for n in names} == {"qatar_unemployment_rate"}
    assert normalize_metric("실업률 (카타르)") == "실업률_카타르"
    assert normalize_metric("jobless rate", {"Jobless Rate": "unemployment rate"}) == "unemployment_rate"
    reports = [report(f"agent{i}", finding(metric=n, value=0.10 + i / 100)) for i, n in enumerate(names)]
    found = detect_contradictions(reports)
    assert len(found) == 1 and found[0].metric == "qatar_unemployment_rate" and len(found[0].parties) == 4
    aliased = [
        report("A", finding(metric="jobless rate", value=5)),
        report("B", finding(metric="Unemployment", value=7)),
    ]
    assert detect_contradictions(aliased) == []
    cfg = ArbitrationConfig(metric_aliases={"jobless rate": "unemployment"})
    assert [c.metric for c in detect_contradictions(aliased, cfg)] == ["unemployment"]


@pytest.mark.req("S003-DETECT-VALUE", "S003-SEVERITY")
@pytest.mark.parametrize(
    ("a", "b", "severity"),
    [
        (100, 100, None),
        (100, 95, None),  # exactly 5% of the larger: within tolerance
        (100, 94.9, "medium"),  # just past it
        (100, 80.1, "medium"),
        (100, 80, "high"),  # exactly 20%: high
        (0.10, 0.12, "medium"),  # the seed's example: 16.7% of the larger
        (0, 1, "high"),
        (-1, 1, "high"),
        (0, 0, None),
    ],
)
def test_value_severity_boundaries(a: float, b: float, severity: str | None) -> None:
    found = pair(a, b)
    if severity is None:
        assert found == []
    else:
        assert len(found) == 1 and found[0].severity == severity and found[0].kind == "value_mismatch"
        assert found[0].signals == ["value_mismatch"]


@pytest.mark.req("S003-DETECT-VALUE")
def test_tolerance_and_high_threshold_are_configurable() -> None:
    assert pair(100, 98) == []
    assert pair(100, 98, tolerance=0.01)[0].severity == "medium"
    assert pair(100, 89, high_difference=0.1)[0].severity == "high"
    assert pair(100, 89)[0].severity == "medium"
    assert relative_difference(0.10, 0.12) == pytest.approx(1 / 6, abs=1e-9)
    assert relative_difference(3, 3) == 0.0
    with pytest.raises(ValidationError, match="must exceed tolerance"):
        ArbitrationConfig(tolerance=0.3)


def test_value_details_name_values_sources_periods_and_units() -> None:
    reports = [
        report("A", finding(value=0.10, source="GCC-STAT", period="Q1-2024", unit="%")),
        report("B", finding(value=0.12, source="World Bank", period="2024", unit="ratio")),
    ]
    (c,) = detect_contradictions(reports)
    assert c.kind == "source_conflict" and c.severity == "medium"
    assert c.relative_difference == pytest.approx(0.166666667)
    assert "values differ by 16.7% of the larger (0.1 %, 0.12 ratio)" in c.details
    assert "sources differ (GCC-STAT vs World Bank)" in c.details
    assert "periods differ (Q1-2024 vs 2024)" in c.details
    assert "units differ (%, ratio)" in c.details
    assert c.agents == ["A", "B"]


@pytest.mark.req("S003-DETECT-SOURCE")
def test_source_conflict_needs_different_sources() -> None:
    same = [report("A", finding(value=1.0, source="GCC-STAT")), report("B", finding(value=2.0, source="gcc stat"))]
    assert detect_contradictions(same)[0].kind == "value_mismatch"
    cross = [report("A", finding(value=1.0, source="GCC-STAT")), report("B", finding(value=2.0, source="World Bank"))]
    assert detect_contradictions(cross)[0].kind == "source_conflict"
    unknown = [report("A", finding(value=1.0, source=None)), report("B", finding(value=2.0, source="World Bank"))]
    assert detect_contradictions(unknown)[0].kind == "value_mismatch"
    assert normalize_source("GCC-STAT") == normalize_source("gcc stat") == normalize_source("GCCSTAT")


@pytest.mark.req("S003-DETECT-SOURCE")
def test_source_only_conflicts_are_opt_in_and_low() -> None:
    near = [report("A", finding(value=100, source="GCC-STAT")), report("B", finding(value=102, source="World Bank"))]
    assert detect_contradictions(near) == []
    (c,) = detect_contradictions(near, ArbitrationConfig(source_only_conflicts=True))
    assert (c.kind, c.severity) == ("source_conflict", "low")
    identical = [report("A", finding(value=100, source="GCC-STAT")), report("B", finding(value=100, source="IMF"))]
    assert detect_contradictions(identical, ArbitrationConfig(source_only_conflicts=True)) == []


@pytest.mark.req("S003-DETECT-INTERPRETATION")
@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("improving", "declining", True),
        ("The labour market improved markedly", "conditions declined", True),
        ("steady improvement", "a decline in hiring", True),
        ("increasing", "decreased sharply", True),
        ("Unemployment is up", "unemployment is down", True),
        ("strong growth", "decline", True),
        ("positive outlook", "negative outlook", True),
        ("실업률이 개선되었다", "실업률 악화", True),
        ("고용 증가", "고용이 감소했다", True),
        ("임금 상승세", "임금 하락", True),
        ("improving", "improved", False),
        ("not improving", "declining", False),  # a negated term takes no side
        ("up in Q1, down in Q2", "down", False),  # both sides: ambiguous
        ("stable", "declining", False),
        ("", "", False),
        ("increase in exports", "increased output", False),
    ],
)
def test_opposite_interpretations(a: str, b: str, expected: bool) -> None:
    cfg = ArbitrationConfig()
    assert opposite(a, b, cfg.vocabulary) is expected
    assert opposite(b, a, cfg.vocabulary) is expected


@pytest.mark.req("S003-SEVERITY")
def test_vocabulary_is_configurable_and_opposites_are_high() -> None:
    cfg = ArbitrationConfig(vocabulary=[("hawkish", "dovish")])
    assert interpretation_sides("a hawkish stance", cfg.vocabulary) == {0: 0}
    reports = [
        report("A", finding(metric="policy", value=None, interpretation="hawkish")),
        report("B", finding(metric="policy", value=None, interpretation="dovish")),
    ]
    (c,) = detect_contradictions(reports, cfg)
    assert (c.kind, c.severity, c.relative_difference) == ("opposite_interpretation", "high", None)
    assert detect_contradictions(reports) == []  # not in the default vocabulary
    with pytest.raises(ValidationError):
        ArbitrationConfig(vocabulary=[("up", " ")])


@pytest.mark.req("S003-DETECT-INTERPRETATION")
def test_opposite_interpretation_with_close_values() -> None:
    reports = [
        report("A", finding(metric="real wage growth", value=4.1, interpretation="improving")),
        report("B", finding(metric="real wage growth", value=3.9, interpretation="declining in real terms")),
    ]
    (c,) = detect_contradictions(reports)
    assert c.kind == "opposite_interpretation" and c.signals == ["opposite_interpretation"] and c.severity == "high"
    reports[1] = report("B", finding(metric="real wage growth", value=2.0, interpretation="declining"))
    (c,) = detect_contradictions(reports)
    assert c.signals == ["opposite_interpretation", "value_mismatch"] and c.kind == "opposite_interpretation"


@pytest.mark.req("S003-DETECT-CONFIDENCE")
@pytest.mark.parametrize(("low", "found"), [(0.4, True), (0.41, False), (0.6, True), (0.61, False)])
def test_confidence_gap_boundary(low: float, found: bool) -> None:
    high = 0.7 if low < 0.5 else 0.9
    reports = [report("A", finding(confidence=high)), report("B", finding(confidence=low))]
    result = detect_contradictions(reports)
    if found:
        (c,) = result
        assert (c.kind, c.severity) == ("confidence_gap", "low") and c.confidence_gap == pytest.approx(high - low)
        assert "confidence differs by" in c.details
    else:
        assert result == []


def test_confidence_gap_is_not_reported_for_a_value_conflict() -> None:
    reports = [report("A", finding(value=1.0, confidence=0.9)), report("B", finding(value=2.0, confidence=0.3))]
    (c,) = detect_contradictions(reports)
    assert c.signals == ["value_mismatch"] and c.confidence_gap == pytest.approx(0.6)


@pytest.mark.req("S003-CASE-MULTIWAY")
def test_three_way_conflict_is_one_contradiction() -> None:
    reports = [
        report("A", finding(value=12.0), finding(metric="other", value=1)),
        report("B", finding(value=14.2)),
        report("C", finding(value=9.8)),
    ]
    (c,) = detect_contradictions(reports)
    assert c.id == "c1" and c.agents == ["A", "B", "C"] and c.severity == "high"
    assert [(p.report_index, p.finding_index) for p in c.parties] == [(0, 0), (1, 0), (2, 0)]


def test_contradictions_are_numbered_in_order_of_first_appearance() -> None:
    reports = [
        report("A", finding(metric="m1", value=1), finding(metric="m2", value=1), finding(metric="m3", value=1)),
        report("B", finding(metric="m3", value=5), finding(metric="m2", value=1), finding(metric="m1", value=5)),
    ]
    assert [(c.id, c.metric) for c in detect_contradictions(reports)] == [("c1", "m1"), ("c2", "m3")]


@pytest.mark.parametrize(
    ("period", "end"),
    [
        ("Q1-2024", "2024-03-31"),
        ("2024 Q3", "2024-09-30"),
        ("2024", "2024-12-31"),
        ("FY2023", "2023-12-31"),
        ("H1 2023", "2023-06-30"),
        ("2024-02", "2024-02-29"),
        ("03/2023", "2023-03-31"),
        ("March 2024", "2024-03-31"),
        ("2024-03-15", "2024-03-15"),
        ("2023-2024", "2024-12-31"),
        ("2024년 1분기", "2024-03-31"),
        ("2024-13-45", "2024-12-31"),
        ("recent", None),
        (None, None),
    ],
)
def test_period_end(period: str | None, end: str | None) -> None:
    got = period_end(period)
    assert (got.isoformat() if got else None) == end


# -------------------------------------------------------------------------------- verdicts


@pytest.mark.req("S003-VERDICT")
def test_the_two_party_verdict_schema_is_the_seeds() -> None:
    schema = verdict_schema(2).model_json_schema()
    props = schema["properties"]
    assert props["resolution"]["enum"] == ["agent1_correct", "agent2_correct", "both_valid", "neither_valid"]
    assert props["action"]["enum"] == ["use_agent1", "use_agent2", "use_both", "flag_for_review"]
    assert set(props) == {
        "resolution",
        "explanation",
        "recommended_value",
        "recommended_citation",
        "confidence",
        "action",
    }
    assert set(schema["required"]) == {"resolution", "explanation", "confidence", "action"}
    assert verdict_schema(2) is verdict_schema(2)
    three = verdict_schema(3).model_json_schema()["properties"]
    assert three["resolution"]["enum"][2] == "agent3_correct" and three["action"]["enum"][2] == "use_agent3"
    with pytest.raises(ValueError, match="at least two"):
        verdict_schema(1)


@pytest.mark.req("S003-VERDICT")
def test_verdicts_must_be_consistent() -> None:
    two = verdict_schema(2)
    assert two.model_validate(verdict("agent2_correct")).winner == 2
    assert two.model_validate(verdict("agent1_correct", "flag_for_review")).action == "flag_for_review"
    assert two.model_validate(verdict("both_valid")).winner is None
    with pytest.raises(ValidationError, match="goes with action 'use_agent1'"):
        two.model_validate(verdict("agent1_correct", "use_agent2"))
    with pytest.raises(ValidationError, match="goes with action 'flag_for_review'"):
        two.model_validate(verdict("neither_valid", "use_both"))
    with pytest.raises(ValidationError, match="there are 2 agents"):
        two.model_validate(verdict("agent3_correct"))
    assert two.model_validate(verdict(confidence=1.5)).confidence == 0.015  # a percentage, as answers' are
    with pytest.raises(ValidationError):
        two.model_validate(verdict(confidence="sure"))
    # The stored form accepts any number of parties.
    assert ArbitrationVerdict.model_validate(verdict("agent5_correct")).winner == 5
    with pytest.raises(ValidationError):
        ArbitrationVerdict.model_validate(verdict("agent0_correct", "use_agent0"))


def test_citations_and_findings() -> None:
    cited = Finding.model_validate({"metric": "x", "citation": "GCC-STAT", "confidence": 0.5})
    assert cited.citation == Citation(source="GCC-STAT")
    with pytest.raises(ValidationError, match="confidence"):
        Finding.model_validate({"metric": "x", "value": 1})
    with pytest.raises(ValidationError, match="finite"):
        Finding.model_validate({"metric": "x", "value": float("nan"), "confidence": 0.5})
    assert Citation(source="GCC-STAT", period="Q1-2024").label() == "GCC-STAT, Q1-2024"
    with pytest.raises(ValidationError):
        Finding.model_validate({"metric": "x", "confidence": 1.2})
    with pytest.raises(ValidationError):
        Finding.model_validate({"metric": "x", "valeu": 1, "confidence": 0.5})
    assert authority_rank("World Bank WDI", ["GCC-STAT", "World Bank"]) == 2
    assert authority_rank("IMF", ["GCC-STAT", "World Bank"]) is None


# ------------------------------------------------------------------------ the seed's scenarios


@pytest.mark.req("S003-CASE-CONFIDENCE")
def test_simple_contradiction_resolves_to_the_higher_confidence_agent() -> None:
    reports = [
        report("LabourEconomist", finding(value=0.10, source="GCC-STAT", confidence=0.9)),
        report("NationalStrategy", finding(value=0.14, source="GCC-STAT", confidence=0.6)),
    ]
    model = ScriptedModel([verdict("agent1_correct", value=0.10, citation="GCC-STAT Q1-2024", confidence=0.85)])
    result = asyncio.run(arbitrate(reports, model=model))
    (c,) = result.contradictions
    assert c.kind == "value_mismatch" and c.severity == "high"
    assert len(model.requests) == 1 and result.calls == 1
    prompt = user_prompt(model.requests[0])
    assert "between two agents" in prompt
    assert "- Agent 1 (LabourEconomist): 0.1 %; citation: GCC-STAT, Q1-2024; confidence: 0.9" in prompt
    assert "- Agent 2 (NationalStrategy): 0.14 %; citation: GCC-STAT, Q1-2024; confidence: 0.6" in prompt
    assert "No source ranking is given" in prompt
    assert model.requests[0].response_schema is not None
    assert model.requests[0].schema_name == "ArbitrationVerdict2"
    assert result.status == "complete" and result.resolved_count == 1 and result.flagged_count == 0
    outcome = result.outcome("c1")
    assert outcome.status == "resolved" and outcome.winner == "LabourEconomist" and outcome.confidence == 0.85
    assert outcome.calls == 1
    kept, replaced = (r.findings[0] for r in result.adjusted_reports)
    assert kept.value == 0.10 and kept.arbitration is not None and kept.arbitration.action == "confirmed"
    assert replaced.value == 0.10 and replaced.confidence == 0.9
    assert replaced.arbitration is not None and replaced.arbitration.action == "replaced"
    assert replaced.arbitration.original_value == 0.14 and replaced.arbitration.original_confidence == 0.6
    assert replaced.arbitration.note == "replaced by LabourEconomist's finding (GCC-STAT Q1-2024): Because."
    assert reports[1].findings[0].value == 0.14  # the input is not modified
    assert result.tokens == outcome.samples[0].usage.total_tokens > 0
    assert result.consensus_narrative == (
        "1 contradiction found: 1 resolved, 0 flagged for review. qatar_unemployment_rate: LabourEconomist's "
        "0.1 % (GCC-STAT, Q1-2024) is used over NationalStrategy's 0.14 % (GCC-STAT, Q1-2024) (confidence 0.85). "
        "Because."
    )


@pytest.mark.req("S003-PROMPT", "S003-ADJUSTED", "S003-CASE-SOURCE")
def test_source_conflict_prefers_the_authoritative_source() -> None:
    reports = [
        report("NationalStrategy", finding(value=0.12, source="World Bank", period="2024", confidence=0.85)),
        report("LabourEconomist", finding(value=0.10, source="GCC-STAT", period="2024", confidence=0.80)),
    ]
    model = ScriptedModel([verdict("agent2_correct", value=0.10, confidence=0.9)])
    cfg = ArbitrationConfig(source_authority=["GCC-STAT", "World Bank"])
    result = asyncio.run(arbitrate(reports, cfg, model=model))
    (c,) = result.contradictions
    assert c.kind == "source_conflict"
    prompt = user_prompt(model.requests[0])
    assert "Most authoritative first: GCC-STAT > World Bank > any other source." in prompt
    assert "Agent 1: World Bank ranks 2 of 2." in prompt and "Agent 2: GCC-STAT ranks 1 of 2." in prompt
    assert result.outcome("c1").winner == "LabourEconomist"
    loser = result.adjusted_reports[0].findings[0]
    assert loser.value == 0.10 and loser.citation == Citation(source="GCC-STAT", period="2024")
    assert loser.arbitration is not None and loser.arbitration.original_citation == Citation(
        source="World Bank", period="2024"
    )


@pytest.mark.req("S003-BOTH-VALID")
def test_both_valid_keeps_both_with_context() -> None:
    reports = [
        report("LabourEconomist", finding(value=0.10, source="GCC-STAT", period="Q1-2024", confidence=0.9)),
        report("NationalStrategy", finding(value=0.12, source="World Bank", period="2024", confidence=0.85)),
    ]
    explanation = "GCC-STAT reports Q1-2024, the World Bank the full year 2024."
    model = ScriptedModel([verdict("both_valid", confidence=0.8, explanation=explanation)])
    result = asyncio.run(arbitrate(reports, model=model))
    prompt = user_prompt(model.requests[0])
    assert "Agent 1: Q1-2024 (ends 2024-03-31)\nAgent 2: 2024 (ends 2024-12-31)" in prompt
    assert "Most recent: Agent 2." in prompt
    assert result.contradictions[0].severity == "medium"  # as in the seed's example
    assert result.status == "complete" and result.resolved_count == 1
    for r, value in zip(result.adjusted_reports, (0.10, 0.12), strict=True):
        f = r.findings[0]
        assert f.value == value and f.arbitration is not None and f.arbitration.action == "kept_both"
        assert f.arbitration.note == f"both findings are valid: {explanation}"
    assert result.consensus_narrative == (
        "1 contradiction found: 1 resolved, 0 flagged for review. qatar_unemployment_rate ranges 0.1-0.12 % "
        "depending on source and period: LabourEconomist reports 0.1 % (GCC-STAT, Q1-2024), NationalStrategy "
        f"reports 0.12 % (World Bank, 2024). {explanation}"
    )
    assert result.debate_results() == {
        "contradictions_found": 1,
        "status": "complete",
        "latency_ms": result.latency_ms,
        "resolved": 1,
        "flagged_for_review": 0,
        "consensus_narrative": result.consensus_narrative,
    }


@pytest.mark.req("S003-CASE-MULTIWAY")
def test_three_way_conflict_is_resolved() -> None:
    reports = [
        report("LabourEconomist", finding(value=12.0, source="World Bank", period="2022", confidence=0.6)),
        report("NationalStrategy", finding(value=14.2, source="Ministry of Labour", period="2023", confidence=0.7)),
        report("SkillsAnalyst", finding(value=9.8, source="GCC-STAT", period="2023", confidence=0.75)),
    ]
    model = ScriptedModel([verdict("agent3_correct", value=9.8, confidence=0.8)])
    cfg = ArbitrationConfig(source_authority=["GCC-STAT", "Ministry of Labour", "World Bank"])
    result = asyncio.run(arbitrate(reports, cfg, model=model))
    assert len(result.contradictions) == 1 and len(result.contradictions[0].parties) == 3
    assert len(model.requests) == 1
    request = model.requests[0]
    assert request.response_schema is not None
    assert "agent3_correct" in request.response_schema["properties"]["resolution"]["enum"]
    prompt = user_prompt(request)
    assert "between 3 agents" in prompt and '"agent3_correct"' in prompt and "all 3 findings are valid" in prompt
    assert "Agent 3: GCC-STAT ranks 1 of 3." in prompt
    outcome = result.outcome("c1")
    assert outcome.status == "resolved" and outcome.winner == "SkillsAnalyst"
    values = [r.findings[0].value for r in result.adjusted_reports]
    actions = [r.findings[0].arbitration.action for r in result.adjusted_reports]  # type: ignore[union-attr]
    assert values == [9.8, 9.8, 9.8] and actions == ["replaced", "replaced", "confirmed"]
    assert "SkillsAnalyst's 9.8 % (GCC-STAT, 2023) is used over LabourEconomist's 12 % (World Bank, 2022), " in (
        result.consensus_narrative
    )


# ------------------------------------------------------------------------------- consensus


def two_agents(a: float = 1.0, b: float = 2.0) -> list[AgentReport]:
    return [report("A", finding(value=a, confidence=0.9)), report("B", finding(value=b, confidence=0.7))]


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (verdict("agent1_correct", confidence=0.5), "verdict confidence 0.5 is below 0.6"),
        (
            verdict("agent1_correct", "flag_for_review"),
            "the arbitrator could not decide",
        ),
        (verdict("neither_valid"), "the arbitrator found neither finding valid"),
        (verdict("agent1_correct", value=7.0), "inconsistent verdict: it recommends 7, but agent 1 (A) reported 1"),
    ],
)
def test_unsettled_verdicts_are_flagged_and_change_nothing(reply: dict[str, Any], reason: str) -> None:
    result = asyncio.run(arbitrate(two_agents(), model=ScriptedModel([reply])))
    outcome = result.outcome("c1")
    assert outcome.status == "flagged" and outcome.flag_reason == reason and outcome.verdict is not None
    assert result.status == "complete" and result.flagged_count == 1 and result.resolved_count == 0
    for r, value in zip(result.adjusted_reports, (1.0, 2.0), strict=True):
        f = r.findings[0]
        assert f.value == value and f.arbitration is not None and f.arbitration.action == "flagged"
        assert f.arbitration.note == f"qatar_unemployment_rate: flagged for review: {reason}"
    assert f"qatar_unemployment_rate: flagged for review ({reason})." in result.consensus_narrative


def test_min_confidence_is_configurable() -> None:
    cfg = ArbitrationConfig(min_confidence=0.4)
    result = asyncio.run(arbitrate(two_agents(), cfg, model=ScriptedModel([verdict(confidence=0.5)])))
    assert result.outcome("c1").status == "resolved"


@pytest.mark.req("S003-NO-INVENTION")
def test_unparsable_verdict_is_flagged_never_invented() -> None:
    model = ScriptedModel(["The first agent is right.", "I said the first agent."])
    result = asyncio.run(arbitrate(two_agents(), model=model))
    assert len(model.requests) == 2  # the reply and one repair request
    assert "does not match the required JSON schema" in user_prompt_last(model.requests[1])
    outcome = result.outcome("c1")
    assert outcome.status == "flagged" and outcome.verdict is None
    (sample,) = outcome.samples
    assert sample.calls == 2 and sample.raw == "I said the first agent."
    assert sample.error is not None and sample.error.startswith("unparsable verdict after 2 attempt(s)")
    assert outcome.flag_reason == f"no verdict: {sample.error}"
    assert result.status == "partial" and result.calls == 2 and result.flagged_count == 1
    assert result.warnings == [f"c1 (qatar_unemployment_rate): the arbitrator gave no verdict: {sample.error}"]
    assert [r.findings[0].value for r in result.adjusted_reports] == [1.0, 2.0]


def user_prompt_last(request: ChatRequest) -> str:
    return request.messages[-1].content


def test_an_inconsistent_verdict_gets_one_repair() -> None:
    model = ScriptedModel([verdict("agent1_correct", "use_agent2"), verdict("agent1_correct")])
    result = asyncio.run(arbitrate(two_agents(), model=model))
    assert "goes with action 'use_agent1'" in user_prompt_last(model.requests[1])
    assert result.outcome("c1").status == "resolved" and result.calls == 2


@pytest.mark.req("S003-NO-INVENTION")
def test_model_errors_are_flagged_not_raised() -> None:
    model = ScriptedModel([ModelConfigError("no API key for openai:x; set OPENAI_API_KEY")])
    result = asyncio.run(arbitrate(two_agents(), model=model))
    outcome = result.outcome("c1")
    assert (
        outcome.status == "flagged" and outcome.flag_reason == "no verdict: no API key for openai:x; set OPENAI_API_KEY"
    )
    assert result.status == "partial" and result.calls == 1


def test_transient_errors_are_retried_by_the_model() -> None:
    model = ScriptedModel([TransientModelError("503"), verdict()])
    model.retry = model.retry.model_copy(update={"base_delay_s": 0.0})
    result = asyncio.run(arbitrate(two_agents(), model=model))
    assert result.outcome("c1").status == "resolved" and result.calls == 1


@pytest.mark.req("S003-CONSENSUS")
def test_several_arbitrators_are_weighed_by_confidence() -> None:
    replies = [verdict("agent1_correct", confidence=0.9), verdict("agent2_correct", confidence=0.3)]
    replies.append(verdict("agent1_correct", confidence=0.9))
    model = ScriptedModel(replies)
    cfg = ArbitrationConfig(arbitrators=3, temperature=0.7, concurrency=1)
    result = asyncio.run(arbitrate(two_agents(), cfg, model=model))
    assert [r.seed for r in model.requests] == [0, 1, 2]
    assert [r.temperature for r in model.requests] == [0.7, 0.7, 0.7]
    outcome = result.outcome("c1")
    assert outcome.status == "resolved" and outcome.winner == "A" and outcome.confidence == 0.6
    assert len(outcome.samples) == 3 and result.calls == 3 and result.warnings == []


@pytest.mark.req("S003-CONSENSUS")
def test_a_split_decision_is_flagged() -> None:
    model = ScriptedModel([verdict("agent1_correct", confidence=0.8), verdict("agent2_correct", confidence=0.8)])
    cfg = ArbitrationConfig(arbitrators=2, concurrency=1)
    result = asyncio.run(arbitrate(two_agents(), cfg, model=model))
    outcome = result.outcome("c1")
    assert outcome.status == "flagged"
    assert outcome.flag_reason == "split decision between the arbitrators: use_agent1 (0.80), use_agent2 (0.80)"
    assert result.warnings == [
        "2 arbitrators at temperature default: independent verdicts need a temperature above 0 to differ"
    ]
    lopsided = ScriptedModel([verdict("agent1_correct", confidence=0.6), verdict("agent2_correct", confidence=0.9)])
    cfg = ArbitrationConfig(arbitrators=2, concurrency=1, majority=0.6, min_confidence=0.1)
    outcome = asyncio.run(arbitrate(two_agents(), cfg, model=lopsided)).outcome("c1")
    assert outcome.status == "flagged" and outcome.flag_reason is not None and "split decision" in outcome.flag_reason


def test_a_failed_arbitrator_is_not_a_vote() -> None:
    model = ScriptedModel([ModelConfigError("down"), verdict("agent2_correct", confidence=0.9)])
    cfg = ArbitrationConfig(arbitrators=2, concurrency=1, temperature=1.0)
    result = asyncio.run(arbitrate(two_agents(), cfg, model=model))
    assert result.outcome("c1").status == "resolved" and result.outcome("c1").winner == "B"
    assert result.status == "complete"
    assert result.warnings == ["c1 (qatar_unemployment_rate): arbitrator 1 gave no verdict: down"]


# ------------------------------------------------------------------- concurrency and budgets


def many(n: int) -> list[AgentReport]:
    a = report("A", *(finding(metric=f"metric {i}", value=1.0) for i in range(n)))
    b = report("B", *(finding(metric=f"metric {i}", value=2.0) for i in range(n)))
    return [a, b]


@pytest.mark.req("S003-BATCH")
def test_contradictions_are_arbitrated_concurrently_under_the_bound() -> None:
    in_flight = 0
    peak = 0

    async def slow(request: ChatRequest) -> dict[str, Any]:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.05)
        in_flight -= 1
        return verdict()

    result = asyncio.run(arbitrate(many(12), model=ScriptedModel(fn=slow)))
    assert len(result.contradictions) == 12 and result.resolved_count == 12
    assert peak == 10  # the default bound, reached
    peak = 0
    result = asyncio.run(arbitrate(many(12), ArbitrationConfig(concurrency=3), model=ScriptedModel(fn=slow)))
    assert peak == 3 and result.calls == 12


@pytest.mark.req("S003-BUDGET")
def test_the_call_budget_is_never_exceeded() -> None:
    model = ScriptedModel(fn=lambda r: "not a verdict")
    result = asyncio.run(arbitrate(many(3), ArbitrationConfig(max_calls=2), model=model))
    assert len(model.requests) == 2 and result.calls == 2  # no repair may starve a first call
    errors = [o.flag_reason for o in result.verdicts]
    assert errors.count("no verdict: not arbitrated: the call budget of 2 calls is spent") == 1
    assert result.status == "partial" and result.flagged_count == 3
    spare = ScriptedModel(["no", verdict(), verdict()])
    result = asyncio.run(arbitrate(many(2), ArbitrationConfig(max_calls=3, concurrency=1), model=spare))
    assert result.calls == 3 and result.resolved_count == 2  # the spare call went to the repair


@pytest.mark.req("S003-BUDGET")
def test_the_timeout_flags_what_did_not_finish() -> None:
    async def fn(request: ChatRequest) -> dict[str, Any]:
        if "metric_1" in user_prompt(request):
            await asyncio.sleep(5)
        return verdict()

    cfg = ArbitrationConfig(timeout_s=0.3)
    result = asyncio.run(arbitrate(many(2), cfg, model=ScriptedModel(fn=fn)))
    assert result.status == "partial" and result.latency_ms < 3000
    assert result.outcome("c1").status == "resolved"
    slow = result.outcome("c2")
    assert slow.status == "flagged" and slow.flag_reason == "no verdict: timed out after 0.3 s during arbitration"
    assert slow.samples[0].calls == 1 and result.calls == 2
    assert "the arbitration timeout of 0.3 s expired" in result.warnings
    queued = asyncio.run(
        arbitrate(many(2), ArbitrationConfig(timeout_s=0.2, concurrency=1), model=ScriptedModel(fn=fn, latency=1))
    )
    assert queued.outcome("c2").flag_reason == "no verdict: not arbitrated: the timeout of 0.2 s expired first"
    assert queued.calls == 1


# ------------------------------------------------------------------------- debate arbitration


def debate_replies(request: ChatRequest) -> str | dict[str, Any]:
    system = request.messages[0].content
    if "neutral arbitrator" in system:
        return verdict("agent2_correct", value=0.10, confidence=0.9, explanation="GCC-STAT outranks the World Bank.")
    if "moderate a debate" in system:
        return {"pro_score": 0.4, "con_score": 0.7, "confidence": 0.9}
    if "moderated debate" in system:
        return {"content": "Agent 2's source ranks higher.", "confidence": 0.8}
    return "Agent 2 cites the more authoritative source."


def source_conflict() -> list[AgentReport]:
    return [
        report("NationalStrategy", finding(value=0.12, source="World Bank", period="2024", confidence=0.85)),
        report("LabourEconomist", finding(value=0.10, source="GCC-STAT", period="2024", confidence=0.8)),
    ]


def test_a_debate_preset_can_arbitrate() -> None:
    model = ScriptedModel(fn=debate_replies)
    cfg = ArbitrationConfig(protocol="affirmative-critical", rounds=1, source_authority=["GCC-STAT", "World Bank"])
    result = asyncio.run(arbitrate(source_conflict(), cfg, model=model))
    assert len(model.requests) == 3 and result.calls == 3  # two debaters, then the arbitrator as judge
    outcome = result.outcome("c1")
    assert outcome.status == "resolved" and outcome.winner == "LabourEconomist"
    (sample,) = outcome.samples
    transcript = sample.transcript
    assert transcript is not None and transcript.status == "complete" and transcript.llm_calls == 3
    assert transcript.protocol == "affirmative-critical" and transcript.final_answer == "agent2_correct"
    opening = transcript.rounds[0].turns[0].messages[1].content
    assert "[1] Agent 1 (NationalStrategy): 0.12 %; citation: World Bank, 2024; confidence: 0.85" in opening
    assert "[4] Source authority. Most authoritative first: GCC-STAT > World Bank > any other source." in opening
    judge = model.requests[-1]
    assert judge.response_schema is not None
    assert judge.response_schema["properties"]["action"]["enum"] == [
        "use_agent1",
        "use_agent2",
        "use_both",
        "flag_for_review",
    ]
    assert "The debate:\nAffirmative (round 1):" in user_prompt(judge) and "OUTPUT FORMAT (JSON)" in user_prompt(judge)
    assert result.adjusted_reports[0].findings[0].value == 0.10
    assert ArbitrationResult.model_validate_json(result.to_json()) == result


def test_the_moderated_preset_and_multi_way_debates() -> None:
    reports = [*source_conflict(), report("SkillsAnalyst", finding(value=0.2, source="IMF", period="2023"))]
    model = ScriptedModel(fn=debate_replies)
    result = asyncio.run(arbitrate(reports, ArbitrationConfig(rounds=1), model=model, protocol="moderated"))
    # proponent, opponent, moderator (whose confidence 0.9 ends the debate), then the judge
    assert len(model.requests) == 4 and result.calls == 4
    assert result.outcome("c1").status == "resolved" and result.outcome("c1").winner == "LabourEconomist"
    judge = model.requests[-1]
    assert judge.response_schema is not None and judge.schema_name == "ArbitrationVerdict3"
    assert "agent3_correct" in judge.response_schema["properties"]["resolution"]["enum"]


def test_a_failed_debate_is_flagged_with_its_transcript() -> None:
    model = ScriptedModel(fn=lambda r: "not a verdict" if "neutral arbitrator" in r.messages[0].content else "arg")
    cfg = ArbitrationConfig(protocol="affirmative-critical", rounds=1)
    result = asyncio.run(arbitrate(source_conflict(), cfg, model=model))
    outcome = result.outcome("c1")
    assert outcome.status == "flagged" and result.status == "partial"
    assert outcome.flag_reason is not None and outcome.flag_reason.startswith(
        "no verdict: the debate reached no verdict"
    )
    assert outcome.samples[0].transcript is not None and outcome.samples[0].transcript.status == "failed"
    assert result.calls == 4  # two debaters, the judge and its repair


def test_debates_respect_the_call_budget_and_the_timeout() -> None:
    model = ScriptedModel(fn=lambda r: verdict() if "neutral arbitrator" in r.messages[0].content else "arg")
    cfg = ArbitrationConfig(protocol="affirmative-critical", rounds=1, max_calls=5)
    result = asyncio.run(arbitrate(many(2), cfg, model=model))
    assert result.calls == 3 and len(model.requests) == 3
    assert sorted(o.status for o in result.verdicts) == ["flagged", "resolved"]
    flagged = next(o for o in result.verdicts if o.status == "flagged")
    assert (
        flagged.flag_reason == "no verdict: not arbitrated: the call budget of 5 calls cannot fit a debate of 3 calls"
    )
    slow = ScriptedModel(fn=debate_replies, latency=0.2)
    cfg = ArbitrationConfig(protocol="affirmative-critical", rounds=2, timeout_s=0.3)
    result = asyncio.run(arbitrate(source_conflict(), cfg, model=slow))
    (sample,) = result.outcome("c1").samples
    assert sample.error == "timed out after 0.3 s during arbitration"
    assert sample.transcript is not None and sample.transcript.status == "timeout"
    assert sample.calls == 4 and result.calls == 4  # round 1 done, round 2 in flight
    assert len(sample.transcript.rounds) == 2


def test_an_unknown_protocol_fails_before_anything_runs() -> None:
    with pytest.raises(ProtocolFileError, match="no protocol preset named 'nope'"):
        asyncio.run(arbitrate([report("A", finding())], protocol="nope"))


def test_results_round_trip_through_json() -> None:
    reports = [
        report("A", finding(value=1.0), finding(metric="trend", value=None, interpretation="improving")),
        report("B", finding(value=2.0), finding(metric="trend", value=None, interpretation="declining")),
        report("C", finding(value=3.0)),
    ]
    replies = itertools.cycle([verdict("agent3_correct"), verdict("both_valid")])
    model = ScriptedModel(fn=lambda r: next(replies))
    result = asyncio.run(arbitrate(reports, ArbitrationConfig(concurrency=1), model=model))
    assert len(result.contradictions) == 2
    back = ArbitrationResult.model_validate_json(result.to_json())
    assert back == result and back.verdicts[0].verdict is not None and back.verdicts[0].verdict.winner == 3
    assert json.loads(result.to_json())["schema_version"] == "moot.arbitration/1"


def test_reports_may_be_plain_dicts() -> None:
    raw = [r.model_dump() for r in two_agents()]
    result = asyncio.run(arbitrate(raw, model=ScriptedModel([verdict()])))
    assert result.resolved_count == 1


# ------------------------------------------------------------------------------------- CLI


def script(tmp_path: Path, replies: list[Any], name: str) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(replies))
    return f"scripted:{path}"


WIDE = {"COLUMNS": "200"}
EXAMPLE_REPLIES = [
    verdict("both_valid", confidence=0.85, explanation="Q1-2024 against the 2024 annual estimate."),
    verdict("agent1_correct", value=12.0, confidence=0.8, explanation="GCC-STAT ranks first."),
    verdict("both_valid", confidence=0.7, explanation="Average and low-skill wages move apart."),
    verdict("agent1_correct", confidence=0.9, explanation="The higher confidence stands."),
]


@pytest.mark.req("S003-ADJUSTED")
def test_cli_arbitrates_the_example(tmp_path: Path) -> None:
    model = script(tmp_path, EXAMPLE_REPLIES, "human")
    result = runner.invoke(app, ["arbitrate", str(EXAMPLE), "-m", model, "--concurrency", "1"], env=WIDE)
    assert result.exit_code == 0, result.output
    out = result.stdout
    for text in ("contradictions (4)", "qatar_unemploy", "opposite_interpretation", "verdicts", "use_agent1"):
        assert text in out
    assert "adjusted reports" in out and "was 14.2" in out and "consensus" in out
    assert "4 resolved, 0 flagged for review" in out


def test_cli_shows_no_escape_sequence_a_model_wrote(tmp_path: Path) -> None:
    """A verdict's explanation holding terminal escape sequences reached the terminal (a review)."""
    evil = "\x1b]0;PWNED\x07\x1b[41m red"
    replies = [verdict("both_valid", confidence=0.85, explanation=evil)] * 4
    model = script(tmp_path, replies, "evil")
    result = runner.invoke(app, ["arbitrate", str(EXAMPLE), "-m", model, "--concurrency", "1"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert "red" in result.stdout and not any(c in result.stdout for c in "\x1b\x07")


def test_cli_json_is_the_result(tmp_path: Path) -> None:
    model = script(tmp_path, EXAMPLE_REPLIES, "json")
    result = runner.invoke(app, ["arbitrate", str(EXAMPLE), "--json", "-m", model, "--concurrency", "1"])
    assert result.exit_code == 0, result.output
    parsed = ArbitrationResult.model_validate_json(result.stdout)
    assert parsed.status == "complete" and parsed.resolved_count == 4 and parsed.calls == 4
    assert [c.kind for c in parsed.contradictions] == [
        "source_conflict",
        "source_conflict",
        "opposite_interpretation",
        "confidence_gap",
    ]
    qatarization = [f for r in parsed.adjusted_reports for f in r.findings if "atarization" in f.metric]
    assert [f.value for f in qatarization] == [12.0, 12.0, 12.0]


def test_cli_detect_only_and_options(tmp_path: Path) -> None:
    result = runner.invoke(app, ["arbitrate", str(EXAMPLE), "--detect-only", "--json"])
    assert result.exit_code == 0, result.output
    assert [c["id"] for c in json.loads(result.stdout)] == ["c1", "c2", "c3", "c4"]
    path = tmp_path / "near.json"
    path.write_text(json.dumps([r.model_dump() for r in two_agents(100, 97)]))
    result = runner.invoke(app, ["arbitrate", str(path), "--detect-only"])
    assert result.exit_code == 0 and "No contradictions" in result.stdout
    result = runner.invoke(app, ["arbitrate", str(path), "--detect-only", "--tolerance", "0.01"])
    assert result.exit_code == 0 and "value_mismatch" in result.stdout
    result = runner.invoke(app, ["arbitrate", str(path), "--json"])
    assert result.exit_code == 0 and ArbitrationResult.model_validate_json(result.stdout).status == "skipped"
    model = script(tmp_path, [verdict()], "opts")
    result = runner.invoke(
        app,
        ["arbitrate", str(path), "--json", "-m", model, "--tolerance", "0.01", "--authority", "GCC-STAT, IMF",
         "--max-calls", "1", "--timeout", "30"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert ArbitrationResult.model_validate_json(result.stdout).resolved_count == 1


ONE = [{"agent": "A", "findings": []}]


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    missing = runner.invoke(app, ["arbitrate", str(tmp_path / "none.json")])
    assert missing.exit_code == 2 and "does not exist" in missing.output and "examples/reports.json" in missing.output
    cases: list[tuple[str, str]] = [
        ("{not json", "is not valid JSON"),
        (json.dumps({"agents": []}), "unknown key(s) agents"),
        (json.dumps({"config": {}}), "no 'reports' key"),
        (json.dumps({"reports": [], "config": 3}), "'config' must be an object"),
        (json.dumps("text"), "give a JSON list of agent reports"),
        (
            json.dumps([{"agent": "A", "findings": [{"metric": "x", "confidence": 2}]}]),
            "reports.0.findings.0.confidence",
        ),
        (json.dumps({"reports": ONE, "config": {"tolerance": 0.5}}), "must exceed tolerance"),
        (json.dumps({"reports": ONE, "config": {"tolerence": 0.1}}), "invalid config.tolerence"),
        # no report was "No contradictions: the agents agree", exit 0
        (json.dumps([]), "holds no reports: nothing to compare"),
        (json.dumps({"reports": [], "config": {}}), "holds no reports: nothing to compare"),
        # half a surrogate pair: named with its fix (it was pydantic's "unable to parse raw data")
        ('[{"agent": "A", "findings": [{"metric": "x\\udfff"}]}]', "contains a lone surrogate (U+DFFF)"),
    ]
    for i, (text, message) in enumerate(cases):
        path = tmp_path / f"bad{i}.json"
        path.write_text(text)
        result = runner.invoke(app, ["arbitrate", str(path)])
        assert result.exit_code == 2, (text, result.output)
        assert message in result.output, (message, result.output)
        assert "Traceback" not in result.output and len(result.output.strip().splitlines()) <= 3
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe\x00")
    assert runner.invoke(app, ["arbitrate", str(binary)]).exit_code == 2
    result = runner.invoke(app, ["arbitrate", str(EXAMPLE), "-p", "no-such-preset"])
    assert result.exit_code == 2 and "no protocol preset named 'no-such-preset'" in result.output
    # an option's value is blamed on the option, not on the file (which set none of it)
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(ONE))
    flag = runner.invoke(app, ["arbitrate", str(plain), "--tolerance", "5", "--detect-only"])
    assert flag.exit_code == 2 and "error: --tolerance: invalid config" in " ".join(flag.output.split()), flag.output
    configured = tmp_path / "configured.json"
    configured.write_text(json.dumps({"reports": ONE, "config": {"concurrency": 2}}))
    both = runner.invoke(app, ["arbitrate", str(configured), "--tolerance", "5", "--detect-only"])
    assert f"{configured}'s config with --tolerance: invalid config" in " ".join(both.output.split()), both.output
    concurrency = runner.invoke(app, ["arbitrate", str(EXAMPLE), "--concurrency", "0"])
    assert concurrency.exit_code == 2 and "--concurrency" in concurrency.output


def test_cli_partial_results_exit_1(tmp_path: Path) -> None:
    path = tmp_path / "two.json"
    path.write_text(json.dumps([r.model_dump() for r in two_agents()]))
    model = script(tmp_path, ["no", "still no"], "partial")
    result = runner.invoke(app, ["arbitrate", str(path), "-m", model])
    assert result.exit_code == 1
    assert "1 of 1 contradictions got no verdict" in result.output and "flagged" in result.output
    result = runner.invoke(app, ["arbitrate", str(path), "-m", "nonsense:x"])
    assert result.exit_code == 2 and "unknown model spec 'nonsense:x'" in result.output  # bad input


@pytest.mark.req("S003-REPORT-CONFIDENCE")
def test_a_report_level_confidence_is_its_findings_default(tmp_path: Path) -> None:
    """Seed 003's reports carry one confidence each ("Report 1 (LabourEconomist): ... Confidence:
    0.90"): it is the default of the report's findings; a finding's own confidence wins."""
    no_conf = {k: v for k, v in finding(value=0.10).items() if k != "confidence"}
    reports = [
        {"agent": "LabourEconomist", "confidence": 0.90, "findings": [no_conf]},
        {"agent": "NationalStrategy", "confidence": 0.85, "findings": [finding(value=0.12, source="World Bank",
                                                                              period="2024", confidence=0.6)]},
    ]  # fmt: skip
    parsed = [AgentReport.model_validate(r) for r in reports]
    assert [r.findings[0].confidence for r in parsed] == [0.90, 0.6]
    assert parsed[0].confidence == 0.90 and AgentReport.model_validate_json(parsed[0].model_dump_json()) == parsed[0]
    path = tmp_path / "seed003.json"
    path.write_text(json.dumps(reports))
    result = runner.invoke(app, ["arbitrate", str(path), "--detect-only", "--json"])
    assert result.exit_code == 0, result.output
    [found] = json.loads(result.stdout)
    assert [p["finding"]["confidence"] for p in found["parties"]] == [0.90, 0.6]
    # Without either confidence the finding is still refused, naming the field; a bad one is refused too.
    for bad, message in (
        ([{"agent": "A", "findings": [no_conf]}], "reports.0.findings.0.confidence"),
        ([{"agent": "A", "confidence": 1.5, "findings": [no_conf]}], "reports.0.confidence"),
    ):
        path.write_text(json.dumps(bad))
        result = runner.invoke(app, ["arbitrate", str(path)])
        assert result.exit_code == 2 and message in result.output, result.output


def test_a_verdicts_stated_confidence_is_read_leniently() -> None:
    """A new-user trial: a small model's verdicts stated confidences below 0, and 2 of 4 were thrown
    away (no verdict, flagged for review), where the README says a stated confidence outside 0-1 is
    clamped, as every answer turn's is. The moderator's scores are read the same way."""
    from moot.apps.arbitration.types import ArbitrationVerdict
    from moot.protocols.presets.shared import ModeratorEvaluation

    verdict = {"resolution": "agent1_correct", "explanation": "x", "action": "use_agent1"}
    assert ArbitrationVerdict.model_validate({**verdict, "confidence": -0.3}).confidence == 0.0
    assert ArbitrationVerdict.model_validate({**verdict, "confidence": 85}).confidence == 0.85
    scored = ModeratorEvaluation.model_validate({"pro_score": 80, "con_score": -1, "confidence": 0.5})
    assert (scored.pro_score, scored.con_score) == (0.8, 0.0)
