"""The CPU of one streamed model call: moot's ``openai:`` model, a plain aiohttp request, the SDK.

    .venv/bin/python benchmarks/bench_model_call.py [--calls 1200] [--concurrency 32] [--reps 3]

A loopback fake OpenAI server in its own process (no latency; ~120-word replies streamed word by
word, as in ``bench_serve.py``) and two ways of making the same streamed chat completion in this
process, interleaved, R repetitions:

- ``model``: :class:`moot.models.openai_compat.OpenAICompatModel` ``.complete`` with a token
  callback: its aiohttp request with the lease checks of ``openai_http``, the reply's usage and
  pieces, the retry and concurrency limit of the base class;
- ``plain``: an ``aiohttp`` POST of the same body, read with moot's own SSE reader and ``json.loads``
  per chunk: what any client must do at least;
- ``sdk``: the ``openai`` SDK's ``post`` on its aiohttp transport, the chunks read as ``plain``
  reads them: how the model made its calls before (issue 43, part 2).

Per way and repetition: CPU (user + system of this process) per call, over ``--calls`` calls made
``--concurrency`` at once after a warm-up round. ``model - plain`` is what moot adds to the least a
client must do; ``sdk - plain`` what the SDK's request and response objects cost (the model call is
most of a served call's CPU; docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve import KEY, start_fake

from moot.models.base import ChatRequest, Message
from moot.models.openai_compat import OpenAICompatModel, _sse_events

QUESTION = "Is retrieval-augmented generation enough?"


async def timed(calls: int, concurrency: int, one: Callable[[], Awaitable[None]]) -> float:
    """CPU ms per call over ``calls`` calls, ``concurrency`` at once, after a warm-up round."""
    await asyncio.gather(*(one() for _ in range(concurrency)))
    start = time.process_time()
    for _ in range(calls // concurrency):
        await asyncio.gather(*(one() for _ in range(concurrency)))
    return (time.process_time() - start) / (calls // concurrency * concurrency) * 1000


async def via_model(base_url: str, calls: int, concurrency: int) -> float:
    model = OpenAICompatModel("bench", base_url=base_url, api_key=KEY, max_concurrency=2 * concurrency)
    request = ChatRequest(messages=[Message(role="user", content=QUESTION)])

    async def one() -> None:
        pieces: list[str] = []
        reply = await model.complete(request, on_token=pieces.append)
        if not reply.text or not pieces:
            raise RuntimeError("the model read no reply")

    try:
        return await timed(calls, concurrency, one)
    finally:
        await model.aclose()


async def via_plain(base_url: str, calls: int, concurrency: int) -> float:
    url = base_url + "/chat/completions"
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    body = {
        "model": "bench",
        "messages": [{"role": "user", "content": QUESTION}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=2 * concurrency)) as session:

        async def one() -> None:
            pieces: list[str] = []
            async with session.post(url, data=json.dumps(body), headers=headers) as response:
                response.raise_for_status()
                async for _event, data in _sse_events(response.content.iter_any()):
                    for choice in json.loads(data).get("choices") or ():
                        if piece := (choice.get("delta") or {}).get("content"):
                            pieces.append(piece)
            if not pieces:
                raise RuntimeError("the plain client read no reply")

        return await timed(calls, concurrency, one)


async def via_sdk(base_url: str, calls: int, concurrency: int) -> float:
    import openai

    body = {
        "model": "bench",
        "messages": [{"role": "user", "content": QUESTION}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    client = openai.AsyncOpenAI(
        base_url=base_url, api_key=KEY, max_retries=0, http_client=openai.DefaultAioHttpClient()
    )

    async def one() -> None:
        pieces: list[str] = []
        stream = await client.post(
            "/chat/completions", cast_to=object, body=body, stream=True, stream_cls=openai.AsyncStream[object]
        )
        try:
            async for _event, data in _sse_events(stream.response.aiter_bytes()):
                for choice in json.loads(data).get("choices") or ():
                    if piece := (choice.get("delta") or {}).get("content"):
                        pieces.append(piece)
        finally:
            await stream.close()
        if not pieces:
            raise RuntimeError("the SDK read no reply")

    try:
        return await timed(calls, concurrency, one)
    finally:
        await client.close()


WAYS: dict[str, Callable[[str, int, int], Awaitable[float]]] = {"model": via_model, "plain": via_plain, "sdk": via_sdk}


async def main_async(args: argparse.Namespace) -> None:
    fake, base_url = start_fake(0.0)
    rows: dict[str, list[float]] = {way: [] for way in WAYS}
    try:
        for rep in range(args.reps):
            # The order rotated by one way per repetition.
            order = list(WAYS)[rep % len(WAYS) :] + list(WAYS)[: rep % len(WAYS)]
            for way in order:
                rows[way].append(await WAYS[way](base_url, args.calls, args.concurrency))
            print(f"rep {rep + 1}: " + ", ".join(f"{w} {rows[w][-1]:.2f} ms/call" for w in rows), flush=True)
    finally:
        fake.terminate()
    print()
    print("| way | CPU ms per call, median (range) |")
    print("| --- | --- |")
    for way, values in rows.items():
        print(f"| {way} | {statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f}, n={len(values)}) |")
    for way in ("model", "sdk"):
        diffs = [m - p for m, p in zip(rows[way], rows["plain"], strict=True)]
        print(f"| {way} - plain | {statistics.median(diffs):.2f} ({min(diffs):.2f}-{max(diffs):.2f}) |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--calls", type=int, default=1200, help="streamed calls per way and repetition (default 1200)")
    ap.add_argument("--concurrency", type=int, default=32, help="calls at once (default 32)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions (default 3)")
    asyncio.run(main_async(ap.parse_args(argv)))


if __name__ == "__main__":
    main()
