"""The fine-tuning regime's data, cells and workers, and the pre-check that chooses its settings.

- `finetune_task`: a sentence task whose training split is replaced by a seeded subsample (shared
  by every seed and method) minus a seeded `validation` split carved from it; the evaluation
  splits (GLUE dev, MRPC's labelled test) are untouched, so the validation split never overlaps them.
- `run_jobs`: fine-tuning cells in a pool of single-thread worker processes (cells are independent;
  two single-thread workers get more out of two cores than one two-thread process), each finished
  cell saved at once, so an interrupted run resumes cell by cell.
- Each cell records the isotropy (IsoScore, log I(W), local IsoScore) of the head's input before
  and after the method's layer on the evaluation split and a `degenerate` flag
  (`degenerate_reasons`): a collapsed layer is a failure of the method, never a task result. The
  isotropy thresholds judge a method's layer only: a fine-tuned model without one (`none`,
  `istar`) may make its pooled vector as anisotropic as the task rewards, and I-STAR's negative
  weight asks for exactly that; such a cell is degenerate only on non-finite values or dead dimensions.
- `run_precheck`: `none` alone over learning rates and epochs per task, chosen on the validation split.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from lmgeom.atomic import atomic_write_text
from lmgeom.errors import InputError
from lmgeom.evaluate.baselines import beats_baseline, trivial_baselines
from lmgeom.evaluate.tasks import METRICS, SentenceSplit, SentenceTask
from lmgeom.progress import NoProgress, Progress
from lmgeom.stages.experiments.core import Cell, CellStore, geometry, prefixed, resolve_task, subsample

VALIDATION_SPLIT = "validation"
TRAIN_SUBSAMPLE_SEED = 0  # one training subsample for every seed and method
VALIDATION_SEED = 1
VALIDATION_FRACTION = 0.1
WORKERS = 2
# A layer's output is degenerate when its IsoScore is below this, |log I(W)| above LOG_IW_LIMIT, a
# value is not finite, or a dimension's std is below STD_FLOOR times the mean per-dimension std.
DEGENERATE_ISOSCORE = 0.01
LOG_IW_LIMIT = 100.0
STD_FLOOR = 1e-6
ISOSCORE_REASON, LOG_IW_REASON = "IsoScore", "|log I(W)|"  # how a threshold reason starts
# The pre-check's grid (per task: learning rates x epochs), `none` only, seed 0. Every task chose 1e-4,
# the edge of the common range, so each goes one step further (a setting chosen at an edge is flagged).
PRECHECK_LEARNING_RATES = (3e-5, 5e-5, 1e-4)
PRECHECK_TASK_LEARNING_RATES = {task: (3e-5, 5e-5, 1e-4, 2e-4) for task in ("cola", "sst2", "mrpc", "rte", "sicke")}
PRECHECK_EPOCHS = {"cola": (3,), "sst2": (3,), "mrpc": (3, 5), "rte": (3, 5), "sicke": (3,)}
PRECHECK_TASKS = ("cola", "rte", "mrpc", "sst2", "sicke")  # the order the cells run in
# Each pre-check task's folder, relative to the GLUE folder: the GLUE tasks in it, SICK-E (the
# replacement of a GLUE task the pre-check finds uninformative) in SICK/ beside it, as in ../shared/data.
PRECHECK_FOLDERS = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "rte": "RTE", "sicke": os.path.join(os.pardir, "SICK")}
MAX_TRAIN = {"sst2": 8000}  # SST-2's 67,349 sentences are subsampled (seeded); the others run whole


@dataclass(frozen=True)
class FinetuneSplit:
    """The fine-tuning regime's task and how its training split was made."""

    task: SentenceTask
    note: str
    sizes: dict[str, Any]  # part of every cell's identity


