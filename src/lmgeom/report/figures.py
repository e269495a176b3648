"""Charts of a run, described once (`Chart`) and drawn twice: Plotly for the page, matplotlib for papers.

The matplotlib copies (PNG and SVG) are figures on their own Agg canvas (`new_figure`), never pyplot's,
so no display or browser is needed and a notebook's own backend is left as it is. `draw_chart` draws
a chart on any matplotlib Axes: the report's figures and `lmgeom.plot` share it.
"""

from __future__ import annotations

import html
import math
import re
import textwrap
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from lmgeom.controlspec import control_label
from lmgeom.engine.registry import measure, measures
from lmgeom.metrics.spectrum import MEV_VARIANTS
from lmgeom.report.data import RunData
from lmgeom.report.labels import label
from lmgeom import rundir

LAYER_AXIS = "layer (layer 0 = embedding output)"
DEPTH_AXIS = "relative depth (layer / last layer; 0 = embedding output)"

# characters per line of a chart's title and of its notes in a 7-inch PNG (10 pt bold title, 7 pt notes);
# the subtitle is one line, its font made smaller where it would not fit the figure's width
TITLE_WIDTH = 64
NOTE_WIDTH = 120

# each MEV variant's name in a chart, from its measure's title ("MEV centred (PCA share)")
MEV_NAMES = {variant: measure(f"mev_{variant}").title.removeprefix("MEV ") for variant in MEV_VARIANTS}
# the estimator of each measure, as chart titles name it, and the unit its bootstrap resamples
# (`lmgeom.engine.bootstrap`; MEV's adjusted value subtracts a baseline resampled over the sampled
# occurrences): both declared with the measure's statistic
ESTIMATORS = {m.name: m.estimator for m in measures()}
RESAMPLED = {m.name: m.resampled for m in measures() if m.resampled}
# the measures the charts below draw by hand; any other charted measure gets a chart of its own
DRAWN = {"anisotropy_exact", "anisotropy_sampled", "self_similarity", "intra_sentence_similarity",
         *(f"mev_{variant}" for variant in MEV_VARIANTS)}


@dataclass
class Series:
    name: str
    x: list[float]
    y: list[float]
    dash: bool = False
    band: tuple[list[float], list[float]] | None = None  # (lo, hi) at each x: an interval drawn as an error band
    # a control run's line beside the model's (`with_control`): the index, in its chart's series, of the
    # series whose colour it takes; drawn dashed (dotted where that series is dashed), hollow markers
    shadows: int | None = None
    bars: bool = False  # `band` drawn as an error bar at each point (with caps) rather than as a shaded band
    points: bool = False  # markers only, no line: a scatter (x need not be layers)


CONTROL_STYLE = ("dashed in the same colour as the model's line (dotted where the model's line is dashed), "
                 "hollow markers")
"""How a control run's line is drawn beside the model's, in a run's report and in a comparison."""


def palette_positions(series: Sequence[Series]) -> list[int]:
    """Each series' position in the colour cycle: the series drawn as their own take the next colour in
    turn (so a chart without control lines is coloured as it always was); a control's line
    (`Series.shadows`) takes the colour of the series it shadows."""
    positions: list[int] = []
    own = 0
    for item in series:
        if item.shadows is None:
            positions.append(own)
            own += 1
        else:
            positions.append(-1)
    return [positions[item.shadows] if item.shadows is not None else position
            for item, position in zip(series, positions)]


class _Framed:
    """The title and note of a chart, wrapped as every chart kind's frame draws them."""

    title: str
    note: str

    @property
    def title_lines(self) -> list[str]:
        return textwrap.wrap(self.title, TITLE_WIDTH)

    @property
    def note_lines(self) -> list[str]:
        return textwrap.wrap(self.note, NOTE_WIDTH)


@dataclass
class Chart(_Framed):
    """A titled line chart: the single description both renderers draw.

    A line joins only points at adjacent x (layers next to each other); a NaN in `y` is a gap."""

    name: str  # file stem under figures/
    title: str  # the quantity and its estimator
    subtitle: str  # one line: what the chart was computed on (model, corpus, counts; what the bands resample)
    x_label: str
    y_label: str
    series: list[Series] = field(default_factory=list)
    integer_x: bool = True
    note: str = ""  # what else the reader needs (why a value is missing), under the chart
    x_range: tuple[float, float] | None = None  # the x axis's extent (default: the data's)
    zero_line: bool = False  # a line at y = 0 (a correlation's chart: where no relation is)

    @property
    def has_data(self) -> bool:
        return any(any(not math.isnan(v) for v in s.y) for s in self.series)


    def narrow_bands(self, line: float) -> list[str]:
        """The series whose every interval is narrower than a line `line` data units wide: bands hidden
        behind their line."""
        narrow = []
        for series in self.series:
            shaded = series.band is not None and not series.bars  # an error bar's caps show however short it is
            widths = [hi - lo for lo, hi in zip(*series.band) if not math.isnan(hi - lo)] if shaded and series.band else []
            if widths and max(widths) < line:
                narrow.append(series.name)
        return narrow

    def band_note(self, line: float) -> str:
        """One line naming the bands narrower than a line `line` data units wide, or "" when every band
        shows: what the reader needs to know where a band seems missing."""
        narrow = self.narrow_bands(line)
        if not narrow:
            return ""
        banded = [s.name for s in self.series if s.band is not None and not s.bars and any(not math.isnan(v) for v in s.band[0])]
        whose = "every interval is" if narrow == banded else f"the intervals of {', '.join(narrow)} are"
        return f"bands: {whose} narrower than the line at this scale"

    @property
    def y_extent(self) -> float:
        """The span of the chart's values and interval ends (1 where there is one value or none)."""
        values = [v for s in self.series for part in (s.y, *(s.band or ())) for v in part if not math.isnan(v)]
        return (max(values) - min(values)) or 1.0 if values else 1.0


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


