"""IsoScore* (Rudman & Eickhoff 2024, "Stable Anisotropic Regularization", ICLR 2024): IsoScore of a
covariance shrunk towards that of a large sample of the same kind of points, in numpy, and in torch
(differentiable: the I-STAR penalty of `lmgeom.finetune.istar`); torch is imported only by the torch
version. `covariance_of` gives the shrinkage covariance C0."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from lmgeom.errors import InputError
from lmgeom.metrics.base import as_float64_rows
from lmgeom.metrics.isotropy import MomentAccumulator, isoscore_from_variances, require_rows

if TYPE_CHECKING:
    import torch

# The paper's shrinkage: Sigma_zeta = (1 - zeta) Sigma_batch + zeta C0, with zeta = 0.2 and C0 the
# covariance of up to 250,000 points of the same kind (its I-STAR code, `get_ci`).
ISOSCORE_STAR_ZETA = 0.2
ISOSCORE_STAR_C0_POINTS = 250_000


def _check_shrinkage(zeta: float, shrinkage_covariance_shape: tuple[int, ...] | None, dim: int) -> None:
    if not 0.0 <= zeta <= 1.0:
        raise InputError(f"IsoScore* zeta must be in [0, 1], got {zeta}")
    if shrinkage_covariance_shape is None:
        if zeta > 0:
            raise InputError("IsoScore* with zeta > 0 needs the shrinkage covariance C0 (the covariance of a large "
                             "sample of the same kind of points); pass it, or zeta=0 for plain IsoScore")
    elif shrinkage_covariance_shape != (dim, dim):
        raise InputError(f"the shrinkage covariance C0 must be ({dim}, {dim}) for points of {dim} dimensions, "
                         f"got shape {shrinkage_covariance_shape}")


def isoscore_star(X: Any, shrinkage_covariance: Any = None, *, zeta: float = ISOSCORE_STAR_ZETA) -> float:
    """IsoScore* in [0, 1]: IsoScore of the shrunk covariance (1 - zeta) cov(X) + zeta C0.

    The shrinkage keeps the score stable on mini-batches with fewer points than dimensions, where
    the batch covariance alone is rank-deficient and IsoScore reads every missing direction as
    anisotropy. zeta = 0 is IsoScore. `shrinkage_covariance` (C0) is (dim, dim), usually
    `covariance_of(sample)` of a large sample of the same points; needed when zeta > 0.
    The torch version with gradients is `isoscore_star_torch`."""
    X = as_float64_rows(X)
    require_rows(X, 2, "IsoScore*")
    dim = X.shape[1]
    shape = None if shrinkage_covariance is None else tuple(np.shape(shrinkage_covariance))
    _check_shrinkage(zeta, shape, dim)
    covariance = MomentAccumulator().add(X).result().covariance()
    if shrinkage_covariance is not None:
        covariance = (1.0 - zeta) * covariance + zeta * np.asarray(shrinkage_covariance, dtype=np.float64)
    return isoscore_from_variances(np.clip(np.linalg.eigvalsh(covariance)[::-1], 0.0, None))


def isoscore_star_torch(points: torch.Tensor, shrinkage_covariance: torch.Tensor | None = None, *,
                        zeta: float = ISOSCORE_STAR_ZETA) -> torch.Tensor:
    """IsoScore* of a (n_points, dim) tensor as a 0-d tensor that gradients flow through (I-STAR's
    penalty). Computed in float64 whatever the input dtype (the covariance eigenvalues of a batch
    span many orders of magnitude), returned in the input's floating dtype."""
    import torch

    if points.ndim != 2 or points.shape[0] < 2:
        raise InputError(f"IsoScore* needs a (n_points >= 2, dim) tensor, got shape {tuple(points.shape)}")
    dim = points.shape[1]
    if dim < 2:
        raise InputError("IsoScore* needs points of at least 2 dimensions (n_features = 1 given)")
    _check_shrinkage(zeta, None if shrinkage_covariance is None else tuple(shrinkage_covariance.shape), dim)
    covariance = torch.cov(points.double().T)
    if shrinkage_covariance is not None:
        covariance = (1.0 - zeta) * covariance + zeta * shrinkage_covariance.to(covariance)
    # eigvalsh of the symmetric PSD matrix = its singular values; its gradient needs no eigenvector
    # derivatives, so repeated eigenvalues (an isotropic batch) are fine.
    variances = torch.linalg.eigvalsh(covariance).clamp_min(0.0)
    n = float(dim)
    normalised = variances * math.sqrt(n) / torch.linalg.vector_norm(variances)
    defect = torch.linalg.vector_norm(normalised - 1.0) / math.sqrt(2 * (n - math.sqrt(n)))
    score = ((n - defect**2 * (n - math.sqrt(n))) ** 2 - n) / (n * (n - 1))
    return score.to(points.dtype if points.dtype.is_floating_point else torch.float64)


def covariance_of(X: Any) -> np.ndarray:
    """Sample covariance (ddof=1, as `np.cov` and `torch.cov`) of (n_points, dim) rows, in float64:
    the C0 of `isoscore_star`."""
    X = as_float64_rows(X)
    require_rows(X, 2, "a covariance")
    return MomentAccumulator().add(X).result().covariance()
