"""Word-explorer data: per-word metrics across layers and precomputed nearest neighbours.

Neighbours are the top-k cosine neighbours among the first-principal-component static vectors of
each layer (Ethayarajh 2019, section 5), for the N most frequent analysed words. Only the ranks
and cosines go into the page, never vectors, so the report stays small for deep models. The data
is cached in RUN/explorer.json with its provenance; a cache made with other settings or from another
analysis is recomputed.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pandas as pd

from lmgeom.errors import InputError
from lmgeom.progress import NoProgress, Progress
from lmgeom.report.data import RunData
from lmgeom.report.explorer import WORD_COLUMNS
from lmgeom.rundir import CONTEXTUALITY_WORDS, EXPLORER, ResultFileError, read_json, write_json
from lmgeom.engine import AnalysisOptions
from lmgeom.stages.static import first_pc_vectors
from lmgeom.store import RepresentationStore, layout
from lmgeom.store.location import Location

DEFAULT_TOP_WORDS = 2000
DEFAULT_NEIGHBOURS = 10
EXPLORER_FORMAT = 2  # bumped when the payload's layout changes, so an old cache is recomputed


def top_words(words: pd.DataFrame, n: int) -> list[str]:
    """The n most frequent analysed words (ties by word), from contextuality_words.csv."""
    first_layer = words.loc[words["layer"] == words["layer"].min()]
    ranked = first_layer.sort_values(["count", "word"], ascending=[False, True], kind="stable")
    return ranked["word"].astype(str).head(n).tolist()


def nearest_neighbours(vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(indexes, cosines) of each row's k most cosine-similar other rows, best first (ties by index)."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit = vectors / np.where(norms > 0, norms, 1.0)
    similarity = unit @ unit.T
    np.fill_diagonal(similarity, -np.inf)
    k = min(k, len(vectors) - 1)
    # a stable sort on the negated similarity breaks ties by the lower index, reproducibly
    order = np.argsort(-similarity, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(similarity, order, axis=1)


def _analysis_fingerprint(run: RunData) -> str:
    """Changes whenever the analysis that chose the words is re-run with other results."""
    words = Location.of(CONTEXTUALITY_WORDS.at(run.path))
    return hashlib.sha256(words.read_bytes()).hexdigest() if words.exists() else ""


def _word_metrics(words: pd.DataFrame, chosen: list[str]) -> dict[str, Any]:
    """word -> {metric: [value per layer]} (null where undefined), rounded for size."""
    layers = sorted(int(layer) for layer in words["layer"].unique())
    table = words.loc[words["word"].isin(set(chosen))]
    metrics: dict[str, Any] = {}
    for word, rows in table.groupby("word", sort=False):
        rows = rows.set_index("layer").reindex(layers)
        entry: dict[str, Any] = {"count": int(rows["count"].dropna().iloc[0]), "contexts": int(rows["contexts"].dropna().iloc[0])}
        for column in WORD_COLUMNS:
            if column in rows:
                entry[column] = [None if pd.isna(v) else round(float(v), 4) for v in rows[column]]
        metrics[str(word)] = entry
    return {"layers": layers, "metrics": metrics}


def compute_explorer(run: RunData, *, top_n: int = DEFAULT_TOP_WORDS, k: int = DEFAULT_NEIGHBOURS,
                     progress: Progress | None = None) -> dict[str, Any]:
    """Explorer payload: the chosen words, their metrics by layer, and per layer a list aligned with the
    words of [neighbour word indexes, cosines (3 decimals)], best first (null for a word without a vector)."""
    if run.words is None or run.words.empty:
        raise InputError(f"no {CONTEXTUALITY_WORDS.name} in {run.path}; run `lmgeom analyze {run.path}` first")
    chosen = top_words(run.words, top_n)
    payload: dict[str, Any] = {"words": chosen, **_word_metrics(run.words, chosen), "neighbours": {}}
    location = Location.of(run.path)
    if not location.exists(layout.META) or not location.exists(layout.LAYERS):
        payload["neighbours_note"] = f"no store in {run.path}: nearest neighbours need its extracted layers"
        return payload
    store = RepresentationStore.open(run.path)
    # the analysis's own rows and words, with the options it recorded (its seed, samples and memory budget too)
    options = AnalysisOptions.from_settings((run.contextuality_document or {}).get("settings", {}), device="cpu")  # MEV runs on the CPU
    index = {word: i for i, word in enumerate(chosen)}
    progress = progress or NoProgress()
    progress.start("word explorer", len(payload["layers"]), unit="layers")
    for layer in payload["layers"]:
        vectors = first_pc_vectors(store, layer, options)
        word_names = vectors.words["word"].to_numpy()
        kept = [i for i, w in enumerate(vectors.order) if word_names[w] in index]
        names = [str(word_names[vectors.order[i]]) for i in kept]
        if len(kept) < 2:
            continue
        order, cosines = nearest_neighbours(vectors.first_pc[kept], k)
        # per chosen word (by index; null without a vector): [neighbour indexes], [cosines]
        entries: list[list[list[Any]] | None] = [None] * len(chosen)
        for i, name in enumerate(names):
            entries[index[name]] = [[index[names[j]] for j in order[i]], [round(float(c), 3) for c in cosines[i]]]
        payload["neighbours"][str(layer)] = entries
        progress.advance("word explorer", note=f"layer {layer}")
    return payload


def explorer_data(run: RunData, *, top_n: int = DEFAULT_TOP_WORDS, k: int = DEFAULT_NEIGHBOURS,
                  refresh: bool = False, progress: Progress | None = None) -> dict[str, Any]:
    """The cached RUN/explorer.json when it was made with these settings from this analysis, else computed and cached."""
    path = EXPLORER.at(run.path)
    settings = {"format": EXPLORER_FORMAT, "top_words": top_n, "neighbours": k, "analysis_sha256": _analysis_fingerprint(run),
                "vectors": "first principal component of each word's occurrences (lmgeom.stages.static)"}
    if not refresh:
        try:
            cached = read_json(path, EXPLORER.kind)
        except ResultFileError:
            cached = None  # a damaged cache is computed again
        if cached is not None and cached["settings"] == settings:
            return dict(cached["data"])
    data = compute_explorer(run, top_n=top_n, k=k, progress=progress)
    # compact: it can hold 600k neighbours
    write_json(path, EXPLORER.kind, {"settings": settings, "data": data}, store_meta=run.meta, compact=True)
    return data
