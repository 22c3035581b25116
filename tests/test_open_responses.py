"""``/v1/responses`` against the Open Responses standard (openresponses.org, issue 41): every response
object and every stream event moot sends is validated by the standard's own schema, as
``openresponses-types`` (generated from its OpenAPI document) writes it; and the standard's
``/v1/responses/compact`` and WebSocket mode. Debates run on the loopback fake OpenAI server."""

# ruff: noqa: F811  (make_server is test_serve_api's fixture, imported)

from __future__ import annotations

import base64
import copy
import json
import time
from typing import Any

import httpx
import openresponses_types as spec
import pytest
from pydantic import BaseModel

from moot.testing.fake_openai import Fault, schema_reply
from serving import ServerThread
from test_serve_api import MakeServer, make_server  # noqa: F401  (the fixture)

QUESTION = "Is 7 prime?"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a location",
    "parameters": {
        "type": "object",
        "properties": {"location": {"type": "string", "description": "The city and state"}},
        "required": ["location"],
    },
}

#: Every streaming event of the standard, by its type.
EVENT_MODELS: dict[str, type[BaseModel]] = {
    "response.created": spec.ResponseCreatedStreamingEvent,
    "response.queued": spec.ResponseQueuedStreamingEvent,
    "response.in_progress": spec.ResponseInProgressStreamingEvent,
    "response.completed": spec.ResponseCompletedStreamingEvent,
    "response.failed": spec.ResponseFailedStreamingEvent,
    "response.incomplete": spec.ResponseIncompleteStreamingEvent,
    "response.output_item.added": spec.ResponseOutputItemAddedStreamingEvent,
    "response.output_item.done": spec.ResponseOutputItemDoneStreamingEvent,
    "response.content_part.added": spec.ResponseContentPartAddedStreamingEvent,
    "response.content_part.done": spec.ResponseContentPartDoneStreamingEvent,
    "response.output_text.delta": spec.ResponseOutputTextDeltaStreamingEvent,
    "response.output_text.done": spec.ResponseOutputTextDoneStreamingEvent,
    "response.function_call_arguments.delta": spec.ResponseFunctionCallArgumentsDeltaStreamingEvent,
    "response.function_call_arguments.done": spec.ResponseFunctionCallArgumentsDoneStreamingEvent,
    "error": spec.ErrorStreamingEvent,
}
#: The traced turns' text events carry OpenAI's names (the openai SDK parses them); the standard
#: names the same events ``response.reasoning.delta`` and ``.done``. Their fields are the standard's.
REASONING_TEXT: dict[str, type[BaseModel]] = {
    "response.reasoning_text.delta": spec.ResponseReasoningDeltaStreamingEvent,
    "response.reasoning_text.done": spec.ResponseReasoningDoneStreamingEvent,
}


def tool_agent(request: dict[str, Any]) -> str:
    """Each agent: calls get_weather when it may and its result is not in yet, else answers."""
    if "get_weather" not in json.dumps(request.get("response_format")):
        return schema_reply(request)
    if "the result of the tool call" in json.dumps(request.get("messages")):
        return json.dumps({"reasoning": "the tool said so", "do": "answer", "answer": "64 degrees and clear."})
    return json.dumps({"reasoning": "I need it", "do": "get_weather", "arguments": {"location": "San Francisco, CA"}})


def valid_response(body: dict[str, Any]) -> spec.ResponseResource:
    """``body`` validated as the standard's ResponseResource. (openresponses-types 2.4.0 types a
    ``json_schema`` format's ``schema`` as null only, where the standard says an object or null: the
    schema is checked to be an object here, and validated as null.)"""
    body = copy.deepcopy(body)
    fmt = body.get("text", {}).get("format", {})
    if fmt.get("type") == "json_schema":
        assert isinstance(fmt.get("schema"), dict)
        fmt["schema"] = None
    return spec.ResponseResource.model_validate(body)


def valid_event(event: dict[str, Any]) -> None:
    kind = event["type"]
    if kind in REASONING_TEXT:
        REASONING_TEXT[kind].model_validate({**event, "type": kind.replace("reasoning_text", "reasoning")})
        return
    assert kind in EVENT_MODELS, f"{kind} is not an event of the standard"
    model = EVENT_MODELS[kind]
    if "response" in event:
        valid_response(event["response"])
        event = {**event, "response": {**event["response"], "text": {"format": {"type": "text"}}}}
    model.model_validate(event)


def post(server: ServerThread, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url + "/v1/responses", json=body, timeout=60)


def sse_lines(server: ServerThread, body: dict[str, Any]) -> tuple[bytes, list[dict[str, Any]]]:
    """A streamed response: its raw bytes, and its events parsed as the compliance suite's parser
    does (lines split on LF alone, an event ended by an empty line)."""
    raw = httpx.post(server.url + "/v1/responses", json={**body, "stream": True}, timeout=60).content
    events: list[dict[str, Any]] = []
    data = ""
    for line in raw.decode().split("\n"):
        if line.startswith("data:"):
            data = line[5:].strip()
        elif line == "" and data:
            events.append(json.loads(data))
            data = ""
    return raw, events


# ------------------------------------------------------------------------------ response objects


