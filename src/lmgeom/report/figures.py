"""Charts of a run, described once (`Chart`) and drawn twice: Plotly for the page, matplotlib for papers.

The matplotlib copies (PNG and SVG) use the Agg backend, so no display or browser is needed.
"""

from __future__ import annotations

import html
import math
import re
import textwrap
from dataclasses import dataclass, field
from typing import Any, Sequence

import matplotlib
import pandas as pd

matplotlib.use("Agg")  # files only: no display, no browser

import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
from matplotlib.ticker import MaxNLocator  # noqa: E402

from lmgeom.metrics.contextuality import MEV_VARIANTS  # noqa: E402
from lmgeom.report.data import RunData  # noqa: E402
from lmgeom.report.labels import label  # noqa: E402
from lmgeom.runs import rundir  # noqa: E402

LAYER_AXIS = "layer (layer 0 = embedding output)"
DEPTH_AXIS = "relative depth (layer / last layer; 0 = embedding output)"

# characters per line of a chart's title and of its subtitle lines in a 7-inch PNG (10 pt bold title,
# 7 pt subtitle)
TITLE_WIDTH = 64
SUBTITLE_WIDTH = 96

MEV_NAMES = {
    "uncentred": "uncentred (paper's formula)",
    "centred": "centred (PCA share)",
    "svd_ratio": "SVD ratio (released figures)",
}
MEV_UNIT = "MEV = share of a word's occurrence variance on its first principal direction (0 to 1)"


@dataclass
class Series:
    name: str
    x: list[float]
    y: list[float]
    dash: bool = False
    band: tuple[list[float], list[float]] | None = None  # (lo, hi) at each x: an interval drawn as an error band


@dataclass
class Chart:
    """A titled line chart: the single description both renderers draw.

    A line joins only points at adjacent x (layers next to each other); a NaN in `y` is a gap."""

    name: str  # file stem under figures/
    title: str
    subtitle: str  # model, corpus and counts
    x_label: str
    y_label: str
    series: list[Series] = field(default_factory=list)
    integer_x: bool = True
    note: str = ""  # what the reader needs to read the chart (units, undefined values), after the subtitle
    x_range: tuple[float, float] | None = None  # the x axis's extent (default: the data's)

    @property
    def has_data(self) -> bool:
        return any(any(not math.isnan(v) for v in s.y) for s in self.series)

    @property
    def title_lines(self) -> list[str]:
        return textwrap.wrap(self.title, TITLE_WIDTH)

    @property
    def subtitle_lines(self) -> list[str]:
        return [line for text in (self.subtitle, self.note) if text for line in textwrap.wrap(text, SUBTITLE_WIDTH)]


def _values(values: Sequence[Any]) -> list[float]:
    return [float(v) if v is not None else math.nan for v in values]


def layer_series(name: str, layers: Sequence[Any], values: Sequence[Any], *, dash: bool = False,
                 band: tuple[Sequence[Any], Sequence[Any]] | None = None) -> Series:
    """A series over integer layers, with a NaN at every layer between them that has no value, so that
    no line joins two layers that are not adjacent; `band`: (lo, hi) at the same layers."""
    keys = [int(layer) for layer in layers]
    given = dict(zip(keys, _values(values)))
    x = list(range(min(given), max(given) + 1)) if given else []

    def at_x(values: Sequence[Any]) -> list[float]:
        by_layer = dict(zip(keys, _values(values)))
        return [by_layer.get(layer, math.nan) for layer in x]

    drawn = None if band is None else (at_x(band[0]), at_x(band[1]))
    return Series(name, [float(layer) for layer in x], [given.get(layer, math.nan) for layer in x], dash, drawn)


def interval_note(run: RunData) -> str:
    """What a chart's error bands are (empty when the run's analysis had no bootstrap)."""
    design = (run.contextuality or {}).get("bootstrap")
    if not design:
        return ""
    rough = ", rough: fewer than 100 resamples" if design.get("rough") else ""
    return (f"bands: {design['level']:.0%} percentile bootstrap intervals (B = {design['B']:,}{rough}, seed {design['seed']}; "
            "cosines: sentences resampled, MEV: words, sampled baselines: their occurrences)")


