"""The report's thesis section, built on a run holding a copy of a committed thesis test
(docs/reproduction/results/ding-thesis-finetune/with-batch-refits/) in its experiments/ and including
another (ding-thesis-frozen/): the page's tables equal the documents' tests, the charts draw the
documents' numbers (the scatter's points give the test's rho again), the figures are written, and a
thesis.json that is not one is refused by name."""

from __future__ import annotations

import html as html_module
import json
import re
import shutil
from pathlib import Path

import pytest
from scipy import stats

from lmgeom import rundir
from lmgeom.report import build_report
from lmgeom.report.labels import number
from lmgeom.report.thesis import pairs_chart, rho_chart, tests_table as thesis_tests_table
from lmgeom.rundir import ResultFileError

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "reproduction" / "results"
REFITS = RESULTS / "ding-thesis-finetune" / "with-batch-refits"
FROZEN = RESULTS / "ding-thesis-frozen"


def section_of(page: str, anchor: str) -> str:
    start = page.index(f'<section id="{anchor}">')
    return page[start: page.index("</section>", start)]


def rows_of(table_html: str) -> list[dict[str, str]]:
    headers = [html_module.unescape(h) for h in re.findall(r"<th(?:\s[^>]*)?>(.*?)</th>", table_html)]
    return [dict(zip(headers, [html_module.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]))
            for row in re.findall(r"<tr>(.*?)</tr>", table_html, re.S) if "<td" in row]


@pytest.fixture(scope="module")
def thesis_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """A run whose experiments/refits/ holds the committed thesis with the batch re-fits, the frozen
    thesis in a folder of its own (included); the report built."""
    root = tmp_path_factory.mktemp("thesis")
    run, included = root / "run", root / "frozen"
    shutil.copytree(REFITS, run / "experiments" / "refits")
    included.mkdir()
    for name in ("thesis.json", "thesis.png"):
        shutil.copy(FROZEN / name, included / name)
    page = build_report(run, include=[included]).read_text()
    return run, included, page


def test_the_tables_equal_each_documents_tests(thesis_run):
    run, included, page = thesis_run
    section = section_of(page, "thesis")
    parts = re.split(r"<h3>(.*?)</h3>", section)[1:]
    assert parts[0::2] == ["refits", "frozen"]  # the run's own first, then the included folder's
    for body, folder in zip(parts[1::2], (REFITS, FROZEN)):
        document = json.loads((folder / "thesis.json").read_text())
        rows = rows_of(re.search(r"<table>(.*?)</table>", body, re.S)[1])
        tests = document["tests"] + document["level_tests"]
        assert len(rows) == len(tests) == 6
        for row, test in zip(rows, tests):
            assert (row["regime"], int(row["pairs"]), int(row["clusters"])) == (test["regime"], test["n_pairs"], test["n_clusters"])
            if test["rho"] is None:
                assert row["ρ"] == number(float("nan"), 2) and row["note"] == test["note"]
            else:
                assert row["ρ"] == number(test["rho"], 2)
                assert row["95% interval"] == f"[{test['low']:+.2f}, {test['high']:+.2f}]"
                assert row["p"].startswith(f"{test['p_value']:.2g} (")
        assert f"{document['n_pairs_formed']} pairs formed, {document['n_pairs_kept']} kept" in body
        for drop in document["dropped"]:
            assert html_module.escape(drop["reason"]) in body
    # the committed finetune reading: local rho +0.76 [+0.51, +0.82] over 42 pairs in 15 clusters
    assert "[+0.51, +0.82]" in section and 'href="experiments/refits/thesis.png"' in section


def test_the_charts_draw_the_documents_numbers_and_the_files_are_written(thesis_run):
    run, _, page = thesis_run
    document = json.loads((REFITS / "thesis.json").read_text())
    chart = rho_chart(document, "c", "refits")
    with_rho = [t for t in document["tests"] + document["level_tests"] if t["rho"] is not None]
    assert [(e.value, e.low, e.high) for e in chart.effects] == [(t["rho"], t["low"], t["high"]) for t in with_rho]
    assert [e.name for e in chart.effects] == ["finetune: Δ global", "finetune: Δ local", "finetune: level"]
    scatter = pairs_chart(document, "finetune", "s", "refits")
    assert [s.name for s in scatter.series] == ["conceptor", "isobn", "istar", "whitening"] and all(s.points for s in scatter.series)
    x = [v for s in scatter.series for v in s.x]
    y = [v for s in scatter.series for v in s.y]
    assert len(x) == 42
    # the points drawn are the test's: Spearman of them is the document's local rho
    local = next(t for t in document["tests"] if t["regime"] == "finetune" and t["measure"] == "local")
    assert stats.spearmanr(x, y).statistic == pytest.approx(local["rho"], abs=1e-12)
    assert pairs_chart(document, "frozen", "s", "refits") is None  # no frozen pair in it
    assert rho_chart({**document, "tests": [], "level_tests": []}, "c", "refits") is None
    for name in ("thesis_1_refits_rho", "thesis_1_refits_pairs_finetune", "thesis_2_frozen_rho", "thesis_2_frozen_pairs_frozen"):
        for ext in ("png", "svg"):
            assert (run / "figures" / f"{name}.{ext}").stat().st_size > 1000
        assert f'data-chart="{name}"' in page
    table = thesis_tests_table(document)
    assert list(table["pairs"]) == [t["n_pairs"] for t in document["tests"] + document["level_tests"]]


def test_no_section_without_a_thesis_and_a_foreign_document_is_refused(thesis_run, tmp_path):
    run, _, _ = thesis_run
    bare = tmp_path / "bare"
    (bare / "experiments").mkdir(parents=True)
    assert '<section id="thesis">' not in build_report(bare).read_text()
    document = json.loads((REFITS / "thesis.json").read_text())
    older = tmp_path / "older"
    older.mkdir()
    (older / "thesis.json").write_text(json.dumps({k: v for k, v in document.items() if k != "kind"}))
    with pytest.raises(ResultFileError, match=r"thesis\.json holds kind None, expected 'thesis'.*lmgeom experiment thesis"):
        build_report(bare, include=[older])
    (older / "thesis.json").write_text(json.dumps({k: v for k, v in document.items() if k != "pairs"}))
    with pytest.raises(ResultFileError, match="lacks pairs"):
        build_report(bare, include=[older])
    assert rundir.read_json(REFITS / "thesis.json", "thesis")["kind"] == "thesis"