def test_a_response_carries_every_field_the_standard_requires(make_server: MakeServer) -> None:
    server, _ = make_server()
    body = {
        "model": "moot/vote",
        "input": [{"type": "message", "role": "user", "content": QUESTION}],
        "safety_identifier": "user-1",
        "prompt_cache_key": "k",
    }
    reply = post(server, body)
    assert reply.status_code == 200, reply.text
    got = reply.json()
    resource = valid_response(got)
    assert resource.status == "completed" and resource.output
    # The values are the debate's: the request's or the ones it ran with.
    assert got["completed_at"] >= got["created_at"]
    assert got["previous_response_id"] is None
    assert (got["temperature"], got["top_p"], got["presence_penalty"], got["frequency_penalty"]) == (1.0, 1.0, 0, 0)
    assert (got["top_logprobs"], got["service_tier"], got["max_tool_calls"]) == (0, "default", None)
    # store left out: the response is stored, as in OpenAI's API (GET /v1/responses/{id} reads it)
    assert (got["safety_identifier"], got["prompt_cache_key"], got["store"], got["background"]) == (
        "user-1",
        "k",
        True,
        False,
    )
    # A temperature asked for is the one echoed.
    warm = post(server, {"model": "moot/single", "input": QUESTION, "temperature": 0.3}).json()
    assert valid_response(warm).temperature == 0.3


def test_tools_come_back_in_the_standards_form_and_a_call_validates(make_server: MakeServer) -> None:
    server, _ = make_server(reply=tool_agent)
    body = {"model": "moot/single", "input": "What's the weather like in San Francisco?", "tools": [WEATHER]}
    got = post(server, body).json()
    resource = valid_response(got)
    assert got["tools"] == [{**WEATHER, "strict": None}]  # strict: the request said nothing
    assert [o.root.type if hasattr(o, "root") else o.type for o in resource.output] == ["function_call"]
    strict = post(server, {**body, "tools": [{**WEATHER, "strict": True}]}).json()
    assert valid_response(strict).tools[0].root.strict is True
    _, events = sse_lines(server, body)
    for event in events:
        valid_event(event)
    kinds = [e["type"] for e in events]
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    assert kinds[-1] == "response.completed"


def test_a_typed_reply_echoes_its_format_in_full(make_server: MakeServer) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    server, _ = make_server(reply=schema_reply)
    fmt = {"type": "json_schema", "name": "verdict", "schema": schema}
    got = post(server, {"model": "moot/panel", "input": QUESTION, "text": {"format": fmt}}).json()
    valid_response(got)
    assert got["text"]["format"] == {**fmt, "description": None, "strict": False}
    json_object = post(server, {"model": "moot/panel", "input": QUESTION, "text": {"format": {"type": "json_object"}}})
    assert valid_response(json_object.json()).text.format.type == "json_object"


def test_reasoning_comes_back_with_effort_and_summary(make_server: MakeServer) -> None:
    server, _ = make_server()
    got = post(server, {"model": "moot/single", "input": QUESTION, "reasoning": {"summary": "auto"}}).json()
    assert valid_response(got).reasoning is not None
    assert got["reasoning"] == {"effort": None, "summary": "auto"}
    # The traced output (reasoning items, one per turn) validates too.
    assert {o["type"] for o in got["output"]} == {"reasoning", "message"}


# ------------------------------------------------------------------------------------- streaming


def test_a_stream_ends_its_lines_in_lf_and_every_event_validates(make_server: MakeServer) -> None:
    server, _ = make_server()
    raw, events = sse_lines(server, {"model": "moot/affirmative-critical", "input": "Count from 1 to 5."})
    assert b"\r" not in raw
    assert events and [e["sequence_number"] for e in events] == list(range(len(events)))
    for event in events:
        valid_event(event)
    assert events[-1]["type"] == "response.completed"
    final = valid_response(events[-1]["response"])
    assert final.status == "completed" and final.completed_at is not None
    assert events[0]["response"]["completed_at"] is None  # still running
    # A traced stream's events validate as well (the turns' text under OpenAI's event names).
    _, traced = sse_lines(server, {"model": "moot/affirmative-critical:trace", "input": QUESTION})
    for event in traced:
        valid_event(event)
    assert "response.reasoning_text.delta" in {e["type"] for e in traced}


def test_every_sse_route_ends_its_lines_in_lf(make_server: MakeServer) -> None:
    server, _ = make_server()
    chat = httpx.post(
        server.url + "/v1/chat/completions",
        json={"model": "moot/single", "messages": [{"role": "user", "content": QUESTION}], "stream": True},
        timeout=60,
    )
    assert chat.status_code == 200 and b"data: [DONE]\n\n" in chat.content and b"\r" not in chat.content
    started = httpx.post(server.url + "/v1/debates", json={"question": QUESTION, "protocol": "single"}, timeout=60)
    debate = started.json()["id"]
    with httpx.stream("GET", f"{server.url}/v1/debates/{debate}/events", timeout=60) as native:
        raw = b"".join(native.iter_bytes())
    assert b"event: " in raw and b"\r" not in raw


def test_a_failed_debate_is_a_response_the_standard_reads(make_server: MakeServer) -> None:
    server, fake = make_server()
    fake.faults.extend([Fault.http(400, "the backend refused")] * 8)
    _, events = sse_lines(server, {"model": "moot/single", "input": QUESTION})
    for event in events:
        valid_event(event)
    assert events[-1]["type"] == "response.failed"
    failed = valid_response(events[-1]["response"])
    assert failed.error is not None and failed.completed_at is None  # (only a completed response has it)


