"""A pre-registered analysis plan, and what it says of a run (``moot eval plan``).

A plan is written, and committed, before the run's first request (docs/results/preregistration/):
its arms as the run labels them, the number of items each must hold, one primary comparison with
its decision rule, and a family of secondary comparisons corrected together (Holm). Its analysis is
a pure function of the loaded run (:func:`analyse_plan`), fixed before the data is seen:

- **Blind until complete.** Nothing but how many items each arm holds is computed while any arm of
  the plan holds fewer than the plan's items: no accuracy, no difference, no descriptive figure (a
  pre-registration that reads its endpoints on a part of its items has no fixed n).
- **Paired on expected accuracy.** Each comparison pairs the two arms on the items both hold, each
  item's correctness in expectation over tie-breaks (a tied vote credited by the share of its tied
  answers that are right: :func:`moot.eval.analysis.expected_correctness`), the difference ``arm``
  minus ``against`` with moot's 95% interval and two-sided p-value (:func:`moot.stats.paired_test`).
- **The primary's rule.** The arm wins if the interval's lower bound is above 0; the baseline wins if
  its upper bound is below 0; otherwise no difference is shown at that n, and the interval says
  which gains it rules out.
- **The secondary family.** Holm's adjusted p-values over the whole family, beside each unadjusted
  interval; computed only when every comparison of the family is.
- **Descriptive, no test.** Each arm's expected accuracy with its Wilson interval, ties, calls and
  tokens per item, turns cut by the token cap, parse and extraction failures, selection judges that
  fell back to the vote, and herding (outvoted agents that took their peers' answer), as the run's
  report counts them (:func:`moot.eval.analysis.summarise`).
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from moot.eval.analysis import expected_correctness, summarise
from moot.eval.loaded import LoadedRun
from moot.eval.report_model import ProtocolSummary
from moot.files import InputFileError, read_text
from moot.stats import PairedTest, holm, paired_test, wilson


class PlanError(InputFileError):
    """A plan that cannot be read, or that names an arm the run cannot hold (one line, the fix)."""


class PlannedComparison(BaseModel):
    """Two arms on the same items: the difference is ``arm`` minus ``against``."""

    model_config = ConfigDict(extra="forbid")

    arm: str
    against: str
    #: What it asks, in the pre-registration's words.
    question: str = ""


class AnalysisPlan(BaseModel):
    """A pre-registered plan, as its YAML file writes it."""

    model_config = ConfigDict(extra="forbid")

    title: str
    #: Where the pre-registration is (its file), for the report to point to.
    registration: str = ""
    #: The items every arm must hold before anything is computed.
    items: int = Field(gt=0)
    primary: PlannedComparison
    secondary: list[PlannedComparison] = Field(default_factory=list)
    #: Arms described beyond those compared (in this order, after them).
    describe: list[str] = Field(default_factory=list)

    @classmethod
    def load(cls, path: Path) -> AnalysisPlan:
        """A plan file, or a :class:`PlanError` naming the file and what is wrong."""
        try:
            data = yaml.safe_load(read_text(path, "--plan"))
        except yaml.YAMLError as exc:
            raise PlanError(f"--plan {path}: not YAML ({str(exc).splitlines()[0]})") from None
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first["loc"]) or "(top level)"
            raise PlanError(f"--plan {path}: {where}: {first['msg']}") from None

    def arms(self) -> list[str]:
        """Every arm the plan names, once, in the order it names them."""
        named = [self.primary.arm, self.primary.against]
        for c in self.secondary:
            named += [c.arm, c.against]
        return list(dict.fromkeys([*named, *self.describe]))


class ArmStatus(BaseModel):
    label: str
    #: Items the arm holds a result for (a failed item is held: it counts as wrong).
    held: int
    #: Whether the run names the arm at all (a later stage's arm is not in it yet).
    in_run: bool


class ComparisonResult(BaseModel):
    comparison: PlannedComparison
    test: PairedTest
    #: Holm's adjusted p-value over the secondary family (None: the primary).
    p_holm: float | None = None


class ArmDescription(BaseModel):
    summary: ProtocolSummary
    expected_low: float
    expected_high: float


class PlanResult(BaseModel):
    plan: AnalysisPlan
    source: str
    status: list[ArmStatus]
    #: Every arm holds the plan's items: the endpoints below are computed (else they are all empty).
    complete: bool
    primary: ComparisonResult | None = None
    verdict: str | None = None
    secondary: list[ComparisonResult] = Field(default_factory=list)
    arms: list[ArmDescription] = Field(default_factory=list)


def verdict(c: PlannedComparison, t: PairedTest) -> str:
    """The primary's decision rule, fixed before the data: in words."""
    if t.ci_low > 0:
        return f"{c.arm} wins: the interval's lower bound is above 0"
    if t.ci_high < 0:
        return f"{c.against} wins: the interval's upper bound is below 0"
    return (
        f"no difference shown at n = {t.n}: the interval rules out a gain of {c.arm} over {c.against} above "
        f"{100 * t.ci_high:.1f} points and a loss beyond {100 * -t.ci_low:.1f}"
    )


