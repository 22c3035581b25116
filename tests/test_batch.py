"""``moot batch`` and ``moot.run_batch`` in this process, against the loopback fake OpenAI server.

(The same batches on a real local Ray cluster are in ``test_ray.py``.)
"""

from __future__ import annotations

import csv
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import moot
from moot.batch import BatchInputError, BatchItem, load_items
from moot.cli.main import app
from moot.eval.runner import Progress
from moot.eval.store import RunConfigMismatch, RunStore
from moot.models.base import BaseChatModel, ChatRequest, ChatResponse, TokenCallback, Usage
from moot.scale import LocalExecutor
from moot.scale.jobs import Job, R, Ran
from moot.testing.fake_openai import FakeOpenAIServer, Fault
from test_beat_the_vote import tokens_of

KEY = "sk-batch-test-0123456789abcdef"
ROOT = Path(__file__).parent.parent


def moderated_reply(request: dict[str, Any]) -> str:
    """Valid seed-004 turns: arguments, and a moderator sure after one round that a claim with
    'SUPPORTED' in it is right and any other is wrong."""
    schema = ((request.get("response_format") or {}).get("json_schema") or {}).get("name")
    text = " ".join(str(m.get("content", "")) for m in request.get("messages", []))
    if schema == "ModeratorEvaluation":
        pro = 0.9 if "SUPPORTED" in text else 0.2
        return json.dumps({"pro_score": pro, "con_score": 1.1 - pro, "confidence": 0.9})
    if schema == "Argument":
        return json.dumps({"content": "an argument", "confidence": 0.7})
    return "plain reply"


def questions_in(server: FakeOpenAIServer, marker: str) -> int:
    """How many requests the server got for the input whose question holds ``marker``."""
    return sum(1 for r in server.requests if any(marker in str(m.get("content", "")) for m in r["messages"]))


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(latency=0.01, reply=moderated_reply) as s:
        yield s


