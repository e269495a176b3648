"""MEV solved for the variants asked for only (`variants=` of `MEVAccumulator`, `rows_spectra`,
`moment_spectrum`; `mev(variant=...)`).

Each single variant must equal the all-variant solve (bit for bit where the same dense reduction
serves both, else to the tolerances of tests/test_mev_spectrum.py: values 1e-9 relative, svd_ratio
1e-6) and a brute-force `numpy.linalg.eigh`, on every route; and it must not solve the others.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

from lmgeom.metrics import MEV_VARIANTS, MEVAccumulator, mev
from lmgeom.metrics import spectrum as spectrum_module
from lmgeom.metrics.spectrum import moment_spectrum, rows_spectra

from helpers import pin_spectrum_route

VALUE_RTOL = 1e-9
DIRECTION_TOL = 1e-6
D = 30
# rows of several words: fewer than d, about d, more than d (kept as rows up to 2d float64 rows),
# and more than 2d (kept as X^T X: the moment routes)
COUNTS = (2, 5, 12, 29, 31, 45, 70)


def tolerance(variant: str) -> float:
    return DIRECTION_TOL if variant == "svd_ratio" else VALUE_RTOL


def brute_force(X: np.ndarray) -> dict[str, float]:
    """Each variant from full `numpy.linalg.eigh` of X^T X and of the explicitly centred scatter matrix."""
    centred = X - X.mean(axis=0)
    values, vectors = np.linalg.eigh(X.T @ X)
    centred_values = np.linalg.eigvalsh(centred.T @ centred)
    total = float(np.sum(centred**2))
    along = float(np.sum((centred @ vectors[:, -1]) ** 2))
    return {"uncentred": values[-1] / float(np.sum(X**2)), "centred": centred_values[-1] / total, "svd_ratio": along / total}


def occurrences(dtype: type, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the COUNTS words (one common direction, a decaying spread per word, noise), shuffled."""
    rng = np.random.default_rng(seed)
    common = 3 * rng.standard_normal(D) / np.sqrt(D)
    words = []
    for n in COUNTS:
        spread = rng.standard_normal((n, 6)) * 2.0 * 0.6 ** np.arange(6) @ np.linalg.qr(rng.standard_normal((D, 6)))[0].T
        words.append(common + spread + 0.3 * rng.standard_normal((n, D)))
    labels = np.repeat([f"w{i}" for i in range(len(COUNTS))], COUNTS)
    order = rng.permutation(len(labels))
    return np.concatenate(words)[order].astype(dtype), labels[order]


# every route forced, as tests/test_mev_spectrum.py does: the batched Gram eigh, the per-word
# tridiagonal reduction of the bordered Gram matrix, the scatter matrix (words held as X^T X and
# words of more rows than d), block Lanczos (rows and moments) to convergence
ROUTES = ["gram-batched", "gram-tridiagonal", "scatter", "krylov"]
# where one dense reduction serves every variant, a single variant is the all-variant value bit for
# bit (the batched route's uncentred top comes from `eigvalsh` instead of `eigh`: within rounding)
EXACT_ROUTES = ("gram-tridiagonal", "scatter")


