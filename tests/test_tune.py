"""``moot tune``: split before anything runs, choose on the tuning part, confirm on the held-out
part, write a protocol file that runs; bad input refused before any call."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from moot.cli.main import app
from moot.core import Engine
from moot.eval.store import RunStore
from moot.eval.tune import (
    CandidateScore,
    Choice,
    NeedVote,
    Scores,
    TuneConfig,
    TuneError,
    TuneReport,
    TuneRunError,
    analyse_tune,
    check,
    choose,
    free_budget_note,
    held_before,
    parse_budget,
    run_tune,
)
from moot.models.base import ChatRequest
from moot.models.scripted import ScriptedModel
from moot.protocols.loader import ProtocolFileError, load_protocol
from moot.server.tuned import load_tuned

COLOURS = Path(__file__).parent / "fixtures" / "eval" / "colours.jsonl"  # 20 four-option items
runner = CliRunner()


def gold(request: ChatRequest) -> str:
    asked = next(m.content for m in request.messages if m.role == "user")
    number = int(re.search(r"number (\d)", asked).group(1))  # type: ignore[union-attr]
    return "ABCD"[number - 1]


def noisy(request: ChatRequest) -> dict[str, object]:
    """Sample s is right unless s is a multiple of 3: single (seed 1) is right, votes mostly are."""
    right = (request.seed or 1) % 3 != 0
    answer = gold(request) if right else ("A" if gold(request) != "A" else "B")
    return {"reasoning": "r", "answer": answer, "confidence": 0.5}


async def test_tune_splits_chooses_on_tuning_items_confirms_on_held_out_ones_and_writes_a_runnable_file(
    tmp_path: Path,
) -> None:
    model = ScriptedModel(fn=noisy)
    config = TuneConfig(data=str(COLOURS), model="scripted", candidates=["single", "vote@3", "vote@5",
                        "adaptive-consistency(threshold=0.9)"], budget=parse_budget("calls=5"))  # fmt: skip
    report = await run_tune(config, tmp_path / "tune", model=model)
    split = json.loads((tmp_path / "tune" / "split.json").read_text())
    assert len(split["tuning"]) == 10 and len(split["held_out"]) == 10
    assert not set(split["tuning"]) & set(split["held_out"])
    # Every candidate is right on every tuning item (or ties in expectation): nothing beats the
    # vote at its budget, so the tune says the data cannot support a winner and takes the cheapest.
    assert report.chosen == "single" and not report.supported and "cannot tell" in report.reason
    # The held-out run holds only the choice and the vote at its budget, on the held-out items only.
    held = {json.loads(line)["id"] for line in (tmp_path / "tune" / "holdout.jsonl").read_text().splitlines()}
    assert held == set(split["held_out"])
    assert report.held_out is not None and report.held_out.items == 10
    tuned = yaml.safe_load((tmp_path / "tune" / "tuned.yaml").read_text())
    assert tuned["preset"] == "single" and tuned["tuned"]["held_out"]["items"] == 10
    assert tuned["tuned"]["data_fingerprint"] == split["data_fingerprint"]
    spec = load_protocol(tmp_path / "tune" / "tuned.yaml")
    result = await Engine(spec, ScriptedModel(fn=noisy)).run("Puzzle 9: which colour is number 2 in the list?")
    assert result.status == "complete"
    # The same command resumes: no new call.
    again = ScriptedModel(fn=noisy)
    await run_tune(config, tmp_path / "tune", model=again)
    assert again.requests == []
    # The report is its two runs analysed, with no model: what a committed tune is re-derived from.
    tuning, holdout = (RunStore.open_read_only(tmp_path / "tune" / part) for part in ("tuning", "holdout"))
    derived, score = analyse_tune(config, report.split, tuning, holdout, generated_at=report.generated_at)
    tuning.close()
    holdout.close()
    assert derived == report and score.label == "single" and score.items == 10


async def test_a_candidates_interval_is_that_of_the_accuracy_it_is_printed_with(tmp_path: Path) -> None:
    """A vote of two samples, one right and one wrong, ties on every item: its tie rule takes the
    first (right) answer, but its accuracy, the expected one over tie-breaks, is 50%. The interval
    printed beside it is 50%'s, not the tie rule's 100%'s."""
    from moot.stats import wilson

    def split_pair(request: ChatRequest) -> dict[str, object]:
        right = (request.seed or 1) % 2 == 1
        return {"reasoning": "r", "answer": gold(request) if right else ("A" if gold(request) != "A" else "B"),
                "confidence": 0.5}  # fmt: skip

    config = TuneConfig(data=str(COLOURS), model="scripted", candidates=["single", "vote@2"])
    report = await run_tune(config, tmp_path / "tune", model=ScriptedModel(fn=split_pair))
    vote = next(c for c in report.candidates if c.label == "vote@2")
    assert vote.accuracy == 0.5 and (vote.ci_low, vote.ci_high) == wilson(5, 10)
    assert vote.ci_low < 0.5 < vote.ci_high
    assert all(c.ci_low <= c.accuracy <= c.ci_high for c in report.candidates)


