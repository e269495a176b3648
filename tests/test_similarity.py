"""Similarity measures (lmgeom.metrics.similarity) against brute force on the n x n Gram matrices,
closed forms and a peer package; their permutation nulls and p-values against shuffling the rows and
recomputing each measure from scratch, and mutual k-NN's chance level against a Monte Carlo; the
store-level driver (rows matched across tokenizers) and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.linalg
import scipy.spatial.distance
import scipy.stats

from lmgeom.errors import InputError
from lmgeom.metrics.base import load_states, save_states
from lmgeom.metrics.similarity import (
    MEASURES,
    CrossMoments,
    cross_statistics,
    knn_chance,
    knn_indices,
    linear_cka,
    mutual_knn,
    pair_measures,
    permutation_nulls,
    permutation_p_value,
    permutations,
    permuted_neighbours,
    permuted_ranks,
    procrustes_distance,
    rdm_ranks,
    rsa,
    summarise_null,
)
from lmgeom.store import write_store_from_arrays

# ---------------------------------------------------------------------------------------------
# brute force on the n x n Gram matrices


def hsic_biased(K: np.ndarray, L: np.ndarray) -> float:
    n = len(K)
    H = np.eye(n) - 1.0 / n
    return float(np.trace(K @ H @ L @ H)) / (n - 1) ** 2


def hsic_unbiased(K: np.ndarray, L: np.ndarray) -> float:
    """Song et al. (2012), eq. 5, written out on the Gram matrices."""
    n = len(K)
    K, L = K.copy(), L.copy()
    np.fill_diagonal(K, 0)
    np.fill_diagonal(L, 0)
    ones = np.ones(n)
    value = np.trace(K @ L) + (ones @ K @ ones) * (ones @ L @ ones) / ((n - 1) * (n - 2)) - 2 / (n - 2) * ones @ K @ L @ ones
    return float(value) / (n * (n - 3))


def cka_brute(X: np.ndarray, Y: np.ndarray, hsic) -> float:
    K, L = X @ X.T, Y @ Y.T
    return hsic(K, L) / np.sqrt(hsic(K, K) * hsic(L, L))


def procrustes_brute(X: np.ndarray, Y: np.ndarray) -> float:
    """arccos of the best overlap of centred unit-Frobenius X and Y under an orthogonal map
    (scipy's orthogonal Procrustes: ||X R - Y||^2 = 2 - 2 <X R, Y>), for equal dimensions."""
    Xc, Yc = X - X.mean(0), Y - Y.mean(0)
    Xc, Yc = Xc / np.linalg.norm(Xc), Yc / np.linalg.norm(Yc)
    R, _ = scipy.linalg.orthogonal_procrustes(Xc, Yc)
    return float(np.arccos(np.clip(np.sum((Xc @ R) * Yc), -1, 1)))


def related(n: int, p: int, q: int, seed: int, shift: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p)) * rng.uniform(0.5, 3, p) + shift
    Y = X @ rng.standard_normal((p, q)) + 0.7 * rng.standard_normal((n, q)) - shift
    return X, Y


def chunked(X: np.ndarray, Y: np.ndarray | None, *, edges: tuple[int, ...], shift_x=None, shift_y=None) -> CrossMoments:
    moments = CrossMoments(paired=Y is not None, shift_x=shift_x, shift_y=shift_y)
    for lo, hi in zip(edges[:-1], edges[1:]):
        moments.add(X[lo:hi]) if Y is None else moments.add(X[lo:hi], Y=Y[lo:hi])
    return moments