def run_subtitle(run: RunData) -> str:
    counts = run.counts_caption()
    return f"{run.label}" + (f" ({counts})" if counts else "") + "; layer 0 = embedding output"


def _layer_range(run: RunData) -> tuple[float, float] | None:
    layers = run.layer_numbers
    return (float(min(layers)), float(max(layers))) if layers else None


def undefined_note(run: RunData, metrics: dict[str, str]) -> str:
    """Why a metric (named as `metrics` says) has no value at some layers, from the run's records."""
    if run.layers is None:
        return ""
    selfsim = run.metric("self_similarity")
    by_layers: dict[tuple[int, ...], list[str]] = {}
    for metric, name in metrics.items():
        values = run.metric(metric)
        layers = tuple(int(layer) for layer, value in values.items() if math.isnan(value))
        if layers:
            by_layers.setdefault(layers, []).append(name)
    notes = []
    for layers, names in by_layers.items():
        where = f"layer {layers[0]}" if len(layers) == 1 else f"layers {', '.join(map(str, layers))}"
        note = f"{' and '.join(names)}: undefined at {where}"
        if all(selfsim.get(layer, math.nan) > 1 - 1e-6 for layer in layers):
            note += (" (each word's occurrences are one vector repeated there, SelfSim 1.000, so their variance, "
                     "the ratio's denominator, is 0)")
        else:
            note += " (no analysed word has a defined value there)"
        notes.append(note)
    return "; ".join(notes)


def run_charts(run: RunData) -> list[Chart]:
    """The figures of the papers that this run's files support (none for a run not analysed)."""
    if run.layers is None:
        return []
    subtitle = run_subtitle(run)
    x_range = _layer_range(run)

    bands = run.layers is not None and "raw_lo" in run.layers

    def metric_series(name: str, metric: str, column: str = "raw", *, dash: bool = False) -> Series:
        values = run.metric(metric, column)
        band = (run.metric(metric, f"{column}_lo").to_list(), run.metric(metric, f"{column}_hi").to_list()) if bands else None
        return layer_series(name, values.index, values.to_list(), dash=dash, band=band)

    def chart(name: str, title: str, y_label: str, series: list[Series], note: str = "") -> Chart:
        drawn = any(s.band is not None and any(not math.isnan(v) for v in s.band[0]) for s in series)
        note = "; ".join(filter(None, [note, interval_note(run) if drawn else ""]))
        return Chart(name, title, subtitle, LAYER_AXIS, y_label, series, note=note, x_range=x_range)

    n_samples = (run.contextuality or {}).get("settings", {}).get("n_samples")
    sampled = f"sampled ({n_samples:,} occurrences, seeded)" if n_samples else "sampled"
    undefined = undefined_note(run, {f"mev_{v}": MEV_NAMES[v] for v in MEV_VARIANTS})
    charts = [
        chart("anisotropy", "Anisotropy baseline: mean cosine between random word occurrences", "mean cosine similarity",
              [metric_series("exact (all pairs)", "anisotropy_exact"), metric_series(sampled, "anisotropy_sampled", dash=True)]),
        chart("self_similarity", "Self-similarity: mean cosine between a word's occurrences", "mean SelfSim",
              [metric_series("raw", "self_similarity"), metric_series("adjusted (raw − baseline)", "self_similarity", "adjusted", dash=True)]),
        chart("intra_sentence_similarity", "Intra-sentence similarity: mean cosine of a word to its sentence's mean",
              "mean IntraSim",
              [metric_series("raw", "intra_sentence_similarity"),
               metric_series("adjusted (raw − baseline)", "intra_sentence_similarity", "adjusted", dash=True)]),
        chart("mev", "Maximum explainable variance (MEV) of a word's first principal component, raw", "mean MEV",
              [metric_series(MEV_NAMES[v], f"mev_{v}") for v in MEV_VARIANTS], "; ".join(filter(None, [MEV_UNIT, undefined]))),
        chart("mev_adjusted", "MEV adjusted by the sampled-occurrence baseline (raw − baseline)", "mean MEV − baseline",
              [metric_series(MEV_NAMES[v], f"mev_{v}", "adjusted") for v in MEV_VARIANTS],
              "; ".join(filter(None, ["baseline = the same variant on sampled occurrences", undefined]))),
    ]
    charts.extend(isotropy_charts(run))
    charts.extend(calibration_charts(run))
    charts.extend(sts_charts(run))
    return [chart for chart in charts if chart.has_data]


