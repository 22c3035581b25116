"""Throwaway PostgreSQL, Redis and HAProxy, and ``moot serve`` replicas, for the tests, the benchmarks
and drills of replicas.

Each server runs from Debian's packages in a temporary folder on a free loopback port and is torn down
(its folder removed) by :meth:`close` (or :meth:`stop`, or leaving its ``with`` block): never a system
service, never a fixed port. Its folder names the process that started it, which stops it at exit and
on SIGTERM; one left by a process killed outright is stopped by the next server to start
(:mod:`moot.testing.throwaway`). PostgreSQL refuses to run as root, so as root its programs run as the
``postgres`` user Debian's package creates (``runuser -u postgres --``), as ``tools/services.sh`` does.
A missing program is named with the package that provides it (:class:`Missing`, a RuntimeError),
never a traceback.

    with Postgres() as pg, Redis() as redis:
        url = pg.url(pg.create_database())
        ...
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

from moot.testing import throwaway

MISSING_POSTGRES = (
    "PostgreSQL's programs (initdb, pg_ctl) are not installed: apt-get install -y postgresql "
    "(Debian's package; tools/services.sh up installs it)"
)
MISSING_REDIS = "redis-server is not installed: apt-get install -y redis-server (or run tools/services.sh up)"
MISSING_HAPROXY = "haproxy is not installed: apt-get install -y haproxy (Debian's package)"
#: In a server's folder: its process (pid and start time), for :func:`throwaway.sweep`.
PROCESS = "server.pid"


class Missing(RuntimeError):
    """A program is not installed: the message names the Debian package and the command."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")


def pg_bin() -> Path | None:
    """The newest ``/usr/lib/postgresql/N/bin`` (Debian), else the folder of a ``pg_ctl`` on the PATH."""
    found = [p for p in Path("/usr/lib/postgresql").glob("*/bin") if (p / "pg_ctl").exists()]
    found.sort(key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    if found:
        return found[-1]
    on_path = _which("pg_ctl")
    return Path(on_path).parent if on_path else None


class _Process:
    """Something that runs as one child process (``proc``) on a loopback ``port``."""

    port: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL, at once: what a crash looks like to its clients."""
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait(10)

    def terminate(self, within: float = 10) -> None:
        """SIGTERM (after SIGCONT: one left stopped ends too), then SIGKILL if it has not ended ``within`` s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
        try:
            self.proc.wait(within)
        except subprocess.TimeoutExpired:
            self.kill()


class _Service(ABC):
    """A server in a throwaway folder (``root``, named ``PREFIX…``) that this process owns: it stops it
    at exit and on SIGTERM; one whose owner died is stopped by the next to start (:func:`throwaway.sweep`)."""

    PREFIX: ClassVar[str]

    def __init__(self) -> None:
        throwaway.sweep(self.PREFIX, self._stop_orphan)  # servers left by a process that was killed
        self.root = Path(tempfile.mkdtemp(prefix=self.PREFIX))
        throwaway.claim(self.root)
        self._cleanup = throwaway.register(self.close)  # at exit or SIGTERM, if the owner cannot

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    @abstractmethod
    def start(self) -> Self:
        """Start the server; return it, started."""

    @abstractmethod
    def _halt(self) -> None:
        """Stop the server (its folder stays)."""

    def close(self) -> None:
        """Stop the server and remove its folder."""
        throwaway.unregister(self._cleanup)
        with contextlib.suppress(Exception):
            self._halt()
        shutil.rmtree(self.root, ignore_errors=True)

    def stop(self) -> None:
        self.close()

    def _stop_orphan(self, root: Path) -> None:
        """Stop the server in ``root``, whose owner is gone: by default kill the process it recorded."""
        recorded = (root / PROCESS).read_text() if (root / PROCESS).exists() else ""
        if throwaway.alive(recorded):
            with contextlib.suppress(OSError):
                os.kill(int(recorded.split()[0]), signal.SIGKILL)

    def _spawn(self, args: list[str], log: str) -> subprocess.Popen[bytes]:
        """Start ``args`` (output to ``log`` in the folder) and record its process for a sweep."""
        with (self.root / log).open("ab") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        (self.root / PROCESS).write_text(throwaway.identity(proc.pid))
        return proc


class Postgres(_Service):
    """One cluster: trust authentication on 127.0.0.1, its socket in its folder, durability off
    (``fsync``, ``synchronous_commit``) unless ``durable``: it lives for one run. ``pid``: the postmaster's.
    ``max_connections``: 300 holds the tests' replicas and the benchmark's three replicas' pools."""

    PREFIX = "moot-pg-"

    def __init__(self, *, max_connections: int = 300, durable: bool = False) -> None:
        bin_dir = pg_bin()
        if bin_dir is None:
            raise Missing(MISSING_POSTGRES)
        self.bin = bin_dir
        self.as_root = os.geteuid() == 0
        self.max_connections = max_connections
        #: PostgreSQL's own defaults (``fsync``, ``synchronous_commit`` on: a commit waits for its WAL
        #: on disk), for a benchmark of what a deployment's commits cost.
        self.durable = durable
        super().__init__()
        self.data = self.root / "data"
        self.port = free_port()
        if self.as_root:
            shutil.chown(self.root, "postgres", "postgres")
        os.chmod(self.root, 0o700)

    def _run(self, *args: str, cwd: Path | None = None) -> None:
        command = [*(["runuser", "-u", "postgres", "--"] if self.as_root else []), *args]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=cwd or self.root)
        if done.returncode != 0:
            raise RuntimeError(f"{Path(args[0]).name} failed: {(done.stderr or done.stdout).strip()[-2000:]}")

    def start(self) -> Self:
        self._run(
            str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8"
        )
        options = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories={self.root} "
            + ("" if self.durable else "-c fsync=off -c synchronous_commit=off -c full_page_writes=off ")
            + f"-c max_connections={self.max_connections}"
        )
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "log"), "-w", "-o", options, "start"
        )
        return self

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every connection is cut, and the server is back a moment later."""
        log = str(self.root / "log")  # (its output to the log: a pipe would be held open by the server)
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", log, "-m", "fast", "-w", "restart")

    @property
    def pid(self) -> int:
        """The postmaster's pid (first line of ``postmaster.pid``); its children are the backends."""
        return int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])

    def _halt(self) -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def _stop_orphan(self, root: Path) -> None:
        if (root / "data" / "postmaster.pid").exists():
            self._run(
                str(self.bin / "pg_ctl"), "-D", str(root / "data"), "-m", "immediate", "-w", "stop", cwd=Path("/")
            )

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(sql)  # (a name made here: no input of anyone's)

    def create_database(self) -> str:
        name = f"moot_{uuid.uuid4().hex[:12]}"
        self._admin(f"CREATE DATABASE {name}")
        return name

    def drop_database(self, name: str) -> None:
        self._admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _answers_ping(port: int, password: str | None) -> bool:
    """Whether a Redis server on ``port`` answers PING (after AUTH, with a password)."""
    hello = (f"AUTH {password}\r\n" if password else "") + "PING\r\n"
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1) as s:
        s.sendall(hello.encode())
        got = b""
        while b"PONG" not in got and b"-" not in got and len(got) < 256:
            chunk = s.recv(64)
            if not chunk:
                break
            got += chunk
        return b"+PONG" in got
    return False


