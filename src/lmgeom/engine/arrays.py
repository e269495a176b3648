"""The per-row arrays of an analysis plan (`PlanArrays`): which store rows are selected, the analysed
words, the seeded samples and the MEV word groups. They follow from the store's token table and the
options alone, so every process builds the same ones; the driver builds them once and hands them to
each worker once. Every statistic's accumulator is made from them."""

from __future__ import annotations

from functools import cached_property
from typing import Any, Callable, Mapping, TypeVar

import numpy as np

from lmgeom.engine.loop import stored_row_bytes
from lmgeom.engine.options import AnalysisOptions
from lmgeom.engine.selection import SELECTION_COLUMNS, RowSelection, WordSelection, select_rows, select_words
from lmgeom.metrics.contextuality import sample_indexes
from lmgeom.metrics.mev import mev_state_bytes
from lmgeom.store import RepresentationStore

T = TypeVar("T")


class PlanArrays:
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
        self._derived: dict[str, Any] = {}

    @classmethod
    def of(cls, store: RepresentationStore, options: AnalysisOptions, inputs: Mapping[int, Any] | None = None) -> PlanArrays:
        # only the columns the selection reads (the vocabulary names the words)
        tokens = store.token_columns(*SELECTION_COLUMNS)
        selection = select_rows(tokens, include_special=options.include_special, include_punct=options.include_punct,
                                exclude_first_word=options.exclude_first_word)
        return cls(selection, store.vocab, options, dim=store.dim, row_bytes=stored_row_bytes(store), inputs=inputs)

    @property
    def rows_read(self) -> int:
        """Rows of each layer the plan reads (what executors size their pools by)."""
        return int(self.selection.mask.sum())

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

    def derived(self, name: str, make: Callable[[PlanArrays], T]) -> T:
        """What a later part of the engine derives from these arrays (the bootstrap's design:
        `lmgeom.engine.bootstrap.design_of`), made on first use and kept with them."""
        if name not in self._derived:
            self._derived[name] = make(self)
        return self._derived[name]

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
