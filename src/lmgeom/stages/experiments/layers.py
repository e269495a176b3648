"""The layer experiment (Peters et al. 2018): which layer, or which learned mix of layers, serves a task?

Each single layer, the top layer, a learned `ScalarMix` (its weights reported) and layer 0 (the
context-free input layer, "static") feed the same linear probe: a linear tagger over word vectors
for tagging tasks (a BiLSTM would hide the layer pattern), a linear sentence head for GLUE tasks.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from lmgeom.evaluate.tasks import METRICS, score
from lmgeom.progress import NoProgress, Progress
from lmgeom.stages.experiments.calibration import encoder_loader, parse_feature
from lmgeom.stages.experiments.core import (
    Cell,
    CellStore,
    ExperimentOptions,
    ExperimentResult,
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
from lmgeom.stages.experiments.heads import RAW_NOTE, STANDARDIZE_NOTE, ProbeOptions, fit_probe
from lmgeom.errors import InputError

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


PROBE_VS_TASK_MODEL_NOTE = ("a linear probe on frozen features, where Peters et al. (2018) trained task models "
                            "(a BiLSTM-CRF tagger, ESIM, BiDAF) on top of ELMo")


def mix_label(l2: float | None, layer_norm: bool) -> str:
    """The features label of a ScalarMix: `mix`, `mix l2=1`, `mix ln`, `mix l2=0.001 ln`."""
    return " ".join(["mix", *([f"l2={l2:g}"] if l2 is not None else []), *(["ln"] if layer_norm else [])])


def run_layers(
    model: str,
    task: str,
    data: str | os.PathLike[str],
    *,
    out: str | os.PathLike[str],
    options: ExperimentOptions = ExperimentOptions(),
    features: Sequence[str] = DEFAULT_FEATURES,
    probe: ProbeOptions = ProbeOptions(),
    mix_l2: Sequence[float | None] = (None,),
    mix_layer_norm: Sequence[bool] = (False,),
    standardize: bool = True,
    progress: Progress | None = None,
) -> ExperimentResult:
    """Every (features, seed) cell of the layer experiment, tested against the top layer; finished
    cells are skipped. `max_train`/`max_eval` count sentences (examples for sentence tasks).

    The `mix` feature runs once per (lambda in `mix_l2`, layer norm in `mix_layer_norm`), labelled
    by `mix_label`; `standardize=False` feeds raw layers to the probe and the mix. A cell's identity
    names an option only where it differs from the default, so earlier results resume. `options`: the
    seeds, subsamples, pooling and device (`ExperimentOptions`)."""
    pooling, max_train, max_eval, device = options.pooling, options.max_train, options.max_eval, options.device
    progress = progress or NoProgress()
    mix_variants = list(dict.fromkeys((None if l2 is None else float(l2), bool(ln)) for l2 in mix_l2 for ln in mix_layer_norm))
    if not mix_variants:
        raise InputError("`mix_l2` and `mix_layer_norm` need at least one value each", param=("mix_l2", "mix_layer_norm"))
    probe = dataclasses.replace(probe, standardize=standardize)
    out = Path(out)
    seed_list = options.seed_list
    the_task = resolve_task(task, data)
    data_ = task_data(the_task, seed_list, max_train=max_train, max_eval=max_eval)
    out.mkdir(parents=True, exist_ok=True)
    cache = FeatureCache(out / "features", encoder_loader(model, device), model=model, progress=progress)
    store = CellStore(out)
    first = data_.train_rows[seed_list[0]]
    n_layers = data_.units(cache, the_task.train_split, first[:1], pooling=pooling, layers=None).shape[0]
    chosen = expand_features(list(features), n_layers)
    # (spec, features label, probe options, what the cell's identity adds to `identity`)
    jobs: list[tuple[str, str, ProbeOptions, dict[str, Any]]] = []
    for spec in chosen:
        if spec != "mix":
            jobs.append((spec, spec, probe, {"features": spec}))
            continue
        for l2, layer_norm in mix_variants:
            jobs.append((spec, mix_label(l2, layer_norm), dataclasses.replace(probe, mix_l2=l2, mix_layer_norm=layer_norm),
                         {"features": spec, **({"mix_l2": l2} if l2 is not None else {}),
                          **({"mix_layer_norm": True} if layer_norm else {})}))
    metric = METRICS[the_task.metrics[0]]
    stage = "cells (layers)"
    progress.start(stage, len(jobs) * len(seed_list), unit="cells")
    base = {"experiment": "layers", "task": the_task.name, "model": model, "regime": "frozen", "method": "none",
            "head": "linear", "pooling": pooling}
    identity = {**base, **data_.sizes, **({} if standardize else {"standardize": False})}
    cells: list[Cell] = []
    for seed in seed_list:
        todo = []
        for job in jobs:
            cell = store.load({**identity, **job[3]}, seed)
            if cell is None:
                todo.append(job)
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
        for spec, features_label, probe_options, key in todo:
            label, layers = parse_feature(spec, n_layers)
            train = np.moveaxis(train_all[layers], 0, 1)
            evaluation = {s: np.moveaxis(x[layers], 0, 1) for s, x in eval_all.items()}
            result = fit_probe(train, y_train, evaluation, regression=data_.regression, n_classes=data_.n_classes,
                               seed=seed, metric=metric, options=probe_options)
            measured = {} if label == "mix" else prefixed(
                geometry(eval_all[first_split][layers[0]].reshape(-1, train.shape[-1]),
                         reference=train_all[layers[0]].reshape(-1, train.shape[-1])), "before")
            extra: dict[str, Any] = {"epochs_run": result.epochs_run}
            if result.mix_weights:
                extra.update(mix_weights=result.mix_weights, mix_gamma=result.mix_gamma)
            mix_fields = ({"mix_l2": probe_options.mix_l2, "mix_layer_norm": probe_options.mix_layer_norm,
                           "mix_regularisation": probe_options.describe_mix()} if label == "mix" else {})
            cell = Cell({**identity, **key}, seed, extra=extra)
            for split, prediction in result.predictions.items():
                for name, value in score(the_task, truth[split], prediction).items():
                    cell.records.append({**base, "features": features_label, "layers": layers, **mix_fields,
                                         "standardize": standardize,
                                         "head_regularisation": probe_options.describe(), "seed": seed, "split": split,
                                         "metric": name, "value": value, "n_train": int(len(y_train)),
                                         "n_eval": int(len(truth[split])), **measured,
                                         **({"mix_weights": result.mix_weights, "mix_gamma": result.mix_gamma}
                                            if result.mix_weights else {})})
                cell.predictions[split] = prediction.tolist()
            store.save(cell)
            cells.append(cell)
            progress.advance(stage, 1, note=f"{features_label} seed {seed}")
    summaries = summarise(cells, data_, baseline=lambda row: None if row["features"] == "top" else {"features": "top"},
                          family_key="features")
    trivial = task_trivial_baselines(data_)
    compare_with_trivial(summaries, cells, data_, trivial, family_key="features", reference="top")
    notes = [getattr(the_task, "note", "")] if getattr(the_task, "note", "") else []
    layers_note = STANDARDIZE_NOTE if standardize else RAW_NOTE
    notes += [layers_note, f"probe: {PROBE_VS_TASK_MODEL_NOTE}"]
    settings = {"model": model, "task": the_task.name, "data": str(data), "features": [job[1] for job in jobs],
                "seeds": seed_list, "n_layers": n_layers, "pooling": pooling_note(pooling), "probe": probe.describe(),
                "standardize": standardize, "layers": layers_note,
                "deviations_from_peters": [PROBE_VS_TASK_MODEL_NOTE, *([STANDARDIZE_NOTE] if standardize else [])],
                "mix": {mix_label(l2, ln): dataclasses.replace(probe, mix_l2=l2, mix_layer_norm=ln).describe_mix()
                        for l2, ln in mix_variants},
                "max_train": max_train, "max_eval": max_eval,
                "eval_examples": {s: len(r) for s, r in data_.eval_rows.items()}, "options": options.to_settings()}
    return write_results(out, "experiment-layers", cells=cells, summaries=summaries, notes=notes, settings=settings,
                         varying="features", title=f"Layer experiment: {model} on {the_task.name}",
                         trivial=trivial_rows(trivial), model=cache.provenance())
