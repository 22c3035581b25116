"""The answer family's options (issues 39 S6 and 42): required reasoning wherever a preset runs, Du et
al.'s wording, no confidence, ``history=together``, the selection decision (``usc``, ``select``,
``decide=``), each pinned by the exact messages an agent or the judge receives on a scripted model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from moot import ScriptedModel
from moot.cli.main import app
from moot.core import Engine
from moot.core.decisions import selection_of
from moot.eval.analysis import summarise
from moot.eval.protocols import parse_protocols
from moot.eval.render import render_markdown
from moot.eval.runner import run_eval, run_one
from moot.eval.store import RunConfig
from moot.models.base import ChatRequest
from moot.protocols import get_preset
from moot.protocols.presets import ANSWER_OPENING, DU_REBUTTAL

FIXTURES = Path(__file__).parent / "fixtures" / "eval"
QUESTION = "What is 17 * 3?"
SYSTEM = "You are Agent {i}, a careful problem solver. Think step by step, then answer."
DU_ASK = "Give your reasoning first, then your final answer alone as the answer, as JSON."


def agent_of(request: ChatRequest) -> str:
    first = request.messages[0]
    return first.content.split(",")[0].removeprefix("You are ") if first.role == "system" else "judge"


class Agents:
    """Each agent's reply names it and its turn; the judge picks ``pick`` (scripted)."""

    def __init__(self, answers: dict[str, list[str]] | None = None, pick: Any = 1) -> None:
        self.answers = answers or {}
        self.pick = pick
        self.turns: dict[str, int] = {}
        self.model = ScriptedModel(fn=self.reply)

    def reply(self, request: ChatRequest) -> dict[str, Any]:
        props = (request.response_schema or {}).get("properties", {})
        if "response" in props:
            return {"reasoning": "checked", "response": self.pick} if "reasoning" in props else {"response": self.pick}
        who = agent_of(request)
        n = self.turns[who] = self.turns.get(who, 0) + 1
        out: dict[str, Any] = {"reasoning": f"{who} works it out, turn {n}",
                               "answer": self.answers.get(who, ["51"] * 9)[n - 1]}  # fmt: skip
        if "confidence" in props:
            out["confidence"] = 0.6
        return out

    def of(self, who: str) -> list[ChatRequest]:
        return [r for r in self.model.requests if agent_of(r) == who]


def solution(who: str, n: int, answer: str = "51", confidence: bool = False) -> str:
    reply: dict[str, Any] = {"reasoning": f"{who} works it out, turn {n}", "answer": answer}
    if confidence:
        reply["confidence"] = 0.6
    return json.dumps(reply, ensure_ascii=False)


# ------------------------------------------------------------------------------------------- S6


def test_every_answer_preset_requires_its_reasoning_first_and_non_empty() -> None:
    for name in ("single", "vote", "society-of-minds", "free-mad", "adaptive-debate", "mad-conformist", "chateval",
                 "usc", "select", "adaptive-consistency", "cisc", "weighted-vote", "filtered-vote"):  # fmt: skip
        spec = get_preset(name)
        from moot.structured import get_schema

        schema = get_schema(spec.turn.schema_name or "").model_json_schema()
        reasoning = schema["properties"]["reasoning"]
        assert next(iter(schema["properties"])) == "reasoning" and "reasoning" in schema["required"], name
        assert reasoning["minLength"] == 1, name


async def test_an_empty_reasoning_on_moot_debate_s_path_is_a_parse_failure_that_is_repaired() -> None:
    """Issue 39, S6: the 1.5B model wrote an empty reasoning in 12 of 12 turns of ``moot debate -p
    society-of-minds``, and the generic schema took it. Now it is refused and repaired."""
    replies = iter(
        [
            {"reasoning": "", "answer": "50", "confidence": 0.9},
            {"reasoning": "17*3 = 51", "answer": "51", "confidence": 0.9},
        ]
        + [{"reasoning": "r", "answer": "51", "confidence": 0.9}] * 20
    )
    model = ScriptedModel(fn=lambda request: next(replies))
    result = await Engine(get_preset("society-of-minds", agents=1, rounds=1), model).run(QUESTION)
    turn = result.rounds[0].turns[0]
    assert turn.calls == 2 and turn.parsed is not None and turn.parsed["reasoning"] == "17*3 = 51"
    repair = model.requests[1].messages[-1].content
    assert "does not match the required JSON schema" in repair and "reasoning" in repair