@pytest.mark.parametrize("shift", [0.0, 50.0])
def test_streamed_cka_and_procrustes_equal_brute_force_on_the_gram(shift):
    X, Y = related(80, 6, 4, seed=1, shift=shift)
    edges = (0, 7, 30, 31, 80)
    xy = chunked(X, Y, edges=edges, shift_x=X[:7].mean(0), shift_y=Y[:7].mean(0)).result()
    xx = chunked(X, None, edges=edges, shift_x=X[:7].mean(0)).result()
    yy = chunked(Y, None, edges=edges, shift_x=Y[:7].mean(0)).result()
    K, L = X @ X.T, Y @ Y.T
    assert xy.hsic == pytest.approx(hsic_biased(K, L), rel=1e-9)
    assert xy.hsic_debiased == pytest.approx(hsic_unbiased(K, L), rel=1e-8)
    assert xx.hsic_debiased == pytest.approx(hsic_unbiased(K, K), rel=1e-8)
    assert linear_cka(xy, xx, yy) == pytest.approx(cka_brute(X, Y, hsic_biased), rel=1e-9)
    assert linear_cka(xy, xx, yy, debiased=True) == pytest.approx(cka_brute(X, Y, hsic_unbiased), rel=1e-8)
    # Procrustes for unequal dimensions: the nuclear norm of the centred, normalised cross-covariance by SVD
    Xc, Yc = X - X.mean(0), Y - Y.mean(0)
    nuclear = np.linalg.svd((Xc / np.linalg.norm(Xc)).T @ (Yc / np.linalg.norm(Yc)), compute_uv=False).sum()
    assert procrustes_distance(xy) == pytest.approx(np.arccos(nuclear), rel=1e-9)


def test_procrustes_equals_scipy_orthogonal_procrustes():
    X, Y = related(60, 5, 5, seed=2)
    assert pair_measures(X, Y)["procrustes"] == pytest.approx(procrustes_brute(X, Y), rel=1e-9)


def test_unbiased_hsic_can_be_negative_and_cka_stays_finite():
    rng = np.random.default_rng(3)
    values = [pair_measures(rng.standard_normal((12, 3)), rng.standard_normal((12, 3)))["cka_debiased"] for _ in range(20)]
    assert min(values) < 0 < max(values)


def test_closed_forms():
    rng = np.random.default_rng(4)
    X = rng.standard_normal((500, 16)) * rng.uniform(0.2, 4, 16) + 3.0
    same = pair_measures(X, X.copy())
    assert same["cka"] == pytest.approx(1, abs=1e-12) and same["cka_debiased"] == pytest.approx(1, abs=1e-12)
    assert same["procrustes"] == pytest.approx(0, abs=1e-6)
    Q, _ = np.linalg.qr(rng.standard_normal((16, 16)))
    rotated = pair_measures(X, 2.5 * X @ Q - 7.0)  # rotated, scaled and shifted
    assert rotated["cka"] == pytest.approx(1, abs=1e-12) and rotated["cka_debiased"] == pytest.approx(1, abs=1e-12)
    assert rotated["procrustes"] == pytest.approx(0, abs=1e-6)
    # independent Gaussians: the debiased CKA is about 0, the biased one is inflated at small n
    A, B = rng.standard_normal((4000, 32)), rng.standard_normal((4000, 32))
    unrelated = pair_measures(A, B)
    assert unrelated["cka_debiased"] == pytest.approx(0, abs=0.01)
    assert unrelated["cka"] > 0.005 + abs(unrelated["cka_debiased"])
    assert unrelated["procrustes"] > 1.0


def test_merge_of_two_accumulators_equals_one_pass_and_survives_saving(tmp_path):
    X, Y = related(90, 5, 3, seed=5, shift=10.0)
    shift_x, shift_y = X[:10].mean(0), Y[:10].mean(0)
    whole = chunked(X, Y, edges=(0, 90), shift_x=shift_x, shift_y=shift_y)
    left = chunked(X, Y, edges=(0, 40), shift_x=shift_x, shift_y=shift_y)
    right = chunked(X, Y, edges=(40, 90), shift_x=shift_x, shift_y=shift_y)
    save_states(tmp_path / "right.npz", {"xy": right})
    _, loaded = load_states(tmp_path / "right.npz")
    merged = left.merge(loaded["xy"]).result()
    one = whole.result()
    for name in ("hsic", "hsic_debiased", "nuclear", "trace_x", "trace_y"):
        assert getattr(merged, name) == pytest.approx(getattr(one, name), rel=1e-11)
    with pytest.raises(InputError, match="shifts"):
        CrossMoments(shift_x=np.zeros(5), shift_y=np.zeros(3)).merge(right)
    with pytest.raises(TypeError, match="Y="):
        CrossMoments().add(X)


