"""Issue 28, item 17: the code in the docs runs as written, so the docs cannot drift from moot again.

**Which files**: README.md and every ``docs/**/*.md``, except what moot itself writes there: the
``report.md`` files under ``docs/results/`` (``moot eval report`` and ``moot absa report`` output).
The hand-written READMEs beside those reports, which give the commands that made them, count.

**Every fenced block says what it is** by its info string, and that decides what is done with it:

=====================  ==============================================================================
``python``             run as written, by a new Python process in the scratch folder (below): exit 0,
                       no traceback
``python fragment``    a piece of a program (the engine's loop in architecture.md), not a program: it
                       must parse; at most ``MAX_FRAGMENTS`` in all the docs
``sh``                 run as written by ``bash -e -o pipefail`` in the scratch folder; its background
                       jobs are stopped when it ends
``sh costly``          not run, because running it costs what a test cannot pay: minutes of a real
                       model, a download or an install, a server that runs until stopped, a service
                       outside moot (Docker, Ray, Langfuse). Checked without running (below)
``yaml``, ``json``     loaded by moot's own loader of that kind of file (protocol, run file, prices;
                       an ABSA data row)
``text``               a diagram or output: not code
=====================  ==============================================================================

Any other info string, or none, fails the test naming the block.

**Every shell block** (run or not) passes ``bash -n``, and every ``moot`` command in it is parsed by
the real CLI: the typer app's ``make_context``, for the command and each subcommand, which checks
every option, type and range without running anything (moot has no dry-run mode). Then its input
files must exist (in the repository, among the reader's own files below, or written by a command
above it in the block), its model specs must name a backend and a known embedded model, and its
protocols and datasets must load. Other programs: ``make`` targets must be in the Makefile, Python
scripts and modules must exist, ``pip install 'moot[X]'`` extras must be in pyproject.toml, a curl
body must be JSON (and a valid ``POST /v1/debates`` request); a program this test does not know
fails it, to be checked here or listed in ``EXTERNAL`` with why. In a ``costly`` block a bare ``...``
stands for the options of the command above it (``moot batch claims.jsonl ... --ray local``) and is
left out before parsing (a block that runs cannot have one: bash would pass it on); a quoted
``"..."`` is a question.

**The scratch folder**: the repository's ``examples/``, ``src/`` and ``docs/`` linked in, and the
files the docs treat as the reader's own (``USER_FILES``: ``claims.jsonl``, ``notes.txt``, ...; for
the Python blocks also ``run.json``, a debate saved by ``moot debate ... --json run.json`` on the
fake model).

**The environment**: ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` point at the loopback fake
OpenAI-compatible server, which is where ``openai:MODEL`` goes as documented, so a block naming
``openai:gpt-4o-mini`` runs as written against it; ``OTEL_EXPORTER_OTLP_ENDPOINT`` points at a
loopback collector (the spans of docs/tracing.md must reach it). ``MOOT_MODEL`` is
``embedded:smollm2-135m``: only a block that names no model reads it. A block that mentions
``embedded`` is marked ``embedded`` and skipped, with the reason, when the tiny model (or an
embedded model it names) is not installed. A Python block that talks to ``127.0.0.1:PORT`` gets
``moot serve --models openai:fake`` on that port, as the docs start it; the ports a block names
are held by one test at a time on the machine (a lock file), and a port another program holds
skips the test with the reason.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import importlib.util
import itertools
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
import typer
import yaml
from markdown_it import MarkdownIt

from moot.cli.main import app
from moot.models.weights import CATALOG, is_installed
from moot.testing.fake_openai import FakeOpenAIServer, agent_reply

ROOT = Path(__file__).resolve().parent.parent
#: Only a hang reaches it: the slowest block (a debate on the tiny embedded model) takes about a
#: minute on a busy 2-core machine.
HANG_S = 900
#: Pieces of programs are allowed, but few: every other Python block is a program that runs.
MAX_FRAGMENTS = 2
FAKE_KEY = "sk-fake-docs-0000000000"
TINY = "smollm2-135m"

KINDS = {
    "python": "a program: run as written",
    "python fragment": "a piece of a program: parsed, not run",
    "sh": "commands that end in seconds: run as written by bash",
    "sh costly": "commands a test cannot pay for: parsed by the CLI and checked, not run",
    "yaml": "a protocol, run or price file: loaded by moot's loader",
    "json": "JSON (an ABSA data row: validated)",
    "text": "a diagram or output: not code",
}

#: The repository folders a block may read, linked into the scratch folder.
LINKED = ("examples", "src", "docs")
#: The files the docs treat as the reader's own, small.
USER_FILES = {
    "claims.jsonl": "".join(
        json.dumps(c) + "\n"
        for c in (
            {"id": "c1", "question": "Remote work improves productivity."},
            {"id": "c2", "question": "Nuclear power cuts emissions.", "context": ["It emits little CO2."]},
        )
    ),
    "notes.txt": "Nuclear power emits about as little CO2 over its life cycle as wind power.\n",
    "passages.jsonl": json.dumps({"text": "Building a reactor takes a decade.", "source": "iea.md"}) + "\n",
    "reports.json": (ROOT / "examples" / "reports.json").read_text(encoding="utf-8"),
    "prices.yaml": "openai:gpt-4o-mini: {input: 0.15, output: 0.60}\n",
    "mytask.jsonl": "".join(
        json.dumps({"question": f"Is {n} even?", "answer": "yes" if n % 2 == 0 else "no"}) + "\n" for n in range(20)
    ),
}
#: Programs of the shell blocks that are not moot and not checked further, with why.
EXTERNAL = {
    "export": "a shell builtin: the environment of the commands after it",
    "printf": "a shell builtin",
    "mkdir": "coreutils",
    "gunzip": "gzip, to unpack a committed run store",
    "docker": "Jaeger in a container (docs/tracing.md): a service outside moot",
    "phoenix": "Arize Phoenix's server (docs/tracing.md): a service outside moot",
    "ray": "Ray's own CLI, which starts a cluster (docs/scale-out.md)",
    "haproxy": "the balancer in front of moot serve's replicas (docs/scale-out.md): a service outside moot",
    "claude": "Claude Code's CLI, an MCP host that starts moot mcp (docs/mcp.md)",
}
#: Parameters of moot commands that name a file or folder the command writes.
OUTPUT_PARAMS = {"out", "export_path", "db", "json_path", "csv_out"}
#: Parameters that name a dataset moot knows, or a data file.
DATA_PARAMS = {"dataset", "data"}
#: A bare ``...`` in a costly command: the options of the command above, left out.
ELIDED = "\x00elided"


# ----------------------------------------------------------------------------------- the blocks


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    info: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def kind(self) -> str | None:
        info = " ".join(self.info.split())
        return info if info in KINDS else None


def doc_files() -> list[Path]:
    """README.md and docs/**/*.md, less the reports moot writes into docs/results/."""
    docs = ROOT / "docs"
    generated = {p for p in (docs / "results").rglob("report.md")}
    return [ROOT / "README.md", *sorted(p for p in docs.rglob("*.md") if p not in generated)]


def read_blocks(paths: list[Path]) -> list[Block]:
    found = []
    for path in paths:
        for token in MarkdownIt("commonmark").parse(path.read_text(encoding="utf-8")):
            if token.type in ("fence", "code_block"):
                info = token.info if token.type == "fence" else "(indented: give it a fence and an info string)"
                found.append(Block(path, (token.map or [0])[0] + 1, info.strip(), token.content))
    return found


BLOCKS = read_blocks(doc_files())


def of_kind(kind: str) -> list[Any]:
    return [pytest.param(b, id=b.where) for b in BLOCKS if b.kind == kind]


def test_every_block_says_what_it_is() -> None:
    unknown = [f"{b.where}: ```{b.info}" for b in BLOCKS if b.kind is None]
    known = "; ".join(f"{k}: {v}" for k, v in KINDS.items())
    assert unknown == [], f"info strings this test does not know (it knows {known})"


def test_the_docs_are_read_and_their_generated_reports_are_not() -> None:
    where = {b.path.relative_to(ROOT).as_posix() for b in BLOCKS}
    assert {"README.md", "docs/serve.md", "docs/langgraph.md", "docs/results/README.md"} <= where
    assert not any(w.endswith("report.md") for w in where)
    assert sum(b.kind == "python" for b in BLOCKS) >= 15 and sum(b.kind == "sh" for b in BLOCKS) >= 2


def test_fragments_are_few_and_parse() -> None:
    fragments = [b for b in BLOCKS if b.kind == "python fragment"]
    assert len(fragments) <= MAX_FRAGMENTS, [b.where for b in fragments]
    for block in fragments:
        compile(block.code, block.where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT | ast.PyCF_ONLY_AST)


def test_the_readme_protocol_table_names_every_preset() -> None:
    """The table lacked ``direct``: each preset is a row, and each row a preset."""
    from moot.protocols import preset_names

    section = (ROOT / "README.md").read_text(encoding="utf-8").split("### Protocols", 1)[1].splitlines()
    start = next(i for i, line in enumerate(section) if line.startswith("|"))
    rows = list(itertools.takewhile(lambda line: line.startswith("|"), section[start:]))[2:]  # past the header
    named = {n for row in rows for n in re.findall(r"`([a-z0-9-]+)`", row.split("|")[1])}
    assert named == set(preset_names())


# ------------------------------------------------------------------------ the scratch folder, services


def make_scratch(folder: Path) -> Path:
    for name in LINKED:
        (folder / name).symlink_to(ROOT / name, target_is_directory=True)
    for name, text in USER_FILES.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def test_the_dry_run_servers_agent_answers_after_a_tool_result(monkeypatch: pytest.MonkeyPatch) -> None:
    """``python -m moot.testing.fake_openai`` (the docs' dry run) answers an agent's typed turn with
    the first action (a call) until a tool's result is in the conversation, then with the answer: an
    Agents SDK, LangGraph or pydantic-ai loop against it ends (it called the tool again forever)."""
    from moot.testing import fake_openai

    call = {"type": "object", "properties": {"do": {"const": "call"}, "name": {"type": "string"}}, "required": ["do"]}
    answer = {
        "type": "object",
        "properties": {"do": {"const": "answer"}, "text": {"type": "string"}},
        "required": ["do"],
    }
    fmt = {"json_schema": {"name": "action", "schema": {"anyOf": [call, answer]}}}
    first = {"messages": [{"role": "user", "content": "weather?"}], "response_format": fmt}
    after = {"messages": [*first["messages"], {"role": "user", "content": "(the result of the tool call c1:)\nsunny"}]}
    assert json.loads(agent_reply(first))["do"] == "call"
    assert json.loads(agent_reply({**after, "response_format": fmt}))["do"] == "answer"
    served: list[Any] = []

    def started(self: fake_openai.FakeOpenAIServer) -> None:  # what main serves with, then no port
        served.append(self.reply)
        raise OSError(98, "Address already in use")

    monkeypatch.setattr(fake_openai.FakeOpenAIServer, "start", started)
    assert fake_openai.main(["--port", "1"]) == 2 and served == [agent_reply]


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(reply=agent_reply) as server:
        yield server


class _Collector(BaseHTTPRequestHandler):
    """A loopback OTLP/HTTP endpoint that takes every export."""

    received: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def collector() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def saved_debate(fake: FakeOpenAIServer, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A debate as ``moot debate -c notes.txt --json run.json`` saves it (on the fake model)."""
    from typer.testing import CliRunner

    folder = make_scratch(tmp_path_factory.mktemp("saved"))
    out = folder / "run.json"
    args = ["debate", "Is nuclear power a good way to cut emissions?", "-c", str(folder / "notes.txt")]
    args += ["-m", "openai:fake", "--base-url", fake.base_url, "--api-key", FAKE_KEY, "--json", str(out), "-q"]
    ran = CliRunner().invoke(app, args)
    assert ran.exit_code == 0, ran.output
    return out.read_text(encoding="utf-8")


def block_env(fake: FakeOpenAIServer, collector: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "OTEL_"))}
    for name in ("MOOT_MODEL", "MOOT_PRICES", "MOOT_DEBATE_MODE", "MOOT_API_KEY"):
        env.pop(name, None)
    src = str(ROOT / "src")
    env.update(
        PYTHONPATH=src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
        PATH=str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", ""),  # moot, python
        OPENAI_BASE_URL=fake.base_url,
        OPENAI_API_KEY=FAKE_KEY,
        MOOT_MODEL=f"embedded:{TINY}",
        OTEL_EXPORTER_OTLP_ENDPOINT=collector,
    )
    return env


