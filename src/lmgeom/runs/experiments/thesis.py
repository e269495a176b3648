"""The local-isotropy thesis of Ding et al. (2022), tested across calibration-experiment cells.

Ding et al. explain why isotropy calibration brings no consistent gain by local isotropy (Cai et al.
2021): the representations are already isotropic within their clusters. The thesis predicts no
relation between what a method does to the task score and what it does to the isotropy of the
head's input. `thesis_pairs` turns records (results.json's `records`, any number of experiments)
into one pair per (regime, task, model, head, method other than `none`, seed):
    Δ score      = the method's score minus `none`'s (same regime, task, model, head, features, seed),
    Δ global     = the same difference of IsoScore of the head's input (`isoscore_after`),
    Δ local      = the same difference of the cluster-weighted local IsoScore (`local_isoscore_after`),
on each task's first evaluation split and first metric (the split the isotropy is measured on).
Degenerate cells are left out. `thesis_test` gives Spearman's rho of Δ score against each Δ with a
bootstrap interval, for the frozen and the fine-tuning regime separately.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from lmgeom.errors import InputError
from lmgeom.evaluate.stats import spearman_bootstrap

MEASURES = {"global": "isoscore_after", "local": "local_isoscore_after"}
PAIR_KEYS = ("regime", "task", "model", "head", "features", "pooling", "seed")
EXCLUDED_SPLITS = ("validation",)


def thesis_pairs(records: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """One row per (regime, task, model, head, features, method != none, seed): delta_score,
    delta_global, delta_local (the method minus `none`), split and metric."""
    frame = pd.DataFrame(list(records))
    needed = {"method", "value", "split", "metric", *MEASURES.values()}
    if frame.empty or not needed <= set(frame):
        missing = sorted(needed - set(frame)) if not frame.empty else sorted(needed)
        raise InputError(f"the thesis test needs records with {sorted(needed)}; missing {missing}")
    frame = frame[~frame["split"].isin(EXCLUDED_SPLITS)].copy()
    for name in PAIR_KEYS:
        if name not in frame:
            frame[name] = ""
    frame[list(PAIR_KEYS)] = frame[list(PAIR_KEYS)].fillna("").astype(str)
    if "degenerate" in frame:
        frame = frame[~frame["degenerate"].fillna(False).astype(bool)]
    primary = frame.groupby("task", sort=False)[["split", "metric"]].first()
    primary.columns = ["split_primary", "metric_primary"]
    frame = frame.join(primary, on="task")
    frame = frame[(frame["split"] == frame["split_primary"]) & (frame["metric"] == frame["metric_primary"])]
    keys = list(PAIR_KEYS)
    reference = frame[frame["method"] == "none"].set_index(keys)
    rows = []
    for _, row in frame[frame["method"] != "none"].iterrows():
        key: tuple[Any, ...] = tuple(row[k] for k in keys)
        if key not in reference.index:
            continue
        base = reference.loc[key]
        if isinstance(base, pd.DataFrame):
            base = base.iloc[0]
        rows.append({**{k: row[k] for k in keys}, "method": row["method"], "split": row["split"], "metric": row["metric"],
                     "delta_score": float(row["value"]) - float(base["value"]),
                     **{f"delta_{name}": float(row[column]) - float(base[column]) for name, column in MEASURES.items()}})
    return pd.DataFrame(rows)


def thesis_test(pairs: pd.DataFrame, *, regimes: Sequence[str] = ("frozen", "finetune"), n_resamples: int = 2000,
                seed: int = 0) -> list[dict[str, Any]]:
    """Per regime and measure (global, local): Spearman's rho of delta_score against the delta of
    the measure, its percentile bootstrap interval (95 %) and p, over the pairs of that regime with
    both differences finite; fewer than 3 such pairs give rho None and say so. The pairs of one
    configuration's seeds and of several tasks' metrics are pooled as they are (the interval treats
    pairs as independent draws)."""
    results = []
    for regime in regimes:
        part = pairs[pairs["regime"] == regime] if not pairs.empty else pairs
        for name in MEASURES:
            finite = part[np.isfinite(part[f"delta_{name}"]) & np.isfinite(part["delta_score"])] if len(part) else part
            entry: dict[str, Any] = {"regime": regime, "measure": name, "n_pairs": int(len(finite))}
            if len(finite) < 3:
                entry.update(rho=None, note="fewer than 3 pairs with finite differences")
            else:
                try:
                    result = spearman_bootstrap(finite[f"delta_{name}"], finite["delta_score"], n_resamples=n_resamples, seed=seed)
                except InputError as error:
                    entry.update(rho=None, note=str(error))
                else:
                    entry.update(rho=result.rho, low=result.low, high=result.high, p_value=result.p_value,
                                 n_resamples=result.n_resamples,
                                 tasks=sorted(finite["task"].unique().tolist()), methods=sorted(finite["method"].unique().tolist()))
            results.append(entry)
    return results


def thesis_figure(pairs: pd.DataFrame, path: str | Path, *, title: str = "Δ task score against Δ isotropy") -> Path:
    """Scatter of delta_score against delta_global and delta_local, one row of panels per regime."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    regimes = sorted(pairs["regime"].unique()) if not pairs.empty else []
    if not regimes:
        raise InputError("no pairs to plot")
    figure, axes = plt.subplots(len(regimes), len(MEASURES), figsize=(8, 3.2 * len(regimes)), squeeze=False)
    for r, regime in enumerate(regimes):
        part = pairs[pairs["regime"] == regime]
        for c, name in enumerate(MEASURES):
            axis = axes[r][c]
            for method, group in part.groupby("method"):
                axis.scatter(group[f"delta_{name}"], group["delta_score"], s=14, label=str(method))
            axis.axhline(0, color="grey", lw=0.5)
            axis.axvline(0, color="grey", lw=0.5)
            axis.set_xlabel(f"Δ {name} IsoScore of the head's input")
            axis.set_ylabel("Δ task score (method - none)")
            axis.set_title(f"{regime}", fontsize=9)
        axes[r][-1].legend(fontsize=7)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
