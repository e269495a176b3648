"""The calibration experiment (Ding et al. 2022): does isotropy calibration help a downstream task?

Frozen regime: the features of one layer (or a ScalarMix learned by the linear probe on the training
slice, then frozen), the calibrator fitted on the training features only, then a head (logistic
regression / ridge, or a small MLP). A tagging task (POS) runs the frozen regime on word vectors:
every word of the chosen sentences is one example for the calibrator, the head and the paired test.
Fine-tuning regime: `lmgeom.finetune.finetune` with the method
applied inside the forward pass; it fine-tunes a sentence head, so a tagging task is refused there.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from lmgeom.errors import InputError
from lmgeom.calibrate import METHODS, make_calibrator
from lmgeom.encoders.base import Encoder
from lmgeom.encoders.registry import is_elmo_model
from lmgeom.evaluate.tasks import METRICS, SentenceTask, TaggingTask, score
from lmgeom.progress import NoProgress, Progress
from lmgeom.stages.experiments.core import (
    Cell,
    CellStore,
    ExperimentOptions,
    ExperimentResult,
    TaskData,
    compare_with_trivial,
    geometry,
    prefixed,
    resolve_task,
    summarise,
    task_data,
    task_trivial_baselines,
    trivial_rows,
    write_results,
)
from lmgeom.stages.experiments.features import FeatureCache, pooling_note
from lmgeom.stages.experiments.finetuning import VALIDATION_FRACTION, WORKERS, finetune_task, job_for, method_options, run_jobs
from lmgeom.stages.experiments.heads import HEADS, combine, fit_predict_sklearn, fit_probe, head_settings

FINETUNE_ONLY_METHODS = ("isobn", "istar")  # they act on the representation during fine-tuning only
REGIMES = ("frozen", "finetune", "both")
CLS_NOTE = "the top layer's state at the first position ([CLS]), as Ding et al. and IsoBN pool"
WORD_VECTORS_NOTE = "word vectors: the mean of each word's pieces (a tagging task reads words, not sentences)"


def parse_feature(spec: str, n_layers: int) -> tuple[str, list[int]]:
    """(label, layers): `top`, `static` (layer 0), `layer:N`, or `mix` (all layers)."""
    if spec == "top":
        return "top", [n_layers - 1]
    if spec == "static":
        return "static", [0]
    if spec == "mix":
        return "mix", list(range(n_layers))
    if spec.startswith("layer:") and spec[6:].isdigit():
        layer = int(spec[6:])
        if not 0 <= layer < n_layers:
            raise InputError(f"`features` {spec}: the model has layers 0-{n_layers - 1} (0 = its input layer)", param="features")
        return f"layer {layer}", [layer]
    raise InputError(f"unknown `features` {spec!r}; give top, static, mix or layer:N", param="features")


def encoder_loader(model: str, device: str) -> Any:
    def load(pooling: str) -> Encoder:
        from lmgeom.encoders.registry import load_encoder

        return load_encoder(model, device=device, pooling="last" if pooling == "last" else "mean")

    return load


def run_calibration(
    model: str,
    task: str,
    data: str | os.PathLike[str],
    *,
    out: str | os.PathLike[str],
    options: ExperimentOptions = ExperimentOptions(),
    methods: Sequence[str] = ("none", "whitening"),
    regime: str = "frozen",
    features: str = "top",
    heads: Sequence[str] = HEADS,
    finetune_options: dict[str, Any] | None = None,
    validation_fraction: float = VALIDATION_FRACTION,
    workers: int = WORKERS,
    progress: Progress | None = None,
) -> ExperimentResult:
    """Every (method, head, seed) cell of the calibration experiment; finished cells are skipped.

    Returns the tidy records, the per-configuration summaries (mean ± std over seeds, paired
    permutation test against `none` on the evaluation examples, Holm across methods) and writes
    results.json, results.md and figures to `out`. `options`: the seeds, subsamples, pooling and
    device (`ExperimentOptions`)."""
    pooling, max_train, max_eval, device = options.pooling, options.max_train, options.max_eval, options.device
    progress = progress or NoProgress()
    out = Path(out)
    if regime not in REGIMES:
        raise InputError(f"unknown `regime` {regime!r}; choose one of {', '.join(REGIMES)}", param="regime")
    methods = list(dict.fromkeys(["none", *methods]))
    unknown = [m for m in methods if m != "none" and m not in METHODS and m not in FINETUNE_ONLY_METHODS]
    if unknown:
        raise InputError(f"unknown calibration methods {unknown}; choose from none, {', '.join([*METHODS, *FINETUNE_ONLY_METHODS])}")
    for head in heads:
        head_settings(head, False)
    if pooling == "cls" and regime != "finetune":
        raise InputError("`pooling` cls (the first position, Ding et al.'s and IsoBN's [CLS]) is a fine-tuning option; "
                         "run it with `regime='finetune'`", param="pooling")
    pooling_text = CLS_NOTE if pooling == "cls" else pooling_note(pooling)
    seed_list = options.seed_list
    the_task = resolve_task(task, data)
    tagging = isinstance(the_task, TaggingTask)
    if tagging and regime != "frozen":
        raise InputError(f"`regime` {regime}: {the_task.name} is a token-tagging task, and the fine-tuning regime "
                         "fine-tunes a sentence head only; run it with `regime='frozen'`", param="regime")
    if regime != "frozen" and is_elmo_model(model):
        raise InputError(f"`regime` {regime}: {model} is an ELMo model, and the fine-tuning regime fine-tunes "
                         "transformers models only (ELMo is used frozen, through its learned scalar mix); "
                         "run it with `regime='frozen'`", param="regime")
    data_ = task_data(the_task, seed_list, max_train=max_train, max_eval=max_eval)
    out.mkdir(parents=True, exist_ok=True)
    cache = FeatureCache(out / "features", encoder_loader(model, device), model=model, progress=progress)
    store = CellStore(out)
    notes = []
    cells: list[Cell] = []
    if regime in ("frozen", "both"):
        skipped = [m for m in methods if m in FINETUNE_ONLY_METHODS]
        if skipped:
            notes.append(f"frozen regime: {', '.join(skipped)} skipped (they act on the representation during fine-tuning only)")
        frozen_methods = [m for m in methods if m not in FINETUNE_ONLY_METHODS]
        cells += _frozen(model, data_, cache, store, frozen_methods, seed_list, features, list(heads), pooling, progress)
    if regime in ("finetune", "both"):
        assert isinstance(the_task, SentenceTask)
        tuned, tuned_data, tuned_notes = _finetuned(model, the_task, store, methods, seed_list, pooling, device,
                                                    finetune_options or {}, max_train=max_train, max_eval=max_eval,
                                                    validation_fraction=validation_fraction, workers=workers,
                                                    progress=progress)
        cells += tuned
        notes += tuned_notes
        if regime == "finetune":
            data_ = tuned_data
    summaries = summarise(cells, data_, baseline=lambda row: None if row["method"] == "none" else {"method": "none"},
                          family_key="method")
    trivial = task_trivial_baselines(data_)
    compare_with_trivial(summaries, cells, data_, trivial, family_key="method", reference="none")
    settings: dict[str, Any] = {"model": model, "task": the_task.name, "data": str(data), "methods": methods, "seeds": seed_list,
                "regime": regime, "features": features, "heads": list(heads),
                "pooling": WORD_VECTORS_NOTE if tagging else pooling_text,
                "max_train": max_train, "max_eval": max_eval, "eval_examples": {s: len(r) for s, r in data_.eval_rows.items()},
                "options": options.to_settings()}
    if tagging:  # the subsample counts sentences; heads, geometry and the paired test work on their words
        settings["units"] = "words: --max-train/--max-eval subsample sentences, every word of a chosen sentence is a unit"
        settings["train_words"] = {seed: int(len(data_.labels(the_task.train_split, rows))) for seed, rows in data_.train_rows.items()}
        settings["eval_words"] = {s: int(len(data_.labels(s, rows))) for s, rows in data_.eval_rows.items()}
    return write_results(out, "experiment-calibration", cells=cells, summaries=summaries, notes=notes, settings=settings,
                         varying="method", title=f"Calibration experiment: {model} on {the_task.name}",
                         trivial=trivial_rows(trivial), model=cache.provenance())


def _frozen(model: str, data: TaskData, cache: FeatureCache, store: CellStore, methods: list[str], seeds: list[int],
            features: str, heads: list[str], pooling: str, progress: Progress) -> list[Cell]:
    task = data.task
    stage = "cells (frozen)"
    progress.start(stage, len(methods) * len(heads) * len(seeds), unit="cells")
    n_layers: int | None = None
    cells: list[Cell] = []
    for seed in seeds:
        pending = [(m, h) for m in methods for h in heads]
        base = {"experiment": "calibration", "task": task.name, "model": model, "regime": "frozen", "features": features,
                "pooling": pooling}
        identity = {**base, **data.sizes}
        done = {(m, h): store.load({**identity, "method": m, "head": h}, seed) for m, h in pending}
        cells += [cell for cell in done.values() if cell is not None]
        progress.advance(stage, sum(cell is not None for cell in done.values()), note="resumed")
        todo = [key for key, cell in done.items() if cell is None]
        if not todo:
            continue
        if n_layers is None:
            n_layers = _n_layers(cache, data, pooling)
        label, layers = parse_feature(features, n_layers)
        train_rows = data.train_rows[seed]
        train = data.units(cache, task.train_split, train_rows, pooling=pooling, layers=layers)
        y_train = data.labels(task.train_split, train_rows)
        evaluation = {s: data.units(cache, s, rows, pooling=pooling, layers=layers) for s, rows in data.eval_rows.items()}
        truth = {s: data.labels(s, rows) for s, rows in data.eval_rows.items()}
        mix_note: dict[str, Any] = {}
        if label == "mix":
            train, evaluation, mix_note = _frozen_mix(train, y_train, evaluation, data, seed)
        else:
            train, evaluation = train[0], {s: x[0] for s, x in evaluation.items()}
        first_split = next(iter(evaluation))
        before = prefixed(geometry(evaluation[first_split].reshape(-1, train.shape[-1]),
                                   reference=train.reshape(-1, train.shape[-1])), "before")
        for method in dict.fromkeys(m for m, _ in todo):
            started = time.perf_counter()
            if method == "none":
                calibrated_train, calibrated_eval, params = train, evaluation, {}
            else:
                calibrator = make_calibrator(method, seed=seed).fit(train.reshape(-1, train.shape[-1]).astype(np.float64))
                calibrated_train = _apply(calibrator, train)
                calibrated_eval = {s: _apply(calibrator, x) for s, x in evaluation.items()}
                params = {k: v for k, v in calibrator.get_params().items() if isinstance(v, (int, float, str, bool, type(None)))}
            after = prefixed(geometry(calibrated_eval[first_split].reshape(-1, calibrated_train.shape[-1]),
                                      reference=calibrated_train.reshape(-1, calibrated_train.shape[-1])), "after")
            for head in [h for m, h in todo if m == method]:
                settings = head_settings(head, data.regression)
                predicted = fit_predict_sklearn(head, data.regression, combine(calibrated_train), y_train,
                                                {s: combine(x) for s, x in calibrated_eval.items()}, seed=seed)
                config = {**identity, "method": method, "head": head}
                cell = Cell(config, seed, extra={"method_params": params, **mix_note})
                for split, prediction in predicted.items():
                    for metric, value in score(task, truth[split], prediction).items():
                        cell.records.append({**base, "method": method,
                                             "head": settings["head"], "head_regularisation": settings["regularisation"],
                                             "seed": seed, "split": split, "metric": metric, "value": value,
                                             "n_train": int(len(y_train)), "n_eval": int(len(truth[split])),
                                             "seconds": time.perf_counter() - started, **before, **after})
                    cell.predictions[split] = prediction.tolist()
                store.save(cell)
                cells.append(cell)
                progress.advance(stage, 1, note=f"{method}/{head} seed {seed}")
    return cells


def _apply(calibrator: Any, units: np.ndarray) -> np.ndarray:
    n, k, dim = units.shape
    transformed = calibrator.transform(units.reshape(-1, dim).astype(np.float64))
    return np.asarray(transformed).reshape(n, k, -1)


def _n_layers(cache: FeatureCache, data: TaskData, pooling: str) -> int:
    """The model's layer count, from the cache or by encoding one training example."""
    rows = data.train_rows[next(iter(data.train_rows))][:1]
    return data.units(cache, data.task.train_split, rows, pooling=pooling, layers=None).shape[0]


