"""Every read of a store is checked against the checksums it records: a chunk file damaged at its size
and a table with flipped bits are refused as they are read, naming the file; an edited zarr.json
(data type, an inserted codec) or meta.json (stored_layers, n_layers) is refused by every reader on open.
A store written before the metadata was checksummed opens with a warning, its metadata still checked
against the rest of the store. Real stores of tiny-bert over Lee, damaged as a hostile tester would."""

from __future__ import annotations

import json
import shutil
import uuid
import warnings
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from lmgeom.cli.main import app
from lmgeom.corpus import load_corpus
from lmgeom.encoders.registry import load_encoder
from lmgeom.stages import analyze_store, extract
from lmgeom.store import CorruptStore, RepresentationStore, verify_store
from lmgeom.store.integrity import UnverifiedStoreWarning, crc32c
from lmgeom.store.location import Location

from helpers import predate_metadata_digests, rewrite_meta

READERS = (("analyze", "--min-contexts", "2"), ("similarity",), ("geometry",))


@pytest.fixture(scope="module")
def intact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("read-checks") / "tiny-bert-lee"
    extract(load_encoder("tiny-bert", device="cpu"), load_corpus("lee", limit=40), path)
    return path


@pytest.fixture
def store(intact: Path, tmp_path: Path) -> Path:
    """A copy of the intact store to damage."""
    return Path(shutil.copytree(intact, tmp_path / "store"))


def cli(*args: str) -> tuple[int, str]:
    outcome = CliRunner().invoke(app, list(args))
    return outcome.exit_code, outcome.output


def flat(text: str) -> str:
    """CLI output without the line breaks and spaces rich wraps it with."""
    return "".join(text.split())


def every_reader_refuses(store: Path, named: Path, *, match: str) -> None:
    """Each reading command exits 2 with one error line naming `named`; verify names it too."""
    for command in READERS:
        code, output = cli(command[0], str(store), *command[1:])
        assert code == 2 and output.count("error:") == 1, (command, output)
        assert flat(str(named)) in flat(output) and flat(match) in flat(output), (command, output)
    code, output = cli("verify", str(store))
    assert code == 2 and flat(str(named)) in flat(output), output


def edit_json(path: Path, edit) -> None:
    document = json.loads(path.read_text())
    edit(document)
    path.write_text(json.dumps(document, indent=2))


def test_a_chunk_zeroed_at_its_size_is_refused_by_the_analysis_naming_it(store):
    path = store / "layers" / "1" / "c" / "0" / "0"
    data = bytearray(path.read_bytes())
    row_bytes = 32 * 4  # tiny-bert's rows: 32 float32
    data[100 * row_bytes : 600 * row_bytes] = bytes(500 * row_bytes)  # 500 rows inside the chunk, same size
    path.write_bytes(bytes(data))
    opened = RepresentationStore.open(store)  # its size is right: the open passes
    assert np.asarray(opened.layer(0)[:]).shape == (opened.n_tokens, 32)  # other layers read
    with pytest.raises(CorruptStore, match="layer 1: chunk file .* is damaged or was edited") as error:
        analyze_store(store, min_contexts=2)
    assert str(path) in str(error.value) and error.value.path == "layers/1/c/0/0" and "overwrite=True" in str(error.value)
    every_reader_refuses(store, path, match="is damaged or was edited")


def test_a_file_changed_after_it_was_read_is_refused_when_read_again(store):
    opened = RepresentationStore.open(store)
    before = np.asarray(opened.layer(2)[:])
    assert len(opened.token_columns("word")) == opened.n_tokens
    path = store / "layers" / "2" / "c" / "0" / "0"
    data = bytearray(path.read_bytes())
    data[4] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptStore, match="damaged"):
        opened.layer(2)[:]  # nothing cached: the same array, read again, is checked again
    with pytest.raises(CorruptStore, match="damaged"):
        RepresentationStore.open(store).layer(2)[:]
    data[4] ^= 0x10
    path.write_bytes(bytes(data))
    assert np.asarray(opened.layer(2)[:]).tobytes() == before.tobytes()


def test_flipped_bits_in_the_token_table_are_refused_naming_it(store):
    path = store / "tokens.parquet"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x0F  # 4 bits of a word or a label, the file's size unchanged
    path.write_bytes(bytes(data))
    opened = RepresentationStore.open(store)  # its size and footer are right: the open passes
    for read in (lambda: opened.tokens, lambda: opened.token_columns("word_id")):
        with pytest.raises(CorruptStore, match="tokens.parquet is damaged or not this store's: its crc32c") as error:
            read()
        assert str(path) in str(error.value) and error.value.path == "tokens.parquet"
    every_reader_refuses(store, path, match="is damaged or not this store's")


def test_an_edited_data_type_in_zarr_json_is_refused_by_every_reader(store):
    path = store / "layers" / "2" / "zarr.json"
    edit_json(path, lambda array: array.update(data_type="int32"))  # the same bytes read as integers
    with pytest.raises(CorruptStore, match="layer 2: .*zarr.json is damaged or was edited") as error:
        RepresentationStore.open(store)
    assert error.value.path == "layers/2/zarr.json"
    every_reader_refuses(store, path, match="is damaged or was edited")
    assert any(str(path) in problem for problem in verify_store(store).problems)


def test_an_inserted_transpose_codec_is_refused_by_every_reader(store):
    path = store / "layers" / "1" / "zarr.json"
    edit_json(path, lambda array: array["codecs"].insert(0, {"name": "transpose", "configuration": {"order": [1, 0]}}))
    with pytest.raises(CorruptStore, match="layer 1: .*zarr.json is damaged or was edited"):
        RepresentationStore.open(store)
    every_reader_refuses(store, path, match="is damaged or was edited")


