"""API keys kept hashed in the store (``moot serve keys``), their limits for the whole deployment and
their usage (issue 40, item 5): the store's side on SQLite and PostgreSQL alike (the contract's
fixtures), the HTTP side on a real loopback port, and the CLI."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from typer.testing import CliRunner
from websockets.exceptions import ConnectionClosed

from moot.cli.main import app
from moot.core.types import DebateCost
from moot.server import ServerSettings
from moot.server.state import SCHEMA_VERSION, StoredEvent, Write, open_store
from moot.server.state.keys import (
    KEY_PREFIX,
    ApiKey,
    DuplicateKeyName,
    LimitReached,
    UnknownKey,
    check_name,
    key_hash,
    new_key,
)
from moot.server.state.sql import SqlStore
from moot.testing.fake_openai import FakeOpenAIServer
from pg_cluster import PgCluster
from serving import FAKE_KEY, ServerThread, wait_for
from test_store_contract import Backend, result_with

runner = CliRunner()


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """The contract's backends (tests/test_store_contract.py): a SQLite file, a fresh PostgreSQL database."""
    if request.param == "sqlite":
        b = Backend("sqlite", str(tmp_path / "moot.sqlite"))
        database = None
    else:
        cluster: PgCluster = request.getfixturevalue("pg_cluster")
        database = cluster.create_database()
        b = Backend("postgres", cluster.url(database))
    yield b
    for s in b.opened:
        s.close()
    if database is not None:
        cluster.drop_database(database)


# ----------------------------------------------------------------------------------- the store


def create(store: SqlStore, debate_id: str, key: ApiKey | None = None, capacity: int | None = None) -> None:
    store.create(
        debate_id,
        protocol="affirmative-critical",
        question="Is 7 prime?",
        model="openai:fake",
        request={},
        key=key,
        capacity=capacity,
    )


def test_a_key_is_random_prefixed_and_kept_as_its_hash_only(backend: Backend) -> None:
    store = backend.open()
    assert store.schema_version() == SCHEMA_VERSION >= 3
    secret = new_key()
    assert secret.startswith(KEY_PREFIX) and len(secret) > 40 and new_key() != secret
    added = store.add_key("ci", key_hash(secret), rate_per_min=5, concurrency=2)
    assert added.id.startswith("key_") and added.revoked_at is None
    found = store.key_by_hash(key_hash(secret))
    assert found is not None and (found.id, found.name, found.rate_per_min, found.concurrency) == (added.id, "ci", 5, 2)
    assert store.key_by_hash(key_hash(secret + "x")) is None
    assert store.key(added.id) == found and store.has_keys()
    # the key itself is in no column of any table
    dump = json.dumps([store._read(f"SELECT * FROM {t}") for t in ("api_keys", "debates", "meta")], default=str)
    assert secret not in dump and secret[len(KEY_PREFIX) :] not in dump
    with pytest.raises(DuplicateKeyName, match="give another --name"):
        store.add_key("ci", key_hash(new_key()))


def test_revoke_by_name_or_id_once(backend: Backend) -> None:
    store = backend.open()
    assert not store.has_keys()
    a = store.add_key("a", key_hash(new_key()))
    b = store.add_key("b", key_hash(new_key()))
    revoked, now = store.revoke_key("a")
    assert now and revoked.id == a.id and revoked.revoked_at is not None
    again, now = store.revoke_key(a.id)
    assert not now and again.revoked_at == revoked.revoked_at
    assert store.revoke_key(b.id)[1]
    with pytest.raises(UnknownKey, match="moot serve keys list"):
        store.revoke_key("nobody")
    assert [k.revoked for k in store.keys()]  # noqa: SIM118 == [True, True] and store.has_keys()


def test_key_names_are_checked() -> None:
    assert check_name(" ci-1 ") == "ci-1"
    for bad in ("", "has space", "x" * 65, "key_0123456789ab", "-lead"):
        with pytest.raises(ValueError, match="not a key name"):
            check_name(bad)


def test_a_keys_concurrency_and_the_capacity_count_the_whole_store(backend: Backend) -> None:
    """Two stores on one database stand for two replicas: the limits are the deployment's."""
    a, b = backend.open(), backend.open()
    key = a.add_key("k", key_hash(new_key()), concurrency=2)
    create(a, "d1", key=key)
    create(b, "d2", key=key)
    with pytest.raises(LimitReached) as refused:
        create(a, "d3", key=key)
    assert refused.value.limit == "key_concurrency" and "'k'" in str(refused.value)
    create(b, "other")  # another key's (or no key's) debates are not this key's
    a.finish_without_result("d1", "cancelled", "cancelled", [])
    create(b, "d3", key=key)  # one ended: room again
    with pytest.raises(LimitReached) as full:
        create(b, "d4", capacity=3)
    assert full.value.limit == "capacity" and "retry later" in str(full.value)
    create(a, "d4", capacity=4)
    assert a.get("d4") is not None and b.get("d1") is not None


