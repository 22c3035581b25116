"""Validation of the shipped ABSA set `src/moot/data/absa/absa-v1.jsonl` against docs/absa-annotation.md.

Every line is checked: schema, ids, exact spans, label sets, the sentence-label consistency rules, the
phenomenon-tag rules and the coverage minimums the annotation guide promises.
"""

from __future__ import annotations

import itertools
import json
import re
import unicodedata
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

DATA = Path(__file__).resolve().parents[1] / "src" / "moot" / "data" / "absa" / "absa-v1.jsonl"

LANGS = {"en", "ko"}
DOMAINS = {"restaurant": "rest", "laptop": "lap", "product": "prod"}
POLARITIES = {"positive", "negative", "neutral"}
SENTENCE_LABELS = POLARITIES | {"mixed"}
PHENOMENA = {
    "negation",
    "irony",
    "contrast",
    "mixed",
    "comparison",
    "implicit_polarity",
    "intensifier",
    "hedging",
    "none",
}
ROW_KEYS = {"id", "lang", "domain", "text", "aspects", "sentence_label", "phenomena"}
ASPECT_KEYS = {"term", "from", "to", "polarity"}
ID_RE = re.compile(r"^(en|ko)-(rest|lap|prod)-(\d{3})$")
HANGUL = re.compile(r"[\uac00-\ud7a3]")
# Korean particles that must stay outside a span (annotation guide, "Korean particles").
KO_PARTICLES = ("은", "는", "이", "가", "을", "를", "도", "에", "의", "와", "과", "로", "만")
# Nouns whose last syllable happens to be a particle syllable: the span is the whole noun.
KO_PARTICLE_FINAL_NOUNS = {"떡볶이", "속도", "디스플레이"}
# What may follow a Korean span inside a word: a particle, the copula 이-, or 하- of a 하다 verb (보온하면).
KO_AFTER_SPAN = (*KO_PARTICLES, "으로", "보다", "랑", "이랑", "이면", "이라", "하")


def _load() -> list[dict[str, Any]]:
    rows = []
    with DATA.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            assert line.strip(), f"line {lineno}: blank line"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:  # pragma: no cover - message only
                pytest.fail(f"line {lineno}: not JSON: {e}")
            assert isinstance(row, dict), f"line {lineno}: not an object"
            rows.append(row)
    return rows


ROWS = _load()


def _rid(row: dict[str, Any]) -> str:
    return str(row.get("id"))


def _share(tag: str) -> float:
    return sum(tag in r["phenomena"] for r in ROWS) / len(ROWS)


def test_file_is_utf8_with_one_object_per_line() -> None:
    raw = DATA.read_bytes()
    raw.decode("utf-8")
    assert raw.endswith(b"\n")
    assert len(ROWS) == raw.count(b"\n")


@pytest.mark.parametrize("row", ROWS, ids=_rid)
def test_row_schema(row: dict[str, Any]) -> None:
    assert set(row) == ROW_KEYS
    m = ID_RE.match(row["id"])
    assert m, row["id"]
    assert row["lang"] in LANGS
    assert row["domain"] in DOMAINS
    assert m.group(1) == row["lang"]
    assert m.group(2) == DOMAINS[row["domain"]]
    text = row["text"]
    assert isinstance(text, str) and text == text.strip() and text
    assert unicodedata.is_normalized("NFC", text)
    if row["lang"] == "ko":
        assert HANGUL.search(text), "Korean sentence without Hangul"
    else:
        assert not HANGUL.search(text), "English sentence with Hangul"
    assert row["sentence_label"] in SENTENCE_LABELS
    assert isinstance(row["aspects"], list)
    assert isinstance(row["phenomena"], list) and row["phenomena"]
    assert all(isinstance(p, str) for p in row["phenomena"])