def bands_phrase(run: RunData, resampled: str) -> str:
    """What a chart's bands are: the bootstrap's level and resamples, of the units `resampled` names
    (empty when the run's analysis had no bootstrap)."""
    design = (run.contextuality_document or {}).get("bootstrap")
    if not design:
        return ""
    rough = " (rough: fewer than 100)" if design.get("rough") else ""
    return f"bands: {design['level']:.0%} percentile bootstrap, {design['B']:,} resamples{rough} of {resampled}"


def resampled_units(run: RunData, metric: str) -> str:
    """The units the bootstrap of `metric` resamples (`RESAMPLED`), in words: sentences in blocks where
    the analysis grouped them."""
    unit = RESAMPLED[metric]
    per_unit = int(((run.contextuality_document or {}).get("bootstrap") or {}).get("sentences_per_unit", 1))
    return f"blocks of {per_unit} consecutive sentences" if unit == "sentences" and per_unit > 1 else unit


# the counts a contextuality chart is computed on: (key in contextuality.json's counts, what they count)
CHART_COUNTS = {
    "anisotropy": (("rows_analysed", "occurrences"), ("sentences", "sentences")),
    "words": (("words_analysed", "words"), ("rows_of_analysed_words", "occurrences")),
    "sentences": (("sentences", "sentences"), ("rows_analysed", "occurrences")),
}


def counts_phrase(run: RunData, counted: str) -> str:
    """'N words, M occurrences' (as `CHART_COUNTS[counted]` says) of the run's analysis."""
    counts = run.counts
    return ", ".join(f"{int(counts[key]):,} {name}" for key, name in CHART_COUNTS[counted] if counts.get(key) is not None)


def chart_subtitle(label: str, *parts: str) -> str:
    """A chart's one line of metadata: the run's label, then the given parts that are not empty."""
    given = "; ".join(part for part in parts if part)
    return f"{label}: {given}" if label and given else label or given


def run_subtitle(run: RunData) -> str:
    counts = run.counts_caption()
    return f"{run.label}" + (f" ({counts})" if counts else "") + "; layer 0 = embedding output"


def _layer_range(run: RunData) -> tuple[float, float] | None:
    layers = run.layer_numbers
    return (float(min(layers)), float(max(layers))) if layers else None


def undefined_note(run: RunData, metrics: dict[str, str]) -> str:
    """Why a metric (named as `metrics` says) has no value at some layers, from the run's records."""
    if run.contextuality is None:
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


# the contextuality charts a control run's lines are drawn in (besides every `isotropy_*` chart and the
# chart of any other charted measure)
CONTROL_CHARTS = ("anisotropy", "self_similarity", "intra_sentence_similarity", "mev", "mev_adjusted")


def takes_control(name: str) -> bool:
    """Whether the chart `name` of a run's report shows a control run's lines: the contextuality charts
    (`CONTROL_CHARTS`, and any other charted measure's) and the isotropy charts, not calibration or STS."""
    return name in CONTROL_CHARTS or name.startswith("isotropy_") or name in {m.name for m in measures() if m.chart}


def with_control(charts: Sequence[Chart], control_charts: Sequence[Chart], control: RunData) -> list[Chart]:
    """`charts` of a run with the lines of its control run beside them: in each chart that `takes_control`,
    every series of the control's chart of the same name whose name a series of the run's has, drawn
    in that series' colour (`Series.shadows`, `CONTROL_STYLE`), without its band, named
    "<series>, control: random-init (seed S)"; the chart's note says so.

    Parameters
    ----------
    charts : sequence of Chart
        The run's charts (`run_charts` without a control).
    control_charts : sequence of Chart
        The control run's charts.
    control : RunData
        The control run (its label names it in the legend and the note).

    Returns
    -------
    list of Chart
        The run's charts, those with a control's lines extended by them.
    """
    from dataclasses import replace

    theirs = {chart.name: chart for chart in control_charts}
    tag = control_label(control.control) or control.label
    out = []
    for chart in charts:
        other = theirs.get(chart.name)
        if other is None or not takes_control(chart.name):
            out.append(chart)
            continue
        own = {series.name: index for index, series in enumerate(chart.series)}
        added = [replace(series, name=f"{series.name}, {tag}", band=None, shadows=own[series.name],
                         dash=chart.series[own[series.name]].dash)
                 for series in other.series if series.name in own]
        if not added:
            out.append(chart)
            continue
        note = f"{tag} ({control.label}): {CONTROL_STYLE}, no bands"
        out.append(replace(chart, series=[*chart.series, *added], note=f"{chart.note}; {note}" if chart.note else note))
    return out


