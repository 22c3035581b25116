"""Every preset, exactly, on the scripted model: calls, who saw what, stop reasons, decisions."""

from __future__ import annotations

import re
from typing import Any

import pytest

from moot import ScriptedModel
from moot.core import Engine
from moot.models.base import ChatRequest
from moot.protocols import get_preset, preset_names
from moot.protocols.presets import chateval, moderated, society_of_minds, vote


def speaker(request: ChatRequest) -> str:
    m = re.match(
        r"You are (?:now )?(?:the |a |an )?([A-Z][\w ]*?)(?:[,.]| in | on | panel| of )", request.messages[0].content
    )
    return m.group(1) if m else "?"


class Script:
    """Replies that fit whatever schema the request carries; answers and verdicts as scripted."""

    def __init__(self, answers: dict[str, list[str]] | None = None, moderator: list[dict[str, Any]] | None = None):
        self.answers = answers or {}
        self.moderator = moderator or []
        self.model = ScriptedModel(fn=self.reply)

    def reply(self, request: ChatRequest) -> dict[str, Any] | str:
        title = (request.response_schema or {}).get("title")
        who = speaker(request)
        if title == "AnswerTurn":
            return {"reasoning": "r", "answer": self.answers.get(who, ["42"]).pop(0), "confidence": 0.7}
        if title == "PanelTurn":
            return {"speaker": who, "stance": "neutral", "planning": "p", "reflection": "r", "message": f"{who} says",
                    "key_points": ["k"]}  # fmt: skip
        if title == "PanelSummary":
            return {"winner": None, "consensus": "mixed views", "key_agreements": [], "key_disagreements": [],
                    "rationale": "balanced"}  # fmt: skip
        if title == "Argument":
            return {"content": f"{who} argues", "confidence": 0.9 if who == "Proponent" else 0.5,
                    "supporting_evidence": ["e"]}  # fmt: skip
        if title in ("ModeratorEvaluation", "MadModeration"):
            return self.moderator.pop(0)
        if title == "Summary":
            return {"summary": "round summary"}
        if title == "Candidates":
            return {"candidates": ["yes", "no"]}
        if title == "JudgeVerdict":
            return {"answer": "yes", "rationale": "better argued", "confidence": 0.8}
        return f"{who} free text"


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_is_a_valid_spec_that_round_trips(name: str) -> None:
    from moot.core import ProtocolSpec

    spec = get_preset(name)
    assert ProtocolSpec.model_validate(spec.model_dump(mode="json", by_alias=True)) == spec


@pytest.mark.req("S001-PERSONAS", "S001-ORDER", "S001-TURN", "S001-PROMPT", "S001-JUDGE")
async def test_panel_is_seed_001() -> None:
    s = Script()
    result = await Engine(get_preset("panel"), s.model).run("The battery lasts long but the screen is dim.")
    assert [t.speaker for t in result.turns()] == ["analyst", "critic", "empath"] * 2
    assert result.llm_calls == 7 and result.final_answer == "mixed views"
    assert result.decision is not None and result.decision["winner"] is None and result.decision["kind"] == "judge"
    first = s.model.requests[0].messages[1].content
    for section in ("[TOPIC]", "[PERSONA]", "[SHARED_CONTEXT_JSON]", "[HISTORY]"):
        assert section in first
    assert '"stance":"neutral"' in first  # the persona's JSON
    # The critic of round 1 saw the analyst; the empath of round 2 saw all five earlier turns.
    assert s.model.requests[1].messages[1].content.count("(round 1)") == 1
    assert s.model.requests[5].messages[1].content.count("(round ") == 5
    assert "[ALL_TURNS]" in s.model.requests[6].messages[1].content


@pytest.mark.req("S004-PHASE1", "S004-ARGUMENT")
async def test_moderated_stops_on_moderator_confidence_and_decides_by_strength() -> None:
    s = Script(moderator=[{"pro_score": 0.8, "con_score": 0.4, "confidence": 0.85, "key_points": []}])
    result = await Engine(moderated(), s.model).run("Remote work improves productivity.")
    assert result.stop_reason == "moderator" and len(result.rounds) == 1 and result.llm_calls == 3
    assert result.final_answer == "SUPPORT"
    assert result.decision is not None and result.decision["pro_strength"] == pytest.approx(0.72)
    moderator_prompt = s.model.requests[2].messages[1].content
    assert "Proponent" in moderator_prompt and "Opponent" in moderator_prompt


@pytest.mark.req("S004-PHASE1")
async def test_moderated_runs_its_two_rounds_when_the_moderator_stays_unsure() -> None:
    unsure = {"pro_score": 0.5, "con_score": 0.5, "confidence": 0.6, "key_points": []}
    s = Script(moderator=[unsure, dict(unsure)])
    result = await Engine(moderated(), s.model).run("P")
    assert result.stop_reason == "max_rounds" and result.llm_calls == 6
    assert result.final_answer == "SUPPORT"  # 0.9+0.9 vs 0.5+0.5 at equal scores: 1.8 > 1.2 x 1.0


