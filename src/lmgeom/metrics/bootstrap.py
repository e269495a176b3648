"""Seeded bootstrap of per-layer means, from small summaries: resample draws, replicates, percentile
intervals and the paired test of two layers.

A resample is a vector of multiplicities m (how often each unit was drawn: n draws with replacement
from n units). Every replicate is computed from per-unit summaries, never from the rows again:
- a mean cosine over pairs of occurrences (the anisotropy baseline, a word's self-similarity) from
  the per-unit sums of unit vectors s_j and counts n_j. An occurrence is never paired with its own
  copy (a unit drawn twice does not add the cos = 1 pairs of each occurrence with itself); every
  pair of distinct original occurrences a, b counts m_a m_b times. So the replicate is
  (||sum_j m_j s_j||^2 - sum_j m_j^2 n_j) / ((sum_j m_j n_j)^2 - sum_j m_j^2 n_j),
  the original mean when m = 1 (`pair_mean`);
- a mean of per-item values (IntraSim per sentence, MEV per word): sum_j m_j a_j / sum_j m_j c_j,
  a_j the sum of unit j's defined values and c_j their number (`weighted_means`);
- MEV of resampled occurrences (the MEV baseline): the top eigenvalue of the weighted scatter
  X^T diag(m) X (uncentred and centred) by Lanczos from the full sample's direction, every
  resample at once (`resampled_mev`).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from lmgeom.errors import InputError

INTERVAL = "percentile"
# independent streams of one seed: the sentence units, the words, the sampled occurrences
STREAMS = {"sentences": 1, "words": 2, "sampled occurrences": 3}
# the resampled MEV baseline: the most Lanczos steps of a resample, and the largest relative residual
# of the Ritz pair accepted (else the resample is solved exactly); exact from the start up to DENSE_DIM
LANCZOS_STEPS = 30
RESIDUAL_TOLERANCE = 1e-8
DENSE_DIM = 64
# SelfSim's replicates: words in at most GROUPED_UNITS units are batched, GROUPED_ELEMENTS
# multiplicities (B x words x units) at a time
GROUPED_UNITS = 64
CHECK_FROM = 4  # the first Lanczos step whose Ritz pairs are checked for convergence
GROUPED_ELEMENTS = 2**22


def draws(n_units: int, n_resamples: int, seed: int, stream: str) -> np.ndarray:
    """(n_resamples, n_units) multiplicities: each row n_units draws with replacement (seeded; `stream`
    one of `STREAMS`, so the units, words and sampled occurrences get independent draws of one seed)."""
    rng = np.random.default_rng([seed, STREAMS[stream]])
    picks = rng.integers(0, n_units, size=(n_resamples, n_units)) if n_units else np.zeros((n_resamples, 0), dtype=np.int64)
    offsets = picks + n_units * np.arange(n_resamples)[:, None]
    return np.bincount(offsets.ravel(), minlength=n_resamples * n_units).reshape(n_resamples, n_units).astype(np.int32)


def pair_mean(m: np.ndarray, sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Each resample's mean cosine over pairs of distinct original occurrences (module docstring).

    `m`: (B, k) multiplicities of the k units that hold occurrences; `sums`: (k, d) their sums of unit
    vectors; `counts`: (k,) their occurrences. NaN where a resample has fewer than two distinct
    occurrences."""
    m = np.asarray(m, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.float64)
    if sums.shape[0] <= sums.shape[1]:
        gram = sums @ sums.T  # k x k: cheaper than the (B, d) resampled sums when k <= d
        squared = np.einsum("bj,bj->b", m @ gram, m)
    else:
        resampled = m @ sums
        squared = np.einsum("bi,bi->b", resampled, resampled)
    own = (m * m) @ counts
    pairs = (m @ counts) ** 2 - own
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(pairs > 0, (squared - own) / pairs, np.nan)


