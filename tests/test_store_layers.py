"""Layer selection at extraction (`store_layers`): the forms it takes, a store of some layers keeping
the model's numbering, its refusals (a layer not stored, a resume with other layers), both encoders
and both writers, and every step of the main job on such a store."""

from __future__ import annotations

import json
import re
import uuid

import numpy as np
import pytest
from typer.testing import CliRunner

from lmgeom.cli.main import app
from lmgeom.corpus import lee
from lmgeom.encoders import load_encoder
from lmgeom.errors import InputError, OutOfRange
from lmgeom.layerspec import select_layers
from lmgeom.stages import extract
from lmgeom.store import RepresentationStore, layout
from lmgeom.store.writer import StoreExistsError

from helpers import rewrite_meta


@pytest.fixture(scope="module")
def corpus():
    return lee().head(40)


@pytest.fixture(scope="module")
def tiny_bert():
    return load_encoder("tiny-bert", device="cpu")  # 3 blocks: layers 0..3


@pytest.fixture(scope="module")
def full_store(tmp_path_factory, tiny_bert, corpus):
    return extract(tiny_bert, corpus, tmp_path_factory.mktemp("full") / "store", chunk_sentences=16)


def test_layer_specs_name_the_models_layers():
    """The one grammar (`lmgeom.layerspec`), against the model's layers 0..6 and against a store of some."""
    def every(spec):
        return select_layers(spec, range(7), n_layers=7, param="store_layers")

    assert every(None) == every("all") == list(range(7))
    assert every("last") == every("-1") == [6] and every("first") == [0]
    assert every("6,0,3") == [0, 3, 6] and every("0,-2,-1") == [0, 5, 6]
    assert every("0-2,last") == [0, 1, 2, 6]
    assert every("every:4") == [0, 4, 6]  # the first and the last kept
    assert every("every:3") == [0, 3, 6]
    assert every((5, 1, 5)) == [1, 5] and every((-1, 0)) == [0, 6]
    assert every("default") == [0, 3, 6]
    with pytest.raises(OutOfRange, match=r"`store_layers` '0,7': layer 7 is not among the model's layers 0\.\.6"):
        every("0,7")
    with pytest.raises(OutOfRange, match="layer -1 is not among"):  # -8 is one before layer 0
        every("-8")
    for bad in ("x", "every:0", "3-1", "", "1.5", "-1-2"):
        with pytest.raises(InputError, match="`store_layers` takes 'all', 'first', 'last'"):
            every(bad)
    # a store of layers 0, 6 and 12 of a 13-layer model: its layers, in the model's numbering
    stored = [0, 6, 12]
    assert select_layers("-1", stored, n_layers=13) == select_layers("last", stored, n_layers=13) == [12]
    assert select_layers("default", stored, n_layers=13) == [0, 6, 12]
    assert select_layers("every:6", stored, n_layers=13) == [0, 6, 12]
    assert select_layers(None, stored, n_layers=13, default="default") == [0, 6, 12]
    with pytest.raises(OutOfRange, match=r"layers 1, 2 are not among the stored layers 0, 6, 12 of the model's 0\.\.12"):
        select_layers("0-2", stored, n_layers=13)
    # "default" picks the stored layer nearest the middle (the smaller on a tie)
    assert select_layers("default", [0, 2, 4, 8, 10, 12], n_layers=13) == [0, 4, 12]


