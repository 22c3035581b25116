"""Decisions: votes (ties, weights, calibration, abstentions), rules, and the typed LLM judge."""

from __future__ import annotations

import math

import pytest

from moot import ScriptedModel
from moot.core import (
    Engine,
    JudgeDecision,
    NoDecision,
    Participant,
    Persona,
    ProtocolSpec,
    RuleDecision,
    TurnFormat,
    Visibility,
    VoteDecision,
)
from moot.core.decisions import argument_strength, plurality, reconcile_calibration, register_rule, vote
from moot.core.types import DebateResult, DebateTask, Round, Turn
from moot.models.base import ChatRequest


def spec_with(decision: object, n: int = 3, rounds: int = 1) -> ProtocolSpec:
    return ProtocolSpec.model_validate(
        {
            "name": "d",
            "participants": [Participant(id=f"p{i}", persona=Persona(name=f"P{i}")) for i in range(n)],
            "rounds": rounds,
            "visibility": Visibility(who="none"),
            "turn": TurnFormat(schema="answer"),
            "decision": decision,
        }
    )


def answers(*pairs: tuple[str, float] | str) -> ScriptedModel:
    replies: list[dict[str, object] | str] = []
    for p in pairs:
        replies.append(p if isinstance(p, str) else {"answer": p[0], "confidence": p[1]})
    return ScriptedModel(replies)


async def test_majority_vote_counts_normalised_typed_answers() -> None:
    result = await Engine(spec_with(VoteDecision()), answers(("(B)", 0.2), ("b.", 0.3), ("A", 0.99))).run("Q?")
    assert result.final_answer == "B" and result.status == "complete"
    assert result.decision is not None
    assert result.decision["votes"] == {"B": 2.0, "A": 1.0} and result.decision["tie"] is False
    assert result.llm_calls == 3  # a vote costs no call


async def test_confidence_weighted_vote_can_overturn_the_majority() -> None:
    model = answers(("B", 0.3), ("B", 0.3), ("A", 0.99))
    result = await Engine(spec_with(VoteDecision(weighted=True)), model).run("Q?")
    assert result.final_answer == "A" and result.decision["votes"] == {"B": 0.6, "A": 0.99}  # type: ignore[index]


async def test_reconcile_calibration_flattens_overconfidence() -> None:
    assert [reconcile_calibration(c) for c in (1.0, 0.95, 0.85, 0.7, 0.6, 0.1)] == [1.0, 0.8, 0.5, 0.3, 0.1, 0.1]
    model = answers(("B", 0.9), ("B", 0.9), ("A", 1.0))
    result = await Engine(spec_with(VoteDecision(weighted=True, calibrate=True)), model).run("Q?")
    assert result.final_answer == "B" and result.decision["votes"] == {"B": 1.6, "A": 1.0}  # type: ignore[index]


async def test_ties_are_reported_and_broken_only_when_asked() -> None:
    first = await Engine(spec_with(VoteDecision(), n=2), answers(("A", 0.5), ("B", 0.5))).run("Q?")
    assert first.final_answer == "A" and first.decision["tie"] is True  # type: ignore[index]
    assert first.decision["tied"] == ["A", "B"]  # type: ignore[index]
    strict = await Engine(spec_with(VoteDecision(tie_break="none"), n=2), answers(("A", 0.5), ("B", 0.5))).run("Q?")
    assert strict.final_answer is None and strict.status == "failed" and strict.error == "tie between A, B"


async def test_unparsed_answers_abstain_and_nothing_to_vote_on_fails() -> None:
    model = answers(("A", 0.5), "prose", "still prose", ("A", 0.4))
    result = await Engine(spec_with(VoteDecision()), model).run("Q?")
    assert result.final_answer == "A" and result.decision["abstained"] == 1  # type: ignore[index]
    unparsed = await Engine(spec_with(VoteDecision(), n=1), answers("prose", "prose")).run("Q?")
    assert unparsed.status == "failed" and unparsed.stop_reason == "all_failed"
    assert unparsed.error == "P0's reply could not be parsed: expected a JSON object, got str"
    free_text = spec_with(VoteDecision(), n=1)
    free_text.turn = TurnFormat()  # answers that are not typed never vote, even if they read "A"
    none = await Engine(free_text, ScriptedModel(["A"])).run("Q?")
    assert none.status == "failed" and none.error == "no participant gave a typed answer to vote on"


