"""Contradiction detection: pure functions of the reports and the config, no model.

Findings are grouped by normalised metric name; each group whose findings disagree gives one
:class:`~moot.apps.arbitration.types.Contradiction` whose parties are every finding of the group
(so a three-way conflict is one contradiction with three parties). See
:func:`detect_contradictions` for the rules and the severities.
"""

from __future__ import annotations

import calendar
import re
import unicodedata
from collections.abc import Sequence
from datetime import date
from itertools import combinations

from moot.apps.arbitration.types import (
    ArbitrationConfig,
    ConfigInput,
    Contradiction,
    ContradictionKind,
    Finding,
    Party,
    ReportsInput,
    Severity,
    as_config,
    as_reports,
)

_NON_WORD = re.compile(r"[\W_]+", re.UNICODE)
_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)?", re.UNICODE)
_NEGATIONS = frozenset({"not", "no", "never", "neither", "nor", "without", "isn't", "aren't", "wasn't", "weren't"})
_UNITS = {"percent": "%", "pct": "%", "per cent": "%", "percentage": "%", "퍼센트": "%"}
#: Rounding applied before comparing ratios with thresholds, so 0.9 - 0.6 counts as 0.3.
_DIGITS = 9


def normalize_metric(name: str, aliases: dict[str, str] | None = None) -> str:
    """``"Qatar Unemployment-Rate."`` -> ``"qatar_unemployment_rate"``: Unicode-normalised,
    case-folded, every run of punctuation, whitespace, hyphens or underscores one ``_``.
    ``aliases`` (normalised the same way on both sides) map a name to its canonical one."""
    key = _NON_WORD.sub("_", unicodedata.normalize("NFKC", name).casefold()).strip("_")
    if aliases:
        key = _alias_table(aliases).get(key, key)
    return key


def _alias_table(aliases: dict[str, str]) -> dict[str, str]:
    return {normalize_metric(k): normalize_metric(v) for k, v in aliases.items()}


def normalize_source(source: str) -> str:
    """``"GCC-STAT"``, ``"gcc stat"`` and ``"GCCSTAT"`` are one source."""
    return _NON_WORD.sub("", unicodedata.normalize("NFKC", source).casefold())


def normalize_unit(unit: str) -> str:
    u = unicodedata.normalize("NFKC", unit).strip().casefold()
    return _UNITS.get(u, u)


def relative_difference(a: float, b: float) -> float:
    """``|a - b| / max(|a|, |b|)``: symmetric, 0 for equal values, 1 when one is zero.

    The seed calls 0.10 vs 0.12 a 20% difference (relative to the smaller value); relative to
    the larger it is 16.7%, which is what keeps the seed's "medium" severity for that example.
    """
    if a == b:
        return 0.0
    return round(abs(a - b) / max(abs(a), abs(b)), _DIGITS)


# -------------------------------------------------------------------------- interpretations


def _stem(word: str) -> str:
    """A light English stem so that improving / improved / improvement / improve match."""
    for suffix in ("ments", "ment", "ing", "ed", "es", "s"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            word = word[: -len(suffix)]
            break
    if len(word) > 3 and word.endswith("e"):
        word = word[:-1]
    return word


def _is_hangul(term: str) -> bool:
    return any("\uac00" <= ch <= "\ud7a3" for ch in term)


def _matches(term: str, word: str) -> bool:
    # Korean attaches particles and endings to the stem (감소했다, 개선되고): match the start.
    if _is_hangul(term):
        return word.startswith(term)
    return word == term or _stem(word) == _stem(term)


def interpretation_sides(text: str, vocabulary: Sequence[tuple[str, str]]) -> dict[int, int]:
    """Which side (0 or 1) of each vocabulary pair an interpretation takes: ``{pair index: side}``.

    A term right after a negation ("not improving") counts for neither side; a text that uses
    both sides of a pair ("up in Q1, down in Q2") takes no side of that pair.
    """
    words = [w.casefold() for w in _WORD.findall(unicodedata.normalize("NFKC", text))]
    sides: dict[int, set[int]] = {}
    for i, word in enumerate(words):
        negated = any(w in _NEGATIONS or w.endswith("n't") for w in words[max(0, i - 2) : i])
        if negated:
            continue
        for pair_index, pair in enumerate(vocabulary):
            for side, term in enumerate(pair):
                if _matches(term.casefold().strip(), word):
                    sides.setdefault(pair_index, set()).add(side)
    return {k: next(iter(v)) for k, v in sides.items() if len(v) == 1}


def opposite(a: str, b: str, vocabulary: Sequence[tuple[str, str]]) -> bool:
    """Whether two interpretations take opposite sides of some vocabulary pair."""
    sa, sb = interpretation_sides(a, vocabulary), interpretation_sides(b, vocabulary)
    return any(k in sb and sb[k] != side for k, side in sa.items())


# ------------------------------------------------------------------------------------ periods

_QUARTER = re.compile(r"\bq([1-4])\W*((?:19|20)\d\d)\b|\b((?:19|20)\d\d)\W*q([1-4])\b")
_KOREAN_QUARTER = re.compile(r"((?:19|20)\d\d)\s*년\s*([1-4])\s*분기")
_HALF = re.compile(r"\bh([12])\W*((?:19|20)\d\d)\b|\b((?:19|20)\d\d)\W*h([12])\b")
_DAY = re.compile(r"\b((?:19|20)\d\d)-(\d\d)-(\d\d)\b")
_MONTH = re.compile(r"\b((?:19|20)\d\d)-(\d\d)\b|\b(\d\d?)/((?:19|20)\d\d)\b")
_MONTH_NAME = re.compile(r"\b(jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?\s+((?:19|20)\d\d)\b")
_YEAR = re.compile(r"(?:19|20)\d\d")
_MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]


