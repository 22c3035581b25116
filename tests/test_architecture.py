"""The shape of the code: checks that fail when a change breaks the layering docs/architecture.md describes."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[1] / "src" / "moot" / "core"
PACKAGE = CORE.parent

#: The layers, lowest first: a module may import only from its own layer or a lower one, at the top
#: of a file, inside a function or under ``TYPE_CHECKING`` alike (docs/architecture.md draws it).
#: ``moot`` itself (the package root) is the public facade: nothing inside the package imports it.
LAYERS: list[set[str]] = [
    {"_version", "secrets", "files", "runlock", "stats"},
    {"models"},
    {"testing"},  # the fake OpenAI-compatible server: a model's wire, nothing above it
    {"structured"},
    {"core"},
    {"protocols"},
    {"quality"},
    {"scale"},
    {"eval"},
    {"batch"},  # a thin adapter over eval's store and scale's executors
    {"apps"},  # the seeds' applications, on the library (they may use the harness, not the front doors)
    {"integrations"},  # langgraph's seed-003 node uses apps
    {"server"},
    {"cli"},
    {"__main__"},  # ``python -m moot``: the CLI, nothing else
    {"moot"},
]

#: The inner order of ``server/``, lowest first, by what sits directly under ``moot.server``: a module
#: (``policy``) or a sub-package (``state``, the whole of it); the same rule: a server module imports
#: only server modules of its own layer or a lower one. ``__init__`` is the package itself
#: (``moot.server``), which only re-exports: it is on top.
SERVER_LAYERS: list[set[str]] = [
    # request limits and refusals; a ``moot tune`` file read as a protocol; ASGI pieces; a body's JSON read
    {"limits", "tuned", "asgi", "bodies"},
    {"schemas", "settings"},  # the wire's pydantic models; what a ``moot serve`` process may do
    {"policy"},  # what a request may ask for, within the settings
    {"state"},  # the store and its backends, the live bus, the event logs, the keys, the manager (below)
    {"openai"},  # the OpenAI door: chat completions, the Responses API, what each field does (below)
    {"mcp"},  # the MCP door (`moot mcp`, /mcp): the same policy, manager and store
    {"http"},  # the HTTP door: routers, the connection guard, create_app (below)
    {"view"},  # ``moot view``: a read-only viewer over a run (http.app's headers)
    {"__init__"},
]

#: Inside each sub-package of ``server/``, its modules in order, lowest first, by the same rule;
#: ``__init__`` is the sub-package itself (``moot.server.state``), placed where what it imports and
#: who imports it put it. A module added to a sub-package is placed here by name.
SUBPACKAGE_LAYERS: dict[str, list[set[str]]] = {
    "state": [
        {"keys", "result_json"},  # an API key as stored; a debate's stored JSON, each finished turn encoded once
        {"base"},  # the store's interface (Store) and its records
        {"sql_schema"},  # what both SQL backends share: the schema, its migrations, the backend's part
        {"sql_keys"},  # the API keys' queries
        {"sql"},  # the debates' queries: added, written, read, claimed, cancelled
        {"sqlite", "postgres"},  # the two backends
        {"bus_base"},  # the live bus's interface, its events, a subscription with its gaps filled from the store
        {"bus_memory", "bus_redis"},  # the in-process bus; the bus over Redis
        {"copy", "bus"},  # moot store copy; the live bus between replicas: one opened (in process, Redis)
        {"__init__"},  # open_store: a backend chosen by --db
        {"events", "keyring"},  # each debate's numbered event log; the API keys as requests are checked
        {"live"},  # LiveDebate: a debate as this replica holds it, and the words it ends with
        {"leases"},  # LeaseKeeper: the running debates' leases renewed, checked (fencing), handed back
        {"writes"},  # EventWriter: a running debate's events into its log and the store, batched
        {"recovery", "takeover"},  # stored debates built again (a restart); the shared queue polled, claims taken
        {"cancels"},  # a cancel across replicas: here, through the store's mark and the bus
        {"manager"},  # DebateManager: its public face (submit, cancel, follow) and each debate's run
        {"idempotency"},  # an Idempotency-Key's debate, created once (POST /v1/debates, the OpenAI door)
    ],
    "openai": [
        {"__init__"},  # a docstring: the door's plan
        {"chat_wire"},  # the chat completions API's wire shapes (request, completion, chunk)
        # a file a request sends inline, read into a passage (a PDF, text); what the Open Responses
        # standard asks of a response (fields, compaction); the models offered (moot/<protocol>, the
        # tuned one, their cards); a field refused by name
        {"input_files", "open_responses", "catalogue", "refusals"},
        {"conversation", "reply_format"},  # a request's messages as a debate reads them; a typed reply's schema
        {"asked"},  # what one request asks (Asked), and the reply a finished debate gives it (its cut, its stops)
        {"submission"},  # a read request's debate queued, or built again from its stored request
        {"fields"},  # what each chat completion field does: honoured or refused by name, read into Asked
        {"debate_feed"},  # a live debate as an OpenAI-shaped stream of pieces
        # /v1/chat/completions and /v1/models; a stored response's state; a Responses request read once
        {"chat", "responses_state", "responses_request"},
        {"response_objects"},  # the Responses API's wire objects (the response, its items, its usage)
        {"responses_replay"},  # a stored response followed: a background one's end kept, its stream replayed
        {"responses_stream", "responses_stored"},  # a streamed response's typed events; the stored responses' routes
        {"responses"},  # /v1/responses and its router
        {"responses_modes"},  # background, streamed and compacted responses
    ],
    "mcp": [  # (its package docstring lists the same order)
        {"tools"},  # the tools' typed arguments and results; a debate request checked and queued
        {"results"},  # a debate's outcome as a tool result; the protocol catalogue
        {"progress"},  # a debate's events as progress notifications
        {"tasks"},  # MCP Tasks: a debate run as a task
        {"malformed"},  # messages the SDK's parser refuses without a useful reason
        {"server"},  # MootMCP: the tools' dispatch and the resources
        {"transports"},  # /mcp on moot serve; moot mcp over stdio
        {"__init__"},  # re-exports
    ],
    "http": [
        {"__init__"},  # a docstring: the door's plan
        {"streams"},  # the SSE response: its keepalives, its client gone, a graceful stop
        {"connections"},  # the connection deadline and cap, refused with the API's error body
        {"routes"},  # the routers: the debates API, the catalogue, the chat endpoint, the viewer's pages
        # the log lines' secrets redacted; the error body and its handlers
        {"redaction", "errors"},
        # the ASGI middleware (Host, key, body, headers, request id); the OpenAPI schema
        {"middleware", "openapi"},
        {"mcp_mount"},  # /mcp: the MCP SDK loaded by the endpoint's first request
        {"app"},  # create_app: the lifespan (store, bus, manager), the middleware stacked, the routers
    ],
    "view": [
        {"__init__"},  # a docstring
        {"data"},  # a run read once into typed rows
        {"api"},  # its read-only app
    ],
}


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


def test_neither_batch_nor_apps_imports_the_other() -> None:
    """``apps/`` sits above ``batch/`` only so that an application may use the harness; the layers
    would let it import ``batch/``, and docs/architecture.md says neither imports the other."""
    graph = package_imports()
    crossing = sorted(
        (m, d)
        for m, deps in graph.items()
        for d in deps
        for a, b in (("moot.apps", "moot.batch"), ("moot.batch", "moot.apps"))
        if (m == a or m.startswith(a + ".")) and (d == b or d.startswith(b + "."))
    )
    assert crossing == []


def test_the_layer_checker_finds_an_upward_import() -> None:
    assert layer_of("moot.models.registry") < layer_of("moot.integrations.langchain")
    assert layer_of("moot._version") == 0 and layer_of("moot") == len(LAYERS) - 1
    # each of these once shared a layer with the other
    assert layer_of("moot.models.base") < layer_of("moot.testing.fake_openai")
    assert layer_of("moot.batch.runner") < layer_of("moot.apps.rag")
    assert layer_of("moot.cli.main") < layer_of("moot.__main__") < layer_of("moot")


def server_layer_of(module: str) -> tuple[int, int]:
    """Where a module of ``moot.server`` sits: the layer of what it is under (``SERVER_LAYERS``) and,
    inside a sub-package, its own layer there (``SUBPACKAGE_LAYERS``; 0 for a module of the top)."""
    parts = module.split(".")
    inner = parts[2] if len(parts) > 2 else "__init__"
    outer = next((i for i, layer in enumerate(SERVER_LAYERS) if inner in layer), None)
    if outer is None:
        raise AssertionError(f"{module}: {inner!r} is in no layer of SERVER_LAYERS; add it where it belongs")
    if inner not in SUBPACKAGE_LAYERS:
        if (PACKAGE / "server" / inner).is_dir():
            raise AssertionError(f"{module}: the sub-package {inner!r} has no inner order in SUBPACKAGE_LAYERS")
        return outer, 0
    name = parts[3] if len(parts) > 3 else "__init__"
    for i, layer in enumerate(SUBPACKAGE_LAYERS[inner]):
        if name in layer:
            return outer, i
    raise AssertionError(f"{module}: {name!r} is in no layer of SUBPACKAGE_LAYERS[{inner!r}]; add it where it belongs")


def upward_server_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import inside ``moot.server`` that goes up: to a higher layer of ``SERVER_LAYERS``, or,
    between two modules of one sub-package, to a higher layer of its inner order."""
    found = []
    for m, deps in graph.items():
        for d in deps:
            # ``from moot.server import x`` names the package too; any import of a submodule runs it anyway
            if not d.startswith("moot.server."):
                continue
            (m_outer, m_inner), (d_outer, d_inner) = server_layer_of(m), server_layer_of(d)
            same_package = m.split(".")[:3] == d.split(".")[:3]
            if d_outer > m_outer or (same_package and d_inner > m_inner):
                found.append(f"{m} (server layer {m_outer}.{m_inner}) imports {d} (server layer {d_outer}.{d_inner})")
    return sorted(found)


