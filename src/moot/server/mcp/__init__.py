"""The debate as an MCP server (``moot mcp`` over stdio; ``moot serve``'s ``/mcp`` over streamable HTTP)."""

from moot.server.mcp.server import (
    APP_URI,
    TASKS_EXTENSION,
    DebateOutcome,
    HttpMount,
    MootMCP,
    inline_refs,
    lone_surrogate,
    serve_stdio,
    unreadable,
)

__all__ = [
    "APP_URI",
    "TASKS_EXTENSION",
    "DebateOutcome",
    "HttpMount",
    "MootMCP",
    "inline_refs",
    "lone_surrogate",
    "serve_stdio",
    "unreadable",
]
