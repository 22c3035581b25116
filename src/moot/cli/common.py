"""What every command shares: the consoles and the one-line error."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

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
