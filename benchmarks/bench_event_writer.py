"""What ``moot serve`` adds to a debate between its engine and its streams: the event writer.

    .venv/bin/python benchmarks/bench_event_writer.py [--debates N] [--reps R]

N debates (default 150) of ``affirmative-critical`` (2 rounds, 5 calls, each reply 120 words
streamed a word at a time, as the interleaved benchmark's fake model streams them) on a scripted
model with no latency, one after another in this process, each run four ways, the ways interleaved,
R times (default 8):

- ``engine``: the engine alone, no event handler (the model then streams nothing);
- ``noop``: a handler that does nothing (the model streams every piece through the engine);
- ``tokens``: the server's writer (:class:`moot.server.state.writes.EventWriter`) on the token
  deltas only, on a SQLite store;
- ``writer``: the server's writer on every event: the log, the token window, the payloads, the
  store's writes (a temporary SQLite file, as ``moot serve``'s default).

It prints the CPU per debate (``time.process_time``) of each way, min and median over the
repetitions: the min is the one to compare (the machines are shared; interference only adds), and
``writer - engine`` is what the server's event handling costs a debate.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from moot.core.engine import Engine
from moot.core.events import Event, TokenDelta
from moot.core.types import DebateTask
from moot.models.scripted import ScriptedModel
from moot.protocols import get_preset
from moot.server.settings import ServerSettings
from moot.server.state import open_store
from moot.server.state.live import LiveDebate
from moot.server.state.manager import DebateManager

REPLY = " ".join(["word"] * 120)
WAYS = ("engine", "noop", "tokens", "writer")


async def run(way: str, debates: int, folder: Path) -> float:
    """CPU milliseconds per debate of ``debates`` debates run ``way``."""
    db = folder / f"{uuid.uuid4().hex}.sqlite"
    store = open_store(db)
    manager = DebateManager(ServerSettings(db=db), store)
    spec = get_preset("affirmative-critical")
    model = ScriptedModel(fn=lambda request: REPLY)
    start = time.process_time()
    for i in range(debates):
        task = DebateTask(question=f"Is {i} prime?")
        live = LiveDebate(id=uuid.uuid4().hex, spec=spec, task=task, engine=Engine(spec, model), model="scripted")
        store.create(live.id, protocol=spec.name, question=task.question, model="scripted", request={})
        manager.live[live.id] = live
        handler: Callable[[Event], Any] | None = None
        if way == "noop":
            handler = lambda event: None  # noqa: E731
        elif way == "tokens":
            handler = lambda event, live=live: (  # noqa: E731
                manager.writer.on_event(live, event) if type(event) is TokenDelta else None
            )
        elif way == "writer":
            handler = lambda event, live=live: manager.writer.on_event(live, event)  # noqa: E731
        live.engine.on_event = handler
        await live.engine.run(task)
        await asyncio.sleep(0)  # the writes the writer left for the loop's next turn
        manager.live.pop(live.id, None)
    cpu = time.process_time() - start
    await manager.shutdown()
    store.close()
    return cpu / debates * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debates", type=int, default=150, help="debates per way and repetition (default 150)")
    parser.add_argument("--reps", type=int, default=8, help="repetitions, the ways interleaved (default 8)")
    args = parser.parse_args()
    samples: dict[str, list[float]] = {way: [] for way in WAYS}
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.reps):
            for way in WAYS:
                samples[way].append(asyncio.run(run(way, args.debates, Path(folder))))
    end = os.getloadavg()
    print("# moot serve's event writer, per debate\n")
    print(f"- {args.debates} debates x {args.reps} repetitions per way, interleaved; affirmative-critical, 2 rounds, ")
    print("  5 calls, 120-word replies streamed a word at a time, scripted model, no latency")
    print(
        f"- load average at start {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}, at end {end[0]:.2f} / {end[1]:.2f}\n"
    )
    print("| way | CPU ms per debate, min | median | max |")
    print("| --- | ---: | ---: | ---: |")
    for way in WAYS:
        v = samples[way]
        print(f"| {way} | {min(v):.2f} | {statistics.median(v):.2f} | {max(v):.2f} |")
    extra = min(samples["writer"]) - min(samples["engine"])
    print(f"\nwriter - engine (min): {extra:.2f} ms per debate")


if __name__ == "__main__":
    main()
