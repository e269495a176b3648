"""The layer experiment (Peters et al. 2018): which layer, or which learned mix of layers, serves a task?

Each single layer, the top layer, a learned `ScalarMix` (its weights reported) and layer 0 (the
context-free input layer, "static") feed the same linear probe: a linear tagger over word vectors
for tagging tasks (a BiLSTM would hide the layer pattern), a linear sentence head for GLUE tasks.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from lmgeom.evaluate.tasks import METRICS, score
from lmgeom.progress import NoProgress, Progress
from lmgeom.runs.experiments.calibration import encoder_loader, parse_feature
from lmgeom.runs.experiments.core import (
    Cell,
    CellStore,
    ExperimentResult,
    geometry,
    parse_seeds,
    prefixed,
    resolve_task,
    summarise,
    task_data,
    write_results,
)
from lmgeom.runs.experiments.features import FeatureCache, pooling_note
from lmgeom.runs.experiments.heads import ProbeOptions, fit_probe

DEFAULT_FEATURES = ("layer:all", "top", "mix", "static")


def expand_features(specs: Sequence[str], n_layers: int) -> list[str]:
    """`layer:all` becomes layer:0 .. layer:L-1; the others are checked and kept in order."""
    expanded: list[str] = []
    for spec in specs:
        if spec == "layer:all":
            expanded += [f"layer:{layer}" for layer in range(n_layers)]
        else:
            parse_feature(spec, n_layers)
            expanded.append(spec)
    return list(dict.fromkeys(expanded))


def run_layers(
    model: str,
    task: str,
    data: str | os.PathLike[str],
    *,
    out: str | os.PathLike[str],
    features: Sequence[str] = DEFAULT_FEATURES,
    seeds: int | Sequence[int] = 3,
    pooling: str = "mean",
    max_train: int | None = None,
    max_eval: int | None = None,
    device: str = "auto",
    probe: ProbeOptions = ProbeOptions(),
    progress: Progress | None = None,
) -> ExperimentResult:
    """Every (features, seed) cell of the layer experiment, tested against the top layer; finished
    cells are skipped. `max_train`/`max_eval` count sentences (examples for sentence tasks)."""
    progress = progress or NoProgress()
    out = Path(out)
    pooling_note(pooling)
    seed_list = parse_seeds(seeds)
    the_task = resolve_task(task, data)
    data_ = task_data(the_task, seed_list, max_train=max_train, max_eval=max_eval)
    out.mkdir(parents=True, exist_ok=True)
    cache = FeatureCache(out / "features", encoder_loader(model, device), model=model, progress=progress)
    store = CellStore(out)
    first = data_.train_rows[seed_list[0]]
    n_layers = data_.units(cache, the_task.train_split, first[:1], pooling=pooling, layers=None).shape[0]
    chosen = expand_features(list(features), n_layers)
    metric = METRICS[the_task.metrics[0]]
    stage = "cells (layers)"
    progress.start(stage, len(chosen) * len(seed_list), unit="cells")
    base = {"experiment": "layers", "task": the_task.name, "model": model, "regime": "frozen", "method": "none",
            "head": "linear", "pooling": pooling}
    cells: list[Cell] = []
    for seed in seed_list:
        todo = []
        for spec in chosen:
            cell = store.load({**base, **data_.sizes, "features": spec}, seed)
            if cell is None:
                todo.append(spec)
            else:
                cells.append(cell)
                progress.advance(stage, 1, note="resumed")
        if not todo:
            continue
        rows = data_.train_rows[seed]
        train_all = data_.units(cache, the_task.train_split, rows, pooling=pooling, layers=None)
        y_train = data_.labels(the_task.train_split, rows)
        eval_all = {s: data_.units(cache, s, r, pooling=pooling, layers=None) for s, r in data_.eval_rows.items()}
        truth = {s: data_.labels(s, r) for s, r in data_.eval_rows.items()}
        first_split = next(iter(eval_all))
        for spec in todo:
            label, layers = parse_feature(spec, n_layers)
            train = np.moveaxis(train_all[layers], 0, 1)
            evaluation = {s: np.moveaxis(x[layers], 0, 1) for s, x in eval_all.items()}
            result = fit_probe(train, y_train, evaluation, regression=data_.regression, n_classes=data_.n_classes,
                               seed=seed, metric=metric, options=probe)
            measured = {} if label == "mix" else prefixed(
                geometry(eval_all[first_split][layers[0]].reshape(-1, train.shape[-1]),
                         reference=train_all[layers[0]].reshape(-1, train.shape[-1])), "before")
            extra: dict[str, Any] = {"epochs_run": result.epochs_run}
            if result.mix_weights:
                extra.update(mix_weights=result.mix_weights, mix_gamma=result.mix_gamma)
            cell = Cell({**base, **data_.sizes, "features": spec}, seed, extra=extra)
            for split, prediction in result.predictions.items():
                for name, value in score(the_task, truth[split], prediction).items():
                    cell.records.append({**base, "features": spec, "layers": layers,
                                         "head_regularisation": probe.describe(), "seed": seed, "split": split,
                                         "metric": name, "value": value, "n_train": int(len(y_train)),
                                         "n_eval": int(len(truth[split])), **measured,
                                         **({"mix_weights": result.mix_weights, "mix_gamma": result.mix_gamma}
                                            if result.mix_weights else {})})
                cell.predictions[split] = prediction.tolist()
            store.save(cell)
            cells.append(cell)
            progress.advance(stage, 1, note=f"{spec} seed {seed}")
    summaries = summarise(cells, data_, baseline=lambda row: None if row["features"] == "top" else {"features": "top"},
                          family_key="features")
    notes = [getattr(the_task, "note", "")] if getattr(the_task, "note", "") else []
    settings = {"model": model, "task": the_task.name, "data": str(data), "features": chosen, "seeds": seed_list,
                "n_layers": n_layers, "pooling": pooling_note(pooling), "probe": probe.describe(),
                "max_train": max_train, "max_eval": max_eval,
                "eval_examples": {s: len(r) for s, r in data_.eval_rows.items()}}
    return write_results(out, "experiment-layers", cells=cells, summaries=summaries, notes=notes, settings=settings,
                         varying="features", title=f"Layer experiment: {model} on {the_task.name}")
