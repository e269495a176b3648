"""A Glow-style normalizing flow (Kingma & Dhariwal 2018) for vectors, trained to map points to N(0, I).

A fixed whitening (default; see FlowCalibrator) comes first. Each step is then actnorm ->
invertible linear map (the "1x1 convolution", LU-parametrised so its log-determinant is the sum of
log|diag U|) -> affine coupling (or additive, volume-preserving).
The flow is trained by maximum likelihood; `transform` gives z, `inverse_transform` maps z back,
`log_det` gives log|det dz/dx| per point and `score_samples` the log-density log p(x).
"""

from __future__ import annotations

import copy
import math
import warnings
from typing import Any, ClassVar, cast

import numpy as np
import torch
from sklearn.utils import check_random_state
from torch import nn

from lmgeom.errors import InputError
from lmgeom.calibrate._base import Calibrator, FewRowsWarning, register
from lmgeom.calibrate.linear import Whitening
from lmgeom.device import resolve_device

# Rows per forward pass at transform time (no gradients, so memory is rows x hidden_size floats).
_TRANSFORM_BATCH_ROWS = 65536
# Rows that set the data-dependent actnorm initialisation.
_INIT_ROWS = 16384
_GRADIENT_CLIP_NORM = 10.0  # a few outlier batches early on can otherwise throw the scales far off
_LOG_SCALE_BOUND = 2.0  # each affine coupling scales a coordinate by a factor in (e^-2, e^2)


