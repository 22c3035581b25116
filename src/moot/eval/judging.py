"""``moot eval judge``: the judged quality dimensions of a run's transcripts, one judge call each,
stored in the run as they come (resumable; one judge at a time per run). :mod:`moot.eval.quality`
reads what it stored."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from moot.core.types import DebateQuality
from moot.eval.store import RunStore
from moot.models.base import BaseChatModel
from moot.quality.judge import RUBRIC_VERSION, judge_debate, judged_scores
from moot.runlock import RunLock

#: The lock file a judge holds in the run folder (beside the run's own ``run.lock``).
JUDGE_LOCK = "judge.lock"


class JudgeRequestError(ValueError):
    """``moot eval judge`` was asked for what the run does not hold (a protocol it did not run)."""


async def judge_run(
    folder: Path,
    judge: BaseChatModel,
    *,
    concurrency: int = 4,
    on_done: Callable[[int, int], None] | None = None,
    protocols: Sequence[str] | None = None,
    limit: int | None = None,
) -> tuple[int, int, list[str]]:
    """Judge every finished transcript of the run that this judge has not judged yet (of ``protocols``
    only, and of the run's first ``limit`` items only, when given: a sample costs fewer calls). A
    judgement is stored as it comes, with the judge's rationale, calls and tokens; a failed one (a
    model error, an unparsable reply) is not, so running the command again retries it. Returns
    (judged now, judged before, the errors of the failed ones). A protocol the run does not hold is
    refused (:class:`JudgeRequestError`) before any call."""
    store = RunStore.open(folder)
    try:
        # Two judges on one run would both pay for every judgement: one at a time (a run may go on).
        lock = RunLock.acquire(folder, JUDGE_LOCK, hint="judge another run")
    except BaseException:
        store.close()
        raise
    try:
        labels = store.config.protocols
        unknown = [p for p in protocols or [] if p not in labels]
        if unknown:
            raise JudgeRequestError(
                f"--protocol {unknown[0]}: the run holds no such protocol; it holds {', '.join(labels)}"
            )
        chosen = [p for p in labels if p in protocols] if protocols else labels
        wanted = {i.id for i in store.items()[:limit]} if limit is not None else None
        done = set(store.judgements(RUBRIC_VERSION, judge=judge.name))
        todo = [
            (label, item_id, result)
            for label in chosen
            for item_id, result in store.transcripts(label).items()
            if (label, item_id) not in done and result.status != "running" and (wanted is None or item_id in wanted)
        ]
        done = {key for key in done if key[0] in chosen and (wanted is None or key[1] in wanted)}
        gate = asyncio.Semaphore(max(1, concurrency))
        errors: list[str] = []
        judged = 0

        async def one(label: str, item_id: str, result: Any) -> None:
            nonlocal judged
            async with gate:
                outcome = await judge_debate(result, judge)
            if outcome.judgement is None:
                errors.append(f"{label} {item_id}: {outcome.error}")
                return
            # The judge's whole output is kept (levels and rationale, calls and tokens): every figure
            # the report and `moot quality validate` give for the judged dimensions is re-derived from it.
            quality = DebateQuality(
                judge=judge.name,
                judge_calls=outcome.calls,
                judge_usage=outcome.usage,
                scores=judged_scores(outcome.judgement),
            )
            store.save_judgement(label, item_id, RUBRIC_VERSION, quality)
            judged += 1
            if on_done is not None:
                on_done(judged, len(todo))

        await asyncio.gather(*(one(*job) for job in todo))
        return judged, len(done), errors
    finally:
        store.close()
        lock.release()
