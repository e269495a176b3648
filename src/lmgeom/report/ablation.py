"""The report's ablation section, from RUN/ablation.json (`lmgeom ablate`): what the unablated pass
found at each (site, layer) (rogue, outlier and massive dimensions, the massive entries and their
cutoff, max and median |h|); per measure (next-token loss, attention to the first position, STS-B and
UPOS at the ablated and at the last layer) a chart of each ablation's change Δ = ablated − unablated
with its 95% bootstrap interval as an error bar, beside the changes of its random controls (as many
dimensions drawn at random from the others) as small grey points, and a table of the file's numbers;
and the attention to the first position at every later layer, unablated and with each ablation.
Layer 0 is the embedding output."""

from __future__ import annotations

import math
from typing import Any, Mapping

import pandas as pd

from lmgeom import rundir
from lmgeom.report.data import RunData
from lmgeom.report.figures import Chart, Effect, EffectChart, chart_subtitle, layer_series, save_effects, save_figure
from lmgeom.report.html import Page, esc, table
from lmgeom.report.labels import label, layer_cell, number
from lmgeom.report.lens import lens_label

MEASURES = ("loss", "attention_first_mean", "sts_layer", "sts_last", "pos_layer", "pos_last")
"""The measures of an ablation's `effects` that get a chart and a table, in order (each where the file has it)."""

# measure: (what the chart's title says changes, its y axis, the items its bootstrap resamples)
MEASURE_CHARTS = {
    "loss": ("next-token loss (cross-entropy of the corpus through the final norm and the unembedding, nats per token)",
             "Δ loss (nats per token)", "sentences"),
    "attention_first_mean": ("attention share to the first position (mean over heads, later positions and the layers "
                             "after the ablated one)", "Δ attention share", "sentences"),
    "sts_layer": ("STS-B Spearman × 100 of mean-pooled sentence vectors at the ablated layer", "Δ Spearman × 100", "pairs"),
    "sts_last": ("STS-B Spearman × 100 of mean-pooled sentence vectors at the last layer", "Δ Spearman × 100", "pairs"),
    "pos_layer": ("UPOS accuracy of a linear probe at the ablated layer (refitted for each ablation)", "Δ accuracy",
                  "test sentences"),
    "pos_last": ("UPOS accuracy of a linear probe at the last layer (refitted for each ablation)", "Δ accuracy",
                 "test sentences"),
}
ABLATION_AXIS = "ablation (layer site: dimensions how; layer 0 = embedding output)"
ATTENTION_AXIS = "layer l (block l's attention, reading layer l − 1; layer 0 = embedding output)"
DIGITS = 3  # decimals of the tables' numbers


def read_ablation(run_dir: rundir.Where) -> dict[str, Any] | None:
    """ablation.json of a run, checked (`rundir.read_result`), or None when the run has none."""
    return rundir.read_result(run_dir, rundir.ABLATION)


def _number(value: Any) -> float:
    return math.nan if value is None else float(value)


def ablation_name(config: Mapping[str, Any]) -> str:
    """An ablation as its chart's category and its table's row are named: "layer site: dimensions how"
    ("12 resid_post: massive zero"; layer 0 named the embedding output)."""
    return f"{layer_cell(int(config['layer']))} {config['site']}: {config['dims_kind']} {config['how']}"


def measures_of(document: Mapping[str, Any]) -> list[str]:
    """The `MEASURES` some ablation of the document measured, in order."""
    found = {name for config in document["configs"] for name in config["effects"]}
    return [name for name in MEASURES if name in found]


def random_deltas(effect: Mapping[str, Any]) -> list[float]:
    """Each random control's change: its value minus the unablated one."""
    return [_number(value) - _number(effect["base"]) for value in effect.get("random") or []]


def _with_interval(value: Any, low: Any, high: Any) -> str:
    """'value [low, high]' to `DIGITS` decimals; the value alone where there is no interval."""
    if low is None or high is None:
        return number(_number(value), DIGITS)
    return f"{number(_number(value), DIGITS)} [{number(_number(low), DIGITS)}, {number(_number(high), DIGITS)}]"


