"""Intrinsic dimension, outlier dimensions and massive activations, alignment/uniformity, the
spectrum's shape, and `lmgeom geometry`: brute-force references, closed forms and the peer packages
(scikit-dimension, DADApy) on the same points."""

from __future__ import annotations

import itertools
import json
import warnings

import numpy as np
import pytest
from scipy.optimize import minimize_scalar
from scipy.spatial.distance import cdist, pdist
from scipy.stats import binom
from typer.testing import CliRunner

from lmgeom.cli.main import app
from lmgeom.metrics.alignment import alignment, uniformity
from lmgeom.metrics.contextuality import intra_sentence_similarity, self_similarity
from lmgeom.metrics.intrinsic import (
    gride_from_ratios,
    gride_log_likelihood,
    hit_rate_test,
    intrinsic_dimension,
    minimum_after_peak,
    mle_from_inverses,
    mle_inverse_estimates,
    nearest_neighbours,
    peak_layer,
    twonn,
    twonn_from_ratios,
    unique_rows,
)
from lmgeom.metrics.isotropy import covariance_eigenvalues, effective_rank, participation_ratio
from lmgeom.metrics.outliers import MagnitudeAccumulator, magnitude_outliers
from lmgeom.metrics.spectrum_shape import numerical_rank, renyi_entropy, stable_rank
from lmgeom.engine import AnalysisOptions
from lmgeom.stages.geometry import GeometryOptions, measure_geometry, probe_layer_test
from lmgeom.store import write_store_from_arrays


def _subspace_points(n: int, d: int, ambient: int = 384, seed: int = 0) -> np.ndarray:
    """Gaussian points on a random d-dimensional linear subspace of R^ambient, far from the origin."""
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.normal(size=(ambient, d)))[0]
    return rng.normal(size=(n, d)) @ basis.T + 10 * rng.normal(size=ambient)


# ---- k-NN ------------------------------------------------------------------------------------


def test_nearest_neighbours_equal_a_brute_force_in_every_block_size():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, 20)) + 50.0  # far from the origin: the search centres
    D = cdist(X, X)
    np.fill_diagonal(D, np.inf)
    order = np.argsort(D, axis=1)[:, :7]
    for memory_mb in (0.001, 0.05, 256):  # 1 row per block, some, all
        distances, indexes = nearest_neighbours(X, 7, memory_mb=memory_mb)
        np.testing.assert_array_equal(indexes, order)
        np.testing.assert_allclose(distances, np.take_along_axis(D, order, axis=1), rtol=1e-10)


def test_near_duplicates_keep_a_positive_distance():
    rng = np.random.default_rng(15)
    X = rng.normal(size=(50, 8)) * 1e3 + 1e4
    X[1] = X[0]
    X[1, 3] = np.nextafter(X[0, 3], np.inf)  # one ulp apart: below the float64 formula's rounding
    distances, indexes = nearest_neighbours(X, 3)
    assert indexes[0, 0] == 1 and distances[0, 0] == pytest.approx(np.linalg.norm(X[0] - X[1]), rel=1e-6) and distances[0, 0] > 0


def test_nearest_neighbours_see_duplicates_at_distance_zero_and_never_themselves():
    X = np.array([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0], [3.0, 0.0]])
    distances, indexes = nearest_neighbours(X, 2)
    assert indexes[0, 0] == 1 and indexes[1, 0] == 0 and distances[0, 0] == 0
    assert not (indexes == np.arange(4)[:, None]).any()
    with pytest.raises(ValueError, match="1 <= k < n"):
        nearest_neighbours(X, 4)


# ---- the estimators against their formulas ---------------------------------------------------


def test_twonn_fit_is_the_least_squares_slope_through_the_origin():
    mu = np.random.default_rng(2).pareto(4.0, 200) + 1.0
    n, keep = len(mu), int(len(mu) * 0.9)
    x = np.log(np.sort(mu))[:keep]
    y = np.array([-np.log(1 - (i + 1) / n) for i in range(keep)])
    slope = np.linalg.lstsq(x[:, None], y, rcond=None)[0][0]
    assert twonn_from_ratios(mu) == pytest.approx(slope, rel=1e-12)
    assert twonn_from_ratios(mu) == pytest.approx(4.0, abs=0.6)  # the Pareto exponent is the dimension


