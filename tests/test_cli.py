"""The ``moot`` CLI, driven through typer's runner with the scripted model."""

from __future__ import annotations

import asyncio
import io
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from moot.cli.main import app
from moot.core.types import load_result

runner = CliRunner()
ROOT = Path(__file__).parent.parent


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "replies.json"
    path.write_text(json.dumps(["Aff round 1", "Crit round 1", "Aff round 2", "Crit round 2", "Final synthesis"]))
    return path


def test_json_naming_an_input_is_refused_and_a_result_is_written_over(script: Path, tmp_path: Path) -> None:
    """--json over a context file, the scripted model's replies or a run file overwrote it with the
    transcript (an outside trial); a file already there is written over only if it is a moot result."""
    ctx = tmp_path / "ctx.txt"
    ctx.write_text("RAG retrieves passages.")
    run = tmp_path / "run.yaml"
    run.write_text(f"protocol: affirmative-critical\nmodel: scripted:{script}\nquestion: What is RAG?\n")
    for argv, given in (
        (["debate", "Q?", "-m", f"scripted:{script}", "-c", str(ctx), "--json", str(ctx)], ctx),
        (["debate", "Q?", "-m", f"scripted:{script}", "--json", str(script)], script),
        (["run", str(run), "--json", str(run)], run),
    ):
        before = given.read_bytes()
        result = runner.invoke(app, argv)
        assert result.exit_code == 2 and "exists and is not a debate's result" in result.output, result.output
        assert given.read_bytes() == before
    blank = tmp_path / "blank.json"
    blank.write_text("\n  \n")  # nothing but whitespace: as an empty file, nothing to lose
    result = runner.invoke(app, ["debate", "Q?", "-m", f"scripted:{script}", "--json", str(blank), "-q"])
    assert result.exit_code != 2, result.output
    dash = runner.invoke(app, ["debate", "Q?", "-m", f"scripted:{script}", "--json", "-"])
    assert dash.exit_code == 2 and "--json -: give a file path" in dash.output  # (it wrote a file named -)
    absa = runner.invoke(app, ["absa", "run", "The screen is dim.", "-m", f"scripted:{script}", "--json", "-"])
    assert absa.exit_code == 2 and "--json -: give a file path" in absa.output, absa.output
    out = tmp_path / "out.json"
    for i in range(2):  # the second run writes over the first one's result
        replies = tmp_path / f"replies{i}.json"
        replies.write_bytes(script.read_bytes())
        result = runner.invoke(app, ["debate", "Q?", "-m", f"scripted:{replies}", "--json", str(out), "-q"])
        assert result.exit_code == 0, result.output
    assert load_result(out).status == "complete"


def test_the_screen_shows_no_escape_sequence_and_no_key(tmp_path: Path) -> None:
    """A reply (or a question) holding terminal escape sequences reached the terminal as they were,
    and a key typed into the question was hidden in the --json file but shown on the screen."""
    key = "sk-" + "a1b2c3d4" * 4
    evil = "\x1b]0;pwned\x07\x1b[31mred\x9b2J"
    script = tmp_path / "replies.json"
    script.write_text(json.dumps([f"{evil} {key}"] * 10))
    for quiet in ([], ["-q"]):
        result = runner.invoke(app, ["debate", f"Why {evil}? {key}", "-m", f"scripted:{script}", *quiet])
        assert result.exit_code == 0, result.output
        assert "red" in result.output and "***" in result.output
        assert not any(c in result.output for c in "\x1b\x07\x9b") and key not in result.output


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
    # The synthesis is printed once, as the final answer; its turn keeps its name and numbers.
    assert result.output.count("Final synthesis") == 1 and "final answer below" in result.output
    assert result.output.index("Synthesizer · decision") < result.output.index("Final synthesis")
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
    # -q prints the answer alone; with none, it says why on stderr rather than nothing at all
    assert result.stdout == "" and "no decision: the protocol decides nothing" in result.stderr
    assert f"its turns are in {out}" in " ".join(result.stderr.split())


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
    result = runner.invoke(app, ["debate", "Q?", "-m", "nope:x:"])  # text, not an emoji code (a cross mark)
    assert result.exit_code == 2 and "unknown model spec 'nope:x:'" in result.output
    result = runner.invoke(app, ["debate", "Q?", "-m", "embedded:gpt-5"])
    assert result.exit_code == 2 and "unknown embedded model 'gpt-5'" in result.output
    result = runner.invoke(app, ["debate", "Q?", "-m", f"scripted:{tmp_path / 'r.json'}", "--base-url", "http://x"])
    assert result.exit_code == 2 and "only apply to openai: models" in result.output
    # a base URL aiohttp cannot use: refused before any call (it was four attempts, then exit 1),
    # shown without its credentials or query
    for url, shown in [("notaurl", "'notaurl'"), ("http://h:99999/v1", "'http://h:99999/v1'"),
                       ("ftp://u:sk-hidden@h/v1?k=sk-q", "'ftp://h/v1'"), ("u:sk-hidden@h:8000/v1", "'h:8000/v1'"),
                       ("http://[::1:8000/v1", "'http://[::1:8000/v1'"),
                       ("http://u:sk-hidden@h:99999/v1?next=http://x", "'http://h:99999/v1'")]:  # fmt: skip
        result = runner.invoke(app, ["debate", "Q?", "-m", "openai:gpt-x", "--base-url", url])
        assert result.exit_code == 2 and f"the base URL {shown} is not an http(s) URL" in result.output
        assert "sk-" not in result.output


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


def test_a_bad_default_model_is_named_by_moot_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """A spec the user never typed was refused as if typed: "unknown model spec 'gpt4'" (a newcomer's
    trial, session 38). It is named by where it came from."""
    monkeypatch.setenv("MOOT_MODEL", "gpt4")
    result = runner.invoke(app, ["debate", "Q?", "-q"])
    assert result.exit_code == 2
    assert "error: MOOT_MODEL (the default model): unknown model spec 'gpt4' (did you mean openai:gpt4?)" in (
        result.output
    )
    given = runner.invoke(app, ["debate", "Q?", "-q", "-m", "gpt5"])  # one given is named as before
    assert given.exit_code == 2 and "MOOT_MODEL" not in given.output and "'gpt5'" in given.output


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


