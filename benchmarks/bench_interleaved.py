"""``moot serve`` against the ideal client and the in-process engine, interleaved, repeated.

    .venv/bin/python benchmarks/bench_interleaved.py [--reps 5] [--clients 64] [--per-client 3]
        [--latency 0.2] [--arms I,E,S,C,R] [--json FILE]
    .venv/bin/python benchmarks/bench_interleaved.py --compare THEN.json[,...] NOW.json[,...]

The measurement of issue 43 (part 2), made from outside: K clients in a closed loop (each starts its
next debate when its last one ends, M debates each after a warm-up debate) against a loopback fake
OpenAI server in its own process (latency L, ~120-word replies streamed word by word), for five ways
of running the same debate, ``affirmative_critical(rounds=2)`` (5 streamed calls):

I. the ideal client: the debate's 5 calls made with the ``openai`` SDK and ``asyncio.gather``
   (round 1's two at once, round 2's two with round 1's replies in their prompts, the synthesis),
   in this process, nothing else, each of the K clients with an SDK client of its own; each reply
   read whole (not streamed: the SDK builds a typed object per streamed chunk, about 10x the CPU per
   call of a whole reply here);
E. the engine in this process: K ``Engine.run`` loops on one ``openai:`` model;
S. ``moot serve``: ``POST /v1/debates`` and its SSE stream read to ``debate_done`` (S, C and R: each
   of the K clients with an HTTP client of its own, two keep-alive connections, as I's);
C. ``moot serve``: a streamed chat completion (``moot/affirmative-critical``) read to ``[DONE]``;
R. ``moot serve``: a streamed response (``POST /v1/responses``) read to ``response.completed``.

Four more arms, not in the default, find what any server costs (``--arms E,S,F,U,G,T``):

F. the floor: S's two requests on ``benchmarks/floor_server.py``, the least a server of this design
   does (HTTP by hand on asyncio's streams, the same engine and model, the same 24 events on the
   wire, the events and each finished turn appended to SQLite; no validation, keys, queue, leases,
   redaction);
U. the same floor as a bare ASGI app on uvicorn (``floor_server.py --http asgi``): the ASGI server's part;
G. the same floor on FastAPI and uvicorn (``floor_server.py --http fastapi``, no middleware): the
   framework's own part;
T. G with the request validated and the events made as ``moot serve``'s pydantic models
   (``--http fastapi --typed``): the typed boundary's part.

One server process and one fake server serve every repetition. Each repetition runs every arm once,
the order rotated by one arm per repetition (so no arm always runs first or last, after the same
neighbour, or at the same point of a drifting load). Per arm and repetition: debates per second,
and the CPU per model call of the process that ran the debates (this one for I and E, the server's
for S, C and R; /proc, user + system).

The two figures of the issue, each given as the median of the repetitions with their range:

- S, C, R debates/s over I's of the same repetition (goal at least 0.85);
- the server's CPU per model call over E's of the same repetition (goal at most 1.2).

The load average is printed beside each repetition: the machine is shared.

``--compare`` sets two runs side by side, from their ``--json`` files: another tree's run
(``benchmarks/against_tree.sh``) and this one's, made alternately in the same minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import CALLS_PER_DEBATE, REPLY, TASK
from bench_serve import (
    KEY,
    Loop,
    Params,
    client_limits,
    closed_loop,
    engine_loop,
    env,
    free_port,
    serve_loop,
    start_fake,
    start_server,
)

ARMS = {
    "I": "the ideal client: the openai SDK + asyncio.gather, in this process",
    "E": "the engine in this process (Engine.run)",
    "S": "moot serve: POST /v1/debates + its SSE stream",
    "C": "moot serve: a streamed chat completion",
    "R": "moot serve: a streamed response (/v1/responses)",
    "F": "the floor: S's two requests on benchmarks/floor_server.py, the least a server of this design does",
    "U": "the floor as a bare ASGI app on uvicorn (floor_server.py --http asgi): the ASGI server's own part",
    "G": "the floor on FastAPI + uvicorn (floor_server.py --http fastapi): the framework's own part",
    "T": "G with moot serve's pydantic request and event models (--http fastapi --typed): typing's part",
}
SERVED = ("S", "C", "R")
#: Arms whose CPU is a server process's, compared with E's (F is not one of moot's routes: not in the default).
SERVER_ARMS = (*SERVED, "F", "U", "G", "T")
ROUTES = {"S": "api", "C": "chat", "R": "responses"}


@dataclass
class Sample:
    rep: int
    position: int
    arm: str
    debates: int
    wall: float
    cpu: float
    load: float
    #: A served arm's clients in this process (HTTP, SSE parsing), on the same two cores as the server.
    client_cpu: float = 0.0

    @property
    def rate(self) -> float:
        return self.debates / self.wall

    @property
    def cpu_per_call_ms(self) -> float:
        return 1000 * self.cpu / (self.debates * CALLS_PER_DEBATE)

    @property
    def client_cpu_per_call_ms(self) -> float:
        return 1000 * self.client_cpu / (self.debates * CALLS_PER_DEBATE)


async def sdk_ideal(p: Params, base_url: str) -> Loop:
    """The debate's 5 calls with the openai SDK, gathered as the debate's rounds allow, each reply whole;
    each of the K clients with its own SDK client (its own pool of CLIENT_CONNECTIONS connections, as
    the served arms' clients: a pool shared by all costs httpcore a look over all of it per request)."""
    free = [
        openai.AsyncOpenAI(
            base_url=base_url,
            api_key=KEY,
            max_retries=0,
            http_client=httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=client_limits()),
        )
        for _ in range(p.clients)
    ]
    context = "\n".join(f"[{i}] {c.text}" for i, c in enumerate(TASK.context, 1))
    opening = f"Question: {TASK.question}\n\nContext:\n{context}"

    async def call(client: openai.AsyncOpenAI, user: str) -> str:
        completion = await client.chat.completions.create(
            model="bench",
            messages=[{"role": "system", "content": "You are a debater."}, {"role": "user", "content": user}],
            max_tokens=500,
        )
        text = completion.choices[0].message.content
        if text != REPLY:
            raise RuntimeError("the ideal client read a reply that is not the fake server's")
        return text

    async def debate() -> None:
        client = free.pop()  # closed_loop runs K debates at a time: one is always free
        try:
            first = await asyncio.gather(call(client, opening), call(client, opening))
            others = [f"{opening}\n\nThe other side said:\n{r}" for r in reversed(first)]
            second = await asyncio.gather(call(client, others[0]), call(client, others[1]))
            await call(client, f"{opening}\n\nAffirmative:\n{second[0]}\n\nCritical:\n{second[1]}\n\nSynthesize.")
        finally:
            free.append(client)

    try:
        return await closed_loop(p, debate)
    finally:
        for client in free:
            await client.close()


