"""A debate's event log holds back the events written at once (a turn's, a round's, the debate's
end) until they are stored: no stream, here or through the bus, shows a turn that a replica killed
before its write never stored, and which the replica that takes the debate over runs again."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

import pytest

from moot.core.engine import Engine
from moot.core.types import DebateTask
from moot.models.scripted import ScriptedModel
from moot.protocols import get_preset
from moot.server.settings import ServerSettings
from moot.server.state import LeaseLost, Store, Write, open_store
from moot.server.state.base import WriteFailure
from moot.server.state.events import EventLog, LoggedEvent
from moot.server.state.live import LiveDebate
from moot.server.state.manager import DebateManager

#: The events the writer stores as they come (and holds back until then).
STORED_AT_ONCE = {"debate_started", "turn_done", "round_done", "debate_done"}


async def _read(log: EventLog, seen: list[LoggedEvent]) -> None:
    async for batch in log.batches(0):
        seen.extend(batch)


async def test_a_held_event_and_every_one_after_it_wait_for_release() -> None:
    log = EventLog()
    sunk: list[int] = []
    log.sink = lambda events: sunk.extend(e.id for e in events)
    seen: list[LoggedEvent] = []
    reader = asyncio.create_task(_read(log, seen))
    log.append_json("turn_started", "{}")
    log.append_json("turn_done", "{}", hold=True)
    log.extend_ephemeral("token", ['{"text": "a"}'])  # the next turn's first piece: after the held one
    log.append_json("turn_started", "{}")
    await asyncio.sleep(0.01)
    assert [e.id for e in seen] == [1] and sunk == [1] and [e.id for e in log.shown] == [1]
    assert [e.id for e in log.events] == [1, 2, 3, 4] and log.last_id == 4  # numbered as they came
    log.release()
    await asyncio.sleep(0.01)
    assert [e.id for e in seen] == [1, 2, 3, 4] and sunk == [1, 2, 3, 4]
    log.release()  # nothing held: nothing sent again
    log.close()
    await asyncio.wait_for(reader, 10)
    assert sunk == [1, 2, 3, 4]


async def test_a_log_closed_while_holding_ends_its_readers_at_what_was_released() -> None:
    log = EventLog()
    seen: list[LoggedEvent] = []
    reader = asyncio.create_task(_read(log, seen))
    log.append_json("debate_started", "{}")
    log.append_json("debate_done", "{}", hold=True)  # its write was refused: never released
    log.close()
    await asyncio.wait_for(reader, 10)
    assert [e.name for e in seen] == ["debate_started"] and [e.name for e in log.shown] == ["debate_started"]


def _live(store: Store, replies: int = 5) -> LiveDebate:
    spec = get_preset("affirmative-critical")
    task = DebateTask(question="Is 7 prime?")
    model = ScriptedModel(["Yes, it is."] * replies)
    live = LiveDebate(id="d" * 32, spec=spec, task=task, engine=Engine(spec, model), model="scripted")
    store.create(live.id, protocol=spec.name, question=task.question, model="scripted", request={})
    return live


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[tuple[Store, DebateManager, LiveDebate]]:
    """A store, its manager, and a debate it holds (not started: the test runs or stops it)."""
    store = open_store(tmp_path / "moot.sqlite")
    manager = DebateManager(ServerSettings(db=tmp_path / "moot.sqlite"), store)
    live = _live(store)
    manager.live[live.id] = live
    try:
        yield store, manager, live
    finally:
        manager.writer._writes.clear()  # (a store a test left out of reach: nothing more to write)
        await manager.shutdown()
        store.close()


class _Recorder:
    """The store's writes, wrapped: what each stored, and what a stream had got by then."""

    def __init__(self, store: Store, seen: list[LoggedEvent], refuse: str | None = None) -> None:
        self.write_all = store.write_all
        self.seen = seen
        self.refuse = refuse  # the first write holding an event of this name: refused (a lost lease)
        self.stored: set[int] = set()
        self.early: list[str] = []

    def __call__(self, writes: Iterable[Write]) -> list[WriteFailure]:
        writes = list(writes)
        # What the stream got before this write: every event stored at once must be stored already.
        self.early += [f"{e.id} {e.name}" for e in self.seen if e.name in STORED_AT_ONCE and e.id not in self.stored]
        if self.refuse is not None and any(e.name == self.refuse for w in writes for e in w.events):
            self.refuse = None
            return [WriteFailure(w.debate_id, LeaseLost(w.debate_id, 1)) for w in writes]
        failures = self.write_all(writes)
        self.stored |= {e.id for w in writes for e in w.events}
        return failures


