"""``moot serve migrate`` and ``moot serve keys``: the store's administration, beside the server
(``moot serve`` itself: :mod:`moot.cli.serve`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from moot.cli.common import console, fail

if TYPE_CHECKING:
    from moot.server.state import Store


def migrate_command(
    source: Annotated[Path, typer.Option("--from", help="The SQLite file a moot serve --db kept its debates in.")],
    target: Annotated[
        str,
        typer.Option(
            "--to",
            envvar="MOOT_DB_URL",
            show_envvar=True,
            help="The store to copy them into: a postgresql://user:password@host:port/database URL.",
        ),
    ],
) -> None:
    """Copy a SQLite store's debates, events and API keys into PostgreSQL (safe to run again: what is there stays)."""
    from rich.markup import escape

    from moot.cli.common import err_console
    from moot.runlock import RunLock, RunLocked
    from moot.secrets import redact
    from moot.server.state import StoreBusy, StoreError, check_db, open_store
    from moot.server.state.copy import copy_debates, open_source

    try:
        check_db(target)
        if "://" not in target and Path(target).resolve() == source.resolve():
            raise StoreError(f"{target}: the same file as --from; give the store to copy into")
        source_db = open_source(source)
    except StoreError as exc:
        raise fail(str(exc), 2) from None
    # No server writes either store meanwhile: the source's lock file, the target's server lock.
    try:
        lock = RunLock.acquire(
            source.parent, f"{source.name}.lock", label=f"--from {str(source)!r}", hint="stop the moot serve using it"
        )
    except RunLocked as exc:
        source_db.close()
        raise fail(str(exc), 2) from None
    try:
        try:
            store = open_store(target, application_name="moot serve migrate")
        except StoreError as exc:
            raise fail(f"--to {exc}", 2) from None
        try:
            store.take_server_lock()
            report = copy_debates(
                source_db,
                store,
                lambda line: err_console.print(escape(redact(line, store.secrets)), highlight=False, soft_wrap=True),
            )
            where = store.describe()
        except StoreBusy as exc:
            raise fail(str(exc).replace("--db", "--to", 1), 2) from None
        finally:
            store.close()
    finally:
        source_db.close()
        lock.release()
    console.print(
        f"copied {report.copied} debate(s) with {report.events} event(s) from {source} into {where}"
        + (f"; {report.keys} API key(s)" if report.keys else "")
        + (f"; {report.present} already there" if report.present else "")
        + (f"; {report.problems} not copied (above)" if report.problems else ""),
        highlight=False,
        soft_wrap=True,
    )
    if report.problems:
        raise typer.Exit(1)


keys_app = typer.Typer(
    help="The API keys kept (hashed) in the store: every replica on it accepts them (docs/serve.md).",
    no_args_is_help=True,
)

DbOption = Annotated[
    str | None,
    typer.Option(
        envvar="MOOT_DB_URL",
        show_envvar=True,
        help="The store, as moot serve --db takes it: a SQLite file (default moot.sqlite) or a postgresql:// URL.",
    ),
]


def _keys_store(db: str | None, *, create: bool = False) -> Store:
    """The store ``--db`` names, open (a SQLite file must exist, unless ``create``); a one-line exit 2."""
    from moot.server.state import StoreError, check_db, is_postgres_url, open_store

    try:
        where = check_db(db if db is not None and db.strip() else "moot.sqlite")
        if not create and not is_postgres_url(where) and not Path(where).is_file():
            raise StoreError(f"{where}: no such file; give the --db moot serve uses (or add a key first)")
        return open_store(where, application_name="moot serve keys")
    except StoreError as exc:
        raise fail(f"--db {exc}", 2) from None


@keys_app.command("add")
def keys_add(
    name: Annotated[str, typer.Option("--name", help="A name for the key (letters, digits, '.', '_', '-').")],
    rate: Annotated[
        int | None, typer.Option("--rate", min=1, help="Requests a minute this key may make, all replicas together.")
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option("--concurrency", min=1, help="Debates this key may have queued or running at once, in all."),
    ] = None,
    db: DbOption = None,
) -> None:
    """Add a key and print it, once: only its hash is kept, so it cannot be shown again."""
    from moot.cli.common import err_console
    from moot.server.state.keys import DuplicateKeyName, check_name, key_hash, new_key

    try:
        name = check_name(name)
    except ValueError as exc:
        raise fail(f"--name {exc}", 2) from None
    store = _keys_store(db, create=True)
    secret = new_key()
    try:
        added = store.add_key(name, key_hash(secret), rate_per_min=rate, concurrency=concurrency)
        where = store.describe()
    except DuplicateKeyName as exc:
        raise fail(f"--name {exc}", 1) from None
    finally:
        store.close()
    typer.echo(secret)
    # (where it went: above, on the terminal, or into the file standard output was sent to)
    shown = "printed above this" if sys.stdout.isatty() else "written to standard output"
    err_console.print(
        f"added key {added.name!r} ({added.id}) to {where}: it is {shown} once; keep it in a secret store "
        "(it cannot be shown again: revoke it and add another if it is lost)",
        highlight=False,
        soft_wrap=True,
    )


@keys_app.command("list")
def keys_list(db: DbOption = None) -> None:
    """Every key (revoked ones too): its id, name, limits and usage; never the key itself."""
    store = _keys_store(db)
    try:
        keys = store.keys()
    finally:
        store.close()
    if not keys:
        typer.echo("no keys; add one with: moot serve keys add --name NAME")
        return
    header = ("ID", "NAME", "CREATED", "REVOKED", "RATE/MIN", "CONCURRENCY", "DEBATES", "CALLS", "TOKENS", "USD")
    rows = [header]
    for k in keys:
        u = k.usage
        usd = f"{u.usd:.6f}" + (f" (+{u.unpriced_debates} unpriced)" if u.unpriced_debates else "")
        rows.append(
            (
                k.id,
                k.name,
                k.created_at[:19],
                (k.revoked_at or "-")[:19],
                str(k.rate_per_min or "-"),
                str(k.concurrency or "-"),
                str(u.debates),
                str(u.calls),
                str(u.tokens),
                usd,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for row in rows:
        typer.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


@keys_app.command("revoke")
def keys_revoke(
    key: Annotated[str, typer.Argument(help="The key's name or id (moot serve keys list).")],
    db: DbOption = None,
) -> None:
    """Revoke a key: every replica refuses it within its key cache (5 s by default)."""
    from moot.server.state.keys import UnknownKey

    store = _keys_store(db)
    try:
        revoked, now = store.revoke_key(key.strip())
    except UnknownKey as exc:
        raise fail(str(exc).strip('"'), 1) from None
    finally:
        store.close()
    if now:
        typer.echo(f"revoked key {revoked.name!r} ({revoked.id}); replicas refuse it within their key cache (5 s)")
    else:
        typer.echo(f"key {revoked.name!r} ({revoked.id}) was already revoked at {revoked.revoked_at}")
