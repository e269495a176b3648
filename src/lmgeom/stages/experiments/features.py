"""Frozen features for the experiments, extracted once per model and cached in the experiment folder.

One forward pass gives every layer, so a text is encoded once and each layer is stored in its own
`layer_XX.npy` (a chosen layer loads alone). Texts already cached are never encoded again: a
resumed or extended experiment (more seeds, another subsample) encodes only what is new.

Sentence vectors: the mean of the sentence's pieces with the special tokens left out (the store's
default; `pooling="mean"`), or the sentence's last piece before any end-of-sequence token
(`pooling="last"`). ELMo reads words, so its "pieces" are the words. Word vectors: the encoder's
per-word vectors (mean of each word's pieces).
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from lmgeom.errors import InputError
from lmgeom.atomic import atomic_write, atomic_write_text
from lmgeom.corpus.corpus import Sentence
from lmgeom.encoders.base import Encoder
from lmgeom.progress import NoProgress, Progress
from lmgeom.store.layout import LAYER_NOTE

SENTENCE_POOLINGS = {
    "mean": "mean of the sentence's pieces, special tokens excluded (the store's default)",
    "last": "the sentence's last piece before any end-of-sequence special token",
}
ENCODE_BATCH = 64
FLUSH_SECONDS = 300.0  # an extraction in progress is written at least this often (an interruption loses less)


def pooling_note(pooling: str) -> str:
    if pooling not in SENTENCE_POOLINGS:
        raise InputError(f"unknown sentence pooling {pooling!r}; choose one of {', '.join(SENTENCE_POOLINGS)}")
    return SENTENCE_POOLINGS[pooling]


@dataclass
class CachedVectors:
    """Rows of every layer for a list of keys: `layers[l][row_of[key]]`."""

    n_layers: int
    row_of: dict[str, int]
    layers: list[np.ndarray]  # per layer (n_rows, dim), memory-mapped


class FeatureCache:
    """Per-layer vectors keyed by text (sentence vectors) or by a sentence's words (word vectors).

    `load_encoder(pooling)` is called only when something is missing. Each kind ("sentence-mean",
    "sentence-last", "words") has its own folder; a word-vector key owns one row per word, stored
    contiguously."""

    def __init__(self, directory: Path, load_encoder: Callable[[str], Encoder], *, model: str,
                 progress: Progress | None = None) -> None:
        self.directory = directory
        self._load_encoder = load_encoder
        self._encoders: dict[str, Encoder] = {}
        self.model = model
        self.progress = progress or NoProgress()

    def encoder(self, pooling: str = "mean") -> Encoder:
        if pooling not in self._encoders:
            self._encoders[pooling] = self._load_encoder(pooling)
        return self._encoders[pooling]

    # ---- public ---------------------------------------------------------------------------
    def sentence_vectors(self, texts: Sequence[str], *, pooling: str = "mean",
                         layers: Sequence[int] | None = None) -> np.ndarray:
        """(len(layers), len(texts), dim) float32; every layer when `layers` is None."""
        pooling_note(pooling)
        cached = self._ensure(f"sentence-{pooling}", list(texts), lambda batch: self._encode_sentences(batch, pooling))
        rows = np.array([cached.row_of[t] for t in texts], dtype=np.int64)
        return _take(cached, rows, layers)

    def word_vectors(self, sentences: Sequence[Sequence[str]], *, layers: Sequence[int] | None = None) -> np.ndarray:
        """(len(layers), total words, dim) float32: the sentences' words, concatenated in order."""
        keys = [_words_key(words) for words in sentences]
        cached = self._ensure("words", keys, lambda batch: self._encode_words([k.split("\x1f") for k in batch]))
        rows = np.concatenate([cached.row_of[k] + np.arange(len(words)) for k, words in zip(keys, sentences)]) \
            if keys else np.empty(0, dtype=np.int64)
        return _take(cached, rows, layers)

    def provenance(self) -> dict[str, Any]:
        """The model behind the cached vectors, as a result document's header takes it (a store's
        meta.json fields `model_id` and `layer_note`): what the cache's index recorded when it encoded,
        else the encoder's own (loaded for it, as a cache written before the index recorded them is)."""
        for index in sorted(self.directory.glob(f"{_slug(self.model)}/*/index.json")):
            try:
                document = json.loads(index.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if document.get("model_id"):
                return {"model_id": document["model_id"], "layer_note": document.get("layer_note") or LAYER_NOTE}
        return _encoder_provenance(self.encoder())

    def n_layers(self, kind: str) -> int | None:
        """The number of layers cached for `kind`, or None before anything is cached."""
        cached = self._open(self.directory / _slug(self.model) / kind)
        return None if cached is None else cached.n_layers

    # ---- storage --------------------------------------------------------------------------
    def _ensure(self, kind: str, keys: list[str], encode: Callable[[list[str]], list[np.ndarray]]) -> CachedVectors:
        """Encode the keys not cached yet (each gives (n_layers, n_rows, dim)) and append them."""
        folder = self.directory / _slug(self.model) / kind
        cached = self._open(folder)
        missing = list(dict.fromkeys(k for k in keys if cached is None or k not in cached.row_of))
        if not missing:
            assert cached is not None
            return cached
        self.progress.start(f"features ({kind})", len(missing), unit="texts")
        new_parts: list[np.ndarray] = []
        written, last_write = 0, time.monotonic()
        for start in range(0, len(missing), ENCODE_BATCH):
            batch = missing[start : start + ENCODE_BATCH]
            new_parts.extend(encode(batch))
            self.progress.advance(f"features ({kind})", len(batch))
            done = start + len(batch)
            # written every FLUSH_SECONDS too, so an interrupted extraction resumes where it was (the
            # batches stay the same: a resumed run encodes the rest in the same groups of ENCODE_BATCH)
            if done == len(missing) or time.monotonic() - last_write >= FLUSH_SECONDS:
                cached = self._append(folder, cached, missing[written:done], new_parts)
                new_parts, written, last_write = [], done, time.monotonic()
        assert cached is not None
        return cached

    def _append(self, folder: Path, cached: CachedVectors | None, keys: list[str],
                new_parts: list[np.ndarray]) -> CachedVectors:
        """The cache at `folder` with `keys` (their vectors `new_parts`, one (n_layers, n_rows, dim)
        each) appended after its rows, written layer by layer and then the index."""
        n_layers = new_parts[0].shape[0]
        old_rows = 0 if cached is None else len(cached.layers[0])
        offsets = np.cumsum([0] + [part.shape[1] for part in new_parts])
        order = [] if cached is None else sorted(cached.row_of, key=cached.row_of.__getitem__)
        row_of = {} if cached is None else dict(cached.row_of)
        for key, offset in zip(keys, offsets[:-1]):
            row_of[key] = old_rows + int(offset)
        folder.mkdir(parents=True, exist_ok=True)
        for layer in range(n_layers):
            fresh = np.concatenate([part[layer] for part in new_parts]).astype(np.float32)
            merged = fresh if cached is None else np.concatenate([np.asarray(cached.layers[layer]), fresh])
            atomic_write(folder / f"layer_{layer:02d}.npy", partial(_save_npy, array=merged))
        # the index is written last: a crash before it leaves the old index, whose rows are unchanged
        provenance = _encoder_provenance(next(iter(self._encoders.values())))
        atomic_write_text(folder / "index.json", json.dumps({"model": self.model, "n_layers": n_layers, **provenance,
                                                              "keys": order + keys, "rows": [row_of[k] for k in order + keys]}))
        opened = self._open(folder)
        assert opened is not None
        return opened

    @staticmethod
    def _open(folder: Path) -> CachedVectors | None:
        index = folder / "index.json"
        if not index.exists():
            return None
        try:
            document = json.loads(index.read_text(encoding="utf-8"))
            layers = [np.load(folder / f"layer_{layer:02d}.npy", mmap_mode="r") for layer in range(document["n_layers"])]
            rows = dict(zip(document["keys"], document["rows"]))
            if any(len(layer) <= max(rows.values(), default=-1) for layer in layers):
                raise ValueError("a layer file has fewer rows than the index lists")
        except (OSError, ValueError, KeyError, TypeError) as error:  # truncated or foreign files: encode again
            warnings.warn(f"feature cache {folder} is damaged ({type(error).__name__}: {error}); its vectors are "
                          "computed again", stacklevel=2)
            return None
        return CachedVectors(document["n_layers"], rows, layers)

    # ---- encoding -------------------------------------------------------------------------
    def _encode_sentences(self, texts: list[str], pooling: str) -> list[np.ndarray]:
        encoder = self.encoder(pooling)
        embed: Any = getattr(encoder, "sentence_embeddings", None)
        if pooling == "mean" and embed is not None:
            vectors = embed(texts, include_special=False)
            return [vectors[:, i : i + 1] for i in range(len(texts))]
        encoded = encoder.encode([Sentence.from_text(text) for text in texts])
        pooled = []
        for text, sentence in zip(texts, encoded):
            if sentence.vectors.shape[1] == 0:
                raise InputError(f"sentence {text!r} has no words the model could read")
            words = sentence.vectors[:, ~sentence.is_special]
            pooled.append(words.mean(axis=1, keepdims=True) if pooling == "mean" else words[:, -1:])
        return pooled

    def _encode_words(self, sentences: list[list[str]]) -> list[np.ndarray]:
        encoded = self.encoder("mean").encode([Sentence.from_words(words) for words in sentences])
        vectors = []
        for words, sentence in zip(sentences, encoded):
            kept = sentence.vectors[:, ~sentence.is_special]
            if kept.shape[1] != len(words):
                raise InputError(f"the model gave {kept.shape[1]} word vectors for the {len(words)} words of {' '.join(words)!r}")
            vectors.append(kept)
        return vectors


def _encoder_provenance(encoder: Encoder) -> dict[str, Any]:
    return {"model_id": encoder.model_id, "layer_note": str(getattr(encoder, "layer_note", LAYER_NOTE))}


def _save_npy(path: Path, *, array: np.ndarray) -> None:
    with path.open("wb") as handle:  # a handle, so numpy does not append ".npy" to the temporary name
        np.save(handle, array)


def _take(cached: CachedVectors, rows: np.ndarray, layers: Sequence[int] | None) -> np.ndarray:
    chosen = range(cached.n_layers) if layers is None else layers
    bad = [layer for layer in chosen if not 0 <= layer < cached.n_layers]
    if bad:
        raise InputError(f"layer {bad[0]} does not exist: the model has layers 0-{cached.n_layers - 1} (0 = its input layer)")
    return np.stack([np.asarray(cached.layers[layer][rows]) for layer in chosen])


def _words_key(words: Sequence[str]) -> str:
    return "\x1f".join(words)


def _slug(model: str) -> str:
    readable = "".join(c if c.isalnum() or c in "-_." else "-" for c in model)[:40]
    return f"{readable}-{hashlib.sha256(model.encode()).hexdigest()[:8]}"
