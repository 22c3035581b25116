"""What storing a running debate's transcript costs by the debate's length: whole at every write, or
turn by turn.

    .venv/bin/python benchmarks/bench_transcript_writes.py [--turns 5,20,60] [--debates 16] [--reps 5]

``moot serve`` stores a debate's transcript at every finished turn and round, so that a replica
taking it over keeps them. Two ways, on the same store, interleaved, repeated:

- ``whole``: the transcript's JSON in ``debates.result`` at each write, encoded whole (a write
  with no encoder, such as a start-up's recovery);
- ``cached``: the same, each finished turn's JSON encoded once and spliced in (:class:`Cached`, as
  moot serve's writes of a running debate were before schema 5);
- ``rows``: its frame in ``debates.result`` and each finished turn in a ``turns`` row, written once
  (:class:`moot.server.state.result_json.ResultJson`, a running debate's writes since schema 5).

One SQLite store (a temporary file in WAL mode, as moot serve's default) with its automatic
checkpoints off, so that the growth of its write-ahead log is what the writes wrote. D debates grow
by one turn at a time (120 words; its prompt holds the earlier replies, as a debate's prompts do:
the transcript grows by the square of its turns), each written after each turn. Per length and way:
CPU µs of this process and KiB of write-ahead log per turn, median (range) over the repetitions
(the ways' order rotated); the ratios set the turn-by-turn store against the one it replaced.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

from moot.core.types import DebateResult, DebateTask, Round, Turn
from moot.models.base import Message
from moot.secrets import redact_json_of, redacted
from moot.server.state import Write, open_store
from moot.server.state.result_json import ResultJson, Split
from moot.server.state.sqlite import SqliteStore

REPLY = " ".join(["word"] * 120)


def grow(result: DebateResult, k: int) -> None:
    """The debate's turn ``k`` (from 0), two speakers a round, its prompt holding the replies before it."""
    if k % 2 == 0:
        result.rounds.append(Round(index=k // 2 + 1))
    earlier = "\n\n".join(t.text for r in result.rounds for t in r.turns)
    result.rounds[-1].turns.append(
        Turn(
            speaker=f"a{k % 2}",
            name=f"Agent {k % 2}",
            round=k // 2 + 1,
            model="openai:bench",
            messages=[Message(role="system", content="Debate."), Message(role="user", content=earlier)],
            raw=REPLY,
            text=REPLY,
        )
    )
    result.llm_calls = k + 1


class Cached(ResultJson):
    """moot serve's encoder of a running debate's transcript before schema 5 (9c7f413's
    ``ResultJson.encode``): the whole transcript at each write, in ``debates.result``, each finished
    turn's JSON made once (with :meth:`ResultJson._turn`'s cache) and spliced in; no rows."""

    __slots__ = ()

    def split(self, result: DebateResult, secrets: Iterable[str] = ()) -> Split:
        known = redacted(secrets)
        rounds = ",".join(
            f'{{"index":{r.index},"turns":[{",".join(self._turn(t, known) for t in r.turns)}]}}' for r in result.rounds
        )
        decision = ",".join(self._turn(t, known) for t in result.decision_turns)
        head = redact_json_of(result.model_dump_json(include=_HEAD), known)
        tail = redact_json_of(result.model_dump_json(include=_TAIL), known)
        whole = f'{head[:-1]},"rounds":[{rounds}],"decision_turns":[{decision}],{tail[1:]}'
        return Split(whole, [], 0, prune=False)


_FIELDS = list(DebateResult.model_fields)
_HEAD = set(_FIELDS[: _FIELDS.index("rounds")])
_TAIL = set(_FIELDS[_FIELDS.index("decision_turns") + 1 :])


def wal_bytes(store: SqliteStore) -> int:
    wal = Path(f"{store.path}-wal")
    return wal.stat().st_size if wal.exists() else 0


def run(store: SqliteStore, way: str, debates: int, turns: int) -> tuple[float, float]:
    """CPU seconds and bytes of write-ahead log per turn of one pass of ``way`` on new debates."""
    ids = [uuid.uuid4().hex for _ in range(debates)]
    epochs: dict[str, int] = {}
    for d in ids:
        store.create(d, protocol="bench", question="Is 7 prime?", model="openai:bench", request={})
        claim = store.claim("bench", 600, debate_id=d)
        assert claim is not None
        epochs[d] = claim.epoch
    results = {d: DebateResult(protocol="bench", task=DebateTask(question="Is 7 prime?")) for d in ids}
    encoders = {d: Cached() if way == "cached" else ResultJson() for d in ids}
    store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    cpu = 0.0
    for k in range(turns):
        for d in ids:
            grow(results[d], k)
            write = Write(d, results[d], epoch=epochs[d], encoder=None if way == "whole" else encoders[d])
            c0 = time.process_time()
            store.write_one(write)
            cpu += time.process_time() - c0
    written = wal_bytes(store)
    return cpu / (debates * turns), written / (debates * turns)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", default="5,20,60", help="debate lengths, in turns (default 5,20,60)")
    ap.add_argument("--debates", type=int, default=16, help="debates per pass (default 16)")
    ap.add_argument("--reps", type=int, default=5, help="repetitions, the two ways alternated (default 5)")
    args = ap.parse_args(argv)
    lengths = [int(t) for t in args.turns.split(",")]
    folder = Path(tempfile.mkdtemp(prefix="bench-transcript-writes-"))
    store = open_store(folder / "bench.sqlite")
    assert isinstance(store, SqliteStore)
    store.conn.execute("PRAGMA wal_autocheckpoint = 0")
    load = os.getloadavg()[0]
    run(store, "rows", 4, 4)  # warm-up
    rows: list[str] = []
    ways = ("whole", "cached", "rows")
    for turns in lengths:
        cpu: dict[str, list[float]] = {way: [] for way in ways}
        wal: dict[str, list[float]] = {way: [] for way in ways}
        for rep in range(args.reps):
            for way in ways[rep % 3 :] + ways[: rep % 3]:
                c, w = run(store, way, args.debates, turns)
                cpu[way].append(1e6 * c)
                wal[way].append(w / 1024)
        ratio_cpu = statistics.median(cpu["rows"]) / statistics.median(cpu["cached"])
        ratio_wal = statistics.median(wal["rows"]) / statistics.median(wal["cached"])
        rows.append(
            f"| {turns} | {spread(cpu['whole'])} | {spread(cpu['cached'])} | {spread(cpu['rows'])} | {ratio_cpu:.2f} "
            f"| {spread(wal['cached'])} | {spread(wal['rows'])} | {ratio_wal:.2f} |"
        )
    store.close()
    print(
        f"# a running debate's transcript stored at each turn: {args.debates} debates a pass, {args.reps} "
        f"repetitions (load average {load:.2f} at start, {os.getloadavg()[0]:.2f} at end)\n"
    )
    print("| turns | whole, CPU µs/turn | cached | rows | rows / cached | cached, WAL KiB/turn | rows "
          "| rows / cached |")  # fmt: skip
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