def random_range(effect: Mapping[str, Any]) -> str:
    """The random controls' changes as 'lowest to highest' (the one value for one control; a dash for none)."""
    deltas = random_deltas(effect)
    if not deltas:
        return "—"
    low, high = number(min(deltas), DIGITS), number(max(deltas), DIGITS)
    return low if low == high else f"{low} to {high}"


def found_table(document: Mapping[str, Any]) -> pd.DataFrame:
    """One row per (site, layer) of the unablated pass: its positions, the dimensions of each kind, the
    massive entries (in all, and per dimension with their mean value), the massive cutoff, max and
    median |h|."""
    rows = []
    for site in document["sites"]:
        dims = site.get("dimensions") or {}
        per_dimension = site.get("massive_per_dimension") or {}
        means = site.get("massive_mean_value") or {}
        rows.append({
            label("site"): site["site"], "layer": layer_cell(int(site["layer"])), label("n_positions"): int(site["n_positions"]),
            **{label(f"{kind}_dimensions"): ", ".join(str(d) for d in dims.get(kind) or []) or "—"
               for kind in ("rogue", "outlier", "massive")},
            label("massive_entries"): int(site["massive_entries"]),
            label("massive_per_dimension"): "; ".join(f"{d}: {int(n):,} ({number(_number(means.get(d)), 1)})"
                                                      for d, n in per_dimension.items()) or "—",
            label("massive_cutoff"): _number(site["massive_cutoff"]), label("max_abs"): _number(site["max_abs"]),
            label("median_abs"): _number(site["median_abs"]),
        })
    return pd.DataFrame(rows)


def ablations_table(document: Mapping[str, Any]) -> pd.DataFrame:
    """One row per ablation: its name, the dimensions it edits, the entries it edits in one pass over the
    corpus, and the dimensions of each random control."""
    return pd.DataFrame([{label("ablation"): ablation_name(config),
                          label("dims"): ", ".join(str(d) for d in config["dims"]),
                          label("n_edited"): int(config["n_edited"]),
                          label("random_dims"): "; ".join(", ".join(str(d) for d in dims) for dims in config["random_dims"]) or "—"}
                         for config in document["configs"]])


def effect_table(document: Mapping[str, Any], measure: str) -> pd.DataFrame:
    """One row per ablation that measured `measure`: the unablated and the ablated value, Δ with its
    interval, the random controls' Δ (lowest to highest) and Δ beyond the controls' mean with its interval."""
    rows = []
    for config in document["configs"]:
        effect = config["effects"].get(measure)
        if effect is None:
            continue
        rows.append({label("ablation"): ablation_name(config), label("base"): _number(effect["base"]),
                     label("ablated"): _number(effect["ablated"]),
                     label("delta"): _with_interval(effect["delta"], effect.get("delta_low"), effect.get("delta_high")),
                     label("random_delta"): random_range(effect),
                     label("excess"): _with_interval(effect.get("excess"), effect.get("excess_low"), effect.get("excess_high"))})
    return pd.DataFrame(rows)


def _interval_phrase(settings: Mapping[str, Any], unit: str) -> str:
    n_boot = int(settings.get("n_boot") or 0)
    if not n_boot:
        return "no interval (n_boot = 0)"
    return f"bars: 95% percentile bootstrap over {unit}, {n_boot:,} resamples"


def _draws_phrase(settings: Mapping[str, Any]) -> str:
    draws = int(settings.get("random_draws") or 0)
    return f"{draws} random control{'s' if draws != 1 else ''} per ablation (seed {settings.get('seed', 0)})"


