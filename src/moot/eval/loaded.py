"""A run, loaded: the one way to open any run location, and the plain value the analyses take.

:func:`open_run` (:mod:`moot.eval.store`'s, the one function every reader opens a run with) opens
any run location to read: a run folder (holding ``run.sqlite``, or only ``run.sqlite.gz`` as
docs/results keeps them), its ``run.sqlite``, or a gzipped copy, decompressed into a temporary
folder that is removed afterwards. :func:`load_run` reads an eval run from it once
into a :class:`LoadedRun` and closes it: the config, the items, every protocol's rows and transcripts,
the meta and the quality judgements, as typed objects. As in Inspect AI, where a log is read once
and every view reads that log, the report's analyses (:mod:`moot.eval.analysis`, the pool's, the
quality section's, the export's, ``moot tune``'s) are functions of that value and hold no SQLite
handle; so does ``moot view`` (:mod:`moot.server.view.data`), which also reads a batch run
(:func:`moot.batch.results.load_batch`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moot.core.types import DebateQuality, DebateResult
from moot.eval.items import EvalItem
from moot.eval.location import RunReadError
from moot.eval.store import EVAL_RUN, ItemResult, RunConfig, RunSession, RunStore, open_run, read_run

__all__ = ["EVAL_RUN", "LoadedRun", "RunReadError", "as_loaded", "load_run", "open_run", "read_store"]


@dataclass
class LoadedRun:
    """One eval run, read once: a plain value (no handle to the file). The read methods are the
    store's (:class:`~moot.eval.store.RunStore`'s), so an analysis reads a loaded run as it read a
    store; each returns a copy, so no analysis changes what another one reads."""

    #: Where it was read from, as given (a folder, a run.sqlite, a gzipped copy).
    source: str
    config: RunConfig
    item_list: list[EvalItem]
    #: Each protocol's rows and its transcripts by item, in the order the store gives them.
    rows: dict[str, list[ItemResult]]
    debates: dict[str, dict[str, DebateResult]]
    meta: dict[str, Any] = field(default_factory=dict)
    #: The stored quality judgements: (protocol, item, judge, rubric, judgement), in the order stored.
    judged: list[tuple[str, str, str, str, DebateQuality]] = field(default_factory=list)

    def items(self) -> list[EvalItem]:
        return list(self.item_list)

    def results(self, protocol: str) -> list[ItemResult]:
        return list(self.rows.get(protocol, []))

    def transcripts(self, protocol: str) -> dict[str, DebateResult]:
        return dict(self.debates.get(protocol, {}))

    def transcript(self, protocol: str, item_id: str) -> DebateResult | None:
        """One debate's transcript (None: no row, or a row without one)."""
        return self.debates.get(protocol, {}).get(item_id)

    def get_meta(self, key: str) -> Any:
        return self.meta.get(key)

    def sessions(self) -> list[RunSession]:
        """The processes that ran this run, in order (none in a run from before they were recorded)."""
        return [RunSession.model_validate(x) for x in self.meta.get("sessions") or []]

    def judgements(self, rubric: str, judge: str | None = None) -> dict[tuple[str, str], DebateQuality]:
        """The judgements under ``rubric`` per (protocol, item): ``judge``'s, or, when several judges
        judged a debate, the latest one's (:meth:`RunStore.judgements`)."""
        return {(p, i): q for p, i, who, r, q in self.judged if r == rubric and (judge is None or who == judge)}


def read_store(store: RunStore, source: str | None = None) -> LoadedRun:
    """The eval run of an open store, read whole (its handle stays the caller's to close)."""
    config = store.config  # another kind of run (a batch's) is refused here, in one line
    protocols = [p for (p,) in store.conn.execute("SELECT DISTINCT protocol FROM results")]
    judged: list[tuple[str, str, str, str, DebateQuality]] = []
    if store._has_table(store.JUDGEMENTS):
        rows = store.conn.execute(
            f"SELECT protocol, item_id, judge, rubric, json FROM {store.JUDGEMENTS} ORDER BY rowid"
        )
        judged = [(p, i, j, r, DebateQuality.model_validate_json(text)) for p, i, j, r, text in rows]
    return LoadedRun(
        source=str(store.folder) if source is None else source,
        config=config,
        item_list=store.items(),
        rows={p: store.results(p) for p in protocols},
        debates={p: store.transcripts(p) for p in protocols},
        meta={key: store.get_meta(key) for (key,) in store.conn.execute("SELECT key FROM meta")},
        judged=judged,
    )


def as_loaded(run: RunStore | LoadedRun) -> LoadedRun:
    """``run`` as a loaded run: an analysis's entry point takes either, and reads an open store once."""
    return run if isinstance(run, LoadedRun) else read_store(run)


def load_run(path: Path) -> LoadedRun:
    """The eval run at any run location (:func:`open_run`), read once into a :class:`LoadedRun`; the
    file is closed (and a decompressed copy removed) before this returns. A batch run, or a file that
    is not a run's store, raises :class:`RunReadError` in one line."""
    return read_run(path, read_store, EVAL_RUN, "moot eval run")
