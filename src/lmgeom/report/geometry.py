"""The report's geometry section, from RUN/geometry.json: the intrinsic-dimension profile over depth
(TwoNN, MLE and GRIDE, with their bootstrap intervals as bands), the outlier dimensions of every layer
(3-sigma on mean |h|, rogue dimensions by their share of the cosine, LayerNorm-weight outliers) and
the massive-activation table (token, word, position, dimension, value, ratio to the layer's median
|h|), and uniformity. Layer 0 is the embedding output."""

from __future__ import annotations

from typing import Any, Mapping

import pandas as pd

from lmgeom.report.data import RunData
from lmgeom.report.figures import LAYER_AXIS, Chart, Series, chart_subtitle, save_figure
from lmgeom.report.html import Page, esc, missing, not_measured, table
from lmgeom.report.labels import layer_cell
from lmgeom import rundir
from lmgeom.report.missing_data import missing_alignment

# the GRIDE scales drawn (of the n2 = 2, 4, ..., 64 it computes): a short and a long range
GRIDE_SHOWN = (8, 64)
MASSIVE_ROWS_SHOWN = 3  # top activations per layer in the table


def read_geometry(run_dir: rundir.Where) -> dict[str, Any] | None:
    """geometry.json of a run, or None when the run has none."""
    return rundir.read_result(run_dir, rundir.GEOMETRY)


def _estimate(layer: Mapping[str, Any], method: str, n2: int | None = None) -> Mapping[str, Any] | None:
    return next((e for e in layer["intrinsic_dimension"] if e["method"] == method and (n2 is None or e["n2"] == n2)), None)


def _layer(layer: int) -> str:
    """A layer as the tables show it (`labels.layer_cell`)."""
    return layer_cell(layer)


def _number(value: Any) -> float:
    return float("nan") if value is None else float(value)


def _value(entry: Mapping[str, Any] | None, key: str) -> float:
    value = None if entry is None else entry.get(key)
    return float("nan") if value is None else float(value)


def id_chart(document: Mapping[str, Any], label: str) -> Chart:
    """The intrinsic dimension of every layer by TwoNN, MLE and GRIDE, each with its bootstrap band
    (`label`: the run's, for the subtitle)."""
    layers = document["layers"]
    x = [float(layer["layer"]) for layer in layers]
    settings = document["settings"]["intrinsic_dimension"]
    series = []
    for name, method, n2 in (("TwoNN", "twonn", None), ("MLE", "mle", None),
                             *((f"GRIDE n2 = {n}", "gride", n) for n in GRIDE_SHOWN)):
        estimates = [_estimate(layer, method, n2) for layer in layers]
        if all(e is None for e in estimates):
            continue
        low, high = [_value(e, "low") for e in estimates], [_value(e, "high") for e in estimates]
        series.append(Series(name, x, [_value(e, "dimension") for e in estimates], dash=method == "gride",
                             band=(low, high) if settings["n_boot"] else None))
    bands = f"bands: {settings['interval']}, {settings['n_boot']:,} resamples of the points" if settings["n_boot"] else ""
    rows = f"the same {document['settings']['n_points']:,} occurrences at every layer"
    return Chart("intrinsic_dimension", f"Intrinsic dimension by layer: TwoNN, MLE (k = {settings['mle_k']}) and GRIDE estimates",
                 chart_subtitle(label, rows, bands), LAYER_AXIS, "intrinsic dimension", series)


def outlier_table(document: Mapping[str, Any]) -> pd.DataFrame:
    """One row per layer: its 3-sigma dimensions (mean |h|), rogue dimensions, median |h|, the largest |h|,
    anisotropy with and without the outlier dimensions, uniformity."""
    rows = []
    for layer in document["layers"]:
        top = layer["top_activations"][0] if layer["top_activations"] else {}
        rows.append({
            "layer": _layer(layer["layer"]),
            "3σ dimensions": ", ".join(str(d["dimension"]) for d in layer["outlier_dimensions"]) or "—",
            "rogue dimensions": ", ".join(map(str, layer["rogue_dimensions"])) or "—",
            "median |h|": layer["median_abs"], "largest |h|": abs(top.get("value", float("nan"))),
            "anisotropy": layer["anisotropy_sampled"], "anisotropy w/o 3σ": _number(layer["anisotropy_without_outlier_dimensions"]),
            "uniformity": _number(layer["uniformity"]), "alignment": _number(layer["alignment"]),
        })
    return pd.DataFrame(rows)