async def test_a_supported_winner_is_chosen_and_its_tuning_estimate_is_compared_with_the_held_out_one(
    tmp_path: Path,
) -> None:
    def weak_single(request: ChatRequest) -> dict[str, object]:
        # Seeds 1 and 4 are always wrong: single and vote@1 lose, vote@5 (seeds 1-5) wins 3 to 2.
        wrong = (request.seed or 1) in (1, 4)
        answer = ("A" if gold(request) != "A" else "B") if wrong else gold(request)
        return {"reasoning": "r", "answer": answer, "confidence": 0.5}

    config = TuneConfig(data=str(COLOURS), model="scripted", candidates=["single", "vote@5"])
    report = await run_tune(config, tmp_path / "tune", model=ScriptedModel(fn=weak_single))
    assert report.chosen == "vote@5" and report.supported
    assert report.tuning_comparison is not None and report.tuning_comparison.against == "single"
    assert report.held_out is not None and report.held_out.diff == pytest.approx(1.0)
    assert report.optimism == pytest.approx(0.0)
    md = (tmp_path / "tune" / "tune.md").read_text()
    assert "chosen: `vote@5`" in md and "matched the held-out accuracy" in md


async def test_a_vote_the_tune_adds_as_a_baseline_is_never_the_choice(tmp_path: Path) -> None:
    """The vote at single's budget (vote@1, one sample at temperature) is right where both candidates
    are wrong: it is the baseline single is held to, not a protocol the user offered."""

    def first_sample_only(request: ChatRequest) -> dict[str, object]:
        right = request.temperature is not None and request.seed == 1
        answer = gold(request) if right else ("A" if gold(request) != "A" else "B")
        return {"reasoning": "r", "answer": answer, "confidence": 0.5}

    config = TuneConfig(data=str(COLOURS), model="scripted", candidates=["single", "vote@3"])
    first = await run_tune(config, tmp_path / "tune", model=ScriptedModel(fn=first_sample_only))
    assert first.chosen == "single" and not first.supported
    assert first.tuning_comparison is not None and first.tuning_comparison.against == "vote@1"
    assert "single, is -100.0 points [" in first.reason and "against vote@1 (the vote at its budget)" in first.reason
    assert [c.label for c in first.candidates] == ["single", "vote@3"]
    # Run again when finished: nothing runs, and the evidence keeps the date it was made.
    (tmp_path / "tune" / "tune.json").write_text(
        (tmp_path / "tune" / "tune.json").read_text().replace(first.generated_at, "2026-01-02T03:04:05+00:00")
    )
    again = ScriptedModel(fn=first_sample_only)
    assert (await run_tune(config, tmp_path / "tune", model=again)).generated_at == "2026-01-02T03:04:05+00:00"
    assert again.requests == []
    assert "date: '2026-01-02T03:04:05+00:00'" in (tmp_path / "tune" / "tuned.yaml").read_text()


class _NoLogprobs(ScriptedModel):
    """An OpenAI-compatible endpoint as moot first meets it: whether it returns log-probabilities is
    not known, and it returns none."""

    returns_logprobs = None


async def test_a_candidate_that_failed_on_every_item_is_shown_failed_with_its_reason_and_never_ranked(
    tmp_path: Path,
) -> None:
    weighted = "weighted-vote(signal=answer_prob,softmax_t=0.2)"
    filtered = "filtered-vote(keep=0.5)"  # (it kept the first half given, and was ranked: session 26's trial)
    config = TuneConfig(data=str(COLOURS), model="scripted", candidates=["single", "vote@3", weighted, filtered])
    report = await run_tune(config, tmp_path / "tune", model=_NoLogprobs(fn=noisy))
    for label in (weighted, filtered):
        failed = next(c for c in report.candidates if c.label == label)
        assert failed.all_failed and failed.failed == failed.items == 10 and not failed.fits
        assert failed.failure is not None and "log-probabilities" in failed.failure
        assert report.chosen != label
    failed = next(c for c in report.candidates if c.label == weighted)
    md = (tmp_path / "tune" / "tune.md").read_text()
    table = md.split("## The candidates on the tuning items")[1].split("**Failed on every tuning item**")[0]
    assert weighted not in table and filtered not in table and "| single |" in table
    assert f"- `{weighted}` failed: {failed.failure}" in md
    # tune.json keeps the failure and reads back.
    assert TuneReport.model_validate_json((tmp_path / "tune" / "tune.json").read_text()) == report


async def test_the_only_candidate_left_is_said_to_be_so_and_a_tune_with_no_budget_has_no_budget_column(
    tmp_path: Path,
) -> None:
    """Every other candidate failed: the choice says it is the only one left, not that the items cannot
    tell the candidates apart; with no budget, neither the reason nor the table speaks of one."""
    weighted = "weighted-vote(signal=answer_prob,softmax_t=0.2)"
    config = TuneConfig(data=str(COLOURS), model="scripted", candidates=["single", weighted])
    report = await run_tune(config, tmp_path / "tune", model=_NoLogprobs(fn=noisy))
    assert report.chosen == "single" and not report.supported
    assert report.reason.startswith("the only candidate left (the others failed on every tuning item); ")
    assert "cannot tell the candidates apart" not in report.reason
    md = (tmp_path / "tune" / "tune.md").read_text()
    assert "within the budget" not in report.reason and "fits the budget" not in md and "| single |" in md


