"""The report's attribution section, from RUN/attribution.json (`lmgeom attribute`): how much of each
layer's mean direction (the anisotropy), its variance (over all dimensions, and over its magnitude
outlier dimensions) and its largest activation each term of its model's sum rule writes (a pre-LN
block: the incoming residual resid_pre, the attention output attn_out and the MLP output mlp_out;
BERT: two sums per layer, at its LayerNorm inputs). One stacked bar per layer and sum: a segment per
term, the variance's cross terms a segment of their own, negative shares below zero; and a table per
quantity with the numbers of the file. Layer l >= 1 is block l's output; its incoming residual is
layer l - 1, so at layer 1 it is layer 0, the embedding output."""

from __future__ import annotations

import math
from typing import Any, Mapping

import pandas as pd

from lmgeom import rundir
from lmgeom.report.data import RunData
from lmgeom.report.figures import Segment, StackedBars, chart_subtitle, save_stacked
from lmgeom.report.html import Page, esc, table
from lmgeom.report.labels import label, layer_cell

# each term's colour, the same in every chart (matplotlib's tab10, as Plotly's default colours)
TERM_COLOURS = {"resid_pre": "#1f77b4", "attn_out": "#ff7f0e", "mlp_out": "#2ca02c", "resid_mid": "#9467bd"}
OTHER_COLOURS = ("#8c564b", "#e377c2", "#bcbd22", "#17becf")
CROSS = "cross"
CROSS_COLOUR = "#7f7f7f"
RESIDUAL_SHARE = 1e-3  # a sum rule whose residual exceeds this share of the layer's largest |x| does not hold there

# quantity: (chart title, whether it has cross terms)
QUANTITIES = {
    "mean": ("Mean direction (anisotropy): each term's share ⟨μ_k, μ⟩ / ‖μ‖² of the layer's mean μ = Σ_k μ_k", False),
    "variance": ("Total variance (all dimensions): each term's own variance and the cross terms between terms, as "
                 "shares of the layer's variance", True),
    "outliers": ("Variance of the magnitude outlier dimensions: each term's own variance and the cross terms, as shares "
                 "of those dimensions' summed variance", True),
    "massive": ("Largest activation of each layer: each term's value at the largest |x| entry, as a share of x there",
                False),
}


def read_attribution(run_dir: rundir.Where) -> dict[str, Any] | None:
    """attribution.json of a run, checked (`rundir.read_result`), or None when the run has none."""
    return rundir.read_result(run_dir, rundir.ATTRIBUTION)


def _number(value: Any) -> float:
    return math.nan if value is None else float(value)


def terms_of(document: Mapping[str, Any]) -> list[str]:
    """The terms of every sum in the document, in the order they first appear."""
    return list(dict.fromkeys(term for entry in document["layers"] for term in entry["terms"]))


def colours(terms: list[str]) -> dict[str, str]:
    """Each term's colour (`TERM_COLOURS`, others in turn), and the cross terms'."""
    others = iter(OTHER_COLOURS * (1 + len(terms)))
    return {**{term: TERM_COLOURS.get(term) or next(others) for term in terms}, CROSS: CROSS_COLOUR}


def _several_sums(document: Mapping[str, Any]) -> bool:
    return len({entry["sum"] for entry in document["layers"]}) > 1


def bar_name(entry: Mapping[str, Any], several: bool) -> str:
    """A (layer, sum) entry as its bar and table row are named: the layer (0 named), with the sum where
    the model has several (BERT's "attention" and "mlp")."""
    return layer_cell(int(entry["layer"])) + (f" {entry['sum']}" if several else "")