def self_similarity_replicates(m: np.ndarray, keys: np.ndarray, sums: np.ndarray, counts: np.ndarray, n_units: int) -> np.ndarray:
    """Each resample's mean self-similarity over the words defined in it (two distinct occurrences
    drawn), from per-(word, unit) sums (`keys` = word * n_units + unit, ascending; `m`: (B, n_units)).
    Words in the same number k <= `GROUPED_UNITS` of units are computed together, from their k x k
    Gram matrices (`pair_mean`'s formula, batched); a word in more units alone by `pair_mean`."""
    word, unit = keys // n_units, keys % n_units
    starts = np.flatnonzero(np.concatenate([[True], word[1:] != word[:-1]])) if len(word) else np.zeros(0, dtype=np.int64)
    sizes = np.diff(np.append(starts, len(word)))
    m = np.asarray(m, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.float64)
    total, defined = np.zeros(len(m)), np.zeros(len(m))

    def add(values: np.ndarray) -> None:  # (B, words)
        known = ~np.isnan(values)
        total[:] += np.where(known, values, 0.0).sum(axis=1)
        defined[:] += known.sum(axis=1)

    for k in np.unique(sizes).tolist():
        group = starts[sizes == k]
        if k > GROUPED_UNITS:
            for start in group.tolist():
                add(pair_mean(m[:, unit[start:start + k]], sums[start:start + k], counts[start:start + k])[:, None])
            continue
        per_chunk = max(1, GROUPED_ELEMENTS // (len(m) * k))
        for first in range(0, len(group), per_chunk):
            rows = group[first:first + per_chunk, None] + np.arange(k)  # (W, k) indexes of the pairs
            block = sums[rows]  # (W, k, d)
            gram = np.matmul(block, block.transpose(0, 2, 1))  # (W, k, k)
            drawn = m[:, unit[rows]].transpose(1, 0, 2)  # (W, B, k)
            squared = np.einsum("wbj,wbj->wb", np.matmul(drawn, gram), drawn)
            own = np.einsum("wbj,wj->wb", drawn * drawn, counts[rows])
            pairs = np.einsum("wbj,wj->wb", drawn, counts[rows]) ** 2 - own
            with np.errstate(divide="ignore", invalid="ignore"):
                add(np.where(pairs > 0, (squared - own) / pairs, np.nan).T)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(defined > 0, total / defined, np.nan)


def weighted_means(m: np.ndarray, totals: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Each resample's mean of per-item values, from per-unit `totals` (sums of defined values) and
    `counts` (their number); NaN where a resample holds no defined value."""
    m = np.asarray(m, dtype=np.float64)
    n = m @ np.asarray(counts, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(n > 0, (m @ np.asarray(totals, dtype=np.float64)) / n, np.nan)


def unit_totals(values: np.ndarray, units: np.ndarray, n_units: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-unit sums of the defined (non-NaN) `values` and their number (`units`: each value's unit)."""
    defined = ~np.isnan(values)
    totals = np.bincount(units[defined], weights=values[defined], minlength=n_units)
    return totals, np.bincount(units[defined], minlength=n_units).astype(np.float64)


def _scatter(X: np.ndarray, m: np.ndarray, centred: bool) -> np.ndarray:
    """X^T diag(m) X, minus N mu mu^T when `centred` (mu the m-weighted mean, N = sum m)."""
    scatter = (X.T * m) @ X
    if centred:
        total = m @ X
        scatter -= np.outer(total, total) / m.sum()
    return scatter


def _apply(X: np.ndarray, m: np.ndarray, vectors: np.ndarray, centred: bool) -> np.ndarray:
    """`_scatter(X, m_b) @ v_b` for every resample b at once, without forming a scatter matrix."""
    images = (m * (vectors @ X.T)) @ X
    if centred:
        n_b = m.sum(axis=1)
        means = (m @ X) / n_b[:, None]
        images -= (n_b * np.einsum("bi,bi->b", means, vectors))[:, None] * means
    return images


def _top_eigenpairs(X: np.ndarray, m: np.ndarray, start: np.ndarray, centred: bool,
                    max_steps: int = LANCZOS_STEPS) -> tuple[np.ndarray, np.ndarray]:
    """Top eigenvalue and unit eigenvector of `_scatter(X, m_b)` for every resample b: Lanczos from
    `start` (d,) with full reorthogonalisation, every resample at once, each stopped at the first step
    where its Ritz pair's residual (beta_j |last component of the Ritz vector|, exact in exact
    arithmetic) is at most `RESIDUAL_TOLERANCE` lambda, or at `max_steps` (the top Ritz value
    converges like a Chebyshev polynomial of the spectral gap, not like its power). The residual
    ||C v - lambda v|| is then computed; a resample above the tolerance is solved exactly (its scatter
    formed, `numpy.linalg.eigh`), as is every resample at d <= `DENSE_DIM`. An eigenvalue's error is
    at most residual^2 / gap."""
    n_resamples, dim = len(m), X.shape[1]
    steps = min(max_steps, dim)
    values, vectors = np.zeros(n_resamples), np.zeros((n_resamples, dim))
    todo = np.arange(n_resamples)
    if dim > DENSE_DIM and n_resamples:
        basis = np.zeros((n_resamples, steps, dim))
        alpha, beta = np.zeros((n_resamples, steps)), np.zeros((n_resamples, steps))
        basis[:, 0] = start / np.linalg.norm(start)
        active = np.arange(n_resamples)
        for j in range(steps):
            w = _apply(X, m[active], basis[active, j], centred)
            alpha[active, j] = np.einsum("bi,bi->b", w, basis[active, j])
            # full reorthogonalisation against every basis vector so far (twice: Kahan's "twice is enough")
            kept = basis[active, : j + 1]
            for _ in range(2):
                w -= np.matmul(np.matmul(kept, w[:, :, None]).transpose(0, 2, 1), kept)[:, 0]
            norms = np.linalg.norm(w, axis=1)
            invariant = norms <= 1e-13 * np.maximum(np.abs(alpha[active, : j + 1]).max(axis=1), 1e-300)
            if j + 1 < min(CHECK_FROM, steps) and not invariant.any():
                basis[active, j + 1] = w / norms[:, None]
                beta[active, j] = norms
                continue
            ritz_values, ritz_vectors = np.linalg.eigh(_tridiagonal(alpha[active, : j + 1], beta[active, :j]))
            top = ritz_values[:, -1]
            done = invariant | (norms * np.abs(ritz_vectors[:, -1, -1]) <= RESIDUAL_TOLERANCE * np.abs(top)) | (j + 1 == steps)
            finished = active[done]
            values[finished] = top[done]
            vectors[finished] = np.einsum("bk,bki->bi", ritz_vectors[done, :, -1], kept[done])
            going = ~done
            active = active[going]
            if not len(active):  # every resample done (at the last step, always): no next basis vector
                break
            basis[active, j + 1] = w[going] / norms[going, None]
            beta[active, j] = norms[going]
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        residuals = np.linalg.norm(_apply(X, m, vectors, centred) - values[:, None] * vectors, axis=1)
        todo = np.flatnonzero(~(residuals <= RESIDUAL_TOLERANCE * np.abs(values)))
    for b in todo.tolist():
        eigenvalues, eigenvectors = np.linalg.eigh(_scatter(X, m[b], centred))
        values[b], vectors[b] = eigenvalues[-1], eigenvectors[:, -1]
    return values, vectors


def _tridiagonal(alpha: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """(B, k, k) symmetric tridiagonal matrices of diagonals `alpha` (B, k) and off-diagonals `beta` (B, k - 1)."""
    n_resamples, k = alpha.shape
    out = np.zeros((n_resamples, k, k))
    index = np.arange(k)
    out[:, index, index] = alpha
    out[:, index[:-1], index[1:]] = beta
    out[:, index[1:], index[:-1]] = beta
    return out


def _start(X: np.ndarray, centred: bool) -> np.ndarray:
    """The top eigenvector of the unweighted scatter of `X` (the resamples' Lanczos start): Lanczos
    from the column sums (uncentred) or from the scatter's column of largest variance (centred)."""
    if centred:
        Xc = X - X.mean(axis=0)
        first = Xc.T @ Xc[:, int(np.argmax(np.einsum("ij,ij->j", Xc, Xc)))]
    else:
        first = X.sum(axis=0)
    if not np.any(first):
        first = np.ones(X.shape[1])
    _, vector = _top_eigenpairs(X, np.ones((1, len(X))), first, centred, max_steps=4 * LANCZOS_STEPS)
    return vector[0]


def resampled_mev(X: np.ndarray, m: np.ndarray, variants: Sequence[str]) -> dict[str, np.ndarray]:
    """Each MEV variant (`lmgeom.metrics.spectrum.OccurrenceSpectrum`) of every resample of the rows of
    `X` (non-zero rows; `m`: (B, n) multiplicities), without forming a scatter matrix per resample."""
    X = np.asarray(X, dtype=np.float64)
    m = np.asarray(m, dtype=np.float64)
    n_b = m.sum(axis=1)
    frobenius = m @ np.einsum("ij,ij->i", X, X)
    means = (m @ X) / n_b[:, None]
    centred_total = frobenius - n_b * np.einsum("bi,bi->b", means, means)
    top, direction = _top_eigenpairs(X, m, _start(X, centred=False), centred=False)
    out: dict[str, np.ndarray] = {}
    spread = centred_total > 1e-10 * frobenius
    with np.errstate(divide="ignore", invalid="ignore"):
        if "uncentred" in variants:
            out["uncentred"] = top / frobenius
        if "centred" in variants:
            centred_top, _ = _top_eigenpairs(X, m, _start(X, centred=True), centred=True)
            out["centred"] = np.where(spread, centred_top / centred_total, np.nan)
        if "svd_ratio" in variants:
            along = np.einsum("bi,bi->b", (m * (direction @ X.T)) @ X, direction) - n_b * np.einsum("bi,bi->b", means, direction) ** 2
            out["svd_ratio"] = np.where(spread, along / centred_total, np.nan)
    return out


def percentile_interval(replicates: np.ndarray, level: float) -> tuple[float, float]:
    """The percentile interval of `level` (e.g. 0.95) of the defined replicates (NaN if none)."""
    defined = replicates[~np.isnan(replicates)]
    if not len(defined):
        return float("nan"), float("nan")
    tail = (1 - level) / 2
    lo, hi = np.quantile(defined, [tail, 1 - tail])
    return float(lo), float(hi)


def paired_test(replicates: np.ndarray, previous: np.ndarray, difference: float, level: float) -> dict[str, Any]:
    """The paired bootstrap of a difference of two layers' values (the same resamples at both): its
    percentile interval and a two-sided p-value, 2 min(P*(diff <= 0), P*(diff >= 0)) with the
    (1 + count) / (1 + B) correction (capped at 1)."""
    diffs = replicates - previous
    diffs = diffs[~np.isnan(diffs)]
    lo, hi = percentile_interval(diffs, level)
    if not len(diffs):
        return {"difference": difference, "lo": lo, "hi": hi, "p_value": float("nan")}
    below = (1 + np.count_nonzero(diffs <= 0)) / (1 + len(diffs))
    above = (1 + np.count_nonzero(diffs >= 0)) / (1 + len(diffs))
    return {"difference": difference, "lo": lo, "hi": hi, "p_value": float(min(1.0, 2 * min(below, above)))}


ROUGH_BELOW = 100
"""Resamples below which the percentile intervals are rough: each end is one of a few replicates, not a
quantile of the bootstrap distribution (with B = 1 both ends are the one replicate, a resample's value,
which need not lie anywhere near the estimate)."""


class RoughIntervalsWarning(UserWarning):
    """Fewer than `ROUGH_BELOW` bootstrap resamples: the intervals are rough (`rough_note`)."""

    params = ("bootstrap",)


def rough_note(n_resamples: int) -> str | None:
    """Why intervals from `n_resamples` resamples are rough (None when they are not, or there are none)."""
    if not 0 < n_resamples < ROUGH_BELOW:
        return None
    ends = ("both ends are the one resample's value, which need not contain the estimate" if n_resamples == 1 else
            f"each end is one of only {n_resamples} replicates, not a quantile of the bootstrap distribution")
    return (f"rough intervals: `bootstrap={n_resamples}` resamples, fewer than {ROUGH_BELOW}: {ends}; give `bootstrap` "
            "1000 or more for intervals to report")


def check_options(n_resamples: int, level: float) -> None:
    if n_resamples < 0:
        raise InputError(f"`bootstrap` must be 0 (no intervals) or a number of resamples; got {n_resamples}", param="bootstrap")
    if not 0 < level < 1:
        raise InputError(f"`confidence` must lie strictly between 0 and 1 (e.g. 0.95); got {level}", param="confidence")
