"""``POST /v1/chat/completions``: a debate behind the OpenAI chat protocol.

``model`` is ``moot/<preset>``; the last user message is the question and the earlier messages
are its context. The reply is the debate's decision. Streamed, the response is only standard
``chat.completion.chunk`` lines: the role at once, ``: keepalive`` comments while the rounds run,
then the decision's text as the decision call generates it (a synthesis streams as it is
generated, what came over the server's ``token_window_s`` in one chunk; a vote, a rule or a
judge's verdict is known at once when it is made), a final chunk with the
finish reason and the ``moot`` field, a usage chunk when ``stream_options.include_usage`` is set,
and ``[DONE]``. Usage is the sum over every call of the debate. The debate's own progress is on
``GET /v1/debates/{id}/events``; its id is in every chunk's ``id`` (``moot-<debate id>``).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping

from sse_starlette import ServerSentEvent

from moot.core.spec import SynthesizeDecision
from moot.core.types import ContextChunk, DebateResult
from moot.models.base import approx_tokens
from moot.protocols import get_preset, preset_names
from moot.server.manager import DebateManager, LiveDebate
from moot.server.policy import RequestError, prepare
from moot.server.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatUsage,
    ChunkChoice,
    ChunkDelta,
    ErrorBody,
    ErrorDetail,
    ModelCard,
    MootInfo,
    PromptTokensDetails,
)
from moot.server.settings import ServerSettings

PREFIX = "moot/"


def model_cards() -> list[ModelCard]:
    return [ModelCard(id=PREFIX + name, description=get_preset(name).description or name) for name in preset_names()]


def check_request(req: ChatCompletionRequest) -> str:
    """The preset a chat request names, after refusing what a debate cannot honour."""
    name = req.model.removeprefix(PREFIX) if req.model.startswith(PREFIX) else None
    if name is None or name not in preset_names():
        raise RequestError(
            f"model: {req.model!r} is not offered here; use moot/<protocol>, one of: "
            f"{', '.join(PREFIX + n for n in preset_names())} (GET /v1/models)",
            param="model",
            status=404,
            code="model_not_found",
        )
    if req.n not in (None, 1):
        raise RequestError("n: a debate gives one answer; leave n out or set it to 1", param="n")
    # Each field by its own name: a client on the legacy ``functions`` API is told about ``functions``.
    for field, value in (
        ("tools", req.tools),
        ("tool_choice", req.tool_choice not in (None, "none")),
        ("functions", req.functions),
        ("function_call", req.function_call not in (None, "none")),
    ):
        if value:
            pair = "tools and tool_choice" if field.startswith("tool") else "functions and function_call"
            raise RequestError(f"{field}: a debate model cannot call tools; leave {pair} out", param=field)
    if req.response_format is not None and req.response_format.get("type", "text") != "text":
        raise RequestError(
            "response_format: a debate answers in text; leave response_format out (typed debates: POST /v1/debates "
            "with a protocol whose turns use a schema)",
            param="response_format",
        )
    if req.logprobs or req.top_logprobs:
        raise RequestError("logprobs: a debate's answer has no log-probabilities; leave logprobs out", param="logprobs")
    if req.audio is not None or (req.modalities and set(req.modalities) - {"text"}):
        raise RequestError(
            "modalities: a debate answers in text only; leave modalities and audio out", param="modalities"
        )
    return name


def split_messages(req: ChatCompletionRequest) -> tuple[str, list[ContextChunk]]:
    """The last user message is the question; the other messages, in order, are its context."""
    last = max((i for i, m in enumerate(req.messages) if m.role == "user"), default=None)
    if last is None or not req.messages[last].text().strip():
        raise RequestError("messages: give at least one user message with text (the question)", param="messages")
    context = [
        ContextChunk(text=m.text(), source=m.role) for i, m in enumerate(req.messages) if i != last and m.text().strip()
    ]
    return req.messages[last].text(), context


def start(
    req: ChatCompletionRequest,
    manager: DebateManager,
    settings: ServerSettings,
    headers: Mapping[str, str] | None = None,
) -> LiveDebate:
    """Queue the debate a chat request asks for; ``headers``: the request's (its ``traceparent``)."""
    preset = check_request(req)
    question, context = split_messages(req)
    try:
        prepared = prepare(preset, question, context, req.moot, settings)
    except RequestError as exc:  # named as this request writes them: the question is a message, options are in moot
        raise exc.renamed({"question": "messages", "context": "messages", "protocol": "model"}, "moot") from None
    record = {"chat_completion": True, "model": req.model, "moot": req.moot.model_dump(by_alias=True)}
    return manager.submit(prepared.spec, prepared.task, prepared.engine, prepared.model, record, headers=headers)


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


def failure(live: LiveDebate) -> RequestError | None:
    """Why a finished debate has no answer to give, or None."""
    result = live.result
    if live.status == "complete" and result is not None and result.final_answer is not None:
        return None
    if live.status == "queued":  # the server stopped before it started (a chat completion is not run later)
        return RequestError(
            f"the server is stopping: debate {live.id} never started; send the request again once it is back",
            status=503,
            code="server_stopping",
        )
    reason = (result.error if result else None) or "no decision"
    status = 504 if live.status == "timeout" else 502
    return RequestError(
        f"the debate {live.id} ended {live.status}: {reason} (its transcript: GET /v1/debates/{live.id})",
        status=status,
        code=f"debate_{live.status}",
    )


