"""Intrinsic dimension of a point cloud from its nearest-neighbour distances: TwoNN, the Levina–Bickel
MLE with MacKay and Ghahramani's correction, and GRIDE across scales, each with a seeded bootstrap
interval. Pure: arrays in, numbers out (the per-layer driver is `lmgeom.stages.geometry`).

- **k-NN** (`nearest_neighbours`): exact search in blocks of query rows against every row, in
  float64 (torch, on a GPU when one is asked for), memory bounded by `memory_mb`.
- **Duplicates.** Exact duplicate rows have a nearest-neighbour distance of 0, which breaks every
  ratio estimator (TwoNN's mu = r2/r1 is infinite); `intrinsic_dimension` removes them first and
  reports how many it removed.
- **TwoNN** (Facco et al. 2017): mu_i = r2/r1 follows a Pareto law, F(mu) = 1 - mu^-d. The standard
  fit sorts the mu, discards the largest fraction `discard_fraction` (0.1, the paper's choice), and
  fits -log(1 - F_emp) = d log mu through the origin by least squares, F_emp(mu_(i)) = i / N.
- **MLE** (Levina & Bickel 2005) at point x with k neighbours: m_k(x)^-1 = 1/(k-1) sum_{j<k}
  log(T_k(x)/T_j(x)); MacKay & Ghahramani (2005) combine the points by averaging the *inverses*:
  m = [mean_x m_k(x)^-1]^-1.
- **GRIDE** (Denti et al. 2022): at scale s the ratio mu = r_{n2}/r_{n1} of the n2 = 2^s-th to the
  n1 = 2^(s-1)-th neighbour distance has density f(mu) = d (mu^d - 1)^(n2-n1-1) /
  (B(n2-n1, n1) mu^((n2-1) d + 1)); d maximises the likelihood of the points' mu (the derivative is
  strictly decreasing in d, so its one root is found by bracketing). Scale 1 is TwoNN's maximum
  likelihood form. Points whose mu is exactly 1 (ties) make the likelihood 0 at every d when
  n2 - n1 > 1; they are left out and counted.
- **Bootstrap**: the points' ratios (the neighbour graph fixed) resampled with replacement `n_boot`
  times, the estimate recomputed, and the percentile interval at `confidence` reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from scipy.optimize import brentq
from scipy.special import betaln

from lmgeom.errors import InputError
from lmgeom.metrics.base import as_float64_rows

TWONN_DISCARD_FRACTION = 0.1
MLE_NEIGHBOURS = 20
GRIDE_SCALES = 6  # n2 = 2, 4, ..., 64
N_BOOT = 200
CONFIDENCE = 0.95
INTERVAL = "percentile"


# --------------------------------------------------------------------------------------------
# exact k nearest neighbours in blocks
# --------------------------------------------------------------------------------------------


def _torch_device(device: str) -> Any:
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"device {device!r} asked for, but torch sees no CUDA device; use --device cpu or auto", param="device")
    return torch.device(device)


def nearest_neighbours(X: Any, k: int, *, device: str = "cpu", memory_mb: float = 256) -> tuple[np.ndarray, np.ndarray]:
    """(distances, indexes), each (n, k): every row's k nearest other rows by Euclidean distance,
    nearest first, by exact search: blocks of query rows against all rows, squared distances
    ||x||^2 + ||y||^2 - 2 x.y of the centred rows in float64 (centring leaves distances unchanged and
    keeps the cancellation at float64 rounding of the spread, not of the norms), on `device` (torch:
    cpu, cuda, auto). A row's own index is never among its neighbours; its duplicates are, at
    distance 0. Memory: about `memory_mb` of distances per block, plus the points in float64."""
    import torch

    X = as_float64_rows(X)
    n, dim = X.shape
    if not 1 <= k < n:
        raise InputError(f"k nearest neighbours needs 1 <= k < n points = {n}, got k = {k}", param="k")
    target = _torch_device(device)
    points = torch.from_numpy(X - X.mean(axis=0)).to(target)
    squared = torch.linalg.vecdot(points, points)
    block = max(1, min(n, int(memory_mb * 2**20 / (16 * n))))  # a block's products and distances, float64
    distances = np.empty((n, k))
    indexes = np.empty((n, k), dtype=np.int64)
    for start in range(0, n, block):
        stop = min(n, start + block)
        block_distances = points[start:stop] @ points.T
        block_distances.mul_(-2).add_(squared[start:stop, None]).add_(squared[None, :])
        block_distances[torch.arange(stop - start, device=target), torch.arange(start, stop, device=target)] = torch.inf
        values, found = torch.topk(block_distances, k, dim=1, largest=False, sorted=True)
        distances[start:stop] = values.clamp_(min=0).sqrt_().cpu().numpy()
        indexes[start:stop] = found.cpu().numpy()
    # near-duplicates (a squared distance near the formula's rounding, ~dim * 1e-16 * ||x||^2): their
    # neighbours' distances measured directly, ||x - y||, so two distinct rows are never at distance 0
    close = np.flatnonzero(distances[:, 0] ** 2 <= 1e-10 * float(squared.max()))
    if len(close):
        rows = torch.from_numpy(close).to(target)
        direct = torch.linalg.vector_norm(points[torch.from_numpy(indexes[close]).to(target)] - points[rows, None, :], dim=2)
        order = torch.argsort(direct, dim=1, stable=True)
        distances[close] = torch.gather(direct, 1, order).cpu().numpy()
        indexes[close] = np.take_along_axis(indexes[close], order.cpu().numpy(), axis=1)
    return distances, indexes


def unique_rows(X: Any) -> tuple[np.ndarray, int]:
    """(the distinct rows of X in their first-occurrence order, how many duplicate rows were removed)."""
    X = as_float64_rows(X)
    _, first = np.unique(X, axis=0, return_index=True)
    first.sort()
    return X[first], len(X) - len(first)


# --------------------------------------------------------------------------------------------
# the estimators, from neighbour distances
# --------------------------------------------------------------------------------------------


def _require_positive(r: np.ndarray, what: str) -> None:
    if (r <= 0).any():
        raise InputError(f"{what}: {int((r <= 0).sum())} points have a neighbour at distance 0 (duplicate points); "
                         "remove duplicates first (unique_rows, or intrinsic_dimension does it)")


def twonn_from_ratios(mu: np.ndarray, *, discard_fraction: float = TWONN_DISCARD_FRACTION) -> float:
    """TwoNN's standard fit on the ratios mu = r2/r1: slope through the origin of -log(1 - i/N)
    against log mu_(i) over the smallest (1 - discard_fraction) N ratios."""
    if not 0 <= discard_fraction < 1:
        raise InputError(f"discard_fraction must be in [0, 1), got {discard_fraction}", param="discard_fraction")
    n = len(mu)
    n_keep = int(n * (1 - discard_fraction))
    if n_keep < 2:
        raise InputError(f"TwoNN needs at least 2 points left after discarding {discard_fraction:.0%}, got {n} points")
    x = np.log(np.sort(mu)[:n_keep])
    y = -np.log1p(-np.arange(1, n_keep + 1) / n)
    denominator = float(x @ x)
    return float(x @ y / denominator) if denominator > 0 else float("inf")


def mle_inverse_estimates(distances: np.ndarray, k: int) -> np.ndarray:
    """Per point, Levina–Bickel's inverse estimate 1/(k-1) sum_{j<k} log(T_k / T_j) from its sorted
    neighbour distances (column j-1 = T_j)."""
    if not 2 <= k <= distances.shape[1]:
        raise InputError(f"the MLE needs 2 <= k <= {distances.shape[1]} neighbours, got k = {k}", param="k")
    T = distances[:, :k]
    _require_positive(T[:, 0], "the MLE")
    return np.log(T[:, k - 1 : k] / T[:, : k - 1]).mean(axis=1)


def mle_from_inverses(inverses: np.ndarray) -> float:
    """MacKay & Ghahramani's combination: the inverse of the mean of the points' inverse estimates."""
    mean = float(inverses.mean())
    return 1.0 / mean if mean > 0 else float("inf")


def gride_from_ratios(mu: np.ndarray, n1: int, n2: int) -> float:
    """The maximum-likelihood d of GRIDE's ratio law for the ratios mu = r_{n2}/r_{n1} > 1."""
    if not 1 <= n1 < n2:
        raise InputError(f"GRIDE needs 1 <= n1 < n2, got n1 = {n1}, n2 = {n2}")
    log_mu = np.log(mu)
    if (log_mu <= 0).any():
        raise InputError("GRIDE's ratios must exceed 1 (ties are left out before the fit)")
    n, total = len(mu), float(log_mu.sum())
    power = n2 - n1 - 1

    def score(d: float) -> float:  # the log-likelihood's derivative, strictly decreasing in d
        tie_term = float((log_mu / -np.expm1(-d * log_mu)).sum()) if power else 0.0
        return n / d + power * tie_term - (n2 - 1) * total

    low, high = 1e-6, max(1.0, n / (n1 * total))
    while score(high) > 0:
        high *= 2
        if high > 1e7:
            return float("inf")
    return float(brentq(score, low, high, xtol=1e-12, rtol=1e-12))