def start_floor(concurrency: int, base_url: str, workdir: Path, how: str) -> tuple[subprocess.Popen[bytes], str]:
    """Arm F's, U's, G's or T's server: ``floor_server.py --http HOW`` in a process of its own, on the
    same fake model."""
    port = free_port()
    name = how.replace(" --", "-")
    with (workdir / f"floor-{name}.log").open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve().parent / "floor_server.py"), "--port", str(port),
             "--base-url", base_url, "--db", str(workdir / f"floor-{name}.sqlite"), "--concurrency", str(concurrency),
             "--http", *how.split()],
            stdout=log, stderr=log, env=env(),
        )  # fmt: skip
    return proc, f"http://127.0.0.1:{port}"


def summary(samples: list[Sample], arms: list[str]) -> str:
    """Per repetition: each arm's rate and CPU per call; then the ratios' medians and ranges."""
    reps = sorted({s.rep for s in samples})
    by = {(s.rep, s.arm): s for s in samples}
    lines = [
        "| rep | order | load (1 min) | " + " | ".join(f"{a} debates/s" for a in arms) + " | "
        + " | ".join(f"{a} CPU ms/call" for a in arms) + " |",
        "| ---: | --- | ---: | " + " | ".join("---:" for _ in arms * 2) + " |",
    ]  # fmt: skip
    for r in reps:
        row = [by[(r, a)] for a in arms]
        order = "".join(s.arm for s in sorted(row, key=lambda s: s.position))
        loads = [s.load for s in row]
        lines.append(
            f"| {r} | {order} | {min(loads):.2f}-{max(loads):.2f} | "
            + " | ".join(f"{s.rate:.2f}" for s in row) + " | "
            + " | ".join(f"{s.cpu_per_call_ms:.2f}" for s in row) + " |"
        )  # fmt: skip

    def spread(values: list[float]) -> str:
        return f"{statistics.median(values):.3f} (range {min(values):.3f}-{max(values):.3f}, n={len(values)})"

    lines += ["", "| ratio | median (range over repetitions) | goal |", "| --- | --- | :---: |"]
    if "I" in arms:
        for a in [a for a in arms if a != "I"]:
            goal = "≥ 0.85" if a in SERVED else "—"
            lines.append(
                f"| {a} / I, debates/s | {spread([by[(r, a)].rate / by[(r, 'I')].rate for r in reps])} | {goal} |"
            )
    if "E" in arms:
        for a in [a for a in arms if a in SERVER_ARMS]:
            ratios = [by[(r, a)].cpu_per_call_ms / by[(r, "E")].cpu_per_call_ms for r in reps]
            lines.append(f"| {a} / E, CPU per model call | {spread(ratios)} | ≤ 1.2 |")
        if "I" in arms:
            ratios = [by[(r, "E")].cpu_per_call_ms / by[(r, "I")].cpu_per_call_ms for r in reps]
            lines.append(f"| E / I, CPU per model call | {spread(ratios)} | — |")
        for a in [a for a in arms if a in SERVER_ARMS]:
            # The server's own part in milliseconds: the ratio's goal allows 0.2 x E's, which moves
            # with the model call's cost that the engine and the server share.
            own = [by[(r, a)].cpu_per_call_ms - by[(r, "E")].cpu_per_call_ms for r in reps]
            lines.append(f"| {a} - E, CPU ms per model call (the server's own part) | {spread(own)} | — |")
    for a in [a for a in arms if a in SERVER_ARMS]:
        # On these two cores beside the server: what a served route's own clients (HTTP, SSE
        # parsing) spend is CPU the server does not get.
        mine = [by[(r, a)].client_cpu_per_call_ms for r in reps]
        lines.append(f"| {a}'s clients, CPU ms per model call | {spread(mine)} | — |")
    return "\n".join(lines)