def ports_named(code: str) -> set[int]:
    return {int(p) for p in re.findall(r"(?:127\.0\.0\.1|localhost):(\d{2,5})\b", code)} | {
        int(p) for p in re.findall(r"--port[ =](\d{2,5})\b", code)
    }


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@contextlib.contextmanager
def holding(ports: set[int]) -> Iterator[None]:
    """The ports a block names, for this test alone among the test runs on this machine."""
    with contextlib.ExitStack() as stack:
        for port in sorted(ports):
            lock = stack.enter_context((Path(tempfile.gettempdir()) / f"moot-docs-port-{port}.lock").open("w"))
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not port_free(port):
                pytest.skip(f"port {port}, which the block names, is in use by another program")
        try:
            yield
        finally:
            deadline = time.monotonic() + 30  # the block's services let go of them before the next test
            while not all(port_free(p) for p in ports) and time.monotonic() < deadline:
                time.sleep(0.1)


@contextlib.contextmanager
def moot_serve(ports: set[int], scratch: Path, fake: FakeOpenAIServer) -> Iterator[None]:
    """``moot serve`` on the fake model, on each port a Python block talks to."""
    if not ports:
        yield
        return
    pytest.importorskip("uvicorn", reason="the block talks to moot serve (moot[serve])")
    from serving import serve_process, wait_until_up

    procs = []
    try:
        for port in sorted(ports):
            args = ["--models", "openai:fake", "--port", str(port), "--db", str(scratch / f"moot-{port}.sqlite")]
            procs.append(serve_process(args, scratch / f"serve-{port}.log", env={"OPENAI_BASE_URL": fake.base_url}))
            wait_until_up(f"http://127.0.0.1:{port}", procs[-1])
        yield
    finally:
        for proc in procs:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# ---------------------------------------------------------------------------------- Python blocks


