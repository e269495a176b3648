"""Top eigenpairs of occurrence matrices without dense n x n or d x d eigenproblems.

MEV needs, per word, the top eigenvalue of X^T X (and of the scatter matrix C about the word's mean)
and the top direction v1; everything else is a sum of squares. So a word with many occurrences is
solved matrix-free: block Lanczos (Rayleigh-Ritz on a growing Krylov basis, full
reorthogonalisation, thick restart) on an operator that only multiplies blocks of vectors. The
uncentred and centred problems of a word share one basis and each product: the block goes through
the word's *centred* rows once, giving C V, and X^T X V = C V + s (s^T V) / n, so both are accurate
even when the mean dominates.
Words with few occurrences are solved exactly and in batches: one stack of small Gram matrices,
one batched `eigh`.

Stopping rule, per problem: a Ritz pair (theta, x) with residual r = A x - theta x has an eigenvalue
within min(|r|, |r|^2 / gap) of theta (Kato-Temple; gap = theta - next Ritz value estimates the
distance to the rest of the spectrum), and its angle to the top eigenvector is at most |r| / gap
(Davis-Kahan). Values stop at `VALUE_RTOL`; directions at `DIRECTION_TOL`, or where the residual
reaches float64 rounding (a near-degenerate top: the value is exact, the direction is one unit
vector of the top eigenspace, as with dense `eigh`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np
from scipy.linalg import eigh

MEV_VARIANTS = ("uncentred", "centred", "svd_ratio")

# Centred variance this small relative to the raw second moment means the occurrences are one
# vector repeated (to float64 precision): there is no spread for a centred MEV to explain.
_NO_SPREAD_RELATIVE = 1e-10

# relative error bound at which an eigenvalue stops (MEV values are checked to 1e-9 against eigh)
VALUE_RTOL = 1e-11
# angle bound at which a direction stops (static vectors and svd_ratio are checked to 1e-6)
DIRECTION_TOL = 1e-7
# a residual this small relative to the eigenvalue is float64 rounding: nothing left to gain
RESIDUAL_FLOOR = 1e-13
# Krylov block width and the basis size that triggers a thick restart (half of it is kept)
BLOCK_SIZE = 8
MAX_BASIS = 160
# a safety stop far beyond what flat (Gaussian) spectra need at d = 4,096 (about 450); reaching it warns
MAX_MULTIPLICATIONS = 5000
# words with at most this many occurrences (or d at most this) are solved densely: below it
# one Gram matrix and one eigh cost less than a few Krylov multiplications
DENSE_LIMIT = 256

BlockOperator = Callable[[np.ndarray], list[np.ndarray]]


@dataclass(frozen=True)
class TopEigenpair:
    """The top eigenvalue of a symmetric positive semi-definite operator and a unit eigenvector.

    `residual` is |A v - value v| and `gap` the distance to the next Ritz value, so the value is
    within min(residual, residual^2 / gap) of the top eigenvalue and v within an angle of about
    residual / gap of the top eigenvector."""

    value: float
    vector: np.ndarray
    residual: float
    gap: float
    multiplications: int


class _RitzProblem:
    """One operator's images of the shared basis, its projection on the basis, and its Ritz pairs."""

    def __init__(self, dim: int, *, need_vector: bool) -> None:
        self.need_vector = need_vector
        self.images = np.zeros((dim, 0))
        self.projected = np.zeros((0, 0))
        self.solution: TopEigenpair | None = None
        self.values = np.zeros(0)
        self.coefficients = np.zeros((0, 0))

    def extend(self, basis: np.ndarray, block: np.ndarray, images: np.ndarray) -> None:
        """Add `block` (already appended to `basis`) and its `images`; update the Ritz pairs."""
        cross = basis.T @ images
        size = self.projected.shape[0]
        projected = np.empty((basis.shape[1], basis.shape[1]))
        projected[:size, :size] = self.projected
        projected[:, size:] = cross
        projected[size:, :size] = cross[:size].T
        projected[size:, size:] = (cross[size:] + cross[size:].T) / 2
        self.projected = projected
        self.images = np.concatenate([self.images, images], axis=1)
        values, coefficients = eigh(projected)
        self.values, self.coefficients = values[::-1], coefficients[:, ::-1]

    def residuals(self, basis: np.ndarray, multiplications: int, *, exhausted: bool = False) -> np.ndarray:
        """Residuals of the leading Ritz pairs; records the solution when the top pair has converged
        or the basis is `exhausted` (it holds an invariant subspace: the Ritz pairs are exact)."""
        wanted = self.coefficients[:, :BLOCK_SIZE]
        ritz = basis @ wanted
        residuals = self.images @ wanted - ritz * self.values[: wanted.shape[1]]
        top = max(float(self.values[0]), 0.0)
        residual = float(np.linalg.norm(residuals[:, 0]))
        gap = float(self.values[0] - self.values[1]) if len(self.values) > 1 else 0.0
        value_error = residual if gap <= 0 else min(residual, residual**2 / gap)
        floor = residual <= RESIDUAL_FLOOR * top
        vector_done = not self.need_vector or floor or (gap > 0 and residual <= DIRECTION_TOL * gap)
        converged = exhausted or top == 0 or (value_error <= VALUE_RTOL * top and vector_done)
        if not converged and multiplications >= MAX_MULTIPLICATIONS:
            warnings.warn(f"block Lanczos stopped after {multiplications} products with a relative residual of "
                          f"{residual / top:.1e} (eigenvalue error bound {value_error / top:.1e})", RuntimeWarning, stacklevel=2)
        if converged or multiplications >= MAX_MULTIPLICATIONS:
            self.solution = TopEigenpair(top, ritz[:, 0], residual, gap, multiplications)
        return residuals

    def restart(self, kept: np.ndarray) -> None:
        self.images = self.images @ kept
        self.projected = kept.T @ self.projected @ kept
        self.projected = (self.projected + self.projected.T) / 2