def test_moot_debate_on_the_cli_repairs_an_empty_reasoning(tmp_path: Path) -> None:
    script = tmp_path / "replies.json"
    script.write_text(
        json.dumps(
            [
                {"reasoning": "", "answer": "7", "confidence": 0.5},
                {"reasoning": "3+4", "answer": "7", "confidence": 0.5},
            ]
        )
    )
    out = tmp_path / "r.json"
    done = CliRunner().invoke(
        app, ["debate", "3+4?", "-p", "single", "-m", f"scripted:{script}", "--json", str(out), "-q"]
    )
    assert done.exit_code == 0, done.output
    saved = json.loads(out.read_text())
    turn = saved["rounds"][0]["turns"][0]
    assert turn["calls"] == 2 and turn["parsed"]["reasoning"] == "3+4"


def test_defaults_are_today_s_presets() -> None:
    assert get_preset("society-of-minds", wording="brief", confidence=True, history="conversation",
                      max_tokens=400, decide="vote") == get_preset("society-of-minds")  # fmt: skip
    for name in ("single", "vote", "free-mad"):
        assert get_preset(name, wording="brief", confidence=True) == get_preset(name)


# ------------------------------------------------------------------------------- wording, confidence


async def test_du_wording_without_confidence_round_two_is_du_et_al_s_gsm_message() -> None:
    agents = Agents()
    result = await Engine(get_preset("society-of-minds", wording="du", confidence=False), agents.model).run(QUESTION)
    assert result.final_answer == "51" and result.llm_calls == 6
    second = agents.of("Agent 2")[1]
    opening = f"Can you solve the following problem? {QUESTION} Explain your reasoning. {DU_ASK}"
    others = "\n\n".join(f"One agent solution: ```{solution(f'Agent {i}', 1)}```" for i in (1, 3))
    assert [(m.role, m.content) for m in second.messages] == [
        ("system", SYSTEM.format(i=2)),
        ("user", opening),
        ("assistant", solution("Agent 2", 1)),
        ("user", "These are the solutions to the problem from other agents:\n\n" + others + "\n\n"
                 "Using the solutions from other agents as additional information, can you provide your answer to the "
                 f"problem?\nThe original problem is {QUESTION}. {DU_ASK}"),
    ]  # fmt: skip
    # No confidence asked, kept or shown; room for a worked solution.
    schema = second.response_schema or {}
    assert "confidence" not in schema["properties"] and schema["properties"]["reasoning"]["maxLength"] == 6000
    assert "confidence" not in json.dumps([m.content for m in second.messages])


async def test_confidence_false_with_the_brief_wording_only_drops_the_confidence() -> None:
    agents = Agents()
    await Engine(get_preset("society-of-minds", confidence=False), agents.model).run(QUESTION)
    second = agents.of("Agent 1")[1]
    opening = ANSWER_OPENING.replace("{question}", QUESTION).replace("{context}", "(no context given)")
    assert second.messages[1].content == opening.replace(
        "Answer with brief reasoning, the answer itself (a number, a letter, yes/no or a few words) and your "
        "confidence from 0 to 1, as JSON.",
        "Answer with brief reasoning and the answer itself (a number, a letter, yes/no or a few words), as JSON.",
    )
    others = "\n\n".join(f"One agent solution: ```{solution(f'Agent {i}', 1)}```" for i in (2, 3))
    assert second.messages[3].content == DU_REBUTTAL.replace("{history}", others).replace(
        "with brief reasoning and your confidence from 0 to 1, as JSON.", "with brief reasoning, as JSON."
    )
    assert "confidence" not in (second.response_schema or {})["properties"]


async def test_du_wording_puts_context_passages_after_the_question() -> None:
    from moot.core.types import ContextChunk, DebateTask

    agents = Agents()
    task = DebateTask(question=QUESTION, context=[ContextChunk(text="Multiply.")])
    await Engine(get_preset("single", wording="du"), agents.model).run(task)
    assert agents.model.requests[0].messages[1].content == (
        f"Can you solve the following problem? {QUESTION}\n\nContext:\n[1] Multiply.\n\n Explain your reasoning. "
        "Give your reasoning first, then your final answer alone as the answer, then your confidence from 0 to 1, "
        "as JSON."
    )


def test_history_prompt_has_the_brief_wording_only() -> None:
    with pytest.raises(TypeError, match="history=prompt"):
        get_preset("society-of-minds", wording="du", history="prompt")


# ---------------------------------------------------------------------------------- history=together


