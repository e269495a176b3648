"""Bad numbers and devices on the command line: exit 2 with one message naming the option, no traceback."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from lmgeom.cli.main import app


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


@pytest.mark.parametrize("args, option", [
    (["extract", "tiny-bert", "--out", "OUT", "--chunk-sentences", "0"], "--chunk-sentences"),
    (["extract", "tiny-bert", "--out", "OUT", "--chunk-sentences", "-4"], "--chunk-sentences"),
    (["extract", "tiny-bert", "--out", "OUT", "--max-batch-tokens", "0"], "--max-batch-tokens"),
    (["extract", "tiny-bert", "--out", "OUT", "--seed", "-1"], "--seed"),
    (["run", "--num-workers", "0"], "--num-workers"),
    (["run", "--min-contexts", "0"], "--min-contexts"),
    (["analyze", "STORE", "--samples", "0"], "--samples"),
    (["analyze", "STORE", "--samples", "-5"], "--samples"),
    (["analyze", "STORE", "--seed", "-1"], "--seed"),
    (["analyze", "STORE", "--mev-memory-mb", "-1"], "--mev-memory-mb"),
    (["calibrate", "STORE", "--eval-rows", "1"], "--eval-rows"),
    (["elmo", "train", "--out", "OUT", "--checkpoint-every", "0"], "--checkpoint-every"),
    (["elmo", "train", "--out", "OUT", "--max-steps", "0"], "--max-steps"),
    (["elmo", "train", "--out", "OUT", "--dropout", "1"], "--dropout"),
    (["experiment", "layers", "--model", "tiny-bert", "--task", "pos", "--data", "D", "--out", "O", "--max-train", "0"],
     "--max-train"),
    (["sts", "tiny-bert", "--limit-pairs", "0"], "--limit-pairs"),
])
def test_numbers_out_of_range_name_the_option(tmp_path, args, option):
    args = [str(tmp_path / a) if a in ("OUT", "STORE", "D", "O") else a for a in args]
    code, output = invoke(*args)
    assert code == 2, output
    assert option in output and "Traceback" not in output
    assert not any(tmp_path.iterdir())  # refused before anything was written


def test_neighbours_must_be_fewer_than_the_explorer_words(tmp_path):
    code, output = invoke("report", str(tmp_path), "--neighbours", "100000")
    assert code == 2 and "--neighbours" in output and "--explorer-words (2000)" in output


def test_unknown_device_and_a_window_beyond_the_model(tmp_path):
    code, output = invoke("extract", "tiny-bert", "--corpus", "lee", "--limit", "5", "--out", str(tmp_path / "a"),
                          "--device", "tpu")
    assert code == 2 and "unknown --device 'tpu'" in output and "Traceback" not in output
    code, output = invoke("extract", "tiny-bert", "--corpus", "lee", "--limit", "5", "--out", str(tmp_path / "b"),
                          "--max-length", "100000")
    assert code == 2 and "--max-length 100000 is outside 2..64" in output
