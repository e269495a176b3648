"""The local-isotropy thesis of Ding et al. (2022), tested across calibration-experiment cells.

Ding et al. explain why isotropy calibration brings no consistent gain by local isotropy (Cai et al.
2021): the representations are already isotropic within their clusters. The thesis predicts no
relation between what a method does to the task score and what it does to the isotropy of the
head's input. The steps, each its own function:

- `thesis_pairs`: records (results.json's `records`, any number of experiments, each tagged with its
  `source`) become one pair per (source, regime, task, model, head, features, pooling, method other
  than `none`, seed) on the task's first evaluation split and first metric (record order; the
  fine-tuning `validation` split never counts): Δ score, Δ global IsoScore (`isoscore_after`) and
  Δ local IsoScore (`local_isoscore_after`) of the head's input, each the method minus `none` of the
  same seed, and `none`'s raw-space local IsoScore (`local_isoscore_before`), the level of local
  isotropy. Degenerate cells (`degenerate`) are left out, and counted.
- `trivial_verdicts` / `drop_uninformative`: a configuration (source, regime, task, model, head,
  features, pooling, split, metric) is kept only when its `none` summary says it beats the strongest
  trivial baseline (`summary["trivial"]["beats"]`, written by `core.compare_with_trivial`);
  configurations without that verdict are dropped too unless `keep_unverified`.
- `standardised_pairs`: Δ score and each Δ isotropy as a z-score within its configuration (over the
  configuration's pairs, all methods and seeds, sd with ddof 1), so that MCC, F1 and accuracy, and
  IsoScores of different models, are on one scale.
- `thesis_test` (the Δ test): Spearman's rho of standardised Δ score against standardised Δ
  isotropy per regime and measure, a cluster-bootstrap interval (clusters: `CLUSTER_KEYS`, a
  method's seeds in one configuration, pooled over sources) and a permutation p that moves whole
  clusters' Δ-isotropy blocks.
- `level_test` (the level test): per configuration, the standardised mean Δ score (mean Δ / sd Δ
  over its pairs) against `none`'s local IsoScore level; clusters are the head inputs
  (`INPUT_KEYS`), since heads reading the same vectors share the level.
- `run_thesis`: all of it from results.json files to `thesis.json` and `thesis.png`.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Hashable, Iterable, Sequence

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from lmgeom.errors import InputError
from lmgeom.evaluate.tasks import spearman
from lmgeom import rundir

MEASURES = {"global": "isoscore_after", "local": "local_isoscore_after"}
LEVEL = "local_isoscore_before"  # of `none`: the raw-space local IsoScore of the head's input
PAIR_KEYS = ("source", "regime", "task", "model", "head", "features", "pooling", "seed")
CONFIG_KEYS = ("source", "regime", "task", "model", "head", "features", "pooling", "split", "metric")
CLUSTER_KEYS = ("regime", "task", "model", "head", "features", "pooling", "method")
INPUT_KEYS = ("regime", "task", "model", "features", "pooling")
EXCLUDED_SPLITS = ("validation",)
REGIMES = ("frozen", "finetune")
DELTAS = ("delta_score", *(f"delta_{name}" for name in MEASURES))
MIN_CLUSTERS = 3
SD_TOLERANCE = 1e-12

SETTINGS_TEXT = {
    "pairs": "one per (source results.json, regime, task, model, head, features, pooling, method other than none, "
             "seed): Δ = the method's value minus none's of the same seed, on the task's first evaluation split and "
             "first metric in record order (fine-tuning's validation split excluded); degenerate cells left out",
    "informative": "a configuration (source, regime, task, model, head, features, pooling, split, metric) is kept "
                   "only when the summary of its none row says it beats the strongest trivial baseline "
                   "(summary['trivial']['beats']: every seed at 0.05, core.compare_with_trivial); a configuration "
                   "whose results.json has no such verdict is dropped unless keep_unverified",
    "standardisation": "z-score within each configuration: (Δ - mean) / sd (ddof 1) over the configuration's pairs "
                       "(all methods and seeds with Δ score, Δ global and Δ local all finite), for Δ score and for "
                       "each Δ isotropy; a configuration with fewer than 2 such pairs or sd 0 is left out of the Δ "
                       "test. Dividing by the sd of none's score across seeds was not used: none's isotropy is the "
                       "same for every seed in the frozen regime (sd 0) and 3 seeds make such an sd unreliable. The "
                       "centring makes the Δ test within-configuration: do methods that move isotropy more than the "
                       "configuration's other methods also move the score more, pooled over configurations",
    "interval": "cluster bootstrap: the clusters (regime, task, model, head, features, pooling, method), each "
                "holding its seeds (and its pairs from every source), are drawn with replacement, as many as "
                "there are; Spearman's rho of the drawn pairs; percentile interval; the z-scores stay at their "
                "full-sample values; draws where a side is constant are skipped; fewer than 3 clusters: no "
                "rho, interval or p",
    "p_value": "two-sided permutation test of |rho|: the blocks of standardised Δ isotropy (x) are permuted across "
               "clusters of the same size, each cluster's Δ score block (y) staying in place and seeds keeping "
               "their order within a block; exact (every permutation) when they number at most n_permutations, "
               "else Monte Carlo with p = (1 + count) / (1 + n_permutations)",
    "level_test": "a second, separate test: per configuration, x = none's raw-space local IsoScore of the head's "
                  "input (local_isoscore_before, mean over seeds) and y = the configuration's standardised mean Δ "
                  "score (mean Δ score / its sd over the configuration's pairs, ddof 1; not centred, so it says "
                  "how far calibration moves the score on average); Spearman's rho over configurations, the "
                  "cluster bootstrap and the permutation test with clusters = head inputs (regime, task, model, "
                  "features, pooling), since heads reading the same vectors share the level",
}


# ---- statistics ---------------------------------------------------------------------------------


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a - a.mean(), b - b.mean()
    denominator = math.sqrt(float(a @ a) * float(b @ b))
    return float(a @ b / denominator) if denominator > 0 else float("nan")


def _cluster_members(clusters: Sequence[Hashable] | np.ndarray) -> list[np.ndarray]:
    """Row indices of each cluster, clusters in order of first appearance, rows in input order."""
    codes, _ = pd.factorize(pd.Series(list(clusters), dtype=object))
    return [np.flatnonzero(codes == c) for c in range(int(codes.max()) + 1)] if len(codes) else []


@dataclass
class ClusterInterval:
    rho: float
    low: float  # percentile cluster-bootstrap interval
    high: float
    n: int
    n_clusters: int
    n_resamples: int  # draws used (draws with a constant side are skipped)
    draws: np.ndarray = field(repr=False)  # rho of each used draw
    picks: np.ndarray = field(repr=False)  # (used draws, n_clusters): the clusters drawn


def cluster_bootstrap_spearman(x: ArrayLike, y: ArrayLike, clusters: Sequence[Hashable] | np.ndarray, *,
                               n_resamples: int = 2000, confidence: float = 0.95, seed: int = 0) -> ClusterInterval:
    """Spearman's rho of (x, y) with a percentile interval from a cluster bootstrap: each draw takes as
    many clusters as there are, with replacement, with all their rows."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if not (len(a) == len(b) == len(clusters)):
        raise InputError("x, y and clusters must have the same length")
    members = _cluster_members(clusters)
    k = len(members)
    if k < 2:
        raise InputError(f"a cluster bootstrap needs at least 2 clusters, got {k}")
    rng = np.random.default_rng(seed)
    draws, picks = [], []
    for _ in range(n_resamples):
        pick = rng.integers(0, k, size=k)
        rows = np.concatenate([members[c] for c in pick])
        rho = spearman(a[rows], b[rows])
        if np.isfinite(rho):
            draws.append(rho)
            picks.append(pick)
    tail = (1 - confidence) / 2
    low, high = np.quantile(draws, [tail, 1 - tail]) if draws else (np.nan, np.nan)
    return ClusterInterval(spearman(a, b), float(low), float(high), len(a), k, len(draws), np.asarray(draws),
                           np.asarray(picks, dtype=int).reshape(len(picks), k))


