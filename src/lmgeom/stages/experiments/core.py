"""What both experiments share: the task's data as units of vectors, seeded subsamples, resumable
cells, the summaries with their paired tests, and the files written to the experiment folder."""

from __future__ import annotations

import hashlib
import json
import os
import textwrap
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from lmgeom.errors import InputError
from lmgeom.atomic import atomic_write_text
from lmgeom.evaluate.baselines import TrivialBaseline, beats_baseline, trivial_baselines
from lmgeom.evaluate.stats import (DETECTABLE_ALPHA, DETECTABLE_POWER, detectable_difference, difference_of_means, holm_unique,
                                  mean_std, paired_permutation_test, seed_item_bootstrap)
from lmgeom.evaluate.tasks import METRICS, SentenceTask, TaggingTask, Task, load_task
from lmgeom.metrics.contextuality import sample_indexes
from lmgeom.metrics.isotropy import isoscore, local_isotropy, log_partition_isotropy
from lmgeom.metrics.isoscore_star import covariance_of, isoscore_star
from lmgeom.stages.experiments.features import FeatureCache, pooling_note
from lmgeom import rundir
from lmgeom.rundir import EXPERIMENT_CONFIG_KEYS, write_json

EVAL_SUBSAMPLE_SEED = 0  # the evaluation subsample is the same for every seed, so tests can pair them
N_RESAMPLES = 2000
GEOMETRY_MAX_ROWS = 2000
LOCAL_CLUSTERS = 8


def resolve_task(task: str, data: str | os.PathLike[str]) -> Task:
    """Read a task from its folder; `brown` takes the held-out files of lmgeom's ELMo split as test."""
    if task.lower() == "brown":
        from lmgeom.corpus.splits import brown_heldout_files

        return load_task(task, data, brown_test_files=brown_heldout_files(data))
    return load_task(task, data)


@dataclass
class TaskData:
    """A task's chosen examples: per split, the indexes into its split (sentences for tagging)."""

    task: Task
    train_rows: dict[int, np.ndarray]  # per seed
    eval_rows: dict[str, np.ndarray]
    sizes: dict[str, int | None]  # max_train and max_eval: part of every cell's identity

    @property
    def regression(self) -> bool:
        return isinstance(self.task, SentenceTask) and self.task.kind == "regression"

    @property
    def n_classes(self) -> int:
        if isinstance(self.task, TaggingTask):
            return len(self.task.tagset)
        return 1 if self.regression else int(self.task.splits[self.task.train_split].labels.max()) + 1

    def labels(self, split: str, rows: np.ndarray) -> np.ndarray:
        """Labels of the chosen rows (every word of the chosen sentences for tagging)."""
        task = self.task
        if isinstance(task, TaggingTask):
            index = {tag: i for i, tag in enumerate(task.tagset)}
            tags = task.splits[split].tags
            return np.array([index[t] for r in rows for t in tags[r]], dtype=np.int64)
        return task.splits[split].labels[rows]

    def units(self, cache: FeatureCache, split: str, rows: np.ndarray, *, pooling: str,
              layers: Sequence[int] | None) -> np.ndarray:
        """(n_layers, n_units, k, dim): per sentence (k=1), pair (k=2) or word (k=1)."""
        task = self.task
        if isinstance(task, TaggingTask):
            sentences = task.splits[split].sentences
            return cache.word_vectors([sentences[r] for r in rows], layers=layers)[:, :, None]
        inputs = [task.splits[split].inputs[r] for r in rows]
        if isinstance(task, SentenceTask) and task.pairs:
            left = cache.sentence_vectors([p[0] for p in inputs], pooling=pooling, layers=layers)
            right = cache.sentence_vectors([p[1] for p in inputs], pooling=pooling, layers=layers)
            return np.stack([left, right], axis=2)
        return cache.sentence_vectors([str(t) for t in inputs], pooling=pooling, layers=layers)[:, :, None]


