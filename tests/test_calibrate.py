"""Calibrators: scikit-learn conformance, references, streaming, persistence, store driver and CLI."""

from __future__ import annotations

import json
import warnings
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.cluster import KMeans
from sklearn.decomposition import PCA
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks
from typer.testing import CliRunner

from lmgeom.calibrate import (
    AllButTheTop,
    ClusterIsotropy,
    FlowCalibrator,
    Standardize,
    Whitening,
    load_calibrator,
)
from lmgeom.calibrate.conceptor import ConceptorNegation
from lmgeom.calibrate.linear import default_abtt_components
from lmgeom.cli.main import app
from lmgeom.errors import InputError
from lmgeom.metrics.contextuality import average_cosine
from lmgeom.metrics.isotropy import MomentAccumulator, isoscore
from lmgeom.stages import calibrate_store, fit_store
from lmgeom.stages.calibration import CalibrationOptions
from lmgeom.store import write_store_from_arrays

SMALL_FLOW = dict(n_steps=2, hidden_size=16, n_epochs=3, batch_size=64)


pytestmark = pytest.mark.usefixtures("single_torch_thread")


def anisotropic(n: int = 400, dim: int = 6, *, seed: int = 0, offset: float = 3.0) -> np.ndarray:
    """Rotated Gaussian with spreads 0.1..3 around a common offset: high average cosine, low IsoScore."""
    rng = np.random.default_rng(seed)
    rotation, _ = np.linalg.qr(rng.normal(size=(dim, dim)))
    return (rng.normal(size=(n, dim)) * np.geomspace(0.1, 3.0, dim)) @ rotation + offset


# ---------------------------------------------------------------------------------------------
# scikit-learn conformance: every check passes, none is skipped as an expected failure


@parametrize_with_checks(
    [
        AllButTheTop(),
        Whitening(),
        Whitening(zca=True),
        Standardize(),
        ClusterIsotropy(n_clusters=3, n_components=2),
        FlowCalibrator(**SMALL_FLOW),
    ]
)
def test_sklearn_compatible(estimator, check):
    check(estimator)


# ---------------------------------------------------------------------------------------------
# references


def test_all_but_the_top_matches_pca_loop_reference():
    X = anisotropic(300, 8)
    fitted = AllButTheTop(n_components=2).fit(X)
    pca = PCA(n_components=2).fit(X)
    expected = []
    for x in X:  # Mu & Viswanath, Algorithm 1, point by point
        centred = x - X.mean(axis=0)
        expected.append(centred - sum((u @ centred) * u for u in pca.components_))
    np.testing.assert_allclose(fitted.transform(X), np.array(expected), atol=1e-10)
    assert [default_abtt_components(d) for d in (1, 49, 50, 149, 150, 250, 384, 768, 4096)] == [1, 1, 1, 1, 2, 3, 4, 8, 41]
    assert AllButTheTop().fit(anisotropic(300, 160)).n_components_ == 2


def test_whitening_matches_cov_svd_reference():
    X = anisotropic(300, 5)
    u, s, _ = np.linalg.svd(np.cov(X.T))  # Su et al.'s recipe
    reference = (X - X.mean(axis=0)) @ (u / np.sqrt(s))
    got = Whitening().fit(X).transform(X)
    signs = np.sign((got * reference).sum(axis=0))  # eigenvector signs are arbitrary
    np.testing.assert_allclose(got * signs, reference, atol=1e-8)
    np.testing.assert_allclose(np.cov(got.T), np.eye(5), atol=1e-9)
    zca = Whitening(zca=True).fit(X).transform(X)
    np.testing.assert_allclose(zca, reference @ u.T, atol=1e-8)  # ZCA has no sign freedom
    truncated = Whitening(n_components=2).fit(X).transform(X)
    np.testing.assert_allclose(np.abs(truncated), np.abs(reference[:, :2]), atol=1e-8)


