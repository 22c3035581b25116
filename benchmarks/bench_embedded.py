"""How to lay out an evaluation run on an embedded model: what the CPU time goes to.

    .venv/bin/python benchmarks/bench_embedded.py [--model qwen2.5-1.5b] [--calls 16] [--rows abcd]

Prints one Markdown table. Every figure is generated tokens per second over a batch of typed
answers like an evaluation's (ARC-style questions, a JSON schema with reasoning and a letter,
temperature 0.7, 64-token budget), each llama.cpp instance in a process of its own, timed after
the model is loaded.

a. Two evaluation runs side by side: two processes with one llama.cpp thread each (``--calls``
   calls each, 4 slots each), against one process with two threads doing both batches (2x
   ``--calls``), with 4 slots (as one run uses them) and with 8 (the two processes' concurrency).
   Ratio above 1: run two single-thread processes.
b. Typed output's price: the same calls, one thread, with the JSON schema (grammar-constrained
   decoding) and with the schema plus 20 top log-probabilities per token (what CISC's pool asks
   for), against plain text: after a discarded warm-up batch, in one order and then the reverse;
   the mean of each. Replies differ in length (plain text is not held to the schema), so the rate
   includes each batch's prompt processing: read it as the cost per generated token.
c. A busy machine: the same typed answers beside other work, with moot's default thread count
   (the CPUs the other work leaves idle, measured when the model loads) against every CPU as
   threads (the default before). The other work: a single-thread llama.cpp worker generating
   steadily, at the same priority and at nice 10, and a real ``moot eval`` run at nice 10 (skipped
   without the ARC data). Ratio above 1: the default is right.
d. CISC's self-check: each sample followed by its one-token self-check (the sample's messages and
   reply, cut after the answer), one thread. The prompt tokens llama.cpp processes per self-check
   (the rest it reads from its KV cache), and the wall time, with ``MOOT_EMBEDDED_CACHE_REUSE=16``
   (llama.cpp reuses cached chunks past the first difference) against without. Below 1: it helps.

Compare ratios within one run: this machine's speed varies by several times between hours.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

WORKER = r"""
import asyncio, json, sys, time
from moot.models.base import ChatRequest, Message
from moot.models.embedded import EmbeddedModel
from moot.core.probes import self_check_messages

QUESTIONS = [
    "Which property of a metal suits electrical wires? A) brittle B) conducts electricity C) dull D) light",
    "What causes the seasons on Earth? A) distance to the Sun B) the tilt of its axis C) the Moon D) oceans",
    "Which change is a chemical change? A) ice melting B) paper tearing C) iron rusting D) water boiling",
    "Which organ pumps blood through the body? A) lungs B) liver C) heart D) kidneys",
]
SCHEMA = {"type": "object", "properties": {"reasoning": {"type": "string", "maxLength": 300},
          "answer": {"type": "string", "enum": ["A", "B", "C", "D"]}}, "required": ["reasoning", "answer"]}

async def main(model_name, variants, calls):
    model = EmbeddedModel(model_name)
    model.load()
    print("ready", flush=True)
    sys.stdin.readline()  # start together with the other workers
    out = []
    for variant in variants:
        reqs = [ChatRequest(
            messages=[Message(role="system", content="Answer the question. Think briefly, then give the letter."),
                      Message(role="user", content=f"{QUESTIONS[i % len(QUESTIONS)]} (#{i})")],
            max_tokens=64, temperature=0.7, seed=i,
            response_schema=SCHEMA if variant != "plain" else None,
            logprobs=20 if variant == "schema+logprobs" else None,
        ) for i in range(calls)]
        t0 = time.perf_counter()
        if variant == "selfcheck":  # each sample, then CISC's self-check on it
            async def pair(r):
                reply = await model.complete(r)
                check = self_check_messages(r.messages, reply.text)
                ask = ChatRequest(messages=check, max_tokens=1, temperature=0.0, logprobs=20) if check else None
                probe = await model.complete(ask) if ask else None
                return reply, probe
            pairs = await asyncio.gather(*(pair(r) for r in reqs))
            replies = [p[0] for p in pairs]
            probes = [p[1] for p in pairs if p[1] is not None]
        else:
            replies = await asyncio.gather(*(model.complete(r) for r in reqs))
            probes = []
        wall = time.perf_counter() - t0
        out.append({"variant": variant, "wall": wall, "tokens": sum(r.usage.completion_tokens for r in replies),
                    "probes": len(probes), "probe_prompt": sum(p.usage.prompt_tokens for p in probes),
                    "probe_cached": sum(p.usage.cached_prompt_tokens for p in probes)})
    print(json.dumps(out), flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])))