def test_a_key_typed_into_the_question_is_redacted_in_every_transcript(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 28, item 17: the spans redacted a key typed into the question, and the ``--json`` file
    kept it verbatim. Every transcript (``--json``, the batch and eval store's, the server's) is written
    through ``DebateResult.to_json``, which redacts as the spans do; the command's ``--api-key`` too."""
    from moot.testing.fake_openai import FakeOpenAIServer

    shaped = "sk-typed-abcdefghijklmnop"  # shaped like a key
    env_key = "env-key-0123456789"  # the environment's key
    given = "given-key-plain-42"  # neither: only --api-key says it is one
    monkeypatch.setenv("OPENAI_API_KEY", env_key)
    question = f"Is {shaped} or {env_key} or {given} a key?"
    out = tmp_path / "o.json"
    with FakeOpenAIServer() as fake:  # its replies echo the prompt, so the replies hold the keys too
        args = ["debate", question, "-m", "openai:fake", "--base-url", fake.base_url, "--api-key", given]
        result = runner.invoke(app, [*args, "--json", str(out), "-q"])
    assert result.exit_code == 0, result.output
    saved = out.read_text()
    for secret in (shaped, env_key, given):
        assert secret not in saved
    debate = load_result(out)  # still the transcript, numbers and all
    assert debate.task.question == "Is *** or *** or *** a key?" and debate.llm_calls == 5
    assert "***" in debate.rounds[0].turns[0].messages[-1].content

    script = tmp_path / "r.json"
    script.write_text(json.dumps([f"my key is {shaped}"] * 5))
    questions = tmp_path / "q.txt"
    questions.write_text(question + "\n")
    ran = runner.invoke(app, ["batch", str(questions), "-m", f"scripted:{script}", "-o", str(tmp_path / "run")])
    assert ran.exit_code == 0, ran.output
    with sqlite3.connect(tmp_path / "run" / "run.sqlite") as conn:
        (transcript,) = conn.execute("SELECT transcript FROM results").fetchone()
    assert shaped not in transcript and env_key not in transcript and "my key is ***" in transcript

    # seed 003's reports: the arbitration's JSON (here its detection, no model) is redacted as well
    reports = json.loads((Path(__file__).resolve().parent.parent / "examples" / "reports.json").read_text())
    reports["reports"][0]["findings"][0]["citation"]["quote"] = f"token {shaped}"
    (tmp_path / "reports.json").write_text(json.dumps(reports))
    found = runner.invoke(app, ["arbitrate", str(tmp_path / "reports.json"), "--detect-only", "--json"])
    assert found.exit_code == 0 and shaped not in found.output and "token ***" in found.output, found.output


def test_redacting_a_transcript_rewrites_strings_only() -> None:
    from moot.secrets import redact_json

    text = '{"calls": 1234567, "text": "pin 1234567 and sk-abcdefghijklmnopq"}'
    assert redact_json(text, ["1234567"]) == '{"calls":1234567,"text":"pin *** and ***"}'  # the count is kept
    after_an_escape = json.dumps({"text": "line\nsk-abcdefghijklmnopq"})  # the key follows the n of \\n
    assert json.loads(redact_json(after_an_escape)) == {"text": "line\n***"}
    clean = '{"calls": 3, "text": "nothing secret"}'
    assert redact_json(clean) is clean  # nothing to redact: not parsed, not rewritten
    mentioned = '{"calls": 3, "text": "a bearer bond, an email bob@example.com and https://a.example/b"}'
    assert redact_json(mentioned) is mentioned  # parsed, perhaps, but nothing redacted: not rewritten


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("我的密钥是sk-proj-ABCDEFGHIJKLMNOP1234", "我的密钥是***"),  # glued to CJK text: no word boundary
        ("mykey_sk-proj-WORDBOUNDARY0123456789", "mykey_***"),
        ("GET /v1/responses/resp_sk-proj-PATHSECRET0123456789abc", "GET /v1/responses/resp_***"),
        ("authorization: bearer eyJ+abc/def0123456789=", "***"),
        ("Authorization: Basic dXNlcjpwYXNz", "***"),
        ("token ghp_" + "a1" * 18, "token ***"),
        ("github_pat_" + "B2" * 15, "***"),
        ("hf_" + "c3" * 17, "***"),
        ("AIza" + "d4" * 18, "***"),
        ("key AKIAIOSFODNN7EXAMPLE here", "key *** here"),
        ("xoxb-1234567890-abcdef", "***"),
        ("postgresql://moot:s3cret@db:5432/moot", "postgresql://moot:***@db:5432/moot"),
        ("redis://:s3cretpass@localhost:6379/0", "redis://:***@localhost:6379/0"),  # no user (a review)
        # written as JSON, a dict or a form (a re-attack, session 38)
        ('{"Authorization": "Basic QWxhZGRpbjpvcGVuc2VzYW1l"}', '{"***"}'),
        ("Authorization=Basic QWxhZGRpbjpvcGVuc2VzYW2x", "***"),
        ("{'Authorization': 'Token 0123456789abcdef'}", "{'***'}"),
        ("redis:\\/\\/:PHPpw9secret@cache:6379", "redis:\\/\\/:***@cache:6379"),  # its slashes escaped
        ("token github_pat_GPXabc_defghijklm_nopqrstuvw_xyz0123", "token ***"),  # underscores in its runs
        ("postgresql://moot:p@ss@host/db", "postgresql://moot:***@host/db"),  # to the last @ before the host
        ("at postgresql://u:Secret@h/db", "at postgresql://u:***@h/db"),  # a real password, not a placeholder
        ("_" * 40 + " ghp_" + "a1" * 18, "_" * 40 + " ***"),  # many underscores: the search in C
        ("give postgresql://user:password@host/db", "give postgresql://user:password@host/db"),  # a placeholder
        # a bearer in mixed case (in JSON too), a signed URL's query (session 39)
        ("BeArEr abcdefghijkl0123", "***"),
        (
            "see https://b.s3.amazonaws.com/a.png?X-Amz-Credential=ABCD%2F20261201&X-Amz-Signature=0a1b2c3d4e5f",
            "see https://b.s3.amazonaws.com/a.png?X-Amz-Credential=***&X-Amz-Signature=***",
        ),
        (
            "https://acct.example/c/i.png?sv=2022-11-02&sig=AbC%2Bdef%3D",
            "https://acct.example/c/i.png?sv=2022-11-02&sig=***",
        ),
        ("https://maps.example/api?key=abc123&q=1 and more", "https://maps.example/api?key=***&q=1 and more"),
        ("GET /img?access_token=tok_123#top", "GET /img?access_token=***#top"),
        # (a review of those: an HTML-escaped or percent-encoded separator, a fragment, ";", more names)
        ("?X-Amz-Algorithm=AWS4&amp;X-Amz-Signature=0a1b2c", "?X-Amz-Algorithm=AWS4&amp;X-Amz-Signature=***"),
        (
            "https://app.example/cb#access_token=ya29.a0b1&token_type=Bearer",
            "https://app.example/cb#access_token=***&token_type=Bearer",
        ),
        (
            "?next=https%3A%2F%2Fb.example%2Fa.png%3FX-Amz-Signature%3D0a1b2c",
            "?next=https%3A%2F%2Fb.example%2Fa.png%3FX-Amz-Signature%3D***",
        ),
        ("?v=1;sig=abc123", "?v=1;sig=***"),
        ("?private_token=abc&accessToken=def&x-api-key=ghi", "?private_token=***&accessToken=***&x-api-key=***"),
        (
            "See [the chart](https://maps.example/api?key=abc123) for details.",
            "See [the chart](https://maps.example/api?key=***) for details.",
        ),
        ("use ?key=abc123, then", "use ?key=***, then"),
        (
            "`https://api.example.com/v1/items?api_key=abc123` (replace it)",
            "`https://api.example.com/v1/items?api_key=***` (replace it)",
        ),
        ("See https://example.com/docs?key=abc123.", "See https://example.com/docs?key=***."),
        (
            "DefaultEndpointsProtocol=https;AccountKey=abc123==;EndpointSuffix=x",
            "DefaultEndpointsProtocol=https;AccountKey=***;EndpointSuffix=x",
        ),
        ("https://fn.example/api/f?code=azfn123&x=1", "https://fn.example/api/f?code=***&x=1"),
        # its "=" an HTML entity (a page's source quoted in a passage; session 40's review)
        ("https://x.example/a?token&#61;abc123", "https://x.example/a?token&#61;***"),
        (
            '<img src="https://x.example/i.png?v&#61;1&amp;sig&#X3D;0a1b2c">',
            '<img src="https://x.example/i.png?v&#61;1&amp;sig&#X3D;***">',
        ),
        # not keys: left as they are
        ("a task-based risk-assessment-framework", "a task-based risk-assessment-framework"),
        ("bearer certificates and a basic understanding", "bearer certificates and a basic understanding"),
        ("Authorization: Basic authentication is weak", "Authorization: Basic authentication is weak"),
        ("mail bob@example.com or see https://example.com/a@b", "mail bob@example.com or see https://example.com/a@b"),
        ("if a&b then x=1? keys=2, monkey=3", "if a&b then x=1? keys=2, monkey=3"),
        ("https://example.com/search?q=key&page=2", "https://example.com/search?q=key&page=2"),
        ("x &#61; 1 &amp; key &#61; 2", "x &#61; 1 &amp; key &#61; 2"),
    ],
)
def test_key_shapes_are_redacted_wherever_they_are_glued(text: str, shown: str) -> None:
    """Keys the redaction missed (an outside attack, session 38): one glued to "_" or to CJK text (a
    word boundary was asked for), a lower-case or base64 bearer, Basic credentials, GitHub, Hugging
    Face, Google, AWS and Slack tokens, a password in an address. The same in a JSON document's
    strings, after an escape too."""
    from moot.secrets import redact, redact_json

    assert redact(text) == shown
    assert json.loads(redact_json(json.dumps({"text": text}))) == {"text": shown}
    assert json.loads(redact_json(json.dumps({"text": "line\n" + text}))) == {"text": "line\n" + shown}


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ('{"url": "https://b.example/a.png?v=1\\u0026sig=0a1b2c3d4e5f"}', "https://b.example/a.png?v=1&sig=***"),
        ('{"url": "https://b.example/a.png\\u003fsig=0a1b2c3d4e5f"}', "https://b.example/a.png?sig=***"),
        ('{"url": "https://b.example/a.png?sig=\\/0a1b2c3d4e5f"}', "https://b.example/a.png?sig=***"),
        ('{"url": "b\\u0065arer abcdefghijkl0123"}', "***"),
        ('{"url": "Author\u0131zation: Basic dXNlcjpwYXNz"}', "***"),
        ('{"url": "https://b.example/a.png?\u017fig=0a1b2c3d"}', "https://b.example/a.png?\u017fig=***"),
        (
            '{"url": "https://b.example/a.png?X-Goog-S\u0131gnature=0a1b2c3d"}',
            "https://b.example/a.png?X-Goog-S\u0131gnature=***",
        ),
        ('{"url": "https://b.example/a.png?\\u017fig=0a1b2c3d"}', "https://b.example/a.png?\u017fig=***"),
    ],
)
def test_json_is_redacted_as_its_strings_are_whatever_its_escapes(raw: str, shown: str) -> None:
    """redact_json's fast path (text it returns without reading its strings) never keeps what
    redact() of one of those strings would remove: an escaped separator or letter, an escaped slash
    starting a value, a dotless i that redact()'s case-blind match reads as an i (a review, session 39)."""
    from moot.secrets import redact, redact_json

    value = json.loads(raw)["url"]
    assert redact(value) == shown
    assert json.loads(redact_json(raw))["url"] == shown


