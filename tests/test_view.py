"""``moot view``: the run viewer's API over an eval run (and its gzipped copy), a batch run and a
saved transcript, made here with a scripted model; its refusals; the command's own refusals and
its Ctrl-C. The pages in Chromium: tests/test_view_browser.py."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from moot.batch.runner import run_batch_sync
from moot.cli.main import app
from moot.eval.runner import run_eval
from moot.eval.store import RunConfig, RunStore
from moot.models.base import ChatRequest
from moot.models.scripted import ScriptedModel
from moot.server.http.connections import API_CSP
from moot.server.view.api import create_view_app
from moot.server.view.data import ItemFilter, RunView, ViewSourceError, filter_rows, pair_counts
from serving import free_port, wait_for
from test_first_hour import subprocess_env

#: Model text and questions are shown as text: markup in them must never run (the browser test checks).
PAYLOAD = "<img src=x onerror=\"document.body.dataset.pwned='yes'\"><script>document.body.dataset.pwned='yes'</script>"
ITEMS = [
    {
        "id": f"x{n + 1}",
        "question": f"Question {n + 1}: which letter is meant?" + (f" {PAYLOAD}" if n == 0 else ""),
        "choices": ["alpha", "beta", "gamma"],
        "answer": "ABC"[n % 3],
    }
    for n in range(6)
]
A, B = "single", "society-of-minds"


def solver(request: ChatRequest) -> dict[str, object]:
    """A first answer is wrong when (item + seed) % 6 == 0: the single agent (seed 1) and the first
    debater on x6, the other debaters (seeds 2 and 3) on x5 and x4, each debater corrected once it reads
    the others; on x2 every debater is talked out of the right answer in round 2 (herding)."""
    text = "\n".join(m.content for m in request.messages)
    n, item = next((n, it) for n, it in enumerate(ITEMS) if str(it["question"]) in text)
    gold = str(item["answer"])
    wrong = next(letter for letter in "ABC" if letter != gold)
    revising = "other agents" in request.messages[-1].content
    right = (n != 1) if revising else (n + (request.seed or 0)) % 6 != 0
    return {"reasoning": f"Thinking it over. {PAYLOAD}", "answer": gold if right else wrong, "confidence": 0.8}


#: What the rule above makes: the items each protocol gets wrong, and where a debater changed its answer.
WRONG = {A: {"x6"}, B: {"x2"}}
FLIPPED = {A: set[str](), B: {"x2", "x4", "x5", "x6"}}


def make_eval_run(folder: Path) -> Path:
    data = folder.parent / f"{folder.name}-items.jsonl"
    data.write_text("".join(json.dumps(item) + "\n" for item in ITEMS))
    config = RunConfig(dataset=str(data), protocols=[A, B], model="scripted")

    async def run() -> None:
        (await run_eval(config, folder, model=ScriptedModel(fn=solver))).close()

    asyncio.run(run())
    return folder


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_eval_run(tmp_path_factory.mktemp("view") / "run")


@pytest.fixture
def client(eval_run: Path) -> Iterator[TestClient]:
    with TestClient(create_view_app(RunView.open(eval_run)), base_url="http://127.0.0.1") as c:
        yield c


def ids(page: dict[str, Any]) -> set[str]:
    return {row["item"]["id"] for row in page["rows"]}


# ------------------------------------------------------------------------------ an eval run


def test_the_api_lists_an_eval_runs_items_with_each_protocols_row(client: TestClient) -> None:
    info = client.get("/v1/view/run").json()
    assert info["kind"] == "eval" and info["gold"] is True and info["protocols"] == [A, B] and info["items"] == 6
    stats = {s["protocol"]: s for s in info["stats"]}
    assert stats[A]["correct"] == 5 and stats[B]["correct"] == 5 and stats[A]["results"] == 6
    assert stats[B]["flipped"] == 4 and stats[A]["flipped"] == 0
    assert stats[A]["mean_calls"] == 1 and stats[B]["mean_calls"] == 6  # 3 agents x 2 rounds
    page = client.get("/v1/view/items").json()
    assert page["total"] == 6 and ids(page) == {f"x{n}" for n in range(1, 7)}
    first = next(r for r in page["rows"] if r["item"]["id"] == "x1")
    assert first["item"]["question"] == ITEMS[0]["question"]  # as stored, markup and all: the page escapes it
    row = next(r for r in page["rows"] if r["item"]["id"] == "x6")
    assert row["item"]["choices"] == ["alpha", "beta", "gamma"] and row["item"]["gold"] == "C"
    assert row["cells"][A]["correct"] is False and row["cells"][A]["answer"] == "A"
    assert row["cells"][B]["correct"] is True and row["cells"][B]["answer"] == "C" and row["cells"][B]["rounds"] == 2


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"protocol": A, "outcome": "wrong"}, WRONG[A]),
        ({"protocol": B, "outcome": "wrong"}, WRONG[B]),
        ({"outcome": "wrong"}, WRONG[A] | WRONG[B]),  # any protocol
        ({"protocol": A, "outcome": "correct"}, {f"x{n}" for n in range(1, 7)} - WRONG[A]),
        ({"outcome": "failed"}, set()),
        ({"flipped": "true"}, FLIPPED[B]),
        ({"flipped": "true", "protocol": A}, set()),
        ({"flipped": "true", "protocol": B, "outcome": "wrong"}, {"x2"}),  # right in round 1, herded to wrong
        ({"a": A, "b": B, "pair": "disagree"}, {"x2", "x6"}),
        ({"a": A, "b": B, "pair": "only_a"}, {"x2"}),
        ({"a": A, "b": B, "pair": "only_b"}, {"x6"}),
        ({"a": B, "b": A, "pair": "only_a"}, {"x6"}),
        ({"a": A, "b": B, "pair": "both_right"}, {"x1", "x3", "x4", "x5"}),
        ({"a": A, "b": B, "pair": "both_wrong"}, set()),
        ({"q": "QUESTION 3"}, {"x3"}),
        ({"q": "x4"}, {"x4"}),
    ],
)
def test_the_item_filters(client: TestClient, query: dict[str, str], expected: set[str]) -> None:
    response = client.get("/v1/view/items", params=query)
    assert response.status_code == 200, response.text
    assert ids(response.json()) == expected


def test_the_paired_counts_of_two_protocols_over_the_whole_run(client: TestClient) -> None:
    counts = client.get("/v1/view/pair", params={"a": A, "b": B}).json()
    assert counts == {
        "a": A, "b": B, "paired": 6, "both_right": 4, "only_a": 1, "only_b": 1, "both_wrong": 0, "disagree": 2,
        "p_value": 1.0,
    }  # fmt: skip
    swapped = client.get("/v1/view/pair", params={"a": B, "b": A}).json()
    assert (swapped["only_a"], swapped["only_b"]) == (1, 1) and swapped["both_right"] == 4


def test_an_item_carries_every_protocols_transcript(client: TestClient, eval_run: Path) -> None:
    detail = client.get("/v1/view/item", params={"id": "x2"}).json()
    assert detail["item"]["id"] == "x2" and set(detail["cells"]) == set(detail["transcripts"]) == {A, B}
    debate = detail["transcripts"][B]
    assert [len(r["turns"]) for r in debate["rounds"]] == [3, 3]
    rounds = debate["dynamics"]["rounds"]
    assert set(rounds[0]["answers"].values()) == {"B"} and set(rounds[1]["answers"].values()) == {"A"}
    assert detail["cells"][B]["flips"] == 3 and detail["cells"][B]["right_to_wrong"] == 3
    store = RunStore.open(eval_run)
    try:
        assert debate == json.loads(store.transcript(B, "x2").model_dump_json())  # type: ignore[union-attr]
    finally:
        store.close()


@pytest.mark.parametrize(
    ("path", "query", "status", "param", "says"),
    [
        ("/v1/view/items", {"protocol": "nope"}, 400, "protocol", "no protocol 'nope' in this run; one of: single"),
        ("/v1/view/items", {"outcome": "maybe"}, 400, "outcome", "'correct', 'wrong' or 'failed'"),
        ("/v1/view/items", {"colour": "red"}, 400, "colour", "colour: unknown field"),
        ("/v1/view/items", {"pair": "disagree", "a": A}, 400, "b", "b: pair needs the two protocols to compare"),
        # given twice: one of the two was used, with no word (a trial)
        ("/v1/view/items", {"protocol": [A, B]}, 400, "protocol", "protocol: given 2 times; give it once"),
        ("/v1/view/pair", {"a": [A, A], "b": B}, 400, "a", "a: given 2 times"),
        ("/v1/view/items", {"pair": "disagree", "a": A, "b": A}, 400, "b", "the same protocol as a"),
        ("/v1/view/items", {"flipped": "perhaps"}, 400, "flipped", "flipped:"),
        ("/v1/view/pair", {"a": A}, 400, "b", "b: required"),
        ("/v1/view/pair", {"a": A, "b": "nope"}, 400, "b", "no protocol 'nope'"),
        ("/v1/view/item", {"id": "nope"}, 404, "id", "no item 'nope' in this run"),
        # a field a route does not take: /items refused it, the others ignored it (an outside trial's)
        ("/v1/view/run", {"x": "1"}, 400, "x", "x: unknown query parameter; this route takes none"),
        ("/v1/view/pair", {"a": A, "b": B, "zz": "1"}, 400, "zz", "zz: unknown query parameter; this route takes a, b"),
        ("/v1/view/item", {"id": "q1", "zz": "1"}, 400, "zz", "this route takes id"),
        ("/v1/view/nothing", {}, 404, None, "no such path: GET /v1/view/nothing"),
    ],
)
def test_a_request_the_view_cannot_answer_gets_one_line_naming_the_field(
    client: TestClient, path: str, query: dict[str, Any], status: int, param: str | None, says: str
) -> None:
    response = client.get(path, params=query)
    assert response.status_code == status
    error = response.json()["error"]
    assert says in error["message"] and "\n" not in error["message"] and error["param"] == param
    assert "/docs" not in error["message"]  # the viewer has no OpenAPI pages to send anyone to


def test_the_viewer_reads_only_and_answers_only_loopback_names_with_moot_serves_headers(
    client: TestClient, eval_run: Path
) -> None:
    api = client.get("/v1/view/run")
    assert api.headers["content-security-policy"] == API_CSP.decode()
    page = client.get("/")
    assert page.status_code == 200 and "runs.js" in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert "unsafe-inline" not in page.headers["content-security-policy"]
    for response in (api, page, client.get("/item?id=x1")):
        assert response.headers["x-frame-options"] == "DENY" and response.headers["x-content-type-options"] == "nosniff"
    assert client.head("/").status_code == 200
    refused = client.post("/v1/view/run")
    assert refused.status_code == 405 and "only reads" in refused.json()["error"]["message"]
    # A page on another site whose name was rebound to 127.0.0.1 sends its own name: refused.
    assert client.get("/v1/view/run", headers={"host": "attacker.example"}).status_code == 400
    assert client.get("/v1/view/run", headers={"host": "localhost:8001"}).status_code == 200


def test_viewing_a_run_changes_nothing_in_its_folder(tmp_path: Path) -> None:
    run = make_eval_run(tmp_path / "run")
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in run.iterdir()}
    view = RunView.open(run)
    assert view.detail("x1").transcripts
    store = RunStore.open_read_only(run)
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        store.set_meta("config", {})
    store.close()
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in run.iterdir()} == before


def test_a_gzipped_run_is_read_from_a_temporary_copy_that_goes_away(
    eval_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept = tmp_path / "published"
    kept.mkdir()
    with (eval_run / "run.sqlite").open("rb") as src, gzip.open(kept / "run.sqlite.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # where run_file unpacks the copy
    for path in (kept, kept / "run.sqlite.gz"):
        view = RunView.open(path)
        # Read whole when opened: the copy is gone already, and the view holds no handle to any file.
        assert list(temp.iterdir()) == []
        assert view.info().items == 6 and pair_counts(view, A, B).only_b == 1
        assert view.detail("x6").transcripts[B].final_answer == "C"
        assert not any(isinstance(v, sqlite3.Connection | RunStore) for v in vars(view).values())
    assert [p.name for p in kept.iterdir()] == ["run.sqlite.gz"]


# -------------------------------------------------------------------- a batch run, a transcript


def test_a_batch_run_has_no_gold_so_only_its_answers_flips_and_failures_are_filtered(tmp_path: Path) -> None:
    lines = [{"id": str(item["id"]), "question": str(item["question"]), "reference": "A"} for item in ITEMS]
    out = tmp_path / "batch"
    rows = run_batch_sync(lines, out=out, protocol=B, model=ScriptedModel(fn=solver))
    assert len(rows) == 6
    view = RunView.open(out)
    info = view.info()
    assert info.kind == "batch" and info.gold is False and info.protocols == [B] and info.items == 6
    assert info.stats[0].correct is None and info.stats[0].flipped == 4
    assert {r.item.id for r in filter_rows(view, ItemFilter(flipped=True))} == FLIPPED[B]
    cell = view.by_id["x2"].cells[B]
    assert cell.correct is None and cell.answer == cell.final_answer and cell.outcome is None
    assert view.by_id["x2"].item.gold == "A"  # the line's reference
    with TestClient(create_view_app(view), base_url="http://127.0.0.1") as c:
        refused = c.get("/v1/view/items", params={"outcome": "wrong"})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "outcome"
        assert "batch has no gold answers" in refused.json()["error"]["message"]
        assert c.get("/v1/view/pair", params={"a": B, "b": B}).status_code == 400
        assert ids(c.get("/v1/view/items", params={"outcome": "failed"}).json()) == set()
        assert c.get("/v1/view/item", params={"id": "x4"}).json()["transcripts"][B]["rounds"]
    kept = tmp_path / "kept"  # a batch run kept gzipped opens as the folder does
    kept.mkdir()
    with (out / "run.sqlite").open("rb") as src, gzip.open(kept / "run.sqlite.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    gzipped = RunView.open(kept)
    assert gzipped.kind == "batch" and gzipped.rows == view.rows
    assert gzipped.detail("x4").transcripts == view.detail("x4").transcripts


def test_a_saved_transcript_is_one_item(eval_run: Path, tmp_path: Path) -> None:
    store = RunStore.open(eval_run)
    debate = store.transcript(B, "x2")
    store.close()
    assert debate is not None
    saved = tmp_path / "debate.json"
    saved.write_text(debate.to_json())
    view = RunView.open(saved)
    info = view.info()
    assert info.kind == "transcript" and info.protocols == [B] and info.items == 1 and not info.gold
    assert info.model == "scripted"  # the model every turn ran on (it was null)
    row = view.rows[0]
    assert row.item.question == debate.task.question and row.cells[B].flips == 3 and row.cells[B].calls == 6
    with TestClient(create_view_app(view), base_url="http://127.0.0.1") as c:
        detail = c.get("/v1/view/item", params={"id": row.item.id}).json()
    assert detail["transcripts"][B]["final_answer"] == debate.final_answer
    # A transcript that did not complete is failed, with why (a timeout, a cancel were shown "ok")
    for status, error in (("timeout", "timed out after 1 s"), ("interrupted", None), ("running", None)):
        cut = debate.model_copy(update={"status": status, "error": error})
        saved.write_text(cut.to_json())
        cell = RunView.open(saved).rows[0].cells[B]
        assert cell.status == "failed" and cell.error == (error or f"the debate ended {status}"), status


# ------------------------------------------------------------------------------- the command


def one_line_error(result: Any, says: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and says in lines[0], result.output
    assert "Traceback" not in result.output


def test_the_command_refuses_what_is_not_a_run_or_transcript_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "other.json").write_text('{"a": 1}')
    (tmp_path / "broken.json").write_text("{oops")
    with gzip.open(tmp_path / "text.gz", "wb") as f:
        f.write(b"not a database")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    sqlite3.connect(foreign / "run.sqlite").execute("CREATE TABLE t (x)").connection.close()
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    with sqlite3.connect(unknown / "run.sqlite") as conn:
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute("INSERT INTO meta VALUES ('config', ?)", (json.dumps({"kind": "absa"}),))
    conn.close()
    # an SQLite file not named run.sqlite, by what it is (each was "not a run's run.sqlite; give its run folder")
    served = tmp_path / "serve.sqlite"
    sqlite3.connect(served).execute("CREATE TABLE debates (id TEXT)").connection.close()
    renamed = tmp_path / "copy.sqlite"
    sqlite3.connect(renamed).executescript("CREATE TABLE items (x); CREATE TABLE results (x);").connection.close()
    truncated = tmp_path / "cut.sqlite"
    truncated.write_bytes(renamed.read_bytes()[:200])
    cases = {
        served: "is a moot serve store, not a run: its debates are shown by moot serve --db",
        renamed: "is a run's store under another name: give its folder, or name the file run.sqlite",
        truncated: "is not an SQLite file moot can read",
        tmp_path / "missing": "does not exist",
        tmp_path / "empty": "holds no moot run (no run.sqlite or run.sqlite.gz)",
        tmp_path / "notes.txt": "is neither a moot run nor a transcript",
        tmp_path / "other.json": "is not a moot transcript (protocol: Field required)",
        tmp_path / "broken.json": "is not valid JSON (line 1",
        tmp_path / "text.gz": "is not a moot run's store (file is not a database)",
        foreign: "is not a moot run's store (no such table: meta)",
        unknown: "holds a moot absa run, which moot view cannot show",
    }
    for path, says in cases.items():
        one_line_error(CliRunner().invoke(app, ["view", str(path)]), says)
    with pytest.raises(ViewSourceError):
        RunView.open(tmp_path / "missing")


def test_a_port_in_use_is_one_line(eval_run: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        one_line_error(CliRunner().invoke(app, ["view", str(eval_run), "--port", str(port)]), f"--port {port}")


def view_process(path: Path, port: int, *, ctrl_c_ignored: bool = False) -> subprocess.Popen[str]:
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ctrl_c_ignored else None
    return subprocess.Popen(
        [sys.executable, "-m", "moot", "view", str(path), "--port", str(port)],
        env=subprocess_env(),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=ignore,
    )


def is_up(url: str) -> bool:
    try:
        return httpx.get(url + "/v1/view/run", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


@pytest.mark.parametrize(
    ("sig", "ctrl_c_ignored"),
    [(signal.SIGINT, False), (signal.SIGTERM, False), (signal.SIGTERM, True)],
    ids=["ctrl-c", "sigterm", "sigterm-in-a-background-job"],
)
def test_the_command_prints_its_url_serves_and_stops_on_ctrl_c_with_130(
    eval_run: Path, sig: signal.Signals, ctrl_c_ignored: bool
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = view_process(eval_run, port, ctrl_c_ignored=ctrl_c_ignored)
    try:
        wait_for(lambda: is_up(url) or proc.poll() is not None, "moot view to serve")
        assert httpx.get(url + "/v1/view/pair", params={"a": A, "b": B}).json()["only_b"] == 1
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert out.strip() == f"moot view: {url}/ (eval run {eval_run}: 6 item(s), 2 protocol(s)); Ctrl-C stops it"
    assert err.strip().splitlines()[-1] == "moot view: stopped" and "Traceback" not in err
