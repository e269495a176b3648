"""Every result bound to the store and the settings that made it, on real tiny runs: what each result
records, and a result without provenance treated as stale. The steps `run` redoes when its settings
change, and the refusals of stale, foreign and cut-short results by `report`, `compare` and `run`, are
trust cases 1-7 of scripts/trust_cases.py (tests/test_trust_cases.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import TINY_RUN
from lmgeom.cli.main import app
from lmgeom import rundir
from lmgeom.pipeline import run
from lmgeom.rundir import PROVENANCE


def invoke(*args: str) -> tuple[int, str]:
    outcome = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    return outcome.exit_code, " ".join(outcome.output.split())


@pytest.fixture
def copy(tiny_cli_run: tuple[Path, str], tmp_path: Path) -> Path:
    """A copy of the session's tiny-bert run (60 Lee sentences, min_contexts 3, layers 0 and 3)."""
    return Path(shutil.copytree(tiny_cli_run[0], tmp_path / "run"))


def provenance_of(path: Path) -> dict:
    return json.loads(path.read_text())[PROVENANCE]


def test_every_result_records_the_store_settings_and_companions(copy: Path):
    generation = json.loads((copy / "meta.json").read_text())["generation"]
    steps = json.loads((copy / "run.json").read_text())["steps"]
    for name, step in (("contextuality.json", "contextuality"), ("summary.json", "contextuality"),
                       ("isotropy.json", "isotropy"), ("geometry.json", "geometry"), ("similarity.json", "similarity"),
                       ("static/3.benchmarks.json", "static_embeddings")):
        block = provenance_of(copy / name)
        assert block["store_generation"] == generation, name
        assert block["settings"] == steps[step].get("file_settings", steps[step]["settings"]), name
    block = provenance_of(copy / "contextuality.json")
    assert block["settings"]["min_contexts"] == TINY_RUN["min_contexts"]
    assert set(block["companions"]) == {"contextuality_layers.csv", "contextuality_words.csv"}
    for name, recorded in block["companions"].items():
        assert recorded == rundir.digest((copy / name).read_bytes())
    # the static step's settings are the analysis', min_contexts included (not only its layers)
    assert provenance_of(copy / "static/0.benchmarks.json")["settings"]["min_contexts"] == TINY_RUN["min_contexts"]
    assert provenance_of(copy / "geometry.json")["settings"]["count_by"] == "sentences"


def test_a_result_without_provenance_is_stale(copy: Path, tmp_path: Path):
    document = json.loads((copy / "isotropy.json").read_text())
    del document[PROVENANCE]
    (copy / "isotropy.json").write_text(json.dumps(document))
    code, output = invoke("report", str(copy), "--out", str(tmp_path / "r.html"))
    assert code == 2 and "isotropy.json records no provenance" in output, output
    assert "isotropy" in run("tiny-bert", "lee", out=copy, **TINY_RUN).steps_run
