"""moot.integrations.langgraph: real LangGraph graphs (nothing of LangGraph is mocked), exact on the
scripted model: the debate subgraph against ``Engine.run``, the recursion limit, the custom stream,
checkpoints, nesting in a parent graph, and seed 003's ``agents -> debate -> verify`` node."""

from __future__ import annotations

import asyncio
import importlib
import operator
import sys
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph")

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.errors import GraphRecursionError
from langgraph.graph import END, START, StateGraph

from moot import DebateResult, DebateTimeout, Engine, ScriptedModel, get_preset
from moot.apps.arbitration import AgentReport, ArbitrationConfig
from moot.core.events import DebateDone, DebateStarted, Event, RoundDone, TokenDelta, TurnDone, TurnRetry
from moot.core.types import Round, Turn
from moot.integrations import MissingExtra
from moot.integrations.langgraph import (
    NODES,
    compile_debate_graph,
    debate_config,
    debate_node,
    debate_subgraph,
    event_dict,
    graph_steps,
    recursion_limit_for,
    result_of,
    run_debate_graph,
)
from moot.models.base import ChatRequest, ModelConfigError
from moot.protocols.affirmative_critical import affirmative_critical
from moot.protocols.loader import ProtocolFileError

QUESTION = "What is RAG?"
CONTEXT = [{"text": "RAG retrieves passages, then a model answers from them.", "source": "notes.md"}]
TIMINGS = {"elapsed_s", "latency_s", "started_s"}


def roles() -> Callable[[ChatRequest], str]:
    """Affirmative / Critical / Synthesizer replies that say who and which call of theirs it is."""
    counts: dict[str, int] = {}

    def reply(request: ChatRequest) -> str:
        system = request.messages[0].content
        who = next(r for r in ("Synthesizer", "Affirmative", "Critical") if r in system)
        counts[who] = counts.get(who, 0) + 1
        return f"{who} answer {counts[who]}: RAG retrieves then generates."

    return reply


def moderated_script(confidences: list[float]) -> ScriptedModel:
    def reply(request: ChatRequest) -> dict[str, Any]:
        title = (request.response_schema or {}).get("title")
        if title == "Argument":
            pro = "argue FOR" in request.messages[0].content
            return {"content": "pro argument" if pro else "con argument", "confidence": 0.9 if pro else 0.5,
                    "supporting_evidence": ["e"]}  # fmt: skip
        assert title == "ModeratorEvaluation", title
        return {"pro_score": 0.8, "con_score": 0.4, "confidence": confidences.pop(0), "key_points": []}

    return ScriptedModel(fn=reply)


