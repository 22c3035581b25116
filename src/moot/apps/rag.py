"""Seed 000's ``DebateEngine``: the affirmative/critical debate behind a seed-compatible facade.

    result = await DebateEngine(model="embedded").run_debate(
        query="What is RAG?", context=[{"text": "..."}], max_rounds=2, timeout=10.0
    )
    result.final_answer, result.llm_calls, result.elapsed

It is a thin composition: the ``affirmative-critical`` preset run by the one engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from moot.core.engine import DebateFailed, Engine
from moot.core.events import EventHandler
from moot.core.types import ContextChunk, DebateResult, DebateTask
from moot.models.base import BaseChatModel, Usage
from moot.protocols.affirmative_critical import affirmative_critical


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
        chunks = [
            c if isinstance(c, ContextChunk) else ContextChunk(text=c) if isinstance(c, str) else ContextChunk(**c)
            for c in context
        ]
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