def test_a_failed_candidate_is_never_chosen_even_as_the_cheapest_of_equals() -> None:
    """Nothing is right: every candidate ties at 0%, and the one that failed before spending a token
    would be the cheapest of them."""
    scores = {
        "single": _score("single", [], 1, 200),
        "vote@3": _score("vote@3", [], 3, 600),
        "weighted-vote(signal=answer_prob)": _score("weighted-vote(signal=answer_prob)", [], 0, 0),
    }
    scores["weighted-vote(signal=answer_prob)"][0].failed = 40
    config = TuneConfig(data="x.jsonl", model="scripted", candidates=list(scores))
    chosen, _, _, _ = _settle(scores, config, lambda label: _score(label, [], 1, 200))
    assert chosen == "single"
    for c, _ in scores.values():
        c.failed = 40
    with pytest.raises(TuneRunError, match="every candidate failed on every tuning item"):
        _settle(scores, config)


@pytest.mark.parametrize(
    ("optimism", "said"),
    [
        (0.042, "overstated the held-out accuracy by 4.2 points"),
        (-0.1, "understated the held-out accuracy by 10.0 points"),
        (0.0, "matched the held-out accuracy"),
        (-0.0001, "matched the held-out accuracy"),
    ],
)
def test_the_tuning_estimates_optimism_is_worded_by_its_sign(optimism: float, said: str) -> None:
    from moot.eval.tune import render_markdown

    committed = Path(__file__).parent.parent / "docs" / "results" / "tune" / "arc-challenge" / "tune.json"
    report = TuneReport.model_validate_json(committed.read_text(encoding="utf-8"))
    line = next(x for x in render_markdown(report.model_copy(update={"optimism": optimism})).splitlines()
                if "the tuning items' estimate" in x)  # fmt: skip
    assert said in line and not re.search(r"[-+]\d", line)


def test_a_tuned_file_with_bad_evidence_is_refused_by_name(tmp_path: Path) -> None:
    bad = tmp_path / "tuned.yaml"
    bad.write_text("preset: single\ntuned: {chosen: single, modle: x}\n")
    with pytest.raises(ProtocolFileError, match="tuned"):
        load_protocol(bad)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--candidates", "single,nonesuch"], "unknown protocol 'nonesuch'"),
        (["--budget", "calls=0.5"], "no candidate fits"),
        (["--budget", "latency=2"], "latency"),
        (["--budget", "tokens"], "tokens=N"),
        (["--objective", "fastest"], "--objective"),
        (["--candidates", "single,vote@auto"], "vote@auto is matched by the tune itself"),
        (["--budget", "usd=0.01"], "there is no price for scripted:none.yaml, so every candidate would cost $0"),
        (["--candidates", "single"], "name at least two"),
        (["--candidates", "single,vote@3", "--budget", "calls=0.5"], "makes 1 call an item"),
        (["--candidates", "single,vote@uab(budget=2)"], "vote@uab"),
        (["--budget", "tokens=20"], "no candidate fits: every one sends an item's question at least once"),
        (["--candidates", "single,society-of-minds", "--objective", "cheapest"], "add a vote@K candidate"),
        (["-p", "single,society-of-minds", "--objective", "cheapest"], "add a vote@K candidate"),  # eval's name
        # --holdout's share is held to --tuning-n/--holdout-n's minimum too (it tuned on 1 item, or confirmed on 1)
        (
            ["--holdout", "0.95"],
            "--holdout 0.95 splits the 20 items of " + str(COLOURS) + " into 1 to tune on and "
            "19 to confirm on; each part needs at least 10 items: give --holdout between 0.48 and "
            "0.52, or more items",
        ),
        (["--holdout", "0.05"], "into 19 to tune on and 1 to confirm on; each part needs at least 10 items"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_before_any_call(tmp_path: Path, args: list[str], message: str) -> None:
    result = runner.invoke(app, ["tune", "--data", str(COLOURS), "-m", "scripted:none.yaml", "-o",
                                 str(tmp_path / "t"), *args])  # fmt: skip
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "t" / "tuning").exists()


def test_a_holdout_share_leaves_each_part_the_fewest_items_counts_do(tmp_path: Path) -> None:
    """The refusal names the sizes the share gave and the shares that would do; those run."""
    more = tmp_path / "more.jsonl"
    lines = COLOURS.read_text().splitlines()
    more.write_text("".join(json.dumps({**json.loads(x), "id": f"{k}-{i}"}) + "\n" for k in "ab" for i, x in
                            enumerate(lines[:12])))  # fmt: skip
    config = TuneConfig(data=str(more), model="m", candidates=["single", "vote@3"])
    with pytest.raises(
        TuneError,
        match=r"--holdout 0.3 splits the 24 items .* into 17 to tune on and 7 to confirm on; "
        r"each part needs at least 10 items: give --holdout between 0.4 and 0.6, or more items",
    ):
        check(config.model_copy(update={"holdout": 0.3}))
    for share in (0.4, 0.5, 0.6):
        assert len(check(config.model_copy(update={"holdout": share}))) == 24
    for share in (0.39, 0.61):
        with pytest.raises(TuneError, match="each part needs at least 10 items"):
            check(config.model_copy(update={"holdout": share}))


