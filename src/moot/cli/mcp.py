"""``moot mcp``: the debate as an MCP server over stdio (extra ``moot[mcp]``; docs/mcp.md).

A thin adapter: the options build the same :class:`~moot.server.settings.ServerSettings` as ``moot
serve`` (its models, limits and prices), and :func:`moot.server.mcp.serve_stdio` serves them.
Nothing but the protocol is written to stdout; errors go to stderr, in one line.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from moot.cli.common import MaxQuestionCharsOption, PriceOption, PricesOption, UsageError, fail, prices_from
from moot.files import first_error

#: The store of ``moot mcp`` without ``--db``: SQLite in memory, for the session.
IN_MEMORY = ":memory:"


def mcp_command(
    models: Annotated[
        str | None,
        typer.Option(
            "--models",
            help="Comma-separated model specs a debate may use; the first is the default "
            "(default: $MOOT_MODEL or embedded).",
        ),
    ] = None,
    base_url: Annotated[
        str | None, typer.Option("--base-url", help="Base URL of the openai: models (else $OPENAI_BASE_URL).")
    ] = None,
    db: Annotated[
        Path | None,
        typer.Option(help="SQLite file to keep the debates in (default: in memory, for the session)."),
    ] = None,
    tuned: Annotated[
        Path | None,
        typer.Option("--tuned", help="A tuned.yaml moot tune wrote: offered as the protocol auto (docs/tune.md)."),
    ] = None,
    max_running: Annotated[int, typer.Option("--max-running", min=1, help="Debates that run at once.")] = 4,
    max_calls: Annotated[int, typer.Option("--max-calls", min=1, help="Most model calls of one debate.")] = 100,
    max_total_tokens: Annotated[
        int, typer.Option("--max-total-tokens", min=1, help="Most tokens of one debate.")
    ] = 200_000,
    timeout: Annotated[float, typer.Option("--timeout", min=0.001, help="Longest a debate may run, seconds.")] = 600.0,
    model_concurrency: Annotated[
        int | None,
        typer.Option("--model-concurrency", min=1, help="Calls at once to each openai: model (default 8)."),
    ] = None,
    max_body: Annotated[
        int, typer.Option("--max-body", min=1024, help="Largest message (one line of stdin), bytes.")
    ] = 1_000_000,
    max_question_chars: MaxQuestionCharsOption = 20_000,
    prices: PricesOption = None,
    price: PriceOption = None,
) -> None:
    """Serve debates to an MCP host (Claude, VS Code, Cursor, an agent SDK) over stdio: docs/mcp.md."""
    try:
        from moot.server import Limits, ServerSettings
        from moot.server.mcp import serve_stdio
        from moot.server.openai.catalogue import check_tuned
    except ImportError as exc:
        raise fail(f"moot mcp needs the mcp extra ({exc.name} is missing): pip install 'moot[mcp]'", 2) from None
    from moot.models.base import ModelError
    from moot.models.registry import default_spec, resolve_model
    from moot.server.tuned import load_tuned

    try:
        settings = ServerSettings(
            db=db if db is not None else Path(IN_MEMORY),
            models=(models or default_spec()).split(","),
            base_url=base_url,
            model_concurrency=model_concurrency,
            max_running=max_running,
            max_body_bytes=max_body,
            prices=prices_from(prices, price),
            tuned=load_tuned(tuned) if tuned is not None else None,
            limits=Limits(
                max_calls=max_calls,
                max_total_tokens=max_total_tokens,
                timeout_s=timeout,
                max_question_chars=max_question_chars,
            ),
        )
        check_tuned(settings)
    except ValidationError as exc:
        first = first_error(exc)
        raise fail(f"--{'.'.join(str(x) for x in first['loc'])}: {first['msg']}", 2) from None
    except (ValueError, UsageError) as exc:
        raise fail(str(exc), 2) from None
    for spec in settings.models:
        try:
            resolve_model(spec, **(settings.model_options() if spec.startswith("openai:") else {}))
        except ModelError as exc:
            raise fail(f"--models {spec}: {exc}", 2) from None
    lock = None
    if db is not None:
        # One server per database, as moot serve: another would mark this one's running debates interrupted.
        from moot.cli.common import check_output_file
        from moot.runlock import RunLock, RunLocked

        try:
            check_output_file(db, "--db")
            lock = RunLock.acquire(db.parent, f"{db.name}.lock", label=f"--db {str(db)!r}", hint="give another --db")
        except (UsageError, RunLocked) as exc:
            raise fail(str(exc), 2) from None
    try:
        # Ctrl-C or SIGTERM (a host stopping it): KeyboardInterrupt, which main() ends with 130, as
        # every command; the host closing stdin ends the session with 0.
        asyncio.run(serve_stdio(settings))
    finally:
        if lock is not None:
            lock.release()