def completion(live: LiveDebate, model: str, base: str) -> ChatCompletion:
    result = live.result
    assert result is not None and result.final_answer is not None
    return ChatCompletion(
        id=f"moot-{live.id}",
        created=int(time.time()),
        model=model,
        choices=[ChatChoice(message=AssistantMessage(content=result.final_answer))],
        usage=usage_of(result),
        moot=info_of(live, base),
    )


def _event(payload: ChatCompletionChunk | ErrorBody) -> ServerSentEvent:
    data = payload.model_dump(mode="json")
    for key in ("usage", "moot"):  # extras only where they are set; the OpenAI fields always
        if data.get(key, 0) is None:
            del data[key]
    return ServerSentEvent(data=json.dumps(data, separators=(",", ":"), ensure_ascii=False))


class TokenCount:
    """:func:`~moot.models.base.approx_tokens` of a text that grows piece by piece, at the cost of the
    new piece alone (counting the whole text again at every piece was quadratic in its length): a
    word split between two pieces is one token, as in the whole text."""

    def __init__(self) -> None:
        self.count = 0
        self._last = ""

    def after(self, piece: str) -> int:
        """The count of the text with ``piece`` added (not added yet: :meth:`add`)."""
        if not piece:
            return self.count
        joined = self._last and _WORD.match(self._last) and _WORD.match(piece[0])
        return self.count + approx_tokens(piece) - (1 if joined else 0)

    def add(self, piece: str) -> None:
        if piece:
            self.count = self.after(piece)
            self._last = piece[-1]


_WORD = re.compile(r"\w")
#: Stands for a chunk's content while its JSON is built once (``_content_chunks``).
_MARK = "\x00moot-content\x00"


def _content_chunks(cid: str, created: int, model: str) -> Callable[[str], ServerSentEvent]:
    """The SSE event of a chunk carrying ``content``: the chunk's JSON is built once, and each piece
    of text only encoded into it (no pydantic model per streamed piece)."""
    sample = ChatCompletionChunk(
        id=cid, created=created, model=model, choices=[ChunkChoice(delta=ChunkDelta(content=_MARK))]
    )
    head, _, tail = str(_event(sample).data).partition(json.dumps(_MARK, ensure_ascii=False))

    def chunk(piece: str) -> ServerSentEvent:
        return ServerSentEvent(data=head + json.dumps(piece, ensure_ascii=False) + tail)

    return chunk


async def stream(live: LiveDebate, req: ChatCompletionRequest, base: str) -> AsyncIterator[ServerSentEvent]:
    """The chunks of a streamed chat completion (see the module's docstring)."""
    created = int(time.time())
    cid = f"moot-{live.id}"

    def chunk(delta: ChunkDelta, finish: str | None = None) -> ServerSentEvent:
        return _event(
            ChatCompletionChunk(
                id=cid, created=created, model=req.model, choices=[ChunkChoice(delta=delta, finish_reason=finish)]
            )
        )

    content = _content_chunks(cid, created, req.model)
    yield chunk(ChunkDelta(role="assistant", content=""))
    decision = live.spec.decision
    token_limit = decision.max_tokens if isinstance(decision, SynthesizeDecision) else None
    sent: list[str] = []
    counted = TokenCount()
    holding = token_limit is None  # only a synthesis is streamed as it is generated
    in_decision = False
    async for batch in live.log.batches(0):
        pieces: list[str] = []  # the batch's new text: one chunk
        for event in batch:
            if event.name == "token":
                if not in_decision or holding:
                    continue
                piece = json.loads(event.data)["text"]
                # A reply longer than the decision's budget is trimmed by the engine: stop before it.
                if token_limit is not None and counted.after(piece) >= token_limit:
                    holding = True
                    continue
                counted.add(piece)
                pieces.append(piece)
            elif event.name == "turn_started":
                in_decision = json.loads(event.data)["kind"] == "decision"
            elif event.name == "turn_retry" and in_decision:
                holding = True  # the new attempt may say something else: send the final text at the end
            elif event.name == "turn_done":
                in_decision = False
        if pieces:
            sent += pieces
            yield content("".join(pieces))
    sent_text = "".join(sent)
    await live.done.wait()
    failed = failure(live)
    if failed is not None:
        yield _event(ErrorBody(error=ErrorDetail(message=failed.message, type="debate_failed", code=failed.code)))
        yield ServerSentEvent(data="[DONE]")
        return
    result = live.result
    assert result is not None and result.final_answer is not None
    final = result.final_answer
    if not final.startswith(sent_text):
        message = (
            f"the decision of debate {live.id} was generated again after a failed call and differs from the text "
            f"already sent; the answer is in GET /v1/debates/{live.id}"
        )
        yield _event(ErrorBody(error=ErrorDetail(message=message, type="debate_failed", code="stream_diverged")))
        yield ServerSentEvent(data="[DONE]")
        return
    if final[len(sent_text) :]:
        yield content(final[len(sent_text) :])
    last = ChatCompletionChunk(
        id=cid,
        created=created,
        model=req.model,
        choices=[ChunkChoice(delta=ChunkDelta(), finish_reason="stop")],
        moot=info_of(live, base),
    )
    yield _event(last)
    if req.stream_options is not None and req.stream_options.include_usage:
        yield _event(ChatCompletionChunk(id=cid, created=created, model=req.model, choices=[], usage=usage_of(result)))
    yield ServerSentEvent(data="[DONE]")
