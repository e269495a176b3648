"""Calibrators that need only the mean and covariance: all-but-the-top, whitening, standardisation.

All three fit from a `MomentAccumulator` (count, mean, covariance in float64), so `partial_fit`
over chunks gives the same fit as `fit` on all rows at once, and shards accumulated separately
can be merged and passed to `fit_moments`. The accumulator is saved with the fitted calibrator,
so `partial_fit` after `load` goes on from where the saved calibrator stopped.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from sklearn.utils.validation import check_is_fitted

from lmgeom.errors import InputError
from lmgeom.calibrate._base import Calibrator, register, scalar_or_array
from lmgeom.metrics.isotropy import MomentAccumulator, Moments, symmetric_eigh


class MomentCalibrator(Calibrator):
    _fitted_marker: ClassVar[str] = "n_samples_seen_"
    full_covariance: ClassVar[bool] = True

    def fit(self, X: Any, y: Any = None) -> "MomentCalibrator":
        X, _ = self._validate(X, reset=True, min_samples=2)
        self._warn_if_few_rows(*X.shape)
        self._moments = MomentAccumulator(full_covariance=self.full_covariance).add(X)
        self._fit_moments(self._moments.result())
        return self

    def partial_fit(self, X: Any, y: Any = None) -> "MomentCalibrator":
        """Add a chunk of rows; the fit is refreshed once at least 2 rows have been seen."""
        first_call = not hasattr(self, "_moments")
        if first_call and self.__sklearn_is_fitted__():
            raise InputError(
                f"this {type(self).__name__} was loaded from a file saved without its moment state (an older "
                "lmgeom), so partial_fit cannot go on from it; fit it again on all rows"
            )
        X, _ = self._validate(X, reset=first_call)
        if first_call:
            self._moments = MomentAccumulator(full_covariance=self.full_covariance)
        self._moments.add(X)
        if self._moments.count >= 2:
            self._fit_moments(self._moments.result())
        return self

    def fit_moments(self, accumulator: MomentAccumulator) -> "MomentCalibrator":
        """Fit from rows already accumulated elsewhere (e.g. merged shards); later `partial_fit`
        calls add to a copy of `accumulator`, which itself is left unchanged."""
        if accumulator.full_covariance != self.full_covariance:
            kind = "full_covariance=True" if self.full_covariance else "full_covariance=False"
            raise InputError(f"{type(self).__name__} needs a MomentAccumulator({kind})")
        moments = accumulator.result()
        if moments.count < 2:
            raise InputError(f"{type(self).__name__} needs at least 2 rows, got n_samples = {moments.count}")
        self._warn_if_few_rows(moments.count, moments.dim)
        self.__dict__.pop("feature_names_in_", None)  # names from an earlier DataFrame fit no longer apply
        self.n_features_in_ = moments.dim
        self._moments = accumulator.copy()
        self._fit_moments(moments)
        return self

    def _fit_moments(self, moments: Moments) -> None:
        raise NotImplementedError

    # -- persistence: the fitted attributes plus the accumulator, for partial_fit after load ----

    def _fitted_state(self) -> dict[str, Any]:
        state = super()._fitted_state()
        state.update({_MOMENT_PREFIX + key: np.asarray(value) for key, value in self._moments.state_dict().items()})
        return state

    def _set_fitted_state(self, state: dict[str, Any]) -> None:
        moments = {key.removeprefix(_MOMENT_PREFIX): scalar_or_array(value) for key, value in state.items() if key.startswith(_MOMENT_PREFIX)}
        super()._set_fitted_state({key: value for key, value in state.items() if not key.startswith(_MOMENT_PREFIX)})
        if moments:
            self._moments = MomentAccumulator.from_state_dict(moments)


# Saved keys of the calibrator's MomentAccumulator state (fitted attributes end in "_", never in "__").
_MOMENT_PREFIX = "moments__"


def default_abtt_components(dim: int) -> int:
    """Mu & Viswanath's D = d/100, rounded half up, at least 1 (8 for 768 dimensions)."""
    return max(1, int(np.floor(dim / 100 + 0.5)))


