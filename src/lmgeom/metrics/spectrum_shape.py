"""The shape of a covariance spectrum: stable rank, numerical rank and matrix (Renyi) entropy, from
the covariance eigenvalues of a layer's rows (docs/metrics.md)."""

from __future__ import annotations

import numpy as np

from lmgeom.errors import InputError


# numerical rank: singular values of the centred rows above this fraction of the largest one (a
# float32 store resolves about 1e-7 of a row's norm, so smaller ones are rounding, not directions)
NUMERICAL_RANK_RTOL = 1e-4
# Renyi order of the matrix entropy: 1 is the von Neumann entropy (Skean et al. 2025's "prompt entropy")
RENYI_ALPHA = 1.0


def stable_rank(variances: np.ndarray) -> float:
    """||W||_F^2 / ||W||_2^2 of the centred rows W: the sum of the covariance eigenvalues over the largest."""
    variances = np.asarray(variances, dtype=np.float64)
    top = float(variances.max()) if variances.size else 0.0
    return float(variances.sum() / top) if top > 0 else float("nan")


def numerical_rank(variances: np.ndarray, *, rtol: float = NUMERICAL_RANK_RTOL) -> int:
    """How many singular values of the centred rows (sqrt of the covariance eigenvalues) exceed
    `rtol` times the largest."""
    if not 0 < rtol < 1:
        raise InputError(f"rtol must be in (0, 1), got {rtol}", param="rtol")
    singular = np.sqrt(np.clip(np.asarray(variances, dtype=np.float64), 0.0, None))
    return int((singular > rtol * singular.max()).sum()) if singular.size and singular.max() > 0 else 0


def renyi_entropy(variances: np.ndarray, *, alpha: float = RENYI_ALPHA) -> float:
    """Renyi entropy of order `alpha` (nats) of the normalised covariance eigenvalues p = lambda / sum lambda,
    i.e. of the trace-normalised covariance (the matrix entropy of Giraldo et al. 2014):
    S_alpha = log(sum p^alpha) / (1 - alpha), and -sum p log p at alpha = 1.
    exp(S_2) is the participation ratio; exp(S_1) is Roy & Vetterli's effective rank of the covariance
    (lmgeom's `effective_rank` is that of the centred rows: exp of S_1 of sqrt(lambda) normalised)."""
    if alpha < 0:
        raise InputError(f"the Renyi order alpha must be >= 0, got {alpha}", param="alpha")
    values = np.clip(np.asarray(variances, dtype=np.float64), 0.0, None)
    total = values.sum()
    if total <= 0:
        return float("nan")
    p = values[values > 0] / total
    if alpha == 1:
        return float(-(p * np.log(p)).sum())
    return float(np.log((p**alpha).sum()) / (1 - alpha))


def spectrum_shape(variances: np.ndarray) -> dict[str, float]:
    """Stable rank, numerical rank (`NUMERICAL_RANK_RTOL`) and Renyi matrix entropy (`RENYI_ALPHA`) of a covariance spectrum."""
    return {"stable_rank": stable_rank(variances), "numerical_rank": float(numerical_rank(variances)),
            "matrix_entropy": renyi_entropy(variances)}
