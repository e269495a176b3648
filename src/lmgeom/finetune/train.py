"""`finetune`: a transformers encoder plus a linear head on its pooled sentence vector, trained with
AdamW, optionally with isotropy calibration in the forward pass or an isotropy regulariser.

The recipe (also what `method="none"` is, step for step; tests/test_finetune.py replays it):
1. the model loads through `lmgeom.encoders.load_encoder` in float32; inputs are tokenized once
   (pairs as the tokenizer joins them), truncated to `max_length`;
2. inside a forked torch RNG seeded with `seed`: the head `nn.Linear(dim, n_outputs)` is created
   (torch's default init), then every dropout mask of training draws from that RNG;
3. epoch e draws its batches from `numpy.random.default_rng(seed)`: with `length_grouped` (the
   default) `length_grouped_batches` (a random permutation cut into pools of `LENGTH_POOL_BATCHES`
   batches, each pool sorted by token length and cut into batches, the batches shuffled), else the
   e-th permutation cut into batches; a batch is padded to its longest input;
4. the sentence vector is the mean of the top layer's pieces with special tokens and padding
   masked out (`pooling="last"`: the last such piece, for decoders; `"cls"`: the first position);
5. loss: cross-entropy (n_outputs >= 2) or mean squared error (n_outputs = 1); AdamW (torch's
   defaults but the learning rate, weight decay 0.01) over the encoder and the head; gradients
   clipped at norm 1.0; the learning rate rises linearly from 0 over the first `warmup_fraction`
   of the steps, then decays linearly to 0 at the last step.
Predictions and sentence vectors are computed in eval mode (no dropout) without gradients.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from lmgeom.errors import InputError
from lmgeom.calibrate import METHODS as CALIBRATORS
from lmgeom.calibrate import Calibrator
from lmgeom.device import resolve_device
from lmgeom.finetune.calibration import CalibrationLayer, CalibrationOptions, guard_fires, layer_isoscore
from lmgeom.finetune.isobn import ISOBN_BETA, ISOBN_EPS, ISOBN_MOMENTUM, IsoBN
from lmgeom.finetune.istar import IStar
from lmgeom.finetune.model import Classifier, Inputs, Tokenized, pool
from lmgeom.metrics.isoscore_star import ISOSCORE_STAR_C0_POINTS, ISOSCORE_STAR_ZETA
from lmgeom.progress import NoProgress, Progress


# Calibrators whose transform runs inside the forward pass (each has a differentiable torch form).
CALIBRATION_METHODS = ("abtt", "cie", "conceptor", "whitening", "standardize", "flow")
METHODS = ("none", *CALIBRATION_METHODS, "isobn", "istar")
POOLINGS = ("mean", "last", "cls")
POOLING_NOTES = {
    "mean": "sentence vector: mean of the top layer's pieces, special tokens and padding excluded",
    "last": "sentence vector: last of the top layer's pieces, special tokens and padding excluded",
    "cls": "sentence vector: the top layer's state at the first position ([CLS] for BERT models)",
}
# Batches per pool that length grouping sorts by length (transformers' LengthGroupedSampler uses 50).
LENGTH_POOL_BATCHES = 50
WEIGHT_DECAY = 0.01
MAX_GRADIENT_NORM = 1.0
FLOW_GRADIENT_NORM = 10.0  # the joint flow's parameters, clipped as FlowCalibrator's training clips them
# Training inputs whose vectors each re-estimation of a calibrator is fitted on (a fixed seeded subset).
RECALIBRATION_INPUTS = 2048
# I-STAR's defaults: the paper's released script fine-tunes with zeta 0.2 and lambda -5 (lowering
# isotropy), C0 from up to 250,000 token states of the training data at the start of each epoch.
ISTAR_LAMBDA = 5.0
ISTAR_DIRECTIONS = ("lower", "raise")


@dataclass(frozen=True)
class FineTuneOptions:
    """How to fine-tune. `recalibrate_every`: steps between re-estimations of a calibrator's
    statistics (step 0 included); `refit_after_last`: re-estimate them once more after the last
    step, so the layer the predictions go through is fitted to the final encoder. `warmup_fraction`:
    the share of the steps over which the learning rate rises linearly from 0. `length_grouped`:
    batches of similar token length (see `length_grouped_batches`). `method_params`: the method's
    own settings (see `finetune`). `calibration`: how a calibrator's layer is kept fitted
    (`CalibrationOptions`, or a mapping of its fields; calibration methods only)."""

    epochs: int = 3
    batch_size: int = 32
    learning_rate: float = 2e-5
    max_length: int = 128
    warmup_fraction: float = 0.06
    length_grouped: bool = True
    max_steps: int | None = None  # stop after this many steps (the schedule spans them): smoke tests
    recalibrate_every: int = 100
    refit_after_last: bool = True
    pooling: str = "mean"
    seed: int = 0
    device: str = "auto"
    method_params: dict[str, Any] = field(default_factory=dict)
    calibration: CalibrationOptions = field(default_factory=CalibrationOptions)

    def __post_init__(self) -> None:
        if not isinstance(self.calibration, CalibrationOptions):
            if not isinstance(self.calibration, dict):
                raise InputError(f"FineTuneOptions.calibration must be CalibrationOptions or a dict of its fields, "
                                 f"got {type(self.calibration).__name__}", param="calibration")
            object.__setattr__(self, "calibration", CalibrationOptions.from_dict(self.calibration))


@dataclass
class FineTuneResult:
    """predictions: per evaluation split, class ids (int64) or regression scores (float32).
    sentence_vectors: {"before" | "after": {split: (n, dim) float32}} pooled vectors of the model
    before and after fine-tuning, plus "calibrated" (what the head reads) for methods with a layer
    between the pooled vector and the head (the calibrators and isobn).
    method_params: the method's hyper-parameters as used, defaults included."""

    predictions: dict[str, np.ndarray]
    sentence_vectors: dict[str, dict[str, np.ndarray]]
    seconds_per_epoch: list[float]
    method_params: dict[str, Any]
    notes: list[str]
    n_steps: int = 0
    padding_fraction: float = 0.0  # padding positions / all positions of the training batches
    # calibrators: the layer's output on its fit vectors just before each re-fit (and after the last
    # step), i.e. what the stale fit did to the encoder's current vectors: step, isoscore, log_iw, finite
    layer_checks: list[dict[str, Any]] = field(default_factory=list)
    # calibrators: re-fit steps, the guard's checks and re-fits, the joint flow's NLL and the variance
    # penalty per epoch (means over the training batches)
    layer_log: dict[str, Any] = field(default_factory=dict)


