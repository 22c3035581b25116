"""Seed 000: the affirmative/critical debate, as a facade and as a RAG pipeline step.

The facade, seed-compatible::

    result = await DebateEngine(model="embedded").run_debate(
        query="What is RAG?", context=[{"text": "..."}], max_rounds=2, timeout=10.0
    )
    result.final_answer, result.llm_calls, result.elapsed

It is a thin composition: the ``affirmative-critical`` preset run by the one engine.

The pipeline step (seed 000 phase 4), for a state with a query, retrieved chunks and an initial
answer::

    update = await debate_step(state)                   # off unless debate_mode / MOOT_DEBATE_MODE
    update = await debate_step(state, settings={"debate_mode": True}, model="openai:gpt-4o-mini")
    state |= update                                     # or return it from a LangGraph node

Behind the ``debate_mode`` flag (a setting, else the environment's ``MOOT_DEBATE_MODE``; off by
default) it runs the debate within the step's budget (10 s) and replaces the answer with the
synthesis. On a timeout or any error it keeps the initial answer, logs why and says so in the
step's record (``state["debate"]``: status, elapsed_ms, reason). With the flag off it resolves no
model and calls nothing.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from moot.core.engine import DebateFailed, DebateTimeout, Engine
from moot.core.events import EventHandler
from moot.core.types import ContextChunk, DebateResult, DebateTask
from moot.models.base import BaseChatModel, Usage
from moot.protocols.affirmative_critical import affirmative_critical
from moot.secrets import redact

logger = logging.getLogger(__name__)


class RagDebateResult(BaseModel):
    """The seed's result fields, plus the full transcript and token usage."""

    affirmative_answer: str | None
    critical_answer: str | None
    final_answer: str | None
    rounds: int
    llm_calls: int
    elapsed: float
    usage: Usage
    transcript: DebateResult


def context_chunk(value: Any) -> ContextChunk:
    """One retrieved chunk as a :class:`ContextChunk`: a string, a mapping with ``text`` (or
    ``page_content`` / ``content``), a ``ContextChunk``, or an object with ``page_content`` and
    ``metadata`` (a LangChain ``Document``)."""
    if isinstance(value, ContextChunk):
        return value
    if isinstance(value, str):
        return ContextChunk(text=value)
    if isinstance(value, Mapping):
        if "text" in value:
            return ContextChunk(**value)
        for key in ("page_content", "content"):
            if isinstance(value.get(key), str):
                rest = {k: v for k, v in value.items() if k != key}
                return ContextChunk(text=value[key], **rest)
        raise ValueError(f"a context chunk needs a 'text' (or 'page_content'/'content'); got keys {sorted(value)}")
    text = getattr(value, "page_content", None)
    if isinstance(text, str):
        metadata = getattr(value, "metadata", None)
        source = metadata.get("source") if isinstance(metadata, Mapping) else None
        return ContextChunk(text=text, source=source if isinstance(source, str) else None)
    raise TypeError(f"cannot use a {type(value).__name__} as a context chunk; give a string or a dict with 'text'")


