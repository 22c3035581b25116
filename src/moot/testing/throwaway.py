"""What a throwaway server (:mod:`moot.testing.services`: PostgreSQL, Redis, HAProxy, for the tests and
the benchmarks) leaves when the process that started it dies.

Each server lives in a ``/tmp/moot-pg-*``, ``/tmp/moot-redis-*`` or ``/tmp/moot-haproxy-*`` folder that
names its owner (the process that started it: pid and start time, so a reused pid is not mistaken for
it). The owner stops what it started when it ends normally, on Ctrl-C (pytest tears its fixtures down,
a ``with`` block exits), at exit (``atexit``) and on SIGTERM (a handler that stops them, then ends the
process as SIGTERM would). A process killed outright (SIGKILL, an xdist worker that crashed) cannot:
the next server that starts, in any process, stops and removes the servers whose owner is gone
(:func:`sweep`). A folder that names no owner (made by an older version of these files) is left alone,
its server may be someone's.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType

OWNER = "owner.pid"


def start_time(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks since boot, /proc), or None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22; the name before ")" may hold spaces


def identity(pid: int) -> str:
    return f"{pid} {start_time(pid)}"


def alive(recorded: str) -> bool:
    """Whether the process a ``identity`` line names still runs (the same one, not a reused pid)."""
    pid, _, started = recorded.strip().partition(" ")
    return pid.isdigit() and start_time(int(pid)) == started


def claim(folder: Path) -> None:
    """Name this process the owner of ``folder``."""
    (folder / OWNER).write_text(identity(os.getpid()))


def orphaned(folder: Path) -> bool:
    try:
        return not alive((folder / OWNER).read_text())
    except OSError:
        return False  # no owner named: an older version's folder, or one being made this moment


def sweep(prefix: str, stop: Callable[[Path], None]) -> list[Path]:
    """Stop (``stop(folder)``) and remove every ``/tmp/<prefix>*`` folder whose owner is gone."""
    removed = []
    for folder in sorted(Path(tempfile.gettempdir()).glob(f"{prefix}*")):
        if folder.is_dir() and orphaned(folder):
            with contextlib.suppress(Exception):
                stop(folder)
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


_live: dict[int, Callable[[], None]] = {}
_lock = threading.Lock()
_handler_installed = False
_keys = itertools.count()


def _stop_all() -> None:
    with _lock:
        cleanups = list(_live.values())
        _live.clear()
    for cleanup in cleanups:
        with contextlib.suppress(Exception):
            cleanup()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _stop_all()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def register(cleanup: Callable[[], None]) -> int:
    """Run ``cleanup`` if this process exits or gets SIGTERM before :func:`unregister`."""
    global _handler_installed
    with _lock:
        key = next(_keys)
        _live[key] = cleanup
        if not _handler_installed:
            atexit.register(_stop_all)
            install = threading.current_thread() is threading.main_thread()
            if install and signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
                signal.signal(signal.SIGTERM, _on_sigterm)
            _handler_installed = True
    return key


def unregister(key: int) -> None:
    with _lock:
        _live.pop(key, None)