def write_inputs(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


CLAIMS = [
    {"id": "c1", "question": "Claim ONE is SUPPORTED by the data."},
    {"id": "c2", "question": "Claim TWO is doubtful.", "context": "a passage about claim two"},
    {"id": "c3", "question": "Claim THREE is SUPPORTED.", "context": [{"text": "p", "source": "s.md"}], "rounds": 1},
]


# ------------------------------------------------------------------------------------- inputs


def test_input_lines_are_read_with_ids_context_and_overrides(tmp_path: Path) -> None:
    path = write_inputs(tmp_path / "in.jsonl", [*CLAIMS, {"question": "no id here", "timeout": 30}])
    items = load_items(path)
    assert [i.id for i in items] == ["c1", "c2", "c3", "4"]
    assert items[1].context[0].text == "a passage about claim two"
    assert items[2].rounds == 1 and items[2].context[0].source == "s.md"
    assert items[3].timeout_s == 30
    text = tmp_path / "in.txt"
    text.write_text("first question?\n\n  second question?  \n")
    assert [(i.id, i.question) for i in load_items(text)] == [("1", "first question?"), ("3", "second question?")]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"question": "q", "questoin": "typo"}'], "line 1: unknown key 'questoin'; a line may have id, question"),
        # a misspelt required key is missing and unknown: the unknown key is what names the typo
        (['{"questoin": "typo"}'], "line 1: unknown key 'questoin'; a line may have id, question"),
        (
            ['{"question": "q", "context": [{"text": "t", "src": "s.md"}]}'],
            "line 1: unknown key 'src' in context.0; it may have text, source",
        ),
        (['{"question": "q", "context": {"text": "t", "page": 3}}'], "line 1: unknown key 'page' in context.0;"),
        (['{"id": "a"}'], "line 1: 'question' is required"),
        (['{"question": "q"}', "{not json"], "line 2 is not valid JSON"),
        (['{"id": "x", "question": "a"}', '{"id": "x", "question": "b"}'], "id 'x' is used twice (entries 1 and 2)"),
        (['{"question": "q", "rounds": 0}'], "line 1: rounds: Input should be greater than or equal to 1"),
        (["[1, 2]"], "line 1: expected an object with a 'question', got list"),
        ([""], "has no questions"),
    ],
)
def test_bad_input_names_the_line_and_the_problem(tmp_path: Path, lines: list[str], message: str) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(BatchInputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_items(path)


# ---------------------------------------------------------------------------------- Python API


async def test_run_batch_yields_each_result_as_it_finishes_and_stores_it_first(
    tmp_path: Path, server: FakeOpenAIServer
) -> None:
    out = tmp_path / "run"
    seen: list[Progress] = []
    results = []
    async for result in moot.run_batch(
        [BatchItem.model_validate(c) for c in CLAIMS],
        out=out,
        protocol="moderated",
        model="openai:fake",
        model_options={"base_url": server.base_url, "api_key": KEY},
        on_progress=lambda p: seen.append(Progress(**{**p.__dict__})),
    ):
        store = RunStore.open(out)  # already committed when yielded
        assert (("moderated", result.id) in store.done()) and result.transcript is not None
        store.close()
        results.append(result)
    by_id = {r.id: r for r in results}
    assert sorted(by_id) == ["c1", "c2", "c3"]
    assert by_id["c1"].decision == "SUPPORT" and by_id["c2"].decision == "OPPOSE"
    # the moderator is sure after round 1: proponent, opponent, moderator
    assert all(r.status == "ok" and r.calls == 3 and r.stop_reason for r in results)
    assert all(questions_in(server, c["question"]) == 3 for c in CLAIMS)
    assert seen[-1].done == 3 and seen[-1].tokens == sum(r.tokens for r in results) > 0


def test_run_batch_sync_resumes_and_extends_without_redoing_anything(tmp_path: Path, server: FakeOpenAIServer) -> None:
    out = tmp_path / "run"
    options = {"base_url": server.base_url, "api_key": KEY}
    first = moot.run_batch_sync(CLAIMS[:2], out=out, protocol="moderated", model="openai:fake", model_options=options)
    assert [r.resumed for r in first] == [False, False]
    calls = len(server.requests)
    again = moot.run_batch_sync(CLAIMS, out=out, protocol="moderated", model="openai:fake", model_options=options)
    assert sorted(r.id for r in again if r.resumed) == ["c1", "c2"]
    assert [r.id for r in again if not r.resumed] == ["c3"]
    assert len(server.requests) == calls + 3  # only the appended input ran
    assert {r.id: r.decision for r in again} == {"c1": "SUPPORT", "c2": "OPPOSE", "c3": "SUPPORT"}


def test_a_key_typed_into_an_input_is_stored_as_stars_and_the_batch_still_resumes(
    tmp_path: Path, server: FakeOpenAIServer
) -> None:
    """moot batch kept a key typed into a question, a passage or a reference in its store (and so in
    moot view and the export), where every transcript had it as ***; resuming still matches it."""
    out = tmp_path / "run"
    options = {"base_url": server.base_url, "api_key": KEY}
    typed = "sk-" + "q1w2e3r4" * 5
    rows = [{"id": "k", "question": f"Claim with {typed} SUPPORTED?", "context": [f"ctx {typed}"], "reference": typed}]
    moot.run_batch_sync(rows, out=out, protocol="moderated", model="openai:fake", model_options=options)
    calls = len(server.requests)
    again = moot.run_batch_sync(rows, out=out, protocol="moderated", model="openai:fake", model_options=options)
    assert [r.resumed for r in again] == [True] and len(server.requests) == calls
    db = (out / "run.sqlite").read_bytes()
    assert typed.encode() not in db and b"***" in db


def test_a_changed_config_or_changed_inputs_are_refused(tmp_path: Path, server: FakeOpenAIServer) -> None:
    out = tmp_path / "run"
    options = {"base_url": server.base_url, "api_key": KEY}
    moot.run_batch_sync(CLAIMS, out=out, protocol="moderated", model="openai:fake", model_options=options)
    with pytest.raises(RunConfigMismatch, match=r"different config \(max_tokens: None -> 50\)"):
        moot.run_batch_sync(
            CLAIMS, out=out, protocol="moderated", model="openai:fake", model_options=options, max_tokens=50
        )
    edited = [CLAIMS[0], {**CLAIMS[1], "question": "Claim TWO, edited."}, CLAIMS[2]]
    with pytest.raises(RunConfigMismatch, match=r"input 2 \(id 'c2'\) differs in this input \(its question\)"):
        moot.run_batch_sync(edited, out=out, protocol="moderated", model="openai:fake", model_options=options)
    with pytest.raises(RunConfigMismatch, match=r"input 3 \(id 'c3'\) is missing from this input"):
        moot.run_batch_sync(CLAIMS[:2], out=out, protocol="moderated", model="openai:fake", model_options=options)


def test_a_batch_in_an_eval_folder_and_back_is_refused_naming_both(tmp_path: Path, server: FakeOpenAIServer) -> None:
    """A batch pointed at an eval run's folder read its config as a batch's (whose ``kind`` has a
    default): "a different config (protocol: 'affirmative-critical' -> 'moderated')", of a run that
    never used affirmative-critical, or "invalid choices: Extra inputs are not permitted"."""
    from moot.eval.store import RunConfig

    folder = tmp_path / "run"
    RunStore.open(folder, RunConfig(dataset="science", protocols=["single"], model="openai:fake")).close()
    options = {"base_url": server.base_url, "api_key": KEY}
    for protocol in ("moderated", "affirmative-critical"):
        with pytest.raises(RunConfigMismatch) as refused:
            moot.run_batch_sync(CLAIMS, out=folder, protocol=protocol, model="openai:fake", model_options=options)
        assert str(refused.value) == (
            f"{folder} holds an evaluation run (made by `moot eval`), not a `moot batch` run: use another --out folder"
        )
    batch = tmp_path / "batch"
    moot.run_batch_sync(CLAIMS[:1], out=batch, protocol="moderated", model="openai:fake", model_options=options)
    with pytest.raises(RunConfigMismatch, match=r"holds a batch run \(made by `moot batch`\), not a `moot eval` run"):
        RunStore.open(batch, RunConfig(dataset="science", protocols=["single"], model="openai:fake"))
    assert server.requests and all("science" not in str(r) for r in server.requests)


def test_per_line_overrides_and_a_failed_item_are_recorded_not_replaced(tmp_path: Path) -> None:
    with FakeOpenAIServer() as server:
        inputs = [
            {"id": "short", "question": "QSHORT?", "rounds": 1},
            {"id": "long", "question": "QLONG?"},
        ]
        # a 401 is a configuration error: the run stops, naming it, and records nothing
        server.faults.append(Fault.http(401))
        with pytest.raises(moot.models.base.ModelConfigError, match="rejected the API key"):
            moot.run_batch_sync(
                ["Q401?"], out=tmp_path / "bad", model="openai:fake", concurrency=1,
                model_options={"base_url": server.base_url, "api_key": KEY},
            )  # fmt: skip
        bad = RunStore.open(tmp_path / "bad")
        assert bad.done() == set()
        bad.close()
        results = moot.run_batch_sync(
            inputs, out=tmp_path / "run", model="openai:fake", model_options={"base_url": server.base_url}, timeout_s=60
        )
        by_id = {r.id: r for r in results}
        # affirmative-critical: 2R+1 calls; the line's rounds=1 makes it 3
        assert by_id["short"].calls == 3 and by_id["long"].calls == 5
        assert questions_in(server, "QSHORT?") == 3
        # an input that runs out of its own time: recorded as failed with the reason and the partial
        # transcript, not retried or dropped
        server.faults.extend([Fault.delay(3.0), Fault.delay(3.0)])
        failed = moot.run_batch_sync(
            [{"id": "slow", "question": "QSLOW?", "timeout": 0.3}], out=tmp_path / "f", model="openai:fake",
            concurrency=1, model_options={"base_url": server.base_url},
        )  # fmt: skip
        assert failed[0].status == "failed" and "did not finish within its timeout of 0.3 s" in (failed[0].error or "")
        assert failed[0].transcript is not None and failed[0].transcript.status != "complete"


# ------------------------------------------------------------------------------------------ CLI


def test_cli_runs_exports_resumes_and_refuses(tmp_path: Path, server: FakeOpenAIServer) -> None:
    inputs = write_inputs(tmp_path / "claims.jsonl", CLAIMS)
    out = tmp_path / "run"
    base = ["batch", str(inputs), "-p", "moderated", "-m", "openai:fake", "--base-url", server.base_url,
            "--api-key", KEY, "--out", str(out)]  # fmt: skip
    first = CliRunner().invoke(app, [*base, "--export", str(tmp_path / "r.csv")])
    assert first.exit_code == 0, first.output
    assert "3 ok, 0 failed" in first.output and "wrote 3 rows" in first.output
    assert "local: 4 debate(s) at once, model openai:fake" in first.output
    rows = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert [r["id"] for r in rows] == ["c1", "c2", "c3"]
    assert [r["decision"] for r in rows] == ["SUPPORT", "OPPOSE", "SUPPORT"]
    assert {r["status"] for r in rows} == {"ok"} and all(int(r["calls"]) == 3 and int(r["tokens"]) > 0 for r in rows)
    assert set(rows[0]) == {"id", "status", "decision", "stop_reason", "calls", "tokens", "prompt_tokens",
                            "completion_tokens", "time_s", "cost_usd", "cost_vs_single", "cost_basis", "attempts",
                            "worker", "error"}  # fmt: skip
    # No price for the model: tokens only, said so; the ratio to one call is in tokens.
    assert "no money figure: 3 debates used a model without a price" in first.output
    assert all(r["cost_usd"] == "" and r["cost_basis"] == "tokens" and float(r["cost_vs_single"]) > 1 for r in rows)
    calls = len(server.requests)
    # the same command resumes (nothing left: no call) and exports JSONL, priced this time
    again = CliRunner().invoke(app, [*base, "--export", str(tmp_path / "r.jsonl"), "--price", "openai:fake=1,2"])
    assert again.exit_code == 0, again.output
    assert len(server.requests) == calls
    lines = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [line["id"] for line in lines] == ["c1", "c2", "c3"] and lines[0]["stop_reason"]
    for line in lines:  # USD per million tokens: 1 for input, 2 for output
        assert line["cost_usd"] == pytest.approx((line["prompt_tokens"] + 2 * line["completion_tokens"]) / 1e6)
        assert line["cost_basis"] == "usd" and line["cost_vs_single"] > 1
    total = sum(line["cost_usd"] for line in lines)
    assert f"${total:.4f}" in again.output
    # nothing secret was stored or exported
    for path in [out / "run.sqlite", tmp_path / "r.csv", tmp_path / "r.jsonl"]:
        assert KEY.encode() not in path.read_bytes()
    changed = CliRunner().invoke(app, [*base, "--rounds", "2"])
    assert changed.exit_code == 2 and "different config (rounds: None -> 2)" in changed.output
    assert "Traceback" not in changed.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.jsonl"], "input file 'missing.jsonl' does not exist"),
        (["{inputs}", "--export", "out.xlsx"], "name a .jsonl or a .csv file"),
        (["{inputs}", "-p", "no-such-protocol"], "no protocol preset named 'no-such-protocol'"),
        (["{inputs}", "--ray", "127.0.0.1:1"], "no Ray cluster answers at 127.0.0.1:1"),
        (["{inputs}", "--ray", "not-an-address"], "is not a cluster address: use local, auto, HOST:PORT"),
        # the export replaced the questions, and the re-run that resumes was then refused (a trial)
        (["{inputs}", "--export", "in.jsonl"], "--export 'in.jsonl' is the input file"),
        # each line of a JSON list was a debate: "[", '{"question": ...},', "]" (a trial)
        (["{json}"], "is a .json file; give the inputs one JSON object per line in a .jsonl file"),
    ],
)
def test_cli_bad_input_is_one_line(
    tmp_path: Path, args: list[str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if "--ray" in args:
        pytest.importorskip("ray", reason="the address checks need Ray (moot[ray])")
    monkeypatch.chdir(tmp_path)
    inputs = write_inputs(tmp_path / "in.jsonl", CLAIMS[:1])
    listed = tmp_path / "in.json"
    listed.write_text(json.dumps(CLAIMS[:1], indent=2))
    result = CliRunner().invoke(
        app,
        [
            "batch",
            *[a.replace("{inputs}", str(inputs)).replace("{json}", str(listed)) for a in args],
            "-m",
            "openai:fake",
            "--base-url",
            "http://127.0.0.1:9/v1",
        ],
    )
    assert result.exit_code in (1, 2), result.output
    assert message in result.output.replace("\n", " ") and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) <= 3


def test_ray_auto_honours_ray_address(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray", reason="the address check needs Ray (moot[ray])")
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    inputs = write_inputs(tmp_path / "in.jsonl", CLAIMS[:1])
    listed = tmp_path / "in.json"
    listed.write_text(json.dumps(CLAIMS[:1], indent=2))
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
        ],
    )
    assert result.exit_code == 1 and "no Ray cluster answers at 127.0.0.1:1" in result.output


