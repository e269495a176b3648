"""Tasks that read aligned streams: the pair statistics (`PairStatistic`) of pairs of layers, two
layers of one store or a layer of store a and a layer of store b at matched rows.

A side is (store 0 or 1, layer); a job is a pair of sides, or a side with itself (its self pair,
which CKA's denominators need). `plan_pairs` groups the jobs so that a task's accumulator states
fit `max_state_bytes` (each group one read of its sides) and cuts the matched rows into `row_parts`
ranges; each side's rows are shifted by the mean of its first chunk of matched rows (the same shift
in every task, so their states merge, and the sums stay well conditioned). `run_pair_task` streams
a task's sides through `aligned_tally` into one accumulator a job and statistic, and returns their results when it covers every row, else their states, which a
`PairMerger` adds up. The executors run these tasks as they run an analysis's, through `PairWork`
(the plan and its rows: all a worker gets besides the task); a worker opens the second store by its URL,
and reads each store at the capture site the plan records (`sites`: the sites of the stores planned on).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from lmgeom.errors import InputError
from lmgeom.engine.plan import resolved_device, row_partitions, store_identity
from lmgeom.engine.registry import pair_statistics_for
from lmgeom.engine.statistics import PairStatistic
from lmgeom.engine.loop import AlignedFeed, Stream, aligned_tally, read_rows
from lmgeom.sitespec import DEFAULT_SITE
from lmgeom.store import RepresentationStore

Side = tuple[int, int]  # (store 0 or 1, layer)
Job = tuple[Side, Side]  # a pair of sides; (side, side) is the side's self pair


@dataclass(frozen=True)
class PairTask:
    """Matched rows [start, stop) of every job in `jobs`."""

    jobs: tuple[Job, ...]
    start: int
    stop: int

    def sides(self) -> list[Side]:
        return list(dict.fromkeys(side for job in self.jobs for side in job))

    def to_json(self) -> dict[str, Any]:
        return {"jobs": [[list(x), list(y)] for x, y in self.jobs], "start": self.start, "stop": self.stop}


@dataclass(frozen=True)
class PairPlan:
    """What a pair analysis computes and its tasks: the statistics, the stores (by URL: the second is
    the first for layers of one store) and the capture site read of each, the number of matched rows,
    and how the rows are read."""

    statistics: tuple[PairStatistic, ...]
    urls: tuple[str, str]
    n_rows: int
    chunk_rows: int
    device: str
    store_identity: tuple[dict[str, Any], dict[str, Any]]
    tasks: tuple[PairTask, ...]
    sites: tuple[str, str] = (DEFAULT_SITE, DEFAULT_SITE)

    def to_json(self) -> dict[str, Any]:
        return {"statistics": [stat.name for stat in self.statistics], "stores": list(self.store_identity),
                **({"sites": list(self.sites)} if self.sites != (DEFAULT_SITE, DEFAULT_SITE) else {}),
                "rows": self.n_rows, "chunk_rows": self.chunk_rows, "device": self.device,
                "tasks": [task.to_json() for task in self.tasks]}


@dataclass
class PairRows:
    """The per-row arrays of a pair plan: each store's matched rows (ascending; row i of each the same
    word occurrence) and each side's shift."""

    rows: tuple[np.ndarray, np.ndarray]
    shifts: dict[Side, np.ndarray]

    @property
    def rows_read(self) -> int:
        """Rows a task of the plan reads from each side (what executors size their pools by)."""
        return len(self.rows[0])


@dataclass
class PairOutput:
    """What a pair task returns: per job and statistic the accumulator's result (a task over every
    row) or its state (a task over some rows)."""

    task: PairTask
    values: dict[Job, dict[str, Any]] = field(default_factory=dict)
    states: dict[Job, dict[str, Any]] = field(default_factory=dict)


