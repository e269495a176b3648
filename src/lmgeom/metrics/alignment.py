"""Alignment and uniformity (Wang & Isola 2020) of vectors normalised to unit length, as SimCSE
(Gao et al. 2021) computes them. Pure: arrays in, numbers out.

- uniformity = log mean_{i<j} exp(-t ||u_i - u_j||^2), t = 2, over the distinct pairs of the
  unit vectors (lower: more uniform on the sphere; -4 is its floor for t = 2 in high dimension,
  0 when every vector is the same);
- alignment = mean over positive pairs (x, y) of ||u_x - u_y||^alpha, alpha = 2 (lower: positive
  pairs closer).

Uniformity over n vectors is exact over all n(n-1)/2 pairs, in blocks of rows (memory about
`memory_mb`), from ||u - v||^2 = 2 - 2 u.v.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lmgeom.errors import InputError
from lmgeom.metrics.base import as_float64_rows, unit_rows

UNIFORMITY_T = 2.0
ALIGNMENT_ALPHA = 2.0


def uniformity(X: Any, *, t: float = UNIFORMITY_T, memory_mb: float = 64) -> float:
    """Wang & Isola's uniformity of the non-zero rows of X, normalised (zero rows are left out)."""
    U, nonzero = unit_rows(as_float64_rows(X))
    U = U[nonzero]
    n = len(U)
    if n < 2:
        raise InputError(f"uniformity needs at least 2 non-zero vectors, got {n}")
    block = max(1, int(memory_mb * 2**20 / (8 * n)))
    total = 0.0
    for start in range(0, n, block):
        cosines = U[start : start + block] @ U.T
        total += float(np.exp(-t * np.maximum(2.0 - 2.0 * cosines, 0.0)).sum())
    # the diagonal (i = j) contributes exp(0) = 1 per row; each distinct pair is counted twice
    return float(np.log((total - n) / (n * (n - 1))))


def alignment(X: Any, Y: Any, *, alpha: float = ALIGNMENT_ALPHA) -> float:
    """Wang & Isola's alignment of the positive pairs (X[i], Y[i]), both normalised; pairs with a
    zero vector are left out."""
    X, Y = as_float64_rows(X, name="X"), as_float64_rows(Y, name="Y")
    if X.shape != Y.shape:
        raise InputError(f"alignment pairs X[i] with Y[i]: shapes {X.shape} and {Y.shape} differ")
    U, keep_x = unit_rows(X)
    V, keep_y = unit_rows(Y)
    keep = keep_x & keep_y
    if not keep.any():
        raise InputError("alignment needs at least one pair of non-zero vectors")
    return float((np.linalg.norm(U[keep] - V[keep], axis=1) ** alpha).mean())
