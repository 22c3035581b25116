"""``moot mcp`` and ``moot serve``'s ``/mcp``: the debate as an MCP server (issue 41, item 1), driven by
the official ``mcp`` SDK's own client over both transports: stdio (``python -m moot mcp`` in its own
process) and streamable HTTP (``moot serve``'s app on a loopback port, behind its key), each at the
2026-07-28 revision (``mode="auto"``: ``server/discover``) and at 2025-11-25 (``mode="legacy"``: the
``initialize`` handshake). Debates run on the loopback fake OpenAI-compatible server."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

pytest.importorskip("mcp", reason="the MCP server needs moot[mcp]")
import httpx2  # the mcp SDK's HTTP client
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import SecretStr

from moot.core.types import DebateResult
from moot.models.weights import CATALOG, is_installed
from moot.server import ServerSettings
from moot.server.mcp import DebateOutcome, inline_refs, not_text, unreadable
from moot.testing.fake_openai import FakeOpenAIServer
from serving import FAKE_KEY, ServerThread

SRC = str(Path(__file__).resolve().parent.parent / "src")
KEY = "mcp-test-key-0123456789"
#: Only a hang reaches it.
HANG = 300.0
QUESTION = "Which letter comes after A?"
TRANSPORTS = [
    pytest.param("stdio", "auto", id="stdio-2026-07-28"),
    pytest.param("stdio", "legacy", id="stdio-2025-11-25"),
    pytest.param("http", "auto", id="http-2026-07-28"),
    pytest.param("http", "legacy", id="http-2025-11-25"),
]
REVISION = {"auto": "2026-07-28", "legacy": "2025-11-25"}


def env() -> dict[str, str]:
    """The stdio server's environment: this tree's moot, the fake backend's key, no MOOT_MODEL."""
    kept = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    return kept | {"PYTHONPATH": SRC, "OPENAI_API_KEY": FAKE_KEY}


def stdio_params(fake: FakeOpenAIServer, *args: str) -> StdioServerParameters:
    cmd = ["-m", "moot", "mcp", "--models", "openai:fake", "--base-url", fake.base_url, *args]
    return StdioServerParameters(command=sys.executable, args=cmd, env=env())


@contextlib.asynccontextmanager
async def connect(
    kind: str, mode: str, fake: FakeOpenAIServer, tmp_path: Path, *args: str, **options: Any
) -> AsyncIterator[Client]:
    """The SDK's client on ``moot mcp`` (stdio) or on ``moot serve``'s /mcp (HTTP, with the key);
    ``options``: more of the client's (its extensions, its message handler)."""
    if kind == "stdio":
        async with Client(stdio_params(fake, *args), mode=mode, read_timeout_seconds=HANG, **options) as client:
            yield client
        return
    settings = ServerSettings(
        db=tmp_path / "moot.sqlite", models=["openai:fake"], base_url=fake.base_url, api_key=SecretStr(KEY)
    )
    with ServerThread(settings) as server:
        http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {KEY}"}, timeout=HANG)
        transport = streamable_http_client(server.url + "/mcp", http_client=http)
        async with Client(transport, mode=mode, read_timeout_seconds=HANG, **options) as client:
            yield client


@pytest.fixture(autouse=True)
def _backend_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)


def split_vote() -> Any:
    """Replies of a vote of three: two agents answer B, one C (whichever asks third), each with its reasons."""
    answers = iter(["B", "B", "C"] * 20)

    def reply(request: dict[str, Any]) -> str:
        answer = next(answers)
        confidence = 0.9 if answer == "B" else 0.6
        return json.dumps({"reasoning": f"the letter after A is {answer}", "answer": answer, "confidence": confidence})

    return reply


def structured(result: Any) -> dict[str, Any]:
    data: dict[str, Any] = result.structured_content
    return data


def text(result: Any) -> str:
    return str(result.content[0].text)


# ------------------------------------------------------------------------------------ debates


@pytest.mark.parametrize(("kind", "mode"), TRANSPORTS)
async def test_a_debate_returns_its_decision_with_agreement_dissent_and_cost(
    kind: str, mode: str, tmp_path: Path
) -> None:
    with FakeOpenAIServer(latency=0.01, reply=split_vote()) as fake:
        async with connect(kind, mode, fake, tmp_path) as client:
            assert client.protocol_version == REVISION[mode]
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert list(tools) == ["debate", "get_debate", "cancel_debate", "list_protocols"]
            debate = tools["debate"]
            assert debate.input_schema["type"] == "object" and "$ref" not in json.dumps(debate.input_schema)
            assert debate.input_schema["required"] == ["question"]
            assert debate.output_schema is not None and "dissent" in debate.output_schema["properties"]

            progress: list[tuple[float, float | None, str | None]] = []

            async def on_progress(done: float, total: float | None, message: str | None) -> None:
                progress.append((done, total, message))

            result = await client.call_tool(
                "debate", {"question": QUESTION, "protocol": "vote@3"}, progress_callback=on_progress
            )
            assert not result.is_error, text(result)
            outcome = DebateOutcome.model_validate(structured(result))
            assert outcome.status == "complete" and outcome.protocol == "vote" and outcome.answer == "B"
            assert outcome.agreement == pytest.approx(2 / 3, abs=1e-3)
            assert [(d.answer, d.confidence, d.reason) for d in outcome.dissent] == [
                ("C", 0.6, "the letter after A is C")
            ]
            assert outcome.confidence == pytest.approx(0.9) and "gave the answer" in (outcome.confidence_from or "")
            assert outcome.calls == 3 == len(fake.requests) and outcome.tokens > 0 and outcome.rounds == 1
            assert outcome.cost_usd is None and outcome.unpriced == ["openai:fake"]  # no price given
            assert "Answer: B" in text(result) and "Dissent:" in text(result)
            # a notification per finished turn and round, in order, the first naming the debate
            assert progress[0][2] == f"debate {outcome.debate_id} started (vote)"
            assert [p[0] for p in progress] == [0, 1, 2, 3, 4] and progress[-1][2] is not None
            assert sum("answered" in (p[2] or "") for p in progress) == 3 and "round 1 done" in (progress[-1][2] or "")

            got = await client.call_tool("get_debate", {"debate_id": outcome.debate_id})
            assert DebateOutcome.model_validate(structured(got)) == outcome
            resource = await client.read_resource(outcome.transcript)
            transcript = DebateResult.model_validate_json(resource.contents[0].text)  # type: ignore[union-attr]
            assert transcript.llm_calls == 3 and transcript.final_answer == "B"
            listed = await client.list_resources()
            assert [r.uri for r in listed.resources] == ["ui://moot/debate.html", outcome.transcript]
            templates = await client.list_resource_templates()
            assert templates.resource_templates[0].uri_template == "moot://debates/{debate_id}"
            # the viewer as an MCP App: advertised, bound to the tools that return a debate, served as HTML
            if mode == "auto":  # 2025-11-25's capabilities have no extensions: its hosts read the tools' _meta
                assert "io.modelcontextprotocol/ui" in (client.server_capabilities.extensions or {})
            assert (
                debate.meta == {"ui": {"resourceUri": "ui://moot/debate.html"}} and tools["list_protocols"].meta is None
            )
            app = (await client.read_resource("ui://moot/debate.html")).contents[0]
            assert app.mime_type == "text/html;profile=mcp-app" and "ui/initialize" in app.text  # type: ignore[union-attr]