def test_mle_is_the_inverse_of_the_mean_of_levina_bickel_inverses():
    distances = np.sort(np.random.default_rng(3).uniform(0.1, 1.0, size=(50, 10)), axis=1)
    k = 6
    inverses = [sum(np.log(row[k - 1] / row[j]) for j in range(k - 1)) / (k - 1) for row in distances]
    assert mle_from_inverses(mle_inverse_estimates(distances, k)) == pytest.approx(1 / np.mean(inverses), rel=1e-12)
    # not the mean of the per-point estimates (Levina & Bickel's own combination)
    assert mle_from_inverses(mle_inverse_estimates(distances, k)) != pytest.approx(np.mean(1 / np.array(inverses)), rel=1e-6)


def test_gride_maximises_its_likelihood_and_reduces_to_twonn_ml_at_scale_one():
    mu = np.random.default_rng(4).pareto(3.0, 500) + 1.0
    assert gride_from_ratios(mu, 1, 2) == pytest.approx(len(mu) / np.log(mu).sum(), rel=1e-9)
    for n1, n2 in ((2, 4), (4, 8), (8, 16)):
        fitted = gride_from_ratios(mu, n1, n2)
        best = minimize_scalar(lambda d: -gride_log_likelihood(mu, d, n1, n2), bounds=(0.01, 50), method="bounded",
                               options={"xatol": 1e-10})
        assert fitted == pytest.approx(best.x, rel=1e-5)


def test_linear_subspace_gives_its_dimension():
    X = _subspace_points(2000, 5)
    result = intrinsic_dimension(X, n_boot=50)
    assert result.get("twonn").dimension == pytest.approx(5, abs=0.3)
    assert result.get("mle").dimension == pytest.approx(5, abs=0.3)
    for n2 in (2, 4, 8):
        assert result.get("gride", n2).dimension == pytest.approx(5, abs=0.3)
    estimate = result.get("twonn")
    assert estimate.low < estimate.dimension < estimate.high and estimate.high - estimate.low < 1.0
    assert twonn(X) == pytest.approx(estimate.dimension, rel=1e-12)


def test_uniform_cube_gives_its_dimension():
    X = np.random.default_rng(5).uniform(size=(4000, 3))
    result = intrinsic_dimension(X, n_boot=0)
    assert result.get("twonn").dimension == pytest.approx(3, abs=0.2)
    assert result.get("mle").dimension == pytest.approx(3, abs=0.3)
    assert result.get("gride", 4).dimension == pytest.approx(3, abs=0.2)


def test_duplicates_are_removed_counted_and_change_nothing_else():
    X = _subspace_points(800, 4, ambient=30, seed=6)
    doubled = np.concatenate([X, X[:120], X[:30]])
    plain, with_duplicates = intrinsic_dimension(X, n_boot=20), intrinsic_dimension(doubled, n_boot=20)
    assert with_duplicates.n_duplicates == 150 and with_duplicates.n_rows == 950 and plain.n_duplicates == 0
    assert [e.record() for e in with_duplicates.estimates] == [e.record() for e in plain.estimates]
    assert unique_rows(doubled)[1] == 150
    with pytest.raises(ValueError, match="duplicate"):
        mle_inverse_estimates(nearest_neighbours(doubled, 5)[0], 5)


def test_bootstrap_is_seeded():
    X = _subspace_points(500, 3, ambient=20, seed=7)
    a, b, c = (intrinsic_dimension(X, n_boot=30, seed=s) for s in (0, 0, 1))
    assert a.estimates == b.estimates and a.get("twonn").low != c.get("twonn").low


# ---- the peer packages on the same points ----------------------------------------------------


