"""How contextual are representations? Ethayarajh (2019), exact and streaming.

Every cosine average is computed in closed form from sums of unit vectors: for unit rows
u_1..u_n, the mean over ordered pairs j != k of u_j . u_k is (||sum_j u_j||^2 - n) / (n (n - 1)).
So a word's self-similarity needs one d-vector of state, not a list of pairs, and the result is
exact rather than the 1,000-pair sample of the original code.

Zero rows have no direction: they are left out of every cosine and every MEV, and counted
(`n_zero`). NaN/inf rows are an error naming the row (`as_float64_rows`).

Every statistic is an accumulator following `lmgeom.metrics.base` (`add(X, /, **ids)` chunks,
`merge` shards, `result`, `state_dict`); the array-level functions (`average_cosine`,
`self_similarity`, ...) are `Accumulator().add(X, ...).result()`. The closed-form accumulators are
written against the array API (numpy, or torch on any device; see `lmgeom.metrics.base`) and also
read shared `RowBlock`s (`add_block`); labels and counts are kept on the host as numpy, sums in the
rows' own library (a word's unit sums stay on the GPU that computed them).
"""

from __future__ import annotations

from typing import Any, ClassVar

import array_api_compat
import numpy as np
import pandas as pd
import scipy.sparse

from lmgeom.errors import InputError
from lmgeom.metrics.base import (
    RowBlock,
    StatefulAccumulator,
    as_float64_rows,
    group_sums,
    in_namespace_of,
    register_accumulator,
    row_ids,
    to_numpy,
)


# ---------------------------------------------------------------------------------------------
# shared helpers


def _mean_pairwise_cosine(unit_sum: np.ndarray, n: np.ndarray | int) -> Any:
    """Mean cosine over ordered distinct pairs from the sum of n unit vectors (NaN when n < 2)."""
    n = np.asarray(n, dtype=np.float64)
    squared = np.einsum("...i,...i->...", unit_sum, unit_sum)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(n >= 2, (squared - n) / (n * (n - 1)), np.nan)


def row_norms(X: np.ndarray) -> np.ndarray:
    return np.sqrt(np.einsum("ij,ij->i", X, X))