def _frozen_mix(train: np.ndarray, y_train: np.ndarray, evaluation: dict[str, np.ndarray], data: TaskData,
                seed: int) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, Any]]:
    """Learn ScalarMix weights with the linear probe on the training slice, then mix every split with
    them (frozen) so the calibrator and head see one vector per unit."""
    metric = METRICS[data.task.metrics[0]]
    mean = train.mean(axis=(1, 2), keepdims=True)
    std = train.std(axis=(1, 2), keepdims=True)
    std[std == 0] = 1.0
    train = (train - mean) / std
    evaluation = {s: (x - mean) / std for s, x in evaluation.items()}
    probe = fit_probe(np.moveaxis(train, 0, 1), y_train, {}, regression=data.regression, n_classes=data.n_classes,
                      seed=seed, metric=metric)
    weights = np.asarray(probe.mix_weights, dtype=np.float64)

    def mix(units: np.ndarray) -> np.ndarray:  # standardised (n_layers, n, k, dim) -> (n, k, dim)
        return np.tensordot(weights, units.astype(np.float64), axes=1)

    return mix(train), {s: mix(x) for s, x in evaluation.items()}, {"mix_weights": probe.mix_weights,
                                                                     "mix_note": "layers standardised with training statistics, then mixed"}


def _finetuned(model: str, task: SentenceTask, store: CellStore, methods: list[str], seeds: list[int], pooling: str,
               device: str, options: dict[str, Any], *, max_train: int | None, max_eval: int | None,
               validation_fraction: float, workers: int, progress: Progress) -> tuple[list[Cell], TaskData, list[str]]:
    """One fine-tuning run per (method, seed), in `workers` single-thread processes
    (`finetuning.run_jobs`): `lmgeom.finetune.finetune` with the method inside the forward pass, on
    one training subsample shared by every seed and method, minus a validation split carved from it
    (`finetuning.finetune_task`); each cell records the isotropy of the head's input before and after
    the method's layer on the first evaluation split and whether the layer is degenerate."""
    split = finetune_task(task, max_train=max_train, validation_fraction=validation_fraction)
    data = task_data(split.task, seeds, max_train=None, max_eval=max_eval)
    data.sizes = {**data.sizes, **split.sizes}
    base = {"experiment": "calibration", "task": task.name, "model": model, "regime": "finetune", "features": "top",
            "head": "linear (fine-tuned with the model)", "pooling": pooling}
    setting = {"pooling": pooling, "device": device, **options}
    jobs = [job_for(split.task, model, {**base, **data.sizes, "method": method, "options": method_options(method, options)},
                    base, method, seed, method_options(method, setting), data.eval_rows)
            for seed in seeds for method in methods]
    cells = run_jobs(jobs, store, workers=workers, progress=progress)
    notes = [split.note, f"fine-tuning options (FineTuneOptions; the rest at their defaults): {setting}; "
                         f"{workers} single-thread worker processes"]
    return cells, data, notes
