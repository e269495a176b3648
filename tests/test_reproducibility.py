"""Tiny models are the same in every process, their fingerprint covers weights, tokenizer and config,
and an extraction interrupted in one process resumes in another to the one-shot result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from lmgeom.corpus import load_corpus
from lmgeom.encoders import TINY_MODELS, HFEncoder, load_encoder
from lmgeom.encoders.tiny import TOKENIZER_DIR, tiny_model, tiny_tokenizer, train_tiny_tokenizer
from lmgeom.stages import extract
from lmgeom.store import RepresentationStore, StoreExistsError

SRC = Path(__file__).resolve().parents[1] / "src"
TEXT = "The Reserve Bank's governor didn't raise interest rates on 3,000 mortgages in north-west Sydney."


def _run_python(code: str, *, hash_seed: str, args: list[str]) -> str:
    """Run `code` in a fresh interpreter (its own hash seeds) with this checkout's sources first."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]), "PYTHONHASHSEED": hash_seed}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


N_SENTENCES = 20

# Each fresh process describes the tiny models, then the first extracts tiny-bert until its first
# committed chunk and is stopped, and the second resumes that extraction.
_FRESH_PROCESS = f"""
    import hashlib, json, sys
    from lmgeom.corpus import load_corpus
    from lmgeom.encoders import load_encoder
    from lmgeom.stages import extract

    described = {{}}
    for name in {TINY_MODELS!r}:
        encoder = load_encoder(name, device="cpu")
        vocab = sorted(encoder.tokenizer.get_vocab().items())
        described[name] = {{
            "ids": encoder.tokenizer({TEXT!r})["input_ids"],
            "vocab_sha": hashlib.sha256(json.dumps(vocab).encode()).hexdigest(),
            "fingerprint": encoder.settings()["model_fingerprint"],
        }}
    print(json.dumps(described))

    class Stop(Exception):
        pass

    class StopAtFirstChunk:
        def start(self, stage, total, *, unit="items"):
            pass

        def advance(self, stage, n=1, *, note=""):
            if note != "resumed":
                raise Stop

    try:
        extract(load_encoder("tiny-bert", device="cpu"), load_corpus("lee", limit={N_SENTENCES}), sys.argv[1],
                chunk_sentences=6, progress=StopAtFirstChunk() if sys.argv[2] == "interrupt" else None)
    except Stop:
        pass
"""


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, Path]:
    """(first process's description, second's, store interrupted by the first and resumed by the second)."""
    out = tmp_path_factory.mktemp("interrupted") / "run"
    first = json.loads(_run_python(_FRESH_PROCESS, hash_seed="1", args=[str(out), "interrupt"]))
    progress = json.loads((out / "progress.json").read_text())
    assert 1 <= progress["chunks"] <= 2 and progress["n_sentences"] < N_SENTENCES  # really interrupted
    second = json.loads(_run_python(_FRESH_PROCESS, hash_seed="2", args=[str(out), "resume"]))
    return first, second, out


@pytest.mark.processes
def test_tiny_tokenizers_and_fingerprints_are_the_same_in_every_process(two_processes: tuple[dict, dict, Path]) -> None:
    first, second, _ = two_processes
    assert first == second
    for name in TINY_MODELS:
        encoder = load_encoder(name, device="cpu")
        assert first[name]["ids"] == encoder.tokenizer(TEXT)["input_ids"]
        assert first[name]["fingerprint"] == encoder.settings()["model_fingerprint"]
        assert len(set(first[name]["ids"])) > 5  # the sentence really is split into many different pieces


@pytest.mark.parametrize("name", TINY_MODELS)
def test_shipped_tokenizer_is_what_train_tiny_tokenizer_makes(name: str) -> None:
    """The JSON files are the trainer's output: everything but the learned vocabulary matches a fresh training."""
    shipped = json.loads((TOKENIZER_DIR / f"{name}.json").read_text(encoding="utf-8"))
    trained = json.loads(train_tiny_tokenizer(name).to_str())
    for part in ("normalizer", "pre_tokenizer", "post_processor", "decoder", "added_tokens"):
        assert shipped[part] == trained[part], part
    assert shipped["model"]["type"] == trained["model"]["type"]
    assert len(tiny_tokenizer(name)) == len(trained["model"]["vocab"]) == 2000


@pytest.mark.parametrize("name", TINY_MODELS)
def test_tiny_tokenizers_add_their_special_tokens(name: str) -> None:
    tokenizer = tiny_tokenizer(name)
    tokens = tokenizer.convert_ids_to_tokens(tokenizer("Rates rose.")["input_ids"])
    expected = {"tiny-bert": (["[CLS]"], ["[SEP]"]), "tiny-gpt2": ([], []), "tiny-llama": (["<s>"], [])}[name]
    assert tokens[: len(expected[0])] == expected[0] and tokens[len(tokens) - len(expected[1]) :] == expected[1]
    pieces = tokens[len(expected[0]) : len(tokens) - len(expected[1])]
    assert tokenizer.convert_tokens_to_string(pieces).strip().lower() == "rates rose."


