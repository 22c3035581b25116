"""Where a run is: the one place a run location (a folder, its ``run.sqlite``, a gzipped copy) is
resolved to the SQLite file to open (:func:`run_file`), by :func:`moot.eval.store.open_run` (which
``--cache-from``, :meth:`moot.eval.store.RunStore.import_cache`, uses too)."""

from __future__ import annotations

import gzip
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from moot.files import InputFileError

#: The file a run folder holds its store in.
DB_NAME = "run.sqlite"


class RunReadError(InputFileError):
    """A path that holds no readable run (one line, naming the path and the fix)."""


def holds_run(path: Path) -> bool:
    """Whether ``path`` is a location :func:`run_file` opens (a file, or a folder holding
    ``run.sqlite`` or ``run.sqlite.gz``), checked before a command starts."""
    return path.is_file() or (path / DB_NAME).is_file() or (path / f"{DB_NAME}.gz").is_file()


@contextmanager
def run_file(path: Path, what: str, kind: str = "moot eval run", *, any_name: bool = False) -> Iterator[Path]:
    """The SQLite file of any run location: a run folder (holding ``run.sqlite``, or only
    ``run.sqlite.gz`` as docs/results keeps them), its ``run.sqlite``, or a gzipped copy, decompressed
    into a temporary folder (as ``run.sqlite``) that is removed on leaving. The one place a run
    location is resolved (:func:`moot.eval.store.open_run`, which every reader uses). A plain file must be
    named ``run.sqlite`` unless ``any_name``. A location that holds no run raises
    :class:`RunReadError` in one line, naming it (a folder: as holding no ``kind``) and ending with
    ``what`` (the fix)."""
    if path.is_dir() and not (path / DB_NAME).is_file() and (path / f"{DB_NAME}.gz").is_file():
        path = path / f"{DB_NAME}.gz"
    if not path.exists():
        raise RunReadError(f"{path} does not exist; {what}")
    if path.is_file() and not path.name.endswith(".gz") and path.name != DB_NAME and not any_name:
        raise RunReadError(f"{path} is neither a run folder nor a run's store; {what}")
    with tempfile.TemporaryDirectory(prefix="moot-run-") as tmp:
        if path.is_file() and path.name.endswith(".gz"):
            try:
                with gzip.open(path, "rb") as src, (Path(tmp) / DB_NAME).open("wb") as dst:
                    shutil.copyfileobj(src, dst)
            except (OSError, EOFError) as exc:
                raise RunReadError(f"{path} is not a gzipped moot run ({exc})") from None
            yield Path(tmp) / DB_NAME
            return
        if path.is_dir() and not (path / DB_NAME).is_file():
            raise RunReadError(f"{path} holds no {kind} (no {DB_NAME} or {DB_NAME}.gz); {what}")
        yield path / DB_NAME if path.is_dir() else path
