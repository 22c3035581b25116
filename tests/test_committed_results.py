"""The committed results are re-derived from what is committed of them, by today's analysis code.

Issue 29 rebuilt the eval wing as load -> analyse -> render and promised that no published number
changes. These tests hold every committed report to that: the 1.5B runs' report.json is re-derived
whole from its committed store; the 0.5B runs kept only their per-item rows (results.csv), so
their protocol table (accuracy, interval, calls, tokens, failures) is re-derived from those rows.
Issue 27's faithful runs are held the same way, from the snapshots tools/faithful_runs.sh resumes.
A change to the statistics or the store that moves a published number fails here, and the
report must then be regenerated and the change named in docs/results/README.md.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from moot.eval.analysis import EvalReport, summarise
from moot.eval.items import EvalItem
from moot.eval.store import ItemResult, RunConfig, RunStore
from moot.eval.tune import TuneReport

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"


def _without_date(report: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in report.items() if k != "generated_at"}


def _analysed_apart(code: str, *args: str) -> Any:
    """What ``code`` prints (JSON), run in a Python process of its own with ``args`` as sys.argv[1:].

    The whole-report re-derivations run there, out of the reach of ``make test``'s coverage: its
    line tracer (Python 3.11 has no cheaper one) makes them 3.4 times slower (arc-challenge-1.5b:
    24 s without, 81 s with), and the functions they run are covered by the eval tests already. A
    fresh process is also how a user re-derives a report: nothing another test loaded is shared."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COV_CORE_", "COVERAGE_"))}
    done = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=1800, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout)


SUMMARISE = """
import sys
from pathlib import Path
from moot.eval.analysis import summarise
from moot.eval.loaded import load_run
sys.stdout.write(summarise(load_run(Path(sys.argv[1]))).model_dump_json())
"""


@pytest.mark.parametrize(
    ("name", "store"),
    [
        ("arc-challenge-1.5b", "arc-challenge-1.5b/run.sqlite.gz"),
        ("commonsenseqa-1.5b", "commonsenseqa-1.5b/run.sqlite.gz"),
        # Issue 27's faithful debates: the snapshot that tools/faithful_runs.sh restores and resumes.
        ("faithful/arc-faithful", "faithful/arc-faithful.sqlite.gz"),
        ("faithful/csqa-faithful", "faithful/csqa-faithful.sqlite.gz"),
        # Its seed sets: Society of Minds and its votes on three draws of round 1 (CommonsenseQA, 100 items).
        ("faithful/csqa-seeds", "faithful/csqa-seeds.sqlite.gz"),
        # Issue 13's single-answer probe that picked the second benchmark.
        *((f"probe-1.5b/{d}", f"probe-1.5b/{d}/run.sqlite.gz") for d in ("boolq", "commonsenseqa", "gsm8k", "mmlu")),
    ],
)
def test_a_committed_report_is_its_store_analysed_today(name: str, store: str) -> None:
    # Loaded as every command loads a run (moot.eval.loaded.load_run: the gzipped copy itself).
    derived = _analysed_apart(SUMMARISE, str(RESULTS / store))
    committed = json.loads((RESULTS / name / "report.json").read_text(encoding="utf-8"))
    assert _without_date(derived) == _without_date(committed)
    assert next(iter(committed)) == "schema_version" and committed["schema_version"] == "moot.eval-report/1"


