"""One process per run folder: an OS-level lock, so two commands on one ``--out`` never pay twice.

:class:`RunLock` holds ``fcntl.flock`` on ``FOLDER/run.lock`` and writes its pid there. The kernel
releases the lock when the process ends, however it ends (a ``kill -9`` included), so a lock is
never left stale. :meth:`moot.eval.store.RunStore.open` takes it for every writer (``moot eval``
and anything else built on the store); ``moot absa eval`` takes it on its folder, ``moot eval
judge`` a second one (``judge.lock``: a judge may score a run while it runs, not beside another
judge), and ``moot serve`` one beside its database.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_NAME = "run.lock"


class RunLocked(Exception):
    """Another process holds the run folder. The message names its pid and what to do."""


class RunLock:
    """An exclusive lock on a run folder, held until :meth:`release` or the end of the process."""

    def __init__(self, folder: Path, fd: int) -> None:
        self.folder = folder
        self._fd: int | None = fd

    @classmethod
    def acquire(
        cls, folder: Path, name: str = LOCK_NAME, *, label: str | None = None, hint: str = "use another --out folder"
    ) -> RunLock:
        """Take the folder's lock (creating the folder), or raise :class:`RunLocked` at once.

        ``name`` is the lock file in ``folder`` (another name: another lock, such as a judge's
        beside the run's); ``label`` names what is held in the message (default: the folder), and
        ``hint`` is the last way out it offers."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / name
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f"pid {holder}" if holder else "a process whose pid is not written yet"
            raise RunLocked(
                f"{label or folder} is in use by another moot command ({who}): wait for it to finish, stop it, "
                f"or {hint}"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(folder, fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Let another process have the folder (idempotent)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
