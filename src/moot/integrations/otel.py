"""OpenTelemetry traces of debates (``pip install 'moot[otel]'``): an engine event handler, so the
engine itself has no tracing code.

One span per debate, one per round (a child of the debate) and one per model turn (a child of its
round; decision turns are children of the debate), with the GenAI semantic conventions' attributes
(``gen_ai.operation.name``, ``gen_ai.provider.name``, ``gen_ai.request.model``,
``gen_ai.usage.input_tokens`` / ``output_tokens``, ``gen_ai.response.finish_reasons``,
``gen_ai.agent.id`` / ``name``) and moot's own (``moot.protocol``, ``moot.participant``,
``moot.round``, ``moot.stop_reason``, ``moot.status``, ``moot.decision.*``, calls, retries).

Prompts and replies (``gen_ai.input.messages``, ``gen_ai.output.messages``, the question and a
free-text final answer) are recorded only when content capture is on: ``capture_content=True``, or
the GenAI instrumentations' ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``. Keys never
are: no request option reaches a span, and every error and content string is redacted.

::

    from opentelemetry.sdk.trace import TracerProvider
    from moot.integrations.otel import DebateTracer

    engine = Engine(spec, model, on_event=DebateTracer(TracerProvider(...)))

Export to an OTLP collector (Jaeger, Phoenix, Langfuse): docs/tracing.md.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from moot.core.events import (
    DebateDone,
    DebateResumed,
    DebateStarted,
    Event,
    RoundDone,
    TurnDone,
    TurnRetry,
    TurnStarted,
)
from moot.core.types import DebateResult, Round, Turn
from moot.integrations import MissingExtra
from moot.models.base import Message
from moot.secrets import redact

INSTALL_HINT = "pip install 'moot[otel]'"

try:
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Status, StatusCode, Tracer, TracerProvider
    from opentelemetry.util.types import AttributeValue
except ImportError as _exc:  # pragma: no cover - the extra is installed wherever the tests run
    raise MissingExtra(f"OpenTelemetry traces need opentelemetry-sdk, which is not installed: {INSTALL_HINT}") from _exc

#: The GenAI instrumentations' switch for recording prompt and reply content.
CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
#: A content attribute is cut to this many characters (collectors limit attribute sizes).
MAX_CONTENT = 16_000

TurnKey = tuple[str, int, str]


def _capture_default() -> bool:
    return os.environ.get(CAPTURE_ENV, "").strip().lower() in ("1", "true", "yes")


def _provider(model: str) -> str:
    """``openai:gpt-4o`` -> ``openai``; ``embedded:qwen2.5-1.5b`` -> ``llama.cpp`` (moot's embedded engine)."""
    backend = model.partition(":")[0]
    return {"embedded": "llama.cpp"}.get(backend, backend)


def _bare(model: str) -> str:
    _, sep, name = model.partition(":")
    return name if sep else model


def _content(text: str) -> str:
    text = redact(text)
    return text if len(text) <= MAX_CONTENT else text[:MAX_CONTENT] + "…"


def _messages(messages: list[Message]) -> str:
    """Messages in the GenAI conventions' JSON form (role and text parts)."""
    return _content(
        json.dumps(
            [{"role": m.role, "parts": [{"type": "text", "content": m.content}]} for m in messages], ensure_ascii=False
        )
    )


@dataclass
class _Open:
    debate: Span
    rounds: dict[int, Span] = field(default_factory=dict)
    turns: dict[TurnKey, Span] = field(default_factory=dict)


class DebateTracer:
    """An engine event handler that records each debate as OpenTelemetry spans.

    ``tracer_provider``: where spans go (default: the global provider). Several debates may run at
    once through one tracer (an eval run's items): each result is traced on its own. ``parent``: the
    context the debate spans join (a server's caller's ``traceparent``, a batch run's span; default:
    the current one); ``attributes``: added to each debate's span (``moot.debate_id``, ...).
    :meth:`record` makes the same spans from a finished result, at its own times (a debate that ran
    on a Ray worker, or before a tracer was attached)."""

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        *,
        capture_content: bool | None = None,
        parent: Context | None = None,
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> None:
        from moot._version import __version__

        provider = tracer_provider or trace.get_tracer_provider()
        self.tracer: Tracer = provider.get_tracer("moot", __version__)
        self.capture_content = _capture_default() if capture_content is None else capture_content
        self.parent = parent
        self.attributes = dict(attributes or {})
        self._open: dict[int, _Open] = {}

    def __call__(self, event: Event) -> None:
        if isinstance(event, DebateStarted | DebateResumed):  # a resumed debate's spans start here
            self._debate_started(event.result)
            return
        state = self._open.get(id(event.result))
        if state is None:
            return
        if isinstance(event, TurnStarted):
            self._turn_started(state, event.speaker, event.name, event.round, event.kind)
        elif isinstance(event, TurnRetry):
            span = state.turns.get((event.speaker, event.round, "debate")) or state.turns.get(
                (event.speaker, event.round, "decision")
            )
            if span is not None:
                span.add_event("moot.retry", {"moot.attempt": event.attempt, "error.message": redact(event.error)})
        elif isinstance(event, TurnDone):
            self._turn_done(state, event.turn)
        elif isinstance(event, RoundDone):
            self._round_done(state, event.round)
        elif isinstance(event, DebateDone):
            self._debate_done(state, event.result)

    def end(self, result: DebateResult) -> None:
        """End the spans of a debate that stopped without its ``DebateDone`` (a cancel, a shutdown):
        nothing is left open. Nothing happens to a debate already ended."""
        state = self._open.get(id(result))
        if state is not None:
            self._debate_done(state, result)

    def record(self, result: DebateResult, *, end_time_ns: int | None = None) -> None:
        """The spans of a finished debate, from its result: the debate ended at ``end_time_ns``
        (default: now) and started ``elapsed_s`` before; each turn at its ``started_s`` for its
        ``latency_s``; a round from its first turn's start to its last turn's end."""
        end = time.time_ns() if end_time_ns is None else end_time_ns
        start = end - int(result.elapsed_s * 1e9)

        def at(seconds: float) -> int:
            return min(end, start + int(seconds * 1e9))

        state = self._debate_started(result, start_time=start)
        for rnd in result.rounds:
            if not rnd.turns:
                continue
            first = min(t.started_s for t in rnd.turns)
            self._parent(state, rnd.index, "debate", start_time=at(first))
            for t in rnd.turns:
                self._turn_started(state, t.speaker, t.name, t.round, t.kind, start_time=at(t.started_s))
                self._turn_done(state, t, end_time=at(t.started_s + t.latency_s))
            self._round_done(state, rnd, end_time=at(max(t.started_s + t.latency_s for t in rnd.turns)))
        for t in result.decision_turns:
            self._turn_started(state, t.speaker, t.name, t.round, t.kind, start_time=at(t.started_s))
            self._turn_done(state, t, end_time=at(t.started_s + t.latency_s))
        self._debate_done(state, result, end_time=end)

    # ------------------------------------------------------------------------------------ steps

    def _debate_started(self, result: DebateResult, start_time: int | None = None) -> _Open:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_workflow",
            "moot.protocol": result.protocol,
            "moot.participants": [str(p.get("id")) for p in result.participants],
            "moot.models": sorted({str(p.get("model")) for p in result.participants if p.get("model")}),
            "moot.context_passages": len(result.task.context),
            **self.attributes,
        }
        if self.capture_content:
            attributes["moot.question"] = _content(result.task.question)
        span = self.tracer.start_span(
            f"invoke_workflow {result.protocol}", context=self.parent, attributes=attributes, start_time=start_time
        )
        state = self._open[id(result)] = _Open(debate=span)
        return state

    def _parent(self, state: _Open, round_index: int, kind: str, start_time: int | None = None) -> Span:
        if kind == "decision":
            return state.debate
        span = state.rounds.get(round_index)
        if span is None:
            span = self.tracer.start_span(
                f"round {round_index}",
                context=trace.set_span_in_context(state.debate),
                attributes={"moot.round": round_index},
                start_time=start_time,
            )
            state.rounds[round_index] = span
        return span

    def _turn_started(
        self, state: _Open, speaker: str, name: str, round_index: int, kind: str, start_time: int | None = None
    ) -> None:
        parent = self._parent(state, round_index, kind, start_time)
        span = self.tracer.start_span(
            "chat",
            context=trace.set_span_in_context(parent),
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.agent.id": speaker,
                "gen_ai.agent.name": name,
                "moot.participant": speaker,
                "moot.round": round_index,
                "moot.turn.kind": kind,
            },
            start_time=start_time,
        )
        state.turns[(speaker, round_index, kind)] = span

    def _round_done(self, state: _Open, rnd: Round, end_time: int | None = None) -> None:
        span = state.rounds.pop(rnd.index, None)
        if span is None:
            return
        usage = rnd.usage
        span.set_attributes(
            {
                "moot.turns": len(rnd.turns),
                "moot.failed_turns": sum(1 for t in rnd.turns if not t.ok),
                "gen_ai.usage.input_tokens": usage.prompt_tokens,
                "gen_ai.usage.output_tokens": usage.completion_tokens,
                "gen_ai.usage.cache_read.input_tokens": usage.cached_prompt_tokens,
            }
        )
        span.end(end_time=end_time)

    def _turn_done(self, state: _Open, turn: Turn, end_time: int | None = None) -> None:
        key = (turn.speaker, turn.round, turn.kind)
        span = state.turns.pop(key, None)
        if span is None:  # a turn whose start was not seen (a handler attached mid-debate)
            parent = self._parent(state, turn.round, turn.kind)
            span = self.tracer.start_span("chat", context=trace.set_span_in_context(parent))
        span.update_name(f"chat {_bare(turn.model)}")
        attributes: dict[str, Any] = {
            "gen_ai.provider.name": _provider(turn.model),
            "gen_ai.request.model": _bare(turn.model),
            "moot.model": turn.model,
            "moot.role": turn.role,
            "gen_ai.usage.input_tokens": turn.usage.prompt_tokens,
            "gen_ai.usage.output_tokens": turn.usage.completion_tokens,
            "gen_ai.usage.cache_read.input_tokens": turn.usage.cached_prompt_tokens,
            "moot.calls": turn.calls,
            "moot.attempts": turn.attempts,
            "moot.cached_calls": turn.cached_calls,
            "moot.trimmed": turn.trimmed,
            "moot.carried": turn.carried,
        }
        if turn.finish_reason:
            attributes["gen_ai.response.finish_reasons"] = [turn.finish_reason]
        if turn.parse_failure is not None:
            attributes["moot.parse_failure"] = redact(turn.parse_failure.error)
        if self.capture_content:
            attributes["gen_ai.input.messages"] = _messages(turn.messages)
            if turn.raw is not None:
                attributes["gen_ai.output.messages"] = _messages([Message(role="assistant", content=turn.raw)])
        span.set_attributes(attributes)
        if turn.error is not None:
            span.set_attribute("error.type", "parse_failure" if turn.parse_failure else "model_error")
            span.set_status(Status(StatusCode.ERROR, redact(turn.error)))
        elif turn.parse_failure is not None:
            span.set_attribute("error.type", "parse_failure")
            span.set_status(Status(StatusCode.ERROR, "the reply could not be parsed"))
        span.end(end_time=end_time)

    def _debate_done(self, state: _Open, result: DebateResult, end_time: int | None = None) -> None:
        self._open.pop(id(result), None)
        for (speaker, _, _), span in list(state.turns.items()):
            span.set_attribute("error.type", "cancelled")
            span.set_status(
                Status(StatusCode.ERROR, f"{speaker}'s call was cancelled: the debate ended ({result.status})")
            )
            span.end(end_time=end_time)
        for span in state.rounds.values():
            span.end(end_time=end_time)
        attributes: dict[str, Any] = {
            "moot.status": result.status,
            "moot.rounds": len(result.rounds),
            "moot.llm_calls": result.llm_calls,
            "gen_ai.usage.input_tokens": result.usage.prompt_tokens,
            "gen_ai.usage.output_tokens": result.usage.completion_tokens,
            "gen_ai.usage.cache_read.input_tokens": result.usage.cached_prompt_tokens,
            "moot.elapsed_s": round(result.elapsed_s, 3),
            "moot.warnings": len(result.warnings),
        }
        if result.stop_reason is not None:
            attributes["moot.stop_reason"] = result.stop_reason
        if result.decision is not None:
            # A typed decision (a vote, a rule, a judge's pick) is a label, not reply content.
            attributes["moot.decision.kind"] = str(result.decision.get("kind", ""))
            if result.final_answer is not None:
                attributes["moot.decision.answer"] = _content(result.final_answer)[:200]
            confidence = result.decision.get("confidence", result.decision.get("share"))
            if isinstance(confidence, int | float) and not isinstance(confidence, bool):
                attributes["moot.decision.confidence"] = float(confidence)
        elif result.final_answer is not None and self.capture_content:
            attributes["moot.final_answer"] = _content(result.final_answer)
        state.debate.set_attributes(attributes)
        if result.status in ("failed", "timeout"):
            state.debate.set_status(Status(StatusCode.ERROR, redact(result.error or result.status)))
        state.debate.end(end_time=end_time)


