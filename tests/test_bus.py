"""The live bus between replicas (moot.server.state.bus; issue 40, item 4): both implementations
(in-process, Redis) publish, subscribe after an id, fill what the bus lacks from the store, carry
cancels, and survive Redis dying; and two ``moot serve`` apps on one PostgreSQL and one Redis serve a
stream, its resume and a cancel of a debate that runs on the other.

Redis is a throwaway ``redis-server`` per test session (tests/redis_server.py); without the program
the tests fail with one line saying how to install it, never skip.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from pydantic import SecretStr

from moot.server import ServerSettings
from moot.server.state import Store, Write, now, open_store
from moot.server.state.bus import Bus, BusError, BusEvent, InProcessBus, RedisBus, check_redis
from moot.testing.fake_openai import FakeOpenAIServer, Fault
from redis_server import RedisServer
from serving import FAKE_KEY, ServerThread, free_port, read_events, serve_process, wait_for, wait_until_up

HANG_S = 30.0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = open_store(tmp_path / "moot.sqlite")
    yield opened
    opened.close()


@pytest.fixture(params=["in-process", "redis"])
async def buses(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Bus, Bus]]:
    """Two replicas' buses: the one running the debate (publishing) and the one a stream is on."""
    if request.param == "in-process":
        one = InProcessBus(retention=100, wait_s=0.2, poll_s=0.05)
        yield one, one
        return
    url = request.getfixturevalue("redis_server").url
    a = RedisBus(url, retention=100, wait_s=0.2, poll_s=0.05)
    b = RedisBus(url, retention=100, wait_s=0.2, poll_s=0.05)
    await a.start()
    await b.start()
    yield a, b
    await a.aclose()
    await b.aclose()


def running(store: Store) -> str:
    debate_id = uuid.uuid4().hex
    store.create(debate_id, protocol="p", question="Q?", model="m", request={})
    store.write_one(Write(debate_id, None, started=now()))
    return debate_id


def ev(i: int, name: str = "turn_done") -> BusEvent:
    return BusEvent(i, name, json.dumps({"i": i}))


def stored(store: Store, debate_id: str, events: list[BusEvent], *, status: str | None = None) -> None:
    """What the running replica writes: every event but the token deltas."""
    keep = [e for e in events if e.name != "token"]
    from moot.server.state import StoredEvent

    rows = [StoredEvent(id=e.id, name=e.name, data=e.data) for e in keep]
    store.write_one(Write(debate_id, None, rows, status=status))


async def collect(
    bus: Bus, store: Store, debate_id: str, after: int = 0, into: list[BusEvent] | None = None
) -> list[BusEvent]:
    """The subscription's events, to its end (also into ``into`` as they come)."""
    out: list[BusEvent] = into if into is not None else []

    async def run() -> list[BusEvent]:
        async for batch in bus.subscribe(store, debate_id, after):
            out.extend(batch)
        return out

    return await asyncio.wait_for(run(), HANG_S)