@register
class AllButTheTop(MomentCalibrator):
    """Remove the mean and the top-D principal directions (Mu & Viswanath 2018).

    Parameters
    ----------
    n_components : int or None, default None
        D, the principal directions removed; None means d/100 rounded (half up), at least 1
        (`default_abtt_components`). `fit` refuses one outside [1, d] (`InputError`).

    Attributes
    ----------
    mean_ : ndarray of shape (n_features_in_,)
        The mean removed.
    components_ : ndarray of shape (D, n_features_in_)
        The top D principal directions, in rows.
    explained_variance_ : ndarray of shape (D,)
        The variances along `components_`.
    n_components_ : int
        D, as fitted.
    n_samples_seen_ : int
        Rows the fit has seen.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Names of features seen during fit; defined only when `X` has feature names that are all
        strings.
    """

    def __init__(self, n_components: int | None = None) -> None:
        self.n_components = n_components

    def _fit_moments(self, moments: Moments) -> None:
        dim = moments.dim
        n_components = default_abtt_components(dim) if self.n_components is None else self.n_components
        if not 1 <= n_components <= dim:
            raise InputError(f"AllButTheTop n_components must be between 1 and the dimension {dim}, got {n_components}")
        variances, vectors = symmetric_eigh(moments.covariance())
        self.mean_ = moments.mean
        self.components_ = vectors[:, :n_components].T.copy()
        self.explained_variance_ = variances[:n_components]
        self.n_components_ = n_components
        self.n_samples_seen_ = moments.count

    def transform(self, X: Any) -> Any:
        X, restore = self._checked_input(X)
        return restore(self._map_rows(X, self._remove_top, X.shape[1]))

    def _remove_top(self, block: np.ndarray) -> np.ndarray:
        centred = block - self.mean_
        return centred - (centred @ self.components_.T) @ self.components_


