"""``moot eval``: every protocol on the same items, durable, resumable, under a concurrency bound.

The run goes in two phases. First every protocol with a fixed budget; then the equal-budget votes
(``vote@auto``), whose sample count is read from the finished debate they are matched to and
stored, so that a resumed run uses the same count. Within a phase, jobs (protocol x item) run
item by item, at most ``concurrency`` debates at once; each result is committed as it finishes.

An item whose debate fails (a model error, a timeout, no decision) is recorded as failed with the
reason and never replaced by another item. A model that cannot be used at all (missing weights, a
bad key) stops the run instead: every item would fail the same way.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moot._version import __version__
from moot.core.budget import input_problem
from moot.core.engine import refuse_blind_models
from moot.core.probes import SELF_CHECK_PROMPT
from moot.core.spec import SpecError
from moot.core.types import DebateResult
from moot.eval.datasets import load_dataset, select_items
from moot.eval.items import EvalItem, answer_schema_name, register_item_schemas, to_task
from moot.eval.location import holds_run
from moot.eval.protocols import (
    ProtocolRef,
    auto_budget,
    base_spec,
    fit_to_item,
    parse_protocols,
    rotate_seeds,
)
from moot.eval.scoring import score
from moot.eval.store import DB_NAME, ItemResult, RunConfig, RunSession, RunStore
from moot.files import InputFileError
from moot.models.base import BaseChatModel, least_tokens
from moot.models.cache import CURRENT_ITEM, CachedModel, SqliteCache
from moot.models.registry import resolve_model
from moot.scale.jobs import DebateJob, DebateOutcome, Executor, JobFailed, WatchedModel, run_all, run_carrying
from moot.structured import fingerprint, get_schema


@dataclass
class Progress:
    """What the progress bar shows; passed to ``on_progress`` after every finished job."""

    total: int
    #: What the jobs counted are, when they are not the run's results (``moot batch``'s UAB first
    #: samples): shown beside the bar.
    stage: str = ""
    #: The run's results so far, with those an earlier session finished (``already_done`` of them):
    #: ``correct``, ``failed`` and ``tokens`` count the same results as ``done``.
    done: int = 0
    already_done: int = 0
    correct: int = 0
    failed: int = 0
    tokens: int = 0
    started: float = field(default_factory=time.monotonic)
    last: ItemResult | None = None
    #: The last job's transcript (None: it failed before it had one), for a caller that traces.
    last_transcript: DebateResult | None = None

    @property
    def accuracy(self) -> float | None:
        """The share right of the results done that did not fail: the run's, resumed items included
        (as ``done`` counts them)."""
        scored = self.done - self.failed
        return self.correct / scored if scored > 0 else None


ProgressFn = Callable[[Progress], None]


class EvalRunError(Exception):
    """The run cannot go on (an equal-budget vote with nothing to match): the message says why."""


class EvalJob(DebateJob):
    """A debate on an evaluation item. The item's typed answer schemas are registered on first use,
    in the process that runs the debate: on a Ray worker too."""

    item: EvalItem

    async def execute(self, model: BaseChatModel) -> DebateOutcome:
        register_item_schemas(self.item)
        return await super().execute(model)


def resolve_auto_k(ref: ProtocolRef, store: RunStore) -> int:
    """The sample count of an equal-budget vote, from its reference debate's finished results."""
    key = f"auto_k:{ref.label}"
    stored = store.get_meta(key)
    if stored is not None:
        return int(stored)
    try:
        k = auto_budget(ref, store.config.protocols, store.results).k
    except ValueError as exc:
        raise EvalRunError(str(exc)) from None
    store.set_meta(key, k)
    return k


