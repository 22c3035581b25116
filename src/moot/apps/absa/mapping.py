"""From debate turns to aspect hints: the Debate Review Context of the panel variant (seed 001 §4)
and the same hints from the patch variant's edits (seed 002), so that one override serves both.

**Normalisation.** ``normalize(text)``: Unicode NFKC, lower case, every character that is not a
letter or digit removed (spaces, punctuation, symbols, ``_``). ``"Battery-Life!"`` and
``"battery life"`` are both ``"batterylife"``; Hangul is kept as is.

**Mentions.** A text mentions a form (an aspect term or one of its synonyms) when the normalised
form is a substring of the normalised text. Substring matching is what makes Korean work without a
morphological analyser: ``"배터리가 금방 닳아요"`` mentions ``"배터리"`` although a particle is
glued to it. One guard: a form whose normalised text is ASCII and shorter than 4 characters
(``"ram"``, ``"tea"``, ``"bar"``) must match a whole word of the lower-cased text (its words
separated by any non-alphanumeric run), so that ``"program"`` does not mention ``"ram"`` nor
``"steak"`` ``"tea"``.

**Synonyms.** Pattern files (``src/moot/data/absa/patterns/{en,ko}.json``) hold groups: a head and
its synonyms (``"service": ["staff", "waiter", ...]``). A group applies to an aspect term when one
of its members normalises to the term, or the term mentions a member of at least 2 normalised
characters (``"the staff"`` gets the service group). The forms of a term are the term, then the
members of at least 2 normalised characters of every group that applies, deduplicated by normal
form (a one-syllable Korean word such as ``값`` or ``팬`` is inside too many other words to be
searched for; it still selects its group when it *is* the term). Both languages are loaded by
default: a group only applies to a term it matches, so an English group never touches a Korean term.

**Panel turns** (:func:`build_review_context`). The aspect terms are Stage 1 ATE's, then ATSA's not
already listed (deduplicated by normal form). For each turn, in order:

1. Stage 1 found no aspect: provenance ``none``, fail reason ``no_aspects``.
2. Direct: the aspects named by the turn's ``aspect_refs`` (a ref names a term when the ref
   mentions one of the term's forms, or the term mentions the ref); when the refs name none (or
   there are none), the aspects whose forms the turn's ``message`` and ``key_points`` mention
   (``planning`` and ``reflection`` are the speaker's own thinking and are not read).
3. Fallback, when there is no direct match (whether the turn gave no refs or only refs that name
   no aspect): the aspects whose Stage 1 ATSA polarity equals the stance's polarity; provenance
   ``fallback``, fail reason ``fallback_used``.
4. Neither: provenance ``none``, fail reason ``no_match``.

A mapped turn of neutral stance (the stance's polarity is ``neutral``: stance ``neutral`` or any
stance other than pro/con) also counts ``neutral_stance``: its hints carry no polarity, so the
override ignores them. Stance weight: neutral 0.6, pro/con 1.0, anything else 0.8; stance polarity:
pro -> positive, con -> negative, anything else -> neutral (stances compared case-insensitively).
Every mapped turn adds one :class:`AspectHint` to each aspect it maps to; ``aspect_hints`` lists
only aspects that got at least one hint, in aspect-term order.

**Patch edits** (:func:`patch_hints`). Hint sources are the speakers' ``set_polarity`` and
``confirm_tuple`` edits and the judge's ``final_tuples`` (the judge's ``final_patch`` is already
reflected in its tuples and is not counted twice). An edit weighs 0.8 (the "other" stance weight)
times its confidence when it has one; a judge tuple weighs 1.0. A ``set_polarity`` edit's polarity
is its ``value`` (or its ``polarity`` field); a ``confirm_tuple`` edit's is its ``value`` /
``polarity`` if it names one, else the target's Stage 1 polarity. The target (the tuple's
``aspect_term`` for the judge) maps to the aspect term with the same normal form, or else to the
aspects it names as a panel ref would; a target that maps to nothing counts ``no_match``, a source
with no usable polarity counts as provenance ``none`` without a fail reason, and with no Stage 1
aspect at all every source counts ``no_aspects``. A hint's ``stance`` is the op (``set_polarity``,
``confirm_tuple``, ``final_tuple``), its speaker the agent (``judge`` for the judge).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from pathlib import Path

from moot.apps.absa.types import (
    DATA_DIR,
    POLARITIES,
    AspectHint,
    ATEOutput,
    ATSAOutput,
    DebateReviewContext,
    MappingStats,
    PanelJudgeSummary,
    PanelTurn,
    PatchHints,
    PatchJudgeSummary,
    PatchTurn,
    Polarity,
    ProvenanceHint,
    RebuttalPoint,
    empty_fail_reasons,
)
from moot.files import read_json

PATTERNS_DIR = DATA_DIR / "patterns"
LANGUAGES: tuple[str, ...] = ("en", "ko")

STANCE_WEIGHTS: dict[str, float] = {"neutral": 0.6, "pro": 1.0, "con": 1.0}
OTHER_STANCE_WEIGHT = 0.8
STANCE_POLARITY: dict[str, Polarity] = {"pro": "positive", "con": "negative"}
JUDGE_TUPLE_WEIGHT = 1.0
#: ASCII forms shorter than this must match a whole word.
SHORT_FORM = 4
#: Synonyms shorter than this (normalised) only trigger their group by equality and are not used as
#: forms: a one-syllable Korean word (값, 팬, 램) is a substring of too many others.
MIN_SYNONYM = 2

REVIEW_GUIDANCE = (
    "The debate is extra evidence, not a verdict. For each aspect, aspect_hints lists who pushed which "
    "polarity and how hard (weight). Prefer direct hints (the speaker named the aspect) over fallback "
    "hints (mapped by Stage 1 polarity only); neutral-stance hints carry no polarity. Change an aspect "
    "or its polarity only when the sentence itself supports it; keep Stage 1 where the debate is split "
    "or silent."
)
FALLBACK_MAPPING_POLICY = (
    "A turn that names no Stage 1 aspect (no aspect_refs naming one, no aspect term or synonym in its "
    "message or key points) is mapped to the aspects whose Stage 1 ATSA polarity equals the stance's "
    "polarity (pro -> positive, con -> negative, other -> neutral), with provenance 'fallback'. A turn "
    "that maps neither way has provenance 'none' and gives no hint."
)


# ------------------------------------------------------------------------------- normalisation


def normalize(text: str) -> str:
    """NFKC, lower case, only letters and digits kept."""
    return "".join(ch for ch in unicodedata.normalize("NFKC", text).lower() if ch.isalnum())


def _is_short_ascii(norm: str) -> bool:
    return norm.isascii() and len(norm) < SHORT_FORM


def mentions(text: str, form: str) -> bool:
    """Whether ``text`` mentions ``form`` (see the module's rules). An empty form mentions nothing."""
    norm = normalize(form)
    if not norm:
        return False
    if _is_short_ascii(norm):
        words = [w for w in re.split(r"[^0-9a-z]+", unicodedata.normalize("NFKC", form).lower()) if w]
        pattern = r"(?<![0-9a-z])" + r"[^0-9a-z]*".join(map(re.escape, words)) + r"(?![0-9a-z])"
        return re.search(pattern, unicodedata.normalize("NFKC", text).lower()) is not None
    return norm in normalize(text)


# ------------------------------------------------------------------------------------ synonyms

SynonymGroups = tuple[tuple[str, ...], ...]


@cache
def _load_file(path: Path) -> SynonymGroups:
    data = read_json(path, "synonyms file")
    groups = data.get("groups")
    if not isinstance(groups, dict):
        raise ValueError(f"{path}: expected an object with 'groups': {{head: [synonyms]}}")
    out: list[tuple[str, ...]] = []
    for head, synonyms in groups.items():
        if not isinstance(synonyms, list) or not all(isinstance(s, str) for s in synonyms):
            raise ValueError(f"{path}: group {head!r} must be a list of strings")
        out.append((head, *synonyms))
    return tuple(out)


def load_synonyms(languages: Iterable[str] = LANGUAGES, paths: Iterable[str | Path] = ()) -> SynonymGroups:
    """The shipped groups of ``languages`` plus those of any extra pattern files, in that order."""
    files = [PATTERNS_DIR / f"{lang}.json" for lang in languages] + [Path(p) for p in paths]
    return tuple(g for f in files for g in _load_file(f.resolve()))


def expand(term: str, groups: SynonymGroups) -> list[str]:
    """The forms of ``term``: itself, then the members of every group that applies to it."""
    norm = normalize(term)
    forms = [term]
    seen = {norm}
    for group in groups:
        applies = any(normalize(m) == norm or (len(normalize(m)) >= MIN_SYNONYM and mentions(term, m)) for m in group)
        if not applies:
            continue
        for m in group:
            if len(n := normalize(m)) >= MIN_SYNONYM and n not in seen:
                seen.add(n)
                forms.append(m)
    return forms


# --------------------------------------------------------------------------------------- stance


def stance_weight(stance: str) -> float:
    """neutral 0.6, pro/con 1.0, anything else 0.8."""
    return STANCE_WEIGHTS.get(stance.strip().lower(), OTHER_STANCE_WEIGHT)


def stance_polarity(stance: str) -> Polarity:
    """pro -> positive, con -> negative, anything else -> neutral."""
    return STANCE_POLARITY.get(stance.strip().lower(), "neutral")


# ------------------------------------------------------------------------------------- matching


def aspect_terms_of(ate: ATEOutput | None, atsa: ATSAOutput | None) -> list[str]:
    """ATE's terms, then ATSA's not already listed (by normal form)."""
    terms: list[str] = []
    seen: set[str] = set()
    names = [a.term for a in ate.aspects] if ate else []
    names += [s.aspect_term for s in atsa.aspect_sentiments] if atsa else []
    for t in names:
        if (n := normalize(t)) and n not in seen:
            seen.add(n)
            terms.append(t)
    return terms


def _named_by_ref(ref: str, term: str, forms: Sequence[str]) -> bool:
    return any(mentions(ref, f) for f in forms) or mentions(term, ref)


def _mapped_in_text(text: str, forms: Sequence[str]) -> bool:
    return any(mentions(text, f) for f in forms)


def _polarity_of(term: str, polarities: Mapping[str, Polarity]) -> Polarity | None:
    norm = normalize(term)
    for t, p in polarities.items():
        if normalize(t) == norm:
            return p
    return None


def build_review_context(
    turns: Sequence[PanelTurn],
    summary: PanelJudgeSummary | None,
    ate: ATEOutput | None,
    atsa: ATSAOutput | None,
    synonyms: SynonymGroups | None = None,
) -> DebateReviewContext:
    """Seed 001 §4's Debate Review Context (see the module's rules). ``synonyms`` defaults to the
    shipped English and Korean groups."""
    groups = load_synonyms() if synonyms is None else synonyms
    terms = aspect_terms_of(ate, atsa)
    forms = {t: expand(t, groups) for t in terms}
    polarities: dict[str, Polarity] = {}
    for s in atsa.aspect_sentiments if atsa else []:
        polarities.setdefault(s.aspect_term, s.polarity)
    stats = MappingStats()
    reasons = empty_fail_reasons()
    points: list[RebuttalPoint] = []
    hints: dict[str, list[AspectHint]] = {}

    for turn in turns:
        weight = stance_weight(turn.stance)
        polarity = stance_polarity(turn.stance)
        mapped: list[str] = []
        provenance: ProvenanceHint = "none"
        if not terms:
            reasons["no_aspects"] += 1
        else:
            if turn.aspect_refs:
                mapped = [t for t in terms if any(_named_by_ref(r, t, forms[t]) for r in turn.aspect_refs)]
            if not mapped:
                text = " ".join([turn.message, *turn.key_points])
                mapped = [t for t in terms if _mapped_in_text(text, forms[t])]
            if mapped:
                provenance = "direct"
            else:
                mapped = [t for t in terms if _polarity_of(t, polarities) == polarity]
                if mapped:
                    provenance = "fallback"
                    reasons["fallback_used"] += 1
                else:
                    reasons["no_match"] += 1
            if mapped and polarity == "neutral":
                reasons["neutral_stance"] += 1
        stats.turns += 1
        setattr(stats, provenance, getattr(stats, provenance) + 1)
        points.append(
            RebuttalPoint(
                speaker=turn.speaker,
                stance=turn.stance,
                key_points=list(turn.key_points),
                message=turn.message,
                aspect_refs=mapped,
                weight=weight,
                polarity_hint=polarity,
                provenance_hint=provenance,
            )
        )
        for t in mapped:
            hints.setdefault(t, []).append(
                AspectHint(speaker=turn.speaker, stance=turn.stance, weight=weight, polarity_hint=polarity)
            )

    return DebateReviewContext(
        summary=summary.model_dump() if summary else {},
        rebuttal_points=points,
        aspect_terms=terms,
        synonym_hints={t: f[1:] for t, f in forms.items() if len(f) > 1},
        aspect_hints={t: hints[t] for t in terms if t in hints},
        mapping_stats=stats,
        mapping_fail_reasons=reasons,
        review_guidance=REVIEW_GUIDANCE,
        fallback_mapping_policy=FALLBACK_MAPPING_POLICY,
    )


def _as_polarity(*values: str | None) -> Polarity | None:
    for v in values:
        if v is not None and (p := v.strip().lower()) in POLARITIES:
            return p
    return None


def match_target(target: str, terms: Sequence[str], synonyms: SynonymGroups = ()) -> list[str]:
    """The aspect terms a patch ``target`` (an aspect ref) maps to: the term with the same normal
    form if there is one, else every term the target names as a panel ``aspect_ref`` would."""
    norm = normalize(target)
    exact = [t for t in terms if normalize(t) == norm]
    if exact:
        return exact[:1]
    return [t for t in terms if _named_by_ref(target, t, expand(t, synonyms))]


def patch_hints(
    turns: Sequence[PatchTurn],
    judge: PatchJudgeSummary | None,
    aspect_terms: Sequence[str],
    polarities: Mapping[str, Polarity] | None = None,
    synonyms: SynonymGroups | None = None,
) -> PatchHints:
    """The patch variant's hints (see the module's rules). ``polarities``: Stage 1 polarity per
    aspect term, for ``confirm_tuple`` edits that name none."""
    groups = load_synonyms() if synonyms is None else synonyms
    known = dict(polarities or {})
    terms = list(aspect_terms)
    stats = MappingStats()
    reasons = empty_fail_reasons()
    hints: dict[str, list[AspectHint]] = {}
    sources: list[tuple[str, str, str, Polarity | None, float]] = []  # speaker, stance, target, polarity, weight
    for turn in turns:
        for e in turn.proposed_edits:
            if e.op not in ("set_polarity", "confirm_tuple"):
                continue
            weight = OTHER_STANCE_WEIGHT * (e.confidence if e.confidence is not None else 1.0)
            sources.append((turn.agent, e.op, e.target, _as_polarity(e.value, e.polarity), weight))
    for tup in judge.final_tuples if judge else []:
        sources.append(("judge", "final_tuple", tup.aspect_term, tup.polarity, JUDGE_TUPLE_WEIGHT))

    for speaker, stance, target, polarity, weight in sources:
        stats.turns += 1
        if not terms:
            reasons["no_aspects"] += 1
            stats.none += 1
            continue
        mapped = match_target(target, terms, groups)
        if not mapped:
            reasons["no_match"] += 1
            stats.none += 1
            continue
        if polarity is None and stance == "confirm_tuple":
            polarity = _polarity_of(mapped[0], known)
        if polarity is None:
            stats.none += 1
            continue
        stats.direct += 1
        for t in mapped:
            hints.setdefault(t, []).append(
                AspectHint(speaker=speaker, stance=stance, weight=round(weight, 9), polarity_hint=polarity)
            )
    return PatchHints(
        aspect_hints={t: hints[t] for t in terms if t in hints}, mapping_stats=stats, mapping_fail_reasons=reasons
    )
