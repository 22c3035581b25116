"""A RAG pipeline with moot's debate step, as a real LangGraph graph (seed 000, phase 4).

    retrieve -> generate -> debate -> END

``retrieve`` ranks the passages of a small in-file corpus by keyword overlap with the question,
``generate`` asks the model for an initial answer from them (one call), and ``debate`` is
:func:`moot.apps.rag.make_debate_step`: off unless the ``debate_mode`` flag is on (``--debate`` or
``MOOT_DEBATE_MODE=1``), it then runs the affirmative/critical debate within the step's budget and
replaces the answer with the synthesis, or keeps the initial answer on a timeout or an error.

    .venv/bin/pip install -e '.[langgraph,embedded]'
    .venv/bin/python examples/rag_pipeline.py "What happens when the debate step times out?"
    .venv/bin/python examples/rag_pipeline.py "..." --debate --timeout 180    # a 1.5B model on 2 cores needs minutes
    .venv/bin/python examples/rag_pipeline.py "..." --debate --model openai:gpt-4o-mini

With the embedded model on a small CPU the default 10 s budget expires: the output then shows the
initial answer kept and ``debate: timeout``, which is the fallback working as designed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from collections.abc import Sequence
from typing import Any, TypedDict, cast

try:
    from langgraph.graph import END, START, StateGraph
    from langgraph.graph.state import CompiledStateGraph
except ModuleNotFoundError:  # (run as a script: one line, as the library says it)
    sys.exit("error: this example needs langgraph, which is not installed: pip install 'moot[langgraph]'")

from moot.apps.rag import DebateStepSettings, make_debate_step
from moot.core.types import check_question
from moot.models.base import BaseChatModel, ChatRequest, Message, ModelError
from moot.models.registry import resolve_model

CORPUS: list[dict[str, str]] = [
    {
        "source": "rag-basics.md",
        "text": "Retrieval-augmented generation (RAG) retrieves passages from a document store at question time "
        "and asks a language model to answer from them. Grounding reduces, but does not remove, fabricated "
        "statements.",
    },
    {
        "source": "retrieval-quality.md",
        "text": "Answer quality tracks retrieval quality: when the retriever returns irrelevant or outdated "
        "passages, the model can answer confidently from the wrong evidence.",
    },
    {
        "source": "debate-step.md",
        "text": "The debate step runs an affirmative and a critical agent for two rounds and a synthesizer that "
        "combines their answers: five model calls. It replaces the pipeline's answer with the synthesis.",
    },
    {
        "source": "fallback.md",
        "text": "The debate step has a budget of 10 seconds. When the budget expires or a model call fails, "
        "the step keeps the initial answer of the generate step and records the timeout or the error.",
    },
    {
        "source": "feature-flag.md",
        "text": "The debate step is behind the debate_mode feature flag, off by default. With the flag off "
        "the step is skipped: it calls no model and costs nothing.",
    },
    {
        "source": "chunking.md",
        "text": "Documents are split into chunks of a few hundred tokens before indexing; overlapping chunks "
        "keep sentences that cross a boundary retrievable.",
    },
]

_STOPWORDS = (
    "a an and are as at be by can do does for from has how in is it its of on or the their them then this to "
    "what when which who why with"
)
STOPWORDS = frozenset(_STOPWORDS.split())


def keywords(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9_]+", text.lower()) if w not in STOPWORDS and len(w) > 1}


def retrieve(query: str, k: int = 3, corpus: Sequence[dict[str, str]] = CORPUS) -> list[dict[str, str]]:
    """The ``k`` passages sharing the most keywords with ``query`` (ties: corpus order); none if nothing matches."""
    wanted = keywords(query)
    scored = [(len(wanted & keywords(doc["text"])), -i, doc) for i, doc in enumerate(corpus)]
    return [doc for score, _, doc in sorted(scored, key=lambda s: (s[0], s[1]), reverse=True)[:k] if score > 0]


class PipelineState(TypedDict, total=False):
    query: str
    documents: list[dict[str, str]]
    answer: str
    #: The debate step's record: status (applied / disabled / timeout / error), elapsed_ms, reason, ...
    debate: dict[str, Any]


def generate_request(query: str, documents: Sequence[dict[str, str]]) -> ChatRequest:
    context = "\n".join(f"[{i}] {d['text']} (source: {d['source']})" for i, d in enumerate(documents, 1))
    return ChatRequest(
        messages=[
            Message(role="system", content="You answer questions from the given passages only, citing them as [n]."),
            Message(
                role="user",
                content=f"Question: {query}\n\nPassages:\n{context or '(none found)'}\n\n"
                "Answer in two or three sentences.",
            ),
        ],
        max_tokens=200,
        temperature=0.0,
    )


def build_pipeline(
    model: str | BaseChatModel | None = None,
    *,
    debate_model: str | BaseChatModel | None = None,
    settings: DebateStepSettings | dict[str, Any] | None = None,
) -> CompiledStateGraph[PipelineState, None, PipelineState, PipelineState]:
    """The compiled graph. ``model`` generates (default: ``$MOOT_MODEL`` or the embedded model);
    ``debate_model`` debates (default: the same model). Nothing is loaded until the graph runs."""
    generator = resolve_model(model)
    debate = make_debate_step(debate_model if debate_model is not None else generator, settings)

    async def retrieve_node(state: PipelineState) -> dict[str, Any]:
        return {"documents": retrieve(state["query"])}

    async def generate_node(state: PipelineState) -> dict[str, Any]:
        response = await generator.complete(generate_request(state["query"], state.get("documents", [])))
        return {"answer": response.text.strip()}

    builder = StateGraph(PipelineState)
    builder.add_node("retrieve", retrieve_node)
    builder.add_node("generate", generate_node)
    builder.add_node("debate", debate)
    builder.add_edge(START, "retrieve")
    builder.add_edge("retrieve", "generate")
    builder.add_edge("generate", "debate")
    builder.add_edge("debate", END)
    return builder.compile(name="rag-pipeline")


async def run_pipeline(
    query: str,
    model: str | BaseChatModel | None = None,
    *,
    debate_model: str | BaseChatModel | None = None,
    settings: DebateStepSettings | dict[str, Any] | None = None,
) -> PipelineState:
    """The pipeline's final state for ``query``. A blank question is a ``ValueError``, before any
    model is loaded or called (it would be answered, then refused by the debate step: no query)."""
    check_question(query)
    graph = build_pipeline(model, debate_model=debate_model, settings=settings)
    return cast(PipelineState, await graph.ainvoke({"query": query}))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="retrieve -> generate -> debate, as a LangGraph graph")
    parser.add_argument("question")
    parser.add_argument("--model", default=None, help="model spec (default: $MOOT_MODEL or embedded)")
    parser.add_argument("--debate", action="store_true", help="turn the debate step on (else $MOOT_DEBATE_MODE)")
    parser.add_argument("--timeout", type=float, default=10.0, help="the debate step's budget in seconds (10)")
    parser.add_argument("--json", action="store_true", help="print the final state as JSON")
    args = parser.parse_args(argv)
    try:
        check_question(args.question)  # moot's own rule for a question (blank, or not Unicode text)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    settings = DebateStepSettings(debate_mode=True if args.debate else None, timeout_s=args.timeout)
    try:
        state = asyncio.run(run_pipeline(args.question, args.model, settings=settings))
    except ModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(state, indent=2, ensure_ascii=False))
        return 0
    record = state.get("debate", {})
    print("sources:", ", ".join(d["source"] for d in state.get("documents", [])) or "(none)")
    print(f"debate: {record.get('status')} in {record.get('elapsed_ms', 0):.0f} ms", end="")
    print(f" ({record['reason']})" if record.get("reason") else "")
    print()
    print(state.get("answer", ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
