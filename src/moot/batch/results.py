"""A batch's config and results: the rows :func:`moot.batch.runner.run_batch` yields, a finished run
read once (:class:`LoadedBatch`, which the export and ``moot view`` take), and its export."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from moot.batch.items import BatchInputError, BatchItem
from moot.core.cost import debate_cost
from moot.core.types import DebateResult
from moot.eval.store import DB_NAME, ItemResult, RunReadError, RunStore, read_run
from moot.files import csv_text
from moot.models.pricing import PriceTable


class BatchConfig(BaseModel):
    """What decides a batch's results: the same config resumes, another is refused. (How many
    debates run at once, and where, changes speed, not results: not part of it.)"""

    kind: Literal["batch"] = "batch"
    protocol: str = "affirmative-critical"
    model: str
    rounds: int | None = None
    max_tokens: int | None = None
    timeout_s: float | None = None
    max_calls: int | None = None


class BatchResult(BaseModel):
    """One input's result, as yielded by :func:`run_batch` and exported (without the transcript)."""

    id: str
    status: Literal["ok", "failed", "pending"]
    decision: str | None = None
    stop_reason: str | None = None
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    time_s: float = 0.0
    attempts: int = 0
    worker: str | None = None
    error: str | None = None
    #: The debate's cost in US dollars at the export's prices (None: a model without a price, or
    #: no transcript), and against one call of the same model, in money where priced, else in tokens.
    cost_usd: float | None = None
    cost_vs_single: float | None = None
    cost_basis: Literal["usd", "tokens"] | None = None
    #: Finished by an earlier run of the same batch (a resume yields these first).
    resumed: bool = False
    transcript: DebateResult | None = Field(default=None, exclude=True, repr=False)

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def of(cls, row: ItemResult, transcript: DebateResult | None, *, resumed: bool = False) -> BatchResult:
        return cls(
            id=row.item_id, status="ok" if row.status == "ok" else "failed", decision=row.final_answer,
            stop_reason=row.stop_reason, calls=row.calls, prompt_tokens=row.prompt_tokens,
            completion_tokens=row.completion_tokens, time_s=row.latency_s, attempts=row.attempts, worker=row.worker,
            error=row.error, resumed=resumed, transcript=transcript,
        )  # fmt: skip

    def priced(self, prices: PriceTable | None) -> BatchResult:
        """This row with the cost of its transcript at ``prices`` (embedded models cost 0)."""
        if self.transcript is None:
            return self
        cost = debate_cost(self.transcript, prices)
        by_usd = cost.ratio_to_single_usd is not None
        return self.model_copy(
            update={
                "cost_usd": cost.usd,
                "cost_vs_single": cost.ratio_to_single_usd if by_usd else cost.ratio_to_single_tokens,
                "cost_basis": "usd" if by_usd else ("tokens" if cost.ratio_to_single_tokens is not None else None),
            }
        )


#: The export's columns, in order.
EXPORT_COLUMNS = [
    "id", "status", "decision", "stop_reason", "calls", "tokens", "prompt_tokens", "completion_tokens", "time_s",
    "cost_usd", "cost_vs_single", "cost_basis", "attempts", "worker", "error",
]  # fmt: skip


# --------------------------------------------------------------------------------------- export


#: What a command that reads a batch run asks for, in its one-line errors.
BATCH_RUN = f"give a moot batch run folder, its {DB_NAME} or {DB_NAME}.gz"


@dataclass
class LoadedBatch:
    """One batch run, read once (:func:`load_batch`, :func:`read_batch`): a plain value, as
    :class:`moot.eval.loaded.LoadedRun` is an eval run's, that the export and ``moot view`` take."""

    #: Where it was read from, as given (a folder, a run.sqlite, a gzipped copy).
    source: str
    config: BatchConfig
    #: The inputs, in order.
    items: list[BatchItem]
    #: The finished inputs' rows, and their transcripts by input id.
    rows: list[ItemResult]
    debates: dict[str, DebateResult] = field(default_factory=dict)

    def transcript(self, item_id: str) -> DebateResult | None:
        return self.debates.get(item_id)


def read_batch(store: RunStore, source: str | None = None) -> LoadedBatch:
    """The batch run of an open store, read whole (its handle stays the caller's to close). Another
    kind of run raises :class:`RunReadError` in one line."""
    where = str(store.folder) if source is None else source
    if store.kind != "batch":
        raise RunReadError(f"{where} holds a moot {store.kind} run, not a moot batch run; {BATCH_RUN}")
    config = BatchConfig.model_validate(store.get_meta("config"))
    return LoadedBatch(
        source=where,
        config=config,
        items=store.load_items(BatchItem),
        rows=store.results(config.protocol),
        debates=store.transcripts(config.protocol),
    )


def load_batch(path: Path) -> LoadedBatch:
    """The batch run at any run location (:func:`moot.eval.store.open_run`), read once; the file is
    closed before this returns. A location without a batch run raises :class:`RunReadError`."""
    return read_run(path, read_batch, BATCH_RUN, "moot batch run")


def batch_rows(out: Path, prices: PriceTable | None = None) -> list[BatchResult]:
    """One row per input of the run in ``out``, in input order, with its cost at ``prices``
    (embedded models cost 0; other models without a price: tokens only); inputs not run yet are ``pending``."""
    run = load_batch(out)
    rows = {r.item_id: r for r in run.rows}
    return [
        BatchResult.of(rows[item.id], run.transcript(item.id)).priced(prices)
        if item.id in rows
        else BatchResult(id=item.id, status="pending")
        for item in run.items
    ]


def export(out: Path, path: Path, prices: PriceTable | None = None) -> int:
    """Write the run's rows to ``path`` (``.jsonl`` or ``.csv``), with their cost at ``prices``;
    returns how many."""
    check_export_path(path)
    rows = batch_rows(out, prices)
    records = [{**row.model_dump(mode="json", exclude={"resumed"}), "tokens": row.tokens} for row in rows]
    if path.suffix == ".csv":
        text = csv_text(EXPORT_COLUMNS, records)  # formula cells neutralised (OWASP)
    else:
        text = "".join(json.dumps({k: r[k] for k in EXPORT_COLUMNS}, ensure_ascii=False) + "\n" for r in records)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return len(rows)


def check_export_path(path: Path) -> None:
    if path.suffix not in (".jsonl", ".csv"):
        raise BatchInputError(f"--export {str(path)!r}: name a .jsonl or a .csv file")
    if path.is_dir():
        raise BatchInputError(f"--export {str(path)!r} is a folder; give a file path")
