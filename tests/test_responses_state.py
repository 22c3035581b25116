"""Stateful Responses (issue 41, item 2): ``store``, ``previous_response_id`` and ``background`` on the
debate store, through the openai SDK against ``moot serve`` on the loopback fake model: retrieve,
delete, input items, a chain, background with polling and cancel, and a stream resumed after a
restart of the server with the same sequence numbers."""

# ruff: noqa: F811  (make_server is a fixture of test_serve_api, imported)

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from moot.server import ServerSettings
from moot.testing.fake_openai import FakeOpenAIServer
from serving import FAKE_KEY, ServerThread, wait_for
from test_serve_api import MakeServer, make_server  # noqa: F401  (the fixture)

EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


def client_of(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def texts_sent(fake: FakeOpenAIServer) -> list[str]:
    """Every message text the fake model was sent, request by request."""
    return ["\n".join(str(m.get("content")) for m in r.get("messages", [])) for r in fake.requests]


def poll(client: openai.OpenAI, response_id: str, until: set[str]) -> Response:
    deadline = time.monotonic() + 60
    while True:
        response = client.responses.retrieve(response_id)
        if response.status in until or time.monotonic() > deadline:
            return response
        time.sleep(0.05)


def stream_events(url: str, path: str, method: str = "GET", body: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    from httpx_sse import connect_sse

    with (
        httpx.Client(timeout=httpx.Timeout(60.0)) as client,
        connect_sse(client, method, url + path, json=body) as source,
    ):
        assert source.response.status_code == 200, source.response.read()
        events = [json.loads(s.data) for s in source.iter_sse() if s.data]
    for event in events:
        EVENTS.validate_python(event, strict=False)  # each one the SDK's own event type
    return events


def test_a_stored_response_is_retrieved_listed_and_deleted(make_server: MakeServer) -> None:
    server, _ = make_server()
    client = client_of(server.url)
    made = client.responses.create(model="moot/single", input="Is 7 prime?", store=True, metadata={"k": "v"})
    assert made.to_dict()["store"] is True and made.status == "completed" and made.id.startswith("resp_")
    got = client.responses.retrieve(made.id)
    assert got.model_dump() == made.model_dump()  # as it was returned
    # the default (store left out) is stored too, as in OpenAI's API
    default = client.responses.create(model="moot/single", input="Is 9 prime?")
    assert (
        default.to_dict()["store"] is True and client.responses.retrieve(default.id).output_text == default.output_text
    )
    items = client.responses.input_items.list(made.id)
    assert [(i.type, i.role) for i in items.data] == [("message", "user")]  # type: ignore[union-attr]
    assert items.data[0].content[0].text == "Is 7 prime?"  # type: ignore[union-attr, index]
    client.responses.delete(made.id)
    for call in (lambda: client.responses.retrieve(made.id), lambda: client.responses.delete(made.id)):
        with pytest.raises(openai.NotFoundError) as caught:
            call()
        assert caught.value.body["param"] == "response_id"  # type: ignore[index]
    # the debate went with it
    assert httpx.get(f"{server.url}/v1/debates/{made.id.removeprefix('resp_')}").status_code == 404
    raw = httpx.delete(f"{server.url}/v1/responses/{default.id}")
    assert raw.json() == {"id": default.id, "object": "response", "deleted": True}


def test_a_response_stored_false_is_neither_retrieved_nor_continued(make_server: MakeServer) -> None:
    server, _ = make_server()
    client = client_of(server.url)
    made = client.responses.create(model="moot/single", input="Is 7 prime?", store=False)
    assert made.to_dict()["store"] is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(made.id)
    for previous in (made.id, "resp_nosuch", "nonsense"):
        with pytest.raises(openai.BadRequestError) as caught:
            client.responses.create(model="moot/single", input="And 9?", previous_response_id=previous)
        error = caught.value.body
        assert isinstance(error, dict)
        assert error["code"] == "previous_response_not_found" and error["param"] == "previous_response_id"
        assert error["type"] == "invalid_request_error" and previous in error["message"]


def test_a_chain_of_three_is_one_conversation(make_server: MakeServer) -> None:
    server, fake = make_server()
    client = client_of(server.url)
    first = client.responses.create(model="moot/single", input="Remember the word PELICAN.", instructions="Be brief.")
    second = client.responses.create(model="moot/single", input="And the word OTTER.", previous_response_id=first.id)
    sent = len(fake.requests)
    third = client.responses.create(
        model="moot/single",
        input=[{"role": "user", "content": "Which words did I give?"}],
        previous_response_id=second.id,
    )
    assert third.previous_response_id == second.id and third.status == "completed"
    seen = "\n".join(texts_sent(fake)[sent:])
    # the third debate read the first's question and both replies; not the first's instructions
    assert "PELICAN" in seen and "OTTER" in seen and "Which words did I give?" in seen
    assert first.output_text in seen and second.output_text in seen
    assert "Be brief." not in seen
    items = client.responses.input_items.list(third.id, order="asc")
    kinds = [(i.type, getattr(i, "role", None)) for i in items.data]
    assert kinds == [("message", "user"), ("message", "assistant")] * 2 + [("message", "user")]
    # paging, as the API pages: after an id, a limit, newest first by default
    newest = client.responses.input_items.list(third.id, limit=2)
    assert [i.id for i in newest.data] == [i.id for i in reversed(items.data)][:2] and newest.has_more
    rest = client.responses.input_items.list(third.id, limit=10, after=newest.data[-1].id)
    assert [i.id for i in rest.data] == [i.id for i in reversed(items.data)][2:] and not rest.has_more


def test_a_chain_keeps_at_most_its_conversation_limit(make_server: MakeServer) -> None:
    """Each stored response kept its whole conversation: a chain of 480 KB inputs grew the stored
    request by as much again at every step (7.7 MB by the eighth), without end. Past
    --max-conversation-bytes the chain's oldest items are left out (truncation: auto), or the
    continuation is refused (disabled), naming the option."""
    server, _ = make_server(max_conversation_bytes=10_000)
    client = client_of(server.url)
    previous = None
    for word in ("ALPHA", "BRAVO", "CHARLIE", "DELTA"):
        made = client.responses.create(
            model="moot/single",
            input=f"{word} " + "x" * 3_000,
            previous_response_id=previous,  # type: ignore[arg-type]
        )
        assert made.status == "completed", made
        previous = made.id
    kept = client.responses.input_items.list(previous, order="asc", limit=100).data
    said = " ".join(i.content[0].text for i in kept if getattr(i, "role", None) == "user")  # type: ignore[union-attr, index]
    assert "DELTA" in said and "ALPHA" not in said  # the oldest left out
    assert len(json.dumps([i.model_dump() for i in kept])) < 14_000
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(
            model="moot/single", input="ECHO " + "x" * 3_000, previous_response_id=previous, truncation="disabled"
        )
    error = refused.value.body
    assert isinstance(error, dict) and error["param"] == "previous_response_id"
    assert (
        "over this server's limit of 10,000 for one conversation (moot serve --max-conversation-bytes)"
        in (error["message"])
    )


def test_background_polls_and_cancels(make_server: MakeServer) -> None:
    server, _ = make_server(latency=0.05)
    client = client_of(server.url)
    made = client.responses.create(model="moot/affirmative-critical", input="Is 7 prime?", background=True)
    assert made.status == "queued" and made.background is True and made.output == []
    done = poll(client, made.id, {"completed", "failed"})
    assert done.status == "completed" and done.output_text
    # cancelling a response that ended returns it as it is
    assert client.responses.cancel(made.id).status == "completed"
    slow, _ = make_server(latency=5.0)
    slow_client = client_of(slow.url)
    running = slow_client.responses.create(model="moot/single", input="Is 7 prime?", background=True)
    with pytest.raises(openai.BadRequestError) as early:  # a running response cannot be continued yet
        slow_client.responses.create(model="moot/single", input="And 9?", previous_response_id=running.id)
    assert early.value.body["param"] == "previous_response_id" and "wait" in str(early.value)  # type: ignore[index]
    cancelled = slow_client.responses.cancel(running.id)
    assert cancelled.status == "cancelled" and slow_client.responses.retrieve(running.id).status == "cancelled"
    assert slow_client.responses.cancel(running.id).status == "cancelled"  # again: the same
    ended = stream_events(slow.url, f"/v1/responses/{running.id}?stream=true")
    assert [e["type"] for e in ended][-1] == "response.failed" and ended[-1]["response"]["status"] == "cancelled"
    # only a background response may be cancelled; background needs the response stored
    foreground = client.responses.create(model="moot/single", input="Is 7 prime?")
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.cancel(foreground.id)
    assert "Cannot cancel a synchronous response" in str(caught.value)
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_nosuch")
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="moot/single", input="Q?", background=True, store=False)
    assert refused.value.body["param"] == "background"  # type: ignore[index]


def test_a_background_stream_resumes_after_a_restart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    db = tmp_path / "moot.sqlite"
    with FakeOpenAIServer(latency=0.01) as fake:
        settings = ServerSettings(db=db, models=["openai:fake"], base_url=fake.base_url, keepalive_s=0.2)
        body = {"model": "moot/affirmative-critical:trace", "input": "Is 7 prime?", "background": True, "stream": True}
        with ServerThread(settings) as server:
            events = stream_events(server.url, "/v1/responses", "POST", body)
            response_id = events[0]["response"]["id"]
            again = stream_events(server.url, f"/v1/responses/{response_id}?stream=true")
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        kinds = [e["type"] for e in events]
        assert kinds[:3] == ["response.created", "response.queued", "response.in_progress"]
        assert kinds[-1] == "response.completed" and kinds.count("response.output_item.done") == 5  # 4 turns, reply
        assert again == events
        with ServerThread(settings) as restarted:
            resumed = stream_events(restarted.url, f"/v1/responses/{response_id}?stream=true&starting_after=5")
            final = client_of(restarted.url).responses.retrieve(response_id)
        assert resumed == events[6:]
        assert final.model_dump(mode="json") == Response.model_validate(events[-1]["response"]).model_dump(mode="json")


def test_misuse_is_a_4xx_naming_the_field(make_server: MakeServer) -> None:
    server, _ = make_server()
    made = client_of(server.url).responses.create(model="moot/single", input="Is 7 prime?")
    cases = [
        ("GET", f"/v1/responses/{made.id}?starting_after=3", 400, "starting_after"),
        ("GET", f"/v1/responses/{made.id}?stream=true", 400, "stream"),
        ("GET", f"/v1/responses/{made.id}/input_items?limit=0", 400, "limit"),
        ("GET", f"/v1/responses/{made.id}/input_items?order=up", 400, "order"),
        ("GET", f"/v1/responses/{made.id}/input_items?after=nosuch", 400, "after"),
        ("GET", "/v1/responses/resp_nosuch/input_items", 404, "response_id"),
        ("POST", "/v1/responses/resp_nosuch/cancel", 404, "response_id"),
    ]
    # The SDK's responses.input_tokens.count(): not a response's id (it was a 405 "not allowed").
    counted = httpx.post(server.url + "/v1/responses/input_tokens", json={"model": "moot/single", "input": "hi"})
    assert counted.status_code == 404 and counted.json()["error"]["code"] == "unsupported_endpoint", counted.text
    assert "usage.input_tokens" in counted.json()["error"]["message"]
    for method, path, status, param in cases:
        response = httpx.request(method, server.url + path)
        assert response.status_code == status, (path, response.text)
        error = response.json()["error"]
        assert error["param"] == param and "\n" not in error["message"], (path, error)


def test_a_running_background_response_shows_the_rounds_done_so_far(make_server: MakeServer) -> None:
    server, _ = make_server(latency=0.4)
    client = client_of(server.url)
    made = client.responses.create(model="moot/affirmative-critical:trace", input="Is 7 prime?", background=True)
    deadline = time.monotonic() + 60
    seen = client.responses.retrieve(made.id)
    while not (seen.status == "in_progress" and seen.output) and time.monotonic() < deadline:
        time.sleep(0.05)
        seen = client.responses.retrieve(made.id)
    assert seen.status == "in_progress" and [o.type for o in seen.output] == ["reasoning", "reasoning"]
    done = poll(client, made.id, {"completed", "failed"})
    assert done.status == "completed" and [o.type for o in done.output] == ["reasoning"] * 4 + ["message"]
    assert done.output[0].model_dump() == seen.output[0].model_dump()  # the same item, as it was shown


def test_refusals_do_not_deny_what_the_server_does(make_server: MakeServer) -> None:
    """Found by a client pass: refusals said the server was stateless, kept no earlier responses, and
    never cut an input (it chains, stores and leaves the oldest messages out), gave chat's shape of
    tool_choice on the Responses route, and called a running response "queued"."""
    server, _ = make_server(latency=0.4)
    client = client_of(server.url)

    def refused(**body: Any) -> dict[str, Any]:
        response = httpx.post(server.url + "/v1/responses", json={"model": "moot/single", "input": "Q?", **body})
        assert response.status_code == 400, response.text
        error: dict[str, Any] = response.json()["error"]
        return error

    said = refused(conversation="conv_1")["message"]
    assert "previous_response_id" in said and "stateless" not in said
    orphan = {"type": "function_call_output", "call_id": "call_9", "output": "21 C"}
    said = refused(input=[orphan])["message"]
    assert "previous_response_id" in said and "keeps no earlier" not in said
    said = refused(tool_choice={"type": "function"}, tools=[{"type": "function", "name": "f"}])["message"]
    assert "{'type': 'function', 'name': ...}" in said and "'function': {" not in said
    assert "give auto" in refused(truncation="middle")["message"]
    running = client.responses.create(model="moot/affirmative-critical", input="Is 7 prime?", background=True)
    poll(client, running.id, {"in_progress"})
    said = refused(previous_response_id=running.id)["message"]
    assert f"{running.id} is still in_progress" in said, said
    poll(client, running.id, {"completed", "failed"})


def test_a_failed_background_debate_is_a_failed_response(make_server: MakeServer) -> None:
    from moot.testing.fake_openai import Fault

    server, fake = make_server()
    fake.faults.extend([Fault.http(400, "the model refuses")] * 20)  # not retried: the debate fails
    client = client_of(server.url)
    made = client.responses.create(model="moot/single", input="Is 7 prime?", background=True)
    failed = poll(client, made.id, {"completed", "failed"})
    assert failed.status == "failed" and failed.error is not None and "ended failed" in failed.error.message
    events = stream_events(server.url, f"/v1/responses/{made.id}?stream=true")
    assert events[-1]["type"] == "response.failed"
    assert Response.model_validate(events[-1]["response"]).model_dump() == failed.model_dump()


def test_a_background_response_cut_by_a_restart_replays_the_same_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server stops mid-debate: the events read before come back with the same numbers, then
    the response ends failed with the reason."""
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    db = tmp_path / "moot.sqlite"
    with FakeOpenAIServer(latency=2.0) as fake:
        settings = ServerSettings(db=db, models=["openai:fake"], base_url=fake.base_url, keepalive_s=0.2)
        with ServerThread(settings) as server:
            client = client_of(server.url)
            made = client.responses.create(
                model="moot/affirmative-critical:trace", input="Is 7 prime?", background=True
            )
            deadline = time.monotonic() + 60
            while not client.responses.retrieve(made.id).output and time.monotonic() < deadline:
                time.sleep(0.05)
            before = stream_prefix(server.url, f"/v1/responses/{made.id}?stream=true", 9)
        with ServerThread(settings) as restarted:
            after = stream_events(restarted.url, f"/v1/responses/{made.id}?stream=true")
            final = client_of(restarted.url).responses.retrieve(made.id)
    assert after[: len(before)] == before and [e["sequence_number"] for e in after] == list(range(len(after)))
    assert final.status == "failed" and final.error is not None and "interrupted" in final.error.message
    assert after[-1]["type"] == "response.failed" and after[-1]["response"]["status"] == "failed"


def stop_with_one_running_and_one_waiting(
    settings: ServerSettings, waiting_model: str = "moot/single"
) -> tuple[Any, Any]:
    """A server (one slot) stopped with one background response running and one (``waiting_model``)
    waiting for the slot."""
    with ServerThread(settings) as server:
        client = client_of(server.url)
        running = client.responses.create(model="moot/single", input="Is 7 prime?", background=True)
        poll(client, running.id, {"in_progress", "completed", "failed"})
        waiting = client.responses.create(model=waiting_model, input="Is 9 prime?", background=True)
        assert client.responses.retrieve(waiting.id).status == "queued"
    return running, waiting


def test_a_background_response_still_queued_at_a_restart_is_queued_again_and_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server stops with one background response running and one waiting for a slot: the waiting
    one runs at the next start (its caller reads it by its id, not on a connection that closed), and
    its stream is whole; the running one ends failed, interrupted."""
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    db = tmp_path / "moot.sqlite"
    with FakeOpenAIServer(latency=1.0) as fake:
        settings = ServerSettings(db=db, models=["openai:fake"], base_url=fake.base_url, keepalive_s=0.2, max_running=1)
        running, waiting = stop_with_one_running_and_one_waiting(settings)
        with ServerThread(settings) as restarted:
            client = client_of(restarted.url)
            done = poll(client, waiting.id, {"completed", "failed", "cancelled"})
            interrupted = client.responses.retrieve(running.id)
            events = stream_events(restarted.url, f"/v1/responses/{waiting.id}?stream=true")
    assert done.status == "completed" and done.output_text, done.error
    assert "Is 9 prime?" in json.dumps(fake.requests[-1]["messages"])
    assert interrupted.status == "failed" and interrupted.error is not None
    assert "interrupted" in interrupted.error.message
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events][:3] == ["response.created", "response.queued", "response.in_progress"]
    assert events[-1]["type"] == "response.completed" and events[-1]["response"]["id"] == waiting.id
    assert Response.model_validate(events[-1]["response"]).output_text == done.output_text


