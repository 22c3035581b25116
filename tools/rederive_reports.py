"""Re-derive committed eval reports from their committed stores, with today's analysis code:

    python tools/rederive_reports.py                       # every report tests/test_committed_results.py holds
    python tools/rederive_reports.py faithful/csqa-seeds   # one (a folder under docs/results/)

Each store (``run.sqlite.gz``, or the faithful runs' ``docs/results/faithful/NAME.sqlite.gz``) is
unpacked to a temporary folder, ``moot eval report`` is written there, and the files the committed
folder already holds (report.md, report.json, report.html, plots/) are replaced by the new ones. No
model is called and no store changes: for a change to what a report shows or how it labels it, whose
numbers must stay the same (tests/test_committed_results.py then compares report.json whole).
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import tempfile
import time
from pathlib import Path

from moot.eval.report import write_report

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"
#: The committed reports with a committed store, as tests/test_committed_results.py lists them.
STORES = {
    "arc-challenge-1.5b": "arc-challenge-1.5b/run.sqlite.gz",
    "commonsenseqa-1.5b": "commonsenseqa-1.5b/run.sqlite.gz",
    "faithful/arc-faithful": "faithful/arc-faithful.sqlite.gz",
    "faithful/csqa-faithful": "faithful/csqa-faithful.sqlite.gz",
    "faithful/csqa-seeds": "faithful/csqa-seeds.sqlite.gz",
    **{f"probe-1.5b/{d}": f"probe-1.5b/{d}/run.sqlite.gz" for d in ("boolq", "commonsenseqa", "gsm8k", "mmlu")},
}


def rederive(name: str) -> list[Path]:
    """Write the report of committed store ``name`` over the committed one's files; returns them."""
    dest = RESULTS / name
    with tempfile.TemporaryDirectory(prefix="moot-rederive-") as tmp:
        folder = Path(tmp) / "run"
        folder.mkdir()
        with gzip.open(RESULTS / STORES[name], "rb") as src, (folder / "run.sqlite").open("wb") as dst:
            shutil.copyfileobj(src, dst)
        write_report(folder)
        replaced = []
        for file in ("report.md", "report.json", "report.html"):
            if (dest / file).is_file():
                shutil.copyfile(folder / file, dest / file)
                replaced.append(dest / file)
        if (dest / "plots").is_dir() and (folder / "plots").is_dir():
            shutil.rmtree(dest / "plots")
            shutil.copytree(folder / "plots", dest / "plots")
            replaced.append(dest / "plots")
    return replaced


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help=f"which (default: all): {', '.join(STORES)}")
    args = parser.parse_args()
    unknown = [n for n in args.names if n not in STORES]
    if unknown:
        parser.error(f"no committed store for {', '.join(unknown)}; known: {', '.join(STORES)}")
    for name in args.names or list(STORES):
        started = time.monotonic()
        written = rederive(name)
        print(f"{name}: {len(written)} file(s) replaced in {time.monotonic() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
