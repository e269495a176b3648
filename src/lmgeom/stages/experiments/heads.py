"""Heads on frozen features: scikit-learn linear models and a small MLP (calibration experiment), and
a linear probe over one layer or a learned `ScalarMix` of layers (layer experiment).

Examples are "units" arrays (n, k, dim): k = 1 for a sentence or a token, k = 2 for a sentence pair,
whose head input is [u, v, |u - v|, u * v] (SentEval's pair features).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.neural_network import MLPClassifier, MLPRegressor

from lmgeom.errors import InputError
from lmgeom.mix import ScalarMix

HEADS = ("logreg", "mlp")
LOGREG_C = 1.0
RIDGE_ALPHA = 1.0
MLP_HIDDEN = 256
MLP_ALPHA = 1e-4
VALIDATION_FRACTION = 0.1


def combine(units: np.ndarray) -> np.ndarray:
    """Head input of (n, k, dim) units: the vector itself, or a pair's [u, v, |u - v|, u * v]."""
    if units.shape[1] == 1:
        return units[:, 0]
    u, v = units[:, 0], units[:, 1]
    return np.concatenate([u, v, np.abs(u - v), u * v], axis=1)


def head_settings(head: str, regression: bool) -> dict[str, Any]:
    """What a head is, with its regularisation, as recorded in every result."""
    if head == "logreg":
        return ({"head": "ridge", "regularisation": f"ridge alpha={RIDGE_ALPHA}"} if regression else
                {"head": "logreg", "regularisation": f"L2, C={LOGREG_C} (lbfgs)"})
    if head == "mlp":
        return {"head": "mlp", "regularisation": f"one hidden layer of {MLP_HIDDEN} (relu), L2 alpha={MLP_ALPHA}, "
                f"early stopping on a seeded {VALIDATION_FRACTION:.0%} slice of train"}
    raise InputError(f"unknown head {head!r}; choose from {', '.join(HEADS)}")


def fit_predict_sklearn(head: str, regression: bool, X_train: np.ndarray, y_train: np.ndarray,
                        X_eval: dict[str, np.ndarray], *, seed: int) -> dict[str, np.ndarray]:
    """Fit the head on the training rows (float64) and predict every evaluation split."""
    model: Any
    if head == "logreg":
        model = Ridge(alpha=RIDGE_ALPHA) if regression else LogisticRegression(C=LOGREG_C, max_iter=2000)
    elif head == "mlp":
        kind = MLPRegressor if regression else MLPClassifier
        model = kind(hidden_layer_sizes=(MLP_HIDDEN,), alpha=MLP_ALPHA, early_stopping=True,
                     validation_fraction=VALIDATION_FRACTION, max_iter=200, random_state=seed)
    else:
        raise InputError(f"unknown head {head!r}; choose from {', '.join(HEADS)}")
    model.fit(X_train.astype(np.float64), y_train)
    return {split: model.predict(X.astype(np.float64)) for split, X in X_eval.items()}


# ---- the linear probe of the layer experiment ------------------------------------------------


STANDARDIZE_NOTE = ("each layer standardised (z-scored per feature) with training statistics before the probe or the "
                    "mix: a calibration of its own, and a deviation from Peters et al. (2018), who mix raw layers")
RAW_NOTE = "raw layers (not standardised), as Peters et al. (2018) mix them"


@dataclass
class ProbeOptions:
    """The linear probe. `mix_l2` is Peters et al.'s lambda: `mix_l2 * sum_j w_j^2` on the ScalarMix's
    pre-softmax weights added to the loss, as bilm-tf's `weight_layers` does, the mix's weights and
    gamma then left out of the Adam weight decay (bilm-tf regularises neither otherwise); None adds no
    lambda term and the weight decay covers the mix as every other parameter. `mix_layer_norm`
    normalises each layer of a unit (a word, a sentence vector, a pair) before mixing; `standardize`
    z-scores every layer with training statistics first."""

    epochs: int = 40
    batch_size: int = 256
    learning_rate: float = 3e-3
    weight_decay: float = 1e-4
    patience: int = 4
    validation_fraction: float = VALIDATION_FRACTION
    mix_l2: float | None = None
    mix_layer_norm: bool = False
    standardize: bool = True

    def __post_init__(self) -> None:
        if self.mix_l2 is not None and not (np.isfinite(self.mix_l2) and self.mix_l2 >= 0):
            raise InputError(f"`mix_l2` must be a number >= 0, got {self.mix_l2}", param="mix_l2")

    def describe(self) -> str:
        return (f"linear, Adam lr={self.learning_rate}, weight decay={self.weight_decay}, at most {self.epochs} epochs, "
                f"early stopping (patience {self.patience}) on a seeded {self.validation_fraction:.0%} slice of train; "
                + ("each layer standardised with training statistics" if self.standardize else "raw layers"))

    def describe_mix(self) -> str:
        """How a ScalarMix of these options is regularised and normalised."""
        l2 = ("no lambda term (the probe's weight decay covers the mix weights and gamma)" if self.mix_l2 is None else
              f"lambda={self.mix_l2:g}: lambda * sum_j w_j^2 on the pre-softmax weights added to the mean loss of a batch "
              "(bilm-tf's weight_layers), weights and gamma without weight decay")
        norm = ("each layer of a unit layer-normalised before mixing (per unit; bilm-tf pools the statistics over the "
                "batch's tokens)" if self.mix_layer_norm else "no layer norm")
        return f"{l2}; {norm}"


