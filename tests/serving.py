"""Helpers of the ``moot serve`` tests: the app on a real loopback port, in a thread or a process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from moot.server import ServerSettings, create_app
from moot.server.http.connections import server_config

FAKE_KEY = "sk-fake-backend-key-000000"


class _PromptServer(uvicorn.Server):
    """uvicorn's server, whose main loop wakes as soon as it is told to stop (:meth:`stop`) instead of
    at its next tick, 0.1 s apart: a tenth of a second of every test server's end (about half)."""

    _wake: asyncio.Event | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    async def main_loop(self) -> None:
        self._wake, self._loop = asyncio.Event(), asyncio.get_running_loop()
        counter = 0
        while not await self.on_tick(counter):  # its ticks as uvicorn's (the Date header, the limits)
            counter = (counter + 1) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 0.1)

    def stop(self) -> None:
        self.should_exit = True
        if self._loop is not None and self._wake is not None:
            with contextlib.suppress(RuntimeError):  # its loop closed already
                self._loop.call_soon_threadsafe(self._wake.set)


class ServerThread:
    """``create_app(settings)`` served by uvicorn in a background thread on a free loopback port."""

    def __init__(self, settings: ServerSettings, config: uvicorn.Config | None = None) -> None:
        """``config``: uvicorn's, for an app of these settings (default: as ``moot serve`` configures
        it, :func:`~moot.server.http.connections.server_config`: its connection guard, its WebSocket
        protocol; uvicorn's own defaults once hid that ``moot serve`` made no WebSocket upgrade)."""
        self.settings = settings
        if config is None:
            app = create_app(settings)
            config = server_config(app, settings, host="127.0.0.1", port=0, log_level="warning")
        self.server = _PromptServer(config)
        self.thread = threading.Thread(target=self.server.run, name="moot-serve", daemon=True)
        self.url = ""

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()
        self.thread.join(30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


#: How long a moot serve process may take to answer: its imports alone took about 50 s at load 12 on
#: the 2-core machine; only a hang should trip this.
UP_S = 180.0


def wait_until_up(url: str, proc: subprocess.Popen[bytes] | None = None, headers: dict[str, str] | None = None) -> None:
    deadline = time.monotonic() + UP_S
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"moot serve exited with {proc.returncode}")
        try:
            if httpx.get(url + "/v1/protocols", headers=headers, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"moot serve did not come up within {UP_S:.0f} s")


def serve_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a ``moot serve`` process of the tests: this one's, the fake backend key,
    ``env``, and this tree's ``src`` first on the path."""
    full_env = {**os.environ, "OPENAI_API_KEY": FAKE_KEY, **(env or {})}
    src = str(Path(__file__).resolve().parent.parent / "src")
    full_env["PYTHONPATH"] = src + os.pathsep + full_env.get("PYTHONPATH", "")
    return full_env


def serve_process(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``moot serve ARGS`` in its own process (stdout and stderr to ``log``)."""
    full_env = serve_env(env)
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-c", "from moot.cli.main import main; main()", "serve", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=full_env,
        )


def read_events(
    url: str, *, after: int | None = None, limit: int | None = None, headers: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """The SSE events of a debate (id, event, data), until the stream ends or ``limit`` are read."""
    from httpx_sse import connect_sse

    hdrs = dict(headers or {})
    if after is not None:
        hdrs["Last-Event-ID"] = str(after)
    out: list[dict[str, Any]] = []
    with httpx.Client(timeout=httpx.Timeout(60.0)) as client, connect_sse(client, "GET", url, headers=hdrs) as source:
        for sse in source.iter_sse():
            if not sse.data:  # a keepalive comment
                continue
            out.append({"id": int(sse.id), "event": sse.event, "data": json.loads(sse.data)})
            if limit is not None and len(out) >= limit:
                break
    return out


def wait_for(predicate: Any, what: str, timeout: float = 60.0) -> Any:
    """Poll ``predicate`` until it returns something truthy (a bound only a hang can reach)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")
