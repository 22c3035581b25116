"""One pool of samples per item, every decision rule derived from it.

A run's *pool* is a protocol whose transcripts hold K independent typed samples per item (``cisc``
or ``vote@K``: agent i samples with seed i). Every sample-based decision rule is computed from the
same pool at no new calls, so rules are compared on the very same samples:

- ``vote@k`` and confidence-weighted votes (CISC's softmax of P(True), the answer's own
  probability, the whole reply's probability, the stated confidence) on random subsets of k of
  the K samples, many subsets per item, which cuts the noise of one draw; paired differences are
  per-item means over the same subsets, with a 95% interval over items;
- the softmax temperature of every weighted rule is fitted by cross-fitting: for each tenth of the
  items, on the other nine tenths (never on the items it scores), from a fixed grid;
- Adaptive-Consistency (Aggarwal et al. 2023): samples drawn in order until the Beta stopping rule
  says the leading answer is the mode with probability 0.95;
- the pilot that says whether weighting *can* win (CISC's WQD): over pairs of samples of one item
  where exactly one is right, how often the right one is the more confident; and the ceiling: the
  share of items whose plurality is wrong while the right answer is in the pool;
- calibration (expected calibration error, Brier score) of every confidence signal;
- a fixed budget moved between items (UAB, arXiv 2605.26849): one sample per item first, whose mean
  negative log-likelihood rates the item's difficulty, then the rest of the same total budget one
  sample at a time to the item with the largest p(1-p)^n (p = exp(-ANLL/0.2), n its samples so far),
  against the uniform vote at the same total samples, over the same random orders of each pool.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter
from collections.abc import Callable, Sequence

from pydantic import BaseModel, ConfigDict, Field

from moot.core.answers import answer_of, confidence_of
from moot.core.decisions import plurality, softmax_weight
from moot.core.types import DebateResult
from moot.eval.items import EvalItem
from moot.eval.loaded import LoadedRun
from moot.eval.protocols import parse_ref
from moot.eval.scoring import score
from moot.eval.uab import UAB_TEMPERATURE as UAB_TEMPERATURE  # re-exported: UAB's planning lives in eval.uab
from moot.eval.uab import first_sample_prob as first_sample_prob
from moot.eval.uab import refuse_blind_uab as refuse_blind_uab
from moot.eval.uab import uab_allocate, uab_difficulty
from moot.eval.uab import uab_plan as uab_plan
from moot.protocols.refs import ProtocolRefError
from moot.stats import ece as expected_calibration_error
from moot.stats import mean_diff_ci, total

SIGNALS = ("p_true", "answer_prob", "seq_prob", "stated")
#: Softmax temperatures tried when fitting a weighted vote (inf: every sample weighs 1, a plain vote).
T_GRID = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, math.inf)
DRAWS = 200
FOLDS = 10


class Sample(BaseModel):
    answer: str | None
    correct: bool
    signals: dict[str, float] = Field(default_factory=dict)
    #: Tokens of the sample itself, and of its self-check (CISC) when it had one.
    tokens: int = 0
    check_tokens: int = 0


class Discrimination(BaseModel):
    """CISC's WQD: the share of (right, wrong) sample pairs of one item where the right one is the
    more confident (ties count half). 0.5: the signal cannot help a vote."""

    signal: str
    pairs: int
    items: int
    wqd: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None


class Ceiling(BaseModel):
    items: int
    right_in_pool: int
    plurality_right: int
    plurality_wrong_right_in_pool: int
    unanimous_wrong: int
    no_right_answer: int


class RuleAtK(BaseModel):
    rule: str
    k: int
    #: Expected accuracy over the item's k-subsets and over tie-breaks (what every comparison uses).
    accuracy: float
    #: The same under the tie rule of the protocols' votes (a tie goes to the answer given first).
    tie_rule_accuracy: float | None = None
    diff_vs_vote: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    mean_tokens: float
    mean_calls: float
    #: A weighted rule at fewer samples than the pool against the vote over the whole pool (CISC's
    #: claim: the vote's accuracy with fewer samples), paired by item.
    diff_vs_full_vote: float | None = None
    full_ci_low: float | None = None
    full_ci_high: float | None = None


class FittedT(BaseModel):
    #: A fold whose best temperature is infinite (the plain vote) is written "Infinity" in report.json,
    #: not null (JSON has no infinity), so that the file reads back as it was written.
    model_config = ConfigDict(ser_json_inf_nan="strings")

    signal: str
    per_fold: list[float]

    @property
    def median(self) -> float:
        return float(statistics.median(self.per_fold))


class Adaptive(BaseModel):
    threshold: float
    accuracy: float
    mean_samples: float
    mean_tokens: float
    diff_vs_full_vote: float
    ci_low: float
    ci_high: float
    #: Correctness per item (it draws samples in order, so one answer per item, or a tie credited
    #: by its share of right answers): for pairing with a protocol. Not written to report.json.
    per_item: dict[str, float] = Field(default_factory=dict, exclude=True)


class Allocation(BaseModel):
    """UAB at a mean budget of ``budget`` samples per item against the uniform vote@budget."""

    budget: int
    accuracy: float
    vote_accuracy: float
    diff_vs_vote: float
    ci_low: float
    ci_high: float
    mean_tokens: float
    vote_mean_tokens: float
    #: The most samples UAB gave one item, and how often an item wanted more than its pool holds.
    max_samples: int
    capped: int


class Calibration(BaseModel):
    signal: str
    samples: int
    ece: float
    brier: float
    mean_confidence: float
    accuracy: float


class PoolAnalysis(BaseModel):
    pool: str
    k: int
    items: int
    draws: int = DRAWS
    discrimination: list[Discrimination]
    ceiling: Ceiling
    curves: list[RuleAtK]
    fitted: list[FittedT]
    adaptive: list[Adaptive]
    calibration: list[Calibration]
    allocation: list[Allocation] = Field(default_factory=list)
    #: Each item's expected correctness of the plain vote at k samples (over subsets and tie-breaks):
    #: the equal-budget vote a debate is paired with when the run has no vote of its own at that k.
    #: Not written to report.json.
    vote_per_item: dict[int, dict[str, float]] = Field(default_factory=dict, exclude=True)
    #: Mean tokens of one sample of the pool (a vote's cost per sample).
    sample_tokens: float = 0.0


def pool_samples(result: DebateResult, item: EvalItem) -> list[Sample]:
    """The first-round typed samples of a transcript, in speaker order (agent i = seed i, shifted by
    the run's ``--seed-stride`` times the item's position: the same shift for every protocol of an item)."""
    if not result.rounds:
        return []
    out = []
    for turn in result.rounds[0].turns:
        answer = answer_of(turn)
        signals = dict(turn.signals)
        stated = confidence_of(turn)
        if stated is not None:
            signals["stated"] = stated
        check = turn.probe_usage.total_tokens if turn.probe_usage is not None else 0
        out.append(
            Sample(
                answer=answer,
                correct=answer is not None and score(item, answer).correct,
                signals=signals,
                tokens=turn.usage.total_tokens - check,
                check_tokens=check,
            )
        )
    return out


def draw_of(label: str) -> int:
    """Which draw of round 1 a protocol's samples are: its ``first_seed`` (1, the default, unless a
    run measures a debate on several draws); a protocol file is of draw 1. Under ``--seed-stride K``
    draw S is seeds S + K x j on the item at position j: every protocol of the draw shifts alike, so
    the draw still names the same samples across protocols."""
    try:
        return int(parse_ref(label).params.get("first_seed", 1))
    except (ProtocolRefError, TypeError, ValueError):
        return 1


def find_pool(store: LoadedRun, draw: int = 1) -> str | None:
    """The run's pool of the given draw of round 1 (``first_seed``): a ``cisc`` protocol, else the
    largest ``vote@K``. A debate on another draw is compared with its own draw's samples."""
    labels = [label for label in store.config.protocols if draw_of(label) == draw]
    for label in labels:
        if label.startswith("cisc"):
            return label
    votes = [
        (int(k), lab)
        for lab in labels
        if lab.startswith("vote@") and (k := lab.split("@")[1].split("(")[0]).isdigit()  # not vote@auto, vote@uab
    ]
    return max(votes)[1] if votes else None


