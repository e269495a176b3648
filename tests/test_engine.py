"""The analysis engine: one plan, the same tasks on every executor, the same numbers.

The fixed store's analysis equals its committed expectation on every executor; worker processes give
the numbers of one process bit for bit; Ray, which merges in another order, to 1e-12; a statistic
registered once (here, with its tiny accumulator) appears in the results of all three executors;
the plan is data and is recorded in the results; options round-trip through the settings; saved
shard states carry a schema version. The slow test re-analyses the real MiniLM x Lee store
(LMGEOM_EXPECT_STORE) against tests/data/minilm_lee_run (1e-12 relative); run it with the BLAS
threads the expectation was made with (the machine's default: leave OMP_NUM_THREADS and
OPENBLAS_NUM_THREADS unset), as multi-threaded BLAS sums in another order (isotropy's measures move
by up to 3e-10 relative at one thread)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, ClassVar, Iterator

import numpy as np
import pandas as pd
import pytest

from lmgeom.metrics.base import RowBlock, StatefulAccumulator, register_accumulator, row_ids
from lmgeom.stages import analyze_shard, analyze_store, finish_analysis
from lmgeom.engine import (
    CONTEXTUALITY_STATISTICS,
    ROWS,
    WORD_GROUPS,
    AnalysisOptions,
    AnalysisState,
    LocalExecutor,
    ProcessExecutor,
    RayExecutor,
    Statistic,
    executor_for,
    plan_analysis,
    register_statistic,
)
from lmgeom.engine import executors as executors_module
from lmgeom.engine.statistics import LayerValues, layer_record, per_word
from lmgeom.store import RepresentationStore, write_store_from_arrays

from helpers import local_ray, synthetic_store

DATA = Path(__file__).parent / "data"
COUNTS = {f"often{i}": 150 for i in range(3)} | {f"rare{i}": 4 + i % 7 for i in range(60)}
SMALL_BUDGET_MB = 0.02  # several MEV word groups


# ---------------------------------------------------------------------------------------------
# a test statistic, registered here and nowhere else: the mean of the first coordinate of the
# selected rows (a row statistic) and each word's row count (a word-group statistic)


@register_accumulator
class FirstCoordinateAccumulator(StatefulAccumulator):
    _state_fields: ClassVar[tuple[str, ...]] = ("total", "count")

    def __init__(self) -> None:
        self.total, self.count = 0.0, 0

    def add(self, X: Any, /, **ids: np.ndarray) -> FirstCoordinateAccumulator:
        return self.add_block(RowBlock(X), None)

    def add_block(self, block: RowBlock, keep: np.ndarray | None, /, **ids: np.ndarray) -> FirstCoordinateAccumulator:
        rows = np.asarray(block.rows(keep))
        self.total += float(rows[:, 0].sum())
        self.count += len(rows)
        return self

    def merge(self, other: FirstCoordinateAccumulator) -> FirstCoordinateAccumulator:
        self.total += other.total
        self.count += other.count
        return self

    def result(self) -> float:
        return self.total / self.count


@register_accumulator
class WordRowCountAccumulator(StatefulAccumulator):
    _state_fields: ClassVar[tuple[str, ...]] = ("counts",)

    def __init__(self, n_words: int) -> None:
        self.counts = np.zeros(n_words, dtype=np.int64)

    def add(self, X: Any, /, **ids: np.ndarray) -> WordRowCountAccumulator:
        (word_ids,) = row_ids(ids, ("word_ids",), len(X), "WordRowCountAccumulator")
        self.counts += np.bincount(word_ids, minlength=len(self.counts))
        return self

    def merge(self, other: WordRowCountAccumulator) -> WordRowCountAccumulator:
        self.counts = self.counts + other.counts
        return self

    def result(self) -> np.ndarray:
        return self.counts


def _first_coordinate_accumulator(rows: Any, words: np.ndarray | None) -> FirstCoordinateAccumulator:
    return FirstCoordinateAccumulator()


def _first_coordinate_values(acc: FirstCoordinateAccumulator, rows: Any, words: np.ndarray | None) -> LayerValues:
    return {"first_coordinate": acc.result(), "first_coordinate_rows": acc.count}


def _first_coordinate_records(values: LayerValues) -> list[dict[str, Any]]:
    return [layer_record("first_coordinate_mean", values["first_coordinate"], values["first_coordinate_rows"])]


def _word_rows_values(acc: WordRowCountAccumulator, rows: Any, words: np.ndarray | None) -> LayerValues:
    return {"test_word_rows": acc.result()}


def _word_rows_columns(values: LayerValues) -> dict[str, np.ndarray]:
    return {"test_word_rows": values["test_word_rows"]}


register_statistic(Statistic("first_coordinate", ROWS, _first_coordinate_accumulator, _first_coordinate_values,
                             records=_first_coordinate_records))
register_statistic(Statistic("test_word_rows", WORD_GROUPS, per_word(WordRowCountAccumulator), _word_rows_values,
                             word_columns=_word_rows_columns, stored_rows=True))
WITH_TEST_STATISTICS = (*CONTEXTUALITY_STATISTICS, "first_coordinate", "test_word_rows")


@pytest.fixture(scope="module")
def fixed_store(tmp_path_factory: pytest.TempPathFactory) -> RepresentationStore:
    arrays = np.load(DATA / "fixed_store.npz")
    words = json.loads((DATA / "fixed_store_words.json").read_text())
    layers = [arrays[f"layer{layer}"] for layer in range(len(arrays.files))]
    return write_store_from_arrays(tmp_path_factory.mktemp("fixed") / "store", layers, words["sentences"],
                                   is_special=words["is_special"], model_id="fixed")


@pytest.fixture(scope="module")
def grouped_store(tmp_path_factory: pytest.TempPathFactory) -> RepresentationStore:
    return synthetic_store(tmp_path_factory.mktemp("grouped") / "store", dim=24, counts=COUNTS, n_layers=3, sentence_length=6)


@pytest.fixture
def pool_for_small_stores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(executors_module, "POOL_MIN_LAYER_VALUES", 0)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)


def _options(case: dict[str, Any]) -> AnalysisOptions:
    options = dict(case["options"])
    if "exclude_punct" in options:
        options["include_punct"] = not options.pop("exclude_punct")
    return AnalysisOptions(**options)


def _assert_close(actual: Any, expected: Any, path: str = "", atol: float = 1e-12) -> None:
    if isinstance(expected, dict):
        assert {str(k) for k in actual} == {str(k) for k in expected}, path
        by_name = {str(k): v for k, v in actual.items()}
        for key, value in expected.items():
            _assert_close(by_name[str(key)], value, f"{path}.{key}", atol)
    elif isinstance(expected, list):
        assert len(actual) == len(expected), path
        for index, (a, e) in enumerate(zip(actual, expected)):
            _assert_close(a, e, f"{path}[{index}]", atol)
    elif expected is None or isinstance(expected, float) and math.isnan(expected):
        assert actual is None or isinstance(actual, float) and math.isnan(actual), f"{path}: {actual} is not NaN"
    elif isinstance(expected, (int, float)) and not isinstance(expected, bool):
        assert abs(float(actual) - expected) <= atol, f"{path}: {actual} != {expected}"
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


# the bootstrap's columns of the records (tests/test_bootstrap.py), which the expectations predate
INTERVAL_COLUMNS = ["raw_lo", "raw_hi", "adjusted_lo", "adjusted_hi", "resampled"]


def _numbers(result: Any) -> dict[str, Any]:
    return {"layers": result.layers.drop(columns=INTERVAL_COLUMNS, errors="ignore").to_dict("records"), "words": result.words.to_dict("records"),
            "counts": result.counts, "findings": result.findings}


# ---------------------------------------------------------------------------------------------
# the fixed store on every executor


@pytest.mark.processes
@pytest.mark.parametrize("engine", ["local", "processes"])
def test_the_fixed_store_analysis_equals_its_expectation(fixed_store: RepresentationStore, engine: str,
                                                          pool_for_small_stores: None) -> None:
    expected = json.loads((DATA / "fixed_store_expected.json").read_text())
    for case in expected.values():
        result = analyze_store(fixed_store, _options(case).replace(engine=engine, num_workers=2))
        assert result.plan["executor"] == engine
        _assert_close(_numbers(result), {key: case[key] for key in ("layers", "words", "counts", "findings")})


@pytest.mark.processes
def test_processes_give_the_numbers_of_one_process_bit_for_bit(grouped_store: RepresentationStore,
                                                               pool_for_small_stores: None) -> None:
    options = AnalysisOptions(min_contexts=2, n_samples=100, mev_memory_mb=SMALL_BUDGET_MB, statistics=WITH_TEST_STATISTICS)
    plan, _ = plan_analysis(grouped_store, options)
    assert plan.n_groups >= 2  # the groups after the first go through each worker's spools
    one = analyze_store(grouped_store, options)
    parallel = analyze_store(grouped_store, options, engine="processes", num_workers=2)
    assert one.plan["executor"] == "local" and parallel.plan["executor"] == "processes"
    pd.testing.assert_frame_equal(parallel.layers, one.layers, check_exact=True)
    pd.testing.assert_frame_equal(parallel.words, one.words, check_exact=True)
    assert parallel.counts == one.counts and parallel.findings == one.findings
    _assert_test_statistics(grouped_store, parallel)


def _assert_test_statistics(store: RepresentationStore, result: Any) -> None:
    """The test statistic's records and word column hold their brute-force values."""
    _, rows = plan_analysis(store, AnalysisOptions.from_settings(result.settings))
    records = result.layers.loc[result.layers["metric"] == "first_coordinate_mean"]
    assert list(records["layer"]) == list(store.layers)
    for layer, raw, n in zip(records["layer"], records["raw"], records["n"]):
        selected = np.asarray(store.layer(layer)[:], dtype=np.float64)[rows.selection.mask]
        assert n == len(selected) and raw == pytest.approx(selected[:, 0].mean(), rel=1e-12)
    np.testing.assert_array_equal(result.words["test_word_rows"].to_numpy(), result.words["count"].to_numpy())


