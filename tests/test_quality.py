"""Seed 004's debate quality (moot.quality), its judge, its agreement with the hand labels, and the
`moot debate --quality` / `moot quality` commands: engines run on the scripted model."""

from __future__ import annotations

import base64
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from moot.cli.main import app
from moot.core import DebateTask, Engine
from moot.core.types import QUALITY_DIMENSIONS, ContextChunk, DebateResult, load_result
from moot.models.base import ChatRequest, ModelConfigError
from moot.models.images import ImageInput
from moot.models.scripted import ScriptedModel
from moot.protocols import get_preset
from moot.quality import SEED_DIMENSIONS, assess, measure
from moot.quality.agreement import (
    LabelledDebate,
    agreement,
    concordance,
    kendall_tau_b,
    load_labelled,
)
from moot.quality.judge import RUBRIC, render_debate
from moot.quality.measures import words

runner = CliRunner()


def answer(text: str, value: str, confidence: float = 0.8) -> dict[str, Any]:
    return {"reasoning": text, "answer": value, "confidence": confidence}


async def society(replies: list[dict[str, Any]], rounds: int = 2, context: list[str] | None = None) -> DebateResult:
    spec = get_preset("society-of-minds").model_copy(update={"rounds": rounds})
    task = DebateTask(question="What is 17 * 24?", context=[ContextChunk(text=c) for c in context or []])
    return await Engine(spec, ScriptedModel(replies)).run(task)


def judge_reply(consistency: int, depth: int) -> dict[str, Any]:
    return {
        "rationale": "The answers follow from the steps shown.",
        "logical_consistency": consistency,
        "reasoning_depth": depth,
    }


# ------------------------------------------------------------------------------- the measures


@pytest.mark.req("S004-Q-CONSENSUS", "S004-Q-CONFIDENCE", "S004-Q-OVERALL")
async def test_consensus_and_decision_confidence_come_from_the_answers_and_the_vote() -> None:
    result = await society(
        [
            answer("17*20+17*4", "408"),
            answer("24*17", "408"),
            answer("guess", "400"),
            answer("checked", "408"),
            answer("checked", "408"),
            answer("still", "400"),
        ]
    )
    quality = measure(result)
    assert quality.value("consensus_quality") == pytest.approx(2 / 3, abs=1e-6)
    assert quality.scores["consensus_quality"].details["unanimous"] is False
    assert quality.value("decision_confidence") == pytest.approx(2 / 3, abs=1e-6)
    assert quality.scores["decision_confidence"].details["source"] == "the vote's winning share"
    assert quality.judge is None and set(quality.unmeasured) == {
        "evidence_quality",
        "logical_consistency",
        "reasoning_depth",
    }
    assert "no context passages" in quality.unmeasured["evidence_quality"]
    assert "no judge model" in quality.unmeasured["logical_consistency"]
    # overall: the mean of the seed's dimensions that were measured, and it says which
    measured = [d for d in SEED_DIMENSIONS if d in quality.scores]
    assert quality.value("overall_quality") == pytest.approx(
        sum(quality.scores[d].value for d in measured) / len(measured), abs=1e-6
    )
    assert quality.scores["overall_quality"].details["missing"] == ["logical_consistency", "evidence_quality"]
    assert list(quality.scores) == [d for d in QUALITY_DIMENSIONS if d in quality.scores]


@pytest.mark.req("S004-Q-EVIDENCE")
async def test_evidence_is_checked_against_the_context_passages() -> None:
    context = ["The bridge carries 40,000 vehicles a day and closes about 20 days a year for repairs."]
    grounded = await society(
        [answer("The bridge carries 40,000 vehicles a day and closes 20 days a year for repairs.", "yes")] * 3,
        rounds=1, context=context,
    )  # fmt: skip
    made_up = await society(
        [answer("A 2019 survey of 7 towns found bridges fail every 3 years on average.", "yes")] * 3,
        rounds=1, context=context,
    )  # fmt: skip
    good, bad = measure(grounded).scores["evidence_quality"], measure(made_up).scores["evidence_quality"]
    assert good.value > 0.9 and bad.value < 0.1
    assert bad.details["numbers_not_in_context"] == ["2019", "3", "7"]
    assert good.details["grounded"] == good.details["items"] == 3


