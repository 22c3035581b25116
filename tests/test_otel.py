"""OpenTelemetry traces through the engine's event handler: the SDK's in-memory exporter, and the
CLI's OTLP/HTTP export to a loopback collector."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from typer.testing import CliRunner

from moot.cli.main import app
from moot.core import Budget, DebateTask, DebateTimeout, Engine
from moot.core.types import ContextChunk
from moot.integrations.otel import DebateTracer
from moot.models.base import ModelConfigError, RetryPolicy, TransientModelError
from moot.models.scripted import ScriptedModel
from moot.protocols import get_preset

SECRET = "sk-test-abcdefghijklmnopqrstuvwxyz"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


def tracer(exporter: InMemorySpanExporter, **kw: Any) -> DebateTracer:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return DebateTracer(provider, **kw)


def by_name(spans: tuple[ReadableSpan, ...], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith(prefix)]


def all_attribute_text(spans: tuple[ReadableSpan, ...]) -> str:
    return json.dumps([dict(s.attributes or {}) for s in spans] + [s.status.description for s in spans], default=str)


@pytest.mark.req("S000-LOGS")
async def test_a_debate_is_a_span_with_a_span_per_round_and_per_turn(exporter: InMemorySpanExporter) -> None:
    spec = get_preset("society-of-minds").model_copy(update={"rounds": 2})
    reply = {"reasoning": "17*24", "answer": "408", "confidence": 0.9}
    model = ScriptedModel([reply] * 6, name="openai:gpt-4o-mini")
    engine = Engine(spec, model, on_event=tracer(exporter))
    result = await engine.run(DebateTask(question=f"What is 17 * 24? {SECRET}", reference="408"))
    spans = exporter.get_finished_spans()
    [debate] = by_name(spans, "invoke_workflow")
    rounds = by_name(spans, "round ")
    turns = by_name(spans, "chat")
    assert debate.name == "invoke_workflow society-of-minds" and len(rounds) == 2 and len(turns) == 6
    assert all(r.parent is not None and r.parent.span_id == debate.context.span_id for r in rounds)
    round_ids = {r.context.span_id: r.attributes["moot.round"] for r in rounds}  # type: ignore[index]
    for t in turns:
        attrs = dict(t.attributes or {})
        assert t.parent is not None and round_ids[t.parent.span_id] == attrs["moot.round"]
        assert t.name == "chat gpt-4o-mini" and attrs["gen_ai.operation.name"] == "chat"
        assert attrs["gen_ai.provider.name"] == "openai" and attrs["gen_ai.request.model"] == "gpt-4o-mini"
        assert attrs["gen_ai.usage.input_tokens"] > 0 and attrs["gen_ai.usage.output_tokens"] > 0
        assert attrs["gen_ai.response.finish_reasons"] == ("stop",) and attrs["moot.calls"] == 1
        assert attrs["gen_ai.agent.id"] == attrs["moot.participant"] and attrs["moot.turn.kind"] == "debate"
        assert t.status.status_code == StatusCode.UNSET
    d = dict(debate.attributes or {})
    assert d["moot.protocol"] == "society-of-minds" and d["moot.stop_reason"] == "max_rounds"
    assert d["moot.status"] == "complete" and d["moot.decision.kind"] == "vote"
    assert d["moot.decision.answer"] == "408" and d["moot.decision.confidence"] == 1.0
    assert d["moot.llm_calls"] == result.llm_calls == 6
    assert d["gen_ai.usage.input_tokens"] == result.usage.prompt_tokens
    # no content unless asked, so neither the question nor the (redacted anyway) key is recorded
    text = all_attribute_text(spans)
    assert "gen_ai.input.messages" not in text and "17 * 24" not in text and SECRET not in text


async def test_content_is_recorded_only_when_asked_and_keys_never(exporter: InMemorySpanExporter) -> None:
    spec = get_preset("affirmative-critical").model_copy(update={"rounds": 1})
    model = ScriptedModel([f"Affirmative with {SECRET}", "Critical", "Synthesis"])
    engine = Engine(spec, model, on_event=tracer(exporter, capture_content=True))
    await engine.run(DebateTask(question=f"What is RAG? key {SECRET}", context=[ContextChunk(text="RAG is...")]))
    spans = exporter.get_finished_spans()
    text = all_attribute_text(spans)
    assert SECRET not in text and "***" in text
    [decision] = [s for s in by_name(spans, "chat") if (s.attributes or {})["moot.turn.kind"] == "decision"]
    [debate] = by_name(spans, "invoke_workflow")
    assert decision.parent is not None and decision.parent.span_id == debate.context.span_id
    messages = json.loads(str(decision.attributes["gen_ai.input.messages"]))  # type: ignore[index]
    assert messages[0]["role"] == "system" and messages[1]["parts"][0]["type"] == "text"
    output = json.loads(str(decision.attributes["gen_ai.output.messages"]))  # type: ignore[index]
    assert output == [{"role": "assistant", "parts": [{"type": "text", "content": "Synthesis"}]}]
    assert debate.attributes["moot.final_answer"] == "Synthesis"  # type: ignore[index]
    assert "What is RAG?" in str(debate.attributes["moot.question"])  # type: ignore[index]


async def test_content_capture_follows_the_genai_environment_switch(
    exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    assert tracer(exporter).capture_content is True
    assert tracer(exporter, capture_content=False).capture_content is False
    monkeypatch.delenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT")
    assert tracer(exporter).capture_content is False


async def test_failures_retries_and_timeouts_are_in_the_spans(exporter: InMemorySpanExporter) -> None:
    spec = get_preset("affirmative-critical").model_copy(update={"rounds": 1})
    model = ScriptedModel([TransientModelError("503 busy"), ModelConfigError(f"bad key {SECRET}"), "A", "S"])
    model.retry = RetryPolicy(max_attempts=3, base_delay_s=0, max_delay_s=0)
    await Engine(spec, model, on_event=tracer(exporter)).run("Q?")
    turns = by_name(exporter.get_finished_spans(), "chat")
    failed = [t for t in turns if t.status.status_code == StatusCode.ERROR]
    assert len(failed) == 1 and (failed[0].attributes or {})["error.type"] == "model_error"
    assert SECRET not in (failed[0].status.description or "") and "bad key" in (failed[0].status.description or "")
    retried = [t for t in turns if t.events]
    assert [e.name for e in retried[0].events] == ["moot.retry"] and retried[0].events[0].attributes == {
        "moot.attempt": 2,
        "error.message": "503 busy",
    }
    exporter.clear()
    slow = ScriptedModel(["A", "B", "S"], latency=30)
    spec = spec.model_copy(update={"budget": Budget(timeout_s=0.2)})
    with pytest.raises(DebateTimeout):
        await Engine(spec, slow, on_event=tracer(exporter)).run("Q?")
    spans = exporter.get_finished_spans()
    [debate] = by_name(spans, "invoke_workflow")
    assert debate.status.status_code == StatusCode.ERROR and (debate.attributes or {})["moot.stop_reason"] == "timeout"
    cancelled = by_name(spans, "chat")
    assert len(cancelled) == 2 and all((t.attributes or {})["error.type"] == "cancelled" for t in cancelled)
    assert len(by_name(spans, "round ")) == 1  # every span is ended, none left open


async def test_concurrent_debates_through_one_tracer_are_separate_traces(exporter: InMemorySpanExporter) -> None:
    handler = tracer(exporter)
    spec = get_preset("single")
    reply = {"reasoning": "r", "answer": "A", "confidence": 0.5}
    await asyncio.gather(
        *(Engine(spec, ScriptedModel([reply], latency=0.01), on_event=handler).run(f"Q{i}?") for i in range(3))
    )
    spans = exporter.get_finished_spans()
    debates = by_name(spans, "invoke_workflow")
    assert len(debates) == 3 and len({d.context.trace_id for d in debates}) == 3
    for d in debates:
        children = [s for s in spans if s.context.trace_id == d.context.trace_id]
        assert len(children) == 3  # the debate, its round, its turn
    assert handler._open == {}


class _Collector(BaseHTTPRequestHandler):
    received: ClassVar[list[bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[str]:
    _Collector.received = []
    server = HTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_cli_trace_exports_over_otlp_http(tmp_path: Path, collector: str) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    script = tmp_path / "r.json"
    script.write_text(json.dumps(["A1", "C1", "A2", "C2", "Final"]))
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector, "OTEL_SERVICE_NAME": "moot-test"}
    result = CliRunner().invoke(app, ["debate", "Q?", "-m", f"scripted:{script}", "--trace", "-q"], env=env)
    assert result.exit_code == 0, result.output
    names = []
    for body in _Collector.received:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for rs in request.resource_spans:
            service = {a.key: a.value.string_value for a in rs.resource.attributes}["service.name"]
            assert service == "moot-test"
            names += [s.name for ss in rs.scope_spans for s in ss.spans]
    assert sorted(names) == sorted(
        ["invoke_workflow affirmative-critical", "round 1", "round 2"] + ["chat " + str(script)] * 5
    )


def test_cli_trace_without_a_collector_says_so_once_and_does_not_wait(tmp_path: Path) -> None:
    """With no collector, --trace printed the exporter's raw retries and failures, and the debate took
    8 s instead of 0.6 (a newcomer's trial, session 38). It is said in one warning, before any call,
    and the debate runs without exporting."""
    import socket

    with socket.socket() as held:  # a loopback port that nothing listens on
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
    script = tmp_path / "r.json"
    script.write_text(json.dumps(["A1", "C1", "A2", "C2", "Final"]))
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}"}
    started = time.monotonic()
    result = CliRunner().invoke(app, ["debate", "Q?", "-m", f"scripted:{script}", "--trace", "-q"], env=env)
    assert result.exit_code == 0, result.output
    assert result.output.count("warning:") == 1, result.output
    assert f"no OpenTelemetry collector answers at http://127.0.0.1:{port}" in result.output
    assert "Failed to export" not in result.output and "Transient error" not in result.output
    assert result.output.strip().endswith("Final")
    assert time.monotonic() - started < 60  # (it waited for the exporter's retries: only a hang trips this)


# ------------------------------------------------------------------- the standard environment, every door


def exported() -> list[dict[str, Any]]:
    """The spans the loopback collector received: name, ids (hex), service and attributes."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    spans = []
    for body in _Collector.received:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for rs in request.resource_spans:
            service = {a.key: a.value.string_value for a in rs.resource.attributes}["service.name"]
            for ss in rs.scope_spans:
                for s in ss.spans:
                    attrs = {
                        a.key: getattr(a.value, a.value.WhichOneof("value") or "string_value") for a in s.attributes
                    }
                    spans.append(
                        {"name": s.name, "trace": s.trace_id.hex(), "id": s.span_id.hex(),
                         "parent": s.parent_span_id.hex(), "service": service, "attrs": attrs,
                         "start": s.start_time_unix_nano, "end": s.end_time_unix_nano}
                    )  # fmt: skip
    return spans


def tree_of(spans: list[dict[str, Any]], root: dict[str, Any]) -> list[str]:
    """The names under ``root`` (depth first, children sorted by name), indented by depth."""
    out: list[str] = []

    def walk(span: dict[str, Any], depth: int) -> None:
        out.append("  " * depth + span["name"])
        for child in sorted((s for s in spans if s["parent"] == span["id"]), key=lambda s: s["name"]):
            walk(child, depth + 1)

    walk(root, 0)
    return out


def replies(tmp_path: Path, n: int = 5) -> Path:
    script = tmp_path / "r.json"
    script.write_text(json.dumps(["A1", "C1", "A2", "C2", "Final"] * n))
    return script


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees the environment's problems said afresh (they are said once per process)."""
    from moot.integrations import otel

    monkeypatch.setattr(otel, "_said", set())


def test_the_console_exporter_is_honoured_and_nothing_goes_to_otlp(tmp_path: Path, collector: str) -> None:
    env = {"OTEL_TRACES_EXPORTER": "console", "OTEL_EXPORTER_OTLP_ENDPOINT": collector}
    result = CliRunner().invoke(app, ["debate", "Q?", "-m", f"scripted:{replies(tmp_path)}", "--trace", "-q"], env=env)
    assert result.exit_code == 0, result.output
    assert _Collector.received == []  # before the fix, every span went to OTLP
    assert result.stdout.strip() == "Final"  # the command's output stays its own: the spans are on stderr
    assert (
        result.stderr.count('"name": "round ') == 2
        and '"name": "invoke_workflow affirmative-critical"' in result.stderr
    )


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "localhost:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT='localhost:4318' is not an "
         "http(s) URL with a host, so no span can be sent over OTLP: give e.g. http://localhost:4318"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://[::1"}, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT='http://[::1' is "
         "not a URL"),
        ({"OTEL_TRACES_EXPORTER": "jaeger"}, "OTEL_TRACES_EXPORTER='jaeger': jaeger is not an installed span exporter"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTEL_EXPORTER_OTLP_PROTOCOL='grpc' needs the OTLP/gRPC exporter"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/xml"}, "OTEL_EXPORTER_OTLP_PROTOCOL='http/xml' is not an OTLP protocol"),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_TRACES_SAMPLER": "sometimes"},
         "Couldn't recognize sampler sometimes"),
        ({"OTEL_TRACES_EXPORTER": "console", "OTEL_PROPAGATORS": "b3"},
         "OTEL_PROPAGATORS='b3': b3 is not an installed"),
    ],
)  # fmt: skip
def test_a_bad_variable_is_said_once_and_the_debate_goes_on(
    env: dict[str, str], said: str, tmp_path: Path, collector: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from moot.integrations.otel import tracing_from_env

    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector, **env}  # spans that do go out go somewhere that answers
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    warnings: list[str] = []
    for _ in range(3):  # a server makes its tracing once, but each door may ask again: said once
        tracing = tracing_from_env(warn=warnings.append)
        if tracing is not None:
            tracing.shutdown()
    assert len(warnings) == 1 and said in warnings[0], warnings
    # The command: one warning line on stderr, the debate's answer as usual.
    monkeypatch.setattr("moot.integrations.otel._said", set())
    result = CliRunner().invoke(app, ["debate", "Q?", "-m", f"scripted:{replies(tmp_path)}", "--trace", "-q"], env=env)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "Final"
    lines = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(lines) == 1 and said.split(":")[0] in lines[0]


