"""A debate as an MCP Task (issue 41, item 1), driven by the official ``mcp`` SDK's own client over
stdio (``moot mcp``) and streamable HTTP (``moot serve``'s /mcp): 2025-11-25's Tasks (a ``tools/call``
with ``task``, then ``tasks/get``, ``tasks/result``, ``tasks/list``, ``tasks/cancel`` and
``notifications/tasks/status``) and 2026-07-28's Tasks extension (``io.modelcontextprotocol/tasks``:
a ``resultType: "task"`` result, ``tasks/get``, ``tasks/cancel``). The SDK carries the types of
Tasks only, so the requests are sent through the session with the ``mcp_types`` models."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import anyio
import pytest

pytest.importorskip("mcp", reason="the MCP server needs moot[mcp]")
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, NotificationBinding, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ConfigDict, Field, SecretStr
from pydantic.alias_generators import to_camel

import test_mcp as base
from moot.server import ServerSettings
from moot.server.mcp import TASKS_EXTENSION, DebateOutcome
from moot.testing.fake_openai import FakeOpenAIServer
from serving import ServerThread

HANG = base.HANG
QUESTION = base.QUESTION
LEGACY = [base.TRANSPORTS[1], base.TRANSPORTS[3]]
MODERN = [base.TRANSPORTS[0], base.TRANSPORTS[2]]
RELATED = "io.modelcontextprotocol/related-task"


# ------------------------------------------------------------------------------ the client's side


class Seen:
    """What the server sent beside the replies: progress and task status notifications."""

    def __init__(self) -> None:
        self.progress: list[types.ProgressNotificationParams] = []
        self.statuses: list[types.TaskStatusNotificationParams] = []
        self.ended = anyio.Event()

    async def on_message(self, message: Any) -> None:
        if isinstance(message, types.ProgressNotification):
            self.progress.append(message.params)

    async def on_status(self, params: types.TaskStatusNotificationParams) -> None:
        self.statuses.append(params)
        if params.status in ("completed", "failed", "cancelled"):
            self.ended.set()


class StatusWatch(ClientExtension):
    """Observes ``notifications/tasks/status`` (2025-11-25's, which the SDK's tables do not hold)."""

    identifier = "dev.moot.tests/task-status"

    def __init__(self, seen: Seen) -> None:
        self.seen = seen

    def notifications(self) -> Sequence[NotificationBinding[Any]]:
        method, status = "notifications/tasks/status", types.TaskStatusNotificationParams
        return [NotificationBinding(method=method, params_type=status, handler=self.seen.on_status)]


async def raw(client: Client, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """A request and its raw result, through the session's own stamping and dispatcher. Only for
    2025-11-25's task-augmented ``tools/call``: the SDK's typed ``send_request`` checks a
    ``tools/call`` result against ``CallToolResult`` alone at that revision, so the
    ``CreateTaskResult`` the spec gives back cannot pass through it."""
    session = client.session
    data: dict[str, Any] = {"method": method, "params": params}
    opts: dict[str, Any] = {}
    session._stamp(data, opts)  # type: ignore[arg-type]
    result: dict[str, Any] = await session._dispatcher.send_raw_request(method, data["params"], opts)  # type: ignore[arg-type]
    return result


async def create(client: Client, arguments: dict[str, Any], *, name: str = "debate", **task: Any) -> types.Task:
    params = {"name": name, "arguments": arguments, "task": task or {"ttl": 60000}, "_meta": {"progressToken": "p1"}}
    created = types.CreateTaskResult.model_validate(await raw(client, "tools/call", params))
    return created.task


async def get(client: Client, task_id: str) -> types.GetTaskResult:
    request = types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=task_id))
    return await client.session.send_request(request, types.GetTaskResult)


async def poll(client: Client, task_id: str) -> types.GetTaskResult:
    """``tasks/get`` until the task ends (faster than its suggested interval: only a hang trips it)."""
    with anyio.fail_after(HANG):
        while True:
            task = await get(client, task_id)
            if task.status in ("completed", "failed", "cancelled"):
                return task
            await anyio.sleep(0.05)


async def until(condition: Callable[[], bool], what: str = "the condition") -> None:
    """Until ``condition()`` holds (checked every 10 ms; only a hang trips it)."""
    for _ in range(int(HANG / 0.01)):
        if condition():
            return
        await anyio.sleep(0.01)
    raise AssertionError(f"{what} did not come in {HANG} s")


async def first_call(fake: FakeOpenAIServer) -> None:
    """Until the debate's first model call (the fake server records it)."""
    await until(lambda: bool(fake.requests), "the debate's first model call")