def test_standardize_matches_standard_scaler():
    X = anisotropic(200, 4)
    X[:, 2] = 7.0  # constant dimension: centred, not divided by zero
    np.testing.assert_allclose(Standardize().fit(X).transform(X), StandardScaler().fit(X).transform(X), atol=1e-12)


def cie_loop_reference(X_fit: np.ndarray, X_new: np.ndarray, *, n_clusters: int, n_pc: int, seed: int) -> np.ndarray:
    """Rajaee & Pilehvar's recipe, one point at a time: nearest centroid, cluster mean, PCA directions."""
    kmeans = KMeans(n_clusters=n_clusters, random_state=seed, n_init="auto").fit(X_fit)
    means, components = [], []
    for cluster in range(n_clusters):
        members = X_fit[kmeans.labels_ == cluster]
        means.append(members.mean(axis=0))
        components.append(PCA().fit(members - members.mean(axis=0)).components_[:n_pc])
    out = []
    for x in X_new:
        nearest = int(np.argmin([np.linalg.norm(x - c) for c in kmeans.cluster_centers_]))
        centred = x - means[nearest]
        out.append(centred - sum((c @ centred) * c for c in components[nearest]))
    return np.array(out)


def test_cluster_isotropy_matches_per_point_loop_reference():
    rng = np.random.default_rng(2)
    X = np.vstack([anisotropic(80, 6, seed=s, offset=10.0 * s) for s in range(3)])
    X_new = X[rng.choice(len(X), 30, replace=False)] + rng.normal(scale=0.3, size=(30, 6))
    fitted = ClusterIsotropy(n_clusters=3, n_components=2, random_state=0).fit(X)
    for points in (X, X_new):
        expected = cie_loop_reference(X, points, n_clusters=3, n_pc=2, seed=0)
        np.testing.assert_allclose(fitted.transform(points), expected, atol=1e-9)


def test_cluster_isotropy_removes_only_directions_with_variance():
    X = np.vstack([anisotropic(60, 5, seed=0, offset=0.0), [[50.0, 50, 50, 50, 50], [52.0, 50, 50, 50, 50]]])
    fitted = ClusterIsotropy(n_clusters=2, n_components=3, random_state=0).fit(X)
    assert sorted(fitted.n_components_per_cluster_.tolist()) == [1, 3]  # the 2-point cluster has 1 direction


# ---------------------------------------------------------------------------------------------
# shared behaviour: inverse, streaming, persistence, isotropy, torch


LINEAR = [AllButTheTop, Whitening, Standardize]


@pytest.mark.parametrize("make", [Whitening, lambda: Whitening(zca=True), Standardize])
def test_inverse_transform_round_trip(make):
    X = anisotropic(100, 5)
    fitted = make().fit(X)
    np.testing.assert_allclose(fitted.inverse_transform(fitted.transform(X)), X, atol=1e-10)


@pytest.mark.parametrize("cls", LINEAR)
@pytest.mark.parametrize("offset", [0.0, 1e3])
def test_partial_fit_over_chunks_equals_fit(cls, offset):
    X = anisotropic(500, 6, offset=offset)
    batch = cls().fit(X)
    streamed = cls()
    for start in range(0, len(X), 64):
        streamed.partial_fit(X[start : start + 64])
    np.testing.assert_allclose(streamed.transform(X), batch.transform(X), atol=1e-8)
    shards = MomentAccumulator(full_covariance=cls is not Standardize).add(X[:200])
    merged = cls().fit_moments(shards.merge(MomentAccumulator(full_covariance=cls is not Standardize).add(X[200:])))
    np.testing.assert_allclose(merged.transform(X), batch.transform(X), atol=1e-8)