@pytest.mark.parametrize(("kind", "mode"), TRANSPORTS)
async def test_cancelling_the_call_cancels_the_debate_and_its_calls(kind: str, mode: str, tmp_path: Path) -> None:
    # A second a call: the cancel has the four calls left (4 s) to stop the debate, on a loaded machine
    # too (at 0.4 s, three test workers on two cores once let all five calls through first).
    with FakeOpenAIServer(latency=1.0) as fake:
        async with connect(kind, mode, fake, tmp_path) as client:
            ids: list[str] = []
            first_turn = anyio.Event()

            async def on_progress(done: float, total: float | None, message: str | None) -> None:
                if message and message.startswith("debate "):
                    ids.append(message.split()[1])
                if done >= 1:
                    first_turn.set()

            async def call() -> None:
                # affirmative-critical: 5 calls one after another (2 rounds of 2, the synthesis)
                await client.call_tool("debate", {"question": QUESTION}, progress_callback=on_progress)

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                with anyio.fail_after(HANG):
                    await first_turn.wait()
                tg.cancel_scope.cancel()
            assert len(ids) == 1

            async def status() -> str:
                got = await client.call_tool("get_debate", {"debate_id": ids[0]})
                return str(structured(got)["status"])

            for _ in range(int(HANG / 0.05)):
                if await status() == "cancelled":
                    break
                await anyio.sleep(0.05)
            made = len(fake.requests)
            await anyio.sleep(1.5)  # more than a call's latency: a debate still running would have called
            assert len(fake.requests) == made < 5
            got = structured(await client.call_tool("get_debate", {"debate_id": ids[0]}))
            assert got["status"] == "cancelled" and "cancelled" in got["error"] and got["calls"] < 5


@pytest.mark.parametrize(("kind", "mode"), [TRANSPORTS[0], TRANSPORTS[3]])
async def test_cancel_debate_stops_a_debate_started_without_waiting(kind: str, mode: str, tmp_path: Path) -> None:
    with FakeOpenAIServer(latency=1.0) as fake:  # a cancel has 4 s to stop the 5 calls, loaded too
        async with connect(kind, mode, fake, tmp_path) as client:
            started = await client.call_tool("debate", {"question": QUESTION, "wait": False})
            first = structured(started)
            assert not started.is_error and first["status"] in ("queued", "running") and first["answer"] is None
            cancelled = await client.call_tool("cancel_debate", {"debate_id": first["debate_id"]})
            assert structured(cancelled)["status"] == "cancelled"
            made = len(fake.requests)
            await anyio.sleep(1.5)
            assert len(fake.requests) == made < 5
            again = await client.call_tool("cancel_debate", {"debate_id": first["debate_id"]})
            assert again.is_error and text(again) == (
                f"cancel_debate: debate {first['debate_id']} already ended (cancelled); nothing to cancel"
            )


async def test_a_debate_cancelled_while_queued_is_said_to_have_no_transcript_not_to_have_one_later(
    tmp_path: Path,
) -> None:
    """Its outcome names the transcript resource; reading it said "read it once it starts", which it
    never will."""
    with FakeOpenAIServer(latency=1.0) as fake:
        async with connect("stdio", "auto", fake, tmp_path, "--max-running", "1") as client:
            await client.call_tool("debate", {"question": QUESTION, "wait": False})
            waiting = structured(await client.call_tool("debate", {"question": QUESTION, "wait": False}))
            assert waiting["status"] == "queued"
            await client.call_tool("cancel_debate", {"debate_id": waiting["debate_id"]})
            with pytest.raises(MCPError) as unread:
                await client.read_resource(waiting["transcript"])
            said = unread.value.error.message
            assert "ended cancelled before it started: it has no transcript" in said and "once it starts" not in said


async def test_moot_mcp_takes_the_question_limit_its_refusal_names(tmp_path: Path) -> None:
    """A question over the limit is refused naming --max-question-chars, which moot mcp takes as
    moot serve does (it named an option moot mcp did not have)."""
    with FakeOpenAIServer(latency=0.01) as fake:
        async with connect("stdio", "auto", fake, tmp_path, "--max-question-chars", "10") as client:
            refused = await client.call_tool("debate", {"question": "Is 7919 a prime number?"})
            said = text(refused)
            assert refused.is_error and "over this server's limit of 10" in said and "--max-question-chars" in said
            assert fake.requests == []


# ------------------------------------------------------------------------------------ refusals


