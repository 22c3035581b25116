"""The deterministic core of the ABSA debate pipeline (seeds 001 and 002), exact: the moderator's
rules on both sides of every boundary and in order, the debate override's thresholds, aspect
mapping and synonyms, the patch edits, evidence spans, history lines, Stage 2 reviews, metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import pytest
from pydantic import ValidationError

from moot.apps.absa import (
    AspectHint,
    AspectReviewAction,
    AspectSentiment,
    AspectTerm,
    AspectTuple,
    ATEOutput,
    ATEReview,
    ATSAOutput,
    ATSAReview,
    CorrectionProposal,
    DebateMetrics,
    DebateThresholds,
    MappingStats,
    ModeratorInput,
    OverrideStats,
    OverrideThresholds,
    PanelJudgeSummary,
    PanelTurn,
    PatchJudgeSummary,
    PatchTurn,
    Polarity,
    ProposedEdit,
    SentenceRecord,
    SentimentReviewAction,
    Stage2Result,
    StageSignal,
    ValidatorOutput,
    aggregate,
    apply_debate_override,
    apply_patch,
    apply_stage2,
    aspect_terms_of,
    build_review_context,
    check_judge_summary,
    debate_warnings,
    expand,
    format_history,
    infer_label_from_debate,
    is_critical,
    load_synonyms,
    mentions,
    moderate,
    normalize,
    patch_hints,
    realign_span,
    span_iou,
    stance_polarity,
    stance_weight,
    validate_evidence_spans,
)
from moot.apps.absa import moderator as M
from moot.apps.absa.mapping import PATTERNS_DIR
from moot.apps.absa.metrics import overlap_counts, prf

# ------------------------------------------------------------------------------------ helpers


def sig(label: str, conf: float, span: tuple[int, int] | None = None) -> StageSignal:
    return StageSignal.model_validate({"label": label, "confidence": conf, "span": span})


def run(
    s1: StageSignal,
    s1_atsa: StageSignal,
    s2: StageSignal | None = None,
    s2_atsa: StageSignal | None = None,
    validator: ValidatorOutput | None = None,
    summary: dict[str, Any] | None = None,
    aspects: list[AspectSentiment] | None = None,
) -> Any:
    return moderate(
        ModeratorInput(
            stage1_ate=s1,
            stage1_atsa=s1_atsa,
            stage2_ate=s2,
            stage2_atsa=s2_atsa,
            validator=validator,
            final_aspect_sentiments=aspects or [],
            debate_summary=summary,
        )
    )


def val(label: str | None, conf: float, *issues: tuple[str, str]) -> ValidatorOutput:
    return ValidatorOutput.model_validate(
        {
            "issues": [{"type": t, "severity": s, "description": ""} for t, s in issues],
            "suggested_label": label,
            "confidence": conf,
        }
    )


def sent(term: str, pol: str, conf: float, span: tuple[int, int] | None = None) -> AspectSentiment:
    return AspectSentiment.model_validate({"aspect_term": term, "polarity": pol, "confidence": conf, "span": span})


def tup(term: str, pol: str, conf: float | None = None, span: tuple[int, int] | None = None) -> AspectTuple:
    return AspectTuple.model_validate({"aspect_term": term, "polarity": pol, "confidence": conf, "span": span})


def hint(pol: str, weight: float, speaker: str = "x") -> AspectHint:
    return AspectHint.model_validate({"speaker": speaker, "stance": "", "weight": weight, "polarity_hint": pol})


def edit(op: str, target: str, value: str | None = None, **kw: Any) -> ProposedEdit:
    return ProposedEdit.model_validate({"op": op, "target": target, "value": value, **kw})


# ================================================================================== moderator


@pytest.mark.req("S001-RULE-Z")
class TestRuleZ:
    def test_both_zero_stops_everything(self) -> None:
        out = run(
            sig("positive", 0.0),
            sig("negative", 0.9, (0, 5)),
            s2=sig("negative", 0.0),
            validator=val("negative", 0.9, ("negation", "high")),
            summary={"consensus": "negative"},
            aspects=[sent("food", "positive", 0.8)],
        )
        assert (out.final_label, out.confidence) == ("neutral", 0.0)
        assert out.rationale == "RuleZ: insufficient signal (both confidences 0)."
        assert out.applied_rules == ["Z"]
        assert out.selected_stage == "stage1"
        assert not any(out.arbiter_flags.model_dump().values())
        assert out.final_aspects == [sent("food", "positive", 0.8)]

    def test_stage1_zero_stage2_nonzero_is_not_z(self) -> None:
        out = run(sig("positive", 0.0), sig("positive", 0.3), s2=sig("positive", 0.3))
        assert (out.final_label, out.confidence, out.applied_rules) == ("positive", 0.3, ["B"])
        assert out.selected_stage == "stage2"

    def test_stage2_zero_stage1_nonzero_is_not_z(self) -> None:
        out = run(sig("positive", 0.2), sig("positive", 0.2), s2=sig("positive", 0.0))
        assert out.applied_rules == ["B"]  # 0.2 - 0 >= 0.2: the drop guard
        assert out.arbiter_flags.stage2_rejected_due_to_confidence

    def test_missing_stage2_counts_as_zero(self) -> None:
        out = run(sig("positive", 0.0), sig("positive", 0.9))
        assert out.applied_rules == ["Z"]
        assert (out.final_label, out.confidence) == ("neutral", 0.0)

    def test_missing_stage2_and_stage1_nonzero(self) -> None:
        out = run(sig("negative", 0.1), sig("negative", 0.1))
        assert (out.final_label, out.confidence, out.applied_rules, out.rationale) == ("negative", 0.1, [], "")


@pytest.mark.req("S001-RULE-B")
class TestRuleB:
    @pytest.mark.req("S001-MODERATOR-OUT")
    @pytest.mark.parametrize(("s1", "s2"), [(0.8, 0.6), (0.7, 0.5), (0.2, 0.0), (1.0, 0.8)])
    def test_drop_of_0_2_keeps_stage1(self, s1: float, s2: float) -> None:
        # 0.7 - 0.5 is 0.19999999999999996 in floats: rounded, it is the boundary
        out = run(sig("positive", s1), sig("positive", s1), s2=sig("positive", s2))
        assert out.applied_rules == ["B"]
        assert out.rationale == "RuleB: Stage2 drop>=0.2; keep Stage1."
        assert (out.selected_stage, out.confidence) == ("stage1", s1)
        assert out.arbiter_flags.stage2_rejected_due_to_confidence

    @pytest.mark.parametrize(("s1", "s2"), [(0.69, 0.5), (0.79, 0.6), (0.5, 0.9)])
    def test_drop_of_0_19_or_a_rise_prefers_stage2(self, s1: float, s2: float) -> None:
        out = run(sig("positive", s1), sig("positive", s1), s2=sig("positive", s2))
        assert out.applied_rules == ["B"]
        assert out.rationale == "RuleB: Stage2 preferred."
        assert (out.selected_stage, out.confidence) == ("stage2", s2)
        assert not out.arbiter_flags.stage2_rejected_due_to_confidence

    def test_stage2_label_is_taken(self) -> None:
        out = run(sig("neutral", 0.6), sig("negative", 0.6), s2=sig("neutral", 0.7), s2_atsa=sig("neutral", 0.7))
        assert (out.final_label, out.confidence, out.applied_rules) == ("neutral", 0.7, ["B"])

    def test_no_stage2_no_rule_b(self) -> None:
        out = run(sig("positive", 0.8), sig("positive", 0.8))
        assert (out.applied_rules, out.selected_stage) == ([], "stage1")


@pytest.mark.req("S001-RULE-M")
class TestRuleM:
    def test_conflicting_labels_mixed_with_max_confidence(self) -> None:
        out = run(sig("positive", 0.7), sig("mixed", 0.7), s2=sig("negative", 0.6), s2_atsa=sig("mixed", 0.7))
        assert (out.final_label, out.confidence) == ("mixed", 0.7)
        assert out.applied_rules == ["B", "M"]
        assert out.rationale == "RuleB: Stage2 preferred. RuleM: conflicting stage1/stage2 labels -> mixed."
        assert out.selected_stage == "stage2"

    def test_applies_under_the_drop_guard_too(self) -> None:
        out = run(sig("positive", 0.9), sig("mixed", 0.9), s2=sig("negative", 0.6))
        assert (out.final_label, out.confidence, out.applied_rules) == ("mixed", 0.9, ["B", "M"])
        assert out.selected_stage == "stage1"
        assert out.arbiter_flags.stage2_rejected_due_to_confidence

    def test_same_labels_no_m(self) -> None:
        out = run(sig("negative", 0.6), sig("negative", 0.6), s2=sig("negative", 0.7))
        assert "M" not in out.applied_rules


@pytest.mark.req("S001-RULE-C")
class TestRuleC:
    @pytest.mark.parametrize(
        ("issue", "critical"),
        [
            (("negation", "low"), True),
            (("irony", "low"), True),
            (("contrast", "medium"), True),
            (("sarcasm", "high"), True),
            (("other", "high"), True),
            (("sarcasm", "medium"), False),
            (("comparison", "low"), False),
            (("other", "medium"), False),
        ],
    )
    def test_critical(self, issue: tuple[str, str], critical: bool) -> None:
        assert is_critical(val("negative", 0.1, issue)) is critical

    def test_critical_veto_below_current_confidence(self) -> None:
        out = run(sig("positive", 0.9), sig("negative", 0.9), validator=val("negative", 0.5, ("negation", "low")))
        assert (out.final_label, out.confidence, out.applied_rules) == ("negative", 0.9, ["C"])
        assert out.rationale == "RuleC: Validator critical veto."
        assert out.arbiter_flags.validator_override_applied

    def test_confidence_path_at_equal_confidence(self) -> None:
        out = run(sig("positive", 0.8), sig("negative", 0.8), validator=val("negative", 0.8, ("sarcasm", "medium")))
        assert (out.final_label, out.confidence, out.applied_rules) == ("negative", 0.8, ["C"])

    def test_confidence_path_raises_confidence(self) -> None:
        out = run(sig("positive", 0.6), sig("negative", 0.8), validator=val("negative", 0.8))
        assert (out.final_label, out.confidence, out.applied_rules) == ("negative", 0.8, ["C"])

    def test_neither_critical_nor_confident_enough(self) -> None:
        out = run(sig("positive", 0.8), sig("positive", 0.8), validator=val("negative", 0.79, ("sarcasm", "medium")))
        assert (out.final_label, out.applied_rules) == ("positive", [])
        assert not out.arbiter_flags.validator_override_applied

    def test_no_suggested_label_no_veto(self) -> None:
        out = run(sig("positive", 0.5), sig("positive", 0.5), validator=val(None, 1.0, ("negation", "high")))
        assert out.applied_rules == []

    def test_same_label_still_fires_and_only_raises(self) -> None:
        out = run(sig("positive", 0.5), sig("positive", 0.9), validator=val("positive", 0.9))
        assert (out.final_label, out.confidence, out.applied_rules) == ("positive", 0.9, ["C"])


@pytest.mark.req("S001-RULE-A")
class TestRuleA:
    def _run(self, s2_span: tuple[int, int]) -> Any:
        return run(
            sig("positive", 0.7),
            sig("positive", 0.9, (0, 100)),
            s2=sig("positive", 0.7),
            s2_atsa=sig("positive", 0.5, s2_span),
        )

    def test_iou_0_8_averages(self) -> None:
        out = self._run((0, 80))
        assert out.applied_rules == ["B", "A"]
        assert out.confidence == 0.6  # (0.7 + 0.5) / 2: current and candidate ATSA
        assert out.rationale == "RuleB: Stage2 preferred. RuleA: IoU>=0.8 span aligned."

    def test_iou_0_79_does_not(self) -> None:
        out = self._run((0, 79))
        assert (out.applied_rules, out.confidence) == (["B"], 0.7)

    def test_label_must_match(self) -> None:
        out = run(
            sig("positive", 0.7),
            sig("positive", 0.9, (0, 10)),
            s2=sig("positive", 0.7),
            s2_atsa=sig("negative", 0.75, (0, 10)),
        )
        assert "A" not in out.applied_rules

    def test_missing_span(self) -> None:
        out = run(
            sig("positive", 0.7), sig("positive", 0.9), s2=sig("positive", 0.7), s2_atsa=sig("positive", 0.5, (0, 10))
        )
        assert out.applied_rules == ["B"]

    def test_drop_guard_blocks_a(self) -> None:
        out = run(sig("positive", 0.9), sig("positive", 0.5, (0, 10)), s2=sig("positive", 0.6))
        assert (out.applied_rules, out.confidence) == (["B"], 0.9)

    def test_stage1_selected_candidate_is_stage1_atsa(self) -> None:
        out = run(sig("positive", 0.8), sig("positive", 0.6, (0, 5)))
        assert (out.applied_rules, out.confidence) == (["A"], 0.7)

    def test_stage2_selected_without_stage2_atsa_uses_stage1(self) -> None:
        out = run(sig("positive", 0.8), sig("positive", 0.4, (3, 9)), s2=sig("positive", 0.8))
        assert (out.applied_rules, out.confidence) == (["B", "A"], 0.6)

    @pytest.mark.parametrize(
        ("a", "b", "iou"),
        [
            ((0, 10), (5, 15), 5 / 15),
            ((0, 10), (10, 20), 0.0),
            ((0, 10), (0, 10), 1.0),
            ((3, 3), (3, 3), 1.0),
            ((3, 3), (4, 4), 0.0),
            ((0, 10), None, 0.0),
            (None, None, 0.0),
            ((0, 100), (0, 80), 0.8),
        ],
    )
    def test_span_iou(self, a: Any, b: Any, iou: float) -> None:
        assert span_iou(a, b) == pytest.approx(iou)


@pytest.mark.req("S001-RULE-D")
class TestRuleD:
    @pytest.mark.parametrize(("ate", "atsa"), [(0.8, 0.7), (0.7, 0.6), (0.9, 0.8)])
    def test_diff_0_1_ate_wins(self, ate: float, atsa: float) -> None:
        out = run(sig("positive", ate), sig("negative", atsa))
        assert (out.final_label, out.confidence, out.applied_rules) == ("positive", ate, ["D"])
        assert out.rationale == "RuleD: diff>=0.1 ATE wins."
        assert out.arbiter_flags.confidence_margin_used

    @pytest.mark.parametrize(("ate", "atsa"), [(0.6, 0.7), (0.5, 0.6), (0.2, 0.9)])
    def test_diff_0_1_atsa_wins(self, ate: float, atsa: float) -> None:
        out = run(sig("positive", ate), sig("negative", atsa))
        assert (out.final_label, out.confidence) == ("negative", atsa)
        assert out.rationale == "RuleD: diff>=0.1 ATSA wins."

    @pytest.mark.parametrize(("ate", "atsa"), [(0.8, 0.71), (0.7, 0.79), (0.6, 0.6)])
    def test_diff_0_09_sentence_ate(self, ate: float, atsa: float) -> None:
        out = run(sig("positive", ate), sig("negative", atsa))
        assert (out.final_label, out.confidence) == ("positive", ate)
        assert out.rationale == "RuleD: diff<0.1 conflict -> sentence ATE."
        assert out.arbiter_flags.confidence_margin_used

    def test_same_label_no_d(self) -> None:
        out = run(sig("positive", 0.9), sig("positive", 0.1))
        assert out.applied_rules == []
        assert not out.arbiter_flags.confidence_margin_used

    def test_candidate_is_selected_stage(self) -> None:
        # Stage 2 selected: its ATSA (negative 0.9) is the candidate, not Stage 1's (positive)
        out = run(sig("positive", 0.7), sig("positive", 0.9), s2=sig("positive", 0.6), s2_atsa=sig("negative", 0.9))
        assert (out.final_label, out.confidence, out.applied_rules) == ("negative", 0.9, ["B", "D"])


@pytest.mark.req("S001-RULE-E")
class TestRuleE:
    @pytest.mark.parametrize(("conf", "fires"), [(0.54, True), (0.55, False), (0.3, True), (0.9, False)])
    def test_confidence_boundary(self, conf: float, fires: bool) -> None:
        out = run(sig("positive", conf), sig("positive", conf), summary={"consensus": "The panel leans negative."})
        if fires:
            assert (out.final_label, out.confidence, out.applied_rules) == ("negative", conf, ["E"])
            assert out.rationale == "RuleE: debate consensus -> negative."
        else:
            assert (out.final_label, out.applied_rules) == ("positive", [])

    def test_mixed_is_overridden_at_any_confidence(self) -> None:
        out = run(
            sig("positive", 0.9),
            sig("mixed", 0.9),
            s2=sig("negative", 0.85),
            s2_atsa=sig("mixed", 0.9),
            summary={"consensus": "Overall positive despite one complaint."},
        )
        assert out.applied_rules == ["B", "M", "E"]
        assert (out.final_label, out.confidence) == ("positive", 0.9)

    def test_same_label_or_nothing_inferred(self) -> None:
        assert run(sig("negative", 0.3), sig("negative", 0.3), summary={"consensus": "negative"}).applied_rules == []
        assert run(sig("negative", 0.3), sig("negative", 0.3), summary={"consensus": "no idea"}).applied_rules == []
        assert run(sig("negative", 0.3), sig("negative", 0.3), summary=None).applied_rules == []

    def test_patch_summary_sentence_polarity_first(self) -> None:
        summary = PatchJudgeSummary(sentence_polarity="neutral", sentence_evidence_spans=["x"], rationale="positive")
        assert infer_label_from_debate(summary.model_dump()) == "neutral"
        out = run(sig("positive", 0.5), sig("positive", 0.5), summary=summary.model_dump())
        assert (out.final_label, out.rationale) == ("neutral", "RuleE: debate consensus -> neutral.")

    def test_patch_summary_invalid_polarity_falls_back_to_rationale(self) -> None:
        assert infer_label_from_debate({"sentence_polarity": "unclear", "rationale": "모호한 표현"}) == "neutral"

    @pytest.mark.parametrize(
        ("text", "label"),
        [
            ("혼합된 평가", "mixed"),
            ("a mixed bag", "mixed"),
            ("의견이 엇갈림", "mixed"),
            ("양면적", "mixed"),
            ("긍정적", "positive"),
            ("호의적 반응", "positive"),
            ("맛이 좋다", "positive"),
            ("POSITIVE", "positive"),
            ("부정적", "negative"),
            ("비판적", "negative"),
            ("나쁘지 않", "negative"),
            ("Negative overall", "negative"),
            ("중립", "neutral"),
            ("neutral tone", "neutral"),
            ("모호함", "neutral"),
            ("긍정과 부정", "positive"),
            ("positive but mixed", "mixed"),
            ("negative, not neutral", "negative"),
            ("no keyword here", None),
        ],
    )
    def test_keywords_in_order(self, text: str, label: str | None) -> None:
        assert infer_label_from_debate({"consensus": text}) == label

    def test_fields_searched(self) -> None:
        panel = PanelJudgeSummary(
            winner="critic",
            consensus="",
            key_agreements=["food fine"],
            key_disagreements=["service was negative"],
            rationale="",
        )
        assert infer_label_from_debate(panel.model_dump()) == "negative"
        assert infer_label_from_debate({"winner": "positive"}) is None  # winner is not searched
        assert infer_label_from_debate({}) is None


@pytest.mark.req("S001-RULE-ORDER")
class TestRuleOrder:
    def test_d_can_undo_c(self) -> None:
        out = run(sig("positive", 0.6), sig("positive", 0.8), validator=val("negative", 0.5, ("irony", "low")))
        assert out.applied_rules == ["C", "D"]
        assert (out.final_label, out.confidence) == ("positive", 0.8)
        assert out.arbiter_flags.validator_override_applied and out.arbiter_flags.confidence_margin_used

    def test_c_reads_m(self) -> None:
        out = run(
            sig("positive", 0.7),
            sig("positive", 0.7),
            s2=sig("negative", 0.6),
            s2_atsa=sig("positive", 0.7),
            validator=val("positive", 0.7),
        )
        assert out.applied_rules == ["B", "M", "C"]
        assert (out.final_label, out.confidence) == ("positive", 0.7)

    def test_e_after_d_tie(self) -> None:
        out = run(sig("positive", 0.5), sig("negative", 0.45), summary={"consensus": "부정적"})
        assert out.applied_rules == ["D", "E"]
        assert out.final_label == "negative"
        assert out.rationale == "RuleD: diff<0.1 conflict -> sentence ATE. RuleE: debate consensus -> negative."

    def test_a_then_e_on_lowered_confidence(self) -> None:
        out = run(sig("positive", 0.6), sig("positive", 0.4, (0, 4)), summary={"consensus": "neutral"})
        assert out.applied_rules == ["A", "E"]
        assert (out.final_label, out.confidence) == ("neutral", 0.5)

    def test_final_aspects_are_copies(self) -> None:
        aspects = [sent("battery", "negative", 0.9, (4, 11)), sent("screen", "positive", 0.8)]
        out = run(sig("mixed", 0.8), sig("mixed", 0.8), aspects=aspects)
        assert out.final_aspects == aspects
        assert out.final_aspects[0] is not aspects[0]

    def test_input_is_strict(self) -> None:
        with pytest.raises(ValidationError, match="extra"):
            ModeratorInput.model_validate(
                {
                    "stage1_ate": {"label": "positive", "confidence": 1},
                    "stage1_atsa": {"label": "positive", "confidence": 1},
                    "foo": 1,
                }
            )
        with pytest.raises(ValidationError):
            sig("happy", 0.5)
        with pytest.raises(ValidationError):
            sig("positive", 1.5)

    def test_constants(self) -> None:
        assert (M.DROP_GUARD, M.IOU_ALIGNED, M.TIE_MARGIN, M.DEBATE_CONF) == (0.2, 0.8, 0.1, 0.55)


# ================================================================================== types


def test_candidate_span_is_strongest_located_sentiment() -> None:
    atsa = ATSAOutput(
        aspect_sentiments=[
            sent("a", "positive", 0.9),
            sent("b", "negative", 0.8, (5, 9)),
            sent("c", "negative", 0.8, (12, 15)),
            sent("d", "negative", 0.7, (20, 22)),
        ],
        sentence_label="mixed",
        confidence=0.7,
    )
    assert atsa.candidate_span == (5, 9)  # "a" has no span; b and c tie: the first
    assert atsa.signal() == sig("mixed", 0.7, (5, 9))
    assert (
        ATSAOutput(
            aspect_sentiments=[sent("a", "positive", 0.9)], sentence_label="positive", confidence=0.9
        ).candidate_span
        is None
    )
    assert ATEOutput(aspects=[], sentence_label="neutral", confidence=0.4).signal() == sig("neutral", 0.4)


def test_spans_and_unknown_keys_are_validated() -> None:
    with pytest.raises(ValidationError, match="0 <= start <= end"):
        AspectTerm(term="x", span=(5, 3), confidence=0.5)
    with pytest.raises(ValidationError):
        ProposedEdit.model_validate({"op": "set_polarity", "target": "x", "bogus": 1})
    with pytest.raises(ValidationError):
        ProposedEdit.model_validate({"op": "rename", "target": "x"})
    assert AspectTerm.model_validate({"term": "x", "span": [1, 4], "confidence": 1}).span == (1, 4)


# ================================================================================== override


@pytest.mark.req("S001-OVERRIDE")
class TestOverride:
    def _one(self, hints: list[AspectHint], sentiments: list[AspectSentiment], **th: float) -> Any:
        return apply_debate_override(sentiments, {"battery": hints}, OverrideThresholds(**th))

    @pytest.mark.parametrize("weights", [[0.8, 0.8], [0.6, 0.6, 0.4], [1.0, 0.6]])
    def test_min_total_reached(self, weights: list[float]) -> None:
        # 0.6 + 0.6 + 0.4 is 1.5999999999999999 in floats: rounded, it is 1.6
        r = self._one([hint("negative", w) for w in weights], [sent("battery", "positive", 0.9)])
        assert r.outcomes[0].status == "applied"
        assert r.sentiments == [sent("battery", "negative", 0.9)]  # confidence max(0.9, 0.7)

    def test_below_min_total(self) -> None:
        r = self._one([hint("negative", 0.8), hint("negative", 0.79)], [sent("battery", "positive", 0.9)])
        assert r.outcomes[0].status == "skipped_low_signal"
        assert r.stats == OverrideStats(skipped_low_signal=1)
        assert r.sentiments == [sent("battery", "positive", 0.9)] and r.log == []

    def test_neutral_hints_do_not_count(self) -> None:
        r = self._one([hint("neutral", 0.6)] * 3 + [hint("positive", 1.0)], [sent("battery", "negative", 0.5)])
        assert (r.outcomes[0].status, r.outcomes[0].pos_score, r.outcomes[0].neg_score) == ("skipped_low_signal", 1, 0)

    def test_margin_reached(self) -> None:
        # 1.2 - 0.4 is 0.7999999999999999 in floats
        r = self._one([hint("positive", 1.2), hint("negative", 0.4)], [sent("battery", "negative", 0.5)])
        assert r.outcomes[0].status == "applied"
        assert r.sentiments == [sent("battery", "positive", 0.7)]

    def test_below_margin(self) -> None:
        r = self._one([hint("positive", 1.2), hint("negative", 0.41)], [sent("battery", "negative", 0.5)])
        assert r.outcomes[0].status == "skipped_conflict"
        assert r.outcomes[0].debate_polarity is None
        assert r.sentiments == [sent("battery", "negative", 0.5)]

    def test_already_confident_at_target(self) -> None:
        r = self._one([hint("positive", 1.0)] * 2, [sent("battery", "positive", 0.7)])
        assert r.outcomes[0].status == "skipped_already_confident"
        assert r.stats.skipped_already_confident == 1 and r.log == []

    def test_same_polarity_below_target_is_raised(self) -> None:
        r = self._one([hint("positive", 1.0)] * 2, [sent("battery", "positive", 0.69)])
        assert r.outcomes[0].status == "applied"
        assert r.sentiments == [sent("battery", "positive", 0.7)]
        assert (r.log[0].kind, r.log[0].before, r.log[0].after) == ("DEBATE_OVERRIDE", "positive", "positive")

    def test_confident_but_opposite_is_flipped(self) -> None:
        r = self._one([hint("positive", 1.0)] * 2, [sent("battery", "negative", 0.95)])
        assert r.sentiments == [sent("battery", "negative", 0.95).model_copy(update={"polarity": "positive"})]
        entry = r.log[0]
        assert (entry.kind, entry.aspect_term, entry.before, entry.after) == (
            "DEBATE_OVERRIDE",
            "battery",
            "negative",
            "positive",
        )
        assert entry.reason == "debate pos=2 neg=0 (total 2, margin 2) -> positive; confidence 0.95 -> 0.95"

    def test_missing_sentiment_is_added(self) -> None:
        r = apply_debate_override(
            [sent("screen", "positive", 0.8)],
            {"Battery": [hint("negative", 1.0), hint("negative", 0.6)]},
            aspects=[AspectTerm(term="battery", span=(4, 11), confidence=0.9)],
        )
        assert r.sentiments[1] == sent("Battery", "negative", 0.7, (4, 11))
        assert r.stats == OverrideStats(applied=1)
        assert (r.log[0].before, r.log[0].after) == (None, "negative")

    def test_custom_target_and_normalised_match(self) -> None:
        r = apply_debate_override(
            [sent("battery-life", "positive", 0.2)],
            {"Battery Life": [hint("negative", 1.0), hint("negative", 1.0)]},
            OverrideThresholds(min_target_conf=0.9),
        )
        assert r.sentiments == [sent("battery-life", "negative", 0.9)]

    def test_stats_over_aspects_and_input_untouched(self) -> None:
        sentiments = [sent("a", "positive", 0.9), sent("b", "negative", 0.5), sent("c", "positive", 0.8)]
        before = [s.model_copy() for s in sentiments]
        r = apply_debate_override(
            sentiments,
            {
                "a": [hint("positive", 1.0), hint("positive", 1.0)],  # already confident
                "b": [hint("positive", 1.0), hint("positive", 0.8)],  # applied
                "c": [hint("positive", 1.0), hint("negative", 1.0)],  # conflict
                "d": [hint("negative", 1.0)],  # low signal
            },
        )
        assert r.stats == OverrideStats(
            applied=1, skipped_low_signal=1, skipped_conflict=1, skipped_already_confident=1
        )
        assert [o.status for o in r.outcomes] == [
            "skipped_already_confident",
            "applied",
            "skipped_conflict",
            "skipped_low_signal",
        ]
        assert sentiments == before
        assert r.stats.total == 4

    def test_thresholds_file(self, tmp_path: Path) -> None:
        assert OverrideThresholds.load() == OverrideThresholds(min_total=1.6, min_margin=0.8, min_target_conf=0.7)
        p = tmp_path / "t.json"
        p.write_text(json.dumps({"min_total": 2.0, "min_margin": 0.5, "min_target_conf": 0.8, "_doc": "x"}))
        assert OverrideThresholds.load(p) == OverrideThresholds(min_total=2.0, min_margin=0.5, min_target_conf=0.8)
        p.write_text(json.dumps({"min_totl": 2.0}))
        with pytest.raises(ValidationError, match="min_totl"):
            OverrideThresholds.load(p)


# ================================================================================== mapping


ATE = ATEOutput(
    aspects=[AspectTerm(term="battery", span=(4, 11), confidence=0.9), AspectTerm(term="screen", confidence=0.8)],
    sentence_label="mixed",
    confidence=0.8,
)
ATSA = ATSAOutput(
    aspect_sentiments=[
        sent("battery", "negative", 0.8),
        sent("screen", "positive", 0.7),
        sent("Price", "neutral", 0.6),
    ],
    sentence_label="mixed",
    confidence=0.7,
)


def turn(stance: str, message: str, refs: list[str] | None = None, **kw: Any) -> PanelTurn:
    return PanelTurn(speaker=kw.pop("speaker", stance), stance=stance, message=message, aspect_refs=refs or [], **kw)


class TestMapping:
    def test_normalize(self) -> None:
        assert normalize("Battery-Life!") == normalize("battery life") == "batterylife"
        assert normalize("배터리 수명!") == "배터리수명"
        assert normalize("ＲＡＭ_8") == "ram8"

    def test_mentions(self) -> None:
        assert mentions("배터리가 금방 닳아요", "배터리")  # a particle glued on
        assert mentions("The Battery-life is short", "battery life")
        assert mentions("8GB RAM is tight", "ram") and not mentions("the program crashed", "ram")
        assert not mentions("the steak", "tea") and mentions("iced tea, please", "tea")
        assert not mentions("anything", "!!")

    @pytest.mark.req("S001-STANCE")
    def test_stance(self) -> None:
        assert [stance_weight(s) for s in ("neutral", "pro", "con", "Pro", "other", "")] == [0.6, 1, 1, 1, 0.8, 0.8]
        assert [stance_polarity(s) for s in ("pro", "con", "neutral", "CON", "sceptic")] == [
            "positive",
            "negative",
            "neutral",
            "negative",
            "neutral",
        ]

    @pytest.mark.req("S001-MAPPING")
    def test_synonym_groups_en_and_ko(self) -> None:
        groups = load_synonyms()
        assert {"service", "waiter", "waitress"} <= set(expand("staff", groups))
        assert {"battery life", "charge"} <= set(expand("battery", groups))
        assert {"충전", "배터리 수명"} <= set(expand("배터리", groups))
        assert {"직원", "응대", "사장님"} <= set(expand("서비스", groups))
        assert expand("the staff", groups)[:2] == ["the staff", "service"]  # the term mentions a member
        assert expand("nothing like it", groups) == ["nothing like it"]
        # one-syllable members select their group but are never searched for
        assert "가격" in expand("값", groups) and "값" not in expand("가격", groups)

    def test_pattern_files(self) -> None:
        for lang in ("en", "ko"):
            data = json.loads((PATTERNS_DIR / f"{lang}.json").read_text(encoding="utf-8"))
            assert data["language"] == lang and 20 <= len(data["groups"]) <= 40
            seen: dict[str, str] = {}
            for head, members in data["groups"].items():
                for m in {normalize(x) for x in [head, *members]}:
                    assert m not in seen, f"{lang}: {m!r} in {seen.get(m)!r} and {head!r}"
                    seen[m] = head

    def test_aspect_terms(self) -> None:
        assert aspect_terms_of(ATE, ATSA) == ["battery", "screen", "Price"]
        assert aspect_terms_of(None, None) == []

    @pytest.mark.req("S001-MAPPING")
    def test_direct_by_text_and_synonym(self) -> None:
        ctx = build_review_context([turn("con", "Charging takes forever.")], None, ATE, ATSA)
        p = ctx.rebuttal_points[0]
        assert (p.aspect_refs, p.provenance_hint, p.polarity_hint, p.weight) == (["battery"], "direct", "negative", 1)
        assert ctx.mapping_stats == MappingStats(turns=1, direct=1)
        assert ctx.mapping_fail_reasons == {"no_aspects": 0, "no_match": 0, "neutral_stance": 0, "fallback_used": 0}
        assert ctx.aspect_hints == {
            "battery": [AspectHint(speaker="con", stance="con", weight=1.0, polarity_hint="negative")]
        }

    def test_key_points_read_planning_not(self) -> None:
        t = turn("pro", "I like it.", key_points=["the display is crisp"], planning="talk about the battery")
        assert build_review_context([t], None, ATE, ATSA).rebuttal_points[0].aspect_refs == ["screen"]

    def test_several_aspects(self) -> None:
        ctx = build_review_context([turn("pro", "Screen good, battery bad, price fair")], None, ATE, ATSA)
        assert ctx.rebuttal_points[0].aspect_refs == ["battery", "screen", "Price"]

    def test_refs_first(self) -> None:
        ctx = build_review_context([turn("pro", "The battery is fine", refs=["monitor"])], None, ATE, ATSA)
        assert ctx.rebuttal_points[0].aspect_refs == ["screen"]  # the ref (a synonym) wins over the text

    @pytest.mark.req("S001-MAPPING")
    def test_korean_synonym_and_particle(self) -> None:
        ate = ATEOutput(
            aspects=[AspectTerm(term="서비스", confidence=0.9), AspectTerm(term="배터리", confidence=0.9)],
            sentence_label="mixed",
            confidence=0.8,
        )
        ctx = build_review_context(
            [
                turn("pro", "사장님이 정말 친절하셨어요"),
                turn("con", "배터리가 금방 닳아요"),
                turn("con", "충전이 느려요"),
            ],
            None,
            ate,
            None,
        )
        assert [p.aspect_refs for p in ctx.rebuttal_points] == [["서비스"], ["배터리"], ["배터리"]]
        assert ctx.synonym_hints["서비스"][:3] == ["직원", "응대", "사장님"]
        assert ctx.mapping_stats == MappingStats(turns=3, direct=3)

    @pytest.mark.req("S001-MAPPING")
    def test_fallback_by_atsa_polarity(self) -> None:
        ctx = build_review_context([turn("con", "This is a disappointing product overall.")], None, ATE, ATSA)
        p = ctx.rebuttal_points[0]
        assert (p.aspect_refs, p.provenance_hint) == (["battery"], "fallback")
        assert ctx.mapping_fail_reasons["fallback_used"] == 1
        assert ctx.mapping_stats == MappingStats(turns=1, fallback=1)

    @pytest.mark.req("S001-FAIL-REASONS")
    def test_fallback_when_refs_name_no_aspect(self) -> None:
        ctx = build_review_context([turn("pro", "Lovely.", refs=["keyboard"])], None, ATE, ATSA)
        assert (ctx.rebuttal_points[0].aspect_refs, ctx.rebuttal_points[0].provenance_hint) == (["screen"], "fallback")

    @pytest.mark.req("S001-FAIL-REASONS")
    def test_no_match(self) -> None:
        atsa = ATSAOutput(
            aspect_sentiments=[sent("battery", "negative", 0.8)], sentence_label="negative", confidence=0.8
        )
        ctx = build_review_context([turn("pro", "Nice overall.")], None, None, atsa)
        p = ctx.rebuttal_points[0]
        assert (p.aspect_refs, p.provenance_hint) == ([], "none")
        assert ctx.mapping_fail_reasons == {"no_aspects": 0, "no_match": 1, "neutral_stance": 0, "fallback_used": 0}
        assert ctx.aspect_hints == {}

    @pytest.mark.req("S001-FAIL-REASONS")
    def test_no_aspects(self) -> None:
        ctx = build_review_context(
            [turn("pro", "battery"), turn("con", "x")],
            PanelJudgeSummary(consensus="중립"),
            ATEOutput(sentence_label="neutral", confidence=0.5),
            None,
        )
        assert ctx.mapping_fail_reasons == {"no_aspects": 2, "no_match": 0, "neutral_stance": 0, "fallback_used": 0}
        assert ctx.mapping_stats == MappingStats(turns=2, none=2)
        assert ctx.summary["consensus"] == "중립" and ctx.aspect_terms == []

    @pytest.mark.req("S001-FAIL-REASONS")
    def test_neutral_stance(self) -> None:
        ctx = build_review_context(
            [
                turn("neutral", "The battery claim is factual."),  # direct, neutral
                turn("neutral", "Hard to say."),  # fallback to the neutral aspect (Price)
                turn("other", "Hmm."),  # any other stance: neutral polarity, weight 0.8
            ],
            None,
            ATE,
            ATSA,
        )
        assert [p.aspect_refs for p in ctx.rebuttal_points] == [["battery"], ["Price"], ["Price"]]
        assert [p.weight for p in ctx.rebuttal_points] == [0.6, 0.6, 0.8]
        assert ctx.mapping_fail_reasons == {"no_aspects": 0, "no_match": 0, "neutral_stance": 3, "fallback_used": 2}

    def test_neutral_unmapped_is_only_no_match(self) -> None:
        ctx = build_review_context([turn("neutral", "Hard to say.")], None, ATE, None)  # no ATSA: no fallback
        assert ctx.mapping_fail_reasons == {"no_aspects": 0, "no_match": 1, "neutral_stance": 0, "fallback_used": 0}

    def test_full_panel_context_feeds_the_override(self) -> None:
        turns = [
            turn("neutral", "The battery drains fast, that is the main fact.", speaker="analyst"),
            turn("con", "Battery life is clearly bad.", speaker="critic"),
            turn("pro", "The screen is gorgeous.", speaker="empath"),
            turn("neutral", "Screen praise is explicit.", speaker="analyst"),
            turn("con", "A four-hour charge is unacceptable.", speaker="critic"),
            turn("pro", "Still a good buy.", speaker="empath"),  # fallback -> screen
        ]
        ctx = build_review_context(turns, PanelJudgeSummary(consensus="mixed"), ATE, ATSA)
        assert ctx.mapping_stats == MappingStats(turns=6, direct=5, fallback=1)
        assert ctx.mapping_fail_reasons == {"no_aspects": 0, "no_match": 0, "neutral_stance": 2, "fallback_used": 1}
        assert list(ctx.aspect_hints) == ["battery", "screen"]
        assert [h.speaker for h in ctx.aspect_hints["battery"]] == ["analyst", "critic", "critic"]
        r = apply_debate_override(ATSA.aspect_sentiments, ctx.aspect_hints)
        # battery: neg 2.0 >= 1.6, already negative 0.8 >= 0.7; screen: pos 2.0, positive 0.7
        assert r.stats == OverrideStats(skipped_already_confident=2)
        assert "Stage 1 ATSA polarity" in ctx.fallback_mapping_policy and ctx.review_guidance


class TestPatchHints:
    TERMS: ClassVar[list[str]] = ["battery", "screen", "price"]
    POL: ClassVar[dict[str, Polarity]] = {"battery": "positive", "screen": "positive", "price": "neutral"}

    def test_weights_and_sources(self) -> None:
        turns = [
            PatchTurn(
                agent="EPM",
                proposed_edits=[
                    edit("set_polarity", "battery", "negative", confidence=0.5),
                    edit("set_polarity", "Battery", None, polarity="negative"),
                    edit("drop_tuple", "price"),
                ],
            ),
            PatchTurn(
                agent="TAN", proposed_edits=[edit("confirm_tuple", "screen"), edit("set_aspect_ref", "screen", "x")]
            ),
        ]
        judge = PatchJudgeSummary(
            final_tuples=[tup("battery", "negative")], sentence_polarity="mixed", sentence_evidence_spans=["dies"]
        )
        h = patch_hints(turns, judge, self.TERMS, self.POL)
        assert [(x.speaker, x.stance, x.weight, x.polarity_hint) for x in h.aspect_hints["battery"]] == [
            ("EPM", "set_polarity", 0.4, "negative"),
            ("EPM", "set_polarity", 0.8, "negative"),
            ("judge", "final_tuple", 1.0, "negative"),
        ]
        assert [(x.stance, x.weight, x.polarity_hint) for x in h.aspect_hints["screen"]] == [
            ("confirm_tuple", 0.8, "positive")
        ]
        assert h.mapping_stats == MappingStats(turns=4, direct=4)
        r = apply_debate_override([sent("battery", "positive", 0.9)], h.aspect_hints)
        assert r.sentiments[0].polarity == "negative"  # 0.4 + 0.8 + 1.0 = 2.2 negative

    def test_unmatched_unusable_and_no_aspects(self) -> None:
        turns = [
            PatchTurn(
                agent="EPM",
                proposed_edits=[
                    edit("set_polarity", "keyboard", "negative"),  # no_match
                    edit("set_polarity", "battery", "bad"),  # no polarity: none, no reason
                    edit("confirm_tuple", "screen"),  # no Stage 1 polarity given: none
                ],
            )
        ]
        h = patch_hints(turns, None, self.TERMS)
        assert h.aspect_hints == {}
        assert h.mapping_stats == MappingStats(turns=3, none=3)
        assert h.mapping_fail_reasons["no_match"] == 1 and sum(h.mapping_fail_reasons.values()) == 1
        h = patch_hints(turns, None, [])
        assert h.mapping_fail_reasons["no_aspects"] == 3

    def test_target_by_synonym(self) -> None:
        h = patch_hints(
            [PatchTurn(agent="EPM", proposed_edits=[edit("set_polarity", "display", "negative")])], None, self.TERMS
        )
        assert list(h.aspect_hints) == ["screen"]


# ================================================================================== patch


@pytest.mark.req("S002-EDITS")
class TestPatch:
    T: ClassVar[list[AspectTuple]] = [
        tup("battery", "positive", 0.6, (4, 11)),
        tup("screen", "negative", 0.8),
        tup("price", "neutral", 0.5),
    ]

    def test_set_polarity(self) -> None:
        out, log, rej = apply_patch(self.T, [edit("set_polarity", "Battery", "negative", evidence="dies fast")])
        assert out[0] == tup("battery", "negative", 0.6, (4, 11)) and rej == []
        assert (log[0].kind, log[0].before, log[0].after) == ("SET_POLARITY", "positive", "negative")
        assert log[0].reason == "set_polarity by patch; evidence: dies fast"
        out, _, _ = apply_patch(self.T, [edit("set_polarity", "battery", None, polarity="neutral", confidence=0.9)])
        assert out[0] == tup("battery", "neutral", 0.9, (4, 11))
        out, log, rej = apply_patch(self.T, [edit("set_polarity", "battery", "great")])
        assert out == self.T and log == [] and rej == ["set_polarity target='battery': value 'great' is not a polarity"]

    def test_set_aspect_ref(self) -> None:
        out, log, rej = apply_patch(
            self.T,
            [edit("set_aspect_ref", "battery", "battery life")],
            aspect_terms=["battery", "screen", "price", "battery life"],
        )
        assert out[0] == tup("battery life", "positive", 0.6, (4, 11)) and rej == []
        assert (log[0].kind, log[0].before, log[0].after) == ("SET_ASPECT_REF", "battery", "battery life")
        _, _, rej = apply_patch(self.T, [edit("set_aspect_ref", "battery", "keyboard")])
        assert rej == ["set_aspect_ref target='battery': value 'keyboard' is not a Stage 1 aspect term"]
        _, _, rej = apply_patch(self.T, [edit("set_aspect_ref", "battery")])
        assert rej == ["set_aspect_ref target='battery': value None is not a Stage 1 aspect term"]

    def test_set_aspect_ref_onto_an_existing_tuple_merges(self) -> None:
        out, log, _ = apply_patch(self.T, [edit("set_aspect_ref", "battery", None, aspect_term="screen")])
        assert out == [tup("screen", "negative", 0.8, (4, 11)), tup("price", "neutral", 0.5)]
        assert log[0].reason.endswith("merged into the existing tuple")

    def test_merge_tuples(self) -> None:
        out, log, rej = apply_patch(self.T, [edit("merge_tuples", "battery", "screen")])
        assert out == [tup("battery", "negative", 0.8, (4, 11)), tup("price", "neutral", 0.5)] and rej == []
        assert (log[0].kind, log[0].before, log[0].after) == ("MERGE_TUPLES", "positive + screen:negative", "negative")
        out, _, _ = apply_patch(self.T, [edit("merge_tuples", "price", "battery")])
        assert out == [tup("screen", "negative", 0.8), tup("price", "positive", 0.6, (4, 11))]
        tie = [tup("a", "positive", 0.5), tup("b", "negative", 0.5)]
        assert apply_patch(tie, [edit("merge_tuples", "b", "a")])[0] == [tup("b", "negative", 0.5)]
        _, _, rej = apply_patch(
            self.T, [edit("merge_tuples", "battery", "nope"), edit("merge_tuples", "battery", "battery")]
        )
        assert rej == [
            "merge_tuples target='battery': value 'nope' is not a Stage 1 aspect term",
            "merge_tuples target='battery': value names the target itself",
        ]

    def test_drop_then_edit_dropped(self) -> None:
        out, log, rej = apply_patch(self.T, [edit("drop_tuple", "price"), edit("confirm_tuple", "price")])
        assert out == self.T[:2]
        assert (log[0].kind, log[0].before, log[0].after) == ("DROP_TUPLE", "neutral", None)
        assert rej == ["confirm_tuple target='price': no tuple for this target (removed by an earlier edit)"]

    def test_confirm_tuple(self) -> None:
        out, log, _ = apply_patch(self.T, [edit("confirm_tuple", "battery", confidence=0.9)])
        assert out[0].confidence == 0.9 and log[0].kind == "CONFIRM_TUPLE"
        _, _, rej = apply_patch(self.T, [edit("drop_tuple", "food")], aspect_terms=["battery", "food"])
        assert rej == ["drop_tuple target='food': no tuple for this target"]
        out, log, rej = apply_patch(
            self.T, [edit("confirm_tuple", "screen", confidence=0.5), edit("confirm_tuple", "price")]
        )
        assert out == self.T and log == [] and rej == []

    def test_unknown_target_rejected_and_input_untouched(self) -> None:
        before = [t.model_copy() for t in self.T]
        out, log, rej = apply_patch(self.T, [edit("drop_tuple", "keyboard"), edit("set_polarity", "food", "negative")])
        assert out == self.T == before and log == []
        assert rej == [
            "drop_tuple target='keyboard': unknown target (not a Stage 1 aspect term)",
            "set_polarity target='food': unknown target (not a Stage 1 aspect term)",
        ]

    def test_sequence(self) -> None:
        edits = [
            edit("set_polarity", "battery", "negative"),
            edit("merge_tuples", "screen", "battery"),
            edit("drop_tuple", "battery"),
        ]
        out, log, rej = apply_patch(self.T, edits)
        assert out == [tup("screen", "negative", 0.8, (4, 11)), tup("price", "neutral", 0.5)]
        assert [e.kind for e in log] == ["SET_POLARITY", "MERGE_TUPLES"] and len(rej) == 1


SENTENCE = "The battery dies in two hours, but the screen is gorgeous."


class TestJudgeAndHistory:
    @pytest.mark.req("S002-SPANS")
    def test_validate_spans(self) -> None:
        valid, invalid = validate_evidence_spans(SENTENCE, ["battery dies", "The Battery", "", "  ", "gorgeous."])
        assert valid == ["battery dies", "gorgeous."]
        assert invalid == ["The Battery", "", "  "]

    def _summary(self, spans: list[str], **kw: Any) -> PatchJudgeSummary:
        return PatchJudgeSummary.model_validate({"sentence_polarity": "mixed", "sentence_evidence_spans": spans, **kw})

    @pytest.mark.req("S002-JUDGE")
    def test_check_ok(self) -> None:
        s = self._summary(
            ["battery dies in two hours", "screen is gorgeous"],
            final_tuples=[{"aspect_term": "battery", "polarity": "negative"}],
            aspect_evidence={"battery": "dies in two hours"},
        )
        assert check_judge_summary(SENTENCE, s, ["battery", "screen"]) == []

    @pytest.mark.req("S002-SPANS")
    def test_check_problems(self) -> None:
        s = self._summary(["battery dies", "battery is dead"])
        assert check_judge_summary(SENTENCE, s) == [
            "sentence_evidence_spans[1] 'battery is dead' is not an exact substring of the sentence"
        ]
        s = self._summary(
            ["the battery"],
            aspect_evidence={"screen": "screen is great"},
            final_tuples=[tup("battery", "negative"), tup("Battery", "positive"), tup("keyboard", "neutral")],
            final_patch=[edit("drop_tuple", "mouse")],
        )
        assert check_judge_summary(SENTENCE, s, ["battery", "screen"]) == [
            "sentence_evidence_spans[0] 'the battery' is not an exact substring of the sentence",
            "no valid sentence_evidence_spans: at least one exact substring of the sentence is required",
            "aspect_evidence['screen'] 'screen is great' is not an exact substring of the sentence",
            "aspect 'battery' has conflicting polarities in final_tuples: negative, positive",
            "final_tuples aspect 'keyboard' is not a Stage 1 aspect term",
            "final_patch drop_tuple target 'mouse' is not a Stage 1 aspect term",
        ]
        with pytest.raises(ValidationError):
            self._summary([])

    def test_realign(self) -> None:
        assert realign_span(SENTENCE, " the Battery   dies ") == "The battery dies"
        assert realign_span(SENTENCE, "battery is dead") is None
        assert realign_span(SENTENCE, "  ") is None

    @pytest.mark.req("S002-HISTORY")
    def test_history_lines(self) -> None:
        turns = [
            PatchTurn(
                agent="EPM",
                proposed_edits=[
                    edit("set_polarity", "battery", "negative", evidence="dies in two hours", confidence=0.9),
                    edit("confirm_tuple", "screen", evidence="screen is\ngorgeous"),
                ],
            ),
            PatchTurn(agent="TAN", proposed_edits=[edit("drop_tuple", "price")]),
            PatchTurn(agent="CJ", proposed_edits=[]),
        ]
        assert format_history(turns) == (
            "- EPM: set_polarity target=battery value=negative evidence=dies in two hours\n"
            "- EPM: confirm_tuple target=screen value=null evidence=screen is gorgeous\n"
            "- TAN: drop_tuple target=price value=null evidence=null\n"
            "- CJ: (no edits)"
        )
        assert format_history([]) == ""


# ================================================================================== Stage 2


class TestStage2:
    ASPECTS: ClassVar[list[AspectTerm]] = [
        AspectTerm(term="battery", span=(4, 11), confidence=0.9),
        AspectTerm(term="screen", span=(39, 45), confidence=0.8),
    ]
    SENTS: ClassVar[list[AspectSentiment]] = [
        sent("battery", "positive", 0.6, (4, 11)),
        sent("screen", "positive", 0.8, (39, 45)),
    ]

    def _validator(self, *proposals: tuple[str, str, str | None]) -> ValidatorOutput:
        return ValidatorOutput(
            confidence=0.8,
            correction_proposals=[
                CorrectionProposal.model_validate({"op": op, "aspect_term": t, "value": v, "reason": "r"})
                for op, t, v in proposals
            ],
        )

    def test_validator_proposals(self) -> None:
        r = apply_stage2(
            self.ASPECTS,
            self.SENTS,
            self._validator(
                ("FLIP_POLARITY", "battery", None),
                ("REVISE_SPAN", "screen", "the screen"),
                ("DROP_ASPECT", "keyboard", None),
            ),
            sentence=SENTENCE,
        )
        assert r.sentiments == [
            sent("battery", "negative", 0.6, (4, 11)),
            sent("the screen", "positive", 0.8, (35, 45)),
        ]
        assert r.aspects[1] == AspectTerm(term="the screen", span=(35, 45), confidence=0.8)
        assert [(e.kind, e.before, e.after, e.reason) for e in r.log] == [
            ("FLIP_POLARITY", "positive", "negative", "r"),
            ("REVISE_SPAN", "screen", "the screen", "r"),
        ]
        assert r.rejected == ["validator DROP_ASPECT aspect_term='keyboard': unknown aspect"]

    def test_validator_flip_neutral_and_drop(self) -> None:
        sents = [sent("battery", "neutral", 0.6)]
        r = apply_stage2(self.ASPECTS, sents, self._validator(("FLIP_POLARITY", "battery", None)))
        assert r.sentiments == sents and len(r.rejected) == 1
        r = apply_stage2(self.ASPECTS, sents, self._validator(("FLIP_POLARITY", "battery", "negative")))
        assert r.sentiments[0].polarity == "negative"
        r = apply_stage2(self.ASPECTS, self.SENTS, self._validator(("DROP_ASPECT", "Battery", None)))
        assert [a.term for a in r.aspects] == ["screen"] and [s.aspect_term for s in r.sentiments] == ["screen"]

    def test_ate_review(self) -> None:
        review = ATEReview(
            aspect_review=[
                AspectReviewAction(action="revise_span", term="battery", new_term="battery dies"),
                AspectReviewAction(action="drop", term="screen"),
                AspectReviewAction(action="add", term="hours"),
                AspectReviewAction(action="add", term="keyboard"),
                AspectReviewAction(action="add", term="battery dies"),
                AspectReviewAction(action="revise_span", term="hours"),
            ],
            sentence_label="negative",
            confidence=0.7,
        )
        r = apply_stage2(self.ASPECTS, self.SENTS, ate_review=review, sentence=SENTENCE)
        assert r.aspects == [
            AspectTerm(term="battery dies", span=(4, 16), confidence=0.9),
            AspectTerm(term="hours", span=(24, 29), confidence=0.7),
        ]
        assert r.sentiments == [sent("battery dies", "positive", 0.6, (4, 16))]
        assert [e.kind for e in r.log] == ["ATE_REVISE_SPAN", "ATE_DROP", "ATE_ADD"]
        assert r.rejected == [
            "ate add term='keyboard': not in the sentence",
            "ate add term='battery dies': already an aspect",
            "ate revise_span term='hours': revise_span needs new_term or span",
        ]

    @pytest.mark.req("S001-STAGE2-ORDER")
    def test_atsa_review_after_the_others(self) -> None:
        review = ATSAReview(
            sentiment_review=[
                SentimentReviewAction(action="maintain", aspect_term="screen", confidence=0.9),
                SentimentReviewAction(action="flip_polarity", aspect_term="battery"),
                SentimentReviewAction(action="add", aspect_term="hours", polarity="negative"),
                SentimentReviewAction(action="add", aspect_term="price"),
                SentimentReviewAction(action="drop", aspect_term="screen"),
                SentimentReviewAction(action="maintain", aspect_term="screen"),
            ],
            sentence_label="negative",
            confidence=0.65,
        )
        r = apply_stage2(self.ASPECTS, self.SENTS, atsa_review=review, sentence=SENTENCE)
        assert r.sentiments == [sent("battery", "negative", 0.6, (4, 11)), sent("hours", "negative", 0.65, (24, 29))]
        assert [e.kind for e in r.log] == ["ATSA_MAINTAIN", "ATSA_FLIP_POLARITY", "ATSA_ADD", "ATSA_DROP"]
        assert r.rejected == [
            "atsa add aspect_term='price': add needs a polarity",
            "atsa maintain aspect_term='screen': the aspect has no sentiment",
        ]
        assert [a.term for a in r.aspects] == ["battery", "screen"]  # ATSA drop keeps the ATE aspect

    @pytest.mark.req("S001-STAGE2-ORDER")
    def test_order_validator_first(self) -> None:
        r = apply_stage2(
            self.ASPECTS,
            self.SENTS,
            self._validator(("DROP_ASPECT", "battery", None)),
            atsa_review=ATSAReview(
                sentiment_review=[SentimentReviewAction(action="flip_polarity", aspect_term="battery")],
                sentence_label="positive",
                confidence=0.8,
            ),
        )
        gone = "no longer an aspect (dropped or renamed earlier in Stage 2)"
        assert r.rejected == [f"atsa flip_polarity aspect_term='battery': {gone}"]

    def _restore(self, *actions: SentimentReviewAction, re_add: bool = True) -> Stage2Result:
        """The validator drops battery and screen; the ATE review re-adds battery (or nothing)."""
        ate = ATEReview(
            aspect_review=[AspectReviewAction(action="add", term="battery")] if re_add else [],
            sentence_label="negative",
            confidence=0.7,
        )
        review = ATSAReview(sentiment_review=list(actions), sentence_label="negative", confidence=0.65)
        return apply_stage2(
            self.ASPECTS,
            self.SENTS,
            self._validator(("DROP_ASPECT", "battery", None), ("DROP_ASPECT", "screen", None)),
            ate_review=ate,
            atsa_review=review,
            sentence=SENTENCE,
        )

    def test_atsa_maintain_restores_a_sentiment_of_a_re_added_aspect(self) -> None:
        r = self._restore(SentimentReviewAction(action="maintain", aspect_term="battery"))
        assert r.sentiments == [sent("battery", "positive", 0.6, (4, 11))]  # Stage 1's polarity and confidence
        assert [(e.kind, e.before, e.after) for e in r.log][-1] == ("ATSA_MAINTAIN", None, "positive")
        assert r.rejected == []

    def test_atsa_flip_restores_a_sentiment_flipped(self) -> None:
        r = self._restore(SentimentReviewAction(action="flip_polarity", aspect_term="battery", confidence=0.9))
        assert r.sentiments == [sent("battery", "negative", 0.9, (4, 11))]
        r = self._restore(SentimentReviewAction(action="flip_polarity", aspect_term="battery", polarity="neutral"))
        assert r.sentiments == [sent("battery", "neutral", 0.6, (4, 11))]

    def test_no_restore_without_the_aspect_or_a_stage1_sentiment(self) -> None:
        r = self._restore(
            SentimentReviewAction(action="maintain", aspect_term="screen"),  # dropped, not re-added
            SentimentReviewAction(action="maintain", aspect_term="hours"),  # never had a sentiment
        )
        assert r.sentiments == []
        assert r.rejected == [
            "atsa maintain aspect_term='screen': no longer an aspect (dropped or renamed earlier in Stage 2)",
            "atsa maintain aspect_term='hours': the aspect has no sentiment",
        ]
        r = self._restore(SentimentReviewAction(action="maintain", aspect_term="battery"), re_add=False)
        assert r.sentiments == []
        assert r.rejected == [
            "atsa maintain aspect_term='battery': no longer an aspect (dropped or renamed earlier in Stage 2)"
        ]

    def test_a_drop_of_a_removed_sentiment_restores_nothing(self) -> None:
        r = self._restore(SentimentReviewAction(action="drop", aspect_term="battery"))
        assert r.sentiments == []
        assert r.rejected == ["atsa drop aspect_term='battery': the aspect has no sentiment"]

    def test_a_restore_takes_the_aspects_spelling_and_add_after_it_is_refused(self) -> None:
        r = self._restore(
            SentimentReviewAction(action="maintain", aspect_term="Battery"),
            SentimentReviewAction(action="add", aspect_term="battery", polarity="negative"),
        )
        assert r.sentiments == [sent("battery", "positive", 0.6, (4, 11))]
        assert r.rejected == ["atsa add aspect_term='battery': the aspect already has a sentiment"]

    def test_no_restore_after_the_reviews_own_drop(self) -> None:
        r = self._restore(
            SentimentReviewAction(action="maintain", aspect_term="battery"),
            SentimentReviewAction(action="drop", aspect_term="battery"),
            SentimentReviewAction(action="flip_polarity", aspect_term="battery"),
        )
        assert r.sentiments == []
        assert r.rejected == ["atsa flip_polarity aspect_term='battery': the aspect has no sentiment"]


# ================================================================================== metrics


def records() -> list[SentenceRecord]:
    return [
        SentenceRecord(
            id="1",
            gold_aspects=[tup("battery", "negative", span=(4, 11)), tup("screen", "positive", span=(20, 26))],
            pred_aspects=[
                tup("Battery", "negative", 0.9, (4, 11)),
                tup("screen", "negative", 0.8, (20, 26)),
                tup("keyboard", "positive", 0.5, (30, 38)),
            ],
            gold_label="mixed",
            pred_label="mixed",
            mapping_stats=MappingStats(turns=6, direct=3, fallback=1, none=2),
            mapping_fail_reasons={"no_aspects": 0, "no_match": 2, "neutral_stance": 2, "fallback_used": 1},
            override_stats=OverrideStats(applied=1, skipped_low_signal=1, skipped_already_confident=1),
        ),
        SentenceRecord(
            id="2",
            gold_aspects=[tup("service", "negative", span=(4, 11))],
            pred_aspects=[tup("the service", "negative", 0.7, (0, 11))],
            gold_label="negative",
            pred_label="negative",
            mapping_stats=MappingStats(turns=3, none=3),
            mapping_fail_reasons={"no_aspects": 3, "no_match": 0, "neutral_stance": 0, "fallback_used": 0},
            override_stats=OverrideStats(),
        ),
        SentenceRecord(id="3", gold_label="positive", pred_label="neutral"),
    ]


@pytest.mark.req("S001-METRICS")
class TestMetrics:
    def test_task_metrics_by_hand(self) -> None:
        m = aggregate(records())
        t = m.task
        # exact terms: 1: {battery, screen} vs {battery, screen, keyboard}; 2: service vs theservice
        assert (t.aspect_term.tp, t.aspect_term.predicted, t.aspect_term.gold) == (2, 4, 3)
        assert (t.aspect_term.precision, t.aspect_term.recall, t.aspect_term.f1) == pytest.approx((0.5, 2 / 3, 4 / 7))
        # overlap: "the service" (0, 11) overlaps "service" (4, 11)
        assert t.aspect_term_overlap.tp == 3
        assert t.aspect_term_overlap.f1 == pytest.approx(6 / 7)
        # pairs: only (battery, negative)
        assert t.aspect_polarity.tp == 1
        assert t.aspect_polarity.f1 == pytest.approx(2 / 7)
        assert t.sentence_accuracy == pytest.approx(2 / 3)
        assert t.sentence_f1 == {"positive": 0.0, "negative": 1.0, "neutral": 0.0, "mixed": 1.0}
        assert t.sentence_macro_f1 == 0.5

    def test_debate_metrics_by_hand(self) -> None:
        m = aggregate(records())
        d = m.debate
        assert (d.sentences, d.turns) == (2, 9)
        assert d.debate_mapping_coverage == pytest.approx(4 / 9)
        rates = (d.debate_mapping_direct_rate, d.debate_mapping_fallback_rate, d.debate_mapping_none_rate)
        assert rates == pytest.approx((3 / 9, 1 / 9, 5 / 9))
        assert d.debate_fail_no_aspects_rate == pytest.approx(3 / 9)
        assert d.debate_fail_no_match_rate == pytest.approx(2 / 9)
        assert d.debate_fail_neutral_stance_rate == pytest.approx(2 / 9)
        assert d.debate_fail_fallback_used_rate == pytest.approx(1 / 9)
        assert (
            d.debate_override_applied,
            d.debate_override_skipped_low_signal,
            d.debate_override_skipped_conflict,
            d.debate_override_skipped_already_confident,
        ) == (1, 1, 0, 1)
        assert d.debate_override_skipped_already_confident_rate == pytest.approx(1 / 3)
        assert [(w.metric, w.level, w.threshold) for w in m.warnings] == [("debate_mapping_coverage", "warn", 0.6)]
        assert str(m.warnings[0]).startswith("[WARN] debate_mapping_coverage = 0.44 < 0.60: few debate turns")
        assert "Tip: " in str(m.warnings[0])
        flat = m.flat()
        assert flat["aspect_polarity_f1"] == pytest.approx(2 / 7) and flat["debate_override_applied"] == 1

    @pytest.mark.parametrize(
        ("field", "value", "expected"),
        [
            ("debate_mapping_coverage", 0.6, None),
            ("debate_mapping_coverage", 0.59, "warn"),
            ("debate_mapping_coverage", 0.4, "warn"),
            ("debate_mapping_coverage", 0.39, "high"),
            ("debate_fail_no_match_rate", 0.3, None),
            ("debate_fail_no_match_rate", 0.31, "warn"),
            ("debate_fail_no_match_rate", 0.51, "high"),
            ("debate_fail_neutral_stance_rate", 1 / 3, None),
            ("debate_fail_neutral_stance_rate", 0.41, "warn"),
            ("debate_fail_neutral_stance_rate", 0.61, "high"),
        ],
    )
    def test_warning_levels(self, field: str, value: float, expected: str | None) -> None:
        base = {
            "debate_mapping_coverage": 1.0,
            "debate_fail_no_match_rate": 0.0,
            "debate_fail_neutral_stance_rate": 0.0,
        }
        w = debate_warnings(DebateMetrics.model_validate({**base, field: value}))
        assert [x.level for x in w] == ([expected] if expected else [])

    def test_thresholds_file_and_empty(self) -> None:
        assert DebateThresholds.load() == DebateThresholds()
        assert debate_warnings(DebateMetrics()) == []
        m = aggregate([SentenceRecord(gold_label="neutral", pred_label="neutral")])
        assert m.task.aspect_term.f1 == 1.0 and m.debate.debate_mapping_coverage is None and m.warnings == []
        assert prf(0, 2, 0).f1 == 0.0 and prf(0, 0, 2).f1 == 0.0

    def test_overlap_is_one_to_one(self) -> None:
        gold = [tup("a", "positive", span=(0, 10)), tup("b", "positive", span=(5, 15))]
        assert overlap_counts(gold, [tup("ab", "positive", span=(0, 15))]) == (1, 1, 2)
        assert overlap_counts([tup("food", "positive")], [tup("Food", "negative", span=(0, 4))]) == (1, 1, 1)
        assert overlap_counts([tup("food", "positive")], [tup("drinks", "negative")]) == (0, 1, 1)
