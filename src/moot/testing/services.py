"""Throwaway PostgreSQL, Redis and HAProxy for benchmarks and drills of ``moot serve`` replicas.

Each runs from Debian's packages in a temporary folder on a free loopback port and is torn down
(its folder removed) by :meth:`stop`: never a system service, never a fixed port. PostgreSQL
refuses to run as root, so as root its programs run as the ``postgres`` user Debian's package
creates (``runuser -u postgres --``), as ``tools/services.sh`` does. A missing program is named with
the package that provides it (:class:`Missing`), never a traceback.

    with Postgres() as pg, Redis() as redis:
        url = pg.url(pg.create_database())
        ...
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Self


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


class _Service:
    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


class Postgres(_Service):
    """One cluster: trust authentication on 127.0.0.1, its socket in its folder, durability off
    (``fsync``, ``synchronous_commit``): it lives for one run. ``pid``: the postmaster's."""

    def __init__(self) -> None:
        bin_dir = pg_bin()
        if bin_dir is None:
            raise Missing("PostgreSQL is not installed: apt-get install -y postgresql (or tools/services.sh up)")
        self.bin = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="moot-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.as_root = os.geteuid() == 0
        if self.as_root:
            shutil.chown(self.root, "postgres", "postgres")
        os.chmod(self.root, 0o700)

    def _run(self, *args: str) -> None:
        command = [*(["runuser", "-u", "postgres", "--"] if self.as_root else []), *args]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=self.root)
        if done.returncode != 0:
            raise RuntimeError(f"{Path(args[0]).name} failed: {(done.stderr or done.stdout).strip()[-2000:]}")

    def start(self) -> Self:
        self._run(
            str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8"
        )
        options = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories={self.root} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300"
        )
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "log"), "-w", "-o", options, "start"
        )
        return self

    @property
    def pid(self) -> int:
        """The postmaster's pid (first line of ``postmaster.pid``); its children are the backends."""
        return int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        import psycopg

        name = f"moot_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")  # (a name made here, no one's input)
        return name


class Redis(_Service):
    """One ``redis-server``, nothing saved to disk."""

    def __init__(self) -> None:
        binary = _which("redis-server")
        if binary is None:
            raise Missing("redis-server is not installed: apt-get install -y redis-server (or tools/services.sh up)")
        self.binary = binary
        self.root = Path(tempfile.mkdtemp(prefix="moot-redis-"))
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> Self:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        with (self.root / "redis.log").open("ab") as log:
            self.proc = subprocess.Popen([*args, "--dir", str(self.root)], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited: {(self.root / 'redis.log').read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not answer within 30 s")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None
        shutil.rmtree(self.root, ignore_errors=True)


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
    option httpchk GET /
    http-check expect rstatus ^[234]
    default-server check inter {inter} fall 2 rise 1
{servers}
"""


class HAProxy(_Service):
    """Debian's ``haproxy`` in front of replicas on loopback ports, round-robin, with docs/scale-out.md's
    configuration (its health check every ``inter``). ``url``: where clients send their requests."""

    def __init__(self, ports: list[int], *, inter: str = "2s") -> None:
        binary = _which("haproxy")
        if binary is None:
            raise Missing("haproxy is not installed: apt-get install -y haproxy (Debian's package)")
        self.binary = binary
        self.root = Path(tempfile.mkdtemp(prefix="moot-haproxy-"))
        self.port = free_port()
        servers = "\n".join(f"    server replica{i + 1} 127.0.0.1:{p}" for i, p in enumerate(ports))
        self.config = self.root / "haproxy.cfg"
        self.config.write_text(HAPROXY_CFG.format(port=self.port, servers=servers, inter=inter))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> Self:
        check = subprocess.run([self.binary, "-c", "-q", "-f", str(self.config)], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy -c refused the configuration: {(check.stderr or check.stdout).strip()}")
        with (self.root / "haproxy.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, "-db", "-f", str(self.config)], stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"haproxy exited: {(self.root / 'haproxy.log').read_text()[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return self
            if time.monotonic() > deadline:
                raise RuntimeError("haproxy did not listen within 30 s")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None
        shutil.rmtree(self.root, ignore_errors=True)