@dataclass
class ClusterPermutation:
    rho: float
    p_value: float
    n_permutations: int  # permutations evaluated (every one when exact)
    exact: bool
    n_clusters: int


def cluster_block_permutations(clusters: Sequence[Hashable] | np.ndarray) -> tuple[list[np.ndarray], list[list[int]]]:
    """The clusters' rows and the strata of clusters of equal size, between which x blocks can move."""
    members = _cluster_members(clusters)
    strata: dict[int, list[int]] = {}
    for c, rows in enumerate(members):
        strata.setdefault(len(rows), []).append(c)
    return members, list(strata.values())


def permuted_rows(members: list[np.ndarray], assignment: dict[int, int], n: int) -> np.ndarray:
    """Row index r such that x[r] gives cluster c the x block of cluster assignment[c], row by row."""
    index = np.arange(n)
    for target, origin in assignment.items():
        index[members[target]] = members[origin]
    return index


def cluster_permutation_p(x: ArrayLike, y: ArrayLike, clusters: Sequence[Hashable] | np.ndarray, *,
                          n_permutations: int = 10000, seed: int = 0) -> ClusterPermutation:
    """Two-sided permutation p of Spearman's |rho| that moves whole clusters: the x block of a cluster
    goes to another cluster of the same size (row i of the block to row i), y stays. Every
    permutation when they number at most n_permutations (p = share with |rho| >= observed), else
    n_permutations random ones (p = (1 + count) / (1 + n_permutations))."""
    from scipy.stats import rankdata

    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    members, strata = cluster_block_permutations(clusters)
    rx, ry = rankdata(a), rankdata(b)  # moving blocks only reorders x, so its ranks move with it
    observed = spearman(a, b)
    if not np.isfinite(observed):
        return ClusterPermutation(observed, float("nan"), 0, True, len(members))
    threshold = abs(observed) - 1e-12
    total = math.prod(math.factorial(len(s)) for s in strata)
    count = 0
    if total <= n_permutations:
        for orders in itertools.product(*(itertools.permutations(s) for s in strata)):
            assignment = {t: o for s, order in zip(strata, orders) for t, o in zip(s, order)}
            count += abs(_pearson(rx[permuted_rows(members, assignment, len(a))], ry)) >= threshold
        return ClusterPermutation(observed, count / total, total, True, len(members))
    rng = np.random.default_rng(seed)
    for _ in range(n_permutations):
        assignment = {t: o for s in strata for t, o in zip(s, rng.permutation(s))}
        count += abs(_pearson(rx[permuted_rows(members, assignment, len(a))], ry)) >= threshold
    return ClusterPermutation(observed, (1 + count) / (1 + n_permutations), n_permutations, False, len(members))