def test_usage_is_counted_once_when_a_debate_ends(backend: Backend) -> None:
    store = backend.open()
    key = store.add_key("u", key_hash(new_key()))
    create(store, "d1", key=key)
    create(store, "d2", key=key)
    create(store, "d3")  # no key: counted nowhere
    claim = store.claim("r", 60, debate_id="d1")
    assert claim is not None
    store.write_one(Write("d1", result_with(1), [], started="2026-01-01T00:00:00.000+00:00", epoch=claim.epoch))
    assert store.key(key.id).usage.debates == 0  # type: ignore[union-attr]
    done = result_with(2, status="complete")
    done.cost = DebateCost(usd=0.25)
    store.write("d1", done, [StoredEvent(id=1, name="debate_done", data="{}")], status="complete", epoch=claim.epoch)
    # a second end of the same debate (a recovery, a retry) is not counted again
    store.write("d1", done, [], status="failed", error="again")
    unpriced = result_with(1, status="failed")
    store.write("d2", unpriced, [], status="failed", error="model down")
    store.write("d3", result_with(3, status="complete"), [], status="complete")
    usage = store.key(key.id).usage  # type: ignore[union-attr]
    assert (usage.debates, usage.calls, usage.tokens, usage.usd, usage.unpriced_debates) == (2, 3, 45, 0.25, 1)


def test_usage_of_debates_ending_together_is_counted_once_each(backend: Backend) -> None:
    """The writes of one moment share a transaction (SqlStore.write_all): debates of two keys and of
    none ending in it are each counted once, the keys' rows updated in one order (PostgreSQL: two
    replicas' batches never wait on each other in a cycle), and a stale epoch among them counts nothing."""
    store = backend.open()
    first, second = store.add_key("a", key_hash(new_key())), store.add_key("b", key_hash(new_key()))
    for debate_id, key in (("d1", second), ("d2", first), ("d3", second), ("d4", None), ("d5", first)):
        create(store, debate_id, key=key)
        assert store.claim("r", 60, debate_id=debate_id) is not None
    done = result_with(2, status="complete")
    failures = store.write_all(
        [
            Write("d3", done, [], status="complete", epoch=1),
            Write("d1", done, [], status="complete", epoch=1),
            Write("d4", done, [], status="complete", epoch=1),
            Write("d2", done, [], status="complete", epoch=1),
            Write("d5", done, [], status="complete", epoch=9),  # another replica's now
        ]
    )
    assert [f.debate_id for f in failures] == ["d5"]
    usage = {k.name: (k.usage.debates, k.usage.calls) for k in store.keys()}  # noqa: SIM118
    assert usage == {"a": (1, 2), "b": (2, 4)}
    store.write_all([Write("d1", done, [], status="failed", epoch=1), Write("d2", done, [], status="failed", epoch=1)])
    assert {k.name: k.usage.debates for k in store.keys()} == {"a": 1, "b": 2}  # noqa: SIM118 (ended again: not counted again)


def test_a_keys_rate_is_a_window_per_minute_shared_by_replicas(backend: Backend) -> None:
    a, b = backend.open(), backend.open()
    key = a.add_key("r", key_hash(new_key()), rate_per_min=3)
    other = a.add_key("o", key_hash(new_key()), rate_per_min=1)
    # the window is the current minute: wait if it is about to end, so that the test sees one window
    if 60 - time.time() % 60 < 5:
        time.sleep(60 - time.time() % 60 + 0.5)
    assert [a.count_request(key.id, 3), b.count_request(key.id, 3), a.count_request(key.id, 3)] == [None] * 3
    wait = b.count_request(key.id, 3)
    assert wait is not None and 0 < wait <= 60
    assert a.count_request(key.id, 3) is not None  # a refused request is not counted, and is refused again
    assert a.count_request(other.id, 1) is None  # each key its own window
    rows = a._read(a._q("SELECT requests FROM key_windows WHERE key_id = ?"), (key.id,))
    assert [int(r[0]) for r in rows] == [3]
    # a key's first request of a minute clears its older windows: one row per key, not one per minute ever
    fresh = a.add_key("f", key_hash(new_key()), rate_per_min=5)
    with a._tx() as c:
        c.execute(a._q("INSERT INTO key_windows (key_id, minute, requests) VALUES (?, ?, 5)"), (fresh.id, 12))
    assert b.count_request(fresh.id, 5) is None
    rows = a._read(a._q("SELECT minute, requests FROM key_windows WHERE key_id = ?"), (fresh.id,))
    assert len(rows) == 1 and int(rows[0][1]) == 1 and int(rows[0][0]) > 12