def inverse_norms(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """1 / ||x|| per row (0 for zero rows), and the mask of non-zero rows.

    Sums of unit vectors are then weighted sums of the rows, so no normalised copy is made.
    """
    norms = row_norms(X)
    nonzero = norms > 0
    return np.divide(1.0, norms, out=np.zeros_like(norms), where=nonzero), nonzero


def sum_by_group(values: np.ndarray, groups: np.ndarray, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unique group labels, the (weighted) row sums of `values` within each, and the group sizes."""
    labels, inverse, sizes = np.unique(groups, return_inverse=True, return_counts=True)
    weights = np.ones(len(values)) if weights is None else weights
    # a sparse group-by-row matrix sums every group in one pass over the rows
    membership = scipy.sparse.csr_matrix((weights, (inverse, np.arange(len(values)))), shape=(len(labels), len(values)))
    return labels, np.asarray(membership @ values), sizes


def word_index(word_ids: np.ndarray, n_words: int) -> np.ndarray:
    word_ids = word_ids.astype(np.int64, copy=False)
    if len(word_ids) and (word_ids.min() < 0 or word_ids.max() >= n_words):
        raise InputError(
            f"word_ids must lie in [0, {n_words}) for an accumulator made with n_words={n_words}; "
            f"got values from {word_ids.min()} to {word_ids.max()}"
        )
    return word_ids


def _no_ids(ids: dict[str, np.ndarray], n_rows: int, owner: str) -> None:
    row_ids(ids, (), n_rows, owner)


def _check_dim(state: Any, X: Any, owner: str) -> None:
    if state.shape[-1] and state.shape[-1] != X.shape[1]:
        raise InputError(
            f"{owner} holds vectors of {state.shape[-1]} dimensions but got rows of {X.shape[1]}; "
            "feed rows of one layer of one model only"
        )


def _n_kept(block: RowBlock, keep: np.ndarray | None) -> int:
    return len(block) if keep is None else int(np.count_nonzero(keep))


def _grouped(labels: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(distinct labels, block rows ordered by label, group number of each ordered row)."""
    order = np.argsort(labels, kind="stable")
    distinct, groups = np.unique(labels[order], return_inverse=True)
    return distinct, rows[order], groups


def _state_rows(state: Any, block: RowBlock, n_rows: int) -> Any:
    """Per-word state (n_rows, dim) in the block's library and device, created on the first rows."""
    return block.zeros((n_rows, block.dim)) if state.shape[-1] == 0 else state


def sample_indexes(pool: np.ndarray, n: int, seed: int) -> np.ndarray:
    """`n` distinct entries of `pool` drawn uniformly with `seed` (all of it if it is smaller), sorted."""
    pool = np.asarray(pool)
    if len(pool) <= n:
        return np.sort(pool)
    return np.sort(np.random.default_rng(seed).choice(pool, size=n, replace=False))


# ---------------------------------------------------------------------------------------------
# anisotropy baseline: mean cosine between distinct rows


@register_accumulator
class AverageCosineAccumulator(StatefulAccumulator):
    """Exact mean cosine over all ordered pairs of distinct non-zero rows seen."""

    _state_fields: ClassVar[tuple[str, ...]] = ("unit_sum", "n_points", "n_zero")

    def __init__(self) -> None:
        self.unit_sum = np.zeros(0)  # (dim,) once rows have been seen
        self.n_points = 0
        self.n_zero = 0

    def add(self, X: Any, /, **ids: np.ndarray) -> AverageCosineAccumulator:
        return self.add_block(RowBlock(X), None, **ids)

    def add_block(self, block: RowBlock, keep: np.ndarray | None, /, **ids: np.ndarray) -> AverageCosineAccumulator:
        _no_ids(ids, _n_kept(block, keep), type(self).__name__)
        _check_dim(self.unit_sum, block.X, type(self).__name__)
        unit_sum = to_numpy(block.unit_weights(keep) @ block.X)
        self.unit_sum = unit_sum if not self.unit_sum.size else self.unit_sum + unit_sum
        nonzero = block.nonzero_on_host if keep is None else block.nonzero_on_host[keep]
        self.n_points += int(nonzero.sum())
        self.n_zero += int((~nonzero).sum())
        return self

    def merge(self, other: AverageCosineAccumulator) -> AverageCosineAccumulator:
        if other.unit_sum.size:
            _check_dim(self.unit_sum, other.unit_sum[None, :], type(self).__name__)
            self.unit_sum = other.unit_sum.copy() if not self.unit_sum.size else self.unit_sum + other.unit_sum
        self.n_points += other.n_points
        self.n_zero += other.n_zero
        return self

    def result(self) -> float:
        if self.n_points < 2:
            raise InputError(
                f"the average cosine needs at least 2 non-zero rows, got {self.n_points} "
                f"({self.n_zero} zero rows were left out)"
            )
        return float(_mean_pairwise_cosine(self.unit_sum, self.n_points))


def average_cosine(X: Any) -> float:
    """Exact mean cosine similarity over all ordered pairs of distinct non-zero rows of X."""
    return AverageCosineAccumulator().add(X).result()


def sampled_average_cosine(X: Any, n: int = 1000, seed: int = 0) -> float:
    """`average_cosine` of `n` non-zero rows drawn uniformly without replacement (all if fewer).

    This is the estimate the paper reports (it sampled 1,000 occurrences); `average_cosine` is
    the exact value it estimates.
    """
    X = as_float64_rows(X)
    nonzero = np.flatnonzero(row_norms(X) > 0)
    return average_cosine(X[sample_indexes(nonzero, n, seed)])


@register_accumulator
class MeanNormAccumulator(StatefulAccumulator):
    """Mean Euclidean norm of the rows seen (zero rows included)."""

    _state_fields: ClassVar[tuple[str, ...]] = ("norm_sum", "n_rows")

    def __init__(self) -> None:
        self.norm_sum = 0.0
        self.n_rows = 0

    def add(self, X: Any, /, **ids: np.ndarray) -> MeanNormAccumulator:
        return self.add_block(RowBlock(X), None, **ids)

    def add_block(self, block: RowBlock, keep: np.ndarray | None, /, **ids: np.ndarray) -> MeanNormAccumulator:
        n_kept = _n_kept(block, keep)
        _no_ids(ids, n_kept, type(self).__name__)
        norms = block.norms if keep is None else block.xp.where(block.on_device(keep), block.norms, 0.0)
        self.norm_sum += float(block.xp.sum(norms))
        self.n_rows += n_kept
        return self

    def merge(self, other: MeanNormAccumulator) -> MeanNormAccumulator:
        self.norm_sum += other.norm_sum
        self.n_rows += other.n_rows
        return self

    def result(self) -> float:
        return self.norm_sum / max(self.n_rows, 1)


@register_accumulator
class RowSampleAccumulator(StatefulAccumulator):
    """Collects the rows whose global index is in `sample_rows` (a seeded sample drawn up front), so
    statistics of a sample (the paper's 1,000-occurrence baselines) stream and merge like the others.

    `add(X, rows=...)` takes each row's global index (its row number in the store)."""

    _state_fields: ClassVar[tuple[str, ...]] = ("sample_rows", "seen_rows", "seen")

    def __init__(self, sample_rows: np.ndarray) -> None:
        self.sample_rows = np.unique(np.asarray(sample_rows, dtype=np.int64))
        self.seen_rows = np.zeros(0, dtype=np.int64)
        self.seen = np.zeros((0, 0))

    def add(self, X: Any, /, **ids: np.ndarray) -> RowSampleAccumulator:
        return self.add_block(RowBlock(X), None, **ids)

    def add_block(self, block: RowBlock, keep: np.ndarray | None, /, **ids: np.ndarray) -> RowSampleAccumulator:
        (rows,) = row_ids(ids, ("rows",), _n_kept(block, keep), type(self).__name__)
        wanted = np.isin(rows, self.sample_rows)
        if wanted.any():
            self._append(rows[wanted].astype(np.int64), to_numpy(block.X[block.on_device(block.kept(keep)[wanted])]))
        return self

    def _append(self, rows: np.ndarray, X: np.ndarray) -> None:
        if np.isin(rows, self.seen_rows).any():
            raise ValueError("a sampled row was added twice; shards must cover disjoint rows")
        self.seen = X.copy() if not self.seen.size else np.concatenate([self.seen, X])
        self.seen_rows = np.concatenate([self.seen_rows, rows])

    def merge(self, other: RowSampleAccumulator) -> RowSampleAccumulator:
        if not np.array_equal(other.sample_rows, self.sample_rows):
            raise ValueError("cannot merge row samples drawn differently (another seed, size or selection)")
        if other.seen_rows.size:
            self._append(other.seen_rows, other.seen)
        return self

    def result(self) -> np.ndarray:
        """The sampled rows seen, in global row order."""
        return self.seen[np.argsort(self.seen_rows, kind="stable")]


# ---------------------------------------------------------------------------------------------
# the bootstrap's summaries: sums of unit vectors per resampling unit, and per (word, unit)


@register_accumulator
class UnitSumsAccumulator(StatefulAccumulator):
    """Sums of unit vectors and non-zero counts per resampling unit (`unit_*`, over every row) and per
    (word, unit) (`pair_*`, over the rows of a word, word id >= 0): what a sentence bootstrap of the
    anisotropy baseline and of self-similarity resamples (`lmgeom.metrics.bootstrap.pair_mean`).

    `add(X, unit_ids=..., word_ids=...)`: units in [0, n_units), words -1 (none) or >= 0. A chunk's
    sums are kept as they come and added up by key when the state is read (`consolidate`): rows come
    in sentence order, so only a unit at a chunk's edge has sums in two chunks."""

    _state_fields: ClassVar[tuple[str, ...]] = ("n_units", "unit_keys", "unit_sums", "unit_counts",
                                                "pair_keys", "pair_sums", "pair_counts")

    def __init__(self, n_units: int) -> None:
        self.n_units = int(n_units)
        self._parts: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {"unit": [], "pair": []}
        self._consolidated: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def add(self, X: Any, /, **ids: np.ndarray) -> UnitSumsAccumulator:
        return self.add_block(RowBlock(X), None, **ids)

    def add_block(self, block: RowBlock, keep: np.ndarray | None, /, **ids: np.ndarray) -> UnitSumsAccumulator:
        unit_ids, word_ids = row_ids(ids, ("unit_ids", "word_ids"), _n_kept(block, keep), type(self).__name__)
        unit_ids, word_ids = unit_ids.astype(np.int64, copy=False), word_ids.astype(np.int64, copy=False)
        if len(unit_ids) and (unit_ids.min() < 0 or unit_ids.max() >= self.n_units):
            raise InputError(f"unit_ids must lie in [0, {self.n_units}); got values from {unit_ids.min()} to {unit_ids.max()}")
        rows = block.kept(keep)
        nonzero = block.nonzero_on_host[rows]
        rows, unit_ids, word_ids = rows[nonzero], unit_ids[nonzero], word_ids[nonzero]
        for name, keys, take in (("unit", unit_ids, slice(None)), ("pair", word_ids * self.n_units + unit_ids, word_ids >= 0)):
            keys, taken = keys[take], rows[take]
            if not len(keys):
                continue
            labels, ordered, groups = _grouped(keys, taken)
            sums = group_sums(block.xp, block.X, block.on_device(ordered), block.on_device(groups), len(labels),
                              block.inverse_norms[block.on_device(ordered)])
            self._parts[name].append((labels, to_numpy(sums), np.bincount(groups, minlength=len(labels))))
        self._consolidated = {}
        return self

    def consolidate(self, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(keys ascending, sums, counts) of `name` ("unit" or "pair"), each key once."""
        if name not in self._consolidated:
            parts = self._parts[name]
            if not parts:
                keys, sums, counts = np.zeros(0, dtype=np.int64), np.zeros((0, 0)), np.zeros(0, dtype=np.int64)
            else:
                # the counts ride along as one more column of the sums
                stacked = np.concatenate([np.column_stack([p[1], p[2]]) for p in parts])
                keys, summed, _ = sum_by_group(stacked, np.concatenate([p[0] for p in parts]))
                sums, counts = summed[:, :-1], np.rint(summed[:, -1]).astype(np.int64)
            self._parts[name] = [(keys, sums, counts)] if len(keys) else []
            self._consolidated[name] = (keys, sums, counts)
        return self._consolidated[name]

    @property
    def unit_keys(self) -> np.ndarray:
        return self.consolidate("unit")[0]

    @property
    def unit_sums(self) -> np.ndarray:
        return self.consolidate("unit")[1]

    @property
    def unit_counts(self) -> np.ndarray:
        return self.consolidate("unit")[2]

    @property
    def pair_keys(self) -> np.ndarray:
        return self.consolidate("pair")[0]

    @property
    def pair_sums(self) -> np.ndarray:
        return self.consolidate("pair")[1]

    @property
    def pair_counts(self) -> np.ndarray:
        return self.consolidate("pair")[2]

    def load_state_dict(self, state: Any) -> None:
        self.n_units = int(state["n_units"])
        self._consolidated = {}
        self._parts = {name: ([(np.asarray(state[f"{name}_keys"], dtype=np.int64), np.asarray(state[f"{name}_sums"], dtype=np.float64),
                                np.asarray(state[f"{name}_counts"], dtype=np.int64))] if len(state[f"{name}_keys"]) else [])
                       for name in ("unit", "pair")}

    def merge(self, other: UnitSumsAccumulator) -> UnitSumsAccumulator:
        if other.n_units != self.n_units:
            raise ValueError(f"cannot merge unit sums over {self.n_units} and {other.n_units} units")
        for name in ("unit", "pair"):
            keys, sums, counts = other.consolidate(name)
            if len(keys):
                if self._parts[name] and self._parts[name][0][1].shape[1] != sums.shape[1]:
                    raise InputError("UnitSumsAccumulator holds vectors of another dimension; merge accumulators of one layer")
                self._parts[name].append((keys, sums, counts))
        self._consolidated = {}
        return self

    def result(self) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """{"unit": (unit ids, sums, counts), "pair": (word * n_units + unit, sums, counts)}, keys ascending."""
        return {name: self.consolidate(name) for name in ("unit", "pair")}


# ---------------------------------------------------------------------------------------------
# self-similarity: mean cosine between a word's occurrences


@register_accumulator
class SelfSimilarityAccumulator(StatefulAccumulator):
    """Per-word sums of unit vectors; `result()` is each word's self-similarity.

    `add(X, word_ids=...)`: words are integer ids in [0, n_words). A word with fewer than
    `min_count` non-zero occurrences gets NaN.
    """

    _state_fields: ClassVar[tuple[str, ...]] = ("n_words", "min_count", "unit_sums", "counts", "n_zero")

    def __init__(self, n_words: int, *, min_count: int = 2) -> None:
        if min_count < 2:
            raise InputError(f"self-similarity needs at least 2 occurrences per word; got min_count={min_count}")
        self.n_words = int(n_words)
        self.min_count = int(min_count)
        self.unit_sums = np.zeros((0, 0))  # (n_words, dim) once rows have been seen
        self.counts = np.zeros(self.n_words, dtype=np.int64)
        self.n_zero = 0

    def add(self, X: Any, /, **ids: np.ndarray) -> SelfSimilarityAccumulator:
        return self.add_block(RowBlock(X), None, **ids)

    def add_block(self, block: RowBlock, keep: np.ndarray | None, /, **ids: np.ndarray) -> SelfSimilarityAccumulator:
        (word_ids,) = row_ids(ids, ("word_ids",), _n_kept(block, keep), type(self).__name__)
        word_ids = word_index(word_ids, self.n_words)
        _check_dim(self.unit_sums, block.X, type(self).__name__)
        rows = block.kept(keep)
        nonzero = block.nonzero_on_host[rows]
        rows, word_ids = rows[nonzero], word_ids[nonzero]
        self.n_zero += int((~nonzero).sum())
        if not len(rows):
            return self
        self.unit_sums = _state_rows(self.unit_sums, block, self.n_words)
        labels, ordered, groups = _grouped(word_ids, rows)
        sums = group_sums(block.xp, block.X, block.on_device(ordered), block.on_device(groups), len(labels),
                           block.inverse_norms[block.on_device(ordered)])
        index = in_namespace_of(self.unit_sums, labels)
        self.unit_sums[index] = self.unit_sums[index] + in_namespace_of(self.unit_sums, sums)
        self.counts += np.bincount(word_ids, minlength=self.n_words)
        return self

    def merge(self, other: SelfSimilarityAccumulator) -> SelfSimilarityAccumulator:
        if other.n_words != self.n_words:
            raise ValueError(f"cannot merge accumulators over {self.n_words} and {other.n_words} words")
        if other.unit_sums.shape[-1]:
            _check_dim(self.unit_sums, other.unit_sums, type(self).__name__)
            self.unit_sums = (other.unit_sums.copy() if not self.unit_sums.shape[-1]
                              else self.unit_sums + in_namespace_of(self.unit_sums, other.unit_sums))
        self.counts = self.counts + other.counts
        self.n_zero += other.n_zero
        return self

    def result(self) -> np.ndarray:
        if not self.unit_sums.shape[-1]:
            return np.full(self.n_words, np.nan)
        values = _mean_pairwise_cosine(to_numpy(self.unit_sums), self.counts)
        return np.where(self.counts >= self.min_count, values, np.nan)


def self_similarity(X: Any, word_ids: np.ndarray, *, min_count: int = 2) -> pd.Series:
    """Each word's mean cosine between its occurrences (ordered pairs j != k), exact.

    `word_ids` labels each row (any hashable labels). Returns a Series indexed by word, for the
    words with at least `min_count` non-zero occurrences.
    """
    labels, inverse = np.unique(np.asarray(word_ids), return_inverse=True)
    values = SelfSimilarityAccumulator(len(labels), min_count=min_count).add(X, word_ids=inverse).result()
    kept = ~np.isnan(values)
    return pd.Series(values[kept], index=pd.Index(labels[kept], name="word"), name="self_similarity")


@register_accumulator
class WordMeanAccumulator(StatefulAccumulator):
    """Per-word mean vector of the rows seen (zero rows included); `add(X, word_ids=...)`."""

    _state_fields: ClassVar[tuple[str, ...]] = ("n_words", "sums", "counts")

    def __init__(self, n_words: int) -> None:
        self.n_words = int(n_words)
        self.sums = np.zeros((0, 0))  # (n_words, dim) once rows have been seen
        self.counts = np.zeros(self.n_words, dtype=np.int64)

    def add(self, X: Any, /, **ids: np.ndarray) -> WordMeanAccumulator:
        return self.add_block(RowBlock(X), None, **ids)

    def add_block(self, block: RowBlock, keep: np.ndarray | None, /, **ids: np.ndarray) -> WordMeanAccumulator:
        (word_ids,) = row_ids(ids, ("word_ids",), _n_kept(block, keep), type(self).__name__)
        word_ids = word_index(word_ids, self.n_words)
        _check_dim(self.sums, block.X, type(self).__name__)
        if not len(word_ids):
            return self
        self.sums = _state_rows(self.sums, block, self.n_words)
        labels, ordered, groups = _grouped(word_ids, block.kept(keep))
        sums = group_sums(block.xp, block.X, block.on_device(ordered), block.on_device(groups), len(labels))
        index = in_namespace_of(self.sums, labels)
        self.sums[index] = self.sums[index] + in_namespace_of(self.sums, sums)
        self.counts += np.bincount(word_ids, minlength=self.n_words)
        return self

    def merge(self, other: WordMeanAccumulator) -> WordMeanAccumulator:
        if other.n_words != self.n_words:
            raise ValueError(f"cannot merge accumulators over {self.n_words} and {other.n_words} words")
        if other.sums.shape[-1]:
            _check_dim(self.sums, other.sums, type(self).__name__)
            self.sums = other.sums.copy() if not self.sums.shape[-1] else self.sums + in_namespace_of(self.sums, other.sums)
        self.counts = self.counts + other.counts
        return self

    def result(self) -> np.ndarray:
        """(n_words, dim) means; a word without rows gets zeros."""
        means: np.ndarray = to_numpy(self.sums) / np.maximum(self.counts, 1)[:, None]
        return means


# ---------------------------------------------------------------------------------------------
# intra-sentence similarity: mean cosine between a sentence's words and the sentence mean


def _reject_completed(ids: np.ndarray, done_ids: np.ndarray, where: str) -> None:
    repeated = np.intersect1d(ids, done_ids)
    if len(repeated):
        raise InputError(
            f"sentence {int(repeated[0])} appears again {where} after it was complete; the rows of a "
            "sentence must be contiguous (keep rows in sentence order)"
        )


@register_accumulator
class IntraSentenceAccumulator(StatefulAccumulator):
    """Per-sentence IntraSim, streaming, with state for the sentences at chunk edges only.

    IntraSim(s) = (1/n) sum_i cos(mean_s, x_i) = (sum_i x_i) . (sum_i u_i) / (n ||sum_i x_i||),
    so a sentence needs its raw sum and unit sum. `add(X, sentence_ids=...)`: the rows of a
    sentence must be contiguous (a store keeps sentences in order). A sentence strictly inside a
    chunk is complete and is reduced to its value at once; the first and last sentence of a chunk
    may continue in a neighbouring chunk or shard, so their sums wait in `pending_*` until `result()`.
    """

    _state_fields: ClassVar[tuple[str, ...]] = (
        "done_ids", "done_values", "pending_ids", "pending_raw", "pending_unit", "pending_counts", "n_zero",
    )

    def __init__(self) -> None:
        self.done_ids = np.zeros(0, dtype=np.int64)
        self.done_values = np.zeros(0)
        self.pending_ids = np.zeros(0, dtype=np.int64)
        self.pending_raw = np.zeros((0, 0))
        self.pending_unit = np.zeros((0, 0))
        self.pending_counts = np.zeros(0, dtype=np.int64)
        self.n_zero = 0

    @staticmethod
    def _sentence_sums(block: RowBlock, rows: np.ndarray, sentence_ids: np.ndarray) -> tuple[np.ndarray, Any, Any, np.ndarray]:
        """(sentence ids, raw sums, unit sums (in the block's library), non-zero rows) of contiguous
        sentences. One grouped sum
        computes both sums, each sentence's raw sum next to its unit sum, so its rows are read from
        memory once and then from cache."""
        starts = np.flatnonzero(np.concatenate([[True], sentence_ids[1:] != sentence_ids[:-1]]))
        sentence = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, len(rows))))
        n_rows = len(rows)
        # entries grouped as sentence 0 raw, sentence 0 unit, sentence 1 raw, ...: rows in order within each
        order = np.argsort(np.concatenate([2 * sentence, 2 * sentence + 1]), kind="stable")
        entries = np.concatenate([rows, rows])[order]
        groups = np.concatenate([2 * sentence, 2 * sentence + 1])[order]
        unit_entry = block.on_device(order >= n_rows)
        weights = block.xp.where(unit_entry, block.inverse_norms[block.on_device(entries)], 1.0)
        sums = group_sums(block.xp, block.X, block.on_device(entries), block.on_device(groups), 2 * len(starts), weights)
        return sentence_ids[starts], sums[0::2, :], sums[1::2, :], np.diff(np.append(starts, n_rows))

    @staticmethod
    def _values(raw: Any, unit: Any, counts: np.ndarray) -> np.ndarray:
        """Per-sentence IntraSim from its sums, computed in their own library; returned as numpy."""
        xp = array_api_compat.array_namespace(raw)
        with np.errstate(divide="ignore", invalid="ignore"):
            # a sentence whose vectors sum to zero has no mean direction: NaN, left out of layer means
            values = xp.linalg.vecdot(raw, unit) / (in_namespace_of(raw, counts) * xp.linalg.vector_norm(raw, axis=1))
        return to_numpy(values)

    def _merge_pending(self, ids: np.ndarray, raw: np.ndarray, unit: np.ndarray, counts: np.ndarray) -> None:
        if not self.pending_ids.size:
            self.pending_raw = np.zeros((0, raw.shape[1]))
            self.pending_unit = np.zeros((0, raw.shape[1]))
        all_ids = np.concatenate([self.pending_ids, ids])
        self.pending_ids, self.pending_raw, _ = sum_by_group(np.concatenate([self.pending_raw, raw]), all_ids)
        _, self.pending_unit, _ = sum_by_group(np.concatenate([self.pending_unit, unit]), all_ids)
        _, summed_counts, _ = sum_by_group(np.concatenate([self.pending_counts, counts])[:, None], all_ids)
        self.pending_counts = summed_counts[:, 0].astype(np.int64)

    def add(self, X: Any, /, **ids: np.ndarray) -> IntraSentenceAccumulator:
        return self.add_block(RowBlock(X), None, **ids)

    def add_block(self, block: RowBlock, keep: np.ndarray | None, /, **ids: np.ndarray) -> IntraSentenceAccumulator:
        (sentence_ids,) = row_ids(ids, ("sentence_ids",), _n_kept(block, keep), type(self).__name__)
        sentence_ids = sentence_ids.astype(np.int64, copy=False)
        if len(sentence_ids) == 0:
            return self
        starts = np.flatnonzero(np.concatenate([[True], sentence_ids[1:] != sentence_ids[:-1]]))
        if len(starts) != len(np.unique(sentence_ids)):
            raise ValueError("the rows of each sentence must be contiguous within a chunk (keep rows in sentence order)")
        _reject_completed(sentence_ids[starts], self.done_ids, "in a later chunk")
        edges = [sentence_ids[0], sentence_ids[-1]]
        rows = block.kept(keep)
        nonzero = block.nonzero_on_host[rows]
        self.n_zero += int((~nonzero).sum())
        rows, sentence_ids = rows[nonzero], sentence_ids[nonzero]
        if not len(rows):
            return self
        ids_kept, raw, unit, counts = self._sentence_sums(block, rows, sentence_ids)
        at_edge = np.isin(ids_kept, edges)
        inside = ~at_edge
        continued = np.isin(ids_kept[inside], self.pending_ids)
        if continued.any():
            raise InputError(
                f"sentence {int(ids_kept[inside][continued][0])} continues inside a later chunk; the rows of a "
                "sentence must be contiguous (keep rows in sentence order)"
            )
        self.done_ids = np.concatenate([self.done_ids, ids_kept[inside]])
        on_device = block.on_device(inside)
        self.done_values = np.concatenate([self.done_values, self._values(raw[on_device], unit[on_device], counts[inside])])
        if at_edge.any():
            edge = block.on_device(at_edge)
            self._merge_pending(ids_kept[at_edge], to_numpy(raw[edge]), to_numpy(unit[edge]), counts[at_edge])
        return self

    def merge(self, other: IntraSentenceAccumulator) -> IntraSentenceAccumulator:
        _reject_completed(np.concatenate([other.done_ids, other.pending_ids]), self.done_ids, "in a merged shard")
        _reject_completed(self.pending_ids, other.done_ids, "in a merged shard")
        self.done_ids = np.concatenate([self.done_ids, other.done_ids])
        self.done_values = np.concatenate([self.done_values, other.done_values])
        if other.pending_ids.size:
            self._merge_pending(other.pending_ids, other.pending_raw, other.pending_unit, other.pending_counts)
        self.n_zero += other.n_zero
        return self

    def result(self) -> pd.Series:
        """IntraSim per sentence (indexed by sentence id); NaN where a sentence's vectors sum to zero."""
        ids, values = self.done_ids, self.done_values
        if self.pending_ids.size:
            ids = np.concatenate([ids, self.pending_ids])
            values = np.concatenate([values, self._values(self.pending_raw, self.pending_unit, self.pending_counts)])
        order = np.argsort(ids, kind="stable")
        return pd.Series(values[order], index=pd.Index(ids[order], name="sentence_id"), name="intra_sentence_similarity")


def intra_sentence_similarity(X: Any, sentence_ids: np.ndarray) -> pd.Series:
    """Each sentence's mean cosine between its words and the sentence's mean vector.

    Rows of a sentence must be contiguous. Returns a Series indexed by sentence id.
    """
    return IntraSentenceAccumulator().add(X, sentence_ids=sentence_ids).result()


@register_accumulator
class WordRowsAccumulator(StatefulAccumulator):
    """Keeps each word's rows (float32, in the order they come) for statistics that sample among a
    word's occurrences after the read (`sampled_self_similarity`).

    `add(X, word_ids=...)`: words are integer ids in [0, n_words)."""

    _state_fields: ClassVar[tuple[str, ...]] = ("n_words", "word_ids", "rows")

    def __init__(self, n_words: int) -> None:
        self.n_words = int(n_words)
        self.word_ids = np.zeros(0, dtype=np.int64)
        self.rows = np.zeros((0, 0), dtype=np.float32)
        self._parts: list[tuple[np.ndarray, np.ndarray]] = []

    def _after_load(self) -> None:
        self._parts = []

    def add(self, X: Any, /, **ids: np.ndarray) -> WordRowsAccumulator:
        X = np.asarray(to_numpy(X), dtype=np.float32)
        (word_ids,) = row_ids(ids, ("word_ids",), len(X), type(self).__name__)
        _check_dim(self.rows, X, type(self).__name__)
        self._parts.append((word_index(word_ids, self.n_words), X.copy()))
        return self

    def _flush(self) -> None:
        if self._parts:
            ids, rows = zip(*self._parts)
            self.word_ids = np.concatenate([self.word_ids, *ids])
            self.rows = np.concatenate([self.rows, *rows]) if self.rows.size else np.concatenate(rows)
            self._parts = []

    def state_dict(self) -> dict[str, Any]:
        self._flush()
        return super().state_dict()

    def merge(self, other: WordRowsAccumulator) -> WordRowsAccumulator:
        other._flush()
        if len(other.word_ids):
            self._parts.append((other.word_ids, other.rows))
        return self

    def result(self) -> list[np.ndarray]:
        """Each word's rows, in the order they came."""
        self._flush()
        order = np.argsort(self.word_ids, kind="stable")
        bounds = np.searchsorted(self.word_ids[order], np.arange(self.n_words + 1))
        return [self.rows[order[bounds[w]:bounds[w + 1]]] for w in range(self.n_words)]


def sampled_self_similarity(X: np.ndarray, n_pairs: int, rng: np.random.Generator) -> float:
    """The mean cosine over at most `n_pairs` ordered pairs (i, j), i != j, of the rows of `X`, drawn
    without replacement among all n(n-1) of them when there are more (all of them otherwise), as the
    released code of Ethayarajh (2019) computes self-similarity; a pair with a zero row has no cosine
    and is left out of the mean (`np.nanmean`). NaN for fewer than 2 rows."""
    n = len(X)
    if n < 2:
        return float("nan")
    X = np.asarray(X, dtype=np.float64)
    norms = np.linalg.norm(X, axis=1)
    units = np.divide(X, norms[:, None], out=np.full_like(X, np.nan), where=norms[:, None] > 0)
    total = n * (n - 1)
    if total <= n_pairs:
        i, j = np.nonzero(~np.eye(n, dtype=bool))
    else:
        k = rng.choice(total, size=n_pairs, replace=False)
        i, r = np.divmod(k, n - 1)
        j = r + (r >= i)
    cosines = np.einsum("ij,ij->i", units[i], units[j])
    defined = cosines[~np.isnan(cosines)]
    return float(defined.mean()) if len(defined) else float("nan")