def compare(then: list[Sample], now: list[Sample]) -> str:
    """Two runs' CPU per model call set side by side (``--compare``): each arm's median over its
    repetitions (range), now over then; and the server's own part (a served arm's figure less E's of
    the same repetition) against what the goal allowed it then, 0.2 x E's figure of that run."""

    def per_call(samples: list[Sample], arm: str) -> list[float]:
        return [s.cpu_per_call_ms for s in samples if s.arm == arm]

    def own(samples: list[Sample], arm: str) -> list[float]:
        e = {s.rep: s.cpu_per_call_ms for s in samples if s.arm == "E"}
        return [s.cpu_per_call_ms - e[s.rep] for s in samples if s.arm == arm and s.rep in e]

    def spread(values: list[float]) -> str:
        return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f}, n={len(values)})"

    arms = [a for a in ARMS if per_call(then, a) and per_call(now, a)]
    lines = [
        "| arm | then, CPU ms per call | now | now / then |",
        "| --- | ---: | ---: | ---: |",
    ]
    for a in arms:
        t, n = per_call(then, a), per_call(now, a)
        lines.append(f"| {a} | {spread(t)} | {spread(n)} | {statistics.median(n) / statistics.median(t):.2f} |")
    served = [a for a in arms if a in SERVER_ARMS and "E" in arms]
    if served:
        allowed = 0.2 * statistics.median(per_call(then, "E"))
        lines += [
            "",
            f"| the server's own part ({', '.join(f'{a} - E' for a in served)}) | then, CPU ms per call | now "
            f"| allowed then (0.2 x E's {statistics.median(per_call(then, 'E')):.2f}) |",
            "| --- | ---: | ---: | ---: |",
        ]
        for a in served:
            lines.append(f"| {a} - E | {spread(own(then, a))} | {spread(own(now, a))} | {allowed:.2f} |")
    return "\n".join(lines)


def load_samples(files: str) -> list[Sample]:
    """The samples of ``--json`` files (comma-separated: runs of one tree pooled, their repetitions
    numbered on)."""
    samples: list[Sample] = []
    for file in files.split(","):
        base = max((s.rep for s in samples), default=0)
        for raw in json.loads(Path(file).read_text()):
            sample = Sample(**raw)
            sample.rep += base
            samples.append(sample)
    return samples