# ------------------------------------------------------------------------------------ over HTTP


@dataclass
class Served:
    """A server (or several, on one store) on the loopback fake model, and its store to add keys."""

    servers: list[ServerThread]
    store: SqlStore
    fake: FakeOpenAIServer

    @property
    def url(self) -> str:
        return self.servers[0].url

    def add(self, name: str, **limits: int) -> tuple[str, dict[str, str]]:
        secret = new_key()
        self.store.add_key(name, key_hash(secret), **limits)
        return secret, {"Authorization": f"Bearer {secret}"}


MakeServed = Callable[..., Served]


@pytest.fixture
def serve(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MakeServed]:
    """``serve(replicas=1, postgres=False, latency=..., **settings)``: N apps on one store."""
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    with ExitStack() as stack:

        def make(replicas: int = 1, *, postgres: bool = False, latency: float = 0.01, **overrides: Any) -> Served:
            fake = stack.enter_context(FakeOpenAIServer(latency=latency))
            if postgres:
                cluster: PgCluster = request.getfixturevalue("pg_cluster")
                database = cluster.create_database()
                stack.callback(cluster.drop_database, database)
                where: dict[str, Any] = {"db_url": SecretStr(cluster.url(database))}
                target = cluster.url(database)
            else:
                where = {"db": tmp_path / "moot.sqlite"}
                target = str(tmp_path / "moot.sqlite")
            store = open_store(target)
            assert isinstance(store, SqlStore)
            stack.callback(store.close)
            settings = ServerSettings(
                models=["openai:fake"], base_url=fake.base_url, keepalive_s=0.2, **where, **overrides
            )
            servers = [stack.enter_context(ServerThread(settings)) for _ in range(replicas)]
            return Served(servers, store, fake)

        yield make


def submit(url: str, headers: dict[str, str], **body: Any) -> httpx.Response:
    return httpx.post(url + "/v1/debates", json={"question": "Is 7 prime?", **body}, headers=headers, timeout=30)


def test_store_keys_guard_the_api_and_a_revoked_key_is_refused(serve: MakeServed) -> None:
    served = serve(key_cache_s=0.2)
    # no key anywhere yet: a loopback server is open, as before
    assert httpx.get(served.url + "/v1/debates").status_code == 200
    secret, auth = served.add("alice")
    # once the store holds a key, the server needs one (within its key cache)
    wait_for(lambda: httpx.get(served.url + "/v1/debates").status_code == 401, "the server to need a key")
    assert httpx.get(served.url + "/v1/debates", headers=auth).status_code == 200
    wrong = {"Authorization": f"Bearer {secret[:-2]}xx"}
    refused = httpx.get(served.url + "/v1/debates", headers=wrong)
    assert refused.status_code == 401 and secret[:-2] not in refused.text
    # the viewer's session opened with the key is the key's: it ends with it
    with httpx.Client(base_url=served.url) as browser:
        opened = browser.post("/v1/session", headers=auth)
        assert opened.status_code == 200 and secret not in opened.text
        browser.headers["Authorization"] = f"Bearer {opened.json()['token']}"
        assert browser.get("/v1/usage").json()["name"] == "alice"
        served.store.revoke_key("alice")
        wait_for(lambda: browser.get("/v1/debates").status_code == 401, "the session to end with its key")
    gone = httpx.get(served.url + "/v1/debates", headers=auth)
    assert gone.status_code == 401 and gone.headers["www-authenticate"] == "Bearer"
    assert "Authorization: Bearer <key>" in gone.json()["error"]["message"]
    # every key revoked: the server does not open again
    assert httpx.get(served.url + "/v1/debates").status_code == 401


def test_an_idempotency_key_is_its_keys_own_through_a_viewer_session_too(serve: MakeServed) -> None:
    """A viewer's session sends its token, not the key: the same Idempotency-Key from two keys'
    sessions named one debate (the second key got the first's debate, or a 409 naming it).
    The caller is the key the request was authenticated with, however it was given."""
    served = serve(key_cache_s=0.2)
    _, alice = served.add("alice")
    _, bob = served.add("bob")
    ids = []
    for auth in (alice, bob):
        with httpx.Client(base_url=served.url) as browser:
            opened = browser.post("/v1/session", headers=auth)
            assert opened.status_code == 200
            browser.headers["Authorization"] = f"Bearer {opened.json()['token']}"
            made = browser.post(
                "/v1/debates", json={"question": "Is 7 prime?"}, headers={"Idempotency-Key": "same"}, timeout=30
            )
            assert made.status_code == 202, made.text
            ids.append(made.json()["id"])
    assert ids[0] != ids[1]
    again = submit(served.url, {**alice, "Idempotency-Key": "same"})  # the bearer is the same caller
    assert again.json()["id"] == ids[0]


