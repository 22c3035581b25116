"""Where the CPU of one arm of ``bench_interleaved.py`` goes, counted on the CPU only.

    .venv/bin/python benchmarks/profile_cpu.py --arm S [--reps N] [--seconds 25] [--keep FILE] [--top N]

Runs ``bench_interleaved.py --arms ARM`` with ``PYTHONPERFSUPPORT=1`` (Python 3.12's trampolines,
which name each Python function in a native stack), records the process that runs the debates (the
server for S, C and R; the benchmark itself for E and I) with ``perf record -e cpu-clock --call-graph
dwarf`` for ``--seconds`` once it is warm, and prints the share of its samples by group, each sample
counted where its innermost Python function is (with the C and kernel code under it: a SQLite commit
with its ``pwrite``, a socket write with its system call), and the collector's own samples apart. The
milliseconds are the shares of the arm's median CPU per model call in that run.

A sampler that reads Python's stacks from outside (py-spy) counts wall-clock samples of a thread it
finds running, and a thread waiting in the kernel may count; ``cpu-clock`` counts time on a CPU only.
Needs Linux ``perf`` (Debian: ``apt-get install linux-perf``) and Python 3.12 or later.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_engine import CALLS_PER_DEBATE  # noqa: E402

#: The groups, by the file of a sample's innermost Python function (the first that matches).
GROUPS: list[tuple[str, str]] = [
    ("engine-equivalent (model call, engine, event loop)",
     r"aiohttp/|moot/models/|moot/core/|asyncio/|selectors|multidict|yarl|propcache|_weakrefset|weakref\.py|contextlib"
     r"|socket\.py|<string>"),
    ("store (SQL, transactions, the stored JSON)", r"moot/server/state/(sql|sqlite|postgres|base|result_json)"),
    ("events (writer, logs, leases, bus, manager)", r"moot/server/state/"),
    ("HTTP (uvicorn, Starlette, FastAPI, middleware, routes)",
     r"fastapi|starlette|uvicorn|moot/server/http|anyio|sniffio|h11|httptools"),
    ("pydantic (models built, validated, dumped)", r"pydantic"),
    ("secrets (redaction)", r"moot/secrets"),
    ("OpenAI door", r"moot/server/openai/"),
    ("policy, presets, schemas", r"moot/server/policy|moot/protocols|moot/server/schemas"),
    ("other moot", r"moot/"),
]  # fmt: skip
COLLECTOR = "garbage collector"


def groups_of(script: str, pid: int | None = None) -> tuple[Counter[str], int]:
    """``perf script`` output: the samples (of ``pid``) by group, and how many there were."""
    counts: Counter[str] = Counter()
    total = 0
    for sample in script.split("\n\n"):
        lines = [line.strip() for line in sample.strip().splitlines() if line.strip()]
        if len(lines) < 2:
            continue
        if pid is not None and lines[0].split()[1:2] != [str(pid)]:
            continue
        total += 1
        if any("gc_collect_main" in line for line in lines):
            counts[COLLECTOR] += 1
            continue
        python = next((line for line in lines[1:] if "py::" in line), "")
        counts[next((name for name, pattern in GROUPS if re.search(pattern, python)), "other")] += 1
    return counts, total


_FRAME = re.compile(r"py::([^:\s]+):(\S+)")


def functions_of(script: str, pid: int | None = None) -> Counter[str]:
    """``perf script`` output: the samples (of ``pid``) by innermost Python function, ``file:function``.
    (Only the innermost: perf's unwinding does not go on through the trampolines' frames.)"""
    own: Counter[str] = Counter()
    for sample in script.split("\n\n"):
        lines = [line.strip() for line in sample.strip().splitlines() if line.strip()]
        if len(lines) < 2 or (pid is not None and lines[0].split()[1:2] != [str(pid)]):
            continue
        found = next((f for line in lines[1:] if (f := _FRAME.search(line))), None)
        if found is not None:
            path = found.group(2).split("+0x")[0]
            short = path.split("site-packages/")[-1].split("/src/")[-1].split("benchmarks/")[-1]
            own[f"{short}:{found.group(1)}"] += 1
    return own


def _target(bench: subprocess.Popen[bytes], arm: str, deadline: float) -> int:
    """The pid that runs the debates: the benchmark's ``moot serve`` or floor child, or the benchmark."""
    if arm in ("I", "E"):
        return bench.pid
    floors = {"F": "raw", "U": "asgi", "G": "fastapi", "T": "fastapi-typed"}
    pattern = "serve --port" if arm in ("S", "C", "R") else f"floor_server.py .*floor-{floors[arm]}.sqlite"
    while time.monotonic() < deadline:
        found = subprocess.run(["pgrep", "-P", str(bench.pid), "-f", pattern], capture_output=True, text=True)
        if found.stdout.split():
            return int(found.stdout.split()[0])
        if bench.poll() is not None:
            break
        time.sleep(0.5)
    raise SystemExit("the benchmark's moot serve did not start; run bench_interleaved.py alone to see why")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--arm", required=True, choices=["I", "E", "S", "C", "R", "F", "U", "G", "T"], help="the arm to profile"
    )
    ap.add_argument(
        "--reps", type=int, default=None,
        help="repetitions of the arm, enough to be recorded (default 6 for S, C, R; 24 for I and E, which run faster)",
    )  # fmt: skip
    ap.add_argument("--seconds", type=float, default=25.0, help="seconds recorded, once warm (default 25)")
    ap.add_argument("--warm", type=float, default=12.0, help="seconds before recording starts (default 12)")
    ap.add_argument("--keep", type=Path, default=None, help="keep perf's data in this file")
    ap.add_argument(
        "--top", type=int, default=0,
        help="also list the N Python functions most samples end in (with the C and kernel code under each)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    if sys.version_info < (3, 12):
        ap.error(
            "needs Python 3.12 or later (its perf trampolines name the Python functions): run it with a 3.12 "
            "virtual environment (make dev builds one where the machine has Python 3.12)"
        )
    if shutil.which("perf") is None:
        ap.error("needs Linux perf: apt-get install linux-perf")
    served = args.arm not in ("I", "E")
    reps = args.reps if args.reps is not None else (6 if served else 24)
    with tempfile.TemporaryDirectory(prefix="profile-cpu-") as tmp:
        data = args.keep or Path(tmp) / "perf.data"
        samples = Path(tmp) / "samples.json"
        bench = subprocess.Popen(
            [sys.executable, str(HERE / "bench_interleaved.py"), "--arms", args.arm, "--reps", str(reps),
             "--json", str(samples)],
            env={**os.environ, "PYTHONPERFSUPPORT": "1"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        pid = _target(bench, args.arm, time.monotonic() + 120)
        time.sleep(args.warm)
        subprocess.run(
            [
                "perf",
                "record",
                "-q",
                "-e",
                "cpu-clock",
                "-F",
                "199",
                "--call-graph",
                "dwarf,32768",
                "-p",
                str(pid),
                "-o",
                str(data),
                "--",
                "sleep",
                str(args.seconds),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip  (it ends early, with what it has, if the benchmark ends first)
        if bench.wait() != 0 or not samples.exists():
            raise SystemExit("the benchmark failed; run bench_interleaved.py alone to see why")
        runs = json.loads(samples.read_text())
        script = subprocess.run(["perf", "script", "-i", str(data)], capture_output=True, text=True, check=True)
    per_call = statistics.median(1000 * s["cpu"] / (CALLS_PER_DEBATE * s["debates"]) for s in runs)
    counts, total = groups_of(script.stdout, pid)
    print(f"# arm {args.arm}: {total} samples of {args.seconds:g} s on the CPU; {per_call:.2f} ms CPU per model call\n")
    print("| group | share | ms per call |\n| --- | ---: | ---: |")
    for name, n in counts.most_common():
        print(f"| {name} | {100 * n / total:.1f}% | {per_call * n / total:.2f} |")
    if args.top:
        print("\n| innermost Python function | share | ms per call |\n| --- | ---: | ---: |")
        for name, n in functions_of(script.stdout, pid).most_common(args.top):
            print(f"| `{name}` | {100 * n / total:.1f}% | {per_call * n / total:.3f} |")


if __name__ == "__main__":
    main()