def test_recorded_spans_are_the_live_ones_at_the_results_times(exporter: InMemorySpanExporter) -> None:
    """record() makes, from a finished result, the tree the live handler makes (a debate that ran
    on a Ray worker, or in a batch), each span at its turn's own time."""
    spec = get_preset("society-of-minds").model_copy(update={"rounds": 2})
    reply = {"reasoning": "r", "answer": "408", "confidence": 0.9}
    live = tracer(exporter)
    result = asyncio.run(Engine(spec, ScriptedModel([reply] * 6, latency=0.01), on_event=live).run("Q?"))
    shape = sorted((s.name, s.parent is not None) for s in exporter.get_finished_spans())
    exporter.clear()
    tracer(exporter).record(result, end_time_ns=10**18)
    spans = exporter.get_finished_spans()
    assert sorted((s.name, s.parent is not None) for s in spans) == shape
    [debate] = by_name(spans, "invoke_workflow")
    assert debate.end_time == 10**18 and debate.start_time == 10**18 - int(result.elapsed_s * 1e9)
    turns = by_name(spans, "chat")
    assert len(turns) == len(result.turns()) == 6
    for span in turns:
        assert span.start_time is not None and span.end_time is not None
        assert debate.start_time <= span.start_time <= span.end_time <= debate.end_time
    assert all(s.end_time is not None for s in spans)