class Redis(_Service, _Process):
    """One ``redis-server``, nothing saved to disk; ``password``: required of clients (``requirepass``)
    when given. :meth:`kill` crashes it (its folder stays, :meth:`start` runs it again)."""

    PREFIX = "moot-redis-"

    def __init__(self, password: str | None = None) -> None:
        binary = _which("redis-server")
        if binary is None:
            raise Missing(MISSING_REDIS)
        self.binary = binary
        self.password = password
        super().__init__()
        self.port = free_port()
        self.proc = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> Self:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        args += ["--dir", str(self.root), *(["--requirepass", self.password] if self.password else [])]
        self.proc = self._spawn(args, "redis.log")
        deadline = time.monotonic() + 30
        while not _answers_ping(self.port, self.password):
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited: {(self.root / 'redis.log').read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not answer within 30 s")
            time.sleep(0.05)
        return self

    def _halt(self) -> None:
        self.kill()
        self.proc = None


#: docs/scale-out.md's balancer, its backend filled in by :class:`HAProxy` (``{servers}``, ``{port}``).
HAPROXY_CFG = """\
global
    maxconn 4096

defaults
    mode http
    option redispatch
    retries 2
    timeout connect 5s
    timeout http-request 20s
    timeout http-keep-alive 10s
    timeout client 1m
    timeout server 11m

frontend moot
    bind 127.0.0.1:{port}
    default_backend replicas

backend replicas
    balance roundrobin
    option httpchk
    http-check send meth GET uri / ver HTTP/1.1 hdr Host localhost
    http-check expect status 200
    default-server check inter {inter} fall 2 rise 1
{servers}
"""


class HAProxy(_Service, _Process):
    """Debian's ``haproxy`` in front of replicas on loopback ports, round-robin, with docs/scale-out.md's
    configuration (its health check every ``inter``). ``url``: where clients send their requests."""

    PREFIX = "moot-haproxy-"

    def __init__(self, ports: list[int], *, inter: str = "2s") -> None:
        binary = _which("haproxy")
        if binary is None:
            raise Missing(MISSING_HAPROXY)
        self.binary = binary
        super().__init__()
        self.port = free_port()
        servers = "\n".join(f"    server replica{i + 1} 127.0.0.1:{p}" for i, p in enumerate(ports))
        self.config = self.root / "haproxy.cfg"
        self.config.write_text(HAPROXY_CFG.format(port=self.port, servers=servers, inter=inter))
        self.proc = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        check = subprocess.run([self.binary, "-c", "-q", "-f", str(self.config)], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy -c refused the configuration: {(check.stderr or check.stdout).strip()}")
        self.proc = self._spawn([self.binary, "-db", "-f", str(self.config)], "haproxy.log")
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"haproxy exited: {(self.root / 'haproxy.log').read_text()[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return self
            if time.monotonic() > deadline:
                raise RuntimeError("haproxy did not listen within 30 s")
            time.sleep(0.05)

    def _halt(self) -> None:
        self.terminate()
        self.proc = None


class Replica(_Process):
    """One ``moot serve ARGS --port PORT`` process (this Python, ``moot`` as this process imports it),
    its output to ``log``; ``env``: added to this process's environment for it."""

    def __init__(
        self, index: int, port: int, log: Path, args: Sequence[str], env: Mapping[str, str] | None = None
    ) -> None:
        self.index = index
        self.port = port
        self.log = log
        self.args = list(args)
        self.env = dict(env or {})
        self.proc = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        command = [sys.executable, "-c", "from moot.cli.main import main; main()", "serve", *self.args]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [*command, "--port", str(self.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
            )

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM (a stopped one is continued first), SIGKILL if it has not ended within 20 s."""
        self.terminate(within=20)