def test_torch_rows_give_the_numpy_result():
    torch = pytest.importorskip("torch")
    X, Y = related(50, 4, 3, seed=6)
    on_numpy = CrossMoments().add(X, Y=Y).result()
    on_torch = CrossMoments().add(torch.from_numpy(X), Y=torch.from_numpy(Y)).result()
    assert on_torch.hsic_debiased == pytest.approx(on_numpy.hsic_debiased, rel=1e-12)
    assert cross_statistics(CrossMoments(paired=False).add(torch.from_numpy(X))).hsic == pytest.approx(
        CrossMoments(paired=False).add(X).result().hsic, rel=1e-12)


def test_rsa_equals_spearman_of_cosine_distances():
    X, Y = related(40, 6, 5, seed=7)
    expected = scipy.stats.spearmanr(scipy.spatial.distance.pdist(X, "cosine"), scipy.spatial.distance.pdist(Y, "cosine"))[0]
    assert rsa(rdm_ranks(X), rdm_ranks(Y)) == pytest.approx(expected, abs=1e-6)
    permutation = np.random.default_rng(0).permutation(40)
    np.testing.assert_array_equal(permuted_ranks(rdm_ranks(Y), permutation), rdm_ranks(Y[permutation]))


def test_knn_and_mutual_knn_equal_brute_force():
    X, Y = related(70, 5, 5, seed=8)
    k = 4
    cos_x = 1 - scipy.spatial.distance.squareform(scipy.spatial.distance.pdist(X, "cosine"))
    np.fill_diagonal(cos_x, -np.inf)
    brute_x = [set(np.argsort(-row)[:k]) for row in cos_x]
    near_x = knn_indices(X, k, block_rows=16)
    assert [set(row) for row in near_x] == brute_x
    near_y = knn_indices(Y, k)
    expected = np.mean([len(set(a) & set(b)) / k for a, b in zip(near_x, near_y)])
    assert mutual_knn(near_x, near_y) == pytest.approx(expected)
    assert mutual_knn(near_x, near_x) == 1.0
    permutation = np.random.default_rng(1).permutation(70)
    assert [set(row) for row in permuted_neighbours(near_y, permutation)] == [set(row) for row in knn_indices(Y[permutation], k)]


def test_hsic_and_cka_match_the_peer_package():
    """repsim 0.1.5 (C++ backend, n x n Gram matrices) on the same points: its Gretton and Song HSIC
    of linear kernels; its CKA with the Gretton estimator. (repsim's CKA with estimator="song"
    divides the Song HSIC by Gretton self terms, a mixed estimator, so debiased CKA is checked
    from its HSIC matrix.)"""
    repsim = pytest.importorskip("repsim")
    X, Y = related(150, 8, 6, seed=9, shift=2.0)
    xy = CrossMoments().add(X, Y=Y).result()
    xx, yy = CrossMoments(paired=False).add(X).result(), CrossMoments(paired=False).add(Y).result()
    gretton = repsim.hsic([X, Y], kernel_type="linear", estimator="gretton")
    song = repsim.hsic([X, Y], kernel_type="linear", estimator="song")
    assert xy.hsic == pytest.approx(gretton[0, 1], rel=1e-10) and xx.hsic == pytest.approx(gretton[0, 0], rel=1e-10)
    assert xy.hsic_debiased == pytest.approx(song[0, 1], rel=1e-9) and yy.hsic_debiased == pytest.approx(song[1, 1], rel=1e-9)
    assert linear_cka(xy, xx, yy) == pytest.approx(repsim.cka([X, Y], kernel_type="linear", estimator="gretton")[0, 1], rel=1e-10)
    assert linear_cka(xy, xx, yy, debiased=True) == pytest.approx(song[0, 1] / np.sqrt(song[0, 0] * song[1, 1]), rel=1e-9)


