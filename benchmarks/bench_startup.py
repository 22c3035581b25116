"""How long a ``moot`` command takes to start: wall and CPU seconds of whole processes, repeated.

    .venv/bin/python benchmarks/bench_startup.py [--reps 10] [--compare SRC]

Each repetition starts, one after the other, ``moot version`` (the command line's own start: what
every command pays before it does anything), ``moot debate --help`` and ``moot serve --help``, as
``python -c "from moot.cli.main import main; main()" ...`` (what the ``moot`` script runs). With
``--compare SRC`` (another checkout's ``src``, e.g. a ``git worktree`` of an earlier commit), every
repetition also runs the same commands with that ``src`` first on ``PYTHONPATH``, interleaved with
this one's, and the ratio of the medians is printed: the machine is shared, so compare within a run.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

COMMANDS = {"version": ["version"], "debate --help": ["debate", "--help"], "serve --help": ["serve", "--help"]}


def run_once(args: list[str], src: str | None) -> tuple[float, float]:
    """One process: its wall seconds and its CPU seconds (user + system, from the kernel's rusage)."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", "from moot.cli.main import main; main()", *args],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=10, help="repetitions (default 10)")
    ap.add_argument("--compare", metavar="SRC", help="another checkout's src directory, run interleaved")
    args = ap.parse_args(argv)
    sources: dict[str, str | None] = {"this": None}
    if args.compare:
        sources["compared"] = args.compare
    import moot

    for src in (str(Path(moot.__file__).parent.parent), args.compare):
        if src is not None:
            subprocess.run([sys.executable, "-m", "compileall", "-q", src], check=True, stdout=subprocess.DEVNULL)
    cpu: dict[tuple[str, str], list[float]] = {(s, c): [] for s in sources for c in COMMANDS}
    wall: dict[tuple[str, str], list[float]] = {(s, c): [] for s in sources for c in COMMANDS}
    loads = []
    for rep in range(args.reps):
        loads.append(os.getloadavg()[0])
        order = list(sources.items()) if rep % 2 == 0 else list(reversed(sources.items()))
        for name, src in order:
            for command, cli in COMMANDS.items():
                w, c = run_once(cli, src)
                wall[(name, command)].append(w)
                cpu[(name, command)].append(c)
    print(f"# moot's start, {args.reps} repetitions (load average {min(loads):.2f}-{max(loads):.2f})\n")
    print("| source | command | wall s, median (range) | CPU s, median (range) |")
    print("| --- | --- | ---: | ---: |")
    for name in sources:
        for command in COMMANDS:
            print(f"| {name} | `moot {command}` | {spread(wall[(name, command)])} | {spread(cpu[(name, command)])} |")
    if args.compare:
        print("\n| command | CPU, this / compared (medians) |")
        print("| --- | ---: |")
        for command in COMMANDS:
            ratio = statistics.median(cpu[("this", command)]) / statistics.median(cpu[("compared", command)])
            print(f"| `moot {command}` | {ratio:.3f} |")


if __name__ == "__main__":
    main()
