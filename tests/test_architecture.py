"""The shape of the code: checks that fail when a change breaks the layering docs/architecture.md describes."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "src" / "moot" / "core"


def core_imports() -> dict[str, set[str]]:
    """Each core module's imports of other core modules: every import statement, whether at the top,
    inside a function or under ``TYPE_CHECKING`` (a cycle of type hints is still a cycle to a reader)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(CORE.glob("*.py")):
        if path.name == "__init__.py":
            continue
        name = path.stem
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            modules: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            for module in modules:
                if module.startswith("moot.core."):
                    deps.add(module.split(".")[2])
        graph[name] = deps - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle_through_a_type_hint() -> None:
    graph = {"engine": {"spec", "state"}, "spec": {"stop"}, "stop": {"engine"}, "state": {"types"}, "types": set()}
    assert cycles(graph) == [["engine", "spec", "stop"]]
    graph["stop"] = {"state"}
    assert cycles(graph) == []


def test_the_core_has_no_import_cycles() -> None:
    graph = core_imports()
    assert {"engine", "spec", "stop", "state", "types", "dynamics", "answers", "cost"} <= set(graph)
    assert cycles(graph) == []


def test_the_debate_record_depends_on_no_other_core_module() -> None:
    # types is the bottom layer: results are read back (load_result) without the engine or its metrics.
    assert core_imports()["types"] == set()
    assert core_imports()["state"] == {"types"}