async def test_a_candidate_whose_budget_cannot_fit_is_refused_as_moot_eval_refuses_it(tmp_path: Path) -> None:
    """It ran, failed on every tuning item and was listed failed; ``moot eval`` refuses it now before
    any call (as ``moot debate`` does): the tune says the same, before its split is made."""
    protocol = tmp_path / "som.yaml"
    protocol.write_text("preset: society-of-minds\nbudget:\n  max_calls: 2\n", encoding="utf-8")
    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps([{"reasoning": "r", "answer": "A", "confidence": 0.9}] * 200))
    said = (f"error: protocol {protocol}: the call budget of 2 calls cannot fit one round (3 calls) plus the decision "
            "(0): give at least 3")  # fmt: skip
    result = runner.invoke(app, ["tune", "--data", str(COLOURS), "-m", f"scripted:{replies}", "-o", str(tmp_path / "t"),
                                 "--candidates", f"single,{protocol}"], env={"COLUMNS": "300"})  # fmt: skip
    assert result.exit_code == 2, result.output
    assert said in result.output and "Traceback" not in result.output and not (tmp_path / "t").exists()
    evaluated = runner.invoke(app, ["eval", "--data", str(COLOURS), "-m", f"scripted:{replies}", "-o",
                                    str(tmp_path / "e"), "-p", f"single,{protocol}"],
                              env={"COLUMNS": "300"})  # fmt: skip
    assert evaluated.exit_code == 2 and said in evaluated.output, evaluated.output
    model = ScriptedModel(fn=noisy)
    config = TuneConfig(data=str(COLOURS), model="scripted", candidates=["single", str(protocol)])
    with pytest.raises(TuneError, match=re.escape(said.removeprefix("error: "))):
        await run_tune(config, tmp_path / "api", model=model)
    assert not model.requests


def test_a_usd_budget_needs_the_models_price() -> None:
    from moot.models.pricing import price_table

    config = TuneConfig(
        data=str(COLOURS), model="openai:m", candidates=["single", "vote@3"], budget=parse_budget("usd=0.01")
    )
    with pytest.raises(TuneError, match="no price for openai:m"):
        check(config)
    assert len(check(config, price_table(None, ["openai:m=0.15,0.6"]))) == 20
    assert len(check(config.model_copy(update={"model": "embedded:smollm2-135m"}))) == 20  # embedded: free


def test_a_usd_budget_on_a_model_that_costs_nothing_is_accepted_with_a_warning() -> None:
    """docs/tune.md: `--budget usd=1` on an embedded model is accepted and limits nothing (it costs
    $0 unless priced); the tune says so in one line rather than leaving it to be found out."""
    from moot.models.pricing import price_table

    config = TuneConfig(data=str(COLOURS), model="embedded:smollm2-135m", candidates=["single", "vote@3"],
                        budget=parse_budget("usd=1"))  # fmt: skip
    assert len(check(config)) == 20  # accepted
    assert free_budget_note(config) == (
        "--budget usd=1: embedded:smollm2-135m costs $0 (an embedded model is free unless --prices or --price "
        "prices it), so every candidate fits the budget and none is cheaper than another: give tokens= or calls= "
        "to limit them"
    )
    zero = price_table(None, ["smollm2-135m=0,0"])
    assert "costs $0 (its price is 0)" in (free_budget_note(config, zero) or "")
    assert free_budget_note(config, price_table(None, ["embedded:smollm2-135m=0.01,0.02"])) is None  # priced
    assert free_budget_note(config.model_copy(update={"budget": parse_budget("tokens=500")})) is None


def test_moot_tune_warns_of_a_usd_budget_that_limits_nothing_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from moot.testing.fake_openai import FakeOpenAIServer

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    reply = json.dumps({"reasoning": "r", "answer": "A", "confidence": 0.9})
    with FakeOpenAIServer(reply=lambda request: reply) as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        result = runner.invoke(app, ["tune", "--data", str(COLOURS), "-m", "openai:fake", "-o", str(tmp_path / "t"),
                                     "--candidates", "single,vote@3", "--budget", "usd=1", "--price",
                                     "openai:fake=0,0"])  # fmt: skip
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: --budget usd=1: openai:fake costs $0 (its price is 0), so every candidate fits the budget and none "
        "is cheaper than another: give tokens= or calls= to limit them"
    ], result.output


def test_a_tokens_or_usd_budget_below_one_call_on_the_shortest_item_is_refused_before_any_call() -> None:
    """The floor is one call's prompt (the cheapest candidate's first message, with the shortest
    item's question) and a one-token reply, by moot's conservative count: a budget under it cannot
    fit, whatever the tokenizer; one above it is left to the tuning run to judge."""
    from moot.eval.items import to_task
    from moot.eval.protocols import parse_protocols
    from moot.eval.tune import token_floor
    from moot.models.base import approx_tokens
    from moot.models.pricing import price_table
    from moot.protocols import get_preset

    config = TuneConfig(data=str(COLOURS), model="openai:m", candidates=["single", "vote@3"])
    items = check(config)
    floor, cheapest = token_floor(parse_protocols(["single", "vote@3"]), items)
    opening = get_preset("single").prompts.opening
    shortest = min(approx_tokens(to_task(i).question) for i in items)
    template = approx_tokens(opening.replace("{question}", " ").replace("{context}", " "))
    assert (floor, cheapest) == (template + shortest + 1, "single")
    with pytest.raises(TuneError, match=f"at least {floor} tokens on the shortest item"):
        check(config.model_copy(update={"budget": parse_budget(f"tokens={floor - 1}")}))
    assert len(check(config.model_copy(update={"budget": parse_budget(f"tokens={floor}")}))) == 20
    prices = price_table(None, ["openai:m=1000000,1000000"])  # $1 a token
    with pytest.raises(TuneError, match=r"costs at least \$" + str(floor)):
        check(config.model_copy(update={"budget": parse_budget(f"usd={floor - 1}")}), prices)
    assert len(check(config.model_copy(update={"budget": parse_budget(f"usd={floor}")}), prices)) == 20