async def allocate_uab(
    store: RunStore,
    label: str,
    ids: Sequence[str],
    rate: Callable[[str], Awaitable[tuple[ItemResult, DebateResult | None]]],
    budget: int,
    cap: int,
    *,
    key: str | None = None,
    caps: Mapping[str, int] | None = None,
    noun: str = "item",
    on_progress: ProgressFn | None = None,
) -> tuple[dict[str, int], list[ItemResult]]:
    """How many samples each of ``ids`` gets under ``vote@uab(budget=B, cap=K)`` (``label``), for
    ``moot eval`` and ``moot batch`` alike: the first sample of each (``rate``: run under the
    caller's concurrency bound, its request cached so that the vote's sample 1 is served from it),
    whose probability rates its difficulty (p = exp(-ANLL/0.2)), then B x the rated items samples one
    at a time to the item with the largest p(1-p)^n, at most K each (``caps``: an item's own lower
    cap), by :func:`moot.eval.uab.uab_plan`, the report's derivation too.

    An item whose first sample failed is recorded as failed under ``label``, with the reason, and
    left out (the budget is B x the items rated); a first sample that succeeded without a
    probability stops the run (:class:`EvalRunError`): the model returns no log-probabilities, and
    every item would be the same. The allocation is stored in the run (``key``): a resumed run keeps
    it while its items are the same, and rates an item whose first sample failed no more.
    ``on_progress``: told after each first sample, as the stage ``first samples``."""
    from moot.eval.uab import first_sample_prob, uab_plan

    key = key or f"uab:{label}"
    stored = store.get_meta(key)
    failed = {r.item_id for r in store.results(label) if r.status == "failed"}
    if isinstance(stored, dict) and set(stored) | (failed & set(ids)) == set(ids):
        return {i: int(n) for i, n in stored.items()}, []
    todo = [i for i in ids if i not in failed]
    progress = Progress(total=len(todo), stage="first samples")
    probs: dict[str, float] = {}
    unrated: list[ItemResult] = []

    async def first(item_id: str) -> None:
        row, transcript = await rate(item_id)
        prob = first_sample_prob(transcript)
        if prob is not None:
            probs[item_id] = prob
        elif row.status == "ok":  # a reply without log-probabilities: every item would be the same
            raise EvalRunError(
                f"{label}: {noun} {item_id}'s first sample has no probability (its log-probabilities); UAB rates "
                f"an {noun} by it: use a model that returns them (embedded:..., or an OpenAI-compatible server with "
                "logprobs), or a fixed vote@K"
            )
        else:
            error = f"its first sample, which rates it, failed: {row.error}"
            row = row.model_copy(update={"protocol": label, "status": "failed", "error": error})
            store.save_result(row, transcript)
            unrated.append(row)
        progress.done += 1
        if on_progress is not None:
            on_progress(progress)

    if on_progress is not None:
        on_progress(progress)
    await run_all(first(i) for i in todo)
    allocation = uab_plan({i: probs[i] for i in todo if i in probs}, budget, cap, dict(caps or {}))
    store.set_meta(key, allocation)
    return allocation, unrated


def _item_result(ref: ProtocolRef, item: EvalItem, result: DebateResult, error: str | None = None) -> ItemResult:
    sc = score(item, result.final_answer)
    return ItemResult.of(ref.label, item.id, result, error=error, correct=sc.correct, extracted=sc.extracted)


async def run_one(
    ref: ProtocolRef,
    item: EvalItem,
    model: BaseChatModel,
    config: RunConfig,
    *,
    k: int | None = None,
    executor: Executor | None = None,
    cache: SqliteCache | None = None,
    position: int = 0,
) -> tuple[ItemResult, DebateResult | None]:
    """One protocol on one item: here on ``model``, or on ``executor`` (Ray workers) if given, with
    the item's entries of the run's request ``cache`` sent along and the new ones stored back.
    ``position`` is the item's place in the run's item order: with ``config.seed_stride`` K, every
    participant's seed is shifted by K x position (:func:`moot.eval.protocols.rotate_seeds`)."""
    spec = fit_to_item(
        base_spec(ref, k=k), item, max_tokens=ref.turn_tokens(config.max_tokens), timeout_s=config.timeout_s
    )
    spec = rotate_seeds(spec, config.seed_stride * position)
    job = EvalJob(spec=spec, task=to_task(item), item=item)
    attempts, worker = 1, None
    try:
        if executor is None:
            outcome = await job.execute(model)
        else:
            ran = await (run_carrying(executor, job, cache, item.id) if cache is not None else executor.run(job))
            outcome, attempts, worker = ran.value, ran.attempts, ran.worker
    except JobFailed as exc:
        return ItemResult(protocol=ref.label, item_id=item.id, status="failed", error=str(exc)), None
    if outcome.result is None:
        failed = ItemResult(protocol=ref.label, item_id=item.id, status="failed", error=outcome.error)
        return failed.model_copy(update={"attempts": attempts, "worker": worker}), None
    scored = _item_result(ref, item, outcome.result, error=outcome.error)
    return scored.model_copy(update={"attempts": attempts, "worker": worker}), outcome.result


