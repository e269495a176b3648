"""Nothing read silently wrong from a store: a missing or truncated chunk file and a table from another
store are refused on open, naming the file; a flipped byte is refused as it is read, and `verify` finds
it, by the checksums recorded when the store was finished; every path the metadata names stays inside
the store. Local, memory:// and sharded stores. (Damage to the metadata and on every reader's path:
tests/test_store_read_checks.py.)"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import fsspec
import google_crc32c
import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from lmgeom.cli.main import app
from lmgeom.corpus import load_corpus
from lmgeom.corpus.corpus import Corpus
from lmgeom.encoders.base import Encoder
from lmgeom.encoders.registry import load_encoder
from lmgeom.stages import extract
from lmgeom.stages.distributed import extract_sharded
from lmgeom.store import CorruptStore, RepresentationStore, StoreWriter, verify_store, write_store_from_arrays
from lmgeom.store.location import Location

from helpers import rewrite_meta

ROWS = 4  # rows per chunk of the synthetic store: 23 rows -> 6 chunk files a layer, the last one padded
WORDS = [["the", "cat", "sat", "on", "mats"], ["a", "dog", "ran"], ["birds", "sing", "loud", "songs", "at", "dawn"],
         ["rain", "fell"], ["we", "ate", "bread", "and", "soup", "then", "slept"]]


def hidden(seed: int = 0, n_layers: int = 3, dim: int = 3) -> list[np.ndarray]:
    n_rows = sum(len(words) for words in WORDS)
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((n_rows, dim)).astype(np.float32) for _ in range(n_layers)]


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(StoreWriter, "chunk_rows", property(lambda self: ROWS))
    write_store_from_arrays(tmp_path / "s", hidden(), WORDS)
    return tmp_path / "s"


def crc32c(data: bytes) -> str:
    return f"{google_crc32c.value(data):08x}"


def chunk(path: Path, layer: int, index: int) -> Path:
    return path / "layers" / str(layer) / "c" / str(index) / "0"


def cli(*args: str) -> tuple[int, str]:
    outcome = CliRunner().invoke(app, list(args))
    return outcome.exit_code, outcome.output


def flat(text: str) -> str:
    """CLI output without the line breaks and spaces rich wraps it with (80 columns under CliRunner)."""
    return "".join(text.split())


# ---- local stores ------------------------------------------------------------------------------------


def test_an_intact_store_reads_bit_identically_and_verifies(store):
    arrays = hidden()
    opened = RepresentationStore.open(store)
    for layer, expected in enumerate(arrays):
        assert np.asarray(opened.layer(layer)[:]).tobytes() == expected.tobytes()
    assert len(list((store / "layers" / "0" / "c").iterdir())) == 6  # ceil(23 / 4) chunk files a layer
    checksums = json.loads((store / "checksums.json").read_text())
    assert sorted(checksums) == sorted([*(f"layers/{layer}/c/{index}/0" for layer in range(3) for index in range(6)),
                                        *(f"layers/{layer}/zarr.json" for layer in range(3))])
    # each recorded checksum is the CRC32C of the file's bytes; a full chunk file is 4 rows x 3 x 4 bytes
    for name, digest in checksums.items():
        data = (store / name).read_bytes()
        assert crc32c(data) == digest and (name.endswith("zarr.json") or len(data) == ROWS * 3 * 4)
    tables = opened.meta["integrity"]["tables"]
    assert tables["vocab.parquet"] == {"size": (store / "vocab.parquet").stat().st_size,
                                       "digest": crc32c((store / "vocab.parquet").read_bytes())}
    # meta.json's own digest lies beside it, named by its integrity entry
    assert opened.meta["integrity"]["meta_digest"] == "meta.json.crc32c"
    assert (store / "meta.json.crc32c").read_text() == crc32c((store / "meta.json").read_bytes()) + "\n"
    result = verify_store(store)
    assert result.ok and result.checksums and result.metadata and result.problems == []
    assert result.checked == 3 * 6 + 3 + 3 + 1  # chunk files, zarr.json, tables, meta.json
    code, output = cli("verify", str(store))
    assert code == 0 and "all 25 files" in output and "no recorded CRC32C" not in output


def test_checksums_of_a_resumed_extraction_are_those_of_its_files(tmp_path, monkeypatch):
    # chunks written by an interrupted writer are read back when finishing, the rest checksummed as written
    monkeypatch.setattr(StoreWriter, "chunk_rows", property(lambda self: ROWS))
    from lmgeom.encoders.base import EncodedSentence

    arrays = hidden(seed=3, n_layers=2)
    settings = {"model_id": "synthetic", "n_layers": 2, "dim": 3, "dtype": "float32"}
    row = 0
    writer = StoreWriter(tmp_path / "s", settings=settings)
    for number, words in enumerate(WORDS):
        if number == 3:  # another process resumes: the chunk the first one left open is completed by it
            writer.close()
            writer = StoreWriter(tmp_path / "s", settings=settings)
        vectors = np.stack([a[row : row + len(words)] for a in arrays])
        row += len(words)
        writer.commit([EncodedSentence(vectors, words, np.zeros(len(words), dtype=bool),
                                       np.ones(len(words), dtype=np.int16), 1)], [" ".join(words)])
    writer.finalize()
    store = RepresentationStore.open(tmp_path / "s")
    for layer, expected in enumerate(arrays):
        assert np.asarray(store.layer(layer)[:]).tobytes() == expected.tobytes()
    checksums = json.loads((tmp_path / "s" / "checksums.json").read_text())
    assert len(checksums) == 2 * 6 + 2
    assert all(crc32c((tmp_path / "s" / name).read_bytes()) == value for name, value in checksums.items())
    assert verify_store(tmp_path / "s").ok


def test_a_deleted_chunk_file_is_refused_naming_it(store):
    chunk(store, 1, 2).unlink()
    named = str(chunk(store, 1, 2))
    with pytest.raises(CorruptStore, match="layer 1: chunk file .* is missing") as error:
        RepresentationStore.open(store)
    assert named in str(error.value) and "`overwrite=True`" in str(error.value)
    # reading the layer of a store opened without the open's checks: refused as well; other layers read
    meta = json.loads((store / "meta.json").read_text())
    unchecked = RepresentationStore(store, meta)
    assert np.asarray(unchecked.layer(0)[:]).tobytes() == hidden()[0].tobytes()
    with pytest.raises(CorruptStore, match="is missing"):
        unchecked.layer(1)
    code, output = cli("analyze", str(store), "--min-contexts", "1")
    assert code == 2 and output.count("error:") == 1 and flat(named) in flat(output)
    code, output = cli("verify", str(store))
    assert code == 2 and flat(named) in flat(output) and output.count("problem:") == 1


def test_a_truncated_chunk_file_is_refused_naming_it(store):
    path = chunk(store, 2, 5)  # the last, padded chunk file
    path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(CorruptStore, match=r"layer 2: chunk file .* is 20 bytes, not 48 \(truncated") as error:
        RepresentationStore.open(store)
    assert str(path) in str(error.value)
    code, output = cli("analyze", str(store), "--min-contexts", "1")
    assert code == 2 and output.count("error:") == 1 and flat(str(path)) in flat(output)


def test_a_flipped_byte_is_refused_as_read_and_verify_names_every_damaged_file(store):
    path = chunk(store, 0, 3)
    data = bytearray(path.read_bytes())
    data[7] ^= 0x01
    path.write_bytes(bytes(data))
    # the size is right, so the open passes; the read checks the chunk's CRC32C: only that chunk is refused
    opened = RepresentationStore.open(store)
    assert np.asarray(opened.layer(0)[:12]).tobytes() == hidden()[0][:12].tobytes()
    with pytest.raises(CorruptStore, match=r"layer 0: chunk file .* is damaged or was edited: its crc32c") as error:
        opened.layer(0)[10:14]
    assert str(path) in str(error.value) and error.value.path == "layers/0/c/3/0"
    with pytest.raises(CorruptStore, match="damaged"):
        opened.rows(0, np.array([1, 13]))
    result = verify_store(store)
    assert len(result.problems) == 1 and str(path) in result.problems[0] and "damaged" in result.problems[0]
    chunk(store, 2, 0).unlink()
    result = verify_store(store)
    assert len(result.problems) == 2 and str(chunk(store, 2, 0)) in " ".join(result.problems)
    code, output = cli("verify", str(store))
    assert code == 2 and output.count("problem:") == 2 and "2 damaged or missing" in output
    assert flat(str(path)) in flat(output) and "--overwrite" in output


def test_a_vocabulary_from_another_store_is_refused(store, tmp_path, monkeypatch):
    monkeypatch.setattr(StoreWriter, "chunk_rows", property(lambda self: ROWS))
    # the same sentence shapes with other words: a vocabulary of the same rows and the same byte size
    renamed = [[word.upper() for word in words] for words in WORDS]
    write_store_from_arrays(tmp_path / "same-size", hidden(), renamed)
    assert (tmp_path / "same-size" / "vocab.parquet").stat().st_size == (store / "vocab.parquet").stat().st_size
    original = (store / "vocab.parquet").read_bytes()
    shutil.copy(tmp_path / "same-size" / "vocab.parquet", store / "vocab.parquet")
    with pytest.raises(CorruptStore, match="vocab.parquet differs from the vocabulary this store was written with"):
        RepresentationStore.open(store)
    # another vocabulary size: refused by its size, and by its row count where meta.json records no sizes
    write_store_from_arrays(tmp_path / "other", hidden(), [*WORDS[:-1], ["x"] * 7])  # 17 words, not 23
    shutil.copy(tmp_path / "other" / "vocab.parquet", store / "vocab.parquet")
    with pytest.raises(CorruptStore, match="vocab.parquet is .* bytes, but meta.json records"):
        RepresentationStore.open(store)
    meta = json.loads((store / "meta.json").read_text())
    del meta["integrity"]
    rewrite_meta(store, meta)
    with pytest.raises(CorruptStore, match=r"vocab.parquet holds 17 rows, but meta.json records n_vocab = 23"):
        RepresentationStore.open(store)
    code, output = cli("analyze", str(store), "--min-contexts", "1")
    assert code == 2 and output.count("error:") == 1 and "vocab.parquet" in output
    (store / "vocab.parquet").write_bytes(original)
    assert RepresentationStore.open(store).vocab["word"].tolist()[:3] == pd.read_parquet(store / "vocab.parquet")["word"].tolist()[:3]


def test_a_store_written_without_checksums_opens_and_verify_says_so(store):
    meta = json.loads((store / "meta.json").read_text())
    del meta["integrity"]
    (store / "meta.json").write_text(json.dumps(meta))
    (store / "checksums.json").unlink()
    (store / "meta.json.crc32c").unlink()
    with pytest.warns(UserWarning, match="records no checksums at all"):
        assert np.asarray(RepresentationStore.open(store).layer(2)[:]).tobytes() == hidden()[2].tobytes()
    result = verify_store(store)
    assert result.ok and not result.checksums and result.checked == 0
    code, output = cli("verify", str(store))
    assert code == 0 and "checksums absent" in output
    chunk(store, 0, 1).unlink()  # sizes and presence are still checked
    code, output = cli("verify", str(store))
    assert code == 2 and flat(str(chunk(store, 0, 1))) in flat(output)


def test_damaged_checksums_are_reported_not_trusted(store):
    checksums = json.loads((store / "checksums.json").read_text())
    checksums["layers/0/c/0/0"] = "0" * 8
    (store / "checksums.json").write_text(json.dumps(checksums))
    result = verify_store(store)
    assert len(result.problems) == 1 and "checksums.json is damaged" in result.problems[0]
    # a checksummed path leading out of the store, with meta.json made to match: refused
    checksums["../outside"] = "0" * 8
    (store / "checksums.json").write_text(json.dumps(checksums))
    meta = json.loads((store / "meta.json").read_text())
    meta["integrity"]["checksums"] = crc32c((store / "checksums.json").read_bytes())
    rewrite_meta(store, meta)
    result = verify_store(store)
    assert len(result.problems) == 1 and "checksummed file '../outside' does not lie inside the store" in result.problems[0]
    with pytest.raises(CorruptStore, match=r"checksummed file '\.\./outside' does not lie inside the store"):
        RepresentationStore.open(store).layer(0)


# ---- sharded stores: memory:// and a local folder -----------------------------------------------------


@pytest.fixture(scope="module")
def encoder() -> Encoder:
    return load_encoder("tiny-bert", device="cpu")


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return load_corpus("lee", limit=40)


@pytest.fixture
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    """64-row chunks in shard parts: several chunk files per part, the last one of each padded."""
    monkeypatch.setattr("lmgeom.store.layout.chunk_rows", lambda dim, expected_rows=None: 64)


def test_a_memory_store_is_checked_on_open_and_verified(encoder, corpus, small_parts):
    url = f"memory://lmgeom-tests/{uuid.uuid4().hex}"
    store = extract(encoder, corpus, url, chunk_sentences=8)
    intact = [np.asarray(store.layer(layer)[:]) for layer in store.layers]
    location = Location.of(url)
    fs = fsspec.filesystem("memory")
    assert verify_store(url).ok
    part = store.meta["shards"][1]["part"]
    name = f"shards/{part}/layers/2/c/1/0"
    good = location.read_bytes(name)
    assert len(good) == 64 * encoder.dim * 4
    flipped = bytearray(good)
    flipped[0] ^= 0x80
    location.write_bytes(bytes(flipped), name)
    result = verify_store(url)
    assert len(result.problems) == 1 and f"{url}/{name}" in result.problems[0]
    location.write_bytes(good[:100], name)
    with pytest.raises(CorruptStore, match=f"layer 2: chunk file {url}/{name} is 100 bytes, not {len(good):,}"):
        RepresentationStore.open(url)
    fs.rm(location.path(name))
    with pytest.raises(CorruptStore, match=f"layer 2: chunk file {url}/{name} is missing"):
        RepresentationStore.open(url)
    code, output = cli("verify", url)
    assert code == 2 and flat(f"{url}/{name}") in flat(output)
    location.write_bytes(good, name)
    reread = RepresentationStore.open(url)
    for layer, expected in zip(reread.layers, intact):
        assert np.asarray(reread.layer(layer)[:]).tobytes() == expected.tobytes()


def test_a_local_sharded_store_is_checked_and_its_parts_stay_inside(encoder, corpus, tmp_path, small_parts):
    path = tmp_path / "sharded"
    store = extract_sharded(encoder, corpus, path, chunk_sentences=8, shard_sentences=16)
    assert len(store.meta["shards"]) == 3 and verify_store(path).ok
    reference = extract(encoder, corpus, tmp_path / "plain", chunk_sentences=8)
    for layer in store.layers:
        np.testing.assert_allclose(np.asarray(store.layer(layer)[:]), np.asarray(reference.layer(layer)[:]), rtol=0, atol=1e-6)
    checksums = json.loads((path / "checksums.json").read_text())
    assert all(name.startswith("shards/") for name in checksums)
    n_chunks = sum(-(-int(entry["n_rows"]) // 64) for entry in store.meta["shards"])
    assert len(checksums) == (n_chunks + len(store.meta["shards"])) * store.meta["n_layers"]  # and each part's zarr.json
    target = path / "shards" / store.meta["shards"][0]["part"] / "layers" / "0" / "c" / "0" / "0"
    target.unlink()
    with pytest.raises(CorruptStore, match="layer 0: chunk file .* is missing") as error:
        RepresentationStore.open(path)
    assert str(target) in str(error.value)

    meta_path = path / "meta.json"
    meta = json.loads(meta_path.read_text())
    # a part outside the store, where a whole store's layout is waiting to be read: refused
    shutil.copytree(path / "shards" / meta["shards"][1]["part"], tmp_path / "elsewhere")
    for part in ("../../elsewhere", str(tmp_path / "elsewhere"), (tmp_path / "elsewhere").as_uri(), "a/../../x"):
        meta["shards"][0]["part"] = part
        rewrite_meta(path, meta)
        with pytest.raises(CorruptStore, match="shard part .* does not lie inside the store"):
            RepresentationStore.open(path)
        code, output = cli("analyze", str(path), "--min-contexts", "1")
        assert code == 2 and output.count("error:") == 1 and "does not lie inside the store" in " ".join(output.split())
        assert not verify_store(path).ok