@dataclass
class ProbeResult:
    predictions: dict[str, np.ndarray]
    mix_weights: list[float] = field(default_factory=list)  # softmax(w) of a learned ScalarMix
    mix_gamma: float | None = None
    epochs_run: int = 0


class _Probe(torch.nn.Module):
    def __init__(self, n_layers: int, pair: bool, dim: int, n_outputs: int, *, mix_l2: float | None = None,
                 mix_layer_norm: bool = False) -> None:
        super().__init__()
        self.mix = ScalarMix(n_layers, layer_norm=mix_layer_norm) if n_layers > 1 else None
        self.mix_l2 = mix_l2
        self.pair = pair
        self.linear = torch.nn.Linear(dim * (4 if pair else 1), n_outputs)

    def regulariser(self) -> torch.Tensor:
        """lambda * sum_j w_j^2 of the mix (bilm-tf's `l2_coef * reduce_sum(square(W))`), or 0."""
        if self.mix is None or self.mix_l2 is None:
            return torch.zeros(())
        return self.mix_l2 * self.mix.l2_penalty()

    def parameter_groups(self, weight_decay: float) -> list[dict[str, Any]]:
        """Adam's groups: with a lambda, the mix's weights and gamma take no weight decay."""
        if self.mix is None or self.mix_l2 is None:
            return [{"params": list(self.parameters()), "weight_decay": weight_decay}]
        return [{"params": list(self.linear.parameters()), "weight_decay": weight_decay},
                {"params": list(self.mix.parameters()), "weight_decay": 0.0}]

    def forward(self, units: torch.Tensor) -> torch.Tensor:  # (batch, n_layers, k, dim)
        mixed = self.mix(units.transpose(0, 1)) if self.mix is not None else units[:, 0]
        if self.pair:
            u, v = mixed[:, 0], mixed[:, 1]
            features = torch.cat([u, v, (u - v).abs(), u * v], dim=1)
        else:
            features = mixed[:, 0]
        return self.linear(features)


def fit_probe(train: np.ndarray, labels: np.ndarray, evaluation: dict[str, np.ndarray], *, regression: bool,
              n_classes: int, seed: int, metric: Any, options: ProbeOptions = ProbeOptions()) -> ProbeResult:
    """Train the linear probe on `train` (n, n_layers, k, dim): one layer, or a ScalarMix of several,
    chosen by the epoch with the best `metric(y, prediction)` on a seeded slice of train."""
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    if options.standardize:
        mean = train.mean(axis=(0, 2), keepdims=True)
        std = train.std(axis=(0, 2), keepdims=True)
        std[std == 0] = 1.0
    else:
        mean, std = np.zeros((1,) * train.ndim), np.ones((1,) * train.ndim)

    def tensor(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(((x - mean) / std).astype(np.float32))

    order = np.random.default_rng(seed).permutation(len(train))
    n_valid = max(1, int(round(options.validation_fraction * len(train))))
    valid_rows, fit_rows = order[:n_valid], order[n_valid:]
    X_fit, X_valid = tensor(train[fit_rows]), tensor(train[valid_rows])
    target_mean, target_std = (float(labels.mean()), float(labels.std()) or 1.0) if regression else (0.0, 1.0)
    y_fit = torch.from_numpy(((labels[fit_rows] - target_mean) / target_std).astype(np.float32)) if regression \
        else torch.from_numpy(labels[fit_rows].astype(np.int64))
    probe = _Probe(train.shape[1], train.shape[2] == 2, train.shape[3], 1 if regression else n_classes,
                   mix_l2=options.mix_l2, mix_layer_norm=options.mix_layer_norm)
    optimiser = torch.optim.Adam(probe.parameter_groups(options.weight_decay), lr=options.learning_rate)
    loss_function: Any = torch.nn.MSELoss() if regression else torch.nn.CrossEntropyLoss()

    def predict(X: torch.Tensor) -> np.ndarray:
        with torch.no_grad():
            out = torch.cat([probe(X[i : i + 4096]) for i in range(0, len(X), 4096)]) if len(X) else torch.empty(0, 1)
        return out[:, 0].double().numpy() * target_std + target_mean if regression else out.argmax(dim=1).numpy()

    best_score, best_state, stale, epoch = -np.inf, None, 0, 0
    for epoch in range(1, options.epochs + 1):
        probe.train()
        for batch in torch.randperm(len(X_fit), generator=generator).split(options.batch_size):
            optimiser.zero_grad()
            output = probe(X_fit[batch])
            loss = loss_function(output[:, 0], y_fit[batch]) if regression else loss_function(output, y_fit[batch])
            (loss + probe.regulariser()).backward()
            optimiser.step()
        probe.eval()
        value = metric(labels[valid_rows], predict(X_valid))
        if np.isfinite(value) and value > best_score:
            best_score, best_state, stale = value, {k: v.clone() for k, v in probe.state_dict().items()}, 0
        else:
            stale += 1
            if stale >= options.patience:
                break
    if best_state is not None:
        probe.load_state_dict(best_state)
    probe.eval()
    result = ProbeResult({split: predict(tensor(X)) for split, X in evaluation.items()}, epochs_run=epoch)
    if probe.mix is not None:
        result.mix_weights = [float(w) for w in probe.mix.normalized_weights().detach()]
        result.mix_gamma = float(probe.mix.gamma.detach())
    return result