def length_grouped_batches(lengths: np.ndarray, batch_size: int, rng: np.random.Generator, *,
                           pool_batches: int = LENGTH_POOL_BATCHES) -> list[list[int]]:
    """One epoch's batches of row indexes, each row once: a random permutation is cut into pools of
    `pool_batches * batch_size` rows, each pool is sorted by length (stable, so ties keep the random
    order) and cut into batches, and the batches of all pools are shuffled. A batch then pads to
    near its members' length instead of the longest input of a random batch; the pools keep the
    batches' membership random from epoch to epoch. Deterministic for a given `rng` state."""
    lengths = np.asarray(lengths)
    if batch_size < 1 or pool_batches < 1:
        raise InputError(f"batch_size and pool_batches must be >= 1, got {batch_size} and {pool_batches}")
    order = rng.permutation(len(lengths))
    pool_size = batch_size * pool_batches
    batches: list[list[int]] = []
    for start in range(0, len(order), pool_size):
        members = order[start : start + pool_size]
        members = members[np.argsort(lengths[members], kind="stable")]
        batches += [members[i : i + batch_size].tolist() for i in range(0, len(members), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


def random_batches(n_rows: int, batch_size: int, rng: np.random.Generator) -> list[list[int]]:
    """One epoch's batches: a random permutation cut into consecutive batches."""
    order = rng.permutation(n_rows).tolist()
    return [order[i : i + batch_size] for i in range(0, n_rows, batch_size)]


def padding_fraction(lengths: np.ndarray, batches: Sequence[Sequence[int]]) -> float:
    """Padding positions over all positions when each batch pads to its longest row."""
    lengths = np.asarray(lengths)
    padded = sum(len(rows) * int(lengths[list(rows)].max()) for rows in batches)
    return 1.0 - float(sum(int(lengths[list(rows)].sum()) for rows in batches)) / padded


def warmup_linear(step: int, total_steps: int, warmup_steps: int) -> float:
    """The learning-rate factor of step `step` (0-based): step / warmup_steps during warm-up, then a
    linear decay to 0 at `total_steps` (transformers' `get_linear_schedule_with_warmup`)."""
    if step < warmup_steps:
        return step / warmup_steps
    return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))


