"""Top eigenpairs of occurrence matrices without dense n x n or d x d eigenproblems.

MEV needs, per word, the top eigenvalue of X^T X (and of the scatter matrix C about the word's mean)
and the top direction v1; everything else is a sum of squares. So a word with many occurrences is
solved matrix-free: block Lanczos (`lmgeom.metrics.lanczos`) on an operator that only multiplies
blocks of vectors. The uncentred and centred problems of a word share one basis and each product: the block goes through
the word's *centred* rows once, giving C V, and X^T X V = C V + s (s^T V) / n, so both are accurate
even when the mean dominates.
Words with few occurrences are solved exactly and in batches: one stack of small Gram matrices,
one batched `eigh`.

A word's rows may be float32 (as a store holds them): they are converted a chunk at a time, never as
a whole. The Krylov steps then run in float32 (half the memory traffic, twice the GEMM speed) until
the residual reaches float32 noise, and float64 steps started from those Ritz vectors finish the
job under the float64 stopping rule; an eigenvalue's error is quadratic in the angle of its
vector, so one or two float64 steps usually suffice. Each product X^T (X V) runs over chunks of rows
that stay in cache, so a step reads the rows from memory once.

The matrix-free solver and its stopping rule are `lmgeom.metrics.lanczos`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
from scipy.linalg import lapack
from scipy.linalg.blas import dsyrk

from lmgeom.errors import InputError
from lmgeom.metrics.lanczos import BLOCK_SIZE, BlockOperator, Tolerances, start_block, top_eigenpairs

MEV_VARIANTS = ("uncentred", "centred", "svd_ratio")


def mev_variants(variants: Sequence[str]) -> tuple[str, ...]:
    """The MEV variants asked for (`variants`), checked, in `MEV_VARIANTS` order."""
    if isinstance(variants, str) or not all(isinstance(variant, str) for variant in variants):
        raise ValueError(f"variants must be a sequence of MEV variant names such as ('centred',); got {variants!r}")
    unknown = [variant for variant in variants if variant not in MEV_VARIANTS]
    if unknown or not variants:
        raise ValueError(f"variants must name at least one of {', '.join(MEV_VARIANTS)}; got {tuple(variants)!r}")
    return tuple(variant for variant in MEV_VARIANTS if variant in variants)


@dataclass(frozen=True)
class _Needed:
    """What the requested `variants` need solved: the top eigenvalue of X^T X (uncentred, svd_ratio),
    its vector v1 (svd_ratio), the top eigenvalue of C (centred), tr C (centred, svd_ratio). The
    eigenproblems asked for are X^T X (if `top`) then C (if `centred_top`), in that order."""

    variants: tuple[str, ...]
    top: bool
    direction: bool
    centred_top: bool
    spread: bool

    @classmethod
    def of(cls, variants: Sequence[str]) -> _Needed:
        variants = mev_variants(variants)
        return cls(variants, top="uncentred" in variants or "svd_ratio" in variants, direction="svd_ratio" in variants,
                   centred_top="centred" in variants, spread="centred" in variants or "svd_ratio" in variants)

    @property
    def need_vector(self) -> list[bool]:
        """`top_eigenpairs`' need_vector for the eigenproblems asked for."""
        return [self.direction] * self.top + [False] * self.centred_top


_EVERY_VARIANT = _Needed.of(MEV_VARIANTS)

# Centred variance this small relative to the raw second moment means the occurrences are one
# vector repeated (to float64 precision): there is no spread for a centred MEV to explain.
_NO_SPREAD_RELATIVE = 1e-10