@pytest.fixture(params=ROUTES)
def route(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    return pin_spectrum_route(monkeypatch, request.param)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_each_variant_alone_equals_the_all_variant_solve_and_eigh(route: str, dtype: type) -> None:
    X, labels = occurrences(dtype, seed=1)
    ids = np.unique(labels, return_inverse=True)[1]
    every = MEVAccumulator(len(COUNTS)).add(X, word_ids=ids).result()
    held_as_moments = MEVAccumulator(len(COUNTS), expected_counts=np.bincount(ids)).add(X, word_ids=ids).second_moments
    # float64 rows are kept up to 2d (the 70-row word is held as X^T X), float32 rows up to 4d
    assert sorted(held_as_moments) == ([6] if dtype == np.float64 else [])
    for variant in MEV_VARIANTS:
        alone = mev(X, labels, variant=variant)
        assert list(alone.index) == [f"w{i}" for i in range(len(COUNTS))] and alone.name == f"mev_{variant}"
        for word, value in alone.items():
            word_id = int(word[1:])
            together = every[word_id].mev(variant)
            if route in EXACT_ROUTES or (route == "gram-batched" and variant != "uncentred"):
                assert value == together
            else:
                assert value == pytest.approx(together, rel=tolerance(variant))
            assert value == pytest.approx(brute_force(X[labels == word].astype(np.float64))[variant], rel=tolerance(variant))


def test_moment_spectrum_for_one_variant(route: str) -> None:
    """A word held as X^T X (n > d): dense reduction or Lanczos on the moment, for each variant alone."""
    rng = np.random.default_rng(2)
    X = rng.standard_normal((120, D)) @ np.diag(np.linspace(2.0, 0.2, D)) + 0.7
    reference = brute_force(X)
    every = moment_spectrum(len(X), X.sum(axis=0), X.T @ X)
    for variant in MEV_VARIANTS:
        alone = moment_spectrum(len(X), X.sum(axis=0), X.T @ X, variants=(variant,)).mev(variant)
        if route != "krylov":
            assert alone == every.mev(variant)
        assert alone == pytest.approx(every.mev(variant), rel=tolerance(variant))
        assert alone == pytest.approx(reference[variant], rel=tolerance(variant))


def test_two_variants_solve_what_both_need(route: str) -> None:
    rng = np.random.default_rng(3)
    words = [rng.standard_normal((n, D)) + rng.standard_normal(D) for n in (3, 20, 50)]
    for variants in (("uncentred", "centred"), ("centred", "svd_ratio"), ("svd_ratio", "uncentred")):
        for X, spectrum in zip(words, rows_spectra(words, variants=variants)):
            assert spectrum.variants == tuple(v for v in MEV_VARIANTS if v in variants)
            for variant in variants:
                assert spectrum.mev(variant) == pytest.approx(brute_force(X)[variant], rel=tolerance(variant))


# ---- asking for one variant does not compute the others

def test_a_single_variant_spectrum_holds_only_what_it_needs(route: str) -> None:
    rng = np.random.default_rng(4)
    X = rng.standard_normal((sum(COUNTS), D)) + 0.5
    ids = np.repeat(np.arange(len(COUNTS)), COUNTS)
    unsolved = {"uncentred": ("centred_top_eigenvalue", "centred_total", "centred_along_direction"),
                "centred": ("top_eigenvalue", "centred_along_direction"),
                "svd_ratio": ("centred_top_eigenvalue",)}
    for variant in MEV_VARIANTS:
        spectra = MEVAccumulator(len(COUNTS), variants=[variant]).add(X, word_ids=ids).result()
        assert sorted(spectra) == list(range(len(COUNTS)))
        for word, spectrum in spectra.items():
            assert spectrum.variants == (variant,)
            assert all(np.isnan(getattr(spectrum, field)) for field in unsolved[variant])
            assert np.isnan(spectrum.direction).all() == (variant != "svd_ratio")
            assert spectrum.n == COUNTS[word] and np.allclose(spectrum.mean, X[ids == word].mean(axis=0), rtol=1e-12)
            for other in set(MEV_VARIANTS) - {variant}:
                with pytest.raises(ValueError, match=f"solved for the MEV variants {variant} only; include '{other}'"):
                    spectrum.mev(other)


def recording(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, record: Callable[..., Any]) -> None:
    """Replace `owner.name` by a wrapper that calls `record(*args, **kwargs)` and then the original."""
    original = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        record(*args, **kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_lanczos_solves_only_the_eigenproblems_asked_for(monkeypatch: pytest.MonkeyPatch, dtype: type) -> None:
    """One operator instead of two (X^T X for uncentred and svd_ratio, C for centred), with a
    direction only for svd_ratio; on a flat spectrum with a dominant mean (the wide-gap uncentred
    problem beside a flat centred one) the uncentred or svd_ratio MEV alone takes a fraction of the
    products, the centred one what the shared basis took for both."""
    monkeypatch.setattr(spectrum_module, "word_route", lambda n, dim, formed=False: "krylov")
    monkeypatch.setattr(spectrum_module, "krylov_budget", lambda n, dim, formed=False: None)
    solves: list[list[bool]] = []
    products: list[int] = []
    recording(monkeypatch, spectrum_module, "top_eigenpairs", lambda apply, start, **kwargs: solves.append(kwargs["need_vector"]))
    recording(monkeypatch, spectrum_module._ChunkedRows, "scatter_images", lambda rows, block, dtype: products.append(block.shape[1]))
    X = (np.random.default_rng(5).standard_normal((300, 200)) + 0.5).astype(dtype)
    spent = {}
    expected = {"uncentred": [False], "centred": [False], "svd_ratio": [True]}
    for variants in (MEV_VARIANTS, *((variant,) for variant in MEV_VARIANTS)):
        solves.clear()
        products.clear()
        spectrum = rows_spectra([X], variants=variants)[0]
        name = "all" if len(variants) > 1 else variants[0]
        spent[name] = sum(products)
        # float32 rows: a float32 solve (directions of each operator, for the float64 start) first
        refined = solves[-1]
        assert refined == ([True, False] if name == "all" else expected[name])
        if dtype == np.float32:
            assert len(solves) == 2 and solves[0] == [True] * len(refined)
        for variant in variants:
            assert spectrum.mev(variant) == pytest.approx(brute_force(X.astype(np.float64))[variant], rel=tolerance(variant))
    assert spent["uncentred"] < spent["all"] / 2 and spent["svd_ratio"] < spent["all"] / 2
    assert spent["centred"] <= spent["all"] + spectrum_module.BLOCK_SIZE


def test_dense_reductions_skip_the_tops_not_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tridiagonal routes (bordered Gram matrix, scatter matrix) reduce once and then find only
    the tops asked for: an eigenvector (`_top_pair`) only for svd_ratio, C's top only for centred;
    the batched Gram route calls `eigh` (with vectors) only for svd_ratio."""
    monkeypatch.setattr(spectrum_module, "BATCHED_EIGH_LIMIT", 0)
    calls: list[str] = []
    recording(monkeypatch, spectrum_module, "_top_pair", lambda *args: calls.append("pair"))
    recording(monkeypatch, spectrum_module, "_tridiagonal_top", lambda *args: calls.append("top"))
    rng = np.random.default_rng(6)
    words = [rng.standard_normal((n, D)) + 1.0 for n in (20, 25)]  # Gram route, tridiagonal per word
    moment = rng.standard_normal((90, D)) + 1.0  # X^T X at small width: the scatter matrix's reduction
    # per word: the pair (which finds its top inside), C's top
    expected = {"all": ["top", "pair", "top"], "uncentred": ["top"], "centred": ["top"], "svd_ratio": ["top", "pair"]}
    for variants in (MEV_VARIANTS, *((variant,) for variant in MEV_VARIANTS)):
        name = "all" if len(variants) > 1 else variants[0]
        calls.clear()
        rows_spectra(words, variants=variants)
        assert sorted(calls) == sorted(expected[name] * len(words))
        calls.clear()
        moment_spectrum(len(moment), moment.sum(axis=0), moment.T @ moment, variants=variants)
        assert sorted(calls) == sorted(expected[name])
    monkeypatch.setattr(spectrum_module, "BATCHED_EIGH_LIMIT", 10**6)
    eigen: list[tuple[str, int]] = []
    recording(monkeypatch, np.linalg, "eigh", lambda matrices: eigen.append(("eigh", matrices.shape[-1])))
    recording(monkeypatch, np.linalg, "eigvalsh", lambda matrices: eigen.append(("eigvalsh", matrices.shape[-1])))
    size = max(len(X) for X in words)
    batched = {"all": [("eigh", size + 1), ("eigvalsh", size)], "uncentred": [("eigvalsh", size + 1)],
               "centred": [("eigvalsh", size)], "svd_ratio": [("eigh", size + 1)]}
    for variants in (MEV_VARIANTS, *((variant,) for variant in MEV_VARIANTS)):
        eigen.clear()
        rows_spectra(words, variants=variants)
        assert eigen == batched["all" if len(variants) > 1 else variants[0]]


# ---- the parameter

def test_variants_are_checked_and_kept_out_of_the_state() -> None:
    for wrong in ((), ("pca",), "centred", ("centred", 1)):
        with pytest.raises(ValueError, match="variants must"):
            MEVAccumulator(3, variants=wrong)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="variants must"):
            rows_spectra([np.ones((2, 3))], variants=wrong)  # type: ignore[arg-type]
    assert MEVAccumulator(3).variants == MEV_VARIANTS
    assert MEVAccumulator(3, variants=("svd_ratio", "uncentred")).variants == ("uncentred", "svd_ratio")
    rng = np.random.default_rng(7)
    X, ids = rng.standard_normal((40, 8)) + 1.0, np.repeat([0, 1, 2], [5, 15, 20])
    centred = MEVAccumulator(3, variants=("centred",)).add(X[:25], word_ids=ids[:25])
    centred.merge(MEVAccumulator(3).add(X[25:], word_ids=ids[25:]))  # merging keeps what the accumulator asks for
    every = MEVAccumulator(3).add(X, word_ids=ids).result()
    for word, spectrum in centred.result().items():
        assert spectrum.variants == ("centred",)
        assert spectrum.mev("centred") == pytest.approx(every[word].mev("centred"), rel=VALUE_RTOL)
    restored = MEVAccumulator.from_state_dict(centred.state_dict())
    assert restored.variants == MEV_VARIANTS and "variants" not in centred.state_dict()
    for word, spectrum in restored.result().items():
        for variant in MEV_VARIANTS:
            assert spectrum.mev(variant) == pytest.approx(every[word].mev(variant), rel=tolerance(variant), nan_ok=True)
