"""Maximum explainable variance (Ethayarajh 2019) and the static embedding: the spectrum of each word's
occurrence matrix, streamed (`MEVAccumulator`: a word's rows kept while they are cheaper than its
d x d moment X^T X, then folded into it), in the three named variants of `lmgeom.metrics.spectrum`.
Zero rows have no direction and are left out."""

from __future__ import annotations

from typing import Any, ClassVar, Iterator, Sequence

import numpy as np
import pandas as pd
from scipy.linalg.blas import dsyrk
from threadpoolctl import threadpool_limits

from lmgeom.errors import InputError
from lmgeom.metrics.base import (
    NonFiniteRows,
    StatefulAccumulator,
    register_accumulator,
    row_ids,
)
from lmgeom.metrics.contextuality import word_index
from lmgeom.metrics.spectrum import CHUNK_BYTES, MEV_VARIANTS, OccurrenceSpectrum, moment_spectrum, mev_variants, rows_spectra


def _one_blas_thread() -> threadpool_limits:
    """Eigenproblems of a few hundred dimensions gain nothing from BLAS threads, and on a busy
    machine lose up to 100x to thread contention: run them on one thread."""
    return threadpool_limits(limits=1, user_api="blas")


def occurrence_spectrum(X: Any) -> OccurrenceSpectrum:
    """The spectrum of one occurrence matrix (zero rows left out; float32 rows stay float32); see
    `OccurrenceSpectrum`."""
    rows, nonzero = _grouped_rows(as_mev_rows(X), np.arange(len(X)))
    X = rows[nonzero]
    if len(X) == 0:
        raise InputError("an occurrence matrix needs at least one non-zero row")
    with _one_blas_thread():
        return rows_spectra([X])[0]


def first_principal_direction(X: Any) -> np.ndarray:
    """The static embedding of an occurrence matrix: unit v1 of the uncentred X, v1 . mean >= 0."""
    return occurrence_spectrum(X).direction


# a word's rows are kept while they take at most this many times the bytes of its d x d float64
# moment X^T X: 2d float64 or 4d float32 rows. Forming X^T X costs 2 n d^2 flops, which at n of a few
# d is more than solving on the rows
MEV_ROW_BYTES_PER_MOMENT = 2


def mev_state_bytes(counts: np.ndarray, dim: int, *, row_bytes: int = 8) -> np.ndarray:
    """The most memory (bytes) `MEVAccumulator` holds for words with these occurrence counts: their
    rows (`row_bytes` a value: 8 for float64, 4 for float32) while they fit `MEV_ROW_BYTES_PER_MOMENT`
    d x d float64 moments, then the moment and the row sum (less than that)."""
    moment = 8 * dim * dim
    return np.minimum(np.asarray(counts, dtype=np.int64) * dim * row_bytes, MEV_ROW_BYTES_PER_MOMENT * moment)


def as_mev_rows(X: Any) -> np.ndarray:
    """2-D numpy rows for MEV without a full-size copy where possible: float32 stays float32 (it is
    converted to float64 a chunk at a time where exactness needs it), anything else becomes float64."""
    if hasattr(X, "detach"):
        X = X.detach().cpu().numpy()
    X = np.asarray(X)
    if X.dtype != np.float32:
        X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"X must be a 2-D (n_points, dim) array, got shape {X.shape}")
    return X