# ------------------------------------------------------------------------------------- 2025-11-25


@pytest.mark.parametrize(("kind", "mode"), LEGACY)
async def test_a_debate_runs_as_a_task_with_progress_and_its_typed_result(kind: str, mode: str, tmp_path: Path) -> None:
    seen = Seen()
    options = {"extensions": [StatusWatch(seen)], "message_handler": seen.on_message}
    with FakeOpenAIServer(latency=0.05, reply=base.split_vote()) as fake:
        async with base.connect(kind, mode, fake, tmp_path, **options) as client:
            assert client.protocol_version == "2025-11-25"
            tasks = client.server_capabilities.tasks
            assert tasks is not None and tasks.list is not None and tasks.cancel is not None
            assert tasks.requests is not None and tasks.requests.tools is not None and tasks.requests.tools.call
            tools = {t.name: t for t in (await client.list_tools()).tools}
            support = {name: t.execution.task_support if t.execution else None for name, t in tools.items()}
            assert support == {
                "debate": "optional",
                "get_debate": "forbidden",
                "cancel_debate": "forbidden",
                "list_protocols": "forbidden",
            }

            task = await create(client, {"question": QUESTION, "protocol": "vote@3"})
            assert task.status == "working" and task.ttl is None and task.poll_interval
            done = await poll(client, task.task_id)
            assert done.status == "completed" and done.status_message is not None
            assert done.status_message.startswith("complete: answered 'B', agreement 0.67")
            payload = await client.session.send_request(
                types.GetTaskPayloadRequest(params=types.GetTaskPayloadRequestParams(task_id=task.task_id)),
                types.CallToolResult,
            )
            assert not payload.is_error and payload.meta == {RELATED: {"taskId": task.task_id}}
            outcome = DebateOutcome.model_validate(payload.structured_content)
            assert outcome.debate_id == task.task_id and outcome.status == "complete" and outcome.answer == "B"
            assert [d.answer for d in outcome.dissent] == ["C"] and outcome.calls == 3 == len(fake.requests)
            # the task is its debate: the tools and the resource take its id
            got = await client.call_tool("get_debate", {"debate_id": task.task_id})
            assert DebateOutcome.model_validate(got.structured_content) == outcome
            transcript = await client.read_resource(outcome.transcript)
            assert json.loads(transcript.contents[0].text)["final_answer"] == "B"  # type: ignore[union-attr]

            with anyio.fail_after(HANG):
                await seen.ended.wait()
            assert [s.status for s in seen.statuses] == ["completed"]
            assert seen.statuses[0].task_id == task.task_id and seen.statuses[0].status_message == done.status_message
            # progress per turn and round, each naming its task
            assert [p.progress for p in seen.progress] == [0, 1, 2, 3, 4]
            assert {p.progress_token for p in seen.progress} == {"p1"}
            assert all(p.meta == {RELATED: {"taskId": task.task_id}} for p in seen.progress)
            assert "round 1 done" in (seen.progress[-1].message or "")

            listed = await client.session.send_request(types.ListTasksRequest(), types.ListTasksResult)
            assert [t.task_id for t in listed.tasks] == [task.task_id] and listed.tasks[0].status == "completed"


