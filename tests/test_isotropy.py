"""Isotropy measures against slow, obviously-correct references and closed-form cases."""

from __future__ import annotations

import itertools
import math

import mpmath
import numpy as np
import pytest
import torch
from IsoScore import IsoScore
from sklearn.cluster import KMeans
from sklearn.decomposition import PCA

from lmgeom.metrics.contextuality import average_cosine
from lmgeom.metrics.isotropy import (
    MomentAccumulator,
    covariance_isotropy,
    cosine_contributions,
    effective_rank,
    isoscore,
    isotropy_report,
    local_isotropy,
    log_partition_isotropy,
    partition_isotropy,
    participation_ratio,
    rogue_dimensions,
    top_pc_variance_share,
)


def anisotropic(n: int = 300, dim: int = 6, *, seed: int = 0, offset: float = 1.0) -> np.ndarray:
    """Gaussian points with distinct per-axis spreads, rotated and shifted off the origin."""
    rng = np.random.default_rng(seed)
    rotation, _ = np.linalg.qr(rng.normal(size=(dim, dim)))
    return (rng.normal(size=(n, dim)) * np.linspace(0.2, 2.0, dim)) @ rotation + offset


# ---------------------------------------------------------------------------------------------
# references


def reference_log_isotropy(W: np.ndarray, *, both_signs: bool) -> float:
    """Ding et al.'s recipe: general eigensolver on W^T W, Python loop over directions, plain exp."""
    _, vectors = np.linalg.eig(W.T @ W)
    vectors = np.real(vectors)
    z_values = []
    for i in range(vectors.shape[1]):
        c = vectors[:, i]
        c = c if c[np.argmax(np.abs(c))] > 0 else -c  # same sign convention as lmgeom
        signs = (1, -1) if both_signs else (1,)
        for sign in signs:
            z_values.append(sum(math.exp(sign * float(w @ c)) for w in W))
    return math.log(min(z_values) / max(z_values))


def mpmath_log_isotropy(W: np.ndarray) -> float:
    """Arbitrary-precision I(W) over +-eigenvectors, for norms where float64 exp overflows."""
    _, vectors = np.linalg.eigh(W.T @ W)
    mpmath.mp.dps = 50
    log_z = []
    for i in range(vectors.shape[1]):
        projections = W @ vectors[:, i]
        for sign in (1, -1):
            log_z.append(mpmath.log(mpmath.fsum(mpmath.exp(mpmath.mpf(sign * float(p))) for p in projections)))
    return float(min(log_z) - max(log_z))


def reference_isoscore(X: np.ndarray) -> float:
    """Rudman et al. 2022, Algorithm 1, from sklearn PCA (variances of the PCA-reoriented points)."""
    reoriented = PCA().fit_transform(X)
    variances = reoriented.var(axis=0, ddof=1)
    n = X.shape[1]
    if len(variances) < n:  # PCA keeps min(N, d) components; the rest have zero variance
        variances = np.concatenate([variances, np.zeros(n - len(variances))])
    normalised = math.sqrt(n) * variances / np.linalg.norm(variances)
    defect = np.linalg.norm(normalised - 1) / math.sqrt(2 * (n - math.sqrt(n)))
    k = ((n - defect**2 * (n - math.sqrt(n))) ** 2) / n**2
    return (n * k - 1) / (n - 1)


# ---------------------------------------------------------------------------------------------
# MomentAccumulator