@pytest.mark.req("S004-Q-EVIDENCE")
async def test_a_number_no_passage_gives_takes_the_support_away() -> None:
    context = ["Injury collisions fell by 12 percent after the speed limit was lowered."]
    right = await society([answer("Injury collisions fell by 12 percent.", "yes")] * 3, rounds=1, context=context)
    wrong = await society([answer("Injury collisions fell by 21 percent.", "yes")] * 3, rounds=1, context=context)
    assert measure(right).value("evidence_quality") == 1.0
    assert measure(wrong).value("evidence_quality") == 0.0


@pytest.mark.req("S004-Q-EVIDENCE")
async def test_a_citation_of_a_passage_is_not_a_made_up_number() -> None:
    """The default protocol asks its agents to cite the passages as [n]: the markers counted as
    numbers no passage gives, and took the support of every cited claim away (an outside trial)."""
    context = ["Injury collisions fell by 12 percent after the speed limit was lowered."]
    plain = await society([answer("Injury collisions fell by 12 percent.", "yes")] * 3, rounds=1, context=context)
    cited = await society(
        [answer("Injury collisions fell by 12 percent [1]. The limit was lowered [1, 2].", "yes")] * 3,
        rounds=1, context=context,
    )  # fmt: skip
    score = measure(cited).scores["evidence_quality"]
    assert score.value == measure(plain).value("evidence_quality") == 1.0
    assert score.details["numbers_not_in_context"] == []


@pytest.mark.req("S004-Q-DIVERSITY")
async def test_diversity_is_between_debaters_and_needs_two() -> None:
    same = await society([answer("Multiply seventeen by twenty four", "408")] * 3, rounds=1)
    different = await society(
        [answer("Decompose into tens and units", "408"), answer("Round twenty four up to twenty five then subtract",
         "408"), answer("Long multiplication column by column", "408")], rounds=1,
    )  # fmt: skip
    assert measure(same).value("argument_diversity") == 0.0
    assert (measure(different).value("argument_diversity") or 0) > 0.8
    single = await Engine(get_preset("single"), ScriptedModel([answer("x y z", "408")])).run("What is 17 * 24?")
    q = measure(single)
    assert "argument_diversity" not in q.scores and "fewer than two debaters" in q.unmeasured["argument_diversity"]


async def test_what_is_trivial_for_one_agent_is_not_measured_for_it() -> None:
    """Issue 28: one answer agrees with itself and a one-ballot vote has a winning share of 1, so a single
    agent scored 1.00 on consensus, confidence and the overall score however wrong it was."""
    single = await Engine(get_preset("single"), ScriptedModel([answer("a guess", "400")])).run("What is 17 * 24?")
    q = measure(single)
    for dim in ("argument_diversity", "consensus_quality", "decision_confidence", "overall_quality"):
        assert dim not in q.scores and q.unmeasured[dim].startswith("n/a — one agent: "), dim
    assert "agrees with itself" in q.unmeasured["consensus_quality"]
    assert "one ballot" in q.unmeasured["decision_confidence"]
    # three debaters of whom one answered: the same triviality, said as such
    lone = await society([answer("17*24", "408"), "no json", "no json", "still none", "no json", "no"], rounds=1)
    q = measure(lone)
    assert q.unmeasured["consensus_quality"].startswith("n/a — one answer: ")
    assert q.unmeasured["decision_confidence"].startswith("n/a — one answer: ")
    # two answers are a consensus to measure
    two = await society([answer("17*24", "408"), answer("17*24", "408"), "no json", "no json"], rounds=1)
    assert measure(two).value("consensus_quality") == 1.0


