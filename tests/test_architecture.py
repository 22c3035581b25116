"""The shape of the code: checks that fail when a change breaks the layering docs/architecture.md describes."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "src" / "moot" / "core"
PACKAGE = CORE.parent

#: The layers, lowest first: a module may import only from its own layer or a lower one, at the top
#: of a file, inside a function or under ``TYPE_CHECKING`` alike (docs/architecture.md draws it).
#: ``moot`` itself (the package root) is the public facade: nothing inside the package imports it.
LAYERS: list[set[str]] = [
    {"_version", "secrets", "files", "runlock", "stats"},
    {"models", "testing"},
    {"structured"},
    {"core"},
    {"protocols"},
    {"quality"},
    {"scale"},
    {"eval"},
    {"batch", "apps"},
    {"integrations"},
    {"server"},
    {"cli", "__main__", "moot"},
]


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


def package_imports() -> dict[str, set[str]]:
    """Every module of the package and the package modules it imports, lazily or not."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module == "moot" or node.module.startswith("moot."):
                    deps.add(node.module)
                    # ``from moot.x import y`` may name a submodule y
                    deps.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name == "moot" or a.name.startswith("moot."))
        graph[name] = deps
    known = set(graph)
    return {m: {d for d in deps if d in known and d != m} for m, deps in graph.items()}


def layer_of(module: str) -> int:
    parts = module.split(".")
    top = "moot" if len(parts) == 1 else parts[1]
    for i, layer in enumerate(LAYERS):
        if top in layer:
            return i
    raise AssertionError(f"{module}: its package {top!r} is in no layer of LAYERS; add it where it belongs")


def test_every_import_in_the_package_goes_down_the_declared_layers() -> None:
    graph = package_imports()
    assert len(graph) > 100
    upward = sorted(
        f"{m} (layer {layer_of(m)}) imports {d} (layer {layer_of(d)})"
        for m, deps in graph.items()
        for d in deps
        if layer_of(d) > layer_of(m)
    )
    assert upward == []


def test_no_module_of_the_package_is_in_an_import_cycle() -> None:
    graph = package_imports()
    # A package's __init__ re-exporting its own submodules is not a cycle between modules.
    flat = {m: {d for d in deps if m != d.rsplit(".", 1)[0]} for m, deps in graph.items()}
    assert cycles(flat) == []


def test_the_layer_checker_finds_an_upward_import() -> None:
    assert layer_of("moot.models.registry") < layer_of("moot.integrations.langchain")
    assert layer_of("moot._version") == 0 and layer_of("moot") == len(LAYERS) - 1
