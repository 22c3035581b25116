"""What ``moot view`` shows: a run (``moot eval``'s or ``moot batch``'s) or a saved transcript, read
once into typed rows, and the pure functions over them that the viewer's API serves (the item
table's filters, the paired counts of two protocols).

A run is loaded once, as every command that reads a run loads it: opened at any run location by
the one function that opens them (:func:`moot.eval.store.open_run`, read-only), read whole into a
plain value (an eval run's :class:`~moot.eval.loaded.LoadedRun`, a batch run's
:class:`~moot.batch.results.LoadedBatch`) and closed, a gzipped copy's temporary file removed. What
the viewer serves is computed from that value; it holds no SQLite handle. Nothing is written.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from moot.batch.items import BatchItem
from moot.batch.results import LoadedBatch, read_batch
from moot.core.dynamics import compute_dynamics
from moot.core.types import DebateResult, Dynamics, load_result
from moot.eval.items import EvalItem
from moot.eval.loaded import LoadedRun, read_store
from moot.eval.location import RunReadError
from moot.eval.store import DB_NAME, ItemResult, open_run
from moot.files import InputFileError, StoreFileError, first_error, open_sqlite
from moot.server.limits import RequestError
from moot.stats import discordant, mcnemar_exact

__all__ = [
    "Cell",
    "ItemDetail",
    "ItemFilter",
    "ItemPage",
    "ItemRow",
    "PairCounts",
    "ProtocolStats",
    "RunInfo",
    "RunView",
    "ViewItem",
    "ViewSourceError",
    "filter_rows",
    "pair_counts",
]

ViewKind = Literal["eval", "batch", "transcript"]
Outcome = Literal["correct", "wrong", "failed"]
#: How two protocols did on an item: their answers differ, or which of them is right.
Pairing = Literal["disagree", "both_right", "only_a", "only_b", "both_wrong"]

WHAT = (
    "give a moot eval or batch run folder (holding run.sqlite or run.sqlite.gz), its run.sqlite(.gz), "
    "or a transcript saved by moot debate --json"
)
_SQLITE_MAGIC = b"SQLite format 3\x00"
_GZIP_MAGIC = b"\x1f\x8b"


class ViewSourceError(ValueError):
    """A path ``moot view`` cannot show: the message is one line, naming the path and the fix."""


class ViewItem(BaseModel):
    """One item of the run: what was asked, and the gold answer (an eval run's) or the reference
    (a batch line's or a transcript's, when it gave one)."""

    id: str
    index: int
    question: str
    choices: list[str] = Field(default_factory=list)
    context: list[str] = Field(default_factory=list)
    gold: str | None = None


class Cell(BaseModel):
    """One protocol on one item: its stored row and what its debate did to the answers."""

    protocol: str
    status: str
    #: None where there is no gold answer to score against (a batch run, a transcript).
    correct: bool | None = None
    #: The scored answer (an eval run's extracted answer), else the debate's final answer.
    answer: str | None = None
    final_answer: str | None = None
    calls: int = 0
    tokens: int = 0
    latency_s: float = 0.0
    stop_reason: str | None = None
    error: str | None = None
    rounds: int = 0
    #: Answers the debate's agents changed from one round to the next (its dynamics' ``changed``).
    flips: int = 0
    right_to_wrong: int | None = None
    wrong_to_right: int | None = None

    @property
    def outcome(self) -> Outcome | None:
        if self.status != "ok":
            return "failed"
        return None if self.correct is None else ("correct" if self.correct else "wrong")


class ItemRow(BaseModel):
    item: ViewItem
    cells: dict[str, Cell] = Field(default_factory=dict)


class ProtocolStats(BaseModel):
    protocol: str
    results: int = 0
    correct: int | None = None
    failed: int = 0
    #: Debates in which an agent changed its answer between rounds.
    flipped: int = 0
    mean_calls: float = 0.0
    mean_tokens: float = 0.0


class RunInfo(BaseModel):
    kind: ViewKind
    source: str
    dataset: str | None = None
    model: str | None = None
    protocols: list[str]
    items: int
    #: Whether the rows are scored against gold answers (an eval run): correctness, paired counts.
    gold: bool
    stats: list[ProtocolStats]


class ItemFilter(BaseModel):
    """The item table's filters; each one given narrows the rows. ``outcome`` and ``flipped`` apply to
    ``protocol``'s debate, or, without one, to any protocol's; ``pair`` to protocols ``a`` and ``b``."""

    protocol: str | None = None
    outcome: Outcome | None = None
    flipped: bool = False
    a: str | None = None
    b: str | None = None
    pair: Pairing | None = None
    #: Text the question or the item's id holds (case-insensitive).
    q: str | None = None


class ItemPage(BaseModel):
    total: int
    rows: list[ItemRow]


class PairCounts(BaseModel):
    """Two protocols on the items both have a result for, over the whole run: right and wrong
    (a failed debate is wrong), how often their answers differ, and the exact McNemar p-value."""

    a: str
    b: str
    paired: int
    both_right: int
    only_a: int
    only_b: int
    both_wrong: int
    disagree: int
    p_value: float


class ItemDetail(BaseModel):
    item: ViewItem
    cells: dict[str, Cell]
    #: Each protocol's transcript of this item (a protocol whose row has none is left out).
    transcripts: dict[str, DebateResult]


def _other_sqlite(path: Path) -> str:
    """Why an SQLite file not named ``run.sqlite`` is not opened, by what its tables say it is: a
    ``moot serve`` store (a folder would not help), a run's store under another name, or neither."""
    try:
        conn = open_sqlite(path, "an SQLite file moot can read", fix=WHAT)
    except StoreFileError as exc:
        return str(exc)
    with contextlib.closing(conn):
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "debates" in tables:
        return (
            f"{path} is a moot serve store, not a run: its debates are shown by moot serve --db {path} (its viewer "
            "is at /), or one by one: moot view a debate's JSON (GET /v1/debates/ID/result)"
        )
    if {"items", "results"} <= tables:
        return f"{path} is a run's store under another name: give its folder, or name the file {DB_NAME}"
    return f"{path} is an SQLite file but not a moot run; {WHAT}"


class RunView:
    """A run or a transcript, read once: its items, one :class:`Cell` per protocol and item, and every
    transcript, all plain values (the run as loaded, :attr:`run`; no handle to its file)."""

    def __init__(
        self,
        kind: ViewKind,
        source: str,
        protocols: list[str],
        rows: list[ItemRow],
        *,
        dataset: str | None = None,
        model: str | None = None,
        run: LoadedRun | LoadedBatch | None = None,
        transcripts: dict[tuple[str, str], DebateResult] | None = None,
    ) -> None:
        self.kind: ViewKind = kind
        self.source = source
        self.protocols = protocols
        self.rows = rows
        self.by_id = {row.item.id: row for row in rows}
        self.dataset = dataset
        self.model = model
        self.gold = kind == "eval"
        #: The run as loaded (None: a transcript file, whose one transcript is in ``transcripts``).
        self.run = run
        self._transcripts = transcripts or {}

    # ------------------------------------------------------------------------------ opening

    @classmethod
    def open(cls, path: Path) -> RunView:
        """The run or transcript at ``path``: a run folder (``run.sqlite``, or only ``run.sqlite.gz``,
        as docs/results keeps them), a ``run.sqlite``, a gzipped copy, or a transcript JSON file.
        A run location is opened as every command opens it (:func:`moot.eval.store.open_run`, which
        decompresses a gzipped copy into a temporary folder) and read whole before this returns
        (the temporary copy is then removed). Anything else is a :class:`ViewSourceError`."""
        if not path.exists():
            raise ViewSourceError(f"{path} does not exist; {WHAT}")
        if path.is_file():
            try:
                with path.open("rb") as f:
                    head = f.read(len(_SQLITE_MAGIC))
            except OSError as exc:
                raise ViewSourceError(f"cannot read {path}: {exc.strerror or exc}; {WHAT}") from None
            if head == _SQLITE_MAGIC and path.name != DB_NAME:
                raise ViewSourceError(_other_sqlite(path))
            if not head.startswith(_GZIP_MAGIC) and head != _SQLITE_MAGIC:
                return cls._open_transcript(path)
        source = str(path)
        try:
            with open_run(path, WHAT, "moot run") as store:
                try:
                    kind = store.kind
                except FileNotFoundError:
                    raise ViewSourceError(
                        f"{source} holds no run config (a run refused before it began); {WHAT}"
                    ) from None
                if kind not in ("eval", "batch"):
                    raise ViewSourceError(f"{source} holds a moot {kind} run, which moot view cannot show; {WHAT}")
                try:
                    run = read_store(store, source) if kind == "eval" else read_batch(store, source)
                except (ValidationError, sqlite3.DatabaseError) as exc:
                    first = str(exc).splitlines()[0]
                    raise ViewSourceError(f"{source}: its store cannot be read ({first}); {WHAT}") from None
        except RunReadError as exc:
            raise ViewSourceError(str(exc) if str(exc).endswith(WHAT) else f"{exc}; {WHAT}") from None
        return cls.of_run(run)

    @classmethod
    def of_run(cls, run: LoadedRun | LoadedBatch) -> RunView:
        """The view of a loaded run (eval or batch): its rows, computed once from the value."""
        if isinstance(run, LoadedRun):
            protocols, dataset, model = list(run.config.protocols), run.config.dataset, run.config.model
            items = [_eval_item(n, item) for n, item in enumerate(run.item_list)]
            results = {label: run.rows.get(label, []) for label in protocols}
            debates = run.debates
        else:
            protocols, dataset, model = [run.config.protocol], None, run.config.model
            items = [_batch_item(n, item) for n, item in enumerate(run.items)]
            results, debates = {run.config.protocol: run.rows}, {run.config.protocol: run.debates}
        scored = isinstance(run, LoadedRun)
        rows = [ItemRow(item=item) for item in items]
        by_id = {row.item.id: row for row in rows}
        for label in protocols:
            transcripts = debates.get(label, {})
            for result in results[label]:
                row = by_id.get(result.item_id)
                if row is not None:
                    debate = transcripts.get(result.item_id)
                    row.cells[label] = _cell(result, debate.dynamics if debate else None, scored=scored)
        kind: ViewKind = "eval" if scored else "batch"
        return cls(kind, run.source, protocols, rows, dataset=dataset, model=model, run=run)

    @classmethod
    def _open_transcript(cls, path: Path) -> RunView:
        try:
            result = load_result(path)
        except InputFileError as exc:
            if path.suffix.lower() != ".json":
                raise ViewSourceError(f"{path} is neither a moot run nor a transcript; {WHAT}") from None
            raise ViewSourceError(f"{exc}; {WHAT}") from None
        except ValidationError as exc:
            first = first_error(exc)
            where = ".".join(str(x) for x in first["loc"]) or "the file"
            raise ViewSourceError(f"{path} is not a moot transcript ({where}: {first['msg']}); {WHAT}") from None
        task = result.task
        item = ViewItem(
            id=path.stem or "transcript",
            index=0,
            question=task.question,
            context=[c.text for c in task.context],
            gold=task.reference,
        )
        dynamics = result.dynamics or compute_dynamics(result)
        # A debate that did not complete (timed out, cancelled, interrupted, cut by a kill) is shown as
        # failed, with why, as the CLI and moot serve report it (it was shown "ok").
        unfinished = result.status != "complete"
        error = (result.error or f"the debate ended {result.status}") if unfinished else None
        cell = _cell(ItemResult.of(result.protocol, item.id, result, error=error), dynamics)
        row = ItemRow(item=item, cells={result.protocol: cell})
        # Its model: the one every turn ran on (None when they were several, as a run with none names one).
        models = {t.model for t in [*result.turns(), *result.decision_turns] if t.model}
        return cls(
            "transcript", str(path), [result.protocol], [row], model=next(iter(models)) if len(models) == 1 else None,
            transcripts={(result.protocol, item.id): result},
        )  # fmt: skip

    # ------------------------------------------------------------------------------ reading

    def info(self) -> RunInfo:
        return RunInfo(
            kind=self.kind,
            source=self.source,
            dataset=self.dataset,
            model=self.model,
            protocols=self.protocols,
            items=len(self.rows),
            gold=self.gold,
            stats=[self._stats(p) for p in self.protocols],
        )

    def _stats(self, protocol: str) -> ProtocolStats:
        cells = [row.cells[protocol] for row in self.rows if protocol in row.cells]
        n = len(cells)
        return ProtocolStats(
            protocol=protocol,
            results=n,
            correct=sum(bool(c.correct) for c in cells) if self.gold else None,
            failed=sum(c.status != "ok" for c in cells),
            flipped=sum(c.flips > 0 for c in cells),
            mean_calls=round(sum(c.calls for c in cells) / n, 2) if n else 0.0,
            mean_tokens=round(sum(c.tokens for c in cells) / n, 1) if n else 0.0,
        )

    def transcript(self, protocol: str, item_id: str) -> DebateResult | None:
        if (protocol, item_id) in self._transcripts:
            return self._transcripts[(protocol, item_id)]
        if isinstance(self.run, LoadedBatch):
            return self.run.transcript(item_id) if protocol in self.protocols else None
        return None if self.run is None else self.run.transcript(protocol, item_id)

    def detail(self, item_id: str) -> ItemDetail:
        row = self.by_id.get(item_id)
        if row is None:
            raise RequestError(f"id: no item {item_id!r} in this run; pick one from /v1/view/items", "id", 404)
        transcripts = {p: t for p in row.cells if (t := self.transcript(p, item_id)) is not None}
        return ItemDetail(item=row.item, cells=row.cells, transcripts=transcripts)

    def check_protocol(self, name: str, param: str) -> str:
        if name not in self.protocols:
            raise RequestError(f"{param}: no protocol {name!r} in this run; one of: {', '.join(self.protocols)}", param)
        return name


def _eval_item(n: int, item: EvalItem) -> ViewItem:
    context = [item.context] if item.context else []
    return ViewItem(
        id=item.id, index=n, question=item.question, choices=item.choices, context=context, gold=item.answer
    )


def _batch_item(n: int, item: BatchItem) -> ViewItem:
    return ViewItem(
        id=item.id, index=n, question=item.question, context=[c.text for c in item.context], gold=item.reference
    )


def _cell(result: ItemResult, dynamics: Dynamics | None, *, scored: bool = False) -> Cell:
    return Cell(
        protocol=result.protocol,
        status=result.status,
        correct=result.correct if scored else None,
        answer=result.extracted if scored else result.final_answer,
        final_answer=result.final_answer,
        calls=result.calls,
        tokens=result.tokens,
        latency_s=result.latency_s,
        stop_reason=result.stop_reason,
        error=result.error,
        rounds=len(dynamics.rounds) if dynamics is not None else 0,
        flips=sum(r.changed for r in dynamics.rounds) if dynamics is not None else 0,
        right_to_wrong=dynamics.right_to_wrong if dynamics is not None else None,
        wrong_to_right=dynamics.wrong_to_right if dynamics is not None else None,
    )


# ------------------------------------------------------------------------------ the analyses


def _pairing(a: Cell, b: Cell) -> set[Pairing]:
    out: set[Pairing] = set()
    if a.answer != b.answer or a.outcome != b.outcome:
        out.add("disagree")
    if a.correct is not None and b.correct is not None:
        ra, rb = a.correct and a.status == "ok", b.correct and b.status == "ok"
        out.add("both_right" if ra and rb else "only_a" if ra else "only_b" if rb else "both_wrong")
    return out


def filter_rows(view: RunView, f: ItemFilter) -> list[ItemRow]:
    """The rows the filter keeps, in the run's order. A filter the run cannot apply (an unknown
    protocol, correctness without gold answers, a pair without its two protocols) is a
    :class:`~moot.server.limits.RequestError` naming the field."""
    if f.protocol is not None:
        view.check_protocol(f.protocol, "protocol")
    if f.outcome in ("correct", "wrong") and not view.gold:
        raise RequestError(
            f"outcome: this {view.kind} has no gold answers, so no right or wrong; filter by failed or flipped",
            "outcome",
        )
    if f.pair is not None:
        if f.a is None or f.b is None:
            missing = "a" if f.a is None else "b"
            raise RequestError(f"{missing}: pair needs the two protocols to compare; give a and b", missing)
        if f.pair != "disagree" and not view.gold:
            raise RequestError(f"pair: this {view.kind} has no gold answers; use pair=disagree", "pair")
    for param in ("a", "b"):
        name = getattr(f, param)
        if name is not None:
            view.check_protocol(name, param)
    if f.a is not None and f.a == f.b:
        raise RequestError("b: the same protocol as a; choose two different protocols", "b")
    needle = f.q.strip().lower() if f.q else ""

    def keep(row: ItemRow) -> bool:
        if f.protocol is not None and f.protocol not in row.cells:
            return False
        cells = [row.cells[f.protocol]] if f.protocol is not None else list(row.cells.values())
        if f.outcome is not None and not any(c.outcome == f.outcome for c in cells):
            return False
        if f.flipped and not any(c.flips > 0 for c in cells):
            return False
        if f.pair is not None:
            assert f.a is not None and f.b is not None
            a, b = row.cells.get(f.a), row.cells.get(f.b)
            if a is None or b is None or f.pair not in _pairing(a, b):
                return False
        return not needle or needle in row.item.question.lower() or needle in row.item.id.lower()

    return [row for row in view.rows if keep(row)]


def pair_counts(view: RunView, a: str, b: str) -> PairCounts:
    """``a`` against ``b`` over the items both have a result for (:func:`moot.stats.discordant`)."""
    view.check_protocol(a, "a")
    view.check_protocol(b, "b")
    if a == b:
        raise RequestError("b: the same protocol as a; choose two different protocols", "b")
    if not view.gold:
        raise RequestError(f"a: this {view.kind} has no gold answers, so no paired counts of right and wrong", "a")
    right_a = {r.item.id: bool(c.correct) and c.status == "ok" for r in view.rows if (c := r.cells.get(a))}
    right_b = {r.item.id: bool(c.correct) and c.status == "ok" for r in view.rows if (c := r.cells.get(b))}
    only_a, only_b, n = discordant(right_a, right_b)
    both_right = sum(right_a[k] and right_b[k] for k in right_a.keys() & right_b.keys())
    disagree = sum("disagree" in _pairing(r.cells[a], r.cells[b]) for r in view.rows if a in r.cells and b in r.cells)
    return PairCounts(
        a=a,
        b=b,
        paired=n,
        both_right=both_right,
        only_a=only_a,
        only_b=only_b,
        both_wrong=n - both_right - only_a - only_b,
        disagree=disagree,
        p_value=round(mcnemar_exact(only_a, only_b), 6),
    )
