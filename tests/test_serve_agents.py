"""``moot serve`` as the model of an agent (issue 41, items 3 and 4): retries that join their debate
(``Idempotency-Key``, ``x-should-retry``, ``x-request-id``), and what agent clients send. Debates run on
the loopback fake OpenAI-compatible server."""

# ruff: noqa: F811  (make_server is a fixture of test_serve_api, imported)

from __future__ import annotations

import threading
from typing import Any

import httpx
import openai
import pytest

from moot.testing.fake_openai import Fault
from serving import ServerThread
from test_serve_api import MakeServer, make_server  # noqa: F401  (the fixture)

QUESTION = "Is 7 prime?"
CHAT = {"model": "moot/vote", "messages": [{"role": "user", "content": QUESTION}]}


def debate_count(server: ServerThread) -> int:
    return len(httpx.get(server.url + "/v1/debates", params={"limit": 200}).json()["debates"])


def post(server: ServerThread, body: dict[str, Any], key: str | None = None, **headers: str) -> httpx.Response:
    sent = {**headers, **({"Idempotency-Key": key} if key is not None else {})}
    return httpx.post(server.url + "/v1/chat/completions", json=body, headers=sent, timeout=60)


# ------------------------------------------------------------------------------ Idempotency-Key


def test_the_same_idempotency_key_joins_the_running_debate_then_returns_it(make_server: MakeServer) -> None:
    server, fake = make_server(latency=0.3)
    replies: list[httpx.Response] = []
    first = threading.Thread(target=lambda: replies.append(post(server, CHAT, "key-1")))
    first.start()
    # the second request comes while the first one's debate runs (a retry after a client timeout)
    while debate_count(server) == 0:
        pass
    second = post(server, CHAT, "key-1")
    first.join(60)
    assert second.status_code == 200 == replies[0].status_code, second.text
    assert second.json()["id"] == replies[0].json()["id"]
    assert second.json()["choices"][0]["message"]["content"] == replies[0].json()["choices"][0]["message"]["content"]
    calls = len(fake.requests)
    # after it ended: its stored result, streamed or not; no new debate, no new call
    third = post(server, CHAT, "key-1")
    assert third.json()["id"] == second.json()["id"] and third.json()["choices"] == second.json()["choices"]
    streamed = post(server, {**CHAT, "stream": True}, "key-1")
    assert f'"id":"{second.json()["id"]}"' in streamed.text and streamed.text.rstrip().endswith("data: [DONE]")
    assert len(fake.requests) == calls and debate_count(server) == 1
    # another key, or none, is another debate
    assert post(server, CHAT, "key-2").json()["id"] != second.json()["id"]
    assert debate_count(server) == 2


def test_an_idempotency_key_reused_with_another_body_is_a_409_and_no_debate(make_server: MakeServer) -> None:
    server, _ = make_server()
    assert post(server, CHAT, "key-1").status_code == 200
    other = {**CHAT, "messages": [{"role": "user", "content": "Is 9 prime?"}]}
    refused = post(server, other, "key-1")
    assert refused.status_code == 409 and refused.headers["x-should-retry"] == "false"
    error = refused.json()["error"]
    assert error["code"] == "idempotency_key_reused" and error["param"] == "Idempotency-Key"
    assert "another request body" in error["message"]
    assert debate_count(server) == 1
    # a key that is no token is refused by name
    bad = post(server, CHAT, "two words")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "Idempotency-Key"


def test_an_idempotency_key_is_the_callers_own_and_per_endpoint(make_server: MakeServer) -> None:
    server, _ = make_server()
    mine = post(server, CHAT, "key-1", Authorization="Bearer alice").json()["id"]
    theirs = post(server, CHAT, "key-1", Authorization="Bearer bob").json()["id"]
    assert mine != theirs
    response = httpx.post(
        server.url + "/v1/responses",
        json={"model": "moot/vote", "input": QUESTION},
        headers={"Idempotency-Key": "key-1", "Authorization": "Bearer alice"},
        timeout=60,
    )
    assert response.status_code == 200 and response.json()["id"].removeprefix("resp_") != mine.removeprefix("moot-")
    again = httpx.post(
        server.url + "/v1/responses",
        json={"model": "moot/vote", "input": QUESTION},
        headers={"Idempotency-Key": "key-1", "Authorization": "Bearer alice"},
        timeout=60,
    )
    assert again.json()["id"] == response.json()["id"] and debate_count(server) == 3


def test_an_idempotency_key_survives_a_restart(make_server: MakeServer) -> None:
    server, fake = make_server()
    first = post(server, CHAT, "key-1").json()
    server.__exit__(None, None, None)
    with ServerThread(server.settings) as again:
        calls = len(fake.requests)
        second = post(again, CHAT, "key-1").json()
        assert second["id"] == first["id"] and second["choices"] == first["choices"]
        assert len(fake.requests) == calls and debate_count(again) == 1


# -------------------------------------------------------------------------- retries and request ids


def test_a_failed_debate_tells_the_sdk_not_to_retry(make_server: MakeServer) -> None:
    server, fake = make_server()
    fake.faults.extend([Fault.http(400, "bad request upstream")] * 40)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")  # the SDK's default: 2 retries
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model="moot/single", messages=[{"role": "user", "content": QUESTION}])
    assert err.value.status_code == 502 and err.value.response.headers["x-should-retry"] == "false"
    assert debate_count(server) == 1  # one debate: the SDK did not start two more


def test_every_response_carries_a_request_id(make_server: MakeServer) -> None:
    server, _ = make_server()
    given = httpx.get(server.url + "/v1/models", headers={"X-Request-Id": "trace-42"})
    assert given.headers["x-request-id"] == "trace-42"
    made = httpx.get(server.url + "/v1/models")
    assert made.headers["x-request-id"].startswith("req_") and len(made.headers["x-request-id"]) > 8
    insane = httpx.get(server.url + "/nowhere", headers={"X-Request-Id": "a b\tc"})
    assert insane.status_code == 404 and insane.headers["x-request-id"].startswith("req_")
    refused = post(server, {"model": "moot/nope", "messages": CHAT["messages"]}, None, **{"X-Request-Id": "r-1"})
    assert refused.status_code == 404 and refused.headers["x-request-id"] == "r-1"
    assert post(server, CHAT).headers["x-request-id"].startswith("req_")