async def test_history_together_is_one_user_message_with_every_reply_its_own_marked() -> None:
    agents = Agents({"Agent 2": ["52", "51"]})
    spec = get_preset("society-of-minds", history="together", wording="du", confidence=False)
    await Engine(spec, agents.model).run(QUESTION)
    second = agents.of("Agent 2")[1]
    assert [(m.role, m.content) for m in second.messages] == [
        ("system", SYSTEM.format(i=2)),
        ("user", "Here are your previous solution and the solutions to the problem from other agents:\n\n"
                 f"Your previous solution: ```{solution('Agent 2', 1, '52')}```\n\n"
                 f"One agent solution: ```{solution('Agent 1', 1)}```\n\n"
                 f"One agent solution: ```{solution('Agent 3', 1)}```\n\n"
                 "Using the solutions from other agents as additional information, can you provide your answer to the "
                 f"problem?\nThe original problem is {QUESTION}. {DU_ASK}"),
    ]  # fmt: skip
    # Round 1 is the same request as the conversation rendering's (one cache entry).
    other = Agents({"Agent 2": ["52", "51"]})
    await Engine(get_preset("society-of-minds", wording="du", confidence=False), other.model).run(QUESTION)
    assert agents.of("Agent 2")[0] == other.of("Agent 2")[0]


async def test_history_together_with_the_brief_wording_and_confidence() -> None:
    agents = Agents()
    await Engine(get_preset("society-of-minds", history="together"), agents.model).run(QUESTION)
    second = agents.of("Agent 1")[1]
    assert [m.role for m in second.messages] == ["system", "user"]
    assert second.messages[1].content == (
        f"Question: {QUESTION}\n\nContext:\n(no context given)\n\n"
        "Here are your previous solution and the solutions to the problem from other agents:\n\n"
        f"Your previous solution: ```{solution('Agent 1', 1, confidence=True)}```\n\n"
        f"One agent solution: ```{solution('Agent 2', 1, confidence=True)}```\n\n"
        f"One agent solution: ```{solution('Agent 3', 1, confidence=True)}```\n\n"
        "Using the reasoning from other agents as additional advice, can you give an updated answer? Examine your "
        "solution and that of the other agents step by step. Give your answer with brief reasoning and your "
        "confidence from 0 to 1, as JSON."
    )


# ---------------------------------------------------------------------------------- max_tokens


async def test_a_preset_s_own_max_tokens_wins_over_the_run_s(tmp_path: Path) -> None:
    from moot.eval.datasets import load_dataset

    item = load_dataset(str(FIXTURES / "arithmetic.jsonl"))[0]
    config = RunConfig(dataset=str(FIXTURES / "arithmetic.jsonl"), protocols=["single"], model="scripted",
                       max_tokens=256)  # fmt: skip
    own, run = parse_protocols(["society-of-minds(wording=du,max_tokens=1024)", "society-of-minds(wording=du)"])
    for ref, expected in ((own, 1024), (run, 256)):
        agents = Agents({f"Agent {i}": ["31", "31"] for i in (1, 2, 3)})
        await run_one(ref, item, agents.model, config)
        assert {r.max_tokens for r in agents.model.requests} == {expected}, ref.label
        schema = agents.model.requests[0].response_schema or {}
        assert schema["title"] == "EvalAnswer" and schema["properties"]["reasoning"]["maxLength"] == 6000
        assert "confidence" in schema["properties"] and schema["properties"]["answer"]["type"] == "number"


# ---------------------------------------------------------------------------------- selection


USC_JUDGE = (
    f"I have generated the following responses to the question: {QUESTION}\n\n"
    + "\n\n".join(f"Response {i}: {solution(f'Agent {i + 1}', 1, a)}" for i, a in enumerate(["50", "51", "52"]))
    + "\n\nEvaluate these responses.\nSelect the most consistent response based on majority consensus.\n"
    'Give your answer as JSON, {"response": X}, where Response X is the most consistent response.'
)


async def test_usc_asks_exactly_vote_s_samples_then_one_greedy_judge_call() -> None:
    answers = {"Agent 1": ["50"], "Agent 2": ["51"], "Agent 3": ["52"]}
    voted = Agents(answers)
    await Engine(get_preset("vote", k=3), voted.model).run(QUESTION)
    agents = Agents(answers, pick=2)
    result = await Engine(get_preset("usc", k=3), agents.model).run(QUESTION)
    assert agents.model.requests[:3] == voted.model.requests  # the same requests: one cache entry each
    judge = agents.model.requests[3]
    assert [(m.role, m.content) for m in judge.messages] == [("user", USC_JUDGE)]
    assert judge.temperature == 0.0 and (judge.response_schema or {})["properties"]["response"]["enum"] == [0, 1, 2]
    assert result.final_answer == "52" and result.llm_calls == 4  # the judge's call is counted
    assert result.decision_turns[0].usage.total_tokens > 0
    selection = selection_of(result.decision)
    assert selection is not None and selection.selected == 2 and selection.speaker == "agent3"
    assert selection.fallback is None