def massive_table(document: Mapping[str, Any], *, per_layer: int = MASSIVE_ROWS_SHOWN) -> pd.DataFrame:
    """The largest |h| of every layer, located: token (special or word), word, sentence position, dimension,
    value and its ratio to the layer's median |h|, massive by Sun et al.'s thresholds."""
    rows = []
    for layer in document["layers"]:
        for top in layer["top_activations"][:per_layer]:
            rows.append({"layer": _layer(layer["layer"]), "token": "special" if top["is_special"] else "word", "word": top["word"],
                         "sentence": top["sentence_id"], "position": top["position"], "dimension": top["dimension"],
                         "value": top["value"], "× median |h|": top["ratio_to_median"], "massive": "yes" if top["massive"] else ""})
    return pd.DataFrame(rows)


def layernorm_table(layernorm: Mapping[str, Any]) -> pd.DataFrame:
    """One row per LayerNorm weight outlier: the module, its block, the dimension, weight and z-score."""
    return pd.DataFrame([{"module": module["module"], "block": module["block"], "dimension": outlier["dimension"],
                          "weight": outlier["weight"], "z": outlier["z"]}
                         for module in layernorm.get("modules", []) for outlier in module["outliers"]])


def geometry_section(run: RunData, page: Page, out_path: rundir.Target) -> str:
    """The section's HTML on the page written to `out_path` (its chart saved under RUN/figures/ for
    papers), or a note when the run has no geometry.json."""
    document = read_geometry(run.path)
    if document is None:
        return missing(f"no {rundir.GEOMETRY.name} in this run; run `{rundir.GEOMETRY.producer}` to write it")
    chart = id_chart(document, run.label)
    files = [rundir.link(out_path, path) for path in save_figure(chart, run.path)]
    settings = document["settings"]
    outliers = settings["outliers"]
    duplicates = ", ".join(f"layer {layer['layer']}: {layer['n_duplicates']:,}" for layer in document["layers"] if layer["n_duplicates"])
    notes = [f"Exact duplicate rows removed before the estimates: {duplicates}." if duplicates else "No exact duplicate rows.",
             f"Outlier dimensions: mean |h| over the selected rows more than {outliers['n_sigma']:g} standard deviations above "
             f"the mean over dimensions; rogue: the {outliers['rogue_top_k']} dimensions contributing most to the cosine.",
             f"Top |h| over {outliers['top_over']}; {outliers.get('special_rows', '')}. Massive: {outliers['massive']}."]
    layernorm = document.get("layernorm_weights") or {}
    if layernorm.get("computed"):
        found = layernorm_table(layernorm)
        n_modules = len(layernorm["modules"])
        norms = (f"<p class=\"note\">{len(found)} outlier weights (|z| > {layernorm['n_sigma']:g} within each weight vector) "
                 f"in {n_modules} LayerNorm weight vectors of {esc(layernorm['model'])}.</p>"
                 + (table(found, digits=3, text_columns=("module",)) if len(found) else ""))
    else:
        norms = missing(f"LayerNorm-weight outliers {layernorm.get('note') or 'not computed'}")
    return (not_measured(missing_alignment(document)) + f"<p class=\"note\">{esc(' '.join(notes))}</p>" + page.chart(chart, files=files)
            + "<h3>Outlier dimensions, anisotropy and uniformity by layer</h3>"
            + table(outlier_table(document), digits=3, text_columns=("layer", "3σ dimensions", "rogue dimensions"))
            + "<h3>Massive activations: the largest |h| of each layer</h3>"
            + table(massive_table(document), digits=2, text_columns=("layer", "token", "word", "massive"))
            + "<h3>LayerNorm-weight outliers</h3>" + norms)