def test_ray_without_ray_installed_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    inputs = write_inputs(tmp_path / "in.jsonl", CLAIMS[:1])
    for command in (
        ["batch", str(inputs), "-o", str(tmp_path / "run"), "--ray", "local"],
        ["eval", "--dataset", str(Path(__file__).parent / "fixtures" / "eval" / "science.jsonl"), "-p", "single",
         "-o", str(tmp_path / "eval"), "--ray", "local"],
    ):  # fmt: skip
        result = CliRunner().invoke(app, [*command, "-m", "openai:fake", "--base-url", "http://127.0.0.1:9/v1"])
        assert result.exit_code == 2, result.output
        assert "--ray needs Ray, which is not installed: pip install 'moot[ray]'" in result.output
        assert "0/1" not in result.output  # said before the run starts (its progress line came first)


# ------------------------------------------------------------------------- the shared executors


async def test_absa_eval_through_an_executor_writes_what_it_writes_in_process(tmp_path: Path) -> None:
    """``moot absa eval --ray`` sends each sentence as an AbsaJob: through an executor, the same
    lines and metrics come out as from the pipeline called directly."""
    from moot.apps.absa.evaluate import load_items as load_absa
    from moot.apps.absa.evaluate import run_eval
    from moot.apps.absa.pipeline import AbsaConfig, AbsaPipeline
    from moot.models.scripted import ScriptedModel
    from moot.scale import LocalExecutor
    from test_absa_pipeline import Script, _data

    items = load_absa(_data(tmp_path))
    config = AbsaConfig(name="full")
    direct = await run_eval(config, AbsaPipeline(config, ScriptedModel(fn=Script())), items, tmp_path / "direct")
    model = ScriptedModel(fn=Script())
    executor = LocalExecutor(model, capacity=2)
    via = await run_eval(config, AbsaPipeline(config, model), items, tmp_path / "via", executor=executor)
    assert via.metrics == direct.metrics and via.calls_per_sentence == direct.calls_per_sentence == 9.5
    assert len(model.requests) == 19


