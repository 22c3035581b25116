"""A pre-registered analysis plan, and what it says of a run (``moot eval plan``).

A plan is written, and committed, before the run's first request (docs/results/preregistration/):
its arms as the run labels them, the number of items each must hold, one primary comparison with
its decision rule, and a family of secondary comparisons corrected together (Holm). Its analysis is
a pure function of the loaded run (:func:`analyse_plan`), fixed before the data is seen:

- **Blind until complete.** Nothing but how many items each arm holds is computed while any arm of
  the plan holds fewer than the plan's items: no accuracy, no difference, no descriptive figure (a
  pre-registration that reads its endpoints on a part of its items has no fixed n). A run that
  cannot be finished is declared ended (``ended``: why): it is analysed on what it holds, each arm
  short of its items is a deviation, and a primary whose arms are short gets no decision.
- **The run as registered.** The plan's ``run`` settings (dataset, model, items, seeds, token cap)
  are checked against the run's: each one that differs is a deviation the report states.
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
  tokens per item, items failed (counted wrong), turns cut by the token cap, parse and extraction
  failures, selection judges that fell back to the vote, and herding (outvoted agents that took
  their peers' answer), as the run's report counts them (:func:`moot.eval.analysis.summarise`); and
  each vote at a debate's budget with its k and the figures k came from
  (:func:`moot.eval.protocols.auto_budget`).
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from moot.eval.analysis import expected_correctness, summarise
from moot.eval.loaded import LoadedRun
from moot.eval.protocols import AutoBudget, ProtocolRef, auto_budget, parse_ref
from moot.eval.report_model import ProtocolSummary
from moot.eval.store import RunConfig
from moot.files import InputFileError, first_error, load_yaml, read_text
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

    @model_validator(mode="after")
    def _two_arms(self) -> PlannedComparison:
        # An arm against itself is a difference of 0 by construction, not a finding.
        if self.arm == self.against:
            raise ValueError(
                f"arm and against are both {self.arm!r}: a comparison is between two different arms; name the "
                "other arm as against"
            )
        return self


class RegisteredRun(BaseModel):
    """The run's settings as registered (each one given is checked against the run's config)."""

    model_config = ConfigDict(extra="forbid")

    dataset: str | None = None
    model: str | None = None
    n: int | None = None
    seed: int | None = None
    skip: int | None = None
    seed_stride: int | None = None
    max_tokens: int | None = None

    def deviations(self, config: RunConfig) -> list[str]:
        """Each registered setting the run's config does not have, in words."""
        return [
            f"the run's {name} is {getattr(config, name)!r}, registered as {registered!r}"
            for name, registered in self.model_dump(exclude_none=True).items()
            if getattr(config, name) != registered
        ]


class AnalysisPlan(BaseModel):
    """A pre-registered plan, as its YAML file writes it."""

    model_config = ConfigDict(extra="forbid")

    title: str
    #: Where the pre-registration is (its file), for the report to point to.
    registration: str = ""
    #: The items every arm must hold before anything is computed.
    items: int = Field(gt=0)
    #: The run's settings as registered.
    run: RegisteredRun = Field(default_factory=RegisteredRun)
    primary: PlannedComparison
    secondary: list[PlannedComparison] = Field(default_factory=list)
    #: Arms described beyond those compared (in this order, after them).
    describe: list[str] = Field(default_factory=list)

    @classmethod
    def load(cls, path: Path) -> AnalysisPlan:
        """A plan file, or a :class:`PlanError` naming the file and what is wrong."""
        try:
            data = load_yaml(read_text(path, "--plan"))
        except yaml.YAMLError as exc:
            raise PlanError(f"--plan {path}: not YAML ({str(exc).splitlines()[0]})") from None
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            first = first_error(exc)
            where = ".".join(str(x) for x in first["loc"]) or "(top level)"
            raise PlanError(f"--plan {path}: {where}: {first['msg'].removeprefix('Value error, ')}") from None

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
    #: None: an arm of it holds no item (a run declared ended before it ran).
    test: PairedTest | None
    #: Holm's adjusted p-value over the secondary family (None: the primary, or a family not whole).
    p_holm: float | None = None


class ArmDescription(BaseModel):
    summary: ProtocolSummary
    expected_low: float
    expected_high: float
    #: A vote at a debate's budget: what its k came from, as the run's items give it now (or why
    #: there is none to match).
    budget: AutoBudget | None = None
    budget_error: str | None = None


class PlanResult(BaseModel):
    plan: AnalysisPlan
    source: str
    status: list[ArmStatus]
    #: Every arm holds the plan's items: the endpoints below are computed (else they are all empty,
    #: unless the run was declared ``ended``).
    complete: bool
    #: Why the run was declared ended before every arm held its items (None: it was not).
    ended: str | None = None
    #: What differs from the registration: its settings, arms short of (or over) their items.
    deviations: list[str] = Field(default_factory=list)
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


