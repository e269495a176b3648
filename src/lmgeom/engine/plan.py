"""The plan of an analysis: what is computed (data, recorded in the results) and the tasks it is cut into.

`plan_analysis(store, options)` checks the options against the store and cuts the work into `Task`s:
a layer, a range of its rows, and which statistics of it: the row statistics (over the selected rows)
and/or the word statistics of some word groups (the analysed words, grouped so that each group's MEV
state fits `mev_memory_mb`). With `row_parts` 1 a layer is one task (one read of the layer feeds
everything; the word groups after the first wait in scratch files); with more, each row range is a
task for the row statistics and one per word group, so no task holds the state of every word.

The plan is data: options, statistic names, layers, store identity and tasks, `to_json()` for the
result files. The per-row arrays every task reads (`PlanArrays`: the row selection, the analysed
words, the seeded samples, the word groups) follow from the store and the options alone; they are
built once by the driver and handed to each worker once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from lmgeom.errors import InputError
from lmgeom.engine.arrays import PlanArrays
from lmgeom.engine.bootstrap import bootstrap_statistics
from lmgeom.engine.options import AnalysisOptions
from lmgeom.engine.registry import statistic
from lmgeom.engine.statistics import ROWS, Statistic
from lmgeom.engine.loop import row_range
from lmgeom.store import RepresentationStore

PLAN_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Task:
    """Rows [start, stop) of `layer`: the row statistics (`rows`) and the word statistics of `groups`."""

    layer: int
    start: int
    stop: int
    rows: bool
    groups: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"layer": self.layer, "start": self.start, "stop": self.stop, "rows": self.rows, "groups": list(self.groups)}


@dataclass(frozen=True)
class AnalysisPlan:
    """What an analysis computes and the tasks it runs; every task and shard of one analysis shares it."""

    options: AnalysisOptions
    statistics: tuple[Statistic, ...]
    layers: tuple[int, ...]
    n_rows: int
    n_groups: int
    device: str  # the device resolved from `options.device` (`cpu`, `cuda:0`, `torch:cpu`)
    store_identity: dict[str, Any]
    tasks: tuple[Task, ...]

    def of_scope(self, scope: str) -> tuple[Statistic, ...]:
        return tuple(stat for stat in self.statistics if stat.scope == scope)

    def to_json(self) -> dict[str, Any]:
        """The plan as the result files record it."""
        return {"schema_version": PLAN_SCHEMA_VERSION, "statistics": [stat.name for stat in self.statistics],
                "mev_variants": list(self.options.mev_variants), "layers": list(self.layers), "rows": self.n_rows,
                "word_groups": self.n_groups, "device": self.device, "store": self.store_identity,
                "tasks": [task.to_json() for task in self.tasks]}


def row_partitions(first_rows: np.ndarray, n_rows: int, parts: int) -> list[tuple[int, int]]:
    """About `parts` row ranges of similar size covering [0, n_rows), each starting at a sentence's first row."""
    targets = np.linspace(0, n_rows, max(1, parts) + 1)[1:-1]
    cuts = np.unique(first_rows[np.clip(np.searchsorted(first_rows, targets), 0, len(first_rows) - 1)])
    bounds = [0, *[int(c) for c in cuts if 0 < c < n_rows], n_rows]
    return list(zip(bounds[:-1], bounds[1:]))


def store_identity(store: RepresentationStore) -> dict[str, Any]:
    """What makes states of two analyses comparable: the store they read."""
    meta = store.meta
    return {key: meta.get(key) for key in ("model_id", "model_fingerprint", "corpus_fingerprint", "n_tokens", "n_layers", "dim")}


def resolved_device(device: str) -> str:
    """`device` resolved once for every task (a worker told `cpu` never imports torch)."""
    if device == "cpu":
        return "cpu"
    from lmgeom.device import resolve_analysis_device

    target = resolve_analysis_device(device)
    return "torch:cpu" if device == "torch:cpu" else ("cpu" if target is None else str(target))


def plan_analysis(store: RepresentationStore, options: AnalysisOptions = AnalysisOptions(), *,
                  rows: range | tuple[int, int] | None = None,
                  inputs: Mapping[int, Any] | None = None) -> tuple[AnalysisPlan, PlanArrays]:
    """The plan of `options` on `store` (over store `rows`, default all: a shard's) and its per-row
    arrays (with `inputs`: each layer's values of an earlier analysis, for second-stage statistics)."""
    store = store.at_site(options.site)  # the layers of the site analysed (`resid_post` unless asked)
    statistics = tuple(statistic(name) for name in options.statistics + bootstrap_statistics(options))
    if not statistics:
        raise InputError("give at least one statistic to compute", param="statistics")
    names = {stat.name for stat in statistics}
    for stat in statistics:
        missing = [name for name in stat.requires if name not in names]
        if missing:
            raise InputError(f"the statistic {stat.name!r} needs {', '.join(map(repr, missing))} in `statistics` too",
                             param="statistics")
    word_statistics = any(stat.scope != ROWS for stat in statistics)
    for stat in statistics:
        if options.min_contexts < stat.min_contexts:
            raise InputError(f"`min_contexts` must be at least {stat.min_contexts} for {stat.name} ({stat.description}); "
                             f"got {options.min_contexts}", param="min_contexts")
    # negative layers count from the model's last; a layer the store lacks is an IndexError naming the range
    layers = tuple(store.layers if options.layers is None else
                   (layer + store.n_model_layers if layer < 0 else layer for layer in options.layers))
    for layer in layers:
        store.layer(layer)
    span = row_range(store, rows)
    plan_rows = PlanArrays.of(store, options, inputs)
    n_groups = len(plan_rows.group_words) if word_statistics else 0
    has_rows = any(stat.scope == ROWS for stat in statistics)
    parts = options.row_parts or (2 * options.num_workers if options.engine == "ray" else 1)
    if parts == 1 or rows is not None:
        tasks = tuple(Task(layer, span.start, span.stop, has_rows, tuple(range(n_groups))) for layer in layers)
    else:
        spans = row_partitions(store.sentences["first_row"].to_numpy(), store.n_tokens, parts)
        cut: list[Task] = []
        for layer in layers:
            if has_rows:
                cut += [Task(layer, start, stop, True, ()) for start, stop in spans]
            for group in range(n_groups):
                cut += [Task(layer, start, stop, False, (group,)) for start, stop in spans
                        if plan_rows.group_mask(group)[start:stop].any()]
        tasks = tuple(cut)
    plan = AnalysisPlan(options=options, statistics=statistics, layers=layers, n_rows=store.n_tokens, n_groups=n_groups,
                        device=resolved_device(options.device), store_identity=store_identity(store), tasks=tasks)
    return plan, plan_rows
