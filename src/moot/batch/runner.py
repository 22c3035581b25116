"""``moot batch``: one debate per input, durable and resumable, here or on Ray.

A thin adapter: the inputs and results live in the eval harness's :class:`~moot.eval.store.RunStore`
(one SQLite file per run folder: the config, the inputs in order, one row and transcript per
input, committed as each finishes); each input is one :class:`~moot.scale.DebateJob` run by an
executor (this process, or Ray actors); the loop is :func:`~moot.scale.run_all`. Re-running the
same batch resumes it; a changed config or changed inputs are refused; inputs appended to the
file extend it.

``vote@uab(budget=B, cap=K)`` moves a sample budget between the inputs (UAB, arXiv 2605.26849): one
sample of every input first, whose probability rates how hard the input is, then B x inputs samples
in all, one at a time to the input with the largest p(1-p)^n, at most K each
(:func:`moot.eval.pool.uab_plan`); each input is then a vote of its first n samples, sample 1 served
from the run's request cache. The allocation is stored in the run, so a resumed batch keeps it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from moot.batch.items import BatchInputError, BatchItem, load_items, make_items
from moot.batch.results import BatchConfig, BatchResult
from moot.core.budget import apply_budget, input_problem, with_default_timeout
from moot.core.engine import Engine
from moot.core.spec import Probe, ProtocolSpec
from moot.core.types import DebateResult
from moot.eval.runner import Progress, ProgressFn, allocate_uab
from moot.eval.store import (
    DB_NAME,
    ItemResult,
    RunConfigMismatch,
    RunStore,
    discard_unstarted,
    stored_form,
)
from moot.models.base import BaseChatModel
from moot.models.pricing import PriceTable
from moot.models.registry import default_spec, resolve_model
from moot.protocols import get_preset, preset_names
from moot.protocols.loader import ProtocolFileError, resolve_protocol
from moot.protocols.refs import ProtocolRefError, parse_call, uab_terms
from moot.scale import DebateJob, Executor, JobFailed, open_executor, run_all
from moot.scale.jobs import run_carrying
from moot.structured import fingerprint

Inputs = Path | str | Iterable[str | Mapping[str, Any] | BatchItem]


class Uab(BaseModel):
    """``vote@uab(budget=B, cap=K, ...)``: B samples per input on average, at most K one input;
    ``params``, the vote's other parameters (``temperature=...``)."""

    budget: int
    cap: int
    params: dict[str, Any] = {}

    def spec(self, k: int) -> ProtocolSpec:
        """A vote of ``k`` samples that records each sample's probability (the first rates the input)."""
        spec = get_preset("vote", **{**self.params, "k": k})
        return spec.model_copy(update={"probe": spec.probe or Probe()})


def uab_of(protocol: str) -> Uab | None:
    """The UAB terms of ``protocol``, when it is ``vote@uab(...)`` (None: any other protocol)."""
    if protocol in preset_names() or protocol.endswith((".yaml", ".yml", ".json")) or Path(protocol).exists():
        return None
    try:
        call = parse_call(protocol)
    except ProtocolRefError:
        return None
    if call.at != "uab":
        return None
    try:
        budget, cap = uab_terms(call, protocol)
    except ProtocolRefError as exc:
        raise ProtocolFileError(str(exc)) from None
    uab = Uab(budget=budget, cap=cap, params=call.params)
    try:
        uab.spec(cap)  # the vote's other parameters, checked
    except (TypeError, ValueError) as exc:
        raise ProtocolFileError(f"protocol {protocol!r}: {exc}") from None
    return uab


def base_protocol(protocol: str) -> ProtocolSpec:
    """What ``--protocol`` names (:func:`~moot.protocols.loader.resolve_protocol`); for
    ``vote@uab``, the vote of ``cap`` samples, the most any input gets."""
    uab = uab_of(protocol)
    return uab.spec(uab.cap) if uab is not None else resolve_protocol(protocol)


def spec_for(config: BatchConfig, item: BatchItem | None, base: ProtocolSpec | None = None) -> ProtocolSpec:
    """The protocol with the run's settings, then the input line's own, applied over the protocol's
    budget (:func:`moot.core.budget.apply_budget`; a debate gets the default timeout when none of
    them sets one: :func:`job_spec`)."""
    spec = base if base is not None else base_protocol(config.protocol)

    def pick(line: Any, run: Any) -> Any:
        return line if line is not None else run

    return apply_budget(
        spec,
        rounds=pick(item.rounds if item else None, config.rounds),
        max_tokens=pick(item.max_tokens if item else None, config.max_tokens),
        max_calls=pick(item.max_calls if item else None, config.max_calls),
        timeout_s=pick(item.timeout_s if item else None, config.timeout_s),
    )