# ---------------------------------------------------------------------------------- the rules


def _leaders(samples: Sequence[Sample], signal: str | None, t: float) -> list[str]:
    """The answers tied for the largest (weighted) vote among ``samples``, in the order they were
    first given (empty: no usable sample)."""
    weights: dict[str, float] = {}
    usable = [s for s in samples if s.answer is not None and (signal is None or signal in s.signals)]
    if not usable:
        return []
    top = max((s.signals[signal] for s in usable), default=0.0) if signal else 0.0
    for s in usable:
        assert s.answer is not None
        w = 1.0 if signal is None else softmax_weight(s.signals[signal], top, t)
        weights[s.answer] = weights.get(s.answer, 0.0) + w
    return plurality(weights)


def _decide(samples: Sequence[Sample], signal: str | None, t: float) -> str | None:
    """The answer a (weighted) vote picks among ``samples``: on a tie the answer given first, the
    tie rule of every protocol's vote (:func:`moot.core.decisions.vote`)."""
    leaders = _leaders(samples, signal, t)
    return leaders[0] if leaders else None


def _credit(
    samples: Sequence[Sample], signal: str | None, t: float, check: Callable[[str], bool]
) -> tuple[float, float]:
    """(right under the tie rule, expected correctness over tie-breaks) of the vote on ``samples``."""
    leaders = _leaders(samples, signal, t)
    if not leaders:
        return 0.0, 0.0
    return float(check(leaders[0])), sum(check(a) for a in leaders) / len(leaders)