def _grouped_rows(X: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """X[order] and the non-zero mask of its rows, in one pass: each chunk of the copy is checked
    (finite, non-zero) while it is in cache. NaN/inf rows are an error naming the row of X."""
    grouped = np.empty((len(order), X.shape[1]), dtype=X.dtype)
    squared_norms = np.empty(len(order), dtype=X.dtype)
    step = max(1, CHUNK_BYTES // max(1, X.shape[1] * X.itemsize))
    for start in range(0, len(order), step):
        chunk = grouped[start:start + step]
        # mode="clip": with the default mode="raise" numpy buffers `out`, an extra copy of every chunk
        np.take(X, order[start:start + step], axis=0, out=chunk, mode="clip")
        np.einsum("ij,ij->i", chunk, chunk, out=squared_norms[start:start + step])
    nonzero = squared_norms > 0
    # a float32 square can overflow (huge finite rows) or underflow (tiny non-zero rows): check those exactly
    doubtful = np.flatnonzero(~np.isfinite(squared_norms) | ~nonzero)
    if len(doubtful):
        rows = grouped[doubtful]
        finite = np.isfinite(rows).all(axis=1)
        if not finite.all():
            raise NonFiniteRows("X", np.sort(order[doubtful[np.flatnonzero(~finite)]]))
        nonzero[doubtful] = rows.any(axis=1)
    return grouped, nonzero


# float64 rows converted at once when rows are folded into X^T X
MOMENT_BATCH_BYTES = 32 * 2**20


def _float64_batches(blocks: list[np.ndarray], batch_rows: int) -> Iterator[np.ndarray]:
    """The rows of `blocks`, in order, as float64 batches of `batch_rows` (the last one shorter), each
    in the same reused buffer."""
    total = sum(len(block) for block in blocks)
    if total == 0:
        return
    buffer = np.empty((min(batch_rows, total), blocks[0].shape[1]))
    filled = 0
    for block in blocks:
        start = 0
        while start < len(block):
            taken = min(len(buffer) - filled, len(block) - start)
            buffer[filled:filled + taken] = block[start:start + taken]
            filled, start = filled + taken, start + taken
            if filled == len(buffer):
                yield buffer
                filled = 0
    if filled:
        yield buffer[:filled]


@register_accumulator
class MEVAccumulator(StatefulAccumulator):
    """Per-word occurrence matrices, kept as rows (float32 rows stay float32) while they take at most
    `MEV_ROW_BYTES_PER_MOMENT` times the bytes of a d x d float64 moment, then as X^T X and the row sum.

    So a word costs at most `mev_state_bytes`. `result()` solves each word the way a cost model finds
    cheaper: small Gram matrices in batches, a dense scatter matrix, or matrix-free
    (`lmgeom.metrics.spectrum`).
    `add(X, word_ids=...)`: words are integer ids in [0, n_words). Each `add` copies its rows once,
    grouped by word (and checked). With `expected_counts` (an upper bound on each word's occurrences,
    as an analysis plan knows them) the words that will outgrow the row budget go to X^T X from the
    start and the kept rows stay views of that copy; without, a word's kept rows are copied into arrays
    of their own. Either way the state is what `mev_state_bytes` counts: no view keeps rows alive that
    the state no longer holds.
    `variants`: the MEV variants `result()` solves for (`OccurrenceSpectrum`: the others' eigenproblems
    are skipped); like `expected_counts` not part of the state (a loaded accumulator solves for all).
    """

    # the per-word dictionaries, flattened into arrays for `state_dict`
    _state_fields: ClassVar[tuple[str, ...]] = (
        "n_words", "counts", "n_zero", "row_words", "row_blocks", "moment_words", "moment_blocks", "sum_words", "sum_blocks",
    )

    def __init__(self, n_words: int, *, expected_counts: np.ndarray | None = None,
                 variants: Sequence[str] = MEV_VARIANTS) -> None:
        self.n_words = int(n_words)
        self.variants = mev_variants(variants)
        self.rows: dict[int, list[np.ndarray]] = {}
        # X^T X of the words kept as moments: Fortran-ordered, only the upper triangle is kept up to date
        self.second_moments: dict[int, np.ndarray] = {}
        self.row_sums: dict[int, np.ndarray] = {}  # of the words kept as moments
        self.counts = np.zeros(self.n_words, dtype=np.int64)
        self.n_zero = 0
        self._set_expected_counts(expected_counts)

    def _set_expected_counts(self, expected_counts: np.ndarray | None) -> None:
        """`expected_counts`: at most this many occurrences of each word come, over every `add` and
        `merge` (an analysis plan's counts). A word whose rows would outgrow the row budget then goes to
        X^T X from its first rows and the others never do, so kept rows stay views of an `add`'s grouped
        copy (no copy a word). Without it a word keeps rows until they outgrow the budget, and kept rows
        are copied apart, so that no view pins rows that went to X^T X later. The counts are not part
        of the state: a loaded accumulator has none."""
        self.expected_counts = None if expected_counts is None else np.asarray(expected_counts, dtype=np.int64)
        if self.expected_counts is not None and self.expected_counts.shape != (self.n_words,):
            raise ValueError(f"expected_counts has shape {self.expected_counts.shape}; it needs one count for each of "
                             f"the {self.n_words} words")
        self._row_bytes = np.zeros(self.n_words, dtype=np.int64)  # bytes of each word's kept rows

    # -- state as arrays: which word each stored row / moment / sum belongs to, and the blocks
    @property
    def row_words(self) -> np.ndarray:
        return np.array([word for word, blocks in self.rows.items() for block in blocks for _ in block], dtype=np.int64)

    @property
    def row_blocks(self) -> np.ndarray:
        blocks = [block for word_blocks in self.rows.values() for block in word_blocks]
        return np.concatenate(blocks) if blocks else np.zeros((0, 0))

    @property
    def moment_words(self) -> np.ndarray:
        return np.array(list(self.second_moments), dtype=np.int64)

    @property
    def moment_blocks(self) -> np.ndarray:
        moments = [_symmetric(moment) for moment in self.second_moments.values()]
        return np.stack(moments) if moments else np.zeros((0, 0, 0))

    @property
    def sum_words(self) -> np.ndarray:
        return np.array(list(self.row_sums), dtype=np.int64)

    @property
    def sum_blocks(self) -> np.ndarray:
        return np.stack(list(self.row_sums.values())) if self.row_sums else np.zeros((0, 0))

    def load_state_dict(self, state: Any) -> None:
        self.n_words = int(state["n_words"])
        self.counts = np.array(state["counts"], dtype=np.int64)
        self.n_zero = int(state["n_zero"])
        row_words, row_blocks = np.asarray(state["row_words"], dtype=np.int64), as_mev_rows(state["row_blocks"])
        order = np.argsort(row_words, kind="stable")
        words, starts = np.unique(row_words[order], return_index=True)
        self.rows = {int(w): [block] for w, block in zip(words, np.split(row_blocks[order], starts[1:]))} if len(row_words) else {}
        self.second_moments = {int(w): np.array(m, order="F") for w, m in zip(state["moment_words"], state["moment_blocks"])}
        self.row_sums = {int(w): np.array(s) for w, s in zip(state["sum_words"], state["sum_blocks"]) if int(w) in self.second_moments}
        self._set_expected_counts(None)
        self.variants = MEV_VARIANTS
        for word, blocks in self.rows.items():
            self._row_bytes[word] = sum(block.nbytes for block in blocks)

    def _keeps_rows(self, words: np.ndarray, new_counts: np.ndarray, row: np.ndarray) -> np.ndarray:
        """Whether each of `words` (distinct ids) keeps its rows after `new_counts` more rows like `row`."""
        budget = MEV_ROW_BYTES_PER_MOMENT * 8 * row.size * row.size
        if self.expected_counts is not None:
            return self.expected_counts[words] * row.nbytes <= budget
        as_moment = np.array([word in self.second_moments for word in words.tolist()], dtype=bool)
        return ~as_moment & (self._row_bytes[words] + new_counts * row.nbytes <= budget)

    def _add_to_moment(self, word: int, block: np.ndarray) -> None:
        """Fold `block` (and the word's rows, if it had any) into the word's X^T X and row sum, in
        float64 batches of `MOMENT_BATCH_BYTES` added in place: no float64 copy of all the rows and no
        d x d temporary (at d = 4,096 those were 0.5 GB and 134 MB beside a 134 MB moment)."""
        blocks = self.rows.pop(word, []) + [block]
        self._row_bytes[word] = 0
        dim = block.shape[1]
        if word not in self.second_moments:
            self.second_moments[word], self.row_sums[word] = np.zeros((dim, dim), order="F"), np.zeros(dim)
        moment, row_sum = self.second_moments[word], self.row_sums[word]
        for rows in _float64_batches(blocks, max(1, MOMENT_BATCH_BYTES // (8 * dim))):
            # a rank-k update of the upper triangle, in place: half the flops of the full product
            moment = dsyrk(1.0, rows.T, beta=1.0, c=moment, overwrite_c=1)
            row_sum += rows.sum(axis=0)
        self.second_moments[word] = moment

    def _add_word_blocks(self, words: np.ndarray, blocks: list[np.ndarray], *, views: bool) -> None:
        """Each of `words` (distinct ids) gets its block of rows, kept or folded into its moment.
        `views`: the blocks are views of one array made for them (an `add`'s grouped copy)."""
        if not blocks:
            return
        new_counts = np.array([len(block) for block in blocks], dtype=np.int64)
        keeps = self._keeps_rows(words, new_counts, blocks[0][0])
        self.counts[words] += new_counts
        self._row_bytes[words[keeps]] += new_counts[keeps] * blocks[0][0].nbytes
        # a view pins its whole base: only where no kept word goes to X^T X later (expected counts) may it stay one
        owned = not views or self.expected_counts is None
        for word, block, kept in zip(words.tolist(), blocks, keeps.tolist()):
            if kept:
                self.rows.setdefault(word, []).append(block.copy() if owned and block.base is not None else block)
            else:
                self._add_to_moment(word, block)

    def _check_expected(self, words: np.ndarray, new_counts: np.ndarray) -> None:
        if self.expected_counts is None:
            return
        over = np.flatnonzero(self.counts[words] + new_counts > self.expected_counts[words])
        if len(over):
            word = int(words[over[0]])
            raise ValueError(f"word {word} gets more than its expected count of {int(self.expected_counts[word])} occurrences; "
                             "expected_counts must bound each word's occurrences over every add and merge")

    def add(self, X: Any, /, **ids: np.ndarray) -> MEVAccumulator:
        X = as_mev_rows(X)
        (word_ids,) = row_ids(ids, ("word_ids",), len(X), type(self).__name__)
        word_ids = word_index(word_ids, self.n_words)
        if not len(X):
            return self
        order = np.argsort(word_ids, kind="stable")
        words, counts = np.unique(word_ids[order], return_counts=True)
        self._check_expected(words, counts)
        # rows of words that go to moments are copied apart, so the copy that stays holds kept rows only
        row_kept = np.repeat(self._keeps_rows(words, counts, X[0]), counts)
        with _one_blas_thread():
            for part in (order[row_kept], order[~row_kept]):
                grouped, nonzero = _grouped_rows(X, part)
                grouped_words = word_ids[part]
                self.n_zero += int((~nonzero).sum())
                if not nonzero.all():
                    grouped, grouped_words = grouped[nonzero], grouped_words[nonzero]
                part_words, starts = np.unique(grouped_words, return_index=True)
                self._add_word_blocks(part_words, np.split(grouped, starts[1:]) if len(part_words) else [], views=True)
        return self

    def merge(self, other: MEVAccumulator) -> MEVAccumulator:
        if other.n_words != self.n_words:
            raise ValueError(f"cannot merge accumulators over {self.n_words} and {other.n_words} words")
        other_words = np.flatnonzero(other.counts)
        self._check_expected(other_words, other.counts[other_words])
        with _one_blas_thread():
            for word, blocks in other.rows.items():
                for block in blocks:
                    self._add_word_blocks(np.array([word]), [block], views=False)
            for word, moment in other.second_moments.items():
                if word in self.rows:
                    self._add_to_moment(word, np.zeros((0, moment.shape[0])))
                self.second_moments[word] = np.asfortranarray(moment + self.second_moments.get(word, 0.0))
                self.row_sums[word] = other.row_sums[word] + self.row_sums.get(word, 0.0)
                self.counts[word] += other.counts[word]
        self.n_zero += other.n_zero
        return self

    def result(self) -> dict[int, OccurrenceSpectrum]:
        """Word id -> spectrum, for every word with at least one non-zero occurrence."""
        with _one_blas_thread():
            spectra = dict(zip(self.rows, rows_spectra(list(self.rows.values()), variants=self.variants)))
            for word, moment in self.second_moments.items():
                spectra[word] = moment_spectrum(int(self.counts[word]), self.row_sums[word], _symmetric(moment), variants=self.variants)
        return dict(sorted(spectra.items()))


def _symmetric(upper: np.ndarray) -> np.ndarray:
    """The symmetric matrix whose upper triangle `upper` holds (as `dsyrk` leaves it)."""
    return np.triu(upper) + np.triu(upper, 1).T


def mev(X: Any, word_ids: np.ndarray, *, variant: str, min_count: int = 2) -> pd.Series:
    """Each word's maximum explainable variance (see `OccurrenceSpectrum` for the three variants).

    `variant` is required: the three definitions give different numbers and are never mixed. Only
    that variant is solved (`MEVAccumulator(variants=...)`). Returns a Series indexed by word, for
    words with at least `min_count` non-zero occurrences.
    """
    if variant not in MEV_VARIANTS:
        raise InputError(f"unknown MEV variant {variant!r}; choose one of {', '.join(MEV_VARIANTS)}")
    labels, inverse = np.unique(np.asarray(word_ids), return_inverse=True)
    accumulator = MEVAccumulator(len(labels), expected_counts=np.bincount(inverse, minlength=len(labels)), variants=(variant,))
    spectra = accumulator.add(X, word_ids=inverse).result()
    kept = [word for word, spectrum in spectra.items() if spectrum.n >= min_count]
    return pd.Series(
        [spectra[word].mev(variant) for word in kept],
        index=pd.Index(labels[kept], name="word"),
        name=f"mev_{variant}",
        dtype=np.float64,
    )