# ---- pairs, verdicts, standardisation -----------------------------------------------------------


def _fill_keys(frame: pd.DataFrame, keys: Iterable[str]) -> pd.DataFrame:
    for name in keys:
        if name not in frame:
            frame[name] = ""
        frame[name] = frame[name].fillna("").astype(str)
    return frame


def _flag(value: Any) -> bool:
    """True for a true value; False for false, None and nan."""
    return bool(value) and value == value


def thesis_pairs_with_drops(records: Iterable[dict[str, Any]]) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """`thesis_pairs` and what was left out on the way: method cells that are degenerate, and method
    cells whose `none` is degenerate or missing."""
    frame = pd.DataFrame(list(records))
    needed = {"method", "value", "split", "metric", *MEASURES.values()}
    if frame.empty or not needed <= set(frame):
        missing = sorted(needed - set(frame)) if not frame.empty else sorted(needed)
        raise InputError(f"the thesis test needs records with {sorted(needed)}; missing {missing}")
    frame = frame[~frame["split"].isin(EXCLUDED_SPLITS)].copy()
    frame = _fill_keys(frame, [*PAIR_KEYS, "method", "split", "metric"])
    if LEVEL not in frame:
        frame[LEVEL] = np.nan
    for column in ("value", LEVEL, *MEASURES.values()):
        frame[column] = pd.to_numeric(frame[column], errors="coerce").astype(np.float64)
    frame["degenerate"] = (frame["degenerate"].map(_flag) if "degenerate" in frame
                           else pd.Series(False, index=frame.index))
    primary = frame.groupby("task", sort=False)[["split", "metric"]].first()
    primary.columns = ["split_primary", "metric_primary"]
    frame = frame.join(primary, on="task")
    frame = frame[(frame["split"] == frame["split_primary"]) & (frame["metric"] == frame["metric_primary"])]
    keys = [*PAIR_KEYS, "split", "metric"]
    none = frame[frame["method"] == "none"].drop_duplicates(keys)
    methods = frame[frame["method"] != "none"]
    columns = ["value", LEVEL, *MEASURES.values(), "degenerate"]
    merged = methods.merge(none[keys + columns], on=keys, how="left", suffixes=("", "_none"), indicator=True)
    method_degenerate = merged["degenerate"].to_numpy(bool)
    no_none = (merged["_merge"] == "left_only").to_numpy()
    none_degenerate = ~no_none & merged["degenerate_none"].map(_flag).to_numpy(bool)
    drops = [{"stage": "pairing", "reason": reason, "n_pairs": int(mask.sum())} for reason, mask in (
        ("the method's cell is degenerate", method_degenerate),
        ("none's cell of that seed is degenerate", ~method_degenerate & none_degenerate),
        ("no none cell of that seed", ~method_degenerate & no_none)) if mask.any()]
    kept = merged[~method_degenerate & ~none_degenerate & ~no_none]
    pairs = kept[[*PAIR_KEYS, "method", "split", "metric"]].copy()
    pairs["value"] = kept["value"]
    pairs["value_none"] = kept["value_none"]
    pairs["delta_score"] = kept["value"] - kept["value_none"]
    for name, column in MEASURES.items():
        pairs[f"delta_{name}"] = kept[column] - kept[f"{column}_none"]
    pairs["level_none"] = kept[f"{LEVEL}_none"]
    return pairs.reset_index(drop=True), drops