def gride_log_likelihood(mu: np.ndarray, d: float, n1: int, n2: int) -> float:
    """GRIDE's log-likelihood of the ratios at dimension d (for tests and for comparing fits)."""
    log_mu = np.log(mu)
    tie = (n2 - n1 - 1) * np.log(np.expm1(d * log_mu)).sum() if n2 - n1 > 1 else 0.0
    return float(len(mu) * (math.log(d) - betaln(n2 - n1, n1)) + tie - ((n2 - 1) * d + 1) * log_mu.sum())


# --------------------------------------------------------------------------------------------
# estimates with their intervals
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DimensionEstimate:
    """One estimate: `method` (twonn, mle, gride), the neighbours it reads (`n1`, `n2`: TwoNN 1, 2;
    MLE 1, k; GRIDE 2^(s-1), 2^s), the points it used, the estimate and its bootstrap interval."""

    method: str
    n1: int
    n2: int
    n_points: int
    dimension: float
    low: float
    high: float
    n_ties_excluded: int = 0

    def record(self) -> dict[str, Any]:
        return {"method": self.method, "n1": self.n1, "n2": self.n2, "n_points": self.n_points, "dimension": self.dimension,
                "low": self.low, "high": self.high, "n_ties_excluded": self.n_ties_excluded}