def finetune_task(task: SentenceTask, *, max_train: int | None, validation_fraction: float) -> FinetuneSplit:
    """`task` with `train` = a seeded subsample of `max_train` training examples (all without it)
    minus a seeded `validation_fraction` of them, which become the split `validation` (after the
    task's evaluation splits). The subsample and the validation rows are the same for every seed."""
    if not 0 <= validation_fraction < 1:
        raise InputError(f"`validation_fraction` must be in [0, 1), got {validation_fraction}", param="validation_fraction")
    train = task.splits[task.train_split]
    n = len(train.inputs)
    rows = subsample(n, max_train, TRAIN_SUBSAMPLE_SEED)
    n_validation = int(round(validation_fraction * len(rows)))
    held = np.zeros(len(rows), dtype=bool)
    if n_validation:
        held[np.random.default_rng(VALIDATION_SEED).choice(len(rows), size=n_validation, replace=False)] = True
    if held.all():
        raise InputError(f"`validation_fraction` {validation_fraction} leaves no training examples", param="validation_fraction")

    def part(chosen: np.ndarray) -> SentenceSplit:
        return SentenceSplit([train.inputs[r] for r in chosen], train.labels[chosen])

    splits = {task.train_split: part(rows[~held]), **{s: task.splits[s] for s in task.eval_splits}}
    if n_validation:
        splits[VALIDATION_SPLIT] = part(rows[held])
    source = "all" if len(rows) == n else f"a seeded (seed {TRAIN_SUBSAMPLE_SEED}) subsample of {len(rows)}"
    note = (f"training data: {source} of the {n} training examples, shared by every seed and method; "
            f"{n_validation} of them (seed {VALIDATION_SEED}) held out as the `{VALIDATION_SPLIT}` split, "
            f"{int((~held).sum())} trained on")
    return FinetuneSplit(replace(task, splits=splits), note,
                         {"max_train": max_train, "validation_fraction": validation_fraction})


# ---- degenerate layers ------------------------------------------------------------------------


def has_layer(method: str) -> bool:
    """Whether a fine-tuning method puts a layer between the pooled vector and the head."""
    from lmgeom.finetune.train import CALIBRATION_METHODS  # torch: only where a cell is judged

    return method in (*CALIBRATION_METHODS, "isobn")


def degenerate_reasons(vectors: np.ndarray, measures: dict[str, float], *, layer: bool = True,
                       input_isoscore: float | None = None) -> list[str]:
    """Why the vectors the head reads have collapsed (empty when they have not): non-finite values
    or a dimension whose std is below STD_FLOOR times the mean per-dimension std (all of them zero
    included); for a method's layer (`layer`) also |log I(W)| above LOG_IW_LIMIT, or IsoScore below
    DEGENERATE_ISOSCORE and below the layer's input's (`input_isoscore`, when known): a layer whose
    output is no less isotropic than the fine-tuned vectors it reads has not collapsed them, however
    anisotropic the task makes those (a binary task's pooled vectors lie near one direction)."""
    X = np.asarray(vectors, dtype=np.float64)
    if not np.isfinite(X).all():
        return ["non-finite values"]
    reasons = []
    iso, log_iw = measures.get("isoscore", float("nan")), measures.get("log_iw", float("nan"))
    below_input = input_isoscore is None or not np.isfinite(input_isoscore) or not iso >= input_isoscore
    if layer and (not np.isfinite(iso) or (iso < DEGENERATE_ISOSCORE and below_input)):
        reasons.append(f"{ISOSCORE_REASON} {iso:.3g} < {DEGENERATE_ISOSCORE}"
                       + (f" and below its input's {input_isoscore:.3g}" if input_isoscore is not None else ""))
    if layer and (not np.isfinite(log_iw) or abs(log_iw) > LOG_IW_LIMIT):
        reasons.append(f"{LOG_IW_REASON} = {abs(log_iw):.3g} > {LOG_IW_LIMIT:g}")
    std = X.std(axis=0)
    if float(std.min()) <= STD_FLOOR * float(std.mean()):
        reasons.append(f"{int(np.sum(std <= STD_FLOOR * std.mean()))} dimensions with std ~ 0 "
                       f"(<= {STD_FLOOR:g} x the mean std {float(std.mean()):.3g})")
    return reasons


