"""API keys kept hashed in the store (``moot serve keys``), their limits for the whole deployment and
their usage (issue 40, item 5): the store's side on SQLite and PostgreSQL alike (the contract's
fixtures), the HTTP side on a real loopback port, and the CLI."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from moot.core.types import DebateCost
from moot.server.state import SCHEMA_VERSION, StoredEvent, Write
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
from pg_cluster import PgCluster
from test_store_contract import Backend, result_with


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