def _subsets(n: int, k: int, draws: int, rng: random.Random) -> list[list[int]]:
    """Subsets of k of n sample indices, each in seed order (so a tie goes to the lowest seed)."""
    if k >= n:
        return [list(range(n))]
    if math.comb(n, k) <= draws:
        import itertools

        return [list(c) for c in itertools.combinations(range(n), k)]
    return [sorted(rng.sample(range(n), k)) for _ in range(draws)]


class PoolScores:
    """Each item's score under a rule (k, signal, temperature), computed once per pool.

    A report analyses a pool more than once (on every item, then on the items every protocol
    finished) and asks for the same item's score under the same rule from several places (the
    temperature's fit, the curve at K, the full vote): an item's score depends on its own samples
    and the rule only (its subsets are seeded by the item), so one analysis's scores serve the rest.
    """

    def __init__(self) -> None:
        self._scores: dict[tuple[str, str, int, int, str | None, float], tuple[float, float]] = {}
        self._subsets: dict[tuple[str, int, int], list[list[int]]] = {}

    def item(
        self,
        pool: str,
        samples: list[Sample],
        answer_of_item: Callable[[str], bool],
        k: int,
        signal: str | None,
        t: float,
        seed: str,
    ) -> tuple[float, float]:
        """The rule's mean correctness over random k-subsets of one item's samples (seeded by item):
        under the tie rule, and in expectation over tie-breaks."""
        key = (pool, seed, len(samples), k, signal, t)  # the samples: the item's first K of the pool
        if key not in self._scores:
            where = (seed, len(samples), k)
            if where not in self._subsets:
                self._subsets[where] = _subsets(len(samples), k, DRAWS, random.Random(f"{seed}:{k}"))
            subsets = self._subsets[where]
            ruled = expected = 0.0
            for idx in subsets:
                r, e = _credit([samples[i] for i in idx], signal, t, answer_of_item)
                ruled += r
                expected += e
            self._scores[key] = (ruled / len(subsets), expected / len(subsets))
        return self._scores[key]


def _mean_ci(values: list[float]) -> tuple[float, float, float]:
    return mean_diff_ci(values)