@pytest.mark.parametrize(("kind", "mode"), [TRANSPORTS[1], TRANSPORTS[2]])
async def test_bad_input_gets_one_line_in_the_protocols_shape_and_the_server_goes_on(
    kind: str, mode: str, tmp_path: Path
) -> None:
    with FakeOpenAIServer(latency=0.01) as fake:
        async with connect(kind, mode, fake, tmp_path) as client:
            with pytest.raises(MCPError) as unknown:
                await client.call_tool("debat", {"question": QUESTION})
            assert unknown.value.error.code == -32602
            assert unknown.value.error.message == (
                "unknown tool 'debat'; this server's tools are debate, get_debate, cancel_debate, list_protocols"
            )
            refusals = {
                # arguments against the input schema
                "debate": [
                    ({"question": 5}, "debate: question: Input should be a valid string"),
                    ({"question": QUESTION, "rounds": 3}, "debate: rounds: unknown argument"),
                    ({}, "debate: question: required; add it"),
                    ({"question": QUESTION, "budget": {"max_calls": 0}}, "debate: budget.max_calls: Input should be"),
                    # the schema's JSON types, as a host validating against it would refuse them (they were
                    # read as false and 50), and a number too large (it overflowed a float: an internal error)
                    ({"question": QUESTION, "wait": "no"}, "debate: wait: Input should be a valid boolean"),
                    ({"question": QUESTION, "budget": {"max_calls": "50"}}, "max_calls: Input should be a valid"),
                    ({"question": QUESTION, "budget": {"max_calls": 10**400}}, "of 401 digits is out of range"),
                    ({"question": QUESTION, "budget": {"max_calls": 5.5}}, "max_calls: Input should be a valid int"),
                    # a passage whose source is not text: named there, not as a context entry that is no string
                    ({"question": QUESTION, "context": [{"text": "a", "source": 5}]}, "debate: context[0].source: "),
                    ({"question": QUESTION, "context": [5]}, "debate: context[0]: Input should be a valid string"),
                    # an unknown protocol, a run-level vote, the server's limits (a lone surrogate, which the SDK's
                    # client cannot send: test_lines_the_sdk_cannot_read_... and test_the_http_endpoint_...)
                    ({"question": QUESTION, "protocol": "quorum"}, "debate: protocol: no protocol 'quorum'; use one"),
                    ({"question": QUESTION, "protocol": "vote@uab(budget=4)"}, "is a run-level vote"),
                    ({"question": QUESTION, "protocol": "vote(k=50)"}, "debate: protocol.k: 50 agents is over"),
                    # nested YAML aliases (a frozen server: gigabytes once expanded), digits past Python's
                    ({"question": QUESTION, "protocol": "vote(x=[&a [0,0], &b [*a,*a]])"}, "anchors and aliases"),
                    ({"question": QUESTION, "protocol": "mad(rounds=" + "9" * 5000 + ")"}, "more than 4,300 digits"),
                    ({"question": QUESTION, "budget": {"max_calls": 1000}}, "debate: budget.max_calls: 1000 is over"),
                    ({"question": QUESTION, "model": "openai:other"}, "debate: model: model 'openai:other' is not"),
                ],
                "get_debate": [({"debate_id": "nope"}, "no debate 'nope' on this server")],
                "cancel_debate": [({}, "cancel_debate: debate_id: required; add it")],
                "list_protocols": [({"verbose": True}, "list_protocols: verbose: unknown argument")],
            }
            for tool, cases in refusals.items():
                for arguments, expected in cases:
                    result = await client.call_tool(tool, arguments)
                    message = text(result)
                    assert result.is_error and expected in message and "\n" not in message, (arguments, message)
            assert fake.requests == []  # every refusal came before any model call
            long_id = await client.call_tool("get_debate", {"debate_id": "x" * 100_000})  # (it came back whole)
            assert long_id.is_error and len(text(long_id)) < 300 and "no debate 'xxx" in text(long_id)
            with pytest.raises(MCPError) as no_resource:
                await client.read_resource("moot://debates/nope")
            assert no_resource.value.error.code == -32602 and "no debate 'nope'" in no_resource.value.error.message
            with pytest.raises(MCPError):
                await client.read_resource("file:///etc/passwd")
            assert len((await client.list_tools()).tools) == 4  # still serving


#: A value nested past the JSON parser's recursion limit.
DEEP = "[" * 100_000 + "]" * 100_000


