"""The API keys' queries both SQL backends run (:class:`SqlKeys`): a key added, listed, looked up by
its hash, revoked, copied from another store, and its requests counted per minute (its rate)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from moot.server.state.base import now
from moot.server.state.keys import ApiKey, DuplicateKeyName, KeyUsage, UnknownKey, new_key_id, same_hash
from moot.server.state.sql_schema import KEY_COPIED, SqlBackend


class SqlKeys(SqlBackend):
    """The ``api_keys`` and ``key_windows`` tables (schema version 3)."""

    def add_key(
        self, name: str, hashed: str, *, rate_per_min: int | None = None, concurrency: int | None = None
    ) -> ApiKey:
        key = ApiKey(id=new_key_id(), name=name, created_at=now(), rate_per_min=rate_per_min, concurrency=concurrency)
        with self._tx() as c:
            taken = c.execute(self._q("SELECT revoked_at FROM api_keys WHERE name = ?"), (name,)).fetchone()
            if taken is not None:
                state = f"revoked at {taken[0]}" if taken[0] else "in use"
                raise DuplicateKeyName(f"a key named {name!r} exists already ({state}); give another --name")
            c.execute(
                self._q(
                    "INSERT INTO api_keys (id, name, hash, created_at, rate_per_min, concurrency) "
                    "VALUES (?, ?, ?, ?, ?, ?)"
                ),
                (key.id, name, hashed, key.created_at, rate_per_min, concurrency),
            )
        return key

    def keys(self) -> list[ApiKey]:
        return [_key(r) for r in self._read(self._q(f"SELECT {_KEY_COLUMNS} FROM api_keys ORDER BY created_at, id"))]

    def key_by_hash(self, hashed: str) -> ApiKey | None:
        rows = self._read(self._q(f"SELECT {_KEY_COLUMNS}, hash FROM api_keys WHERE hash = ?"), (hashed,))
        if not rows or not same_hash(str(rows[0][-1]), hashed):
            return None
        return _key(rows[0][:-1])

    def key(self, key_id: str) -> ApiKey | None:
        rows = self._read(self._q(f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE id = ?"), (key_id,))
        return _key(rows[0]) if rows else None

    def revoke_key(self, name_or_id: str) -> tuple[ApiKey, bool]:
        with self._tx() as c:
            row = c.execute(
                self._q(f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE id = ? OR name = ?"), (name_or_id, name_or_id)
            ).fetchone()
            if row is None:
                raise UnknownKey(f"no key named or with id {name_or_id!r}; list them with moot serve keys list")
            key = _key(row)
            if key.revoked_at is not None:
                return key, False
            key.revoked_at = now()
            c.execute(self._q("UPDATE api_keys SET revoked_at = ? WHERE id = ?"), (key.revoked_at, key.id))
        return key, True

    def import_key(self, key: dict[str, Any]) -> bool:
        """A key copied from another store as it was there (:data:`KEY_COPIED`: its hash, limits and
        usage); whether it was new here (a key of that id, or a name taken, is left as it is)."""
        unknown = set(key) - set(KEY_COPIED)
        if unknown or not {"id", "name", "hash", "created_at"} <= set(key):
            raise ValueError(f"not a key's columns: {sorted(unknown) or 'id, name, hash, created_at missing'}")
        cols = [c for c in KEY_COPIED if c in key]
        with self._tx() as c:
            taken = c.execute(
                self._q("SELECT 1 FROM api_keys WHERE id = ? OR name = ? OR hash = ?"),
                (key["id"], key["name"], key["hash"]),
            ).fetchone()
            if taken is not None:
                return False
            c.execute(
                self._q(f"INSERT INTO api_keys ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})"),
                [key[k] for k in cols],
            )
        return True

    def has_keys(self) -> bool:
        return bool(self._read(self._q("SELECT 1 FROM api_keys LIMIT 1")))

    def count_request(self, key_id: str, per_minute: int) -> float | None:
        minute_sql, minute_args = self._minute()
        # One statement, committed on its own: one round trip for each request of a limited key.
        counted = self._statement(
            self._q(
                f"INSERT INTO key_windows (key_id, minute, requests) VALUES (?, {minute_sql}, 1) "
                "ON CONFLICT (key_id, minute) DO UPDATE SET requests = key_windows.requests + 1 "
                "WHERE key_windows.requests < ? RETURNING requests, minute"
            ),
            (key_id, *minute_args, per_minute),
        )
        if not counted:
            return 60.0 - self._seconds() % 60
        requests, minute = counted[0]
        if int(requests) == 1:  # the key's first request of a minute: its older windows go
            with self._tx() as c:
                c.execute(self._q("DELETE FROM key_windows WHERE key_id = ? AND minute < ?"), (key_id, minute))
        return None


_KEY_COLUMNS = (
    "id, name, created_at, revoked_at, rate_per_min, concurrency, debates, calls, tokens, usd, unpriced_debates"
)


def _key(row: Sequence[Any]) -> ApiKey:
    key_id, name, created, revoked, rate, concurrency, debates, calls, tokens, usd, unpriced = row[:11]
    usage = KeyUsage(
        debates=int(debates), calls=int(calls), tokens=int(tokens), usd=float(usd), unpriced_debates=int(unpriced)
    )
    return ApiKey(
        id=key_id,
        name=name,
        created_at=created,
        revoked_at=revoked,
        rate_per_min=rate,
        concurrency=concurrency,
        usage=usage,
    )
