"""The SQL both backends run for the debates: written once with ``?`` placeholders (PostgreSQL's
driver gets ``%s``), with the few differences (the clock of the leases, row locks, how a
transaction begins, the schema's types) left to each backend. A debate added (under the limits),
its writes, its reads, its claims and leases, its cancels; the schema lives in :mod:`.sql_schema`,
the API keys' queries in :mod:`.sql_keys`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from moot.core.types import DebateResult
from moot.files import json_bytes
from moot.secrets import redact, redact_json
from moot.server.state.base import (
    Claim,
    LeaseLost,
    StoredDebate,
    StoredEvent,
    StoreUnavailable,
    Write,
    WriteFailure,
    now,
)
from moot.server.state.keys import ApiKey, LimitReached
from moot.server.state.result_json import ResultJson, Split, assemble
from moot.server.state.sql_keys import SqlKeys
from moot.server.state.sql_schema import COPIED

_COLUMNS = (
    "seq, id, status, protocol, question, model, created_at, started_at, finished_at, calls, tokens, elapsed_s, error"
)
_KEYS = [c.strip() for c in _COLUMNS.split(",")]
#: A debate's row with its transcript's frame (``n`` -1), then its turns' rows in their order.
_WITH_TURNS = (
    f"SELECT {_COLUMNS}, result, NULL AS place, NULL AS data, -1 AS n FROM debates WHERE id = ? "
    f"UNION ALL SELECT {', '.join('NULL' for _ in _KEYS)}, NULL, place, data, n FROM turns WHERE debate_id = ? "
    "ORDER BY n"
)
#: Debates no lease holds any more may be claimed: those waiting, and those running under a lease
#: that expired (the replica that ran them died or stopped renewing).
_UNFINISHED = "status IN ('queued', 'running')"


class SqlStore(SqlKeys):
    """:class:`~moot.server.state.base.Store` over a DB-API connection (the backend's part:
    :class:`~moot.server.state.sql_schema.SqlBackend`; the API keys' queries: :class:`SqlKeys`)."""

    def create(
        self,
        debate_id: str,
        *,
        protocol: str,
        question: str,
        model: str,
        request: dict[str, Any],
        key: ApiKey | None = None,
        capacity: int | None = None,
        claim_for: tuple[str, float] | None = None,
    ) -> str:
        created = now()
        owner: str | None = None
        lease_sql, lease_args, epoch = "NULL", list[Any](), 0
        if claim_for is not None:
            owner, (lease_sql, lease_args), epoch = claim_for[0], self._later(claim_for[1]), 1
        with self._tx() as c:
            limited = key is not None and key.concurrency is not None
            if capacity is not None or limited:
                # Counted and added under one lock, so that replicas admitting at once cannot both pass.
                self._lock_admission(c)
            if capacity is not None:
                unfinished = c.execute(self._q(f"SELECT COUNT(*) FROM debates WHERE {_UNFINISHED}")).fetchone()[0]
                if int(unfinished) >= capacity:
                    raise LimitReached("capacity", capacity)
            if key is not None and key.concurrency is not None:
                mine = c.execute(
                    self._q(f"SELECT COUNT(*) FROM debates WHERE key_id = ? AND {_UNFINISHED}"), (key.id,)
                ).fetchone()[0]
                if int(mine) >= key.concurrency:
                    raise LimitReached("key_concurrency", key.concurrency, key.name)
            c.execute(
                self._q(
                    "INSERT INTO debates (id, status, protocol, question, model, created_at, request, key_id, "
                    f"owner, lease_until, epoch) VALUES (?, 'queued', ?, ?, ?, ?, ?, ?, ?, {lease_sql}, ?)"
                ),
                (
                    debate_id,
                    redact(protocol, self.secrets),  # an inline protocol's name is the caller's text
                    redact(question, self.secrets),
                    model,
                    created,
                    redact_json(json_bytes(request).decode(), self.secrets),
                    None if key is None else key.id,
                    owner,
                    *lease_args,
                    epoch,
                ),
            )
        return created

    def set_request(self, debate_id: str, request: dict[str, Any]) -> bool:
        with self._tx() as c:
            c.execute(
                self._q("UPDATE debates SET request = ? WHERE id = ?"),
                (redact_json(json_bytes(request).decode(), self.secrets), debate_id),
            )
            return bool(c.rowcount)

    def delete(self, debate_id: str) -> bool:
        with self._tx() as c:
            # The debate's row first, as a write locks it (PostgreSQL): a write holding it is waited
            # for, and its turns and events, committed by then, are seen by the statements after.
            c.execute(self._q("DELETE FROM debates WHERE id = ?"), (debate_id,))
            deleted = bool(c.rowcount)
            c.execute(self._q("DELETE FROM turns WHERE debate_id = ?"), (debate_id,))
            c.execute(self._q("DELETE FROM events WHERE debate_id = ?"), (debate_id,))
            return deleted

    def write(
        self,
        debate_id: str,
        result: DebateResult,
        events: list[StoredEvent],
        *,
        status: str | None = None,
        error: str | None = None,
        epoch: int | None = None,
    ) -> None:
        self.write_one(Write(debate_id, result, events, status=status, error=error, epoch=epoch))

    def finish_without_result(
        self, debate_id: str, status: str, error: str, events: list[StoredEvent], *, epoch: int | None = None
    ) -> None:
        self.write_one(Write(debate_id, None, events, status=status, error=error, epoch=epoch))

    def write_one(self, write: Write) -> None:
        committed: list[tuple[ResultJson, Split]] = []
        with self._tx() as c:
            self._write_in(c, write, committed=committed)
        _stored(committed)

    def _write_in(
        self, c: Any, w: Write, *, usage: list[Write] | None = None, committed: list[tuple[ResultJson, Split]]
    ) -> None:
        """One debate's write inside the transaction of ``c``; :class:`LeaseLost` if its epoch is stale,
        raised before the write changed anything (:meth:`_write_together` relies on it: the debates
        written with it are committed). ``usage``: a debate that ended is added there, its usage
        counted by the caller, instead of here. ``committed``: its transcript's rows, which its
        encoder is told of once the transaction is committed (:meth:`ResultJson.stored`).

        A transcript is stored as its encoder splits it (its frame in ``result``, its turns the store
        lacks into ``turns``: each finished turn written once), or, with no encoder, whole in
        ``result``, with no rows (:func:`~moot.server.state.result_json.assemble` reads both)."""
        fields: list[str] = []
        values: list[Any] = []
        split: Split | None = None
        if w.started:
            fields += ["status = 'running'", "started_at = ?"]
            values.append(w.started)
        if w.result is not None:
            r = w.result
            fields += ["result = ?", "calls = ?", "tokens = ?", "elapsed_s = ?"]
            if w.encoder is None:
                text = r.to_json(indent=None, secrets=self.secrets)
            else:
                split = w.encoder.split(r, self.secrets)
                text = split.frame
            values += [text, r.llm_calls, r.usage.total_tokens, r.elapsed_s]
        if w.status is not None:
            # A debate that ended is no one's: its lease ends with it.
            fields += ["status = ?", "finished_at = ?", "error = ?", "owner = NULL", "lease_until = NULL"]
            values += [w.status, now(), None if w.error is None else redact(w.error, self.secrets)]
        where = "id = ?"
        if w.epoch is not None:
            where += " AND epoch = ?"
        if w.epoch is not None or w.events:
            # The fence is checked even for events alone, and events go only with their debate (one
            # deleted meanwhile takes none).
            fields = fields or ["epoch = epoch"]
        changed = 0
        if fields:
            changed = c.execute(
                self._q(f"UPDATE debates SET {', '.join(fields)} WHERE {where}"),
                (*values, w.debate_id, *(() if w.epoch is None else (w.epoch,))),
            ).rowcount
            if w.epoch is not None and changed == 0:
                raise LeaseLost(w.debate_id, w.epoch)
            if w.status is not None and w.status not in ("queued", "running") and changed:
                if usage is None:
                    self._count_usage(c, w)
                else:
                    usage.append(w)
            if w.result is not None and changed:
                self._write_turns(c, w, split, committed)
        if w.events and changed:
            # Built inside the transaction: an event that cannot be written rolls the update back. (Its
            # data was redacted as it was logged, with these secrets: EventWriter.log.)
            rows = [(w.debate_id, e.id, e.name, e.data) for e in w.events]
            c.executemany(
                self._q("INSERT INTO events (debate_id, id, name, data) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING"),
                rows,
            )

    def _write_turns(self, c: Any, w: Write, split: Split | None, committed: list[tuple[ResultJson, Split]]) -> None:
        """A transcript's rows: those its encoder's ``split`` names (and none past its turns), or none
        (it was stored whole)."""
        if split is None or w.encoder is None:
            c.execute(self._q("DELETE FROM turns WHERE debate_id = ?"), (w.debate_id,))
            return
        if split.prune:
            c.execute(self._q("DELETE FROM turns WHERE debate_id = ? AND n >= ?"), (w.debate_id, split.count))
        if split.rows:
            c.executemany(
                self._q(
                    "INSERT INTO turns (debate_id, n, place, data) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (debate_id, n) DO UPDATE SET place = excluded.place, data = excluded.data"
                ),
                [(w.debate_id, n, place, text) for n, place, text in split.rows],
            )
        committed.append((w.encoder, split))

    def write_all(self, writes: Iterable[Write]) -> list[WriteFailure]:
        """Several debates' writes, each rolled back alone if it fails: no other debate's write or
        event goes with it. A lost lease is reported (the debate is another replica's now); any other
        failure (a transcript that cannot be encoded, a value the database refuses) also marks its
        debate ``failed`` with the reason, its events kept when they can be, but a store that cannot
        be reached (:class:`StoreUnavailable`): those writes are to be tried again.

        The writes of one moment (a server's event loop gathers them: 2.5 on average at 64 debates
        at once) go in one transaction, one commit for all of them (benchmarks/bench_store_writes.py).
        A write refused for a stale epoch changed nothing. If anything else fails, the transaction is
        rolled back and the writes are made again each in its own, as before, so that each is judged
        alone."""
        writes = list(writes)
        if len(writes) > 1:
            try:
                return self._write_together(writes)
            except StoreUnavailable as exc:
                return [WriteFailure(w.debate_id, exc) for w in writes]
            except Exception:
                pass  # one of them cannot be written: each alone, below, says which
        return self._write_each(writes)

    def _write_together(self, writes: list[Write]) -> list[WriteFailure]:
        """The writes in one transaction; those refused for a stale epoch (which changed nothing) are
        returned. Anything else raised rolls the whole transaction back."""
        lost: list[WriteFailure] = []
        ended: list[Write] = []
        committed: list[tuple[ResultJson, Split]] = []
        with self._tx() as c:
            # The rows locked in one order by every replica (PostgreSQL): the debates' by id, then the
            # keys' by id, so that two replicas' batches never wait on each other in a cycle.
            for w in sorted(writes, key=lambda w: w.debate_id):
                try:
                    self._write_in(c, w, usage=ended, committed=committed)
                except LeaseLost as exc:  # (raised before the write changed anything)
                    lost.append(WriteFailure(w.debate_id, exc))
            for key, _, w in sorted(((self._key_of(c, w), w.debate_id, w) for w in ended), key=lambda k: k[:2]):
                if key:
                    self._count_usage(c, w)
        _stored(committed)
        return lost

    def _write_each(self, writes: list[Write]) -> list[WriteFailure]:
        """Each write in its own transaction (see :meth:`write_all`)."""
        failures: list[WriteFailure] = []
        for w in writes:
            try:
                self.write_one(w)
            except (LeaseLost, StoreUnavailable) as exc:
                failures.append(WriteFailure(w.debate_id, exc))
            except Exception as exc:  # this debate's write alone is rolled back: the caller is told which
                reason = redact(
                    f"the server could not store this debate ({type(exc).__name__}: {exc}); it was stopped",
                    self.secrets,
                )
                self._mark_failed(w, reason)
                failures.append(WriteFailure(w.debate_id, exc, reason))
        return failures

    def _key_of(self, c: Any, w: Write) -> str:
        """The key a debate was submitted with ("" for none)."""
        found = c.execute(self._q("SELECT key_id FROM debates WHERE id = ?"), (w.debate_id,)).fetchone()
        return "" if found is None or found[0] is None else str(found[0])

    def _count_usage(self, c: Any, w: Write) -> None:
        """A debate that ended: its calls, tokens and cost added to its key's usage, once (``counted``),
        in the transaction of its end."""
        row = c.execute(self._q("SELECT key_id, calls, tokens, counted FROM debates WHERE id = ?"), (w.debate_id,))
        found = row.fetchone()
        if found is None or found[0] is None or found[3]:
            return
        key_id, calls, tokens, _ = found
        cost = w.result.cost if w.result is not None else None
        usd = cost.usd if cost is not None else None
        c.execute(
            self._q(
                "UPDATE api_keys SET debates = debates + 1, calls = calls + ?, tokens = tokens + ?, usd = usd + ?, "
                "unpriced_debates = unpriced_debates + ? WHERE id = ?"
            ),
            (int(calls), int(tokens), float(usd or 0.0), 1 if usd is None and int(calls) > 0 else 0, key_id),
        )
        c.execute(self._q("UPDATE debates SET counted = 1 WHERE id = ?"), (w.debate_id,))

    def _mark_failed(self, w: Write, reason: str) -> None:
        """A debate whose write failed: ``failed`` with the reason, with the write's events if they
        can be stored, else without them (the transcript stays as last stored)."""
        for events in (w.events, []):
            try:
                self.write_one(Write(w.debate_id, None, events, status="failed", error=reason, epoch=w.epoch))
                return
            except Exception:
                continue

    def import_debate(self, debate: dict[str, Any], events: list[tuple[int, str, str]]) -> tuple[bool, int]:
        """A debate copied from another store as it was there (its columns but ``seq``: see
        :data:`COPIED`; no lease), with its events ``(id, name, data)``, in one transaction. Returns
        whether it was new here, and how many of its events were."""
        unknown = set(debate) - set(COPIED)
        if unknown or "id" not in debate:
            raise ValueError(f"not a debate's columns: {sorted(unknown) or 'no id'}")
        cols = [c for c in COPIED if c in debate]
        with self._tx() as c:
            inserted = c.execute(
                self._q(
                    f"INSERT INTO debates ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)}) "
                    "ON CONFLICT (id) DO NOTHING"
                ),
                [debate[k] for k in cols],
            ).rowcount
            count = self._q("SELECT COUNT(*) FROM events WHERE debate_id = ?")
            before = int(c.execute(count, (debate["id"],)).fetchone()[0])
            if events:
                c.executemany(
                    self._q(
                        "INSERT INTO events (debate_id, id, name, data) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING"
                    ),
                    [(debate["id"], i, n, d) for i, n, d in events],
                )
            after = int(c.execute(count, (debate["id"],)).fetchone()[0])
        return inserted == 1, after - before

    # ----------------------------------------------------------------------------- reads

    def unfinished(self) -> list[str]:
        rows = self._read(self._q(f"SELECT id FROM debates WHERE {_UNFINISHED} ORDER BY seq"))
        return [r[0] for r in rows]

    def get(self, debate_id: str, *, with_result: bool = True) -> StoredDebate | None:
        if not with_result:
            rows = self._read(self._q(f"SELECT {_COLUMNS} FROM debates WHERE id = ?"), (debate_id,))
            return _row(rows[0]) if rows else None
        # The debate's row (its transcript's frame) and its turns' rows in one statement: one snapshot
        # of both, the frame read once (its task's context and images may be large).
        rows = self._read(self._q(_WITH_TURNS), (debate_id, debate_id))
        if not rows or rows[0][-1] != -1:
            return None
        frame = rows[0][len(_KEYS)]
        turns = [(int(r[-3]), str(r[-2])) for r in rows[1:]]
        return _row(rows[0], None if frame is None else assemble(frame, turns))

    def page(self, *, status: str | None, limit: int, before: int | None) -> list[StoredDebate]:
        where: list[str] = []
        args: list[str | int] = []
        if status is not None:
            where.append("status = ?")
            args.append(status)
        if before is not None:
            where.append("seq < ?")
            args.append(before)
        sql = f"SELECT {_COLUMNS} FROM debates"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY seq DESC LIMIT ?"
        return [_row(r) for r in self._read(self._q(sql), (*args, limit))]

    def events(self, debate_id: str, after: int = 0) -> list[StoredEvent]:
        rows = self._read(
            self._q("SELECT id, name, data FROM events WHERE debate_id = ? AND id > ? ORDER BY id"), (debate_id, after)
        )
        return [StoredEvent(id=i, name=n, data=d) for i, n, d in rows]

    def request(self, debate_id: str) -> dict[str, Any] | None:
        rows = self._read(self._q("SELECT request FROM debates WHERE id = ?"), (debate_id,))
        if not rows:
            return None
        value: dict[str, Any] = json.loads(rows[0][0])
        return value

    def last_event_id(self, debate_id: str) -> int:
        rows = self._read(self._q("SELECT MAX(id) FROM events WHERE debate_id = ?"), (debate_id,))
        return int(rows[0][0] or 0)

    # ----------------------------------------------------------------------------- queue

    def claim(self, replica: str, lease_s: float, *, debate_id: str | None = None) -> Claim | None:
        now_sql, now_args = self._now()
        later_sql, later_args = self._later(lease_s)
        where = f"{_UNFINISHED} AND (lease_until IS NULL OR lease_until < {now_sql})"
        args: list[Any] = list(now_args)
        if debate_id is not None:
            where += " AND id = ?"
            args.append(debate_id)
        with self._tx() as c:
            row = c.execute(
                self._q(f"SELECT id, owner, status FROM debates WHERE {where} ORDER BY seq LIMIT 1{self.lock_rows}"),
                args,
            ).fetchone()
            if row is None:
                return None
            claimed, previous, status = row
            epoch = c.execute(
                self._q(
                    f"UPDATE debates SET owner = ?, lease_until = {later_sql}, epoch = epoch + 1 "
                    "WHERE id = ? RETURNING epoch"
                ),
                (replica, *later_args, claimed),
            ).fetchone()[0]
        return Claim(claimed, int(epoch), replica, previous, status)

    def renew(self, debate_id: str, epoch: int, lease_s: float) -> None:
        later_sql, later_args = self._later(lease_s)
        with self._tx() as c:
            changed = c.execute(
                self._q(f"UPDATE debates SET lease_until = {later_sql} WHERE id = ? AND epoch = ? AND {_UNFINISHED}"),
                (*later_args, debate_id, epoch),
            ).rowcount
            if changed == 0:
                raise LeaseLost(debate_id, epoch)

    def release(self, debate_id: str, epoch: int) -> None:
        with self._tx() as c:
            changed = c.execute(
                self._q("UPDATE debates SET lease_until = NULL, epoch = epoch + 1 WHERE id = ? AND epoch = ?"),
                (debate_id, epoch),
            ).rowcount
            if changed == 0:
                raise LeaseLost(debate_id, epoch)

    def expired(self) -> list[str]:
        now_sql, now_args = self._now()
        rows = self._read(
            self._q(
                f"SELECT id FROM debates WHERE {_UNFINISHED} AND owner IS NOT NULL AND lease_until < {now_sql} "
                "ORDER BY seq"
            ),
            now_args,
        )
        return [r[0] for r in rows]

    # ------------------------------------------------------------------- cancels

    def request_cancel(self, debate_id: str) -> bool:
        with self._tx() as c:
            changed = c.execute(
                self._q(f"UPDATE debates SET cancel_requested = 1 WHERE id = ? AND {_UNFINISHED}"), (debate_id,)
            ).rowcount
        return bool(changed)

    def cancel_requested(self, debate_ids: Iterable[str]) -> list[str]:
        ids = list(debate_ids)
        if not ids:
            return []
        marks = ", ".join("?" for _ in ids)
        rows = self._read(self._q(f"SELECT id FROM debates WHERE cancel_requested = 1 AND id IN ({marks})"), ids)
        return [r[0] for r in rows]

    def lease(self, debate_id: str) -> tuple[str | None, int]:
        """The debate's owner and epoch (for the tests and the logs)."""
        rows = self._read(self._q("SELECT owner, epoch FROM debates WHERE id = ?"), (debate_id,))
        if not rows:
            return None, 0
        return rows[0][0], int(rows[0][1])


def _row(row: Sequence[Any], result: DebateResult | None = None) -> StoredDebate:
    data = dict(zip(_KEYS, row, strict=False))
    data["result"] = result
    return StoredDebate.model_validate(data)


def _stored(committed: list[tuple[ResultJson, Split]]) -> None:
    """The transcripts' rows of a committed transaction, their encoders told."""
    for encoder, split in committed:
        encoder.stored(split)
