"""Attribution of a layer's geometry to the terms that write it. Pure: sums in, shares out.

A layer's vector x is, where the model's sum rule holds, the sum of its terms t_1..t_K (a pre-LN
block: x = resid_pre + attn_out + mlp_out; BERT at its LayerNorm inputs: resid_pre + attn_out, then
resid_mid + mlp_out). Both moments decompose exactly:

- **Mean**: mu = sum_k mu_k, and the share of term k in the mean direction (the anisotropy) is
  s_k = <mu_k, mu> / ||mu||^2; the shares sum to 1.
- **Variance of dimension d**: Var(x_d) = sum_k Cov(t_k,d, x_d) = sum_k sum_j Cov(t_k,d, t_j,d); the
  share of term k is Cov(t_k,d, x_d) / Var(x_d) (the shares sum to 1), split into its own variance
  Var(t_k,d) and its cross terms sum_{j != k} Cov(t_k,d, t_j,d). The same over all dimensions (the
  trace of the covariance) gives the total-variance shares. Covariances are population ones (divided
  by n); a share is a ratio, so the divisor cancels.
- **Massive activations**: at one of the layer's largest |x| entries (row, dimension), each term's
  value there over x there (these sum to 1 too). This needs rows, not moments:
  `TermMomentAccumulator` keeps the top entries as it streams.

`TermMomentAccumulator` streams and merges the per-term sums, the per-dimension sums of products of
every pair of terms (k <= j), each dimension's sum of |x| (for the outlier dimensions of
`lmgeom.metrics.outliers.magnitude_outliers`), the largest |x| entries with each term's value there
and the largest |x - sum_k t_k| (the residual of the sum rule, against the stored x). `decompose`
turns the sums into the decomposition; `attribution_summary` into plain numbers per term.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

import numpy as np

from lmgeom.errors import InputError
from lmgeom.metrics.base import StatefulAccumulator, register_accumulator, row_ids
from lmgeom.metrics.outliers import OUTLIER_SIGMAS, TOP_ACTIVATIONS, magnitude_outliers

TOP_VARIANCE_DIMENSIONS = 3
"""How many of a layer's dimensions of largest variance `attribution_summary` attributes, beside its
magnitude outliers."""


def term_pairs(n_terms: int) -> list[tuple[int, int]]:
    """The pairs (k, j), k <= j, of `n_terms` terms, in the order the products are kept: (0, 0), (0,
    1), ..., (0, K-1), (1, 1), ...

    Parameters
    ----------
    n_terms : int
        K, the number of terms.

    Returns
    -------
    list of (int, int)
        K (K + 1) / 2 pairs.
    """
    return [(k, j) for k in range(n_terms) for j in range(k, n_terms)]


@dataclass(frozen=True)
class TermDecomposition:
    """The exact decomposition of a sum's mean and per-dimension variance into its K terms.

    `term_means` (K, d) and `mean` (d); `covariances` (K, K, d): Cov(t_k,d, t_j,d); `variance` (d):
    Var(x_d) = the sum of `covariances` over k and j."""

    n: int
    term_means: np.ndarray
    covariances: np.ndarray

    @property
    def mean(self) -> np.ndarray:
        return self.term_means.sum(axis=0)

    @property
    def variance(self) -> np.ndarray:
        return self.covariances.sum(axis=(0, 1))

    @property
    def mean_shares(self) -> np.ndarray:
        """<mu_k, mu> / ||mu||^2 per term (NaN when mu = 0)."""
        mean = self.mean
        norm2 = float(mean @ mean)
        return self.term_means @ mean / norm2 if norm2 > 0 else np.full(len(self.term_means), np.nan)

    def variance_parts(self, dims: Sequence[int] | None = None) -> dict[str, np.ndarray]:
        """Each term's share of the variance of the dimensions `dims` summed (None: every dimension,
        the trace): `total` Cov(t_k, x) / Var(x), and its `own` Var(t_k) / Var(x) and `cross`
        (total - own) parts, each of shape (K,). NaN when that variance is 0."""
        covariances = self.covariances if dims is None else self.covariances[:, :, np.asarray(dims, dtype=np.int64)]
        summed = covariances.sum(axis=2)  # (K, K)
        variance = float(summed.sum())
        if variance <= 0:
            nan = np.full(len(summed), np.nan)
            return {"total": nan, "own": nan, "cross": nan}
        total = summed.sum(axis=1) / variance
        own = np.diag(summed) / variance
        return {"total": total, "own": own, "cross": total - own}

    def dimension_shares(self) -> np.ndarray:
        """(K, d): Cov(t_k,d, x_d) / Var(x_d) per dimension (NaN where Var(x_d) = 0)."""
        variance = self.variance
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(variance > 0, self.covariances.sum(axis=1) / np.where(variance > 0, variance, 1), np.nan)


def decompose(sums: Any, products: Any, n: int, *, shift: Any | None = None) -> TermDecomposition:
    """The decomposition of a sum's mean and per-dimension variance into its terms, from moments.

    Parameters
    ----------
    sums : array of shape (K, d)
        sum_i (t_k,i - shift_k) of each term over the n rows.
    products : array of shape (K (K + 1) / 2, d)
        sum_i (t_k,i,d - shift_k,d)(t_j,i,d - shift_j,d) per dimension, for the pairs of `term_pairs(K)`.
    n : int
        The number of rows, at least 1.
    shift : array of shape (K, d), optional
        What each term's rows had subtracted before summing (None: nothing); covariances do not
        depend on it, means add it back.

    Returns
    -------
    TermDecomposition
        Term means and per-dimension covariances (population, divided by n).

    Raises
    ------
    InputError
        `n` below 1, or shapes that do not match.
    """
    sums = np.asarray(sums, dtype=np.float64)
    products = np.asarray(products, dtype=np.float64)
    if n < 1:
        raise InputError(f"`n` must be at least 1 row, got {n}", param="n")
    if sums.ndim != 2:
        raise InputError(f"`sums` must be a (K, d) array, got shape {sums.shape}", param="sums")
    n_terms, dim = sums.shape
    pairs = term_pairs(n_terms)
    if products.shape != (len(pairs), dim):
        raise InputError(f"`products` must be a ({len(pairs)}, {dim}) array (one row per pair k <= j of {n_terms} terms), "
                         f"got shape {products.shape}", param="products")
    shifted_means = sums / n
    covariances = np.empty((n_terms, n_terms, dim))
    for index, (k, j) in enumerate(pairs):
        covariances[k, j] = covariances[j, k] = products[index] / n - shifted_means[k] * shifted_means[j]
    means = shifted_means if shift is None else shifted_means + np.asarray(shift, dtype=np.float64)
    return TermDecomposition(int(n), means, covariances)


@register_accumulator
class TermMomentAccumulator(StatefulAccumulator):
    """The moments of K aligned term streams and their sum, streamed and mergeable.

    `add(X, rows=...)` takes X of shape (n, K + 1, d): each row's stored sum x (index 0) and its K
    terms at identical rows, and each row's store index. Sums of products are of the terms less a
    shift (each term's mean over the first rows added, kept for every later add and converted in a
    merge), so large means cost no precision. x is decomposed as sum_k t_k; the stored x only sets
    the residual of the sum rule (`residual`: max |x - sum_k t_k|) and `max_abs` (max |x|)."""

    _state_fields: ClassVar[tuple[str, ...]] = (
        "n_terms", "top_k", "count", "shift", "sums", "products", "abs_sums", "residual", "max_abs",
        "top_values", "top_stored", "top_terms", "top_rows", "top_dims")

    def __init__(self, n_terms: int, *, top_k: int = TOP_ACTIVATIONS) -> None:
        if n_terms < 1:
            raise InputError(f"`n_terms` must be at least 1, got {n_terms}", param="n_terms")
        if top_k < 1:
            raise InputError(f"`top_k` must be at least 1, got {top_k}", param="top_k")
        self.n_terms, self.top_k, self.count = int(n_terms), int(top_k), 0
        self.shift = self.sums = self.products = np.zeros((0, 0))
        self.abs_sums = np.zeros(0)
        self.residual = self.max_abs = 0.0
        self.top_values, self.top_stored = np.zeros(0), np.zeros(0)  # sum_k t_k, and the stored x, largest |x| first
        self.top_terms = np.zeros((0, self.n_terms))
        self.top_rows, self.top_dims = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)

    def add(self, X: Any, /, **ids: np.ndarray) -> TermMomentAccumulator:
        X = np.asarray(X)
        if X.ndim != 3 or X.shape[1] != self.n_terms + 1:
            raise ValueError(f"X must be an (n, {self.n_terms + 1}, d) array (the sum, then {self.n_terms} terms), got {X.shape}")
        (rows,) = row_ids(ids, ("rows",), len(X), type(self).__name__)
        return self.add_terms(X[:, 0], [X[:, k + 1] for k in range(self.n_terms)], rows=rows)

    def add_terms(self, total: Any, terms: Sequence[Any], *, rows: Any) -> TermMomentAccumulator:
        """Add n rows: the stored sum `total` (n, d), the K `terms` (each (n, d)) and each row's store
        index `rows` (n,)."""
        if len(terms) != self.n_terms:
            raise ValueError(f"{len(terms)} terms added to an accumulator of {self.n_terms}")
        stored = np.asarray(total, dtype=np.float64)
        T = np.stack([np.asarray(term, dtype=np.float64) for term in terms])  # (K, n, d)
        rows = np.asarray(rows, dtype=np.int64)
        if T.shape[1:] != stored.shape or rows.shape != (len(stored),):
            raise ValueError(f"terms {T.shape[1:]}, sum {stored.shape} and rows {rows.shape} do not match")
        if not len(stored):
            return self
        if not np.isfinite(T).all() or not np.isfinite(stored).all():
            raise InputError("a term or the sum holds NaN or inf rows; re-extract the store", param="store")
        dim = stored.shape[1]
        if not self.shift.size:
            self.shift = T.mean(axis=1)
            self.sums, self.products = np.zeros((self.n_terms, dim)), np.zeros((len(term_pairs(self.n_terms)), dim))
            self.abs_sums = np.zeros(dim)
        if self.shift.shape != (self.n_terms, dim):
            raise ValueError(f"rows of dimension {dim} added to an accumulator of dimension {self.shift.shape[1]}")
        x = T.sum(axis=0)
        centred = T - self.shift[:, None, :]
        self.count += len(stored)
        self.sums += centred.sum(axis=1)
        for index, (k, j) in enumerate(term_pairs(self.n_terms)):
            self.products[index] += np.einsum("nd,nd->d", centred[k], centred[j])
        magnitudes = np.abs(x)
        self.abs_sums += magnitudes.sum(axis=0)
        self.residual = max(self.residual, float(np.abs(stored - x).max()))
        self.max_abs = max(self.max_abs, float(np.abs(stored).max()))
        flat = magnitudes.ravel()
        take = min(self.top_k, flat.size)
        top = np.argpartition(-flat, take - 1)[:take]
        local_rows, dims = np.divmod(top, dim)
        self._keep_top(x[local_rows, dims], stored[local_rows, dims], T[:, local_rows, dims].T, rows[local_rows], dims)
        return self

    def _keep_top(self, values: np.ndarray, stored: np.ndarray, terms: np.ndarray, rows: np.ndarray, dims: np.ndarray) -> None:
        values, stored = np.concatenate([self.top_values, values]), np.concatenate([self.top_stored, stored])
        terms = np.concatenate([self.top_terms.reshape(-1, self.n_terms), terms])
        rows, dims = np.concatenate([self.top_rows, rows]), np.concatenate([self.top_dims, dims])
        # largest |x| first; ties by row then dimension, so the kept set does not depend on the order of adds
        order = np.lexsort((dims, rows, -np.abs(values)))[: self.top_k]
        self.top_values, self.top_stored, self.top_terms = values[order], stored[order], terms[order]
        self.top_rows, self.top_dims = rows[order], dims[order]

    def merge(self, other: TermMomentAccumulator) -> TermMomentAccumulator:
        if (other.n_terms, other.top_k) != (self.n_terms, self.top_k):
            raise ValueError("cannot merge accumulators of different terms or top_k")
        if not other.count:
            return self
        if not self.count:
            self.load_state_dict(other.state_dict())
            return self
        if other.shift.shape != self.shift.shape:
            raise ValueError(f"cannot merge accumulators of shapes {self.shift.shape} and {other.shift.shape}")
        # other's sums about its shift b, taken about ours a: t - a = (t - b) + delta, delta = b - a
        delta = other.shift - self.shift
        sums = other.sums + other.count * delta
        for index, (k, j) in enumerate(term_pairs(self.n_terms)):
            self.products[index] += (other.products[index] + delta[k] * other.sums[j] + delta[j] * other.sums[k]
                                     + other.count * delta[k] * delta[j])
        self.sums = self.sums + sums
        self.count += other.count
        self.abs_sums = self.abs_sums + other.abs_sums
        self.residual, self.max_abs = max(self.residual, other.residual), max(self.max_abs, other.max_abs)
        self._keep_top(other.top_values, other.top_stored, other.top_terms, other.top_rows, other.top_dims)
        return self

    def _after_load(self) -> None:
        self.n_terms, self.top_k, self.count = int(self.n_terms), int(self.top_k), int(self.count)
        self.residual, self.max_abs = float(self.residual), float(self.max_abs)
        self.top_terms = np.asarray(self.top_terms).reshape(-1, self.n_terms)

    def result(self) -> TermAttribution:
        if not self.count:
            raise InputError("no rows were added to the attribution accumulator", param="store")
        return TermAttribution(decompose(self.sums, self.products, self.count, shift=self.shift), self.abs_sums / self.count,
                               self.residual, self.max_abs, self.top_values.copy(), self.top_stored.copy(),
                               self.top_terms.copy(), self.top_rows.copy(), self.top_dims.copy())


@dataclass(frozen=True)
class TermAttribution:
    """What `TermMomentAccumulator` saw: the decomposition, mean |x| per dimension, the residual of the
    sum rule and max |x| (stored), and the largest |x| entries (x = sum of the terms; the stored x;
    each term's value, (top_k, K); row and dimension)."""

    decomposition: TermDecomposition
    mean_abs: np.ndarray
    residual: float
    max_abs: float
    top_values: np.ndarray
    top_stored: np.ndarray
    top_terms: np.ndarray
    top_rows: np.ndarray
    top_dims: np.ndarray


def _by_term(names: Sequence[str], values: np.ndarray) -> dict[str, float]:
    return {name: float(value) for name, value in zip(names, values)}


def _parts(names: Sequence[str], parts: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    return {name: {part: float(values[k]) for part, values in parts.items()} for k, name in enumerate(names)}


def attribution_summary(result: TermAttribution, terms: Sequence[str], *, n_sigma: float = OUTLIER_SIGMAS,
                        top_variance: int = TOP_VARIANCE_DIMENSIONS) -> dict[str, Any]:
    """A layer's attribution as plain numbers, by term name.

    Parameters
    ----------
    result : TermAttribution
        The accumulator's result.
    terms : sequence of str
        The terms' names, in the accumulator's order.
    n_sigma : float
        The magnitude outliers' threshold (`lmgeom.metrics.outliers.magnitude_outliers`: mean |x| more
        than `n_sigma` standard deviations above its mean over dimensions).
    top_variance : int
        How many dimensions of largest Var(x_d) to attribute besides.

    Returns
    -------
    dict
        `n_rows`; `mean_norm` ||mu|| and `mean_shares` (term -> <mu_k, mu> / ||mu||^2); `variance_shares`
        (the trace: term -> total, own, cross); `outlier_dimensions` and `top_variance_dimensions` (each
        a dimension, its variance, mean |x| and shares: term -> total, own, cross); `massive` (the
        largest |x| entries: row, dimension, x, the stored x, each term's value and value / x); the
        sum rule's `residual` (max |x - sum of terms| over the rows, against the stored x) and `max_abs`.
    """
    if len(terms) != len(result.decomposition.term_means):
        raise InputError(f"`terms` names {len(terms)} terms for a decomposition of {len(result.decomposition.term_means)}",
                         param="terms")
    decomposition = result.decomposition
    variance = decomposition.variance

    def dimension(d: int) -> dict[str, Any]:
        return {"dimension": int(d), "variance": float(variance[d]), "mean_abs": float(result.mean_abs[d]),
                "shares": _parts(terms, decomposition.variance_parts([d]))}

    outliers = magnitude_outliers(result.mean_abs, n_sigma=n_sigma).dimensions  # largest first
    by_variance = np.argsort(-variance, kind="stable")[:top_variance]
    massive = [{"row": int(row), "dimension": int(dim), "value": float(value), "stored": float(stored),
                "terms": _by_term(terms, values), "shares": _by_term(terms, values / value if value else values * np.nan)}
               for value, stored, values, row, dim in zip(result.top_values, result.top_stored, result.top_terms,
                                                          result.top_rows, result.top_dims)]
    return {"n_rows": decomposition.n, "mean_norm": float(np.linalg.norm(decomposition.mean)),
            "mean_shares": _by_term(terms, decomposition.mean_shares),
            "variance_shares": _parts(terms, decomposition.variance_parts()),
            "outlier_dimensions": [dimension(d) for d in outliers],
            "top_variance_dimensions": [dimension(d) for d in by_variance],
            "massive": massive, "residual": result.residual, "max_abs": result.max_abs}
