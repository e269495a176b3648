"""Running a task, merging states, finishing them: the whole of the engine's computation.

`run_task` streams the task's rows of its layer through `tally` into one accumulator per statistic
(row statistics) and per statistic and word group (word statistics), from one read. A key (a layer's
row statistics, or its word group) that the task covers entirely is finished in the task, one word
group at a time (the spooled statistics of every group but the first wait in a scratch file of their
own, `lmgeom.engine.spool`): the MEV state of a layer is never held whole. The states of a key the task
covers in part are returned; the driver's `Merger` adds the states of every task of a key and
finishes the key once all its tasks are in. `layer_values` then places each group's word values into
arrays over every analysed word.

Shards of a store are tasks over row ranges whose states are kept (`AnalysisState`: saved to `.npz`
without pickle, with a schema version), merged and finished in another process.
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from lmgeom.errors import InputError
from lmgeom.metrics.base import load_states, save_states
from lmgeom.engine.arrays import PlanArrays
from lmgeom.engine.plan import AnalysisPlan, Task
from lmgeom.engine.statistics import ROWS, WORD_GROUPS, LayerValues, Statistic
from lmgeom.engine.spool import RowSpool, scratch_folder
from lmgeom.engine.loop import Feed, RowSink, tally
from lmgeom.store import RepresentationStore

ROW_STATISTICS = -1  # the group of a key that holds a layer's row statistics
Key = tuple[int, int]  # (layer, word group or ROW_STATISTICS)
STATE_SCHEMA_VERSION = 1


@dataclass
class TaskOutput:
    """What a task returns: the finished values of the keys it covers entirely, the accumulators of
    the others."""

    task: Task
    values: dict[Key, LayerValues] = field(default_factory=dict)
    states: dict[Key, dict[str, Any]] = field(default_factory=dict)


def covers_every_row(plan: AnalysisPlan, task: Task) -> bool:
    return task.start == 0 and task.stop == plan.n_rows


def finish_key(statistics: Iterable[Statistic], accumulators: Mapping[str, Any], arrays: PlanArrays,
               words: np.ndarray | None) -> LayerValues:
    values: LayerValues = {}
    for stat in statistics:
        values.update(stat.finish(accumulators[stat.name], arrays, words))
    return values


def run_task(store: RepresentationStore, plan: AnalysisPlan, arrays: PlanArrays, task: Task, *, finish: bool = True) -> TaskOutput:
    """The task's statistics from one read of its rows (see the module docstring). `finish`: finish
    the keys the task covers entirely (False: return every state, as a shard does)."""
    store = store.at_site(plan.options.site)  # a worker opens the store by its URL, at resid_post
    complete = finish and covers_every_row(plan, task)
    output = TaskOutput(task)
    row_statistics = plan.of_scope(ROWS) if task.rows else ()
    word_statistics = plan.of_scope(WORD_GROUPS) if task.groups else ()
    row_accumulators = {stat.name: stat.new_accumulator(arrays, None, task.layer) for stat in row_statistics}
    feeds = [Feed(row_accumulators[stat.name], None if stat.every_row else arrays.selection.mask,
                  stat.labels(arrays) if stat.labels else {}, stat.stored_rows)
             for stat in row_statistics]
    with ExitStack() as cleanup:
        # a complete task spools the spooled statistics of every group but its first
        spooled = [group for group in task.groups[1:]] if complete else []
        scratch = Path(cleanup.enter_context(scratch_folder())) if spooled and any(s.spool for s in word_statistics) else None
        in_read: dict[int, dict[str, RowSink]] = {}
        for group in task.groups:
            words = arrays.group_words[group]
            sinks: dict[str, RowSink] = {}
            for stat in word_statistics:
                if stat.spool and group in spooled:
                    assert scratch is not None
                    sinks[stat.name] = cleanup.enter_context(RowSpool(scratch / f"group-{group}-{stat.name}.rows"))
                else:
                    sinks[stat.name] = stat.new_accumulator(arrays, words, task.layer)
                feeds.append(Feed(sinks[stat.name], arrays.group_mask(group), {"word_ids": arrays.local_of_row}, stat.stored_rows))
            in_read[group] = sinks
        tally(store, task.layer, feeds, rows=(task.start, task.stop), chunk_rows=plan.options.chunk_rows, device=plan.device)
        feeds.clear()
        if row_statistics:
            key = (task.layer, ROW_STATISTICS)
            if complete:
                output.values[key] = finish_key(row_statistics, row_accumulators, arrays, None)
            else:
                output.states[key] = row_accumulators
        for group in task.groups:
            words = arrays.group_words[group]
            sinks = in_read.pop(group)
            accumulators: dict[str, Any] = {}
            for name, sink in sinks.items():
                if isinstance(sink, RowSpool):
                    accumulator = next(stat for stat in word_statistics if stat.name == name).new_accumulator(arrays, words, task.layer)
                    sink.drain(accumulator)
                    accumulators[name] = accumulator
                else:
                    accumulators[name] = sink
            if complete:
                output.values[(task.layer, group)] = finish_key(word_statistics, accumulators, arrays, words)
            else:
                output.states[(task.layer, group)] = accumulators
            del accumulators, sinks  # before the next group's rows are read from its spool: one group's state at a time
    return output



@dataclass(frozen=True)
class AnalysisWork:
    """An analysis's plan and per-row arrays as an executor schedules them (`lmgeom.engine.executors.Work`):
    handed to each worker once, `run` for each task."""

    plan: AnalysisPlan
    rows: PlanArrays

    @property
    def rows_read(self) -> int:
        return self.rows.rows_read

    def run(self, store: RepresentationStore, task: Task) -> TaskOutput:
        return run_task(store, self.plan, self.rows, task)

def merge_accumulators(into: dict[str, Any], other: Mapping[str, Any]) -> None:
    for name, accumulator in other.items():
        if name in into:
            into[name].merge(accumulator)
        else:
            into[name] = accumulator


class Merger:
    """Adds up the outputs of a plan's tasks, in any order: a key's states merge as they come, and the
    key is finished (its states dropped) once every task of it is in."""

    def __init__(self, plan: AnalysisPlan, arrays: PlanArrays) -> None:
        self.plan, self.rows = plan, arrays
        self.values: dict[Key, LayerValues] = {}
        self.pending: dict[Key, dict[str, Any]] = {}
        self.missing: dict[Key, int] = {}
        for task in plan.tasks:
            for key in task_keys(task):
                self.missing[key] = self.missing.get(key, 0) + 1

    def add(self, output: TaskOutput) -> None:
        self.values.update(output.values)
        for key in output.values:
            self.missing[key] -= 1
        for key, accumulators in output.states.items():
            merge_accumulators(self.pending.setdefault(key, {}), accumulators)
            self.missing[key] -= 1
            if not self.missing[key]:
                self.values[key] = finish_pending(self.plan, self.rows, key, self.pending.pop(key))

    def layers(self) -> dict[int, LayerValues]:
        unfinished = [key for key, left in self.missing.items() if left]
        if unfinished:
            raise RuntimeError(f"tasks of {unfinished[:3]} never reported; the executor lost them")
        return layer_values(self.plan, self.rows, self.values)


def task_keys(task: Task) -> list[Key]:
    return ([(task.layer, ROW_STATISTICS)] if task.rows else []) + [(task.layer, group) for group in task.groups]


def finish_pending(plan: AnalysisPlan, arrays: PlanArrays, key: Key, accumulators: Mapping[str, Any]) -> LayerValues:
    layer, group = key
    if group == ROW_STATISTICS:
        return finish_key(plan.of_scope(ROWS), accumulators, arrays, None)
    return finish_key(plan.of_scope(WORD_GROUPS), accumulators, arrays, arrays.group_words[group])


def finish_states(plan: AnalysisPlan, arrays: PlanArrays, states: Mapping[Key, Mapping[str, Any]]) -> dict[int, LayerValues]:
    """Each layer's values from states that hold every row of every key (merged shards)."""
    missing = [key for task in plan.tasks for key in task_keys(task) if key not in states]
    if missing:
        raise InputError(f"the analysis states lack layer {missing[0][0]}'s statistics; were they saved with other settings?")
    return layer_values(plan, arrays, {key: finish_pending(plan, arrays, key, accumulators) for key, accumulators in states.items()})


