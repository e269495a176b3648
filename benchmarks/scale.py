"""Whole analysis against one streaming read of the store, as the corpus grows (issues 11 and 12).

Rows (each a function returning dicts, so other engines add their own rows):
- `read_row`: one streaming read of a layer (every row, float32, in the analysis's chunks): the limit.
- `analysis_row`: `analyze_store` of that layer (baselines, SelfSim, IntraSim, MEV on or off).
Each measurement runs in its own process, so its peak RSS (`ru_maxrss`) is its own.

Stores are synthetic: the Lee corpus's sentences (67k words) repeated 1x, 10x, 30x at d = 768 and
1x, 10x at d = 4,096, one layer, float32; a word's rows are its own centre plus noise around a
shared offset (anisotropic, as real layers are). `write_synthetic_store` writes them chunk by chunk
with `StoreWriter`, as `write_store_from_arrays` does in one commit (which would hold the 6 GB of
the 30x store in memory three times). Each store is deleted after it is measured.

Run: python benchmarks/scale.py [--sizes 768:1,768:10,768:30,4096:1,4096:10] [--mev both] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from lmgeom.corpus.corpus import Corpus
from lmgeom.encoders.base import EncodedSentence
from lmgeom.store import RepresentationStore
from lmgeom.store.writer import StoreWriter

SENTENCES_PER_COMMIT = 2048


def corpus_words(name: str) -> list[list[str]]:
    """The words of each sentence of a built-in corpus (`lee`, `sts`)."""
    from lmgeom.corpus.builtin import load_corpus

    return [[word.text for word in sentence.words] for sentence in load_corpus(name).sentences]


def write_synthetic_store(path: str | Path, sentences: Sequence[Sequence[str]], *, dim: int, n_layers: int = 1,
                          seed: int = 0) -> RepresentationStore:
    """A store of `sentences` with seeded synthetic vectors: row = offset + centre[word] + noise,
    the noise growing with depth (so self-similarity falls with depth, as in real models)."""
    vocabulary = {word: index for index, word in enumerate(dict.fromkeys(w for words in sentences for w in words))}
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((len(vocabulary), dim), dtype=np.float32)
    offsets = rng.standard_normal((n_layers, dim), dtype=np.float32) * 3
    corpus = Corpus.from_list([list(words) for words in sentences], name="synthetic")
    settings = {"model_id": "synthetic", "n_layers": n_layers, "dim": dim, "pooling": "given", "special_tokens": "excluded",
                "dtype": "float32", "corpus_name": corpus.name, "corpus_fingerprint": corpus.fingerprint}
    writer = StoreWriter(path, settings=settings, overwrite=True)
    for first in range(0, len(sentences), SENTENCES_PER_COMMIT):
        chunk = sentences[first : first + SENTENCES_PER_COMMIT]
        ids = np.array([vocabulary[w] for words in chunk for w in words])
        layers = np.stack([offsets[layer] + centres[ids] + (0.5 + 0.25 * layer) * rng.standard_normal((len(ids), dim), dtype=np.float32)
                           for layer in range(n_layers)])
        encoded, row = [], 0
        for words in chunk:
            encoded.append(EncodedSentence(layers[:, row : row + len(words)], list(words), np.zeros(len(words), dtype=bool),
                                           np.ones(len(words), dtype=np.int16), 1))
            row += len(words)
        writer.commit(encoded, [s.text for s in corpus.sentences[first : first + SENTENCES_PER_COMMIT]])
    writer.finalize()
    return RepresentationStore.open(path)
