"""The store's contract (moot.server.state): the same tests against SQLite and PostgreSQL.

PostgreSQL runs in a throwaway cluster for the session (tests/pg_cluster.py), a fresh database per
test; where its programs are missing these tests fail with one line saying how to install them
(tools/services.sh up), never skip."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from typer.testing import CliRunner

from moot.cli.main import app
from moot.core.types import DebateResult, DebateTask, Round, Turn, Usage
from moot.server import ServerSettings
from moot.server.state import (
    SCHEMA_VERSION,
    LeaseLost,
    SchemaTooNew,
    StoreBusy,
    StoredEvent,
    StoreError,
    Write,
    check_db,
    open_store,
)
from moot.server.state.result_json import ResultJson, Split
from moot.server.state.sql import SqlStore
from moot.server.state.sqlite import SqliteStore
from moot.testing.fake_openai import FakeOpenAIServer
from pg_cluster import PgCluster
from serving import FAKE_KEY, ServerThread, free_port, read_events, wait_for

SRC = Path(__file__).resolve().parent.parent / "src"
runner = CliRunner()


@dataclass
class Backend:
    name: str
    #: What ``--db`` would be: the SQLite file, or the PostgreSQL URL.
    target: str
    opened: list[SqlStore] = field(default_factory=list)

    def open(self) -> SqlStore:
        store = open_store(self.target)
        assert isinstance(store, SqlStore)
        self.opened.append(store)
        return store


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "sqlite":
        b = Backend("sqlite", str(tmp_path / "moot.sqlite"))
        yield b
        for s in b.opened:
            s.close()
        return
    cluster: PgCluster = request.getfixturevalue("pg_cluster")
    database = cluster.create_database()
    b = Backend("postgres", cluster.url(database))
    yield b
    for s in b.opened:
        s.close()
    cluster.drop_database(database)


def result_with(turns: int, *, status: str = "running") -> DebateResult:
    """A transcript with ``turns`` finished turns in round 1."""
    made = [
        Turn(speaker=f"a{i}", name=f"Agent {i}", round=1, model="openai:fake", messages=[], text=f"answer {i}", calls=1)
        for i in range(turns)
    ]
    return DebateResult.model_validate(
        {
            "protocol": "affirmative-critical",
            "task": DebateTask(question="Is 7 prime?"),
            "status": status,
            "rounds": [Round(index=1, turns=made)],
            "usage": Usage(prompt_tokens=10 * turns, completion_tokens=5 * turns, total_tokens=15 * turns),
            "llm_calls": turns,
        }
    )


def events(*ids: int) -> list[StoredEvent]:
    return [StoredEvent(id=i, name="turn_done", data=json.dumps({"n": i})) for i in ids]


def create(store: SqlStore, debate_id: str, question: str = "Is 7 prime?") -> None:
    store.create(debate_id, protocol="affirmative-critical", question=question, model="openai:fake", request={"q": 1})


# ---------------------------------------------------------------------------------- round trip


def test_create_write_get_page_and_events_round_trip(backend: Backend) -> None:
    store = backend.open()
    create(store, "d1", "my key sk-abcdefghijklmnop1234 is 7 prime?")
    create(store, "d2")
    create(store, "d3")
    claim = store.claim("r1", 60, debate_id="d1")
    assert claim is not None and claim.epoch == 1 and claim.previous_owner is None and claim.status == "queued"
    store.write_one(Write("d1", result_with(1), events(1, 2, 3), started="2026-01-01T00:00:00.000+00:00", epoch=1))
    store.write("d1", result_with(2, status="complete"), events(3, 4), status="complete", epoch=1)  # 3: once

    got = store.get("d1")
    assert got is not None and got.status == "complete" and got.finished_at is not None
    assert got.result is not None and [t.text for t in got.result.turns()] == ["answer 0", "answer 1"]
    assert (got.calls, got.tokens) == (2, 30) and got.started_at == "2026-01-01T00:00:00.000+00:00"
    assert "sk-abcdefghijklmnop1234" not in got.question and "***" in got.question  # redacted on the way in
    assert store.get("d1", with_result=False).result is None  # type: ignore[union-attr]
    assert store.get("nope") is None
    assert [e.id for e in store.events("d1")] == [1, 2, 3, 4]
    assert [e.id for e in store.events("d1", after=2)] == [3, 4] and store.events("d1")[3].data == '{"n": 4}'
    assert store.last_event_id("d1") == 4 and store.last_event_id("d2") == 0
    assert store.request("d2") == {"q": 1} and store.request("nope") is None
    assert store.unfinished() == ["d2", "d3"]
    assert store.lease("d1") == (None, 1)  # an ended debate is no one's

    newest = store.page(status=None, limit=2, before=None)
    assert [d.id for d in newest] == ["d3", "d2"]
    assert [d.id for d in store.page(status=None, limit=10, before=newest[-1].seq)] == ["d1"]
    assert [d.id for d in store.page(status="complete", limit=10, before=None)] == ["d1"]
    assert store.schema_version() == SCHEMA_VERSION


def turn_rows(store: SqlStore, debate_id: str) -> list[tuple[int, int]]:
    return [
        (int(n), int(p))
        for n, p in store._read(store._q("SELECT n, place FROM turns WHERE debate_id = ? ORDER BY n"), (debate_id,))
    ]


def test_a_transcript_is_stored_turn_by_turn_and_read_back_whole(backend: Backend) -> None:
    """A running debate's transcript is written as its frame and each finished turn once (a row of
    ``turns``: the square of its turns no more); read back, it is the result it was. A transaction
    that was not committed leaves its turns to the next write; a replica taking the debate over
    with fewer turns, or a write of the whole transcript, leaves no row past it."""
    store = backend.open()
    create(store, "d1")
    claim = store.claim("r1", 60, debate_id="d1")
    assert claim is not None
    written: list[int] = []

    class Counting(ResultJson):
        __slots__ = ()

        def split(self, result: DebateResult, secrets: Iterable[str] = ()) -> Split:
            made = super().split(result, secrets)
            written.extend(n for n, _, _ in made.rows)
            return made

    encoder = Counting()
    for turns in (1, 2, 4):
        result = result_with(turns)
        store.write_one(Write("d1", result, [], epoch=claim.epoch, encoder=encoder))
        got = store.get("d1")
        assert got is not None and got.result is not None
        assert got.result.to_json(indent=None) == result.to_json(indent=None)
        assert turn_rows(store, "d1") == [(n, 0) for n in range(turns)]
    # Each turn written once (result_with makes new turns each time: the same text is not written again).
    assert written == [0, 1, 2, 3]

    # A write refused (a stale epoch) commits nothing: its turn goes with the next write.
    with pytest.raises(LeaseLost):
        store.write_one(Write("d1", result_with(5), [], epoch=claim.epoch + 7, encoder=encoder))
    store.write_one(Write("d1", result_with(6), [], epoch=claim.epoch, encoder=encoder))
    assert turn_rows(store, "d1") == [(n, 0) for n in range(6)] and written[-2:] == [4, 5]

    # Another replica's first write, from fewer turns (what its store kept): none left past them.
    store.release("d1", claim.epoch)
    again = store.claim("r2", 60, debate_id="d1")
    assert again is not None
    store.write_one(Write("d1", result_with(3), [], epoch=again.epoch, encoder=ResultJson()))
    assert turn_rows(store, "d1") == [(0, 0), (1, 0), (2, 0)]
    got = store.get("d1")
    assert got is not None and got.result is not None and len(got.result.rounds[0].turns) == 3

    # Stored whole (no encoder: a recovery's write): its frame is the transcript, with no row.
    final = result_with(3, status="interrupted")
    store.write("d1", final, [], status="interrupted", error="stopped")
    assert turn_rows(store, "d1") == []
    got = store.get("d1")
    assert got is not None and got.result is not None and got.result.to_json(indent=None) == final.to_json(indent=None)

    create(store, "d2")
    store.write_one(Write("d2", result_with(2), [], encoder=ResultJson()))
    assert store.delete("d2") and turn_rows(store, "d2") == []


def test_a_transcript_read_back_reads_its_frame_once(backend: Backend) -> None:
    """The debate's row (its frame: the task's context and images, which may be large) comes once in
    the statement that reads its turns too, not once a turn."""
    store = backend.open()
    create(store, "d1")
    result = result_with(30)
    result.task = DebateTask(question="Is 7 prime?", context=["x" * 65536])
    store.write_one(Write("d1", result, [], encoder=ResultJson()))
    read, fetched = store._read, list[int]()

    def counting(sql: str, params: Sequence[object] = ()) -> list[tuple[object, ...]]:
        rows = read(sql, params)
        fetched.append(sum(len(v) for row in rows for v in row if isinstance(v, str) and "x" * 65536 in v))
        return rows

    store._read = counting  # type: ignore[method-assign]
    got = store.get("d1")
    assert got is not None and got.result is not None and got.result.to_json(indent=None) == result.to_json(indent=None)
    assert 65536 < sum(fetched) < 2 * 65536


def test_a_write_after_its_debate_was_deleted_stores_nothing(backend: Backend) -> None:
    """A write with no fence that comes after its debate's delete adds no events (nor turns) of a
    debate that is gone."""
    store = backend.open()
    create(store, "d1")
    assert store.delete("d1")
    store.write_one(Write("d1", None, events(1, 2)))
    store.write_one(Write("d1", result_with(2), events(3), encoder=ResultJson()))
    assert store.events("d1") == [] and turn_rows(store, "d1") == [] and store.get("d1") is None


@pytest.mark.parametrize("turns", ["added", "written again"])
def test_a_debate_deleted_while_a_write_holds_it_leaves_nothing_behind(
    pg_cluster: PgCluster, tmp_path: Path, turns: str
) -> None:
    """PostgreSQL, two connections: a delete while a write holds the debate's row (between its update
    and its turns) waits for it, then removes the turns it added, without a deadlock when the write
    writes turns the store holds again (a take-over's first write). SQLite has one writer at a time."""
    database = pg_cluster.create_database()
    backend = Backend("postgres", pg_cluster.url(database))
    try:
        writer, deleter = backend.open(), backend.open()
        create(writer, "d1")
        claim = writer.claim("r1", 60, debate_id="d1")
        assert claim is not None
        encoder = ResultJson()
        writer.write_one(Write("d1", result_with(2), [], epoch=claim.epoch, encoder=encoder))
        inside, errors = threading.Event(), list[BaseException]()
        original = SqlStore._write_turns

        def slowly(self: SqlStore, *args: Any) -> None:
            inside.set()
            time.sleep(0.5)  # (the delete is waiting on the debate's row meanwhile)
            original(self, *args)

        def write() -> None:
            again = encoder if turns == "added" else ResultJson()
            try:
                writer.write_one(Write("d1", result_with(4), [], epoch=claim.epoch, encoder=again))
            except BaseException as exc:
                errors.append(exc)

        SqlStore._write_turns = slowly  # type: ignore[method-assign]
        try:
            thread = threading.Thread(target=write)
            thread.start()
            assert inside.wait(10)
            deleted = deleter.delete("d1")
            thread.join(30)
        finally:
            SqlStore._write_turns = original  # type: ignore[method-assign]
        assert not errors and deleted and deleter.get("d1") is None
        assert turn_rows(deleter, "d1") == []
    finally:
        for store in backend.opened:
            store.close()
        pg_cluster.drop_database(database)


def test_a_request_is_replaced_redacted_and_a_debate_deleted_with_its_events(backend: Backend) -> None:
    """What a stored Responses API response needs (moot.server.openai.responses_state): its request kept
    again with the reply, and ``DELETE /v1/responses/{id}`` removing the debate for good."""
    store = backend.open()
    create(store, "d1")
    create(store, "d2")
    store.write("d1", result_with(1, status="complete"), events(1, 2), status="complete")
    assert store.set_request("d1", {"q": 2, "key": "sk-abcdefghijklmnop1234"})
    assert store.request("d1") == {"q": 2, "key": "***"}  # redacted on the way in, as at create
    assert not store.set_request("nope", {"q": 3})
    assert store.delete("d1") and store.get("d1") is None and store.events("d1") == []
    assert store.request("d1") is None and not store.delete("d1")
    assert store.get("d2") is not None and store.request("d2") == {"q": 1}


def test_each_debates_write_stands_or_falls_alone(backend: Backend) -> None:
    """A write that fails midway (after its update, on an event) is rolled back alone; one refused
    for a stale epoch is refused alone; the debates written with them are written."""
    store = backend.open()
    for d in ("d1", "d2", "d3", "d4"):
        create(store, d)
        assert store.claim("r1", 60, debate_id=d) is not None
    broken = StoredEvent.model_construct(id=1, name="turn_done", data=None)  # the driver cannot write it
    failures = store.write_all(
        [
            Write("d1", result_with(1), events(1), epoch=1),
            Write("d2", result_with(1), [broken], status="complete", epoch=1),
            Write("d3", result_with(1), events(1, 2), epoch=1),
            Write("d4", result_with(1), events(1), epoch=7),
        ]
    )
    assert [f.debate_id for f in failures] == ["d2", "d4"] and isinstance(failures[1].error, LeaseLost)
    # The failed write is rolled back; its debate is then marked failed with the reason (issue 39,
    # S3: never left waiting for ever), without the event that could not be written.
    d2 = store.get("d2")
    assert d2 is not None and d2.status == "failed" and d2.result is None and store.events("d2") == []
    assert d2.error is not None and "could not store this debate" in d2.error and failures[0].reason is not None
    assert store.get("d4").result is None and store.events("d4") == []  # type: ignore[union-attr]
    assert store.get("d1").calls == 1 and [e.id for e in store.events("d3")] == [1, 2]  # type: ignore[union-attr]


def test_the_writes_of_one_moment_share_one_transaction(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """Several debates' writes go in one transaction (one commit): one refused for a stale epoch
    writes nothing, the others are committed, and none is written again on its own."""
    store = backend.open()
    for d in ("d1", "d2", "d3"):
        create(store, d)
        assert store.claim("r1", 60, debate_id=d) is not None
    alone: list[Write] = []
    monkeypatch.setattr(store, "write_one", alone.append)
    failures = store.write_all(
        [
            Write("d1", result_with(1), events(1), epoch=1),
            Write("d2", result_with(1), events(1, 2), epoch=9),
            Write("d3", result_with(1), events(1), status="complete", epoch=1),
        ]
    )
    assert alone == []
    assert [f.debate_id for f in failures] == ["d2"] and isinstance(failures[0].error, LeaseLost)
    assert store.get("d2").result is None and store.events("d2") == []  # type: ignore[union-attr]
    assert [e.id for e in store.events("d1")] == [1] and store.get("d1").calls == 1  # type: ignore[union-attr]
    assert store.get("d3").status == "complete" and [e.id for e in store.events("d3")] == [1]  # type: ignore[union-attr]


# ---------------------------------------------------------------------------------- the schema


def test_migrating_twice_applies_each_version_once(backend: Backend) -> None:
    first = backend.open()
    applied = first.applied_migrations()
    assert [v for v, _ in applied] == list(range(1, SCHEMA_VERSION + 1))
    first.close()
    again = backend.open()
    assert again.applied_migrations() == applied and again.schema_version() == SCHEMA_VERSION


def test_processes_starting_together_migrate_once(backend: Backend, tmp_path: Path) -> None:
    """Three processes open a new store at the same instant: each version is applied once, by one of
    them (PostgreSQL: an advisory lock; SQLite: its write lock), and all three start."""
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from moot.server.state import open_store\n"
        "folder = Path(sys.argv[2])\n"
        "(folder / sys.argv[3]).touch()\n"  # imported: ready
        "while not (folder / 'go').exists():\n"
        "    time.sleep(0.005)\n"
        "store = open_store(sys.argv[1])\n"
        "print(store.schema_version())\n"
        "store.close()\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, backend.target, str(tmp_path), f"ready-{n}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
        )
        for n in range(3)
    ]
    wait_for(lambda: len(list(tmp_path.glob("ready-*"))) == 3, "the three processes to import moot", timeout=120)
    (tmp_path / "go").touch()  # all three open the store at once
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outputs
    assert [out.strip() for out, _ in outputs] == [str(SCHEMA_VERSION)] * 3
    applied = backend.open().applied_migrations()
    assert [v for v, _ in applied] == list(range(1, SCHEMA_VERSION + 1))  # once each
    assert len({by for _, by in applied}) == 1  # by one process