def test_the_secrets_of_the_environment_are_read_as_they_are_now(monkeypatch: pytest.MonkeyPatch) -> None:
    """known_secrets keeps what it decoded until a value changes: a key set, changed or removed
    through os.environ is what the next redaction uses."""
    from moot.secrets import known_secrets, redact

    monkeypatch.delenv("MOOT_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert "first-key-value" not in known_secrets()
    monkeypatch.setenv("MOOT_API_KEY", "first-key-value")
    assert "first-key-value" in known_secrets()
    monkeypatch.setenv("MOOT_API_KEY", "second-key-value")
    assert known_secrets().count("second-key-value") == 1 and "first-key-value" not in known_secrets()
    known_secrets().append("not kept")  # a caller's copy: the next call is not changed by it
    assert "not kept" not in known_secrets()
    assert redact("a second-key-value b") == "a *** b"
    monkeypatch.delenv("MOOT_API_KEY")
    assert redact("a second-key-value b") == "a second-key-value b"


def test_the_turn_panel_flags_a_reply_cut_at_its_token_limit() -> None:
    """finish_reason "length": the live panel says the reply may end mid-sentence (the summary's
    warnings say it too, from the engine); a reply that stopped by itself is not flagged."""
    from rich.console import Console

    from moot.cli.render import turn_panel
    from moot.core.types import Turn

    def shown(finish: str) -> str:
        turn = Turn(speaker="critical", name="Critical", round=1, model="m", messages=[], text="Yes, because the")
        console = Console(record=True, width=100)
        console.print(turn_panel(turn.model_copy(update={"finish_reason": finish}), "red"))
        return console.export_text()

    assert "cut at its token limit" in shown("length") and "cut at its token limit" not in shown("stop")


def test_a_background_runs_log_gets_progress_lines(capsys: pytest.CaptureFixture[str]) -> None:
    """Where the bar cannot draw (a log file), moot eval, batch and tune write a progress line at
    most every minute and one when the count completes; on a terminal, none (the bar shows it)."""
    from moot.cli.common import ProgressLines

    lines = ProgressLines(every_s=60, terminal=False)
    for done in (1, 2, 3, 10):
        lines("arc-challenge x 3 protocols", done, 10, "acc so far 50.0%")
    err = capsys.readouterr().err.splitlines()
    assert [line.split(" (")[0] for line in err] == [
        "arc-challenge x 3 protocols: 1/10, acc so far 50.0%",
        "arc-challenge x 3 protocols: 10/10, acc so far 50.0%",
    ]
    assert err[0].endswith("(0:00 elapsed)")
    ProgressLines(terminal=True)("x", 10, 10)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("flag", ["--dataset", "--data", "-d"])
def test_eval_and_tune_take_the_same_dataset_option_and_its_alias(flag: str, tmp_path: Path) -> None:
    """`moot eval` and `moot tune` name their data alike: --dataset, with --data as an alias."""
    missing = str(tmp_path / "nothing.jsonl")
    for command in (["eval", flag, missing, "-p", "single"], ["tune", flag, missing, "-m", "scripted:x.json"]):
        result = runner.invoke(app, [*command, "-o", str(tmp_path / "out")])
        assert result.exit_code == 2, result.output
        assert "nothing.jsonl" in result.output and "No such option" not in result.output, result.output


# --------------------------------------------------------------------------------------- issue 39

FIXTURES = Path(__file__).resolve().parent / "fixtures"
LONE = "\udfff"


def one_line_exit_2(result: Result, *needles: str) -> None:
    flat = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) <= 2, result.output
    for needle in needles:
        assert needle in flat, (needle, result.output)


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _damaged(path: Path, how: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if how == "garbage":
        path.write_bytes(b"this is no database, " * 200)
        return path
    with sqlite3.connect(path) as conn:  # a real store, cut in half (a copy that stopped, a full disk)
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.executemany("INSERT INTO meta VALUES (?, ?)", [(str(n), "x" * 500) for n in range(400)])
    conn.close()
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


@pytest.mark.parametrize("how", ["garbage", "truncated"])
@pytest.mark.parametrize("command", ["eval report", "eval", "batch", "tune", "serve"])
def test_a_damaged_store_is_one_line_naming_it(
    command: str, how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 39, T1: a truncated or foreign run store was a ``sqlite3.DatabaseError`` traceback in
    ``moot eval report``, ``eval``, ``batch``, ``tune`` and ``serve --db``; every store is opened by one
    opener (:func:`moot.files.open_sqlite`, as ``moot view`` and ``moot eval export`` read it), which
    says which file and what to do. ``moot serve`` says it before its banner."""
    replies = _write(tmp_path / "r.json", json.dumps([{"reasoning": "r", "answer": "A", "confidence": 0.9}] * 40))
    model = ["-m", f"scripted:{replies}"]
    data = str(FIXTURES / "eval" / "colours.jsonl")
    out = tmp_path / "run"
    store = _damaged(out / ("tuning" if command == "tune" else "") / "run.sqlite", how)
    questions = _write(tmp_path / "q.txt", "Is 7 prime?\n")
    args = {
        "eval report": ["eval", "report", str(out)],
        "eval": ["eval", "--dataset", data, "-p", "single", "--n", "2", *model, "--out", str(out)],
        "batch": ["batch", str(questions), *model, "-o", str(out)],
        "tune": ["tune", "--data", data, *model, "-o", str(out)],
        "serve": ["serve", "--db", str(store), "--models", "openai:fake", "--base-url", "http://127.0.0.1:9/v1"],
    }[command]
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-key-for-serve-0123")
    reason = "file is not a database" if how == "garbage" else "database disk image is malformed"
    result = runner.invoke(app, args)
    one_line_exit_2(result, f"{store} is not a moot", f"({reason})", "truncated, damaged or another kind of file")
    assert "moot serve:" not in result.output  # refused before the banner


@pytest.mark.parametrize(
    ("kind", "needles"),
    [
        ("question", ["invalid question: contains a lone surrogate (U+DCFF) at position 2"]),
        ("context.json", ["ctx.json: passage 2: contains a lone surrogate (U+DFFF) at position 1"]),
        ("context.jsonl", ["ctx.jsonl:2: text: contains a lone surrogate (U+DFFF) at position 0"]),
        ("run.yaml", ["run file", "run.yaml', line 2: context[0]: contains a lone surrogate (U+DFFF) at position 2"]),
        ("protocol.yaml", ["protocol file", "p.yaml', line ", "participants[0].persona.instructions: contains a lone"]),
        ("batch.jsonl", ["in.jsonl line 2: question: contains a lone surrogate (U+DFFF) at position 4"]),
        ("eval.jsonl", ["data.jsonl:1: choices[1]: contains a lone surrogate (U+DFFF) at position 0"]),
    ],
)
def test_a_lone_surrogate_in_any_input_is_one_line_and_exit_2(
    kind: str, needles: list[str], tmp_path: Path, script: Path
) -> None:
    """Issue 39, S3: half a UTF-16 pair (a JSON or YAML ``\\udfff`` escape, or a command line's bytes
    that are not UTF-8) could not be written to a transcript or a store; it is refused where it is
    read, naming the file, the line and the field, before any model call."""
    model = ["-m", f"scripted:{script}"]
    escaped = json.dumps(LONE)[1:-1]  # the six characters a file holds: \udfff
    if kind == "question":
        args = ["debate", "Is\udcff it?", *model]  # as Python decodes argv bytes that are not UTF-8
    elif kind.startswith("context"):
        name = "ctx.json" if kind == "context.json" else "ctx.jsonl"
        body = f'["ok", "x{escaped}"]' if kind == "context.json" else f'"ok"\n{{"text": "{escaped}"}}\n'
        args = ["debate", "Q?", "-c", str(_write(tmp_path / name, body)), *model]
    elif kind == "run.yaml":
        run = _write(tmp_path / "run.yaml", f'question: "Q?"\ncontext: ["ab{escaped}"]\nmodel: scripted:{script}\n')
        args = ["run", str(run)]
    elif kind == "protocol.yaml":
        spec = {"name": "p", "participants": [{"id": "a", "persona": {"name": "A", "instructions": LONE}}]}
        args = ["debate", "Q?", "-p", str(_write(tmp_path / "p.yaml", json.dumps(spec))), *model]
    elif kind == "batch.jsonl":
        lines = _write(tmp_path / "in.jsonl", f'{{"question": "ok?"}}\n{{"question": "Is 7{escaped}"}}\n')
        args = ["batch", str(lines), *model, "-o", str(tmp_path / "out")]
    else:
        line = json.dumps({"question": "Q?", "choices": ["a", LONE], "answer": "A"})
        args = ["eval", "--dataset", str(_write(tmp_path / "data.jsonl", line + "\n")), "-p", "single", *model,
                "--out", str(tmp_path / "out")]  # fmt: skip
    result = runner.invoke(app, args)
    one_line_exit_2(result, *needles)
    assert not (tmp_path / "out" / "run.sqlite").exists()


TEXTS = {
    "spaces": lambda size: "word " * (size // 5),
    "no spaces": lambda size: "a" * size,
    "CJK": lambda size: "日本語のテキスト" * (size // 24),
    "base64": lambda size: __import__("base64").b64encode(b"\x8f\x01\xfe" * (size // 4)).decode(),
}


@pytest.mark.parametrize("kind", sorted(TEXTS))
def test_a_50_mb_context_of_any_text_is_refused_before_any_call(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 39, S7: the limit of 1,000,000 tokens for one prompt counted whitespace-separated
    words, so 50 MB without a space, or 24 MB of Japanese, went out as one prompt. The README's
    promise, "a 50 MB file is refused at once, not sent", holds for each kind of text."""
    import time

    from moot.models.base import approx_tokens, least_tokens
    from moot.testing.fake_openai import FakeOpenAIServer

    text = TEXTS[kind](50_000_000)
    big = tmp_path / "big.txt"
    big.write_text(text, encoding="utf-8")
    assert big.stat().st_size >= 49_000_000
    assert least_tokens(text, 1_000_000) == 1_000_001  # over the limit, counted no further
    sample = text[:400_000]
    assert least_tokens(sample) >= approx_tokens(sample)  # never below the count of words and marks
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with FakeOpenAIServer() as fake:
        started = time.monotonic()
        result = runner.invoke(app, ["debate", "Q?", "-c", str(big), "-m", "openai:fake", "--base-url", fake.base_url])
        took = time.monotonic() - started
        assert fake.requests == []
    one_line_exit_2(result, "more than 1,000,000 tokens", "moot's limit of 1,000,000 tokens for one prompt")
    assert took < 60  # at once: only a hang (or a prompt sent) reaches this


def test_the_estimate_counts_text_without_spaces() -> None:
    from moot.models.base import least_tokens

    assert least_tokens("The quick brown fox jumps over the lazy dog.") == 10  # words and marks
    assert least_tokens("a" * 4000) == 1000  # one word, 4,000 characters
    assert least_tokens("語" * 1000) == 500  # CJK: half a token a character at the least
    assert least_tokens(" \n\t" * 1000) == 0 and least_tokens("") == 0
    assert least_tokens("QUJD" * 250) == 250  # base64


def test_a_preset_parameter_given_twice_is_refused_naming_it(script: Path) -> None:
    """Issue 39, L1: ``rounds=3,rounds=4`` ran with the last one, silently."""
    protocol = "society-of-minds(rounds=3,rounds=4)"
    result = runner.invoke(app, ["debate", "Q?", "-p", protocol, "-m", f"scripted:{script}"])
    one_line_exit_2(result, "parameter 'rounds' is given twice")
    from moot.protocols.refs import ProtocolRefError, parse_call

    with pytest.raises(ProtocolRefError, match="'k' is given twice"):
        parse_call("vote(k=3, agents=2, k=5)")


def _commands(group: object, path: list[str]) -> list[list[str]]:
    """Every command's argument path under ``group`` (a click group), the group's own included."""
    found = [path]
    commands = getattr(group, "commands", None)  # a group (typer vendors click: no isinstance)
    if isinstance(commands, Mapping):  # (moot's own: its lazy commands, moot.cli.lazy)
        for name, sub in commands.items():
            found += _commands(sub, [*path, name])
    return found


def test_a_command_imports_only_what_it_runs() -> None:
    """The subcommands are imported when used (moot.cli.lazy): ``moot version`` (and ``moot debate``)
    start without the evaluation's analyses, the server, the MCP door or batch (the ABSA presets are
    registered: every process has them, below); ``moot serve --help`` then imports its command. The
    commands still list in ``moot --help`` and are suggested for a typo."""
    heavy = (
        "moot.server", "moot.batch", "moot.eval.analysis", "moot.eval.report", "moot.eval.tune",
        "moot.eval.pool", "moot.cli.eval", "moot.cli.serve", "moot.cli.mcp", "moot.cli.batch", "moot.cli.tune",
    )  # fmt: skip
    code = (
        "import json, sys; from moot.cli.main import app; from typer.testing import CliRunner; "
        f"loaded = lambda: sorted(m for m in sys.modules if m.startswith({heavy!r})); "
        "r = CliRunner().invoke(app, ['version']); assert r.exit_code == 0, r.output; before = loaded(); "
        "r = CliRunner().invoke(app, ['serve', '--help']); assert r.exit_code == 0, r.output; "
        "print(json.dumps([before, loaded()]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    before, after = json.loads(out.stdout)
    assert before == []
    assert "moot.cli.serve" in after
    listed = runner.invoke(app, ["--help"])
    for name in ("eval", "tune", "serve", "mcp", "batch", "view", "quality", "arbitrate", "absa"):
        assert f" {name} " in listed.output
    typo = runner.invoke(app, ["evl"])
    assert typo.exit_code == 2 and "Did you mean 'eval'?" in typo.output


def test_every_commands_help_renders() -> None:
    """`--help` of every command prints its help: a help text that rich reads as markup (an option's
    `[/db]` is a closing tag) crashed `moot serve --help` with a MarkupError traceback."""
    import typer.main

    paths = _commands(typer.main.get_command(app), [])
    assert ["serve"] in paths and len(paths) > 20
    for path in paths:
        result = runner.invoke(app, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output, result.exception)
        assert "Usage" in result.output, path


def test_no_help_text_loses_words_to_rich_markup() -> None:
    """rich reads help as markup: `moot[otel]` in --trace's help was taken for a tag and vanished, so
    `moot debate --help` ended "...on stderr); moot, docs/tracing.md." Every command's help and every
    option's, as rich renders it, keeps each word its text has (a bracket meant literally is `\\[`)."""
    import typer.main
    from rich.text import Text

    root = typer.main.get_command(app)
    for path in _commands(root, []):
        command: Any = root
        for name in path:
            command = command.commands[name]
        for text in [command.help or "", *(getattr(p, "help", None) or "" for p in command.params)]:
            assert Text.from_markup(text).plain == text.replace("\\[", "["), (path, text)
    shown = CliRunner(env={"COLUMNS": "400"}).invoke(app, ["debate", "--help"])
    flat = " ".join(shown.output.replace("│", " ").split())
    assert "prints them on stderr). Needs pip install 'moot[otel]'; see docs/tracing.md." in flat, flat


def test_the_live_header_shows_the_question_as_given(script: Path) -> None:
    """The header above the turns shows the question as typed (lower-case ``q`` stays ``q``), as the
    transcript keeps it."""
    result = runner.invoke(app, ["debate", "q", "-m", f"scripted:{script}"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0].startswith("q  (affirmative-critical, scripted:"), result.output


def test_help_folds_a_long_word_rather_than_cutting_it() -> None:
    """At 80 columns typer's help cut a word too long for its column with "…": the name of an option
    (`--max-conversation-by…`), a URL's form, a price's format. The `moot` command folds it onto the
    next line: every command's help, at 80 columns and at 60, holds no "…"."""
    import typer.main

    from moot.cli.help_width import fold_long_words

    env = {**os.environ, "COLUMNS": "80"}
    served = subprocess.run(
        [sys.executable, "-m", "moot", "serve", "--help"], capture_output=True, text=True, env=env, timeout=120
    )
    assert served.returncode == 0 and "…" not in served.stdout, served.stdout
    assert "postgresql://user:passw" in served.stdout and "--max-conversation-byt" in served.stdout
    fold_long_words()  # (what `moot` does when help is asked for)
    for width in ("80", "60"):
        for path in _commands(typer.main.get_command(app), []):
            result = CliRunner(env={"COLUMNS": width}).invoke(app, [*path, "--help"])
            assert result.exit_code == 0 and "…" not in result.output, (width, path, result.output)


def test_the_tests_print_at_one_width_in_one_process_or_in_an_xdist_worker(script: Path) -> None:
    """pytest imports readline, which exported COLUMNS=80 into the C environment: an xdist worker
    inherited it and its console wrapped at 80 where one process printed at 160 (tests/conftest.py
    removes it). Here: no command a test runs inherits a width, and the CLI prints 160 wide."""
    import subprocess
    import sys

    from moot.cli.common import PIPE_WIDTH, console, err_console

    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.environ.get('COLUMNS'), os.environ.get('LINES'))"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert child.stdout.split() == ["None", "None"]
    assert console.width == err_console.width == PIPE_WIDTH
    result = runner.invoke(app, ["debate", "Q?", "-m", f"scripted:{script}"])
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.output.splitlines()) == PIPE_WIDTH  # the result's panel


LAZY_MODULES = ("eval", "tune", "serve", "mcp", "batch", "view", "quality", "arbitrate", "absa", "catalogue")


def test_a_fresh_moot_process_knows_the_applications_presets() -> None:
    """The ABSA presets are registered when the ABSA app is imported; every ``moot`` process (a server
    lists them, a debate runs them) has them, not only one that ran an ABSA command first. In a fresh
    process: this one has imported everything by now."""
    import subprocess
    import sys

    code = "import json; import moot.cli.main; from moot.protocols import preset_names as p; print(json.dumps(p()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert {"absa-panel", "absa-patch"} <= set(json.loads(out.stdout))
    # The commands are imported when used (moot.cli.lazy): what a process registers at import (presets,
    # turn schemas) is the same before and after every command's module is imported.
    registered = (
        "from moot.protocols import preset_names; from moot.structured import schema_names; "
        "now = lambda: (preset_names(), schema_names()); "
    )
    every = "; ".join(f"import moot.cli.{m}" for m in LAZY_MODULES)
    code = f"import json, moot.cli.main; {registered}before = now(); {every}; print(json.dumps([before, now()]))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    before, after = json.loads(out.stdout)
    assert before == after and "quality-judgement" in before[1]


def test_the_live_panels_survive_turns_starting_while_they_are_drawn() -> None:
    """Rich's refresh thread draws the turns in flight while the event loop adds and removes them:
    drawing must not iterate the live dict (it raised "dictionary changed size during iteration" in a
    vote of thousands), and a vote of hundreds draws a dozen panels and a count of the rest."""
    from rich.console import Console

    from moot.cli.render import MAX_PANELS, LiveRenderer

    renderer = LiveRenderer(Console(file=io.StringIO(), width=80))

    class Growing(list[str]):
        def __iter__(self) -> Iterator[str]:  # another turn starts while this one is drawn
            start(f"a{len(renderer.buffers)}", [])
            return super().__iter__()

    def start(speaker: str, parts: list[str]) -> None:
        renderer.names[(speaker, 1)], renderer.buffers[(speaker, 1)] = speaker, parts

    start("a0", Growing(["thinking"]))
    renderer._in_flight()
    for i in range(30):
        start(f"b{i}", ["x"])
    out = io.StringIO()
    Console(file=out, width=80).print(renderer._in_flight())
    drawn = out.getvalue()  # (drawing a0 started one more turn)
    assert drawn.count("(speaking)") == MAX_PANELS
    assert f"and {len(renderer.buffers) - 1 - MAX_PANELS} more speaking" in drawn


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_a_place_that_cannot_be_written_is_refused_before_any_work_even_for_root(tmp_path: Path) -> None:
    """os.access says yes to root on /proc and /sys: the check makes (and removes) a file there. The
    debate wrote its answer, then died on the transcript with a traceback."""
    script = tmp_path / "s.json"
    script.write_text('["an answer"]', encoding="utf-8")
    for args in (
        ["debate", "Q?", "-m", f"scripted:{script}", "-p", "single", "-q", "--json", "/proc/moot-x.json"],
        ["eval", "-d", str(ROOT / "tests" / "fixtures" / "science.jsonl"), "-m", f"scripted:{script}", "-p",
         "single", "-o", "/proc/moot-run"],
    ):  # fmt: skip
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and "/proc is not writable" in result.output, result.output
    assert not Path("/proc/moot-run").exists()


def test_a_file_that_fails_late_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A write the command had checked that fails when it comes (a full disk): one line, exit 1."""
    from moot.cli import main as entry

    def full(*_: object, **__: object) -> None:
        raise OSError(28, "No space left on device", "/data/run.json")

    monkeypatch.setattr(entry, "app", full)
    with pytest.raises(SystemExit) as ended:
        entry.main()
    assert ended.value.code == 1
    assert capsys.readouterr().err.strip() == "error: /data/run.json: No space left on device"


def test_a_vote_over_free_text_turns_is_refused_before_any_call(tmp_path: Path) -> None:
    """Free text never votes: such a protocol failed after all its calls ("no participant gave a
    typed answer to vote on", exit 1); it is bad input, said when the file is read."""
    proto = tmp_path / "p.yaml"
    proto.write_text(
        "name: free-vote\nrounds: 1\nparticipants:\n  - id: a\n    persona: {name: A}\ndecision: {kind: vote}\n",
        encoding="utf-8",
    )
    script = tmp_path / "s.json"
    script.write_text('["an answer"]', encoding="utf-8")
    result = runner.invoke(app, ["debate", "Q?", "-m", f"scripted:{script}", "-p", str(proto), "-q"])
    assert result.exit_code == 2, result.output
    assert "a vote counts each voter's typed 'answer', but no voter's turn has a schema" in result.output.replace(
        "\n", " "
    )
    typed = proto.read_text(encoding="utf-8").replace("rounds: 1\n", "rounds: 1\nturn: {schema: answer}\n")
    proto.write_text(typed, encoding="utf-8")
    script.write_text('[{"reasoning": "r", "answer": "7", "confidence": 0.9}]', encoding="utf-8")
    assert runner.invoke(app, ["debate", "Q?", "-m", f"scripted:{script}", "-p", str(proto), "-q"]).exit_code == 0


def test_a_misspelt_required_key_of_a_run_file_is_named(tmp_path: Path) -> None:
    """``questoin: hi`` is an unknown key and a missing question: the unknown key names the typo (it
    said "question: Field required")."""
    run = tmp_path / "r.yaml"
    run.write_text("questoin: hi\n", encoding="utf-8")
    result = runner.invoke(app, ["run", str(run)])
    assert result.exit_code == 2
    assert "unknown key 'questoin'; it may have protocol, with, model" in " ".join(result.output.split())


def test_a_run_files_scripted_model_is_read_beside_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One rule for the files a run file names: its protocol file was read beside it, its
    ``scripted:`` replies from wherever the command ran."""
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "replies.json").write_text('[{"reasoning": "r", "answer": "408", "confidence": 0.9}]', encoding="utf-8")
    (folder / "run.yaml").write_text(
        "protocol: single\nmodel: scripted:replies.json\nmodels: {agent1: scripted:replies.json}\nquestion: Q?\n",
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)  # not the run file's folder
    result = runner.invoke(app, ["run", str(folder / "run.yaml"), "-q"])
    assert result.exit_code == 0 and "408" in result.output, result.output
    # and a protocol file's own participant model, read beside the protocol file
    spec = {"name": "p", "rounds": 1, "turn": {"schema": "answer"}, "decision": {"kind": "vote"},
            "participants": [{"id": "a", "persona": {"name": "A"}, "model": "scripted:replies2.json"}]}  # fmt: skip
    (folder / "p.yaml").write_text(json.dumps(spec), encoding="utf-8")
    (folder / "replies2.json").write_text('[{"reasoning": "r", "answer": "408", "confidence": 0.9}]', encoding="utf-8")
    (folder / "run2.yaml").write_text("protocol: p.yaml\nquestion: Q?\n", encoding="utf-8")
    result = runner.invoke(app, ["run", str(folder / "run2.yaml"), "-q"])
    assert result.exit_code == 0 and "408" in result.output, result.output
    # and a preset's models given in with:, in a run file and in a preset file
    (folder / "replies3.json").write_text('[{"reasoning": "r", "answer": "408", "confidence": 0.9}]', encoding="utf-8")
    (folder / "run3.yaml").write_text(
        "protocol: vote\nwith: {k: 1, models: [scripted:replies3.json]}\nquestion: Q?\n", encoding="utf-8"
    )
    result = runner.invoke(app, ["run", str(folder / "run3.yaml"), "-q"])
    assert result.exit_code == 0 and "408" in result.output, result.output
    (folder / "replies4.json").write_text('[{"reasoning": "r", "answer": "408", "confidence": 0.9}]', encoding="utf-8")
    (folder / "preset.yaml").write_text("preset: vote\nwith: {k: 1, models: [scripted:replies4.json]}\n")
    result = runner.invoke(app, ["debate", "Q?", "-p", str(folder / "preset.yaml"), "-q"])
    assert result.exit_code == 0 and "408" in result.output, result.output
    # and the models of a preset named with its parameters in one string: vote(k=1,models=[...])
    (folder / "replies5.json").write_text('[{"reasoning": "r", "answer": "408", "confidence": 0.9}]', encoding="utf-8")
    (folder / "run5.yaml").write_text(
        'protocol: "vote(k=1,models=[scripted:replies5.json])"\nquestion: Q?\n', encoding="utf-8"
    )
    result = runner.invoke(app, ["run", str(folder / "run5.yaml"), "-q"])
    assert result.exit_code == 0 and "408" in result.output, result.output


def test_options_that_contradict_or_go_unused_are_refused(tmp_path: Path) -> None:
    """Each was accepted and silently ignored (or, an empty protocol entry, silently dropped)."""
    data = str(ROOT / "tests" / "fixtures" / "science.jsonl")
    script = tmp_path / "s.json"
    script.write_text('["unused"]', encoding="utf-8")
    cases = [
        (["tune", "-d", data, "-m", f"scripted:{script}", "--tuning-n", "10", "--holdout-n", "10", "--holdout", "0.3",
          "-o", str(tmp_path / "t")], "--holdout splits the items by a share, --tuning-n/--holdout-n by counts"),
        (["eval", "-d", data, "-m", f"scripted:{script}", "-p", "single,,vote@3", "-o", str(tmp_path / "e")],
         "'single,,vote@3' has an empty entry"),
        (["arbitrate", str(ROOT / "examples" / "reports.json"), "--detect-only", "-m", "nosuch:x"],
         "--detect-only calls no model: --model would be unused"),
    ]  # fmt: skip
    for args, message in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and message in " ".join(result.output.split()), (args, result.output)
    assert not (tmp_path / "t").exists() and not (tmp_path / "e").exists()
    # (a parameter list's trailing comma is not an empty protocol: mad(rounds=2,) reads as before)
    from moot.protocols.loader import resolve_protocol

    assert resolve_protocol("mad(rounds=2,)").rounds == 2


def test_a_debate_of_more_participants_than_the_cap_is_refused_before_any_is_built(tmp_path: Path) -> None:
    """vote@100000 spent over 30 s building its spec (quadratic checks) before its first call, and
    a million would take gigabytes: every way of asking for that many is refused in one line."""
    import time

    from moot.core.spec_base import MAX_PARTICIPANTS

    script = tmp_path / "s.json"
    script.write_text('["4"]', encoding="utf-8")
    big = tmp_path / "big.yaml"
    lines = [f"  - {{id: a{i}, persona: {{name: A, role: solver}}}}" for i in range(MAX_PARTICIPANTS + 1)]
    big.write_text("name: big\nparticipants:\n" + "\n".join(lines) + "\n", encoding="utf-8")
    cases = [
        ("vote@10000000", "a vote takes at most 1,000 samples"),
        ("vote(k=5000)", "the protocol asks 5,000 participants; a debate takes at most 1,000"),
        ("society-of-minds(agents=100000000)", "asks 100,000,000 participants"),
        (str(big), "the spec asks 1,001 participants"),
    ]
    for protocol, message in cases:
        t0 = time.perf_counter()
        result = runner.invoke(app, ["debate", "2+2?", "-m", f"scripted:{script}", "-p", protocol])
        assert result.exit_code == 2 and message in " ".join(result.output.split()), (protocol, result.output)
        assert time.perf_counter() - t0 < 60  # (only a hang, or building them all, trips this)
    # the cap itself is allowed, and its checks are no longer quadratic
    from moot.protocols.loader import resolve_protocol

    assert len(resolve_protocol(f"vote@{MAX_PARTICIPANTS}").participants) == MAX_PARTICIPANTS


def test_an_empty_parameter_is_refused_but_a_trailing_comma_is_not() -> None:
    from moot.protocols.loader import ProtocolFileError, resolve_protocol

    for text in ("mad(,rounds=2)", "mad(rounds=2,,temperature=0.5)"):
        with pytest.raises(ProtocolFileError, match="empty parameter"):
            resolve_protocol(text)
    assert resolve_protocol("mad(rounds=2,)").rounds == 2


def test_the_transcript_is_written_as_it_grows_but_not_after_every_one_of_thousands_of_turns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A vote of 20,000 samples rewrote its whole growing file after each: quadratic, and 11 s to
    stop on Ctrl-C. A turn's write waits every_s after the last; a round's and the end's never."""
    from moot.cli import render
    from moot.core.events import DebateDone, RoundDone, TurnDone
    from moot.core.types import DebateResult, DebateTask, Round

    writes: list[int] = []
    monkeypatch.setattr(render, "write_atomic", lambda path, text: writes.append(len(text)))
    writer = render.TranscriptWriter(tmp_path / "t.json", every_s=3600)
    result = DebateResult(protocol="p", task=DebateTask(question="Q?"), participants=[])
    for _ in range(1000):
        writer(TurnDone(result=result, turn=None))  # type: ignore[arg-type]  # (the writer reads the result only)
    assert len(writes) == 1  # the first turn's, at once
    writer(RoundDone(result=result, round=Round(index=1, turns=[])))
    writer(DebateDone(result=result))
    assert len(writes) == 3


def test_a_scripted_model_with_no_reply_is_refused_before_any_call(tmp_path: Path) -> None:
    script = tmp_path / "s.json"
    script.write_text("[]", encoding="utf-8")
    result = runner.invoke(app, ["debate", "Q?", "-m", f"scripted:{script}", "-q"])
    assert result.exit_code == 2 and "holds no reply: give at least one" in " ".join(result.output.split())


def test_a_failed_debate_under_q_says_its_error_once(tmp_path: Path) -> None:
    script = tmp_path / "s.json"
    script.write_text('["prose, not the typed answer asked for"]', encoding="utf-8")  # its repair finds no reply
    result = runner.invoke(app, ["debate", "Q?", "-m", f"scripted:{script}", "-p", "single", "-q"])
    assert result.exit_code == 1 and result.stderr.count("has no reply left for call 2") == 1, result.stderr
    # ... and where its finished turns are, or would have been kept
    assert "(--json FILE keeps its finished turns)" in " ".join(result.stderr.split())
    out = tmp_path / "o.json"
    result = runner.invoke(app, ["debate", "Q?", "-m", f"scripted:{script}", "-p", "single", "-q", "--json", str(out)])
    assert f"(partial transcript kept in {out})" in "".join(result.stderr.split("\n")) and out.exists()


def test_a_write_that_fails_for_its_size_is_one_line_naming_the_file(tmp_path: Path) -> None:
    """A full disk, a quota, a file-size limit: the write's OSError names no file, and it was a
    traceback. Reproduced with a file-size limit of 2 KB (its signal ignored, as a shell's trap does)."""
    import resource
    import signal

    script = tmp_path / "s.yaml"
    script.write_text("- " + "x" * 3000 + "\n", encoding="utf-8")
    out = tmp_path / "out.json"

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))

    done = subprocess.run(
        [sys.executable, "-m", "moot.cli.main", "debate", "Q?", "-m", f"scripted:{script}", "-p", "single", "-q",
         "--json", str(out)],
        capture_output=True, text=True, timeout=120, preexec_fn=limited,
    )  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == f"error: {out}: File too large"


async def test_a_turn_held_back_is_written_when_its_time_is_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A turn within every_s of the last write waited for the next event, which a slow turn could
    hold back for minutes (a kill then lost it): it is written when every_s is up."""
    from moot.cli import render
    from moot.core.events import TurnDone
    from moot.core.types import DebateResult, DebateTask

    writes: list[str] = []
    monkeypatch.setattr(render, "write_atomic", lambda path, text: writes.append(text))
    writer = render.TranscriptWriter(tmp_path / "t.json", every_s=0.05)
    result = DebateResult(protocol="p", task=DebateTask(question="Q?"), participants=[])
    writer(TurnDone(result=result, turn=None))  # type: ignore[arg-type]
    result.warnings.append("a second turn's mark")
    writer(TurnDone(result=result, turn=None))  # type: ignore[arg-type]
    assert len(writes) == 1
    await asyncio.sleep(0.3)
    assert len(writes) == 2 and "a second turn's mark" in writes[1]


async def test_a_held_back_write_that_fails_is_said_by_the_next_event_not_in_the_timer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write failing in the timer's callback was a traceback from asyncio, seen by no handler."""
    from moot.cli import render
    from moot.core.events import DebateDone, TurnDone
    from moot.core.types import DebateResult, DebateTask

    calls: list[str] = []

    def write(path: Path, text: str) -> None:
        calls.append(text)
        if len(calls) > 1:
            raise OSError(27, "File too large", str(path))

    monkeypatch.setattr(render, "write_atomic", write)
    unhandled: list[object] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: unhandled.append(context))
    writer = render.TranscriptWriter(tmp_path / "t.json", every_s=0.05)
    result = DebateResult(protocol="p", task=DebateTask(question="Q?"), participants=[])
    writer(TurnDone(result=result, turn=None))  # type: ignore[arg-type]
    writer(TurnDone(result=result, turn=None))  # type: ignore[arg-type]  # held back; its timer's write fails
    await asyncio.sleep(0.3)
    assert len(calls) == 2 and unhandled == []
    with pytest.raises(OSError, match="File too large"):  # the end's write says it, on the usual path
        writer(DebateDone(result=result))
