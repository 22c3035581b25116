"""What every command shares: the consoles and the one-line error."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from moot.models.pricing import PriceError, PriceTable, price_table
from moot.secrets import redact

console = Console()
err_console = Console(stderr=True)


class UsageError(Exception):
    """Bad input from the user: shown as one line, exit code 2."""


def fail(message: str, code: int = 1) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {escape(redact(message))}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


#: Connection options of openai: models, shared by the commands that run models.
BaseUrlOption = Annotated[str | None, typer.Option("--base-url", help="OpenAI-compatible base URL (openai: models).")]
ApiKeyOption = Annotated[
    str | None,
    typer.Option("--api-key", help="API key (openai: models; default $OPENAI_API_KEY).", show_default=False),
]

#: Prices of models (seed 004's cost per debate), shared by the commands that report a cost.
PricesOption = Annotated[
    str | None,
    typer.Option(
        "--prices",
        help="Price file: YAML/JSON of MODEL: {input: USD, output: USD} per million tokens (default $MOOT_PRICES).",
        show_default=False,
    ),
]
PriceOption = Annotated[
    list[str] | None,
    typer.Option(
        "--price", help="A model's price, MODEL=INPUT,OUTPUT in USD per million tokens. Repeatable.", show_default=False
    ),
]


def prices_from(path: str | None, options: list[str] | None) -> PriceTable:
    """The price table of a command's --prices / --price options (bad input: a UsageError)."""
    try:
        return price_table(path, options)
    except PriceError as exc:
        raise UsageError(str(exc)) from None


#: Where a run's debates execute, shared by `moot batch`, `moot eval` and `moot absa eval`.
RayOption = Annotated[
    str | None,
    typer.Option(
        "--ray",
        help="Run on Ray (pip install 'moot\\[ray]'): local (a Ray instance for this run), auto (the running "
        "cluster, $RAY_ADDRESS) or a cluster address (HOST:PORT, ray://HOST:10001).",
        show_default=False,
    ),
]
WorkersOption = Annotated[
    int | None, typer.Option("--workers", min=1, help="Ray workers (default: the cluster's CPUs / --worker-cpus).")
]
WorkerCpusOption = Annotated[
    float, typer.Option("--worker-cpus", min=0.01, help="CPUs of each Ray worker (an embedded model's threads).")
]