def thesis_pairs(records: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """One row per (source, regime, task, model, head, features, pooling, method != none, seed):
    delta_score, delta_global, delta_local (the method minus `none`), level_none (`none`'s
    local_isoscore_before), split and metric; degenerate cells left out."""
    return thesis_pairs_with_drops(records)[0]


def configuration_key(row: dict[str, Any] | pd.Series) -> tuple[str, ...]:
    return tuple("" if row.get(k) is None else str(row.get(k)) for k in CONFIG_KEYS)


def trivial_verdicts(summaries: Iterable[dict[str, Any]]) -> dict[tuple[str, ...], dict[str, Any]]:
    """The trivial-baseline verdict of every configuration's `none` summary that carries one
    (summaries tagged with their `source`), by configuration key (`CONFIG_KEYS`)."""
    verdicts = {}
    for summary in summaries:
        trivial = summary.get("trivial")
        if str(summary.get("method")) != "none" or not isinstance(trivial, dict) or "beats" not in trivial:
            continue
        verdicts[configuration_key(summary)] = {
            "beats": bool(trivial["beats"]), "baseline": trivial.get("baseline"), "baseline_value": trivial.get("value"),
            "p_value": trivial.get("p_value"), "none_mean": summary.get("mean")}
    return verdicts


def drop_uninformative(pairs: pd.DataFrame, verdicts: dict[tuple[str, ...], dict[str, Any]], *,
                       keep_unverified: bool = False) -> tuple[pd.DataFrame, list[dict[str, Any]], list[dict[str, Any]]]:
    """The pairs of the configurations whose `none` beats the strongest trivial baseline (and, with
    keep_unverified, of those without a verdict); a table of every configuration's verdict; and the
    drops by reason."""
    if pairs.empty:
        return pairs, [], []
    keys = pairs.apply(configuration_key, axis=1)
    table, keep = [], pd.Series(False, index=pairs.index)
    for key, rows in pairs.groupby(keys, sort=False).groups.items():
        verdict = verdicts.get(key)
        status = "unverified" if verdict is None else "informative" if verdict["beats"] else "uninformative"
        kept = status == "informative" or (status == "unverified" and keep_unverified)
        keep.loc[rows] = kept
        table.append({**dict(zip(CONFIG_KEYS, key)), "status": status, "kept": kept, "n_pairs": len(rows),
                      **({k: v for k, v in verdict.items() if k != "beats"} if verdict else {})})
    drops = []
    for status, reason in (("uninformative", "none does not beat the strongest trivial baseline"),
                           ("unverified", "no trivial-baseline verdict in its results.json")):
        dropped = [t for t in table if t["status"] == status and not t["kept"]]
        if dropped:
            drops.append({"stage": "trivial baseline", "reason": reason, "n_pairs": sum(t["n_pairs"] for t in dropped),
                          "n_configurations": len(dropped)})
    return pairs[keep].reset_index(drop=True), table, drops


def standardise(frame: pd.DataFrame, columns: Sequence[str], group_keys: Sequence[str] = CONFIG_KEYS) -> pd.DataFrame:
    """A copy with z_<column> = (column - group mean) / group sd (ddof 1) for each column, within the
    groups of group_keys; nan in a group of fewer than 2 rows or with sd 0."""
    out = frame.copy()
    if out.empty:
        for column in columns:
            out[f"z_{column}"] = pd.Series(dtype=np.float64)
        return out
    grouped = out.groupby(list(group_keys), sort=False, dropna=False)
    for column in columns:
        mean = grouped[column].transform("mean")
        sd = grouped[column].transform(lambda s: s.std(ddof=1))
        usable = grouped[column].transform("count").ge(2) & sd.gt(SD_TOLERANCE)
        out[f"z_{column}"] = ((out[column] - mean) / sd).where(usable)
    return out


def standardised_pairs(pairs: pd.DataFrame) -> pd.DataFrame:
    """The pairs with all three Δ finite, with z_delta_score, z_delta_global and z_delta_local
    (`standardise` within each configuration)."""
    finite = pairs[np.isfinite(pairs[list(DELTAS)].to_numpy(np.float64)).all(axis=1)] if len(pairs) else pairs
    return standardise(finite.reset_index(drop=True), DELTAS)


# ---- the tests ----------------------------------------------------------------------------------


def _inference(x: np.ndarray, y: np.ndarray, clusters: Sequence[Hashable], *, n_resamples: int, n_permutations: int,
               confidence: float, seed: int) -> dict[str, Any]:
    n_clusters = len(set(clusters))
    entry: dict[str, Any] = {"n_clusters": n_clusters}
    rho = spearman(x, y) if len(x) >= 3 else float("nan")
    if not np.isfinite(rho):
        return {**entry, "rho": None, "note": "fewer than 3 points or a constant side"}
    if n_clusters < MIN_CLUSTERS:
        return {**entry, "rho": None, "rho_ignoring_clusters": rho,
                "note": f"{n_clusters} cluster(s), fewer than {MIN_CLUSTERS}: no rho, interval or p (the pairs are "
                        f"seeds of too few clusters; rho_ignoring_clusters is descriptive only)"}
    interval = cluster_bootstrap_spearman(x, y, clusters, n_resamples=n_resamples, confidence=confidence, seed=seed)
    permutation = cluster_permutation_p(x, y, clusters, n_permutations=n_permutations, seed=seed)
    return {**entry, "rho": rho, "low": interval.low, "high": interval.high, "n_resamples": interval.n_resamples,
            "p_value": permutation.p_value, "p_exact": permutation.exact, "n_permutations": permutation.n_permutations}


def thesis_test(pairs: pd.DataFrame, *, regimes: Sequence[str] = REGIMES, n_resamples: int = 2000,
                n_permutations: int = 10000, confidence: float = 0.95, seed: int = 0) -> list[dict[str, Any]]:
    """The Δ test, per regime and measure (global, local): Spearman's rho of the standardised Δ score
    against the standardised Δ of the measure (`standardised_pairs`), with a cluster-bootstrap
    interval and a cluster-permutation p (clusters: `CLUSTER_KEYS`); n_pairs, n_clusters,
    n_configurations; rho None with a note below 3 usable pairs or below 3 clusters."""
    z = standardised_pairs(pairs)
    results = []
    for regime in regimes:
        part = z[z["regime"] == regime] if len(z) else z
        for name in MEASURES:
            use = part[np.isfinite(part["z_delta_score"]) & np.isfinite(part[f"z_delta_{name}"])] if len(part) else part
            use = use.sort_values([*CLUSTER_KEYS, "source", "seed"], kind="stable") if len(use) else use
            entry: dict[str, Any] = {"test": "Δ score vs Δ isotropy (standardised)", "regime": regime, "measure": name,
                                     "n_pairs": int(len(use))}
            if len(use):
                entry["n_configurations"] = int(use.groupby(list(CONFIG_KEYS)).ngroups)
                clusters = [tuple(row) for row in use[list(CLUSTER_KEYS)].itertuples(index=False)]
                entry.update(_inference(use[f"z_delta_{name}"].to_numpy(), use["z_delta_score"].to_numpy(), clusters,
                                        n_resamples=n_resamples, n_permutations=n_permutations,
                                        confidence=confidence, seed=seed))
                entry.update(tasks=sorted(use["task"].unique().tolist()), models=sorted(use["model"].unique().tolist()),
                             methods=sorted(use["method"].unique().tolist()))
            else:
                entry.update(n_configurations=0, n_clusters=0, rho=None, note="no usable pairs")
            results.append(entry)
    return results


def level_points(pairs: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration: level (none's local_isoscore_before, mean over its seeds), mean and
    sd (ddof 1) of Δ score over its pairs with finite Δ score, and the standardised mean
    (mean / sd; nan with fewer than 2 pairs or sd 0)."""
    columns = [*CONFIG_KEYS, "level", "n_pairs", "mean_delta_score", "sd_delta_score", "standardised_mean_delta_score"]
    finite = pairs[np.isfinite(pairs["delta_score"].to_numpy(np.float64))] if len(pairs) else pairs
    if finite.empty:
        return pd.DataFrame(columns=columns)
    rows = []
    for key, group in finite.groupby(list(CONFIG_KEYS), sort=False):
        sd = float(group["delta_score"].std(ddof=1)) if len(group) >= 2 else float("nan")
        mean = float(group["delta_score"].mean())
        level = float(group.drop_duplicates("seed")["level_none"].mean())
        rows.append({**dict(zip(CONFIG_KEYS, key)), "level": level, "n_pairs": len(group), "mean_delta_score": mean,
                     "sd_delta_score": sd,
                     "standardised_mean_delta_score": mean / sd if np.isfinite(sd) and sd > SD_TOLERANCE else float("nan")})
    return pd.DataFrame(rows, columns=columns)


def level_test(pairs: pd.DataFrame, *, regimes: Sequence[str] = REGIMES, n_resamples: int = 2000,
               n_permutations: int = 10000, confidence: float = 0.95, seed: int = 0) -> list[dict[str, Any]]:
    """The level test, per regime: Spearman's rho over configurations of the standardised mean Δ score
    against none's local IsoScore level (`level_points`), with a cluster bootstrap and a cluster
    permutation p (clusters: head inputs, `INPUT_KEYS`)."""
    points = level_points(pairs)
    results = []
    for regime in regimes:
        part = points[points["regime"] == regime]
        finite = np.isfinite(part["level"].astype(float)) & np.isfinite(part["standardised_mean_delta_score"].astype(float))
        use = part[finite]
        use = use.sort_values([*INPUT_KEYS, "head", "source"], kind="stable")
        entry: dict[str, Any] = {"test": "Δ score vs local isotropy level under none", "regime": regime,
                                 "measure": "local level (none's local_isoscore_before)",
                                 "n_configurations": int(len(use)), "n_pairs": int(use["n_pairs"].sum())}
        if len(use):
            clusters = [tuple(row) for row in use[list(INPUT_KEYS)].itertuples(index=False)]
            entry.update(_inference(use["level"].to_numpy(float), use["standardised_mean_delta_score"].to_numpy(float),
                                    clusters, n_resamples=n_resamples, n_permutations=n_permutations,
                                    confidence=confidence, seed=seed))
            entry["points"] = use.to_dict(orient="records")
        else:
            entry.update(n_clusters=0, rho=None, note="no configuration with a level and a standardised mean Δ")
        results.append(entry)
    return results


# ---- figure and command -------------------------------------------------------------------------


def _interval_text(test: dict[str, Any] | None) -> str:
    test = test or {}
    counts = f"n = {test.get('n_pairs', 0)} pairs, {test.get('n_clusters', 0)} clusters"
    if test.get("rho") is None:
        return f"ρ n/a\n{counts}"
    return f"ρ = {test['rho']:+.2f} [{test['low']:+.2f}, {test['high']:+.2f}], p = {test['p_value']:.2g}\n{counts}"


def thesis_figure(pairs: pd.DataFrame, path: str | Path, *, tests: list[dict[str, Any]] | None = None,
                  title: str = "Standardised Δ task score against standardised Δ isotropy") -> Path:
    """One panel per (regime, measure): standardised Δ score against standardised Δ isotropy of the
    head's input, coloured by method, with rho and its interval (from `tests`, else computed) in the
    panel's title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    z = standardised_pairs(pairs)
    regimes = [r for r in REGIMES if len(z) and (z["regime"] == r).any()]
    regimes += sorted(set(z["regime"]) - set(regimes)) if len(z) else []
    if not regimes:
        raise InputError("no pairs to plot")
    if tests is None:
        tests = thesis_test(pairs, regimes=regimes)
    by_key = {(t["regime"], t["measure"]): t for t in tests}
    methods = sorted(z["method"].unique())
    colours = {m: plt.get_cmap("tab10")(i % 10) for i, m in enumerate(methods)}
    panels = [(regime, name) for regime in regimes for name in MEASURES]
    figure, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.0), squeeze=False)
    for axis, (regime, name) in zip(axes[0], panels):
        part = z[(z["regime"] == regime) & np.isfinite(z["z_delta_score"]) & np.isfinite(z[f"z_delta_{name}"])]
        for method, group in part.groupby("method"):
            axis.scatter(group[f"z_delta_{name}"], group["z_delta_score"], s=16, color=colours[method], label=str(method),
                         alpha=0.8)
        axis.axhline(0, color="grey", lw=0.5)
        axis.axvline(0, color="grey", lw=0.5)
        axis.set_xlabel(f"Δ {name} IsoScore of the head's input (z within configuration)", fontsize=8)
        axis.set_ylabel("Δ task score (z within configuration)", fontsize=8)
        axis.set_title(f"{regime}, {name}: {_interval_text(by_key.get((regime, name)))}", fontsize=8)
        if len(part):
            axis.legend(fontsize=7)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    path = Path(path)
    rundir.write_bytes(path, rundir.figure_bytes(figure, path.suffix.lstrip(".") or "png", 120))
    plt.close(figure)
    return path


def read_results(paths: Sequence[str | Path]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The records and summaries of results.json files, each tagged with its file as `source`."""
    records, summaries = [], []
    for path in paths:
        try:
            document = json.loads(Path(path).read_text(encoding="utf-8"))
            records += [{**r, "source": str(path)} for r in document["records"]]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise InputError(f"{path}: not a readable results.json with records ({error})") from None
        summaries += [{**s, "source": str(path)} for s in document.get("summaries", []) if isinstance(s, dict)]
    return records, summaries


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (np.bool_,)):
        return bool(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if np.isfinite(value) else None
    return value


def thesis_analysis(paths: Sequence[str | Path], *, keep_unverified: bool = False, n_resamples: int = 2000,
                    n_permutations: int = 10000, confidence: float = 0.95,
                    seed: int = 0) -> tuple[dict[str, Any], pd.DataFrame]:
    """thesis.json's document (settings, sources, drops, configurations' verdicts, the Δ tests, the
    level tests, the pairs used) and the kept pairs, from results.json files."""
    records, summaries = read_results(paths)
    pairs, drops = thesis_pairs_with_drops(records)
    n_formed = len(pairs)
    kept, configurations, trivial_drops = drop_uninformative(pairs, trivial_verdicts(summaries),
                                                             keep_unverified=keep_unverified)
    drops += trivial_drops
    z = standardised_pairs(kept)
    nonfinite = len(kept) - len(z)
    if nonfinite:
        drops.append({"stage": "standardisation", "reason": "a Δ is not finite (isotropy not recorded)",
                      "n_pairs": nonfinite, "tests": "Δ test only (the level test keeps them)"})
    z_columns = [f"z_{column}" for column in DELTAS]
    unusable = int((~np.isfinite(z[z_columns].to_numpy(float)).any(axis=1)).sum()) if len(z) else 0
    if unusable:
        drops.append({"stage": "standardisation", "reason": "configuration with fewer than 2 pairs or sd 0 for a Δ",
                      "n_pairs": unusable, "tests": "the Δ test of the measure concerned"})
    options: dict[str, Any] = dict(n_resamples=n_resamples, n_permutations=n_permutations, confidence=confidence,
                                   seed=seed)
    tests = thesis_test(kept, **options)
    levels = level_test(kept, **options)
    document = {
        "settings": {**SETTINGS_TEXT, "keep_unverified": keep_unverified, **options, "min_clusters": MIN_CLUSTERS,
                     "cluster_keys": list(CLUSTER_KEYS), "configuration_keys": list(CONFIG_KEYS),
                     "level_cluster_keys": list(INPUT_KEYS)},
        "sources": [str(p) for p in paths],
        "n_pairs_formed": n_formed, "n_pairs_kept": int(len(kept)),
        "dropped": drops, "configurations": configurations, "tests": tests, "level_tests": levels,
        "pairs": z.to_dict(orient="records"),
    }
    return _json_safe(document), kept


def claim_thesis_folder(out: Path, *, overwrite: bool = False) -> None:
    """Refuse, before any work, a folder whose thesis.json lmgeom did not write (`rundir.claim_file`), or
    one holding a thesis.png without lmgeom's thesis.json beside it, unless `overwrite`."""
    document, figure = rundir.THESIS.at(out), rundir.THESIS_FIGURE.at(out)
    rundir.claim_file(document, overwrite=overwrite)
    if not overwrite and Path(figure).exists() and not Path(document).exists():
        raise InputError(f"`out` {out} holds {rundir.THESIS_FIGURE.name} but no {rundir.THESIS.name} of lmgeom's "
                         "beside it, so it may be a user's file; nothing was written. Give another `out`, or pass "
                         "`overwrite=True` to replace it", param=("out", "overwrite"))


def run_thesis(paths: Sequence[str | Path], out: str | Path, *, overwrite: bool = False, **options: Any) -> dict[str, Any]:
    """`thesis_analysis` written to out/thesis.json (kind "thesis", `rundir.THESIS`), and out/thesis.png
    when a pair is left; a thesis.json or thesis.png there that lmgeom did not write is refused unless
    `overwrite` (`claim_thesis_folder`)."""
    out = Path(out)
    claim_thesis_folder(out, overwrite=overwrite)
    document, kept = thesis_analysis(paths, **options)
    out.mkdir(parents=True, exist_ok=True)
    figure = Path(rundir.THESIS_FIGURE.at(out))
    figure.unlink(missing_ok=True)  # an earlier run's: never left beside a document it does not draw
    rundir.write_json(rundir.THESIS.at(out), rundir.THESIS.kind, document)
    if document["pairs"]:
        thesis_figure(kept, figure, tests=document["tests"])
    return {**document, "figure": str(figure) if document["pairs"] else None}