def embedded_marks(code: str) -> list[Any]:
    if not re.search(r"\bembedded\b", code):
        return []
    named = {TINY, *re.findall(r"\bembedded:([\w.-]+)", code)}
    missing = sorted(n for n in named if n in CATALOG and not is_installed(CATALOG[n]))
    reason = f"needs embedded:{', embedded:'.join(missing)} (moot models install NAME)"
    return [pytest.mark.embedded, pytest.mark.skipif(bool(missing), reason=reason)]


def python_problem(code: str, where: str) -> str | None:
    """Why a block is not a program as written, or None."""
    try:
        compile(code, where, "exec")
    except SyntaxError as exc:
        return (
            f"{where}: not runnable as written ({exc.msg}, line {exc.lineno}): make it a program, "
            "or mark it ```python fragment"
        )
    return None


def interpreter_for(code: str) -> str:
    """The Python that runs a block: this one, but AutoGen's own virtual environment for an AutoGen
    block (its protobuf pin cannot sit beside the otel extra: docs/serve.md's clients table), which
    `make test` makes; without it the test fails saying how to make it, never skips."""
    if "autogen_agentchat" not in code:
        return sys.executable
    python = Path(os.environ.get("MOOT_AUTOGEN_PYTHON") or ROOT / ".venv-autogen" / "bin" / "python")
    if not python.is_file():
        pytest.fail(f"AutoGen's virtual environment is missing ({python}): run `make .venv-autogen/.installed`")
    return str(python)