def server_imports() -> dict[str, set[str]]:
    return {m: deps for m, deps in package_imports().items() if m == "moot.server" or m.startswith("moot.server.")}


def test_every_import_inside_the_server_goes_down_its_inner_layers() -> None:
    graph = server_imports()
    assert {"moot.server.state.manager", "moot.server.http.routes", "moot.server.openai.chat"} <= set(graph)
    for module in graph:  # every module is placed, in a sub-package too
        server_layer_of(module)
    assert upward_server_imports(graph) == []


def test_the_server_checker_finds_an_upward_import_between_and_inside_sub_packages() -> None:
    # the state under the doors: a store module importing a door goes up
    assert upward_server_imports({"moot.server.state.manager": {"moot.server.http.routes"}}) != []
    # inside the state: the manager under the idempotency that joins its debates
    assert upward_server_imports({"moot.server.state.manager": {"moot.server.state.idempotency"}}) != []
    assert upward_server_imports({"moot.server.state.idempotency": {"moot.server.state.manager"}}) == []
    # a door may use any module of the state, whatever its inner layer
    assert upward_server_imports({"moot.server.http.routes": {"moot.server.state.idempotency"}}) == []


def test_the_server_checker_puts_the_state_below_the_doors() -> None:
    state = max(server_layer_of(f"moot.server.{m}") for m in ("state", "state.events", "state.manager"))
    doors = min(
        server_layer_of(f"moot.server.{m}")
        for m in ("openai", "openai.chat", "openai.responses", "http", "http.routes", "http.app")
    )
    assert state < doors
    assert server_layer_of("moot.server")[0] == len(SERVER_LAYERS) - 1


