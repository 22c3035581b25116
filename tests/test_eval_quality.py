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
from moot.core.types import QUALITY_DIMENSIONS, DebateQuality, QualityScore
from moot.eval.datasets import load_jsonl
from moot.eval.items import EvalItem
from moot.eval.loaded import load_run
from moot.eval.quality import (
    POOLED,
    bias,
    error_reduction,
    relative_gain,
    validate,
    verdict,
)
from moot.eval.report import write_report
from moot.eval.runner import run_eval
from moot.eval.store import RunConfig, RunStore
from moot.models.base import ChatRequest
from moot.models.pricing import Price, PriceTable
from moot.models.scripted import ScriptedModel
from moot.stats import auroc, auroc_ci, ece, paired_bootstrap

SCIENCE = Path(__file__).parent / "fixtures" / "eval" / "science.jsonl"
ITEMS = load_jsonl(SCIENCE)
GOLD = {item.question: item for item in ITEMS}


def _item(request: ChatRequest) -> EvalItem:
    # a later round's agent holds its own conversation: the question is in its first user message
    return next(item for q, item in GOLD.items() if any(q in m.content for m in request.messages))


def solver(request: ChatRequest) -> dict[str, Any]:
    """A single answer is right on items 0-2 only; after reading the others, always right."""
    item = _item(request)
    revising = any(m.role == "assistant" for m in request.messages)  # its own earlier turn: a later round
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


# ------------------------------------------------------------------- issue 28: one agent, columns, validation


def splitter(request: ChatRequest) -> dict[str, Any]:
    """vote@3's agents: unanimous and right on items 0-2, two wrong against one right on 3-4, two right
    against one wrong on 5. A single agent (Agent 1) is wrong on items 3-4 only."""
    item = _item(request)
    index = ITEMS.index(item)
    agent = int(request.messages[0].content.split("Agent ", 1)[1][0]) if "Agent " in request.messages[0].content else 1
    wrong = next(x for x in item.letters if x != item.answer)
    if index < 3:
        answer = item.answer
    elif index < 5:
        answer = wrong if agent < 3 else item.answer
    else:
        answer = item.answer if agent < 3 else wrong
    return {"reasoning": f"agent {agent} on item {index}", "answer": answer, "confidence": 0.8}


async def split_run(tmp_path: Path) -> Path:
    out = tmp_path / "split"
    cfg = RunConfig(dataset=str(SCIENCE), n=6, protocols=["single", "vote@3"], model="scripted")
    (await run_eval(cfg, out, model=ScriptedModel(fn=splitter))).close()
    return out


async def test_the_report_does_not_score_one_agent_on_what_is_trivial_for_it(tmp_path: Path) -> None:
    out = await run(tmp_path)
    report, _ = write_report(out)
    assert report.quality is not None
    single = {d.dimension: d for d in report.quality.protocols[0].dimensions}
    assert report.quality.protocols[0].label == "single"
    for dim in ("consensus_quality", "decision_confidence", "overall_quality", "argument_diversity"):
        assert single[dim].mean is None and (single[dim].reason or "").startswith("n/a — one agent"), dim
    md = (out / "report.md").read_text()
    assert "| single | not measured (1) |" in md and "n/a — one agent (" in md
    assert "agrees with itself" in md  # the reason, under the table


def test_every_column_of_the_quality_tables_is_named_and_explained(tmp_path: Path) -> None:
    out = asyncio.run(run(tmp_path))
    write_report(out)
    md = (out / "report.md").read_text()
    quality_part = md[md.index("## Debate quality (seed 004)") :]
    headers = [line for line in quality_part.splitlines() if line.startswith("| ") and "---" not in line]
    heads = [line for line in headers if line.startswith(("| protocol |", "| metric |"))]
    assert len(heads) == 5  # quality, validation, targets, comparison, cost
    for head in heads:
        assert all(cell.strip() for cell in head.strip("|").split("|")), head  # no empty header
    targets = next(h for h in heads if "phase 1 target" in h)
    assert "phase 1 verdict" in targets and "seed's single-agent baseline" in targets
    assert "the value seed 004 states for a single agent" in quality_part
    for dim in QUALITY_DIMENSIONS:  # each dimension column says what it is
        assert f"{dim}: " in quality_part


