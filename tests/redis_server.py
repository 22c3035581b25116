"""A throwaway ``redis-server`` for the tests: on a free loopback port, its folder a temporary one,
nothing saved to disk. Debian's ``redis-server`` package provides it; without it the tests that need
Redis fail with one line saying so, never skip."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import throwaway
from serving import free_port

MISSING = "redis-server is not installed: apt-get install -y redis-server (or run tools/services.sh up)"


PREFIX = "moot-redis-"
#: In the server's folder: its process (pid and start time), for :func:`throwaway.sweep`.
PROCESS = "server.pid"


def _kill_orphan(root: Path) -> None:
    recorded = (root / PROCESS).read_text() if (root / PROCESS).exists() else ""
    if throwaway.alive(recorded):
        with contextlib.suppress(OSError):
            os.kill(int(recorded.split()[0]), signal.SIGKILL)


class RedisServer:
    """One ``redis-server`` process; ``password``: required of clients (``requirepass``) when given."""

    def __init__(self, password: str | None = None) -> None:
        binary = shutil.which("redis-server") or (
            "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None
        )
        if binary is None:
            raise RuntimeError(MISSING)
        self.binary = binary
        self.password = password
        throwaway.sweep(PREFIX, _kill_orphan)  # servers left by a test process that was killed
        self.root = Path(tempfile.mkdtemp(prefix=PREFIX))
        throwaway.claim(self.root)
        self._cleanup = throwaway.register(self.close)  # at exit or SIGTERM, if the fixture cannot
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        args += ["--dir", str(self.root)]
        if self.password:
            args += ["--requirepass", self.password]
        log = (self.root / "redis.log").open("ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        (self.root / PROCESS).write_text(throwaway.identity(self.proc.pid))
        import redis

        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited: {(self.root / 'redis.log').read_text()[-2000:]}")
            try:
                client = redis.Redis.from_url(self.url, socket_connect_timeout=1)
                client.ping()
                client.close()
                return self
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not answer within 30 s") from None
                time.sleep(0.05)

    def stop(self) -> None:
        """Stop it at once (SIGKILL: what a crash looks like to its clients)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def close(self) -> None:
        throwaway.unregister(self._cleanup)
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