def test_a_websocket_checks_its_key_at_each_message(serve: MakeServed) -> None:
    """A socket opened with a store key is held to it message by message, as HTTP requests are, each
    ``response.create`` counted in the key's rate (the upgrade alone was: five debates on a key of
    two a minute), and a key revoked while it is open ends it (it went on starting debates)."""
    from websockets.sync.client import connect

    served = serve(key_cache_s=0)
    url = served.url.replace("http://", "ws://") + "/v1/responses"
    create = json.dumps({"type": "response.create", "model": "moot/single", "input": "Is 7 prime?", "store": False})

    def reply(socket: Any) -> dict[str, Any]:
        while True:
            event: dict[str, Any] = json.loads(socket.recv(timeout=60))
            if event["type"] in ("response.completed", "response.failed", "error"):
                return event

    _, limited = served.add("limited", rate_per_min=3)
    if time.time() % 60 > 40:  # the window is the clock's minute: the three requests in one of them
        time.sleep(61 - time.time() % 60)
    with connect(url, additional_headers=limited) as socket:  # the upgrade is one request of three
        socket.send(create)
        assert reply(socket)["type"] == "response.completed"
        socket.send(create)
        assert reply(socket)["type"] == "response.completed"
        socket.send(create)
        over = reply(socket)
        assert over["status"] == 429 and over["error"]["code"] == "key_rate", over
    _, auth = served.add("revoked")
    with connect(url, additional_headers=auth) as socket:
        socket.send(create)
        assert reply(socket)["type"] == "response.completed"
        served.store.revoke_key("revoked")
        socket.send(create)
        gone = reply(socket)
        assert gone["status"] == 401 and "revoked" in gone["error"]["message"], gone
        with pytest.raises(ConnectionClosed) as closed:
            socket.recv(timeout=60)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    assert len(served.fake.requests) == 3  # the refused messages started no debate


def test_a_revoked_key_is_refused_before_the_body_is_read(serve: MakeServed) -> None:
    served = serve(key_cache_s=0)
    _, auth = served.add("bob")
    served.store.revoke_key("bob")
    with socket.create_connection(("127.0.0.1", int(served.url.rsplit(":", 1)[1])), timeout=30) as conn:
        head = (
            "POST /v1/debates HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Authorization: {auth['Authorization']}\r\nContent-Length: 100000\r\n\r\n"
        )
        conn.sendall(head.encode())  # and no body: the answer comes without it
        answer = conn.recv(65536).decode()
    assert answer.startswith("HTTP/1.1 401") and "connection: close" in answer.lower()


def test_a_keys_rate_limit_answers_429_with_retry_after_and_names_it(serve: MakeServed) -> None:
    served = serve()
    _, auth = served.add("limited", rate_per_min=2)
    _, other = served.add("free")
    if 60 - time.time() % 60 < 5:  # one minute's window for the whole test
        time.sleep(60 - time.time() % 60 + 0.5)
    assert [httpx.get(served.url + "/v1/protocols", headers=auth).status_code for _ in range(2)] == [200, 200]
    over = submit(served.url, auth)
    assert over.status_code == 429 and 1 <= int(over.headers["retry-after"]) <= 60
    error = over.json()["error"]
    assert error["code"] == "key_rate" and error["type"] == "rate_limit_error" and "'limited'" in error["message"]
    assert "rate limit" in error["message"]
    assert httpx.get(served.url + "/v1/protocols", headers=other).status_code == 200  # its own window


def test_a_keys_concurrency_limit_answers_429_and_frees_when_a_debate_ends(serve: MakeServed) -> None:
    served = serve(latency=60)
    _, auth = served.add("one-at-a-time", concurrency=1)
    _, other = served.add("other")
    first = submit(served.url, auth)
    assert first.status_code == 202
    second = submit(served.url, auth)
    assert second.status_code == 429 and int(second.headers["retry-after"]) >= 1
    error = second.json()["error"]
    assert error["code"] == "key_concurrency" and "'one-at-a-time'" in error["message"]
    assert submit(served.url, other).status_code == 202  # another key's debates are its own
    debate_id = first.json()["id"]
    cancel = httpx.post(f"{served.url}/v1/debates/{debate_id}/cancel", headers=auth, timeout=60)
    assert cancel.json()["status"] == "cancelled"
    assert submit(served.url, auth).status_code == 202


