"""The main job behind `lmgeom run`, and resolving "a store, or a model to extract first"."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmgeom.corpus import load_corpus
from lmgeom.runs.analysis import ContextualityResult, analyze_store
from lmgeom.runs.extraction import extract
from lmgeom.runs.progress import NoProgress, Progress
from lmgeom.runs.results import write_json
from lmgeom.store import RepresentationStore, layout


def default_run_dir(model: str, corpus: str) -> Path:
    """runs/<model>-<corpus>: the model's folder name and the corpus name (a file's stem), slugged."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", f"{Path(model).name}-{Path(corpus.split(':')[0]).stem}").strip("-")
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
    chunk_sentences: int | None = None,
    gguf_file: str | None = None,
    revision: str | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> RepresentationStore:
    """`lmgeom extract`: load the corpus spec `corpus` and `model`, and extract every layer into `out`
    (default runs/<model>-<corpus>), resuming an interrupted run. Options as for `load_corpus`,
    `load_encoder` and `extract`."""
    from lmgeom.encoders.registry import load_encoder

    # a bad corpus spec fails before the model loads
    sentences = load_corpus(corpus, field=field, pretokenized=pretokenized, limit=limit, sample=sample, seed=seed)
    encoder = load_encoder(
        model, device=device, dtype=compute_dtype, pooling=pooling, keep_special=keep_special, prepend_bos=prepend_bos,
        skip_unaligned=skip_unaligned, max_length=max_length, gguf_file=gguf_file, revision=revision,
        max_batch_tokens=max_batch_tokens,
    )
    return extract(encoder, sentences, out or default_run_dir(model, corpus), dtype=dtype, chunk_sentences=chunk_sentences,
                   overwrite=overwrite, progress=progress)


def open_or_extract(store_or_model: str, *, corpus: str = "lee", device: str = "auto",
                    progress: Progress | None = None) -> RepresentationStore:
    """Open the store at `store_or_model`; anything else names a model, extracted on `corpus` into
    runs/<model>-<corpus> first (or resumed from there)."""
    if layout.is_store(store_or_model):
        return RepresentationStore.open(store_or_model)
    return extract_model(store_or_model, corpus, device=device, progress=progress)


def layer_summary(store: RepresentationStore, contextuality: ContextualityResult, *, write: bool = True) -> list[dict[str, Any]]:
    """Per layer over the occurrences `contextuality` analysed (no special tokens, no punctuation by
    default): mean norm, the mean cosine of 1,000 random occurrences (seeded, as Ethayarajh 2019
    sampled) and the exact mean over all pairs. Written to STORE/summary.json."""
    table = contextuality.layers.set_index(["layer", "metric"])
    records = [
        {
            "layer": layer,
            "n_occurrences": contextuality.counts["rows_analysed"],
            "mean_norm": contextuality.counts["mean_norm_by_layer"][layer],
            "sampled_average_cosine": float(table.at[(layer, "anisotropy_sampled"), "raw"]),
            "average_cosine": float(table.at[(layer, "anisotropy_exact"), "raw"]),
        }
        for layer in contextuality.settings["layers"]
    ]
    if write:
        write_json(store.path / "summary.json", "layer_summary", {"seed": contextuality.settings["seed"], "layers": records},
                   store_meta=store.meta)
    return records


@dataclass
class RunResult:
    """What `run` did: the store, the contextuality analysis, the per-layer summary, the files written."""

    store: RepresentationStore
    contextuality: ContextualityResult
    summary: list[dict[str, Any]]
    paths: list[Path]


def run(
    model: str = "minilm",
    corpus: str = "lee",
    *,
    out: str | os.PathLike[str] | None = None,
    limit: int | None = None,
    device: str = "auto",
    min_contexts: int = 5,
    seed: int = 0,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> RunResult:
    """The main job: extract every layer of `model` on `corpus` (resuming an interrupted extraction,
    skipping a finished one), analyse every layer as Ethayarajh (2019) did, and write
    summary.json, contextuality.json and the two contextuality CSVs into the run directory."""
    progress = progress or NoProgress()
    store = extract_model(model, corpus, out=out, limit=limit, device=device, overwrite=overwrite, progress=progress)
    contextuality = analyze_store(store, min_contexts=min_contexts, seed=seed, progress=progress, write_to=True)
    written = contextuality.written
    summary = layer_summary(store, contextuality)
    return RunResult(store, contextuality, summary, [store.path / "summary.json", *written.values()])
