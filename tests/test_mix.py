"""ScalarMix against hand-computed mixes and per-sequence layer normalisation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lmgeom.mix import ScalarMix


@pytest.fixture
def layers():
    torch.manual_seed(0)
    return torch.randn(3, 2, 5, 4, dtype=torch.float64)  # (layers, batch, time, dim)


def test_uniform_weights_give_the_layer_mean(layers):
    mix = ScalarMix(3).double()
    torch.testing.assert_close(mix(layers), layers.mean(dim=0))
    torch.testing.assert_close(mix(list(layers)), layers.mean(dim=0))  # a list works as a stacked tensor
    torch.testing.assert_close(mix.normalized_weights(), torch.full((3,), 1 / 3, dtype=torch.float64))


def test_weights_and_gamma(layers):
    mix = ScalarMix(3, initial_weights=[0.0, 1.0, 2.0]).double()
    with torch.no_grad():
        mix.gamma.fill_(2.5)
    s = np.exp([0.0, 1.0, 2.0]) / np.exp([0.0, 1.0, 2.0]).sum()
    expected = 2.5 * sum(s[j] * layers[j] for j in range(3))
    torch.testing.assert_close(mix(layers), expected)
    np.testing.assert_allclose(mix.normalized_weights().detach().numpy(), s)


def reference_layer_norm(x, mask):
    """Per sequence: mean and variance over its unmasked positions and all features."""
    out = np.zeros_like(x)
    for b in range(x.shape[0]):
        real = x[b][mask[b]]
        out[b] = (x[b] - real.mean()) / np.sqrt(real.var() + 1e-12)
    return out


def test_masked_layer_norm_is_per_sequence_and_ignores_padding(layers):
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    mix = ScalarMix(3, layer_norm=True, initial_weights=[0.5, -1.0, 0.2]).double()
    out = mix(layers, mask)
    s = mix.normalized_weights().detach().numpy()
    x, m = layers.numpy(), mask.numpy()
    expected = sum(s[j] * reference_layer_norm(x[j], m) for j in range(3)) * m[..., None]
    np.testing.assert_allclose(out.detach().numpy(), expected, atol=1e-12)
    changed = layers.clone()
    changed[:, 0, 3:] = 1e6  # padding of the first sequence
    changed[:, 0, 4, 0] = float("nan")
    torch.testing.assert_close(mix(changed, mask), out)
    # a sequence's result does not depend on the other sequences of the batch
    torch.testing.assert_close(mix(layers[:, 1:], mask[1:]), out[1:])
    assert (out[0, 3:] == 0).all()


def test_gradients_reach_weights_and_gamma(layers):
    mix = ScalarMix(3, layer_norm=True).double()
    mix(layers).pow(2).sum().backward()
    assert mix.weights.grad is not None and mix.weights.grad.abs().sum() > 0
    assert mix.gamma.grad is not None and mix.gamma.grad.abs() > 0
    frozen = ScalarMix(3, trainable=False)
    assert not any(p.requires_grad for p in frozen.parameters())


def test_l2_penalty_is_bilm_tf_sum_of_squares():
    assert ScalarMix(4).l2_penalty().item() == 0.0
    assert ScalarMix(4, initial_weights=[2.0] * 4).l2_penalty().item() == pytest.approx(16.0)  # not centred
    mix = ScalarMix(3, initial_weights=[1.0, 0.5, -2.0])
    assert mix.l2_penalty().item() == pytest.approx(1.0 + 0.25 + 4.0)
    mix.l2_penalty().backward()
    torch.testing.assert_close(mix.weights.grad, torch.tensor([2.0, 1.0, -4.0]))


def test_bad_input():
    with pytest.raises(ValueError, match="initial_weights has 2 values for 3 layers"):
        ScalarMix(3, initial_weights=[0.0, 1.0])
    mix = ScalarMix(3)
    with pytest.raises(ValueError, match="built for 3 layers but got 2"):
        mix(torch.zeros(2, 1, 4, 5))
    with pytest.raises(ValueError, match="mask has shape"):
        mix(torch.zeros(3, 1, 4, 5), torch.ones(1, 3))
