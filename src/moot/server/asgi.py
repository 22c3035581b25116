"""ASGI pieces the doors share: the HTTP door's request guard and the MCP door's ``/mcp`` mount both
read a request's body in full before the app does, then hand it on."""

from __future__ import annotations

from starlette.types import Message, Receive


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
