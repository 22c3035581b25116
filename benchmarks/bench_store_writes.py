"""The store's writes of one moment: in one transaction, or each in its own.

    .venv/bin/python benchmarks/bench_store_writes.py [--debates 64] [--batch 3] [--turns 7] [--reps 5]

``moot serve`` gathers the writes its debates make in one turn of its event loop (a turn's end, a
round's, a debate's) and hands them to :meth:`SqlStore.write_all` together: 2.5 on average at 64
debates at once in the interleaved benchmark. This measures what a write costs made the two ways,
on the same store, interleaved, repeated:

- ``together``: :meth:`SqlStore.write_all` (one transaction, one commit);
- ``each``: each write in a transaction of its own (:meth:`SqlStore.write_one`, as before).

D debates (default 64) are created and claimed; then, ``turns`` times, each debate's transcript
grows by one 120-word turn and is written with two events, in batches of ``batch`` debates (each
transcript stored turn by turn, as a server stores a running debate's since schema 5). Per
way and repetition: wall and CPU (this process) microseconds per write. Three stores: SQLite (a
temporary file, as ``moot serve``'s default) and PostgreSQL in a throwaway cluster twice, as the
tests run it (``fsync`` and ``synchronous_commit`` off) and with PostgreSQL's defaults (a commit
waits for its WAL on disk), when PostgreSQL is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from moot.core.types import DebateResult, DebateTask, Round, Turn
from moot.server.state import StoredEvent, Write, open_store
from moot.server.state.result_json import ResultJson
from moot.server.state.sql import SqlStore
from moot.testing.services import Missing, Postgres

REPLY = " ".join(["word"] * 120)


def transcript(turns: int) -> DebateResult:
    made = [
        Turn(
            speaker=f"a{i % 2}", name=f"Agent {i % 2}", round=1 + i // 2, model="openai:bench", messages=[], text=REPLY
        )
        for i in range(turns)
    ]
    return DebateResult.model_validate(
        {
            "protocol": "bench",
            "task": DebateTask(question="Is 7 prime?"),
            "status": "running",
            "rounds": [Round(index=1, turns=made)],
            "llm_calls": turns,
        }
    )


def run(store: SqlStore, way: str, debates: int, batch: int, turns: int) -> tuple[float, float, int]:
    """Wall and CPU seconds, and the writes made, of one pass of ``way`` on new debates."""
    ids = [uuid.uuid4().hex for _ in range(debates)]
    epochs = {}
    for d in ids:
        store.create(d, protocol="bench", question="Is 7 prime?", model="openai:bench", request={})
        claim = store.claim("bench", 600, debate_id=d)
        assert claim is not None
        epochs[d] = claim.epoch
    results = [transcript(t) for t in range(1, turns + 1)]
    encoders = {d: ResultJson() for d in ids}  # (each debate's transcript stored turn by turn, as a server's)
    wall = cpu = 0.0
    writes = 0
    for t in range(turns):
        for start in range(0, debates, batch):
            made = [
                Write(
                    d,
                    results[t],
                    [StoredEvent(id=2 * t + k, name="turn_done", data=json.dumps({"n": k})) for k in (1, 2)],
                    epoch=epochs[d],
                    encoder=encoders[d],
                )
                for d in ids[start : start + batch]
            ]
            w0, c0 = time.perf_counter(), time.process_time()
            if way == "together":
                failures = store.write_all(made)
                assert not failures, failures
            else:
                for w in made:
                    store.write_one(w)
            wall += time.perf_counter() - w0
            cpu += time.process_time() - c0
            writes += len(made)
    return wall, cpu, writes


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"


def measure(name: str, open_one: Callable[[], SqlStore], args: argparse.Namespace) -> list[str]:
    store = open_one()
    run(store, "together", 8, args.batch, 2)  # warm-up
    wall: dict[str, list[float]] = {"together": [], "each": []}
    cpu: dict[str, list[float]] = {"together": [], "each": []}
    for rep in range(args.reps):
        for way in ("together", "each") if rep % 2 == 0 else ("each", "together"):
            w, c, n = run(store, way, args.debates, args.batch, args.turns)
            wall[way].append(1e6 * w / n)
            cpu[way].append(1e6 * c / n)
    store.close()
    ratio_wall = statistics.median(wall["together"]) / statistics.median(wall["each"])
    ratio_cpu = statistics.median(cpu["together"]) / statistics.median(cpu["each"])
    return [
        f"| {name} | {spread(wall['together'])} | {spread(wall['each'])} | {ratio_wall:.2f} "
        f"| {spread(cpu['together'])} | {spread(cpu['each'])} | {ratio_cpu:.2f} |"
    ]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--debates", type=int, default=64)
    ap.add_argument("--batch", type=int, default=3, help="writes handed to the store at once (default 3)")
    ap.add_argument("--turns", type=int, default=7, help="writes per debate (default 7)")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="bench-store-writes-"))
    rows: list[str] = []
    load = os.getloadavg()[0]

    def sqlite() -> SqlStore:
        store = open_store(folder / "bench.sqlite")
        assert isinstance(store, SqlStore)
        return store

    rows += measure("SQLite (file, WAL)", sqlite, args)
    for durable in (False, True):
        try:
            cluster = Postgres(durable=durable).start()
        except Missing as exc:
            rows.append(f"| PostgreSQL: not measured ({exc}) | | | | | | |")
            break
        try:

            def postgres(cluster: Postgres = cluster) -> SqlStore:
                store = open_store(cluster.url(cluster.create_database()))
                assert isinstance(store, SqlStore)
                return store

            label = "PostgreSQL, its defaults (fsync on)" if durable else "PostgreSQL as the tests run it (fsync off)"
            rows += measure(label, postgres, args)
        finally:
            cluster.close()
    print(
        f"# the store's writes: {args.debates} debates, {args.turns} writes each in batches of {args.batch}, "
        f"{args.reps} repetitions (load average {load:.2f} at start, {os.getloadavg()[0]:.2f} at end)\n"
    )
    print("| store | together, wall µs/write | each, wall µs/write | wall ratio | together, CPU µs/write "
          "| each, CPU µs/write | CPU ratio |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
