"""The comparison's statistics: one tie rule, expected accuracy over tie-breaks, baselines fixed by
the budget, and the goal's family corrected for multiplicity."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pytest

from moot.eval.analysis import FIRST_ROUND
from moot.eval.pool import PoolScores, Sample, _credit, _decide
from moot.eval.report import Comparison, EvalReport, ProtocolSummary, _goal, corrected_family, summarise
from moot.eval.runner import run_eval
from moot.eval.store import RunConfig, RunStore
from moot.models.base import ChatRequest
from moot.models.scripted import ScriptedModel
from moot.stats import holm, mcnemar_exact, paired_diff_ci, paired_test, tie_credit, total

SCIENCE = Path(__file__).parent / "fixtures" / "eval" / "science.jsonl"


def test_holm_adjusts_step_down_and_keeps_order() -> None:
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5]) == [0.5]
    assert holm([0.001, 0.2, 0.9, 0.02]) == pytest.approx([0.004, 0.4, 0.9, 0.06])


def test_the_paired_test_is_agresti_min_on_binary_items_and_agrees_with_its_p() -> None:
    first = {str(i): float(i % 3 != 0) for i in range(120)}
    second = {str(i): float(i % 5 != 0) for i in range(120)}
    t = paired_test(first, second)
    assert (t.diff, t.ci_low, t.ci_high) == pytest.approx(paired_diff_ci(t.only_first, t.only_second, 120))
    assert (t.ci_low > 0) == (t.p < 0.05)
    # Close to the exact McNemar test at this n.
    assert t.p == pytest.approx(mcnemar_exact(t.only_first, t.only_second), abs=0.03)


def test_a_tie_is_credited_by_the_share_of_its_tied_answers_that_are_right() -> None:
    assert tie_credit(["A", "B"], {"A": True, "B": False}) == 0.5
    assert tie_credit(["A", "B", "C"], {"A": False, "B": True, "C": True}) == pytest.approx(2 / 3)
    assert tie_credit(["A"], None, correct=True) == 1.0


def test_the_pool_breaks_ties_as_the_protocols_do_and_reports_the_expectation() -> None:
    right = {"A": True, "B": False}
    # Two samples, one each: the tie goes to the answer given first (the lower seed), as a vote does.
    ab = [Sample(answer="B", correct=False), Sample(answer="A", correct=True)]
    assert _decide(ab, None, math.inf) == "B"
    assert _credit(ab, None, math.inf, lambda a: right[a]) == (0.0, 0.5)
    # Over every 2-subset of four samples A, B, A, B: four of six subsets tie.
    pool = [Sample(answer=a, correct=right[a]) for a in "ABAB"]
    scores = PoolScores()
    ruled, expected = scores.item("vote@4", pool, lambda a: right[a], 2, None, math.inf, "item")
    assert expected == pytest.approx((1 + 0 + 4 * 0.5) / 6)
    # A tied subset goes to the answer of its lowest seed: A in (0,1), (0,3), (2,3); B in (1,2).
    assert ruled == pytest.approx((1 + 0 + 3) / 6)
    # Asked again (another analysis of the same pool), the item's score is the one computed; a pool
    # cut to fewer samples is another score.
    assert scores.item("vote@4", pool, lambda a: False, 2, None, math.inf, "item") == (ruled, expected)
    assert scores.item("vote@4", pool[:2], lambda a: right[a], 2, None, math.inf, "item") == (1.0, 0.5)


async def test_a_protocols_ties_are_reported_and_its_comparisons_use_the_expectation(tmp_path: Path) -> None:
    # Three agents on items of four options: agent 1 right, agents 2 and 3 on two other wrong
    # letters: a three-way tie that the tie rule gives to agent 1 (right), a third right in expectation.
    def answer(request: ChatRequest) -> dict[str, object]:
        return {"reasoning": "r", "answer": "ABC"[((request.seed or 1) - 1) % 3], "confidence": 0.5}

    cfg = RunConfig(dataset=str(SCIENCE), protocols=["vote@3"], model="scripted", n=6)
    (await run_eval(cfg, tmp_path / "run", model=ScriptedModel(fn=answer))).close()
    report = summarise(RunStore.open(tmp_path / "run"))
    vote = report.protocols[0]
    assert vote.ties == 6  # every item: A, B, C
    items = {i.id: i for i in RunStore.open(tmp_path / "run").items()}
    right_letters = [sum(x == i.answer for x in "ABC") for i in items.values()]
    assert vote.expected_accuracy == pytest.approx(sum(n / 3 for n in right_letters) / 6)
    assert vote.accuracy == pytest.approx(sum(i.answer == "A" for i in items.values()) / 6)


def test_the_goal_is_corrected_for_the_family_and_says_what_clears_only_uncorrected() -> None:
    rows = [(f"rule {i}", 0.0, -0.05, 0.05, None) for i in range(19)]
    rows.append(("lucky rule", 0.04, 0.001, 0.079, None))  # clears 0 at 95% alone
    family = corrected_family(rows)
    lucky = family[-1]
    assert lucky.ci95_low > 0 and lucky.low < 0 and lucky.p < 0.05 and lucky.p_holm > 0.05
    # The corrected interval is wider by the Bonferroni quantile's ratio.
    assert (lucky.high - lucky.low) / (lucky.ci95_high - lucky.ci95_low) == pytest.approx(3.0239 / 1.96, rel=1e-3)

    def comparison(diff: float, lo: float, hi: float) -> Comparison:
        return Comparison(baseline="vote@3", paired=200, diff=diff, ci_low=lo, ci_high=hi, p_value=0.04,
                          only_debate_right=20, only_baseline_right=12)  # fmt: skip

    debates = [
        ProtocolSummary(label=f"debate-{i}", baseline=False, finished=200, comparison=comparison(*row[1:4]))
        for i, row in enumerate(rows)
    ]
    cfg = RunConfig(dataset="x.jsonl", protocols=[d.label for d in debates], model="m")
    report = EvalReport(config=cfg, items=200, generated_at="now", protocols=debates)
    text = "\n".join(_goal(report))
    assert "nothing reaches it" in text and "would clear 0 at an uncorrected 95%" in text and "Holm" in text
    # The family is the report's data, not only its prose: report.json holds it, read back as written.
    assert report.goal is not None and len(report.goal.comparisons) == 20
    assert not any(f.beats or f.cheaper for f in report.goal.comparisons)
    back = EvalReport.model_validate_json(report.model_dump_json())
    assert back.goal == report.goal
    # A gain the corrected interval keeps above 0 reaches the goal, flagged in the data.
    debates[0].comparison = comparison(0.2, 0.15, 0.25)
    won = EvalReport(config=cfg, items=200, generated_at="now", protocols=debates)
    assert won.goal is not None and [f.name for f in won.goal.comparisons if f.beats] == [
        "debate-0 against vote@3 (equal-calls vote)"
    ]
    assert "(Holm p = " in "\n".join(_goal(won))


async def test_the_vote_at_a_debates_tokens_comes_from_the_pool_when_the_run_has_none(tmp_path: Path) -> None:
    def answer(request: ChatRequest) -> dict[str, object]:
        return {"reasoning": "r", "answer": "A" if (request.seed or 0) % 2 else "B", "confidence": 0.5}

    cfg = RunConfig(dataset=str(SCIENCE), protocols=["single", "vote@8", "society-of-minds"], model="scripted", n=4)
    (await run_eval(cfg, tmp_path / "run", model=ScriptedModel(fn=answer))).close()
    report = summarise(RunStore.open(tmp_path / "run"))
    som = next(s for s in report.protocols if s.label == "society-of-minds")
    kinds = {c.kind: c for c in [som.comparison, *som.other_comparisons] if c is not None}
    # 6 calls: no vote@6 in the run, so the pool's vote at 6 (its 6-subsets) is the equal-calls vote.
    assert kinds["equal-calls vote"].baseline == "vote@6 on vote@8" and kinds["equal-calls vote"].derived
    tokens = kinds.get("equal-tokens vote")
    single = next(s for s in report.protocols if s.label == "single")
    k = int(som.mean_tokens / single.mean_tokens + 0.5)
    if k <= 8:
        assert tokens is not None and tokens.derived and tokens.baseline == f"vote@{k} on vote@8"
    else:
        # A debate's prompts carry the others' replies: more tokens than the pool holds samples. Said, not hidden.
        assert tokens is None and any("by=tokens" in m for m in som.missing_baselines)


async def test_a_debate_on_several_draws_of_round_one_reports_the_spread_of_its_differences(tmp_path: Path) -> None:
    def answer(request: ChatRequest) -> dict[str, object]:
        # Seeds 1-3 answer A (never gold here), 4-6 answer B (gold on half the items): the same debate
        # looks better or worse by its draw alone.
        says_a = (request.seed or 1) <= 3 or "other agents" in request.messages[-1].content
        return {"reasoning": "r", "answer": "A" if says_a else "B", "confidence": 0.5}

    protocols = ["society-of-minds", "vote@6", "society-of-minds(first_seed=4)", "vote@6(first_seed=4)", "vote@3",
                 "vote@3(first_seed=4)"]  # fmt: skip
    cfg = RunConfig(dataset=str(SCIENCE), protocols=protocols, model="scripted", n=6)
    (await run_eval(cfg, tmp_path / "run", model=ScriptedModel(fn=answer))).close()
    report = summarise(RunStore.open(tmp_path / "run"))
    by = {s.label: s for s in report.protocols}
    # Each draw's debate is paired with its own draw's vote at its calls.
    assert by["society-of-minds(first_seed=4)"].comparison is not None
    assert by["society-of-minds(first_seed=4)"].comparison.baseline == "vote@6(first_seed=4)"
    assert by["society-of-minds"].comparison is not None and by["society-of-minds"].comparison.baseline == "vote@6"
    # And the votes derived from a pool (the adaptive vote) come from its own draw's samples too.
    for label, pool in (("society-of-minds", "vote@6"), ("society-of-minds(first_seed=4)", "vote@6(first_seed=4)")):
        derived = [c.baseline for c in by[label].other_comparisons if c.derived]
        assert derived and all(b.endswith(f" on {pool}") for b in derived), (label, derived)
    assert report.pool is not None and report.pool.pool == "vote@6"  # the report's pool: draw 1's
    spread = next(sp for sp in report.seed_spreads if sp.kind == "equal-calls vote")
    assert spread.protocol == "society-of-minds" and [d[0] for d in spread.draws] == [1, 4]
    assert spread.low <= spread.mean <= spread.high
    # Against the vote of its own first round: draw 4's first answers (B, gold on half the items) are
    # talked into A in round 2 (-50 points); draw 1's were A already (0).
    pairs = {(p.protocol, p.against): p.diff for p in report.debate_pairs}
    assert pairs[("society-of-minds(first_seed=4)", "vote@3(first_seed=4)")] == pytest.approx(-0.5)
    assert ("society-of-minds(first_seed=4)", "vote@3") not in pairs  # another draw's vote is not its first round
    first = next(sp for sp in report.seed_spreads if sp.kind == FIRST_ROUND)
    assert [(d[0], round(d[1], 6)) for d in first.draws] == [(1, 0.0), (4, -0.5)]


async def test_the_report_counts_how_often_an_outvoted_agent_takes_its_peers_answer(tmp_path: Path) -> None:
    def answer(request: ChatRequest) -> dict[str, object]:
        # Round 1: agent 3 alone says B. Round 2: everyone says A (agent 3 herds).
        return {"reasoning": "r", "answer": "B" if request.seed == 3 and len(request.messages) == 2 else "A",
                "confidence": 0.5}  # fmt: skip

    cfg = RunConfig(dataset=str(SCIENCE), protocols=["society-of-minds", "vote@3"], model="scripted", n=4)
    (await run_eval(cfg, tmp_path / "run", model=ScriptedModel(fn=answer))).close()
    report = summarise(RunStore.open(tmp_path / "run"))
    som = next(s for s in report.protocols if s.label == "society-of-minds")
    assert (som.adopted_peers, som.outvoted) == (4, 4)
    vote = next(s for s in report.protocols if s.label == "vote@3")
    assert vote.outvoted is None  # one round: nobody was outvoted between rounds


def test_export_reads_a_committed_gzipped_store_and_refuses_a_folder_as_output(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from moot.cli.main import app

    store = Path(__file__).parent.parent / "docs" / "results" / "commonsenseqa-1.5b"
    if not (store / "run.sqlite.gz").is_file():
        pytest.skip("the committed CommonsenseQA store is not in this checkout")
    out = tmp_path / "rows.jsonl"
    runner = CliRunner()
    done = runner.invoke(app, ["eval", "export", str(store), "-f", "jsonl", "-o", str(out)])
    assert done.exit_code == 0 and len(out.read_text().splitlines()) == 2200
    refused = runner.invoke(app, ["eval", "export", str(store), "-o", str(tmp_path)])
    assert refused.exit_code == 2 and "cannot write" in refused.output


async def test_the_export_marks_every_tie_even_one_whose_tied_answers_are_all_wrong(tmp_path: Path) -> None:
    # Four samples split A, A, C, C on every item: a tie on each. Where the gold is neither A nor C the
    # tie is all wrong (0 expected, as if not tied): the row says tie all the same.
    def answer(request: ChatRequest) -> dict[str, object]:
        return {"reasoning": "r", "answer": "AC"[((request.seed or 1) - 1) // 2], "confidence": 0.5}

    from moot.eval.export import export_rows

    cfg = RunConfig(dataset=str(SCIENCE), protocols=["single", "vote@4"], model="scripted", n=6)
    (await run_eval(cfg, tmp_path / "run", model=ScriptedModel(fn=answer))).close()
    store = RunStore.open(tmp_path / "run")
    rows = list(export_rows(store))
    items = {i.id: i for i in store.items()}
    votes = [r for r in rows if r.protocol == "vote@4"]
    assert len(votes) == 6 and all(r.tie for r in votes)
    assert not any(r.tie for r in rows if r.protocol == "single")
    for r in votes:
        gold = items[r.item_id].answer
        assert r.expected_correct == (0.5 if gold in ("A", "C") else 0.0), (r.item_id, gold)
    assert any(r.expected_correct == 0.0 for r in votes)  # an all-wrong tie is among them
    store.close()


async def test_a_debate_is_paired_with_its_first_rounds_vote_only_when_its_first_round_is_that_vote(
    tmp_path: Path,
) -> None:
    def answer(request: ChatRequest) -> dict[str, object]:
        # At temperature 0.2 the first answers differ from the 0.7 samples of vote@3.
        cold = request.temperature == 0.2 and len(request.messages) == 2
        return {"reasoning": "r", "answer": "C" if cold else "B", "confidence": 0.5}

    protocols = ["single", "vote@3", "society-of-minds", "society-of-minds(temperature=0.2)"]
    cfg = RunConfig(dataset=str(SCIENCE), protocols=protocols, model="scripted", n=4)
    (await run_eval(cfg, tmp_path / "run", model=ScriptedModel(fn=answer))).close()
    report = summarise(RunStore.open(tmp_path / "run"))
    against = {(p.protocol, p.against) for p in report.debate_pairs}
    assert ("society-of-minds", "vote@3") in against  # its first round is vote@3's three samples
    assert ("society-of-minds(temperature=0.2)", "vote@3") not in against  # its first round is not
    assert ("society-of-minds(temperature=0.2)", "single") in against


def test_the_draw_of_round_one_is_read_from_first_seed_and_is_one_otherwise() -> None:
    from moot.eval.pool import draw_of

    assert draw_of("society-of-minds(first_seed=4)") == 4
    assert draw_of("vote@auto(by=tokens,ref=society-of-minds(first_seed=4),first_seed=4)") == 4
    # vote@auto matched to a debate on another draw still draws its own samples from seed 1
    assert draw_of("vote@auto(ref=society-of-minds(first_seed=4))") == 1
    assert draw_of("protocols/mine.yaml") == draw_of("vote@3") == draw_of("not a (protocol") == 1


def test_the_bootstraps_draws_are_randranges() -> None:
    """bootstrap draws its resamples without randrange's checks (moot.stats._randrange): the same
    indices, so the committed reports' intervals stay what they were (tests/test_committed_results.py)."""
    import random

    from moot.stats import _randrange

    for n in (1, 2, 3, 7, 64, 100, 1000, 2**20 + 3):
        rng, fast = random.Random(n), _randrange(random.Random(n), n)
        assert [fast() for _ in range(500)] == [rng.randrange(n) for _ in range(500)], n