def plan_pairs(stores: Sequence[RepresentationStore], rows: tuple[np.ndarray, np.ndarray], pairs: Sequence[Job], *, measures: Sequence[str], chunk_rows: int, max_state_bytes: int,
               row_parts: int = 1, device: str = "cpu") -> tuple[PairPlan, PairRows]:
    """The plan of the pair statistics that give `measures` over `pairs` of sides of `stores` (one
    store, or two; each read at its `site`) at the matched `rows` of each."""
    statistics = pair_statistics_for(tuple(measures))
    if not statistics:
        raise InputError(f"no pair statistic gives any of {list(measures)}", param="measures")
    if row_parts < 1:
        raise InputError(f"`row_parts` must be at least 1; got {row_parts}", param="row_parts")
    a, b = stores[0], stores[-1]
    sides = list(dict.fromkeys(side for pair in pairs for side in pair))
    jobs: list[Job] = [(side, side) for side in sides] + [pair for pair in pairs if pair[0] != pair[1]]
    dims = {side: (a if side[0] == 0 else b).dim for side in sides}
    groups: list[list[Job]] = [[]]
    used = 0
    for job in jobs:
        size = sum(stat.state_bytes(dims[job[0]], dims[job[1]]) for stat in statistics)
        if groups[-1] and used + size > max_state_bytes:
            groups.append([])
            used = 0
        groups[-1].append(job)
        used += size
    n = len(rows[0])
    first = slice(0, min(n, chunk_rows))  # each side's shift: the mean of its first chunk of matched rows
    shifts = {side: read_rows(a if side[0] == 0 else b, side[1], rows[side[0]][first]).mean(axis=0) for side in sides}
    spans = row_partitions(np.arange(n), n, row_parts) if row_parts > 1 else [(0, n)]
    tasks = tuple(PairTask(tuple(group), start, stop) for group in groups if group for start, stop in spans)
    plan = PairPlan(statistics, (a.url, b.url), n, chunk_rows, resolved_device(device), (store_identity(a), store_identity(b)),
                    tasks, (a.site, b.site))
    return plan, PairRows(rows, shifts)


def run_pair_task(store: RepresentationStore, plan: PairPlan, rows: PairRows, task: PairTask) -> PairOutput:
    """The task's jobs from one aligned read of its sides' rows (`store`: the plan's first store, which
    a worker opens by its URL: each store is read at the plan's site of it)."""
    second = store if plan.urls[1] == store.url else RepresentationStore.open(plan.urls[1])
    stores = [store.at_site(plan.sites[0]), second.at_site(plan.sites[1])]
    sides = task.sides()
    index = {side: i for i, side in enumerate(sides)}
    streams = [Stream(stores[s], layer, rows.rows[s][task.start : task.stop], rows.shifts[(s, layer)]) for s, layer in sides]
    accumulators: dict[Job, dict[str, Any]] = {}
    feeds = []
    for x, y in task.jobs:
        accumulators[(x, y)] = {stat.name: stat.accumulator(rows.shifts[x], None if x == y else rows.shifts[y])
                                for stat in plan.statistics}
        feeds += [AlignedFeed(accumulator, index[x], {} if x == y else {"Y": index[y]}, {"shifted": True})
                  for accumulator in accumulators[(x, y)].values()]
    aligned_tally(streams, feeds, chunk_rows=plan.chunk_rows, device=plan.device)
    output = PairOutput(task)
    if task.start == 0 and task.stop == plan.n_rows:
        output.values = {job: {name: acc.result() for name, acc in by_name.items()} for job, by_name in accumulators.items()}
    else:  # states as numpy (a device's tensors stay where they were made)
        output.states = {job: {name: type(acc).from_state_dict(acc.state_dict()) for name, acc in by_name.items()}
                         for job, by_name in accumulators.items()}
    return output


@dataclass(frozen=True)
class PairWork:
    """A pair plan and its per-row arrays as an executor schedules them (`lmgeom.engine.executors.Work`)."""

    plan: PairPlan
    rows: PairRows

    @property
    def rows_read(self) -> int:
        return self.rows.rows_read

    def run(self, store: RepresentationStore, task: PairTask) -> PairOutput:
        return run_pair_task(store, self.plan, self.rows, task)


class PairMerger:
    """Adds up the outputs of a pair plan's tasks, in any order; `results()` once all are in."""

    def __init__(self, plan: PairPlan) -> None:
        self.plan = plan
        self.values: dict[Job, dict[str, Any]] = {}
        self.pending: dict[Job, dict[str, Any]] = {}
        self.missing: dict[Job, int] = {}
        for task in plan.tasks:
            for job in task.jobs:
                self.missing[job] = self.missing.get(job, 0) + 1

    def add(self, output: PairOutput) -> None:
        self.values.update(output.values)
        for job in output.values:
            self.missing[job] -= 1
        for job, accumulators in output.states.items():
            into = self.pending.setdefault(job, {})
            for name, accumulator in accumulators.items():
                into[name] = into[name].merge(accumulator) if name in into else accumulator
            self.missing[job] -= 1
            if not self.missing[job]:
                self.values[job] = {name: acc.result() for name, acc in self.pending.pop(job).items()}

    def measures(self, x: Side, y: Side) -> dict[str, float]:
        """Every measure of the pair (x, y) from its and both self pairs' results."""
        unfinished = [job for job, left in self.missing.items() if left]
        if unfinished:
            raise RuntimeError(f"tasks of {unfinished[:3]} never reported; the executor lost them")
        measures: dict[str, float] = {}
        for stat in self.plan.statistics:
            measures.update(stat.finish(self.values[(x, y)][stat.name], self.values[(x, x)][stat.name],
                                        self.values[(y, y)][stat.name]))
        return measures