@pytest.mark.parametrize(
    "estimator",
    [AllButTheTop(), Whitening(zca=True), Standardize(), ClusterIsotropy(n_clusters=4, n_components=2), FlowCalibrator(**SMALL_FLOW)],
    ids=lambda e: type(e).__name__,
)
def test_save_load_round_trip(estimator, tmp_path):
    X = anisotropic(300, 6)
    fitted = estimator.fit(X)
    path = fitted.save(tmp_path / "calibrator")
    assert path.suffix == (".pt" if isinstance(estimator, FlowCalibrator) else ".npz")
    loaded = type(estimator).load(path)
    assert loaded.get_params() == fitted.get_params()
    np.testing.assert_array_equal(loaded.transform(X), fitted.transform(X))
    assert type(load_calibrator(path)) is type(estimator)
    with pytest.raises(ValueError, match="not a"):
        (Whitening if not isinstance(estimator, Whitening) else Standardize).load(path)


@pytest.mark.parametrize(
    "estimator",
    [Whitening(), AllButTheTop(n_components=1), ClusterIsotropy(n_clusters=3, n_components=1), FlowCalibrator(n_steps=2, hidden_size=32, n_epochs=10, batch_size=256)],
    ids=lambda e: type(e).__name__,
)
def test_calibrators_make_an_anisotropic_gaussian_isotropic(estimator):
    # Isotropic noise plus one dominant direction and a common offset: the case ABTT is designed for.
    rng = np.random.default_rng(0)
    dominant = np.array([1.0, 2.0, -1.0, 0.5, 0.0, 1.0]) / np.sqrt(7.25)
    X = rng.normal(size=(2000, 6)) + np.outer(rng.normal(scale=8.0, size=2000), dominant) + 4.0
    Y = estimator.fit(X).transform(X)
    assert average_cosine(X) > 0.5 and isoscore(X) < 0.5
    assert abs(average_cosine(Y)) < 0.05
    assert isoscore(Y) > isoscore(X) + 0.1


def test_standardize_makes_axis_aligned_gaussian_isotropic():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, 6)) * np.geomspace(0.1, 10, 6) + 5.0
    Y = Standardize().fit(X).transform(X)
    assert isoscore(Y) > 0.99 and abs(average_cosine(Y)) < 0.01


def test_torch_in_torch_out():
    X = anisotropic(200, 5)
    for estimator in (Whitening(), ClusterIsotropy(n_clusters=2, n_components=1), FlowCalibrator(**SMALL_FLOW)):
        reference = estimator.fit(X).transform(X)
        tensor_out = estimator.fit(torch.from_numpy(X)).transform(torch.from_numpy(X).float())
        assert isinstance(tensor_out, torch.Tensor) and tensor_out.dtype == torch.float32
        np.testing.assert_allclose(tensor_out.numpy(), reference, rtol=1e-4, atol=1e-4)
    assert Whitening().fit(X).transform(X.astype(np.float32)).dtype == np.float32


# ---------------------------------------------------------------------------------------------
# the flow


@pytest.mark.parametrize("prewhiten", [True, False])
def test_flow_inverse_and_log_det_against_autograd_jacobian(prewhiten):
    X = anisotropic(500, 4)
    flow = FlowCalibrator(n_steps=3, hidden_size=16, n_epochs=5, batch_size=64, prewhiten=prewhiten, device="cpu").fit(X)
    np.testing.assert_allclose(flow.inverse_transform(flow.transform(X)), X, atol=1e-4)
    np.testing.assert_allclose(flow.transform(X[:5]), flow.transform(torch.tensor(X[:5])).numpy(), rtol=1e-6)
    if prewhiten:
        mean = torch.tensor(flow.prewhitening_.mean_, dtype=torch.float32)
        whitening = torch.tensor(flow.prewhitening_.whitening_matrix_, dtype=torch.float32)
    else:
        mean, whitening = torch.zeros(4), torch.eye(4)

    def x_to_z(x):
        return flow.module_(((x - mean) @ whitening)[None])[0][0]

    points = torch.tensor(X[:5], dtype=torch.float32)
    for point, log_det, z in zip(points, flow.log_det(X[:5]), flow.transform(X[:5])):
        np.testing.assert_allclose(x_to_z(point).detach().numpy(), z, rtol=1e-5, atol=1e-5)
        _, expected = torch.linalg.slogdet(torch.autograd.functional.jacobian(x_to_z, point).double())
        assert log_det == pytest.approx(float(expected), abs=1e-4)  # log |det|: the sign may be negative
    # log p(x) = log N(z) + log det, and the training loss fell.
    z = flow.transform(X[:5])
    normal = -0.5 * (z**2).sum(axis=1) - 2 * np.log(2 * np.pi)
    np.testing.assert_allclose(flow.score_samples(X[:5]), normal + flow.log_det(X[:5]), rtol=1e-6)
    assert flow.loss_curve_[-1] < flow.loss_curve_[0]