def _method_settings(method: str, params: dict[str, Any], *, seed: int, device: torch.device) -> tuple[dict[str, Any], Callable[[], Calibrator] | None]:
    """Checked method parameters with defaults filled in, and the calibrator factory (calibration methods)."""
    params = dict(params)
    if method == "none":
        allowed: dict[str, Any] = {}
    elif method in CALIBRATION_METHODS:
        defaults = CALIBRATORS[method]().get_params()
        if "random_state" in defaults:
            defaults["random_state"] = seed
        if "device" in defaults:
            defaults["device"] = str(device)
        if method == "whitening":
            # ZCA: a re-fit on slightly moved vectors gives a slightly different map; PCA whitening's
            # eigenvector signs and order can flip between fits, scrambling what the head has learnt.
            defaults["zca"] = True
        allowed = {**defaults, "recalibration_inputs": RECALIBRATION_INPUTS}
        if method == "flow":
            allowed["continue_refits"] = False  # True: each re-fit starts from the previous flow (ContinuedFlow)
    elif method == "isobn":
        allowed = {"momentum": ISOBN_MOMENTUM, "beta": ISOBN_BETA, "eps": ISOBN_EPS}
    else:
        allowed = {"istar_lambda": ISTAR_LAMBDA, "istar_direction": "lower", "istar_zeta": ISOSCORE_STAR_ZETA,
                   "istar_c0_points": ISOSCORE_STAR_C0_POINTS}
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise InputError(f"method {method!r} does not take {unknown}; it takes {sorted(allowed) or 'no parameters'}")
    settings = {**allowed, **params}
    if method == "istar" and settings["istar_direction"] not in ISTAR_DIRECTIONS:
        raise InputError(f"istar_direction must be one of {ISTAR_DIRECTIONS}, got {settings['istar_direction']!r}")
    if method not in CALIBRATION_METHODS:
        return settings, None
    if settings.get("n_components") is not None and method == "whitening":
        raise InputError("whitening with n_components would change the width of the vector the head reads, which "
                         "fine-tuning keeps fixed; leave n_components unset (whitening keeps every direction)")
    if int(settings["recalibration_inputs"]) < 2:
        raise InputError(f"recalibration_inputs must be >= 2, got {settings['recalibration_inputs']}")
    estimator_params = {key: value for key, value in settings.items() if key not in ("recalibration_inputs", "continue_refits")}

    def make() -> Calibrator:
        return CALIBRATORS[method](**estimator_params)

    return settings, make