def split_size(task: Task, split: str) -> int:
    part = task.splits[split]
    return len(part.sentences) if isinstance(task, TaggingTask) else len(part.inputs)  # type: ignore[union-attr]


def subsample(n: int, limit: int | None, seed: int) -> np.ndarray:
    """All rows, or a seeded sample of `limit` rows kept in their order."""
    if limit is not None and limit < 1:
        raise InputError(f"a subsample needs at least one row, got {limit}")
    return np.arange(n) if limit is None else sample_indexes(np.arange(n), limit, seed)


def task_data(task: Task, seeds: Sequence[int], *, max_train: int | None, max_eval: int | None) -> TaskData:
    n_train = split_size(task, task.train_split)
    return TaskData(
        task,
        {seed: subsample(n_train, max_train, seed) for seed in seeds},
        {split: subsample(split_size(task, split), max_eval, EVAL_SUBSAMPLE_SEED) for split in task.eval_splits},
        {"max_train": max_train, "max_eval": max_eval},
    )


def parse_seeds(seeds: int | Sequence[int]) -> list[int]:
    """An int N means seeds 0..N-1; a sequence is taken as is."""
    if isinstance(seeds, int):
        if seeds < 1:
            raise InputError(f"`seeds` must be at least 1, got {seeds}", param="seeds")
        return list(range(seeds))
    chosen = [int(s) for s in seeds]
    if not chosen or len(set(chosen)) != len(chosen):
        raise InputError(f"`seeds` needs distinct seeds, got {chosen}", param="seeds")
    outside = [seed for seed in chosen if not 0 <= seed < 2**32]
    if outside:
        raise InputError(f"`seeds` takes seeds from 0 to 2^32 - 1 (numpy's and torch's seeds); got {', '.join(map(str, outside))}",
                         param="seeds")
    return chosen


@dataclass(frozen=True)
class ExperimentOptions:
    """What every experiment takes, as one object (built by `lmgeom experiment ...` from its flags and
    passed whole): `seeds` (N: seeds 0..N-1, or the seeds), the seeded subsamples of `max_train`
    training and `max_eval` evaluation examples (sentences for a tagging task), the `pooling` of
    pieces into a sentence vector, and the `device` the model runs on, which is not among the
    settings (`to_settings`, which results.json records as `options`): it changes no cell's identity."""

    seeds: int | tuple[int, ...] = 3
    pooling: str = "mean"
    max_train: int | None = None
    max_eval: int | None = None
    device: str = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.seeds, int):
            object.__setattr__(self, "seeds", tuple(int(seed) for seed in self.seeds))
        parse_seeds(self.seeds)
        if self.pooling != "cls":  # the first position: a fine-tuning pooling (run_calibration checks the regime)
            pooling_note(self.pooling)
        for name in ("max_train", "max_eval"):
            value = getattr(self, name)
            if value is not None and int(value) < 1:
                raise InputError(f"`{name}` must be at least 1 (or None: every example), got {value}", param=name)

    @property
    def seed_list(self) -> list[int]:
        return parse_seeds(self.seeds)

    def to_settings(self) -> dict[str, Any]:
        return {"seeds": self.seed_list, "pooling": self.pooling, "max_train": self.max_train, "max_eval": self.max_eval}

    @classmethod
    def from_settings(cls, settings: dict[str, Any], *, device: str = "auto") -> ExperimentOptions:
        """The options `to_settings` recorded (those it lacks at their defaults)."""
        known = {name: settings[name] for name in ("pooling", "max_train", "max_eval") if name in settings}
        seeds = settings.get("seeds", cls.seeds)
        return cls(seeds=seeds if isinstance(seeds, int) else tuple(seeds), **known, device=device)


# ---- geometry ----------------------------------------------------------------------------------


