from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats

from lmgeom.evaluate.stats import holm, mean_std, paired_bootstrap_test, paired_permutation_test
from lmgeom.evaluate.tasks import accuracy, matthews


def holm_by_definition(p: list[float]) -> list[float]:
    """statsmodels' multipletests(method="holm") written plainly: step down, then running maximum."""
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    adjusted = [0.0] * m
    previous = 0.0
    for rank, i in enumerate(order):
        previous = max(previous, min(1.0, (m - rank) * p[i]))
        adjusted[i] = previous
    return adjusted


def test_holm_matches_its_definition() -> None:
    p = [0.01, 0.04, 0.03, 0.005, 0.5]
    assert holm(p).tolist() == pytest.approx(holm_by_definition(p))
    # by hand: sorted 0.005*5=0.025, 0.01*4=0.04, 0.03*3=0.09, 0.04*2=0.08 -> 0.09, 0.5*1=0.5
    assert holm(p).tolist() == pytest.approx([0.04, 0.09, 0.09, 0.025, 0.5])
    with_nan = holm([0.01, float("nan"), 0.02])
    assert np.isnan(with_nan[1]) and with_nan[[0, 2]].tolist() == pytest.approx([0.02, 0.02])


def test_exact_permutation_test_equals_scipy_for_matthews() -> None:
    rng = np.random.default_rng(3)
    truth = rng.integers(0, 2, 10)
    a = np.where(rng.random(10) < 0.55, truth, 1 - truth)
    b = np.where(rng.random(10) < 0.9, truth, 1 - truth)
    ours = paired_permutation_test(truth, a, b, matthews, n_resamples=1024)
    assert ours.method == "exact permutation" and ours.n_resamples == 2**10
    reference = stats.permutation_test(
        (a, b), lambda x, y: matthews(truth, y) - matthews(truth, x), permutation_type="samples",
        vectorized=False, n_resamples=np.inf, alternative="two-sided")
    assert ours.difference == pytest.approx(reference.statistic)
    assert ours.p_value == pytest.approx(reference.pvalue)


def test_pooled_seeds_swap_an_example_in_every_seed() -> None:
    rng = np.random.default_rng(4)
    truth = rng.integers(0, 2, 8)
    a = np.where(rng.random((3, 8)) < 0.6, truth, 1 - truth)
    b = np.where(rng.random((3, 8)) < 0.8, truth, 1 - truth)
    ours = paired_permutation_test(truth, a, b, accuracy, n_resamples=256)

    def pooled(x: np.ndarray, y: np.ndarray) -> float:
        return accuracy(np.tile(truth, 3), y.ravel()) - accuracy(np.tile(truth, 3), x.ravel())

    observed = pooled(a, b)
    null = [pooled(np.where(s, b, a), np.where(s, a, b)) for s in itertools.product([False, True], repeat=8)]
    expected = np.mean([abs(d) >= abs(observed) - 1e-12 for d in null])
    assert ours.difference == pytest.approx(observed) and ours.p_value == pytest.approx(expected)


def test_monte_carlo_permutation_and_bootstrap_agree_on_clear_and_null_cases() -> None:
    rng = np.random.default_rng(5)
    truth = rng.integers(0, 2, 400)
    weak = np.where(rng.random(400) < 0.6, truth, 1 - truth)
    strong = np.where(rng.random(400) < 0.9, truth, 1 - truth)
    for test in (paired_permutation_test, paired_bootstrap_test):
        clear = test(truth, weak, strong, matthews, n_resamples=500, seed=1)
        assert clear.p_value == pytest.approx(1 / 501)  # no resample as extreme
        same = test(truth, weak, weak, matthews, n_resamples=200, seed=1)
        assert same.difference == 0.0 and same.p_value == 1.0
    again = paired_permutation_test(truth, weak, strong, matthews, n_resamples=500, seed=1)
    assert again == paired_permutation_test(truth, weak, strong, matthews, n_resamples=500, seed=1)


def test_bad_shapes_and_mean_std() -> None:
    with pytest.raises(ValueError, match="shape"):
        paired_permutation_test(np.zeros(3), np.zeros(4), np.zeros(4), accuracy)
    assert mean_std([0.70, 0.74, 0.72]) == pytest.approx((0.72, np.std([0.70, 0.74, 0.72], ddof=1)))
    assert mean_std([0.5]) == (0.5, 0.0)


