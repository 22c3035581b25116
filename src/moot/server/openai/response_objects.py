"""The Responses API's wire objects a debate's reply is written in: the response
(:class:`ResponseObject`), its output items (reasoning turns, the message, the decided
``function_call``) and usage, and the response of one request as it grows (:class:`Shell`)."""

import time
from typing import Any, Literal

from pydantic import BaseModel, Field

from moot.core.tools import ToolCall
from moot.core.types import DebateResult
from moot.server.openai import open_responses
from moot.server.openai.asked import Asked
from moot.server.openai.chat import info_of
from moot.server.openai.chat_wire import MootInfo
from moot.server.openai.debate_feed import turn_trace
from moot.server.openai.responses_request import ResponsesRequest
from moot.server.openai.responses_state import STATUS, Kept, stamped
from moot.server.state import StoredDebate
from moot.server.state.manager import LiveDebate

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


def turn_items(debate_id: str, result: DebateResult) -> list[ReasoningItem]:
    """Every finished debate turn of ``result`` as a reasoning item, in order: a trace's output before
    its answer, and the whole output of a traced response that failed or was cancelled (what its stream
    had shown stays in it)."""
    items: list[ReasoningItem] = []
    for rnd in result.rounds:
        for turn in rnd.turns:
            text = ReasoningText(text=turn_trace(turn))
            items.append(ReasoningItem(id=f"rs_{debate_id}_{len(items)}", status="completed", content=[text]))
    return items


def reasoning_id(live: LiveDebate, n: int) -> str:
    return f"rs_{live.id}_{n}"


class Shell:
    """The response of one request as it grows: what every event repeats."""

    def __init__(self, live: LiveDebate, req: ResponsesRequest, base: str) -> None:
        self.live = live
        self.req = req
        self.base = base
        self.created = int(time.time())
        #: The fields that repeat the request, worked out once for every event of the response.
        self.echoed = open_responses.echoed(req, live.spec)

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
        if status == "completed" and live.completed_at is None:
            live.completed_at = int(time.time())
        return ResponseObject(
            id=f"resp_{live.id}",
            created_at=self.created,
            completed_at=live.completed_at if status == "completed" else None,
            status=status,
            error=ResponseError(message=error) if error is not None else None,
            incomplete_details=IncompleteDetails() if status == "incomplete" else None,
            instructions=req.instructions,
            max_output_tokens=req.max_output_tokens,
            model=req.model,
            output=output,
            tool_choice=req.tool_choice or "auto",
            user=req.user,
            usage=usage_of(live.result) if done and live.result is not None else None,
            metadata=metadata,
            moot=info_of(live, self.base) if done else None,
            **self.echoed,
        )


def final_response(shell: Shell, asked: Asked) -> ResponseObject:
    """The response once its debate has ended with a result (``shell``: the response's, made once
    per request)."""
    live = shell.live
    result = live.result
    assert result is not None
    reply = asked.reply(result)
    status: Literal["completed", "incomplete"] = "incomplete" if reply.finish == "length" else "completed"
    call = function_call_item(live.id, reply.call)
    last: OutputMessage | FunctionCallItem = (
        call
        if call is not None
        else OutputMessage(id=f"msg_{live.id}", status=status, content=[OutputText(text=reply.text)])
    )
    output: list[ReasoningItem | OutputMessage | FunctionCallItem] = (
        [*turn_items(live.id, result), last] if asked.trace else [last]
    )
    return shell.response(status, output)


def function_call_item(debate_id: str, call: ToolCall | None) -> FunctionCallItem | None:
    """The decided tool call (:attr:`~moot.server.openai.asked.Reply.call`) as a Responses
    ``function_call`` item (None: the debate answered)."""
    if call is None:
        return None
    return FunctionCallItem(
        id=f"fc_{debate_id}", call_id=f"call_{debate_id}", name=call.name, arguments=call.arguments_json()
    )


def rebuilt(row: StoredDebate, kept: Kept) -> dict[str, Any]:
    """The response of a debate that ended with no response kept (the server stopped first): its
    status, its answer if it has one, and a trace's finished turns before it (or alone, if it failed)."""
    base = dict(kept.response or kept.first or {})
    result = row.result
    status = STATUS.get(row.status, "failed")
    output: list[dict[str, Any]] = []
    if kept.trace and result is not None:
        output += [item.model_dump(mode="json") for item in turn_items(row.id, result)]
    if status == "completed" and result is not None and result.final_answer is not None:
        text = {"type": "output_text", "text": result.final_answer, "annotations": [], "logprobs": []}
        output.append(
            {"type": "message", "id": f"msg_{row.id}", "role": "assistant", "status": "completed", "content": [text]}
        )
    elif status == "completed":
        status = "failed"
    error = None
    if status == "failed":
        why = row.error or (result.error if result else None) or "no decision"
        error = {"code": "server_error", "message": f"the debate {row.id} ended {row.status}: {why}"}
    return stamped({**base, "output": output, "error": error, "status": status}, kept)
