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