def test_too_few_or_unlabelled_items_are_refused(tmp_path: Path) -> None:
    few = tmp_path / "few.jsonl"
    few.write_text("".join(line for line in COLOURS.read_text().splitlines(keepends=True)[:8]))
    with pytest.raises(TuneError, match="at least 20"):
        check(TuneConfig(data=str(few), model="m", candidates=["single"]))
    free = tmp_path / "free.jsonl"
    free.write_text("".join(json.dumps({"question": f"q{i}", "answer": f"painter {i}"}) + "\n" for i in range(30)))
    with pytest.raises(TuneError, match="free-text"):
        check(TuneConfig(data=str(free), model="m", candidates=["single"]))


async def test_tuning_on_a_committed_runs_items_reuses_its_samples_and_confirms_on_the_next_items(
    tmp_path: Path,
) -> None:
    from moot.eval.runner import run_eval
    from moot.eval.store import RunConfig, RunStore

    earlier = RunConfig(dataset=str(COLOURS), n=10, seed=0, protocols=["vote@5"], model="scripted")
    (await run_eval(earlier, tmp_path / "earlier", model=ScriptedModel(fn=noisy))).close()
    config = TuneConfig(data=str(COLOURS), model="scripted", candidates=["vote@3", "vote@5"], tuning_n=10,
                        holdout_n=10, cache_from=[str(tmp_path / "earlier")])  # fmt: skip
    report = await run_tune(config, tmp_path / "tune", model=ScriptedModel(fn=noisy))
    tuning = RunStore.open(tmp_path / "tune" / "tuning")
    earlier_ids = {i.id for i in RunStore.open(tmp_path / "earlier").items()}
    assert {i.id for i in tuning.items()} == earlier_ids == set(report.split.tuning)
    assert all(r.cached_calls == r.calls for r in tuning.results())  # every sample came from the earlier run
    assert not set(report.split.held_out) & earlier_ids and len(report.split.held_out) == 10
    with pytest.raises(TuneError, match="go together"):
        check(TuneConfig(data=str(COLOURS), model="m", candidates=["single"], tuning_n=10))
    with pytest.raises(TuneError, match="ask for 30 items"):
        check(TuneConfig(data=str(COLOURS), model="m", candidates=["single"], tuning_n=15, holdout_n=15))


async def test_a_tune_with_no_baseline_writes_evidence_that_reads_back(tmp_path: Path) -> None:
    """A plain vote chosen without single among the candidates has no vote to be held to: its
    evidence says so (no NaN written as null), and tune.json, tuned.yaml and moot serve read it."""
    from moot.eval.tune import TuneReport
    from moot.server.tuned import load_tuned

    config = TuneConfig(data=str(COLOURS), model="scripted", candidates=["vote@3", "vote@5"])
    report = await run_tune(config, tmp_path / "tune", model=ScriptedModel(fn=noisy))
    assert report.held_out is not None and report.held_out.baseline is None and report.held_out.diff is None
    assert TuneReport.model_validate_json((tmp_path / "tune" / "tune.json").read_text()) == report
    assert "no vote at its budget to compare with" in (tmp_path / "tune" / "tune.md").read_text()
    served = load_tuned(tmp_path / "tune" / "tuned.yaml")
    assert served.summary().endswith("on 10 items")
    again = await run_tune(config, tmp_path / "tune", model=ScriptedModel(fn=noisy))
    assert again.generated_at == report.generated_at  # read back, so the date is kept


async def test_a_changed_choice_on_the_same_held_out_items_is_not_called_a_fresh_confirmation(tmp_path: Path) -> None:
    def weak_three(request: ChatRequest) -> dict[str, object]:
        # Seeds 1 and 3 are wrong: single and vote@3 lose, vote@5 wins 3 to 2.
        wrong = (request.seed or 1) in (1, 3)
        answer = ("A" if gold(request) != "A" else "B") if wrong else gold(request)
        return {"reasoning": "r", "answer": answer, "confidence": 0.5}

    config = TuneConfig(data=str(COLOURS), model="scripted", candidates=["single", "vote@3"])
    first = await run_tune(config, tmp_path / "tune", model=ScriptedModel(fn=weak_three))
    assert first.chosen == "single" and first.held_out is not None and first.held_out.seen_before == []
    assert "fresh confirmation" not in (tmp_path / "tune" / "tune.md").read_text()
    # Tuned again with another candidate, in the same folder: the choice changes, its confirmation
    # runs on the items that already confirmed `single`, and the report says they were seen.
    more = config.model_copy(update={"candidates": ["single", "vote@3", "vote@5"]})
    second = await run_tune(more, tmp_path / "tune", model=ScriptedModel(fn=weak_three))
    assert second.chosen == "vote@5" and second.held_out is not None
    assert second.held_out.baseline == "single" and second.held_out.seen_before == ["single", "vote@1"]
    assert "**not a fresh confirmation:**" in (tmp_path / "tune" / "tune.md").read_text()
    assert yaml.safe_load((tmp_path / "tune" / "tuned.yaml").read_text())["tuned"]["held_out"]["seen_before"] == [
        "single",
        "vote@1",
    ]
    assert "not a fresh confirmation" in load_tuned(tmp_path / "tune" / "tuned.yaml").summary()
    holdout = RunStore.open_read_only(tmp_path / "tune" / "holdout")
    try:  # nothing the first confirmation ran is lost
        assert holdout.config.protocols == ["single", "vote@1", "vote@5"]
    finally:
        holdout.close()