# ---------------------------------------------------------------------------------------------
# permutation nulls, p-values and the chance level of mutual k-NN


def procrustes_svd(X: np.ndarray, Y: np.ndarray) -> float:
    """The angular Procrustes distance from the SVD of the full centred, unit-Frobenius matrices
    (any dimensions)."""
    Xc, Yc = X - X.mean(0), Y - Y.mean(0)
    Xc, Yc = Xc / np.linalg.norm(Xc), Yc / np.linalg.norm(Yc)
    return float(np.arccos(np.clip(np.linalg.svd(Xc.T @ Yc, compute_uv=False).sum(), 0, 1)))


def from_scratch(X: np.ndarray, Y: np.ndarray, k: int) -> dict[str, float]:
    """Every measure of X against Y recomputed from the rows: CKA on the Gram matrices, Procrustes
    from the SVD, RSA and mutual k-NN from new ranks and a new neighbour search."""
    return {"cka": cka_brute(X, Y, hsic_biased), "cka_debiased": cka_brute(X, Y, hsic_unbiased),
            "procrustes": procrustes_svd(X, Y), "rsa": rsa(rdm_ranks(X), rdm_ranks(Y)),
            "knn": mutual_knn(knn_indices(X, k), knn_indices(Y, k))}


def test_permutation_nulls_equal_shuffling_the_rows_and_recomputing_from_scratch():
    """The cheap nulls (Grams, ranks and neighbour lists indexed by the permutation) equal each
    measure recomputed on the shuffled rows, to 1e-10, and so do their p-values; a wide side (more
    dimensions than rows) takes the reduced rows of the Procrustes path."""
    m, k, seed = 36, 4, 5
    X, Y = related(m, 6, 5, seed=12, shift=4.0)
    wide = np.random.default_rng(13).standard_normal((m, 50)) + 2.0
    samples_a, samples_b = [X, Y], [Y, wide]
    pairs = [(0, 0), (0, 1), (1, 0), (1, 1)]
    shuffles = permutations(m, 25, seed)
    counts = {"procrustes": 6}
    nulls = permutation_nulls(samples_a, samples_b, pairs, shuffles, counts=counts, k=k)
    assert set(nulls.null) == set(MEASURES) and nulls.null["procrustes"].shape == (4, 6) and nulls.null["rsa"].shape == (4, 25)
    for index, (i, j) in enumerate(pairs):
        observed = from_scratch(samples_a[i], samples_b[j], k)
        for measure in MEASURES:
            # Procrustes compared as the overlap cos(angle): arccos near 1 turns a rounding error e into sqrt(2e)
            close = np.cos if measure == "procrustes" else np.asarray
            assert close(nulls.observed[measure][index]) == pytest.approx(close(observed[measure]), abs=1e-10), measure
        brute = {measure: [] for measure in MEASURES}
        for t, permutation in enumerate(shuffles):
            for measure, value in from_scratch(samples_a[i], samples_b[j][permutation], k).items():
                if t < counts.get(measure, len(shuffles)):
                    brute[measure].append(value)
        for measure in MEASURES:
            np.testing.assert_allclose(nulls.null[measure][index], brute[measure], rtol=0, atol=1e-10, err_msg=measure)
            lower = measure == "procrustes"
            assert permutation_p_value(nulls.observed[measure][index], nulls.null[measure][index], lower=lower) == \
                permutation_p_value(observed[measure], brute[measure], lower=lower)


