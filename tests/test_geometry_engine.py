"""Geometry on the analysis engine: its statistics against an independent numpy computation, the same
numbers on every executor, the `geometry` step of `lmgeom run`, the report's section, and the
LayerNorm-weight outliers of a tiny model with one weight scaled."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
from scipy.spatial.distance import pdist
from typer.testing import CliRunner

from lmgeom.cli.main import app
from lmgeom.metrics.base import load_states, save_states
from lmgeom.metrics.contextuality import IntraSentenceAccumulator, intra_sentence_similarity, self_similarity
from lmgeom.metrics.intrinsic import intrinsic_dimension
from lmgeom.metrics.isotropy import rogue_dimensions
from lmgeom.metrics.outliers import TransformedAccumulator, standardizing, weight_outliers
from lmgeom.engine import AnalysisOptions, LocalExecutor, ProcessExecutor
from lmgeom.engine import executors as executors_module
from lmgeom.stages.geometry import GeometryOptions, layernorm_outliers, measure_geometry
from lmgeom.store import RepresentationStore, write_store_from_arrays

from helpers import local_ray

N_SENTENCES, LENGTH, DIM = 40, 8, 12
OPTIONS = AnalysisOptions(geometry_rows=200, top_activations=4, min_contexts=5, seed=3)


def _planted_store(path: Path, *, model_id: str = "synthetic") -> RepresentationStore:
    """Two layers; every sentence starts with a special <s> row; layer 1 plants |h| = 2000 at the <s>
    row of sentence 3 (dimension 7) and makes dimension 2 a magnitude outlier."""
    rng = np.random.default_rng(21)
    sentences = [["<s>", *(f"w{(s * 5 + i) % 23}" for i in range(LENGTH))] for s in range(N_SENTENCES)]
    special = [[True] + [False] * LENGTH for _ in sentences]
    n = sum(len(s) for s in sentences)
    layers = [rng.normal(size=(n, DIM)) for _ in range(2)]
    layers[1][:, 2] += 6.0
    layers[1][3 * (LENGTH + 1), 7] = 2000.0
    return write_store_from_arrays(path, [layer.astype(np.float32) for layer in layers], sentences, is_special=special,
                                   model_id=model_id)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> RepresentationStore:
    return _planted_store(tmp_path_factory.mktemp("geometry") / "store")


def _reference(store: RepresentationStore, layer: int, options: AnalysisOptions) -> dict[str, Any]:
    """The first stage's numbers of one layer, from the layer's rows in numpy."""
    tokens = store.tokens
    X_all = np.asarray(store.layer(layer)[:], dtype=np.float64)
    words = ~tokens["is_special"].to_numpy()
    rows = np.flatnonzero(words)
    sample = np.sort(np.random.default_rng(options.seed).choice(rows, options.geometry_rows, replace=False))
    X = X_all[sample]
    mean_abs = np.abs(X_all[words]).mean(axis=0)
    z = (mean_abs - mean_abs.mean()) / mean_abs.std()
    flat = np.argsort(-np.abs(X_all).ravel(), kind="stable")[: options.top_activations]
    U = X / np.linalg.norm(X, axis=1, keepdims=True)
    cosines = U @ U.T
    sentence_ids = tokens["sentence_id"].to_numpy()[words]
    means = np.stack([X_all[words][sentence_ids == s].mean(axis=0) for s in range(N_SENTENCES)])
    V = means / np.linalg.norm(means, axis=1, keepdims=True)
    return {"X": X, "outliers": list(np.flatnonzero(z > 3)), "top": [divmod(int(i), DIM) for i in flat],
            "median": float(np.median(np.abs(X))),
            "anisotropy": float((cosines.sum() - np.trace(cosines)) / (len(X) * (len(X) - 1))),
            "uniformity": float(np.log(np.exp(-2 * pdist(V) ** 2).mean())), "rows": X_all[words], "word_mask": words}


def test_geometry_on_the_engine_equals_an_independent_numpy_computation(store: RepresentationStore, tmp_path: Path) -> None:
    result = measure_geometry(store, GeometryOptions(OPTIONS, n_boot=10, data_dir=tmp_path / "no-data"), write=False)
    tokens = store.tokens
    for record in result.layers:
        expected = _reference(store, record["layer"], OPTIONS)
        X = expected["X"]
        dimension = intrinsic_dimension(X, n_boot=10, seed=OPTIONS.seed, mle_k=20, gride_scales=6)
        assert record["intrinsic_dimension"] == [e.record() for e in dimension.estimates]
        assert record["n_rows"] == len(X) == 200 and record["n_duplicates"] == 0
        assert [d["dimension"] for d in record["outlier_dimensions"]] == expected["outliers"]
        assert [(t["row"], t["dimension"]) for t in record["top_activations"]] == expected["top"]
        assert record["median_abs"] == pytest.approx(expected["median"], rel=1e-12)
        assert record["anisotropy_sampled"] == pytest.approx(expected["anisotropy"], rel=1e-10)
        assert record["uniformity"] == pytest.approx(expected["uniformity"], rel=1e-10)
        assert record["rogue_dimensions"] == [int(d) for d in rogue_dimensions(X, top_k=3).top_dimensions]
        # the second stage: the cosines without the outlier dimensions and standardised, by brute force
        rows = expected["rows"]
        word_ids = tokens["word_id"].to_numpy()[expected["word_mask"]]
        sentence_ids = tokens["sentence_id"].to_numpy()[expected["word_mask"]]
        contexts = tokens[expected["word_mask"]].groupby("word_id")["sentence_id"].nunique()
        known = np.isin(word_ids, contexts.index[contexts >= OPTIONS.min_contexts])
        for name, Y in (("without_outlier_dimensions", np.delete(rows, expected["outliers"], axis=1)),
                        ("standardized", (rows - rows.mean(0)) / rows.std(0))):
            assert record[f"self_similarity_{name}"] == pytest.approx(self_similarity(Y[known], word_ids[known]).mean(), rel=1e-10)
            assert record[f"intra_sentence_similarity_{name}"] == pytest.approx(
                intra_sentence_similarity(Y, sentence_ids).mean(), rel=1e-10)
    planted = result.layers[1]["top_activations"][0]
    assert (planted["row"], planted["dimension"], planted["value"], planted["word"], planted["is_special"]) == (27, 7, 2000.0, "<s>", True)
    assert planted["massive"] and planted["first_row_of_sentence"] and planted["sentence_id"] == 3
    assert result.settings["outliers"]["special_rows"] == "stored and read"
    assert result.settings["plan"]["statistics"] == ["geometry_sample", "magnitudes", "top_activations", "sentence_means"]


def _assert_same(a: Any, b: Any, path: str = "", rtol: float = 0.0) -> None:
    if isinstance(a, dict):
        assert set(a) == set(b), path
        for key in a:
            _assert_same(a[key], b[key], f"{path}.{key}", rtol)
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for index, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{path}[{index}]", rtol)
    elif isinstance(a, float) and not (math.isnan(a) and math.isnan(b)):
        assert a == pytest.approx(b, rel=rtol, abs=0 if rtol == 0 else 1e-15), path
    elif not isinstance(a, float):
        assert a == b, path


def test_merged_row_ranges_give_the_numbers_of_one_task(store: RepresentationStore, tmp_path: Path) -> None:
    """Three row ranges a layer: every geometry accumulator's state merges into the one-pass numbers."""
    one = measure_geometry(store, GeometryOptions(OPTIONS, n_boot=5, data_dir=tmp_path), write=False)
    parts = measure_geometry(store, GeometryOptions(OPTIONS.replace(row_parts=3), n_boot=5, data_dir=tmp_path), write=False,
                             executor=LocalExecutor())
    assert sum(task["rows"] for task in parts.settings["plan"]["tasks"]) == 3 * len(store.layers)
    _assert_same(parts.layers, one.layers, rtol=1e-12)


