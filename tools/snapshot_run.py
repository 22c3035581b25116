"""Snapshot a running eval run into a gzipped store to commit, without the request-cache entries it
imported from other committed stores (``--cache-from`` brings them back on resume):

    python tools/snapshot_run.py runs/arc-faithful docs/results/faithful/arc-challenge.sqlite.gz \\
        --minus docs/results/arc-challenge-1.5b/run.sqlite.gz

``--lean`` leaves out the request cache's top alternatives of each generated token (llama.cpp's
``top_logprobs``), three quarters of a long run's store: no analysis reads them (a turn's answer
probability reads each token's own log-probability, kept), and a run resumed from the snapshot takes
its cached replies as they are. A reply of one token keeps them: CISC's P(True) is read from them.
The bytes they took are zeroed in place (``secure_delete``), not vacuumed away, so that a lean
snapshot keeps the run's page layout as a full one does.

The snapshot is taken with SQLite's online backup, so the run may keep running. It keeps the run's
own page layout (no VACUUM, unless entries were left out) and is gzipped "rsyncable" (the compressor
starts afresh at points set by the content, as ``gzip --rsyncable`` does): a run that grew between two
snapshots changes a few pages in place and appends the rest, so the two compressed files share all
but those parts, and git stores the older one as a delta of the newer. A store vacuumed and gzipped
whole changes throughout, and each committed snapshot of a long run cost its whole size again (the
GSM8K run's were 40-50 MB each).
"""

from __future__ import annotations

import argparse
import gzip
import json
import mmap
import shutil
import sqlite3
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

#: Where the compressor may start afresh: after a byte where the sum of the last WINDOW bytes is a
#: multiple of WINDOW (gzip --rsyncable's rule), and at least MIN_CHUNK bytes after the last such
#: start (two streams that differ resynchronise at the first such point both share). On the GSM8K
#: run's store (160 MB): 2.9% more bytes than zlib's level 9 in one stream; a start every 4 KB or so
#: cost a fifth more.
WINDOW, MIN_CHUNK = 4096, 131072


#: Bytes whose cut points are found at once (the window sums of a block take 8 bytes a byte).
BLOCK = 1 << 23


def cuts(data: bytes | mmap.mmap) -> Iterator[int]:
    """Each ``p`` (in order) where the sum of the WINDOW bytes ending at ``p`` (fewer at the start) is
    a multiple of WINDOW, found a block at a time (a store of hundreds of MB is never held as
    8-byte sums: the sums are taken modulo 2**32, which WINDOW divides)."""
    for start in range(0, len(data), BLOCK):
        low = max(0, start - WINDOW)
        seg = np.frombuffer(data, dtype=np.uint8, count=min(len(data), start + BLOCK) - low, offset=low)
        sums = np.cumsum(seg, dtype=np.uint32)
        sums[WINDOW:] -= sums[:-WINDOW].copy()
        for at in np.flatnonzero(sums[start - low :] % WINDOW == 0).tolist():
            yield start + at + 1


def rsyncable_gzip(source: Path, out: Path, level: int = 9) -> None:
    """``source`` gzipped into ``out`` so that equal stretches of two inputs give equal compressed
    bytes: a full flush (no back-reference across it) at each content-defined cut. No time or name
    in the header: the same data gives the same bytes."""
    compressor = zlib.compressobj(level, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # the gzip format, mtime 0
    with source.open("rb") as f, out.open("wb") as sink:
        if source.stat().st_size == 0:
            sink.write(compressor.flush())
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            start = 0
            for cut in cuts(data):
                if cut - start >= MIN_CHUNK:
                    sink.write(compressor.compress(data[start:cut]) + compressor.flush(zlib.Z_FULL_FLUSH))
                    start = cut
            sink.write(compressor.compress(data[start:]) + compressor.flush())


def keys_of(store: Path, tmp: Path) -> set[str]:
    path = store
    if store.suffix == ".gz":
        path = tmp / (store.parent.name + ".sqlite")
        with gzip.open(store, "rb") as src, path.open("wb") as dst:
            shutil.copyfileobj(src, dst)
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {row[0] for row in conn.execute("SELECT key FROM request_cache")}
    finally:
        conn.close()


def lean_cache(conn: sqlite3.Connection) -> int:
    """Drop ``top`` from every token of each cached reply of more than one token; the number of
    replies changed. The JSON is written compact, its keys in their order."""
    changed = []
    for key, response in conn.execute("SELECT key, response FROM request_cache"):
        data = json.loads(response)
        tokens = data.get("logprobs")
        if isinstance(tokens, list) and len(tokens) > 1 and any("top" in t for t in tokens):
            for t in tokens:
                t.pop("top", None)
            changed.append((json.dumps(data, ensure_ascii=False, separators=(",", ":")), key))
    conn.executemany("UPDATE request_cache SET response = ? WHERE key = ?", changed)
    return len(changed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="the run folder (holds run.sqlite)")
    parser.add_argument("out", type=Path, help="the .sqlite.gz to write")
    parser.add_argument(
        "--minus", type=Path, action="append", default=[], help="a committed store whose entries to leave out"
    )
    parser.add_argument(
        "--lean", action="store_true", help="leave out the cached replies' top alternatives per token (see above)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        copy = tmp / "run.sqlite"
        src = sqlite3.connect(f"file:{args.run / 'run.sqlite'}?mode=ro", uri=True)
        dst = sqlite3.connect(copy)
        src.backup(dst)
        src.close()
        dropped = 0
        for store in args.minus:
            keys = keys_of(store, tmp)
            cur = dst.executemany("DELETE FROM request_cache WHERE key = ?", ((k,) for k in keys))
            dropped += cur.rowcount
        if args.lean:
            # The bytes a shorter reply frees are zeroed, not vacuumed away: the store keeps its page
            # layout (the rsyncable gzip and git's deltas hold), and zeros compress to almost nothing.
            dst.execute("PRAGMA secure_delete = ON")
        leaned = lean_cache(dst) if args.lean else 0
        dst.commit()
        if dropped:  # the entries' pages freed, not kept as free pages
            dst.execute("VACUUM")
        dst.close()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        # The same store gives the same bytes, so re-publishing a finished run leaves its committed
        # snapshot as it is (no new blob in the history).
        rsyncable_gzip(copy, args.out)
    lean = f"; {leaned} cached replies without their top alternatives" if args.lean else ""
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.1f} MB; {dropped} imported cache entries left out{lean})")


if __name__ == "__main__":
    main()
