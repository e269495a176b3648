"""Charts of a run, described once (`Chart`) and drawn twice: Plotly for the page, matplotlib for papers.

The matplotlib copies (PNG and SVG) use the Agg backend, so no display or browser is needed.
"""

from __future__ import annotations

import html
import math
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")  # files only: no display, no browser

import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
from matplotlib.ticker import MaxNLocator  # noqa: E402

from lmgeom.metrics.contextuality import MEV_VARIANTS  # noqa: E402
from lmgeom.report.data import RunData  # noqa: E402

LAYER_AXIS = "layer (layer 0 = embedding output)"
DEPTH_AXIS = "relative depth (layer / last layer; 0 = embedding output)"

MEV_NAMES = {
    "uncentred": "uncentred (paper's formula)",
    "centred": "centred (PCA share)",
    "svd_ratio": "SVD ratio (released figures)",
}


@dataclass
class Series:
    name: str
    x: list[float]
    y: list[float]
    dash: bool = False


@dataclass
class Chart:
    """A titled line chart: the single description both renderers draw."""

    name: str  # file stem under figures/
    title: str
    subtitle: str  # model, corpus and counts
    x_label: str
    y_label: str
    series: list[Series] = field(default_factory=list)
    integer_x: bool = True

    @property
    def has_data(self) -> bool:
        return any(any(not math.isnan(v) for v in s.y) for s in self.series)


def _values(values: Sequence[Any]) -> list[float]:
    return [float(v) if v is not None else math.nan for v in values]


def run_subtitle(run: RunData) -> str:
    counts = run.counts_caption()
    return f"{run.label}" + (f" ({counts})" if counts else "") + "; layer 0 = embedding output"


def run_charts(run: RunData) -> list[Chart]:
    """The figures of the papers that this run's files support (none for a run not analysed)."""
    if run.layers is None:
        return []
    subtitle = run_subtitle(run)

    def layer_series(name: str, metric: str, column: str = "raw", *, dash: bool = False) -> Series:
        values = run.metric(metric, column)
        return Series(name, [float(x) for x in values.index], _values(values.to_list()), dash)

    n_samples = (run.contextuality or {}).get("settings", {}).get("n_samples")
    sampled = f"sampled ({n_samples:,} occurrences, seeded)" if n_samples else "sampled"
    charts = [
        Chart("anisotropy", "Anisotropy baseline: mean cosine between random word occurrences", subtitle, LAYER_AXIS,
              "mean cosine similarity",
              [layer_series("exact (all pairs)", "anisotropy_exact"), layer_series(sampled, "anisotropy_sampled", dash=True)]),
        Chart("self_similarity", "Self-similarity: mean cosine between a word's occurrences", subtitle, LAYER_AXIS,
              "mean self-similarity",
              [layer_series("raw", "self_similarity"), layer_series("adjusted (raw − baseline)", "self_similarity", "adjusted", dash=True)]),
        Chart("intra_sentence_similarity", "Intra-sentence similarity: mean cosine of a word to its sentence's mean",
              subtitle, LAYER_AXIS, "mean intra-sentence similarity",
              [layer_series("raw", "intra_sentence_similarity"),
               layer_series("adjusted (raw − baseline)", "intra_sentence_similarity", "adjusted", dash=True)]),
        Chart("mev", "Maximum explainable variance (MEV) of a word's first principal component, raw", subtitle,
              LAYER_AXIS, "mean MEV (share of variance)",
              [layer_series(MEV_NAMES[v], f"mev_{v}") for v in MEV_VARIANTS]),
        Chart("mev_adjusted", "MEV adjusted by the sampled-occurrence baseline (raw − baseline)", subtitle,
              LAYER_AXIS, "mean adjusted MEV",
              [layer_series(MEV_NAMES[v], f"mev_{v}", "adjusted") for v in MEV_VARIANTS]),
    ]
    charts.extend(isotropy_charts(run))
    charts.extend(calibration_charts(run))
    return [chart for chart in charts if chart.has_data]


ISOTROPY_MEASURES = {
    "log_partition_isotropy": "log I(W), raw",
    "log_partition_isotropy_centered": "log I(W), centred",
}
ISOTROPY_SHARES = {
    "isoscore": "IsoScore",
    "average_cosine": "average cosine",
    "local_isoscore": "IsoScore inside k-means clusters (local)",
    "local_average_cosine_centered": "centred average cosine inside clusters (local)",
}