def test_the_bootstrap_and_ece_give_the_numbers_of_their_plain_forms() -> None:
    """The resamples are drawn once per (seed, rows) and ECE's means are fsum / n without
    statistics.fmean's generator: the very floats of the plain forms, which the committed reports
    were written with (tests/test_committed_results.py)."""
    import random
    import statistics

    from moot.stats import BOOTSTRAP, bootstrap, ece

    def plain_ece(conf: list[float], right: list[bool], bins: int = 10) -> float:
        binned: list[list[int]] = [[] for _ in range(bins)]
        for i, c in enumerate(conf):
            binned[min(int(c * bins), bins - 1)].append(i)
        return sum(
            len(m) / len(conf) * abs(statistics.fmean(conf[i] for i in m) - statistics.fmean(right[i] for i in m))
            for m in binned
            if m
        )

    rng = random.Random(7)
    rows = [(rng.choice([0.3, 0.55, 0.7, 0.85, 0.9, 0.95, 1.0, rng.random()]), rng.random() < 0.6) for _ in range(57)]

    def stat(sample: Sequence[tuple[float, bool]]) -> float:
        return ece([c for c, _ in sample], [ok for _, ok in sample])

    for seed in (0, 3):
        draw = random.Random(seed)
        plain = sorted(
            plain_ece([c for c, _ in s], [ok for _, ok in s])
            for s in ([rows[draw.randrange(len(rows))] for _ in rows] for _ in range(BOOTSTRAP))
        )
        expected = (stat(rows), plain[int(0.025 * (len(plain) - 1))], plain[int(0.975 * (len(plain) - 1))])
        assert bootstrap(rows, stat, seed) == expected
        assert bootstrap(rows, stat, seed) == expected  # the second time from the drawn resamples


def test_a_float_sum_is_the_same_on_every_python() -> None:
    """moot.stats.total adds in turn, left to right, as Python 3.11's sum() did: 3.12's sum()
    compensates (Neumaier) and would give 1.0 here; the committed reports were made adding in turn."""
    assert total([1e16, 1.0, -1e16]) == 0.0
    assert total([0.1] * 10) == 0.1 + 0.1 + 0.1 + 0.1 + 0.1 + 0.1 + 0.1 + 0.1 + 0.1 + 0.1
    assert total([1, 2, True]) == 4 and isinstance(total([1, 2]), int)
    assert total([]) == 0