def analyse_pool(
    store: LoadedRun, label: str | None = None, only: set[str] | None = None, scores: PoolScores | None = None
) -> PoolAnalysis | None:
    """Every derived rule on the run's pool (None when the run has no pool), on the items in ``only``
    if given. ``scores``: the items' scores of an earlier analysis of the same run, to reuse."""
    label = label or find_pool(store)
    if label is None:
        return None
    memo = scores or PoolScores()
    items = {i.id: i for i in store.items()}
    pools: dict[str, list[Sample]] = {}
    for item_id, result in store.transcripts(label).items():
        if only is not None and item_id not in only:
            continue
        item = items.get(item_id)
        if item is not None and result.status == "complete":
            samples = pool_samples(result, item)
            if samples:
                pools[item_id] = samples
    if not pools:
        return None
    ids = sorted(pools)
    k_max = min(len(s) for s in pools.values())
    checks: dict[str, Callable[[str], bool]] = {i: _checker(items[i]) for i in ids}
    signals = [s for s in SIGNALS if any(s in x.signals for p in pools.values() for x in p)]

    # The softmax temperature of each signal, cross-fitted on the other folds at k = K.
    folds = _folds(ids)
    fitted: list[FittedT] = []
    t_of: dict[str, dict[str, float]] = {}
    per_t: dict[tuple[str, float], dict[str, float]] = {}
    for sig in signals:
        for t in T_GRID:
            per_t[(sig, t)] = {i: memo.item(label, pools[i][:k_max], checks[i], k_max, sig, t, i)[1] for i in ids}
        chosen: list[float] = []
        t_of[sig] = {}
        for fold in folds:
            rest = [i for i in ids if i not in fold]
            # No other item to fit on (a run of one item): no weighting, a plain vote (T = inf).
            best = (
                max(T_GRID, key=lambda t: (statistics.fmean(per_t[(sig, t)][i] for i in rest), -T_GRID.index(t)))
                if rest
                else math.inf
            )
            chosen.append(best)
            for i in fold:
                t_of[sig][i] = best
        fitted.append(FittedT(signal=sig, per_fold=chosen))

    full = {i: memo.item(label, pools[i][:k_max], checks[i], k_max, None, math.inf, i)[1] for i in ids}
    curves: list[RuleAtK] = []
    vote_per_item: dict[int, dict[str, float]] = {}
    for k in range(1, k_max + 1):
        scored = {i: memo.item(label, pools[i][:k_max], checks[i], k, None, math.inf, i) for i in ids}
        base = {i: e for i, (_, e) in scored.items()}
        vote_per_item[k] = base
        # Cost of k samples (the mean over items of the first k; every subset of k costs about the same).
        plain = statistics.fmean(sum(s.tokens for s in pools[i][:k]) for i in ids)
        checked = statistics.fmean(sum(s.tokens + s.check_tokens for s in pools[i][:k]) for i in ids)
        curves.append(
            RuleAtK(rule="vote", k=k, accuracy=statistics.fmean(base.values()),
                    tie_rule_accuracy=statistics.fmean(r for r, _ in scored.values()), mean_tokens=plain,
                    mean_calls=float(k))
        )  # fmt: skip
        for sig in signals:
            both = {i: memo.item(label, pools[i][:k_max], checks[i], k, sig, t_of[sig][i], i) for i in ids}
            acc = {i: e for i, (_, e) in both.items()}
            m, lo, hi = _mean_ci([acc[i] - base[i] for i in ids])
            fm, flo, fhi = _mean_ci([acc[i] - full[i] for i in ids]) if k < k_max else (None, None, None)
            # Only P(True) needs a call of its own; the other signals come with the sample.
            costly = sig == "p_true"
            curves.append(
                RuleAtK(rule=f"weighted:{sig}", k=k, accuracy=statistics.fmean(acc.values()),
                        tie_rule_accuracy=statistics.fmean(r for r, _ in both.values()), diff_vs_vote=m,
                        ci_low=lo, ci_high=hi, mean_tokens=checked if costly else plain,
                        mean_calls=float(2 * k if costly else k), diff_vs_full_vote=fm, full_ci_low=flo,
                        full_ci_high=fhi)
            )  # fmt: skip

    adaptive = []
    for threshold in (0.8, 0.9, 0.95):
        used, acc_i, toks = [], {}, []
        for i in ids:
            n, leaders = _adaptive_consistency(pools[i][:k_max], threshold)
            used.append(n)
            acc_i[i] = sum(checks[i](a) for a in leaders) / len(leaders) if leaders else 0.0
            toks.append(sum(s.tokens for s in pools[i][:n]))
        m, lo, hi = _mean_ci([acc_i[i] - full[i] for i in ids])
        adaptive.append(
            Adaptive(threshold=threshold, accuracy=statistics.fmean(acc_i.values()),
                     mean_samples=statistics.fmean(used), mean_tokens=statistics.fmean(toks), diff_vs_full_vote=m,
                     ci_low=lo, ci_high=hi, per_item=acc_i)
        )  # fmt: skip

    return PoolAnalysis(
        pool=label,
        k=k_max,
        items=len(ids),
        discrimination=[_discrimination(pools, sig) for sig in signals],
        ceiling=_ceiling(pools, k_max),
        curves=curves,
        fitted=fitted,
        adaptive=adaptive,
        calibration=[c for sig in signals if (c := _calibration(pools, sig)) is not None],
        allocation=_allocations(pools, checks, k_max) if "seq_prob" in signals else [],
        vote_per_item=vote_per_item,
        sample_tokens=statistics.fmean(s.tokens for i in ids for s in pools[i][:k_max]),
    )