def _parts(parts: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """Each term's own share, and the cross terms of all of them summed (`CROSS`), of one variance split."""
    own = {term: _number(part["own"]) for term, part in parts.items()}
    return {**own, CROSS: sum(_number(part["cross"]) for part in parts.values())}


def pooled_outlier_parts(entry: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Each term's share (total, own, cross) of the summed variance of the layer's magnitude outlier
    dimensions: Σ_d Var(x_d) share_d / Σ_d Var(x_d) over them, which is Σ_d Cov / Σ_d Var(x_d)
    (`TermDecomposition.variance_parts` of those dimensions); {} for a layer without outlier dimensions."""
    dimensions = entry["outlier_dimensions"]
    variance = sum(float(d["variance"]) for d in dimensions)
    if not dimensions or variance <= 0:
        return {}
    return {term: {part: sum(float(d["variance"]) * _number(d["shares"][term][part]) for d in dimensions) / variance
                   for part in ("total", "own", "cross")} for term in entry["terms"]}


def shares(entry: Mapping[str, Any], quantity: str) -> dict[str, float]:
    """The segments of one (layer, sum) entry's bar for `quantity` (`QUANTITIES`): term -> share, and
    `CROSS` -> the cross terms' share for the variances. They sum to 1; {} where there is nothing
    (no outlier dimension, no largest entry)."""
    if quantity == "mean":
        return {term: _number(value) for term, value in entry["mean_shares"].items()}
    if quantity == "variance":
        return _parts(entry["variance_shares"])
    if quantity == "outliers":
        pooled = pooled_outlier_parts(entry)
        return _parts(pooled) if pooled else {}
    if quantity == "massive":
        return {term: _number(value) for term, value in entry["massive"][0]["shares"].items()} if entry["massive"] else {}
    raise ValueError(f"unknown quantity {quantity!r}; one of {', '.join(QUANTITIES)}")


def share_table(document: Mapping[str, Any], quantity: str) -> pd.DataFrame:
    """One row per (layer, sum) entry: what the bar of `quantity` draws, as the file gives it.

    mean: rows, ‖μ‖, each term's share, the sum rule's residual (as text, 2 significant digits) and max |x|; variance: each term's total
    share and its own part, and the cross terms summed; outliers: the same over the outlier dimensions
    (listed, with their summed variance); massive: the largest entry's word, position, dimension and
    value, and each term's share of it."""
    several = _several_sums(document)
    terms = terms_of(document)
    rows = []
    for entry in document["layers"]:
        row: dict[str, Any] = {"layer": bar_name(entry, several)}
        if quantity == "mean":
            row.update({"rows": int(entry["n_rows"]), "‖mean‖": _number(entry["mean_norm"]),
                        **{label(term): _number(entry["mean_shares"].get(term)) for term in terms},
                        "sum-rule residual": f"{_number(entry['residual']):.1e}", "max |x|": _number(entry["max_abs"])})
        elif quantity in ("variance", "outliers"):
            parts = entry["variance_shares"] if quantity == "variance" else pooled_outlier_parts(entry)
            if quantity == "outliers":
                dimensions = entry["outlier_dimensions"]
                row.update({"outlier dimensions": ", ".join(str(d["dimension"]) for d in dimensions) or "—",
                            "their variance": sum(float(d["variance"]) for d in dimensions) if dimensions else math.nan})
            for term in terms:
                part = parts.get(term) or {}
                row[f"{label(term)}: total"] = _number(part.get("total"))
                row[f"{label(term)}: own"] = _number(part.get("own"))
            row[label(CROSS)] = sum(_number(part["cross"]) for part in parts.values()) if parts else math.nan
        elif quantity == "massive":
            top = entry["massive"][0] if entry["massive"] else {}
            row.update({"word": top.get("word", "—"), "position": top.get("position", "—"),
                        "dimension": top.get("dimension", "—"), "x": _number(top.get("value")),
                        **{label(term): _number((top.get("shares") or {}).get(term)) for term in terms}})
        else:
            raise ValueError(f"unknown quantity {quantity!r}; one of {', '.join(QUANTITIES)}")
        rows.append(row)
    return pd.DataFrame(rows)


def _rows_phrase(document: Mapping[str, Any]) -> str:
    counts = sorted({int(entry["n_rows"]) for entry in document["layers"]})
    shown = f"{counts[0]:,}" if len(counts) == 1 else f"{counts[0]:,}–{counts[-1]:,}"
    return f"{shown} rows at each layer ({document['settings'].get('rows', 'every stored row')})" if counts else ""


def attribution_chart(document: Mapping[str, Any], quantity: str, run_label: str = "") -> StackedBars:
    """The stacked bars of `quantity` (`QUANTITIES`), one per (layer, sum) entry (`shares`); `run_label`
    for the subtitle."""
    title, crossed = QUANTITIES[quantity]
    several = _several_sums(document)
    terms = terms_of(document)
    palette = colours(terms)
    by_bar = [shares(entry, quantity) for entry in document["layers"]]
    segments = [Segment(label(name) if name != CROSS else "cross terms (Σ Cov(t_k, t_j), j ≠ k)",
                        [values.get(name, math.nan) for values in by_bar], palette[name])
                for name in [*terms, *([CROSS] if crossed else [])]]
    notes = {"mean": "the segments of a bar sum to 1; a negative share is a term pointing against the mean",
             "variance": "own variance per term and the cross terms; the segments of a bar sum to 1",
             "outliers": f"mean |x| more than {document['settings'].get('n_sigma', 3):g} standard deviations above its mean "
                         "over dimensions; no bar where a layer has none; the segments of a bar sum to 1",
             "massive": "the layer's largest |x| entry (word and dimension in the table); the segments of a bar sum to 1"}
    x_label = "layer (block l's output; its incoming residual is layer l − 1, layer 0 = embedding output)"
    return StackedBars(f"attribution_{quantity}", title, chart_subtitle(run_label, _rows_phrase(document)), x_label,
                       "share", [bar_name(entry, several) for entry in document["layers"]],
                       [segment for segment in segments if any(not math.isnan(v) for v in segment.values)],
                       note=notes[quantity])


def residual_note(document: Mapping[str, Any]) -> str:
    """The sum rule's residual in words: its largest value over the layers, and the layers where it does
    not hold (residual above `RESIDUAL_SHARE` of the layer's largest |x|)."""
    layers = document["layers"]
    worst = max((_number(entry["residual"]) for entry in layers), default=math.nan)
    broken = [bar_name(entry, _several_sums(document)) for entry in layers
              if _number(entry["residual"]) > RESIDUAL_SHARE * _number(entry["max_abs"])]
    text = f"The sum rule's residual, max |x − Σ_k t_k| against the stored x, is at most {worst:.2g} over the layers"
    if broken:
        text += (f"; it does not hold at layer {', '.join(broken)} (residual above {RESIDUAL_SHARE:g} of the layer's "
                 "largest |x|: a layer stored after the model's final norm), where the shares describe Σ_k t_k, "
                 "not the stored layer")
    return text + "."


def attribution_section(run: RunData, page: Page, out_path: rundir.Target) -> str | None:
    """The section's HTML on the page written to `out_path` (its charts saved under RUN/figures/), or
    None when the run has no attribution.json (the report then has no such section)."""
    document = read_attribution(run.path)
    if document is None:
        return None
    terms = terms_of(document)
    sums = "; ".join(f"{s['name']}: {s['sum']} = {' + '.join(s['terms'])}" for s in document.get("sums", []))
    notes = [f"Sum rule of the {document.get('family', '—')} family: {document.get('rule') or sums}.",
             "Layer l ≥ 1 is the output of transformer block l; its incoming residual (resid_pre) is the output of "
             f"layer l − 1, so at layer 1 it is layer 0, the {rundir.layer_name(0)} (layer 0 is written by no block: "
             "no bar).",
             *([f"Last layer: {document['last_layer']}."] if document.get("last_layer") else []),
             residual_note(document),
             "Each share is exact (population moments over every stored row); a share above 1 or below 0 is a term "
             "that another cancels. Terms: " + ", ".join(label(term) for term in terms) + ". The shares of each "
             f"outlier dimension and of the top {document['settings'].get('top_variance', 3)} dimensions by variance, "
             f"and every one of the {document['settings'].get('top_k', 10)} largest entries: "
             f"{rundir.ATTRIBUTION_CSV.name}."]
    body = f'<p class="note">{esc(" ".join(notes))}</p>'
    headings = {"mean": "Mean direction", "variance": "Total variance", "outliers": "Outlier dimensions' variance",
                "massive": "Largest activation"}
    for quantity in QUANTITIES:
        chart = attribution_chart(document, quantity, run.label)
        files = [rundir.link(out_path, path) for path in save_stacked(chart, run.path)]
        frame = share_table(document, quantity)
        text = [c for c in ("layer", "outlier dimensions", "word", "position", "dimension", "sum-rule residual") if c in frame]
        body += (f"<h3>{esc(headings[quantity])}</h3>" + page.chart(chart, files=files)
                 + table(frame, digits=3, text_columns=text))
    return body
