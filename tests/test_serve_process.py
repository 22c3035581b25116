"""``moot serve`` as a process: its refusals to start, a kill -9 mid-debate and the restart that
finds the debate interrupted with its partial transcript, and a key that never reaches a log or
the store."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from typer.testing import CliRunner

from moot.cli.main import app
from moot.core.types import DebateResult
from moot.runlock import RunLock
from moot.server.state.sqlite import SqliteStore
from moot.testing.fake_openai import FakeOpenAIServer, Fault
from serving import free_port, read_events, serve_process, wait_for, wait_until_up

runner = CliRunner()


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["--host", "0.0.0.0"], {}, "refusing to listen on 0.0.0.0 without an API key"),
        (["--host", "192.168.1.5", "--port", "9"], {}, "--api-key-env VAR"),
        (["--host", "0.0.0.0", "--api-key-env", "MOOT_TEST_SERVE_KEY"], {}, "empty or unset"),
        (["--api-key-env", "MOOT_TEST_SERVE_KEY"], {"MOOT_TEST_SERVE_KEY": "short"}, "shorter than 16"),
        # an address of another machine: nothing here can listen on it
        (
            ["--host", "192.0.2.7", "--api-key-env", "MOOT_TEST_SERVE_KEY"],
            {"MOOT_TEST_SERVE_KEY": "k" * 20},
            "--host 192.0.2.7 --port 8000: cannot listen there",
        ),
        (["--models", "scripted:/no/such/replies.json"], {}, "--models scripted:/no/such/replies.json: scripted"),
        (["--models", "nonsense:x"], {}, "unknown model spec"),
    ],
)
def test_serve_refuses_to_start_with_one_line(
    args: list[str], env: dict[str, str], needle: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The default store (./moot.sqlite) is opened before the address is tried: here, not in the
    # folder the suite runs from, where every worker's run of this test would share it.
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MOOT_TEST_SERVE_KEY", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    result = runner.invoke(app, ["serve", "--models", "openai:x", *args], env={"OPENAI_API_KEY": "sk-x-0000000000"})
    assert result.exit_code == 2, result.output
    assert needle in result.output and len(result.output.strip().splitlines()) == 1
    assert "Traceback" not in result.output


@pytest.mark.parametrize(("option", "package"), [("--loop", "uvloop"), ("--http", "httptools")])
def test_a_loop_or_parser_asked_for_and_not_installed_is_one_line(
    option: str, package: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import moot.cli.serve as serve

    real = serve.find_spec
    monkeypatch.setattr(serve, "find_spec", lambda name: None if name == package else real(name))
    result = runner.invoke(app, ["serve", "--models", "openai:x", option, package], env={"OPENAI_API_KEY": "k" * 16})
    assert result.exit_code == 2, result.output
    assert f"{option} {package}: {package} is not installed" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_serve_refuses_a_folder_as_its_db(tmp_path: Path) -> None:
    result = runner.invoke(app, ["serve", "--models", "openai:x", "--db", str(tmp_path)], env={"OPENAI_API_KEY": "k"})
    assert result.exit_code == 2 and "is a folder" in result.output


def test_serve_on_a_port_in_use_says_so_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = runner.invoke(
            app,
            ["serve", "--models", "openai:x", "--db", str(tmp_path / "m.sqlite"), "--port", str(port)],
            env={"OPENAI_API_KEY": "k"},
        )
    assert result.exit_code == 2, result.output
    assert f"--port {port}: cannot listen there" in result.output and "give another --port" in result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == []  # refused before the store: no SQLite file, no lock left behind
    with RunLock.acquire(tmp_path, "m.sqlite.lock"):  # the same --db can serve elsewhere
        pass


@pytest.fixture
def fake() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(latency=0.3) as server:
        yield server


def kill(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> int:
    if proc.poll() is None:
        os.kill(proc.pid, sig)
    return proc.wait(timeout=60)


def test_a_server_killed_mid_debate_shows_it_interrupted_after_restart(fake: FakeOpenAIServer, tmp_path: Path) -> None:
    db, log = tmp_path / "moot.sqlite", tmp_path / "serve.log"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["--port", str(port), "--db", str(db), "--models", "openai:fake", "--base-url", fake.base_url]
    proc = serve_process(args, log)
    try:
        wait_until_up(url, proc)
        body = {"question": "Is nuclear power a good way to cut emissions?", "rounds": 3}
        debate_id = httpx.post(url + "/v1/debates", json=body).json()["id"]
        # round 1 is written; round 2 is in flight
        wait_for(lambda: httpx.get(f"{url}/v1/debates/{debate_id}").json()["calls"] >= 3, "round 2 to start")
        assert kill(proc) == -signal.SIGKILL
    finally:
        kill(proc)
    restarted = serve_process(args, log)
    try:
        wait_until_up(url, restarted)
        info: dict[str, Any] = httpx.get(f"{url}/v1/debates/{debate_id}").json()
        assert info["status"] == "interrupted" and "the server stopped" in info["error"]
        result = DebateResult.model_validate(info["result"])
        assert [t.speaker for t in result.rounds[0].turns] == ["affirmative", "critical"]
        assert all(t.ok for t in result.rounds[0].turns) and result.final_answer is None
        assert result.status == "interrupted"  # a saved transcript does not read as still running
        listed = httpx.get(url + "/v1/debates", params={"status": "interrupted"}).json()["debates"]
        assert [d["id"] for d in listed] == [debate_id]
        events = read_events(f"{url}/v1/debates/{debate_id}/events")
        ids = [e["id"] for e in events]
        assert ids == sorted(set(ids)) and events[0]["event"] == "debate_started"
        assert events[-1]["event"] == "debate_done" and events[-1]["data"]["status"] == "interrupted"
        done_first = [e["data"]["turn"] for e in events if e["event"] == "turn_done"][:2]
        assert {(t["speaker"], t["round"]) for t in done_first} == {("affirmative", 1), ("critical", 1)}
        # the restarted server runs new debates as usual
        fresh = httpx.post(url + "/v1/debates", json={"question": "Q?", "rounds": 1}).json()["id"]
        wait_for(lambda: httpx.get(f"{url}/v1/debates/{fresh}").json()["status"] == "complete", "a new debate")
    finally:
        kill(restarted, signal.SIGTERM)
    assert "Traceback" not in log.read_text()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_debate_queued_when_the_server_stopped_runs_after_restart(
    sig: int, fake: FakeOpenAIServer, tmp_path: Path
) -> None:
    """A debate still waiting in the queue never started: after a kill -9 or a clean stop it runs at
    the next start, under its id (the one that was running is interrupted)."""
    db, log = tmp_path / "moot.sqlite", tmp_path / "serve.log"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["--port", str(port), "--db", str(db), "--models", "openai:fake", "--base-url", fake.base_url]
    fake.faults.extend([Fault.delay(3600), Fault.delay(3600)])  # the first debate's round 1 hangs
    proc = serve_process([*args, "--max-running", "1"], log)
    try:
        wait_until_up(url, proc)
        body = {"question": "Is nuclear power a good way to cut emissions?", "rounds": 1}
        running = httpx.post(url + "/v1/debates", json=body).json()["id"]
        queued = httpx.post(url + "/v1/debates", json=body).json()["id"]
        wait_for(lambda: len(fake.requests) >= 2, "the first debate's calls")
        assert httpx.get(f"{url}/v1/debates/{queued}").json()["status"] == "queued"
        assert kill(proc, sig) in (0, -sig)
    finally:
        kill(proc)
    restarted = serve_process(args, log)
    try:
        wait_until_up(url, restarted)
        assert httpx.get(f"{url}/v1/debates/{running}").json()["status"] == "interrupted"

        def done() -> dict[str, Any] | None:
            info: dict[str, Any] = httpx.get(f"{url}/v1/debates/{queued}").json()
            return info if info["status"] not in ("queued", "running") else None

        info = wait_for(done, "the queued debate to run")
        assert info["status"] == "complete" and info["error"] is None and info["calls"] == 3
    finally:
        kill(restarted, signal.SIGTERM)
    text = log.read_text()
    assert "1 debate(s) still queued when the last run stopped are queued again" in text and "Traceback" not in text


def test_a_graceful_stop_ends_every_open_stream_with_its_reason(fake: FakeOpenAIServer, tmp_path: Path) -> None:
    """SIGTERM: the event stream of a running debate ends with its debate_done (interrupted, and why),
    that of a debate still queued (kept to run at the next start) with an error event saying so, and
    a streamed chat completion, running or queued, with an error chunk and [DONE]: no stream is cut."""
    db, log = tmp_path / "moot.sqlite", tmp_path / "serve.log"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["--port", str(port), "--db", str(db), "--models", "openai:fake", "--base-url", fake.base_url]
    proc = serve_process([*args, "--max-running", "2"], log)
    lines: dict[str, list[str]] = {}
    errors: list[BaseException] = []

    def read(name: str, method: str, path: str, body: dict[str, Any] | None = None) -> threading.Thread:
        lines[name] = []

        def run() -> None:
            try:
                with httpx.stream(method, url + path, json=body, timeout=60) as response:
                    lines[name].append("<open>")
                    for line in response.iter_lines():
                        lines[name].append(line)
            except BaseException as exc:  # a cut stream: the test reports it below
                errors.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    try:
        wait_until_up(url, proc)
        fake.faults.extend([Fault.delay(60)] * 8)  # the running debates' calls hang: they stay running
        chat = {"model": "moot/affirmative-critical", "messages": [{"role": "user", "content": "Q?"}], "stream": True}
        running = httpx.post(url + "/v1/debates", json={"question": "Q?", "rounds": 3}).json()["id"]
        readers = [
            read("events", "GET", f"/v1/debates/{running}/events"),
            read("chat", "POST", "/v1/chat/completions", chat),
        ]
        # the two slots taken: what follows waits in the queue
        wait_for(lambda: len(httpx.get(url + "/v1/debates?status=running").json()["debates"]) == 2, "both to run")
        queued = httpx.post(url + "/v1/debates", json={"question": "Q?"}).json()["id"]
        readers += [
            read("queued", "GET", f"/v1/debates/{queued}/events"),
            read("queued chat", "POST", "/v1/chat/completions", chat),
            read("queued response", "POST", "/v1/responses", {"model": "moot/single", "input": "Q?", "stream": True}),
        ]
        wait_for(lambda: all(lines.values()) and "event: turn_started" in lines["events"], "the five streams")
        assert httpx.get(f"{url}/v1/debates/{queued}").json()["status"] == "queued"
        assert kill(proc, signal.SIGTERM) in (0, -signal.SIGTERM)
        for reader in readers:
            reader.join(60)
    finally:
        kill(proc)
    assert errors == []  # no connection was cut

    def data(name: str) -> list[str]:
        return [x.removeprefix("data: ") for x in lines[name] if x.startswith("data: ")]

    def names(name: str) -> list[str]:
        return [x.removeprefix("event: ") for x in lines[name] if x.startswith("event: ")]

    assert names("events")[-1] == "debate_done"
    done = json.loads(data("events")[-1])
    assert done["status"] == "interrupted" and done["error"].startswith("the server stopped")
    assert names("queued") == ["error"] and lines["queued"][1] == "event: error"  # no id: a resume is unchanged
    stopping = json.loads(data("queued")[-1])["error"]
    assert (
        stopping["code"] == "server_stopping"
        and "stays queued and runs when the server starts again" in stopping["message"]
    )
    for name, code, needle in (
        ("chat", "debate_interrupted", "the server stopped"),
        ("queued chat", "server_stopping", "never started; send the request again"),
    ):
        chunks = data(name)
        assert chunks[-1] == "[DONE]", name
        error = json.loads(chunks[-2])["error"]
        assert error["code"] == code and needle in error["message"], (name, error)
    # a streamed response ends in an error event saying server_stopping, as the chat stream does (it
    # ended in response.failed with code server_error: a client could not tell "send it again with its
    # Idempotency-Key" from a failure without reading the text)
    stopped = json.loads(data("queued response")[-1])
    assert stopped["type"] == "error" and stopped["code"] == "server_stopping", stopped
    assert "response.failed" not in names("queued response")
    text = log.read_text()
    assert "Traceback" not in text and "ASGI callable returned without completing" not in text


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.parametrize(
    ("host", "shown"),
    [
        ("127.0.0.1", "localhost"),
        pytest.param("::1", "[::1]", marks=pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback")),
    ],
)
def test_serve_on_port_0_prints_the_address_it_got(
    host: str, shown: str, fake: FakeOpenAIServer, tmp_path: Path
) -> None:
    """The printed URL is one that reaches the server: the real port, and the address family it
    listens on ("localhost" can resolve to the other one first)."""
    log = tmp_path / "serve.log"
    args = ["--host", host, "--port", "0", "--db", str(tmp_path / "m.sqlite"), "--max-question-chars", "50"]
    proc = serve_process([*args, "--models", "openai:fake", "--base-url", fake.base_url], log)
    try:

        def address() -> list[str]:
            return re.findall(rf"http://{re.escape(shown)}:(\d+)/", log.read_text())

        found: list[str] = wait_for(address, "the address line")
        port = int(found[0])
        assert port != 0
        url = f"http://{'[::1]' if host == '::1' else host}:{port}"
        wait_until_up(url, proc)
        assert httpx.get(url + "/v1/models").status_code == 200
        # (and --max-question-chars reaches the server: the last user message is the question)
        chat = {"model": "moot/single", "messages": [{"role": "user", "content": "q" * 51}]}
        refused = httpx.post(url + "/v1/chat/completions", json=chat).json()["error"]
        assert "51 characters is over this server's limit of 50" in refused["message"]
        assert "--max-question-chars" in refused["message"] and "in an earlier message" in refused["message"]
    finally:
        kill(proc, signal.SIGTERM)


def test_the_key_never_reaches_the_log_or_the_store(fake: FakeOpenAIServer, tmp_path: Path) -> None:
    key = "moot-secret-key-5f1d7c2a9b3e4f60"
    db, log = tmp_path / "moot.sqlite", tmp_path / "serve.log"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["--port", str(port), "--db", str(db), "--models", "openai:fake", "--base-url", fake.base_url]
    proc = serve_process([*args, "--api-key-env", "MOOT_SERVER_KEY"], log, env={"MOOT_SERVER_KEY": key})
    try:
        auth = {"Authorization": f"Bearer {key}"}
        wait_until_up(url, proc, auth)
        assert httpx.get(url + "/v1/debates", headers={"Authorization": f"Bearer {key}x"}).status_code == 401
        assert httpx.get(url + "/v1/debates", params={"api_key": key}).status_code == 401
        client = openai.OpenAI(base_url=url + "/v1", api_key=key)
        reply = client.chat.completions.create(model="moot/single", messages=[{"role": "user", "content": "Hello?"}])
        assert reply.choices[0].message.content
        fake.faults.extend([Fault.delay(60), Fault.delay(60)])
        slow = httpx.post(url + "/v1/debates", json={"question": "Slow?"}, headers=auth).json()["id"]
        wait_for(lambda: len(fake.requests) >= 3, "the slow debate's calls")
        # a clean stop (uvicorn re-raises the signal once it has shut down): the running debate is
        # stored as interrupted
        assert kill(proc, signal.SIGTERM) in (0, -signal.SIGTERM)
    finally:
        kill(proc)
    text = log.read_text()
    assert "Application shutdown complete" in text and "Traceback" not in text and "Logging error" not in text
    assert "GET /v1/debates" in text and "POST /v1/chat/completions" in text  # the access log is there
    assert key not in text
    for path in tmp_path.glob("moot.sqlite*"):
        assert key.encode() not in path.read_bytes()
    store = SqliteStore(db)
    stored = store.get(slow)
    assert stored is not None and stored.status == "interrupted" and stored.result is not None
    store.close()
