"""Three ``moot serve`` processes on one PostgreSQL and one Redis (issue 40, items 4 and 7): a stream
opened on a replica that does not run the debate (native SSE, and a chat-completions stream) gets
every event live; ``Last-Event-ID`` resumes on a third replica with no gap and no repeat; ``kill -9``
of the runner, after which another takes the debate over and the streams go on through Redis; and
Redis killed mid-stream, after which the streams go on from the store and nothing stored is lost.

The replicas are processes on loopback ports (tests/replicas.py) on a database of the session's
PostgreSQL cluster and the session's ``redis-server`` (tests/conftest.py; the test that kills Redis
starts its own). The model is the fake OpenAI server, slow enough that a debate spans seconds.
Bounds are generous: only a hang trips them."""

from __future__ import annotations

import json
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from pg_cluster import PgCluster
from redis_server import RedisServer
from replicas import Deployment, Replica, deployment, wait_running_on
from serving import read_events, wait_for

pytestmark = [pytest.mark.xdist_group("replicas")]

#: affirmative-critical: two speakers a round, then one synthesis call.
ROUNDS = 4
CALLS = 2 * ROUNDS + 1
HANG_S = 240.0


@dataclass
class Reader:
    """An SSE stream read in a thread, each event kept as it comes (with when); ``error``: how it was
    cut, if it was (its replica killed)."""

    url: str
    after: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    error: BaseException | None = None
    thread: threading.Thread | None = None

    def start(self) -> Reader:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        from httpx_sse import connect_sse

        headers = dict(self.headers) if self.after is None else {**self.headers, "Last-Event-ID": str(self.after)}
        try:
            with (
                httpx.Client(timeout=httpx.Timeout(60.0)) as client,
                connect_sse(client, "GET", self.url, headers=headers) as source,
            ):
                for sse in source.iter_sse():
                    if sse.data:
                        self.events.append({"id": int(sse.id), "event": sse.event, "data": json.loads(sse.data)})
        except Exception as exc:  # a cut stream: the test looks at it
            self.error = exc

    def join(self) -> list[dict[str, Any]]:
        assert self.thread is not None
        self.thread.join(HANG_S)
        assert not self.thread.is_alive(), f"the stream of {self.url} never ended"
        return self.events


@dataclass
class ChatReader:
    """A streamed chat completion, read in a thread: its chunks, each with when it came."""

    url: str
    body: dict[str, Any]
    chunks: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    done: bool = False
    error: BaseException | None = None
    thread: threading.Thread | None = None

    def start(self) -> ChatReader:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            with httpx.stream("POST", self.url + "/v1/chat/completions", json=self.body, timeout=60.0) as response:
                assert response.status_code == 200, response.read()
                for line in response.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        self.done = True
                        return
                    self.chunks.append((time.monotonic(), json.loads(line.removeprefix("data: "))))
        except Exception as exc:
            self.error = exc

    def debate_id(self) -> str | None:
        return self.chunks[0][1]["id"].removeprefix("moot-") if self.chunks else None

    def join(self) -> None:
        assert self.thread is not None
        self.thread.join(HANG_S)
        assert not self.thread.is_alive(), "the chat stream never ended"
        assert self.error is None, self.error

    def text(self, part: str) -> str:
        return "".join(c["choices"][0]["delta"].get(part) or "" for _, c in self.chunks if c.get("choices"))

    def times(self, part: str) -> list[float]:
        return [t for t, c in self.chunks if c.get("choices") and c["choices"][0]["delta"].get(part)]


def events_url(replica: Replica, debate_id: str) -> str:
    return f"{replica.url}/v1/debates/{debate_id}/events"


def chat_body(question: str, rounds: int) -> dict[str, Any]:
    """A streamed chat completion whose turns stream too (``:trace``, in ``reasoning_content``)."""
    return {
        "model": "moot/affirmative-critical:trace",
        "messages": [{"role": "user", "content": question}],
        "stream": True,
        "moot": {"rounds": rounds},
    }


def stored_ids(dep: Deployment, debate_id: str) -> list[int]:
    return [e.id for e in dep.store.events(debate_id)]


def assert_in_order_each_once(events: list[dict[str, Any]]) -> list[int]:
    ids = [e["id"] for e in events]
    assert ids == sorted(set(ids)), f"ids out of order or repeated: {ids}"
    return ids


