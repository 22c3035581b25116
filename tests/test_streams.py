"""The server's event stream (moot.server.http.streams): what it writes, its keepalives, and how it
ends (the client gone, a HEAD request, a graceful stop), driven as uvicorn drives an ASGI app."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from moot.server.http.streams import KEEPALIVE, EventStream, stop_streams
from moot.server.state.events import sse_event


class Connection:
    """One HTTP request's ASGI channels: what the app sent, and a client that can leave."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.gone = asyncio.Event()
        self.received = 0

    async def receive(self) -> dict[str, Any]:
        self.received += 1
        if self.received == 1:
            return {"type": "http.request", "body": b"", "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")

    @property
    def ended(self) -> bool:
        return any(m["type"] == "http.response.body" and not m.get("more_body", False) for m in self.sent)


def stream_of(content: AsyncIterator[bytes], **options: Any) -> EventStream:
    return EventStream(content, **{"keepalive_s": 60.0, "grace_s": 1.0, **options})


def test_an_event_is_its_lines_and_a_line_break_in_data_splits_it() -> None:
    assert sse_event('{"a":1}') == b'data: {"a":1}\n\n'
    assert sse_event("x", event="done", id=7) == b"id: 7\nevent: done\ndata: x\n\n"
    assert sse_event("one\ntwo\r\nthree\rfour") == b"data: one\ndata: two\ndata: three\ndata: four\n\n"


async def test_the_events_are_sent_as_given_then_the_stream_ends() -> None:
    async def events() -> AsyncIterator[bytes]:
        yield sse_event("1")
        yield sse_event("2")

    conn = Connection()
    response = stream_of(events(), headers={"x-moot-debate-id": "d1"})
    await asyncio.wait_for(response({"type": "http", "method": "GET"}, conn.receive, conn.send), 10)
    start = conn.sent[0]
    assert start["type"] == "http.response.start" and start["status"] == 200
    headers = dict(start["headers"])
    assert headers[b"content-type"].startswith(b"text/event-stream")
    assert headers[b"cache-control"] == b"no-store" and headers[b"x-moot-debate-id"] == b"d1"
    assert conn.body == b"data: 1\n\ndata: 2\n\n"
    assert conn.ended


async def test_a_quiet_stream_sends_keepalives_and_a_busy_one_none() -> None:
    async def slow() -> AsyncIterator[bytes]:
        await asyncio.sleep(0.35)
        yield sse_event("late")

    conn = Connection()
    await asyncio.wait_for(
        stream_of(slow(), keepalive_s=0.1)({"type": "http", "method": "GET"}, conn.receive, conn.send), 10
    )
    assert conn.body.count(KEEPALIVE) >= 2
    assert conn.body.endswith(b"data: late\n\n")

    async def busy() -> AsyncIterator[bytes]:
        for i in range(20):
            await asyncio.sleep(0.02)
            yield sse_event(str(i))

    conn = Connection()
    await asyncio.wait_for(
        stream_of(busy(), keepalive_s=0.1)({"type": "http", "method": "GET"}, conn.receive, conn.send), 10
    )
    assert KEEPALIVE not in conn.body  # something went out in every interval


async def test_no_gap_after_an_event_is_longer_than_the_keepalive_time() -> None:
    """The keepalive is timed from the last thing sent: it looked every keepalive_s for a quiet
    interval, so an event just after a look left a gap of up to twice that (a chat stream's first
    keepalive came 20 s after its role chunk, past the 10 s docs/scale-out.md promises a proxy)."""

    async def one_then_quiet() -> AsyncIterator[bytes]:
        yield sse_event("first")
        await asyncio.sleep(1.25)
        yield sse_event("last")

    conn = Connection()
    await asyncio.wait_for(
        stream_of(one_then_quiet(), keepalive_s=0.5)({"type": "http", "method": "GET"}, conn.receive, conn.send), 10
    )
    # After "first": keepalives at about 0.5 and 1.0 s (looking every 0.5 s, only the look at 1.0 s
    # found an interval with nothing sent).
    assert conn.body.count(KEEPALIVE) >= 2, conn.body
    assert conn.body.startswith(b"data: first\n\n") and conn.body.endswith(b"data: last\n\n")


