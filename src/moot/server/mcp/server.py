"""The MCP server itself: :class:`MootMCP`, the SDK's low-level server with moot's tools and resources.

The tools (``debate``, ``get_debate``, ``cancel_debate``, ``list_protocols``) run on the server's
debate manager, with no round loop of their own; the resources are a debate's transcript
(``moot://debates/{id}``) and the debate viewer as an MCP App. The Tasks of ``debate`` are
:mod:`~moot.server.mcp.tasks`'s, installed on the same server.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from importlib.resources import files
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.apps import APP_MIME_TYPE
from mcp.server.apps import EXTENSION_ID as APPS_EXTENSION
from mcp.shared.exceptions import MCPError

from moot._version import __version__
from moot.secrets import redact
from moot.server.mcp.progress import report_progress
from moot.server.mcp.results import (
    catalogue_text,
    cut,
    outcome_of,
    outcome_result,
    outcome_text,
    protocol_catalogue,
    tool_result,
)
from moot.server.mcp.tasks import TASK_TOOLS, Tasks, TaskServer
from moot.server.mcp.tools import (
    RESOURCE_PREFIX,
    TOOLS,
    DebateArgs,
    DebateIdArgs,
    DebateOutcome,
    NoArgs,
    ToolFailure,
    not_text,
    parse_args,
    schema_of,
    submit,
)
from moot.server.schemas import FINISHED
from moot.server.settings import ServerSettings
from moot.server.state.keyring import REQUEST_KEY
from moot.server.state.keys import ApiKey
from moot.server.state.manager import DebateManager

SERVER_NAME = "moot"
#: The debate viewer as an MCP App (the SDK's ``io.modelcontextprotocol/ui`` extension): the host
#: renders it beside a debate's call and hands it the result.
APP_URI = "ui://moot/debate.html"
RESOURCE_TEMPLATE = RESOURCE_PREFIX + "{debate_id}"
#: Debates ``resources/list`` names (the newest); any other is read by its URI all the same.
LISTED_DEBATES = 50

INSTRUCTIONS = (
    "moot runs a structured debate between several LLM agents on one question and returns the decision, "
    "how far the agents agreed, who dissented and why, and what it cost. Call `debate` with a question "
    "(and optionally a protocol from `list_protocols`, context passages and a budget); a debate takes "
    "seconds to minutes and reports progress per turn and round; a client that speaks MCP Tasks gets it as a "
    "task, whose id is the debate's. `get_debate` and `cancel_debate` take its id; its whole transcript is the "
    "resource moot://debates/{id}."
)


class MootMCP:
    """The tools and resources of one MCP server over a debate manager (``manager()``: the one the
    debates run in, looked up at each call: ``moot serve`` makes it when it starts)."""

    def __init__(self, settings: ServerSettings, manager: Callable[[], DebateManager]) -> None:
        self.settings = settings
        self.manager = manager
        #: The server is stopping: a call cut by that leaves its debate to the manager's shutdown,
        #: which stores it as interrupted (not as cancelled by its caller).
        self.stopping = False
        self.tasks = Tasks(settings, manager)
        self.server: Server[Any] = TaskServer(
            SERVER_NAME,
            version=__version__,
            title="moot: structured multi-agent debate",
            instructions=INSTRUCTIONS,
            get_tool_input_schema=self._input_schema,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_list_resources=self._list_resources,
            on_list_resource_templates=self._list_resource_templates,
            on_read_resource=self._read_resource,
        )
        self.server.extensions[APPS_EXTENSION] = {}
        self.tasks.install(self.server)

    def stop(self) -> None:
        """The server is stopping: its calls are about to be cut by that, not by their callers."""
        self.stopping = True

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """While the server serves: the task group of the tasks' notifications (2025-11-25)."""
        async with self.tasks.running():
            yield

    # ---------------------------------------------------------------------------- tools

    def _input_schema(self, name: str) -> dict[str, Any] | None:
        entry = TOOLS.get(name)
        return None if entry is None else schema_of(entry[0])

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(
            tools=[
                types.Tool(
                    name=name,
                    title=annotations.title,
                    description=description,
                    input_schema=schema_of(args),
                    output_schema=schema_of(output),
                    annotations=annotations,
                    execution=types.ToolExecution(task_support="optional" if name in TASK_TOOLS else "forbidden"),
                    _meta={"ui": {"resourceUri": APP_URI}} if output is DebateOutcome else None,
                )
                for name, (args, output, description, annotations) in TOOLS.items()
            ]
        )

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        name = params.name
        if name not in TOOLS:
            shown = repr(name) if not_text(name) is None else "(a name that is not text)"
            raise MCPError(
                code=types.INVALID_PARAMS, message=f"unknown tool {shown}; this server's tools are {', '.join(TOOLS)}"
            )
        try:
            if name == "debate":
                return await self.debate(parse_args(name, params.arguments, DebateArgs), ctx)
            if name == "list_protocols":
                parse_args(name, params.arguments, NoArgs)
                catalogue = protocol_catalogue(self.settings)
                return tool_result(catalogue, catalogue_text(catalogue))
            debate_id = parse_args(name, params.arguments, DebateIdArgs).debate_id
            outcome = await (self.get(debate_id) if name == "get_debate" else self.cancel(debate_id))
            return tool_result(outcome, outcome_text(outcome))
        except ToolFailure as exc:
            message = redact(str(exc), self.manager().store.secrets)
            return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True)

    async def debate(self, args: DebateArgs, ctx: ServerRequestContext[Any]) -> types.CallToolResult:
        manager = self.manager()
        # The store's API key of this HTTP request, as the server's key check put it in its scope: the
        # handler runs in the SDK's task for the MCP message, whose context is the SDK's to choose.
        scope = getattr(ctx.request, "scope", None)
        key = scope.get("moot.key") if isinstance(scope, dict) else None
        token = REQUEST_KEY.set(key if isinstance(key, ApiKey) else None)
        try:
            live = submit(self.settings, args, manager)
        finally:
            REQUEST_KEY.reset(token)
        if not args.wait:
            outcome = outcome_of(self.manager(), live.id)
            return tool_result(outcome, outcome_text(outcome))
        try:
            await report_progress(live, ctx.session.report_progress, queued=manager.waits_for_slot(live))
            await live.ended()
        except BaseException:
            # The call was cancelled (the client's cancellation, or its connection closed): so is the
            # debate, and its calls with it.
            if live.id in manager.live and not self.stopping:
                with anyio.CancelScope(shield=True):
                    await manager.cancel_local(live.id)
            elif live.fenced and not self.stopping:  # (another replica runs it now: cancelled there)
                with anyio.CancelScope(shield=True):
                    await manager.cancel_anywhere(live.id)
            raise
        return outcome_result(outcome_of(self.manager(), live.id))

    async def get(self, debate_id: str) -> DebateOutcome:
        return outcome_of(self.manager(), debate_id)

    async def cancel(self, debate_id: str) -> DebateOutcome:
        outcome = outcome_of(self.manager(), debate_id)
        if outcome.status in FINISHED:
            raise ToolFailure(f"cancel_debate: debate {debate_id} already ended ({outcome.status}); nothing to cancel")
        await self.manager().cancel_anywhere(debate_id)  # on whichever replica runs it
        return outcome_of(self.manager(), debate_id)

    # ------------------------------------------------------------------------ resources

    async def _list_resources(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        rows = self.manager().store.page(status=None, limit=LISTED_DEBATES, before=None)
        viewer = types.Resource(
            uri=APP_URI,
            name="debate viewer",
            title="moot's debate viewer",
            description="An MCP App that shows a debate's decision, agreement, dissent and cost",
            mime_type=APP_MIME_TYPE,
        )
        return types.ListResourcesResult(
            resources=[viewer]
            + [
                types.Resource(
                    uri=RESOURCE_PREFIX + row.id,
                    name=f"debate {row.id}",
                    title=cut(row.question, 80),
                    description=f"{row.protocol} debate, {row.status}: the transcript (moot.debate/1 JSON)",
                    mime_type="application/json",
                )
                for row in rows
            ]
        )

    async def _list_resource_templates(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(
            resource_templates=[
                types.ResourceTemplate(
                    uri_template=RESOURCE_TEMPLATE,
                    name="debate transcript",
                    title="A debate's transcript",
                    description="The whole transcript of a debate (moot.debate/1 JSON, as moot.load_result reads it), "
                    "partial while it runs",
                    mime_type="application/json",
                )
            ]
        )

    async def _read_resource(
        self, ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        uri = str(params.uri)
        if uri == APP_URI:
            html = (files("moot.server") / "static" / "mcp-app.html").read_text(encoding="utf-8")
            return types.ReadResourceResult(
                contents=[types.TextResourceContents(uri=uri, text=html, mime_type=APP_MIME_TYPE)]
            )
        debate_id = uri.removeprefix(RESOURCE_PREFIX)
        if not uri.startswith(RESOURCE_PREFIX) or not debate_id or "/" in debate_id:
            raise MCPError(
                code=types.INVALID_PARAMS,
                message=f"no resource {cut(repr(uri), 80)}: this server's resources are {RESOURCE_TEMPLATE} and "
                f"{APP_URI}",
                data={"uri": cut(uri, 200)},
            )
        manager = self.manager()
        row = manager.store.get(debate_id)
        if row is None:
            raise MCPError(
                code=types.INVALID_PARAMS,
                message=f"no debate {cut(repr(debate_id), 80)} on this server",
                data={"uri": cut(uri, 200)},
            )
        live = manager.live.get(debate_id)
        result = live.result if live is not None and live.result is not None else row.result
        if result is None:
            status = live.status if live is not None else row.status
            waiting = status in ("queued", "running")
            message = (
                f"debate {debate_id} has no transcript yet (it is {status}); read it once it starts"
                if waiting  # (one that ended before it started never will: say so, not "once it starts")
                else f"debate {debate_id} ended {status} before it started: it has no transcript"
            )
            raise MCPError(code=types.INVALID_PARAMS, message=message, data={"uri": uri})
        text = result.to_json(secrets=manager.store.secrets)
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=uri, text=text, mime_type="application/json")]
        )
