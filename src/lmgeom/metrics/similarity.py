"""Similarity between two representations of the same points: linear CKA (biased and debiased),
the orthogonal Procrustes shape distance, RSA and mutual k-NN, and their permutation baselines.

Rows X (n x p) and Y (n x q) describe the same n points (row i of both is the same word
occurrence). CKA and the Procrustes distance stream: `CrossMoments` accumulates, chunk by chunk and
mergeable across shards, the sufficient statistics of both (with a_i = ||x_i||^2, b_i = ||y_i||^2):

    n, s_x = sum x_i, s_y = sum y_i, C = X^T Y (p x q),
    sum a_i, sum b_i, sum a_i b_i, sum b_i x_i (p), sum a_i y_i (q)

A self pair (Y = X) is the same state with C = X^T X (computed as a symmetric rank-k update).
Rows are shifted by a fixed vector per side before they are accumulated (`shift_x`, `shift_y`,
e.g. the mean of a first chunk): every estimator below is invariant to a shift, and shifting keeps
float64 exact on layers whose mean is far from zero.

- Biased HSIC (Gretton et al. 2005) of linear kernels: ||C_c||_F^2 / (n - 1)^2 with the centred
  cross-covariance C_c = C - s_x s_y^T / n; linear CKA (Kornblith et al. 2019) is
  ||C_c(X, Y)||_F^2 / (||C_c(X, X)||_F ||C_c(Y, Y)||_F).
- Debiased HSIC (Song et al. 2012), on the Gram matrices K = X X^T, L = Y Y^T with their diagonals
  set to zero (K~, L~):  [tr(K~ L~) + 1'K~1 1'L~1 / ((n-1)(n-2)) - 2/(n-2) 1'K~L~1] / (n(n-3)),
  from the statistics above:  tr(K~ L~) = ||C||_F^2 - sum a_i b_i,  1'K~1 = ||s_x||^2 - sum a_i,
  1'L~1 = ||s_y||^2 - sum b_i,  1'K~L~1 = s_x^T C s_y - s_x . sum b_i x_i - s_y . sum a_i y_i + sum a_i b_i.
  It is an unbiased estimate of HSIC, so it can be negative; debiased CKA divides it by the
  square root of the two self terms (Kornblith et al. 2019, section 3; Nguyen et al. 2021), and is
  about 0 for unrelated rows where the biased CKA is inflated at small n.
- Procrustes shape distance (Williams et al. 2021, angular form): arccos of the nuclear norm of
  X^ T Y^ for centred rows scaled to unit Frobenius norm, i.e.
  arccos(||C_c||_* / sqrt(tr C_c(X, X) tr C_c(Y, Y))), in radians, 0 when Y is a rotation of X.

RSA and mutual k-NN need all pairs of points, so they run on a seeded subsample of m rows:
- RSA (Kriegeskorte et al. 2008): Spearman correlation between the upper triangles of the two
  m x m dissimilarity matrices 1 - cosine.
- Mutual k-NN (Huh et al. 2024): the mean over points of |N_k^X(i) & N_k^Y(i)| / k, neighbours by
  cosine from an exact search in blocks, each point's own row left out.
A permutation null shuffles the rows of Y (one side) on the subsample: every measure of X against
the shuffled Y is the value of unrelated rows, a baseline for each value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import array_api_compat
import numpy as np
import scipy.stats

from lmgeom.errors import InputError
from lmgeom.metrics.base import StatefulAccumulator, float64_array, in_namespace_of, register_accumulator, to_numpy

MEASURES = ("cka", "cka_debiased", "procrustes", "rsa", "knn")
"""Measure names: linear CKA, debiased linear CKA, Procrustes shape distance, RSA, mutual k-NN."""
STREAMED_MEASURES = ("cka", "cka_debiased", "procrustes")
"""Measures computed on every row from `CrossMoments`; the others run on the subsample."""
DEFAULT_K = 10
_BLOCK_ROWS = 2048


@register_accumulator
class CrossMoments(StatefulAccumulator):
    """The sufficient statistics of linear CKA (biased and debiased) and the Procrustes distance
    between rows X and their paired rows Y (see the module docstring), streamed and mergeable.

    `add(X, Y=rows)` takes a chunk of X and the same points' rows of Y; a self pair
    (`paired=False`) takes `add(X)` alone and holds X^T X. `shift_x` / `shift_y` are subtracted from
    the rows before they are accumulated (zero when None); accumulators merge only when their
    shifts are equal."""

    _state_fields: ClassVar[tuple[str, ...]] = (
        "paired", "n", "shift_x", "shift_y", "sum_x", "sum_y", "cross", "sum_sq_x", "sum_sq_y", "sum_sq_xy",
        "sum_x_by_sq_y", "sum_y_by_sq_x",
    )

    def __init__(self, *, paired: bool = True, shift_x: Any = None, shift_y: Any = None) -> None:
        self.paired = paired
        self.n = 0
        self.shift_x = np.zeros(0) if shift_x is None else np.asarray(to_numpy(shift_x), dtype=np.float64)
        self.shift_y = np.zeros(0) if shift_y is None or not paired else np.asarray(to_numpy(shift_y), dtype=np.float64)
        self.sum_x: Any = np.zeros(0)
        self.sum_y: Any = np.zeros(0)
        self.cross: Any = np.zeros((0, 0))
        self.sum_sq_x = 0.0
        self.sum_sq_y = 0.0
        self.sum_sq_xy = 0.0
        self.sum_x_by_sq_y: Any = np.zeros(0)
        self.sum_y_by_sq_x: Any = np.zeros(0)

    def add(self, X: Any, /, **paired_rows: Any) -> CrossMoments:
        """Add a chunk: `X` (rows, dim_x) and, for a paired accumulator, `Y=` the same points' rows.
        `shifted=True`: the rows already have `shift_x` / `shift_y` subtracted (a driver feeding one
        chunk to several accumulators subtracts each side's shift once)."""
        unexpected = sorted(set(paired_rows) - {"Y", "shifted"})
        if unexpected:
            raise TypeError(f"CrossMoments.add got unexpected arguments {unexpected}; it takes X and, when paired, Y=")
        if self.paired != ("Y" in paired_rows):
            raise TypeError("a paired CrossMoments takes add(X, Y=rows); a self pair (paired=False) takes add(X) alone")
        shifted = bool(paired_rows.get("shifted", False))
        xp, X = float64_array(X, name="X")
        X = X if shifted else self._shifted(X, self.shift_x)
        a = xp.linalg.vecdot(X, X)
        if self.paired:
            _, Y = float64_array(paired_rows["Y"], name="Y")
            if Y.shape[0] != X.shape[0]:
                raise ValueError(f"X and Y must hold the same points: {X.shape[0]} rows against {Y.shape[0]}")
            Y = Y if shifted else self._shifted(Y, self.shift_y)
            b = xp.linalg.vecdot(Y, Y)
            cross = X.T @ Y
        else:
            Y, b = X, a
            cross = X.T @ X  # the same operand twice: BLAS's symmetric rank-k update, half a product's cost
        if self.n == 0:
            device = array_api_compat.device(X)
            self.cross = xp.zeros((X.shape[1], Y.shape[1]), dtype=xp.float64, device=device)
            self.sum_x, self.sum_x_by_sq_y = (xp.zeros(X.shape[1], dtype=xp.float64, device=device) for _ in range(2))
            self.sum_y, self.sum_y_by_sq_x = (xp.zeros(Y.shape[1], dtype=xp.float64, device=device) for _ in range(2))
        elif tuple(self.cross.shape) != (X.shape[1], Y.shape[1]):
            raise ValueError(f"rows of dimensions ({X.shape[1]}, {Y.shape[1]}) added to an accumulator of "
                             f"({self.cross.shape[0]}, {self.cross.shape[1]})")
        self.n += int(X.shape[0])
        self.cross += cross
        self.sum_x += xp.sum(X, axis=0)
        self.sum_y += xp.sum(Y, axis=0)
        self.sum_sq_x += float(xp.sum(a))
        self.sum_sq_y += float(xp.sum(b))
        self.sum_sq_xy += float(xp.sum(a * b))
        self.sum_x_by_sq_y += b @ X
        self.sum_y_by_sq_x += a @ Y
        return self

    def _shifted(self, X: Any, shift: np.ndarray) -> Any:
        if not shift.size:
            return X
        if shift.shape[0] != X.shape[1]:
            raise ValueError(f"the shift has {shift.shape[0]} dimensions, the rows {X.shape[1]}")
        return X - in_namespace_of(X, shift)

    def merge(self, other: CrossMoments) -> CrossMoments:
        if other.paired != self.paired or not (np.array_equal(other.shift_x, self.shift_x)
                                               and np.array_equal(other.shift_y, self.shift_y)):
            raise InputError("cannot merge CrossMoments of different kinds (paired or self) or with different shifts; "
                             "give every shard the same `shift_x` and `shift_y`")
        if other.n == 0:
            return self
        if self.n == 0:
            self.load_state_dict(other.state_dict())
            return self
        if tuple(other.cross.shape) != tuple(self.cross.shape):
            raise ValueError(f"cannot merge CrossMoments of shapes {tuple(other.cross.shape)} and {tuple(self.cross.shape)}")
        self.n += other.n
        for name in ("cross", "sum_x", "sum_y", "sum_x_by_sq_y", "sum_y_by_sq_x"):
            setattr(self, name, getattr(self, name) + in_namespace_of(getattr(self, name), getattr(other, name)))
        self.sum_sq_x += other.sum_sq_x
        self.sum_sq_y += other.sum_sq_y
        self.sum_sq_xy += other.sum_sq_xy
        return self

    def result(self) -> CrossStatistics:
        return cross_statistics(self)


@dataclass(frozen=True)
class CrossStatistics:
    """What CKA and the Procrustes distance need of one pair of row sets: the biased and debiased
    HSIC, and the nuclear norm and Frobenius norms of the centred cross-covariance."""

    n: int
    hsic: float  # ||C_c||_F^2 / (n - 1)^2
    hsic_debiased: float  # Song et al. (2012); nan below 4 rows
    nuclear: float  # ||C_c||_*
    trace_x: float  # tr C_c(X, X) = ||X_c||_F^2
    trace_y: float


def cross_statistics(moments: CrossMoments) -> CrossStatistics:
    """The statistics of a `CrossMoments` (see the module docstring for the formulas)."""
    n = moments.n
    if n < 2:
        raise InputError(f"similarity needs at least 2 rows, got {n}")
    cross, sum_x, sum_y = (to_numpy(value) for value in (moments.cross, moments.sum_x, moments.sum_y))
    centred = cross - np.outer(sum_x, sum_y) / n
    hsic = float(np.sum(centred * centred)) / (n - 1) ** 2
    # a self pair's centred cross-covariance is positive semi-definite: its nuclear norm is its trace
    nuclear = float(np.trace(centred)) if not moments.paired else float(np.linalg.svd(centred, compute_uv=False).sum())
    trace_x = moments.sum_sq_x - float(sum_x @ sum_x) / n
    trace_y = moments.sum_sq_y - float(sum_y @ sum_y) / n
    if not moments.paired:  # ||X_c||_F^2 is that trace too: one sum, so a layer's distance to itself is exactly 0
        trace_x = trace_y = nuclear
    debiased = float("nan")
    if n >= 4:
        trace_kl = float(np.sum(cross * cross)) - moments.sum_sq_xy
        sum_k = float(sum_x @ sum_x) - moments.sum_sq_x
        sum_l = float(sum_y @ sum_y) - moments.sum_sq_y
        sum_kl = (float(sum_x @ cross @ sum_y) - float(sum_x @ to_numpy(moments.sum_x_by_sq_y))
                  - float(sum_y @ to_numpy(moments.sum_y_by_sq_x)) + moments.sum_sq_xy)
        debiased = (trace_kl + sum_k * sum_l / ((n - 1) * (n - 2)) - 2 * sum_kl / (n - 2)) / (n * (n - 3))
    return CrossStatistics(n, hsic, debiased, nuclear, trace_x, trace_y)


def linear_cka(xy: CrossStatistics, xx: CrossStatistics, yy: CrossStatistics, *, debiased: bool = False) -> float:
    """Linear CKA of X and Y from the statistics of the pair and of each side's self pair (all over
    the same rows): HSIC(X, Y) / sqrt(HSIC(X, X) HSIC(Y, Y)); nan when a side is constant."""
    if not xy.n == xx.n == yy.n:
        raise ValueError(f"the pair and the self pairs must cover the same rows ({xy.n}, {xx.n}, {yy.n})")
    if debiased:
        num, den = xy.hsic_debiased, xx.hsic_debiased * yy.hsic_debiased
    else:
        num, den = xy.hsic, xx.hsic * yy.hsic
    return float(num / np.sqrt(den)) if den > 0 else float("nan")


def procrustes_distance(xy: CrossStatistics) -> float:
    """Angular Procrustes shape distance in radians (0 for a rotation, pi/2 at most): arccos of the
    nuclear norm of the cross-covariance of centred, unit-Frobenius rows; nan when a side is constant."""
    scale = np.sqrt(xy.trace_x * xy.trace_y)
    if not scale > 0:
        return float("nan")
    return float(np.arccos(np.clip(xy.nuclear / scale, 0.0, 1.0)))


def streamed_measures(xy: CrossStatistics, xx: CrossStatistics, yy: CrossStatistics) -> dict[str, float]:
    """cka, cka_debiased and procrustes of one pair."""
    return {"cka": linear_cka(xy, xx, yy), "cka_debiased": linear_cka(xy, xx, yy, debiased=True),
            "procrustes": procrustes_distance(xy)}


def pair_measures(X: Any, Y: Any) -> dict[str, float]:
    """cka, cka_debiased and procrustes of two row sets held in memory (one pass of `CrossMoments`,
    shifted by each side's mean)."""
    X, Y = np.asarray(to_numpy(X), dtype=np.float64), np.asarray(to_numpy(Y), dtype=np.float64)
    shift_x, shift_y = X.mean(axis=0), Y.mean(axis=0)
    xy = CrossMoments(shift_x=shift_x, shift_y=shift_y).add(X, Y=Y).result()
    xx = CrossMoments(paired=False, shift_x=shift_x).add(X).result()
    yy = CrossMoments(paired=False, shift_x=shift_y).add(Y).result()
    return streamed_measures(xy, xx, yy)


# ---------------------------------------------------------------------------------------------
# measures on a subsample: RSA and mutual k-NN


def unit_rows(X: Any) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero: cosine 0 to every row)."""
    X = np.asarray(to_numpy(X), dtype=np.float64)
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    return np.divide(X, norms, out=np.zeros_like(X), where=norms > 0)


def rdm_ranks(X: Any) -> np.ndarray:
    """Ranks (average ranks for ties) of the upper triangle (row-major, above the diagonal) of the
    dissimilarity matrix 1 - cosine of the rows of X, standardised to mean 0 and variance 1
    (float32: ranks of up to 2^24 entries are exact): the Spearman correlation of two such vectors
    is their mean product."""
    U = unit_rows(X)
    m = U.shape[0]
    if m < 3:
        raise InputError(f"RSA needs at least 3 rows, got {m}; raise `sample`", param="sample")
    upper = np.triu_indices(m, 1)
    ranks = scipy.stats.rankdata(1.0 - (U @ U.T)[upper])
    spread = ranks.std()
    return ((ranks - ranks.mean()) / spread if spread > 0 else np.zeros_like(ranks)).astype(np.float32)


def permuted_ranks(ranks: np.ndarray, permutation: np.ndarray) -> np.ndarray:
    """`rdm_ranks` of the rows reordered by `permutation` (row i becomes row permutation[i]), from
    the ranks themselves: the permuted matrix holds the same entries, so the same ranks."""
    m = len(permutation)
    full = np.zeros((m, m), dtype=ranks.dtype)
    upper = np.triu_indices(m, 1)
    full[upper] = ranks
    full = full + full.T
    return full[np.ix_(permutation, permutation)][upper]


def rsa(ranks_x: np.ndarray, ranks_y: np.ndarray) -> float:
    """Spearman correlation of two dissimilarity matrices from their `rdm_ranks`."""
    if ranks_x.shape != ranks_y.shape:
        raise ValueError(f"RSA compares the same points: {ranks_x.shape} against {ranks_y.shape} ranks")
    return float(np.dot(ranks_x.astype(np.float64), ranks_y.astype(np.float64)) / len(ranks_x))


def knn_indices(X: Any, k: int = DEFAULT_K, *, block_rows: int = _BLOCK_ROWS) -> np.ndarray:
    """(m, k) indexes of each row's k nearest other rows by cosine, from an exact search in blocks of
    `block_rows` rows (memory block_rows x m); a row's own index is never its neighbour."""
    U = unit_rows(X)
    m = U.shape[0]
    if not 1 <= k < m:
        raise InputError(f"`k` must be at least 1 and below the number of sampled rows ({m}), got {k}", param="k")
    out = np.empty((m, k), dtype=np.int64)
    for start in range(0, m, block_rows):
        similarity = U[start : start + block_rows] @ U.T
        rows = np.arange(similarity.shape[0])
        similarity[rows, start + rows] = -np.inf
        out[start : start + len(rows)] = np.argpartition(-similarity, k - 1, axis=1)[:, :k]
    return out


