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

How the layer is kept fitted while the encoder moves is one `CalibrationOptions` object (recorded
whole in each run's settings): re-fits on the fixed subset's vectors or on running batch moments,
a flow trained jointly with the task (its negative log-likelihood added to the loss), a guard that
re-fits early when the fit in use loses its isotropy on the encoder's current vectors, and a
penalty keeping the layer's per-dimension output variance at its value at fit time.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, fields
from typing import Any, Callable, Mapping

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
from lmgeom.calibrate.flow import negative_log_likelihood
from lmgeom.calibrate.linear import MomentCalibrator
from lmgeom.metrics.isotropy import MomentAccumulator

REFIT_SOURCES = ("subset", "batch")
FLOW_TRAININGS = ("refit", "joint")
# Log-variance ratios are taken with variances floored at this fraction of their mean (a removed
# direction of all-but-the-top has variance ~0 in its output and no meaningful ratio).
_VARIANCE_FLOOR = 1e-8


@dataclass(frozen=True)
class CalibrationOptions:
    """How a calibration layer is kept fitted while fine-tuning moves the encoder under it.

    The calibrator's own parameters are never trained by the task loss (its statistics are
    buffers, the flow's parameters are frozen), except with ``flow_training="joint"``; gradients
    always flow through the transform into the encoder.

    Parameters
    ----------
    refit_on : {"subset", "batch"}, default "subset"
        What a scheduled re-fit is fitted on. "subset": the eval-mode pooled vectors of a fixed
        seeded subset of training inputs (an encoder pass over them per re-fit). "batch": running
        moments (mean and covariance) of the training batches' pooled vectors, updated every step
        with ``batch_momentum`` (the way IsoBN and batch normalisation keep their statistics),
        started from the first fit's subset; the calibrator is fitted in closed form from them.
        Only for the calibrators that need only the first two moments (abtt, conceptor,
        whitening, standardize).
    batch_momentum : float, default 0.05
        The running moments' update factor per step with ``refit_on="batch"``, in (0, 1]
        (1: the current batch alone).
    flow_training : {"refit", "joint"}, default "refit"
        The flow only. "refit": re-fitted by maximum likelihood, frozen in between. "joint": fitted
        once before the first step, then its parameters are trained together with the model (as
        BERT-flow does) with Adam at ``flow_learning_rate`` on the task loss plus
        ``flow_nll_weight`` times its negative log-likelihood (nats per dimension) of the batch's
        pooled vectors; no later re-fit replaces it.
    flow_nll_weight : float, default 1.0
        Weight of the flow's negative log-likelihood in the loss (joint training), >= 0.
    flow_nll_into_encoder : bool, default False
        Whether the likelihood's gradient reaches the encoder (False: it trains the flow only, the
        encoder's vectors are detached for it, as in BERT-flow).
    flow_learning_rate : float, default 1e-3
        Adam's learning rate for the flow's parameters (joint training), > 0.
    guard_isoscore : float or None, default None
        Re-fit early when the fit in use has lost isotropy: every ``guard_every`` steps the layer's
        output IsoScore on the eval-mode vectors of ``guard_inputs`` training inputs is compared
        with its value on the same inputs just after the last fit, and a ratio below
        ``guard_isoscore`` (in (0, 1)) triggers a re-fit at once. None: no guard.
    guard_every : int, default 10
        Steps between the guard's checks, >= 1.
    guard_inputs : int, default 256
        Training inputs (a seeded subset of the re-fit subset) the guard measures on, >= 2.
    variance_penalty : float, default 0.0
        Weight of a penalty added to the loss: the mean over dimensions of the squared log ratio of
        the layer's output variance on the batch to its variance on the fit's vectors (1 for
        whitening and the flow), >= 0. Its gradient reaches the encoder through the transform.
    check_every : int, default 100
        Steps between the checks of the fit in use on the subset's vectors (`layer_checks`) where
        no subset re-fit computes them anyway (batch re-fits, joint training), >= 1.
    """

    refit_on: str = "subset"
    batch_momentum: float = 0.05
    flow_training: str = "refit"
    flow_nll_weight: float = 1.0
    flow_nll_into_encoder: bool = False
    flow_learning_rate: float = 1e-3
    guard_isoscore: float | None = None
    guard_every: int = 10
    guard_inputs: int = 256
    variance_penalty: float = 0.0
    check_every: int = 100

    def __post_init__(self) -> None:
        def refuse(name: str, rule: str) -> None:
            raise InputError(f"CalibrationOptions.{name} must be {rule}, got {getattr(self, name)!r}", param=name)

        if self.refit_on not in REFIT_SOURCES:
            refuse("refit_on", f"one of {REFIT_SOURCES}")
        if self.flow_training not in FLOW_TRAININGS:
            refuse("flow_training", f"one of {FLOW_TRAININGS}")
        if not isinstance(self.flow_nll_into_encoder, bool):
            refuse("flow_nll_into_encoder", "True or False")
        if not 0 < self.batch_momentum <= 1:
            refuse("batch_momentum", "in (0, 1]")
        if not self.flow_nll_weight >= 0:
            refuse("flow_nll_weight", ">= 0")
        if not self.flow_learning_rate > 0:
            refuse("flow_learning_rate", "> 0")
        if self.guard_isoscore is not None and not 0 < self.guard_isoscore < 1:
            refuse("guard_isoscore", "None or in (0, 1)")
        if not self.variance_penalty >= 0:
            refuse("variance_penalty", ">= 0")
        for name, least in (("guard_every", 1), ("guard_inputs", 2), ("check_every", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                refuse(name, f"an integer >= {least}")

    def to_dict(self) -> dict[str, Any]:
        """The options as a plain dict (every field)."""
        return asdict(self)

    def changed(self) -> dict[str, Any]:
        """The fields that differ from the defaults."""
        default = CalibrationOptions()
        return {key: value for key, value in asdict(self).items() if getattr(default, key) != value}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "CalibrationOptions":
        """Options from a mapping of field names.

        Parameters
        ----------
        values : mapping
            Field name -> value; the fields not named keep their defaults.

        Returns
        -------
        CalibrationOptions

        Raises
        ------
        InputError
            For an unknown name (naming it) or a bad value (naming its field).
        """
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise InputError(f"CalibrationOptions takes {names}, not {unknown}", param=unknown)
        return cls(**dict(values))

    @classmethod
    def parse(cls, text: str) -> "CalibrationOptions":
        """Options from the command line's ``name=value,name=value``.

        Parameters
        ----------
        text : str
            Comma-separated ``name=value`` pairs; a value is read as true/false, none, an integer,
            a float, or else kept as text.

        Returns
        -------
        CalibrationOptions

        Raises
        ------
        InputError
            For an item without ``=``, an unknown name or a bad value.
        """
        values: dict[str, Any] = {}
        for item in (part.strip() for part in text.split(",")):
            if not item:
                continue
            name, sep, raw = item.partition("=")
            if not sep or not name.strip():
                raise InputError(f"calibration options are name=value pairs separated by commas, got {item!r}",
                                 param="calibration")
            values[name.strip()] = _parse_value(raw.strip())
        return cls.from_dict(values)

    def check_method(self, method: str) -> None:
        """Refuse options that a calibration method cannot take.

        Parameters
        ----------
        method : str
            One of the fine-tuning calibration methods (abtt, cie, conceptor, whitening,
            standardize, flow).

        Raises
        ------
        InputError
            Naming the option: `refit_on="batch"` for cie and the flow, a `flow_*` option for
            another method, `guard_isoscore` with a joint flow.
        """
        if self.refit_on == "batch" and method not in MOMENT_METHODS:
            raise InputError(f"CalibrationOptions.refit_on 'batch' fits in closed form from running moments, which "
                             f"{method} cannot (it needs more than a mean and covariance); use it with one of "
                             f"{MOMENT_METHODS}" + (", or flow_training='joint' for the flow" if method == "flow" else ""),
                             param="refit_on")
        if method != "flow":
            flow_only = {k: v for k, v in self.changed().items() if k.startswith("flow_")}
            if flow_only:
                raise InputError(f"CalibrationOptions {sorted(flow_only)} apply to the flow only, not {method}",
                                 param=sorted(flow_only))
        elif self.flow_training == "joint" and self.guard_isoscore is not None:
            raise InputError("CalibrationOptions.flow_training 'joint' trains the flow instead of re-fitting it, so "
                             "guard_isoscore (which triggers re-fits) does not apply; leave it None", param="guard_isoscore")


# The calibrators fitted from a mean and covariance alone (`MomentCalibrator`s).
MOMENT_METHODS = ("abtt", "conceptor", "whitening", "standardize")


def _parse_value(raw: str) -> Any:
    lowered = raw.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered == "none":
        return None
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw


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
        # a copy: moving or training this module (`.to(device)`, a joint flow) leaves the calibrator as it was fitted
        self.flow = copy.deepcopy(fitted.module_).float().requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.prewhitening is not None:
            x = self.prewhitening(x)
        z, _ = self.flow(x)
        return z

    def negative_log_likelihood(self, x: torch.Tensor) -> torch.Tensor:
        """Mean negative log-likelihood of the rows of `x` under the flow, in nats per dimension of
        the prewhitened space (the prewhitening's constant log-determinant left out)."""
        if self.prewhitening is not None:
            x = self.prewhitening(x)
        return negative_log_likelihood(*self.flow(x)).mean() / x.shape[1]


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
    form on `device`; `n_refits` counts the fits. With `options.refit_on == "batch"`,
    `update_moments(batch)` keeps running moments of the training batches (started from the last
    `refit`'s vectors) and `refit_from_moments()` fits the calibrator from them in closed form.
    `reference_variance` is the current fit's per-dimension output variance on what it was fitted
    on (`variance_penalty` compares a batch's with it)."""

    def __init__(self, make: Callable[[], Calibrator], *, device: torch.device | str = "cpu", continue_flow: bool = False,
                 options: CalibrationOptions | None = None) -> None:
        super().__init__()
        self.make = make
        self.continue_flow = continue_flow
        self.options = options or CalibrationOptions()
        self.device = torch.device(device)
        self.calibrator: Calibrator | None = None
        self.transform: nn.Module | None = None
        self.n_refits = 0
        self.reference_variance: torch.Tensor | None = None
        self._count = 0.0
        self._mean: np.ndarray | None = None
        self._covariance: np.ndarray | None = None  # population covariance (ddof 0)

    def refit(self, vectors: np.ndarray) -> None:
        calibrator = self.make()
        if self.continue_flow and isinstance(calibrator, FlowCalibrator) and isinstance(self.calibrator, FlowCalibrator):
            calibrator = ContinuedFlow(self.calibrator, **calibrator.get_params())
        X = np.asarray(vectors, dtype=np.float64)
        calibrator.fit(X)
        self._install(calibrator)
        if self.options.refit_on == "batch":
            centred = X - X.mean(axis=0)
            self._count, self._mean, self._covariance = float(len(X)), X.mean(axis=0), centred.T @ centred / len(X)
        with torch.no_grad():
            output = self.transform(torch.as_tensor(X, dtype=torch.float32, device=self.device))  # type: ignore[misc]
            self.reference_variance = output.var(dim=0, unbiased=False)

    def _install(self, calibrator: Calibrator) -> None:
        self.calibrator = calibrator
        self.transform = torch_calibration(calibrator).to(self.device)
        if self.options.flow_training == "joint" and isinstance(self.transform, _Flow):
            self.transform.flow = copy.deepcopy(self.transform.flow).requires_grad_(True)
        self.n_refits += 1

    @torch.no_grad()
    def update_moments(self, batch: torch.Tensor) -> None:
        """Move the running moments towards a batch's.

        Parameters
        ----------
        batch : torch.Tensor of shape (n, dim)
            Pooled vectors (detached here); the running mean, population covariance and row
            count each move towards the batch's by `options.batch_momentum`.
        """
        if self._mean is None or self._covariance is None:
            raise ValueError("the running moments start from a refit(vectors); call it first")
        X = batch.detach().double().cpu().numpy()
        centred = X - X.mean(axis=0)
        rate = self.options.batch_momentum
        self._count += rate * (len(X) - self._count)
        self._mean = self._mean + rate * (X.mean(axis=0) - self._mean)
        self._covariance = self._covariance + rate * (centred.T @ centred / len(X) - self._covariance)

    def refit_from_moments(self) -> None:
        """Fit a fresh calibrator from the running moments, in closed form (moment calibrators only)."""
        import warnings

        from lmgeom.calibrate._base import FewRowsWarning

        calibrator = self.make()
        if not isinstance(calibrator, MomentCalibrator):
            raise InputError(f"{type(calibrator).__name__} needs more than a mean and covariance, so it cannot be "
                             f"re-fitted from running moments; use refit_on='subset'", param="refit_on")
        if self._mean is None or self._covariance is None:
            raise ValueError("the running moments start from a refit(vectors); call it first")
        count = max(2, int(round(self._count)))
        scatter = self._covariance * count if calibrator.full_covariance else np.diag(self._covariance) * count
        moments = MomentAccumulator.from_state_dict({"full_covariance": calibrator.full_covariance, "count": count,
                                                     "mean": self._mean.copy(), "scatter": scatter})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FewRowsWarning)  # the running moments stand for more rows than `count`
            calibrator.fit_moments(moments)
        self._install(calibrator)
        transform = self.transform
        assert isinstance(transform, _Affine)
        matrix = transform.matrix.double()
        covariance = torch.as_tensor(self._covariance, dtype=torch.float64, device=matrix.device)
        self.reference_variance = torch.einsum("ij,ik,kj->j", matrix, covariance, matrix).float()

    def joint_parameters(self) -> list[nn.Parameter]:
        """The flow's parameters when it is trained jointly (`options.flow_training == "joint"`), else none."""
        if self.options.flow_training != "joint" or not isinstance(self.transform, _Flow):
            return []
        return list(self.transform.flow.parameters())

    def negative_log_likelihood(self, x: torch.Tensor) -> torch.Tensor:
        """The flow's mean negative log-likelihood of `x`, nats per dimension (`_Flow.negative_log_likelihood`)."""
        if not isinstance(self.transform, _Flow):
            raise ValueError("only a fitted flow has a likelihood")
        return self.transform.negative_log_likelihood(x)

    def variance_penalty(self, features: torch.Tensor) -> torch.Tensor:
        """Mean over dimensions of log(var_batch / reference_variance)^2 of the layer's output `features`
        (variances floored at a tiny fraction of their mean, so a removed direction gives no infinity)."""
        if self.reference_variance is None:
            raise ValueError("the calibration layer has not been fitted yet; call refit(vectors) first")
        variance = features.var(dim=0, unbiased=False)
        reference = self.reference_variance.to(variance)
        variance = variance.clamp_min(_VARIANCE_FLOOR * float(variance.detach().mean()) + 1e-30)
        reference = reference.clamp_min(_VARIANCE_FLOOR * float(reference.mean()) + 1e-30)
        return (variance / reference).log().pow(2).mean()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.transform is None:
            raise ValueError("the calibration layer has not been fitted yet; call refit(vectors) first")
        return self.transform(x)


@torch.no_grad()
def layer_isoscore(layer: nn.Module, vectors: np.ndarray) -> float:
    """IsoScore of a layer's output.

    Parameters
    ----------
    layer : torch.nn.Module
        A (batch, dim) -> (batch, dim') module, e.g. a fitted `CalibrationLayer`.
    vectors : ndarray of shape (n, dim)
        Its input.

    Returns
    -------
    float
        IsoScore of the output, NaN when the output is not finite.
    """
    from lmgeom.metrics.isotropy import isoscore

    parameter = next(iter([*layer.parameters(), *layer.buffers()]), None)
    device = parameter.device if parameter is not None else torch.device("cpu")
    output = layer(torch.as_tensor(np.asarray(vectors), dtype=torch.float32, device=device)).double().cpu().numpy()
    return float(isoscore(output)) if np.isfinite(output).all() else float("nan")


def guard_fires(layer: nn.Module, vectors: np.ndarray, reference: float, ratio: float) -> tuple[bool, float]:
    """Whether the fit in use has lost its isotropy on the encoder's current `vectors`.

    Parameters
    ----------
    layer : torch.nn.Module
        The calibration layer (its current fit).
    vectors : ndarray of shape (n, dim)
        The encoder's current pooled vectors of the guard's inputs.
    reference : float
        The layer's output IsoScore on the same inputs just after its last fit.
    ratio : float
        The guard's threshold, `CalibrationOptions.guard_isoscore`.

    Returns
    -------
    fires : bool
        True when the IsoScore now is below `ratio * reference` (or not finite).
    isoscore : float
        The IsoScore now.
    """
    now = layer_isoscore(layer, vectors)
    return not now >= ratio * reference, now