# (chart, title, y-axis label, {measure: series name}, note)
ISOTROPY_CHARTS = [
    ("isotropy_log_partition", "Isotropy by layer: log I(W) (Mu & Viswanath)", "log I(W)",
     {"log_partition_isotropy": "raw", "log_partition_isotropy_centered": "centred"},
     "0 = isotropic; more negative = less isotropic"),
    ("isotropy_isoscore", "Isotropy by layer: IsoScore, global and within k-means clusters", "IsoScore",
     {"isoscore": "global", "local_isoscore": "in clusters (local)"}, "1 = isotropic, 0 = all on one line"),
    ("isotropy_average_cosine", "Isotropy by layer: average cosine, global and within k-means clusters", "average cosine",
     {"average_cosine": "global", "local_average_cosine_centered": "centred, in clusters (local)"}, "0 = isotropic"),
]


def isotropy_charts(run: RunData) -> list[Chart]:
    """Global and local isotropy of every layer (isotropy.json): one chart per quantity."""
    if run.isotropy is None or run.isotropy.empty:
        return []
    table = run.isotropy

    def series(measures: dict[str, str]) -> list[Series]:
        out = []
        for measure, name in measures.items():
            rows = table.loc[table["measure"] == measure]
            if not rows.empty:
                out.append(layer_series(name, rows["layer"], rows["value"], dash="local" in measure))
        return out

    return [Chart(name, title, run_subtitle(run), LAYER_AXIS, y_label, series(measures), note=note,
                  x_range=_layer_range(run))
            for name, title, y_label, measures, note in ISOTROPY_CHARTS]


# measure: (title, note)
CALIBRATION_MEASURES = {
    "log_partition_isotropy": ("log I(W) (Mu & Viswanath)", "0 = isotropic"),
    "isoscore": ("IsoScore", "1 = isotropic"),
    "average_cosine": ("average cosine", "0 = isotropic"),
}


def calibration_charts(run: RunData) -> list[Chart]:
    """Per headline isotropy measure: before calibration and after each method, at the calibrated layers."""
    if run.calibration is None or run.calibration.empty:
        return []
    charts = []
    table = run.calibration
    layers = sorted(int(layer) for layer in table["layer"].unique())
    shown = ", ".join(map(str, layers))
    for measure, (title, note) in CALIBRATION_MEASURES.items():
        rows = table.loc[table["measure"] == measure]
        if rows.empty:
            continue
        before = rows.drop_duplicates("layer")
        series = [layer_series("before calibration", before["layer"], before["before"])]
        for method, group in rows.groupby("method", sort=False):
            series.append(layer_series(f"after {method}", group["layer"], group["after"], dash=True))
        charts.append(Chart(f"calibration_{measure}", f"Isotropy before and after calibration: {title}",
                            run_subtitle(run), LAYER_AXIS, label(measure), series,
                            note=f"{note}; calibrated layer{'s' if len(layers) > 1 else ''} {shown} (lines join adjacent layers only)",
                            x_range=_layer_range(run)))
    return charts


def sts_column(method: str, fit_on: str) -> str:
    """A calibration's name in the STS pivot: the method, with `@corpus` when fitted on a corpus."""
    return method if fit_on in ("none", "transductive") else f"{method}@{fit_on}"