def test_a_store_of_some_layers_keeps_their_numbers_and_vectors(tmp_path, tiny_bert, corpus, full_store):
    store = extract(tiny_bert, corpus, tmp_path / "some", chunk_sentences=16, store_layers="0,2")
    assert store.layers == [0, 2] and store.n_model_layers == 4
    assert store.meta["stored_layers"] == [0, 2] and store.meta["n_layers"] == 4
    assert "layer 0 is the embedding output" in store.meta["layer_note"]
    assert sorted(path.name for path in (tmp_path / "some" / "layers").iterdir()) == ["0", "2"]
    for layer in (0, 2):  # the same batches, pooled for fewer layers: the same bytes
        assert np.asarray(store.layer(layer)[:]).tobytes() == np.asarray(full_store.layer(layer)[:]).tobytes()
    assert store.tokens.equals(full_store.tokens) and store.sentences.equals(full_store.sentences)
    assert full_store.meta["stored_layers"] == [0, 1, 2, 3]
    with pytest.raises(OutOfRange, match=r"layer 1 is not stored: this store holds layers 0, 2 of the model's 0\.\.3"):
        store.layer(1)
    with pytest.raises(OutOfRange, match=r"layer 9 out of range: this store holds layers 0, 2"):
        store.rows(9, np.arange(3))
    assert "layers=0, 2" in repr(store)


def test_the_last_layer_alone_and_every_k(tmp_path, tiny_bert, corpus, full_store):
    last = extract(tiny_bert, corpus.head(10), tmp_path / "last", store_layers="last")
    assert last.layers == [3]
    every = extract(tiny_bert, corpus.head(10), tmp_path / "every", store_layers="every:2")
    assert every.layers == [0, 2, 3]
    rows = full_store.sentence_rows(9)[-1] + 1  # the first 10 sentences' rows
    np.testing.assert_array_equal(np.asarray(last.layer(3)[:]), np.asarray(full_store.layer(3)[:rows]))


def test_a_resume_or_rerun_with_other_layers_is_refused(tmp_path, tiny_bert, corpus):
    class Stop(Exception):
        pass

    class StopAfterOne:
        def start(self, stage, total, *, unit="items"):
            pass

        def advance(self, stage, n=1, *, note=""):
            if note not in ("resumed", "already extracted"):
                raise Stop

    out = tmp_path / "store"
    with pytest.raises(Stop):
        extract(tiny_bert, corpus, out, chunk_sentences=16, sort_window=16, store_layers="0,3", progress=StopAfterOne())
    with pytest.raises(StoreExistsError, match=r"different stored_layers\): it stores layers 0, 3, and these settings ask "
                                               r"for 0, 1, 2, 3 \(`store_layers`\); pass `overwrite=True`"):
        extract(tiny_bert, corpus, out, chunk_sentences=16, sort_window=16)
    resumed = extract(tiny_bert, corpus, out, chunk_sentences=16, sort_window=16, store_layers=[3, 0])  # the same set
    assert resumed.layers == [0, 3]
    with pytest.raises(StoreExistsError, match="it stores layers 0, 3, and these settings ask for 1"):
        extract(tiny_bert, corpus, out, chunk_sentences=16, sort_window=16, store_layers="1")
    replaced = extract(tiny_bert, corpus, out, chunk_sentences=16, sort_window=16, store_layers="1", overwrite=True)
    assert replaced.layers == [1]


def test_a_store_written_before_stored_layers_were_recorded_reads_and_resumes_as_every_layer(tmp_path, tiny_bert, corpus):
    out = tmp_path / "old"
    store = extract(tiny_bert, corpus.head(8), out)
    meta = json.loads((out / layout.META).read_text())
    for record in (meta, meta["settings"]):
        del record["stored_layers"]
    rewrite_meta(out, meta)
    old = RepresentationStore.open(out)
    assert old.layers == [0, 1, 2, 3] and old.layer(3).shape == store.layer(3).shape
    assert extract(tiny_bert, corpus.head(8), out).meta["created"] == meta["created"]  # the same run: nothing redone


def test_elmo_stores_some_layers(tmp_path, corpus):
    encoder = load_encoder("elmo-brown", device="cpu")
    sentences = corpus.head(6)
    full = extract(encoder, sentences, tmp_path / "full")
    some = extract(encoder, sentences, tmp_path / "some", store_layers="0,2")
    assert some.layers == [0, 2] and full.layers == [0, 1, 2]
    for layer in (0, 2):
        np.testing.assert_array_equal(np.asarray(some.layer(layer)[:]), np.asarray(full.layer(layer)[:]))


