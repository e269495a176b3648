"""Similarity across layers and models on the analysis engine: the layer x layer and store x store
measures equal a brute-force numpy reference (CKA on the n x n Gram matrices, Procrustes from the
SVD of the full centred matrices, RSA and mutual k-NN on the seeded subsample), and so do their
permutation nulls and p-values (each measure recomputed on the shuffled sampled rows), worker processes
give the local numbers bit for bit and Ray to 1e-12; the `similarity` step of `lmgeom run` writes
its files and is skipped when repeated; the report shows its section; `lmgeom compare` shows the
model x model matrix of runs over the same corpus and says why there is none otherwise."""

from __future__ import annotations

import json
from typing import Any, Iterator

import numpy as np
import pytest
import scipy.stats

from lmgeom.metrics.contextuality import sample_indexes
from lmgeom.store import RepresentationStore, write_store_from_arrays

from helpers import StopAt

SENTENCES = [["the", "cat", "sat", ",", "on", "mats"], ["a", "dog", "ran", "."], ["birds", "fly", "high", "up", "there"]] * 5


def _layers(seed: int, n_layers: int, dim: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    n = sum(map(len, SENTENCES))
    base = rng.standard_normal((n, dim)) * np.arange(1, dim + 1) + 3.0
    layers = [base]
    for _ in range(n_layers - 1):
        layers.append(layers[-1] @ rng.standard_normal((dim, dim)) * 0.5 + 0.8 * rng.standard_normal((n, dim)))
    return [layer.astype(np.float32) for layer in layers]


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> tuple[RepresentationStore, RepresentationStore]:
    """Two stores of one corpus: a (3 layers of 5 dims) and b (2 layers of 4 dims)."""
    folder = tmp_path_factory.mktemp("similarity")
    a = write_store_from_arrays(folder / "a", _layers(1, 3, 5), SENTENCES, model_id="model-a")
    b = write_store_from_arrays(folder / "b", _layers(2, 2, 4), SENTENCES, model_id="model-b")
    return a, b


# ---------------------------------------------------------------------------------------------
# the brute-force reference, independent of lmgeom.metrics.similarity


def _hsic(K: np.ndarray, L: np.ndarray, debiased: bool) -> float:
    n = len(K)
    if not debiased:
        H = np.eye(n) - 1.0 / n
        return float(np.trace(K @ H @ L @ H)) / (n - 1) ** 2
    K, L = K.copy(), L.copy()
    np.fill_diagonal(K, 0)
    np.fill_diagonal(L, 0)
    ones = np.ones(n)
    value = np.trace(K @ L) + (ones @ K @ ones) * (ones @ L @ ones) / ((n - 1) * (n - 2)) - 2 / (n - 2) * ones @ K @ L @ ones
    return float(value) / (n * (n - 3))


def _cka(X: np.ndarray, Y: np.ndarray, debiased: bool) -> float:
    K, L = X @ X.T, Y @ Y.T
    return _hsic(K, L, debiased) / np.sqrt(_hsic(K, K, debiased) * _hsic(L, L, debiased))


def _procrustes(X: np.ndarray, Y: np.ndarray) -> float:
    Xc, Yc = X - X.mean(0), Y - Y.mean(0)
    Xc, Yc = Xc / np.linalg.norm(Xc), Yc / np.linalg.norm(Yc)
    return float(np.arccos(np.clip(np.linalg.svd(Xc.T @ Yc, compute_uv=False).sum(), 0, 1)))


def _rsa(X: np.ndarray, Y: np.ndarray) -> float:
    def rdm(Z: np.ndarray) -> np.ndarray:
        U = Z / np.linalg.norm(Z, axis=1, keepdims=True)
        return (1 - U @ U.T)[np.triu_indices(len(Z), 1)]

    return float(scipy.stats.spearmanr(rdm(X), rdm(Y)).statistic)


def _knn(X: np.ndarray, Y: np.ndarray, k: int) -> float:
    def neighbours(Z: np.ndarray) -> list[set[int]]:
        U = Z / np.linalg.norm(Z, axis=1, keepdims=True)
        S = U @ U.T
        np.fill_diagonal(S, -np.inf)
        return [set(np.argsort(-row, kind="stable")[:k].tolist()) for row in S]

    return float(np.mean([len(a & b) / k for a, b in zip(neighbours(X), neighbours(Y))]))


def reference(layers_a: list[np.ndarray], layers_b: list[np.ndarray], *, sample: int, seed: int, k: int) -> dict[str, np.ndarray]:
    """Every measure of every pair of layers from the full matrices (RSA and k-NN on the same seeded
    subsample the driver draws: `sample_indexes` of the matched positions)."""
    picked = sample_indexes(np.arange(len(layers_a[0])), sample, seed)
    values = {m: np.zeros((len(layers_a), len(layers_b))) for m in ("cka", "cka_debiased", "procrustes", "rsa", "knn")}
    for i, X in enumerate(layers_a):
        for j, Y in enumerate(layers_b):
            values["cka"][i, j] = _cka(X, Y, False)
            values["cka_debiased"][i, j] = _cka(X, Y, True)
            values["procrustes"][i, j] = _procrustes(X, Y)
            values["rsa"][i, j] = _rsa(X[picked], Y[picked])
            values["knn"][i, j] = _knn(X[picked], Y[picked], k)
    return values


def _selected(store: RepresentationStore) -> list[np.ndarray]:
    words = ~store.tokens["is_punct"].to_numpy()  # the default selection: words, no punctuation
    return [np.asarray(store.layer(layer)[:], dtype=np.float64)[words] for layer in store.layers]


def _assert_reference(result: Any, expected: dict[str, np.ndarray]) -> None:
    for measure in ("cka", "cka_debiased"):
        np.testing.assert_allclose(result.values[measure], expected[measure], rtol=1e-9, atol=1e-9, err_msg=measure)
    # RSA correlates float32 standardised ranks (exact ranks, rounded to 6e-8 each)
    np.testing.assert_allclose(result.values["rsa"], expected["rsa"], atol=1e-7)
    # arccos near 1 turns a rounding error e of the overlap into sqrt(2e): 2e-8 on the diagonal
    np.testing.assert_allclose(result.values["procrustes"], expected["procrustes"], rtol=1e-9, atol=1e-7)
    # k-NN: ties broken either way would move it; these random rows have none
    np.testing.assert_allclose(result.values["knn"], expected["knn"], atol=1e-12)


SAMPLE, K = 30, 3


def test_layer_by_layer_equals_the_brute_force_reference(stores):
    from lmgeom.stages.similarity import SimilarityOptions, similarity_matrix

    a, _ = stores
    layers = _selected(a)
    # chunks of 7 rows and a state budget of one pair a group: several tasks, the same numbers
    options = SimilarityOptions(sample=SAMPLE, k=K, chunk_rows=7, max_state_bytes=8 * 25)
    result = similarity_matrix(a, None, options)
    _assert_reference(result, reference(layers, layers, sample=SAMPLE, seed=0, k=K))
    assert result.counts["rows_matched"] == len(layers[0])


def test_store_by_store_equals_the_brute_force_reference(stores):
    from lmgeom.stages.similarity import SimilarityOptions, similarity_matrix

    a, b = stores
    result = similarity_matrix(a, b, SimilarityOptions(sample=SAMPLE, k=K, chunk_rows=9))
    _assert_reference(result, reference(_selected(a), _selected(b), sample=SAMPLE, seed=0, k=K))
    assert result.values["cka"].shape == (3, 2)


def test_nulls_and_p_values_equal_shuffling_the_sampled_rows_from_scratch(stores):
    """Each measure's null on the subsample is the measure recomputed from scratch with the rows of
    store b shuffled by the seeded permutations (seed + 1), its p-value the share of the null at
    least as similar; `permutations=0` gives no null and no p-value."""
    from lmgeom.metrics.similarity import permutations
    from lmgeom.stages.similarity import SimilarityOptions, similarity_matrix

    a, b = stores
    seed, count, procrustes_count = 3, 40, 7
    options = SimilarityOptions(sample=SAMPLE, k=K, seed=seed, permutations=count, procrustes_permutations=procrustes_count)
    result = similarity_matrix(a, b, options)
    layers_a, layers_b = _selected(a), _selected(b)
    picked = sample_indexes(np.arange(len(layers_a[0])), SAMPLE, seed)
    shuffles = permutations(SAMPLE, count, seed + 1)
    measures = {"cka": lambda x, y: _cka(x, y, False), "cka_debiased": lambda x, y: _cka(x, y, True), "procrustes": _procrustes,
                "rsa": _rsa, "knn": lambda x, y: _knn(x, y, K)}
    assert result.permutations == {"cka": count, "cka_debiased": count, "procrustes": procrustes_count, "rsa": count, "knn": count}
    assert result.chance == {"knn": K / (SAMPLE - 1)}
    for i, X in enumerate(layers_a):
        for j, Y in enumerate(layers_b):
            x, y = X[picked], Y[picked]
            for name, measure in measures.items():
                lower = name == "procrustes"
                null = np.array([measure(x, y[p]) for p in shuffles[: procrustes_count if lower else count]])
                observed = measure(x, y)
                extreme = null <= observed + 1e-12 if lower else null >= observed - 1e-12
                # RSA: the library correlates float32 standardised ranks (6e-8 each), scipy exact ones
                tolerance = 1e-7 if name == "rsa" else 1e-10
                assert result.sample_values[name][i, j] == pytest.approx(observed, abs=tolerance), name
                assert result.null[name][i, j] == pytest.approx(null.mean(), abs=tolerance), name
                assert result.null_sd[name][i, j] == pytest.approx(null.std(ddof=1), abs=tolerance), name
                assert result.p_values[name][i, j] == (1 + extreme.sum()) / (1 + len(null)), name
    record = next(r for r in result.records if r["measure"] == "procrustes" and (r["layer_a"], r["layer_b"]) == (2, 1))
    assert record["p_value"] == result.p_values["procrustes"][2, 1] and record["permutations"] == procrustes_count
    none = similarity_matrix(a, b, SimilarityOptions(sample=SAMPLE, k=K, seed=seed, permutations=0, procrustes_permutations=0))
    assert none.null == none.p_values == none.null_sd == {} and none.permutations == {}
    assert all(r["p_value"] is None and r["null"] is None and r["permutations"] == 0 for r in none.records)
    np.testing.assert_allclose(none.values["rsa"], result.values["rsa"], atol=1e-12)


# ---------------------------------------------------------------------------------------------
# the engine: executors, row ranges, the plan recorded


def _streamed(result: Any) -> dict[str, np.ndarray]:
    return {measure: result.values[measure] for measure in ("cka", "cka_debiased", "procrustes")}


@pytest.fixture
def pool_for_small_stores(monkeypatch: pytest.MonkeyPatch) -> None:
    from lmgeom.engine import executors

    monkeypatch.setattr(executors, "POOL_MIN_LAYER_VALUES", 0)
    monkeypatch.setattr(executors, "available_cores", lambda: 2)


@pytest.mark.processes
def test_worker_processes_give_the_local_numbers_bit_for_bit(stores, pool_for_small_stores):
    from lmgeom.stages.similarity import SimilarityOptions, similarity_matrix

    a, b = stores
    options = SimilarityOptions(measures=("cka", "cka_debiased", "procrustes"), chunk_rows=8, max_state_bytes=8 * 40)
    local = similarity_matrix(a, b, options)
    pooled = similarity_matrix(a, b, SimilarityOptions(**{**options.__dict__, "engine": "processes", "num_workers": 2}))
    assert local.settings["executor"] == "local" and pooled.settings["executor"] == "processes"
    assert len(pooled.settings["plan"]["tasks"]) > 1  # several tasks, so the pool had work to share
    for measure, table in _streamed(local).items():
        np.testing.assert_array_equal(pooled.values[measure], table, err_msg=measure)


def test_row_ranges_merge_to_the_one_pass_numbers(stores):
    from lmgeom.stages.similarity import SimilarityOptions, similarity_matrix

    a, _ = stores
    options = SimilarityOptions(measures=("cka", "cka_debiased", "procrustes"), chunk_rows=8)
    whole = similarity_matrix(a, None, options)
    parts = similarity_matrix(a, None, SimilarityOptions(**{**options.__dict__, "row_parts": 3}))
    assert {(task["start"], task["stop"]) for task in parts.settings["plan"]["tasks"]} == {(0, 22), (22, 44), (44, 65)}
    for measure, table in _streamed(whole).items():
        np.testing.assert_allclose(parts.values[measure], table, rtol=1e-12, atol=1e-12, err_msg=measure)
    expected = reference(_selected(a), _selected(a), sample=SAMPLE, seed=0, k=K)
    np.testing.assert_allclose(parts.values["cka_debiased"], expected["cka_debiased"], rtol=1e-9, atol=1e-9)


@pytest.mark.ray
def test_ray_gives_the_local_numbers(stores):
    ray = pytest.importorskip("ray")
    from lmgeom.stages.similarity import SimilarityOptions, similarity_matrix

    a, b = stores
    options = SimilarityOptions(measures=("cka", "cka_debiased", "procrustes"), chunk_rows=8, row_parts=2)
    local = similarity_matrix(a, b, options)
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    try:
        remote = similarity_matrix(a, b, SimilarityOptions(**{**options.__dict__, "engine": "ray", "num_workers": 2}))
    finally:
        ray.shutdown()
    assert remote.settings["executor"] == "ray"
    for measure, table in _streamed(local).items():
        np.testing.assert_allclose(remote.values[measure], table, rtol=1e-12, atol=1e-12, err_msg=measure)


# ---------------------------------------------------------------------------------------------
# the run step, the report section and the comparison (tiny models on a few Lee sentences)

RUN_OPTIONS = dict(limit=16, device="cpu", min_contexts=2, num_workers=1, layers="0")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A tiny-bert run interrupted in its similarity step, resumed and repeated; a tiny-gpt2 run of
    the same sentences; a tiny-bert run of fewer sentences (another corpus)."""
    from lmgeom.pipeline import run

    folder = tmp_path_factory.mktemp("runs")
    with pytest.raises(KeyboardInterrupt):
        run("tiny-bert", "lee", out=folder / "bert", progress=StopAt("similarity"), **RUN_OPTIONS)
    resumed = run("tiny-bert", "lee", out=folder / "bert", **RUN_OPTIONS)
    again = run("tiny-bert", "lee", out=folder / "bert", **RUN_OPTIONS)
    run("tiny-gpt2", "lee", out=folder / "gpt2", **RUN_OPTIONS)
    run("tiny-bert", "lee", out=folder / "fewer", **{**RUN_OPTIONS, "limit": 8})
    yield {"folder": folder, "resumed": resumed, "again": again}


def test_the_run_step_writes_similarity_and_resumes(runs):
    from lmgeom.engine.selection import SELECTION_COLUMNS, select_rows

    bert = runs["folder"] / "bert"
    assert runs["resumed"].steps_run == ["similarity", "geometry", "report"]
    assert runs["again"].steps_run == ["report"] and "similarity" in runs["again"].steps_skipped
    step = json.loads((bert / "run.json").read_text())["steps"]["similarity"]
    assert step["device"] == "cpu" and step["outputs"] == ["similarity.json", "similarity.csv"]
    assert step["settings"]["seed"] == 0 and step["settings"]["measures"] == ["cka", "cka_debiased", "procrustes", "rsa", "knn"]
    assert (step["settings"]["permutations"], step["settings"]["procrustes_permutations"]) == (200, 20)
    document = json.loads((bert / "similarity.json").read_text())
    store = RepresentationStore.open(bert)
    mask = select_rows(store.token_columns(*SELECTION_COLUMNS)).mask
    layers = [np.asarray(store.layer(layer)[:], dtype=np.float64)[mask] for layer in store.layers]
    assert document["layers_a"] == list(store.layers) and document["counts"]["rows_matched"] == int(mask.sum())
    expected = reference(layers, layers, sample=2000, seed=0, k=10)
    for measure in ("cka", "cka_debiased"):
        np.testing.assert_allclose(document["matrices"][measure], expected[measure], rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(document["matrices"]["procrustes"], expected["procrustes"], atol=1e-6)
    assert document["settings"]["executor"] == "local" and document["settings"]["plan"]["rows"] == int(mask.sum())
    assert len((bert / "similarity.csv").read_text().splitlines()) == 1 + 5 * len(store.layers) ** 2
    # a layer against itself: every shuffle is less similar, so the smallest p-value
    p_values = np.asarray(document["p_values"]["cka_debiased"])
    np.testing.assert_array_equal(np.diag(p_values), 1 / 201)
    assert np.diag(np.asarray(document["p_values"]["procrustes"])).tolist() == [1 / 21] * len(store.layers)
    m = document["counts"]["sample"]
    assert document["chance"] == {"knn": pytest.approx(10 / (m - 1))}


def test_the_report_shows_the_similarity_section(runs):
    page = (runs["folder"] / "bert" / "report.html").read_text()
    section = page[page.index('<section id="similarity">'):]
    section = section[: section.index("</section>")]
    assert "Linear CKA (debiased) between layers" in section and "Procrustes shape distance (radians) between layers" in section
    assert "layer 0 = embedding output" in section and "Permutation null" in section
    assert "largest p" in section and "pairs at p ≤ 0.05" in section and "chance level (random neighbour lists) is k / (m − 1)" in section
    assert "200 times for cka, cka_debiased, rsa, knn" in section and "20 times for procrustes" in section
    assert "chart-similarity_cka" in page and (runs["folder"] / "bert" / "figures" / "similarity_cka.png").exists()


def test_compare_shows_the_model_by_model_matrix_of_runs_of_one_corpus(runs, tmp_path):
    from typer.testing import CliRunner

    from lmgeom.cli.main import app

    folder = runs["folder"]
    result = CliRunner().invoke(app, ["compare", str(folder / "bert"), str(folder / "gpt2"), "--out", str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    page = (tmp_path / "c" / "compare.html").read_text()
    section = page[page.index('<section id="models">'):]
    assert "Last layer × last layer" in section[: section.index("</section>")]
    document = json.loads((tmp_path / "c" / "similarity" / "1-2" / "similarity.json").read_text())
    assert [store["model_id"] for store in document["stores"]] == ["tiny-bert", "tiny-gpt2"]
    assert document["counts"]["a_rows_unmatched"] == document["counts"]["b_rows_unmatched"] == 0
    # the pair's values: the brute force on the rows both stores hold
    bert, gpt2 = RepresentationStore.open(folder / "bert"), RepresentationStore.open(folder / "gpt2")
    from lmgeom.stages.similarity import SimilarityOptions, match_rows

    matched = match_rows(bert, gpt2, SimilarityOptions())
    X = np.asarray(bert.layer(bert.layers[-1])[:], dtype=np.float64)[matched.rows_a]
    Y = np.asarray(gpt2.layer(gpt2.layers[-1])[:], dtype=np.float64)[matched.rows_b]
    assert document["matrices"]["cka_debiased"][-1][-1] == pytest.approx(_cka(X, Y, True), rel=1e-9, abs=1e-12)

    other = CliRunner().invoke(app, ["compare", str(folder / "bert"), str(folder / "fewer"), "--out", str(tmp_path / "d")])
    assert other.exit_code == 0, other.output
    page = (tmp_path / "d" / "compare.html").read_text()
    section = page[page.index('<section id="models">'):]
    assert "no model × model matrix" in section and "different corpora" in section
    assert not (tmp_path / "d" / "similarity").exists()


def test_the_device_code_path_gives_the_numpy_numbers(stores):
    """`torch:cpu` runs the accumulators on torch tensors (a CUDA device's path), over two row ranges
    whose states come back as numpy and merge."""
    pytest.importorskip("torch")
    from lmgeom.stages.similarity import SimilarityOptions, similarity_matrix

    a, b = stores
    options = SimilarityOptions(measures=("cka", "cka_debiased", "procrustes"), chunk_rows=8)
    numpy_result = similarity_matrix(a, b, options)
    torch_result = similarity_matrix(a, b, SimilarityOptions(**{**options.__dict__, "device": "torch:cpu", "row_parts": 2}))
    assert torch_result.settings["plan"]["device"] == "torch:cpu"
    for measure, table in _streamed(numpy_result).items():
        np.testing.assert_allclose(torch_result.values[measure], table, rtol=1e-12, atol=1e-12, err_msg=measure)


def test_the_cli_hands_device_engine_and_workers_to_the_engine(stores, tmp_path):
    from typer.testing import CliRunner

    from lmgeom.cli.main import app

    a, b = stores
    result = CliRunner().invoke(app, ["similarity", str(a.url), str(b.url), "--measures", "cka_debiased", "--device", "torch:cpu",
                                      "--engine", "local", "--num-workers", "1", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    settings = json.loads((tmp_path / "similarity.json").read_text())["settings"]
    assert settings["executor"] == "local" and settings["plan"]["device"] == "torch:cpu"
    expected = reference(_selected(a), _selected(b), sample=SAMPLE, seed=0, k=K)["cka_debiased"]
    document = json.loads((tmp_path / "similarity.json").read_text())
    np.testing.assert_allclose(document["matrices"]["cka_debiased"], expected, rtol=1e-9, atol=1e-9)
    bad = CliRunner().invoke(app, ["similarity", str(a.url), "--engine", "threads", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "unknown --engine" in bad.output


def test_a_subsample_of_at_most_k_rows_leaves_knn_undefined_and_says_why(stores):
    """Mutual k-NN needs more than k points; on fewer the other measures still come out (the main
    job on a tiny corpus must not fail in its similarity step)."""
    from lmgeom.stages.similarity import SimilarityOptions, similarity_matrix

    a, _ = stores
    layers = _selected(a)
    result = similarity_matrix(a, None, SimilarityOptions(sample=6, k=6))
    assert np.isnan(result.values["knn"]).all()
    assert "needs more than 6 sampled rows" in result.settings["knn_not_computed"]
    full = reference(layers, layers, sample=6, seed=0, k=5)
    np.testing.assert_allclose(result.values["cka"], full["cka"], rtol=1e-10)
    assert "knn_not_computed" not in similarity_matrix(a, None, SimilarityOptions(sample=6, k=5)).settings