def comparable(result: DebateResult) -> Any:
    """The transcript without its clock readings."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in TIMINGS}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return strip(result.model_dump(mode="json"))


def prompts(model: ScriptedModel) -> list[list[tuple[str, str]]]:
    return [[(m.role, m.content) for m in r.messages] for r in model.requests]


async def visited(graph: Any, inputs: Any, config: Any) -> list[str]:
    """The nodes a run goes through, in order (from the "updates" stream)."""
    nodes: list[str] = []
    async for chunk in graph.astream(inputs, config, stream_mode="updates"):
        nodes.extend(chunk)
    return nodes


# -------------------------------------------------------------------------- the subgraph


@pytest.mark.req("S004-SUBGRAPH")
async def test_affirmative_critical_as_a_graph_is_engine_run() -> None:
    spec = get_preset("affirmative-critical")
    direct_model, graph_model = ScriptedModel(fn=roles()), ScriptedModel(fn=roles())
    direct = await Engine(spec, direct_model).run(QUESTION)
    graph = compile_debate_graph(spec, graph_model)
    inputs = {"question": QUESTION}
    nodes = await visited(graph, inputs, debate_config(spec))
    assert nodes == ["open", "check", "round", "check", "round", "check", "decide", "finish"]
    assert len(nodes) == graph_steps(spec)
    assert set(nodes) == set(NODES)

    graph_model = ScriptedModel(fn=roles())
    out = await compile_debate_graph(spec, graph_model).ainvoke(inputs, debate_config(spec))
    result = result_of(out)
    assert len(graph_model.requests) == len(direct_model.requests) == result.llm_calls == 5
    assert prompts(graph_model) == prompts(direct_model)
    assert comparable(result) == comparable(direct)
    assert result.status == "complete" and result.stop_reason == "max_rounds"
    assert out["final_answer"] == result.final_answer == "Synthesizer answer 1: RAG retrieves then generates."
    assert set(out) == {"debate_result", "final_answer", "debate_events"}  # the internal keys stay inside
    assert result.elapsed_s > 0


async def test_run_debate_graph_takes_names_tasks_and_context() -> None:
    model = ScriptedModel(fn=roles())
    result = await run_debate_graph("affirmative-critical", QUESTION, model)
    assert result.final_answer is not None and result.llm_calls == 5
    graph = debate_subgraph(affirmative_critical(1, synthesize=False), ScriptedModel(fn=roles())).compile()
    context: list[Any] = ["plain passage", {"text": "dict passage", "source": "a.md"}, {"page_content": "doc"}]
    out = await graph.ainvoke({"question": QUESTION, "context": context})
    task = result_of(out).task
    assert [c.text for c in task.context] == ["plain passage", "dict passage", "doc"]
    assert task.context[1].source == "a.md"
    out = await graph.ainvoke({"task": {"question": "Q?", "reference": "x"}, "question": "ignored"})
    assert result_of(out).task.question == "Q?" and result_of(out).task.reference == "x"
    with pytest.raises(ValueError, match="needs a 'question'"):
        await graph.ainvoke({"context": ["x"]})
    with pytest.raises(ProtocolFileError, match="no protocol preset named"):
        debate_subgraph("no-such-preset", model)
    with pytest.raises(ValueError, match="has no 'debate_result'"):
        result_of({})


@pytest.mark.req("S004-SUBGRAPH")
@pytest.mark.parametrize(
    ("confidences", "rounds", "calls", "stop_reason", "path"),
    [
        ([0.85], 1, 3, "moderator", ["open", "check", "round", "check", "decide", "finish"]),
        ([0.6, 0.6], 2, 6, "max_rounds", ["open", "check", "round", "check", "round", "check", "decide", "finish"]),
    ],
)
async def test_moderated_stops_through_the_conditional_edge(
    confidences: list[float], rounds: int, calls: int, stop_reason: str, path: list[str]
) -> None:
    spec = get_preset("moderated")
    direct_model = moderated_script(list(confidences))
    direct = await Engine(spec, direct_model).run("Remote work improves productivity.")
    graph_model = moderated_script(list(confidences))
    graph = compile_debate_graph(spec, graph_model)
    nodes = await visited(graph, {"question": "Remote work improves productivity."}, debate_config(spec))
    assert nodes == path
    snapshot_model = moderated_script(list(confidences))
    result = await run_debate_graph(spec, "Remote work improves productivity.", snapshot_model)
    assert len(result.rounds) == len(direct.rounds) == rounds
    assert len(snapshot_model.requests) == len(direct_model.requests) == len(graph_model.requests) == calls
    assert result.stop_reason == direct.stop_reason == stop_reason
    assert result.final_answer == direct.final_answer == "SUPPORT"
    assert comparable(result) == comparable(direct)


async def test_the_recursion_limit_follows_the_round_count() -> None:
    for rounds in (1, 2, 3):
        spec = affirmative_critical(rounds)
        assert graph_steps(spec) == 2 * rounds + 4
        assert recursion_limit_for(spec) == 2 * rounds + 5
        assert recursion_limit_for(spec, extra_steps=3) == 2 * rounds + 8
    spec = affirmative_critical(3)
    graph = compile_debate_graph(spec, ScriptedModel(fn=roles()))
    out = await graph.ainvoke({"question": QUESTION}, {"recursion_limit": recursion_limit_for(spec)})
    assert len(result_of(out).rounds) == 3
    with pytest.raises(GraphRecursionError):
        await graph.ainvoke({"question": QUESTION}, {"recursion_limit": recursion_limit_for(spec) - 1})
    # The helper's config: the protocol's limit unless a larger one is given; the thread id merged in.
    assert debate_config(spec) == {"recursion_limit": 11}
    cfg = debate_config(spec, thread_id="t", config={"recursion_limit": 50, "configurable": {"user": "u"}})
    assert cfg == {"recursion_limit": 50, "configurable": {"user": "u", "thread_id": "t"}}
    assert debate_config(spec, config={"recursion_limit": 3})["recursion_limit"] == 11


async def test_turn_events_reach_the_custom_stream() -> None:
    spec = get_preset("affirmative-critical")
    seen: list[Event] = []
    graph = compile_debate_graph(spec, ScriptedModel(fn=roles()), on_event=seen.append)
    streamed = [c async for c in graph.astream({"question": QUESTION}, debate_config(spec), stream_mode="custom")]
    kinds = [e["event"] for e in streamed]
    assert kinds[0] == "debate_started" and kinds[-1] == "debate_done"
    assert kinds.count("turn_started") == kinds.count("turn_done") == 5 and kinds.count("round_done") == 2
    assert "token" not in kinds
    done = [e for e in streamed if e["event"] == "turn_done"]
    assert [(e["speaker"], e["round"]) for e in done] == [
        ("affirmative", 1), ("critical", 1), ("affirmative", 2), ("critical", 2), ("decision", 2),
    ]  # fmt: skip
    assert done[0]["text"] == "Affirmative answer 1: RAG retrieves then generates." and done[0]["ok"] is True
    assert done[0]["protocol"] == "affirmative-critical" and done[0]["tokens"] > 0
    assert streamed[-1]["status"] == "complete" and streamed[-1]["llm_calls"] == 5
    # The caller's own handler got the engine's events, and the state log is the stream.
    assert isinstance(seen[0], DebateStarted) and isinstance(seen[-1], DebateDone)
    assert [event_dict(e) for e in seen if not isinstance(e, TokenDelta)][1:-1] == streamed[1:-1]
    out = await compile_debate_graph(spec, ScriptedModel(fn=roles())).ainvoke({"question": QUESTION})
    assert [e["event"] for e in out["debate_events"]] == kinds
    assert [e.get("text") for e in out["debate_events"]] == [e.get("text") for e in streamed]


async def test_token_deltas_are_streamed_on_request() -> None:
    spec = affirmative_critical(1, synthesize=False)
    handled: list[str] = []

    async def handler(event: Event) -> None:
        await asyncio.sleep(0)
        handled.append(type(event).__name__)

    graph = compile_debate_graph(spec, ScriptedModel(fn=roles()), stream_tokens=True, on_event=handler)
    tokens: dict[str, str] = {}
    texts: dict[str, str] = {}
    events: list[dict[str, Any]] = []
    async for mode, chunk in graph.astream({"question": QUESTION}, stream_mode=["custom", "values"]):
        if mode == "custom":
            if chunk["event"] == "token":
                tokens[chunk["speaker"]] = tokens.get(chunk["speaker"], "") + chunk["text"]
            elif chunk["event"] == "turn_done":
                texts[chunk["speaker"]] = chunk["text"]
        else:
            events = chunk.get("debate_events", [])
    assert tokens == texts and set(texts) == {"affirmative", "critical"}
    assert "token" not in {e["event"] for e in events}  # tokens are streamed, not kept in the state
    assert handled[0] == "DebateStarted" and handled[-1] == "DebateDone" and "TokenDelta" in handled


async def test_the_timeout_ends_the_graph_as_engine_run_does() -> None:
    spec = affirmative_critical(timeout_s=0.05)
    with pytest.raises(DebateTimeout) as direct:
        await Engine(spec, ScriptedModel(fn=roles(), latency=30.0)).run(QUESTION)
    graph = compile_debate_graph(spec, ScriptedModel(fn=roles(), latency=30.0))
    nodes = await visited(graph, {"question": QUESTION}, debate_config(spec))
    assert nodes == ["open", "check", "round", "check", "finish"]
    with pytest.raises(DebateTimeout) as caught:
        await run_debate_graph(spec, QUESTION, ScriptedModel(fn=roles(), latency=30.0))
    partial = caught.value.result
    assert (
        partial.status == "timeout" and partial.stop_reason == "timeout" and partial.error == "timed out after 0.05 s"
    )
    assert all(t.error and "cancelled" in t.error for t in partial.turns())
    assert comparable(partial) == comparable(direct.value.result)
    assert partial.elapsed_s < 10.0  # the 30 s calls were cancelled, not waited for


async def test_a_debate_interrupted_between_rounds_resumes_from_the_checkpoint() -> None:
    spec = get_preset("affirmative-critical")
    direct_model = ScriptedModel(fn=roles())
    direct = await Engine(spec, direct_model).run(QUESTION)
    model = ScriptedModel(fn=roles())
    graph = compile_debate_graph(spec, model, checkpointer=InMemorySaver(), interrupt_after=["round"])
    cfg = debate_config(spec, thread_id="thread-1")
    out = await graph.ainvoke({"question": QUESTION}, cfg)
    assert len(model.requests) == 2 and out["final_answer"] is None
    snapshot = await graph.aget_state(cfg)
    assert snapshot.next == ("check",)
    paused = result_of(snapshot.values)
    assert paused.status == "running" and len(paused.rounds) == 1
    await graph.ainvoke(None, cfg)
    assert len(model.requests) == 4 and (await graph.aget_state(cfg)).next == ("check",)
    out = await graph.ainvoke(None, cfg)
    assert (await graph.aget_state(cfg)).next == ()
    result = result_of(out)
    assert len(model.requests) == 5 and prompts(model) == prompts(direct_model)
    assert comparable(result) == comparable(direct)
    assert [e["event"] for e in out["debate_events"]].count("turn_done") == 5  # one log across the pauses


async def test_a_failed_round_resumes_without_repeating_the_finished_ones() -> None:
    spec = get_preset("affirmative-critical")
    saver = InMemorySaver()
    first = roles()

    def crash_in_round_2(request: ChatRequest) -> str | BaseException:
        if "The previous round" in request.messages[1].content:
            return RuntimeError("the worker died")  # not a model error: it escapes the engine
        return first(request)

    model = ScriptedModel(fn=crash_in_round_2)
    with pytest.raises(RuntimeError, match="the worker died"):  # (as it was raised, not in a task group's group)
        await run_debate_graph(spec, QUESTION, model, checkpointer=saver, thread_id="t")
    openings = [r for r in model.requests if "The previous round" not in r.messages[1].content]
    assert len(openings) == 2
    # A new process: a new graph and a new model, the same checkpointer and thread.
    graph = compile_debate_graph(spec, ScriptedModel(fn=roles()), checkpointer=saver)
    snapshot = await graph.aget_state(debate_config(spec, thread_id="t"))
    assert snapshot.next == ("round",) and len(result_of(snapshot.values).rounds) == 1
    later = ScriptedModel(fn=roles())
    result = await run_debate_graph(spec, None, later, checkpointer=saver, thread_id="t")
    assert len(later.requests) == 3  # round 2 and the synthesis only
    assert all("The previous round" in r.messages[1].content for r in later.requests[:2])
    assert result.status == "complete" and len(result.rounds) == 2 and result.llm_calls == 5
    assert [t.text for t in result.rounds[0].turns] == [
        "Affirmative answer 1: RAG retrieves then generates.",
        "Critical answer 1: RAG retrieves then generates.",
    ]
    with pytest.raises(ValueError, match="no unfinished debate"):
        await run_debate_graph(spec, None, later, checkpointer=saver, thread_id="t")
    with pytest.raises(ValueError, match="needs the checkpointer and the thread_id"):
        await run_debate_graph(spec, None, later)


class Parent(TypedDict, total=False):
    topic: str
    question: str
    context: list[Any]
    debate_result: dict[str, Any]
    final_answer: str | None
    debate_events: Annotated[list[dict[str, Any]], operator.add]
    reports: Annotated[list[str], operator.add]


async def test_the_subgraph_is_a_node_of_a_parent_graph() -> None:
    spec = get_preset("affirmative-critical")
    model = ScriptedModel(fn=roles())
    debate = debate_subgraph(spec, model).compile()

    def ask(topic: str) -> Callable[[Parent], dict[str, Any]]:
        return lambda state: {"question": f"What is {topic}?", "context": CONTEXT}

    def report(state: Parent) -> dict[str, Any]:
        return {"reports": [f"{state['question']} -> {state['final_answer']} ({state['debate_result']['status']})"]}

    builder = StateGraph(Parent)
    builder.add_node("ask_rag", ask("RAG"))
    builder.add_node("debate_rag", debate)
    builder.add_node("report_rag", report)
    builder.add_node("ask_debate", ask("debate"))
    builder.add_node("debate_again", debate)
    builder.add_node("report_debate", report)
    for a, b in [(START, "ask_rag"), ("ask_rag", "debate_rag"), ("debate_rag", "report_rag"),
                 ("report_rag", "ask_debate"), ("ask_debate", "debate_again"), ("debate_again", "report_debate"),
                 ("report_debate", END)]:  # fmt: skip
        builder.add_edge(a, b)
    parent = builder.compile()
    out = await parent.ainvoke({"topic": "x"}, debate_config(spec))
    assert len(model.requests) == 10
    assert out["reports"] == [
        "What is RAG? -> Synthesizer answer 1: RAG retrieves then generates. (complete)",
        "What is debate? -> Synthesizer answer 2: RAG retrieves then generates. (complete)",
    ]
    kinds = [e["event"] for e in out["debate_events"]]
    assert kinds.count("debate_started") == 2 and kinds.count("turn_done") == 10  # each debate's log once
    assert result_of(out).task.question == "What is debate?"
    assert not {"debate_route", "debate_elapsed_s", "debate_timed_out"} & set(out)
    # The subgraph's custom events reach the parent's stream, under the subgraph's namespace.
    streamed = [c async for c in parent.astream({"topic": "x"}, debate_config(spec), stream_mode="custom",
                                                subgraphs=True)]  # fmt: skip
    namespaces = {ns[0].split(":")[0] for ns, _ in streamed}
    assert namespaces == {"debate_rag", "debate_again"}
    assert sum(1 for _, e in streamed if e["event"] == "turn_done") == 10


# ------------------------------------------------------------ seed 003: agents -> debate -> verify


def finding(value: float, source: str = "GCC-STAT", period: str = "Q1-2024", confidence: float = 0.9) -> dict[str, Any]:
    return {"metric": "qatar_unemployment_rate", "value": value, "unit": "%", "confidence": confidence,
            "citation": {"source": source, "period": period}}  # fmt: skip


def verdict(resolution: str, confidence: float = 0.85, value: float | None = None) -> dict[str, Any]:
    action = {"both_valid": "use_both", "neither_valid": "flag_for_review"}.get(
        resolution, "use_" + resolution.removesuffix("_correct")
    )
    return {"resolution": resolution, "explanation": "Because.", "recommended_value": value,
            "recommended_citation": None, "confidence": confidence, "action": action}  # fmt: skip


class Workflow(TypedDict, total=False):
    agent_reports: list[Any]
    debate_results: dict[str, Any]
    verified: list[float | None]


def workflow(reports: list[Any], node: Any) -> Any:
    """classify -> ... -> agents -> debate -> verify, the seed's placement."""

    def agents(state: Workflow) -> dict[str, Any]:
        return {"agent_reports": reports}

    def verify(state: Workflow) -> dict[str, Any]:
        values = [f["value"] if isinstance(f, dict) else f.value for r in state["agent_reports"] for f in (
            r["findings"] if isinstance(r, dict) else r.findings)]  # fmt: skip
        return {"verified": values}

    builder = StateGraph(Workflow)
    builder.add_node("agents", agents)
    builder.add_node("debate", node)
    builder.add_node("verify", verify)
    builder.add_edge(START, "agents")
    builder.add_edge("agents", "debate")
    builder.add_edge("debate", "verify")
    builder.add_edge("verify", END)
    return builder.compile()