def sts_pivot(records: pd.DataFrame, *, by_dataset: bool = False) -> pd.DataFrame:
    """Spearman × 100 of the "all" aggregation (the pooled pairs of every subset): one row per layer
    selection (in the records' order; per dataset with `by_dataset`, else the mean over the
    datasets), one column per calibration (`sts_column`). With several STS files, rows name the file."""
    frame = records.loc[records["aggregation"] == "all"].copy()
    frame["calibration"] = [sts_column(str(m), str(f)) for m, f in zip(frame["method"], frame["fit_on"])]
    frame["layer"] = frame["layer"].astype(str)
    index = (["file"] if "file" in frame and frame["file"].nunique() > 1 else []) + (["dataset"] if by_dataset else []) + ["layer"]
    rows = list(dict.fromkeys(zip(*(frame[c] for c in index))))
    columns = list(dict.fromkeys(frame["calibration"]))
    means = frame.groupby([*index, "calibration"])["spearman"].mean()
    return pd.DataFrame([{**dict(zip(index, row)), **{c: means.get((*row, c), math.nan) for c in columns}} for row in rows],
                        columns=[*index, *columns])


def sts_charts(run: RunData) -> list[Chart]:
    """Spearman × 100 by layer, one line per calibration: the single-layer selections of `sts_pivot`."""
    if run.sts is None or run.sts.empty or "layer" not in run.sts:
        return []
    pivot = sts_pivot(run.sts)
    single = pivot.loc[pivot["layer"].str.fullmatch(r"\d+")]
    if single.empty:
        return []
    datasets = sorted(run.sts.loc[run.sts["aggregation"] == "all", "dataset"].unique())
    keys = ["file"] if "file" in pivot else []
    series = []
    groups: list[tuple[str, pd.DataFrame]] = ([(f" ({name})", group) for name, group in single.groupby("file", sort=False)]
                                              if keys else [("", single)])
    for suffix, group in groups:
        for column in [c for c in pivot.columns if c not in (*keys, "layer")]:
            series.append(layer_series(f"{column}{suffix}", group["layer"].astype(int), group[column], dash=column != "none"))
    note = (f"the 'all' aggregation (pooled pairs), mean over {len(datasets)} dataset{'s' if len(datasets) != 1 else ''} "
            f"({', '.join(datasets)}); layer combinations are in the table")
    return [Chart("sts", "Sentence similarity (STS): Spearman × 100 by layer and calibration", run_subtitle(run),
                  LAYER_AXIS, "Spearman × 100", series, note=note, x_range=_layer_range(run))]


# ---- Plotly ---------------------------------------------------------------------------------------


def plotly_text(text: Any) -> str:
    """`text` as Plotly shows it literally. Plotly renders a subset of HTML (`<b>`, `<br>`, `<sup>`,
    `<span style>`, `<a href>`) in titles, axis titles, legend names, hover labels and annotations, and
    decodes `&amp;`, `&lt;`, `&gt;` and numeric entities (not `&quot;`): every word, name and label
    goes through this before it joins the tags a chart adds itself. (The explorer's script has the
    same rule as `esc` in `lmgeom.report.html.EXPLORER_SCRIPT`.)"""
    return html.escape(str(text), quote=False)


PLOT_HEIGHT = 260  # px of a Plotly chart's plot area


def _x_extent(chart: Chart) -> tuple[float, float] | None:
    if chart.x_range is not None:
        return chart.x_range
    xs = [x for s in chart.series for x, y in zip(s.x, s.y) if not math.isnan(y)]
    return (min(xs), max(xs)) if xs else None


