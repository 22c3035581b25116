"""What an agent of each literature preset actually receives, message by message, on the fake model.

Each test pins the exact messages of a later-round turn against the paper's description (and its
authors' code, quoted in docs/protocols.md): the others' whole replies, reasoning included, and the
agent's own earlier turns as its own assistant messages. A regression to an answer-only exchange,
or to a prompt that drops the agent's own history, fails here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from moot import ScriptedModel
from moot.core import Engine
from moot.core.spec import Budget
from moot.eval.runner import run_eval
from moot.eval.store import RunConfig
from moot.models.base import ChatRequest, Message
from moot.protocols import get_preset
from moot.protocols.presets import ANSWER_OPENING, ANTI_CONFORMITY_REBUTTAL, DU_REBUTTAL

FIXTURES = Path(__file__).parent / "fixtures" / "eval"
SYSTEM = "You are Agent {i}, a careful problem solver. Think step by step, then answer."
QUESTION = "What is 17 * 3?"
OPENING = ANSWER_OPENING.replace("{question}", QUESTION).replace("{context}", "(no context given)")


def who(request: ChatRequest) -> str:
    if request.messages[0].content.startswith("You are a debater"):  # MAD's two sides share one system prompt
        return "Negative" if "You disagree" in request.messages[1].content else "Affirmative"
    m = re.match(r"You are (?:now )?(?:the |a |an )?([A-Z][\w ]*?)(?:[,.]| in | on | panel| of | one )",
                 request.messages[0].content)  # fmt: skip
    return m.group(1) if m else "?"


class Panel:
    """Each agent answers by script, with reasoning that names it and the round, so the test can
    see whose reasoning reached whom."""

    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = {k: list(v) for k, v in answers.items()}
        self.turns: dict[str, int] = {}
        self.model = ScriptedModel(fn=self.reply)

    def reply(self, request: ChatRequest) -> dict[str, Any] | str:
        name = who(request)
        title = (request.response_schema or {}).get("title")
        if title == "MadModeration":
            return {"preference": False, "supported_side": "", "reason": "", "debate_answer": ""}
        if title == "Candidates":
            return {"candidates": ["51", "52"]}
        if title == "JudgeVerdict":
            return {"answer": "51", "rationale": "r", "confidence": 0.8}
        if title == "Summary":
            return {"summary": "both sides summed up"}
        n = self.turns[name] = self.turns.get(name, 0) + 1
        if title is None:  # MAD's free-text debaters
            return f"{name} argues, turn {n}"
        answer = self.answers.get(name, ["51"] * 9)[n - 1]
        return {"reasoning": f"{name} reasons in turn {n}", "answer": answer, "confidence": 0.6}


def reply_json(name: str, n: int, answer: str) -> str:
    return json.dumps({"reasoning": f"{name} reasons in turn {n}", "answer": answer, "confidence": 0.6})


def compact(name: str, n: int, answer: str) -> str:
    return json.dumps({"reasoning": f"{name} reasons in turn {n}", "answer": answer, "confidence": 0.6},
                      ensure_ascii=False)  # fmt: skip


def round_requests(panel: Panel, speaker: str) -> list[ChatRequest]:
    return [r for r in panel.model.requests if who(r) == speaker]


ANSWERS = {"Agent 1": ["50", "51"], "Agent 2": ["51", "51"], "Agent 3": ["52", "51"]}


async def test_society_of_minds_round_two_is_du_et_al_s_conversation() -> None:
    panel = Panel(ANSWERS)
    result = await Engine(get_preset("society-of-minds"), panel.model).run(QUESTION)
    assert result.llm_calls == 6 and result.final_answer == "51"
    second = round_requests(panel, "Agent 1")[1]
    others = "\n\n".join(f"One agent solution: ```{compact(f'Agent {i}', 1, a)}```" for i, a in ((2, "51"), (3, "52")))
    assert [(m.role, m.content) for m in second.messages] == [
        ("system", SYSTEM.format(i=1)),
        ("user", OPENING),
        ("assistant", reply_json("Agent 1", 1, "50")),  # its own earlier turn, as its own message
        ("user", DU_REBUTTAL.replace("{history}", others)),
    ]
    # The others' reasoning travels, not only their answers.
    assert "Agent 2 reasons in turn 1" in second.messages[-1].content
    assert "Agent 1 reasons" not in second.messages[-1].content  # its own turn is not quoted back
    # Sampled as a vote's samples: temperature 0.7, agent i with seed i (docs/protocols.md, sampling).
    assert all(r.temperature == 0.7 for r in panel.model.requests)
    # Round 1 is exactly a vote's first samples (shared through the request cache in an eval).
    firsts = [round_requests(panel, f"Agent {i}")[0] for i in (1, 2, 3)]
    assert [r.seed for r in firsts] == [1, 2, 3] and all(len(r.messages) == 2 for r in firsts)


@pytest.mark.parametrize("name", ["adaptive-debate", "mad-conformist", "free-mad"])
async def test_every_preset_built_on_society_of_minds_shares_whole_replies_in_a_conversation(name: str) -> None:
    panel = Panel(ANSWERS)
    result = await Engine(get_preset(name), panel.model).run(QUESTION)
    later = [t for t in result.rounds[1].turns if not t.carried]
    assert later, f"{name} debated no round 2"
    for turn in later:
        roles = [m.role for m in turn.messages]
        assert roles == ["system", "user", "assistant", "user"], name
        assert turn.messages[2].content == result.rounds[0].turns[int(turn.speaker[-1]) - 1].raw
        for other in result.rounds[0].turns:
            if other.speaker != turn.speaker:
                assert f"{other.name} reasons in turn 1" in turn.messages[-1].content, (name, turn.speaker)
    if name == "free-mad":
        rebuttal = ANTI_CONFORMITY_REBUTTAL.split("{history}")[1]
        assert all(t.messages[-1].content.endswith(rebuttal) for t in later)


async def test_the_answer_only_exchange_is_a_named_ablation() -> None:
    panel = Panel(ANSWERS)
    result = await Engine(get_preset("society-of-minds", exchange="answer"), panel.model).run(QUESTION)
    second = round_requests(panel, "Agent 1")[1]
    assert second.messages[-1].content == DU_REBUTTAL.replace(
        "{history}", "One agent solution: ```51```\n\nOne agent solution: ```52```"
    )
    assert second.messages[2].role == "assistant"  # the agent still keeps its own history
    assert result.final_answer == "51"
    panel = Panel(ANSWERS)
    await Engine(get_preset("society-of-minds", exchange="reasoning"), panel.model).run(QUESTION)
    shown = round_requests(panel, "Agent 1")[1].messages[-1].content
    assert "```Agent 2 reasons in turn 1```" in shown and '"answer"' not in shown


async def test_the_first_published_protocol_is_reproduced_exactly_by_its_options() -> None:
    # exchange=answer, history=prompt: the herding protocol of the first results, request for request.
    panel = Panel(ANSWERS)
    await Engine(get_preset("society-of-minds", exchange="answer", history="prompt"), panel.model).run(QUESTION)
    second = round_requests(panel, "Agent 1")[1]
    assert [m.role for m in second.messages] == ["system", "user"]
    assert second.messages[1].content == (
        f"Question: {QUESTION}\n\nContext:\n(no context given)\n\nThese are the other agents' recent answers:\n\n"
        'The answer of Agent 2, the solver (round 1):\n"""\n51\n"""\n\n'
        'The answer of Agent 3, the solver (round 1):\n"""\n52\n"""\n\n'
        "Using their answers as additional advice, give your updated answer with brief reasoning and your "
        "confidence from 0 to 1, as JSON."
    )


async def test_a_conversation_that_outgrows_the_prompt_budget_loses_its_oldest_exchange_and_says_so() -> None:
    spec = get_preset("society-of-minds", rounds=4)
    answers = {f"Agent {i}": ["51"] * 4 for i in (1, 2, 3)}
    full = await Engine(spec, Panel(answers).model).run(QUESTION)
    sizes = [sum(len(m.content) for m in t.messages) for t in full.rounds[3].turns]
    assert all(t.history_trimmed == 0 for r in full.rounds for t in r.turns) and not full.warnings
    tight = spec.model_copy(update={"budget": Budget(max_tokens_per_turn=400, max_prompt_tokens=260)})
    panel = Panel(answers)
    result = await Engine(tight, panel.model).run(QUESTION)
    last = result.rounds[3].turns[0]
    whole = full.rounds[3].turns[0].messages
    kept = last.messages
    # Whole exchanges went, and the count is what went: an earlier reply with the message after it.
    assert last.history_trimmed > 0 and last.history_trimmed % 2 == 0
    assert len(whole) - len(kept) == last.history_trimmed
    assert kept[0].role == "system" and kept[1].content == OPENING  # the question stays
    # The agent's own previous turn and the new message stay, and the roles still alternate.
    assert kept[-2:] == whole[-2:] and kept[-2].role == "assistant"
    assert kept[-1].content.startswith("These are the solutions")
    assert [m.role for m in kept[1:]] == ["user", "assistant"] * ((len(kept) - 1) // 2) + ["user"]
    assert sum(len(m.content) for m in kept) < sizes[0]
    assert any("left out" in w and "agent1" in w for w in result.warnings)
    # The model was sent exactly what the turn records.
    assert round_requests(panel, "Agent 1")[3].messages == kept


async def test_a_conversation_with_nothing_left_to_trim_keeps_its_own_turn_and_says_it_is_over() -> None:
    """In round 2 a conversation is the question, the agent's own reply and the new message: none of
    it can go, so a prompt budget too small for it is reported, not met by dropping the agent's turn."""
    spec = get_preset("society-of-minds")
    tight = spec.model_copy(update={"budget": Budget(max_tokens_per_turn=400, max_prompt_tokens=60)})
    panel = Panel({f"Agent {i}": ["51", "51"] for i in (1, 2, 3)})
    result = await Engine(tight, panel.model).run(QUESTION)
    second = result.rounds[1].turns[0]
    assert second.history_trimmed == 0
    assert [m.role for m in second.messages] == ["system", "user", "assistant", "user"]
    assert second.messages[2].content == result.rounds[0].turns[0].raw  # its own round-1 reply
    over = [w for w in result.warnings if "over its budget of 60" in w]
    assert len(over) == 6 and any(w.startswith("agent1's prompt in round 2") for w in over)
    assert round_requests(panel, "Agent 1")[1].messages == second.messages