def reassessed(cell: Cell, method: str) -> Cell:
    """A saved cell judged by the rule above: the isotropy-threshold reasons of a method without a
    layer (saved by a run that applied them to every method) no longer count, nor the final IsoScore
    reason of a layer whose output is no less isotropic than its input (the cell's records hold both,
    `isoscore_after` and `isoscore_before`); the saved reasons stay in `degenerate_reasons_saved` when
    they differ."""
    saved = list(cell.extra.get("degenerate_reasons", []))
    if has_layer(method):
        kept = [r for r in saved if not (r.startswith(f"{ISOSCORE_REASON} ") and _not_below_input(cell))]
    else:
        kept = [r for r in saved if not r.startswith((f"{ISOSCORE_REASON} ", LOG_IW_REASON))]
    if kept == saved:
        return cell
    extra = {**cell.extra, "degenerate_reasons": kept, "degenerate_reasons_saved": saved}
    records = [{**r, "degenerate": bool(kept)} if "degenerate" in r else r for r in cell.records]
    return replace(cell, records=records, extra=extra)


def _not_below_input(cell: Cell) -> bool:
    """Whether every record of the cell that measured it has a layer output (`isoscore_after`) no less
    isotropic than the layer's input (`isoscore_before`)."""
    pairs = [(r["isoscore_after"], r["isoscore_before"]) for r in cell.records
             if r.get("isoscore_after") is not None and r.get("isoscore_before") is not None]
    return bool(pairs) and all(np.isfinite(a) and np.isfinite(b) and a >= b for a, b in pairs)


def stale_layer_reasons(checks: Sequence[dict[str, Any]]) -> list[str]:
    """Collapses during training: a calibrator whose output on the encoder's current vectors, just
    before a re-fit (or after the last step), has non-finite values, IsoScore below
    DEGENERATE_ISOSCORE or |log I(W)| above LOG_IW_LIMIT; the head trained through it."""
    reasons = []
    for check in checks:
        iso, log_iw = check["isoscore"], check["log_iw"]
        if not check["finite"] or not np.isfinite(iso) or iso < DEGENERATE_ISOSCORE or abs(log_iw) > LOG_IW_LIMIT:
            reasons.append(f"collapsed during training: the fit in use before step {check['step']} gave IsoScore "
                           f"{iso:.3g}, log I(W) {log_iw:.3g} on the encoder's vectors")
    return reasons


# ---- cells and workers ------------------------------------------------------------------------


# FineTuneOptions fields that only a calibrator's layer reads, with their defaults.
LAYER_OPTIONS = {"recalibrate_every": 100, "refit_after_last": True}


def method_options(method: str, options: dict[str, Any]) -> dict[str, Any]:
    """FineTuneOptions fields as they apply to one method (and enter its cell's configuration).

    Parameters
    ----------
    method : str
        The fine-tuning method.
    options : dict
        FineTuneOptions fields, `calibration` a `CalibrationOptions` or a dict of its fields.

    Returns
    -------
    dict
        For a method without a calibration layer: the layer's options (`recalibrate_every`,
        `refit_after_last`, where given) at their defaults and no `calibration`, so its cell is the
        same whatever the calibrators were run with. For a calibrator: `calibration` reduced to
        the fields that differ from the defaults, and dropped when none does (a run with the
        defaults has the cell of a run without it).
    """
    from lmgeom.finetune.calibration import CalibrationOptions
    from lmgeom.finetune.train import CALIBRATION_METHODS

    options = dict(options)
    calibration = options.pop("calibration", None)
    if method not in CALIBRATION_METHODS:
        return {**options, **{key: value for key, value in LAYER_OPTIONS.items() if key in options}}
    if calibration is not None:
        given = calibration if isinstance(calibration, CalibrationOptions) else CalibrationOptions.from_dict(calibration)
        changed = given.changed()
        if changed:
            options["calibration"] = changed
    return options


@dataclass
class FinetuneJob:
    """Everything one worker needs for one (configuration, seed) cell."""

    model: str
    config: dict[str, Any]
    base: dict[str, Any]  # the record fields that name the configuration
    method: str
    seed: int
    options: dict[str, Any]  # FineTuneOptions fields
    train_inputs: list[Any]
    train_labels: np.ndarray
    eval_inputs: dict[str, list[Any]]
    eval_labels: dict[str, np.ndarray]
    n_outputs: int
    metrics: tuple[str, ...]
    geometry_split: str  # the evaluation split the isotropy is measured on


