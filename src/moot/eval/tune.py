"""``moot tune``: the best protocol for the user's own task and budget, chosen honestly.

1. The labelled items are split before anything runs (``split.json``, seeded, stored with the
   run): a tuning part and a held-out part.
2. Every candidate runs on the tuning part as one ``moot eval`` run (``tuning/``): the candidates
   share one pool of samples through the run's request cache (agent s asks what sample s of every
   vote asks), so a candidate costs only what it adds.
3. The choice is made on the tuning part alone, by a stated objective: ``accuracy`` (the most
   accurate candidate within the budget) or ``cheapest`` (the cheapest within the budget whose
   accuracy is not worse than the plain vote's at that budget by more than the margin). A winner
   must beat the vote at its own budget with a paired interval above 0; when the tuning items
   cannot support that, the cheapest candidate within the margin of the most accurate is chosen
   instead, and the report says so and how many items it would take.
4. Only the choice and the vote at its budget run on the held-out part (``holdout/``): the
   confirmation is paired, and the report says how much the tuning estimate overstated it.
5. ``tuned.yaml`` is the chosen protocol as a protocol file, with its evidence (``tuned:``).

Accuracy is the expected accuracy over tie-breaks, as in the report; comparisons are paired
(:func:`moot.stats.paired_test`).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import statistics
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer

from moot.eval.analysis import GOAL_POINTS
from moot.eval.datasets import DatasetError, load_dataset, select_items
from moot.eval.items import EvalItem, to_task
from moot.eval.loaded import LoadedRun, as_loaded, load_run
from moot.eval.protocols import ProtocolRef, base_spec, k_at_budget, parse_protocols, parse_ref
from moot.eval.render import model_title
from moot.eval.report import expected_correctness
from moot.eval.runner import ProgressFn, run_eval
from moot.eval.store import RunConfig, RunStore
from moot.models.base import BaseChatModel, approx_tokens
from moot.models.pricing import PriceTable
from moot.protocols.refs import ProtocolRefError
from moot.protocols.tuned import HeldOut, TunedEvidence, chosen_protocol
from moot.stats import paired_items_needed, paired_test, wilson

#: The candidates when none are given: the baselines, every rule the report derives (at a few
#: settings each: they share one pool of 8 samples, so the settings cost nothing more), and the
#: literature's debates.
DEFAULT_CANDIDATES = [
    "single",
    "direct",
    "vote@3",
    "vote@5",
    "vote@8",
    "cisc(k=8)",
    *(f"adaptive-consistency(threshold={t})" for t in (0.8, 0.9, 0.95)),
    *(f"weighted-vote(signal={s},softmax_t={t})" for s in ("answer_prob", "seq_prob") for t in (0.1, 0.2, 0.5, 1.0)),
    "filtered-vote(keep=0.5)",
    "society-of-minds",
    "free-mad",
]
#: The fewest labelled items ``moot tune`` takes: a tenth as many per part would tell nothing.
MIN_ITEMS = 20


class TuneError(ValueError):
    """Bad input to ``moot tune``, found before any model call."""


class TuneBudget(BaseModel):
    kind: Literal["tokens", "calls", "usd"]
    limit: float = Field(gt=0)

    def __str__(self) -> str:
        return f"{self.kind}={self.limit:g}"


def parse_budget(text: str | None) -> TuneBudget | None:
    """``tokens=2000``, ``calls=6`` or ``usd=0.01`` (mean per item)."""
    if text is None:
        return None
    kind, sep, value = text.partition("=")
    kind = kind.strip()
    if kind == "latency":
        raise TuneError(
            "--budget latency=: the candidates share their samples through the request cache, so a candidate's "
            "own latency is not measured; give tokens=, calls= or usd="
        )
    if not sep or kind not in ("tokens", "calls", "usd"):
        raise TuneError(f"--budget {text!r}: use tokens=N, calls=N or usd=X (the mean per item)")
    try:
        limit = float(value)
    except ValueError:
        raise TuneError(f"--budget {text!r}: {value!r} is not a number") from None
    if not math.isfinite(limit) or limit <= 0:
        raise TuneError(f"--budget {text!r}: the limit must be a positive number")
    return TuneBudget(kind=kind, limit=limit)  # type: ignore[arg-type]


class TuneConfig(BaseModel):
    data: str
    model: str
    candidates: list[str] = Field(default_factory=lambda: list(DEFAULT_CANDIDATES))
    budget: TuneBudget | None = None
    objective: Literal["accuracy", "cheapest"] = "accuracy"
    margin: float = Field(default=0.02, ge=0, lt=1)
    holdout: float = Field(default=0.5, gt=0, lt=1)
    seed: int = 0
    max_tokens: int | None = None
    labels: list[str] | None = None
    #: Instead of a random split by ``holdout``: the first ``tuning_n`` items of the dataset's seeded
    #: order (``moot eval``'s selection, so a committed run of ``-n tuning_n --seed seed`` holds
    #: exactly them) for tuning, and the next ``holdout_n`` held out (items no such run touched).
    tuning_n: int | None = Field(default=None, ge=1)
    holdout_n: int | None = Field(default=None, ge=1)
    #: Runs whose request caches the tuning run may use (``moot eval --cache-from``).
    cache_from: list[str] = Field(default_factory=list)


class Split(BaseModel):
    data: str
    data_fingerprint: str
    seed: int
    tuning: list[str]
    held_out: list[str]


class CandidateScore(BaseModel):
    label: str
    items: int
    accuracy: float
    ci_low: float
    ci_high: float
    mean_tokens: float
    mean_calls: float
    usd: float | None = None
    fits: bool = True
    #: The items whose debate failed (counted wrong, as in ``moot eval report``) and the commonest
    #: reason. A candidate that failed on every item (a weighted vote on a model that returns no
    #: log-probabilities) has no accuracy to speak of: it is shown as failed, never ranked or chosen.
    failed: int = 0
    failure: str | None = None

    @property
    def all_failed(self) -> bool:
        return self.items > 0 and self.failed == self.items

    @model_serializer(mode="wrap")
    def _without_no_failures(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A candidate with no failed item is written as before the failures were recorded, so that
        # the committed tunes still re-derive byte for byte.
        data: dict[str, Any] = handler(self)
        if not self.failed:
            data.pop("failed", None)
            data.pop("failure", None)
        return data


class Comparison(BaseModel):
    against: str
    items: int
    diff: float
    ci_low: float
    ci_high: float
    items_needed: int | None = None


class TuneReport(BaseModel):
    config: TuneConfig
    split: Split
    candidates: list[CandidateScore]
    chosen: str
    reason: str
    supported: bool
    tuning_comparison: Comparison | None = None
    held_out: HeldOut | None = None
    #: Tuning accuracy minus held-out accuracy of the choice: how much the choice flattered itself.
    optimism: float | None = None
    generated_at: str


# ------------------------------------------------------------------------------ checks, split


def check(config: TuneConfig, prices: PriceTable | None = None) -> list[EvalItem]:
    """Everything that can be wrong with the command, before any call: the data (labelled, enough
    items), the candidates, the budget (a calls budget no candidate fits; a USD budget for a model
    with no price in ``prices``, which would count every candidate as free)."""
    budget = config.budget
    if budget is not None and budget.kind == "usd" and (prices or PriceTable()).price_for(config.model) is None:
        raise TuneError(
            f"--budget {budget}: there is no price for {config.model}, so every candidate would cost $0; give "
            f"--price {config.model}=INPUT,OUTPUT (USD per million tokens) or --prices FILE, or budget in tokens= "
            "or calls="
        )
    try:
        items = load_dataset(config.data, labels=config.labels)
    except DatasetError as exc:
        raise TuneError(str(exc)) from None
    if (config.tuning_n is None) != (config.holdout_n is None):
        raise TuneError("--tuning-n and --holdout-n go together (the first N items tune, the next M confirm)")
    if config.tuning_n is not None and config.holdout_n is not None:
        if config.tuning_n + config.holdout_n > len(items):
            raise TuneError(
                f"--tuning-n {config.tuning_n} and --holdout-n {config.holdout_n} ask for "
                f"{config.tuning_n + config.holdout_n} items; {config.data} has {len(items)}"
            )
        if min(config.tuning_n, config.holdout_n) < MIN_ITEMS // 2:
            raise TuneError(f"--tuning-n and --holdout-n: at least {MIN_ITEMS // 2} items each")
    elif len(items) < MIN_ITEMS:
        raise TuneError(
            f"{config.data} has {len(items)} labelled items; moot tune needs at least {MIN_ITEMS} (half to choose "
            "on, half to confirm on), and a few hundred to tell close candidates apart"
        )
    if len(config.candidates) < 2:
        given = f"only {config.candidates[0]!r}" if config.candidates else "nothing"
        raise TuneError(
            f"--candidates names {given}: moot tune chooses between protocols, so name at least two, or leave "
            "--candidates out for the default set"
        )
    if any(c.strip().replace(" ", "").startswith("vote@auto") for c in config.candidates):
        raise TuneError("--candidates: vote@auto is matched by the tune itself; name vote@K instead")
    try:
        refs = parse_protocols(config.candidates)
    except ProtocolRefError as exc:
        raise TuneError(f"--candidates: {exc}") from None
    if any(r.uab_budget is not None for r in refs):
        raise TuneError(
            "--candidates: vote@uab moves a budget between a run's items, so it cannot answer one request as "
            "tuned.yaml does; compare it with moot eval instead"
        )
    if budget is not None and budget.kind in ("tokens", "usd"):
        _refuse_a_budget_below_one_question(config, budget, refs, items, prices)
    if config.budget is not None and config.budget.kind == "calls":
        planned = {r.label: base_spec(r).planned_calls() for r in refs}
        if min(planned.values()) > config.budget.limit:
            cheapest = min(planned, key=lambda k: planned[k])
            calls = planned[cheapest]
            raise TuneError(
                f"--budget {config.budget}: no candidate fits (the cheapest, {cheapest}, makes {calls} "
                f"call{'' if calls == 1 else 's'} an item)"
            )
    return items


_FIELD = re.compile(r"\{[A-Za-z_]+\}")


def token_floor(refs: list[ProtocolRef], items: list[EvalItem]) -> tuple[int, str]:
    """The fewest tokens any candidate can spend on any item, and on which: every candidate makes
    at least one call whose prompt is a participant's first message (the template, and the item's
    question when it reads it) and whose reply is at least one token. Counted with moot's
    conservative estimate (:func:`~moot.models.base.approx_tokens`, one per word and punctuation
    mark), without the system prompt and the chat format's tokens, which any real count adds."""
    questions = {i.id: approx_tokens(to_task(i).question) for i in items}
    easiest = min(questions, key=lambda i: questions[i])
    floor: tuple[int, str] | None = None
    for ref in refs:
        spec = base_spec(ref)
        for p in spec.participants:
            prompts = spec.prompts_for(p)
            for template in (prompts.opening, *([prompts.joining] if prompts.joining else [])):
                tokens = approx_tokens(_FIELD.sub(" ", template)) + 1
                tokens += questions[easiest] if "{question" in template else 0
                if floor is None or tokens < floor[0]:
                    floor = (tokens, ref.label)
    assert floor is not None
    return floor