@pytest.mark.parametrize("row", ROWS, ids=_rid)
def test_spans_exact_and_disjoint(row: dict[str, Any]) -> None:
    text = row["text"]
    spans = []
    for a in row["aspects"]:
        assert set(a) == ASPECT_KEYS
        start, end, term = a["from"], a["to"], a["term"]
        assert type(start) is int and type(end) is int
        assert 0 <= start < end <= len(text), a
        assert text[start:end] == term, f"{text[start:end]!r} != {term!r}"
        assert term == term.strip() and term[0].isalnum() and term[-1].isalnum(), f"span edges: {term!r}"
        assert a["polarity"] in POLARITIES
        if row["lang"] == "en":
            # whole words: no span starts or ends inside a word
            assert start == 0 or not text[start - 1].isalnum(), term
            assert end == len(text) or not text[end].isalnum(), term
        else:
            # a Korean span starts a word (particles follow it, nothing precedes it) and keeps particles out
            assert start == 0 or not HANGUL.match(text[start - 1]), term
            last_word = term.split()[-1]
            if last_word not in KO_PARTICLE_FINAL_NOUNS:
                assert not last_word.endswith(KO_PARTICLES), f"particle inside span: {term!r}"
            rest = text[end:]
            assert not rest or not HANGUL.match(rest[0]) or rest.startswith(KO_AFTER_SPAN), f"span cut: {term!r}"
        spans.append((start, end))
    assert spans == sorted(spans), "aspects must be listed in text order"
    for (_, end1), (start2, _) in itertools.pairwise(spans):
        assert end1 <= start2, "overlapping aspect spans"


@pytest.mark.parametrize("row", ROWS, ids=_rid)
def test_sentence_label_consistent_with_aspects(row: dict[str, Any]) -> None:
    label = row["sentence_label"]
    pols = {a["polarity"] for a in row["aspects"]}
    if {"positive", "negative"} <= pols:
        assert label == "mixed", "positive and negative aspects make a mixed sentence"
    if label == "positive":
        assert "negative" not in pols
    if label == "negative":
        assert "positive" not in pols
    if label == "neutral":
        assert pols <= {"neutral"}, "a neutral sentence has no opinionated aspect"
    # Exception rule (guide, "Sentence label"): a mixed sentence may have one-sided aspect polarities when
    # the other opinion is about the whole item and names no aspect term; it must still carry an opinion.
    if label == "mixed":
        assert pols & {"positive", "negative"} or not row["aspects"]


@pytest.mark.parametrize("row", ROWS, ids=_rid)
def test_phenomena_tags(row: dict[str, Any]) -> None:
    tags = row["phenomena"]
    assert len(tags) == len(set(tags)), "duplicate tag"
    assert set(tags) <= PHENOMENA
    assert tags == ["none"] or "none" not in tags, "'none' stands alone"
    assert ("mixed" in tags) == (row["sentence_label"] == "mixed"), "tag 'mixed' iff sentence_label mixed"


def test_ids_and_texts_unique() -> None:
    ids = Counter(r["id"] for r in ROWS)
    assert not [i for i, n in ids.items() if n > 1]
    texts = Counter(r["text"] for r in ROWS)
    assert not [t for t, n in texts.items() if n > 1]


def test_ids_numbered_consecutively_per_language_and_domain() -> None:
    groups: dict[tuple[str, str], list[int]] = {}
    for r in ROWS:
        m = ID_RE.match(r["id"])
        assert m
        groups.setdefault((m.group(1), m.group(2)), []).append(int(m.group(3)))
    for key, nums in groups.items():
        assert nums == list(range(1, len(nums) + 1)), key


def test_coverage_sizes() -> None:
    assert len(ROWS) >= 150
    langs = Counter(r["lang"] for r in ROWS)
    assert langs["en"] >= 60 and langs["ko"] >= 60
    for lang in LANGS:
        domains = Counter(r["domain"] for r in ROWS if r["lang"] == lang)
        assert set(domains) == set(DOMAINS), lang
        assert min(domains.values()) >= 20, (lang, domains)


def test_coverage_hard_cases() -> None:
    assert _share("negation") >= 0.30
    assert _share("irony") >= 0.15
    assert _share("contrast") >= 0.30
    assert _share("mixed") >= 0.20
    for tag in PHENOMENA:
        assert _share(tag) > 0, f"no sentence tagged {tag}"
    # both languages carry the hard cases, not one of them alone
    for lang in LANGS:
        sub = [r for r in ROWS if r["lang"] == lang]
        for tag, floor in (("negation", 0.25), ("irony", 0.10), ("contrast", 0.25)):
            assert sum(tag in r["phenomena"] for r in sub) / len(sub) >= floor, (lang, tag)


def test_coverage_aspect_structure() -> None:
    sizes = Counter(len(r["aspects"]) for r in ROWS)
    assert sum(n for k, n in sizes.items() if k >= 2) / len(ROWS) >= 0.30, sizes
    assert sizes[3] > 0 and sizes[4] > 0, sizes
    assert sizes[0] > 0, "some sentences carry only a general opinion"
    labels = Counter(r["sentence_label"] for r in ROWS)
    assert set(labels) == SENTENCE_LABELS, labels
    assert _share("none") >= 0.08, "keep some plain sentences"