@pytest.mark.parametrize("refuse", [None, "round_done"])
async def test_a_stream_gets_each_turns_end_only_once_it_is_stored(
    running: tuple[Store, DebateManager, LiveDebate], monkeypatch: pytest.MonkeyPatch, refuse: str | None
) -> None:
    """The writer on a real store, a stream following the debate's log: no stored-at-once event
    reaches the stream before the store holds it. A write refused for a lost lease: the stream never
    gets what it held, and nothing after it from this replica."""
    store, manager, live = running
    seen: list[LoggedEvent] = []
    recorder = _Recorder(store, seen, refuse)
    monkeypatch.setattr(store, "write_all", recorder)
    reader = asyncio.create_task(_read(live.log, seen))
    live.engine.on_event = lambda event: manager.writer.on_event(live, event)
    await live.engine.run(live.task)
    await asyncio.sleep(0.05)
    live.log.close()
    await asyncio.wait_for(reader, 10)
    assert recorder.early == []
    names = [e.name for e in seen]
    if refuse is None:
        assert names.count("turn_done") == 5 and names[-1] == "debate_done"
        assert {e.id for e in seen if e.name in STORED_AT_ONCE} <= recorder.stored
    else:
        assert live.fenced and "round_done" not in names and "debate_done" not in names
        assert names.count("turn_done") == 2  # round 1's turns, stored before the refused write


@pytest.mark.parametrize("then", ["stored", "lease lost"])
async def test_a_debates_end_waits_for_a_store_out_of_reach(
    running: tuple[Store, DebateManager, LiveDebate], monkeypatch: pytest.MonkeyPatch, then: str
) -> None:
    """The store out of reach when the debate ended: the other held events go on to the streams (the
    debate runs on meanwhile), but its debate_done was sent too, and a client stopped reading on an
    end the store never held when the lease was lost meanwhile (another replica ran the debate again).
    The end now waits for its write: sent once stored, never when the retried write is refused."""
    from moot.server.state import StoreUnavailable

    store, manager, live = running
    seen: list[LoggedEvent] = []
    write_all = store.write_all
    tries: list[str] = []

    def flaky(writes: Iterable[Write]) -> list[WriteFailure]:
        writes = list(writes)
        if any(e.name == "debate_done" for w in writes for e in w.events) or tries:
            tries.append("tried")
            if len(tries) < 3:  # out of reach twice, then back (or refusing the lost lease)
                return [WriteFailure(w.debate_id, StoreUnavailable("down (test)")) for w in writes]
            if then == "lease lost":
                return [WriteFailure(w.debate_id, LeaseLost(w.debate_id, 1)) for w in writes]
        return write_all(writes)

    monkeypatch.setattr(store, "write_all", flaky)
    reader = asyncio.create_task(_read(live.log, seen))
    live.engine.on_event = lambda event: manager.writer.on_event(live, event)
    await live.engine.run(live.task)
    await asyncio.sleep(0.1)
    assert "debate_done" not in [e.name for e in seen] and "round_done" in [e.name for e in seen]
    await asyncio.sleep(1.5)  # the retries (every 0.5 s)
    live.log.close()
    await asyncio.wait_for(reader, 10)
    ended = [e.name for e in seen][-1] == "debate_done"
    assert len(tries) >= 3 and ended == (then == "stored"), ([e.name for e in seen], tries)