def test_the_write_ups_ablation_numbers_are_the_reports() -> None:
    """docs/results/README.md quotes debate-against-debate differences: they are the report's
    debate_pairs (the expected accuracy, paired), not numbers made beside it."""
    quoted = {
        ("arc", "society-of-minds", "vote@3"): (-5.0, -9.3, -0.6),
        ("arc", "society-of-minds", "society-of-minds(exchange=answer)"): (-5.2, -9.7, -0.5),
        ("arc", "society-of-minds", "society-of-minds(exchange=answer,history=prompt)"): (0.3, -5.1, 5.7),
        ("arc", "society-of-minds", "free-mad"): (0.2, -4.2, 4.6),
        ("csqa", "society-of-minds", "single"): (-2.8, -9.6, 4.0),
        ("csqa", "society-of-minds", "vote@3"): (-4.5, -7.8, -1.1),
        ("csqa", "society-of-minds", "society-of-minds(exchange=answer)"): (-0.3, -4.7, 4.0),
        ("csqa", "society-of-minds", "society-of-minds(exchange=answer,history=prompt)"): (-4.5, -9.3, 0.4),
        ("csqa", "society-of-minds", "free-mad"): (-1.3, -5.7, 3.1),
    }
    pairs = {}
    for run in ("arc", "csqa"):
        report = json.loads((RESULTS / "faithful" / f"{run}-faithful" / "report.json").read_text(encoding="utf-8"))
        for p in report["debate_pairs"]:
            pairs[(run, p["protocol"], p["against"])] = tuple(
                round(100 * p[k], 1) for k in ("diff", "ci_low", "ci_high")
            )
    written = " ".join((RESULTS / "README.md").read_text(encoding="utf-8").split())  # one line
    for key, numbers in quoted.items():
        assert pairs[key] == numbers, key
        diff, low, high = numbers
        assert f"{diff:+.1f} [{low:+.1f}, {high:+.1f}]" in written, key


def test_the_write_ups_comparisons_with_the_votes_are_the_reports() -> None:
    """The debates' paired differences with the votes at their calls and tokens that
    docs/results/README.md and the README quote for the 200 items of each benchmark are the reports'."""
    quoted = {
        "arc": {
            ("society-of-minds", "equal-calls vote"): (-5.9, -11.1, -0.6),
            ("society-of-minds", "equal-tokens vote"): (-7.4, -12.8, -1.9),
            ("free-mad", "equal-calls vote"): (-6.2, -12.0, -0.2),
            ("free-mad", "equal-tokens vote"): (-6.9, -12.2, -1.5),
            ("adaptive-debate", "equal-calls vote"): (-4.7, -9.4, 0.1),
            ("adaptive-debate", "equal-tokens vote"): (-4.1, -9.1, 1.0),
            ("mad-conformist", "equal-calls vote"): (0.1, -3.8, 4.0),
            ("mad-conformist", "equal-tokens vote"): (-0.8, -4.6, 3.1),
            ("society-of-minds(exchange=answer,history=prompt)", "equal-calls vote"): (-6.2, -11.1, -1.2),
            ("society-of-minds(exchange=answer)", "equal-calls vote"): (-0.8, -5.8, 4.3),
        },
        "csqa": {
            ("society-of-minds", "equal-calls vote"): (-1.8, -6.4, 2.7),
            ("society-of-minds", "equal-tokens vote"): (-1.8, -6.9, 3.2),
            ("free-mad", "equal-calls vote"): (-0.5, -5.5, 4.5),
            ("free-mad", "equal-tokens vote"): (-2.0, -7.3, 3.3),
            ("adaptive-debate", "equal-calls vote"): (-2.1, -6.3, 2.1),
            ("adaptive-debate", "equal-tokens vote"): (-2.2, -7.1, 2.6),
            ("mad-conformist", "equal-calls vote"): (0.5, -3.5, 4.5),
            ("mad-conformist", "equal-tokens vote"): (0.2, -4.0, 4.4),
            ("society-of-minds(exchange=answer,history=prompt)", "equal-calls vote"): (2.7, -1.8, 7.0),
            ("society-of-minds(exchange=answer,history=prompt)", "equal-tokens vote"): (4.2, -0.5, 8.9),
            ("society-of-minds(exchange=answer)", "equal-calls vote"): (-1.5, -5.7, 2.7),
        },
    }
    # Each text as one line: a line break may fall inside a quoted interval.
    results = " ".join((RESULTS / "README.md").read_text(encoding="utf-8").split())
    readme = " ".join((RESULTS.parent.parent / "README.md").read_text(encoding="utf-8").split())
    for run, numbers in quoted.items():
        report = json.loads((RESULTS / "faithful" / f"{run}-faithful" / "report.json").read_text(encoding="utf-8"))
        assert report["items"] == 200
        found = {
            (s["label"], c["kind"]): tuple(round(100 * c[k], 1) for k in ("diff", "ci_low", "ci_high"))
            for s in report["protocols"]
            for c in [s["comparison"], *s["other_comparisons"]]
            if c is not None and c["kind"] in ("equal-calls vote", "equal-tokens vote")
        }
        for key, (diff, low, high) in numbers.items():
            assert found[key] == (diff, low, high), (run, key)
            assert f"{diff:+.1f} [{low:+.1f}, {high:+.1f}]" in results, (run, key)
        for key in [("society-of-minds", "equal-calls vote"), ("society-of-minds", "equal-tokens vote")]:
            diff, low, high = found[key]
            interval = f"[{low:+.1f}, {high:+.1f}]"
            assert f"{diff:+.1f} points {interval}" in readme or f"{diff:+.1f} {interval}" in readme, (run, key)


