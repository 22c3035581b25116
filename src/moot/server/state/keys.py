"""The API keys a deployment's store holds (``moot serve keys add|list|revoke``), their limits and
their usage: the values that cross the store, and how a key is made and hashed.

A key is ``moot_sk_`` and 43 URL-safe characters (32 random bytes). The store keeps its SHA-256 only
(the key is random, so no salt is needed: the hash cannot be reversed by guessing); it is shown once,
when it is added, and never stored, logged or listed. A request's bearer is hashed and looked up by
that hash; the hash found is compared again with :func:`hmac.compare_digest`.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

from pydantic import BaseModel

#: What every key begins with: a bearer without it is never looked up in the store.
KEY_PREFIX = "moot_sk_"
#: A key's id as the store gives it (``key_`` and 12 hex digits): a name may not look like one.
KEY_ID = re.compile(r"key_[0-9a-f]{12}")
#: A key's name: letters, digits, ``.``, ``_``, ``-``, at most 64.
KEY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def new_key() -> str:
    """A new random key (shown once; the store keeps :func:`key_hash` of it)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def new_key_id() -> str:
    return "key_" + secrets.token_hex(6)


def key_hash(key: str) -> str:
    """The hex SHA-256 of a key: what the store keeps and looks up."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def same_hash(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def check_name(name: str) -> str:
    """A key's name as given, or a ValueError naming the rule."""
    name = name.strip()
    if not KEY_NAME.fullmatch(name) or KEY_ID.fullmatch(name):
        raise ValueError(
            f"{name!r} is not a key name: give 1 to 64 letters, digits, '.', '_' or '-', starting with a letter "
            "or digit (and not shaped like a key id, key_ and 12 hex digits)"
        )
    return name


class KeyUsage(BaseModel):
    """What a key's finished debates used, in all: counted once each, when it ends."""

    debates: int = 0
    calls: int = 0
    tokens: int = 0
    #: US dollars of the debates whose every model had a price (``moot serve --prices``).
    usd: float = 0.0
    #: Debates whose cost had no money figure (a model without a price): in ``calls`` and ``tokens`` only.
    unpriced_debates: int = 0


class ApiKey(BaseModel):
    """One key of the store, without the key itself: its id, name, limits and usage."""

    id: str
    name: str
    created_at: str
    revoked_at: str | None = None
    #: Requests a minute to the API, for the whole deployment (None: no limit).
    rate_per_min: int | None = None
    #: Debates queued or running at once, for the whole deployment (None: no limit).
    concurrency: int | None = None
    usage: KeyUsage = KeyUsage()

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


class UnknownKey(LookupError):
    """No key of that name or id (``moot serve keys revoke``)."""


class DuplicateKeyName(ValueError):
    """A key of that name exists already (revoked ones included)."""


class LimitReached(Exception):
    """A new debate would exceed a limit the store counts for the whole deployment: ``capacity``
    (the store's unfinished debates) or ``key_concurrency`` (one key's)."""

    def __init__(self, limit: str, allowed: int, key_name: str | None = None) -> None:
        if limit == "capacity":
            message = f"the deployment is running and queueing {allowed} debates, its limit; retry later"
        else:
            message = (
                f"the API key {key_name!r} has {allowed} debates queued or running, its concurrency limit; "
                "retry when one ends"
            )
        super().__init__(message)
        self.limit = limit
        self.allowed = allowed
