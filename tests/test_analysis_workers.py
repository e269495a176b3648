"""`analyze_store(num_workers=N)`: layers analysed at once in spawned worker processes give the
numbers of one process bit for bit (the same code on the same rows), MEV word groups spooled inside
the workers included; a worker's error reaches the caller with the message it has in-process; a
worker count below 1 is refused. One pool per test: spawning one costs about 2 s."""

from __future__ import annotations

import os
import sys
import uuid
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import fsspec
import numpy as np
import pandas as pd
import pytest

from lmgeom.stages import analyze_store
from lmgeom.engine import AnalysisOptions, plan_analysis
from lmgeom.store import CorruptStore, layout, write_store_from_arrays
from lmgeom.store.location import Location

from helpers import RecordedProgress, synthetic_store

EXECUTORS = sys.modules["lmgeom.engine.executors"]
COUNTS = {f"often{i}": 150 for i in range(3)} | {f"rare{i}": 4 + i % 7 for i in range(60)}
SMALL_BUDGET_MB = 0.02  # several MEV word groups: all but the first go through a worker's spools


@pytest.fixture
def pools(monkeypatch: Any) -> list[int]:
    """The size of every process pool the analysis starts; as many CPUs as it asks for, so that a
    pool runs on a one-CPU machine too, and tiny layers big enough for one."""
    sizes: list[int] = []

    class RecordedPool(ProcessPoolExecutor):
        def __init__(self, max_workers: int, **options: Any) -> None:
            sizes.append(max_workers)
            super().__init__(max_workers, **options)

    monkeypatch.setattr(EXECUTORS, "ProcessPoolExecutor", RecordedPool)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(EXECUTORS, "POOL_MIN_LAYER_VALUES", 0)
    return sizes


@pytest.fixture
def scratch(tmp_path: Any, monkeypatch: Any) -> Any:
    """TMPDIR, which the spawned workers inherit, made an empty folder of this test's own."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    return folder


@pytest.mark.processes
def test_layers_in_worker_processes_give_the_numbers_of_one_process(tmp_path: Any, pools: list[int], scratch: Any) -> None:
    store = synthetic_store(tmp_path / "store", dim=24, counts=COUNTS, n_layers=3, sentence_length=6)
    options = {"min_contexts": 2, "n_samples": 100, "mev_memory_mb": SMALL_BUDGET_MB, "device": "cpu"}
    assert plan_analysis(store, AnalysisOptions(min_contexts=2, mev_memory_mb=SMALL_BUDGET_MB))[0].n_groups >= 2

    one = analyze_store(store, **options)
    progress = RecordedProgress()
    parallel = analyze_store(store, **options, num_workers=2, progress=progress)
    # what runs first, said at once, then each layer as it is done
    assert pools == [2] and progress.notes[0] == "layer 0 first, 3 tasks on processes"
    assert sorted(progress.notes[1:]) == ["layer 0", "layer 1", "layer 2"]
    assert list(os.scandir(scratch)) == []  # every worker removed its spools

    pd.testing.assert_frame_equal(parallel.summary(), one.summary(), check_exact=True)
    pd.testing.assert_frame_equal(parallel.layers, one.layers, check_exact=True)
    pd.testing.assert_frame_equal(parallel.words, one.words, check_exact=True)
    for column in (c for c in one.words if c.startswith("mev_")):
        assert one.words[column].notna().any()
        np.testing.assert_array_equal(parallel.words[column].to_numpy(), one.words[column].to_numpy())
    assert parallel.counts == one.counts and parallel.findings == one.findings


@pytest.mark.processes
def test_an_error_in_a_worker_reaches_the_caller_with_its_message(tmp_path: Any, pools: list[int]) -> None:
    rng = np.random.default_rng(3)
    sentences = [["a", "b", "c", "a"], ["b", "c", "a"], ["c", "a", "b"]]
    layers = [rng.standard_normal((10, 8)).astype(np.float32) for _ in range(3)]
    store = write_store_from_arrays(tmp_path / "store", layers, sentences)
    store.location.open_array(layout.LAYERS, "1", mode="r+")[4, 2] = np.nan  # the writer refuses NaN: spoil it after

    # the chunk no longer has its recorded checksum: refused as it is read, in this process or a worker
    with pytest.raises(CorruptStore, match=r"layer 1: chunk file .* is damaged or was edited") as in_process:
        analyze_store(store, min_contexts=2, device="cpu")
    with pytest.raises(CorruptStore, match="is damaged or was edited") as in_worker:
        analyze_store(store, min_contexts=2, device="cpu", num_workers=2)
    assert pools == [2] and str(in_worker.value) == str(in_process.value) and in_worker.value.path == "layers/1/c/0/0"


def test_a_worker_count_below_one_is_refused(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="`num_workers` must be at least 1"):
        analyze_store(tmp_path / "no store", num_workers=0)


def test_a_store_in_memory_is_analysed_in_this_process(tmp_path: Any, pools: list[int]) -> None:
    """Worker processes could not read a memory:// store: it is analysed here, whatever `num_workers`."""
    local = synthetic_store(tmp_path / "store", dim=8, counts={"a": 6, "b": 5}, n_layers=2, sentence_length=3)
    url = f"memory://lmgeom-tests/{uuid.uuid4().hex}"
    fsspec.filesystem("memory").put(f"{local.path}/", Location.of(url).root, recursive=True)
    result = analyze_store(url, min_contexts=2, device="cpu", num_workers=2)
    assert pools == []
    pd.testing.assert_frame_equal(result.words, analyze_store(local, min_contexts=2, device="cpu").words, check_exact=True)


@pytest.mark.processes
def test_layers_too_small_for_a_worker_are_analysed_in_this_process(tmp_path: Any, pools: list[int], monkeypatch: Any) -> None:
    """Below `POOL_MIN_LAYER_VALUES` analysed values a layer costs less than starting a worker."""
    local = synthetic_store(tmp_path / "store", dim=8, counts={"a": 6, "b": 5}, n_layers=2, sentence_length=3)
    analysed_values = 11 * 8  # every row of the two words, d = 8
    monkeypatch.setattr(EXECUTORS, "POOL_MIN_LAYER_VALUES", analysed_values + 1)
    analyze_store(local, min_contexts=2, device="cpu", num_workers=2)
    assert pools == []
    monkeypatch.setattr(EXECUTORS, "POOL_MIN_LAYER_VALUES", analysed_values)
    analyze_store(local, min_contexts=2, device="cpu", num_workers=2)
    assert pools == [2]