# ------------------------------------------------------------------------ the standard environment

log = logging.getLogger("moot.tracing")
#: Each problem with the environment is said once per process (a server makes a tracer per debate).
_said: set[str] = set()


def _say_once(message: str, warn: Callable[[str], None]) -> None:
    if message not in _said:
        _said.add(message)
        warn(message)


#: ``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`` -> the exporter's entry point name.
_OTLP_BY_PROTOCOL = {"http/protobuf": "otlp_proto_http", "grpc": "otlp_proto_grpc"}


class Tracing:
    """Spans for one of moot's front doors (``moot debate``/``run``/``batch``/``eval --trace``, ``moot
    serve --trace``), set up from the standard OpenTelemetry environment by :func:`tracing_from_env`:
    a provider with the exporters ``OTEL_TRACES_EXPORTER`` names, ``handler()`` for each debate,
    ``span()`` for a run, ``extract()`` for a caller's ``traceparent``, ``shutdown()`` to flush."""

    def __init__(
        self,
        provider: TracerProvider,
        *,
        capture_content: bool | None = None,
        shutdown: Callable[[], None],
        extract: Callable[[Mapping[str, str]], Context],
    ) -> None:
        self.provider = provider
        self.capture_content = capture_content
        self._shutdown = shutdown
        self._extract = extract

    def handler(
        self, *, parent: Context | None = None, attributes: Mapping[str, AttributeValue] | None = None
    ) -> DebateTracer:
        """An engine event handler (or :meth:`DebateTracer.record`) for debates under ``parent``."""
        return DebateTracer(self.provider, capture_content=self.capture_content, parent=parent, attributes=attributes)

    @contextmanager
    def span(self, name: str, attributes: Mapping[str, AttributeValue] | None = None) -> Iterator[Context]:
        """A span around a run (a batch, an evaluation): its debates' spans are its children."""
        from moot._version import __version__

        tracer = self.provider.get_tracer("moot", __version__)
        with tracer.start_as_current_span(name, attributes=dict(attributes or {})) as span:
            yield trace.set_span_in_context(span)

    def extract(self, headers: Mapping[str, str]) -> Context:
        """The context of an incoming request's W3C ``traceparent`` (and ``tracestate``, baggage):
        ``OTEL_PROPAGATORS``' propagators (default ``tracecontext,baggage``)."""
        return self._extract(headers)

    def shutdown(self) -> None:
        """Export what is buffered and stop (the process may end next)."""
        self._shutdown()