def job_for(task: SentenceTask, model: str, config: dict[str, Any], base: dict[str, Any], method: str, seed: int,
            options: dict[str, Any], eval_rows: dict[str, np.ndarray] | None = None) -> FinetuneJob:
    """The job of one cell on `task`'s training split and every evaluation split (or `eval_rows` of them)."""
    train = task.splits[task.train_split]
    rows = eval_rows or {s: np.arange(len(task.splits[s].inputs)) for s in task.eval_splits}
    labels = train.labels
    n_outputs = 1 if task.kind == "regression" else int(labels.max()) + 1
    return FinetuneJob(model, config, base, method, seed, options, list(train.inputs), np.asarray(labels),
                       {s: [task.splits[s].inputs[r] for r in r_] for s, r_ in rows.items()},
                       {s: task.splits[s].labels[r_] for s, r_ in rows.items()}, n_outputs, task.metrics,
                       next(s for s in rows if s != VALIDATION_SPLIT))


class _CellLog:
    """A worker's progress: one stderr line per `interval` seconds, naming its cell."""

    def __init__(self, label: str, interval: float = 120.0) -> None:
        self.label, self.interval = label, interval
        self.totals: dict[str, int] = {}
        self.done: dict[str, int] = {}
        self.last = time.monotonic()

    def start(self, stage: str, total: int, *, unit: str = "items") -> None:
        self.totals[stage], self.done[stage] = total, 0

    def advance(self, stage: str, n: int = 1, *, note: str = "") -> None:
        self.done[stage] = self.done.get(stage, 0) + n
        now = time.monotonic()
        if now - self.last >= self.interval or self.done[stage] == self.totals.get(stage):
            self.last = now
            print(f"[{self.label}] {stage} {self.done[stage]}/{self.totals.get(stage, '?')} {note}", file=sys.stderr, flush=True)


def run_job(job: FinetuneJob) -> Cell:
    """Fine-tune one cell and score it: records per (split, metric) with the isotropy of the head's
    input (`*_pretrained`: the pre-trained model's pooled vector; `*_before`: the fine-tuned pooled
    vector, the layer's input; `*_after`: what the head reads) and the degenerate flag."""
    from lmgeom.finetune import FineTuneOptions, finetune

    options = FineTuneOptions(**{**job.options, "seed": job.seed})
    started = time.perf_counter()
    label = f"{job.config.get('task', '')} {job.method} seed {job.seed} lr {options.learning_rate:g} {options.epochs} ep"
    result = finetune(job.model, train_inputs=job.train_inputs, train_labels=job.train_labels,
                      eval_inputs=dict(job.eval_inputs.items()), n_outputs=job.n_outputs, method=job.method, options=options,
                      progress=_CellLog(label))
    seconds = time.perf_counter() - started
    split = job.geometry_split
    vectors = result.sentence_vectors
    layer_in = vectors["after"][split]
    layer_out = vectors.get("calibrated", vectors["after"])[split]
    measured = {**prefixed(geometry(vectors["before"][split]), "pretrained"), **prefixed(geometry(layer_in), "before")}
    after = geometry(layer_out)
    measured.update(prefixed(after, "after"))
    reasons = (degenerate_reasons(layer_out, after, layer="calibrated" in vectors,
                                  input_isoscore=measured.get("isoscore_before"))
               + stale_layer_reasons(result.layer_checks))
    per_step = sum(result.seconds_per_epoch) / max(1, result.n_steps)
    cell = Cell(job.config, job.seed, extra={
        "method_params": result.method_params, "seconds_per_epoch": result.seconds_per_epoch, "seconds": seconds,
        "n_steps": result.n_steps, "seconds_per_step": per_step, "padding_fraction": result.padding_fraction,
        "finetune_notes": result.notes, "degenerate_reasons": reasons, "layer_checks": result.layer_checks,
        "layer_log": result.layer_log,
        "threads": _threads()})
    regularisation = (f"AdamW weight decay 0.01, {options.epochs} epochs, lr {options.learning_rate:g}, batch "
                      f"{options.batch_size}, warm-up {options.warmup_fraction:g}, max length {options.max_length}")
    for name, prediction in result.predictions.items():
        truth = job.eval_labels[name]
        values = {metric: METRICS[metric](truth, prediction) for metric in job.metrics}
        for metric, value in values.items():
            cell.records.append({**job.base, "method": job.method, "head_regularisation": regularisation,
                                 "seed": job.seed, "split": name, "metric": metric, "value": value,
                                 "n_train": len(job.train_inputs), "n_eval": int(len(truth)), "seconds": seconds,
                                 "seconds_per_step": per_step, "n_steps": result.n_steps,
                                 "degenerate": bool(reasons), **measured})
        cell.predictions[name] = np.asarray(prediction).tolist()
    return cell