@pytest.mark.parametrize("offset", [0.0, 1e3])
def test_moment_accumulator_chunks_and_merge_match_numpy(offset):
    X = anisotropic(401, 5, offset=offset)
    chunked = MomentAccumulator()
    for start in range(0, 259, 37):  # seven chunks covering rows 0..258
        chunked.add(X[start : start + 37])
    chunked.merge(MomentAccumulator().add(X[259:300])).merge(MomentAccumulator().add(X[300:]))
    moments = chunked.result()
    assert moments.count == 401
    np.testing.assert_allclose(moments.mean, X.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(moments.covariance(), np.cov(X.T), rtol=1e-9, atol=1e-9)
    diagonal = MomentAccumulator(full_covariance=False).add(X[:100]).merge(MomentAccumulator(full_covariance=False).add(X[100:]))
    np.testing.assert_allclose(diagonal.result().variance(ddof=0), X.var(axis=0), rtol=1e-9)


def test_moment_accumulator_state_dict_round_trip_and_errors():
    X = anisotropic(50, 4)
    accumulator = MomentAccumulator().add(X)
    restored = MomentAccumulator.from_state_dict(accumulator.state_dict())
    np.testing.assert_array_equal(restored.result().covariance(), accumulator.result().covariance())
    with pytest.raises(ValueError, match="dimensions"):
        accumulator.add(np.ones((3, 5)))
    with pytest.raises(ValueError, match="no rows"):
        MomentAccumulator().result()
    with pytest.raises(ValueError, match="at least 2 points"):
        MomentAccumulator().add(X[:1]).result().covariance()
    with pytest.raises(ValueError, match="full-covariance"):
        accumulator.merge(MomentAccumulator(full_covariance=False).add(X))


def test_covariance_isotropy_from_streamed_moments_matches_array_functions():
    X = anisotropic(300, 7)
    streamed = MomentAccumulator().add(X[:123]).merge(MomentAccumulator().add(X[123:])).result()
    measures = covariance_isotropy(streamed.covariance())
    assert measures["isoscore"] == pytest.approx(isoscore(X), abs=1e-12)
    assert measures["effective_rank"] == pytest.approx(effective_rank(X), abs=1e-9)
    assert measures["participation_ratio"] == pytest.approx(participation_ratio(X), abs=1e-9)
    assert measures["top1_variance_share"] == pytest.approx(top_pc_variance_share(X, 1), abs=1e-12)


# ---------------------------------------------------------------------------------------------
# I(W)


@pytest.mark.parametrize("both_signs", [True, False])
@pytest.mark.parametrize("centered", [False, True])
def test_log_partition_isotropy_matches_loop_reference(centered, both_signs):
    X = anisotropic(200, 6, seed=3)
    W = X - X.mean(axis=0) if centered else X
    expected = reference_log_isotropy(W, both_signs=both_signs)
    got = log_partition_isotropy(X, centered, both_signs=both_signs)
    assert got == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert partition_isotropy(X, centered, both_signs=both_signs) == pytest.approx(math.exp(expected), rel=1e-9)


def test_block_size_does_not_change_results(monkeypatch):
    import lmgeom.metrics.isotropy as isotropy_module

    X = anisotropic(500, 5, offset=50.0)
    whole = (log_partition_isotropy(X), log_partition_isotropy(X, True), isoscore(X), effective_rank(X))
    monkeypatch.setattr(isotropy_module, "_BLOCK_ROWS", 7)
    blocked = (log_partition_isotropy(X), log_partition_isotropy(X, True), isoscore(X), effective_rank(X))
    np.testing.assert_allclose(blocked, whole, rtol=1e-10)


def test_log_partition_isotropy_closed_forms():
    dim = 5
    cross_polytope = np.vstack([np.eye(dim), -np.eye(dim)])  # Z(e_i) = 2 cosh(1) + 2 (d - 1) for every axis
    assert log_partition_isotropy(cross_polytope) == pytest.approx(0.0, abs=1e-12)
    # Points on one line a_j v: Z(+-v) = sum exp(+-a_j); every orthogonal direction gives Z = N.
    a = np.array([0.3, 1.2, -0.4, 2.0, 0.9])
    v = np.array([1.0, 2.0, 2.0]) / 3.0
    z = [np.exp(a).sum(), np.exp(-a).sum(), float(len(a))]
    assert log_partition_isotropy(np.outer(a, v)) == pytest.approx(math.log(min(z) / max(z)), rel=1e-12)


def test_log_partition_isotropy_large_norms_finite_and_exact():
    X = anisotropic(150, 5, seed=7, offset=2.0) * 1e3  # norms in the thousands, like decoder LLM layers
    with np.errstate(over="ignore"):
        assert not np.isfinite(np.exp(X @ np.linalg.eigh(X.T @ X)[1]).sum(axis=0)).all()  # plain exp overflows
    got = log_partition_isotropy(X)
    assert np.isfinite(got) and got < -700
    assert got == pytest.approx(mpmath_log_isotropy(X), rel=1e-9)
    assert partition_isotropy(X) == 0.0  # exp underflows: log I is the number to report


# ---------------------------------------------------------------------------------------------
# IsoScore and spectra


@pytest.mark.parametrize("shape,seed", [((300, 6), 0), ((50, 20), 1), ((40, 60), 2)])
def test_isoscore_matches_package_and_paper_reference(shape, seed):
    X = anisotropic(*shape, seed=seed)
    # The package takes points as (n_points, dim) and computes sqrt(dim) in float32, hence 1e-7.
    assert isoscore(X) == pytest.approx(float(IsoScore.IsoScore(X)), abs=1e-7)
    assert isoscore(X) == pytest.approx(reference_isoscore(X), abs=1e-10)


def test_isoscore_known_cases():
    rng = np.random.default_rng(0)
    assert isoscore(rng.normal(size=(20000, 10))) > 0.99
    line = np.outer(rng.normal(size=100), rng.normal(size=8))
    assert isoscore(line) == pytest.approx(0.0, abs=1e-9)
    assert np.isnan(isoscore(np.ones((5, 3))))  # identical points use no direction
    with pytest.raises(ValueError, match="2 dimensions"):
        isoscore(rng.normal(size=(10, 1)))


def test_effective_rank_participation_ratio_and_variance_share_against_references():
    X = anisotropic(120, 8, seed=4)
    for centered in (True, False):
        W = X - X.mean(axis=0) if centered else X
        singular = np.linalg.svd(W, compute_uv=False)
        p = singular / singular.sum()
        assert effective_rank(X, centered=centered) == pytest.approx(math.exp(-(p * np.log(p)).sum()), rel=1e-10)
    eigenvalues = np.linalg.eigvalsh(np.cov(X.T))
    assert participation_ratio(X) == pytest.approx(eigenvalues.sum() ** 2 / (eigenvalues**2).sum(), rel=1e-10)
    ratios = PCA().fit(X).explained_variance_ratio_
    assert top_pc_variance_share(X, 3) == pytest.approx(ratios[:3].sum(), rel=1e-10)
    # Closed forms: orthonormal rows have equal singular values; an isotropic covariance has PR = d.
    assert effective_rank(np.eye(6), centered=False) == pytest.approx(6.0, rel=1e-12)
    assert participation_ratio(np.vstack([np.eye(4), -np.eye(4)])) == pytest.approx(4.0, rel=1e-12)


# ---------------------------------------------------------------------------------------------
# cosines and rogue dimensions


def test_cosine_contributions_match_pair_loop_and_sum_to_average_cosine():
    X = anisotropic(25, 5, seed=5)
    X[3] = 0.0  # a zero row has no direction and is left out
    rows = [x / np.linalg.norm(x) for x in X if np.linalg.norm(x) > 0]
    pairs = [(u, v) for u, v in itertools.permutations(rows, 2)]
    expected = np.mean([u * v for u, v in pairs], axis=0)
    contributions = cosine_contributions(X)
    np.testing.assert_allclose(contributions, expected, rtol=1e-10, atol=1e-12)
    assert contributions.sum() == pytest.approx(np.mean([u @ v for u, v in pairs]), rel=1e-10)
    assert contributions.sum() == pytest.approx(average_cosine(X), rel=1e-12)


def test_rogue_dimensions_find_the_dominant_dimension():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 10))
    X[:, 7] += 30.0  # one rogue dimension with a large common value
    rogue = rogue_dimensions(X, top_k=1)
    assert rogue.top_dimensions.tolist() == [7]
    assert rogue.average_cosine > 0.9 and rogue.top_share > 0.9
    assert rogue.average_cosine_without_top == pytest.approx(average_cosine(np.delete(X, 7, axis=1)), rel=1e-12)
    assert abs(rogue.average_cosine_without_top) < 0.05 and abs(rogue.average_cosine_standardized) < 0.05
    with pytest.raises(ValueError, match="top_k"):
        rogue_dimensions(X, top_k=10)