def test_the_write_ups_faithful_tables_give_the_reports_expected_accuracy() -> None:
    """docs/results/README.md's tables of the faithful runs show the expected accuracy over tie-breaks
    (what every difference uses) beside the accuracy under the tie rule, both the reports' (issue 42)."""
    expected = {
        "arc": {"single": 53.0, "direct": 58.0, "vote@3": 61.5, "vote@6": 62.4, "society-of-minds": 56.5,
                "adaptive-debate": 57.0, "mad-conformist": 61.0, "free-mad": 56.2,
                "society-of-minds(exchange=answer)": 61.7, "society-of-minds(exchange=answer,history=prompt)": 56.2},
        "csqa": {"single": 55.5, "direct": 58.0, "vote@3": 57.2, "vote@6": 54.5, "society-of-minds": 52.7,
                 "adaptive-debate": 52.7, "mad-conformist": 54.7, "free-mad": 54.0,
                 "society-of-minds(exchange=answer)": 53.0, "society-of-minds(exchange=answer,history=prompt)": 57.2},
    }  # fmt: skip
    names = {"society-of-minds(exchange=answer)": "answer-only ablation",
             "society-of-minds(exchange=answer,history=prompt)": "the first version"}  # fmt: skip
    written = (RESULTS / "README.md").read_text(encoding="utf-8")
    for run, quoted in expected.items():
        report = json.loads((RESULTS / "faithful" / f"{run}-faithful" / "report.json").read_text(encoding="utf-8"))
        by = {p["label"]: p for p in report["protocols"]}
        for label, value in quoted.items():
            assert round(100 * by[label]["expected_accuracy"], 1) == value, (run, label)
            if label in names or label in ("society-of-minds", "adaptive-debate", "mad-conformist", "free-mad"):
                row = f"| {names.get(label, f'`{label}`')} | {value:.1f}% | {100 * by[label]['accuracy']:.1f}%"
                assert row in written, (run, row)
    assert written.count("| expected accuracy over tie-breaks (what the differences use) | accuracy, a tie to") == 2


def test_the_write_ups_seed_set_numbers_are_the_reports() -> None:
    """docs/results/README.md's table of the three draws of round 1 quotes the seed-set report's
    spreads (each draw's paired difference, then the mean and SD over draws), not numbers made beside it."""
    quoted = {
        "equal-calls vote": ([(1, 6.7, 0.9, 12.1), (4, -1.0, -7.1, 5.1), (7, -8.5, -14.7, -2.0)], -0.9, 7.6),
        "equal-tokens vote": ([(1, 7.2, 0.4, 13.6), (4, 0.2, -6.6, 6.9), (7, -8.5, -15.2, -1.4)], -0.4, 7.8),
        "its first round's vote": ([(1, -2.3, -6.9, 2.3), (4, 1.3, -5.1, 7.7), (7, -5.0, -10.3, 0.5)], -2.0, 3.2),
    }
    report = json.loads((RESULTS / "faithful" / "csqa-seeds" / "report.json").read_text(encoding="utf-8"))
    spreads = {
        sp["kind"]: (
            [(d[0], *(round(100 * x, 1) for x in d[1:4])) for d in sp["draws"]],
            round(100 * sp["mean"], 1),
            round(100 * sp["sd"], 1),
        )
        for sp in report["seed_spreads"]
        if sp["protocol"] == "society-of-minds"
    }
    assert spreads == quoted
    written = (RESULTS / "README.md").read_text(encoding="utf-8")
    for draws, mean, sd in quoted.values():
        assert f"{mean:+.1f} ({sd:.1f})" in written
        for _, diff, low, high in draws:
            assert f"{diff:+.1f} [{low:+.1f}, {high:+.1f}]" in written