def test_identical_rows_have_the_smallest_p_value_and_unrelated_rows_do_not():
    m, k, count = 40, 4, 60
    rng = np.random.default_rng(21)
    X = rng.standard_normal((m, 8)) * np.arange(1, 9)
    same = permutation_nulls([X], None, [(0, 0)], permutations(m, count, 1), counts={"procrustes": 19}, k=k)
    for measure in MEASURES:
        n = 19 if measure == "procrustes" else count
        summary = summarise_null(same.observed[measure][0], same.null[measure][0], lower=measure == "procrustes")
        assert summary.p_value == 1 / (n + 1) and summary.permutations == n, measure
    assert same.observed["cka"][0] == pytest.approx(1) and same.observed["procrustes"][0] == pytest.approx(0, abs=1e-6)
    # independent rows: p-values spread over (0, 1], none piled up at the smallest
    p_values: dict[str, list[float]] = {measure: [] for measure in MEASURES}
    for seed in range(20):
        rng = np.random.default_rng(100 + seed)
        A, B = rng.standard_normal((m, 5)), rng.standard_normal((m, 5))
        nulls = permutation_nulls([A], [B], [(0, 0)], permutations(m, 99, seed), counts={"procrustes": 19}, k=k)
        for measure in MEASURES:
            p_values[measure].append(permutation_p_value(nulls.observed[measure][0], nulls.null[measure][0],
                                                         lower=measure == "procrustes"))
    for measure, values in p_values.items():
        values = np.asarray(values)
        assert 0.3 < values.mean() < 0.7 and np.mean(values <= 0.05) <= 0.2, (measure, values)


def test_p_value_counts_the_right_tail_and_is_undefined_without_a_null():
    null = np.array([0.1, 0.2, 0.3, 0.4])
    assert permutation_p_value(0.35, null) == (1 + 1) / 5  # upper tail: 0.4
    assert permutation_p_value(0.35, null, lower=True) == (1 + 3) / 5  # a distance: 0.1, 0.2, 0.3
    assert permutation_p_value(0.3, null) == (1 + 2) / 5  # a tie counts against
    assert permutation_p_value(0.5, np.array([0.1, np.nan])) == 1 / 2  # an undefined null value is left out
    assert np.isnan(permutation_p_value(0.5, np.array([]))) and np.isnan(permutation_p_value(np.nan, null))
    summary = summarise_null(0.35, null)
    assert summary.mean == pytest.approx(0.25) and summary.sd == pytest.approx(np.std(null, ddof=1))
    empty = summarise_null(0.35, np.empty(0))
    assert np.isnan(empty.mean) and np.isnan(empty.sd) and np.isnan(empty.p_value) and empty.permutations == 0


def test_mutual_knn_chance_level_matches_a_monte_carlo():
    """Random neighbour lists (k of each point's m - 1 others) share k / (m - 1) on average; the
    permutation null of unrelated rows sits at the same level."""
    m, k = 50, 5
    rng = np.random.default_rng(3)

    def random_lists() -> np.ndarray:
        return np.array([rng.choice(np.delete(np.arange(m), i), k, replace=False) for i in range(m)])

    trials = [mutual_knn(random_lists(), random_lists()) for _ in range(400)]
    standard_error = np.std(trials, ddof=1) / np.sqrt(len(trials))
    assert abs(np.mean(trials) - knn_chance(m, k)) < 4 * standard_error
    assert knn_chance(m, k) == pytest.approx(5 / 49)
    X, Y = rng.standard_normal((m, 6)), rng.standard_normal((m, 6))
    null = permutation_nulls([X], [Y], [(0, 0)], permutations(m, 400, 0), measures=("knn",), k=k).null["knn"][0]
    assert abs(null.mean() - knn_chance(m, k)) < 4 * null.std(ddof=1) / np.sqrt(len(null))
    with pytest.raises(InputError, match="`k` must be at least 1 and below"):
        knn_chance(5, 5)


# ---------------------------------------------------------------------------------------------
# the driver: rows within a store and matched across stores