# Route costs, in flops of a one-thread float64 GEMM, the constants fitted to timings of single real
# MiniLM words and synthetic words at d = 768 and 1,536 on one x86-64 core (docs/performance.md, "MEV
# routes"): they only choose the cheaper route, so an error in them costs time, not accuracy (every
# route meets the same tolerances). A dense route forms the n x n Gram matrix (n <= d, a
# batched product: 2 n^2 d flops) or the d x d scatter matrix (n > d, a rank-k update: n d^2 flops)
# and reduces it to tridiagonal form once (LAPACK sytrd on m = min(n, d): 4/3 m^3 flops at about a
# third of GEMM speed, half of them matrix-vector work).
# Block Lanczos costs its products (4 n d flops each, about KRYLOV_PRODUCTS of them on real
# layers: float32 steps, then one or two float64 steps) plus per-step work on d-long basis vectors
# (orthogonalisation, Ritz vectors, residuals), about KRYLOV_BASIS_COST d flops a solve.
TRIDIAGONAL_COST = 4.0
KRYLOV_PRODUCTS = 64
KRYLOV_BASIS_COST = 400_000
# a batch of Gram matrices this small or smaller goes through one batched numpy `eigh` (all pairs):
# below it a call per word costs more than the eigenproblems themselves
BATCHED_EIGH_LIMIT = 13

# rows are multiplied in chunks of about this many bytes (as stored), so that a chunk read for X V
# is still in cache for X^T (X V)
CHUNK_BYTES = 2**20
# a float32 product's error in units of tr C: the rows are centred before the float32 product (the
# rank-one mean part is added in float64), so its rounding scales with the spread, not with ||X||_F^2.
# float32 steps stop at this residual
FLOAT32_NOISE = float(np.finfo(np.float32).eps)
# float32 steps also stop when, below a relative residual of FLOAT32_STALL_BELOW, a step shrinks
# the residual by less than FLOAT32_STALL
FLOAT32_STALL = 0.5
FLOAT32_STALL_BELOW = 1e-3

# closed forms that cancel to 1 / _CANCELLATION_LIMIT of their terms keep ~1e-10 relative accuracy
_CANCELLATION_LIMIT = 1e6

@dataclass(frozen=True)
class OccurrenceSpectrum:
    """What MEV and the static embedding need from an occurrence matrix X (n non-zero rows x d).

    `direction` is v1, the top right singular vector of the *uncentred* X, with its sign chosen so
    that v1 . mean >= 0: the static embedding. With C = the scatter matrix of X about its mean:
      uncentred MEV = sigma_1^2 / ||X||_F^2             (the paper's printed formula)
      centred MEV   = top eigenvalue of C / trace(C)    (PCA; a later version of the original code)
      svd_ratio MEV = v1' C v1 / trace(C)               (= var(X v1) / sum_j var(X[:, j]): TruncatedSVD's
                                                         explained_variance_ratio_[0], in the released code)
    A spectrum solved for some `variants` only holds NaN where none of them needs a field: the
    uncentred variant alone skips v1 and C's eigenproblem, the centred one alone X^T X's and v1,
    svd_ratio alone C's eigenproblem (`n`, `frobenius_sq` and `mean` are always there).
    """

    n: int
    top_eigenvalue: float
    frobenius_sq: float
    centred_top_eigenvalue: float
    centred_total: float
    centred_along_direction: float
    direction: np.ndarray
    mean: np.ndarray
    variants: tuple[str, ...] = MEV_VARIANTS

    def mev(self, variant: str) -> float:
        if variant not in MEV_VARIANTS:
            raise InputError(f"unknown MEV variant {variant!r}; choose one of {', '.join(MEV_VARIANTS)}")
        if variant not in self.variants:
            raise InputError(f"this spectrum was solved for the MEV variants {', '.join(self.variants)} only; "
                             f"include {variant!r} in the variants asked for", param="variants")
        if variant == "uncentred":
            return self.top_eigenvalue / self.frobenius_sq
        if self.centred_total <= _NO_SPREAD_RELATIVE * self.frobenius_sq:
            return float("nan")
        if variant == "centred":
            return self.centred_top_eigenvalue / self.centred_total
        return self.centred_along_direction / self.centred_total


def _occurrence_spectrum(n: int, mean: np.ndarray, *, top: float, direction: np.ndarray | None, frobenius_sq: float,
                         centred_top: float, centred_total: float, centred_along: float,
                         variants: tuple[str, ...]) -> OccurrenceSpectrum:
    """The spectrum of the fields given (NaN, or a `direction` of None: not solved for `variants`)."""
    if direction is None:
        direction = np.full(len(mean), np.nan)
    else:
        direction = direction / np.linalg.norm(direction)
        if mean @ direction < 0:
            direction = -direction
    return OccurrenceSpectrum(
        n=n, top_eigenvalue=top, frobenius_sq=frobenius_sq, centred_top_eigenvalue=_nonnegative(centred_top),
        centred_total=_nonnegative(centred_total), centred_along_direction=_nonnegative(centred_along),
        direction=direction, mean=mean, variants=variants,
    )