@pytest.mark.parametrize(("kind", "mode"), LEGACY)
async def test_tasks_cancel_stops_the_debate_and_keeps_its_transcript(kind: str, mode: str, tmp_path: Path) -> None:
    seen = Seen()
    options = {"extensions": [StatusWatch(seen)], "message_handler": seen.on_message}
    with FakeOpenAIServer(latency=1.0) as fake:  # a cancel has 4 s to stop the 5 calls, loaded too
        async with base.connect(kind, mode, fake, tmp_path, **options) as client:
            # affirmative-critical: 5 calls one after another (2 rounds of 2, the synthesis)
            task = await create(client, {"question": QUESTION})
            await first_call(fake)
            await until(lambda: len(fake.requests) >= 3)  # round 1's end (two turns at once): the task changed
            working = await get(client, task.task_id)
            assert working.status == "working" and "round 1 done" in (working.status_message or ""), working
            assert working.last_updated_at > working.created_at, working
            cancelled = await client.session.send_request(
                types.CancelTaskRequest(params=types.CancelTaskRequestParams(task_id=task.task_id)),
                types.CancelTaskResult,
            )
            assert cancelled.status == "cancelled" and cancelled.task_id == task.task_id
            made = len(fake.requests)
            await anyio.sleep(1.5)  # more than a call's latency: a debate still running would have called
            assert len(fake.requests) == made < 5
            assert (await get(client, task.task_id)).status == "cancelled"
            payload = await client.session.send_request(
                types.GetTaskPayloadRequest(params=types.GetTaskPayloadRequestParams(task_id=task.task_id)),
                types.CallToolResult,
            )
            assert payload.is_error and DebateOutcome.model_validate(payload.structured_content).status == "cancelled"
            got = base.structured(await client.call_tool("get_debate", {"debate_id": task.task_id}))
            assert got["status"] == "cancelled" and got["calls"] < 5
            with anyio.fail_after(HANG):
                await seen.ended.wait()
            assert [s.status for s in seen.statuses] == ["cancelled"]
            with pytest.raises(MCPError) as again:
                await client.session.send_request(
                    types.CancelTaskRequest(params=types.CancelTaskRequestParams(task_id=task.task_id)),
                    types.CancelTaskResult,
                )
            assert again.value.error.code == -32602
            assert again.value.error.message == (
                f"tasks/cancel: task {task.task_id} already ended (cancelled); nothing to cancel"
            )


@pytest.mark.parametrize(("kind", "mode"), LEGACY)
async def test_bad_task_requests_get_one_line_errors_and_the_server_goes_on(
    kind: str, mode: str, tmp_path: Path
) -> None:
    with FakeOpenAIServer(latency=0.01) as fake:
        async with base.connect(kind, mode, fake, tmp_path) as client:
            refusals: list[tuple[str, dict[str, Any], int, str]] = [
                ("tasks/get", {"taskId": "nope"}, -32602, "tasks/get: no task 'nope' on this server"),
                ("tasks/result", {"taskId": "nope"}, -32602, "tasks/result: no task 'nope' on this server"),
                ("tasks/cancel", {"taskId": "nope"}, -32602, "tasks/cancel: no task 'nope' on this server"),
                ("tasks/get", {}, -32602, "tasks/get: taskId: required; add it, as the task's tools/call returned it"),
                ("tasks/result", {"taskId": 5}, -32602, "tasks/result: taskId: must be a task's id (a string)"),
                ("tasks/list", {"cursor": "zz"}, -32602, 'tasks/list: cursor "zz" is not one this server gave'),
                ("tasks/list", {"cursor": 7}, -32602, "tasks/list: cursor 7 is not one this server gave"),
                ("tasks/list", {"cursor": "9" * 20}, -32602, "is not one this server gave"),  # (was code 0: SQLite)
                (
                    "tools/call",
                    {"name": "list_protocols", "arguments": {}, "task": {}},
                    -32601,
                    "tools/call: list_protocols does not run as a task (its execution.taskSupport is forbidden)",
                ),
                (
                    "tools/call",
                    {"name": "debate", "arguments": {"question": QUESTION}, "task": {"ttl": "soon"}},
                    -32602,
                    'tools/call: task.ttl: "soon" is not a task\'s metadata',
                ),
                (
                    "tools/call",
                    {"name": "debate", "arguments": {"question": QUESTION}, "task": {"ttl": -5}},
                    -32602,
                    "tools/call: task.ttl: -5 is not a task's metadata",
                ),
                (  # (over 20 digits, as on every route: a review)
                    "tools/call",
                    {"name": "debate", "arguments": {"question": QUESTION}, "task": {"ttl": 10**30}},
                    -32602,
                    "tools/call: task.ttl: 1000000000000000000000000000000 is not a task's metadata",
                ),
                (
                    "tools/call",
                    {"name": "debate", "arguments": {}, "task": {"ttl": 1000}},
                    -32602,
                    "debate: question: required; add it",
                ),
            ]
            for method, params, code, expected in refusals:
                with pytest.raises(MCPError) as refused:
                    await raw(client, method, params)
                error = refused.value.error
                assert error.code == code and expected in error.message and "\n" not in error.message, (method, error)
            assert fake.requests == []  # no debate started
            listed = await client.session.send_request(types.ListTasksRequest(), types.ListTasksResult)
            assert listed.tasks == []
            assert len((await client.list_tools()).tools) == 4  # still serving


