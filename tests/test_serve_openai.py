"""``moot serve`` as a model for agent clients (issue 30): ``POST /v1/responses`` through the openai
SDK and Inspect AI, the debate's turns in the stream (``:trace``), every request field honoured or
refused by name, and the debate's cost in the response headers. Debates run on the loopback fake
OpenAI-compatible server."""

# ruff: noqa: F811  (make_server and collector are fixtures of test_serve_api and test_otel, imported)

from __future__ import annotations

import json
import typing
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.chat import completion_create_params as chat_params
from openai.types.responses import Response, ResponseStreamEvent
from openai.types.responses import response_create_params as responses_params
from pydantic import TypeAdapter

from moot.core.types import DebateResult
from moot.models.base import approx_tokens, trim_to_tokens
from moot.server.openai.fields import CHAT_HONOURED
from moot.server.openai.responses_request import HONOURED as RESPONSES_HONOURED
from moot.server.state.sqlite import SqliteStore
from moot.testing.fake_openai import Fault, default_reply, schema_reply
from serving import ServerThread
from test_otel import collector, exported  # noqa: F401  (the loopback OTLP collector fixture)
from test_serve_api import MakeServer, make_server  # noqa: F401  (the fixture)

EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
QUESTION = "Is 7 prime?"
#: A vote's reply on the fake model: a winning sample's own (its reasoning, then its answer).
VOTED = "a fake model's reasoning\n\nok"


def result_of(server: ServerThread, debate_id: str) -> DebateResult:
    return DebateResult.model_validate(httpx.get(f"{server.url}/v1/debates/{debate_id}").json()["result"])


def client_of(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def raw_events(server: ServerThread, body: dict[str, Any]) -> tuple[httpx.Headers, list[dict[str, Any]]]:
    """A streamed response's events as sent (each parsed strictly by the SDK's own event types)."""
    from httpx_sse import connect_sse

    with (
        httpx.Client(timeout=httpx.Timeout(60.0)) as client,
        connect_sse(client, "POST", server.url + "/v1/responses", json={**body, "stream": True}) as source,
    ):
        events = [json.loads(s.data) for s in source.iter_sse() if s.data]
        headers = source.response.headers
    for event in events:
        EVENTS.validate_python(event, strict=False)  # the SDK's types, validated (not only constructed)
    return headers, events


# --------------------------------------------------------------------------------- /v1/responses


def test_a_response_through_the_openai_sdk(make_server: MakeServer) -> None:
    server, _ = make_server(cached_tokens=8)
    client = client_of(server)
    reply = client.responses.create(
        model="moot/affirmative-critical",
        instructions="Answer briefly.",
        input=[
            {"role": "user", "content": "What is 2 + 2?"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "4."}]},
            {"role": "user", "content": [{"type": "input_text", "text": QUESTION}]},
        ],
    )
    debate_id = reply.metadata["moot_debate_id"] if reply.metadata else ""
    assert reply.id == f"resp_{debate_id}" and reply.model == "moot/affirmative-critical"
    assert reply.metadata is not None and reply.metadata["moot_url"].endswith(f"/debates/{debate_id}")
    result = result_of(server, debate_id)
    assert reply.status == "completed" and reply.output_text == result.final_answer
    assert [o.type for o in reply.output] == ["message"]  # no trace unless asked
    # the last user message is the question; the earlier messages its context (instructions instruct)
    assert result.task.question == QUESTION
    assert [(c.source, c.text) for c in result.task.context] == [
        ("user", "What is 2 + 2?"),
        ("assistant", "4."),
    ]
    # usage over every call of the debate, cached tokens included; the debate turns are its reasoning
    usage = reply.usage
    assert usage is not None and usage.input_tokens == result.usage.prompt_tokens
    assert usage.output_tokens == result.usage.completion_tokens and usage.total_tokens == result.usage.total_tokens
    assert usage.input_tokens_details.cached_tokens == 40 == result.usage.cached_prompt_tokens
    debating = sum(t.usage.completion_tokens for r in result.rounds for t in r.turns)
    assert usage.output_tokens_details.reasoning_tokens == debating < usage.output_tokens
    # the body is the SDK's Response, validated field by field (not only constructed)
    raw = httpx.post(server.url + "/v1/responses", json={"model": "moot/single", "input": QUESTION}, timeout=60)
    Response.model_validate(raw.json())
    # A lone turn is the reply itself: single and direct deliberate nothing (no reasoning tokens);
    # a vote's samples are its deliberation (its answer is tallied, not generated).
    for model, lone in (("moot/single", True), ("moot/direct", True), ("moot/vote", False)):
        one = client.responses.create(model=model, input=QUESTION).usage
        assert one is not None and one.output_tokens > 0, model
        assert one.output_tokens_details.reasoning_tokens == (0 if lone else one.output_tokens), model
    stored = SqliteStore(server.settings.db)
    try:
        request = stored.request(debate_id) or {}
    finally:
        stored.close()
    assert request["endpoint"] == "/v1/responses" and request["chat_completion"] is True  # never queued again


