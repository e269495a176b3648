"""The run directory: calibrate and sts merge into a run's results, a damaged result is redone,
the report refuses a folder that is not a run, and the readers name a file that does not read."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from lmgeom.errors import InputError
from lmgeom.cli.main import app
from lmgeom.report import load_run
from lmgeom.stages import calibrate_store
from lmgeom import rundir
from lmgeom.pipeline import run
from lmgeom.stages.calibration import CalibrationOptions, read_calibration
from lmgeom.stages.sts import run_sts

from helpers import TINY_RUN

RUN_OPTIONS = TINY_RUN  # tiny-bert on 60 Lee sentences, calibrating layers 0 and 3 (whitening, abtt)


@pytest.fixture
def a_run(tiny_run: Any, tmp_path: Path) -> Path:
    """A copy of the session's finished tiny run that a test may change."""
    return Path(shutil.copytree(tiny_run.store.path, tmp_path / "run"))


def _by_fit(records: list[dict]) -> dict[tuple[int, str], list[dict]]:
    fits: dict[tuple[int, str], list[dict]] = {}
    for record in records:
        fits.setdefault((record["layer"], record["method"]), []).append(record)
    return fits


def test_calibrate_after_run_keeps_every_record_and_a_refit_replaces_only_its_own(a_run: Path):
    from_run = _by_fit(json.loads(rundir.CALIBRATION.at(a_run).read_text())["records"])
    assert set(from_run) == {(0, "whitening"), (0, "abtt"), (3, "whitening"), (3, "abtt")}

    outcome = CliRunner().invoke(app, ["calibrate", str(a_run), "--layers", "2", "--methods", "whitening"])
    assert outcome.exit_code == 0, outcome.output
    document = read_calibration(a_run)
    merged = _by_fit(document["records"])
    assert set(merged) == set(from_run) | {(2, "whitening")}
    assert all(merged[key] == from_run[key] for key in from_run)  # the run's records, untouched
    assert document["settings"]["layers"] == [0, 2, 3] and document["settings"]["methods"] == ["whitening", "abtt"]
    assert {(fit["layer"], fit["method"]) for fit in document["fits"]} == set(merged)
    csv = rundir.read_csv(rundir.CALIBRATION_CSV.at(a_run))
    assert csv is not None and len(csv) == len(document["records"])
    assert {path.name for path in rundir.CALIBRATORS.at(a_run).iterdir()} == {
        "whitening-L0.npz", "abtt-L0.npz", "whitening-L3.npz", "abtt-L3.npz", "whitening-L2.npz"}
    assert sorted(load_run(a_run).calibration["layer"].unique()) == [0, 2, 3]  # the report shows all three
    # the run's own fits are still there: its calibration step is not redone
    again = run("tiny-bert", "lee", out=a_run, **RUN_OPTIONS)
    assert "calibration" in again.steps_skipped

    calibrator = rundir.CALIBRATOR.at(a_run, method="whitening", layer=0).with_suffix(".npz")
    untouched = calibrator.with_name("abtt-L0.npz").read_bytes()
    refit = calibrate_store(str(a_run), CalibrationOptions(methods=("whitening",), layers=(0,), eval_rows=200, seed=1))
    assert [{k: v for k, v in fit.items() if k != "seconds"} for fit in refit.fits] == [{"layer": 0, "method": "whitening", "include_special": False, "include_punct": False,
                           "exclude_first_word": False, "eval_rows": 200, "fit_rows_subsampled_methods": 100_000,
                           "seed": 1}]
    document = read_calibration(a_run)
    after = _by_fit(document["records"])
    assert set(after) == set(merged)
    assert [r["n_eval_rows"] for r in after[(0, "whitening")]] == [200] * len(after[(0, "whitening")])
    before_values = [r["before"] for r in after[(0, "whitening")]]
    assert before_values != [r["before"] for r in merged[(0, "whitening")]]  # measured on another sample
    assert all(after[key] == merged[key] for key in merged if key != (0, "whitening"))
    assert calibrator.with_name("abtt-L0.npz").read_bytes() == untouched
    # the options differ between fits now: settings keep only what they share
    assert "seed" not in document["settings"] and "include_punct" in document["settings"]

    # the run's fit of layer 0 whitening was replaced: the next run fits it again, keeping layer 2
    resumed = run("tiny-bert", "lee", out=a_run, **RUN_OPTIONS)
    assert "calibration" in resumed.steps_run
    final = read_calibration(a_run)
    assert set(_by_fit(final["records"])) == set(merged)
    np.testing.assert_allclose([r["after"] for r in _by_fit(final["records"])[(0, "whitening")]],
                               [r["after"] for r in from_run[(0, "whitening")]], rtol=1e-12)
    assert final["settings"]["seed"] == 0 and _by_fit(final["records"])[(2, "whitening")] == merged[(2, "whitening")]


