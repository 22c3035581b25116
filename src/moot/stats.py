"""The statistics every layer uses (the eval report and its pool, the quality evaluator, the ABSA
evaluation, moot tune): proportions and their intervals, paired comparisons, multiplicity,
bootstrap, calibration and discrimination. Exact and dependency-free, but for the AUROC's
bootstrap, which uses numpy (the ``eval`` extra)."""

from __future__ import annotations

import functools
import math
import random
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from statistics import NormalDist
from typing import TYPE_CHECKING, TypeVar, overload

from pydantic import BaseModel

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

#: The two-sided 95% normal quantile.
Z95 = 1.959963984540054
Z = Z95
#: Resamples of every bootstrap interval.
BOOTSTRAP = 2000


@overload
def total(values: Iterable[int]) -> int: ...
@overload
def total(values: Iterable[float]) -> float: ...
def total(values: Iterable[float]) -> float:
    """The sum of ``values`` added one at a time, left to right: the same float on every Python.
    Python 3.12's ``sum()`` compensates a float sum (Neumaier) where 3.11's adds in turn, and the two
    differ in the last bits, so that a report would not re-derive byte for byte on both (the committed
    ones were made by adding in turn). The float sums of the eval and tune reports, the quality
    scores, a vote's share, a debate's cost and the confidence probes go through here."""
    result: float = 0
    for value in values:
        result += value
    return result


