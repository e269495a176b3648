"""The sharded engine's sort windows: a shard is sorted by length as a whole (where the memory budget
allows), its windows are those a local run with that window cuts, and so the stored vectors of the
Ray engine are bit-identical to the local engine's; windows never cross a shard."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import pytest
import torch

from lmgeom.corpus import load_corpus
from lmgeom.corpus.corpus import Corpus
from lmgeom.encoders.registry import load_encoder
from lmgeom.stages import extract
from lmgeom.stages.distributed import default_shard_sentences, extract_sharded, resolve_shards
from lmgeom.stages.extraction_options import ExtractionOptions, default_chunk_sentences, default_sort_window
from lmgeom.store import RepresentationStore

from helpers import local_ray

CHUNK = 8
SHARD = 24  # 48 sentences: shards [0, 24), [24, 48) of three chunks each


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return load_corpus("lee", limit=48)


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """The local engine on one torch thread, as each Ray actor (num_cpus=1) runs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    yield from local_ray(__name__)


def same_bytes(a: RepresentationStore, b: RepresentationStore) -> None:
    for table in ("tokens", "sentences", "vocab"):
        assert getattr(a, table).equals(getattr(b, table)), table
    assert a.layers == b.layers
    for layer in a.layers:
        assert np.asarray(a.layer(layer)[:]).tobytes() == np.asarray(b.layer(layer)[:]).tobytes(), layer


def test_a_shard_is_one_window_up_to_the_memory_budget() -> None:
    # SmolLM2's shape on all of Lee: chunks of 128, the local window 384 (the memory budget's)
    n_layers, dim, n = 31, 576, 2680
    chunk = default_chunk_sentences(n_layers, dim, n)
    assert chunk == 128 and default_sort_window(n_layers, dim, n, chunk) == 384
    for workers, shard, window in ((1, 768, 384), (2, 384, 384), (4, 256, 256), (8, 128, 128)):
        assert default_shard_sentences(n, chunk, num_workers=workers) == shard
        resolved = resolve_shards(ExtractionOptions(), n_layers, dim, n, num_workers=workers)
        assert (resolved.chunk_sentences, resolved.sort_window, resolved.shard_sentences) == (chunk, window, shard)
    # given sizes win; a shard is rounded up to whole windows
    given = resolve_shards(ExtractionOptions(chunk_sentences=8, sort_window=16, shard_sentences=20), 4, 32, 48)
    assert (given.sort_window, given.shard_sentences) == (16, 32)
    # a shard smaller than the memory budget's window is one window, in whole chunks
    small = resolve_shards(ExtractionOptions(chunk_sentences=8, shard_sentences=12), 4, 32, 48)
    assert (small.sort_window, small.shard_sentences) == (16, 16)


def test_the_local_sharded_engine_sorts_each_shard_whole(tmp_path, corpus, one_thread) -> None:
    encoder = load_encoder("tiny-llama", device="cpu")
    sharded = extract_sharded(encoder, corpus, tmp_path / "sharded", chunk_sentences=CHUNK, shard_sentences=SHARD)
    assert sharded.meta["sort_window"] == SHARD
    assert [(s["first_sentence"], s["n_sentences"]) for s in sharded.meta["shards"]] == [(0, 24), (24, 24)]
    same_bytes(extract(encoder, corpus, tmp_path / "local", chunk_sentences=CHUNK, sort_window=SHARD), sharded)
    # a window given (one chunk) is kept, and cut as the local engine cuts it
    chunked = extract_sharded(encoder, corpus, tmp_path / "chunked", chunk_sentences=CHUNK, sort_window=CHUNK,
                              shard_sentences=SHARD)
    assert chunked.meta["sort_window"] == CHUNK
    same_bytes(extract(encoder, corpus, tmp_path / "local-chunked", chunk_sentences=CHUNK, sort_window=CHUNK), chunked)


@pytest.mark.ray
@pytest.mark.parametrize("model", ["tiny-llama", "tiny-bert"])
def test_ray_extraction_is_bit_identical_to_the_local_engine(cluster, tmp_path, corpus, one_thread, model) -> None:
    from functools import partial

    store = extract_sharded(partial(load_encoder, model, device="cpu"), corpus, tmp_path / "ray", engine="ray",
                            num_workers=2, chunk_sentences=CHUNK, shard_sentences=SHARD)
    assert store.meta["sort_window"] == SHARD and store.meta["layout"] == "sharded"
    local = extract(load_encoder(model, device="cpu"), corpus, tmp_path / "local", chunk_sentences=CHUNK, sort_window=SHARD)
    same_bytes(local, store)