def _propagator_from_env(warn: Callable[[str], None] | None = None) -> Callable[[Mapping[str, str]], Context]:
    """``opentelemetry.propagate.extract`` (it honours ``OTEL_PROPAGATORS``), unless that variable
    names a propagator that is not installed: importing the module would then raise, so W3C trace
    context is used, and said."""
    from importlib.metadata import entry_points

    from opentelemetry.environment_variables import OTEL_PROPAGATORS
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    names = [n.strip() for n in os.environ.get(OTEL_PROPAGATORS, "tracecontext,baggage").split(",") if n.strip()]
    known = {e.name for e in entry_points(group="opentelemetry_propagator")} | {"none"}
    unknown = [n for n in names if n not in known]
    if unknown:
        installed = ", ".join(sorted(known - {"none"}))
        _say_once(
            f"{OTEL_PROPAGATORS}={os.environ[OTEL_PROPAGATORS]!r}: {', '.join(unknown)} is not an installed "
            f"propagator (installed: {installed}); a caller's W3C traceparent is read instead",
            warn or log.warning,
        )
        w3c = TraceContextTextMapPropagator()
        return lambda headers: w3c.extract(headers)
    from opentelemetry import propagate

    return lambda headers: propagate.extract(headers)


def _endpoint_problem(variable: str) -> str | None:
    """Why an OTLP/HTTP endpoint variable is not a URL the exporter can post to, or None."""
    value = os.environ.get(variable, "").strip()
    if not value:
        return None
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as exc:
        return f"{variable}={value!r} is not a URL ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{variable}={value!r} is not an http(s) URL with a host"
    return None


