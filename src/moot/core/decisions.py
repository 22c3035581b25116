"""Decision rules that need no model call: votes over typed answers, and rules given as functions.

The LLM decisions (synthesize, judge) live in the engine because they make calls; everything
here is a pure function of the transcript, so it is exact and testable.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import BaseModel

from moot.core.answers import answer_of, confidence_of
from moot.core.types import DebateResult, Turn
from moot.stats import total


class DecisionOutcome(BaseModel):
    """What a decision produced: the answer (None when it cannot decide) and how it got there."""

    final_answer: str | None
    details: dict[str, Any]
    error: str | None = None


def reconcile_calibration(confidence: float) -> float:
    """ReConcile's mapping of a model's stated confidence to a vote weight (LLMs over-state it)."""
    if confidence >= 1.0:
        return 1.0
    if confidence >= 0.9:
        return 0.8
    if confidence >= 0.8:
        return 0.5
    if confidence > 0.6:
        return 0.3
    return 0.1


def softmax_weight(signal: float, top: float, temperature: float) -> float:
    """CISC's softmax vote weight of a sample whose confidence signal is ``signal``: exp(signal / T),
    shifted by ``top`` (the largest signal among the voters, so it never overflows; a common factor
    that changes no vote). T = inf weighs every sample 1: a plain vote. The one weight of the
    protocols' weighted votes and of the eval's derivations of them (:mod:`moot.eval.pool`)."""
    if math.isinf(temperature):
        return 1.0
    return math.exp((signal - top) / temperature)


def plurality(weights: Mapping[str, float]) -> list[str]:
    """The answers tied for the largest weight, in the mapping's order (the order they were first
    given, so ``[0]`` is the tie rule's pick: the answer given first). The one tie test of every vote,
    the protocols' and the eval's derivations of them alike: weights within a relative 1e-12 of the
    largest are tied, since equal sums of float weights can differ in their last bits by the order
    they were added in (relative to the largest magnitude, so that scores that cancel to about 0 tie
    with 0). A NaN weight never leads."""
    usable = {a: w for a, w in weights.items() if not math.isnan(w)}
    if not usable:
        return []
    best = max(usable.values())
    tol = 1e-12 * max((abs(w) for w in usable.values() if math.isfinite(w)), default=0.0)
    return [a for a, w in usable.items() if w == best or abs(w - best) <= tol]


def voting_turns(result: DebateResult, rounds: str, speakers: list[str] | None) -> list[Turn]:
    chosen = result.rounds[-1:] if rounds == "last" else result.rounds
    return [t for r in chosen for t in r.turns if speakers is None or t.speaker in speakers]


def _signal_value(turn: Turn, signal: str, answer_field: str) -> float | None:
    """A turn's confidence by name: a probe signal, or ``stated`` (its typed confidence)."""
    if signal == "stated":
        return confidence_of(turn)
    return turn.signals.get(signal)


def _signal_of(turn: Turn, signal: str, answer_field: str) -> float:
    value = _signal_value(turn, signal, answer_field)
    return -math.inf if value is None else value


_NO_LOGPROBS = (
    " (does the model's backend return log-probabilities? llama.cpp and OpenAI-compatible servers do when asked)"
)


