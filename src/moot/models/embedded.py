"""Embedded llama.cpp models through ``xllamacpp``: real LLMs, offline, no API key.

One ``xllamacpp.Server`` per model per process, created on first use and shared by every
:class:`EmbeddedModel` of that name. Concurrent agents run in llama.cpp's parallel slots (the
server batches them). Calls always stream internally, so that a cancelled call stops its
generation at the next token (the streaming callback returns ``True``) instead of running on in
its thread.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import os
import threading
import time
from collections import OrderedDict
from typing import Any
from urllib.parse import urlsplit

from moot.models.base import (
    BaseChatModel,
    ChatRequest,
    ChatResponse,
    ModelConfigError,
    ModelError,
    ModelSpecError,
    TokenCallback,
    TokenLogprob,
    Usage,
    approx_tokens,
    chat_payload,
    messages_tokens,
    token_logprob,
)
from moot.models.weights import CATALOG, EmbeddedModelInfo, get_info, gguf_path, is_installed

DEFAULT_CTX_PER_SLOT = 4096

logger = logging.getLogger(__name__)

_servers: dict[str, Any] = {}
_load_lock = threading.Lock()


def _import_xllamacpp() -> Any:
    try:
        import xllamacpp
    except ImportError:
        raise ModelConfigError(
            "the embedded engine is not installed: pip install 'moot[embedded]' (it brings xllamacpp)"
        ) from None
    return xllamacpp


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ModelSpecError(f"{name}={raw!r} is not a positive whole number; unset it or give e.g. {default}")
    return value


#: The variables that tune the llama.cpp server (each a positive whole number, else unset), with
#: the example value an error gives.
ENV_SETTINGS = {
    "MOOT_EMBEDDED_SLOTS": 4,
    "MOOT_EMBEDDED_CTX": DEFAULT_CTX_PER_SLOT * 4,
    "MOOT_EMBEDDED_THREADS": 2,
    "MOOT_EMBEDDED_CACHE_REUSE": 16,
}


def check_environment() -> None:
    """Refuse a malformed ``MOOT_EMBEDDED_*`` variable when the model is named, as bad input, not
    at the first call (where a debate would already have started and dropped its agents)."""
    for name, example in ENV_SETTINGS.items():
        _env_int(name, example)


def slots_for(info: EmbeddedModelInfo) -> int:
    return _env_int("MOOT_EMBEDDED_SLOTS", info.slots)


def busy_elsewhere(cpus: set[int], window_s: float = 0.3) -> float | None:
    """How many of ``cpus`` other processes kept busy over ``window_s`` (from ``/proc/stat``'s
    per-CPU lines, minus this process's own CPU time), or None where that cannot be read."""

    def busy_and_total() -> tuple[int, int, int]:
        busy = total = seen = 0
        with open("/proc/stat", encoding="ascii") as f:
            for line in f:
                name, *values = line.split()
                if not (name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus):
                    continue
                fields = [int(x) for x in values[:8]]  # user nice system idle iowait irq softirq steal
                idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
                busy, total, seen = busy + sum(fields) - idle, total + sum(fields), seen + 1
        return busy, total, seen

    try:
        busy0, total0, seen = busy_and_total()
        own0, t0 = time.process_time(), time.perf_counter()
        time.sleep(window_s)
        busy1, total1, _ = busy_and_total()
        own1, t1 = time.process_time(), time.perf_counter()
    except (OSError, ValueError):
        return None
    # Every allowed CPU must have its line (a container may renumber them): else nothing is known.
    if seen != len(cpus) or total1 <= total0:
        return None
    busy = (busy1 - busy0) / (total1 - total0) * len(cpus)
    return max(0.0, busy - (own1 - own0) / max(t1 - t0, 1e-9))


def threads_for(cpus: int, busy: float | None) -> int:
    """llama.cpp threads for a process that may use ``cpus`` CPUs while other work keeps ``busy``
    of them busy. Its threads wait for each other at every step, so a thread that has to share a
    core can stall them all: on 2 cores beside one of moot's evaluation runs, 2 threads decoded
    1.0 tok/s and 1 thread 7.8 (docs/benchmarks.md, which also has the cases where 2 threads win,
    by at most 2x). Only the CPUs left idle get a thread, and at least one. Measured once, when the
    model loads."""
    if busy is None:
        return cpus
    return max(1, min(cpus, int(cpus - busy + 0.25)))


def default_threads() -> tuple[int, str]:
    """The thread count (``MOOT_EMBEDDED_THREADS``, else the CPUs other work leaves idle) and why."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 2))
    cpus = len(allowed) or 2
    if os.environ.get("MOOT_EMBEDDED_THREADS"):
        return _env_int("MOOT_EMBEDDED_THREADS", cpus), "MOOT_EMBEDDED_THREADS"
    busy = busy_elsewhere(allowed)
    threads = threads_for(cpus, busy)
    if threads < cpus:
        return threads, f"{busy:.1f} of {cpus} CPUs busy with other work; MOOT_EMBEDDED_THREADS sets it"
    return threads, f"{cpus} CPUs"


#: What each model's llama.cpp server was given when it loaded (:meth:`EmbeddedModel.runtime`).
_settings: dict[str, dict[str, Any]] = {}


def server_params(info: EmbeddedModelInfo, xllamacpp: Any) -> Any:
    """The llama.cpp server's parameters for ``info`` (slots, context, threads, cache reuse), from
    the ``MOOT_EMBEDDED_*`` variables and the machine; logs what it picked."""
    path = gguf_path(info)
    slots = slots_for(info)
    params = xllamacpp.CommonParams()
    params.model.path = str(path)
    params.n_parallel = slots
    ctx = params.n_ctx = _env_int("MOOT_EMBEDDED_CTX", DEFAULT_CTX_PER_SLOT * slots)
    params.kv_unified = True  # slots share the whole context; a long turn can use more of it
    # The CPUs this process may use (respects pinning and container limits) that other work
    # leaves idle: llama.cpp's threads wait on each other, so a shared core stalls them all.
    threads, why = default_threads()
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    # Opt-in: reuse cached chunks past the first difference by shifting them (llama.cpp's
    # --cache-reuse). A follow-up call that resends a reply (CISC's self-check) matches the cache
    # only up to the reply otherwise, as the reply's text re-tokenizes differently. Off by
    # default: shifted KV entries are close to, not equal to, recomputed ones.
    if os.environ.get("MOOT_EMBEDDED_CACHE_REUSE"):
        params.n_cache_reuse = _env_int("MOOT_EMBEDDED_CACHE_REUSE", 16)
    params.verbosity = -1
    reuse = _env_int("MOOT_EMBEDDED_CACHE_REUSE", 16) if os.environ.get("MOOT_EMBEDDED_CACHE_REUSE") else None
    _settings[info.name] = {"threads": threads, "threads_why": why, "slots": slots, "ctx": ctx,
                            "cache_reuse": reuse}  # fmt: skip
    logger.info("loading embedded:%s into llama.cpp (%.0f MB, %d slots, %d thread%s: %s)…",
                info.name, info.size / 1e6, slots, threads, "" if threads == 1 else "s", why)  # fmt: skip
    return params


def _server(info: EmbeddedModelInfo) -> Any:
    """The process-wide llama.cpp server of a model, loaded once (thread-safe)."""
    server = _servers.get(info.name)
    if server is not None:
        return server
    with _load_lock:
        server = _servers.get(info.name)
        if server is not None:
            return server
        xllamacpp = _import_xllamacpp()
        params = server_params(info, xllamacpp)
        t0 = time.perf_counter()
        try:
            server = xllamacpp.Server(params)
        except Exception as exc:  # pragma: no cover - a corrupt file passes the hash check only by accident
            raise ModelConfigError(f"llama.cpp could not load embedded:{info.name}: {exc}") from exc
        logger.info("embedded:%s loaded in %.1f s", info.name, time.perf_counter() - t0)
        _servers[info.name] = server
        return server


#: How many texts' token counts each embedded model keeps (:meth:`EmbeddedModel.count_tokens`).
COUNTED_KEPT = 4096
#: Each thread's connection to each loaded server's listener (:func:`_tokenize`).
_connections = threading.local()


def _tokenize(address: str, text: str) -> int:
    """How many tokens llama.cpp's ``/tokenize`` gives ``text`` (no special tokens added), on the
    in-process server listening at ``address`` (``http://127.0.0.1:PORT``); once again on a fresh
    connection if the kept one was closed."""
    where = urlsplit(address)
    body = json.dumps({"content": text, "add_special": False}, ensure_ascii=False).encode()
    for attempt in range(2):
        kept: dict[str, http.client.HTTPConnection] = getattr(_connections, "by_address", {})
        _connections.by_address = kept
        conn = kept.get(address)
        if conn is None:
            conn = kept[address] = http.client.HTTPConnection(where.hostname or "127.0.0.1", where.port, timeout=30)
        try:
            conn.request("POST", "/tokenize", body=body, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException):
            conn.close()
            kept.pop(address, None)
            if attempt:
                raise
            continue
        if response.status != 200:
            raise ValueError(f"/tokenize answered {response.status}")
        return len(json.loads(data)["tokens"])
    raise OSError("no answer")  # (not reached: the second attempt returns or raises)


def best_installed() -> EmbeddedModelInfo | None:
    installed = [m for m in CATALOG.values() if is_installed(m)]
    return max(installed, key=lambda m: m.rank) if installed else None


class EmbeddedModel(BaseChatModel):
    """``embedded:NAME``. Nothing is loaded until the first call."""

    returns_logprobs: bool | None = True

    def __init__(self, name: str, *, default_seed: int = 0) -> None:
        self.info = get_info(name)
        check_environment()
        slots = slots_for(self.info)
        super().__init__(f"embedded:{self.info.name}", max_concurrency=slots)
        self.default_seed = default_seed
        # The slots share one KV cache (kv_unified); a slot's fair share is what a prompt may count on.
        self.context_tokens = _env_int("MOOT_EMBEDDED_CTX", DEFAULT_CTX_PER_SLOT * slots) // slots
        #: Generations running in llama.cpp threads (a cancelled call's stays here until it stops).
        self.generations: set[asyncio.Future[None]] = set()
        #: The tokens of the texts counted last (:meth:`count_tokens`), by their length and hash.
        self._counted: OrderedDict[tuple[int, int], int] = OrderedDict()
        self._count_lock = threading.Lock()

    def count_tokens(self, text: str) -> int | None:
        """``text``'s tokens in the model's own tokenizer (llama.cpp's, over the loaded server's
        loopback listener), once its weights are loaded (None before: nothing is loaded to count;
        :meth:`ready_to_count` loads them). Counts are kept for the texts counted last."""
        server = _servers.get(self.info.name)
        if server is None:
            return None
        if not text:
            return 0
        key = (len(text), hash(text))
        with self._count_lock:
            known = self._counted.get(key)
            if known is not None:
                self._counted.move_to_end(key)
                return known
        try:
            n = _tokenize(server.listening_address, text)
        except (OSError, ValueError, KeyError, TypeError, http.client.HTTPException) as exc:
            logger.debug("embedded:%s could not count a text's tokens: %s", self.info.name, exc)
            return None
        with self._count_lock:
            self._counted[key] = n
            while len(self._counted) > COUNTED_KEPT:
                self._counted.popitem(last=False)
        return n

    async def ready_to_count(self) -> None:
        if self.info.name not in _servers:
            await asyncio.to_thread(_server, self.info)

    def identity(self) -> dict[str, Any]:
        # The weights' hash names the model exactly; the engine build can change replies too.
        return {**super().identity(), "sha256": self.info.sha256, "engine": _engine_version()}

    def load(self) -> None:
        """Verify and load the weights now (otherwise done by the first call)."""
        _server(self.info)

    def runtime(self) -> dict[str, Any] | None:
        """How this process's llama.cpp server runs the model, once loaded (None before): its
        threads (and why that many), parallel slots, context, cache reuse, the weights' SHA-256 and
        the engine build. Threads and slots change sampled replies (a seed alone does not repeat a
        reply across them), so an evaluation run records them (``moot eval``'s sessions)."""
        if self.info.name not in _servers or self.info.name not in _settings:
            return None
        return {**_settings[self.info.name], "sha256": self.info.sha256, "engine": _engine_version()}

    async def _complete_once(self, request: ChatRequest, on_token: TokenCallback | None) -> ChatResponse:
        loop = asyncio.get_running_loop()
        server = await asyncio.to_thread(_server, self.info)
        # Greedy and seeded by default: repeatable for one engine build and the same batching
        # (calls sharing parallel slots can differ slightly from the same calls one at a time).
        payload = chat_payload(request, temperature=0.0, seed=self.default_seed)
        payload.update(stream=True, stream_options={"include_usage": True})
        cancelled = threading.Event()
        parts: list[str] = []
        tokens: list[TokenLogprob] = []
        state: dict[str, Any] = {"finish": None, "usage": None, "error": None}

        pending: set[asyncio.Future[None]] = set()

        def forward(piece: str) -> None:
            if on_token is not None:
                result = on_token(piece)
                if asyncio.iscoroutine(result):
                    fut = asyncio.ensure_future(result)
                    pending.add(fut)
                    fut.add_done_callback(pending.discard)

        def callback(chunk: Any) -> bool:
            if not isinstance(chunk, dict) or ("choices" not in chunk and "usage" not in chunk):
                state["error"] = chunk
                return True
            for choice in chunk.get("choices") or ():
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    parts.append(piece)
                    if on_token is not None:
                        loop.call_soon_threadsafe(forward, piece)
                if choice.get("finish_reason"):
                    state["finish"] = choice["finish_reason"]
                for raw in (choice.get("logprobs") or {}).get("content") or ():
                    tokens.append(token_logprob(raw))
            if chunk.get("usage"):
                state["usage"] = chunk["usage"]
            # Returning True stops the generation: this is how a cancelled call ends promptly.
            return cancelled.is_set()

        def run() -> None:
            server.handle_chat_completions(payload, callback)

        task = asyncio.ensure_future(asyncio.to_thread(run))
        self.generations.add(task)
        task.add_done_callback(self.generations.discard)
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        except Exception as exc:  # llama.cpp raised in its thread: a model error, not a crash of the debate
            raise ModelError(f"embedded:{self.info.name} failed: {type(exc).__name__}: {exc}") from exc
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        if state["error"] is not None:
            raise ModelError(f"embedded:{self.info.name} failed: {_error_text(state['error'])}")
        text = "".join(parts)
        usage = state["usage"]
        used = (
            Usage.from_openai(usage)
            if usage
            else Usage(prompt_tokens=messages_tokens(request.messages), completion_tokens=approx_tokens(text))
        )
        return ChatResponse(
            text=text,
            usage=used,
            finish_reason=state["finish"],
            model=self.name,
            logprobs=tokens if request.logprobs is not None else None,
        )


def _engine_version() -> str:
    try:
        from importlib.metadata import version

        return version("xllamacpp")
    except Exception:
        return "unknown"


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        inner = error.get("error", error)
        if isinstance(inner, dict):
            return str(inner.get("message") or inner)[:300]
    return str(error)[:300]