async def test_a_judge_that_names_no_reply_falls_back_to_the_vote_and_says_so() -> None:
    agents = Agents({"Agent 1": ["50"], "Agent 2": ["51"], "Agent 3": ["51"]}, pick=7)
    result = await Engine(get_preset("usc", k=3), agents.model).run(QUESTION)
    selection = selection_of(result.decision)
    assert selection is not None and selection.fallback == "vote" and selection.selected is None
    assert selection.fallback_reason is not None and "named no valid response" in selection.fallback_reason
    assert result.final_answer == "51" and result.status == "complete"
    assert result.llm_calls == 5  # 3 samples, the judge and its repair
    assert any("fell back to the vote" in w for w in result.warnings)


async def test_society_of_minds_can_select_among_its_last_round() -> None:
    agents = Agents({"Agent 1": ["50", "50"], "Agent 2": ["52", "51"], "Agent 3": ["52", "52"]}, pick=1)
    result = await Engine(get_preset("society-of-minds", decide="select"), agents.model).run(QUESTION)
    judge = agents.model.requests[-1]
    assert judge.messages[-1].content.startswith(f"Question: {QUESTION}\n\nContext:\n(no context given)\n\n"
                                                 "These are candidate responses to the question:\n\n"
                                                 f"Response 0: {solution('Agent 1', 2, '50')}")  # fmt: skip
    assert list((judge.response_schema or {})["properties"]) == ["reasoning", "response"]
    assert result.final_answer == "51" and result.llm_calls == 7
    assert get_preset("society-of-minds", decide="usc").decision.kind == "select"


async def test_eval_counts_the_judge_s_fallbacks_per_protocol_and_usc_shares_vote_s_samples(tmp_path: Path) -> None:
    def reply(request: ChatRequest) -> dict[str, Any]:
        props = (request.response_schema or {}).get("properties", {})
        if "response" in props:
            return {"response": 9}  # never a valid reply: every selection falls back
        return {"reasoning": "r", "answer": "A", "confidence": 0.5}

    model = ScriptedModel(fn=reply)
    config = RunConfig(dataset=str(FIXTURES / "science.jsonl"), protocols=["vote@3", "usc(k=3)"], model="scripted", n=2)
    store = await run_eval(config, tmp_path / "run", model=model)
    report = summarise(store)
    store.close()
    # Per item: the 3 samples once (shared through the run's cache), the judge and its repair.
    assert len(model.requests) == 2 * (3 + 2)
    counts = {s.label: s.selection_fallbacks for s in report.protocols}
    assert counts == {"vote@3": None, "usc(k=3)": 2}
    assert "judge fell back to the vote" in render_markdown(report, {})
    assert "selection_fallbacks" not in json.loads(report.model_dump_json())["protocols"][0]


def test_parameters_that_make_no_valid_protocol_are_named_as_given() -> None:
    """agents=0 is a valid integer that makes a spec with no participant: the error named a
    "parameter participants = []" the user never gave."""
    from moot.protocols import PresetParamError

    with pytest.raises(
        PresetParamError, match=r"preset society-of-minds with agents=0 makes no valid protocol: participants"
    ):
        get_preset("society-of-minds", agents=0)
    with pytest.raises(
        PresetParamError, match=r"preset society-of-minds: parameter agents = 'x': Input should be a valid"
    ):
        get_preset("society-of-minds", agents="x")


def test_a_nested_presets_parameter_is_named_and_a_long_value_cut() -> None:
    """pydantic titles a call's errors by the function's qualified name: a preset defined in a
    function or a class had its own parameter error reported as the spec's."""
    from moot.protocols import PresetParamError, register_preset

    def make() -> Any:
        def inner(k: int = 3) -> Any:
            return get_preset("vote", k=k)

        return inner

    register_preset("test-nested-preset", make())
    with pytest.raises(PresetParamError, match=r"preset test-nested-preset: parameter k = 'abc': Input should be"):
        get_preset("test-nested-preset", k="abc")
    for params in ({"wording": "x" * 5000}, {"agents": 0, "rounds": int("9" * 200)}):  # a value echoed is cut
        with pytest.raises(PresetParamError) as long:
            get_preset("society-of-minds", **params)
        assert len(str(long.value)) < 400, str(long.value)[:200]


def test_a_bool_is_refused_only_for_a_parameter_that_takes_a_number_alone() -> None:
    """rounds: true ran one round (pydantic's lax mode); a parameter annotated otherwise (Any, a bool
    among its types) still takes one (a review: a first check refused True for them too)."""
    from moot.protocols import PresetParamError, call_preset, get_preset

    with pytest.raises(PresetParamError, match="preset society-of-minds: rounds takes int, not true"):
        get_preset("society-of-minds", rounds=True)

    def mine(loose: Any = None, either: int | bool = 1, amount: float | None = None) -> Any:
        return get_preset("single")

    assert call_preset("mine", mine, {"loose": True, "either": False}).name == "single"
    with pytest.raises(PresetParamError, match=r"preset mine: amount takes float \| None, not true"):
        call_preset("mine", mine, {"amount": True})
