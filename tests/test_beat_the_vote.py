"""The protocols that can beat a vote, the exact request cache, log-probability confidence, and
the decision rules derived from one pool of samples."""

from __future__ import annotations

import asyncio
import json
import math
import sqlite3
import statistics
from pathlib import Path

import pytest

from moot.core.engine import Engine
from moot.core.probes import SELF_CHECK_PROMPT, answer_probability, p_true, self_check_messages, sequence_probability
from moot.core.spec import Probe, SpecError
from moot.eval.datasets import load_jsonl
from moot.eval.items import EvalItem
from moot.eval.loaded import read_store
from moot.eval.pool import _adaptive_consistency, _beta_mode_probability, analyse_pool, calibration_of, uab_allocate
from moot.eval.report import write_report
from moot.eval.runner import run_eval
from moot.eval.store import ItemResult, RunConfig, RunStore
from moot.models.base import (
    BaseChatModel,
    ChatRequest,
    ChatResponse,
    Message,
    TokenCallback,
    TokenLogprob,
    Usage,
    emit_token,
)
from moot.models.cache import CachedModel, MemoryCache, SqliteCache, request_key
from moot.models.scripted import ScriptedModel
from moot.protocols import get_preset

FIXTURES = Path(__file__).parent / "fixtures" / "eval"
SCIENCE = FIXTURES / "colours.jsonl"  # 20 four-option items
ITEMS = load_jsonl(SCIENCE)
GOLD = {item.question: item for item in ITEMS}
ORDER = [item.id for item in ITEMS]


def tokens_of(text: str, prob: float = 0.9) -> list[TokenLogprob]:
    """The reply as 3-character tokens, with a leading token before the content and a trailing
    newline after it, as llama.cpp reports them."""
    pieces = ["```"] + [text[i : i + 3] for i in range(0, len(text), 3)] + ["\n"]
    return [TokenLogprob(token=p, logprob=math.log(prob), top={p: math.log(prob)}) for p in pieces]


class LogprobModel(BaseChatModel):
    """A deterministic model for eval runs: answers an item's question right or wrong by a rule,
    reports log-probabilities, and answers CISC's self-check with P("1") high for right answers."""

    def __init__(self, name: str = "logprob-model", always_right: frozenset[str] = frozenset()) -> None:
        super().__init__(name)
        self.calls: list[ChatRequest] = []
        #: Items every sample answers right (a unanimous first round).
        self.always_right = always_right

    async def _complete_once(self, request: ChatRequest, on_token: TokenCallback | None) -> ChatResponse:
        self.calls.append(request)
        await asyncio.sleep(0)
        last = request.messages[-1]
        if last.role == "assistant":  # the self-check: "Proposed confidence: ("
            right = any(f'"answer": "{i.answer}"' in last.content and i.question in request.messages[-2].content
                        for i in ITEMS)  # fmt: skip
            one, zero = (-0.1, -2.5) if right else (-2.5, -0.1)
            tok = TokenLogprob(token="1" if right else "0", logprob=max(one, zero), top={"1": one, "0": zero})
            return ChatResponse(text=tok.token, usage=Usage(prompt_tokens=50, completion_tokens=1), logprobs=[tok])
        # The question is in the first user message (a debate's later rounds continue the conversation).
        asked = next(m.content for m in request.messages if m.role == "user")
        item = next(i for q, i in GOLD.items() if q in asked)
        revising = "other agents" in last.content
        right = revising or item.id in self.always_right or (ORDER.index(item.id) + (request.seed or 0)) % 3 != 0
        answer = item.answer if right else next(x for x in item.letters if x != item.answer)
        text = json.dumps({"reasoning": "because", "answer": answer, "confidence": 0.8})
        await emit_token(on_token, text)
        lp = tokens_of(text, 0.95 if right else 0.6) if request.logprobs is not None else None
        return ChatResponse(text=text, usage=Usage(prompt_tokens=40, completion_tokens=20), logprobs=lp)


# ----------------------------------------------------------------------------------- the cache


def req(**kw: object) -> ChatRequest:
    base: dict[str, object] = {"messages": [Message(role="user", content="What is 2+2?")], "seed": 1,
                               "temperature": 0.7, "max_tokens": 50}  # fmt: skip
    return ChatRequest.model_validate(base | kw)


def test_no_two_different_requests_share_a_cache_entry() -> None:
    model = ScriptedModel(["x"])
    variants = [
        req(),
        req(messages=[Message(role="user", content="What is 2+3?")]),
        req(messages=[Message(role="system", content="Be brief."), Message(role="user", content="What is 2+2?")]),
        req(seed=2),
        req(temperature=0.8),
        req(temperature=0),
        req(max_tokens=51),
        req(stop=["\n"]),
        req(response_schema={"type": "object"}),
        req(response_schema={"type": "object"}, schema_name="other"),
        req(logprobs=5),
        req(logprobs=6),
    ]
    keys = [request_key(model, r) for r in variants]
    assert None not in keys and len(set(keys)) == len(keys)
    # The same request to another model (or another endpoint of the same name) is another entry.
    other = ScriptedModel(["x"], name="scripted-2")
    assert request_key(other, req()) != request_key(model, req())
    # Policy is not in the key; an unseeded sample is never cached.
    assert request_key(model, req()) == request_key(model, req())
    assert request_key(model, req(seed=None)) is None
    assert request_key(model, req(seed=None, temperature=0)) is not None


async def test_identical_requests_are_made_once_and_keep_their_cost() -> None:
    inner = ScriptedModel(fn=lambda r: "four", latency=0.05)
    model = CachedModel(inner, MemoryCache())
    first, second = await asyncio.gather(model.complete(req()), model.complete(req()))  # in flight together
    third = await model.complete(req())
    assert len(inner.requests) == 1
    assert [first.cache_hit, second.cache_hit, third.cache_hit].count(True) == 2
    assert first.usage == second.usage == third.usage and third.usage.total_tokens > 0
    await model.complete(req(seed=None))  # unseeded: always a call
    await model.complete(req(seed=None))
    assert len(inner.requests) == 3 and (model.hits, model.misses) == (2, 3)


