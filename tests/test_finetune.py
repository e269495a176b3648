"""Fine-tuning: plain equals a hand-written loop, every method trains, calibration layers, IsoBN, I-STAR."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from lmgeom.calibrate import make_calibrator
from lmgeom.finetune import METHODS, CalibrationLayer, FineTuneOptions, IsoBN, finetune, torch_calibration
from lmgeom.finetune.istar import IStar, token_points
from lmgeom.metrics.isoscore_star import covariance_of, isoscore_star

SRC = Path(__file__).resolve().parents[1] / "src"
WORDS = ["cat", "dog", "bank", "river", "money", "stone", "tree", "house"]
TEXTS = [f"The {WORDS[i % 8]} near the {WORDS[(3 * i + 1) % 8]} was seen on day {i}." for i in range(24)]
PAIRS = [(TEXTS[i], TEXTS[(i + 5) % 24]) for i in range(24)]
LABELS = np.arange(24) % 3
EVAL = {"dev": TEXTS[:6], "test": TEXTS[18:]}


pytestmark = pytest.mark.usefixtures("single_torch_thread")


def quick(**changes: object) -> FineTuneOptions:
    settings: dict = dict(epochs=2, batch_size=8, learning_rate=1e-3, recalibrate_every=2, device="cpu",
                          warmup_fraction=0.0, length_grouped=False, refit_after_last=False)  # the replayed recipe
    settings.update(changes)
    return FineTuneOptions(**settings)


def plain_finetune(texts: list, labels: np.ndarray, eval_texts: list, n_outputs: int, options: FineTuneOptions):
    """The recipe of lmgeom.finetune.train's docstring, written out with the tokenizer's own padding."""
    from lmgeom.encoders import load_encoder

    encoder = load_encoder("tiny-bert", device="cpu", compute_dtype="float32")
    model, tokenizer = encoder.model, copy.deepcopy(encoder.tokenizer)  # padding and truncation change its state

    def pooled(items: list) -> torch.Tensor:
        batch = tokenizer(items, padding=True, truncation=True, max_length=options.max_length,
                          return_special_tokens_mask=True, return_tensors="pt")
        hidden = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        keep = (batch["attention_mask"] * (1 - batch["special_tokens_mask"])).unsqueeze(-1).float()
        return (hidden * keep).sum(1) / keep.sum(1)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(options.seed)
        head = nn.Linear(model.config.hidden_size, n_outputs)
        parameters = [*model.parameters(), *head.parameters()]
        optimizer = torch.optim.AdamW(parameters, lr=options.learning_rate, weight_decay=0.01)
        total = options.epochs * -(-len(texts) // options.batch_size)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / total)
        rng = np.random.default_rng(options.seed)
        model.train()
        for _ in range(options.epochs):
            order = rng.permutation(len(texts))
            for start in range(0, len(texts), options.batch_size):
                rows = order[start : start + options.batch_size]
                outputs = head(pooled([texts[row] for row in rows]))
                if n_outputs == 1:
                    loss = nn.functional.mse_loss(outputs[:, 0], torch.tensor(labels[rows], dtype=torch.float32))
                else:
                    loss = nn.functional.cross_entropy(outputs, torch.tensor(labels[rows]))
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(parameters, 1.0)
                optimizer.step()
                schedule.step()
        model.eval()
        with torch.no_grad():
            vectors = torch.cat([pooled(eval_texts[i : i + options.batch_size]) for i in range(0, len(eval_texts), options.batch_size)])
            outputs = head(vectors).numpy()
    return vectors.numpy(), outputs


@pytest.mark.parametrize("n_outputs", [1, 3])
def test_none_equals_plain_finetuning(n_outputs):
    labels = LABELS.astype(np.float64) * 0.5 if n_outputs == 1 else LABELS
    options = quick(batch_size=5)  # a short last batch each epoch
    result = finetune("tiny-bert", train_inputs=TEXTS, train_labels=labels, eval_inputs={"dev": TEXTS[:11]},
                      n_outputs=n_outputs, method="none", options=options)
    vectors, outputs = plain_finetune(TEXTS, labels, TEXTS[:11], n_outputs, options)
    # Same weights: the fine-tuned encoder's vectors and the head's outputs agree (tolerance for the
    # different padding of the two batchings, nothing more).
    np.testing.assert_allclose(result.sentence_vectors["after"]["dev"], vectors, atol=1e-5)
    if n_outputs == 1:
        np.testing.assert_allclose(result.predictions["dev"], outputs[:, 0], atol=1e-5)
    else:
        np.testing.assert_array_equal(result.predictions["dev"], outputs.argmax(axis=1))
    assert not np.allclose(result.sentence_vectors["before"]["dev"], vectors, atol=1e-3)  # training moved the encoder
    assert "calibrated" not in result.sentence_vectors and result.method_params == {"method": "none"}


@pytest.mark.parametrize("method", METHODS)
def test_every_method_trains(method):
    params = {"cie": {"n_clusters": 3, "n_components": 2}, "flow": {"n_steps": 1, "hidden_size": 8, "n_epochs": 2}}.get(method, {})
    result = finetune("tiny-bert", train_inputs=PAIRS, train_labels=LABELS, eval_inputs={"dev": PAIRS[:5]}, n_outputs=3,
                      method=method, options=quick(method_params=params))
    assert result.predictions["dev"].dtype == np.int64 and result.predictions["dev"].shape == (5,)
    assert set(result.predictions["dev"]) <= {0, 1, 2}
    before, after = result.sentence_vectors["before"]["dev"], result.sentence_vectors["after"]["dev"]
    assert before.shape == after.shape == (5, 32) and np.isfinite(after).all()
    assert not np.allclose(before, after, atol=1e-4)  # gradients reached the encoder through every layer
    assert len(result.seconds_per_epoch) == 2 and result.method_params["method"] == method
    has_layer = method not in ("none", "istar")
    assert ("calibrated" in result.sentence_vectors) == has_layer
    if has_layer:
        assert np.isfinite(result.sentence_vectors["calibrated"]["dev"]).all()


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def start(self, stage: str, total: int, *, unit: str = "items") -> None:
        self.events.append((stage, f"start {total}"))

    def advance(self, stage: str, n: int = 1, *, note: str = "") -> None:
        self.events.append((stage, note))


def test_statistics_update_at_the_set_interval():
    recorder = Recorder()
    # 24 inputs in batches of 8: 3 steps an epoch, 9 steps in all; every 4 steps -> before steps 0, 4, 8.
    result = finetune("tiny-gpt2", train_inputs=TEXTS, train_labels=LABELS, eval_inputs=EVAL, n_outputs=3, method="whitening",
                      options=quick(epochs=3, recalibrate_every=4, pooling="last", method_params={"recalibration_inputs": 10}),
                      progress=recorder)
    fits = [note for stage, note in recorder.events if stage == "recalibration"]
    assert fits == ["start 3", "step 0", "step 4", "step 8"]
    assert sum(stage == "fine-tuning" and note.startswith("loss") for stage, note in recorder.events) == 9
    assert result.method_params["recalibrate_every"] == 4 and result.method_params["recalibration_inputs"] == 10
    assert any("re-estimated 3 times" in note and "10 training inputs" in note for note in result.notes)
    # The head reads whitened vectors: the calibrated test vectors are the after vectors through a whitening.
    calibrated, after = result.sentence_vectors["calibrated"]["test"], result.sentence_vectors["after"]["test"]
    assert calibrated.shape == after.shape and not np.allclose(calibrated, after)


_TWO_PROCESS_SCRIPT = """
import json, sys, numpy as np, torch
torch.set_num_threads(1)
from lmgeom.finetune import finetune, FineTuneOptions
spec = json.loads(sys.argv[1])
out = {}
for method, params in [("none", {}), ("cie", {"n_clusters": 3, "n_components": 2}), ("isobn", {}), ("istar", {})]:
    result = finetune("tiny-gpt2", train_inputs=spec["texts"], train_labels=np.array(spec["labels"]), eval_inputs={"dev": spec["texts"][:6]},
                      n_outputs=3, method=method, options=FineTuneOptions(epochs=2, batch_size=8, learning_rate=1e-3, recalibrate_every=2,
                      device="cpu", seed=7, method_params=params))
    out[method] = [result.predictions["dev"].tolist(), result.sentence_vectors["after"]["dev"].tolist()]
