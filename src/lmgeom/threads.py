"""How many threads torch and the BLAS libraries run in a process: the cores shared among its workers.

A process of lmgeom holds several thread pools (`threadpoolctl.threadpool_info()` lists them): torch's
intra-op pool (OpenMP, which torch's MKL shares), numpy's and scipy's OpenBLAS, scikit-learn's OpenMP.
Each defaults to one thread per core it may run on. A pool of N worker processes started with those
defaults runs N times as many threads as there are cores, each spinning while it waits for work
(docs/performance.md, "Threads on a shared CPU"). `share_cores` gives each of N workers its share,
cores / N threads for torch and for BLAS, unless the user chose a number: an environment variable
that sets a pool's threads (`OMP_NUM_THREADS` for OpenMP and torch, `OPENBLAS_NUM_THREADS`,
`MKL_NUM_THREADS` or `OMP_NUM_THREADS` for BLAS) leaves that pool as the user set it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from typing import Any, Iterator

from threadpoolctl import threadpool_limits

OPENMP_VARIABLES = ("OMP_NUM_THREADS",)
"""Variables that set the threads of the OpenMP pools, torch's included (torch reads OMP_NUM_THREADS)."""

BLAS_VARIABLES = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS", "OMP_NUM_THREADS")
"""Variables that set the threads of the BLAS libraries (OpenBLAS and MKL fall back on OMP_NUM_THREADS)."""


@dataclasses.dataclass(frozen=True)
class ThreadShare:
    """What `share_cores` set: the threads of each kind of pool, None where the user's choice was kept."""

    cores: int
    workers: int
    openmp: int | None
    blas: int | None


THREAD_VARIABLES = frozenset(BLAS_VARIABLES)  # every variable that sets a pool's threads (OMP_NUM_THREADS among them)


def pool_threads() -> dict[str, Any]:
    """This process's threads per kind of pool (threadpoolctl's `user_api`: blas, openmp), torch's
    intra-op threads, and the thread variables set in the environment."""
    from threadpoolctl import threadpool_info

    import torch

    pools: dict[str, set[int]] = {}
    for pool in threadpool_info():
        pools.setdefault(pool["user_api"], set()).add(pool["num_threads"])
    return {"pools": {api: sorted(counts) for api, counts in pools.items()}, "torch": torch.get_num_threads(),
            "variables": {name: os.environ.get(name) for name in sorted(THREAD_VARIABLES)}}


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, which `taskset` and container CPU sets
    restrict), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def user_chose(variables: tuple[str, ...]) -> bool:
    """Whether the environment sets any of `variables` (to anything but an empty string)."""
    return any(os.environ.get(name, "").strip() for name in variables)


def share_cores(workers: int) -> ThreadShare:
    """Run this process's torch and BLAS on its share of the cores when `workers` processes (this one
    among them) run at once: `available_cores() // workers` threads each, at least 1.

    For a worker process (a pool's initializer calls it first): the pools loaded already are limited
    now (`threadpoolctl`), torch's too when imported, and the variables the libraries read at their
    start are set for those loaded later. A pool whose variable the user set keeps the user's number."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    cores = available_cores()
    threads = max(1, cores // workers)
    openmp = None if user_chose(OPENMP_VARIABLES) else threads
    blas = None if user_chose(BLAS_VARIABLES) else threads
    if blas is not None:
        for name in BLAS_VARIABLES[:-1]:
            os.environ[name] = str(blas)
        threadpool_limits(limits=blas, user_api="blas")
    if openmp is not None:
        # set last: BLAS_VARIABLES ends with it, and user_chose(BLAS_VARIABLES) was read above
        os.environ["OMP_NUM_THREADS"] = str(openmp)
        threadpool_limits(limits=openmp, user_api="openmp")
        if "torch" in sys.modules:  # not imported for it: a worker that never needs torch saves 1-2 s
            sys.modules["torch"].set_num_threads(openmp)
    return ThreadShare(cores=cores, workers=workers, openmp=openmp, blas=blas)


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch's intra-op pool and every BLAS and OpenMP pool (`threadpool_limits`) at one thread, restored
    after: a computation whose sums must not depend on how many threads split them (MKL's and
    OpenBLAS's products add in an order that follows the threads and, for MKL, the memory alignment a
    process happens to get), so that it gives the same bits in every process, however its pools are set."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(limits=1):
            yield
    finally:
        torch.set_num_threads(before)
