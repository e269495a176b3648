"""Block Lanczos for the top eigenpair of a symmetric positive semi-definite operator given only as
a product with blocks of vectors: Rayleigh-Ritz on a growing Krylov basis, full
reorthogonalisation, thick restart. Several operators may share one basis and each product
(`top_eigenpairs` takes `apply`, which returns one image block per operator).

Stopping rule, per problem: a Ritz pair (theta, x) with residual r = A x - theta x has an eigenvalue
within min(|r|, |r|^2 / gap) of theta (Kato-Temple; gap = theta - next Ritz value estimates the
distance to the rest of the spectrum), and its angle to the top eigenvector is at most |r| / gap
(Davis-Kahan). Values stop at `VALUE_RTOL`; directions at `DIRECTION_TOL`, or where the residual
reaches float64 rounding (a near-degenerate top: the value is exact, the direction is one unit
vector of the top eigenspace, as with dense `eigh`). `Tolerances` loosens the rule for a rough
first solve (float32 products: `lmgeom.metrics.spectrum`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

# relative error bound at which an eigenvalue stops (MEV values are checked to 1e-9 against eigh)
VALUE_RTOL = 1e-11
# angle bound at which a direction stops (static vectors and svd_ratio are checked to 1e-6)
DIRECTION_TOL = 1e-7
# a residual this small relative to the eigenvalue is float64 rounding: nothing left to gain
RESIDUAL_FLOOR = 1e-13
# Krylov block width and the basis size that triggers a thick restart (half of it is kept)
BLOCK_SIZE = 8
MAX_BASIS = 160
# With a budget, block Lanczos gives up early (and the word goes the dense way) once, after at least
# PROJECTION_MIN_STEPS block steps, the residual's rate over the last two steps projects past the
# budget: a flat spectrum then stops paying for products it would only throw away. Lanczos
# accelerates, so the projection errs long: fewer steps would send words that would converge to
# the dense route, more would spend products on flat spectra. With 3, words of real MiniLM layers
# solved on their rows converge as before (a few held as X^T X give up, where the dense route is
# one d x d reduction), most words of a flat synthetic layer give up after 3 steps, and a flat
# 3,000 x 4,096 word still converges matrix-free within its budget (docs/performance.md).
PROJECTION_MIN_STEPS = 3
# a safety stop far beyond what flat (Gaussian) spectra need at d = 4,096 (about 450); reaching it warns
MAX_MULTIPLICATIONS = 5000

BlockOperator = Callable[[np.ndarray], list[np.ndarray]]


@dataclass(frozen=True)
class Tolerances:
    """When a Ritz pair stops: its eigenvalue error bound is at most `value_rtol` times the value and
    (if a direction is wanted) its angle bound at most `direction_tol`; or its residual is at most
    `residual_floor` times the value or `noise` (the operator's own rounding): nothing left to gain;
    or, once the residual is below `stall_below` times the value, a step shrinks it by less than
    `stall_ratio` (a rough solve handing over to a finer one: rounding has set in, or convergence is slow). `warn`: warn when `MAX_MULTIPLICATIONS` stops a
    pair short of that."""

    value_rtol: float = VALUE_RTOL
    direction_tol: float = DIRECTION_TOL
    residual_floor: float = RESIDUAL_FLOOR
    noise: float = 0.0
    warn: bool = True
    stall_ratio: float = 0.0
    stall_below: float = 0.0


@dataclass(frozen=True)
class TopEigenpair:
    """The top eigenvalue of a symmetric positive semi-definite operator and a unit eigenvector.

    `residual` is |A v - value v| and `gap` the distance to the next Ritz value, so the value is
    within min(residual, residual^2 / gap) of the top eigenvalue and v within an angle of about
    residual / gap of the top eigenvector. `leading` holds the leading Ritz vectors (the first is
    `vector`): a start for a more accurate solve."""

    value: float
    vector: np.ndarray
    residual: float
    gap: float
    multiplications: int
    leading: np.ndarray


class _RitzProblem:
    """One operator's images of the shared basis, its projection on the basis, and its Ritz pairs."""

    def __init__(self, dim: int, *, need_vector: bool, tolerances: Tolerances) -> None:
        self.need_vector = need_vector
        self.tolerances = tolerances
        self.images = np.zeros((dim, 0))
        self.projected = np.zeros((0, 0))
        self.solution: TopEigenpair | None = None
        self.values = np.zeros(0)
        self.coefficients = np.zeros((0, 0))
        self.residual_history: list[float] = []  # of the top pair, one a block step
        self.steps_left = 0.0  # block steps to convergence at the recent rate (0 while unknown)

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
        # numpy's eigh: the same LAPACK accuracy with a fifth of scipy's per-call overhead on these small matrices
        values, coefficients = np.linalg.eigh(projected)
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
        tolerances = self.tolerances
        floor = residual <= max(tolerances.residual_floor * top, tolerances.noise)
        vector_done = not self.need_vector or (gap > 0 and residual <= tolerances.direction_tol * gap)
        last_residual = self.residual_history[-1] if self.residual_history else np.inf
        stalled = tolerances.stall_below * top >= residual > tolerances.stall_ratio * last_residual
        self.residual_history.append(residual)
        # the residual at which this pair would stop: its floor, or values (and the vector) done
        wanted_residual = min(np.sqrt(tolerances.value_rtol * top * gap) if gap > 0 else tolerances.value_rtol * top,
                              tolerances.direction_tol * gap if self.need_vector else np.inf)
        self.steps_left = _steps_left(self.residual_history, max(tolerances.residual_floor * top, tolerances.noise, wanted_residual))
        converged = (exhausted or top == 0 or floor or stalled
                     or (value_error <= tolerances.value_rtol * top and vector_done))
        if not converged and multiplications >= MAX_MULTIPLICATIONS and tolerances.warn:
            warnings.warn(f"block Lanczos stopped after {multiplications} products with a relative residual of "
                          f"{residual / top:.1e} (eigenvalue error bound {value_error / top:.1e})", RuntimeWarning, stacklevel=2)
        if converged or multiplications >= MAX_MULTIPLICATIONS:
            self.solution = TopEigenpair(top, ritz[:, 0], residual, gap, multiplications, ritz)
        return residuals

    def restart(self, kept: np.ndarray) -> None:
        self.images = self.images @ kept
        self.projected = kept.T @ self.projected @ kept
        self.projected = (self.projected + self.projected.T) / 2


def top_eigenpairs(apply: BlockOperator, start: np.ndarray, *, need_vector: Sequence[bool],
                   tolerances: Tolerances = Tolerances(), budget: int | None = None) -> list[TopEigenpair] | None:
    """Top eigenpairs of several symmetric PSD operators on one shared subspace.

    `apply(V)` returns each operator's images of the block V; the operators of a word (X^T X and
    its scatter matrix, which differ by the rank one s s^T / n) have the same Krylov spaces from a
    start containing s, so one basis, grown a block at a time from the Ritz residuals of both,
    serves both at the cost of one product. `start` (dim x k) seeds the basis; `need_vector[i]`
    asks operator i for a converged direction and not only a converged value. None when `budget`
    products are spent before every pair has converged, or when the residuals' recent rate projects
    past it (`PROJECTION_MIN_STEPS`)."""
    dim = start.shape[0]
    problems = [_RitzProblem(dim, need_vector=need, tolerances=tolerances) for need in need_vector]
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
        if budget is not None and (multiplications >= budget or multiplications + max(
                problem.steps_left for problem in active) * BLOCK_SIZE > budget):
            return None
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


def _steps_left(history: Sequence[float], target: float) -> float:
    """Block steps until the residual reaches `target` at its rate over the last two steps (geometric
    convergence; Lanczos accelerates, so this errs long); 0 with too short a history to tell, inf
    where the residual has not fallen over the last two steps."""
    if len(history) < PROJECTION_MIN_STEPS:
        return 0.0
    residual, earlier = history[-1], history[-3]
    if residual <= target:
        return 0.0
    if residual >= earlier:
        return np.inf
    return float(np.log(target / residual) / (np.log(residual / earlier) / 2))


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
