"""Controls (`lmgeom.controlspec`): random-init weights and shuffled words, recorded in the store and every
result, and drawn beside the model's lines in the report."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from lmgeom.corpus import load_corpus
from lmgeom.errors import InputError

# the runs' bootstrap is kept small (20 resamples): its intervals are rough, as the warning says
pytestmark = pytest.mark.filterwarnings("ignore:rough intervals")

HASH_SCRIPT = ("from lmgeom.encoders.registry import load_encoder; from lmgeom.encoders.hf import hash_state_dict; "
               "print(hash_state_dict(load_encoder('tiny-llama', device='cpu', random_init=7).model))")


def _hash(name: str, **keywords: Any) -> str:
    from lmgeom.encoders.hf import hash_state_dict
    from lmgeom.encoders.registry import load_encoder

    return hash_state_dict(load_encoder(name, device="cpu", **keywords).model)


@pytest.mark.parametrize("name", ["tiny-bert", "tiny-gpt2", "tiny-llama"])
def test_random_init_weights_differ_from_the_loaded_ones_and_by_seed(name: str) -> None:
    import torch

    from lmgeom.encoders.registry import load_encoder

    loaded = load_encoder(name, device="cpu")
    random = load_encoder(name, device="cpu", random_init=0)
    assert random.random_init_seed == 0 and loaded.random_init_seed is None
    assert type(random.model) is type(loaded.model) and random.model.config.to_dict() == loaded.model.config.to_dict()
    random_state = random.model.state_dict()
    # every parameter the loaded model has is drawn again: the embeddings and every weight matrix differ
    for key, tensor in loaded.model.state_dict().items():
        if tensor.ndim == 2:
            assert not torch.equal(tensor, random_state[key]), key
    assert random.tokenizer is loaded.tokenizer  # the tokenizer is kept
    assert random.model_fingerprint != loaded.model_fingerprint
    assert random.model_fingerprint.split()[1:] == loaded.model_fingerprint.split()[1:]  # same tokenizer and config
    assert _hash(name, random_init=0) == random.model_fingerprint.split()[0].removeprefix("weights:")
    assert _hash(name, random_init=1) != _hash(name, random_init=0)


def test_random_init_weights_are_the_same_in_a_new_process() -> None:
    outcome = subprocess.run([sys.executable, "-c", HASH_SCRIPT], capture_output=True, text=True, check=True)
    assert outcome.stdout.strip() == _hash("tiny-llama", random_init=7)


def test_random_init_leaves_the_callers_random_generator_alone() -> None:
    import torch

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    _hash("tiny-bert", random_init=3)
    assert torch.equal(torch.rand(3), expected)


def test_shuffled_corpus_keeps_each_sentences_words_and_changes_their_order_by_seed() -> None:
    corpus = load_corpus("lee", limit=40)
    first, again, other = corpus.shuffle_words(0), corpus.shuffle_words(0), corpus.shuffle_words(1)
    assert first.name == f"{corpus.name}[words shuffled, seed 0]" and first.pretokenized
    assert len(first) == len(corpus)
    for original, shuffled in zip(corpus.sentences, first.sentences):
        words = [w.text for w in shuffled.words]
        assert Counter(words) == Counter(w.text for w in original.words)
        assert shuffled.text == " ".join(words)  # the store's tokens are the shuffled words
        assert all(shuffled.text[w.start:w.end] == w.text for w in shuffled.words)
    orders = [[w.text for w in s.words] for s in first.sentences]
    assert orders == [[w.text for w in s.words] for s in again.sentences]
    changed = sum(order != [w.text for w in s.words] for order, s in zip(orders, corpus.sentences))
    assert changed >= 38  # 40 sentences of many words: nearly all change order
    assert orders != [[w.text for w in s.words] for s in other.sentences]
    assert first.fingerprint != corpus.fingerprint != other.fingerprint
    # a sentence's shuffle depends on the seed and its position only, not on the sentences after it
    assert [s.text for s in load_corpus("lee", limit=10).shuffle_words(0).sentences] == [s.text for s in first.sentences[:10]]
    with pytest.raises(InputError, match="control_seed"):
        corpus.shuffle_words(-1)


def test_unknown_control_and_bad_seed_are_refused_naming_the_parameter() -> None:
    from lmgeom.stages.extraction_options import ExtractionOptions

    with pytest.raises(InputError, match="unknown `control` 'random'; choose one of random-init, shuffled") as error:
        ExtractionOptions(control="random")
    assert error.value.params == ("control",)
    with pytest.raises(InputError, match="control_seed"):
        ExtractionOptions(control="shuffled", control_seed=-2)
    with pytest.raises(InputError, match="control"):
        from lmgeom.pipeline import run

        run("tiny-bert", "lee", control="permuted", out="unused")


@pytest.mark.parametrize("control", ["random-init", "shuffled"])
def test_a_control_store_records_its_control(control: str, tmp_path: Path) -> None:
    from lmgeom.stages import extract_model
    from lmgeom.stages.extraction_options import ExtractionOptions

    model = extract_model("tiny-gpt2", "lee", out=tmp_path / "model", limit=12, device="cpu")
    store = extract_model("tiny-gpt2", "lee", out=tmp_path / control, limit=12, device="cpu", control=control, control_seed=5)
    meta = store.meta
    assert meta["control"] == {"name": control, "seed": 5, "what": pytest.approx(meta["control"]["what"])}
    assert "random" in meta["control"]["what"] or "shuffled" in meta["control"]["what"]
    assert "control" not in model.meta
    assert ExtractionOptions.from_settings(meta).control == control
    assert ExtractionOptions.from_settings(meta).control_seed == 5
    if control == "random-init":  # the model's fingerprint differs; the corpus is the model's
        assert meta["model_fingerprint"] != model.meta["model_fingerprint"]
        assert meta["corpus_fingerprint"] == model.meta["corpus_fingerprint"]
        assert store.n_tokens == model.n_tokens
        assert not (store.layer(2)[:] == model.layer(2)[:]).all()
    else:  # the same model on other sentences: the same words, as many tokens
        assert meta["model_fingerprint"] == model.meta["model_fingerprint"]
        assert meta["corpus_fingerprint"] != model.meta["corpus_fingerprint"]
        assert meta["corpus_name"].endswith("[words shuffled, seed 5]")
        assert Counter(store.tokens["word"]) == Counter(model.tokens["word"])
    # the same call resumes (finds it done); the model's folder refuses the control without --overwrite
    assert extract_model("tiny-gpt2", "lee", out=tmp_path / control, limit=12, device="cpu", control=control,
                         control_seed=5).meta["generation"] == meta["generation"]
    with pytest.raises(InputError):
        extract_model("tiny-gpt2", "lee", out=tmp_path / "model", limit=12, device="cpu", control=control, control_seed=5)


def test_extract_refuses_an_encoder_whose_weights_do_not_match_the_control(tmp_path: Path) -> None:
    from lmgeom.encoders.registry import load_encoder
    from lmgeom.stages import extract

    corpus = load_corpus("lee", limit=4)
    with pytest.raises(InputError, match="random_init=2"):
        extract(load_encoder("tiny-bert", device="cpu"), corpus, tmp_path / "a", control="random-init", control_seed=2)
    with pytest.raises(InputError, match="random weights \\(seed 1\\)"):
        extract(load_encoder("tiny-bert", device="cpu", random_init=1), corpus, tmp_path / "b")
    with pytest.raises(InputError, match="ELMo"):
        load_encoder("elmo-brown", device="cpu", random_init=0)


def test_the_cli_extract_takes_the_control_and_names_it(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from lmgeom.cli.main import app

    out = tmp_path / "store"
    outcome = CliRunner().invoke(app, ["extract", "tiny-bert", "--limit", "6", "--device", "cpu", "--out", str(out),
                                       "--control", "random-init", "--control-seed", "4"], env={"COLUMNS": "200"})
    assert outcome.exit_code == 0, outcome.output
    assert "control: random-init (seed 4)" in " ".join(outcome.output.split())
    assert json.loads((out / "meta.json").read_text())["control"]["seed"] == 4
    refused = CliRunner().invoke(app, ["extract", "tiny-bert", "--limit", "6", "--out", str(tmp_path / "x"),
                                       "--control", "noise"])
    assert refused.exit_code == 2 and "--control" in refused.output


@pytest.fixture(scope="module")
def control_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The tiny-bert run of the session's options on 40 Lee sentences, and its two controls."""
    from lmgeom.pipeline import run

    root = tmp_path_factory.mktemp("controls")
    options: dict[str, Any] = {"limit": 40, "device": "cpu", "min_contexts": 3, "layers": "0,3", "num_workers": 1,
                               "bootstrap": 20, "permutations": 0, "methods": ("whitening",)}
    model = run("tiny-bert", "lee", out=root / "model", **options)
    random = run("tiny-bert", "lee", out=root / "random", control="random-init", control_seed=3, **options)
    shuffled = run("tiny-bert", "lee", out=root / "shuffled", control="shuffled", control_seed=3, **options)
    assert model.store.meta.get("control") is None
    return model.store.path, random.store.path, shuffled.store.path