def job_spec(config: BatchConfig, item: BatchItem, base: ProtocolSpec | None = None) -> ProtocolSpec:
    """What one input's debate runs: :func:`spec_for`, with the default timeout when nothing set one
    (the same rule as ``moot debate`` and ``moot serve``)."""
    return with_default_timeout(spec_for(config, item, base))


def as_items(inputs: Inputs) -> list[BatchItem]:
    if isinstance(inputs, str | Path):
        return load_items(Path(inputs))
    return make_items(inputs)


def prepare(config: BatchConfig, items: list[BatchItem], out: Path) -> tuple[RunStore, ProtocolSpec]:
    """Open or create the run and store its inputs. Every refusal happens here, before any call:
    another config, inputs that differ from the stored ones, inputs appended to a ``vote@uab``
    batch whose budget was already moved, a moot that asks otherwise."""
    base = base_protocol(config.protocol)
    store = RunStore.open(out, config)
    stored = store.load_items(BatchItem)
    if len(items) > len(stored) and store.get_meta(UAB_KEY) is not None:
        store.close()
        raise RunConfigMismatch(
            f"{out} holds a {config.protocol} batch whose budget was moved between its {len(stored)} inputs; the "
            f"{len(items) - len(stored)} appended since would change that allocation: run them as a batch of their "
            "own (another --out folder)"
        )
    for n, old in enumerate(stored):
        new = stored_form(items[n]) if n < len(items) else None  # (as stored: a key in it is ***)
        if new != old:
            store.close()
            if new is None:
                what = "is missing from this input"
            else:
                fields = [f for f in type(old).model_fields if getattr(old, f) != getattr(new, f)]
                what = f"differs in this input (its {', '.join(fields)})"
            raise RunConfigMismatch(
                f"{out} holds a batch whose input {n + 1} (id {old.id!r}) {what}: re-run with the same "
                f"inputs to resume (lines may be appended), use another --out folder, or delete {out / DB_NAME} "
                "to start over"
            )
    store.save_items(items[len(stored) :], start=len(stored), redacted=True)
    spec = spec_for(config, None, base).model_dump(mode="json", exclude_defaults=True)
    store.check_prompts({config.protocol: fingerprint([spec])})
    return store, base


def check_inputs(config: BatchConfig, items: list[BatchItem], engine: Engine | None = None) -> None:
    """Refuse, before any call, an input whose question and context no turn could send (a context
    over the models' windows: :func:`moot.core.budget.input_problem`). ``engine``: the run's models,
    when known here (not on a remote cluster, where only the budget's and moot's own limits apply)."""
    base = engine.spec if engine is not None else base_protocol(config.protocol)
    models = engine.models if engine is not None else {}
    decision_model = engine.decision_model if engine is not None else None
    # A call budget that cannot pay for one round and the decision: every debate under it would fail
    # without a call (said once for the run's own budget, else for the first input whose line sets it).
    # vote@uab's max_calls caps an input's share of samples instead: any is fine.
    budgeted = uab_of(config.protocol) is None
    if budgeted and (problem := spec_for(config, None, base).call_budget_problem()) is not None:
        raise BatchInputError(f"--max-calls {config.max_calls}: {problem}" if config.max_calls else problem)
    for item in items:
        spec = job_spec(config, item, base)
        problem = (spec.call_budget_problem() if budgeted else None) or input_problem(
            spec, item.task(), models, decision_model
        )
        if problem is not None:
            raise BatchInputError(f"input {item.id!r}: {problem}")


def _row(config: BatchConfig, item: BatchItem, outcome: DebateResult | None, error: str | None) -> ItemResult:
    if outcome is None:
        return ItemResult(protocol=config.protocol, item_id=item.id, status="failed", error=error)
    return ItemResult.of(config.protocol, item.id, outcome, error=error)