def test_lines_the_sdk_cannot_read_are_answered_and_the_server_goes_on(tmp_path: Path) -> None:
    """The SDK's stdio parser refuses a lone surrogate as if it were not JSON and answers nothing (a
    host would wait forever): moot answers each line it could not read, in the protocol's shape."""
    with FakeOpenAIServer() as fake:
        params = stdio_params(fake)
        proc = subprocess.Popen(
            [params.command, *params.args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=params.env,
            text=True,
        )
        try:

            def ask(line: str) -> dict[str, Any]:
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(line + "\n")
                proc.stdin.flush()
                reply: dict[str, Any] = json.loads(proc.stdout.readline())
                return reply

            hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
            assert ask(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}))["id"] == 1
            assert proc.stdin is not None
            proc.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")
            surrogate = ask(
                '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"debate","arguments":'
                '{"question":"a\\ud800b"}}}'
            )
            assert surrogate["id"] == 2 and surrogate["result"]["isError"] is True
            assert surrogate["result"]["content"][0]["text"] == (
                "debate: question: contains a lone surrogate (U+D800) at position 1; send valid UTF-8"
            )
            # as the SDK's own results in a 2025-11-25 session: no 2026-07-28 field
            assert "resultType" not in surrogate["result"], surrogate
            other = ask('{"jsonrpc":"2.0","id":3,"method":"resources/read","params":{"uri":"moot://debates/\\udc00"}}')
            assert other["id"] == 3 and other["error"]["code"] == -32602 and "params.uri" in other["error"]["message"]
            garbage = ask("this is not JSON")
            assert garbage["id"] is None and garbage["error"]["code"] == -32700
            assert "Parse error: the message is not JSON" in garbage["error"]["message"]
            # a line past --max-body (1,000,000 bytes) is refused, not held: it was read whole, any size
            long = ask('{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"x":"' + "a" * 1_500_000 + '"}}')
            assert long["id"] is None and long["error"]["code"] == -32700
            assert "a message is at most 1000000 bytes" in long["error"]["message"], long
            # bytes that are not UTF-8 were read as U+FFFD and debated; a number too long for Python
            # was called "not UTF-8"
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.buffer.write(
                b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"debate","arguments":'
                b'{"question":"\xff\xfe"}}}\n'
            )
            proc.stdin.buffer.flush()
            latin = json.loads(proc.stdout.readline())
            assert latin["error"]["code"] == -32700 and "(not UTF-8)" in latin["error"]["message"], latin
            # UTF-16 (json.loads reads it from bytes, the SDK does not: it crashed the server) and a BOM
            # (dropped without a word); each answered, and the server goes on
            for odd in ['{"jsonrpc":"2.0","method":"ping","id":"é"}'.encode("utf-16-be"), "\ufeff{}".encode()]:
                proc.stdin.buffer.write(odd + b"\n")
                proc.stdin.buffer.flush()
                refused = json.loads(proc.stdout.readline())
                assert refused["error"]["code"] == -32700, refused
            huge = ask('{"jsonrpc":"2.0","id":8,"method":"tools/list","params":{"x":' + "9" * 5000 + "}}")
            assert huge["error"]["code"] == -32700 and "not UTF-8" not in huge["error"]["message"], huge
            assert "4300 digits" in huge["error"]["message"]
            # JSON that is no JSON-RPC message: the SDK dropped each without a word (a host waited for ever)
            for line, said in [
                ('{"jsonrpc":"2.0","id":1.5,"method":"tools/list"}', "id must be a string or an integer"),
                ('{"jsonrpc":"1.0","id":9,"method":"tools/list"}', 'jsonrpc must be "2.0"'),
                ('[{"jsonrpc":"2.0","id":9,"method":"tools/list"}]', "a batch"),
                ('"tools/list"', "not a JSON-RPC message"),
            ]:
                invalid = ask(line)
                assert invalid["error"]["code"] == -32600 and said in invalid["error"]["message"], (line, invalid)
            deep = ask('{"jsonrpc":"2.0","id":5,"method":"tools/list","params":{"x":' + DEEP + "}}")
            assert (
                deep["error"]["code"] == -32600 and "nests deeper" in deep["error"]["message"]
            )  # (it ended the session)
            # Deep enough for the SDK's parser (about 200 levels), not for Python's: no answer came.
            middling = ask(
                '{"jsonrpc":"2.0","id":6,"method":"tools/list","params":{"x":' + "[" * 500 + "]" * 500 + "}}"
            )
            assert middling["id"] == 6 and middling["error"]["code"] == -32600, middling
            listed = ask('{"jsonrpc":"2.0","id":4,"method":"tools/list"}')
            assert len(listed["result"]["tools"]) == 4
            assert fake.requests == []
        finally:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(HANG)
            assert proc.stderr is not None
            errors = proc.stderr.read()
        assert proc.returncode == 0 and "Traceback" not in errors, errors


