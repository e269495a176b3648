"""Outlier dimensions and massive activations of a layer. Pure: rows in, numbers out.

- **Magnitude outliers** (Kovaleva et al. 2021, Puccetti et al. 2022): the dimensions whose mean
  |h| over the rows lies more than `n_sigma` (3) standard deviations above the mean over dimensions
  of that per-dimension mean.
- **Massive activations** (Sun et al. 2024): the `top_k` largest |h| of a layer over every row and
  dimension, each located by its store row and dimension (the geometry stage adds the token, sentence and
  position) and given as a ratio to the layer's median |h|. Sun et al. call an activation massive
  when |h| > 100 and about 1,000 times the median; `is_massive` applies those two thresholds.
- **LayerNorm-weight outliers** (Kovaleva et al. 2021): the dimensions of a LayerNorm's weight
  (gain) vector lying more than `n_sigma` (3) standard deviations from the vector's mean, either
  side (`weight_outliers`).
- The rogue dimensions by contribution to the cosine stay in `lmgeom.metrics.isotropy`.

`MagnitudeAccumulator` streams and merges (per-dimension sums of h, h^2 and |h|, and the running
top-k |h| with their rows and dimensions): one pass per layer, memory O(dim + top_k).
`TransformedAccumulator` feeds another accumulator the rows transformed per dimension
(((h - shift) / scale) on the kept dimensions): the cosines without the outlier dimensions and
after standardisation, from the moments of a first pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import numpy as np

from lmgeom.errors import InputError
from lmgeom.metrics.base import (
    StatefulAccumulator,
    StateDict,
    accumulator_class,
    as_float64_rows,
    register_accumulator,
    row_ids,
)

OUTLIER_SIGMAS = 3.0
TOP_ACTIVATIONS = 10
# Sun et al. (2024): massive = magnitude above 100 and about 1,000x the median magnitude
MASSIVE_MIN_MAGNITUDE = 100.0
MASSIVE_MIN_RATIO = 1000.0


@register_accumulator
class MagnitudeAccumulator(StatefulAccumulator):
    """Per-dimension sums of h, h^2 and |h| over the rows seen, and the `top_k` largest |h| with
    their global row (`add(X, rows=...)`: each row's store index) and dimension."""

    _state_fields: ClassVar[tuple[str, ...]] = ("top_k", "count", "sums", "square_sums", "abs_sums",
                                                "top_values", "top_rows", "top_dims")

    def __init__(self, top_k: int = TOP_ACTIVATIONS) -> None:
        if top_k < 1:
            raise InputError(f"top_k must be at least 1, got {top_k}", param="top_k")
        self.top_k = int(top_k)
        self.count = 0
        self.sums = np.zeros(0)
        self.square_sums = np.zeros(0)
        self.abs_sums = np.zeros(0)
        self.top_values = np.zeros(0)  # signed h, largest |h| first
        self.top_rows = np.zeros(0, dtype=np.int64)
        self.top_dims = np.zeros(0, dtype=np.int64)

    def add(self, X: Any, /, **ids: np.ndarray) -> MagnitudeAccumulator:
        X = as_float64_rows(X)
        (rows,) = row_ids(ids, ("rows",), len(X), type(self).__name__)
        if not len(X):
            return self
        if self.count == 0 and not self.sums.size:
            self.sums, self.square_sums, self.abs_sums = np.zeros(X.shape[1]), np.zeros(X.shape[1]), np.zeros(X.shape[1])
        if X.shape[1] != self.sums.size:
            raise ValueError(f"rows of dimension {X.shape[1]} added to an accumulator of dimension {self.sums.size}")
        magnitudes = np.abs(X)
        self.count += len(X)
        self.sums += X.sum(axis=0)
        self.square_sums += np.einsum("ij,ij->j", X, X)
        self.abs_sums += magnitudes.sum(axis=0)
        flat = magnitudes.ravel()
        k = min(self.top_k, flat.size)
        top = np.argpartition(flat, flat.size - k)[flat.size - k :]
        self._keep_top(X.ravel()[top], rows[top // X.shape[1]].astype(np.int64), top % X.shape[1])
        return self

    def _keep_top(self, values: np.ndarray, rows: np.ndarray, dims: np.ndarray) -> None:
        values = np.concatenate([self.top_values, values])
        rows = np.concatenate([self.top_rows, rows])
        dims = np.concatenate([self.top_dims, dims])
        # largest |h| first; ties by row then dimension, so the kept set does not depend on the order of adds
        order = np.lexsort((dims, rows, -np.abs(values)))[: self.top_k]
        self.top_values, self.top_rows, self.top_dims = values[order], rows[order], dims[order]

    def merge(self, other: MagnitudeAccumulator) -> MagnitudeAccumulator:
        if other.top_k != self.top_k:
            raise ValueError(f"cannot merge top-{self.top_k} and top-{other.top_k} accumulators")
        if not other.count:
            return self
        if not self.count:
            self.sums, self.square_sums, self.abs_sums = np.zeros_like(other.sums), np.zeros_like(other.sums), np.zeros_like(other.sums)
        if other.sums.size != self.sums.size:
            raise ValueError(f"cannot merge accumulators of dimensions {self.sums.size} and {other.sums.size}")
        self.count += other.count
        self.sums = self.sums + other.sums
        self.square_sums = self.square_sums + other.square_sums
        self.abs_sums = self.abs_sums + other.abs_sums
        self._keep_top(other.top_values, other.top_rows, other.top_dims)
        return self

    def result(self) -> Magnitudes:
        if not self.count:
            raise InputError("no rows were added to the magnitude accumulator")
        mean = self.sums / self.count
        variance = np.maximum(self.square_sums / self.count - mean**2, 0.0)
        return Magnitudes(self.count, mean, np.sqrt(variance), self.abs_sums / self.count,
                          self.top_values.copy(), self.top_rows.copy(), self.top_dims.copy())


@dataclass(frozen=True)
class Magnitudes:
    """Per-dimension mean, standard deviation (population) and mean |h|, and the top |h| entries."""

    count: int
    mean: np.ndarray
    std: np.ndarray
    mean_abs: np.ndarray
    top_values: np.ndarray
    top_rows: np.ndarray
    top_dims: np.ndarray


@dataclass(frozen=True)
class OutlierDimensions:
    """Dimensions whose mean |h| is more than `n_sigma` standard deviations (over dimensions) above
    the mean over dimensions, largest first, with their mean |h| and z-score."""

    n_sigma: float
    dimensions: np.ndarray
    mean_abs: np.ndarray
    z_scores: np.ndarray


def magnitude_outliers(mean_abs: np.ndarray, *, n_sigma: float = OUTLIER_SIGMAS) -> OutlierDimensions:
    """The `n_sigma` outliers of a per-dimension mean |h| (the population std over dimensions)."""
    mean_abs = np.asarray(mean_abs, dtype=np.float64)
    if mean_abs.ndim != 1 or mean_abs.size < 2:
        raise InputError(f"magnitude outliers need a per-dimension vector of at least 2 dimensions, got shape {mean_abs.shape}")
    spread = float(mean_abs.std())
    z = (mean_abs - mean_abs.mean()) / spread if spread > 0 else np.zeros_like(mean_abs)
    dims = np.flatnonzero(z > n_sigma)
    dims = dims[np.argsort(-z[dims], kind="stable")]
    return OutlierDimensions(n_sigma, dims, mean_abs[dims], z[dims])


def weight_outliers(weight: Any, *, n_sigma: float = OUTLIER_SIGMAS) -> tuple[np.ndarray, np.ndarray]:
    """(dimensions, z-scores) of the entries of a weight vector more than `n_sigma` population
    standard deviations from its mean, either side, largest |z| first (none when it is constant)."""
    weight = np.asarray(weight, dtype=np.float64)
    if weight.ndim != 1 or weight.size < 2:
        raise InputError(f"weight outliers need a vector of at least 2 entries, got shape {weight.shape}")
    spread = float(weight.std())
    z = (weight - weight.mean()) / spread if spread > 0 else np.zeros_like(weight)
    dims = np.flatnonzero(np.abs(z) > n_sigma)
    dims = dims[np.argsort(-np.abs(z[dims]), kind="stable")]
    return dims, z[dims]


def is_massive(magnitude: float, ratio: float) -> bool:
    """Sun et al. (2024)'s thresholds: |h| above 100 and at least 1,000 times the layer's median |h|."""
    return magnitude > MASSIVE_MIN_MAGNITUDE and ratio >= MASSIVE_MIN_RATIO


@register_accumulator
class TransformedAccumulator(StatefulAccumulator):
    """`inner` fed every row as ((h - shift) / scale)[kept]: `kept` dimensions (None: all), `shift`
    and `scale` per dimension (None: 0 and 1). Merges when the transforms agree; `result()` is the
    inner accumulator's."""

    _state_fields: ClassVar[tuple[str, ...]] = ("kept", "shift", "scale")

    def __init__(self, inner: Any, *, dim: int, kept: np.ndarray | None = None, shift: np.ndarray | None = None,
                 scale: np.ndarray | None = None) -> None:
        self.inner = inner
        self.kept = np.arange(dim, dtype=np.int64) if kept is None else np.asarray(kept, dtype=np.int64)
        self.shift = np.zeros(dim) if shift is None else np.asarray(shift, dtype=np.float64)
        self.scale = np.ones(dim) if scale is None else np.asarray(scale, dtype=np.float64)
        if self.shift.shape != (dim,) or self.scale.shape != (dim,) or not np.all(self.scale > 0):
            raise InputError(f"shift and scale must be {dim} values, the scales above 0", param="scale")

    def transform(self, X: np.ndarray) -> np.ndarray:
        return ((X - self.shift) / self.scale)[:, self.kept]

    def add(self, X: Any, /, **ids: np.ndarray) -> TransformedAccumulator:
        self.inner.add(self.transform(as_float64_rows(X)), **ids)
        return self

    def merge(self, other: TransformedAccumulator) -> TransformedAccumulator:
        if not (np.array_equal(self.kept, other.kept) and np.array_equal(self.shift, other.shift)
                and np.array_equal(self.scale, other.scale)):
            raise ValueError("cannot merge accumulators of rows transformed differently")
        self.inner.merge(other.inner)
        return self

    def result(self) -> Any:
        return self.inner.result()

    def state_dict(self) -> StateDict:
        state = super().state_dict()
        state["inner_class"] = type(self.inner).__name__
        state.update({f"inner.{name}": value for name, value in self.inner.state_dict().items()})
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        inner = {name.removeprefix("inner."): value for name, value in state.items() if name.startswith("inner.")}
        self.inner = accumulator_class(str(state["inner_class"])).from_state_dict(inner)


def standardizing(dim: int, mean: np.ndarray, std: np.ndarray) -> dict[str, Any]:
    """`TransformedAccumulator`'s keywords for rows z-scored per dimension with these moments
    (constant dimensions only centred)."""
    return {"dim": dim, "shift": np.asarray(mean, dtype=np.float64), "scale": np.where(std > 0, std, 1.0)}
