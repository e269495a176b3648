"""Thread caps: `lmgeom.threads.share_cores` sets the pools `threadpoolctl` lists, keeps a pool the user
set through the environment, and gives each worker of a pool its share of the cores."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest

from lmgeom.engine.workers import start_worker
from lmgeom.threads import BLAS_VARIABLES, THREAD_VARIABLES, available_cores, pool_threads, share_cores

# the child: numpy, scipy and torch loaded (each pool at its default), then share_cores(WORKERS)
CHILD = """
import json, sys
import numpy, scipy.linalg, torch
from lmgeom.threads import share_cores
share = share_cores(int(sys.argv[1]))
from lmgeom.threads import pool_threads
print(json.dumps({"share": [share.cores, share.workers, share.openmp, share.blas], **pool_threads()}))
"""


def share_in_fresh_process(workers: int, **variables: str) -> dict[str, Any]:
    env = {name: value for name, value in os.environ.items() if name not in THREAD_VARIABLES} | variables
    done = subprocess.run([sys.executable, "-c", CHILD, str(workers)], env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_share_cores_sets_every_loaded_pool_and_the_variables_for_later_ones() -> None:
    cores = available_cores()
    seen = share_in_fresh_process(2)
    share = max(1, cores // 2)
    assert seen["share"] == [cores, 2, share, share]
    assert seen["pools"]["blas"] == [share]  # numpy's and scipy's OpenBLAS
    assert seen["pools"]["openmp"] == [share]  # torch's OpenMP
    assert seen["torch"] == share
    assert seen["variables"] == {name: str(share) for name in THREAD_VARIABLES}


@pytest.mark.skipif(available_cores() < 2, reason="one core: the user's 1 thread and the share look alike")
def test_share_cores_keeps_the_users_omp_num_threads() -> None:
    seen = share_in_fresh_process(1, OMP_NUM_THREADS="1")  # the share would be every core
    assert seen["share"][2:] == [None, None]  # BLAS libraries read OMP_NUM_THREADS too
    assert seen["torch"] == 1
    assert seen["pools"] == {"blas": [1], "openmp": [1]}
    assert seen["variables"] == {"OMP_NUM_THREADS": "1", **dict.fromkeys(BLAS_VARIABLES[:-1])}


@pytest.mark.skipif(available_cores() < 2, reason="one core: the user's 1 thread and the share look alike")
def test_share_cores_keeps_the_users_blas_threads_and_shares_torchs() -> None:
    cores = available_cores()
    seen = share_in_fresh_process(1, OPENBLAS_NUM_THREADS="1")
    assert seen["share"][2:] == [cores, None]
    assert seen["pools"] == {"blas": [1], "openmp": [cores]}
    assert seen["torch"] == cores


def test_share_cores_needs_a_worker() -> None:
    with pytest.raises(ValueError, match="workers must be at least 1"):
        share_cores(0)


def test_each_worker_of_a_pool_runs_its_share_of_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    share = max(1, available_cores() // 2)
    # the pool's initializer as the analysis starts it; torch is imported after it, in the task
    with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn"),
                             initializer=start_worker, initargs=(2,)) as pool:
        seen = list(pool.map(_worker_threads, range(2)))
    for worker in seen:
        assert worker["pools"]["blas"] == [share]
        assert worker["torch"] == share
        assert worker["variables"] == {name: str(share) for name in THREAD_VARIABLES}


def _worker_threads(_: int) -> dict[str, Any]:
    return pool_threads()