def effect_chart(document: Mapping[str, Any], measure: str) -> EffectChart:
    """Each ablation's change in `measure` with its interval (error bars), beside its random controls'
    changes (grey points), and a line at 0."""
    what, y_label, unit = MEASURE_CHARTS[measure]
    settings = document["settings"]
    configs = [config for config in document["configs"] if measure in config["effects"]]
    measured = [config["effects"][measure] for config in configs]
    effects = [Effect(ablation_name(config), _number(e["delta"]), _number(e.get("delta_low")), _number(e.get("delta_high")),
                      random_deltas(e)) for config, e in zip(configs, measured)]
    items = max((int(e.get("n_items") or 0) for e in measured), default=0)
    subtitle = chart_subtitle(lens_label(settings), f"{items:,} {unit}", _interval_phrase(settings, unit),
                              _draws_phrase(settings))
    return EffectChart(f"ablation_{measure}", f"Ablations: change in {what}, beside random dimensions", subtitle,
                       ABLATION_AXIS, y_label, effects, value_name="the ablation's Δ (ablated − unablated), 95% interval",
                       control_name="its random controls' Δ (as many dimensions drawn at random from the others)",
                       note="massive entries' control: the same tokens in as many random dimensions; at 0 the ablation "
                            "changes nothing")


def attention_layers(document: Mapping[str, Any]) -> list[int]:
    """The layers whose attention to the first position the unablated pass measured (block l's attention)."""
    return sorted(int(layer) for layer in (document.get("baseline") or {}).get("attention_first") or {})


def attention_chart(document: Mapping[str, Any]) -> Chart | None:
    """The attention share to the first position at each layer: unablated, and with each ablation (from its
    layer on); None when the file has no attention measured."""
    baseline = (document.get("baseline") or {}).get("attention_first") or {}
    configs = [config for config in document["configs"] if config["effects"].get("attention_first")]
    if not baseline or not configs:
        return None
    layers = attention_layers(document)
    series = [layer_series("unablated", layers, [baseline[str(layer)] for layer in layers])]
    for config in configs:
        per_layer = config["effects"]["attention_first"]
        keys = sorted(int(layer) for layer in per_layer)
        series.append(layer_series(f"ablated: {ablation_name(config)}", keys,
                                   [per_layer[str(layer)]["ablated"] for layer in keys], dash=True))
    counts = document.get("counts") or {}
    subtitle = chart_subtitle(lens_label(document["settings"]), f"{counts.get('n_sentences', 0):,} sentences")
    return Chart("ablation_attention_first", "Ablations: attention share to the first position at each layer (mean over "
                 "heads and later positions), unablated and with each ablation", subtitle, ATTENTION_AXIS,
                 "attention share to the first position", series,
                 note="each ablation's line starts at its own layer: the blocks before it are not changed",
                 x_range=(float(layers[0]), float(layers[-1])))


def attention_table(document: Mapping[str, Any]) -> pd.DataFrame:
    """One row per layer: the unablated attention share to the first position, and each ablation's
    (a dash before its layer)."""
    baseline = (document.get("baseline") or {}).get("attention_first") or {}
    configs = [config for config in document["configs"] if config["effects"].get("attention_first")]
    rows = []
    for layer in attention_layers(document):
        row: dict[str, Any] = {"layer": layer_cell(layer), label("base"): _number(baseline[str(layer)])}
        for config in configs:
            entry = config["effects"]["attention_first"].get(str(layer))
            row[ablation_name(config)] = _number(entry["ablated"]) if entry else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def trivial_note(document: Mapping[str, Any]) -> str:
    """The trivial baselines in words: the unigram loss, the most-frequent-tag accuracy (those recorded)."""
    trivial = document.get("trivial") or {}
    parts = []
    if trivial.get("loss_unigram") is not None:
        why = trivial.get("loss_unigram_note")
        parts.append(f"{label('loss_unigram')}: {number(_number(trivial['loss_unigram']), DIGITS)}"
                     + (f" ({why})" if why else ""))
    if trivial.get("pos_most_frequent_tag") is not None:
        parts.append(f"{label('pos_most_frequent_tag')} (each test word's most frequent tag in the probe's training "
                     f"sentences): {number(_number(trivial['pos_most_frequent_tag']), DIGITS)}")
    return "Trivial baselines: " + "; ".join(parts) + "." if parts else ""