def _threads() -> int:
    import torch

    return int(torch.get_num_threads())


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)


def run_jobs(jobs: Sequence[FinetuneJob], store: CellStore, *, workers: int = WORKERS, progress: Progress | None = None,
             stage: str = "cells (fine-tuning)", on_cell: Any = None) -> list[Cell]:
    """Every job's cell: finished ones loaded from `store`, the others fine-tuned in `workers`
    single-thread processes (`workers=1`: in this process, with its thread setting) and saved as each
    finishes; `on_cell(cell)` runs after each save. Cells come back in the order of `jobs`."""
    if workers < 1:
        raise InputError(f"`workers` must be >= 1, got {workers}", param="workers")
    progress = progress or NoProgress()
    progress.start(stage, len(jobs), unit="runs")
    cells: dict[int, Cell] = {}
    todo = []
    for index, job in enumerate(jobs):
        done = store.load(job.config, job.seed)
        if done is None:
            todo.append(index)
        else:
            cells[index] = reassessed(done, job.method)
    progress.advance(stage, len(cells), note="resumed")

    def finished(index: int, cell: Cell) -> None:
        store.save(cell)
        cells[index] = cell
        if on_cell is not None:
            on_cell(cell)
        progress.advance(stage, 1, note=f"{jobs[index].method} seed {jobs[index].seed}")

    if workers == 1 or len(todo) <= 1:
        for index in todo:
            finished(index, run_job(jobs[index]))
    else:
        # spawn: a fresh interpreter per worker (torch's threads and a fork do not mix)
        with multiprocessing.get_context("spawn").Pool(min(workers, len(todo)), initializer=_init_worker) as pool:
            for index, cell in pool.imap_unordered(_indexed, [(i, jobs[i]) for i in todo]):
                finished(index, cell)
    return [cells[i] for i in range(len(jobs))]


def _indexed(item: tuple[int, FinetuneJob]) -> tuple[int, Cell]:
    return item[0], run_job(item[1])


# ---- the pre-check ----------------------------------------------------------------------------


