"""Reports and comparisons of runs: numbers read back equal the result files, neighbours equal a
brute-force ranking, figures are valid files, pages are self-contained and render in a browser."""

from __future__ import annotations

import html as html_module
import json
import math
import os
import re
import shutil
import struct
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from lmgeom.cli.report import register
from lmgeom.stages import analyze_store, calibrate_store
from lmgeom.pipeline import layer_summary, render_report
from lmgeom.stages.calibration import CalibrationOptions
from lmgeom.stages.static import benchmark_static_embeddings, static_embeddings, write_benchmarks
from lmgeom.rundir import write_json
from lmgeom.report import build_report, load_run
from lmgeom.report.compare import COMPARED
from lmgeom.rundir import EXPLORER
from lmgeom.pipeline.explorer import explorer_data
from lmgeom.report.figures import run_charts
from lmgeom.store import write_store_from_arrays

VOCABULARY = ["the", "king", "queen", "man", "woman", "dog", "cat", "car", "bus", "bank", "river", "money",
              "walked", "sat", "ran", "a"]
N_NEIGHBOURS = 4


def synthetic_run(directory: Path, *, n_layers: int, seed: int, analyse: bool = True, vocabulary: list[str] = VOCABULARY) -> Path:
    """A store whose words drift from a fixed centre towards their context as layers deepen, analysed."""
    rng = np.random.default_rng(seed)
    dim = 8
    sentences = [[vocabulary[i] for i in rng.choice(len(vocabulary), size=rng.integers(4, 8), p=_zipf())]
                 for _ in range(70)]
    centres = rng.normal(size=(len(vocabulary), dim))
    offset = rng.normal(size=dim)
    hidden = []
    context = [rng.normal(size=dim) for _ in sentences]
    for layer in range(n_layers):
        mix = layer / max(n_layers - 1, 1)
        rows = [centres[vocabulary.index(w)] * (1 - 0.6 * mix) + context[s] * mix + 0.3 * rng.normal(size=dim) + offset
                for s, sentence in enumerate(sentences) for w in sentence]
        hidden.append(np.array(rows))
    store = write_store_from_arrays(directory, hidden, sentences, model_id=f"synthetic-{n_layers}")
    if analyse:
        result = analyze_store(store, min_contexts=2, n_samples=200, seed=0)
        result.write()
        layer_summary(store, result)
    return directory


def _zipf() -> np.ndarray:
    weights = 1.0 / np.arange(1, len(VOCABULARY) + 1)
    return weights / weights.sum()


EXPERIMENT_RECORDS = [
    {"experiment": "probe", "task": "pos", "model": "synthetic-4", "regime": "frozen", "features": "layer 2",
     "method": method, "seed": seed, "metric": "accuracy", "value": value}
    for method, values in (("none", [0.70, 0.74, 0.72]), ("whitening", [0.80, 0.81, 0.86]))
    for seed, value in enumerate(values)
]


@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every result file: analysis, summary, calibration, static benchmarks, experiments; report built."""
    run = synthetic_run(tmp_path_factory.mktemp("full") / "run", n_layers=4, seed=1)
    from lmgeom.store import RepresentationStore

    store = RepresentationStore.open(run)
    calibrate_store(store, CalibrationOptions(methods=("whitening", "abtt"), layers=(0, 1, 3), seed=0))  # layer 2 not: a gap in the charts
    embeddings = static_embeddings(store, layer=2)
    write_benchmarks(benchmark_static_embeddings(embeddings), embeddings, run / "static")
    (run / "experiments" / "probe").mkdir(parents=True)
    summaries = [{"experiment": "probe", "task": "pos", "model": "synthetic-4", "regime": "frozen", "features": "layer 2",
                  "method": "whitening", "metric": "accuracy", "p_value": 0.004, "p_holm": 0.008, "significant": True}]
    (run / "experiments" / "probe" / "results.json").write_text(json.dumps({"records": EXPERIMENT_RECORDS, "summaries": summaries}))
    sts = [{"dataset": "STS-B", "split": "test", "layer": str(layer), "method": "none", "fit_on": "none",
            "aggregation": "all", "spearman": 60.0 + layer + 0.125, "n_pairs": 10, "n_subsets": 1, "n_sentences": 20,
            "log_partition_isotropy": -1.0, "isoscore": 0.5, "average_cosine": 0.25} for layer in range(4)]
    write_json(run / "sts.json", "sts", {"settings": {}, "records": sts}, store_meta={"model_id": "synthetic-4"})
    render_report(run, explorer_neighbours=N_NEIGHBOURS)
    return run


@pytest.fixture(scope="module")
def shallow_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Only the store and its analysis, with a different depth (layers 0-2)."""
    return synthetic_run(tmp_path_factory.mktemp("shallow") / "run", n_layers=3, seed=2)