async def test_stdin_is_read_no_further_ahead_than_the_server_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its reading thread queued every line a host wrote, however fast, however many, before the
    server took them: the process's memory grew with them. It now waits once a few are queued, so
    a host writing faster than the server reads is held by the pipe."""
    from moot.server.mcp.malformed import StdinLines

    read_end, write_end = os.pipe()
    monkeypatch.setattr(sys, "stdin", os.fdopen(read_end, "rb"))
    lines = StdinLines()
    lines.replies = object()  # type: ignore[assignment]  (only lines that pass are asked for here)
    lines.ready.set()
    read = 0
    source = lines._read

    def counted() -> Iterator[bytes]:
        nonlocal read
        for line in source():
            read += 1
            yield line

    monkeypatch.setattr(lines, "_read", counted)
    message = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode() + b"\n"
    try:
        os.write(write_end, message * 1000)  # (fits the pipe: the thread alone decides how far it reads ahead)
        taken = lines.__aiter__()
        assert json.loads(await taken.__anext__())["method"] == "ping"
        await anyio.sleep(0.5)  # the reading thread's time to read on, as far as it may
        assert read <= StdinLines.AHEAD + 2, read
        for _ in range(100):
            await taken.__anext__()
        await anyio.sleep(0.2)
        assert 101 <= read <= 101 + StdinLines.AHEAD + 2, read
    finally:
        os.close(write_end)


def test_a_line_at_the_limit_passes_and_one_over_it_is_refused_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """A message of exactly --max-body bytes passes whatever its line ending (with \\r\\n it was
    refused); one over it is refused, and the next line is read as it is."""
    from moot.server.mcp.malformed import TOO_LONG, StdinLines

    read_end, write_end = os.pipe()
    monkeypatch.setattr(sys, "stdin", os.fdopen(read_end, "rb"))
    lines = StdinLines(max_bytes=1024)
    os.write(write_end, b"a" * 1024 + b"\r\n" + b"b" * 1024 + b"\n" + b"c" * 1025 + b"\n" + b"d" * 5000 + b"\nnext\n")
    os.close(write_end)
    got = list(lines._read())
    assert got == [b"a" * 1024 + b"\r\n", b"b" * 1024 + b"\n", TOO_LONG, TOO_LONG, b"next\n"]


@pytest.mark.parametrize("end", [signal.SIGTERM, signal.SIGINT, "stdin closed", "SIGTERM twice"])
def test_moot_mcp_stops_at_sigterm_or_ctrl_c_while_the_host_keeps_stdin_open(tmp_path: Path, end: Any) -> None:
    """It stopped serving but went on until stdin closed (the read of stdin could not be cancelled),
    holding its --db lock: a host that restarts it with SIGTERM got "--db is in use". It now ends
    at once with 130, as every command at Ctrl-C or SIGTERM, its lock released. The debate a
    `debate` call was waiting for is stored as interrupted, as docs/mcp.md says, not as cancelled
    by a request (what it was, signal or end of stdin, until a trial found it)."""
    import sqlite3
    import time

    db = tmp_path / "m.sqlite"
    with FakeOpenAIServer(latency=5.0) as fake:
        params = stdio_params(fake, "--db", str(db))
        proc = subprocess.Popen(
            [params.command, *params.args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=params.env
        )
        try:
            assert proc.stdin is not None and proc.stdout is not None

            def send(message: dict[str, Any]) -> None:
                assert proc.stdin is not None
                proc.stdin.write((json.dumps({"jsonrpc": "2.0", **message}) + "\n").encode())
                proc.stdin.flush()

            hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
            send({"id": 1, "method": "initialize", "params": hello})
            assert json.loads(proc.stdout.readline())["id"] == 1
            send({"method": "notifications/initialized"})
            send({"id": 2, "method": "tools/call", "params": {"name": "debate", "arguments": {"question": "Q?"}}})
            deadline = time.monotonic() + HANG
            while not fake.requests and time.monotonic() < deadline:  # the debate's first call: it runs
                time.sleep(0.05)
            if end == "stdin closed":
                proc.stdin.close()
                assert proc.wait(HANG) == 0
                # the call is answered with its debate as the stop left it (it was cut without a reply)
                replies = [json.loads(line) for line in proc.stdout.read().splitlines()]
                (answer,) = [r for r in replies if r.get("id") == 2]
                assert answer["result"]["isError"] is True and answer["result"]["structuredContent"]["status"] == (
                    "interrupted"
                ), answer
            elif end == "SIGTERM twice":  # the second while the first one's stop runs (it killed the process)
                proc.send_signal(signal.SIGTERM)
                time.sleep(0.2)
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(HANG) == 130
            else:
                proc.send_signal(end)
                assert proc.wait(HANG) == 130  # (stdin still open)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        with contextlib.closing(sqlite3.connect(db)) as stored:
            assert [row[0] for row in stored.execute("SELECT status FROM debates")] == ["interrupted"]
        again = subprocess.run(
            [params.command, *params.args], input=b"", capture_output=True, env=params.env, timeout=HANG
        )
        assert again.returncode == 0, again.stderr  # the lock was released


#: How many times a session is played to its end of stdin: the replies it lost depended on timing.
ROUNDS = 4
#: The envelope a 2026-07-28 request carries instead of the ``initialize`` handshake.
ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {},
}


def requests_then_eof(fake: FakeOpenAIServer, lines: list[str], *args: str) -> dict[Any, dict[str, Any]]:
    """``moot mcp`` given ``lines`` at once and then the end of stdin (a host that closes stdin after
    its last request, as MCP's stdio shutdown does): its replies by id (a reply with no id, the parse
    error's, under None), each id answered once; it ends with 0, with no traceback."""
    params = stdio_params(fake, *args)
    ran = subprocess.run(
        [params.command, *params.args],
        input="".join(line + "\n" for line in lines),
        capture_output=True,
        text=True,
        env=params.env,
        timeout=HANG,
    )
    assert ran.returncode == 0 and "Traceback" not in ran.stderr, ran.stderr
    replies = [json.loads(line) for line in ran.stdout.splitlines()]
    answers = [r for r in replies if "method" not in r]  # (not the notifications)
    by_id = {r["id"]: r for r in answers}
    assert len(by_id) == len(answers), answers  # none answered twice
    return by_id


def legacy_session(*requests: dict[str, Any]) -> list[str]:
    """``requests`` (ids from 2) after the 2025-11-25 handshake (id 1)."""
    hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    opening: list[dict[str, Any]] = [
        {"id": 1, "method": "initialize", "params": hello},
        {"method": "notifications/initialized"},
    ]
    return [json.dumps({"jsonrpc": "2.0", **r}) for r in [*opening, *requests]]


QUICK = [  # answered without a model
    {"id": 2, "method": "tools/list"},
    {"id": 3, "method": "ping"},
    {"id": 4, "method": "tools/call", "params": {"name": "list_protocols", "arguments": {}}},
    {"id": 5, "method": "tools/call", "params": {"name": "get_debate", "arguments": {"debate_id": "nope"}}},
]


@pytest.mark.parametrize("garbage", [False, True], ids=["clean", "garbage-first"])
def test_every_request_read_before_stdin_closes_is_answered(garbage: bool) -> None:
    """The SDK's session took the end of stdin for the host gone and cancelled the calls it had
    read: a reply being written was lost (ping's, in 6 runs of 6), one not begun got at best
    "Connection closed". Closing stdin is the host's shutdown (it reads stdout on, and waits for the
    exit): every request read is answered first, then the process ends with 0."""
    with FakeOpenAIServer() as fake:
        lines = (["garbage"] if garbage else []) + legacy_session(*QUICK)
        for _ in range(ROUNDS):
            replies = requests_then_eof(fake, lines)
            assert sorted(k for k in replies if k is not None) == [1, 2, 3, 4, 5], replies
            assert (None in replies) == garbage
            assert len(replies[2]["result"]["tools"]) == 4
            assert replies[3]["result"] == {}
            assert (
                replies[4]["result"].get("isError") is not True and "vote" in replies[4]["result"]["content"][0]["text"]
            )
            assert replies[5]["result"]["isError"] is True
            assert "no debate 'nope'" in replies[5]["result"]["content"][0]["text"]
        assert fake.requests == []


def test_every_request_read_before_stdin_closes_is_answered_at_2026_07_28() -> None:
    """The same at 2026-07-28, whose requests carry their envelope (no handshake)."""
    requests = [
        {"id": 1, "method": "tools/list", "params": {"_meta": ENVELOPE}},
        {"id": 2, "method": "tools/call", "params": {"name": "list_protocols", "arguments": {}, "_meta": ENVELOPE}},
        {"id": 3, "method": "resources/templates/list", "params": {"_meta": ENVELOPE}},
        {
            "id": 4,
            "method": "tools/call",
            "params": {"name": "get_debate", "arguments": {"debate_id": "x"}, "_meta": ENVELOPE},
        },
    ]
    with FakeOpenAIServer() as fake:
        for _ in range(ROUNDS):
            replies = requests_then_eof(fake, [json.dumps({"jsonrpc": "2.0", **r}) for r in requests])
            assert sorted(replies) == [1, 2, 3, 4], replies
            assert all("result" in r for r in replies.values()), replies


def test_a_debate_called_just_before_stdin_closes_is_answered_as_the_stop_leaves_it() -> None:
    """A ``debate`` read just before the end of stdin, its models slow: the stop ends it (interrupted,
    as docs/mcp.md says of a debate running when the host closes stdin; or refused, had the stop
    come before it was queued), and its call is answered so, as are the quick calls beside it."""
    debate = {"id": 6, "method": "tools/call", "params": {"name": "debate", "arguments": {"question": QUESTION}}}
    with FakeOpenAIServer(latency=HANG) as fake:
        for _ in range(ROUNDS):
            replies = requests_then_eof(fake, legacy_session(*QUICK, debate))
            assert sorted(replies) == [1, 2, 3, 4, 5, 6], replies
            said = replies[6]["result"]
            assert said["isError"] is True, said
            text = said["content"][0]["text"]
            stopped = said.get("structuredContent", {}).get("status") in ("interrupted", "queued")
            assert stopped or "the server is stopping and takes no new debate" in text, said


def test_the_http_endpoint_needs_the_key_and_answers_unreadable_messages(tmp_path: Path) -> None:
    with FakeOpenAIServer() as fake:
        settings = ServerSettings(
            db=tmp_path / "moot.sqlite", models=["openai:fake"], base_url=fake.base_url, api_key=SecretStr(KEY)
        )
        with ServerThread(settings) as server:
            url = server.url + "/mcp"
            assert httpx.get(url).status_code == 401  # the GET stream too, not only the POSTs
            assert httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).status_code == 401
            headers = {
                "Authorization": f"Bearer {KEY}",
                "Accept": "application/json, text/event-stream",
                "Content-Type": "application/json",
            }
            garbage = httpx.post(url, content="not json", headers=headers)
            assert garbage.status_code == 400 and garbage.json()["error"]["code"] == -32700  # the SDK's parse error
            body = (
                '{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"debate","arguments":'
                '{"question":"\\ud800"}}}'
            )
            surrogate = httpx.post(url, content=body, headers=headers)
            assert surrogate.status_code == 200 and surrogate.json()["id"] == 7
            assert surrogate.json()["result"]["isError"] is True
            assert "lone surrogate" in surrogate.json()["result"]["content"][0]["text"]
            # a tool's result carries resultType from 2026-07-28 on only, as the SDK's own results do
            for version, carried in (("2025-11-25", False), ("2026-07-28", True)):
                said = httpx.post(url, content=body, headers={**headers, "MCP-Protocol-Version": version}).json()
                assert ("resultType" in said["result"]) is carried, (version, said)
            deep = httpx.post(
                url, content='{"jsonrpc":"2.0","id":8,"method":"tools/list","params":' + DEEP + "}", headers=headers
            )
            assert deep.status_code == 400 and deep.json()["error"]["code"] == -32600  # (a 500 and a traceback before)
            assert fake.requests == []
            keyed = httpx.get(server.url + "/v1/protocols", headers={"Authorization": f"Bearer {KEY}"})
            assert keyed.status_code == 200


