"""FlowCalibrator: a row's output does not depend on which other rows are transformed with it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lmgeom.calibrate import FlowCalibrator


@pytest.fixture(scope="module")
def fitted_flow() -> tuple[FlowCalibrator, np.ndarray]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rng = np.random.default_rng(3)
        X = (rng.normal(size=(600, 24)) * np.geomspace(0.05, 4.0, 24) + 2.0).astype(np.float32)
        flow = FlowCalibrator(n_steps=2, hidden_size=32, n_epochs=2, batch_size=128, device="cpu").fit(X)
    finally:
        torch.set_num_threads(threads)
    return flow, X


def _subsets(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [np.array([0]), np.array([n - 1]), np.arange(7), np.arange(3, 40), np.arange(1, n, 2), rng.permutation(n)]


def test_transform_of_row_subsets_equals_full_transform_bit_for_bit(fitted_flow: tuple[FlowCalibrator, np.ndarray]) -> None:
    flow, X = fitted_flow
    full = flow.transform(X)
    assert full.dtype == np.float32
    for rows in _subsets(len(X)):
        assert np.array_equal(flow.transform(X[rows]), full[rows]), f"rows {rows[:5]}... differ"
    for single in range(0, len(X), 37):
        assert np.array_equal(flow.transform(X[single : single + 1]), full[single : single + 1])


def test_other_methods_are_subset_invariant(fitted_flow: tuple[FlowCalibrator, np.ndarray]) -> None:
    flow, X = fitted_flow
    Z = flow.transform(X)
    full = {"log_det": flow.log_det(X), "score_samples": flow.score_samples(X), "inverse_transform": flow.inverse_transform(Z)}
    for rows in _subsets(len(X)):
        # float64 results of a float64 flow: batch shape changes them by a few ulp at most
        np.testing.assert_allclose(flow.log_det(X[rows]), full["log_det"][rows], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(flow.score_samples(X[rows]), full["score_samples"][rows], rtol=1e-12, atol=1e-12)
        assert np.array_equal(flow.inverse_transform(Z[rows]), full["inverse_transform"][rows])


def test_loaded_flow_transforms_identically(fitted_flow: tuple[FlowCalibrator, np.ndarray], tmp_path) -> None:
    flow, X = fitted_flow
    loaded = FlowCalibrator.load(flow.save(tmp_path / "flow"))
    assert np.array_equal(loaded.transform(X), flow.transform(X))
    assert np.array_equal(loaded.transform(X[5:6]), flow.transform(X)[5:6])