"""


@dataclass
class Row:
    what: str
    measured: str
    baseline: str
    ratio: float | None


def start(
    model: str,
    variants: list[str],
    calls: int,
    threads: int | None,
    slots: int = 4,
    nice: int = 0,
    extra_env: dict[str, str] | None = None,
) -> subprocess.Popen[str]:
    """A worker process; ``threads`` None: moot's default (the CPUs other work leaves idle)."""
    mine = ("MOOT_EMBEDDED_THREADS", "MOOT_EMBEDDED_CACHE_REUSE")
    env = {k: v for k, v in os.environ.items() if k not in mine} | {"MOOT_EMBEDDED_SLOTS": str(slots)}
    env |= extra_env or {}
    if threads is not None:
        env["MOOT_EMBEDDED_THREADS"] = str(threads)
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, model, ",".join(variants), str(calls)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        preexec_fn=(lambda: os.nice(nice)) if nice else None,
    )  # fmt: skip


def together(workers: list[subprocess.Popen[str]]) -> list[list[dict[str, float]]]:
    """Wait until every worker has loaded its model, start them at once, collect their timings."""
    try:
        for w in workers:
            assert w.stdout is not None and w.stdin is not None
            if w.stdout.readline().strip() != "ready":
                w.wait()
                why = (w.stderr.read().strip().splitlines() if w.stderr else []) or ["no reason given"]
                raise RuntimeError(f"a worker could not load the model: {why[-1]}")
        for w in workers:
            assert w.stdin is not None
            w.stdin.write("go\n")
            w.stdin.flush()
        results = []
        for w in workers:
            out, err = w.communicate(timeout=3600)
            if w.returncode != 0:
                raise RuntimeError(f"a worker failed: {(err.strip().splitlines() or ['no reason given'])[-1]}")
            results.append(json.loads(out.strip().splitlines()[-1]))
        return results
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()


