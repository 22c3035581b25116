"""``POST /v1/chat/completions``: a debate behind the OpenAI chat protocol.

``model`` is ``moot/<preset>``; the last user message is the question and the earlier messages
are its context. The reply is the debate's decision. Streamed, the response is only standard
``chat.completion.chunk`` lines: the role at once, ``: keepalive`` comments while the rounds run,
then the decision's text as the decision call generates it (a synthesis streams as it is
generated: its first piece at once, then what came over the server's ``token_window_s`` in one
chunk; a vote, a rule or a
judge's verdict is known at once when it is made), a final chunk with the
finish reason and the ``moot`` field, a usage chunk when ``stream_options.include_usage`` is set,
and ``[DONE]``. Usage is the sum over every call of the debate. The debate's own progress is on
``GET /v1/debates/{id}/events``; its id is in every chunk's ``id`` (``moot-<debate id>``). With the
trace asked for (``moot/<preset>:trace`` or ``moot.trace``), every turn of the debate streams too,
in ``delta.reasoning_content`` (:mod:`moot.server.openai.debate_feed`). Each request field is honoured or
refused by name: :mod:`moot.server.openai.fields`.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from moot.core.tools import ToolCall
from moot.core.types import ContextChunk, DebateResult
from moot.files import json_bytes
from moot.models.images import ImageInput
from moot.server.openai import submission
from moot.server.openai.asked import Asked
from moot.server.openai.catalogue import debate_model
from moot.server.openai.catalogue import model_cards as model_cards  # re-exported: http/routes.py uses it from here
from moot.server.openai.chat_wire import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessageIn,
    ChatUsage,
    ChunkChoice,
    ChunkDelta,
    FunctionCallOut,
    MootInfo,
    PromptTokensDetails,
    ToolCallOut,
)
from moot.server.openai.conversation import (
    Split,
    content_text,
    question_and_context,
    tool_call_text,
    tool_result_header,
)
from moot.server.openai.debate_feed import AnswerText, Feed, Piece, TurnStart, TurnText, trace_text
from moot.server.openai.debate_feed import TokenCount as TokenCount  # re-exported: the tests count with it
from moot.server.openai.debate_feed import failure as failure  # re-exported: the route raises it
from moot.server.openai.fields import CHAT_TEXT_PARTS, chat_asked
from moot.server.policy import RequestError
from moot.server.schemas import ErrorBody, ErrorDetail
from moot.server.settings import ServerSettings
from moot.server.state import idempotency
from moot.server.state.events import sse_event
from moot.server.state.manager import DebateManager, LiveDebate


def split_messages(req: ChatCompletionRequest) -> Split:
    """The last user message is the question; the other messages, in order, are its context (an
    assistant's tool calls and the tools' results included, so every agent reads them). A tool's
    result must answer a call an earlier assistant message made, as OpenAI's API requires."""
    calls: set[str] = set()
    for i, m in enumerate(req.messages):
        extra = m.model_extra or {}
        calls.update(c.id for c in m.tool_calls or [])  # (each typed where the request is read: ToolCallIn)
        if m.role == "tool" and not isinstance(extra.get("tool_call_id"), str):
            raise RequestError(
                f"messages[{i}].tool_call_id: a tool message needs the id (a string) of the tool call it "
                "answers, as the assistant message's tool_calls gave it",
                param=f"messages[{i}].tool_call_id",
            )
        if m.role == "tool" and extra.get("tool_call_id") not in calls:
            raise RequestError(
                f"messages[{i}].tool_call_id: no earlier assistant message made a tool call with id "
                f"{extra.get('tool_call_id')!r}; send the assistant message with its tool_calls before the tool's "
                "result",
                param=f"messages[{i}].tool_call_id",
            )
    messages: list[tuple[str, str]] = []
    files: list[list[ContextChunk]] = []  # each message's inline files, as passages
    shown: list[list[ImageInput]] = []  # each message's images
    for i, m in enumerate(req.messages):
        read = content_text(m.content, f"messages[{i}].content", CHAT_TEXT_PARTS, "file", m.role)
        messages.append((m.role, _with_tools(read.text, m)))
        files.append(read.files)
        shown.append(read.images)
    return question_and_context(messages, files, shown, "messages", [])