def _fingerprint_parts(ref: ProtocolRef | None, firsts: list[EvalItem], config: RunConfig) -> list[Any]:
    parts: list[Any] = []
    for item in firsts:
        parts.append(to_task(item).model_dump(mode="json"))
        parts.append(get_schema(answer_schema_name(item)).model_json_schema())
        if ref is not None:
            spec = fit_to_item(
                base_spec(ref, k=1), item, max_tokens=ref.turn_tokens(config.max_tokens), timeout_s=config.timeout_s
            )
            # Defaults left out: a new spec field (at its default) asks nothing new, so it must not
            # refuse a resume.
            parts.append(spec.model_dump(mode="json", exclude_defaults=True))
            if spec.probe is not None and spec.probe.self_check:
                # Not a spec field: the self-check prompt is CISC's own text, so a change to it must
                # refuse a resume all the same.
                parts.append(SELF_CHECK_PROMPT)
    return parts


def _firsts(items: list[EvalItem]) -> list[EvalItem]:
    return sorted({item.kind: item for item in reversed(items)}.values(), key=lambda i: i.kind)


def prompts_fingerprints(refs: list[ProtocolRef], items: list[EvalItem], config: RunConfig) -> dict[str, str]:
    """Per protocol, a hash of what its agents are asked, as this version of moot asks it: its spec
    fitted to the first item of each answer kind (prompts, personas, turn schemas), the task as
    rendered and the item's answer schema. Not in :class:`RunConfig` (the user does not choose it),
    but a resume under another fingerprint is refused all the same: results asked two ways would mix."""
    firsts = _firsts(items)
    return {ref.label: fingerprint(_fingerprint_parts(ref, firsts, config)) for ref in refs}


def prompts_fingerprint(refs: list[ProtocolRef], items: list[EvalItem], config: RunConfig) -> str:
    """The single fingerprint of all of a run's protocols that runs stored before there was one per
    protocol (kept to recognise and convert them)."""
    firsts = _firsts(items)
    parts: list[Any] = []
    for item in firsts:
        parts += _fingerprint_parts(None, [item], config)
        for ref in refs:
            spec = fit_to_item(
                base_spec(ref, k=1), item, max_tokens=ref.turn_tokens(config.max_tokens), timeout_s=config.timeout_s
            )
            parts.append(spec.model_dump(mode="json", exclude_defaults=True))
    return fingerprint(parts)


def prepare(config: RunConfig, out: Path) -> tuple[RunStore, list[EvalItem], list[ProtocolRef]]:
    """Open or create the run; select its items, check the stored ones against the data.

    Everything that can be wrong with the command (the protocols, the dataset's name, ``--n``,
    ``--subject``, the data file) is checked before the store is created, so a refused command
    leaves nothing behind that would refuse the corrected one. On a resume the stored items must
    still be the dataset's (:meth:`RunStore.check_items`). Raises before any model call."""
    refs, chosen = _check(config)
    return _open(config, out, refs, chosen)


def _check(config: RunConfig) -> tuple[list[ProtocolRef], list[EvalItem]]:
    """The protocols and the selected items, or the error that names what is wrong."""
    refs = parse_protocols(config.protocols)
    data = load_dataset(config.dataset, subject=config.subject, seed=config.seed, labels=config.labels)
    return refs, select_items(data, config.n, config.seed, config.skip)


