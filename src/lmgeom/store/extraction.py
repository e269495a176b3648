"""Extraction: corpus -> encoder -> store, chunk by chunk, resumable."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from lmgeom.corpus.corpus import Corpus
from lmgeom.encoders.hf import EncodedSentence, HFEncoder
from lmgeom.store import DEFAULT_CHUNK_SENTENCES
from lmgeom.store.reader import RepresentationStore
from lmgeom.store.writer import StoreWriter


def extract(
    encoder: HFEncoder,
    corpus: Corpus,
    out: str | Path,
    *,
    dtype: str = "float32",
    chunk_sentences: int = DEFAULT_CHUNK_SENTENCES,
    overwrite: bool = False,
    on_chunk: Callable[[int, int], None] | None = None,
) -> RepresentationStore:
    """Encode `corpus` into a store at `out`; re-running the same call resumes an interrupted run.

    `on_chunk(n_sentences, n_tokens)` is called after each committed chunk (progress reporting).
    """
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
    start = writer.sentences_done
    for first in range(start, len(corpus), chunk_sentences):
        sentences = corpus.sentences[first : first + chunk_sentences]
        encoded = encoder.encode(sentences, first_index=first)
        writer.commit(encoded, [s.text for s in sentences])
        if on_chunk is not None:
            on_chunk(len(sentences), sum(len(e.words) for e in encoded))
    writer.finalize()
    return RepresentationStore.open(out)


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