def test_usage_is_readable_by_its_own_key_only(serve: MakeServed) -> None:
    from moot.models.pricing import Price, PriceTable

    served = serve(prices=PriceTable(prices={"openai:fake": Price(input=1.0, output=2.0)}))
    _, alice = served.add("alice")
    _, bob = served.add("bob")
    debate_id = submit(served.url, alice).json()["id"]
    info = wait_for(
        lambda: (
            (r := httpx.get(f"{served.url}/v1/debates/{debate_id}", headers=alice).json())["status"] == "complete" and r
        ),
        "the debate to end",
    )
    report = wait_for(
        lambda: (u := httpx.get(served.url + "/v1/usage", headers=alice).json())["usage"]["debates"] == 1 and u,
        "alice's usage",
    )
    assert report["object"] == "usage" and report["name"] == "alice" and report["key_id"].startswith("key_")
    usage = report["usage"]
    assert usage["calls"] == info["calls"] > 0 and usage["tokens"] == info["tokens"] > 0
    assert usage["usd"] == pytest.approx(info["result"]["cost"]["usd"]) and usage["usd"] > 0
    mine = httpx.get(served.url + "/v1/usage", headers=bob).json()
    assert mine["name"] == "bob" and mine["usage"]["debates"] == 0  # never alice's
    assert "alice" not in json.dumps(mine)
    # the route takes no key id: a key reads its own usage, and nothing else
    assert httpx.get(served.url + "/v1/usage", params={"key": report["key_id"]}, headers=bob).json() == mine
    assert httpx.get(served.url + "/v1/usage").status_code == 401
    # a debate asked for as a chat completion is the key's too
    chat = {"model": "moot/single", "messages": [{"role": "user", "content": "Is 7 prime?"}]}
    assert httpx.post(served.url + "/v1/chat/completions", json=chat, headers=bob, timeout=60).status_code == 200
    wait_for(
        lambda: httpx.get(served.url + "/v1/usage", headers=bob).json()["usage"]["debates"] == 1, "bob's chat debate"
    )


def test_usage_needs_a_key_of_the_store(tmp_path: Path, serve: MakeServed) -> None:
    served = serve(api_key="moot-server-key-0123456789abcdef")
    legacy = {"Authorization": "Bearer moot-server-key-0123456789abcdef"}
    refused = httpx.get(served.url + "/v1/usage", headers=legacy)
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "no_key_usage"
    assert "moot serve keys add" in refused.json()["error"]["message"]
    _, auth = served.add("also")  # the server's own key and the store's keys both work
    assert httpx.get(served.url + "/v1/usage", headers=auth).json()["name"] == "also"
    assert httpx.get(served.url + "/v1/debates", headers=legacy).status_code == 200


def test_two_replicas_share_keys_limits_and_capacity(serve: MakeServed) -> None:
    """Two apps on one PostgreSQL database: a key added to the store (from either, or from the CLI)
    is accepted by both; its concurrency and the deployment's capacity are counted across them."""
    served = serve(replicas=2, postgres=True, latency=60, max_running=2, max_queued=0, key_cache_s=0.2)
    a, b = (s.url for s in served.servers)
    _, auth = served.add("shared", concurrency=1)
    for url in (a, b):
        wait_for(lambda u=url: httpx.get(u + "/v1/debates", headers=auth).status_code == 200, "the key on " + url)
    assert submit(a, auth).status_code == 202
    refused = submit(b, auth)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "key_concurrency"
    _, free = served.add("free")
    assert submit(b, free).status_code == 202  # the deployment holds 2 now: its capacity (2 + 0)
    full = submit(a, free)
    assert full.status_code == 429 and full.json()["error"]["code"] == "queue_full"
    assert "retry later" in full.json()["error"]["message"]
    served.store.revoke_key("shared")
    for url in (a, b):
        wait_for(lambda u=url: httpx.get(u + "/v1/debates", headers=auth).status_code == 401, "the revocation")


def test_a_key_typed_into_a_question_is_not_stored(serve: MakeServed) -> None:
    served = serve()
    secret, auth = served.add("careless")
    debate_id = submit(served.url, auth, question=f"is {secret} a key?").json()["id"]
    wait_for(
        lambda: httpx.get(f"{served.url}/v1/debates/{debate_id}", headers=auth).json()["status"] == "complete",
        "the debate",
    )
    rows = served.store._read("SELECT * FROM debates")
    events = served.store._read("SELECT * FROM events")
    assert secret not in json.dumps([rows, events], default=str)


# ------------------------------------------------------------------------------ the bind rule


def test_keys_in_the_store_count_as_a_key_for_the_bind_rule(tmp_path: Path) -> None:
    from moot.cli.serve import _has_keys

    db = tmp_path / "moot.sqlite"
    settings = ServerSettings(host="0.0.0.0", db=db)
    with pytest.raises(ValueError, match="moot serve keys add"):
        settings.check_bind()
    assert not _has_keys(str(db)) and not db.exists()  # a missing file is not created to be asked
    store = open_store(str(db))
    store.add_key("k", key_hash(new_key()))
    store.revoke_key("k")
    store.close()
    assert _has_keys(str(db))  # revoked ones too: the server stays closed, never open
    settings.check_bind(store_keys=True)