def test_every_committed_report_json_is_read_by_todays_model() -> None:
    """The older reports (the 0.5B runs', written before ``schema_version``) read as version 1; a
    report of another version is refused by name."""
    reports = sorted(RESULTS.glob("**/report.json"))
    assert len(reports) >= 10
    for path in reports:
        assert EvalReport.model_validate_json(path.read_text(encoding="utf-8")).schema_version == "moot.eval-report/1"
    later = json.loads(reports[0].read_text(encoding="utf-8")) | {"schema_version": "moot.eval-report/2"}
    with pytest.raises(ValidationError, match="schema_version"):
        EvalReport.model_validate(later)


def _store_from_rows(name: str, tmp_path: Path) -> tuple[RunStore, dict[str, Any]]:
    """A run rebuilt from the per-item rows a committed report kept (no transcripts, no replies):
    enough for the protocol table, which is all those reports have."""
    committed = json.loads((RESULTS / name / "report.json").read_text(encoding="utf-8"))
    config = RunConfig.model_validate(committed["config"])
    with (RESULTS / name / "results.csv").open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    store = RunStore.open(tmp_path / name, config)
    ids = list(dict.fromkeys(r["item_id"] for r in rows))
    # The rows say whether each answer was right; the item's text and gold are not needed for that.
    store.save_items([EvalItem(id=i, question="?", answer="1", kind="number") for i in ids])
    for r in rows:
        store.save_result(
            ItemResult(
                protocol=r["protocol"], item_id=r["item_id"], status=r["status"], correct=r["correct"] == "1",
                extracted=r["extracted"] or None, calls=int(r["calls"]),
                prompt_tokens=int(r["prompt_tokens"]), completion_tokens=int(r["completion_tokens"]),
            ),
            None,
        )  # fmt: skip
    return store, committed


#: The protocol table's columns that the per-item rows determine.
FROM_ROWS = ("finished", "failed", "correct", "accuracy", "ci_low", "ci_high", "mean_calls",
             "mean_prompt_tokens", "mean_completion_tokens")  # fmt: skip


@pytest.mark.parametrize("name", ["arc-challenge", "gsm8k"])
def test_a_committed_protocol_table_is_its_rows_analysed_today(name: str, tmp_path: Path) -> None:
    store, committed = _store_from_rows(name, tmp_path)
    try:
        derived = {p.label: p for p in summarise(store).protocols}
    finally:
        if store.lock is not None:
            store.lock.release()
        store.conn.close()
    assert set(derived) == {p["label"] for p in committed["protocols"]}
    for p in committed["protocols"]:
        got = derived[p["label"]].model_dump()
        for key in FROM_ROWS:
            assert got[key] == pytest.approx(p[key], abs=1e-12), (p["label"], key)
    # The unextractable count is the rows' too (an answer the extractor could not read).
    for p in committed["protocols"]:
        assert derived[p["label"]].unextractable == p["unextractable"], p["label"]