def test_a_queued_background_response_the_restart_cannot_build_again_names_its_own_route(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next server's --max-calls is under what the waiting response's protocol needs: it ends,
    saying why in the Responses request's own words (its ``model``, not the debates API's
    ``protocol``), and where to send it again (POST /v1/responses, not /v1/debates)."""
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    db = tmp_path / "moot.sqlite"
    with FakeOpenAIServer(latency=1.0) as fake:
        settings = ServerSettings(db=db, models=["openai:fake"], base_url=fake.base_url, keepalive_s=0.2, max_running=1)
        _, waiting = stop_with_one_running_and_one_waiting(settings, "moot/society-of-minds")
        lower = settings.model_copy(update={"limits": settings.limits.model_copy(update={"max_calls": 2})})
        with ServerThread(lower) as restarted:
            ended = poll(client_of(restarted.url), waiting.id, {"completed", "failed", "cancelled"})
    assert ended.status == "failed" and ended.error is not None
    message = ended.error.message
    assert "model: society-of-minds needs at least 3 calls" in message, message
    assert "protocol:" not in message and message.endswith("(POST /v1/responses)"), message


def test_moot_mcp_on_the_store_leaves_a_queued_background_response_for_moot_serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """moot mcp (no OpenAI door) opened on a store moot serve left with a background response still
    queued leaves it queued, rather than ending it 'by a moot that did not store such requests
    whole'; the next moot serve runs it."""
    from moot.server.state.manager import DebateManager
    from moot.server.state.sqlite import SqliteStore

    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    db = tmp_path / "moot.sqlite"
    with FakeOpenAIServer(latency=1.0) as fake:
        settings = ServerSettings(db=db, models=["openai:fake"], base_url=fake.base_url, keepalive_s=0.2, max_running=1)
        _, waiting = stop_with_one_running_and_one_waiting(settings)
        store = SqliteStore(db, [])
        try:
            DebateManager(settings, store).recover()  # what moot mcp --db does at its start
            stored = store.get(waiting.id.removeprefix("resp_"))
            assert stored is not None and stored.status == "queued", stored
        finally:
            store.close()
        with ServerThread(settings) as restarted:
            done = poll(client_of(restarted.url), waiting.id, {"completed", "failed", "cancelled"})
    assert done.status == "completed" and done.output_text, done.error


