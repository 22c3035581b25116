"""Debates a store holds from before, built again here (:class:`Recovery`): at a restart on a
store of its own (SQLite), what the last process left unfinished (running: marked interrupted with
what it had; still queued: queued again, from its stored request); and, on any store, a stored
debate's request built again into a :class:`LiveDebate` by this server's models and limits (to
queue it again, or to run one another replica queued or left: :mod:`.takeover`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from moot.files import first_error
from moot.secrets import redact
from moot.server.schemas import DebateDoneData, DebateRequest
from moot.server.settings import ServerSettings
from moot.server.state import INTERRUPTED, Store, StoredDebate
from moot.server.state.events import LoggedEvent, done_data
from moot.server.state.live import (
    CANCELLED,
    DETACHED,
    NEVER_STARTED,
    LiveDebate,
    stopped_from_outside,
    zero_totals,
)

log = logging.getLogger("moot.server")


class Recovery:
    """A stored debate's request built again, by route for the OpenAI doors' (``rebuilders``, the
    manager's, which the app fills); ``start`` runs a debate built again (the manager's)."""

    def __init__(
        self,
        settings: ServerSettings,
        store: Store,
        rebuilders: dict[str, Callable[[str, dict[str, Any]], LiveDebate]],
        start: Callable[[LiveDebate], None],
    ) -> None:
        self.settings = settings
        self.store = store
        self.rebuilders = rebuilders
        self._start = start

    def recover(self) -> list[str]:
        """Take over what a previous process left unfinished. The debates it was running are marked
        interrupted with what they had (their ids are returned); those still waiting in its queue,
        which never started, are queued again in their order, under the same ids (a background
        response too, built again from its stored request). One that cannot be (a chat completion or
        a foreground response, whose caller's connection closed with the server; a request this
        server's models or limits no longer allow) is marked interrupted too, saying that it never
        ran and how to send it again.

        With a shared store (PostgreSQL) nothing is marked: other replicas may be running those
        debates. Each one whose replica stopped is claimed by a poller once its lease has expired
        (or at once if it was handed back), and goes on from its last finished turn
        (:meth:`DebateManager.start`)."""
        if self.store.shared:
            return []
        interrupted: list[str] = []
        requeued = left = 0
        for debate_id in self.store.unfinished():
            stored = self.store.get(debate_id)
            assert stored is not None
            if stored.status == "queued" and stored.result is None and self._not_served_here(debate_id):
                left += 1  # moot mcp on a store moot serve wrote: left queued for a server with that route
                continue
            if stored.status == "queued" and stored.result is None:
                owner, epoch = self.store.lease(debate_id)
                if owner is not None:  # claimed by the last process, which stopped before it started
                    self.store.release(debate_id, epoch)
                if self.store.cancel_requested([debate_id]):  # cancelled while it waited: not run again
                    gone = DebateDoneData(status="cancelled", error=CANCELLED, totals=zero_totals())
                    self.store.finish_without_result(
                        debate_id,
                        "cancelled",
                        CANCELLED,
                        [LoggedEvent(1, "debate_done", gone.model_dump_json()).stored()],
                    )
                    continue
                why = self._requeue(stored)
                if why is None:
                    requeued += 1
                    continue
                never = DebateDoneData(status="interrupted", error=why, totals=zero_totals())
                self.store.finish_without_result(
                    debate_id, "interrupted", why, [LoggedEvent(1, "debate_done", never.model_dump_json()).stored()]
                )
                interrupted.append(debate_id)
                continue
            last = self.store.last_event_id(debate_id)
            result = stored.result
            if result is not None and result.status == "running":
                stopped_from_outside(result, "interrupted", INTERRUPTED)
            data = (
                done_data(result, "interrupted", INTERRUPTED)
                if result is not None
                else DebateDoneData(status="interrupted", error=INTERRUPTED, totals=zero_totals())
            )
            event = LoggedEvent(last + 1, "debate_done", data.model_dump_json()).stored()
            if result is not None:
                self.store.write(debate_id, result, [event], status="interrupted", error=INTERRUPTED)
            else:
                self.store.finish_without_result(debate_id, "interrupted", INTERRUPTED, [event])
            interrupted.append(debate_id)
        if requeued:
            log.warning("%d debate(s) still queued when the last run stopped are queued again", requeued)
        if left:
            log.warning(
                "%d debate(s) still queued were sent to an OpenAI route this server does not serve: they stay "
                "queued for moot serve on this store",
                left,
            )
        return interrupted

    def _not_served_here(self, debate_id: str) -> bool:
        """Whether a queued debate was a request, stored whole, to an OpenAI route that this server has
        no builder for (``moot mcp`` has no OpenAI door): it is left queued rather than ended, for a
        ``moot serve`` on the same store."""
        request = self.store.request(debate_id) or {}
        route = str(request.get("endpoint") or "/v1/chat/completions")
        return (
            bool(request.get("chat_completion"))
            and bool(request.get(DETACHED))
            and isinstance(request.get("request"), dict)
            and route not in self.rebuilders
        )

    def _requeue(self, stored: StoredDebate) -> str | None:
        """Queue again a debate that never started, from its stored request; else say why not."""
        request = self.store.request(stored.id) or {}
        # Either OpenAI route (each records the one it came from), unless its caller reads the result by
        # its id rather than on its connection (a background response: ``detached``).
        if request.get("chat_completion") and not request.get(DETACHED):
            route = str(request.get("endpoint") or "/v1/chat/completions")
            what = "a Responses API request" if route == "/v1/responses" else "a chat completion"
            return (
                f"{NEVER_STARTED}; it was {what}, whose caller's connection closed with the server, so it is not "
                f"run again: send the request to POST {route} again"
            )
        built = self.rebuild(stored.id, request)
        if isinstance(built, LiveDebate):
            self._start(built)
            return None
        sent_to = str(request.get("endpoint") or "/v1/chat/completions") if request.get("chat_completion") else None
        return redact(
            f"{NEVER_STARTED}, and this server cannot queue it again ({built}); submit it again "
            f"(POST {sent_to or '/v1/debates'})"
        )

    def rebuild(self, debate_id: str, request: dict[str, Any]) -> LiveDebate | str:
        """A stored debate, built again from its stored request by this server's models and limits
        (to queue it again at a restart, or to run one another replica queued or left): the
        :class:`LiveDebate`, or why it cannot be built here, in one line."""
        from moot.server.policy import RequestError, judge_of, prepare

        if request.get("chat_completion"):
            route = str(request.get("endpoint") or "/v1/chat/completions")
            rebuild = self.rebuilders.get(route)
            if rebuild is None or not isinstance(request.get("request"), dict):
                return (
                    f"it was sent to POST {route} by a moot that did not store such requests whole, so only the "
                    "replica that received it could run it"
                )
            try:
                return rebuild(debate_id, request)
            except ValidationError as exc:
                first = first_error(exc)
                why = f"{'.'.join(str(x) for x in first['loc'])}: {first['msg']}"
            except Exception as exc:  # a refusal (RequestError: its message) or a failure: said in one line
                why = str(getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}")
            return " ".join(redact(why, self.store.secrets).split())
        try:
            # Its Idempotency-Key's record (moot.server.state.idempotency) is kept beside the body, not in it.
            body = DebateRequest.model_validate({k: v for k, v in request.items() if k != "idempotency"})
            prepared = prepare(
                body.protocol,
                body.question,
                body.chunks(),
                body,
                self.settings,
                reference=body.reference,
                images=body.images,
            )
            asked = body.quality_request()
            judge = judge_of(asked, self.settings)
        except RequestError as exc:
            reason = exc.message
        except ValidationError as exc:
            first = first_error(exc)
            reason = f"{'.'.join(str(x) for x in first['loc'])}: {first['msg']}"
        except Exception as exc:  # this server cannot rebuild it: say so, and go on
            reason = f"{type(exc).__name__}: {exc}"
        else:
            return LiveDebate(
                id=debate_id,
                spec=prepared.spec,
                task=prepared.task,
                engine=prepared.engine,
                model=prepared.model,
                quality=asked is not None,
                judge=judge,
            )
        return " ".join(redact(reason, self.store.secrets).split())