def test_detectable_difference_from_the_null_spread_in_closed_form() -> None:
    """Accuracy, one seed, exact sign flips: the null statistic is sum(e_i d_i) / n with d_i in {-1, 0, 1}
    the per-example difference, so its standard deviation is sqrt(#discordant) / n, and the detectable
    difference at 80 % power and 0.05 is (1.95996 + 0.84162) times that. A Monte Carlo of the power at
    that difference (a normal statistic of that spread) comes out near 0.80."""
    from lmgeom.evaluate.stats import detectable_difference

    rng = np.random.default_rng(5)
    truth = rng.integers(0, 2, 12)
    a = np.where(rng.random(12) < 0.7, truth, 1 - truth)
    b = np.where(rng.random(12) < 0.7, truth, 1 - truth)
    result = paired_permutation_test(truth, a, b, accuracy, n_resamples=2**12)
    discordant = int(np.sum((a == truth) != (b == truth)))
    assert result.method == "exact permutation" and discordant > 0
    assert result.null_sd == pytest.approx(np.sqrt(discordant) / 12, rel=1e-12)
    detectable = detectable_difference(result)
    assert detectable == pytest.approx((stats.norm.ppf(0.975) + stats.norm.ppf(0.8)) * np.sqrt(discordant) / 12, rel=1e-12)
    draws = np.random.default_rng(0).normal(detectable, result.null_sd, 200_000)
    assert np.mean(np.abs(draws) > stats.norm.ppf(0.975) * result.null_sd) == pytest.approx(0.80, abs=0.005)
    same = paired_permutation_test(truth, a, a, accuracy, n_resamples=2**12)
    assert same.null_sd == 0 and detectable_difference(same) == 0  # identical predictions: no spread


def test_seed_item_draws_match_the_exact_resampling_distribution() -> None:
    from lmgeom.evaluate.stats import seed_item_draws

    y = np.array([1, 0, 1])
    a = np.array([[1, 1, 1], [0, 0, 1]])
    b = np.array([[1, 0, 1], [1, 0, 0]])
    exact = []  # every (seeds, examples) draw, equally likely: 2**2 x 3**3
    for seeds in itertools.product(range(2), repeat=2):
        for rows in itertools.product(range(3), repeat=3):
            r = list(rows)
            exact.append(np.mean([accuracy(y[r], b[s, r]) - accuracy(y[r], a[s, r]) for s in seeds]))
    draws = seed_item_draws(y, a, b, accuracy, n_resamples=20000, seed=3)
    assert draws.mean() == pytest.approx(np.mean(exact), abs=0.01)
    assert draws.std() == pytest.approx(np.std(exact), rel=0.03)


def test_seed_item_bootstrap_widens_with_the_seed_spread_and_passes_the_sign_flip_floor() -> None:
    from lmgeom.evaluate.stats import seed_item_bootstrap

    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, size=2000)
    base = np.where(rng.random((3, 2000)) < 0.70, y, 1 - y)
    better = np.where(rng.random((3, 2000)) < 0.78, y, 1 - y)  # every seed about +0.08
    agree = seed_item_bootstrap(y, base, better, accuracy, n_resamples=2000, seed=0)
    assert agree.p_value < 0.01 and agree.low > 0  # below the 0.25 that a sign-flip test over 3 seeds can reach
    assert agree.difference == pytest.approx(np.mean([accuracy(y, better[s]) - accuracy(y, base[s]) for s in range(3)]))
    # seeds that disagree: +0.08, -0.08, +0.08 -> the seed resampling puts 0 inside the interval
    mixed = better.copy()
    mixed[1] = np.where(rng.random(2000) < 0.62, y, 1 - y)
    spread = seed_item_bootstrap(y, base, mixed, accuracy, n_resamples=2000, seed=0)
    assert spread.low < 0 < spread.high and spread.p_value > 0.05
    # one seed, identical in both: only the examples' sampling, as a paired bootstrap of the mean difference
    single = seed_item_bootstrap(y, base[:1], better[:1], accuracy, n_resamples=4000, seed=1)
    d = (better[0] == y).astype(float) - (base[0] == y).astype(float)
    half_width = 1.96 * d.std() / np.sqrt(len(d))
    assert (single.high - single.low) / 2 == pytest.approx(half_width, rel=0.1)
