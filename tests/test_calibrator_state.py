"""Moment calibrators keep their incremental state through save/load and never touch the caller's accumulator."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lmgeom.calibrate import AllButTheTop, Standardize, Whitening
from lmgeom.calibrate._base import Calibrator
from lmgeom.metrics.isotropy import MomentAccumulator

CALIBRATORS = [AllButTheTop(n_components=2), Whitening(), Whitening(zca=True, n_components=None), Standardize()]


def _rows(n: int, *, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rotation, _ = np.linalg.qr(rng.normal(size=(8, 8)))
    return (rng.normal(size=(n, 8)) * np.geomspace(0.2, 5.0, 8)) @ rotation + 4.0


def _fitted_attributes(estimator: Calibrator) -> dict[str, object]:
    return {name: value for name, value in vars(estimator).items() if name.endswith("_") and not name.startswith("_")}


def _assert_same_fit(actual: Calibrator, expected: Calibrator) -> None:
    got, want = _fitted_attributes(actual), _fitted_attributes(expected)
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        np.testing.assert_allclose(np.asarray(got[name], dtype=float), np.asarray(value, dtype=float), rtol=1e-12, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("estimator", CALIBRATORS, ids=repr)
@pytest.mark.parametrize("first", ["fit", "partial_fit"])
def test_partial_fit_after_load_continues_the_saved_fit(estimator: Calibrator, first: str, tmp_path: Path) -> None:
    X = _rows(1000, seed=1)
    started = estimator.__class__(**estimator.get_params())
    getattr(started, first)(X[:500])
    loaded = type(started).load(started.save(tmp_path / "calibrator"))
    loaded.partial_fit(X[500:])
    assert loaded.n_samples_seen_ == 1000
    _assert_same_fit(loaded, estimator.__class__(**estimator.get_params()).fit(X))
    np.testing.assert_allclose(loaded.transform(X[:50]), estimator.__class__(**estimator.get_params()).fit(X).transform(X[:50]), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("estimator", CALIBRATORS, ids=repr)
def test_fit_moments_leaves_the_callers_accumulator_unchanged(estimator: Calibrator) -> None:
    X = _rows(300, seed=2)
    accumulator = MomentAccumulator(full_covariance=not isinstance(estimator, Standardize)).add(X[:200])
    count, mean, scatter = accumulator.count, accumulator.mean.copy(), accumulator.scatter.copy()
    calibrator = estimator.__class__(**estimator.get_params()).fit_moments(accumulator)
    calibrator.partial_fit(X[200:])
    assert (accumulator.count, calibrator.n_samples_seen_) == (count, 300)
    assert np.array_equal(accumulator.mean, mean) and np.array_equal(accumulator.scatter, scatter)
    _assert_same_fit(calibrator, estimator.__class__(**estimator.get_params()).fit(X))


def test_saved_file_holds_the_moment_state_without_pickle(tmp_path: Path) -> None:
    X = _rows(100, seed=3)
    path = Whitening().fit(X).save(tmp_path / "w")
    with np.load(path, allow_pickle=False) as arrays:
        assert int(arrays["moments__count"]) == 100
        np.testing.assert_allclose(arrays["moments__mean"], X.mean(axis=0), rtol=1e-12)
        np.testing.assert_allclose(arrays["moments__scatter"], (X - X.mean(axis=0)).T @ (X - X.mean(axis=0)), rtol=1e-10)