def _checker(item: EvalItem) -> Callable[[str], bool]:
    cache: dict[str, bool] = {}

    def check(answer: str) -> bool:
        if answer not in cache:
            cache[answer] = score(item, answer).correct
        return cache[answer]

    return check


def _folds(ids: list[str]) -> list[set[str]]:
    order = list(ids)
    random.Random("folds").shuffle(order)
    n = min(FOLDS, len(order))
    return [set(order[f::n]) for f in range(n)]


def _beta_mode_probability(v1: int, v2: int) -> float:
    """P(p1 > p2) for Beta(v1+1, v2+1) posteriors of the two leading answers (Adaptive-Consistency's
    stopping rule), exactly: 1 - I_0.5(v1+1, v2+1) = P(Binomial(v1+v2+1, 1/2) <= v1)."""
    n = v1 + v2 + 1
    return float(sum(math.comb(n, j) for j in range(v1 + 1)) / 2**n)


def _adaptive_consistency(samples: list[Sample], threshold: float) -> tuple[int, list[str]]:
    """Draw samples in order until the leading answer is the mode with probability >= threshold.
    Returns the samples drawn and the leading answers (more than one: a tie when the pool ran out;
    the first given is the tie rule's pick)."""
    counts: Counter[str] = Counter()
    drawn = 0
    for s in samples:
        drawn += 1
        if s.answer is not None:
            counts[s.answer] += 1
        top = counts.most_common(2)
        if top:
            v1 = top[0][1]
            v2 = top[1][1] if len(top) > 1 else 0
            if _beta_mode_probability(v1, v2) >= threshold:
                return drawn, [top[0][0]]
    best = max(counts.values(), default=0)
    return drawn, [a for a, c in counts.items() if c == best]


def _discrimination(pools: dict[str, list[Sample]], signal: str) -> Discrimination:
    per_item: list[tuple[float, int]] = []
    for samples in pools.values():
        right = [s.signals[signal] for s in samples if s.correct and signal in s.signals]
        wrong = [s.signals[signal] for s in samples if not s.correct and s.answer is not None and signal in s.signals]
        if right and wrong:
            wins = total(1.0 if r > w else 0.5 if r == w else 0.0 for r in right for w in wrong)
            per_item.append((wins, len(right) * len(wrong)))
    pairs = sum(n for _, n in per_item)
    if not pairs:
        return Discrimination(signal=signal, pairs=0, items=0)
    wqd = total(w for w, _ in per_item) / pairs
    rng = random.Random(f"wqd:{signal}")
    boots = []
    for _ in range(1000):
        draw = [per_item[rng.randrange(len(per_item))] for _ in per_item]
        boots.append(total(w for w, _ in draw) / max(1, sum(n for _, n in draw)))
    boots.sort()
    return Discrimination(
        signal=signal, pairs=pairs, items=len(per_item), wqd=wqd, ci_low=boots[24], ci_high=boots[974]
    )


