"""The CUDA path against the CPU path, on tiny models and a small corpus: extraction, the analysis,
isotropy, calibration, similarity and geometry, fine-tuning and the biLM computed on a CUDA device and
compared with the same computation on the CPU.

Every test here needs a CUDA device and is skipped without one (CI has none): run it where one is
(`python -m pytest -m cuda`). `LMGEOM_TEST_DEVICE=cpu` runs the same comparisons with the CPU on both
sides, a dry run of the tests' own code."""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from lmgeom.corpus import Corpus
from lmgeom.elmo import TrainConfig, load_elmo, train
from lmgeom.engine import AnalysisOptions
from lmgeom.finetune import METHODS, FineTuneOptions, finetune, torch_calibration
from lmgeom.calibrate import make_calibrator
from lmgeom.mix import ScalarMix
from lmgeom.stages.analysis import analyze_store
from lmgeom.stages.calibration import CalibrationOptions, calibrate_store
from lmgeom.stages.extraction import extract_model
from lmgeom.stages.geometry import GeometryOptions, measure_geometry
from lmgeom.stages.isotropy import IsotropyOptions, measure_isotropy
from lmgeom.stages.similarity import SimilarityOptions, similarity_matrix, write_similarity

DEVICE = os.environ.get("LMGEOM_TEST_DEVICE", "cuda")
pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(DEVICE.startswith("cuda") and not torch.cuda.is_available(), reason="needs a CUDA device")]