def test_a_schema_from_a_newer_moot_is_refused_naming_both_versions(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = backend.open()
    with store._tx() as c:
        c.execute(store._q("UPDATE meta SET value = ? WHERE key = 'store_version'"), ("99",))
    store.close()
    with pytest.raises(SchemaTooNew) as refused:
        open_store(backend.target)
    message = str(refused.value)
    assert "version 99" in message and f"up to {SCHEMA_VERSION}" in message and "\n" not in message
    # moot serve: the same line, before its banner, exit 2
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    result = runner.invoke(app, ["serve", "--models", "openai:x", "--db", backend.target, "--port", "0"])
    assert result.exit_code == 2, result.output
    assert "version 99" in result.output and len(result.output.strip().splitlines()) == 1
    assert "moot serve: http" not in result.output and "Traceback" not in result.output


def test_a_second_server_on_the_same_store_is_refused(backend: Backend) -> None:
    first = backend.open()
    first.take_server_lock()
    second = backend.open()
    with pytest.raises(StoreBusy) as busy:
        second.take_server_lock()
    assert "is in use by" in str(busy.value) and "\n" not in str(busy.value)
    first.close()
    second.take_server_lock()  # the first's lock ended with it


def test_a_second_server_on_a_link_to_the_same_sqlite_file_is_refused(tmp_path: Path) -> None:
    """The lock sat beside the path as given: a server on a symbolic link to the file, in another
    folder, took the file and marked the first's running debate interrupted (an outside trial's)."""
    first = open_store(tmp_path / "moot.sqlite")
    first.take_server_lock()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "moot.sqlite").symlink_to(tmp_path / "moot.sqlite")
    second = open_store(tmp_path / "other" / "moot.sqlite")
    with pytest.raises(StoreBusy, match="is in use by"):
        second.take_server_lock()
    first.close()
    second.close()


