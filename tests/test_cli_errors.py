"""Bad numbers and devices on the command line: exit 2 with one message naming the option, no traceback."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from lmgeom.cli.main import app


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


@pytest.mark.parametrize("args, option", [
    (["extract", "tiny-bert", "--out", "OUT", "--chunk-sentences", "0"], "--chunk-sentences"),
    (["extract", "tiny-bert", "--out", "OUT", "--chunk-sentences", "-4"], "--chunk-sentences"),
    (["extract", "tiny-bert", "--out", "OUT", "--max-batch-tokens", "0"], "--max-batch-tokens"),
    (["extract", "tiny-bert", "--out", "OUT", "--seed", "-1"], "--seed"),
    (["run", "--num-workers", "0"], "--num-workers"),
    (["run", "--min-contexts", "0"], "--min-contexts"),
    (["analyze", "STORE", "--rows", "0"], "--rows"),
    (["analyze", "STORE", "--rows", "-5"], "--rows"),
    (["geometry", "STORE", "--bootstrap", "-1"], "--bootstrap"),
    (["analyze", "STORE", "--seed", "-1"], "--seed"),
    (["analyze", "STORE", "--mev-memory-mb", "-1"], "--mev-memory-mb"),
    (["calibrate", "STORE", "--eval-rows", "1"], "--eval-rows"),
    (["elmo", "train", "--out", "OUT", "--checkpoint-every", "0"], "--checkpoint-every"),
    (["elmo", "train", "--out", "OUT", "--max-steps", "0"], "--max-steps"),
    (["elmo", "train", "--out", "OUT", "--dropout", "1"], "--dropout"),
    (["experiment", "layers", "--model", "tiny-bert", "--task", "pos", "--data", "D", "--out", "O", "--max-train", "0"],
     "--max-train"),
    (["sts", "tiny-bert", "--limit-pairs", "0"], "--limit-pairs"),
])
def test_numbers_out_of_range_name_the_option(tmp_path, args, option):
    args = [str(tmp_path / a) if a in ("OUT", "STORE", "D", "O") else a for a in args]
    code, output = invoke(*args)
    assert code == 2, output
    assert option in output and "Traceback" not in output
    assert not any(tmp_path.iterdir())  # refused before anything was written


def test_neighbours_must_be_fewer_than_the_explorer_words(tmp_path):
    code, output = invoke("report", str(tmp_path), "--neighbours", "100000")
    assert code == 2 and "--neighbours" in output and "--explorer-words (2000)" in output


def test_unknown_device_and_a_window_beyond_the_model(tmp_path):
    code, output = invoke("extract", "tiny-bert", "--corpus", "lee", "--limit", "5", "--out", str(tmp_path / "a"),
                          "--device", "tpu")
    assert code == 2 and "unknown --device 'tpu'" in output and "Traceback" not in output
    code, output = invoke("extract", "tiny-bert", "--corpus", "lee", "--limit", "5", "--out", str(tmp_path / "b"),
                          "--max-length", "100000")
    assert code == 2 and "--max-length 100000 is outside 2..64" in output


# ---- inputs that are not what they promise: one line naming the input and the fix -----------------

def one_line_error(code: int, output: str) -> str:
    """The error line of a refused command (exit 2, no traceback, no "internal error"), flattened."""
    assert code == 2, output
    assert "Traceback" not in output and "internal error" not in output, output
    return " ".join(output.split())


@pytest.fixture(scope="module")
def model_folders(tmp_path_factory: pytest.TempPathFactory):
    """Folders of the tiny models' weights: without a tokenizer (BERT, GPT-2), and a BERT whose only weights
    are a pytorch_model.bin holding a Python object besides tensors (refused by torch's weights_only)."""
    import os

    import torch

    from lmgeom.encoders.tiny import tiny_model

    root = tmp_path_factory.mktemp("models")
    for name in ("tiny-bert", "tiny-gpt2"):
        tiny_model(name)[0].save_pretrained(root / f"{name}-no-tokenizer")
    model, tokenizer = tiny_model("tiny-bert")
    unsafe = root / "unsafe"
    model.config.save_pretrained(unsafe)
    tokenizer.save_pretrained(unsafe)
    torch.save({**model.state_dict(), "extra": os.path.join}, unsafe / "pytorch_model.bin")  # a function: a pickled global
    assert not (unsafe / "model.safetensors").exists()
    return root


@pytest.mark.parametrize("name", ["tiny-bert-no-tokenizer", "tiny-gpt2-no-tokenizer"])
def test_a_model_folder_without_a_tokenizer_is_named(model_folders, tmp_path, name):
    folder = model_folders / name
    output = one_line_error(*invoke("run", "--model", str(folder), "--corpus", "lee", "--limit", "5",
                                    "--out", str(tmp_path / "run")))
    assert f"model folder {folder} holds no tokenizer" in output and "tokenizer.json" in output
    assert not (tmp_path / "run").exists()


def test_an_empty_model_name_is_refused(tmp_path):
    for command in (["run", "--model", "", "--corpus", "lee", "--out", str(tmp_path / "run")],
                    ["extract", " ", "--corpus", "lee", "--out", str(tmp_path / "run")]):
        output = one_line_error(*invoke(*command))
        assert "--model is empty" in output and "tiny-bert" in output
    assert not any(tmp_path.iterdir())


def test_weights_torchs_safe_loading_refuses_are_named_not_loaded(model_folders, tmp_path):
    output = one_line_error(*invoke("extract", str(model_folders / "unsafe"), "--corpus", "lee", "--limit", "5",
                                    "--out", str(tmp_path / "run")))
    assert "model " + str(model_folders / "unsafe") in output and "pytorch_model.bin" in output
    assert "safetensors" in output and "arbitrary code" in output


def test_a_benchmark_that_is_not_text_is_named_before_the_distillation(tmp_path):
    import numpy as np

    from lmgeom.store import write_store_from_arrays

    sentences = ["the cat sat".split(), "the dog ran".split()] * 3
    store = write_store_from_arrays(tmp_path / "store", [np.random.default_rng(0).normal(size=(18, 4))] * 2, sentences)
    binary = tmp_path / "some.bin"
    binary.write_bytes(bytes(range(256)) * 8)
    output = one_line_error(*invoke("static-embeddings", str(store.path), "--layer", "1", "--min-contexts", "1",
                                    "--benchmark", str(binary)))
    assert f"benchmark some: {binary} is not a text file" in output
    assert not (store.path / "static").exists()  # refused before anything was distilled or written


def test_negative_seeds_name_the_option(tmp_path):
    output = one_line_error(*invoke("experiment", "calibration", "--model", "tiny-bert", "--task", "pos", "--data",
                                    str(tmp_path), "--seeds", "-1,2", "--out", str(tmp_path / "out")))
    assert "--seeds takes seeds from 0" in output and "got -1" in output


@pytest.mark.parametrize("out, meant", [("s3:/bucket/x", "s3://bucket/x"), ("s3:x", "s3://x"), ("gs:/b/run", "gs://b/run")])
def test_a_url_without_its_slashes_is_refused_not_made_a_local_folder(tmp_path, monkeypatch, out, meant):
    monkeypatch.chdir(tmp_path)
    for command in (["extract", "tiny-bert", "--corpus", "lee", "--limit", "5", "--out", out],
                    ["run", "--model", "tiny-bert", "--corpus", "lee", "--limit", "5", "--out", out],
                    ["report", str(tmp_path), "--out", out]):
        code, output = invoke(*command)
        flat = " ".join(output.replace("│", " ").split())  # typer's box around a usage error
        assert code == 2 and "--out" in flat and f"write {meant}" in flat and "Traceback" not in output
    with pytest.raises(ValueError, match=f"write {meant}"):  # the library refuses it too
        from lmgeom.store.location import Location

        Location.of(out)
    assert not any(tmp_path.iterdir())


def test_a_table_parquet_cannot_decode_is_named(tmp_path):
    from lmgeom.store import write_store_from_arrays
    import numpy as np

    sentences = ["the cat sat on the mat".split(), "the dog ran".split()] * 4
    store = write_store_from_arrays(tmp_path / "store", [np.random.default_rng(0).normal(size=(36, 4))] * 2, sentences)
    tokens = store.path / "tokens.parquet"
    import pyarrow.parquet as pq

    metadata = pq.ParquetFile(tokens).metadata
    word = next(metadata.row_group(0).column(i) for i in range(metadata.num_columns)
                if metadata.row_group(0).column(i).path_in_schema == "word")
    data = bytearray(tokens.read_bytes())
    end = word.data_page_offset + word.total_compressed_size
    for index in range(end - 12, end - 2):  # the end of the word column's page: its compressed values
        data[index] ^= 0x5A
    tokens.write_bytes(bytes(data))
    assert pq.ParquetFile(tokens).metadata.num_rows == 36  # the footer still reads: only a page is damaged
    code, output = invoke("analyze", str(store.path), "--min-contexts", "2")
    flat = one_line_error(code, output)
    # the read checks the table's bytes against the CRC32C meta.json records before parquet decodes them
    assert f"corrupt store {store.path}: {tokens} is damaged or not this store's" in flat and "--overwrite" in flat
    # a store that records no digest for the table: parquet's decoding fails, named as the same error
    import json

    from helpers import rewrite_meta

    meta = json.loads((store.path / "meta.json").read_text())
    del meta["integrity"]["tables"]["tokens.parquet"]["digest"]
    rewrite_meta(store.path, meta)
    code, output = invoke("analyze", str(store.path), "--min-contexts", "2")
    flat = one_line_error(code, output)
    assert f"corrupt store {store.path}: tokens.parquet cannot be read" in flat and "--overwrite" in flat