def run_precheck(model: str, data: str | os.PathLike[str], *, out: str | os.PathLike[str],
                 tasks: Sequence[str] = PRECHECK_TASKS, learning_rates: Sequence[float] = PRECHECK_LEARNING_RATES,
                 task_learning_rates: Mapping[str, Sequence[float]] | None = None,
                 epochs: dict[str, Sequence[int]] | None = None, validation_fraction: float = VALIDATION_FRACTION,
                 max_train: dict[str, int | None] | None = None, options: dict[str, Any] | None = None,
                 workers: int = WORKERS, progress: Progress | None = None) -> dict[str, Any]:
    """`none` fine-tuned (seed 0) for every (learning rate, epochs) of each task, in the order of
    `tasks`; `data` is the GLUE folder (SICK-E is read from SICK/ beside it). The setting with the best validation score (the task's first
    metric) is chosen per task; its evaluation scores are tested against the trivial baselines.
    `task_learning_rates` replaces `learning_rates` for the tasks it names (default
    PRECHECK_TASK_LEARNING_RATES); a choice at the largest or smallest rate is flagged `at_edge`.
    Writes OUT/cells/ (resumable), OUT/precheck.json and OUT/precheck.md after every finished cell;
    returns precheck.json's content."""
    out = Path(out)
    epochs = {**PRECHECK_EPOCHS, **(epochs or {})}
    rates = {name: tuple(float(r) for r in {**PRECHECK_TASK_LEARNING_RATES, **(task_learning_rates or {})}.get(
        name, learning_rates)) for name in tasks}
    max_train = {**MAX_TRAIN, **(max_train or {})}
    options = dict(options or {})
    for key in ("learning_rate", "epochs", "seed"):
        options.pop(key, None)
    unknown = [t for t in tasks if t not in PRECHECK_FOLDERS]
    if unknown:
        raise InputError(f"the pre-check runs the tasks {sorted(PRECHECK_FOLDERS)}, got {unknown}", param="tasks")
    splits: dict[str, FinetuneSplit] = {}
    jobs: list[FinetuneJob] = []
    for name in tasks:
        task = resolve_task(name, Path(data) / PRECHECK_FOLDERS[name])
        assert isinstance(task, SentenceTask)
        split = splits[name] = finetune_task(task, max_train=max_train.get(name), validation_fraction=validation_fraction)
        if VALIDATION_SPLIT not in split.task.splits:
            raise InputError("the pre-check chooses on a validation split; give `validation_fraction` > 0",
                             param="validation_fraction")
        for n_epochs in epochs[name]:
            for rate in rates[name]:
                setting = {**options, "learning_rate": float(rate), "epochs": int(n_epochs)}
                config = {"experiment": "finetune-precheck", "task": name, "model": model, "method": "none",
                          **split.sizes, "options": setting}
                base = {"experiment": "finetune-precheck", "task": name, "model": model, "regime": "finetune",
                        "learning_rate": float(rate), "epochs": int(n_epochs)}
                jobs.append(job_for(split.task, model, config, base, "none", 0, setting))
    store = CellStore(out)
    out.mkdir(parents=True, exist_ok=True)
    finished: list[Cell] = []

    def write(cell: Cell | None = None) -> dict[str, Any]:
        if cell is not None:
            finished.append(cell)
        summary = precheck_summary(finished, splits, jobs, model=model, options=options,
                                   learning_rates={t: list(rates[t]) for t in tasks},
                                   epochs={t: list(epochs[t]) for t in tasks})
        atomic_write_text(out / "precheck.json", json.dumps(summary, indent=2))
        atomic_write_text(out / "precheck.md", precheck_markdown(summary))
        return summary

    for job in jobs:  # resumed cells count from the start
        done = store.load(job.config, job.seed)
        if done is not None:
            finished.append(reassessed(done, job.method))
    write()
    run_jobs(jobs, store, workers=workers, progress=progress, stage="pre-check cells", on_cell=write)
    return write()