async def test_a_failed_call_is_not_cached_and_waiters_call_themselves() -> None:
    outcomes: list[object] = [RuntimeError("boom"), "ok"]

    async def fn(request: ChatRequest) -> str:
        await asyncio.sleep(0.02)
        out = outcomes.pop(0)
        if isinstance(out, Exception):
            raise out
        return str(out)

    model = CachedModel(ScriptedModel(fn=fn), MemoryCache())
    results = await asyncio.gather(model.complete(req()), model.complete(req()), return_exceptions=True)
    assert isinstance(results[0], RuntimeError) and isinstance(results[1], ChatResponse)
    assert results[1].text == "ok" and not results[1].cache_hit
    assert (await model.complete(req())).cache_hit


def test_sqlite_cache_survives_a_reopen(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "c.sqlite")
    SqliteCache(conn).put("k", "m", ChatResponse(text="hi", usage=Usage(prompt_tokens=3, completion_tokens=1)))
    conn.close()
    cache = SqliteCache(sqlite3.connect(tmp_path / "c.sqlite"))
    got = cache.get("k")
    assert got is not None and got.text == "hi" and got.usage.total_tokens == 4 and len(cache) == 1
    assert cache.get("other") is None


# ---------------------------------------------------------------------------------- the probes


def test_answer_probability_reads_the_answer_tokens_of_the_reply() -> None:
    raw = '{"reasoning": "the \\"answer\\": is B", "answer": "C", "confidence": 0.9}'
    toks = [TokenLogprob(token=t, logprob=lp) for t, lp in
            [("```", -9.0), (raw[:48], -0.1), ('"', -0.2), ("C", math.log(0.7)), ('"', -0.01), (raw[51:], -0.3),
             ("\n", -1.0)]]  # fmt: skip
    assert "".join(t.token for t in toks[1:-1]) == raw
    assert answer_probability(raw, toks) == pytest.approx(0.7)
    number = '{"reasoning": "x", "answer": 42.5, "confidence": 1}'
    assert answer_probability(number, tokens_of(number, 0.5)) is not None
    assert answer_probability(raw, [TokenLogprob(token="other", logprob=0.0)]) is None  # tokens don't spell it
    assert answer_probability('{"reasoning": "x"}', tokens_of('{"reasoning": "x"}')) is None
    assert sequence_probability(tokens_of(raw, 0.8)) == pytest.approx(0.8)
    assert sequence_probability(None) is None


def test_the_self_check_continues_the_reply_cut_after_its_answer() -> None:
    raw = '{"reasoning": "r", "answer": "B", "confidence": 1}'
    msgs = self_check_messages([Message(role="user", content="q")], raw)
    assert msgs is not None and msgs[-1].role == "assistant"
    assert msgs[-1].content == '{"reasoning": "r", "answer": "B"' + SELF_CHECK_PROMPT
    assert self_check_messages([], "no answer here") is None
    one = TokenLogprob(token="1", logprob=-0.2, top={"1": -0.2, "0": -1.8, "2": -3.0})
    assert p_true([one]) == pytest.approx(1 / (1 + math.exp(-1.6)))
    only_zero = TokenLogprob(token="0", logprob=-0.1, top={"0": -0.1, "Please": -4.0})
    assert p_true([only_zero]) == pytest.approx(1 / (1 + math.exp(3.9)))  # "1" at the least likely listed
    assert p_true([TokenLogprob(token="x", logprob=-0.1, top={"x": -0.1})]) is None
    assert p_true(None) is None


# ------------------------------------------------------------------------------ the protocols


def item_task(item: EvalItem) -> object:
    from moot.eval.items import to_task

    return to_task(item)


async def test_cisc_weights_each_sample_by_its_self_checked_p_true() -> None:
    item = ITEMS[0]  # agent seeds 1..3: the rule makes seed 3 wrong on item 0
    from moot.eval.protocols import fit_to_item

    spec = fit_to_item(get_preset("cisc", k=3, softmax_t=0.5), item, max_tokens=100, timeout_s=None)
    model = LogprobModel()
    result = await Engine(spec, model).run(item_task(item))  # type: ignore[arg-type]
    assert result.llm_calls == 6 and len(model.calls) == 6
    # what the catalogue (moot protocols, /v1/models) says it makes: a sample and its self-check each
    assert spec.planned_calls() == 6 and get_preset("cisc").planned_calls() == 16
    # the vote weighs by P(True): a budget with room for the samples only would skip every check and
    # fail at the decision, blaming the backend; it is refused up front (a round needs 6 calls)
    from moot.core.budget import apply_budget

    assert spec.planned_turns() == 3 and spec.round_calls() == 6
    problem = apply_budget(spec, max_calls=3).call_budget_problem()
    assert problem is not None and "cannot fit one round (6 calls)" in problem
    assert apply_budget(spec, max_calls=6).call_budget_problem() is None
    turns = result.rounds[0].turns
    assert all({"p_true", "answer_prob", "seq_prob"} <= t.signals.keys() for t in turns)
    assert all(t.probe_usage is not None and t.probe_usage.total_tokens == 51 for t in turns)
    right = [t for t in turns if t.parsed and t.parsed["answer"] == item.answer]
    wrong = [t for t in turns if t not in right]
    assert right and wrong and all(r.signals["p_true"] > w.signals["p_true"] for r in right for w in wrong)
    ballots = {b["speaker"]: b["weight"] for b in result.decision["ballots"]}  # type: ignore[index]
    assert max(ballots.values()) == 1.0 and min(ballots.values()) < 1.0
    assert result.final_answer == item.answer