def plotly_figure(chart: Chart) -> dict[str, Any]:
    """{data, layout} for Plotly.newPlot (plain JSON; NaN becomes a gap, which no line crosses). The page
    writes the title and subtitle above the chart as text (`lmgeom.report.html.Page.chart`), where the
    browser wraps them to any width."""
    import plotly.graph_objects as go

    from plotly.colors import DEFAULT_PLOTLY_COLORS, unlabel_rgb

    figure = go.Figure()
    for index, series in enumerate(chart.series):
        color = DEFAULT_PLOTLY_COLORS[index % len(DEFAULT_PLOTLY_COLORS)]
        figure.add_trace(go.Scatter(
            x=series.x, y=[None if math.isnan(v) else v for v in series.y], name=plotly_text(series.name), mode="lines+markers",
            line={"dash": "dash" if series.dash else "solid", "color": color}, connectgaps=False,
        ))
        if series.band is not None:
            # the band after its line: its upper bound, then the lower one filled up to it (outside the legend)
            red, green, blue = unlabel_rgb(color)
            for bound, fill in ((series.band[1], "none"), (series.band[0], "tonexty")):
                figure.add_trace(go.Scatter(
                    x=series.x, y=[None if math.isnan(v) else v for v in bound], name=plotly_text(f"{series.name} interval"),
                    mode="lines", line={"width": 0}, fill=fill, fillcolor=f"rgba({red:.0f},{green:.0f},{blue:.0f},0.18)",
                    showlegend=False, hoverinfo="skip", connectgaps=False,
                ))
    figure.update_layout(
        xaxis_title=plotly_text(chart.x_label), yaxis_title=plotly_text(chart.y_label), template="plotly_white",
        height=PLOT_HEIGHT + 150, margin={"t": 16, "l": 70, "r": 20, "b": 60},
        legend={"orientation": "h", "y": -0.28, "yanchor": "top", "x": 0},
    )
    extent = _x_extent(chart)
    if chart.integer_x and extent is not None:
        low, high = extent
        figure.update_xaxes(tickmode="linear", tick0=0, dtick=max(1, round((high - low) / 15)), range=[low - 0.3, high + 0.3])
    return figure.to_plotly_json()


# ---- matplotlib -----------------------------------------------------------------------------------

POINTS_PER_INCH = 72


def draw_figure(chart: Chart) -> Any:
    """The matplotlib figure of a chart (7 inches wide; the title block grows with its lines); close it
    with `plt.close`."""
    titles, subtitles = chart.title_lines, chart.subtitle_lines
    title_size, subtitle_size = 10, 7
    header = (6 + 1.3 * title_size * len(titles) + 1.35 * subtitle_size * len(subtitles) + 6) / POINTS_PER_INCH
    height = 3.7 + header
    fig, ax = plt.subplots(figsize=(7.0, height))
    for series in chart.series:
        (line,) = ax.plot(series.x, series.y, marker="o", markersize=3.5, linestyle="--" if series.dash else "-", label=series.name)
        if series.band is not None:
            ax.fill_between(series.x, series.band[0], series.band[1], color=line.get_color(), alpha=0.18, linewidth=0)
    top = 1 - 6 / POINTS_PER_INCH / height
    fig.text(0.01, top, "\n".join(titles), fontsize=title_size, weight="bold", va="top", ha="left", linespacing=1.15)
    fig.text(0.01, top - 1.3 * title_size * len(titles) / POINTS_PER_INCH / height, "\n".join(subtitles),
             fontsize=subtitle_size, va="top", ha="left", color="#444", linespacing=1.2)
    ax.set_xlabel(chart.x_label)
    ax.set_ylabel(chart.y_label)
    extent = _x_extent(chart)
    if chart.integer_x:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if extent is not None:
            ax.set_xlim(extent[0] - 0.3, extent[1] + 0.3)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 1 - header / height))
    return fig


def save_figure(chart: Chart, folder: rundir.Where) -> list[rundir.Target]:
    """`figures/<name>.png` (150 dpi) and `figures/<name>.svg` of a chart in `folder` (a run directory
    or a comparison's folder, local or an fsspec URL), each written whole."""
    return write_figure(draw_figure(chart), chart.name, folder)


def write_figure(fig: Any, name: str, folder: rundir.Where) -> list[rundir.Target]:
    """`figures/<name>.png` (150 dpi) and `.svg` of the matplotlib figure `fig` in `folder`, each
    written whole; the figure is closed."""
    try:
        written = []
        for ext in ("png", "svg"):
            written.append(rundir.write_bytes(rundir.FIGURE.at(folder, name=f"{safe_name(name)}.{ext}"),
                                              rundir.figure_bytes(fig, ext, 150)))
        return written
    finally:
        plt.close(fig)


def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")