SCENARIOS: dict[str, tuple[list[Any], list[dict[str, Any]], dict[str, Any], list[float]]] = {
    "no contradiction": (
        [
            {"agent": "LabourEconomist", "findings": [finding(0.10)]},
            {"agent": "NationalStrategy", "findings": [finding(0.10, "World Bank", confidence=0.8)]},
            {"agent": "SkillsAnalyst", "findings": [finding(0.1, confidence=0.7)]},
        ],
        [],
        {},
        [0.10, 0.10, 0.1],
    ),
    "simple": (
        [
            {"agent": "LabourEconomist", "findings": [finding(0.10, confidence=0.9)]},
            {"agent": "NationalStrategy", "findings": [finding(0.14, confidence=0.6)]},
        ],
        [verdict("agent1_correct", value=0.10)],
        {},
        [0.10, 0.10],
    ),
    "source conflict": (
        [
            {"agent": "NationalStrategy", "findings": [finding(0.12, "World Bank", "2024", 0.85)]},
            {"agent": "LabourEconomist", "findings": [finding(0.10, "GCC-STAT", "2024", 0.80)]},
        ],
        [verdict("agent2_correct", 0.9, 0.10)],
        {"source_authority": ["GCC-STAT", "World Bank"]},
        [0.10, 0.10],
    ),
    "both valid": (
        [
            {"agent": "LabourEconomist", "findings": [finding(0.10, "GCC-STAT", "Q1-2024", 0.9)]},
            {"agent": "NationalStrategy", "findings": [finding(0.12, "World Bank", "2024", 0.85)]},
        ],
        [verdict("both_valid", 0.8)],
        {},
        [0.10, 0.12],
    ),
    "three-way": (
        [
            {"agent": "LabourEconomist", "findings": [finding(12.0, "World Bank", "2022", 0.6)]},
            {"agent": "NationalStrategy", "findings": [finding(14.2, "Ministry of Labour", "2023", 0.7)]},
            {"agent": "SkillsAnalyst", "findings": [finding(9.8, "GCC-STAT", "2023", 0.75)]},
        ],
        [verdict("agent3_correct", 0.8, 9.8)],
        {"source_authority": ["GCC-STAT", "Ministry of Labour", "World Bank"]},
        [9.8, 9.8, 9.8],
    ),
}