def run_charts(run: RunData, control: RunData | None = None) -> list[Chart]:
    """The figures of the papers that this run's files support (none for a run not analysed); with a
    `control` run (`lmgeom.controlspec`), its lines beside the run's in the contextuality and isotropy
    charts (`with_control`)."""
    charts = _run_charts(run)
    return charts if control is None else with_control(charts, _run_charts(control), control)


def _run_charts(run: RunData) -> list[Chart]:
    if run.contextuality is None:
        return []
    charts = [*contextuality_charts(run), *isotropy_charts(run), *calibration_charts(run), *sts_charts(run)]
    return [chart for chart in charts if chart.has_data]


def contextuality_charts(run: RunData) -> list[Chart]:
    """The contextuality measures by layer (contextuality.json): anisotropy, self-similarity,
    intra-sentence similarity, MEV raw and adjusted, and any other charted measure of the registry
    (none for a run not analysed)."""
    if run.contextuality is None:
        return []
    x_range = _layer_range(run)

    bands = run.contextuality is not None and "raw_lo" in run.contextuality

    def metric_series(name: str, metric: str, column: str = "raw", *, dash: bool = False) -> Series:
        values = run.metric(metric, column)
        band = (run.metric(metric, f"{column}_lo").to_list(), run.metric(metric, f"{column}_hi").to_list()) if bands else None
        return layer_series(name, values.index, values.to_list(), dash=dash, band=band)

    def chart(name: str, title: str, y_label: str, series: list[Series], counted: str, resampled: str,
              note: str = "") -> Chart:
        drawn = any(s.band is not None and any(not math.isnan(v) for v in s.band[0]) for s in series)
        subtitle = chart_subtitle(run.label, counts_phrase(run, counted), bands_phrase(run, resampled) if drawn else "")
        return Chart(name, title, subtitle, LAYER_AXIS, y_label, series, note=note, x_range=x_range)

    n_samples = (run.contextuality_document or {}).get("settings", {}).get("n_samples")
    sampled = f"sampled ({n_samples:,} occurrences, seeded)" if n_samples else "sampled"
    occurrences = f"{n_samples:,} sampled occurrences" if n_samples else "sampled occurrences"
    undefined = undefined_note(run, {f"mev_{v}": MEV_NAMES[v] for v in MEV_VARIANTS})
    sentences = resampled_units(run, "self_similarity")
    charts = [
        chart("anisotropy", "Anisotropy baseline: mean cosine over pairs of word occurrences, all pairs (exact) or a seeded "
              "sample", "mean cosine similarity",
              [metric_series("exact (all pairs)", "anisotropy_exact"), metric_series(sampled, "anisotropy_sampled", dash=True)],
              "anisotropy", f"{resampled_units(run, 'anisotropy_exact')} (exact), of the sampled occurrences (sampled)"),
        chart("self_similarity", f"Self-similarity: {ESTIMATORS['self_similarity']}", "mean SelfSim",
              [metric_series("raw", "self_similarity"),
               metric_series("adjusted (raw − exact anisotropy)", "self_similarity", "adjusted", dash=True)],
              "words", sentences),
        chart("intra_sentence_similarity", f"Intra-sentence similarity: {ESTIMATORS['intra_sentence_similarity']}",
              "mean IntraSim",
              [metric_series("raw", "intra_sentence_similarity"),
               metric_series("adjusted (raw − exact anisotropy)", "intra_sentence_similarity", "adjusted", dash=True)],
              "sentences", sentences),
        chart("mev", f"Maximum explainable variance (MEV), raw: {ESTIMATORS['mev_uncentred']}", "mean MEV (0 to 1)",
              [metric_series(MEV_NAMES[v], f"mev_{v}") for v in MEV_VARIANTS], "words", "words", undefined),
        chart("mev_adjusted", f"MEV adjusted: raw MEV − the same variant on {occurrences}, averaged over words",
              "mean MEV − baseline",
              [metric_series(MEV_NAMES[v], f"mev_{v}", "adjusted") for v in MEV_VARIANTS],
              "words", "words (MEV), of the sampled occurrences (baseline)", undefined),
    ]
    for m in measures():  # a measure declared with its statistic and not drawn above: raw and adjusted by layer
        if m.chart and m.name not in DRAWN:
            adjusted = [metric_series(f"adjusted (raw − {m.baseline})", m.name, "adjusted", dash=True)] if m.baseline else []
            charts.append(chart(m.name, f"{m.title}: {m.estimator}", m.y_label or m.label,
                                [metric_series("raw", m.name), *adjusted], m.counted,
                                resampled_units(run, m.name) if m.resampled else ""))
    return charts