async def test_a_vote_weighed_or_filtered_by_p_true_runs_the_self_checks() -> None:
    """weighted-vote and filtered-vote with signal=p_true asked no self-check, so no turn carried
    P(True) and the vote failed, blaming a backend that returns log-probabilities."""
    from moot.eval.protocols import fit_to_item

    item = ITEMS[0]
    for preset in (
        get_preset("weighted-vote", k=2, signal="p_true"),
        get_preset("filtered-vote", k=2, signal="p_true"),
    ):
        spec = fit_to_item(preset, item, max_tokens=100, timeout_s=None)
        result = await Engine(spec, LogprobModel()).run(item_task(item))  # type: ignore[arg-type]
        assert spec.planned_calls() == 4 and result.llm_calls == 4, result.error
        assert result.status == "complete" and all("p_true" in t.signals for t in result.rounds[0].turns)


async def test_a_turn_without_the_signal_does_not_vote() -> None:
    spec = get_preset("cisc", k=2)
    replies = [{"reasoning": "r", "answer": "A", "confidence": 1}, {"reasoning": "r", "answer": "B", "confidence": 1}]
    # A model known to return no log-probabilities is refused before any call.
    with pytest.raises(SpecError, match="log-probabilities"):
        Engine(spec, ScriptedModel([*replies, "1", "1"]))

    class Unknown(ScriptedModel):
        returns_logprobs = None  # an OpenAI-compatible server: not known before a call

    # One that turns out to return none: no p_true, so nobody can vote, and the error says why.
    result = await Engine(spec, Unknown([*replies, "1", "1"])).run("q")
    assert result.final_answer is None and result.status == "failed"
    assert result.decision is not None and result.decision["abstained"] == 2
    assert result.error is not None and "'p_true'" in result.error and "log-probabilities" in result.error


async def test_adaptive_debate_stops_after_a_unanimous_first_round() -> None:
    spec = get_preset("adaptive-debate", agents=3)
    same = {"reasoning": "r", "answer": "A", "confidence": 1}
    result = await Engine(spec, ScriptedModel([same] * 3)).run("q")
    assert result.llm_calls == 3 and result.stop_reason == "consensus" and result.final_answer == "A"
    split = [same, same, {"reasoning": "r", "answer": "B", "confidence": 1}]
    result = await Engine(spec, ScriptedModel([*split, same, same, same])).run("q")
    assert result.llm_calls == 6 and len(result.rounds) == 2


async def test_mad_conformist_asks_only_the_minority_to_reconsider() -> None:
    spec = get_preset("mad-conformist", agents=3, rounds=2)
    a = {"reasoning": "r", "answer": "A", "confidence": 1}
    b = {"reasoning": "r", "answer": "B", "confidence": 1}
    model = ScriptedModel([a, a, b, a])
    result = await Engine(spec, model).run("q")
    second = result.rounds[1].turns
    assert result.llm_calls == 4 and len(model.requests) == 4
    assert [t.carried for t in second] == [True, True, False]
    assert [t.calls for t in second] == [0, 0, 1] and all(t.usage.total_tokens == 0 for t in second[:2])
    assert result.final_answer == "A"
    # No strict majority: everyone reconsiders.
    c = {"reasoning": "r", "answer": "C", "confidence": 1}
    result = await Engine(spec, ScriptedModel([a, b, c, a, a, a])).run("q")
    assert result.llm_calls == 6 and not any(t.carried for t in result.rounds[1].turns)


async def test_free_mad_scores_the_whole_trajectory() -> None:
    spec = get_preset("free-mad", agents=3, rounds=2)
    a = {"reasoning": "r", "answer": "A", "confidence": 1}
    b = {"reasoning": "r", "answer": "B", "confidence": 1}
    # Free-MAD's weights (20 first, 20 kept, 30 switched to, -25 abandoned) and decay 1/(k+1).
    # Round 1: A, A, A. Round 2: two switch to B. Last-round majority: B; trajectory: A
    # (A: 3 x 20 + 20/2 - 2 x 25/2 = 45; B: 2 x 30/2 = 30).
    result = await Engine(spec, ScriptedModel([a, a, a, a, b, b])).run("q")
    assert "you may not rely on conformity" in result.rounds[1].turns[0].messages[-1].content.lower()
    assert result.decision is not None and result.decision["final_majority"] == "B"
    assert result.decision["scores"] == {"A": 45.0, "B": 30.0}
    assert result.final_answer == "A"


def test_heterogeneous_presets_put_each_agent_on_its_model() -> None:
    spec = get_preset("society-of-minds", agents=3, models="scripted:a.yaml+openai:x")
    assert [p.model for p in spec.participants] == ["scripted:a.yaml", "openai:x", "scripted:a.yaml"]
    vote = get_preset("vote", k=2, models=["m1", "m2"])
    assert [p.model for p in vote.participants] == ["m1", "m2"]


# --------------------------------------------------------------------------- the eval and pool


def config(protocols: str, **kw: object) -> RunConfig:
    return RunConfig(dataset=str(SCIENCE), protocols=protocols.split(","), model="logprob", **kw)  # type: ignore[arg-type]