@pytest.mark.req("S003-NODE")
@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_the_debate_node_between_agents_and_verify(scenario: str, monkeypatch: pytest.MonkeyPatch) -> None:
    reports, replies, cfg, values = SCENARIOS[scenario]
    model = ScriptedModel(replies)
    calls: list[tuple[Any, ...]] = []
    node = debate_node(ArbitrationConfig(**cfg), model=model, event_callback=lambda *a: calls.append(a))
    out = await workflow(reports, node).ainvoke({})
    results = out["debate_results"]
    assert len(model.requests) == len(replies)
    assert out["verified"] == values
    assert calls[0] == ("debate", "running") and len(calls) == 2
    step, status, summary, latency = calls[1]
    assert (step, status) == ("debate", "complete") and latency == results["latency_ms"]
    if not replies:
        assert results == {"contradictions_found": 0, "status": "skipped", "latency_ms": latency}
        assert summary == {"contradictions": 0, "resolved": 0, "flagged": 0, "status": "skipped"}
        assert out["agent_reports"] == reports  # not rewritten
    else:
        assert results["status"] == "complete" and results["contradictions_found"] == 1
        assert results["resolved"] == 1 and results["flagged_for_review"] == 0
        assert results["consensus_narrative"].startswith("1 contradiction found: 1 resolved, 0 flagged for review.")
        assert summary == {"contradictions": 1, "resolved": 1, "flagged": 0, "status": "complete"}
        assert all(isinstance(r, dict) and r["findings"][0]["arbitration"] for r in out["agent_reports"])


