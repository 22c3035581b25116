"""Shared by every test. The suite runs on two processes (pytest-xdist, ``make pytest``): the rules
that keep a test safe beside any other are in tests/README.md."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import pytest
import yaml

from moot.models.registry import clear_cache

if TYPE_CHECKING:
    from moot.core.types import DebateResult
    from pg_cluster import PgCluster
    from redis_server import RedisServer

_Server = TypeVar("_Server", "PgCluster", "RedisServer")

# Ray instances the tests start (test_ray.py) listen on loopback only and report no usage
# statistics; both are read when Ray is imported, so they are set before any test imports it.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

# One terminal width for every test, in one process or in an xdist worker. pytest imports `readline`
# first thing (its capture plugin), and GNU readline, initialising, writes the terminal's size (80x24
# from terminfo when there is no terminal) into the process's C environment as COLUMNS and LINES:
# os.environ does not show them, but every child inherits them, an xdist worker included. There
# moot's console read COLUMNS=80 when it was made (moot.cli.common) and kept it, so tables and paths
# wrapped at 80 instead of the 160 of a pipe, and a CliRunner's env={"COLUMNS": ...} came too late.
# Removed here (os.unsetenv: os.environ never had them in this process), a worker and any command a
# test runs see the same environment as a test in one process; the consoles' width is pinned below.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)
    os.unsetenv(_name)


def _one_root_for_tls() -> None:
    """The certificates a TLS client of this run trusts: one of certifi's roots (SSL_CERT_FILE, which
    httpx, the openai SDK, aiohttp and OpenSSL read), unless the environment names its own.

    No test reaches anything but loopback over plain HTTP, so no certificate is ever checked; but
    every httpx client (each ``httpx.get``, each SDK client a test makes) loaded certifi's 140 roots
    when made, 44 ms each (1.2 ms for one root): 12% of tests/test_serve_api.py's time. Every
    command a test starts inherits it."""
    if os.environ.get("SSL_CERT_FILE") or os.environ.get("SSL_CERT_DIR"):
        return
    import atexit
    import re
    import tempfile

    import certifi

    bundle = Path(certifi.where()).read_text(encoding="ascii")
    first = re.search(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----\n", bundle, re.S)
    assert first is not None, f"no certificate in {certifi.where()}"
    fd, path = tempfile.mkstemp(prefix="moot-tests-root-", suffix=".pem")
    with os.fdopen(fd, "w", encoding="ascii") as out:
        out.write(first.group(0))
    atexit.register(lambda: Path(path).unlink(missing_ok=True))
    os.environ["SSL_CERT_FILE"] = path


_one_root_for_tls()


def _http_waits_for_a_hang_only() -> None:
    """httpx's calls without a timeout of their own (``httpx.post(url)``, a bare ``httpx.Client()``;
    some 220 in the tests) wait 60 s, not httpx's 5 s: on a loaded machine an in-process server once
    took over 5 s to refuse a request, and a bound here is for a hang only (tests/README.md, rule 5).
    The default object is the one httpx's functions and clients were defined with: changed in place."""
    import httpx._config

    default = httpx._config.DEFAULT_TIMEOUT_CONFIG
    default.connect = default.read = default.write = default.pool = 60.0


_http_waits_for_a_hang_only()