def cli_app() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


@pytest.fixture(scope="module")
def comparison(full_run: Path, shallow_run: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """`lmgeom compare` of the two runs at 80 columns: (output folder, terminal output)."""
    out = tmp_path_factory.mktemp("compare") / "cmp"
    result = CliRunner().invoke(cli_app(), ["compare", str(full_run), str(shallow_run), "--out", str(out)],
                                env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    return out, result.output


def page_figures(html: str) -> dict:
    """The Plotly figures a page draws, parsed from its inlined data."""
    match = re.search(r"const LMGEOM_FIGURES = (\{.*?\});\n", html, re.S)
    assert match, "the page has no figure data"
    return json.loads(match.group(1))


def records_of(run: Path) -> pd.DataFrame:
    return pd.DataFrame(json.loads((run / "contextuality.json").read_text())["records"])


def values(records: pd.DataFrame, metric: str, column: str) -> list[float]:
    rows = records.loc[records["metric"] == metric].sort_values("layer")
    return [float(v) for v in rows[column]]


# ---- numbers read back equal the result files ------------------------------------------------------

def test_chart_values_equal_the_contextuality_records_and_summary(full_run: Path) -> None:
    records = records_of(full_run)
    summary = json.loads((full_run / "summary.json").read_text())["layers"]
    charts = {chart.name: chart for chart in run_charts(load_run(full_run))}
    figures = page_figures((full_run / "report.html").read_text())

    expected = {
        "self_similarity": [values(records, "self_similarity", "raw"), values(records, "self_similarity", "adjusted")],
        "intra_sentence_similarity": [values(records, "intra_sentence_similarity", "raw"),
                                      values(records, "intra_sentence_similarity", "adjusted")],
        "anisotropy": [[r["average_cosine"] for r in summary], [r["sampled_average_cosine"] for r in summary]],
        "mev": [values(records, f"mev_{v}", "raw") for v in ("uncentred", "centred", "svd_ratio")],
        "mev_adjusted": [values(records, f"mev_{v}", "adjusted") for v in ("uncentred", "centred", "svd_ratio")],
    }
    for name, series in expected.items():
        np.testing.assert_allclose([s.y for s in charts[name].series], series, rtol=1e-12, err_msg=name)
        lines = [trace for trace in figures[f"chart-{name}"]["data"] if trace.get("showlegend") is not False]  # not the bands
        np.testing.assert_allclose([trace["y"] for trace in lines], series, rtol=1e-12, err_msg=name)
        assert [trace["x"] for trace in lines] == [[0, 1, 2, 3]] * len(series)
    html = (full_run / "report.html").read_text()
    caption = re.findall(r'<figcaption>(.*?)</figcaption><div class="chart" id="chart-([a-z_]+)"', html)
    subtitles = {name: re.findall(r'class="chart-subtitle">([^<]*)<', text) for text, name in caption}
    assert subtitles["self_similarity"][0] == ("synthetic-4 on arrays: 16 words, 392 occurrences; "
                                               "bands: 95% percentile bootstrap, 1,000 resamples of sentences")
    assert subtitles["anisotropy"][0].startswith("synthetic-4 on arrays: 392 occurrences, 70 sentences; bands: ")
    assert figures["chart-self_similarity"]["layout"]["xaxis"]["title"]["text"] == "layer (layer 0 = embedding output)"


def test_calibration_chart_equals_the_calibration_records(full_run: Path) -> None:
    calibration = pd.DataFrame(json.loads((full_run / "calibration.json").read_text())["records"])
    chart = {c.name: c for c in run_charts(load_run(full_run))}["calibration_isoscore"]
    rows = calibration.loc[calibration["measure"] == "isoscore"]
    by_name = {s.name: s.y for s in chart.series}
    assert all(s.x == [0, 1, 2, 3] and math.isnan(s.y[2]) for s in chart.series)  # layer 2 not calibrated: a gap

    def measured(values: list[float]) -> list[float]:
        return [values[i] for i in (0, 1, 3)]

    assert measured(by_name["before calibration"]) == pytest.approx(rows.drop_duplicates("layer").sort_values("layer")["before"].tolist())
    for method in ("whitening", "abtt"):
        assert measured(by_name[f"after {method}"]) == pytest.approx(rows.loc[rows["method"] == method].sort_values("layer")["after"].tolist())


def test_page_shows_findings_metadata_words_and_benchmarks(full_run: Path) -> None:
    html = (full_run / "report.html").read_text()
    document = json.loads((full_run / "contextuality.json").read_text())
    for statement in document["statements"]:
        assert html_module.escape(statement) in html
    words = pd.read_csv(full_run / "contextuality_words.csv", keep_default_na=False, na_values=[""])
    last = words.loc[words["layer"] == 3]
    lowest = last.nsmallest(1, "self_similarity").iloc[0]
    assert f"<td class=\"text\">{lowest['word']}</td>" in html and f"{lowest['self_similarity']:.4f}" in html
    assert "Static embeddings on word benchmarks" in html and "simlex999" in html and "google_analogies" in html
    assert "synthetic-4" in html and document["corpus_fingerprint"] in html
    assert all(f"<td>{60 + layer + 0.125:.2f}</td>" in html for layer in range(4))  # the STS results


def test_experiment_results_are_grouped_with_mean_and_std_over_seeds(full_run: Path, tmp_path: Path) -> None:
    html = (full_run / "report.html").read_text()
    for values_ in ([0.70, 0.74, 0.72], [0.80, 0.81, 0.86]):
        assert f"{np.mean(values_):.4f} ± {np.std(values_, ddof=1):.4f}" in html
    assert ">0.008 *<" in html  # the Holm-adjusted p of whitening against none, marked significant
    extra = tmp_path / "more" / "other"
    extra.mkdir(parents=True)
    (extra / "results.json").write_text(json.dumps([{**EXPERIMENT_RECORDS[0], "experiment": "extra", "value": 0.5}]))
    page = render_report(full_run, include=[tmp_path / "more"], out=tmp_path / "with_extra.html",
                         explorer_neighbours=N_NEIGHBOURS).read_text()
    assert "<h3>extra</h3>" in page and "0.5000 ± 0.0000" in page


# ---- word explorer -----------------------------------------------------------------------------------

def brute_force_neighbours(vectors: np.ndarray, word: int, k: int) -> list[tuple[int, float]]:
    def cos(a: np.ndarray, b: np.ndarray) -> float:
        return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))

    scored = [(other, cos(vectors[word], vectors[other])) for other in range(len(vectors)) if other != word]
    return sorted(scored, key=lambda pair: (-pair[1], pair[0]))[:k]