async def test_validation_gives_each_dimensions_auroc_against_right_decisions(tmp_path: Path) -> None:
    out = await split_run(tmp_path)
    run = load_run(out)
    v = validate(run)
    assert validate(run) == v  # seeded: the same every time
    rows = {(r.dimension, r.protocol): r for r in v.rows}
    # consensus per item: 1, 1, 1 (right), 2/3, 2/3 (wrong), 2/3 (right): 7 of the 8 (right, wrong) pairs
    # ordered right and one tied
    consensus = rows[("consensus_quality", "vote@3")]
    assert (consensus.measured, consensus.right, consensus.auroc) == (6, 4, 0.875)
    assert consensus.ci_low is not None and consensus.ci_high is not None
    assert consensus.ci_low <= 0.875 <= consensus.ci_high <= 1.0
    assert rows[("decision_confidence", "vote@3")].auroc == 0.875  # an unweighted vote's share
    assert rows[("consensus_quality", "single")].measured == 0
    assert rows[("consensus_quality", "single")].note.startswith("n/a — one agent")
    pooled = rows[("consensus_quality", POOLED)]  # single's debates are not measured: vote@3's alone
    assert (pooled.debates, pooled.measured, pooled.auroc) == (12, 6, 0.875)
    assert "not judged" in rows[("reasoning_depth", "vote@3")].note
    # the report carries the same table
    report, _ = write_report(out)
    assert report.quality is not None and report.quality.validation == v
    assert "| vote@3 | 6 |" in (out / "report.md").read_text()


def test_auroc_is_the_mann_whitney_probability_with_ties_half() -> None:
    import random

    rng = random.Random(7)
    scores = [rng.choice([0.0, 0.25, 0.5, 0.75, 1.0]) for _ in range(60)]
    right = [rng.random() < 0.3 + 0.5 * s for s in scores]
    pos = [s for s, r in zip(scores, right, strict=True) if r]
    neg = [s for s, r in zip(scores, right, strict=True) if not r]
    pairwise = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))
    assert auroc(scores, right) == pytest.approx(pairwise)
    assert auroc([0.1, 0.2, 0.9], [False, False, True]) == 1.0
    assert auroc([0.9, 0.2], [False, True]) == 0.0 and auroc([0.5, 0.5], [True, False]) == 0.5
    assert auroc([0.1, 0.2], [True, True]) is None  # one class: undefined
    value, low, high = auroc_ci(scores, right, resamples=500, seed=3)
    assert value == pytest.approx(pairwise) and low is not None and high is not None and low < value < high
    assert auroc_ci(scores, right, resamples=500, seed=3) == (value, low, high)


