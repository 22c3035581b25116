"""When an ABSA debate is deadlocked (four observations on its claims, two of them a deadlock) and
the memory of resolved past cases injected then (:mod:`moot.apps.absa.pipeline`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from moot.apps.absa.mapping import match_target, normalize
from moot.apps.absa.types import (
    DATA_DIR,
    PanelTurn,
    PatchTurn,
)
from moot.core.state import DebateState, RoundPlan
from moot.core.stop import StopCondition
from moot.core.types import DebateResult
from moot.files import read_jsonl

MEMORY_PATH = DATA_DIR / "memory-v1.jsonl"


# ----------------------------------------------------------------------------------- deadlock


def _claims(turn_parsed: dict[str, Any], speaker: str, variant: str, terms: list[str]) -> set[tuple[str, str, str]]:
    """(speaker, normalised aspect, claim) with claim a polarity, ``drop`` or ``keep``."""
    out: set[tuple[str, str, str]] = set()
    if variant == "patch":
        for e in PatchTurn.model_validate({**turn_parsed, "agent": speaker}).proposed_edits:
            target = normalize(e.target)
            if e.op == "drop_tuple":
                out.add((speaker, target, "drop"))
            elif e.op == "set_polarity" and (e.value or e.polarity):
                out.add((speaker, target, str(e.value or e.polarity).strip().lower()))
            elif e.op in ("confirm_tuple", "set_aspect_ref", "merge_tuples"):
                out.add((speaker, target, "keep"))
    else:
        turn = PanelTurn.model_validate(turn_parsed)
        polarity = {"pro": "positive", "con": "negative"}.get(turn.stance.strip().lower())
        if polarity is not None:
            for ref in turn.aspect_refs:
                for term in match_target(ref, terms) or [ref]:
                    out.add((speaker, normalize(term), polarity))
    return out


def _confidences(turn_parsed: dict[str, Any]) -> list[float]:
    return [
        float(e["confidence"])
        for e in turn_parsed.get("proposed_edits") or []
        if isinstance(e, dict) and isinstance(e.get("confidence"), int | float)
    ]


def observe_deadlock(result: DebateResult, variant: str, terms: list[str]) -> dict[str, bool]:
    """The four observations on the last round (see the module docstring)."""
    rounds = result.rounds
    if not rounds:
        return {"polarity_conflict": False, "keep_drop_conflict": False, "stalled": False, "low_confidence": False}

    def claims_of(index: int) -> set[tuple[str, str, str]]:
        return {
            c for t in rounds[index].turns if t.parsed is not None for c in _claims(t.parsed, t.speaker, variant, terms)
        }

    last = claims_of(-1)
    by_aspect: dict[str, set[str]] = {}
    for _, aspect, claim in last:
        by_aspect.setdefault(aspect, set()).add(claim)
    confidences = [c for t in rounds[-1].turns if t.parsed is not None for c in _confidences(t.parsed)]
    return {
        "polarity_conflict": any(len(v - {"drop", "keep"}) >= 2 for v in by_aspect.values()),
        "keep_drop_conflict": any("drop" in v and len(v - {"drop"}) >= 1 for v in by_aspect.values()),
        "stalled": len(rounds) >= 2 and bool(last) and last == claims_of(-2),
        "low_confidence": bool(confidences) and sum(confidences) / len(confidences) < 0.6,
    }


def is_deadlock(observations: dict[str, bool]) -> bool:
    return sum(observations.values()) >= 2


class UntilResolved(StopCondition):
    """With a memory injection: stop after a round that is not deadlocked (the cap is the rounds)."""

    def __init__(self, variant: str, terms: list[str]) -> None:
        self.variant, self.terms = variant, terms

    def check(self, state: DebateState, spec: RoundPlan) -> str | None:
        if state.result.rounds and not is_deadlock(observe_deadlock(state.result, self.variant, self.terms)):
            return "no_deadlock"
        return None

    def expr(self) -> str:
        return "no_deadlock"


class MemoryStore:
    """Resolved past cases (JSONL: ``text``, ``aspect``, ``polarity``, ``resolution``), retrieved by the
    aspects they share with the sentence, then by word overlap."""

    def __init__(self, cases: list[dict[str, Any]]) -> None:
        self.cases = cases

    @classmethod
    def load(cls, path: str | Path | None = None) -> MemoryStore:
        p = Path(path) if path else MEMORY_PATH
        cases = read_jsonl(p, "memory store")
        for n, case in cases:
            if not isinstance(case, dict):
                raise ValueError(f"memory store {str(p)!r}, line {n}: each line holds one case (a JSON object)")
        return cls([case for _, case in cases])

    def retrieve(self, sentence: str, terms: list[str], k: int) -> list[dict[str, Any]]:
        words = set(re.findall(r"\w+", sentence.lower()))
        wanted = {normalize(t) for t in terms}

        def score(case: dict[str, Any]) -> tuple[int, int]:
            same_aspect = int(normalize(str(case.get("aspect", ""))) in wanted)
            overlap = len(words & set(re.findall(r"\w+", str(case.get("text", "")).lower())))
            return (same_aspect, overlap)

        ranked = sorted(self.cases, key=score, reverse=True)
        return [c for c in ranked[:k] if score(c) != (0, 0)]
