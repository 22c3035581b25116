"""``--ray`` on a real Ray cluster on this machine (started by these tests, 2 CPUs, no dashboard):
the fake OpenAI server and the tiny embedded model behind Ray actors, an actor killed mid-run,
secrets kept out of Ray's files, and the refusals. Ray is the optional extra ``moot[ray]``, which
``make test`` installs."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from moot.batch import run_batch
from moot.cli.main import app
from moot.eval.store import RunStore
from moot.models.weights import CATALOG, is_installed
from moot.testing.fake_openai import FakeOpenAIServer
from test_batch import KEY, moderated_reply, questions_in

ray = pytest.importorskip("ray", reason="Ray is the optional extra moot[ray] (make test installs it)")

FIXTURES = Path(__file__).parent / "fixtures" / "eval"


def short_tmp() -> str:
    # Ray puts unix sockets under its temp dir: the path must stay short.
    return tempfile.mkdtemp(prefix="mr", dir="/tmp")


def claims(folder: Path, n: int) -> Path:
    """A batch input of ``n`` claims the fake server's moderated reply supports."""
    path = folder / "claims.jsonl"
    path.write_text(
        "".join(json.dumps({"id": f"c{i}", "question": f"Claim {i} is SUPPORTED."}) + "\n" for i in range(n))
    )
    return path