# ---------------------------------------------------------------------- issue 28: CSV injection


def test_the_csv_export_neutralises_every_formula_cell_and_keeps_numbers(tmp_path: Path) -> None:
    """OWASP CSV injection: a cell beginning with = + - @ tab or CR is written with a leading ',
    so a spreadsheet shows it as text; a plain number (-5) stays a number."""
    hostile = ['=HYPERLINK("http://x")', "+cmd|' /C calc'!A0", "-2+3", "@SUM(A1)", "\tlead", "-5", "plain"]
    with FakeOpenAIServer(reply=lambda request: "=1+1 is the answer") as server:
        inputs = write_inputs(tmp_path / "in.jsonl", [{"id": i, "question": f"Q {n}?"} for n, i in enumerate(hostile)])
        result = CliRunner().invoke(
            app,
            ["batch", str(inputs), "-m", "openai:fake", "--base-url", server.base_url, "--api-key", KEY,
             "--rounds", "1", "--out", str(tmp_path / "run"), "--export", str(tmp_path / "x.csv")],
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader((tmp_path / "x.csv").open(newline="")))
    assert [r["id"] for r in rows] == [
        "'=HYPERLINK(\"http://x\")", "'+cmd|' /C calc'!A0", "'-2+3", "'@SUM(A1)", "'\tlead", "-5", "plain"
    ]  # fmt: skip
    assert {r["decision"] for r in rows} == {"'=1+1 is the answer"}
    for row in rows:
        for cell in row.values():
            assert not cell.startswith(("=", "+", "@", "\t", "\r")), row
            assert not cell.startswith("-") or cell.lstrip("-").replace(".", "").isdigit(), row
    # the JSONL export is data, not a spreadsheet: its values are kept exactly
    again = CliRunner().invoke(
        app,
        ["batch", str(inputs), "-m", "openai:fake", "--base-url", "http://127.0.0.1:9/v1", "--api-key", KEY,
         "--rounds", "1", "--out", str(tmp_path / "run"), "--export", str(tmp_path / "x.jsonl")],
    )  # fmt: skip
    assert again.exit_code == 0, again.output
    assert [json.loads(line)["id"] for line in (tmp_path / "x.jsonl").read_text().splitlines()] == hostile


def test_every_csv_moot_writes_goes_through_the_one_safe_writer() -> None:
    """The class, not the example: no module but moot.files writes CSV itself."""
    src = Path(moot.__file__).parent
    writers = [
        str(path.relative_to(src))
        for path in src.rglob("*.py")
        if path.name != "files.py" and any(w in path.read_text(encoding="utf-8") for w in ("csv.writer", "DictWriter"))
    ]
    assert writers == []


def test_eval_commands_on_a_batch_run_folder_say_what_it_is_in_one_line(
    tmp_path: Path, server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 28: `moot eval report` on a `moot batch` run folder (the same store) ended in a pydantic
    traceback. A batch has no gold answers to score: report, export and judge say so and exit 2."""
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    moot.run_batch_sync(CLAIMS[:1], out=tmp_path / "run", protocol="moderated", model="openai:fake")
    calls = len(server.requests)
    for args in (["report"], ["export"], ["judge", "--judge-model", "openai:fake"]):
        result = CliRunner().invoke(app, ["eval", *args[:1], str(tmp_path / "run"), *args[1:]])
        assert result.exit_code == 2, result.output
        assert isinstance(result.exception, SystemExit), result.exception  # a one-line exit, not an error
        errors = [line for line in result.output.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "holds a moot batch run, not a moot eval run" in errors[0], result.output
        assert "--export FILE.csv" in errors[0]
    assert len(server.requests) == calls  # the judge called nothing


# ------------------------------------------------------------- issue 31: UAB's budget in a batch

#: Each input's first-sample probability (the whole reply's), by a marker in its question.
SURENESS = {"SURE": 0.99, "FAIR": 0.9, "SHAKY": 0.8, "UNSURE": 0.7}
UAB_INPUTS = [{"id": name.lower(), "question": f"Question {name}: A or B?"} for name in SURENESS]


class RatedModel(BaseChatModel):
    """Answers with the log-probability its question's marker names: A on odd seeds and B on even
    ones, except the SURE question (always A); a question holding ``fail_on`` gets a bad reply."""

    def __init__(self, fail_on: str | None = None) -> None:
        super().__init__("rated")
        self.requests: list[ChatRequest] = []
        self.fail_on = fail_on

    async def _complete_once(self, request: ChatRequest, on_token: TokenCallback | None) -> ChatResponse:
        self.requests.append(request)
        asked = next(m.content for m in request.messages if m.role == "user")
        if self.fail_on is not None and self.fail_on in asked:
            return ChatResponse(text="not JSON", usage=Usage(prompt_tokens=10, completion_tokens=2))
        prob = next(p for marker, p in SURENESS.items() if f"Question {marker}:" in asked)
        answer = "A" if prob == SURENESS["SURE"] or (request.seed or 0) % 2 else "B"
        text = json.dumps({"reasoning": "r", "answer": answer, "confidence": 0.5})
        lp = tokens_of(text, prob) if request.logprobs is not None else None
        return ChatResponse(text=text, usage=Usage(prompt_tokens=30, completion_tokens=20), logprobs=lp)


class RemoteExecutor(LocalExecutor):
    """As a Ray actor runs a job: the job crosses a process boundary as JSON, on another copy of the model."""

    async def run(self, job: Job[R]) -> Ran[R]:
        return await super().run(type(job).model_validate_json(job.model_dump_json()))


def uab_expected(probs: list[float], budget: int, cap: int) -> list[int]:
    """UAB by hand: p = exp(log(seq_prob) / 0.2); one each, then the rest one at a time to the
    largest p(1-p)^n (the first on a tie), at most ``cap``."""
    p = [math.exp(math.log(x) / 0.2) for x in probs]
    n = [1] * len(p)
    for _ in range(budget * len(p) - len(p)):
        open_ = [i for i in range(len(p)) if n[i] < cap]
        best = max(open_, key=lambda i: (p[i] * (1 - p[i]) ** n[i], -i))
        n[best] += 1
    return n


@pytest.mark.parametrize("remote", [False, True], ids=["here", "as-on-ray"])
def test_uab_moves_a_batchs_budget_to_the_inputs_their_first_sample_left_unsure(tmp_path: Path, remote: bool) -> None:
    """``vote@uab(budget=2, cap=4)``: one sample of every input first, its probability rating the
    input; 2 x 4 = 8 samples in all, moved as UAB moves them; each input a vote of its first n
    samples, sample 1 never drawn twice, also when jobs travel as JSON (Ray) and the driver keeps
    the cache. A second run resumes without a call."""
    model = RatedModel()
    executor = RemoteExecutor(model) if remote else None
    out = tmp_path / "run"
    protocol = "vote@uab(budget=2,cap=4)"
    options: dict[str, Any] = {"executor": executor} if remote else {}
    results = moot.run_batch_sync(UAB_INPUTS, out=out, protocol=protocol, model=model, **options)
    by_id = {r.id: r for r in results}
    expected = uab_expected(list(SURENESS.values()), budget=2, cap=4)
    assert [by_id[i["id"]].calls for i in UAB_INPUTS] == expected == [1, 2, 3, 2]
    assert len(model.requests) == sum(expected) == 8  # the first samples were not drawn again
    assert [r.seed for r in model.requests[:4]] == [1, 1, 1, 1]  # sample 1 of every input came first
    assert by_id["shaky"].decision == "A"  # seeds 1, 2, 3: A, B, A
    assert by_id["fair"].decision == "A"  # seeds 1 and 2: a tie, decided by the first given
    store = RunStore.open(out)
    assert store.get_meta("uab") == dict(zip([i["id"] for i in UAB_INPUTS], expected, strict=True))
    transcript = store.transcript(protocol, "shaky")
    assert transcript is not None
    assert [t.parsed["answer"] for t in transcript.rounds[0].turns if t.parsed] == list("ABA")
    # its sample 1 was its first sample, from the run's cache
    assert [t.cached_calls for t in transcript.rounds[0].turns] == [1, 0, 0]
    store.close()
    again = moot.run_batch_sync(UAB_INPUTS, out=out, protocol=protocol, model=model, **options)
    assert all(r.resumed for r in again) and len(model.requests) == 8
    # Appending inputs to a batch whose budget has moved would change the allocation: refused.
    more = [*UAB_INPUTS, {"id": "new", "question": "Question SURE: again?"}]
    with pytest.raises(RunConfigMismatch, match="budget was moved between its 4 inputs"):
        moot.run_batch_sync(more, out=out, protocol=protocol, model=model, **options)


def test_uab_records_an_input_whose_first_sample_failed_and_moves_the_rest(tmp_path: Path) -> None:
    model = RatedModel(fail_on="Question SHAKY:")
    results = moot.run_batch_sync(UAB_INPUTS, out=tmp_path / "run", protocol="vote@uab(budget=2,cap=4)", model=model)
    by_id = {r.id: r for r in results}
    assert by_id["shaky"].status == "failed" and "its first sample, which rates it, failed" in str(by_id["shaky"].error)
    rated = [p for marker, p in SURENESS.items() if marker != "SHAKY"]
    assert [by_id[i].calls for i in ("sure", "fair", "unsure")] == uab_expected(rated, budget=2, cap=4)
    assert len(results) == 4 and sum(r.status == "ok" for r in results) == 3


def test_uab_gives_an_input_no_more_samples_than_its_max_calls(tmp_path: Path) -> None:
    """A line's ``max_calls`` (or the run's) caps its share, and what it cannot take goes to the others."""
    model = RatedModel()
    inputs = [{**row, "max_calls": 1} if row["id"] == "shaky" else row for row in UAB_INPUTS]
    results = moot.run_batch_sync(inputs, out=tmp_path / "run", protocol="vote@uab(budget=2,cap=4)", model=model)
    by_id = {r.id: r for r in results}
    assert all(r.status == "ok" for r in results)
    assert [by_id[i["id"]].calls for i in UAB_INPUTS] == [1, 3, 1, 3]  # SHAKY's 3 went to FAIR and UNSURE
    assert sum(r.calls for r in results) == len(model.requests) == 8


def test_uab_is_refused_before_any_call_where_it_cannot_run(tmp_path: Path) -> None:
    from moot.core.spec import SpecError
    from moot.models.scripted import ScriptedModel
    from moot.protocols.loader import ProtocolFileError

    blind = ScriptedModel([{"reasoning": "r", "answer": "A", "confidence": 0.5}])  # no log-probabilities
    with pytest.raises(SpecError, match="first sample's probability"):
        moot.run_batch_sync(UAB_INPUTS, out=tmp_path / "a", protocol="vote@uab(budget=2)", model=blind)
    for bad, named in (
        ("vote@uab(budget=2,cap=1)", "at least the budget"),
        ("vote@uab(cap=4)", "give budget=B"),
        ("vote@uab(budgt=2)", "(it gives budgt)"),
        ("vote@uab(budget=2,temprature=1)", "no parameter temprature"),
        ("vote@uab(budget=2,k=3)", "not k="),
        ("vote@uab(budget=[)", "is not a value"),
    ):
        with pytest.raises(ProtocolFileError, match=named):
            moot.run_batch_sync(UAB_INPUTS, out=tmp_path / "b", protocol=bad, model=RatedModel())
    assert blind.requests == [] and not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    # One question has no batch to move a budget within: moot debate says where the rule runs.
    done = CliRunner().invoke(app, ["debate", "-p", "vote@uab(budget=2)", "-m", "scripted:x", "q"])
    assert done.exit_code == 2 and "use it with `moot batch` or `moot eval`" in done.output


def test_the_cli_runs_uab_shows_its_first_samples_and_exports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = RatedModel()
    monkeypatch.setattr("moot.batch.runner.resolve_model", lambda *_, **__: model)
    inputs = write_inputs(tmp_path / "in.jsonl", UAB_INPUTS)
    rows = tmp_path / "rows.csv"
    command = ["batch", str(inputs), "-p", "vote@uab(budget=2,cap=4)", "-m", "rated", "-o", str(tmp_path / "r")]
    done = CliRunner().invoke(app, [*command, "--export", str(rows)])
    assert done.exit_code == 0, done.output
    assert "(first samples)" in done.output and "4 ok, 0 failed" in done.output
    with rows.open(encoding="utf-8") as f:
        assert [int(r["calls"]) for r in csv.DictReader(f)] == [1, 2, 3, 2]
    assert len(model.requests) == 8


@pytest.mark.parametrize("command", ["batch", "eval"])
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ray", "not-an-address"], "is not a cluster address: use local, auto, HOST:PORT"),
        (["--workers", "3"], "--workers sets how Ray workers run: it needs --ray"),
        (["--worker-cpus", "2"], "--worker-cpus sets how Ray workers run: it needs --ray"),
    ],
)
def test_ray_options_are_checked_before_the_run_folder_exists(
    tmp_path: Path, command: str, args: list[str], message: str
) -> None:
    """A malformed --ray, or --workers without it, is bad input (exit 2), found before the folder is
    made: it was exit 1 with the run's store and lock already written, or silently ignored."""
    inputs = write_inputs(tmp_path / "in.jsonl", CLAIMS[:1])
    data = ["-d", str(ROOT / "tests" / "fixtures" / "science.jsonl")] if command == "eval" else [str(inputs)]
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [command, *data, "-m", "openai:fake", "--out", str(out), *args])
    assert result.exit_code == 2 and message in result.output.replace("\n", " "), result.output
    assert not out.exists()


