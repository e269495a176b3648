"""Sentence similarity (STS) scoring of given sentence vectors: Spearman x 100 between gold scores and
pair cosines, in both aggregations, with the isotropy of the vectors.

- Aggregations: "all" is the Spearman of the pooled pairs of all subsets; "mean" is the unweighted
  mean of the per-subset Spearman values (SentEval's "mean"; its "wmean" weights by subset size
  and is not reported). "mean" exists only for sets with more than one subset (the SemEval years).
- Encoding sentences, pooling layers and fitting calibrators is the STS stage,
  `lmgeom.stages.evaluate_sts`.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import numpy.typing as npt
from scipy.stats import spearmanr

from lmgeom.evaluate.sts_data import STSDataset
from lmgeom.metrics.base import unit_rows
from lmgeom.metrics.contextuality import average_cosine
from lmgeom.metrics.isotropy import isoscore, log_partition_isotropy

ISOTROPY_MEASURES = ("log_partition_isotropy", "isoscore", "average_cosine")


def spearman_x100(gold: npt.ArrayLike, predicted: npt.ArrayLike) -> float:
    """Spearman rank correlation x 100 (ties take their average rank)."""
    gold_scores, predicted_scores = np.asarray(gold, dtype=np.float64), np.asarray(predicted, dtype=np.float64)
    if gold_scores.shape != predicted_scores.shape or gold_scores.ndim != 1:
        raise ValueError(f"gold and predicted must be 1-D of equal length, got {gold_scores.shape} and {predicted_scores.shape}")
    if len(gold_scores) < 2:
        return float("nan")
    return float(spearmanr(gold_scores, predicted_scores).statistic * 100)


def pair_cosines(vectors1: np.ndarray, vectors2: np.ndarray) -> np.ndarray:
    """Row-wise cosine of two (n, dim) arrays; a zero vector has cosine 0 with anything."""
    units1, _ = unit_rows(np.asarray(vectors1, dtype=np.float64))
    units2, _ = unit_rows(np.asarray(vectors2, dtype=np.float64))
    return np.einsum("ij,ij->i", units1, units2)


def aggregate_scores(dataset: STSDataset, predicted: np.ndarray) -> dict[str, float]:
    """{"all": Spearman of all pairs} plus, for several subsets, {"mean": unweighted mean over subsets}."""
    scores = {"all": spearman_x100(dataset.scores, predicted)}
    names = dataset.subset_names
    if len(names) > 1:
        subsets = np.asarray(dataset.subsets)
        scores["mean"] = float(np.mean([spearman_x100(dataset.scores[subsets == s], predicted[subsets == s]) for s in names]))
    return scores



def isotropy_of(X: np.ndarray) -> dict[str, float]:
    """log I(W) (Mu & Viswanath), IsoScore and the average cosine of sentence vectors."""
    return {
        "log_partition_isotropy": log_partition_isotropy(X),
        "isoscore": isoscore(X),
        "average_cosine": average_cosine(X),
    }


def score_dataset(dataset: STSDataset, X: np.ndarray, settings: dict[str, Any]) -> list[dict[str, Any]]:
    """Tidy records of one dataset's sentence vectors X (rows in `dataset.sentences` order), one per aggregation."""
    index = {text: i for i, text in enumerate(dataset.sentences)}
    left = np.array([index[t] for t in dataset.sentences1])
    right = np.array([index[t] for t in dataset.sentences2])
    predicted = pair_cosines(X[left], X[right])
    isotropy = isotropy_of(X)
    identity = {"dataset": dataset.name, "split": dataset.split}
    sizes = {"n_pairs": len(dataset), "n_subsets": len(dataset.subset_names), "n_sentences": len(X)}
    return [
        {**identity, **settings, "aggregation": aggregation, "spearman": value, **sizes, **isotropy}
        for aggregation, value in aggregate_scores(dataset, predicted).items()
    ]


# ---- summaries ------------------------------------------------------------------------------


