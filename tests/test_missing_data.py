"""What a run does not find in its data folder is visible: `lmgeom run --data-dir` (and `run(data_dir=)`),
one `skipped:` line per kind of input not found, run.json's `skipped_inputs`, and the report's "Not
measured" boxes, read from the result files."""

from __future__ import annotations

import html
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from helpers import TINY_RUN, TINY_RUN_ARGS
from lmgeom.cli.main import app
from lmgeom.errors import MissingInput
from lmgeom.evaluate.wordbench import DATA_BENCHMARKS, ON_REQUEST
from lmgeom.report.missing_data import DATA_FIX, missing_alignment, missing_benchmarks


def expected_lines(data: Path) -> list[str]:
    """The lines a tiny-bert run on Lee prints when its data folder `data` is empty."""
    return [f"skipped: {len(DATA_BENCHMARKS)} word benchmarks ({', '.join(DATA_BENCHMARKS)}), not found in {data}: {DATA_FIX}",
            f"skipped: geometry alignment, no STS Benchmark (stsbenchmark/sts-*.csv) under {data}: {DATA_FIX}"]


@pytest.fixture(scope="module")
def empty_data_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """`run` of tiny-bert on Lee (`helpers.TINY_RUN`) with `data_dir` an empty folder, and that folder."""
    from lmgeom.pipeline import run

    data = tmp_path_factory.mktemp("no-data")
    result = run("tiny-bert", "lee", out=tmp_path_factory.mktemp("missing-data") / "tiny-bert-lee", data_dir=data, **TINY_RUN)
    return result, data


def sections(page: str) -> dict[str, str]:
    return dict(re.findall(r'<section id="([^"]+)">(.*?)</section>', page, flags=re.S))


def boxes(section: str) -> list[str]:
    return [html.unescape(text) for text in re.findall(r'<p class="missing">(.*?)</p>', section, flags=re.S)]


def test_a_run_without_data_records_every_skip_in_its_result_and_run_json(empty_data_run: tuple[Any, Path]) -> None:
    result, data = empty_data_run
    assert [entry["message"] for entry in result.skipped_inputs] == expected_lines(data)
    words, alignment = result.skipped_inputs
    assert words["step"] == "static_embeddings" and words["inputs"] == list(DATA_BENCHMARKS)
    assert alignment["step"] == "geometry" and alignment["inputs"] == ["STS-B pairs"]
    assert words["looked_in"] == alignment["looked_in"] == str(data) and words["fix"] == DATA_FIX
    record = json.loads((Path(result.store.path) / "run.json").read_text())
    assert record["skipped_inputs"] == result.skipped_inputs
    # the folder looked in is among the settings of the steps that read it: data found there later redoes them
    for step in ("static_embeddings", "geometry"):
        assert record["steps"][step]["settings"]["data_folder"] == str(data.resolve())
        assert record["steps"][step]["settings"]["data_dir"] == str(data)
    static = json.loads((Path(result.store.path) / "static" / "3.benchmarks.json").read_text())
    assert set(static["skipped"]) == set(DATA_BENCHMARKS)
    assert {record["benchmark"] for record in static["records"]} == {"simlex999", "wordsim353", "google_analogies"}


def test_run_prints_one_line_per_kind_even_when_its_steps_were_done(empty_data_run: tuple[Any, Path]) -> None:
    result, data = empty_data_run
    out = Path(result.store.path)
    outcome = CliRunner().invoke(app, ["run", "--model", "tiny-bert", *TINY_RUN_ARGS, "--out", str(out), "--data-dir", str(data)],
                                 env={"COLUMNS": "80"})
    assert outcome.exit_code == 0, outcome.output
    # each a paragraph wrapped at the terminal's width (80 columns here)
    flat = " ".join(outcome.output.split())
    assert all(line in flat for line in expected_lines(data)) and flat.count("skipped: ") == 2
    assert max(map(len, outcome.output.splitlines())) <= 80
    # every step but the report was found done: the lines come from the result files
    assert "static_embeddings, similarity, geometry" in " ".join(outcome.output.split())


def test_the_report_shows_a_not_measured_box_read_from_the_result_files(empty_data_run: tuple[Any, Path],
                                                                       tmp_path: Path) -> None:
    from lmgeom.report import build_report

    result, data = empty_data_run
    copy = Path(shutil.copytree(result.store.path, tmp_path / "run"))
    (copy / "run.json").unlink()  # the report reads the static benchmarks files and geometry.json, not run.json
    for page in ((Path(result.store.path) / "report.html").read_text(), Path(build_report(copy)).read_text()):
        shown = sections(page)
        static, geometry = boxes(shown["static"]), boxes(shown["geometry"])
        assert len(static) == 1 and static[0].startswith(
            f"Not measured: 8 word benchmarks ({', '.join(DATA_BENCHMARKS)}), not found in {data} (looked for "
            f"{DATA_BENCHMARKS['men']}, ")
        assert static[0].endswith(f"{DATA_BENCHMARKS['essli_2c']}). To measure: {DATA_FIX}, and run again.")
        assert geometry[0] == (f"Not measured: geometry alignment, no STS Benchmark (stsbenchmark/sts-*.csv) under {data}. "
                               f"To measure: {DATA_FIX}, and run again.")
        assert not any("Not measured" in text for name, body in shown.items() if name not in ("static", "geometry")
                       for text in boxes(body))


def test_a_data_dir_that_is_not_a_folder_is_refused_before_any_work(tmp_path: Path) -> None:
    from lmgeom.pipeline import run

    absent, out = tmp_path / "absent", tmp_path / "run"
    outcome = CliRunner().invoke(app, ["run", "--model", "tiny-bert", "--out", str(out), "--data-dir", str(absent)],
                                 env={"COLUMNS": "200"})
    assert outcome.exit_code == 2
    lines = outcome.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --data-dir {absent} is not a folder"), outcome.output
    assert not out.exists()
    with pytest.raises(MissingInput) as refused:
        run("tiny-bert", "lee", out=out, data_dir=tmp_path / "missing-data.txt", device="cpu")
    assert refused.value.params == ("data_dir",) and not out.exists()


def test_only_sets_not_found_and_alignment_without_pairs_count_as_missing() -> None:
    # with the data folder present, a set scored only on request is not missing
    assert missing_benchmarks([{"skipped": dict(ON_REQUEST)}]) == []
    reason = f"{DATA_BENCHMARKS['men']} not found in /data"
    two_layers = [{"skipped": {"men": reason, **ON_REQUEST}}, {"skipped": {"men": reason}}]
    (entry,) = missing_benchmarks(two_layers)
    assert entry.message == f"skipped: 1 word benchmark (men), not found in /data: {DATA_FIX}"
    assert entry.paths == (DATA_BENCHMARKS["men"],)
    assert missing_alignment({"settings": {"alignment": {"n_pairs": 12, "note": None}}}) == []
    assert missing_alignment(None) == []
    note = "the store's corpus (lee) holds no STS-B pair with gold >= 4 (alignment needs positive pairs: extract a corpus of STS-B sentences)"
    (corpus,) = missing_alignment({"settings": {"alignment": {"n_pairs": 0, "note": note}}})
    assert corpus.looked_in is None and corpus.fix == "" and corpus.message == f"skipped: geometry alignment, {note}"
