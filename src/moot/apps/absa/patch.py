"""Deterministic edits of the aspects: the patch debate's edits (seed 002), the checks of its judge's
output, its history lines, and the Stage 2 reviews in the seed's order (seed 001 §5 steps 1-3).

**Patch edits** (:func:`apply_patch`), applied in order to a list of :class:`AspectTuple`. A
``target`` must be a known aspect: by default the tuples' own terms, or ``aspect_terms`` (the Stage 1
terms) when given, matched by normal form (:func:`moot.apps.absa.mapping.normalize`). An edit whose
target is unknown, or whose tuple an earlier edit removed, is rejected with a reason and changes
nothing. Nothing is ever applied silently: every change is a :class:`CorrectionLogEntry` of kind
the op upper-cased.

- ``set_polarity``: the polarity is ``value`` (else the edit's ``polarity``); not a polarity ->
  rejected. The confidence becomes the edit's when it has one. Same polarity and confidence: no change.
- ``set_aspect_ref``: realign the tuple to another known aspect term, ``value`` (else the edit's
  ``aspect_term``); an unknown or missing ref -> rejected. If that term already has a tuple the two
  are merged as by a ``merge_tuples`` whose target is that existing tuple.
- ``merge_tuples``: ``value`` names the other tuple; the target's tuple stays (its term, its span or
  else the other's), with the polarity and confidence of the more confident of the two (the target's
  on a tie; a missing confidence counts as 0), and the other tuple is removed.
- ``drop_tuple``: the tuple is removed.
- ``confirm_tuple``: nothing changes but the confidence, raised to ``max(old, edit.confidence)``;
  logged only when it rises.

**Judge checks.** Every ``sentence_evidence_spans`` entry (and ``aspect_evidence`` value) must be an
exact, non-blank substring of the sentence; a summary with no valid evidence span is a failure the
pipeline must repair (ask again) or report, never accept. :func:`realign_span` offers a
deterministic repair: the sentence's own text when the span differs from it only in case or
whitespace.

**Stage 2** (:func:`apply_stage2`), in the seed's order: the validator's correction proposals, the
ATE aspect review, the ATSA sentiment review (the debate override is
:func:`moot.apps.absa.override.apply_debate_override`). Targets match by normal form; an unknown
target is rejected with a reason.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from moot.apps.absa.mapping import normalize
from moot.apps.absa.types import (
    POLARITIES,
    AspectReviewAction,
    AspectSentiment,
    AspectTerm,
    AspectTuple,
    ATEReview,
    ATSAReview,
    CorrectionLogEntry,
    CorrectionProposal,
    PatchJudgeSummary,
    PatchTurn,
    Polarity,
    ProposedEdit,
    SentimentReviewAction,
    Span,
    Stage2Result,
    ValidatorOutput,
)

OPPOSITE: dict[Polarity, Polarity] = {"positive": "negative", "negative": "positive"}


def _polarity(*values: str | None) -> Polarity | None:
    for v in values:
        if v is not None and (p := v.strip().lower()) in POLARITIES:
            return p
    return None


def _conf(c: float | None) -> float:
    return 0.0 if c is None else c


def _find(tuples: Sequence[AspectTuple], term: str) -> int | None:
    norm = normalize(term)
    return next((i for i, t in enumerate(tuples) if normalize(t.aspect_term) == norm), None)


# ----------------------------------------------------------------------------------- patch edits


def _merge(keep: AspectTuple, other: AspectTuple) -> AspectTuple:
    best = other if _conf(other.confidence) > _conf(keep.confidence) else keep
    return keep.model_copy(
        update={
            "polarity": best.polarity,
            "confidence": best.confidence,
            "span": keep.span if keep.span is not None else other.span,
        }
    )


def apply_patch(
    tuples: Sequence[AspectTuple], edits: Sequence[ProposedEdit], aspect_terms: Sequence[str] | None = None
) -> tuple[list[AspectTuple], list[CorrectionLogEntry], list[str]]:
    """Apply ``edits`` in order (see the module's rules): ``(tuples, log, rejected)``. The input is
    not modified."""
    out = [t.model_copy() for t in tuples]
    vocabulary = list(aspect_terms) if aspect_terms is not None else [t.aspect_term for t in tuples]
    known = {normalize(t): t for t in vocabulary}
    log: list[CorrectionLogEntry] = []
    rejected: list[str] = []

    def reject(e: ProposedEdit, why: str) -> None:
        rejected.append(f"{e.op} target={e.target!r}: {why}")

    for e in edits:
        kind = e.op.upper()
        if normalize(e.target) not in known:
            reject(e, "unknown target (not a Stage 1 aspect term)")
            continue
        i = _find(out, e.target)
        if i is None:
            had = _find(tuples, e.target) is not None
            reject(e, "no tuple for this target" + (" (removed by an earlier edit)" if had else ""))
            continue
        cur = out[i]
        why = f"{e.op} by patch" + (f"; evidence: {e.evidence}" if e.evidence else "")
        if e.op == "set_polarity":
            p = _polarity(e.value, e.polarity)
            if p is None:
                reject(e, f"value {e.value!r} is not a polarity")
                continue
            conf = e.confidence if e.confidence is not None else cur.confidence
            if p != cur.polarity or conf != cur.confidence:
                out[i] = cur.model_copy(update={"polarity": p, "confidence": conf})
                log.append(
                    CorrectionLogEntry(kind=kind, aspect_term=cur.aspect_term, before=cur.polarity, after=p, reason=why)
                )
        elif e.op in ("set_aspect_ref", "merge_tuples"):
            ref = e.value if e.op == "merge_tuples" else (e.value or e.aspect_term)
            if not ref or normalize(ref) not in known:
                reject(e, f"value {ref!r} is not a Stage 1 aspect term")
                continue
            if normalize(ref) == normalize(cur.aspect_term):
                reject(e, "value names the target itself")
                continue
            j = _find(out, ref)
            if e.op == "merge_tuples" and j is None:
                reject(e, f"no tuple for {ref!r} to merge")
                continue
            if e.op == "set_aspect_ref":
                new_term = known[normalize(ref)]
                renamed = cur.model_copy(update={"aspect_term": new_term})
                if j is None:
                    out[i] = renamed
                else:
                    out[j] = _merge(out[j], renamed)
                    del out[i]
                    why += "; merged into the existing tuple"
                log.append(
                    CorrectionLogEntry(
                        kind=kind, aspect_term=cur.aspect_term, before=cur.aspect_term, after=new_term, reason=why
                    )
                )
            else:
                assert j is not None
                other = out[j]
                merged = _merge(cur, other)
                out[i] = merged
                del out[j]
                log.append(
                    CorrectionLogEntry(
                        kind=kind,
                        aspect_term=cur.aspect_term,
                        before=f"{cur.polarity} + {other.aspect_term}:{other.polarity}",
                        after=merged.polarity,
                        reason=why,
                    )
                )
        elif e.op == "drop_tuple":
            del out[i]
            log.append(
                CorrectionLogEntry(kind=kind, aspect_term=cur.aspect_term, before=cur.polarity, after=None, reason=why)
            )
        else:  # confirm_tuple
            if e.confidence is not None and e.confidence > _conf(cur.confidence):
                out[i] = cur.model_copy(update={"confidence": e.confidence})
                log.append(
                    CorrectionLogEntry(
                        kind=kind,
                        aspect_term=cur.aspect_term,
                        before=cur.polarity,
                        after=cur.polarity,
                        reason=f"{why}; confidence {cur.confidence} -> {e.confidence}",
                    )
                )
    return out, log, rejected


# ---------------------------------------------------------------------------------- judge checks


def validate_evidence_spans(sentence: str, spans: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(valid, invalid)``: a span is valid when it is a non-blank, exact substring of ``sentence``."""
    valid: list[str] = []
    invalid: list[str] = []
    for s in spans:
        (valid if s.strip() and s in sentence else invalid).append(s)
    return valid, invalid


def realign_span(sentence: str, span: str) -> str | None:
    """The part of ``sentence`` that ``span`` quotes up to case and whitespace (runs of whitespace
    match any run; leading and trailing whitespace ignored), as it is written in the sentence;
    None when there is none. The result is always an exact substring of the sentence."""
    words = span.split()
    if not words:
        return None
    m = re.search(r"\s+".join(map(re.escape, words)), sentence, flags=re.IGNORECASE)
    return m.group(0) if m else None


def check_judge_summary(
    sentence: str, summary: PatchJudgeSummary, aspect_terms: Sequence[str] | None = None
) -> list[str]:
    """What is wrong with a patch judge's summary, one message each; empty: nothing.

    - every ``sentence_evidence_spans`` entry that is not an exact substring of the sentence, and
      ``no valid sentence_evidence_spans`` when none is (the failure the pipeline must repair or
      report);
    - every ``aspect_evidence`` value that is not an exact substring;
    - an aspect with several polarities in ``final_tuples`` (the judge owes one per aspect);
    - with ``aspect_terms``: ``final_tuples`` aspects and ``final_patch`` targets that are not
      Stage 1 aspect terms.
    """
    problems: list[str] = []
    valid, _ = validate_evidence_spans(sentence, summary.sentence_evidence_spans)
    for k, s in enumerate(summary.sentence_evidence_spans):
        if s not in valid:
            problems.append(f"sentence_evidence_spans[{k}] {s!r} is not an exact substring of the sentence")
    if not valid:
        problems.append("no valid sentence_evidence_spans: at least one exact substring of the sentence is required")
    for aspect, ev in (summary.aspect_evidence or {}).items():
        if not (ev.strip() and ev in sentence):
            problems.append(f"aspect_evidence[{aspect!r}] {ev!r} is not an exact substring of the sentence")
    by_aspect: dict[str, list[str]] = {}
    names: dict[str, str] = {}
    for t in summary.final_tuples:
        n = normalize(t.aspect_term)
        names.setdefault(n, t.aspect_term)
        if t.polarity not in by_aspect.setdefault(n, []):
            by_aspect[n].append(t.polarity)
    for n, pols in by_aspect.items():
        if len(pols) > 1:
            problems.append(f"aspect {names[n]!r} has conflicting polarities in final_tuples: {', '.join(pols)}")
    if aspect_terms is not None:
        known = {normalize(t) for t in aspect_terms}
        for t in summary.final_tuples:
            if normalize(t.aspect_term) not in known:
                problems.append(f"final_tuples aspect {t.aspect_term!r} is not a Stage 1 aspect term")
        for e in summary.final_patch:
            if normalize(e.target) not in known:
                problems.append(f"final_patch {e.op} target {e.target!r} is not a Stage 1 aspect term")
    return problems


# --------------------------------------------------------------------------------------- history


def _field(v: str | None) -> str:
    return "null" if v is None else " ".join(v.split())


def format_history(turns: Sequence[PatchTurn]) -> str:
    """The seed's history: one ``- agent: op target=... value=... evidence=...`` line per edit, in
    order. A missing value or evidence is written ``null``; line breaks inside a field become
    spaces (one edit, one line); a turn without edits is ``- agent: (no edits)``."""
    lines: list[str] = []
    for turn in turns:
        if not turn.proposed_edits:
            lines.append(f"- {turn.agent}: (no edits)")
        for e in turn.proposed_edits:
            fields = f"target={_field(e.target)} value={_field(e.value)} evidence={_field(e.evidence)}"
            lines.append(f"- {turn.agent}: {e.op} {fields}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------- Stage 2


def _locate(sentence: str | None, term: str) -> Span | None:
    if sentence is None:
        return None
    k = sentence.find(term)
    return (k, k + len(term)) if k >= 0 else None


class _Aspects:
    """The working state of Stage 2: ATE's aspects and the sentiments, changed together."""

    def __init__(self, aspects: Sequence[AspectTerm], sentiments: Sequence[AspectSentiment], sentence: str | None):
        self.aspects = [a.model_copy() for a in aspects]
        self.sentiments = [s.model_copy() for s in sentiments]
        self.stage1 = [s.model_copy() for s in sentiments]
        self.review_dropped: set[str] = set()  # sentiments the ATSA review itself dropped
        self.sentence = sentence
        self.log: list[CorrectionLogEntry] = []
        self.rejected: list[str] = []

    def known(self, term: str) -> bool:
        n = normalize(term)
        return any(normalize(a.term) == n for a in self.aspects) or self.has_sentiment(term)

    def has_sentiment(self, term: str) -> bool:
        n = normalize(term)
        return any(normalize(s.aspect_term) == n for s in self.sentiments)

    def in_sentence(self, term: str) -> bool:
        return self.sentence is None or normalize(term) in normalize(self.sentence)

    def note(self, kind: str, term: str, before: str | None, after: str | None, reason: str) -> None:
        self.log.append(CorrectionLogEntry(kind=kind, aspect_term=term, before=before, after=after, reason=reason))

    def drop(self, term: str, aspects: bool = True) -> None:
        n = normalize(term)
        if aspects:
            self.aspects = [a for a in self.aspects if normalize(a.term) != n]
        self.sentiments = [s for s in self.sentiments if normalize(s.aspect_term) != n]

    def rename(self, term: str, new_term: str, span: Span | None) -> None:
        n = normalize(term)
        self.aspects = [
            a.model_copy(update={"term": new_term, "span": span}) if normalize(a.term) == n else a for a in self.aspects
        ]
        self.sentiments = [
            s.model_copy(update={"aspect_term": new_term, "span": span}) if normalize(s.aspect_term) == n else s
            for s in self.sentiments
        ]

    def span_of(self, term: str) -> Span | None:
        n = normalize(term)
        found = next((a.span for a in self.aspects if normalize(a.term) == n and a.span is not None), None)
        return found if found is not None else _locate(self.sentence, term)

    def set_polarity(self, term: str, polarity: Polarity, confidence: float | None) -> Polarity:
        n = normalize(term)
        before = next(s.polarity for s in self.sentiments if normalize(s.aspect_term) == n)
        update: dict[str, object] = {"polarity": polarity}
        if confidence is not None:
            update["confidence"] = confidence
        self.sentiments = [s.model_copy(update=update) if normalize(s.aspect_term) == n else s for s in self.sentiments]
        return before

    def first_sentiment(self, term: str) -> AspectSentiment:
        n = normalize(term)
        return next(s for s in self.sentiments if normalize(s.aspect_term) == n)

    def aspect_term(self, term: str) -> str | None:
        """The aspect ``term`` names (its spelling), if it is one."""
        n = normalize(term)
        return next((a.term for a in self.aspects if normalize(a.term) == n), None)

    def stage1_sentiment(self, term: str) -> AspectSentiment | None:
        n = normalize(term)
        return next((s for s in self.stage1 if normalize(s.aspect_term) == n), None)


def _validator(st: _Aspects, p: CorrectionProposal) -> None:
    where = f"validator {p.op} aspect_term={p.aspect_term!r}"
    reason = p.reason or f"validator {p.op}"
    if not st.known(p.aspect_term):
        st.rejected.append(f"{where}: unknown aspect")
        return
    if p.op == "FLIP_POLARITY":
        if not st.has_sentiment(p.aspect_term):
            st.rejected.append(f"{where}: the aspect has no sentiment")
            return
        old = st.first_sentiment(p.aspect_term).polarity
        new = _polarity(p.value) or OPPOSITE.get(old)
        if new is None:
            st.rejected.append(f"{where}: a neutral polarity flips only to a value given ({p.value!r} is none)")
            return
        st.set_polarity(p.aspect_term, new, None)
        st.note("FLIP_POLARITY", p.aspect_term, old, new, reason)
    elif p.op == "DROP_ASPECT":
        st.drop(p.aspect_term)
        st.note("DROP_ASPECT", p.aspect_term, p.aspect_term, None, reason)
    else:  # REVISE_SPAN
        if not p.value or not p.value.strip():
            st.rejected.append(f"{where}: no revised term given")
            return
        st.rename(p.aspect_term, p.value, _locate(st.sentence, p.value))
        st.note("REVISE_SPAN", p.aspect_term, p.aspect_term, p.value, reason)


def _ate(st: _Aspects, a: AspectReviewAction, confidence: float) -> None:
    where = f"ate {a.action} term={a.term!r}"
    if a.action == "add":
        if st.known(a.term):
            st.rejected.append(f"{where}: already an aspect")
        elif not st.in_sentence(a.term):
            st.rejected.append(f"{where}: not in the sentence")
        else:
            span = a.span if a.span is not None else _locate(st.sentence, a.term)
            st.aspects.append(AspectTerm(term=a.term, span=span, confidence=confidence))
            st.note("ATE_ADD", a.term, None, a.term, "Stage 2 ATE review")
        return
    if not st.known(a.term):
        st.rejected.append(f"{where}: unknown aspect")
    elif a.action == "drop":
        st.drop(a.term)
        st.note("ATE_DROP", a.term, a.term, None, "Stage 2 ATE review")
    elif a.new_term is None and a.span is None:
        st.rejected.append(f"{where}: revise_span needs new_term or span")
    else:
        new_term = a.new_term or a.term
        if a.span is not None:
            span = a.span
        elif a.new_term is not None:
            span = _locate(st.sentence, new_term)
        else:
            span = st.span_of(a.term)
        st.rename(a.term, new_term, span)
        st.note(
            "ATE_REVISE_SPAN",
            a.term,
            a.term,
            new_term if span is None else f"{new_term} {list(span)}",
            "Stage 2 ATE review",
        )


def _atsa(st: _Aspects, a: SentimentReviewAction, confidence: float) -> None:
    where = f"atsa {a.action} aspect_term={a.aspect_term!r}"
    if a.action == "add":
        if st.has_sentiment(a.aspect_term):
            st.rejected.append(f"{where}: the aspect already has a sentiment")
        elif a.polarity is None:
            st.rejected.append(f"{where}: add needs a polarity")
        elif not st.known(a.aspect_term) and not st.in_sentence(a.aspect_term):
            st.rejected.append(f"{where}: not in the sentence")
        else:
            conf = a.confidence if a.confidence is not None else confidence
            st.sentiments.append(
                AspectSentiment(
                    aspect_term=a.aspect_term, span=st.span_of(a.aspect_term), polarity=a.polarity, confidence=conf
                )
            )
            st.note("ATSA_ADD", a.aspect_term, None, a.polarity, "Stage 2 ATSA review")
        return
    if not st.has_sentiment(a.aspect_term):
        if a.action == "drop":
            st.rejected.append(f"{where}: the aspect has no sentiment")
        else:
            _restore(st, a, where)
        return
    cur = st.first_sentiment(a.aspect_term)
    if a.action == "drop":
        st.drop(a.aspect_term, aspects=False)
        st.review_dropped.add(normalize(a.aspect_term))
        st.note("ATSA_DROP", a.aspect_term, cur.polarity, None, "Stage 2 ATSA review")
    elif a.action == "maintain":
        if a.confidence is not None and a.confidence != cur.confidence:
            st.set_polarity(a.aspect_term, cur.polarity, a.confidence)
            st.note(
                "ATSA_MAINTAIN",
                a.aspect_term,
                cur.polarity,
                cur.polarity,
                f"Stage 2 ATSA review; confidence {cur.confidence:g} -> {a.confidence:g}",
            )
    else:  # flip_polarity
        new = _reviewed_polarity(st, a, cur.polarity, where)
        if new is None:
            return
        st.set_polarity(a.aspect_term, new, a.confidence)
        st.note("ATSA_FLIP_POLARITY", a.aspect_term, cur.polarity, new, "Stage 2 ATSA review")


def _reviewed_polarity(st: _Aspects, a: SentimentReviewAction, current: Polarity, where: str) -> Polarity | None:
    """What an ATSA ``flip_polarity`` turns ``current`` into: the polarity given, else the
    opposite; None (and the rejection noted) for a neutral one without a polarity given."""
    new = a.polarity or OPPOSITE.get(current)
    if new is None:
        st.rejected.append(f"{where}: a neutral polarity flips only to a polarity given")
    return new


def _restore(st: _Aspects, a: SentimentReviewAction, where: str) -> None:
    """``maintain`` / ``flip_polarity`` of a Stage 1 sentiment an earlier step removed (a validator
    ``DROP_ASPECT``, an ATE ``drop``) while the aspect is an aspect again (the ATE review kept
    or re-added it): the ATSA review reviews Stage 1's sentiments, so its verdict restores the
    sentiment, kept or flipped. Without the aspect, without a Stage 1 sentiment, or after this
    review's own ``drop`` of it, it is rejected."""
    old = st.stage1_sentiment(a.aspect_term)
    if old is None or normalize(a.aspect_term) in st.review_dropped:
        st.rejected.append(f"{where}: the aspect has no sentiment")
        return
    term = st.aspect_term(a.aspect_term)  # the aspect's spelling, not the review's
    if term is None:
        st.rejected.append(f"{where}: no longer an aspect (dropped or renamed earlier in Stage 2)")
        return
    new = old.polarity if a.action == "maintain" else _reviewed_polarity(st, a, old.polarity, where)
    if new is None:
        return
    conf = a.confidence if a.confidence is not None else old.confidence
    st.sentiments.append(
        old.model_copy(update={"aspect_term": term, "span": st.span_of(term), "polarity": new, "confidence": conf})
    )
    kind = "ATSA_MAINTAIN" if a.action == "maintain" else "ATSA_FLIP_POLARITY"
    st.note(kind, a.aspect_term, None, new, "Stage 2 ATSA review; restores the Stage 1 sentiment")


def apply_stage2(
    aspects: Sequence[AspectTerm],
    sentiments: Sequence[AspectSentiment],
    validator: ValidatorOutput | None = None,
    ate_review: ATEReview | None = None,
    atsa_review: ATSAReview | None = None,
    sentence: str | None = None,
) -> Stage2Result:
    """Seed 001 §5 steps 1-3 on Stage 1's aspects and sentiments, in order:

    1. validator ``correction_proposals``: ``FLIP_POLARITY`` (to ``value`` if it is a polarity,
       else positive <-> negative; a neutral sentiment without a value is rejected),
       ``DROP_ASPECT`` (the aspect and its sentiments), ``REVISE_SPAN`` (``value`` is the revised
       term: aspect and sentiments renamed, span located in the sentence or None);
    2. ATE ``aspect_review``: ``revise_span`` (rename to ``new_term`` and/or set ``span``; a span
       not given is located in the sentence for a new term, kept otherwise), ``drop`` (the aspect
       and its sentiments), ``add`` (a new aspect with the review's confidence; not when it
       already is one, nor when a sentence is given that does not contain it);
    3. ATSA ``sentiment_review``: ``maintain`` (only the confidence, when given, changes),
       ``flip_polarity`` (to ``polarity``, else positive <-> negative; confidence when given),
       ``drop`` (the sentiments only), ``add`` (needs a polarity; confidence the action's or the
       review's; span the aspect's or located in the sentence). A ``maintain`` or
       ``flip_polarity`` of a Stage 1 sentiment an earlier step removed restores it when its
       aspect is an aspect again (the ATE review re-added it): the review judges Stage 1's
       sentiments, and the later reviewer has the last word (:func:`_restore`).

    Targets match by normal form and act on every aspect / sentiment of that form. Unknown
    targets and impossible actions are rejected with a reason; every change is logged.
    """
    st = _Aspects(aspects, sentiments, sentence)
    for p in validator.correction_proposals if validator else []:
        _validator(st, p)
    for a in ate_review.aspect_review if ate_review else []:
        _ate(st, a, ate_review.confidence if ate_review else 0.0)
    for s in atsa_review.sentiment_review if atsa_review else []:
        _atsa(st, s, atsa_review.confidence if atsa_review else 0.0)
    return Stage2Result(aspects=st.aspects, sentiments=st.sentiments, log=st.log, rejected=st.rejected)