def _check_options(options: FineTuneOptions, method: str, n_outputs: int) -> None:
    if method not in METHODS:
        raise InputError(f"unknown fine-tuning method {method!r}; choose from {', '.join(METHODS)}")
    if options.pooling not in POOLINGS:
        raise InputError(f"unknown pooling {options.pooling!r}; choose one of {POOLINGS}")
    if not 0 <= options.warmup_fraction < 1:
        raise InputError(f"FineTuneOptions.warmup_fraction must be in [0, 1), got {options.warmup_fraction}")
    if options.max_steps is not None and options.max_steps < 1:
        raise InputError(f"FineTuneOptions.max_steps must be >= 1 or None, got {options.max_steps}")
    for name in ("epochs", "batch_size", "recalibrate_every"):
        if getattr(options, name) < 1:
            raise InputError(f"FineTuneOptions.{name} must be >= 1, got {getattr(options, name)}")
    if options.max_length < 2:
        raise InputError(f"FineTuneOptions.max_length must be >= 2, got {options.max_length}")
    if not options.learning_rate > 0:
        raise InputError(f"FineTuneOptions.learning_rate must be > 0, got {options.learning_rate}")
    if n_outputs < 1:
        raise InputError(f"n_outputs must be 1 (regression) or the number of classes (>= 2), got {n_outputs}")
    if method in ("isobn", "istar") and options.batch_size < 2:
        raise InputError(f"{method} estimates statistics from each batch, so it needs batch_size >= 2")
    if method in CALIBRATION_METHODS:
        options.calibration.check_method(method)
        if options.calibration.refit_on == "batch" and options.batch_size < 2:
            raise InputError("refit_on 'batch' estimates moments from each batch, so it needs batch_size >= 2",
                             param="batch_size")
    elif options.calibration.changed():
        raise InputError(f"FineTuneOptions.calibration {options.calibration.changed()} applies to the calibration "
                         f"methods ({', '.join(CALIBRATION_METHODS)}), not {method!r}", param="calibration")


def _targets(labels: np.ndarray, n_inputs: int, n_outputs: int) -> torch.Tensor:
    labels = np.asarray(labels)
    if labels.shape != (n_inputs,):
        raise InputError(f"train_labels must have one label per training input ({n_inputs}), got shape {labels.shape}")
    if n_outputs == 1:
        if not np.issubdtype(labels.dtype, np.number) or not np.isfinite(labels).all():
            raise InputError("regression (n_outputs=1) needs finite numeric train_labels")
        return torch.as_tensor(labels, dtype=torch.float32)
    if not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0 or labels.max() >= n_outputs:
        raise InputError(f"classification labels must be integers in 0..{n_outputs - 1} (n_outputs={n_outputs}); "
                         f"got {labels.dtype} values from {labels.min()} to {labels.max()}")
    return torch.as_tensor(labels, dtype=torch.long)


def _load(model: str, device: torch.device) -> tuple[nn.Module, Any, int]:
    from lmgeom.encoders import HFEncoder, load_encoder

    encoder = load_encoder(model, device=str(device), compute_dtype="float32")
    if not isinstance(encoder, HFEncoder):
        raise InputError(f"fine-tuning needs a transformers model; {model!r} loads as {type(encoder).__name__}")
    # A copy: tokenizing with truncation changes a fast tokenizer's state, and the tiny models share
    # one cached tokenizer per process (whose definition is part of the store's model fingerprint).
    return encoder.model, copy.deepcopy(encoder.tokenizer), encoder.pad_id


