"""Extraction: corpus -> encoder -> store, chunk by chunk, resumable; and "a store, or a model to extract first"."""

from __future__ import annotations

import os
import re
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from lmgeom.errors import InputError
from lmgeom.corpus import load_corpus, require_count
from lmgeom.corpus.corpus import Corpus
from lmgeom.encoders.base import Encoder
from lmgeom.progress import NoProgress, Progress
from lmgeom.store import RepresentationStore, StoreWriter, layout
from lmgeom.store.location import Location, is_url


def extract(
    encoder: Encoder,
    corpus: Corpus,
    out: str | os.PathLike[str],
    *,
    dtype: str = "float32",
    chunk_sentences: int | None = None,
    compress: str | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> RepresentationStore:
    """Encode `corpus` into a store at `out`; re-running the same call resumes an interrupted run.

    Progress is reported per committed chunk in sentences, with sentences and words per second
    (`words` are the corpus words stored; special tokens kept with `--keep-special` are not counted).
    `chunk_sentences` defaults to `default_chunk_sentences` for the model. The layers' zarr chunks fit
    the corpus (`layout.chunk_rows`); `compress` ("zstd") compresses them (default: raw).
    """
    progress = progress or NoProgress()
    chunk_sentences = chunk_sentences or default_chunk_sentences(encoder.n_layers, encoder.dim, len(corpus))
    location = Location.of(out)
    if not location.is_local:  # object stores have no atomic rename: shards committed by manifests
        from lmgeom.runs.distributed import extract_sharded

        return extract_sharded(encoder, corpus, location, dtype=dtype, chunk_sentences=chunk_sentences,
                               compress=compress, overwrite=overwrite, progress=progress)
    out = location.local_path
    settings = {
        **encoder.settings(),
        "dtype": dtype,
        "corpus_name": corpus.name,
        "corpus_source": corpus.source,
        "corpus_fingerprint": corpus.fingerprint,
        "n_corpus_sentences": len(corpus),
        "pretokenized": corpus.pretokenized,
        "chunk_sentences": chunk_sentences,
        **({"compressor": compress} if compress is not None else {}),
    }
    with StoreWriter(Path(out), settings=settings, overwrite=overwrite,
                     expected_rows=layout.expected_rows(corpus.sentences)) as writer:  # its lock is released however this ends
        stage = f"extract {corpus.name}"
        progress.start(stage, len(corpus), unit="sentences")
        if writer.complete:
            progress.advance(stage, len(corpus), note="already extracted")
            return RepresentationStore.open(out)
        if writer.sentences_done:
            progress.advance(stage, writer.sentences_done, note="resumed")
        rate = _Rate()
        # Each chunk is written in a background thread while the next one is encoded; a chunk counts
        # (and is reported) only once its commit has finished.
        with ThreadPoolExecutor(max_workers=1) as background:
            pending: tuple[Future[None], int, int] | None = None
            for first in range(writer.sentences_done, len(corpus), chunk_sentences):
                sentences = corpus.sentences[first : first + chunk_sentences]
                encoded = encoder.encode(sentences, first_index=first)
                if pending is not None:
                    _finish(pending, progress, stage, rate)
                n_words = sum(int((~e.is_special).sum()) for e in encoded)
                pending = (background.submit(writer.commit, encoded, [s.text for s in sentences]), len(sentences), n_words)
            if pending is not None:
                _finish(pending, progress, stage, rate)
        writer.finalize()
    return RepresentationStore.open(out)


class _Rate:
    """Sentences and words per second since extraction (re)started."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.sentences = 0
        self.words = 0

    def add(self, sentences: int, words: int) -> str:
        self.sentences += sentences
        self.words += words
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        return f"{self.sentences / elapsed:,.0f} sentences/s, {self.words / elapsed:,.0f} words/s"


def _finish(pending: tuple[Future[None], int, int], progress: Progress, stage: str, rate: _Rate) -> None:
    commit, n_sentences, n_words = pending
    commit.result()
    progress.advance(stage, n_sentences, note=rate.add(n_sentences, n_words))


def default_chunk_sentences(n_layers: int, dim: int, n_sentences: int, *, budget_mb: int = 512) -> int:
    """Sentences per chunk so that a chunk's float32 vectors (about 32 words a sentence) take about
    `budget_mb`, as a power of two in [64, 4096]: bigger chunks sort more sentences by length and
    pad less (256 sentences cost MiniLM 15 % against one length-sorted pass), smaller ones bound memory.
    A small corpus still gets about 4 chunks (the smallest power of two >= n_sentences / 4), so
    writing one chunk overlaps encoding the next instead of following the whole encoding."""
    by_memory = min(4096, max(64, 2 ** int(np.log2(budget_mb * 2**20 / (n_layers * dim * 4 * 32)))))
    four_chunks = max(64, 2 ** int(np.ceil(np.log2(max(1, -(-n_sentences // 4))))))
    return int(min(by_memory, four_chunks))


def default_run_dir(model: str, corpus: str, *, limit: int | None = None, sample: int | None = None,
                    seed: int = 0) -> Path:
    """runs/<model>-<corpus>: the model's folder name and the corpus name (a file's stem), slugged, with
    -limitN for the first N sentences and -sampleN (-sampleN-seedS for a seed other than 0) for a sample,
    so that runs on different sentences never share a folder."""
    name = f"{Path(model).name}-{Path(corpus.split(':')[0]).stem}"
    if limit is not None:
        name += f"-limit{limit}"
    if sample is not None:
        name += f"-sample{sample}" + (f"-seed{seed}" if seed else "")
    slug = re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-")
    return Path("runs") / slug


def extract_model(
    model: str,
    corpus: str = "lee",
    *,
    out: str | os.PathLike[str] | None = None,
    field: str = "text",
    pretokenized: bool = False,
    limit: int | None = None,
    sample: int | None = None,
    seed: int = 0,
    pooling: str = "mean",
    keep_special: bool = False,
    prepend_bos: bool = False,
    skip_unaligned: bool = False,
    dtype: str = "float32",
    compute_dtype: str | None = None,
    device: str = "auto",
    max_length: int | None = None,
    max_batch_tokens: int = 8192,
    before_final_norm: bool = False,
    chunk_sentences: int | None = None,
    compress: str | None = None,
    gguf_file: str | None = None,
    revision: str | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
    engine: str = "local",
    ray_address: str | None = None,
    num_workers: int = 1,
    gpus_per_worker: float = 0.0,
    shard_sentences: int | None = None,
) -> RepresentationStore:
    """`lmgeom extract`: load the corpus spec `corpus` and `model`, and extract every layer into `out`
    (a folder or an fsspec URL; default `default_run_dir`: runs/<model>-<corpus>[-limitN][-sampleN]),
    resuming an interrupted run. Options as for `load_corpus`, `load_encoder` and `extract`;
    `engine="ray"` (or an object-store `out`) encodes shards of a stream of the corpus
    (`lmgeom.runs.distributed.extract_model_sharded`), with `engine="ray"` on `num_workers` Ray actors,
    each loading the model."""
    from lmgeom.encoders.registry import load_encoder  # torch: only where a model is loaded

    require_count(limit, "limit")
    require_count(sample, "sample")
    layout.compressors(compress)  # an unknown codec is refused before the model loads
    if out is None:
        out = default_run_dir(model, corpus, limit=limit, sample=sample, seed=seed)
    encoder_options: dict[str, Any] = dict(
        device=device, dtype=compute_dtype, pooling=pooling, keep_special=keep_special, prepend_bos=prepend_bos,
        skip_unaligned=skip_unaligned, max_length=max_length, gguf_file=gguf_file, revision=revision,
        max_batch_tokens=max_batch_tokens, before_final_norm=before_final_norm,
    )
    if engine != "local" or not Location.of(out).is_local:
        from lmgeom.runs.distributed import extract_model_sharded

        # shards cut from a stream of the corpus: the driver never holds it whole
        return extract_model_sharded(
            model, corpus, str(out), field=field, pretokenized=pretokenized,
            limit=limit, sample=sample, seed=seed, encoder_options=encoder_options, dtype=dtype,
            chunk_sentences=chunk_sentences or default_chunk_sentences, shard_sentences=shard_sentences, compress=compress,
            engine=engine,
            num_workers=num_workers, gpus_per_worker=gpus_per_worker, ray_address=ray_address, overwrite=overwrite,
            progress=progress)
    if num_workers != 1 or gpus_per_worker or shard_sentences:
        raise InputError("`num_workers`, `gpus_per_worker` and `shard_sentences` apply to `engine='ray'`; "
                         "add `engine='ray'` or leave them out",
                         param=("num_workers", "gpus_per_worker", "shard_sentences", "engine"))
    # a bad corpus spec fails before the model loads
    sentences = load_corpus(corpus, field=field, pretokenized=pretokenized, limit=limit, sample=sample, seed=seed)
    encoder = load_encoder(model, **encoder_options)
    return extract(encoder, sentences, out, dtype=dtype, chunk_sentences=chunk_sentences, compress=compress,
                   overwrite=overwrite, progress=progress)


def open_or_extract(store_or_model: str, *, corpus: str = "lee", device: str = "auto",
                    progress: Progress | None = None) -> RepresentationStore:
    """Open the store at `store_or_model`; anything else names a model, extracted on `corpus` into
    runs/<model>-<corpus> first (or resumed from there). An existing folder that is neither a store
    nor a model folder is refused (a named model wins over a folder of its name)."""
    if layout.is_store(store_or_model):
        return RepresentationStore.open(store_or_model)
    from lmgeom.encoders.registry import NAMED_MODELS, is_model_folder  # torch: only where a model may be loaded

    folder = Path(store_or_model)
    if store_or_model not in NAMED_MODELS and not is_url(store_or_model) and folder.is_dir() and not is_model_folder(folder):
        raise FileNotFoundError(
            f"{store_or_model} is neither a store (it has no {layout.META}: write one with `lmgeom extract MODEL "
            f"--out {store_or_model}`) nor a model folder (no config.json, GGUF file, or ELMo options and weights); "
            "give a store, a model folder, a Hugging Face id or a named model"
        )
    return extract_model(store_or_model, corpus, device=device, progress=progress)
