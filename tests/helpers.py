"""Pieces several test modules share: synthetic stores and data, an encoder that stops mid-run, a
corpus stream that records how far the driver reads ahead, and the store comparison.

Test modules import this module (`from helpers import ...`; pytest puts `tests/` on `sys.path`) and
never each other (tests/test_layout_rules.py checks it). Fixtures live in tests/conftest.py."""

from __future__ import annotations

import sys
from typing import Any, Iterator, Sequence

import numpy as np
import pandas as pd
import pytest

from lmgeom.corpus import CorpusStream
from lmgeom.corpus.corpus import Sentence
from lmgeom.encoders.base import EncodedSentence, Encoder
from lmgeom.progress import NoProgress
from lmgeom.stages.experiments.heads import ProbeOptions
from lmgeom.store import RepresentationStore, write_store_from_arrays


def synthetic_store(path: Any, *, dim: int, counts: dict[str, int], dtype: type = np.float32, seed: int = 0,
                    sentence_length: int = 10, n_layers: int = 1) -> RepresentationStore:
    """Each word's occurrences shuffled into sentences; row = offset + the word's centre + noise (more
    noise in each further layer)."""
    rng = np.random.default_rng(seed)
    words = rng.permutation(np.repeat(np.array(list(counts)), list(counts.values())))
    sentences = [list(words[start:start + sentence_length]) for start in range(0, len(words), sentence_length)]
    centres = {word: rng.standard_normal(dim) for word in counts}
    mean = np.stack([centres[word] for word in words]) + 2.0
    layers = [mean + (0.7 + 0.3 * layer) * rng.standard_normal((len(words), dim)) for layer in range(n_layers)]
    return write_store_from_arrays(path, [rows.astype(dtype) for rows in layers], sentences)


def rewrite_meta(store: Any, meta: dict[str, Any]) -> None:
    """Replace a local store's meta.json as its writer would have written it: with its digest
    (meta.json.crc32c) rewritten to match, so only what the edit says is tested, not the digest."""
    from lmgeom.store.integrity import write_meta
    from lmgeom.store.location import Location

    write_meta(Location.of(store), meta)


def predate_metadata_digests(store: Any) -> dict[str, Any]:
    """Make a local store as one written before meta.json and the layers' zarr.json were checksummed:
    no meta.json.crc32c, no zarr.json in checksums.json, no `meta_digest` in meta.json's integrity
    (checksums.json's digest made to match). Returns the meta.json written."""
    import json
    from pathlib import Path

    from lmgeom.store.integrity import crc32c

    path = Path(store)
    checksums = {name: digest for name, digest in json.loads((path / "checksums.json").read_text()).items()
                 if not name.endswith("zarr.json")}
    (path / "checksums.json").write_text(json.dumps(checksums))
    meta = json.loads((path / "meta.json").read_text())
    del meta["integrity"]["meta_digest"]
    meta["integrity"]["checksums"] = crc32c((path / "checksums.json").read_bytes())
    (path / "meta.json").write_text(json.dumps(meta))
    (path / "meta.json.crc32c").unlink()
    return meta


def assert_same_store(a: RepresentationStore, b: RepresentationStore, *, atol: float) -> None:
    """The same tables exactly, the same layers, every layer's vectors within `atol`."""
    for table in ("tokens", "sentences", "vocab"):
        pd.testing.assert_frame_equal(getattr(a, table), getattr(b, table))
    assert a.layers == b.layers
    for layer in a.layers:
        np.testing.assert_allclose(np.asarray(b.layer(layer)[:]), np.asarray(a.layer(layer)[:]), rtol=0, atol=atol)


class CrashingEncoder:
    """The tiny model, stopping with an error once it reaches sentence `crash_at` (after the chunks
    before it were written), as a killed process would; records the first sentence of each chunk."""

    def __init__(self, inner: Encoder, crash_at: int | None) -> None:
        self.inner, self.crash_at = inner, crash_at
        self.model_id, self.n_layers, self.dim = inner.model_id, inner.n_layers, inner.dim
        self.chunks: list[int] = []

    def settings(self) -> dict[str, Any]:
        return self.inner.settings()

    def encode(self, sentences: Sequence[Sentence], *, first_index: int = 0) -> list[EncodedSentence]:
        if self.crash_at is not None and first_index <= self.crash_at < first_index + len(sentences):
            raise KeyboardInterrupt("killed mid-shard")
        self.chunks.append(first_index)
        return self.inner.encode(sentences, first_index=first_index)