def assert_whole(dep: Deployment, debate_id: str, rounds: int = ROUNDS) -> None:
    """Complete, every turn once, the stored events in order with one start and one end."""
    assert dep.status(debate_id) == "complete", dep.store.get(debate_id, with_result=False)
    row = dep.store.get(debate_id)
    assert row is not None and row.result is not None
    turns = row.result.turns()
    assert [(t.speaker, t.round) for t in turns] == [
        (s, r) for r in range(1, rounds + 1) for s in ("affirmative", "critical")
    ]
    assert all(t.ok for t in turns) and row.result.final_answer
    names = [e.name for e in dep.store.events(debate_id)]
    assert names.count("debate_started") == 1 and names[-1] == "debate_done" and names.count("debate_done") == 1
    assert names.count("turn_done") == 2 * rounds + 1
    ids = stored_ids(dep, debate_id)
    assert ids == sorted(set(ids))


def runner_while_running(dep: Deployment, debate_id: str) -> Replica:
    runner: Replica | None = wait_for(lambda: dep.runner(debate_id), f"a replica to run {debate_id}", timeout=HANG_S)
    assert runner is not None
    return runner


def test_streams_on_the_replicas_not_running_a_debate_get_every_event_live_and_resume_on_a_third(
    pg_cluster: PgCluster, redis_server: RedisServer, tmp_path: Path
) -> None:
    extra = ["--redis", redis_server.url, "--max-running", "1"]
    with deployment(pg_cluster, tmp_path, latency=0.3, extra=extra) as dep:
        r0, r1, r2 = dep.replicas
        # A debate on r0, streamed from its start on r1.
        debate = dep.submit("Is a stream on another replica live?", rounds=ROUNDS, to=r0)
        assert runner_while_running(dep, debate) is r0
        on_r1 = Reader(events_url(r1, debate), after=0).start()
        # r1 busy with a long debate of its own: a chat completion sent to it waits in the shared
        # queue, where r2 (free) takes it; the chat stream stays on r1.
        busy = dep.submit("Is r1 busy for a while?", rounds=ROUNDS + 2, to=r1)
        assert runner_while_running(dep, busy) is r1
        # Longer than the second r1 may take to see that r2 took it from the queue (cancel_poll_s, when
        # it lets it go and follows r2 on the bus): a shorter one could end before the stream is live.
        chat = ChatReader(r1.url, chat_body("Is a chat stream on another replica live?", ROUNDS + 1)).start()
        chat_id = wait_for(chat.debate_id, "the chat completion's first chunk", timeout=HANG_S)
        assert runner_while_running(dep, chat_id) is r2
        # Resumed on a third replica mid-debate: r2, with the Last-Event-ID of an event r1 had.
        wait_for(lambda: len([e for e in on_r1.events if e["event"] == "turn_done"]) >= 2, "two turns on r1")
        middle = on_r1.events[-1]["id"]
        resumed_on_r2 = Reader(events_url(r2, debate), after=middle).start()
        chat_ended_at = wait_for(
            lambda: dep.status(chat_id) == "complete" and time.monotonic(), "the chat debate to end", timeout=HANG_S
        )
        dep.wait_done(debate, busy, chat_id)

        from_r1, from_r2 = on_r1.join(), resumed_on_r2.join()
        # the runner's own log, read after the end: the stored events (the token deltas were a live
        # reader's only)
        on_r0 = read_events(events_url(r0, debate))
        assert on_r0[-1]["event"] == "debate_done" and not any(e["event"] == "token" for e in on_r0)
        assert on_r1.error is None and resumed_on_r2.error is None
        assert_in_order_each_once(from_r1)
        assert any(e["event"] == "token" for e in from_r1)  # live on another replica: token deltas included
        assert [e for e in from_r1 if e["event"] != "token"] == on_r0  # under the runner's ids
        assert from_r2 == [e for e in from_r1 if e["id"] > middle]  # the rest, no gap, no repeat
        assert_whole(dep, debate)

        chat.join()
        assert chat.done  # [DONE]
        row = dep.store.get(chat_id)
        assert row is not None and row.result is not None and row.status == "complete"
        assert chat.text("content").strip() == (row.result.final_answer or "").strip()
        reasoning = chat.text("reasoning_content")
        assert all(t.text.strip() in reasoning for t in row.result.turns())  # every turn reached r1's stream
        # Live: the turns reached the stream while the debate ran on r2, not once it had ended.
        assert chat.times("reasoning_content")[0] < chat_ended_at