def stream_prefix(url: str, path: str, count: int) -> list[dict[str, Any]]:
    """The first ``count`` events of a stream, then the connection closed."""
    from httpx_sse import connect_sse

    out: list[dict[str, Any]] = []
    with httpx.Client(timeout=httpx.Timeout(60.0)) as client, connect_sse(client, "GET", url + path) as source:
        for sse in source.iter_sse():
            if sse.data:
                out.append(json.loads(sse.data))
            if len(out) == count:
                break
    return out


def test_a_tool_loop_chains_with_only_the_tools_result(make_server: MakeServer) -> None:
    """An agent's loop as the Agents SDK runs it with previous_response_id: the second request sends
    only the function_call_output, and the debate reads the call it answers from the chain."""
    from test_serve_tools import QUESTION as WEATHER_QUESTION
    from test_serve_tools import RESPONSES_WEATHER, agent, run_tool

    server, fake = make_server(reply=agent)
    client = client_of(server.url)
    tools: list[Any] = [RESPONSES_WEATHER]
    first = client.responses.create(model="moot/vote", input=WEATHER_QUESTION, tools=tools)
    call = next(o for o in first.output if o.type == "function_call")
    output: Any = {
        "type": "function_call_output",
        "call_id": call.call_id,
        "output": run_tool(call.name, call.arguments),
    }
    second = client.responses.create(model="moot/vote", input=[output], tools=tools, previous_response_id=first.id)
    assert second.output_text == "It is 21 C and sunny in Paris."
    read = [r for r in fake.requests if "temperature_c" in json.dumps(r["messages"])]
    assert len(read) == 5 and all(WEATHER_QUESTION in json.dumps(r["messages"]) for r in read)