def test_moot_serve_refuses_a_bind_beyond_loopback_without_any_key(tmp_path: Path) -> None:
    result = runner.invoke(app, ["serve", "--host", "0.0.0.0", "--db", str(tmp_path / "none.sqlite")])
    assert result.exit_code == 2 and "refusing to listen on 0.0.0.0 without an API key" in result.output
    assert "moot serve keys add" in result.output


# ------------------------------------------------------------------------------------ the CLI


def test_keys_add_list_revoke(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    db = str(tmp_path / "moot.sqlite")
    added = runner.invoke(
        app, ["serve", "keys", "add", "--name", "ci", "--rate", "60", "--concurrency", "2", "--db", db]
    )
    assert added.exit_code == 0, added.output
    secret = added.stdout.strip()
    assert secret.startswith(KEY_PREFIX) and added.stdout.count(KEY_PREFIX) == 1
    # (standard output is not a terminal here, as with `> alice.key`: it says where the key went)
    assert "written to standard output once" in added.stderr and secret not in added.stderr
    store = open_store(db)
    assert store.key_by_hash(key_hash(secret)) is not None
    store.close()

    listed = runner.invoke(app, ["serve", "keys", "list", "--db", db])
    assert listed.exit_code == 0 and "ci" in listed.stdout and "60" in listed.stdout
    assert secret not in listed.output and secret[len(KEY_PREFIX) :] not in listed.output

    twice = runner.invoke(app, ["serve", "keys", "add", "--name", "ci", "--db", db])
    assert twice.exit_code == 1 and twice.stdout == ""
    assert twice.stderr.count("\n") == 1 and "exists already" in twice.stderr

    bad = runner.invoke(app, ["serve", "keys", "add", "--name", "two words", "--db", db])
    assert bad.exit_code == 2 and "not a key name" in bad.stderr and bad.stderr.count("\n") == 1

    revoked = runner.invoke(app, ["serve", "keys", "revoke", "ci", "--db", db])
    assert revoked.exit_code == 0 and "revoked key 'ci'" in revoked.stdout
    again = runner.invoke(app, ["serve", "keys", "revoke", "ci", "--db", db])
    assert again.exit_code == 0 and "already revoked" in again.stdout
    unknown = runner.invoke(app, ["serve", "keys", "revoke", "nobody", "--db", db])
    assert unknown.exit_code == 1 and "no key named" in unknown.stderr and unknown.stderr.count("\n") == 1
    missing = runner.invoke(app, ["serve", "keys", "list", "--db", str(tmp_path / "none.sqlite")])
    assert missing.exit_code == 2 and "no such file" in missing.stderr
    assert not (tmp_path / "none.sqlite").exists()
    wrong = runner.invoke(app, ["serve", "keys", "list", "--db", "mysql://u:hunter2@h/db"])
    assert wrong.exit_code == 2 and "hunter2" not in wrong.output

    listed = runner.invoke(app, ["serve", "keys", "list", "--db", db])
    assert "REVOKED" in listed.stdout and secret not in listed.output
    assert secret not in caplog.text


def test_keys_on_postgresql_through_the_cli(pg_cluster: PgCluster) -> None:
    database = pg_cluster.create_database()
    url = pg_cluster.url(database)
    try:
        added = runner.invoke(app, ["serve", "keys", "add", "--name", "pg"], env={"MOOT_DB_URL": url})
        assert added.exit_code == 0, added.output
        listed = runner.invoke(app, ["serve", "keys", "list", "--db", url])
        assert listed.exit_code == 0 and "pg" in listed.stdout and added.stdout.strip() not in listed.output
        assert runner.invoke(app, ["serve", "keys", "revoke", "pg", "--db", url]).exit_code == 0
    finally:
        pg_cluster.drop_database(database)


async def test_a_debate_submitted_over_mcp_is_its_keys(serve: MakeServed) -> None:
    """A debate the MCP tool submits is the key's that sent that message (one session whose requests
    change keys: each debate recorded under its own)."""
    pytest.importorskip("mcp", reason="the MCP endpoint needs moot[mcp]")
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    served = serve()
    secrets = {name: served.add(name)[0] for name in ("first", "second")}
    ids: dict[str, str] = {}
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {secrets['first']}"}, timeout=300)
    async with Client(streamable_http_client(served.url + "/mcp", http_client=http)) as client:
        for name in ("first", "second"):
            http.headers["Authorization"] = f"Bearer {secrets[name]}"
            outcome = await client.call_tool("debate", {"question": "Is 7 prime?", "wait": False})
            ids[name] = outcome.structured_content["debate_id"]
    keys = {k.name: k.id for k in served.store.keys()}  # noqa: SIM118
    for name, debate_id in ids.items():
        rows = served.store._read(served.store._q("SELECT key_id FROM debates WHERE id = ?"), (debate_id,))
        assert rows[0][0] == keys[name], name


def test_the_openapi_schema_declares_the_bearer_once_the_store_holds_a_key(serve: MakeServed) -> None:
    served = serve(key_cache_s=0)
    open_spec = httpx.get(served.url + "/openapi.json").json()
    assert "securitySchemes" not in open_spec.get("components", {})
    served.add("first")
    spec = httpx.get(served.url + "/openapi.json").json()
    assert spec["components"]["securitySchemes"] == {"bearer": {"type": "http", "scheme": "bearer"}}
    usage = spec["paths"]["/v1/usage"]["get"]
    assert usage["security"] == [{"bearer": []}] and {"401", "404"} <= set(usage["responses"])
    assert "401" in spec["paths"]["/v1/debates"]["post"]["responses"]


def test_moot_serve_with_keys_in_its_store_only(tmp_path: Path) -> None:
    """The process as a user starts it: keys added with the CLI, no --api-key-env; the banner says a
    key is needed, the key works, and it is in no line of the log."""
    from serving import free_port, serve_process, wait_until_up

    db = str(tmp_path / "moot.sqlite")
    added = runner.invoke(app, ["serve", "keys", "add", "--name", "ops", "--db", db])
    secret = added.stdout.strip()
    port = free_port()
    log = tmp_path / "serve.log"
    with FakeOpenAIServer(latency=0.01) as fake:
        args = ["--port", str(port), "--db", db, "--models", "openai:fake", "--base-url", fake.base_url]
        proc = serve_process([*args, "--log-level", "debug"], log)
        try:
            url = f"http://127.0.0.1:{port}"
            auth = {"Authorization": f"Bearer {secret}"}
            wait_until_up(url, proc, headers=auth)
            assert httpx.get(url + "/v1/protocols").status_code == 401
            debate_id = submit(url, auth).json()["id"]
            wait_for(
                lambda: httpx.get(f"{url}/v1/debates/{debate_id}", headers=auth).json()["status"] == "complete",
                "the debate",
            )
            assert httpx.get(url + "/v1/usage", headers=auth).json()["usage"]["debates"] == 1
        finally:
            proc.terminate()
            proc.wait(60)
    text = log.read_text()
    assert "API key required" in text and secret not in text and secret[len(KEY_PREFIX) :] not in text
    listed = runner.invoke(app, ["serve", "keys", "list", "--db", db])
    assert " 1 " in listed.stdout and secret not in listed.output


async def test_a_store_that_cannot_be_read_refuses_with_503_never_opens() -> None:
    """The keys cannot be checked (the database is down): 503 with Retry-After, the key in no byte of
    it, and a loopback server that may hold keys is not taken for an open one."""
    from moot.server.http.middleware import KeyCheck
    from moot.server.http.routes import ViewerSessions
    from moot.server.state.keyring import KeyRing

    class Down:
        def key_by_hash(self, hashed: str) -> None:
            raise OSError("connection refused")

        def has_keys(self) -> bool:
            raise OSError("connection refused")

    reached: list[str] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    ring = KeyRing(5, required=False)
    ring.store = Down()  # type: ignore[assignment]
    check = KeyCheck(inner, None, ViewerSessions(None, 60), ring)
    secret = new_key()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=check), base_url="http://127.0.0.1") as client:
        for headers in ({"Authorization": f"Bearer {secret}"}, {}):
            refused = await client.get("/v1/debates", headers=headers)
            assert refused.status_code == 503 and refused.headers["retry-after"] == "5"
            assert secret not in refused.text and "unreachable" in refused.json()["error"]["message"]
        assert (await client.get("/")).status_code == 200  # the pages hold no data
    assert reached == ["/"]


