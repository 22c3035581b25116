"""The routes of stored responses (:mod:`moot.server.openai.responses_state`): ``GET`` and ``DELETE
/v1/responses/{id}``, its ``input_items``, and ``cancel``."""

from __future__ import annotations

import logging
from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from moot.server.asgi import api_router
from moot.server.limits import RequestError
from moot.server.openai.responses_replay import Replay, Watchers, current, replay
from moot.server.openai.responses_state import (
    SSE,
    DeletedResponse,
    ItemList,
    Kept,
    conversation,
    debate_of,
    kept_of,
    not_found,
    page,
)
from moot.server.state import Store, StoredDebate
from moot.server.state.base import EPHEMERAL
from moot.server.state.manager import DebateManager

log = logging.getLogger("moot.server")


def router(
    sse: SSE, watchers: Watchers, responses: dict[int | str, dict[str, Any]], response: type[BaseModel]
) -> APIRouter:
    """``GET``/``DELETE /v1/responses/{id}``, its ``input_items`` and ``cancel``; ``response``: the
    response object's model (:class:`moot.server.openai.response_objects.ResponseObject`), for the OpenAPI document."""
    api = api_router()

    def found(request: Request, response_id: str) -> tuple[DebateManager, str, StoredDebate, dict[str, Any], Kept]:
        manager: DebateManager = request.app.state.manager
        debate_id = debate_of(response_id)
        row = manager.store.get(debate_id) if debate_id is not None else None
        kept = kept_of(manager.store, debate_id) if debate_id is not None else None
        if debate_id is None or row is None or kept is None:
            raise not_found(response_id)
        return manager, debate_id, row, kept[0], kept[1]

    @api.get("/v1/responses/{response_id}", response_model=response, tags=["openai"], responses=responses)
    async def retrieve_response(
        request: Request,
        response_id: str,
        stream: bool = False,
        starting_after: int | None = Query(default=None, ge=0),
    ) -> Response:
        """A stored response as it is now (``stream=true``: its events, after ``starting_after``)."""
        manager, debate_id, row, _, kept = found(request, response_id)
        if stream:
            if not kept.background:
                raise RequestError(
                    f"stream: {response_id} was not made with background: true, and only a background response's "
                    "stream can be read again; retrieve it without stream",
                    param="stream",
                )
            events = replay(manager, watchers, debate_id, kept, starting_after)
            return sse(request, events, {"x-moot-debate-id": debate_id})
        if starting_after is not None:
            raise RequestError(
                "starting_after: only a stream starts after an event; add stream=true or leave starting_after out",
                param="starting_after",
            )
        if row.status not in ("queued", "running"):
            await watchers.settled(debate_id)
            row, _, kept = _again(manager.store, response_id, debate_id)
        live = manager.live.get(debate_id)
        now = current(row, kept, live)
        if live is not None and kept.trace:  # the trace so far: the turns of the rounds that ended
            so_far = Replay(debate_id, kept, kept.trace)
            for event in list(live.log.shown):
                if event.name not in EPHEMERAL:
                    so_far.of(event)
            now = {**now, "output": so_far.items}
        return JSONResponse(now)

    @api.delete("/v1/responses/{response_id}", response_model=DeletedResponse, tags=["openai"], responses=responses)
    async def delete_response(request: Request, response_id: str) -> JSONResponse:
        """Delete a stored response: its debate and events, for good (a running one is cancelled first)."""
        manager, debate_id, _, _, _ = found(request, response_id)
        if await manager.cancel_anywhere(debate_id) is None:  # on whichever replica runs it
            raise RequestError(
                f"{response_id} runs on another replica, which was asked to stop it and has not yet; send the "
                "delete again in a moment",
                status=409,
                code="still_running",
            )
        await watchers.settled(debate_id)
        manager.store.delete(debate_id)
        manager.forget(debate_id)
        return JSONResponse(DeletedResponse(id=response_id).model_dump(mode="json"))

    @api.get("/v1/responses/{response_id}/input_items", response_model=ItemList, tags=["openai"], responses=responses)
    async def list_input_items(
        request: Request,
        response_id: str,
        after: str | None = None,
        before: str | None = None,
        limit: int = Query(default=20, ge=1, le=100),
        order: Literal["asc", "desc"] = "desc",
    ) -> JSONResponse:
        """The items the response's debate read: the chain's conversation, then this request's input."""
        _, debate_id, _, _, kept = found(request, response_id)
        items = conversation(debate_id, kept)
        return JSONResponse(page(items, after=after, before=before, limit=limit, order=order))

    @api.post("/v1/responses/{response_id}/cancel", response_model=response, tags=["openai"], responses=responses)
    async def cancel_response(request: Request, response_id: str) -> JSONResponse:
        """Cancel a background response (one that ended already is returned as it is)."""
        manager, debate_id, _, _, kept = found(request, response_id)
        if not kept.background:
            raise RequestError(
                f"Cannot cancel a synchronous response: {response_id} was not made with background: true, and only "
                "a background response can be cancelled (this one ended with its request)",
                param="response_id",
            )
        await manager.cancel_anywhere(debate_id)  # on whichever replica runs it
        await watchers.settled(debate_id)
        row, _, kept = _again(manager.store, response_id, debate_id)
        return JSONResponse(current(row, kept, manager.live.get(debate_id)))

    return api


def _again(store: Store, response_id: str, debate_id: str) -> tuple[StoredDebate, dict[str, Any], Kept]:
    row = store.get(debate_id)
    found = kept_of(store, debate_id)
    if row is None or found is None:
        raise not_found(response_id)
    return row, found[0], found[1]