async def test_a_task_outlives_its_connection_and_its_server(tmp_path: Path) -> None:
    """A task is its stored debate: a client on another HTTP session polls it to its result, and
    ``moot mcp --db`` started again finds the task its last run left (stored as interrupted)."""
    with FakeOpenAIServer(latency=0.3, reply=base.split_vote()) as fake:
        settings = ServerSettings(
            db=tmp_path / "moot.sqlite", models=["openai:fake"], base_url=fake.base_url, api_key=SecretStr(base.KEY)
        )
        with ServerThread(settings) as server:

            def client() -> Client:
                http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {base.KEY}"}, timeout=HANG)
                transport = streamable_http_client(server.url + "/mcp", http_client=http)
                return Client(transport, mode="legacy", read_timeout_seconds=HANG)

            async with client() as first:
                task = await create(first, {"question": QUESTION, "protocol": "vote@3"})
            async with client() as second:  # a new session: the first one's is gone
                done = await poll(second, task.task_id)
                payload = await second.session.send_request(
                    types.GetTaskPayloadRequest(params=types.GetTaskPayloadRequestParams(task_id=task.task_id)),
                    types.CallToolResult,
                )
        assert done.status == "completed" and base.structured(payload)["answer"] == "B"

        db = str(tmp_path / "mcp.sqlite")
        async with Client(base.stdio_params(fake, "--db", db), mode="legacy", read_timeout_seconds=HANG) as one:
            task = await create(one, {"question": QUESTION})  # 5 calls of 0.3 s: it is still running
            await first_call(fake)
        async with Client(base.stdio_params(fake, "--db", db), mode="legacy", read_timeout_seconds=HANG) as two:
            left = await get(two, task.task_id)
            assert left.status == "failed" and (left.status_message or "").startswith("interrupted: ")
            payload = await two.session.send_request(
                types.GetTaskPayloadRequest(params=types.GetTaskPayloadRequestParams(task_id=task.task_id)),
                types.CallToolResult,
            )
            assert payload.is_error and base.structured(payload)["status"] == "interrupted"


async def test_a_key_never_comes_back_in_progress_or_in_a_tasks_status(tmp_path: Path) -> None:
    """The server's key, repeated by the agents as their answer, is redacted from the progress of a
    call and of a task, and from a task's status, as from the outcomes (test_mcp's key test): the
    manager's event log is redacted as it is written, and a task's status is made of it."""

    def leaky(request: dict[str, Any]) -> str:
        return json.dumps({"reasoning": "it is the key", "answer": f"{base.KEY} itself", "confidence": 0.7})

    seen = Seen()
    options = {"extensions": [StatusWatch(seen)], "message_handler": seen.on_message}
    with FakeOpenAIServer(latency=0.05, reply=leaky) as fake:
        async with base.connect("http", "legacy", fake, tmp_path, **options) as client:
            said: list[str] = []

            async def on_progress(done: float, total: float | None, message: str | None) -> None:
                said.append(message or "")

            await client.call_tool(
                "debate", {"question": QUESTION, "protocol": "vote@3"}, progress_callback=on_progress
            )
            task = await create(client, {"question": QUESTION, "protocol": "vote@3"})
            done = await poll(client, task.task_id)
            with anyio.fail_after(HANG):
                await seen.ended.wait()
    said += [p.message or "" for p in seen.progress if p.meta] + [done.status_message or ""]  # the task's
    said += [s.status_message or "" for s in seen.statuses]
    assert len(said) == 12 and all(base.KEY not in line for line in said), said
    assert sum("***" in line for line in said) == 10, said  # 3 turns and a round, twice; the two statuses