def test_the_committed_absa_table_is_its_sentence_rows_analysed_today() -> None:
    """ABSA's runs kept one row per sentence (no sentence text): the table's sentence-label
    accuracies, their paired tests against the full pipeline, and the cost per sentence are
    re-derived from them with today's statistics module."""
    from moot.stats import discordant, mcnemar_exact

    with (RESULTS / "absa" / "sentences.csv").open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    runs: dict[str, dict[str, dict[str, str]]] = {}
    for r in rows:
        runs.setdefault(r["config"], {})[r["id"]] = r
    right = {name: {i: r["pred_label"] == r["gold_label"] for i, r in run.items()} for name, run in runs.items()}
    stage1 = {i: r["stage1_label"] == r["gold_label"] for i, r in runs["full"].items()}

    def pct(x: float) -> str:
        return f"{100 * x:.1f}%"

    def paired(run: dict[str, bool]) -> str:
        b, c, n = discordant(run, right["full"])
        return f"{b} / {c}, p = {mcnemar_exact(b, c):.2f} ({n} paired)"

    table = (RESULTS / "absa" / "report.md").read_text(encoding="utf-8")
    accuracy = [pct(sum(r.values()) / len(r)) for r in (right["full"], right["abl_no_debate"],
                right["abl_no_debate_override"], stage1)]  # fmt: skip
    assert f"| sentence-label accuracy | {' | '.join(accuracy)} |" in table
    tests = [paired(right["abl_no_debate"]), paired(right["abl_no_debate_override"]), paired(stage1)]
    assert f"only this right / only first right, McNemar p | – | {' | '.join(tests)} |" in table
    calls = [f"{sum(int(r['calls']) for r in runs[n].values()) / 30:.1f}" for n in ("full", "abl_no_debate")]
    tokens = [f"{sum(int(r['tokens']) for r in runs[n].values()) / 30:.0f}" for n in ("full", "abl_no_debate")]
    assert f"| calls / sentence | {calls[0]} | {calls[1]} |" in table
    assert f"| tokens / sentence | {tokens[0]} | {tokens[1]} |" in table


def test_the_write_ups_tune_numbers_are_the_tunes() -> None:
    """What docs/results/README.md and the README say each tune chose and how it did on the fresh
    items is what its committed tune.json holds."""
    quoted = {
        "arc-challenge": ("vote@3", "single", 57.3, (50.4, 64.0), (1.8, -5.2, 8.8), None),
        "commonsenseqa": (
            "weighted-vote(signal=answer_prob,softmax_t=0.2)", "vote@8", 60.5, (53.6, 67.0), (-2.7, -6.2, 0.9),
            (5.6, 2.0, 9.1),
        ),
    }  # fmt: skip
    results = " ".join((RESULTS / "README.md").read_text(encoding="utf-8").split())
    readme = " ".join((RESULTS.parent.parent / "README.md").read_text(encoding="utf-8").split())
    for name, (chosen, baseline, accuracy, (low, high), diff, tuning) in quoted.items():
        tune = json.loads((RESULTS / "tune" / name / "tune.json").read_text(encoding="utf-8"))
        held = tune["held_out"]
        assert (tune["chosen"], held["baseline"]) == (chosen, baseline), name
        assert round(100 * held["accuracy"], 1) == accuracy, name
        assert (round(100 * held["ci_low"], 1), round(100 * held["ci_high"], 1)) == (low, high), name
        assert tuple(round(100 * held[k], 1) for k in ("diff", "diff_ci_low", "diff_ci_high")) == diff, name
        for text in (results, readme):
            assert f"{diff[0]:+.1f} [{diff[1]:+.1f}, {diff[2]:+.1f}]" in text, name
        assert f"{accuracy:.1f}% [{low:.1f}, {high:.1f}]" in results, name
        if tuning is not None:
            comparison = tune["tuning_comparison"]
            assert tuple(round(100 * comparison[k], 1) for k in ("diff", "ci_low", "ci_high")) == tuning, name
            assert f"{tuning[0]:+.1f} [{tuning[1]:+.1f}, {tuning[2]:+.1f}]" in results, name