@pytest.mark.req("S004-PHASE2")
async def test_moderated_extended_has_four_parallel_arguers_a_refiner_and_a_moderator() -> None:
    sure = {"pro_score": 0.5, "con_score": 0.5, "confidence": 0.9, "key_points": []}
    s = Script(moderator=[sure])
    result = await Engine(get_preset("moderated-extended"), s.model).run("P")
    speakers = [t.speaker for t in result.rounds[0].turns]
    assert speakers == ["proponent", "opponent", "advocate", "critic", "refiner", "moderator"]
    refiner_prompt = next(r for r in s.model.requests if speaker(r) == "?" or "synthesise" in r.messages[0].content)
    assert all(n in refiner_prompt.messages[1].content for n in ("Proponent", "Opponent", "Advocate", "Critic"))
    assert get_preset("moderated-extended").rounds == 3


async def test_society_of_minds_updates_on_the_others_and_votes() -> None:
    s = Script({"Agent 1": ["3", "4"], "Agent 2": ["4", "4"], "Agent 3": ["5", "5"]})
    result = await Engine(society_of_minds(), s.model).run("2+2?")
    assert result.llm_calls == 6 and result.final_answer == "4"
    round2 = [r for r in s.model.requests[3:]]
    assert all(r.messages[-1].content.count("One agent solution") == 2 for r in round2)  # the two others
    assert {r.seed for r in s.model.requests[:3]} == {1, 2, 3} and all(r.temperature == 0.7 for r in s.model.requests)


async def test_mad_moderator_can_end_early_and_the_judge_picks_from_candidates() -> None:
    s = Script(moderator=[{"preference": False}, {"preference": True, "supported_side": "affirmative"}])
    result = await Engine(get_preset("mad"), s.model).run("Is 0.999... equal to 1?")
    assert result.stop_reason == "moderator" and len(result.rounds) == 2
    assert result.llm_calls == 6 + 2 and result.final_answer == "yes"
    pick = s.model.requests[-1].messages[1].content
    assert "- yes\n- no" in pick


@pytest.mark.parametrize(("mode", "calls", "sequential"), [("one-by-one", 6, True), ("simultaneous", 6, False)])
async def test_chateval_modes(mode: str, calls: int, sequential: bool) -> None:
    s = Script({"Critic": ["A", "B"], "Scientist": ["B", "B"], "General Public": ["B", "A"]})
    spec = chateval(mode)  # type: ignore[arg-type]
    result = await Engine(spec, s.model).run("Which answer is better, A or B?")
    assert result.llm_calls == calls and result.final_answer == "B"
    second_speaker_round1 = s.model.requests[1].messages[1].content
    assert ("General Public: {" in second_speaker_round1) is sequential


async def test_chateval_summarizer_mode_adds_the_summary_to_what_agents_see() -> None:
    # The authors' code appends the summarizer's message to every agent's memory; the whole
    # discussion stays in it.
    s = Script({"Critic": ["A", "B"], "Scientist": ["B", "B"], "General Public": ["B", "B"]})
    result = await Engine(chateval("summarizer"), s.model).run("A or B?")
    assert result.llm_calls == 8 and result.final_answer == "B"
    assert [t.speaker for t in result.rounds[0].turns] == ["public", "critic", "scientist", "summarizer"]
    round2_agent = s.model.requests[4].messages[-1].content
    assert "Summarizer: round summary" in round2_agent and "Scientist: {" in round2_agent


async def test_single_and_vote_baselines() -> None:
    one = await Engine(get_preset("single"), Script({"Agent 1": ["7"]}).model).run("3+4?")
    assert one.llm_calls == 1 and one.final_answer == "7"
    s = Script({f"Agent {i}": [a] for i, a in enumerate(["7", "8", "7", "7", "9"], start=1)})
    five = await Engine(vote(5), s.model).run("3+4?")
    assert five.llm_calls == 5 and five.final_answer == "7" and five.decision["votes"]["7"] == 3.0  # type: ignore[index]
    assert all("(round" not in r.messages[1].content for r in s.model.requests)  # independent samples
    assert len({r.seed for r in s.model.requests}) == 5


def test_an_unknown_preset_is_a_lookup_and_bad_input_alike() -> None:
    """``get_preset`` raised a bare KeyError (its text in quotes) where every other door's refusal of
    a protocol name is a ValueError: ``except ValueError`` missed it."""
    from moot.protocols import UnknownPreset

    for caught in (KeyError, ValueError, UnknownPreset):
        with pytest.raises(caught) as refused:
            get_preset("society-of-mind")
        assert str(refused.value).startswith(
            "no protocol preset named 'society-of-mind' (did you mean 'society-of-minds'?)"
        )