def _month_end(year: int, month: int) -> date:
    return date(year, month, calendar.monthrange(year, month)[1])


def period_end(period: str | None) -> date | None:
    """The last day a period covers: ``Q1-2024`` -> 2024-03-31, ``2024`` -> 2024-12-31,
    ``H1 2023``, ``2024-03``, ``Mar 2024``, ``2024-03-15``, ``2023-2024``, ``2024년 1분기``.
    None when no year can be read."""
    if not period:
        return None
    p = unicodedata.normalize("NFKC", period).casefold()
    if m := _KOREAN_QUARTER.search(p):
        return _month_end(int(m.group(1)), 3 * int(m.group(2)))
    if m := _QUARTER.search(p):
        q, y = (m.group(1), m.group(2)) if m.group(1) else (m.group(4), m.group(3))
        return _month_end(int(y), 3 * int(q))
    if m := _HALF.search(p):
        h, y = (m.group(1), m.group(2)) if m.group(1) else (m.group(4), m.group(3))
        return _month_end(int(y), 6 * int(h))
    if (m := _DAY.search(p)) and 1 <= int(m.group(2)) <= 12:
        try:
            return date(int(m.group(1)), int(m.group(2)), int(m.group(3)))
        except ValueError:
            pass
    if m := _MONTH.search(p):
        y, mo = (m.group(1), m.group(2)) if m.group(1) else (m.group(4), m.group(3))
        if 1 <= int(mo) <= 12:
            return _month_end(int(y), int(mo))
    if m := _MONTH_NAME.search(p):
        return _month_end(int(m.group(2)), _MONTHS.index(m.group(1)) + 1)
    years = _YEAR.findall(p)
    return date(max(int(y) for y in years), 12, 31) if years else None


# -------------------------------------------------------------------------------- detection


def _source(f: Finding) -> str | None:
    return normalize_source(f.citation.source) if f.citation is not None else None


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "no value"
    return f"{value:g}" + (f" {unit}" if unit else "")