def _nonnegative(value: float) -> float:
    """`value` with negative rounding cut to 0 (NaN, a field not solved, stays NaN)."""
    return value if np.isnan(value) else max(value, 0.0)


WordRows = np.ndarray | Sequence[np.ndarray]


def rows_spectra(words_rows: Sequence[WordRows], *, variants: Sequence[str] = MEV_VARIANTS) -> list[OccurrenceSpectrum]:
    """The spectrum of each word's occurrence matrix (non-zero float32 or float64 rows, as one array
    or a list of blocks), in order, each by the route `word_route` finds cheapest: words of few rows
    through their Gram matrices in batches, words of many rows (at small d) through their scatter
    matrix, the others matrix-free. Only what the MEV `variants` need is solved (`OccurrenceSpectrum`)."""
    needed = _Needed.of(variants)
    words_blocks = [[rows] if isinstance(rows, np.ndarray) else list(rows) for rows in words_rows]
    counts = [sum(len(block) for block in blocks) for blocks in words_blocks]
    dims = [blocks[0].shape[1] for blocks in words_blocks]
    routes = [word_route(n, dim) for n, dim in zip(counts, dims)]
    spectra: list[OccurrenceSpectrum | None] = [None] * len(words_blocks)
    gram = [i for i, route in enumerate(routes) if route == "gram"]
    for indexes in _dense_batches(counts, dims, gram):
        for i, spectrum in zip(indexes, _gram_spectra([words_blocks[i] for i in indexes], needed)):
            spectra[i] = spectrum
    for i, blocks in enumerate(words_blocks):
        if spectra[i] is None:
            rows = _ChunkedRows(blocks)
            if routes[i] == "krylov":
                spectra[i] = _krylov_rows_spectrum(rows, budget=krylov_budget(counts[i], dims[i]), needed=needed)
            if spectra[i] is None:  # the scatter route, or a flat spectrum that overran its Krylov budget
                spectra[i] = rows.scatter_spectrum(needed) if counts[i] > dims[i] else _gram_spectra([blocks], needed)[0]
    return [spectrum for spectrum in spectra if spectrum is not None]


def _route_costs(n: int, dim: int, formed: bool) -> tuple[float, float]:
    """(cost of the dense route, cost of one block Lanczos product with its share of the per-step
    work) under the cost model above."""
    size = min(n, dim)
    dense = TRIDIAGONAL_COST * size**3 + (0 if formed else 2 * n * n * dim if n <= dim else n * dim * dim)
    return dense, (2 * dim * dim if formed else 4 * n * dim) + KRYLOV_BASIS_COST * dim / KRYLOV_PRODUCTS


def word_route(n: int, dim: int, *, formed: bool = False) -> str:
    """The cheapest exact route for a word of n rows in `dim` dimensions under the cost model above:
    "gram" (n x n Gram matrix, n <= dim), "scatter" (dim x dim scatter matrix, n > dim) or "krylov"
    (block Lanczos on the rows, at a typical product count). `formed`: the word is held as X^T X
    already (its cost is sunk, and a Krylov product with it costs 2 dim^2 flops)."""
    dense, product = _route_costs(n, dim, formed)
    if dense > KRYLOV_PRODUCTS * product:
        return "krylov"
    return "gram" if n <= dim else "scatter"


def krylov_budget(n: int, dim: int, *, formed: bool = False) -> int:
    """The products block Lanczos may spend on a word before its dense route would have been cheaper.
    A flat spectrum (small relative gaps) needs hundreds where a real layer's words need about
    KRYLOV_PRODUCTS; past the budget the word goes the dense way, so no word costs much more than twice
    its cheaper route."""
    dense, product = _route_costs(n, dim, formed)
    return max(KRYLOV_PRODUCTS, int(dense / product))


