"""``POST /v1/responses``: a debate behind OpenAI's Responses API (stored and chained by
``previous_response_id`` on the debate store: :mod:`moot.server.openai.responses_state`).

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
Every field is honoured or refused by name (:func:`~moot.server.openai.responses_request.responses_asked`).
"""

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from moot.server.asgi import api_router
from moot.server.limits import RequestError
from moot.server.openai import responses_state as state
from moot.server.openai import responses_stored, submission
from moot.server.openai.asked import Asked
from moot.server.openai.catalogue import debate_model
from moot.server.openai.debate_feed import failure
from moot.server.openai.response_objects import ResponseObject, Shell, final_response, turn_items
from moot.server.openai.responses_replay import Watchers, replay
from moot.server.openai.responses_request import ResponsesRequest, responses_asked, split_input
from moot.server.openai.responses_stream import stream
from moot.server.settings import ServerSettings
from moot.server.state import Store, idempotency
from moot.server.state.manager import DETACHED, DebateManager, LiveDebate


def rebuild(
    debate_id: str,
    record: dict[str, Any],
    settings: ServerSettings,
    watchers: Watchers | None = None,
    store: Store | None = None,
) -> LiveDebate:
    """A Responses request's debate built again from its stored request (another replica takes it
    over, or a restarted server runs a background response again), by the function that built it
    (:func:`~moot.server.openai.submission.rebuild`). A stored response's final form is kept when it
    ends, as its request would have kept it (``watchers``, ``store``: the server's)."""
    req = ResponsesRequest.model_validate(record["request"])
    asked = read(req, settings)
    live = submission.rebuild(debate_id, asked, settings, "input")
    raw = record.get(state.KEY)
    if watchers is not None and store is not None and isinstance(raw, dict):
        kept = state.Kept.model_validate(raw)
        if kept.store:
            watchers.watch(live, store, final_form(Shell(live, req, state.base_of(kept)), asked), kept, record)
    return live


def read(
    body: ResponsesRequest, settings: ServerSettings, debated: ResponsesRequest | None = None, earlier: int = 0
) -> Asked:
    """A Responses request read, once, into what it asks (:func:`responses_asked`): the model it names
    (else a 404), its input (``debated``: with a chain's conversation, of which ``earlier`` items came
    first, which a refusal's place counts), then its fields."""
    model = debate_model(body.model, tuned=settings.tuned)
    try:
        split = split_input(debated or body)
    except RequestError as exc:
        raise state.named_in_input(exc, earlier) from None
    read = submission.conversation(split.question, split.context, settings, "input")
    return responses_asked(body, model, *read, images=split.images)


def final_form(shell: Shell, asked: Asked) -> Callable[[], dict[str, Any]]:
    """The final response object of a stored response's debate (``shell.live``), once it has ended
    (failed or not)."""

    def final() -> dict[str, Any]:
        failed = failure(shell.live, asked)
        if failed is not None:
            result = shell.live.result
            shown = turn_items(shell.live.id, result) if asked.trace and result is not None else []
            return shell.response("failed", [*shown], error=failed.message).model_dump(mode="json")
        return final_response(shell, asked).model_dump(mode="json")

    return final


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
    asked = await submission.asked_off_loop(lambda: read(body, settings, debated, earlier), settings)
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
    # What is stored with the debate, whole: what the first form and the final are kept with.
    record.update(asked.recorded)
    if idem is not None:
        record.update(idem.recorded())
    live = await submission.submit(asked, submission.Submission(settings, manager, record, headers, "input", idem))
    return live, asked


def router(
    settings: ServerSettings,
    sse: state.SSE,
    responses: dict[int | str, dict[str, Any]],
    watchers: Watchers | None = None,
) -> APIRouter:
    """The route, for :func:`moot.server.create_app` (its stream helper and error responses;
    ``watchers``: those that keep each stored response's final form, shared with :func:`rebuild`)."""
    api = api_router()
    watchers = watchers if watchers is not None else Watchers()

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
            items = state.bounded(
                items, len(items) - new, settings.max_conversation_bytes, body.truncation != "disabled"
            )
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
        # What every form of this response repeats (the request's echoed fields), worked out once.
        shell = Shell(live, body, str(request.base_url).rstrip("/"))
        headers = {"x-moot-debate-id": live.id}
        if not stored:
            if body.stream:
                return sse(request, stream(shell, asked), headers)
            await live.ended()
            failed = failure(live, asked)
            if failed is not None:
                raise failed
            reply = final_response(shell, asked)
            return JSONResponse(reply.model_dump(mode="json"), headers=submission.cost_headers(live))
        kept = keep_first(manager, live, kept, shell, record)
        keeping = watchers.watch(live, manager.store, final_form(shell, asked), kept, record)
        if body.background:
            if body.stream:
                return sse(request, replay(manager, watchers, live.id, kept, None), headers)
            return JSONResponse(kept.first, headers=headers)

        def stamp(data: dict[str, Any]) -> dict[str, Any]:
            return state.stamped(data, kept)

        if body.stream:
            return sse(request, stream(shell, asked, stamp), headers)
        await live.ended()
        final = await asyncio.shield(keeping)  # the form kept, as GET /v1/responses/{id} shows it
        failed = failure(live, asked)
        if failed is not None:
            raise failed
        if final is None:  # (none could be kept here: made for this answer alone)
            final = state.stamped(final_response(shell, asked).model_dump(mode="json"), kept)
        return JSONResponse(final, headers=submission.cost_headers(live))

    api.include_router(responses_stored.router(sse, watchers, responses, ResponseObject))
    return api


def keep_first(
    manager: DebateManager, live: LiveDebate, kept: state.Kept, shell: Shell, record: dict[str, Any]
) -> state.Kept:
    """A stored response's first form (``queued``), kept with its debate's request (``record``, as
    :func:`begin` stored it)."""
    first = state.stamped(shell.response("in_progress", []).model_dump(mode="json"), kept, "queued")
    kept = kept.model_copy(update={"first": first, "response": first})
    state.keep(manager.store, live.id, record, kept)
    return kept
