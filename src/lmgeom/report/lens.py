"""The report's logit-lens section, from RUN/lens.json (`lmgeom lens`) and RUN/lens_join.json
(`lmgeom lens-join`): per layer the mean (and median) entropy of the next-token distribution the layer
predicts through the model's final norm and unembedding, its KL divergence to the last layer's (both
in nats) and the share of positions whose actual next token is its top one; with the join, per layer
Spearman's rho between a word occurrence's lens entropy and its word's self-similarity with its
bootstrap interval (error bars), and the across-layers rho between the mean entropy and the TwoNN
intrinsic dimension in words. Layer 0 is the embedding output."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

import pandas as pd

from lmgeom import rundir
from lmgeom.report.data import RunData
from lmgeom.report.figures import LAYER_AXIS, Chart, chart_subtitle, layer_series, save_figure
from lmgeom.report.html import Page, esc, missing, table
from lmgeom.report.labels import label, layer_cell, number

LENS_COLUMNS = ("entropy_mean", "entropy_median", "kl_mean", "kl_median", "rank_median", "rank_mean", "top1")
"""The per-layer values of lens.json the table shows, in order."""

JOINED = ("entropy", "rank")  # the lens values lens_join.json relates to self-similarity


def read_lens(run_dir: rundir.Where) -> dict[str, Any] | None:
    """lens.json of a run, checked (`rundir.read_result`), or None when the run has none."""
    return rundir.read_result(run_dir, rundir.LENS)


def read_lens_join(run_dir: rundir.Where) -> dict[str, Any] | None:
    """lens_join.json of a run, checked (`rundir.read_result`), or None when the run has none."""
    return rundir.read_result(run_dir, rundir.LENS_JOIN)


def lens_label(settings: Mapping[str, Any]) -> str:
    """The model and the corpus (with its cut, "lee[:200]") the lens was computed on, as recorded."""
    model, corpus = settings.get("model_id"), settings.get("corpus_name") or settings.get("corpus")
    return " on ".join(str(part) for part in (model, corpus) if part)


def lens_table(document: Mapping[str, Any]) -> pd.DataFrame:
    """One row per layer of lens.json (0 named the embedding output): its positions, the mean and median
    entropy and KL to the last layer (nats), the median and mean rank of the next token, the top-1 share."""
    return pd.DataFrame([{"layer": layer_cell(int(row["layer"])), "positions": int(row["n"]),
                          **{label(column): row[column] for column in LENS_COLUMNS}} for row in document["layers"]])


def lens_charts(document: Mapping[str, Any]) -> list[Chart]:
    """The lens by layer: the entropy and the KL to the last layer, means solid and medians dashed (nats);
    the top-1 share."""
    rows = document["layers"]
    layers = [int(row["layer"]) for row in rows]
    counts = document.get("counts", {})
    subtitle = chart_subtitle(lens_label(document["settings"]),
                              f"{counts.get('n_positions', 0):,} positions of {counts.get('n_sentences', 0):,} sentences")

    def series(name: str, column: str, dash: bool = False) -> Any:
        return layer_series(name, layers, [row[column] for row in rows], dash=dash)

    return [
        Chart("lens_entropy_kl", "Logit lens by layer: entropy of the predicted next-token distribution and its KL "
              "divergence to the last layer's, in nats", subtitle, LAYER_AXIS, "nats",
              [series("entropy, mean", "entropy_mean"), series("entropy, median", "entropy_median", dash=True),
               series("KL to the last layer, mean", "kl_mean"), series("KL to the last layer, median", "kl_median", dash=True)],
              note="KL(p_l ‖ p_L) is 0 at the last layer by construction"),
        Chart("lens_top1", "Logit lens by layer: share of positions whose actual next token is the layer's top "
              "prediction", subtitle, LAYER_AXIS, "top-1 share", [series("top-1 share", "top1")]),
    ]


def _interval_phrase(settings: Mapping[str, Any], unit: str) -> str:
    n_boot = int(settings.get("n_boot") or 0)
    if not n_boot:
        return "no bootstrap interval (n_boot = 0)"
    return f"{float(settings.get('confidence', 0.95)):.0%} percentile bootstrap over {unit}, {n_boot:,} resamples"


def join_chart(join: Mapping[str, Any]) -> Chart:
    """Spearman's rho between lens entropy and self-similarity at each layer, its bootstrap interval as
    error bars, with a line at 0."""
    rows = join["by_layer"]
    settings = join["settings"]
    layers = [int(row["layer"]) for row in rows]
    entropy = [row["entropy"] for row in rows]
    series = replace(layer_series("entropy vs self-similarity", layers, [e["rho"] for e in entropy],
                                  band=([e["low"] for e in entropy], [e["high"] for e in entropy])), bars=True)
    counts = join.get("counts", {})
    subtitle = chart_subtitle(lens_label(settings.get("lens_settings") or {}),
                              f"{counts.get('pairs', 0):,} (occurrence, layer) pairs of {counts.get('sentences', 0):,} sentences",
                              "bars: " + _interval_phrase(settings, settings.get("bootstrap_unit", "sentence") + "s"))
    return Chart("lens_join_entropy", "Spearman's ρ between a word occurrence's lens entropy (at its last piece) and "
                 "its word's self-similarity, by layer", subtitle, LAYER_AXIS, "Spearman's ρ", [series], zero_line=True,
                 note="ρ < 0: occurrences of words with higher self-similarity get more peaked predictions (lower entropy) at "
                 "that layer")


def join_table(join: Mapping[str, Any]) -> pd.DataFrame:
    """One row per layer of lens_join.json: the words and occurrences joined, and for entropy and the next
    token's rank, Spearman's rho with self-similarity and its interval."""
    rows = []
    for row in join["by_layer"]:
        record: dict[str, Any] = {"layer": layer_cell(int(row["layer"])), "words": int(row["n_words"]),
                                  "occurrences": int(row["entropy"]["n"])}
        for key in JOINED:
            for part, name in (("rho", "ρ"), ("low", "low"), ("high", "high")):
                value = row[key][part]
                record[f"{key}: {name}"] = float("nan") if value is None else float(value)
        rows.append(record)
    return pd.DataFrame(rows)


def across_statement(join: Mapping[str, Any]) -> str:
    """The across-layers rho between the layer-mean entropy and the TwoNN intrinsic dimension, in words."""
    across = join.get("across_layers")
    if not across:
        return ("No rho across layers: the run had no geometry.json (the TwoNN dimension the mean entropy is related to) "
                f"when `{rundir.LENS_JOIN.producer}` ran.")
    settings = join["settings"]
    source = across.get("geometry") or rundir.GEOMETRY.name
    sentences = across.get("geometry_sentences")
    measured = f"{source}, measured on {sentences:,} sentences" if isinstance(sentences, int) else source
    return (f"Across layers: Spearman's ρ between the layer-mean lens entropy and the layer's TwoNN intrinsic "
            f"dimension ({measured}) over {across.get('n', len(across.get('layers', [])))} layers is "
            f"{number(across.get('rho'), 3)} [{number(across.get('low'), 3)}, {number(across.get('high'), 3)}] "
            f"({_interval_phrase(settings, 'layers')})" + (f"; {across['note']}." if across.get("note") else "."))


def _readout_note(document: Mapping[str, Any]) -> str:
    readout, counts = document.get("readout") or {}, document.get("counts") or {}
    norm = readout.get("final_norm")
    parts = [f"Each layer's hidden state read out through the model's final norm `{norm}` (applied to "
             f"{readout.get('final_norm_applied_to', '—')}) and" if norm else "Each layer's hidden state read out through",
             f"its unembedding, {readout.get('unembedding', '—')}"
             + (", with its bias" if readout.get("bias") else "")
             + (f", logits soft-capped at {readout['softcap']:g}" if readout.get("softcap") else "") + "."]
    parts.append(f"{counts.get('n_positions', 0):,} positions (those with a next token in the same sentence) of "
                 f"{counts.get('n_sentences', 0):,} sentences"
                 + (f", {counts['n_truncated']:,} sentences cut at the model's window" if counts.get("n_truncated") else "")
                 + "; entropy and KL in nats, KL(p_l ‖ p_L) to the last layer's distribution; rank 0 = the top.")
    parts.append("Early layers are not trained to be read this way: a high KL there says the readout does not fit, not "
                 f"that the layer holds nothing about the next token. Layer 0 = the {rundir.layer_name(0)}.")
    return " ".join(parts)


def lens_section(run: RunData, page: Page, out_path: rundir.Target) -> str | None:
    """The section's HTML on the page written to `out_path` (its charts saved under RUN/figures/), or
    None when the run has neither lens.json nor lens_join.json (the report then has no such section)."""
    lens, join = read_lens(run.path), read_lens_join(run.path)
    if lens is None and join is None:
        return None
    body = ""
    if lens is None:
        body += missing(f"no {rundir.LENS.name} in this run; run `{rundir.LENS.producer}` to write it")
    else:
        body += f'<p class="note">{esc(_readout_note(lens))}</p>'
        for chart in lens_charts(lens):
            body += page.chart(chart, files=[rundir.link(out_path, path) for path in save_figure(chart, run.path)])
        body += table(lens_table(lens), digits=3, text_columns=("layer",))
    body += "<h3>The lens and self-similarity</h3>"
    if join is None:
        return body + missing(f"no {rundir.LENS_JOIN.name} in this run; run `{rundir.LENS_JOIN.producer}` (the lens "
                              "computed into the run beside its analysed store) to relate the lens to self-similarity")
    settings = join["settings"]
    note = (f"Per layer, Spearman's ρ between each word occurrence's lens value at its last piece and its word's "
            f"self-similarity at that layer ({rundir.CONTEXTUALITY_WORDS.name}); interval: "
            f"{_interval_phrase(settings, settings.get('bootstrap_unit', 'sentence') + 's')} (seed {settings.get('seed')}).")
    chart = join_chart(join)
    return (body + f'<p class="note">{esc(note)}</p>'
            + page.chart(chart, files=[rundir.link(out_path, path) for path in save_figure(chart, run.path)])
            + table(join_table(join), digits=3, text_columns=("layer",))
            + f'<p class="note">{esc(across_statement(join))}</p>')
