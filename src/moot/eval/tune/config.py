"""``moot tune``'s input: the command's config and budget, every check made before a call, and the
split of the labelled items into a tuning part and a held-out part (made once, seeded, stored)."""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from moot.eval.datasets import DatasetError, load_dataset, select_items
from moot.eval.goal import NON_INFERIORITY
from moot.eval.items import EvalItem, to_task
from moot.eval.protocols import ProtocolRef, base_spec, parse_protocols
from moot.eval.runner import budget_problem
from moot.models.base import approx_tokens
from moot.models.pricing import PriceTable
from moot.protocols.refs import ProtocolRefError

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


class TuneRunError(Exception):
    """A tune whose runs were made but leave nothing to choose (every candidate failed, none fits
    the budget): a failed run, not bad input (its calls were spent; ``moot tune`` exits 1)."""


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
    margin: float = Field(default=NON_INFERIORITY, ge=0, lt=1)
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


# ------------------------------------------------------------------------------ checks, split


def free_budget_note(config: TuneConfig, prices: PriceTable | None = None) -> str | None:
    """A warning for a ``usd=`` budget on a model that costs nothing (an embedded model with no
    price given, or one priced at 0): accepted, but every candidate costs $0 an item, so the budget
    limits none and none is cheaper than another. None for any other budget. (A model with no price
    at all is refused by :func:`check`.)"""
    budget = config.budget
    if budget is None or budget.kind != "usd":
        return None
    table = prices or PriceTable()
    price = table.price_for(config.model)
    if price is None or price.input or price.output or price.cached_input:
        return None
    bare = config.model.partition(":")[2]
    priced = config.model in table.prices or bool(bare and bare in table.prices)
    why = "its price is 0" if priced else "an embedded model is free unless --prices or --price prices it"
    return (
        f"--budget {budget}: {config.model} costs $0 ({why}), so every candidate fits the budget and none is cheaper "
        "than another: give tokens= or calls= to limit them"
    )


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
    else:
        _refuse_a_part_below_the_minimum(config, len(items))
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
    # A candidate that cannot fit its own budget (a protocol file's budget.max_calls below one round,
    # a max_total_tokens below the question) would fail on every item: refused as moot eval refuses
    # it (the model's context window is checked there too, once it is resolved).
    if (problem := budget_problem(refs, items, max_tokens=config.max_tokens)) is not None:
        raise TuneError(problem)
    if config.objective == "cheapest" and not any(r.name == "vote" and r.k is not None and not r.params for r in refs):
        raise TuneError("--objective cheapest compares with the plain vote at the budget: add a vote@K candidate")
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


def held_out_count(total: int, holdout: float) -> int:
    """How many of ``total`` items ``--holdout`` (a share) holds out: the split's rule."""
    return max(1, round(total * holdout))


def _refuse_a_part_below_the_minimum(config: TuneConfig, total: int) -> None:
    """``--holdout``'s share must leave each part the items ``--tuning-n``/``--holdout-n`` must
    give (half of :data:`MIN_ITEMS`): a choice made on, or confirmed on, a handful of items says
    nothing. Refused naming the sizes the share gave and the shares that would do."""
    least = MIN_ITEMS // 2
    held = held_out_count(total, config.holdout)
    if min(held, total - held) >= least:
        return
    shares = [h / 100 for h in range(1, 100) if least <= held_out_count(total, h / 100) <= total - least]
    # (some share always does: MIN_ITEMS items split in halves)
    fix = f"give --holdout between {shares[0]:g} and {shares[-1]:g}, or more items" if shares else "give more items"
    raise TuneError(
        f"--holdout {config.holdout:g} splits the {total} items of {config.data} into {total - held} to tune on "
        f"and {held} to confirm on; each part needs at least {least} items: {fix}"
    )


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
        n_held = held_out_count(len(order), config.holdout)
        tuning, held = order[n_held:], order[:n_held]
    split = Split(data=config.data, data_fingerprint=fp, seed=config.seed, tuning=sorted(tuning),
                  held_out=sorted(held))  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(split.model_dump_json(indent=2), encoding="utf-8")
    return split


def write_part(items: list[EvalItem], ids: list[str], path: Path) -> None:
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