@pytest.mark.parametrize(
    "block", [pytest.param(b, id=b.where, marks=embedded_marks(b.code)) for b in BLOCKS if b.kind == "python"]
)
def test_python_block_runs_as_written(
    block: Block, tmp_path: Path, fake: FakeOpenAIServer, collector: str, saved_debate: str
) -> None:
    assert (problem := python_problem(block.code, block.where)) is None, problem
    scratch = make_scratch(tmp_path)
    (scratch / "run.json").write_text(saved_debate, encoding="utf-8")
    (scratch / "snippet.py").write_text(block.code, encoding="utf-8")
    exported = len(_Collector.received)
    ports = ports_named(block.code)
    with holding(ports), moot_serve(ports, scratch, fake):
        ran = subprocess.run(
            [interpreter_for(block.code), "snippet.py"],
            cwd=scratch,
            env=block_env(fake, collector),
            capture_output=True,
            text=True,
            timeout=HANG_S,
        )
    output = f"{ran.stdout[-4000:]}\n{ran.stderr[-4000:]}"
    assert ran.returncode == 0 and "Traceback" not in ran.stderr, f"{block.where} failed:\n{output}"
    if "OTLPSpanExporter" in block.code:
        assert len(_Collector.received) > exported, f"{block.where}: no span reached the collector\n{output}"