def test_a_streamed_response_sends_the_events_the_sdk_parses(make_server: MakeServer) -> None:
    server, fake = make_server()
    # The synthesis (the fifth call) comes a word every 30 ms: it streams out in several deltas.
    fake.faults.extend([Fault.delay(0.01)] * 4 + [Fault.trickle(0.03)])
    events = list(client_of(server).responses.create(model="moot/affirmative-critical", input=QUESTION, stream=True))
    kinds = [e.type for e in events]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert set(kinds[4:-4]) == {"response.output_text.delta"} and len(deltas) > 3  # as it comes, not one block
    assert [e.sequence_number for e in events] == list(range(len(events)))
    completed = events[-1]
    assert completed.type == "response.completed"
    debate_id = completed.response.id.removeprefix("resp_")
    result = result_of(server, debate_id)
    assert "".join(deltas) == result.final_answer == completed.response.output_text
    assert completed.response.usage is not None and completed.response.usage.total_tokens == result.usage.total_tokens
    # the same, as sent: each event validates as the SDK's own type
    headers, raw = raw_events(server, {"model": "moot/vote", "input": QUESTION})
    assert raw[-1]["type"] == "response.completed" and raw[-1]["response"]["output"][0]["content"][0]["text"] == VOTED
    assert headers["x-moot-debate-id"] == raw[-1]["response"]["metadata"]["moot_debate_id"]


def test_a_failed_debate_is_a_failed_response(make_server: MakeServer) -> None:
    server, fake = make_server()
    fake.faults.extend([Fault.http(400, "bad request upstream")] * 8)
    client = client_of(server)
    with pytest.raises(openai.APIStatusError) as err:
        client.responses.create(model="moot/single", input=QUESTION)
    assert err.value.status_code == 502 and "ended failed" in err.value.message
    events = list(client.responses.create(model="moot/single", input=QUESTION, stream=True))
    failed = events[-1]
    assert failed.type == "response.failed" and failed.response.status == "failed"
    assert failed.response.error is not None and "ended failed" in failed.response.error.message


def test_a_failed_chat_debate_has_the_same_error_type_streamed_or_not(make_server: MakeServer) -> None:
    """It was server_error unstreamed and debate_failed (no type of OpenAI's) in the stream's chunk."""
    server, fake = make_server()
    fake.faults.extend([Fault.http(400, "bad request upstream")] * 16)
    chat = {"model": "moot/single", "messages": [{"role": "user", "content": QUESTION}]}
    plain = httpx.post(server.url + "/v1/chat/completions", json=chat, timeout=60).json()["error"]
    streamed = httpx.post(server.url + "/v1/chat/completions", json={**chat, "stream": True}, timeout=60).text
    chunk = next(json.loads(line[6:]) for line in streamed.splitlines() if line.startswith('data: {"error"'))
    assert plain["type"] == chunk["error"]["type"] == "server_error" and plain["code"] == chunk["error"]["code"]