# llama.cpp's threads wait on each other at every step: two models of two threads each on two cores
# (one per xdist worker, both in tests/test_embedded.py at once, which SLOWEST_FIRST starts together)
# all but stopped (smollm2: 366 tokens in 9 s with a thread each; not done in 300 s with two each).
# A worker's models get their share of the CPUs (moot's default measures the other work only as a
# model loads, when the other worker may be between two tests). Every command a test starts inherits it.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT") and not os.environ.get("MOOT_EMBEDDED_THREADS"):
    _cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 2
    os.environ["MOOT_EMBEDDED_THREADS"] = str(max(1, _cpus // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

# A test run started as a background job of a script (nohup make test &) inherits SIGINT ignored,
# and so would every moot process the tests start and then interrupt with SIGINT (Ctrl-C). A handled
# signal is reset to the default in a new program, so this gives those processes their Ctrl-C back.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


#: What :func:`_checked_result_json` found wrong, failed at the end of the test (:func:`_store_problems`):
#: raised in a store's write, the server would take it for that write's failure, and go on.
STORE_PROBLEMS: list[str] = []


def _checked_result_json() -> None:
    """Every stored transcript a server in this process writes from its turns' cached JSON
    (:class:`~moot.server.state.result_json.ResultJson`: its frame, and the rows its store holds or
    is given) is checked against the result's own JSON, and read back from a SQLite store once
    committed: a turn changed after it was recorded, unknown to the cache, or a row the store did
    not get, fails the test."""
    try:
        from moot.server.state.base import Write, WriteFailure
        from moot.server.state.result_json import ResultJson, Split, assembled
    except ImportError:  # no serve extra: no server runs in this process
        return
    split = ResultJson.split

    def checked(self: ResultJson, result: DebateResult, secrets: Iterable[str] = ()) -> Split:
        given = list(secrets)
        made = split(self, result, given)
        rows = dict(self._stored)  # what the store holds of it, as far as its writes committed
        rows.update({n: (place, text) for n, place, text in made.rows})
        ordered = [rows[n] for n in range(made.count)]
        whole = json.loads(result.to_json(indent=None, secrets=given))
        if assembled(made.frame, ordered) != whole:
            STORE_PROBLEMS.append("ResultJson's split differs from the result's own JSON")
        return made

    ResultJson.split = checked  # type: ignore[method-assign]

    # And read back: each transcript a server's SQLite store committed (one process's: no replica
    # writes it meanwhile) is, as the store returns it, the result's own JSON.
    from moot.server.state.sqlite import SqliteStore

    write_one, together = SqliteStore.write_one, SqliteStore._write_together

    def read_back(store: SqliteStore, writes: list[Write]) -> None:
        for w in writes:
            if w.result is None or w.encoder is None:
                continue
            got = store.get(w.debate_id)
            if got is None:  # (deleted meanwhile)
                continue
            stored = None if got.result is None else json.loads(got.result.to_json(indent=None))
            if stored != json.loads(w.result.to_json(indent=None, secrets=store.secrets)):
                STORE_PROBLEMS.append(f"debate {w.debate_id}: the transcript read back is not the one written")

    def one(self: SqliteStore, write: Write) -> None:
        write_one(self, write)
        read_back(self, [write])

    def several(self: SqliteStore, writes: list[Write]) -> list[WriteFailure]:
        lost = together(self, writes)
        refused = {f.debate_id for f in lost}
        read_back(self, [w for w in writes if w.debate_id not in refused])
        return lost

    SqliteStore.write_one = one  # type: ignore[method-assign]
    SqliteStore._write_together = several  # type: ignore[method-assign]


_checked_result_json()


@pytest.fixture(autouse=True)
def _store_problems() -> Iterator[None]:
    yield
    found, STORE_PROBLEMS[:] = list(STORE_PROBLEMS), []
    if found:
        pytest.fail("; ".join(found[:3]))


@pytest.fixture(autouse=True)
def _fresh_model_cache(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test resolves its own models; no test sees a user's MOOT_MODEL or API key, nor the
    database a user's MOOT_DB_URL names (tools/services.sh env)."""
    monkeypatch.delenv("MOOT_MODEL", raising=False)
    monkeypatch.delenv("MOOT_DB_URL", raising=False)
    clear_cache()
    yield
    clear_cache()
    policy = sys.modules.get("moot.server.policy")
    if policy is not None:  # the server's presets made once: none made under one test's patches kept
        policy._made_preset.cache_clear()


def _throwaway(make: Callable[[], _Server], what: str) -> Iterator[_Server]:
    """A throwaway server (moot.testing.services) for a session fixture: a missing program or a
    server that does not start fails the tests that need it in one line (how to install it), never
    skips them; the server is stopped and its folder removed after the session."""
    try:
        server = make()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        server.start()
    except RuntimeError as exc:
        server.close()
        pytest.fail(f"the tests' {what} did not start: {exc}", pytrace=False)
    yield server
    server.close()


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    """A throwaway PostgreSQL cluster for the session (tests/pg_cluster.py): the tests that need it
    fail, with one line saying how to install it, where PostgreSQL is missing; they never skip."""
    from pg_cluster import PgCluster  # (here: a test that copies this file alone need not have it)

    yield from _throwaway(PgCluster, "PostgreSQL cluster")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A throwaway ``redis-server`` for the session (tests/redis_server.py), shared by the tests of the
    live bus and of the replicas; a test that kills Redis starts one of its own. Where the program
    is missing, the tests that need it fail with one line saying how to install it; they never skip."""
    from redis_server import RedisServer

    yield from _throwaway(RedisServer, "redis-server")


REQUIREMENTS = Path(__file__).resolve().parent.parent / "docs" / "requirements.yaml"


#: Node id prefixes of the tests that take longest (tens of seconds to minutes of CPU each), started
#: before the rest, longest first, so that the two workers end together instead of one finishing a
#: long test alone (xdist hands out the others one by one as a worker frees up). Add a test that
#: takes more than about 20 s of CPU (``pytest --durations=30``).
SLOWEST_FIRST = (
    # One xdist group (``replicas``, run in one worker in order): minutes of one worker together.
    "tests/test_replicas.py::",
    "tests/test_replicas_redis.py::",
    "tests/test_openai_takeover.py::",
    "tests/test_committed_results.py::test_a_committed_report_is_its_store_analysed_today",
    "tests/test_embedded.py::",
    "tests/test_docs_snippets.py::test_python_block_runs_as_written",
    "tests/test_committed_results.py::test_a_committed_tune_is_its_two_runs_analysed_today",
    "tests/test_docs_snippets.py::test_shell_block_runs_as_written",
)


#: The real-model tier, marked ``slow`` (``make test`` leaves it out, ``make test-slow`` runs it, CI
#: runs both): every test marked ``embedded`` (the tiny model's generation is their time), and these
#: node id prefixes: the docs' blocks run as written (most talk to ``moot serve`` on the tiny model),
#: the committed results re-derived whole from their stores, and Ray's local instance.
SLOW_TIER = (
    "tests/test_committed_results.py::test_a_committed_report_is_its_store_analysed_today",
    "tests/test_committed_results.py::test_a_committed_tune_is_its_two_runs_analysed_today",
    "tests/test_docs_snippets.py::test_python_block_runs_as_written",
    "tests/test_docs_snippets.py::test_shell_block_runs_as_written",
    "tests/test_ray.py::",
)


def _slow(item: pytest.Item) -> bool:
    return item.get_closest_marker("embedded") is not None or item.nodeid.startswith(SLOW_TIER)


def _rank(item: pytest.Item) -> int:
    return next((i for i, prefix in enumerate(SLOWEST_FIRST) if item.nodeid.startswith(prefix)), len(SLOWEST_FIRST))


def _pin_cli_width() -> None:
    """moot's consoles, made when a test module imported the CLI, print as into a pipe
    (``PIPE_WIDTH``) in every test, as a CliRunner's output is one: also under ``pytest -s``, where
    they were made on a terminal and would take its width."""
    common = sys.modules.get("moot.cli.common")
    if common is not None:
        for console in (common.console, common.err_console):
            console.width = common.PIPE_WIDTH


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by the marks added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that names a requirement docs/requirements.yaml does not list fails the collection
    (tests/test_traceability.py checks the other way: every requirement has a test). The real-model
    tier is marked ``slow`` (``SLOW_TIER``), and the slowest tests are moved to the front
    (``SLOWEST_FIRST``), the others keeping their order."""
    for item in items:
        if _slow(item):
            item.add_marker(pytest.mark.slow)
    items.sort(key=_rank)  # stable; every worker collects the same order, as xdist requires
    _pin_cli_width()
    known = {str(r["id"]) for r in yaml.safe_load(REQUIREMENTS.read_text(encoding="utf-8"))["requirements"]}
    unknown = sorted(
        {
            f"{item.nodeid} names {rid!r}"
            for item in items
            for marker in item.iter_markers("req")
            for rid in marker.args
            if rid not in known
        }
    )
    if unknown:
        raise pytest.UsageError(
            "unknown requirement(s), not in docs/requirements.yaml: "
            + "; ".join(unknown[:5])
            + (f" (and {len(unknown) - 5} more)" if len(unknown) > 5 else "")
        )