async def run_batch(
    inputs: Inputs,
    *,
    out: Path | str,
    protocol: str | os.PathLike[str] = "affirmative-critical",
    model: str | BaseChatModel | None = None,
    rounds: int | None = None,
    max_tokens: int | None = None,
    timeout_s: float | None = None,
    max_calls: int | None = None,
    concurrency: int = 4,
    ray: str | None = None,
    workers: int | None = None,
    worker_cpus: float = 1.0,
    model_options: dict[str, Any] | None = None,
    executor: Executor | None = None,
    on_progress: ProgressFn | None = None,
    on_start: Callable[[str], None] | None = None,
    prices: PriceTable | None = None,
) -> AsyncIterator[BatchResult]:
    """Run one debate per input and yield each result as it finishes (after those an earlier run
    of the same batch finished, marked ``resumed``). Every result is in ``out/run.sqlite`` before
    it is yielded.

    ``inputs``: a ``.jsonl``/``.txt`` file, or questions, dicts or :class:`BatchItem` s.
    ``ray``: ``None`` (this process, ``concurrency`` debates at once), ``"local"``, ``"auto"`` or a
    cluster address (``workers`` actors of ``worker_cpus`` CPUs, ``concurrency`` debates each).
    ``on_start`` is told, in one line, where the debates run once the workers are ready.
    Each result carries its cost at ``prices`` (embedded models cost 0; an unpriced model: tokens only).
    """
    items = as_items(inputs)
    if isinstance(protocol, os.PathLike):  # a protocol file's path, as a Path
        protocol = os.fspath(protocol)
    if not isinstance(protocol, str):
        raise BatchInputError(
            f"protocol: a {type(protocol).__name__} is not a protocol's name: give a preset (with parameters: "
            "'mad(rounds=2)') or a protocol file's path, which the run keeps to resume by (a spec made in Python: "
            "write moot.protocols.loader.dump_protocol(spec) to a file and give its path)"
        )
    if model is not None and not isinstance(model, str):
        model = resolve_model(model)  # (a LangChain chat model wrapped; anything else refused in one line)
    name = model if isinstance(model, str) else model.name if model is not None else default_spec()
    config = BatchConfig(
        protocol=protocol, model=name, rounds=rounds, max_tokens=max_tokens, timeout_s=timeout_s, max_calls=max_calls
    )
    folder = Path(out)
    engine: Engine | None = None
    if executor is None and ray in (None, "local"):
        # Every model the run names (its own, each participant's, the decision's) is resolved, not
        # loaded, here: one that cannot run (an unknown spec, no key, weights not installed) is
        # refused before the run folder exists. (On a cluster the workers check theirs at start.)
        resolved = resolve_model(model, **(model_options or {}))
        engine = Engine(base_protocol(config.protocol), resolved, **(model_options or {}))
        if uab_of(config.protocol) is not None:
            from moot.eval.pool import refuse_blind_uab

            refuse_blind_uab(config.protocol, resolved)
        if ray is None:
            model = resolved
    check_inputs(config, items, engine)
    # Whether this call makes the folder and the run (two stats, as prepare() opens the store: at once)
    made = (not folder.exists(), not (folder / DB_NAME).exists())  # noqa: ASYNC240
    store, base = prepare(config, items, folder)
    started = False
    try:
        finished = {r.item_id: r for r in store.results(config.protocol)}
        progress = Progress(total=len(items))
        for item in items:
            row = finished.get(item.id)
            if row is not None:
                yield BatchResult.of(row, store.transcript(config.protocol, item.id), resumed=True).priced(prices)
                progress.done += 1
                progress.already_done += 1
                progress.failed += row.status == "failed"
                progress.tokens += row.tokens
        if on_progress is not None:
            on_progress(progress)
        todo = [item for item in items if item.id not in finished]
        if not todo:
            return
        async with open_executor(
            model, executor=executor, ray=ray, concurrency=concurrency, workers=workers,
            worker_cpus=worker_cpus, model_options=model_options,
        ) as ex:  # fmt: skip
            started = True
            if on_start is not None:
                on_start(ex.describe())
            uab = uab_of(config.protocol)
            if uab is None:
                async for result in _drive(store, config, lambda item: job_spec(config, item, base), todo, ex,
                                           progress, on_progress):  # fmt: skip
                    yield result.priced(prices)
                return
            allocation, unrated = await uab_allocation(store, config, uab, items, ex, on_progress)
            for row in unrated:
                progress.done += 1
                progress.failed += 1
                progress.last = row
                yield BatchResult.of(row, None).priced(prices)
            if on_progress is not None:
                on_progress(progress)
            rated = [item for item in todo if item.id in allocation]

            def spec_of(item: BatchItem, uab: Uab = uab) -> ProtocolSpec:
                return job_spec(config, item, uab.spec(allocation[item.id]))

            async for result in _drive(store, config, spec_of, rated, ex, progress, on_progress, cached=True):
                yield result.priced(prices)
    except BaseException:
        if made[1] and not started:  # its workers could not start (Ray): nothing ran, so nothing is left behind
            discard_unstarted(store, made[0])
        raise
    finally:
        store.close()


