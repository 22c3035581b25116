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
import os
from dataclasses import dataclass, field
from typing import Any

from moot.core.events import DebateDone, DebateStarted, Event, RoundDone, TurnDone, TurnRetry, TurnStarted
from moot.core.types import DebateResult, Turn
from moot.integrations import MissingExtra
from moot.models.base import Message
from moot.secrets import redact

INSTALL_HINT = "pip install 'moot[otel]'"

try:
    from opentelemetry import trace
    from opentelemetry.trace import Span, Status, StatusCode, Tracer, TracerProvider
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
    once through one tracer (an eval run's items): each result is traced on its own."""

    def __init__(self, tracer_provider: TracerProvider | None = None, *, capture_content: bool | None = None) -> None:
        from moot._version import __version__

        provider = tracer_provider or trace.get_tracer_provider()
        self.tracer: Tracer = provider.get_tracer("moot", __version__)
        self.capture_content = _capture_default() if capture_content is None else capture_content
        self._open: dict[int, _Open] = {}

    def __call__(self, event: Event) -> None:
        if isinstance(event, DebateStarted):
            self._debate_started(event.result)
            return
        state = self._open.get(id(event.result))
        if state is None:
            return
        if isinstance(event, TurnStarted):
            self._turn_started(state, event)
        elif isinstance(event, TurnRetry):
            span = state.turns.get((event.speaker, event.round, "debate")) or state.turns.get(
                (event.speaker, event.round, "decision")
            )
            if span is not None:
                span.add_event("moot.retry", {"moot.attempt": event.attempt, "error.message": redact(event.error)})
        elif isinstance(event, TurnDone):
            self._turn_done(state, event.turn)
        elif isinstance(event, RoundDone):
            span = state.rounds.pop(event.round.index, None)
            if span is not None:
                usage = event.round.usage
                span.set_attributes(
                    {
                        "moot.turns": len(event.round.turns),
                        "moot.failed_turns": sum(1 for t in event.round.turns if not t.ok),
                        "gen_ai.usage.input_tokens": usage.prompt_tokens,
                        "gen_ai.usage.output_tokens": usage.completion_tokens,
                        "gen_ai.usage.cache_read.input_tokens": usage.cached_prompt_tokens,
                    }
                )
                span.end()
        elif isinstance(event, DebateDone):
            self._debate_done(state, event.result)

    # ------------------------------------------------------------------------------------ steps

    def _debate_started(self, result: DebateResult) -> None:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_workflow",
            "moot.protocol": result.protocol,
            "moot.participants": [str(p.get("id")) for p in result.participants],
            "moot.models": sorted({str(p.get("model")) for p in result.participants if p.get("model")}),
            "moot.context_passages": len(result.task.context),
        }
        if self.capture_content:
            attributes["moot.question"] = _content(result.task.question)
        span = self.tracer.start_span(f"invoke_workflow {result.protocol}", attributes=attributes)
        self._open[id(result)] = _Open(debate=span)

    def _parent(self, state: _Open, round_index: int, kind: str) -> Span:
        if kind == "decision":
            return state.debate
        span = state.rounds.get(round_index)
        if span is None:
            span = self.tracer.start_span(
                f"round {round_index}",
                context=trace.set_span_in_context(state.debate),
                attributes={"moot.round": round_index},
            )
            state.rounds[round_index] = span
        return span

    def _turn_started(self, state: _Open, event: TurnStarted) -> None:
        parent = self._parent(state, event.round, event.kind)
        span = self.tracer.start_span(
            "chat",
            context=trace.set_span_in_context(parent),
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.agent.id": event.speaker,
                "gen_ai.agent.name": event.name,
                "moot.participant": event.speaker,
                "moot.round": event.round,
                "moot.turn.kind": event.kind,
            },
        )
        state.turns[(event.speaker, event.round, event.kind)] = span

    def _turn_done(self, state: _Open, turn: Turn) -> None:
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
        span.end()

    def _debate_done(self, state: _Open, result: DebateResult) -> None:
        for (speaker, _, _), span in list(state.turns.items()):
            span.set_attribute("error.type", "cancelled")
            span.set_status(
                Status(StatusCode.ERROR, f"{speaker}'s call was cancelled: the debate ended ({result.status})")
            )
            span.end()
        for span in state.rounds.values():
            span.end()
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
        state.debate.end()
        self._open.pop(id(result), None)
