"""Conceptor negation (Liu, Ungar & Sedoc 2019): scikit-learn conformance, the paper's formula, CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from sklearn.utils.estimator_checks import parametrize_with_checks
from typer.testing import CliRunner

from lmgeom.calibrate import METHODS, ConceptorNegation, load_calibrator, make_calibrator
from lmgeom.cli.main import app
from lmgeom.store import write_store_from_arrays


def anisotropic(n: int, dim: int, *, seed: int, offset: float = 2.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rotation, _ = np.linalg.qr(rng.normal(size=(dim, dim)))
    return (rng.normal(size=(n, dim)) * np.geomspace(0.1, 3.0, dim)) @ rotation + offset


def conceptor_negation_reference(X: np.ndarray, alpha: float) -> np.ndarray:
    """The paper's Algorithm 1 as written: R = sum of x x^T over n, C = R (R + alpha^-2 I)^-1, x -> (I - C) x."""
    n, dim = X.shape
    R = np.zeros((dim, dim))
    for x in X:
        R += np.outer(x, x)
    R /= n
    C = R @ np.linalg.inv(R + alpha**-2 * np.eye(dim))
    negation = np.eye(dim) - C
    return np.array([negation @ x for x in X])


@parametrize_with_checks([ConceptorNegation(), ConceptorNegation(alpha=0.5)])
def test_sklearn_compatible(estimator, check):
    check(estimator)


@pytest.mark.parametrize("alpha", [0.5, 2.0, 10.0])
@pytest.mark.parametrize("offset", [0.0, 5.0])
def test_matches_the_papers_formula(alpha, offset):
    X = anisotropic(120, 7, seed=1, offset=offset)
    fitted = ConceptorNegation(alpha=alpha).fit(X)
    np.testing.assert_allclose(fitted.transform(X), conceptor_negation_reference(X, alpha), atol=1e-10)
    np.testing.assert_allclose(fitted.inverse_transform(fitted.transform(X)), X, atol=1e-9)


def test_closed_form_on_orthogonal_axes():
    """Points +-a e1 and +-b e2: R = diag(a^2/2, b^2/2, 0), so I - C scales axis i by 1 / (1 + alpha^2 R_ii)."""
    a, b, alpha = 3.0, 0.5, 2.0
    X = np.array([[a, 0, 0], [-a, 0, 0], [0, b, 0], [0, -b, 0]], dtype=np.float64)
    fitted = ConceptorNegation(alpha=alpha).fit(X)
    expected = np.diag([1 / (1 + alpha**2 * a**2 / 2), 1 / (1 + alpha**2 * b**2 / 2), 1.0])
    np.testing.assert_allclose(fitted.negation_matrix_, expected, atol=1e-12)
    np.testing.assert_allclose(fitted.correlation_eigenvalues_, [a**2 / 2, b**2 / 2, 0.0], atol=1e-12)


def test_streams_and_saves(tmp_path):
    X = anisotropic(200, 5, seed=2)
    streamed = ConceptorNegation()
    for chunk in np.array_split(X, 7):
        streamed.partial_fit(chunk)
    whole = ConceptorNegation().fit(X)
    np.testing.assert_allclose(streamed.negation_matrix_, whole.negation_matrix_, atol=1e-12)
    loaded = load_calibrator(whole.save(tmp_path / "cn"))
    assert isinstance(loaded, ConceptorNegation) and loaded.alpha == 2.0
    np.testing.assert_array_equal(loaded.transform(X), whole.transform(X))
    tensor = whole.transform(torch.tensor(X, dtype=torch.float32))
    assert isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float32


def test_registered_by_name_and_bad_alpha():
    assert METHODS["conceptor"] is ConceptorNegation
    assert isinstance(make_calibrator("conceptor"), ConceptorNegation)
    with pytest.raises(ValueError, match="alpha .* must be a finite number > 0"):
        ConceptorNegation(alpha=0.0).fit(anisotropic(20, 3, seed=0))


def test_cli_calibrate_accepts_conceptor(tmp_path):
    words = [[f"w{(s * 5 + i) % 17}" for i in range(6)] for s in range(30)]
    layers = [anisotropic(180, 8, seed=layer) for layer in range(2)]
    store = write_store_from_arrays(tmp_path / "store", layers, words)
    result = CliRunner().invoke(app, ["calibrate", str(store.path), "--methods", "conceptor", "--layers", "1"])
    assert result.exit_code == 0, result.output
    records = json.loads((store.path / "calibration.json").read_text())["records"]
    by_measure = {r["measure"]: r for r in records if r["method"] == "conceptor"}
    # Damping the high-variance directions raises the IsoScore of these anisotropic points.
    assert by_measure["isoscore"]["after"] > by_measure["isoscore"]["before"]
    saved = load_calibrator(store.path / "calibrators" / "conceptor-L1.npz")
    X = np.asarray(store.layer(1)[:], dtype=np.float64)
    np.testing.assert_allclose(saved.transform(X), conceptor_negation_reference(X, 2.0), atol=1e-8)
