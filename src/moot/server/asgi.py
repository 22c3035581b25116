"""ASGI pieces the doors share: the HTTP door's request guard and the MCP door's ``/mcp`` mount both
read a request's body in full before the app does, then hand it on; the guard also decodes its JSON,
which every router's routes then read (:func:`api_router`) instead of decoding it again."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.routing import APIRoute
from starlette.types import Message, Receive

#: Where in the ASGI scope the request guard leaves the body's JSON, decoded and checked once.
DECODED_JSON = "moot.body_json"


def replayed(body: bytes, receive: Receive) -> Receive:
    """A receive channel that gives ``body`` (already read in full) as the request's one message,
    then the connection's own (its disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


class _Decoded(Request):
    """A request whose JSON is the one the guard decoded, when it did (else decoded here)."""

    async def json(self) -> Any:
        if DECODED_JSON in self.scope:
            return self.scope[DECODED_JSON]
        return await super().json()


class DecodedRoute(APIRoute):
    """A route whose body model is validated from the JSON the request guard decoded: a body is
    decoded once per request, not once by the guard and again by FastAPI (FastAPI's documented way to
    give a route a request class of its own)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def decoded(request: Request) -> Response:
            return await handler(_Decoded(request.scope, request.receive))

        return decoded


def api_router(**options: Any) -> APIRouter:
    """A router of the API's routes (:class:`DecodedRoute`)."""
    return APIRouter(route_class=DecodedRoute, **options)