LOADED_BY_THE_FIRST_REQUEST = """
import sys
from fastapi.testclient import TestClient
from pydantic import SecretStr
from moot.server import ServerSettings
from moot.server.http.app import create_app
key = SecretStr("k" * 20)
settings = ServerSettings(db=sys.argv[1], models=["openai:fake"], base_url="http://127.0.0.1:9/v1", api_key=key)
auth = {"Authorization": "Bearer " + "k" * 20}
with TestClient(create_app(settings), base_url="http://127.0.0.1:8000") as client:
    assert client.get("/v1/protocols", headers=auth).status_code == 200
    before = sorted(m for m in sys.modules if m == "mcp" or m.startswith(("mcp.", "moot.server.mcp")))
    reply = client.post("/mcp", content="not json", headers={**auth, "Content-Type": "application/json"})
    print(before, reply.status_code, "moot.server.mcp" in sys.modules)
"""


def test_the_mcp_sdk_is_loaded_by_the_first_request_to_mcp_not_by_the_server_start(tmp_path: Path) -> None:
    """A server whose clients never use /mcp never imports the SDK (0.8 s of every start); the first
    request to /mcp has it loaded and is answered by it (the SDK's parse error)."""
    out = subprocess.run(
        [sys.executable, "-c", LOADED_BY_THE_FIRST_REQUEST, str(tmp_path / "moot.sqlite")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": SRC},
        timeout=HANG,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]", "400", "True"]


def test_an_mcp_sdk_that_will_not_load_is_a_503_naming_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from moot.server.http import mcp_mount

    real = mcp_mount.importlib.import_module

    def broken(name: str, package: str | None = None) -> Any:
        if name == "moot.server.mcp":
            raise ImportError("no module named mcp_types")
        return real(name, package)

    monkeypatch.setattr(mcp_mount.importlib, "import_module", broken)
    settings = ServerSettings(db=tmp_path / "moot.sqlite", models=["openai:fake"], base_url="http://127.0.0.1:9/v1")
    with ServerThread(settings) as server:
        for _ in range(2):  # each request tries again, and is told why it failed
            reply = httpx.post(server.url + "/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
            assert reply.status_code == 503
            error = reply.json()["error"]
            assert error["code"] == "mcp_unavailable"
            assert error["message"] == "the MCP endpoint could not start: ImportError: no module named mcp_types"
        assert httpx.get(server.url + "/v1/protocols").status_code == 200  # the rest of the server is unharmed
        monkeypatch.setattr(mcp_mount.importlib, "import_module", real)  # the SDK can be loaded now
        reply = httpx.post(server.url + "/mcp", content="not json", headers={"Content-Type": "application/json"})
        assert reply.status_code == 400 and reply.json()["error"]["code"] == -32700  # the SDK's own parse error


def test_mcp_answers_in_each_lifespan_of_the_same_app(tmp_path: Path) -> None:
    """The SDK's session manager runs once per instance: an app started twice (two test clients, one
    after the other) answers an MCP handshake in both lifespans."""
    from fastapi.testclient import TestClient

    from moot.server import create_app

    settings = ServerSettings(db=tmp_path / "moot.sqlite", models=["openai:fake"], base_url="http://127.0.0.1:9/v1")
    app = create_app(settings)
    hello = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    for _ in range(2):
        with TestClient(app, base_url="http://127.0.0.1:8000", raise_server_exceptions=False) as client:
            reply = client.post("/mcp", json=hello, headers=headers)
            assert reply.status_code == 200, reply.text
            assert '"protocolVersion":"2025-11-25"' in reply.text.replace(" ", "")


async def test_a_key_in_a_debate_never_comes_back(tmp_path: Path) -> None:
    """The server's key, typed into a question and repeated by the agents, is redacted from what the
    tools return, as from the store and the /v1 routes: a running debate's outcome too, which is read
    from memory before the store's redaction."""
    answers = iter(["B", "B", "C"] * 20)

    def leaky(request: dict[str, Any]) -> str:
        answer = next(answers)
        return json.dumps({"reasoning": f"{KEY} looks strong, so {answer}", "answer": answer, "confidence": 0.7})

    with FakeOpenAIServer(latency=0.5, reply=leaky) as fake:
        async with connect("http", "auto", fake, tmp_path) as client:
            question = {"question": f"Is {KEY} a strong key?", "protocol": "society-of-minds", "wait": False}
            debate_id = structured(await client.call_tool("debate", question))["debate_id"]
            seen: list[str] = []
            for _ in range(int(HANG / 0.05)):
                got = await client.call_tool("get_debate", {"debate_id": debate_id})
                outcome = structured(got)
                if outcome["status"] == "running" and outcome["dissent"]:  # round 1 done, round 2 running
                    seen.append(json.dumps(outcome) + text(got))
                if outcome["status"] not in ("queued", "running"):
                    seen.append(json.dumps(outcome) + text(got))
                    break
                await anyio.sleep(0.05)
            assert len(seen) >= 2 and all("***" in s and KEY not in s for s in seen), seen
            transcript = await client.read_resource(f"moot://debates/{debate_id}")
            assert KEY not in transcript.contents[0].text  # type: ignore[union-attr]
            refused = await client.call_tool("debate", {"question": "Q", "model": f"openai:{KEY}"})
            assert refused.is_error and KEY not in text(refused) and "***" in text(refused)


def test_arguments_are_read_as_json_schema_reads_them() -> None:
    """Strict to the schema's types ("50" is no integer), but 5.0 is one, as JSON Schema says; an error
    response with a null id (the answer to a message whose id could not be read) is a message."""
    from moot.server.mcp.malformed import PASS, unreadable
    from moot.server.mcp.tools import DebateArgs, parse_args

    assert parse_args("debate", {"question": "Q?", "budget": {"max_calls": 5.0}}, DebateArgs).budget.max_calls == 5
    null_id = '{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}'
    assert unreadable(null_id, not_json=True) == PASS


def test_unreadable_and_lone_surrogate_find_where_the_problem_is() -> None:
    assert not_text({"a": ["ok", {"b": "x\udfffy"}]}) == (
        "a[1].b: contains a lone surrogate (U+DFFF) at position 1; send valid UTF-8"
    )
    # a NUL, which no PostgreSQL text holds: refused as an argument by its place, as over HTTP
    assert not_text({"question": "a\x00b"}) == (
        "question: contains a NUL character (U+0000) at position 1, which is not text; remove it"
    )
    assert not_text({"q": "a pair \U0001f600 is text"}) is None
    assert unreadable('{"jsonrpc":"2.0","id":1,"method":"tools/list"}', not_json=True) == "pass"
    assert unreadable("{", not_json=False) == "pass"  # the SDK answers that itself (over HTTP)
    assert unreadable('{"jsonrpc":"2.0","method":"notifications/x","params":{"a":"\\ud800"}}', not_json=True) is None
    schema = inline_refs({"$defs": {"B": {"type": "integer"}}, "properties": {"b": {"$ref": "#/$defs/B"}}})
    assert schema == {"properties": {"b": {"type": "integer"}}}


# ------------------------------------------------------------------------------------ the viewer

#: Just enough of a browser for the viewer's script: elements with text and children, and a host
#: (its parent window) that records what the viewer posts and delivers what the host sends.
DOM_SHIM = r"""
const sent = [], listeners = [];
function element(tag) {
  return {
    tag, className: "", style: {}, children: [], text: "",
    set textContent(v) { this.text = v; },
    get textContent() { return [this.text, ...this.children.map((c) => c.textContent)].join(" "); },
    appendChild(c) { this.children.push(c); return c; },
    replaceChildren(...c) { this.children = c; },
    addEventListener() {},
  };
}
const root = element("main"), host = { postMessage(m) { sent.push(m); } };
globalThis.window = { parent: host, addEventListener(type, f) { listeners.push(f); } };
globalThis.document = { getElementById: () => root, createElement: element, documentElement: { scrollHeight: 100 } };
const deliver = (data) => listeners.forEach((f) => f({ source: host, data }));
"""

HOST_SCRIPT = r"""
(async () => {
  const init = sent.find((m) => m.method === "ui/initialize");
  const agreed = { protocolVersion: init.params.protocolVersion, hostCapabilities: {} };
  deliver({ jsonrpc: "2.0", id: init.id, result: agreed });
  await new Promise((r) => setTimeout(r, 10));
  deliver({ jsonrpc: "2.0", method: "ui/notifications/tool-input", params: { arguments: { question: "Q?" } } });
  const waiting = root.textContent;
  const result = { content: [], structuredContent: OUTCOME };
  deliver({ jsonrpc: "2.0", method: "ui/notifications/tool-result", params: result });
  const shown = root.textContent;
  deliver({ jsonrpc: "2.0", id: 99, method: "ui/resource-teardown", params: {} });
  console.log(JSON.stringify({ sent, waiting, shown }));
})();
"""


def test_the_viewer_app_talks_to_its_host_and_shows_the_result() -> None:
    """The MCP App's script under node, its host played by the test: it initializes, then draws the
    result the host hands it, as text (the debate's own text is never HTML)."""
    import re
    import shutil

    from moot.server.mcp import APP_URI

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed here (the viewer's script runs under it)")
    assert APP_URI == "ui://moot/debate.html"
    html = (Path(SRC) / "moot" / "server" / "static" / "mcp-app.html").read_text(encoding="utf-8")
    script = re.search(r"<script>(.*)</script>", html, re.S)
    assert script is not None and "innerHTML" not in html
    outcome = {
        "debate_id": "abc", "status": "running", "protocol": "vote", "question": "Q?", "model": "m", "answer": "B",
        "agreement": 2 / 3, "confidence": 0.9, "rounds": 1, "calls": 3, "tokens": 270, "cost_usd": None,
        "elapsed_s": 0.5, "transcript": "moot://debates/abc",
        "dissent": [{"name": "Agent 3", "answer": "C", "reason": "<b>C</b> follows"}],
    }  # fmt: skip
    program = DOM_SHIM + script.group(1) + HOST_SCRIPT.replace("OUTCOME", json.dumps(outcome))
    ran = subprocess.run([node, "-e", program], capture_output=True, text=True, timeout=HANG)
    assert ran.returncode == 0, ran.stderr
    seen = json.loads(ran.stdout)
    methods = [m.get("method") for m in seen["sent"]]
    assert methods[:2] == ["ui/initialize", "ui/notifications/initialized"]
    assert seen["sent"][0]["params"]["protocolVersion"] == "2026-01-26"
    assert "Q?" in seen["waiting"] and "debating" in seen["waiting"]
    for part in ("B", "Agreement 67%", "Confidence 90%", "Agent 3: C (<b>C</b> follows)", "Refresh", "3 calls"):
        assert part in seen["shown"], (part, seen["shown"])
    assert {"jsonrpc": "2.0", "id": 99, "result": {}} in seen["sent"]


# ------------------------------------------------------------------------------------ catalogue


def write_tuned(path: Path) -> Path:
    import yaml

    evidence = {
        "chosen": "vote@3",
        "model": "openai:fake",
        "objective": "accuracy",
        "reason": "the most accurate within the budget",
        "tuning_accuracy": 0.8,
        "tuning_items": 40,
        "data": "mytask.jsonl",
        "data_fingerprint": "0123456789abcdef",
        "date": "2026-11-20T10:00:00Z",
    }
    path.write_text(yaml.safe_dump({"preset": "vote", "with": {"k": 3}, "tuned": evidence}), encoding="utf-8")
    return path


async def test_list_protocols_gives_each_presets_calls_and_the_tuned_evidence(tmp_path: Path) -> None:
    with FakeOpenAIServer(latency=0.01) as fake:
        tuned = str(write_tuned(tmp_path / "tuned.yaml"))
        async with connect("stdio", "auto", fake, tmp_path, "--tuned", tuned) as client:
            result = await client.call_tool("list_protocols", {})
            catalogue = structured(result)
            by = {p["name"]: p for p in catalogue["protocols"]}
            assert list(by)[:2] == ["auto", "vote@3"] and by["auto"]["tuned"]["chosen"] == "vote@3"
            assert "chosen by moot tune for openai:fake" in by["auto"]["evidence"] and by["auto"]["calls"] == 3
            assert by["affirmative-critical"]["calls"] == 5
            assert by["mad"]["parameters"] == {"rounds": 3, "temperature": 0.0}
            assert by["vote"]["tuned"] is None and catalogue["models"] == ["openai:fake"]
            assert "vote: 5 calls" in text(result)
            ran = structured(await client.call_tool("debate", {"question": QUESTION, "protocol": "auto"}))
            assert ran["status"] == "complete" and ran["calls"] == 3 == len(fake.requests)
            # (it said "no protocol 'auto' (auto is ...: serve one with --tuned); use one of auto, ...")
            refused = await client.call_tool("debate", {"question": QUESTION, "protocol": "auto(rounds=2)"})
            assert refused.is_error and "'auto' is the protocol moot tune chose" in text(refused)
            assert "takes no parameters" in text(refused) and "no protocol" not in text(refused)


def test_moot_mcp_refuses_bad_options_in_one_line(tmp_path: Path) -> None:
    ran = subprocess.run(
        [sys.executable, "-m", "moot", "mcp", "--models", "gpt-4o"],
        env=env(),
        capture_output=True,
        text=True,
        timeout=HANG,
    )
    assert ran.returncode == 2 and ran.stdout == ""  # nothing on the protocol's stream
    assert ran.stderr.count("\n") == 1 and "unknown model spec 'gpt-4o'" in ran.stderr


# ------------------------------------------------------------------------------------ embedded


@pytest.fixture
def tiny() -> Iterator[None]:
    if not is_installed(CATALOG["smollm2-135m"]):
        pytest.skip("embedded:smollm2-135m is not installed (make test installs it: moot models install smollm2-135m)")
    yield


@pytest.mark.embedded
async def test_a_debate_on_the_embedded_model_end_to_end(tiny: None, tmp_path: Path) -> None:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "moot", "mcp", "--models", "embedded:smollm2-135m"], env=env()
    )
    async with Client(params, read_timeout_seconds=1800) as client:
        result = await client.call_tool(
            "debate",
            {
                "question": "What is the capital of France?",
                "context": [{"text": "Paris is the capital of France.", "source": "atlas"}],
                "protocol": "vote(k=2,max_tokens=48)",
                "budget": {"max_total_tokens": 4000},
            },
        )
        outcome = DebateOutcome.model_validate(structured(result))
        # Two samples, and a repair call for each reply the tiny model leaves without its required
        # reasoning (a parse failure, repaired once): at most 4 calls.
        assert outcome.model == "embedded:smollm2-135m" and 2 <= outcome.calls <= 4
        assert 0 < outcome.tokens <= 4000 and outcome.cost_usd == 0
        assert outcome.status in ("complete", "failed")  # a 135M model may give no typed answer; the path ran
        transcript = await client.read_resource(outcome.transcript)
        debate = DebateResult.model_validate_json(transcript.contents[0].text)  # type: ignore[union-attr]
        # A turn's usage holds its repair's too: at most two replies of 48 tokens.
        assert all(t.model == "embedded:smollm2-135m" and t.usage.completion_tokens <= 2 * 48 for t in debate.turns())