@pytest.mark.parametrize("key, value", [("stored_layers", [0, 1, 3]), ("n_layers", 5)])
def test_an_edited_meta_json_is_refused_by_every_reader(store, key, value):
    edit_json(store / "meta.json", lambda meta: meta.update({key: value}))
    with pytest.raises(CorruptStore, match=r"meta.json is damaged or was edited: its crc32c \w+ is not the") as error:
        RepresentationStore.open(store)
    assert error.value.path == "meta.json"
    every_reader_refuses(store, store / "meta.json", match="is damaged or was edited")
    problems = verify_store(store).problems
    assert any("meta.json is damaged" in problem for problem in problems)
    if key == "stored_layers":  # and the layer meta.json no longer lists
        assert any(str(store / "layers" / "2") in problem and "not among the layers" in problem for problem in problems)


def test_meta_json_without_its_digest_file_is_refused(store):
    (store / "meta.json.crc32c").unlink()
    with pytest.raises(CorruptStore, match=r"meta.json.crc32c is missing"):
        RepresentationStore.open(store)
    assert any("meta.json.crc32c is missing" in problem for problem in verify_store(store).problems)


def test_a_layer_without_a_zarr_json_checksum_is_refused(store):
    edit_json(store / "checksums.json", lambda checksums: checksums.pop("layers/3/zarr.json"))
    meta = json.loads((store / "meta.json").read_text())
    meta["integrity"]["checksums"] = crc32c((store / "checksums.json").read_bytes())
    rewrite_meta(store, meta)
    with pytest.raises(CorruptStore, match=r"layer 3: .*zarr.json has no checksum in checksums.json"):
        RepresentationStore.open(store)


# ---- stores written before the metadata was checksummed --------------------------------------------


def test_a_store_predating_the_metadata_digests_opens_once_warned_and_reads_checked(store):
    predate_metadata_digests(store)
    with pytest.warns(UnverifiedStoreWarning, match=r"written before lmgeom recorded checksums of meta.json") as caught:
        opened = RepresentationStore.open(store)
        RepresentationStore.open(store)
    assert len(caught) == 1 and "lmgeom verify" in str(caught[0].message)
    assert np.asarray(opened.layer(3)[:]).shape == (opened.n_tokens, 32)
    code, output = cli("verify", str(store))
    assert code == 0 and flat("have no recorded CRC32C") in flat(output)
    path = store / "layers" / "0" / "c" / "0" / "0"  # its chunk files are still checked as they are read
    data = bytearray(path.read_bytes())
    data[0] ^= 0x01
    path.write_bytes(bytes(data))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnverifiedStoreWarning)
        with pytest.raises(CorruptStore, match="layer 0: chunk file .* is damaged"):
            RepresentationStore.open(store).layer(0)[:]


def test_edits_to_a_predating_stores_metadata_are_refused_where_they_contradict_it(store, tmp_path):
    predate_metadata_digests(store)
    pristine = tmp_path / "pristine"
    shutil.copytree(store, pristine)
    zarr_json = Path("layers") / "2" / "zarr.json"
    cases = [
        (zarr_json, lambda array: array.update(data_type="int32"), "gives data type int32, but meta.json float32"),
        (zarr_json, lambda array: array["codecs"].insert(0, {"name": "transpose", "configuration": {"order": [1, 0]}}),
         "gives the codecs TransposeCodec, BytesCodec"),
        (Path("meta.json"), lambda meta: [record.update(stored_layers=[0, 1, 3]) for record in (meta, meta["settings"])],
         "layers/2 is not among the layers meta.json's stored_layers [0, 1, 3] lists"),
        (Path("meta.json"), lambda meta: meta.update(n_layers=5), "records n_layers = 5, but its settings n_layers = 4"),
        (Path("meta.json"), lambda meta: [record.update(n_layers=3) for record in (meta, meta["settings"])],
         "records stored_layers [0, 1, 2, 3], not distinct layers among the model's 0..2"),
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnverifiedStoreWarning)
        for relative, edit, match in cases:
            shutil.rmtree(store)
            shutil.copytree(pristine, store)
            edit_json(store / relative, edit)
            with pytest.raises(CorruptStore, match=match.replace("[", r"\[").replace("]", r"\]")):
                RepresentationStore.open(store)
            code, output = cli("analyze", str(store), "--min-contexts", "2")
            assert code == 2 and output.count("error:") == 1 and flat(match) in flat(output), output
            assert any(match in problem for problem in verify_store(store).problems)


# ---- an object store --------------------------------------------------------------------------------


def test_a_chunk_damaged_in_a_memory_store_is_refused_as_read():
    url = f"memory://lmgeom-tests/{uuid.uuid4().hex}"
    store = extract(load_encoder("tiny-bert", device="cpu"), load_corpus("lee", limit=12), url)
    intact = np.asarray(store.layer(1)[:])
    location = Location.of(url)
    name = next(path for path in location.files() if "/layers/1/c/" in path)
    good = location.read_bytes(name)
    location.write_bytes(bytes(len(good)), name)  # zeros at its size
    with pytest.raises(CorruptStore, match=f"layer 1: chunk file {url}/{name} is damaged"):
        RepresentationStore.open(url).layer(1)[:]
    location.write_bytes(good, name)
    assert np.asarray(RepresentationStore.open(url).layer(1)[:]).tobytes() == intact.tobytes()
    zarr_json = next(path for path in location.files() if path.endswith("layers/0/zarr.json"))
    location.write_bytes(location.read_bytes(zarr_json).replace(b'"float32"', b'"int32"'), zarr_json)
    with pytest.raises(CorruptStore, match="layer 0: .*zarr.json is damaged or was edited"):
        RepresentationStore.open(url)
