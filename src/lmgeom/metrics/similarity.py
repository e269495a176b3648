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
Permutation nulls (`permutation_nulls`) shuffle the rows of Y (one side) on the subsample: every
measure of X against the shuffled Y is the value of unrelated rows. Each measure is also computed on
the subsample unshuffled (its observed value there), and its permutation p-value is
(1 + #{null values at least as extreme}) / (1 + count), `permutation_p_value`: one-sided, the upper
tail for CKA, RSA and mutual k-NN (larger is more similar), the lower tail for the Procrustes
distance (smaller is more similar). A shuffle reuses what the observed value computed, reordered
by index:
- CKA: the m x m Gram matrices of each side's centred rows; Y[p] has the Gram L[p][:, p], so the
  cross term <K, L[p][:, p]> is an indexing and a dot product (batched over layers as one matrix
  product), never a product of features; the other terms of both estimators are sums over m.
- RSA: the full symmetric matrix of each side's standardised ranks, indexed the same way.
- Mutual k-NN: each side's neighbour lists; Y[p]'s are inverse[N_Y[p]] with inverse the inverse
  permutation (`permuted_neighbours`).
- Procrustes: no shortcut: one SVD of the r_x x r_y cross-covariance per shuffle and pair (r = the
  smaller of m and the dimension), so it gets fewer shuffles (`DEFAULT_PROCRUSTES_PERMUTATIONS`).
Under a shuffle a point's k neighbours in Y are (about) k of the m - 1 other points at random, so
the expected mutual k-NN overlap, its chance level, is k / (m - 1) (`knn_chance`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

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
DEFAULT_PERMUTATIONS = 200
"""Shuffles of the null of CKA, RSA and mutual k-NN: each indexes the Gram matrices, ranks and
neighbour lists computed once (no product of features); the smallest p-value is 1/201."""
DEFAULT_PROCRUSTES_PERMUTATIONS = 20
"""Shuffles of the Procrustes null: each needs an SVD of a cross-covariance of the dimension of the
rows (and its product of features), per pair of layers, so 20: the smallest p-value 1/21 is below 0.05."""
LOWER_IS_CLOSER = frozenset({"procrustes"})
"""Measures whose smaller values are more similar: their p-value counts null values at or below the observed."""
TIE_TOLERANCE = 1e-12
"""A null value within this of the observed one counts as at least as extreme (ties count against)."""
_BLOCK_ROWS = 2048
_GATHER_BYTES = 1 << 28


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


def square_ranks(ranks: np.ndarray, m: int, dtype: Any = None) -> np.ndarray:
    """The symmetric m x m matrix (zero diagonal) of `rdm_ranks`' upper triangle."""
    full = np.zeros((m, m), dtype=dtype or ranks.dtype)
    upper = np.triu_indices(m, 1)
    full[upper] = ranks
    return full + full.T


def permuted_ranks(ranks: np.ndarray, permutation: np.ndarray) -> np.ndarray:
    """`rdm_ranks` of the rows reordered by `permutation` (row i becomes row permutation[i]), from
    the ranks themselves: the permuted matrix holds the same entries, so the same ranks."""
    m = len(permutation)
    full = square_ranks(ranks, m)
    return full.take(permutation, axis=0).take(permutation, axis=1)[np.triu_indices(m, 1)]


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


# ---------------------------------------------------------------------------------------------
# permutation nulls and p-values


def knn_chance(m: int, k: int) -> float:
    """The chance level of mutual k-NN on m points: when a point's k neighbours in Y are k of its
    m - 1 other points drawn at random, they share k * k / (m - 1) of its k neighbours in X on
    average, a fraction k / (m - 1)."""
    if not 1 <= k < m:
        raise InputError(f"`k` must be at least 1 and below the number of sampled rows ({m}), got {k}", param="k")
    return k / (m - 1)


def permutation_p_value(observed: float, null: Any, *, lower: bool = False) -> float:
    """The one-sided permutation p-value (1 + #extreme) / (1 + count): extreme null values are those
    at least `observed` (at most it, `lower=True`, for a distance), within `TIE_TOLERANCE`, so the
    smallest p-value is 1 / (1 + count). Undefined (non-finite) null values are left out of both
    counts; nan when the observed value is undefined or no null value is defined (no shuffles)."""
    values = np.asarray(null, dtype=np.float64).ravel()
    values = values[np.isfinite(values)]
    if not np.isfinite(observed) or not values.size:
        return float("nan")
    extreme = values <= observed + TIE_TOLERANCE if lower else values >= observed - TIE_TOLERANCE
    return (1 + int(np.count_nonzero(extreme))) / (1 + values.size)


@dataclass(frozen=True)
class NullSummary:
    """A measure's permutation test on the subsample: its value there, the mean and standard
    deviation (ddof 1) of its null, the p-value and how many shuffles made the null; nan where
    undefined (no shuffles: mean, sd and p-value; one shuffle: sd)."""

    observed: float
    mean: float
    sd: float
    p_value: float
    permutations: int


def summarise_null(observed: float, null: Any, *, lower: bool = False) -> NullSummary:
    """`NullSummary` of an observed value and its null values (`lower`: a distance, see
    `permutation_p_value`)."""
    values = np.asarray(null, dtype=np.float64).ravel()
    finite = values[np.isfinite(values)]
    mean = float(finite.mean()) if finite.size else float("nan")
    sd = float(finite.std(ddof=1)) if finite.size > 1 else float("nan")
    return NullSummary(float(observed), mean, sd, permutation_p_value(observed, values, lower=lower), int(values.size))


@dataclass(frozen=True)
class _GramSide:
    """What CKA needs of one side's Gram matrix K of centred rows besides K itself: its diagonal
    a, row sums K1, total 1'K1 and its self HSIC (biased and debiased)."""

    diag: np.ndarray
    row_sums: np.ndarray
    total: float
    hsic: float = float("nan")
    hsic_debiased: float = float("nan")


def _gram_side(gram: np.ndarray) -> _GramSide:
    side = _GramSide(np.diagonal(gram).copy(), gram.sum(axis=1), float(gram.sum()))
    hsic, debiased = _gram_hsic(float(np.vdot(gram, gram)), side, side, None)
    return _GramSide(side.diag, side.row_sums, side.total, hsic, debiased)


def _gram_hsic(inner: float, x: _GramSide, y: _GramSide, permutation: np.ndarray | None) -> tuple[float, float]:
    """Biased and debiased HSIC of X and Y[permutation] (Y when None) from inner = <K, L[p][:, p]>:
    tr(K H L H) = inner - 2 K1 . L1[p] / m + 1'K1 1'L1 / m^2, and with the diagonals set to zero
    tr(K~ L~) = inner - a . b[p], 1'K~L~1 = (K1 - a) . (L1 - b)[p] (see the module docstring)."""
    m = len(x.diag)
    b, sums = (y.diag, y.row_sums) if permutation is None else (y.diag[permutation], y.row_sums[permutation])
    hsic = (inner - 2 * float(x.row_sums @ sums) / m + x.total * y.total / m**2) / (m - 1) ** 2
    if m < 4:
        return hsic, float("nan")
    trace = inner - float(x.diag @ b)
    sum_k, sum_l = x.total - float(x.diag.sum()), y.total - float(y.diag.sum())
    cross = float((x.row_sums - x.diag) @ (sums - b))
    debiased = (trace + sum_k * sum_l / ((m - 1) * (m - 2)) - 2 * cross / (m - 2)) / (m * (m - 3))
    return hsic, debiased


def _ratio(num: float, den: float) -> float:
    return float(num / np.sqrt(den)) if den > 0 else float("nan")


def _cross_inner(stack_a: np.ndarray, stack_b: np.ndarray, permutation: np.ndarray | None) -> np.ndarray:
    """(layers_a, layers_b) inner products <S_a, S_b[p][:, p]> of stacks of m x m matrices: each of
    b's matrices indexed by the permutation (rows, then columns: cache-friendly), in blocks of at
    most `_GATHER_BYTES`, then one matrix product with all of a's."""
    n_a, n_b, m = stack_a.shape[0], stack_b.shape[0], stack_a.shape[1]
    flat_a = stack_a.reshape(n_a, m * m)
    out = np.empty((n_a, n_b))
    block = max(1, _GATHER_BYTES // (8 * m * m))
    for start in range(0, n_b, block):
        part = stack_b[start : start + block]
        if permutation is not None:
            gathered = np.empty_like(part)
            for index, matrix in enumerate(part):
                matrix.take(permutation, axis=0).take(permutation, axis=1, out=gathered[index])
            part = gathered
        out[:, start : start + len(part)] = flat_a @ part.reshape(len(part), m * m).T
    return out


def _shared_neighbours(near_x: np.ndarray, near_y: np.ndarray) -> int:
    """The number of (point, neighbour) pairs two neighbour lists share (rows compared in blocks)."""
    m, k = near_x.shape
    step = max(1, (1 << 22) // (k * k))
    return sum(int(np.count_nonzero(near_x[s : s + step, :, None] == near_y[s : s + step, None, :]))
               for s in range(0, m, step))


def _procrustes_features(X: np.ndarray) -> tuple[np.ndarray, float]:
    """Centred rows reduced to at most m columns (U S of their thin SVD when the dimension exceeds
    m: the same nuclear norms against any rows), and their squared Frobenius norm."""
    centred = X - X.mean(axis=0)
    if centred.shape[1] > centred.shape[0]:
        u, s, _ = np.linalg.svd(centred, full_matrices=False)
        centred = u * s
    return centred, float(np.sum(centred * centred))


def _procrustes_value(fx: np.ndarray, fy: np.ndarray, trace_x: float, trace_y: float) -> float:
    scale = np.sqrt(trace_x * trace_y)
    if not scale > 0:
        return float("nan")
    nuclear = float(np.linalg.svd(fx.T @ fy, compute_uv=False).sum())
    return float(np.arccos(np.clip(nuclear / scale, 0.0, 1.0)))


@dataclass
class SubsampleNulls:
    """Per measure: `observed`, its value for each pair on the subsample (pairs,), and `null`, its
    values with the second side's rows shuffled (pairs, shuffles of that measure)."""

    observed: dict[str, np.ndarray]
    null: dict[str, np.ndarray]


def permutation_nulls(samples_a: Sequence[Any], samples_b: Sequence[Any] | None, pairs: Sequence[tuple[int, int]],
                      shuffles: Sequence[np.ndarray], *, measures: Sequence[str] = MEASURES,
                      counts: Mapping[str, int] | None = None, k: int = DEFAULT_K,
                      progress: Any = None) -> SubsampleNulls:
    """Every measure of `measures` for each pair (i, j) of `pairs`: samples_a[i] against
    samples_b[j] (rows of the same m points; `samples_b` None: samples_a, the layers of one
    store), on the rows as given (`observed`) and with samples_b[j]'s rows reordered by each of the
    first `counts[measure]` `shuffles` (`null`; all of them when `counts` is None or names no
    count). Each side's Gram matrix, ranks, neighbours and reduced rows are computed once and every
    shuffle indexes them (see the module docstring). `progress()`, when given, is called after each
    shuffle. Memory: two m x m float64 matrices per layer (CKA and RSA)."""
    unknown = [measure for measure in measures if measure not in MEASURES]
    if unknown:
        raise InputError(f"unknown `measures` {unknown}; choose from {', '.join(MEASURES)}", param="measures")
    rows_a = [np.asarray(to_numpy(X), dtype=np.float64) for X in samples_a]
    rows_b = rows_a if samples_b is None else [np.asarray(to_numpy(X), dtype=np.float64) for X in samples_b]
    m = rows_a[0].shape[0]
    if any(X.shape[0] != m for X in (*rows_a, *rows_b)) or any(len(p) != m for p in shuffles):
        raise ValueError(f"every sample and shuffle must hold the same {m} points")
    wanted = dict.fromkeys(measures)
    count = {measure: len(shuffles) if counts is None else int(counts.get(measure, len(shuffles))) for measure in wanted}
    bad = {measure: n for measure, n in count.items() if not 0 <= n <= len(shuffles)}
    if bad:
        raise ValueError(f"shuffle counts {bad} outside 0..{len(shuffles)} (the shuffles given)")
    same = samples_b is None

    def stacked(make: Any, rows: list[np.ndarray]) -> np.ndarray:
        out = np.empty((len(rows), m, m))
        for i, X in enumerate(rows):
            out[i] = make(X)
        return out

    def gram(X: np.ndarray) -> np.ndarray:
        centred = X - X.mean(axis=0)
        return centred @ centred.T

    uses_gram = bool({"cka", "cka_debiased"} & set(wanted))
    grams_a = stacked(gram, rows_a) if uses_gram else None
    grams_b = grams_a if same or not uses_gram else stacked(gram, rows_b)
    gram_a = [_gram_side(G) for G in grams_a] if grams_a is not None else []
    gram_b = gram_a if same or grams_b is None else [_gram_side(G) for G in grams_b]
    ranks_a = stacked(lambda X: square_ranks(rdm_ranks(X), m, np.float64), rows_a) if "rsa" in wanted else None
    ranks_b = ranks_a if same or ranks_a is None else stacked(lambda X: square_ranks(rdm_ranks(X), m, np.float64), rows_b)
    near_a = [knn_indices(X, k) for X in rows_a] if "knn" in wanted else []
    near_b = near_a if same or not near_a else [knn_indices(X, k) for X in rows_b]
    features_a = [_procrustes_features(X) for X in rows_a] if "procrustes" in wanted else []
    features_b = features_a if same or not features_a else [_procrustes_features(X) for X in rows_b]

    def values(permutation: np.ndarray | None, active: set[str]) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {measure: [] for measure in active}
        gram_inner = (_cross_inner(grams_a, grams_b, permutation)
                      if grams_a is not None and grams_b is not None and active & {"cka", "cka_debiased"} else None)
        rank_inner = (_cross_inner(ranks_a, ranks_b, permutation)
                      if ranks_a is not None and ranks_b is not None and "rsa" in active else None)
        near = ({j: near_b[j] if permutation is None else permuted_neighbours(near_b[j], permutation)
                 for j in sorted({j for _, j in pairs})} if "knn" in active else {})
        for i, j in pairs:
            if gram_inner is not None:
                x, y = gram_a[i], gram_b[j]
                hsic, debiased = _gram_hsic(float(gram_inner[i, j]), x, y, permutation)
                if "cka" in active:
                    out["cka"].append(_ratio(hsic, x.hsic * y.hsic))
                if "cka_debiased" in active:
                    out["cka_debiased"].append(_ratio(debiased, x.hsic_debiased * y.hsic_debiased))
            if rank_inner is not None:
                out["rsa"].append(float(rank_inner[i, j]) / (m * (m - 1)))
            if "knn" in active:
                out["knn"].append(_shared_neighbours(near_a[i], near[j]) / (m * k))
            if "procrustes" in active:
                (fx, tx), (fy, ty) = features_a[i], features_b[j]
                out["procrustes"].append(_procrustes_value(fx, fy if permutation is None else fy[permutation], tx, ty))
        return out

    observed = {measure: np.asarray(v, dtype=np.float64) for measure, v in values(None, set(wanted)).items()}
    null = {measure: np.full((len(pairs), count[measure]), np.nan) for measure in wanted}
    for t in range(max(count.values(), default=0)):
        active = {measure for measure in wanted if t < count[measure]}
        for measure, v in values(shuffles[t], active).items():
            null[measure][:, t] = v
        if progress is not None:
            progress()
    return SubsampleNulls({measure: observed[measure] for measure in wanted}, null)


# ---------------------------------------------------------------------------------------------
# summaries for tables

P_LEVEL = 0.05
"""The level at which the tables count the pairs of layers whose p-value is at most it."""


def layer_pairs(matrix: Any, within: bool) -> np.ndarray:
    """The defined values of a layers_a x layers_b matrix over its pairs of layers: off the
    diagonal for the layers of one store (a layer against itself is no comparison)."""
    matrix = np.asarray(matrix, dtype=np.float64)
    if within and matrix.shape[0] == matrix.shape[1]:
        matrix = matrix[~np.eye(matrix.shape[0], dtype=np.bool_)]
    values = matrix.ravel()
    return values[np.isfinite(values)]


def measure_summaries(values: Mapping[str, Any], null: Mapping[str, Any], p_values: Mapping[str, Any],
                      permutations: Mapping[str, int], chance: Mapping[str, float], *, within: bool) -> list[dict[str, Any]]:
    """Per measure, over its pairs of layers (`layer_pairs`): the mean value, the mean of its
    permutation null, the largest p-value, how many pairs have p <= `P_LEVEL` of how many, the
    shuffles and the chance level (None where a measure has none)."""
    rows = []
    for measure, matrix in values.items():
        defined = layer_pairs(matrix, within)
        null_values = layer_pairs(null[measure], within) if measure in null else None
        p = layer_pairs(p_values[measure], within) if measure in p_values else None
        rows.append({"measure": measure, "mean": float(defined.mean()) if defined.size else None,
                     "null": float(null_values.mean()) if null_values is not None and null_values.size else None,
                     "p_max": float(p.max()) if p is not None and p.size else None,
                     "p_small": int(np.count_nonzero(p <= P_LEVEL)) if p is not None else None,
                     "pairs": int(p.size) if p is not None else int(defined.size),
                     "permutations": int(permutations.get(measure, 0)), "chance": chance.get(measure)})
    return rows