RESPONSES_REFUSALS: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "an unknown previous response",
        {"previous_response_id": "resp_1"},
        "previous_response_id",
        "Previous response with id 'resp_1' not found",
    ),
    ("conversation", {"conversation": "conv_1"}, "conversation", "send the whole conversation in input"),
    ("background, not stored", {"background": True, "store": False}, "background", "it must be stored"),
    ("a tool of another kind", {"tools": [{"type": "web_search"}]}, "tools[0]", "function tools only"),
    (
        "an image by file id",
        {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]},
        "input[0].content[0].file_id",
        "keeps no uploaded files",
    ),
    (
        "an image at a file path",
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "file:///etc/passwd"}]}]},
        "input[0].content[0].image_url",
        "neither an https:// address nor a data:image",
    ),
    (
        "an image in a system message",
        {"input": [{"role": "system", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]},
        "input[0].content[0]",
        "send it in a user message",
    ),
    (
        "a file by id",
        {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
        "input[0].content[0].file_id",
        "no Files API",
    ),
    (
        "an item of another kind",
        {"input": [{"type": "web_search_call", "id": "w"}]},
        "input[0]",
        "message items only",
    ),
    ("no question", {"input": [{"role": "system", "content": "x"}]}, "input", "user message"),
    ("effort", {"reasoning": {"effort": "high"}}, "reasoning.effort", "its protocol"),
    ("logprobs", {"include": ["message.output_text.logprobs"]}, "include[0]", "nothing of that kind"),
    ("below OpenAI's minimum", {"max_output_tokens": 8}, "max_output_tokens", "greater than or equal to 16"),
    ("not a model", {"model": "gpt-4o"}, "model", "use moot/<protocol>"),
    (
        "json on a selection",
        {"model": "moot/usc", "text": {"format": {"type": "json_object"}}},
        "text.format",
        "decides by a selection",
    ),
]


@pytest.mark.parametrize(
    ("body", "param", "needle"), [r[1:] for r in RESPONSES_REFUSALS], ids=[r[0] for r in RESPONSES_REFUSALS]
)
def test_what_a_debate_cannot_honour_is_refused_naming_the_field(
    make_server: MakeServer, body: dict[str, Any], param: str, needle: str
) -> None:
    server, fake = make_server()
    response = httpx.post(server.url + "/v1/responses", json={"model": "moot/vote", "input": QUESTION, **body})
    assert response.status_code in (400, 404), response.text
    error = response.json()["error"]
    assert error["param"] == param and needle in error["message"], error
    assert fake.requests == []  # before any model call


# ----------------------------------------------------------------------------------- the trace


def _traced_turns(result: DebateResult) -> list[str]:
    return [f"**{t.name}** · round {t.round}" for r in result.rounds for t in r.turns]


def test_the_debate_streams_as_reasoning_when_asked(make_server: MakeServer) -> None:
    server, _ = make_server()
    client = client_of(server)
    messages: Any = [{"role": "user", "content": QUESTION}]
    # chat, by the model name: every turn in reasoning_content, headed by its speaker and round, in order
    chunks = list(
        client.chat.completions.create(model="moot/affirmative-critical:trace", messages=messages, stream=True)
    )
    debate_id = chunks[0].id.removeprefix("moot-")
    result = result_of(server, debate_id)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join(str((d.model_extra or {}).get("reasoning_content") or "") for d in deltas)
    content = "".join(d.content or "" for d in deltas)
    assert content == result.final_answer  # the answer stays in content
    positions = [reasoning.find(h) for h in _traced_turns(result)]
    assert len(positions) == 4 and -1 not in positions and positions == sorted(positions), reasoning
    for turn in (t for r in result.rounds for t in r.turns):
        assert (turn.raw or turn.text or "") in reasoning
    # chat, by the request field, not streamed: the same trace in the message
    whole = client.chat.completions.create(
        model="moot/society-of-minds", messages=messages, extra_body={"moot": {"trace": True}}
    )
    traced = str((whole.choices[0].message.model_extra or {})["reasoning_content"])
    whole_result = result_of(server, (whole.model_extra or {})["moot"]["debate_id"])
    assert all(h in traced for h in _traced_turns(whole_result)) and whole.choices[0].message.content == VOTED
    # without the option, nothing of it (today's output, field for field)
    plain = httpx.post(
        server.url + "/v1/chat/completions", json={"model": "moot/society-of-minds", "messages": messages}, timeout=60
    ).json()
    assert "reasoning_content" not in plain["choices"][0]["message"]
    ChatCompletion.model_validate(plain)
    with httpx.stream(
        "POST",
        server.url + "/v1/chat/completions",
        json={"model": "moot/affirmative-critical", "messages": messages, "stream": True},
        timeout=60,
    ) as response:
        lines = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: {")]
    assert lines and not any("reasoning_content" in line for line in lines)
    for line in lines:
        ChatCompletionChunk.model_validate_json(line)


def test_a_response_streams_each_turn_as_a_reasoning_item(make_server: MakeServer) -> None:
    server, _ = make_server(reply=schema_reply)
    _, events = raw_events(
        server, {"model": "moot/affirmative-critical", "input": QUESTION, "reasoning": {"summary": "auto"}}
    )
    completed = events[-1]["response"]
    result = result_of(server, completed["metadata"]["moot_debate_id"])
    items = completed["output"]
    assert [i["type"] for i in items] == ["reasoning"] * 4 + ["message"]
    for item, heading in zip(items, _traced_turns(result), strict=False):
        assert item["content"][0]["text"].startswith(heading)
    # each reasoning item: added, its text as deltas, done; in order, one at a time
    for n, item in enumerate(items[:4]):
        mine = [e for e in events if e.get("output_index") == n]
        assert [e["type"] for e in mine][:2] == ["response.output_item.added", "response.content_part.added"]
        assert [e["type"] for e in mine][-3:] == [
            "response.reasoning_text.done",
            "response.content_part.done",
            "response.output_item.done",
        ]
        text = "".join(e["delta"] for e in mine if e["type"] == "response.reasoning_text.delta")
        assert text == item["content"][0]["text"] == mine[-3]["text"]
    assert items[-1]["content"][0]["text"] == result.final_answer
    # not streamed: the same items
    whole = client_of(server).responses.create(model="moot/panel:trace", input=QUESTION)
    assert [o.type for o in whole.output][-1] == "message" and len(whole.output) == 1 + sum(
        len(r.turns) for r in result_of(server, (whole.metadata or {})["moot_debate_id"]).rounds
    )


# ------------------------------------------------------------------------ request fields honoured


def _long_answers(request: dict[str, Any]) -> str:
    """Typed turns answer at length (so that a token bound has something to cut)."""
    if request.get("response_format"):
        typed = json.loads(schema_reply(request))
        typed["answer"] = "seven is a prime number because its only divisors are one and itself " * 2
        return json.dumps(typed)
    return default_reply(request)


def test_max_tokens_bound_the_decisions_reply(make_server: MakeServer) -> None:
    server, fake = make_server(reply=_long_answers)
    client = client_of(server)
    messages: Any = [{"role": "user", "content": QUESTION}]
    # a vote: its reply (a winning sample's own) is cut to the bound, with finish_reason length
    voted = client.chat.completions.create(model="moot/vote", messages=messages, max_completion_tokens=3)
    unbounded = client.chat.completions.create(model="moot/vote", messages=messages)
    whole = unbounded.choices[0].message.content or ""
    assert unbounded.choices[0].finish_reason == "stop" and approx_tokens(whole) > 3
    assert voted.choices[0].message.content == trim_to_tokens(whole, 3) and voted.choices[0].finish_reason == "length"
    # a synthesis: its own call gets the bound (the debaters' turns keep the protocol's)
    calls = len(fake.requests)
    synth = client.chat.completions.create(model="moot/affirmative-critical", messages=messages, max_tokens=4)
    sent = fake.requests[calls:]
    assert [r["max_tokens"] for r in sent] == [500] * 4 + [4]
    assert approx_tokens(synth.choices[0].message.content or "") <= 4 and synth.choices[0].finish_reason == "length"
    streamed = list(
        client.chat.completions.create(model="moot/affirmative-critical", messages=messages, max_tokens=4, stream=True)
    )
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == synth.choices[0].message.content
    assert [c.choices[0].finish_reason for c in streamed if c.choices and c.choices[0].finish_reason] == ["length"]
    # responses: max_output_tokens, an incomplete response
    reply = client.responses.create(model="moot/vote", input=QUESTION, max_output_tokens=16)
    assert reply.status == "incomplete" and reply.incomplete_details is not None
    assert reply.incomplete_details.reason == "max_output_tokens" and approx_tokens(reply.output_text) == 16
    # A typed synthesis the bound cuts before its JSON closes is the cut text, finish_reason length, as
    # OpenAI's API gives it (the SDK's parse raises LengthFinishReasonError): it was a 502 (an outside
    # trial's, session 37), the whole debate lost.
    schema = {  # (cut in its first field, the reply lacks the second: no repair makes it whole)
        "type": "object",
        "properties": {"answer": {"type": "string"}, "sure": {"type": "boolean"}},
        "required": ["answer", "sure"],
    }
    typed: Any = {"type": "json_schema", "json_schema": {"name": "A", "schema": schema}}

    def synthesis_cut() -> None:  # (the backend cuts the synthesis, the fifth call, at its max_tokens)
        fake.faults.extend([Fault.delay(0)] * 4 + [Fault.length()] * 2)  # (its retry is cut too)

    synthesis_cut()
    cut = client.chat.completions.create(
        model="moot/affirmative-critical", messages=messages, max_tokens=4, response_format=typed
    )
    assert cut.choices[0].finish_reason == "length" and (cut.choices[0].message.content or "").startswith("{")
    synthesis_cut()
    cut_stream = list(
        client.chat.completions.create(
            model="moot/affirmative-critical", messages=messages, max_tokens=4, response_format=typed, stream=True
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in cut_stream if c.choices) == cut.choices[0].message.content
    assert [c.choices[0].finish_reason for c in cut_stream if c.choices and c.choices[0].finish_reason] == ["length"]
    synthesis_cut()
    with pytest.raises(openai.LengthFinishReasonError):
        client.chat.completions.parse(
            model="moot/affirmative-critical", messages=messages, max_tokens=4, response_format=typed
        )
    text_format: Any = {"format": {"type": "json_schema", "name": "A", "schema": schema}}
    synthesis_cut()
    incomplete = client.responses.create(
        model="moot/affirmative-critical", input=QUESTION, max_output_tokens=16, text=text_format
    )
    assert incomplete.status == "incomplete" and incomplete.output_text.startswith("{")


def test_stop_sequences_cut_the_reply_streamed_or_not(make_server: MakeServer) -> None:
    server, fake = make_server()
    client = client_of(server)
    messages: Any = [{"role": "user", "content": QUESTION}]
    full = client.chat.completions.create(model="moot/affirmative-critical", messages=messages)
    answer = full.choices[0].message.content or ""
    stop = "prime"
    assert stop in answer
    cut = client.chat.completions.create(model="moot/affirmative-critical", messages=messages, stop=[stop, "zzz"])
    assert cut.choices[0].message.content == answer[: answer.find(stop)] and cut.choices[0].finish_reason == "stop"
    fake.faults.extend([Fault.delay(0.01)] * 4 + [Fault.trickle(0.03)])
    chunks = list(
        client.chat.completions.create(model="moot/affirmative-critical", messages=messages, stop=stop, stream=True)
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answer[: answer.find(stop)]


def test_temperature_and_seed_reach_every_call(make_server: MakeServer) -> None:
    server, fake = make_server()
    client_of(server).chat.completions.create(
        model="moot/affirmative-critical",
        messages=[{"role": "user", "content": QUESTION}],
        temperature=0.3,
        seed=2**31,  # seeds wrap into what every backend takes
    )
    assert [r["temperature"] for r in fake.requests] == [0.3] * 5
    debaters = [r.get("seed") for r in fake.requests[:4]]
    assert sorted(set(debaters)) == [0, 1]  # each agent its own seed, derived from the request's
    calls = len(fake.requests)
    client_of(server).responses.create(model="moot/affirmative-critical", input=QUESTION, temperature=1.5)
    assert [r["temperature"] for r in fake.requests[calls:]] == [1.5] * 5


SCHEMA = {
    "type": "object",
    "properties": {"verdict": {"type": "string", "enum": ["prime", "composite"]}, "reason": {"type": "string"}},
    "required": ["verdict", "reason"],
    "additionalProperties": False,
}


def test_a_json_schema_types_the_decision(make_server: MakeServer) -> None:
    server, fake = make_server(reply=schema_reply)
    client = client_of(server)
    reply = client.responses.create(
        model="moot/affirmative-critical",
        input=QUESTION,
        text={"format": {"type": "json_schema", "name": "verdict", "schema": SCHEMA, "strict": True}},
    )
    jsonschema.validate(json.loads(reply.output_text), SCHEMA)
    decision = fake.requests[-1]["response_format"]["json_schema"]
    assert decision["name"] == "verdict" and decision["schema"] == SCHEMA
    assert all("response_format" not in r for r in fake.requests[:-1])  # the debaters write free text
    chat = client.chat.completions.create(
        model="moot/panel",
        messages=[{"role": "user", "content": QUESTION}],
        response_format={"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA}},
    )
    jsonschema.validate(json.loads(chat.choices[0].message.content or ""), SCHEMA)
    # a schema that is not one, or whose root is not an object: refused by its field
    for schema, needle in (({"type": "nope"}, "not a valid JSON schema"), ({"type": "array"}, "root")):
        bad = httpx.post(
            server.url + "/v1/responses",
            json={
                "model": "moot/affirmative-critical",
                "input": QUESTION,
                "text": {"format": {"type": "json_schema", "name": "x", "schema": schema}},
            },
        )
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "text.format.schema"
        assert needle in bad.json()["error"]["message"]


def test_content_that_is_not_text_is_refused_not_dropped(make_server: MakeServer) -> None:
    server, fake = make_server()
    parts = {"input_audio": {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}}
    for kind, part in parts.items():
        body = {
            "model": "moot/single",
            "messages": [{"role": "user", "content": [{"type": "text", "text": QUESTION}, part]}],
        }
        response = httpx.post(server.url + "/v1/chat/completions", json=body)
        error = response.json()["error"]
        assert response.status_code == 400 and error["param"] == "messages[0].content[1]", (kind, error)
        assert f" {kind} part;" in error["message"]
        assert error["message"].startswith(f"messages[0].content[1]: an {kind} part")
    # A file by id: there is no Files API to look it up in (a file sent inline is read: test_input_files).
    by_id = {"type": "file", "file": {"file_id": "file-1"}}
    body = {
        "model": "moot/single",
        "messages": [{"role": "user", "content": [{"type": "text", "text": QUESTION}, by_id]}],
    }
    error = httpx.post(server.url + "/v1/chat/completions", json=body).json()["error"]
    assert error["param"] == "messages[0].content[1].file.file_id" and "no Files API" in error["message"]
    assert fake.requests == []


# ---------------------------------------------------------- every field of the OpenAI request types

#: A value of each field a debate cannot honour (or not at that value); a field of the SDK's request
#: that is neither here nor in the honoured list gets ``"?"``, which must be refused naming it too.
CHAT_SAMPLES: dict[str, Any] = {
    "n": 2, "top_p": 0.5, "presence_penalty": 1, "frequency_penalty": 1, "logit_bias": {"1": 5}, "logprobs": True,
    "top_logprobs": 3, "store": True, "service_tier": "priority", "verbosity": "low", "modalities": ["audio"],
    "tool_choice": {"type": "x"}, "reasoning_effort": "low", "parallel_tool_calls": {"a": 1},
    "tools": [{"type": "web_search"}], "functions": [{"name": "f"}],
    "function_call": "auto", "audio": {"voice": "alloy", "format": "wav"}, "prediction": {"type": "content"},
    "web_search_options": {}, "moderation": {"model": "omni"}, "prompt_cache_options": {"mode": "explicit"},
    "prompt_cache_retention": "24h", "max_tokens": 0, "stop": ["a", "b", "c", "d", "e"],
    "response_format": {"type": "xml"}, "temperature": 3, "seed": "x", "max_completion_tokens": 0,
    "stream_options": {"include_obfuscation": True},
}  # fmt: skip
RESPONSES_SAMPLES: dict[str, Any] = {
    "previous_response_id": "resp_1", "conversation": "c", "prompt": {"id": "p"}, "parallel_tool_calls": {"a": 1},
    "max_tool_calls": 3, "moderation": {"model": "omni"},
    "context_management": [{"type": "compaction"}], "access_programs": {"cyber": "standard"},
    "background_options": {"window": "2h"}, "image": {"context_compression": "enabled"},
    "prompt_cache_options": {"mode": "explicit"}, "prompt_cache_retention": "24h", "top_p": 0.5,
    "top_logprobs": 2, "service_tier": "flex", "include": ["file_search_call.results"], "truncation": "middle",
    "tools": [{"type": "web_search"}], "tool_choice": "required", "reasoning": {"effort": "high"},
    "text": {"verbosity": "high"}, "max_output_tokens": 1, "temperature": 3,
    "stream_options": {"include_obfuscation": True},
}  # fmt: skip


@pytest.mark.parametrize(
    ("path", "fields", "honoured", "samples", "base"),
    [
        (
            "/v1/chat/completions",
            typing.get_type_hints(chat_params.CompletionCreateParamsBase),
            CHAT_HONOURED,
            CHAT_SAMPLES,
            {"model": "moot/single", "messages": [{"role": "user", "content": QUESTION}]},
        ),
        (
            "/v1/responses",
            typing.get_type_hints(responses_params.ResponseCreateParamsBase),
            RESPONSES_HONOURED,
            RESPONSES_SAMPLES,
            {"model": "moot/single", "input": QUESTION},
        ),
    ],
    ids=["chat", "responses"],
)
def test_every_field_of_the_openai_request_is_honoured_or_refused_by_name(
    make_server: MakeServer,
    path: str,
    fields: dict[str, Any],
    honoured: frozenset[str],
    samples: dict[str, Any],
    base: dict[str, Any],
) -> None:
    """A new field in the SDK's request type cannot slip through silently: it is either in the
    endpoint's honoured list (each tested above) or refused with a 400 that names it."""
    server, fake = make_server()
    assert set(fields) >= {"model", "temperature"}  # the walk reached the SDK's fields
    checked = []
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for name in sorted(fields):
            if name in honoured and name not in samples:
                continue
            value = samples.get(name, "?")
            response = client.post(path, json={**base, name: value})
            assert response.status_code == 400, (name, value, response.text)
            param = response.json()["error"]["param"]
            assert param == name or param.startswith((f"{name}.", f"{name}[")), (name, response.text)
            checked.append(name)
    assert fake.requests == []
    unknown = sorted(set(fields) - honoured - set(samples))
    assert not unknown or all(n in checked for n in unknown)


def test_stream_options_without_a_stream_are_refused_as_openai_refuses_them(make_server: MakeServer) -> None:
    server, fake = make_server()
    chat = {"model": "moot/single", "messages": [{"role": "user", "content": QUESTION}]}
    refused = httpx.post(server.url + "/v1/chat/completions", json={**chat, "stream_options": {"include_usage": True}})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "stream_options"
    assert "set stream: true" in refused.json()["error"]["message"] and fake.requests == []
    streamed = httpx.post(
        server.url + "/v1/chat/completions",
        json={**chat, "stream": True, "stream_options": {"include_usage": True}},
        timeout=60,
    )
    assert streamed.status_code == 200 and '"usage":{' in streamed.text


# ----------------------------------------------------------------------------------------- cost


def test_the_debates_cost_is_in_the_response_headers(make_server: MakeServer) -> None:
    from moot.models.pricing import Price, PriceTable

    server, _ = make_server(prices=PriceTable(prices={"openai:fake": Price(input=1.0, output=2.0)}))
    for path, body in (
        (
            "/v1/chat/completions",
            {"model": "moot/affirmative-critical", "messages": [{"role": "user", "content": "Q?"}]},
        ),
        ("/v1/responses", {"model": "moot/affirmative-critical", "input": "Q?"}),
    ):
        response = httpx.post(server.url + path, json=body, timeout=60)
        headers = response.headers
        result = result_of(server, headers["x-moot-debate-id"])
        assert result.cost is not None and result.cost.usd is not None
        assert float(headers["x-moot-cost-usd"]) == pytest.approx(result.cost.usd)
        assert int(headers["x-moot-total-tokens"]) == result.usage.total_tokens
        assert int(headers["x-moot-calls"]) == result.llm_calls == 5
    # a model without a price: tokens, no dollars
    body = {"model": "moot/single", "messages": [{"role": "user", "content": "Q?"}], "moot": {"model": "openai:fake-2"}}
    unpriced = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).headers
    assert "x-moot-cost-usd" not in unpriced and int(unpriced["x-moot-total-tokens"]) > 0


# ---------------------------------------------------------------------------------- Inspect AI


def test_inspect_ais_default_openai_provider_needs_no_flag(
    make_server: MakeServer, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``inspect eval --model openai/moot/vote`` against moot serve: Inspect's default OpenAI provider
    posts to /v1/responses (no ``responses_api=false``), on a small local dataset, in process."""
    pytest.importorskip("inspect_ai", reason="inspect-ai is a dev dependency")
    from inspect_ai import Task
    from inspect_ai import eval as inspect_eval
    from inspect_ai.dataset import Sample
    from inspect_ai.model import get_model
    from inspect_ai.scorer import includes
    from inspect_ai.solver import generate

    server, fake = make_server()
    monkeypatch.setenv("OPENAI_BASE_URL", server.url + "/v1")
    dataset = [Sample(input="Is 7 prime? Say ok.", target="ok"), Sample(input="Is 9 prime? Say ok.", target="ok")]
    task = Task(dataset=dataset, solver=generate(), scorer=includes())
    # A model of its own: Inspect memoizes get_model by name, and one made by an earlier test in this
    # process would still point at that test's server (OPENAI_BASE_URL is read when it is made).
    model = get_model("openai/moot/vote", memoize=False)
    logs = inspect_eval(task, model=model, log_dir=str(tmp_path / "logs"), display="none")
    log = logs[0]
    assert log.status == "success", log.error
    assert log.results is not None and log.results.scores[0].metrics["accuracy"].value == 1.0
    assert log.samples is not None and [s.output.completion for s in log.samples] == [VOTED, VOTED]
    debates = httpx.get(server.url + "/v1/debates").json()["debates"]
    store = SqliteStore(server.settings.db)
    try:
        endpoints = {(store.request(d["id"]) or {}).get("endpoint") for d in debates}
    finally:
        store.close()
    assert len(debates) == 2 and endpoints == {"/v1/responses"}
    usage = log.samples[0].output.usage
    assert usage is not None and usage.input_tokens > 0 and len(fake.requests) == 10


def test_a_response_joins_its_callers_trace(tmp_path: Any, collector: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``--trace``, a ``traceparent`` on ``POST /v1/responses`` makes the debate's spans children
    of the caller's span, as on the other routes (test_otel.py)."""
    from moot.server import ServerSettings
    from moot.testing.fake_openai import FakeOpenAIServer
    from serving import FAKE_KEY

    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector)
    caller_trace, caller_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    with FakeOpenAIServer() as fake:
        settings = ServerSettings(
            db=tmp_path / "moot.sqlite", models=["openai:fake"], base_url=fake.base_url, trace=True
        )
        with ServerThread(settings) as server:
            body = {"model": "moot/single", "input": QUESTION}
            headers = {"traceparent": f"00-{caller_trace}-{caller_span}-01"}
            joined = httpx.post(server.url + "/v1/responses", json=body, headers=headers, timeout=60).json()
            streamed = {**body, "stream": True}
            with httpx.stream("POST", server.url + "/v1/responses", json=streamed, headers=headers, timeout=60) as r:
                assert r.status_code == 200 and list(r.iter_lines())
    spans = exported()  # the server flushed its spans when it stopped
    debates = [s for s in spans if s["name"].startswith("invoke_workflow")]
    assert joined["metadata"]["moot_debate_id"] in {d["attrs"]["moot.debate_id"] for d in debates}
    assert len(debates) == 2 and all(d["trace"] == caller_trace and d["parent"] == caller_span for d in debates)


# ------------------------------------------------------------------------------ moot serve --tuned

EVIDENCE = {
    "chosen": "vote@3",
    "model": "openai:fake",
    "objective": "accuracy",
    "budget": "calls=4",
    "reason": "the most accurate within the budget",
    "tuning_accuracy": 0.8,
    "tuning_items": 40,
    "held_out": {
        "items": 40,
        "accuracy": 0.75,
        "ci_low": 0.6,
        "ci_high": 0.86,
        "baseline": "vote@3",
        "baseline_accuracy": 0.75,
        "diff": 0.0,
        "diff_ci_low": -0.05,
        "diff_ci_high": 0.05,
        "mean_tokens": 300.0,
        "mean_calls": 3.0,
    },
    "data": "mytask.jsonl",
    "data_fingerprint": "0123456789abcdef",
    "date": "2026-11-20T10:00:00Z",
}


def write_tuned(path: Any, protocol: dict[str, Any]) -> Any:
    import yaml

    path.write_text(yaml.safe_dump({**protocol, "tuned": EVIDENCE}, sort_keys=False), encoding="utf-8")
    return path


def test_a_tuned_protocol_is_served_as_moot_auto_and_under_its_label(make_server: MakeServer, tmp_path: Any) -> None:
    from moot.server.tuned import load_tuned

    tuned = load_tuned(write_tuned(tmp_path / "tuned.yaml", {"preset": "vote", "with": {"k": 3}}))
    server, fake = make_server(tuned=tuned)
    client = client_of(server)
    cards = {m.id: m for m in client.models.list()}
    assert list(cards)[:2] == ["moot/auto", "moot/vote@3"] and "moot/auto:trace" in cards
    auto = cards["moot/auto"].model_extra or {}
    assert auto["tuned"]["chosen"] == "vote@3" and auto["tuned"]["held_out"]["items"] == 40
    assert "held out: 75.0% [60.0, 86.0] on 40 items" in auto["description"]
    assert "tuned" not in (cards["moot/single"].model_extra or {})  # the presets' cards are as before
    reply = client.chat.completions.create(model="moot/auto", messages=[{"role": "user", "content": QUESTION}])
    assert reply.choices[0].message.content == VOTED and len(fake.requests) == 3  # the tuned vote of 3
    response = client.responses.create(model="moot/vote@3:trace", input=QUESTION)
    assert response.output_text == VOTED and [o.type for o in response.output] == ["reasoning"] * 3 + ["message"]
    # on another of the server's models its evidence would not hold (the server's start checks its default)
    with pytest.raises(openai.BadRequestError, match="tuned on openai:fake") as other_model:
        client.chat.completions.create(
            model="moot/auto", messages=[{"role": "user", "content": QUESTION}],
            extra_body={"moot": {"model": "openai:fake-2"}},
        )  # fmt: skip
    assert other_model.value.body["param"] == "moot.model"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError, match="tuned on openai:fake"):  # (a participant's, by role)
        client.chat.completions.create(
            model="moot/auto", messages=[{"role": "user", "content": QUESTION}],
            extra_body={"moot": {"models": {"solver": "openai:fake-2"}}},
        )  # fmt: skip
    # without --tuned, moot/auto says where it comes from
    other, _ = make_server()
    missing = httpx.post(other.url + "/v1/responses", json={"model": "moot/auto", "input": QUESTION})
    assert missing.status_code == 404 and "moot serve --tuned tuned.yaml" in missing.json()["error"]["message"]


@pytest.mark.parametrize(
    ("protocol", "runs"),
    [
        ({"preset": "vote", "with": {"k": 5}}, "it runs vote(k=5), not vote@3"),
        ({"preset": "single"}, "it runs single, not vote@3"),
        ({"preset": "vote", "with": {"k": 3}, "stop": "max_rounds(2)"}, "it runs vote(k=3) with stop overridden"),
        ("inline", "it runs an inline protocol (no preset:), not vote@3"),
    ],
)
def test_a_tuned_file_edited_away_from_its_evidence_is_refused(
    tmp_path: Any, protocol: dict[str, Any] | str, runs: str
) -> None:
    from moot.protocols import get_preset
    from moot.server.tuned import load_tuned

    if protocol == "inline":  # the whole spec of a vote of 4, written out
        protocol = get_preset("vote", k=4).model_dump(mode="json", by_alias=True)
    assert isinstance(protocol, dict)
    with pytest.raises(ValueError, match=r"^--tuned ") as refused:
        load_tuned(write_tuned(tmp_path / "tuned.yaml", protocol))
    assert runs in str(refused.value) and "\n" not in str(refused.value)
    # As moot tune wrote it, with its turn budget changed and `with:` keys reordered, it is served.
    same = {"preset": "vote", "with": {"k": 3}, "budget": {"max_tokens_per_turn": 99}}
    assert load_tuned(write_tuned(tmp_path / "ok.yaml", same)).label == "vote@3"
    # What it runs is compared, not how it is written: k as a string, or the whole spec written out.
    assert load_tuned(write_tuned(tmp_path / "str.yaml", {"preset": "vote", "with": {"k": "3"}})).label == "vote@3"
    whole = get_preset("vote", k=3).model_dump(mode="json", by_alias=True)
    assert load_tuned(write_tuned(tmp_path / "whole.yaml", whole)).label == "vote@3"


def test_a_tuned_built_in_name_keeps_naming_the_built_in(make_server: MakeServer, tmp_path: Any) -> None:
    """A tune that chose plain `single` (with its own turn budget) is moot/auto; moot/single stays the
    built-in preset, listed once."""
    import yaml

    from moot.server.tuned import load_tuned

    path = tmp_path / "tuned.yaml"
    path.write_text(
        yaml.safe_dump(
            {"preset": "single", "budget": {"max_tokens_per_turn": 64}, "tuned": EVIDENCE | {"chosen": "single"}}
        ),
        encoding="utf-8",
    )
    tuned = load_tuned(path)
    assert tuned.label == "single"
    server, fake = make_server(tuned=tuned)
    client = client_of(server)
    ids = [m.id for m in client.models.list()]
    assert len(ids) == len(set(ids)) and ids[0] == "moot/auto" and ids.count("moot/single") == 1
    single = next(m for m in client.models.list() if m.id == "moot/single")
    assert "tuned" not in (single.model_extra or {})
    client.chat.completions.create(model="moot/auto", messages=[{"role": "user", "content": QUESTION}])
    client.chat.completions.create(model="moot/single", messages=[{"role": "user", "content": QUESTION}])
    auto_cap, single_cap = (r.get("max_tokens") or r.get("max_completion_tokens") for r in fake.requests)
    assert auto_cap == 64 and single_cap != 64


def test_moot_serve_refuses_a_tuned_file_it_cannot_serve_in_one_line(tmp_path: Any) -> None:
    import yaml
    from typer.testing import CliRunner

    from moot.cli.main import app

    plain = tmp_path / "plain.yaml"
    plain.write_text("preset: vote\n", encoding="utf-8")
    too_long = tmp_path / "long.yaml"
    too_long.write_text(
        yaml.safe_dump(
            {
                "preset": "society-of-minds",
                "with": {"rounds": 30},
                "tuned": EVIDENCE | {"chosen": "society-of-minds(rounds=30)"},
            }
        ),
        encoding="utf-8",
    )
    other_model = tmp_path / "other.yaml"
    other_model.write_text(
        yaml.safe_dump({"preset": "vote", "with": {"k": 3}, "tuned": EVIDENCE | {"model": "openai:other"}}),
        encoding="utf-8",
    )
    # Hand-edited after moot tune wrote it: the preset is no longer the one its evidence measured.
    edited = tmp_path / "edited.yaml"
    edited.write_text(
        yaml.safe_dump({"preset": "society-of-minds", "tuned": EVIDENCE | {"chosen": "direct"}}), encoding="utf-8"
    )
    for path, needle in (
        (plain, "no tuned: block"),
        (too_long, "protocol.with.rounds: 30 is over this server's limit of 10"),
        (edited, "it runs society-of-minds, not direct, the protocol its evidence (tuned.chosen) measured"),
        (tmp_path / "missing.yaml", "does not exist"),
        (
            other_model,
            "it was tuned on openai:other, and moot/auto would run on this server's default model, openai:fake",
        ),
    ):
        result = CliRunner().invoke(app, ["serve", "--tuned", str(path), "--models", "openai:fake", "--port", "0"])
        assert result.exit_code == 2 and needle in result.output and "Traceback" not in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1


def test_stream_and_moot_sent_as_null_are_left_out(make_server: MakeServer) -> None:
    """OpenAI types stream as "boolean or null, default false": a client that writes every optional field
    sends null, which was refused on both routes (an outside trial's, session 37)."""
    server, _ = make_server()
    chat = {"model": "moot/single", "messages": [{"role": "user", "content": QUESTION}], "stream": None, "moot": None}
    response = httpx.post(server.url + "/v1/chat/completions", json=chat, timeout=60)
    assert response.status_code == 200 and response.json()["object"] == "chat.completion", response.text
    body = {"model": "moot/single", "input": QUESTION, "stream": None, "moot": None}
    response = httpx.post(server.url + "/v1/responses", json=body, timeout=60)
    assert response.status_code == 200 and response.json()["status"] == "completed", response.text
    refused = httpx.post(server.url + "/v1/responses", json={**body, "stream": "yes"}, timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "stream"


def test_a_refused_fields_place_is_written_one_way_with_indexes_in_brackets(make_server: MakeServer) -> None:
    """pydantic's refusals named a field messages.0.role, moot's own messages[0].content (an outside
    trial's, session 37): both are OpenAI's form now, so a client maps param back to its data one way."""
    server, _ = make_server()
    bad_role = {"model": "moot/single", "messages": [{"role": "wizard", "content": QUESTION}]}
    error = httpx.post(server.url + "/v1/chat/completions", json=bad_role).json()["error"]
    assert error["param"] == "messages[0].role" and error["message"].startswith("messages[0].role: "), error
    nested = {"question": QUESTION, "context": [{"text": "a", "source": 5}]}
    error = httpx.post(server.url + "/v1/debates", json=nested).json()["error"]
    assert error["param"] == "context[0].source", error


def test_retrieving_a_chat_completion_says_none_is_stored_and_where_its_debate_is(make_server: MakeServer) -> None:
    """The SDK's chat.completions.retrieve got "the API is under /v1", which it was (an outside trial's)."""
    server, _ = make_server()
    client = client_of(server)
    made = client.chat.completions.create(model="moot/single", messages=[{"role": "user", "content": QUESTION}])
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.retrieve(made.id)
    said = str(missing.value)
    debate = made.id.removeprefix("moot-")
    assert "keeps no chat completion to retrieve" in said and f"GET /v1/debates/{debate}" in said, said
    assert httpx.get(f"{server.url}/v1/debates/{debate}").status_code == 200


def test_a_requests_debate_is_built_off_the_event_loop(
    make_server: MakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review: a conversation at the body limit was fitted to the prompt budget on the event loop
    (0.2 s, every other request waiting). The debate of a chat completion and of a Responses request
    is built, and its conversation fitted, in a worker thread."""
    import threading

    from moot.server.openai import submission

    built: list[str] = []
    original = submission.prepared_debate

    def watched(*args: Any, **kwargs: Any) -> Any:
        built.append(threading.current_thread().name)
        return original(*args, **kwargs)

    monkeypatch.setattr(submission, "prepared_debate", watched)
    server, _ = make_server()
    body = {"model": "moot/single", "messages": [{"role": "user", "content": "Is 7 prime?"}]}
    assert httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).status_code == 200
    assert httpx.post(server.url + "/v1/responses", json={"model": "moot/single", "input": "Q?"}, timeout=60).is_success
    assert len(built) == 2 and all(name.startswith("moot-schemas") for name in built), built
