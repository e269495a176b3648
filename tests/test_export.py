"""`lmgeom export sentence-transformers`: a fitted calibrator saved inside a sentence-transformers
model, loaded by sentence-transformers in a fresh process, gives lmgeom's own transform of the
model's pooled vectors (then normalised where the model has a Normalize module)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

pytest.importorskip("sentence_transformers")

from sentence_transformers import SentenceTransformer  # noqa: E402
from sentence_transformers.sentence_transformer.modules import Pooling, Transformer  # noqa: E402

from lmgeom.calibrate import METHODS, Whitening, make_calibrator  # noqa: E402
from lmgeom.cli.main import app  # noqa: E402
from lmgeom.corpus import Corpus, load_corpus  # noqa: E402
from lmgeom.encoders.registry import minilm_path  # noqa: E402
from lmgeom.encoders.tiny import tiny_model  # noqa: E402
from lmgeom.stages.export import EXPORT_RECORD, export_sentence_transformer  # noqa: E402
from lmgeom.stages.st_calibration import CalibrationModule, flatten_state, unflatten_state  # noqa: E402

SRC = Path(__file__).resolve().parents[1] / "src"
BATCH = 16
runner = CliRunner()

# The shortest Lee sentences (quick to encode): some to fit on, others (never fitted on) to encode.
LEE = sorted((sentence.text for sentence in load_corpus("lee")), key=len)
MINILM_FIT, MINILM_EVAL = LEE[:40:2], LEE[1:40:2]  # interleaved, so both cover the same lengths
TINY_FIT, TINY_EVAL = LEE[200:320], LEE[320:352]

# A fresh interpreter loads each exported folder with plain sentence-transformers and encodes texts.
_ENCODE_IN_NEW_PROCESS = """
    import json, sys
    import numpy as np
    from sentence_transformers import SentenceTransformer
    jobs = json.loads(sys.argv[1])
    arrays, modules = {}, {}
    for name, job in jobs.items():
        model = SentenceTransformer(job["path"], device="cpu", trust_remote_code=True)
        arrays[name] = model.encode(job["texts"], batch_size=job["batch_size"], convert_to_numpy=True)
        modules[name] = [type(module).__name__ for module in model]
    np.savez(sys.argv[2], **arrays)
    print(json.dumps(modules))
"""


def encode_in_new_process(jobs: dict[str, dict], out: Path) -> tuple[dict[str, np.ndarray], dict[str, list[str]]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(_ENCODE_IN_NEW_PROCESS), json.dumps(jobs), str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    with np.load(out) as arrays:
        return {name: arrays[name] for name in arrays.files}, json.loads(done.stdout.strip().splitlines()[-1])


def pooled_by_sentence_transformers(model: SentenceTransformer, texts: list[str]) -> np.ndarray:
    """The reference side: sentence-transformers' own Transformer + Pooling output, in the batches encode makes."""
    upto_pooling = SentenceTransformer(modules=[model[0], model[1]], device="cpu")
    assert isinstance(model[1], Pooling)
    return upto_pooling.encode(texts, batch_size=BATCH, convert_to_numpy=True)


