"""Seed 004 in `moot eval report`: quality per protocol, the performance targets with intervals,
the cost per debate against `single`, and `moot eval judge`. Scripted models, the fixture items."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from moot.cli.main import app
from moot.eval.datasets import load_jsonl
from moot.eval.items import EvalItem
from moot.eval.quality import bias, ece, error_reduction, paired_bootstrap, relative_gain, verdict
from moot.eval.report import write_report
from moot.eval.runner import run_eval
from moot.eval.store import RunConfig, RunStore
from moot.models.base import ChatRequest
from moot.models.pricing import Price, PriceTable
from moot.models.scripted import ScriptedModel

SCIENCE = Path(__file__).parent / "fixtures" / "eval" / "science.jsonl"
ITEMS = load_jsonl(SCIENCE)
GOLD = {item.question: item for item in ITEMS}


def _item(request: ChatRequest) -> EvalItem:
    return next(item for q, item in GOLD.items() if q in request.messages[-1].content)


def solver(request: ChatRequest) -> dict[str, Any]:
    """A single answer is right on items 0-2 only; after reading the others, always right."""
    item = _item(request)
    revising = "other agents' recent answers" in request.messages[-1].content
    right = revising or ITEMS.index(item) < 3
    answer = item.answer if right else next(x for x in item.letters if x != item.answer)
    return {"reasoning": "because of the evidence", "answer": answer, "confidence": 0.8}


async def run(tmp_path: Path, dataset: str = str(SCIENCE)) -> Path:
    out = tmp_path / "run"
    cfg = RunConfig(dataset=dataset, n=6, protocols=["single", "society-of-minds"], model="scripted")
    if dataset == str(SCIENCE):
        (await run_eval(cfg, out, model=ScriptedModel(fn=solver))).close()
        return out
    # A named dataset: its items are the fixture's, so that no data package is needed.
    from unittest import mock

    import moot.eval.runner as runner_mod

    with mock.patch.object(runner_mod, "load_dataset", lambda *a, **k: list(ITEMS)):
        (await run_eval(cfg, out, model=ScriptedModel(fn=solver))).close()
    return out


def rows(report: Any) -> dict[tuple[str, str], Any]:
    return {(t.metric, t.protocol): t for t in report.quality.targets}


@pytest.mark.req("S004-VS-SINGLE", "S004-TARGETS", "S004-MONITOR-CONSENSUS")
async def test_the_report_has_seed_004s_targets_quality_and_cost(tmp_path: Path) -> None:
    out = await run(tmp_path)
    report, _ = write_report(out, PriceTable(prices={"scripted": Price(input=1.0, output=2.0)}))
    assert report.quality is not None
    targets = rows(report)
    acc = targets[("accuracy improvement over single", "society-of-minds")]
    assert acc.value == pytest.approx(1.0) and acc.n == 6  # 3 of 6 right alone, 6 of 6 after the debate
    assert acc.ci_low is not None and acc.ci_high is not None and acc.ci_low <= 1.0 <= acc.ci_high
    assert acc.phase1 == "+30%" and acc.phase1_verdict in ("met", "inconclusive")
    hal = targets[("hallucination reduction (truthfulqa-mc)", "society-of-minds")]
    assert hal.value is None and hal.phase1_verdict == "not measured" and "this run is" in hal.note
    rate = targets[("consensus rate", "society-of-minds")]
    assert rate.value == 1.0 and rate.n == 6 and rate.ci_low is not None and rate.ci_low < 1.0
    conf = targets[("decision confidence", "society-of-minds")]
    assert conf.value == 1.0 and conf.phase2_verdict == "met"  # every vote unanimous: a winning share of 1
    depth = targets[("reasoning depth score", "society-of-minds")]
    assert depth.value is None and "moot eval judge" in depth.note
    assert {t.protocol for t in report.quality.targets} == {"society-of-minds"}  # baselines have no targets
    quality = {p.label: {d.dimension: d for d in p.dimensions} for p in report.quality.protocols}
    som = quality["society-of-minds"]
    assert som["consensus_quality"].mean == 1.0 and som["consensus_quality"].measured == 6
    assert som["evidence_quality"].mean is None and "no context" in (som["evidence_quality"].reason or "")
    assert quality["single"]["argument_diversity"].reason is not None
    cost = {c.protocol: c for c in report.quality.cost}
    assert cost["single"].ratio_tokens == 1.0 and cost["single"].ratio_usd == 1.0
    assert (cost["society-of-minds"].ratio_tokens or 0) > 6 and cost["society-of-minds"].mean_usd is not None
    single_usd = cost["single"].mean_usd or 0
    assert single_usd == pytest.approx(
        sum(r.prompt_tokens + 2 * r.completion_tokens for r in RunStore.open(out).results("single")) / 6 / 1e6
    )
    compare = {c.metric: c for c in report.quality.comparison}
    accuracy = compare["accuracy (points)"]
    assert (accuracy.debate, accuracy.single, accuracy.gain, accuracy.n) == (1.0, 0.5, 0.5, 6)
    answer_bias = compare["answer bias reduction"]  # single's three wrong letters skew its answers
    assert answer_bias.debate == 0.0 and answer_bias.single is not None and answer_bias.single > 0
    assert answer_bias.gain == pytest.approx(answer_bias.single)
    calibration = compare["calibration (ECE reduction)"]  # both state 0.8: single is right half the time
    assert calibration.single == pytest.approx(0.3) and calibration.debate == pytest.approx(0.2)
    assert calibration.gain == pytest.approx(0.1) and calibration.n == 6
    assert "not judged" in compare["reasoning depth"].note
    md = (out / "report.md").read_text()
    for title in ("## Debate quality (seed 004)", "## Seed 004's performance targets", "## Cost per debate",
                  "## Comparison with a single agent (seed 004)"):  # fmt: skip
        assert title in md
    assert "| consensus rate | society-of-minds | 100.0% [" in md
    html = (out / "report.html").read_text()
    assert "Seed 004&#x27;s performance targets" in html or "Seed 004's performance targets" in html
    assert json.loads((out / "report.json").read_text())["quality"]["targets"]


@pytest.mark.req("S004-COST")
async def test_unpriced_runs_show_tokens_only(tmp_path: Path) -> None:
    out = await run(tmp_path)
    report, _ = write_report(out)
    assert report.quality is not None
    cost = {c.protocol: c for c in report.quality.cost}
    assert cost["society-of-minds"].mean_usd is None and cost["society-of-minds"].ratio_usd is None
    assert cost["society-of-minds"].note.startswith("tokens only: no price for scripted")
    assert cost["society-of-minds"].ratio_tokens is not None


@pytest.mark.req("S004-TARGETS")
async def test_hallucination_reduction_is_measured_on_truthfulqa(tmp_path: Path) -> None:
    out = await run(tmp_path, dataset="truthfulqa-mc")
    report, _ = write_report(out)
    hal = rows(report)[("hallucination reduction (truthfulqa-mc)", "society-of-minds")]
    assert hal.value == 1.0 and hal.n == 6  # single answered 3 falsely, the debate none
    assert hal.phase1 == "60%" and hal.phase1_verdict in ("met", "inconclusive")


@pytest.mark.req("S004-TARGETS")
def test_eval_judge_scores_the_run_for_the_report(tmp_path: Path) -> None:
    out = asyncio.run(run(tmp_path))  # the CLI runs its own event loop
    judge = tmp_path / "judge.json"
    reply = {"rationale": "steps shown", "logical_consistency": 5, "reasoning_depth": 4}
    judge.write_text(json.dumps([reply] * 12))
    result = CliRunner().invoke(app, ["eval", "judge", str(out), "--judge-model", f"scripted:{judge}"])
    assert result.exit_code == 0, result.output
    assert "judged 12 debate(s)" in result.output
    report, _ = write_report(out)
    assert report.quality is not None and report.quality.judges == [f"scripted:{judge}"]
    depth = rows(report)[("reasoning depth score", "society-of-minds")]
    assert depth.value == 0.75 and depth.n == 6 and depth.phase1_verdict == "not met"
    som = {d.dimension: d for d in report.quality.protocols[1].dimensions}
    assert som["logical_consistency"].mean == 1.0
    depth_vs_single = next(c for c in report.quality.comparison if c.metric == "reasoning depth")
    assert (depth_vs_single.debate, depth_vs_single.single, depth_vs_single.gain) == (0.75, 0.75, 0.0)
    again = CliRunner().invoke(app, ["eval", "judge", str(out), "--judge-model", f"scripted:{judge}"])
    assert again.exit_code == 0 and "judged 0 debate(s)" in again.output and "(12 judged before)" in again.output
    # a judge that fails stores nothing: its debates are judged again next time
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(["not json"] * 24))
    failed = CliRunner().invoke(app, ["eval", "judge", str(out), "--judge-model", f"scripted:{broken}", "-j", "1"])
    assert failed.exit_code == 1 and "12 debate(s) got no judgement" in failed.output
    missing = CliRunner().invoke(app, ["eval", "judge", str(tmp_path / "none"), "--judge-model", f"scripted:{judge}"])
    assert missing.exit_code == 2 and "holds no moot eval run" in missing.output


def test_eval_report_takes_prices(tmp_path: Path) -> None:
    script = tmp_path / "replies.json"
    script.write_text(json.dumps([{"reasoning": "r", "answer": "B", "confidence": 0.9}] * 8))
    out = tmp_path / "run"
    args = ["eval", "--dataset", str(SCIENCE), "--n", "4", "--protocols", "single", "-m", f"scripted:{script}",
            "--out", str(out), "-j", "1"]  # fmt: skip
    assert CliRunner().invoke(app, args).exit_code == 0
    priced = CliRunner().invoke(app, ["eval", "report", str(out), "--price", f"scripted:{script}=1,1"])
    assert priced.exit_code == 0, priced.output
    assert "| single | 4 |" in (out / "report.md").read_text() and "$0.0" in (out / "report.md").read_text()
    bad = CliRunner().invoke(app, ["eval", "report", str(out), "--price", "oops"])
    assert bad.exit_code == 2 and "MODEL=INPUT,OUTPUT" in bad.output


def test_the_statistics_of_the_targets() -> None:
    pairs = [(True, True), (False, True), (True, False), (False, True)]  # single 2/4, debate 3/4
    assert relative_gain(pairs) == 0.5 and error_reduction(pairs) == 0.5
    assert relative_gain([(False, True)]) is None and error_reduction([(True, True)]) is None
    value, low, high = paired_bootstrap(pairs, relative_gain)
    assert value == 0.5 and low is not None and high is not None and low <= 0.5 <= high
    assert paired_bootstrap(pairs, relative_gain) == (value, low, high)  # seeded: the same every time
    assert verdict(0.85, 0.9, 0.8) == "met" and verdict(0.5, 0.7, 0.8) == "not met"
    assert verdict(0.7, 0.9, 0.8) == "inconclusive" and verdict(None, None, 0.8) == "not measured"


@pytest.mark.req("S004-VS-SINGLE")
def test_answer_bias_and_calibration_error() -> None:
    assert bias(["A", "B", "C"], ["A", "B", "C"]) == 0.0
    assert bias(["A", "A", "A", "A"], ["A", "B", "C", "D"]) == 0.75  # always "A"
    assert bias(["B", None], ["A", "A"]) == 1.0
    assert ece([0.9, 0.9], [True, True]) == pytest.approx(0.1)
    assert ece([1.0, 0.0], [True, False]) == 0.0
    assert ece([0.75, 0.75, 0.25, 0.25], [True, False, False, False]) == pytest.approx(0.5 * 0.25 + 0.5 * 0.25)