async def test_a_run_shares_identical_requests_across_protocols_and_reports_full_cost(tmp_path: Path) -> None:
    model = LogprobModel()
    cfg = config("single,cisc(k=4),society-of-minds,adaptive-debate,mad-conformist,vote@auto", n=6)
    store = await run_eval(cfg, tmp_path / "run", model=model, concurrency=2)
    res = {p: {r.item_id: r for r in store.results(p)} for p in cfg.protocols}
    assert all(len(v) == 6 and all(r.status == "ok" for r in v.values()) for v in res.values())
    # A Society of Minds debate's first round is the CISC pool's first three samples: whichever of the
    # two protocols asked first paid for them, the other was served by the cache (both report them).
    for item in res["single"]:
        som, pool = res["society-of-minds"][item], res["cisc(k=4)"][item]
        assert som.calls == 6 and pool.calls == 8
        assert som.cached_calls + pool.cached_calls == 3
    # The equal-budget vote (k=6) pays nothing new for its first four samples, and reports 6 calls.
    assert all(r.calls == 6 and r.cached_calls >= 4 for r in res["vote@auto"].values())
    # Adaptive debate and MAD-Conformist ask nothing Society of Minds did not.
    saved_by_som = {i: r.calls - r.cached_calls for i, r in res["society-of-minds"].items()}
    assert all(saved_by_som[i] <= 3 for i in saved_by_som)
    made = len(model.calls)
    reported = sum(r.calls for v in res.values() for r in v.values())
    saved = sum(r.cached_calls for v in res.values() for r in v.values())
    assert made == reported - saved
    assert len(store.cache) == made
    store.close()
    # Growing --n runs only the new items, on the same first ones.
    before = len(model.calls)
    again = await run_eval(config(",".join(cfg.protocols), n=9), tmp_path / "run", model=model)
    assert {len(again.results(p)) for p in cfg.protocols} == {9}
    assert [i.id for i in again.items()][:6] == [i.id for i in RunStore.open(tmp_path / "run").items()][:6]
    assert len(model.calls) - before == pytest.approx(3 * made / 6, abs=3 * 8)
    again.close()
    # Asking for more items than the dataset has is refused, and leaves the run as it was.
    from moot.eval.datasets import DatasetError

    with pytest.raises(DatasetError):
        await run_eval(config(",".join(cfg.protocols), n=99), tmp_path / "run", model=model)
    assert RunStore.open(tmp_path / "run").config.n == 9


async def test_the_pool_analysis_derives_every_rule_from_the_same_samples(tmp_path: Path) -> None:
    store = await run_eval(config("single,cisc(k=5)", n=12), tmp_path / "run", model=LogprobModel())
    pool = analyse_pool(read_store(store))
    assert pool is not None and pool.pool == "cisc(k=5)" and pool.k == 5 and pool.items == 12
    disc = {d.signal: d for d in pool.discrimination}
    # The test model is more confident exactly when it is right: every signal discriminates.
    assert disc["p_true"].wqd == 1.0 and disc["answer_prob"].wqd == 1.0 and disc["stated"].wqd == 0.5
    assert pool.ceiling.items == 12 and pool.ceiling.no_right_answer == 0
    curve = {(c.rule, c.k): c for c in pool.curves}
    assert curve[("weighted:p_true", 5)].accuracy >= curve[("vote", 5)].accuracy
    assert curve[("weighted:p_true", 2)].diff_vs_vote is not None and curve[("weighted:p_true", 2)].diff_vs_vote > 0
    assert curve[("weighted:p_true", 3)].mean_calls == 6 and curve[("vote", 3)].mean_calls == 3
    assert curve[("weighted:p_true", 3)].mean_tokens > curve[("vote", 3)].mean_tokens
    assert {f.signal for f in pool.fitted} >= {"p_true", "answer_prob"}
    # UAB moves the same total samples between items: one per item first, then to the uncertain ones.
    assert [a.budget for a in pool.allocation] == [2, 3, 4]
    for a in pool.allocation:
        assert 0 <= a.accuracy <= 1 and a.ci_low <= a.diff_vs_vote <= a.ci_high and a.max_samples <= 5
    report, _written = write_report(tmp_path / "run")
    text = (tmp_path / "run" / "report.md").read_text()
    assert "the pilot" in text and "Pareto front" in text and report.pareto
    assert "(UAB)" in text
    # The report says whether anything reached the goal, from every paired comparison it has.
    assert "The goal: at least 2 points over the equal-budget baseline" in text and "Pareto-best" in text
    from moot.eval.report import _goal

    lines = "\n".join(_goal(report))
    weighted = {(c.rule, c.k): c for c in report.pool.curves if c.k == 5} if report.pool else {}
    p_true = weighted[("weighted:p_true", 5)]
    assert p_true.ci_low is not None
    if p_true.diff_vs_vote is not None and p_true.diff_vs_vote >= 0.02 and p_true.ci_low > 0:
        assert "**weighted:p_true@5 against vote@5**" in lines and "(beats it)" in lines
    else:
        assert "**weighted:p_true@5 against vote@5**" not in lines
    store.close()


def test_adaptive_consistency_stops_when_the_mode_is_settled() -> None:
    assert _beta_mode_probability(0, 0) == 0.5
    assert _beta_mode_probability(3, 0) == pytest.approx(15 / 16)
    assert _beta_mode_probability(4, 0) == pytest.approx(31 / 32)
    from moot.eval.pool import Sample

    same = [Sample(answer="A", correct=True)] * 8
    assert _adaptive_consistency(same, 0.95) == (4, ["A"])  # P = 31/32 after 4 agreeing samples
    assert _adaptive_consistency(same, 0.9) == (3, ["A"])  # 15/16
    mixed = [Sample(answer=a, correct=a == "A") for a in "ABABABAB"]
    # The pool ran out on a tie: both leaders, the first given first (the tie rule's pick).
    assert _adaptive_consistency(mixed, 0.95) == (8, ["A", "B"])