def test_serve_migrate_copies_the_keys_so_they_go_on_working(pg_cluster: PgCluster, tmp_path: Path) -> None:
    source_path = tmp_path / "run.sqlite"
    source = open_store(source_path)
    assert isinstance(source, SqlStore)
    secret = new_key()
    key = source.add_key("kept", key_hash(secret), rate_per_min=7, concurrency=3)
    create(source, "d1", key=key)
    source.write("d1", result_with(2, status="complete"), [], status="complete")
    source.close()
    database = pg_cluster.create_database()
    url = pg_cluster.url(database)
    try:
        first = runner.invoke(app, ["serve", "migrate", "--from", str(source_path), "--to", url])
        assert first.exit_code == 0 and "1 API key(s)" in first.output, first.output
        target = open_store(url)
        found = target.key_by_hash(key_hash(secret))
        assert found is not None and (found.id, found.rate_per_min, found.concurrency) == (key.id, 7, 3)
        assert (found.usage.debates, found.usage.calls) == (1, 2)
        rows = target._read(target._q("SELECT key_id, counted FROM debates WHERE id = ?"), ("d1",))  # type: ignore[attr-defined]
        assert rows == [(key.id, 1)]
        target.close()
        again = runner.invoke(app, ["serve", "migrate", "--from", str(source_path), "--to", url])
        assert again.exit_code == 0 and "API key" not in again.output
    finally:
        pg_cluster.drop_database(database)


