"""A store from vectors already in memory (tests, imported embeddings): no model involved."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from lmgeom.errors import InputError
from lmgeom.corpus.corpus import Corpus
from lmgeom.encoders.base import EncodedSentence
from lmgeom.store.reader import RepresentationStore
from lmgeom.store.writer import Foreign, StoreWriter, foreign_entries


def write_store_from_arrays(
    path: str | Path,
    hidden: Sequence[np.ndarray],
    words_per_sentence: Sequence[Sequence[str]],
    *,
    model_id: str = "synthetic",
    is_special: Sequence[Sequence[bool]] | None = None,
    overwrite: bool = True,
    foreign: Foreign = foreign_entries,
) -> RepresentationStore:
    """A store from given per-layer arrays (rows in sentence order; layer 0 first). `overwrite`
    replaces a store there, refusing while the folder holds anything `foreign` names (by default
    anything but the store's own files; `lmgeom.rundir.foreign_entries` also allows a run's results)."""
    n_rows = sum(len(words) for words in words_per_sentence)
    hidden = [np.asarray(h) for h in hidden]
    if not hidden or any(h.shape != (n_rows, hidden[0].shape[1]) for h in hidden):
        raise InputError(f"every layer must have shape (n_words={n_rows}, dim); got {[h.shape for h in hidden]}")
    corpus = Corpus.from_list([list(words) for words in words_per_sentence], name="arrays")
    settings = {
        "model_id": model_id, "n_layers": len(hidden), "dim": int(hidden[0].shape[1]), "pooling": "given",
        "special_tokens": "stored" if is_special is not None else "excluded",
        "dtype": "float16" if hidden[0].dtype == np.float16 else "float32",
        "corpus_name": corpus.name, "corpus_fingerprint": corpus.fingerprint,
    }
    encoded, row = [], 0
    for index, words in enumerate(words_per_sentence):
        stack = np.stack([h[row : row + len(words)] for h in hidden])
        special = np.asarray(is_special[index], dtype=bool) if is_special is not None else np.zeros(len(words), dtype=bool)
        encoded.append(EncodedSentence(stack, list(words), special, np.ones(len(words), dtype=np.int16), 1))
        row += len(words)
    with StoreWriter(path, settings=settings, overwrite=overwrite, expected_rows=n_rows, foreign=foreign) as writer:
        writer.commit(encoded, [s.text for s in corpus.sentences])
        writer.finalize()
    return RepresentationStore.open(path)
