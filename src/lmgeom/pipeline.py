"""The main job behind `lmgeom run`: extract, then analyse and summarise every layer."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from lmgeom.metrics.analyze import ContextualityResult, select_rows
from lmgeom.results import write_json
from lmgeom.store import RepresentationStore


def default_run_dir(model: str, corpus: str) -> Path:
    """runs/<model>-<corpus>: the model's folder name and the corpus name (a file's stem), slugged."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", f"{Path(model).name}-{Path(corpus.split(':')[0]).stem}").strip("-")
    return Path("runs") / slug


def layer_summary(store: RepresentationStore, contextuality: ContextualityResult, *, write: bool = True) -> list[dict[str, Any]]:
    """Per layer over the occurrences `contextuality` analysed (no special tokens, no punctuation by default): mean norm,
    and the anisotropy baseline from `contextuality` — the mean cosine of 1,000 random occurrences
    (seeded, as Ethayarajh 2019 sampled) and the exact mean over all pairs."""
    settings = contextuality.settings
    keep = select_rows(
        store, min_contexts=settings["min_contexts"], exclude_punct=settings["exclude_punct"],
        exclude_first_word=settings["exclude_first_word"],
    ).analysed
    rows = np.flatnonzero(keep)
    baselines = contextuality.summary().set_index("layer")
    records = []
    for layer in store.layers:
        norm_sum = sum(
            float(np.linalg.norm(block[keep[start : start + len(block)]].astype(np.float64), axis=1).sum())
            for start, block in store.iter_chunks(layer)
        )
        records.append({
            "layer": layer,
            "n_occurrences": int(len(rows)),
            "mean_norm": norm_sum / len(rows),
            "sampled_average_cosine": float(baselines.at[layer, "anisotropy_sampled"]),
            "average_cosine": float(baselines.at[layer, "anisotropy_exact"]),
        })
    if write:
        write_json(store.path / "summary.json", "layer_summary", {"seed": contextuality.settings["seed"], "layers": records},
                   store_meta=store.meta)
    return records
