"""Static word embeddings distilled from a store (Ethayarajh 2019, section 5), and their benchmark scores.

The static embedding of a word at layer l is v1, the first right singular vector of its *uncentred*
occurrence matrix (the first principal component in the paper's uncentred sense), as a unit
vector with its sign chosen so that v1 . mean >= 0 (a singular vector's sign is arbitrary). The
code behind the paper's released figures saved `TruncatedSVD.components_[0]`, the same direction (a
later PCA version kept the direction of largest spread about the word's mean, which does not point
at the word at all when occurrences form a tight cluster).
Baselines: the mean of the word's occurrences at layer l, and the mean of its layer-0
(embedding output) occurrences.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd
from gensim.models import KeyedVectors

from lmgeom.evaluate.wordsim import GENSIM_BENCHMARKS, evaluate_benchmarks, load_static_vectors
from lmgeom.metrics.contextuality import WordMeanAccumulator
from lmgeom.metrics.spectrum import OccurrenceSpectrum
from lmgeom.runs.analysis import DEFAULT_MEV_MEMORY_MB, AnalysisOptions, AnalysisPlan, plan_analysis, word_spectra
from lmgeom.progress import NoProgress, Progress
from lmgeom.runs.rundir import write_json, write_records_csv
from lmgeom.runs.tally import DEFAULT_CHUNK_ROWS, Feed, tally
from lmgeom.store import RepresentationStore

STATIC_KINDS = ("first_pc", "mean", "layer0_mean")


@dataclass
class StaticEmbeddings:
    """Per-word vectors of one layer, words ordered by frequency (most frequent first)."""

    layer: int
    words: list[str]
    counts: np.ndarray
    vectors: dict[str, np.ndarray]  # kind -> (n_words, dim)
    store_meta: dict[str, Any]

    def keyed_vectors(self, kind: str = "first_pc") -> KeyedVectors:
        if kind not in self.vectors:
            raise ValueError(f"unknown static embedding kind {kind!r}; choose one of {', '.join(self.vectors)}")
        vectors = KeyedVectors(vector_size=self.vectors[kind].shape[1])
        vectors.add_vectors(self.words, self.vectors[kind].astype(np.float32))
        for word, count in zip(self.words, self.counts):
            vectors.set_vecattr(word, "count", int(count))
        return vectors

    def save(self, directory: str | os.PathLike[str], *, text_path: str | os.PathLike[str] | None = None) -> dict[str, Path]:
        """`<layer>.kv` (gensim) and word2vec text (default `<layer>.txt`) of the first-PC vectors."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        vectors = self.keyed_vectors("first_pc")
        kv_path = directory / f"{self.layer}.kv"
        text_path = Path(text_path) if text_path is not None else directory / f"{self.layer}.txt"
        text_path.parent.mkdir(parents=True, exist_ok=True)
        vectors.save(str(kv_path))
        vectors.save_word2vec_format(str(text_path), binary=False)
        return {"kv": kv_path, "word2vec_text": text_path}


def first_pc_vectors(store: RepresentationStore, layer: int, plan: AnalysisPlan, *,
                     chunk_rows: int = DEFAULT_CHUNK_ROWS) -> tuple[np.ndarray, dict[int, OccurrenceSpectrum]]:
    """(analysed word indexes ordered by frequency, most frequent first, and their spectra at `layer`);
    a word whose occurrences are all zero vectors has no direction and is left out."""
    spectra = word_spectra(store, layer, plan, groups=range(plan.n_groups), chunk_rows=chunk_rows)
    present = np.array(sorted(spectra))
    order = np.argsort(-plan.words.words["count"].to_numpy()[present], kind="stable")
    return present[order], spectra


def static_embeddings(
    store: RepresentationStore | str | os.PathLike[str],
    *,
    layer: int,
    min_contexts: int = 1,
    include_special: bool = False,
    include_punct: bool = False,
    exclude_first_word: bool = False,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    mev_memory_mb: float = DEFAULT_MEV_MEMORY_MB,
) -> StaticEmbeddings:
    """First-PC, mean and layer-0-mean vectors at `layer` for words in at least `min_contexts` sentences
    (rows chosen by the row selection of `lmgeom.runs.selection`)."""
    if not isinstance(store, RepresentationStore):
        store = RepresentationStore.open(store)
    store.layer(layer)  # an unknown layer is an IndexError naming the range
    plan = plan_analysis(store, AnalysisOptions(min_contexts=min_contexts, include_special=include_special,
                                                include_punct=include_punct, exclude_first_word=exclude_first_word,
                                                layers=(layer,), mev_memory_mb=mev_memory_mb))
    words = plan.words.words
    ordered, spectra = first_pc_vectors(store, layer, plan, chunk_rows=chunk_rows)
    mean = np.stack([spectra[w].mean for w in ordered])
    if layer == 0:
        layer0_mean = mean
    else:
        means = WordMeanAccumulator(len(words))
        tally(store, 0, [Feed(means, plan.words.word_index >= 0, {"word_ids": plan.words.word_index})], chunk_rows=chunk_rows)
        layer0_mean = means.result()[ordered]
    return StaticEmbeddings(
        layer=layer,
        words=words["word"].to_numpy()[ordered].tolist(),
        counts=words["count"].to_numpy()[ordered],
        vectors={"first_pc": np.stack([spectra[w].direction for w in ordered]), "mean": mean, "layer0_mean": layer0_mean},
        store_meta=dict(store.meta),
    )