async def main_async(args: argparse.Namespace) -> list[Sample]:
    arms: list[str] = args.arms
    p = Params(debates=0, concurrency=2 * args.clients, latency=args.latency, clients=args.clients,
               per_client=args.per_client, loop_latency=args.latency)  # fmt: skip
    fake, base_url = start_fake(args.latency)
    workdir = Path(tempfile.mkdtemp(prefix="bench-interleaved-"))
    extra = tuple(shlex.split(args.serve_args))
    proc, url = (
        start_server(2 * args.clients, 2 * args.clients, base_url, workdir, extra)
        if set(arms) & set(SERVED)
        else (None, "")
    )
    floors = {
        arm: start_floor(2 * args.clients, base_url, workdir, http)
        for arm, http in (("F", "raw"), ("U", "asgi"), ("G", "fastapi"), ("T", "fastapi --typed"))
        if arm in arms
    }
    runners: dict[str, Callable[[], Awaitable[Loop]]] = {
        "I": lambda: sdk_ideal(p, base_url),
        "E": lambda: engine_loop(p, base_url),
    }
    if proc is not None:
        for arm, route in ROUTES.items():
            runners[arm] = lambda route=route: serve_loop(p, proc, url, workdir, route)  # type: ignore[misc]
    for arm, (floor, floor_url) in floors.items():
        runners[arm] = lambda floor=floor, floor_url=floor_url: serve_loop(p, floor, floor_url, workdir, "api")  # type: ignore[misc]
    samples: list[Sample] = []
    try:
        for rep in range(1, args.reps + 1):
            shift = (rep - 1) % len(arms)
            for position, arm in enumerate(arms[shift:] + arms[:shift]):
                loop = await runners[arm]()
                samples.append(
                    Sample(rep, position, arm, loop.debates, loop.wall, loop.cpu, os.getloadavg()[0], loop.client_cpu)
                )
                s = samples[-1]
                print(
                    f"rep {rep} {arm}: {s.rate:.2f} debates/s, {s.cpu_per_call_ms:.2f} ms CPU/call"
                    + (f" (its clients' {s.client_cpu_per_call_ms:.2f})" if arm in SERVER_ARMS else "")
                    + f", load {s.load:.2f}",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        fake.terminate()
        for server in (proc, *(floor for floor, _ in floors.values())):
            if server is not None:
                server.terminate()
                server.wait(30)
    return samples


def load_options(ap: argparse.ArgumentParser, reps: int, reps_help: str) -> None:
    """The load's options, this benchmark's and ``bench_collector.py``'s: repetitions, K, M and L."""
    ap.add_argument("--reps", type=int, default=reps, help=f"repetitions, {reps_help} (default {reps})")
    ap.add_argument("--clients", type=int, default=64, help="K: clients in the closed loop (default 64)")
    ap.add_argument("--per-client", type=int, default=3, help="M: timed debates per client (default 3)")
    ap.add_argument("--latency", type=float, default=0.2, help="L: the fake server's latency, s (default 0.2)")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    load_options(ap, 5, "each running every arm once")
    ap.add_argument(
        "--arms",
        type=lambda v: [a.strip() for a in v.split(",")],
        default=["I", "E", *SERVED],
        help="the arms, comma-separated, of I,E,S,C,R,F,U,G,T (default I,E,S,C,R)",
    )
    ap.add_argument("--serve-args", default="", help="more options of moot serve, e.g. '--http h11 --loop asyncio'")
    ap.add_argument("--json", type=Path, default=None, help="write every sample to this JSON file")
    ap.add_argument(
        "--compare",
        nargs=2,
        metavar=("THEN", "NOW"),
        default=None,
        help="run nothing: set two runs' --json files side by side (each FILE[,FILE...], runs of one tree pooled)",
    )
    args = ap.parse_args(argv)
    if args.compare is not None:
        print(compare(load_samples(args.compare[0]), load_samples(args.compare[1])))
        return
    unknown = [a for a in args.arms if a not in ARMS]
    if unknown:
        ap.error(f"unknown arm(s) {', '.join(unknown)}: choose among {', '.join(ARMS)}")
    start = os.getloadavg()
    t0 = time.perf_counter()
    samples = asyncio.run(main_async(args))
    print("# moot serve against the ideal client, interleaved\n")
    print(
        f"- {args.reps} repetitions, order rotated; K={args.clients} clients, M={args.per_client} debates each "
        f"after a warm-up; fake server L={args.latency:g} s; {CALLS_PER_DEBATE} streamed calls per debate"
    )
    if args.serve_args:
        print(f"- moot serve {args.serve_args}")
    print(
        f"- load average at start {start[0]:.2f} / {start[1]:.2f} / {start[2]:.2f}, at end "
        f"{' / '.join(f'{x:.2f}' for x in os.getloadavg())}; {time.perf_counter() - t0:.0f} s in all"
    )
    for arm in args.arms:
        print(f"- {arm}: {ARMS[arm]}")
    print()
    print(summary(samples, args.arms))
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(s) for s in samples], indent=1))


if __name__ == "__main__":
    main()