async def test_trajectory_vote_uses_every_round() -> None:
    spec = spec_with(VoteDecision(rounds="all"), n=1, rounds=3)
    result = await Engine(spec, answers(("A", 0.5), ("A", 0.5), ("B", 0.5))).run("Q?")
    assert result.final_answer == "A" and result.decision["votes"] == {"A": 2.0, "B": 1.0}  # type: ignore[index]


def strength_result(pro: list[float], con: list[float], scores: list[tuple[float, float]]) -> DebateResult:
    rounds = []
    for i, (p, c, (ps, cs)) in enumerate(zip(pro, con, scores, strict=True), start=1):

        def turn(speaker: str, parsed: dict[str, object], i: int = i) -> Turn:
            return Turn(speaker=speaker, name=speaker, round=i, model="m", messages=[], text="t", parsed=parsed)

        rounds.append(
            Round(
                index=i,
                turns=[
                    turn("proponent", {"confidence": p}),
                    turn("opponent", {"confidence": c}),
                    turn("moderator", {"pro_score": ps, "con_score": cs, "confidence": 0.5}),
                ],
            )
        )
    return DebateResult(protocol="m", task=DebateTask(question="Q"), rounds=rounds)


@pytest.mark.req("S004-DECISION")
@pytest.mark.parametrize(
    ("pro", "con", "scores", "conclusion", "confidence"),
    [
        ([0.9], [0.5], [(1.0, 1.0)], "SUPPORT", 0.9 / 1.4),
        ([0.6], [0.5], [(1.0, 1.0)], "UNCERTAIN", 0.5),  # 0.6 is not > 1.2 x 0.5
        ([0.61], [0.5], [(1.0, 1.0)], "SUPPORT", 0.61 / 1.11),  # just over the margin
        ([0.5], [0.9], [(1.0, 0.9)], "OPPOSE", 0.81 / 1.31),
        ([1.0], [0.01], [(1.0, 1.0)], "SUPPORT", 0.95),  # capped
        ([0.9, 0.9], [0.9, 0.9], [(0.2, 1.0), (0.2, 1.0)], "OPPOSE", 1.8 / 2.16),  # moderator scores weigh in
    ],
)
def test_seed_004_argument_strength_rule(
    pro: list[float], con: list[float], scores: list[tuple[float, float]], conclusion: str, confidence: float
) -> None:
    outcome = argument_strength(strength_result(pro, con, scores), {})
    assert outcome.final_answer == conclusion
    assert outcome.details["confidence"] == pytest.approx(confidence)


async def test_registered_rules_decide_and_unknown_rules_are_spec_errors() -> None:
    from moot.core.decisions import DecisionOutcome

    register_rule("longest", lambda r, params: DecisionOutcome(
        final_answer=max((t.text or "" for t in r.turns()), key=len), details={"by": params.get("by")}
    ))  # fmt: skip
    spec = spec_with(RuleDecision(name="longest", params={"by": "length"}))
    spec.turn = TurnFormat()
    result = await Engine(spec, ScriptedModel(["a", "abc", "ab"])).run("Q?")
    assert result.final_answer == "abc" and result.decision == {"kind": "rule", "by": "length"}
    with pytest.raises(ValueError, match="no decision rule named 'nope'"):
        RuleDecision(name="nope")


