"""``Idempotency-Key`` on the OpenAI endpoints: a retried request joins its debate, never starts another.

The OpenAI SDKs retry a request that timed out or got a 408, 409, 429 or 5xx (twice by default),
each time with the same body. Without a key each retry is a new debate: the whole cost again, and
the first one left running. With ``Idempotency-Key: <token>``:

- the key names the debate: its id is a hash of the caller (the store's key it was authenticated
  with, by bearer or viewer session; else its ``Authorization`` as sent), the endpoint and
  the key, so the mapping is the store's own primary key (it survives a restart and holds across the
  replicas sharing a store, with no table of its own), and one caller's key never reaches another's;
- the same key while the debate runs joins it (streamed or not; run by another replica, it is
  followed in the store until it ends); after it ended, its stored result is the answer (a failure
  too: the same key gives the same answer; send a new key to run the question again);
- the same key with another body is a 409 (``idempotency_key_reused``, ``x-should-retry: false``):
  never a second debate. The body is compared by a hash kept with the debate's request; ``stream``
  and ``stream_options`` are left out of it, so a client may join a debate streamed or not.

The native ``POST /v1/debates`` honours the key the same way (:func:`create_once`): the same key
answers with the same debate's id and its current status, whichever replica it was sent to.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from moot.server.limits import RequestError
from moot.server.policy import Prepared
from moot.server.schemas import ServerStatus
from moot.server.state.base import StoreUnavailable, patiently
from moot.server.state.events import EventLog
from moot.server.state.keyring import REQUEST_KEY
from moot.server.state.manager import DebateManager, LiveDebate, QueueFull

HEADER = "Idempotency-Key"
#: A key: 1 to 255 printable ASCII characters, no space (a UUID, as the SDKs' docs suggest).
_KEY = re.compile(r"[\x21-\x7e]{1,255}")
#: How often a debate another replica runs is read again from the store while a request follows it.
FOLLOW_S = 0.5
_UNFINISHED = ("queued", "running")
_FOLLOWERS: set[asyncio.Task[None]] = set()


class KeyRefusal(RequestError):
    """A refusal of the ``Idempotency-Key`` header: named as the header, wherever it is found."""


@dataclass(frozen=True)
class Idempotency:
    """A request's key, the debate it names and the hash of the request's body."""

    key: str
    debate_id: str
    body: str
    #: The hash as the versions before ``body``'s kept it (every field): a debate they stored still
    #: matches its retry.
    before: str = ""

    def recorded(self) -> dict[str, Any]:
        """What is kept with the debate's request: the key, and the body's hash a reuse is checked by."""
        return {"idempotency": {"key": self.key, "body": self.body}}


def of_request(headers: Mapping[str, str] | None, endpoint: str, body: BaseModel) -> Idempotency | None:
    """The request's ``Idempotency-Key`` (None: it sends none), or a 400 naming the header."""
    key = headers.get(HEADER) if headers is not None else None
    if key is None:
        return None
    if not _KEY.fullmatch(key):
        raise KeyRefusal(
            f"{HEADER}: give 1 to 255 printable ASCII characters without spaces (a UUID, say); the same key "
            "sent again returns the same debate",
            param=HEADER,
        )
    assert headers is not None
    # Whose key it is: the store's key the request was authenticated with (by its bearer or by a
    # viewer's session token opened with it), else the header as sent (the server's own key, or a
    # viewer's session opened with it: each session its own caller).
    identity = REQUEST_KEY.get()
    who = f"key {identity.id}" if identity is not None else headers.get("authorization", "")
    caller = hashlib.sha256(who.encode()).hexdigest()
    debate_id = hashlib.sha256(f"moot-idempotency\0{caller}\0{endpoint}\0{key}".encode()).hexdigest()[:32]
    return Idempotency(key=key, debate_id=debate_id, body=_hash(body, sent=True), before=_hash(body, sent=False))