def test_every_result_of_a_control_run_says_so(control_runs: tuple[Path, Path, Path]) -> None:
    model, random, shuffled = control_runs
    for name in ("contextuality.json", "isotropy.json", "summary.json", "calibration.json", "geometry.json", "run.json"):
        assert json.loads((random / name).read_text())["control"]["name"] == "random-init", name
        assert json.loads((shuffled / name).read_text())["control"]["name"] == "shuffled", name
        assert "control" not in json.loads((model / name).read_text()), name
    # geometry screens no norm weights for random-init: the named model's are not the store's
    layernorm = json.loads((random / "geometry.json").read_text())["layernorm_weights"]
    assert layernorm["computed"] is False and "random-init control" in layernorm["note"]
    assert json.loads((model / "geometry.json").read_text())["layernorm_weights"]["computed"] is True
    page = (random / "report.html").read_text()
    assert "control: random-init (seed 3)" in page
    assert "control: random-init" not in (model / "report.html").read_text()


def test_the_report_with_a_control_draws_its_lines_beside_the_models(control_runs: tuple[Path, Path, Path]) -> None:
    from lmgeom.report import load_run
    from lmgeom.report.figures import plotly_figure, run_charts

    model, random, _ = control_runs
    run, control = load_run(model), load_run(random)
    plain = {chart.name: chart for chart in run_charts(run)}
    charts = {chart.name: chart for chart in run_charts(run, control)}
    for name in ("anisotropy", "self_similarity", "intra_sentence_similarity", "mev", "isotropy_isoscore"):
        chart, before = charts[name], plain[name]
        own = len(before.series)
        assert len(chart.series) == 2 * own, name
        for index, series in enumerate(chart.series[own:]):
            assert series.shadows == index and series.name == f"{before.series[index].name}, control: random-init (seed 3)"
            assert series.band is None
        theirs = {c.name: c for c in run_charts(control)}[name]
        assert [s.y for s in chart.series[own:]] == [s.y for s in theirs.series]  # the control's own values
        figure = plotly_figure(chart)
        traces = [trace for trace in figure["data"] if trace.get("showlegend") is not False]
        for index in range(own):
            model_trace, control_trace = traces[index], traces[own + index]
            assert control_trace["line"]["color"] == model_trace["line"]["color"]
            assert control_trace["line"]["dash"] == ("dot" if model_trace["line"]["dash"] == "dash" else "dash")
    # the control's numbers are its own, not the model's
    self_sim = charts["self_similarity"]
    assert self_sim.series[0].y != self_sim.series[len(plain["self_similarity"].series)].y
    # calibration charts take no control lines
    assert all(len(charts[name].series) == len(plain[name].series) for name in charts if name.startswith("calibration_"))


