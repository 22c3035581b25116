"""How far each quality measure agrees with hand labels (the labelled set shipped with moot).

The set (``moot/data/quality/labelled.yaml``) holds short debates, each labelled 0 (low), 1
(medium) or 2 (high) on the dimensions a person can judge in it, by the rules in docs/quality.md.
For each dimension the agreement is Kendall's tau-b between the measure and the labels over the
debates that have both, and the concordance: of the pairs of debates whose labels differ, the share
the measure orders the same way (a tie in the measure counts half; 0.5 is chance).
"""

from __future__ import annotations

import asyncio
import math
from importlib import resources
from itertools import combinations
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from moot.core.dynamics import compute_dynamics
from moot.core.types import QUALITY_DIMENSIONS, ContextChunk, DebateQuality, DebateResult, DebateTask, Round, Turn
from moot.files import first_error, load_yaml, read_text
from moot.models.base import BaseChatModel
from moot.quality import assess, measure
from moot.structured import dumps_compact

Label = Literal[0, 1, 2]


class LabelledTurn(BaseModel):
    """A turn of a labelled debate: free text, or a typed value (``parsed``)."""

    model_config = ConfigDict(extra="forbid")

    speaker: str
    role: str = ""
    round: int = Field(ge=1)
    text: str | None = None
    parsed: dict[str, Any] | None = None


class LabelledDebate(BaseModel):
    """A short debate with its hand labels (0 low, 1 medium, 2 high; absent: not applicable)."""

    model_config = ConfigDict(extra="forbid")

    id: str
    protocol: str = "labelled"
    question: str
    context: list[str] = Field(default_factory=list)
    turns: list[LabelledTurn]
    #: A free-text decision (a synthesis), if the debate ended with one.
    synthesis: str | None = None
    final_answer: str | None = None
    decision: dict[str, Any] | None = None
    labels: dict[str, Label]
    note: str = ""

    def to_result(self) -> DebateResult:
        """The debate as moot's own result type, as if the engine had run it."""
        rounds: dict[int, Round] = {}
        roles: dict[str, str] = {}
        for t in self.turns:
            roles.setdefault(t.speaker, t.role)
            shown = t.text
            if shown is None and t.parsed is not None:
                shown = str(t.parsed.get("content") or t.parsed.get("answer") or dumps_compact(t.parsed))
            turn = Turn(
                speaker=t.speaker,
                name=t.speaker.title(),
                role=t.role,
                round=t.round,
                model="labelled",
                messages=[],
                text=shown,
                raw=shown,
                parsed=t.parsed,
                calls=1,
            )
            rounds.setdefault(t.round, Round(index=t.round)).turns.append(turn)
        decision_turns = []
        if self.synthesis is not None:
            decision_turns.append(
                Turn(
                    speaker="decision",
                    name="Synthesizer",
                    round=max(rounds),
                    kind="decision",
                    model="labelled",
                    messages=[],
                    text=self.synthesis,
                    raw=self.synthesis,
                    calls=1,
                )
            )
        result = DebateResult(
            protocol=self.protocol,
            task=DebateTask(question=self.question, context=[ContextChunk(text=c) for c in self.context]),
            participants=[{"id": s, "name": s.title(), "role": r} for s, r in roles.items()],
            status="complete",
            stop_reason="max_rounds",
            rounds=[rounds[i] for i in sorted(rounds)],
            decision_turns=decision_turns,
            final_answer=self.final_answer if self.final_answer is not None else self.synthesis,
            decision=self.decision,
        )
        result.dynamics = compute_dynamics(result)
        return result


def labelled_path() -> Path:
    return Path(str(resources.files("moot") / "data" / "quality" / "labelled.yaml"))