def synthetic_pair(tmp_path, *, rotate: bool):
    """Two stores of one corpus of pre-tokenized sentences: b's layer 0 is a's layer 1 rotated (or
    unrelated noise); a has 3 layers of 6 dims, b 2 layers of 6 dims."""
    rng = np.random.default_rng(11)
    sentences = [["the", "cat", "sat", ",", "on", "mats"], ["a", "dog", "ran", "."], ["birds", "fly", "high", "up", "there"]] * 6
    n = sum(map(len, sentences))
    base = rng.standard_normal((n, 6)) * np.arange(1, 7)
    layers_a = [base, base + 0.3 * rng.standard_normal((n, 6)), rng.standard_normal((n, 6))]
    Q, _ = np.linalg.qr(rng.standard_normal((6, 6)))
    layers_b = [layers_a[1] @ Q + 5 if rotate else rng.standard_normal((n, 6)), rng.standard_normal((n, 6))]
    a = write_store_from_arrays(tmp_path / "a", [x.astype(np.float32) for x in layers_a], sentences, model_id="model-a")
    b = write_store_from_arrays(tmp_path / "b", [x.astype(np.float32) for x in layers_b], sentences, model_id="model-b")
    return a, b, sentences


def test_within_store_layer_by_layer_equals_in_memory_measures(tmp_path):
    from lmgeom.stages.similarity import SimilarityOptions, similarity_matrix

    a, _, _ = synthetic_pair(tmp_path, rotate=True)
    # tiny chunks and a state budget of one pair per group: several reads, the same numbers
    options = SimilarityOptions(chunk_rows=7, max_state_bytes=8 * 36, sample=40, k=3, permutations=2)
    result = similarity_matrix(a, None, options)
    words = a.tokens["is_punct"].to_numpy()
    rows = np.flatnonzero(~words)
    assert result.counts["rows_matched"] == len(rows) == a.n_tokens - 2 * 6
    layers = [np.asarray(a.layer(layer)[:], dtype=np.float64)[rows] for layer in a.layers]
    for i in range(3):
        for j in range(3):
            expected = pair_measures(layers[i], layers[j])
            for measure in ("cka", "cka_debiased", "procrustes"):
                assert result.values[measure][i, j] == pytest.approx(expected[measure], rel=1e-7, abs=1e-7)
    assert result.values["cka"][0, 1] > 0.9 and result.values["cka_debiased"][0, 2] < 0.2
    np.testing.assert_allclose(np.diag(result.values["rsa"]), 1, atol=1e-6)
    np.testing.assert_allclose(np.diag(result.values["knn"]), 1)
    # the permutation null: unrelated rows, and within the range of each measure
    assert np.all(np.abs(result.null["cka_debiased"]) < 0.2) and np.all(result.null["procrustes"] > 0.6)
    assert len(result.records) == 5 * 9


def test_stores_compare_on_matched_rows_and_different_corpora_are_refused(tmp_path):
    from lmgeom.stages.similarity import SimilarityOptions, similarity_matrix

    a, b, sentences = synthetic_pair(tmp_path, rotate=True)
    result = similarity_matrix(a, b, SimilarityOptions(measures=("cka", "procrustes"), sample=30))
    assert result.values["cka"].shape == (3, 2)
    assert result.values["cka"][1, 0] == pytest.approx(1, abs=1e-6) and result.values["procrustes"][1, 0] == pytest.approx(0, abs=1e-3)
    assert result.counts["a_rows_unmatched"] == result.counts["b_rows_unmatched"] == 0
    chosen = similarity_matrix(a, b, SimilarityOptions(measures=("cka",), layers=(1, 2), layers_b=(0,), sample=30))
    assert (chosen.layers_a, chosen.layers_b) == ([1, 2], [0])
    assert chosen.values["cka"][0, 0] == pytest.approx(result.values["cka"][1, 0], abs=1e-12)
    with pytest.raises(InputError, match="`layers_b` \\(2,\\): layer 2 is not among the model's layers 0..1"):
        similarity_matrix(a, b, SimilarityOptions(layers_b=(2,)))
    other = write_store_from_arrays(tmp_path / "c", [np.ones((4, 6), np.float32)], [["other", "words", "here", "now"]])
    with pytest.raises(InputError, match="different corpora.*corpus_fingerprint"):
        similarity_matrix(a, other)