def isotropy_charts(run: RunData) -> list[Chart]:
    """Global and local isotropy of every layer (isotropy.json): I(W) in log space, and the [0, 1] measures."""
    if run.isotropy is None or run.isotropy.empty:
        return []
    table = run.isotropy

    def series(measures: dict[str, str]) -> list[Series]:
        out = []
        for measure, label in measures.items():
            rows = table.loc[table["measure"] == measure].sort_values("layer")
            if not rows.empty:
                out.append(Series(label, [float(x) for x in rows["layer"]], _values(rows["value"].to_list()), "local" in measure))
        return out

    subtitle = run_subtitle(run)
    return [
        Chart("isotropy_log_partition", "Isotropy by layer: log I(W) (Mu & Viswanath; 0 = isotropic)", subtitle, LAYER_AXIS,
              "log I(W)", series(ISOTROPY_MEASURES)),
        Chart("isotropy_scores", "Isotropy by layer: IsoScore and average cosine, global and within clusters", subtitle,
              LAYER_AXIS, "value", series(ISOTROPY_SHARES)),
    ]


CALIBRATION_MEASURES = {
    "log_partition_isotropy": "log I(W) (Mu & Viswanath; 0 = isotropic)",
    "isoscore": "IsoScore (1 = isotropic)",
    "average_cosine": "average cosine (0 = isotropic)",
}


def calibration_charts(run: RunData) -> list[Chart]:
    """Per headline isotropy measure: before calibration and after each method, by layer."""
    if run.calibration is None or run.calibration.empty:
        return []
    charts = []
    table = run.calibration
    for measure, label in CALIBRATION_MEASURES.items():
        rows = table.loc[table["measure"] == measure].sort_values("layer")
        if rows.empty:
            continue
        before = rows.drop_duplicates("layer")
        series = [Series("before calibration", [float(x) for x in before["layer"]], _values(before["before"].to_list()))]
        for method, group in rows.groupby("method", sort=False):
            series.append(Series(f"after {method}", [float(x) for x in group["layer"]], _values(group["after"].to_list()), True))
        charts.append(Chart(f"calibration_{measure}", f"Isotropy before and after calibration: {label}",
                            run_subtitle(run), LAYER_AXIS, label, series))
    return charts


# ---- Plotly ---------------------------------------------------------------------------------------


def plotly_text(text: Any) -> str:
    """`text` as Plotly shows it literally. Plotly renders a subset of HTML (`<b>`, `<br>`, `<sup>`,
    `<span style>`, `<a href>`) in titles, axis titles, legend names, hover labels and annotations, and
    decodes `&amp;`, `&lt;`, `&gt;` and numeric entities (not `&quot;`): every word, name and label
    goes through this before it joins the tags a chart adds itself. (The explorer's script has the
    same rule as `esc` in `lmgeom.report.html.EXPLORER_SCRIPT`.)"""
    return html.escape(str(text), quote=False)


def plotly_figure(chart: Chart) -> dict[str, Any]:
    """{data, layout} for Plotly.newPlot (plain JSON; NaN becomes a gap)."""
    import plotly.graph_objects as go

    figure = go.Figure()
    subtitle_lines = textwrap.wrap(chart.subtitle, 140)
    for series in chart.series:
        figure.add_trace(go.Scatter(
            x=series.x, y=[None if math.isnan(v) else v for v in series.y], name=plotly_text(series.name), mode="lines+markers",
            line={"dash": "dash" if series.dash else "solid"},
        ))
    figure.update_layout(
        title={"text": f"{plotly_text(chart.title)}<br><sup>{'<br>'.join(map(plotly_text, subtitle_lines))}</sup>"},
        xaxis_title=plotly_text(chart.x_label), yaxis_title=plotly_text(chart.y_label), template="plotly_white", height=420,
        margin={"t": 64 + 14 * len(subtitle_lines), "l": 60, "r": 20, "b": 60}, legend={"orientation": "h", "y": -0.22},
    )
    if chart.integer_x:
        figure.update_xaxes(tickmode="linear", dtick=max(1, round(max((max(s.x, default=0) for s in chart.series), default=0) / 15)))
    return figure.to_plotly_json()


# ---- matplotlib -----------------------------------------------------------------------------------


def save_figure(chart: Chart, directory: Path) -> list[Path]:
    """`<name>.png` (150 dpi) and `<name>.svg` of a chart in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7.0, 4.4))
    try:
        for series in chart.series:
            ax.plot(series.x, series.y, marker="o", markersize=3.5, linestyle="--" if series.dash else "-", label=series.name)
        subtitle = textwrap.fill(chart.subtitle, 120)
        fig.text(0.01, 0.985, chart.title, fontsize=10, weight="bold", va="top", ha="left")
        fig.text(0.01, 0.935, subtitle, fontsize=7, va="top", ha="left", color="#444")
        ax.set_xlabel(chart.x_label)
        ax.set_ylabel(chart.y_label)
        if chart.integer_x:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout(rect=(0, 0, 1, 0.92 - 0.035 * subtitle.count("\n")))
        paths = [directory / f"{safe_name(chart.name)}.{ext}" for ext in ("png", "svg")]
        for path in paths:
            fig.savefig(path, dpi=150)
        return paths
    finally:
        plt.close(fig)


def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")