class DebateEngine:
    """Seed-compatible facade. The constructor loads and calls nothing."""

    def __init__(
        self,
        model: str | BaseChatModel | None = None,
        *,
        max_tokens: int = 500,
        synthesis_max_tokens: int = 800,
        on_event: EventHandler | None = None,
        **model_options: Any,
    ) -> None:
        self.model = model
        self.max_tokens = max_tokens
        self.synthesis_max_tokens = synthesis_max_tokens
        self.on_event = on_event
        self.model_options = model_options

    async def run_debate(
        self,
        query: str,
        context: Sequence[Mapping[str, Any] | ContextChunk | str] = (),
        max_rounds: int = 2,
        timeout: float | None = 10.0,  # noqa: ASYNC109 - the seed's API; enforced by the engine
        *,
        synthesize: bool = True,
        max_calls: int | None = None,
    ) -> RagDebateResult:
        """Run the debate. Raises ``TimeoutError`` (:class:`~moot.core.engine.DebateTimeout`, with
        the partial transcript) past ``timeout``, and :class:`~moot.core.engine.DebateFailed` when
        no decision could be made (every call failed, say)."""
        spec = affirmative_critical(
            max_rounds,
            synthesize=synthesize,
            timeout_s=timeout,
            max_tokens=self.max_tokens,
            synthesis_max_tokens=self.synthesis_max_tokens,
            max_calls=max_calls,
        )
        if isinstance(context, str | bytes | Mapping | ContextChunk):
            # (a string is a sequence too: its characters became the passages)
            raise TypeError(
                f"context is a list of passages (strings, {{'text': ..., 'source': ...}} or ContextChunk), not one "
                f"{type(context).__name__}: give [context] for a single passage"
            )
        chunks = [context_chunk(c) for c in context]
        engine = Engine(spec, self.model, on_event=self.on_event, **self.model_options)
        result = await engine.run(DebateTask(question=query, context=chunks))
        if result.status != "complete":
            raise DebateFailed(result)
        return RagDebateResult(
            affirmative_answer=result.last_answer("affirmative"),
            critical_answer=result.last_answer("critical"),
            final_answer=result.final_answer,
            rounds=len(result.rounds),
            llm_calls=result.llm_calls,
            elapsed=result.elapsed_s,
            usage=result.usage,
            transcript=result,
        )


# ------------------------------------------------------------------------- the pipeline step

#: The environment variable read when no setting says whether the debate step is on.
DEBATE_MODE_ENV = "MOOT_DEBATE_MODE"
TRUTHY = frozenset({"1", "true", "yes", "on"})
#: Where the step looks for the query and the retrieved chunks, first match wins.
QUERY_KEYS = ("query", "question")
CONTEXT_KEYS = ("context", "documents", "retrieved_chunks", "chunks")


def debate_mode_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """``MOOT_DEBATE_MODE`` is one of 1/true/yes/on (any case); anything else, or unset, is off."""
    value = (os.environ if environ is None else environ).get(DEBATE_MODE_ENV, "")
    return value.strip().lower() in TRUTHY


class DebateStepSettings(BaseModel):
    """The step's flag and budget. Defaults are the seed's: off, 2 rounds, 10 s, 500/800 tokens."""

    model_config = ConfigDict(extra="forbid")

    debate_mode: bool | None = Field(default=None, description=f"on/off; None: read ${DEBATE_MODE_ENV}")
    model: str | None = Field(default=None, description="model spec (default: $MOOT_MODEL or embedded)")
    rounds: int = Field(default=2, ge=1)
    timeout_s: float | None = Field(default=10.0, gt=0, description="the step's budget for the whole debate")
    max_tokens: int = Field(default=500, ge=1, description="per debater turn")
    synthesis_max_tokens: int = Field(default=800, ge=1)
    max_calls: int | None = Field(default=None, ge=1)
    answer_key: str = Field(default="answer", description="the state key of the answer, read and replaced")
    record_key: str = Field(default="debate", description="the state key the step's record is written to")

    @classmethod
    def of(cls, settings: DebateStepSettings | Mapping[str, Any] | None) -> DebateStepSettings:
        """Settings from a model, or from a pipeline's config/flags mapping (its other keys are ignored)."""
        if settings is None:
            return cls()
        if isinstance(settings, DebateStepSettings):
            return settings
        return cls.model_validate({k: v for k, v in settings.items() if k in cls.model_fields})

    def enabled(self) -> bool:
        return self.debate_mode if self.debate_mode is not None else debate_mode_from_env()


StepStatus = Literal["applied", "disabled", "timeout", "error"]


class DebateStepRecord(BaseModel):
    """What the step did, written to the state (``state["debate"]``) as a plain dict."""

    #: ``applied``: the answer is the synthesis; ``disabled``: the flag is off (nothing ran);
    #: ``timeout`` / ``error``: the initial answer was kept, ``reason`` says why.
    status: StepStatus
    elapsed_ms: float
    reason: str | None = None
    rounds: int = 0
    llm_calls: int = 0
    timeout_s: float | None = None


def describe_error(exc: BaseException) -> str:
    """``Type: message``; for an exception group (from parallel turns), its distinct leaf exceptions."""
    if isinstance(exc, BaseExceptionGroup):
        leaves: list[str] = []
        for sub in exc.exceptions:
            text = describe_error(sub)
            if text not in leaves:
                leaves.append(text)
        return "; ".join(leaves)
    return f"{type(exc).__name__}: {exc}"


