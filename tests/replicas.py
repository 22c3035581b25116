"""Helpers of tests/test_replicas.py: N ``moot serve`` replicas as processes on loopback ports,
sharing one throwaway PostgreSQL (tests/pg_cluster.py; the processes are
:class:`moot.testing.services.Replica`), their model the loopback fake OpenAI server,
slow enough that a debate spans several seconds."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from moot.server.state.postgres import PostgresStore
from moot.testing import services
from moot.testing.fake_openai import FakeOpenAIServer
from pg_cluster import PgCluster
from serving import free_port, serve_env, wait_for


class Replica(services.Replica):
    """A ``moot serve`` process as the tests start them (:func:`serving.serve_env`: the fake key, this
    tree's ``src`` first on the path)."""

    def __init__(self, index: int, port: int, log: Path, args: Sequence[str]) -> None:
        super().__init__(index, port, log, args, env=serve_env())


@dataclass
class Deployment:
    """Replicas on one database, and a store of the test's own to read what they wrote."""

    cluster: PgCluster
    database: str
    fake: FakeOpenAIServer
    replicas: list[Replica]
    store: PostgresStore
    _next: int = field(default=0)

    @property
    def db_url(self) -> str:
        return self.cluster.url(self.database)

    def submit(self, question: str, *, rounds: int = 3, to: Replica | None = None) -> str:
        """POST /v1/debates on ``to`` (else the next replica, round-robin, as a balancer would)."""
        if to is None:
            to = self.replicas[self._next % len(self.replicas)]
            self._next += 1
        posted = httpx.post(to.url + "/v1/debates", json={"question": question, "rounds": rounds}, timeout=60)
        assert posted.status_code == 202, posted.text
        debate_id: str = posted.json()["id"]
        return debate_id

    def runner(self, debate_id: str) -> Replica | None:
        """The replica that holds the debate's lease now (its name holds its pid)."""
        owner, _ = self.store.lease(debate_id)
        if owner is None:
            return None
        pid = int(owner.split(":")[-2])
        return next((r for r in self.replicas if r.proc is not None and r.proc.pid == pid), None)

    def status(self, debate_id: str) -> str:
        row = self.store.get(debate_id, with_result=False)
        return row.status if row is not None else "missing"

    def wait_done(self, *ids: str, timeout: float = 180) -> None:
        wait_for(
            lambda: all(self.status(i) in ("complete", "failed", "timeout", "cancelled", "interrupted") for i in ids),
            f"debates {', '.join(ids)} to end",
            timeout=timeout,
        )

    def turns_stored(self, debate_id: str) -> int:
        row = self.store.get(debate_id)
        return 0 if row is None or row.result is None else len([t for t in row.result.turns() if t.ok])

    def requests_of(self, question: str) -> list[dict[str, Any]]:
        """The fake model's requests for the debate of ``question`` (each prompt names it)."""
        return [r for r in list(self.fake.requests) if any(question in str(m.get("content")) for m in r["messages"])]


@contextlib.contextmanager
def deployment(
    cluster: PgCluster,
    tmp_path: Path,
    *,
    replicas: int = 3,
    latency: float = 0.6,
    lease_s: float = 3.0,
    extra: Sequence[str] = (),
) -> Iterator[Deployment]:
    """``replicas`` processes of ``moot serve`` on a fresh database of ``cluster``; the fake model
    answers each call after ``latency`` seconds. ``extra``: more options for every replica, after
    the others (``--redis URL``; a later ``--max-running`` overrides the default here)."""
    database = cluster.create_database()
    url = cluster.url(database)
    with FakeOpenAIServer(latency=latency) as fake:
        args = [
            "--db", url, "--models", "openai:fake", "--base-url", fake.base_url, "--lease", str(lease_s),
            "--poll", "0.2", "--max-running", "4", "--log-level", "warning", *extra,
        ]  # fmt: skip
        started = [Replica(i, free_port(), tmp_path / f"replica{i}.log", args) for i in range(replicas)]
        store: PostgresStore | None = None
        try:
            for r in started:
                r.start()
            for r in started:
                wait_up(r)
            store = PostgresStore(url, application_name="moot tests")
            yield Deployment(cluster, database, fake, started, store)
        finally:
            for r in started:
                r.stop()
            if store is not None:
                store.close()
            with contextlib.suppress(Exception):
                cluster.drop_database(database)


def wait_up(replica: Replica, timeout: float = 300) -> None:
    """Until the replica answers (a bound only a hang reaches: on a loaded machine a start takes long)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not replica.alive():
            raise RuntimeError(f"replica {replica.index} exited: {replica.text()[-2000:]}")
        try:
            if httpx.get(replica.url + "/v1/protocols", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"replica {replica.index} did not come up within {timeout:g} s: {replica.text()[-2000:]}")


def restart_postgres(cluster: PgCluster) -> None:
    """``pg_ctl restart -m fast``: every connection is cut, and the server is back a moment later."""
    cluster.restart()


def wait_running_on(dep: Deployment, debate_id: str, *, turns: int, timeout: float = 120) -> Replica:
    """Once the debate has ``turns`` finished turns stored: the replica running it."""
    wait_for(lambda: dep.turns_stored(debate_id) >= turns, f"{turns} turns of {debate_id} stored", timeout=timeout)
    runner = dep.runner(debate_id)
    assert runner is not None, f"debate {debate_id} has no owner"
    return runner