TEXTS = ["The cat \u0301 sat on the unbelievably wide mat.", "Tokenizers disagree about antidisestablishmentarianism, surely.",
         "A second sentence, with commas; and semicolons!", "The cat sat again."]


def test_models_with_different_tokenizers_match_on_the_same_words(tmp_path):
    """tiny-bert (WordPiece; its normaliser drops the lone combining accent, a word it cannot align)
    against tiny-gpt2 (byte-level BPE) on the same sentences."""
    from lmgeom.stages import extract_model
    from lmgeom.stages.similarity import SimilarityOptions, match_rows, similarity_matrix

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    bert = extract_model("tiny-bert", str(corpus), out=tmp_path / "bert", device="cpu", skip_unaligned=True, keep_special=True)
    gpt2 = extract_model("tiny-gpt2", str(corpus), out=tmp_path / "gpt2", device="cpu")
    assert bert.meta["n_unaligned_words"] == 1
    options = SimilarityOptions(sample=20, k=3)
    matched = match_rows(bert, gpt2, options)
    words_b, words_g = bert.tokens["word"].to_numpy(), gpt2.tokens["word"].to_numpy()
    np.testing.assert_array_equal(words_b[matched.rows_a], words_g[matched.rows_b])
    words_only = ~gpt2.tokens["is_punct"].to_numpy()
    assert list(words_g[matched.rows_b]) == [w for w in words_g[words_only] if w != "\u0301"]
    assert "unbelievably" in list(words_g[matched.rows_b]) and "sat" in list(words_g[matched.rows_b])
    assert matched.counts["b_rows_unmatched"] == 1 and matched.counts["a_rows_unmatched"] == 0
    assert matched.counts["a_rows_special_excluded"] == 2 * len(TEXTS)
    # special tokens (kept in the tiny-bert store) are no corpus words: included, they match nothing
    with_special = match_rows(bert, gpt2, SimilarityOptions(include_special=True))
    np.testing.assert_array_equal(with_special.rows_a, matched.rows_a)
    assert with_special.counts["a_rows_unmatched"] == 2 * len(TEXTS)
    result = similarity_matrix(bert, gpt2, options)
    assert result.values["cka"].shape == (len(bert.layers), len(gpt2.layers))
    assert np.isfinite(result.values["cka"]).all()
    limited = extract_model("tiny-gpt2", str(corpus), out=tmp_path / "gpt2-3", device="cpu", limit=3)
    with pytest.raises(InputError, match="n_corpus_sentences 4 against 3"):
        similarity_matrix(bert, limited, options)


# ---------------------------------------------------------------------------------------------
# the CLI