def test_the_package_root_imports_the_applications_only_when_asked() -> None:
    """``import moot`` loads the library, not the RAG app or batch runs (0.78 -> 0.50 s of CPU); each
    public name still resolves, to what its module defines, and
    the names type checkers see come from the same modules. A process that imports only a job's
    module (a Ray worker unpickling it) knows the turn schemas the presets name."""
    import moot

    for name in moot.__all__:
        assert getattr(moot, name) is not None, name
    for name, module in moot._LAZY.items():
        assert getattr(moot, name) is getattr(importlib.import_module(module), name), name
    root = Path(moot.__file__).read_text(encoding="utf-8")
    checking = next(n for n in ast.parse(root).body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    typed = {
        alias.name: node.module for node in checking.body if isinstance(node, ast.ImportFrom) for alias in node.names
    }
    assert typed == moot._LAZY
    with pytest.raises(AttributeError, match="module 'moot' has no attribute 'Nothing'"):
        _ = moot.Nothing
    code = (
        "import moot, sys; from moot.structured import get_schema; get_schema('argument'); "
        "print(sorted({m.split('.')[1] for m in sys.modules if m.startswith('moot.')} & {'apps', 'batch', 'eval'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"
    code = "import moot.scale.jobs; from moot.structured import get_schema; print(get_schema('argument').__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "Argument"
    # ``moot mcp`` takes the server's settings from moot.server, not its HTTP app (FastAPI: 0.4 s)
    code = "import moot.server, sys; print('fastapi' in sys.modules, moot.server.create_app.__module__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["False", "moot.server.http.app"]


#: The longest a module may grow (issue 43: no file over 600 lines holding more than one concern):
#: past it, the module is split by concern rather than let grow.
MAX_MODULE_LINES = 600


def test_no_module_of_the_package_is_over_the_line_limit() -> None:
    long = {
        str(path.relative_to(PACKAGE)): n
        for path in PACKAGE.rglob("*.py")
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines, split them by concern: {long}"
