"""The OpenAI door reads typed values on its live paths (issue 43, part 3.1): the streams read the
events of a debate this process runs as the values they were encoded from, and the WebSocket reads
the final response of the events it sent as they are, never decoding JSON this process encoded."""

# ruff: noqa: F811  (make_server is test_serve_api's fixture, imported)

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from moot.server.openai import debate_feed, responses_modes, responses_replay, responses_state
from moot.testing.fake_openai import schema_reply
from test_open_responses import turn, ws_url
from test_serve_api import MakeServer, make_server  # noqa: F401  (the fixture)
from test_serve_openai import raw_events, result_of

QUESTION = "Is 7 prime?"


class _NoDecoding:
    """Stands for the ``json`` module where a live stream must decode nothing this process encoded."""

    dumps = staticmethod(json.dumps)

    @staticmethod
    def loads(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a live stream decoded JSON this process had just encoded")


def test_the_live_streams_decode_none_of_their_own_events(
    make_server: MakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(debate_feed, "json", _NoDecoding)
    monkeypatch.setattr(responses_state, "json", _NoDecoding)
    monkeypatch.setattr(responses_replay, "json", _NoDecoding)
    server, _ = make_server(reply=schema_reply)
    # chat completions, streamed with the trace: every turn and the synthesis' own tokens
    body = {"model": "moot/affirmative-critical:trace", "messages": [{"role": "user", "content": QUESTION}]}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=60) as sent:
        lines = [line.removeprefix("data: ") for line in sent.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]", lines
    chunks = [json.loads(line) for line in lines[:-1]]
    assert "error" not in chunks[-1], chunks[-1]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    result = result_of(server, chunks[0]["id"].removeprefix("moot-"))
    assert "".join(d.get("content") or "" for d in deltas) == result.final_answer
    assert all(f"**{t.name}** · round {t.round}" in "".join(d.get("reasoning_content") or "" for d in deltas)
               for r in result.rounds for t in r.turns)  # fmt: skip
    # responses, streamed with the trace, stored
    _, events = raw_events(
        server, {"model": "moot/affirmative-critical", "input": QUESTION, "reasoning": {"summary": "auto"}}
    )
    assert events[-1]["type"] == "response.completed"
    assert [i["type"] for i in events[-1]["response"]["output"]] == ["reasoning"] * 4 + ["message"]
    # a background response, streamed from its debate's events (the stored response's replay)
    _, replayed = raw_events(
        server,
        {"model": "moot/affirmative-critical", "input": QUESTION, "reasoning": {"summary": "auto"}, "background": True},
    )
    assert replayed[-1]["type"] == "response.completed"
    assert [i["type"] for i in replayed[-1]["response"]["output"]] == ["reasoning"] * 4 + ["message"]


def test_the_websocket_decodes_only_what_the_client_sends(
    make_server: MakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last response of a turn is read from the event sent, as it is (before, every event sent was
    decoded again to find it)."""
    from websockets.sync.client import connect

    decoded: list[str] = []
    read = responses_modes.read_json

    def counting(body: bytes, content_type: str | None) -> Any:
        decoded.append(body.decode())
        return read(body, content_type)

    monkeypatch.setattr(responses_modes, "read_json", counting)
    server, _ = make_server()
    with connect(ws_url(server)) as socket:
        first = turn(socket, model="moot/single", input="My name is Alice.", store=False)
        assert first[-1]["type"] == "response.completed" and len(first) > 3
        second = turn(socket, model="moot/single", previous_response_id=first[-1]["response"]["id"], input="Name?")
        assert second[-1]["type"] == "response.completed"
    assert len(decoded) == 2 and all('"response.create"' in text for text in decoded)


def test_a_decided_tool_call_is_one_typed_value_for_both_apis() -> None:
    """The debate's decision record is read once into a :class:`ToolCall` (the reply's), and both
    APIs' forms are written from that value: the same arguments, byte for byte."""
    from moot.core.tools import Tool, ToolCall
    from moot.core.types import DebateResult, DebateTask
    from moot.server.openai.asked import Asked
    from moot.server.openai.chat import tool_calls_of
    from moot.server.openai.response_objects import function_call_item

    action = {"type": "tool_call", "name": "weather", "arguments": {"city": "Zürich"}}
    result = DebateResult(
        protocol="vote", task=DebateTask(question="q"), final_answer="x", decision={"kind": "rule", "action": action}
    )
    reply = Asked(tools=[Tool(name="weather")]).reply(result)
    assert (reply.text, reply.finish) == ("", "tool_calls")
    assert reply.call == ToolCall(name="weather", arguments={"city": "Zürich"})
    chat = tool_calls_of("d1", reply.call, index=True)
    item = function_call_item("d1", reply.call)
    assert chat is not None and item is not None
    assert chat[0].function.arguments == item.arguments == '{"city": "Zürich"}'
    assert (chat[0].id, item.call_id, item.name) == ("call_d1", "call_d1", "weather")
    # without tools asked for, a decision record is no call
    assert Asked().reply(result).call is None and tool_calls_of("d1", None) is None


@pytest.mark.parametrize("stream", [False, True])
def test_what_a_request_asks_is_worked_out_once(
    make_server: MakeServer, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    """A request is read into what it asks once; what the protocol it runs means for the reply once
    (when its spec is made); and the reply once, though a stored response's stream (or its answer)
    and its kept final form both write it. (Before, the reply's rules were worked out again for the
    stream, for the reply and for the final form, and the reply again for the final form.)"""
    from moot.server.openai.asked import Asked
    from moot.server.openai.responses_request import responses_asked

    counts = {"read": 0, "bind": 0, "reply": 0}

    def counted(name: str, function: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return function(*args, **kwargs)

        return wrapper

    from moot.server.openai import responses

    monkeypatch.setattr(responses, "responses_asked", counted("read", responses_asked))
    monkeypatch.setattr(Asked, "bind", counted("bind", Asked.bind))
    monkeypatch.setattr(Asked, "_reply", counted("reply", Asked._reply))
    server, _ = make_server(reply=schema_reply)
    body = {"model": "moot/affirmative-critical", "input": QUESTION, "max_output_tokens": 200}
    if stream:
        _, events = raw_events(server, body)
        response_id = events[-1]["response"]["id"]
    else:
        answered = httpx.post(server.url + "/v1/responses", json=body, timeout=60)
        assert answered.status_code == 200, answered.text
        response_id = answered.json()["id"]
    kept = httpx.get(f"{server.url}/v1/responses/{response_id}", timeout=60).json()
    assert kept["status"] == "completed"
    assert counts == {"read": 1, "bind": 1, "reply": 1}


def test_a_chat_request_is_read_into_one_object() -> None:
    """The model, the messages and the fields of a chat completion request are read into one
    :class:`Asked`, which its debate is prepared from: nothing reads the request again."""
    from moot.server.openai import chat
    from moot.server.openai.chat_wire import ChatCompletionRequest
    from moot.server.settings import ServerSettings

    req = ChatCompletionRequest.model_validate(
        {
            "model": "moot/vote:trace",
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION}],
            "max_tokens": 64,
            "moot": {"rounds": 1},
        }
    )
    asked = chat.read(req, ServerSettings(models=["openai:fake"]))
    assert (asked.protocol, asked.question, asked.trace, asked.max_tokens) == ("vote", QUESTION, True, 64)
    # Read whole, once: the system message is the caller's instructions, not a passage of the context.
    assert (asked.context, asked.instructions) == ([], "Be brief.")
    assert asked.options == req.moot


async def test_only_the_decisions_own_call_cut_by_the_callers_bound_is_a_reply() -> None:
    """A judge's list of candidates cut by the caller's max_tokens was returned as the typed reply, with
    finish_reason length (a review's, session 37): it is the debate's failure."""
    from moot.core.engine import Engine
    from moot.core.types import DebateTask
    from moot.models.base import ChatRequest, ChatResponse
    from moot.models.scripted import ScriptedModel
    from moot.protocols import get_preset
    from moot.server.openai import chat
    from moot.server.openai.chat_wire import ChatCompletionRequest
    from moot.server.settings import ServerSettings

    class CutsCandidates(ScriptedModel):
        async def _complete_once(self, request: ChatRequest, on_token: Any) -> ChatResponse:
            reply = await super()._complete_once(request, on_token)
            if request.schema_name == "Candidates":
                return ChatResponse(text='{"candidates": ["Yes, 7 is', usage=reply.usage, finish_reason="length")
            return reply

    def agents(request: ChatRequest) -> Any:
        if request.schema_name == "Candidates":
            return {"candidates": ["Yes"]}
        if request.schema_name and "Moderation" in request.schema_name:
            return {"preference": True, "supported_side": "affirmative", "reason": "r", "debate_answer": "Yes"}
        return {"answer": "Yes", "sure": True} if request.response_schema is not None else "Yes, 7 is prime."

    schema = {"type": "object", "properties": {"answer": {"type": "string"}, "sure": {"type": "boolean"}},
              "required": ["answer", "sure"]}  # fmt: skip
    body = {"model": "moot/mad", "messages": [{"role": "user", "content": "Is 7 prime?"}], "max_tokens": 200,
            "response_format": {"type": "json_schema", "json_schema": {"name": "A", "schema": schema}}}  # fmt: skip
    asked = chat.read(ChatCompletionRequest.model_validate(body), ServerSettings(models=["scripted:x"])).compile()
    spec = asked.adjust(get_preset("mad"))
    engine = Engine(spec, CutsCandidates(fn=agents), schemas=asked.schemas)
    result = await engine.run(DebateTask(question="Is 7 prime?"))
    assert result.status == "failed" and (result.error or "").startswith("the judge could not list the candidate")
    assert asked.cut_at_bound(result) is None