def rate(runs: list[dict[str, float]]) -> float:
    return sum(r["tokens"] for r in runs) / sum(r["wall"] for r in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-1.5b", help="an installed embedded model (moot models)")
    parser.add_argument("--calls", type=int, default=16, help="calls per batch (row a: per process)")
    parser.add_argument("--rows", default="abcd", help="which measurements to make (default all: abcd)")
    args = parser.parse_args()
    rows: list[Row] = []
    if "a" in args.rows:
        rows += side_by_side(args.model, args.calls)
    if "b" in args.rows:
        rows += typed_output(args.model, args.calls)
    if "c" in args.rows:
        rows += busy_machine(args.model, args.calls)
    if "d" in args.rows:
        rows += self_checks(args.model, args.calls)

    print(f"embedded:{args.model}, {os.cpu_count()} CPUs, Python {platform.python_version()}\n")
    print("| measurement | measured | baseline | ratio |")
    print("| --- | ---: | ---: | ---: |")
    for r in rows:
        ratio = "–" if r.ratio is None else f"{r.ratio:.3f}"
        print(f"| {r.what} | {r.measured} | {r.baseline} | {ratio} |")


def side_by_side(model: str, calls: int) -> list[Row]:
    """a. two single-thread processes at once, against one two-thread process doing both batches"""
    rows = []
    pair = together([start(model, ["schema"], calls, 1) for _ in range(2)])
    two = sum(r[0]["tokens"] for r in pair) / max(r[0]["wall"] for r in pair)
    for slots in (4, 8):
        (one_run,) = together([start(model, ["schema"], 2 * calls, 2, slots)])
        one = rate(one_run)
        rows.append(Row(f"a. {2 * calls} typed answers: 2 processes x 1 thread x 4 slots vs 1 process x 2 threads "
                        f"x {slots} slots, tok/s", f"{two:.1f} tok/s", f"{one:.1f} tok/s", two / one))  # fmt: skip
    return rows


def typed_output(model: str, calls: int) -> list[Row]:
    """b. typed output's price, one thread: a warm-up, then one order and its reverse"""
    order = ["plain", "schema", "schema+logprobs"]
    (runs,) = together([start(model, ["plain", *order, *reversed(order)], calls // 2 or 1, 1)])
    runs = runs[1:]  # the warm-up batch
    by = {v: rate([r for r in runs if r["variant"] == v]) for v in order}
    return [
        Row(
            f"b. {v} vs plain text, 1 thread, tok/s",
            f"{by[v]:.1f} tok/s",
            f"{by['plain']:.1f} tok/s",
            by[v] / by["plain"],
        )
        for v in ("schema", "schema+logprobs")
    ]


def busy_machine(model: str, calls: int) -> list[Row]:
    """c. beside other work: moot's default threads against every CPU as threads"""
    cpus = len(os.sched_getaffinity(0))
    rows = []
    backgrounds = {
        "a steady single-thread llama.cpp worker, nice 0": lambda: (_steady(model, calls, 0), None),
        "a steady single-thread llama.cpp worker, nice 10": lambda: (_steady(model, calls, 10), None),
        "a real `moot eval` (arc-challenge, cisc(k=8), 1 thread, nice 10)": lambda: _evaluation(model),
    }
    for what, begin in backgrounds.items():
        other, folder = begin()
        if other is None:
            print(f"c. skipped beside {what}: the ARC data is not installed (make eval-data)", file=sys.stderr)
            continue
        try:
            if other.poll() is not None:
                raise RuntimeError(
                    f"the background work ({what}) ended before the measurement (exit {other.returncode})"
                )
            (auto,) = together([start(model, ["schema"], calls, None)])
            (every,) = together([start(model, ["schema"], calls, cpus)])
            if other.poll() is not None:
                raise RuntimeError(
                    f"the background work ({what}) ended during the measurement (exit {other.returncode})"
                )
        finally:
            other.terminate()
            try:
                other.wait(timeout=30)
            except subprocess.TimeoutExpired:
                other.kill()
                other.wait()
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
        rows.append(Row(f"c. {calls} typed answers beside {what}: default threads vs {cpus} threads, tok/s",
                        f"{rate(auto):.1f} tok/s", f"{rate(every):.1f} tok/s", rate(auto) / rate(every)))  # fmt: skip
    return rows


def _steady(model: str, calls: int, nice: int) -> subprocess.Popen[str]:
    other = start(model, ["schema"] * 1000, calls, 1, nice=nice)  # generates until it is stopped
    assert other.stdout is not None and other.stdin is not None
    try:
        if other.stdout.readline().strip() != "ready":
            raise RuntimeError("the background worker could not load the model")
        other.stdin.write("go\n")
        other.stdin.flush()
        time.sleep(2.0)  # generating before the measured worker looks at the machine
    except BaseException:
        other.kill()
        other.wait()
        raise
    return other


def _evaluation(model: str) -> tuple[subprocess.Popen[str] | None, str | None]:
    from moot.eval.datasets import load_dataset

    try:
        load_dataset("arc-challenge")
    except Exception:
        return None, None
    out = tempfile.mkdtemp(prefix="bench-eval-")
    env = os.environ | {"MOOT_EMBEDDED_THREADS": "1"}
    cmd = [sys.executable, "-m", "moot", "eval", "-d", "arc-challenge", "-n", "100", "--seed", "1", "-p", "cisc(k=8)",
           "-m", f"embedded:{model}", "--max-tokens", "256", "-o", out, "-j", "4", "--no-report"]  # fmt: skip
    other = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
                             preexec_fn=lambda: os.nice(10))  # fmt: skip
    try:
        time.sleep(30.0)  # loaded and answering
    except BaseException:
        other.kill()
        other.wait()
        shutil.rmtree(out, ignore_errors=True)
        raise
    return other, out


def self_checks(model: str, calls: int) -> list[Row]:
    """d. CISC's self-check after each sample, one thread: prompt tokens llama.cpp had to process per
    self-check, with MOOT_EMBEDDED_CACHE_REUSE=16 against without"""
    measured = {}
    for reuse in ("16", None):
        env = {"MOOT_EMBEDDED_CACHE_REUSE": reuse} if reuse else None
        (runs,) = together([start(model, ["selfcheck"], calls, 1, extra_env=env)])
        r = runs[0]
        measured[reuse] = (
            (r["probe_prompt"] - r["probe_cached"]) / max(r["probes"], 1),
            r["probe_prompt"] / max(r["probes"], 1),
            r["wall"],
        )
    (on, size, wall_on), (off, _, wall_off) = measured["16"], measured[None]
    return [
        Row(f"d. {calls} samples + self-checks: prompt tokens processed per self-check (of {size:.0f}), "
            "cache reuse 16 vs off", f"{on:.1f}", f"{off:.1f}", on / off if off else None),
        Row(f"d. {calls} samples + self-checks: wall time, cache reuse 16 vs off",
            f"{wall_on:.1f} s", f"{wall_off:.1f} s", wall_on / wall_off),
    ]  # fmt: skip


if __name__ == "__main__":
    try:
        main()
    except RuntimeError as exc:
        print(f"bench_embedded: {exc}", file=sys.stderr)
        sys.exit(2)
