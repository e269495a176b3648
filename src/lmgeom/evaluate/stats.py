"""Paired tests of a metric over evaluation examples, Holm's correction, and mean ± std over seeds.

With 3-5 seeds a test over seeds cannot reach significance, so a configuration is compared with its
baseline on the same evaluation examples: the unit is an example, and a metric that is not a mean
over examples (Matthews, F1, Pearson) is recomputed on every resample.

Several seeds are pooled: predictions are (n_seeds, n_examples) for the same examples, the statistic
is the metric of all seeds' predictions concatenated, and a resample swaps or redraws an example in
every seed at once (the seeds of one example are not independent units).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from lmgeom.errors import InputError

Metric = Callable[[np.ndarray, np.ndarray], float]


@dataclass(frozen=True)
class PairedTest:
    difference: float  # metric(b) - metric(a) on the given predictions
    p_value: float  # two-sided
    n_examples: int
    n_resamples: int  # the number of permutations or bootstrap draws (2**n when exact)
    method: str
    null_sd: float = float("nan")  # the standard deviation of the statistic under the null (its resamples)


def _as_seed_rows(y_true: np.ndarray, predictions: np.ndarray) -> np.ndarray:
    predictions = np.asarray(predictions)
    if predictions.ndim == 1:
        predictions = predictions[None, :]
    if predictions.ndim != 2 or predictions.shape[1] != len(y_true):
        raise ValueError(f"predictions must be (n_examples,) or (n_seeds, n_examples) for {len(y_true)} examples, "
                         f"got shape {predictions.shape}")
    return predictions


def _pooled_difference(metric: Metric, y_true: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    truth = np.tile(y_true, a.shape[0])
    return metric(truth, b.reshape(-1)) - metric(truth, a.reshape(-1))


def paired_permutation_test(
    y_true: np.ndarray, predictions_a: np.ndarray, predictions_b: np.ndarray, metric: Metric, *,
    n_resamples: int = 2000, seed: int = 0,
) -> PairedTest:
    """Two-sided paired permutation (sign-flip) test of metric(b) - metric(a): each example's a and b
    predictions are swapped with probability 1/2. Exact (all 2**n swaps) when 2**n <= n_resamples;
    otherwise Monte Carlo with p = (1 + #{|d*| >= |d|}) / (1 + n_resamples)."""
    y_true = np.asarray(y_true)
    a = _as_seed_rows(y_true, predictions_a)
    b = _as_seed_rows(y_true, predictions_b)
    if a.shape != b.shape:
        raise ValueError(f"the two prediction arrays differ in shape: {a.shape} and {b.shape}")
    n = len(y_true)
    if n == 0:
        raise InputError("a paired test needs at least one evaluation example")
    observed = _pooled_difference(metric, y_true, a, b)
    exact = n < 63 and 2**n <= n_resamples
    if exact:
        swaps = ((np.arange(2**n)[:, None] >> np.arange(n)[None, :]) & 1).astype(bool)
    else:
        swaps = np.random.default_rng(seed).random((n_resamples, n)) < 0.5
    null = np.empty(len(swaps))
    for i, swap in enumerate(swaps):
        null[i] = _pooled_difference(metric, y_true, np.where(swap, b, a), np.where(swap, a, b))
    # A tolerance so that resamples equal to the observation up to float rounding count as "as extreme".
    tolerance = 1e-12 * max(1.0, abs(observed))
    extreme = int(np.sum(np.abs(null) >= abs(observed) - tolerance))
    p_value = extreme / len(swaps) if exact else (1 + extreme) / (1 + len(swaps))
    return PairedTest(observed, min(1.0, p_value), n, len(swaps), "exact permutation" if exact else "permutation",
                      float(np.std(null)))


def paired_bootstrap_test(
    y_true: np.ndarray, predictions_a: np.ndarray, predictions_b: np.ndarray, metric: Metric, *,
    n_resamples: int = 2000, seed: int = 0,
) -> PairedTest:
    """Two-sided paired bootstrap test (Berg-Kirkpatrick et al. 2012's shifted form): examples are
    drawn with replacement, the same draw for a and b; p = (1 + #{|d* - d| >= |d|}) / (1 + B)."""
    y_true = np.asarray(y_true)
    a = _as_seed_rows(y_true, predictions_a)
    b = _as_seed_rows(y_true, predictions_b)
    n = len(y_true)
    if n == 0:
        raise InputError("a paired test needs at least one evaluation example")
    observed = _pooled_difference(metric, y_true, a, b)
    draws = np.random.default_rng(seed).integers(0, n, size=(n_resamples, n))
    null = np.array([_pooled_difference(metric, y_true[d], a[:, d], b[:, d]) for d in draws])
    finite = np.isfinite(null)
    extreme = int(np.sum(np.abs(null[finite] - observed) >= abs(observed)))
    return PairedTest(observed, min(1.0, (1 + extreme) / (1 + int(finite.sum()))), n, n_resamples, "paired bootstrap",
                      float(np.std(null[finite])) if finite.any() else float("nan"))


def seed_item_draws(y_true: np.ndarray, a: np.ndarray, b: np.ndarray, metric: Metric, *, n_resamples: int,
                    seed: int) -> np.ndarray:
    """The resampled differences of `seed_item_bootstrap`: per draw, seeds and examples with replacement."""
    n_seeds, n = a.shape
    rng = np.random.default_rng(seed)
    draws = np.empty(n_resamples)
    for i in range(n_resamples):
        seeds: list[int] = [int(s) for s in np.atleast_1d(rng.integers(0, n_seeds, size=n_seeds))]
        rows = rng.integers(0, n, size=n)
        truth = y_true[rows]
        per_seed = {s: metric(truth, b[s, rows]) - metric(truth, a[s, rows]) for s in set(seeds)}
        draws[i] = np.mean([per_seed[s] for s in seeds])
    return draws


@dataclass(frozen=True)
class SeedItemBootstrap:
    """The crossed seeds x examples bootstrap of a difference between two systems (`seed_item_bootstrap`)."""

    difference: float  # mean over seeds of metric(b_s) - metric(a_s)
    low: float  # percentile interval
    high: float
    p_value: float  # two-sided, shifted form
    n_seeds: int
    n_examples: int
    n_resamples: int


def seed_item_bootstrap(
    y_true: np.ndarray, predictions_a: np.ndarray, predictions_b: np.ndarray, metric: Metric, *,
    n_resamples: int = 2000, seed: int = 0, confidence: float = 0.95,
) -> SeedItemBootstrap:
    """The difference metric(b) - metric(a), averaged over seeds, with both sources of its variance:
    every resample draws the seeds with replacement and, independently, the evaluation examples with
    replacement, the same examples for every drawn seed (seeds and examples are crossed, not nested:
    Owen 2007's pigeonhole bootstrap). The interval is the resamples' percentile interval; p is the
    shifted two-sided bootstrap p, (1 + #{|d* - d| >= |d|}) / (1 + B).

    Unlike a test of the pooled predictions, the seed-to-seed spread widens it; unlike a test over
    seeds alone, the examples' sampling does: with 3 seeds a sign-flip test over seeds cannot go below
    p = 0.25, this one can when every seed agrees and the examples are many."""
    y_true = np.asarray(y_true)
    a = _as_seed_rows(y_true, predictions_a)
    b = _as_seed_rows(y_true, predictions_b)
    if a.shape != b.shape:
        raise ValueError(f"the two prediction arrays differ in shape: {a.shape} and {b.shape}")
    n_seeds, n = a.shape
    if n == 0:
        raise InputError("a paired test needs at least one evaluation example")
    observed = float(np.mean([metric(y_true, b[s]) - metric(y_true, a[s]) for s in range(n_seeds)]))
    draws = seed_item_draws(y_true, a, b, metric, n_resamples=n_resamples, seed=seed)
    finite = draws[np.isfinite(draws)]
    tail = (1 - confidence) / 2
    low, high = (float(v) for v in np.quantile(finite, [tail, 1 - tail])) if finite.size else (float("nan"),) * 2
    extreme = int(np.sum(np.abs(finite - observed) >= abs(observed)))
    return SeedItemBootstrap(observed, low, high, min(1.0, (1 + extreme) / (1 + finite.size)), n_seeds, n, n_resamples)


DETECTABLE_ALPHA, DETECTABLE_POWER = 0.05, 0.80


def detectable_difference(test: PairedTest, *, alpha: float = DETECTABLE_ALPHA, power: float = DETECTABLE_POWER) -> float:
    """The smallest true difference the two-sided `test` detects with probability `power` at level
    `alpha`, in the normal approximation: (z_{1-alpha/2} + z_power) times the statistic's standard
    deviation under the null (its resamples' `null_sd`). For a paired permutation test that spread is
    set by the examples on which the two systems' predictions differ, so this is the power given
    those predictions, before any multiple-testing correction (Holm asks more)."""
    from scipy.stats import norm

    return float((norm.ppf(1 - alpha / 2) + norm.ppf(power)) * test.null_sd)


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values (statsmodels' `multipletests(method="holm")`): sorted
    ascending, p_(i) * (m - i) for i = 0.., made non-decreasing, capped at 1; NaN stays NaN and does
    not count in m."""
    p = np.asarray(p_values, dtype=np.float64)
    adjusted = np.full_like(p, np.nan)
    valid = np.flatnonzero(np.isfinite(p))
    m = len(valid)
    order = valid[np.argsort(p[valid], kind="stable")]
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[index]))
        adjusted[index] = running
    return adjusted


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof 1; 0 for a single value) over seeds."""
    array = np.asarray(values, dtype=np.float64)
    if array.size == 0:
        raise InputError("mean and std need at least one value")
    return float(array.mean()), float(array.std(ddof=1)) if array.size > 1 else 0.0


def holm_unique(p_values: Sequence[float], keys: Sequence[object]) -> tuple[np.ndarray, list[int | None]]:
    """Holm over the distinct hypotheses of a family: members with equal `keys` (the same test, such
    as `layer:L` and `top`, `static` and `layer:0`) count once, the first of them; the others get its
    adjusted p. Returns (adjusted p per member, index of the member each one duplicates or None)."""
    if len(p_values) != len(keys):
        raise ValueError(f"{len(p_values)} p-values for {len(keys)} keys")
    first: dict[object, int] = {}
    duplicate_of: list[int | None] = []
    for index, key in enumerate(keys):
        duplicate_of.append(first.get(key))
        first.setdefault(key, index)
    unique = [i for i, twin in enumerate(duplicate_of) if twin is None]
    adjusted_unique = holm([p_values[i] for i in unique])
    adjusted = np.full(len(p_values), np.nan)
    adjusted[unique] = adjusted_unique
    for index, twin in enumerate(duplicate_of):
        if twin is not None:
            adjusted[index] = adjusted[twin]
    return adjusted, duplicate_of


def difference_of_means(ours: dict[int, float], baseline: dict[int, float]) -> tuple[float, list[int]]:
    """Δ = mean over seeds of `ours` minus mean over seeds of `baseline`, on the seeds both have
    (per-seed scores keyed by seed); returns (Δ, the seeds used). NaN without a common seed."""
    seeds = sorted(set(ours) & set(baseline))
    if not seeds:
        return float("nan"), []
    return float(np.mean([ours[s] for s in seeds]) - np.mean([baseline[s] for s in seeds])), seeds


@dataclass(frozen=True)
class SpearmanInterval:
    rho: float
    low: float  # percentile bootstrap interval
    high: float
    p_value: float  # two-sided, scipy's t approximation
    n: int
    n_resamples: int


def spearman_bootstrap(x: Sequence[float], y: Sequence[float], *, n_resamples: int = 2000, confidence: float = 0.95,
                       seed: int = 0) -> SpearmanInterval:
    """Spearman's rho of (x, y) pairs with a percentile bootstrap interval (pairs drawn with
    replacement; draws where a side is constant are skipped) and scipy's two-sided p."""
    from scipy import stats as scipy_stats

    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    n = len(a)
    if n < 3:
        raise InputError(f"a Spearman correlation needs at least 3 finite pairs, got {n}")
    result = scipy_stats.spearmanr(a, b)
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(n_resamples):
        rows = rng.integers(0, n, size=n)
        if np.ptp(a[rows]) == 0 or np.ptp(b[rows]) == 0:
            continue
        draws.append(scipy_stats.spearmanr(a[rows], b[rows]).statistic)
    tail = (1 - confidence) / 2
    low, high = (np.quantile(draws, [tail, 1 - tail]) if draws else (np.nan, np.nan))
    return SpearmanInterval(float(result.statistic), float(low), float(high), float(result.pvalue), n, len(draws))