def test_kill_9_of_the_runner_with_redis_the_streams_go_on_with_ids_that_only_go_up(
    pg_cluster: PgCluster, redis_server: RedisServer, tmp_path: Path
) -> None:
    import redis as redis_client

    from moot.server.state.bus import events_key

    with deployment(pg_cluster, tmp_path, latency=0.4, extra=["--redis", redis_server.url]) as dep:
        r0, r1, r2 = dep.replicas
        # Long enough that the kill, after its third turn, always comes before its end.
        debate = dep.submit("Is a debate killed under its streams finished?", rounds=10, to=r0)
        on_runner = Reader(events_url(r0, debate), after=0).start()  # cut by the kill
        on_r1 = Reader(events_url(r1, debate), after=0).start()  # goes on through Redis
        victim = wait_running_on(dep, debate, turns=3)
        assert victim is r0
        victim.signal(signal.SIGKILL)  # mid-turn or between two: its clients hold what it had sent
        victim.proc.wait(30)  # type: ignore[union-attr]
        cut = on_runner.join()
        assert cut[-1]["event"] != "debate_done", "the debate ended before the kill: the test needs a longer one"
        last_seen = cut[-1]["id"]  # what a client of the dead replica holds, a token delta's id perhaps
        # It reconnects (through the balancer) to a third replica with its Last-Event-ID.
        rest = read_events(events_url(r2, debate), after=last_seen)
        dep.wait_done(debate)
        assert_whole(dep, debate, rounds=10)
        stored = stored_ids(dep, debate)

        resumed_client = assert_in_order_each_once(cut + rest)
        assert set(stored) <= set(resumed_client), "a stored event never reached the client that reconnected"
        assert [e["event"] for e in rest].count("resumed") == 1 and rest[-1]["event"] == "debate_done"

        live = on_r1.join()
        assert on_r1.error is None
        ids = assert_in_order_each_once(live)
        assert set(stored) <= set(ids) and live[-1]["event"] == "debate_done"
        assert [e["event"] for e in live].count("resumed") == 1
        # Redis took every event both replicas stored (the new one's ids above the dead one's).
        client = redis_client.Redis.from_url(redis_server.url, decode_responses=True)
        try:
            in_redis = [int(str(i).split("-")[0]) for i, _ in client.xrange(events_key(debate))]
        finally:
            client.close()
        assert set(stored) <= set(in_redis)


def test_redis_killed_mid_stream_the_streams_go_on_from_the_store_and_nothing_stored_is_lost(
    pg_cluster: PgCluster, tmp_path: Path
) -> None:
    redis = RedisServer(password="replica-bus-pw").start()
    try:
        extra = ["--redis", redis.url, "--max-running", "1"]
        with deployment(pg_cluster, tmp_path, latency=0.4, extra=extra) as dep:
            r0, r1, r2 = dep.replicas
            debate = dep.submit("Does a stream outlive Redis?", rounds=ROUNDS, to=r0)
            assert runner_while_running(dep, debate) is r0
            on_r1 = Reader(events_url(r1, debate), after=0).start()
            busy = dep.submit("Is r1 busy while Redis dies?", rounds=ROUNDS + 2, to=r1)
            assert runner_while_running(dep, busy) is r1
            chat = ChatReader(r1.url, chat_body("Does a chat stream outlive Redis?", 3)).start()
            chat_id = wait_for(chat.debate_id, "the chat completion's first chunk", timeout=HANG_S)
            assert runner_while_running(dep, chat_id) is r2
            wait_for(lambda: any(e["event"] == "token" for e in on_r1.events), "a token through Redis on r1")
            resumed_on_r2 = Reader(events_url(r2, debate), after=on_r1.events[-1]["id"]).start()
            redis.stop()  # mid-stream (SIGKILL)
            dep.wait_done(debate, busy, chat_id)
            for debate_id in (debate, chat_id):
                assert dep.status(debate_id) == "complete"
            assert_whole(dep, debate)
            stored = stored_ids(dep, debate)

            live = on_r1.join()
            assert on_r1.error is None and live[-1]["event"] == "debate_done"
            assert set(stored) <= set(assert_in_order_each_once(live))  # every stored event, once, in order
            rest = resumed_on_r2.join()
            assert resumed_on_r2.error is None and rest[-1]["event"] == "debate_done"
            assert {i for i in stored if i > resumed_on_r2.after} <= set(assert_in_order_each_once(rest))  # type: ignore[operator]

            chat.join()
            assert chat.done
            row = dep.store.get(chat_id)
            assert row is not None and row.result is not None
            assert chat.text("content").strip() == (row.result.final_answer or "").strip()
            assert all(r.alive() for r in dep.replicas)
            logs = "".join(r.text() for r in dep.replicas)
            assert f"Redis (redis://:***@127.0.0.1:{redis.port}/0) failed" in logs and "replica-bus-pw" not in logs
    finally:
        redis.close()