def top_eigenpairs(apply: BlockOperator, start: np.ndarray, *, need_vector: Sequence[bool]) -> list[TopEigenpair]:
    """Top eigenpairs of several symmetric PSD operators on one shared subspace.

    `apply(V)` returns each operator's images of the block V; the operators of a word (X^T X and
    its scatter matrix, which differ by the rank one s s^T / n) have the same Krylov spaces from a
    start containing s, so one basis, grown a block at a time from the Ritz residuals of both,
    serves both at the cost of one product. `start` (dim x k) seeds the basis; `need_vector[i]`
    asks operator i for a converged direction and not only a converged value."""
    dim = start.shape[0]
    problems = [_RitzProblem(dim, need_vector=need) for need in need_vector]
    basis = np.zeros((dim, 0))
    block = _orthonormal_complement(start, basis, width=BLOCK_SIZE, drop_below=0.0)
    multiplications = 0
    while True:
        images = apply(block)
        multiplications += block.shape[1]
        basis = np.concatenate([basis, block], axis=1)
        residuals = []
        for problem, image in zip(problems, images):
            if problem.solution is None:
                problem.extend(basis, block, image)
                residuals.append(problem.residuals(basis, multiplications))
        active = [problem for problem in problems if problem.solution is None]
        if not active:
            return [problem.solution for problem in problems if problem.solution is not None]
        if basis.shape[1] + BLOCK_SIZE > MAX_BASIS:
            kept = np.concatenate([problem.coefficients[:, : MAX_BASIS // (2 * len(active))] for problem in active], axis=1)
            kept = np.linalg.qr(kept)[0]
            basis = basis @ kept
            for problem in active:
                problem.restart(kept)
        scale = max(float(problem.values[0]) for problem in active)
        block = _orthonormal_complement(np.concatenate(residuals, axis=1), basis, width=BLOCK_SIZE,
                                        drop_below=RESIDUAL_FLOOR * scale)
        if block.shape[1] == 0:
            for problem in active:
                problem.residuals(basis, multiplications, exhausted=True)


def _orthonormal_complement(block: np.ndarray, basis: np.ndarray, *, width: int, drop_below: float) -> np.ndarray:
    """At most `width` orthonormal columns spanning the main part of span(block) orthogonal to
    `basis` (orthonormal columns); columns of norm at most `drop_below` are left out."""
    norms = np.linalg.norm(block, axis=0)
    block = block[:, norms > drop_below] / norms[norms > drop_below]
    for _ in range(2):  # classical Gram-Schmidt twice is orthogonal to working precision
        block = block - basis @ (basis.T @ block)
    left, weights, _ = np.linalg.svd(block, full_matrices=False)
    kept = left[:, : width][:, weights[:width] > 1e-8]
    return kept - basis @ (basis.T @ kept)


def start_block(direction: np.ndarray, *, seed: int = 0) -> np.ndarray:
    """A block led by `direction` (for occurrence matrices the row sum, which must be in the basis for
    the shared Krylov space and is close to v1 when one direction dominates), completed with
    seeded Gaussian columns."""
    rng = np.random.default_rng(seed)
    columns = rng.standard_normal((len(direction), BLOCK_SIZE))
    norm = np.linalg.norm(direction)
    if norm > 0:
        columns[:, 0] = direction / norm
    return columns


# ---------------------------------------------------------------------------------------------
# the spectrum of one word's occurrence matrix


@dataclass(frozen=True)
class OccurrenceSpectrum:
    """What MEV and the static embedding need from an occurrence matrix X (n non-zero rows x d).

    `direction` is v1, the top right singular vector of the *uncentred* X, with its sign chosen so
    that v1 . mean >= 0: the static embedding. With C = the scatter matrix of X about its mean:
      uncentred MEV = sigma_1^2 / ||X||_F^2             (the paper's printed formula)
      centred MEV   = top eigenvalue of C / trace(C)    (PCA; a later version of the original code)
      svd_ratio MEV = v1' C v1 / trace(C)               (= var(X v1) / sum_j var(X[:, j]): TruncatedSVD's
                                                         explained_variance_ratio_[0], used for the released figures)
    """

    n: int
    top_eigenvalue: float
    frobenius_sq: float
    centred_top_eigenvalue: float
    centred_total: float
    centred_along_direction: float
    direction: np.ndarray
    mean: np.ndarray

    def mev(self, variant: str) -> float:
        if variant == "uncentred":
            return self.top_eigenvalue / self.frobenius_sq
        if variant not in MEV_VARIANTS:
            raise ValueError(f"unknown MEV variant {variant!r}; choose one of {', '.join(MEV_VARIANTS)}")
        if self.centred_total <= _NO_SPREAD_RELATIVE * self.frobenius_sq:
            return float("nan")
        if variant == "centred":
            return self.centred_top_eigenvalue / self.centred_total
        return self.centred_along_direction / self.centred_total


def _occurrence_spectrum(n: int, mean: np.ndarray, *, top: float, direction: np.ndarray, frobenius_sq: float,
                         centred_top: float, centred_total: float, centred_along: float) -> OccurrenceSpectrum:
    direction = direction / np.linalg.norm(direction)
    if mean @ direction < 0:
        direction = -direction
    return OccurrenceSpectrum(
        n=n, top_eigenvalue=top, frobenius_sq=frobenius_sq, centred_top_eigenvalue=max(centred_top, 0.0),
        centred_total=max(centred_total, 0.0), centred_along_direction=max(centred_along, 0.0),
        direction=direction, mean=mean,
    )


def rows_spectra(words_rows: Sequence[np.ndarray]) -> list[OccurrenceSpectrum]:
    """The spectrum of each word's occurrence matrix (float64, non-zero rows), in order: words with
    few rows (or few dimensions) densely in batches, the others matrix-free."""
    spectra: list[OccurrenceSpectrum | None] = [None] * len(words_rows)
    small = [i for i, rows in enumerate(words_rows) if min(rows.shape) <= DENSE_LIMIT and len(rows) <= DENSE_LIMIT]
    for indexes in _dense_batches(words_rows, small):
        for i, spectrum in zip(indexes, _gram_spectra([words_rows[i] for i in indexes])):
            spectra[i] = spectrum
    for i, rows in enumerate(words_rows):
        if spectra[i] is None:
            spectra[i] = _moment_spectrum_dense(rows) if rows.shape[1] <= DENSE_LIMIT else _krylov_rows_spectrum(rows)
    return [spectrum for spectrum in spectra if spectrum is not None]


# a batch of padded occurrence matrices stays under this many float64 entries (64 MB)
_BATCH_ENTRIES = 8 * 2**20


def _size_class(n: int) -> int:
    return max(2, 1 << (n - 1).bit_length())


def _dense_batches(words_rows: Sequence[np.ndarray], indexes: list[int]) -> Iterator[list[int]]:
    """Indexes of words padded to the same row count, in batches of bounded size."""
    by_class: dict[int, list[int]] = {}
    for i in indexes:
        by_class.setdefault(_size_class(len(words_rows[i])), []).append(i)
    for size, members in sorted(by_class.items()):
        per_batch = max(1, _BATCH_ENTRIES // (size * words_rows[members[0]].shape[1]))
        for start in range(0, len(members), per_batch):
            yield members[start:start + per_batch]


def _gram_spectra(words_rows: Sequence[np.ndarray]) -> list[OccurrenceSpectrum]:
    """Spectra of words of similar row counts from their n x n Gram matrices, in one batched eigh.

    Rows are zero-padded to a common count; a padded row adds a zero eigenvalue and nothing else.
    The centred Gram matrix comes from explicitly centred rows (accurate when the mean dominates) and
    the uncentred one from it by a rank-two update, X = Xc + w m^T with w the real-row indicator."""
    size = max(len(rows) for rows in words_rows)
    dim = words_rows[0].shape[1]
    counts = np.array([len(rows) for rows in words_rows], dtype=np.float64)
    stacked = np.zeros((len(words_rows), size, dim))
    real = np.zeros((len(words_rows), size))
    for i, rows in enumerate(words_rows):
        stacked[i, : len(rows)] = rows
        real[i, : len(rows)] = 1.0
    means = stacked.sum(axis=1) / counts[:, None]
    centred = stacked - real[:, :, None] * means[:, None, :]
    centred_gram = centred @ centred.transpose(0, 2, 1)
    along_mean = np.einsum("wkd,wd->wk", centred, means)
    mean_sq = np.einsum("wd,wd->w", means, means)
    gram = (centred_gram + along_mean[:, :, None] * real[:, None, :] + real[:, :, None] * along_mean[:, None, :]
            + mean_sq[:, None, None] * real[:, :, None] * real[:, None, :])
    values, vectors = np.linalg.eigh(gram)
    left = vectors[:, :, -1]
    directions = np.einsum("wkd,wk->wd", centred, left) + means * np.einsum("wk,wk->w", real, left)[:, None]
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    centred_tops = np.linalg.eigvalsh(centred_gram)[:, -1]
    centred_totals = np.einsum("wkd,wkd->w", centred, centred)
    frobenius = np.einsum("wkd,wkd->w", stacked, stacked)
    along = np.einsum("wkd,wd->wk", centred, directions)
    return [
        _occurrence_spectrum(int(counts[i]), means[i], top=float(values[i, -1]), direction=directions[i],
                             frobenius_sq=float(frobenius[i]), centred_top=float(centred_tops[i]),
                             centred_total=float(centred_totals[i]), centred_along=float(along[i] @ along[i]))
        for i in range(len(words_rows))
    ]


def _moment_spectrum_dense(rows: np.ndarray) -> OccurrenceSpectrum:
    n = len(rows)
    row_sum = rows.sum(axis=0)
    return moment_spectrum(n, row_sum, rows.T @ rows)


def _krylov_rows_spectrum(rows: np.ndarray) -> OccurrenceSpectrum:
    """Block Lanczos on C = Xc^T Xc and X^T X = C + s s^T / n: one product with the centred rows Xc
    per step serves both, and C is accurate even when the mean dominates."""
    n = len(rows)
    row_sum = rows.sum(axis=0)
    mean = row_sum / n
    centred = rows - mean

    def apply(block: np.ndarray) -> list[np.ndarray]:
        scatter_images = ((centred @ block).T @ centred).T
        return [scatter_images + np.outer(row_sum, row_sum @ block) / n, scatter_images]

    uncentred, scatter = top_eigenpairs(apply, start_block(row_sum), need_vector=[True, False])
    direction = uncentred.vector / np.linalg.norm(uncentred.vector)
    along = centred @ direction
    centred_total = float(np.einsum("ij,ij->", centred, centred))
    return _occurrence_spectrum(
        n, mean, top=uncentred.value, direction=direction, frobenius_sq=centred_total + float(row_sum @ mean),
        centred_top=scatter.value, centred_total=centred_total, centred_along=float(along @ along),
    )


def moment_spectrum(n: int, row_sum: np.ndarray, second_moment: np.ndarray) -> OccurrenceSpectrum:
    """The spectrum from X^T X (d x d) and the row sum, for words kept as moments (n > d): dense
    when d is small, else block Lanczos on X^T X and on C = X^T X - s s^T / n."""
    mean = row_sum / n
    dim = len(row_sum)
    if dim <= DENSE_LIMIT:
        top, direction = _dense_top(second_moment)
        centred_top, _ = _dense_top(second_moment - np.outer(row_sum, row_sum) / n)
    else:
        def apply(block: np.ndarray) -> list[np.ndarray]:
            images = second_moment @ block
            return [images, images - np.outer(row_sum, row_sum @ block) / n]

        uncentred, scatter = top_eigenpairs(apply, start_block(row_sum), need_vector=[True, False])
        top, direction, centred_top = uncentred.value, uncentred.vector, scatter.value
    direction = direction / np.linalg.norm(direction)
    frobenius_sq = float(np.trace(second_moment))
    return _occurrence_spectrum(
        n, mean, top=top, direction=direction, frobenius_sq=frobenius_sq, centred_top=centred_top,
        centred_total=frobenius_sq - float(row_sum @ row_sum) / n,
        centred_along=float(direction @ second_moment @ direction) - float(row_sum @ direction) ** 2 / n,
    )


def _dense_top(matrix: np.ndarray) -> tuple[float, np.ndarray]:
    k = matrix.shape[0]
    values, vectors = eigh(matrix, subset_by_index=[k - 1, k - 1])
    return float(values[0]), vectors[:, 0]