def _analyse(metric: str, parties: list[Party], cfg: ArbitrationConfig) -> Contradiction | None:
    findings = [p.finding for p in parties]
    valued = [(p, p.finding.value) for p in parties if p.finding.value is not None]
    rel: float | None = None
    value_conflict = cross_source_conflict = cross_source_near = False
    for (pa, a), (pb, b) in combinations(valued, 2):
        assert a is not None and b is not None
        d = relative_difference(a, b)
        rel = d if rel is None else max(rel, d)
        sa, sb = _source(pa.finding), _source(pb.finding)
        different_sources = sa is not None and sb is not None and sa != sb
        if d > cfg.tolerance:
            value_conflict = True
            cross_source_conflict |= different_sources
        elif d > 0 and different_sources:
            cross_source_near = True
    is_opposite = any(
        opposite(a.interpretation, b.interpretation, cfg.vocabulary) for a, b in combinations(findings, 2)
    )
    confidences = [f.confidence for f in findings]
    gap = round(max(confidences) - min(confidences), _DIGITS)

    signals: list[ContradictionKind] = []
    if is_opposite:
        signals.append("opposite_interpretation")
    if value_conflict:
        signals.append("source_conflict" if cross_source_conflict else "value_mismatch")
    elif cross_source_near and cfg.source_only_conflicts:
        signals.append("source_conflict")
    if not is_opposite and not value_conflict and gap >= cfg.confidence_gap:
        signals.append("confidence_gap")
    if not signals:
        return None

    severity: Severity
    if is_opposite or (value_conflict and rel is not None and rel >= cfg.high_difference):
        severity = "high"
    elif value_conflict:
        severity = "medium"
    else:
        severity = "low"

    notes: list[str] = []
    if rel is not None and rel > 0:
        values = ", ".join(_fmt(v, p.finding.unit) for p, v in valued)
        notes.append(f"values differ by {rel:.1%} of the larger ({values})")
    if is_opposite:
        notes.append("interpretations are opposite (" + " vs ".join(repr(f.interpretation) for f in findings) + ")")
    if gap >= cfg.confidence_gap:
        notes.append(f"confidence differs by {gap:g}")
    cited = [f.citation for f in findings if f.citation is not None]
    if len({normalize_source(c.source) for c in cited}) > 1:
        notes.append("sources differ (" + " vs ".join(dict.fromkeys(c.source for c in cited)) + ")")
    periods = [c.period for c in cited if c.period]
    if len({p.strip().casefold() for p in periods}) > 1:
        notes.append("periods differ (" + " vs ".join(dict.fromkeys(periods)) + ")")
    units = {normalize_unit(f.unit) for f in findings if f.unit}
    if len(units) > 1:
        notes.append("units differ (" + ", ".join(sorted(units)) + "): check they measure the same thing")
    return Contradiction(
        id="",
        kind=signals[0],
        signals=signals,
        metric=metric,
        parties=parties,
        severity=severity,
        relative_difference=rel,
        confidence_gap=gap,
        details="; ".join(notes),
    )


def detect_contradictions(reports: ReportsInput, config: ConfigInput = None) -> list[Contradiction]:
    """Find the contradictions among agent reports.

    Findings are grouped by :func:`normalize_metric` (plus ``config.metric_aliases``); a group
    of two or more findings is checked with these rules (``d`` is the largest pairwise
    :func:`relative_difference` of the values, ``tolerance`` 0.05 by default):

    ========================  ========================================================  ==========
    kind                      when                                                      severity
    ========================  ========================================================  ==========
    opposite_interpretation   interpretations take opposite sides of a vocabulary       high
                              pair ("improving" / "declining", "증가" / "감소")
    value_mismatch            ``d > tolerance``, the conflicting values from one        high if
                              source                                                    ``d >= high_difference``
                                                                                        (0.20), else medium
    source_conflict           ``d > tolerance`` between values from different sources   as value_mismatch
    source_conflict           ``0 < d <= tolerance`` across sources, only with          low
                              ``source_only_conflicts`` (off by default: within
                              tolerance is agreement)
    confidence_gap            the same claim (values within tolerance, no opposite      low
                              interpretation) at confidences ``>= confidence_gap``
                              (0.3) apart
    ========================  ========================================================  ==========

    Identical values, values within tolerance and agreeing interpretations at similar
    confidence are not contradictions. ``kind`` is the first of ``signals`` in the order above.
    Contradictions are numbered ``c1``, ``c2``, ... in the order their metric first appears.
    ``reports`` and ``config`` may be the models or their JSON form (dicts), as for :func:`arbitrate`.
    """
    cfg = as_config(config)
    reports = as_reports(reports)
    aliases = _alias_table(cfg.metric_aliases)
    groups: dict[str, list[Party]] = {}
    for ri, report in enumerate(reports):
        for fi, finding in enumerate(report.findings):
            key = normalize_metric(finding.metric)
            key = aliases.get(key, key)
            party = Party(agent=report.agent, report_index=ri, finding_index=fi, finding=finding)
            groups.setdefault(key, []).append(party)
    found: list[Contradiction] = []
    for metric, parties in groups.items():
        if len(parties) < 2:
            continue
        contradiction = _analyse(metric, parties, cfg)
        if contradiction is not None:
            found.append(contradiction.model_copy(update={"id": f"c{len(found) + 1}"}))
    return found
