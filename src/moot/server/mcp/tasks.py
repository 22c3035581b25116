"""MCP Tasks for ``debate``: served here, since the SDK carries their types but does not serve them.

A task's id is its debate's id, and its state is the stored debate (it outlives the call, the HTTP
request and the connection). On 2025-11-25 a ``tools/call`` with ``task`` returns a
``CreateTaskResult`` at once, and ``tasks/get``, ``tasks/result``, ``tasks/list`` and
``tasks/cancel`` follow it, with progress per turn and round and ``notifications/tasks/status``
when it ends. On 2026-07-28 a client that declares the Tasks extension (``io.modelcontextprotocol/
tasks``) in a request's capabilities gets a task (``resultType: "task"``) for each ``debate``,
polled and cancelled with ``tasks/get`` and ``tasks/cancel``. :class:`Tasks` holds the handlers
(installed on the server), :class:`TaskServer` advertises the capability of each revision.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Literal

import anyio
import mcp_types as types
from mcp.server import NotificationOptions, Server, ServerRequestContext
from mcp.server.context import CallNext, HandlerResult
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel

from moot.secrets import redact
from moot.server.bodies import MAX_INTEGER_DIGITS
from moot.server.mcp.progress import last_progress, report_progress
from moot.server.mcp.results import cut, outcome_of, outcome_result
from moot.server.mcp.tools import TOOLS, DebateArgs, DebateOutcome, ToolFailure, not_text, parse_args, submit
from moot.server.schemas import FINISHED
from moot.server.settings import ServerSettings
from moot.server.state import now
from moot.server.state.manager import DebateManager, LiveDebate

#: The Tasks extension of 2026-07-28 (2025-11-25 has Tasks in its core, as a capability).
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
#: Where a message names the task it belongs to (2025-11-25).
RELATED_TASK = "io.modelcontextprotocol/related-task"
#: The tools that may run as a task (execution.taskSupport "optional"); the others forbid it.
TASK_TOOLS = frozenset({"debate"})
#: The polling interval a task suggests, in milliseconds.
POLL_MS = 1000
#: Tasks per page of ``tasks/list``.
TASKS_PAGE = 50


class Tasks:
    """The Tasks of one server's ``debate`` (the SDK has their types only): a task's id is its
    debate's, and its state is the stored debate, in the manager's store (``manager()``)."""

    def __init__(self, settings: ServerSettings, manager: Callable[[], DebateManager]) -> None:
        self.settings = settings
        self.manager = manager
        #: Where a task's notifications are sent from once its call has returned (2025-11-25):
        #: open while ``running()`` is (None: the task is polled, without notifications).
        self.background: anyio.abc.TaskGroup | None = None

    def install(self, server: Server[Any]) -> None:
        """A tools/call with ``task`` (2025-11-25) is answered before the SDK's own shape check, which
        knows CallToolResult only; and the tasks/* methods."""
        server.middleware.append(self._task_call)
        # Their params are checked here, not by the SDK, whose refusal names nothing.
        server.add_request_handler("tasks/get", TaskParams, self._tasks_get)
        server.add_request_handler("tasks/result", TaskParams, self._tasks_result)
        server.add_request_handler("tasks/cancel", TaskParams, self._tasks_cancel)
        server.add_request_handler("tasks/list", TaskParams, self._tasks_list)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """While the server serves: the task group of the tasks' notifications (2025-11-25)."""
        async with anyio.create_task_group() as group:
            self.background = group
            try:
                yield
            finally:
                self.background = None
                group.cancel_scope.cancel()

    def task_view(self, debate_id: str, *, modern: bool, detailed: bool, method: str = "tasks/get") -> dict[str, Any]:
        """A debate as a task, on the wire of its revision: 2025-11-25's ``Task``, or 2026-07-28's
        (``ttlMs``, ``pollIntervalMs``; ``detailed``: with the result once it ended, as ``tasks/get``
        gives it; else the ``CreateTaskResult`` of a ``tools/call``). The store holds a task's state:
        it outlives the call, the HTTP request and the connection. Debates are kept, so no task
        expires (``ttl`` null); an unknown id is the protocol's invalid-params error."""
        manager = self.manager()
        row = manager.store.get(debate_id, with_result=False)
        if row is None:
            raise MCPError(
                code=types.INVALID_PARAMS,
                message=f"{method}: no task {cut(debate_id, 80)!r} on this server; a task's id is the one "
                "its tools/call returned",
            )
        live = manager.live.get(debate_id)
        status = live.status if live is not None else row.status
        state = _task_status(status, modern=modern)
        outcome = None
        if state == "working":
            message = last_progress(manager, debate_id) or f"debate {debate_id} {status}"
            log = manager.log_of(debate_id, from_store=False)  # (one running elsewhere: its start)
            if log is not None and log.updated_at is not None:  # its last turn, round or status here
                updated = datetime.fromtimestamp(log.updated_at, UTC).isoformat(timespec="milliseconds")
            else:  # queued, or running at another replica: when it started, if it did
                updated = row.started_at or row.created_at
        else:
            outcome = outcome_of(self.manager(), debate_id)
            message = _summary(outcome)
            updated = row.finished_at or now()
        message = redact(message, manager.store.secrets)
        if not modern:
            task = types.Task(
                task_id=debate_id,
                status=state,
                status_message=message,
                created_at=row.created_at,
                last_updated_at=updated,
                ttl=None,
                poll_interval=POLL_MS,
            )
            return task.model_dump(by_alias=True, mode="json", exclude_none=True) | {"ttl": None}
        view: dict[str, Any] = {
            "taskId": debate_id,
            "status": state,
            "statusMessage": message,
            "createdAt": row.created_at,
            "lastUpdatedAt": updated,
            "ttlMs": None,
            "pollIntervalMs": POLL_MS,
        }
        if not detailed:
            return {"resultType": "task", **view}
        if state == "completed" and outcome is not None:
            view["result"] = outcome_result(outcome).model_dump(by_alias=True, mode="json", exclude_none=True)
        return view

    def _tasks_revision(self, ctx: ServerRequestContext[Any], method: str) -> bool:
        """Whether the request is 2026-07-28's (whose client must declare the Tasks extension)."""
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return False
        if not _declares_tasks(ctx.params):
            raise MCPError(
                code=types.MISSING_REQUIRED_CLIENT_CAPABILITY,
                message=f"{method} needs the client capability {TASKS_EXTENSION}: declare it under "
                "clientCapabilities.extensions in the request's _meta",
                data={"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}},
            )
        return True

    async def _task_call(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        """A ``tools/call`` with ``task`` (2025-11-25): the debate is queued and its task returned at
        once; its progress and its end are notified from :attr:`background`. Any other message goes
        on to the SDK (which would refuse a ``CreateTaskResult`` as not a ``CallToolResult``)."""
        params = ctx.params
        if ctx.method != "tools/call" or ctx.request_id is None or not isinstance(params, Mapping):
            return await call_next(ctx)
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return await self._modern_task_call(ctx, params, call_next)
        if params.get("task") is None or ctx.session.client_params is None:
            return await call_next(ctx)  # no task; or before the handshake, which the SDK refuses
        name = params.get("name")
        if not isinstance(name, str) or name not in TOOLS:
            shown = repr(name) if isinstance(name, str) and not_text(name) is None else "(not a tool name)"
            raise MCPError(
                code=types.INVALID_PARAMS, message=f"unknown tool {shown}; this server's tools are {', '.join(TOOLS)}"
            )
        if name not in TASK_TOOLS:
            raise MCPError(
                code=types.METHOD_NOT_FOUND,
                message=f"tools/call: {name} does not run as a task (its execution.taskSupport is forbidden); "
                "call it without task",
            )
        task, arguments = params.get("task"), params.get("arguments")
        ttl = task.get("ttl") if isinstance(task, Mapping) else None
        if not isinstance(task, Mapping) or not (
            ttl is None
            or (isinstance(ttl, int) and not isinstance(ttl, bool) and ttl >= 0 and len(str(ttl)) <= MAX_INTEGER_DIGITS)
        ):  # (a number of more than 20 digits is refused, as on every route: a review sent 10**30)
            shown = cut(json.dumps(ttl if isinstance(task, Mapping) else task), 40)
            what = "task.ttl" if isinstance(task, Mapping) else "task"
            raise MCPError(
                code=types.INVALID_PARAMS,
                message=f'tools/call: {what}: {shown} is not a task\'s metadata; send "task": {{"ttl": '
                f"<whole milliseconds, 0 or more, at most {MAX_INTEGER_DIGITS} digits>}}, or leave ttl out",
            )
        secrets = self.manager().store.secrets
        try:
            if arguments is not None and not isinstance(arguments, Mapping):
                raise ToolFailure(f"{name}: arguments: must be an object (see the tool's input schema)")
            live = submit(self.settings, parse_args(name, arguments, DebateArgs), self.manager())
        except ToolFailure as exc:
            raise MCPError(code=types.INVALID_PARAMS, message=redact(str(exc), secrets)) from None
        meta = params.get("_meta")
        token = meta.get("progressToken") if isinstance(meta, Mapping) else None
        if self.background is not None:
            progress = token if isinstance(token, str | int) and not isinstance(token, bool) else None
            self.background.start_soon(self._notify_task, live, ctx.session, progress)
        created = {"task": self.task_view(live.id, modern=False, detailed=False)}
        note = f"Debate {live.id} runs as a task; its result comes with tasks/result (or get_debate)."
        return created | {"_meta": {"io.modelcontextprotocol/model-immediate-response": note}}

    async def _modern_task_call(
        self, ctx: ServerRequestContext[Any, Any], params: Mapping[str, Any], call_next: CallNext
    ) -> HandlerResult:
        """2026-07-28: a ``debate`` from a client that declares the Tasks extension is a task (the
        server decides, and a debate takes seconds to minutes); ``wait: false`` keeps its answer of
        the id at once, and arguments it refuses get the tool's error result, as without tasks."""
        arguments = params.get("arguments")
        if params.get("name") != "debate" or not _declares_tasks(params) or not isinstance(arguments, Mapping):
            return await call_next(ctx)
        try:
            args = parse_args("debate", arguments, DebateArgs)
            if not args.wait:
                return await call_next(ctx)
            live = submit(self.settings, args, self.manager())
        except ToolFailure:
            return await call_next(ctx)  # which refuses them in the same words
        return self.task_view(live.id, modern=True, detailed=False)

    async def _notify_task(self, live: LiveDebate, session: Any, token: types.ProgressToken | None) -> None:
        """A task's progress per turn and round (when its call asked for progress), then its status
        when it ends, each naming the task; sent on the connection, the call having returned. A
        client gone is no error: the task goes on, for the next to poll."""
        related = {RELATED_TASK: {"taskId": live.id}}

        async def send(done: float, total: float | None, message: str | None) -> None:
            if token is not None:
                params = types.ProgressNotificationParams(
                    progress_token=token, progress=done, total=total, message=message, _meta=related
                )
                await session.send_notification(types.ProgressNotification(params=params))

        try:
            await report_progress(live, send, queued=self.manager().waits_for_slot(live))
            await live.ended()
            view = self.task_view(live.id, modern=False, detailed=True)
            await session.send_notification(_TaskStatusNotification(params=view))
        except Exception:  # the client went away, or the connection closed: nothing to tell
            return

    async def _tasks_get(self, ctx: ServerRequestContext[Any], params: TaskParams) -> dict[str, Any]:
        modern = self._tasks_revision(ctx, "tasks/get")
        return self.task_view(params.id_for("tasks/get"), modern=modern, detailed=True)

    async def _tasks_result(self, ctx: ServerRequestContext[Any], params: TaskParams) -> dict[str, Any]:
        """2025-11-25: the task's ``CallToolResult``, as the call would have returned it, once it ends."""
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            raise MCPError(
                code=types.METHOD_NOT_FOUND,
                message="tasks/result is 2025-11-25's; on 2026-07-28 tasks/get gives a finished task's result",
            )
        manager = self.manager()
        task_id = params.id_for("tasks/result")
        self.task_view(task_id, modern=False, detailed=False, method="tasks/result")  # known?
        while True:
            live = manager.live.get(task_id)
            if live is not None:
                await live.done.wait()
            row = manager.store.get(task_id, with_result=False)
            # (or the server stops: a debate it leaves queued, for its next start, is answered as it is)
            if row is None or row.status in FINISHED or manager.stopping:
                break
            await anyio.sleep(POLL_MS / 1000)  # running elsewhere (another replica): the store tells
        result = outcome_result(outcome_of(self.manager(), task_id))
        result.meta = {RELATED_TASK: {"taskId": task_id}}
        return result.model_dump(by_alias=True, mode="json", exclude_none=True)

    async def _tasks_cancel(self, ctx: ServerRequestContext[Any], params: TaskParams) -> dict[str, Any]:
        """Cancels the debate (its calls stop; its transcript is kept, as cancelled). A task that has
        ended already: 2025-11-25's invalid-params error; 2026-07-28's extension answers every cancel
        with an empty result (the task's status, read with ``tasks/get``, says how it ended)."""
        modern = self._tasks_revision(ctx, "tasks/cancel")
        task_id = params.id_for("tasks/cancel")
        view = self.task_view(task_id, modern=modern, detailed=False, method="tasks/cancel")
        if view["status"] != "working" and modern:
            return {}
        if view["status"] != "working":
            raise MCPError(
                code=types.INVALID_PARAMS,
                message=f"tasks/cancel: task {task_id} already ended ({view['status']}); nothing to cancel",
            )
        await self.manager().cancel_anywhere(task_id)  # on whichever replica runs it
        view = self.task_view(task_id, modern=modern, detailed=False, method="tasks/cancel")
        if view["status"] == "working":
            raise MCPError(
                code=types.INTERNAL_ERROR,
                message=f"tasks/cancel: task {task_id} was asked to stop where it runs and has not stopped yet; "
                "read its status with tasks/get",
            )
        return {} if modern else view

    async def _tasks_list(self, ctx: ServerRequestContext[Any], params: TaskParams) -> dict[str, Any]:
        """2025-11-25: the tasks, newest first (each debate is one), a page at a time."""
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            raise MCPError(
                code=types.METHOD_NOT_FOUND, message="tasks/list is 2025-11-25's; 2026-07-28's Tasks have no list"
            )
        cursor = params.cursor
        # (a cursor this server gave is a row's sequence number: a few digits, never past SQLite's 64 bits)
        given = isinstance(cursor, str) and cursor.isascii() and cursor.isdigit() and len(cursor) <= 18
        if cursor is not None and not given:
            raise MCPError(
                code=types.INVALID_PARAMS,
                message=f"tasks/list: cursor {cut(json.dumps(cursor), 40)} is not one this server gave; "
                "start again without a cursor",
            )
        rows = self.manager().store.page(
            status=None, limit=TASKS_PAGE, before=int(cursor) if cursor is not None else None
        )
        listed: dict[str, Any] = {"tasks": [self.task_view(r.id, modern=False, detailed=True) for r in rows]}
        if len(rows) == TASKS_PAGE:
            listed["nextCursor"] = str(rows[-1].seq)
        return listed


def _task_status(status: str, *, modern: bool) -> types.TaskStatus:
    """A debate's status as its task's. A debate that ended without a decision is ``failed`` on
    2025-11-25 (a tool result with isError) and ``completed`` on 2026-07-28 (whose ``failed`` is a
    protocol error's only, and whose result has isError)."""
    if status in ("queued", "running"):
        return "working"
    if status == "complete":
        return "completed"
    if status == "cancelled":
        return "cancelled"
    return "completed" if modern else "failed"


def _summary(outcome: DebateOutcome) -> str:
    """A finished task's status message, in one line."""
    if outcome.status == "complete":
        agreed = f", agreement {outcome.agreement:.2f}" if outcome.agreement is not None else ""
        return f"complete: answered {cut(outcome.answer or '', 200)!r}{agreed} ({outcome.calls} calls)"
    why = outcome.error or outcome.stop_reason or "no decision"
    return f"{outcome.status}: {cut(why, 300)} ({outcome.calls} calls)"


def _declares_tasks(params: Any) -> bool:
    """Whether a 2026-07-28 request's capabilities (in its ``_meta``) declare the Tasks extension."""
    meta = params.get("_meta") if isinstance(params, Mapping) else None
    capabilities = meta.get(types.CLIENT_CAPABILITIES_META_KEY) if isinstance(meta, Mapping) else None
    extensions = capabilities.get("extensions") if isinstance(capabilities, Mapping) else None
    return isinstance(extensions, Mapping) and TASKS_EXTENSION in extensions


class TaskParams(types.RequestParams):
    """The params of ``tasks/*`` (``taskId``; ``tasks/list``'s ``cursor``), as sent: checked by
    :meth:`id_for` and ``tasks/list``, each refusal naming the field."""

    task_id: Any = None
    cursor: Any = None

    def id_for(self, method: str) -> str:
        if not isinstance(self.task_id, str) or not self.task_id:
            problem = "required; add it" if self.task_id is None else "must be a task's id (a string)"
            raise MCPError(
                code=types.INVALID_PARAMS,
                message=f"{method}: taskId: {problem}, as the task's tools/call returned it",
            )
        return self.task_id


class _TaskStatusNotification(BaseModel):
    """``notifications/tasks/status`` with its task as a plain mapping: the SDK drops null fields
    from a model it sends, and a task's ``ttl`` is null (it never expires)."""

    method: Literal["notifications/tasks/status"] = "notifications/tasks/status"
    params: dict[str, Any]


class TaskServer(Server[Any]):
    """The SDK's server, advertising Tasks: 2025-11-25's ``tasks`` capability (``tasks/list``,
    ``tasks/cancel``, task-augmented ``tools/call``) at the handshake, and 2026-07-28's extension in
    ``server/discover``."""

    def get_capabilities(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
        *,
        protocol_version: str | None = None,
    ) -> types.ServerCapabilities:
        modern = protocol_version in MODERN_PROTOCOL_VERSIONS
        if modern:
            extensions = {**(extensions if extensions is not None else self.extensions), TASKS_EXTENSION: {}}
        capabilities = super().get_capabilities(
            notification_options, experimental_capabilities, extensions, protocol_version=protocol_version
        )
        if not modern:
            capabilities.tasks = types.ServerTasksCapability(
                list=types.TasksListCapability(),
                cancel=types.TasksCancelCapability(),
                requests=types.ServerTasksRequestsCapability(
                    tools=types.TasksToolsCapability(call=types.TasksCallCapability())
                ),
            )
        return capabilities