def restrict_to_words(vectors: KeyedVectors, words: Sequence[str]) -> KeyedVectors:
    """The vectors of `vectors` whose key lowercases to one of `words` (lowercased), in their order."""
    wanted = {word.lower() for word in words}
    keys = [key for key in vectors.index_to_key if key.lower() in wanted]
    restricted = KeyedVectors(vector_size=vectors.vector_size)
    if keys:
        restricted.add_vectors(keys, np.stack([vectors[key] for key in keys]))
    return restricted


def _restricted_vectors(path: str | os.PathLike[str], words: Sequence[str]) -> KeyedVectors:
    return restrict_to_words(load_static_vectors(path), words)


def benchmark_static_embeddings(
    embeddings: StaticEmbeddings,
    *,
    benchmarks: Mapping[str, str | os.PathLike[str]] | None = None,
    static_vectors: Sequence[str | os.PathLike[str]] = (),
    progress: Progress | None = None,
) -> pd.DataFrame:
    """Scores of first-PC, mean, layer-0 and any given static vectors, on the store's vocabulary.

    `benchmarks` defaults to gensim's shipped SimLex-999, WordSim-353 and Google analogies. Given
    static vectors are restricted to the words the store covers, so every row has the same vocabulary.
    """
    benchmarks = dict(GENSIM_BENCHMARKS if benchmarks is None else benchmarks)
    candidates: dict[str, Callable[[], KeyedVectors]] = {
        f"{kind} (layer {embeddings.layer if kind != 'layer0_mean' else 0})": partial(embeddings.keyed_vectors, kind)
        for kind in STATIC_KINDS
    }
    for path in static_vectors:
        candidates[f"static: {Path(path).name}"] = partial(_restricted_vectors, path, embeddings.words)
    progress = progress or NoProgress()
    progress.start("score vectors", len(candidates), unit="vector sets")
    records = []
    for label, load in candidates.items():
        vectors = load()
        for record in evaluate_benchmarks(vectors, benchmarks):
            records.append({"vectors": label, "layer": embeddings.layer, "n_vectors": len(vectors), **record})
        progress.advance("score vectors", note=label)
    return pd.DataFrame(records)


def write_benchmarks(scores: pd.DataFrame, embeddings: StaticEmbeddings, directory: str | os.PathLike[str]) -> dict[str, Path]:
    """`<layer>.benchmarks.json` and `.csv` in `directory`."""
    directory = Path(directory)
    payload = {
        "layer": embeddings.layer,
        "n_words": len(embeddings.words),
        "static_embedding": "first right singular vector of the uncentred occurrence matrix, unit length, sign with the mean",
        "case": "benchmarks matched case-insensitively to the most frequent casing in the store",
        "records": scores.to_dict("records"),
    }
    return {
        "json": write_json(directory / f"{embeddings.layer}.benchmarks.json", "static_embedding_benchmarks", payload,
                           store_meta=embeddings.store_meta),
        "csv": write_records_csv(directory / f"{embeddings.layer}.benchmarks.csv", scores.to_dict("records")),
    }


@dataclass
class StaticEmbeddingRun:
    embeddings: StaticEmbeddings
    scores: pd.DataFrame
    paths: dict[str, Path]


def export_static_embeddings(
    store: RepresentationStore | str | os.PathLike[str],
    *,
    layer: int,
    text_path: str | os.PathLike[str] | None = None,
    benchmarks: Sequence[str | os.PathLike[str]] = (),
    static_vectors: Sequence[str | os.PathLike[str]] = (),
    min_contexts: int = 1,
    include_punct: bool = False,
    progress: Progress | None = None,
) -> StaticEmbeddingRun:
    """Distil a layer's static embeddings, save them under STORE/static/ (gensim `.kv` and word2vec text,
    or `text_path`), and score them on gensim's benchmarks plus `benchmarks` next to `static_vectors`;
    the scores go to STORE/static/<layer>.benchmarks.json and .csv."""
    if not isinstance(store, RepresentationStore):
        store = RepresentationStore.open(store)
    for path in [*benchmarks, *static_vectors]:
        if not Path(path).exists():
            raise FileNotFoundError(f"{path} does not exist")
    progress = progress or NoProgress()
    progress.start(f"distil layer {layer}", 1, unit="layers")
    embeddings = static_embeddings(store, layer=layer, min_contexts=min_contexts, include_punct=include_punct)
    progress.advance(f"distil layer {layer}")
    directory = store.path / "static"
    saved = embeddings.save(directory, text_path=text_path)
    scores = benchmark_static_embeddings(
        embeddings, benchmarks={**GENSIM_BENCHMARKS, **{Path(path).stem: path for path in benchmarks}},
        static_vectors=static_vectors, progress=progress,
    )
    return StaticEmbeddingRun(embeddings, scores, {**saved, **write_benchmarks(scores, embeddings, directory)})
