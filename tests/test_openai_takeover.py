"""The take-over of an OpenAI-door debate (a chat completion, a Responses request) builds the very debate
its submission built: another replica, or a restarted process, that runs it from its stored request
sends the same prompts as the replica that received it (the caller's system and developer messages as
instructions, not context passages; the conversation fitted to the prompt budget; the tools), and a
stored response taken over ends in the same reply (a vote's answered in the form the caller asks).

Each test runs the request once on ``moot serve`` (in process, on a throwaway PostgreSQL), stops the
server, stores a copy of the debate as another replica would have left it (queued, its request the
same), and starts a server again: its poller claims the copy and builds it from the stored request.
The fake model's requests of the two runs are compared."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from moot.server import ServerSettings
from moot.server.state.postgres import PostgresStore
from moot.testing.fake_openai import FakeOpenAIServer
from pg_cluster import PgCluster
from serving import FAKE_KEY, ServerThread, wait_for
from test_serve_agents import WEATHER, conversation, weather_agent

pytestmark = [pytest.mark.xdist_group("replicas")]


@pytest.fixture(scope="module")
def cluster() -> Iterator[PgCluster]:
    pg = PgCluster().start()
    try:
        yield pg
    finally:
        pg.stop()


@pytest.fixture
def store_url(cluster: PgCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    database = cluster.create_database()
    try:
        yield cluster.url(database)
    finally:
        cluster.drop_database(database)


def sent(requests: list[dict[str, Any]]) -> list[str]:
    """What each model call was sent (its messages, and the schema its reply must follow), sorted."""
    out = []
    for r in requests:
        schema = ((r.get("response_format") or {}).get("json_schema") or {}).get("schema")
        out.append(json.dumps({"messages": r["messages"], "schema": schema}, sort_keys=True))
    return sorted(out)


def left_by_another_replica(url: str, debate_id: str) -> str:
    """A copy of a finished debate, queued as a replica that received it and stopped would leave it."""
    store = PostgresStore(url, application_name="moot tests")
    try:
        row = store.get(debate_id, with_result=False)
        request = store.request(debate_id)
        assert row is not None and request is not None
        copy = uuid.uuid4().hex
        kept = request.get("responses")
        if kept is not None:  # a stored response: as it was kept before its debate ended
            first = {**kept["first"], "id": f"resp_{copy}"}
            request = {**request, "responses": {**kept, "first": first, "response": first}}
        store.create(copy, protocol=row.protocol, question=row.question, model=row.model, request=request)
        return copy
    finally:
        store.close()


def run_again(url: str, fake: FakeOpenAIServer, debate_id: str) -> list[dict[str, Any]]:
    """Start a server on the store: its poller claims the copy and runs it; the requests it sent."""
    settings = ServerSettings(models=["openai:fake"], base_url=fake.base_url, db_url=SecretStr(url), poll_s=0.2)
    before = len(fake.requests)
    store = PostgresStore(url, application_name="moot tests")
    try:
        with ServerThread(settings):
            wait_for(lambda: _status(store, debate_id) not in ("queued", "running"), "the copy to end", timeout=120)
            assert _status(store, debate_id) == "complete", store.get(debate_id, with_result=False)
        return fake.requests[before:]
    finally:
        store.close()


def _status(store: PostgresStore, debate_id: str) -> str | None:
    row = store.get(debate_id, with_result=False)
    return None if row is None else row.status


def test_a_taken_over_chat_completion_sends_what_the_submitted_one_sent(store_url: str) -> None:
    """A system-prompted, tool-carrying agent conversation over the prompt budget, on a vote."""
    body = {
        "model": "moot/vote",
        "messages": conversation(99),
        "tools": [WEATHER],
        "moot": {"budget": {"max_total_tokens": 6000}},
    }
    with FakeOpenAIServer(reply=weather_agent) as fake:
        settings = ServerSettings(
            models=["openai:fake"], base_url=fake.base_url, db_url=SecretStr(store_url), poll_s=0.2
        )
        with ServerThread(settings) as server:
            reply = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
            assert reply.status_code == 200, reply.text
            original = reply.json()["moot"]["debate_id"]
            context = httpx.get(f"{server.url}/v1/debates/{original}").json()["result"]["task"]["context"]
        first = list(fake.requests)
        # the submitted debate: the system prompt an instruction, the oldest messages left out
        assert not any(c["source"] == "system" for c in context) and context[0]["source"] == "moot"
        assert all(r["messages"][0]["content"].endswith("You are a weather agent.") for r in first)
        copy = left_by_another_replica(store_url, original)
        again = run_again(store_url, fake, copy)
    assert len(again) == len(first) == 5
    assert sent(again) == sent(first)


def test_a_taken_over_chained_response_sends_what_the_submitted_one_sent_and_replies_the_same(
    store_url: str,
) -> None:
    """A Responses request with ``instructions`` and ``previous_response_id``, stored."""
    with FakeOpenAIServer(reply=weather_agent) as fake:
        settings = ServerSettings(
            models=["openai:fake"], base_url=fake.base_url, db_url=SecretStr(store_url), poll_s=0.2
        )
        with ServerThread(settings) as server:
            made = httpx.post(
                server.url + "/v1/responses",
                json={"model": "moot/vote", "input": "Remember the word PELICAN.", "instructions": "Be brief."},
                timeout=120,
            ).json()
            before = len(fake.requests)
            chained = httpx.post(
                server.url + "/v1/responses",
                json={
                    "model": "moot/vote",
                    "input": "Which word did I give?",
                    "instructions": "Answer on the last line as 'ANSWER: $LETTER'.",
                    "previous_response_id": made["id"],
                },
                timeout=120,
            )
            assert chained.status_code == 200, chained.text
            second = chained.json()
        first = fake.requests[before:]
        answer = second["output"][-1]["content"][0]["text"]
        assert answer.splitlines()[-1].startswith("ANSWER: ")  # the vote answers in the caller's form
        assert all("Answer on the last line" in r["messages"][0]["content"] for r in first)
        original = second["id"].removeprefix("resp_")
        copy = left_by_another_replica(store_url, original)
        settings = ServerSettings(
            models=["openai:fake"], base_url=fake.base_url, db_url=SecretStr(store_url), poll_s=0.2
        )
        store = PostgresStore(store_url, application_name="moot tests")
        try:
            with ServerThread(settings) as restarted:
                wait_for(lambda: _status(store, copy) not in ("queued", "running"), "the copy to end", timeout=120)
                got = httpx.get(f"{restarted.url}/v1/responses/resp_{copy}", timeout=60).json()
        finally:
            store.close()
        again = fake.requests[before + len(first) :]
    assert len(again) == len(first) == 5
    assert sent(again) == sent(first)
    assert got["id"] == f"resp_{copy}" and got["status"] == "completed"
    assert got["output"][-1]["content"][0]["text"] == answer


def test_background_responses_left_at_a_restart_run_on_the_next_server(store_url: str) -> None:
    """The server stops with one background response running and one waiting for a slot: it hands
    both back, and the next server on the store runs both to their end, each kept as a response."""
    with FakeOpenAIServer(latency=1.0, reply=weather_agent) as fake:
        settings = ServerSettings(
            models=["openai:fake"], base_url=fake.base_url, db_url=SecretStr(store_url), poll_s=0.2, max_running=1
        )
        with ServerThread(settings) as server:
            body = {"model": "moot/affirmative-critical", "background": True, "moot": {"rounds": 2}}
            running = httpx.post(server.url + "/v1/responses", json={**body, "input": "Is 7 prime?"}).json()
            wait_for(
                lambda: httpx.get(f"{server.url}/v1/responses/{running['id']}").json()["status"] == "in_progress",
                "the first response to run",
            )
            waiting = httpx.post(server.url + "/v1/responses", json={**body, "input": "Is 9 prime?"}).json()
            assert httpx.get(f"{server.url}/v1/responses/{waiting['id']}").json()["status"] == "queued"
        with ServerThread(settings) as restarted:

            def ended(response_id: str) -> dict[str, Any] | None:
                got: dict[str, Any] = httpx.get(f"{restarted.url}/v1/responses/{response_id}").json()
                return got if got["status"] not in ("queued", "in_progress") else None

            first = wait_for(lambda: ended(running["id"]), "the running response to end", timeout=120)
            second = wait_for(lambda: ended(waiting["id"]), "the waiting response to end", timeout=120)
    for response in (first, second):
        assert response["status"] == "completed", response["error"]
        assert response["background"] is True and response["output"][-1]["content"][0]["text"]
