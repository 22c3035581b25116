"""The rules ``moot eval report`` derives from a pool of samples, as protocols that run anywhere:
on the same samples each decides exactly what the report's derivation decides."""

from __future__ import annotations

import gzip
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from moot import ScriptedModel
from moot.core import Engine
from moot.core.spec import SpecError
from moot.core.stop import beta_mode_probability, parse_stop
from moot.eval.datasets import load_dataset
from moot.eval.items import EvalItem, to_task
from moot.eval.pool import _adaptive_consistency, _leaders, pool_samples
from moot.eval.protocols import fit_to_item
from moot.eval.store import RunStore
from moot.models.base import BaseChatModel, ChatRequest, ChatResponse, ModelError, TokenCallback
from moot.models.cache import CachedModel, SqliteCache
from moot.protocols import get_preset

RESULTS = Path(__file__).parent.parent / "docs" / "results"


def answers(*letters: str) -> ScriptedModel:
    return ScriptedModel([{"reasoning": "r", "answer": a, "confidence": 0.5} for a in letters])


async def test_adaptive_consistency_samples_until_the_plurality_is_settled() -> None:
    model = answers(*"AAAAAAAA")
    result = await Engine(get_preset("adaptive-consistency"), model).run("q")
    # P(mode) = 31/32 >= 0.95 after four agreeing samples: four calls, one per round, in seed order.
    assert result.llm_calls == 4 and result.stop_reason == "settled" and result.final_answer == "A"
    assert [r.seed for r in model.requests] == [1, 2, 3, 4]
    assert [len(r.turns) for r in result.rounds] == [1, 1, 1, 1]
    split = await Engine(get_preset("adaptive-consistency", k=6), answers(*"ABABAB")).run("q")
    assert split.llm_calls == 6 and split.stop_reason == "max_rounds" and split.final_answer == "A"
    assert split.decision is not None and split.decision["tie"] is True  # the tie rule: the first given
    assert beta_mode_probability(4, 0) == pytest.approx(31 / 32)
    assert parse_stop("settled(0.9)").expr() == "settled(0.9)"


async def test_a_weighted_or_filtered_vote_is_refused_before_any_call_on_a_model_without_log_probabilities() -> None:
    for name in ("weighted-vote", "filtered-vote"):
        model = answers("A")
        with pytest.raises(SpecError, match="log-probabilities"):
            Engine(get_preset(name), model)
        assert model.requests == []
    # The stated confidence needs none.
    stated = await Engine(get_preset("weighted-vote", k=2, signal="stated"), answers("A", "B")).run("q")
    assert stated.final_answer == "A"


def test_moot_eval_refuses_such_a_vote_once_before_any_call_not_on_every_item(tmp_path: Path) -> None:
    """In a run, the refusal is one line and exit 2 before the folder exists, not a failed item per
    item: the scripted model returns no log-probabilities."""
    from typer.testing import CliRunner

    from moot.cli.main import app

    science = Path(__file__).parent / "fixtures" / "eval" / "science.jsonl"
    replies = tmp_path / "replies.json"
    replies.write_text('[{"reasoning": "r", "answer": "A", "confidence": 0.5}]', encoding="utf-8")
    for protocol, named in (("weighted-vote(k=3)", "log-probabilities"), ("vote@uab(budget=2,cap=4)", "difficulty")):
        out = tmp_path / protocol.split("(")[0].replace("@", "-")
        done = CliRunner().invoke(
            app, ["eval", "-d", str(science), "-p", f"single,{protocol}", "-m", f"scripted:{replies}", "-o", str(out)]
        )
        assert done.exit_code == 2, done.output
        assert named in done.output and len(done.output.strip().splitlines()) == 1
        assert not out.exists()


async def test_a_filtered_vote_keeps_only_the_most_confident_share() -> None:
    replies = [
        {"reasoning": "r", "answer": a, "confidence": c} for a, c in (("A", 0.2), ("B", 0.9), ("A", 0.3), ("B", 0.8))
    ]
    spec = get_preset("filtered-vote", k=4, keep=0.5, signal="stated")
    result = await Engine(spec, ScriptedModel(replies)).run("q")
    assert result.final_answer == "B" and result.decision is not None and result.decision["filtered_out"] == 2


async def test_a_filtered_vote_with_nothing_to_rank_by_fails_naming_the_signal() -> None:
    """On a backend not known to lack log-probabilities (an OpenAI-compatible endpoint) that returns
    none, the filter had nothing to rank by and kept the first half given, silently; it fails instead,
    as the weighted vote does, so that ``moot tune`` shows it failed and never ranks it."""
    model = answers("A", "B", "B", "A")
    model.returns_logprobs = None  # (not known before a call)
    result = await Engine(get_preset("filtered-vote", k=4, keep=0.5), model).run("q")
    assert result.final_answer is None and result.status == "failed" and model.requests
    assert result.error is not None and "'seq_prob'" in result.error and "log-probabilities" in result.error
    assert result.decision is not None and result.decision["filtered_out"] == 4 and result.decision["votes"] == {}
    assert {"ballots", "abstained", "weighted", "calibrated", "tie"} <= set(result.decision)  # the vote's own shape