def test_errors_carry_the_standards_error_fields(make_server: MakeServer) -> None:
    server, _ = make_server()
    refused = post(server, {"model": "moot/single", "input": QUESTION, "top_p": 0.5})
    assert refused.status_code == 400
    error = spec.ErrorPayload.model_validate(refused.json()["error"])
    assert error.param == "top_p" and error.type == "invalid_request_error"
    image = post(
        server,
        {
            "model": "moot/single",
            "input": [
                {
                    "type": "message",
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "What do you see?"},
                        {"type": "input_image", "image_url": "data:image/svg+xml;base64,AAAA"},
                    ],
                }
            ],
        },
    )
    # An image of a type models do not read: a 400 naming the part and the types they do.
    assert image.status_code == 400, image.text
    assert image.json()["error"]["param"] == "input[0].content[1].image_url"
    assert "png, jpeg, gif, webp" in image.json()["error"]["message"]
    spec.ErrorPayload.model_validate(image.json()["error"])


# ------------------------------------------------------------------------------------ compaction

CONVERSATION: list[dict[str, Any]] = [
    {"type": "message", "role": "user", "content": "My name is Alice."},
    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"location": "Paris"}'},
    {"type": "function_call_output", "call_id": "call_1", "output": "64 degrees and clear"},
    {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "a turn"}]},
]


def test_compact_packs_the_conversation_into_one_item_that_reads_back_the_same(make_server: MakeServer) -> None:
    server, fake = make_server()
    reply = httpx.post(server.url + "/v1/responses/compact", json={"model": "moot/single", "input": CONVERSATION})
    assert reply.status_code == 200, reply.text
    compacted = spec.CompactResource.model_validate(reply.json())
    assert compacted.object == "response.compaction" and compacted.usage.total_tokens == 0  # no model call
    assert [o.type for o in compacted.output] == ["compaction"]
    assert "Alice" not in reply.text  # opaque to the client (packed, not encrypted: see the docs)
    assert not fake.requests
    # Sent back with the next question, it is the same context the conversation itself would be.
    follow = {"type": "message", "role": "user", "content": "What is my name?"}
    again = post(server, {"model": "moot/single", "input": [*reply.json()["output"], follow]})
    assert again.status_code == 200, again.text
    valid_response(again.json())
    prompt = json.dumps(fake.requests[-1]["messages"])
    assert "[1] My name is Alice." in prompt and "[2] (called the tool get_weather" in prompt
    assert "[3] (the result of the tool call call_1:)\\n64 degrees and clear" in prompt
    assert "a turn" not in prompt  # a trace is never context


def test_compact_refuses_what_it_cannot_read_by_name(make_server: MakeServer) -> None:
    server, _ = make_server()
    url = server.url + "/v1/responses/compact"
    unknown = httpx.post(url, json={"model": "gpt-4o", "input": "hi"})
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"
    chained = httpx.post(url, json={"model": "moot/single", "input": "hi", "previous_response_id": "resp_1"})
    assert chained.status_code == 400 and chained.json()["error"]["param"] == "previous_response_id"
    forged = {"type": "compaction", "encrypted_content": "gAAAA-not-ours"}
    refused = post(server, {"model": "moot/single", "input": [forged, {"role": "user", "content": "hi"}]})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "input[0].encrypted_content"
    bomb = open_responses_compaction([{"type": "message", "role": "user", "content": "x" * 5_000_000}])
    refused = post(server, {"model": "moot/single", "input": [bomb]})
    assert refused.status_code == 400 and "unpack to over" in refused.json()["error"]["message"]