# (chart, title, y-axis label, {measure: series name}, note)
ISOTROPY_CHARTS = [
    ("isotropy_log_partition", "Isotropy by layer: log I(W), the partition function's min / max over the eigenvectors "
     "of WᵀW (Mu & Viswanath), raw and centred", "log I(W)",
     {"log_partition_isotropy": "raw", "log_partition_isotropy_centered": "centred"},
     "0 = isotropic; more negative = less isotropic"),
    ("isotropy_isoscore", "Isotropy by layer: IsoScore (Rudman et al.), of all occurrences and within k-means clusters",
     "IsoScore", {"isoscore": "global", "local_isoscore": "in clusters (local)"}, "1 = isotropic, 0 = all on one line"),
    ("isotropy_average_cosine", "Isotropy by layer: mean cosine over all pairs of occurrences, and within k-means "
     "clusters (centred)", "average cosine",
     {"average_cosine": "global", "local_average_cosine_centered": "centred, in clusters (local)"}, "0 = isotropic"),
]


def rows_phrase(rows: pd.Series, what: str = "occurrences") -> str:
    """'N occurrences at each layer' from a records' row counts (their range where they differ)."""
    counts = sorted({int(n) for n in rows.dropna()})
    if not counts:
        return ""
    shown = f"{counts[0]:,}" if len(counts) == 1 else f"{counts[0]:,}–{counts[-1]:,}"
    return f"{shown} {what} at each layer"


def isotropy_charts(run: RunData) -> list[Chart]:
    """Global and local isotropy of every layer (isotropy.json): one chart per quantity."""
    if run.isotropy is None or run.isotropy.empty:
        return []
    table = run.isotropy
    subtitle = chart_subtitle(run.label, rows_phrase(table["n_rows"]) if "n_rows" in table else "")

    def series(measures: dict[str, str]) -> list[Series]:
        out = []
        for measure, name in measures.items():
            rows = table.loc[table["measure"] == measure]
            if not rows.empty:
                out.append(layer_series(name, rows["layer"], rows["value"], dash="local" in measure))
        return out

    return [Chart(name, title, subtitle, LAYER_AXIS, y_label, series(measures), note=note, x_range=_layer_range(run))
            for name, title, y_label, measures, note in ISOTROPY_CHARTS]


# measure: (title, note)
CALIBRATION_MEASURES = {
    "log_partition_isotropy": ("log I(W), the partition function's min / max (Mu & Viswanath)", "0 = isotropic"),
    "isoscore": ("IsoScore (Rudman et al.)", "1 = isotropic"),
    "average_cosine": ("mean cosine over all pairs of occurrences", "0 = isotropic"),
}