def layer_values(plan: AnalysisPlan, arrays: PlanArrays, values: Mapping[Key, LayerValues]) -> dict[int, LayerValues]:
    """Each layer's values: its row statistics' as they are, its word statistics' as arrays over every
    analysed word (in the words' order), placed from their groups."""
    layers: dict[int, LayerValues] = {}
    for layer in plan.layers:
        merged: LayerValues = dict(values.get((layer, ROW_STATISTICS), {}))
        for group in range(plan.n_groups):
            words = arrays.group_words[group]
            for name, part in values[(layer, group)].items():
                part = np.asarray(part)
                if name not in merged:
                    merged[name] = np.zeros((len(arrays.words), *part.shape[1:]), dtype=part.dtype)
                merged[name][words] = part
        layers[layer] = merged
    return layers


@dataclass
class AnalysisState:
    """The accumulator states of an analysis over some rows of a store (one shard, or merged shards)."""

    settings: dict[str, Any]  # `AnalysisOptions.analysis_settings()`
    store_identity: dict[str, Any]
    row_ranges: list[tuple[int, int]]
    states: dict[Key, dict[str, Any]] = field(default_factory=dict)

    def merge(self, other: AnalysisState) -> AnalysisState:
        """Add the states of a shard over other rows of the same store, analysed with the same settings."""
        if other.settings != self.settings or other.store_identity != self.store_identity:
            raise InputError("cannot merge analysis states of different stores or settings")
        overlap = [(a, b) for a in self.row_ranges for b in other.row_ranges if a[0] < b[1] and b[0] < a[1]]
        if overlap:
            raise InputError(f"shards overlap (rows {overlap[0][0]} and {overlap[0][1]}); each row may be analysed once")
        for key, accumulators in other.states.items():
            merge_accumulators(self.states.setdefault(key, {}), accumulators)
        self.row_ranges = sorted(self.row_ranges + other.row_ranges)
        return self

    def save(self, path: str | os.PathLike[str]) -> Path:
        """One `.npz` file (no pickle) holding every accumulator's state, the settings and the schema version."""
        states = {f"L{layer}.{'rows' if group == ROW_STATISTICS else f'G{group}'}.{name}": accumulator
                  for (layer, group), accumulators in self.states.items() for name, accumulator in accumulators.items()}
        header = {"kind": "analysis_state", "schema_version": STATE_SCHEMA_VERSION, "settings": self.settings,
                  "store": self.store_identity, "row_ranges": self.row_ranges}
        return save_states(path, states, header=header)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> AnalysisState:
        header, saved = load_states(path)
        if header.get("kind") != "analysis_state":
            raise InputError(f"{path} is not a saved analysis state (it holds {header.get('kind')!r}); "
                             "analyse that shard again with this version of lmgeom")
        if header.get("schema_version") != STATE_SCHEMA_VERSION:
            raise InputError(f"{path} is a saved analysis state of schema version {header.get('schema_version')}, "
                             f"this lmgeom reads version {STATE_SCHEMA_VERSION}; analyse that shard again")
        states: dict[Key, dict[str, Any]] = {}
        for name, accumulator in saved.items():
            layer, part, statistic_name = name.split(".", 2)
            group = ROW_STATISTICS if part == "rows" else int(part.removeprefix("G"))
            states.setdefault((int(layer.removeprefix("L")), group), {})[statistic_name] = accumulator
        return cls(header["settings"], header["store"], [(int(start), int(stop)) for start, stop in header["row_ranges"]],
                   dict(sorted(states.items())))
