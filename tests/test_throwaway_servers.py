"""The tests' throwaway PostgreSQL and Redis servers do not outlive their test process (moot.testing.throwaway):
on SIGTERM it stops them itself; killed outright (SIGKILL), the next server that starts stops them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from moot.testing import throwaway

TESTS = Path(__file__).resolve().parent

#: A test process that starts a server, says where, and waits to be killed: in short sleeps, since a
#: signal that comes between the print and a long sleep's system call would wait for its end (the
#: C handler has run, the Python one runs at the next check: a SIGTERM seen 10 minutes late).
HOLDER = """
import sys, time
sys.path.insert(0, {tests!r})
from {module} import {cls}
server = {cls}().start()
print(server.root, flush=True)
for _ in range(6000):
    time.sleep(0.1)
"""

SERVERS = [("pg_cluster", "PgCluster"), ("redis_server", "RedisServer")]


def _server_pid(root: Path) -> int:
    """The server's process: the postmaster (its postmaster.pid), or the redis-server."""
    pidfile = root / "data" / "postmaster.pid"
    if pidfile.exists():
        return int(pidfile.read_text().split()[0])
    return int((root / "server.pid").read_text().split()[0])


def _gone(pid: int) -> bool:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if throwaway.start_time(pid) is None or " Z " in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:3]:
            return True
        time.sleep(0.1)
    return False


def _hold(module: str, cls: str) -> tuple[subprocess.Popen[str], Path, int]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER.format(tests=str(TESTS), module=module, cls=cls)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None
    line = holder.stdout.readline().strip()
    if not line:
        holder.kill()
        err = holder.communicate(timeout=60)[1]
        if "not installed" in err:
            pytest.fail(err.strip().splitlines()[-1], pytrace=False)
        raise AssertionError(err)
    root = Path(line)
    return holder, root, _server_pid(root)


@pytest.mark.parametrize(("module", "cls"), SERVERS)
def test_a_test_process_stopped_by_sigterm_stops_its_server(module: str, cls: str) -> None:
    holder, root, server = _hold(module, cls)
    holder.send_signal(signal.SIGTERM)
    assert holder.wait(60) == -signal.SIGTERM  # and it still ends as SIGTERM ends a process
    assert _gone(server) and not root.exists()


@pytest.mark.parametrize(("module", "cls"), SERVERS)
def test_a_server_left_by_a_killed_test_process_is_stopped_by_the_next_one(module: str, cls: str) -> None:
    holder, root, server = _hold(module, cls)
    holder.kill()
    holder.wait(60)
    assert throwaway.start_time(server) is not None and root.exists()  # left running: nobody could stop it
    next_one, next_root, _ = _hold(module, cls)  # any session's next server sweeps first
    try:
        assert _gone(server) and not root.exists()
    finally:
        next_one.send_signal(signal.SIGTERM)
        next_one.wait(60)
    assert not next_root.exists()


def test_a_folder_whose_owner_lives_or_is_not_named_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine, nameless, dead = tmp_path / "t-mine", tmp_path / "t-nameless", tmp_path / "t-dead"
    for folder in (mine, nameless, dead):
        folder.mkdir()
    throwaway.claim(mine)
    (dead / throwaway.OWNER).write_text(f"{os.getpid()} 1")  # this pid, but not this process's start
    stopped: list[Path] = []
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert throwaway.sweep("t-", stopped.append) == [dead]
    assert stopped == [dead] and mine.exists() and nameless.exists() and not dead.exists()


def test_the_balancers_health_check_is_a_request_a_replica_serves(tmp_path: Path) -> None:
    """docs/scale-out.md's HAProxy check, as moot.testing.services writes it: an HTTP/1.1 ``GET /``
    with a Host the replica answers to gets 200. The HTTP/1.0 check without a Host it replaced got
    400 host_not_allowed every 2 s, and passed only because it accepted any 4xx."""
    import re

    import httpx

    from moot.testing.fake_openai import FakeOpenAIServer
    from moot.testing.services import HAPROXY_CFG, HAProxy
    from serving import free_port, serve_process, wait_for, wait_until_up

    doc = (Path(__file__).resolve().parents[1] / "docs" / "scale-out.md").read_text(encoding="utf-8")
    check = [line.strip() for line in HAPROXY_CFG.splitlines() if re.match(r"\s*(option httpchk|http-check)", line)]
    assert len(check) == 3 and all(line in doc for line in check)  # the doc's balancer checks the same way

    log = tmp_path / "serve.log"
    port = free_port()
    with FakeOpenAIServer() as fake:
        args = ["--port", str(port), "--db", str(tmp_path / "m.sqlite"), "--models", "openai:fake"]
        proc = serve_process([*args, "--base-url", fake.base_url], log)
        try:
            wait_until_up(f"http://127.0.0.1:{port}", proc)
            with HAProxy([port], inter="1s") as balancer:
                wait_for(lambda: '"GET / HTTP/1.1" 200' in log.read_text(), "a health check the replica served")
                assert httpx.get(balancer.url + "/v1/protocols", timeout=60).status_code == 200
        finally:
            proc.terminate()
            proc.wait(60)
    assert "400 Bad Request" not in log.read_text()