# ----------------------------------------------------------------------------------- shell blocks


def shell_lines(code: str) -> list[str]:
    """The block's command lines: continuations joined, comments dropped, newlines inside quotes kept."""
    lines: list[str] = []
    current: list[str] = []
    quote: str | None = None
    chars = code.replace("\\\n", " ")
    i = 0
    while i < len(chars):
        c = chars[i]
        if quote is None and c == "#" and (not current or current[-1] in " \t;&|("):
            while i < len(chars) and chars[i] != "\n":
                i += 1
            continue
        if quote is None and c == "\n":
            lines.append("".join(current))
            current = []
        else:
            if c == "\\" and quote != "'" and i + 1 < len(chars):
                current += [c, chars[i + 1]]
                i += 2
                continue
            if c in "'\"" and quote in (None, c):
                quote = None if quote == c else c
            current.append(c)
        i += 1
    lines.append("".join(current))
    return [line for line in (x.strip() for x in lines) if line]


def shell_commands(line: str) -> list[tuple[list[str], list[str]]]:
    """Each simple command of a line: its words (assignments and keywords left out) and the files its
    redirections write."""
    line = re.sub(r"(?<!\S)\.\.\.(?!\S)", ELIDED, line)
    line = re.sub(r"(?<!\S)\d+(?=[<>])", " ", line)  # 2> FILE: the redirection, not an argument 2
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    lex.commenters = ""
    commands: list[tuple[list[str], list[str]]] = []
    words: list[str] = []
    written: list[str] = []
    tokens = list(lex)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token in (";", "&", "&&", "|", "||", "(", ")"):
            commands.append((words, written))
            words, written = [], []
        elif token in (">", ">>", ">|", "&>", ">&", "<"):
            if token != "<" and i + 1 < len(tokens):
                written.append(tokens[i + 1])
            i += 1
        else:
            words.append(token)
        i += 1
    commands.append((words, written))
    out = []
    for words, written in commands:
        while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
            words = words[1:]
        if words and words[0] in ("do", "then", "else", "!"):
            words = words[1:]
        if words and words[0] not in ("for", "while", "if", "done", "fi"):
            out.append((words, written))
    return out


