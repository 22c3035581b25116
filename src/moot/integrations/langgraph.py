"""Debates as LangGraph graphs and nodes (``pip install 'moot[langgraph]'``).

A protocol compiled to a ``StateGraph`` whose nodes are the engine's own steps (seed 004)::

    START -> open -> check --continue--> round -> check ...
                           --conclude--> decide -> finish -> END
                           --timeout---> finish

``open`` is :meth:`Engine.start`, ``round`` is :meth:`Engine.run_round`, ``check`` is
:meth:`Engine.check_stop` (its reason picks the edge), ``decide`` and ``finish`` are
:meth:`Engine.decide` and :meth:`Engine.finish`. The conditional edge is the only loop: it
replaces :meth:`Engine.run`'s ``while``, and nothing else is re-implemented, so a debate run as a
graph makes exactly the calls ``Engine.run`` makes and returns the same transcript::

    graph = debate_subgraph("moderated", model).compile()
    out = await graph.ainvoke({"question": "Remote work improves productivity."},
                              debate_config(get_preset("moderated")))
    result = result_of(out)                 # the DebateResult

    result = await run_debate_graph("affirmative-critical", "What is RAG?", model)   # the same, in one call

The state between nodes is serialisable: the transcript (``debate_result``, the
:class:`~moot.core.types.DebateResult` as JSON) and the debate time spent so far, from which
the next node rebuilds the engine's :class:`~moot.core.state.DebateState`. So a checkpointer
(``InMemorySaver``, a database saver) can stop a debate between rounds (``interrupt_after=["round"]``,
a crash, an exception) and resume it later from the checkpoint, the finished rounds kept and never
called again. Time paused between nodes does not count against the protocol's ``timeout_s``.

Events: every engine event (turn started / done / retried, round done, debate started / done; tokens
with ``stream_tokens=True``) is written to LangGraph's custom stream as a plain dict
(:func:`event_dict`), so ``graph.astream(inputs, stream_mode="custom")`` yields them as they happen,
and all but the tokens are appended to ``debate_events`` (a reducer key: every node adds to it).

Seed 003's placement, ``agents -> debate -> verify``: :func:`debate_node` makes a node that arbitrates
the agent reports in the state (see :mod:`moot.apps.arbitration`) and writes ``debate_results``.

The graph's nodes are coroutines: run it with ``ainvoke`` / ``astream``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import operator
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Annotated, Any, Literal, Protocol, TypedDict, cast

from moot.apps.arbitration import AgentReport, ArbitrationConfig, arbitrate
from moot.apps.rag import context_chunk, describe_error
from moot.core.engine import DebateTimeout, Engine
from moot.core.events import (
    DebateDone,
    DebateResumed,
    DebateStarted,
    Event,
    EventHandler,
    RoundDone,
    TokenDelta,
    TurnDone,
    TurnRetry,
    TurnStarted,
)
from moot.core.spec import ProtocolSpec
from moot.core.state import DebateState
from moot.core.types import DebateResult, DebateTask, Turn
from moot.integrations import MissingExtra
from moot.models.base import BaseChatModel
from moot.secrets import redact

INSTALL_HINT = "pip install 'moot[langgraph]'"

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.config import get_stream_writer
    from langgraph.graph import END, START, StateGraph
    from langgraph.graph.state import CompiledStateGraph
    from langgraph.types import All, Checkpointer, Overwrite
except ImportError as _exc:
    raise MissingExtra(f"LangGraph graphs need langgraph, which is not installed: {INSTALL_HINT}") from _exc


logger = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------- state


class DebateGraphInput(TypedDict, total=False):
    """What a debate graph reads: a question with optional context passages, or a whole task."""

    question: str
    #: Strings, dicts with ``text`` (and ``source``), or LangChain documents.
    context: list[Any]
    #: A :class:`~moot.core.types.DebateTask` as JSON (``task.model_dump(mode="json")``: a checkpointer
    #: stores plain data best); wins over question/context.
    task: dict[str, Any]


class DebateGraphOutput(TypedDict, total=False):
    """What a debate graph writes back (also to a parent graph that has these keys)."""

    #: The :class:`~moot.core.types.DebateResult` as JSON: the growing transcript, then the result.
    debate_result: dict[str, Any]
    final_answer: str | None
    #: The debate's events as dicts (:func:`event_dict`), tokens left out; every node adds to it.
    debate_events: Annotated[list[dict[str, Any]], operator.add]


Route = Literal["continue", "conclude", "timeout"]


class DebateGraphState(DebateGraphInput, DebateGraphOutput, total=False):
    """The whole state between the nodes: what the nodes write is plain JSON data (a checkpointer stores it)."""

    #: Debate time spent so far (seconds); the next node's clock starts from it.
    debate_elapsed_s: float
    #: Where ``check`` sends the debate: another round, the decision, or (timed out) straight to finish.
    debate_route: Route
    debate_timed_out: bool


#: The nodes, in the order a debate visits them.
NODES = ("open", "check", "round", "decide", "finish")
#: Nodes a round adds to the run (``check`` then ``round``), and the nodes run once: ``open``, the
#: last ``check``, ``decide`` and ``finish``.
NODES_PER_ROUND = 2
FIXED_NODES = 4


def graph_steps(spec: ProtocolSpec) -> int:
    """The LangGraph steps of the longest run of ``spec`` (every round run); an early stop takes fewer."""
    return NODES_PER_ROUND * spec.rounds + FIXED_NODES


def recursion_limit_for(spec: ProtocolSpec, *, extra_steps: int = 0) -> int:
    """The ``recursion_limit`` a run of ``spec`` needs: its steps, plus the one LangGraph's count
    includes, plus ``extra_steps`` (a parent graph's own nodes, if it passes one limit to both)."""
    return graph_steps(spec) + 1 + extra_steps


def debate_config(
    spec: ProtocolSpec,
    *,
    thread_id: str | None = None,
    config: RunnableConfig | None = None,
    extra_steps: int = 0,
) -> RunnableConfig:
    """A run config for a debate graph: ``config`` with a recursion limit that fits the protocol
    (a larger one given is kept) and, with a checkpointer, the ``thread_id``."""
    out: dict[str, Any] = dict(config or {})
    out["recursion_limit"] = max(
        int(out.get("recursion_limit") or 0), recursion_limit_for(spec, extra_steps=extra_steps)
    )
    if thread_id is not None:
        out["configurable"] = {**(out.get("configurable") or {}), "thread_id": thread_id}
    return cast(RunnableConfig, out)


def result_of(values: Mapping[str, Any]) -> DebateResult:
    """The :class:`DebateResult` in a debate graph's output (or a parent graph's state)."""
    data = values.get("debate_result")
    if data is None:
        raise ValueError("the graph's state has no 'debate_result': the debate has not started")
    return data if isinstance(data, DebateResult) else DebateResult.model_validate(data)


# ---------------------------------------------------------------------------------- events


def _turn_summary(turn: Turn) -> dict[str, Any]:
    error = turn.error or (turn.parse_failure.error if turn.parse_failure is not None else None)
    return {
        "speaker": turn.speaker,
        "name": turn.name,
        "role": turn.role,
        "round": turn.round,
        "kind": turn.kind,
        "model": turn.model,
        "ok": turn.ok,
        "text": turn.text,
        "parsed": turn.parsed,
        "error": error,
        "calls": turn.calls,
        "tokens": turn.usage.total_tokens,
        "latency_s": turn.latency_s,
        "trimmed": turn.trimmed,
    }


def event_dict(event: Event) -> dict[str, Any]:
    """An engine event as a JSON-able dict: ``{"event": "turn_done", "protocol": ..., ...}``."""
    base: dict[str, Any] = {"protocol": event.result.protocol}
    if isinstance(event, DebateStarted):
        task = event.result.task
        ids = [p["id"] for p in event.result.participants]
        return {"event": "debate_started", **base, "question": task.question, "participants": ids}
    if isinstance(event, DebateResumed):
        return {"event": "debate_resumed", **base, "kept_turns": event.kept_turns, "round": event.round}
    if isinstance(event, TurnStarted):
        return {"event": "turn_started", **base, "speaker": event.speaker, "name": event.name, "round": event.round,
                "kind": event.kind}  # fmt: skip
    if isinstance(event, TokenDelta):
        return {"event": "token", **base, "speaker": event.speaker, "round": event.round, "text": event.text}
    if isinstance(event, TurnRetry):
        return {"event": "turn_retry", **base, "speaker": event.speaker, "round": event.round,
                "attempt": event.attempt, "error": event.error}  # fmt: skip
    if isinstance(event, TurnDone):
        return {"event": "turn_done", **base, **_turn_summary(event.turn)}
    if isinstance(event, RoundDone):
        turns = event.round.turns
        return {"event": "round_done", **base, "round": event.round.index, "speakers": [t.speaker for t in turns],
                "failed": [t.speaker for t in turns if not t.ok]}  # fmt: skip
    res = event.result
    return {"event": "debate_done", **base, "status": res.status, "stop_reason": res.stop_reason,
            "final_answer": res.final_answer, "llm_calls": res.llm_calls, "elapsed_s": res.elapsed_s,
            "error": res.error}  # fmt: skip


#: The events of the node running in this context (the engine's turn tasks copy the context, so
#: parallel speakers append to the same list).
_NODE_EVENTS: ContextVar[list[dict[str, Any]] | None] = ContextVar("moot_langgraph_events", default=None)


@contextmanager
def _collecting() -> Iterator[list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []
    token = _NODE_EVENTS.set(events)
    try:
        yield events
    finally:
        _NODE_EVENTS.reset(token)


class _Forwarder:
    """The engine's event handler in a graph: LangGraph's custom stream, the node's event list,
    then the caller's own handler."""

    def __init__(self, on_event: EventHandler | None, stream_tokens: bool) -> None:
        self.on_event = on_event
        self.stream_tokens = stream_tokens

    async def __call__(self, event: Event) -> None:
        token = isinstance(event, TokenDelta)
        if self.stream_tokens or not token:
            data = event_dict(event)
            sink = _NODE_EVENTS.get()
            if sink is not None and not token:
                sink.append(data)
            get_stream_writer()(data)  # a no-op unless the run streams in "custom" mode
        if self.on_event is not None:
            outcome = self.on_event(event)
            if outcome is not None:
                await outcome


# ----------------------------------------------------------------------------------- nodes


class _Steps:
    """The engine's steps as graph nodes: each rebuilds the DebateState from the graph state,
    runs one step and writes the state back."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @staticmethod
    def load(state: DebateGraphState) -> DebateState:
        result = DebateResult.model_validate(state["debate_result"])
        return DebateState(result=result, t0=time.perf_counter() - state.get("debate_elapsed_s", 0.0))

    @staticmethod
    def save(st: DebateState, events: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "debate_result": st.result.model_dump(mode="json"),
            "debate_elapsed_s": st.elapsed(),
            "debate_events": events,
        }

    async def bounded(self, st: DebateState, step: Callable[[], Awaitable[object]]) -> bool:
        """Run ``step`` within what is left of the protocol's timeout; True if it expired (the
        state then says so, as :meth:`Engine.run` leaves it)."""
        timeout = self.engine.spec.budget.timeout_s
        if timeout is None:
            await step()
            return False
        remaining = timeout - st.elapsed()
        if remaining > 0:
            try:
                async with asyncio.timeout(remaining) as scope:
                    await step()
                return False
            except TimeoutError:
                if not scope.expired():
                    raise
        st.result.stop_reason = "timeout"
        st.result.error = f"timed out after {timeout:g} s"
        return True

    async def open(self, state: DebateGraphState) -> dict[str, Any]:
        given: Any = state.get("task")
        if given is not None:
            task = given if isinstance(given, DebateTask) else DebateTask.model_validate(given)
        else:
            question = state.get("question")
            if not question:
                raise ValueError("a debate graph needs a 'question' (or a 'task') in its input")
            task = DebateTask(question=question, context=[context_chunk(c) for c in state.get("context") or []])
        with _collecting() as events:
            st = self.engine.start(task)
            # The engine's own emit, as Engine.run uses it: a failing handler becomes a warning.
            await self.engine.emit(DebateStarted(st.result))
        # A new debate on a thread starts a new event log (Overwrite bypasses the reducer once).
        return self.save(st, []) | {
            "debate_events": Overwrite(events),
            "final_answer": None,
            "debate_timed_out": False,
        }

    async def check(self, state: DebateGraphState) -> dict[str, Any]:
        if state.get("debate_timed_out"):
            return {"debate_route": "timeout"}
        st = self.load(state)
        reason = self.engine.check_stop(st)
        if reason is None:
            return {"debate_route": "continue"}
        st.result.stop_reason = reason
        return self.save(st, []) | {"debate_route": "conclude"}

    async def round(self, state: DebateGraphState) -> dict[str, Any]:
        st = self.load(state)
        with _collecting() as events:
            timed_out = await self.bounded(st, lambda: self.engine.run_round(st))
        return self.save(st, events) | {"debate_timed_out": timed_out}

    async def decide(self, state: DebateGraphState) -> dict[str, Any]:
        st = self.load(state)
        with _collecting() as events:
            timed_out = await self.bounded(st, lambda: self.engine.decide(st))
        return self.save(st, events) | {"debate_timed_out": timed_out}

    async def finish(self, state: DebateGraphState) -> dict[str, Any]:
        st = self.load(state)
        with _collecting() as events:
            result = self.engine.finish(st, "timeout" if state.get("debate_timed_out") else None)
            await self.engine.emit(DebateDone(result))
        return {
            "debate_result": result.model_dump(mode="json"),
            "debate_elapsed_s": result.elapsed_s,
            "final_answer": result.final_answer,
            "debate_events": events,
        }


def _route(state: DebateGraphState) -> Route:
    return state["debate_route"]


def _resolve_spec(protocol: str | ProtocolSpec) -> ProtocolSpec:
    if isinstance(protocol, ProtocolSpec):
        return protocol
    from moot.protocols.loader import resolve_protocol

    return resolve_protocol(protocol)


DebateStateGraph = StateGraph[DebateGraphState, None, DebateGraphInput, DebateGraphOutput]
CompiledDebateGraph = CompiledStateGraph[DebateGraphState, None, DebateGraphInput, DebateGraphOutput]


def debate_subgraph(
    protocol: str | ProtocolSpec,
    model: str | BaseChatModel | None = None,
    *,
    models: dict[str, str | BaseChatModel] | None = None,
    on_event: EventHandler | None = None,
    stream_tokens: bool = False,
    **model_options: Any,
) -> DebateStateGraph:
    """The debate of ``protocol`` (a preset name, a protocol file or a spec) as an uncompiled
    ``StateGraph``: compile it, or add it compiled as a node of a parent graph.

    ``model``, ``models`` and ``model_options`` are :class:`~moot.core.engine.Engine`'s (models are
    resolved now, loaded and called only when the graph runs). ``on_event`` also receives the
    engine's events; ``stream_tokens`` puts token deltas on the custom stream too.
    """
    spec = _resolve_spec(protocol)
    engine = Engine(spec, model, models=models, on_event=_Forwarder(on_event, stream_tokens), **model_options)
    steps = _Steps(engine)
    builder: DebateStateGraph = StateGraph(
        DebateGraphState, input_schema=DebateGraphInput, output_schema=DebateGraphOutput
    )
    builder.add_node("open", steps.open)
    builder.add_node("check", steps.check)
    builder.add_node("round", steps.round)
    builder.add_node("decide", steps.decide)
    builder.add_node("finish", steps.finish)
    builder.add_edge(START, "open")
    builder.add_edge("open", "check")
    builder.add_conditional_edges("check", _route, {"continue": "round", "conclude": "decide", "timeout": "finish"})
    builder.add_edge("round", "check")
    builder.add_edge("decide", "finish")
    builder.add_edge("finish", END)
    return builder


def compile_debate_graph(
    protocol: str | ProtocolSpec,
    model: str | BaseChatModel | None = None,
    *,
    models: dict[str, str | BaseChatModel] | None = None,
    checkpointer: Checkpointer = None,
    interrupt_before: All | list[str] | None = None,
    interrupt_after: All | list[str] | None = None,
    name: str | None = None,
    on_event: EventHandler | None = None,
    stream_tokens: bool = False,
    **model_options: Any,
) -> CompiledDebateGraph:
    """:func:`debate_subgraph`, compiled (with a checkpointer and breakpoints, if given)."""
    spec = _resolve_spec(protocol)
    builder = debate_subgraph(
        spec, model, models=models, on_event=on_event, stream_tokens=stream_tokens, **model_options
    )
    return builder.compile(
        checkpointer=checkpointer,
        interrupt_before=interrupt_before,
        interrupt_after=interrupt_after,
        name=name or f"moot-{spec.name}",
    )


async def run_debate_graph(
    protocol: str | ProtocolSpec,
    task: DebateTask | str | None,
    model: str | BaseChatModel | None = None,
    *,
    models: dict[str, str | BaseChatModel] | None = None,
    checkpointer: Checkpointer = None,
    thread_id: str | None = None,
    config: RunnableConfig | None = None,
    on_event: EventHandler | None = None,
    **model_options: Any,
) -> DebateResult:
    """Run a whole debate as a graph, like :meth:`Engine.run`: the result, or
    :class:`~moot.core.engine.DebateTimeout` (a ``TimeoutError``, with the partial transcript) when the
    protocol's timeout expires.

    With a ``checkpointer`` and a ``thread_id``, ``task=None`` resumes the thread's unfinished
    debate from its last checkpoint (after an exception or a crash): finished rounds are not run again.
    """
    spec = _resolve_spec(protocol)
    graph = compile_debate_graph(spec, model, models=models, checkpointer=checkpointer, on_event=on_event,
                                 **model_options)  # fmt: skip
    run_config = debate_config(spec, thread_id=thread_id, config=config)
    if task is None:
        if checkpointer is None or thread_id is None:
            raise ValueError("resuming a debate (task=None) needs the checkpointer and the thread_id it ran with")
        snapshot = await graph.aget_state(run_config)
        if not snapshot.next:
            raise ValueError(f"thread {thread_id!r} has no unfinished debate to resume")
        payload: DebateGraphInput | None = None
    else:
        given = task if isinstance(task, DebateTask) else DebateTask(question=task)
        payload = {"task": given.model_dump(mode="json")}
    values = await graph.ainvoke(payload, run_config)
    result = result_of(values)
    if result.status == "timeout":
        assert spec.budget.timeout_s is not None
        raise DebateTimeout(result, spec.budget.timeout_s)
    return result


# -------------------------------------------------------------------- seed 003: debate_node

#: ``callback("debate", "running")``, then ``callback("debate", "complete", summary, latency_ms)``
#: (or ``"error"``); sync or async.
EventCallback = Callable[..., Any]


class DebateNode(Protocol):
    """A workflow node: the state (any mapping) in, the state update out."""

    def __call__(self, state: Any) -> Awaitable[dict[str, Any]]: ...


async def _notify(callback: EventCallback | None, *args: Any) -> None:
    if callback is None:
        return
    try:
        outcome = callback(*args)
        if inspect.isawaitable(outcome):
            await outcome
    except Exception as exc:  # a progress callback must not break the workflow
        logger.warning("debate event callback failed on %r: %s", args[1], redact(describe_error(exc)))


def debate_node(
    config: ArbitrationConfig | Mapping[str, Any] | None = None,
    *,
    model: str | BaseChatModel | None = None,
    protocol: str | ProtocolSpec | None = None,
    reports_key: str = "agent_reports",
    results_key: str = "debate_results",
    output_key: str | None = None,
    overwrite: bool = False,
    event_callback: EventCallback | None = None,
    callback_key: str | None = "event_callback",
) -> DebateNode:
    """A node for an existing workflow (seed 003: ``agents -> debate -> verify``).

    It reads the agent reports at ``reports_key`` (:class:`~moot.apps.arbitration.AgentReport` or
    dicts), arbitrates their contradictions (:func:`~moot.apps.arbitration.arbitrate`: ``config``,
    ``model`` and ``protocol`` are its) and returns ``{results_key: result.debate_results()}`` and,
    unless nothing was contradicted (``status == "skipped"``: no model is called or even resolved),
    the adjusted reports at ``output_key`` (default: ``reports_key``), as the input gave them
    (models or dicts). If that key has an additive reducer (parallel agents appending their
    reports), pass ``overwrite=True``: the adjusted reports then replace the list instead of being
    appended to it.

    ``event_callback`` (or a callable in the state at ``callback_key``, as in the seed) is called
    with ``("debate", "running")`` first, then ``("debate", "complete", summary, latency_ms)``
    where summary has contradictions, resolved, flagged and status; on an exception
    ``("debate", "error", {"error": ...}, latency_ms)`` before it propagates.
    """
    cfg = config if isinstance(config, ArbitrationConfig) else ArbitrationConfig.model_validate(config or {})
    target = output_key or reports_key

    async def debate(state: Mapping[str, Any]) -> dict[str, Any]:
        callback = event_callback
        if callback is None and callback_key is not None and callable(state.get(callback_key)):
            callback = cast(EventCallback, state[callback_key])
        t0 = time.perf_counter()
        await _notify(callback, "debate", "running")
        given: Sequence[AgentReport | Mapping[str, Any]] = state.get(reports_key) or []
        try:
            result = await arbitrate(given, cfg, model=model, protocol=protocol)
        except Exception as exc:
            error = redact(describe_error(exc))
            logger.error("debate node failed: %s", error)
            await _notify(callback, "debate", "error", {"error": error}, (time.perf_counter() - t0) * 1000)
            raise
        summary = {
            "contradictions": len(result.contradictions),
            "resolved": result.resolved_count,
            "flagged": result.flagged_count,
            "status": result.status,
        }
        if result.status == "skipped":
            logger.info("no contradictions among %d agent reports: debate skipped", len(given))
        else:
            logger.info(
                "debate %s: %d contradictions, %d resolved, %d flagged, latency=%.0f ms",
                result.status,
                len(result.contradictions),
                result.resolved_count,
                result.flagged_count,
                result.latency_ms,
            )
        await _notify(callback, "debate", "complete", summary, result.latency_ms)
        update: dict[str, Any] = {results_key: result.debate_results()}
        if result.status != "skipped":
            as_models = bool(given) and all(isinstance(r, AgentReport) for r in given)
            adjusted: list[Any] = (
                list(result.adjusted_reports)
                if as_models
                else [r.model_dump(mode="json", exclude_none=True) for r in result.adjusted_reports]
            )
            update[target] = Overwrite(adjusted) if overwrite else adjusted
        return update

    return debate


__all__ = [
    "FIXED_NODES",
    "INSTALL_HINT",
    "NODES",
    "NODES_PER_ROUND",
    "CompiledDebateGraph",
    "DebateGraphInput",
    "DebateGraphOutput",
    "DebateGraphState",
    "DebateNode",
    "DebateStateGraph",
    "EventCallback",
    "compile_debate_graph",
    "debate_config",
    "debate_node",
    "debate_subgraph",
    "event_dict",
    "graph_steps",
    "recursion_limit_for",
    "result_of",
    "run_debate_graph",
]