def test_uab_gives_the_budget_to_the_items_a_first_sample_leaves_uncertain() -> None:
    # p(1-p)^n: a sure item (p = 0.99) and a hopeless one (p = 0.01) get nothing past their first
    # sample while an uncertain one (p = 0.5) can still gain; the total is exactly the budget.
    alloc, capped = uab_allocate([0.99, 0.5, 0.01, 0.5], budget=8, cap=8)
    assert sum(alloc) == 8 and alloc[0] == 1 and alloc[2] == 1 and alloc[1] + alloc[3] == 6 and capped == 0
    # p(1-p)^n falls faster for a likely item: after a few samples the harder one (p = 0.2) is preferred.
    alloc, _ = uab_allocate([0.8, 0.2], budget=6, cap=8)
    assert alloc[1] > alloc[0]
    # An item at its pool's size is passed over and the budget goes elsewhere.
    alloc, capped = uab_allocate([0.5, 0.999], budget=6, cap=3)
    assert alloc == [3, 3] and capped == 1
    # A budget no larger than the items gives one sample each.
    assert uab_allocate([0.3, 0.6, 0.9], budget=3, cap=8) == ([1, 1, 1], 0)


def test_calibration_of_a_perfect_and_an_overconfident_signal() -> None:
    perfect = calibration_of("x", [(1.0, True), (0.0, False)])
    assert perfect.ece == 0 and perfect.brier == 0
    over = calibration_of("x", [(0.9, True), (0.9, False)])
    assert over.ece == pytest.approx(0.4) and over.brier == pytest.approx((0.01 + 0.81) / 2)


@pytest.mark.parametrize("right", [True, False])
async def test_the_report_draws_accuracy_of_zero_and_one(tmp_path: Path, right: bool) -> None:
    def always(request: ChatRequest) -> dict[str, object]:
        item = next(i for q, i in GOLD.items() if q in request.messages[1].content)
        wrong = next(x for x in item.letters if x != item.answer)
        return {"reasoning": "r", "answer": item.answer if right else wrong, "confidence": 1}

    cfg = RunConfig(dataset=str(SCIENCE), protocols=["single", "society-of-minds"], model="scripted", n=4)
    store = await run_eval(cfg, tmp_path / "run", model=ScriptedModel(fn=always))
    store.close()
    report, written = write_report(tmp_path / "run")
    assert {s.accuracy for s in report.protocols} == {1.0 if right else 0.0}
    som = next(s for s in report.protocols if s.label == "society-of-minds")
    assert som.unanimous_wrong_first == (0 if right else 4)
    assert any(p.name.endswith("pareto.png") for p in written)


def test_probe_defaults_are_left_out_of_the_fingerprinted_spec() -> None:
    spec = get_preset("single")
    dumped = spec.model_dump(mode="json", exclude_defaults=True)
    assert "probe" not in dumped and "reconsider" not in dumped
    assert get_preset("cisc").probe == Probe(self_check=True)