async def test_free_text_debates_say_why_consensus_and_confidence_are_not_measured() -> None:
    spec = get_preset("affirmative-critical").model_copy(update={"rounds": 1})
    result = await Engine(spec, ScriptedModel(["Paris is the capital.", "Lyon is bigger.", "Paris."])).run(
        DebateTask(question="What is the capital of France?", context=[ContextChunk(text="Paris is the capital.")])
    )
    q = measure(result)
    assert "free-text" in q.unmeasured["consensus_quality"]
    assert q.unmeasured["decision_confidence"] == "the decision (a free-text synthesis) states no confidence"
    assert "evidence_quality" in q.scores and "argument_diversity" in q.scores


@pytest.mark.req("S004-ARGUMENT", "S004-Q-CONFIDENCE")
async def test_moderated_debates_use_the_argument_strength_confidence_and_skip_the_moderator() -> None:
    arg = {
        "content": "Remote engineers merged 8 percent more changes.",
        "confidence": 0.8,
        "supporting_evidence": ["remote workers merged 8 percent more code changes"],
    }
    con = {
        "content": "Juniors got 30 percent less feedback.",
        "confidence": 0.6,
        "supporting_evidence": ["junior engineers received 30 percent less feedback"],
    }
    mod = {"pro_score": 0.7, "con_score": 0.5, "confidence": 0.9, "key_points": []}
    spec = get_preset("moderated")
    task = DebateTask(
        question="Remote work improves productivity.",
        context=[
            ContextChunk(
                text="Remote workers merged 8 percent more code changes; junior engineers received "
                "30 percent less feedback."
            )
        ],
    )
    result = await Engine(spec, ScriptedModel([arg, con, mod])).run(task)
    q = measure(result)
    assert q.value("decision_confidence") == pytest.approx(result.decision["confidence"])  # type: ignore[index]
    assert q.value("evidence_quality") == 1.0  # the supporting_evidence lists, not the moderator's JSON
    assert q.scores["argument_diversity"].details["debaters"] == 2


def test_content_words_keep_numbers_and_drop_function_words() -> None:
    assert words("The rate was 0.10% in Q1-2024, and it is 1,000 units.") == [
        "rate",
        "0.10",
        "q1",
        "2024",
        "1000",
        "unit",
    ]


# --------------------------------------------------------------------------------- the judge


@pytest.mark.req("S004-Q-LOGIC", "S004-Q-OVERALL")
async def test_the_judge_scores_by_the_rubric_and_is_named() -> None:
    result = await society([answer("a", "408"), answer("b", "408"), answer("c", "408")], rounds=1)
    judge = ScriptedModel([judge_reply(4, 2)], name="scripted-judge")
    q = await assess(result, judge)
    assert q.judge == "scripted-judge" and q.judge_calls == 1 and q.judge_usage.total_tokens > 0
    assert q.value("logical_consistency") == 0.75 and q.value("reasoning_depth") == 0.25
    assert q.scores["logical_consistency"].method == "judge"
    assert q.scores["logical_consistency"].details["rationale"].startswith("The answers")
    assert q.scores["overall_quality"].method == "judge"
    request = judge.requests[0]
    assert request.messages[0].content == RUBRIC and request.response_schema is not None
    assert "What is 17 * 24?" in request.messages[1].content and "Final answer: 408" in request.messages[1].content


@pytest.mark.req("S004-Q-LOGIC")
async def test_a_failing_or_unparsable_judge_leaves_its_dimensions_unmeasured() -> None:
    result = await society([answer("a", "408")] * 3, rounds=1)
    failed = await assess(result, ScriptedModel([ModelConfigError("no key for the judge")], name="j"))
    assert "logical_consistency" not in failed.scores
    assert failed.unmeasured["reasoning_depth"] == "the judge j failed: no key for the judge"
    garbled = await assess(result, ScriptedModel(["not json", '{"rationale": "x", "logical_consistency": 9}']))
    assert garbled.judge_calls == 2  # one repair, then an explicit failure
    assert garbled.unmeasured["logical_consistency"].startswith("the judge's reply could not be parsed")