#: The run's meta key of a ``vote@uab`` batch's allocation (input id -> samples).
UAB_KEY = "uab"


async def _run_job(
    store: RunStore, config: BatchConfig, item: BatchItem, spec: ProtocolSpec, executor: Executor, cached: bool
) -> tuple[ItemResult, DebateResult | None]:
    """One debate of ``item`` on ``executor``; ``cached``: served first from the item's entries of
    the run's request cache, the entries it adds stored back under the item."""
    work = DebateJob(spec=spec, task=item.task())
    try:
        ran = await (run_carrying(executor, work, store.cache, item.id) if cached else executor.run(work))
    except JobFailed as exc:
        return _row(config, item, None, str(exc)), None
    transcript = ran.value.result
    row = _row(config, item, transcript, ran.value.error)
    return row.model_copy(update={"attempts": ran.attempts, "worker": ran.worker}), transcript


async def uab_allocation(
    store: RunStore,
    config: BatchConfig,
    uab: Uab,
    items: list[BatchItem],
    executor: Executor,
    on_progress: ProgressFn | None,
) -> tuple[dict[str, int], list[ItemResult]]:
    """The samples of each input under ``vote@uab`` (:func:`moot.eval.runner.allocate_uab`, as
    ``moot eval``'s), each first sample run on ``executor``. An input's ``max_calls`` (its line's,
    or the run's) caps its share: a vote cut short decides nothing."""
    gate = asyncio.Semaphore(max(1, executor.capacity))
    by_id = {item.id: item for item in items}

    async def rate(item_id: str) -> tuple[ItemResult, DebateResult | None]:
        item = by_id[item_id]
        async with gate:
            return await _run_job(store, config, item, job_spec(config, item, uab.spec(1)), executor, True)

    caps = {i.id: calls for i in items if (calls := spec_for(config, i, uab.spec(1)).budget.max_calls) is not None}
    return await allocate_uab(
        store, config.protocol, [i.id for i in items], rate, uab.budget, uab.cap,
        key=UAB_KEY, caps=caps, noun="input", on_progress=on_progress,
    )  # fmt: skip


async def _drive(
    store: RunStore,
    config: BatchConfig,
    spec_of: Callable[[BatchItem], ProtocolSpec],
    todo: list[BatchItem],
    executor: Executor,
    progress: Progress,
    on_progress: ProgressFn | None,
    *,
    cached: bool = False,
) -> AsyncIterator[BatchResult]:
    queue: asyncio.Queue[BatchResult | None] = asyncio.Queue()
    gate = asyncio.Semaphore(max(1, executor.capacity))

    async def job(item: BatchItem) -> None:
        async with gate:
            row, transcript = await _run_job(store, config, item, spec_of(item), executor, cached)
        store.save_result(row, transcript)
        progress.done += 1
        progress.failed += row.status == "failed"
        progress.tokens += row.tokens
        progress.last = row
        if on_progress is not None:
            on_progress(progress)
        queue.put_nowait(BatchResult.of(row, transcript))

    runner = asyncio.ensure_future(run_all(job(item) for item in todo))
    runner.add_done_callback(lambda _: queue.put_nowait(None))
    try:
        while (result := await queue.get()) is not None:
            yield result
        await runner  # its error, if it stopped
    finally:
        if not runner.done():
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)


def run_batch_sync(inputs: Inputs, **options: Any) -> list[BatchResult]:
    """:func:`run_batch` to the end, from synchronous code: every input's result, in finishing order."""

    try:
        asyncio.get_running_loop()
    except RuntimeError:  # none: this is synchronous code, as it should be
        pass
    else:
        raise RuntimeError(
            "run_batch_sync runs its own event loop, and one is running here (a notebook, an async app): "
            "use `[r async for r in moot.run_batch(...)]` instead"
        )

    async def collect() -> list[BatchResult]:
        return [r async for r in run_batch(inputs, **options)]

    return asyncio.run(collect())