ANALYSE_TUNE = """
import json, sys
from pathlib import Path
from moot.eval.loaded import load_run
from moot.eval.tune import TuneReport, analyse_tune, render_markdown, tuned_protocol
from moot.models.pricing import PriceTable
folder = Path(sys.argv[1])
written = TuneReport.model_validate_json((folder / "tune.json").read_text(encoding="utf-8"))
tuning, holdout = load_run(folder / "tuning.sqlite.gz"), load_run(folder / "holdout.sqlite.gz")
# The command's price table (no --prices: empty, an embedded model costs $0).
derived, score = analyse_tune(
    written.config, written.split, tuning, holdout, PriceTable(), generated_at=written.generated_at
)
json.dump({"tune": json.loads(derived.model_dump_json()), "tuned": tuned_protocol(derived, score),
           "markdown": render_markdown(derived)}, sys.stdout)
"""


@pytest.mark.parametrize("name", ["arc-challenge", "commonsenseqa"])
def test_a_committed_tune_is_its_two_runs_analysed_today(name: str) -> None:
    """Issue 31's evidence: tune.json, and the evidence in tuned.yaml, re-derived from the committed
    tuning and held-out runs (tools/tune_runs.sh publish) by today's analyse_tune, with no model."""
    folder = RESULTS / "tune" / name
    committed = json.loads((folder / "tune.json").read_text(encoding="utf-8"))
    written = TuneReport.model_validate(committed)
    derived = _analysed_apart(ANALYSE_TUNE, str(folder))
    assert derived["tune"] == committed
    assert yaml.safe_load((folder / "tuned.yaml").read_text(encoding="utf-8")) == derived["tuned"]
    assert (folder / "tune.md").read_text(encoding="utf-8") == derived["markdown"]
    # The held-out items are ones no tuning item is: the confirmation is on fresh items.
    assert not set(written.split.tuning) & set(written.split.held_out) and len(written.split.held_out) == 200


def test_each_committed_reports_pair_heading_names_the_baselines_it_holds() -> None:
    """The pairs' heading said "and against one answer and the 3-sample vote" in a run without the
    vote (csqa-seeds): it names the baselines its rows hold, in report.md as in today's renderer."""
    from moot.eval.render import _pairs_title

    checked = 0
    for path in sorted(RESULTS.glob("**/report.json")):
        report = EvalReport.model_validate_json(path.read_text(encoding="utf-8"))
        if not report.debate_pairs:
            continue
        title = _pairs_title(report)
        assert f"## {title}\n" in (path.parent / "report.md").read_text(encoding="utf-8"), (path, title)
        checked += 1
    assert checked >= 5


PLAN = """
import json, sys
from pathlib import Path
from moot.eval.loaded import load_run
from moot.eval.plan import AnalysisPlan, analyse_plan, render_plan
result = analyse_plan(load_run(Path(sys.argv[1])), AnalysisPlan.load(Path(sys.argv[2])))
sys.stdout.write(json.dumps({"markdown": render_plan(result), "result": result.model_dump(mode="json")}))
"""
PREREG = "docs/results/gsm8k-prereg/run.sqlite.gz"
PREREG_PLAN = "docs/results/preregistration/gsm8k-plan.yaml"


@pytest.fixture(scope="module")
def gsm8k_prereg() -> dict[str, Any]:
    """Issue 42's registered analysis, run on the committed (lean) store as `moot eval plan` runs it."""
    root = RESULTS.parent.parent
    cwd = Path.cwd()
    os.chdir(root)  # the report names the store as it was given: relative to the checkout
    try:
        derived: dict[str, Any] = _analysed_apart(PLAN, PREREG, PREREG_PLAN)
    finally:
        os.chdir(cwd)
    return derived


def test_the_committed_gsm8k_prereg_report_is_its_store_analysed_today(gsm8k_prereg: dict[str, Any]) -> None:
    committed = (RESULTS / "gsm8k-prereg" / "report.md").read_text(encoding="utf-8")
    assert gsm8k_prereg["markdown"] == committed
    result = gsm8k_prereg["result"]
    assert result["complete"] and result["ended"] is None and result["deviations"] == []
    assert all(arm["held"] == 300 for arm in result["status"]) and len(result["status"]) == 10