async def test_a_tune_folder_resumes_where_it_is_copied(tmp_path: Path) -> None:
    config = TuneConfig(data=str(COLOURS), model="scripted", candidates=["single", "vote@3"])
    await run_tune(config, tmp_path / "tune", model=ScriptedModel(fn=noisy))
    shutil.copytree(tmp_path / "tune", tmp_path / "copy")
    again = ScriptedModel(fn=noisy)
    # Its parts name their own files (tune/tuning.jsonl): the copy reads copy/tuning.jsonl, the same items.
    assert (await run_tune(config, tmp_path / "copy", model=again)).chosen == "single"
    assert again.requests == []


@pytest.mark.parametrize(
    ("stored", "labels", "before"),
    [
        (["vote@5", "single"], ["vote@5", "single"], []),  # made for this choice alone: fresh
        (["vote@5"], ["vote@5"], []),
        # An earlier choice ran alone; this one is held to it: the earlier result was seen.
        (["vote@3", "vote@3(temperature=1.0)"], ["vote@3(temperature=1.0)", "vote@3"], ["vote@3"]),
        (["single", "vote@1", "vote@5"], ["vote@5", "single"], ["single", "vote@1"]),
        # Back to the first choice after another: all of it had been run.
        (["A", "B", "C"], ["A", "B"], ["A", "B", "C"]),
    ],
)
def test_what_the_held_out_run_held_before_a_choice_is_read_from_its_protocols(
    stored: list[str], labels: list[str], before: list[str]
) -> None:
    assert held_before(stored, labels) == before


# ------------------------------------------------------------------- the selection rule, on its own


def _score(
    label: str, right: list[int], calls: float, tokens: float, n: int = 40
) -> tuple[CandidateScore, dict[str, float]]:
    """A candidate's tuning scores from which of ``n`` items it got right."""
    items = {f"i{i}": float(i in right) for i in range(n)}
    acc = sum(items.values()) / n
    return CandidateScore(label=label, items=n, accuracy=acc, ci_low=acc, ci_high=acc, mean_tokens=tokens,
                          mean_calls=calls), items  # fmt: skip


def test_the_cheapest_objective_takes_the_cheapest_candidate_no_worse_than_the_dearest_vote() -> None:
    # 400 items: at 40 even two identical candidates' paired interval (about +-4.7 points) would not
    # show one no worse than the other by the 2-point margin, and the reference itself is returned.
    everything, half = list(range(400)), list(range(200))
    scores = {
        "single": _score("single", half, 1, 200, 400),  # far worse: not within the margin
        "vote@3": _score("vote@3", everything, 3, 600, 400),  # as good as vote@5, cheaper: chosen
        "vote@5": _score("vote@5", everything, 5, 1000, 400),  # the reference: the dearest plain vote
    }
    config = TuneConfig(data="x.jsonl", model="scripted", candidates=list(scores), objective="cheapest")
    chosen, why, supported, comparison = _settle(scores, config)
    assert (chosen, supported) == ("vote@3", True)
    assert "the cheapest candidate whose accuracy" in why and "vote@5's" in why
    # A plain vote is held to one answer: here +50 points.
    assert comparison is not None and comparison.against == "single" and comparison.diff == pytest.approx(0.5)
    small = {k: (v[0].model_copy(update={"items": 40}), dict(list(v[1].items())[:40])) for k, v in scores.items()}
    chosen, why, supported, _ = _settle(small, config)
    assert (chosen, supported) == ("vote@5", False) and "no cheaper candidate is non-inferior" in why
    no_vote = {k: v for k, v in scores.items() if k != "vote@3" and k != "vote@5"} | {
        "cisc(k=8)": _score("cisc(k=8)", everything, 16, 3000, 400)
    }
    # (No vote@K among the candidates is refused before any call, by check(); here none fits.)
    with pytest.raises(TuneRunError, match="no vote@K candidate fits it on the tuning items"):
        _settle(no_vote, config.model_copy(update={"candidates": list(no_vote)}))


