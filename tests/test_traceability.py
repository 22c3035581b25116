"""Seed 000's "TAG chain integrity 100%": every requirement of the seeds (docs/requirements.yaml) is
covered by a test that names it, no test names an unknown one, and docs/traceability.md is the
generated table of both (tools/traceability.py)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "traceability.py"


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("traceability", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["traceability"] = module
    spec.loader.exec_module(module)
    return module


traceability = _tool()


@pytest.mark.req("S000-TRACE")
def test_every_requirement_has_a_test_and_every_test_a_known_requirement() -> None:
    trace = traceability.trace()
    assert trace.problems() == []
    assert len(trace.requirements) >= 80 and {r.seed for r in trace.requirements} == {"000", "001", "002", "003", "004"}


@pytest.mark.req("S000-TRACE")
def test_the_committed_traceability_table_is_up_to_date() -> None:
    expected = traceability.render(traceability.trace()) + "\n"
    assert (ROOT / "docs" / "traceability.md").read_text(encoding="utf-8") == expected, (
        "docs/traceability.md is out of date: python tools/traceability.py --write"
    )


@pytest.mark.req("S000-TRACE")
def test_markers_on_modules_classes_and_tests_are_found_and_problems_named(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_a.py").write_text(
        textwrap.dedent(
            """
            import pytest

            pytestmark = [pytest.mark.req("R-MODULE")]

            @pytest.mark.req("R-ONE", "R-TWO")
            @pytest.mark.parametrize("x", [1])
            def test_one(x): ...

            @pytest.mark.req("R-CLASS")
            class TestThings:
                @pytest.mark.req("R-NOPE")
                async def test_method(self): ...

                def helper(self): ...

            def helper(): ...
            """
        )
    )
    reqs = tmp_path / "requirements.yaml"
    reqs.write_text(
        "seeds: {'000': a.txt}\nrequirements:\n"
        + "".join(f"  - {{id: {r}, seed: '000', text: {r.lower()}}}\n" for r in
                  ("R-MODULE", "R-ONE", "R-TWO", "R-CLASS", "R-UNTESTED"))
    )  # fmt: skip
    trace = traceability.trace(reqs, tests)
    assert trace.tests["R-MODULE"] == ["test_a.py::test_one", "test_a.py::TestThings::test_method"]
    assert trace.tests["R-CLASS"] == ["test_a.py::TestThings::test_method"]
    assert trace.problems() == [
        "R-UNTESTED (seed 000: r-untested) has no test",
        "test_a.py::TestThings::test_method names unknown requirement 'R-NOPE'",
    ]
    assert "| `R-UNTESTED` | r-untested | **none** |" in traceability.render(trace)
    reqs.write_text(
        "seeds: {'000': a.txt}\nrequirements:\n  - {id: X, seed: '000', text: a}\n  - {id: X, seed: '000', text: b}\n"
    )
    with pytest.raises(ValueError, match="duplicate requirement id"):
        traceability.trace(reqs, tests)


@pytest.mark.req("S000-TRACE")
def test_a_test_naming_an_unknown_requirement_fails_the_collection(tmp_path: Path) -> None:
    # the project's conftest, beside a copy of the requirements where it looks for them
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "requirements.yaml").write_text((ROOT / "docs" / "requirements.yaml").read_text())
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (tests / "test_x.py").write_text('import pytest\n\n@pytest.mark.req("NO-SUCH-REQ")\ndef test_x():\n    pass\n')
    (tests / "test_y.py").write_text('import pytest\n\n@pytest.mark.req("S000-TRACE")\ndef test_y():\n    pass\n')
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests)],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert ran.returncode != 0
    assert "unknown requirement(s), not in docs/requirements.yaml" in ran.stdout + ran.stderr
    assert "test_x.py::test_x names 'NO-SUCH-REQ'" in ran.stdout + ran.stderr
    assert "test_y names" not in ran.stdout + ran.stderr  # a known requirement is fine


@pytest.mark.req("S000-TRACE")
def test_the_command_line_checks_and_writes() -> None:
    ran = subprocess.run([sys.executable, str(TOOL), "--check"], capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr
