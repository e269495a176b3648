"""`build_comparison`: several runs side by side, by layer index and by relative depth (layer / last layer)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from lmgeom.errors import InputError
from lmgeom.engine.registry import measure, measures
from lmgeom.report.data import RunData, load_run
from lmgeom.report.figures import (
    CONTROL_STYLE,
    DEPTH_AXIS,
    LAYER_AXIS,
    Chart,
    Series,
    chart_subtitle,
    counts_phrase,
    save_figure,
)
from lmgeom.report.html import Page, esc, missing, table
from lmgeom.report.labels import MEV_ADJ_NOTE, labelled
from lmgeom.report.similarity import models_section
from lmgeom import rundir

# (name, contextuality metric, raw or adjusted, title): every charted measure its statistic declares,
# raw, and adjusted where it has a baseline
COMPARED = [
    entry for m in measures() if m.chart
    for entry in ((m.name, m.name, "raw", f"{m.title}, raw" if m.baseline else m.title),
                  *(((f"{m.name}_adjusted", m.name, "adjusted", f"{m.title}, adjusted"),) if m.baseline else ()))
]


def _labels(runs: Sequence[RunData]) -> list[str]:
    """Each run's 'model on corpus', with its directory name where two runs would share one."""
    labels = [run.label for run in runs]
    return [f"{label} ({run.name})" if labels.count(label) > 1 else label for label, run in zip(labels, runs)]


def comparison_table(runs: Sequence[RunData]) -> pd.DataFrame:
    """Tidy rows: run, run_dir, model, corpus, layer, depth (layer / last layer), metric, raw, baseline, adjusted."""
    frames = []
    for label, run in zip(_labels(runs), runs):
        if run.contextuality is None:
            raise InputError(f"{run.path} has no {rundir.CONTEXTUALITY.name}; run `lmgeom analyze {run.path}` before comparing")
        frame = run.contextuality[["layer", "metric", "raw", "baseline", "adjusted"]].copy()
        last = int(frame["layer"].max())
        frame.insert(0, "depth", frame["layer"] / last if last > 0 else 0.0)
        frame.insert(0, "corpus", run.corpus)
        frame.insert(0, "model", run.model_id)
        frame.insert(0, "run_dir", str(run.path))
        frame.insert(0, "run", label)
        frames.append(frame)
    columns = ["run", "run_dir", "model", "corpus", "layer", "depth", "metric", "raw", "baseline", "adjusted"]
    return pd.concat(frames, ignore_index=True)[columns]


def wide_table(tidy: pd.DataFrame) -> pd.DataFrame:
    """One row per run and layer, one column per compared metric (raw or adjusted as named)."""
    index = ["run", "layer", "depth"]
    columns = [
        tidy.loc[tidy["metric"] == metric].set_index(index)[column].rename(name)
        for name, metric, column, _ in COMPARED
        if (tidy["metric"] == metric).any()
    ]
    return pd.concat(columns, axis=1).reset_index()


def comparison_charts(tidy: pd.DataFrame, runs: Mapping[str, RunData]) -> list[Chart]:
    """Per compared metric: one chart by relative depth and one by layer index, one line per run
    (`runs`: by label), titled with the metric's estimator; its subtitle the counts of each run."""
    charts = []
    for name, metric, column, title in COMPARED:
        rows = tidy.loc[tidy["metric"] == metric]
        declared = measure(metric)  # its estimator, what its chart counts (`figures.CHART_COUNTS`), its baseline
        estimator = declared.estimator + (f", minus {declared.baseline}" if column == "adjusted" else "")
        subtitle = "; ".join(chart_subtitle(label, counts_phrase(run, declared.counted)) for label, run in runs.items())
        for axis, x_label, suffix in (("depth", DEPTH_AXIS, "depth"), ("layer", LAYER_AXIS, "layer")):
            series = shadow_controls([
                Series(run, group[axis].astype(float).tolist(), group[column].astype(float).tolist())
                for run, group in rows.sort_values("layer").groupby("run", sort=False)
            ], runs)
            charts.append(Chart(f"{name}_by_{suffix}",
                                f"{title} by {'relative depth' if axis == 'depth' else 'layer'}: {estimator}",
                                subtitle, x_label, title, series, integer_x=axis == "layer"))
    return [chart for chart in charts if chart.has_data]