def test_flow_additive_coupling_has_constant_log_det_and_is_seeded():
    X = anisotropic(300, 5)
    additive = FlowCalibrator(coupling="additive", **SMALL_FLOW).fit(X)
    log_det = additive.log_det(X)
    np.testing.assert_allclose(log_det, log_det[0], rtol=1e-6)  # only actnorm and the linear maps change volume
    again = FlowCalibrator(coupling="additive", **SMALL_FLOW).fit(X)
    np.testing.assert_array_equal(again.transform(X), additive.transform(X))
    other_seed = FlowCalibrator(coupling="additive", random_state=1, **SMALL_FLOW).fit(X)
    assert not np.allclose(other_seed.transform(X), additive.transform(X))


@pytest.mark.parametrize("prewhiten", [True, False])
def test_flow_is_stable_with_a_dead_dimension(prewhiten, tmp_path):
    # Real layers have dimensions that are ~1e-30 everywhere (MiniLM's last layer has three); the
    # actnorm gives them a huge scale, so a bias applied before that scale made training explode.
    X = anisotropic(2000, 6)
    X[:, 2] = 1e-30 * np.random.default_rng(1).normal(size=2000)
    flow = FlowCalibrator(n_steps=2, hidden_size=32, n_epochs=5, batch_size=256, prewhiten=prewhiten).fit(X)
    assert all(np.diff(flow.loss_curve_) < 0)
    assert np.abs(flow.transform(X)).max() < 10
    loaded = FlowCalibrator.load(flow.save(tmp_path / "flow"))
    assert (loaded.prewhitening_ is None) == (not prewhiten)
    np.testing.assert_array_equal(loaded.transform(X), flow.transform(X))


# ---------------------------------------------------------------------------------------------
# bad input


def test_bad_input_errors():
    X = anisotropic(50, 6)
    fitted = Whitening().fit(X)
    with pytest.raises(ValueError, match="X has 4 features, but Whitening is expecting 6"):
        fitted.transform(X[:, :4])
    nan = X.copy()
    nan[3, 2] = np.nan
    for estimator in (Whitening(), ClusterIsotropy(n_clusters=2), FlowCalibrator(**SMALL_FLOW)):
        with pytest.raises(ValueError, match="NaN"):
            estimator.fit(nan)
    with pytest.raises(ValueError, match="n_clusters=27 needs at least that many points, got n_samples = 20"):
        ClusterIsotropy().fit(X[:20])
    with pytest.raises(ValueError, match="n_components must be between 1 and the dimension 6"):
        Whitening(n_components=7).fit(X)
    with pytest.raises(ValueError, match="inverse_transform is not defined"):
        Whitening(n_components=3).fit(X).inverse_transform(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="features"):
        Whitening().partial_fit(X).partial_fit(X[:, :5])
    with pytest.raises(ValueError, match="coupling"):
        FlowCalibrator(coupling="spline").fit(X)
    with pytest.raises(FileNotFoundError):
        load_calibrator("/nonexistent/whitening.npz")
    # Rank-deficient whitening (N <= d) stays finite thanks to the eigenvalue floor.
    few = anisotropic(4, 6)
    assert np.isfinite(Whitening().fit(few).transform(few)).all()


# ---------------------------------------------------------------------------------------------
# the store driver and the CLI


