"""The moderator (seed 001 §6): a deterministic, rule-based decision of the sentence label. No LLM.

The rules run in this order; each reads the ``final_label`` / ``confidence`` the earlier ones left.
"ATE" below means the sentence label and confidence of a stage's ATE; the *candidate ATSA* is the
ATSA of the selected stage (Stage 2's when Rule B selected Stage 2 and there is a Stage 2 ATSA,
else Stage 1's).

====  =================================================================================================
Rule  Condition -> action (rationale)
====  =================================================================================================
Z     Stage 1 ATE confidence is 0 and Stage 2 ATE confidence is 0 -> ``neutral``, confidence 0, stop
      ("RuleZ: insufficient signal (both confidences 0)."). **Choice:** a missing Stage 2 carries no
      signal, so it counts as confidence 0: with no Stage 2, Rule Z fires on Stage 1 ATE confidence 0
      alone. Rule Z still returns ``final_aspects``; the selected stage is ``stage1``.
B     No Stage 2 -> keep Stage 1 (no rationale; Rule B is not listed as applied). Stage 2 present:
      ``stage1 - stage2 >= 0.2`` (``DROP_GUARD``) -> keep Stage 1, ``drop_guard`` set, flag
      ``stage2_rejected_due_to_confidence`` ("RuleB: Stage2 drop>=0.2; keep Stage1."); else Stage 2
      ("RuleB: Stage2 preferred."). The kept stage's ATE label and confidence become the current ones.
M     Stage 2 present and Stage 1 ATE label != Stage 2 ATE label -> ``mixed``, confidence
      ``max(stage1, stage2)`` ("RuleM: conflicting stage1/stage2 labels -> mixed."). As the seed
      says, this holds under the drop guard too.
C     Validator has a ``suggested_label`` and (a critical issue, or validator confidence ``>=``
      current confidence) -> the suggested label, confidence ``max(current, validator)``, flag
      ``validator_override_applied`` ("RuleC: Validator critical veto.", for both paths, as in the
      seed). Critical: an issue of type negation, irony or contrast, or of severity high (sarcasm and
      comparison are critical only when high). Fires even when the suggested label is the current
      one (it may then only raise the confidence).
A     Not ``drop_guard``, both spans known, ``IoU(candidate ATSA span, Stage 1 ATSA span) >= 0.8``
      and candidate ATSA label == current label -> confidence = the mean of the current confidence
      and the candidate ATSA's ("RuleA: IoU>=0.8 span aligned."). With Stage 1 selected the candidate
      is Stage 1's ATSA itself (IoU 1 when it has a span).
D     Current label != candidate ATSA label: ``|current - candidate| < 0.1`` -> keep the current
      ("sentence ATE") label and confidence ("RuleD: diff<0.1 conflict -> sentence ATE."); else the
      more confident side's label and confidence ("RuleD: diff>=0.1 ATSA wins." /
      "RuleD: diff>=0.1 ATE wins."). Any Rule D decision sets ``confidence_margin_used``.
E     A label inferred from the debate summary (:func:`infer_label_from_debate`), different from the
      current one, and (confidence ``< 0.55`` or current label ``mixed``) -> the inferred label,
      confidence unchanged ("RuleE: debate consensus -> {inferred}.").
====  =================================================================================================

Every comparison is made on values rounded to 9 decimals (0.8 - 0.6 is 0.2 and passes the drop
guard); confidences written by the rules are rounded the same way. ``rationale`` is the fired
rules' rationale strings in order, joined by a space (empty when no rule fired); ``applied_rules``
their names (``"Z"``, ``"B"``, ...). ``final_aspects`` is a copy of ``final_aspect_sentiments``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from moot.apps.absa.types import (
    SENTENCE_LABELS,
    ArbiterFlags,
    ModeratorInput,
    ModeratorOutput,
    SentenceLabel,
    Span,
    StageSignal,
    ValidatorOutput,
)

DIGITS = 9
#: Rule B: Stage 2 is rejected when its ATE confidence is this much below Stage 1's.
DROP_GUARD = 0.2
#: Rule A: span IoU from which the candidate ATSA is aligned with Stage 1's.
IOU_ALIGNED = 0.8
#: Rule D: below this confidence difference the sentence ATE label wins a conflict.
TIE_MARGIN = 0.1
#: Rule E: the debate's label may replace a current label less confident than this (or mixed).
DEBATE_CONF = 0.55
#: Rule C: issue types that make a validator veto critical (as does severity "high").
CRITICAL_TYPES = frozenset({"negation", "irony", "contrast"})

#: Rule E: keywords per label, checked in this order (the seed's lists).
DEBATE_KEYWORDS: tuple[tuple[SentenceLabel, tuple[str, ...]], ...] = (
    ("mixed", ("혼합", "mixed", "엇갈", "양면")),
    ("positive", ("긍정", "호의", "좋다", "positive")),
    ("negative", ("부정", "비판", "나쁘", "negative")),
    ("neutral", ("중립", "neutral", "모호")),
)
#: Rule E: the summary fields whose text is searched, in this order.
DEBATE_TEXT_FIELDS = ("consensus", "rationale", "key_agreements", "key_disagreements")

RATIONALE_Z = "RuleZ: insufficient signal (both confidences 0)."
RATIONALE_B_DROP = "RuleB: Stage2 drop>=0.2; keep Stage1."
RATIONALE_B_STAGE2 = "RuleB: Stage2 preferred."
RATIONALE_M = "RuleM: conflicting stage1/stage2 labels -> mixed."
RATIONALE_C = "RuleC: Validator critical veto."
RATIONALE_A = "RuleA: IoU>=0.8 span aligned."
RATIONALE_D_TIE = "RuleD: diff<0.1 conflict -> sentence ATE."
RATIONALE_D_ATSA = "RuleD: diff>=0.1 ATSA wins."
RATIONALE_D_ATE = "RuleD: diff>=0.1 ATE wins."
RATIONALE_E = "RuleE: debate consensus -> {inferred}."


def _r(x: float) -> float:
    return round(x, DIGITS)


def span_iou(a: Span | None, b: Span | None) -> float:
    """Intersection over union of two character spans ``(start, end)``, end exclusive. 0 when either
    is missing; two equal empty spans are 1, two different empty spans 0."""
    if a is None or b is None:
        return 0.0
    inter = max(0, min(a[1], b[1]) - max(a[0], b[0]))
    union = (a[1] - a[0]) + (b[1] - b[0]) - inter
    if union == 0:
        return 1.0 if a == b else 0.0
    return inter / union


def is_critical(validator: ValidatorOutput) -> bool:
    """Rule C's critical risk: a negation, irony or contrast issue, or any issue of severity high."""
    return any(i.type in CRITICAL_TYPES or i.severity == "high" for i in validator.issues)


