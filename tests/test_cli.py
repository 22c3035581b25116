"""The ``moot`` CLI, driven through typer's runner with the scripted model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from moot.cli.main import app
from moot.core.types import load_result

runner = CliRunner()


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "replies.json"
    path.write_text(json.dumps(["Aff round 1", "Crit round 1", "Aff round 2", "Crit round 2", "Final synthesis"]))
    return path


@pytest.mark.req("S000-CALLS")
def test_debate_runs_and_writes_the_result(script: Path, tmp_path: Path) -> None:
    out = tmp_path / "out" / "result.json"
    ctx = tmp_path / "ctx.txt"
    ctx.write_text("RAG retrieves passages.")
    result = runner.invoke(
        app, ["debate", "What is RAG?", "-m", f"scripted:{script}", "-c", str(ctx), "--json", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "Final synthesis" in result.output and "model calls" in result.output
    saved = load_result(out)
    assert saved.status == "complete" and saved.llm_calls == 5 and saved.final_answer == "Final synthesis"
    assert saved.task.context[0].source == "ctx.txt"


def test_quiet_prints_only_the_answer(script: Path) -> None:
    result = runner.invoke(app, ["debate", "Q?", "-m", f"scripted:{script}", "--quiet"])
    assert result.exit_code == 0
    assert result.output.strip() == "Final synthesis"


def test_rounds_and_no_synthesis(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("- a\n- b\n")
    out = tmp_path / "r.json"
    result = runner.invoke(
        app, ["debate", "Q?", "-m", f"scripted:{path}", "--rounds", "1", "--no-synthesis", "--json", str(out), "-q"]
    )
    assert result.exit_code == 0, result.output
    assert load_result(out).llm_calls == 2


def test_model_errors_are_one_line_and_nonzero(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    # A model spec that cannot be used is bad input (exit 2), found before any call.
    result = runner.invoke(app, ["debate", "Q?", "-m", "openai:gpt-x"])
    assert result.exit_code == 2
    assert "error: no API key for openai:gpt-x" in result.output
    assert "Traceback" not in result.output
    result = runner.invoke(app, ["debate", "Q?", "-m", "nonsense:thing"])
    assert result.exit_code == 2 and "unknown model spec 'nonsense:thing'" in result.output
    result = runner.invoke(app, ["debate", "Q?", "-m", "embedded:gpt-5"])
    assert result.exit_code == 2 and "unknown embedded model 'gpt-5'" in result.output
    result = runner.invoke(app, ["debate", "Q?", "-m", f"scripted:{tmp_path / 'r.json'}", "--base-url", "http://x"])
    assert result.exit_code == 2 and "only apply to openai: models" in result.output


def test_bad_context_files_are_usage_errors(tmp_path: Path, script: Path) -> None:
    missing = runner.invoke(app, ["debate", "Q?", "-m", f"scripted:{script}", "-c", str(tmp_path / "none.txt")])
    assert missing.exit_code == 2 and "does not exist" in missing.output
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    result = runner.invoke(app, ["debate", "Q?", "-m", f"scripted:{script}", "-c", str(bad)])
    assert result.exit_code == 2 and "not valid JSON" in result.output
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps([{"txt": "typo"}]))
    result = runner.invoke(app, ["debate", "Q?", "-m", f"scripted:{script}", "-c", str(wrong)])
    assert result.exit_code == 2 and "'text' string" in result.output
    # issue 28: an unknown key of a passage is refused by name (it was kept, and the source lost)
    for name, body in (
        ("src.json", json.dumps([{"text": "t", "src": "notes.md"}])),
        ("src.jsonl", '{"text": "t", "src": "x"}\n'),
    ):
        typo = tmp_path / name
        typo.write_text(body)
        result = runner.invoke(app, ["debate", "Q?", "-m", f"scripted:{script}", "-c", str(typo)])
        assert result.exit_code == 2, result.output
        assert "unknown key 'src'; a passage may have text, source" in " ".join(result.output.split())


def test_context_formats(tmp_path: Path, script: Path) -> None:
    jl = tmp_path / "c.jsonl"
    jl.write_text('{"text": "one"}\n"two"\n')
    js = tmp_path / "c.json"
    js.write_text(json.dumps(["three"]))
    out = tmp_path / "o.json"
    result = runner.invoke(
        app, ["debate", "Q?", "-m", f"scripted:{script}", "-c", str(jl), "-c", str(js), "--json", str(out), "-q"]
    )
    assert result.exit_code == 0, result.output
    assert [c.text for c in load_result(out).task.context] == ["one", "two", "three"]
    assert [c.source for c in load_result(out).task.context] == ["c.jsonl", "c.jsonl", "c.json"]


@pytest.mark.req("S000-LOGS")
def test_failed_debate_exits_nonzero_and_keeps_the_transcript(tmp_path: Path) -> None:
    path = tmp_path / "short.json"
    path.write_text(json.dumps(["only one reply"]))
    out = tmp_path / "o.json"
    result = runner.invoke(app, ["debate", "Q?", "-m", f"scripted:{path}", "--json", str(out)])
    assert result.exit_code == 1
    assert "no reply left" in result.output
    saved = load_result(out)
    assert saved.status == "failed" and saved.turns()[0].text == "only one reply"


def test_models_lists_the_catalog() -> None:
    result = runner.invoke(app, ["models"])
    assert result.exit_code == 0
    for name in ("smollm2-135m", "qwen2.5-0.5b", "qwen2.5-1.5b"):
        assert name in result.output
    assert "MOOT_MODEL" in result.output


def test_models_install_rejects_unknown_names() -> None:
    result = runner.invoke(app, ["models", "install", "llama-70b"])
    assert result.exit_code == 2 and "unknown embedded model 'llama-70b'" in result.output


def test_version() -> None:
    result = runner.invoke(app, ["version"])
    assert result.exit_code == 0 and result.output.strip()


def test_markup_and_invalid_input_never_give_a_traceback(script: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["debate", "What does [/b] mean?", "-m", f"scripted:{script}"])
    assert result.exit_code == 0 and "What does [/b] mean?" in result.output
    empty = runner.invoke(app, ["debate", "", "-m", f"scripted:{script}"])
    assert empty.exit_code == 2 and "invalid question" in empty.output
    bad_source = tmp_path / "c.json"
    bad_source.write_text(json.dumps([{"text": "t", "source": 5}]))
    result = runner.invoke(app, ["debate", "Q", "-m", f"scripted:{script}", "-c", str(bad_source)])
    assert result.exit_code == 2 and "source" in result.output
    blocker = tmp_path / "afile"
    blocker.write_text("")
    result = runner.invoke(app, ["debate", "Q", "-m", f"scripted:{script}", "--json", str(blocker / "o.json")])
    assert result.exit_code == 2 and f"{blocker} is a file, not a folder" in result.output
    missing = runner.invoke(app, ["debate", "Q", "-c", "[/x].txt", "-m", f"scripted:{script}"])
    assert missing.exit_code == 2 and "[/x].txt" in missing.output
    for r in (empty, result, missing):
        assert "Traceback" not in r.output


@pytest.mark.parametrize(
    "name", ["MOOT_EMBEDDED_SLOTS", "MOOT_EMBEDDED_CTX", "MOOT_EMBEDDED_THREADS", "MOOT_EMBEDDED_CACHE_REUSE"]
)
def test_bad_environment_values_are_refused_before_the_debate(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each tuning variable is checked when the model is named: exit 2 and nothing run (they had
    been read at the first call, which dropped every agent and exited 1)."""
    monkeypatch.setenv(name, "x")
    result = runner.invoke(app, ["debate", "Q", "-m", "embedded:smollm2-135m"])
    assert result.exit_code == 2 and f"{name}='x' is not a positive whole number" in result.output
    assert "round 1" not in result.output and "Traceback" not in result.output


def test_secrets_never_reach_the_transcript_or_the_terminal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = "sk-live-abcdefghijklmnopqrstuvwxyz"
    monkeypatch.setenv("OPENAI_API_KEY", key)
    out = tmp_path / "o.json"
    # Nothing listens on port 9: every call fails with a connection error that names the endpoint.
    result = runner.invoke(
        app,
        ["debate", "Q", "-m", "openai:m", "--base-url", "http://user:pw-secret-123@127.0.0.1:9/v1?key=qs-secret-456",
         "--json", str(out), "--timeout", "30"],
    )  # fmt: skip
    assert result.exit_code == 1
    saved = out.read_text()
    for secret in (key, "pw-secret-123", "qs-secret-456"):
        assert secret not in result.output and secret not in saved
    assert "could not connect to http://127.0.0.1:9/v1" in saved
