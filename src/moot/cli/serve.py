"""``moot serve``: the HTTP API, the OpenAI-compatible debate model and the viewer (extra ``moot[serve]``)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from enum import StrEnum
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from pydantic import SecretStr, ValidationError

from moot.cli.common import (
    MaxQuestionCharsOption,
    PriceOption,
    PricesOption,
    TraceContentOption,
    TraceOption,
    console,
    fail,
    prices_from,
)
from moot.cli.serve_store import keys_app, migrate_command
from moot.files import first_error

if TYPE_CHECKING:
    pass

serve_app = typer.Typer(invoke_without_command=True)


class Loop(StrEnum):
    """The server's event loop (uvicorn's ``--loop``)."""

    auto = "auto"
    asyncio = "asyncio"
    uvloop = "uvloop"


class HttpParser(StrEnum):
    """The server's HTTP/1.1 parser (uvicorn's ``--http``)."""

    auto = "auto"
    httptools = "httptools"
    h11 = "h11"


@serve_app.callback()
def serve_command(
    ctx: typer.Context,
    host: Annotated[
        str, typer.Option(help="Address to listen on; any but loopback needs --api-key-env.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: any free port).")] = 8000,
    db: Annotated[
        str | None,
        typer.Option(
            envvar="MOOT_DB_URL",
            show_envvar=True,
            help="Where the debates are kept: a SQLite file (created if missing; default moot.sqlite) or a "
            "postgresql://user:password@host:port/database URL (the postgres extra).",
        ),
    ] = None,
    redis: Annotated[
        str | None,
        typer.Option(
            "--redis",
            envvar="MOOT_REDIS_URL",
            show_envvar=True,
            help="redis://:PASSWORD@HOST:PORT/DB (password and db optional): the live bus between replicas "
            "(the redis extra): a stream on any replica gets a debate's events, tokens included, and a cancel "
            "reaches the replica running it. Without it, a stream of a debate on another replica polls the store.",
        ),
    ] = None,
    models: Annotated[
        str | None,
        typer.Option(
            "--models",
            help="Comma-separated model specs requests may use; the first is the default "
            "(default: $MOOT_MODEL or embedded).",
        ),
    ] = None,
    base_url: Annotated[
        str | None, typer.Option("--base-url", help="Base URL of the openai: models (else $OPENAI_BASE_URL).")
    ] = None,
    api_key_env: Annotated[
        str | None,
        typer.Option("--api-key-env", help="Environment variable holding the bearer key every /v1 request must send."),
    ] = None,
    allowed_hosts: Annotated[
        str | None,
        typer.Option(
            "--allowed-hosts",
            help="Comma-separated host names (the Host header, any port) the server answers to besides "
            "localhost, 127.0.0.1 and [::1]; *.example.com allows subdomains. On loopback nothing else is "
            "answered; elsewhere, any name unless this is given.",
        ),
    ] = None,
    image_urls: Annotated[
        bool,
        typer.Option(
            "--image-urls",
            help="Take images given by address (https://...), which the model's server fetches from its own "
            "network (default: images sent inline, data:image/...;base64, only).",
        ),
    ] = False,
    model_concurrency: Annotated[
        int | None,
        typer.Option("--model-concurrency", min=1, help="Calls at once to each openai: model (default 8)."),
    ] = None,
    max_running: Annotated[int, typer.Option("--max-running", min=1, help="Debates that run at once.")] = 4,
    max_queued: Annotated[
        int, typer.Option("--max-queued", min=0, help="Debates that may wait; beyond that: 429 with Retry-After.")
    ] = 100,
    max_rounds: Annotated[int, typer.Option("--max-rounds", min=1, help="Most rounds a request may ask for.")] = 10,
    max_calls: Annotated[int, typer.Option("--max-calls", min=1, help="Most model calls of one debate.")] = 100,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", min=1, help="Most tokens of one turn (every turn is capped at it).")
    ] = 2000,
    max_total_tokens: Annotated[
        int, typer.Option("--max-total-tokens", min=1, help="Most tokens of one debate.")
    ] = 200_000,
    timeout: Annotated[float, typer.Option("--timeout", min=0.001, help="Longest a debate may run, seconds.")] = 600.0,
    max_messages: Annotated[
        int,
        typer.Option(
            "--max-messages",
            min=1,
            help="Most messages of one chat or Responses request; the oldest are left out when they do not fit "
            "the prompt budget.",
        ),
    ] = 1000,
    max_question_chars: MaxQuestionCharsOption = 20_000,
    max_body: Annotated[int, typer.Option("--max-body", min=1024, help="Largest request body, bytes.")] = 1_000_000,
    request_timeout: Annotated[
        float,
        typer.Option(
            "--request-timeout",
            min=0.001,
            help="Seconds a request's headers, then its body, may take to arrive (else 408 and closed).",
        ),
    ] = 20.0,
    max_connections: Annotated[
        int,
        typer.Option("--max-connections", min=1, help="Connections open at once; one more gets 503 and is closed."),
    ] = 1000,
    max_conversation_bytes: Annotated[
        int,
        typer.Option(
            "--max-conversation-bytes",
            min=1024,
            help="Most bytes of one Responses conversation a previous_response_id chain builds (oldest left out).",
        ),
    ] = 4_000_000,
    mcp_sessions_per_key: Annotated[
        int,
        typer.Option(
            "--mcp-sessions-per-key",
            min=1,
            help="Stateful MCP sessions (/mcp) one API key of the store may hold open; one more gets 429.",
        ),
    ] = 100,
    lease: Annotated[
        float,
        typer.Option(
            "--lease",
            min=0.001,
            help="Seconds a replica's claim of a running debate lasts unless renewed (every third of it).",
        ),
    ] = 30.0,
    key_cache: Annotated[
        float,
        typer.Option(
            "--key-cache",
            min=0,
            max=300,
            help="Seconds a lookup of the store's API keys is remembered: a key added or revoked on any replica "
            "holds here within this time.",
        ),
    ] = 5.0,
    poll: Annotated[
        float,
        typer.Option(
            "--poll",
            min=0.001,
            help="Seconds between a replica's looks at a shared (PostgreSQL) store's queue while it has a free slot.",
        ),
    ] = 1.0,
    token_window_ms: Annotated[
        float,
        typer.Option(
            "--token-window-ms",
            min=0,
            max=1000,
            help="Milliseconds over which a turn's streamed tokens after its first are gathered into one event "
            "(0: an event per token).",
        ),
    ] = 50.0,
    log_level: Annotated[str, typer.Option("--log-level", help="uvicorn's log level.")] = "info",
    loop: Annotated[
        Loop, typer.Option("--loop", help="The event loop: auto (uvloop where it is installed), asyncio or uvloop.")
    ] = Loop.auto,
    http: Annotated[
        HttpParser,
        typer.Option("--http", help="The HTTP/1.1 parser: auto (httptools where it is installed), httptools or h11."),
    ] = HttpParser.auto,
    prices: PricesOption = None,
    price: PriceOption = None,
    trace: TraceOption = False,
    trace_content: TraceContentOption = False,
    tuned: Annotated[
        Path | None,
        typer.Option(
            "--tuned",
            help="A tuned.yaml moot tune wrote: served as the model moot/auto and under its own label (docs/tune.md).",
        ),
    ] = None,
) -> None:
    """Serve debates over HTTP: the /v1 API, an OpenAI-compatible debate model, and a live viewer."""
    if ctx.invoked_subcommand is not None:
        return
    try:
        from moot.server import Limits, ServerSettings, create_app
        from moot.server.http.connections import StoppingServer, server_config
        from moot.server.openai.fields import check_tuned
        from moot.server.settings import is_loopback
    except ImportError as exc:
        raise fail(f"moot serve needs the serve extra ({exc.name} is missing): pip install 'moot[serve]'", 2) from None
    for option, value in (("--loop", loop.value), ("--http", http.value)):
        if value in ("uvloop", "httptools") and find_spec(value) is None:
            raise fail(f"{option} {value}: {value} is not installed; pip install {value}, or give {option} auto", 2)
    from moot.models.registry import default_spec
    from moot.server.state import StoreBusy, StoreError, check_db, is_postgres_url, open_store, redact_url

    try:
        where = check_db(db if db is not None and db.strip() else "moot.sqlite")
    except StoreError as exc:
        raise fail(f"--db {exc}", 2) from None
    db_url = SecretStr(where) if is_postgres_url(where) else None
    db_path = Path("moot.sqlite") if db_url is not None else Path(where)

    key: SecretStr | None = None
    if api_key_env is not None:
        value = os.environ.get(api_key_env, "")
        if not value.strip():
            raise fail(f"--api-key-env {api_key_env}: that environment variable is empty or unset; export the key", 2)
        if len(value.strip()) < 16:
            raise fail(
                f"--api-key-env {api_key_env}: the key is shorter than 16 characters; use a longer random one", 2
            )
        key = SecretStr(value.strip())
    from moot.server.tuned import load_tuned

    try:
        tuned_model = load_tuned(tuned) if tuned is not None else None
    except ValueError as exc:
        raise fail(str(exc), 2) from None
    try:
        settings = ServerSettings(
            host=host,
            port=port,
            db=db_path,
            db_url=db_url,
            redis_url=SecretStr(redis.strip()) if redis is not None and redis.strip() else None,
            lease_s=lease,
            poll_s=poll,
            models=(models or default_spec()).split(","),
            base_url=base_url,
            model_concurrency=model_concurrency,
            api_key=key,
            allowed_hosts=(allowed_hosts or "").split(","),
            image_urls=image_urls,
            max_running=max_running,
            max_queued=max_queued,
            max_body_bytes=max_body,
            request_timeout_s=request_timeout,
            max_connections=max_connections,
            mcp_sessions_per_key=mcp_sessions_per_key,
            max_conversation_bytes=max_conversation_bytes,
            token_window_s=token_window_ms / 1000,
            key_cache_s=key_cache,
            prices=prices_from(prices, price),
            trace=trace,
            trace_content=trace_content,
            tuned=tuned_model,
            limits=Limits(
                max_rounds=max_rounds,
                max_calls=max_calls,
                max_tokens_per_turn=max_tokens,
                max_total_tokens=max_total_tokens,
                timeout_s=timeout,
                max_messages=max_messages,
                max_question_chars=max_question_chars,
            ),
        )
        settings.check_bind(store_keys=settings.api_key is None and not is_loopback(host) and _has_keys(where))
        check_tuned(settings)
    except ValidationError as exc:
        first = first_error(exc)
        option = ".".join(str(x) for x in first["loc"]).replace("_", "-")
        raise fail(f"--{option}: {first['msg'].removeprefix('Value error, ')}", 2) from None
    except ValueError as exc:
        raise fail(str(exc), 2) from None
    from moot.cli.common import UsageError, check_output_file, show_progress_messages

    if trace or trace_content:
        try:
            import moot.integrations.otel  # noqa: F401 - the server sets its tracing up when it starts
        except ImportError:
            raise fail("--trace needs OpenTelemetry's SDK and OTLP exporter: pip install 'moot[otel]'", 2) from None

    if db_url is None:
        try:
            check_output_file(db_path, "--db")
        except UsageError as exc:
            raise fail(str(exc), 2) from None
    from moot.models.base import ModelError
    from moot.models.registry import resolve_model

    for spec in settings.models:
        try:
            resolve_model(spec, **(settings.model_options() if spec.startswith("openai:") else {}))
        except ModelError as exc:
            raise fail(f"--models {spec}: {exc}", 2) from None
    # Bind here, before the store and the model: a port in use is a one-line error that leaves no
    # file behind (the SQLite store and its lock), and --port 0 prints the port the system gave, not 0.
    try:
        sockets = listen_sockets(host, port)
    except socket.gaierror as exc:
        raise fail(f"--host {host}: not an address of this machine ({exc.strerror}); give e.g. 127.0.0.1", 2) from None
    except OSError as exc:
        raise fail(
            f"--host {host} --port {port}: cannot listen there ({exc.strerror or exc}); "
            "give another --port (0: any free port)",
            2,
        ) from None
    try:
        # The store, before the banner: one that cannot be used (unreachable, misconfigured, written by
        # a newer moot) is one line, the URL's password redacted. One server per SQLite file: a second
        # would mark the first's running debates interrupted (a lock beside the file). PostgreSQL is
        # shared by any number of replicas: each claims debates under a lease (docs/scale-out.md).
        api_secrets = [key.get_secret_value()] if key is not None else []
        try:
            store = open_store(settings.store_target(), api_secrets)
        except StoreError as exc:
            raise fail(f"--db {exc}", 2) from None
        try:
            if not store.shared:
                store.take_server_lock()
        except StoreBusy as exc:
            store.close()
            raise fail(str(exc), 2) from None
        if settings.redis_url is not None:
            from moot.server.state.bus import BusError, check_redis

            try:
                check_redis(settings.redis_url.get_secret_value())
            except BusError as exc:
                store.close()
                raise fail(f"--redis {exc}", 2) from None
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    port = sockets[0].getsockname()[1]
    show_progress_messages()  # an embedded model being loaded says so
    # The URL reaches the address listened on: "localhost" may resolve to the other family first.
    shown = "localhost" if host == "127.0.0.1" else (f"[{host}]" if ":" in host else host)
    console.print(
        f"moot serve: http://{shown}:{port}/ (viewer), /v1 (API), /docs (OpenAPI); debates in {store.describe()}; "
        f"models: {', '.join(settings.models)}"
        + (f"; tuned: moot/auto = moot/{tuned_model.label}" if tuned_model is not None else "")
        + ("; API key required" if key or store.has_keys() else "")
        + (
            f"; live events: {redact_url(settings.redis_url.get_secret_value())}"
            if settings.redis_url is not None
            else ""
        ),
        highlight=False,
        soft_wrap=True,
    )
    # uvicorn drains the server on SIGTERM and then raises it again for the handler it found: the
    # default one, so the process ends by SIGTERM as a service manager expects (moot's own handler
    # would turn it into an interrupt after the drain). Open streams are told why they end first.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        config = server_config(
            create_app(settings, store), settings, port=port, log_level=log_level, loop=loop.value, parser=http.value
        )
        with contextlib.suppress(KeyboardInterrupt):
            StoppingServer(config).run(sockets=sockets)
    finally:
        for sock in sockets:
            sock.close()
        store.close()  # (the app closed it already when it ran: closing again is harmless)


def _has_keys(db: str) -> bool:
    """Whether the store ``--db`` names holds API keys (``moot serve keys add``): such a server may
    listen beyond loopback without ``--api-key-env``. A SQLite file that does not exist has none; a
    store that cannot be opened is refused later, in one line."""
    from moot.server.state import StoreError, is_postgres_url, open_store

    if not is_postgres_url(db) and not Path(db).is_file():
        return False
    try:
        store = open_store(db, application_name="moot serve keys check")
    except StoreError:
        return False
    try:
        return store.has_keys()
    finally:
        store.close()


def listen_sockets(host: str, port: int) -> list[socket.socket]:
    """Listening TCP sockets on every address ``host`` resolves to (as asyncio's ``create_server``
    binds them), all on one port: ``port``, or with 0 the free one the first address got."""
    infos = socket.getaddrinfo(host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    seen: set[tuple[int, object]] = set()
    try:
        for family, kind, proto, _, address in infos:
            if (family, address[:2]) in seen:
                continue
            seen.add((family, address[:2]))
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((address[0], port, *address[2:]))
            sock.listen(2048)  # uvicorn's backlog: early connections wait instead of being refused
            port = sock.getsockname()[1]
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


serve_app.command("migrate")(migrate_command)
serve_app.add_typer(keys_app, name="keys")
