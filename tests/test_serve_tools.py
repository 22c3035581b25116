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


# ------------------------------------------------------------- a tool loop's history, malformed

CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
ITEM = {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Paris"}'}
ASKED = {"role": "user", "content": QUESTION}


def with_call(**fields: Any) -> dict[str, Any]:
    """An assistant message whose one tool call has ``fields`` (``_drop``: the field left out)."""
    call = {k: v for k, v in {**CALL, **fields}.items() if v != "_drop"}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


#: Chat messages whose tool history is malformed, each with the field a 400 must name. An object as
#: a call's id, or a function that is not an object (null included), was a 500 (a security review).
BAD_CHAT_HISTORY: list[tuple[list[dict[str, Any]], str, str]] = [
    ([with_call(id={})], "messages[0].tool_calls[0].id", "not an object"),
    ([with_call(id=["c1"])], "messages[0].tool_calls[0].id", "not a list"),
    ([with_call(id="_drop")], "messages[0].tool_calls[0].id", "required"),
    ([with_call(function=1)], "messages[0].tool_calls[0].function", "not a number"),
    ([with_call(function=None)], "messages[0].tool_calls[0].function", "not null"),
    ([with_call(function="get_weather")], "messages[0].tool_calls[0].function", "not a string"),
    ([with_call(function={"name": {}, "arguments": "{}"})], "messages[0].tool_calls[0].function.name", "not an object"),
    ([with_call(function={"name": "get_weather", "arguments": {"city": "Paris"}})],
     "messages[0].tool_calls[0].function.arguments", "not an object"),
    ([{"role": "assistant", "content": None, "tool_calls": [3]}], "messages[0].tool_calls[0]", "not a number"),
    ([{"role": "assistant", "content": None, "tool_calls": "c1"}], "messages[0].tool_calls", "not a string"),
]  # fmt: skip
#: Responses input items the same, for ``/v1/responses`` and ``/v1/responses/compact``.
BAD_RESPONSES_HISTORY: list[tuple[list[dict[str, Any]], str, str]] = [
    ([{**ITEM, "call_id": {}}], "input[0].call_id", "not an object"),
    ([{**ITEM, "call_id": None}], "input[0].call_id", "not null"),
    ([{**ITEM, "name": ["get_weather"]}], "input[0].name", "not a list"),
    ([{**ITEM, "arguments": {"city": "Paris"}}], "input[0].arguments", "not an object"),
    ([{k: v for k, v in ITEM.items() if k != "name"}], "input[0].name", "required"),
    ([{"type": "function_call_output", "call_id": [], "output": "21 C"}], "input[0].call_id", "not a list"),
    ([ITEM, {"type": "function_call_output", "call_id": {"id": "c1"}, "output": "21 C"}], "input[1].call_id",
     "not an object"),
]  # fmt: skip


def refusal(response: httpx.Response, param: str, said: str) -> None:
    """A 400 naming ``param``, in one line that starts with it and says what came (``said``)."""
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    message = error["message"]
    assert message.startswith(f"{param}: ") and said in message and "\n" not in message, message
    assert "Input should be" not in message and "ToolCall" not in message, message  # what to give, in words


@pytest.mark.parametrize(
    ("messages", "param", "said"), BAD_CHAT_HISTORY, ids=[f"{p}-{s}" for _, p, s in BAD_CHAT_HISTORY]
)
def test_a_malformed_tool_call_in_chat_history_is_refused_naming_its_field(
    make_server: MakeServer, messages: list[dict[str, Any]], param: str, said: str
) -> None:
    server, fake = make_server()
    body = {"model": "moot/single", "messages": [*messages, ASKED]}
    for stream in (False, True):
        refusal(httpx.post(server.url + "/v1/chat/completions", json={**body, "stream": stream}, timeout=60), param,
                said)  # fmt: skip
    assert fake.requests == []


@pytest.mark.parametrize(
    ("items", "param", "said"), BAD_RESPONSES_HISTORY, ids=[f"{p}-{s}" for _, p, s in BAD_RESPONSES_HISTORY]
)
def test_a_malformed_function_call_item_is_refused_naming_its_field(
    make_server: MakeServer, items: list[dict[str, Any]], param: str, said: str
) -> None:
    """On ``/v1/responses`` (plain and streamed) and ``/v1/responses/compact``, and in the items a
    compaction item carries (named by their place in the input, as the compaction unpacks them)."""
    from moot.server.openai.open_responses import compaction_item

    server, fake = make_server()
    body = {"model": "moot/single", "input": [*items, ASKED]}
    for path, sent in (
        ("/v1/responses", body),
        ("/v1/responses", {**body, "stream": True}),
        ("/v1/responses/compact", body),
        ("/v1/responses", {**body, "input": [compaction_item(items, "cmp_test"), ASKED]}),
    ):
        refusal(httpx.post(server.url + path, json=sent, timeout=60), param, said)
    assert fake.requests == []


def test_a_tool_output_list_of_objects_that_are_not_parts_is_the_tools_json(make_server: MakeServer) -> None:
    """A ``function_call_output`` whose list is not the standard's parts (an object as a part's type:
    a 500 before, an unhashable set member) is the tool's own JSON, read as its text, as any other
    list of records is (``_PARTS``); the standard's parts are read as their text. A chat message's
    ``tool_calls: null`` (a client that writes every field) is no tool call."""
    from moot.server.openai.responses_request import ResponsesRequest, split_input

    server, fake = make_server()
    records = [{"type": {}, "text": "21 C"}]
    result = {"type": "function_call_output", "call_id": "c1", "output": records}
    for path in ("/v1/responses", "/v1/responses/compact"):
        response = httpx.post(
            server.url + path, json={"model": "moot/single", "input": [ITEM, result, ASKED]}, timeout=60
        )
        assert response.status_code == 200, response.text
    prompt = "\n".join(str(m["content"]) for m in fake.requests[-1]["messages"])  # (compact calls no model)
    assert "(the result of the tool call c1:)\n" + json.dumps(records) in prompt, prompt
    nulled = {"role": "assistant", "content": "It is sunny.", "tool_calls": None}
    chat = {"model": "moot/single", "messages": [nulled, ASKED]}
    assert httpx.post(server.url + "/v1/chat/completions", json=chat, timeout=60).status_code == 200

    def context(output: Any) -> list[str]:
        given = {"type": "function_call_output", "call_id": "c1", "output": output}
        req = ResponsesRequest.model_validate({"model": "moot/vote", "input": [ITEM, given, ASKED]})
        return [c.text for c in split_input(req).context]

    for json_records in ([{"type": ["input_text"], "text": "21 C"}],
                         [{"type": "input_text", "text": "21 C"}, {"type": {"kind": "row"}}]):  # fmt: skip
        assert context(json_records)[-1] == "(the result of the tool call c1:)\n" + json.dumps(json_records)
    assert context([{"type": "input_text", "text": "21 C"}])[-1] == "(the result of the tool call c1:)\n21 C"