@register
class Whitening(MomentCalibrator):
    """Whitening (Su et al. 2021): (x - mu) U Lambda^-1/2, keeping the top `n_components` directions.

    inverse_transform exists only without truncation (n_components None or d).

    Parameters
    ----------
    n_components : int or None, default None
        The principal directions kept, k (None: every direction, k = d). `fit` refuses one outside
        [1, d] (`InputError`).
    eps : float, default 1e-6
        Eigenvalues below eps x (mean eigenvalue) are raised to that floor before inverting, so
        N <= d or rank-deficient data gives finite output (the null directions are scaled by a large
        but finite factor; truncate with n_components to drop them instead). `fit` refuses one that
        is not > 0 (`InputError`).
    zca : bool, default False
        Rotate back, (x - mu) U Lambda^-1/2 U^T, which keeps the output closest to the input.

    Attributes
    ----------
    mean_ : ndarray of shape (n_features_in_,)
        The mean mu removed.
    components_ : ndarray of shape (k, n_features_in_)
        The top k principal directions U, in rows.
    explained_variance_ : ndarray of shape (k,)
        The variances Lambda along `components_` (before the floor).
    variance_floor_ : float
        eps x (mean eigenvalue), the floor the variances are raised to before inverting.
    whitening_matrix_ : ndarray of shape (n_features_in_, k)
        The matrix the centred rows are multiplied by; of shape (n_features_in_, n_features_in_)
        with `zca`.
    n_components_ : int
        k, as fitted.
    n_samples_seen_ : int
        Rows the fit has seen.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Names of features seen during fit; defined only when `X` has feature names that are all
        strings.
    """

    collapses_on_few_rows: ClassVar[bool] = True

    def __init__(self, n_components: int | None = None, eps: float = 1e-6, zca: bool = False) -> None:
        self.n_components = n_components
        self.eps = eps
        self.zca = zca

    def _fit_moments(self, moments: Moments) -> None:
        dim = moments.dim
        n_components = dim if self.n_components is None else self.n_components
        if not 1 <= n_components <= dim:
            raise InputError(f"Whitening n_components must be between 1 and the dimension {dim}, got {n_components}")
        if not self.eps > 0:
            raise InputError(f"Whitening eps must be > 0, got {self.eps}")
        variances, vectors = symmetric_eigh(moments.covariance())
        if variances[0] == 0:
            raise InputError("all points are identical: there is no variance to whiten; pass distinct rows")
        self.mean_ = moments.mean
        self.components_ = vectors[:, :n_components].T.copy()
        self.explained_variance_ = variances[:n_components]
        self.variance_floor_ = float(self.eps * variances.mean())
        matrix = self.components_.T / np.sqrt(self._floored_variance())
        self.whitening_matrix_ = matrix @ self.components_ if self.zca else matrix
        self.n_components_ = n_components
        self.n_samples_seen_ = moments.count

    @property
    def keeps_features(self) -> bool:
        """ZCA rotates back into the input's coordinates; plain whitening returns principal axes."""
        return bool(self.zca)

    @property
    def _n_features_out(self) -> int:
        return int(self.whitening_matrix_.shape[1])

    def _floored_variance(self) -> np.ndarray:
        return np.maximum(self.explained_variance_, self.variance_floor_)

    def transform(self, X: Any) -> Any:
        X, restore = self._checked_input(X)
        return restore(self._map_rows(X, lambda block: (block - self.mean_) @ self.whitening_matrix_, self.whitening_matrix_.shape[1]))

    def inverse_transform(self, X: Any) -> Any:
        check_is_fitted(self)
        if self.n_components_ < self.n_features_in_:
            raise InputError(
                f"Whitening kept {self.n_components_} of {self.n_features_in_} directions, so the others are lost "
                "and inverse_transform is not defined; fit with n_components=None to invert"
            )
        Z, restore = self._checked_input(X, inverse=True)
        scale = np.sqrt(self._floored_variance())

        def unwhiten(block: np.ndarray) -> np.ndarray:
            unscaled = block @ self.components_.T if self.zca else block  # ZCA output is in the input basis: rotate to PCA first
            return (unscaled * scale) @ self.components_ + self.mean_

        return restore(self._map_rows(Z, unwhiten, self.n_features_in_))


@register
class Standardize(MomentCalibrator):
    """Per-dimension z-score, (x - mean) / std, the fix for rogue dimensions (Timkey & van Schijndel 2021).

    The std is the population std (as sklearn's StandardScaler); constant dimensions are only
    centred. It takes no parameters.

    Attributes
    ----------
    mean_ : ndarray of shape (n_features_in_,)
        The per-dimension mean.
    var_ : ndarray of shape (n_features_in_,)
        The per-dimension population variance.
    scale_ : ndarray of shape (n_features_in_,)
        The per-dimension std the centred rows are divided by (1 for a constant dimension).
    n_samples_seen_ : int
        Rows the fit has seen.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Names of features seen during fit; defined only when `X` has feature names that are all
        strings.
    """

    full_covariance: ClassVar[bool] = False

    def __init__(self) -> None:
        pass

    def _fit_moments(self, moments: Moments) -> None:
        self.mean_ = moments.mean
        self.var_ = moments.variance(ddof=0)
        std = np.sqrt(self.var_)
        self.scale_ = np.where(std > 0, std, 1.0)
        self.n_samples_seen_ = moments.count

    def transform(self, X: Any) -> Any:
        X, restore = self._checked_input(X)
        return restore(self._map_rows(X, lambda block: (block - self.mean_) / self.scale_, X.shape[1]))

    def inverse_transform(self, X: Any) -> Any:
        Z, restore = self._checked_input(X, inverse=True)
        return restore(self._map_rows(Z, lambda block: block * self.scale_ + self.mean_, Z.shape[1]))
