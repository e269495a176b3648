"""`ScalarMix`: ELMo's task-specific layer combination (Peters et al. 2018, eq. 1),
ELMo_task = gamma * sum_j softmax(w)_j h_j, over any encoder's layers."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from lmgeom.errors import InputError

LAYER_NORM_EPS = 1e-12


class ScalarMix(nn.Module):
    """A learned softmax-weighted sum of `num_layers` equally shaped layers, scaled by `gamma`.

    `weights` (pre-softmax, shape (num_layers,)) start at `initial_weights` or zero (uniform);
    `gamma` starts at 1. With `layer_norm`, each layer is first normalised per sequence: mean and
    variance over the sequence's unmasked positions and all features (so neither padding nor the
    other sequences of the batch change a sequence's result). Masked positions of the output are 0.
    """

    def __init__(
        self, num_layers: int, *, layer_norm: bool = False, initial_weights: Sequence[float] | None = None,
        trainable: bool = True,
    ) -> None:
        super().__init__()
        if num_layers < 1:
            raise InputError(f"num_layers must be at least 1, got {num_layers}")
        if initial_weights is None:
            initial_weights = [0.0] * num_layers
        if len(initial_weights) != num_layers:
            raise InputError(f"initial_weights has {len(initial_weights)} values for {num_layers} layers")
        self.num_layers = num_layers
        self.layer_norm = layer_norm
        self.weights = nn.Parameter(torch.tensor([float(w) for w in initial_weights]), requires_grad=trainable)
        self.gamma = nn.Parameter(torch.tensor(1.0), requires_grad=trainable)

    def normalized_weights(self) -> torch.Tensor:
        """softmax(w), the layer weights s_j."""
        return torch.softmax(self.weights, dim=0)

    def l2_penalty(self) -> torch.Tensor:
        """sum_j w_j^2 of the pre-softmax weights, bilm-tf's `weight_layers` regulariser (its
        `l2_coef * reduce_sum(square(W))`, W starting at zero = uniform): multiply by your lambda and
        add to the loss; a large lambda holds the weights at zero, the softmax at uniform."""
        return (self.weights**2).sum()

    def forward(self, layers: Sequence[torch.Tensor] | torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """`layers`: a list of `num_layers` tensors (..., time, dim) or one stacked tensor
        (num_layers, ..., time, dim); `mask` (..., time), true/1 at real positions."""
        stacked = layers if isinstance(layers, torch.Tensor) else torch.stack(list(layers))
        if stacked.shape[0] != self.num_layers:
            raise ValueError(f"ScalarMix was built for {self.num_layers} layers but got {stacked.shape[0]}")
        if stacked.dim() < 3:
            raise ValueError(f"each layer must be (..., time, dim); got shape {tuple(stacked.shape[1:])}")
        keep = None
        if mask is not None:
            if tuple(mask.shape) != tuple(stacked.shape[1:-1]):
                raise ValueError(f"mask has shape {tuple(mask.shape)}, expected {tuple(stacked.shape[1:-1])} (the layers without dim)")
            keep = mask.bool().unsqueeze(-1)
            stacked = stacked.masked_fill(~keep, 0.0)  # padding never reaches the result, even NaN
        if self.layer_norm:
            stacked = _masked_layer_norm(stacked, keep)
        weights = self.normalized_weights().to(stacked.dtype).reshape(-1, *([1] * (stacked.dim() - 1)))
        mixed = self.gamma.to(stacked.dtype) * (weights * stacked).sum(dim=0)
        return mixed.masked_fill(~keep, 0.0) if keep is not None else mixed


def _masked_layer_norm(stacked: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """Normalise each layer of each sequence over (time, dim) using only its unmasked positions."""
    weight = (keep if keep is not None else torch.ones_like(stacked[0, ..., :1], dtype=torch.bool)).to(stacked.dtype)
    weight = weight.unsqueeze(0)  # broadcast over layers
    count = (weight.sum(dim=(-2, -1), keepdim=True) * stacked.shape[-1]).clamp(min=1.0)
    mean = (stacked * weight).sum(dim=(-2, -1), keepdim=True) / count
    variance = (((stacked - mean) * weight) ** 2).sum(dim=(-2, -1), keepdim=True) / count
    return (stacked - mean) / torch.sqrt(variance + LAYER_NORM_EPS)