def test_batch_traces_each_debate_under_a_span_of_the_run(tmp_path: Path, collector: str) -> None:
    questions = tmp_path / "q.txt"
    questions.write_text("First?\nSecond?\n")
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector}
    args = ["batch", str(questions), "-m", f"scripted:{replies(tmp_path)}", "-o", str(tmp_path / "run"), "--trace"]
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 0, result.output
    spans = exported()
    [run] = [s for s in spans if s["name"] == "moot batch q.txt"]
    debates = [s for s in spans if s["name"] == "invoke_workflow affirmative-critical"]
    assert len(debates) == 2 and {d["parent"] for d in debates} == {run["id"]}
    assert all(s["trace"] == run["trace"] for s in spans)
    assert tree_of(spans, debates[0])[:2] == [
        "invoke_workflow affirmative-critical",
        "  chat " + str(replies(tmp_path)),
    ]
    # A resumed run traces only what it runs: nothing here.
    _Collector.received = []
    again = CliRunner().invoke(app, args, env=env)
    assert again.exit_code == 0 and not [s for s in exported() if s["name"].startswith("invoke_workflow")]


def test_eval_traces_each_item_and_protocol_under_a_span_of_the_run(tmp_path: Path, collector: str) -> None:
    from test_eval import SCIENCE

    script = tmp_path / "replies.json"
    script.write_text(json.dumps([{"reasoning": "r", "answer": "B", "confidence": 0.9}] * 12))
    args = ["eval", "--dataset", str(SCIENCE), "--n", "2", "--protocols", "single,vote@2", "-m", f"scripted:{script}",
            "--out", str(tmp_path / "run"), "-j", "1", "--no-report", "--trace"]  # fmt: skip
    result = CliRunner().invoke(app, args, env={"OTEL_EXPORTER_OTLP_ENDPOINT": collector})
    assert result.exit_code == 0, result.output
    spans = exported()
    [run] = [s for s in spans if s["name"].startswith("moot eval ")]
    debates = [s for s in spans if s["name"].startswith("invoke_workflow")]
    assert sorted((d["attrs"]["moot.eval.protocol"], d["attrs"]["moot.eval.item"]) for d in debates) == sorted(
        (p, i) for p in ("single", "vote@2") for i in {d["attrs"]["moot.eval.item"] for d in debates}
    )
    assert len(debates) == 4 and {d["parent"] for d in debates} == {run["id"]}


