"""The plan of an analysis: what is computed (data, recorded in the results) and the tasks it is cut into.

`plan_analysis(store, options)` checks the options against the store and cuts the work into `Task`s:
a layer, a range of its rows, and which statistics of it: the row statistics (over the selected rows)
and/or the word statistics of some word groups (the analysed words, grouped so that each group's MEV
state fits `mev_memory_mb`). With `row_parts` 1 a layer is one task (one read of the layer feeds
everything; the word groups after the first wait in scratch files); with more, each row range is a
task for the row statistics and one per word group, so no task holds the state of every word.

The plan is data: options, statistic names, layers, store identity and tasks, `to_json()` for the
result files. The per-row arrays every task reads (`PlanRows`: the row selection, the analysed
words, the seeded samples, the word groups) follow from the store and the options alone; they are
built once by the driver and handed to each worker once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Mapping

import numpy as np

from lmgeom.errors import InputError
from lmgeom.metrics.contextuality import mev_state_bytes, sample_indexes
import lmgeom.runs.engine.released  # noqa: F401  (registers the released code's statistics, which plans name)
from lmgeom.runs.engine.bootstrap import BootstrapDesign, bootstrap_design, bootstrap_statistics
from lmgeom.runs.engine.options import AnalysisOptions
from lmgeom.runs.engine.statistics import ROWS, Statistic, statistic
from lmgeom.runs.selection import SELECTION_COLUMNS, RowSelection, WordSelection, select_rows, select_words
from lmgeom.runs.tally import row_range, stored_row_bytes
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


class PlanRows:
    """The per-row arrays of a plan: the row selection, the analysed words, the seeded samples and
    the word groups (each computed on first use, the same in every process: they follow from the
    store's token table and the options); and `inputs`, each layer's values of an earlier analysis
    that the accumulators of a second stage are made from (`Statistic.takes_inputs`)."""

    def __init__(self, selection: RowSelection, vocab: Any, options: AnalysisOptions, *, dim: int, row_bytes: int,
                 inputs: Mapping[int, Any] | None = None) -> None:
        self.selection = selection
        self.inputs: Mapping[int, Any] = dict(inputs or {})
        self.options = options
        self._vocab = vocab
        self.dim = dim
        self._row_bytes = row_bytes
        self._samples: dict[int, np.ndarray] = {}
        self._group_masks: dict[int, np.ndarray] = {}

    @classmethod
    def of(cls, store: RepresentationStore, options: AnalysisOptions, inputs: Mapping[int, Any] | None = None) -> PlanRows:
        # only the columns the selection reads (the vocabulary names the words)
        tokens = store.token_columns(*SELECTION_COLUMNS)
        selection = select_rows(tokens, include_special=options.include_special, include_punct=options.include_punct,
                                exclude_first_word=options.exclude_first_word)
        return cls(selection, store.vocab, options, dim=store.dim, row_bytes=stored_row_bytes(store), inputs=inputs)

    @cached_property
    def words(self) -> WordSelection:
        words = select_words(self._vocab, self.selection, min_contexts=self.options.min_contexts,
                             count_by=self.options.count_by)
        self._vocab = None  # the selection keeps the names it needs
        return words

    @cached_property
    def row_numbers(self) -> np.ndarray:
        """Each store row's number (the labels of a row sample)."""
        return np.arange(len(self.selection.mask))

    def sample(self, n: int) -> np.ndarray:
        """`n` selected rows drawn with the options' seed (`sample_indexes`), sorted."""
        if n not in self._samples:
            self._samples[n] = sample_indexes(self.selection.rows, n, self.options.seed)
        return self._samples[n]

    @cached_property
    def groups(self) -> np.ndarray:
        """The word group of each analysed word (`plan_word_groups`)."""
        return plan_word_groups(self.words.words["count"].to_numpy(), self.dim, memory_mb=self.options.mev_memory_mb,
                                row_bytes=self._row_bytes)

    @cached_property
    def group_words(self) -> list[np.ndarray]:
        """Each group's words: indexes into the analysed words, ascending."""
        return [np.flatnonzero(self.groups == group) for group in range(int(self.groups.max(initial=-1)) + 1)]

    @cached_property
    def group_of_row(self) -> np.ndarray:
        """Each store row's word group (-1: not a row of an analysed word)."""
        word_index = self.words.word_index
        return np.where(word_index >= 0, self.groups[np.maximum(word_index, 0)], -1)

    @cached_property
    def local_of_row(self) -> np.ndarray:
        """Each store row's word index within its group (-1: none): the ids word statistics count by."""
        local = np.full(len(self.words), -1, dtype=np.int64)
        for words in self.group_words:
            local[words] = np.arange(len(words))
        word_index = self.words.word_index
        return np.where(word_index >= 0, local[np.maximum(word_index, 0)], -1)

    @cached_property
    def bootstrap(self) -> BootstrapDesign:
        """The bootstrap's resampling units and seeded draws (`lmgeom.runs.engine.bootstrap`)."""
        return bootstrap_design(self)

    def group_mask(self, group: int) -> np.ndarray:
        """The store rows of the words of `group` (one array per group, so feeds share its slices)."""
        if group not in self._group_masks:
            self._group_masks[group] = self.group_of_row == group
        return self._group_masks[group]

    def counts(self) -> dict[str, Any]:
        """The counts of the row selection, and of the word selection and groups when words were analysed."""
        counts: dict[str, Any] = dict(self.selection.counts)
        if "words" in self.__dict__:
            counts.update(self.words.counts)
            counts["mev_word_groups"] = len(self.group_words)
        return counts


def plan_word_groups(counts: np.ndarray, dim: int, *, memory_mb: float, row_bytes: int = 8) -> np.ndarray:
    """Group number per word so that each group's MEV state (`mev_state_bytes` of rows of `row_bytes`
    a value: 4 for the float32 rows a float32 or float16 store hands MEV) fits the budget."""
    cost = mev_state_bytes(counts, dim, row_bytes=row_bytes)
    budget = memory_mb * 2**20
    groups = np.zeros(len(cost), dtype=np.int64)
    group, used = 0, 0.0
    for word, bytes_needed in enumerate(cost):
        if used > 0 and used + bytes_needed > budget:
            group, used = group + 1, 0.0
        groups[word] = group
        used += bytes_needed
    return groups


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
                  inputs: Mapping[int, Any] | None = None) -> tuple[AnalysisPlan, PlanRows]:
    """The plan of `options` on `store` (over store `rows`, default all: a shard's) and its per-row
    arrays (with `inputs`: each layer's values of an earlier analysis, for second-stage statistics)."""
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
    layers = tuple(store.layers if options.layers is None else options.layers)
    for layer in layers:
        store.layer(layer)  # an unknown layer is an IndexError naming the range
    span = row_range(store, rows)
    plan_rows = PlanRows.of(store, options, inputs)
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