def test_fingerprint_covers_weights_tokenizer_and_config() -> None:
    model, tokenizer = tiny_model("tiny-bert")
    base = HFEncoder(model, tokenizer, model_id="tiny-bert").model_fingerprint
    assert base == load_encoder("tiny-bert", device="cpu").model_fingerprint
    parts = dict(item.split(":", 1) for item in base.split())
    assert sorted(parts) == ["config", "tokenizer", "weights"]

    changed_weight, _ = tiny_model("tiny-bert")
    with torch.no_grad():
        changed_weight.embeddings.word_embeddings.weight[7, 3] += 1e-3
    other = dict(item.split(":", 1) for item in HFEncoder(changed_weight, tokenizer, model_id="tiny-bert").model_fingerprint.split())
    assert other["weights"] != parts["weights"] and other["tokenizer"] == parts["tokenizer"] and other["config"] == parts["config"]

    other_tokenizer = tiny_tokenizer("tiny-bert").__class__(tokenizer_object=tokenizer.backend_tokenizer, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    other_tokenizer.backend_tokenizer.post_processor = None  # no [CLS]/[SEP]: a different tokenizer with the same vocabulary
    other = dict(item.split(":", 1) for item in HFEncoder(model, other_tokenizer, model_id="tiny-bert").model_fingerprint.split())
    assert other["tokenizer"] != parts["tokenizer"] and other["weights"] == parts["weights"]

    bigger_config, _ = tiny_model("tiny-bert")
    bigger_config.config.layer_norm_eps = 1e-5
    other = dict(item.split(":", 1) for item in HFEncoder(bigger_config, tokenizer, model_id="tiny-bert").model_fingerprint.split())
    assert other["config"] != parts["config"] and other["weights"] == parts["weights"]


class _Interrupt(Exception):
    pass


class _StopAtFirstChunk:
    def start(self, stage: str, total: int, *, unit: str = "items") -> None:
        pass

    def advance(self, stage: str, n: int = 1, *, note: str = "") -> None:
        raise _Interrupt


def _interrupted_bert_store(out: Path, corpus_limit: int) -> None:
    with pytest.raises(_Interrupt):
        extract(load_encoder("tiny-bert", device="cpu"), load_corpus("lee", limit=corpus_limit), out, chunk_sentences=6,
                progress=_StopAtFirstChunk())


def test_resume_with_another_model_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _interrupted_bert_store(out, 20)
    corpus = load_corpus("lee", limit=20)
    with pytest.raises(StoreExistsError) as raised:
        extract(load_encoder("tiny-gpt2", device="cpu"), corpus, out, chunk_sentences=6)
    message = str(raised.value)
    assert "the model (weights, tokenizer or config) differs from the one the interrupted run used" in message
    assert "model_id" in message and "`overwrite=True`" in message

    model, tokenizer = tiny_model("tiny-bert")
    with torch.no_grad():
        model.encoder.layer[1].output.dense.bias[0] += 0.5
    changed = HFEncoder(model, tokenizer, model_id="tiny-bert", device="cpu")
    with pytest.raises(StoreExistsError) as raised:
        extract(changed, corpus, out, chunk_sentences=6)
    message = str(raised.value)
    assert "the model (weights, tokenizer or config) differs from the one the interrupted run used (its weights differ)" in message
    assert "model_id" not in message
    # the same model resumes
    store = extract(load_encoder("tiny-bert", device="cpu"), corpus, out, chunk_sentences=6)
    assert store.meta["n_sentences"] == 20


@pytest.mark.processes
def test_extraction_interrupted_in_one_process_resumes_in_another(two_processes: tuple[dict, dict, Path], tmp_path: Path) -> None:
    resumed = RepresentationStore.open(two_processes[2])
    reference = extract(load_encoder("tiny-bert", device="cpu"), load_corpus("lee", limit=N_SENTENCES), tmp_path / "once", chunk_sentences=6)
    assert resumed.layers == reference.layers == [0, 1, 2, 3]
    for layer in reference.layers:
        np.testing.assert_allclose(np.asarray(resumed.layer(layer)[:]), np.asarray(reference.layer(layer)[:]), rtol=0, atol=1e-6)
    assert resumed.tokens.equals(reference.tokens)
    assert resumed.sentences.equals(reference.sentences)
    assert resumed.vocab.equals(reference.vocab)