def finetune(
    model: str,
    *,
    train_inputs: Inputs,
    train_labels: np.ndarray,
    eval_inputs: dict[str, Inputs],
    n_outputs: int,
    method: str = "none",
    options: FineTuneOptions = FineTuneOptions(),
    progress: Progress | None = None,
) -> FineTuneResult:
    """Fine-tune `model` (a registry name such as `minilm`, `tiny-bert`, or a transformers path) with a
    linear head on its pooled sentence vector, and predict every split of `eval_inputs`.

    Methods: `none` (plain fine-tuning); `abtt`, `cie`, `conceptor`, `whitening`, `standardize`, `flow`
    (the calibrator applied to the pooled vector inside the forward pass, its statistics re-fitted on
    the vectors of a fixed seeded subset of `recalibration_inputs` training inputs every
    `recalibrate_every` steps, without gradients; gradients flow through the transform;
    `method_params` take the calibrator's constructor parameters); `isobn` (IsoBN on the pooled
    vector; `momentum`, `beta`, `eps`); `istar` (I-STAR: the loss gains s * lambda * (1 - IsoScore*)
    of the token states of every layer, s = +1 to raise isotropy, -1 to lower it; `istar_lambda`,
    `istar_direction`, `istar_zeta`, `istar_c0_points`). Deterministic for a fixed seed on one
    machine. See docs/finetune.md."""
    _check_options(options, method, n_outputs)
    progress = progress or NoProgress()
    device = resolve_device(options.device)
    settings, make_calibrator = _method_settings(method, options.method_params, seed=options.seed, device=device)
    if not eval_inputs:
        raise InputError("eval_inputs is empty; give at least one evaluation split")
    encoder, tokenizer, pad_id = _load(model, device)
    config: Any = encoder.config
    positions = getattr(config, "max_position_embeddings", None)
    max_length = options.max_length if positions is None else min(options.max_length, int(positions))
    train = Tokenized(tokenizer, train_inputs, max_length=max_length, pad_id=pad_id, name="train_inputs")
    targets = _targets(train_labels, len(train), n_outputs).to(device)
    evaluation = {split: Tokenized(tokenizer, inputs, max_length=max_length, pad_id=pad_id, name=f"eval_inputs[{split!r}]")
                  for split, inputs in eval_inputs.items()}
    dim = int(config.hidden_size)
    notes = [POOLING_NOTES[options.pooling]]
    if max_length < options.max_length:
        notes.append(f"inputs truncated to {max_length} tokens, the model's position limit (max_length {options.max_length})")
    cuda_devices = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda_devices):
        torch.manual_seed(options.seed)
        head = nn.Linear(dim, n_outputs).to(device)
        layer: nn.Module | None = None
        if make_calibrator is not None:
            layer = CalibrationLayer(make_calibrator, device=device, continue_flow=bool(settings.get("continue_refits", False)),
                                     options=options.calibration)
        elif method == "isobn":
            layer = IsoBN(dim, momentum=settings["momentum"], beta=settings["beta"], eps=settings["eps"]).to(device)
        classifier = Classifier(encoder, head, layer, options.pooling)
        batch_size = options.batch_size
        sentence_vectors: dict[str, dict[str, np.ndarray]] = {
            "before": {split: _pooled(classifier, data, range(len(data)), batch_size, device) for split, data in evaluation.items()}}
        istar = None
        if method == "istar":
            sign = 1.0 if settings["istar_direction"] == "raise" else -1.0
            istar = IStar(weight=sign * float(settings["istar_lambda"]), zeta=float(settings["istar_zeta"]),
                          c0_points=int(settings["istar_c0_points"]))
        layer_checks: list[dict[str, Any]] = []
        layer_log: dict[str, Any] = {}
        seconds_per_epoch, n_steps, padding = _train(classifier, train, targets, n_outputs, options, device, progress, istar=istar,
                                   recalibration_inputs=int(settings.get("recalibration_inputs", 0)), notes=notes,
                                   layer_checks=layer_checks, layer_log=layer_log)
    after = {split: _evaluate(classifier, data, batch_size, device) for split, data in evaluation.items()}
    sentence_vectors["after"] = {split: pooled for split, (pooled, _, _) in after.items()}
    if layer is not None:
        sentence_vectors["calibrated"] = {split: features for split, (_, features, _) in after.items()}
    predictions = {split: logits[:, 0] if n_outputs == 1 else logits.argmax(axis=1) for split, (_, _, logits) in after.items()}
    method_params = {"method": method, **settings}
    if istar is not None:
        method_params.update(istar_points="token states of layers 1..L, padding excluded",
                             istar_c0_refresh="start of every epoch, model in eval mode",
                             istar_loss=f"task loss {'+' if istar.weight > 0 else '-'} {abs(istar.weight)} * (1 - IsoScore*)")
    if make_calibrator is not None:
        method_params["recalibrate_every"] = options.recalibrate_every
    if make_calibrator is not None:
        method_params["refit_after_last"] = options.refit_after_last
        method_params["calibration"] = options.calibration.to_dict()
        method_params["calibrator_gradient"] = (
            "the flow's parameters trained (task loss + weighted NLL); gradients flow through it into the encoder"
            if options.calibration.flow_training == "joint" and method == "flow" else
            "the calibrator's statistics and parameters frozen (no gradient); gradients flow through the transform "
            "into the encoder")
    return FineTuneResult(predictions, sentence_vectors, seconds_per_epoch, method_params, notes, n_steps, padding,
                          layer_checks, layer_log)


