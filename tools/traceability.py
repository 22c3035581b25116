"""The seeds' requirements traced to their tests.

``docs/requirements.yaml`` lists the requirements (id, seed, one line); a test names the ones it
covers with ``@pytest.mark.req("ID", ...)`` (on the test, its class, or ``pytestmark`` of its module).
This script reads both (the tests by their syntax tree: nothing is imported or run) and:

    python tools/traceability.py            # problems, if any (exit 1): a requirement without a test,
                                            # a test naming an unknown requirement
    python tools/traceability.py --write    # regenerate docs/traceability.md
    python tools/traceability.py --check    # exit 1 if docs/traceability.md is not up to date

``tests/test_traceability.py`` runs the same checks in ``make test``.
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "docs" / "requirements.yaml"
TESTS = ROOT / "tests"
DOC = ROOT / "docs" / "traceability.md"


@dataclass(frozen=True)
class Requirement:
    id: str
    seed: str
    text: str


@dataclass
class Trace:
    requirements: list[Requirement]
    seeds: dict[str, str]
    #: requirement id -> the tests that name it (``file::Class::test``)
    tests: dict[str, list[str]] = field(default_factory=dict)
    #: (test, id) for every id a test names that is not a requirement
    unknown: list[tuple[str, str]] = field(default_factory=list)

    def untested(self) -> list[Requirement]:
        return [r for r in self.requirements if not self.tests.get(r.id)]

    def problems(self) -> list[str]:
        out = [f"{r.id} (seed {r.seed}: {r.text}) has no test" for r in self.untested()]
        out += [f"{test} names unknown requirement {rid!r}" for test, rid in self.unknown]
        return out


def load_requirements(path: Path = REQUIREMENTS) -> tuple[list[Requirement], dict[str, str]]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    reqs = [Requirement(id=str(r["id"]), seed=str(r["seed"]), text=str(r["text"])) for r in data["requirements"]]
    ids = [r.id for r in reqs]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ValueError(f"{path}: duplicate requirement id(s) {', '.join(duplicates)}")
    seeds = {str(k): str(v) for k, v in data["seeds"].items()}
    unknown_seeds = sorted({r.seed for r in reqs} - seeds.keys())
    if unknown_seeds:
        raise ValueError(f"{path}: requirements of unknown seed(s) {', '.join(unknown_seeds)}")
    return reqs, seeds


def _req_ids(node: ast.expr) -> list[str]:
    """The ids of ``pytest.mark.req("A", "B")`` (also inside a list/tuple of marks)."""
    if isinstance(node, ast.List | ast.Tuple):
        return [i for elt in node.elts for i in _req_ids(elt)]
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "req"
        and isinstance(node.func.value, ast.Attribute)
        and node.func.value.attr == "mark"
    ):
        return [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    return []


def _decorated(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> list[str]:
    return [i for d in node.decorator_list for i in _req_ids(d)]


def scan_tests(folder: Path = TESTS) -> dict[str, list[str]]:
    """Every test (``file::Class::name``) that names requirements, with the ids it names."""
    found: dict[str, list[str]] = {}
    for path in sorted(folder.glob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        module: list[str] = []
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
            ):
                module += _req_ids(node.value)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
                ids = module + _decorated(node)
                if ids:
                    found[f"{path.name}::{node.name}"] = ids
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                outer = module + _decorated(node)
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name.startswith("test"):
                        ids = outer + _decorated(item)
                        if ids:
                            found[f"{path.name}::{node.name}::{item.name}"] = ids
    return found


def trace(requirements: Path = REQUIREMENTS, tests: Path = TESTS) -> Trace:
    reqs, seeds = load_requirements(requirements)
    known = {r.id for r in reqs}
    out = Trace(requirements=reqs, seeds=seeds)
    for test, ids in scan_tests(tests).items():
        for rid in dict.fromkeys(ids):
            if rid in known:
                out.tests.setdefault(rid, []).append(test)
            else:
                out.unknown.append((test, rid))
    return out


def render(t: Trace) -> str:
    covered = len(t.requirements) - len(t.untested())
    lines = [
        "# Traceability: the seeds' requirements and their tests",
        "",
        "Generated by `python tools/traceability.py --write` from [requirements.yaml](requirements.yaml) and the",
        '`@pytest.mark.req("ID")` markers of the tests; `make test` fails when a requirement has no test, when',
        "a test names an unknown requirement, or when this file is out of date. Do not edit it by hand.",
        "",
        f"**{covered} of {len(t.requirements)} requirements have a test** "
        f"({sum(len(v) for v in t.tests.values())} test references).",
        "",
    ]
    for seed, name in t.seeds.items():
        reqs = [r for r in t.requirements if r.seed == seed]
        lines += [f"## Seed {seed} (`{name}`)", "", "| requirement | | tests |", "|---|---|---|"]
        for r in reqs:
            tests = t.tests.get(r.id, [])
            cell = "<br>".join(f"`{x}`" for x in tests) if tests else "**none**"
            lines.append(f"| `{r.id}` | {r.text.replace('|', '/')} | {cell} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="regenerate docs/traceability.md")
    parser.add_argument("--check", action="store_true", help="fail if docs/traceability.md is out of date")
    args = parser.parse_args(argv)
    t = trace()
    problems = t.problems()
    for p in problems:
        print(f"traceability: {p}", file=sys.stderr)
    text = render(t) + "\n"
    if args.write:
        DOC.write_text(text, encoding="utf-8")
        print(f"wrote {DOC.relative_to(ROOT)}")
    elif args.check and (not DOC.is_file() or DOC.read_text(encoding="utf-8") != text):
        print(
            "traceability: docs/traceability.md is out of date: python tools/traceability.py --write", file=sys.stderr
        )
        return 1
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