def test_compact_unpacks_each_compaction_item_once(make_server: MakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compacting again a conversation that holds a compaction item unpacks that item once (the
    check and the packing each unpacked it before); a payload that carries another compaction item
    was not made by this server (it packs unpacked items) and is refused by its place."""
    from moot.server.openai import open_responses

    server, _ = make_server()
    url = server.url + "/v1/responses/compact"
    first = httpx.post(url, json={"model": "moot/single", "input": CONVERSATION}).json()["output"]
    unpacked: list[str] = []
    unpack = open_responses.compacted_messages

    def counted(item: dict[str, Any], where: str, room: Any = None) -> list[dict[str, Any]]:
        unpacked.append(where)
        return unpack(item, where, room)

    monkeypatch.setattr(open_responses, "compacted_messages", counted)
    follow = {"type": "message", "role": "user", "content": "What is my name?"}
    again = httpx.post(url, json={"model": "moot/single", "input": [*first, follow]})
    assert again.status_code == 200, again.text
    assert unpacked == ["input[0]"]
    nested = open_responses_compaction([first[0], follow])
    refused = httpx.post(url, json={"model": "moot/single", "input": [nested]})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "input[0].encrypted_content"


def test_a_crafted_compaction_payload_is_read_as_a_body_is(make_server: MakeServer) -> None:
    """A compaction payload is packed, not encrypted: a client can craft one. Nested past the
    parser's limit or holding a lone surrogate it was a 500 with a traceback (a 1011 on a socket);
    it is refused by its place, on both endpoints that read it."""
    import zlib

    from moot.server.openai.open_responses import COMPACTION_PREFIX

    server, fake = make_server()

    def crafted(payload: str) -> dict[str, Any]:
        packed = base64.urlsafe_b64encode(zlib.compress(payload.encode("utf-8", "surrogatepass"))).decode()
        return {"type": "compaction", "encrypted_content": COMPACTION_PREFIX + packed}

    deep = crafted("[" * 100_000 + "]" * 100_000)
    lone = crafted('[{"type": "message", "role": "user", "content": "a\\ud800b"}]')
    for item, needle in ((deep, "nests deeper"), (lone, "lone surrogate")):
        for path in ("/v1/responses", "/v1/responses/compact"):
            refused = httpx.post(server.url + path, json={"model": "moot/single", "input": [item]})
            assert refused.status_code == 400, (path, refused.text)
            error = refused.json()["error"]
            assert error["param"] == "input[0].encrypted_content" and needle in error["message"], error
    assert fake.requests == []


def test_a_request_s_compaction_items_unpack_within_one_bound_in_all(make_server: MakeServer) -> None:
    """Found by an attack: each compaction item was bounded alone (4 MB unpacked), so 35 items of 16 KB
    each, unpacking to 89,000 tiny messages apiece, took 36 s and 4 GB of memory, and twenty unpacking
    to one 4 MB message each held the event loop for seconds. The request's items now share one bound
    of bytes and one of JSON objects, checked as each unpacks."""
    from moot.server.openai.open_responses import MAX_COMPACTED_BYTES, MAX_COMPACTED_OBJECTS

    server, fake = make_server()
    large = open_responses_compaction(
        [{"type": "message", "role": "user", "content": "x" * (MAX_COMPACTED_BYTES // 3 - 1000)}]
    )
    tiny = {"type": "message", "role": "user", "content": "x"}
    many = open_responses_compaction([tiny] * (MAX_COMPACTED_OBJECTS // 2))
    question = {"role": "user", "content": "q"}
    for path in ("/v1/responses", "/v1/responses/compact"):
        for items, needle, at in (([large] * 4, "bytes in all", 3), ([many] * 3, "JSON objects in all", 2)):
            refused = httpx.post(server.url + path, json={"model": "moot/single", "input": [*items, question]})
            assert refused.status_code == 400, (path, refused.text)
            error = refused.json()["error"]
            assert error["param"] == f"input[{at}].encrypted_content" and needle in error["message"], error
    # Nor does the server make one it would refuse (a review: four compactions and more compacted again).
    over = httpx.post(
        server.url + "/v1/responses/compact",
        json={"model": "moot/single", "input": [large] * 3 + [{"role": "user", "content": "y" * 200_000}]},
    )
    assert over.status_code == 400 and over.json()["error"]["param"] == "input", over.text
    assert "one compaction item may carry" in over.json()["error"]["message"]
    assert fake.requests == []


def open_responses_compaction(items: list[dict[str, Any]]) -> dict[str, Any]:
    """A compaction item as the server packs one, of any size (a client can craft one past the bound)."""
    import zlib

    from moot.server.openai.open_responses import COMPACTION_PREFIX

    packed = json.dumps(items, separators=(",", ":"), ensure_ascii=False).encode()
    payload = COMPACTION_PREFIX + base64.urlsafe_b64encode(zlib.compress(packed, 9)).decode()
    return {"type": "compaction", "id": "cmp_test", "encrypted_content": payload, "created_by": "moot"}


# ------------------------------------------------------------------------------------- WebSocket


def ws_url(server: ServerThread) -> str:
    return server.url.replace("http://", "ws://") + "/v1/responses"


def turn(socket: Any, **body: Any) -> list[dict[str, Any]]:
    """One ``response.create`` and the events it brings, to its last (or an error)."""
    socket.send(json.dumps({"type": "response.create", **body}))
    events: list[dict[str, Any]] = []
    while True:
        event = json.loads(socket.recv(timeout=60))
        events.append(event)
        if event["type"] in ("response.completed", "response.incomplete", "response.failed", "error"):
            return events


def test_websocket_mode_runs_turns_and_continues_the_last_response(make_server: MakeServer) -> None:
    from websockets.sync.client import connect

    server, fake = make_server()
    with connect(ws_url(server)) as socket:
        first = turn(socket, model="moot/single", input="My name is Alice.", store=False)
        for event in first:
            valid_event(event)
        assert first[0]["type"] == "response.created" and first[-1]["type"] == "response.completed"
        first_id = first[-1]["response"]["id"]
        second = turn(socket, model="moot/single", previous_response_id=first_id, input="What is my name?", store=False)
        for event in second:
            valid_event(event)
        assert second[-1]["response"]["previous_response_id"] == first_id
        prompt = "\n".join(str(m["content"]) for m in fake.requests[-1]["messages"])
        answer = first[-1]["response"]["output"][-1]["content"][0]["text"]
        assert "[1] My name is Alice. (source: user)" in prompt  # the earlier turn, and its reply
        assert f"[2] {answer} (source: assistant)" in prompt
        # Not stored, only the connection's last response is kept: the first is gone, an unknown id refused.
        for gone in (first_id, "resp_unknown"):
            refused = turn(socket, model="moot/single", previous_response_id=gone, input="Again?", store=False)
            assert refused == [
                {
                    "type": "error",
                    "status": 400,
                    "error": {
                        "type": "invalid_request_error",
                        "code": "previous_response_not_found",
                        "message": refused[0]["error"]["message"],
                        "param": "previous_response_id",
                    },
                }
            ]
            spec.WebSocketErrorEvent.model_validate(refused[0])
        # Refusals that continued another response left the cache and the connection as they were.
        third = turn(
            socket, model="moot/single", previous_response_id=second[-1]["response"]["id"], input="And?", store=False
        )
        assert third[-1]["type"] == "response.completed"
        # A refused item of a continuation is named by its place in this message's input, as over HTTP (it
        # counted the chain's earlier items: input[1] here)...
        third_id = third[-1]["response"]["id"]
        wrong = [{"role": "user", "content": "Hi"}, {"role": "wizard", "content": "x"}]
        bad = turn(socket, model="moot/single", previous_response_id=third_id, input=wrong, store=False)
        assert bad[-1]["type"] == "error" and bad[-1]["error"]["param"].startswith("input[1]"), bad[-1]
        # ... and, as the standard requires, the failed continuation evicted the response it continued.
        evicted = turn(socket, model="moot/single", previous_response_id=third_id, input="Again?", store=False)
        assert evicted[-1]["type"] == "error", evicted[-1]
        assert evicted[-1]["error"]["code"] == "previous_response_not_found"


def test_a_websocket_response_is_stored_as_an_http_one_is(make_server: MakeServer) -> None:
    """``store`` left out (or true): the response is retrievable, continued over HTTP and from another
    connection; ``store: false`` says so and is neither."""
    from websockets.sync.client import connect

    server, fake = make_server()
    with connect(ws_url(server)) as socket:
        made = turn(socket, model="moot/single", input="Remember the word PELICAN.", instructions="Be brief.")
        kept = turn(socket, model="moot/single", input="Is 7 prime?", store=False)
    final = made[-1]["response"]
    assert final["store"] is True and kept[-1]["response"]["store"] is False
    got = httpx.get(f"{server.url}/v1/responses/{final['id']}")
    assert got.status_code == 200, got.text
    assert got.json() == final  # as the socket sent it
    valid_response(got.json())
    items = httpx.get(f"{server.url}/v1/responses/{final['id']}/input_items").json()["data"]
    assert [i["type"] for i in items] == ["message"] and "PELICAN" in json.dumps(items)
    assert httpx.get(f"{server.url}/v1/responses/{kept[-1]['response']['id']}").status_code == 404
    chained = httpx.post(
        server.url + "/v1/responses",
        json={"model": "moot/single", "input": "Which word?", "previous_response_id": final["id"]},
        timeout=60,
    )
    assert chained.status_code == 200, chained.text
    assert "PELICAN" in json.dumps(fake.requests[-1]["messages"])
    with connect(ws_url(server)) as other:  # another connection continues a stored response too
        again = turn(other, model="moot/single", input="Which word, again?", previous_response_id=final["id"])
    assert again[-1]["type"] == "response.completed" and again[-1]["response"]["previous_response_id"] == final["id"]
    assert "PELICAN" in json.dumps(fake.requests[-1]["messages"])


def test_websocket_mode_refuses_a_bad_message_and_stays_open(make_server: MakeServer) -> None:
    from websockets.sync.client import connect

    server, _ = make_server()
    with connect(ws_url(server)) as socket:
        socket.send("not json")
        assert json.loads(socket.recv(timeout=60))["status"] == 400
        for body, param in (
            ({"type": "response.cancel"}, "type"),
            ({"type": "response.create", "model": "moot/single", "input": "hi", "stream": True}, "stream"),
            ({"type": "response.create", "model": "moot/single", "input": "hi", "background": False}, "background"),
            ({"type": "response.create", "model": "moot/single", "input": "hi", "top_p": 0.5}, "top_p"),
            ({"type": "response.create", "model": "moot/single", "input": "hi", "nonsense": 1}, "nonsense"),
            ({"type": "response.create", "model": "gpt-4o", "input": "hi"}, "model"),
        ):
            socket.send(json.dumps(body))
            event = json.loads(socket.recv(timeout=60))
            spec.WebSocketErrorEvent.model_validate(event)
            assert event["error"]["param"] == param, event
        assert turn(socket, model="moot/single", input="hi")[-1]["type"] == "response.completed"


def test_websocket_mode_refuses_a_malformed_tool_history_by_its_field_and_stays_open(make_server: MakeServer) -> None:
    """A ``response.create`` whose function_call item has an object as its call_id (or whose output
    answers with a list as one) closed the socket with 1011 (an unhashable set member); it is an error
    event naming the field, as over HTTP, and the connection serves the next turn."""
    from websockets.sync.client import connect

    server, fake = make_server()
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"}
    asked = {"type": "message", "role": "user", "content": QUESTION}
    with connect(ws_url(server)) as socket:
        for items, param in (
            ([{**call, "call_id": {}}, asked], "input[0].call_id"),
            ([call, {"type": "function_call_output", "call_id": [], "output": "r"}, asked], "input[1].call_id"),
        ):
            events = turn(socket, model="moot/single", input=items)
            assert [e["type"] for e in events] == ["error"], events
            spec.WebSocketErrorEvent.model_validate(events[0])
            error = events[0]["error"]
            assert events[0]["status"] == 400 and error["param"] == param, events[0]
            assert error["message"].startswith(f"{param}: give ") and "\n" not in error["message"], error
        assert fake.requests == []
        assert turn(socket, model="moot/single", input="hi")[-1]["type"] == "response.completed"


def test_websocket_messages_are_read_as_http_bodies_are(make_server: MakeServer) -> None:
    """A message is checked as a POST body is, before any model reads it: a lone surrogate (which
    failed the store's write and the debate, or closed the socket with 1011), JSON nested past the
    parser's limit (1011), a number out of range, bytes that are not UTF-8, each refused by its
    field in an error event; a binary frame holding a request is read as text; the socket stays open."""
    from websockets.sync.client import connect

    server, fake = make_server()
    create = '{"type":"response.create","model":"moot/single",'
    with connect(ws_url(server)) as socket:
        for message, param, needle in (
            (create + '"input":"hi","instructions":"be brief \\ud800"}', "instructions", "lone surrogate"),
            (create + '"input":"\\udfff"}', "input", "lone surrogate"),
            (create + '"input":"hi","metadata":{"k":"\\ud800"}}', "metadata.k", "lone surrogate"),
            (create + '"input":' + "[" * 100_000 + "]" * 100_000 + "}", None, "nests deeper"),
            (create + '"input":"hi","max_output_tokens":' + "9" * 5000 + "}", "max_output_tokens", "out of range"),
            (b'{"type":"response.create","input":"\xff"}', None, "not valid UTF-8"),
            ("", None, "the message is empty"),
        ):
            socket.send(message)
            event = json.loads(socket.recv(timeout=60))
            spec.WebSocketErrorEvent.model_validate(event)
            error = event["error"]
            assert event["status"] == 400 and error["param"] == param and needle in error["message"], (needle, event)
        assert fake.requests == []
        socket.send(json.dumps({"type": "response.create", "model": "moot/single", "input": "hi"}).encode())
        events = [json.loads(socket.recv(timeout=60))]
        while events[-1]["type"] not in ("response.completed", "response.failed", "error"):
            events.append(json.loads(socket.recv(timeout=60)))
        assert events[-1]["type"] == "response.completed"
    debates = httpx.get(server.url + "/v1/debates").json()["debates"]
    assert [d["status"] for d in debates] == ["complete"]


def test_a_websocket_turn_while_the_store_is_out_of_reach_is_a_503_event(
    make_server: MakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As over HTTP, a 503 (it closed the socket with 1011); the socket stays open for the next message."""
    from websockets.sync.client import connect

    from moot.server.state import StoreUnavailable
    from moot.server.state.sql import SqlStore

    server, _ = make_server()
    create = {"type": "response.create", "model": "moot/single", "input": "hi", "store": False}
    with connect(ws_url(server)) as socket:
        with monkeypatch.context() as patched:

            def unreachable(self: SqlStore, *args: Any, **kwargs: Any) -> None:
                raise StoreUnavailable("moot store: PostgreSQL cannot be reached")

            patched.setattr(SqlStore, "create", unreachable)
            socket.send(json.dumps(create))
            event = json.loads(socket.recv(timeout=60))
            assert event["status"] == 503 and event["error"]["code"] == "store_unavailable", event
        assert turn(socket, **{k: v for k, v in create.items() if k != "type"})[-1]["type"] == "response.completed"


def test_a_websocket_message_over_the_body_limit_is_an_error_event(make_server: MakeServer) -> None:
    """Over ``--max-body``, a message is a 413 event and the socket stays open (the protocol closed it
    with 1009 before the route could say so); over four times the limit the protocol closes it."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    server, _ = make_server(max_body_bytes=4096)
    with connect(ws_url(server)) as socket:
        socket.send(json.dumps({"type": "response.create", "model": "moot/single", "input": "x" * 5000}))
        event = json.loads(socket.recv(timeout=60))
        assert event["status"] == 413 and event["error"]["code"] == "too_large", event
        assert turn(socket, model="moot/single", input="hi")[-1]["type"] == "response.completed"
        socket.send("x" * (4 * 4096 + 1))
        with pytest.raises(ConnectionClosed) as closed:
            socket.recv(timeout=60)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


def test_websocket_mode_needs_the_key_and_refuses_other_origins(make_server: MakeServer) -> None:
    import logging

    from pydantic import SecretStr
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    server, _ = make_server(api_key=SecretStr("sk-moot-test-key-1234"))
    written: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = written.append  # type: ignore[method-assign]
    logging.getLogger("uvicorn.error").addHandler(handler)  # (after the logger's own filters, as a file's)
    try:
        with pytest.raises(InvalidStatus) as refused:
            connect(ws_url(server))
        time.sleep(0.2)  # (uvicorn writes its line as the refused connection's task ends)
    finally:
        logging.getLogger("uvicorn.error").removeHandler(handler)
    assert refused.value.response.status_code == 401
    # A refusal is no error of the server's: uvicorn's ERROR that the handshake was never completed
    # (any client could fill the log with it, an outside attack) is not written.
    assert not [r for r in written if "without completing handshake" in r.getMessage()]
    keyed = {"Authorization": "Bearer sk-moot-test-key-1234"}
    with connect(ws_url(server), additional_headers=keyed) as socket:
        assert turn(socket, model="moot/single", input="hi")[-1]["type"] == "response.completed"
    with pytest.raises(InvalidStatus) as elsewhere:
        connect(ws_url(server), additional_headers=keyed, origin="https://evil.example")  # type: ignore[arg-type]
    assert elsewhere.value.response.status_code == 403


def test_websocket_mode_answers_to_this_servers_host_names_only(tmp_path: Any) -> None:
    from starlette.testclient import TestClient, WebSocketDenialResponse

    from moot.server import ServerSettings, create_app

    app = create_app(ServerSettings(db=tmp_path / "m.sqlite", models=["openai:fake"]))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        with (
            pytest.raises(WebSocketDenialResponse) as refused,
            client.websocket_connect("/v1/responses", headers={"host": "rebound.example"}),
        ):
            pass
        assert refused.value.status_code == 400 and "rebound.example" in refused.value.text


def test_a_websocket_connection_ends_at_its_time_limit(
    make_server: MakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from websockets.exceptions import ConnectionClosedOK
    from websockets.sync.client import connect

    from moot.server.openai import responses_modes

    # (At its limit whether a message comes or not: checked at each message only, a socket that sent
    # none stayed open for good, a review found.)
    monkeypatch.setattr(responses_modes, "CONNECTION_LIMIT_S", 0.2)
    server, fake = make_server()
    with connect(ws_url(server)) as socket:
        event = json.loads(socket.recv(timeout=60))  # nothing sent
        spec.WebSocketErrorEvent.model_validate(event)
        assert event["error"]["code"] == "websocket_connection_limit_reached"
        with pytest.raises(ConnectionClosedOK):
            socket.recv(timeout=60)
    assert fake.requests == []


# ------------------------------------------------------------------------------------ file input


def tiny_pdf(text: str | None, pages: int = 1, xref: bool = True) -> bytes:
    """A PDF written by hand (objects, cross-reference table, trailer) whose pages each show ``text``
    in Helvetica; None: pages with no text at all, as a scanned page's images are to a text
    extractor. ``xref=False``: no cross-reference table nor ``startxref``, only the trailer (as the
    Open Responses compliance suite's own fixture is written)."""
    stream = f"BT /F1 12 Tf 20 100 Td ({text}) Tj ET".encode() if text is not None else b""
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [%s] /Count %d >>" % (b" ".join(b"%d 0 R" % (5 + n) for n in range(pages)), pages),
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    objects += [b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 200 200] /Contents 3 0 R /Resources << /Font "
                b"<< /F1 4 0 R >> >> >>"] * pages  # fmt: skip
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for n, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % n + body + b"\nendobj\n"
    if not xref:
        return bytes(out + b"trailer\n<< /Root 1 0 R >>\n%%EOF")
    start = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, start)
    return bytes(out)


def data_url(kind: str, data: bytes) -> str:
    return f"data:{kind};base64,{base64.b64encode(data).decode()}"


def file_input(file: dict[str, Any], question: str = "What is the launch code in this file?") -> dict[str, Any]:
    """A request as the compliance suite's file-input test sends it: a file part and a question."""
    content = [{"type": "input_file", **file}, {"type": "input_text", "text": question}]
    return {"model": "moot/single", "input": [{"type": "message", "role": "user", "content": content}]}


def test_a_pdf_sent_inline_is_read_into_a_passage_named_by_its_file(make_server: MakeServer) -> None:
    server, fake = make_server()
    pdf = {"filename": "codes.pdf", "file_data": data_url("application/pdf", tiny_pdf("The launch code is 7731"))}
    reply = post(server, file_input(pdf))
    assert reply.status_code == 200, reply.text
    resource = valid_response(reply.json())
    assert resource.status == "completed" and resource.output
    prompt = json.dumps(fake.requests[-1]["messages"])
    assert "[1] The launch code is 7731 (source: codes.pdf)" in prompt
    assert "What is the launch code in this file?" in prompt
    # A PDF with no cross-reference table (the suite's fixture is one) is read all the same.
    bare_trailer = {
        "filename": "fixture.pdf",
        "file_data": data_url("application/pdf", tiny_pdf("Title: X", xref=False)),
    }
    assert post(server, file_input(bare_trailer)).status_code == 200
    assert "Title: X (source: fixture.pdf)" in json.dumps(fake.requests[-1]["messages"])
    # Bare base64 whose filename says it is a PDF reads the same.
    bare = {"filename": "codes.pdf", "file_data": base64.b64encode(tiny_pdf("Bare code 4410")).decode()}
    assert post(server, file_input(bare)).status_code == 200
    assert "Bare code 4410 (source: codes.pdf)" in json.dumps(fake.requests[-1]["messages"])


def test_a_text_file_sent_inline_is_read_as_utf8_on_both_doors(make_server: MakeServer) -> None:
    server, fake = make_server()
    notes = {"filename": "notes.md", "file_data": data_url("text/markdown", "# Notes\nThe café opens at 9.".encode())}
    reply = post(server, file_input(notes, "When does the café open?"))
    assert reply.status_code == 200, reply.text
    valid_response(reply.json())
    assert "The caf\\u00e9 opens at 9. (source: notes.md)" in json.dumps(fake.requests[-1]["messages"])
    # Chat completions' file part reads the same way; a file named as a role keeps its own name.
    part = {"type": "file", "file": {"filename": "user", "file_data": data_url("text/csv", b"city,opens\nOslo,10\n")}}
    body = {
        "model": "moot/single",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "When?"}, part]}],
    }
    chat = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert chat.status_code == 200, chat.text
    assert "Oslo,10 (source: file user)" in json.dumps(fake.requests[-1]["messages"])


@pytest.mark.parametrize(
    ("file", "param", "needle"),
    [
        ({"filename": "a.pdf", "file_data": "data:application/pdf;base64,%%%not base64"}, ".file_data", "base64"),
        ({"filename": "a.txt", "file_data": data_url("text/plain", b"\xff\xfe\xfa")}, "", "not UTF-8"),
        ({"filename": "a.png", "file_data": data_url("image/png", b"\x89PNG")}, "", "image/png"),
        ({"filename": "scan.pdf", "file_data": data_url("application/pdf", tiny_pdf(None))}, "", "no extractable"),
        ({"filename": "a.pdf", "file_data": data_url("application/pdf", b"not a pdf")}, "", "not a readable PDF"),
        ({"file_url": "http://169.254.169.254/latest/meta-data/"}, ".file_url", "fetches nothing"),
        ({"file_id": "file-abc"}, ".file_id", "no Files API"),
        ({"filename": "a.pdf"}, ".file_data", "required"),
    ],
    ids=["bad base64", "not utf-8", "an image", "a scanned pdf", "not a pdf", "a url", "an id", "no data"],
)
def test_a_file_that_cannot_be_read_is_refused_naming_the_part(
    make_server: MakeServer, file: dict[str, Any], param: str, needle: str
) -> None:
    server, fake = make_server()
    refused = post(server, file_input(file))
    assert refused.status_code == 400, refused.text
    error = spec.ErrorPayload.model_validate(refused.json()["error"])
    assert error.param == "input[0].content[0]" + param and needle in error.message, error
    assert not fake.requests  # refused before any debate: nothing fetched, nothing asked