def test_the_judges_outputs_are_stored_by_the_run_store_and_old_rows_still_read(tmp_path: Path) -> None:
    out = asyncio.run(run(tmp_path))
    store = RunStore.open(out)
    try:
        assert store.judgements("1") == {}  # a run never judged: nothing to read, and nothing written
        tables = {r[0] for r in store.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert RunStore.JUDGEMENTS not in tables
        # a row as moot wrote them before the store owned the table (no rationale): still read
        legacy = DebateQuality(judge="old-judge")
        legacy.scores["reasoning_depth"] = QualityScore(value=0.5, method="judge", details={"level": 3})
        store.conn.execute(
            "CREATE TABLE quality_judgements (protocol TEXT NOT NULL, item_id TEXT NOT NULL, judge TEXT NOT NULL, "
            "rubric TEXT NOT NULL, json TEXT NOT NULL, PRIMARY KEY (protocol, item_id, judge, rubric))"
        )
        store.conn.execute(
            "INSERT INTO quality_judgements VALUES (?, ?, ?, ?, ?)", ("single", "q1", "old-judge", "1",
                                                                       legacy.model_dump_json()),
        )  # fmt: skip
        store.conn.commit()
        assert store.judgements("1")[("single", "q1")].value("reasoning_depth") == 0.5
        newer = DebateQuality(judge="new-judge")
        newer.scores["reasoning_depth"] = QualityScore(value=1.0, method="judge", details={"rationale": "why"})
        store.save_judgement("single", "q1", "1", newer)
        assert store.judgements("1")[("single", "q1")].judge == "new-judge"  # the latest judge's
        assert store.judgements("1", judge="old-judge")[("single", "q1")].judge == "old-judge"
        assert store.judgements("2") == {}
    finally:
        store.close()


def test_eval_judge_keeps_the_rationale_and_judges_a_sample(tmp_path: Path) -> None:
    out = asyncio.run(run(tmp_path))
    judge = tmp_path / "judge.json"
    judge.write_text(json.dumps([{"rationale": "steps shown", "logical_consistency": 5, "reasoning_depth": 2}] * 4))
    spec = f"scripted:{judge}"
    result = CliRunner().invoke(app, ["eval", "judge", str(out), "--judge-model", spec, "-p", "single", "--limit", "2"])
    assert result.exit_code == 0, result.output
    assert "judged 2 debate(s)" in result.output
    store = RunStore.open(out)
    try:
        stored = store.judgements("1", judge=spec)
    finally:
        store.close()
    assert {p for p, _ in stored} == {"single"} and len(stored) == 2
    depth = next(iter(stored.values())).scores["reasoning_depth"]
    assert depth.details == {"level": 2, "rubric": "1", "rationale": "steps shown"} and depth.value == 0.25
    bad = CliRunner().invoke(app, ["eval", "judge", str(out), "--judge-model", spec, "-p", "nope"])
    assert bad.exit_code == 2 and "--protocol nope: the run holds no such protocol" in bad.output
    assert "Traceback" not in bad.output


def test_quality_validate_reads_a_run_folder_or_its_gzipped_store(tmp_path: Path) -> None:
    import gzip
    import shutil

    out = asyncio.run(split_run(tmp_path))
    table = CliRunner().invoke(app, ["quality", "validate", str(out)], env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    assert "consensus_quality" in table.output and "0.88 [" in table.output and "n/a — one agent" in table.output
    kept = tmp_path / "kept"  # as docs/results keeps a run: run.sqlite.gz alone
    kept.mkdir()
    with (out / "run.sqlite").open("rb") as src, gzip.open(kept / "run.sqlite.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    as_json = CliRunner().invoke(app, ["quality", "validate", str(kept), "--json", "--resamples", "200"])
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.stdout)
    assert data["resamples"] == 200 and data["dataset"] == str(SCIENCE)
    assert {(r["dimension"], r["protocol"]): r["auroc"] for r in data["rows"]}[("consensus_quality", "vote@3")] == 0.875
    assert not (kept / "run.sqlite").exists()  # decompressed elsewhere, and removed
    (tmp_path / "junk.gz").write_bytes(b"not gzip")
    (tmp_path / "notes.txt").write_text("x")
    (kept / "run.sqlite").write_text("not a database, " * 100)
    for bad, message in (
        (tmp_path / "missing", "does not exist"),
        (tmp_path / "junk.gz", "is not a gzipped moot run"),
        (tmp_path, "holds no moot eval run"),
        (tmp_path / "notes.txt", "is neither a run folder nor a run's store"),
        (kept / "run.sqlite", "is not a moot run's store"),
    ):
        result = CliRunner().invoke(app, ["quality", "validate", str(bad)])
        assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output, result.output