def _with_tools(text: str, message: ChatMessageIn) -> str:
    """A message's text as the agents read it: a tool message's result after the line that says which
    call it answers (as a Responses ``function_call_output`` reads); an assistant message's tool
    calls after its text, if it has any."""
    extra = message.model_extra or {}
    if extra.get("tool_call_id"):
        return "\n".join(p for p in (tool_result_header(extra["tool_call_id"]), text) if p)
    lines = [text] if text else []
    for call in message.tool_calls or []:
        lines.append(tool_call_text(call.function.name, call.function.arguments, call.id))
    return "\n".join(lines)


def tool_calls_of(debate_id: str, call: ToolCall | None, *, index: bool = False) -> list[ToolCallOut] | None:
    """The decided tool call (:attr:`~moot.server.openai.asked.Reply.call`) as OpenAI's ``tool_calls``
    (None: the debate answered)."""
    if call is None:
        return None
    fn = FunctionCallOut(name=call.name, arguments=call.arguments_json())
    return [ToolCallOut(index=0 if index else None, id=f"call_{debate_id}", function=fn)]


def read(req: ChatCompletionRequest, settings: ServerSettings) -> Asked:
    """A chat completion request read, once, into what it asks (:func:`~moot.server.openai.fields.chat_asked`):
    the model it names (else a 404), its messages (else a 400 naming one), then its fields."""
    model = debate_model(req.model, tuned=settings.tuned)
    split = split_messages(req)
    read = submission.conversation(split.question, split.context, settings, "messages")
    return chat_asked(req, model, *read, images=split.images)


async def start(
    req: ChatCompletionRequest,
    manager: DebateManager,
    settings: ServerSettings,
    headers: Mapping[str, str] | None = None,
) -> tuple[LiveDebate, Asked]:
    """Queue the debate a chat request asks for (its tools and schemas read off the event loop);
    ``headers``: the request's (its ``traceparent``). What it asked comes back with it: the reply
    is made by it."""
    asked = await submission.asked_off_loop(lambda: read(req, settings), settings)
    record = {
        "chat_completion": True,
        "model": req.model,
        "moot": req.moot.model_dump(by_alias=True),
        # The request whole: another replica that takes the debate over builds it again from it.
        "request": req.model_dump(mode="json", by_alias=True, exclude_unset=True),
    }
    # Named as this request writes them: the question is a message, options are in moot.
    live = await submission.submit(
        asked,
        submission.Submission(
            settings,
            manager,
            record | asked.recorded,
            headers,
            "messages",
            idempotency.of_request(headers, "/v1/chat/completions", req),
        ),
    )
    return live, asked


def rebuild(debate_id: str, record: dict[str, Any], settings: ServerSettings) -> LiveDebate:
    """A chat completion's debate built again from its stored request (another replica takes it over)."""
    req = ChatCompletionRequest.model_validate(record["request"])
    return submission.rebuild(debate_id, read(req, settings), settings, "messages")


def usage_of(result: DebateResult) -> ChatUsage:
    u = result.usage
    return ChatUsage(
        prompt_tokens=u.prompt_tokens,
        completion_tokens=u.completion_tokens,
        total_tokens=u.total_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=u.cached_prompt_tokens),
    )


def info_of(live: LiveDebate, base: str) -> MootInfo:
    result = live.result
    return MootInfo(
        debate_id=live.id,
        protocol=live.spec.name,
        status=live.status,
        stop_reason=result.stop_reason if result else None,
        calls=result.llm_calls if result else 0,
        rounds=len(result.rounds) if result else 0,
        elapsed_s=round(result.elapsed_s, 3) if result else 0.0,
        url=f"{base}/debates/{live.id}",
        cost_usd=result.cost.usd if result is not None and result.cost is not None else None,
    )


def completion(live: LiveDebate, req: ChatCompletionRequest, base: str, asked: Asked) -> ChatCompletion:
    result = live.result
    assert result is not None  # (its answer: failure() said there is one)
    reply = asked.reply(result)
    reasoning = trace_text(result) if asked.trace else None
    calls = tool_calls_of(live.id, reply.call)
    message = AssistantMessage(content=None if calls else reply.text, reasoning_content=reasoning, tool_calls=calls)
    return ChatCompletion(
        id=f"moot-{live.id}",
        created=int(time.time()),
        model=req.model,
        choices=[ChatChoice(message=message, finish_reason=reply.finish)],
        usage=usage_of(result),
        moot=info_of(live, base),
    )