def analyse_plan(run: LoadedRun, plan: AnalysisPlan, ended: str | None = None) -> PlanResult:
    """What ``plan`` says of ``run`` (see the module's docstring): blind, with counts alone, until
    every arm holds the plan's items, or the run is declared ``ended`` (the reason)."""
    labels = set(run.config.protocols)
    status = [
        ArmStatus(label=a, held=len({r.item_id for r in run.results(a)}), in_run=a in labels) for a in plan.arms()
    ]
    if not any(s.in_run for s in status):
        raise PlanError(
            f"{run.source} runs none of the plan's arms (it runs {', '.join(run.config.protocols)}; the plan names "
            f"{plan.primary.arm}, ...): give the plan's run folder"
        )
    complete = all(s.held >= plan.items for s in status)
    deviations = plan.run.deviations(run.config)
    deviations += [f"`{s.label}` holds {s.held} items, more than the plan's {plan.items}" for s in status
                   if s.held > plan.items]  # fmt: skip
    result = PlanResult(plan=plan, source=run.source, status=status, complete=complete, deviations=deviations)
    if not complete and ended is None:
        return result
    if not complete:
        result.ended = ended
        result.deviations += [
            f"`{s.label}` holds {s.held} of its {plan.items} items: the run was declared ended ({ended})"
            for s in status
            if s.held < plan.items
        ]
    held = {s.label: s.held for s in status}
    items = {i.id: i for i in run.items()}
    expected = {a: expected_correctness(run, a, items, {r.item_id: r for r in run.results(a)}) for a in plan.arms()}

    def compared(c: PlannedComparison) -> ComparisonResult:
        ran = held[c.arm] and held[c.against]
        return ComparisonResult(comparison=c, test=paired_test(expected[c.against], expected[c.arm]) if ran else None)

    primary = result.primary = compared(plan.primary)
    if primary.test is not None and min(held[plan.primary.arm], held[plan.primary.against]) >= plan.items:
        result.verdict = verdict(plan.primary, primary.test)
    else:  # the registration: no decision on a part of the items, and no other endpoint in its place
        short = [f"`{a}` holds {held[a]} of {plan.items}" for a in (plan.primary.arm, plan.primary.against)]
        result.verdict = "no decision: " + " and ".join(short) + " items (a deviation)"
    result.secondary = [compared(c) for c in plan.secondary]
    tests = [c.test for c in result.secondary]
    if all(t is not None for t in tests):  # Holm over the whole family, or not at all
        for c, p in zip(result.secondary, holm([t.p for t in tests if t is not None]), strict=True):
            c.p_holm = p
    summaries = {s.label: s for s in summarise(run).protocols}
    for a in plan.arms():
        if a not in summaries or not held[a]:  # (a run ended before this arm ran: its count says so)
            continue
        low, high = wilson(sum(expected[a].values()), len(expected[a]))
        d = ArmDescription(summary=summaries[a], expected_low=low, expected_high=high)
        ref = _auto_ref(a, run.config.protocols)
        if ref is not None:
            try:
                d.budget = auto_budget(ref, run.config.protocols, run.results)
            except ValueError as exc:
                d.budget_error = str(exc)
        result.arms.append(d)
    return result


def _auto_ref(label: str, labels: list[str]) -> ProtocolRef | None:
    """A vote at a debate's budget as the run resolved it (its debate: ``ref=``, else the run's first
    debate), or None for any other arm. Only labels are read: no protocol file is loaded."""
    ref = parse_ref(label)
    if not ref.auto:
        return None
    if ref.reference is None:
        ref.reference = next((x for x in labels if x != label and not parse_ref(x).is_baseline), None)
    return ref if ref.reference is not None else None


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _points(x: float) -> str:
    return f"{100 * x:+.1f}"


def _interval(t: PairedTest) -> str:
    return f"{_points(t.diff)} points of expected accuracy, 95% interval [{_points(t.ci_low)}, {_points(t.ci_high)}]"


def _budget(b: AutoBudget) -> str:
    debate = f"k = {b.k}: `{b.reference}`"
    if b.by == "calls":
        return f"{debate} made {b.reference_mean:.2f} calls per item over {b.reference_items} finished items"
    assert b.sample_mean is not None
    return (
        f"{debate} spent {b.reference_mean:.1f} tokens per item over {b.reference_items} "
        f"finished items, one sample (`{b.sample}`) {b.sample_mean:.1f} over {b.sample_items}: "
        f"{b.reference_mean / max(b.sample_mean, 1.0):.2f} samples, rounded half up"
    )