def definitions_note(document: Mapping[str, Any]) -> str:
    """What the section's words mean, from the file's `definitions`: the layers, zero and mean, the
    massive entries, Δ and Δ beyond random; and the controls."""
    definitions = document.get("definitions") or {}
    settings = document["settings"]
    counts = document.get("counts") or {}
    parts = [f"{len(document['configs'])} ablation{'s' if len(document['configs']) != 1 else ''} of "
             f"{lens_label(settings) or '—'}: {counts.get('n_sentences', 0):,} sentences, "
             f"{counts.get('n_positions', 0):,} positions"
             + (f", {counts['sts_pairs']:,} STS-B pairs" if counts.get("sts_pairs") else "")
             + (f", {counts['pos_test_words']:,} UPOS test words" if counts.get("pos_test_words") else "") + ".",
             f"Layers: {definitions.get('layer') or f'0 = the {rundir.layer_name(0)}'}."]
    for how in ("zero", "mean"):
        if definitions.get(how):
            parts.append(f"{how}: {definitions[how]}.")
    if definitions.get("massive"):
        parts.append(f"massive: {definitions['massive']}.")
    parts.append(f"Controls: {_draws_phrase(settings)}, each as many dimensions drawn at random from the others.")
    for key, name in (("delta", "Δ"), ("excess", "Δ beyond random")):
        if definitions.get(key):
            parts.append(f"{name}: {definitions[key]}.")
    parts.append(f"Every (ablation, measure) row, the attention at each layer included: {rundir.ABLATION_CSV.name}.")
    return " ".join(parts)


def kinds_note(document: Mapping[str, Any]) -> str:
    """How the unablated pass found each kind of dimension (the sites' notes, each once)."""
    settings = document["settings"]
    rogue = list(dict.fromkeys((site.get("notes") or {}).get("rogue") for site in document["sites"]))
    outlier = list(dict.fromkeys((site.get("notes") or {}).get("outlier") for site in document["sites"]))
    parts = [f"rogue: {'; '.join(str(n) for n in rogue if n)}" if any(rogue) else "",
             f"outlier: {'; '.join(str(n) for n in outlier if n)}" if any(outlier) else "",
             f"massive: entries with |h| above the cutoff, the larger of {_number(settings.get('massive_min_magnitude')):g} "
             f"and {_number(settings.get('massive_min_ratio')):g} × the median |h|, at every position (special tokens "
             "included)"]
    return "How each kind was found: " + "; ".join(part for part in parts if part) + "."


def ablation_section(run: RunData, page: Page, out_path: rundir.Target) -> str | None:
    """The section's HTML on the page written to `out_path` (its charts saved under RUN/figures/), or
    None when the run has no ablation.json (the report then has no such section)."""
    document = read_ablation(run.path)
    if document is None:
        return None
    body = f'<p class="note">{esc(definitions_note(document))}</p>'
    if document.get("notes"):
        body += f'<p class="note">{esc(" ".join(str(note) for note in document["notes"]))}</p>'
    body += ("<h3>What the unablated pass found</h3>" + table(found_table(document), digits=DIGITS, text_columns=("layer",))
             + f'<p class="note">{esc(kinds_note(document))}</p>')
    body += "<h3>The ablations</h3>" + table(ablations_table(document))
    trivial = trivial_note(document)
    if trivial:
        body += f'<p class="note">{esc(trivial)}</p>'
    for measure in measures_of(document):
        chart = effect_chart(document, measure)
        files = [rundir.link(out_path, path) for path in save_effects(chart, run.path)]
        body += (f"<h3>{esc(label(measure)[:1].upper() + label(measure)[1:])}</h3>" + page.chart(chart, files=files)
                 + table(effect_table(document, measure), digits=DIGITS))
    attention = attention_chart(document)
    if attention is not None:
        files = [rundir.link(out_path, path) for path in save_figure(attention, run.path)]
        body += ("<h3>Attention to the first position by layer</h3>" + page.chart(attention, files=files)
                 + table(attention_table(document), digits=DIGITS, text_columns=("layer",)))
    return body