def _collector_answers(endpoint: str) -> bool:
    """Whether anything listens where an OTLP/HTTP ``endpoint`` points (a TCP connection, at once)."""
    import socket

    parts = urlsplit(endpoint)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "localhost", port), timeout=0.5):
            return True
    except OSError:
        return False


def _exporters(warn: Callable[[str], None], probe: bool = False) -> list[Any]:
    """The span exporters ``OTEL_TRACES_EXPORTER`` names (default ``otlp``), each made as the SDK makes
    it (its entry point, no arguments: it reads its own ``OTEL_EXPORTER_*`` variables); ``console``
    writes to stderr, so that a command's output stays its own. A name that cannot be used is said
    and left out; the others are kept. ``probe``: an OTLP/HTTP collector that does not answer now is
    said and left out too (a command's run: its exporter would retry, and say so, for seconds)."""
    from importlib.metadata import entry_points

    from opentelemetry.environment_variables import OTEL_TRACES_EXPORTER
    from opentelemetry.sdk.environment_variables import (
        OTEL_EXPORTER_OTLP_ENDPOINT,
        OTEL_EXPORTER_OTLP_PROTOCOL,
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
        OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
    )

    raw = os.environ.get(OTEL_TRACES_EXPORTER, "otlp")
    names = [n.strip().lower() for n in raw.split(",") if n.strip()] or ["otlp"]
    if "none" in names:
        return []
    available = {e.name: e for e in entry_points(group="opentelemetry_traces_exporter")}
    out: list[Any] = []
    for name in dict.fromkeys(names):
        entry = name
        if name == "otlp":
            protocol_var = (
                OTEL_EXPORTER_OTLP_TRACES_PROTOCOL
                if os.environ.get(OTEL_EXPORTER_OTLP_TRACES_PROTOCOL)
                else OTEL_EXPORTER_OTLP_PROTOCOL
            )
            protocol = os.environ.get(protocol_var, "").strip() or "http/protobuf"
            if protocol not in _OTLP_BY_PROTOCOL:
                _say_once(
                    f"{protocol_var}={protocol!r} is not an OTLP protocol moot can send (http/protobuf, grpc); "
                    "spans go over http/protobuf",
                    warn,
                )
                protocol = "http/protobuf"
            entry = _OTLP_BY_PROTOCOL[protocol]
        if entry not in available:
            if name == "otlp":
                message = (f"{protocol_var}={protocol!r} needs the OTLP/gRPC exporter, which is not installed (pip "
                           "install opentelemetry-exporter-otlp-proto-grpc, or use http/protobuf); no span is sent "
                           "over OTLP")  # fmt: skip
            else:
                message = (f"{OTEL_TRACES_EXPORTER}={raw!r}: {name} is not an installed span exporter (installed: "
                           f"{', '.join(sorted(available))}, or none); its spans are not exported")  # fmt: skip
            _say_once(message, warn)
            continue
        if entry == "otlp_proto_http":
            problem = _endpoint_problem(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) or _endpoint_problem(
                OTEL_EXPORTER_OTLP_ENDPOINT
            )
            if problem is not None:
                _say_once(f"{problem}, so no span can be sent over OTLP: give e.g. http://localhost:4318", warn)
                continue
            endpoint = (
                os.environ.get(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, "").strip()
                or os.environ.get(OTEL_EXPORTER_OTLP_ENDPOINT, "").strip()
                or "http://localhost:4318"
            )
            if probe and not _collector_answers(endpoint):
                _say_once(
                    f"no OpenTelemetry collector answers at {endpoint} (OTEL_EXPORTER_OTLP_ENDPOINT), so this run's "
                    "spans are not exported: start one (docs/tracing.md) or leave --trace off",
                    warn,
                )
                continue
        exporter_class = available[entry].load()
        out.append(exporter_class(out=sys.stderr) if entry == "console" else exporter_class())
    return out


