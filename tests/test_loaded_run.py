"""A loaded run is a value (issue 43, part 3, item 2): one function opens any run location (a folder,
its run.sqlite, a gzipped copy, a folder holding only that) and the analyses take what it read."""

from __future__ import annotations

import dataclasses
import gzip
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from moot.eval.analysis import summarise
from moot.eval.datasets import load_jsonl
from moot.eval.export import render_export
from moot.eval.loaded import LoadedRun, RunReadError, load_run, read_store
from moot.eval.runner import run_eval
from moot.eval.store import RunConfig, RunStore
from moot.models.base import ChatRequest
from moot.models.scripted import ScriptedModel

SCIENCE = Path(__file__).parent / "fixtures" / "eval" / "science.jsonl"
ITEMS = load_jsonl(SCIENCE)


def solver(request: ChatRequest) -> dict[str, Any]:
    item = next(i for i in ITEMS if any(i.question in m.content for m in request.messages))
    return {"reasoning": "because", "answer": item.answer, "confidence": 0.8}


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import asyncio

    out = tmp_path_factory.mktemp("loaded") / "run"
    cfg = RunConfig(dataset=str(SCIENCE), n=4, protocols=["single", "vote@3"], model="scripted")
    asyncio.run(run_eval(cfg, out, model=ScriptedModel(fn=solver))).close()
    return out


