"""Extraction: corpus -> encoder -> store, chunk by chunk, resumable."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from lmgeom.corpus.corpus import Corpus
from lmgeom.encoders.hf import EncodedSentence, HFEncoder
from lmgeom.store.reader import RepresentationStore
from lmgeom.store.writer import StoreWriter


def extract(
    encoder: HFEncoder,
    corpus: Corpus,
    out: str | Path,
    *,
    dtype: str = "float32",
    chunk_sentences: int | None = None,
    overwrite: bool = False,
    on_chunk: Callable[[int, int], None] | None = None,
) -> RepresentationStore:
    """Encode `corpus` into a store at `out`; re-running the same call resumes an interrupted run.

    `on_chunk(n_sentences, n_tokens)` is called after each committed chunk (progress reporting).
    `chunk_sentences` defaults to `default_chunk_sentences` for the model.
    """
    chunk_sentences = chunk_sentences or default_chunk_sentences(encoder.n_layers, encoder.dim)
    settings = {
        **encoder.settings(),
        "dtype": dtype,
        "corpus_name": corpus.name,
        "corpus_source": corpus.source,
        "corpus_fingerprint": corpus.fingerprint,
        "n_corpus_sentences": len(corpus),
        "pretokenized": corpus.pretokenized,
        "chunk_sentences": chunk_sentences,
    }
    writer = StoreWriter(out, settings=settings, overwrite=overwrite)
    if writer.complete:
        return RepresentationStore.open(out)
    # Each chunk is written in a background thread while the next one is encoded; a chunk counts
    # (and `on_chunk` is told) only once its commit has finished.
    with ThreadPoolExecutor(max_workers=1) as background:
        pending = None
        for first in range(writer.sentences_done, len(corpus), chunk_sentences):
            sentences = corpus.sentences[first : first + chunk_sentences]
            encoded = encoder.encode(sentences, first_index=first)
            if pending is not None:
                _finish(pending, on_chunk)
            pending = (background.submit(writer.commit, encoded, [s.text for s in sentences]), len(sentences),
                       sum(len(e.words) for e in encoded))
        if pending is not None:
            _finish(pending, on_chunk)
    writer.finalize()
    return RepresentationStore.open(out)


def default_chunk_sentences(n_layers: int, dim: int, *, budget_mb: int = 512) -> int:
    """Sentences per chunk so that a chunk's float32 vectors (about 32 words a sentence) take about
    `budget_mb`, as a power of two in [64, 4096]: bigger chunks sort more sentences by length and
    pad less (256 sentences cost MiniLM 15 % against one length-sorted pass), smaller ones bound memory."""
    sentences = budget_mb * 2**20 / (n_layers * dim * 4 * 32)
    return int(min(4096, max(64, 2 ** int(np.log2(sentences)))))


def _finish(pending, on_chunk: Callable[[int, int], None] | None) -> None:
    commit, n_sentences, n_tokens = pending
    commit.result()
    if on_chunk is not None:
        on_chunk(n_sentences, n_tokens)


def write_store_from_arrays(
    path: str | Path,
    hidden: Sequence[np.ndarray],
    words_per_sentence: Sequence[Sequence[str]],
    *,
    model_id: str = "synthetic",
    is_special: Sequence[Sequence[bool]] | None = None,
    overwrite: bool = True,
) -> RepresentationStore:
    """A store from given per-layer arrays (rows in sentence order), for tests and imported vectors."""
    n_rows = sum(len(words) for words in words_per_sentence)
    hidden = [np.asarray(h) for h in hidden]
    if not hidden or any(h.shape != (n_rows, hidden[0].shape[1]) for h in hidden):
        raise ValueError(f"every layer must have shape (n_words={n_rows}, dim); got {[h.shape for h in hidden]}")
    corpus = Corpus.from_list([list(words) for words in words_per_sentence], name="arrays")
    settings = {
        "model_id": model_id, "n_layers": len(hidden), "dim": int(hidden[0].shape[1]), "pooling": "given",
        "special_tokens": "stored" if is_special is not None else "excluded",
        "dtype": "float16" if hidden[0].dtype == np.float16 else "float32",
        "corpus_name": corpus.name, "corpus_fingerprint": corpus.fingerprint,
    }
    writer = StoreWriter(path, settings=settings, overwrite=overwrite)
    encoded, row = [], 0
    for index, words in enumerate(words_per_sentence):
        stack = np.stack([h[row : row + len(words)] for h in hidden])
        special = np.asarray(is_special[index], dtype=bool) if is_special is not None else np.zeros(len(words), dtype=bool)
        encoded.append(EncodedSentence(stack, list(words), special, np.ones(len(words), dtype=np.int16), 1))
        row += len(words)
    writer.commit(encoded, [s.text for s in corpus.sentences])
    writer.finalize()
    return RepresentationStore.open(path)