def _data(payload: ChatCompletionChunk | ErrorBody) -> str:
    data = payload.model_dump(mode="json")
    for key in ("usage", "moot"):  # extras only where they are set; the OpenAI fields always
        if data.get(key, 0) is None:
            del data[key]
    return json_bytes(data).decode()  # orjson: a chunk per streamed piece


def _event(payload: ChatCompletionChunk | ErrorBody) -> bytes:
    return sse_event(_data(payload))


#: The stream's last event.
_DONE = sse_event("[DONE]")


#: Stands for a chunk's text while its JSON is built once (``_text_chunks``).
_MARK = "\x00moot-content\x00"


def _text_chunks(cid: str, created: int, model: str, reasoning: bool = False) -> Callable[[str], bytes]:
    """The SSE event of a chunk carrying ``content`` (or ``reasoning_content``): the chunk's JSON is
    built once, and each piece of text only encoded into it (no pydantic model per streamed piece)."""
    delta = ChunkDelta(reasoning_content=_MARK) if reasoning else ChunkDelta(content=_MARK)
    sample = ChatCompletionChunk(id=cid, created=created, model=model, choices=[ChunkChoice(delta=delta)])
    head, _, tail = _data(sample).partition(json.dumps(_MARK, ensure_ascii=False))

    def chunk(piece: str) -> bytes:
        return sse_event(head + json.dumps(piece, ensure_ascii=False) + tail)

    return chunk


def _chunks(pieces: list[Piece], content: Callable[[str], bytes], reasoning: Callable[[str], bytes]) -> list[bytes]:
    """The feed's pieces as chunks: the trace's text in ``reasoning_content``, the reply's in
    ``content``; the text of consecutive pieces of one kind in one chunk."""
    out: list[bytes] = []
    kind, texts = "", list[str]()
    for piece in pieces:
        if isinstance(piece, AnswerText):
            this, text = "content", piece.text
        else:
            this = "reasoning"
            text = (
                piece.header if isinstance(piece, TurnStart) else piece.text if isinstance(piece, TurnText) else "\n\n"
            )
        if this != kind and texts:
            out.append((content if kind == "content" else reasoning)("".join(texts)))
            texts = []
        kind = this
        texts.append(text)
    if texts:
        out.append((content if kind == "content" else reasoning)("".join(texts)))
    return out


async def stream(live: LiveDebate, req: ChatCompletionRequest, base: str, asked: Asked) -> AsyncIterator[bytes]:
    """The chunks of a streamed chat completion (see the module's docstring)."""
    created = int(time.time())
    cid = f"moot-{live.id}"

    def chunk(delta: ChunkDelta, finish: str | None = None) -> bytes:
        return _event(
            ChatCompletionChunk(
                id=cid, created=created, model=req.model, choices=[ChunkChoice(delta=delta, finish_reason=finish)]
            )
        )

    content = _text_chunks(cid, created, req.model)
    reasoning = _text_chunks(cid, created, req.model, reasoning=True)
    yield chunk(ChunkDelta(role="assistant", content=""))
    feed = Feed(live, asked)
    async for pieces in feed.batches():
        for event in _chunks(pieces, content, reasoning):
            yield event
    pieces, outcome = await feed.finish()
    for event in _chunks(pieces, content, reasoning):
        yield event
    if outcome.failure is not None:
        failed = outcome.failure
        kind = "invalid_request_error" if failed.status < 500 else "server_error"  # (as the same failure unstreamed)
        yield _event(ErrorBody(error=ErrorDetail(message=failed.message, type=kind, code=failed.code)))
        yield _DONE
        return
    result = live.result
    assert result is not None
    calls = tool_calls_of(live.id, outcome.call, index=True)
    if calls:
        yield chunk(ChunkDelta(tool_calls=calls))
    elif outcome.rest:
        yield content(outcome.rest)
    last = ChatCompletionChunk(
        id=cid,
        created=created,
        model=req.model,
        choices=[ChunkChoice(delta=ChunkDelta(), finish_reason=outcome.finish)],
        moot=info_of(live, base),
    )
    yield _event(last)
    if req.stream_options is not None and req.stream_options.include_usage:
        yield _event(ChatCompletionChunk(id=cid, created=created, model=req.model, choices=[], usage=usage_of(result)))
    yield _DONE
