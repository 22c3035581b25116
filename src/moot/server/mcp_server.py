"""The debate as an MCP server (``moot mcp`` over stdio; ``moot serve``'s ``/mcp`` over streamable HTTP).

A thin adapter on the official ``mcp`` SDK's low-level :class:`mcp.server.Server`: four tools
(``debate``, ``get_debate``, ``cancel_debate``, ``list_protocols``) and a debate's transcript as the
resource ``moot://debates/{id}``. No round loop, no store and no statistics of its own: a request
is checked by the server's own policy (:func:`moot.server.policy.prepare`, the same limits as
``POST /v1/debates``), runs in a :class:`~moot.server.manager.DebateManager` and is kept in its
:class:`~moot.server.store.DebateStore` (``moot serve``'s file, or ``moot mcp``'s, in memory by
default). A debate's progress is its event log (a notification per finished turn and round), and
cancelling the call, or ``cancel_debate``, cancels the debate in the manager, which stops its calls.

The SDK speaks the 2026-07-28 revision (``server/discover``, no handshake) and, for hosts that have
not moved, the ``initialize`` handshake up to 2025-11-25. It carries the types of Tasks but does not
serve them, so they are served here, for ``debate``: a task's id is its debate's id, and its state is
the stored debate (it outlives the call, the HTTP request and the connection). On 2025-11-25 a
``tools/call`` with ``task`` returns a ``CreateTaskResult`` at once, and ``tasks/get``,
``tasks/result``, ``tasks/list`` and ``tasks/cancel`` follow it, with progress per turn and round and
``notifications/tasks/status`` when it ends. On 2026-07-28 a client that declares the Tasks extension
(``io.modelcontextprotocol/tasks``) in a request's capabilities gets a task (``resultType: "task"``)
for each ``debate``, polled and cancelled with ``tasks/get`` and ``tasks/cancel``. Without tasks, a
debate is a long tool call with progress notifications, or, with ``wait: false``, a call that returns
the debate's id at once for ``get_debate`` to poll. Sampling is not used (deprecated).
"""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import math
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from importlib.resources import files
from pathlib import Path
from typing import Any, Literal, Protocol, cast

import anyio
import mcp_types as types
from mcp.server import NotificationOptions, Server, ServerRequestContext
from mcp.server.apps import APP_MIME_TYPE
from mcp.server.apps import EXTENSION_ID as APPS_EXTENSION
from mcp.server.context import CallNext, HandlerResult
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from moot._version import __version__
from moot.core.answers import answer_of, confidence_of, normalize_answer
from moot.core.dynamics import compute_dynamics
from moot.core.types import DebateResult, Turn
from moot.protocols import get_preset, get_preset_factory, preset_names
from moot.protocols.refs import ProtocolRefError, parse_call, preset_params
from moot.secrets import redact, redact_json
from moot.server.openai.fields import tuned_names
from moot.server.policy import RequestError, prepare
from moot.server.schemas import FINISHED, BudgetOverrides, DebateRequest, RoundDoneData, ServerStatus, TurnDoneData
from moot.server.settings import ServerSettings, is_loopback
from moot.server.state import now
from moot.server.state.keyring import REQUEST_KEY
from moot.server.state.keys import ApiKey
from moot.server.state.manager import DebateManager, LiveDebate, QueueFull

SERVER_NAME = "moot"
#: The debate viewer as an MCP App (the SDK's ``io.modelcontextprotocol/ui`` extension): the host
#: renders it beside a debate's call and hands it the result.
APP_URI = "ui://moot/debate.html"
RESOURCE_PREFIX = "moot://debates/"
RESOURCE_TEMPLATE = RESOURCE_PREFIX + "{debate_id}"
DEFAULT_PROTOCOL = "affirmative-critical"
#: Debates ``resources/list`` names (the newest); any other is read by its URI all the same.
LISTED_DEBATES = 50
#: The longest reason of a dissenting agent that a result carries (the transcript has it whole).
REASON_CHARS = 400
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

INSTRUCTIONS = (
    "moot runs a structured debate between several LLM agents on one question and returns the decision, "
    "how far the agents agreed, who dissented and why, and what it cost. Call `debate` with a question "
    "(and optionally a protocol from `list_protocols`, context passages and a budget); a debate takes "
    "seconds to minutes and reports progress per turn and round; a client that speaks MCP Tasks gets it as a "
    "task, whose id is the debate's. `get_debate` and `cancel_debate` take its id; its whole transcript is the "
    "resource moot://debates/{id}."
)


# ----------------------------------------------------------------------------------- arguments