class ReadAhead:
    """A corpus stream over given texts that records, for each pass, how many sentences it has
    handed out beyond those of finished shards (reported through the progress, as the driver sees them)."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.finished = 0
        self.passes: list[int] = []  # per pass: the most sentences read and not yet finished

    def read(self) -> Iterator[str]:
        self.passes.append(0)
        for count, text in enumerate(self.texts, start=1):
            self.passes[-1] = max(self.passes[-1], count - self.finished)
            yield text

    def stream(self, name: str, source: str) -> CorpusStream:
        return CorpusStream(name, self.read, source)

    def progress(self) -> NoProgress:
        outer = self

        class Finished(NoProgress):
            def advance(self, stage: str, n: int = 1, *, note: str = "") -> None:
                outer.finished += n
        return Finished()


TINY_RUN: dict[str, Any] = {"limit": 60, "device": "cpu", "min_contexts": 3, "layers": "0,3", "num_workers": 1,
                             "permutations": 20}
"""The options of the session's shared tiny-bert run (the `tiny_run` fixture): 60 Lee sentences, layers 0
and 3 calibrated and distilled, the analysis in this process (no worker start-up), 20 shuffles of the
similarity's nulls (200, the default, are most of a tiny run's time; 20 still give p-values below 0.05)."""
TINY_RUN_ARGS = [word for key, value in TINY_RUN.items() for word in (f"--{key.replace('_', '-')}", str(value))]
"""The same options as `lmgeom run` arguments."""


FAST_PROBE = ProbeOptions(batch_size=500, learning_rate=0.05, epochs=30)  # few steps: a probe test stays short


def synthetic_layers(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Three layers of 4 dims; only layer 1 carries the (linearly separable) label."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, 3000)
    layers = rng.normal(size=(3000, 3, 1, 4))
    layers[:, 1, 0, :3] += 4.0 * np.eye(3)[labels]
    return layers.astype(np.float32), labels


BANK_SENTENCES = [
    "the bank of the river was steep .".split(),
    "a bank gave the loan , and the bank closed".split(),
    "the river ran by the bank".split(),
    "she sat on the bank of a river".split(),
    "the loan from the bank was large".split(),
    "a river and a bank".split(),
]
"""Six pre-split sentences in which 'bank' and 'river' recur: a small store's corpus."""


class RecordedProgress:
    """A `Progress` that keeps every note it is given."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    def start(self, stage: str, total: int, *, unit: str = "items") -> None:
        pass

    def advance(self, stage: str, n: int = 1, *, note: str = "") -> None:
        self.notes.append(note)



def pin_spectrum_route(monkeypatch: Any, name: str) -> str:
    """Send every word's spectrum down route `name` of `lmgeom.metrics.spectrum` ("gram-batched",
    "gram-tridiagonal", "scatter", "krylov"), with blocks small enough that the tiny test matrices
    exercise the Krylov solver's restarts."""
    from lmgeom.metrics import lanczos as lanczos_module
    from lmgeom.metrics import spectrum as spectrum_module

    monkeypatch.setattr(spectrum_module, "word_route", lambda n, dim, formed=False: name.split("-")[0])
    monkeypatch.setattr(spectrum_module, "krylov_budget", lambda n, dim, formed=False: None)
    monkeypatch.setattr(spectrum_module, "BATCHED_EIGH_LIMIT", 10**6 if name == "gram-batched" else 0)
    for module in (spectrum_module, lanczos_module):
        monkeypatch.setattr(module, "BLOCK_SIZE", 3)
    monkeypatch.setattr(lanczos_module, "MAX_BASIS", 24)
    return name


class StopAt:
    """A progress reporter that interrupts the run when a stage starts."""

    def __init__(self, stage: str) -> None:
        self.stage = stage

    def start(self, stage: str, total: int, *, unit: str = "items") -> None:
        if stage == self.stage:
            raise KeyboardInterrupt

    def advance(self, stage: str, n: int = 1, *, note: str = "") -> None:
        pass


def local_ray(module: str) -> Iterator[Any]:
    """A fixture body: a local 2-CPU Ray cluster for the tests of `module` (its functions travel to
    the workers by value: Ray's workers cannot import a test module by name), shut down after them."""
    ray = pytest.importorskip("ray")
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[module])
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    yield ray
    ray.shutdown()