def test_a_tokens_budget_leaves_out_what_does_not_fit_and_matches_the_vote_by_tokens() -> None:
    """Under tokens=1000, a 1,600-token candidate does not fit; a 900-token one is compared with the
    vote of 900 / 200 = 4.5, rounded half up to 5 samples, which the tune runs when it needs it."""
    everything = list(range(40))
    scores = {
        "single": _score("single", list(range(10)), 1, 200),
        "vote@3": _score("vote@3", list(range(20)), 3, 600),
        "adaptive-consistency(threshold=0.9)": _score("adaptive-consistency(threshold=0.9)", everything, 4.2, 900),
        "weighted-vote(signal=answer_prob)": _score("weighted-vote(signal=answer_prob)", everything, 8, 1600),
    }
    asked: list[str] = []

    def ensure(label: str) -> tuple[CandidateScore, dict[str, float]]:
        asked.append(label)
        return _score(label, list(range(25)), 5, 1000)

    config = TuneConfig(data="x.jsonl", model="scripted", candidates=list(scores), budget=parse_budget("tokens=1000"))
    chosen, why, supported, comparison = _settle(scores, config, ensure)
    assert not scores["weighted-vote(signal=answer_prob)"][0].fits
    assert chosen == "adaptive-consistency(threshold=0.9)" and supported and asked == ["vote@5"]
    assert comparison is not None and comparison.against == "vote@5" and comparison.diff == pytest.approx(15 / 40)
    assert "beats vote@5 (the vote at its budget)" in why
    with pytest.raises(TuneRunError, match="no candidate fits"):
        _settle(scores, config.model_copy(update={"budget": parse_budget("tokens=100")}), ensure)


def _no_vote(label: str) -> tuple[CandidateScore, dict[str, float]]:
    raise AssertionError(f"the tune should not need {label}")


def _settle(
    scores: Scores, config: TuneConfig, run: Callable[[str], tuple[CandidateScore, dict[str, float]]] = _no_vote
) -> Choice:
    """``choose`` as the tune's run loop drives it: each vote it needs is run (here by ``run``) and
    added to the scores, and it is asked again."""
    while isinstance(outcome := choose(scores, config), NeedVote):
        scores[outcome.label] = run(outcome.label)
    return outcome


def test_choose_asks_for_the_vote_at_a_budget_as_a_value_not_an_exception() -> None:
    """The choice is a pure function of the scores: a missing vote at the best candidate's budget is
    returned (the run loop runs it and asks again), and once it is there the same scores choose."""
    scores = {
        "single": _score("single", list(range(10)), 1, 200),
        "society-of-minds": _score("society-of-minds", list(range(30)), 4.5, 1300),
    }
    config = TuneConfig(data="x.jsonl", model="scripted", candidates=list(scores))
    assert choose(scores, config) == NeedVote("vote@5")  # its 4.5 calls, half up
    assert choose(scores, config) == NeedVote("vote@5")  # asking again changes nothing
    scores["vote@5"] = _score("vote@5", list(range(12)), 5, 1000)
    choice = choose(scores, config)
    assert isinstance(choice, Choice) and choice.label == "society-of-minds" and choice.supported
    assert choice.comparison is not None and choice.comparison.against == "vote@5"


def test_moot_debate_notes_a_tuned_file_run_on_another_model_than_it_was_tuned_on(tmp_path: Path) -> None:
    committed = Path(__file__).parent.parent / "docs" / "results" / "tune" / "arc-challenge" / "tuned.yaml"
    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps([{"reasoning": "r", "answer": "A", "confidence": 0.5}] * 3), encoding="utf-8")
    ran = runner.invoke(app, ["debate", "-p", str(committed), "-m", f"scripted:{replies}", "--quiet", "A or B?"])
    assert ran.exit_code == 0, ran.output
    said = " ".join(ran.output.split())
    assert f"was tuned on embedded:qwen2.5-1.5b; this debate runs on scripted:{replies}" in said
    assert "give --model embedded:qwen2.5-1.5b" in said
    more = tmp_path / "more.json"  # a model spec is resolved once per process: another script
    more.write_text(replies.read_text(encoding="utf-8"), encoding="utf-8")
    same = tmp_path / "tuned.yaml"
    same.write_text(committed.read_text(encoding="utf-8").replace("embedded:qwen2.5-1.5b", f"scripted:{more}"))
    quiet = runner.invoke(app, ["debate", "-p", str(same), "-m", f"scripted:{more}", "--quiet", "A or B?"])
    assert quiet.exit_code == 0 and "tuned on" not in quiet.output, quiet.output


@pytest.mark.parametrize("task", ["arc-challenge", "commonsenseqa"])
def test_tuned_yaml_is_written_and_read_through_one_typed_model(task: str) -> None:
    """A committed tuned.yaml read into TunedFile and written again is the same bytes; what moot tune
    writes (TunedFile.of) is read back equal."""
    from moot.protocols.tuned import TunedFile

    committed = Path(__file__).parent.parent / "docs" / "results" / "tune" / task / "tuned.yaml"
    text = committed.read_text(encoding="utf-8")
    read = TunedFile.from_data(yaml.safe_load(text))
    assert read.to_yaml() == text
    assert read.protocol() == {k: v for k, v in yaml.safe_load(text).items() if k != "tuned"}
    written = TunedFile.of(read.tuned, max_tokens=512)
    assert TunedFile.from_data(yaml.safe_load(written.to_yaml())) == written
    assert written.budget == {"max_tokens_per_turn": 512} and written.tuned.chosen == read.tuned.chosen