def test_the_write_ups_gsm8k_numbers_are_the_registered_analysis(gsm8k_prereg: dict[str, Any]) -> None:
    """docs/results/README.md answers Yang et al. with the primary endpoint, and quotes the secondary
    family and each arm's accuracy: each number is the analysis's, rounded as printed."""
    result = gsm8k_prereg["result"]
    written = " ".join((RESULTS / "README.md").read_text(encoding="utf-8").split())  # one line

    def interval(test: dict[str, Any]) -> str:
        return f"{100 * test['diff']:+.1f} [{100 * test['ci_low']:+.1f}, {100 * test['ci_high']:+.1f}]"

    primary = result["primary"]["test"]
    assert interval(primary) == "-3.9 [-8.8, +1.1]" and f"p = {primary['p']:.2f})" in written
    points, bounds = interval(primary).split(" ", 1)
    assert f"**{points} points of expected accuracy {bounds}** against the vote at its own tokens" in written
    assert result["verdict"].startswith("no difference shown at n = 300")
    for c in result["secondary"]:
        p, holm = c["test"]["p"], c["p_holm"]
        shown = [f"{x:.3f}" if f"{x:.3f}" != "0.000" else "<0.001" for x in (p, holm)]
        assert f"| {interval(c['test'])} | {shown[0]} | {shown[1]} |" in written, c["comparison"]
    for arm in result["arms"]:
        s = arm["summary"]
        accuracy = (
            f"{100 * s['expected_accuracy']:.1f}% [{100 * arm['expected_low']:.1f}, {100 * arm['expected_high']:.1f}]"
        )
        tokens = s["mean_prompt_tokens"] + s["mean_completion_tokens"]
        assert f"| {accuracy} | {s['ties']} | {s['mean_calls']:.2f} | {tokens:,.0f} |" in written, s["label"]


def test_the_gsm8k_registration_was_committed_before_the_runs_first_request(tmp_path: Path) -> None:
    """Issue 42's "done when": the registration's commit precedes the first request in the store."""
    import gzip
    import shutil
    import sqlite3
    from datetime import datetime

    root = RESULTS.parent.parent
    git = ["git", "-C", str(root)]
    if (
        subprocess.run([*git, "rev-parse", "--is-shallow-repository"], capture_output=True, text=True).stdout.strip()
        != "false"
    ):
        pytest.skip("this checkout has no whole git history (a shallow clone, or none): clone it whole to check this")
    added = subprocess.run(
        [*git, "log", "--diff-filter=A", "--format=%cI", "--", "docs/results/preregistration/gsm8k.md"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert len(added) == 1, added
    with gzip.open(RESULTS / "gsm8k-prereg" / "run.sqlite.gz") as packed, (tmp_path / "run.sqlite").open("wb") as out:
        shutil.copyfileobj(packed, out)
    with sqlite3.connect(tmp_path / "run.sqlite") as db:
        (first,) = db.execute("SELECT min(created) FROM request_cache").fetchone()
    assert datetime.fromisoformat(added[0]) < datetime.fromisoformat(first), (added[0], first)


def test_an_export_of_the_committed_arc_store_says_why_every_debate_stopped() -> None:
    """20 `single` results of the ARC store were recorded before their rows kept `stop_reason`
    (docs/results/README.md): an export showed it blank (an outside re-check, session 38). The export
    reads it from the transcript where the row lacks it; the store is unchanged."""
    from moot.eval.export import export_rows
    from moot.eval.loaded import load_run

    run = load_run(RESULTS / "arc-challenge-1.5b" / "run.sqlite.gz")
    assert sum(1 for r in run.results("single") if r.stop_reason is None) == 20  # as recorded
    rows = [r for r in export_rows(run) if r.protocol == "single"]
    assert len(rows) == 200 and {r.stop_reason for r in rows} == {"max_rounds"}