async def test_a_client_that_leaves_ends_the_stream_and_its_generator_cleans_up() -> None:
    cleaned = asyncio.Event()

    async def endless() -> AsyncIterator[bytes]:
        try:
            while True:
                yield sse_event("tick")
                await asyncio.sleep(0.01)
        finally:
            cleaned.set()

    conn = Connection()
    task = asyncio.ensure_future(stream_of(endless())({"type": "http", "method": "GET"}, conn.receive, conn.send))
    await asyncio.sleep(0.1)
    conn.gone.set()
    await asyncio.wait_for(task, 10)  # the request's task ends, not cancelled
    assert cleaned.is_set() and not task.cancelled()


async def test_head_gets_the_headers_and_never_starts_the_stream() -> None:
    started = False

    async def events() -> AsyncIterator[bytes]:
        nonlocal started
        started = True
        yield b""

    conn = Connection()
    await asyncio.wait_for(stream_of(events())({"type": "http", "method": "HEAD"}, conn.receive, conn.send), 10)
    assert conn.sent[0]["type"] == "http.response.start" and conn.body == b"" and conn.ended
    assert not started


@pytest.mark.parametrize("ends_in_grace", [True, False])
async def test_a_graceful_stop_starts_the_drain_and_cuts_a_stream_after_its_grace(ends_in_grace: bool) -> None:
    stop = asyncio.Event()
    drains = 0

    def drain() -> None:
        nonlocal drains
        drains += 1
        if ends_in_grace:
            stop.set()

    async def events() -> AsyncIterator[bytes]:
        yield sse_event("first")
        await stop.wait()  # a debate interrupted by the drain ends its stream with its reason
        yield sse_event("stopped")

    conn = Connection()
    task = asyncio.ensure_future(
        stream_of(events(), grace_s=0.3, on_stop=drain)({"type": "http", "method": "GET"}, conn.receive, conn.send)
    )
    await asyncio.sleep(0.1)
    stop_streams()
    await asyncio.wait_for(task, 10)
    assert drains == 1
    assert (b"data: stopped" in conn.body) is ends_in_grace
    # A stream opened on a stopping server is told at once.
    late = Connection()
    stop.clear()
    await asyncio.wait_for(
        stream_of(events(), grace_s=0.1, on_stop=drain)({"type": "http", "method": "GET"}, late.receive, late.send), 10
    )
    assert drains == 2


async def test_moot_serves_server_tells_the_streams_when_it_is_told_to_stop() -> None:
    import signal

    import uvicorn

    from moot.server.http.connections import StoppingServer

    drains = 0

    def drain() -> None:
        nonlocal drains
        drains += 1

    async def endless() -> AsyncIterator[bytes]:
        while True:
            yield sse_event("tick")
            await asyncio.sleep(0.01)

    conn = Connection()
    task = asyncio.ensure_future(
        stream_of(endless(), grace_s=0.2, on_stop=drain)({"type": "http", "method": "GET"}, conn.receive, conn.send)
    )
    await asyncio.sleep(0.05)
    server = StoppingServer(uvicorn.Config(lambda *a: None))
    server.handle_exit(signal.SIGTERM, None)  # as its signal handler is called, on the loop's thread
    assert server.should_exit
    await asyncio.wait_for(task, 10)  # drained, then cut after its grace
    assert drains == 1


def test_moot_serves_server_freezes_what_its_start_made_and_collects_young_objects_less_often(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import gc

    import uvicorn

    from moot.server.http.connections import GC_YOUNG, StoppingServer

    seen: dict[str, object] = {}
    monkeypatch.setattr(
        uvicorn.Server,
        "run",
        lambda self, sockets=None: seen.update(threshold=gc.get_threshold(), frozen=gc.get_freeze_count()),
    )
    before = gc.get_threshold()
    try:
        StoppingServer(uvicorn.Config(lambda *a: None)).run()
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
    assert seen["threshold"] == (GC_YOUNG, *before[1:])
    assert isinstance(seen["frozen"], int) and seen["frozen"] > 10_000


async def test_a_drain_that_fails_still_stops_every_other_stream(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> None:
        raise RuntimeError("no drain")

    async def endless() -> AsyncIterator[bytes]:
        while True:
            yield sse_event("tick")
            await asyncio.sleep(0.01)

    conns = [Connection(), Connection()]
    tasks = [
        asyncio.ensure_future(
            stream_of(endless(), grace_s=0.1, on_stop=broken)({"type": "http", "method": "GET"}, c.receive, c.send)
        )
        for c in conns
    ]
    await asyncio.sleep(0.05)
    stop_streams()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)  # both cut after their grace
    assert caplog.text.count("could not start the drain") == 2
