"""`lmgeom --version`, `lmgeom models`, and model and corpus names checked before anything loads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lmgeom._version import __version__
from lmgeom.cli.main import app
from lmgeom.corpus.builtin import check_corpus_spec
from lmgeom.encoders.named import NAMED_MODELS, check_model_name, is_installed


def test_version_and_the_list_of_named_models() -> None:
    outcome = CliRunner().invoke(app, ["--version"])
    assert outcome.exit_code == 0 and outcome.output.strip() == f"lmgeom {__version__}"
    listing = CliRunner().invoke(app, ["models"], env={"COLUMNS": "80"})
    assert listing.exit_code == 0, listing.output
    for name in NAMED_MODELS:
        assert name in listing.output
    assert is_installed("tiny-bert") and is_installed("elmo-brown") and not is_installed("nope")


def test_a_name_close_to_a_named_model_is_refused_with_the_name_it_is_close_to(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="did you mean 'minilm'"):
        check_model_name("minlm")
    with pytest.raises(ValueError, match="did you mean 'smollm2'"):
        check_model_name("smolm2")
    # a Hub id (with or without an owner), a folder that exists, a named model: passed on
    for name in ("gpt2", "bert-base-uncased", "someone/minlm", "minilm"):
        assert check_model_name(name) == name
    (tmp_path / "minlm").mkdir()
    assert check_model_name(str(tmp_path / "minlm")) == str(tmp_path / "minlm")
    with pytest.raises(FileNotFoundError, match=r"did you mean 'lee'\?"):
        check_corpus_spec("leee")
    with pytest.raises(FileNotFoundError, match="neither a built-in corpus") as refused:
        check_corpus_spec("wikipedia.txt")
    assert "did you mean" not in str(refused.value)
    assert check_corpus_spec("brown") == "brown" and check_corpus_spec("hf:wikitext:test:text") == "hf:wikitext:test:text"


@pytest.mark.parametrize("arguments", [["extract", "minlm", "--out", "OUT"], ["run", "--model", "minilm", "--corpus", "leee"]])
def test_a_typo_is_refused_before_torch_loads(arguments: list[str], tmp_path: Path) -> None:
    """In a fresh interpreter: exit 2 naming the close name, and torch never imported."""
    arguments = [str(tmp_path / "out") if item == "OUT" else item for item in arguments]
    script = ("import sys\nfrom lmgeom.cli.main import app\n"
              "try:\n    app(sys.argv[1:])\nexcept SystemExit as end:\n"
              "    print('torch loaded' if 'torch' in sys.modules else 'torch not loaded')\n    raise\n")
    completed = subprocess.run([sys.executable, "-c", script, *arguments, "--out", str(tmp_path / "run")]
                               if arguments[0] == "run" else [sys.executable, "-c", script, *arguments],
                               capture_output=True, text=True, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert completed.returncode == 2, completed.stdout + completed.stderr
    assert "did you mean" in completed.stdout + completed.stderr
    assert "torch not loaded" in completed.stdout


def test_results_go_to_stdout_and_progress_and_errors_to_stderr(tmp_path: Path) -> None:
    """A command's standard output holds its results only: redirected, it gets no progress line."""
    import json

    import numpy as np

    from lmgeom.store import write_store_from_arrays

    data = Path(__file__).parent / "data"
    arrays = np.load(data / "fixed_store.npz")
    words = json.loads((data / "fixed_store_words.json").read_text())
    store = write_store_from_arrays(tmp_path / "store", [arrays[f"layer{layer}"] for layer in range(len(arrays.files))],
                                    words["sentences"], is_special=words["is_special"], model_id="fixed")
    outcome = CliRunner().invoke(app, ["analyze", str(store.path), "--min-contexts", "2", "--bootstrap", "0"],
                                 env={"COLUMNS": "100"})
    assert outcome.exit_code == 0, outcome.output
    assert "analyze layers: started" in outcome.stderr and "analyze layers" not in outcome.stdout
    assert "SelfSim" in outcome.stdout and "wrote " in outcome.stdout
    refused = CliRunner().invoke(app, ["analyze", str(store.path), "--min-contexts", "0"], env={"COLUMNS": "100"})
    assert refused.exit_code == 2 and refused.stdout == ""
    bad = CliRunner().invoke(app, ["analyze", str(store.path), "--statistics", "nope", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and bad.stdout == "" and bad.stderr.startswith("error: unknown statistic 'nope'")


def test_the_package_lists_its_public_names_and_a_store_counts_layers_from_the_end(tmp_path: Path) -> None:
    import numpy as np

    import lmgeom
    from lmgeom.store import write_store_from_arrays

    assert dir(lmgeom) == sorted(lmgeom.__all__) and "annotations" not in dir(lmgeom) and "run" in dir(lmgeom)
    layers = [np.full((3, 4), layer, dtype=np.float32) for layer in range(3)]
    store = write_store_from_arrays(tmp_path / "s", layers, [["a", "b", "c"]], model_id="arrays")
    np.testing.assert_array_equal(store.layer(-1)[:], layers[2])
    np.testing.assert_array_equal(store.layer(-3)[:], layers[0])
    with pytest.raises(IndexError, match="out of range"):
        store.layer(-4)
    # an analysis and the static vectors of layer -1 are those of the last layer, recorded as it
    from lmgeom.engine import AnalysisOptions, run_analysis

    words = [["the", "bank", "the", "bank", "river"], ["the", "bank", "rates", "the", "river"]]
    rng = np.random.default_rng(0)
    store = write_store_from_arrays(tmp_path / "t", [rng.normal(size=(10, 4)) for _ in range(3)], words, model_id="arrays")
    last, minus_one = (run_analysis(store, AnalysisOptions(layers=layers, min_contexts=2, bootstrap=0)) for layers in ((2,), (-1,)))
    assert list(minus_one.layers) == [2] and minus_one.plan.layers == (2,)
    np.testing.assert_array_equal(minus_one.layers[2]["anisotropy_exact"], last.layers[2]["anisotropy_exact"])


@pytest.mark.parametrize("option, value, named", [("methods", ("whitenin",), "whitenin"), ("min_coverage", "abc", "min_coverage"),
                                                  ("layers", "0,lats", "layers"), ("include", ("no-such-folder",), "include")])
def test_run_refuses_a_later_steps_option_before_the_extraction(option: str, value: object, named: str, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import lmgeom.pipeline.job as job

    def no_extraction(*args: object, **kwargs: object) -> None:
        raise AssertionError("the extraction started")

    monkeypatch.setattr(job, "extract_model", no_extraction)
    with pytest.raises(ValueError, match=named):
        job.run("tiny-bert", "lee", out=tmp_path / "run", **{option: value})
