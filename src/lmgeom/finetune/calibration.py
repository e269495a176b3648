"""A fitted calibrator from `lmgeom.calibrate` as a differentiable torch layer.

The calibrator's statistics are fitted outside autograd (on vectors of the training data, see
`CalibrationLayer.refit`); the layer then applies the same map to a batch with torch operations, so
gradients flow through the transform into the encoder while the statistics stay constants:
- all-but-the-top, whitening, standardisation and conceptor negation are affine: (x - shift) M;
- CIE picks each row's nearest centroid (a discrete choice, no gradient) and is affine within it;
- the flow applies its prewhitening and its trained module, whose parameters are frozen. With
  `continue_flow` its re-fits continue the previous fit (`ContinuedFlow`): the first fit's
  pre-whitening is kept and the previous flow's parameters start the next maximum-likelihood
  training, so the map moves a little at each re-fit instead of being replaced by an unrelated one.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from lmgeom.errors import InputError
from lmgeom.calibrate import (
    AllButTheTop,
    Calibrator,
    ClusterIsotropy,
    ConceptorNegation,
    FlowCalibrator,
    Standardize,
    Whitening,
)


class _Affine(nn.Module):
    shift: torch.Tensor
    matrix: torch.Tensor

    def __init__(self, shift: np.ndarray, matrix: np.ndarray) -> None:
        super().__init__()
        self.register_buffer("shift", torch.as_tensor(shift, dtype=torch.float32))
        self.register_buffer("matrix", torch.as_tensor(matrix, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.shift) @ self.matrix


class _ClusterIsotropy(nn.Module):
    centers: torch.Tensor
    means: torch.Tensor
    components: torch.Tensor

    def __init__(self, fitted: ClusterIsotropy) -> None:
        super().__init__()
        self.register_buffer("centers", torch.as_tensor(fitted.cluster_centers_, dtype=torch.float32))
        self.register_buffer("means", torch.as_tensor(fitted.cluster_means_, dtype=torch.float32))
        # Zero-padded rows (clusters with fewer directions) project onto nothing, so they need no mask.
        self.register_buffer("components", torch.as_tensor(fitted.components_, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            cluster = torch.cdist(x.detach(), self.centers).argmin(dim=1)
        centred = x - self.means[cluster]
        directions = self.components[cluster]  # (batch, n_components, d)
        projections = torch.einsum("bd,bkd->bk", centred, directions)
        return centred - torch.einsum("bk,bkd->bd", projections, directions)


class _Flow(nn.Module):
    def __init__(self, fitted: FlowCalibrator) -> None:
        super().__init__()
        whitening = fitted.prewhitening_
        self.prewhitening = None if whitening is None else _Affine(whitening.mean_, whitening.whitening_matrix_)
        self.flow = fitted.module_.float().requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.prewhitening is not None:
            x = self.prewhitening(x)
        z, _ = self.flow(x)
        return z


class ContinuedFlow(FlowCalibrator):
    """A FlowCalibrator fit that continues `previous`: the data go through `previous`'s fixed
    pre-whitening, and training starts from `previous`'s flow (its actnorms not re-initialised).
    Fitted attributes as FlowCalibrator's; `prewhitening_` is `previous`'s."""

    def __init__(self, previous: FlowCalibrator, **params: Any) -> None:
        super().__init__(**{**params, "prewhiten": False})
        self.previous = previous

    def _build(self, dim: int, seed: int) -> Any:
        module = copy.deepcopy(self.previous.module_).float().requires_grad_(True).train()
        setattr(module, "initialize", lambda data: None)  # keep the trained actnorms
        return module

    def fit(self, X: Any, y: Any = None) -> "ContinuedFlow":
        whitening = self.previous.prewhitening_
        X = np.asarray(X, dtype=np.float64)
        super().fit(X if whitening is None else whitening.transform(X))
        self.prewhitening_ = whitening
        return self


def torch_calibration(fitted: Calibrator) -> nn.Module:
    """The fitted calibrator's transform as a torch module of float32 buffers (frozen parameters for
    the flow), differentiable in its input."""
    if isinstance(fitted, AllButTheTop):
        return _Affine(fitted.mean_, np.eye(fitted.n_features_in_) - fitted.components_.T @ fitted.components_)
    if isinstance(fitted, Whitening):
        return _Affine(fitted.mean_, fitted.whitening_matrix_)
    if isinstance(fitted, Standardize):
        return _Affine(fitted.mean_, np.diag(1.0 / fitted.scale_))
    if isinstance(fitted, ConceptorNegation):
        return _Affine(np.zeros(fitted.n_features_in_), fitted.negation_matrix_)
    if isinstance(fitted, ClusterIsotropy):
        return _ClusterIsotropy(fitted)
    if isinstance(fitted, FlowCalibrator):
        return _Flow(fitted)
    raise InputError(f"{type(fitted).__name__} has no differentiable torch form; use one of abtt, cie, conceptor, "
                     "whitening, standardize, flow")


class CalibrationLayer(nn.Module):
    """Applies the latest fit of a calibrator to (batch, dim) vectors, differentiably.

    `refit(vectors)` fits a fresh calibrator from `make` on the given vectors (numpy, no gradient;
    with `continue_flow`, a flow after the first fit continues the previous one, `ContinuedFlow`) and swaps in its torch
    form on `device`; `n_refits` counts the fits."""

    def __init__(self, make: Callable[[], Calibrator], *, device: torch.device | str = "cpu", continue_flow: bool = False) -> None:
        super().__init__()
        self.make = make
        self.continue_flow = continue_flow
        self.device = torch.device(device)
        self.calibrator: Calibrator | None = None
        self.transform: nn.Module | None = None
        self.n_refits = 0

    def refit(self, vectors: np.ndarray) -> None:
        calibrator = self.make()
        if self.continue_flow and isinstance(calibrator, FlowCalibrator) and isinstance(self.calibrator, FlowCalibrator):
            calibrator = ContinuedFlow(self.calibrator, **calibrator.get_params())
        calibrator.fit(np.asarray(vectors, dtype=np.float64))
        self.calibrator = calibrator
        self.transform = torch_calibration(calibrator).to(self.device)
        self.n_refits += 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.transform is None:
            raise ValueError("the calibration layer has not been fitted yet; call refit(vectors) first")
        return self.transform(x)
