"""Isotropy measures of a point cloud: partition-function isotropy, IsoScore, spectra, rogue dimensions.

Every function takes an array of shape (n_points, dim) (numpy or torch, any float dtype) and works in
float64. The measures that need only the covariance (IsoScore, effective rank, participation ratio,
variance shares) also have a covariance form, `covariance_isotropy`, which pairs with the streaming
`MomentAccumulator`. The accumulators (moments, partition function, cosine contributions) are
written against the array API: they take numpy arrays or torch tensors on any device and compute
there in float64, and read shared `RowBlock`s (`add_block`, see `lmgeom.metrics.base`).

Choices worth knowing (see docs/calibration.md):
- I(W) (Mu & Viswanath 2018) is evaluated over the eigenvectors c of W^T W *and their negatives* by
  default (`both_signs=True`). An eigensolver returns each eigenvector with an arbitrary sign, so
  using them "as given" (as Ding et al.'s code does) makes the number depend on the solver; the
  two-signed set is sign-invariant and still a subset of the unit sphere the definition minimises
  and maximises over. `both_signs=False` uses one sign per eigenvector, fixed so that the largest
  absolute component is positive (reproducible, close to the published recipe).
- Effective rank (Roy & Vetterli 2007) is taken of the centred points by default: the entropy of the
  normalised singular values of X - mean, i.e. of sqrt of the covariance eigenvalues.
- Points that are all zero have no direction and are left out of every cosine-based measure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from lmgeom.errors import InputError
from lmgeom.metrics.base import RowBlock, StatefulAccumulator, as_float64_rows, in_namespace_of, register_accumulator, row_ids, to_numpy
from lmgeom.metrics.contextuality import average_cosine, sample_indexes
from lmgeom.metrics.spectrum_shape import spectrum_shape

# Rows per block when centring or projecting points: extra memory stays at block x dim, never a
# second n x dim copy of the points.
_BLOCK_ROWS = 8192
# isotropy_report measures a seeded subsample of this many rows; IsoScore and I(W) need only the
# covariance / eigenvectors, which 20k points of a <= 4096-dim layer estimate well.
REPORT_MAX_ROWS = 20_000


# --------------------------------------------------------------------------------------------
# Streaming moments
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Moments:
    """Count, mean and scatter matrix (sum of outer products of centred rows), all float64.

    With `full_covariance=False` the scatter is only its diagonal (a vector of length dim).
    """

    count: int
    mean: np.ndarray
    scatter: np.ndarray

    @property
    def dim(self) -> int:
        return int(self.mean.shape[0])

    def covariance(self, *, ddof: int = 1) -> np.ndarray:
        if self.count - ddof <= 0:
            raise InputError(
                f"a covariance needs at least {ddof + 1} points, got n_samples = {self.count} "
                f"({self.count} sample{'s' if self.count != 1 else ''}); pass more rows"
            )
        return self.scatter / (self.count - ddof)

    def variance(self, *, ddof: int = 1) -> np.ndarray:
        covariance = self.covariance(ddof=ddof)
        return covariance if covariance.ndim == 1 else np.diag(covariance).copy()


@register_accumulator
class MomentAccumulator(StatefulAccumulator):
    """Count, mean and covariance of rows seen in any number of chunks, mergeable across shards.

    Chunks are combined with Chan et al.'s parallel update, which stays exact in float64 where the
    naive sum of x x^T minus n mean mean^T loses precision on far-from-zero data such as LLM layers
    whose mean vector has norm in the thousands. `full_covariance=False` keeps only per-dimension
    variances (what standardisation needs) at O(dim) instead of O(dim^2) per row.
    """

    _state_fields: ClassVar[tuple[str, ...]] = ("full_covariance", "count", "mean", "scatter")

    def __init__(self, *, full_covariance: bool = True) -> None:
        self.full_covariance = full_covariance
        self.count = 0
        self.mean = np.zeros(0)  # (dim,) once rows have been seen
        self.scatter = np.zeros(0)  # (dim, dim), or (dim,) without full_covariance

    def add(self, X: Any, /, **ids: np.ndarray) -> MomentAccumulator:
        return self.add_block(RowBlock(X), None, **ids)

    def add_block(self, block: RowBlock, keep: np.ndarray | None, /, **ids: np.ndarray) -> MomentAccumulator:
        X, xp = block.rows(keep), block.xp
        row_ids(ids, (), int(X.shape[0]), type(self).__name__)
        for start in range(0, int(X.shape[0]), _BLOCK_ROWS):
            rows = X[start : start + _BLOCK_ROWS, :]
            rows_mean = xp.mean(rows, axis=0)
            centred = rows - rows_mean
            rows_scatter = centred.T @ centred if self.full_covariance else xp.sum(centred * centred, axis=0)
            self._combine(int(rows.shape[0]), rows_mean, rows_scatter)
        return self

    def merge(self, other: MomentAccumulator) -> MomentAccumulator:
        if other.full_covariance != self.full_covariance:
            raise ValueError("cannot merge a full-covariance MomentAccumulator with a diagonal-only one")
        if other.count == 0:
            return self
        if self.count == 0:
            return self._combine(other.count, other.mean, other.scatter)
        return self._combine(other.count, in_namespace_of(self.mean, other.mean), in_namespace_of(self.mean, other.scatter))

    def copy(self) -> MomentAccumulator:
        return MomentAccumulator.from_state_dict(self.state_dict())

    def _combine(self, n_new: int, mean_new: Any, scatter_new: Any) -> MomentAccumulator:
        if self.count == 0:
            self.count, self.mean, self.scatter = n_new, mean_new * 1.0, scatter_new * 1.0  # copies, in their own library
            return self
        if mean_new.shape != self.mean.shape:
            raise InputError(
                f"rows have {mean_new.shape[0]} dimensions but this accumulator holds {self.mean.shape[0]}; "
                "feed rows of one layer / one model only"
            )
        total = self.count + n_new
        delta = in_namespace_of(self.mean, mean_new) - self.mean
        weight = self.count * n_new / total
        spread = delta[:, None] * delta[None, :] if self.full_covariance else delta**2
        self.scatter = self.scatter + in_namespace_of(self.mean, scatter_new) + spread * weight
        self.mean = self.mean + delta * (n_new / total)
        self.count = total
        return self

    def result(self) -> Moments:
        if self.count == 0:
            raise InputError("MomentAccumulator has seen no rows; call add() with data first")
        return Moments(count=self.count, mean=to_numpy(self.mean).copy(), scatter=to_numpy(self.scatter).copy())


# --------------------------------------------------------------------------------------------
# Spectra
# --------------------------------------------------------------------------------------------


def _canonical_signs(vectors: np.ndarray) -> np.ndarray:
    """Flip each column so its largest-magnitude entry is positive (as sklearn's svd_flip does)."""
    rows = np.argmax(np.abs(vectors), axis=0)
    signs = np.sign(vectors[rows, np.arange(vectors.shape[1])])
    signs[signs == 0] = 1.0
    return vectors * signs


def symmetric_eigh(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (descending, negatives from rounding set to 0) and eigenvectors in columns with
    deterministic signs, of a symmetric positive semi-definite matrix."""
    values, vectors = np.linalg.eigh(matrix)
    order = np.argsort(values)[::-1]
    return np.clip(values[order], 0.0, None), _canonical_signs(vectors[:, order])


def _gram_eigenvalues(X: np.ndarray, *, centered: bool) -> np.ndarray:
    """Squared singular values of W = X (or X - mean), descending, padded with zeros to dim.

    Taken from the smaller of W^T W and W W^T; for n >= dim the centred scatter comes from
    block-wise moments, so X is never copied."""
    n_points, dim = X.shape
    if n_points < dim:
        W = X - X.mean(axis=0) if centered else X
        values = np.concatenate([np.linalg.eigvalsh(W @ W.T), np.zeros(dim - n_points)])
    else:
        values = np.linalg.eigvalsh(MomentAccumulator().add(X).result().scatter if centered else X.T @ X)
    return np.clip(np.sort(values)[::-1], 0.0, None)


def covariance_eigenvalues(X: Any) -> np.ndarray:
    """Eigenvalues of the sample covariance (ddof=1), descending, dim of them."""
    X = as_float64_rows(X)
    require_rows(X, 2, "the covariance spectrum")
    return _gram_eigenvalues(X, centered=True) / (len(X) - 1)


def isoscore_from_variances(variances: np.ndarray) -> float:
    """Rudman et al. 2022, step for step as in the IsoScore package, from the PCA variances."""
    n = variances.shape[0]
    if n < 2:
        raise InputError("IsoScore needs points of at least 2 dimensions (n_features = 1 given)")
    norm = np.linalg.norm(variances)
    if norm == 0:
        return float("nan")  # every point identical: no direction is used at all
    normalised = variances * np.sqrt(n) / norm
    defect = np.linalg.norm(normalised - 1.0) / np.sqrt(2 * (n - np.sqrt(n)))
    return float(((n - defect**2 * (n - np.sqrt(n))) ** 2 - n) / (n * (n - 1)))


def _effective_rank_from_singular_values(singular_values: np.ndarray) -> float:
    total = singular_values.sum()
    if total == 0:
        return float("nan")
    p = singular_values[singular_values > 0] / total
    return float(np.exp(-(p * np.log(p)).sum()))


def _participation_ratio_from_variances(variances: np.ndarray) -> float:
    squares = (variances**2).sum()
    return float(variances.sum() ** 2 / squares) if squares > 0 else float("nan")


def _variance_share(variances: np.ndarray, k: int) -> float:
    if k < 1:
        raise InputError(f"top-k variance share needs k >= 1, got {k}")
    total = variances.sum()
    return float(variances[:k].sum() / total) if total > 0 else float("nan")


def _spectrum_measures(variances: np.ndarray, *, top_k: tuple[int, ...]) -> dict[str, float]:
    measures = {
        "isoscore": isoscore_from_variances(variances),
        "effective_rank": _effective_rank_from_singular_values(np.sqrt(variances)),
        "participation_ratio": _participation_ratio_from_variances(variances),
        **spectrum_shape(variances),
    }
    for k in top_k:
        measures[f"top{k}_variance_share"] = _variance_share(variances, k)
    return measures


def covariance_isotropy(covariance: np.ndarray, *, top_k: tuple[int, ...] = (1, 10)) -> dict[str, float]:
    """The covariance-only measures (IsoScore, centred effective rank, participation ratio, top-k
    variance shares) from a covariance matrix, e.g. `MomentAccumulator().add(...).result().covariance()`."""
    covariance = np.asarray(covariance, dtype=np.float64)
    if covariance.ndim != 2 or covariance.shape[0] != covariance.shape[1]:
        raise ValueError(f"covariance must be a square (dim, dim) matrix, got shape {covariance.shape}")
    variances = np.clip(np.linalg.eigvalsh(covariance)[::-1], 0.0, None)
    return _spectrum_measures(variances, top_k=top_k)


def isoscore(X: Any) -> float:
    """IsoScore (Rudman et al. 2022) in [0, 1]: 1 for isotropic points, 0 when all lie on one line.

    Agrees with the PyPI package `IsoScore.IsoScore(points)` (points as (n_points, dim))."""
    return isoscore_from_variances(covariance_eigenvalues(X))


def effective_rank(X: Any, *, centered: bool = True) -> float:
    """Roy & Vetterli's effective rank: exp of the entropy of the normalised singular values of X
    (of X - mean when `centered`), between 1 and min(n_points, dim)."""
    X = as_float64_rows(X)
    require_rows(X, 2 if centered else 1, "the effective rank")
    return _effective_rank_from_singular_values(np.sqrt(_gram_eigenvalues(X, centered=centered)))


def participation_ratio(X: Any) -> float:
    """(sum of covariance eigenvalues)^2 / sum of their squares, between 1 and dim."""
    return _participation_ratio_from_variances(covariance_eigenvalues(X))


def top_pc_variance_share(X: Any, k: int = 1) -> float:
    """Share of the total variance carried by the top-k principal components."""
    return _variance_share(covariance_eigenvalues(X), k)


# --------------------------------------------------------------------------------------------
# Partition-function isotropy I(W)
# --------------------------------------------------------------------------------------------


@register_accumulator
class PartitionFunctionAccumulator(StatefulAccumulator):
    """Second stage of I(W) (Mu & Viswanath 2018): log Z(c) = log sum_w exp(c . (w - shift)) for each
    given direction c (and -c with `both_signs`), streamed over rows in log space and merged with
    `logaddexp`; `result()` is log I(W) = min_c log Z(c) - max_c log Z(c).

    The first stage is the directions themselves, the eigenvectors of W^T W: get them from a
    (merged) `MomentAccumulator` with `partition_directions`, then stream the rows again."""

    _state_fields: ClassVar[tuple[str, ...]] = ("directions", "shift", "both_signs", "log_z_plus", "log_z_minus")

    def __init__(self, directions: np.ndarray, *, shift: np.ndarray | None = None, both_signs: bool = True) -> None:
        self.directions = np.asarray(directions, dtype=np.float64)
        if self.directions.ndim != 2:
            raise ValueError(f"directions must be a (dim, n_directions) matrix, got shape {self.directions.shape}")
        self.shift = np.zeros(0) if shift is None else np.asarray(shift, dtype=np.float64)
        self.both_signs = both_signs
        self.log_z_plus = np.full(self.directions.shape[1], -np.inf)
        self.log_z_minus = np.full(self.directions.shape[1], -np.inf)

    def add(self, X: Any, /, **ids: np.ndarray) -> PartitionFunctionAccumulator:
        return self.add_block(RowBlock(X), None, **ids)

    def add_block(self, block: RowBlock, keep: np.ndarray | None, /, **ids: np.ndarray) -> PartitionFunctionAccumulator:
        W, xp = block.rows(keep), block.xp
        row_ids(ids, (), int(W.shape[0]), type(self).__name__)
        if W.shape[1] != self.directions.shape[0]:
            raise ValueError(f"rows have {W.shape[1]} dimensions but the directions have {self.directions.shape[0]}")
        directions, shift = in_namespace_of(W, self.directions), in_namespace_of(W, self.shift)
        for start in range(0, int(W.shape[0]), _BLOCK_ROWS):
            rows = W[start : start + _BLOCK_ROWS, :]
            projections = (rows - shift if self.shift.size else rows) @ directions
            self.log_z_plus = np.logaddexp(self.log_z_plus, _log_sum_exp_columns(xp, projections))
            if self.both_signs:
                self.log_z_minus = np.logaddexp(self.log_z_minus, _log_sum_exp_columns(xp, -projections))
        return self

    def merge(self, other: PartitionFunctionAccumulator) -> PartitionFunctionAccumulator:
        if not (np.array_equal(other.directions, self.directions) and np.array_equal(other.shift, self.shift)
                and other.both_signs == self.both_signs):
            raise ValueError("cannot merge partition functions over different directions, shifts or sign sets")
        self.log_z_plus = np.logaddexp(self.log_z_plus, other.log_z_plus)
        self.log_z_minus = np.logaddexp(self.log_z_minus, other.log_z_minus)
        return self

    def result(self) -> float:
        if not np.isfinite(self.log_z_plus).all():
            raise InputError("I(W) needs at least one row; call add() with data first")
        log_z = np.concatenate([self.log_z_plus, self.log_z_minus]) if self.both_signs else self.log_z_plus
        return float(log_z.min() - log_z.max())


def _log_sum_exp_columns(xp: Any, values: Any) -> np.ndarray:
    """log sum_i exp(values[i, j]) per column, shifted by the column maximum (finite rows only)."""
    top = xp.max(values, axis=0)
    return to_numpy(top + xp.log(xp.sum(xp.exp(values - top), axis=0)))


def partition_directions(moments: Moments, *, centered: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """(directions, shift) for `PartitionFunctionAccumulator` from the moments of all rows: the
    eigenvectors of W^T W, with W the rows (raw) or the rows minus their mean (centred)."""
    if moments.scatter.ndim != 2:
        raise ValueError("I(W) needs a full-covariance MomentAccumulator")
    if centered:
        return symmetric_eigh(moments.scatter)[1], moments.mean
    return symmetric_eigh(moments.scatter + moments.count * np.outer(moments.mean, moments.mean))[1], None


def _log_partition_range(W: np.ndarray, directions: np.ndarray, *, both_signs: bool, shift: np.ndarray | None = None) -> float:
    return PartitionFunctionAccumulator(directions, shift=shift, both_signs=both_signs).add(W).result()


def log_partition_isotropy(X: Any, centered: bool = False, *, both_signs: bool = True) -> float:
    """Natural log of I(W) = min_c Z(c) / max_c Z(c) over the eigenvectors c of W^T W
    (Mu & Viswanath 2018); W = X, or X minus its mean when `centered`.

    Always <= 0 and finite, also for vectors of norm in the thousands where I(W) itself underflows
    to 0.0: report this number, not `partition_isotropy`. To stream rows that do not fit in memory,
    use `MomentAccumulator`, `partition_directions` and `PartitionFunctionAccumulator`."""
    W = as_float64_rows(X)
    require_rows(W, 2 if centered else 1, "I(W)")
    if not centered:
        _, directions = symmetric_eigh(W.T @ W)
        return _log_partition_range(W, directions, both_signs=both_signs)
    moments = MomentAccumulator().add(W).result()  # (W - mean)^T (W - mean) without copying W
    _, directions = symmetric_eigh(moments.scatter)
    return _log_partition_range(W, directions, both_signs=both_signs, shift=moments.mean)


def partition_isotropy(X: Any, centered: bool = False, *, both_signs: bool = True) -> float:
    """I(W) in [0, 1]; exp(log_partition_isotropy), which is 0.0 in float64 once log I < about -745."""
    return float(np.exp(log_partition_isotropy(X, centered, both_signs=both_signs)))


# --------------------------------------------------------------------------------------------
# Cosines and rogue dimensions
# --------------------------------------------------------------------------------------------


@register_accumulator
class CosineContributionAccumulator(StatefulAccumulator):
    """Per-dimension contributions to the average cosine (Timkey & van Schijndel 2021), streamed:
    the column sums of the unit rows and of their squares suffice.

    The derived numbers of `rogue_dimensions` (the average cosine without the top dimensions, or
    after z-scoring every dimension) change the rows themselves, so they take a second pass: an
    `AverageCosineAccumulator` over the transformed rows."""

    _state_fields: ClassVar[tuple[str, ...]] = ("unit_sum", "unit_square_sum", "n_points")

    def __init__(self) -> None:
        self.unit_sum = np.zeros(0)
        self.unit_square_sum = np.zeros(0)
        self.n_points = 0

    def add(self, X: Any, /, **ids: np.ndarray) -> CosineContributionAccumulator:
        return self.add_block(RowBlock(X), None, **ids)

    def add_block(self, block: RowBlock, keep: np.ndarray | None, /, **ids: np.ndarray) -> CosineContributionAccumulator:
        row_ids(ids, (), len(block) if keep is None else int(np.count_nonzero(keep)), type(self).__name__)
        if not self.unit_sum.size:
            self.unit_sum, self.unit_square_sum = np.zeros(block.dim), np.zeros(block.dim)
        elif block.dim != self.unit_sum.shape[0]:
            raise ValueError(f"rows have {block.dim} dimensions but this accumulator holds {self.unit_sum.shape[0]}")
        weights = block.unit_weights(keep)  # zero rows weigh 0: they have no direction
        self.unit_sum = self.unit_sum + to_numpy(weights @ block.X)
        self.unit_square_sum = self.unit_square_sum + to_numpy((weights * weights) @ (block.X * block.X))
        nonzero = block.nonzero_on_host if keep is None else block.nonzero_on_host[keep]
        self.n_points += int(nonzero.sum())
        return self

    def merge(self, other: CosineContributionAccumulator) -> CosineContributionAccumulator:
        if other.n_points:
            if not self.unit_sum.size:
                self.unit_sum, self.unit_square_sum = np.zeros_like(other.unit_sum), np.zeros_like(other.unit_sum)
            self.unit_sum = self.unit_sum + other.unit_sum
            self.unit_square_sum = self.unit_square_sum + other.unit_square_sum
            self.n_points += other.n_points
        return self

    def result(self) -> np.ndarray:
        n = self.n_points
        if n < 2:
            raise InputError(f"a cosine between distinct points needs at least 2 non-zero rows, got {n}")
        contributions: np.ndarray = (self.unit_sum**2 - self.unit_square_sum) / (n * (n - 1))
        return contributions


def cosine_contributions(X: Any) -> np.ndarray:
    """Per-dimension contribution to the average cosine (Timkey & van Schijndel 2021):
    CC_i = mean over distinct ordered pairs of u_i v_i / (||u|| ||v||); the CC_i sum to the average cosine."""
    return CosineContributionAccumulator().add(X).result()


def _standardize_columns(X: np.ndarray) -> np.ndarray:
    """Per-dimension z-scores (population std); constant dimensions are only centred."""
    std = X.std(axis=0)
    return (X - X.mean(axis=0)) / np.where(std > 0, std, 1.0)


@dataclass(frozen=True)
class RogueDimensions:
    contributions: np.ndarray = field(repr=False)
    top_dimensions: np.ndarray
    top_share: float  # share of the average cosine carried by the top dimensions
    average_cosine: float
    average_cosine_without_top: float
    average_cosine_standardized: float


def rogue_dimensions(X: Any, *, top_k: int = 3) -> RogueDimensions:
    """The `top_k` dimensions that contribute most to the average cosine, the share they carry, and
    the average cosine after dropping them or after z-scoring every dimension."""
    X = as_float64_rows(X)
    if not 1 <= top_k < X.shape[1]:
        raise InputError(f"top_k must be between 1 and dim - 1 = {X.shape[1] - 1}, got {top_k}")
    contributions = cosine_contributions(X)
    top = np.argsort(contributions)[::-1][:top_k]
    total = float(contributions.sum())
    return RogueDimensions(
        contributions=contributions,
        top_dimensions=top,
        top_share=float(contributions[top].sum() / total) if total != 0 else float("nan"),
        average_cosine=total,
        average_cosine_without_top=average_cosine(np.delete(X, top, axis=1)),
        average_cosine_standardized=average_cosine(_standardize_columns(X)),
    )


# --------------------------------------------------------------------------------------------
# Local isotropy and the report
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalIsotropy:
    """Isotropy inside k-means clusters (Cai et al. 2021).

    It has no streaming accumulator: the clusters come from k-means, which needs every point at
    once (fit on a sample of rows, as `local_isotropy` does).

    `per_cluster` holds one record per cluster; `weighted_mean` averages each measure over the
    clusters where it is defined (at least 2 points, 3 for I(W)), weighted by cluster size."""

    per_cluster: list[dict[str, float]]
    weighted_mean: dict[str, float]


_LOCAL_MEASURES = ("isoscore", "log_partition_isotropy_centered", "average_cosine", "average_cosine_centered", "effective_rank")


def _cluster_measures(points: np.ndarray) -> dict[str, float]:
    if len(points) < 2:
        return dict.fromkeys(_LOCAL_MEASURES, float("nan"))
    centred = points - points.mean(axis=0)
    nonzero_centred = np.linalg.norm(centred, axis=1) > 0
    return {
        "isoscore": isoscore(points) if points.shape[1] > 1 else float("nan"),
        "log_partition_isotropy_centered": log_partition_isotropy(points, True),
        "average_cosine": average_cosine(points) if (np.linalg.norm(points, axis=1) > 0).sum() > 1 else float("nan"),
        "average_cosine_centered": average_cosine(centred) if nonzero_centred.sum() > 1 else float("nan"),
        "effective_rank": effective_rank(points),
    }


def local_isotropy(X: Any, *, n_clusters: int = 8, seed: int = 0) -> LocalIsotropy:
    """IsoScore, centred I(W), average cosine (raw and centred) and effective rank inside each of
    `n_clusters` seeded k-means clusters, with their size-weighted mean."""
    X = as_float64_rows(X)
    if n_clusters < 1 or len(X) < n_clusters:
        raise InputError(
            f"local isotropy with n_clusters={n_clusters} needs at least that many points, got {len(X)}; "
            "lower n_clusters or pass more rows"
        )
    # imported here: scikit-learn takes most of a second to import, which `import lmgeom.metrics` (and
    # every analysis worker) would otherwise pay
    from sklearn.cluster import KMeans

    labels = KMeans(n_clusters=n_clusters, random_state=seed, n_init="auto").fit_predict(X)
    per_cluster = [
        {"cluster": cluster, "size": int((labels == cluster).sum()), **_cluster_measures(X[labels == cluster])}
        for cluster in range(n_clusters)
    ]
    weighted_mean = {}
    for measure in _LOCAL_MEASURES:
        values = np.array([record[measure] for record in per_cluster])
        sizes = np.array([record["size"] for record in per_cluster], dtype=np.float64)
        defined = np.isfinite(values)
        weighted_mean[measure] = float(np.average(values[defined], weights=sizes[defined])) if defined.any() else float("nan")
    return LocalIsotropy(per_cluster=per_cluster, weighted_mean=weighted_mean)


def isotropy_report(X: Any, *, seed: int = 0, max_rows: int | None = REPORT_MAX_ROWS, rogue_top_k: int = 3) -> dict[str, float]:
    """Every global isotropy measure of X as one flat dict, on a seeded subsample of `max_rows` rows.

    Keys: n_points, n_used, dim, log_partition_isotropy(_centered), partition_isotropy(_centered),
    isoscore, average_cosine, effective_rank, participation_ratio, stable_rank, numerical_rank,
    matrix_entropy (`lmgeom.metrics.spectrum_shape`), top1/top10_variance_share,
    rogue_top_share, average_cosine_without_rogue, average_cosine_standardized."""
    X = as_float64_rows(X)
    n_points, dim = X.shape
    if max_rows is not None:
        X = X[sample_indexes(np.arange(n_points), max_rows, seed)]
    require_rows(X, 3, "an isotropy report")
    moments = MomentAccumulator().add(X).result()
    # One eigendecomposition serves the covariance spectrum and the centred I(W): W_c^T W_c = (n-1) cov.
    variances, centred_directions = symmetric_eigh(moments.covariance())
    _, raw_directions = symmetric_eigh(X.T @ X)
    log_i_raw = _log_partition_range(X, raw_directions, both_signs=True)
    log_i_centred = _log_partition_range(X, centred_directions, both_signs=True, shift=moments.mean)
    report: dict[str, float] = {
        "n_points": n_points,
        "n_used": len(X),
        "dim": dim,
        "log_partition_isotropy": log_i_raw,
        "log_partition_isotropy_centered": log_i_centred,
        "partition_isotropy": float(np.exp(log_i_raw)),
        "partition_isotropy_centered": float(np.exp(log_i_centred)),
        **_spectrum_measures(variances, top_k=(1, 10)),
    }
    if dim > rogue_top_k:
        rogue = rogue_dimensions(X, top_k=rogue_top_k)
        report.update(
            average_cosine=rogue.average_cosine,
            rogue_top_share=rogue.top_share,
            average_cosine_without_rogue=rogue.average_cosine_without_top,
            average_cosine_standardized=rogue.average_cosine_standardized,
        )
    else:
        report["average_cosine"] = average_cosine(X)
    return report


def require_rows(X: np.ndarray, minimum: int, what: str) -> None:
    if len(X) < minimum:
        raise InputError(f"{what} needs at least {minimum} points, got n_samples = {len(X)}; pass more rows")
