"""``moot view``: a read-only viewer of an eval or batch run, or of a saved transcript, on loopback
(extra ``moot[serve]``)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated

import typer

from moot.cli.common import console, err_console, fail

#: The viewer listens here only: a run's transcripts are the user's, and it has no key.
HOST = "127.0.0.1"


def view_command(
    path: Annotated[
        Path,
        typer.Argument(
            help="A moot eval or batch run folder (run.sqlite, or run.sqlite.gz as docs/results keeps them), "
            "or a transcript saved by moot debate --json.",
            show_default=False,
        ),
    ],
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port on 127.0.0.1 (0: any free port).")] = 8001,
    log_level: Annotated[str, typer.Option("--log-level", help="uvicorn's log level.")] = "warning",
) -> None:
    """Open a run or a transcript in the browser, read-only, until Ctrl-C.

    Its items with filters, each debate's transcript, and two protocols side by side with their paired counts."""
    try:
        import uvicorn

        from moot.server.view.api import create_view_app
        from moot.server.view.data import RunView, ViewSourceError
    except ImportError as exc:
        raise fail(f"moot view needs the serve extra ({exc.name} is missing): pip install 'moot[serve]'", 2) from None
    from moot.cli.serve import listen_sockets

    try:
        view = RunView.open(path)
    except ViewSourceError as exc:
        raise fail(str(exc), 2) from None
    try:
        sockets = listen_sockets(HOST, port)
    except OSError as exc:
        raise fail(
            f"--port {port}: cannot listen there ({exc.strerror or exc}); give another --port (0: any free port)", 2
        ) from None
    port = sockets[0].getsockname()[1]
    info = view.info()
    what = {"eval": "eval run", "batch": "batch run", "transcript": "transcript"}[info.kind]
    console.print(
        f"moot view: http://{HOST}:{port}/ ({what} {info.source}: {info.items} item(s), "
        f"{len(info.protocols)} protocol(s)); Ctrl-C stops it",
        highlight=False,
        soft_wrap=True,
        markup=False,
    )
    config = uvicorn.Config(create_view_app(view), log_level=log_level, ws="none", timeout_graceful_shutdown=3)
    server = uvicorn.Server(config)
    try:
        # uvicorn stops on Ctrl-C (or SIGTERM, which moot turns into Ctrl-C) and raises it again once
        # stopped: a KeyboardInterrupt, or nothing where the shell ignores Ctrl-C (a background job).
        with contextlib.suppress(KeyboardInterrupt):
            server.run(sockets=sockets)
    finally:
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()
    if not server.started:
        raise fail("moot view: the viewer could not start (see the lines above)", 1)
    err_console.print("moot view: stopped", highlight=False)
    raise typer.Exit(130)