def test_the_self_check_prompt_is_the_authors_binary_prompt_and_in_the_run_fingerprint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CISC's text, character for character (google-research cisc, ConfidenceExtractionType.BINARY);
    it is not a spec field, so the run's fingerprint carries it: a run started with another text
    cannot resume and mix the two."""
    import moot.eval.runner as runner_mod
    from moot.eval.datasets import load_dataset, select_items
    from moot.eval.protocols import parse_protocols

    assert (
        SELF_CHECK_PROMPT
        == "\nNow I will rate my confidence in the proposed answer as either 0 or 1.\nProposed confidence: ("
    )
    cfg = config("single,cisc(k=4)")
    refs = parse_protocols(cfg.protocols)
    items = select_items(load_dataset(cfg.dataset), 3, 0)
    before = runner_mod.prompts_fingerprints(refs, items, cfg)
    monkeypatch.setattr(runner_mod, "SELF_CHECK_PROMPT", SELF_CHECK_PROMPT.replace(".\n", ". "))
    after = runner_mod.prompts_fingerprints(refs, items, cfg)
    assert after["single"] == before["single"] and after["cisc(k=4)"] != before["cisc(k=4)"]


def test_a_store_can_grow_but_not_change(tmp_path: Path) -> None:
    from moot.eval.store import RunConfigMismatch

    RunStore.open(tmp_path, config("single", n=3)).close()
    grown = RunStore.open(tmp_path, config("single", n=5))
    assert grown.growing is not None and grown.config.n == 3  # not stored until the items are
    grown.extend([])
    assert grown.config.n == 5
    grown.close()
    every = RunStore.open(tmp_path, config("single"))
    assert every.growing is not None  # every item is more
    every.close()
    held = RunStore.open(tmp_path, config("single", n=5))
    held.save_result(ItemResult(protocol="single", item_id="c1", status="ok"), None)
    held.close()
    with pytest.raises(RunConfigMismatch):  # a run with a result cannot shrink or change
        RunStore.open(tmp_path, config("single", n=4))
    with pytest.raises(RunConfigMismatch):
        RunStore.open(tmp_path, config("single", seed=3))


async def test_direct_answers_in_one_short_typed_call() -> None:
    from moot.eval.protocols import fit_to_item

    item = ITEMS[0]
    spec = fit_to_item(get_preset("direct"), item, max_tokens=None, timeout_s=None)
    schema = spec.turn.schema_name
    assert schema is not None and schema.startswith("eval-direct-")
    model = ScriptedModel([{"answer": item.answer}])
    result = await Engine(spec, model).run(item_task(item))  # type: ignore[arg-type]
    assert result.final_answer == item.answer and result.llm_calls == 1
    sent = model.requests[0]
    assert sent.max_tokens == 20 and sent.response_schema is not None
    assert set(sent.response_schema["properties"]) == {"answer"}


def test_the_run_cache_keys_on_the_inner_models_identity() -> None:
    from moot.models.cache import CachedModel, MemoryCache
    from moot.scale import WatchedModel

    inner = LogprobModel()
    # Every wrapper (the run's watch, the cache) keys on the model behind it.
    for wrapped in (
        WatchedModel(inner),
        CachedModel(inner, MemoryCache()),
        WatchedModel(CachedModel(inner, MemoryCache())),
    ):
        assert wrapped.identity() == inner.identity() and wrapped.name == inner.name
        assert request_key(wrapped, req()) == request_key(inner, req())


async def test_every_debate_is_re_decided_by_other_rules_from_its_own_transcripts(tmp_path: Path) -> None:
    model = LogprobModel()
    cfg = config("single,vote@auto,society-of-minds,free-mad", n=6)
    store = await run_eval(cfg, tmp_path / "run", model=model, concurrency=2)
    calls = len(model.calls)
    store.close()
    report, _ = write_report(tmp_path / "run")
    assert len(model.calls) == calls  # derived at no new call
    by = {(v.protocol, v.variant): v for v in report.variants}
    assert {p for p, _ in by} == {"society-of-minds", "free-mad"}
    # A variant that is the protocol's own rule reproduces its decision on every item.
    for own in (by[("society-of-minds", "last-round vote")], by[("free-mad", "trajectory")]):
        assert own.diff_vs_protocol == 0 and own.decided == own.items == 6
    som = by[("society-of-minds", "answer probability")]
    assert som.baseline is not None and som.baseline.startswith("vote@auto") and som.diff_vs_baseline is not None
    text = (tmp_path / "run" / "report.md").read_text()
    assert "Decision variants of each debate (no new calls)" in text
    # Identical points are listed once on the Pareto front (the protocol before its variants).
    names = [p.name for p in report.pareto]
    assert len({(p.accuracy, p.mean_tokens) for p in report.pareto}) == len(names)


async def test_a_pool_of_one_item_is_analysed_without_fitting_on_nothing(tmp_path: Path) -> None:
    store = await run_eval(config("single,vote@3", n=1), tmp_path / "run", model=LogprobModel())
    pool = analyse_pool(read_store(store))
    assert pool is not None and pool.items == 1
    # One item: no held-out items to fit a temperature on, so every weighted rule is the plain vote.
    assert all(f.per_fold == [math.inf] for f in pool.fitted)
    store.close()
    report, _ = write_report(tmp_path / "run")
    # report.json keeps the infinite temperature (JSON has none: not null, which would read as "no fit").
    written = json.loads((tmp_path / "run" / "report.json").read_text())
    assert all(f["per_fold"] == ["Infinity"] for f in written["pool"]["fitted"])
    back = type(report).model_validate_json((tmp_path / "run" / "report.json").read_text())
    assert back.pool is not None and report.pool is not None and back.pool.fitted == report.pool.fitted


def test_cache_entries_are_tagged_with_their_item_and_old_tables_gain_the_column(tmp_path: Path) -> None:
    import sqlite3

    from moot.models.base import ChatResponse
    from moot.models.cache import CURRENT_ITEM, CacheEntry, SqliteCache

    conn = sqlite3.connect(tmp_path / "old.sqlite")
    conn.execute(
        "CREATE TABLE request_cache (key TEXT PRIMARY KEY, model TEXT NOT NULL, response TEXT NOT NULL, "
        "created TEXT NOT NULL)"
    )
    conn.execute("INSERT INTO request_cache VALUES ('old', 'm', '{\"text\": \"x\"}', 'then')")
    cache = SqliteCache(conn)
    token = CURRENT_ITEM.set("q1")
    try:
        cache.put("k1", "m", ChatResponse(text="a"))
    finally:
        CURRENT_ITEM.reset(token)
    cache.put_raw(CacheEntry(key="k2", model="m", response=ChatResponse(text="b").model_dump_json()), "q2")
    assert set(cache.for_item("q1")) == {"k1"} and set(cache.for_item("q2")) == {"k2"}
    assert cache.get("old") is not None and len(cache) == 3  # an untagged old entry still answers by key


async def test_the_pareto_front_compares_everything_on_the_items_every_protocol_finished(tmp_path: Path) -> None:
    store = await run_eval(config("single,vote@3", n=6), tmp_path / "run", model=LogprobModel())
    # vote@3 has finished only 4 of the 6 items (a run still going): single is ranked on those 4 too.
    with store.conn:
        store.conn.execute("DELETE FROM results WHERE protocol = 'vote@3' AND item_id IN (SELECT item_id FROM "
                           "results WHERE protocol = 'vote@3' ORDER BY item_id LIMIT 2)")  # fmt: skip
    kept = {r.item_id for r in store.results("vote@3")}
    single_on_kept = statistics.fmean(float(r.correct) for r in store.results("single") if r.item_id in kept)
    store.close()
    report, _ = write_report(tmp_path / "run")
    assert report.pareto_items == 4
    by = {p.name: p for p in report.pareto}
    assert "single" not in by or by["single"].accuracy == pytest.approx(single_on_kept)
    assert "(on the 4 items every protocol finished)" in (tmp_path / "run" / "report.md").read_text()


async def test_a_debate_that_stopped_after_round_one_is_still_decided_by_every_variant(tmp_path: Path) -> None:
    model = LogprobModel(always_right=frozenset(ORDER[::2]))
    store = await run_eval(config("single,vote@3,adaptive-debate", n=6), tmp_path / "run", model=model)
    rounds = [len(r.rounds) for r in store.transcripts("adaptive-debate").values()]
    store.close()
    assert 1 in rounds and 2 in rounds  # some items stopped after a unanimous round 1, others debated
    report, _ = write_report(tmp_path / "run")
    variants = [v for v in report.variants if v.protocol == "adaptive-debate"]
    # the items that stopped early are decided by every variant too (by their one round)
    assert variants and all(v.decided == v.items == 6 for v in variants if v.variant != "stated confidence")


async def test_every_fair_baseline_is_paired_and_the_adaptive_vote_is_on_the_pareto_front(tmp_path: Path) -> None:
    cfg = config("single,cisc(k=5),adaptive-debate,vote@8", n=12)
    model = LogprobModel(always_right=frozenset(ORDER[::2]))
    (await run_eval(cfg, tmp_path / "run", model=model, concurrency=2)).close()
    from moot.eval.report import summarise

    report = summarise(RunStore.open(tmp_path / "run"))
    debate = next(s for s in report.protocols if s.label == "adaptive-debate")
    kinds = {c.kind: c for c in debate.other_comparisons}
    # the adaptive vote (more samples instead of debating) at no more samples than the debate's calls
    adaptive = kinds["adaptive vote"]
    assert adaptive.baseline.startswith("adaptive-consistency(") and adaptive.paired == 12
    assert report.pool is not None
    chosen = next(
        a for a in report.pool.adaptive if adaptive.baseline.startswith(f"adaptive-consistency({a.threshold:g})")
    )
    assert chosen.mean_samples <= debate.mean_calls * 1.1
    # the dearer vote the debate could match for at most 0.7x its tokens
    dearer = kinds["dearer vote"]
    assert dearer.baseline == "vote@8" and dearer.baseline_tokens is not None
    assert debate.mean_tokens <= 0.7 * dearer.baseline_tokens
    assert "per_item" not in report.model_dump(mode="json")["pool"]["adaptive"][0]
    assert any(p.name.startswith("adaptive-consistency(") for p in report.pareto)


async def test_the_baseline_is_the_vote_at_the_debates_calls_however_accurate_a_cheaper_one_is(
    tmp_path: Path,
) -> None:
    cfg = config("single,direct,adaptive-debate,vote@auto", n=8)
    (await run_eval(cfg, tmp_path / "run", model=LogprobModel(always_right=frozenset(ORDER[::2])))).close()
    from moot.eval.report import summarise

    def comparisons_of_the_debate() -> list[tuple[str, str]]:
        report = summarise(RunStore.open(tmp_path / "run"))
        vote = next(s for s in report.protocols if s.label == "vote@auto")
        assert vote.matched_to == "adaptive-debate"
        debate = next(s for s in report.protocols if s.label == "adaptive-debate")
        assert debate.comparison is not None
        return [(c.baseline, c.kind) for c in [debate.comparison, *debate.other_comparisons]]

    # Baselines are fixed by the budget before any accuracy is looked at: a direct answer that is
    # always right is never picked for being the most accurate.
    with sqlite3.connect(tmp_path / "run" / "run.sqlite") as conn:
        conn.execute("UPDATE results SET json = json_set(json, '$.correct', json('true')) WHERE protocol = 'direct'")
    pairs = comparisons_of_the_debate()
    assert pairs[0] == ("vote@auto", "equal-calls vote") and "direct" not in [b for b, _ in pairs]
    with sqlite3.connect(tmp_path / "run" / "run.sqlite") as conn:
        conn.execute("UPDATE results SET json = json_set(json, '$.correct', json('false')) WHERE protocol = 'direct'")
    assert comparisons_of_the_debate() == pairs
    assert [b for b, _ in pairs].count("vote@auto") == 1


async def test_a_fixed_vote_that_ties_the_matched_vote_is_not_paired_twice(tmp_path: Path) -> None:
    # society-of-minds makes 6 calls: vote@auto is k = 6, the same samples as vote@6, listed first.
    cfg = config("single,vote@6,society-of-minds,vote@auto", n=6)
    (await run_eval(cfg, tmp_path / "run", model=LogprobModel(always_right=frozenset(ORDER[::2])))).close()
    from moot.eval.report import summarise

    report = summarise(RunStore.open(tmp_path / "run"))
    by = {s.label: s for s in report.protocols}
    assert by["vote@auto"].k == 6 and by["vote@auto"].accuracy == by["vote@6"].accuracy
    debate = by["society-of-minds"]
    assert debate.comparison is not None and debate.comparison.baseline == "vote@auto"
    assert all(c.kind != "equal-calls vote" for c in debate.other_comparisons)


def test_two_labels_for_the_same_dearer_vote_are_paired_once() -> None:
    from moot.eval.report import ProtocolSummary, _fair_comparisons

    right = {"q1": 1.0, "q2": 0.0, "q3": 1.0}

    def summary(label: str, k: int | None, tokens: float) -> ProtocolSummary:
        return ProtocolSummary(label=label, baseline=label != "mad-conformist", k=k, finished=3,
                               mean_prompt_tokens=tokens, mean_calls=k or 3.8)  # fmt: skip

    summaries = [
        summary("mad-conformist", None, 600.0),
        summary("vote@6", 6, 1000.0),
        summary("vote@auto", 6, 1000.0),  # k = 6: the same samples as vote@6
        summary("vote@8", 8, 1300.0),  # the same outcomes, but another vote
    ]
    # vote@auto has finished one item fewer (a run still going): still the same vote as vote@6.
    expected = {"mad-conformist": right, "vote@6": right, "vote@auto": {"q1": 1.0, "q2": 0.0}, "vote@8": right}
    fair = _fair_comparisons(summaries[0], summaries, expected, None, None)
    assert [c.baseline for c in fair.others if c.kind == "dearer vote"] == ["vote@6", "vote@8"]
    assert fair.primary is None and fair.missing  # no vote at its 4 calls, and the run says so


def test_a_vote_is_paired_once_whatever_kinds_of_baseline_it_could_be() -> None:
    from moot.eval.report import ProtocolSummary, _fair_comparisons

    right = {"q1": 1.0, "q2": 0.0, "q3": 1.0}

    def summary(label: str, k: int | None, tokens: float, matched_to: str | None = None) -> ProtocolSummary:
        return ProtocolSummary(label=label, baseline=label != "mad-conformist", k=k, finished=3,
                               mean_prompt_tokens=tokens, mean_calls=k or 6.0, matched_to=matched_to)  # fmt: skip

    debate = summary("mad-conformist", None, 600.0)
    summaries = [
        debate,
        summary("vote@6", 6, 1000.0),
        summary("vote@auto", 6, 1000.0, "mad-conformist"),
        summary("direct", None, 90.0),
        summary("vote", None, 1000.0),
        summary("vote(models=a+b)", None, 1000.0),
    ]
    expected = {s.label: right for s in summaries}
    fair = _fair_comparisons(debate, summaries, expected, None, None)
    # vote@auto is the vote at the debate's 6 calls; vote@6, the same vote, is not paired again as a
    # dearer one; the direct answer is no baseline of a debate at 6 calls.
    assert fair.primary is not None and (fair.primary.baseline, fair.primary.kind) == ("vote@auto", "equal-calls vote")
    assert [(c.baseline, c.kind) for c in fair.others] == [("vote", "dearer vote"), ("vote(models=a+b)", "dearer vote")]


def test_the_goal_counts_a_match_of_a_dearer_vote_at_a_fraction_of_its_tokens() -> None:
    from moot.eval.report import Comparison, EvalReport, ProtocolSummary, _goal

    match = Comparison(baseline="vote@8", paired=400, diff=0.0, ci_low=-0.015, ci_high=0.015, p_value=1.0,
                       only_debate_right=10, only_baseline_right=10, kind="dearer vote", baseline_tokens=1000.0,
                       items_needed=None)  # fmt: skip
    debate = ProtocolSummary(label="adaptive-debate", baseline=False, finished=400, mean_prompt_tokens=500.0,
                             other_comparisons=[match])  # fmt: skip
    report = EvalReport(config=config("adaptive-debate,vote@8"), items=400, generated_at="now", protocols=[debate])
    lines = "\n".join(_goal(report))
    assert "adaptive-debate against vote@8 (dearer vote)" in lines and "0.50x its tokens" in lines
    assert "nothing reaches it" not in lines


def test_the_items_a_paired_test_needs() -> None:
    from moot.stats import paired_items_needed

    assert paired_items_needed(0.2, 0.02) == 3923  # Connor (1987) at 80% power, two-sided 5%
    assert paired_items_needed(0.1, 0.05) == 312
    assert paired_items_needed(0.01, 0.02) is None  # no gain of 2 points fits in 1% discordance
    assert paired_items_needed(0.2, 0.0) is None


async def test_a_heterogeneous_panel_shares_the_run_cache_and_watch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Agents on a model of their own go through the run's request cache too: the heterogeneous
    vote's first samples are the heterogeneous society's first round, and an agent on the run's
    own model shares the homogeneous protocols' replies. No request is made twice."""
    from moot.testing.fake_openai import FakeOpenAIServer, schema_reply

    colours = Path(__file__).parent / "fixtures" / "eval" / "colours.jsonl"
    with FakeOpenAIServer(reply=schema_reply) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-fake")
        het = "models=openai:fake+openai:fake2"
        cfg = RunConfig(dataset=str(colours), protocols=[f"society-of-minds({het})", f"vote@6({het})", "vote@6"],
                        model="openai:fake", n=2)  # fmt: skip
        store = await run_eval(cfg, tmp_path / "run", concurrency=1)
        try:
            vote = store.results(f"vote@6({het})")
            assert len(vote) == 2 and all(r.status == "ok" and r.cached_calls >= 3 for r in vote)
            # the plain vote's samples on the run's model include the panel's samples on that model
            assert all(r.cached_calls >= 1 for r in store.results("vote@6"))
            assert len(server.requests) == len(store.cache)  # every request made once, and kept
        finally:
            store.close()


