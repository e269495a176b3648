"""I-STAR (Rudman & Eickhoff 2024, "Stable Anisotropic Regularization", ICLR 2024).

The fine-tuning loss gains weight * (1 - IsoScore*(points, C0, zeta)), where the points are the
token states of every layer but the embedding output (the paper's `--layer all`) in the batch, and
C0 is the covariance of up to `c0_points` such states of the training data, re-estimated at the
start of every epoch with the model in eval mode (the authors' `get_ci`). A positive weight pushes
towards isotropy, a negative one away from it; the paper finds lowering isotropy helps on most
tasks (its released script: zeta 0.2, lambda -5). One deviation: padding positions are left out of
the points here (the authors' code stacks every position of the padded batch).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from lmgeom.errors import InputError
from lmgeom.metrics.isotropy import MomentAccumulator
from lmgeom.metrics.isoscore_star import isoscore_star_torch

from lmgeom.finetune.model import Classifier, Tokenized


def token_points(hidden_states: Sequence[torch.Tensor], attention_mask: torch.Tensor) -> torch.Tensor:
    """(n_layers * n_tokens, dim): the states of layers 1..L at the non-padding positions."""
    keep = attention_mask.bool()
    return torch.cat([states[keep] for states in hidden_states[1:]])


class IStar:
    """The I-STAR penalty: `weight` (sign included), `zeta`, and C0 from `refresh`."""

    def __init__(self, *, weight: float, zeta: float, c0_points: int) -> None:
        if c0_points < 2:
            raise InputError(f"istar_c0_points must be >= 2, got {c0_points}")
        self.weight = weight
        self.zeta = zeta
        self.c0_points = c0_points
        self.shrinkage_covariance: torch.Tensor | None = None

    @torch.no_grad()
    def refresh(self, classifier: Classifier, data: Tokenized, order: Sequence[int], batch_size: int,
                device: torch.device) -> int:
        """Re-estimate C0 from the training inputs in `order` until `c0_points` states are seen
        (whole batches); returns the number of states used."""
        was_training = classifier.training
        classifier.eval()
        moments = MomentAccumulator()
        for start in range(0, len(order), batch_size):
            batch = data.batch(order[start : start + batch_size], device)
            outputs: Any = classifier.encoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                                              output_hidden_states=True, use_cache=False)
            moments.add(token_points(outputs.hidden_states, batch.attention_mask).double().cpu().numpy())
            if moments.count >= self.c0_points:
                break
        classifier.train(was_training)
        covariance = moments.result().covariance()
        self.shrinkage_covariance = torch.as_tensor(np.asarray(covariance), dtype=torch.float64, device=device)
        return int(moments.count)

    def penalty(self, hidden_states: Sequence[torch.Tensor], attention_mask: torch.Tensor) -> torch.Tensor:
        if self.shrinkage_covariance is None:
            raise ValueError("I-STAR has no C0 yet; call refresh() at the start of the epoch")
        score = isoscore_star_torch(token_points(hidden_states, attention_mask), self.shrinkage_covariance, zeta=self.zeta)
        return self.weight * (1.0 - score)