@pytest.mark.req("S003-NODE")
async def test_no_contradiction_never_resolves_a_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOOT_MODEL", "nonsense:model")  # would fail if it were resolved
    reports, _, _, values = SCENARIOS["no contradiction"]
    out = await workflow(reports, debate_node()).ainvoke({})
    assert out["debate_results"]["status"] == "skipped" and out["verified"] == values
    with pytest.raises(ModelConfigError):
        await workflow(SCENARIOS["simple"][0], debate_node()).ainvoke({})


class ParallelWorkflow(TypedDict, total=False):
    agent_reports: Annotated[list[dict[str, Any]], operator.add]
    debate_results: dict[str, Any]
    verified: list[str]
    event_callback: Any


async def test_parallel_agents_and_an_async_callback_from_the_state() -> None:
    reports = SCENARIOS["both valid"][0]
    model = ScriptedModel([verdict("both_valid", 0.8)])
    calls: list[tuple[Any, ...]] = []

    async def callback(*args: Any) -> None:
        await asyncio.sleep(0)
        calls.append(args)

    builder = StateGraph(ParallelWorkflow)
    for i, report in enumerate(reports):
        builder.add_node(f"agent{i}", lambda state, r=report: {"agent_reports": [r]})
        builder.add_edge(START, f"agent{i}")
    builder.add_node("debate", debate_node(model=model, overwrite=True))
    builder.add_node("verify", lambda state: {"verified": sorted(r["agent"] for r in state["agent_reports"])})
    builder.add_edge([f"agent{i}" for i in range(len(reports))], "debate")
    builder.add_edge("debate", "verify")
    builder.add_edge("verify", END)
    out = await builder.compile().ainvoke({"event_callback": callback})
    assert out["verified"] == ["LabourEconomist", "NationalStrategy"]  # replaced, not appended to
    assert all(r["findings"][0]["arbitration"]["action"] == "kept_both" for r in out["agent_reports"])
    assert [c[:2] for c in calls] == [("debate", "running"), ("debate", "complete")]
    assert calls[1][2]["resolved"] == 1