@pytest.mark.parametrize("top_n", [6, 2000])
def test_explorer_neighbours_equal_a_brute_force_cosine_ranking(full_run: Path, top_n: int, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(full_run, run)
    data = explorer_data(load_run(run), top_n=top_n, k=N_NEIGHBOURS, refresh=True)
    words = pd.read_csv(run / "contextuality_words.csv")
    at_0 = words.loc[words["layer"] == 0].sort_values(["count", "word"], ascending=[False, True])
    assert data["words"] == at_0["word"].head(top_n).tolist()
    assert data["layers"] == [0, 1, 2, 3]
    for layer in data["layers"]:
        embeddings = static_embeddings(run, layer=layer, min_contexts=2)
        rows = [embeddings.words.index(w) for w in data["words"]]
        vectors = embeddings.vectors["first_pc"][rows]
        for i, word in enumerate(data["words"]):
            expected = brute_force_neighbours(vectors, i, N_NEIGHBOURS)
            got_indexes, got_cosines = data["neighbours"][str(layer)][i]
            assert got_indexes == [n for n, _ in expected], (layer, word)
            assert got_cosines == pytest.approx([c for _, c in expected], abs=6e-4)
        metrics = words.loc[words["word"] == data["words"][0]].sort_values("layer")
        assert data["metrics"][data["words"][0]]["self_similarity"] == pytest.approx(metrics["self_similarity"].round(4).tolist())


def test_explorer_data_is_cached_with_provenance_and_recomputed_for_other_settings(full_run: Path, tmp_path: Path,
                                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    run = tmp_path / "run"
    shutil.copytree(full_run, run)
    cached = json.loads((run / EXPLORER.name).read_text())
    assert cached["kind"] == "word_explorer" and cached["model_id"] == "synthetic-4"
    assert cached["settings"]["neighbours"] == N_NEIGHBOURS and cached["corpus_fingerprint"]

    import lmgeom.pipeline.explorer as explorer

    calls: list[int] = []
    original = explorer.first_pc_vectors

    def counted(store: Any, layer: int, *args: Any, **kwargs: Any) -> Any:
        calls.append(layer)
        return original(store, layer, *args, **kwargs)

    monkeypatch.setattr(explorer, "first_pc_vectors", counted)
    assert explorer_data(load_run(run), k=N_NEIGHBOURS) == cached["data"]
    assert calls == []  # served from the cache
    explorer_data(load_run(run), k=N_NEIGHBOURS + 1)
    assert calls == [0, 1, 2, 3]  # one distillation per layer
    assert json.loads((run / EXPLORER.name).read_text())["settings"]["neighbours"] == N_NEIGHBOURS + 1


# ---- files: figures, self-contained page, missing inputs -------------------------------------------

def test_figures_are_valid_png_and_svg(full_run: Path) -> None:
    names = {"anisotropy", "self_similarity", "intra_sentence_similarity", "mev", "mev_adjusted",
             "calibration_isoscore", "calibration_log_partition_isotropy", "calibration_average_cosine"}
    for name in names:
        png = (full_run / "figures" / f"{name}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", png[16:24])
        assert width > 500 and height > 300
        root = ET.parse(full_run / "figures" / f"{name}.svg").getroot()
        assert root.tag.endswith("svg")
        assert "layer 0 = embedding output" in (full_run / "figures" / f"{name}.svg").read_text()


def assert_self_contained(html: str) -> None:
    references = re.findall(r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)\s*=\s*[\"']?\s*(?:https?:)?//", html, re.I)
    assert references == []
    assert not re.search(r"@import\s+url\(\s*[\"']?https?://", html)
    from plotly.offline import get_plotlyjs

    assert html.count(get_plotlyjs()[:300]) == 1  # Plotly's script inlined exactly once


def test_report_is_self_contained(full_run: Path) -> None:
    html = (full_run / "report.html").read_text()
    assert_self_contained(html)
    assert os.path.getsize(full_run / "report.html") < 20 * 2**20


def test_missing_optional_files_give_the_command_that_makes_them(shallow_run: Path, tmp_path: Path) -> None:
    html = build_report(shallow_run, out=tmp_path / "report.html").read_text()
    assert "lmgeom calibrate RUN --methods whitening,abtt" in html
    assert "lmgeom static-embeddings RUN --layer L" in html
    assert "lmgeom sts MODEL --data-dir DIR --out RUN/sts.json" in html
    assert "experiments/*/results.json" in html

    bare = synthetic_run(tmp_path / "bare", n_layers=2, seed=3, analyse=False)
    page = build_report(bare).read_text()
    assert "no contextuality.json" in page and "lmgeom analyze RUN" in page
    assert "no contextuality_words.csv" in page


def test_a_missing_run_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a directory.*lmgeom run"):
        build_report(tmp_path / "nowhere")


# ---- comparison ---------------------------------------------------------------------------------------

def test_comparison_puts_runs_on_a_relative_depth_axis_with_their_own_numbers(
        full_run: Path, shallow_run: Path, comparison: tuple[Path, str]) -> None:
    out, _ = comparison
    path = out / "compare.html"
    table = pd.read_csv(out / "compare.csv")
    for run, last in ((full_run, 3), (shallow_run, 2)):
        rows = table.loc[table["run_dir"] == str(run)]
        assert rows["depth"].tolist() == pytest.approx((rows["layer"] / last).tolist())
        assert set(rows["depth"]) >= {0.0, 1.0}
        merged = rows.merge(records_of(run), on=["layer", "metric"], suffixes=("", "_run"))
        assert len(merged) == len(records_of(run))
        np.testing.assert_array_equal(merged["raw"], merged["raw_run"])
        np.testing.assert_array_equal(merged["adjusted"].fillna(-9), merged["adjusted_run"].fillna(-9))
    figures = page_figures(path.read_text())
    depth = figures["chart-self_similarity_adjusted_by_depth"]["data"]
    assert [trace["name"] for trace in depth] == ["synthetic-4 on arrays", "synthetic-3 on arrays"]
    assert [trace["x"] for trace in depth] == [[0, 1 / 3, 2 / 3, 1], [0, 0.5, 1]]
    assert depth[1]["y"] == pytest.approx(values(records_of(shallow_run), "self_similarity", "adjusted"))
    measured = {metric for run in (full_run, shallow_run) for metric in records_of(run)["metric"]}
    assert {"self_similarity", "mev_centred"} <= measured and "word_effective_rank" not in measured
    for name, metric, *_ in COMPARED:
        if metric not in measured:  # asked for with `analyze --statistics` only: no section, no chart
            assert not any(f"chart-{name}_by_" in figure for figure in figures) and not (out / "figures" / f"{name}_by_layer.png").exists()
            continue
        for axis in ("depth", "layer"):
            assert (out / "figures" / f"{name}_by_{axis}.png").exists()
            assert f"chart-{name}_by_{axis}" in figures
    assert_self_contained(path.read_text())


# ---- command line --------------------------------------------------------------------------------------

def test_report_and_compare_commands_print_readable_80_column_output(shallow_run: Path, comparison: tuple[Path, str],
                                                                      tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(cli_app(), ["report", str(shallow_run), "--out", str(tmp_path / "r.html")], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "SelfSim adj" in result.output and "r.html" in result.output
    assert (tmp_path / "r.html").exists()
    assert max(len(line) for line in result.output.splitlines()) <= 80
    out, output = comparison
    assert (out / "compare.html").exists() and "compare.csv" in output and "SelfSim adj" in output
    assert max(len(line) for line in output.splitlines()) <= 80
    result = runner.invoke(cli_app(), ["report", str(tmp_path / "nowhere")])
    assert result.exit_code == 2 and "not a directory" in result.output


def test_report_out_never_replaces_a_file_lmgeom_did_not_write(shallow_run: Path, tmp_path: Path) -> None:
    thesis = tmp_path / "thesis.tex"
    thesis.write_text("\\chapter{mine}")
    refused = CliRunner().invoke(cli_app(), ["report", str(shallow_run), "--out", str(thesis)])
    output = " ".join(refused.output.split())
    assert refused.exit_code == 2 and output.startswith(f"error: --out {thesis} exists and lmgeom did not write it")
    assert "--overwrite" in output and thesis.read_text() == "\\chapter{mine}"
    replaced = CliRunner().invoke(cli_app(), ["report", str(shallow_run), "--out", str(thesis), "--overwrite"])
    assert replaced.exit_code == 0, replaced.output
    assert thesis.read_text().startswith("<!DOCTYPE html>")
    # a page lmgeom wrote carries its mark: rendered again without asking
    again = CliRunner().invoke(cli_app(), ["report", str(shallow_run), "--out", str(thesis)])
    assert again.exit_code == 0, again.output


# ---- what a corpus word can hold --------------------------------------------------------------------

MARKUP_WORDS = ["http://x.com/a<!--<script>b", "</script><script>alert(1)</script>", "a&b>c", "line\u2028end"]
"""Corpus words that end a <script> element early, or turn the rest of the page into script text, when
written into one raw (HTML's script data escaped states begin at `<!--` and `<script`)."""


@pytest.fixture(scope="module")
def markup_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run whose most frequent words are `MARKUP_WORDS`, analysed, its report rendered."""
    vocabulary = [VOCABULARY[0], *MARKUP_WORDS, *VOCABULARY[len(MARKUP_WORDS) + 1:]]
    run = synthetic_run(tmp_path_factory.mktemp("markup") / "run", n_layers=3, seed=3, vocabulary=vocabulary)
    render_report(run, explorer_neighbours=N_NEIGHBOURS)
    return run


def data_scripts(page: str) -> dict[str, str]:
    """The text of the page's data scripts (the word explorer's JSON, the figures' script), each read
    as a browser's tokenizer reads a script element: up to the first `</script`."""
    scripts = re.findall(r"<script([^>]*)>(.*?)</script", page, re.S | re.I)
    explorer = [text for attributes, text in scripts if 'id="explorer-data"' in attributes]
    figures = [text for _, text in scripts if text.startswith("const LMGEOM_FIGURES = ")]
    assert len(explorer) == 1 and len(figures) == 1
    return {"explorer": explorer[0], "figures": figures[0]}


def test_corpus_words_of_markup_leave_the_report_whole(markup_run: Path) -> None:
    page = (markup_run / "report.html").read_text(encoding="utf-8")
    scripts = data_scripts(page)
    for text in scripts.values():
        # no escaped state can begin, and nothing can close the element early
        assert "<!--" not in text and "<script" not in text.lower() and "</" not in text and "\u2028" not in text
    parsed = json.loads(scripts["explorer"])
    cached = json.loads((markup_run / EXPLORER.name).read_text(encoding="utf-8"))["data"]
    assert parsed["words"] == cached["words"] and set(MARKUP_WORDS) <= set(parsed["words"])
    assert parsed["metrics"] == cached["metrics"]
    assert page_figures(page)  # the figures' JSON parses too
    # every section the page lists is there, and the page ends as written
    nav = page.split("<nav>", 1)[1].split("</nav>", 1)[0]
    sections = re.findall(r'<section id="([^"]+)">', page)
    assert "explorer" in sections and sections == re.findall(r'<a href="#([^"]+)">', nav)
    assert page.rstrip().endswith("</body></html>")


# ---- in a browser --------------------------------------------------------------------------------------

def _browser() -> str:
    executable = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if executable is None:
        pytest.skip("no Chromium found (install it: `bash scripts/install.sh --test` or `apt-get install chromium`)")
    return executable


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """One headless Chromium for the module's browser tests (each opens its own pages)."""
    executable = _browser()
    from playwright.sync_api import sync_playwright  # a test dependency: missing, it fails rather than skips

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


@pytest.mark.browser
def test_report_renders_in_headless_chromium(chromium: Any, full_run: Path, comparison: tuple[Path, str], tmp_path: Path) -> None:
    browser = chromium
    compare = comparison[0] / "compare.html"
    data = json.loads((full_run / EXPLORER.name).read_text())["data"]
    word = data["words"][1]
    for path in (full_run / "report.html", compare):
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        errors: list[str] = []
        page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(path.as_uri())
        n_figures = len(page_figures(path.read_text()))
        page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot').length >= {n_figures}")
        points = page.evaluate(
            "Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd => gd.data.map(t => "
            "t.y.filter(v => v !== null).length))"
        )
        assert len(points) == n_figures
        assert all(traces and all(n > 0 for n in traces) for traces in points), points
        assert page.locator(".scatterlayer .trace").count() >= sum(map(len, points))
        if path.name == "report.html":
            page.fill("#explorer-word", word)
            page.wait_for_selector("#explorer-neighbours")
            assert page.inner_text("#explorer-word-title") == word
            rows = page.locator("#explorer-neighbours tbody tr")
            assert rows.count() == N_NEIGHBOURS
            expected = data["words"][data["neighbours"]["3"][1][0][0]]
            assert rows.nth(0).locator("td").nth(1).inner_text() == expected
            assert page.locator("#explorer-chart .scatterlayer .trace").count() == 5
            page.select_option("#explorer-layer", "0")
            expected = data["words"][data["neighbours"]["0"][1][0][0]]
            assert page.locator("#explorer-neighbours tbody tr").nth(0).locator("td").nth(1).inner_text() == expected
            page.fill("#explorer-word", "zzz-not-a-word")
            assert "is not among" in page.inner_text("#explorer-result")
            page.fill("#explorer-word", word)
        shot = tmp_path / f"{path.stem}.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 10_000
        artifacts = os.environ.get("LMGEOM_TEST_ARTIFACTS")
        if artifacts:
            Path(artifacts).mkdir(parents=True, exist_ok=True)
            shutil.copy(shot, Path(artifacts) / shot.name)
        assert errors == [], errors
        page.close()


LAYOUT_SCRIPT = """() => {
  const box = el => { if (!el) return null; const r = el.getBoundingClientRect(); return {l: r.left, r: r.right, t: r.top, b: r.bottom, w: r.width, h: r.height}; };
  const charts = Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd => {
    const caption = gd.closest('figure') ? gd.closest('figure').querySelector('figcaption') : null;
    return {id: gd.id, svg: box(gd.querySelector('svg.main-svg')), plot_height: gd._fullLayout._size.h,
            ytitle: box(gd.querySelector('.g-ytitle text')), xtitle: box(gd.querySelector('.g-xtitle text')),
            legend: box(gd.querySelector('.legend')),
            caption: caption ? {scroll: caption.scrollWidth, client: caption.clientWidth, box: box(caption)} : null,
            traces: gd.data.map(t => ({mode: t.mode, x: t.x, y: t.y}))};
  });
  const tables = Array.from(document.querySelectorAll('table')).filter(t => t.offsetParent !== null).map(t => {
    const scroller = t.parentElement.classList.contains('wide') ? t.parentElement : null;
    const own = scroller || t;
    return {section: t.closest('section') ? t.closest('section').id : '', box: box(own),
            container: own.parentElement.clientWidth, scrolls: scroller ? scroller.scrollWidth > scroller.clientWidth + 1 : false};
  });
  return {charts, tables, page_width: document.documentElement.scrollWidth, window: window.innerWidth};
}"""


def assert_layout_fits(page: Any, *, width: int, layer_charts: bool) -> None:
    """Nothing of a chart (axis titles, legend, title and subtitle) lies outside it, no line joins two
    layers that are not adjacent, and no table is wider than its container (a wide one scrolls in it)."""
    layout = page.evaluate(LAYOUT_SCRIPT)
    assert layout["page_width"] <= layout["window"] == width, "the page scrolls sideways"
    for chart in layout["charts"]:
        svg, name = chart["svg"], chart["id"]
        for part in ("ytitle", "xtitle", "legend"):
            extent = chart[part]
            if extent is None and part == "legend":
                continue  # Plotly draws no legend for one line
            assert extent is not None, (name, part)
            assert extent["l"] >= svg["l"] - 1 and extent["r"] <= svg["r"] + 1, (name, part, extent, svg)
            assert extent["t"] >= svg["t"] - 1 and extent["b"] <= svg["b"] + 1, (name, part, extent, svg)
        assert chart["ytitle"]["h"] <= chart["plot_height"] + 2, (name, "y-axis title longer than the plot")
        caption = chart["caption"]
        if caption is not None:  # the title and subtitle: wrapped text inside the window
            assert caption["scroll"] <= caption["client"] + 1 and caption["box"]["r"] <= width, name
        if layer_charts:
            for trace in chart["traces"]:
                if "lines" in (trace["mode"] or ""):  # heatmaps have no mode
                    joined = [(a, b) for a, b, ya, yb in zip(trace["x"], trace["x"][1:], trace["y"], trace["y"][1:])
                              if ya is not None and yb is not None]
                    assert all(b - a == 1 for a, b in joined), (name, trace["x"], trace["y"])
    for table in layout["tables"]:
        assert table["box"]["w"] <= table["container"] + 1, table
        assert table["box"]["r"] <= width, table
        if width >= 1400 and table["section"] in ("layers", "calibration"):
            assert not table["scrolls"], table  # at 1,400 px these fit without scrolling


@pytest.mark.browser
def test_report_fits_800_and_1400_px_windows(chromium: Any, full_run: Path, comparison: tuple[Path, str], tmp_path: Path) -> None:
    browser = chromium
    artifacts = os.environ.get("LMGEOM_TEST_ARTIFACTS")
    for path in (full_run / "report.html", comparison[0] / "compare.html"):
        n_figures = len(page_figures(path.read_text()))
        for width in (800, 1400):
            page = browser.new_page(viewport={"width": width, "height": 900})
            page.goto(path.as_uri())
            page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot .g-xtitle').length >= {n_figures}")
            assert_layout_fits(page, width=width, layer_charts=path.name == "report.html")
            if artifacts:
                Path(artifacts).mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(Path(artifacts) / f"{path.stem}-{width}.png"), full_page=True)
            page.close()


@pytest.mark.browser
def test_a_tiny_model_runs_report_renders_in_headless_chromium(chromium: Any, tiny_run: Any, tmp_path: Path) -> None:
    """`lmgeom run` on tiny-bert (the session's tiny run): its report.html has every chart drawn, and the explorer answers."""
    browser = chromium
    result = tiny_run
    report = result.store.path / "report.html"
    data = json.loads((result.store.path / EXPLORER.name).read_text())["data"]
    word, last = data["words"][0], str(data["layers"][-1])
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(report.as_uri())
    figures = page_figures(report.read_text())
    n_figures = len(figures)
    assert n_figures >= 11  # anisotropy, self-similarity, intra-sentence, MEV x2, isotropy x3, calibration x3
    isotropy = json.loads((result.store.path / "isotropy.json").read_text())["records"]
    isoscore = next(t for t in figures["chart-isotropy_isoscore"]["data"] if t["name"] == "global")
    assert isoscore["y"] == pytest.approx([r["value"] for r in isotropy if r["measure"] == "isoscore"], abs=1e-12)
    page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot').length >= {n_figures}")
    points = page.evaluate(
        "Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd => gd.data.map(t => "
        "t.y.filter(v => v !== null).length))"
    )
    assert all(traces and all(n > 0 for n in traces) for traces in points), points
    page.fill("#explorer-word", word)
    page.wait_for_selector("#explorer-neighbours")
    page.select_option("#explorer-layer", last)
    expected = data["words"][data["neighbours"][last][0][0][0]]
    assert page.locator("#explorer-neighbours tbody tr").nth(0).locator("td").nth(1).inner_text() == expected
    for width in (800, 1400):
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_timeout(500)  # Plotly redraws responsive charts on resize
        assert_layout_fits(page, width=width, layer_charts=True)
    shot = tmp_path / "tiny-bert-report.png"
    page.screenshot(path=str(shot), full_page=True)
    artifacts = os.environ.get("LMGEOM_TEST_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(artifacts) / shot.name)
    assert errors == [], errors
    page.close()


@pytest.mark.browser
def test_corpus_words_of_markup_leave_the_report_whole_in_headless_chromium(chromium: Any, markup_run: Path) -> None:
    """Every section and chart of the page is drawn, and the explorer shows a word of markup as text."""
    report = markup_run / "report.html"
    source = report.read_text(encoding="utf-8")
    page = chromium.new_page(viewport={"width": 1200, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(report.as_uri())
    n_figures = len(page_figures(source))
    page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot').length >= {n_figures}")
    assert page.evaluate("document.querySelectorAll('section').length") == source.count("<section id=")
    assert page.evaluate("document.querySelectorAll('.js-plotly-plot').length") == n_figures
    for word in MARKUP_WORDS[:3]:
        page.fill("#explorer-word", word)
        page.wait_for_selector("#explorer-word-title")
        assert page.locator("#explorer-word-title").inner_text() == word
    assert errors == [], errors
    page.close()


def test_nan_values_become_gaps_not_errors(tmp_path: Path, full_run: Path) -> None:
    """A layer whose metric is undefined (all null in the JSON) still renders; the gap is null in the figure."""
    run = tmp_path / "run"
    shutil.copytree(full_run, run, ignore=shutil.ignore_patterns("layers"))
    document = json.loads((run / "contextuality.json").read_text())
    for record in document["records"]:
        if record["metric"] == "mev_centred" and record["layer"] == 1:
            record["raw"] = None
    (run / "contextuality.json").write_text(json.dumps(document))
    (run / EXPLORER.name).unlink()  # no store layers here: the explorer says neighbours need them
    figures = page_figures(render_report(run).read_text())
    centred = next(t for t in figures["chart-mev"]["data"] if t["name"].startswith("centred"))
    assert centred["y"][1] is None and not any(isinstance(v, float) and math.isnan(v) for v in centred["y"])


def test_figure_bytes_depend_on_the_figure_alone():
    """A regenerated figure of the same results is the same file (no date, fixed SVG ids)."""
    import matplotlib.pyplot as plt

    from lmgeom import rundir

    def render(fmt):
        figure, axis = plt.subplots()
        axis.plot([0, 1, 2], [1, 3, 2])
        axis.set_title("t")
        try:
            return rundir.figure_bytes(figure, fmt, 80)
        finally:
            plt.close(figure)

    for fmt in ("svg", "png"):
        first, second = render(fmt), render(fmt)
        assert first == second, fmt
    assert b"<dc:date>" not in render("svg")
