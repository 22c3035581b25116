"""The deterministic quality measures: no model, exact, repeatable. Definitions in docs/quality.md.

Text is compared as bags of *content words*: lower-cased words and numbers, without English
function words and without the words of the question itself (every argument shares those by
construction, so they would make any two arguments look alike and any sentence look grounded).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from moot.core.answers import normalize_answer
from moot.core.dynamics import compute_dynamics
from moot.core.types import DebateResult, QualityScore, Turn
from moot.stats import total

#: Participants whose turns review a round rather than argue in it (the moderated, MAD and ChatEval
#: presets' moderator, refiner and summarizer): their turns are not arguments.
REVIEWER_ROLES = frozenset({"moderator", "refiner", "summarizer", "judge"})
#: An evidence item counts as grounded from this support on (docs/quality.md).
GROUNDED = 0.5
#: Fields of typed turns that carry no argument (labels, not prose).
_LABEL_FIELDS = frozenset({"speaker", "stance", "agent", "answer", "confidence"})

_WORD = re.compile(r"[^\W_]*[^\W\d_][^\W_]*|\d+(?:[.,]\d+)*")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
#: A citation of the context's passages by number (``[2]``, ``[1, 3]``, ``[2-4]``), as the prompts ask
#: for them: a reference, not a number the argument states.
_CITATION = re.compile(r"\[\s*\d+(?:\s*[,;\u2013-]\s*\d+)*\s*\]")
_STOP_WORDS = """a about above after again against all also am an and any are as at be because been before being
    below between both but by can could did do does doing down during each few for from further had has
    have having he her here hers him his how i if in into is it its itself just me more most my no nor
    not now of off on once only or other our ours out over own same she should so some such than that
    the their theirs them then there these they this those through to too under until up very was we
    were what when where which while who whom why will with would you your yours yes may might must
    shall one ones however therefore thus so also which whose upon within without let lets i'm it's
    answer question think agree disagree argument point"""
_STOP = frozenset(_STOP_WORDS.split())


def words(text: str) -> list[str]:
    """Content words of ``text``: lower-cased, numbers kept whole (``0.10``, ``1,000`` as ``1000``),
    words with digits kept whole (``q1``, ``co2``), function words and one-letter words dropped, a
    plural ``s`` stripped from longer words."""
    out = []
    for w in _WORD.findall(text.lower()):
        if w[0].isdigit() and _NUMBER.fullmatch(w.replace(",", "")):
            out.append(w.replace(",", ""))
            continue
        if len(w) < 2 or w in _STOP:
            continue
        out.append(w[:-1] if len(w) > 4 and w.endswith("s") and not w.endswith("ss") else w)
    return out


def _numbers(tokens: Iterable[str]) -> set[str]:
    return {t for t in tokens if _NUMBER.fullmatch(t)}


@dataclass
class Argument:
    """One debater's turn, as the measures read it."""

    speaker: str
    round: int
    text: str
    #: What the turn offers as evidence: its ``supporting_evidence`` list, or its sentences.
    evidence: list[str] = field(default_factory=list)


def _strings(value: Any, key: str | None = None) -> list[str]:
    if isinstance(value, str):
        return [] if key in _LABEL_FIELDS else [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _strings(v, k)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v, key)]
    return []


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.split(text) if s.strip()]


def _argument(turn: Turn) -> Argument | None:
    if not turn.ok:
        return None
    if turn.parsed is not None:
        text = "\n".join(_strings(turn.parsed))
        listed = turn.parsed.get("supporting_evidence")
        evidence = [e for e in listed if isinstance(e, str) and e.strip()] if isinstance(listed, list) else []
    else:
        text, evidence = turn.text or "", []
    return Argument(turn.speaker, turn.round, text, evidence or sentences(text))


def arguments(result: DebateResult) -> list[Argument]:
    """The debaters' successful turns (not reviewers', not decision turns), in order."""
    roles = {str(p.get("id")): str(p.get("role") or "") for p in result.participants}
    out = []
    for turn in result.turns():
        if roles.get(turn.speaker, turn.role) in REVIEWER_ROLES or turn.role in REVIEWER_ROLES:
            continue
        arg = _argument(turn)
        if arg is not None and arg.text.strip():
            out.append(arg)
    return out


def _cosine(a: Counter[str], b: Counter[str]) -> float:
    dot = total(a[w] * b[w] for w in a.keys() & b.keys())
    norm = math.sqrt(total(v * v for v in a.values())) * math.sqrt(total(v * v for v in b.values()))
    return dot / norm if norm else 0.0


Measured = QualityScore | str
"""A measure's outcome: the score, or the reason it could not be measured."""

#: How the reason begins when a dimension is trivial for the debate because it had one debater (a
#: single agent): it is not measured rather than scored at its maximum (docs/quality.md).
ONE_AGENT = "n/a — one agent"
#: The same with several debaters of whom only one gave what the dimension compares.
ONE_ANSWER = "n/a — one answer"