def test_a_sharded_store_of_some_layers(tiny_bert, corpus, full_store):
    url = f"memory://lmgeom-tests/{uuid.uuid4().hex}/store"
    store = extract(tiny_bert, corpus, url, chunk_sentences=16, store_layers="1,3")
    assert store.layers == [1, 3] and store.meta["stored_layers"] == [1, 3]
    for layer in (1, 3):  # chunk by chunk, as the local store was sorted before windows: within float error
        np.testing.assert_allclose(np.asarray(store.layer(layer)[:]), np.asarray(full_store.layer(layer)[:]), atol=1e-5)
    with pytest.raises(OutOfRange, match="holds layers 1, 3"):
        store.layer(0)
    from lmgeom.store.integrity import verify_store

    assert verify_store(url).ok


def test_the_main_job_on_a_store_of_some_layers(tmp_path):
    from lmgeom.pipeline import run

    result = run("tiny-gpt2", "lee", out=tmp_path / "run", limit=40, device="cpu", min_contexts=3, store_layers="1,3")
    assert result.store.layers == [1, 3]
    assert sorted(result.contextuality.layers["layer"].unique()) == [1, 3]
    assert [record["layer"] for record in result.summary] == [1, 3]
    isotropy = json.loads((tmp_path / "run" / "isotropy.json").read_text())
    assert sorted({int(record["layer"]) for record in isotropy["records"]}) == [1, 3]
    calibration = json.loads((tmp_path / "run" / "calibration.json").read_text())
    assert sorted({int(fit["layer"]) for fit in calibration["fits"]}) == [1, 3]  # "default": first, middle, last stored
    assert sorted(path.name for path in (tmp_path / "run" / "static").glob("*.benchmarks.json")) == ["1.benchmarks.json",
                                                                                                   "3.benchmarks.json"]
    page = (tmp_path / "run" / "report.html").read_text()
    assert "layers 1, 3 of 4 x 32 dims" in page  # the header
    assert re.findall(r'<option value="(\d+)"', page) == ["1", "3"]  # the word explorer's layers
    with pytest.raises(InputError, match=r"`layers` '0,1': layer 0 is not among the stored layers 1, 3 of the model's 0\.\.3"):
        run("tiny-gpt2", "lee", out=tmp_path / "run", limit=40, device="cpu", min_contexts=3, store_layers="1,3", layers="0,1")


def test_cli_extract_and_analyze_name_the_stored_layers(tmp_path):
    runner = CliRunner()
    out = tmp_path / "store"
    result = runner.invoke(app, ["extract", "tiny-bert", "--limit", "30", "--out", str(out), "--device", "cpu",
                                 "--store-layers", "0,3"])
    assert result.exit_code == 0, result.output
    assert "layers 0, 3 of 4" in " ".join(result.output.split())
    assert RepresentationStore.open(out).layers == [0, 3]
    analysed = runner.invoke(app, ["analyze", str(out), "--min-contexts", "2", "--device", "cpu"])
    assert analysed.exit_code == 0, analysed.output
    table = json.loads((out / "contextuality.json").read_text())
    assert table["settings"]["layers"] == [0, 3] and sorted({int(record["layer"]) for record in table["records"]}) == [0, 3]
    printed = [line.split("│")[1].strip() for line in analysed.output.splitlines() if line.count("│") > 3]
    assert {row for row in printed if row.isdigit()} == {"0", "3"}  # the layer column of the terminal tables
    refused = runner.invoke(app, ["extract", "tiny-bert", "--limit", "30", "--out", str(out), "--device", "cpu"])
    assert refused.exit_code == 2 and "it stores layers 0, 3" in " ".join(refused.output.split())
    bad = runner.invoke(app, ["extract", "tiny-bert", "--limit", "30", "--out", str(tmp_path / "bad"), "--store-layers", "9"])
    assert bad.exit_code == 2 and "--store-layers" in bad.output and "0..3" in bad.output