def analyse_plan(run: LoadedRun, plan: AnalysisPlan) -> PlanResult:
    """What ``plan`` says of ``run`` (see the module's docstring): blind, with counts alone, until
    every arm holds the plan's items."""
    labels = set(run.config.protocols)
    status = [
        ArmStatus(label=a, held=len({r.item_id for r in run.results(a)}), in_run=a in labels) for a in plan.arms()
    ]
    complete = all(s.held >= plan.items for s in status)
    result = PlanResult(plan=plan, source=run.source, status=status, complete=complete)
    if not complete:
        return result
    items = {i.id: i for i in run.items()}
    expected = {a: expected_correctness(run, a, items, {r.item_id: r for r in run.results(a)}) for a in plan.arms()}

    def test(c: PlannedComparison) -> PairedTest:
        return paired_test(expected[c.against], expected[c.arm])

    primary = ComparisonResult(comparison=plan.primary, test=test(plan.primary))
    result.primary, result.verdict = primary, verdict(plan.primary, primary.test)
    tests = [test(c) for c in plan.secondary]
    adjusted = holm([t.p for t in tests])
    result.secondary = [
        ComparisonResult(comparison=c, test=t, p_holm=p)
        for c, t, p in zip(plan.secondary, tests, adjusted, strict=True)
    ]
    summaries = {s.label: s for s in summarise(run).protocols}
    for a in plan.arms():
        n = len(expected[a])
        low, high = wilson(sum(expected[a].values()), n)
        result.arms.append(ArmDescription(summary=summaries[a], expected_low=low, expected_high=high))
    return result


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _points(x: float) -> str:
    return f"{100 * x:+.1f}"


def render_plan(result: PlanResult) -> str:
    """The plan's report in Markdown: the arms' counts, then (once complete) the endpoints."""
    plan = result.plan
    out = [f"# {plan.title}", ""]
    out.append(f"- Run: `{result.source}`; each arm must hold {plan.items} items.")
    if plan.registration:
        out.append(f"- Pre-registration: {plan.registration}.")
    out += ["", "| arm | items held |", "| --- | ---: |"]
    for arm in result.status:
        held = f"{arm.held} of {plan.items}" if arm.in_run else "not in the run yet"
        out.append(f"| `{arm.label}` | {held} |")
    if not result.complete:
        out += [
            "",
            f"**Blind.** Nothing is computed until every arm holds all {plan.items} items (the pre-registration's "
            "rule): no accuracy, no difference, no descriptive figure.",
        ]
        return "\n".join(out) + "\n"
    assert result.primary is not None and result.verdict is not None
    p = result.primary
    out += [
        "",
        "## Primary endpoint",
        "",
        f"`{p.comparison.arm}` against `{p.comparison.against}`"
        + (f" ({p.comparison.question})" if p.comparison.question else "")
        + f", paired on {p.test.n} items: {_points(p.test.diff)} points of expected accuracy, 95% interval "
        f"[{_points(p.test.ci_low)}, {_points(p.test.ci_high)}], p = {p.test.p:.3f}.",
        "",
        f"**Decision: {result.verdict}.**",
    ]
    short = [c for c in [p, *result.secondary] if c.test.n < plan.items]
    if short:  # each arm holds its items, but not the same ones: a pair is on fewer than planned
        out += [
            "",
            "**A deviation:** "
            + "; ".join(f"`{c.comparison.arm}` against `{c.comparison.against}` pairs {c.test.n}" for c in short)
            + f" items, not {plan.items}: its arms hold different items.",
        ]
    if result.secondary:
        out += [
            "",
            f"## Secondary endpoints (Holm over {len(result.secondary)})",
            "",
            "| comparison | items | difference, points | 95% interval | p | Holm p |",
            "| --- | ---: | ---: | --- | ---: | ---: |",
        ]
        for c in result.secondary:
            t = c.test
            out.append(
                f"| `{c.comparison.arm}` against `{c.comparison.against}` | {t.n} | {_points(t.diff)} | "
                f"[{_points(t.ci_low)}, {_points(t.ci_high)}] | {t.p:.3f} | {c.p_holm:.3f} |"
            )
    out += [
        "",
        "## Descriptive (no test)",
        "",
        "| arm | expected accuracy [Wilson 95%] | ties | calls/item | tokens/item | turns cut | parse failures | "
        "no answer | judge fell back | outvoted, took peers' answer |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for d in result.arms:
        s = d.summary
        accuracy = s.expected_accuracy if s.expected_accuracy is not None else s.accuracy
        cut = f"{s.turn_lengths.cut} of {s.turn_lengths.turns}" if s.turn_lengths is not None else "–"
        fell_back = "–" if s.selection_fallbacks is None else str(s.selection_fallbacks)
        herding = "–" if s.outvoted is None else f"{s.adopted_peers or 0} of {s.outvoted}"
        out.append(
            f"| `{s.label}` | {_pct(accuracy)} [{_pct(d.expected_low)}, {_pct(d.expected_high)}] | {s.ties} | "
            f"{s.mean_calls:.2f} | {s.mean_tokens:.0f} | {cut} | {s.parse_failures} | {s.unextractable} | "
            f"{fell_back} | {herding} |"
        )
    return "\n".join(out) + "\n"