def test_a_call_budget_no_debate_can_fit_is_refused_before_the_run(tmp_path: Path) -> None:
    """moot debate and moot serve refused it; moot batch ran every input into "no participant gave a
    typed answer to vote on" with 0 calls, and exit 0."""
    inputs = tmp_path / "in.jsonl"
    inputs.write_text('{"question": "a"}\n{"question": "b", "max_calls": 1}\n', encoding="utf-8")
    out = tmp_path / "run"
    base = [
        "batch",
        str(inputs),
        "-p",
        "vote@3",
        "-m",
        "openai:fake",
        "--base-url",
        "http://127.0.0.1:9/v1",
        "-o",
        str(out),
    ]
    run_wide = CliRunner().invoke(app, [*base, "--max-calls", "2"])
    assert run_wide.exit_code == 2 and "--max-calls 2: the call budget of 2 calls cannot fit one round (3 calls)" in (
        " ".join(run_wide.output.split())
    )
    one_line = CliRunner().invoke(app, base)
    assert one_line.exit_code == 2 and "input '2': the call budget of 1 call cannot fit" in " ".join(
        one_line.output.split()
    )
    assert not out.exists()


async def test_an_integrators_mistakes_with_run_batch_are_one_line(tmp_path: Path, server: FakeOpenAIServer) -> None:
    """A dict for a model was an AttributeError ('dict' object has no attribute 'name'), a spec made
    in Python a pydantic error on BatchConfig, and run_batch_sync inside a running event loop
    asyncio's own RuntimeError with a coroutine never awaited."""
    from moot.models.base import ModelConfigError
    from moot.protocols import get_preset

    with pytest.raises(ModelConfigError, match="a dict is not a model: give a spec string"):
        [r async for r in moot.run_batch(CLAIMS, out=tmp_path / "a", model={"spec": "openai:fake"})]  # type: ignore[arg-type]
    with pytest.raises(BatchInputError, match=r"protocol: a ProtocolSpec is not a protocol's name: .*dump_protocol"):
        [r async for r in moot.run_batch(CLAIMS, out=tmp_path / "b", protocol=get_preset("moderated"))]  # type: ignore[arg-type]
    # a protocol file's path as a Path is a path, as its text is
    protocol_file = tmp_path / "p.yaml"
    protocol_file.write_text("preset: moderated\n")
    options = {"base_url": server.base_url, "api_key": KEY}
    batch = moot.run_batch(
        CLAIMS[:1], out=tmp_path / "p", protocol=protocol_file, model="openai:fake", model_options=options
    )
    assert [r.id for r in [r async for r in batch]] == ["c1"]
    with pytest.raises(RuntimeError, match=r"run_batch_sync runs its own event loop, .*moot.run_batch"):
        moot.run_batch_sync(CLAIMS, out=tmp_path / "c", model="scripted:none.yaml")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists() and not (tmp_path / "c").exists()


def test_a_batch_whose_workers_cannot_start_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: FakeOpenAIServer
) -> None:
    """With Ray missing or its cluster out of reach, the batch was refused but left run.sqlite and
    run.lock behind (docs/scale-out.md: refused before any work). A run it did not make is kept."""
    import contextlib

    import moot.batch.runner as runner_module
    from moot.scale.ray_backend import RayUnavailable

    @contextlib.asynccontextmanager
    async def no_cluster(*args: Any, **kwargs: Any) -> Any:
        raise RayUnavailable("no Ray cluster at 127.0.0.1:1 (test)")
        yield  # pragma: no cover

    options = {"base_url": server.base_url, "api_key": KEY}
    kept = tmp_path / "kept"
    moot.run_batch_sync(CLAIMS[:1], out=kept, protocol="moderated", model="openai:fake", model_options=options)
    monkeypatch.setattr(runner_module, "open_executor", no_cluster)
    for out in (tmp_path / "new", tmp_path / "existing"):
        if out.name == "existing":
            out.mkdir()
            (out / "notes.txt").write_text("mine")
        with pytest.raises(RayUnavailable):
            moot.run_batch_sync(CLAIMS, out=out, protocol="moderated", model="openai:fake", model_options=options)
    assert not (tmp_path / "new").exists()
    assert sorted(p.name for p in (tmp_path / "existing").iterdir()) == ["notes.txt"]
    with pytest.raises(RayUnavailable):  # a run it did not make (one input done) stays as it was
        moot.run_batch_sync(CLAIMS, out=kept, protocol="moderated", model="openai:fake", model_options=options)
    assert (kept / "run.sqlite").is_file()


def test_an_ndjson_file_is_read_as_jsonl(tmp_path: Path) -> None:
    """A .ndjson input's lines were read as plain questions (each one a JSON object's text)."""
    items = load_items(write_inputs(tmp_path / "in.ndjson", CLAIMS[:2]))
    assert [(i.id, i.question) for i in items] == [(c["id"], c["question"]) for c in CLAIMS[:2]]
