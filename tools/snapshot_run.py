"""Snapshot a running eval run into a gzipped store to commit, without the request-cache entries it
imported from other committed stores (``--cache-from`` brings them back on resume):

    python tools/snapshot_run.py runs/arc-faithful docs/results/faithful/arc-challenge.sqlite.gz \\
        --minus docs/results/arc-challenge-1.5b/run.sqlite.gz

The snapshot is taken with SQLite's online backup, so the run may keep running.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import sqlite3
import tempfile
from pathlib import Path


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="the run folder (holds run.sqlite)")
    parser.add_argument("out", type=Path, help="the .sqlite.gz to write")
    parser.add_argument(
        "--minus", type=Path, action="append", default=[], help="a committed store whose entries to leave out"
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
        dst.commit()
        dst.execute("VACUUM")
        dst.close()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        # No time or name in the gzip header: the same store gives the same bytes, so re-publishing a
        # finished run leaves its committed snapshot as it is (no new blob in the history).
        with copy.open("rb") as f, args.out.open("wb") as raw, gzip.GzipFile("", "wb", 9, raw, mtime=0) as g:
            shutil.copyfileobj(f, g)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.1f} MB; {dropped} imported cache entries left out)")


if __name__ == "__main__":
    main()