def knn_membership(neighbours: np.ndarray) -> Any:
    """The (m, m) sparse 0/1 matrix of `knn_indices`: row i marks i's neighbours."""
    import scipy.sparse

    m, k = neighbours.shape
    data = np.ones(m * k, dtype=np.float64)
    return scipy.sparse.csr_matrix((data, neighbours.ravel(), np.arange(0, m * k + 1, k)), shape=(m, m))


def mutual_knn(neighbours_x: np.ndarray, neighbours_y: np.ndarray) -> float:
    """Mutual k-NN alignment: the mean over points of the fraction of their k neighbours the two
    representations share."""
    if neighbours_x.shape != neighbours_y.shape:
        raise ValueError(f"mutual k-NN compares the same points and k: {neighbours_x.shape} against {neighbours_y.shape}")
    m, k = neighbours_x.shape
    shared = knn_membership(neighbours_x).multiply(knn_membership(neighbours_y)).sum()
    return float(shared) / (m * k)


def permuted_neighbours(neighbours: np.ndarray, permutation: np.ndarray) -> np.ndarray:
    """`knn_indices` of the rows reordered by `permutation` (row i becomes row permutation[i])."""
    inverse = np.empty_like(permutation)
    inverse[permutation] = np.arange(len(permutation))
    return inverse[neighbours[permutation]]


def permutations(m: int, count: int, seed: int) -> list[np.ndarray]:
    """`count` seeded permutations of m rows, for the permutation null."""
    rng = np.random.default_rng(seed)
    return [rng.permutation(m) for _ in range(count)]