print(json.dumps(out))
"""


@pytest.mark.processes
def test_same_results_for_a_fixed_seed_in_two_processes():
    spec = json.dumps({"texts": TEXTS, "labels": LABELS.tolist()})
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    # Started together: most of each process's time is importing torch and transformers.
    processes = [subprocess.Popen([sys.executable, "-c", _TWO_PROCESS_SCRIPT, spec], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    outputs = [process.communicate() for process in processes]
    assert all(process.returncode == 0 for process in processes), [error for _, error in outputs]
    first, second = (json.loads(output) for output, _ in outputs)
    assert first == second  # bit for bit: predictions and vectors of every method
    assert first["none"][1] != first["istar"][1]


def test_the_shared_tokenizer_is_left_as_it_was():
    from lmgeom.encoders import load_encoder
    from lmgeom.encoders.hf import hash_tokenizer

    tokenizer = load_encoder("tiny-bert", device="cpu").tokenizer  # the process-wide cached one
    before = hash_tokenizer(tokenizer)
    finetune("tiny-bert", train_inputs=TEXTS[:4], train_labels=LABELS[:4], eval_inputs={"dev": TEXTS[:2]}, n_outputs=3,
             options=quick(epochs=1, max_length=8))
    assert hash_tokenizer(tokenizer) == before


# ---------------------------------------------------------------------------------------------
# the calibration layer


@pytest.mark.parametrize("method", ["abtt", "cie", "conceptor", "whitening", "standardize", "flow"])
def test_calibration_layer_is_the_calibrator_and_differentiable(method):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 6)) * np.geomspace(0.2, 3, 6) + 1.0
    fitted = make_calibrator(method)
    if method == "cie":
        fitted.set_params(n_clusters=3, n_components=2)
    if method == "flow":
        fitted.set_params(n_epochs=2, hidden_size=8, device="cpu")
    fitted.fit(X)
    layer = torch_calibration(fitted)
    x = torch.tensor(X[:20], dtype=torch.float32, requires_grad=True)
    y = layer(x)
    np.testing.assert_allclose(y.detach().numpy(), fitted.transform(X[:20]), atol=1e-4)
    weights = torch.tensor(rng.normal(size=y.shape), dtype=torch.float32)
    (gradient,) = torch.autograd.grad((y * weights).sum(), x)
    # Against finite differences of the calibrator's own (float64) transform, row by row.
    step, numeric = 1e-5, np.zeros((20, 6))
    for j in range(6):
        shifted = X[:20].copy()
        shifted[:, j] += step
        numeric[:, j] = ((fitted.transform(shifted) - fitted.transform(X[:20])) / step * weights.numpy()).sum(axis=1)
    np.testing.assert_allclose(gradient.numpy(), numeric, atol=2e-3, rtol=2e-3)
    assert not any(parameter.requires_grad for parameter in layer.parameters())


def test_calibration_layer_refits():
    rng = np.random.default_rng(1)
    layer = CalibrationLayer(lambda: make_calibrator("whitening"))
    with pytest.raises(ValueError, match="not been fitted"):
        layer(torch.zeros(2, 4))
    first, second = rng.normal(size=(100, 4)), rng.normal(size=(100, 4)) * 3 + 2
    layer.refit(first)
    shift = layer.transform.shift.clone()
    layer.refit(second)
    assert layer.n_refits == 2 and not torch.allclose(shift, layer.transform.shift)
    np.testing.assert_allclose(layer.transform.shift.numpy(), second.mean(axis=0), atol=1e-6)


# ---------------------------------------------------------------------------------------------
# IsoBN against the authors' algorithm written as loops


class IsoBNReference:
    def __init__(self, dim: int, momentum: float = 0.05, beta: float = 0.5, eps: float = 1e-3) -> None:
        self.cov, self.std = np.zeros((dim, dim)), np.zeros(dim)
        self.momentum, self.beta, self.eps, self.dim = momentum, beta, eps, dim

    def update(self, x: np.ndarray) -> None:
        m = len(x)
        mean = [sum(x[r, i] for r in range(m)) / m for i in range(self.dim)]
        for i in range(self.dim):
            for j in range(self.dim):
                cov_ij = sum((x[r, i] - mean[i]) * (x[r, j] - mean[j]) for r in range(m)) / m
                self.cov[i, j] += self.momentum * (cov_ij - self.cov[i, j])
            std_i = (sum((x[r, i] - mean[i]) ** 2 for r in range(m)) / m) ** 0.5
            self.std[i] += self.momentum * (std_i - self.std[i])

    def apply(self, x: np.ndarray) -> np.ndarray:
        scale = np.zeros(self.dim)
        for i in range(self.dim):
            gamma = sum(min(1.0, max(-1.0, self.cov[i, j] / (self.std[i] * self.std[j]))) ** 2 for j in range(self.dim)) / self.dim
            scale[i] = (gamma * self.std[i] + self.eps) ** -self.beta
        total = sum(self.cov[i, i] for i in range(self.dim))
        rescaled = sum(self.cov[i, i] * scale[i] ** 2 for i in range(self.dim))
        return x * scale * ((total / (rescaled + self.eps)) ** 0.5)


def test_isobn_matches_the_reference_in_train_and_eval():
    rng = np.random.default_rng(2)
    mixing = rng.normal(size=(5, 5))
    batches = [rng.normal(size=(8, 5)) @ mixing * np.array([5.0, 1, 1, 0.3, 2]) + 1 for _ in range(30)]
    module, reference = IsoBN(5).double(), IsoBNReference(5)
    module.train()
    for batch in batches:
        reference.update(batch)
        out = module(torch.tensor(batch))
        np.testing.assert_allclose(out.numpy(), reference.apply(batch), rtol=1e-10)
    assert int(module.num_batches_tracked) == 30
    module.eval()
    held_out = rng.normal(size=(4, 5))
    cov_before = module.running_cov.clone()
    np.testing.assert_allclose(module(torch.tensor(held_out)).numpy(), reference.apply(held_out), rtol=1e-10)
    assert torch.equal(cov_before, module.running_cov)  # eval does not update the statistics
    # The scale is a constant for autograd: d out / d x = diag(scale).
    x = torch.tensor(held_out, requires_grad=True)
    (gradient,) = torch.autograd.grad(module(x).sum(), x)
    np.testing.assert_allclose(gradient.numpy(), np.broadcast_to(module.scale().numpy(), (4, 5)), rtol=1e-12)
    # 30 batches in, the correlated high-variance dimension 0 is shrunk the most.
    assert module.scale().argmin() == 0


def test_isobn_needs_statistics_and_batches():
    with pytest.raises(ValueError, match="no statistics yet"):
        IsoBN(3).eval()(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="at least 2 rows"):
        IsoBN(3).train()(torch.zeros(1, 3))
    # after a first batch, a one-row batch (the end of a training set one row past a multiple of the
    # batch size) keeps the statistics and is scaled by them
    module = IsoBN(3).train()
    module(torch.tensor([[1.0, 2.0, 0.5], [3.0, -1.0, 2.0], [0.0, 0.5, 1.0]]))
    before = module.running_cov.clone(), int(module.num_batches_tracked)
    row = torch.tensor([[2.0, 1.0, -1.0]])
    torch.testing.assert_close(module(row), row * module.scale())
    assert torch.equal(module.running_cov, before[0]) and int(module.num_batches_tracked) == before[1]


# ---------------------------------------------------------------------------------------------
# I-STAR


def test_istar_penalty_is_the_isoscore_star_of_all_layers():
    torch.manual_seed(0)
    hidden = [torch.randn(2, 4, 6, dtype=torch.float64) * (layer + 1) for layer in range(3)]  # embeddings + 2 layers
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    points = token_points(hidden, mask)
    assert points.shape == (2 * 5, 6)  # layers 1..2, five real tokens each; the embedding output is left out
    C0 = covariance_of(np.random.default_rng(0).normal(size=(50, 6)))
    istar = IStar(weight=-5.0, zeta=0.2, c0_points=100)
    istar.shrinkage_covariance = torch.tensor(C0)
    expected = -5.0 * (1 - isoscore_star(points.numpy(), C0, zeta=0.2))
    assert istar.penalty(hidden, mask).item() == pytest.approx(expected, abs=1e-12)


def test_istar_direction_changes_isotropy_and_is_recorded():
    scores = {}
    for direction in ("raise", "lower"):
        result = finetune("tiny-bert", train_inputs=TEXTS, train_labels=LABELS, eval_inputs={"dev": TEXTS}, n_outputs=3,
                          method="istar", options=quick(epochs=3, method_params={"istar_direction": direction, "istar_lambda": 50.0}))
        params = result.method_params
        assert params["istar_direction"] == direction and params["istar_zeta"] == 0.2 and params["istar_c0_points"] == 250_000
        assert any(note.startswith("I-STAR C0 estimated from") for note in result.notes)
        scores[direction] = isoscore_star(result.sentence_vectors["after"]["dev"], zeta=0.0)
    assert scores["raise"] > scores["lower"]
    defaults = finetune("tiny-bert", train_inputs=TEXTS[:8], train_labels=LABELS[:8], eval_inputs={"dev": TEXTS[:2]}, n_outputs=3,
                        method="istar", options=quick(epochs=1)).method_params
    assert defaults["istar_lambda"] == 5.0 and defaults["istar_direction"] == "lower" and "- 5.0 * (1 - IsoScore*)" in defaults["istar_loss"]


# ---------------------------------------------------------------------------------------------
# bad input


def test_bad_input_is_named():
    def run(**changes: object) -> None:
        arguments: dict = dict(train_inputs=TEXTS[:4], train_labels=LABELS[:4], eval_inputs={"dev": TEXTS[:2]}, n_outputs=3)
        arguments.update(changes)
        finetune("tiny-bert", **arguments)

    with pytest.raises(ValueError, match="unknown fine-tuning method 'pca'; choose from none, abtt, cie, conceptor"):
        run(method="pca")
    with pytest.raises(ValueError, match=r"does not take \['alpha'\]"):
        run(method="whitening", options=quick(method_params={"alpha": 2}))
    with pytest.raises(ValueError, match="would change the width"):
        run(method="whitening", options=quick(method_params={"n_components": 4}))
    with pytest.raises(ValueError, match="istar_direction must be one of"):
        run(method="istar", options=quick(method_params={"istar_direction": "up"}))
    with pytest.raises(ValueError, match="integers in 0..2"):
        run(train_labels=np.array([0, 1, 2, 3]), options=quick())
    with pytest.raises(ValueError, match="one label per training input"):
        run(train_labels=LABELS[:3], options=quick())
    with pytest.raises(ValueError, match="train_inputs is empty"):
        run(train_inputs=[], train_labels=np.array([], dtype=int), options=quick())
    with pytest.raises(ValueError, match="no tokens besides special tokens"):
        run(eval_inputs={"dev": [""]}, options=quick())
    with pytest.raises(ValueError, match="mixes single texts and"):
        run(train_inputs=[TEXTS[0], PAIRS[1], TEXTS[2], TEXTS[3]], options=quick())
    with pytest.raises(ValueError, match="unknown pooling"):
        run(options=quick(pooling="max"))


def test_the_flow_layer_is_a_copy_of_the_fitted_flow():
    """Moving or changing the torch form (`.to(device)`, a joint flow's training) leaves the fitted
    calibrator's flow, which its saved state and a continued re-fit start from, as it was fitted."""
    X = np.random.default_rng(0).normal(size=(200, 6)) * np.geomspace(0.2, 3, 6) + 1.0
    fitted = make_calibrator("flow").set_params(n_epochs=2, hidden_size=8, device="cpu").fit(X)
    fitted_state = {name: tensor.clone() for name, tensor in fitted.module_.state_dict().items()}
    layer = torch_calibration(fitted)
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.add_(0.5)
    layer.double()
    for name, tensor in fitted.module_.state_dict().items():
        torch.testing.assert_close(tensor, fitted_state[name], rtol=0, atol=0)