def debaters(result: DebateResult) -> int:
    """How many participants argue (reviewers such as a moderator or a judge do not)."""
    return sum(1 for p in result.participants if str(p.get("role") or "") not in REVIEWER_ROLES)


def _trivial(result: DebateResult, why: str) -> str:
    return f"{ONE_AGENT if debaters(result) < 2 else ONE_ANSWER}: {why}"


def argument_diversity(result: DebateResult) -> Measured:
    """Mean content-word cosine distance between the arguments of different debaters (every pair of
    turns by two different speakers, over all rounds). 0: everyone says the same; 1: no content word
    in common."""
    question = set(words(result.task.question))
    args = [(a, Counter(w for w in words(a.text) if w not in question)) for a in arguments(result)]
    args = [(a, bag) for a, bag in args if bag]
    speakers = {a.speaker for a, _ in args}
    if len(speakers) < 2:
        return _trivial(result, "fewer than two debaters made an argument, and diversity is between debaters")
    distances = [
        1.0 - _cosine(x, y) for i, (a, x) in enumerate(args) for b, y in args[i + 1 :] if a.speaker != b.speaker
    ]
    value = total(distances) / len(distances)
    return QualityScore(
        value=round(min(1.0, max(0.0, value)), 6),
        method="deterministic",
        details={"arguments": len(args), "debaters": len(speakers), "pairs": len(distances)},
    )


def _support(item: list[str], passages: list[set[str]]) -> float:
    """Share of the item's content words found in its best passage, times the share of its numbers
    found in any passage (a number no passage gives is the commonest made-up evidence)."""
    if not item:
        return 0.0
    best = max(len(set(item) & p) / len(set(item)) for p in passages)
    numbers = _numbers(item)
    if numbers:
        given = set().union(*passages)
        best *= len(numbers & given) / len(numbers)
    return best


def evidence_quality(result: DebateResult) -> Measured:
    """Mean support of the evidence items (each debater's ``supporting_evidence``, or the sentences of
    its turns, and of a free-text decision) by the context passages the debate was given."""
    if not result.task.context:
        return "the debate was given no context passages to check its evidence against"
    question = set(words(result.task.question))
    passages = [set(words(c.text)) for c in result.task.context]
    texts: list[str] = [e for a in arguments(result) for e in a.evidence]
    texts += [s for t in result.decision_turns if t.ok and t.parsed is None for s in sentences(t.text or "")]
    items = [[w for w in words(_CITATION.sub(" ", t)) if w not in question] for t in texts]
    items = [i for i in items if len(set(i)) >= 2]
    if not items:
        return "no argument makes a claim of two content words or more to check"
    supports = [_support(i, passages) for i in items]
    made_up = sorted({n for i in items for n in _numbers(i)} - set().union(*passages))
    return QualityScore(
        value=round(total(supports) / len(supports), 6),
        method="deterministic",
        details={
            "items": len(items),
            "grounded": sum(s >= GROUNDED for s in supports),
            "numbers_not_in_context": made_up[:10],
        },
    )


def consensus_quality(result: DebateResult) -> Measured:
    """Share of the last round's typed answers that equal the final decision (not measured with fewer
    than two answers: one answer agrees with itself)."""
    dynamics = result.dynamics or compute_dynamics(result)
    typed = [rd for rd in dynamics.rounds if rd.majority is not None]
    if not typed:
        return "no typed answers to compare (free-text or argument turns): consensus needs comparable answers"
    final = normalize_answer(result.final_answer)
    if final is None:
        return "the debate reached no final answer"
    last = typed[-1]
    given = [a for a in last.answers.values() if a is not None]
    if len(given) < 2:
        return _trivial(result, "one answer always agrees with itself, so consensus would be 1 by construction")
    share = sum(a == final for a in given) / len(given)
    return QualityScore(
        value=round(share, 6),
        method="deterministic",
        details={
            "round": last.round,
            "answers": len(given),
            "final_answer": final,
            "majority": last.majority,
            "agreement": last.agreement,
            "unanimous": last.agreement == 1.0,
        },
    )


def decision_confidence(result: DebateResult) -> Measured:
    """The decision's own confidence: a judge's or seed 004's argument-strength confidence, or a vote's
    winning share (weight of the winner over all weight; not measured for a vote of one ballot, whose
    share is 1 whatever it says)."""
    if result.final_answer is None:
        return "the debate reached no decision"
    decision = result.decision or {}
    for key, source in (("confidence", "the decision's stated confidence"), ("share", "the vote's winning share")):
        value = decision.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            ballots = decision.get("ballots")
            if key == "share" and isinstance(ballots, list) and len(ballots) < 2:
                return _trivial(result, "a vote of one ballot has a winning share of 1 by construction")
            return QualityScore(
                value=round(max(0.0, min(1.0, float(value))), 6),
                method="deterministic",
                details={"source": source, "decision": decision.get("kind")},
            )
    kind = decision.get("kind") or "a free-text synthesis"
    return f"the decision ({kind}) states no confidence"