async def test_layers_around_another_model_share_their_state() -> None:
    from moot.models.base import ModelConfigError, WrappedModel
    from moot.scale.jobs import WatchedModel

    watch = WatchedModel(ScriptedModel(fn=lambda r: "a"))
    cached = CachedModel(watch, MemoryCache())
    other = cached.around(ScriptedModel([ModelConfigError("no key for the second model")], name="second"))
    assert isinstance(other, CachedModel) and other.cache is cached.cache
    assert isinstance(other.inner, WatchedModel) and isinstance(other, WrappedModel)
    with pytest.raises(ModelConfigError):
        await other.complete(ChatRequest(messages=[Message(role="user", content="q")], seed=1))
    assert watch.config_error is not None  # the run's own watch saw the second model's bad key


def test_a_token_matched_vote_at_the_debates_calls_is_named_where_none_is_at_its_calls() -> None:
    """A vote@auto(by=tokens) that resolved to the debate's 5 calls, with no vote@5 in the run: the
    report said "the run has no vote@5", as if no vote had 5 samples; it names the one that does,
    and why it is not the equal-calls vote."""
    from moot.eval.report import ProtocolSummary, _fair_comparisons

    right = {"q1": 1.0, "q2": 0.0, "q3": 1.0}
    token_vote = "vote@auto(by=tokens,ref=mad-conformist)"
    debate = ProtocolSummary(label="mad-conformist", baseline=False, finished=3, mean_calls=5.0, mean_prompt_tokens=900)
    matched = ProtocolSummary(label=token_vote, baseline=True, k=5, finished=3, mean_calls=5.0, mean_prompt_tokens=900,
                              matched_to="mad-conformist")  # fmt: skip
    fair = _fair_comparisons(debate, [debate, matched], {"mad-conformist": right, token_vote: right}, None, None)
    assert fair.primary is None
    assert fair.missing == [
        f"no vote at its 5 calls: the run has no vote@5 and no pool that large ({token_vote} has 5 samples too, "
        "and is paired as the vote at its own budget: add vote@5 to pair one at these calls)"
    ]