def test_two_replicas_configured_differently_what_each_accepts_and_a_take_over_that_lacks_the_model(
    pg_cluster: PgCluster, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replica A offers two models and has its own key (``--api-key-env``); B offers one and none.
    The store's keys hold on both; A's own key on A alone; a model B lacks is refused on B (400,
    naming B's models); a debate of that model that A hands back (it stops) is taken by B, which
    cannot run it: it ends ``failed`` with the reason and its finished turns, never left hanging,
    and the stream following it on B ends with that."""
    from contextlib import ExitStack

    from pydantic import SecretStr

    from moot.server import ServerSettings
    from moot.server.state.keys import key_hash, new_key
    from moot.server.state.postgres import PostgresStore
    from moot.testing.fake_openai import FakeOpenAIServer
    from serving import FAKE_KEY, ServerThread

    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    database = pg_cluster.create_database()
    url = pg_cluster.url(database)
    store = PostgresStore(url, application_name="moot tests")
    own = "moot-replica-a-own-key-0123456789"
    shared = new_key()
    store.add_key("shared", key_hash(shared))
    as_shared = {"Authorization": f"Bearer {shared}"}
    try:
        with ExitStack() as stack:
            fake = stack.enter_context(FakeOpenAIServer(latency=0.5))
            common: dict[str, Any] = {
                "db_url": SecretStr(url), "redis_url": SecretStr(redis_server.url), "base_url": fake.base_url,
                "lease_s": 3, "poll_s": 0.2, "key_cache_s": 0.2, "keepalive_s": 0.5,
            }  # fmt: skip
            b = stack.enter_context(ServerThread(ServerSettings(models=["openai:fake"], **common)))
            a_stack = stack.enter_context(ExitStack())
            a = a_stack.enter_context(
                ServerThread(ServerSettings(models=["openai:fake", "openai:other"], api_key=SecretStr(own), **common))
            )
            # Keys: the store's on both; A's own on A only (B answers 401: the store holds keys).
            for replica in (a, b):
                assert httpx.get(replica.url + "/v1/debates", headers=as_shared).status_code == 200
            as_own = {"Authorization": f"Bearer {own}"}
            assert httpx.get(a.url + "/v1/debates", headers=as_own).status_code == 200
            assert httpx.get(b.url + "/v1/debates", headers=as_own).status_code == 401
            # Models: each replica's own list.
            body = {"question": "Is 13 prime?", "rounds": 3, "model": "openai:other"}
            refused = httpx.post(b.url + "/v1/debates", json=body, headers=as_shared, timeout=30)
            assert refused.status_code == 400 and "openai:fake" in refused.text, refused.text
            posted = httpx.post(a.url + "/v1/debates", json=body, headers=as_shared, timeout=30)
            assert posted.status_code == 202, posted.text
            debate_id = posted.json()["id"]
            on_b = Reader(f"{b.url}/v1/debates/{debate_id}/events", after=0, headers=as_shared)
            wait_for(lambda: (store.get(debate_id) or _NoRow()).calls >= 1, "a first turn on A", timeout=HANG_S)
            on_b.start()
            a_stack.close()  # A stops: it hands the debate back, and B takes it from the queue
            wait_for(lambda: store.get(debate_id, with_result=False).status == "failed", "B to end it", timeout=HANG_S)  # type: ignore[union-attr]
            row = store.get(debate_id)
            assert row is not None and row.error is not None and row.result is not None
            assert "cannot run this debate" in row.error and "openai:other" in row.error and "\n" not in row.error
            assert [t for t in row.result.turns() if t.ok]  # the turns A finished are kept
            events = on_b.join()
            assert on_b.error is None, on_b.error
            assert events[-1]["event"] == "debate_done" and events[-1]["data"]["status"] == "failed"
            assert "cannot run this debate" in events[-1]["data"]["error"]
            assert_in_order_each_once(events)
    finally:
        store.close()
        pg_cluster.drop_database(database)


class _NoRow:
    calls = 0