class _ChunkedRows:
    """A word's rows (float32 or float64 blocks), read a chunk at a time: a chunk is converted to the
    compute precision and centred in cache, so no full-size converted or centred copy exists.
    The constructor reads them once for the row sum and ||X||_F^2 (float64)."""

    def __init__(self, blocks: Sequence[np.ndarray]) -> None:
        self.blocks = [block for block in blocks if len(block)]
        self.n = sum(len(block) for block in self.blocks)
        self.dim = self.blocks[0].shape[1]
        self.float32 = all(block.dtype == np.float32 for block in self.blocks)
        self.chunk_rows = max(8, CHUNK_BYTES // (self.blocks[0].itemsize * self.dim))
        self.row_sum = np.zeros(self.dim)
        self.frobenius_sq = 0.0
        for chunk in self.chunks():
            chunk64 = chunk.astype(np.float64, copy=False)
            self.row_sum += chunk64.sum(axis=0)
            self.frobenius_sq += float(np.einsum("ij,ij->", chunk64, chunk64))
        self.mean = self.row_sum / self.n
        # tr C, to within rounding of ||X||_F^2 (enough to scale the noise of float32 products)
        self.spread_estimate = max(self.frobenius_sq - float(self.row_sum @ self.mean), 0.0)

    def chunks(self) -> Iterator[np.ndarray]:
        for block in self.blocks:
            for start in range(0, len(block), self.chunk_rows):
                yield block[start:start + self.chunk_rows]

    def scatter_images(self, block: np.ndarray, dtype: type[np.floating]) -> np.ndarray:
        """C V (C the scatter matrix about the mean), computed in `dtype` and returned as float64.
        Each chunk is centred into a reused buffer (fresh large arrays cost page faults)."""
        mean, vectors = self.mean.astype(dtype), block.astype(dtype)
        centred = np.empty((self.chunk_rows, self.dim), dtype=dtype)
        projections = np.empty((self.chunk_rows, block.shape[1]), dtype=dtype)
        chunk_images = np.empty((self.dim, block.shape[1]), dtype=dtype)
        images = np.zeros((self.dim, block.shape[1]), dtype=dtype)
        for chunk in self.chunks():
            rows = len(chunk)
            np.subtract(chunk, mean, out=centred[:rows])
            np.matmul(centred[:rows], vectors, out=projections[:rows])
            np.matmul(centred[:rows].T, projections[:rows], out=chunk_images)
            images += chunk_images
        return images.astype(np.float64, copy=False)

    def spread(self, direction: np.ndarray | None) -> tuple[float, float]:
        """(tr C, v' C v) from explicitly centred float64 rows (accurate when the mean dominates);
        v' C v is NaN without a `direction`."""
        total, along = 0.0, 0.0
        for chunk in self.chunks():
            centred = chunk - self.mean
            total += float(np.einsum("ij,ij->", centred, centred))
            if direction is not None:
                projections = centred @ direction
                along += float(projections @ projections)
        return total, along if direction is not None else float("nan")

    def scatter_spectrum(self, needed: _Needed) -> OccurrenceSpectrum:
        """The spectrum from the scatter matrix C of the explicitly centred rows (accurate when the
        mean dominates; X^T X = C + n m m^T adds a positive rank one, no cancellation)."""
        upper = np.zeros((self.dim, self.dim), order="F")
        for chunk in self.chunks():
            centred = chunk - self.mean
            # a rank-k update of the upper triangle, in place: half the flops of a full product
            upper = dsyrk(1.0, centred.T, beta=1.0, c=upper, overwrite_c=1)
        scatter = np.triu(upper) + np.triu(upper, 1).T
        top, centred_top, direction = _scatter_tops(self.n, self.mean, scatter, needed)
        return _occurrence_spectrum(
            self.n, self.mean, top=top, direction=direction, frobenius_sq=self.frobenius_sq, centred_top=centred_top,
            centred_total=float(np.trace(scatter)) if needed.spread else np.nan,
            centred_along=float(direction @ scatter @ direction) if direction is not None else np.nan, variants=needed.variants,
        )


# a batch of padded occurrence matrices stays under this many float64 entries (4 MB), so that its
# passes run in cache
_BATCH_ENTRIES = 2**19


def _dense_batches(counts: Sequence[int], dims: Sequence[int], indexes: list[int]) -> Iterator[list[int]]:
    """Indexes of words of similar row counts (consecutive in count order, padded to the batch's
    largest), in batches of bounded size."""
    members = sorted(indexes, key=lambda i: counts[i])
    start = 0
    while start < len(members):
        stop = start + 1
        dim = dims[members[start]]
        while stop < len(members) and (stop + 1 - start) * (counts[members[stop]] + 1) * dim <= _BATCH_ENTRIES:
            stop += 1
        yield members[start:stop]
        start = stop


def _gram_spectra(words_blocks: Sequence[Sequence[np.ndarray]], needed: _Needed) -> list[OccurrenceSpectrum]:
    """Spectra of words of similar row counts from their n x n Gram matrices.

    Each word's rows are centred explicitly (accurate when the mean dominates), zero-padded to a
    common count (a padded row adds a zero eigenvalue and nothing else) and followed by the mean m:
    one batched product A A^T of A = [Xc; m] gives the centred Gram matrix, Xc m and |m|^2, tr C and
    ||X||_F^2. Bordered by sqrt(n) Xc m and n |m|^2 the centred Gram matrix becomes B B^T, B = [sqrt(n)
    m; Xc], whose non-zero eigenvalues are those of X^T X = Xc^T Xc + n m m^T: small batches take
    one batched `eigh` of B B^T and `eigvalsh` of the centred Gram matrices, larger words one
    tridiagonal reduction of their own B B^T for both tops (`_bordered_tops`). The direction
    v1 = B^T y is one more product, and Xc v1 = (A A^T y)[:n] needs none. Without svd_ratio among the
    `needed` variants there is no direction (no eigenvectors, no product), and each top not asked
    for is skipped."""
    word_counts = [sum(len(block) for block in blocks) for blocks in words_blocks]
    size = max(word_counts)
    dim = words_blocks[0][0].shape[1]
    counts = np.array(word_counts, dtype=np.float64)
    stacked = np.zeros((len(words_blocks), size + 1, dim))
    for i, (blocks, n) in enumerate(zip(words_blocks, word_counts)):
        # the word's blocks go straight into its padded slot: no concatenated copy of its rows
        np.concatenate(blocks, axis=0, out=stacked[i, :n])
    # means and centring for the whole batch at once (padded rows are zero and stay zero)
    stacked[:, size] = stacked[:, :size].sum(axis=1) / counts[:, None]
    np.subtract(stacked[:, :size], stacked[:, size:], out=stacked[:, :size], where=(np.arange(size) < counts[:, None])[:, :, None])
    augmented_gram = stacked @ stacked.transpose(0, 2, 1)
    centred_gram = augmented_gram[:, :size, :size]
    along_mean = augmented_gram[:, :size, size]
    mean_sq = augmented_gram[:, size, size]
    # B = [sqrt(n) m; Xc] has B^T B = X^T X, and B B^T holds the centred Gram matrix as its trailing block
    roots = np.sqrt(counts)
    bordered = np.empty((len(words_blocks), size + 1, size + 1))
    bordered[:, 1:, 1:] = centred_gram
    bordered[:, 0, 1:] = bordered[:, 1:, 0] = roots[:, None] * along_mean
    bordered[:, 0, 0] = counts * mean_sq
    tops, centred_tops = np.full(len(counts), np.nan), np.full(len(counts), np.nan)
    top_vectors = np.zeros((len(counts), size + 1))
    if size + 1 <= BATCHED_EIGH_LIMIT:
        if needed.direction:
            values, vectors = np.linalg.eigh(bordered)
            tops, top_vectors = values[:, -1], vectors[:, :, -1]
        elif needed.top:
            tops = np.linalg.eigvalsh(bordered)[:, -1]
        if needed.centred_top:
            centred_tops = np.linalg.eigvalsh(centred_gram)[:, -1]
    else:  # one tridiagonal reduction per word, on its own (unpadded) rows
        for i, n in enumerate(word_counts):
            tops[i], centred_tops[i], vector = _bordered_tops(bordered[i, : n + 1, : n + 1], needed)
            if vector is not None:
                top_vectors[i, : n + 1] = vector
    centred_totals = np.einsum("wkk->w", centred_gram)
    means = stacked[:, size].copy()
    centred_alongs = np.full(len(counts), np.nan)
    directions = np.full((len(counts), dim), np.nan)
    if needed.direction:
        # v1 = B^T y = Xc^T y[1:] + sqrt(n) y[0] m, normalised
        coefficients = np.concatenate([top_vectors[:, 1:], (roots * top_vectors[:, 0])[:, None]], axis=1)
        directions = (coefficients[:, None, :] @ stacked)[:, 0]
        norms = np.linalg.norm(directions, axis=1)
        directions /= norms[:, None]
        coefficients /= norms[:, None]
        along = (augmented_gram @ coefficients[:, :, None])[:, :size, 0]  # Xc v1
        centred_alongs = np.einsum("wj,wj->w", along, along)
        # what `_occurrence_spectrum` does word by word (v1 . mean >= 0, no negative rounding), for the
        # whole batch: with thousands of words of a few rows each, per-word numpy calls cost more than the rest
        directions *= np.where(np.einsum("wd,wd->w", means, directions) < 0, -1.0, 1.0)[:, None]
    fields = zip(word_counts, tops.tolist(), (centred_totals + counts * mean_sq).tolist(),
                 np.maximum(centred_tops, 0.0).tolist(),
                 (np.maximum(centred_totals, 0.0) if needed.spread else np.full(len(counts), np.nan)).tolist(),
                 centred_alongs.tolist(), directions, means)
    return [OccurrenceSpectrum(n=n, top_eigenvalue=top, frobenius_sq=frobenius_sq, centred_top_eigenvalue=centred_top,
                               centred_total=centred_total, centred_along_direction=centred_along, direction=direction, mean=mean,
                               variants=needed.variants)
            for n, top, frobenius_sq, centred_top, centred_total, centred_along, direction, mean in fields]


def _krylov_rows_spectrum(rows: _ChunkedRows, *, budget: int | None,
                          needed: _Needed = _EVERY_VARIANT) -> OccurrenceSpectrum | None:
    """Block Lanczos on C = Xc^T Xc and X^T X = C + s s^T / n, each if `needed`: one product with the
    centred rows Xc per step serves both, and C is accurate even when the mean dominates. float32 rows
    get float32 steps first, down to float32 noise, then float64 steps from the leading Ritz vectors.
    None when both phases together need more than `budget` products."""
    n, row_sum = rows.n, rows.row_sum

    def operators(dtype: type[np.floating]) -> BlockOperator:
        def apply(block: np.ndarray) -> list[np.ndarray]:
            scatter_images = rows.scatter_images(block, dtype)
            uncentred = [scatter_images + np.outer(row_sum, row_sum @ block) / n] if needed.top else []
            return uncentred + ([scatter_images] if needed.centred_top else [])
        return apply

    start = start_block(row_sum)
    if rows.float32:
        rough = top_eigenpairs(operators(np.float32), start, need_vector=[True] * len(needed.need_vector), budget=budget,
                               tolerances=Tolerances(noise=FLOAT32_NOISE * rows.spread_estimate, warn=False,
                                                     stall_ratio=FLOAT32_STALL, stall_below=FLOAT32_STALL_BELOW))
        if rough is None:
            return None
        start = np.concatenate([pair.leading[:, : BLOCK_SIZE // len(rough)] for pair in rough], axis=1)
        if budget is not None:
            budget -= max(pair.multiplications for pair in rough)
    refined = top_eigenpairs(operators(np.float64), start, need_vector=needed.need_vector, budget=budget)
    if refined is None:
        return None
    uncentred = refined[0] if needed.top else None
    top = uncentred.value if uncentred is not None else np.nan
    centred_top = refined[-1].value if needed.centred_top else np.nan
    direction = uncentred.vector / np.linalg.norm(uncentred.vector) if uncentred is not None and needed.direction else None
    centred_total, along = np.nan, np.nan
    if needed.spread:
        # tr C = ||X||_F^2 - |s|^2 / n and v' C v = v' X^T X v - (s . v)^2 / n (the first term is the Rayleigh
        # quotient, the top value) lose digits to cancellation when the mean dominates: within
        # _CANCELLATION_LIMIT they stay exact to ~1e-10, beyond it a float64 pass over the centred rows
        centred_total = rows.spread_estimate
        if direction is not None:
            along = top - float(row_sum @ direction) ** 2 / n
        if rows.frobenius_sq > _CANCELLATION_LIMIT * centred_total or (direction is not None and top > _CANCELLATION_LIMIT * along):
            centred_total, along = rows.spread(direction)
    return _occurrence_spectrum(
        n, rows.mean, top=top, direction=direction, frobenius_sq=rows.frobenius_sq,
        centred_top=centred_top, centred_total=centred_total, centred_along=along, variants=needed.variants,
    )


def moment_spectrum(n: int, row_sum: np.ndarray, second_moment: np.ndarray, *,
                    variants: Sequence[str] = MEV_VARIANTS) -> OccurrenceSpectrum:
    """The spectrum from X^T X (d x d) and the row sum, for words kept as moments (n > d), the way
    the cost model finds cheaper: one tridiagonal reduction of C = X^T X - s s^T / n, or block
    Lanczos on X^T X and C (the dense route after all if the spectrum is too flat for its budget).
    Only what the MEV `variants` need is solved (`OccurrenceSpectrum`)."""
    needed = _Needed.of(variants)
    mean = row_sum / n
    dim = len(row_sum)
    pairs = None
    if word_route(n, dim, formed=True) == "krylov":
        def apply(block: np.ndarray) -> list[np.ndarray]:
            images = second_moment @ block
            centred = [images - np.outer(row_sum, row_sum @ block) / n] if needed.centred_top else []
            return ([images] if needed.top else []) + centred

        pairs = top_eigenpairs(apply, start_block(row_sum), need_vector=needed.need_vector, budget=krylov_budget(n, dim, formed=True))
    direction: np.ndarray | None
    if pairs is None:  # the dense route, chosen, or cheaper after all for a spectrum too flat for the budget
        top, centred_top, direction = _scatter_tops(n, mean, second_moment - np.outer(row_sum, row_sum) / n, needed)
    else:
        top, centred_top = pairs[0].value if needed.top else np.nan, pairs[-1].value if needed.centred_top else np.nan
        direction = pairs[0].vector if needed.direction else None
    if direction is not None:
        direction = direction / np.linalg.norm(direction)
    frobenius_sq = float(np.trace(second_moment))
    return _occurrence_spectrum(
        n, mean, top=top, direction=direction, frobenius_sq=frobenius_sq, centred_top=centred_top,
        centred_total=frobenius_sq - float(row_sum @ row_sum) / n if needed.spread else np.nan,
        centred_along=(float(direction @ second_moment @ direction) - float(row_sum @ direction) ** 2 / n
                       if direction is not None else np.nan),
        variants=needed.variants,
    )


# ---------------------------------------------------------------------------------------------
# dense routes: X^T X and C share one tridiagonal reduction. Householder tridiagonalisation (LAPACK
# sytrd, lower) keeps the first basis vector, so a matrix whose first row and column carry the
# rank-one mean part reduces to a tridiagonal T whose trailing block is the reduction of the rest:
# the top eigenvalue of T and of T[1:, 1:] are the two tops, and one vector back-transform (ormqr)
# gives v1. Costs 4/3 m^3 flops instead of two eigenproblems (and all eigenvectors, as `eigh` gives).


def _tridiagonal(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(reflectors, tau, diagonal, off-diagonal) of the lower Householder reduction of a symmetric matrix."""
    # the wrapper's default workspace (n) forces LAPACK's unblocked reduction, 1.5x slower from n ~ 300
    work, info = lapack.dsytrd_lwork(len(matrix), lower=1)
    reflectors, diagonal, off_diagonal, tau, info = lapack.dsytrd(np.asfortranarray(matrix), lower=1, lwork=int(work),
                                                                  overwrite_a=1)
    if info != 0:
        raise np.linalg.LinAlgError(f"LAPACK dsytrd failed (info {info})")
    return reflectors, tau, diagonal, off_diagonal


def _tridiagonal_top(diagonal: np.ndarray, off_diagonal: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """The top eigenvalue of a symmetric tridiagonal matrix (bisection, to working accuracy), and the
    block structure inverse iteration needs for its vector."""
    k = len(diagonal)
    if k == 1:  # the wrapper rejects an empty off-diagonal
        return float(diagonal[0]), np.ones(1, dtype=np.int32), np.ones(1, dtype=np.int32)
    _, values, blocks, splits, info = lapack.dstebz(diagonal, off_diagonal, 2, 0.0, 0.0, k, k, 0.0, b"B")
    if info != 0:
        raise np.linalg.LinAlgError(f"LAPACK dstebz failed (info {info})")
    return float(values[0]), blocks, splits


def _top_pair(reflectors: np.ndarray, tau: np.ndarray, diagonal: np.ndarray,
              off_diagonal: np.ndarray) -> tuple[float, np.ndarray]:
    """The top eigenpair of the matrix that `_tridiagonal` reduced to (diagonal, off_diagonal)."""
    top, blocks, splits = _tridiagonal_top(diagonal, off_diagonal)
    if len(diagonal) == 1:
        return top, np.ones(1)
    vectors, info = lapack.dstein(diagonal, off_diagonal, np.array([top]), blocks, splits)
    if info != 0:
        raise np.linalg.LinAlgError(f"LAPACK dstein failed (info {info})")
    vector = vectors[:, 0]
    # Q = diag(1, Q'), Q' in the QR storage of the reflectors below the diagonal
    rest, _, info = lapack.dormqr(b"L", b"N", reflectors[1:, :-1], tau, vector[1:, None], len(vector), overwrite_c=1)
    if info != 0:
        raise np.linalg.LinAlgError(f"LAPACK dormqr failed (info {info})")
    return top, np.concatenate([vector[:1], rest[:, 0]])


def _bordered_tops(bordered: np.ndarray, needed: _Needed) -> tuple[float, float, np.ndarray | None]:
    """(top eigenvalue, top eigenvalue of the trailing block bordered[1:, 1:], top unit eigenvector)
    of a symmetric PSD matrix, from one reduction; each NaN (None) unless `needed` (top, centred_top,
    direction)."""
    reflectors, tau, diagonal, off_diagonal = _tridiagonal(bordered)
    top, vector = np.nan, None
    if needed.direction:
        top, vector = _top_pair(reflectors, tau, diagonal, off_diagonal)
    elif needed.top:
        top = _tridiagonal_top(diagonal, off_diagonal)[0]
    trailing = np.nan
    if needed.centred_top:
        trailing = _tridiagonal_top(diagonal[1:], off_diagonal[1:])[0] if len(diagonal) > 1 else 0.0
    return top, trailing, vector


def _scatter_tops(n: int, mean: np.ndarray, scatter: np.ndarray, needed: _Needed) -> tuple[float, float, np.ndarray | None]:
    """(top of X^T X = C + n m m^T, top of C, unit v1) from the scatter matrix C, one reduction: a
    reflector H with H m = -+|m| e1 puts the rank one in the first row and column, H X^T X H =
    H C H + n |m|^2 e1 e1^T, and the reduction of H C H keeps e1, so its tridiagonal form T gives C's
    top and T + n |m|^2 e1 e1^T (still tridiagonal) X^T X's. Each NaN (None) unless `needed`."""
    householder = mean.astype(np.float64, copy=True)
    norm = float(np.linalg.norm(householder))
    householder[0] += np.copysign(norm, householder[0])
    scale = float(householder @ householder)
    if scale > 0:
        # H C H = C - u w^T - w u^T with u the reflector, p = (2/u'u) C u, w = p - (u'p / u'u) u
        image = scatter @ householder * (2 / scale)
        image -= (householder @ image / scale) * householder
        scatter = scatter - np.outer(householder, image) - np.outer(image, householder)
    reflectors, tau, diagonal, off_diagonal = _tridiagonal(scatter)
    centred_top = _tridiagonal_top(diagonal, off_diagonal)[0] if needed.centred_top else np.nan
    diagonal[0] += n * norm**2
    if not needed.direction:
        return _tridiagonal_top(diagonal, off_diagonal)[0] if needed.top else np.nan, centred_top, None
    top, vector = _top_pair(reflectors, tau, diagonal, off_diagonal)
    if scale > 0:
        vector -= (2 * float(householder @ vector) / scale) * householder
    return top, centred_top, vector / np.linalg.norm(vector)