def parse_moot(args: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """The command path and parsed parameters of each level of a ``moot`` command line, as the CLI
    parses them before running anything (raises the CLI's own usage error)."""
    command: Any = typer.main.get_command(app)
    ctx = command.make_context("moot", list(args))
    levels = [(ctx.command_path, dict(ctx.params))]
    while hasattr(command, "resolve_command"):
        rest = [*ctx._protected_args, *ctx.args]
        if not rest:
            break
        name, command, rest = command.resolve_command(ctx, rest)
        ctx = command.make_context(name, rest, parent=ctx)
        levels.append((ctx.command_path, dict(ctx.params)))
    for path, params in levels:
        if params.get("extra"):  # (moot.cli.common.ExtraArgs: the command refuses them as it starts)
            raise typer.BadParameter(f"{path}: unexpected extra argument(s) ({' '.join(params['extra'])})")
    return levels


def model_spec_problem(spec: str) -> str | None:
    """Is this a model spec moot reads? Checked by its shape and the catalog, not resolved: a doc may
    name a model this machine has not installed."""
    kind, sep, name = spec.partition(":")
    if kind == "embedded" and (not sep or name in CATALOG):
        return None
    if kind == "embedded":
        return f"{spec}: no embedded model {name!r} (known: {', '.join(CATALOG)})"
    if (kind in ("openai", "scripted") and name) or (kind == "langchain" and ":" in name):
        return None
    return f"{spec}: unknown model spec (embedded[:NAME], openai:MODEL, scripted:FILE, langchain:MODULE:ATTR)"


def written_above(path: Path, written: list[Path]) -> bool:
    """Is ``path`` a file or folder a command above wrote, or inside one (``--out runs/tune``)?"""
    return any(w == path or w in path.parents for w in written)


def file_like(value: str) -> bool:
    return "/" in value or Path(value).suffix in (".jsonl", ".json", ".csv", ".yaml", ".yml", ".gz")


def paths_in(name: str, value: Any) -> list[Path]:
    """The files a parameter names: a path, paths, a price file, a dataset given as a file."""
    if isinstance(value, Path):
        return [value]
    if isinstance(value, list | tuple):
        return [v for v in value if isinstance(v, Path)]
    if name == "prices" or (name in DATA_PARAMS and file_like(value)):
        return [Path(value)]
    if name == "db" and isinstance(value, str) and "://" not in value:  # moot serve --db: a file, or a URL
        return [Path(value)]
    return []


def moot_problems(args: list[str], scratch: Path, written: list[Path]) -> tuple[list[str], list[Path]]:
    """What is wrong with one ``moot`` command line, and the paths it writes."""
    from moot.batch.runner import base_protocol
    from moot.eval.datasets import dataset_names
    from moot.eval.protocols import parse_protocols
    from moot.protocols.loader import resolve_protocol

    line = "moot " + shlex.join(args)
    try:
        levels = parse_moot(args)
    except typer.TyperException as exc:
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        return [f"{line}: {message}"], []
    problems: list[str] = []
    outputs: list[Path] = []
    for path_of_command, params in levels:
        for name, value in params.items():
            if value is None or value == () or "$" in str(value):  # unset, or a shell variable ($d)
                continue
            for path in paths_in(name, value):
                if name in OUTPUT_PARAMS:
                    outputs.append(path)
                elif not (scratch / path).exists() and not written_above(path, written):
                    problems.append(
                        f"{line}: {path} does not exist (not in the repository, not a reader's file of "
                        "USER_FILES, not written by a command above it)"
                    )
            specs = value.split(",") if name == "models" else [value] if name in ("model", "judge_model") else []
            problems += [f"{line}: {p}" for s in specs if s != "none" and (p := model_spec_problem(s))]
            try:
                if name == "protocol" and isinstance(value, str) and not written_above(Path(value), written):
                    # a preset (with parameters), or a protocol file (not one a line above writes); a
                    # batch also takes vote@uab(...)
                    (base_protocol if path_of_command.split()[-1:] == ["batch"] else resolve_protocol)(value)
                elif name == "protocols":
                    parse_protocols(value)
                elif name in DATA_PARAMS and not file_like(value) and value not in dataset_names():
                    problems.append(f"{line}: no dataset {value!r} (moot eval datasets)")
            except Exception as exc:  # moot's own error for bad input names it
                problems.append(f"{line}: {path_of_command} {name}: {exc}")
    return problems, outputs


def _make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, flags=re.MULTILINE))


def _extras() -> set[str]:
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"])


