"""The report's sections on what is inside a layer: attribution.json (`lmgeom attribute`), the
logit lens (`lmgeom lens`, `lmgeom lens-join`) and ablation.json (`lmgeom ablate`), built on run
folders holding copies of the committed results (docs/reproduction/results/attribution-smollm2-lee/,
lens-smollm2-lee/, tests/data/ablation-example/): the page's tables and chart data equal the files'
numbers, the figures are written, and a run without the files has no such section."""

from __future__ import annotations

import html as html_module
import json
import math
import re
import shutil
import struct
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from lmgeom import rundir
from lmgeom.report import build_report
from lmgeom.report.ablation import ablation_name, effect_chart, effect_table
from lmgeom.report.attribution import QUANTITIES, attribution_chart, share_table
from lmgeom.report.figures import Segment, StackedBars, draw_stacked, new_figure
from lmgeom.report.labels import number
from lmgeom.rundir import ResultFileError, records_csv
from lmgeom.rundir.write import digest
from lmgeom.stages.attribution import attribution_records

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "reproduction" / "results"
ATTRIBUTION = RESULTS / "attribution-smollm2-lee" / "attribution.json"
LENS = RESULTS / "lens-smollm2-lee" / "lens.json"
LENS_JOIN = RESULTS / "lens-smollm2-lee" / "lens_join.json"
# SmolLM2 on lee[:40]: layer 12's massive entries set to zero, one random draw (`lmgeom ablate`)
ABLATION = Path(__file__).resolve().parent / "data" / "ablation-example" / "ablation.json"
TERMS = {"resid_pre": "incoming residual (resid_pre)", "attn_out": "attention output (attn_out)",
         "mlp_out": "MLP output (mlp_out)"}


def _store_meta(folder: Path, document: dict[str, Any], corpus: str) -> None:
    """The meta.json of the store the document was written from (its generation and corpus), so the
    folder is that store's run and the readers' provenance checks pass on their merits."""
    meta = {"generation": document["provenance"]["store_generation"], "corpus_fingerprint": document["corpus_fingerprint"],
            "model_id": "smollm2", "corpus_name": corpus}
    (folder / "meta.json").write_text(json.dumps(meta))


@pytest.fixture(scope="module")
def attribution_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The committed attribution.json with its attribution.csv (made again from its layers: the digest it
    records) in the folder of its store; report built."""
    run = tmp_path_factory.mktemp("attribution") / "run"
    run.mkdir()
    shutil.copy(ATTRIBUTION, run / "attribution.json")
    document = json.loads(ATTRIBUTION.read_text())
    csv = records_csv(attribution_records(document["layers"]))
    assert digest(csv) == document["provenance"]["companions"]["attribution.csv"]
    (run / "attribution.csv").write_bytes(csv)
    _store_meta(run, document, "lee")
    build_report(run)
    return run


def _lens_run(folder: Path, *, join: bool) -> Path:
    """The committed lens.json (and lens_join.json) in the folder of its store. The committed lens.json
    comes without its per-position lens.parquet (5,134 positions x 31 layers), so the copy records no
    companion; everything else is the file as committed."""
    folder.mkdir()
    document = json.loads(LENS.read_text())
    document["provenance"]["companions"] = {}
    (folder / "lens.json").write_text(json.dumps(document))
    if join:
        shutil.copy(LENS_JOIN, folder / "lens_join.json")
    _store_meta(folder, document, "lee[:200]")
    return folder


@pytest.fixture(scope="module")
def lens_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = _lens_run(tmp_path_factory.mktemp("lens") / "run", join=True)
    build_report(run)
    return run


@pytest.fixture(scope="module")
def ablation_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example ablation.json with its ablation.csv (the digest it records) in a folder of their own, as
    `lmgeom ablate MODEL --corpus lee --out RUN` writes them (no store there); report built."""
    run = tmp_path_factory.mktemp("ablation") / "run"
    run.mkdir()
    for name in ("ablation.json", "ablation.csv"):
        shutil.copy(ABLATION.parent / name, run / name)
    document = json.loads(ABLATION.read_text())
    assert digest((run / "ablation.csv").read_bytes()) == document["provenance"]["companions"]["ablation.csv"]
    build_report(run)
    return run