@pytest.mark.processes
def test_processes_give_the_local_numbers_bit_for_bit(store: RepresentationStore, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(executors_module, "POOL_MIN_LAYER_VALUES", 0)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    local = measure_geometry(store, GeometryOptions(OPTIONS, n_boot=5, data_dir=tmp_path), write=False)
    parallel = measure_geometry(store, GeometryOptions(OPTIONS, n_boot=5, data_dir=tmp_path), write=False, executor=ProcessExecutor(2))
    assert parallel.settings["plan"]["executor"] == "processes"
    _assert_same(parallel.layers, local.layers)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    yield from local_ray(__name__)


@pytest.mark.ray
def test_ray_gives_the_local_numbers(store: RepresentationStore, tmp_path: Path, ray_cluster: Any) -> None:
    local = measure_geometry(store, GeometryOptions(OPTIONS, n_boot=5, data_dir=tmp_path), write=False)
    on_ray = measure_geometry(store, GeometryOptions(OPTIONS.replace(engine="ray", num_workers=2, row_parts=2), n_boot=5, data_dir=tmp_path),
                              write=False)
    assert on_ray.settings["plan"]["executor"] == "ray"
    _assert_same(on_ray.layers, local.layers, rtol=1e-12)


def test_a_transformed_accumulator_saves_loads_and_merges(tmp_path: Path) -> None:
    rng = np.random.default_rng(22)
    X = rng.normal(size=(60, 5))
    sentence_ids = np.repeat(np.arange(12), 5)
    mean, std = X.mean(axis=0), X.std(axis=0)
    first = TransformedAccumulator(IntraSentenceAccumulator(), **standardizing(5, mean, std))
    second = TransformedAccumulator(IntraSentenceAccumulator(), **standardizing(5, mean, std))
    first.add(X[:30], sentence_ids=sentence_ids[:30])
    second.add(X[30:], sentence_ids=sentence_ids[30:])
    _, loaded = load_states(save_states(tmp_path / "state.npz", {"a": first, "b": second}))
    merged = loaded["a"].merge(loaded["b"]).result()
    expected = intra_sentence_similarity((X - mean) / std, sentence_ids)
    np.testing.assert_allclose(merged.to_numpy(), expected.to_numpy(), rtol=1e-12)
    other = TransformedAccumulator(IntraSentenceAccumulator(), dim=5, kept=np.array([0, 1]))
    with pytest.raises(ValueError, match="transformed differently"):
        first.merge(other)


# ---- LayerNorm-weight outliers ----------------------------------------------------------------


@pytest.fixture(scope="module")
def scaled_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-bert saved as a transformers folder with one LayerNorm weight scaled tenfold."""
    from lmgeom.encoders.tiny import tiny_model

    model, tokenizer = tiny_model("tiny-bert")
    weight = model.encoder.layer[1].output.LayerNorm.weight
    weight.data[5] *= 10.0
    folder = tmp_path_factory.mktemp("model") / "scaled-bert"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_layernorm_outliers_find_the_scaled_weight_of_a_saved_model(scaled_model: Path) -> None:
    found = layernorm_outliers(str(scaled_model))
    assert found["computed"] and found["note"] is None
    assert len(found["modules"]) == 7  # embeddings and two per block of 3
    hits = [(m["module"], m["block"], o["dimension"]) for m in found["modules"] for o in m["outliers"]]
    assert hits == [("encoder.layer.1.output.LayerNorm", 1, 5)]
    w = np.ones(32)
    w[5] = 10.0
    z = (w - w.mean()) / w.std()
    outlier = next(m for m in found["modules"] if m["outliers"])["outliers"][0]
    assert outlier["weight"] == pytest.approx(10.0) and outlier["z"] == pytest.approx(z[5], rel=1e-6)
    dims, zs = weight_outliers(np.array([1.0, 1.0, 1.0, 1.0, -9.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]))
    assert list(dims) == [4] and zs[0] < -3  # either side of the mean


def test_layernorm_outliers_say_why_they_are_not_computed(tmp_path: Path, store: RepresentationStore) -> None:
    absent = layernorm_outliers(str(tmp_path / "no-such-model"))
    assert not absent["computed"] and absent["note"].startswith("not computed: the model")
    without = measure_geometry(store, GeometryOptions(OPTIONS, n_boot=0, data_dir=tmp_path), write=False)
    assert not without.layernorm_weights["computed"] and "not computed" in without.layernorm_weights["note"]


def test_the_geometry_command_reads_the_weights_of_the_store_s_model(scaled_model: Path, tmp_path: Path) -> None:
    store = _planted_store(tmp_path / "store", model_id=str(scaled_model))
    result = CliRunner().invoke(app, ["geometry", str(store.path), "--rows", "100", "--bootstrap", "0", "--model-weights",
                                      "--data-dir", str(tmp_path)], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "encoder.layer.1.output.LayerNorm" in result.output
    document = json.loads((store.path / "geometry.json").read_text())
    assert document["layernorm_weights"]["computed"]
    assert (store.path / "geometry.csv").read_text().startswith("layer,measure,value,low,high")


# ---- the report's section and the run step ------------------------------------------------------


def test_the_report_shows_the_geometry_section(tmp_path: Path) -> None:
    from lmgeom.report.build import build_report
    from lmgeom.report.geometry import massive_table

    store = _planted_store(tmp_path / "run")
    build_report(store.path)
    page = (store.path / "report.html").read_text()
    assert "no geometry.json in this run" in page
    measure_geometry(store, GeometryOptions(OPTIONS, n_boot=10, data_dir=tmp_path))
    page = Path(build_report(store.path)).read_text()
    section = page[page.index('<section id="geometry">'):]
    section = section[: section.index("</section>")]
    assert "Intrinsic dimension by layer" in section and "0 (embedding output)" in section
    assert "LayerNorm-weight outliers not computed" in section
    assert (store.path / "figures" / "intrinsic_dimension.png").stat().st_size > 1000
    figure = json.loads(page[page.index("const LMGEOM_FIGURES = ") + 23: page.index(";\nfor (const")])["chart-intrinsic_dimension"]
    twonn = next(trace for trace in figure["data"] if trace["name"] == "TwoNN")
    high, low = (next(trace for trace in figure["data"] if trace["name"] == "TwoNN interval" and trace["fill"] == fill)
                 for fill in ("none", "tonexty"))  # the band: its upper bound, then the lower one filled up to it
    assert all(lo <= y <= hi for lo, y, hi in zip(low["y"], twonn["y"], high["y"]) if None not in (lo, y, hi))
    assert any(lo is not None and lo < hi for lo, hi in zip(low["y"], high["y"]))
    document = json.loads((store.path / "geometry.json").read_text())
    table = massive_table(document)
    assert list(table["layer"]).count("0 (embedding output)") == 3  # the first three of each layer
    first_of_layer_1 = table[table["layer"] == "1"].iloc[0]
    assert (first_of_layer_1["token"], first_of_layer_1["word"], first_of_layer_1["dimension"], first_of_layer_1["massive"]) == \
        ("special", "<s>", 7, "yes")
    assert first_of_layer_1["× median |h|"] == pytest.approx(2000.0 / document["layers"][1]["median_abs"])


def test_run_has_a_geometry_step_that_resumes(tmp_path: Path) -> None:
    from lmgeom.pipeline import run

    options: dict[str, Any] = dict(limit=30, device="cpu", min_contexts=2, num_workers=1)
    first = run("tiny-bert", "lee", out=tmp_path / "run", **options)
    assert first.steps_run.index("static_embeddings") < first.steps_run.index("geometry") < first.steps_run.index("report")
    steps = json.loads((tmp_path / "run" / "run.json").read_text())["steps"]
    assert steps["geometry"]["outputs"] == ["geometry.json", "geometry.csv"] and steps["geometry"]["device"] == "cpu"
    document = json.loads((tmp_path / "run" / "geometry.json").read_text())
    assert document["layernorm_weights"]["computed"] and len(document["layers"]) == 4
    assert "no special-token rows" in document["settings"]["outliers"]["special_rows"]
    (tmp_path / "run" / "geometry.csv").unlink()  # a lost output: the step runs again, the others are skipped
    again = run("tiny-bert", "lee", out=tmp_path / "run", **options)
    assert again.steps_run == ["geometry", "report"]
    assert json.loads((tmp_path / "run" / "geometry.json").read_text())["layers"] == document["layers"]


# ---- the same bits in every process ----------------------------------------------------------------

def test_the_per_layer_geometry_is_computed_with_every_pool_at_one_thread(store: RepresentationStore, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The intrinsic dimension's k-NN products add in one order however many threads the process has:
    torch and every BLAS/OpenMP pool are at one thread while it runs, and as they were after."""
    import torch
    from threadpoolctl import threadpool_info

    import lmgeom.stages.geometry as geometry

    seen: list[tuple[int, set[int]]] = []
    real = geometry.intrinsic_dimension

    def recording(*args: Any, **kwargs: Any) -> Any:
        seen.append((torch.get_num_threads(), {pool["num_threads"] for pool in threadpool_info()}))
        return real(*args, **kwargs)

    monkeypatch.setattr(geometry, "intrinsic_dimension", recording)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        measure_geometry(store, GeometryOptions(OPTIONS, n_boot=20, data_dir=tmp_path), out=tmp_path / "g")
        assert torch.get_num_threads() == 2  # restored
    finally:
        torch.set_num_threads(before)
    assert len(seen) == 2 and all(threads == 1 and pools <= {1} for threads, pools in seen), seen


@pytest.mark.processes
def test_geometry_is_bit_identical_in_fresh_processes_of_other_thread_settings(tmp_path: Path) -> None:
    """`lmgeom geometry` in two fresh interpreters, one with every pool at one thread and one with four
    (more than the cores: the products are split), writes the same geometry.json."""
    import subprocess
    import sys

    rng = np.random.default_rng(5)
    sentences = [[f"w{int(i)}" for i in rng.integers(0, 60, size=10)] for _ in range(120)]
    n = sum(len(s) for s in sentences)
    mixing = rng.normal(size=(96, 96))
    layers = [(rng.normal(size=(n, 96)) @ mixing + layer).astype(np.float32) for layer in range(2)]
    write_store_from_arrays(tmp_path / "store", layers, sentences)
    src = Path(__file__).resolve().parents[1] / "src"
    documents = []
    for threads in ("1", "4"):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH")])), "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
               "OPENBLAS_NUM_THREADS": threads}
        out = tmp_path / f"threads-{threads}"
        subprocess.run([sys.executable, "-c", "from lmgeom.cli.main import app; app(prog_name='lmgeom')", "geometry",
                        str(tmp_path / "store"), "--out", str(out), "--min-contexts", "2"],
                       env=env, check=True, capture_output=True, text=True)
        document = json.loads((out / "geometry.json").read_text())
        documents.append(document)
    assert documents[0]["layers"] == documents[1]["layers"]  # every number, compared as written (repr of each float)
    assert (tmp_path / "threads-1" / "geometry.csv").read_bytes() == (tmp_path / "threads-4" / "geometry.csv").read_bytes()
