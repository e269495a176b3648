"""IsoScore* (Rudman & Eickhoff 2024): the defining formula, the IsoScore package, closed forms, gradients."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from IsoScore import IsoScore as isoscore_package

from lmgeom.metrics.isotropy import isoscore
from lmgeom.metrics.isoscore_star import covariance_of, isoscore_star, isoscore_star_torch


def isoscore_star_reference(X: np.ndarray, C0: np.ndarray, zeta: float) -> float:
    """The paper's Algorithm 1 step by step, in plain numpy."""
    n = X.shape[1]
    sigma_zeta = (1 - zeta) * np.cov(X.T) + zeta * C0  # steps 1-2: covariance, shrinkage
    eigenvalues = np.linalg.svd(sigma_zeta, compute_uv=False)  # step 3 (PSD: singular values = eigenvalues)
    normalised = math.sqrt(n) * eigenvalues / np.linalg.norm(eigenvalues)  # step 4
    defect = np.linalg.norm(normalised - np.ones(n)) / math.sqrt(2 * (n - math.sqrt(n)))  # step 5
    phi = (n - defect**2 * (n - math.sqrt(n))) ** 2 / n**2  # step 6: fraction of dimensions used
    return (n * phi - 1) / (n - 1)  # step 7


def anisotropic(n: int, dim: int, *, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rotation, _ = np.linalg.qr(rng.normal(size=(dim, dim)))
    return (rng.normal(size=(n, dim)) * np.geomspace(0.2, 4.0, dim)) @ rotation + 1.5


@pytest.mark.parametrize("zeta", [0.0, 0.2, 0.7, 1.0])
def test_matches_the_defining_formula(zeta):
    X = anisotropic(40, 12, seed=0)
    C0 = covariance_of(anisotropic(500, 12, seed=1))
    expected = isoscore_star_reference(X, C0, zeta)
    assert isoscore_star(X, C0, zeta=zeta) == pytest.approx(expected, abs=1e-12)
    value = isoscore_star_torch(torch.tensor(X), torch.tensor(C0), zeta=zeta)
    assert value.dtype == torch.float64 and value.item() == pytest.approx(expected, abs=1e-12)


def test_agrees_with_the_isoscore_package():
    """IsoScore 2.0.1 ships IsoScore_star; with zeta = 0 it, its IsoScore and lmgeom's isoscore coincide."""
    X = anisotropic(60, 10, seed=2)
    C0 = covariance_of(anisotropic(400, 10, seed=3))
    for zeta in (0.0, 0.2, 0.5):
        package = isoscore_package.IsoScore_star(X, torch.tensor(C0), zeta).item()
        # the package takes sqrt of an int64 tensor, which torch does in float32: agreement to ~1e-7
        assert isoscore_star(X, C0, zeta=zeta) == pytest.approx(package, abs=1e-6)
    plain = isoscore_package.IsoScore(X).item()
    assert isoscore_star(X, zeta=0.0) == pytest.approx(plain, abs=1e-6)
    assert isoscore_star(X, zeta=0.0) == pytest.approx(isoscore(X), abs=1e-12)


def _axes_cloud(dim: int, k: int, scale: float) -> np.ndarray:
    """+-scale e_i for i < k: mean 0, sample covariance exactly 2 scale^2 / (2k - 1) on the first k axes."""
    rows = [sign * scale * np.eye(dim)[i] for i in range(k) for sign in (1, -1)]
    return np.array(rows)


def test_closed_forms():
    dim = 8
    # k equally used dimensions out of d: IsoScore = (k - 1) / (d - 1); one dimension is the minimum, 0.
    for k in (1, 3, 8):
        assert isoscore_star(_axes_cloud(dim, k, 2.0), zeta=0.0) == pytest.approx((k - 1) / (dim - 1), abs=1e-12)
    # Shrinkage towards a C0 that carries the batch's missing dimensions with matched variance fills the
    # space exactly: (1 - zeta) v on the first k axes equals zeta c on the rest -> IsoScore* = 1.
    k, zeta = 3, 0.25
    batch_variance = 2 * 2.0**2 / (2 * k - 1)
    C0 = np.diag([0.0] * k + [(1 - zeta) * batch_variance / zeta] * (dim - k))
    assert isoscore_star(_axes_cloud(dim, k, 2.0), C0, zeta=zeta) == pytest.approx(1.0, abs=1e-12)
    # zeta = 1 measures C0 alone: here d - k equally used dimensions.
    assert isoscore_star(_axes_cloud(dim, k, 2.0), C0, zeta=1.0) == pytest.approx((dim - k - 1) / (dim - 1), abs=1e-12)
    # An isotropic Gaussian scores near 1, with or without shrinkage towards its own covariance.
    gaussian = np.random.default_rng(4).normal(size=(20_000, dim))
    assert isoscore_star(gaussian, covariance_of(gaussian), zeta=0.2) > 0.995
    assert isoscore_star(gaussian, zeta=0.0) > 0.995


def test_shrinkage_moves_small_batches_towards_the_population():
    """Batches of 20 points in 50 dimensions: IsoScore reads the 30 directions a batch cannot span as
    anisotropy; IsoScore* (zeta = 0.2, C0 from a large sample) lands nearer the population's score."""
    rng = np.random.default_rng(5)
    spreads = np.geomspace(0.3, 3.0, 50)
    population = rng.normal(size=(5000, 50)) * spreads
    C0, target = covariance_of(population), isoscore(population)
    batches = [rng.normal(size=(20, 50)) * spreads for _ in range(10)]
    gap_plain = np.mean([target - isoscore(batch) for batch in batches])
    gap_star = np.mean([target - isoscore_star(batch, C0, zeta=0.2) for batch in batches])
    assert 0 < gap_star < gap_plain - 0.03


def test_gradients_flow():
    torch.manual_seed(0)
    points = torch.randn(12, 5, dtype=torch.float64) * torch.tensor([3.0, 1.0, 0.5, 0.2, 0.1], dtype=torch.float64)
    points.requires_grad_(True)
    C0 = torch.eye(5, dtype=torch.float64) * 0.7
    assert torch.autograd.gradcheck(lambda p: isoscore_star_torch(p, C0, zeta=0.2), (points,))
    value = isoscore_star_torch(points.float(), C0.float(), zeta=0.2)
    assert value.dtype == torch.float32
    # One gradient step up the score raises it: the penalty can steer a representation.
    score = isoscore_star_torch(points, C0, zeta=0.2)
    (gradient,) = torch.autograd.grad(score, points)
    assert isoscore_star_torch(points + 0.05 * gradient, C0, zeta=0.2) > score


def test_bad_input():
    X = anisotropic(10, 4, seed=6)
    with pytest.raises(ValueError, match="needs the shrinkage covariance C0"):
        isoscore_star(X, zeta=0.2)
    with pytest.raises(ValueError, match=r"must be \(4, 4\)"):
        isoscore_star(X, np.eye(3), zeta=0.2)
    with pytest.raises(ValueError, match=r"zeta must be in \[0, 1\]"):
        isoscore_star_torch(torch.tensor(X), torch.eye(4), zeta=1.5)
    with pytest.raises(ValueError, match="n_points >= 2"):
        isoscore_star_torch(torch.zeros(1, 4), zeta=0.0)