def section_of(page: str, anchor: str) -> str:
    start = page.index(f'<section id="{anchor}">')
    return page[start: page.index("</section>", start)]


def tables_of(section: str) -> list[list[dict[str, str]]]:
    """Each table of a section as its rows, each row its cells' text by column header."""
    tables = []
    for body in re.findall(r"<table>(.*?)</table>", section, re.S):
        headers = [html_module.unescape(h) for h in re.findall(r"<th(?:\s[^>]*)?>(.*?)</th>", body)]
        rows = [[html_module.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]
                for row in re.findall(r"<tr>(<td.*?)</tr>", body)]
        tables.append([dict(zip(headers, cells)) for cells in rows])
    return tables


def page_figures(page: str) -> dict[str, Any]:
    return json.loads(page[page.index("const LMGEOM_FIGURES = ") + 23: page.index(";\nfor (const")])


def assert_figure_files(run: Path, name: str) -> None:
    png = (run / "figures" / f"{name}.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert width > 500 and height > 300
    assert ET.parse(run / "figures" / f"{name}.svg").getroot().tag.endswith("svg")


def pooled(entry: dict[str, Any], term: str, part: str) -> float:
    """A term's share of the outlier dimensions' summed variance, from each dimension's share and variance."""
    dims = entry["outlier_dimensions"]
    return sum(d["variance"] * d["shares"][term][part] for d in dims) / sum(d["variance"] for d in dims)


# ---- attribution ----------------------------------------------------------------------------------


def test_attribution_tables_equal_the_file(attribution_run: Path) -> None:
    document = json.loads(ATTRIBUTION.read_text())
    section = section_of((attribution_run / "report.html").read_text(), "attribution")
    assert "layer 0, the embedding output" in section and "block 30" in section
    mean, variance, outliers, massive = tables_of(section)
    layers = document["layers"]
    assert [row["layer"] for row in mean] == [str(entry["layer"]) for entry in layers] == [str(n) for n in range(1, 31)]
    for entry, m, v, o, top in zip(layers, mean, variance, outliers, massive):
        assert m["rows"] == f"{entry['n_rows']:,}" and m["‖mean‖"] == number(entry["mean_norm"], 3)
        assert m["sum-rule residual"] == f"{entry['residual']:.1e}"
        for term, name in TERMS.items():
            assert m[name] == number(entry["mean_shares"][term], 3)
            assert v[f"{name}: total"] == number(entry["variance_shares"][term]["total"], 3)
            assert v[f"{name}: own"] == number(entry["variance_shares"][term]["own"], 3)
            assert o[f"{name}: total"] == number(pooled(entry, term, "total"), 3)
            assert o[f"{name}: own"] == number(pooled(entry, term, "own"), 3)
            assert top[name] == number(entry["massive"][0]["shares"][term], 3)
        assert v["cross terms"] == number(sum(p["cross"] for p in entry["variance_shares"].values()), 3)
        assert o["outlier dimensions"] == ", ".join(str(d["dimension"]) for d in entry["outlier_dimensions"])
        assert (top["word"], top["dimension"], top["x"]) == (entry["massive"][0]["word"], str(entry["massive"][0]["dimension"]),
                                                            number(entry["massive"][0]["value"], 3))
    # layer 1: the MLP writes the mean direction and the largest activation (dimension 247, "Military")
    assert (mean[0][TERMS["mlp_out"]], massive[0]["word"], massive[0]["dimension"]) == ("0.997", "Military", "247")


def test_attribution_bars_stack_each_term_and_the_cross_terms(attribution_run: Path) -> None:
    document = json.loads(ATTRIBUTION.read_text())
    figures = page_figures((attribution_run / "report.html").read_text())
    layers = document["layers"]
    for quantity in QUANTITIES:
        figure = figures[f"chart-attribution_{quantity}"]
        assert figure["layout"]["barmode"] == "relative"  # negative shares below zero, positive above
        traces = {trace["name"]: trace for trace in figure["data"]}
        assert list(traces)[:3] == list(TERMS.values())
        for trace in traces.values():
            assert trace["x"] == [str(entry["layer"]) for entry in layers]
        assert_figure_files(attribution_run, f"attribution_{quantity}")
    mean = {t["name"]: t["y"] for t in figures["chart-attribution_mean"]["data"]}
    assert len(mean) == 3  # the mean direction has no cross terms
    for term, name in TERMS.items():
        assert mean[name] == [entry["mean_shares"][term] for entry in layers]
    assert mean[TERMS["mlp_out"]][9] < 0  # layer 10: the MLP writes against the mean, a segment below zero
    variance = {t["name"]: t["y"] for t in figures["chart-attribution_variance"]["data"]}
    cross = next(y for name, y in variance.items() if name.startswith("cross terms"))
    for index, entry in enumerate(layers):
        parts = entry["variance_shares"]
        assert cross[index] == pytest.approx(sum(p["cross"] for p in parts.values()), abs=1e-12)
        own = [variance[name][index] for name in TERMS.values()]
        assert own == [parts[term]["own"] for term in TERMS]
        assert sum(own) + cross[index] == pytest.approx(1, abs=1e-9)  # each bar's segments sum to 1
    outliers = {t["name"]: t["y"] for t in figures["chart-attribution_outliers"]["data"]}
    assert outliers[TERMS["resid_pre"]][9] == pytest.approx(pooled(layers[9], "resid_pre", "own"), rel=1e-12)


def test_stacked_bars_put_negative_segments_below_zero() -> None:
    chart = StackedBars("x", "t", "s", "layer", "share", ["1", "2"],
                        [Segment("a", [0.8, 1.2], "#1f77b4"), Segment("b", [-0.3, 0.1], "#ff7f0e"),
                         Segment("c", [0.5, math.nan], "#2ca02c")])
    ax = draw_stacked(chart, new_figure(4, 3).add_subplot())
    bars = [(round(p.get_y(), 6), round(p.get_height(), 6)) for p in ax.patches]
    # a: from 0 up; b: layer 1 from 0 down, layer 2 on top of a; c: on top of a at layer 1, nothing at layer 2
    assert bars == [(0, 0.8), (0, 1.2), (0, -0.3), (1.2, 0.1), (0.8, 0.5), (1.3, 0)]


def test_a_model_of_two_sums_a_layer_gets_a_bar_for_each() -> None:
    document = json.loads(ATTRIBUTION.read_text())
    attention = {**document["layers"][0], "sum": "attention", "terms": ["resid_pre", "attn_out"]}
    document["layers"] = [attention, {**document["layers"][0], "sum": "mlp"}]
    chart = attribution_chart(document, "mean")
    assert chart.bars == ["1 attention", "1 mlp"]
    assert list(share_table(document, "mean")["layer"]) == ["1 attention", "1 mlp"]


def test_no_attribution_section_without_the_file(lens_run: Path) -> None:
    page = (lens_run / "report.html").read_text()
    assert '<section id="attribution">' not in page and not (lens_run / "figures" / "attribution_mean.png").exists()


def test_attribution_of_another_store_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(ATTRIBUTION, run / "attribution.json")
    document = json.loads(ATTRIBUTION.read_text())
    (run / "attribution.csv").write_bytes(records_csv(attribution_records(document["layers"])))
    _store_meta(run, {**document, "provenance": {"store_generation": "another"}}, "lee")
    with pytest.raises(ResultFileError, match="attribution.json was written from another store"):
        build_report(run)


# ---- the logit lens -------------------------------------------------------------------------------


def test_lens_tables_and_charts_equal_the_files(lens_run: Path) -> None:
    lens, join = json.loads(LENS.read_text()), json.loads(LENS_JOIN.read_text())
    page = (lens_run / "report.html").read_text()
    section = section_of(page, "lens")
    summary, joined = tables_of(section)
    assert summary[0]["layer"] == "0 (embedding output)" and [row["layer"] for row in summary[1:]] == [str(n) for n in range(1, 31)]
    for row, layer in zip(summary, lens["layers"]):
        assert row["positions"] == f"{layer['n']:,}"
        assert row["entropy, mean (nats)"] == number(layer["entropy_mean"], 3)
        assert row["KL to the last layer, mean (nats)"] == number(layer["kl_mean"], 3)
        assert row["top-1 share"] == number(layer["top1"], 3)
    for row, layer in zip(joined, join["by_layer"]):
        assert row["words"] == str(layer["n_words"]) and row["occurrences"] == f"{layer['entropy']['n']:,}"
        for key in ("entropy", "rank"):
            assert [row[f"{key}: ρ"], row[f"{key}: low"], row[f"{key}: high"]] == \
                [number(layer[key][part], 3) for part in ("rho", "low", "high")]
    across = join["across_layers"]
    assert (f"over 31 layers is {number(across['rho'], 3)} [{number(across['low'], 3)}, {number(across['high'], 3)}]"
            in html_module.unescape(section))

    figures = page_figures(page)
    lines = {trace["name"]: trace["y"] for trace in figures["chart-lens_entropy_kl"]["data"]}
    assert lines["entropy, mean"] == [layer["entropy_mean"] for layer in lens["layers"]]
    assert lines["KL to the last layer, mean"] == [layer["kl_mean"] for layer in lens["layers"]]
    assert figures["chart-lens_top1"]["data"][0]["y"] == [layer["top1"] for layer in lens["layers"]]
    (rho,) = figures["chart-lens_join_entropy"]["data"]  # the interval as error bars on the one trace
    entropy = [layer["entropy"] for layer in join["by_layer"]]
    assert rho["y"] == [e["rho"] for e in entropy]
    assert rho["error_y"]["array"] == pytest.approx([e["high"] - e["rho"] for e in entropy])
    assert rho["error_y"]["arrayminus"] == pytest.approx([e["rho"] - e["low"] for e in entropy])
    for name in ("lens_entropy_kl", "lens_top1", "lens_join_entropy"):
        assert_figure_files(lens_run, name)
    assert "layer 0 = embedding output" in (lens_run / "figures" / "lens_join_entropy.svg").read_text()


def test_lens_without_its_join_says_which_command_writes_it(tmp_path: Path) -> None:
    run = _lens_run(tmp_path / "run", join=False)
    section = section_of(build_report(run).read_text(), "lens")
    assert "no lens_join.json in this run" in section and "lmgeom lens-join RUN" in section
    assert (run / "figures" / "lens_top1.png").exists() and not (run / "figures" / "lens_join_entropy.png").exists()


def test_no_lens_section_without_the_files(attribution_run: Path) -> None:
    page = (attribution_run / "report.html").read_text()
    assert '<section id="lens">' not in page and not (attribution_run / "figures" / "lens_top1.png").exists()


def test_a_lens_without_its_table_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(LENS, run / "lens.json")  # as committed: it records lens.parquet, which is not here
    _store_meta(run, json.loads(LENS.read_text()), "lee[:200]")
    with pytest.raises(ResultFileError, match=f"is missing its companion {rundir.LENS_TABLE.name}"):
        build_report(run)


# ---- ablations ------------------------------------------------------------------------------------


def with_interval(effect: dict[str, Any], key: str) -> str:
    return f"{number(effect[key], 3)} [{number(effect[f'{key}_low'], 3)}, {number(effect[f'{key}_high'], 3)}]"


def test_ablation_tables_equal_the_file(ablation_run: Path) -> None:
    document = json.loads(ABLATION.read_text())
    section = section_of((ablation_run / "report.html").read_text(), "ablation")
    text = html_module.unescape(section)
    assert "Layers: 0 = the embedding output" in text
    assert f"zero: {document['definitions']['zero']}" in text and f"mean: {document['definitions']['mean']}" in text
    found, ablations, loss, attention_mean, attention = tables_of(section)
    (site,) = document["sites"]
    (row,) = found
    assert (row["site"], row["layer"], row["positions"]) == ("resid_post", "12", "1,185")
    assert [row["rogue dimensions"], row["outlier dimensions (3σ)"], row["massive dimensions"]] == \
        [", ".join(map(str, site["dimensions"][kind])) for kind in ("rogue", "outlier", "massive")] == \
        ["507, 247, 308", "507, 247", "247, 507"]
    assert row["massive entries"] == "44" and row["massive entries per dimension (mean value)"] == "247: 4 (2042.6); 507: 40 (23370.9)"
    assert (row["massive cutoff (|h| above)"], row["max |h|"], row["median |h|"]) == \
        (number(site["massive_cutoff"], 3), number(site["max_abs"], 3), number(site["median_abs"], 3))
    (config,) = document["configs"]
    assert ablations == [{"ablation": "12 resid_post: massive zero", "dimensions": "247, 507", "entries edited per pass": "44",
                          "random controls' dimensions": "243, 530"}]
    for (shown,), name in ((loss, "loss"), (attention_mean, "attention_first_mean")):
        effect = config["effects"][name]
        assert shown["ablation"] == ablation_name(config) == "12 resid_post: massive zero"
        assert (shown["unablated"], shown["ablated"]) == (number(effect["base"], 3), number(effect["ablated"], 3))
        assert shown["Δ [95% CI]"] == with_interval(effect, "delta")
        assert shown["random Δ"] == number(effect["random"][0] - effect["base"], 3)
        assert shown["Δ beyond random [95% CI]"] == with_interval(effect, "excess")
    assert loss[0]["Δ [95% CI]"] == "10.254 [9.845, 10.603]"  # zeroing 44 of the layer's 682,560 entries costs 10 nats per token
    baseline, per_layer = document["baseline"]["attention_first"], config["effects"]["attention_first"]
    assert [row["layer"] for row in attention] == [str(n) for n in range(1, 31)] == list(baseline)
    for row in attention:
        assert row["unablated"] == number(baseline[row["layer"]], 3)
        assert row["12 resid_post: massive zero"] == (number(per_layer[row["layer"]]["ablated"], 3)
                                                      if row["layer"] in per_layer else "—")
    assert f"unigram loss (nats per token): {number(document['trivial']['loss_unigram'], 3)}" in text


def test_ablation_charts_put_each_change_beside_its_controls(ablation_run: Path) -> None:
    document = json.loads(ABLATION.read_text())
    (config,) = document["configs"]
    figures = page_figures((ablation_run / "report.html").read_text())
    for name in ("loss", "attention_first_mean"):
        effect = config["effects"][name]
        figure = figures[f"chart-ablation_{name}"]
        change, controls = figure["data"]
        assert change["y"] == [effect["delta"]] and change["x"] == [0]
        assert change["error_y"]["array"] == pytest.approx([effect["delta_high"] - effect["delta"]])
        assert change["error_y"]["arrayminus"] == pytest.approx([effect["delta"] - effect["delta_low"]])
        assert controls["y"] == [effect["random"][0] - effect["base"]] and controls["marker"]["color"] == "#7f7f7f"
        assert 0 < controls["x"][0] < 0.5  # beside its ablation's point, not on it
        assert figure["layout"]["xaxis"]["ticktext"] == ["12 resid_post: massive zero"]
        assert [shape["y0"] for shape in figure["layout"]["shapes"]] == [0]  # the line at 0
        assert_figure_files(ablation_run, f"ablation_{name}")
    lines = {trace["name"]: trace for trace in figures["chart-ablation_attention_first"]["data"]}
    baseline, per_layer = document["baseline"]["attention_first"], config["effects"]["attention_first"]
    assert lines["unablated"]["x"] == list(range(1, 31)) and lines["unablated"]["y"] == list(baseline.values())
    ablated = lines["ablated: 12 resid_post: massive zero"]
    assert ablated["x"] == list(range(12, 31)) and ablated["y"] == [per_layer[str(n)]["ablated"] for n in range(12, 31)]
    assert_figure_files(ablation_run, "ablation_attention_first")
    for name in ("ablation_loss", "ablation_attention_first"):
        assert "layer 0 = embedding output" in (ablation_run / "figures" / f"{name}.svg").read_text()


def test_several_ablations_and_controls_without_intervals() -> None:
    document = json.loads(ABLATION.read_text())
    (config,) = document["configs"]
    loss = config["effects"]["loss"]
    unbooted = {key: value for key, value in loss.items() if not key.endswith(("_low", "_high"))}
    mean = {**config, "layer": 0, "how": "mean",
            "effects": {"loss": {**unbooted, "delta": 0.5, "random": [loss["base"] + 0.1, loss["base"] - 0.2, loss["base"]]}}}
    document["configs"] = [config, mean]
    chart = effect_chart(document, "loss")
    assert [effect.name for effect in chart.effects] == ["12 resid_post: massive zero", "0 (embedding output) resid_post: massive mean"]
    xs, ys = chart.control_points()
    assert ys == pytest.approx([loss["random"][0] - loss["base"], 0.1, -0.2, 0])
    assert xs[0] == pytest.approx(0.22) and 1 < xs[1] < xs[2] < xs[3] < 1.5  # three controls spread to the right of the second
    assert math.isnan(chart.effects[1].low)  # no interval: no error bar
    rows = effect_table(document, "loss").to_dict("records")
    assert rows[1]["Δ [95% CI]"] == "0.500" and rows[1]["random Δ"] == "-0.200 to 0.100"


def test_no_ablation_section_without_the_file(attribution_run: Path) -> None:
    page = (attribution_run / "report.html").read_text()
    assert '<section id="ablation">' not in page and not (attribution_run / "figures" / "ablation_loss.png").exists()


def test_no_other_inside_section_in_an_ablation_run(ablation_run: Path) -> None:
    page = (ablation_run / "report.html").read_text()
    assert '<section id="attribution">' not in page and '<section id="lens">' not in page


def test_ablation_of_another_store_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    for name in ("ablation.json", "ablation.csv"):
        shutil.copy(ABLATION.parent / name, run / name)
    document = json.loads(ABLATION.read_text())
    _store_meta(run, {**document, "provenance": {"store_generation": "another"}}, "lee")
    with pytest.raises(ResultFileError, match="ablation.json was written from another store"):
        build_report(run)


def test_an_ablation_without_its_table_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(ABLATION, run / "ablation.json")
    with pytest.raises(ResultFileError, match=f"is missing its companion {rundir.ABLATION_CSV.name}"):
        build_report(run)


# ---- the page in a browser, and the docs ----------------------------------------------------------


def test_docs_list_the_figures_of_these_sections(attribution_run: Path, lens_run: Path, ablation_run: Path) -> None:
    files = (Path(__file__).resolve().parents[1] / "docs" / "report.md").read_text().split("## Files", 1)[1]
    listed = set(re.findall(r"`([a-z0-9_]+)`", files.split("RUN/explorer.json", 1)[0]))
    written = {path.stem for run in (attribution_run, lens_run, ablation_run) for path in (run / "figures").glob("*.png")}
    assert len(written) == 10 and written <= listed, written - listed
    assert {f"ablation_{name}" for name in ("sts_layer", "sts_last", "pos_layer", "pos_last")} <= listed


@pytest.mark.browser
def test_the_sections_render_in_headless_chromium(attribution_run: Path, lens_run: Path, ablation_run: Path) -> None:
    executable = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if executable is None:
        pytest.skip("no Chromium found (install it: `bash scripts/install.sh --test` or `apt-get install chromium`)")
    from playwright.sync_api import sync_playwright  # a test dependency: missing, it fails rather than skips

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            for run, bars, error_bars in ((attribution_run, 3 + 4 + 4 + 3, 0), (lens_run, 0, 31), (ablation_run, 0, 2)):
                page = browser.new_page(viewport={"width": 1200, "height": 900})
                errors: list[str] = []
                page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
                page.on("pageerror", lambda error: errors.append(str(error)))
                page.goto((run / "report.html").as_uri())
                n_figures = len(page_figures((run / "report.html").read_text()))
                page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot').length >= {n_figures}")
                # a bar trace per segment (3 terms, and the cross terms of both variances); an error bar per layer of
                # ρ; an error bar per ablation and measure (loss, mean attention to the first position)
                assert page.locator(".barlayer .trace").count() == bars
                assert page.locator(".errorbar").count() == error_bars
                assert errors == [], errors
                page.close()
        finally:
            browser.close()
