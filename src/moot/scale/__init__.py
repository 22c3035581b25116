"""Where the debates of a run execute: in this process, or on a pool of Ray actors.

A run (``moot eval``, ``moot batch``, ``moot absa eval``) turns each item into a :class:`Job`, a
pydantic model that says what to run (a protocol spec and a task, or an ABSA sentence). An
*executor* runs it and hands back its outcome; the driver alone scores it and writes the store.
:class:`LocalExecutor` runs jobs in this process; :class:`moot.scale.ray_backend.RayExecutor` sends
them to Ray actors (``moot[ray]``), each of which holds one model for its whole life.
"""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from moot.models.base import BaseChatModel
from moot.models.registry import resolve_model
from moot.scale.jobs import (
    DebateJob,
    DebateOutcome,
    Executor,
    Job,
    JobFailed,
    LocalExecutor,
    Ran,
    WatchedModel,
    run_all,
)

__all__ = [
    "DebateJob",
    "DebateOutcome",
    "Executor",
    "Job",
    "JobFailed",
    "LocalExecutor",
    "Ran",
    "WatchedModel",
    "open_executor",
    "run_all",
]


@asynccontextmanager
async def open_executor(
    model: str | BaseChatModel | None,
    *,
    executor: Executor | None = None,
    ray: str | None = None,
    concurrency: int = 4,
    workers: int | None = None,
    worker_cpus: float = 1.0,
    model_options: dict[str, Any] | None = None,
) -> AsyncIterator[Executor]:
    """The executor a run asked for: the one given, Ray actors (``ray`` = ``local``, ``auto`` or an
    address; ``concurrency`` debates on each), or this process (``concurrency`` debates at once)."""
    if executor is not None:
        yield executor
    elif ray is not None:
        from moot.scale.ray_backend import RayExecutor

        async with RayExecutor(
            model, address=ray, workers=workers, worker_cpus=worker_cpus, per_worker=concurrency,
            model_options=model_options,
        ) as pool:  # fmt: skip
            yield pool
    else:
        local = LocalExecutor(resolve_model(model, **(model_options or {})), capacity=concurrency)
        try:
            yield local
        finally:
            # The HTTP client of this event loop (a run's asyncio.run) is closed with it.
            await local.model.aclose()
