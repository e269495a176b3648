"""What the report calls each column and measure of the result files: one label per quantity.

The contextuality labels are the terminal's (`lmgeom run`, `lmgeom report`): "SelfSim", "IntraSim",
"adj" for raw minus baseline, and "MEV adj" for the SVD-ratio variant minus its baseline."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from lmgeom.engine.registry import measures
from lmgeom.rundir import layer_name

def number(value: Any, digits: int = 4) -> str:
    """A value as tables show it (the report's and the terminal's): a dash when missing (None, NaN),
    integers (and whole floats of 1,000 or more) with thousands separators, other numbers to `digits`
    decimals without a "-0.000"; anything else as its text."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) or float(value).is_integer() and abs(value) >= 1000:
        return f"{int(value):,}"
    text = f"{value:.{digits}f}"
    return text.lstrip("-") if float(text) == 0 else text


MEV_ADJ_COLUMN = "mev_svd_ratio_adjusted"
MEV_ADJ_NOTE = ("adj = raw − baseline (SelfSim and IntraSim: the layer's exact anisotropy; MEV: the same variant on "
                "sampled occurrences); MEV adj = the svd_ratio variant (TruncatedSVD's ratio, as the paper's released "
                "figures) minus its baseline")
"""The one MEV column of the per-layer tables (`lmgeom run`, `lmgeom report`, the HTML report), and the note
that says what every adjusted column is."""

LABELS = {
    # per layer (summary.json, contextuality.json)
    "layer": "layer",
    "layer_name": "layer name",
    "mean_norm": "mean norm",
    # each measure's label and its adjusted value's, as its statistic declares them
    **{m.name: m.label for m in measures()},
    **{f"{m.name}_adjusted": m.adjusted for m in measures() if m.baseline},
    # per word (contextuality_words.csv)
    "word": "word",
    "count": "occurrences",
    "contexts": "sentences",
    # isotropy (isotropy.json, calibration.json, STS records)
    "log_partition_isotropy": "log I(W)",
    "log_partition_isotropy_centered": "log I(W) centred",
    "partition_isotropy": "I(W)",
    "partition_isotropy_centered": "I(W) centred",
    "isoscore": "IsoScore",
    "average_cosine": "average cosine",
    "effective_rank": "effective rank",
    "participation_ratio": "participation ratio",
    "top1_variance_share": "top-1 PC variance share",
    "top10_variance_share": "top-10 PC variance share",
    "rogue_top_share": "top-3 rogue dimensions' cosine share",
    "average_cosine_without_rogue": "average cosine without rogue dimensions",
    "average_cosine_standardized": "average cosine, dimensions standardised",
    "local_isoscore": "IsoScore in clusters (local)",
    "local_log_partition_isotropy_centered": "log I(W) centred in clusters (local)",
    "local_average_cosine": "average cosine in clusters (local)",
    "local_average_cosine_centered": "average cosine centred in clusters (local)",
    "local_effective_rank": "effective rank in clusters (local)",
    "state": "state",
    # static-embedding benchmarks
    "vectors": "vectors",
    "benchmark": "benchmark",
    "task": "task",
    "metric": "metric",
    "score": "score (covered items)",
    "score_oov_mean": "score (OOV words as the mean vector)",
    "covered": "covered",
    "total": "items",
    "coverage": "coverage",
    # STS
    "file": "file",
    "dataset": "dataset",
    "method": "method",
    "fit_on": "fitted on",
    "aggregation": "aggregation",
    "spearman": "Spearman × 100",
    "n_pairs": "pairs",
    # the terms a layer is written from (attribution.json; `lmgeom.stages.attribution.DECOMPOSITIONS`)
    "resid_pre": "incoming residual (resid_pre)",
    "resid_mid": "residual after attention (resid_mid)",
    "attn_out": "attention output (attn_out)",
    "mlp_out": "MLP output (mlp_out)",
    "cross": "cross terms",
    # the logit lens (lens.json, lens_join.json)
    "entropy_mean": "entropy, mean (nats)",
    "entropy_median": "entropy, median (nats)",
    "kl_mean": "KL to the last layer, mean (nats)",
    "kl_median": "KL to the last layer, median (nats)",
    "rank_mean": "next token's rank, mean",
    "rank_median": "next token's rank, median",
    "top1": "top-1 share",
    # ablations (ablation.json, `lmgeom ablate`): what was found at each (site, layer)
    "site": "site",
    "n_positions": "positions",
    "rogue_dimensions": "rogue dimensions",
    "outlier_dimensions": "outlier dimensions (3σ)",
    "massive_dimensions": "massive dimensions",
    "massive_entries": "massive entries",
    "massive_per_dimension": "massive entries per dimension (mean value)",
    "massive_cutoff": "massive cutoff (|h| above)",
    "max_abs": "max |h|",
    "median_abs": "median |h|",
    # each ablation and its measures
    "ablation": "ablation",
    "dims": "dimensions",
    "n_edited": "entries edited per pass",
    "random_dims": "random controls' dimensions",
    "loss": "next-token loss (nats per token)",
    "attention_first": "attention to the first position",
    "attention_first_mean": "attention to the first position, mean over the later layers",
    "sts_layer": "STS-B Spearman × 100 at the ablated layer",
    "sts_last": "STS-B Spearman × 100 at the last layer",
    "pos_layer": "UPOS probe accuracy at the ablated layer",
    "pos_last": "UPOS probe accuracy at the last layer",
    "base": "unablated",
    "ablated": "ablated",
    "delta": "Δ [95% CI]",
    "random_delta": "random Δ",
    "excess": "Δ beyond random [95% CI]",
    "loss_unigram": "unigram loss (nats per token)",
    "pos_most_frequent_tag": "most-frequent-tag accuracy",
}


def layer_cell(layer: int) -> str:
    """A layer as the tables show it: its number, and layer 0 named (`rundir.layer_name`: the embedding output)."""
    return f"0 ({layer_name(0)})" if layer == 0 else str(layer)


def label(column: str) -> str:
    """The report's name for a column or measure (its words, spaced, where none is given)."""
    return LABELS.get(column, column.replace("_", " "))


def labelled(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with its columns renamed to their labels, for a table on the page."""
    return frame.rename(columns={c: label(c) for c in frame.columns if isinstance(c, str)})
