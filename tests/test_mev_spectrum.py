"""The MEV spectrum (lmgeom.metrics.spectrum) against dense `eigh` of the d x d matrices.

Values (top eigenvalues, MEV of every variant) must agree to 1e-9 relative, directions (static vector,
svd_ratio) to 1e-6 where the spectral gap allows. The matrix-free path only runs at LLM width, so the
tests shrink its dense limit (and block size, basis) to run it on small matrices as well.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from scipy.linalg import eigh

from lmgeom.metrics import MEV_VARIANTS, MEVAccumulator, first_principal_direction, mev, occurrence_spectrum
from lmgeom.metrics.mev import mev_state_bytes
from lmgeom.metrics import lanczos as lanczos_module
from lmgeom.metrics import spectrum as spectrum_module
from lmgeom.metrics.spectrum import OccurrenceSpectrum, moment_spectrum, rows_spectra

from helpers import pin_spectrum_route

VALUE_RTOL = 1e-9
DIRECTION_TOL = 1e-6


# ---- the dense reference: full eigh of X^T X and of the scatter matrix of explicitly centred rows

def dense_reference(X: np.ndarray) -> dict[str, object]:
    centred = X - X.mean(axis=0)
    values, vectors = eigh(X.T @ X)
    centred_values = eigh(centred.T @ centred, eigvals_only=True)
    direction = vectors[:, -1] * (1 if vectors[:, -1] @ X.sum(axis=0) >= 0 else -1)
    total = float(np.sum(centred**2))
    along = float(np.sum((centred @ direction) ** 2))
    frobenius = float(np.sum(X**2))
    return {
        "top": values[-1], "gap": values[-1] - values[-2], "centred_top": centred_values[-1], "direction": direction,
        "top_space": vectors[:, values >= values[-1] * (1 - 1e-9)],
        "mev": {"uncentred": values[-1] / frobenius, "centred": centred_values[-1] / total, "svd_ratio": along / total},
    }


def assert_matches(spectrum: OccurrenceSpectrum, X: np.ndarray, *, direction_defined: bool = True) -> None:
    reference = dense_reference(X)
    assert spectrum.n == len(X)
    assert spectrum.top_eigenvalue == pytest.approx(reference["top"], rel=VALUE_RTOL)
    assert spectrum.centred_top_eigenvalue == pytest.approx(reference["centred_top"], rel=VALUE_RTOL, abs=1e-12 * reference["top"])
    assert spectrum.mev("uncentred") == pytest.approx(reference["mev"]["uncentred"], rel=VALUE_RTOL)
    assert spectrum.mev("centred") == pytest.approx(reference["mev"]["centred"], rel=VALUE_RTOL)
    assert np.linalg.norm(spectrum.direction) == pytest.approx(1.0, abs=1e-12)
    if direction_defined:
        assert np.linalg.norm(spectrum.direction - reference["direction"]) < DIRECTION_TOL
        assert spectrum.mev("svd_ratio") == pytest.approx(reference["mev"]["svd_ratio"], rel=DIRECTION_TOL)
    else:  # a (near-)degenerate top: any unit vector of the top eigenspace
        inside = np.linalg.norm(reference["top_space"].T @ spectrum.direction)
        assert inside == pytest.approx(1.0, abs=DIRECTION_TOL)


@pytest.fixture
def matrix_free(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every word through block Lanczos to convergence (no budget), with small blocks and a small basis
    so restarts happen."""
    monkeypatch.setattr(spectrum_module, "word_route", lambda n, dim, formed=False: "krylov")
    monkeypatch.setattr(spectrum_module, "krylov_budget", lambda n, dim, formed=False: None)
    for module in (spectrum_module, lanczos_module):
        monkeypatch.setattr(module, "BLOCK_SIZE", 3)
    monkeypatch.setattr(lanczos_module, "MAX_BASIS", 24)


# ---- occurrence matrices with known spectral shapes (all seeded)