def _bootstrap(values: np.ndarray, estimate: Callable[[np.ndarray], float], *, n_boot: int, confidence: float,
               rng: np.random.Generator) -> tuple[float, float]:
    """Percentile interval of `estimate` over `n_boot` resamples (with replacement) of `values`."""
    if n_boot == 0:
        return float("nan"), float("nan")
    draws = np.array([estimate(values[rng.integers(0, len(values), len(values))]) for _ in range(n_boot)])
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(draws, [tail, 100 - tail])
    return float(low), float(high)


@dataclass(frozen=True)
class IntrinsicDimension:
    """Every estimate of one point cloud, and the points behind them."""

    n_rows: int  # rows given
    n_duplicates: int  # exact duplicate rows removed before any estimate
    estimates: list[DimensionEstimate]
    settings: dict[str, Any]

    def get(self, method: str, n2: int | None = None) -> DimensionEstimate:
        """The estimate of `method` (at neighbour `n2` for GRIDE's scales and the MLE's k)."""
        for estimate in self.estimates:
            if estimate.method == method and (n2 is None or estimate.n2 == n2):
                return estimate
        raise KeyError(f"no {method} estimate{'' if n2 is None else f' at n2 = {n2}'}")


def intrinsic_dimension(X: Any, *, discard_fraction: float = TWONN_DISCARD_FRACTION, mle_k: int = MLE_NEIGHBOURS,
                        gride_scales: int = GRIDE_SCALES, n_boot: int = N_BOOT, confidence: float = CONFIDENCE,
                        seed: int = 0, device: str = "cpu", memory_mb: float = 256) -> IntrinsicDimension:
    """TwoNN, the MLE (k = `mle_k`) and GRIDE at scales n2 = 2, 4, ..., 2^`gride_scales` of the rows
    of X, after removing exact duplicate rows, each with a seeded bootstrap percentile interval
    (`n_boot` resamples; 0 for none). One exact k-NN search serves them all."""
    if not 0 < confidence < 1:
        raise InputError(f"confidence must be in (0, 1), got {confidence}", param="confidence")
    if n_boot < 0 or gride_scales < 1:
        raise InputError(f"n_boot must be >= 0 and gride_scales >= 1, got {n_boot} and {gride_scales}")
    points, n_duplicates = unique_rows(X)
    k = max(2, mle_k, 2**gride_scales)
    if len(points) <= k:
        raise InputError(f"intrinsic dimension with {k} neighbours needs more than {k} distinct rows, got {len(points)} "
                         f"({n_duplicates} duplicates removed); lower mle_k / gride_scales or pass more rows")
    distances, _ = nearest_neighbours(points, k, device=device, memory_mb=memory_mb)
    rng = np.random.default_rng(seed)
    n = len(points)
    estimates: list[DimensionEstimate] = []

    mu = distances[:, 1] / distances[:, 0]
    twonn = twonn_from_ratios(mu, discard_fraction=discard_fraction)
    estimates.append(DimensionEstimate("twonn", 1, 2, n, twonn, *_bootstrap(
        mu, lambda m: twonn_from_ratios(m, discard_fraction=discard_fraction), n_boot=n_boot, confidence=confidence, rng=rng)))

    inverses = mle_inverse_estimates(distances, mle_k)
    estimates.append(DimensionEstimate("mle", 1, mle_k, n, mle_from_inverses(inverses),
                                       *_bootstrap(inverses, mle_from_inverses, n_boot=n_boot, confidence=confidence, rng=rng)))

    for scale in range(1, gride_scales + 1):
        n1, n2 = 2 ** (scale - 1), 2**scale
        ratios = distances[:, n2 - 1] / distances[:, n1 - 1]
        ties = ratios <= 1 if n2 - n1 > 1 else np.zeros(n, dtype=bool)
        ratios = ratios[~ties]

        def fit(m: np.ndarray, n1: int = n1, n2: int = n2) -> float:
            return gride_from_ratios(m, n1, n2)

        estimates.append(DimensionEstimate("gride", n1, n2, len(ratios), fit(ratios),
                                           *_bootstrap(ratios, fit, n_boot=n_boot, confidence=confidence, rng=rng),
                                           n_ties_excluded=int(ties.sum())))
    settings = {"twonn_discard_fraction": discard_fraction, "mle_k": mle_k, "mle_combination": "MacKay-Ghahramani (mean of inverses)",
                "gride_scales": [2**s for s in range(1, gride_scales + 1)], "n_boot": n_boot, "interval": INTERVAL,
                "confidence": confidence, "bootstrap": "points' ratios resampled, neighbour graph fixed", "seed": seed,
                "knn": "exact, blocked, float64"}
    return IntrinsicDimension(len(points) + n_duplicates, n_duplicates, estimates, settings)