def vote(
    result: DebateResult,
    *,
    answer_field: str = "answer",
    confidence_field: str | None = None,
    calibrate: bool = False,
    rounds: str = "last",
    speakers: list[str] | None = None,
    tie_break: str = "first",
    signal: str | None = None,
    softmax_temperature: float | None = None,
    keep: float | None = None,
    filter_signal: str = "seq_prob",
) -> DecisionOutcome:
    """Majority vote (``confidence_field=None``) or confidence-weighted vote over typed answers.

    Turns without an extracted answer (free text, parse failures, errors) do not vote and are
    counted as abstentions. With ``signal`` each vote weighs its turn's probe signal (a turn without
    it abstains), and with ``softmax_temperature`` T the weights are CISC's softmax(signal / T) over
    the voting turns (``signal="stated"``: the confidence the turn states). With ``keep`` only the
    most confident share of the answering turns votes, ranked by ``filter_signal`` (DeepConf-style
    filtering; a turn without that signal ranks last; ties keep the earlier turn). A tie is reported
    as such; with ``tie_break="first"`` the tied answer given first wins, with ``"none"`` there is
    no answer.
    """
    weights: dict[str, float] = {}
    abstained = 0
    ballots: list[dict[str, Any]] = []
    turns = voting_turns(result, rounds, speakers)
    filtered = 0
    unranked = False
    if keep is not None:
        answering = [t for t in turns if answer_of(t, answer_field) is not None]
        # Nothing to rank by (no answer carries the signal): none is kept, not the first ones given.
        unranked = bool(answering) and all(_signal_value(t, filter_signal, answer_field) is None for t in answering)
        kept_n = max(1, math.ceil(keep * len(answering))) if answering and not unranked else 0
        ranked = sorted(range(len(answering)), key=lambda i: -_signal_of(answering[i], filter_signal, answer_field))
        kept = {id(answering[i]) for i in ranked[:kept_n]}
        filtered = len(answering) - len(kept)
        turns = [t for t in turns if id(t) in kept]
    signals = [_signal_value(t, signal, answer_field) if signal else None for t in turns]
    top_signal = max((s for s in signals if s is not None), default=0.0)
    for i, turn in enumerate(turns):
        answer = answer_of(turn, answer_field)
        if answer is None or (signal is not None and signals[i] is None):
            abstained += 1
            continue
        weight = 1.0
        if signal is not None:
            value = signals[i] or 0.0
            weight = softmax_weight(value, top_signal, softmax_temperature) if softmax_temperature else value
        elif confidence_field is not None:
            conf = confidence_of(turn, confidence_field)
            weight = 0.0 if conf is None else (reconcile_calibration(conf) if calibrate else conf)
        weights[answer] = weights.get(answer, 0.0) + weight
        ballots.append({"speaker": turn.speaker, "round": turn.round, "answer": answer, "weight": weight})
    details: dict[str, Any] = {
        "votes": {a: round(w, 6) for a, w in weights.items()},
        "ballots": ballots,
        "abstained": abstained,
        **({"filtered_out": filtered} if keep is not None else {}),
        "weighted": confidence_field is not None or signal is not None,
        "calibrated": calibrate,
        "tie": False,
    }
    if not weights:
        answered = any(answer_of(t, answer_field) is not None for t in turns)
        if unranked:
            error = f"no answer carried the confidence signal {filter_signal!r} the vote filters by" + (
                "" if filter_signal == "stated" else _NO_LOGPROBS
            )
        elif signal is not None and answered:
            error = f"no answer carried the confidence signal {signal!r} the vote weighs by{_NO_LOGPROBS}"
        else:
            error = "no participant gave a typed answer to vote on"
        return DecisionOutcome(final_answer=None, details=details, error=error)
    leaders = plurality(weights)  # ``weights`` is in the order the answers were first given
    if not leaders:
        return DecisionOutcome(final_answer=None, details=details, error="every vote's weight was undefined (NaN)")
    best = weights[leaders[0]]
    if len(leaders) > 1:
        details["tie"] = True
        details["tied"] = leaders
        if tie_break == "none":
            return DecisionOutcome(final_answer=None, details=details, error=f"tie between {', '.join(leaders)}")
    details["winner"] = leaders[0]
    weight = total(weights.values())
    details["share"] = round(best / weight, 6) if weight else 0.0
    return DecisionOutcome(final_answer=leaders[0], details=details)


class SelectedReply(BaseModel):
    """One reply a selection judge was shown, as ``Response {index}``."""

    speaker: str
    round: int
    answer: str


class Selection(BaseModel):
    """What a selection decision recorded (``DebateResult.decision`` of ``kind: select``): the
    replies shown, the one picked, or, when the judge named no valid reply, ``fallback: vote``
    with the reason and the vote's own details. The eval report counts the fallbacks per protocol."""

    kind: Literal["select"] = "select"
    mode: Literal["consistency", "judge"]
    responses: list[SelectedReply]
    selected: int | None = None
    speaker: str | None = None
    answer: str | None = None
    fallback: Literal["vote"] | None = None
    fallback_reason: str | None = None
    vote: dict[str, Any] | None = None


def selection_of(decision: Mapping[str, Any] | None) -> Selection | None:
    """A result's selection record (None when its decision was not a selection)."""
    if not decision or decision.get("kind") != "select":
        return None
    return Selection.model_validate(decision)


def tied_answers(decision: Mapping[str, Any] | None) -> list[str] | None:
    """The answers a result's decision tied between (None: it was no tie): a vote's, trajectory
    scoring's, or, when a selection judge named no valid reply, those of the vote it fell back to
    (recorded under ``vote``). Empty for a tie recorded without its answers (runs stored before the
    decisions named them)."""
    if not decision:
        return None
    if decision.get("kind") == "select":
        return tied_answers(decision.get("vote")) if decision.get("fallback") == "vote" else None
    if not decision.get("tie"):
        return None
    tied = decision.get("tied")
    return [str(a) for a in tied] if isinstance(tied, list) else []


RuleFn = Callable[[DebateResult, dict[str, Any]], DecisionOutcome]
_RULES: dict[str, RuleFn] = {}


def register_rule(name: str, fn: RuleFn) -> RuleFn:
    """Make ``fn(result, params) -> DecisionOutcome`` usable as ``decision: {kind: rule, name: ...}``."""
    _RULES[name] = fn
    return fn


def get_rule(name: str) -> RuleFn:
    try:
        return _RULES[name]
    except KeyError:
        raise KeyError(f"no decision rule named {name!r}; registered: {', '.join(sorted(_RULES)) or 'none'}") from None