# ------------------------------------------------------------------------------------- 2026-07-28


class ExtTask(BaseModel):
    """2026-07-28's task (the Tasks extension's ``Task``, with its result once completed)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    meta: dict[str, Any] | None = Field(default=None, alias="_meta")  # the server's serverInfo stamp

    task_id: str
    status: Literal["working", "input_required", "completed", "failed", "cancelled"]
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None
    poll_interval_ms: int | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    result_type: str | None = None


class CreatedTask(types.Result):
    """The ``CreateTaskResult`` of the extension (``resultType: "task"``), as the client claims it."""

    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None


class ExtGetTask(types.Request[types.GetTaskRequestParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: types.GetTaskRequestParams
    name_param: ClassVar[str | None] = "taskId"  # the extension's Mcp-Name header


class ExtCancelTask(types.Request[types.CancelTaskRequestParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: types.CancelTaskRequestParams
    name_param: ClassVar[str | None] = "taskId"


async def ext_get(session: Any, task_id: str) -> ExtTask:
    task: ExtTask = await session.send_request(ExtGetTask(params=types.GetTaskRequestParams(task_id=task_id)), ExtTask)
    return task


class Tasks(ClientExtension):
    """A host's Tasks extension: it takes a task for a tool call and polls it to its result."""

    identifier = TASKS_EXTENSION

    def __init__(self) -> None:
        self.created: list[CreatedTask] = []
        self.polls: list[ExtTask] = []

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreatedTask, resolve=self.resolve)]

    async def resolve(self, created: CreatedTask, ctx: ClaimContext) -> types.CallToolResult:
        self.created.append(created)
        with anyio.fail_after(HANG):
            while True:
                task = await ext_get(ctx.session, created.task_id)
                self.polls.append(task)
                if task.status != "working":
                    break
                await anyio.sleep(0.05)
        assert task.status == "completed" and task.result is not None, task
        return types.CallToolResult.model_validate(task.result)


async def test_a_queued_task_says_it_is_queued_then_that_it_started(tmp_path: Path) -> None:
    """With its one slot taken, a debate's first progress says it waits; its start is said when it
    comes (not "started" while it is queued)."""
    seen = Seen()
    options = {"extensions": [StatusWatch(seen)], "message_handler": seen.on_message}
    kind, mode = LEGACY[0].values
    with FakeOpenAIServer(latency=0.3, reply=base.split_vote()) as fake:
        async with base.connect(kind, mode, fake, tmp_path, "--max-running", "1", **options) as client:
            first = await create(client, {"question": QUESTION, "protocol": "vote@3"})
            await first_call(fake)
            second = await create(client, {"question": QUESTION, "protocol": "vote@3"})
            assert (await get(client, second.task_id)).status == "working"
            for task in (first, second):
                assert (await poll(client, task.task_id)).status == "completed"
            await until(lambda: len([p for p in seen.progress if p.progress == 4]) == 2)  # both debates' last
    said = {t.task_id: [p.message or "" for p in seen.progress if p.meta == {RELATED: {"taskId": t.task_id}}]
            for t in (first, second)}  # fmt: skip
    assert said[first.task_id][0] == f"debate {first.task_id} started (vote)", said
    assert said[second.task_id][:2] == [f"debate {second.task_id} queued (vote)",
                                        f"debate {second.task_id} started (vote)"], said  # fmt: skip
    assert not any("started" in m for m in said[second.task_id][2:])