class Replay(BaseChatModel):
    """Answers only from a run's stored request cache: a request the pool did not make fails."""

    returns_logprobs: bool | None = True

    def __init__(self, name: str) -> None:
        super().__init__(name)

    async def _complete_once(self, request: ChatRequest, on_token: TokenCallback | None) -> ChatResponse:
        raise ModelError("not in the pool: the protocol asked something the pool's samples did not")


def _stored_pool(tmp_path: Path, name: str) -> RunStore:
    gz = RESULTS / name / "run.sqlite.gz"
    if not gz.is_file():
        pytest.skip(f"{gz} is not in this checkout")
    folder = tmp_path / name
    folder.mkdir()
    with gzip.open(gz, "rb") as src, (folder / "run.sqlite").open("wb") as dst:
        shutil.copyfileobj(src, dst)
    return RunStore.open(folder)


@pytest.mark.parametrize("name", ["arc-challenge-1.5b", "commonsenseqa-1.5b"])
async def test_on_a_stored_pool_each_runnable_rule_decides_what_the_report_derives(tmp_path: Path, name: str) -> None:
    """The protocols re-run on the committed pool's first items through its request cache, with a
    model that cannot answer anything else: every request must be one the pool made, and each
    decision must be the report's derivation of the same rule on the same samples."""
    store = _stored_pool(tmp_path, name)
    items: dict[str, EvalItem] = {i.id: i for i in store.items()}
    pool = store.transcripts("cisc(k=8)")
    # The model's identity, as the stored keys have it (the weights' hash and the engine build).
    identity = _identity(store)
    cache = SqliteCache(store.conn)
    checked = 0
    for item_id in list(items)[:12]:
        item, transcript = items[item_id], pool.get(item_id)
        if transcript is None or transcript.status != "complete":
            continue
        samples = pool_samples(transcript, item)
        model = CachedModel(_Identified(identity), cache)
        rules: list[tuple[str, dict[str, Any], str | None]] = [
            ("vote", {"k": 8}, None),
            ("adaptive-consistency", {"threshold": 0.95}, None),
            ("weighted-vote", {"signal": "answer_prob", "softmax_t": 0.2}, "answer_prob"),
            ("weighted-vote", {"signal": "seq_prob", "softmax_t": 0.5}, "seq_prob"),
            ("weighted-vote", {"signal": "stated", "softmax_t": 0.1}, "stated"),
        ]
        for preset, params, signal in rules:
            spec = fit_to_item(get_preset(preset, **params), item, max_tokens=store.config.max_tokens, timeout_s=None)
            result = await Engine(spec, model).run(to_task(item))
            if preset == "vote" and result.status != "complete" and "not in the pool" in (result.error or ""):
                pytest.skip("the committed pool was made with another llama.cpp build: its cache keys differ")
            assert result.status == "complete", (preset, result.error)
            if preset == "adaptive-consistency":
                drawn, leaders = _adaptive_consistency(samples, 0.95)
                assert result.llm_calls == drawn and result.final_answer == leaders[0], item_id
            else:
                t = params.get("softmax_t", math.inf) if signal else math.inf
                assert result.final_answer == _leaders(samples, signal, t)[0], (preset, params, item_id)
        checked += 1
    assert checked >= 10
    store.close()


def _identity(store: RunStore) -> dict[str, Any]:
    """The embedded model's identity as the pool's keys hold it (its weights' hash and the llama.cpp
    build), without loading it."""
    from moot.models.embedded import _engine_version
    from moot.models.weights import get_info

    row = store.conn.execute("SELECT model FROM request_cache LIMIT 1").fetchone()
    assert row is not None and str(row[0]).startswith("embedded:")
    info = get_info(str(row[0]).removeprefix("embedded:"))
    return {"backend": "EmbeddedModel", "name": row[0], "sha256": info.sha256, "engine": _engine_version()}


class _Identified(Replay):
    def __init__(self, identity: dict[str, Any]) -> None:
        super().__init__(str(identity["name"]))
        self._identity = identity

    def identity(self) -> dict[str, Any]:
        return dict(self._identity)