async def test_the_debate_node_keeps_models_and_writes_where_told() -> None:
    reports = [AgentReport.model_validate(r) for r in SCENARIOS["simple"][0]]
    node = debate_node(model=ScriptedModel([verdict("agent1_correct", value=0.10)]), output_key="adjusted",
                       results_key="arbitration")  # fmt: skip
    update = await node({"agent_reports": reports})
    assert set(update) == {"adjusted", "arbitration"}
    assert all(isinstance(r, AgentReport) for r in update["adjusted"])
    assert [r.findings[0].value for r in update["adjusted"]] == [0.10, 0.10]
    assert update["arbitration"]["resolved"] == 1


async def test_a_failing_callback_does_not_break_the_node(caplog: pytest.LogCaptureFixture) -> None:
    def broken(*args: Any) -> None:
        raise RuntimeError("ui gone")

    node = debate_node(model=ScriptedModel([]), event_callback=broken)
    update = await node({"agent_reports": SCENARIOS["no contradiction"][0]})
    assert update["debate_results"]["status"] == "skipped"
    assert "debate event callback failed on 'running': RuntimeError: ui gone" in caplog.text


async def test_an_arbitration_error_is_reported_then_raised() -> None:
    calls: list[tuple[Any, ...]] = []
    node = debate_node(protocol="no-such-protocol", model=ScriptedModel([]), event_callback=lambda *a: calls.append(a))
    with pytest.raises(ProtocolFileError):
        await node({"agent_reports": SCENARIOS["simple"][0]})
    assert [c[:2] for c in calls] == [("debate", "running"), ("debate", "error")]
    assert "no protocol preset named 'no-such-protocol'" in calls[1][2]["error"]