async def test_prompt_history_is_trimmed_by_turns_when_it_outgrows_the_budget() -> None:
    spec = get_preset("society-of-minds", history="prompt", agents=4)
    tight = spec.model_copy(update={"budget": Budget(max_tokens_per_turn=400, max_prompt_tokens=150)})
    result = await Engine(tight, Panel({}).model).run(QUESTION)
    trimmed = [t.history_trimmed for t in result.rounds[1].turns]
    assert all(n >= 1 for n in trimmed) and len(result.warnings) == 4


async def test_chateval_one_by_one_keeps_each_referee_s_chat_and_never_repeats_a_turn() -> None:
    panel = Panel({})
    result = await Engine(get_preset("chateval"), panel.model).run(QUESTION)
    assert result.llm_calls == 6
    # Round 2, the second speaker (Critic): its round-1 request, its own reply, then what was said
    # since: the Scientist's round-1 turn and the General Public's round-2 turn, whole and by name.
    critic = round_requests(panel, "Critic")
    assert "General Public: {" in critic[0].messages[1].content  # it spoke after the General Public
    second = critic[1].messages
    assert second[:2] == critic[0].messages and second[2] == Message(
        role="assistant", content=reply_json("Critic", 1, "51")
    )
    said = second[3].content
    assert said.startswith(
        f"Scientist: {compact('Scientist', 1, '51')}\n\nGeneral Public: {compact('General Public', 2, '51')}"
    )
    assert "General Public reasons in turn 1" not in said  # already in its conversation
    assert all(r.temperature == 0.0 for r in panel.model.requests)  # the authors ran it greedy


