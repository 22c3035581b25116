"""A throwaway PostgreSQL cluster for the tests: ``initdb`` in a temporary folder, on a free loopback
port, as the ``postgres`` user when the tests run as root (PostgreSQL refuses root). Debian's
``postgresql`` package provides the programs (``tools/services.sh up`` installs it); without them the
tests that need PostgreSQL fail with one line saying so, never skip."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import throwaway
from serving import free_port

MISSING = (
    "PostgreSQL's programs (initdb, pg_ctl) are not installed: run tools/services.sh up "
    "(it installs Debian's postgresql) or apt-get install -y postgresql"
)


def pg_bin() -> Path | None:
    """The newest ``/usr/lib/postgresql/N/bin`` (Debian), else the folder of a ``pg_ctl`` on the PATH."""
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0
    )
    found = [p for p in found if (p / "pg_ctl").exists()]
    if found:
        return found[-1]
    on_path = shutil.which("pg_ctl")
    return Path(on_path).parent if on_path else None


PREFIX = "moot-pg-"


class PgCluster:
    """One cluster, trust authentication on 127.0.0.1 and a socket in its folder; durability off
    (``fsync``, ``synchronous_commit``): it lives for one test session."""

    def __init__(self) -> None:
        bin_dir = pg_bin()
        if bin_dir is None:
            raise RuntimeError(MISSING)
        self.bin = bin_dir
        self.as_root = os.geteuid() == 0
        throwaway.sweep(PREFIX, self._stop_orphan)  # clusters left by a test process that was killed
        self.root = Path(tempfile.mkdtemp(prefix=PREFIX))
        throwaway.claim(self.root)
        self._cleanup = throwaway.register(self.stop)  # at exit or SIGTERM, if the fixture cannot
        self.data = self.root / "data"
        self.port = free_port()
        if self.as_root:
            shutil.chown(self.root, "postgres", "postgres")
        os.chmod(self.root, 0o700)

    def _run(self, *args: str) -> None:
        command = [*(["runuser", "-u", "postgres", "--"] if self.as_root else []), *args]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=self.root)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed: {(done.stderr or done.stdout).strip()[-2000:]}")

    def start(self) -> PgCluster:
        self._run(
            str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8"
        )
        options = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories={self.root} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        self._run(
            str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "log"), "-w", "-o", options, "start"
        )
        return self

    def stop(self) -> None:
        throwaway.unregister(self._cleanup)
        with contextlib.suppress(Exception):
            self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def _stop_orphan(self, root: Path) -> None:
        """Stop the cluster in ``root``, whose test process is gone (:func:`throwaway.sweep`)."""
        if (root / "data" / "postmaster.pid").exists():
            command = [str(self.bin / "pg_ctl"), "-D", str(root / "data"), "-m", "immediate", "-w", "stop"]
            prefix = ["runuser", "-u", "postgres", "--"] if self.as_root else []
            subprocess.run([*prefix, *command], capture_output=True, timeout=120, cwd="/")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(sql)  # type: ignore[arg-type]  # (a name the tests made: no input of anyone's)

    def create_database(self) -> str:
        name = f"moot_{uuid.uuid4().hex[:12]}"
        self._admin(f"CREATE DATABASE {name}")
        return name

    def drop_database(self, name: str) -> None:
        self._admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