def test_a_statistic_registered_once_is_in_the_local_results(grouped_store: RepresentationStore) -> None:
    options = AnalysisOptions(min_contexts=2, n_samples=100, mev_memory_mb=SMALL_BUDGET_MB, statistics=WITH_TEST_STATISTICS)
    result = analyze_store(grouped_store, options)
    _assert_test_statistics(grouped_store, result)
    assert "first_coordinate_mean" not in set(analyze_store(grouped_store, min_contexts=2, n_samples=100).layers["metric"])


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    yield from local_ray(__name__)


@pytest.mark.ray
def test_ray_gives_the_local_numbers_and_the_registered_statistic(grouped_store: RepresentationStore, ray_cluster: Any) -> None:
    options = AnalysisOptions(min_contexts=2, n_samples=100, mev_memory_mb=SMALL_BUDGET_MB, statistics=WITH_TEST_STATISTICS)
    on_ray = analyze_store(grouped_store, options, engine="ray", num_workers=2, row_parts=3)
    plan = on_ray.plan
    assert on_ray.plan["executor"] == "ray" and plan["word_groups"] >= 2
    assert not any(task["rows"] and task["groups"] for task in plan["tasks"])  # no task holds every word's state
    local = analyze_store(grouped_store, options)
    pd.testing.assert_frame_equal(on_ray.layers, local.layers, rtol=1e-12, atol=1e-12)
    pd.testing.assert_frame_equal(on_ray.words, local.words, rtol=1e-12, atol=1e-12)
    norms = on_ray.counts.pop("mean_norm_by_layer"), local.counts.pop("mean_norm_by_layer")
    np.testing.assert_allclose(list(norms[0].values()), list(norms[1].values()), rtol=1e-12)
    assert on_ray.counts == local.counts
    _assert_test_statistics(grouped_store, on_ray)