def _open(
    config: RunConfig, out: Path, refs: list[ProtocolRef], chosen: list[EvalItem]
) -> tuple[RunStore, list[EvalItem], list[ProtocolRef]]:
    store = RunStore.open(out, config)
    try:
        stored_config = store.config
        stored = store.items()
        store.check_items(chosen)
        # Checked before anything is stored, so that a refused resume leaves the run as it was.
        legacy = prompts_fingerprint(parse_protocols(stored_config.protocols), stored or chosen, stored_config)
        store.check_prompts(prompts_fingerprints(refs, chosen, config), legacy)
        if len(chosen) > len(stored) or store.growing is not None:
            store.extend(chosen[len(stored) :])
        items = store.items()
    except BaseException:
        store.close()
        raise
    return store, items, refs


def refuse_blind(refs: list[ProtocolRef], model: BaseChatModel) -> None:
    """A protocol that reads token log-probabilities (a weighted or filtered vote, UAB's difficulty)
    on a model known to return none is refused before any call, once for the run, rather than failing
    on every item."""
    for ref in refs:
        refuse_blind_models(base_spec(ref, k=1), [model])
        if ref.uab_budget is not None:
            from moot.eval.uab import refuse_blind_uab

            refuse_blind_uab(ref.label, model)


def budget_problem(
    refs: Sequence[ProtocolRef],
    items: Sequence[EvalItem],
    *,
    max_tokens: int | None,
    timeout_s: float | None = None,
    model: BaseChatModel | None = None,
) -> str | None:
    """Why a protocol of the run could only fail, without a call (None if it need not): the checks
    ``moot debate`` makes before its first call. A call budget that cannot fit one round and the
    decision (:meth:`ProtocolSpec.call_budget_problem`; not ``vote@uab``'s, whose ``max_calls`` caps an
    item's share of samples), or a prompt that not even the shortest item of a kind could send
    (:func:`moot.core.budget.input_problem`: ``model``'s context window, when known, for the turns it
    runs, not those a heterogeneous panel gives a model of their own; the budget's ``max_prompt_tokens``
    and ``max_total_tokens``; moot's own limit). A longer item that does not fit fails alone, its
    reason recorded, as before. Each spec as the run fits it to the item (the run's ``max_tokens`` and
    ``timeout_s``); a ``vote@auto`` at k = 1."""
    # The item of each kind with the fewest tokens to send, as input_problem counts them.
    kinds = dict.fromkeys(item.kind for item in items)  # (in the order of the items)
    shortest = {kind: min((i for i in items if i.kind == kind), key=_text_size) for kind in kinds}
    for ref in refs:
        base = base_spec(ref, k=1 if (ref.auto or ref.uab_budget) else None)
        for item in shortest.values():
            spec = fit_to_item(base, item, max_tokens=ref.turn_tokens(max_tokens), timeout_s=timeout_s)
            if ref.uab_budget is None and (problem := spec.call_budget_problem()) is not None:
                return f"protocol {ref.label}: {problem}"
            models = {p.id: model for p in spec.participants if model is not None and not p.model}
            own_decision = isinstance(getattr(spec.decision, "model", None), str)
            decision_model = None if own_decision else model
            if (problem := input_problem(spec, to_task(item), models, decision_model)) is not None and not any(
                # (the shortest by an estimate: refused only if no item of its kind can be sent)
                input_problem(spec, to_task(other), models, decision_model) is None
                for other in items
                if other.kind == item.kind and other is not item
            ):
                return f"protocol {ref.label}: no item can be sent (not even the shortest, {item.id!r}): {problem}"
    return None


def _text_size(item: EvalItem) -> int:
    """An item's tokens to send, as :func:`moot.core.budget.input_problem` counts a text's."""
    texts = [item.question, item.context or "", *(item.choices or []), *(item.labels or [])]
    return sum(least_tokens(t) for t in texts)


def refuse_over_budget(
    refs: Sequence[ProtocolRef], items: Sequence[EvalItem], config: RunConfig, model: BaseChatModel
) -> None:
    """:class:`SpecError` with :func:`budget_problem`'s one line, before any call (and before the
    run's store exists): a protocol that cannot fit its budget is refused, not run and recorded failed
    on every item."""
    problem = budget_problem(refs, items, max_tokens=config.max_tokens, timeout_s=config.timeout_s, model=model)
    if problem is not None:
        raise SpecError(problem)


