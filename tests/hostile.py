"""Helpers of the tests that attack ``moot serve``: a loopback listener that must hear nothing, and a
health check polled while a hostile request is served."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from types import TracebackType

import httpx

#: What the listener serves: a schema whose enum would come back in an error text if it were fetched.
LEAKED = "SECRET-FROM-THE-OPERATORS-NETWORK"


class Listener:
    """A TCP listener on 127.0.0.1 that counts every connection made to it (answering each with a JSON
    schema over HTTP, as an internal service of the operator's would): a server that fetches a
    caller's ``$ref`` shows up in :attr:`connections`."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.port: int = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="hostile-listener", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/schema.json"

    def _serve(self) -> None:
        body = json.dumps({"type": "string", "enum": [LEAKED]}).encode()
        head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            with conn:
                conn.settimeout(1)
                try:
                    conn.recv(65536)
                    conn.sendall(head + body)
                except OSError:
                    pass

    def __enter__(self) -> Listener:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


#: What the server promises: a health check answers within this many seconds, whatever a request holds.
HEALTH_S = 1.0


def health_bound() -> float:
    """:data:`HEALTH_S`, or 3 s on a machine loaded over its cores (several test runs sharing two
    cores slow every answer, a stalled event loop or not): a stall of the event loop is seconds to
    minutes (47 s for one pattern), so it trips either bound."""
    return HEALTH_S if os.getloadavg()[0] <= (os.cpu_count() or 1) else 3 * HEALTH_S


class HealthWatch:
    """Polls ``GET /v1/protocols`` every ``every`` seconds while the block runs: :attr:`worst` is the
    slowest answer (a poll that got none within ``limit`` seconds counts as infinite); :attr:`ok`
    says whether every answer came within :func:`health_bound`."""

    def __init__(self, url: str, limit: float = 5.0, every: float = 0.1) -> None:
        self.url = url + "/v1/protocols"
        self.limit = limit
        self.every = every
        self.times: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="health-watch", daemon=True)

    def _poll(self) -> None:
        with httpx.Client(timeout=self.limit) as client:
            while not self._stop.is_set():
                start = time.monotonic()
                try:
                    ok = client.get(self.url).status_code == 200
                except httpx.HTTPError as exc:
                    ok = False
                    self.failures.append(f"{type(exc).__name__} after {time.monotonic() - start:.2f} s")
                self.times.append(time.monotonic() - start if ok else float("inf"))
                self._stop.wait(self.every)

    @property
    def worst(self) -> float:
        return max(self.times, default=0.0)

    @property
    def ok(self) -> bool:
        return self.worst < health_bound()

    def __repr__(self) -> str:
        slow = [round(t, 2) for t in self.times if t >= HEALTH_S]
        return f"<health: {len(self.times)} checks, worst {self.worst:.2f} s, slow {slow}, {self.failures}>"

    def __enter__(self) -> HealthWatch:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(self.limit + 5)