# ----------------------------------------------------------------------------------- the queue


def test_replicas_claiming_at_once_get_each_debate_once(backend: Backend) -> None:
    setup = backend.open()
    ids = [f"d{i:02d}" for i in range(30)]
    for d in ids:
        create(setup, d)
    stores = [backend.open() for _ in range(3)]
    got: dict[str, list[str]] = {f"r{i}": [] for i in range(3)}
    start = threading.Barrier(3)

    def replica(name: str, store: SqlStore) -> None:
        start.wait()
        while (claim := store.claim(name, 60)) is not None:
            got[name].append(claim.debate_id)

    threads = [threading.Thread(target=replica, args=(f"r{i}", s)) for i, s in enumerate(stores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    claimed = [d for ds in got.values() for d in ds]
    assert sorted(claimed) == ids  # every debate, each once
    for name, ds in got.items():
        assert all(setup.lease(d) == (name, 1) for d in ds)
    assert setup.claim("r9", 60) is None  # every lease is live: nothing left to claim


def test_a_debate_added_claimed_is_no_other_replicas_to_take(backend: Backend) -> None:
    """A replica with a free slot adds a submitted debate claimed, in the same transaction: another
    replica's poller, looking at the queue right after, finds nothing to take (it took it at times,
    between the two steps, and the submitter's stream then followed it elsewhere); the claim is the
    first epoch's, which writes, renews and releases like any other, and expires like any other."""
    a, b = backend.open(), backend.open()
    a.create("d1", protocol="p", question="Q?", model="openai:fake", request={}, claim_for=("A", 60))
    assert b.claim("B", 60) is None and b.claim("B", 60, debate_id="d1") is None
    assert a.lease("d1") == ("A", 1)
    a.write_one(Write("d1", result_with(1), events(1), started="t0", epoch=1))
    a.renew("d1", 1, 60)
    a.release("d1", 1)  # handed back (epoch 2): the poller takes it (3), from its recorded turn
    taken = b.claim("B", 60)
    assert taken is not None and (taken.debate_id, taken.epoch, taken.previous_owner) == ("d1", 3, "A")
    a.create("d2", protocol="p", question="Q?", model="openai:fake", request={}, claim_for=("A", 0.2))
    time.sleep(0.5)  # its lease expired: taken over like any other
    assert b.claim("B", 60) is not None and b.lease("d2") == ("B", 2)


def test_a_stale_epoch_cannot_write_renew_or_release(backend: Backend) -> None:
    a, b = backend.open(), backend.open()
    create(a, "d1")
    first = a.claim("A", 60)
    assert first is not None and b.claim("B", 60) is None and b.claim("B", 60, debate_id="d1") is None
    a.write_one(Write("d1", result_with(1), events(1), started="t0", epoch=first.epoch))
    a.release("d1", first.epoch)  # handed back (a SIGTERM): claimable at once
    second = b.claim("B", 60)
    assert second is not None and second.epoch > first.epoch and second.status == "running"
    assert second.previous_owner == "A"  # who handed it back: the resumed event names it
    with pytest.raises(LeaseLost):
        a.write_one(Write("d1", result_with(2), events(2), epoch=first.epoch))
    with pytest.raises(LeaseLost):
        a.write_one(Write("d1", None, events(2), epoch=first.epoch))  # events alone are fenced too
    with pytest.raises(LeaseLost):
        a.renew("d1", first.epoch, 60)
    with pytest.raises(LeaseLost):
        a.release("d1", first.epoch)
    assert [e.id for e in a.events("d1")] == [1] and a.get("d1").calls == 1  # type: ignore[union-attr]
    b.renew("d1", second.epoch, 60)
    b.write_one(Write("d1", result_with(2), events(2), epoch=second.epoch))
    assert a.get("d1").calls == 2 and a.lease("d1") == ("B", second.epoch)  # type: ignore[union-attr]


def test_an_expired_lease_is_taken_over_with_the_recorded_turns_kept(backend: Backend) -> None:
    a, b = backend.open(), backend.open()
    create(a, "d1")
    claim_a = a.claim("A", 0.3)
    assert claim_a is not None
    a.write_one(Write("d1", result_with(2), events(1, 2, 3), started="t0", epoch=claim_a.epoch))
    assert b.claim("B", 60) is None  # A's lease still holds
    wait_for(lambda: b.expired() == ["d1"], "A's lease to expire", timeout=30)
    taken = b.claim("B", 60)
    assert taken is not None and taken.debate_id == "d1" and taken.previous_owner == "A"
    assert taken.status == "running" and taken.epoch == claim_a.epoch + 1
    kept = b.get("d1")
    assert (
        kept is not None
        and kept.result is not None
        and [t.text for t in kept.result.turns()]
        == [
            "answer 0",
            "answer 1",
        ]
    )
    assert [e.id for e in b.events("d1")] == [1, 2, 3] and b.last_event_id("d1") == 3
    with pytest.raises(LeaseLost):  # A comes back (SIGCONT): it writes nothing
        a.write_one(Write("d1", result_with(3), events(4), epoch=claim_a.epoch))
    assert b.last_event_id("d1") == 3 and b.expired() == []


# ------------------------------------------------------------------------------------ the server


def test_a_served_debate_is_claimed_written_with_its_epoch_and_released_at_its_end(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    where = {"db_url": SecretStr(backend.target)} if backend.name == "postgres" else {"db": Path(backend.target)}
    with FakeOpenAIServer(latency=0.01) as fake:
        settings = ServerSettings(models=["openai:fake"], base_url=fake.base_url, **where)  # type: ignore[arg-type]
        with ServerThread(settings) as server:
            # (a bound only a hang reaches: a first request imports the model's client, seconds on a busy machine)
            posted = httpx.post(server.url + "/v1/debates", json={"question": "Is 7 prime?", "rounds": 1}, timeout=60)
            debate_id = posted.json()["id"]
            streamed = read_events(f"{server.url}/v1/debates/{debate_id}/events")
            assert streamed[-1]["event"] == "debate_done" and streamed[-1]["data"]["status"] == "complete"
            info = httpx.get(f"{server.url}/v1/debates/{debate_id}").json()
            assert info["status"] == "complete" and info["calls"] == len(fake.requests) > 0
    store = backend.open()
    assert store.lease(debate_id) == (None, 1)  # claimed once, no one's once done
    stored = [e.id for e in store.events(debate_id)]
    assert stored == [e["id"] for e in streamed if e["event"] != "token"]


def test_a_debate_whose_lease_another_replica_took_stops_writing(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another replica claims a running debate (its lease taken: a partition, a SIGSTOP past the
    lease): the server that ran it is fenced at its next write; it stops the debate and writes
    nothing more of it, and the store keeps what was recorded before. A stream open on the fenced
    server goes on following the debate, now the other replica's, to that replica's end."""
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    where = {"db_url": SecretStr(backend.target)} if backend.name == "postgres" else {"db": Path(backend.target)}
    with FakeOpenAIServer(latency=0.4) as fake:
        settings = ServerSettings(models=["openai:fake"], base_url=fake.base_url, **where)  # type: ignore[arg-type]
        with ServerThread(settings) as server:
            posted = httpx.post(server.url + "/v1/debates", json={"question": "Is 7 prime?", "rounds": 4}, timeout=60)
            debate_id = posted.json()["id"]
            other = backend.open()
            wait_for(lambda: other.last_event_id(debate_id) >= 2, "a turn to be stored")
            owner, epoch = other.lease(debate_id)
            assert owner is not None and epoch == 1
            with other._tx() as c:  # its lease runs out (the server is not told)
                c.execute(other._q("UPDATE debates SET lease_until = NULL WHERE id = ?"), (debate_id,))
            taken = other.claim("replica-B", 600, debate_id=debate_id)
            assert taken is not None and taken.previous_owner == owner and taken.status == "running"
            before = (other.last_event_id(debate_id), other.get(debate_id))
            streamed: list[list[dict[str, object]]] = []
            reader = threading.Thread(
                target=lambda: streamed.append(read_events(f"{server.url}/v1/debates/{debate_id}/events"))
            )
            reader.start()

            def quiet() -> bool:
                calls = len(fake.requests)
                time.sleep(1.5)  # three of the fake's latencies: a debate still running would call again
                return len(fake.requests) == calls

            wait_for(quiet, "the fenced server to stop calling the model")
            assert (other.last_event_id(debate_id), other.get(debate_id)) == before
            assert other.lease(debate_id) == ("replica-B", 2)
            assert reader.is_alive()  # the stream follows the debate, which runs elsewhere now
            # replica-B ends it (its ids above any the fenced server streamed, token deltas included)
            end = StoredEvent(id=before[0] + 10_000, name="debate_done", data='{"status": "interrupted"}')
            other.write_one(Write(debate_id, None, [end], status="interrupted", error="ended by B", epoch=2))
            reader.join(60)
            assert not reader.is_alive() and streamed
            ends = [e for e in streamed[0] if e["event"] == "debate_done"]
            assert ends == [{"id": end.id, "event": "debate_done", "data": {"status": "interrupted"}}]
            ids = [int(str(e["id"])) for e in streamed[0]]
            assert ids == sorted(set(ids))
            other.close()


# ----------------------------------------------------------------------------------- bad input


def test_a_bad_database_url_is_one_line_with_its_password_redacted(
    pg_cluster: PgCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    password = "s3cret-db-pass-9041"
    unreachable = f"postgresql://moot:{password}@127.0.0.1:{free_port()}/moot"
    no_database = pg_cluster.url("no_such_db").replace("postgres@", f"postgres:{password}@")
    cases = [
        (["--db", unreachable], {}, "cannot connect to PostgreSQL"),
        ([], {"MOOT_DB_URL": unreachable}, "cannot connect to PostgreSQL"),  # the environment's, alike
        (["--db", no_database], {}, 'database "no_such_db" does not exist'),
        (["--db", no_database], {}, "create that database (createdb, or CREATE DATABASE)"),
        (["--db", f"postgresql://moot:{password}@127.0.0.1:notaport/moot"], {}, "notaport"),
        (["--db", f"mysql://moot:{password}@127.0.0.1/moot"], {}, "not in mysql://"),
    ]
    for args, env, needle in cases:
        result = runner.invoke(app, ["serve", "--models", "openai:x", "--port", "0", *args], env=env)
        out = result.output
        assert result.exit_code == 2, out
        assert needle in out and ("moot:***@" in out or "postgres:***@" in out), out
        assert password not in out and len(out.strip().splitlines()) == 1, out
        assert "moot serve: http" not in out and "Traceback" not in out
    with pytest.raises(StoreError) as refused:
        open_store(unreachable)
    assert password not in str(refused.value) and "***" in str(refused.value)


# ------------------------------------------------------------------------ moot serve migrate


def test_serve_migrate_copies_a_sqlite_store_into_postgres_and_again_safely(
    pg_cluster: PgCluster, tmp_path: Path
) -> None:
    source_path = tmp_path / "run.sqlite"
    source = open_store(source_path)
    create(source, "d1")
    create(source, "d2")
    create(source, "d3", "a NUL \x00 PostgreSQL's text cannot hold")  # the one problem
    claim = source.claim("r1", 60, debate_id="d1")
    assert claim is not None
    source.write("d1", result_with(2, status="complete"), events(1, 2, 3), status="complete", epoch=claim.epoch)
    running = source.claim("r1", 60, debate_id="d2")
    assert running is not None  # its transcript stored turn by turn (its frame and rows): copied whole
    source.write_one(Write("d2", result_with(2), [], epoch=running.epoch, encoder=ResultJson()))
    assert turn_rows(source, "d2") == [(0, 0), (1, 0)]
    source.close()
    database = pg_cluster.create_database()
    url = pg_cluster.url(database)
    try:
        first = runner.invoke(app, ["serve", "migrate", "--from", str(source_path), "--to", url])
        assert first.exit_code == 1, first.output  # one debate could not be copied: said, and the rest copied
        lines = first.output.strip().splitlines()
        assert len(lines) == 2 and lines[0].startswith("debate d3: not copied (") and "Traceback" not in first.output
        assert "copied 2 debate(s) with 3 event(s)" in lines[1] and "1 not copied" in lines[1]
        target = open_store(url)
        assert isinstance(target, SqlStore)
        d1 = target.get("d1")
        reread = SqliteStore(source_path)
        original = reread.get("d1")
        reread.close()
        assert d1 is not None and original is not None
        assert d1.model_dump(exclude={"seq"}) == original.model_dump(exclude={"seq"})
        assert [e.model_dump() for e in target.events("d1")] == [e.model_dump() for e in events(1, 2, 3)]
        assert [d.id for d in target.page(status=None, limit=10, before=None)] == ["d2", "d1"]  # in order
        assert target.unfinished() == ["d2"] and target.lease("d2") == (None, 0) and target.request("d2") == {"q": 1}
        d2 = target.get("d2")
        assert d2 is not None and d2.result is not None and turn_rows(target, "d2") == []
        assert d2.result.to_json(indent=None) == result_with(2).to_json(indent=None)
        target.close()
        # again, with an event the source gained since: only that is added
        again_source = SqliteStore(source_path)
        again_source.write_one(Write("d1", None, events(4)))
        again_source.close()
        again = runner.invoke(app, ["serve", "migrate", "--from", str(source_path), "--to", url])
        assert "copied 0 debate(s) with 1 event(s)" in again.output and "2 already there" in again.output
        target = open_store(url)
        assert target.last_event_id("d1") == 4 and len(target.page(status=None, limit=10, before=None)) == 2
        target.close()
    finally:
        pg_cluster.drop_database(database)


def test_serve_migrate_refuses_what_it_cannot_copy_in_one_line(tmp_path: Path) -> None:
    password = "s3cret-db-pass-9041"
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    good = tmp_path / "run.sqlite"
    open_store(good).close()
    cases = [
        (["--from", str(tmp_path / "missing.sqlite"), "--to", "postgresql://h/db"], "no such file"),
        (["--from", str(other), "--to", "postgresql://h/db"], "not a moot serve store"),
        (["--from", str(good), "--to", str(good)], "the same file as --from"),
        (["--from", str(good), "--to", f"postgresql://moot:{password}@127.0.0.1:{free_port()}/moot"], "cannot connect"),
    ]
    for args, needle in cases:
        result = runner.invoke(app, ["serve", "migrate", *args])
        assert result.exit_code == 2, result.output
        assert needle in result.output and len(result.output.strip().splitlines()) == 1, result.output
        assert password not in result.output and "Traceback" not in result.output


def test_a_running_debates_lease_is_renewed_so_it_never_expires(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a lease of 0.6 s the server renews every 0.2 s: over a debate of several seconds, the
    lease is never seen expired (without renewal it would be after 0.6 s), and the debate ends."""
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    where = {"db_url": SecretStr(backend.target)} if backend.name == "postgres" else {"db": Path(backend.target)}
    with FakeOpenAIServer(latency=0.3) as fake:
        settings = ServerSettings(models=["openai:fake"], base_url=fake.base_url, lease_s=0.6, **where)  # type: ignore[arg-type]
        with ServerThread(settings) as server:
            posted = httpx.post(server.url + "/v1/debates", json={"question": "Is 7 prime?", "rounds": 3}, timeout=60)
            debate_id = posted.json()["id"]
            other = backend.open()
            wait_for(lambda: other.lease(debate_id)[0] is not None, "the debate to be claimed")
            seen_running = 0
            while (row := other.get(debate_id, with_result=False)) is not None and row.status in ("queued", "running"):
                assert debate_id not in other.expired()
                seen_running += 1
                time.sleep(0.1)
            assert row is not None and row.status == "complete" and seen_running > 10
            assert other.lease(debate_id) == (None, 1)  # never fenced, never claimed again


def test_a_debate_claimed_by_a_process_that_died_before_it_started_runs_at_the_next_start(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim left by a server killed between claiming a debate and starting it (its lease still
    live): the next server, which holds a SQLite store alone, hands it back and runs it; replicas
    sharing PostgreSQL leave it to its lease, and one claims it once that has expired."""
    from moot.server.schemas import DebateRequest

    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    store = backend.open()
    request = DebateRequest.model_validate({"question": "Is 7 prime?", "rounds": 1})
    store.create(
        "a" * 32,
        protocol="affirmative-critical",
        question="Is 7 prime?",
        model="openai:fake",
        request=request.model_dump(mode="json", by_alias=True),
    )
    shared = backend.name == "postgres"
    assert store.claim("dead-replica", 2 if shared else 600) is not None
    where = {"db_url": SecretStr(backend.target)} if backend.name == "postgres" else {"db": Path(backend.target)}
    with FakeOpenAIServer(latency=0.01) as fake:
        settings = ServerSettings(models=["openai:fake"], base_url=fake.base_url, **where)  # type: ignore[arg-type]
        with ServerThread(settings) as server:
            done = wait_for(
                lambda: (r := store.get("a" * 32, with_result=False)) is not None and r.status == "complete",
                "the debate to run",
            )
            assert done and len(fake.requests) > 0 and server.url
    # SQLite: the dead one's claim, its hand-back, this server's claim; PostgreSQL: no hand-back.
    assert store.lease("a" * 32) == (None, 2 if shared else 3)


def test_a_store_written_by_the_previous_moot_is_migrated_with_its_debates_kept(tmp_path: Path) -> None:
    from moot.server.state.sql_schema import migrations_for

    path = tmp_path / "moot.sqlite"
    old = sqlite3.connect(path)
    old.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    for statement in migrations_for("sqlite")[1]:  # the schema moot wrote before the leases (version 1)
        old.execute(statement)
    old.execute("INSERT INTO meta VALUES ('store_version', '1')")
    old.execute(
        "INSERT INTO debates (id, status, protocol, question, model, created_at, request, result) "
        "VALUES ('d1', 'complete', 'p', 'Q?', 'openai:fake', 't', '{}', ?)",
        (result_with(1, status="complete").to_json(indent=None),),
    )
    old.execute("INSERT INTO events VALUES ('d1', 1, 'debate_done', '{}')")
    old.commit()
    old.close()
    store = open_store(path)
    assert isinstance(store, SqlStore)
    assert store.schema_version() == SCHEMA_VERSION
    assert [v for v, _ in store.applied_migrations()] == list(range(2, SCHEMA_VERSION + 1))
    kept = store.get("d1")
    assert kept is not None and kept.result is not None and kept.result.turns()[0].text == "answer 0"
    assert store.events("d1")[0].name == "debate_done" and store.lease("d1") == (None, 0)
    store.close()


@pytest.mark.parametrize(
    "db",
    [
        "host=127.0.0.1 port=55432 dbname=moot user=moot password=S3cretKV-77",
        "postgresql//moot:S3cretKV-77@127.0.0.1:55432/moot",
        "postgresql:/moot:S3cretKV-77@127.0.0.1:55432/moot",
        "moot:S3cretKV-77@127.0.0.1:55432/moot",
    ],
)
def test_postgresql_meant_in_another_form_than_its_url_is_refused_not_made_a_sqlite_file(
    db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Taken for a SQLite path, each made a store file (or folders) named by the password, one per
    replica behind the balancer (an outside trial's, session 37); moot serve keys said "no such file"
    with the password in it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    for args in (["serve", "--models", "openai:x", "--port", "0", "--db", db], ["serve", "keys", "list", "--db", db]):
        result = runner.invoke(app, args)
        out = " ".join(result.output.split())
        assert result.exit_code == 2 and "give PostgreSQL as postgresql://user:password@host:port/database" in out, out
        assert "S3cretKV-77" not in out and "***" in out and "--db --db" not in out, out
    assert list(tmp_path.iterdir()) == []  # no file, no folder


@pytest.mark.parametrize(
    "db", ["postgres.sqlite", "postgres-data/moot.sqlite", "Postgres_backup.db", "port=1.sqlite", "a:b@c.sqlite"]
)
def test_a_sqlite_path_that_only_looks_like_postgresql_is_a_sqlite_path(db: str) -> None:
    """The check above refused these (a review's, session 37)."""
    assert check_db(db) == db


def test_a_password_with_an_at_sign_or_a_quote_is_hidden_whole() -> None:
    for db in ("user:p@ss-9041@host/db", "host=h password='a\\'b c-9041' dbname=x"):
        with pytest.raises(StoreError) as refused:
            check_db(db)
        assert "9041" not in str(refused.value) and "***" in str(refused.value), str(refused.value)


def test_a_postgresql_user_with_rights_on_moots_tables_only_runs_a_current_store(pg_cluster: PgCluster) -> None:
    """moot always said CREATE TABLE IF NOT EXISTS, which a user without the right to create tables may
    not: such a user, given reads and writes on a store already set up, was refused (an outside trial's)."""
    import psycopg

    database = pg_cluster.create_database()
    try:
        open_store(pg_cluster.url(database)).close()  # set up by its owner
        role = f"moot_rw_{database[-8:]}"
        with psycopg.connect(pg_cluster.url(database), autocommit=True) as admin:
            admin.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'rw-pass-1234'")
            admin.execute(f"REVOKE CREATE ON SCHEMA public FROM PUBLIC, {role}")
            admin.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}")
        url = pg_cluster.url(database).replace("postgres@", f"{role}:rw-pass-1234@")
        store = open_store(url)
        create(store, "d1")
        assert store.get("d1") is not None
        store.close()
    finally:
        pg_cluster.drop_database(database)