@dataclass
class PreparedRun:
    """A run checked and opened (its folder locked), not yet started: see :func:`prepare_run`."""

    config: RunConfig
    store: RunStore
    items: list[EvalItem]
    refs: list[ProtocolRef]
    model: BaseChatModel


def prepare_run(
    config: RunConfig,
    out: Path,
    *,
    model: BaseChatModel | None = None,
    model_options: dict[str, Any] | None = None,
    cache_from: Sequence[Path] = (),
) -> PreparedRun:
    """Everything :func:`run_eval` does before its first call: the model spec resolved (an unknown
    one is refused before the store exists), the items selected and checked, the folder locked,
    and the request caches of ``cache_from`` runs imported (:meth:`RunStore.import_cache`). A
    protocol that cannot fit its budget on an item is refused (:func:`refuse_over_budget`)."""
    refs, chosen = _check(config)
    for source in cache_from:
        if not holds_run(source):
            raise InputFileError(
                f"--cache-from {source}: no {DB_NAME} or {DB_NAME}.gz there; name a moot eval run folder"
            )
    chat_model = model or resolve_model(config.model, **(model_options or {}))
    refuse_blind(refs, chat_model)
    refuse_over_budget(refs, chosen, config, chat_model)
    store, items, refs = _open(config, out, refs, chosen)
    try:
        for source in cache_from:
            store.import_cache(source)
    except BaseException:
        store.close()
        raise
    return PreparedRun(config, store, items, refs, chat_model)


async def run_eval(
    config: RunConfig,
    out: Path,
    *,
    concurrency: int = 4,
    model: BaseChatModel | None = None,
    model_options: dict[str, Any] | None = None,
    on_progress: ProgressFn | None = None,
    executor: Executor | None = None,
    cache_from: Sequence[Path] = (),
) -> RunStore:
    """Run every protocol on the run's items (resuming what is there) and return the open store.
    With ``executor`` (Ray workers) the debates run there, ``executor.capacity`` at once; each job
    carries its item's entries of the run's request cache and brings back those it added, and one
    item's protocols run in the run's order, so the calls they share are made once as here. This
    process alone writes the store."""
    run = prepare_run(config, out, model=model, model_options=model_options, cache_from=cache_from)
    return await run_prepared(run, concurrency=concurrency, on_progress=on_progress, executor=executor)


async def run_prepared(
    run: PreparedRun,
    *,
    concurrency: int = 4,
    on_progress: ProgressFn | None = None,
    executor: Executor | None = None,
) -> RunStore:
    """Run a prepared run. The store is returned open; if the run stops on an error or is
    cancelled, the store is closed (and the folder's lock released) before the error goes on."""
    try:
        await _run(run, concurrency, on_progress, executor)
    except BaseException:
        run.store.close()
        raise
    return run.store