def test_a_pdf_past_the_page_bound_is_refused_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """A PDF's reading is bounded (pages, characters, seconds): past a bound it is refused, not
    read for as long as its maker likes (here the page bound, lowered to 1)."""
    from moot.server.openai import input_files

    two = tiny_pdf("page one", pages=2)
    part = {"filename": "a.pdf", "file_data": data_url("application/pdf", two)}
    assert input_files.file_passage(part, "p").text == "page one\n\npage one"
    monkeypatch.setattr(input_files, "MAX_PDF_PAGES", 1)
    with pytest.raises(input_files.FileProblem, match="the PDF has 2 pages, over the 1 read"):
        input_files.file_passage(part, "p")
    monkeypatch.setattr(input_files, "MAX_PDF_PAGES", 10)
    monkeypatch.setattr(input_files, "MAX_FILE_CHARS", 10)
    with pytest.raises(input_files.FileProblem, match="too long to read"):
        input_files.file_passage(part, "p")
    monkeypatch.setattr(input_files, "MAX_FILE_CHARS", 1_000)

    # A request's files share one time bound (110 PDFs each just under its own held a worker for
    # minutes): with none left, the next file is refused, naming it, and read no further.
    def three_files() -> list[str]:
        return [input_files.file_passage(part, f"input[{i}]").text for i in range(3)]

    assert input_files.within_file_budget(three_files) == ["page one\n\npage one"] * 3
    with pytest.raises(input_files.FileProblem, match=r"input\[0\]: the request's files took over"):
        input_files.within_file_budget(three_files, seconds=-1)