# ---------------------------------------------------------------------------------------------
# plans, options, executors, states


def test_the_plan_is_data_recorded_in_the_results(grouped_store: RepresentationStore, tmp_path: Path) -> None:
    options = AnalysisOptions(min_contexts=2, n_samples=100, mev_memory_mb=SMALL_BUDGET_MB, row_parts=2)
    plan, rows = plan_analysis(grouped_store, options)
    recorded = json.loads(json.dumps(plan.to_json()))
    # the bootstrap adds its statistics (`lmgeom.engine.bootstrap.bootstrap_statistics`)
    assert recorded["statistics"] == [*CONTEXTUALITY_STATISTICS, "bootstrap", "bootstrap_sample"] and recorded["layers"] == [0, 1, 2]
    # two row ranges a layer: a task for the row statistics and one for each group with rows in the range
    assert {(task["start"], task["stop"]) for task in recorded["tasks"]} == {(task.start, task.stop) for task in plan.tasks}
    assert len([task for task in recorded["tasks"] if task["rows"]]) == 2 * 3
    assert all(len(task["groups"]) <= 1 for task in recorded["tasks"])
    analyze_store(grouped_store, options, write_to=tmp_path)
    written = json.loads((tmp_path / "contextuality.json").read_text())
    assert written["plan"]["tasks"] == recorded["tasks"] and written["settings"]["device"] == "cpu"
    # the local executor runs the same tasks: the same numbers as one task a layer
    one_task = analyze_store(grouped_store, options.replace(row_parts=1))
    pd.testing.assert_frame_equal(ContextualityLayers(written), one_task.layers, rtol=1e-12, atol=1e-12)