def wilson(correct: float, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score 95% interval of a proportion (sound at small n and near 0 or 1). ``correct`` may
    be fractional: a sum of expected correctness over tie-breaks, whose interval is taken at its mean."""
    if n == 0:
        return (0.0, 0.0)
    p = correct / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # At 0 and n the bounds are exactly 0 and 1 (rounding would leave 5e-17 and put the estimate
    # outside its own interval).
    low = 0.0 if correct == 0 else max(0.0, centre - half)
    high = 1.0 if correct == n else min(1.0, centre + half)
    return (low, high)


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value: ``b`` items only the first got right, ``c`` only the second."""
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = float(sum(math.comb(n, i) for i in range(k + 1))) / float(2**n)
    return min(1.0, 2 * tail)


def paired_diff_ci(b: int, c: int, n: int, z: float = 1.959963984540054) -> tuple[float, float, float]:
    """Difference of paired accuracies (second minus first) with its 95% interval.

    ``b``: first right, second wrong; ``c``: first wrong, second right; ``n``: paired items. The
    interval is Agresti and Min's (2005): the Wald interval after adding 1/2 to each of the four cells,
    which keeps its coverage where Wald's collapses (no discordant pair gives Wald [0, 0] however few
    the items). The difference itself is the observed one."""
    if n == 0:
        return (0.0, 0.0, 0.0)
    diff = (c - b) / n
    return (diff, *_agresti_min(b + 0.5, c + 0.5, n + 2.0, z))


def _agresti_min(b: float, c: float, n: float, z: float) -> tuple[float, float]:
    centre = (c - b) / n
    half = z * math.sqrt(max((b + c) - (c - b) ** 2 / n, 0.0)) / n
    return (max(-1.0, centre - half), min(1.0, centre + half))


def mean_diff_ci(values: list[float], z: float = 1.959963984540054) -> tuple[float, float, float]:
    """Mean of per-item paired differences in [-1, 1] (fractions: a rule's accuracy over many subsets
    of an item's samples, minus another's) with a 95% interval over items, adjusted as Agresti and
    Min adjust paired proportions (half a pseudo-item each at +1 and -1, one at 0), so that items
    that all agree do not give an interval of zero width."""
    if not values:
        return (0.0, 0.0, 0.0)
    n = len(values) + 2.0
    centre = total(values) / n
    second = (total(v * v for v in values) + 1.0) / n
    half = z * math.sqrt(max(second - centre * centre, 0.0) / n)
    return (total(values) / len(values), max(-1.0, centre - half), min(1.0, centre + half))


def discordant(first: Mapping[str, bool], second: Mapping[str, bool]) -> tuple[int, int, int]:
    """Paired correctness on the keys both have: (only ``first`` right, only ``second`` right, pairs)."""
    both = first.keys() & second.keys()
    only_first = sum(first[k] and not second[k] for k in both)
    only_second = sum(second[k] and not first[k] for k in both)
    return only_first, only_second, len(both)


def paired_items_needed(discordant_share: float, delta: float, alpha: float = 0.05, power: float = 0.8) -> int | None:
    """Items a paired (McNemar) test needs to detect a true gain of ``delta`` with this ``power`` at
    two-sided level ``alpha``, when a share ``discordant_share`` of items is right under exactly one
    of the two methods (Connor 1987): n = (z_a sqrt(psi) + z_b sqrt(psi - delta^2))^2 / delta^2.
    None when the gain cannot occur at that discordance (psi <= delta): then no n is enough, or
    the discordance is not known yet."""
    psi = discordant_share
    if delta <= 0 or psi <= delta:
        return None
    normal = NormalDist()
    z_a, z_b = normal.inv_cdf(1 - alpha / 2), normal.inv_cdf(power)
    return math.ceil((z_a * math.sqrt(psi) + z_b * math.sqrt(psi - delta * delta)) ** 2 / (delta * delta))


class PairedTest(BaseModel):
    """Two methods on the same items, each item's correctness in [0, 1] (a fraction where a vote's
    tie is credited by the share of its tied answers that are right: the expected correctness over
    tie-breaks). ``diff`` is second minus first, the interval :func:`mean_diff_ci`'s (Agresti and
    Min's on binary items), and ``p`` its two-sided normal p-value, so that the interval excludes 0
    exactly when p < 0.05."""

    n: int
    diff: float
    ci_low: float
    ci_high: float
    p: float
    #: Items where only the first, or only the second, was (wholly) right.
    only_first: int
    only_second: int
    #: Items that differ at all (a tie's fractional credit included): the discordant share's numerator.
    differing: int


def paired_test(first: Mapping[str, float], second: Mapping[str, float], z: float = Z95) -> PairedTest:
    """:class:`PairedTest` of ``second`` against ``first`` on the keys both have."""
    keys = sorted(first.keys() & second.keys())
    values = [second[k] - first[k] for k in keys]
    diff, lo, hi = mean_diff_ci(values, z)
    return PairedTest(
        n=len(keys), diff=diff, ci_low=lo, ci_high=hi, p=_mean_diff_p(values),
        only_first=sum(first[k] == 1.0 and second[k] == 0.0 for k in keys),
        only_second=sum(second[k] == 1.0 and first[k] == 0.0 for k in keys),
        differing=sum(v != 0 for v in values),
    )  # fmt: skip


def _mean_diff_p(values: Sequence[float]) -> float:
    """The two-sided p-value of :func:`mean_diff_ci`'s adjusted mean (the same pseudo-items)."""
    if not values:
        return 1.0
    n = len(values) + 2.0
    centre = total(values) / n
    var = max((total(v * v for v in values) + 1.0) / n - centre * centre, 0.0) / n
    if var == 0.0:
        return 1.0
    return min(1.0, 2.0 * (1.0 - NormalDist().cdf(abs(centre) / math.sqrt(var))))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of a family of p-values (controls the family-wise error rate)."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def bonferroni_z(m: int, alpha: float = 0.05) -> float:
    """The normal quantile of a two-sided interval at level 1 - alpha/m (m simultaneous intervals)."""
    return NormalDist().inv_cdf(1 - alpha / (2 * max(1, m)))


def tie_credit(leaders: Sequence[str], right: Mapping[str, bool] | None = None, *, correct: bool = False) -> float:
    """The expected correctness of a decision over its tie-breaks: the share of the tied leading
    answers that are right (``right`` maps each to its correctness); without a tie, ``correct``."""
    if right is None or len(leaders) < 2:
        return float(correct)
    return sum(bool(right[a]) for a in leaders) / len(leaders)


def mean_ci(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean with the normal 95% interval (clipped to [0, 1]; a single value has a zero-width one)."""
    m = statistics.fmean(values)
    half = Z * statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return m, max(0.0, m - half), min(1.0, m + half)


T = TypeVar("T")


def _randrange(rng: random.Random, n: int) -> Callable[[], int]:
    """``rng.randrange(n)`` as CPython draws it (the fewest random bits above ``n``, drawn again while
    too large), without its layers of checks: a bootstrap draws millions. tests/test_fair_stats.py
    holds it to ``randrange``."""
    getrandbits = rng.getrandbits
    k = n.bit_length()

    def draw() -> int:
        r = getrandbits(k)
        while r >= n:
            r = getrandbits(k)
        return r

    return draw


@functools.lru_cache(maxsize=8)
def _resamples(seed: int, n: int) -> tuple[tuple[int, ...], ...]:
    """The ``BOOTSTRAP`` resamples (indices into n rows) a bootstrap from ``seed`` draws: the same
    for every statistic on n rows, so drawn once (a report bootstraps dozens of statistics). Kept
    for the last 8 (seed, n): 2,000 x n indices each, 5 MB for 300 rows, held by a long process."""
    index = _randrange(random.Random(seed), n)
    return tuple(tuple(index() for _ in range(n)) for _ in range(BOOTSTRAP))


def bootstrap(
    rows: Sequence[T], stat: Callable[[Sequence[T]], float | None], seed: int = 0
) -> tuple[float | None, float | None, float | None]:
    """``stat`` on the rows (items), with a seeded percentile bootstrap interval over them
    (resamples where the statistic is undefined are skipped)."""
    value = stat(rows)
    if value is None:
        return None, None, None
    draws = []
    for resample in _resamples(seed, len(rows)):
        v = stat([rows[i] for i in resample])
        if v is not None:
            draws.append(v)
    if not draws:
        return value, None, None
    draws.sort()
    return value, draws[int(0.025 * (len(draws) - 1))], draws[int(0.975 * (len(draws) - 1))]


#: The paired form: rows are (single right, debate right) per item.
paired_bootstrap = bootstrap


def ece(confidences: Sequence[float], correct: Sequence[bool], bins: int = 10) -> float:
    """Expected calibration error: over equal-width confidence bins, the gap between the mean
    confidence and the accuracy, weighted by the bin's share of the items."""
    n = len(confidences)
    stated: list[list[float]] = [[] for _ in range(bins)]
    right: list[list[float]] = [[] for _ in range(bins)]
    for c, ok in zip(confidences, correct, strict=True):  # one pass (a bootstrap calls this thousands of times)
        b = min(int(c * bins), bins - 1)
        if b >= 0:
            stated[b].append(c)
            right[b].append(ok)
    total = 0.0
    for cs, oks in zip(stated, right, strict=True):
        if cs:  # each mean as statistics.fmean takes it (fsum / n), without its generator
            total += len(cs) / n * abs(math.fsum(cs) / len(cs) - math.fsum(oks) / len(oks))
    return total


def _ranks(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """1-based ranks of ``x``, tied values sharing their mean rank."""
    import numpy as np

    order = np.argsort(x, kind="mergesort")
    ordered = x[order]
    # Where each run of equal values starts in the sorted values (NaNs are one run, as np.unique
    # has them), and its length: np.unique would sort the sorted values again.
    new = np.empty(x.size, dtype=np.bool_)
    new[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=new[1:])
    new[1:] &= ~(np.isnan(ordered[1:]) & np.isnan(ordered[:-1]))
    first = np.flatnonzero(new)
    counts = np.diff(np.append(first, x.size))
    ranks = np.empty(x.size)
    ranks[order] = np.repeat(first + (counts + 1) / 2.0, counts)
    return ranks


def _auroc(x: NDArray[np.float64], y: NDArray[np.bool_]) -> float | None:
    right = int(y.sum())
    wrong = y.size - right
    if right == 0 or wrong == 0:
        return None
    return float((_ranks(x)[y].sum() - right * (right + 1) / 2) / (right * wrong))


def _aurocs(x: NDArray[np.float64], y: NDArray[np.bool_], resamples: list[NDArray[np.intp]]) -> list[float | None]:
    """``_auroc(x[idx], y[idx])`` for each ``idx`` of ``resamples``, computed together (``x`` finite):
    one row each, padded with +inf scores of wrong cases, which rank after every real case and
    count in no sum. A case's rank, (first + last position of its tie run) / 2 + 1, is a
    half-integer, so every sum is exact and each value is the one ``_auroc`` gives."""
    import numpy as np

    lengths = np.asarray([idx.size for idx in resamples], dtype=np.int64)
    width = max(idx.size for idx in resamples)
    xs = np.full((len(resamples), width), np.inf)
    ys = np.zeros((len(resamples), width), dtype=np.bool_)
    for row, idx in enumerate(resamples):
        xs[row, : idx.size] = x[idx]
        ys[row, : idx.size] = y[idx]
    order = np.argsort(xs, axis=1, kind="mergesort")
    ordered = np.take_along_axis(xs, order, axis=1)
    positions = np.arange(width)
    first = np.ones(xs.shape, dtype=np.bool_)  # a tie run starts here
    first[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    last = np.ones(xs.shape, dtype=np.bool_)  # ... ends here
    last[:, :-1] = first[:, 1:]
    start = np.maximum.accumulate(np.where(first, positions, 0), axis=1)
    end = np.minimum.accumulate(np.where(last, positions, width)[:, ::-1], axis=1)[:, ::-1]
    ranks = (start + end) / 2.0 + 1
    rank_sums = np.where(np.take_along_axis(ys, order, axis=1), ranks, 0.0).sum(axis=1)
    right = ys.sum(axis=1)
    wrong = lengths - right
    return [
        float((rank_sums[k] - int(right[k]) * (int(right[k]) + 1) / 2) / (int(right[k]) * int(wrong[k])))
        if right[k] and wrong[k]
        else None
        for k in range(len(resamples))
    ]


def auroc(scores: Sequence[float], right: Sequence[bool]) -> float | None:
    """The area under the ROC curve of ``scores`` as a predictor of ``right`` (the Mann-Whitney U over
    the product of the class sizes; a tie counts half). None when every case is of one class."""
    import numpy as np

    return _auroc(np.asarray(scores, dtype=np.float64), np.asarray(right, dtype=np.bool_))


def auroc_ci(
    scores: Sequence[float],
    right: Sequence[bool],
    clusters: Sequence[str] | None = None,
    *,
    resamples: int = BOOTSTRAP,
    seed: int = 0,
) -> tuple[float | None, float | None, float | None]:
    """The AUROC with its 95% percentile bootstrap interval: ``clusters`` (an item id per case; default:
    each case is its own item) are resampled with replacement, ``resamples`` times from ``seed``
    (numpy's default generator), and resamples of one class only are skipped."""
    import numpy as np

    x = np.asarray(scores, dtype=np.float64)
    y = np.asarray(right, dtype=np.bool_)
    value = _auroc(x, y)
    if value is None:
        return None, None, None
    rng = np.random.default_rng(seed)
    n = x.size
    if clusters is not None:
        where: dict[str, list[int]] = {}
        for i, c in enumerate(clusters):
            where.setdefault(c, []).append(i)
        # The clusters' cases end to end, with where each cluster starts and how many it has: a
        # resample's cases are those of its picked clusters, in the order picked.
        members = np.asarray([i for v in where.values() for i in v], dtype=np.intp)
        sizes = np.asarray([len(v) for v in where.values()], dtype=np.intp)
        starts = np.cumsum(sizes) - sizes
        n = sizes.size
    # Finite scores: the resamples are ranked together, a batch at a time (one resample at a time
    # is thousands of small numpy calls); the same numbers, ranks being exact half-integers.
    together = bool(np.isfinite(x).all())
    draws: list[float] = []
    batch: list[NDArray[np.intp]] = []
    cases = 0
    for r in range(resamples):
        pick = rng.integers(0, n, n)
        if clusters is None:
            idx = pick
        else:
            lengths = sizes[pick]
            ends = np.cumsum(lengths)
            # position j of the resample is case (start of its cluster) + (j - where that cluster's run begins)
            idx = members[np.repeat(starts[pick] - (ends - lengths), lengths) + np.arange(ends[-1])]
        batch.append(idx)
        cases += idx.size
        if cases >= 1 << 20 or r == resamples - 1:
            found = _aurocs(x, y, batch) if together else [_auroc(x[i], y[i]) for i in batch]
            draws.extend(v for v in found if v is not None)
            batch, cases = [], 0
    if not draws:
        return value, None, None
    low, high = np.quantile(np.asarray(draws), [0.025, 0.975])
    return value, float(low), float(high)