async def test_the_judge_returns_a_typed_verdict() -> None:
    model = ScriptedModel(
        [
            {"answer": "4", "confidence": 0.9},
            {"answer": "5", "confidence": 0.4},
            {"answer": "4", "rationale": "P0 showed the work", "confidence": 0.8},
        ]
    )
    result = await Engine(spec_with(JudgeDecision(schema="verdict"), n=2), model).run("2+2?")
    assert result.final_answer == "4" and result.llm_calls == 3
    assert result.decision == {"kind": "judge", "answer": "4", "rationale": "P0 showed the work", "confidence": 0.8}
    judge_prompt = model.requests[2].messages[1].content
    assert "P0" in judge_prompt and "P1" in judge_prompt


async def test_the_mad_judge_extracts_candidates_then_picks() -> None:
    model = ScriptedModel(
        [
            {"answer": "4", "confidence": 0.9},
            {"answer": "5", "confidence": 0.4},
            {"candidates": ["4", "5"]},
            {"answer": "4", "rationale": "arithmetic", "confidence": 0.9},
        ]
    )
    decision = JudgeDecision(schema="verdict", extract_candidates=True, prompt="Pick one of:\n{candidates}")
    result = await Engine(spec_with(decision, n=2), model).run("2+2?")
    assert result.final_answer == "4" and result.llm_calls == 4 and len(result.decision_turns) == 2
    assert model.requests[3].messages[1].content == "Pick one of:\n- 4\n- 5"
    assert spec_with(decision, n=2).planned_calls() == 4


async def test_a_judge_whose_verdict_does_not_parse_fails_explicitly() -> None:
    model = ScriptedModel([{"answer": "4", "confidence": 0.9}, "I pick 4", "really, 4"])
    result = await Engine(spec_with(JudgeDecision(schema="verdict"), n=1), model).run("2+2?")
    assert result.status == "failed" and result.final_answer is None
    assert result.decision_turns[0].parse_failure is not None
    assert result.error is not None and result.error.startswith("the decision step failed")


def test_judge_schemas_must_exist() -> None:
    with pytest.raises(ValueError, match="no turn schema named 'nope'"):
        spec_with(JudgeDecision(schema="nope"))


async def test_no_decision_needs_no_decision_model(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Engine(spec_with(NoDecision()), ScriptedModel(fn=lambda r: {"answer": "x", "confidence": 1}))
    assert engine.decision_model is None
    _ = ChatRequest


def _signalled(*ballots: tuple[str, float]) -> DebateResult:
    """One round of typed answers, each turn carrying an ``answer_prob`` signal."""
    turns = [
        Turn(speaker=f"p{i}", name=f"P{i}", round=1, model="fake", messages=[], text=a, parsed={"answer": a},
             signals={"answer_prob": w})
        for i, (a, w) in enumerate(ballots)
    ]  # fmt: skip
    return DebateResult(protocol="d", task=DebateTask(question="Q?"), rounds=[Round(index=1, turns=turns)])


def test_a_tie_in_float_weights_is_a_tie_whatever_order_they_were_added_in() -> None:
    # 0.1 + 0.2 is 0.30000000000000004 in floats: B's 0.3 and A's two ballots are tied all the same,
    # and the tie goes to the answer given first (B), as the eval's derivation of the rule decides.
    result = _signalled(("B", 0.3), ("A", 0.1), ("A", 0.2))
    outcome = vote(result, signal="answer_prob")
    assert outcome.details["tie"] is True and outcome.details["tied"] == ["B", "A"]
    assert outcome.final_answer == "B"
    assert plurality({"B": 0.3, "A": 0.1 + 0.2}) == ["B", "A"] and plurality({}) == []
    assert plurality({"A": 1.0, "B": 2.0, "C": 2.0 - 1e-9}) == ["B"]  # a real margin is no tie
    # Scores that cancel to about 0 (trajectory's abandon weights) tie with 0; NaN never leads.
    assert plurality({"A": 0.1 + 0.2 - 0.3, "B": 0.0, "C": -1.0}) == ["A", "B"]
    assert plurality({"A": math.nan, "B": 1.0}) == ["B"] and plurality({"A": math.nan}) == []
    assert vote(_signalled(("A", math.nan)), signal="answer_prob").error is not None