def test_a_truncated_result_is_redone_by_the_next_run_and_the_report_renders(a_run: Path):
    isotropy = rundir.ISOTROPY.at(a_run)
    expected = json.loads(isotropy.read_text())["records"]
    isotropy.write_text(isotropy.read_text()[:200])
    assert "truncated or not JSON" in (rundir.problem(a_run, "isotropy.json") or "")
    with pytest.raises(rundir.ResultFileError, match="isotropy.json"):
        load_run(a_run)
    again = run("tiny-bert", "lee", out=a_run, **RUN_OPTIONS)
    assert again.steps_run == ["isotropy", "report"]
    assert json.loads(isotropy.read_text())["records"] == expected
    assert load_run(a_run).isotropy is not None and rundir.REPORT.at(a_run).stat().st_size > 10_000

    # another kind under a result file's name, or a truncated run.json: the same
    summary = json.loads(rundir.SUMMARY.at(a_run).read_text())
    rundir.write_json(rundir.CONTEXTUALITY.at(a_run), "layer_summary", summary)
    assert "expected 'contextuality'" in (rundir.problem(a_run, "contextuality.json") or "")
    again = run("tiny-bert", "lee", out=a_run, **RUN_OPTIONS)
    assert again.steps_run == ["contextuality", "report"]
    rundir.RUN.at(a_run).write_text("{")
    again = run("tiny-bert", "lee", out=a_run, **RUN_OPTIONS)
    assert again.steps_run[0] == "extract" and "calibration" in again.steps_run


def test_report_refuses_a_folder_that_is_not_a_run(tmp_path: Path):
    folder = tmp_path / "my papers"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    outcome = CliRunner().invoke(app, ["report", str(folder)])
    assert outcome.exit_code == 2
    message = " ".join(outcome.output.split())  # one message, wrapped to the terminal's width
    assert message.startswith("error: ") and message.count("error:") == 1
    assert f"{folder} is not a run directory" in message and "`lmgeom run`" in message
    assert sorted(path.name for path in folder.iterdir()) == ["notes.txt"]
    outcome = CliRunner().invoke(app, ["compare", str(folder), "--out", str(tmp_path / "compared")])
    assert outcome.exit_code == 2 and "is not a run directory" in outcome.output


def test_calibrate_refuses_a_folder_that_is_neither_a_store_nor_a_model(tmp_path: Path):
    folder = tmp_path / "photos"
    folder.mkdir()
    (folder / "a.jpg").write_bytes(b"\xff\xd8")
    outcome = CliRunner().invoke(app, ["calibrate", str(folder), "--layers", "0"])
    assert outcome.exit_code == 2, outcome.output
    assert "neither a store" in outcome.output and "sentencepiece" not in outcome.output
    assert sorted(path.name for path in folder.iterdir()) == ["a.jpg"]
    assert not (Path("runs") / "photos-lee").exists()


