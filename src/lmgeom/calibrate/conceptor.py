"""Conceptor negation (Liu, Ungar & Sedoc 2019, "Unsupervised post-processing of word vectors via
conceptor negation").

The conceptor of the points is C = R (R + alpha^-2 I)^-1 with R = X^T X / n, the (uncentred)
correlation matrix; the post-processed vector is (I - C) x. With R = U diag(s) U^T,
I - C = U diag(1 / (1 + alpha^2 s)) U^T: every principal direction of R is kept and shrunk by
1 / (1 + alpha^2 s), so high-variance directions are damped softly instead of removed as in
all-but-the-top. R comes from the float64 `MomentAccumulator` (R = (scatter + n mu mu^T) / n),
so the calibrator streams like the other moment calibrators.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from lmgeom.errors import InputError
from lmgeom.calibrate._base import register
from lmgeom.calibrate.linear import MomentCalibrator
from lmgeom.metrics.isotropy import Moments, symmetric_eigh

# Liu et al. post-process every word-vector set with aperture alpha = 2.
DEFAULT_APERTURE = 2.0


@register
class ConceptorNegation(MomentCalibrator):
    """x -> (I - C) x with the conceptor C = R (R + alpha^-2 I)^-1 of the uncentred correlation R.

    The points are not centred, as in the paper: R = X^T X / n.

    Parameters
    ----------
    alpha : float, default 2.0
        The aperture (`DEFAULT_APERTURE`, Liu et al.'s); larger alpha damps more (alpha -> 0 gives
        the identity). `fit` refuses one that is not a finite number > 0 (`InputError`).

    Attributes
    ----------
    correlation_eigenvalues_ : ndarray of shape (n_features_in_,)
        The eigenvalues s of R, descending.
    components_ : ndarray of shape (n_features_in_, n_features_in_)
        The eigenvectors of R, in rows.
    negation_matrix_ : ndarray of shape (n_features_in_, n_features_in_)
        I - C, symmetric.
    n_samples_seen_ : int
        Rows the fit has seen.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Names of features seen during fit; defined only when `X` has feature names that are all
        strings.
    """

    collapses_on_few_rows: ClassVar[bool] = True

    def __init__(self, alpha: float = DEFAULT_APERTURE) -> None:
        self.alpha = alpha

    def _fit_moments(self, moments: Moments) -> None:
        if not (isinstance(self.alpha, (int, float)) and np.isfinite(self.alpha) and self.alpha > 0):
            raise InputError(f"ConceptorNegation alpha (the aperture) must be a finite number > 0, got {self.alpha!r}")
        correlation = (moments.scatter + moments.count * np.outer(moments.mean, moments.mean)) / moments.count
        eigenvalues, vectors = symmetric_eigh(correlation)
        self.correlation_eigenvalues_ = eigenvalues
        self.components_ = vectors.T.copy()
        self.negation_matrix_ = (vectors * self._shrinkage()) @ vectors.T
        self.n_samples_seen_ = moments.count

    def _shrinkage(self) -> np.ndarray:
        """Eigenvalues of I - C: 1 / (1 + alpha^2 s), in (0, 1]."""
        return 1.0 / (1.0 + float(self.alpha) ** 2 * self.correlation_eigenvalues_)

    def transform(self, X: Any) -> Any:
        X, restore = self._checked_input(X)
        return restore(self._map_rows(X, lambda block: block @ self.negation_matrix_, X.shape[1]))

    def inverse_transform(self, X: Any) -> Any:
        """(I - C)^-1 z = U diag(1 + alpha^2 s) U^T z: I - C has no zero eigenvalue, so nothing is lost."""
        Z, restore = self._checked_input(X, inverse=True)
        inverse = (self.components_.T / self._shrinkage()) @ self.components_
        return restore(self._map_rows(Z, lambda block: block @ inverse, Z.shape[1]))