def program_problems(words: list[str], scratch: Path, written: list[Path]) -> tuple[list[str], list[Path]]:
    """What is wrong with one simple command of a shell block, and the paths it writes."""
    words = [w for w in words if w != ELIDED]
    program, args = words[0], words[1:]
    line = shlex.join(words)
    if program == "moot":
        return moot_problems(args, scratch, written)
    if program == "make":
        missing = [a for a in args if not a.startswith("-") and "=" not in a and a not in _make_targets()]
        return [f"{line}: {m} is not a target of the Makefile" for m in missing], []
    if program in ("python", "python3") or program.endswith("/python") or re.fullmatch(r"python3\.\d+", program):
        if args[:1] == ["-m"]:
            module, rest = args[1], args[2:]
            problems = [] if importlib.util.find_spec(module) else [f"{line}: no module {module}"]
            paths = [a for a in rest if module == "pytest" and not a.startswith("-")]
        else:
            problems, paths = [], args[:1]
        return problems + [f"{line}: {p} does not exist" for p in paths if not (ROOT / p).exists()], []
    if program == "pip":
        wanted = {e.strip() for a in args for e in re.findall(r"^moot\[([^\]]*)\]$", a) for e in e.split(",")}
        return [f"{line}: moot has no extra {e!r}" for e in sorted(wanted - _extras())], []
    if program == "curl":
        return curl_problems(line, args), []
    if program in EXTERNAL:
        return [], []
    if program in ("sh", "bash") and args and not args[0].startswith("-"):  # a script of the project's
        return ([] if (ROOT / args[0]).is_file() else [f"{line}: {args[0]} does not exist"]), []
    if program.startswith("tools/"):  # the project's own scripts (tools/services.sh): its subcommand must exist
        script = ROOT / program
        if not script.is_file():
            return [f"{line}: {program} does not exist"], []
        usage = re.search(r"usage: \$0 ([a-z|-]+)", script.read_text(encoding="utf-8"))
        known = usage.group(1).split("|") if usage else []
        return [f"{line}: {program} has no subcommand {a!r}" for a in args[:1] if a not in known], []
    return [f"{line}: {program} is a program this test does not know: check it here, or add it to EXTERNAL"], []