@pytest.fixture
def small_store(tmp_path):
    rng = np.random.default_rng(0)
    words = [[f"w{(s * 7 + i) % 23}" for i in range(6)] + ["."] for s in range(40)]
    n_tokens = sum(len(w) for w in words)
    layers = [anisotropic(n_tokens, 16, seed=layer, offset=2.0 + layer) for layer in range(2)]
    layers[1][6::7] = rng.normal(size=(40, 16)) * 100  # punctuation rows: far off, excluded by default
    return write_store_from_arrays(tmp_path / "store", layers, words)


def test_fit_store_streams_over_non_punctuation_rows(small_store):
    X = np.asarray(small_store.layer(1)[:], dtype=np.float64)
    keep = ~small_store.tokens["is_punct"].to_numpy()
    assert keep.sum() == 240
    streamed = fit_store(Whitening(), small_store, 1, chunk_rows=50)
    np.testing.assert_allclose(streamed.transform(X[keep]), Whitening().fit(X[keep]).transform(X[keep]), atol=1e-8)
    subsampled = fit_store(ClusterIsotropy(n_clusters=3, n_components=2), small_store, 1, max_rows=100, seed=0)
    assert subsampled.cluster_sizes_.sum() == 100


def test_calibrate_store_records_and_files(small_store):
    result = calibrate_store(small_store, CalibrationOptions(methods=("whitening", "cie", "flow"), layers=(1,), seed=0))
    records = result.records
    assert result.paths[0] == small_store.path / "calibration.json"
    by_key = {(r["method"], r["measure"]): r for r in records}
    assert {r["layer"] for r in records} == {1}
    assert by_key[("whitening", "isoscore")]["after"] > by_key[("whitening", "isoscore")]["before"]
    assert abs(by_key[("whitening", "average_cosine")]["after"]) < 0.05
    assert by_key[("flow", "isoscore")]["n_eval_rows"] == 240
    document = json.loads((small_store.path / "calibration.json").read_text())
    assert document["kind"] == "calibration" and "layer 0 is the embedding output" in document["layer_note"]
    assert len(document["records"]) == len(records)
    assert (small_store.path / "calibration.csv").read_text().startswith("layer,method,measure,before,after")
    for name in ("whitening-L1.npz", "cie-L1.npz", "flow-L1.pt"):
        assert load_calibrator(small_store.path / "calibrators" / name).n_features_in_ == 16
    with pytest.raises(ValueError, match="unknown calibration method"):
        CalibrationOptions(methods=("pca",), layers=(1,))


def test_cli_calibrate(small_store):
    result = CliRunner().invoke(app, ["calibrate", str(small_store.path), "--methods", "abtt,standardize", "--layers", "0,1"])
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())  # rich wraps long lines at the terminal width
    assert "IsoScore" in output and "layer 0 is the embedding output" in output
    records = json.loads((small_store.path / "calibration.json").read_text())["records"]
    assert {(r["layer"], r["method"]) for r in records} == {(0, "abtt"), (1, "abtt"), (0, "standardize"), (1, "standardize")}
    bad = CliRunner().invoke(app, ["calibrate", str(small_store.path), "--methods", "pca"])
    assert bad.exit_code == 2 and "unknown calibration method" in bad.output
    # the old spelling, --layer repeated, still works one release and warns; -1 is the last layer
    old = CliRunner().invoke(app, ["calibrate", str(small_store.path), "--methods", "abtt", "--layer", "0", "--layer", "1"])
    assert old.exit_code == 0 and "read as --layers 0,1" in " ".join(old.stderr.split())
    last = CliRunner().invoke(app, ["calibrate", str(small_store.path), "--methods", "abtt", "--layers", "-1"])
    fits = json.loads((small_store.path / "calibration.json").read_text())["fits"]
    assert last.exit_code == 0 and max(fit["layer"] for fit in fits) == max(small_store.layers)
    both = CliRunner().invoke(app, ["calibrate", str(small_store.path), "--layers", "0", "--layer", "1"])
    assert both.exit_code == 2 and "give --layers only" in both.output