# This test starts its own Ray instance in a subprocess, so it runs before the shared cluster below.
def test_cli_on_a_local_ray_instance_keeps_the_key_out_of_every_file(tmp_path: Path) -> None:
    temp = short_tmp()
    inputs = claims(tmp_path, 6)
    try:
        with FakeOpenAIServer(latency=0.05, reply=moderated_reply) as server:
            proc = subprocess.run(
                [sys.executable, "-c", "from moot.cli.main import main; main()", "batch", str(inputs),
                 "-p", "moderated", "-m", "openai:fake", "--base-url", server.base_url, "--api-key", KEY,
                 "--out", str(tmp_path / "run"), "--export", str(tmp_path / "r.csv"), "--ray", "local",
                 "--workers", "2", "-j", "2"],
                env={**os.environ, "RAY_TMPDIR": temp}, capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            output = proc.stdout + proc.stderr
            assert proc.returncode == 0, output
            # the key reached the workers: every request carried it
            assert server.headers_seen and all(h.get("authorization") == f"Bearer {KEY}" for h in server.headers_seen)
        assert "ray: 2 worker(s) x 1 CPU on 1 node(s), 2 debate(s) at once each, model openai:fake" in output
        rows = list(csv.DictReader((tmp_path / "r.csv").open()))
        assert [r["id"] for r in rows] == [f"c{i}" for i in range(6)]
        assert {r["decision"] for r in rows} == {"SUPPORT"} and {r["status"] for r in rows} == {"ok"}
        assert len({r["worker"] for r in rows}) == 2 and all(r["worker"].startswith("moot-") for r in rows)
        # ... and was written nowhere: not in Ray's session files and logs, not in the run, not on screen
        written = [p for p in Path(temp).rglob("*") if p.is_file() and not p.is_socket()]
        assert any(p.name.endswith(".log") for p in written)
        leaks = [str(p) for p in written if KEY.encode() in p.read_bytes()]
        assert leaks == []
        assert KEY.encode() not in (tmp_path / "run" / "run.sqlite").read_bytes()
        assert KEY not in output
        assert "WARNING" not in output, output  # Ray's notice that token authentication is on
    finally:
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.parametrize("command", ["batch", "eval"])
def test_ray_local_without_a_usable_temp_folder_is_one_line_and_exit_2(tmp_path: Path, command: str) -> None:
    """Issue 28: ``--ray local`` where Ray cannot create its temp folder printed a 74-line
    traceback; it is now one line naming RAY_TMPDIR, exit 2, before any debate."""
    if command == "batch":
        args = ["batch", str(claims(tmp_path, 1)), "-p", "single"]
    else:
        args = ["eval", "-d", str(FIXTURES / "science.jsonl"), "-p", "single", "--no-report"]
    proc = subprocess.run(
        [sys.executable, "-c", "from moot.cli.main import main; main()", *args, "-m", "openai:fake",
         "--base-url", "http://127.0.0.1:9/v1", "--api-key", KEY, "--out", str(tmp_path / "run"), "--ray", "local"],
        env={**os.environ, "RAY_TMPDIR": "/proc/no-such-folder"}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert "Traceback" not in output
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Ray cannot start here" in errors[0] and "RAY_TMPDIR" in errors[0], output


def test_sigterm_stops_a_ray_run_as_ctrl_c_does(tmp_path: Path) -> None:
    """``ray.init`` installs its own SIGTERM handler (``sys.exit``): a run on Ray stopped by ``kill``
    must still end as every moot command does, interrupted, saying where its finished items are."""
    temp = short_tmp()
    out = tmp_path / "run"
    inputs = claims(tmp_path, 40)
    try:
        with FakeOpenAIServer(latency=0.3, reply=moderated_reply) as server:
            proc = subprocess.Popen(
                [sys.executable, "-c", "from moot.cli.main import main; main()", "batch", str(inputs),
                 "-p", "moderated", "-m", "openai:fake", "--base-url", server.base_url, "--api-key", KEY,
                 "--out", str(out), "--ray", "local", "--workers", "1", "-j", "1"],
                env={**os.environ, "RAY_TMPDIR": temp}, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )  # fmt: skip
            try:
                deadline = time.monotonic() + 240  # a hang, not a slow machine
                while not _results(out / "run.sqlite"):
                    assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
                    time.sleep(0.2)
                proc.send_signal(signal.SIGTERM)
                _, err = proc.communicate(timeout=240)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        assert proc.returncode == 130, err
        assert f"interrupted: finished items are saved in {out / 'run.sqlite'}" in " ".join(err.split()), err
        assert "Traceback" not in err
        assert 0 < _results(out / "run.sqlite") < 40
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def _results(db: Path) -> int:
    if not db.exists():
        return 0
    with contextlib.closing(sqlite3.connect(db)) as conn:
        try:
            return int(conn.execute("SELECT COUNT(*) FROM results").fetchone()[0])
        except sqlite3.OperationalError:  # the run has not made its tables yet
            return 0


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    """One Ray instance for the tests below (this process is its driver; moot joins it). They are
    the ``ray-cluster`` xdist group, so that one worker runs them all on one instance."""
    temp = short_tmp()
    before = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = temp
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="moot")
        yield
    finally:
        ray.shutdown()
        if before is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = before
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.usefixtures("cluster")
@pytest.mark.xdist_group("ray-cluster")
def test_an_actor_killed_mid_run_loses_nothing_and_nothing_finished_is_paid_twice(tmp_path: Path) -> None:
    out = tmp_path / "run"
    questions = [f"Claim K{i:02d}X is SUPPORTED." for i in range(24)]

    async def drive(server: FakeOpenAIServer) -> tuple[list[str], str]:
        yielded: list[str] = []
        killed = ""
        async for result in run_batch(
            questions, out=out, protocol="moderated", model="openai:fake", ray="auto", workers=2,
            concurrency=3, model_options={"base_url": server.base_url},
        ):  # fmt: skip
            yielded.append(result.id)
            if not killed:
                # the worker that just finished an item still has items in flight: kill it
                assert result.worker is not None
                killed = result.worker
                ray.kill(ray.get_actor(killed, namespace="moot"))
        return yielded, killed

    with FakeOpenAIServer(latency=0.3, reply=moderated_reply) as server:
        yielded, killed = asyncio.run(asyncio.wait_for(drive(server), 240))
        paid = {q: questions_in(server, q) for q in questions}
    store = RunStore.open(out)
    rows = {r.item_id: r for r in store.results()}
    store.close()
    # every item present exactly once, finished
    assert sorted(yielded, key=int) == sorted(rows, key=int) == [str(i) for i in range(1, 25)]
    assert all(r.status == "ok" and r.calls == 3 for r in rows.values())
    rerun = [r for r in rows.values() if r.attempts > 1]
    assert rerun, "the killed actor had items in flight; they must have been run again"
    assert all(r.worker != killed for r in rerun)
    for i, q in enumerate(questions, 1):
        row = rows[str(i)]
        if row.attempts == 1:
            assert paid[q] == row.calls, f"item {i} finished once and must be paid once"
        else:
            # whatever the killed attempt had paid, then a whole second run elsewhere
            assert paid[q] >= row.calls
    # the item whose result came back first was not touched by the kill
    assert rows[yielded[0]].attempts == 1 and rows[yielded[0]].worker == killed


@pytest.mark.usefixtures("cluster")
@pytest.mark.xdist_group("ray-cluster")
def test_eval_runs_on_ray_workers_and_this_process_writes_the_store(tmp_path: Path) -> None:
    script = tmp_path / "replies.json"
    script.write_text(json.dumps([{"reasoning": "r", "answer": "B", "confidence": 0.9}] * 12))
    out = tmp_path / "run"
    args = ["eval", "--dataset", str(FIXTURES / "science.jsonl"), "--n", "4", "--protocols", "single",
            "-m", f"scripted:{script}", "--out", str(out), "--ray", "auto", "--workers", "2", "-j", "2",
            "--worker-cpus", "0.5", "--no-report"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "ray: 2 worker(s) x 0.5 CPU on 1 node(s), 2 debate(s) at once each" in result.output
    store = RunStore.open(out)
    rows = store.results("single")
    store.close()
    assert len(rows) == 4 and all(r.status == "ok" and r.worker and r.worker.startswith("moot-") for r in rows)
    assert any(r.correct for r in rows)
    # the workers are gone once the run ends; the cluster (not the run's) stays up
    assert not [a for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == "moot"]
    assert ray.is_initialized()


@pytest.mark.usefixtures("cluster")
@pytest.mark.xdist_group("ray-cluster")
def test_workers_that_do_not_fit_the_cluster_are_refused_before_any_work(tmp_path: Path) -> None:
    inputs = tmp_path / "q.txt"
    inputs.write_text("one?\n")
    result = CliRunner().invoke(
        app,
        [
            "batch",
            str(inputs),
            "-m",
            "openai:fake",
            "--base-url",
            "http://127.0.0.1:9/v1",
            "-o",
            str(tmp_path / "run"),
            "--ray",
            "auto",
            "--workers",
            "5",
        ],
    )
    assert result.exit_code == 1
    assert "5 workers x 1 CPU do not fit the cluster's 2 CPUs: use --workers 2 or a smaller --worker-cpus" in (
        result.output.replace("\n", " ")
    )


@pytest.mark.embedded
@pytest.mark.skipif(
    not is_installed(CATALOG["smollm2-135m"]),
    reason="embedded:smollm2-135m is not installed (make test installs it: moot models install smollm2-135m)",
)
@pytest.mark.usefixtures("cluster")
@pytest.mark.xdist_group("ray-cluster")
def test_an_embedded_model_actor_loads_once_with_threads_sized_to_its_cpus(tmp_path: Path) -> None:
    inputs = tmp_path / "q.txt"
    inputs.write_text("Is the sky blue?\nIs water wet?\n")
    result = CliRunner().invoke(
        app,
        [
            "batch",
            str(inputs),
            "-m",
            "embedded:smollm2-135m",
            "--rounds",
            "1",
            "--max-tokens",
            "12",
            "--timeout",
            "300",
            "-o",
            str(tmp_path / "run"),
            "--ray",
            "auto",
            "--workers",
            "1",
            "--worker-cpus",
            "1",
            "--export",
            str(tmp_path / "r.jsonl"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "model embedded:smollm2-135m, 1 llama.cpp thread(s) each" in result.output
    rows = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [r["status"] for r in rows] == ["ok", "ok"] and all(r["calls"] == 3 for r in rows)
    assert len({r["worker"] for r in rows}) == 1


@pytest.mark.usefixtures("cluster")
@pytest.mark.xdist_group("ray-cluster")
def test_eval_on_ray_shares_the_runs_request_cache_through_the_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from moot.testing.fake_openai import schema_reply

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    out = tmp_path / "run"
    with FakeOpenAIServer(reply=schema_reply) as server:
        args = ["eval", "--dataset", str(FIXTURES / "science.jsonl"), "--n", "3",
                "--protocols", "single,vote@3,society-of-minds", "-m", "openai:fake", "--base-url", server.base_url,
                "--out", str(out), "--ray", "auto", "--workers", "2", "-j", "2", "--worker-cpus", "0.5",
                "--no-report"]  # fmt: skip
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        made = len(server.requests)
    store = RunStore.open(out)
    try:
        rows = {p: {r.item_id: r for r in store.results(p)} for p in ("single", "vote@3", "society-of-minds")}
        assert all(len(v) == 3 and all(r.status == "ok" for r in v.values()) for v in rows.values())
        # An item's protocols ran in the run's order on the workers: the debate's first round was
        # served from the vote's samples, as in one process; every protocol still reports its full cost.
        for item in rows["single"]:
            assert rows["vote@3"][item].cached_calls == 0 and rows["vote@3"][item].calls == 3
            assert rows["society-of-minds"][item].cached_calls == 3 and rows["society-of-minds"][item].calls == 6
            assert len(store.cache.for_item(item)) >= 3 + 6 - 3  # the driver stored what the workers added
        reported = sum(r.calls for v in rows.values() for r in v.values())
        saved = sum(r.cached_calls for v in rows.values() for r in v.values())
        assert made == reported - saved == len(store.cache)
    finally:
        store.close()
