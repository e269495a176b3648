"""The analysis's memory (issue 12) and MEV's float32 rows (issue 11): the MEV state of a word group,
counted in the bytes it really holds, stays within the budget the group was planned with; MEV gets a
float32 store's rows as float32 (float16 widened, exactly) and gives the float64 path's numbers."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from lmgeom.metrics import MEV_VARIANTS, MEVAccumulator
from lmgeom.runs import analyze_store, tally
from lmgeom.runs.analysis import AnalysisOptions, mev_feeds, plan_analysis
from lmgeom.store import RepresentationStore, write_store_from_arrays


RTOL = {"uncentred": 1e-9, "centred": 1e-9, "svd_ratio": 1e-6}  # MEV's own (tests/test_mev_spectrum.py)


def synthetic_store(path: Any, *, dim: int, counts: dict[str, int], dtype: type = np.float32, seed: int = 0,
                    sentence_length: int = 10) -> RepresentationStore:
    """One layer: each word's occurrences shuffled into sentences; row = offset + the word's centre + noise."""
    rng = np.random.default_rng(seed)
    words = rng.permutation(np.repeat(np.array(list(counts)), list(counts.values())))
    sentences = [list(words[start:start + sentence_length]) for start in range(0, len(words), sentence_length)]
    centres = {word: rng.standard_normal(dim) for word in counts}
    rows = np.stack([centres[word] for word in words]) + 0.7 * rng.standard_normal((len(words), dim)) + 2.0
    return write_store_from_arrays(path, [rows.astype(dtype)], sentences)


def held_bytes(accumulator: MEVAccumulator) -> int:
    """The memory an MEV state keeps alive: every array its kept rows are views of, counted once,
    and its moments and row sums."""
    bases: dict[int, int] = {}
    for blocks in accumulator.rows.values():
        for block in blocks:
            base = block
            while base.base is not None:
                base = base.base
            bases[id(base)] = base.nbytes
    moments = sum(moment.nbytes for moment in accumulator.second_moments.values())
    return sum(bases.values()) + moments + sum(row_sum.nbytes for row_sum in accumulator.row_sums.values())


class MeasuredMEV(MEVAccumulator):
    """MEV that records the bytes it holds after each `add`, and the dtype of the rows it was given."""

    def __init__(self, n_words: int) -> None:
        super().__init__(n_words)
        self.held: list[int] = []
        self.given: set[np.dtype[Any]] = set()

    def add(self, X: Any, /, **ids: np.ndarray) -> MeasuredMEV:
        self.given.add(np.asarray(X).dtype)
        super().add(X, **ids)
        self.held.append(held_bytes(self))
        return self


def test_mev_state_stays_within_the_budget_of_its_word_group(tmp_path: Any) -> None:
    """10 frequent words (1,500 occurrences: past 4d float32 rows they become X^T X, mid-pass) among
    300 rare ones, in the store's 4,096-row chunks: after every add, each group holds at most its
    planned budget (a frequent word's rows dropped for its moment must not stay alive)."""
    dim = 256
    rng = np.random.default_rng(1)
    counts = {f"often{i}": 1500 for i in range(10)} | {f"rare{i}": int(rng.integers(5, 40)) for i in range(300)}
    store = synthetic_store(tmp_path / "store", dim=dim, counts=counts)
    memory_mb = 4
    plan = plan_analysis(store, AnalysisOptions(min_contexts=2, mev_memory_mb=memory_mb))
    assert plan.n_groups >= 4 and len(plan.words) == len(counts)
    budget = memory_mb * 2**20
    peaks = []
    for group in range(plan.n_groups):
        accumulator = MeasuredMEV(len(plan.words))
        tally(store, 0, mev_feeds(plan, {group: accumulator}), chunk_rows=int(store.layer(0).chunks[0]))
        assert accumulator.given == {np.dtype(np.float32)}
        assert len(accumulator.held) == -(-store.n_tokens // 4096)  # one add per stored chunk
        assert max(accumulator.held) <= budget, f"group {group}: {accumulator.held} bytes held, budget {budget:.0f}"
        peaks.append(max(accumulator.held))
    assert max(peaks) > 0.7 * budget  # the plan fills groups: the bound is tight, not vacuous


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_analysis_from_float32_rows_equals_the_float64_path(tmp_path: Any, dtype: type) -> None:
    """d = 300 and a word of 400 occurrences: the matrix-free float32 Krylov steps run, and rare words
    the batched Gram path. MEV's tolerances against MEV on the same rows as float64: eigenvalue ratios
    within 1e-9 (relative); directions, and svd_ratio (the variance along the direction), within 1e-6."""
    dim = 300
    counts = {"often": 400, "sometimes": 120} | {f"rare{i}": 6 + i % 9 for i in range(40)}
    store = synthetic_store(tmp_path / "store", dim=dim, counts=counts, dtype=dtype)
    options = AnalysisOptions(min_contexts=2)
    plan = plan_analysis(store, options)
    word_index = plan.words.word_index
    analysed = word_index >= 0
    as_float64 = np.asarray(store.layer(0)[:], dtype=np.float64)
    reference = MEVAccumulator(len(plan.words)).add(as_float64[analysed], word_ids=word_index[analysed]).result()

    streamed = MeasuredMEV(len(plan.words))
    tally(store, 0, mev_feeds(plan, {0: streamed}))
    assert plan.n_groups == 1 and streamed.given == {np.dtype(np.float32)}
    spectra = streamed.result()
    assert spectra.keys() == reference.keys() and len(spectra) == len(counts)
    for word, spectrum in spectra.items():
        for variant in MEV_VARIANTS:
            assert spectrum.mev(variant) == pytest.approx(reference[word].mev(variant), rel=RTOL[variant])
        assert np.linalg.norm(spectrum.direction - reference[word].direction) < 1e-6

    words = analyze_store(store, min_contexts=2, device="cpu").words
    for variant in MEV_VARIANTS:
        expected = [reference[word].mev(variant) for word in range(len(plan.words))]
        np.testing.assert_allclose(words[f"mev_{variant}"].to_numpy(), expected, rtol=RTOL[variant])