def _refuse_a_budget_below_one_question(
    config: TuneConfig, budget: TuneBudget, refs: list[ProtocolRef], items: list[EvalItem], prices: PriceTable | None
) -> None:
    """A tokens or USD budget below what one call costs on the easiest item is refused before any
    call, rather than found after the tuning run (a budget above it may still fit nothing: that is
    known only once the candidates have run, and said then)."""
    tokens, cheapest = token_floor(refs, items)
    if budget.kind == "tokens" and budget.limit < tokens:
        raise TuneError(
            f"--budget {budget}: no candidate fits: every one sends an item's question at least once, at least "
            f"{tokens} tokens on the shortest item (the cheapest, {cheapest}); give a larger tokens="
        )
    price = (prices or PriceTable()).price_for(config.model)
    if budget.kind == "usd" and price is not None:
        usd = min(price.cost(tokens - 1, 1), price.cost(tokens - 1, 1, tokens - 1))  # (its prompt cached, perhaps)
        if budget.limit < usd:
            raise TuneError(
                f"--budget {budget}: no candidate fits: one call on the shortest item costs at least ${usd:.6g} at "
                f"{config.model}'s price ({tokens} tokens, the cheapest, {cheapest}); give a larger usd="
            )


def _fingerprint(config: TuneConfig, items: list[EvalItem]) -> str:
    """The data's fingerprint: the file's bytes, or for a named dataset its items as loaded."""
    path = Path(config.data)
    if path.is_file():
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    text = json.dumps([i.model_dump(mode="json") for i in items], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def make_split(config: TuneConfig, items: list[EvalItem], out: Path) -> Split:
    """The split, made once (seeded) and stored: a resumed tune keeps it; changed data is refused."""
    path = out / "split.json"
    fp = _fingerprint(config, items)
    if path.is_file():
        split = Split.model_validate_json(path.read_text(encoding="utf-8"))
        if split.data_fingerprint != fp or split.seed != config.seed:
            raise TuneError(
                f"{out} was tuned on other data or another --seed (split.json: {split.data_fingerprint}, seed "
                f"{split.seed}); use another --out, or delete {out} to start over"
            )
        return split
    ids = [i.id for i in items]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        more = f" (and {len(repeated) - 1} more)" if repeated[1:] else ""
        raise TuneError(
            f"{config.data}: item id {repeated[0]!r} repeats{more}; give each item a distinct 'id' (or none)"
        )
    if config.tuning_n is not None and config.holdout_n is not None:
        ordered = [i.id for i in select_items(items, config.tuning_n + config.holdout_n, config.seed)]
        tuning, held = ordered[: config.tuning_n], ordered[config.tuning_n :]
    else:
        order = list(ids)
        random.Random(f"tune:{config.seed}").shuffle(order)
        n_held = max(1, round(len(order) * config.holdout))
        tuning, held = order[n_held:], order[:n_held]
    split = Split(data=config.data, data_fingerprint=fp, seed=config.seed, tuning=sorted(tuning),
                  held_out=sorted(held))  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(split.model_dump_json(indent=2), encoding="utf-8")
    return split


def _write_part(items: list[EvalItem], ids: list[str], path: Path) -> None:
    """A part of the split as a JSONL file the eval runner reads (the items exactly as loaded)."""
    chosen = set(ids)
    lines = []
    for item in items:
        if item.id not in chosen:
            continue
        line: dict[str, Any] = {"id": item.id, "question": item.question, "answer": item.answer}
        if item.choices:
            line["choices"] = item.choices
        if item.context:
            line["context"] = item.context
        if item.kind == "label":
            line["labels"] = item.labels
        lines.append(json.dumps(line, ensure_ascii=False))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------------- selection


Scores = dict[str, tuple["CandidateScore", dict[str, float]]]


def _scores(
    store: LoadedRun, labels: list[str], prices: PriceTable | None
) -> dict[str, tuple[CandidateScore, dict[str, float]]]:
    items = {i.id: i for i in store.items()}
    out = {}
    for label in labels:
        results = {r.item_id: r for r in store.results(label)}
        if not results:
            continue
        expected = expected_correctness(store, label, items, results)
        rs = list(results.values())
        # The interval of the accuracy it is printed with: the expected one over tie-breaks.
        lo, hi = wilson(sum(expected.values()), len(rs))
        failures = Counter(r.error or "no reason recorded" for r in rs if r.status == "failed")
        price = prices.price_for(store.config.model) if prices is not None else None
        usd = (
            statistics.fmean(price.cost(r.prompt_tokens, r.completion_tokens, r.cached_prompt_tokens) for r in rs)
            if price is not None
            else None
        )
        out[label] = (
            CandidateScore(label=label, items=len(rs), accuracy=statistics.fmean(expected.values()), ci_low=lo,
                           ci_high=hi, mean_tokens=statistics.fmean(r.tokens for r in rs),
                           mean_calls=statistics.fmean(r.calls for r in rs), usd=usd, failed=failures.total(),
                           failure=failures.most_common(1)[0][0] if failures else None),
            expected,
        )  # fmt: skip
    return out


def _cost(c: CandidateScore, kind: str) -> float:
    if kind == "calls":
        return c.mean_calls
    if kind == "usd":
        return c.usd if c.usd is not None else 0.0
    return c.mean_tokens


def budget_vote(c: CandidateScore, single: CandidateScore | None, budget: TuneBudget | None) -> str:
    """The plain vote at a candidate's budget, fixed before its accuracy is looked at: k = its calls
    (a calls budget, or none), or its tokens over one sample's (a tokens or usd budget)."""
    if budget is not None and budget.kind != "calls" and single is not None and single.mean_tokens:
        return f"vote@{k_at_budget(c.mean_tokens, single.mean_tokens)}"
    return f"vote@{k_at_budget(c.mean_calls)}"


def _is_plain_vote(label: str) -> bool:
    ref = parse_ref(label)
    return ref.name == "vote" and not ref.params


def choose(
    scores: Scores,
    config: TuneConfig,
    ensure: Callable[[str], tuple[CandidateScore, dict[str, float]]],
) -> tuple[str, str, bool, Comparison | None]:
    """(chosen label, why, supported, its comparison with the vote at its budget) on the tuning
    items. ``ensure(label)`` returns a vote's scores, running it on the tuning part if needed."""
    budget = config.budget
    kind = budget.kind if budget is not None else "tokens"
    for c, _ in scores.values():
        c.fits = not c.all_failed and (budget is None or _cost(c, budget.kind) <= budget.limit)
    # Only a candidate is chosen: the votes the tune adds at a candidate's budget are baselines. One
    # that failed on every item is neither chosen nor ranked (its 0% is no measurement).
    offered = [scores[label][0] for label in config.candidates if label in scores]
    candidates = [c for c in offered if not c.all_failed]
    if not candidates:
        reasons = "; ".join(f"{c.label}: {c.failure}" for c in offered)
        raise TuneError(f"every candidate failed on every tuning item ({reasons})")
    fitting = [c for c in candidates if c.fits]
    if not fitting:
        cheapest = min(candidates, key=lambda c: _cost(c, kind))
        raise TuneError(
            f"--budget {budget}: no candidate fits on the tuning items (the cheapest, {cheapest.label}, spends "
            f"{_cost(cheapest, kind):.4g} {kind} an item)"
        )
    single = scores["single"][0] if "single" in scores and not scores["single"][0].all_failed else None

    def against_vote(c: CandidateScore) -> Comparison | None:
        vote = budget_vote(c, single, budget)
        if _is_plain_vote(c.label) and parse_ref(c.label).k == parse_ref(vote).k:
            if single is None or c.label == "single":
                return None
            vote = "single"
        base = scores[vote] if vote in scores else ensure(vote)
        t = paired_test(base[1], scores[c.label][1])
        needed = paired_items_needed(t.differing / t.n, GOAL_POINTS) if t.n else None
        return Comparison(against=vote, items=t.n, diff=t.diff, ci_low=t.ci_low, ci_high=t.ci_high,
                          items_needed=needed)  # fmt: skip

    by_cost = sorted(fitting, key=lambda c: (_cost(c, kind), -c.accuracy))
    if config.objective == "cheapest":
        reference = max((c for c in fitting if _is_plain_vote(c.label)), key=lambda c: _cost(c, kind), default=None)
        if reference is None:
            raise TuneError("--objective cheapest compares with the plain vote at the budget: add a vote@K candidate")
        for c in by_cost:
            t = paired_test(scores[reference.label][1], scores[c.label][1])
            if t.ci_low >= -config.margin:
                why = (f"the cheapest candidate within the budget whose accuracy is not worse than {reference.label}'s "
                       f"by more than {100 * config.margin:g} points ({100 * t.diff:+.1f} [{100 * t.ci_low:+.1f}, "
                       f"{100 * t.ci_high:+.1f}] on the tuning items)")  # fmt: skip
                return c.label, why, True, against_vote(c)
        return reference.label, f"no cheaper candidate is non-inferior to {reference.label}", False, None
    best = max(fitting, key=lambda c: (c.accuracy, -_cost(c, kind)))
    comparison = against_vote(best)
    if comparison is not None and comparison.ci_low > 0:
        why = (f"the most accurate within the budget, and it beats {comparison.against} (the vote at its budget) on "
               f"the tuning items: {100 * comparison.diff:+.1f} points [{100 * comparison.ci_low:+.1f}, "
               f"{100 * comparison.ci_high:+.1f}]")  # fmt: skip
        return best.label, why, True, comparison
    near = [c for c in by_cost if c.accuracy >= best.accuracy - config.margin]
    pick = near[0] if near else best
    needed = comparison.items_needed if comparison is not None else None
    if comparison is None:
        against = f"the most accurate, {best.label}, has no vote to be compared with"
    else:
        # A plain vote is itself the vote at its budget: it is held to the single answer instead.
        whom = (f"{comparison.against} (it is itself the vote at its budget)" if comparison.against == "single"
                else f"{comparison.against}, the vote at its budget")  # fmt: skip
        against = (f"the most accurate, {best.label}, is {100 * comparison.diff:+.1f} points "
                   f"[{100 * comparison.ci_low:+.1f}, {100 * comparison.ci_high:+.1f}] against {whom}, an interval "
                   "that does not clear 0")  # fmt: skip
    why = (
        f"the tuning items cannot tell the candidates apart: {against}; so the cheapest candidate within "
        f"{100 * config.margin:g} points of it is chosen"
        + (f"; telling a 2-point gain apart would take about {needed:,} paired items" if needed else "")
    )
    return pick.label, why, False, against_vote(pick)


# ------------------------------------------------------------------------------------- the run


async def run_tune(
    config: TuneConfig,
    out: Path,
    *,
    model: BaseChatModel | None = None,
    prices: PriceTable | None = None,
    concurrency: int = 4,
    on_progress: ProgressFn | None = None,
    on_phase: Callable[[str], None] | None = None,
) -> TuneReport:
    """Tune, confirm and write ``tune.json``, ``tune.md`` and ``tuned.yaml`` in ``out`` (resumable:
    the same command goes on where it stopped). ``on_phase`` hears "tuning" and "held out" as each
    part's run begins (``on_progress`` then counts that run's results)."""
    items = check(config, prices)
    split = make_split(config, items, out)
    _write_part(items, split.tuning, out / "tuning.jsonl")
    _write_part(items, split.held_out, out / "holdout.jsonl")

    def part(name: str, protocols: list[str]) -> RunConfig:
        if name == "tuning" and config.tuning_n is not None:
            # The dataset's own first N items, asked exactly as a `moot eval -n N --seed S` run asked
            # them: that run's request cache (--cache-from) serves every request it made.
            return RunConfig(dataset=config.data, n=config.tuning_n, seed=config.seed, protocols=protocols,
                             model=config.model, max_tokens=config.max_tokens, labels=config.labels)  # fmt: skip
        return RunConfig(dataset=str(out / f"{name}.jsonl"), protocols=protocols, model=config.model,
                         max_tokens=config.max_tokens, labels=config.labels)  # fmt: skip

    caches = [Path(c) for c in config.cache_from]
    tuning_labels = list(config.candidates)
    added: list[str] = _votes_added(out / "tuning", tuning_labels)
    if on_phase is not None:
        on_phase("tuning")
    while True:
        store = await run_eval(part("tuning", tuning_labels + added), out / "tuning", concurrency=concurrency,
                               model=model, on_progress=on_progress, cache_from=caches)  # fmt: skip
        try:
            chosen, _, _, comparison = choose(
                _scores(as_loaded(store), tuning_labels + added, prices), config, _need_vote
            )
            break
        except _NeedVote as need:
            # The vote at a candidate's budget, on the same tuning items (it shares their samples).
            added.append(need.label)
        finally:
            store.close()
    if on_phase is not None:
        on_phase("held out")
    # A folder tuned before keeps what its held-out run holds (and the report says it was seen).
    held = list(dict.fromkeys(_stored_protocols(out / "holdout") + held_out_labels(chosen, comparison)))
    store = await run_eval(part("holdout", held), out / "holdout", concurrency=concurrency, model=model,
                           on_progress=on_progress)  # fmt: skip
    store.close()
    report, chosen_score = analyse_tune(config, split, load_run(out / "tuning"), load_run(out / "holdout"), prices)
    report = _dated_as_before(report, out / "tune.json")
    write_outputs(report, chosen_score, out)
    return report


def _dated_as_before(report: TuneReport, previous: Path) -> TuneReport:
    """The report, keeping the date of the one already written when nothing else in it changed (a
    finished tune run again): the evidence's date is when it was made, not when it was last read."""
    try:
        before = TuneReport.model_validate_json(previous.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return report
    same = report.model_copy(update={"generated_at": before.generated_at})
    return same if same.model_dump_json() == before.model_dump_json() else report


def _need_vote(label: str) -> tuple[CandidateScore, dict[str, float]]:
    raise _NeedVote(label)


def held_out_labels(chosen: str, comparison: Comparison | None) -> list[str]:
    """What runs on the held-out items: the choice, and the vote at its budget it was compared with."""
    baseline = comparison.against if comparison is not None else None
    return [chosen] + ([baseline] if baseline is not None and baseline != chosen else [])


def held_before(stored: list[str], labels: list[str]) -> list[str]:
    """What the held-out run held before this choice was confirmed there, from its protocols alone:
    a tune extends it to ``before + [l for l in labels if l not in before]`` (:func:`run_tune`), so
    ``before`` is the shortest prefix of ``stored`` that gives ``stored`` so. Empty for a run made for
    this choice alone (``stored == labels``): a confirmation on fresh items."""
    for i in range(len(stored) + 1):
        before = stored[:i]
        if before + [label for label in labels if label not in before] == stored:
            return before
    return stored  # not made by a tune of these labels: everything in it was there before


def analyse_tune(
    config: TuneConfig,
    split: Split,
    tuning_run: RunStore | LoadedRun,
    holdout_run: RunStore | LoadedRun,
    prices: PriceTable | None = None,
    *,
    generated_at: str | None = None,
) -> tuple[TuneReport, CandidateScore]:
    """The tune's report, and the choice's score on the tuning items, from its two finished runs
    alone (no model): what ``run_tune`` writes, and what a committed tune is re-derived from."""
    tuning, holdout = as_loaded(tuning_run), as_loaded(holdout_run)
    labels = list(tuning.config.protocols)
    scores = _scores(tuning, labels, prices)
    chosen, reason, supported, comparison = choose(scores, config, _need_vote)
    held_labels = held_out_labels(chosen, comparison)
    held = _scores(holdout, held_labels, prices)
    baseline = held_labels[1] if len(held_labels) > 1 else None
    held_out: HeldOut | None = None
    seen_before = held_before(list(holdout.config.protocols), held_labels)
    if chosen in held and baseline is not None and baseline in held:
        c, mine = held[chosen]
        b, theirs = held[baseline]
        t = paired_test(theirs, mine)
        held_out = HeldOut(items=c.items, accuracy=c.accuracy, ci_low=c.ci_low, ci_high=c.ci_high, baseline=baseline,
                           baseline_accuracy=b.accuracy, diff=t.diff, diff_ci_low=t.ci_low, diff_ci_high=t.ci_high,
                           mean_tokens=c.mean_tokens, mean_calls=c.mean_calls, seen_before=seen_before)  # fmt: skip
    elif chosen in held:
        c = held[chosen][0]
        held_out = HeldOut(items=c.items, accuracy=c.accuracy, ci_low=c.ci_low, ci_high=c.ci_high, baseline=None,
                           mean_tokens=c.mean_tokens, mean_calls=c.mean_calls, seen_before=seen_before)  # fmt: skip
    report = TuneReport(
        config=config, split=split, candidates=[scores[label][0] for label in config.candidates if label in scores],
        chosen=chosen, reason=reason, supported=supported, tuning_comparison=comparison, held_out=held_out,
        optimism=(scores[chosen][0].accuracy - held_out.accuracy) if held_out is not None else None,
        generated_at=generated_at or datetime.now(UTC).isoformat(timespec="seconds"),
    )  # fmt: skip
    return report, scores[chosen][0]


def _votes_added(folder: Path, candidates: list[str]) -> list[str]:
    """The budget-matched votes an earlier run of this tune added to its tuning run (a resume asks
    for them again, so the run's config is the one it stored)."""
    return [p for p in _stored_protocols(folder) if p not in candidates]


def _stored_protocols(folder: Path) -> list[str]:
    """The protocols a part's run already holds (none before it first runs)."""
    if not (folder / "run.sqlite").is_file():
        return []
    store = RunStore.open(folder)
    try:
        return list(store.config.protocols)
    finally:
        store.close()


class _NeedVote(Exception):
    def __init__(self, label: str) -> None:
        super().__init__(label)
        self.label = label


def tuned_protocol(report: TuneReport, tuning: CandidateScore) -> dict[str, Any]:
    """The chosen protocol as a protocol file (a preset and its parameters) with its evidence."""
    doc: dict[str, Any] = chosen_protocol(report.chosen)
    if report.config.max_tokens:
        doc["budget"] = {"max_tokens_per_turn": report.config.max_tokens}
    evidence = TunedEvidence(
        chosen=report.chosen, model=report.config.model, objective=report.config.objective,
        budget=str(report.config.budget) if report.config.budget is not None else None, reason=report.reason,
        tuning_accuracy=tuning.accuracy, tuning_items=tuning.items, held_out=report.held_out,
        data=report.split.data, data_fingerprint=report.split.data_fingerprint, date=report.generated_at,
    )  # fmt: skip
    doc["tuned"] = json.loads(evidence.model_dump_json())
    return doc


def write_outputs(report: TuneReport, tuning: CandidateScore, out: Path) -> None:
    (out / "tune.json").write_text(report.model_dump_json(indent=2), encoding="utf-8")
    header = "# moot tune: the protocol chosen on the tuning items, confirmed on the held-out items\n"
    (out / "tuned.yaml").write_text(
        header + yaml.safe_dump(tuned_protocol(report, tuning), sort_keys=False, allow_unicode=True), encoding="utf-8"
    )
    (out / "tune.md").write_text(render_markdown(report), encoding="utf-8")


def _pct(x: float) -> str:
    return "–" if math.isnan(x) else f"{100 * x:.1f}%"


def optimism_text(optimism: float) -> str:
    """The tuning estimate against the held-out accuracy, worded by its sign (a choice can do
    better on the held-out items than on those it was chosen on: that is chance, not a cost)."""
    points = round(100 * optimism, 1)
    if points > 0:
        return (
            f"the tuning items' estimate overstated the held-out accuracy by {points:.1f} points (the price of "
            "choosing on them)"
        )
    if points < 0:
        return (
            f"the tuning items' estimate understated the held-out accuracy by {-points:.1f} points (the choice did "
            "better on the held-out items than on those it was chosen on: chance, not a cost of choosing)"
        )
    return "the tuning items' estimate matched the held-out accuracy (to 0.1 points)"


def render_markdown(report: TuneReport) -> str:
    cfg = report.config
    lines = [
        f"# moot tune: {cfg.data}",
        "",
        f"- model `{cfg.model}`{model_title(cfg.model)}; objective **{cfg.objective}**"
        + (f", budget {cfg.budget} per item" if cfg.budget else ", no budget")
        + f", margin {100 * cfg.margin:g} points",
        f"- split (seed {cfg.seed}): {len(report.split.tuning)} tuning items, {len(report.split.held_out)} held out; "
        f"data {report.split.data_fingerprint}",
        f"- **chosen: `{report.chosen}`**: {report.reason}.",
    ]
    h = report.held_out
    if h is not None:
        lines.append(
            f"- on the {h.items} held-out items: {_pct(h.accuracy)} [{_pct(h.ci_low)}, {_pct(h.ci_high)}]"
            + (f" against {h.baseline} {_pct(h.baseline_accuracy)}: {100 * h.diff:+.1f} points "
               f"[{100 * h.diff_ci_low:+.1f}, {100 * h.diff_ci_high:+.1f}], paired"
               if h.baseline is not None and h.baseline_accuracy is not None and h.diff is not None
               and h.diff_ci_low is not None and h.diff_ci_high is not None
               else ", with no vote at its budget to compare with")
            + f"; {h.mean_calls:.1f} calls and {h.mean_tokens:.0f} tokens an item."
        )  # fmt: skip
    if h is not None and h.seen_before:
        lines.append(
            f"- **not a fresh confirmation:** an earlier tune of this folder had already run "
            f"{', '.join(f'`{p}`' for p in h.seen_before)} on these held-out items, and those results could be "
            "seen before this choice was made. Confirm it on items no run of this folder has touched (new "
            "labelled data)."
        )
    if report.optimism is not None:
        lines.append(f"- {optimism_text(report.optimism)}.")
    lines += ["", "## The candidates on the tuning items", "",
              "| candidate | accuracy (expected over tie-breaks) | 95% CI | calls/item | tokens/item | fits the "
              "budget |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    ranked = [c for c in report.candidates if not c.all_failed]
    for c in sorted(ranked, key=lambda c: -c.accuracy):
        lines.append(f"| {c.label} | {_pct(c.accuracy)} | [{_pct(c.ci_low)}, {_pct(c.ci_high)}] | {c.mean_calls:.2f} "
                     f"| {c.mean_tokens:.0f} | {'yes' if c.fits else 'no'} |")  # fmt: skip
    failed = [c for c in report.candidates if c.all_failed]
    if failed:
        lines += ["", "**Failed on every tuning item** (no accuracy measured: not ranked, never chosen):", ""]
        lines += [f"- `{c.label}` failed: {c.failure}" for c in failed]
    partly = [c for c in ranked if c.failed]
    if partly:
        lines += ["", "Failed on some tuning items (each counted wrong in its accuracy):", ""]
        lines += [f"- `{c.label}` failed on {c.failed} of {c.items} items: {c.failure}" for c in partly]
    lines += [
        "",
        "Run it: `moot debate -p tuned.yaml ...`; serve it: `moot serve --tuned tuned.yaml` (as `moot/auto`).",
        "",
    ]
    return "\n".join(lines)
