"""Small stores stay small: zarr chunks fitted to the corpus, and zstd compression as an option that
reads back bit for bit, verifies, and resumes bit-identically."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr
from typer.testing import CliRunner

from lmgeom.cli.main import app
from lmgeom.corpus import lee
from lmgeom.encoders import load_encoder
from lmgeom.stages import extract
from lmgeom.store import RepresentationStore, layout
from lmgeom.store.integrity import CorruptStore, verify_store


class Interrupt(Exception):
    pass


class StopAfter:
    """Progress that raises after `chunks` committed chunks (an extraction killed mid-way)."""

    def __init__(self, chunks: int) -> None:
        self.left = chunks

    def start(self, stage: str, total: int, *, unit: str = "items") -> None:
        pass

    def advance(self, stage: str, n: int = 1, *, note: str = "") -> None:
        self.left -= 1
        if self.left == 0:
            raise Interrupt


@pytest.fixture(scope="module")
def encoder():
    return load_encoder("tiny-bert", device="cpu")


def store_bytes(path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def layers_equal(a: RepresentationStore, b: RepresentationStore) -> bool:
    return all(np.asarray(a.layer(layer)[:]).tobytes() == np.asarray(b.layer(layer)[:]).tobytes() for layer in a.layers)


def test_chunk_rows_fit_the_expected_rows():
    assert layout.chunk_rows(384) == 2730 and layout.chunk_rows(64) == 16384  # about 4 MiB of float32
    assert layout.chunk_rows(384, 1) == layout.MIN_CHUNK_ROWS
    assert [layout.chunk_rows(384, n) for n in (16, 17, 32, 33, 1000, 2730, 10**6)] == [16, 32, 32, 64, 1024, 2730, 2730]
    sentences = lee().head(3).sentences
    assert layout.expected_rows(sentences) == sum(len(s.words) for s in sentences) + 6


def test_two_sentence_store_is_one_small_chunk_a_layer(tmp_path, encoder):
    corpus = lee().head(2)
    store = extract(encoder, corpus, tmp_path / "two")
    rows = store.n_tokens
    chunk = store.layer(0).chunks[0]
    assert rows <= chunk < 2 * (rows + 2 * len(corpus))  # one chunk, the expected rows rounded up to a power of two
    assert store_bytes(tmp_path / "two") < 200_000
    # a layer's chunk files: one chunk of the fitted rows, padded
    per_layer = [f for f in (tmp_path / "two" / "layers" / "0").rglob("*") if f.is_file() and "zarr.json" not in f.name]
    assert sum(f.stat().st_size for f in per_layer) == chunk * store.dim * 4
    assert verify_store(tmp_path / "two").ok


def test_cli_two_sentence_store_well_under_a_megabyte(tmp_path):
    corpus = tmp_path / "two.txt"
    corpus.write_text("The cat sat on the mat.\nA dog ran in the park today.\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["extract", "tiny-bert", "--corpus", str(corpus), "--out", str(tmp_path / "s"),
                                      "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert store_bytes(tmp_path / "s") < 200_000


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_compressed_store_reads_back_bit_identical_and_verifies(tmp_path, encoder, dtype):
    corpus = lee().head(40)
    raw = extract(encoder, corpus, tmp_path / "raw", chunk_sentences=16, storage_dtype=dtype)
    packed = extract(encoder, corpus, tmp_path / "zstd", chunk_sentences=16, storage_dtype=dtype, compress="zstd")
    assert packed.meta["settings"]["compressor"] == "zstd" and "compressor" not in raw.meta["settings"]
    codecs = [type(codec).__name__ for codec in zarr.open_array(str(tmp_path / "zstd" / "layers" / "0")).metadata.codecs]
    assert codecs == ["BytesCodec", "ZstdCodec"]
    assert layers_equal(raw, packed)
    assert raw.tokens.equals(packed.tokens) and raw.vocab.equals(packed.vocab)
    for layer in raw.layers:
        chunks = [X for _, X in packed.iter_chunks(layer, chunk_rows=97)]
        assert np.concatenate(chunks).tobytes() == np.asarray(raw.layer(layer)[:]).tobytes()
    verified = verify_store(tmp_path / "zstd")
    assert verified.ok and verified.checksums
    # the checksums cover the compressed chunk files: a damaged one is found (its size no longer says it)
    checksums = json.loads((tmp_path / "zstd" / layout.CHECKSUMS).read_text())
    chunk = next(name for name in checksums.get("files", checksums) if name.startswith("layers/1/"))
    path = tmp_path / "zstd" / chunk
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    assert not verify_store(tmp_path / "zstd").ok
    with pytest.raises(CorruptStore, match="layer 1: chunk file .* is damaged"):  # checked before it is decompressed
        RepresentationStore.open(tmp_path / "zstd").layer(1)[:]


def test_unknown_compressor_is_refused_before_anything_is_written(tmp_path, encoder):
    with pytest.raises(ValueError, match="unknown `compress` 'gzip'"):
        extract(encoder, lee().head(2), tmp_path / "s", compress="gzip")
    assert not (tmp_path / "s" / layout.META).exists()


@pytest.mark.parametrize("compress", [None, "zstd"])
def test_small_and_compressed_stores_resume_bit_identical(tmp_path, encoder, compress):
    corpus = lee().head(48)
    once = extract(encoder, corpus, tmp_path / "once", chunk_sentences=8, compress=compress)
    # small chunks: the corpus's rows, rounded up, fit in fewer chunks than 4 MiB would take, and each
    # commit of 8 sentences starts mid-chunk
    assert once.layer(0).chunks[0] < layout.chunk_rows(once.dim)
    with pytest.raises(Interrupt):
        extract(encoder, corpus, tmp_path / "resumed", chunk_sentences=8, compress=compress, progress=StopAfter(3))
    resumed = extract(encoder, corpus, tmp_path / "resumed", chunk_sentences=8, compress=compress)
    assert layers_equal(once, resumed) and once.tokens.equals(resumed.tokens)
    assert resumed.layer(0).chunks == once.layer(0).chunks
    assert verify_store(tmp_path / "resumed").ok
    # every chunk file the same bytes (a compressed chunk is a deterministic function of its rows)
    for path in sorted((tmp_path / "once" / "layers").rglob("*")):
        if path.is_file():
            assert path.read_bytes() == (tmp_path / "resumed" / path.relative_to(tmp_path / "once")).read_bytes(), path