def precheck_summary(cells: Iterable[Cell], splits: dict[str, FinetuneSplit], jobs: Sequence[FinetuneJob], *,
                     model: str, options: dict[str, Any], learning_rates: dict[str, list[float]],
                     epochs: dict[str, list[int]]) -> dict[str, Any]:
    """Per task: every finished setting's scores, the trivial baselines, the chosen setting (best
    validation score of the task's first metric; complete when every setting has run) and its tests
    against the strongest trivial baseline on each evaluation split."""
    by_task: dict[str, list[Cell]] = {}
    for cell in cells:
        by_task.setdefault(cell.config["task"], []).append(cell)
    summary: dict[str, Any] = {"model": model, "method": "none", "seed": 0, "options": options,
                               "learning_rates": dict(learning_rates), "epochs": epochs, "tasks": {}}
    for name, split in splits.items():
        task = split.task
        primary = task.metrics[0]
        settings = []
        for cell in by_task.get(name, []):
            scores: dict[str, dict[str, float]] = {}
            for record in cell.records:
                scores.setdefault(record["split"], {})[record["metric"]] = record["value"]
            settings.append({"learning_rate": cell.config["options"]["learning_rate"],
                             "epochs": cell.config["options"]["epochs"], "scores": scores,
                             "seconds": cell.extra.get("seconds"), "seconds_per_step": cell.extra.get("seconds_per_step"),
                             "n_steps": cell.extra.get("n_steps"), "padding_fraction": cell.extra.get("padding_fraction"),
                             "degenerate": bool(cell.extra.get("degenerate_reasons"))})
        settings.sort(key=lambda s: (s["epochs"], s["learning_rate"]))
        eval_rows = {s: np.arange(len(task.splits[s].inputs)) for s in task.eval_splits}
        train_rows = np.arange(len(task.splits[task.train_split].inputs))
        baselines = trivial_baselines(task, train_rows, eval_rows)
        entry: dict[str, Any] = {
            "data": split.note, "n_train": int(len(train_rows)), "primary_metric": primary, "sizes": split.sizes,
            "eval_examples": {s: int(len(r)) for s, r in eval_rows.items()},
            "n_settings": sum(1 for j in jobs if j.config["task"] == name), "settings": settings,
            "trivial_baselines": [{"baseline": b.name, "split": s, "metric": m, "value": v}
                                  for b in baselines for s, values in b.scores.items() for m, v in values.items()]}
        candidates = [s for s in settings if VALIDATION_SPLIT in s["scores"] and not s["degenerate"]]
        if candidates:
            best = max(candidates, key=lambda s: (s["scores"][VALIDATION_SPLIT][primary], -s["learning_rate"]))
            chosen_cell = next(c for c in by_task[name] if c.config["options"]["learning_rate"] == best["learning_rate"]
                               and c.config["options"]["epochs"] == best["epochs"])
            tests = []
            for s in task.eval_splits:
                if s == VALIDATION_SPLIT or s not in chosen_cell.predictions:
                    continue
                prediction = np.asarray(chosen_cell.predictions[s])
                truth = task.splits[s].labels
                for metric in task.metrics:
                    candidates_b = [b for b in baselines if metric in b.scores.get(s, {})]
                    if not candidates_b:
                        continue
                    strongest = max(candidates_b, key=lambda b: b.scores[s][metric])
                    beats, test = beats_baseline(metric, truth, prediction, strongest.predictions[s], strongest.scores[s][metric])
                    tests.append({"split": s, "metric": metric, "value": float(METRICS[metric](truth, prediction)),
                                  "baseline": strongest.name, "baseline_value": strongest.scores[s][metric],
                                  "p_value": test.p_value, "test": test.test, "beats": beats})
            entry["chosen"] = {"learning_rate": best["learning_rate"], "epochs": best["epochs"],
                               "validation": best["scores"][VALIDATION_SPLIT][primary],
                               "complete": len(settings) == entry["n_settings"], "tests": tests,
                               "at_edge": len(learning_rates[name]) > 1 and best["learning_rate"] in (
                                   max(learning_rates[name]), min(learning_rates[name])),
                               "informative": bool(tests) and all(t["beats"] for t in tests)}
        summary["tasks"][name] = entry
    return summary


def precheck_markdown(summary: dict[str, Any]) -> str:
    """precheck.md: per task, every finished setting and the chosen one with its baseline tests."""
    lines = [f"# Fine-tuning pre-check: {summary['model']}, `none`, seed 0", "",
             f"Learning rates per task {summary['learning_rates']}; epochs per task {summary['epochs']}; other options "
             f"{summary['options'] or 'the defaults'}. Chosen per task: the best validation score of its first metric.", ""]
    for name, entry in summary["tasks"].items():
        primary = entry["primary_metric"]
        lines += [f"## {name}", "", entry["data"], "",
                  "| lr | epochs | validation | " + " | ".join(f"{s} {primary}" for s in entry["eval_examples"]
                                                              if s != VALIDATION_SPLIT) + " | s/step | steps | padding |",
                  "|---|---|---|" + "---|" * (len(entry["eval_examples"]) - 1) + "---|---|---|"]
        for s in entry["settings"]:
            values = [f"{s['scores'].get(split, {}).get(primary, float('nan')):.4f}" for split in entry["eval_examples"]
                      if split != VALIDATION_SPLIT]
            lines.append(f"| {s['learning_rate']:g} | {s['epochs']} | {s['scores'].get(VALIDATION_SPLIT, {}).get(primary, float('nan')):.4f} | "
                         + " | ".join(values) + f" | {s['seconds_per_step']:.2f} | {s['n_steps']} | {s['padding_fraction']:.1%} |"
                         + (" degenerate |" if s["degenerate"] else ""))
        lines.append("")
        lines.append("Trivial baselines: " + "; ".join(f"{b['baseline']} {b['split']} {b['metric']} {b['value']:.4f}"
                                                     for b in entry["trivial_baselines"]) + ".")
        chosen = entry.get("chosen")
        if chosen:
            state = "all settings finished" if chosen["complete"] else f"{len(entry['settings'])} of {entry['n_settings']} settings finished"
            if chosen.get("at_edge"):
                state += "; at the edge of the learning-rate range"
            lines += ["", f"Chosen: lr {chosen['learning_rate']:g}, {chosen['epochs']} epochs (validation {primary} "
                          f"{chosen['validation']:.4f}; {state}); {'informative' if chosen['informative'] else 'UNINFORMATIVE'}:"]
            lines += [f"- {t['split']} {t['metric']} {t['value']:.4f} vs {t['baseline']} {t['baseline_value']:.4f}: "
                      f"p = {t['p_value']:.3g} ({t['test']}) {'beats' if t['beats'] else 'does not beat'}"
                      for t in chosen["tests"]]
        else:
            lines += ["", f"No setting finished yet ({entry['n_settings']} to run)."]
        lines.append("")
    return "\n".join(lines)