def test_serve_traces_each_debate_under_its_callers_traceparent(
    tmp_path: Path, collector: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import httpx

    from moot.server import ServerSettings
    from moot.testing.fake_openai import FakeOpenAIServer
    from serving import FAKE_KEY, ServerThread, wait_for

    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "moot-serve-test")
    caller_trace, caller_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    traceparent = {"traceparent": f"00-{caller_trace}-{caller_span}-01"}
    with FakeOpenAIServer() as fake:
        settings = ServerSettings(
            db=tmp_path / "moot.sqlite", models=["openai:fake"], base_url=fake.base_url, trace=True
        )
        with ServerThread(settings) as server:
            joined = httpx.post(server.url + "/v1/debates", json={"question": "Joined?"}, headers=traceparent).json()
            alone = httpx.post(server.url + "/v1/debates", json={"question": "Alone?"}).json()
            chat = {"model": "moot/single", "messages": [{"role": "user", "content": "Chat?"}]}
            assert httpx.post(server.url + "/v1/chat/completions", json=chat, headers=traceparent).status_code == 200
            for created in (joined, alone):
                wait_for(lambda c=created: httpx.get(server.url + c["links"]["self"]).json()["status"] == "complete",
                         "the debate")  # fmt: skip
    spans = exported()  # the server flushed its spans when it stopped
    debates = {s["attrs"]["moot.debate_id"]: s for s in spans if s["name"].startswith("invoke_workflow")}
    assert len(debates) == 3 and {s["service"] for s in spans} == {"moot-serve-test"}
    assert debates[joined["id"]]["trace"] == caller_trace and debates[joined["id"]]["parent"] == caller_span
    assert debates[alone["id"]]["trace"] != caller_trace and debates[alone["id"]]["parent"] == ""
    [chat_debate] = [d for i, d in debates.items() if i not in (joined["id"], alone["id"])]
    assert chat_debate["trace"] == caller_trace and chat_debate["parent"] == caller_span
    # one tree per debate: its rounds and turns, all in its trace
    tree = tree_of(spans, debates[joined["id"]])
    assert tree[0] == "invoke_workflow affirmative-critical" and tree.count("  round 1") == 1
    assert sum(1 for line in tree if line.strip().startswith("chat ")) == 5