WORDS = "the man dog cat runs eats red blue small big house car a sings bank river stone".split()
TEXTS = [f"The {WORDS[i % 17]} near the {WORDS[(3 * i + 1) % 17]} was seen on day {i}." for i in range(24)]
LABELS = np.arange(24) % 3


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = random.Random(0)
    sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 12))).capitalize() + "." for _ in range(80)]
    path = tmp_path_factory.mktemp("corpus") / "c.txt"
    path.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def store(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return extract_model("tiny-bert", str(corpus), out=tmp_path_factory.mktemp("store") / "s", device="cpu")


def differences(a: Any, b: Any, *, rtol: float, atol: float, where: str = "") -> list[str]:
    """Where two JSON documents differ: every number (within `rtol`, `atol`), list length and key set,
    recursively; strings are not compared (the device, paths and times are strings or keys named so)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{where}: keys {sorted(set(a) ^ set(b))}"]
        return [found for key in a if not any(word in key for word in ("second", "time", "device"))
                for found in differences(a[key], b[key], rtol=rtol, atol=atol, where=f"{where}/{key}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: lengths {len(a)} != {len(b)}"]
        return [found for i, (x, y) in enumerate(zip(a, b)) for found in differences(x, y, rtol=rtol, atol=atol, where=f"{where}[{i}]")]
    if isinstance(a, bool) or isinstance(b, bool):
        return [] if a == b else [f"{where}: {a} != {b}"]
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if math.isnan(a) and math.isnan(b):
            return []
        return [] if abs(a - b) <= atol + rtol * abs(b) else [f"{where}: {a!r} != {b!r}"]
    return [] if type(a) is type(b) or a is None or b is None else [f"{where}: {type(a).__name__} != {type(b).__name__}"]


def assert_same_documents(on_device: Path, on_cpu: Path, *, rtol: float, atol: float = 1e-12) -> None:
    found = differences(json.loads(on_device.read_text()), json.loads(on_cpu.read_text()), rtol=rtol, atol=atol)
    assert not found, f"{on_device.name}: {len(found)} numbers differ, e.g. {found[:5]}"


@pytest.mark.parametrize("model", ["tiny-bert", "tiny-gpt2", "tiny-llama"])
def test_extraction_on_the_device_equals_the_cpu(model: str, corpus: Path, tmp_path: Path):
    on_cpu = extract_model(model, str(corpus), out=tmp_path / "cpu", device="cpu")
    in_float32 = extract_model(model, str(corpus), out=tmp_path / "float32", device=DEVICE, compute_dtype="float32")
    default = extract_model(model, str(corpus), out=tmp_path / "default", device=DEVICE)
    assert in_float32.layers == default.layers == on_cpu.layers and in_float32.n_tokens == on_cpu.n_tokens
    expected_default = "float16" if DEVICE.startswith("cuda") else "float32"  # the CUDA default of these models
    assert default.meta["compute_dtype"] == expected_default and in_float32.meta["compute_dtype"] == "float32"
    for layer in on_cpu.layers:
        want = np.asarray(on_cpu.layer(layer)[:], dtype=np.float64)
        np.testing.assert_allclose(np.asarray(in_float32.layer(layer)[:]), want, rtol=1e-4, atol=1e-5, err_msg=f"layer {layer}")
        # float16 compute: each state within a few float16 rounding steps of its size
        scale = np.abs(want).max(axis=1, keepdims=True)
        assert np.all(np.abs(np.asarray(default.layer(layer)[:]) - want) <= 2e-2 * scale + 1e-3), f"layer {layer}"


def test_every_statistic_on_the_device_equals_the_cpu(store: Any, tmp_path: Path):
    analysis = {"min_contexts": 3, "n_samples": 200, "bootstrap": 50}
    on_cpu = analyze_store(store, AnalysisOptions(**analysis, device="cpu"), write_to=tmp_path / "cpu")
    on_device = analyze_store(store, AnalysisOptions(**analysis, device=DEVICE), write_to=tmp_path / "device")
    # the float64 accumulators: equal to rounding
    assert_same_documents(Path(on_device.written["json"]), Path(on_cpu.written["json"]), rtol=1e-9)
    for table in ("layers", "words"):
        want, got = getattr(on_cpu, table), getattr(on_device, table)
        assert list(got.columns) == list(want.columns) and len(got) == len(want)
        numeric = want.select_dtypes("number").columns
        np.testing.assert_allclose(got[numeric].to_numpy(np.float64), want[numeric].to_numpy(np.float64), rtol=1e-9,
                                   atol=1e-12, equal_nan=True, err_msg=table)

    measure_isotropy(store, IsotropyOptions(AnalysisOptions(device="cpu")), out=str(tmp_path / "cpu"))
    measure_isotropy(store, IsotropyOptions(AnalysisOptions(device=DEVICE)), out=str(tmp_path / "device"))
    assert_same_documents(tmp_path / "device" / "isotropy.json", tmp_path / "cpu" / "isotropy.json", rtol=1e-6, atol=1e-9)

    for folder, device in (("cpu", "cpu"), ("device", DEVICE)):
        result = similarity_matrix(store, None, SimilarityOptions(seed=0, device=device, permutations=20, num_workers=1))
        write_similarity(result, str(tmp_path / folder))
        geometry = GeometryOptions(AnalysisOptions(device=device, geometry_rows=300), n_boot=20)
        measure_geometry(store, geometry, out=tmp_path / folder)
    # the same permutations, nulls and p-values; neighbours and distances in float32 on either device
    assert_same_documents(tmp_path / "device" / "similarity.json", tmp_path / "cpu" / "similarity.json", rtol=1e-5, atol=1e-6)
    assert_same_documents(tmp_path / "device" / "geometry.json", tmp_path / "cpu" / "geometry.json", rtol=1e-4, atol=1e-6)


def test_calibrations_on_the_device_equal_the_cpu(store: Any):
    """The closed-form methods fit on the CPU whatever the device (the same records); the flow trains on
    the device with the device's own arithmetic, so its outcome is compared by what it claims: the
    same isotropy before, and IsoScore raised as far as on the CPU."""
    methods = ("abtt", "cie", "conceptor", "whitening", "standardize", "flow")
    on_cpu = calibrate_store(store, CalibrationOptions(methods=methods, layers=(0, 2), device="cpu"), save=False)
    on_device = calibrate_store(store, CalibrationOptions(methods=methods, layers=(0, 2), device=DEVICE), save=False)
    assert on_device.device.startswith(DEVICE)
    closed = [[r for r in records if r["method"] != "flow"] for records in (on_device.records, on_cpu.records)]
    found = differences(*closed, rtol=1e-9, atol=1e-12)
    assert not found, found[:5]
    flows = [{(r["layer"], r["measure"]): r for r in records if r["method"] == "flow"} for records in (on_device.records, on_cpu.records)]
    assert flows[0].keys() == flows[1].keys() and flows[0]
    for key, record in flows[0].items():
        assert record["before"] == pytest.approx(flows[1][key]["before"], rel=1e-9, abs=1e-12), key
        assert np.isfinite(record["after"]), key
    for layer in (0, 2):
        raised = [flow[(layer, "isoscore")] for flow in flows]
        assert raised[0]["after"] > raised[0]["before"] and raised[0]["after"] == pytest.approx(raised[1]["after"], abs=0.05)


@pytest.mark.parametrize("method", ["abtt", "cie", "conceptor", "whitening", "standardize", "flow"])
def test_the_calibration_layer_on_the_device_equals_the_cpu(method: str):
    rng = np.random.default_rng(0)
    X = (rng.normal(size=(300, 16)) @ rng.normal(size=(16, 16)) + 2.0).astype(np.float32)
    params = {"cie": {"n_clusters": 3, "n_components": 2}, "flow": {"n_epochs": 2, "hidden_size": 8, "device": "cpu"}}
    calibrator = make_calibrator(method).set_params(**params.get(method, {})).fit(X)
    on_cpu = torch_calibration(calibrator)
    on_device = torch_calibration(calibrator).to(DEVICE)
    inputs = torch.tensor(X[:50], requires_grad=True)
    on_device_inputs = inputs.detach().to(DEVICE).requires_grad_(True)
    want, got = on_cpu(inputs), on_device(on_device_inputs)
    np.testing.assert_allclose(got.detach().cpu().numpy(), want.detach().numpy(), rtol=1e-4, atol=1e-4)
    want.sum().backward()
    got.sum().backward()
    np.testing.assert_allclose(on_device_inputs.grad.cpu().numpy(), inputs.grad.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method", METHODS)
def test_finetuning_on_the_device_trains_and_repeats(method: str):
    """Training draws its dropout masks from the device's generator, so a CUDA run is not the CPU's
    run: before training the vectors agree; after it, the run is finite, has moved the encoder, and
    the same seed on the same device gives the same result."""
    params = {"cie": {"n_clusters": 3, "n_components": 2}, "flow": {"n_steps": 1, "hidden_size": 8, "n_epochs": 2}}.get(method, {})
    options = {"epochs": 2, "batch_size": 8, "learning_rate": 1e-3, "recalibrate_every": 2, "method_params": params}
    pairs = [(TEXTS[i], TEXTS[(i + 5) % 24]) for i in range(24)]

    def run(device: str) -> Any:
        return finetune("tiny-bert", train_inputs=pairs, train_labels=LABELS, eval_inputs={"dev": pairs[:6]}, n_outputs=3,
                        method=method, options=FineTuneOptions(**options, device=device))

    on_cpu, on_device, again = run("cpu"), run(DEVICE), run(DEVICE)
    np.testing.assert_allclose(on_device.sentence_vectors["before"]["dev"], on_cpu.sentence_vectors["before"]["dev"], atol=1e-5)
    after = on_device.sentence_vectors["after"]["dev"]
    assert np.isfinite(after).all() and not np.allclose(after, on_device.sentence_vectors["before"]["dev"], atol=1e-4)
    assert on_device.n_steps == on_cpu.n_steps == 6
    np.testing.assert_array_equal(again.predictions["dev"], on_device.predictions["dev"])
    np.testing.assert_allclose(again.sentence_vectors["after"]["dev"], after, rtol=0, atol=1e-6)


def test_the_bilm_trains_on_the_device_to_the_cpu_perplexity(tmp_path: Path):
    sentences = [["The", "bank", "raised", "rates", "."], ["We", "sat", "on", "the", "bank", "of", "the", "river", "."],
                 ["Rates", "fell"], ["Café", "naïve", "—", "ok"]]
    corpus = Corpus.from_list(sentences)
    config = TrainConfig(filters=((1, 8), (2, 8), (3, 16)), char_embedding_dim=8, n_highway=1, lstm_dim=32, projection_dim=16,
                         n_layers=2, vocab_size=40, dropout=0.0, epochs=60, batch_tokens=64, learning_rate=1e-2, seed=3)
    on_cpu = train(tmp_path / "cpu", corpus=(corpus, corpus), config=config, device="cpu")
    on_device = train(tmp_path / "device", corpus=(corpus, corpus), config=config, device=DEVICE)
    assert on_device.complete and on_device.perplexity.average < 2.0
    # no dropout: the same steps from the same initial weights, to float32 rounding of 60 epochs
    assert on_device.perplexity.average == pytest.approx(on_cpu.perplexity.average, rel=1e-3)
    # the trained weights embed alike on either device
    model = load_elmo(tmp_path / "device" / "options.json", tmp_path / "device" / "weights.hdf5")
    want = model.embed_sentences(sentences)
    got = model.to(DEVICE).embed_sentences(sentences)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_the_scalar_mix_on_the_device_equals_the_cpu():
    rng = np.random.default_rng(1)
    layers = torch.as_tensor(rng.normal(size=(4, 3, 7, 8)), dtype=torch.float32)  # (layers, batch, tokens, dim)
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, 5:] = False
    on_cpu = ScalarMix(4, layer_norm=True, initial_weights=[0.1, -0.3, 0.5, 0.0])
    on_device = ScalarMix(4, layer_norm=True, initial_weights=[0.1, -0.3, 0.5, 0.0]).to(DEVICE)
    want = on_cpu(list(layers), mask)
    got = on_device([layer.to(DEVICE) for layer in layers], mask.to(DEVICE))
    np.testing.assert_allclose(got.detach().cpu().numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-5)
    want.square().sum().backward()
    got.square().sum().backward()
    for (name, a), b in zip(on_cpu.named_parameters(), on_device.parameters()):
        np.testing.assert_allclose(b.grad.cpu().numpy(), a.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)


def test_the_shipped_elmo_brown_embeds_alike_on_the_device():
    from lmgeom.encoders import load_encoder

    sentences = Corpus.from_list([["The", "bank", "raised", "rates", "."], ["We", "sat", "on", "the", "river", "bank", "."]]).sentences
    want = load_encoder("elmo-brown", device="cpu").encode(sentences)
    got = load_encoder("elmo-brown", device=DEVICE).encode(sentences)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.vectors, w.vectors, rtol=1e-4, atol=1e-4)
