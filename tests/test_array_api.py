"""The closed-form accumulators give the same numbers from numpy arrays and from torch tensors
(the GPU's code path, run here on the CPU), to 1e-12 in float64; and the whole analysis does too."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lmgeom.metrics.base import RowBlock, save_states, load_states
from lmgeom.metrics.contextuality import (
    AverageCosineAccumulator,
    IntraSentenceAccumulator,
    MeanNormAccumulator,
    RowSampleAccumulator,
    SelfSimilarityAccumulator,
    WordMeanAccumulator,
)
from lmgeom.metrics.isotropy import (
    CosineContributionAccumulator,
    MomentAccumulator,
    PartitionFunctionAccumulator,
    partition_directions,
)
from lmgeom.stages import analyze_store
from lmgeom.store import write_store_from_arrays

TOLERANCE = 1e-12


def rows(n: int = 300, dim: int = 12, seed: int = 0) -> np.ndarray:
    """Anisotropic rows (a shared offset) with two zero rows, which cosines must leave out."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, dim)) + rng.normal(size=dim) * 2
    X[[7, 150]] = 0.0
    return X


def labels(n: int = 300, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"word_ids": rng.integers(0, 9, size=n), "sentence_ids": np.repeat(np.arange(n // 6 + 1), 6)[:n]}


def accumulators(n_words: int = 9) -> dict[str, tuple[object, dict[str, str]]]:
    """Fresh accumulators and which label each takes."""
    X = rows()
    moments = MomentAccumulator().add(X).result()
    directions, shift = partition_directions(moments, centered=True)
    return {
        "average_cosine": (AverageCosineAccumulator(), {}),
        "mean_norm": (MeanNormAccumulator(), {}),
        "self_similarity": (SelfSimilarityAccumulator(n_words), {"word_ids": "word_ids"}),
        "word_means": (WordMeanAccumulator(n_words), {"word_ids": "word_ids"}),
        "intra_sentence": (IntraSentenceAccumulator(), {"sentence_ids": "sentence_ids"}),
        "moments": (MomentAccumulator(), {}),
        "variances": (MomentAccumulator(full_covariance=False), {}),
        "partition_function": (PartitionFunctionAccumulator(directions, shift=shift), {}),
        "cosine_contributions": (CosineContributionAccumulator(), {}),
    }


def as_numbers(result: object) -> np.ndarray:
    if hasattr(result, "scatter"):  # Moments
        return np.concatenate([[result.count], result.mean.ravel(), result.scatter.ravel()])
    if hasattr(result, "to_numpy"):  # a pandas Series
        return np.concatenate([result.index.to_numpy(dtype=np.float64), result.to_numpy()])
    return np.atleast_1d(np.asarray(result, dtype=np.float64))


def feed(accumulator, X, ids, names, chunks=(0, 100, 220, 300)):
    for start, stop in zip(chunks[:-1], chunks[1:]):
        accumulator.add(X[start:stop], **{key: ids[label][start:stop] for key, label in names.items()})
    return accumulator


@pytest.mark.parametrize("name", list(accumulators()))
def test_numpy_and_torch_tensors_give_the_same_numbers(name):
    X, ids = rows(), labels()
    numpy_acc, names = accumulators()[name]
    torch_acc, _ = accumulators()[name]
    expected = as_numbers(feed(numpy_acc, X, ids, names).result())
    got = as_numbers(feed(torch_acc, torch.from_numpy(X), {k: torch.from_numpy(v) for k, v in ids.items()}, names).result())
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=TOLERANCE, atol=TOLERANCE)
    # large state stays in the rows' library (on a GPU: on the GPU), and is computed there
    for large in ("unit_sums", "sums", "scatter"):
        if hasattr(torch_acc, large):
            assert torch.is_tensor(getattr(torch_acc, large)) and getattr(torch_acc, large).dtype == torch.float64
    # float32 tensors are computed in float64 too: the same numbers as float32 numpy rows
    numpy32, _ = accumulators()[name]
    torch32, _ = accumulators()[name]
    X32 = X.astype(np.float32)
    np.testing.assert_allclose(as_numbers(feed(torch32, torch.from_numpy(X32), ids, names).result()),
                               as_numbers(feed(numpy32, X32, ids, names).result()), rtol=TOLERANCE, atol=TOLERANCE)


@pytest.mark.parametrize("name", list(accumulators()))
def test_torch_state_saves_as_numpy_and_merges_with_numpy_shards(name, tmp_path):
    X, ids = rows(), labels()
    whole, names = accumulators()[name]
    expected = as_numbers(feed(whole, X, ids, names).result())
    first, _ = accumulators()[name]
    second, _ = accumulators()[name]
    feed(first, torch.from_numpy(X[:150]), {k: v[:150] for k, v in ids.items()}, names, chunks=(0, 70, 150))
    feed(second, X[150:], {k: v[150:] for k, v in ids.items()}, names, chunks=(0, 80, 150))
    assert all(not torch.is_tensor(value) for value in first.state_dict().values())
    save_states(tmp_path / "first.npz", {"a": first})
    _, loaded = load_states(tmp_path / "first.npz")
    np.testing.assert_allclose(as_numbers(loaded["a"].merge(second).result()), expected, rtol=TOLERANCE, atol=TOLERANCE)
    # and the other way round: a numpy shard merged into torch state
    first_torch, _ = accumulators()[name]
    feed(first_torch, torch.from_numpy(X[:150]), {k: v[:150] for k, v in ids.items()}, names, chunks=(0, 70, 150))
    np.testing.assert_allclose(as_numbers(first_torch.merge(second).result()), expected, rtol=TOLERANCE, atol=TOLERANCE)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("name", list(accumulators()))
def test_a_masked_shared_block_equals_adding_the_masked_rows(name, backend):
    X, ids = rows(), labels()
    keep = np.ones(len(X), dtype=bool)
    keep[[0, 1, 2, 50, 51, 299]] = False  # not sentence 8 alone: sentences stay contiguous
    expected_acc, names = accumulators()[name]
    expected = as_numbers(expected_acc.add(X[keep], **{key: ids[label][keep] for key, label in names.items()}).result())
    block_acc, _ = accumulators()[name]
    block = RowBlock(torch.from_numpy(X) if backend == "torch" else X)
    got = as_numbers(block_acc.add_block(block, keep, **{key: ids[label][keep] for key, label in names.items()}).result())
    np.testing.assert_allclose(got, expected, rtol=TOLERANCE, atol=TOLERANCE)


def test_a_torch_row_block_names_the_first_non_finite_row():
    X = torch.from_numpy(rows())
    X[42, 3] = float("nan")
    with pytest.raises(ValueError, match=r"layer 5, row 1042"):
        RowBlock(X, layer=5, row_offset=1000)


def test_row_samples_keep_the_drawn_rows_whatever_the_library():
    X = rows()
    drawn = np.array([3, 99, 100, 250])
    numpy_sample = RowSampleAccumulator(drawn).add(X, rows=np.arange(len(X))).result()
    torch_sample = RowSampleAccumulator(drawn).add(torch.from_numpy(X), rows=np.arange(len(X))).result()
    np.testing.assert_array_equal(torch_sample, X[drawn])
    np.testing.assert_array_equal(numpy_sample, X[drawn])


@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    rng = np.random.default_rng(3)
    vocabulary = [f"w{i}" for i in range(12)] + [",", "."]
    sentences = [[vocabulary[i] for i in rng.integers(0, len(vocabulary), size=rng.integers(4, 11))] for _ in range(60)]
    n_rows = sum(len(s) for s in sentences)
    centres = rng.normal(size=(len(vocabulary), 16))
    index = {word: i for i, word in enumerate(vocabulary)}
    word_rows = np.array([index[w] for s in sentences for w in s])
    hidden = [(centres[word_rows] + (layer + 1) * 0.3 * rng.normal(size=(n_rows, 16)) + 1.5).astype(np.float32)
              for layer in range(3)]
    hidden[1][5] = 0.0  # a zero vector, left out by every cosine
    return write_store_from_arrays(tmp_path_factory.mktemp("store") / "s", hidden, sentences)


def test_the_whole_analysis_on_the_torch_path_equals_numpy(small_store):
    on_numpy = analyze_store(small_store, min_contexts=2, n_samples=50, device="cpu", chunk_rows=100)
    on_torch = analyze_store(small_store, min_contexts=2, n_samples=50, device="torch:cpu", chunk_rows=100)
    for column in ("raw", "baseline", "adjusted"):
        np.testing.assert_allclose(on_torch.layers[column].to_numpy(), on_numpy.layers[column].to_numpy(),
                                   rtol=TOLERANCE, atol=TOLERANCE, equal_nan=True)
    numeric = on_numpy.words.select_dtypes("number").columns
    np.testing.assert_allclose(on_torch.words[numeric].to_numpy(dtype=np.float64), on_numpy.words[numeric].to_numpy(dtype=np.float64),
                               rtol=TOLERANCE, atol=TOLERANCE, equal_nan=True)
    norms = on_numpy.counts.pop("mean_norm_by_layer")
    np.testing.assert_allclose(list(on_torch.counts.pop("mean_norm_by_layer").values()), list(norms.values()), rtol=TOLERANCE)
    assert on_torch.counts == on_numpy.counts


def test_asking_for_a_missing_or_unknown_device_is_a_clear_error(small_store):
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            analyze_store(small_store, min_contexts=2, device="cuda")
    with pytest.raises(ValueError, match="use cpu, cuda, cuda:N, auto or torch:cpu"):
        analyze_store(small_store, min_contexts=2, device="tpu")


def test_a_cuda_index_the_machine_lacks_is_a_clear_error(monkeypatch):
    from lmgeom.device import resolve_analysis_device, resolve_device
    from lmgeom.errors import InputError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(ValueError, match=r"`device='cuda:7'` names a CUDA device this machine lacks \(it has 2: cuda:0 to cuda:1\)"):
        resolve_device("cuda:7")
    with pytest.raises(InputError, match="use one of those") as refused:
        resolve_analysis_device("cuda:2")
    assert refused.value.params == ("device",)