def test_readers_name_a_file_that_does_not_read(tmp_path: Path):
    path = rundir.ISOTROPY.at(tmp_path)
    rundir.write_json(path, "isotropy", {"settings": {"seed": 0}, "records": [{"layer": 0, "value": float("nan")}]},
                      store_meta={"model_id": "m", "corpus_fingerprint": "c"})
    document = rundir.read_json(path, "isotropy")
    assert document is not None and document["records"] == [{"layer": 0, "value": None}]
    assert document["schema_version"] == rundir.SCHEMA_VERSION and document["model_id"] == "m"
    text = path.read_text()
    cases = {
        text[: len(text) // 2]: "truncated or not JSON",
        "[1, 2]": "holds no JSON object",
        text.replace('"isotropy"', '"calibration"', 1): "holds kind 'calibration', expected 'isotropy'",
        text.replace('"schema_version": 1', '"schema_version": 99'): "schema version 99",
    }
    for damaged, message in cases.items():
        path.write_text(damaged)
        with pytest.raises(rundir.ResultFileError) as error:
            rundir.read_json(path, "isotropy")
        assert str(path) in str(error.value) and message in str(error.value)
        assert "lmgeom run" in str(error.value)  # how to write it again
    without = {key: value for key, value in json.loads(text).items() if key != "records"}
    path.write_text(json.dumps(without))
    with pytest.raises(rundir.ResultFileError, match="lacks records"):
        rundir.read_json(path, "isotropy")
    assert rundir.read_json(tmp_path / "absent.json", "isotropy") is None

    table = rundir.CALIBRATION_CSV.at(tmp_path)
    table.write_text('layer,method\n0,"whiten')
    with pytest.raises(rundir.ResultFileError, match="calibration.csv is truncated or not CSV"):
        rundir.read_csv(table, rundir.CALIBRATION_CSV)
    assert "calibration.csv" in (rundir.problem(tmp_path, "calibration.csv") or "")
    assert rundir.problem(tmp_path, "static/1.benchmarks.json") == "static/1.benchmarks.json is missing"
    assert not rundir.is_run(tmp_path / "absent") and rundir.is_run(tmp_path)  # isotropy.json makes a run
    rundir.write_json(tmp_path / "sts-only" / "minilm.json", "sts", {"settings": {}, "records": []})
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x.json").write_text('{"kind": "mine"}')
    assert rundir.is_run(tmp_path / "sts-only") and not rundir.is_run(tmp_path / "other")


def test_result_files_are_named_in_one_place():
    assert rundir.spec_of("static/12.benchmarks.json") is rundir.STATIC_BENCHMARKS
    assert rundir.spec_of("calibrators/flow-L3.pt") is rundir.CALIBRATOR
    assert rundir.spec_of("notes.txt") is None
    assert rundir.STATIC_BENCHMARKS.at("RUN", layer=4) == Path("RUN/static/4.benchmarks.json")
    assert {spec.kind for spec in rundir.KINDS.values()} == {
        "run", "layer_summary", "contextuality", "isotropy", "calibration", "static_embedding_benchmarks", "sts",
        "word_explorer", "similarity", "geometry", "attribution", "lens", "lens_join", "ablation", "thesis"}


def _write_sts_data(root: Path) -> Path:
    folder = root / "stsbenchmark"
    folder.mkdir(parents=True)
    rows = [("5.000", "A man is playing a guitar.", "A man plays the guitar."),
            ("1.200", "He said no to the plan.", "Stocks fell on Monday."),
            ("3.000", "The cat sat on the mat.", "A cat is sitting on a mat."),
            ("0.400", "A woman is slicing onions.", "A boy rides a bike.")]
    (folder / "sts-test.csv").write_text(
        "".join("\t".join(("main-captions", "MSRvid", "2012test", f"{i:04d}", *row)) + "\n" for i, row in enumerate(rows)),
        encoding="utf-8")
    return root


def test_sts_into_a_run_directory_merges_by_layer_method_and_fit(a_run: Path, tmp_path: Path):
    data = _write_sts_data(tmp_path / "data")
    out = a_run / "sts.json"
    first = run_sts("tiny-bert", data, layers=[0, 1], device="cpu", out=out)
    second = run_sts("tiny-bert", data, layers=[1, 2], methods=["whitening"], device="cpu", out=out)
    document = json.loads(out.read_text())
    keys = {(r["layer"], r["method"], r["fit_on"]) for r in document["records"]}
    assert keys == {("0", "none", "none"), ("1", "none", "none"), ("2", "none", "none"),
                    ("1", "whitening", "transductive"), ("2", "whitening", "transductive")}
    assert [layer["name"] for layer in document["settings"]["layers"]] == ["0", "1", "2"]
    assert document["settings"]["methods"] == ["none", "whitening"]
    layer0 = [r for r in document["records"] if r["layer"] == "0"]
    assert layer0 == [r for r in json.loads(json.dumps(first.records)) if r["layer"] == "0"]
    assert len(document["records"]) == len(layer0) + len(second.records)
    sts = load_run(a_run).sts
    assert sts is not None and len(sts) == len(document["records"])

    with pytest.raises(ValueError, match="other settings .*seed 0 there, 1 here"):
        run_sts("tiny-bert", data, layers=[0], device="cpu", seed=1, out=out)
    with pytest.raises(ValueError, match="calibration.json is a file of the run"):
        run_sts("tiny-bert", data, layers=[0], device="cpu", out=a_run / "calibration.json")
    (tmp_path / "mine.json").write_text('{"kind": "mine"}')
    with pytest.raises(ValueError, match="mine.json exists and lmgeom did not write it.*`overwrite=True`"):
        run_sts("tiny-bert", data, layers=[0], device="cpu", out=tmp_path / "mine.json")
    assert json.loads((tmp_path / "mine.json").read_text()) == {"kind": "mine"}
    # another lmgeom result is never replaced; a user's table beside new results or markdown file only with `overwrite`
    with pytest.raises(ValueError, match="holds results of kind 'contextuality', not STS results"):
        run_sts("tiny-bert", data, layers=[0], device="cpu", out=shutil.copy(a_run / "contextuality.json", tmp_path / "c.json"), overwrite=True)
    (tmp_path / "new.csv").write_text("mine")
    (tmp_path / "table.md").write_text("mine")
    with pytest.raises(ValueError, match="new.csv exists and lmgeom did not write it"):
        run_sts("tiny-bert", data, layers=[0], device="cpu", out=tmp_path / "new.json")
    with pytest.raises(ValueError, match="`markdown` .*table.md exists and lmgeom did not write it"):
        run_sts("tiny-bert", data, layers=[0], device="cpu", markdown=tmp_path / "table.md")
    assert (tmp_path / "new.csv").read_text() == (tmp_path / "table.md").read_text() == "mine"
    run_sts("tiny-bert", data, layers=[0], device="cpu", out=tmp_path / "mine.json", markdown=tmp_path / "table.md", overwrite=True)
    assert json.loads((tmp_path / "mine.json").read_text())["kind"] == "sts"
    run_sts("tiny-bert", data, layers=[0], device="cpu", markdown=tmp_path / "table.md")  # lmgeom's own table now
    assert rundir.written_by_lmgeom(tmp_path / "table.md")


def test_what_lmgeom_wrote_is_told_by_kind_mark_or_place_and_nothing_else_is_overwritten(tiny_run: Any, tmp_path: Path):
    run_dir = tiny_run.store.path
    assert rundir.written_by_lmgeom(rundir.CONTEXTUALITY.at(run_dir))  # a result document: its kind
    assert rundir.written_by_lmgeom(rundir.REPORT.at(run_dir))  # a page: its generator mark
    assert rundir.written_by_lmgeom(rundir.STATIC_TEXT.at(run_dir, layer=3))  # word2vec text in its place in a run
    copies = {name: shutil.copy(source, tmp_path / name) for name, source in (
        ("c.json", rundir.CONTEXTUALITY.at(run_dir)), ("r.html", rundir.REPORT.at(run_dir)),
        ("v.txt", rundir.STATIC_TEXT.at(run_dir, layer=3)))}
    assert rundir.written_by_lmgeom(copies["c.json"]) and rundir.written_by_lmgeom(copies["r.html"])
    assert not rundir.written_by_lmgeom(copies["v.txt"])  # the same text elsewhere bears no mark
    for text in ('{"kind": "mine"}', '{"records": [], "kind": "sts"}', "<html>thesis</html>", "\\section{x}"):
        (tmp_path / "mine").write_text(text)
        assert not rundir.written_by_lmgeom(tmp_path / "mine")
        with pytest.raises(InputError, match="exists and lmgeom did not write it") as raised:
            rundir.claim_file(tmp_path / "mine", overwrite=False)
        assert raised.value.params == ("out", "overwrite")
        rundir.claim_file(tmp_path / "mine", overwrite=True)
    with pytest.raises(InputError, match="is a folder"):
        rundir.claim_file(tmp_path, overwrite=True)
    rundir.claim_file(tmp_path / "absent.txt", overwrite=False)
    # on an object store alike
    url = "memory://lmgeom-tests/claim"
    rundir.write_text(f"{url}/meta.json", "{}")
    rundir.write_text(f"{url}/report.html", "<html>mine</html>")
    rundir.write_text(f"{url}/notes.html", "<html>mine</html>")
    assert rundir.written_by_lmgeom(f"{url}/report.html") and not rundir.written_by_lmgeom(f"{url}/notes.html")
