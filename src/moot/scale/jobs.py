"""Jobs, executors and the bounded loop every run shares.

A :class:`Job` is data (pydantic: it crosses process and machine boundaries as is) with one
method, :meth:`Job.execute`, that runs it on a model and returns a pydantic outcome. A job never
touches a store: the driver that submitted it records the outcome, once.

An executor runs jobs: :class:`LocalExecutor` in this process; the Ray one on actors
(:mod:`moot.scale.ray_backend`). Both raise :class:`~moot.models.base.ModelConfigError` when the
model cannot be used at all (missing weights, a bad key), so a run stops instead of recording
every item as failed, and both report how many attempts a job took and where it ran.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from pydantic import BaseModel

import moot.protocols  # noqa: F401  (the presets' turn schemas, which the specs a job carries name)
from moot.core.engine import DebateFailed, DebateTimeout, Engine
from moot.core.spec import ProtocolSpec
from moot.core.types import DebateResult, DebateTask
from moot.models.base import (
    BaseChatModel,
    ChatRequest,
    ChatResponse,
    ModelConfigError,
    RetryCallback,
    TokenCallback,
    UnreachableModelError,
    WrappedModel,
)
from moot.models.cache import CachedModel, CacheEntry, MemoryCache, SqliteCache
from moot.models.registry import resolve_model
from moot.secrets import redact

R = TypeVar("R", bound=BaseModel)


class Job(BaseModel, Generic[R]):
    """One unit of work, as data. Subclasses say what ``execute`` does with a model."""

    async def execute(self, model: BaseChatModel) -> R:
        raise NotImplementedError


class DebateOutcome(BaseModel):
    """What a debate job gives back: the transcript (partial after a timeout) and why it failed,
    and the request-cache entries it added (a job that carried its item's cache to a worker)."""

    result: DebateResult | None = None
    error: str | None = None
    cache_entries: list[CacheEntry] = []


class DebateJob(Job[DebateOutcome]):
    """One debate: a protocol spec (already fitted to its item) on one task."""

    spec: ProtocolSpec
    task: DebateTask
    #: The run's request-cache entries of this job's item (key -> reply), when the job runs away
    #: from the run's store (a Ray worker) or shares calls with the item's other jobs: the debate is
    #: served from them first, and its outcome brings back the entries it added.
    cache: dict[str, str] | None = None

    def routed(self, model: BaseChatModel) -> dict[str, str | BaseChatModel] | None:
        """Participants (and a decision) on a model of their own, a heterogeneous panel's, behind
        the same layers as the job's ``model``: the run's request cache and its watch, so that a
        second model's replies are shared and its bad key stops the run like the first's."""
        if not isinstance(model, WrappedModel):
            return None
        own: dict[str, str] = {p.id: p.model for p in self.spec.participants if p.model}
        decision = getattr(self.spec.decision, "model", None)
        if isinstance(decision, str) and self.spec.decision_calls:
            own["decision"] = decision
        return {key: model.around(resolve_model(spec)) for key, spec in own.items()} or None

    async def execute(self, model: BaseChatModel) -> DebateOutcome:
        if self.cache is None:
            return await self._debate(model)
        shared = MemoryCache(self.cache)
        outcome = await self._debate(CachedModel(model, shared))
        return outcome.model_copy(update={"cache_entries": shared.added})

    async def _debate(self, model: BaseChatModel) -> DebateOutcome:
        try:
            result = await Engine(self.spec, model, models=self.routed(model)).run(self.task)
        except DebateTimeout as exc:
            return DebateOutcome(result=exc.result, error=str(exc))
        except DebateFailed as exc:
            return DebateOutcome(result=exc.result, error=redact(str(exc)))
        except ModelConfigError:
            raise
        except Exception as exc:  # a failed item is recorded, never replaced
            return DebateOutcome(error=redact(f"{exc}"))
        return DebateOutcome(result=result)


@dataclass
class Ran(Generic[R]):
    """A job's outcome, with how many attempts it took and the worker that finished it."""

    value: R
    attempts: int = 1
    worker: str | None = None


class JobFailed(Exception):
    """The executor could not run a job (its worker died on every attempt, or the job raised): the
    item is recorded as failed with this reason."""


class Executor(Protocol):
    """Runs jobs somewhere; ``capacity`` is how many it takes at once."""

    @property
    def capacity(self) -> int: ...

    async def run(self, job: Job[R]) -> Ran[R]: ...

    def describe(self) -> str: ...


class WatchedModel(WrappedModel):
    """A run's model, watched: a :class:`ModelConfigError` (missing weights, a bad key) is kept so
    the run stops after the item it broke, instead of recording every item as failed. (The engine
    isolates a failing participant, so the error would otherwise only show up in the transcript.)"""

    def __init__(self, inner: BaseChatModel, report_to: WatchedModel | None = None) -> None:
        super().__init__(inner)
        self.config_error: ModelConfigError | None = None
        #: The run's own watch, when this one watches another model of the same run.
        self.report_to = report_to

    def _layer(self, inner: BaseChatModel) -> WatchedModel:
        return WatchedModel(inner, report_to=self.report_to or self)

    async def complete(
        self, request: ChatRequest, on_token: TokenCallback | None = None, on_retry: RetryCallback | None = None
    ) -> ChatResponse:
        try:
            return await self.inner.complete(request, on_token, on_retry)
        except ModelConfigError as exc:
            self._stop(exc)
            raise
        except UnreachableModelError as exc:
            # Its endpoint answered none of the attempts: every item would fail the same way, and be
            # recorded failed for good. The run stops instead, this item not recorded; re-run to resume.
            self._stop(
                ModelConfigError(
                    f"{exc}: the run stops here; start the model's server, or correct its address (--base-url "
                    "or $OPENAI_BASE_URL), then re-run"
                )
            )
            raise

    def _stop(self, exc: ModelConfigError) -> None:
        self.config_error = exc
        if self.report_to is not None:
            self.report_to.config_error = exc


class LocalExecutor:
    """Jobs in this process, on one model (its own concurrency limit applies)."""

    def __init__(self, model: BaseChatModel, capacity: int = 4) -> None:
        self.model = model if isinstance(model, WatchedModel) else WatchedModel(model)
        self._capacity = max(1, capacity)

    @property
    def capacity(self) -> int:
        return self._capacity

    async def run(self, job: Job[R]) -> Ran[R]:
        if self.model.config_error is not None:
            raise self.model.config_error
        value = await job.execute(self.model)
        if self.model.config_error is not None:
            raise self.model.config_error
        return Ran(value, attempts=1, worker="local")

    def describe(self) -> str:
        return f"local: {self._capacity} debate(s) at once, model {self.model.name}"


async def run_carrying(executor: Executor, job: DebateJob, cache: SqliteCache, item_id: str) -> Ran[DebateOutcome]:
    """Run ``job`` on ``executor`` carrying ``item_id``'s entries of the run's request ``cache`` (so
    a worker away from the store is served what the item's earlier jobs asked), and store the
    entries it added back under the item: this process alone writes the cache."""
    ran = await executor.run(job.model_copy(update={"cache": cache.for_item(item_id)}))
    for entry in ran.value.cache_entries:
        cache.put_raw(entry, item_id)
    return ran


async def run_all(jobs: Iterable[Awaitable[None]]) -> None:
    """Run every job at once (each bounds itself); the first exception cancels the others, is
    waited for, and propagates. A job commits its own result, so nothing finished is lost."""
    tasks = [asyncio.ensure_future(j) for j in jobs]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