def test_cli_calibrate_extracts_a_model_given_instead_of_a_store(tmp_path, monkeypatch, lee_corpus_file):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(
        app, ["calibrate", "tiny-bert", "--corpus", str(lee_corpus_file), "--methods", "abtt", "--layers", "3", "--device", "cpu"]
    )
    assert result.exit_code == 0, result.output
    records = json.loads((tmp_path / "runs" / "tiny-bert-lee40" / "calibration.json").read_text())["records"]
    assert {(r["layer"], r["method"]) for r in records} == {(3, "abtt")}


@pytest.fixture
def lee_corpus_file(tmp_path):
    from lmgeom.corpus import lee

    path = tmp_path / "lee40.txt"
    path.write_text("\n".join(s.text for s in lee().head(40)) + "\n")
    return path


# ---- set_output: DataFrames in and out ------------------------------------------------------------

SET_OUTPUT_CASES = [
    (lambda: Whitening(), [f"whitening{i}" for i in range(4)]),  # principal axes: names made
    (lambda: Whitening(n_components=2), ["whitening0", "whitening1"]),
    (lambda: Whitening(zca=True), ["a", "b", "c", "d"]),  # rotated back: the input's coordinates
    (lambda: AllButTheTop(n_components=1), ["a", "b", "c", "d"]),
    (lambda: Standardize(), ["a", "b", "c", "d"]),
    (lambda: ConceptorNegation(), ["a", "b", "c", "d"]),
    (lambda: ClusterIsotropy(n_clusters=2, n_components=1), ["a", "b", "c", "d"]),
    (lambda: FlowCalibrator(n_steps=1, hidden_size=8, n_epochs=1, device="cpu"), [f"flowcalibrator{i}" for i in range(4)]),
]


@pytest.mark.filterwarnings("ignore:X does not have valid feature names")  # sklearn's: fitted on a frame, given an array
@pytest.mark.parametrize("make, columns", SET_OUTPUT_CASES)
def test_set_output_pandas_gives_frames_with_kept_or_made_names(make: Any, columns: list[str]) -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 4)) @ rng.normal(size=(4, 4))
    frame = pd.DataFrame(X, columns=list("abcd"), index=np.arange(1000, 1300))
    calibrator = make().set_output(transform="pandas")
    out = calibrator.fit_transform(frame)
    assert isinstance(out, pd.DataFrame) and list(out.columns) == columns
    assert list(calibrator.get_feature_names_out()) == columns
    assert list(calibrator.feature_names_in_) == list("abcd")
    pd.testing.assert_index_equal(out.index, frame.index)  # the rows keep their labels
    tensor = calibrator.transform(torch.tensor(X))  # a tensor too: a DataFrame of its values
    assert isinstance(tensor, pd.DataFrame)
    np.testing.assert_allclose(tensor.to_numpy(), out.to_numpy(), atol=1e-9)

    calibrator.set_output(transform="default")  # arrays again, tensors for tensors, the same numbers
    array = calibrator.transform(X)
    assert type(array) is np.ndarray and array.shape == out.shape
    np.testing.assert_allclose(array, out.to_numpy(), atol=1e-9)
    back = calibrator.transform(torch.tensor(X, dtype=torch.float32))
    assert isinstance(back, torch.Tensor) and back.dtype == torch.float32


def test_inverse_transform_takes_the_frame_transform_returned() -> None:
    rng = np.random.default_rng(1)
    frame = pd.DataFrame(rng.normal(size=(200, 3)) @ rng.normal(size=(3, 3)), columns=["x", "y", "z"])
    for calibrator in (Whitening(), Standardize()):
        calibrator.set_output(transform="pandas")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no feature-name warning: the output's names are not the input's
            restored = calibrator.inverse_transform(calibrator.fit_transform(frame))
        np.testing.assert_allclose(restored, frame.to_numpy(), atol=1e-8)
    with pytest.raises(InputError, match=r"Whitening.inverse_transform takes rows of 3 columns \(what transform returns\), got 2"):
        Whitening().fit(frame).inverse_transform(np.zeros((2, 2)))