async def test_the_judge_is_shown_the_questions_images_or_told_of_them() -> None:
    # A debate about an image: a judge that reads images is shown it with the question, as the
    # debaters were; one that reads text only is told there was one (and is not refused).
    pixel = ImageInput(url="data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"0" * 8).decode())
    result = await society([answer("a", "408")] * 3, rounds=1)
    result.task.images = [pixel]
    seeing = ScriptedModel([judge_reply(4, 2)], name="seeing")
    assert (await assess(result, seeing)).value("logical_consistency") == 0.75
    assert seeing.requests[0].messages[1].images == (pixel,)
    assert "not to you" not in seeing.requests[0].messages[1].content

    class Blind(ScriptedModel):
        reads_images = False

    blind = Blind([judge_reply(4, 2)], name="blind")
    assert (await assess(result, blind)).value("logical_consistency") == 0.75
    told = blind.requests[0].messages[1]
    assert told.images == () and "1 image was shown with the question to the debaters, not to you" in told.content


def test_the_judge_sees_a_bounded_transcript() -> None:
    debate = LabelledDebate(
        id="long",
        question="Q?",
        turns=[{"speaker": "a", "round": 1, "text": "word " * 5000}],  # type: ignore[list-item]
        labels={},
    )
    shown = render_debate(debate.to_result())
    assert len(shown) < 6500 and "the rest of the debate is cut" in shown


# ----------------------------------------------------------------------------- the agreement


def test_the_shipped_labelled_set_loads_and_covers_every_dimension() -> None:
    debates = load_labelled()
    assert len(debates) >= 30 and len({d.id for d in debates}) == len(debates)
    for dim in QUALITY_DIMENSIONS:
        labelled = [d.labels[dim] for d in debates if dim in d.labels]
        assert len(labelled) >= 10 and len(set(labelled)) == 3, dim  # every level is used


async def test_agreement_of_the_deterministic_measures_is_reported() -> None:
    report = await agreement()
    rows = {d.dimension: d for d in report.dimensions}
    assert report.judge is None and report.debates == len(load_labelled())
    for dim in ("evidence_quality", "argument_diversity", "consensus_quality", "decision_confidence"):
        row = rows[dim]
        assert row.method == "deterministic" and row.measured > 5 and row.tau_b is not None
        assert row.measured + row.unmeasured == row.labelled
    # the measured numbers (docs/quality.md quotes them): they agree with the labels better than chance
    assert rows["consensus_quality"].tau_b is not None and rows["consensus_quality"].tau_b > 0.5
    assert (rows["argument_diversity"].concordance or 0) > 0.6 and (rows["evidence_quality"].concordance or 0) > 0.6
    assert rows["logical_consistency"].measured == 0 and rows["logical_consistency"].unmeasured == report.debates


def _label_judge(debates: list[LabelledDebate], noise: bool = False) -> ScriptedModel:
    """A scripted judge that answers each debate with its labels (level = 2 * label + 1)."""
    by_question = {}
    for d in debates:
        by_question.setdefault(d.question, d)

    def reply(request: ChatRequest) -> dict[str, Any]:
        prompt = request.messages[1].content
        debate = next(d for q, d in by_question.items() if prompt.startswith(f"Question: {q}"))
        if noise:
            return judge_reply(3, 3)
        return judge_reply(2 * debate.labels["logical_consistency"] + 1, 2 * debate.labels["reasoning_depth"] + 1)

    return ScriptedModel(fn=reply, name="label-judge")


@pytest.mark.req("S004-Q-LOGIC")
async def test_a_judge_that_agrees_with_the_labels_scores_full_agreement() -> None:
    every = load_labelled()
    counts = Counter(d.question for d in every)
    debates = [d for d in every if counts[d.question] == 1]  # the scripted judge knows a debate by its question
    perfect = await agreement(debates, _label_judge(debates))
    rows = {d.dimension: d for d in perfect.dimensions}
    assert perfect.judge == "label-judge"
    assert rows["logical_consistency"].tau_b == 1.0 and rows["reasoning_depth"].concordance == 1.0
    constant = await agreement(debates, _label_judge(debates, noise=True))
    rows = {d.dimension: d for d in constant.dimensions}
    assert rows["logical_consistency"].tau_b is None and rows["logical_consistency"].concordance == 0.5


def test_kendall_and_concordance() -> None:
    assert kendall_tau_b([1, 2, 3], [0, 1, 2]) == 1.0
    assert kendall_tau_b([3, 2, 1], [0, 1, 2]) == -1.0
    assert kendall_tau_b([1, 1, 1], [0, 1, 2]) is None
    assert concordance([0.1, 0.1, 0.9], [0, 1, 2]) == (pytest.approx(2.5 / 3), 3)
    assert concordance([1.0, 2.0], [1, 1]) == (None, 0)


def test_a_bad_labelled_set_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("- id: x\n  question: Q?\n  turns: []\n  labels: {depth: 1}\n")
    result = runner.invoke(app, ["quality", "agreement", "--labels", str(bad)])
    assert result.exit_code == 2 and "unknown dimension(s) depth" in result.output
    bad.write_text("- id: x\n  question: Q?\n  turns: []\n  labels: {reasoning_depth: 3}\n")
    result = runner.invoke(app, ["quality", "agreement", "--labels", str(bad)])
    assert result.exit_code == 2 and "item 0 (x): invalid labels.reasoning_depth" in result.output


# ------------------------------------------------------------------------------------- the CLI


def _script(tmp_path: Path, replies: list[Any], name: str = "replies.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(replies))
    return path


@pytest.mark.req("S000-METRICS")
def test_debate_quality_is_printed_and_saved(tmp_path: Path) -> None:
    replies = [
        "Paris is the capital of France.",
        "Lyon is larger than Paris.",
        "Paris, with Lyon second.",
        "Paris is the capital.",
        "Paris.",
    ]
    debate = _script(tmp_path, replies)
    judge = _script(tmp_path, [judge_reply(5, 3)], "judge.json")
    ctx = tmp_path / "ctx.txt"
    ctx.write_text("Paris is the capital of France.")
    out = tmp_path / "run.json"
    result = runner.invoke(
        app, ["debate", "What is the capital of France?", "-m", f"scripted:{debate}", "-c", str(ctx), "--quality",
              "--judge-model", f"scripted:{judge}", "--json", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "debate quality" in result.output and "logical_consistency" in result.output
    assert "not measured: no typed answers" in result.output
    saved = load_result(out)
    assert saved.quality is not None and saved.quality.judge == f"scripted:{judge}"
    assert saved.quality.value("logical_consistency") == 1.0 and saved.quality.value("reasoning_depth") == 0.5
    assert "consensus_quality" in saved.quality.unmeasured
    assert saved.cost is not None and saved.cost.total_tokens == saved.usage.total_tokens


def test_debate_quality_defaults_to_the_debates_model_and_none_skips_the_judge(tmp_path: Path) -> None:
    replies = ["A.", "B.", "C.", "D.", "Final.", judge_reply(3, 3)]
    out = tmp_path / "run.json"
    result = runner.invoke(
        app, ["debate", "Q?", "-m", f"scripted:{_script(tmp_path, replies)}", "--quality", "-q", "--json", str(out)]
    )
    assert result.exit_code == 0, result.output
    saved = load_result(out)
    assert saved.quality is not None and saved.quality.judge is not None and saved.quality.judge_calls == 1
    assert result.output.strip() == "Final."  # --quiet prints only the answer
    result = runner.invoke(
        app,
        [
            "debate",
            "Q?",
            "-m",
            f"scripted:{_script(tmp_path, replies[:5], 'b.json')}",
            "--quality",
            "--judge-model",
            "none",
            "--json",
            str(out),
            "-q",
        ],
    )
    assert result.exit_code == 0, result.output
    saved = load_result(out)
    assert saved.quality is not None and saved.quality.judge is None and saved.llm_calls == 5
    assert "logical_consistency" in saved.quality.unmeasured


def test_quality_score_of_a_saved_debate(tmp_path: Path) -> None:
    replies = ["A passage claim.", "Another claim.", "More.", "Still more.", "Final."]
    out = tmp_path / "run.json"
    ran = runner.invoke(app, ["debate", "Q?", "-m", f"scripted:{_script(tmp_path, replies)}", "--json", str(out)])
    assert ran.exit_code == 0 and load_result(out).quality is None
    judge = _script(tmp_path, [judge_reply(2, 4)], "judge.json")
    result = runner.invoke(
        app, ["quality", "score", str(out), "--judge-model", f"scripted:{judge}", "--json", "--write"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["scores"]["reasoning_depth"]["value"] == 0.75
    assert load_result(out).quality is not None
    printed = runner.invoke(app, ["quality", "score", str(out)])
    assert printed.exit_code == 0 and "argument_diversity" in printed.output
    # scored again with no judge, and written: what the judge gave is kept (it was dropped)
    judged = load_result(out).quality
    again = runner.invoke(app, ["quality", "score", str(out), "--write", "--json"])
    kept = load_result(out).quality
    assert again.exit_code == 0 and judged is not None and kept is not None
    assert kept.scores["reasoning_depth"] == judged.scores["reasoning_depth"] and kept.judge == judged.judge
    assert kept.scores["overall_quality"] == judged.scores["overall_quality"] and not kept.unmeasured.get(
        "reasoning_depth"
    )
    for bad, message in ((tmp_path / "none.json", "does not exist"), (_script(tmp_path, [1], "x.json"), "not a moot")):
        result = runner.invoke(app, ["quality", "score", str(bad)])
        assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output
    result = runner.invoke(app, ["quality", "score", str(out), "--judge-model", "nonsense:x"])
    assert result.exit_code == 2 and "unknown model spec 'nonsense:x'" in result.output  # bad input (issue 18)


def test_a_file_given_to_a_json_that_prints_is_named_with_the_fix(tmp_path: Path) -> None:
    """--json takes a file on moot debate but prints here: `--json q.json` was click's "Got unexpected
    extra argument(s)" (a newcomer's trial, session 38). It is named, with the redirection to use."""
    for args in (
        ["quality", "score", str(tmp_path / "run.json"), "--json", "q.json"],
        ["quality", "agreement", "--json", "a.json"],
        ["arbitrate", "examples/reports.json", "--json", "r.json", "--detect-only"],
    ):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, result.output
        name = args[args.index("--json") + 1]
        assert (
            f"--json prints the JSON here and takes no file name ({name!r}); to keep it in a file: --json > {name}"
            in (result.output)
        )
    # `--json OUT INPUT`: the input is left over here, and no advice writes over it (a review)
    swapped = CliRunner().invoke(app, ["arbitrate", "--json", "out.json", "examples/reports.json", "--detect-only"])
    assert swapped.exit_code == 2 and "to keep it in a file: --json > FILE" in swapped.output
    assert "> examples/reports.json" not in swapped.output
    stray = CliRunner().invoke(app, ["quality", "agreement", "stray"])
    assert stray.exit_code == 2 and "unexpected argument 'stray'; see --help" in stray.output


def test_quality_agreement_command() -> None:
    result = runner.invoke(app, ["quality", "agreement", "--json"])
    assert result.exit_code == 0, result.output
    rows = {d["dimension"]: d for d in json.loads(result.stdout)["dimensions"]}
    assert rows["argument_diversity"]["measured"] == rows["argument_diversity"]["labelled"]
    table = runner.invoke(app, ["quality", "agreement"], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "Kendall tau-b" in table.output and "concordance" in table.output


def test_an_embedded_model_as_the_default_judge_is_flagged() -> None:
    from moot.cli.main import judge_note
    from moot.models.scripted import ScriptedModel

    embedded = ScriptedModel(["x"], name="embedded:qwen2.5-1.5b")
    assert judge_note(embedded, None) is not None and "--judge-model" in (judge_note(embedded, None) or "")
    assert judge_note(embedded, "embedded:qwen2.5-1.5b") is None  # asked for by name: no note
    assert judge_note(ScriptedModel(["x"], name="openai:gpt-4o"), None) is None and judge_note(None, None) is None