def tracing_from_env(
    *, capture_content: bool | None = None, warn: Callable[[str], None] | None = None, probe: bool = False
) -> Tracing | None:
    """Tracing as the standard OpenTelemetry environment asks, or None when it asks for none
    (``OTEL_SDK_DISABLED=true``, ``OTEL_TRACES_EXPORTER=none``).

    The SDK reads its own variables: the sampler (``OTEL_TRACES_SAMPLER[_ARG]``), the resource
    (``OTEL_SERVICE_NAME``, default ``moot``; ``OTEL_RESOURCE_ATTRIBUTES``), the batch processor
    (``OTEL_BSP_*``), each exporter its ``OTEL_EXPORTER_*``. A variable with a value that cannot be
    used is said once, by ``warn`` (default: the ``moot.tracing`` logger), with what is done instead:
    the SDK's own complaints while it reads them, and moot's about the exporter list, the OTLP
    endpoint (a malformed one would drop every span at export time, without a word) and the
    propagators. ``probe``: an OTLP/HTTP collector that does not answer at the start is said, and its
    exporter left out (a command's run; a server, which outlives a collector's restart, keeps it)."""
    from opentelemetry.sdk.environment_variables import OTEL_SDK_DISABLED, OTEL_SERVICE_NAME
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    say = warn or log.warning
    if os.environ.get(OTEL_SDK_DISABLED, "").strip().lower() == "true":
        return None

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            _say_once(f"OpenTelemetry: {record.getMessage()}", say)

    sdk_log = logging.getLogger("opentelemetry")
    collect, propagate = _Collect(logging.WARNING), sdk_log.propagate
    sdk_log.addHandler(collect)
    sdk_log.propagate = False  # said here, once, not also by logging's last resort
    try:
        exporters = _exporters(say, probe)
        if not exporters:
            return None
        resource = Resource.create()
        if not os.environ.get(OTEL_SERVICE_NAME) and str(resource.attributes.get("service.name", "")).startswith(
            "unknown_service"
        ):
            resource = resource.merge(Resource({"service.name": "moot"}))
        provider = SdkTracerProvider(resource=resource)
        for exporter in exporters:
            provider.add_span_processor(BatchSpanProcessor(exporter))
        extract = _propagator_from_env(say)
    finally:
        sdk_log.removeHandler(collect)
        sdk_log.propagate = propagate
    return Tracing(provider, capture_content=capture_content, shutdown=provider.shutdown, extract=extract)