def anisotropic(n: int, d: int, seed: int) -> np.ndarray:
    """One dominant common direction, a decaying low-rank spread and isotropic noise: like a real layer."""
    rng = np.random.default_rng(seed)
    common = rng.standard_normal(d)
    basis = np.linalg.qr(rng.standard_normal((d, 10)))[0]
    spread = rng.standard_normal((n, 10)) * 3.0 * 0.7 ** np.arange(10) @ basis.T
    return 4 * common / np.linalg.norm(common) + spread + 0.2 * rng.standard_normal((n, d))


def flat(n: int, d: int, seed: int) -> np.ndarray:
    """Gaussian rows: a Marchenko-Pastur spectrum, small relative gaps at the top."""
    return np.random.default_rng(seed).standard_normal((n, d))


def with_singular_values(n: int, d: int, singular: np.ndarray, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    left = np.linalg.qr(rng.standard_normal((n, len(singular))))[0]
    right = np.linalg.qr(rng.standard_normal((d, len(singular))))[0]
    return (left * singular) @ right.T


SHAPES = [(40, 90), (90, 40), (150, 150)]  # n < d, n > d, n = d


@pytest.mark.parametrize("n,d", SHAPES)
@pytest.mark.parametrize("make", [anisotropic, flat])
def test_matrix_free_matches_dense_eigh(matrix_free: None, make, n: int, d: int) -> None:
    X = make(n, d, seed=n + d)
    assert_matches(occurrence_spectrum(X), X)


@pytest.mark.parametrize("n,d", SHAPES)
@pytest.mark.parametrize("make", [anisotropic, flat])
def test_dense_paths_match_dense_eigh(make, n: int, d: int) -> None:
    X = make(n, d, seed=n * d)
    assert_matches(occurrence_spectrum(X), X)


# a word the production cost model sends matrix-free (about 500 rows at MiniLM width)
MATRIX_FREE_SHAPE = (500, 384)


def test_matrix_free_at_width_beyond_the_dense_limit() -> None:
    """The production settings (no monkeypatching): the cost model sends this word matrix-free."""
    n, d = MATRIX_FREE_SHAPE
    assert spectrum_module.word_route(n, d) == "krylov"
    for X in (anisotropic(n, d, seed=1), flat(n, d, seed=2)):
        assert_matches(occurrence_spectrum(X), X)


@pytest.mark.parametrize("relative_split", [0.0, 1e-13, 1e-10])
def test_near_degenerate_top_value_exact_direction_in_the_top_space(matrix_free: None, relative_split: float) -> None:
    singular = np.sqrt(np.array([10.0 * (1 + relative_split), 10.0, 4.0, 3.0, 2.5, 1.0, 0.5]))
    X = with_singular_values(60, 80, singular, seed=3) + 0.5  # the shift gives the scatter matrix its own spectrum
    assert_matches(occurrence_spectrum(X), X, direction_defined=False)


# ---- every route forced on every shape: the batched Gram eigh, the per-word tridiagonal reduction of
# the bordered Gram matrix, the tridiagonal reduction of the scatter matrix, block Lanczos

ROUTES = ["gram-batched", "gram-tridiagonal", "scatter", "krylov"]


@pytest.fixture(params=ROUTES)
def route(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    return pin_spectrum_route(monkeypatch, request.param)


@pytest.mark.parametrize("n,d", [(2, 30), (3, 30), *SHAPES])
@pytest.mark.parametrize("make", [anisotropic, flat])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_every_route_matches_dense_eigh(route: str, make, n: int, d: int, dtype: type) -> None:
    X = (make(n, d, seed=n + 3 * d) + 1.0).astype(dtype)
    assert_matches(occurrence_spectrum(X), X.astype(np.float64))


def test_every_route_rank_deficient_near_degenerate_and_dominant_mean(route: str) -> None:
    for rank in (1, 2, 5):
        X = with_singular_values(50, 70, np.linspace(3.0, 1.0, rank), seed=rank)
        assert_matches(occurrence_spectrum(X), X)
        assert_matches(occurrence_spectrum(X.T.copy()), X.T)  # n > d
    for split in (0.0, 1e-13, 1e-10):
        singular = np.sqrt(np.array([10.0 * (1 + split), 10.0, 4.0, 3.0, 2.5, 1.0, 0.5]))
        for n, d in ((60, 80), (80, 60)):
            X = with_singular_values(n, d, singular, seed=3) + 0.5
            assert_matches(occurrence_spectrum(X), X, direction_defined=False)
    row = np.random.default_rng(50).standard_normal(40) * 10
    for spread in (1e-1, 1e-3):  # the mean holds all but 1e-4 / 1e-8 of the energy
        X = row + spread * anisotropic(60, 40, seed=51)
        assert_matches(occurrence_spectrum(X), X)
        assert_matches(occurrence_spectrum(X[:30]), X[:30])


def test_every_route_batches_words_of_different_counts(route: str) -> None:
    rng = np.random.default_rng(52)
    words = [rng.standard_normal((n, 30)) + rng.standard_normal(30) for n in (2, 3, 7, 29, 30, 31, 45)]
    for X, spectrum in zip(words, rows_spectra(words)):
        assert_matches(spectrum, X)


def test_cost_model_routes() -> None:
    """Small words through their Gram matrices, many rows at small width through the scatter matrix,
    many rows at LLM width matrix-free; a word held as X^T X densely at small width."""
    word_route = spectrum_module.word_route
    assert [word_route(n, 384) for n in (2, 23, 24, 200)] == ["gram"] * 4
    assert word_route(*MATRIX_FREE_SHAPE) == "krylov"
    assert word_route(1000, 64) == "scatter"
    assert word_route(3000, 4096) == "krylov" and word_route(20, 4096) == "gram"
    assert word_route(5000, 128, formed=True) == "scatter" and word_route(20000, 4096, formed=True) == "krylov"


def test_production_routes_at_their_boundaries() -> None:
    """At MiniLM width, the last word sizes of each route and the first of the next match eigh: the
    batched eigh against the per-word reduction (BATCHED_EIGH_LIMIT) and the Gram route against
    block Lanczos (the cost model's switch)."""
    d = 384
    switch = max(n for n in range(2, 1000) if spectrum_module.word_route(n, d) == "gram")
    assert spectrum_module.word_route(switch + 1, d) == "krylov"
    batched = spectrum_module.BATCHED_EIGH_LIMIT - 1  # the largest batched word: its bordered matrix is n + 1
    for n in (batched, batched + 1, switch, switch + 1):
        X32, X = as_float32(anisotropic(n, d, seed=n))
        assert_matches(occurrence_spectrum(X32), X)


def test_flat_spectrum_over_its_krylov_budget_goes_the_dense_way(monkeypatch: pytest.MonkeyPatch) -> None:
    """A flat word needs far more products than a real one: past its budget the dense route solves it
    (exact as ever); a real-like word converges within the budget and stays matrix-free."""
    outcomes: list[bool] = []
    solve = spectrum_module._krylov_rows_spectrum

    def recording(*args, **kwargs):  # type: ignore[no-untyped-def]
        spectrum = solve(*args, **kwargs)
        outcomes.append(spectrum is not None)
        return spectrum

    monkeypatch.setattr(spectrum_module, "_krylov_rows_spectrum", recording)
    n, d = MATRIX_FREE_SHAPE
    for make, converged in ((flat, False), (anisotropic, True)):
        X32, X = as_float32(make(n, d, seed=53) + 1.0)
        assert_matches(occurrence_spectrum(X32), X)
        assert outcomes.pop() is converged
    budget = spectrum_module.krylov_budget(n, d)
    assert budget is not None and spectrum_module.KRYLOV_PRODUCTS <= budget < 200
    # a word held as X^T X the same way (a budget of one block forces it here)
    dense_solves: list[int] = []
    scatter_tops = spectrum_module._scatter_tops
    monkeypatch.setattr(spectrum_module, "_scatter_tops", lambda *args: dense_solves.append(1) or scatter_tops(*args))
    monkeypatch.setattr(spectrum_module, "word_route", lambda n, dim, formed=False: "krylov")
    monkeypatch.setattr(spectrum_module, "krylov_budget", lambda n, dim, formed=False: lanczos_module.BLOCK_SIZE)
    X = flat(300, 80, seed=54)
    assert_matches(moment_spectrum(len(X), X.sum(axis=0), X.T @ X), X)
    assert dense_solves == [1]


def test_a_flat_word_gives_up_on_lanczos_as_soon_as_its_rate_projects_past_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """A flat spectrum's residual falls too slowly for the budget: block Lanczos stops after
    `PROJECTION_MIN_STEPS` steps instead of spending the budget, and the dense route solves the word;
    a real-like word's rate projects within it and converges matrix-free."""
    products: list[int] = []
    images = spectrum_module._ChunkedRows.scatter_images

    def counted(self, block, dtype):  # type: ignore[no-untyped-def]
        products.append(block.shape[1])
        return images(self, block, dtype)

    monkeypatch.setattr(spectrum_module._ChunkedRows, "scatter_images", counted)
    n, d = 400, 512
    budget = spectrum_module.krylov_budget(n, d)
    assert spectrum_module.word_route(n, d) == "krylov" and budget > 4 * lanczos_module.PROJECTION_MIN_STEPS * lanczos_module.BLOCK_SIZE
    X32, X = as_float32(flat(n, d, seed=55) + 1.0)
    assert spectrum_module._krylov_rows_spectrum(spectrum_module._ChunkedRows([X32]), budget=budget) is None
    assert len(products) == lanczos_module.PROJECTION_MIN_STEPS and sum(products) < budget
    assert_matches(occurrence_spectrum(X32), X)
    products.clear()
    X32, X = as_float32(anisotropic(n, d, seed=56))
    assert_matches(spectrum_module._krylov_rows_spectrum(spectrum_module._ChunkedRows([X32]), budget=budget), X)
    assert sum(products) <= budget


def test_moment_path_dense_at_small_width() -> None:
    """Words kept as X^T X at small width: one tridiagonal reduction of C = X^T X - s s^T / n."""
    assert spectrum_module.word_route(200, 60, formed=True) == "scatter"
    for X in (anisotropic(200, 60, seed=8), flat(200, 60, seed=9)):
        assert_matches(moment_spectrum(len(X), X.sum(axis=0), X.T @ X), X)


@pytest.mark.parametrize("rank", [1, 2, 5])
def test_rank_deficient(matrix_free: None, rank: int) -> None:
    X = with_singular_values(50, 70, np.linspace(3.0, 1.0, rank), seed=rank)
    assert_matches(occurrence_spectrum(X), X)


def test_one_vector_repeated_has_no_spread(matrix_free: None) -> None:
    row = np.random.default_rng(4).standard_normal(30)
    spectrum = occurrence_spectrum(np.tile(row, (12, 1)))
    assert spectrum.mev("uncentred") == pytest.approx(1.0, rel=1e-12)
    assert np.isnan(spectrum.mev("centred")) and np.isnan(spectrum.mev("svd_ratio"))
    assert np.allclose(spectrum.direction, row / np.linalg.norm(row), atol=1e-12)


def test_two_occurrences_closed_form() -> None:
    """Two rows a, b: eigenvalues of the Gram matrix [[aa, ab], [ab, bb]] in closed form; the centred
    matrix has one non-zero eigenvalue |a - b|^2 / 2, so the centred MEV is 1."""
    a, b = np.array([3.0, 1.0, 0.0, 2.0]), np.array([1.0, 2.0, 2.0, 0.0])
    aa, bb, ab = a @ a, b @ b, a @ b
    top = (aa + bb) / 2 + np.sqrt(((aa - bb) / 2) ** 2 + ab**2)
    spectrum = occurrence_spectrum(np.stack([a, b]))
    assert spectrum.top_eigenvalue == pytest.approx(top, rel=1e-13)
    assert spectrum.mev("uncentred") == pytest.approx(top / (aa + bb), rel=1e-13)
    assert spectrum.centred_top_eigenvalue == pytest.approx(np.sum((a - b) ** 2) / 2, rel=1e-13)
    assert spectrum.mev("centred") == pytest.approx(1.0, rel=1e-13)


def test_batched_gram_words_equal_each_word_alone() -> None:
    """Words of different counts padded into one batch give what each gives alone, and what eigh gives."""
    rng = np.random.default_rng(5)
    words = [rng.standard_normal((n, 50)) + rng.standard_normal(50) for n in (1, 2, 3, 5, 8, 9, 16, 17, 40)]
    together = rows_spectra(words)
    for X, spectrum in zip(words, together):
        alone = rows_spectra([X])[0]
        assert spectrum.top_eigenvalue == pytest.approx(alone.top_eigenvalue, rel=1e-12)
        assert np.allclose(spectrum.direction, alone.direction, atol=1e-10)
        if len(X) >= 2:
            assert_matches(spectrum, X)


def test_moment_path_matrix_free(matrix_free: None) -> None:
    """Words kept as X^T X (n > d) go matrix-free on the d x d moment too."""
    for X in (anisotropic(200, 60, seed=6), flat(200, 60, seed=7)):
        assert_matches(moment_spectrum(len(X), X.sum(axis=0), X.T @ X), X)


def one_pass_and_merged_shards(
    X: np.ndarray, counts: dict[int, int], rng: np.random.Generator, *, n_shards: int
) -> tuple[np.ndarray, np.ndarray, dict[int, Any], dict[int, Any]]:
    """The rows of `counts`' words (stacked in word order in X) shuffled, and MEV's results for one
    pass over them and for `n_shards` accumulators merged."""
    word_ids = np.repeat(list(counts), list(counts.values()))
    order = rng.permutation(len(X))
    X, word_ids = X[order], word_ids[order]
    one_pass = MEVAccumulator(len(counts)).add(X, word_ids=word_ids).result()
    shards = [MEVAccumulator(len(counts)).add(X[part], word_ids=word_ids[part]) for part in np.array_split(np.arange(len(X)), n_shards)]
    merged = shards[0]
    for shard in shards[1:]:
        merged.merge(shard)
    return X, word_ids, one_pass, merged.result()


@pytest.mark.parametrize("variant", MEV_VARIANTS)
def test_accumulator_one_pass_and_shards_agree_with_dense(matrix_free: None, variant: str) -> None:
    """Words on both sides of d (rows and moments), fed in one pass and as merged shards."""
    rng = np.random.default_rng(8)
    d = 30
    counts = {0: 2, 1: 7, 2: 25, 3: 60, 4: 1}
    X = np.concatenate([anisotropic(n, d, seed=word) for word, n in counts.items()])
    X, word_ids, one_pass, sharded = one_pass_and_merged_shards(X, counts, rng, n_shards=4)
    assert sorted(one_pass) == sorted(sharded) == sorted(counts)
    for word, n in counts.items():
        rows = X[word_ids == word]
        reference = dense_reference(rows)["mev"][variant] if n >= 2 else None
        for spectra in (one_pass, sharded):
            value = spectra[word].mev(variant)
            if reference is None:  # one occurrence: it explains all of itself and has no spread
                assert value == pytest.approx(1.0, rel=1e-12) if variant == "uncentred" else np.isnan(value)
            else:
                rtol = DIRECTION_TOL if variant == "svd_ratio" else VALUE_RTOL
                assert value == pytest.approx(reference, rel=rtol)


def test_mev_series_matches_dense(matrix_free: None) -> None:
    X = np.concatenate([anisotropic(40, 50, seed=9), flat(12, 50, seed=10), anisotropic(3, 50, seed=11)])
    labels = np.array(["a"] * 40 + ["b"] * 12 + ["c"] * 3)
    for variant in MEV_VARIANTS:
        series = mev(X, labels, variant=variant)
        for word in "abc":
            expected = dense_reference(X[labels == word])["mev"][variant]
            assert series[word] == pytest.approx(expected, rel=DIRECTION_TOL if variant == "svd_ratio" else VALUE_RTOL)


def test_first_principal_direction_is_eighs_with_the_mean_sign(matrix_free: None) -> None:
    X = -anisotropic(70, 40, seed=12)
    direction = first_principal_direction(X)
    reference = dense_reference(X)["direction"]
    assert np.linalg.norm(direction - reference) < DIRECTION_TOL
    assert direction @ X.mean(axis=0) > 0


def test_seeded_start_gives_identical_results(matrix_free: None) -> None:
    X = flat(60, 45, seed=13)
    first, second = occurrence_spectrum(X), occurrence_spectrum(X)
    assert first.top_eigenvalue == second.top_eigenvalue
    assert np.array_equal(first.direction, second.direction)


def test_stopping_short_of_convergence_warns(matrix_free: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lanczos_module, "MAX_MULTIPLICATIONS", 6)
    with pytest.warns(RuntimeWarning, match="block Lanczos stopped after"):
        occurrence_spectrum(flat(80, 90, seed=14))


# ---- float32 rows (as a store holds them): float32 Krylov steps, float64 refinement, exact results

def as_float32(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The float32 rows and their exact float64 values (the reference is computed on the latter)."""
    X32 = X.astype(np.float32)
    return X32, X32.astype(np.float64)


@pytest.mark.parametrize("n,d", SHAPES)
@pytest.mark.parametrize("make", [anisotropic, flat])
def test_float32_rows_matrix_free_match_dense_eigh(matrix_free: None, make, n: int, d: int) -> None:
    X32, X = as_float32(make(n, d, seed=n + 2 * d) + 3.0)  # a dominant mean, as in real layers
    assert_matches(occurrence_spectrum(X32), X)


def test_float32_rows_at_width_beyond_the_dense_limit() -> None:
    n, d = MATRIX_FREE_SHAPE
    for X in (anisotropic(n, d, seed=21), flat(n, d, seed=22)):
        X32, X64 = as_float32(X)
        assert_matches(occurrence_spectrum(X32), X64)


def test_float32_two_occurrences_rank_deficient_and_near_degenerate(matrix_free: None) -> None:
    two32, two = as_float32(np.array([[3.0, 1.0, 0.0, 2.0], [1.0, 2.0, 2.0, 0.0]]))
    assert_matches(occurrence_spectrum(two32), two)
    low32, low = as_float32(with_singular_values(50, 70, np.linspace(3.0, 1.0, 2), seed=23))
    assert_matches(occurrence_spectrum(low32), low)
    singular = np.sqrt(np.array([10.0 * (1 + 1e-12), 10.0, 4.0, 3.0, 1.0]))
    close32, close = as_float32(with_singular_values(60, 80, singular, seed=24) + 0.5)
    assert_matches(occurrence_spectrum(close32), close, direction_defined=False)


def test_float32_rows_stay_float32_and_are_kept_up_to_four_d(matrix_free: None) -> None:
    """float32 rows take half the bytes, so a word keeps 4d of them (2d float64) before becoming X^T X;
    either way the spectrum matches eigh."""
    d = 20
    counts = {0: 3, 1: 4 * d, 2: 4 * d + 1}
    X = np.concatenate([anisotropic(n, d, seed=30 + word) for word, n in counts.items()])
    word_ids = np.repeat(list(counts), list(counts.values()))
    X32, X64 = as_float32(X)
    accumulator = MEVAccumulator(len(counts)).add(X32, word_ids=word_ids)
    assert sorted(accumulator.rows) == [0, 1] and sorted(accumulator.second_moments) == [2]
    assert all(block.dtype == np.float32 for blocks in accumulator.rows.values() for block in blocks)
    wide = MEVAccumulator(len(counts)).add(X64, word_ids=word_ids)
    assert sorted(wide.rows) == [0] and sorted(wide.second_moments) == [1, 2]  # float64: 2d rows
    for word, spectrum in accumulator.result().items():
        assert_matches(spectrum, X64[word_ids == word])


def test_mev_state_bytes_bounds_the_accumulator() -> None:
    d = 16
    counts = np.array([1, 2 * d, 2 * d + 1, 100 * d])
    assert list(mev_state_bytes(counts, d)) == [8 * d, 16 * d * d, 16 * d * d, 16 * d * d]
    rng = np.random.default_rng(31)
    for dtype in (np.float32, np.float64):
        word_ids = np.repeat(np.arange(len(counts)), counts)
        accumulator = MEVAccumulator(len(counts))
        for part in np.array_split(rng.permutation(len(word_ids)), 7):
            accumulator.add(rng.standard_normal((len(part), d)).astype(dtype), word_ids=word_ids[part])
        for word, limit in enumerate(mev_state_bytes(counts, d)):
            held = sum(block.nbytes for block in accumulator.rows.get(word, ()))
            held += accumulator.second_moments[word].nbytes if word in accumulator.second_moments else 0
            assert held <= limit


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_expected_counts_route_words_up_front_and_keep_rows_as_views(matrix_free: None, dtype: type) -> None:
    """With each word's count known, words beyond the row budget are X^T X from their first rows and
    the kept rows are views of the grouped copies that hold nothing else (no copy a word, no dead
    rows); the spectra match the accumulator without counts and dense eigh, in one pass, merged
    shards and after a state round trip."""
    d = 16
    counts = np.array([3, 2 * d, 2 * d + 1, 4 * d + 1, 100 * d])
    rng = np.random.default_rng(33)
    word_ids = np.repeat(np.arange(len(counts)), counts)
    X = np.concatenate([anisotropic(int(n), d, seed=40 + word) for word, n in enumerate(counts)]).astype(dtype)
    parts = np.array_split(rng.permutation(len(word_ids)), 7)
    hinted, plain = MEVAccumulator(len(counts), expected_counts=counts), MEVAccumulator(len(counts))
    shards = [MEVAccumulator(len(counts), expected_counts=counts) for _ in range(2)]
    for i, part in enumerate(parts):
        hinted.add(X[part], word_ids=word_ids[part])
        plain.add(X[part], word_ids=word_ids[part])
        shards[i % 2].add(X[part], word_ids=word_ids[part])
    budget_rows = 2 * 8 * d // np.dtype(dtype).itemsize
    assert sorted(hinted.second_moments) == [word for word, n in enumerate(counts) if n > budget_rows]
    assert sorted(hinted.rows) == [word for word, n in enumerate(counts) if n <= budget_rows]
    blocks = [block for word_blocks in hinted.rows.values() for block in word_blocks]
    assert all(block.base is not None for block in blocks)
    bases = {id(block.base): block.base.nbytes for block in blocks}
    assert sum(bases.values()) == sum(block.nbytes for block in blocks)
    for word, limit in enumerate(mev_state_bytes(counts, d, row_bytes=np.dtype(dtype).itemsize)):
        held = sum(block.nbytes for block in hinted.rows.get(word, ()))
        assert held + (8 * d * d if word in hinted.second_moments else 0) <= limit
    merged = shards[0].merge(shards[1])
    restored = MEVAccumulator.from_state_dict(hinted.state_dict())
    reference = plain.result()
    for spectra in (hinted.result(), merged.result(), restored.result()):
        assert sorted(spectra) == sorted(reference)
        for word, spectrum in spectra.items():
            assert spectrum.top_eigenvalue == pytest.approx(reference[word].top_eigenvalue, rel=VALUE_RTOL)
            assert spectrum.centred_top_eigenvalue == pytest.approx(reference[word].centred_top_eigenvalue, rel=VALUE_RTOL)
            assert_matches(spectrum, X[word_ids == word].astype(np.float64))


def test_expected_counts_must_bound_every_word() -> None:
    X = np.random.default_rng(34).standard_normal((6, 5))
    accumulator = MEVAccumulator(2, expected_counts=np.array([3, 2]))
    with pytest.raises(ValueError, match="more than its expected count of 2 occurrences"):
        accumulator.add(X, word_ids=np.array([0, 0, 0, 1, 1, 1]))
    with pytest.raises(ValueError, match="more than its expected count of 2"):
        MEVAccumulator(2, expected_counts=np.array([3, 2])).merge(MEVAccumulator(2).add(X, word_ids=np.array([0, 0, 0, 1, 1, 1])))
    with pytest.raises(ValueError, match="one count for each of the 2 words"):
        MEVAccumulator(2, expected_counts=np.array([3, 2, 1]))


def test_float32_zero_tiny_and_non_finite_rows() -> None:
    X = np.random.default_rng(32).standard_normal((6, 5)).astype(np.float32)
    X[1] = 0.0
    X[2] = 1e-30  # its float32 square underflows to zero, but the row is not zero
    accumulator = MEVAccumulator(2).add(X, word_ids=np.array([0, 0, 0, 1, 1, 1]))
    assert accumulator.n_zero == 1 and list(accumulator.counts) == [2, 3]
    X[4, 2] = np.nan
    with pytest.raises(ValueError, match=r"non-finite values \(NaN or inf\) in row 4"):
        MEVAccumulator(2).add(X, word_ids=np.array([0, 0, 0, 1, 1, 1]))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_one_pass_and_shards_closed_forms_identical_iterative_within_tolerance(matrix_free: None, dtype: type) -> None:
    """Closed-form statistics (counts, ||X||_F^2, tr C, mean) agree to 1e-12 between one pass and
    merged shards; the iterative ones (top eigenvalues, direction) to their tolerances, and both to eigh."""
    rng = np.random.default_rng(33)
    d = 24
    counts = {0: 2, 1: 9, 2: 40, 3: 70, 4: 130}  # rows, rows past d, and moments for both dtypes
    X = np.concatenate([anisotropic(n, d, seed=40 + word) + 2.0 for word, n in counts.items()]).astype(dtype)
    X, word_ids, one_pass, sharded = one_pass_and_merged_shards(X, counts, rng, n_shards=5)
    for word in counts:
        a, b = one_pass[word], sharded[word]
        assert a.n == b.n == counts[word]
        for closed in ("frobenius_sq", "centred_total"):
            assert getattr(a, closed) == pytest.approx(getattr(b, closed), rel=1e-12)
        assert np.allclose(a.mean, b.mean, rtol=1e-12, atol=0)
        assert a.top_eigenvalue == pytest.approx(b.top_eigenvalue, rel=VALUE_RTOL)
        assert a.centred_top_eigenvalue == pytest.approx(b.centred_top_eigenvalue, rel=VALUE_RTOL)
        assert np.linalg.norm(a.direction - b.direction) < DIRECTION_TOL
        assert_matches(b, X[word_ids == word].astype(np.float64))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("spread", [1e-1, 1e-3])
def test_dominant_mean_closed_form_or_centred_pass(matrix_free: None, dtype: type, spread: float) -> None:
    """tr C and v' C v come from closed forms while the mean dominates by less than 1e6 in energy and
    from explicitly centred rows beyond: both match eigh of the centred rows."""
    rng = np.random.default_rng(50)
    row = rng.standard_normal(40) * 10
    X = (row + spread * anisotropic(60, 40, seed=51)).astype(dtype)
    assert_matches(occurrence_spectrum(X), X.astype(np.float64))


def test_float32_rows_take_float32_steps_then_float64(matrix_free: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """float32 rows get a float32 solve (stopping at float32 noise) before the float64 one; float64 rows only the latter."""
    noises: list[float] = []
    solve = spectrum_module.top_eigenpairs

    def recording(*args, **kwargs):  # type: ignore[no-untyped-def]
        noises.append(kwargs.get("tolerances", lanczos_module.Tolerances()).noise)
        return solve(*args, **kwargs)

    monkeypatch.setattr(spectrum_module, "top_eigenpairs", recording)
    X32, X = as_float32(anisotropic(50, 60, seed=60))
    assert_matches(occurrence_spectrum(X32), X)
    assert len(noises) == 2 and noises[0] > 0 and noises[1] == 0
    noises.clear()
    occurrence_spectrum(X)
    assert noises == [0.0]
