"""The suite's two tiers (tests/README.md): ``make test`` leaves the real-model tier out, so CI must
run it, and the tier's definition must name tests that exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from conftest import SLOW_TIER, SLOWEST_FIRST

ROOT = Path(__file__).resolve().parent.parent


def _named(prefix: str) -> bool:
    """Whether a node id prefix (``tests/FILE.py::`` or ``tests/FILE.py::TEST``) names a file and test here."""
    path, _, test = prefix.partition("::")
    file = ROOT / path
    return file.is_file() and (not test or re.search(rf"^(async )?def {re.escape(test)}\(", file.read_text(), re.M))


def _output(*command: str) -> str:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True).stdout


def test_every_prefix_of_the_tiers_names_a_test_that_exists() -> None:
    stale = [p for p in (*SLOW_TIER, *SLOWEST_FIRST) if not _named(p)]
    assert not stale, f"tests/conftest.py names tests that are gone: {stale}"


def test_ci_runs_both_tiers_and_make_test_leaves_the_slow_one_out() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = [line.strip() for line in ci.splitlines() if line.strip().startswith("make ")]
    assert commands == ["make test", "make pytest-slow"], commands
    make = _output("make", "-n", "-s", "pytest", "pytest-slow", "BIN=" + str(Path(sys.executable).parent))
    runs = [line for line in make.splitlines() if " -m pytest " in line]
    assert len(runs) == 2, make
    assert '-m "not slow"' in runs[0] and "--cov=moot" in runs[0]
    assert runs[1].rstrip().endswith("-m slow")


def test_a_test_on_the_embedded_model_is_in_the_slow_tier() -> None:
    collected = _output(sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "slow", "tests/test_tools.py")
    slow = [line for line in collected.splitlines() if "::" in line]
    marked = [line for line in (ROOT / "tests" / "test_tools.py").read_text().splitlines() if "mark.embedded" in line]
    assert marked and len(slow) == len(marked), collected


def test_make_test_installs_before_it_runs_its_parts_at_once() -> None:
    """make test runs lint, typecheck and pytest at once (make -j): what they need is built before,
    one install at a time (on a fresh clone, as CI's, two pips at once into one venv would race)."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    rules = dict(re.findall(r"^([\w-]+):([^=\n]*)$", text, re.M))
    needed = set().union(*(rules[part].split() for part in ("lint", "typecheck", "pytest")))
    assert needed and needed <= set(rules["test"].split()), rules["test"]
    assert re.search(r"^test:.*\n\t@?\$\(MAKE\) .*-j \d+ lint typecheck pytest$", text, re.M)


def _fake_python(folder: Path, name: str, *, works: bool) -> None:
    script = folder / name
    script.write_text(f"#!/bin/sh\nexit {0 if works else 1}\n", encoding="utf-8")
    script.chmod(0o755)


def test_make_builds_its_venvs_on_python_3_12_where_there_is_one(tmp_path: Path) -> None:
    """The venvs' interpreter (tools/python.sh): a Python 3.12 found on PATH, else python3; the suite
    measures coverage on 3.12's sys.monitoring, on 3.11's trace function otherwise."""
    for works, expected in ((True, "python3.12 -m venv"), (False, "python3 -m venv")):
        _fake_python(tmp_path, "python3.12", works=works)
        env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "HOME": str(tmp_path)}
        made = subprocess.run(
            ["make", "-n", "-s", f"VENV={tmp_path / 'venv'}", str(tmp_path / "venv" / ".created")],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert made.splitlines()[0].startswith(expected), made
    make = _output("make", "-n", "-s", "pytest", "BIN=" + str(Path(sys.executable).parent))
    core = "sysmon" if sys.version_info >= (3, 12) else "ctrace"
    assert f"COVERAGE_CORE={core} " in make, make