def rule_names() -> list[str]:
    return sorted(_RULES)


def argument_strength(result: DebateResult, params: dict[str, Any]) -> DecisionOutcome:
    """Seed 004's final decision: confidence-weighted argument strength.

    Strength of a side = sum over its typed arguments of (the arguer's confidence x the
    moderator's score of that side in the same round). SUPPORT if the pro side exceeds the con
    side by the margin (1.2x), OPPOSE symmetrically, else UNCERTAIN at 0.5; the confidence is the
    winning share, capped at 0.95.
    """
    pro_ids = set(params.get("pro", ["proponent"]))
    con_ids = set(params.get("con", ["opponent"]))
    moderator = params.get("moderator", "moderator")
    margin = float(params.get("margin", 1.2))
    cap = float(params.get("cap", 0.95))
    pro = con = 0.0
    for rnd in result.rounds:
        scores: dict[str, Any] = {}
        for t in rnd.turns:
            if t.speaker == moderator and t.ok and t.parsed:
                scores = t.parsed
        for t in rnd.turns:
            conf = confidence_of(t)
            if conf is None:
                continue
            if t.speaker in pro_ids:
                pro += conf * float(scores.get("pro_score", 1.0))
            elif t.speaker in con_ids:
                con += conf * float(scores.get("con_score", 1.0))
    details: dict[str, Any] = {"pro_strength": round(pro, 6), "con_strength": round(con, 6), "margin": margin}
    if pro == 0 and con == 0:
        details.update(conclusion="UNCERTAIN", confidence=0.5)
        return DecisionOutcome(final_answer="UNCERTAIN", details=details)
    if pro > con * margin:
        details.update(conclusion="SUPPORT", confidence=min(pro / (pro + con), cap))
    elif con > pro * margin:
        details.update(conclusion="OPPOSE", confidence=min(con / (pro + con), cap))
    else:
        details.update(conclusion="UNCERTAIN", confidence=0.5)
    return DecisionOutcome(final_answer=str(details["conclusion"]), details=details)


register_rule("argument-strength", argument_strength)


def trajectory(result: DebateResult, params: dict[str, Any]) -> DecisionOutcome:
    """Free-MAD-style trajectory scoring: every round's answers count, not only the last.

    Each agent's first answer scores ``initial``. In every later round an answer the agent keeps
    scores ``keep`` again: it held up under the others' arguments; an answer it switches to scores
    ``switch``, and the answer it abandoned loses ``abandon``. With ``decay: true`` round k's
    weights are divided by k (Free-MAD's f(k) = 1/(k+1), counting the first answers as k = 0).
    So a minority answer defended to the end can beat a majority formed by switching. The defaults
    (1, 1, 0.5, 0.5, no decay) are moot's first version; the ``free-mad`` preset passes Free-MAD's
    Algorithm 1 weights (20, 20, 30, 25 with decay).
    """
    w_initial = float(params.get("initial", 1.0))
    w_keep = float(params.get("keep", 1.0))
    w_switch = float(params.get("switch", 0.5))
    w_abandon = float(params.get("abandon", 0.5))
    decay = bool(params.get("decay", False))
    field = str(params.get("answer_field", "answer"))
    scores: dict[str, float] = {}
    held: dict[str, str] = {}
    for rnd in result.rounds:
        for turn in rnd.turns:
            answer = answer_of(turn, field)
            if answer is None:
                continue
            before = held.get(turn.speaker)
            f = 1.0 / rnd.index if decay else 1.0
            if before is None:
                scores[answer] = scores.get(answer, 0.0) + w_initial * f
            elif before == answer:
                scores[answer] = scores.get(answer, 0.0) + w_keep * f
            else:
                scores[answer] = scores.get(answer, 0.0) + w_switch * f
                scores[before] = scores.get(before, 0.0) - w_abandon * f
            held[turn.speaker] = answer
    details: dict[str, Any] = {"scores": {a: round(v, 6) for a, v in scores.items()}}
    if not scores:
        return DecisionOutcome(final_answer=None, details=details, error="no participant gave a typed answer")
    leaders = plurality(scores)  # ``scores`` is in the order the answers were first given
    if not leaders:
        return DecisionOutcome(final_answer=None, details=details, error="every answer's score was undefined (NaN)")
    details.update(winner=leaders[0], tie=len(leaders) > 1, final_majority=_majority(held.values()))
    if len(leaders) > 1:
        details["tied"] = leaders
    return DecisionOutcome(final_answer=leaders[0], details=details)


def _majority(answers: Any) -> str | None:
    counts = Counter(answers).most_common(2)
    if not counts or (len(counts) > 1 and counts[0][1] == counts[1][1]):
        return None
    return str(counts[0][0])


register_rule("trajectory", trajectory)