async def test_mad_debaters_answer_each_other_in_their_own_conversations() -> None:
    panel = Panel({})
    result = await Engine(get_preset("mad", rounds=2), panel.model).run(QUESTION)
    aff, neg = round_requests(panel, "Affirmative"), [r for r in panel.model.requests if "You disagree" in
                                                        "".join(m.content for m in r.messages)]  # fmt: skip
    # Round 1: the negative is told the affirmative's answer and to disagree with it.
    assert neg[0].messages[1].content.endswith("Affirmative argues, turn 1\n\nYou disagree with my answer. "
                                               "Provide your answer and reasons.")  # fmt: skip
    # Round 2: the affirmative, in its own conversation, answers the negative's round-1 argument.
    assert [m.role for m in aff[1].messages] == ["system", "user", "assistant", "user"]
    assert aff[1].messages[3].content.startswith("Negative argues, turn 1\n\nDo you agree with my perspective?")
    # Round 2: the negative, in its own conversation, answers the affirmative's argument of this round.
    assert [m.role for m in neg[1].messages] == ["system", "user", "assistant", "user"]
    assert neg[1].messages[3].content.startswith("Affirmative argues, turn 2\n\nDo you agree with my perspective?")
    # The debaters never see the moderator's evaluations.
    assert all("preference" not in m.content for r in aff + neg for m in r.messages[1:])
    assert result.final_answer == "51"
    # The authors' defaults: three rounds, greedy.
    assert get_preset("mad").rounds == 3
    assert all(r.temperature == 0.0 for r in panel.model.requests)


async def test_cache_from_lets_a_debate_reuse_another_run_s_first_round(tmp_path: Path) -> None:
    def answer(request: ChatRequest) -> dict[str, object]:
        return {"reasoning": "r", "answer": "A", "confidence": 0.5}

    data = FIXTURES / "science.jsonl"
    first = RunConfig(dataset=str(data), protocols=["vote@3"], model="scripted", n=2)
    store = await run_eval(first, tmp_path / "votes", model=ScriptedModel(fn=answer))
    store.close()
    model = ScriptedModel(fn=answer)
    second = RunConfig(dataset=str(data), protocols=["society-of-minds"], model="scripted", n=2)
    store = await run_eval(second, tmp_path / "debate", model=model, cache_from=[tmp_path / "votes"])
    store.close()
    # Round 1 (3 samples per item) came from the vote's run; only round 2 was asked of the model.
    assert len(model.requests) == 2 * 3
    assert all(len(r.messages) == 4 for r in model.requests)


async def test_another_first_seed_is_another_draw_that_a_pool_already_holds() -> None:
    panel = Panel({})
    await Engine(get_preset("society-of-minds", first_seed=4), panel.model).run(QUESTION)
    firsts = [r for r in panel.model.requests if len(r.messages) == 2]
    assert [r.seed for r in firsts] == [4, 5, 6]
    # Agent s asks what sample s of a vote asks: the run's cache serves it from the pool.
    pool = Panel({})
    await Engine(get_preset("vote", k=6), pool.model).run(QUESTION)
    assert [r.messages for r in firsts] == [r.messages for r in pool.model.requests[3:6]]
