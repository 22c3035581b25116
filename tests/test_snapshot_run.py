"""tools/snapshot_run.py: a run's snapshot keeps its page layout and is gzipped rsyncable, so that two
snapshots of a growing run share their compressed bytes but for what changed (git stores one as a
delta of the other), and the same store gives the same bytes."""

from __future__ import annotations

import gzip
import random
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent


def grow(db: Path, rows: range) -> None:
    rng = random.Random(rows.start)
    words = [f"w{i}" for i in range(5000)]
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE IF NOT EXISTS results (id INTEGER PRIMARY KEY, json TEXT NOT NULL)")
    conn.executemany(
        "INSERT INTO results (id, json) VALUES (?, ?)", ((i, " ".join(rng.choices(words, k=400))) for i in rows)
    )
    conn.commit()
    conn.close()


def snapshot(run: Path, out: Path) -> bytes:
    subprocess.run([sys.executable, str(ROOT / "tools" / "snapshot_run.py"), str(run), str(out)], check=True,
                   capture_output=True, timeout=300)  # fmt: skip
    return out.read_bytes()


def anchored(data: bytes) -> set[bytes]:
    """The 32 bytes after each place a given byte occurs: a sample of the compressed stream."""
    return {data[m.start() : m.start() + 32] for m in re.finditer(re.escape(b"\x42"), data)}


def test_two_snapshots_of_a_growing_run_share_all_but_what_changed(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    grow(run / "run.sqlite", range(0, 3000))
    first = snapshot(run, tmp_path / "first.gz")
    assert snapshot(run, tmp_path / "again.gz") == first  # the same store, the same bytes
    grow(run / "run.sqlite", range(3000, 3060))
    second = snapshot(run, tmp_path / "second.gz")
    restored = tmp_path / "restored.sqlite"
    restored.write_bytes(gzip.decompress(second))  # a plain gzip file, as the run script restores it
    assert sqlite3.connect(restored).execute("SELECT count(*) FROM results").fetchone() == (3060,)
    before, after = anchored(first), anchored(second)
    assert len(before) > 1000 and len(before & after) / len(before) > 0.9


def test_a_lean_snapshot_leaves_out_the_top_alternatives_of_long_replies_only(tmp_path: Path) -> None:
    from moot.models.base import ChatResponse, TokenLogprob, Usage
    from moot.models.cache import SqliteCache

    run = tmp_path / "run"
    run.mkdir()
    conn = sqlite3.connect(run / "run.sqlite")
    cache = SqliteCache(conn)
    top = {"a": -0.1, "b": -2.5}
    tokens = [TokenLogprob(token=t, logprob=-0.1, top=top) for t in ('{"answer"', ": ", "42", "}")]
    reply = ChatResponse(text='{"answer": 42}', usage=Usage(prompt_tokens=9, completion_tokens=4), logprobs=tokens)
    check = ChatResponse(text="1", usage=Usage(prompt_tokens=9, completion_tokens=1),
                         logprobs=[TokenLogprob(token="1", logprob=-0.2, top={"1": -0.2, "0": -1.7})])  # fmt: skip
    cache.put("long", "m", reply)
    cache.put("one", "m", check)
    conn.close()
    out = tmp_path / "lean.gz"
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "snapshot_run.py"), str(run), str(out), "--lean"],
                          check=True, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert "1 cached replies without their top alternatives" in done.stdout
    restored = tmp_path / "restored.sqlite"
    restored.write_bytes(gzip.decompress(out.read_bytes()))
    lean = SqliteCache(sqlite3.connect(restored))
    long, one = lean.get("long"), lean.get("one")
    assert long is not None and one is not None
    # The reply, its tokens and their own log-probabilities as they were; only the alternatives gone.
    assert long == reply.model_copy(update={"logprobs": [t.model_copy(update={"top": {}}) for t in tokens]})
    assert one == check  # a one-token reply (CISC's self-check) keeps them: P(True) reads them
    assert snapshot(run, tmp_path / "full.gz") != out.read_bytes()  # without --lean, kept