def load_labelled(path: str | Path | None = None) -> list[LabelledDebate]:
    """The labelled debates (the shipped set by default). Bad input: ValueError naming the item."""
    p = Path(path) if path is not None else labelled_path()
    try:
        data = load_yaml(read_text(p, "labelled set"))
    except yaml.YAMLError as exc:
        raise ValueError(f"{p} is not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, list):
        raise ValueError(f"{p}: expected a list of labelled debates")
    out = []
    for i, item in enumerate(data):
        try:
            debate = LabelledDebate.model_validate(item)
        except ValidationError as exc:
            first = first_error(exc)
            where = ".".join(str(x) for x in first["loc"])
            raise ValueError(
                f"{p}: item {i} ({item.get('id') if isinstance(item, dict) else '?'}): invalid {where}: {first['msg']}"
            ) from None
        unknown = set(debate.labels) - set(QUALITY_DIMENSIONS)
        if unknown:
            raise ValueError(f"{p}: item {debate.id}: unknown dimension(s) {', '.join(sorted(unknown))}")
        out.append(debate)
    return out


def kendall_tau_b(xs: list[float], ys: list[float]) -> float | None:
    """Kendall's tau-b (ties in either variable allowed); None when either variable is constant."""
    concordant = discordant = ties_x = ties_y = 0
    for (x1, y1), (x2, y2) in combinations(zip(xs, ys, strict=True), 2):
        dx, dy = x1 - x2, y1 - y2
        if dx == 0 and dy == 0:
            continue
        if dx == 0:
            ties_x += 1
        elif dy == 0:
            ties_y += 1
        elif (dx > 0) == (dy > 0):
            concordant += 1
        else:
            discordant += 1
    denom = math.sqrt((concordant + discordant + ties_x) * (concordant + discordant + ties_y))
    return None if denom == 0 else (concordant - discordant) / denom


def concordance(measures: list[float], labels: list[float]) -> tuple[float | None, int]:
    """Of the pairs whose labels differ, the share the measure orders alike (its ties count half)."""
    score = 0.0
    pairs = 0
    for (m1, l1), (m2, l2) in combinations(zip(measures, labels, strict=True), 2):
        if l1 == l2:
            continue
        pairs += 1
        if m1 == m2:
            score += 0.5
        elif (m1 > m2) == (l1 > l2):
            score += 1.0
    return (score / pairs if pairs else None), pairs


class DimensionAgreement(BaseModel):
    dimension: str
    method: str
    #: Debates labelled on this dimension; of them, the measured ones (the others: ``unmeasured``).
    labelled: int
    measured: int
    unmeasured: int
    tau_b: float | None = None
    concordance: float | None = None
    pairs: int = 0


class AgreementReport(BaseModel):
    debates: int
    judge: str | None = None
    dimensions: list[DimensionAgreement]


def compare(debates: list[LabelledDebate], qualities: list[DebateQuality], judge: str | None) -> AgreementReport:
    rows = []
    for dim in QUALITY_DIMENSIONS:
        pairs = [(d.labels[dim], q.scores.get(dim)) for d, q in zip(debates, qualities, strict=True) if dim in d.labels]
        both = [(float(label), score.value) for label, score in pairs if score is not None]
        methods = {score.method for _, score in pairs if score is not None}
        tau = kendall_tau_b([m for _, m in both], [lab for lab, _ in both]) if len(both) > 1 else None
        conc, npairs = concordance([m for _, m in both], [lab for lab, _ in both])
        rows.append(
            DimensionAgreement(
                dimension=dim,
                method="/".join(sorted(methods)) or "–",
                labelled=len(pairs),
                measured=len(both),
                unmeasured=len(pairs) - len(both),
                tau_b=None if tau is None else round(tau, 3),
                concordance=None if conc is None else round(conc, 3),
                pairs=npairs,
            )
        )
    return AgreementReport(debates=len(debates), judge=judge, dimensions=rows)


async def agreement(
    debates: list[LabelledDebate] | None = None, judge: BaseChatModel | None = None, *, concurrency: int = 4
) -> AgreementReport:
    """Each measure against the labels; with ``judge`` the judged dimensions too (one call per debate)."""
    items = debates if debates is not None else load_labelled()
    results = [d.to_result() for d in items]
    if judge is None:
        qualities = [measure(r) for r in results]
    else:
        gate = asyncio.Semaphore(max(1, concurrency))

        async def one(result: DebateResult) -> DebateQuality:
            async with gate:
                return await assess(result, judge)

        qualities = list(await asyncio.gather(*(one(r) for r in results)))
    return compare(items, qualities, judge.name if judge is not None else None)