# ---------------------------------------------------------------------------------------------
# local isotropy and the report


def test_local_isotropy_per_cluster_matches_cluster_measures():
    rng = np.random.default_rng(1)
    centres = np.array([[40.0, 0, 0, 0], [0, 40.0, 0, 0], [0, 0, 40.0, 0]])
    X = np.vstack([c + rng.normal(size=(n, 4)) for c, n in zip(centres, (60, 90, 150))])
    local = local_isotropy(X, n_clusters=3, seed=0)
    labels = KMeans(n_clusters=3, random_state=0, n_init="auto").fit_predict(X)
    assert sorted(r["size"] for r in local.per_cluster) == [60, 90, 150]
    for record in local.per_cluster:
        members = X[labels == record["cluster"]]
        assert record["isoscore"] == pytest.approx(isoscore(members), abs=1e-12)
        assert record["average_cosine"] == pytest.approx(average_cosine(members), abs=1e-12)
        assert record["log_partition_isotropy_centered"] == pytest.approx(log_partition_isotropy(members, True), rel=1e-12)
        assert record["isoscore"] > 0.9  # each blob is an isotropic Gaussian around its centre
    sizes = np.array([r["size"] for r in local.per_cluster])
    weighted = np.average([r["isoscore"] for r in local.per_cluster], weights=sizes)
    assert local.weighted_mean["isoscore"] == pytest.approx(weighted, rel=1e-12)
    assert isoscore(X) < 0.7  # globally the three blobs are far from isotropic
    with pytest.raises(ValueError, match="n_clusters"):
        local_isotropy(X[:2], n_clusters=3)


