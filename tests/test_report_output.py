"""The report's figure and table builders on given records: gaps at unmeasured layers, one chart per
isotropy quantity, the STS pivot, the static table's layer-0 rows once, the notes' numbers taken from
the records, labels shared with the terminal, and figure text inside the figure."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from lmgeom.report.build import calibration_rows_note, layer_table, whitening_note
from lmgeom.report.data import RunData, read_static
from lmgeom.report.figures import (
    TITLE_WIDTH,
    Chart,
    draw_figure,
    layer_series,
    plotly_figure,
    run_charts,
    sts_pivot,
    undefined_note,
)
from lmgeom.report.labels import LABELS, label, labelled
from lmgeom.rundir import STATIC_BENCHMARKS, write_result_set

ROOT = Path(__file__).resolve().parents[1]
LAYERS = [0, 1, 2, 3]


def contextuality_records(*, undefined_at_0: bool = False) -> pd.DataFrame:
    """Records of every contextuality metric at layers 0-3 (raw = layer / 10 + a metric offset)."""
    rows = []
    metrics = ["anisotropy_exact", "anisotropy_sampled", "self_similarity", "intra_sentence_similarity",
               "mev_uncentred", "mev_centred", "mev_svd_ratio"]
    for layer in LAYERS:
        for i, metric in enumerate(metrics):
            raw = 1.0 if metric == "self_similarity" and layer == 0 else layer / 10 + i / 100
            if undefined_at_0 and layer == 0 and metric in ("mev_centred", "mev_svd_ratio"):
                raw = math.nan
            adjusted = math.nan if metric.startswith("anisotropy") else raw - 0.05
            rows.append({"layer": layer, "metric": metric, "raw": raw, "baseline": 0.05, "adjusted": adjusted})
    return pd.DataFrame(rows)


def calibration_records(layers: list[int], methods: dict[str, int]) -> pd.DataFrame:
    """Before/after of three measures per (layer, method); n_fit_rows per method as given."""
    rows = []
    for layer in layers:
        for method, n_fit in methods.items():
            for measure, before, after in (("log_partition_isotropy", -5.0 - layer, -8.0 - layer if method == "whitening" else -1.0),
                                           ("isoscore", 0.2, 0.97 if method == "whitening" else 0.3),
                                           ("average_cosine", 0.3, 0.0)):
                rows.append({"layer": layer, "method": method, "measure": measure, "before": before, "after": after,
                             "n_fit_rows": n_fit, "n_eval_rows": 20_000})
    return pd.DataFrame(rows)


def isotropy_records() -> pd.DataFrame:
    return pd.DataFrame([{"layer": layer, "measure": measure, "value": value + layer / 100, "n_rows": 100}
                         for layer in LAYERS
                         for measure, value in (("log_partition_isotropy", -3.0), ("log_partition_isotropy_centered", -1.0),
                                                ("isoscore", 0.4), ("local_isoscore", 0.3), ("average_cosine", 0.2),
                                                ("local_average_cosine_centered", 0.01))])


def sts_records() -> pd.DataFrame:
    """Two datasets (one with subsets: a 'mean' aggregation too) x layers 0, 1, 3 and first-last-avg x
    none, whitening (transductive) and whitening fitted on lee."""
    rows = []
    for d, dataset in enumerate(("STS-B", "STS12")):
        for l, layer in enumerate(("0", "1", "3", "first-last-avg")):
            for m, (method, fit_on) in enumerate((("none", "none"), ("whitening", "transductive"), ("whitening", "lee"))):
                for aggregation in (("all", "mean") if dataset == "STS12" else ("all",)):
                    value = 50 + 10 * d + l + 0.5 * m + (7 if aggregation == "mean" else 0)
                    rows.append({"dataset": dataset, "layer": layer, "method": method, "fit_on": fit_on,
                                 "aggregation": aggregation, "spearman": value, "n_pairs": 10})
    return pd.DataFrame(rows)


def run_data(tmp_path: Path, **parts: Any) -> RunData:
    given = {"summary": None, "contextuality_document": {"settings": {"n_samples": 100}}, "contextuality": contextuality_records(),
             "words": None, "calibration": None, "calibration_settings": {}, "isotropy": None, "static": None,
             "sts": None, "experiments": None, "experiment_tests": None, **parts}
    return RunData(path=tmp_path, meta={"model_id": "m", "corpus_name": "c"}, **given)


def joined_pairs(x: list[Any], y: list[Any]) -> list[tuple[float, float]]:
    """The x pairs a line joins: consecutive points that both have a value (None/NaN is a gap)."""
    def has(v: Any) -> bool:
        return v is not None and not (isinstance(v, float) and math.isnan(v))
    return [(x[i], x[i + 1]) for i in range(len(x) - 1) if has(y[i]) and has(y[i + 1])]


# ---- no line over unmeasured layers ---------------------------------------------------------------

def test_layer_series_puts_a_gap_at_every_missing_layer() -> None:
    series = layer_series("s", [3, 0, 1, 6], [0.3, 0.0, 0.1, 0.6])
    assert series.x == [0, 1, 2, 3, 4, 5, 6]
    assert [v if not math.isnan(v) else None for v in series.y] == [0.0, 0.1, None, 0.3, None, None, 0.6]
    assert joined_pairs(series.x, series.y) == [(0, 1)]


def test_calibration_charts_join_only_adjacent_calibrated_layers_on_the_runs_layer_axis(tmp_path: Path) -> None:
    run = run_data(tmp_path, calibration=calibration_records([0, 1, 3], {"whitening": 60_626, "abtt": 60_626}))
    charts = {c.name: c for c in run_charts(run)}
    chart = charts["calibration_isoscore"]
    assert chart.x_range == (0, 3) and "calibrated layers 0, 1, 3" in chart.note
    by_name = {s.name: s for s in chart.series}
    assert set(by_name) == {"before calibration", "after whitening", "after abtt"}
    assert by_name["after whitening"].x == [0, 1, 2, 3]
    assert by_name["after whitening"].y[:2] == [0.97, 0.97] and math.isnan(by_name["after whitening"].y[2])
    figure = plotly_figure(chart)
    for trace in figure["data"]:
        assert trace["connectgaps"] is False and trace["y"][2] is None
        assert joined_pairs(trace["x"], trace["y"]) == [(0, 1)]
    assert figure["layout"]["xaxis"]["range"] == [-0.3, 3.3]


def test_a_single_calibrated_layer_is_a_point_on_the_runs_layer_axis(tmp_path: Path) -> None:
    run = run_data(tmp_path, calibration=calibration_records([2], {"whitening": 500}))
    chart = {c.name: c for c in run_charts(run)}["calibration_average_cosine"]
    figure = plotly_figure(chart)
    assert figure["layout"]["xaxis"]["range"] == [-0.3, 3.3] and figure["layout"]["xaxis"]["dtick"] == 1
    assert [trace["x"] for trace in figure["data"]] == [[2.0], [2.0]]
    assert [trace["y"] for trace in figure["data"]] == [[0.3], [0.0]]
    assert "calibrated layer 2 " in chart.note


# ---- one chart per isotropy quantity, labels -------------------------------------------------------

def test_isotropy_gets_one_chart_per_quantity_with_its_own_axis(tmp_path: Path) -> None:
    charts = {c.name: c for c in run_charts(run_data(tmp_path, isotropy=isotropy_records()))}
    expected = {"isotropy_log_partition": ("log I(W)", {"raw": -3.0, "centred": -1.0}),
                "isotropy_isoscore": ("IsoScore", {"global": 0.4, "in clusters (local)": 0.3}),
                "isotropy_average_cosine": ("average cosine", {"global": 0.2, "centred, in clusters (local)": 0.01})}
    for name, (y_label, series) in expected.items():
        chart = charts[name]
        assert chart.y_label == y_label
        assert {s.name: s.y for s in chart.series} == {k: pytest.approx([v + l / 100 for l in LAYERS]) for k, v in series.items()}
    assert "isotropy_scores" not in charts


def test_the_reports_mev_label_is_the_terminals() -> None:
    from lmgeom.report.labels import MEV_ADJ_COLUMN

    assert label(MEV_ADJ_COLUMN) == "MEV adj"
    assert label("self_similarity_adjusted") == "SelfSim adj" and label("intra_sentence_similarity") == "IntraSim"
    labels = list(LABELS.values())
    duplicated = {v for v in labels if labels.count(v) > 1}
    assert duplicated == set(), duplicated  # one label, one quantity


def test_layer_table_headers_are_labels_and_its_values_the_records(tmp_path: Path) -> None:
    run = run_data(tmp_path)
    frame = labelled(layer_table(run))
    assert list(frame.columns) == ["layer", "anisotropy (exact)", "anisotropy (sampled)", "SelfSim", "SelfSim adj", "IntraSim",
                                   "IntraSim adj", "MEV uncentred", "MEV uncentred adj", "MEV centred", "MEV centred adj",
                                   "MEV SVD ratio", "MEV adj"]
    assert not any("_" in c for c in frame.columns)
    assert frame["MEV adj"].tolist() == pytest.approx([l / 10 + 0.06 - 0.05 for l in LAYERS])


def test_mev_charts_say_why_a_variant_has_no_value_at_layer_0(tmp_path: Path) -> None:
    run = run_data(tmp_path, contextuality=contextuality_records(undefined_at_0=True))
    note = undefined_note(run, {"mev_uncentred": "uncentred", "mev_centred": "centred", "mev_svd_ratio": "SVD ratio"})
    assert note.startswith("centred and SVD ratio: undefined at layer 0 (each word's occurrences are one vector")
    assert "SelfSim 1.000" in note
    charts = {c.name: c for c in run_charts(run)}
    assert "undefined at layer 0" in charts["mev"].note and "undefined at layer 0" in charts["mev_adjusted"].note
    assert "share of a word's occurrence variance" in charts["mev"].title and charts["mev"].y_label == "mean MEV (0 to 1)"
    assert undefined_note(run_data(tmp_path), {"mev_centred": "centred"}) == ""


# ---- STS ---------------------------------------------------------------------------------------------

def test_sts_pivot_equals_a_hand_pivot_of_the_all_aggregation(tmp_path: Path) -> None:
    records = sts_records()
    pivot = sts_pivot(records)
    assert list(pivot.columns) == ["layer", "none", "whitening", "whitening@lee"]
    assert pivot["layer"].tolist() == ["0", "1", "3", "first-last-avg"]
    # STS-B: 50 + l + 0.5 m; STS12 (all): 60 + l + 0.5 m; their mean: 55 + l + 0.5 m (the 'mean' rows ignored)
    expected = [[55 + l + 0.5 * m for m in range(3)] for l in range(4)]
    np.testing.assert_allclose(pivot[["none", "whitening", "whitening@lee"]].to_numpy(), expected)
    per_dataset = sts_pivot(records, by_dataset=True)
    assert per_dataset[["dataset", "layer"]].values.tolist() == [[d, l] for d in ("STS-B", "STS12") for l in ("0", "1", "3", "first-last-avg")]
    assert per_dataset.loc[(per_dataset["dataset"] == "STS12") & (per_dataset["layer"] == "3"), "whitening@lee"].item() == 63.0

    chart = {c.name: c for c in run_charts(run_data(tmp_path, sts=records))}["sts"]
    assert [s.name for s in chart.series] == ["none", "whitening", "whitening@lee"]
    assert chart.series[0].x == [0, 1, 2, 3] and math.isnan(chart.series[0].y[2])  # layer 2 not evaluated: a gap
    assert [chart.series[0].y[i] for i in (0, 1, 3)] == [55, 56, 57]
    assert "mean over 2 datasets (STS-B, STS12)" in chart.subtitle


# ---- static benchmarks ------------------------------------------------------------------------------

def test_static_table_lists_each_layer_0_mean_row_once(tmp_path: Path) -> None:
    for layer in (0, 2, 5):
        records = [{"vectors": f"{kind} (layer {layer if kind != 'layer0_mean' else 0})", "layer": layer,
                    "benchmark": benchmark, "score": score + (0 if kind == "layer0_mean" else layer), "covered": 3, "total": 4,
                    "path": f"/somewhere/{benchmark}"}
                   for kind in ("first_pc", "mean", "layer0_mean") for benchmark, score in (("simlex999", 0.1), ("men", 0.2))]
        write_result_set(tmp_path / STATIC_BENCHMARKS.name.format(layer=layer), STATIC_BENCHMARKS.kind, {"records": records},
                         store_meta=None, settings={})
    static = read_static(tmp_path)
    assert static is not None
    layer0 = static.loc[static["vectors"] == "layer0_mean (layer 0)"]
    assert layer0[["layer", "benchmark", "score"]].values.tolist() == [[0, "men", 0.2], [0, "simlex999", 0.1]]
    assert len(static) == 3 * 2 * 2 + 2  # first_pc and mean at each of 3 layers, the layer-0 means once
    assert static.loc[static["vectors"] == "first_pc (layer 5)", "score"].tolist() == pytest.approx([5.2, 5.1])


# ---- calibration notes -------------------------------------------------------------------------------

def test_calibration_note_states_the_rows_the_records_hold() -> None:
    records = calibration_records([0, 6], {"whitening": 60_626, "cie": 20_000})
    assert calibration_rows_note(records) == (
        "Rows per layer (the records' n_fit_rows and n_eval_rows): fitted on whitening 60,626; cie 20,000; every "
        "measure before and after on the same 20,000 rows (a seeded subsample).")
    records.loc[(records["layer"] == 6) & (records["method"] == "cie"), "n_fit_rows"] = 19_000
    assert "cie 19,000–20,000 (by layer)" in calibration_rows_note(records)


def test_whitening_note_explains_log_partition_falling_and_names_the_layers() -> None:
    records = calibration_records([0, 6], {"whitening": 100, "abtt": 100})
    note = whitening_note(records)
    assert "IsoScore depends only on the covariance's eigenvalues" in note and "√n" in note
    assert note.endswith("In this run, layer 0: log I(W) -5 → -8, IsoScore 0.200 → 0.970; "
                         "layer 6: log I(W) -11 → -14, IsoScore 0.200 → 0.970.")
    records.loc[(records["method"] == "whitening") & (records["measure"] == "log_partition_isotropy"), "after"] = -0.1
    assert "In this run" not in whitening_note(records)


# ---- figures for papers: nothing cut --------------------------------------------------------------------

def assert_text_inside(fig: Any) -> None:
    """The figure's texts (title, subtitle) and each axes' drawn artists (tick labels, axis labels,
    legend) lie inside the figure."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    extents = [(t.get_text(), t.get_window_extent(renderer)) for t in fig.texts if t.get_text().strip()]
    extents += [(f"axes {i}", ax.get_tightbbox(renderer)) for i, ax in enumerate(fig.axes)]
    for axis in fig.axes:
        if axis.get_title():
            extents.append((axis.get_title(), axis.title.get_window_extent(renderer)))
    for name, extent in extents:
        assert extent.x0 >= box.x0 - 0.5 and extent.x1 <= box.x1 + 0.5, name
        assert extent.y0 >= box.y0 - 0.5 and extent.y1 <= box.y1 + 0.5, name