def curl_problems(line: str, args: list[str]) -> list[str]:
    body = next((args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-d", "--data")), None)
    if body is None:
        return []
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        return [f"{line}: the body is not JSON ({exc})"]
    if any(a.endswith("/v1/debates") for a in args) and importlib.util.find_spec("fastapi"):
        from pydantic import ValidationError

        from moot.server.schemas import DebateRequest

        try:
            DebateRequest.model_validate(data)
        except ValidationError as exc:
            return [f"{line}: not a valid POST /v1/debates body: {exc}"]
    return []


def shell_problems(code: str, scratch: Path) -> list[str]:
    """Everything wrong with a shell block that can be found without running it."""
    syntax = subprocess.run(["bash", "-n"], input=code, capture_output=True, text=True)
    problems = [f"bash -n: {syntax.stderr.strip()}"] if syntax.returncode else []
    written: list[Path] = []
    for line in shell_lines(code):
        try:
            commands = shell_commands(line)
        except ValueError as exc:
            problems.append(f"{line}: {exc}")
            continue
        for words, redirected in commands:
            found, outputs = program_problems(words, scratch, written)
            problems += found
            written += [*outputs, *(Path(r) for r in redirected)]
    return problems


@pytest.mark.parametrize("block", of_kind("sh") + of_kind("sh costly"))
def test_shell_block_commands_parse_and_their_inputs_exist(
    block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = make_scratch(tmp_path)
    monkeypatch.chdir(scratch)  # a protocol file a command names is read where the command runs
    assert shell_problems(block.code, scratch) == [], block.where


@pytest.mark.parametrize("block", of_kind("sh"))
def test_shell_block_runs_as_written(block: Block, tmp_path: Path, fake: FakeOpenAIServer, collector: str) -> None:
    scratch = make_scratch(tmp_path)
    (scratch / "block.sh").write_text(block.code, encoding="utf-8")
    with holding(ports_named(block.code)), (tmp_path / "out.log").open("w") as out:
        # Its own session, so that its background jobs (a fake server) are stopped with it; output
        # to a file, which a background job may hold open after the block ends.
        proc = subprocess.Popen(
            ["bash", "-e", "-o", "pipefail", "block.sh"],
            cwd=scratch,
            env=block_env(fake, collector),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = proc.wait(HANG_S)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
    output = (tmp_path / "out.log").read_text(encoding="utf-8", errors="replace")
    assert code == 0 and "Traceback" not in output, f"{block.where} failed (exit {code}):\n{output[-6000:]}"


# ---------------------------------------------------------------------------------- data blocks


@pytest.mark.parametrize("block", of_kind("yaml"))
def test_yaml_block_loads(block: Block, tmp_path: Path) -> None:
    from moot.models.pricing import load_prices
    from moot.protocols.loader import load_protocol, load_run_file

    data = yaml.safe_load(block.code)
    path = tmp_path / "block.yaml"
    path.write_text(block.code, encoding="utf-8")
    if isinstance(data, dict) and "question" in data:  # a run file
        run = load_run_file(path)
        spec = run.spec()
        specs = [s for s in (run.model, *run.models.values()) if s]
        assert [p for s in specs if (p := model_spec_problem(s))] == []
        routable = {p.id for p in spec.participants} | {p.persona.role for p in spec.participants}
        assert set(run.models) <= routable, f"models for no participant: {set(run.models) - routable}"
    elif isinstance(data, dict) and data and all(isinstance(v, dict) and "input" in v for v in data.values()):
        assert load_prices(path).prices
    else:
        load_protocol(path)


@pytest.mark.parametrize("block", of_kind("json"))
def test_json_block_parses(block: Block) -> None:
    data = json.loads(block.code)
    if isinstance(data, dict) and {"aspects", "sentence_label"} <= set(data):
        from moot.apps.absa.evaluate import AbsaItem

        AbsaItem.model_validate(data)


# --------------------------------------------------------------- the checks catch what drifts


def test_the_checks_catch_what_drifts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each way a doc drifted (or could) is a problem the checks name: they can fail."""
    scratch = make_scratch(tmp_path)
    monkeypatch.chdir(scratch)
    drifted = {
        "moot debate Q --rounds two": "Invalid value for '--rounds'",
        "moot debate Q --no-such-option": "No such option",
        "moot debate Q [--rounds N]": "unexpected extra argument",  # a synopsis
        "moot quality score run.json [--judge-model MODEL]": "unexpected extra argument",  # one ExtraArgs catches
        "moot arbitrate examples/renamed.json": "examples/renamed.json does not exist",
        "moot eval report runs/arc": "runs/arc does not exist",  # no command above wrote it
        "moot debate Q -m embedded:qwen9": "no embedded model 'qwen9'",
        "moot debate Q -m gpt-4o": "unknown model spec",
        "moot debate Q -p no-such-preset": "no protocol preset named 'no-such-preset'",
        "moot eval -d arc-challenge -p vote@0 -o r": "a vote needs at least 1 sample",
        "moot eval -d no-such-set -p single -o r": "no dataset 'no-such-set'",
        "moot tune --dataset nothing.jsonl --out r": "nothing.jsonl does not exist",
        "moot debate Q 2 > out.txt": "unexpected extra argument",  # 2 is an argument here, not a stream
        "make no-such-target": "not a target of the Makefile",
        "pip install 'moot[no-such-extra]'": "no extra 'no-such-extra'",
        "python examples/renamed.py": "examples/renamed.py does not exist",
        "frobnicate --now": "frobnicate is a program this test does not know",
        "if then": "bash -n",
        "curl -s localhost:8000/v1/debates -d '{\"question\": 1}'": "not a valid POST /v1/debates body",
    }
    for line, needle in drifted.items():
        problems = shell_problems(line, scratch)
        assert any(needle in p for p in problems), (line, problems)
    fine = (
        'moot debate "..." -c notes.txt --json run.json   # the question\'s placeholder is a question\n'
        "moot quality score run.json                      # written by the line above\n"
        "moot batch claims.jsonl ... --ray local          # ... for the options above\n"
        "moot protocols show panel > panel.yaml && moot debate Q -p panel.yaml 2> log.txt\n"
    )
    assert shell_problems(fine, scratch) == []
    assert python_problem("async for r in f():\n    print(r)\n", "x") is not None  # the README's batch loop
    assert python_problem("result = await engine.run('Q')\n", "x") is not None  # docs/tracing.md's
    assert Block(ROOT / "README.md", 1, "", "make demo\n").kind is None  # an unlabelled block
    assert Block(ROOT / "README.md", 1, "console", "$ moot\n").kind is None