def test_a_streamed_stored_response_is_retrieved_as_it_was_streamed(
    make_server: MakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream's last event and the stored response are made apart: they said different
    ``completed_at`` when a second began between them. Here every reading of the response objects'
    clock is 0.6 s after the last, so each two straddle a second."""
    import itertools
    import types

    from moot.server.openai import response_objects

    ticks = itertools.count()
    clock = types.SimpleNamespace(time=lambda: 1_800_000_000.0 + 0.6 * next(ticks))
    monkeypatch.setattr(response_objects, "time", clock)
    server, _ = make_server()
    client = client_of(server.url)
    for model in ("moot/affirmative-critical:trace", "moot/vote"):
        events = list(client.responses.create(model=model, input="Is 7 prime?", stream=True))
        streamed = events[-1].response  # type: ignore[union-attr]
        assert events[-1].type == "response.completed" and streamed.to_dict()["store"] is True
        assert client.responses.retrieve(streamed.id).model_dump() == streamed.model_dump(), model


@pytest.mark.parametrize(
    "response_id", ["resp_", "resp_%00", "resp_" + "f" * 5000, "resp_%C3%A9%F0%9F%98%80", "msg_abc", "resp_a%2Fb"]
)
def test_an_odd_response_id_is_a_404_or_400_never_a_500(make_server: MakeServer, response_id: str) -> None:
    server, fake = make_server()
    for method, path in (
        ("GET", f"/v1/responses/{response_id}"),
        ("DELETE", f"/v1/responses/{response_id}"),
        ("POST", f"/v1/responses/{response_id}/cancel"),
        ("GET", f"/v1/responses/{response_id}/input_items"),
    ):
        response = httpx.request(method, server.url + path)
        # (a NUL in the address is refused at the door, on every route: no store's text holds it)
        expected = (400,) if "%00" in response_id else (404, 405)
        assert response.status_code in expected, (method, path, response.text)
        assert "error" in response.json()
    previous = httpx.post(
        server.url + "/v1/responses",
        json={"model": "moot/single", "input": "Q?", "previous_response_id": unquote(response_id)},
    )
    error = previous.json()["error"]
    if "\x00" in unquote(response_id):  # no text at all: refused at the door, as in any field
        assert previous.status_code == 400 and error["param"] == "previous_response_id" and "NUL" in error["message"]
    else:
        assert previous.status_code == 400 and error["code"] == "previous_response_not_found"
    assert fake.requests == []


def test_a_refused_item_of_a_continued_conversation_is_named_as_the_request_wrote_it(make_server: MakeServer) -> None:
    server, fake = make_server()
    client = client_of(server.url)
    first = client.responses.create(model="moot/single", input="Is 7 prime?")
    sent = len(fake.requests)
    body = {
        "model": "moot/single",
        "previous_response_id": first.id,
        "input": [{"role": "user", "content": "And 9?"}, {"type": "web_search_call", "id": "w"}],
    }
    refused = httpx.post(server.url + "/v1/responses", json=body)
    error = refused.json()["error"]
    assert refused.status_code == 400 and error["param"] == "input[1]" and error["message"].startswith("input[1]:")
    assert len(fake.requests) == sent


def test_a_stream_follows_a_debate_another_process_writes_until_it_ends(tmp_path: Path) -> None:
    """Read from the store alone (the debate is not running here): the events come as they are
    written, and the stream ends when the debate does."""
    import asyncio

    from moot.server.openai.responses_replay import _stored
    from moot.server.state import StoredEvent
    from moot.server.state.sqlite import SqliteStore
    from test_store_contract import result_with

    store = SqliteStore(tmp_path / "moot.sqlite")
    try:
        store.create("d1", protocol="single", question="Q?", model="openai:fake", request={})
        store.write("d1", result_with(0), [StoredEvent(id=1, name="debate_started", data="{}")])

        async def follow() -> list[int]:
            async def later() -> None:
                await asyncio.sleep(0.3)
                store.write("d1", result_with(1), [StoredEvent(id=3, name="turn_done", data="{}")])
                await asyncio.sleep(0.3)
                done = [StoredEvent(id=4, name="debate_done", data="{}")]
                store.write("d1", result_with(1, status="complete"), done, status="complete")

            writer = asyncio.create_task(later())
            seen = [e.id async for e in _stored(store, "d1", every_s=0.05)]
            await writer
            return seen

        assert asyncio.run(asyncio.wait_for(follow(), 30)) == [1, 3, 4]
    finally:
        store.close()


def test_a_stored_response_is_kept_without_reading_its_request_back(
    make_server: MakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request a stored response's debate is queued with is the value its first and final forms
    are kept with: the store's copy is not read back (twice per response before) while it is made;
    and the final form a request waits for is the one kept, built once."""
    from moot.server.state.sql import SqlStore

    reads: list[str] = []
    read = SqlStore.request

    def counted(self: SqlStore, debate_id: str) -> dict[str, Any] | None:
        reads.append(debate_id)
        return read(self, debate_id)

    monkeypatch.setattr(SqlStore, "request", counted)
    from moot.server.openai import open_responses, response_objects, responses

    built: list[str] = []
    build = responses.final_response

    def final(shell: Any, *args: Any) -> Any:
        built.append(shell.live.id)
        return build(shell, *args)

    echoes: list[str] = []
    echo = open_responses.echoed

    def echoed(req: Any, spec: Any) -> Any:
        echoes.append(req.input if isinstance(req.input, str) else "")
        return echo(req, spec)

    monkeypatch.setattr(responses, "final_response", final)
    monkeypatch.setattr(response_objects.open_responses, "echoed", echoed)
    server, _ = make_server()
    client = client_of(server.url)
    made = client.responses.create(model="moot/single", input="Is 7 prime?")
    assert len(built) == 1  # the final form kept is the one returned: built once (twice before)
    streamed = list(client.responses.create(model="moot/single", input="Is 9 prime?", stream=True))
    assert made.status == "completed" and streamed[-1].type == "response.completed"
    # The fields that repeat the request: worked out once per response (its first form, its stream
    # and its final form each worked them out again before).
    assert echoes == ["Is 7 prime?", "Is 9 prime?"]
    assert reads == []
    # What was kept is the whole stored request, its final form included, as GET shows it.
    assert client.responses.retrieve(made.id).model_dump() == made.model_dump()
    final = streamed[-1].response  # type: ignore[union-attr]
    assert wait_for(lambda: client.responses.retrieve(final.id).status == "completed" or None, "the final form")


def test_a_replay_open_when_the_server_stops_says_where_the_response_went(make_server: MakeServer) -> None:
    """A background response still queued when the server stops: its replay ends with an ``error``
    event saying it stays queued and how to follow it (it ended in response.failed, in_progress)."""
    import threading

    from moot.server.http.streams import stop_streams

    server, _ = make_server(latency=5.0, max_running=1)
    body = {"model": "moot/single", "input": "Is 7 prime?", "background": True}
    httpx.post(server.url + "/v1/responses", json=body, timeout=30)  # takes the one slot
    waiting = httpx.post(server.url + "/v1/responses", json=body, timeout=30).json()["id"]
    lines: list[str] = []

    def follow() -> None:
        with httpx.stream("GET", f"{server.url}/v1/responses/{waiting}", params={"stream": "true"}, timeout=60) as got:
            lines.extend(line for line in got.iter_lines() if line.startswith("data:"))

    reader = threading.Thread(target=follow)
    reader.start()
    wait_for(lambda: len(lines) >= 2 or None, "the replay to begin")
    loop = server.server._loop
    assert loop is not None
    loop.call_soon_threadsafe(stop_streams)  # as moot serve's SIGTERM does
    reader.join(60)
    last = json.loads(lines[-1][5:])
    assert last["type"] == "error" and last["code"] == "server_stopping", last
    assert "stays queued" in last["message"] and f"starting_after={last['sequence_number'] - 1}" in last["message"]


def test_a_cancelled_or_deleted_traced_response_keeps_what_its_stream_showed(make_server: MakeServer) -> None:
    """Found by a client pass: a traced background response cancelled after its first round streamed
    two reasoning items, then ended (stream and GET) with no output; one deleted while a client read
    its stream ended that stream with no terminal event at all, so the SDK's iterator finished as if
    nothing had happened; a failed foreground stream's GET lost the items the stream had shown."""
    import threading

    server, _ = make_server(latency=0.4)
    client = client_of(server.url)
    body = {"model": "moot/affirmative-critical:trace", "input": "Is 7 prime?", "background": True}
    made = client.responses.create(**body)  # type: ignore[call-overload]

    def first_round_shown(response_id: str) -> Response:
        deadline = time.monotonic() + 60
        seen = client.responses.retrieve(response_id)
        while len(seen.output) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
            seen = client.responses.retrieve(response_id)
        assert [o.type for o in seen.output] == ["reasoning", "reasoning"], seen
        return seen

    shown = first_round_shown(made.id)
    assert client.responses.cancel(made.id).status == "cancelled"
    kept = client.responses.retrieve(made.id)
    assert kept.status == "cancelled"
    assert [o.model_dump() for o in kept.output[:2]] == [o.model_dump() for o in shown.output]
    events = stream_events(server.url, f"/v1/responses/{made.id}?stream=true")
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert events[-1]["type"] == "response.failed" and events[-1]["response"]["status"] == "cancelled"
    held = [o.model_dump(mode="json", exclude_none=True) for o in kept.output]
    assert events[-1]["response"]["output"] == done == held

    # deleted while a client follows its stream: the stream ends with response.failed, saying so
    other = client.responses.create(**body)  # type: ignore[call-overload]
    followed: list[list[dict[str, Any]]] = []
    reader = threading.Thread(
        target=lambda: followed.append(stream_events(server.url, f"/v1/responses/{other.id}?stream=true"))
    )
    reader.start()
    first_round_shown(other.id)
    client.responses.delete(other.id)
    reader.join(60)
    assert followed, "the stream did not end"
    last = followed[0][-1]
    assert last["type"] == "response.failed" and "was deleted" in last["response"]["error"]["message"]
    items = [e["item"]["id"] for e in followed[0] if e["type"] == "response.output_item.done"]
    assert [o["id"] for o in last["response"]["output"]] == items and len(items) >= 2

    # a foreground stream that fails (the model refuses from the second round on): GET keeps its items
    from moot.testing.fake_openai import Fault

    quick, quick_fake = make_server()
    quick_fake.faults.extend([None, None, *[Fault.http(400, "the model refuses")] * 20])  # type: ignore[list-item]
    foreground = stream_events(quick.url, "/v1/responses", "POST", {**body, "background": False, "stream": True})
    assert foreground[-1]["type"] == "response.failed"
    stored = client_of(quick.url).responses.retrieve(foreground[0]["response"]["id"])
    assert stored.status == "failed" and [o.type for o in stored.output] == ["reasoning"] * 4  # (round 2's failed)
    streamed = [e["item"] for e in foreground if e["type"] == "response.output_item.done"]
    assert [o.model_dump(mode="json", exclude_none=True) for o in stored.output] == streamed


def test_a_replayed_typed_turn_is_the_item_the_response_holds(make_server: MakeServer) -> None:
    """Found by a client pass: a replayed stream showed a typed turn (a vote's JSON reply) by the text the
    other agents see ("ok"), and the final response held the same item id with the JSON the model wrote."""
    server, _ = make_server(latency=0.02)
    client = client_of(server.url)
    made = client.responses.create(model="moot/vote:trace", input="Is 7 prime?", background=True)
    done = poll(client, made.id, {"completed", "failed", "incomplete"})
    events = stream_events(server.url, f"/v1/responses/{made.id}?stream=true")
    items = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done.status == "completed" and len(items) == 6  # five votes and the answer
    assert items == [o.model_dump(mode="json", exclude_none=True) for o in done.output]
    assert '"answer"' in items[0]["content"][0]["text"]