def _hash(body: BaseModel, *, sent: bool) -> str:
    """The body's hash: of the fields the client sent (``sent``), so that a new field with a
    default, in a newer moot, leaves it as it was (a retry sent to an upgraded replica of a rolling
    upgrade still joins its debate); else of every field, as earlier versions kept it."""
    data = body.model_dump(mode="json", by_alias=True, exclude={"stream", "stream_options"}, exclude_unset=sent)
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def submit_once(
    manager: DebateManager,
    prepared: Prepared,
    record: dict[str, Any],
    idem: Idempotency,
    headers: Mapping[str, str] | None,
) -> LiveDebate:
    """The debate the key names: the one running or stored, or a new one under the key's id."""
    existing = _existing(manager, prepared, idem)
    if existing is not None:
        return existing
    try:
        return manager.submit(
            prepared.spec,
            prepared.task,
            prepared.engine,
            prepared.model,
            record | idem.recorded(),
            headers=headers,
            debate_id=idem.debate_id,
        )
    except QueueFull:
        raise
    except Exception:
        # The store refused the id: another replica created the debate since it was looked up.
        existing = _existing(manager, prepared, idem)
        if existing is None:
            raise
        return existing


def create_once(
    manager: DebateManager, idem: Idempotency, create: Callable[[dict[str, Any]], LiveDebate]
) -> tuple[str, ServerStatus]:
    """``POST /v1/debates`` with a key: the id and current status of the debate the key names, or of
    the one ``create`` (given what to keep with its request) starts under the key's id. The id is
    the store's primary key, so two replicas sent the same key at once make one debate: the one
    whose insert is refused answers with the other's."""
    found = _status_of(manager, idem)
    if found is not None:
        return idem.debate_id, found
    try:
        live = create(idem.recorded())
    except QueueFull:
        raise
    except Exception:
        found = _status_of(manager, idem)  # another replica created it since it was looked up
        if found is None:
            raise
        return idem.debate_id, found
    return live.id, live.status


def _status_of(manager: DebateManager, idem: Idempotency) -> ServerStatus | None:
    request = manager.store.request(idem.debate_id)
    if request is None:
        return None
    _check_body(request, idem)
    live = manager.live.get(idem.debate_id)
    if live is not None:
        return live.status
    row = manager.store.get(idem.debate_id, with_result=False)
    return row.status if row is not None else None


def _check_body(request: dict[str, Any], idem: Idempotency) -> None:
    """A 409 if the key was sent before with another body (``request``: the debate's, as stored)."""
    stored = request.get("idempotency")
    if not isinstance(stored, dict) or stored.get("body") not in (idem.body, idem.before):
        raise KeyRefusal(
            f"{HEADER}: {idem.key!r} was sent before with another request body (debate {idem.debate_id}); a key "
            "stands for one request: send that request again to get its debate, or a new key for this one",
            param=HEADER,
            status=409,
            code="idempotency_key_reused",
            should_retry=False,
        )


def _existing(manager: DebateManager, prepared: Prepared, idem: Idempotency) -> LiveDebate | None:
    request = manager.store.request(idem.debate_id)
    if request is None:
        return None
    _check_body(request, idem)
    live = manager.live.get(idem.debate_id)
    if live is not None:
        return live
    live = LiveDebate(
        id=idem.debate_id, spec=prepared.spec, task=prepared.task, engine=prepared.engine, model=prepared.model
    )
    row = manager.store.get(idem.debate_id, with_result=False)
    if row is not None and row.status in _UNFINISHED:
        # Another replica runs it: follow it in the store to its end (its tokens stay on that replica).
        live.status = row.status
        task = asyncio.get_running_loop().create_task(_follow(manager, live), name=f"follow-{live.id}")
        _FOLLOWERS.add(task)
        task.add_done_callback(_FOLLOWERS.discard)
    else:
        _ended(manager, live)
    return live


async def _follow(manager: DebateManager, live: LiveDebate) -> None:
    """Follow a debate another replica runs, in the store, to its end (or this server's stop); a
    store out of reach is waited for (its request would otherwise never be answered)."""
    try:
        while not manager.stopping:
            row = await patiently(functools.partial(manager.store.get, live.id, with_result=False))
            if row is None or row.status not in _UNFINISHED:
                break
            await asyncio.sleep(FOLLOW_S)
    finally:
        _ended(manager, live)


def _ended(manager: DebateManager, live: LiveDebate) -> None:
    """Give ``live`` its stored end: status, transcript and events (its log closed); its waiters are
    told it ended whatever the store says (out of reach: as it was, which they answer as such)."""
    try:
        row = manager.store.get(live.id)
        if row is not None:
            live.status = row.status
            live.result = row.result
        log = manager.log_of(live.id) or EventLog(closed=True)
        for event in log.shown:
            live.log.append_json(event.name, event.data)
    except StoreUnavailable:
        pass
    finally:
        live.log.close()
        live.done.set()
