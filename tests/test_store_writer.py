"""StoreWriter internals that extraction speed rests on: a chunk's rows taken as views when they lie
back to back, word ids looked up once per distinct word, and finalize from the tables kept in memory
equal to finalize from the committed parts on disk."""

from __future__ import annotations

import numpy as np
import pandas as pd

from lmgeom.corpus import lee
from lmgeom.encoders.base import EncodedSentence
from lmgeom.store import RepresentationStore, StoreWriter
from lmgeom.store.writer import _chunk_rows, index_words


def sentence(vectors: np.ndarray, words: list[str]) -> EncodedSentence:
    return EncodedSentence(vectors, words, np.zeros(len(words), dtype=bool), np.ones(len(words), dtype=np.int16), 1)


def test_chunk_rows_are_views_of_one_block_and_copies_otherwise():
    rng = np.random.default_rng(0)
    block = rng.standard_normal((3, 10, 4)).astype(np.float32)
    cuts = [0, 4, 4, 9, 10]  # an empty sentence in the middle
    encoded = [sentence(block[:, a:b], ["w"] * (b - a)) for a, b in zip(cuts, cuts[1:])]
    rows = _chunk_rows(encoded, 3, 4)
    for layer in range(3):
        assert np.shares_memory(rows[layer], block) and np.array_equal(rows[layer], block[layer])
    # separate arrays, or a gap between sentences: stacked by copying, same values
    separate = [sentence(block[:, a:b].copy(), ["w"] * (b - a)) for a, b in zip(cuts, cuts[1:])]
    gap = [sentence(block[:, 0:4], ["w"] * 4), sentence(block[:, 5:10], ["w"] * 5)]
    for parts, expected in ((separate, block), (gap, np.concatenate([block[:, 0:4], block[:, 5:10]], axis=1))):
        rows = _chunk_rows(parts, 3, 4)
        for layer in range(3):
            assert not np.shares_memory(rows[layer], block) and np.array_equal(rows[layer], expected[layer])
    assert [r.shape for r in _chunk_rows([sentence(block[:, :0], [])], 3, 4)] == [(0, 4)] * 3


def test_word_ids_are_the_vocabulary_ids_of_each_token():
    words = [w.text for s in lee().head(200).sentences for w in s.words]
    tokens = pd.DataFrame({
        "sentence_id": np.arange(len(words)) // 7, "position": np.arange(len(words)) % 7, "word": words,
        "is_special": np.zeros(len(words), dtype=bool),
    })
    sentences = pd.DataFrame({"n_windows": np.ones(tokens["sentence_id"].max() + 1, dtype=np.int64), "n_unaligned": 0})
    vocab, counts = index_words(tokens, sentences)
    id_of = dict(zip(vocab["word"], vocab["word_id"]))
    assert tokens["word_id"].tolist() == [id_of[word] for word in words]
    assert vocab.set_index("word")["count"].to_dict() == pd.Series(words).value_counts().to_dict()
    assert counts["n_vocab"] == len(set(words)) and counts["n_tokens"] == len(words)


def test_finalize_from_memory_equals_finalize_from_committed_parts(tmp_path):
    corpus = lee().head(30)
    rng = np.random.default_rng(1)
    chunks = [corpus.sentences[a : a + 10] for a in (0, 10, 20)]
    encoded = []
    for chunk in chunks:
        n = sum(len(s.words) for s in chunk)
        block, start, parts = rng.standard_normal((2, n, 5)).astype(np.float32), 0, []
        for s in chunk:
            parts.append(sentence(block[:, start : start + len(s.words)], [w.text for w in s.words]))
            start += len(s.words)
        encoded.append(parts)
    settings = {"model_id": "synthetic", "n_layers": 2, "dim": 5, "dtype": "float32"}

    writer = StoreWriter(tmp_path / "memory", settings=settings)
    for chunk, parts in zip(chunks, encoded):
        writer.commit(parts, [s.text for s in chunk])
    writer.finalize()
    for committed_before in range(4):  # a new writer (a resumed run) reads those chunks' tables from disk
        writer = StoreWriter(tmp_path / f"parts{committed_before}", settings=settings)
        for chunk, parts in zip(chunks[:committed_before], encoded):
            writer.commit(parts, [s.text for s in chunk])
        writer.close()  # the run stops (releasing the store's lock) and another resumes it
        writer = StoreWriter(tmp_path / f"parts{committed_before}", settings=settings)
        for chunk, parts in zip(chunks[committed_before:], encoded[committed_before:]):
            writer.commit(parts, [s.text for s in chunk])
        writer.finalize()
        a, b = RepresentationStore.open(tmp_path / "memory"), RepresentationStore.open(tmp_path / f"parts{committed_before}")
        assert a.tokens.equals(b.tokens) and a.sentences.equals(b.sentences) and a.vocab.equals(b.vocab)
        assert a.meta["n_vocab"] == b.meta["n_vocab"] == len({w.text for s in corpus.sentences for w in s.words})
        for layer in range(2):
            assert np.array_equal(np.asarray(a.layer(layer)[:]), np.asarray(b.layer(layer)[:]))


def test_rows_written_as_whole_chunk_files_read_back_through_zarr(tmp_path, monkeypatch):
    # 4-row chunks: commits start and end mid-chunk, span several chunks, and a resumed writer
    # continues a chunk that another writer left open (read back from disk)
    monkeypatch.setattr(StoreWriter, "chunk_rows", property(lambda self: 4))
    rng = np.random.default_rng(2)
    sizes = [[3], [2, 0, 4], [1], [7, 5], [4], [2, 1]]
    blocks = [rng.standard_normal((2, sum(chunk), 3)).astype(np.float32) for chunk in sizes]
    settings = {"model_id": "synthetic", "n_layers": 2, "dim": 3, "dtype": "float32"}
    writer = StoreWriter(tmp_path / "s", settings=settings)
    for number, (chunk, block) in enumerate(zip(sizes, blocks)):
        if number == 3:
            writer.close()
            writer = StoreWriter(tmp_path / "s", settings=settings)
        encoded, start = [], 0
        for n in chunk:
            encoded.append(sentence(block[:, start : start + n], [f"w{i}" for i in range(n)]))
            start += n
        writer.commit(encoded, [f"sentence {i}" for i in range(len(chunk))])
    writer.finalize()
    store = RepresentationStore.open(tmp_path / "s")
    for layer in range(2):
        assert np.array_equal(np.asarray(store.layer(layer)[:]), np.concatenate([b[layer] for b in blocks]))
    assert not list((tmp_path / "s").rglob("*.partial"))
    n_rows = sum(sum(chunk) for chunk in sizes)
    assert store.layer(0).shape == (n_rows, 3)
    # the same rows written by zarr itself give the same chunk files, byte for byte
    import zarr

    reference = zarr.create_array(str(tmp_path / "reference"), shape=(n_rows, 3), chunks=(4, 3), dtype="float32", compressors=None)
    reference[:] = np.concatenate([b[0] for b in blocks])
    for chunk in range(-(-n_rows // 4)):
        ours = (tmp_path / "s" / "layers" / "0" / "c" / str(chunk) / "0").read_bytes()
        assert ours == (tmp_path / "reference" / "c" / str(chunk) / "0").read_bytes()
