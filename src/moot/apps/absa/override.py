"""The debate override (seed 001 §5.1): the last step of Stage 2, when ``enable_debate_override``.

For each aspect of ``aspect_hints``, in order:

- ``pos_score`` / ``neg_score``: the summed weights of its hints whose ``polarity_hint`` is
  positive / negative (neutral hints count for neither); ``total = pos + neg``;
- ``total < min_total`` -> ``skipped_low_signal``;
- ``|pos - neg| < min_margin`` -> ``skipped_conflict``;
- otherwise the debate's side is the larger score's polarity, and:
  - the aspect has no sentiment -> one is added (``span`` from ``aspects`` when a Stage 1 aspect
    term of the same normal form has one), with confidence ``min_target_conf``: ``applied``;
  - its sentiment already has that polarity with confidence ``>= min_target_conf`` ->
    ``skipped_already_confident``;
  - else its polarity becomes the debate's side and its confidence ``max(old, min_target_conf)``:
    ``applied`` (this includes a sentiment of the right polarity but low confidence, which is
    only raised).

Every ``applied`` aspect gets one ``DEBATE_OVERRIDE`` log entry. Aspects are matched to sentiments
by normal form (:func:`moot.apps.absa.mapping.normalize`); when several sentiments share an
aspect's normal form, all of them are treated alike and the outcome is that of the first. All
comparisons are made on values rounded to 9 decimals, so that 0.8 + 0.8 is 1.6.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from moot.apps.absa.mapping import normalize
from moot.apps.absa.types import (
    AspectHint,
    AspectSentiment,
    AspectTerm,
    CorrectionLogEntry,
    OverrideOutcome,
    OverrideResult,
    OverrideStats,
    OverrideThresholds,
    Polarity,
)

DIGITS = 9


def scores(hints: Sequence[AspectHint]) -> tuple[float, float]:
    """``(pos_score, neg_score)`` of one aspect's hints."""
    pos = sum(h.weight for h in hints if h.polarity_hint == "positive")
    neg = sum(h.weight for h in hints if h.polarity_hint == "negative")
    return round(pos, DIGITS), round(neg, DIGITS)


def apply_debate_override(
    sentiments: Sequence[AspectSentiment],
    aspect_hints: Mapping[str, Sequence[AspectHint]],
    thresholds: OverrideThresholds | None = None,
    aspects: Sequence[AspectTerm] = (),
) -> OverrideResult:
    """Apply the override (see the module's rules). The input sentiments are not modified."""
    th = thresholds or OverrideThresholds()
    out = [s.model_copy() for s in sentiments]
    stats = OverrideStats()
    outcomes: list[OverrideOutcome] = []
    log: list[CorrectionLogEntry] = []
    min_total, min_margin, target = (round(v, DIGITS) for v in (th.min_total, th.min_margin, th.min_target_conf))

    for term, hints in aspect_hints.items():
        pos, neg = scores(hints)
        total, margin = round(pos + neg, DIGITS), round(abs(pos - neg), DIGITS)
        norm = normalize(term)
        matched = [i for i, s in enumerate(out) if normalize(s.aspect_term) == norm]
        first = out[matched[0]] if matched else None
        outcome = OverrideOutcome(
            aspect_term=term,
            status="skipped_low_signal",
            pos_score=pos,
            neg_score=neg,
            before=first.polarity if first else None,
            after=first.polarity if first else None,
            confidence_before=first.confidence if first else None,
            confidence_after=first.confidence if first else None,
        )
        if total < min_total:
            pass
        elif margin < min_margin:
            outcome.status = "skipped_conflict"
        else:
            side: Polarity = "positive" if pos > neg else "negative"
            outcome.debate_polarity = side
            reason = f"debate pos={pos:g} neg={neg:g} (total {total:g}, margin {margin:g}) -> {side}"
            if first is None:
                span = next((a.span for a in aspects if normalize(a.term) == norm and a.span is not None), None)
                out.append(AspectSentiment(aspect_term=term, span=span, polarity=side, confidence=target))
                outcome.status = "applied"
                outcome.after, outcome.confidence_after = side, target
                log.append(
                    CorrectionLogEntry(
                        kind="DEBATE_OVERRIDE", aspect_term=term, before=None, after=side, reason=f"{reason}; added"
                    )
                )
            elif first.polarity == side and round(first.confidence, DIGITS) >= target:
                outcome.status = "skipped_already_confident"
            else:
                new_conf = max(first.confidence, target)
                for i in matched:
                    out[i] = out[i].model_copy(update={"polarity": side, "confidence": max(out[i].confidence, target)})
                outcome.status = "applied"
                outcome.after, outcome.confidence_after = side, new_conf
                log.append(
                    CorrectionLogEntry(
                        kind="DEBATE_OVERRIDE",
                        aspect_term=term,
                        before=first.polarity,
                        after=side,
                        reason=f"{reason}; confidence {first.confidence:g} -> {new_conf:g}",
                    )
                )
        setattr(stats, outcome.status, getattr(stats, outcome.status) + 1)
        outcomes.append(outcome)
    return OverrideResult(sentiments=out, outcomes=outcomes, stats=stats, log=log)