def test_cli_prints_the_cka_table_within_80_columns_and_writes_its_files(tmp_path):
    from typer.testing import CliRunner

    from lmgeom.cli.main import app

    a, b, _ = synthetic_pair(tmp_path, rotate=True)
    outcome = CliRunner().invoke(app, ["similarity", str(tmp_path / "a"), str(tmp_path / "b"), "--rows", "30", "--k", "3"],
                                 terminal_width=80)
    assert outcome.exit_code == 0, outcome.output
    assert "linear CKA" in outcome.output and "L1" in outcome.output
    out = tmp_path / "a" / "similarity" / "b"
    document = json.loads((out / "similarity.json").read_text())
    assert document["kind"] == "similarity" and document["counts"]["rows_matched"] == a.n_tokens - 12
    assert document["model_id"] == "model-a" and document["stores"][1]["model_id"] == "model-b"
    record = next(r for r in document["records"] if r["measure"] == "cka" and (r["layer_a"], r["layer_b"]) == (1, 0))
    assert record["value"] == pytest.approx(1, abs=1e-6) and record["null"] < 0.5
    assert record["p_value"] == 1 / 201 and record["permutations"] == 200 and record["sample_value"] == pytest.approx(1, abs=1e-6)
    assert document["permutations"] == {"cka": 200, "cka_debiased": 200, "procrustes": 20, "rsa": 200, "knn": 200}
    assert document["chance"] == {"knn": pytest.approx(3 / 29)}
    assert (out / "similarity.csv").read_text().startswith(
        "layer_a,layer_b,measure,value,sample_value,null,null_sd,p_value,permutations,chance\n")
    lines = outcome.output.splitlines()
    table = lines[lines.index(next(line for line in lines if "each measure over the pairs of layers" in line)):]
    assert max(map(len, table[:-1])) <= 80 and "largest p" in outcome.output and "0.1034" in outcome.output
    assert "p-values on the sampled rows (the smallest possible 0.005)" in outcome.output
    outcome = CliRunner().invoke(app, ["similarity", str(tmp_path / "a"), "--measures", "cka,nonsense"])
    assert outcome.exit_code == 2 and "nonsense" in outcome.output and "--measures" in outcome.output
    outcome = CliRunner().invoke(app, ["similarity", str(tmp_path / "a"), "--layers", "0,9"])
    assert outcome.exit_code == 2 and "--layers '0,9': layer 9 is not among" in " ".join(outcome.output.split())
    outcome = CliRunner().invoke(app, ["similarity", str(tmp_path / "a"), "--measures", "cka", "--layers", "0,2",
                                       "--out", str(tmp_path / "within")], terminal_width=80)
    assert outcome.exit_code == 0 and "layer x layer" in outcome.output
    within = json.loads((tmp_path / "within" / "similarity.json").read_text())
    assert within["layers_a"] == within["layers_b"] == [0, 2] and len(within["records"]) == 4


def test_grid_splits_to_fit_80_columns():
    from lmgeom.cli.similarity import grid_lines

    values = np.linspace(0, 1, 31 * 31).reshape(31, 31)
    lines = grid_lines(values, list(range(31)), list(range(31)))
    assert max(map(len, lines)) <= 80
    assert sum(line.startswith("L30 ") for line in lines) == 3  # three blocks of columns
    assert lines[1].split()[1:3] == ["0.00", "0.00"]


def test_cli_defaults_match_the_library():
    import typer.main

    from lmgeom.cli.main import app
    from lmgeom.metrics.similarity import DEFAULT_K, MEASURES
    from lmgeom.stages.similarity import DEFAULT_SAMPLE, SimilarityOptions

    params = {param.name: param.default for param in typer.main.get_command(app).commands["similarity"].params}  # type: ignore[attr-defined]
    assert (params["rows"], params["k"], params["measure"]) == (DEFAULT_SAMPLE, DEFAULT_K, ",".join(MEASURES))
    assert (params["permutations"], params["seed"]) == (SimilarityOptions().permutations, SimilarityOptions().seed)
    assert params["procrustes_permutations"] == SimilarityOptions().procrustes_permutations
    assert (SimilarityOptions().permutations, SimilarityOptions().procrustes_permutations) == (200, 20)
    run_params = {param.name: param.default for param in typer.main.get_command(app).commands["run"].params}  # type: ignore[attr-defined]
    assert run_params["permutations"] == SimilarityOptions().permutations


@pytest.mark.parametrize("name", ["permutations", "procrustes_permutations"])
def test_shuffle_counts_are_validated_naming_the_parameter(name):
    from lmgeom.stages.similarity import SimilarityOptions

    with pytest.raises(InputError, match=f"`{name}` must be at least 0, got -1") as caught:
        SimilarityOptions(**{name: -1})
    assert caught.value.params == (name,)
    with pytest.raises(InputError, match=f"`{name}` must be a whole number"):
        SimilarityOptions(**{name: 2.5})