def test_a_tune_whose_every_candidate_failed_exits_1_its_calls_spent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bad input is exit 2, found before any call; a tune whose runs were made but left nothing to
    choose is a failed run: exit 1, the reasons in one line. (Both candidates need log-probabilities,
    which an OpenAI-compatible endpoint may or may not return: the fake one returns none.)"""
    from moot.testing.fake_openai import FakeOpenAIServer

    candidates = "weighted-vote(signal=answer_prob),filtered-vote(keep=0.5)"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with FakeOpenAIServer() as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        result = runner.invoke(app, ["tune", "--data", str(COLOURS), "-m", "openai:fake", "-o",
                                     str(tmp_path / "t"), "--candidates", candidates])  # fmt: skip
        assert fake.requests
    assert result.exit_code == 1, result.output
    assert "every candidate failed on every tuning item" in result.output and "Traceback" not in result.output
    assert (tmp_path / "t" / "tuning").exists()  # the calls were made


def test_the_terminal_names_the_tuned_file_by_its_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tune.md, printed at the end, said `moot debate -p tuned.yaml ...`: right beside the file, not
    where the command ran (copied as written: "protocol file 'tuned.yaml' does not exist")."""
    from moot.testing.fake_openai import FakeOpenAIServer

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.chdir(tmp_path)
    reply = json.dumps({"reasoning": "r", "answer": "A", "confidence": 0.9})
    with FakeOpenAIServer(reply=lambda request: reply) as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        result = runner.invoke(app, ["tune", "--data", str(COLOURS), "-m", "openai:fake", "-o", "runs/t",
                                     "--candidates", "single,vote@3"], env={"COLUMNS": "300"})  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "Run it: `moot debate -p runs/t/tuned.yaml ...`; serve it: `moot serve --tuned runs/t/tuned.yaml`" in (
        result.output
    )
    assert "Run it: `moot debate -p tuned.yaml ...`" in (tmp_path / "runs" / "t" / "tune.md").read_text()
    ran = runner.invoke(app, ["protocols", "show", "runs/t/tuned.yaml"])  # the command as shown finds it
    assert ran.exit_code == 0, ran.output


@pytest.mark.parametrize("name", ["arc-challenge", "arc-easy", "commonsenseqa", "gsm8k", "boolq"])
def test_a_named_benchmarks_items_come_back_whole_from_the_parts_moot_tune_writes(name: str, tmp_path: Path) -> None:
    """moot tune writes each part of its split as JSONL and its runs read it back (load_jsonl): every item
    of the shipped benchmarks must come back as it was. A check of user files refused ARC's option "C"
    answered "C" and CommonsenseQA's repeated options, and stopped moot tune on them."""
    from moot.eval.datasets import DATASETS as KNOWN
    from moot.eval.datasets import data_installed, load_dataset
    from moot.eval.tune.config import write_part
    from moot.eval.user_items import load_jsonl

    if not data_installed(KNOWN[name]):
        pytest.skip(f"{name}'s data is not installed here")
    items = load_dataset(name)
    path = tmp_path / "part.jsonl"
    write_part(items, [i.id for i in items], path)
    back = load_jsonl(path)
    assert [(i.id, i.answer, i.choices, i.kind) for i in back] == [(i.id, i.answer, i.choices, i.kind) for i in items]


async def test_a_protocol_file_chosen_by_the_tune_is_written_whole_and_runs_where_the_file_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A candidate given as a protocol file was written as `preset: mine.yaml`, which nothing could run
    (an outside trial's, session 37): the tuned file now holds the file's whole spec, and its evidence
    a copy, so that an edit by hand is still told apart."""
    from moot.protocols.tuned import TunedFile, edited_protocol
    from moot.server.tuned import load_tuned

    monkeypatch.chdir(tmp_path)
    mine = "preset: vote\nwith: {k: 3}\nname: my-vote\ntemperature: 0.9\nbudget: {max_calls: 4, timeout_s: 60}\n"
    (tmp_path / "mine.yaml").write_text(mine, encoding="utf-8")
    config = TuneConfig(data=str(COLOURS), model="scripted", candidates=["mine.yaml", "vote@5"])
    report = await run_tune(config, tmp_path / "tune", model=ScriptedModel(fn=noisy))
    assert report.chosen == "mine.yaml"
    (tmp_path / "mine.yaml").unlink()  # the tuned file does not need it
    tuned = TunedFile.from_data(yaml.safe_load((tmp_path / "tune" / "tuned.yaml").read_text()))
    assert tuned.preset is None and tuned.protocol()["name"] == "my-vote"
    assert tuned.tuned.protocol is not None and tuned.tuned.protocol["name"] == "my-vote"
    spec = load_protocol(tmp_path / "tune" / "tuned.yaml")
    assert spec.name == "my-vote" and len(spec.participants) == 3
    # Its own budget kept (it was dropped: a review's), the tune's turn budget over it when it set one.
    assert (spec.budget.max_calls, spec.budget.timeout_s) == (4, 60)
    ran = runner.invoke(app, ["protocols", "show", str(tmp_path / "tune" / "tuned.yaml")])
    assert ran.exit_code == 0, ran.output
    assert load_tuned(tmp_path / "tune" / "tuned.yaml").label == "mine.yaml"
    # Edited by hand, it runs another protocol than its evidence measured: said, as for a preset's.
    edited = {**tuned.protocol(), "rounds": 3}
    assert edited_protocol(edited, tuned.tuned, lambda a, b: a == b) is not None
    assert edited_protocol(tuned.protocol(), tuned.tuned, lambda a, b: a == b) is None
