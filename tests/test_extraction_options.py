"""The extraction and encoder stages' options objects (built once, passed whole, rebuilt from what a
store records), and extraction's length-sorted windows (corpus order in the store, deterministic,
resumed bit for bit)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from lmgeom.corpus import lee
from lmgeom.encoders import EncoderOptions, load_encoder
from lmgeom.errors import InputError
from lmgeom.stages import extract, extract_model
from lmgeom.stages.extraction_options import ExtractionOptions, default_chunk_sentences, default_sort_window
from lmgeom.store import RepresentationStore

from helpers import rewrite_meta


@pytest.fixture(scope="module")
def corpus():
    return lee().head(48)


@pytest.fixture(scope="module")
def tiny_bert():
    return load_encoder("tiny-bert", device="cpu")


def test_options_are_frozen_and_refuse_unknown_or_bad_fields():
    options = ExtractionOptions(storage_dtype="float16", store_layers=[3, 0])
    assert options.store_layers == (3, 0)  # a list becomes a tuple: the options stay hashable
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.storage_dtype = "float32"  # type: ignore[misc]
    with pytest.raises(InputError, match="unknown extraction option dtype; the options are field"):
        ExtractionOptions.of(dtype="float16")
    with pytest.raises(InputError, match="unknown encoder option dtype"):
        EncoderOptions.of(dtype="float16")
    with pytest.raises(InputError, match="`storage_dtype` must be one of float32, float16"):
        ExtractionOptions(storage_dtype="bfloat16")
    with pytest.raises(InputError, match=r"`sort_window` \(24\) must be a multiple of `chunk_sentences` \(16\)"):
        ExtractionOptions(chunk_sentences=16, sort_window=24)
    with pytest.raises(InputError, match="unknown `pooling` 'max'"):
        EncoderOptions(pooling="max")
    with pytest.raises(InputError, match="`limit`"):
        ExtractionOptions(limit=0)


def test_a_stores_settings_rebuild_the_options_that_made_it(tmp_path, corpus):
    extraction = ExtractionOptions(storage_dtype="float16", store_layers="every:2", chunk_sentences=16, compress="zstd")
    encoder_options = EncoderOptions(device="cpu", pooling="first", keep_special=True, max_length=24)
    store = extract(load_encoder("tiny-bert", encoder_options), corpus, tmp_path / "s", extraction)
    resolved = extraction.resolve(4, 32, len(corpus))
    assert resolved.store_layers == (0, 2, 3) and resolved.sort_window == 48  # the corpus in one window
    assert ExtractionOptions.from_settings(store.meta) == resolved
    rebuilt = EncoderOptions.from_settings(store.meta, device="cpu")
    assert rebuilt == dataclasses.replace(encoder_options, compute_dtype="float32")  # the dtype it resolved to
    # the rebuilt options make the same run: its re-run finds the store complete
    again = extract(load_encoder("tiny-bert", rebuilt), corpus, tmp_path / "s", ExtractionOptions.from_settings(store.meta))
    assert again.meta["created"] == store.meta["created"] and again.meta["generation"] == store.meta["generation"]
    assert store.meta["dtype"] == "float16" and store.meta["compute_dtype"] == "float32"  # storage and compute: two names


def test_before_final_norm_is_rebuilt_from_the_recorded_last_layer(tmp_path, corpus):
    store = extract(load_encoder("tiny-gpt2", device="cpu", before_final_norm=True), corpus.head(4), tmp_path / "b")
    assert EncoderOptions.from_settings(store.meta).before_final_norm
    plain = extract(load_encoder("tiny-gpt2", device="cpu"), corpus.head(4), tmp_path / "p")
    assert not EncoderOptions.from_settings(plain.meta).before_final_norm


def test_keyword_calls_and_option_objects_make_the_same_store(tmp_path):
    by_keywords = extract_model("tiny-bert", "lee", out=tmp_path / "k", limit=20, store_layers="0,3", device="cpu",
                                pooling="last", storage_dtype="float16")
    by_objects = extract_model("tiny-bert", "lee", out=tmp_path / "o",
                               options=ExtractionOptions(limit=20, store_layers=(0, 3), storage_dtype="float16"),
                               encoder=EncoderOptions(device="cpu", pooling="last"))
    assert by_keywords.meta["settings"] == by_objects.meta["settings"]
    for layer in (0, 3):
        assert np.asarray(by_keywords.layer(layer)[:]).tobytes() == np.asarray(by_objects.layer(layer)[:]).tobytes()
    with pytest.raises(InputError, match="unknown option dtype; the extraction options are"):
        extract_model("tiny-bert", "lee", out=tmp_path / "x", limit=5, dtype="float16")


def test_sort_windows_keep_corpus_order_and_the_vectors(tmp_path, tiny_bert, corpus):
    """One window of the corpus against windows of one chunk (each chunk sorted on its own): the same
    tables, rows in corpus order, vectors within float error (other batches); the same call twice
    gives the same bytes."""
    whole = extract(tiny_bert, corpus, tmp_path / "whole", chunk_sentences=16)
    chunked = extract(tiny_bert, corpus, tmp_path / "chunked", chunk_sentences=16, sort_window=16)
    again = extract(tiny_bert, corpus, tmp_path / "again", chunk_sentences=16)
    assert whole.meta["sort_window"] == 48 and chunked.meta["sort_window"] == 16
    assert whole.tokens.equals(chunked.tokens) and whole.sentences.equals(chunked.sentences)
    assert whole.sentences["text"].tolist() == [s.text for s in corpus.sentences]
    single = tiny_bert.encode(corpus.sentences[5:6])[0]  # one sentence alone, no padding
    rows = whole.sentence_rows(5)
    for layer in whole.layers:
        np.testing.assert_allclose(np.asarray(whole.layer(layer)[:]), np.asarray(chunked.layer(layer)[:]), atol=1e-5)
        np.testing.assert_allclose(whole.rows(layer, rows), single.vectors[layer], atol=1e-5)
        assert np.asarray(whole.layer(layer)[:]).tobytes() == np.asarray(again.layer(layer)[:]).tobytes()


def test_a_resume_inside_a_window_encodes_it_again_whole_and_matches_bit_for_bit(tmp_path, tiny_bert, corpus):
    class Stop(Exception):
        pass

    class StopAfter:
        def __init__(self, chunks: int) -> None:
            self.left = chunks

        def start(self, stage, total, *, unit="items"):
            pass

        def advance(self, stage, n=1, *, note=""):
            if note in ("resumed", "already extracted"):
                return
            self.left -= 1
            if self.left == 0:
                raise Stop

    once = extract(tiny_bert, corpus, tmp_path / "once", chunk_sentences=8, sort_window=24)
    with pytest.raises(Stop):  # windows of 3 chunks; stopped after chunk 4, inside the second window
        extract(tiny_bert, corpus, tmp_path / "resumed", chunk_sentences=8, sort_window=24, progress=StopAfter(4))
    done = json.loads((tmp_path / "resumed" / "progress.json").read_text())["n_sentences"]
    assert done in (32, 40, 48)  # commits queued behind the one reported may have finished

    class Recording:
        def __init__(self, inner):
            self.inner, self.model_id, self.n_layers, self.dim = inner, inner.model_id, inner.n_layers, inner.dim
            self.calls: list[tuple[int, int]] = []

        def settings(self):
            return self.inner.settings()

        def encode(self, sentences, *, first_index=0, **kwargs):
            self.calls.append((first_index, len(sentences)))
            return self.inner.encode(sentences, first_index=first_index, **kwargs)

    recording = Recording(tiny_bert)
    resumed = extract(recording, corpus, tmp_path / "resumed")  # the chunks and windows of the run it resumes
    assert recording.calls == ([(24, 24)] if done < 48 else [])  # the second window again, whole
    assert resumed.meta["sort_window"] == 24 and resumed.meta["chunk_sentences"] == 8
    for layer in once.layers:
        assert np.asarray(once.layer(layer)[:]).tobytes() == np.asarray(resumed.layer(layer)[:]).tobytes()
    assert once.tokens.equals(resumed.tokens) and once.sentences.equals(resumed.sentences)


def test_a_store_written_before_sort_windows_resumes_chunk_by_chunk(tmp_path, tiny_bert, corpus):
    out = tmp_path / "old"
    store = extract(tiny_bert, corpus, out, chunk_sentences=16, sort_window=16)
    meta = json.loads((out / "meta.json").read_text())
    for record in (meta, meta["settings"]):
        del record["sort_window"]
    rewrite_meta(out, meta)
    again = extract(tiny_bert, corpus, out)  # its chunks and (one-chunk) windows: the same run
    assert again.meta["created"] == store.meta["created"]
    assert RepresentationStore.open(out).meta.get("sort_window") is None


def test_default_windows_hold_the_corpus_within_the_memory_budget():
    chunk = default_chunk_sentences(31, 576, 300)  # SmolLM2 on 300 sentences: chunks of 128
    assert chunk == 128 and default_sort_window(31, 576, 300, chunk) == 384  # one window of the corpus
    chunk = default_chunk_sentences(31, 576, 2680)
    window = default_sort_window(31, 576, 2680, chunk)
    assert window % chunk == 0 and window * 31 * 576 * 4 * 32 <= 2**30 < (window + chunk) * 31 * 576 * 4 * 32
    assert default_sort_window(3, 32, 10, 64) == 64  # at least one chunk