def test_report_and_compare_with_a_control_from_the_cli(control_runs: tuple[Path, Path, Path], tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from lmgeom.cli.main import app
    from lmgeom.report.compare import comparison_charts, comparison_table
    from lmgeom.report import load_run

    model, random, shuffled = control_runs
    out = tmp_path / "report.html"
    outcome = CliRunner().invoke(app, ["report", str(model), "--control", str(random), "--out", str(out)])
    assert outcome.exit_code == 0, outcome.output
    page = out.read_text()
    assert "control run shown beside it" in page and "control: random-init (seed 3)" in page
    refused = CliRunner().invoke(app, ["report", str(model), "--control", str(model), "--out", str(tmp_path / "r.html")])
    assert refused.exit_code == 2 and "--control" in refused.output and "not a control run" in refused.output
    swapped = CliRunner().invoke(app, ["report", str(random), "--control", str(shuffled), "--out", str(tmp_path / "s.html")])
    assert swapped.exit_code == 2 and "itself a control run" in swapped.output

    runs = [load_run(path) for path in (random, model, shuffled)]
    labels = [run.label for run in runs]
    charts = {chart.name: chart for chart in comparison_charts(comparison_table(runs), dict(zip(labels, runs)))}
    series = charts["self_similarity_by_layer"].series
    assert [s.name for s in series] == labels
    assert series[0].shadows == 1 and series[1].shadows is None and series[2].shadows == 1
    compared = CliRunner().invoke(app, ["compare", str(model), str(random), "--out", str(tmp_path / "compare")])
    assert compared.exit_code == 0, compared.output
    assert "is drawn beside" in (tmp_path / "compare" / "compare.html").read_text()