def test_pdfs_hold_at_most_two_of_the_threads_that_read_requests(make_server: MakeServer) -> None:
    """An attack: four requests of crafted PDFs (six pages on one 2 MB content stream, each request at
    its 10 s bound) held all four threads that read requests, and a "hi" waited 10 s behind them.
    PDFs are read by two requests at once at most: a third is answered 429 before it reads anything
    (the SDKs retry it), and a request without a PDF still has a thread."""
    from moot.server.openai import input_files

    server, fake = make_server()
    pdf = {"filename": "codes.pdf", "file_data": data_url("application/pdf", tiny_pdf("The launch code is 7731"))}
    held = [input_files._PDF_READERS.acquire(blocking=False) for _ in range(input_files.MAX_PDF_READERS)]
    assert all(held)  # two requests reading PDFs, as far as the server can tell
    try:
        busy = post(server, file_input(pdf))
        assert busy.status_code == 429 and busy.headers["retry-after"] == "1", busy.text
        error = busy.json()["error"]
        assert error["code"] == "files_busy" and error["type"] == "rate_limit_error", error
        assert error["param"] == "input[0].content[0]" and "\n" not in error["message"]
        assert post(server, {"model": "moot/single", "input": "hi"}).status_code == 200
    finally:
        for _ in held:
            input_files._PDF_READERS.release()
    assert post(server, file_input(pdf)).status_code == 200
    assert post(server, file_input(pdf)).status_code == 200  # each request gave its reader back
    assert input_files._PDF_READERS.acquire(blocking=False) and input_files._PDF_READERS.acquire(blocking=False)
    input_files._PDF_READERS.release()
    input_files._PDF_READERS.release()
    assert len(fake.requests) == 3


def test_the_questions_file_stays_with_it_and_one_too_long_is_refused(make_server: MakeServer) -> None:
    """The file the question sends is read whole or refused: a tight budget leaves earlier messages
    out (as a long conversation's oldest), never the file the question asks about."""
    server, fake = make_server()
    history = [{"role": "user", "content": f"old message {i} " * 40} for i in range(80)]
    facts = "The warmest day was day 29. " * 20
    notes = {"filename": "notes.txt", "file_data": data_url("text/plain", facts.encode())}
    body = file_input(notes, "Which day was warmest?")
    tight = {"moot": {"budget": {"max_total_tokens": 6000}}}
    reply = post(server, {**body, "input": [*history, *body["input"]], **tight})
    assert reply.status_code == 200, reply.text
    sent = json.dumps(fake.requests[-1]["messages"])
    assert "left out to fit the prompt budget" in sent and "day 29. (source: notes.txt)" in sent
    assert "old message 0 " not in sent
    huge = {"filename": "notes.txt", "file_data": data_url("text/plain", (facts * 100).encode())}
    refused = post(server, {**file_input(huge, "Which day was warmest?"), **tight})
    error = refused.json()["error"]
    assert refused.status_code == 400 and error["param"] == "input" and "shorten the context" in error["message"]