def _by_length(data: Tokenized, rows: Sequence[int], batch_size: int) -> tuple[list[list[int]], np.ndarray]:
    """Batches of `rows` sorted by token length (little padding at prediction time) and the positions
    that put their outputs back in the order of `rows`."""
    chosen = np.asarray(rows, dtype=np.int64)
    order = np.argsort(data.lengths()[chosen], kind="stable")
    batches = [chosen[order[i : i + batch_size]].tolist() for i in range(0, len(chosen), batch_size)]
    return batches, np.argsort(order, kind="stable")


@torch.no_grad()
def _pooled(classifier: Classifier, data: Tokenized, rows: Sequence[int], batch_size: int, device: torch.device) -> np.ndarray:
    """Pooled vectors of the encoder alone, in eval mode (the classifier's mode is restored)."""
    was_training = classifier.training
    classifier.eval()
    vectors = []
    batches, restore = _by_length(data, rows, batch_size)
    for batch_rows in batches:
        batch = data.batch(batch_rows, device)
        hidden = classifier.encoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).last_hidden_state
        vectors.append(pool(hidden, batch.content_mask, classifier.pooling).float().cpu().numpy())
    classifier.train(was_training)
    return np.concatenate(vectors)[restore]


@torch.no_grad()
def _evaluate(classifier: Classifier, data: Tokenized, batch_size: int, device: torch.device) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pooled vectors, vectors the head reads, head outputs) of every input, in eval mode."""
    classifier.eval()
    pooled, features, logits = [], [], []
    batches, restore = _by_length(data, range(len(data)), batch_size)
    for batch_rows in batches:
        batch = data.batch(batch_rows, device)
        outputs, vector, feature, _ = classifier(batch)
        pooled.append(vector.float().cpu().numpy())
        features.append(feature.float().cpu().numpy())
        logits.append(outputs.float().cpu().numpy())
    return np.concatenate(pooled)[restore], np.concatenate(features)[restore], np.concatenate(logits)[restore]


@torch.no_grad()
def _layer_check(layer: CalibrationLayer, vectors: np.ndarray, step: int, device: torch.device) -> dict[str, Any]:
    """IsoScore and log I(W) of the current fit's output on `vectors` (the encoder's current pooled vectors)."""
    from lmgeom.metrics.isotropy import isoscore, log_partition_isotropy

    output = layer(torch.as_tensor(vectors, dtype=torch.float32, device=device)).double().cpu().numpy()
    finite = bool(np.isfinite(output).all())
    return {"step": step, "finite": finite, "isoscore": float(isoscore(output)) if finite else float("nan"),
            "log_iw": float(log_partition_isotropy(output)) if finite else float("nan")}


def _train(classifier: Classifier, train: Tokenized, targets: torch.Tensor, n_outputs: int, options: FineTuneOptions,
           device: torch.device, progress: Progress, *, istar: IStar | None, recalibration_inputs: int,
           notes: list[str], layer_checks: list[dict[str, Any]], layer_log: dict[str, Any]) -> tuple[list[float], int, float]:
    """The training loop of the module docstring; returns seconds per epoch, the number of steps and
    the padding fraction of the training batches, and appends the calibrator's checks (`_layer_check`,
    before each subset re-fit, every `check_every` steps where none is, and after the last step) to
    `layer_checks` and its log (re-fits, guard, joint flow, penalty) to `layer_log`."""
    n_inputs, batch_size = len(train), options.batch_size
    total_steps = -(-n_inputs // batch_size) * options.epochs
    if options.max_steps is not None:
        total_steps = min(total_steps, options.max_steps)
    warmup_steps = int(round(options.warmup_fraction * total_steps))
    parameters = [*classifier.encoder.parameters(), *classifier.head.parameters()]
    optimizer = torch.optim.AdamW(parameters, lr=options.learning_rate, weight_decay=WEIGHT_DECAY)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: warmup_linear(step, total_steps, warmup_steps))
    lengths = train.lengths()
    positions = content = 0
    loss_function: nn.Module = nn.MSELoss() if n_outputs == 1 else nn.CrossEntropyLoss()
    order_rng = np.random.default_rng(options.seed)
    calibration = classifier.layer if isinstance(classifier.layer, CalibrationLayer) else None
    fixes = options.calibration
    joint = calibration is not None and fixes.flow_training == "joint"
    flow_optimizer: torch.optim.Optimizer | None = None
    fit_rows: list[int] = []
    probe_rows: list[int] = []
    probe_positions = np.zeros(0, dtype=np.int64)
    if calibration is not None:
        # Its own stream, so the data order is the same as without calibration.
        subset = np.random.default_rng([options.seed, 1]).choice(n_inputs, size=min(n_inputs, recalibration_inputs), replace=False)
        fit_rows = sorted(int(row) for row in subset)
        probe_positions = np.sort(np.random.default_rng([options.seed, 2]).choice(
            len(fit_rows), size=min(len(fit_rows), fixes.guard_inputs), replace=False))
        probe_rows = [fit_rows[int(i)] for i in probe_positions]
        progress.start("recalibration", 1 if joint else -(-total_steps // options.recalibrate_every), unit="fits")
    progress.start("fine-tuning", total_steps, unit="steps")
    classifier.train()
    seconds_per_epoch: list[float] = []
    refit_steps: list[int] = []
    guard: dict[str, Any] = {"reference": None, "checks": 0, "refits": []}
    nll_per_epoch: list[float] = []
    penalty_per_epoch: list[float] = []

    def subset_vectors(step: int, *, check: bool) -> np.ndarray:
        assert calibration is not None
        vectors = _pooled(classifier, train, fit_rows, batch_size, device)
        if check and calibration.transform is not None:
            layer_checks.append(_layer_check(calibration, vectors, step, device))
        return vectors

    def guard_reference(step: int, vectors: np.ndarray | None) -> None:
        assert calibration is not None
        if fixes.guard_isoscore is None:
            return
        probe = vectors[probe_positions] if vectors is not None else _pooled(classifier, train, probe_rows, batch_size, device)
        guard["reference"] = layer_isoscore(calibration, probe)

    step = 0
    for _ in range(options.epochs):
        if step == total_steps:
            break
        started = time.perf_counter()
        nll_sum = penalty_sum = 0.0
        epoch_steps = 0
        batches = (length_grouped_batches(lengths, batch_size, order_rng) if options.length_grouped
                   else random_batches(n_inputs, batch_size, order_rng))
        if istar is not None:
            order = [row for rows in batches for row in rows]
            n_points = istar.refresh(classifier, train, order, batch_size, device)
            notes.append(f"I-STAR C0 estimated from {n_points} token states (epoch {len(seconds_per_epoch) + 1})")
        for rows in batches:
            if step == total_steps:
                break
            if calibration is not None:
                refit_now = step % options.recalibrate_every == 0 and (step == 0 or not joint)
                if (not refit_now and fixes.guard_isoscore is not None and step % fixes.guard_every == 0
                        and guard["reference"] is not None):
                    probe = _pooled(classifier, train, probe_rows, batch_size, device)
                    fires, iso = guard_fires(calibration, probe, guard["reference"], fixes.guard_isoscore)
                    guard["checks"] += 1
                    if fires:
                        refit_now = True
                        guard["refits"].append({"step": step, "isoscore": iso, "reference": guard["reference"]})
                if refit_now:
                    vectors: np.ndarray | None = None
                    if step == 0 or fixes.refit_on == "subset":
                        vectors = subset_vectors(step, check=True)
                        calibration.refit(vectors)
                    else:
                        if step % fixes.check_every == 0:
                            subset_vectors(step, check=True)
                        calibration.refit_from_moments()
                    if step == 0 and joint:
                        flow_optimizer = torch.optim.Adam(calibration.joint_parameters(), lr=fixes.flow_learning_rate)
                    refit_steps.append(step)
                    guard_reference(step, vectors)
                    progress.advance("recalibration", 1, note=f"step {step}")
                elif (joint or fixes.refit_on == "batch") and step % fixes.check_every == 0:
                    subset_vectors(step, check=True)
            positions += len(rows) * int(lengths[rows].max())
            content += int(lengths[rows].sum())
            batch = train.batch(rows, device)
            logits, pooled, features, hidden = classifier(batch, hidden_states=istar is not None)
            loss = loss_function(logits[:, 0] if n_outputs == 1 else logits, targets[torch.as_tensor(rows, device=device)])
            if istar is not None:
                loss = loss + istar.penalty(hidden, batch.attention_mask)
            if calibration is not None:
                if fixes.refit_on == "batch":
                    calibration.update_moments(pooled)
                if fixes.variance_penalty > 0:
                    penalty = calibration.variance_penalty(features)
                    penalty_sum += float(penalty.detach())
                    loss = loss + fixes.variance_penalty * penalty
                if joint:
                    nll = calibration.negative_log_likelihood(pooled if fixes.flow_nll_into_encoder else pooled.detach())
                    nll_sum += float(nll.detach())
                    loss = loss + fixes.flow_nll_weight * nll
            optimizer.zero_grad(set_to_none=True)
            if flow_optimizer is not None:
                flow_optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(parameters, MAX_GRADIENT_NORM)
            optimizer.step()
            if flow_optimizer is not None and calibration is not None:
                torch.nn.utils.clip_grad_norm_(calibration.joint_parameters(), FLOW_GRADIENT_NORM)
                flow_optimizer.step()
            schedule.step()
            step += 1
            epoch_steps += 1
            progress.advance("fine-tuning", 1, note=f"loss {loss.item():.4f}")
        seconds_per_epoch.append(time.perf_counter() - started)
        if joint:
            nll_per_epoch.append(nll_sum / max(1, epoch_steps))
        if fixes.variance_penalty > 0:
            penalty_per_epoch.append(penalty_sum / max(1, epoch_steps))
    if calibration is not None:
        vectors = subset_vectors(step, check=True)
        if options.refit_after_last and not joint:
            if fixes.refit_on == "batch":
                calibration.refit_from_moments()
            else:
                calibration.refit(vectors)
            refit_steps.append(step)
        source = (f"the pooled vectors of {len(fit_rows)} training inputs, eval mode, no gradient" if fixes.refit_on == "subset"
                  else f"the first on the pooled vectors of {len(fit_rows)} training inputs (eval mode), the rest in "
                       f"closed form from running moments of the training batches (momentum {fixes.batch_momentum:g})")
        notes.append(f"calibration statistics re-estimated {len(refit_steps)} times (before steps {refit_steps}"
                     f"{', the last after the final step' if options.refit_after_last and not joint else ''}) on {source}")
        layer_log.update(refit_steps=refit_steps)
        if fixes.guard_isoscore is not None:
            notes.append(f"guard: {guard['checks']} checks of the fit in use on {len(probe_rows)} training inputs, "
                         f"{len(guard['refits'])} early re-fits (IsoScore below {fixes.guard_isoscore:g} x its value "
                         f"after the last fit) at steps {[g['step'] for g in guard['refits']]}")
            layer_log.update(guard_checks=guard["checks"], guard_refits=guard["refits"])
        if joint:
            notes.append("joint flow: fitted before step 0, then trained with the model (Adam, lr "
                         f"{fixes.flow_learning_rate:g}) on the task loss + {fixes.flow_nll_weight:g} x its NLL "
                         f"({'reaching' if fixes.flow_nll_into_encoder else 'not reaching'} the encoder); "
                         f"NLL per dimension, mean per epoch: {[round(v, 4) for v in nll_per_epoch]}")
            layer_log.update(nll_per_epoch=nll_per_epoch)
        if fixes.variance_penalty > 0:
            notes.append(f"variance penalty {fixes.variance_penalty:g} x mean log-variance ratio^2, mean per epoch: "
                         f"{[round(v, 4) for v in penalty_per_epoch]}")
            layer_log.update(penalty_per_epoch=penalty_per_epoch)
    notes.append(f"{step} steps ({warmup_steps} of linear warm-up), "
                 f"{'length-grouped' if options.length_grouped else 'random'} batches: "
                 f"{1 - content / positions:.1%} of the batch positions are padding")
    return seconds_per_epoch, step, 1 - content / positions