def chosen_setting(folder: str | os.PathLike[str], task: str) -> dict[str, Any]:
    """The learning rate and epochs the pre-check in `folder` chose for `task`, with the training
    subsample it chose them on (`max_train`, `validation_fraction`), refusing a choice made before
    every setting had run or one whose `none` does not beat the trivial baselines."""
    path = Path(folder) / "precheck.json"
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise InputError(f"--precheck {folder}: cannot read {path} ({error}); run `lmgeom experiment finetune-precheck` "
                         "first", param="precheck") from None
    key = task.lower().replace("-", "")
    entry = summary.get("tasks", {}).get(key, {})
    chosen = entry.get("chosen")
    if not chosen:
        raise InputError(f"--precheck {folder}: no setting chosen for {task} yet; let the pre-check finish it",
                         param="precheck")
    if not chosen["complete"]:
        raise InputError(f"--precheck {folder}: the pre-check of {task} has not run every setting yet; resume it",
                         param="precheck")
    if not chosen["informative"]:
        raise InputError(f"--precheck {folder}: `none` does not beat the trivial baseline on {task} with the chosen "
                         "setting, so a comparison of methods there is uninformative", param="precheck")
    sizes = entry.get("sizes", {})
    return {"learning_rate": float(chosen["learning_rate"]), "epochs": int(chosen["epochs"]),
            "max_train": sizes.get("max_train"), "validation_fraction": sizes.get("validation_fraction", VALIDATION_FRACTION)}


def precheck_status_table(summary: dict[str, Any]) -> str:
    """One row per task of a pre-check summary: settings finished, the chosen setting, its validation
    score, its evaluation scores against the strongest trivial baseline (p of the test) and s/step."""
    lines = ["| task | settings run | chosen lr | epochs | validation | evaluation vs trivial baseline (p) | s/step | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for name, entry in summary["tasks"].items():
        chosen = entry.get("chosen")
        run = f"{len(entry['settings'])} of {entry['n_settings']}"
        if not chosen:
            lines.append(f"| {name} | {run} | | | | | | not run yet |")
            continue
        setting = next(s for s in entry["settings"] if s["learning_rate"] == chosen["learning_rate"] and s["epochs"] == chosen["epochs"])
        tests = "; ".join(f"{t['split']} {t['metric']} {t['value']:.3f} vs {t['baseline_value']:.3f} (p={t['p_value']:.2g})"
                          for t in chosen["tests"])
        verdict = ("informative" if chosen["informative"] else "uninformative") + ("" if chosen["complete"] else ", provisional")
        lines.append(f"| {name} | {run} | {chosen['learning_rate']:g} | {chosen['epochs']} | {entry['primary_metric']} "
                     f"{chosen['validation']:.3f} | {tests} | {setting['seconds_per_step']:.2f} | {verdict} |")
    return "\n".join(lines) + "\n"
