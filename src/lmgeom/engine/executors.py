"""Executors: where a plan's tasks run. They only schedule: what they run is a `Work` (a plan with
its per-row arrays: `AnalysisWork` of `lmgeom.engine.tasks`, `PairWork` of `lmgeom.engine.pairs`),
whose `run(store, task)` is the whole of a task; every output goes back to the caller's merger; no
executor holds a statistic, a loop over rows or an accumulator, or knows which kind of plan it runs.

- `LocalExecutor`: one task after another in this process.
- `ProcessExecutor`: `num_workers` spawned worker processes, each handed the store and the work
  once (by the pool's initializer, not with every task). The same code on the same rows: the
  numbers are those of one process, bit for bit.
- `RayExecutor`: Ray tasks, at most `num_workers` in flight; the work is put in Ray's object store once.
`executor_for(options)` is the one place an executor is chosen from the options.
"""

from __future__ import annotations

import copy
import multiprocessing
from concurrent.futures import ProcessPoolExecutor, as_completed
from types import ModuleType
from typing import Any, Iterator, Protocol, Sequence, TypeVar

from lmgeom.engine.options import AnalysisOptions
from lmgeom.engine.workers import start_worker
from lmgeom.threads import available_cores
from lmgeom.store import RepresentationStore

# a layer of fewer analysed values (rows x d) than this is analysed in the calling process: at 2^26
# (175,000 rows at d = 384) one layer takes about as long as starting a worker process (importing
# numpy, pandas, scipy and zarr), so below it a pool costs more than it saves
POOL_MIN_LAYER_VALUES = 2**26

Output = TypeVar("Output", covariant=True)


class Work(Protocol[Output]):
    """What an executor runs: tasks of one plan, each by `run`, all reading `rows_read` rows of a layer."""

    @property
    def rows_read(self) -> int: ...

    def run(self, store: RepresentationStore, task: Any) -> Output: ...


class Executor(Protocol):
    """Runs tasks of a work and yields their outputs, in any order."""

    name: str

    def run(self, store: RepresentationStore, work: Work[Output], tasks: Sequence[Any]) -> Iterator[Output]: ...


class LocalExecutor:
    name = "local"

    def run(self, store: RepresentationStore, work: Work[Output], tasks: Sequence[Any]) -> Iterator[Output]:
        for task in tasks:
            yield work.run(store, task)


# A worker process's share of a parallel analysis, handed over once per process by the pool's
# initializer rather than pickled with each task (the per-row arrays: about 26 bytes a store row)
_worker_share: tuple[str, Work[Any]] | None = None


def _start_worker(store_url: str, work: Work[Any], pool_size: int) -> None:
    global _worker_share
    start_worker(pool_size)  # a killed caller leaves no worker behind; each worker its share of the cores
    _worker_share = (store_url, work)


def _run_in_worker(task: Any) -> Any:
    assert _worker_share is not None, "a worker runs in a pool started by ProcessExecutor"
    store_url, work = _worker_share
    # opened here, not in the initializer: an error (the store moved, object storage unreachable)
    # reaches the caller with its message instead of breaking the pool
    return work.run(RepresentationStore.open(store_url), task)


class ProcessExecutor:
    name = "processes"

    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers

    def pool_size(self, store: RepresentationStore, work: Work[Any], tasks: Sequence[Any]) -> int:
        """1 (no pool) for a memory:// store (it lives in this process) or layers too small to pay for
        a worker's start; else at most one worker a task and one a CPU."""
        if store.url.startswith("memory://") or work.rows_read * store.dim < POOL_MIN_LAYER_VALUES:
            return 1
        return min(self.num_workers, len(tasks), available_cores())

    def run(self, store: RepresentationStore, work: Work[Output], tasks: Sequence[Any]) -> Iterator[Output]:
        size = self.pool_size(store, work, tasks)
        if size <= 1:
            yield from LocalExecutor().run(store, work, tasks)
            return
        # spawn, not fork: this process has threads (BLAS, the tally's read-ahead), which a fork copies mid-state
        with ProcessPoolExecutor(max_workers=size, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=_start_worker, initargs=(store.url, work, size)) as pool:
            try:
                for finished in as_completed([pool.submit(_run_in_worker, task) for task in tasks]):
                    yield finished.result()  # a worker's exception is raised here, message and all
            except BaseException:
                # tasks not started are dropped; running ones finish and remove their scratch spools
                # (on Ctrl-C the workers, in the terminal's process group, are interrupted too)
                pool.shutdown(cancel_futures=True)
                raise


def _run_on_ray(store_url: str, work: Work[Any], task: Any) -> Any:
    return work.run(RepresentationStore.open(store_url), task)


class RayExecutor:
    name = "ray"

    def __init__(self, num_workers: int, address: str | None = None) -> None:
        self.num_workers = num_workers
        self.address = address

    def run(self, store: RepresentationStore, work: Work[Output], tasks: Sequence[Any]) -> Iterator[Output]:
        from lmgeom.engine.ray import connect_ray

        ray = connect_ray(self.address)
        remote = ray.remote(num_cpus=1)(_run_on_ray)
        shared = ray.put(work)
        submit = [lambda task=task: remote.remote(store.url, shared, task) for task in tasks]
        yield from _bounded(ray, submit, max_in_flight=self.num_workers)


def _bounded(ray: ModuleType, submit: Sequence[Any], *, max_in_flight: int) -> Iterator[Any]:
    """The result of each submitted task as it finishes, with at most `max_in_flight` running."""
    queue = iter(submit)
    running = [start() for _, start in zip(range(max_in_flight), queue)]
    while running:
        (ready,), running = ray.wait(running, num_returns=1)
        following = next(queue, None)
        if following is not None:
            running.append(following())
        # a copy: Ray hands numpy arrays back as read-only views of its object store, and the
        # driver merges other states into them
        yield copy.deepcopy(ray.get(ready))


def executor_for(options: AnalysisOptions) -> Executor:
    """The executor `options.engine` names (`auto`: processes when `num_workers` > 1, else local)."""
    if options.engine == "ray":
        return RayExecutor(options.num_workers, options.ray_address)
    if options.engine == "processes" or (options.engine == "auto" and options.num_workers > 1):
        return ProcessExecutor(options.num_workers)
    return LocalExecutor()