async def test_uab_moves_a_runs_budget_to_the_items_its_first_samples_left_uncertain(tmp_path: Path) -> None:
    """``vote@uab(budget=B, cap=K)``: the first sample of each item (sample 1 of the run's pool, from
    the cache) rates its difficulty; B x items samples are allocated as the report derives UAB
    (:func:`moot.eval.pool.uab_allocate`); each item is decided by the vote over its first n samples."""
    from moot.eval.pool import UAB_TEMPERATURE, uab_allocate
    from moot.eval.runner import run_eval
    from moot.eval.store import RunConfig
    from test_beat_the_vote import SCIENCE, LogprobModel

    model = LogprobModel()
    cfg = RunConfig(dataset=str(SCIENCE), protocols=["vote@4", "vote@uab(budget=3,cap=4)"], model="m", n=8)
    store = await run_eval(cfg, tmp_path / "run", model=model)
    uab = {r.item_id: r for r in store.results("vote@uab(budget=3,cap=4)")}
    pool = store.transcripts("vote@4")
    first = [
        pool[i].rounds[0].turns[0].signals["seq_prob"] for i in sorted(uab, key=[x.id for x in store.items()].index)
    ]
    expected, _ = uab_allocate([math.exp(math.log(p) / UAB_TEMPERATURE) for p in first], 3 * 8, 4)
    ids = [x.id for x in store.items()]
    assert [uab[i].calls for i in ids] == expected and sum(expected) == 24
    assert len(set(expected)) > 1  # the budget moved between items
    # Every sample it used was one of the pool's: the cache served all of them.
    assert all(r.cached_calls == r.calls for r in uab.values())
    from moot.eval.loaded import read_store
    from moot.eval.pool import find_pool

    assert find_pool(read_store(store)) == "vote@4"  # the run's pool: vote@uab is not a vote of a number of samples
    transcripts = store.transcripts("vote@uab(budget=3,cap=4)")
    for i in ids:
        answers = [t.parsed["answer"] for t in transcripts[i].rounds[0].turns if t.parsed]
        pooled = [t.parsed["answer"] for t in pool[i].rounds[0].turns[: uab[i].calls] if t.parsed]
        assert answers == pooled
    store.close()


async def test_uab_records_an_item_whose_first_sample_failed_and_moves_the_rest(tmp_path: Path) -> None:
    """``moot eval``'s UAB is ``moot batch``'s (one loop, :func:`moot.eval.runner.allocate_uab`): an
    item whose first sample failed is recorded failed with the reason (it was blamed on the model's
    log-probabilities, and the run stopped), the budget moves between the items rated, and a resumed
    run keeps the allocation."""
    from moot.eval.runner import run_eval
    from moot.eval.store import RunConfig
    from moot.models.base import ModelError
    from test_beat_the_vote import SCIENCE, LogprobModel

    class Failing(LogprobModel):
        broken = ""

        async def _complete_once(self, request: ChatRequest, on_token: TokenCallback | None) -> ChatResponse:
            if self.broken in request.messages[-1].content:
                raise ModelError("the backend refused this prompt")
            return await super()._complete_once(request, on_token)

    model = Failing()
    items = load_dataset(str(SCIENCE))
    cfg = RunConfig(dataset=str(SCIENCE), protocols=["vote@uab(budget=3,cap=4)"], model="m", n=len(items))
    model.broken = items[2].question
    store = await run_eval(cfg, tmp_path / "run", model=model)
    rows = {r.item_id: r for r in store.results("vote@uab(budget=3,cap=4)")}
    assert len(rows) == len(items) and rows[items[2].id].status == "failed"
    assert rows[items[2].id].error is not None
    assert rows[items[2].id].error.startswith("its first sample, which rates it, failed:")
    rated = [r for i, r in rows.items() if i != items[2].id]
    assert all(r.status == "ok" for r in rated) and sum(r.calls for r in rated) == 3 * (len(items) - 1)
    allocation = store.get_meta("uab:vote@uab(budget=3,cap=4)")
    assert isinstance(allocation, dict) and items[2].id not in allocation
    store.close()
    calls = len(model.calls)
    again = await run_eval(cfg, tmp_path / "run", model=model)  # resumed: nothing is rated or run again
    assert len(model.calls) == calls and len(again.results()) == len(items)
    again.close()


async def test_uab_stops_on_a_model_that_cannot_be_used_and_resumes_once_it_can(tmp_path: Path) -> None:
    """A bad key while UAB rates the items stops the run, as every job's does: recorded, every item's
    first sample stayed failed, and a resume with the key fixed made no call (a review, session 38)."""
    from moot.eval.runner import run_eval
    from moot.eval.store import RunConfig
    from moot.models.base import ModelConfigError
    from test_beat_the_vote import SCIENCE, LogprobModel

    class Refused(LogprobModel):
        async def _complete_once(self, request: ChatRequest, on_token: TokenCallback | None) -> ChatResponse:
            raise ModelConfigError("the API key was refused (401)")

    items = load_dataset(str(SCIENCE))
    cfg = RunConfig(dataset=str(SCIENCE), protocols=["vote@uab(budget=3,cap=4)"], model="m", n=len(items))
    with pytest.raises(ModelConfigError, match="the API key was refused"):
        await run_eval(cfg, tmp_path / "run", model=Refused())
    fixed = LogprobModel()
    store = await run_eval(cfg, tmp_path / "run", model=fixed)
    rows = store.results("vote@uab(budget=3,cap=4)")
    assert len(rows) == len(items) and all(r.status == "ok" for r in rows) and fixed.calls
    store.close()


def test_uab_takes_a_budget_and_a_cap_no_smaller_than_it() -> None:
    from moot.eval.protocols import parse_ref
    from moot.protocols.refs import ProtocolRefError

    assert parse_ref("vote@uab(budget=3)").uab_budget == 3
    for bad in ("vote@uab", "vote@uab(budget=0)", "vote@uab(budget=4,cap=2)", "single@uab(budget=2)"):
        with pytest.raises(ProtocolRefError):
            parse_ref(bad)