def ContextualityLayers(document: dict[str, Any]) -> pd.DataFrame:  # noqa: N802 - reads like the frame it returns
    return pd.DataFrame(document["records"]).astype({"raw": float, "baseline": float, "adjusted": float})


def test_options_round_trip_through_the_settings() -> None:
    options = AnalysisOptions(min_contexts=3, include_punct=True, seed=4, n_samples=50, layers=(0, 2), mev_memory_mb=64,
                              mev_variants=("centred",), num_workers=3)
    assert AnalysisOptions.from_settings(json.loads(json.dumps(options.to_settings()))) == options
    # a file written with the negated name reads back with the one name
    assert AnalysisOptions.from_settings({"exclude_punct": False, "min_contexts": 2}).include_punct is True
    assert AnalysisOptions.from_settings({"exclude_punct": True}).include_punct is False
    with pytest.raises(ValueError, match="`num_workers` must be at least 1"):
        AnalysisOptions(num_workers=0)
    with pytest.raises(ValueError, match="unknown `engine`"):
        AnalysisOptions(engine="threads")


def test_the_executor_is_chosen_in_one_place() -> None:
    assert isinstance(executor_for(AnalysisOptions()), LocalExecutor)
    assert isinstance(executor_for(AnalysisOptions(num_workers=2)), ProcessExecutor)
    assert isinstance(executor_for(AnalysisOptions(engine="local", num_workers=2)), LocalExecutor)
    assert isinstance(executor_for(AnalysisOptions(engine="processes")), ProcessExecutor)
    ray = executor_for(AnalysisOptions(engine="ray", num_workers=3, ray_address="ray://head:10001"))
    assert isinstance(ray, RayExecutor) and (ray.num_workers, ray.address) == (3, "ray://head:10001")


def test_only_the_mev_variants_asked_for_are_solved(grouped_store: RepresentationStore) -> None:
    every = analyze_store(grouped_store, min_contexts=2, n_samples=100)
    centred = analyze_store(grouped_store, min_contexts=2, n_samples=100, mev_variants=("centred",))
    assert [c for c in centred.words if c.startswith("mev_")] == ["mev_centred", "mev_centred_adjusted"]
    assert set(centred.layers["metric"]) == set(every.layers["metric"]) - {"mev_uncentred", "mev_svd_ratio"}
    np.testing.assert_allclose(centred.words["mev_centred"], every.words["mev_centred"], rtol=1e-9, equal_nan=True)
    assert set(centred.findings["static_embedding_variance"]) == {"centred"}


def test_saved_shard_states_carry_a_schema_version(fixed_store: RepresentationStore, tmp_path: Path) -> None:
    options = AnalysisOptions(min_contexts=3, mev_memory_mb=0.001)
    bounds = [(0, 120), (120, fixed_store.n_tokens)]
    paths = [analyze_shard(fixed_store, rows, options).save(tmp_path / f"shard{i}.npz") for i, rows in enumerate(bounds)]
    merged = AnalysisState.load(paths[1]).merge(AnalysisState.load(paths[0]))
    pd.testing.assert_frame_equal(finish_analysis(fixed_store, merged).layers, analyze_store(fixed_store, options).layers,
                                  rtol=0, atol=1e-12)
    # a state of another schema version is refused with what to do
    with np.load(paths[0]) as saved:
        arrays = {key: saved[key] for key in saved.files}
    header = json.loads(str(arrays["__header__"]))
    assert header["schema_version"] == 1 and header["kind"] == "analysis_state"
    arrays["__header__"] = np.array(json.dumps({**header, "schema_version": 99}))
    np.savez(tmp_path / "future.npz", **arrays)
    with pytest.raises(ValueError, match="schema version 99.*analyse that shard again"):
        AnalysisState.load(tmp_path / "future.npz")