def _ceiling(pools: dict[str, list[Sample]], k: int) -> Ceiling:
    right_in_pool = plurality_right = recoverable = unanimous_wrong = 0
    for samples in pools.values():
        given = [s for s in samples[:k] if s.answer is not None]
        has_right = any(s.correct for s in given)
        counts = Counter(s.answer for s in given)
        top = counts.most_common(2)
        clear = bool(top) and (len(top) == 1 or top[0][1] > top[1][1])
        plural_right = clear and any(s.correct for s in given if s.answer == top[0][0])
        right_in_pool += has_right
        plurality_right += plural_right
        recoverable += has_right and not plural_right
        unanimous_wrong += len(counts) == 1 and not has_right and bool(given)
    return Ceiling(
        items=len(pools), right_in_pool=right_in_pool, plurality_right=plurality_right,
        plurality_wrong_right_in_pool=recoverable, unanimous_wrong=unanimous_wrong,
        no_right_answer=len(pools) - right_in_pool,
    )  # fmt: skip


def _calibration(pools: dict[str, list[Sample]], signal: str, bins: int = 10) -> Calibration | None:
    pairs = [
        (min(1.0, max(0.0, s.signals[signal])), s.correct) for p in pools.values() for s in p if signal in s.signals
    ]
    if not pairs:
        return None
    return calibration_of(signal, pairs, bins)


def calibration_of(signal: str, pairs: list[tuple[float, bool]], bins: int = 10) -> Calibration:
    """Expected calibration error (equal-width bins) and Brier score of (confidence, correct) pairs."""
    ece = expected_calibration_error([c for c, _ in pairs], [o for _, o in pairs], bins)
    brier = statistics.fmean((c - float(o)) ** 2 for c, o in pairs)
    return Calibration(
        signal=signal, samples=len(pairs), ece=ece, brier=brier, mean_confidence=statistics.fmean(c for c, _ in pairs),
        accuracy=statistics.fmean(float(o) for _, o in pairs),
    )  # fmt: skip


#: The random orders of each pool UAB is scored on (against the uniform vote at the same samples).
UAB_ORDERS = 50


def _allocations(pools: dict[str, list[Sample]], checks: dict[str, Callable[[str], bool]], k: int) -> list[Allocation]:
    """UAB against the uniform vote at 2..k-1 samples per item on average, over the same orders."""
    ids = sorted(pools)
    if any("seq_prob" not in s.signals for i in ids for s in pools[i][:k]):
        return []
    orders = {i: [random.Random(f"uab:{i}:{d}").sample(range(k), k) for d in range(UAB_ORDERS)] for i in ids}
    out = []
    for b in range(2, k):
        uab: dict[str, float] = dict.fromkeys(ids, 0.0)
        uni: dict[str, float] = dict.fromkeys(ids, 0.0)
        toks = uni_toks = 0.0
        most = capped = 0
        for d in range(UAB_ORDERS):
            first = [pools[i][orders[i][d][0]] for i in ids]
            p = [uab_difficulty(s.signals["seq_prob"]) for s in first]
            alloc, c = uab_allocate(p, b * len(ids), k)
            capped += c
            most = max(most, *alloc)
            for i, n in zip(ids, alloc, strict=True):
                given = [pools[i][j] for j in orders[i][d][:n]]
                uab[i] += _credit(given, None, math.inf, checks[i])[1]
                toks += sum(s.tokens for s in given)
                same = [pools[i][j] for j in orders[i][d][:b]]
                uni[i] += _credit(same, None, math.inf, checks[i])[1]
                uni_toks += sum(s.tokens for s in same)
        m, lo, hi = _mean_ci([(uab[i] - uni[i]) / UAB_ORDERS for i in ids])
        norm = UAB_ORDERS * len(ids)
        out.append(
            Allocation(budget=b, accuracy=total(uab.values()) / norm, vote_accuracy=total(uni.values()) / norm,
                       diff_vs_vote=m, ci_low=lo, ci_high=hi, mean_tokens=toks / norm,
                       vote_mean_tokens=uni_toks / norm, max_samples=most, capped=capped // UAB_ORDERS)
        )  # fmt: skip
    return out
