"""Rules that were once written twice or three times, now defined once (issue 43, part 3, item 4):
each test pins the one definition, and that its former homes use it."""

from __future__ import annotations

import math

from moot.core.decisions import softmax_weight
from moot.core.types import QualityScore
from moot.eval import goal, tune
from moot.eval.protocols import k_at_budget
from moot.models.base import ChatRequest, Message, chat_payload
from moot.quality.judge import RUBRIC_VERSION, QualityJudgement, judged_scores


def test_the_vote_k_at_a_budget_rounds_half_up_and_is_at_least_one() -> None:
    assert k_at_budget(4.5) == 5  # half up, not half to even (round(4.5) == 4)
    assert k_at_budget(4.49) == 4
    assert k_at_budget(0.2) == 1 and k_at_budget(0.0) == 1
    assert k_at_budget(1250.0, 250.0) == 5  # tokens over one sample's tokens
    assert k_at_budget(1125.0, 250.0) == 5  # 4.5 samples -> 5


def test_tune_matches_a_candidate_to_the_same_k_as_the_report() -> None:
    def score(label: str, calls: float, tokens: float) -> tune.CandidateScore:
        return tune.CandidateScore(
            label=label, items=20, accuracy=0.5, ci_low=0.3, ci_high=0.7, mean_calls=calls, mean_tokens=tokens
        )

    single, debate = score("single", 1.0, 200.0), score("society-of-minds", 4.5, 1300.0)
    assert tune.budget_vote(debate, single, None) == f"vote@{k_at_budget(4.5)}" == "vote@5"
    by_tokens = tune.TuneBudget(kind="tokens", limit=5000)
    assert tune.budget_vote(debate, single, by_tokens) == f"vote@{k_at_budget(1300.0, 200.0)}" == "vote@7"


def test_the_goal_is_one_number() -> None:
    assert tune.GOAL_POINTS is goal.GOAL_POINTS
    from moot.eval import analysis, report

    assert analysis.GOAL_POINTS is report.GOAL_POINTS is goal.GOAL_POINTS  # re-exported where it lived


def test_the_softmax_vote_weight() -> None:
    assert softmax_weight(0.9, 0.9, 0.2) == 1.0  # the top signal weighs 1
    assert math.isclose(softmax_weight(0.7, 0.9, 0.2), math.exp(-1.0))
    assert softmax_weight(0.1, 0.9, math.inf) == 1.0  # T = inf: a plain vote


def test_one_chat_payload_for_every_openai_shaped_backend() -> None:
    schema = {"type": "object"}
    request = ChatRequest(messages=[Message(role="user", content="hi")], max_tokens=9, response_schema=schema)
    wire = chat_payload(request, model="m")
    assert list(wire) == ["model", "messages", "max_tokens", "response_format"]  # unset fields left to the server
    assert wire["response_format"]["json_schema"] == {"name": "reply", "schema": schema}
    # the embedded engine's defaults: greedy and seeded, unless the request says otherwise
    embedded = chat_payload(request, temperature=0.0, seed=7)
    assert "model" not in embedded and (embedded["temperature"], embedded["seed"]) == (0.0, 7)
    own = chat_payload(request.model_copy(update={"temperature": 0.7, "seed": 3}), temperature=0.0, seed=7)
    assert (own["temperature"], own["seed"]) == (0.7, 3)
    # a server that refused response_format: the schema is asked for in the prompt
    prompted = chat_payload(request, model="m", schema=False)
    assert "response_format" not in prompted and len(prompted["messages"]) == 2
    assert prompted["messages"][-1]["role"] == "user" and '"type":"object"' in prompted["messages"][-1]["content"]


def test_a_judgement_maps_to_the_judged_scores() -> None:
    j = QualityJudgement(rationale="sound", logical_consistency=5, reasoning_depth=2)
    scores = judged_scores(j)
    assert list(scores) == ["logical_consistency", "reasoning_depth"]
    assert scores["logical_consistency"] == QualityScore(
        value=1.0, method="judge", details={"level": 5, "rubric": RUBRIC_VERSION, "rationale": "sound"}
    )
    assert scores["reasoning_depth"].value == 0.25
