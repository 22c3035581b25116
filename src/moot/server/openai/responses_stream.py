"""A streamed response's events (see :mod:`moot.server.openai.responses`), as values
(:class:`StreamEvent`), encoded once, where they are sent: SSE over HTTP (:func:`stream`), a text
message over the WebSocket."""

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from moot.files import json_bytes
from moot.server.openai.asked import Asked
from moot.server.openai.debate_feed import AnswerText, Feed, Piece, TurnEnd, TurnStart, TurnText
from moot.server.openai.response_objects import (
    FunctionCallItem,
    OutputMessage,
    OutputText,
    ReasoningItem,
    ReasoningText,
    Shell,
    function_call_item,
    reasoning_id,
)
from moot.server.state.events import sse_event


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One event of a streamed response: its type, and its data as plain JSON values (the response
    objects and items already dumped), encoded once, where it is sent (:meth:`text`, :meth:`sse`)."""

    kind: str
    data: dict[str, Any]

    def text(self) -> str:
        return _dumps(self.data)

    def sse(self) -> bytes:
        return sse_event(self.text(), event=self.kind)


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
    # orjson (moot.files.json_bytes): a streamed response sends a dozen events a call.
    return json_bytes(data).decode()


async def stream(
    shell: Shell, asked: Asked, stamp: Callable[[dict[str, Any]], dict[str, Any]] | None = None
) -> AsyncIterator[bytes]:
    """The SSE events of a streamed response (:func:`events`, each encoded once, here)."""
    async for event in events(shell, asked, stamp):
        yield event.sse()


async def events(
    shell: Shell, asked: Asked, stamp: Callable[[dict[str, Any]], dict[str, Any]] | None = None
) -> AsyncIterator[StreamEvent]:
    """The events of a streamed response (see the module's docstring), as values: the HTTP route
    sends each as SSE (:func:`stream`), the WebSocket as a text message, and reads the final
    response from the last one as it is, never decoding what it sent."""
    live = shell.live
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
                item = ReasoningItem(id=reasoning_id(live, len(output)), status="in_progress", content=[])
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

    feed = Feed(live, asked)
    async for pieces in feed.batches():
        for sse in events_of(pieces):
            yield sse
    pieces, outcome = await feed.finish()
    for sse in events_of(pieces):
        yield sse
    if outcome.failure is not None and outcome.failure.code == "server_stopping":
        # Not a failed response: its debate goes on at another replica or at the next start. An
        # error event with the code (as the chat stream's error chunk and a replay's) tells a client
        # to send the request again with its Idempotency-Key, where response.failed would read as final.
        failed = outcome.failure
        yield event("error", code=failed.code, message=failed.message, param=None)
        return
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