def test_png_titles_subtitles_and_labels_stay_inside_the_figure(tmp_path: Path) -> None:
    run = run_data(tmp_path, contextuality=contextuality_records(undefined_at_0=True), isotropy=isotropy_records(),
                   calibration=calibration_records([0, 1, 3], {"whitening": 10, "abtt": 10}), sts=sts_records())
    long = Chart("long", "A title far longer than one line of a seven-inch figure holds, " * 2, "model on corpus " * 12,
                 "layer", "a y label", [layer_series("s", [0, 1], [0.1, 0.2])], note="note " * 40)
    charts = [*run_charts(run), long]
    assert len(long.title_lines) > 1 and all(len(line) <= TITLE_WIDTH for line in long.title_lines)
    for chart in charts:
        fig = draw_figure(chart)
        try:
            assert_text_inside(fig)
        finally:
            plt.close(fig)


def test_experiment_figure_titles_are_wrapped_to_the_figure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from matplotlib.figure import Figure

    from lmgeom.stages.experiments.core import write_figures

    drawn: list[Any] = []
    original = Figure.savefig

    def checked(self: Figure, *args: Any, **kwargs: Any) -> Any:
        drawn.append(self)
        assert_text_inside(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", checked)
    summaries = [{"split": "test", "metric": "accuracy", "method": method, "mean": 0.5, "std": 0.1, "significant": False}
                 for method in ("none", "whitening")]
    paths = write_figures(summaries, tmp_path, varying="method", title="layers: tiny-bert on UD English-EWT, pos, top and mix features")
    assert [p.name for p in paths] == ["test_accuracy.png", "test_accuracy.svg"] and len(drawn) == 2


# ---- docs -----------------------------------------------------------------------------------------------

def test_docs_list_every_figure_the_report_writes(tmp_path: Path) -> None:
    run = run_data(tmp_path, isotropy=isotropy_records(), calibration=calibration_records([0], {"whitening": 10}), sts=sts_records())
    names = [chart.name for chart in run_charts(run)]
    assert len(names) == 12
    files_section = (ROOT / "docs" / "report.md").read_text().split("## Files", 1)[1].split("RUN/explorer.json", 1)[0]
    listed = set(re.findall(r"`([a-z_]+)`", files_section))
    assert set(names) <= listed, set(names) - listed


# ---- figures a reviewer accepts: one line of metadata, the estimator named, bands visible or noted, numbers in cells

DESIGN = {"B": 1000, "level": 0.95, "interval": "percentile", "seed": 0, "sentences_per_unit": 1}
COUNTS = {"rows_analysed": 4229, "sentences": 200, "words_analysed": 130, "rows_of_analysed_words": 2115}


def banded_records(width: float = 0.02) -> pd.DataFrame:
    """`contextuality_records` with bootstrap intervals `width` wide around each value."""
    records = contextuality_records()
    for column in ("raw", "adjusted"):
        records[f"{column}_lo"], records[f"{column}_hi"] = records[column] - width / 2, records[column] + width / 2
    return records


def banded_run(tmp_path: Path, *, per_unit: int = 1, **parts: Any) -> RunData:
    contextuality = {"settings": {"n_samples": 1000}, "counts": COUNTS, "bootstrap": {**DESIGN, "sentences_per_unit": per_unit}}
    return run_data(tmp_path, contextuality_document=contextuality, contextuality=banded_records(), isotropy=isotropy_records(),
                    calibration=calibration_records([0, 1, 3], {"whitening": 10}), sts=sts_records(), **parts)


def figure_texts(fig: Any, gid: str) -> list[str]:
    return [t.get_text() for t in fig.findobj(lambda a: getattr(a, "get_gid", lambda: None)() == gid) if t.get_text()]


def test_every_png_has_one_line_of_metadata_naming_the_units_its_bands_resample(tmp_path: Path) -> None:
    from lmgeom.engine.bootstrap import UNITS, resampled_unit

    charts = {c.name: c for c in run_charts(banded_run(tmp_path))}
    for chart in charts.values():
        fig = draw_figure(chart)
        try:
            (subtitle,) = figure_texts(fig, "subtitle")
            assert "\n" not in subtitle and subtitle == chart.subtitle and subtitle.startswith("m on c")
            assert_text_inside(fig)
        finally:
            plt.close(fig)
    bands = {name: chart.subtitle.split("bands: ", 1)[1] for name, chart in charts.items() if "bands: " in chart.subtitle}
    assert set(bands) == {"anisotropy", "self_similarity", "intra_sentence_similarity", "mev", "mev_adjusted"}
    assert all(b.startswith("95% percentile bootstrap, 1,000 resamples of ") for b in bands.values())
    # each statistic's unit, as the analysis resamples it
    for name in ("self_similarity", "intra_sentence_similarity"):
        assert UNITS[name] in bands[name] and "words" not in bands[name] and "sampled" not in bands[name]
    assert UNITS["anisotropy_exact"] in bands["anisotropy"] and UNITS["anisotropy_sampled"] in bands["anisotropy"]
    assert resampled_unit("mev_centred").startswith("words") and "sentences" not in bands["mev"]
    assert bands["mev"].endswith("of words") and "sampled occurrences (baseline)" in bands["mev_adjusted"]
    assert "sentences" not in bands["mev_adjusted"]
    # the counts each chart is computed on
    assert "4,229 occurrences, 200 sentences" in charts["anisotropy"].subtitle
    assert "130 words, 2,115 occurrences" in charts["self_similarity"].subtitle and "130 words" in charts["mev"].subtitle
    assert "200 sentences, 4,229 occurrences" in charts["intra_sentence_similarity"].subtitle
    assert charts["isotropy_isoscore"].subtitle == "m on c: 100 occurrences at each layer" and "bands" not in charts["sts"].subtitle
    blocks = {c.name: c for c in run_charts(banded_run(tmp_path, per_unit=4))}
    assert "blocks of 4 consecutive sentences" in blocks["self_similarity"].subtitle
    assert "blocks" not in blocks["mev"].subtitle


def test_every_title_names_the_estimator(tmp_path: Path) -> None:
    titles = {c.name: c.title for c in run_charts(banded_run(tmp_path))}
    expected = {"anisotropy": "mean cosine over pairs of word occurrences, all pairs (exact) or a seeded sample",
                "self_similarity": "mean pairwise cosine of a word's occurrences",
                "intra_sentence_similarity": "mean cosine of each word to its sentence's mean vector",
                "mev": "variance on its first principal component", "mev_adjusted": "the same variant on 1,000 sampled",
                "isotropy_log_partition": "partition function's min / max", "isotropy_isoscore": "IsoScore (Rudman et al.)",
                "isotropy_average_cosine": "mean cosine over all pairs", "calibration_isoscore": "IsoScore (Rudman et al.)",
                "calibration_log_partition_isotropy": "partition function's min / max",
                "calibration_average_cosine": "mean cosine over all pairs", "sts": "Spearman × 100 between gold scores"}
    assert set(titles) == set(expected)
    for name, estimator in expected.items():
        assert estimator in titles[name], name


def test_a_band_narrower_than_the_line_gets_a_note_and_keeps_its_width(tmp_path: Path) -> None:
    from lmgeom.report.html import Page

    y = [0.6, 0.5, 0.4, 0.3]
    for width, noted in ((1e-4, True), (0.05, False)):
        chart = Chart("c", "t", "m on c", "layer", "y", [layer_series("raw", range(4), y, band=([v - width / 2 for v in y], [v + width / 2 for v in y])),
                                                          layer_series("other", range(4), [0.2] * 4)])
        fig = draw_figure(chart)
        try:
            note = fig.axes[0].get_title(loc="left")
            assert ("narrower than the line" in note) is noted
            band = fig.axes[0].collections[0].get_paths()[0].vertices[:, 1]
            assert band.max() - band.min() == pytest.approx(0.3 + width)  # drawn at its true width, never widened
        finally:
            plt.close(fig)
        assert ("narrower than the line" in Page("t", "s").chart(chart)) is noted
    assert chart.narrow_bands(0.1) == ["raw"] and chart.band_note(0.1) == "bands: every interval is narrower than the line at this scale"
    chart.series[1].band = ([0.0] * 4, [0.4] * 4)
    assert chart.band_note(0.1) == "bands: the intervals of raw are narrower than the line at this scale"


def test_heatmaps_up_to_12_by_12_show_each_cells_value_and_name_the_debiased_estimator(tmp_path: Path) -> None:
    from lmgeom.report.html import Page
    from lmgeom.report.similarity import draw_heatmap, heatmap

    matrix = np.array([[1.0, 0.954, 0.05], [0.954, 1.0, np.nan], [0.05, np.nan, 1.0]])
    names = ["0", "1", "2"]
    fig = draw_heatmap(matrix, "Linear CKA (debiased) between layers", "m on c: 100 word occurrences", names, names,
                       "layer", "layer", True)
    try:
        cells = [t for t in fig.axes[0].texts if t.get_gid() == "cell"]
        assert [t.get_text() for t in cells] == ["1.00", "0.95", "0.05", "0.95", "1.00", "0.05", "1.00"]  # NaN: no number
        colours = {t.get_text(): t.get_color() for t in cells}
        assert colours["1.00"] == "black" and colours["0.05"] == "white"  # readable on yellow and on dark purple
        assert figure_texts(fig, "subtitle") == ["m on c: 100 word occurrences"]
        assert_text_inside(fig)
    finally:
        plt.close(fig)
    large = draw_heatmap(np.full((13, 13), 0.5), "t", "s", [str(i) for i in range(13)], [str(i) for i in range(13)],
                         "layer", "layer", True)
    try:
        assert not [t for t in large.axes[0].texts if t.get_gid() == "cell"]
    finally:
        plt.close(large)

    document = {"layers_a": [0, 1, 2], "layers_b": [0, 1, 2], "counts": {"rows_matched": 100},
                "matrices": {"cka_debiased": matrix.tolist(), "cka": matrix.tolist()}}
    page = Page("t", "s")
    section = heatmap(page, "similarity_cka", "between layers", document, tmp_path, ("cka_debiased", "cka"), label="m on c")
    assert "Linear CKA (debiased) between layers" in section and (tmp_path / "figures" / "similarity_cka.png").exists()
    assert page.figures["chart-similarity_cka"]["data"][0]["texttemplate"] == "%{z:.2f}"
    biased = heatmap(page, "only_biased", "between layers", {**document, "matrices": {"cka": matrix.tolist()}}, tmp_path, ("cka",))
    assert "Linear CKA (biased) between layers" in biased