async def test_a_request_waiting_for_the_end_waits_until_the_store_holds_it(
    running: tuple[Store, DebateManager, LiveDebate], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chat completion or a response not streamed (an MCP call too) answers once ``ended()``: it
    answered from a debate that had ended here while its end was not stored (the store out of
    reach), an answer another replica could contradict if the lease was lost meanwhile. It now
    waits for the write of the end."""
    from moot.server.state import StoreUnavailable

    store, manager, live = running
    write_all = store.write_all
    tries: list[str] = []

    def flaky(writes: Iterable[Write]) -> list[WriteFailure]:
        writes = list(writes)
        if any(e.name == "debate_done" for w in writes for e in w.events) and len(tries) < 2:
            tries.append("down")  # out of reach twice (retried every 0.5 s), then back
            return [WriteFailure(w.debate_id, StoreUnavailable("down (test)")) for w in writes]
        return write_all(writes)

    monkeypatch.setattr(store, "write_all", flaky)
    manager._start(live)
    await asyncio.wait_for(live.done.wait(), 30)
    assert tries and live.log.events[-1].name == "debate_done" != live.log.shown[-1].name  # its end not stored
    await asyncio.wait_for(live.ended(), 30)
    row = store.get(live.id, with_result=False)
    assert row is not None and row.status == "complete" == live.status and len(tries) == 2, (row, tries)


async def test_a_request_waiting_for_a_held_end_gets_the_end_the_store_keeps(
    running: tuple[Store, DebateManager, LiveDebate], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store out of reach at the end, then the end's write refused for a lost lease (another
    replica took the debate over and ended it otherwise): the debate, no longer live here, was not
    fenced, and a request waiting for it answered with this replica's end against the store's."""
    import dataclasses

    from moot.server.state import StoreUnavailable

    store, manager, live = running
    write_all = store.write_all
    tries: list[str] = []

    def flaky(writes: Iterable[Write]) -> list[WriteFailure]:
        writes = list(writes)
        if not any(e.name == "debate_done" for w in writes for e in w.events):
            return write_all(writes)
        tries.append("tried")
        if len(tries) == 1:
            return [WriteFailure(w.debate_id, StoreUnavailable("down (test)")) for w in writes]
        # meanwhile another replica took the debate over and ended it otherwise
        write_all([dataclasses.replace(w, status="failed", error="ended at replica B") for w in writes])
        return [WriteFailure(w.debate_id, LeaseLost(w.debate_id, w.epoch or 1)) for w in writes]

    monkeypatch.setattr(store, "write_all", flaky)
    manager._start(live)
    await asyncio.wait_for(live.done.wait(), 30)
    await asyncio.wait_for(live.ended(), 30)
    row = store.get(live.id, with_result=False)
    assert row is not None and row.status == "failed" and len(tries) == 2
    assert live.fenced and live.settled and live.status == "failed", (live.status, live.fenced, live.settled)
    # its log here, numbered as this replica numbered it, is no longer what readers get: the store's is
    assert manager.log_of(live.id, from_store=False) is None


def test_a_turn_done_carries_the_turn_as_validating_it_would() -> None:
    """``turn_view`` builds the view from the turn's fields without validating them again: the same
    JSON, every field set, as the view validated from the turn's dump."""
    from moot.core.types import ParseFailure, Turn
    from moot.models.base import Message, Usage
    from moot.server.schemas import TurnView
    from moot.server.state.events import turn_view

    turns = [
        Turn(speaker="a", name="A", round=2, kind="decision", model="m", messages=[Message(role="user", content="Q")],
             text='{"answer": "B"}', parsed={"answer": "B", "why": ["x", 1.5]}, usage=Usage(prompt_tokens=3),
             calls=2, latency_s=0.25, finish_reason="length", trimmed=True, carried=True),
        Turn(speaker="b", name="B", round=1, model="m", messages=[], error="timed out",
             parse_failure=ParseFailure(raw="{", error="cut", schema_name="answer")),
    ]  # fmt: skip
    for turn in turns:
        validated = TurnView.model_validate(turn.model_dump(exclude={"messages"}))
        assert turn_view(turn).model_dump_json() == validated.model_dump_json()
        assert turn_view(turn).model_fields_set == set(TurnView.model_fields)


async def test_a_retry_following_another_replicas_debate_outlives_a_store_out_of_reach(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request with an Idempotency-Key that joins a debate another replica runs follows it in the
    store. A moment without the store killed the follower before it told the request: it was never
    answered. It now waits for the store, then gives the stored end."""
    from moot.server.policy import Prepared
    from moot.server.state import StoreUnavailable, idempotency

    store = open_store(tmp_path / "m.sqlite")
    manager = DebateManager(ServerSettings(db=tmp_path / "m.sqlite"), store)
    monkeypatch.setattr(idempotency, "FOLLOW_S", 0.05)
    try:
        spec, task = get_preset("single"), DebateTask(question="Q?")
        prepared = Prepared(spec=spec, task=task, engine=Engine(spec, ScriptedModel(["a"])), model="scripted")
        idem = idempotency.Idempotency(key="k", debate_id="e" * 32, body="h")
        store.create(idem.debate_id, protocol="single", question="Q?", model="scripted", request=idem.recorded())
        claim = store.claim("other-replica", 30, debate_id=idem.debate_id)
        assert claim is not None
        live = idempotency._existing(manager, prepared, idem)
        assert live is not None and not live.done.is_set()
        get, down = store.get, [True]

        def flaky(*args: object, **kwargs: object) -> object:
            if down[0]:
                raise StoreUnavailable("a restart (test)")
            return get(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(store, "get", flaky)
        await asyncio.sleep(0.2)
        down[0] = False
        store.write_one(Write(idem.debate_id, None, status="complete", epoch=claim.epoch))  # the other replica's end
        await asyncio.wait_for(live.ended(), 10)
        assert live.status == "complete"
    finally:
        await manager.shutdown()
        store.close()


async def test_a_debate_stopped_from_outside_holds_its_end_until_stored_too(
    running: tuple[Store, DebateManager, LiveDebate], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel (or a shutdown's interruption) while the store is out of reach: its debate_done went
    to the streams at once (0fe2cd0 held only the engine's own end)."""
    from moot.server.state import StoreUnavailable

    store, manager, live = running
    seen: list[LoggedEvent] = []

    def down(writes: Iterable[Write]) -> list[WriteFailure]:
        return [WriteFailure(w.debate_id, StoreUnavailable("down (test)")) for w in list(writes)]

    monkeypatch.setattr(store, "write_all", down)
    reader = asyncio.create_task(_read(live.log, seen))
    await asyncio.sleep(0)
    manager._stopped(live, "cancelled")
    await asyncio.wait_for(reader, 10)  # (the log closed: the reader ends at what was released)
    assert "debate_done" not in [e.name for e in seen]


async def test_a_debate_left_in_the_shared_queue_by_a_store_out_of_reach_is_followed_to_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store out of reach when a replica claims a debate it was sent: the debate stays in the
    shared queue, where a poller runs it once the store is back. A request waiting for it was answered
    503 "never started" at once; it now follows the debate to its end."""
    from moot.server.state import StoreUnavailable
    from moot.server.state.sqlite import SqliteStore

    monkeypatch.setattr(SqliteStore, "shared", property(lambda self: True))  # (as PostgreSQL's is)
    store = open_store(tmp_path / "moot.sqlite")
    manager = DebateManager(ServerSettings(db=tmp_path / "moot.sqlite", poll_s=60), store)
    try:
        live = _live(store)
        claim = store.claim

        def unreachable(*args: object, **kwargs: object) -> object:
            raise StoreUnavailable("down (test)")

        monkeypatch.setattr(store, "claim", unreachable)
        manager._start(live)
        await asyncio.wait_for(live.done.wait(), 10)
        waiting = asyncio.create_task(live.ended())
        await asyncio.sleep(0.3)
        assert not waiting.done()  # still queued in the store: followed, not answered
        monkeypatch.setattr(store, "claim", claim)
        taken = store.claim("another-replica", 30, debate_id=live.id)  # a poller takes it, and ends it
        assert taken is not None
        store.write_one(Write(live.id, None, status="complete", epoch=taken.epoch))
        await asyncio.wait_for(waiting, 10)
        assert live.settled and live.status == "complete"
    finally:
        await manager.shutdown()
        store.close()
