"""The analysis engine: plan -> tasks -> executor -> merge -> finish, for every per-layer statistic.

An analysis is a plan (`plan_analysis`: data, from the store and one `AnalysisOptions`) of tasks (a
layer, a row range, word groups); `run_task` streams a task's rows through `tally` into the
accumulators of the registered statistics (`statistics`) and returns their states or, for what it
covers entirely, their finished values; a `Merger` adds states up; `layer_values` gives each layer's
values. Executors (`executors`: local, processes, Ray) only schedule the same tasks, through
`AnalysisWork` (the plan and its rows; a pair plan's is `pairs.PairWork`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from lmgeom.progress import NoProgress, Progress
from lmgeom.engine.executors import Executor, LocalExecutor, ProcessExecutor, RayExecutor, executor_for
from lmgeom.engine.loop import Feed, tally
from lmgeom.engine.options import CONTEXTUALITY_STATISTICS, DEFAULT_MEV_MEMORY_MB, AnalysisOptions
from lmgeom.engine.arrays import PlanArrays, plan_word_groups
from lmgeom.engine.plan import AnalysisPlan, Task, plan_analysis
from lmgeom.engine.selection import RowSelection, WordSelection, select_rows, select_words
from lmgeom.engine.registry import register_statistic, statistic
from lmgeom.engine.statistics import ROWS, WORD_GROUPS, LayerValues, Statistic
from lmgeom.engine.tasks import AnalysisState, AnalysisWork, Merger, TaskOutput, run_task
from lmgeom.store import RepresentationStore


@dataclass
class Analysis:
    """A finished analysis: its plan, the per-row arrays (the words analysed), each layer's values,
    and the executor that ran it."""

    plan: AnalysisPlan
    rows: PlanArrays
    layers: dict[int, LayerValues]
    executor: str

    def to_json(self) -> dict[str, Any]:
        return {**self.plan.to_json(), "executor": self.executor}


def run_analysis(store: RepresentationStore, options: AnalysisOptions, *, executor: Executor | None = None,
                 progress: Progress | None = None, label: str = "analyze", inputs: Mapping[int, Any] | None = None) -> Analysis:
    """Plan `options` on `store`, run its tasks on `executor` (default `executor_for(options)`), merge
    and finish them: each layer's values. `inputs`: each layer's values of an earlier analysis, which
    the statistics of a second stage (`Statistic.takes_inputs`) are made from."""
    store = store.at_site(options.site)
    plan, rows = plan_analysis(store, options, inputs=inputs)
    executor = executor or executor_for(options)
    progress = progress or NoProgress()
    merger = Merger(plan, rows)
    progress.start(label, len(plan.tasks), unit="tasks")
    if plan.tasks:  # the first task may read a whole layer before anything advances: say so at once
        progress.advance(label, 0, note=f"layer {plan.tasks[0].layer} first, {len(plan.tasks)} tasks on {executor.name}")
    for output in executor.run(store, AnalysisWork(plan, rows), plan.tasks):
        merger.add(output)
        progress.advance(label, note=f"layer {output.task.layer}")
    layers = merger.layers()
    store.check_unchanged()  # every layer is read: the numbers are of the store opened, not of one rewritten since
    return Analysis(plan, rows, layers, executor.name)


__all__ = [
    "CONTEXTUALITY_STATISTICS", "DEFAULT_MEV_MEMORY_MB", "ROWS", "WORD_GROUPS", "Analysis", "AnalysisOptions", "AnalysisPlan",
    "AnalysisState", "AnalysisWork", "Executor", "Feed", "LayerValues", "LocalExecutor", "Merger", "PlanArrays", "ProcessExecutor", "RayExecutor",
    "RowSelection", "Statistic", "Task", "TaskOutput", "executor_for", "plan_analysis", "plan_word_groups", "register_statistic",
    "run_analysis", "run_task", "select_rows", "select_words", "statistic", "tally", "WordSelection",
]