def _first(state: Mapping[str, Any], keys: Sequence[str]) -> Any:
    for key in keys:
        if state.get(key) is not None:
            return state[key]
    return None


async def debate_step(
    state: Mapping[str, Any],
    *,
    model: str | BaseChatModel | None = None,
    settings: DebateStepSettings | Mapping[str, Any] | None = None,
    on_event: EventHandler | None = None,
) -> dict[str, Any]:
    """The debate step of a RAG pipeline. Returns the state update: the record under
    ``settings.record_key`` and, when the debate succeeded, the synthesis under ``answer_key``.

    ``state`` needs the query (``query`` or ``question``) and may have the retrieved chunks
    (``context``, ``documents``, ``retrieved_chunks`` or ``chunks``: strings, dicts with ``text``
    or LangChain documents). ``model`` overrides ``settings.model``.
    """
    t0 = time.perf_counter()
    cfg = DebateStepSettings.of(settings)

    def record(status: StepStatus, reason: str | None = None, result: DebateResult | None = None) -> dict[str, Any]:
        rec = DebateStepRecord(
            status=status,
            elapsed_ms=(time.perf_counter() - t0) * 1000,
            reason=reason,
            rounds=len(result.rounds) if result is not None else 0,
            llm_calls=result.llm_calls if result is not None else 0,
            timeout_s=cfg.timeout_s if status != "disabled" else None,
        )
        return {cfg.record_key: rec.model_dump()}

    if not cfg.enabled():
        logger.debug("debate step skipped: debate_mode is off")
        return record("disabled")
    try:
        query = _first(state, QUERY_KEYS)
        if not isinstance(query, str) or not query.strip():
            raise ValueError(f"the pipeline state has no query (looked for {', '.join(QUERY_KEYS)})")
        chunks = [context_chunk(c) for c in _first(state, CONTEXT_KEYS) or []]
        engine = DebateEngine(
            model if model is not None else cfg.model,
            max_tokens=cfg.max_tokens,
            synthesis_max_tokens=cfg.synthesis_max_tokens,
            on_event=on_event,
        )
        outcome = await engine.run_debate(
            query, chunks, max_rounds=cfg.rounds, timeout=cfg.timeout_s, max_calls=cfg.max_calls
        )
    except TimeoutError as exc:
        reason = redact(str(exc))
        logger.warning("debate step timed out, keeping the initial answer: %s", reason)
        return record("timeout", reason, exc.result if isinstance(exc, DebateTimeout) else None)
    except Exception as exc:
        reason = redact(describe_error(exc))
        logger.warning("debate step failed, keeping the initial answer: %s", reason)
        return record("error", reason, exc.result if isinstance(exc, DebateFailed) else None)
    if not outcome.final_answer or not outcome.final_answer.strip():
        reason = "the debate gave an empty synthesis"
        logger.warning("debate step failed, keeping the initial answer: %s", reason)
        return record("error", reason, outcome.transcript)
    update = record("applied", None, outcome.transcript)
    logger.info(
        "debate step applied: %d rounds, %d calls, %.0f ms",
        outcome.rounds,
        outcome.llm_calls,
        update[cfg.record_key]["elapsed_ms"],
    )
    return {cfg.answer_key: outcome.final_answer, **update}


class DebateStep(Protocol):
    """A pipeline node: the state (any mapping) in, the state update out; a LangGraph node as it is."""

    def __call__(self, state: Any) -> Awaitable[dict[str, Any]]: ...


def make_debate_step(
    model: str | BaseChatModel | None = None,
    settings: DebateStepSettings | Mapping[str, Any] | None = None,
    *,
    on_event: EventHandler | None = None,
) -> DebateStep:
    """:func:`debate_step` with its model and settings bound: a pipeline node (``add_node("debate", ...)``)."""
    bound = DebateStepSettings.of(settings)

    async def step(state: Mapping[str, Any]) -> dict[str, Any]:
        return await debate_step(state, model=model, settings=bound, on_event=on_event)

    step.__name__ = "debate_step"
    return step