def summary_table(records: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """(header, rows): one row per (layer, method, fit_on) with Spearman x 100 per dataset and
    aggregation, their average over datasets ("all" aggregation), and the isotropy of the sentence
    vectors averaged over datasets."""
    datasets = list(dict.fromkeys(r["dataset"] for r in records))
    multi = {r["dataset"] for r in records if r["n_subsets"] > 1}
    score_columns = [c for d in datasets for c in ([f"{d} all", f"{d} mean"] if d in multi else [d])]
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for record in records:
        row = rows.setdefault((record["layer"], record["method"], record["fit_on"]), {"all": {}, "mean": {}, "isotropy": {}})
        row[record["aggregation"]][record["dataset"]] = record["spearman"]
        if record["aggregation"] == "all":
            row["isotropy"][record["dataset"]] = [record[m] for m in ISOTROPY_MEASURES]

    def cells(row: dict[str, Any], dataset: str) -> list[str]:
        values = [row[a].get(dataset) for a in (("all", "mean") if dataset in multi else ("all",))]
        return ["" if v is None else f"{v:.2f}" for v in values]

    header = ["layer", "method", "fit_on", *score_columns, "avg (all)", "log I(W)", "IsoScore", "avg cos"]
    body = []
    for (layer, method, fit_name), row in rows.items():
        scores = [cell for d in datasets for cell in cells(row, d)]
        average = f"{np.mean(list(row['all'].values())):.2f}" if len(row["all"]) == len(datasets) else ""
        isotropy = np.mean(list(row["isotropy"].values()), axis=0)
        body.append([layer, method, fit_name, *scores, average, f"{isotropy[0]:.2f}", f"{isotropy[1]:.3f}", f"{isotropy[2]:.3f}"])
    return header, body


FEW_ROWS_MARK = "*"
"""After a table cell whose calibrator was fitted on fewer than 2 sentences per dimension."""


def headline_grid(records: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) narrow enough for a terminal: one row per layer selection, one column per
    calibration (`method@corpus` when fitted on a corpus), each cell the Spearman x 100 of the "all"
    aggregation averaged over the datasets; `FEW_ROWS_MARK` after a cell whose calibrator was fitted on
    fewer than 2 sentences per dimension (`few_fit_rows`)."""
    scores, few = _grid_scores(records)
    columns = list(dict.fromkeys(column for by_column in scores.values() for column in by_column))
    rows = [[layer, *(f"{by_column[c]:.1f}{FEW_ROWS_MARK if (layer, c) in few else ''}" if c in by_column else ""
                      for c in columns)] for layer, by_column in scores.items()]
    return ["layer", *columns], rows


def best_calibration(records: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """(header, rows): per layer selection with a calibration, the uncalibrated score, the calibration
    (a `headline_grid` column) of the highest score and its gain over none, on the grid's scores;
    ties go to the earlier column."""
    rows = []
    for layer, by_column in _grid_scores(records)[0].items():
        calibrated = {column: value for column, value in by_column.items() if column != "none"}
        if not calibrated:
            continue
        best = max(calibrated, key=lambda column: calibrated[column])
        none = by_column.get("none")
        rows.append([layer, "" if none is None else f"{none:.1f}", best, f"{calibrated[best]:.1f}",
                     "" if none is None else f"{calibrated[best] - none:+.1f}"])
    return ["layer", "none", "best calibration", "score", "gain"], rows


def _grid_scores(records: Sequence[dict[str, Any]]) -> tuple[dict[str, dict[str, float]], set[tuple[str, str]]]:
    """{layer: {column: Spearman x 100 of the "all" aggregation averaged over datasets}}, columns as
    in `headline_grid`, in the records' order; and the (layer, column) cells fitted on few rows."""
    scores: dict[str, dict[str, list[float]]] = {}
    few: set[tuple[str, str]] = set()
    for record in records:
        if record["aggregation"] != "all":
            continue
        column = record["method"] if record["fit_on"] in ("none", "transductive") else f"{record['method']}@{record['fit_on']}"
        scores.setdefault(record["layer"], {}).setdefault(column, []).append(record["spearman"])
        if record.get("few_fit_rows"):
            few.add((record["layer"], column))
    means = {layer: {column: float(np.mean(values)) for column, values in by_column.items()} for layer, by_column in scores.items()}
    return means, few


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    lines.extend("| " + " | ".join(row) + " |" for row in rows)
    return "\n".join(lines) + "\n"
