"""Weights: parts located without import, assembled atomically, SHA-256 verified once and remembered."""

from __future__ import annotations

import hashlib
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from moot.models import weights
from moot.models.base import ModelConfigError
from moot.models.registry import resolve_model
from moot.models.weights import EmbeddedModelInfo, gguf_path, is_installed, part_files


@pytest.fixture
def fake_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[EmbeddedModelInfo, bytes]]:
    """Three importable part packages (their __init__ would fail if imported) holding a fake GGUF."""
    site = tmp_path / "site"
    payload = b""
    for i in range(1, 4):
        pkg = site / f"moot_fake_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
        chunk = bytes([i]) * (1000 + i)
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(chunk)
        payload += chunk
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("MOOT_CACHE_DIR", str(tmp_path / "cache"))
    info = EmbeddedModelInfo(
        name="fake-3part",
        title="fake",
        packages=tuple((f"moot-fake-part{i}", "1.0") for i in range(1, 4)),
        member="data/part{i:02d}.bin",
        sha256=hashlib.sha256(payload).hexdigest(),
        size=len(payload),
        license="test",
        source="test",
        rank=0,
    )
    yield info, payload
    for i in range(1, 4):
        sys.modules.pop(f"moot_fake_part{i}", None)


def test_parts_are_assembled_verified_and_remembered(fake_parts: tuple[EmbeddedModelInfo, bytes]) -> None:
    info, payload = fake_parts
    assert is_installed(info)
    path = gguf_path(info)
    assert path.read_bytes() == payload
    assert path.parent == weights.cache_dir() / "models"
    assert list(path.parent.glob("*.part")) == []  # the temporary file was renamed into place
    # Remembered: the parts are not read again (deleting them does not matter), nor re-hashed.
    for part in part_files(info) or []:
        part.unlink()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(weights, "_hash_file", lambda p: pytest.fail("re-hashed a remembered file"))
        mp.setattr(weights, "part_files", lambda i: [Path("/nonexistent")] * 3)
        assert gguf_path(info) == path


def test_processes_needing_a_model_at_once_assemble_it_once(
    fake_parts: tuple[EmbeddedModelInfo, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two test workers (or two ``moot`` commands) starting on the same model: one assembles and
    remembers it while the other waits, then finds it remembered. Threads stand for the processes:
    each opens the lock file itself, and ``flock`` excludes every open of it, in any process."""
    info, payload = fake_parts
    assembled: list[str] = []

    class Counted(weights._Progress):
        def __init__(self, what: str, total: int) -> None:
            assembled.append(what)
            super().__init__(what, total)

        def add(self, n: int) -> None:
            time.sleep(0.05)  # a write long enough for the others to arrive meanwhile
            super().add(n)

    monkeypatch.setattr(weights, "_Progress", Counted)
    start = threading.Barrier(4)

    def one() -> Path:
        start.wait()
        return gguf_path(info)

    with ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(lambda _: one(), range(4)))
    assert len(set(paths)) == 1 and paths[0].read_bytes() == payload
    assert assembled == ["assembling embedded:fake-3part"]
    assert sorted(p.name for p in (weights.cache_dir() / "verified").iterdir()) == sorted(
        [weights._marker(paths[0]).name, "fake-3part.lock"]
    )  # no temporary marker left behind


def test_a_changed_cached_file_is_verified_again(fake_parts: tuple[EmbeddedModelInfo, bytes]) -> None:
    info, payload = fake_parts
    path = gguf_path(info)
    path.write_bytes(b"tampered" + payload[8:])  # same size, new mtime: the marker no longer matches
    assert gguf_path(info).read_bytes() == payload  # re-assembled from the parts


def test_a_wrong_hash_is_refused_and_nothing_is_left(fake_parts: tuple[EmbeddedModelInfo, bytes]) -> None:
    info, _ = fake_parts
    bad = EmbeddedModelInfo(**{**info.__dict__, "sha256": "0" * 64})
    with pytest.raises(ModelConfigError, match=r"do not have the expected SHA-256.*moot models install fake-3part"):
        gguf_path(bad)
    assert list((weights.cache_dir() / "models").iterdir()) == []


def test_a_single_file_model_is_hashed_in_place_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "site" / "moot_fake_single"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "model.gguf").write_bytes(b"GGUF-single")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("MOOT_CACHE_DIR", str(tmp_path / "cache"))
    info = EmbeddedModelInfo(
        name="single",
        title="t",
        packages=(("moot-fake-single", "1"),),
        member="model.gguf",
        sha256=hashlib.sha256(b"GGUF-single").hexdigest(),
        size=11,
        license="t",
        source="t",
        rank=0,
    )
    calls: list[Path] = []
    real = weights._hash_file

    def counting(p: Path) -> str:
        calls.append(p)
        return real(p)

    monkeypatch.setattr(weights, "_hash_file", counting)
    assert gguf_path(info) == pkg / "model.gguf"
    assert gguf_path(info) == pkg / "model.gguf"
    assert len(calls) == 1


def test_missing_weights_say_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    info = EmbeddedModelInfo(
        name="absent",
        title="t",
        packages=(("moot-no-such-package", "1"),),
        member="x",
        sha256="0" * 64,
        size=1,
        license="t",
        source="t",
        rank=0,
    )
    assert not is_installed(info)
    with pytest.raises(ModelConfigError, match="moot models install absent"):
        gguf_path(info)


def test_embedded_with_nothing_installed_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(weights, "is_installed", lambda info: False)
    monkeypatch.setattr("moot.models.embedded.is_installed", lambda info: False)
    with pytest.raises(ModelConfigError, match=r"no embedded model is installed.*moot models install"):
        resolve_model("embedded")


def test_requirement_files_pin_and_hash_every_weight_package() -> None:
    for info in weights.CATALOG.values():
        lines = [ln for ln in info.requirements_file.read_text().splitlines() if ln and not ln.startswith("#")]
        assert [ln.split("==")[0] for ln in lines] == [p for p, _ in info.packages]
        assert all("--hash=sha256:" in ln and "==" in ln for ln in lines)