def control_partners(runs: Mapping[str, RunData]) -> dict[str, str]:
    """Each control run's label (`RunData.control`) -> the label of the first run of the model itself
    with the same model id among `runs` (by label), where there is one: the run whose line the
    control's is drawn beside, in its colour (`lmgeom.report.figures.CONTROL_STYLE`)."""
    models = [(label, run) for label, run in runs.items() if run.control is None]
    partners = {}
    for label, run in runs.items():
        if run.control is not None:
            partner = next((other for other, model in models if model.model_id == run.model_id), None)
            if partner is not None:
                partners[label] = partner
    return partners


def shadow_controls(series: list[Series], runs: Mapping[str, RunData]) -> list[Series]:
    """`series` (one per run, named by its label) with each control run's series drawn in the colour
    of its model's run (`control_partners`, `Series.shadows`) where that run has a series here."""
    partners = control_partners(runs)
    index = {item.name: position for position, item in enumerate(series)}
    for item in series:
        partner = partners.get(item.name)
        if partner is not None and partner in index:
            item.shadows = index[partner]
    return series


NO_MODELS = ("no model × model matrix: `lmgeom compare` (lmgeom.pipeline.render_comparison) computes it from the "
             "runs' stores")


def build_comparison(run_dirs: Sequence[str | os.PathLike | RunData], out: str | os.PathLike, *,
                     models: Sequence[Mapping[str, Any]] = (), models_note: str | None = NO_MODELS) -> Path:
    """OUT/compare.html, OUT/figures/*.png|svg and OUT/compare.csv for several analysed runs (or the
    runs `load_run` read). `models`: the similarity documents of pairs of the runs (`{"a": index,
    "b": index, "document": similarity.json}`), shown as a model × model matrix; `models_note` says
    why there is none."""
    if len(run_dirs) < 1:
        raise InputError("give at least one run directory to compare")
    runs = [run_dir if isinstance(run_dir, RunData) else load_run(run_dir) for run_dir in run_dirs]
    out = Path(out)
    tidy = comparison_table(runs)
    rundir.write_text(rundir.COMPARE_CSV.at(out), tidy.to_csv(index=False))
    partners = control_partners(dict(zip(_labels(runs), runs)))
    controls = "".join(f"; {control} is drawn beside {model}, {CONTROL_STYLE}" for control, model in partners.items())
    caption = "; ".join(f"{label}: {run.counts_caption()}" for label, run in zip(_labels(runs), runs)) + \
        "; layer 0 = embedding output" + controls
    page = Page("lmgeom comparison: " + ", ".join(_labels(runs)), caption)
    listing = pd.DataFrame([{"run": label, "directory": str(run.path), "layers": len(run.layer_numbers),
                             "words": run.counts.get("words_analysed"), "tokens": run.counts.get("rows_analysed")}
                            for label, run in zip(_labels(runs), runs)])
    page.section("runs", "Runs", table(listing, text_columns=("run", "directory")))
    by_name = {chart.name: chart for chart in comparison_charts(tidy, dict(zip(_labels(runs), runs)))}
    measured = set(tidy["metric"])
    for name, metric, _, title in COMPARED:
        if metric not in measured:  # a statistic computed only when asked for (`analyze --statistics`)
            continue
        body = ""
        for suffix in ("depth", "layer"):
            chart = by_name.get(f"{name}_by_{suffix}")
            if chart is not None:
                files = save_figure(chart, out)
                body += page.chart(chart, files=[os.path.relpath(p, out) for p in files])
        page.section(name, title, body or missing(f"no run has values for {title}"))
    labels = _labels(runs)
    named = [{**pair, "a": labels[pair["a"]], "b": labels[pair["b"]]} for pair in models]
    page.section("models", "Similarity between models", models_section(page, out, labels, named,
                                                                        models_note if not models else None))
    page.section("table", "Values by run and layer", f"<p class=\"note\">{esc(MEV_ADJ_NOTE)}.</p>"
                 + table(labelled(wide_table(tidy)), text_columns=("run",)))
    return Path(rundir.write_text(rundir.COMPARE_PAGE.at(out), page.render()))