@pytest.mark.parametrize(("kind", "mode"), MODERN)
async def test_a_client_with_the_tasks_extension_gets_a_debate_as_a_task(kind: str, mode: str, tmp_path: Path) -> None:
    tasks = Tasks()
    with FakeOpenAIServer(latency=0.05, reply=base.split_vote()) as fake:
        async with base.connect(kind, mode, fake, tmp_path, extensions=[tasks]) as client:
            assert client.protocol_version == "2026-07-28"
            assert TASKS_EXTENSION in (client.server_capabilities.extensions or {})
            result = await client.call_tool("debate", {"question": QUESTION, "protocol": "vote@3"})
            outcome = DebateOutcome.model_validate(base.structured(result))
            assert not result.is_error and outcome.answer == "B" and outcome.calls == 3 == len(fake.requests)
            [created] = tasks.created
            assert created.task_id == outcome.debate_id and created.status == "working" and created.ttl_ms is None
            assert created.poll_interval_ms == 1000
            assert tasks.polls[-1].status == "completed" and tasks.polls[-1].result_type == "complete"
            assert (tasks.polls[-1].status_message or "").startswith("complete: answered 'B'")
            # wait: false keeps its answer at once, without a task
            started = await client.call_tool("debate", {"question": QUESTION, "protocol": "vote@3", "wait": False})
            assert base.structured(started)["status"] in ("queued", "running") and len(tasks.created) == 1
            # arguments it refuses get the tool's own error result, as without tasks
            refused = await client.call_tool("debate", {"question": QUESTION, "rounds": 3})
            assert refused.is_error and "debate: rounds: unknown argument" in base.text(refused)

            with pytest.raises(MCPError) as unknown:
                await ext_get(client.session, "nope")
            assert unknown.value.error.code == -32602 and "no task 'nope'" in unknown.value.error.message


@pytest.mark.parametrize(("kind", "mode"), MODERN)
async def test_tasks_cancel_stops_a_task_of_the_extension(kind: str, mode: str, tmp_path: Path) -> None:
    with FakeOpenAIServer(latency=1.0) as fake:  # a cancel has 4 s to stop the 5 calls, loaded too
        async with base.connect(kind, mode, fake, tmp_path, extensions=[Tasks()]) as client:
            handle = await client.session.call_tool("debate", {"question": QUESTION}, allow_claimed=True)
            assert isinstance(handle, CreatedTask) and handle.result_type == "task"
            await first_call(fake)
            running = await ext_get(client.session, handle.task_id)
            assert running.status == "working" and running.result is None
            ack = await client.session.send_request(
                ExtCancelTask(params=types.CancelTaskRequestParams(task_id=handle.task_id)), types.EmptyResult
            )
            assert ack.meta is not None  # an empty result (with the server's stamp)
            made = len(fake.requests)
            await anyio.sleep(1.5)  # more than a call's latency: a debate still running would have called
            cancelled = await ext_get(client.session, handle.task_id)
            assert cancelled.status == "cancelled" and cancelled.result is None and len(fake.requests) == made < 5
            got = base.structured(await client.call_tool("get_debate", {"debate_id": handle.task_id}))
            assert got["status"] == "cancelled"
            # The extension answers a cancel of an ended task with an empty result too; it stays cancelled.
            again = await client.session.send_request(
                ExtCancelTask(params=types.CancelTaskRequestParams(task_id=handle.task_id)), types.EmptyResult
            )
            assert again.meta is not None
            assert (await ext_get(client.session, handle.task_id)).status == "cancelled"


@pytest.mark.parametrize(("kind", "mode"), MODERN)
async def test_without_the_extension_a_debate_is_a_tool_call_and_tasks_need_the_capability(
    kind: str, mode: str, tmp_path: Path
) -> None:
    with FakeOpenAIServer(latency=0.01, reply=base.split_vote()) as fake:
        async with base.connect(kind, mode, fake, tmp_path) as client:
            result = await client.call_tool("debate", {"question": QUESTION, "protocol": "vote@3"})
            assert base.structured(result)["answer"] == "B"  # not a task: the client did not declare it
            with pytest.raises(MCPError) as missing:
                await ext_get(client.session, base.structured(result)["debate_id"])
            assert missing.value.error.code == -32021
            assert missing.value.error.message.startswith(f"tasks/get needs the client capability {TASKS_EXTENSION}")
            assert missing.value.error.data == {"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}}
            for method in ("tasks/result", "tasks/list"):
                with pytest.raises(MCPError) as gone:
                    await raw(client, method, {"taskId": "x"} if method == "tasks/result" else {})
                assert gone.value.error.code == -32601 and method in gone.value.error.message
