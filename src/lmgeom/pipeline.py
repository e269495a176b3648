"""The main job behind `lmgeom run`: extract, then summarise and analyse every layer."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from lmgeom.metrics.contextuality import AverageCosineAccumulator, sample_indexes, sampled_average_cosine
from lmgeom.results import write_json
from lmgeom.store import RepresentationStore

DEFAULT_MODEL = "minilm"
DEFAULT_CORPUS = "lee"
SAMPLED_OCCURRENCES = 1000


def default_run_dir(model: str, corpus: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", f"{Path(model).name}-{Path(corpus.split(':')[0]).name}").strip("-")
    return Path("runs") / slug


def word_rows(store: RepresentationStore, *, include_punct: bool = False) -> np.ndarray:
    """Rows of words: special tokens never, punctuation only when asked (Ethayarajh 2019 excludes it)."""
    keep = ~store.tokens["is_special"].to_numpy()
    if not include_punct:
        keep &= ~store.tokens["is_punct"].to_numpy()
    return np.flatnonzero(keep)


def layer_summary(store: RepresentationStore, *, seed: int = 0, write: bool = True) -> list[dict[str, Any]]:
    """Per layer over word occurrences (no special tokens, no punctuation): mean norm, the mean cosine
    of 1,000 random occurrences (seeded, as Ethayarajh 2019 sampled) and the exact mean over all pairs."""
    rows = word_rows(store)
    sample = sample_indexes(rows, SAMPLED_OCCURRENCES, seed)
    keep = np.zeros(store.n_tokens, dtype=bool)
    keep[rows] = True
    records = []
    for layer in store.layers:
        exact, norm_sum = AverageCosineAccumulator(), 0.0
        for start, block in store.iter_chunks(layer):
            block = block[keep[start : start + len(block)]].astype(np.float64)
            exact.add(block)
            norm_sum += float(np.linalg.norm(block, axis=1).sum())
        records.append({
            "layer": layer,
            "n_occurrences": int(len(rows)),
            "mean_norm": norm_sum / len(rows),
            "sampled_average_cosine": sampled_average_cosine(store.rows(layer, sample), n=len(sample), seed=seed),
            "average_cosine": exact.result(),
        })
    if write:
        write_json(store.path / "summary.json", "layer_summary", {"seed": seed, "layers": records}, store_meta=store.meta)
    return records
