"""IsoBN (Zhou, Lin & Ren 2021, "IsoBN: Fine-Tuning BERT with Isotropic Batch Normalization", AAAI).

The sentence representation is rescaled per dimension, never rotated or centred:
    running statistics (training only, from the detached batch, momentum alpha):
        cov   <- cov + alpha (cov_B - cov),     cov_B = (1/m) sum (x - mu_B)(x - mu_B)^T
        sigma <- sigma + alpha (sigma_B - sigma), sigma_B = sqrt(diag cov_B)
    rho_ij  = clip(cov_ij / (sigma_i sigma_j), -1, 1)          (the correlation)
    gamma_i = (1/d) sum_j rho_ij^2                             (how correlated dimension i is with the rest)
    s_i     = (gamma_i sigma_i + eps)^-beta                     (beta = 0.5: the paper's partial normalisation)
    s      <- s * sqrt(sum_i cov_ii / sum_i cov_ii s_i^2)      (the total variance is kept)
    y = x * s, with s treated as a constant (no gradient through the statistics).
Dimensions with a large spread, or strongly correlated with the others, are shrunk; the result is
closer to isotropic without a whitening's unstable inverse. The statistics start at zero and follow
the authors' code (github.com/INK-USC/IsoBN, `model.py`): in particular the running averages are
not bias-corrected, so for the first ~1/alpha steps the running correlation is inflated and
clipped at +-1 (gamma near 1 for every dimension, a near-uniform scale). One deviation: a
dimension with zero std has correlation 0/0, counted as 0 here (NaN there, which spreads to every
dimension through the rescaling); and a one-row training batch after the first leaves the statistics
unchanged (there, its zero covariance pulls them 5 % towards 0).
"""

from __future__ import annotations

import torch
from torch import nn

from lmgeom.errors import InputError

# The paper's and the authors' code's settings.
ISOBN_MOMENTUM = 0.05
ISOBN_BETA = 0.5
ISOBN_EPS = 1e-3


class IsoBN(nn.Module):
    """Isotropic batch normalisation of (batch, dim) sentence vectors. Training mode updates the
    running covariance and std from each batch of at least 2 rows (a one-row batch, after the first
    batch, only applies them); eval mode only applies them. Buffers: running_cov (d, d), running_std (d,), num_batches_tracked."""

    running_cov: torch.Tensor
    running_std: torch.Tensor
    num_batches_tracked: torch.Tensor

    def __init__(self, dim: int, *, momentum: float = ISOBN_MOMENTUM, beta: float = ISOBN_BETA, eps: float = ISOBN_EPS) -> None:
        super().__init__()
        if not 0 < momentum <= 1:
            raise InputError(f"IsoBN momentum must be in (0, 1], got {momentum}")
        if beta < 0 or eps <= 0:
            raise InputError(f"IsoBN needs beta >= 0 and eps > 0, got beta={beta}, eps={eps}")
        self.momentum = momentum
        self.beta = beta
        self.eps = eps
        self.register_buffer("running_cov", torch.zeros(dim, dim))
        self.register_buffer("running_std", torch.zeros(dim))
        self.register_buffer("num_batches_tracked", torch.zeros((), dtype=torch.long))

    @torch.no_grad()
    def update_statistics(self, x: torch.Tensor) -> None:
        if x.shape[0] < 2:
            raise InputError("IsoBN estimates a covariance from each training batch, so it needs batches of at least 2 rows")
        centred = x - x.mean(dim=0)
        covariance = centred.T @ centred / x.shape[0]
        std = centred.pow(2).mean(dim=0).sqrt()
        self.running_cov += self.momentum * (covariance.to(self.running_cov) - self.running_cov)
        self.running_std += self.momentum * (std.to(self.running_std) - self.running_std)
        self.num_batches_tracked += 1

    @torch.no_grad()
    def scale(self) -> torch.Tensor:
        """The per-dimension factor s (d,) from the running statistics."""
        if int(self.num_batches_tracked) == 0:
            raise ValueError("IsoBN has no statistics yet: run at least one training batch through it before eval")
        # A constant dimension has std 0 and no correlation (0/0): counted as 0, not NaN for every dimension.
        correlation = torch.nan_to_num(self.running_cov / torch.outer(self.running_std, self.running_std), nan=0.0).clamp(-1, 1)
        gamma = correlation.pow(2).mean(dim=1)
        scale = (gamma * self.running_std + self.eps).pow(-self.beta)
        variance = torch.diagonal(self.running_cov)
        return scale * (variance.sum() / ((variance * scale**2).sum() + self.eps)).sqrt()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # A one-row batch (a training set one row past a multiple of the batch size ends in one) has no
        # covariance: it leaves the statistics as they are and is scaled by them, as in eval mode.
        if self.training and (x.shape[0] >= 2 or int(self.num_batches_tracked) == 0):
            self.update_statistics(x.detach())
        return x * self.scale().to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.running_std.shape[0]}, momentum={self.momentum}, beta={self.beta}, eps={self.eps}"
