"""The analysis's memory and time (issue 12) and MEV's float32 rows (issue 11): the MEV state of a
word group, counted in the bytes it really holds, stays within the budget the group was planned with;
MEV gets a float32 store's rows as float32 (float16 widened, exactly) and gives the float64 path's
numbers; however many word groups, the store is read once per layer (the other groups' rows go to
scratch files, removed afterwards, also after an error) and the numbers are those of one group; the
plan reads only the token columns it needs and selects what the whole token table selects."""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any, Iterator

import numpy as np
import pandas as pd
import pytest

from lmgeom.metrics import MEV_VARIANTS, MEVAccumulator, mev
from lmgeom.engine import Feed, tally
from lmgeom.stages import analyze_store
from lmgeom.engine import AnalysisOptions, PlanArrays, plan_analysis, run_analysis
from lmgeom.engine.selection import select_rows
from lmgeom.engine.spool import RowSpool
from lmgeom.store import RepresentationStore

from helpers import synthetic_store

TALLY = sys.modules["lmgeom.engine.loop"]  # the module (`lmgeom.engine.loop` the attribute is the function)


RTOL = {"uncentred": 1e-9, "centred": 1e-9, "svd_ratio": 1e-6}  # MEV's own (tests/test_mev_spectrum.py)


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


def group_feed(rows: PlanArrays, group: int, accumulator: Any) -> Feed:
    """The feed of a word group's rows into an MEV accumulator, as the engine makes it."""
    return Feed(accumulator, rows.group_mask(group), {"word_ids": rows.local_of_row}, stored_rows=True)


def test_mev_state_stays_within_the_budget_of_its_word_group(tmp_path: Any) -> None:
    """10 frequent words (1,500 occurrences: past 4d float32 rows they become X^T X, mid-pass) among
    300 rare ones, in the store's 4,096-row chunks: after every add, each group holds at most its
    planned budget (a frequent word's rows dropped for its moment must not stay alive)."""
    dim = 256
    rng = np.random.default_rng(1)
    counts = {f"often{i}": 1500 for i in range(10)} | {f"rare{i}": int(rng.integers(5, 40)) for i in range(300)}
    store = synthetic_store(tmp_path / "store", dim=dim, counts=counts)
    memory_mb = 4
    plan, rows = plan_analysis(store, AnalysisOptions(min_contexts=2, mev_memory_mb=memory_mb))
    assert plan.n_groups >= 4 and len(rows.words) == len(counts)
    budget = memory_mb * 2**20
    peaks = []
    for group in range(plan.n_groups):
        accumulator = MeasuredMEV(len(rows.group_words[group]))
        tally(store, 0, [group_feed(rows, group, accumulator)], chunk_rows=int(store.layer(0).chunks[0]))
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
    plan, rows = plan_analysis(store, options)
    word_index = rows.words.word_index
    analysed = word_index >= 0
    as_float64 = np.asarray(store.layer(0)[:], dtype=np.float64)
    reference = MEVAccumulator(len(rows.words)).add(as_float64[analysed], word_ids=word_index[analysed]).result()

    streamed = MeasuredMEV(len(rows.words))
    tally(store, 0, [group_feed(rows, 0, streamed)])
    assert plan.n_groups == 1 and streamed.given == {np.dtype(np.float32)}
    spectra = streamed.result()
    assert spectra.keys() == reference.keys() and len(spectra) == len(counts)
    for word, spectrum in spectra.items():
        for variant in MEV_VARIANTS:
            assert spectrum.mev(variant) == pytest.approx(reference[word].mev(variant), rel=RTOL[variant])
        assert np.linalg.norm(spectrum.direction - reference[word].direction) < 1e-6

    words = analyze_store(store, min_contexts=2, device="cpu").words
    for variant in MEV_VARIANTS:
        expected = [reference[word].mev(variant) for word in range(len(rows.words))]
        np.testing.assert_allclose(words[f"mev_{variant}"].to_numpy(), expected, rtol=RTOL[variant])


# d = 256: 4,096-row store chunks, 4 a layer; a few words past 4d float32 rows (X^T X mid-read), many
# rare ones (batched Gram), and punctuation
GROUPED_COUNTS = {f"often{i}": 1200 for i in range(3)} | {f"rare{i}": 5 + (7 * i) % 31 for i in range(500)} | {".": 200}
SMALL_BUDGET_MB = 2  # several word groups


@pytest.fixture(scope="module")
def grouped_store(tmp_path_factory: Any) -> RepresentationStore:
    return synthetic_store(tmp_path_factory.mktemp("grouped") / "store", dim=256, counts=GROUPED_COUNTS, n_layers=2,
                           sentence_length=7)