def unit_rows(X: np.ndarray) -> np.ndarray:
    return X / np.linalg.norm(X, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def tiny_st(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sentence-transformers folder without Normalize: lmgeom's seeded random tiny BERT + max pooling
    (BERT's last LayerNorm centres every token vector, so a mean of them would span only 31 of the
    32 directions; the max spans all)."""
    root = tmp_path_factory.mktemp("tiny-st")
    model, tokenizer = tiny_model("tiny-bert")
    model.save_pretrained(root / "hf")
    tokenizer.save_pretrained(root / "hf")
    transformer = Transformer(str(root / "hf"), max_seq_length=64)
    SentenceTransformer(modules=[transformer, Pooling(transformer.get_embedding_dimension(), "max")], device="cpu").save(str(root / "st"))
    return root


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, tiny_st: Path) -> dict:
    """MiniLM + whitening (with Normalize), tiny + whitening and tiny + flow (without), all encoded
    by one fresh process."""
    root = tmp_path_factory.mktemp("exports")
    fit_file = root / "minilm-fit.txt"
    fit_file.write_text("\n".join(MINILM_FIT) + "\n", encoding="utf-8")
    results = {
        "minilm-white": export_sentence_transformer("minilm", method="whitening", fit_on=str(fit_file), out=root / "minilm-white",
                                                    device="cpu", batch_size=BATCH),
        "tiny-white": export_sentence_transformer(str(tiny_st / "st"), method="whitening", fit_on=Corpus.from_list(TINY_FIT),
                                                  out=root / "tiny-white", device="cpu", batch_size=BATCH),
        "tiny-flow": export_sentence_transformer(str(tiny_st / "st"), method="flow", fit_on=Corpus.from_list(TINY_FIT),
                                                 out=root / "tiny-flow", device="cpu", batch_size=BATCH, seed=3),
    }
    jobs = {
        "minilm-white": {"path": str(root / "minilm-white"), "texts": MINILM_EVAL, "batch_size": BATCH},
        "tiny-white": {"path": str(root / "tiny-white"), "texts": TINY_EVAL, "batch_size": BATCH},
        "tiny-white-fit": {"path": str(root / "tiny-white"), "texts": TINY_FIT, "batch_size": BATCH},
        "tiny-flow": {"path": str(root / "tiny-flow"), "texts": TINY_EVAL, "batch_size": BATCH},
    }
    encoded, modules = encode_in_new_process(jobs, root / "encoded.npz")
    return {"results": results, "encoded": encoded, "modules": modules, "root": root}


@pytest.mark.slow
@pytest.mark.processes
def test_minilm_export_encodes_as_lmgeom_transforms_the_pooled_vectors(exported: dict) -> None:
    result = exported["results"]["minilm-white"]
    assert exported["modules"]["minilm-white"] == ["Transformer", "Pooling", "CalibrationModule", "Normalize"]
    assert result.n_fit_sentences == len(MINILM_FIT)
    original = SentenceTransformer(str(minilm_path()), device="cpu")
    expected = unit_rows(result.calibrator.transform(pooled_by_sentence_transformers(original, MINILM_EVAL)))
    encoded = exported["encoded"]["minilm-white"]
    assert encoded.dtype == np.float32 and encoded.shape == (len(MINILM_EVAL), 384)
    np.testing.assert_allclose(encoded, expected, rtol=0, atol=1e-5)
    # what was fitted is the pooled output over the fit file: the same mean, and whitening's floor of the spectrum
    fit_pooled = pooled_by_sentence_transformers(original, MINILM_FIT).astype(np.float64)
    np.testing.assert_allclose(result.calibrator.mean_, fit_pooled.mean(axis=0), atol=1e-6)
    np.testing.assert_allclose(result.calibrator.explained_variance_[:10], np.linalg.eigvalsh(np.cov(fit_pooled.T))[::-1][:10], rtol=1e-4)
    record = json.loads((result.out / EXPORT_RECORD).read_text())
    assert record["fit_on"]["n_sentences"] == len(MINILM_FIT) and record["method"] == "whitening" and record["model_id"] == "minilm"
    assert record["corpus_fingerprint"] == load_corpus(str(exported["root"] / "minilm-fit.txt")).fingerprint
    assert record["isotropy_of_fit_vectors"]["after"]["isoscore"] > record["isotropy_of_fit_vectors"]["before"]["isoscore"]


@pytest.mark.slow
@pytest.mark.processes
def test_without_normalize_the_export_whitens_the_fit_corpus(exported: dict, tiny_st: Path) -> None:
    result = exported["results"]["tiny-white"]
    assert exported["modules"]["tiny-white"] == ["Transformer", "Pooling", "CalibrationModule"]
    original = SentenceTransformer(str(tiny_st / "st"), device="cpu")
    np.testing.assert_allclose(exported["encoded"]["tiny-white"],
                               result.calibrator.transform(pooled_by_sentence_transformers(original, TINY_EVAL)), rtol=0, atol=1e-5)
    # closed form: the fit sentences come out with zero mean and identity covariance
    whitened = exported["encoded"]["tiny-white-fit"].astype(np.float64)
    np.testing.assert_allclose(whitened.mean(axis=0), 0, atol=1e-4)
    np.testing.assert_allclose(np.cov(whitened.T), np.eye(32), atol=1e-3)
    # and a whitening fitted here on sentence-transformers' own pooled vectors agrees
    refit = Whitening().fit(pooled_by_sentence_transformers(original, TINY_FIT))
    np.testing.assert_allclose(exported["encoded"]["tiny-white"], refit.transform(pooled_by_sentence_transformers(original, TINY_EVAL)),
                               rtol=0, atol=1e-4)


@pytest.mark.slow
@pytest.mark.processes
def test_flow_calibrator_round_trips(exported: dict, tiny_st: Path) -> None:
    result = exported["results"]["tiny-flow"]
    original = SentenceTransformer(str(tiny_st / "st"), device="cpu")
    expected = result.calibrator.transform(pooled_by_sentence_transformers(original, TINY_EVAL))
    np.testing.assert_allclose(exported["encoded"]["tiny-flow"], expected, rtol=0, atol=1e-5)
    loaded = CalibrationModule.load(str(result.out), subfolder="2_CalibrationModule").calibrator
    assert loaded.get_params() == result.calibrator.get_params()
    for name, tensor in result.calibrator.module_.state_dict().items():
        assert torch.equal(loaded.module_.state_dict()[name], tensor), name
    assert not list((result.out / "2_CalibrationModule").glob("*.pt")) and not list((result.out / "2_CalibrationModule").glob("*.bin"))


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_registered_calibrator_saves_and_loads_exactly(method: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 16)) @ rng.standard_normal((16, 16)) + 3.0
    calibrator = make_calibrator(method, seed=1).fit(X)
    module = CalibrationModule(calibrator)
    module.save(str(tmp_path))
    loaded = CalibrationModule.load(str(tmp_path))
    assert type(loaded.calibrator) is type(calibrator) and loaded.get_embedding_dimension() == module.get_embedding_dimension() == 16
    out = loaded({"sentence_embedding": torch.tensor(X[:20], dtype=torch.float32)})["sentence_embedding"]
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    np.testing.assert_array_equal(out.numpy(), calibrator.transform(X[:20].astype(np.float32)))


def test_state_layout_restores_nesting_and_kinds() -> None:
    state = {"a_": np.arange(3.0), "n_": np.asarray(5), "flow_": {"w": torch.ones(2, dtype=torch.float32)}, "empty_": {}, "k": 7, "none_": None}
    layout, arrays = flatten_state(state)
    back = unflatten_state(json.loads(json.dumps(layout)), arrays)
    assert back["n_"].shape == () and int(back["n_"]) == 5 and back["k"] == 7 and back["none_"] is None and back["empty_"] == {}
    assert isinstance(back["flow_"]["w"], torch.Tensor) and torch.equal(back["flow_"]["w"], state["flow_"]["w"])
    np.testing.assert_array_equal(back["a_"], state["a_"])


# -- the command line and bad input ----------------------------------------------------------------


def test_cli_exports_and_refuses_to_overwrite(tiny_st: Path, tmp_path: Path) -> None:
    args = ["export", "sentence-transformers", str(tiny_st / "st"), "--method", "abtt", "--fit-on", "lee", "--limit", "50",
            "--out", str(tmp_path / "m"), "--device", "cpu"]
    outcome = runner.invoke(app, args)
    assert outcome.exit_code == 0, outcome.output
    assert "Transformer -> Pooling -> CalibrationModule" in " ".join(outcome.output.split())
    assert json.loads((tmp_path / "m" / "modules.json").read_text())[2]["type"] == "lmgeom.stages.st_calibration.CalibrationModule"
    again = runner.invoke(app, args)
    assert again.exit_code == 2 and "--overwrite" in again.output
    assert runner.invoke(app, [*args, "--overwrite"]).exit_code == 0


@pytest.mark.parametrize("model, message", [("tiny-bert", "not a sentence-transformers model"), ("no/such/folder", "neither minilm nor an existing folder")])
def test_cli_names_models_it_cannot_export(model: str, message: str, tmp_path: Path) -> None:
    outcome = runner.invoke(app, ["export", "sentence-transformers", model, "--method", "whitening", "--out", str(tmp_path / "m")])
    assert outcome.exit_code == 2 and message in " ".join(outcome.output.split())


def test_a_transformers_folder_is_not_a_sentence_transformers_model(tiny_st: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a sentence-transformers model"):
        export_sentence_transformer(str(tiny_st / "hf"), method="whitening", fit_on="lee", out=tmp_path / "m")


def test_a_model_without_pooling_is_refused(tiny_st: Path, tmp_path: Path) -> None:
    SentenceTransformer(modules=[Transformer(str(tiny_st / "hf"), max_seq_length=64)], device="cpu").save(str(tmp_path / "tokens"))
    with pytest.raises(ValueError, match="has 0 top-level Pooling modules"):
        export_sentence_transformer(str(tmp_path / "tokens"), method="whitening", fit_on="lee", limit=5, out=tmp_path / "m", device="cpu")
    assert not (tmp_path / "m").exists()


def test_unknown_method_is_named_before_anything_loads(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown calibration method 'pca'; choose from"):
        export_sentence_transformer("minilm", method="pca", fit_on="lee", out=tmp_path / "m")


def test_missing_sentence_transformers_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in [name for name in sys.modules if name == "sentence_transformers" or name.startswith("sentence_transformers.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, "lmgeom.stages.st_calibration")
    with pytest.raises(ImportError, match=r"pip install lmgeom\[st\]"):
        export_sentence_transformer("minilm", method="whitening", fit_on="lee", out=tmp_path / "m")
    outcome = runner.invoke(app, ["export", "sentence-transformers", "minilm", "--method", "whitening", "--out", str(tmp_path / "m")])
    assert outcome.exit_code == 2 and "pip install lmgeom[st]" in outcome.output