def _gzipped(run_folder: Path, to: Path) -> Path:
    to.mkdir()
    with (run_folder / "run.sqlite").open("rb") as src, gzip.open(to / "run.sqlite.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    return to


def test_every_run_location_loads_the_same_value(run_folder: Path, tmp_path: Path) -> None:
    kept = _gzipped(run_folder, tmp_path / "kept")
    loaded = load_run(run_folder)
    assert loaded.config.protocols == ["single", "vote@3"] and len(loaded.items()) == 4
    assert [r.item_id for r in loaded.results("vote@3")] and set(loaded.transcripts("single")) == {
        i.id for i in loaded.items()
    }
    for where in (run_folder / "run.sqlite", kept, kept / "run.sqlite.gz"):
        assert dataclasses.replace(load_run(where), source=loaded.source) == loaded, where
        assert load_run(where).source == str(where)
    assert not (kept / "run.sqlite").exists()  # decompressed elsewhere, and removed


def test_a_loaded_run_holds_no_handle_and_analyses_as_the_store_does(run_folder: Path) -> None:
    loaded = load_run(run_folder)
    for f in dataclasses.fields(LoadedRun):
        assert not isinstance(getattr(loaded, f.name), sqlite3.Connection | RunStore), f.name
    store = RunStore.open_read_only(run_folder)
    try:
        assert read_store(store) == loaded
        assert summarise(loaded).model_dump(exclude={"generated_at"}) == summarise(store).model_dump(
            exclude={"generated_at"}
        )
        assert render_export(loaded, "jsonl") == render_export(store, "jsonl")
    finally:
        store.close()
    # what an analysis is handed is a copy: it cannot change what the next one reads
    loaded.results("single").clear()
    loaded.transcripts("single").clear()
    assert loaded.results("single") and loaded.transcripts("single")


def test_a_location_without_an_eval_run_is_refused_in_one_line(run_folder: Path, tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "junk.gz").write_bytes(b"not gzip")
    batch = tmp_path / "batch"
    shutil.copytree(run_folder, batch, ignore=shutil.ignore_patterns("*.lock", "*-wal", "*-shm"))
    store = RunStore.open(batch)
    store.set_meta("config", {"kind": "batch", "protocol": "single", "model": "scripted"})
    store.close()
    for bad, message in (
        (tmp_path / "missing", "does not exist"),
        (tmp_path / "junk.gz", "is not a gzipped moot run"),
        (tmp_path, "holds no moot eval run"),
        (tmp_path / "notes.txt", "is neither a run folder nor a run's store"),
        (batch, "is not a moot eval run (" + str(batch) + " holds a moot batch run"),
    ):
        with pytest.raises(RunReadError) as caught:
            load_run(bad)
        assert message in str(caught.value) and "\n" not in str(caught.value), bad


def test_cache_from_opens_any_run_location_through_the_same_function(run_folder: Path, tmp_path: Path) -> None:
    from moot.files import InputFileError

    kept = _gzipped(run_folder, tmp_path / "kept")
    (tmp_path / "empty").mkdir()
    config = RunConfig(dataset=str(SCIENCE), n=4, protocols=["single"], model="scripted")
    store = RunStore.open(tmp_path / "new", config)
    try:
        added = store.import_cache(kept)  # a folder holding only run.sqlite.gz
        assert added > 0 and len(store.cache) == added
        assert store.import_cache(run_folder / "run.sqlite") == 0  # the same entries: nothing new
        with pytest.raises(InputFileError) as caught:
            store.import_cache(tmp_path / "empty")
        assert str(caught.value).startswith("--cache-from ") and "holds no moot eval run" in str(caught.value)
    finally:
        store.close()


def test_cache_from_takes_a_store_under_any_name(run_folder: Path, tmp_path: Path) -> None:
    renamed = tmp_path / "earlier.db"
    shutil.copyfile(run_folder / "run.sqlite", renamed)
    config = RunConfig(dataset=str(SCIENCE), n=4, protocols=["single"], model="scripted")
    store = RunStore.open(tmp_path / "new", config)
    try:
        assert store.import_cache(renamed) > 0
    finally:
        store.close()


def test_a_batch_run_loads_from_any_run_location_into_a_plain_value(tmp_path: Path) -> None:
    from moot.batch.results import LoadedBatch, batch_rows, load_batch
    from moot.batch.runner import run_batch_sync

    lines = [{"id": item.id, "question": item.question} for item in ITEMS[:3]]
    out = tmp_path / "batch"
    run_batch_sync(lines, out=out, protocol="single", model=ScriptedModel(fn=solver))
    kept = _gzipped(out, tmp_path / "kept")
    loaded = load_batch(out)
    assert loaded.config.protocol == "single" and [i.id for i in loaded.items] == [i.id for i in ITEMS[:3]]
    assert {r.item_id for r in loaded.rows} == set(loaded.debates) == {i.id for i in ITEMS[:3]}
    for f in dataclasses.fields(LoadedBatch):
        assert not isinstance(getattr(loaded, f.name), sqlite3.Connection | RunStore), f.name
    for where in (out / "run.sqlite", kept, kept / "run.sqlite.gz"):
        assert dataclasses.replace(load_batch(where), source=loaded.source) == loaded, where
    assert [r.id for r in batch_rows(kept)] == [i.id for i in ITEMS[:3]]  # the export reads a kept copy too
    with pytest.raises(RunReadError) as caught:
        load_batch(tmp_path / "missing")
    assert "does not exist; give a moot batch run folder" in str(caught.value)


def test_an_eval_run_is_not_loaded_as_a_batch(run_folder: Path) -> None:
    from moot.batch.results import load_batch

    with pytest.raises(RunReadError) as caught:
        load_batch(run_folder)
    assert "holds a moot eval run, not a moot batch run" in str(caught.value) and "\n" not in str(caught.value)


def test_the_report_is_written_beside_a_kept_copy_and_not_into_a_file(run_folder: Path, tmp_path: Path) -> None:
    from moot.eval.report import write_report

    kept = _gzipped(run_folder, tmp_path / "kept")  # a folder holding only run.sqlite.gz, as docs/results
    report, written = write_report(kept)
    assert report.model_dump(exclude={"generated_at"}) == summarise(load_run(run_folder)).model_dump(
        exclude={"generated_at"}
    )
    assert (kept / "report.json") in written and not (kept / "run.sqlite").exists()
    with pytest.raises(NotADirectoryError, match="is a file, not a run folder"):
        write_report(run_folder / "run.sqlite")


def test_only_the_store_s_open_run_resolves_a_run_location() -> None:
    """Every reader opens a run through moot.eval.store.open_run: no other module resolves a location
    (run_file) or opens a store to read (open_read_only) itself."""
    import ast

    src = Path(__file__).resolve().parents[1] / "src" / "moot"
    callers = set()
    for path in src.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "attr", getattr(node.func, "id", None))
                if name in ("run_file", "open_read_only"):
                    callers.add(path.relative_to(src).as_posix())
    assert callers == {"eval/store.py"}