class _ActNorm(nn.Module):
    """y = x * exp(log_scale) + bias, initialised so its first input comes out zero-mean, unit-variance.

    The bias acts after the scale, as in Glow, so it lives in standardised units: an optimiser step
    of fixed size on it stays small even for a dimension whose raw spread is tiny (a dead dimension
    of std 1e-30 gets a huge scale, and a bias added before that scale would be amplified with it)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(dim))
        self.log_scale = nn.Parameter(torch.zeros(dim))

    @torch.no_grad()
    def initialize(self, x: torch.Tensor) -> None:
        std = x.std(dim=0)
        # A constant dimension has std 0; a floor relative to the typical std keeps the scale finite.
        std = std.clamp_min(1e-6 * float(std.mean()) + torch.finfo(std.dtype).tiny)
        self.log_scale.copy_(-std.log())
        self.bias.copy_(-x.mean(dim=0) / std)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * self.log_scale.exp() + self.bias, self.log_scale.sum().expand(x.shape[0])

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        return (y - self.bias) * (-self.log_scale).exp()


class _InvertibleLinear(nn.Module):
    """y = x W^T with W = P L (U + diag(sign * exp(log_s))), P a fixed permutation, L unit lower-triangular."""

    permutation_index: torch.Tensor
    sign: torch.Tensor
    lower_mask: torch.Tensor
    identity: torch.Tensor

    def __init__(self, dim: int) -> None:
        super().__init__()
        # W starts as a random rotation, as in Glow, held through its LU factors W = P L U.
        permutation, lower, upper = torch.linalg.lu(torch.linalg.qr(torch.randn(dim, dim, dtype=torch.float64))[0])
        diagonal = torch.diagonal(upper)
        # P as an index (row i of P @ M is row permutation_index[i] of M): a gather, not a d x d matmul.
        self.register_buffer("permutation_index", permutation.argmax(dim=1))
        self.register_buffer("sign", torch.sign(diagonal).float())
        self.register_buffer("lower_mask", torch.tril(torch.ones(dim, dim), diagonal=-1))
        self.register_buffer("identity", torch.eye(dim))
        self.lower = nn.Parameter(lower.float())
        self.upper = nn.Parameter(torch.triu(upper, diagonal=1).float())
        self.log_s = nn.Parameter(diagonal.abs().log().float())

    def _factors(self) -> tuple[torch.Tensor, torch.Tensor]:
        lower = self.lower * self.lower_mask + self.identity
        upper = self.upper * self.lower_mask.T + torch.diag(self.sign * self.log_s.exp())
        return lower, upper

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lower, upper = self._factors()
        weight = (lower @ upper)[self.permutation_index]
        return x @ weight.T, self.log_s.sum().expand(x.shape[0])

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        # x^T = U^-1 L^-1 P^T y^T, by two triangular solves instead of an explicit inverse.
        lower, upper = self._factors()
        permuted = torch.empty_like(y).index_copy_(1, self.permutation_index, y).T  # (P^T y^T)
        solved = torch.linalg.solve_triangular(lower, permuted, upper=False, unitriangular=True)
        return torch.linalg.solve_triangular(upper, solved, upper=True).T


class _Coupling(nn.Module):
    """The second half of x is shifted (and scaled, for affine) by a network of the first half."""

    def __init__(self, dim: int, hidden_size: int, *, additive: bool) -> None:
        super().__init__()
        self.split = dim // 2
        self.additive = additive
        self.n_transformed = dim - self.split
        out = self.n_transformed if additive else 2 * self.n_transformed
        last = nn.Linear(hidden_size, out)
        nn.init.zeros_(last.weight)  # starts as (nearly) the identity, as in Glow
        nn.init.zeros_(last.bias)
        self.net = nn.Sequential(nn.Linear(self.split, hidden_size), nn.ReLU(), nn.Linear(hidden_size, hidden_size), nn.ReLU(), last)

    def _shift_log_scale(self, conditioner: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        h = self.net(conditioner)
        if self.additive:
            return h, None
        # Soft-clamped log-scale in (-2, 2): Glow's sigmoid(h + 2) saturates to a scale of ~0 on
        # outlier points (massive activations of decoder layers), which the inverse cannot undo.
        raw = h[:, self.n_transformed :]
        return h[:, : self.n_transformed], _LOG_SCALE_BOUND * torch.tanh(raw / _LOG_SCALE_BOUND)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        kept, changed = x[:, : self.split], x[:, self.split :]
        shift, log_scale = self._shift_log_scale(kept)
        if log_scale is None:
            return torch.cat([kept, changed + shift], dim=1), x.new_zeros(x.shape[0])
        return torch.cat([kept, (changed + shift) * log_scale.exp()], dim=1), log_scale.sum(dim=1)

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        kept, changed = y[:, : self.split], y[:, self.split :]
        shift, log_scale = self._shift_log_scale(kept)
        if log_scale is not None:
            changed = changed * (-log_scale).exp()
        return torch.cat([kept, changed - shift], dim=1)


class _Flow(nn.Module):
    def __init__(self, dim: int, *, n_steps: int, hidden_size: int, additive: bool) -> None:
        super().__init__()
        self.layers = nn.ModuleList()
        for _ in range(n_steps):
            self.layers.extend([_ActNorm(dim), _InvertibleLinear(dim), _Coupling(dim, hidden_size, additive=additive)])

    @torch.no_grad()
    def initialize(self, x: torch.Tensor) -> None:
        """Data-dependent init: each actnorm standardises what reaches it."""
        for layer in self.layers:
            if isinstance(layer, _ActNorm):
                layer.initialize(x)
            x, _ = layer(x)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        log_det = x.new_zeros(x.shape[0])
        for layer in self.layers:
            x, layer_log_det = layer(x)
            log_det = log_det + layer_log_det
        return x, log_det

    def inverse(self, z: torch.Tensor) -> torch.Tensor:
        for layer in reversed(self.layers):
            z = cast("_ActNorm | _InvertibleLinear | _Coupling", layer).inverse(z)
        return z


def negative_log_likelihood(z: torch.Tensor, log_det: torch.Tensor) -> torch.Tensor:
    """-log p(x) per point under z ~ N(0, I), from a flow's output `z` (n x d) and the log
    determinant of its Jacobian per point (`log_det`, n): what a flow's fit minimises, and what a
    flow trained jointly inside fine-tuning adds to the task loss."""
    return 0.5 * (z**2).sum(dim=1) + 0.5 * z.shape[1] * math.log(2 * math.pi) - log_det


@register
class FlowCalibrator(Calibrator):
    """Glow-style normalizing flow trained by maximum likelihood to map points to N(0, I).

    The defaults (4 steps, 128 hidden units, 10 epochs of batch 512, Adam 1e-3) cost about
    0.9 TFLOP for 10k x 384 points: seconds on a free CPU. Transform-like methods run a float64 copy
    of the trained flow, so a row's result does not depend on how many other rows come with it
    (float32 matrix products round differently for different batch shapes).

    Parameters
    ----------
    n_steps : int, default 4
        Flow steps, each actnorm -> invertible linear map -> coupling; at least 1 (`fit` refuses
        less: `InputError`).
    hidden_size : int, default 128
        Hidden units of each coupling's network; at least 1.
    coupling : str, default "affine"
        "affine" (shift and scale) or "additive" (shift only, volume-preserving); `fit` refuses
        another (`InputError`).
    n_epochs : int, default 10
        Training epochs; at least 1.
    batch_size : int, default 512
        Rows per training batch; at least 1.
    learning_rate : float, default 1e-3
        Adam's learning rate.
    prewhiten : bool, default True
        First apply a fixed `Whitening` fitted in float64 (part of the bijection, counted in
        `log_det`), so the flow learns only what whitening cannot do. Without it, a few epochs of
        Adam do not undo the condition numbers of real layers (variances spanning 6+ orders of
        magnitude in decoder layers), and near-dead dimensions make maximum likelihood unstable.
    random_state : int or None, default 0
        Seeds the initialisation and the batch order (None: numpy's global random state).
    device : str, default "auto"
        Where training runs, in float32 ("auto": CUDA when present).

    Attributes
    ----------
    module_ : torch.nn.Module
        The trained torch flow.
    prewhitening_ : Whitening or None
        The fitted prewhitening, or None without `prewhiten`.
    loss_curve_ : list of float
        Mean NLL in nats per dimension of the data the flow is trained on (whitened with
        `prewhiten`), per epoch.
    n_iter_ : int
        Epochs run.
    n_samples_seen_ : int
        Rows the fit has seen.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of shape (n_features_in_,)
        Names of features seen during fit; defined only when `X` has feature names that are all
        strings.
    """

    collapses_on_few_rows: ClassVar[bool] = True

    _save_format: ClassVar[str] = "torch"
    _fitted_marker: ClassVar[str] = "module_"

    def __init__(
        self,
        n_steps: int = 4,
        hidden_size: int = 128,
        coupling: str = "affine",
        n_epochs: int = 10,
        batch_size: int = 512,
        learning_rate: float = 1e-3,
        prewhiten: bool = True,
        random_state: int | None = 0,
        device: str = "auto",
    ) -> None:
        self.n_steps = n_steps
        self.hidden_size = hidden_size
        self.coupling = coupling
        self.n_epochs = n_epochs
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.prewhiten = prewhiten
        self.random_state = random_state
        self.device = device

    def _build(self, dim: int, seed: int) -> _Flow:
        if self.coupling not in ("affine", "additive"):
            raise InputError(f"FlowCalibrator coupling must be 'affine' or 'additive', got {self.coupling!r}")
        for name in ("n_steps", "hidden_size", "n_epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise InputError(f"FlowCalibrator {name} must be >= 1, got {getattr(self, name)}")
        with torch.random.fork_rng(devices=[]):  # seed the initialisation without touching the caller's global RNG
            torch.manual_seed(seed)
            return _Flow(dim, n_steps=self.n_steps, hidden_size=self.hidden_size, additive=self.coupling == "additive")

    def fit(self, X: Any, y: Any = None) -> "FlowCalibrator":
        X, _ = self._validate(X, reset=True, min_samples=2)
        self._warn_if_few_rows(*X.shape)
        n_points, dim = X.shape
        if dim < 2:
            raise InputError("FlowCalibrator couples one half of the dimensions with the other, so it needs at least 2; got n_features = 1")
        device = resolve_device(self.device)
        seed = int(check_random_state(self.random_state).randint(np.iinfo(np.int32).max))
        flow = self._build(dim, seed).to(device)
        batch_order = torch.Generator().manual_seed(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FewRowsWarning)  # the flow itself warned of these rows
            self.prewhitening_ = Whitening().fit(X) if self.prewhiten else None
        data = torch.tensor(self._prewhitened(X), dtype=torch.float32, device=device)
        flow.initialize(data[torch.randperm(n_points, generator=batch_order)[:_INIT_ROWS].to(device)])
        optimizer = torch.optim.Adam(flow.parameters(), lr=self.learning_rate)
        self.loss_curve_ = []
        flow.train()
        for _ in range(self.n_epochs):
            order = torch.randperm(n_points, generator=batch_order).to(device)
            total = 0.0
            for start in range(0, n_points, self.batch_size):
                batch = data[order[start : start + self.batch_size]]
                loss = negative_log_likelihood(*flow(batch)).mean()
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(flow.parameters(), _GRADIENT_CLIP_NORM)
                optimizer.step()
                total += loss.item() * len(batch)
            self.loss_curve_.append(total / n_points / dim)
        if not np.isfinite(self.loss_curve_[-1]):
            raise InputError("FlowCalibrator training diverged (non-finite loss); lower learning_rate, or use prewhiten=True")
        self._set_module(flow)
        self.n_iter_ = self.n_epochs
        self.n_samples_seen_ = n_points
        return self

    @property
    def keeps_features(self) -> bool:
        """The flow's output is its latent space, not the input's coordinates."""
        return False

    def _set_module(self, flow: _Flow) -> None:
        self.module_ = flow.eval()
        self._module64 = copy.deepcopy(self.module_).double()

    def _prewhitened(self, X: np.ndarray) -> np.ndarray:
        if self.prewhitening_ is None:
            return X
        return np.asarray(self.prewhitening_.transform(X.astype(np.float64, copy=False)))  # an array whatever `set_output` says

    @torch.no_grad()
    def _apply(self, X: Any, method: str) -> tuple[np.ndarray, np.ndarray | None, Any]:
        X, restore = self._checked_input(X, inverse=method == "inverse")
        if method == "forward":
            X = self._prewhitened(X)
        device = next(self._module64.parameters()).device
        outputs, log_dets = [], []
        for start in range(0, len(X), _TRANSFORM_BATCH_ROWS):
            batch = torch.tensor(X[start : start + _TRANSFORM_BATCH_ROWS], dtype=torch.float64, device=device)
            if method == "inverse":
                outputs.append(self._module64.inverse(batch).cpu().numpy())
            else:
                z, log_det = self._module64(batch)
                outputs.append(z.cpu().numpy())
                log_dets.append(log_det.cpu().numpy())
        result = np.concatenate(outputs) if outputs else np.zeros((0, self.n_features_in_))
        if method == "inverse" and self.prewhitening_ is not None:
            result = self.prewhitening_.inverse_transform(result)
        if not log_dets:
            return result, None, restore
        log_det = np.concatenate(log_dets)
        if self.prewhitening_ is not None:  # the fixed linear map adds a constant log |det|
            log_det = log_det + np.linalg.slogdet(self.prewhitening_.whitening_matrix_)[1]
        return result, log_det, restore

    def transform(self, X: Any) -> Any:
        z, _, restore = self._apply(X, "forward")
        return restore(z)

    def inverse_transform(self, X: Any) -> Any:
        x, _, restore = self._apply(X, "inverse")
        return restore(x)

    def log_det(self, X: Any) -> np.ndarray:
        """log |det dz/dx| of the flow at each point (float64 array of length n_points)."""
        _, log_det, _ = self._apply(X, "forward")
        assert log_det is not None  # the forward pass always yields it
        return log_det

    def score_samples(self, X: Any) -> np.ndarray:
        """log p(x) under the fitted flow: log N(z; 0, I) + log |det dz/dx|."""
        z, log_det, _ = self._apply(X, "forward")
        return -(0.5 * (z**2).sum(axis=1) + 0.5 * z.shape[1] * math.log(2 * math.pi)) + log_det

    # -- persistence: the module as a state dict -------------------------------------------

    def _fitted_state(self) -> dict[str, Any]:
        prewhitening = {} if self.prewhitening_ is None else self.prewhitening_._fitted_state()
        return {
            "module_": {name: tensor.detach().cpu() for name, tensor in self.module_.state_dict().items()},
            "prewhitening_": {name: torch.from_numpy(np.asarray(value)) for name, value in prewhitening.items()},
            "loss_curve_": torch.tensor(self.loss_curve_, dtype=torch.float64),
            "n_features_in_": self.n_features_in_,
            "n_iter_": self.n_iter_,
            "n_samples_seen_": self.n_samples_seen_,
        }

    def _set_fitted_state(self, state: dict[str, Any]) -> None:
        self.n_features_in_ = int(state["n_features_in_"])
        flow = self._build(self.n_features_in_, seed=0)  # every parameter is overwritten by the state dict
        flow.load_state_dict(state["module_"])
        self._set_module(flow.to(resolve_device(self.device)))
        self.prewhitening_ = None
        if state["prewhitening_"]:
            self.prewhitening_ = Whitening()
            self.prewhitening_._set_fitted_state({name: tensor.numpy() for name, tensor in state["prewhitening_"].items()})
        self.loss_curve_ = state["loss_curve_"].tolist()
        self.n_iter_ = int(state["n_iter_"])
        self.n_samples_seen_ = int(state["n_samples_seen_"])