def geometry(vectors: np.ndarray, *, reference: np.ndarray | None = None, seed: int = 0) -> dict[str, float]:
    """Global isotropy (log I(W), IsoScore; IsoScore* when `reference` rows are given: its
    shrinkage target C0 is their covariance, the training vectors in the same space) and local
    isotropy (size-weighted IsoScore inside k-means clusters) of rows, on a seeded sample. The
    experiments use seed 0 throughout, so the same vectors get the same measures in every cell."""
    X = np.asarray(vectors, dtype=np.float64)
    X = X[subsample(len(X), GEOMETRY_MAX_ROWS, seed)]
    measures = {"log_iw": log_partition_isotropy(X), "isoscore": isoscore(X)}
    if reference is not None:
        measures["isoscore_star"] = isoscore_star(X, covariance_of(reference))
    clusters = min(LOCAL_CLUSTERS, max(1, len(X) // 20))
    measures["local_isoscore"] = local_isotropy(X, n_clusters=clusters, seed=seed).weighted_mean["isoscore"]
    return measures


def prefixed(measures: dict[str, float], suffix: str) -> dict[str, float]:
    return {f"{name}_{suffix}": value for name, value in measures.items()}


# ---- cells -------------------------------------------------------------------------------------


@dataclass
class Cell:
    """One (configuration, seed): its records and its predictions per evaluation split."""

    config: dict[str, Any]
    seed: int
    records: list[dict[str, Any]] = field(default_factory=list)
    predictions: dict[str, list[float]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


class CellStore:
    """`cells/<hash>.json` per finished (configuration, seed): a re-run skips them."""

    def __init__(self, out: Path) -> None:
        self.folder = out / "cells"

    def path(self, config: dict[str, Any], seed: int) -> Path:
        key = json.dumps({**config, "seed": seed}, sort_keys=True)
        return self.folder / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"

    def load(self, config: dict[str, Any], seed: int) -> Cell | None:
        path = self.path(config, seed)
        if not path.exists():
            return None
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
            return Cell(document["config"], document["seed"], document["records"], document["predictions"],
                        document.get("extra", {}))
        except (ValueError, KeyError, TypeError) as error:  # truncated (a crash mid-write of an old file) or not a cell
            warnings.warn(f"experiment cell {path} is damaged ({type(error).__name__}: {error}); it is computed again",
                          stacklevel=2)
            return None

    def save(self, cell: Cell) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        document = {"config": cell.config, "seed": cell.seed, "records": cell.records,
                    "predictions": cell.predictions, "extra": cell.extra}
        atomic_write_text(self.path(cell.config, cell.seed), json.dumps(rundir.jsonable(document)))


# ---- summaries and tests -----------------------------------------------------------------------



def summarise(cells: list[Cell], data: TaskData, *, baseline: Callable[[dict[str, Any]], dict[str, Any] | None],
              family_key: str, n_resamples: int = N_RESAMPLES) -> list[dict[str, Any]]:
    """Per configuration and metric: mean ± std over seeds and their number, and against
    `baseline(record)` (the baseline configuration's key fields, or None for the baseline itself):
    `difference` (Δ, the difference of the per-seed means on the seeds both ran) and the paired
    permutation test on the same evaluation examples, predictions of the seeds both ran pooled (an
    example is swapped in every seed at once; its statistic, the pooled metric's difference, is
    `pooled_difference`). Holm across the configurations that differ only in `family_key`, each
    distinct test once (`holm_unique`: configurations with identical predictions in every seed
    are one test). A configuration with a degenerate cell (records with `degenerate` true) is a
    failure of its method: no test, `degenerate` true in its row."""
    records = pd.DataFrame([r for cell in cells for r in cell.records])
    if records.empty:
        return []
    keys = [k for k in EXPERIMENT_CONFIG_KEYS if k in records]
    predictions = _predictions(cells, keys)
    per_seed: dict[tuple[str, ...], dict[int, float]] = {}
    for group_keys, group in records.groupby(keys, sort=True, dropna=False):
        row = dict(zip(keys, group_keys))
        config = {k: str(v) for k, v in row.items() if k not in ("split", "metric")}
        per_seed[_config_id(config, str(row["split"])) + (str(row["metric"]),)] = {
            int(seed): float(value) for seed, value in zip(group["seed"], pd.to_numeric(group["value"], errors="coerce"))
            if np.isfinite(value)}
    summaries = []
    references: dict[int, dict[str, Any]] = {}
    for group_keys, group in records.groupby(keys, sort=True, dropna=False):
        row = dict(zip(keys, group_keys))
        values = pd.to_numeric(group["value"], errors="coerce").dropna()
        mean, std = mean_std(values.tolist()) if len(values) else (float("nan"), float("nan"))
        summary: dict[str, Any] = {**row, "mean": mean, "std": std, "n_seeds": int(len(values))}
        if "degenerate" in group and group["degenerate"].fillna(False).astype(bool).any():
            degenerate_seeds = sorted(int(s) for s in group.loc[group["degenerate"].fillna(False).astype(bool), "seed"])
            summary.update(degenerate=True, degenerate_seeds=degenerate_seeds)
        reference = baseline(row)
        if reference is not None and summary.get("degenerate"):
            summary.update(baseline=", ".join(f"{k}={v}" for k, v in reference.items()), p_value=None,
                           test="not tested: the method's layer is degenerate in seeds "
                                f"{summary['degenerate_seeds']} (a failure of the method, not a task result)")
        elif reference is not None:
            summary.update(_test(row, reference, predictions, data, n_resamples))
            config = {k: str(v) for k, v in row.items() if k not in ("split", "metric")}
            base_config = {**config, **{k: str(v) for k, v in reference.items()}}
            ours = per_seed.get(_config_id(config, str(row["split"])) + (str(row["metric"]),), {})
            theirs = per_seed.get(_config_id(base_config, str(row["split"])) + (str(row["metric"]),), {})
            summary["difference"], seeds = difference_of_means(ours, theirs)
            summary["difference_seeds"] = seeds
            references[id(summary)] = reference
        summaries.append(summary)
    _holm(summaries, family_key, references, predictions, keys)
    # table order: per split and metric, the configurations in the order they were run
    first_seen = {value: i for i, value in reversed(list(enumerate(records[family_key].astype(str))))}
    return sorted(summaries, key=lambda s: (str(s["split"]), str(s["metric"]), str(s.get("head", "")),
                                            first_seen.get(str(s[family_key]), 0)))


def _predictions(cells: list[Cell], keys: list[str]) -> dict[tuple[str, ...], dict[int, np.ndarray]]:
    """Per configuration and split (`_config_id`), the predictions of each seed."""
    predictions: dict[tuple[str, ...], dict[int, np.ndarray]] = {}
    for cell in cells:
        for split, values in cell.predictions.items():
            if not cell.records:
                continue
            config = {k: str(cell.records[0][k]) for k in keys if k not in ("split", "metric")}
            predictions.setdefault(_config_id(config, split), {})[cell.seed] = np.asarray(values)
    return predictions


def _config_id(config: dict[str, Any], split: str) -> tuple[str, ...]:
    return tuple(f"{k}={config[k]}" for k in sorted(config)) + (f"split={split}",)


def _test(row: dict[str, Any], reference: dict[str, Any], predictions: dict[tuple[str, ...], dict[int, np.ndarray]],
          data: TaskData, n_resamples: int) -> dict[str, Any]:
    config = {k: str(v) for k, v in row.items() if k not in ("split", "metric")}
    base_config = {**config, **{k: str(v) for k, v in reference.items()}}
    ours = predictions.get(_config_id(config, row["split"]), {})
    base = predictions.get(_config_id(base_config, row["split"]), {})
    seeds = sorted(set(ours) & set(base))
    baseline_label = ", ".join(f"{k}={v}" for k, v in reference.items())
    if not seeds:
        return {"baseline": baseline_label, "p_value": None, "test": "no baseline predictions"}
    truth = data.labels(row["split"], data.eval_rows[row["split"]]) if row["split"] in data.eval_rows else None
    if truth is None:
        return {"baseline": baseline_label, "p_value": None, "test": "unknown split"}
    result = paired_permutation_test(truth, np.stack([base[s] for s in seeds]), np.stack([ours[s] for s in seeds]),
                                     METRICS[row["metric"]], n_resamples=n_resamples, seed=0)
    crossed = seed_item_bootstrap(truth, np.stack([base[s] for s in seeds]), np.stack([ours[s] for s in seeds]),
                                  METRICS[row["metric"]], n_resamples=n_resamples, seed=0) if len(seeds) > 1 else None
    return {"baseline": baseline_label, "pooled_difference": result.difference, "p_value": result.p_value,
            "detectable_difference": detectable_difference(result),
            **({} if crossed is None else {
                "seed_item": {"difference": crossed.difference, "low": crossed.low, "high": crossed.high,
                              "p_value": crossed.p_value, "n_seeds": crossed.n_seeds, "n_resamples": crossed.n_resamples,
                              "test": "seeds and evaluation examples drawn with replacement, crossed (the same examples "
                                      "for every drawn seed); the mean over seeds of the per-seed difference; 95% "
                                      "percentile interval, shifted two-sided p"}}),
            "test": f"paired {result.method} over {result.n_examples} evaluation examples, seeds {seeds} pooled "
                    f"({result.n_resamples} resamples), two-sided; detectable_difference: the smallest pooled "
                    f"difference it detects with {DETECTABLE_POWER:.0%} power at {DETECTABLE_ALPHA} (normal "
                    "approximation from the null's spread)"}


def _holm(summaries: list[dict[str, Any]], family_key: str, references: dict[int, dict[str, Any]],
          predictions: dict[tuple[str, ...], dict[int, np.ndarray]], keys: Sequence[str]) -> None:
    """Holm per family (the rows that differ only in `family_key`), each distinct test once: rows
    whose predictions are identical in every seed are one test (`holm_duplicate_of` names the first),
    and a row identical to its baseline (`references[id(row)]`) is no test of its own. The family's
    count of distinct tests is `holm_family_size`."""
    families: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for summary in summaries:
        if summary.get("p_value") is not None:
            family = tuple((k, summary[k]) for k in EXPERIMENT_CONFIG_KEYS if k in summary and k != family_key)
            families.setdefault(family, []).append(summary)

    def fingerprint(row: dict[str, Any], changes: dict[str, Any] | None = None) -> str:
        config = {**{k: str(row[k]) for k in keys if k not in ("split", "metric")},
                  **{k: str(v) for k, v in (changes or {}).items()}}
        seeds = predictions.get(_config_id(config, str(row["split"])), {})
        if not seeds:
            return json.dumps(config, sort_keys=True)
        document = json.dumps({str(s): np.asarray(v).tolist() for s, v in sorted(seeds.items())})
        return hashlib.sha256(document.encode()).hexdigest()

    for members in families.values():
        identities = [fingerprint(m) for m in members]
        twins = [fingerprint(m, references.get(id(m))) == identity for m, identity in zip(members, identities)]
        tested = [i for i, twin in enumerate(twins) if not twin]
        adjusted, duplicate_of = holm_unique([members[i]["p_value"] for i in tested], [identities[i] for i in tested])
        size = len({identities[i] for i in tested})
        for position, index in enumerate(tested):
            summary = members[index]
            summary.update(p_holm=float(adjusted[position]), significant=bool(adjusted[position] < 0.05),
                           holm_family_size=size)
            twin_position = duplicate_of[position]
            if twin_position is not None:
                summary["holm_duplicate_of"] = str(members[tested[twin_position]][family_key])
        for index, twin in enumerate(twins):
            if twin:
                members[index].update(p_holm=None, significant=False, holm_family_size=size,
                                      holm_duplicate_of=f"the baseline ({members[index]['baseline']})")


# ---- trivial baselines -------------------------------------------------------------------------


def task_trivial_baselines(data: TaskData) -> dict[int, list[TrivialBaseline]]:
    """Per seed, the task's trivial baselines fitted on that seed's training rows (the same rows, so
    the same baselines, for every seed without --max-train) and scored on the evaluation rows."""
    fitted: dict[bytes, list[TrivialBaseline]] = {}
    result = {}
    for seed, rows in data.train_rows.items():
        key = np.asarray(rows).tobytes()
        if key not in fitted:
            fitted[key] = trivial_baselines(data.task, rows, data.eval_rows)
        result[seed] = fitted[key]
    return result


def trivial_rows(trivial: dict[int, list[TrivialBaseline]]) -> list[dict[str, Any]]:
    """results.json's `trivial_baselines`: one row per (baseline, split, metric), mean over seeds."""
    values: dict[tuple[str, str, str], dict[int, float]] = {}
    rules: dict[str, str] = {}
    for seed, baselines in trivial.items():
        for baseline in baselines:
            rules[baseline.name] = baseline.rule
            for split, scores in baseline.scores.items():
                for metric, value in scores.items():
                    values.setdefault((baseline.name, split, metric), {})[seed] = value
    return [{"baseline": name, "rule": rules[name], "split": split, "metric": metric,
             "value": float(np.mean(list(per_seed.values()))), "values_per_seed": per_seed}
            for (name, split, metric), per_seed in values.items()]


def compare_with_trivial(summaries: list[dict[str, Any]], cells: list[Cell], data: TaskData,
                         trivial: dict[int, list[TrivialBaseline]], *, family_key: str, reference: str,
                         n_resamples: int = N_RESAMPLES) -> None:
    """Test every summary row against the strongest trivial baseline of its split and metric, seed by
    seed (its p: the largest over seeds; it beats the baseline when every seed does), and flag rows
    `uninformative` that do not beat it or whose family's `reference` row (none, top) does not."""
    if not summaries or not any(trivial.values()):
        return
    keys = [k for k in EXPERIMENT_CONFIG_KEYS if k in summaries[0]]
    predictions = _predictions(cells, keys)
    for summary in summaries:
        split, metric = str(summary["split"]), str(summary["metric"])
        config = {k: str(summary[k]) for k in keys if k not in ("split", "metric")}
        ours = predictions.get(_config_id(config, split), {})
        truth = data.labels(split, data.eval_rows[split]) if split in data.eval_rows else None
        tests = []
        for seed, prediction in sorted(ours.items()):
            candidates = [b for b in trivial.get(seed, []) if split in b.scores and metric in b.scores[split]]
            if truth is None or not candidates:
                continue
            strongest = max(candidates, key=lambda b: b.scores[split][metric])
            value = strongest.scores[split][metric]
            beats, test = beats_baseline(metric, truth, prediction, strongest.predictions[split], value,
                                       n_resamples=n_resamples, seed=0)
            tests.append((seed, strongest.name, value, beats, test))
        if not tests:
            continue
        summary["trivial"] = {"baseline": tests[0][1], "value": float(np.mean([t[2] for t in tests])),
                              "p_value": max(t[4].p_value for t in tests), "beats": all(t[3] for t in tests),
                              "test": f"{tests[0][4].test}, per seed {[t[0] for t in tests]}; "
                                      "p: the largest over seeds; beats: every seed at 0.05",
                              "p_per_seed": {t[0]: t[4].p_value for t in tests}}
    family_beats: dict[tuple[Any, ...], bool] = {}
    for summary in summaries:
        if str(summary[family_key]) == reference and "trivial" in summary:
            family = tuple((k, summary[k]) for k in EXPERIMENT_CONFIG_KEYS if k in summary and k != family_key)
            family_beats[family] = summary["trivial"]["beats"]
    for summary in summaries:
        if "trivial" not in summary:
            continue
        family = tuple((k, summary[k]) for k in EXPERIMENT_CONFIG_KEYS if k in summary and k != family_key)
        reasons = []
        if not summary["trivial"]["beats"]:
            reasons.append("does not beat the trivial baseline")
        if not family_beats.get(family, True):
            reasons.append(f"{reference} does not beat the trivial baseline")
        summary["uninformative"] = bool(reasons)
        if reasons:
            summary["uninformative_reason"] = "; ".join(reasons)


def trivial_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per (split, metric): each trivial baseline's value."""
    grouped: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        grouped.setdefault((row["split"], row["metric"]), []).append(f"{row['baseline']} {row['value']:.4f}")
    return [f"{split} {metric}: {', '.join(values)}" for (split, metric), values in grouped.items()]


# ---- output files -------------------------------------------------------------------------------


def markdown_table(summaries: list[dict[str, Any]], varying: str) -> str:
    """One row per configuration and metric: mean ± std over seeds, difference to the baseline, p, Holm p."""
    header = ["task", "split", "features", "head", varying if varying != "features" else "method", "metric",
              "mean ± std", "seeds", "Δ vs baseline", "pooled Δ", "p", "p (Holm)", "detectable Δ",
              "seeds × examples: Δ [95% CI], p", "vs trivial"]
    header = list(dict.fromkeys(header))
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for s in summaries:
        def cell(name: str) -> str:
            if name == "mean ± std":
                return f"{s['mean']:.4f} ± {s['std']:.4f}"
            if name == "seeds":
                return str(s["n_seeds"])
            if name == "Δ vs baseline":
                if s.get("degenerate") and s.get("baseline"):
                    return "degenerate"
                return f"{s['difference']:+.4f}" if s.get("difference") is not None else "baseline"
            if name == "pooled Δ":
                return f"{s['pooled_difference']:+.4f}" if s.get("pooled_difference") is not None else ""
            if name == "p":
                return f"{s['p_value']:.3g}" if s.get("p_value") is not None else ""
            if name == "p (Holm)":
                if s.get("holm_duplicate_of"):
                    return f"= {s['holm_duplicate_of']}"
                return f"{s['p_holm']:.3g}{' *' if s.get('significant') else ''}" if s.get("p_holm") is not None else ""
            if name == "vs trivial":
                return trivial_verdict(s)
            if name == "detectable Δ":
                return f"±{s['detectable_difference']:.4f}" if s.get("detectable_difference") is not None else ""
            if name == "seeds × examples: Δ [95% CI], p":
                crossed = s.get("seed_item")
                return (f"{crossed['difference']:+.4f} [{crossed['low']:+.4f}, {crossed['high']:+.4f}], {crossed['p_value']:.3g}"
                        if crossed else "")
            return str(s.get(name, ""))
        lines.append("| " + " | ".join(cell(name) for name in header) + " |")
    return "\n".join(lines) + ("\n\nΔ: the difference of the per-seed means (seeds both ran); pooled Δ: the paired "
                               "test's statistic, the metric of all seeds' predictions pooled minus the baseline's. "
                               "Holm: per family (the rows differing only in the varied column), each distinct test "
                               "once (= names the row with identical predictions it duplicates). degenerate: the "
                               "method's layer collapsed, a failure of the method, not a task result. detectable Δ: "
                               f"the smallest pooled Δ the test detects with {DETECTABLE_POWER:.0%} power at "
                               f"{DETECTABLE_ALPHA} before Holm, given the two rows' predictions. seeds × examples: "
                               "the mean per-seed difference with a bootstrap that draws seeds and examples (crossed), "
                               "so the seed-to-seed spread widens its interval (two seeds or more)."
                               "\n* significant at 0.05 after Holm's correction. vs trivial: the one-sided test "
                               "against the strongest trivial baseline (p, the largest over seeds); uninformative: "
                               "the row, or its family's baseline row, does not beat it.\n")


def trivial_verdict(summary: dict[str, Any]) -> str:
    """`p=… beats`, `p=… uninformative`, or empty without a trivial baseline."""
    trivial = summary.get("trivial")
    if summary.get("degenerate"):
        return "degenerate (failure)"
    if not trivial:
        return ""
    return f"p={trivial['p_value']:.3g} {'uninformative' if summary.get('uninformative') else 'beats'}"


def write_figures(summaries: list[dict[str, Any]], out: Path, *, varying: str, title: str) -> list[rundir.Target]:
    """A bar chart of mean ± std per (split, metric), one bar per configuration, as PNG and SVG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frame = pd.DataFrame(summaries)
    if frame.empty:
        return []
    paths: list[rundir.Target] = []
    for (split, metric), group in frame.groupby(["split", "metric"], sort=True):
        labels = [f"{row[varying]}" + (f" ({row['head']})" if "head" in row and frame["head"].nunique() > 1 else "")
                  for _, row in group.iterrows()]
        width = max(4.0, 0.6 * len(group) + 2)
        figure, axis = plt.subplots(figsize=(width, 3.2))
        colours = ["tab:red" if row.get("significant") is True else "tab:blue" for _, row in group.iterrows()]
        axis.bar(range(len(group)), group["mean"], yerr=group["std"], color=colours, capsize=3)
        axis.set_xticks(range(len(group)), labels, rotation=45, ha="right", fontsize=8)
        axis.set_ylabel(metric)
        # wrapped to the figure's width (about 13 characters of 9 pt text per inch), so no title is cut
        axis.set_title(textwrap.fill(f"{title}: {split} (red: significant vs baseline, Holm)", int(width * 13)), fontsize=9)
        figure.tight_layout()
        for suffix in ("png", "svg"):
            paths.append(rundir.write_bytes(rundir.EXPERIMENT_FIGURE.at(out, name=f"{split}_{metric}.{suffix}"),
                                            rundir.figure_bytes(figure, suffix, 120)))
        plt.close(figure)
    return paths


@dataclass
class ExperimentResult:
    records: list[dict[str, Any]]
    summaries: list[dict[str, Any]]
    notes: list[str]
    out: Path
    paths: list[rundir.Target]
    trivial_baselines: list[dict[str, Any]] = field(default_factory=list)


def write_results(out: Path, kind: str, *, cells: list[Cell], summaries: list[dict[str, Any]], notes: list[str],
                  settings: dict[str, Any], varying: str, title: str,
                  trivial: list[dict[str, Any]] | None = None, model: dict[str, Any] | None = None) -> ExperimentResult:
    """`out/results.json` (`model`: the model's `model_id` and `layer_note`, `FeatureCache.provenance`),
    its table and figures."""
    records = [r for cell in cells for r in cell.records]
    extras = [{"config": cell.config, "seed": cell.seed, **cell.extra} for cell in cells if cell.extra]
    trivial = trivial or []
    paths = [write_json(rundir.EXPERIMENT_JSON.at(out), kind, {"settings": settings, "notes": notes, "records": records,
                                                      "summaries": summaries, "trivial_baselines": trivial,
                                                      "cells": extras}, store_meta=model)]
    table = markdown_table(summaries, varying)
    note_lines = "".join(f"- {note}\n" for note in notes)
    trivial_text = ("Trivial baselines (fitted on the training data, scored on the evaluation examples):\n\n"
                    + "".join(f"- {line}\n" for line in trivial_lines(trivial)) + "\n") if trivial else ""
    paths.append(rundir.write_text(rundir.EXPERIMENT_TABLE.at(out), f"# {title}\n\n{table}\n{trivial_text}{note_lines}"))
    paths.extend(write_figures(summaries, out, varying=varying, title=title))
    return ExperimentResult(records, summaries, notes, out, paths, trivial)