def render_plan(result: PlanResult) -> str:
    """The plan's report in Markdown: the arms' counts, then (once complete, or declared ended) the
    endpoints, the deviations, the arms described."""
    plan = result.plan
    out = [f"# {plan.title}", ""]
    out.append(f"- Run: `{result.source}`; each arm must hold {plan.items} items.")
    if plan.registration:
        out.append(f"- Pre-registration: {plan.registration}.")
    if result.ended is not None:
        out.append(f"- **Declared ended before every arm held its items**: {result.ended}.")
    out += ["", "| arm | items held |", "| --- | ---: |"]
    for arm in result.status:
        held = f"{arm.held} of {plan.items}" if arm.in_run else "not in the run yet"
        out.append(f"| `{arm.label}` | {held} |")
    if not result.complete and result.ended is None:
        if result.deviations:
            out += ["", "**Deviations from the registration so far:** " + "; ".join(result.deviations) + "."]
        out += [
            "",
            f"**Blind.** Nothing is computed until every arm holds all {plan.items} items (the pre-registration's "
            "rule): no accuracy, no difference, no descriptive figure.",
        ]
        return "\n".join(out) + "\n"
    assert result.primary is not None and result.verdict is not None
    p = result.primary
    out += ["", "## Primary endpoint", ""]
    asked = f"`{p.comparison.arm}` against `{p.comparison.against}`" + (
        f" ({p.comparison.question})" if p.comparison.question else ""
    )
    if p.test is None:
        out.append(f"{asked}: not computed, an arm holds no item.")
    else:
        out.append(f"{asked}, paired on {p.test.n} items: {_interval(p.test)}, p = {p.test.p:.3f}.")
    out += ["", f"**Decision: {result.verdict}.**"]
    short = [c for c in [p, *result.secondary] if c.test is not None and c.test.n < plan.items]
    deviations = [
        *result.deviations,
        *(f"`{c.comparison.arm}` against `{c.comparison.against}` pairs {c.test.n} items, not {plan.items}"
          for c in short if c.test is not None),
    ]  # fmt: skip
    out += ["", "## Deviations from the registration", ""]
    out += (
        [f"- {d}." for d in deviations] if deviations else ["None found: the run's settings and items are the plan's."]
    )
    if result.secondary:
        holm_note = (
            "" if all(c.p_holm is not None for c in result.secondary) else ": not computed, the family is not whole"
        )
        out += [
            "",
            f"## Secondary endpoints (Holm over {len(result.secondary)}{holm_note})",
            "",
            "| comparison | items | difference, points | 95% interval | p | Holm p |",
            "| --- | ---: | ---: | --- | ---: | ---: |",
        ]
        for c in result.secondary:
            name = f"`{c.comparison.arm}` against `{c.comparison.against}`"
            t = c.test
            if t is None:
                out.append(f"| {name} | 0 | – | – | – | – |")
                continue
            adjusted = "–" if c.p_holm is None else f"{c.p_holm:.3f}"
            out.append(
                f"| {name} | {t.n} | {_points(t.diff)} | [{_points(t.ci_low)}, {_points(t.ci_high)}] | {t.p:.3f} | "
                f"{adjusted} |"
            )
    out += [
        "",
        "## Descriptive (no test)",
        "",
        "| arm | expected accuracy [Wilson 95%] | ties | calls/item | tokens/item | failed (counted wrong) | "
        "turns cut | parse failures | no answer | judge fell back | outvoted, took peers' answer |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for d in result.arms:
        s = d.summary
        accuracy = s.expected_accuracy if s.expected_accuracy is not None else s.accuracy
        cut = f"{s.turn_lengths.cut} of {s.turn_lengths.turns}" if s.turn_lengths is not None else "–"
        fell_back = "–" if s.selection_fallbacks is None else str(s.selection_fallbacks)
        herding = "–" if s.outvoted is None else f"{s.adopted_peers or 0} of {s.outvoted}"
        out.append(
            f"| `{s.label}` | {_pct(accuracy)} [{_pct(d.expected_low)}, {_pct(d.expected_high)}] | {s.ties} | "
            f"{s.mean_calls:.2f} | {s.mean_tokens:.0f} | {s.failed} | {cut} | {s.parse_failures} | "
            f"{s.unextractable} | {fell_back} | {herding} |"
        )
    budgets = [d for d in result.arms if d.budget is not None or d.budget_error is not None]
    if budgets:
        out += ["", "**The votes at a debate's budget** (k as the run fixed it, and the figures it came from):", ""]
        for d in budgets:
            b, stored = d.budget, d.summary.k
            line = f"- `{d.summary.label}`: " + (_budget(b) if b is not None else f"none: {d.budget_error}")
            if b is not None and stored is not None and int(stored) != b.k:
                line += f"; the run fixed k = {stored} (its debate's items then gave it)"
            out.append(line + ".")
    return "\n".join(out) + "\n"
