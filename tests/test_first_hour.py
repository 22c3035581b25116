"""Issue 18, "the first hour with moot": one regression test (or a few) per numbered item, through the
command line where the defect was seen, on the scripted model or the bundled fake OpenAI server.
No API key, no embedded model.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner, Result

from moot.cli.main import app
from moot.core.types import ContextChunk, DebateTask, load_result
from moot.protocols import get_preset, preset_names
from moot.testing.fake_openai import FakeOpenAIServer, schema_reply

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent
#: Generous: only a hang trips it (the machine is shared and noisy).
HANG_S = 120


def moot(*args: str) -> Result:
    return runner.invoke(app, [str(a) for a in args])


def replies(path: Path, items: list[Any]) -> Path:
    path.write_text(json.dumps(items))
    return path


def jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def flat(text: str) -> str:
    """Output with rich's line wrapping undone."""
    return " ".join(text.split())


def one_line_error(result: Result, code: int, *needles: str) -> None:
    """Exit ``code``, a one-line ``error:`` that says each needle, no traceback."""
    assert result.exit_code == code, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.output
    for needle in needles:
        assert needle in errors[0], errors[0]
    assert "Traceback" not in result.output


@pytest.fixture
def fake() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(reply=schema_reply) as server:
        yield server


def openai_args(server: FakeOpenAIServer) -> list[str]:
    return ["-m", "openai:fake", "--base-url", server.base_url, "--api-key", "sk-test"]


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(ROOT / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("MOOT_MODEL", None)
    return env


def wait_for(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except (OSError, ValueError, sqlite3.Error):
            pass
        time.sleep(0.05)
    raise AssertionError(f"gave up waiting for {what}")


# ------------------------------------------------------------------ 1. free text is not a label set

PAINTERS = [
    {"question": "Who painted the Mona Lisa?", "answer": "Leonardo da Vinci"},
    {"question": "Who wrote Hamlet?", "answer": "Shakespeare"},
]
LABEL_REPLY = {"reasoning": "r", "answer": "yes", "confidence": 0.9}


def test_free_text_answers_are_refused_not_shown_to_the_model_as_labels(tmp_path: Path) -> None:
    data = jsonl(tmp_path / "painters.jsonl", PAINTERS)
    out = tmp_path / "run"
    script = replies(tmp_path / "r.json", [LABEL_REPLY] * 4)
    result = moot("eval", "-d", data, "-p", "single", "-m", f"scripted:{script}", "-o", out)
    one_line_error(result, 2, "free-text answers cannot be scored", '"labels": [', "--labels")
    assert not (out / "run.sqlite").exists()
    # numbers with one "yes" is not a label set either
    mixed = jsonl(
        tmp_path / "mixed.jsonl", [{"question": "2+2?", "answer": 4}, {"question": "Is 4 even?", "answer": "yes"}]
    )
    one_line_error(moot("eval", "-d", mixed, "-p", "single", "-m", f"scripted:{script}", "-o", out), 2, "--labels")


def test_a_known_label_set_offers_the_whole_set_and_declared_labels_are_used(tmp_path: Path) -> None:
    script = replies(tmp_path / "r.json", [LABEL_REPLY] * 4)
    yes_only = jsonl(tmp_path / "yes.jsonl", [{"question": "Is water wet?", "answer": "Yes"}])
    out = tmp_path / "yes"
    assert moot("eval", "-d", yes_only, "-p", "single", "-m", f"scripted:{script}", "-o", out).exit_code == 0
    prompt = _first_prompt(out)
    assert "Answer with one of: no, yes." in prompt  # the whole yes/no set, not the one gold answer
    declared = jsonl(tmp_path / "declared.jsonl", [{**p, "labels": ["leonardo da vinci", "shakespeare", "goethe"]}
                                                     for p in PAINTERS])  # fmt: skip
    reply = {"reasoning": "r", "answer": "shakespeare", "confidence": 0.9}
    script2 = replies(tmp_path / "r2.json", [reply] * 2)
    out2 = tmp_path / "declared"
    result = moot("eval", "-d", declared, "-p", "single", "-m", f"scripted:{script2}", "-o", out2)
    assert result.exit_code == 0, result.output
    assert "Answer with one of: leonardo da vinci, shakespeare, goethe." in _first_prompt(out2)
    option = jsonl(tmp_path / "option.jsonl", PAINTERS)
    out3 = tmp_path / "option"
    args = ["eval", "-d", option, "-p", "single", "-m", f"scripted:{script2}", "-o", out3]
    assert moot(*args, "--labels", "Leonardo da Vinci,Shakespeare").exit_code == 0
    one_line_error(
        moot(*args[:-2], "-o", tmp_path / "o4", "--labels", "Goethe,Schiller"), 2, "is not one of the labels"
    )


def _first_prompt(out: Path) -> str:
    with sqlite3.connect(out / "run.sqlite") as conn:
        transcript = json.loads(conn.execute("SELECT transcript FROM results LIMIT 1").fetchone()[0])
    return str(transcript["rounds"][0]["turns"][0]["messages"][-1]["content"])


# -------------------------------------------------------------------- 2. changed data, old results

SCIENCE = [
    {"id": "q1", "question": "Which is a planet?", "choices": ["Moon", "Mars", "Sun"], "answer": "B"},
    {"id": "q2", "question": "Which is a mammal?", "choices": ["Whale", "Shark", "Trout"], "answer": "A"},
    {"id": "q3", "question": "Which is a gas?", "choices": ["Iron", "Ice", "Neon"], "answer": "C"},
]
LETTER_REPLY = {"reasoning": "r", "answer": "B", "confidence": 0.9}


def test_a_changed_gold_answer_is_refused_naming_the_item(tmp_path: Path) -> None:
    data = jsonl(tmp_path / "science.jsonl", SCIENCE)
    script = replies(tmp_path / "r.json", [LETTER_REPLY] * 3)
    out = tmp_path / "run"
    args = ["eval", "-d", data, "-n", "2", "-p", "single", "-m", f"scripted:{script}", "-o", out]
    assert moot(*args).exit_code == 0
    held = {i["id"] for i in _stored_items(out)}
    edited = [{**row, "answer": "C"} if row["id"] in held and row["id"] != "q3" else row for row in SCIENCE]
    changed_id = next(r["id"] for r in SCIENCE if r["id"] in held and r["id"] != "q3")
    jsonl(data, edited)
    one_line_error(moot(*args), 2, f"item {changed_id} changed in the dataset", "answer: ")
    # restored, the same command resumes; a larger --n extends the run (nothing is redone)
    jsonl(data, SCIENCE)
    assert moot(*args).exit_code == 0
    extended = moot(*args[:4], "3", *args[5:])
    assert extended.exit_code == 0, extended.output
    assert len(_stored_items(out)) == 3


def _stored_items(out: Path) -> list[dict[str, Any]]:
    with sqlite3.connect(out / "run.sqlite") as conn:
        return [json.loads(r[0]) for r in conn.execute("SELECT json FROM items ORDER BY idx")]


def test_absa_eval_refuses_a_changed_annotation_too(tmp_path: Path, fake: FakeOpenAIServer) -> None:
    rows = [json.loads(line) for line in (ROOT / "src/moot/data/absa/absa-v1.jsonl").read_text().splitlines()[:2]]
    data = jsonl(tmp_path / "absa.jsonl", rows)
    config = ROOT / "examples" / "absa" / "abl_no_debate.yaml"
    out = tmp_path / "absa"
    args = ["absa", "eval", "--out", out, "--data", data, "--config", config, "-m", "openai:fake", "-j", "1"]
    env = {"OPENAI_BASE_URL": fake.base_url, "OPENAI_API_KEY": "sk-test"}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        assert moot(*args).exit_code == 0
        jsonl(data, [{**rows[0], "sentence_label": "negative"}, rows[1]])
        one_line_error(moot(*args), 2, f"sentence {rows[0]['id']} changed in the data", "sentence label")


# ------------------------------------------------------------------ 3. a protocol file's own budget


def _protocol_file(tmp_path: Path, name: str, **budget: Any) -> Path:
    shown = moot("protocols", "show", name)
    assert shown.exit_code == 0
    data = yaml.safe_load(shown.output)
    data["budget"] = {**data.get("budget", {}), **budget}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_protocol_files_budget_is_kept_unless_an_option_overrides_it(tmp_path: Path) -> None:
    with FakeOpenAIServer(reply=schema_reply, latency=5.0) as slow:
        path = _protocol_file(tmp_path, "single", timeout_s=1.5, max_tokens_per_turn=7)
        result = moot("debate", "Q?", "-p", path, *openai_args(slow), "-q")
        one_line_error(result, 1, "timeout of 1.5 s")
        assert slow.requests[-1]["max_tokens"] == 7
        # given on the command line, an option wins over the file
        result = moot("debate", "Q?", "-p", path, "--timeout", "60", "--max-tokens", "9", *openai_args(slow), "-q")
        assert result.exit_code == 0, result.output
        assert slow.requests[-1]["max_tokens"] == 9


@pytest.mark.parametrize("protocol", ["affirmative-critical", "mad", "chateval"])
@pytest.mark.parametrize("command", ["debate", "batch"])
def test_max_tokens_bounds_every_turn_the_decision_and_each_participants_own(
    tmp_path: Path, command: str, protocol: str
) -> None:
    # --max-tokens is "the token budget of each turn": a synthesis or a judge (800 by default) and a
    # participant's own budget are turns too.
    data = tmp_path / "q.txt"
    data.write_text("Is 7 prime?\n")
    args = ["debate", "Is 7 prime?", "-q"] if command == "debate" else ["batch", data, "-o", tmp_path / "run"]
    with FakeOpenAIServer(reply=schema_reply) as server:
        result = moot(*args, "-p", protocol, "--rounds", "1", "--max-tokens", "40", *openai_args(server))
        assert result.exit_code == 0, result.output
        assert server.requests and {r["max_tokens"] for r in server.requests} == {40}


@pytest.mark.parametrize("command", ["eval", "batch"])
def test_eval_and_batch_keep_a_protocol_files_budget_unless_an_option_overrides_it(
    tmp_path: Path, command: str
) -> None:
    path = _protocol_file(tmp_path, "single", max_tokens_per_turn=7, timeout_s=30)
    if command == "eval":
        data = jsonl(tmp_path / "science.jsonl", SCIENCE[:1])
        args = ["eval", "-d", data, "-p", path, "--no-report"]
    else:
        data = tmp_path / "q.txt"
        data.write_text("Which is a planet?\n")
        args = ["batch", data, "-p", path]
    with FakeOpenAIServer(reply=_letter_reply) as server:
        assert moot(*args, "-o", tmp_path / "file", *openai_args(server)).exit_code == 0
        assert {r["max_tokens"] for r in server.requests} == {7}
        server.requests.clear()
        given = moot(*args, "-o", tmp_path / "option", "--max-tokens", "9", *openai_args(server))
        assert given.exit_code == 0, given.output
        assert {r["max_tokens"] for r in server.requests} == {9}


def test_a_protocol_files_timeout_bounds_each_arbitration_debate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reports = ROOT / "examples" / "reports.json"
    path = tmp_path / "ac.yaml"
    path.write_text("preset: affirmative-critical\nwith: {rounds: 1}\nbudget: {timeout_s: 0.3}\n")
    with FakeOpenAIServer(reply=schema_reply, latency=1.0) as slow:
        monkeypatch.setenv("OPENAI_BASE_URL", slow.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        result = moot("arbitrate", reports, "-m", "openai:fake", "--protocol", path, "--json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    reasons = {o["flag_reason"] for o in data["verdicts"]}
    assert reasons == {"no verdict: the debate did not finish within its protocol's timeout of 0.3 s"}


# ------------------------------------------------------------------------ 4. calls spent for nothing


def test_rounds_that_nothing_reads_are_not_run(tmp_path: Path) -> None:
    answer = {"reasoning": "r", "answer": "42", "confidence": 0.9}
    script = replies(tmp_path / "r.json", [answer] * 5)  # exactly one round of 5 samples
    out = tmp_path / "vote.json"
    result = moot("debate", "What is 6 x 7?", "-p", "vote", "--rounds", "3", "-m", f"scripted:{script}", "--json", out)
    assert result.exit_code == 0, result.output
    assert "up to 1 round" in result.output and "so 1 round is run" in flat(result.output)
    saved = load_result(out)
    assert saved.llm_calls == 5 and len(saved.rounds) == 1 and saved.final_answer == "42"
    assert any("never read" in w for w in saved.warnings)
    # a debate whose agents read the previous round still runs every round
    som = replies(tmp_path / "som.json", [answer] * 6)
    assert load_result(_debate_json(tmp_path, "society-of-minds", som, "--rounds", "2")).llm_calls == 6


def _debate_json(tmp_path: Path, protocol: str, script: Path, *extra: str) -> Path:
    out = tmp_path / f"{protocol}.json"
    result = moot("debate", "Q?", "-p", protocol, "-m", f"scripted:{script}", "--json", out, "-q", *extra)
    assert result.exit_code == 0, result.output
    return out


# ----------------------------------------------------- 5. documented behaviour that is not there


def test_over_long_replies_are_trimmed_or_flagged_as_the_readme_says(tmp_path: Path) -> None:
    long = " ".join(["word"] * 60)
    free = replies(tmp_path / "free.json", [long] * 2)
    out = _debate_json(tmp_path, "affirmative-critical", free, "--rounds", "1", "--no-synthesis", "--max-tokens", "5")
    turns = load_result(out).turns()
    assert all(t.trimmed and t.raw == long and t.text != long for t in turns)
    typed = replies(tmp_path / "typed.json", [{"reasoning": long, "answer": "yes", "confidence": 0.5}])
    result = load_result(_debate_json(tmp_path, "single", typed, "--max-tokens", "5"))
    assert result.final_answer == "yes"  # a typed reply is never cut (it would not parse) ...
    assert any("over its budget of 5" in w for w in result.warnings)  # ... and it is said


def test_the_readme_run_file_sets_a_reference_only_where_it_counts(tmp_path: Path) -> None:
    from moot.protocols.loader import load_run_file

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", readme, re.S) if "question:" in b)
    path = tmp_path / "run.yaml"
    path.write_text(block)
    run = load_run_file(path)
    spec = run.spec()
    if run.reference is not None:
        from moot.structured import get_schema

        assert spec.turn.schema_name is not None and "answer" in get_schema(spec.turn.schema_name).model_fields


# --------------------------------------------------------------- 6. a rejected eval poisons nothing


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (["-d", "arc-challeng"], "unknown dataset 'arc-challeng'"),
        (["-n", "99"], "more items than the dataset has (3)"),
        (["--subject", "anatomy"], "--subject applies to mmlu and arithmetic"),
        (["-m", "gpt-4o"], "did you mean openai:gpt-4o?"),
        (["-m", "embeded"], "did you mean embedded?"),  # (it said openai:embeded)
        (["-m", "qwen2.5-1.5b"], "did you mean embedded:qwen2.5-1.5b?"),
        (["-p", "single,societyofminds"], "unknown protocol 'societyofminds'"),
        # a named dataset's answer kinds are known: --labels is refused, not ignored (item 1)
        (["-d", "boolq", "--labels", "yes,no"], "--labels applies to a JSONL file, not to boolq"),
        (["-d", "arc-challenge", "--labels", "A,B"], "--labels applies to a JSONL file, not to arc-challenge"),
    ],
)
def test_a_refused_eval_leaves_nothing_that_refuses_the_corrected_command(
    tmp_path: Path, bad: list[str], message: str
) -> None:
    data = jsonl(tmp_path / "science.jsonl", SCIENCE)
    script = replies(tmp_path / "r.json", [LETTER_REPLY] * 3)
    out = tmp_path / "run"
    good = {"-d": str(data), "-n": "3", "-p": "single", "-m": f"scripted:{script}"}
    wrong = good | dict(zip(bad[::2], bad[1::2], strict=True))
    result = moot("eval", *[x for kv in wrong.items() for x in kv], "-o", out)
    one_line_error(result, 2, message)
    assert "eta" not in result.output  # no stale progress line
    assert not (out / "run.sqlite").exists()
    fixed = moot("eval", *[x for kv in good.items() for x in kv], "-o", out)
    assert fixed.exit_code == 0, fixed.output


def test_empty_and_malformed_data_files_leave_no_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    script = f"scripted:{replies(tmp_path / 'r.json', [LETTER_REPLY])}"
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    one_line_error(moot("eval", "-d", empty, "-p", "single", "-m", script, "-o", out), 2, "has no items")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"question": "q", "answer": 1}\n{oops\n')
    one_line_error(moot("eval", "-d", broken, "-p", "single", "-m", script, "-o", out), 2, "broken.jsonl:2: not valid")
    assert not (out / "run.sqlite").exists()


def test_a_run_that_stopped_before_its_first_item_is_replaced_by_the_corrected_command(
    tmp_path: Path, fake: FakeOpenAIServer
) -> None:
    from moot.testing.fake_openai import Fault

    data = jsonl(tmp_path / "science.jsonl", SCIENCE)
    out = tmp_path / "run"
    fake.faults.append(Fault.http(401, "invalid api key"))
    args = ["eval", "-d", data, "-n", "2", "-p", "single", "-o", out, "-j", "1", "--base-url", fake.base_url,
            "--api-key", "sk-test"]  # fmt: skip
    one_line_error(moot(*args, "-m", "openai:gpt-typo"), 1, "rejected the API key (401)")
    assert (out / "run.sqlite").exists()  # the store was made, but holds no result
    fixed = moot(*args, "-m", "openai:fake")
    assert fixed.exit_code == 0, fixed.output
    assert "different config" not in fixed.output


def test_absa_eval_refusals_leave_nothing_behind(tmp_path: Path) -> None:
    out = tmp_path / "absa"
    one_line_error(moot("absa", "eval", "--out", out, "--n", "9999", "-m", "scripted:x.json"), 2, "--n 9999")
    assert not (out / "config.json").exists()
    one_line_error(moot("absa", "eval", "--out", out, "--n", "1", "-m", "gpt-4o"), 2, "did you mean openai:gpt-4o?")
    assert not (out / "config.json").exists()


# ------------------------------------------------------------- 7. one process per run folder


def test_a_second_command_on_a_busy_folder_is_refused_with_the_holders_pid(tmp_path: Path) -> None:
    data = jsonl(tmp_path / "science.jsonl", SCIENCE)
    out = tmp_path / "run"

    def args(server: FakeOpenAIServer) -> list[str]:
        return ["eval", "-d", str(data), "-p", "single", "-m", "openai:fake", "-o", str(out), "-j", "1",
                "--base-url", server.base_url, "--api-key", "sk-test", "--no-report"]  # fmt: skip

    with FakeOpenAIServer(reply=_letter_reply, latency=5) as slow:
        first = subprocess.Popen([sys.executable, "-m", "moot", *args(slow)], env=subprocess_env(),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            wait_for(lambda: (out / "run.lock").read_text().strip() == str(first.pid), "the first run's lock")
            second = moot(*args(slow))
            one_line_error(second, 2, f"in use by another moot command (pid {first.pid})")
        finally:
            first.kill()  # SIGKILL: the kernel drops the lock with the process
            first.wait(HANG_S)
    with FakeOpenAIServer(reply=_letter_reply) as fast:
        third = moot(*args(fast))
        assert third.exit_code == 0, third.output
    with sqlite3.connect(out / "run.sqlite") as conn:
        assert conn.execute("SELECT COUNT(*) FROM results").fetchone()[0] == 3


def _letter_reply(request: dict[str, Any]) -> str:
    return json.dumps(LETTER_REPLY) if request.get("response_format") else "B"


def test_the_lock_is_the_stores_so_every_store_user_inherits_it(tmp_path: Path) -> None:
    from moot.eval.store import RunConfig, RunLocked, RunStore

    config = RunConfig(dataset="x.jsonl", protocols=["single"], model="scripted")
    held = RunStore.open(tmp_path, config)
    with pytest.raises(RunLocked, match=f"pid {os.getpid()}"):
        RunStore.open(tmp_path, config)
    reader = RunStore.open(tmp_path)  # a report reads while a run writes
    reader.close()
    held.close()
    RunStore.open(tmp_path, config).close()


def test_absa_eval_takes_the_same_lock(tmp_path: Path) -> None:
    from moot.runlock import RunLock

    out = tmp_path / "absa"
    with RunLock.acquire(out):
        result = moot(
            "absa", "eval", "--out", out, "--n", "1", "-m", f"scripted:{replies(tmp_path / 'r.json', ['unused'])}"
        )
        one_line_error(result, 2, f"in use by another moot command (pid {os.getpid()})")
    assert not (out / "config.json").exists()


# --------------------------------------------------------------- 8. Ctrl-C leaves the truth on disk


def _interrupt_after(
    cmd: list[str],
    ready: Any,
    env: dict[str, str] | None = None,
    sig: signal.Signals = signal.SIGINT,
    ctrl_c_ignored: bool = False,
) -> subprocess.CompletedProcess[str]:
    # A background job of a shell script starts with SIGINT ignored (nohup moot eval ... &).
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ctrl_c_ignored else None
    proc = subprocess.Popen([sys.executable, "-m", "moot", *cmd], env=subprocess_env() | (env or {}), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=ignore)  # fmt: skip
    try:
        wait_for(ready, "the first finished work")
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_debate_writes_status_interrupted_with_its_finished_turns(
    tmp_path: Path, sig: signal.Signals
) -> None:
    out = tmp_path / "debate.json"

    def one_turn_done() -> bool:
        return bool(load_result(out).turns())

    with FakeOpenAIServer(reply=schema_reply, latency=1.5) as slow:
        cmd = ["debate", "Q?", "-m", "openai:fake", "--base-url", slow.base_url, "--api-key", "sk-test",
               "--json", str(out), "-q"]  # fmt: skip
        done = _interrupt_after(cmd, one_turn_done, sig=sig)
    assert done.returncode == 130
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "interrupted" in lines[0] and str(out) in lines[0]
    saved = load_result(out)
    assert saved.status == "interrupted" and saved.stop_reason == "interrupted"
    finished = [t for t in saved.turns() if t.ok]
    assert finished and all(t.text for t in finished)
    assert all("interrupted" in (t.error or "") for t in saved.turns() if not t.ok)


def test_an_interrupted_absa_eval_says_so_and_where_its_results_are(tmp_path: Path) -> None:
    out = tmp_path / "absa"

    def one_sentence_done() -> bool:
        return bool((out / "results.jsonl").read_text().strip())

    with FakeOpenAIServer(reply=schema_reply, latency=0.2) as slow:
        cmd = ["absa", "eval", "--out", str(out), "--n", "20", "-j", "1", "-m", "openai:fake"]
        env = {"OPENAI_BASE_URL": slow.base_url, "OPENAI_API_KEY": "sk-test"}
        done = _interrupt_after(cmd, one_sentence_done, env)
    assert done.returncode == 130
    assert "interrupted:" in done.stderr and str(out / "results.jsonl") in done.stderr and "of 20" in done.stderr


def _absa_rows(n: int) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (ROOT / "src/moot/data/absa/absa-v1.jsonl").read_text().splitlines()[:n]]


def _interrupted_at_the_first_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while the first sentence of this command is being asked (no timing: the call raises it)."""
    from moot.apps.absa.pipeline import AbsaPipeline

    async def ctrl_c(self: AbsaPipeline, sentence: str) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(AbsaPipeline, "run", ctrl_c)


def test_an_absa_eval_interrupted_before_any_sentence_finished_says_nothing_was_saved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It said "0 of 2 sentences are saved in .../results.jsonl", a file that did not exist."""
    out = tmp_path / "absa"
    data = jsonl(tmp_path / "absa.jsonl", _absa_rows(2))
    _interrupted_at_the_first_call(monkeypatch)
    result = moot("absa", "eval", "--out", out, "--data", data, "-m", f"scripted:{replies(tmp_path / 'r.json', ['x'])}")
    one_line_error(result, 130, "interrupted before any sentence finished: nothing was saved; re-run the same command")
    assert "results.jsonl" not in result.output and not (out / "results.jsonl").exists()


def test_an_interrupted_absa_eval_counts_the_sentences_a_resumed_run_already_saved(
    tmp_path: Path, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resumed run interrupted before its next sentence finished said "0 of 2 are saved" over a
    file holding one."""
    rows = _absa_rows(2)
    data = jsonl(tmp_path / "absa.jsonl", rows[:1])
    out = tmp_path / "absa"
    config = ROOT / "examples" / "absa" / "abl_no_debate.yaml"
    args = ["absa", "eval", "--out", out, "--data", data, "--config", config, "-m", "openai:fake", "-j", "1"]
    monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert moot(*args).exit_code == 0
    jsonl(data, rows)  # one more sentence: the same command resumes
    _interrupted_at_the_first_call(monkeypatch)
    one_line_error(moot(*args), 130, f"interrupted: 1 of 2 sentences are saved in {out / 'results.jsonl'}; re-run")


def test_absa_report_and_from_say_a_folder_that_does_not_exist_does_not(tmp_path: Path) -> None:
    """``moot absa report /nonexistent`` said it was "not a `moot absa eval` run (no config.json)"."""
    missing, afile = tmp_path / "nonexistent", replies(tmp_path / "r.json", ["x"])
    fix = "give the folder a `moot absa eval --out` wrote"
    one_line_error(moot("absa", "report", missing), 2, f"{missing} does not exist; {fix}")
    one_line_error(moot("absa", "report", afile), 2, f"{afile} is a file, not a run folder; {fix}")
    one_line_error(moot("absa", "report", tmp_path), 2, f"{tmp_path} is not a `moot absa eval` run (no config.json)")
    derived = moot("absa", "eval", "--from", missing, "--out", tmp_path / "d", "-m", f"scripted:{afile}")
    one_line_error(derived, 2, f"--from {missing} does not exist; {fix}")


def test_sigterm_stops_a_command_whose_ctrl_c_is_ignored_as_ctrl_c_would(tmp_path: Path) -> None:
    """A background job of a shell script (``nohup moot eval ... &``) starts with SIGINT ignored:
    passing SIGTERM on as SIGINT did nothing there, and asyncio installs no Ctrl-C handler."""
    with FakeOpenAIServer(reply=schema_reply, latency=1.5) as slow:
        cmd = ["debate", "Q?", "-m", "openai:fake", "--base-url", slow.base_url, "--api-key", "sk-test",
               "--json", str(tmp_path / "debate.json"), "-q"]  # fmt: skip
        proc = subprocess.Popen([sys.executable, "-m", "moot", *cmd], env=subprocess_env(), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))  # fmt: skip
        try:
            wait_for(
                lambda: (tmp_path / "debate.json").exists() and bool(load_result(tmp_path / "debate.json").turns()),
                "the first finished turn",
            )
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=HANG_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err and "never retrieved" not in err, err
    assert load_result(tmp_path / "debate.json").status == "interrupted"


@pytest.mark.parametrize(
    ("command", "sig"),
    [("eval", signal.SIGINT), ("batch", signal.SIGINT), ("eval", signal.SIGTERM), ("eval", "nohup-sigterm")],
    ids=["eval", "batch", "eval-sigterm", "eval-nohup-sigterm"],
)
def test_an_interrupted_eval_or_batch_says_where_its_finished_items_are(
    tmp_path: Path, command: str, sig: signal.Signals | str
) -> None:
    out = tmp_path / "run"

    def one_item_done() -> bool:
        with sqlite3.connect(out / "run.sqlite") as conn:
            return bool(conn.execute("SELECT COUNT(*) FROM results").fetchone()[0])

    # Twenty different questions: twenty copies of one would be served by the run's request cache
    # after the first, finishing the run before the interrupt arrives.
    data = jsonl(
        tmp_path / "science.jsonl",
        [{**SCIENCE[0], "id": f"q{i}", "question": f"{SCIENCE[0]['question']} (variant {i})"} for i in range(20)],
    )
    questions = tmp_path / "q.txt"
    questions.write_text("".join(f"Question {i}?\n" for i in range(20)))
    with FakeOpenAIServer(reply=_letter_reply, latency=0.3) as slow:
        given = ["eval", "-d", str(data)] if command == "eval" else ["batch", str(questions)]
        cmd = [*given, "-p", "single", "-o", str(out), "-j", "1", "-m", "openai:fake", "--base-url", slow.base_url,
               "--api-key", "sk-test"]  # fmt: skip
        nohup = sig == "nohup-sigterm"
        done = _interrupt_after(cmd, one_item_done, sig=signal.SIGTERM if nohup else signal.Signals(sig),
                                ctrl_c_ignored=nohup)  # fmt: skip
    assert done.returncode == 130
    assert f"interrupted: finished items are saved in {out / 'run.sqlite'}" in flat(done.stderr)
    assert "Traceback" not in done.stderr


def test_a_closed_output_pipe_leaves_no_traceback_and_no_running_file(tmp_path: Path) -> None:
    """``moot debate ... --json F | head``: the reader goes away. rich's answer was SystemExit from
    inside the renderer (a traceback mid-debate, F left saying ``running``); the run now finishes
    without its output."""
    answer = {"reasoning": "r", "answer": "42", "confidence": 0.9}
    script = replies(tmp_path / "r.json", [answer] * 5)
    out = tmp_path / "vote.json"
    read, write = os.pipe()
    os.close(read)  # closed before the first write: every write to stdout fails
    try:
        done = subprocess.run([sys.executable, "-m", "moot", "debate", "6 x 7?", "-p", "vote", "-m",
                               f"scripted:{script}", "--json", str(out)], stdout=write, stderr=subprocess.PIPE,
                              env=subprocess_env(), text=True, timeout=HANG_S)  # fmt: skip
    finally:
        os.close(write)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "the output was closed" in done.stderr
    saved = load_result(out)
    assert saved.status == "complete" and saved.final_answer == "42"


# ------------------------------------------------------------------------ 9. no silent long waits


def test_assembling_weights_says_what_it_does_and_how_far_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from moot.models import weights

    packages = tmp_path / "site"
    chunks = [os.urandom(300_000), os.urandom(200_000)]
    for i, chunk in enumerate(chunks, 1):
        data = packages / f"fakeweightpart{i}" / "data"
        data.mkdir(parents=True)
        (data.parent / "__init__.py").write_text("")
        (data / f"part{i:02d}.bin").write_bytes(chunk)
    monkeypatch.syspath_prepend(str(packages))
    monkeypatch.setenv("MOOT_CACHE_DIR", str(tmp_path / "cache"))
    info = weights.EmbeddedModelInfo(
        name="fake-2part", title="two parts of random bytes",
        packages=(("fakeweightpart1", "0"), ("fakeweightpart2", "0")),
        member="data/part{i:02d}.bin", sha256=hashlib.sha256(b"".join(chunks)).hexdigest(), size=500_000,
        license="none", source="this test", rank=0,
    )  # fmt: skip
    monkeypatch.setitem(weights.CATALOG, info.name, info)
    result = moot("debate", "Q?", "-p", "single", "-m", "embedded:fake-2part")
    # random bytes are not a model: llama.cpp refuses them, after the assembly said what it did
    assert result.exit_code == 1 and "llama.cpp could not load embedded:fake-2part" in result.output
    output = flat(result.output)
    assert "assembling embedded:fake-2part from 2 parts" in output
    assert "assembling embedded:fake-2part: 100% (0 of 0 MB)" in output  # progress, to the end
    assert "loading embedded:fake-2part into llama.cpp" in output
    again = moot("debate", "Q?", "-p", "single", "-m", "embedded:fake-2part")
    assert again.exit_code == 1 and "assembling" not in again.output  # assembled once, remembered


# ------------------------------------------------------------------------- 10. files not in UTF-8


def test_a_file_nested_past_what_moot_reads_is_a_one_line_error(tmp_path: Path) -> None:
    """A file whose lists nest thousands deep stopped the YAML and JSON parsers at Python's recursion
    limit, a traceback; one of 150 levels passed the parser and could stop what reads it after. Each
    reader now refuses past 100 levels, in one line naming the file, as it refuses invalid YAML or JSON."""
    script = replies(tmp_path / "r.json", ["a", "b", "c", "d", "e"])
    deep, nested = "[" * 3000 + "]" * 3000, '{"a": ' * 150 + "1" + "}" * 150

    def write(name: str, text: str) -> Path:
        (tmp_path / name).write_text(text)
        return tmp_path / name

    cases = [
        ["run", write("run.yaml", deep)],
        ["run", write("run.json", '{"question": "q?", "x": ' + nested + "}")],
        ["debate", "Q?", "-m", "scripted:" + str(write("s.json", deep))],
        ["debate", "Q?", "-m", f"scripted:{script}", "-p", write("p.yaml", deep)],
        ["debate", "Q?", "-m", f"scripted:{script}", "--prices", write("prices.json", '{"m": ' + deep + "}")],
        ["eval", "-d", write("d.jsonl", '{"question": "q", "x": ' + deep + "}\n"), "-m", f"scripted:{script}"],
        # (a new-user trial: these three still read with json.loads, a traceback and exit 1)
        ["debate", "Q?", "-m", f"scripted:{script}", "--context", write("c.json", "[" + deep + "]")],
        ["debate", "Q?", "-m", f"scripted:{script}", "--context", write("c.jsonl", deep + "\n")],
        ["arbitrate", write("reports.json", deep), "-m", f"scripted:{script}"],
        ["batch", write("b.jsonl", deep + "\n"), "-m", f"scripted:{script}", "-o", tmp_path / "batch"],
    ]
    for args in cases:
        one_line_error(moot(*args), 2, "nest deeper than 100 levels; flatten it")


def test_files_that_are_not_utf8_are_one_line_errors_and_a_bom_is_read(tmp_path: Path) -> None:
    script = replies(tmp_path / "r.json", ["a", "b", "c", "d", "e"])
    latin1 = tmp_path / "notes.txt"
    latin1.write_bytes("caf\xe9 au lait".encode("latin-1"))
    one_line_error(moot("debate", "Q?", "-m", f"scripted:{script}", "-c", latin1), 2, "is not UTF-8 text", "line 1")
    utf16 = tmp_path / "notes16.txt"
    utf16.write_text("hello", encoding="utf-16")
    one_line_error(moot("debate", "Q?", "-m", f"scripted:{script}", "-c", utf16), 2, "is UTF-16 text, not UTF-8")
    bom = tmp_path / "passages.json"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps(["a passage"]).encode())
    out = tmp_path / "o.json"
    assert moot("debate", "Q?", "-m", f"scripted:{script}", "-c", bom, "--json", out, "-q").exit_code == 0
    assert load_result(out).task.context[0].text == "a passage"
    bad_jsonl = tmp_path / "data.jsonl"
    bad_jsonl.write_bytes(b'{"question": "q", "answer": 1}\n{"question": "caf\xe9", "answer": 2}\n')
    result = moot("eval", "-d", bad_jsonl, "-p", "single", "-m", f"scripted:{script}", "-o", tmp_path / "run")
    one_line_error(result, 2, "line 2", "UTF-8")
    for args in (
        ["debate", "Q?", "-m", f"scripted:{script}", "-p", _latin1(tmp_path, "p.yaml", "name: caf\xe9\n")],
        ["run", _latin1(tmp_path, "run.yaml", "question: caf\xe9?\n")],
        ["debate", "Q?", "-m", "scripted:" + _latin1(tmp_path, "s.yaml", "- caf\xe9")],
        ["absa", "run", "A sentence.", "-c", _latin1(tmp_path, "absa.yaml", "name: caf\xe9\n")],
        ["absa", "eval", "--out", str(tmp_path / "a"), "--data", _latin1(tmp_path, "absa.jsonl", "{}\n\xe9")],
        # -d / --dataset, as eval and tune take it (--data stays an alias)
        ["absa", "eval", "--out", str(tmp_path / "a"), "-d", _latin1(tmp_path, "absa.jsonl", "{}\n\xe9")],
    ):
        one_line_error(moot(*args), 2, "is not UTF-8 text")
    reports = tmp_path / "reports.json"
    reports.write_bytes(b"\xef\xbb\xbf" + (ROOT / "examples" / "reports.json").read_bytes())
    assert moot("arbitrate", reports, "--detect-only").exit_code == 0


def _latin1(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_bytes(text.encode("latin-1"))
    return str(path)


# -------------------------------------------------------------- 11. a file where a folder is expected


def test_path_options_are_checked_before_any_work(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    data = jsonl(tmp_path / "science.jsonl", SCIENCE)
    script = replies(tmp_path / "r.json", ["a", "b", "c"])
    one_line_error(moot("eval", "-d", data, "-p", "single", "--out", afile), 2, "is a file; give a folder")
    one_line_error(moot("eval", "-d", data, "-p", "single", "--out", afile / "run"), 2, "is a file, not a folder")
    one_line_error(moot("absa", "eval", "--out", afile), 2, "is a file; give a folder")
    one_line_error(moot("debate", "Q?", "-m", f"scripted:{script}", "--json", tmp_path), 2, "is a folder")
    one_line_error(moot("absa", "run", "Nice.", "--json", afile / "x.json"), 2, "is a file, not a folder")
    one_line_error(moot("absa", "report", tmp_path, "--out", tmp_path), 2, "is a folder")
    one_line_error(moot("eval", "report", afile), 2, "is a file, not a run folder")
    assert afile.read_text() == ""


# ---------------------------------------------------------------------------- 12. exit codes


def test_every_input_error_exits_2_and_a_failed_run_1(tmp_path: Path) -> None:
    script = replies(tmp_path / "r.json", ["only one reply"])
    one_line_error(moot("debate", "Q?", "-m", "gpt-4o"), 2, "unknown model spec 'gpt-4o'", "openai:gpt-4o")
    one_line_error(moot("debate", "Q?", "-m", "openai:"), 2, "needs a model name")
    one_line_error(moot("debate", "Q?", "-m", f"scripted:{tmp_path / 'none.json'}"), 2, "does not exist")
    one_line_error(moot("debate", "Q?", "-m", f"scripted:{script}", "--max-calls", "2"), 2, "cannot fit one round")
    run_file = tmp_path / "run.yaml"
    run_file.write_text(f"protocol: moderated\nmodel: scripted:{script}\nmodels: {{moderater: x}}\nquestion: Q\n")
    one_line_error(
        moot("run", run_file), 2, f"{run_file}: models: unknown participant(s) or role(s): moderater",
        "moderated has participant ids proponent, opponent, moderator",
    )  # fmt: skip
    # a run that fails is 1
    one_line_error(moot("debate", "Q?", "-m", f"scripted:{script}"), 1, "no reply left")


# ----------------------------------------------------------- 13. the problem, not Python's words


def test_messages_name_the_problem(tmp_path: Path) -> None:
    script = replies(tmp_path / "r.json", ["a", "b", "c"])
    proto = tmp_path / "som.yaml"
    proto.write_text('preset: society-of-minds\nwith: {agents: "five"}\n')
    one_line_error(moot("debate", "Q?", "-m", f"scripted:{script}", "-p", proto), 2,
                   "parameter agents = 'five'", "valid integer")  # fmt: skip
    one_line_error(moot("debate", "Q?", "-m", f"scripted:{script}", "-c", tmp_path), 2, "is a folder, not a file")
    bad = tmp_path / "ctx.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": oops}\n')
    one_line_error(moot("debate", "Q?", "-m", f"scripted:{script}", "-c", bad), 2, "ctx.jsonl:2: not valid JSON")
    one_line_error(moot("debate", "   ", "-m", f"scripted:{script}"), 2, "the question is blank")
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    one_line_error(moot("debate", "Q?", "-m", f"scripted:{script}", "-c", empty), 2, "is empty")
    blank = tmp_path / "run.yaml"
    blank.write_text(f"question: '  '\nmodel: scripted:{script}\n")
    one_line_error(moot("run", blank), 2, "the question is blank")


def test_a_flagged_verdict_says_its_action_once(tmp_path: Path) -> None:
    reports = tmp_path / "reports.json"
    finding = {"metric": "rate", "unit": "%", "confidence": 0.9}
    reports.write_text(json.dumps([{"agent": "A", "findings": [{**finding, "value": 1.0}]},
                                   {"agent": "B", "findings": [{**finding, "value": 2.0}]}]))  # fmt: skip
    verdict = {"resolution": "agent1_correct", "explanation": "unclear", "confidence": 0.9,
               "action": "flag_for_review"}  # fmt: skip
    script = replies(tmp_path / "r.json", [verdict])
    result = moot("arbitrate", reports, "-m", f"scripted:{script}", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    notes = [f["arbitration"]["note"] for r in data["adjusted_reports"] for f in r["findings"]]
    assert notes == ["rate: flagged for review: the arbitrator could not decide"] * 2
    assert "flagged for review (the arbitrator could not decide)" in data["consensus_narrative"]


# --------------------------------------------------------------- 14. one input form for the API


def test_detection_takes_the_plain_dicts_arbitration_takes() -> None:
    from moot.apps.arbitration import AgentReport, ArbitrationConfig, apply_outcomes, arbitrate, detect_contradictions

    raw = json.loads((ROOT / "examples" / "reports.json").read_text(encoding="utf-8"))
    reports, config = raw["reports"], raw["config"]
    cfg = ArbitrationConfig(**config)
    found = detect_contradictions(reports, cfg)  # plain dicts, as docs/arbitration.md calls it
    assert found == detect_contradictions([AgentReport.model_validate(r) for r in reports], cfg)
    assert found == detect_contradictions(reports, config)  # a config's JSON form works too
    assert len(found) == 4
    result = asyncio.run(arbitrate([reports[0]], config))  # one report: nothing to arbitrate, no model
    assert result.status == "skipped"
    adjusted = apply_outcomes(reports, [], [])
    assert [r.agent for r in adjusted] == [r["agent"] for r in reports]


# --------------------------------------------------------------------------------- the smaller ones


def test_the_readme_imports_work_from_moot() -> None:
    import moot

    for name in ("TurnFormat", "register_schema", "MaxRounds", "Consensus", "StableAnswers", "ModeratorVerdict",
                 "TokenBudget", "CallBudget", "TimeoutStop", "Engine", "ProtocolSpec"):  # fmt: skip
        assert hasattr(moot, name), name


def test_docs_cite_only_what_the_repository_holds() -> None:
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text(encoding="utf-8")
        assert "shared/" not in text, f"{doc.name} cites a file outside the repository"
        for target in re.findall(r"\]\(([^)#:]+?)(?:#[^)]*)?\)", text):
            assert (doc.parent / target).exists(), f"{doc.name} links to {target}, which is not in the repository"


def test_the_fake_server_runs_as_a_process_and_serves_a_debate(tmp_path: Path) -> None:
    server = subprocess.Popen([sys.executable, "-m", "moot.testing.fake_openai", "--port", "0"], env=subprocess_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert server.stdout is not None
        first = server.stdout.readline()
        url = re.search(r"(http://127\.0\.0\.1:\d+/v1)", first)
        assert url is not None, first
        result = moot("debate", "Is the sky blue?", "-p", "moderated", "-m", "openai:fake", "--base-url", url.group(1),
                      "--api-key", "sk-fake", "-q")  # fmt: skip
        assert result.exit_code == 0, result.output
        assert result.output.strip() in {"SUPPORT", "OPPOSE", "UNCERTAIN"}
    finally:
        server.send_signal(signal.SIGINT)
        out, _ = server.communicate(timeout=HANG_S)
    assert server.returncode == 0 and "served" in out


def test_eval_output_is_not_cut_when_piped_and_failed_items_are_not_finished(
    tmp_path: Path, fake: FakeOpenAIServer
) -> None:
    from moot.testing.fake_openai import Fault

    data = jsonl(tmp_path / "science.jsonl", SCIENCE)
    for _ in range(3 * 4):  # every attempt of every item fails (5xx, retried, then given up)
        fake.faults.append(Fault.http(500, "the server fell over"))
    result = moot("eval", "-d", data, "-p", "single", "-o", tmp_path / "run", "-j", "1", *openai_args(fake))
    assert result.exit_code == 0, result.output
    for header in ("protocol", "accuracy", "completed", "calls/item", "tokens/item", "vs baseline"):
        assert header in result.output
    row = next(line for line in result.output.splitlines() if line.strip("│┃ ").startswith("single"))
    assert "0/3" in row and "3/3" not in row
    assert re.search(r"3/3 +3 failed", result.output), result.output  # the bar: no stray ", " before it


def test_a_long_question_is_not_echoed_whole(tmp_path: Path) -> None:
    script = replies(tmp_path / "r.json", ["a", "b", "c", "d", "e"])
    question = "why " * 12_500
    result = moot("debate", question, "-m", f"scripted:{script}")
    assert result.exit_code == 0, result.output
    assert "(50,000 characters)" in result.output and question.strip() not in result.output


# ------------------------------------- the same classes in the commands added since: batch, serve, judge


BATCH_REPLY = {"reasoning": "r", "answer": "yes", "confidence": 0.9}


def test_batch_input_errors_exit_2_before_the_run_folder_exists(tmp_path: Path) -> None:
    """Items 6, 10, 11, 12 and 13 in ``moot batch``: an unknown model spec, a missing scripted file,
    a file where a folder is expected, a file that is not UTF-8 or a folder given as the input, a
    blank question: one line, exit 2, and no run folder that would refuse the corrected command."""
    questions = tmp_path / "q.txt"
    questions.write_text("Is the sky blue?\n")
    script = replies(tmp_path / "r.json", [BATCH_REPLY])
    out = tmp_path / "run"
    afile = tmp_path / "afile"
    afile.write_text("")
    args = ["batch", questions, "-p", "single", "-o", out]
    one_line_error(moot(*args, "-m", "gpt-4o"), 2, "did you mean openai:gpt-4o?")
    one_line_error(moot(*args, "-m", f"scripted:{tmp_path / 'none.json'}"), 2, "does not exist")
    assert not out.exists()
    one_line_error(moot(*args[:-1], afile, "-m", f"scripted:{script}"), 2, "is a file; give a folder")
    one_line_error(moot(*args, "-m", f"scripted:{script}", "--export", afile / "r.csv"), 2, "is a file, not a folder")
    latin1 = _latin1(tmp_path, "l.txt", "caf\xe9?\n")
    one_line_error(moot("batch", latin1, "-m", f"scripted:{script}", "-o", out), 2, "is not UTF-8 text", "line 1")
    one_line_error(moot("batch", tmp_path, "-m", f"scripted:{script}", "-o", out), 2, "is a folder, not a file")
    blank = jsonl(tmp_path / "blank.jsonl", [{"question": "   "}])
    one_line_error(moot("batch", blank, "-m", f"scripted:{script}", "-o", out), 2, "line 1", "the question is blank")
    empty = jsonl(tmp_path / "empty.jsonl", [{"question": "Q?", "context": ["a passage", "  "]}])
    one_line_error(moot("batch", empty, "-m", f"scripted:{script}", "-o", out), 2, "line 1", "passage 2 is blank")
    assert not out.exists()
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps({"id": "b1", "question": "Is the sky blue?"}).encode() + b"\n")
    ran = moot("batch", bom, "-p", "single", "-m", f"scripted:{script}", "-o", out)
    assert ran.exit_code == 0 and "1 ok, 0 failed" in ran.output, ran.output
    # item 2 through the CLI: a changed input is refused on resume, naming it
    bom.write_text(json.dumps({"id": "b1", "question": "Is the sea blue?"}) + "\n")
    one_line_error(moot("batch", bom, "-p", "single", "-m", f"scripted:{script}", "-o", out), 2,
                   "input 1 (id 'b1') differs")  # fmt: skip


def test_batch_takes_the_run_folders_lock(tmp_path: Path) -> None:
    from moot.runlock import RunLock

    questions = tmp_path / "q.txt"
    questions.write_text("Is the sky blue?\n")
    out = tmp_path / "run"
    with RunLock.acquire(out):
        result = moot("batch", questions, "-m", f"scripted:{replies(tmp_path / 'r.json', ['unused'])}", "-o", out)
        one_line_error(result, 2, f"in use by another moot command (pid {os.getpid()})")


def test_eval_judge_exits_2_on_bad_input_and_one_judge_holds_a_run(tmp_path: Path) -> None:
    """Items 7 and 12 in ``moot eval judge``: a second judge on one run would pay for every
    judgement again; a judge may still score a run while the run goes on."""
    from moot.eval.quality import JUDGE_LOCK
    from moot.runlock import RunLock

    data = jsonl(tmp_path / "science.jsonl", SCIENCE)
    out = tmp_path / "run"
    script = replies(tmp_path / "r.json", [LETTER_REPLY] * 3)
    assert moot("eval", "-d", data, "-p", "single", "-m", f"scripted:{script}", "-o", out, "--no-report").exit_code == 0
    one_line_error(moot("eval", "judge", out, "--judge-model", "gpt-4o"), 2, "did you mean openai:gpt-4o?")
    verdict = {"rationale": "steps shown", "logical_consistency": 5, "reasoning_depth": 4}
    judge = f"scripted:{replies(tmp_path / 'j.json', [verdict] * 3)}"
    with RunLock.acquire(out, JUDGE_LOCK):
        one_line_error(moot("eval", "judge", out, "--judge-model", judge), 2,
                       f"in use by another moot command (pid {os.getpid()})")  # fmt: skip
    with RunLock.acquire(out):  # the run's own lock: a judge does not wait for the run
        result = moot("eval", "judge", out, "--judge-model", judge)
    assert result.exit_code == 0 and "judged 3 debate(s)" in result.output, result.output


def test_quality_and_price_files_read_as_every_input_file(tmp_path: Path) -> None:
    """Items 10, 12 and 13 in ``moot quality`` and ``--prices``."""
    script = replies(tmp_path / "r.json", ["a", "b", "c", "d", "e"])
    saved = tmp_path / "debate.json"
    assert moot("debate", "Q?", "-m", f"scripted:{script}", "--json", saved, "-q").exit_code == 0
    one_line_error(moot("quality", "score", tmp_path), 2, "is a folder, not a file")
    one_line_error(moot("quality", "score", saved, "--judge-model", "gpt-4o"), 2, "did you mean openai:gpt-4o?")
    one_line_error(moot("quality", "agreement", "--judge-model", "openai:"), 2, "needs a model name")
    labels = _latin1(tmp_path, "labels.yaml", "- id: caf\xe9\n")
    one_line_error(moot("quality", "agreement", "--labels", labels), 2, "is not UTF-8 text")
    data = jsonl(tmp_path / "science.jsonl", SCIENCE)
    out = tmp_path / "run"
    letters = replies(tmp_path / "l.json", [LETTER_REPLY] * 3)
    ran = moot("eval", "-d", data, "-p", "single", "-m", f"scripted:{letters}", "-o", out, "--no-report")
    assert ran.exit_code == 0, ran.output
    prices = tmp_path / "prices.json"
    prices.write_bytes(b"\xef\xbb\xbf" + json.dumps({f"scripted:{letters}": {"input": 1, "output": 2}}).encode())
    assert moot("eval", "report", out, "--prices", prices).exit_code == 0
    one_line_error(moot("eval", "report", out, "--prices", tmp_path), 2, "is a folder, not a file")


def test_serve_checks_its_database_path_and_one_server_holds_it(tmp_path: Path) -> None:
    """Items 7 and 11 in ``moot serve``: a second server on one database would mark the first's
    running debates interrupted; a --db under a file is one line, not a traceback at startup."""
    pytest.importorskip("uvicorn", reason="moot serve needs moot[serve]")
    from moot.runlock import RunLock

    script = f"scripted:{replies(tmp_path / 'r.json', ['a'])}"
    afile = tmp_path / "afile"
    afile.write_text("")
    one_line_error(moot("serve", "--db", afile / "m.sqlite", "--models", script), 2, "is a file, not a folder")
    one_line_error(moot("serve", "--db", tmp_path, "--models", script), 2, "is a folder")
    db = tmp_path / "m.sqlite"
    with RunLock.acquire(tmp_path, "m.sqlite.lock"):
        # a process, so that a server that is not refused fails the test (timeout) instead of serving on
        cmd = [sys.executable, "-m", "moot", "serve", "--db", str(db), "--models", script, "--port", "0"]
        second = subprocess.run(cmd, env=subprocess_env(), capture_output=True, text=True, timeout=HANG_S)
    assert second.returncode == 2, second.stderr
    assert f"in use by another moot command (pid {os.getpid()})" in second.stderr and "another --db" in second.stderr


# ------------------------------------------------------- a busy machine: llama.cpp's threads stall


def test_llama_cpp_gets_only_the_cpus_other_work_leaves_idle() -> None:
    """On 2 cores beside one CPU-heavy process, llama.cpp with 2 threads decoded 1.0 tok/s and with 1
    thread 7.8 (its threads wait for each other): ``make demo`` on a busy machine ran into its
    10-minute timeout. The default thread count now leaves out the CPUs other work keeps busy."""
    from moot.models.embedded import threads_for

    assert threads_for(2, 0.05) == 2  # an idle machine: every CPU
    assert threads_for(2, 0.6) == 1 and threads_for(2, 1.0) == 1 and threads_for(2, 3.5) == 1
    assert threads_for(8, 2.1) == 6
    assert threads_for(4, None) == 4  # not measurable (not Linux): every CPU, as before


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads Linux's /proc/stat")
def test_the_work_of_other_processes_is_measured_and_the_override_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    from moot.models.embedded import busy_elsewhere, default_threads

    cpus = os.sched_getaffinity(0)
    spin = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time() + 60\nwhile time.time() < t: pass"])
    try:
        os.sched_setaffinity(spin.pid, cpus)
        time.sleep(0.3)  # started and spinning
        busy = busy_elsewhere(cpus, window_s=0.5)
    finally:
        spin.kill()
        spin.wait()
    assert busy is not None and busy >= 0.5  # at least most of the spinning core
    # a CPU without its line in /proc/stat (a container that renumbers them): nothing is known
    assert busy_elsewhere({*cpus, 100_000}, window_s=0.01) is None
    monkeypatch.setenv("MOOT_EMBEDDED_THREADS", "3")
    assert default_threads() == (3, "MOOT_EMBEDDED_THREADS")


# ------------------------------------------------ issue 28, item 2: every model is checked up front


@pytest.fixture
def missing_small_model(monkeypatch: pytest.MonkeyPatch) -> str:
    """embedded:qwen2.5-0.5b reads as not installed (whatever this machine has), the others as installed."""
    from moot.models import weights

    monkeypatch.setattr(weights, "is_installed", lambda info: info.name != "qwen2.5-0.5b")
    return "embedded:qwen2.5-0.5b"


def test_a_participant_model_that_cannot_run_stops_every_front_door_before_any_call(
    tmp_path: Path, fake: FakeOpenAIServer, missing_small_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's run file with one agent on a model that is not installed printed the one
    working agent's answer with exit 0; now moot run, moot debate, moot batch and the Python API
    refuse it (exit 2, one line), and no model is called."""
    monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    needle = "embedded:qwen2.5-0.5b is not installed. Install its weights with: moot models install qwen2.5-0.5b"
    run = tmp_path / "run.yaml"
    run.write_text(
        "protocol: society-of-minds\nwith: {agents: 3, rounds: 2}\nmodel: openai:fake\n"
        f"models: {{agent3: {missing_small_model}}}\nquestion: What is 17 * 24?\nreference: '408'\n"
    )
    one_line_error(moot("run", run, "--quiet"), 2, needle)
    one_line_error(moot("debate", "What is 17 * 24?", "-m", missing_small_model, "-q"), 2, needle)
    # a protocol file's participant, a decision's model: the same
    spec = yaml.safe_load(moot("protocols", "show", "moderated").output)
    spec["participants"][0]["model"] = missing_small_model
    protocol = tmp_path / "moderated.yaml"
    protocol.write_text(yaml.safe_dump(spec))
    one_line_error(moot("debate", "Q?", "-p", protocol, "-m", "openai:fake", "-q"), 2, needle)
    spec = yaml.safe_load(moot("protocols", "show", "affirmative-critical").output)
    spec["decision"]["model"] = missing_small_model
    protocol.write_text(yaml.safe_dump(spec))
    one_line_error(moot("debate", "Q?", "-p", protocol, "-m", "openai:fake", "-q"), 2, needle)
    questions = tmp_path / "q.txt"
    questions.write_text("Q?\n")
    one_line_error(moot("batch", questions, "-p", protocol, "-m", "openai:fake", "-o", tmp_path / "b"), 2, needle)
    assert not (tmp_path / "b").exists()
    assert fake.requests == []

    import moot as api
    from moot.models.base import ModelSpecError

    with pytest.raises(ModelSpecError, match=re.escape(needle)):
        api.Engine(api.get_preset("society-of-minds"), "openai:fake", models={"agent2": missing_small_model})
    with pytest.raises(ModelSpecError, match=re.escape(needle)):
        asyncio.run(api.DebateEngine(model=missing_small_model).run_debate("Q?", timeout=None))
    with pytest.raises(ModelSpecError, match=re.escape(needle)):
        api.run_batch_sync(["Q?"], out=tmp_path / "api", protocol=str(protocol), model="openai:fake")
    assert fake.requests == [] and not (tmp_path / "api").exists()


# ------------------------------------- issue 28, item 1: one rule for a debate's budget, every door


def test_every_front_door_gives_the_default_debate_the_same_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """affirmative-critical carried a 10 s timeout that moot serve and moot batch applied (every
    default debate on the CPU model ended in timeout) and moot debate replaced by 120 s. Now no
    preset carries one, and debate, run, batch and serve all apply moot.core.budget's default (here
    shrunk to 0.3 s a call: 1.5 s for the default debate's 5 calls); an option still wins."""
    from moot.core import budget
    from moot.server.policy import build_spec
    from moot.server.schemas import DebateOptions
    from moot.server.settings import ServerSettings

    assert [n for n in preset_names() if get_preset(n).budget.timeout_s is not None] == []
    monkeypatch.setattr(budget, "TIMEOUT_PER_CALL_S", 0.3)
    expected = "did not finish within its timeout of 1.5 s"
    with FakeOpenAIServer(reply=schema_reply, latency=5.0) as slow:
        monkeypatch.setenv("OPENAI_BASE_URL", slow.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        one_line_error(moot("debate", "Q?", "-m", "openai:fake", "-q"), 1, expected)
        run = tmp_path / "run.yaml"
        run.write_text("model: openai:fake\nquestion: Q?\n")
        one_line_error(moot("run", run, "-q"), 1, expected)
        questions = tmp_path / "q.txt"
        questions.write_text("Q?\n")
        batch = moot("batch", questions, "-m", "openai:fake", "-o", tmp_path / "b", "--export", tmp_path / "b.jsonl")
        assert batch.exit_code == 0 and "0 ok, 1 failed" in batch.output, batch.output
        assert expected in json.loads((tmp_path / "b.jsonl").read_text())["error"]
        served = build_spec("affirmative-critical", DebateOptions(), ServerSettings(models=["openai:fake"]))
        assert served.budget.timeout_s == 1.5
        # what the caller gives wins, everywhere (the server within its own limit)
        asked = DebateOptions.model_validate({"budget": {"timeout_s": 30}})
        assert build_spec("affirmative-critical", asked, ServerSettings(models=["openai:fake"])).budget.timeout_s == 30
        from moot.cli.main import build_spec as cli_spec

        assert cli_spec("affirmative-critical", None, True, 30.0, None, None).budget.timeout_s == 30


def test_the_default_timeout_fits_the_documented_hardware() -> None:
    """120 s per planned call: 600 s for the default debate (a 2-core CPU with the 1.5B model took
    one to two minutes alone, and a busy one more), more for the protocols that make more calls."""
    from moot.core.budget import default_timeout_s

    assert default_timeout_s(get_preset("affirmative-critical")) == 600
    assert default_timeout_s(get_preset("moderated-extended")) > default_timeout_s(get_preset("single")) == 120


# --------------------------------- issue 28, item 13: inputs that no budget can hold, refused up front


def test_a_context_no_budget_can_hold_is_refused_by_every_front_door_before_any_call(
    tmp_path: Path, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 50 MB context file was accepted by moot debate and sent as 55 million prompt tokens. moot's
    limit for one prompt (shrunk here from 1,000,000 to 1,000 tokens) and each model's context window
    now refuse it in debate, run, batch and serve, with one line and no call."""
    from moot.core import budget
    from moot.server.policy import RequestError, prepare
    from moot.server.schemas import DebateOptions
    from moot.server.settings import ServerSettings

    monkeypatch.setattr(budget, "MAX_INPUT_TOKENS", 1000)
    monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    words = "word " * 3000
    big = tmp_path / "big.txt"
    big.write_text(words)
    needle = "more than 1,000 tokens"
    one_line_error(moot("debate", "Q?", "-c", big, "-m", "openai:fake", "-q"), 2, needle, "shorten the context")
    run = tmp_path / "run.yaml"
    run.write_text(yaml.safe_dump({"model": "openai:fake", "question": "Q?", "context": [words]}))
    one_line_error(moot("run", run, "-q"), 2, needle)
    lines = jsonl(
        tmp_path / "in.jsonl", [{"id": "small", "question": "Q?"}, {"id": "huge", "question": "Q?", "context": words}]
    )
    one_line_error(moot("batch", lines, "-m", "openai:fake", "-o", tmp_path / "b"), 2, "input 'huge'", needle)
    assert not (tmp_path / "b").exists()
    with pytest.raises(RequestError, match=needle) as refused:
        prepare(
            "affirmative-critical",
            "Q?",
            [ContextChunk(text=words)],
            DebateOptions(),
            ServerSettings(models=["openai:fake"]),
        )
    assert refused.value.param == "context" and refused.value.status == 400
    assert fake.requests == []
    # what fits goes through
    assert moot("debate", "Q?", "-c", _small(tmp_path), "-m", "openai:fake", "-q").exit_code == 0


def _small(tmp_path: Path) -> Path:
    path = tmp_path / "small.txt"
    path.write_text("a short passage")
    return path


def test_a_rounds_prompts_share_the_total_token_budget_self_checks_included() -> None:
    """A round's prompts are sent together before the budget is looked at again: each gets its share
    (a self-check resends its turn's prompt: cisc(k=3) sends 6), the decision the whole."""
    from moot.core.budget import input_problem

    spec = get_preset("cisc", k=3)
    spec = spec.model_copy(update={"budget": spec.budget.model_copy(update={"max_total_tokens": 6000})})
    assert input_problem(spec, DebateTask(question="word " * 800), {}, None) is None  # under 1,000 each
    problem = input_problem(spec, DebateTask(question="word " * 1800), {}, None)  # under 2,000: fitted 3 shares
    assert problem is not None and "budget.max_total_tokens of 6,000, shared by a round's 6 prompts" in problem


def test_a_models_context_window_bounds_what_a_turn_may_send() -> None:
    """With a model's window known (an embedded model's: 4,096 tokens a slot), the question and the
    passages the protocol reads must fit it after the turn's reply; passages it does not read do not count."""
    from moot.core.budget import input_problem
    from moot.models.scripted import ScriptedModel

    model = ScriptedModel(["x"])
    model.context_tokens = 600
    spec = get_preset("affirmative-critical")  # 500-token turns, reads the first 3 passages
    models = {p.id: model for p in spec.participants}
    long = ContextChunk(text="word " * 200)
    problem = input_problem(spec, DebateTask(question="Q?", context=[long]), models, model)
    assert problem is not None and "context window of 600 tokens less the 500-token reply" in problem
    short = [ContextChunk(text="w")] * 3
    assert input_problem(spec, DebateTask(question="Q?", context=[*short, long]), models, model) is None
