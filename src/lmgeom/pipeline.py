"""The main job behind `lmgeom run`: extract, then analyse and summarise every layer."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from lmgeom.metrics.analyze import ContextualityResult
from lmgeom.results import write_json
from lmgeom.store import RepresentationStore


def default_run_dir(model: str, corpus: str) -> Path:
    """runs/<model>-<corpus>: the model's folder name and the corpus name (a file's stem), slugged."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", f"{Path(model).name}-{Path(corpus.split(':')[0]).stem}").strip("-")
    return Path("runs") / slug


def layer_summary(store: RepresentationStore, contextuality: ContextualityResult, *, write: bool = True) -> list[dict[str, Any]]:
    """Per layer over the occurrences `contextuality` analysed (no special tokens, no punctuation by
    default): mean norm, the mean cosine of 1,000 random occurrences (seeded, as Ethayarajh 2019
    sampled) and the exact mean over all pairs."""
    table = contextuality.layers.set_index(["layer", "metric"])
    records = [
        {
            "layer": layer,
            "n_occurrences": contextuality.counts["rows_analysed"],
            "mean_norm": contextuality.counts["mean_norm_by_layer"][layer],
            "sampled_average_cosine": float(table.at[(layer, "anisotropy_sampled"), "raw"]),
            "average_cosine": float(table.at[(layer, "anisotropy_exact"), "raw"]),
        }
        for layer in store.layers
    ]
    if write:
        write_json(store.path / "summary.json", "layer_summary", {"seed": contextuality.settings["seed"], "layers": records},
                   store_meta=store.meta)
    return records