def calibration_charts(run: RunData) -> list[Chart]:
    """Per headline isotropy measure: before calibration and after each method, at the calibrated layers."""
    if run.calibration is None or run.calibration.empty:
        return []
    charts = []
    table = run.calibration
    layers = sorted(int(layer) for layer in table["layer"].unique())
    shown = ", ".join(map(str, layers))
    measured = rows_phrase(table["n_eval_rows"]) if "n_eval_rows" in table else ""
    for measure, (title, note) in CALIBRATION_MEASURES.items():
        rows = table.loc[table["measure"] == measure]
        if rows.empty:
            continue
        before = rows.drop_duplicates("layer")
        series = [layer_series("before calibration", before["layer"], before["before"])]
        for method, group in rows.groupby("method", sort=False):
            series.append(layer_series(f"after {method}", group["layer"], group["after"], dash=True))
        charts.append(Chart(f"calibration_{measure}", f"Isotropy before and after calibration: {title}",
                            chart_subtitle(run.label, measured), LAYER_AXIS, label(measure), series,
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
    averaged = (f"the 'all' aggregation (pooled pairs), mean over {len(datasets)} dataset{'s' if len(datasets) != 1 else ''} "
                f"({', '.join(datasets)})")
    return [Chart("sts", "Sentence similarity (STS): Spearman × 100 between gold scores and the cosines of sentence "
                  "vectors, by layer and calibration", chart_subtitle(run.label, averaged),
                  LAYER_AXIS, "Spearman × 100", series, note="single layers; layer combinations are in the report's table",
                  x_range=_layer_range(run))]


# ---- stacked bars ---------------------------------------------------------------------------------


@dataclass
class Segment:
    """One segment of every bar of a `StackedBars`: its name (the legend's), its value in each bar (NaN:
    none there) and its colour (a hex colour, the same on the page and in the PNG)."""

    name: str
    values: list[float]
    color: str


@dataclass
class StackedBars(_Framed):
    """A titled stacked bar chart, described once and drawn twice like `Chart`: one bar per category
    (`bars`, in order) made of its segments. A positive value stacks upward from 0 and a negative one
    downward from 0 (Plotly's "relative" bar mode), so what is below zero is a bar's negative segments."""

    name: str  # file stem under figures/
    title: str
    subtitle: str
    x_label: str
    y_label: str
    bars: list[str]
    segments: list[Segment] = field(default_factory=list)
    note: str = ""

    @property
    def has_data(self) -> bool:
        return any(any(not math.isnan(v) for v in s.values) for s in self.segments)



# ---- changes beside their controls -----------------------------------------------------------------


@dataclass
class Effect:
    """One category of an `EffectChart`: its name, its value with its interval (`low`, `high`; NaN: no
    interval) and the values of its controls (each a point of its own)."""

    name: str
    value: float
    low: float
    high: float
    controls: list[float] = field(default_factory=list)


CONTROL_COLOUR = "#7f7f7f"  # the controls' markers, on the page and in the PNG
CONTROL_OFFSET = 0.22  # how far right of its category's point a control sits (in categories)
CONTROL_SPREAD = 0.16  # the width the controls of one category spread over, where it has several


@dataclass
class EffectChart(_Framed):
    """A titled chart of one value per category with its interval as an error bar, beside the
    category's controls as small grey points, and a line at 0: described once and drawn twice like
    `Chart` (an ablation's change beside the changes of its random controls)."""

    name: str  # file stem under figures/
    title: str
    subtitle: str
    x_label: str
    y_label: str
    effects: list[Effect] = field(default_factory=list)
    value_name: str = "value, 95% interval"  # the legend's name of the categories' points
    control_name: str = "controls"  # and of the controls'
    note: str = ""

    @property
    def has_data(self) -> bool:
        return any(not math.isnan(e.value) for e in self.effects)


    def control_points(self) -> tuple[list[float], list[float]]:
        """(x, y) of every control: category i's beside its point at x = i, spread over `CONTROL_SPREAD`."""
        xs: list[float] = []
        ys: list[float] = []
        for index, effect in enumerate(self.effects):
            n = len(effect.controls)
            for k, value in enumerate(effect.controls):
                xs.append(index + CONTROL_OFFSET + (CONTROL_SPREAD * (k / (n - 1) - 0.5) if n > 1 else 0.0))
                ys.append(value)
        return xs, ys


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


PLOTLY_LINE = 2  # px, Plotly's default line width


def plotly_band_note(chart: Chart) -> str:
    """`Chart.band_note` at the page's scale: a line of `PLOTLY_LINE` px on a plot `PLOT_HEIGHT` px high
    that spans the chart's values and intervals (and a margin)."""
    return chart.band_note(PLOTLY_LINE / PLOT_HEIGHT * 1.1 * chart.y_extent)


def plotly_figure(chart: Chart) -> dict[str, Any]:
    """{data, layout} for Plotly.newPlot (plain JSON; NaN becomes a gap, which no line crosses). The page
    writes the title and subtitle above the chart as text (`lmgeom.report.html.Page.chart`), where the
    browser wraps them to any width."""
    import plotly.graph_objects as go

    from plotly.colors import DEFAULT_PLOTLY_COLORS, unlabel_rgb

    figure = go.Figure()
    for series, position in zip(chart.series, palette_positions(chart.series)):
        color = DEFAULT_PLOTLY_COLORS[position % len(DEFAULT_PLOTLY_COLORS)]
        control: dict[str, Any] = {} if series.shadows is None else {"marker": {"symbol": "circle-open"}}
        dash = ("dot" if series.dash else "dash") if series.shadows is not None else "dash" if series.dash else "solid"
        if series.band is not None and series.bars:  # the interval as error bars: its distances above and below the point
            control["error_y"] = {"type": "data", "symmetric": False, "color": color, "thickness": 1.2, "width": 3,
                                  "array": [None if math.isnan(hi - y) else hi - y for y, hi in zip(series.y, series.band[1])],
                                  "arrayminus": [None if math.isnan(y - lo) else y - lo for y, lo in zip(series.y, series.band[0])]}
        figure.add_trace(go.Scatter(
            x=series.x, y=[None if math.isnan(v) else v for v in series.y], name=plotly_text(series.name),
            mode="markers" if series.points else "lines+markers",
            line={"dash": dash, "color": color}, connectgaps=False, **control,
        ))
        if series.band is not None and not series.bars:
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
    if chart.zero_line:
        figure.add_hline(y=0, line={"color": "#444", "width": 1})
    return figure.to_plotly_json()


def plotly_stacked(chart: StackedBars) -> dict[str, Any]:
    """{data, layout} of a `StackedBars` for Plotly.newPlot: one bar trace per segment in "relative" mode
    (negative values below zero), the bars as categories, a line at 0; the page writes the title above."""
    import plotly.graph_objects as go

    figure = go.Figure()
    for segment in chart.segments:
        figure.add_trace(go.Bar(x=list(chart.bars), y=[None if math.isnan(v) else v for v in segment.values],
                                name=plotly_text(segment.name), marker={"color": segment.color},
                                hovertemplate="%{x}: %{y:.3f}"))
    figure.update_layout(
        barmode="relative", xaxis_title=plotly_text(chart.x_label), yaxis_title=plotly_text(chart.y_label),
        template="plotly_white", height=PLOT_HEIGHT + 150, margin={"t": 16, "l": 70, "r": 20, "b": 60},
        legend={"orientation": "h", "y": -0.28, "yanchor": "top", "x": 0},
    )
    figure.update_xaxes(type="category")
    figure.add_hline(y=0, line={"color": "#444", "width": 1})
    return figure.to_plotly_json()


def plotly_effects(chart: EffectChart) -> dict[str, Any]:
    """{data, layout} of an `EffectChart` for Plotly.newPlot: the categories' points with their intervals
    as error bars (one trace), the controls as small grey points beside them (one trace), the
    categories named on the x axis, a line at 0; the page writes the title above."""
    import plotly.graph_objects as go

    figure = go.Figure()
    names = [plotly_text(effect.name) for effect in chart.effects]
    values = [effect.value for effect in chart.effects]

    def gap(value: float) -> float | None:
        return None if math.isnan(value) else value

    figure.add_trace(go.Scatter(
        x=list(range(len(values))), y=[gap(v) for v in values], name=plotly_text(chart.value_name), mode="markers",
        marker={"color": "#1f77b4", "size": 9}, text=names, hovertemplate="%{text}: %{y:.4g}<extra></extra>",
        error_y={"type": "data", "symmetric": False, "color": "#1f77b4", "thickness": 1.5, "width": 6,
                 "array": [gap(e.high - e.value) for e in chart.effects],
                 "arrayminus": [gap(e.value - e.low) for e in chart.effects]},
    ))
    xs, ys = chart.control_points()
    if xs:
        figure.add_trace(go.Scatter(
            x=xs, y=[gap(v) for v in ys], name=plotly_text(chart.control_name), mode="markers",
            marker={"color": CONTROL_COLOUR, "size": 5}, hovertemplate="%{y:.4g}<extra></extra>",
        ))
    figure.update_layout(
        xaxis_title=plotly_text(chart.x_label), yaxis_title=plotly_text(chart.y_label), template="plotly_white",
        height=PLOT_HEIGHT + 150, margin={"t": 16, "l": 70, "r": 20, "b": 60},
        legend={"orientation": "h", "y": -0.28, "yanchor": "top", "x": 0},
    )
    figure.update_xaxes(tickmode="array", tickvals=list(range(len(names))), ticktext=names,
                        range=[-0.6, len(names) - 0.4], zeroline=False)
    figure.add_hline(y=0, line={"color": "#444", "width": 1})
    return figure.to_plotly_json()


# ---- matplotlib -----------------------------------------------------------------------------------

POINTS_PER_INCH = 72


DPI = 150  # of the PNGs (`write_figure`), and of the figures drawn, so that text is measured as saved


def one_line(fig: Any, text: Any, width: float) -> None:
    """Shrink the font of the figure text `text` until it fits `width` (a fraction of the figure's width)
    on one line (measured by the figure's renderer at its dpi, without drawing the figure)."""
    drawn = text.get_window_extent(fig.canvas.get_renderer()).width
    if drawn > width * fig.bbox.width:
        text.set_fontsize(text.get_fontsize() * width * fig.bbox.width / drawn)


def new_figure(width: float, height: float, **options: Any) -> Figure:
    """A matplotlib figure of `width` x `height` inches at `DPI` on its own Agg canvas (not pyplot's:
    nothing to close, and the user's backend untouched); `options` as for `Figure`."""
    fig = Figure(figsize=(width, height), dpi=DPI, **options)
    FigureCanvasAgg(fig)
    return fig


BAND_EDGE = "_band"  # the label of a band's edge lines: a leading underscore keeps them out of the legend


def draw_chart(chart: Chart, ax: Any, *, line_width: float = 1.5, legend_size: float | None = 8) -> Any:
    """Draw `chart` on the matplotlib Axes `ax`: one line per series (dashed where the series is), its
    interval as a band with thin edges (labelled `BAND_EDGE`) or as error bars (`Series.bars`), a line
    at 0 where the chart has one, the axis labels, integer layer ticks over the chart's x range, a grid
    and the legend. The one drawing of a line chart: the report's
    figures (`draw_figure`) and `lmgeom.plot` call it. Returns `ax`."""
    shadowed = any(series.shadows is not None for series in chart.series)
    for series, position in zip(chart.series, palette_positions(chart.series)):
        if series.shadows is None:  # the colour cycle's next, named where a control's line takes one too
            style: dict[str, Any] = {"linestyle": "--" if series.dash else "-", **({"color": f"C{position}"} if shadowed else {})}
        else:  # a control's line: the colour of the line it shadows, dashed (dotted beside a dashed one), hollow
            style = {"linestyle": ":" if series.dash else "--", "color": f"C{position}", "markerfacecolor": "none"}
        if series.points:
            style["linestyle"] = "none"
        (line,) = ax.plot(series.x, series.y, marker="o", markersize=3.5, linewidth=line_width, label=series.name, **style)
        if series.band is not None and series.bars:
            below = [y - lo for y, lo in zip(series.y, series.band[0])]
            above = [hi - y for y, hi in zip(series.y, series.band[1])]
            ax.errorbar(series.x, series.y, yerr=[below, above], fmt="none", ecolor=line.get_color(), elinewidth=0.9,
                        capsize=2.5, label=BAND_EDGE)
        elif series.band is not None:
            ax.fill_between(series.x, series.band[0], series.band[1], color=line.get_color(), alpha=0.2, linewidth=0)
            for bound in series.band:  # the band's edges, so that a band little wider than the line shows
                ax.plot(series.x, bound, color=line.get_color(), linewidth=0.5, alpha=0.6, label=BAND_EDGE)
    if chart.zero_line:
        ax.axhline(0, color="#444", linewidth=0.8)
    ax.set_xlabel(chart.x_label)
    ax.set_ylabel(chart.y_label)
    extent = _x_extent(chart)
    if chart.integer_x:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if extent is not None:
            ax.set_xlim(extent[0] - 0.3, extent[1] + 0.3)
    ax.grid(alpha=0.3)
    if chart.series:
        ax.legend(fontsize=legend_size)
    return ax


TITLE_SIZE, SUBTITLE_SIZE = 10, 7  # points, of a figure's title and of its subtitle and notes


def framed_figure(titles: Sequence[str], subtitle: str, notes: Sequence[str],
                  draw: Callable[[Any], Any]) -> tuple[Figure, Any, tuple[float, float, float, float]]:
    """A 7-inch-wide figure of one plot: the title lines (bold) and one line of metadata above it,
    the plot drawn by `draw` on its Axes, the note lines under it. Returns the figure, its Axes and
    the rectangle the plot was laid out in (for `tight_layout` after more is added)."""
    title_size, subtitle_size = TITLE_SIZE, SUBTITLE_SIZE
    header = (6 + 1.3 * title_size * len(titles) + 1.35 * subtitle_size + 6) / POINTS_PER_INCH
    footer = (4 + 1.35 * subtitle_size * len(notes)) / POINTS_PER_INCH if notes else 0.0
    height = 3.7 + header + footer
    fig = new_figure(7.0, height)
    ax = fig.add_subplot()
    draw(ax)
    top = 1 - 6 / POINTS_PER_INCH / height
    fig.text(0.01, top, "\n".join(titles), fontsize=title_size, weight="bold", va="top", ha="left", linespacing=1.15,
             gid="title")
    line = fig.text(0.01, top - 1.3 * title_size * len(titles) / POINTS_PER_INCH / height, subtitle,
                    fontsize=subtitle_size, va="top", ha="left", color="#444", gid="subtitle")
    if notes:
        fig.text(0.01, 2 / POINTS_PER_INCH / height, "\n".join(notes), fontsize=subtitle_size, va="bottom", ha="left",
                 color="#444", linespacing=1.2, gid="note")
    layout = (0, footer / height, 1, 1 - header / height)
    fig.tight_layout(rect=layout)
    one_line(fig, line, 0.98)
    return fig, ax, layout


def draw_figure(chart: Chart) -> Figure:
    """The matplotlib figure of a chart (7 inches wide, `framed_figure`): the title (bold, wrapped), one
    line of metadata (`Chart.subtitle`), the plot (`draw_chart`; a note above it where bands are
    narrower than the line) and the chart's note under it."""
    line_width, subtitle_size = 1.5, SUBTITLE_SIZE
    fig, ax, layout = framed_figure(chart.title_lines, chart.subtitle, chart.note_lines,
                                    lambda ax: draw_chart(chart, ax, line_width=line_width))
    # the line's width in data units: its points over the plot's height in points, times the y axis's span
    low, high = ax.get_ylim()
    band_note = chart.band_note(line_width / (ax.bbox.height * POINTS_PER_INCH / fig.dpi) * (high - low))
    if band_note:
        note = ax.set_title(band_note, loc="left", fontsize=subtitle_size, style="italic", color="#444")
        one_line(fig, note, ax.bbox.width / fig.bbox.width)
        fig.tight_layout(rect=layout)
    return fig


def draw_stacked(chart: StackedBars, ax: Any, *, legend_size: float | None = 8) -> Any:
    """Draw a `StackedBars` on the matplotlib Axes `ax`: each segment's positive values stacked up from 0
    and its negative ones down from 0, in the segment's colour; a line at 0, the bars' labels (turned
    upright where they are long), the axis labels, a grid and the legend (above the plot). Returns `ax`."""
    positions = np.arange(len(chart.bars))
    up, down = np.zeros(len(positions)), np.zeros(len(positions))
    for segment in chart.segments:
        values = np.nan_to_num(np.asarray(segment.values, dtype=float), nan=0.0)
        ax.bar(positions, values, 0.8, bottom=np.where(values >= 0, up, down), color=segment.color, label=segment.name,
               linewidth=0)
        up, down = up + np.clip(values, 0, None), down + np.clip(values, None, 0)
    ax.axhline(0, color="#444", linewidth=0.8)
    long = max((len(bar) for bar in chart.bars), default=0) > 3
    ax.set_xticks(positions, list(chart.bars), rotation=90 if long else 0, fontsize=7 if len(positions) > 20 or long else None)
    ax.set_xlim(-0.6, len(positions) - 0.4)
    ax.set_xlabel(chart.x_label)
    ax.set_ylabel(chart.y_label)
    ax.grid(alpha=0.3, axis="y")
    if chart.segments:  # above the plot, where no bar is (bars of every height fill it)
        ax.legend(fontsize=legend_size, loc="lower left", bbox_to_anchor=(0, 1.01), ncol=2, frameon=False, borderaxespad=0)
    return ax


def draw_effects(chart: EffectChart, ax: Any, *, legend_size: float | None = 8) -> Any:
    """Draw an `EffectChart` on the matplotlib Axes `ax`: each category's point with its interval as an
    error bar (with caps), its controls as small grey points to its right, a line at 0, the categories
    named under the axis (turned upright where they are long), the axis labels, a grid and the legend
    (above the plot). Returns `ax`."""
    positions = np.arange(len(chart.effects))
    values = np.array([e.value for e in chart.effects], dtype=float)
    below = np.array([e.value - e.low for e in chart.effects], dtype=float)
    above = np.array([e.high - e.value for e in chart.effects], dtype=float)
    ax.errorbar(positions, values, yerr=[np.nan_to_num(below), np.nan_to_num(above)], fmt="o", color="#1f77b4",
                markersize=5, elinewidth=1.2, capsize=3, label=chart.value_name)
    xs, ys = chart.control_points()
    if xs:
        ax.scatter(xs, ys, s=10, color=CONTROL_COLOUR, zorder=3, label=chart.control_name)
    ax.axhline(0, color="#444", linewidth=0.8)
    names = [effect.name for effect in chart.effects]
    long = sum(len(name) for name in names) > 60
    ax.set_xticks(positions, names, rotation=90 if long else 0, fontsize=7)
    ax.set_xlim(-0.6, len(positions) - 0.4)
    ax.set_xlabel(chart.x_label)
    ax.set_ylabel(chart.y_label)
    ax.grid(alpha=0.3, axis="y")
    if chart.effects:  # above the plot, where no point is: the categories' points first, then the controls
        handles = dict(zip(*reversed(ax.get_legend_handles_labels())))
        names = [name for name in (chart.value_name, chart.control_name) if name in handles]
        ax.legend([handles[name] for name in names], names, fontsize=legend_size, loc="lower left",
                  bbox_to_anchor=(0, 1.01), frameon=False, borderaxespad=0)
    return ax


def save_effects(chart: EffectChart, folder: rundir.Where) -> list[rundir.Target]:
    """`figures/<name>.png` and `.svg` of an `EffectChart` in `folder` (`framed_figure`, `draw_effects`)."""
    fig, _, _ = framed_figure(chart.title_lines, chart.subtitle, chart.note_lines, lambda ax: draw_effects(chart, ax))
    return write_figure(fig, chart.name, folder)


def save_stacked(chart: StackedBars, folder: rundir.Where) -> list[rundir.Target]:
    """`figures/<name>.png` and `.svg` of a `StackedBars` in `folder` (`framed_figure`, `draw_stacked`)."""
    fig, _, _ = framed_figure(chart.title_lines, chart.subtitle, chart.note_lines, lambda ax: draw_stacked(chart, ax))
    return write_figure(fig, chart.name, folder)


def save_figure(chart: Chart, folder: rundir.Where) -> list[rundir.Target]:
    """`figures/<name>.png` (150 dpi) and `figures/<name>.svg` of a chart in `folder` (a run directory
    or a comparison's folder, local or an fsspec URL), each written whole."""
    return write_figure(draw_figure(chart), chart.name, folder)


def write_figure(fig: Any, name: str, folder: rundir.Where) -> list[rundir.Target]:
    """`figures/<name>.png` (150 dpi) and `.svg` of the matplotlib figure `fig` in `folder`, each
    written whole."""
    return [rundir.write_bytes(rundir.FIGURE.at(folder, name=f"{safe_name(name)}.{ext}"), rundir.figure_bytes(fig, ext, DPI))
            for ext in ("png", "svg")]


def safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")
