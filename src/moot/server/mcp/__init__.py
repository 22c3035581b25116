"""The debate as an MCP server (``moot mcp`` over stdio; ``moot serve``'s ``/mcp`` over streamable HTTP).

A thin adapter on the official ``mcp`` SDK's low-level :class:`mcp.server.Server`: four tools
(``debate``, ``get_debate``, ``cancel_debate``, ``list_protocols``) and a debate's transcript as the
resource ``moot://debates/{id}``. No round loop, no store and no statistics of its own: a request
is checked by the server's own policy (:func:`moot.server.policy.prepare`, the same limits as
``POST /v1/debates``), runs in a :class:`~moot.server.state.manager.DebateManager` and is kept in its
:class:`~moot.server.state.sqlite.SqliteStore` (``moot serve``'s file, or ``moot mcp``'s, in memory by
default). A debate's progress is its event log (a notification per finished turn and round), and
cancelling the call, or ``cancel_debate``, cancels the debate in the manager, which stops its calls.

The SDK speaks the 2026-07-28 revision (``server/discover``, no handshake) and, for hosts that have
not moved, the ``initialize`` handshake up to 2025-11-25. It carries the types of Tasks but does not
serve them, so they are served here, for ``debate`` (:mod:`.tasks`). Without tasks, a debate is a
long tool call with progress notifications, or, with ``wait: false``, a call that returns the
debate's id at once for ``get_debate`` to poll. Sampling is not used (deprecated).

The modules, lowest first (each imports only those above it in this list):

- :mod:`.tools`: the tools' typed arguments and results, their table, a call's arguments read and
  a ``debate`` checked by the server's policy and submitted;
- :mod:`.results`: a debate's outcome and the protocol catalogue as the tools return them;
- :mod:`.progress`: a debate's event log as progress notifications;
- :mod:`.tasks`: MCP Tasks (2025-11-25's and 2026-07-28's extension) for ``debate``;
- :mod:`.malformed`: the replies to messages the SDK's parser refuses without a useful reason;
- :mod:`.server`: :class:`MootMCP`, the SDK's server with the tools, the resources and the tasks;
- :mod:`.transports`: :class:`HttpMount` (``/mcp``) and :func:`serve_stdio` (``moot mcp``).
"""

from moot.server.mcp.malformed import unreadable
from moot.server.mcp.server import APP_URI, MootMCP
from moot.server.mcp.tasks import TASKS_EXTENSION
from moot.server.mcp.tools import DebateOutcome, inline_refs, not_text
from moot.server.mcp.transports import HttpMount, serve_stdio

__all__ = [
    "APP_URI",
    "TASKS_EXTENSION",
    "DebateOutcome",
    "HttpMount",
    "MootMCP",
    "inline_refs",
    "not_text",
    "serve_stdio",
    "unreadable",
]