def _texts(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _texts(v)


def infer_label_from_keywords(text: str) -> SentenceLabel | None:
    """The first label (order mixed, positive, negative, neutral) one of whose keywords is a
    substring of the lower-cased text."""
    low = text.lower()
    for label, words in DEBATE_KEYWORDS:
        if any(w in low for w in words):
            return label
    return None


def infer_label_from_debate(summary: Mapping[str, Any] | None) -> SentenceLabel | None:
    """Rule E's label from a debate judge summary (either variant, as a dict).

    The patch judge's ``sentence_polarity``, when it is one of the four labels, is the answer.
    Otherwise the text of ``consensus``, ``rationale``, ``key_agreements`` and
    ``key_disagreements`` (whichever exist, strings or lists of strings) is searched with the
    seed's keywords (:data:`DEBATE_KEYWORDS`, substrings, case-insensitive), labels in the order
    mixed, positive, negative, neutral: the first label with any keyword anywhere in the text wins.
    """
    if not summary:
        return None
    sp = summary.get("sentence_polarity")
    if isinstance(sp, str) and sp.strip().lower() in SENTENCE_LABELS:
        return sp.strip().lower()  # type: ignore[return-value]
    text = "\n".join(t for f in DEBATE_TEXT_FIELDS for t in _texts(summary.get(f)))
    return infer_label_from_keywords(text)


def moderate(inp: ModeratorInput) -> ModeratorOutput:
    """Decide the sentence label by rules Z, B, M, C, A, D, E (see the module's table)."""
    s1_ate, s1_atsa, s2_ate = inp.stage1_ate, inp.stage1_atsa, inp.stage2_ate
    flags = ArbiterFlags()
    rules: list[str] = []
    why: list[str] = []
    aspects = [s.model_copy() for s in inp.final_aspect_sentiments]

    def fired(rule: str, rationale: str) -> None:
        rules.append(rule)
        why.append(rationale)

    # Rule Z
    if _r(s1_ate.confidence) == 0 and (s2_ate is None or _r(s2_ate.confidence) == 0):
        fired("Z", RATIONALE_Z)
        return ModeratorOutput(
            final_label="neutral",
            confidence=0.0,
            rationale=" ".join(why),
            selected_stage="stage1",
            applied_rules=rules,
            arbiter_flags=flags,
            final_aspects=aspects,
        )

    # Rule B
    drop_guard = False
    label: SentenceLabel = s1_ate.label
    conf = _r(s1_ate.confidence)
    stage2_selected = False
    if s2_ate is not None:
        if _r(s1_ate.confidence - s2_ate.confidence) >= DROP_GUARD:
            drop_guard = True
            flags.stage2_rejected_due_to_confidence = True
            fired("B", RATIONALE_B_DROP)
        else:
            stage2_selected = True
            label, conf = s2_ate.label, _r(s2_ate.confidence)
            fired("B", RATIONALE_B_STAGE2)

    # Rule M
    if s2_ate is not None and s1_ate.label != s2_ate.label:
        label, conf = "mixed", _r(max(s1_ate.confidence, s2_ate.confidence))
        fired("M", RATIONALE_M)

    # Rule C
    v = inp.validator
    if v is not None and v.suggested_label is not None and (is_critical(v) or _r(v.confidence) >= conf):
        label, conf = v.suggested_label, _r(max(conf, v.confidence))
        flags.validator_override_applied = True
        fired("C", RATIONALE_C)

    candidate: StageSignal = inp.stage2_atsa if stage2_selected and inp.stage2_atsa is not None else s1_atsa

    # Rule A
    if (
        not drop_guard
        and candidate.span is not None
        and s1_atsa.span is not None
        and _r(span_iou(candidate.span, s1_atsa.span)) >= IOU_ALIGNED
        and candidate.label == label
    ):
        conf = _r((conf + candidate.confidence) / 2)
        fired("A", RATIONALE_A)

    # Rule D
    if label != candidate.label:
        flags.confidence_margin_used = True
        if _r(abs(conf - candidate.confidence)) < TIE_MARGIN:
            fired("D", RATIONALE_D_TIE)
        elif _r(candidate.confidence) > conf:
            label, conf = candidate.label, _r(candidate.confidence)
            fired("D", RATIONALE_D_ATSA)
        else:
            fired("D", RATIONALE_D_ATE)

    # Rule E
    inferred = infer_label_from_debate(inp.debate_summary)
    if inferred is not None and inferred != label and (conf < DEBATE_CONF or label == "mixed"):
        label = inferred
        fired("E", RATIONALE_E.format(inferred=inferred))

    return ModeratorOutput(
        final_label=label,
        confidence=conf,
        rationale=" ".join(why),
        selected_stage="stage2" if stage2_selected else "stage1",
        applied_rules=rules,
        arbiter_flags=flags,
        final_aspects=aspects,
    )