class Passage(BaseModel):
    """A context passage with where it came from."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, description="the passage's text")
    source: str | None = Field(default=None, description="where it came from (a file, a URL)")


class DebateBudget(BaseModel):
    """The budget of one debate (the names of ``POST /v1/debates``); each within the server's limits."""

    model_config = ConfigDict(extra="forbid")

    max_calls: int | None = Field(default=None, ge=1, description="most model calls of the whole debate")
    max_total_tokens: int | None = Field(
        default=None, ge=1, description="most tokens (prompt and completion) of the whole debate"
    )
    timeout_s: float | None = Field(default=None, gt=0, description="most seconds the debate may run")
    max_tokens_per_turn: int | None = Field(default=None, ge=1, description="most tokens of one agent's reply")


class DebateArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: str = Field(min_length=1, description="The question or claim to debate.")
    protocol: str = Field(
        default=DEFAULT_PROTOCOL,
        description="How the agents debate: a preset name from list_protocols (vote, mad, panel, ...), or a "
        "preset with parameters in one line: vote@5, mad(rounds=2), society-of-minds(agents=3,rounds=2); "
        "auto is the protocol moot tune chose, when the server has one.",
    )
    context: list[str | Passage] = Field(
        default_factory=list, description="Passages the agents debate over (retrieved documents, notes)."
    )
    budget: DebateBudget = Field(default_factory=DebateBudget, description="Caps on the debate's calls, tokens, time.")
    model: str | None = Field(
        default=None, description="One of the server's models (list_protocols names them); default: its first."
    )
    wait: bool = Field(
        default=True,
        description="true: the call returns when the debate ends (with progress per turn and round). false: it "
        "returns at once with the debate's id and status; poll get_debate (for hosts that cut long tool calls).",
    )


class DebateIdArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    debate_id: str = Field(min_length=1, description="The debate's id, as debate returned it.")


class NoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ------------------------------------------------------------------------------------- results


class Dissent(BaseModel):
    """An agent whose last answer is not the decision's."""

    speaker: str
    name: str
    answer: str
    confidence: float | None = None
    #: Its own reasoning, cut at a few hundred characters (the transcript has it whole).
    reason: str | None = None


class DebateOutcome(BaseModel):
    """What a debate decided, how, and at what cost (a partial picture while it runs)."""

    debate_id: str
    status: ServerStatus
    protocol: str
    question: str
    model: str
    answer: str | None = Field(default=None, description="the decision: the final answer (None until decided)")
    decision: dict[str, Any] | None = Field(default=None, description="how it was decided (votes, the judge's verdict)")
    agreement: float | None = Field(
        default=None,
        description="share of the agents whose last typed answer is the most common one (None: free-text turns)",
    )
    dissent: list[Dissent] = Field(default_factory=list, description="the agents whose last answer differs")
    confidence: float | None = Field(default=None, description="0 to 1; confidence_from says whose it is")
    confidence_from: str | None = None
    stop_reason: str | None = None
    error: str | None = None
    warnings: list[str] = Field(default_factory=list)
    rounds: int = 0
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tokens: int = 0
    cost_usd: float | None = Field(default=None, description="US dollars at the server's prices (None: unpriced)")
    unpriced: list[str] = Field(default_factory=list, description="models called that have no price")
    elapsed_s: float = 0.0
    transcript: str = Field(description="the resource of the whole transcript (moot.debate/1 JSON)")


class ProtocolEntry(BaseModel):
    name: str
    description: str
    #: Model calls of a full run (rounds x speakers + the decision), before repairs and early stops.
    calls: int
    rounds: int
    participants: list[str]
    decision: str
    #: The preset's parameters and their defaults, for the one-line form ``name(key=value, ...)``.
    parameters: dict[str, Any] = Field(default_factory=dict)
    #: For the protocol ``moot tune`` chose (``auto``): the evidence it wrote, and in one line.
    tuned: dict[str, Any] | None = None
    evidence: str | None = None


class ProtocolCatalogue(BaseModel):
    protocols: list[ProtocolEntry]
    models: list[str] = Field(description="the models a debate may name; the first is the default")
    default_protocol: str = DEFAULT_PROTOCOL


# --------------------------------------------------------------------------------------- tools


def inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """A pydantic schema with its ``$defs`` written in place (the models here are not recursive):
    hosts and models read a flat schema more reliably than one with references."""
    defs: dict[str, Any] = schema.get("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return walk({**defs[ref.rsplit("/", 1)[-1]], **{k: v for k, v in node.items() if k != "$ref"}})
            return {k: walk(v) for k, v in node.items() if k != "$defs"}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    out: dict[str, Any] = walk(schema)
    return out


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    return inline_refs(model.model_json_schema())


TOOLS: dict[str, tuple[type[BaseModel], type[BaseModel], str, types.ToolAnnotations]] = {
    "debate": (
        DebateArgs,
        DebateOutcome,
        "Run a structured debate between LLM agents on a question and return the decision: the answer, the "
        "agents' agreement, the dissenting agents' answers and reasons, a confidence, and the calls, tokens "
        "and cost it took. Progress is reported per turn and round; cancelling the call stops the debate. It may "
        "run as an MCP Task (tasks/get, tasks/cancel), whose id is the debate's.",
        types.ToolAnnotations(
            title="Debate a question", read_only_hint=False, destructive_hint=False, idempotent_hint=False
        ),
    ),
    "get_debate": (
        DebateIdArgs,
        DebateOutcome,
        "The status and result of a debate by its id (partial while it runs).",
        types.ToolAnnotations(title="Get a debate", read_only_hint=True, idempotent_hint=True),
    ),
    "cancel_debate": (
        DebateIdArgs,
        DebateOutcome,
        "Stop a queued or running debate; it keeps the transcript of what was finished.",
        types.ToolAnnotations(title="Cancel a debate", read_only_hint=False, destructive_hint=True),
    ),
    "list_protocols": (
        NoArgs,
        ProtocolCatalogue,
        "The debate protocols: what each does, its model calls per debate, its parameters, and the evidence "
        "behind the tuned one (auto) when the server has one; and the models a debate may use.",
        types.ToolAnnotations(title="List the protocols", read_only_hint=True, idempotent_hint=True),
    ),
}


class ToolFailure(Exception):
    """A tool call that cannot be done: its one-line reason reaches the caller as an error result."""


def _first_error(exc: ValidationError, tool: str) -> str:
    first = exc.errors()[0]
    where = ".".join(str(x) for x in first["loc"] if not ((isinstance(x, str) and x[:1].isupper()) or x == "str"))
    kind, msg = first["type"], first["msg"]
    if kind == "extra_forbidden":
        return f"{tool}: {where}: unknown argument; remove it or check its spelling (see the tool's input schema)"
    if kind == "missing":
        return f"{tool}: {where}: required; add it"
    msg = msg.removeprefix("Value error, ")
    return f"{tool}: {where}: {msg}" if where else f"{tool}: {msg}"


def lone_surrogate(value: Any, where: str = "") -> str | None:
    """The argument that holds a lone UTF-16 surrogate (text no model can be sent), or None."""
    if isinstance(value, str):
        for ch in value:
            if 0xD800 <= ord(ch) <= 0xDFFF:
                code = f"U+{ord(ch):04X}"
                return f"{where or 'argument'}: holds a lone surrogate ({code}), which is not text; send valid UTF-8"
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            found = lone_surrogate(str(key), where) or lone_surrogate(item, f"{where}.{key}" if where else str(key))
            if found is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = lone_surrogate(item, f"{where}[{i}]")
            if found is not None:
                return found
    return None


def _parse(tool: str, arguments: Mapping[str, Any] | None, model: type[BaseModel]) -> Any:
    raw = dict(arguments or {})
    problem = lone_surrogate(raw)
    if problem is not None:
        raise ToolFailure(f"{tool}: {problem}")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise ToolFailure(_first_error(exc, tool)) from None


#: Where a refusal of the server's policy names a field that the debate tool holds elsewhere.
_RENAMED = {"with": "protocol", "rounds": "protocol", "protocol": "protocol", "question": "question"}
_RENAMED |= {"context": "context", "budget": "budget", "model": "model", "models": "model"}


def _refusal(exc: RequestError) -> str:
    message = exc.renamed(_RENAMED, "arguments").message
    return message.replace("GET /v1/protocols", "list_protocols").replace("GET /v1/models", "list_protocols")


# ---------------------------------------------------------------------------------- the server


class MootMCP:
    """The tools and resources of one MCP server over a debate manager (``manager()``: the one the
    debates run in, looked up at each call: ``moot serve`` makes it when it starts)."""

    def __init__(self, settings: ServerSettings, manager: Callable[[], DebateManager]) -> None:
        self.settings = settings
        self.manager = manager
        #: The server is stopping: a call cut by that leaves its debate to the manager's shutdown,
        #: which stores it as interrupted (not as cancelled by its caller).
        self.stopping = False
        #: Where a task's notifications are sent from once its call has returned (2025-11-25):
        #: open while ``running()`` is (None: the task is polled, without notifications).
        self.background: anyio.abc.TaskGroup | None = None
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
        # Tasks (the SDK has their types only): a tools/call with ``task`` (2025-11-25) is answered
        # before the SDK's own shape check, which knows CallToolResult only; the tasks/* methods.
        self.server.middleware.append(self._task_call)
        # Their params are checked here, not by the SDK, whose refusal names nothing.
        self.server.add_request_handler("tasks/get", TaskParams, self._tasks_get)
        self.server.add_request_handler("tasks/result", TaskParams, self._tasks_result)
        self.server.add_request_handler("tasks/cancel", TaskParams, self._tasks_cancel)
        self.server.add_request_handler("tasks/list", TaskParams, self._tasks_list)

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

    # ---------------------------------------------------------------------------- tools

    def _input_schema(self, name: str) -> dict[str, Any] | None:
        entry = TOOLS.get(name)
        return None if entry is None else _schema(entry[0])

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(
            tools=[
                types.Tool(
                    name=name,
                    title=annotations.title,
                    description=description,
                    input_schema=_schema(args),
                    output_schema=_schema(output),
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
            shown = repr(name) if lone_surrogate(name) is None else "(a name that is not text)"
            raise MCPError(
                code=types.INVALID_PARAMS, message=f"unknown tool {shown}; this server's tools are {', '.join(TOOLS)}"
            )
        try:
            if name == "debate":
                return await self.debate(_parse(name, params.arguments, DebateArgs), ctx)
            if name == "list_protocols":
                _parse(name, params.arguments, NoArgs)
                catalogue = self.protocols()
                return _result(catalogue, _catalogue_text(catalogue))
            debate_id = _parse(name, params.arguments, DebateIdArgs).debate_id
            outcome = await (self.get(debate_id) if name == "get_debate" else self.cancel(debate_id))
            return _result(outcome, outcome_text(outcome))
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
            live = self.submit(args, manager)
        finally:
            REQUEST_KEY.reset(token)
        if not args.wait:
            outcome = self.outcome(live.id)
            return _result(outcome, outcome_text(outcome))
        try:
            await _report(live, ctx.session.report_progress)
            await live.done.wait()
        except BaseException:
            # The call was cancelled (the client's cancellation, or its connection closed): so is the
            # debate, and its calls with it.
            if live.id in manager.live and not self.stopping:
                with anyio.CancelScope(shield=True):
                    await manager.cancel(live.id)
            raise
        return _outcome_result(self.outcome(live.id))

    def submit(self, args: DebateArgs, manager: DebateManager) -> LiveDebate:
        """The debate a call asks for, checked as ``POST /v1/debates`` is, and queued; a refusal is a
        :class:`ToolFailure` in one line, before any model call."""
        protocol, with_ = self._protocol(args.protocol)
        context = [c if isinstance(c, str) else c.model_dump(exclude_none=True) for c in args.context]
        try:
            body = DebateRequest.model_validate(
                {
                    "protocol": protocol,
                    "with": with_,
                    "question": args.question,
                    "context": context,
                    "budget": BudgetOverrides.model_validate(args.budget.model_dump()),
                    "model": args.model,
                }
            )
            prepared = prepare(body.protocol, body.question, body.chunks(), body, self.settings)
            # Stored as POST /v1/debates would store it: one still queued when the server stops is
            # queued again at its next start (DebateManager.recover), and get_debate finds it.
            record = body.model_dump(mode="json", by_alias=True)
            return manager.submit(prepared.spec, prepared.task, prepared.engine, prepared.model, record)
        except ValidationError as exc:
            raise ToolFailure(_first_error(exc, "debate")) from None
        except RequestError as exc:
            raise ToolFailure(f"debate: {_refusal(exc)}") from None
        except QueueFull as exc:
            raise ToolFailure(f"debate: {exc} (in about {exc.retry_after} s)") from None

    def _protocol(self, text: str) -> tuple[str | dict[str, Any], dict[str, Any]]:
        """A preset's name and parameters from the one-line form; the tuned protocol's inline spec."""
        text = text.strip()
        tuned = self.settings.tuned
        if tuned is not None and text in tuned_names(tuned):
            return tuned.spec_data(), {}
        offered = ", ".join([*(tuned_names(tuned) if tuned is not None else ()), *preset_names()])
        try:
            call = parse_call(text)
            if call.at in ("uab", "auto"):
                raise ProtocolRefError(
                    f"{text!r} is a run-level vote (moot batch, moot eval); a debate is one question: use a fixed "
                    "vote such as vote@5"
                )
            if call.name not in preset_names():
                hint = " (auto is the protocol moot tune chose: serve one with --tuned)" if call.name == "auto" else ""
                raise ProtocolRefError(f"no protocol {call.name!r}{hint}; use one of {offered} (list_protocols)")
            return call.name, preset_params(call, text)
        except ProtocolRefError as exc:
            raise ToolFailure(f"debate: protocol: {exc}") from None

    async def get(self, debate_id: str) -> DebateOutcome:
        return self.outcome(debate_id)

    async def cancel(self, debate_id: str) -> DebateOutcome:
        outcome = self.outcome(debate_id)
        if outcome.status in FINISHED:
            raise ToolFailure(f"cancel_debate: debate {debate_id} already ended ({outcome.status}); nothing to cancel")
        await self.manager().cancel(debate_id)
        return self.outcome(debate_id)

    def protocols(self) -> ProtocolCatalogue:
        entries = []
        tuned = self.settings.tuned
        if tuned is not None:
            from moot.protocols.loader import load_protocol_data

            spec, _ = load_protocol_data(tuned.spec_data(), Path(tuned.path))
            evidence = json.loads(tuned.evidence.model_dump_json())
            for name in tuned_names(tuned):
                entries.append(_entry(name, spec, {}, evidence=evidence, line=tuned.summary()))
        for name in preset_names():
            parameters = {
                k: _plain(p.default)
                for k, p in inspect.signature(get_preset_factory(name)).parameters.items()
                if p.default is not inspect.Parameter.empty
            }
            entries.append(_entry(name, get_preset(name), parameters))
        return ProtocolCatalogue(protocols=entries, models=list(self.settings.models))

    # ------------------------------------------------------------------------ outcomes

    def outcome(self, debate_id: str) -> DebateOutcome:
        manager = self.manager()
        row = manager.store.get(debate_id)
        if row is None:
            raise ToolFailure(f"no debate {debate_id!r} on this server; debate returns the id of each one it starts")
        live = manager.live.get(debate_id)
        status = live.status if live is not None else cast(ServerStatus, row.status)
        result = live.result if live is not None and live.result is not None else row.result
        outcome = DebateOutcome(
            debate_id=debate_id,
            status=status,
            protocol=row.protocol,
            question=row.question,
            model=row.model,
            error=row.error,
            transcript=RESOURCE_PREFIX + debate_id,
        )
        if result is not None:
            _fill(outcome, result)
            if outcome.status in ("cancelled", "interrupted") and row.error:
                outcome.error = row.error
        # Redacted as the store and the /v1 routes redact what they give back: a running debate's
        # transcript is read from memory, before the store's redaction.
        return DebateOutcome.model_validate_json(redact_json(outcome.model_dump_json(), manager.store.secrets))

    # ---------------------------------------------------------------------------- tasks

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
                message=f"{method}: no task {_cut(debate_id, 80)!r} on this server; a task's id is the one "
                "its tools/call returned",
            )
        live = manager.live.get(debate_id)
        status = live.status if live is not None else row.status
        state = _task_status(status, modern=modern)
        outcome = None
        if state == "working":
            message = _last_progress(manager, debate_id) or f"debate {debate_id} {status}"
            updated = row.created_at
        else:
            outcome = self.outcome(debate_id)
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
            view["result"] = _outcome_result(outcome).model_dump(by_alias=True, mode="json", exclude_none=True)
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
            shown = repr(name) if isinstance(name, str) and lone_surrogate(name) is None else "(not a tool name)"
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
            ttl is None or (isinstance(ttl, int) and not isinstance(ttl, bool) and ttl >= 0)
        ):
            shown = _cut(json.dumps(ttl if isinstance(task, Mapping) else task), 40)
            what = "task.ttl" if isinstance(task, Mapping) else "task"
            raise MCPError(
                code=types.INVALID_PARAMS,
                message=f'tools/call: {what}: {shown} is not a task\'s metadata; send "task": {{"ttl": '
                "<whole milliseconds, 0 or more>}, or leave ttl out",
            )
        secrets = self.manager().store.secrets
        try:
            if arguments is not None and not isinstance(arguments, Mapping):
                raise ToolFailure(f"{name}: arguments: must be an object (see the tool's input schema)")
            live = self.submit(_parse(name, arguments, DebateArgs), self.manager())
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
            args = _parse("debate", arguments, DebateArgs)
            if not args.wait:
                return await call_next(ctx)
            live = self.submit(args, self.manager())
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
            await _report(live, send)
            await live.done.wait()
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
            if row is None or row.status in FINISHED:
                break
            await anyio.sleep(POLL_MS / 1000)  # running elsewhere (another replica): the store tells
        result = _outcome_result(self.outcome(task_id))
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
        await self.manager().cancel(task_id)
        view = self.task_view(task_id, modern=modern, detailed=False, method="tasks/cancel")
        if view["status"] == "working":
            raise MCPError(
                code=types.INTERNAL_ERROR,
                message=f"tasks/cancel: task {task_id} runs where this server cannot stop it; retry",
            )
        return {} if modern else view

    async def _tasks_list(self, ctx: ServerRequestContext[Any], params: TaskParams) -> dict[str, Any]:
        """2025-11-25: the tasks, newest first (each debate is one), a page at a time."""
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            raise MCPError(
                code=types.METHOD_NOT_FOUND, message="tasks/list is 2025-11-25's; 2026-07-28's Tasks have no list"
            )
        cursor = params.cursor
        if cursor is not None and not (isinstance(cursor, str) and cursor.isascii() and cursor.isdigit()):
            raise MCPError(
                code=types.INVALID_PARAMS,
                message=f"tasks/list: cursor {_cut(json.dumps(cursor), 40)} is not one this server gave; "
                "start again without a cursor",
            )
        rows = self.manager().store.page(
            status=None, limit=TASKS_PAGE, before=int(cursor) if cursor is not None else None
        )
        listed: dict[str, Any] = {"tasks": [self.task_view(r.id, modern=False, detailed=True) for r in rows]}
        if len(rows) == TASKS_PAGE:
            listed["nextCursor"] = str(rows[-1].seq)
        return listed

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
                    title=_cut(row.question, 80),
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
                message=f"no resource {uri!r}: this server's resources are {RESOURCE_TEMPLATE} and {APP_URI}",
                data={"uri": uri},
            )
        manager = self.manager()
        row = manager.store.get(debate_id)
        if row is None:
            raise MCPError(
                code=types.INVALID_PARAMS, message=f"no debate {debate_id!r} on this server", data={"uri": uri}
            )
        live = manager.live.get(debate_id)
        result = live.result if live is not None and live.result is not None else row.result
        if result is None:
            raise MCPError(
                code=types.INVALID_PARAMS,
                message=f"debate {debate_id} has no transcript yet (it is {row.status}); read it once it starts",
                data={"uri": uri},
            )
        text = result.to_json(secrets=manager.store.secrets)
        return types.ReadResourceResult(
            contents=[types.TextResourceContents(uri=uri, text=text, mime_type="application/json")]
        )


# -------------------------------------------------------------------------------- the outcome


def _result(model: BaseModel, text: str, *, error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=model.model_dump(mode="json"),
        is_error=error,
    )


def _outcome_result(outcome: DebateOutcome) -> types.CallToolResult:
    """What ``debate`` returns for a debate that ended (an error result unless it is complete)."""
    return _result(outcome, outcome_text(outcome), error=outcome.status != "complete")


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
        return f"complete: answered {_cut(outcome.answer or '', 200)!r}{agreed} ({outcome.calls} calls)"
    why = outcome.error or outcome.stop_reason or "no decision"
    return f"{outcome.status}: {_cut(why, 300)} ({outcome.calls} calls)"


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


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return str(value)


def _entry(
    name: str,
    spec: Any,
    parameters: dict[str, Any],
    *,
    evidence: dict[str, Any] | None = None,
    line: str | None = None,
) -> ProtocolEntry:
    return ProtocolEntry(
        name=name,
        description=line or spec.description or name,
        calls=spec.planned_calls(),
        rounds=spec.rounds,
        participants=[p.persona.name for p in spec.participants],
        decision=spec.decision.kind,
        parameters=parameters,
        tuned=evidence,
        evidence=line,
    )


def _cut(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _reason(turn: Turn) -> str | None:
    parsed = turn.parsed or {}
    for key in ("reasoning", "rationale", "reason", "message", "content"):
        value = parsed.get(key)
        if isinstance(value, str) and value.strip():
            return _cut(value, REASON_CHARS)
    return None


def _fill(outcome: DebateOutcome, result: DebateResult) -> None:
    """The decision, its agreement, dissent and confidence, and the totals, from a transcript."""
    outcome.answer = result.final_answer
    outcome.decision = result.decision
    outcome.stop_reason = result.stop_reason
    outcome.error = result.error or outcome.error
    outcome.warnings = list(result.warnings)
    outcome.rounds = len(result.rounds)
    outcome.calls = result.llm_calls
    outcome.prompt_tokens = result.usage.prompt_tokens
    outcome.completion_tokens = result.usage.completion_tokens
    outcome.tokens = result.usage.total_tokens
    outcome.elapsed_s = round(result.elapsed_s, 3)
    if result.cost is not None:
        outcome.cost_usd = result.cost.usd
        outcome.unpriced = list(result.cost.unpriced)
    if not result.rounds:
        return
    dynamics = result.dynamics if result.dynamics is not None and result.dynamics.rounds else compute_dynamics(result)
    # The last round; while a debate runs, the last whole one (the one under way has only some turns).
    rnd = result.rounds[-1]
    if result.status == "running" and len(result.rounds) > 1 and len(rnd.turns) < len(result.rounds[-2].turns):
        rnd = result.rounds[-2]
    last = next((r for r in dynamics.rounds if r.round == rnd.index), None)
    if last is not None:
        outcome.agreement = last.agreement
    decided = normalize_answer(result.final_answer)
    against = decided if decided is not None else (last.majority if last is not None else None)
    turns = [t for t in rnd.turns if t.kind == "debate"]
    if against is not None:
        for turn in turns:
            answer = answer_of(turn)
            if answer is None or answer == against:
                continue
            raw = (turn.parsed or {}).get("answer")
            outcome.dissent.append(
                Dissent(
                    speaker=turn.speaker,
                    name=turn.name,
                    answer=str(raw if raw is not None else answer),
                    confidence=confidence_of(turn),
                    reason=_reason(turn),
                )
            )
    stated = (result.decision or {}).get("confidence")
    if isinstance(stated, int | float) and not isinstance(stated, bool) and math.isfinite(stated):
        outcome.confidence, outcome.confidence_from = round(float(stated), 4), "the decision"
    elif decided is not None:
        held = [c for t in turns if answer_of(t) == decided and (c := confidence_of(t)) is not None]
        if held:
            outcome.confidence = round(sum(held) / len(held), 4)
            outcome.confidence_from = f"the stated confidence of the {len(held)} agent(s) that gave the answer (mean)"


def outcome_text(o: DebateOutcome) -> str:
    """The outcome in a few lines, for a host that shows text (the structured content has it all)."""
    head = f"Debate {o.debate_id} ({o.protocol}): {o.status}"
    lines = []
    if o.answer is not None:
        lines.append(f"{head}. Answer: {_cut(o.answer, 2000)}")
    else:
        lines.append(f"{head}." + (f" {o.error}" if o.error else ""))
    facts = []
    if o.agreement is not None:
        facts.append(f"agreement {o.agreement:.2f}")
    if o.confidence is not None:
        facts.append(f"confidence {o.confidence:.2f}")
    if facts:
        lines.append("; ".join(facts).capitalize() + ".")
    for d in o.dissent:
        why = f": {_cut(d.reason, 200)}" if d.reason else ""
        lines.append(f"Dissent: {d.name} answered {_cut(d.answer, 120)!r}{why}")
    if o.cost_usd is None or o.cost_usd == 0:
        money = "" if o.cost_usd is None else ", $0"
    else:
        money = f", ${o.cost_usd:.6f}" if o.cost_usd < 0.01 else f", ${o.cost_usd:.4f}"
    lines.append(f"{o.rounds} round(s), {o.calls} calls, {o.tokens} tokens{money}, {o.elapsed_s:.1f} s.")
    lines.append(f"Transcript: {o.transcript}")
    return "\n".join(lines)


def _catalogue_text(c: ProtocolCatalogue) -> str:
    lines = [f"{p.name}: {p.calls} calls; {_cut(p.description, 160)}" for p in c.protocols]
    lines.append(f"models: {', '.join(c.models)} (the first is the default); default protocol: {c.default_protocol}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ progress


def _progress_line(name: str, data: str) -> str | None:
    """A progress message for a logged event: each finished turn and round (None: not progress)."""
    if name == "turn_done":
        turn = TurnDoneData.model_validate_json(data).turn
        said = (turn.parsed or {}).get("answer") if turn.parsed else None
        if turn.error:
            what = f"failed ({_cut(turn.error, 120)})"
        elif said is not None:
            what = f"answered {_cut(str(said), 80)!r}"
        else:
            what = "spoke" if turn.kind == "debate" else "decided"
        where = "the decision" if turn.kind == "decision" else f"round {turn.round}"
        return f"{where}: {turn.name} {what}"
    if name == "round_done":
        rd = RoundDoneData.model_validate_json(data)
        line = f"round {rd.round} done"
        if rd.majority is not None and rd.agreement is not None:
            line += f": majority {_cut(rd.majority, 80)!r}, agreement {rd.agreement:.2f}"
        return line
    return None


Progress = Callable[[float, float | None, str | None], Awaitable[None]]


async def _report(live: LiveDebate, send: Progress) -> None:
    """A progress notification per finished turn and round of the debate, until it ends (``send``:
    the call's own, which sends nothing when the caller asked for no progress)."""
    total = float(live.spec.planned_calls() + live.spec.rounds_to_run())
    done = 0.0
    with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
        await send(0.0, total, f"debate {live.id} started ({live.spec.name})")
    async for event in live.log.follow(0):
        line = _progress_line(event.name, event.data)
        if line is None:
            continue
        done += 1
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            await send(done, max(total, done), line)


def _last_progress(manager: DebateManager, debate_id: str) -> str | None:
    """The debate's latest progress line (its last finished turn or round), for a task's status."""
    log = manager.log_of(debate_id)
    for event in reversed(log.events if log is not None else []):
        line = _progress_line(event.name, event.data)
        if line is not None:
            return line
    return None


# ------------------------------------------------------------------ messages the SDK cannot read

#: :func:`unreadable`'s answer for a message the SDK reads itself.
PASS: Literal["pass"] = "pass"
Refusal = types.JSONRPCResponse | types.JSONRPCError


def _request_id(data: dict[str, Any]) -> types.RequestId | None:
    value = data.get("id")
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and lone_surrogate(value) is None:
        return value
    return None


def unreadable(text: str | bytes, *, not_json: bool) -> Refusal | Literal["pass"] | None:
    """The reply to a message the SDK's parser refuses, or :data:`PASS` for one it reads (None: a
    notification or a response, which gets no reply). Its parser refuses JSON whose text holds a lone
    UTF-16 surrogate (``"\\ud800"``) as if it were not JSON, and on stdio it then answers nothing,
    so a host would wait for the reply forever. Here a ``tools/call`` holding one gets the tool's own
    one-line error result, any other request the protocol's invalid-params error, both naming where
    it is; with ``not_json``, a line that is not JSON gets the protocol's parse error."""
    try:
        data = json.loads(text)
    except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
        if not not_json:
            return PASS
        reason = f"{exc.msg} at column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
        return types.JSONRPCError(
            jsonrpc="2.0",
            id=None,
            error=types.ErrorData(
                code=types.PARSE_ERROR,
                message=f"Parse error: the message is not JSON ({reason}); send one JSON-RPC message per line",
            ),
        )
    where = lone_surrogate(data)
    if where is None:
        return PASS
    if not isinstance(data, dict) or "method" not in data or "id" not in data:
        return None
    request_id = _request_id(data)
    params = data.get("params")
    if data["method"] == "tools/call" and isinstance(params, dict) and request_id is not None:
        problem = lone_surrogate(params.get("arguments"))
        name = params.get("name")
        rest = {k: v for k, v in params.items() if k != "arguments"}
        if problem is not None and isinstance(name, str) and lone_surrogate(rest) is None:
            result = types.CallToolResult(
                content=[types.TextContent(type="text", text=f"{name}: {problem}")], is_error=True
            )
            dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
            return types.JSONRPCResponse(jsonrpc="2.0", id=request_id, result=dumped)
    return types.JSONRPCError(
        jsonrpc="2.0", id=request_id, error=types.ErrorData(code=types.INVALID_PARAMS, message=where)
    )


class _Replies(Protocol):
    async def send(self, item: SessionMessage, /) -> None: ...


class StdinLines:
    """The lines the SDK's stdio transport reads: each one it could not read is answered here
    (:func:`unreadable`) and not passed on; the server goes on serving the next."""

    def __init__(self) -> None:
        raw = os.fdopen(os.dup(sys.stdin.fileno()), "rb")
        self.file = anyio.wrap_file(io.TextIOWrapper(raw, encoding="utf-8", errors="replace"))
        self.replies: _Replies | None = None
        self.ready = anyio.Event()

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[str]:
        await self.ready.wait()
        assert self.replies is not None
        try:
            async for line in self.file:
                if not line.strip():
                    continue
                reply = unreadable(line, not_json=True)
                if reply == PASS:
                    yield line
                elif isinstance(reply, types.JSONRPCResponse | types.JSONRPCError):
                    await self.replies.send(SessionMessage(reply))
        finally:
            await self.file.aclose()


# ---------------------------------------------------------------------------- transports


class HttpMount:
    """``moot serve``'s ``/mcp``: the SDK's streamable-HTTP session manager over the server's own
    debate manager, behind the server's key like every /v1 route. ``running()`` is entered for the
    app's lifetime (its lifespan)."""

    PATH = "/mcp"

    def __init__(self, settings: ServerSettings, manager: Callable[[], DebateManager]) -> None:
        self.mcp = MootMCP(settings, manager)
        # The SDK's own guard against DNS rebinding when the server listens on loopback (as its
        # streamable_http_app does): the Host, and any Origin, must be a loopback one.
        security = None
        if is_loopback(settings.host):
            security = TransportSecuritySettings(
                enable_dns_rebinding_protection=True,
                allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*", "127.0.0.1", "localhost", "[::1]"],
                allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
            )
        self.sessions = StreamableHTTPSessionManager(
            app=self.mcp.server, security_settings=security, max_request_body_size=settings.max_body_bytes
        )
        self.app = StreamableHTTPASGIApp(self.sessions)
        # An ASGI app (this object), not a function: Starlette would call a function with a request.
        self.route = Route(self.PATH, endpoint=self)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The SDK's endpoint, but a message its parser refuses without a useful reason (a lone
        surrogate: :func:`unreadable`) is answered here."""
        if scope["type"] == "http" and scope.get("method") == "POST":
            chunks: list[bytes] = []
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return  # the client went away
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    break
            body = b"".join(chunks)
            reply = unreadable(body, not_json=False)
            if reply != PASS:
                if reply is None:
                    await Response(status_code=202)(scope, receive, send)
                    return
                assert not isinstance(reply, str)
                status = 200 if isinstance(reply, types.JSONRPCResponse) else 400
                text = reply.model_dump_json(by_alias=True, exclude_unset=True)
                await Response(text, status_code=status, media_type="application/json")(scope, receive, send)
                return
            sent = False

            async def replay() -> Message:
                nonlocal sent
                if not sent:
                    sent = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            await self.app(scope, replay, send)
            return
        await self.app(scope, receive, send)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with self.sessions.run(), self.mcp.running():
            try:
                yield
            finally:
                self.mcp.stopping = True


async def serve_stdio(settings: ServerSettings, secrets: list[str] | None = None) -> None:
    """``moot mcp``: one MCP session over stdin and stdout, its debates in ``settings.db`` (by
    default in memory, for the session); those still running when the client goes are stored as
    interrupted."""
    from mcp.server.stdio import stdio_server

    from moot.server.state.sqlite import SqliteStore as DebateStore

    store = DebateStore(settings.db, secrets or [])
    manager = DebateManager(settings, store)
    manager.recover()
    mcp = MootMCP(settings, lambda: manager)
    lines = StdinLines()
    try:
        async with stdio_server(stdin=cast(Any, lines)) as (read, write), mcp.running():
            lines.replies = write
            lines.ready.set()
            await mcp.server.run(read, write, mcp.server.create_initialization_options())
    finally:
        await manager.shutdown()
        store.close()