# ---------------------------------------------------------------------------------------------
# the real MiniLM x Lee store re-analysed: every number of its committed result files


def _relative_differences(actual: Any, expected: Any, path: str = "") -> Iterator[tuple[str, float]]:
    """(path, relative difference) of every number of `expected` (walked as it is) against `actual`."""
    if isinstance(expected, dict):
        by_name = {str(k): v for k, v in actual.items()}
        for key, value in expected.items():
            assert str(key) in by_name, f"{path}.{key} is missing"
            yield from _relative_differences(by_name[str(key)], value, f"{path}.{key}")
    elif isinstance(expected, list):
        assert len(actual) == len(expected), f"{path}: {len(actual)} items, expected {len(expected)}"
        for index, (a, e) in enumerate(zip(actual, expected)):
            yield from _relative_differences(a, e, f"{path}[{index}]")
    elif isinstance(expected, (int, float)) and not isinstance(expected, bool):
        a = float("nan") if actual is None else float(actual)
        if math.isnan(expected):
            assert math.isnan(a), f"{path}: {actual} is not NaN"
            yield path, 0.0
        else:
            yield path, abs(a - expected) / max(abs(expected), 1e-300) if expected else abs(a)


def _expected(name: str) -> dict[str, Any]:
    return json.loads((DATA / "minilm_lee_run" / name).read_text())


def _json_of(payload: Any) -> Any:
    """`payload` as its result file holds it (numbers through JSON)."""
    return json.loads(json.dumps(payload, default=lambda value: value.item()))


@pytest.mark.slow
def test_the_minilm_lee_store_reanalysed_reproduces_every_number(tmp_path: Path) -> None:
    location = os.environ.get("LMGEOM_EXPECT_STORE")
    if not location:
        pytest.skip("set LMGEOM_EXPECT_STORE to the MiniLM x Lee store of tests/data/minilm_lee_run")
    from lmgeom.stages.calibration import CalibrationOptions, calibrate_store
    from lmgeom.engine import AnalysisOptions
    from lmgeom.stages.isotropy import IsotropyOptions, measure_isotropy
    from lmgeom.stages.static import benchmark_static_embeddings, default_word_benchmarks, static_embeddings

    store = RepresentationStore.open(location)
    worst: dict[str, float] = {}

    def compare(name: str, actual: Any, expected: Any) -> None:
        differences = list(_relative_differences(actual, expected))
        path, largest = max(differences, key=lambda item: item[1])
        worst[name] = largest
        assert largest <= 1e-12, f"{name}{path}: relative difference {largest:.3g}"

    expected = _expected("contextuality.json")
    analysed = analyze_store(store, AnalysisOptions.from_settings(expected["settings"], device="cpu"), write_to=tmp_path)
    written = json.loads((tmp_path / "contextuality.json").read_text())
    compare("contextuality.json", written, {key: expected[key] for key in ("counts", "records", "findings")})
    assert analysed.statements == expected["statements"]

    expected = _expected("isotropy.json")
    isotropy = measure_isotropy(store, IsotropyOptions(AnalysisOptions(seed=expected["settings"]["seed"])), write=False)
    compare("isotropy.json", _json_of({"records": isotropy.records}), {"records": expected["records"]})

    expected = _expected("calibration.json")
    fits = expected["fits"]
    calibrated = calibrate_store(store, CalibrationOptions(
        methods=tuple(sorted({fit["method"] for fit in fits}, key=[f["method"] for f in fits].index)),
        layers=tuple(sorted({fit["layer"] for fit in fits})), seed=fits[0]["seed"]), save=False)
    compare("calibration.json", _json_of({"records": calibrated.records}), {"records": expected["records"]})

    benchmarks, _ = default_word_benchmarks()
    for path in sorted((DATA / "minilm_lee_run" / "static").glob("*.benchmarks.json")):
        expected = json.loads(path.read_text())
        embeddings = static_embeddings(store, layer=expected["layer"], **expected["settings"])
        scores = benchmark_static_embeddings(embeddings, benchmarks=benchmarks)
        assert len(embeddings.words) == expected["n_words"]
        compare(f"static/{path.name}", _json_of({"records": scores.to_dict("records")}), {"records": expected["records"]})
    print("largest relative difference per file:", json.dumps(worst, indent=1))
