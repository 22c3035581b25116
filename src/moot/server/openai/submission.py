"""A read OpenAI request's debate, queued (:func:`submit`), or built again from its stored request
(:func:`rebuild`), by one function (:func:`prepared_debate`); what it cost, in headers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from moot.core.types import ContextChunk
from moot.models.registry import resolve_model
from moot.server.limits import RequestError
from moot.server.openai import input_files
from moot.server.openai.asked import Asked
from moot.server.openai.conversation import (
    conversation_parts,
)
from moot.server.openai.refusals import FieldRefusal
from moot.server.policy import Prepared, prepare
from moot.server.settings import ServerSettings
from moot.server.state import idempotency
from moot.server.state.manager import DebateManager, LiveDebate

log = logging.getLogger("moot.server")

# ------------------------------------------------------------------------------------ submitting

#: The threads that read a request's tools and schemas: checking a schema against its metaschema
#: costs about 25 ms a kilobyte in pure Python (a request at the limits, several seconds), which the
#: event loop must not wait for; two at a time, apart from the threads model calls run in.
#: Requests are read here (their schemas built, their files read), off the event loop. Four, not two:
#: two requests with files at their time bound (MAX_REQUEST_FILE_SECONDS) leave two threads for others.
_SCHEMA_WORKERS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="moot-schemas")
Request = TypeVar("Request")
Result = TypeVar("Result")


async def asked_off_loop(read: Callable[[], Asked], settings: ServerSettings) -> Asked:
    """``read()``, a request read into what it asks (its model, its messages, its fields), with its
    schemas built (:meth:`Asked.compile`), in a worker thread: the event loop goes on serving other
    requests meanwhile (a request's inline files are read into text there too:
    :mod:`moot.server.openai.input_files`, a PDF's text costs seconds at the body limit). Then the
    server's embedded models are made ready to count tokens (:func:`models_ready`)."""
    asked = await asyncio.get_running_loop().run_in_executor(
        _SCHEMA_WORKERS, lambda: input_files.within_file_budget(lambda: read().compile())
    )
    await models_ready(settings, asked)
    return asked


async def models_ready(settings: ServerSettings, asked: Asked | None = None) -> None:
    """The embedded models a request's debate uses (its ``moot.model`` and ``moot.models``, else the
    server's default) loaded (in a thread, at the first such request, as its first call would load
    them): its conversation is then cut to fit by the model's own tokenizer
    (:func:`~moot.server.policy.fit_conversation`), not by moot's estimate, which counts under it (a
    client pass: cut by the estimate, a long conversation came to 4,736 tokens of a 4,096 window). A
    model that cannot be loaded here is left to the debate's own call to report (a review: a model the
    request did not use, failing to load, was a 500 for every request)."""
    options = asked.options if asked is not None else None
    names = {options.model if options is not None and options.model else settings.default_model}
    names |= set(options.models.values()) if options is not None else set()
    for name in sorted(n for n in names if n == "embedded" or n.startswith("embedded:")):
        if name in _UNLOADABLE:
            continue
        try:
            await resolve_model(name).ready_to_count()
        except Exception as exc:  # (not installed, or llama.cpp refused it: the debate says so, once)
            _UNLOADABLE.add(name)
            log.warning("%s could not be loaded to count tokens (%s); its prompts are fitted by estimate", name, exc)


#: Embedded models :func:`models_ready` could not load (not tried again).
_UNLOADABLE: set[str] = set()


async def off_loop(read: Callable[[], Result]) -> Result:
    """``read()`` in a worker thread (one of :func:`asked_off_loop`'s)."""
    return await asyncio.get_running_loop().run_in_executor(_SCHEMA_WORKERS, input_files.within_file_budget, read)


@dataclass(frozen=True)
class Submission:
    """Where a request's debate goes, and how its refusals are named."""

    settings: ServerSettings
    manager: DebateManager
    record: dict[str, Any]
    headers: Mapping[str, str] | None
    #: The field that holds the question and its context in this request (``messages``, ``input``).
    messages: str
    #: The request's ``Idempotency-Key`` (:mod:`moot.server.state.idempotency`): the debate it names is joined.
    idempotency: idempotency.Idempotency | None = None


async def submit(asked: Asked, to: Submission) -> LiveDebate:
    """Queue the debate a request asks for (:func:`prepared_debate`, built in a worker thread: a
    conversation at the body limit took 0.2 s to fit to the prompt budget, which held the event loop,
    a review found); a refusal names the fields as this request writes them (the question is in
    ``to.messages``, options in ``moot``)."""
    try:
        prepared = await off_loop(lambda: prepared_debate(asked, to.settings))
        if to.idempotency is not None:
            live = idempotency.submit_once(to.manager, prepared, to.record, to.idempotency, to.headers)
        else:
            live = to.manager.submit(
                prepared.spec, prepared.task, prepared.engine, prepared.model, to.record, headers=to.headers
            )
    except RequestError as exc:
        if not isinstance(exc, FieldRefusal | idempotency.KeyRefusal):
            raise as_written(exc, to.messages) from None
        raise
    return live


def as_written(exc: RequestError, messages: str) -> RequestError:
    """A refusal of :func:`~moot.server.policy.prepare` (which names the debates API's fields) with the
    fields named as an OpenAI request writes them: the question and its context are in ``messages``
    (``messages``, ``input``), the protocol is the ``model``, every other option is in ``moot``."""
    return exc.renamed({"question": messages, "context": messages, "images": messages, "protocol": "model"}, "moot")


def conversation(
    question: str, context: list[ContextChunk], settings: ServerSettings, messages: str
) -> tuple[str, list[ContextChunk], str]:
    """A request's conversation as its debate reads it, when the request is read (``chat.read``,
    ``responses.read``): its question, its context and the caller's instructions (its system and
    developer messages; a bare nudge is not the question: :func:`conversation_parts`), within this
    server's limit on messages (``messages``: the field that holds them, named in a refusal)."""
    limit = settings.limits.max_messages
    if len(context) + 1 > limit:
        raise FieldRefusal(
            f"{messages}: {len(context) + 1} messages is over this server's limit of {limit} (moot serve "
            "--max-messages); send the most recent ones (the oldest are left out anyway when they do not fit the "
            "debate's prompt budget)",
            messages,
        )
    return conversation_parts(question, context)


def prepared_debate(asked: Asked, settings: ServerSettings) -> Prepared:
    """The debate an OpenAI request asks for, as :meth:`Asked.adjust` makes it: the one way it is built,
    when the request comes in (:func:`submit`) and when its stored request is built again (:func:`rebuild`),
    from what the request was read into (:func:`conversation`), the conversation fitted to the prompt
    budget (:func:`~moot.server.policy.fit_conversation`). The request's own schemas go to the
    debate's engine as values (:attr:`Asked.schemas`)."""
    return prepare(
        asked.protocol,
        asked.question,
        asked.context,
        asked.options,
        settings,
        images=asked.images,
        adjust=asked.adjust,
        schemas=asked.schemas,
        conversation=True,
        truncate=asked.truncate,
    )


def rebuild(debate_id: str, asked: Asked, settings: ServerSettings, messages: str) -> LiveDebate:
    """The debate of a stored OpenAI request built again, by the function that built it at its
    submission (:func:`prepared_debate`), to be taken over by another replica or run again after a
    restart (:meth:`DebateManager._rebuild`); a :class:`RequestError` if it cannot be, naming the
    request's fields as :func:`submit` does (``messages``: the field that holds the question)."""
    try:
        prepared = prepared_debate(asked.compile(), settings)
    except FieldRefusal:
        raise
    except RequestError as exc:
        raise as_written(exc, messages) from None
    return LiveDebate(
        id=debate_id, spec=prepared.spec, task=prepared.task, engine=prepared.engine, model=prepared.model
    )


def cost_headers(live: LiveDebate) -> dict[str, str]:
    """What a debate cost, in response headers (the convention proxies that fan one request out to
    many calls follow): its id, its calls and tokens, and US dollars when every model is priced."""
    headers = {"x-moot-debate-id": live.id}
    result = live.result
    if result is None:
        return headers
    headers["x-moot-calls"] = str(result.llm_calls)
    headers["x-moot-total-tokens"] = str(result.usage.total_tokens)
    headers["x-moot-cached-tokens"] = str(result.usage.cached_prompt_tokens)
    if result.cost is not None and result.cost.usd is not None:
        headers["x-moot-cost-usd"] = f"{result.cost.usd:.8f}"
    return headers