def test_isotropy_report_agrees_with_the_array_functions():
    X = anisotropic(500, 12, seed=6)
    report = isotropy_report(torch.from_numpy(X), max_rows=None)
    assert report["n_points"] == report["n_used"] == 500 and report["dim"] == 12
    assert report["log_partition_isotropy"] == pytest.approx(log_partition_isotropy(X), rel=1e-10)
    assert report["log_partition_isotropy_centered"] == pytest.approx(log_partition_isotropy(X, True), rel=1e-10)
    assert report["isoscore"] == pytest.approx(isoscore(X), abs=1e-12)
    assert report["average_cosine"] == pytest.approx(average_cosine(X), rel=1e-12)
    assert report["effective_rank"] == pytest.approx(effective_rank(X), rel=1e-10)
    assert report["top10_variance_share"] == pytest.approx(top_pc_variance_share(X, 10), rel=1e-12)
    subsampled = isotropy_report(X, max_rows=100, seed=3)
    assert subsampled["n_used"] == 100 and subsampled == isotropy_report(X, max_rows=100, seed=3)
    assert subsampled["isoscore"] != report["isoscore"]


def test_bad_input_is_a_clear_error():
    X = anisotropic(20, 3)
    X[4, 1] = np.nan
    with pytest.raises(ValueError, match="NaN or inf.*row 4"):
        isoscore(X)
    with pytest.raises(ValueError, match="2-D"):
        log_partition_isotropy(np.ones(5))
    with pytest.raises(ValueError, match="at least 2 points"):
        log_partition_isotropy(np.ones((1, 3)), True)