@pytest.fixture
def counted_reads(monkeypatch: Any) -> list[tuple[int, int]]:
    """(layer, first row) of every chunk `tally` reads from the store."""
    reads: list[tuple[int, int]] = []
    stored_chunks = TALLY.stored_chunks

    def counting(store: RepresentationStore, layer: int, **options: Any) -> Iterator[tuple[int, np.ndarray]]:
        for start, chunk in stored_chunks(store, layer, **options):
            reads.append((layer, start))
            yield start, chunk

    monkeypatch.setattr(TALLY, "stored_chunks", counting)
    return reads


@pytest.fixture
def scratch(tmp_path: Any, monkeypatch: Any) -> Any:
    """The system temporary directory, made an empty folder of this test's own."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def test_several_word_groups_give_the_numbers_of_one(grouped_store: RepresentationStore, counted_reads: list[tuple[int, int]],
                                                     scratch: Any) -> None:
    """A budget that makes several word groups changes neither the closed-form statistics (1e-12) nor
    MEV (its tolerances; both equal MEV of each word's float64 rows), nor the order of the words."""
    grouped = analyze_store(grouped_store, min_contexts=2, mev_memory_mb=SMALL_BUDGET_MB, device="cpu")
    one = analyze_store(grouped_store, min_contexts=2, mev_memory_mb=1e6, device="cpu")
    assert grouped.counts["mev_word_groups"] >= 4 and one.counts["mev_word_groups"] == 1
    assert list(os.scandir(scratch)) == []

    assert grouped.words["word"].tolist() == one.words["word"].tolist()
    mev_columns = [column for column in one.words if column.startswith("mev_")]
    pd.testing.assert_frame_equal(grouped.words.drop(columns=mev_columns), one.words.drop(columns=mev_columns), rtol=0, atol=1e-12)
    _, rows = plan_analysis(grouped_store, AnalysisOptions(min_contexts=2))
    analysed = rows.words.word_index >= 0
    for layer in grouped_store.layers:
        at_layer = grouped.words["layer"] == layer
        X = np.asarray(grouped_store.layer(layer)[:], dtype=np.float64)[analysed]
        for variant in MEV_VARIANTS:
            column = f"mev_{variant}"
            reference = mev(X, rows.words.word_index[analysed], variant=variant)
            np.testing.assert_allclose(grouped.words.loc[at_layer, column], one.words.loc[at_layer, column], rtol=RTOL[variant])
            np.testing.assert_allclose(grouped.words.loc[at_layer, column], reference.sort_index().to_numpy(), rtol=RTOL[variant])
    layer_mev = one.layers["metric"].str.startswith("mev_")
    pd.testing.assert_frame_equal(grouped.layers[~layer_mev], one.layers[~layer_mev], rtol=0, atol=1e-12)
    for variant in MEV_VARIANTS:
        at = grouped.layers["metric"] == f"mev_{variant}"
        np.testing.assert_allclose(grouped.layers.loc[at, "raw"], one.layers.loc[at, "raw"], rtol=RTOL[variant])


def test_the_store_is_read_once_per_layer_whatever_the_word_groups(grouped_store: RepresentationStore,
                                                                  counted_reads: list[tuple[int, int]], scratch: Any,
                                                                  monkeypatch: Any) -> None:
    """Every stored chunk of every layer is read exactly once by the analysis, and once by the static
    embeddings' spectra, with several word groups; the groups after the first went through spools."""
    spooled: list[int] = []
    drain = RowSpool.drain

    def counting_drain(self: RowSpool, accumulator: Any) -> None:
        spooled.append(self.path.stat().st_size)
        drain(self, accumulator)

    monkeypatch.setattr(RowSpool, "drain", counting_drain)
    options = AnalysisOptions(min_contexts=2, mev_memory_mb=SMALL_BUDGET_MB)
    plan, rows = plan_analysis(grouped_store, options)
    chunk_rows = int(grouped_store.layer(0).chunks[0])  # the store's own chunks: 4 a layer
    chunk_starts = list(range(0, grouped_store.n_tokens, chunk_rows))
    assert len(chunk_starts) >= 3 and plan.n_groups >= 4

    analyze_store(grouped_store, min_contexts=2, mev_memory_mb=SMALL_BUDGET_MB, chunk_rows=chunk_rows, device="cpu")
    assert sorted(counted_reads) == [(layer, start) for layer in grouped_store.layers for start in chunk_starts]
    assert len(spooled) == len(grouped_store.layers) * (plan.n_groups - 1) and min(spooled) > 0

    counted_reads.clear()
    vectors = run_analysis(grouped_store, options.replace(layers=(1,), statistics=("first_pc",), chunk_rows=chunk_rows)).layers[1]
    assert sorted(counted_reads) == [(1, start) for start in chunk_starts]
    one_group = MEVAccumulator(len(rows.words))
    tally(grouped_store, 1, [Feed(one_group, rows.words.word_index >= 0, {"word_ids": rows.words.word_index}, stored_rows=True)])
    expected = one_group.result()
    assert vectors["has_vector"].all() and len(expected) == len(rows.words)
    for word, spectrum in expected.items():
        assert np.linalg.norm(vectors["first_pc"][word] - spectrum.direction) < 1e-6
        np.testing.assert_allclose(vectors["first_pc_mean"][word], spectrum.mean, rtol=1e-12)
    assert list(os.scandir(scratch)) == []


@pytest.mark.parametrize("failing", ["read", "solve"])
def test_scratch_files_are_removed_also_after_an_error(grouped_store: RepresentationStore, scratch: Any, monkeypatch: Any,
                                                       failing: str) -> None:
    """An error while the layer is read (spools half written) or while a group is solved (later
    groups' spools not yet read) leaves no scratch file or folder behind."""
    options = AnalysisOptions(min_contexts=2, mev_memory_mb=SMALL_BUDGET_MB, layers=(0,), statistics=("first_pc",),
                              chunk_rows=int(grouped_store.layer(0).chunks[0]))
    plan, _ = plan_analysis(grouped_store, options)
    stored_chunks = TALLY.stored_chunks
    seen: list[list[str]] = []

    def failing_read(store: RepresentationStore, layer: int, **options: Any) -> Iterator[tuple[int, np.ndarray]]:
        for index, (start, chunk) in enumerate(stored_chunks(store, layer, **options)):
            if index == 2:
                seen.append([entry.name for folder in os.scandir(scratch) for entry in os.scandir(folder.path)])
                raise OSError("the disk went away")
            yield start, chunk

    def failing_solve(self: MEVAccumulator) -> None:
        seen.append([entry.name for folder in os.scandir(scratch) for entry in os.scandir(folder.path)])
        raise RuntimeError("stop after the first group")

    if failing == "read":
        monkeypatch.setattr(TALLY, "stored_chunks", failing_read)
    else:
        monkeypatch.setattr(MEVAccumulator, "result", failing_solve)
    with pytest.raises(OSError if failing == "read" else RuntimeError):
        run_analysis(grouped_store, options)
    assert len(seen[0]) == plan.n_groups - 1  # the spools were there when it failed
    assert list(os.scandir(scratch)) == []


def test_the_plan_reads_few_token_columns_and_selects_as_the_whole_table(tmp_path: Any) -> None:
    """`plan_analysis` reads only the token columns the selection needs (the table is not kept on the
    store) and its rows and words equal those selected from the whole token table by the former
    rule: a groupby over the selected rows of the table, words named by the table's own column."""
    counts = {f"w{i}": 2 + i % 6 for i in range(60)} | {",": 40, "the": 90}
    store = synthetic_store(tmp_path / "store", dim=8, counts=counts, sentence_length=6)
    for options in (AnalysisOptions(min_contexts=3), AnalysisOptions(min_contexts=2, include_punct=True, exclude_first_word=True)):
        _, plan = plan_analysis(RepresentationStore.open(store.path), options)
        plan.words  # the words are selected on first use
        fresh = RepresentationStore.open(store.path)
        plan_analysis(fresh, options)
        assert "tokens" not in fresh.__dict__

        tokens = store.tokens
        selection = select_rows(tokens, include_punct=options.include_punct, exclude_first_word=options.exclude_first_word)
        table = tokens.loc[selection.mask].groupby("word_id", sort=True).agg(
            word=("word", "first"), count=("sentence_id", "size"), contexts=("sentence_id", "nunique")).reset_index()
        words = table.loc[table["contexts"] >= options.min_contexts].reset_index(drop=True)
        for name in ("mask", "sentence_ids", "word_ids"):
            assert np.array_equal(getattr(plan.selection, name), getattr(selection, name))
        assert plan.selection.counts == selection.counts
        pd.testing.assert_frame_equal(plan.words.words, words)
        index_of = dict(zip(words["word_id"], range(len(words))))
        expected_index = [index_of.get(word_id, -1) if keep else -1 for word_id, keep in zip(tokens["word_id"], selection.mask)]
        assert plan.words.word_index.tolist() == expected_index
        assert plan.words.counts["distinct_words"] == len(table)
