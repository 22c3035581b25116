"""``POST /v1/responses``: a debate behind OpenAI's Responses API, stateless.

``input`` is the question (a string), or a list of message items whose last user message is the
question and whose other messages, after ``instructions``, are its context. The reply is the
debate's decision, as one ``message`` output item; with the trace asked for (``moot/<preset>:trace``,
``reasoning.summary``, or ``moot.trace``) each debate turn comes before it as a ``reasoning`` item
whose ``reasoning_text`` is the turn, headed by its speaker and round. ``usage`` is summed over
every call of the debate (``input_tokens_details.cached_tokens`` too; the debate turns' output
tokens are its ``reasoning_tokens``, none when one turn is the reply); ``metadata`` carries the
debate's id and viewer link.

Streamed (``stream: true``), the events are those the openai SDK parses: ``response.created``,
``response.in_progress``, for each traced turn ``response.output_item.added`` (a reasoning item),
``response.content_part.added``, ``response.reasoning_text.delta``..., ``response.reasoning_text.done``,
``response.content_part.done``, ``response.output_item.done``; then the same for the message with
``response.output_text.delta``... and ``response.output_text.done``; and ``response.completed`` (or
``response.incomplete`` for a reply cut at its token bound, ``response.failed`` for a debate that
ended without one) with the whole response and its usage. ``: keepalive`` comments run meanwhile.

A response is stored (``store`` left out or true, as in OpenAI's API) and can be retrieved, deleted,
continued with ``previous_response_id`` and run in the background: :mod:`moot.server.openai.responses_state`.
Every field is honoured or refused by name (:func:`responses_asked`).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from sse_starlette import EventSourceResponse, ServerSentEvent

from moot.core.tools import Tool, ToolCall
from moot.core.types import ContextChunk, DebateResult
from moot.server.limits import RequestError
from moot.server.openai import fields, open_responses
from moot.server.openai import responses_state as state
from moot.server.openai.chat import info_of
from moot.server.openai.debate_feed import AnswerText, Feed, Piece, TurnEnd, TurnStart, TurnText, failure, turn_trace
from moot.server.openai.fields import Asked, Submission, debate_model, refuse_unless
from moot.server.policy import attach
from moot.server.schemas import INT32_MAX, Metadata, MootInfo, OpenAIOptions, RefusesEndpoints
from moot.server.settings import ServerSettings
from moot.server.state import Store, idempotency
from moot.server.state.events import SSE_SEP
from moot.server.state.manager import DETACHED, DebateManager, LiveDebate

#: The content parts of an input message that are text (an assistant's earlier reply included).
TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal"})
#: The fields of ``POST /v1/responses`` that do what OpenAI's API says (some only at the values a
#: debate can give: ``store`` false, ``top_p`` 1, ...; any other value is refused by name). Every
#: other field of the OpenAI SDK's request is refused by name when set; a test walks them all.
HONOURED = frozenset(
    {
        "input", "instructions", "model", "stream", "stream_options", "max_output_tokens", "temperature", "text",
        "reasoning", "metadata", "user", "safety_identifier", "prompt_cache_key", "store", "service_tier",
        "include", "top_p", "top_logprobs", "truncation", "tools", "tool_choice", "parallel_tool_calls",
        "previous_response_id", "background",
    }
)  # fmt: skip
#: ``include`` values this server honours: there is no encrypted reasoning to carry (the reasoning
#: items hold their text), so asking for it is asking for nothing more.
INCLUDABLE = frozenset({"reasoning.encrypted_content"})
UNSUPPORTED = {
    "conversation": "this server keeps no conversations (it is stateless); send the whole conversation in input "
    "instead",
    "prompt": "this server has no stored prompt templates; send the instructions and input themselves",
    "max_tool_calls": "a debate decides one tool call a request; leave max_tool_calls out",
    "moderation": "this server runs no moderation model; leave moderation out",
    "context_management": "this server trims no context: an input too long for the debate's models is refused; "
    "leave context_management out",
    "access_programs": "this server has no access programs; leave access_programs out",
    "background_options": "a background debate runs until it ends or is cancelled; leave background_options out",
    "image": "a debate reads and writes text only; leave image out",
    "prompt_cache_options": "the prompt caches are the backends' own, not set per request; leave "
    "prompt_cache_options out",
    "prompt_cache_retention": "the prompt caches are the backends' own, not set per request; leave "
    "prompt_cache_retention out",
}
_TRACE_SUMMARIES = (None, "auto", "concise", "detailed")


class ResponsesRequest(RefusesEndpoints):
    """``POST /v1/responses`` (the OpenAI SDK's ``client.responses.create``)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    #: moot's own options (the OpenAI SDK's ``extra_body={"moot": {...}}``).
    moot: OpenAIOptions = Field(default_factory=OpenAIOptions)
    # Honoured (within OpenAI's ranges):
    max_output_tokens: int | None = Field(default=None, ge=16, le=INT32_MAX)
    temperature: float | None = Field(default=None, ge=0, le=2)
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None
    # Kept with the stored debate's request:
    metadata: Metadata = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    # Honoured at the values a debate can give, refused by name at any other:
    store: bool | None = None
    service_tier: str | None = None
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    truncation: str | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    # Kept: the response is stored (store left out or true), continued, run in the background:
    previous_response_id: str | None = None
    background: bool | None = None
    # Refused when set:
    conversation: Any = None
    prompt: Any = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = None
    moderation: Any = None
    context_management: Any = None
    access_programs: Any = None
    background_options: Any = None
    image: Any = None
    prompt_cache_options: Any = None
    prompt_cache_retention: Any = None


def responses_asked(req: ResponsesRequest) -> Asked:
    """What a Responses request asks, after refusing by name each field a debate cannot honour (the
    model it names is resolved on its own: :func:`~moot.server.openai.fields.debate_model`)."""
    refuse_unless(
        "background",
        not (req.background and req.store is False),
        "a background response is read back by its id, so it must be stored; leave store out (or true) or "
        "background out",
    )
    for name, why in UNSUPPORTED.items():
        refuse_unless(name, getattr(req, name) is None, why)
    tools, tool_choice = response_tools(req.tools, req.tool_choice)
    fields.sampling_refusals({"top_p": req.top_p, "top_logprobs": req.top_logprobs})
    fields.sampling_refusals({"service_tier": req.service_tier})
    for i, item in enumerate(req.include or []):
        refuse_unless(
            f"include[{i}]",
            item in INCLUDABLE,
            f"{item!r}: a debate's reply has nothing of that kind to include; leave it out",
        )
    refuse_unless(
        "truncation",
        req.truncation in (None, "disabled"),
        "this server refuses an input too long for the debate's models rather than drop part of it; leave "
        "truncation out or disabled",
    )
    options = req.stream_options or {}
    refuse_unless(
        "stream_options.include_obfuscation",
        not options.get("include_obfuscation"),
        "this server pads no stream; leave include_obfuscation out or false",
    )
    text = req.text or {}
    for key in set(text) - {"format", "verbosity"}:
        refuse_unless(f"text.{key}", False, "not a field of text; give format and verbosity only")
    refuse_unless(
        "text.verbosity",
        text.get("verbosity") in (None, "medium"),
        "a debate's reply is as long as its protocol writes it (bound it with max_output_tokens); leave verbosity out",
    )
    reasoning = req.reasoning or {}
    for key in set(reasoning) - {"effort", "summary", "generate_summary"}:
        refuse_unless(f"reasoning.{key}", reasoning[key] is None, "a debate has no such reasoning option; leave it out")
    refuse_unless(
        "reasoning.effort",
        reasoning.get("effort") in (None, "none"),
        "a debate's effort is its protocol (more agents or rounds: moot.with, moot.rounds); leave reasoning.effort "
        "out (reasoning.summary streams the debate's turns)",
    )
    summaries = {k: reasoning.get(k) for k in ("summary", "generate_summary")}
    for key, value in summaries.items():
        refuse_unless(f"reasoning.{key}", value in _TRACE_SUMMARIES, "give auto, concise or detailed")
    recorded = {name: getattr(req, name) for name in fields.RECORDED if getattr(req, name, None) is not None}
    return Asked(
        max_tokens=req.max_output_tokens,
        max_tokens_field="max_output_tokens",
        temperature=req.temperature,
        json=fields.json_format(text.get("format"), "text.format", nested=False),
        trace=fields.asks_trace(req.model) or req.moot.trace or any(v is not None for v in summaries.values()),
        recorded={"openai": recorded} if recorded else {},
        tools=tools,
        tool_choice=tool_choice,
    )


def rebuild(
    debate_id: str,
    record: dict[str, Any],
    settings: ServerSettings,
    watchers: state.Watchers | None = None,
    store: Store | None = None,
) -> LiveDebate:
    """A Responses request's debate built again from its stored request (another replica takes it
    over, or a restarted server runs a background response again), by the function that built it
    (:func:`~moot.server.openai.fields.rebuild`). A stored response's final form is kept when it
    ends, as its request would have kept it (``watchers``, ``store``: the server's)."""
    req = ResponsesRequest.model_validate(record["request"])
    model = debate_model(req.model, tuned=settings.tuned)
    question, context = split_input(req)
    asked = responses_asked(req)
    live = fields.rebuild(debate_id, asked, model.protocol, question, context, req.moot, settings)
    raw = record.get(state.KEY)
    if watchers is not None and store is not None and isinstance(raw, dict):
        kept = state.Kept.model_validate(raw)
        if kept.store:
            watchers.watch(live, store, final_form(req, state.base_of(kept), asked), kept)
    return live


def final_form(req: ResponsesRequest, base: str, asked: Asked) -> Callable[[LiveDebate], dict[str, Any]]:
    """The final response object of a stored response's debate, once it has ended (failed or not)."""

    def final(done: LiveDebate) -> dict[str, Any]:
        failed = failure(done)
        if failed is not None:
            return Shell(done, req, base).response("failed", [], error=failed.message).model_dump(mode="json")
        return final_response(done, req, base, asked).model_dump(mode="json")

    return final


def response_tools(tools: list[Any] | None, choice: Any) -> tuple[list[Tool], str]:
    """The Responses API's function tools (``{type: function, name, parameters}``) and its
    ``tool_choice``, as the chat endpoint reads them; a tool of another type is refused by its place."""
    chat: list[Any] = []
    for i, tool in enumerate(tools or []):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            named = fields.shown(kind) if kind else "untyped"
            refuse_unless(f"tools[{i}]", False, f"a {named} tool; a debate calls function tools only")
        function = {k: v for k, v in tool.items() if k in ("name", "description", "parameters")}
        chat.append({"type": "function", "function": function})
    if isinstance(choice, dict) and choice.get("type") == "function":
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    return fields.chat_tools(chat, choice, flat=True)


def split_input(req: ResponsesRequest) -> tuple[str, list[ContextChunk]]:
    """The question (the last user message) and its context: ``instructions``, then the other messages.
    A reasoning item (a trace sent back with the history) is not context: the next debate reads the
    answers, not the last one's turns. A function call and its output (a tool loop's history) are
    context every agent reads; any other item is refused by its place."""
    instructions = (req.instructions or "").strip()
    context = [ContextChunk(text=req.instructions or "", source="instructions")] if instructions else []
    if req.input is None:
        raise RequestError("input: required; give the question (a string or a list of message items)", param="input")
    if isinstance(req.input, str):
        if not req.input.strip():
            raise RequestError("input: give the question (text)", param="input")
        return req.input, context
    messages: list[tuple[str, str]] = []
    files: list[list[ContextChunk]] = []  # each message's inline files, as passages
    calls: set[Any] = set()  # the call ids of the function_call items so far
    for i, item in enumerate(open_responses.expanded(req.input)):
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "reasoning":
            continue
        if kind == "function_call":  # the debate's earlier call, as the client sends it back
            calls.add(item.get("call_id"))
            messages.append(("assistant", f"(called the tool {item.get('name')} with {item.get('arguments')}, call "
                                          f"id {item.get('call_id')})"))  # fmt: skip
            files.append([])
            continue
        if kind == "function_call_output":
            if item.get("call_id") not in calls:  # as OpenAI's API refuses it: no call it could answer
                raise RequestError(
                    f"input[{i}].call_id: no function_call item with call_id {item.get('call_id')!r} comes before "
                    "this output; send the function_call item it answers before it (this server keeps no earlier "
                    "responses: the whole tool loop goes in input)",
                    param=f"input[{i}].call_id",
                )
            output = item.get("output")
            text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
            messages.append(("tool", f"(the result of the tool call {item.get('call_id')}:)\n{text}"))
            files.append([])
            continue
        if kind != "message":
            raise RequestError(
                f"input[{i}]: a {kind or 'untyped'} item; a debate reads message items only (a role and its "
                "content) and a tool loop's function_call and function_call_output items, so send the conversation "
                "as those",
                param=f"input[{i}]",
            )
        role = item.get("role")
        refuse_unless(
            f"input[{i}].role",
            role in ("user", "assistant", "system", "developer"),
            "give user, assistant, system or developer",
        )
        content = item.get("content")
        if not isinstance(content, str | list | type(None)) or (
            isinstance(content, list) and not all(isinstance(p, dict) for p in content)
        ):
            raise RequestError(f"input[{i}].content: give text or a list of content parts", param=f"input[{i}].content")
        text, inline = fields.content_text(content, f"input[{i}].content", TEXT_PARTS, "input_file")
        messages.append((str(role), text))
        files.append(inline)
    last = max((i for i, (role, _) in enumerate(messages) if role == "user"), default=None)
    if last is None or not messages[last][1].strip():
        raise RequestError("input: give at least one user message with text (the question)", param="input")
    for i, (r, t) in enumerate(messages):  # each message's files after it; the question's last of all
        if i != last:
            context += [ContextChunk(text=t, source=r)] if t.strip() else []
            context += files[i]
    return messages[last][1], context + [attach(f) for f in files[last]]


# ------------------------------------------------------------------------------------ the reply


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class OutputMessage(BaseModel):
    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"]
    content: list[OutputText]


class ReasoningItem(BaseModel):
    """One debate turn: its speaker and round head its text."""

    type: Literal["reasoning"] = "reasoning"
    id: str
    status: Literal["in_progress", "completed", "incomplete"]
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningText]


class InputTokensDetails(BaseModel):
    #: Input tokens the models' servers read from their prompt caches (summed over the debate's calls).
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(BaseModel):
    #: The debate turns' output tokens (the decision's are the rest of ``output_tokens``); 0 when a
    #: lone turn is the reply (``single``, ``direct``).
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"] = "max_output_tokens"


class FunctionCallItem(BaseModel):
    """The tool call the debate decided on (a Responses output item)."""

    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed"] = "completed"


class ResponseError(BaseModel):
    code: str = "server_error"
    message: str


class ResponseObject(BaseModel):
    """A response, as OpenAI's API returns it (and the ``moot`` field: the debate behind it). Every
    field the Open Responses schema requires is here, each with the value true of the debate
    (:func:`moot.server.openai.open_responses.echoed`: the sampling fields are the request's or the ones the
    debate ran with)."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    #: When the response completed (None while it runs, and for one incomplete or failed, as OpenAI's).
    completed_at: int | None = None
    status: Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    model: str
    previous_response_id: str | None = None
    output: list[ReasoningItem | OutputMessage | FunctionCallItem] = Field(default_factory=list)
    parallel_tool_calls: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    top_logprobs: int = 0
    tool_choice: Any = "none"
    tools: list[Any] = Field(default_factory=list)
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    reasoning: dict[str, Any] | None = None
    truncation: str = "disabled"
    store: bool = False
    background: bool = False
    service_tier: str = "default"
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    usage: ResponseUsage | None = None
    #: The client's metadata, and the debate's id (``moot_debate_id``) and viewer link (``moot_url``).
    metadata: dict[str, str] = Field(default_factory=dict)
    moot: MootInfo | None = None


def reasoning_tokens(result: DebateResult) -> int:
    """The output tokens the reply is not: the debate turns' (a decision call's are the reply's), or
    none when a lone turn is the reply itself (``single``, ``direct``: nothing was deliberated)."""
    turns = result.turns()
    if len(turns) == 1 and not result.decision_turns:
        return 0
    return sum(t.usage.completion_tokens for t in turns)


def usage_of(result: DebateResult) -> ResponseUsage:
    u = result.usage
    return ResponseUsage(
        input_tokens=u.prompt_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=u.cached_prompt_tokens),
        output_tokens=u.completion_tokens,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning_tokens(result)),
        total_tokens=u.total_tokens,
    )


def turn_items(live: LiveDebate) -> list[ReasoningItem]:
    """Every debate turn of a finished debate as a reasoning item (the trace, not streamed)."""
    result = live.result
    assert result is not None
    items: list[ReasoningItem] = []
    for rnd in result.rounds:
        for turn in rnd.turns:
            text = ReasoningText(text=turn_trace(turn))
            items.append(ReasoningItem(id=_reasoning_id(live, len(items)), status="completed", content=[text]))
    return items


def _reasoning_id(live: LiveDebate, n: int) -> str:
    return f"rs_{live.id}_{n}"


class Shell:
    """The response of one request as it grows: what every event repeats."""

    def __init__(self, live: LiveDebate, req: ResponsesRequest, base: str) -> None:
        self.live = live
        self.req = req
        self.base = base
        self.created = int(time.time())
        self.completed: int | None = None

    def response(
        self,
        status: Literal["in_progress", "completed", "incomplete", "failed"],
        output: list[ReasoningItem | OutputMessage | FunctionCallItem],
        *,
        error: str | None = None,
    ) -> ResponseObject:
        req, live = self.req, self.live
        done = status != "in_progress" and live.result is not None
        metadata = {**(req.metadata or {}), "moot_debate_id": live.id, "moot_url": f"{self.base}/debates/{live.id}"}
        if status == "completed" and self.completed is None:
            self.completed = int(time.time())
        return ResponseObject(
            id=f"resp_{live.id}",
            created_at=self.created,
            completed_at=self.completed if status == "completed" else None,
            status=status,
            error=ResponseError(message=error) if error is not None else None,
            incomplete_details=IncompleteDetails() if status == "incomplete" else None,
            instructions=req.instructions,
            max_output_tokens=req.max_output_tokens,
            model=req.model,
            output=output,
            tool_choice=req.tool_choice or ("auto" if req.tools else "none"),
            user=req.user,
            usage=usage_of(live.result) if done and live.result is not None else None,
            metadata=metadata,
            moot=info_of(live, self.base) if done else None,
            **open_responses.echoed(req, live.spec),
        )


def final_response(live: LiveDebate, req: ResponsesRequest, base: str, asked: Asked) -> ResponseObject:
    result = live.result
    assert result is not None
    reply = asked.bind(live.spec).reply(result)
    status: Literal["completed", "incomplete"] = "incomplete" if reply.finish == "length" else "completed"
    call = function_call_item(live.id, reply.call)
    last: OutputMessage | FunctionCallItem = (
        call
        if call is not None
        else OutputMessage(id=f"msg_{live.id}", status=status, content=[OutputText(text=reply.text)])
    )
    output: list[ReasoningItem | OutputMessage | FunctionCallItem] = (
        [*turn_items(live), last] if asked.trace else [last]
    )
    return Shell(live, req, base).response(status, output)


def function_call_item(debate_id: str, call: ToolCall | None) -> FunctionCallItem | None:
    """The decided tool call (:attr:`~moot.server.openai.fields.Reply.call`) as a Responses
    ``function_call`` item (None: the debate answered)."""
    if call is None:
        return None
    return FunctionCallItem(
        id=f"fc_{debate_id}", call_id=f"call_{debate_id}", name=call.name, arguments=call.arguments_json()
    )


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One event of a streamed response: its type, and its data as plain JSON values (the response
    objects and items already dumped), encoded once, where it is sent (:meth:`text`, :meth:`sse`)."""

    kind: str
    data: dict[str, Any]

    def text(self) -> str:
        return _dumps(self.data)

    def sse(self) -> ServerSentEvent:
        return ServerSentEvent(event=self.kind, data=self.text(), sep=SSE_SEP)


class _Events:
    """Numbered SSE events of one streamed response (``sequence_number`` from 0); ``stamp``: what a
    stored response adds to each response object (:func:`moot.server.openai.responses_state.stamped`)."""

    def __init__(self, stamp: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> None:
        self.number = 0
        self.stamp = stamp

    def __call__(self, kind: str, **fields: Any) -> StreamEvent:
        data = {"type": kind, "sequence_number": self.number, **_plain(fields)}
        if self.stamp is not None and "response" in data:
            data["response"] = self.stamp(data["response"])
        self.number += 1
        return StreamEvent(kind, data)


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _dumps(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


async def stream(
    live: LiveDebate,
    req: ResponsesRequest,
    base: str,
    asked: Asked,
    stamp: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> AsyncIterator[ServerSentEvent]:
    """The SSE events of a streamed response (:func:`events`, each encoded once, here)."""
    async for event in events(live, req, base, asked, stamp):
        yield event.sse()


async def events(
    live: LiveDebate,
    req: ResponsesRequest,
    base: str,
    asked: Asked,
    stamp: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> AsyncIterator[StreamEvent]:
    """The events of a streamed response (see the module's docstring), as values: the HTTP route
    sends each as SSE (:func:`stream`), the WebSocket as a text message, and reads the final
    response from the last one as it is, never decoding what it sent."""
    shell = Shell(live, req, base)
    event = _Events(stamp)
    yield event("response.created", response=shell.response("in_progress", []))
    yield event("response.in_progress", response=shell.response("in_progress", []))
    output: list[ReasoningItem | OutputMessage | FunctionCallItem] = []
    turn: list[str] = []  # the text of the turn streaming now
    answer: list[str] = []
    message_id = f"msg_{live.id}"

    def open_message() -> list[StreamEvent]:
        output.append(OutputMessage(id=message_id, status="in_progress", content=[]))
        index = len(output) - 1
        return [
            event("response.output_item.added", output_index=index, item=output[index]),
            event(
                "response.content_part.added",
                item_id=message_id,
                output_index=index,
                content_index=0,
                part=OutputText(text=""),
            ),
        ]

    def events_of(pieces: list[Piece]) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        for piece in pieces:
            if isinstance(piece, TurnStart):
                item = ReasoningItem(id=_reasoning_id(live, len(output)), status="in_progress", content=[])
                output.append(item)
                turn.clear()
                turn.append(piece.header)
                index = len(output) - 1
                out.append(event("response.output_item.added", output_index=index, item=item))
                out.append(
                    event(
                        "response.content_part.added",
                        item_id=item.id,
                        output_index=index,
                        content_index=0,
                        part=ReasoningText(text=""),
                    )
                )
                out.append(_reasoning_delta(event, item.id, index, piece.header))
            elif isinstance(piece, TurnText):
                index = len(output) - 1
                turn.append(piece.text)
                out.append(_reasoning_delta(event, output[index].id, index, piece.text))
            elif isinstance(piece, TurnEnd):
                index = len(output) - 1
                text = "".join(turn)
                done = ReasoningItem(id=output[index].id, status="completed", content=[ReasoningText(text=text)])
                output[index] = done
                common = {"item_id": done.id, "output_index": index, "content_index": 0}
                out.append(event("response.reasoning_text.done", text=text, **common))
                out.append(event("response.content_part.done", part=ReasoningText(text=text), **common))
                out.append(event("response.output_item.done", output_index=index, item=done))
            elif isinstance(piece, AnswerText):
                if not any(isinstance(o, OutputMessage) for o in output):
                    out += open_message()
                answer.append(piece.text)
                out.append(_text_delta(event, message_id, len(output) - 1, piece.text))
        return out

    feed = Feed(live, asked.bind(live.spec))
    async for pieces in feed.batches():
        for sse in events_of(pieces):
            yield sse
    pieces, outcome = await feed.finish()
    for sse in events_of(pieces):
        yield sse
    if outcome.failure is not None:
        closed = [o for o in output if not (isinstance(o, OutputMessage) and o.status == "in_progress")]
        yield event("response.failed", response=shell.response("failed", closed, error=outcome.failure.message))
        return
    call = function_call_item(live.id, outcome.call)
    if call is not None:
        index = len(output)
        output.append(call.model_copy(update={"status": "in_progress", "arguments": ""}))
        yield event("response.output_item.added", output_index=index, item=output[index])
        common = {"item_id": call.id, "output_index": index}
        yield event("response.function_call_arguments.delta", delta=call.arguments, **common)
        yield event("response.function_call_arguments.done", arguments=call.arguments, name=call.name, **common)
        output[index] = call
        yield event("response.output_item.done", output_index=index, item=call)
        yield event("response.completed", response=shell.response("completed", output))
        return
    if not any(isinstance(o, OutputMessage) for o in output):
        for sse in open_message():
            yield sse
    index = len(output) - 1
    if outcome.rest:
        answer.append(outcome.rest)
        yield _text_delta(event, message_id, index, outcome.rest)
    text = "".join(answer)
    status: Literal["completed", "incomplete"] = "incomplete" if outcome.finish == "length" else "completed"
    part = OutputText(text=text)
    message = OutputMessage(id=message_id, status=status, content=[part])
    output[index] = message
    common = {"item_id": message_id, "output_index": index, "content_index": 0}
    yield event("response.output_text.done", text=text, logprobs=[], **common)
    yield event("response.content_part.done", part=part, **common)
    yield event("response.output_item.done", output_index=index, item=message)
    kind = "response.incomplete" if status == "incomplete" else "response.completed"
    yield event(kind, response=shell.response(status, output))


def _reasoning_delta(event: _Events, item_id: str, index: int, text: str) -> StreamEvent:
    return event("response.reasoning_text.delta", item_id=item_id, output_index=index, content_index=0, delta=text)


def _text_delta(event: _Events, item_id: str, index: int, text: str) -> StreamEvent:
    return event(
        "response.output_text.delta", item_id=item_id, output_index=index, content_index=0, delta=text, logprobs=[]
    )


# ------------------------------------------------------------------------------------ the route


async def begin(
    body: ResponsesRequest,
    settings: ServerSettings,
    manager: DebateManager,
    headers: Mapping[str, str] | None,
    *,
    debated: ResponsesRequest | None = None,
    earlier: int = 0,
    record: dict[str, Any] | None = None,
    kept: state.Kept | None = None,
    idem: idempotency.Idempotency | None = None,
) -> tuple[LiveDebate, Asked]:
    """The debate a Responses request asks for, queued (over HTTP or a WebSocket), and what it asks.
    ``debated``: the request with the whole conversation of a chain (``previous_response_id``), of
    which ``earlier`` items came before the new input; ``kept``: what a stored response keeps, into
    the stored request (``record``, filled here, is what was stored); ``idem``: the request's
    ``Idempotency-Key``, whose debate is joined (:mod:`moot.server.state.idempotency`)."""
    model = debate_model(body.model, tuned=settings.tuned)
    try:
        question, context = await fields.off_loop(lambda: split_input(debated or body))
    except RequestError as exc:
        raise state.named_in_input(exc, earlier) from None
    asked = await fields.asked_off_loop(responses_asked, body)
    record = record if record is not None else {}
    whole = (debated or body).model_copy(update={"previous_response_id": None})
    record.update(
        {
            "chat_completion": True,
            "endpoint": "/v1/responses",
            "model": body.model,
            "moot": body.moot.model_dump(by_alias=True),
            # The request whole (a chain's conversation in its input): another replica that takes
            # the debate over builds it again from it (rebuild).
            "request": whole.model_dump(mode="json", by_alias=True, exclude_unset=True),
        }
    )
    if kept is not None:
        kept.trace = asked.trace
        record[state.KEY] = kept.model_dump(mode="json")
        if kept.background:  # read by its id: still queued at a restart, it is queued again
            record[DETACHED] = True
    live = fields.submit(
        asked,
        model.protocol,
        question,
        context,
        body.moot,
        Submission(settings, manager, record | asked.recorded, headers, "input", idem),
    )
    return live, asked


SSE = Callable[[Request, AsyncIterator[Any], Mapping[str, str] | None], EventSourceResponse]


def router(
    settings: ServerSettings,
    sse: SSE,
    responses: dict[int | str, dict[str, Any]],
    watchers: state.Watchers | None = None,
) -> APIRouter:
    """The route, for :func:`moot.server.create_app` (its stream helper and error responses;
    ``watchers``: those that keep each stored response's final form, shared with :func:`rebuild`)."""
    api = APIRouter()
    watchers = watchers if watchers is not None else state.Watchers()

    @api.post("/v1/responses", response_model=ResponseObject, tags=["openai"], responses=responses)
    async def create_response(request: Request, body: ResponsesRequest) -> Response:
        """A debate as one model of the Responses API: ``model`` is ``moot/<protocol>``; streamed with
        ``stream: true``; stored unless ``store`` is false (``GET /v1/responses/{id}``), continued with
        ``previous_response_id``, run in the background with ``background: true``."""
        manager: DebateManager = request.app.state.manager
        stored = body.store is not False
        items = state.as_items(body.input) if isinstance(body.input, str | list) else []
        debated, earlier = body, 0
        if body.previous_response_id is not None:
            new = len(items)
            items = state.chain(manager.store, body.previous_response_id, items)
            debated, earlier = body.model_copy(update={"input": items}), len(items) - new
        kept = state.Kept(
            background=bool(body.background),
            previous_response_id=body.previous_response_id,
            input=items,
            trace=False,
        )
        record: dict[str, Any] = {}
        live, asked = await begin(
            body, settings, manager, request.headers, debated=debated, earlier=earlier, record=record,
            kept=kept if stored else None, idem=idempotency.of_request(request.headers, "/v1/responses", body),
        )  # fmt: skip
        base = str(request.base_url).rstrip("/")
        headers = {"x-moot-debate-id": live.id}
        if not stored:
            if body.stream:
                return sse(request, stream(live, body, base, asked), headers)
            await live.done.wait()
            failed = failure(live)
            if failed is not None:
                raise failed
            reply = final_response(live, body, base, asked)
            return JSONResponse(reply.model_dump(mode="json"), headers=fields.cost_headers(live))
        kept = keep_first(manager, live, kept, Shell(live, body, base), record)
        watchers.watch(live, manager.store, final_form(body, base, asked), kept)
        if body.background:
            if body.stream:
                return sse(request, state.replay(manager, watchers, live.id, kept, None), headers)
            return JSONResponse(kept.first, headers=headers)

        def stamp(data: dict[str, Any]) -> dict[str, Any]:
            return state.stamped(data, kept)

        if body.stream:
            return sse(request, stream(live, body, base, asked, stamp), headers)
        await live.done.wait()
        await watchers.settled(live.id)
        failed = failure(live)
        if failed is not None:
            raise failed
        kept_reply = state.stamped(final_response(live, body, base, asked).model_dump(mode="json"), kept)
        return JSONResponse(kept_reply, headers=fields.cost_headers(live))

    api.include_router(state.router(sse, watchers, responses, ResponseObject))
    return api


def keep_first(
    manager: DebateManager, live: LiveDebate, kept: state.Kept, shell: Shell, record: dict[str, Any]
) -> state.Kept:
    """A stored response's first form (``queued``), kept with its debate's request."""
    first = state.stamped(shell.response("in_progress", []).model_dump(mode="json"), kept, "queued")
    kept = kept.model_copy(update={"first": first, "response": first})
    state.keep(manager.store, live.id, manager.store.request(live.id) or record, kept)
    return kept