async def _run(run: PreparedRun, concurrency: int, on_progress: ProgressFn | None, executor: Executor | None) -> None:
    store, items, refs, config = run.store, run.items, run.refs, run.config
    # Identical requests across protocols (a debate's first round and a vote's samples) are made
    # once, through the run's own cache; every protocol still reports what it would have paid.
    # Watched (a bad key or missing weights stop the run); its identity is the inner model's, so the
    # request cache can never serve one model's replies as another's.
    chat_model = WatchedModel(run.model)
    cached = CachedModel(chat_model, store.cache)
    # How the model runs in this session (llama.cpp's threads and slots change sampled replies):
    # recorded now, and the embedded server's settings once it has loaded.
    runtime: Callable[[], dict[str, Any] | None] = getattr(run.model, "runtime", lambda: None)
    session = RunSession(moot_version=__version__, model=config.model, where="local" if executor is None else "ray")
    session_index = store.record_session(session)

    def note_runtime() -> None:
        if session.runtime is None and executor is None and (now := runtime()) is not None:
            session.runtime = now
            store.record_session(session, session_index)

    done = store.done()
    progress = Progress(total=len(items) * len(refs))
    # The results an earlier session finished count as this one's do: the line's count and its
    # accuracy are over the same results.
    wanted = {(r.label, i.id) for r in refs for i in items}
    for earlier in store.results():
        if (earlier.protocol, earlier.item_id) in wanted:
            progress.done += 1
            progress.already_done += 1
            progress.correct += earlier.correct
            progress.failed += earlier.status == "failed"
            progress.tokens += earlier.tokens
    if on_progress is not None:
        on_progress(progress)
    gate = asyncio.Semaphore(max(1, executor.capacity if executor is not None else concurrency))
    # The item's place in the run's order (stored with the items, so a resumed or extended run keeps
    # it): what --seed-stride shifts its seeds by.
    position = {item.id: j for j, item in enumerate(items)}

    async def job(ref: ProtocolRef, item: EvalItem, k: int | None) -> None:
        async with gate:
            await ungated(ref, item, k)

    async def ungated(ref: ProtocolRef, item: EvalItem, k: int | None) -> None:
        if chat_model.config_error is not None:
            return
        CURRENT_ITEM.set(item.id)  # the cache entries this job adds are the item's
        outcome, transcript = await run_one(
            ref, item, cached, config, k=k, executor=executor, cache=store.cache if executor is not None else None,
            position=position[item.id],
        )  # fmt: skip
        if chat_model.config_error is not None:
            raise chat_model.config_error
        store.save_result(outcome, transcript)
        note_runtime()
        progress.done += 1
        progress.correct += outcome.correct
        progress.failed += outcome.status == "failed"
        progress.tokens += outcome.tokens
        progress.last, progress.last_transcript = outcome, transcript
        if on_progress is not None:
            on_progress(progress)

    plain = [r for r in refs if r.auto is None and r.uab_budget is None]
    for phase in (plain, [r for r in refs if r.auto is not None]):
        ks = {r.label: resolve_auto_k(r, store) if r.auto else None for r in phase}
        if executor is None:
            await run_all(job(r, i, ks[r.label]) for i in items for r in phase if (r.label, i.id) not in done)
            continue

        # On workers, one item's protocols run one after the other, in the run's order (the pool
        # first): each job carries the entries the item's earlier jobs added, so a debate's first
        # round is served from the pool's samples, as here; ``capacity`` items run side by side.
        # An item holds its place from its first job to its last, so items finish in order and a
        # stopped run leaves whole items: with a place per job, every item's pool ran before any
        # item's debates (waiting jobs queue behind the pools already waiting).
        async def in_order(item: EvalItem, phase: list[ProtocolRef] = phase, ks: dict[str, int | None] = ks) -> None:
            todo = [r for r in phase if (r.label, item.id) not in done]
            if not todo:
                return
            async with gate:
                for r in todo:
                    await ungated(r, item, ks[r.label])

        await run_all(in_order(i) for i in items)
    by_id = {item.id: item for item in items}
    for ref in [r for r in refs if r.uab_budget is not None]:
        # UAB: the first sample of every item (sample 1 of any vote: served by the cache when the run
        # has one), then the budget moved between items by that sample's difficulty, stored.
        assert ref.uab_budget is not None

        async def rate(item_id: str) -> tuple[ItemResult, DebateResult | None]:
            CURRENT_ITEM.set(item_id)
            first = ProtocolRef(label="vote@1", name="vote", k=1)
            async with gate:
                rated = await run_one(first, by_id[item_id], cached, config, k=1, position=position[item_id])
            # A model that cannot be used at all (a bad key, missing weights) stops the run, as every
            # job's does: recorded, each item's first sample would stay failed after the fix.
            if chat_model.config_error is not None:
                raise chat_model.config_error
            return rated

        ids = [item.id for item in items]
        allocation, unrated = await allocate_uab(store, ref.label, ids, rate, ref.uab_budget, ref.uab_cap)
        for row in unrated:
            progress.done += 1
            progress.failed += 1
            progress.last, progress.last_transcript = row, None
        if unrated and on_progress is not None:
            on_progress(progress)
        await run_all(job(ref, i, n) for i in items if (n := allocation.get(i.id)) and (ref.label, i.id) not in done)