def test_scikit_dimension_agrees():
    skdim = pytest.importorskip("skdim")
    X = _subspace_points(1000, 6, ambient=50, seed=8)
    result = intrinsic_dimension(X, n_boot=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert skdim.id.TwoNN(discard_fraction=0.1).fit(X).dimension_ == pytest.approx(result.get("twonn").dimension, rel=1e-9)
        peer_mle = skdim.id.MLE(K=20, unbiased=False).fit(X, n_neighbors=20, comb="mle").dimension_
    assert peer_mle == pytest.approx(result.get("mle").dimension, rel=1e-9)


def test_dadapy_agrees():
    # DADApy 0.3.4 pins numpy < 2, so it skips beside lmgeom's numpy 2; written against its source
    # (Data.compute_id_2NN: the same least-squares fit; return_id_scaling_gride: n1 = 2^i, n2 = 2^(i+1))
    dadapy = pytest.importorskip("dadapy")
    X = _subspace_points(1000, 6, ambient=50, seed=9)
    result = intrinsic_dimension(X, n_boot=0)
    twonn_peer = dadapy.Data(coordinates=X).compute_id_2NN(algorithm="base", mu_fraction=0.9)[0]
    assert twonn_peer == pytest.approx(result.get("twonn").dimension, rel=1e-6)
    ids = dadapy.Data(coordinates=X).return_id_scaling_gride(range_max=64)[0]
    assert len(ids) == 6
    for estimate, n2 in zip(ids, (2, 4, 8, 16, 32, 64)):
        assert estimate == pytest.approx(result.get("gride", n2).dimension, rel=1e-4)


# ---- the profile and the probing layer -------------------------------------------------------


def test_peak_and_minimum_after_it():
    profile = np.array([3.0, 9.0, 12.0, 7.0, 5.0, 6.0])
    assert peak_layer(profile) == 2 and minimum_after_peak(profile) == 4
    assert minimum_after_peak(np.array([1.0, 2.0, 3.0])) is None


def test_hit_rate_test_is_the_exact_poisson_binomial_tail():
    chances = [1 / 7, 1 / 31, 1 / 3, 1 / 7]
    hits = [True, False, True, False]
    brute = sum(np.prod([p if hit else 1 - p for hit, p in zip(outcome, chances)])
                for outcome in itertools.product([False, True], repeat=4) if sum(outcome) >= 2)
    test = hit_rate_test(hits, chances)
    assert test["p_value"] == pytest.approx(brute, rel=1e-12) and test["hits"] == 2
    assert hit_rate_test([True] * 3 + [False] * 5, [0.2] * 8)["p_value"] == pytest.approx(binom.sf(2, 8, 0.2), rel=1e-12)


def test_probe_layer_test_reads_geometry_and_layer_results(tmp_path):
    def results(task: str, scores: list[float]) -> str:
        path = tmp_path / f"{task}.json"
        path.write_text(json.dumps({"settings": {"model": "m", "task": task}, "summaries": [
            {"features": f"layer:{layer}", "split": "dev", "metric": "accuracy", "mean": score} for layer, score in enumerate(scores)]}))
        return str(path)

    geometry = tmp_path / "geometry.json"
    geometry.write_text(json.dumps({"kind": "geometry", "model_id": "m (some/model)", "layers": [
        {"intrinsic_dimension": [{"method": "twonn", "n2": 2, "dimension": d}]} for d in (3.0, 9.0, 5.0, 4.0, 6.0)]}))
    test = probe_layer_test([geometry], [results("a", [0.1, 0.9, 0.2, 0.3, 0.1]), results("b", [0.1, 0.2, 0.3, 0.8, 0.1])])
    assert [(c["best_layer"], c["peak_layer"], c["minimum_after_peak"]) for c in test["cases"]] == [(1, 1, 3), (3, 1, 3)]
    peak, valley = test["tests"].values()
    assert peak["hits"] == 1 and valley["hits"] == 1 and peak["p_value"] == pytest.approx(1 - 0.8**2)


# ---- outliers and massive activations --------------------------------------------------------


def test_magnitude_accumulator_streams_merges_and_finds_the_planted_activation():
    rng = np.random.default_rng(10)
    X = rng.normal(size=(500, 16))
    X[:, 5] += 8.0  # an outlier dimension by mean |h|
    X[321, 11] = -400.0  # a massive activation
    whole = MagnitudeAccumulator(top_k=4).add(X, rows=np.arange(500)).result()
    parts = MagnitudeAccumulator(top_k=4).add(X[:200], rows=np.arange(200))
    parts.merge(MagnitudeAccumulator(top_k=4).add(X[200:], rows=np.arange(200, 500)))
    merged = parts.result()
    np.testing.assert_allclose(merged.mean_abs, np.abs(X).mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(merged.std, X.std(axis=0), rtol=1e-9)
    flat = np.argsort(-np.abs(X).ravel(), kind="stable")[:4]
    assert list(zip(merged.top_rows, merged.top_dims)) == [divmod(int(i), 16) for i in flat]
    assert (merged.top_rows[0], merged.top_dims[0], merged.top_values[0]) == (321, 11, -400.0)
    np.testing.assert_array_equal(whole.top_values, merged.top_values)
    outliers = magnitude_outliers(merged.mean_abs)
    assert list(outliers.dimensions) == [5] and outliers.z_scores[0] > 3


def _planted_store(tmp_path):
    """Two layers; sentences start with a special <s> row; layer 1 plants |h| = 2000 at the special row
    of sentence 3, dimension 7, and dimension 2 is a magnitude outlier everywhere."""
    rng = np.random.default_rng(11)
    sentences = [["<s>", *(f"w{(s * 5 + i) % 23}" for i in range(8))] for s in range(40)]
    special = [[True] + [False] * 8 for _ in sentences]
    n = sum(len(s) for s in sentences)
    layers = [rng.normal(size=(n, 12)) for _ in range(2)]
    layers[1][:, 2] += 6.0
    layers[1][3 * 9, 7] = 2000.0
    return write_store_from_arrays(tmp_path / "store", [layer.astype(np.float32) for layer in layers], sentences,
                                   is_special=special)


def test_geometry_locates_the_planted_massive_activation_on_a_special_row(tmp_path):
    store = _planted_store(tmp_path)
    result = measure_geometry(store, GeometryOptions(AnalysisOptions(geometry_rows=300, top_activations=3), n_boot=0, data_dir=tmp_path / "no-data"))
    layer = result.layers[1]
    top = layer["top_activations"][0]
    assert (top["row"], top["dimension"], top["value"]) == (27, 7, 2000.0)
    assert top["is_special"] and top["word"] == "<s>" and top["sentence_id"] == 3 and top["first_row_of_sentence"]
    assert top["ratio_to_median"] == pytest.approx(2000.0 / layer["median_abs"]) and top["massive"]
    assert [d["dimension"] for d in layer["outlier_dimensions"]] == [2]
    assert result.layers[0]["outlier_dimensions"] == [] and not result.layers[0]["top_activations"][0]["massive"]
    assert layer["alignment"] is None and "no STS Benchmark" in layer["alignment_note"]
    # the special rows are read for the top |h| but not sampled: 40 x 8 word rows
    assert layer["n_rows"] == 300 and result.counts["rows_analysed"] == 320
    document = json.loads((store.path / "geometry.json").read_text())
    assert document["kind"] == "geometry" and len(document["layers"]) == 2


def test_self_and_intra_similarity_without_outliers_and_standardised_equal_brute_force(tmp_path):
    store = _planted_store(tmp_path)
    result = measure_geometry(store, GeometryOptions(AnalysisOptions(geometry_rows=300, top_activations=1, min_contexts=5), n_boot=0, data_dir=tmp_path / "no-data"), write=False)
    tokens = store.tokens
    words = ~tokens["is_special"].to_numpy()
    X = store.layer(1)[:].astype(np.float64)[words]
    word_ids, sentence_ids = tokens["word_id"].to_numpy()[words], tokens["sentence_id"].to_numpy()[words]
    counts = tokens[words].groupby("word_id")["sentence_id"].nunique()
    known = np.isin(word_ids, counts.index[counts >= 5])
    for name, Y in (("without_outlier_dimensions", np.delete(X, [2], axis=1)), ("standardized", (X - X.mean(0)) / X.std(0))):
        layer = result.layers[1]
        assert layer[f"self_similarity_{name}"] == pytest.approx(self_similarity(Y[known], word_ids[known]).mean(), rel=1e-10)
        assert layer[f"intra_sentence_similarity_{name}"] == pytest.approx(
            intra_sentence_similarity(Y, sentence_ids).mean(), rel=1e-10)


def test_alignment_on_stsb_pairs_found_in_the_corpus(tmp_path):
    folder = tmp_path / "data" / "stsbenchmark"
    folder.mkdir(parents=True)
    rows = [("4.5", "a b c", "a b d"), ("1.0", "a b c", "x y z"), ("4.0", "x y z", "x y w"), ("5.0", "not in", "the corpus")]
    (folder / "sts-test.csv").write_text("".join("\t".join(("g", "f", "y", str(i), *row)) + "\n" for i, row in enumerate(rows)))
    sentences = [s.split() for s in ("a b c", "a b d", "x y z", "x y w")]
    rng = np.random.default_rng(12)
    layer = rng.normal(size=(12, 6)).astype(np.float32)
    store = write_store_from_arrays(tmp_path / "store", [layer], sentences)
    result = measure_geometry(store, GeometryOptions(AnalysisOptions(geometry_rows=12, top_activations=1), n_boot=0, data_dir=tmp_path / "data"), write=False)
    means = layer.astype(np.float64).reshape(4, 3, 6).mean(axis=1)
    assert result.settings["alignment"]["n_pairs"] == 2
    assert result.layers[0]["alignment"] == pytest.approx(alignment(means[[0, 2]], means[[1, 3]]), rel=1e-12)
    assert result.layers[0]["uniformity"] == pytest.approx(uniformity(means), rel=1e-12)


# ---- alignment, uniformity, the spectrum's shape ---------------------------------------------


def test_uniformity_and_alignment_against_their_definitions():
    rng = np.random.default_rng(13)
    X, Y = rng.normal(size=(200, 8)), rng.normal(size=(200, 8))
    U = X / np.linalg.norm(X, axis=1, keepdims=True)
    V = Y / np.linalg.norm(Y, axis=1, keepdims=True)
    assert uniformity(X, memory_mb=0.001) == pytest.approx(np.log(np.exp(-2 * pdist(U) ** 2).mean()), rel=1e-10)
    assert alignment(X, Y) == pytest.approx((np.linalg.norm(U - V, axis=1) ** 2).mean(), rel=1e-12)
    assert alignment(X, 3 * X) == pytest.approx(0.0, abs=1e-12)


def test_stable_rank_numerical_rank_and_matrix_entropy():
    X = _subspace_points(300, 5, ambient=40, seed=14)
    variances = covariance_eigenvalues(X)
    assert numerical_rank(variances) == 5
    W = X - X.mean(axis=0)
    assert stable_rank(variances) == pytest.approx(np.linalg.norm(W) ** 2 / np.linalg.norm(W, 2) ** 2, rel=1e-9)
    assert np.exp(renyi_entropy(variances, alpha=2)) == pytest.approx(participation_ratio(X), rel=1e-9)
    assert np.exp(renyi_entropy(np.sqrt(variances), alpha=1)) == pytest.approx(effective_rank(X), rel=1e-9)
    assert renyi_entropy(np.ones(8)) == pytest.approx(np.log(8)) and renyi_entropy(np.ones(8), alpha=3) == pytest.approx(np.log(8))


# ---- the command -----------------------------------------------------------------------------


def test_geometry_command_writes_and_prints_within_80_columns(tmp_path):
    store = _planted_store(tmp_path)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["geometry", str(store.path), "--out", str(out), "--rows", "300", "--bootstrap", "10",
                                      "--data-dir", str(tmp_path / "no-data")], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.output.splitlines()) <= 80
    assert "layer 0 = embedding output" in result.output and "TwoNN" in result.output and "massive" in result.output
    document = json.loads((out / "geometry.json").read_text())
    assert document["settings"]["intrinsic_dimension"]["n_boot"] == 10
    bad = CliRunner().invoke(app, ["geometry", str(store.path), "--rows", "300", "--device", "cuda:7"], env={"COLUMNS": "80"})
    if bad.exit_code != 0:  # no such GPU here: one error line naming the option
        assert bad.exit_code == 2 and "error:" in bad.output and "device" in bad.output