def test_serve_migrate_copies_a_store_older_than_the_keys(pg_cluster: PgCluster, tmp_path: Path) -> None:
    """A SQLite store written before schema 3 (no keys, no key columns) is copied as it is."""
    import sqlite3

    from moot.server.state.sql_schema import migrations_for

    path = tmp_path / "old.sqlite"
    old = sqlite3.connect(path)
    old.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    sqlite_schema = migrations_for("sqlite")
    for statement in [*sqlite_schema[1], *sqlite_schema[2]]:
        old.execute(statement)
    old.execute("INSERT INTO meta VALUES ('store_version', '2')")
    old.execute(
        "INSERT INTO debates (id, status, protocol, question, model, created_at, request) "
        "VALUES ('d1', 'complete', 'p', 'Q?', 'openai:fake', 't', '{}')"
    )
    old.commit()
    old.close()
    database = pg_cluster.create_database()
    url = pg_cluster.url(database)
    try:
        done = runner.invoke(app, ["serve", "migrate", "--from", str(path), "--to", url])
        assert done.exit_code == 0 and "copied 1 debate(s)" in done.output and "API key" not in done.output
        target = open_store(url)
        assert target.get("d1") is not None and not target.has_keys()
        target.close()
    finally:
        pg_cluster.drop_database(database)


def test_mcp_sessions_are_their_keys_and_a_key_holds_at_most_its_cap(serve: MakeServed) -> None:
    """/mcp's sessions were the MCP SDK's, 10,000 for all clients: one key opened 9,500 in 42 s, and
    every other key's initialize got 503 for half an hour; a session opened with one key answered
    another's requests. Each key of the store now holds at most --mcp-sessions-per-key, told so in a
    429, and its sessions are its own."""
    pytest.importorskip("mcp", reason="the MCP door needs moot[mcp]")
    served = serve(key_cache_s=0.2, mcp_sessions_per_key=3)
    _, alice = served.add("alice")
    _, bob = served.add("bob")
    hello = {
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }  # fmt: skip
    accept = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}

    def initialize(auth: dict[str, str]) -> httpx.Response:
        return httpx.post(served.url + "/mcp", json=hello, headers={**auth, **accept}, timeout=30)

    wait_for(lambda: initialize(alice).status_code == 200, "the server to know the keys")
    sessions = [initialize(alice) for _ in range(2)]  # three in all: alice's cap
    assert all(s.status_code == 200 and s.headers.get("mcp-session-id") for s in sessions)
    over = initialize(alice)
    assert over.status_code == 429 and over.headers["retry-after"], over.text
    message = over.json()["error"]["message"]
    assert "key 'alice' holds 3 open MCP sessions, the most one key may" in message and "DELETE /mcp" in message
    assert initialize(bob).status_code == 200  # another key is not locked out
    # alice's session is hers: bob's requests to it are told it does not exist
    session = sessions[0].headers["mcp-session-id"]
    ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
    as_bob = httpx.post(served.url + "/mcp", json=ping, headers={**bob, **accept, "Mcp-Session-Id": session})
    assert as_bob.status_code == 404, as_bob.text
    # at her cap, a request of the stateless revision (it opens no session) is served
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
    discover = {"jsonrpc": "2.0", "id": 3, "method": "server/discover", "params": {"_meta": meta}}
    revision = {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "server/discover"}
    modern = httpx.post(served.url + "/mcp", json=discover, headers={**alice, **accept, **revision})
    assert modern.status_code == 200, modern.text
    # ending one of hers frees its place
    ended = httpx.delete(served.url + "/mcp", headers={**alice, **accept, "Mcp-Session-Id": session})
    assert ended.status_code == 200, ended.text
    assert initialize(alice).status_code == 200
    # a burst of openings past the cap: each one over it is the 429 that says why (it was the SDK's 503)
    _, carol = served.add("carol")
    wait_for(lambda: initialize(carol).status_code == 200, "the server to know carol's key")
    with ThreadPoolExecutor(8) as pool:
        statuses = sorted(r.status_code for r in pool.map(lambda _: initialize(carol), range(8)))
    assert statuses == [200] * 2 + [429] * 6, statuses