# ------------------------------------------------------------------------------ the extra


def test_a_missing_langgraph_is_a_clear_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in sys.modules if n == "langgraph" or n.startswith("langgraph.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, "moot.integrations.langgraph")
    with pytest.raises(ModelConfigError) as caught:
        importlib.import_module("moot.integrations.langgraph")
    assert isinstance(caught.value, ImportError) and isinstance(caught.value, MissingExtra)
    message = str(caught.value)
    assert "\n" not in message and "pip install 'moot[langgraph]'" in message and "langgraph" in message


async def test_a_resumed_debate_with_no_time_left_times_out_without_calling() -> None:
    spec = affirmative_critical(timeout_s=5.0)
    model = ScriptedModel(fn=roles())
    saver = InMemorySaver()
    graph = compile_debate_graph(spec, model, checkpointer=saver, interrupt_after=["round"])
    cfg = debate_config(spec, thread_id="late")
    await graph.ainvoke({"question": QUESTION}, cfg)
    await graph.aupdate_state(cfg, {"debate_elapsed_s": 5.0})  # the budget is spent
    resumed = compile_debate_graph(spec, model, checkpointer=saver)
    assert await visited(resumed, None, cfg) == ["check", "round", "check", "finish"]
    out = (await resumed.aget_state(cfg)).values
    result = result_of(out)
    assert len(model.requests) == 2 and result.status == "timeout" and result.error == "timed out after 5 s"
    assert len(result.rounds) == 1


async def test_a_timeout_error_that_is_not_the_budget_propagates_as_in_engine_run() -> None:
    def reply(request: ChatRequest) -> str | BaseException:
        return TimeoutError("a socket") if "Synthesizer" in request.messages[0].content else "ok"

    spec = affirmative_critical(1, timeout_s=5.0)
    with pytest.raises(TimeoutError, match="a socket") as direct:
        await Engine(spec, ScriptedModel(fn=reply)).run(QUESTION)
    assert not isinstance(direct.value, DebateTimeout)
    with pytest.raises(TimeoutError, match="a socket") as caught:
        await run_debate_graph(spec, QUESTION, ScriptedModel(fn=reply))
    assert not isinstance(caught.value, DebateTimeout)


def test_turn_events_are_plain_data() -> None:
    result = DebateResult(protocol="p", task={"question": "q"})  # type: ignore[arg-type]
    turn = Turn(speaker="a", name="A", round=1, model="m", messages=[], text="hi")
    assert event_dict(TurnRetry(result, "a", 1, 2, "429")) == {
        "event": "turn_retry", "protocol": "p", "speaker": "a", "round": 1, "attempt": 2, "error": "429",
    }  # fmt: skip
    assert event_dict(TokenDelta(result, "a", 1, " hi")) == {
        "event": "token", "protocol": "p", "speaker": "a", "round": 1, "text": " hi",
    }  # fmt: skip
    failed = Turn(speaker="b", name="B", round=1, model="m", messages=[], error="down")
    assert event_dict(RoundDone(result, Round(index=1, turns=[turn, failed]))) == {
        "event": "round_done", "protocol": "p", "round": 1, "speakers": ["a", "b"], "failed": ["b"],
    }  # fmt: skip
    assert event_dict(TurnDone(result, turn)) == {
        "event": "turn_done", "protocol": "p", "speaker": "a", "name": "A", "role": "", "round": 1,
        "kind": "debate", "model": "m", "ok": True, "text": "hi", "parsed": None, "error": None, "calls": 0,
        "tokens": 0, "latency_s": 0.0, "trimmed": False,
    }  # fmt: skip