async def until(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + HANG_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


# ------------------------------------------------------------------------------- unit: both buses


async def test_a_subscriber_gets_the_events_after_an_id_in_order_each_once(
    buses: tuple[Bus, Bus], store: Store
) -> None:
    runner, reader = buses
    debate_id = running(store)
    events = [ev(1, "debate_started"), ev(2, "token"), ev(3, "token"), ev(4), ev(5, "round_done"), ev(6, "debate_done")]
    runner.publish(debate_id, events[:3])
    runner.publish(debate_id, events[3:])
    stored(store, debate_id, events, status="complete")
    assert await collect(reader, store, debate_id) == events
    assert await collect(reader, store, debate_id, after=3) == events[3:]  # Last-Event-ID: 3, on any replica
    assert await reader.last_id(debate_id) == 6


async def test_a_subscriber_arriving_after_the_end_gets_no_token_deltas(buses: tuple[Bus, Bus], store: Store) -> None:
    """The bus still holds an ended debate's token deltas (its retention, Redis's ttl): a reader
    arriving after the end is kept from them as the store keeps them (never redacted; an outside
    attack, session 38), and ends at its debate_done all the same, tokens last included."""
    runner, reader = buses
    debate_id = running(store)
    events = [ev(1, "debate_started"), ev(2, "token"), ev(3), ev(4, "token"), ev(5, "token"), ev(6, "debate_done")]
    runner.publish(debate_id, events)
    stored(store, debate_id, events, status="complete")

    async def after_the_end(after: int = 0) -> list[BusEvent]:
        got: list[BusEvent] = []
        async for batch in reader.subscribe(store, debate_id, after, ended=True):
            got.extend(batch)
        return got

    kept = [e for e in events if e.name != "token"]
    assert await asyncio.wait_for(after_the_end(), HANG_S) == kept
    assert await asyncio.wait_for(after_the_end(3), HANG_S) == kept[2:]


class Unreachable:
    """A store that cannot be reached while ``down`` (a PostgreSQL restart), else ``store`` itself."""

    def __init__(self, store: Store) -> None:
        self.store, self.down, self.refused = store, True, 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.store, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            from moot.server.state import StoreUnavailable

            if self.down:
                self.refused += 1
                raise StoreUnavailable("the store cannot be reached (test)")
            return method(*args, **kwargs)

        return call


async def test_a_subscriber_outlives_a_store_it_cannot_reach_for_a_while(buses: tuple[Bus, Bus], store: Store) -> None:
    """A PostgreSQL restart cut every open stream with an internal error (the subscription read the
    store, which raised StoreUnavailable); it now waits for the store and goes on."""
    _, reader = buses
    debate_id = running(store)
    events = [ev(1, "debate_started"), ev(2), ev(3, "round_done"), ev(4, "debate_done")]
    stored(store, debate_id, events, status="complete")  # (on the store, not on the bus: it must be read)
    flaky = Unreachable(store)
    task = asyncio.create_task(collect(reader, cast(Store, flaky), debate_id))
    await until(lambda: flaky.refused >= 2, "the subscription to find the store unreachable")
    assert not task.done()
    flaky.down = False
    assert await task == events


async def test_a_live_subscriber_gets_each_event_as_it_is_published(buses: tuple[Bus, Bus], store: Store) -> None:
    runner, reader = buses
    debate_id = running(store)
    task = asyncio.create_task(collect(reader, store, debate_id))
    await asyncio.sleep(0.3)  # the subscriber waits before anything is published
    events = [ev(i, "token" if i % 2 else "turn_done") for i in range(1, 40)] + [ev(40, "debate_done")]
    for e in events:
        runner.publish(debate_id, [e])
        await asyncio.sleep(0.002)
    stored(store, debate_id, events, status="complete")
    assert await task == events  # the token deltas too: the stream on the other replica has them


async def test_events_older_than_the_retention_come_from_the_store(buses: tuple[Bus, Bus], store: Store) -> None:
    """The bus keeps ~100 events of a debate; a stream resuming from the start gets the older
    stored ones from the store (not their token deltas), then the bus's, with no gap and no repeat."""
    runner, reader = buses
    debate_id = running(store)
    events = [ev(i, "turn_done" if i % 3 == 0 else "token") for i in range(1, 1000)] + [ev(1000, "debate_done")]
    for start in range(0, len(events), 50):
        runner.publish(debate_id, events[start : start + 50])
    stored(store, debate_id, events, status="complete")
    await asyncio.sleep(0.2)  # (Redis: the publisher's pipelines are written)
    kept = await reader.last_id(debate_id)
    assert kept == 1000
    got = await collect(reader, store, debate_id)
    ids = [e.id for e in got]
    assert ids == sorted(set(ids)) and ids[-1] == 1000  # in order, each once, to the end
    stored_ids = {e.id for e in events if e.name != "token"}
    assert stored_ids <= set(ids)  # nothing stored is missing
    first_in_bus = min(i for i in ids if i % 3 != 0 and i != 1000)  # the oldest token the bus still had
    assert first_in_bus > 1 and len(ids) < 1000  # the bus had trimmed the oldest: those came from the store
    assert ids[ids.index(first_in_bus) :] == list(range(first_in_bus, 1001))  # the bus's part: every event
    assert got == [e for e in events if e.id in set(ids)]  # the same data, whichever source


async def test_a_stored_event_the_bus_lacks_between_two_it_has_comes_from_the_store(
    buses: tuple[Bus, Bus], store: Store
) -> None:
    """The shape of a take-over (issue 40, the chaos run's invariant iv): the stopped replica stored
    event 4 but stopped before publishing it; the replica taking over numbers its events far above.
    A subscriber behind (after 2) reads 3 and 100005 in one batch: 4 sits between them, and comes
    from the store, in order; the token deltas of that gap the store never had are not waited for."""
    runner, reader = buses
    debate_id = running(store)
    first = [ev(1, "debate_started"), ev(2), ev(3, "token")]
    runner.publish(debate_id, first)
    stored(store, debate_id, [*first, ev(4), ev(5, "token")])  # 4 stored, never published (nor token 5)
    after_takeover = [ev(100_005, "resumed"), ev(100_006, "token"), ev(100_007, "debate_done")]
    runner.publish(debate_id, after_takeover)
    stored(store, debate_id, after_takeover, status="complete")
    await asyncio.sleep(0.2)  # (Redis: the publisher's pipelines are written)
    got = await collect(reader, store, debate_id, after=2)
    assert [e.id for e in got] == [3, 4, 100_005, 100_006, 100_007]


async def test_stored_events_published_while_redis_was_down_reach_it_before_newer_ones(
    redis_server: RedisServer, store: Store
) -> None:
    """The chaos run's invariant iv, the second path: the runner's bus was down for a moment (a read
    timed out under load marks it so for ``retry_s``) while it published turn_started 2 and 3, not
    yet in the store (the runner writes it every few events). Dropped, they were lost to a stream
    that read 4 from Redis next: its gap fill found nothing in the store. They wait in a backlog and
    go first when Redis answers again; the token deltas of the outage are dropped, as before."""
    runner = RedisBus(redis_server.url, wait_s=0.2, poll_s=0.05, retry_s=0.2)
    reader = RedisBus(redis_server.url, wait_s=0.2, poll_s=0.05)
    await runner.start()
    await reader.start()
    try:
        debate_id = running(store)
        runner.publish(debate_id, [ev(1, "debate_started")], epoch=1)
        await until(lambda: not runner._pending, "the first event published")
        runner._failed("a test", TimeoutError("Timeout connecting to server"))
        runner.publish(debate_id, [ev(2, "turn_started"), ev(3, "turn_started"), ev(4, "token")], epoch=1)
        await asyncio.sleep(0.3)  # Redis is tried again
        runner.publish(debate_id, [ev(5, "token"), ev(6, "turn_done")], epoch=1)
        runner.publish(debate_id, [ev(7, "debate_done")], epoch=1)
        got = await collect(reader, store, debate_id)  # the store holds none of them yet
        assert [(e.id, e.name) for e in got] == [
            (1, "debate_started"), (2, "turn_started"), (3, "turn_started"), (5, "token"), (6, "turn_done"),
            (7, "debate_done"),
        ]  # fmt: skip
    finally:
        await runner.aclose()
        await reader.aclose()


async def test_a_debate_the_bus_never_saw_is_followed_in_the_store_until_it_ends(
    buses: tuple[Bus, Bus], store: Store
) -> None:
    """The replica running it has no bus (or Redis was down): the stream polls the store."""
    _, reader = buses
    debate_id = running(store)
    stored(store, debate_id, [ev(1, "debate_started"), ev(2)])
    task = asyncio.create_task(collect(reader, store, debate_id))
    await asyncio.sleep(0.4)
    stored(store, debate_id, [ev(5), ev(6, "debate_done")], status="complete")
    assert [e.id for e in await task] == [1, 2, 5, 6]


async def test_a_cancel_reaches_the_replica_running_the_debate(buses: tuple[Bus, Bus]) -> None:
    runner, reader = buses
    heard: list[str] = []
    runner.on_cancel(heard.append)
    debate_id = uuid.uuid4().hex
    deadline = time.monotonic() + HANG_S
    while debate_id not in heard:  # (Redis: the runner's listener subscribes a moment after it starts)
        assert await reader.request_cancel(debate_id)
        assert time.monotonic() < deadline, "the cancel never arrived"
        await asyncio.sleep(0.1)


async def test_when_redis_dies_streams_read_the_store_and_nothing_stored_is_lost(store: Store) -> None:
    redis = RedisServer().start()
    runner = RedisBus(redis.url, wait_s=0.2, poll_s=0.05, retry_s=0.5)
    reader = RedisBus(redis.url, wait_s=0.2, poll_s=0.05, retry_s=0.5)
    try:
        debate_id = running(store)
        seen: list[BusEvent] = []
        task = asyncio.create_task(collect(reader, store, debate_id, into=seen))
        before = [ev(1, "debate_started"), ev(2, "token"), ev(3)]
        runner.publish(debate_id, before)
        stored(store, debate_id, before)
        await until(lambda: len(seen) == 3, "the first events, through Redis")
        assert seen == before  # the token too: it came through Redis
        redis.stop()  # mid-debate
        after = [ev(4, "token"), ev(5), ev(6, "token"), ev(7, "round_done"), ev(8, "debate_done")]
        for e in after:
            runner.publish(debate_id, [e])  # the debate goes on: publishing neither raises nor blocks
            await asyncio.sleep(0.05)
        stored(store, debate_id, after, status="complete")
        got = await task
        ids = [e.id for e in got]
        assert ids == sorted(set(ids)) and ids[:3] == [1, 2, 3]
        assert {1, 3, 5, 7, 8} <= set(ids)  # every stored event, each once
        # A stream opened while Redis is down reads the store.
        assert [e.id for e in await collect(reader, store, debate_id, after=3)] == [5, 7, 8]
    finally:
        await runner.aclose()
        await reader.aclose()
        redis.close()


async def test_a_claim_of_a_debates_redis_stream_refuses_the_events_of_older_claims(
    redis_server: RedisServer, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """A replica taking a debate over claims its stream with its epoch: it learns the last id there
    at that moment, and from then on the events of the replica it took over from (stopped past its
    lease, then back: SIGCONT) are refused, so no stream shows them after the take-over's."""
    import redis as redis_client

    from moot.server.state.bus import events_key

    old = RedisBus(redis_server.url, wait_s=0.2, poll_s=0.05)
    new = RedisBus(redis_server.url, wait_s=0.2, poll_s=0.05)
    client = redis_client.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        debate_id = running(store)
        old.publish(debate_id, [ev(1, "debate_started"), ev(2, "token"), ev(3, "token")], epoch=1)
        deadline = time.monotonic() + HANG_S
        while await new.last_id(debate_id) != 3:
            assert time.monotonic() < deadline, "the first events never reached Redis"
            await asyncio.sleep(0.02)
        assert await new.claim(debate_id, 2) == 3
        old.publish(debate_id, [ev(4, "token"), ev(5, "turn_started")], epoch=1)  # back from SIGSTOP
        new.publish(debate_id, [ev(100_004, "resumed"), ev(100_005, "token")], epoch=2)
        await until(lambda: len(client.xrange(events_key(debate_id))) >= 5, "the new replica's events")
        await asyncio.sleep(0.3)  # (the old one's, had they been taken, would be there by now)
        ids = [int(str(i).split("-")[0]) for i, _ in client.xrange(events_key(debate_id))]
        assert ids == [1, 2, 3, 100_004, 100_005]
        assert "another replica has claimed the debate since" in caplog.text  # said once, by the old one
        assert await new.claim(debate_id, 1) == 100_005  # an older claim changes nothing
        new.publish(debate_id, [ev(100_006, "debate_done")], epoch=2)
        await until(lambda: len(client.xrange(events_key(debate_id))) == 6, "the end")
    finally:
        client.close()
        await old.aclose()
        await new.aclose()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_the_store_keeps_the_cancels_requested_of_debates(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if backend == "sqlite":
        store = open_store(tmp_path / "moot.sqlite")
    else:
        cluster = request.getfixturevalue("pg_cluster")
        store = open_store(cluster.url(cluster.create_database()))
    try:
        a, b = running(store), running(store)
        assert store.schema_version() >= 4  # 4: cancel_requested
        assert store.cancel_requested([a, b]) == [] and store.cancel_requested([]) == []
        assert store.request_cancel(a)
        assert store.cancel_requested([a, b]) == [a]
        store.write_one(Write(b, None, status="complete"))
        assert not store.request_cancel(b) and not store.request_cancel("nope")  # ended, or unknown
        store.write_one(Write(a, None, status="cancelled"))
        assert store.cancel_requested([a, b]) == [a]  # the mark stays once it has ended
    finally:
        store.close()


# ------------------------------------------------------------------------------- a wrong Redis URL


def test_a_wrong_redis_url_is_refused_in_one_line_with_the_password_redacted() -> None:
    guarded = RedisServer(password="the-right-one").start()
    try:
        closed = free_port()  # nothing listens there
        for url, expected in (
            (f"redis://:hunter2secret@127.0.0.1:{closed}/0", "Redis cannot be used"),
            ("http://user:hunter2secret@127.0.0.1:6379/0", "not a Redis URL"),
            (f"redis://:hunter2secret@127.0.0.1:{guarded.port}/0", "Redis cannot be used"),  # a wrong password
        ):
            with pytest.raises(BusError) as caught:
                check_redis(url)
            message = str(caught.value)
            assert expected in message and "hunter2secret" not in message and "***" in message, message
            assert "\n" not in message
        check_redis(guarded.url)  # the right one passes
        # None given: said so, not Redis's "HELLO must be called with the client already authenticated"
        with pytest.raises(BusError, match="Redis asks for a password and the URL gives none"):
            check_redis(f"redis://127.0.0.1:{guarded.port}/0")
    finally:
        guarded.close()


def test_moot_serve_refuses_a_wrong_redis_url_at_start_with_exit_2(tmp_path: Path) -> None:
    closed = free_port()
    env = {**os.environ, "OPENAI_API_KEY": FAKE_KEY, "MOOT_REDIS_URL": f"redis://:hunter2secret@127.0.0.1:{closed}/0"}
    src = str(Path(__file__).resolve().parent.parent / "src")
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run(
        [sys.executable, "-m", "moot", "serve", "--db", str(tmp_path / "m.sqlite"), "--models", "openai:fake"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith("error: --redis redis://:***@127.0.0.1"), lines
    assert "hunter2secret" not in done.stderr + done.stdout


# ------------------------------------------------------------------ two replicas, one store, one bus


def two_replicas(
    stack: ExitStack, pg_url: str, redis_url: str | None, **overrides: Any
) -> tuple[ServerThread, ServerThread, FakeOpenAIServer]:
    """Two ``moot serve`` apps (each its own event loop and store connection) on one PostgreSQL
    database and, when given, one Redis: replica A runs the debates submitted to it."""
    fake = stack.enter_context(FakeOpenAIServer(latency=overrides.pop("latency", 0.05)))
    servers = []
    for _ in range(2):
        settings = ServerSettings(
            db_url=SecretStr(pg_url),
            redis_url=SecretStr(redis_url) if redis_url else None,
            models=["openai:fake"],
            base_url=fake.base_url,
            keepalive_s=0.2,
            **overrides,
        )
        servers.append(stack.enter_context(ServerThread(settings)))
    return servers[0], servers[1], fake


@pytest.fixture
def pg_url(pg_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    database = pg_cluster.create_database()
    yield pg_cluster.url(database)
    pg_cluster.drop_database(database)


def submit(url: str) -> str:
    response = httpx.post(url + "/v1/debates", json={"question": "Is 7 prime?"}, timeout=30)
    assert response.status_code == 202, response.text
    debate_id: str = response.json()["id"]
    return debate_id


@pytest.mark.parametrize("with_redis", [True, False], ids=["redis", "store-polling"])
def test_a_stream_on_the_other_replica_gets_the_debate_and_resumes_on_either(
    with_redis: bool, pg_url: str, request: pytest.FixtureRequest
) -> None:
    redis_url = request.getfixturevalue("redis_server").url if with_redis else None
    with ExitStack() as stack:
        a, b, _ = two_replicas(stack, pg_url, redis_url, latency=0.1)
        debate_id = submit(a.url)
        with ThreadPoolExecutor(2) as pool:  # both opened while A runs it: live readers
            reading_b = pool.submit(read_events, f"{b.url}/v1/debates/{debate_id}/events")
            on_a = read_events(f"{a.url}/v1/debates/{debate_id}/events")  # A's own log, tokens included
            on_b = reading_b.result()
        assert on_a[-1]["event"] == "debate_done" and on_a[-1]["data"]["status"] == "complete"
        assert [e["id"] for e in on_a] == list(range(1, len(on_a) + 1))
        assert any(e["event"] == "token" for e in on_a)
        if with_redis:
            assert on_b == on_a  # every event, token deltas included, under the same ids
        else:
            assert on_b == [e for e in on_a if e["event"] != "token"]  # the stored events, polled

        # Resume across replicas: part on B, the rest on A with Last-Event-ID, and the other way.
        second = submit(a.url)
        first_part = read_events(f"{b.url}/v1/debates/{second}/events", limit=3)
        rest = read_events(f"{a.url}/v1/debates/{second}/events", after=first_part[-1]["id"])
        ids = [e["id"] for e in first_part + rest]
        assert ids == sorted(set(ids)) and rest[-1]["event"] == "debate_done"
        # read after its end, on either replica: the stored events (no token deltas: a live reader's only)
        whole = read_events(f"{a.url}/v1/debates/{second}/events")
        assert [e["id"] for e in whole] == sorted({e["id"] for e in whole}) and whole[0]["id"] == 1
        assert not any(e["event"] == "token" for e in whole)
        middle = whole[len(whole) // 2]["id"]
        on_b_after = read_events(f"{b.url}/v1/debates/{second}/events", after=middle)
        assert on_b_after == [e for e in whole if e["id"] > middle]


@pytest.mark.parametrize("with_redis", [True, False], ids=["redis", "store-polling"])
def test_a_cancel_sent_to_the_other_replica_stops_the_debate(
    with_redis: bool, pg_url: str, request: pytest.FixtureRequest
) -> None:
    redis_url = request.getfixturevalue("redis_server").url if with_redis else None
    with ExitStack() as stack:
        a, b, fake = two_replicas(stack, pg_url, redis_url)
        fake.faults.extend([Fault.delay(0.05), Fault.delay(0.05), Fault.delay(60), Fault.delay(60)])
        debate_id = submit(a.url)

        def round_one_stored() -> bool:
            result = httpx.get(f"{b.url}/v1/debates/{debate_id}").json()["result"]
            return bool(result and result["rounds"] and len(result["rounds"][0]["turns"]) == 2)

        wait_for(round_one_stored, "round 1 to be stored")  # round 2 is in flight on A, for 60 s
        t0 = time.monotonic()
        response = httpx.post(f"{b.url}/v1/debates/{debate_id}/cancel", timeout=30)
        took = time.monotonic() - t0
        assert response.status_code == 200, response.text
        info = response.json()
        assert info["status"] == "cancelled" and "cancelled by a request" in info["error"]
        assert took < 10  # (Redis: at once; without it, A's next check of the store, every second)
        events = read_events(f"{a.url}/v1/debates/{debate_id}/events")
        assert events[-1]["event"] == "debate_done" and events[-1]["data"]["status"] == "cancelled"
        assert [e["event"] for e in events].count("debate_done") == 1
        again = httpx.post(f"{b.url}/v1/debates/{debate_id}/cancel")
        assert again.status_code == 409 and "already ended" in again.json()["error"]["message"]


def test_every_door_cancels_a_debate_on_the_other_replica(pg_url: str) -> None:
    """A Responses cancel, a Responses delete and the MCP tool ``cancel_debate``, sent to the replica
    that does not run the debate, stop it where it runs, as the native cancel does (they cancelled only
    a debate of their own replica's: a 200 saying in_progress, and the debate went on to its end)."""
    import httpx2  # the mcp SDK's HTTP client
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    with ExitStack() as stack:
        a, b, fake = two_replicas(stack, pg_url, None)
        fake.faults.extend([Fault.delay(60)] * 12)  # every debate below waits in its first call
        body = {"model": "moot/single", "input": "Is 7 prime?", "background": True}
        made = [httpx.post(a.url + "/v1/responses", json=body, timeout=30).json()["id"] for _ in range(2)]
        for response_id in made:
            debate_id = response_id.removeprefix("resp_")
            wait_for(lambda d=debate_id: httpx.get(f"{b.url}/v1/debates/{d}").json()["status"] == "running", "a start")
        cancelled = httpx.post(f"{b.url}/v1/responses/{made[0]}/cancel", timeout=30)
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled", cancelled.text
        deleted = httpx.delete(f"{b.url}/v1/responses/{made[1]}", timeout=30)
        assert deleted.status_code == 200 and deleted.json()["deleted"] is True
        assert httpx.get(f"{a.url}/v1/debates/{made[1].removeprefix('resp_')}").status_code == 404
        # (A kept the finished log of the debate it ran: no proof that the debate still exists.)
        assert httpx.get(f"{a.url}/v1/debates/{made[1].removeprefix('resp_')}/events").status_code == 404
        debate_id = submit(a.url)
        wait_for(lambda: httpx.get(f"{b.url}/v1/debates/{debate_id}").json()["status"] == "running", "a start")

        async def cancel_over_mcp() -> dict[str, Any]:
            transport = streamable_http_client(b.url + "/mcp", http_client=httpx2.AsyncClient(timeout=60))
            async with Client(transport, read_timeout_seconds=60) as client:
                result = await client.call_tool("cancel_debate", {"debate_id": debate_id})
                assert not result.is_error, result
                return dict(result.structured_content or {})

        assert asyncio.run(cancel_over_mcp())["status"] == "cancelled"
        assert httpx.get(f"{a.url}/v1/debates/{debate_id}").json()["status"] == "cancelled"


def test_a_background_response_replayed_on_the_other_replica_follows_it_to_its_end(pg_url: str) -> None:
    """The replay of a background response (``stream=true`` on GET) on a replica that does not run it
    follows the debate in the store until it ends (it read a snapshot, and ended early, in_progress)."""
    with ExitStack() as stack:
        a, b, fake = two_replicas(stack, pg_url, None)
        fake.faults.extend([Fault.delay(1.5)])
        body = {"model": "moot/single", "input": "Is 7 prime?", "background": True}
        response_id = httpx.post(a.url + "/v1/responses", json=body, timeout=30).json()["id"]
        debate_id = response_id.removeprefix("resp_")
        wait_for(lambda: httpx.get(f"{b.url}/v1/debates/{debate_id}").json()["status"] == "running", "a start")
        with httpx.stream("GET", f"{b.url}/v1/responses/{response_id}", params={"stream": "true"}, timeout=60) as got:
            kinds = [json.loads(line[5:])["type"] for line in got.iter_lines() if line.startswith("data:")]
        assert kinds[-1] == "response.completed", kinds


def test_redis_killed_mid_debate_the_stream_on_the_other_replica_ends_from_the_store(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis dies while a debate runs on A and B streams it: A's debate goes on and is stored whole;
    B's stream goes on from the store (each stored event once, in order) to the debate's end."""
    redis = RedisServer(password="bus-secret-pw").start()
    try:
        with ExitStack() as stack:
            a, b, _ = two_replicas(stack, pg_url, redis.url, latency=0.3)
            debate_id = submit(a.url)
            got: list[list[dict[str, Any]]] = []

            def stream() -> None:
                got.append(read_events(f"{b.url}/v1/debates/{debate_id}/events"))

            reader = threading.Thread(target=stream)
            reader.start()
            wait_for(lambda: httpx.get(f"{b.url}/v1/debates/{debate_id}").json()["calls"] >= 1, "a first turn")
            redis.stop()  # mid-debate
            reader.join(HANG_S * 2)
            assert not reader.is_alive() and got
            events = got[0]
            info = httpx.get(f"{a.url}/v1/debates/{debate_id}").json()
            assert info["status"] == "complete"  # the debate went on without Redis
            stored = read_events(f"{a.url}/v1/debates/{debate_id}/events")
            ids = [e["id"] for e in events]
            assert ids == sorted(set(ids)) and events[-1]["event"] == "debate_done"
            assert {e["id"] for e in stored if e["event"] != "token"} <= set(ids)  # nothing stored missed
            assert "bus-secret-pw" not in caplog.text
            assert f"Redis (redis://:***@127.0.0.1:{redis.port}/0) failed" in caplog.text  # said once, redacted
    finally:
        redis.close()


def test_moot_serve_with_redis_runs_a_debate_and_names_redis_redacted(tmp_path: Path) -> None:
    """``moot serve`` as a process, MOOT_REDIS_URL set: the banner names the bus with its password as
    ***, and a debate's events reach Redis's stream under moot's ids."""
    import redis as redis_client

    bus = RedisServer(password="serve-secret-pw").start()
    log = tmp_path / "serve.log"
    port = free_port()
    try:
        with FakeOpenAIServer(latency=0.01) as fake:
            args = ["--port", str(port), "--db", str(tmp_path / "m.sqlite"), "--models", "openai:fake"]
            proc = serve_process([*args, "--base-url", fake.base_url], log, env={"MOOT_REDIS_URL": bus.url})
            try:
                url = f"http://127.0.0.1:{port}"
                wait_until_up(url, proc)
                debate_id = submit(url)
                events = read_events(f"{url}/v1/debates/{debate_id}/events")
                assert events[-1]["event"] == "debate_done"
                client = redis_client.Redis.from_url(bus.url, decode_responses=True)
                # The stream read them from this replica's own log: the bus's writes may trail it by
                # a batch (the last events reached Redis a moment later on a loaded machine).
                entries: list[Any] = []

                def published() -> bool:
                    entries[:] = list(client.xrange(f"moot:events:{debate_id}") or [])
                    return len(entries) >= len(events)

                wait_for(published, "the events on Redis", timeout=30)
                client.close()
                assert [int(str(i).split("-")[0]) for i, _ in entries] == [e["id"] for e in events]
            finally:
                proc.terminate()
                proc.wait(60)
        text = log.read_text()
        assert f"live events: redis://:***@127.0.0.1:{bus.port}/0" in text and "serve-secret-pw" not in text
    finally:
        bus.close()


@pytest.mark.parametrize("with_redis", [True, False], ids=["redis", "store-polling"])
def test_a_cancel_sent_to_the_other_replica_of_a_debate_still_queued_ends_it_at_once(
    with_redis: bool, pg_url: str, request: pytest.FixtureRequest
) -> None:
    """A debate waiting in A's queue (A runs one at a time) is cancelled through B: B takes it from
    the store's queue and ends it; A lets it go without running or writing it, and a stream on A
    ends with B's debate_done."""
    redis_url = request.getfixturevalue("redis_server").url if with_redis else None
    with ExitStack() as stack:
        # No poller looks at the queue meanwhile (poll_s): B's, free, would take the waiting debate
        # and run it before the cancel arrives on a loaded machine (it then has a result).
        a, b, fake = two_replicas(stack, pg_url, redis_url, max_running=1, poll_s=120)
        fake.faults.extend([Fault.delay(60), Fault.delay(60)])
        busy, waiting = submit(a.url), submit(a.url)
        wait_for(lambda: httpx.get(f"{a.url}/v1/debates/{busy}").json()["status"] == "running", "the first to run")
        response = httpx.post(f"{b.url}/v1/debates/{waiting}/cancel", timeout=30)
        assert response.status_code == 200 and response.json()["status"] == "cancelled", response.text
        assert response.json()["result"] is None
        events = read_events(f"{a.url}/v1/debates/{waiting}/events")  # A's stream ends at once
        assert [e["event"] for e in events] == ["debate_done"] and events[0]["data"]["status"] == "cancelled"
        calls = len(fake.requests)
        assert httpx.post(f"{a.url}/v1/debates/{busy}/cancel", timeout=30).json()["status"] == "cancelled"
        time.sleep(1.0)
        assert len(fake.requests) == calls  # the cancelled one never ran on A
        assert httpx.get(f"{a.url}/v1/debates/{waiting}").json()["status"] == "cancelled"


@pytest.mark.parametrize("with_redis", [True, False], ids=["redis", "store-polling"])
def test_a_request_not_streamed_whose_debate_another_replica_takes_from_the_queue_gets_its_answer(
    with_redis: bool, pg_url: str, request: pytest.FixtureRequest
) -> None:
    """A chat completion or a response, not streamed, sent to a replica whose slots are all taken waits
    in the shared queue; another replica takes it and runs it. It was answered 502 (debate_interrupted)
    by the first within a second while its debate went on and finished on the other, and the SDK's
    retries then ran it twice more. It now waits for that end and answers it."""
    import concurrent.futures

    redis_url = request.getfixturevalue("redis_server").url if with_redis else None
    with ExitStack() as stack:
        a, b, _ = two_replicas(stack, pg_url, redis_url, max_running=1, poll_s=0.2, latency=0.3)
        busy = submit(a.url)
        wait_for(lambda: httpx.get(f"{a.url}/v1/debates/{busy}").json()["status"] == "running", "the first to run")
        chat = {"model": "moot/single", "messages": [{"role": "user", "content": "Is 7 prime?"}]}
        asks = [
            ("/v1/chat/completions", chat),
            ("/v1/responses", {"model": "moot/single", "input": "Is 7 prime?"}),
            ("/v1/responses", {"model": "moot/single", "input": "Is 7 prime?", "store": False}),
        ]
        with concurrent.futures.ThreadPoolExecutor(len(asks)) as pool:
            answers = list(pool.map(lambda ask: httpx.post(a.url + ask[0], json=ask[1], timeout=120), asks))
        for answer in answers:
            assert answer.status_code == 200, answer.text
        ids = [answer.headers["x-moot-debate-id"] for answer in answers]
        ran = {httpx.get(f"{b.url}/v1/debates/{i}").json()["status"] for i in ids}
        assert ran == {"complete"}
        assert answers[0].json()["choices"][0]["message"]["content"]
        assert answers[1].json()["status"] == answers[2].json()["status"] == "completed"
        assert len(httpx.get(f"{a.url}/v1/debates").json()["debates"]) == 1 + len(asks)  # no debate twice
        # a stored response the other replica ran replays alike on both, the same numbers for the
        # same events (the replica that let it go numbered it from its own short log)
        busy = submit(a.url)
        wait_for(lambda: httpx.get(f"{a.url}/v1/debates/{busy}").json()["status"] == "running", "the next to run")
        made = httpx.post(a.url + "/v1/responses", json={**asks[1][1], "background": True}, timeout=30).json()
        wait_for(lambda: httpx.get(f"{a.url}/v1/responses/{made['id']}").json()["status"] == "completed", "its end")

        def replayed(url: str) -> list[tuple[int, str]]:
            text = httpx.get(f"{url}/v1/responses/{made['id']}", params={"stream": "true"}, timeout=60).text
            events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
            return [(e["sequence_number"], e["type"]) for e in events]

        on_a, on_b = replayed(a.url), replayed(b.url)
        assert on_a == on_b and "response.in_progress" in [kind for _, kind in on_a], (on_a, on_b)


def replayed_response(url: str, response_id: str) -> list[tuple[int, str]]:
    text = httpx.get(f"{url}/v1/responses/{response_id}", params={"stream": "true"}, timeout=60).text
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    return [(e["sequence_number"], e["type"]) for e in events]


def test_a_stored_response_replayed_on_the_replica_that_lets_it_go_misses_none_of_its_events(pg_url: str) -> None:
    """A background response waits in A's queue (its one slot busy); B takes it and ends it. A stream
    of it opened on A before A sees that follows A's log of it (queued only), which closes when A
    lets it go: it went on to the end without B's events (no ``response.in_progress``, no trace),
    as a CI run caught when A's look at the queue came late. It now goes on from the store."""
    import concurrent.futures

    with ExitStack() as stack:
        # A looks for debates taken from its queue only when its slot frees (cancel_poll_s): a
        # stream opened meanwhile follows A's own log of the response.
        a, b, fake = two_replicas(stack, pg_url, None, max_running=1, poll_s=0.2, cancel_poll_s=300)
        fake.faults.append(Fault.delay(60))  # the busy debate's first call
        busy = submit(a.url)
        wait_for(lambda: httpx.get(f"{a.url}/v1/debates/{busy}").json()["status"] == "running", "the first to run")
        asked = {"model": "moot/single", "input": "Is 7 prime?", "background": True, "moot": {"trace": True}}
        made = httpx.post(a.url + "/v1/responses", json=asked, timeout=30).json()
        wait_for(lambda: httpx.get(f"{b.url}/v1/responses/{made['id']}").json()["status"] == "completed", "its end")
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            on_a = pool.submit(replayed_response, a.url, made["id"])
            time.sleep(1.0)
            assert not on_a.done()  # it follows A's log, which A holds open
            assert httpx.post(f"{a.url}/v1/debates/{busy}/cancel", timeout=30).json()["status"] == "cancelled"
            replay = on_a.result(timeout=60)
        kinds = [kind for _, kind in replay]
        assert "response.in_progress" in kinds and "response.reasoning_text.done" in kinds, replay
        assert replay == replayed_response(b.url, made["id"])


def test_a_request_waiting_for_a_debate_another_replica_runs_is_answered_when_its_server_stops(pg_url: str) -> None:
    """Its debate let go to another replica, a chat completion not streamed follows it there; when its
    own server stops meanwhile it is answered at once (503 server_stopping, where the debate went)
    instead of waiting out the stop, and the other replica finishes the debate."""
    import concurrent.futures

    with ExitStack() as stack:
        a, b, _ = two_replicas(stack, pg_url, None, max_running=1, poll_s=0.2, latency=3.0)
        busy = submit(a.url)
        wait_for(lambda: httpx.get(f"{a.url}/v1/debates/{busy}").json()["status"] == "running", "the first to run")
        chat = {"model": "moot/affirmative-critical", "messages": [{"role": "user", "content": "Is 7 prime?"}]}
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            asked = pool.submit(lambda: httpx.post(a.url + "/v1/chat/completions", json=chat, timeout=120))

            def on_b() -> list[str]:
                listed = httpx.get(f"{b.url}/v1/debates", params={"status": "running"}).json()["debates"]
                return [d["id"] for d in listed if d["id"] != busy]

            taken = wait_for(on_b, "the chat's debate to run on the other replica")
            time.sleep(2.0)  # A lets it go within a second of B's claim (else A hands it back: 503 too)
            from moot.server.http.streams import stop_streams

            assert a.server._loop is not None
            a.server._loop.call_soon_threadsafe(stop_streams)  # (what moot serve's SIGTERM does)
            answer = asked.result(timeout=60)
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"]["code"] == "server_stopping" and "goes on at another replica" in answer.text
        wait_for(
            lambda: httpx.get(f"{b.url}/v1/debates/{taken[0]}").json()["status"] == "complete", "the other to finish it"
        )


def test_a_stored_responses_replay_following_another_replica_ends_when_its_server_stops(pg_url: str) -> None:
    """A background response running on B, its stream read again on A (followed from the store):
    when A stops, the stream says where the debate went and ends at once. It went on polling the
    store until A's grace cut it, with no word."""
    import concurrent.futures

    with ExitStack() as stack:
        a, b, fake = two_replicas(stack, pg_url, None, shutdown_grace_s=60)
        fake.faults.append(Fault.delay(60))  # the response's first call: it runs on B meanwhile
        asked = {"model": "moot/single", "input": "Is 7 prime?", "background": True}
        made = httpx.post(b.url + "/v1/responses", json=asked, timeout=30).json()
        wait_for(lambda: httpx.get(f"{b.url}/v1/debates/{made['id'][5:]}").json()["status"] == "running", "its run")
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            on_a = pool.submit(replayed_response, a.url, made["id"])
            time.sleep(1.5)
            assert not on_a.done()  # following it in the store
            from moot.server.http.streams import stop_streams

            assert a.server._loop is not None
            began = time.monotonic()
            a.server._loop.call_soon_threadsafe(stop_streams)  # (what moot serve's SIGTERM does)
            replay = on_a.result(timeout=55)
        assert time.monotonic() - began < 30  # not the grace's 60 s
        assert replay[-1][1] == "error" and "response.in_progress" in [kind for _, kind in replay], replay


async def test_a_cancel_of_a_debate_handed_back_mid_run_marks_it_and_leaves_it_claimable(store: Store) -> None:
    """A running debate no replica holds (handed back at a SIGTERM) is not claimed away by the
    cancel: it is marked, so the replica that resumes it cancels it, and stays claimable at once."""
    from moot.server.state.manager import DebateManager

    manager = DebateManager(ServerSettings(db=Path("unused.sqlite"), cancel_wait_s=0.2), store)
    debate_id = running(store)
    claim = store.claim("replica-A", 30, debate_id=debate_id)
    assert claim is not None
    store.release(debate_id, claim.epoch)
    assert await manager.cancel_anywhere(debate_id) is None  # asked; no replica runs it yet
    assert store.cancel_requested([debate_id]) == [debate_id]
    # Handed back: the owner is kept (to name the previous replica when another resumes it), its
    # lease is over, so another replica claims it at once.
    owner, _ = store.lease(debate_id)
    assert owner == "replica-A" and store.claim("replica-B", 30, debate_id=debate_id) is not None
    await manager.shutdown()


def test_a_debate_taken_over_numbers_its_events_above_the_ids_the_dead_replica_sent_through_redis(
    pg_url: str, redis_server: RedisServer
) -> None:
    """Replica A ran a debate and published token deltas (never stored) and a turn's start (not stored
    yet) to Redis, then died. B takes it over: its events are numbered above every id A gave out, so
    a client that read A's events through Redis and resumes with its Last-Event-ID gets every event
    B stores (none hidden under an id it had already seen), the ids only go up, and Redis accepts
    B's events (a stream's ids must grow)."""
    import redis as redis_client

    from moot.core.types import DebateResult, DebateTask, Round, Turn
    from moot.server.schemas import DebateRequest
    from moot.server.state import StoredEvent
    from moot.server.state.bus import events_key
    from moot.server.state.postgres import PostgresStore

    store = PostgresStore(pg_url, application_name="moot tests")
    client = redis_client.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        question = "Is 11 prime?"
        request = DebateRequest.model_validate({"question": question, "rounds": 2, "model": "openai:fake"})
        debate_id = uuid.uuid4().hex
        store.create(
            debate_id, protocol="affirmative-critical", question=question, model="openai:fake",
            request=request.model_dump(mode="json", by_alias=True),
        )  # fmt: skip
        dead = store.claim("dead-host:1:dead", 1)
        assert dead is not None and dead.debate_id == debate_id
        turn = Turn(speaker="affirmative", name="Affirmative", round=1, model="openai:fake", messages=[],
                    text="Yes, 11 is prime.", calls=1)  # fmt: skip
        partial = DebateResult(protocol="affirmative-critical", task=DebateTask(question=question),
                               rounds=[Round(index=1, turns=[turn])], llm_calls=1)  # fmt: skip
        started = [StoredEvent(id=1, name="debate_started", data="{}"), StoredEvent(id=2, name="turn_done", data="{}")]
        store.write_one(Write(debate_id, partial, started, started=now(), epoch=dead.epoch))
        # What A sent through Redis: its stored events, then the critic's tokens and (not stored yet) more.
        sent = [(1, "debate_started"), (2, "turn_done"), (3, "turn_started")]
        sent += [(i, "token") for i in range(4, 12)]
        for i, name in sent:
            client.xadd(events_key(debate_id), {"n": name, "d": json.dumps({"i": i})}, id=f"{i}-0")
        seen_by_client = 11  # the client read them all, then A died

        with FakeOpenAIServer(latency=0.05) as fake:
            settings = ServerSettings(
                models=["openai:fake"], base_url=fake.base_url, db_url=SecretStr(pg_url),
                redis_url=SecretStr(redis_server.url), lease_s=3, poll_s=0.2,
            )  # fmt: skip
            with ServerThread(settings) as b:
                wait_for(lambda: store.lease(debate_id)[0] not in (None, "dead-host:1:dead"), "B to take it over")
                resumed = read_events(f"{b.url}/v1/debates/{debate_id}/events", after=seen_by_client)
                whole = read_events(f"{b.url}/v1/debates/{debate_id}/events")
        row = store.get(debate_id)
        assert row is not None and row.status == "complete", row
        stored_ids = [e.id for e in store.events(debate_id)]
        assert stored_ids == sorted(set(stored_ids))
        # The resuming client: every event B stored, after the ones it had, in order, each once.
        ids = [e["id"] for e in resumed]
        assert resumed[0]["event"] == "resumed" and resumed[-1]["event"] == "debate_done"
        assert ids == sorted(set(ids)) and ids[0] > seen_by_client
        assert set(stored_ids) <= set(range(1, seen_by_client + 1)) | set(ids)  # no stored event skipped
        # A client from the start: the ids only go up, no id twice.
        whole_ids = [e["id"] for e in whole]
        assert whole_ids == sorted(set(whole_ids)) and set(stored_ids) <= set(whole_ids)
        # Redis took B's events (above A's ids): a stream reading Redis gets them too.
        in_redis = [int(str(i).split("-")[0]) for i, _ in client.xrange(events_key(debate_id))]
        assert in_redis[: len(sent)] == [i for i, _ in sent]
        assert {i for i in stored_ids if i > seen_by_client} <= set(in_redis)
    finally:
        client.close()
        store.close()
