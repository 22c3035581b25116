"""``moot eval plan``: a pre-registered analysis, blind until every arm holds its items, then the
primary's decision, the secondary family under Holm, and the arms described."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from moot.cli.main import app
from moot.core.decisions import tied_answers
from moot.eval.analysis import expected_correctness, summarise
from moot.eval.loaded import load_run
from moot.eval.plan import AnalysisPlan, PlanError, PlannedComparison, analyse_plan, render_plan, verdict
from moot.eval.runner import run_eval
from moot.eval.store import RunConfig
from moot.models.base import ChatRequest
from moot.models.scripted import ScriptedModel
from moot.stats import PairedTest, holm, paired_test
from test_eval import GOLD, SCIENCE, solver

ROOT = Path(__file__).parent.parent
SOM = "society-of-minds"
VOTE = "vote@auto(by=tokens,ref=society-of-minds)"
runner = CliRunner()


def plan_of(items: int, **extra: object) -> AnalysisPlan:
    return AnalysisPlan.model_validate(
        {
            "title": "Debate against its vote",
            "items": items,
            "primary": {"arm": SOM, "against": VOTE},
            "secondary": [{"arm": "vote@3", "against": "single"}, {"arm": SOM, "against": "single"}],
            **extra,
        }
    )


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import asyncio

    out = tmp_path_factory.mktemp("plan") / "run"
    cfg = RunConfig(dataset=str(SCIENCE), protocols=["single", "vote@3", SOM, VOTE], model="scripted", n=6, seed=1)
    store = asyncio.run(run_eval(cfg, out, model=ScriptedModel(fn=solver)))
    store.close()
    return out


def test_a_complete_run_gets_the_planned_endpoints_and_nothing_else(run_folder: Path) -> None:
    run = load_run(run_folder)
    result = analyse_plan(run, plan_of(6))
    assert result.complete and result.primary is not None
    items = {i.id: i for i in run.items()}
    expected = {
        a: expected_correctness(run, a, items, {r.item_id: r for r in run.results(a)}) for a in result.plan.arms()
    }
    assert result.primary.test == paired_test(expected[VOTE], expected[SOM])  # arm minus against, paired
    assert result.verdict == verdict(result.plan.primary, result.primary.test)
    tests = [paired_test(expected["single"], expected["vote@3"]), paired_test(expected["single"], expected[SOM])]
    assert [c.test for c in result.secondary] == tests
    assert [c.p_holm for c in result.secondary] == holm([t.p for t in tests])
    # The scripted agents are wrong on a third of first answers and right once they read the others.
    som = next(d for d in result.arms if d.summary.label == SOM)
    assert som.summary.expected_accuracy == 1.0 and som.expected_low < 1.0 == som.expected_high
    text = render_plan(result)
    assert "## Primary endpoint" in text and f"**Decision: {result.verdict}.**" in text
    assert "Secondary endpoints (Holm over 2)" in text and "| `single` |" in text
    assert "A deviation" not in text  # every pair is on the plan's 6 items


def test_it_is_blind_until_every_arm_holds_the_plans_items(run_folder: Path) -> None:
    run = load_run(run_folder)
    for plan in (plan_of(7), plan_of(6, describe=["vote@9"])):  # one item short; an arm not run yet
        result = analyse_plan(run, plan)
        assert not result.complete and result.primary is None and not result.secondary and not result.arms
        text = render_plan(result)
        assert "**Blind.**" in text and "%" not in text and "Decision" not in text
    assert "| `vote@9` | not in the run yet |" in render_plan(analyse_plan(run, plan_of(6, describe=["vote@9"])))
    assert "| `single` | 6 of 7 |" in render_plan(analyse_plan(run, plan_of(7)))


@pytest.mark.parametrize(
    ("low", "high", "said"),
    [
        (0.01, 0.2, "society-of-minds wins"),
        (-0.2, -0.01, f"{VOTE} wins"),
        (-0.05, 0.08, "no difference shown at n = 300: the interval rules out a gain of society-of-minds over "
                      f"{VOTE} above 8.0 points and a loss beyond 5.0"),
    ],
)  # fmt: skip
def test_the_primarys_rule_is_the_registered_one(low: float, high: float, said: str) -> None:
    t = PairedTest(n=300, diff=(low + high) / 2, ci_low=low, ci_high=high, p=0.5, only_first=0, only_second=0,
                   differing=0)  # fmt: skip
    assert verdict(PlannedComparison(arm=SOM, against=VOTE), t).startswith(said)


def test_a_bad_plan_is_one_line_and_exit_2(tmp_path: Path, run_folder: Path) -> None:
    bad = tmp_path / "plan.yaml"
    bad.write_text("title: x\nitems: 0\nprimary: {arm: a, against: b}\n", encoding="utf-8")
    with pytest.raises(PlanError, match=r"plan.yaml: items: Input should be greater than 0"):
        AnalysisPlan.load(bad)
    result = runner.invoke(app, ["eval", "plan", str(run_folder), "--plan", str(bad)])
    assert result.exit_code == 2 and "items: Input should be greater than 0" in result.output
    assert "Traceback" not in result.output
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(plan_of(6).model_dump()), encoding="utf-8")
    shown = runner.invoke(app, ["eval", "plan", str(run_folder), "--plan", str(good)])
    assert shown.exit_code == 0 and "**Decision:" in shown.output
    # an output path that is a folder, and a plan that is not UTF-8: one line each, before any work
    folder = runner.invoke(app, ["eval", "plan", str(run_folder), "--plan", str(good), "-o", str(tmp_path)])
    assert folder.exit_code == 2 and "is a folder; give a file path" in folder.output
    utf16 = tmp_path / "utf16.yaml"
    utf16.write_bytes("title: x".encode("utf-16"))
    coded = runner.invoke(app, ["eval", "plan", str(run_folder), "--plan", str(utf16)])
    assert coded.exit_code == 2 and "not UTF-8" in coded.output and "Traceback" not in coded.output


def test_the_committed_gsm8k_plan_names_the_runs_arms_exactly() -> None:
    """Every arm of the pre-registered plan is one the run script runs, as it labels it (a typo would
    leave the plan blind for ever)."""
    plan = AnalysisPlan.load(ROOT / "docs" / "results" / "preregistration" / "gsm8k-plan.yaml")
    script = (ROOT / "tools" / "gsm8k_prereg.sh").read_text(encoding="utf-8")
    names = ("O", "SOM", "TOGETHER", "FREE", "STAGE1", "STAGE2", "STAGE3")  # the arms' lines, and no command
    assignments = "\n".join(
        line for line in script.splitlines() if line.split("=", 1)[0] in names or line.startswith("for d ")
    )
    stage3 = subprocess.run(
        ["bash", "-c", assignments + '\necho "$STAGE3"'], capture_output=True, text=True, check=True
    )
    from moot.eval.protocols import split_protocols

    assert sorted(plan.arms()) == sorted(split_protocols(stage3.stdout.strip()))
    assert plan.items == 300 and len(plan.secondary) == 6


def test_a_pair_on_fewer_items_than_planned_is_reported_as_a_deviation(run_folder: Path) -> None:
    run = load_run(run_folder)
    run.rows[SOM], run.rows[VOTE] = run.rows[SOM][1:], run.rows[VOTE][:-1]  # 5 items each, 4 in common
    result = analyse_plan(run, plan_of(5))
    assert result.complete and result.primary is not None and result.primary.test.n == 4
    text = render_plan(result)
    assert f"- `{SOM}` against `{VOTE}` pairs 4 items, not 5." in text
    assert "- `single` holds 6 items, more than the plan's 5." in text  # an arm over the plan's items too


def spread_and_no_valid_judge(request: ChatRequest) -> dict[str, object]:
    """Sample s answers the item's s-th letter (three samples: a three-way tie, the right answer among
    them); a selection judge names no valid reply, so USC falls back to that tied vote."""
    if "response" in (request.response_schema or {}).get("properties", {}):
        return {"reasoning": "none fits", "response": 99}
    letters = GOLD[next(q for q in GOLD if q in request.messages[-1].content)].letters
    return {"reasoning": "because", "answer": letters[((request.seed or 1) - 1) % 3], "confidence": 0.5}


def test_a_selection_that_fell_back_to_a_tied_vote_is_credited_as_the_tie(tmp_path: Path) -> None:
    """The registration credits a tied vote by the share of its tied answers that are right; a
    selection judge that named no valid reply falls back to the vote, recorded under the selection's
    ``vote``: that tie is a tie too (it was credited whole to the tie-break's first answer)."""
    import asyncio

    cfg = RunConfig(dataset=str(SCIENCE), protocols=["vote@3", "usc(k=3)"], model="scripted", n=6, seed=1)
    store = asyncio.run(run_eval(cfg, tmp_path / "run", model=ScriptedModel(fn=spread_and_no_valid_judge)))
    store.close()
    run = load_run(tmp_path / "run")
    items = {i.id: i for i in run.items()}
    vote, usc = ({r.item_id: r for r in run.results(a)} for a in ("vote@3", "usc(k=3)"))
    assert all(tied_answers(run.transcripts("usc(k=3)")[i].decision) for i in usc)  # each a fallback to a tie
    assert expected_correctness(run, "usc(k=3)", items, usc) == expected_correctness(run, "vote@3", items, vote)
    assert set(expected_correctness(run, "usc(k=3)", items, usc).values()) <= {0.0, 1 / 3}
    summary = {s.label: s for s in summarise(run).protocols}
    assert summary["usc(k=3)"].ties == summary["vote@3"].ties == 6 and summary["usc(k=3)"].selection_fallbacks == 6


def test_a_run_declared_ended_is_analysed_on_what_it_holds_with_no_decision_on_a_short_primary(
    run_folder: Path,
) -> None:
    """The registration: if an arm cannot be finished, the report says so as a deviation, and the
    primary endpoint is not replaced. Blind without --ended; with it, each short arm is a deviation."""
    run = load_run(run_folder)
    run.rows[VOTE] = run.rows[VOTE][:-2]  # the primary's baseline ends at 4 of 6
    assert not analyse_plan(run, plan_of(6)).complete and analyse_plan(run, plan_of(6)).primary is None
    result = analyse_plan(run, plan_of(6), ended="the machine was withdrawn")
    assert result.primary is not None and result.primary.test is not None and result.primary.test.n == 4
    assert result.verdict == f"no decision: `{SOM}` holds 6 of 6 and `{VOTE}` holds 4 of 6 items (a deviation)"
    assert [c.p_holm is not None for c in result.secondary] == [True, True]  # the family is whole: Holm
    text = render_plan(result)
    assert "**Declared ended before every arm held its items**: the machine was withdrawn." in text
    assert f"- `{VOTE}` holds 4 of its 6 items: the run was declared ended (the machine was withdrawn)." in text
    assert "wins" not in text and "Blind" not in text
    # an arm that never ran: its comparisons are not computed, and Holm is not computed over a part
    gone = analyse_plan(run, plan_of(6, describe=["vote@9"]).model_copy(
        update={"secondary": [PlannedComparison(arm="vote@9", against="single"),
                              PlannedComparison(arm="vote@3", against="single")]}), ended="stopped")  # fmt: skip
    assert gone.secondary[0].test is None and all(c.p_holm is None for c in gone.secondary)
    assert "Holm over 2: not computed, the family is not whole" in render_plan(gone)
    # the command: --ended with a reason; an empty one is refused in one line
    good = run_folder.parent / "plan6.yaml"
    good.write_text(yaml.safe_dump(plan_of(6).model_dump()), encoding="utf-8")
    empty = runner.invoke(app, ["eval", "plan", str(run_folder), "--plan", str(good), "--ended", " "])
    assert empty.exit_code == 2 and "--ended needs the reason" in empty.output


def test_the_report_states_the_registered_settings_failures_and_each_votes_k(run_folder: Path) -> None:
    run = load_run(run_folder)
    registered = {"dataset": str(SCIENCE), "model": "scripted", "n": 6, "seed": 1, "max_tokens": 512}
    result = analyse_plan(run, plan_of(6, run=registered))
    assert result.deviations == ["the run's max_tokens is None, registered as 512"]
    text = render_plan(result)
    assert "- the run's max_tokens is None, registered as 512." in text
    assert "None found" in render_plan(analyse_plan(run, plan_of(6, run={**registered, "max_tokens": None})))
    # failed items are counted wrong and shown; the vote at tokens shows k and what it came from
    assert "| failed (counted wrong) |" in text and "| `single` |" in text
    vote = next(d for d in result.arms if d.summary.label == VOTE)
    assert vote.budget is not None and vote.budget.k == vote.summary.k and vote.budget.sample == "single"
    som = [r for r in run.results(SOM) if r.status == "ok"]
    assert vote.budget.reference_mean == sum(r.tokens for r in som) / len(som)
    assert f"- `{VOTE}`: k = {vote.budget.k}: `{SOM}` spent {vote.budget.reference_mean:.1f} tokens per item" in text
    # a run whose arms are registered with another config is caught even when blind
    blind = render_plan(analyse_plan(run, plan_of(7, run={"seed": 0})))
    assert "Blind" in blind and "the run's seed is 1, registered as 0" in blind
    # an item that failed is counted wrong, and the arm's row says how many failed
    run.rows["single"][0] = run.rows["single"][0].model_copy(update={"status": "failed", "correct": False})
    rows = render_plan(analyse_plan(run, plan_of(6))).splitlines()
    single = next(line for line in rows if line.startswith("| `single` |") and "%" in line)
    assert single.split("|")[6].strip() == "1"


def test_the_committed_gsm8k_plans_run_settings_are_the_scripts() -> None:
    """The registered settings the plan checks a run against are those the run script passes."""
    import shlex

    plan = AnalysisPlan.load(ROOT / "docs" / "results" / "preregistration" / "gsm8k-plan.yaml")
    script = (ROOT / "tools" / "gsm8k_prereg.sh").read_text(encoding="utf-8")
    at = script.index('"$MOOT" eval -d')
    command = script[at : script.index("\n", script.index("\\\n", at) + 2)].replace("\\\n", " ")
    words = shlex.split(command)
    flags = {"-d": "dataset", "-m": "model", "-n": "n", "--seed": "seed", "--skip": "skip",
             "--seed-stride": "seed_stride", "--max-tokens": "max_tokens"}  # fmt: skip
    given = {flags[w]: words[i + 1] for i, w in enumerate(words) if w in flags}
    assert {k: str(v) for k, v in plan.run.model_dump(exclude_none=True).items()} == given


def test_a_run_with_none_of_the_plans_arms_is_refused(run_folder: Path, tmp_path: Path) -> None:
    """A plan given another run said every arm was "not in the run yet" and stayed blind for ever."""
    other = AnalysisPlan.model_validate({"title": "x", "items": 6, "primary": {"arm": "a(1)", "against": "b(2)"}})
    with pytest.raises(PlanError, match=r"runs none of the plan's arms \(it runs single, vote@3, society-of-minds"):
        analyse_plan(load_run(run_folder), other)
    path = tmp_path / "other.yaml"
    path.write_text(yaml.safe_dump(other.model_dump()), encoding="utf-8")
    result = runner.invoke(app, ["eval", "plan", str(run_folder), "--plan", str(path)])
    assert result.exit_code == 2 and "give the plan's run folder" in result.output


def test_a_plan_reads_its_runs_labels_without_loading_their_protocol_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of a protocol file (labelled by its path as given) analysed from another folder: the
    plan re-read every arm as a protocol, loaded the file relative to here, and crashed."""
    import asyncio

    from moot.protocols import get_preset

    made = tmp_path / "made"
    made.mkdir()
    (made / "proto.yaml").write_text(yaml.safe_dump(get_preset("society-of-minds").model_dump(mode="json")))
    monkeypatch.chdir(made)
    cfg = RunConfig(
        dataset=str(SCIENCE), protocols=["single", "proto.yaml", "vote@auto"], model="scripted", n=6, seed=1
    )
    asyncio.run(run_eval(cfg, made / "run", model=ScriptedModel(fn=solver))).close()
    monkeypatch.chdir(tmp_path)
    plan = AnalysisPlan.model_validate(
        {"title": "t", "items": 6, "primary": {"arm": "proto.yaml", "against": "vote@auto"}}
    )
    result = analyse_plan(load_run(made / "run"), plan)
    vote = next(d for d in result.arms if d.summary.label == "vote@auto")
    assert result.primary is not None and vote.budget is not None and vote.budget.reference == "proto.yaml"


def test_an_arm_that_never_ran_is_not_described_when_the_run_is_declared_ended(run_folder: Path) -> None:
    run = load_run(run_folder)
    run.rows[VOTE] = []
    result = analyse_plan(run, plan_of(6), ended="stopped")
    assert VOTE not in {d.summary.label for d in result.arms}  # (it was shown at 0.0% [0.0%, 0.0%])
    assert f"| `{VOTE}` | 0 of 6 |" in render_plan(result) and "k = " not in render_plan(result)


@pytest.mark.parametrize(
    ("where", "same", "comparisons"),
    [
        ("primary", SOM, {"primary": {"arm": SOM, "against": SOM}}),
        ("secondary.1", VOTE, {"primary": {"arm": SOM, "against": VOTE},
                               "secondary": [{"arm": "vote@3", "against": "single"}, {"arm": VOTE, "against": VOTE}]}),
    ],
)  # fmt: skip
def test_an_arm_compared_with_itself_is_refused(
    tmp_path: Path, run_folder: Path, where: str, same: str, comparisons: dict[str, object]
) -> None:
    """It was analysed, and reported "+0.0 points": a difference of 0 by construction, not a finding."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"title": "x", "items": 6, **comparisons}), encoding="utf-8")
    said = f"plan.yaml: {where}: arm and against are both {same!r}: a comparison is between two different arms"
    with pytest.raises(PlanError, match=re.escape(said)):
        AnalysisPlan.load(plan)
    result = runner.invoke(app, ["eval", "plan", str(run_folder), "--plan", str(plan)], env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert said in result.output and "Traceback" not in result.output and "points" not in result.output