def twonn(X: Any, *, discard_fraction: float = TWONN_DISCARD_FRACTION, device: str = "cpu") -> float:
    """TwoNN's standard fit on the distinct rows of X (no interval)."""
    points, _ = unique_rows(X)
    distances, _ = nearest_neighbours(points, 2, device=device)
    return twonn_from_ratios(distances[:, 1] / distances[:, 0], discard_fraction=discard_fraction)


def mle(X: Any, *, k: int = MLE_NEIGHBOURS, device: str = "cpu") -> float:
    """The Levina-Bickel MLE (k neighbours, MacKay-Ghahramani's combination) of the distinct rows of X (no interval)."""
    points, _ = unique_rows(X)
    distances, _ = nearest_neighbours(points, k, device=device)
    return mle_from_inverses(mle_inverse_estimates(distances, k))


# --------------------------------------------------------------------------------------------
# does the profile over depth pick the best probing layer?
# --------------------------------------------------------------------------------------------


def peak_layer(profile: np.ndarray) -> int:
    """The index of the profile's maximum (the first, on ties): Cheng et al. (2025)'s choice."""
    return int(np.argmax(profile))


def minimum_after_peak(profile: np.ndarray) -> int | None:
    """The index of the profile's minimum after its peak (Valeriani et al. 2023); None when the peak is last."""
    peak = peak_layer(profile)
    return None if peak == len(profile) - 1 else peak + 1 + int(np.argmin(profile[peak + 1 :]))


def hit_rate_test(hits: list[bool], chances: list[float]) -> dict[str, float]:
    """Hits against chance: the number of hits, the expected number, and the exact one-sided p-value
    P(H >= hits) of the Poisson-binomial law of independent cases with hit probabilities `chances`."""
    if len(hits) != len(chances):
        raise ValueError("one chance per case")
    law = np.array([1.0])  # law[h] = P(H = h) over the cases so far
    for p in chances:
        law = np.convolve(law, [1 - p, p])
    observed = int(sum(hits))
    return {"cases": len(hits), "hits": observed, "hit_rate": observed / len(hits) if hits else float("nan"),
            "expected_hits": float(sum(chances)), "p_value": float(law[observed:].sum())}
