"""Contextuality of a representation store (Ethayarajh 2019): baselines, SelfSim, IntraSim, MEV.

One streaming pass per layer feeds every accumulator; words whose occurrence matrices do not fit
in `mev_memory_mb` at once get further passes over the same layer, a group of words at a time.
Memory is per-word state only: a d-vector per analysed word, and min(n, d) x d for MEV.

Which rows count: special tokens never; punctuation not by default (as the paper did); zero
vectors are left out and counted. Self-similarity and MEV use all occurrences of each word with
at least `min_contexts` distinct sentences (two occurrences in one sentence are two occurrences,
as in the original code). The baselines are over the same rows.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import pandas as pd
from gensim.parsing.preprocessing import STOPWORDS
from scipy.stats import spearmanr

from lmgeom.metrics.base import as_float64_rows
from lmgeom.metrics.contextuality import (
    MEV_VARIANTS,
    AverageCosineAccumulator,
    IntraSentenceAccumulator,
    MEVAccumulator,
    OccurrenceSpectrum,
    SelfSimilarityAccumulator,
    average_cosine,
    occurrence_spectrum,
    row_norms,
    sample_indexes,
)
from lmgeom.results import LAYER_NOTE, write_json, write_records_csv
from lmgeom.store import RepresentationStore

ANISOTROPY_THRESHOLD = 0.05  # a layer is called anisotropic when its exact baseline exceeds this
STATIC_VARIANCE_THRESHOLD = 0.05  # the paper: a static embedding explains < 5% of the variance
N_LEAST_SELF_SIMILAR = 10
DEFAULT_MEV_MEMORY_MB = 512
# rows per chunk read from the store: 16k x 768 float64 is 100 MB, and a few masked copies of it exist at once
DEFAULT_CHUNK_ROWS = 16384

DEFINITIONS = {
    "anisotropy_exact": "mean cosine over all ordered pairs of distinct analysed occurrences (closed form, exact)",
    "anisotropy_sampled": "the same mean over the pairs of n uniformly sampled occurrences (the paper's estimate; seeded)",
    "self_similarity": "mean over words of the mean cosine between a word's occurrences; baseline = anisotropy_exact",
    "intra_sentence_similarity": "mean over sentences of the mean cosine between each word and the sentence's mean vector; "
                                 "baseline = anisotropy_exact",
    "mev_uncentred": "mean over words of sigma_1^2 / sum_i sigma_i^2 of the raw occurrence matrix (the paper's formula); "
                     "baseline = the same on the sampled occurrences",
    "mev_centred": "mean over words of the first principal component's share of variance after removing the word's mean "
                   "(PCA; a later version of the original code); baseline = the same on the sampled occurrences",
    "mev_svd_ratio": "mean over words of var(X v1) / total centred variance, v1 = first uncentred singular vector "
                     "(TruncatedSVD explained_variance_ratio_[0], as for the paper's released figures); baseline = the same on the sampled occurrences",
    "adjusted": "raw minus baseline, per layer",
}


def layer_name(layer: int) -> str:
    return "embedding output" if layer == 0 else f"block {layer}"


# ---------------------------------------------------------------------------------------------
# which rows and words are analysed


@dataclass
class RowSelection:
    """The analysed rows of a store and the dense index of the analysed words."""

    analysed: np.ndarray  # bool per row
    sentence_ids: np.ndarray  # per row
    word_index: np.ndarray  # per row: index into `words`, -1 for rows of words not analysed
    words: pd.DataFrame  # word_id, word, count, contexts (analysed rows only)
    counts: dict[str, int]


def select_rows(
    store: RepresentationStore, *, min_contexts: int, exclude_punct: bool, exclude_first_word: bool = False
) -> RowSelection:
    """Rows to analyse (no special tokens; no punctuation if `exclude_punct`; not each sentence's
    first word if `exclude_first_word`), and the words with enough contexts."""
    tokens = store.tokens
    special = tokens["is_special"].to_numpy(dtype=bool)
    punct = tokens["is_punct"].to_numpy(dtype=bool) & ~special
    analysed = ~special & ~(punct if exclude_punct else np.zeros_like(punct))
    # Decoders without BOS put outlier activations on the first position (see docs/metrics.md).
    first_word = ~special & (pd.Series(~special).groupby(tokens["sentence_id"].to_numpy()).cumsum().to_numpy() == 1)
    analysed_before_first = analysed.copy()
    if exclude_first_word:
        analysed &= ~first_word
    table = tokens.loc[analysed].groupby("word_id", sort=True).agg(
        word=("word", "first"), count=("sentence_id", "size"), contexts=("sentence_id", "nunique")
    ).reset_index()
    words = table.loc[table["contexts"] >= min_contexts].reset_index(drop=True)
    if words.empty:
        raise ValueError(_no_word_message(table["contexts"], min_contexts, int(analysed.sum())))
    index_of_word_id = np.full(int(tokens["word_id"].max()) + 1, -1, dtype=np.int64)
    index_of_word_id[words["word_id"].to_numpy()] = np.arange(len(words))
    word_index = np.where(analysed, index_of_word_id[tokens["word_id"].to_numpy()], -1)
    counts = {
        "rows": len(tokens),
        "rows_analysed": int(analysed.sum()),
        "rows_special_excluded": int(special.sum()),
        "rows_punctuation_excluded": int(punct.sum()) if exclude_punct else 0,
        "rows_first_word_excluded": int((first_word & analysed_before_first).sum()) if exclude_first_word else 0,
        "sentences": int(tokens.loc[analysed, "sentence_id"].nunique()),
        "distinct_words": len(table),
        "words_analysed": len(words),
        "words_below_min_contexts": len(table) - len(words),
        "rows_of_analysed_words": int(words["count"].sum()),
    }
    return RowSelection(analysed, tokens["sentence_id"].to_numpy(), word_index, words, counts)


def _no_word_message(contexts: pd.Series, min_contexts: int, n_rows: int) -> str:
    histogram = contexts.value_counts().sort_index()
    shown = ", ".join(f"{n} word{'s' if n != 1 else ''} in {c} sentence{'s' if c != 1 else ''}" for c, n in histogram.items())
    return (
        f"no word occurs in at least {min_contexts} distinct sentences ({n_rows} analysed tokens; {shown or 'no words'}); "
        "lower --min-contexts (2 is the least that defines self-similarity) or use a bigger corpus"
    )


# ---------------------------------------------------------------------------------------------
# streaming passes


def layer_chunks(store: RepresentationStore, layer: int, *, chunk_rows: int) -> Iterator[tuple[int, np.ndarray]]:
    """(start_row, float64 rows) of a layer; NaN/inf is an error naming the layer and store row."""
    for start, chunk in store.iter_chunks(layer, chunk_rows=chunk_rows):
        yield start, as_float64_rows(chunk, name=f"layer {layer} of {store.path}", layer=layer, row_offset=start)


def plan_word_groups(counts: np.ndarray, dim: int, *, memory_mb: float) -> np.ndarray:
    """Group number per word so that each group's MEV state (min(n, d) x d float64 each) fits the budget."""
    cost = np.minimum(np.asarray(counts, dtype=np.int64), dim) * dim * 8
    budget = memory_mb * 2**20
    groups = np.zeros(len(cost), dtype=np.int64)
    group, used = 0, 0.0
    for word, bytes_needed in enumerate(cost):
        if used > 0 and used + bytes_needed > budget:
            group, used = group + 1, 0.0
        groups[word] = group
        used += bytes_needed
    return groups


def word_spectra(
    store: RepresentationStore,
    layer: int,
    word_index: np.ndarray,
    groups: np.ndarray,
    *,
    chunk_rows: int,
    first_group: MEVAccumulator | None = None,
) -> dict[int, OccurrenceSpectrum]:
    """Spectra of every word's occurrence matrix at one layer, one pass per word group.

    `first_group`, when given, already holds group 0 (filled during another pass over the layer).
    """
    spectra = dict(first_group.result()) if first_group is not None else {}
    group_of_row = np.where(word_index >= 0, groups[np.maximum(word_index, 0)], -1)
    for group in range(1 if first_group is not None else 0, int(groups.max(initial=-1)) + 1):
        accumulator = MEVAccumulator(len(groups))
        for start, X in layer_chunks(store, layer, chunk_rows=chunk_rows):
            rows = group_of_row[start : start + len(X)] == group
            accumulator.add(_rows(X, rows), word_ids=word_index[start : start + len(X)][rows])
        spectra.update(accumulator.result())
    return spectra


# ---------------------------------------------------------------------------------------------
# one layer


def _rows(X: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """X[mask] without a copy when every row is kept (the usual case)."""
    return X if mask.all() else X[mask]


@dataclass
class _LayerStats:
    layer: int
    mean_norm: float
    anisotropy_exact: float
    n_points: int
    n_zero: int
    anisotropy_sampled: float
    n_sampled: int
    mev_baseline: dict[str, float]
    intra: pd.Series
    self_similarity: np.ndarray
    nonzero_counts: np.ndarray
    mev: dict[str, np.ndarray]


def _analyse_layer(store: RepresentationStore, layer: int, selection: RowSelection, sampled_rows: np.ndarray,
                   *, chunk_rows: int, groups: np.ndarray) -> _LayerStats:
    n_words = len(selection.words)
    baseline = AverageCosineAccumulator()
    intra = IntraSentenceAccumulator()
    self_sim = SelfSimilarityAccumulator(n_words)
    first_group = MEVAccumulator(n_words)
    sample_blocks, norm_sum = [], 0.0
    for start, X in layer_chunks(store, layer, chunk_rows=chunk_rows):
        stop = start + len(X)
        analysed = selection.analysed[start:stop]
        X_analysed = _rows(X, analysed)
        baseline.add(X_analysed)
        norm_sum += float(row_norms(X_analysed).sum())
        intra.add(X_analysed, sentence_ids=selection.sentence_ids[start:stop][analysed])
        words = selection.word_index[start:stop]
        known = words >= 0
        self_sim.add(_rows(X, known), word_ids=words[known])
        in_first_group = known & (groups[np.maximum(words, 0)] == 0)
        first_group.add(_rows(X, in_first_group), word_ids=words[in_first_group])
        in_chunk = sampled_rows[(sampled_rows >= start) & (sampled_rows < stop)]
        sample_blocks.append(X[in_chunk - start])
    spectra = word_spectra(store, layer, selection.word_index, groups, chunk_rows=chunk_rows, first_group=first_group)
    sample = np.concatenate(sample_blocks)
    sample = sample[row_norms(sample) > 0]
    sample_spectrum = occurrence_spectrum(sample)
    mev = {variant: np.full(n_words, np.nan) for variant in MEV_VARIANTS}
    for word, spectrum in spectra.items():
        for variant in MEV_VARIANTS:
            mev[variant][word] = spectrum.mev(variant)
    return _LayerStats(
        layer=layer,
        mean_norm=norm_sum / max(int(selection.analysed.sum()), 1),
        anisotropy_exact=baseline.result(),
        n_points=baseline.n_points,
        n_zero=baseline.n_zero,
        anisotropy_sampled=average_cosine(sample),
        n_sampled=len(sample),
        mev_baseline={variant: sample_spectrum.mev(variant) for variant in MEV_VARIANTS},
        intra=intra.result(),
        self_similarity=self_sim.result(),
        nonzero_counts=self_sim.counts,
        mev=mev,
    )


# ---------------------------------------------------------------------------------------------
# result


@dataclass
class ContextualityResult:
    """Per-layer tidy records (`layers`), per word x layer values (`words`), computed findings."""

    layers: pd.DataFrame
    words: pd.DataFrame
    findings: dict[str, Any]
    statements: list[str]
    settings: dict[str, Any]
    counts: dict[str, Any]
    store_meta: dict[str, Any] = field(default_factory=dict)
    store_path: Path | None = None

    @property
    def records(self) -> list[dict[str, Any]]:
        """One record per layer x metric: raw, baseline, adjusted."""
        return self.layers.to_dict("records")

    def summary(self) -> pd.DataFrame:
        """One row per layer, one column per metric (raw and adjusted side by side)."""
        wide = self.layers.pivot(index="layer", columns="metric", values=["raw", "adjusted"])
        columns = {}
        for metric in self.layers["metric"].unique():
            columns[metric] = wide[("raw", metric)]
            if self.layers.loc[self.layers["metric"] == metric, "adjusted"].notna().any():
                columns[f"{metric}_adjusted"] = wide[("adjusted", metric)]
        table = pd.DataFrame(columns)
        table.insert(0, "layer_name", [layer_name(layer) for layer in table.index])
        return table.reset_index()

    def to_json(self) -> dict[str, Any]:
        """The JSON payload (provenance is added by `write`)."""
        return {
            "layer_note": LAYER_NOTE,
            "settings": self.settings,
            "definitions": DEFINITIONS,
            "counts": self.counts,
            "records": self.records,
            "findings": self.findings,
            "statements": self.statements,
        }

    def write(self, directory: str | os.PathLike | None = None) -> dict[str, Path]:
        """contextuality.json, contextuality_layers.csv, contextuality_words.csv (default: next to the store)."""
        if directory is None and self.store_path is None:
            raise ValueError("give a directory to write to (this result has no store path)")
        directory = Path(directory if directory is not None else self.store_path)
        return {
            "json": write_json(directory / "contextuality.json", "contextuality", self.to_json(), store_meta=self.store_meta),
            "layers_csv": write_records_csv(directory / "contextuality_layers.csv", self.records),
            "words_csv": write_records_csv(directory / "contextuality_words.csv", self.words.to_dict("records")),
        }


def _mean_defined(values: np.ndarray) -> float:
    defined = values[~np.isnan(values)]
    return float(defined.mean()) if len(defined) else float("nan")


def _layer_records(stats: _LayerStats) -> list[dict[str, Any]]:
    name = layer_name(stats.layer)
    exact = stats.anisotropy_exact
    word_count = int(np.count_nonzero(~np.isnan(stats.self_similarity)))

    def record(metric: str, raw: float, baseline: float, source: str, n: int) -> dict[str, Any]:
        return {"layer": stats.layer, "layer_name": name, "metric": metric, "raw": raw, "baseline": baseline,
                "adjusted": raw - baseline, "baseline_source": source, "n": n}

    records = [
        {"layer": stats.layer, "layer_name": name, "metric": "anisotropy_exact", "raw": exact, "baseline": np.nan,
         "adjusted": np.nan, "baseline_source": "", "n": stats.n_points},
        {"layer": stats.layer, "layer_name": name, "metric": "anisotropy_sampled", "raw": stats.anisotropy_sampled,
         "baseline": np.nan, "adjusted": np.nan, "baseline_source": "", "n": stats.n_sampled},
        record("self_similarity", _mean_defined(stats.self_similarity), exact, "anisotropy_exact", word_count),
        record("intra_sentence_similarity", _mean_defined(stats.intra.to_numpy()), exact, "anisotropy_exact",
               int(stats.intra.notna().sum())),
    ]
    for variant in MEV_VARIANTS:
        values = stats.mev[variant]
        records.append(record(f"mev_{variant}", _mean_defined(values),
                              stats.mev_baseline[variant], f"mev_{variant} of the sampled occurrences",
                              int(np.count_nonzero(~np.isnan(values)))))
    return records


def _word_frame(stats: _LayerStats, words: pd.DataFrame) -> pd.DataFrame:
    frame = pd.DataFrame({
        "layer": stats.layer,
        "layer_name": layer_name(stats.layer),
        "word_id": words["word_id"].to_numpy(),
        "word": words["word"].to_numpy(),
        "count": words["count"].to_numpy(),
        "contexts": words["contexts"].to_numpy(),
        "nonzero_occurrences": stats.nonzero_counts,
        "self_similarity": stats.self_similarity,
        "self_similarity_adjusted": stats.self_similarity - stats.anisotropy_exact,
    })
    for variant in MEV_VARIANTS:
        frame[f"mev_{variant}"] = stats.mev[variant]
        frame[f"mev_{variant}_adjusted"] = stats.mev[variant] - stats.mev_baseline[variant]
    return frame


# ---------------------------------------------------------------------------------------------
# findings


def _depth_trend(layers: list[int], values: list[float]) -> dict[str, Any]:
    if len(layers) < 3:
        return {"spearman_rho": None, "p_value": None, "falls_with_depth": None, "monotone_decreasing": None,
                "note": "fewer than 3 non-input layers"}
    if np.ptp(values) == 0:
        return {"spearman_rho": None, "p_value": None, "falls_with_depth": False, "monotone_decreasing": False,
                "note": "the same value at every non-input layer"}
    rho, p_value = spearmanr(layers, values)
    return {
        "spearman_rho": float(rho),
        "p_value": float(p_value),
        "falls_with_depth": bool(rho < 0),
        "monotone_decreasing": bool(np.all(np.diff(values) < 0)),
    }


def _findings(summary: pd.DataFrame, words: pd.DataFrame) -> tuple[dict[str, Any], list[str]]:
    upper = summary.loc[summary["layer"] >= 1]
    if upper.empty:
        note = "this store has only layer 0 (the embedding output): no findings about contextual layers"
        return {"note": note}, [note]
    layers = upper["layer"].tolist()
    findings: dict[str, Any] = {}
    statements: list[str] = []

    baseline = upper.set_index("layer")["anisotropy_exact"]
    anisotropic = bool((baseline > ANISOTROPY_THRESHOLD).all())
    findings["anisotropy"] = {
        "threshold": ANISOTROPY_THRESHOLD,
        "every_non_input_layer_anisotropic": anisotropic,
        "min_baseline": float(baseline.min()), "min_baseline_layer": int(baseline.idxmin()),
        "max_baseline": float(baseline.max()), "max_baseline_layer": int(baseline.idxmax()),
    }
    statements.append(
        f"Every non-input layer anisotropic (exact baseline > {ANISOTROPY_THRESHOLD}): {'yes' if anisotropic else 'no'} "
        f"(baseline {baseline.min():.3f} at layer {baseline.idxmin()} to {baseline.max():.3f} at layer {baseline.idxmax()})"
    )

    trends = {kind: _depth_trend(layers, upper[column].tolist())
              for kind, column in (("raw", "self_similarity"), ("adjusted", "self_similarity_adjusted"))}
    findings["self_similarity_depth"] = {"layers": layers, **trends}
    for kind, trend in trends.items():
        if trend["spearman_rho"] is not None:
            statements.append(
                f"Mean self-similarity ({kind}) falls with depth over layers {layers[0]}-{layers[-1]}: "
                f"{'yes' if trend['falls_with_depth'] else 'no'} (Spearman rho {trend['spearman_rho']:+.2f}, "
                f"p {trend['p_value']:.2g}; strictly monotone: {'yes' if trend['monotone_decreasing'] else 'no'})"
            )

    last = layers[-1]
    at_last = words.loc[(words["layer"] == last) & words["self_similarity"].notna()]
    least = at_last.nsmallest(N_LEAST_SELF_SIMILAR, "self_similarity")
    is_stop = least["word"].str.lower().isin(STOPWORDS)
    overall_share = float(at_last["word"].str.lower().isin(STOPWORDS).mean()) if len(at_last) else float("nan")
    findings["least_self_similar"] = {
        "layer": last,
        "words": least["word"].tolist(),
        "self_similarity": least["self_similarity"].tolist(),
        "stopword_share": float(is_stop.mean()) if len(least) else None,
        "stopword_share_among_all_analysed_words": overall_share,
        "stopword_list": f"gensim.parsing.preprocessing.STOPWORDS ({len(STOPWORDS)} words, lowercase match)",
    }
    statements.append(
        f"The {len(least)} least self-similar words at layer {last}: {', '.join(least['word'])}; "
        f"{is_stop.mean():.0%} are stopwords (vs {overall_share:.0%} of all analysed words)"
    )

    findings["static_embedding_variance"] = {}
    for variant in MEV_VARIANTS:
        adjusted = upper.set_index("layer")[f"mev_{variant}_adjusted"]
        below = bool((adjusted < STATIC_VARIANCE_THRESHOLD).all())
        findings["static_embedding_variance"][variant] = {
            "threshold": STATIC_VARIANCE_THRESHOLD,
            "adjusted_mev_below_threshold_every_non_input_layer": below,
            "max_adjusted_mev": float(adjusted.max()), "max_adjusted_mev_layer": int(adjusted.idxmax()),
            "max_raw_mev": float(upper[f"mev_{variant}"].max()),
        }
        statements.append(
            f"A static embedding explains < {STATIC_VARIANCE_THRESHOLD:.0%} of a word's variance after adjustment "
            f"(MEV {variant}) in every non-input layer: {'yes' if below else 'no'} "
            f"(mean adjusted MEV at most {adjusted.max():.3f}, layer {adjusted.idxmax()})"
        )
    return findings, statements


# ---------------------------------------------------------------------------------------------
# driver


def analyze_store(
    store: RepresentationStore | str | os.PathLike,
    *,
    min_contexts: int = 5,
    exclude_punct: bool = True,
    exclude_first_word: bool = False,
    seed: int = 0,
    n_samples: int = 1000,
    layers: Sequence[int] | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    mev_memory_mb: float = DEFAULT_MEV_MEMORY_MB,
    on_layer: Callable[[int], None] | None = None,
) -> ContextualityResult:
    """Anisotropy baselines, self-similarity, intra-sentence similarity and MEV for every layer.

    `on_layer(layer)` is called after each layer (progress reporting).
    """
    if not isinstance(store, RepresentationStore):
        store = RepresentationStore.open(store)
    if min_contexts < 2:
        raise ValueError(f"--min-contexts must be at least 2 (self-similarity needs two occurrences); got {min_contexts}")
    layers = list(store.layers if layers is None else layers)
    for layer in layers:
        store.layer(layer)  # an unknown layer is an IndexError naming the range
    selection = select_rows(
        store, min_contexts=min_contexts, exclude_punct=exclude_punct, exclude_first_word=exclude_first_word
    )
    sampled_rows = sample_indexes(np.flatnonzero(selection.analysed), n_samples, seed)
    groups = plan_word_groups(selection.words["count"].to_numpy(), store.dim, memory_mb=mev_memory_mb)

    records, word_frames, zero_rows, mean_norms = [], [], {}, {}
    for layer in layers:
        stats = _analyse_layer(store, layer, selection, sampled_rows, chunk_rows=chunk_rows, groups=groups)
        records.extend(_layer_records(stats))
        word_frames.append(_word_frame(stats, selection.words))
        zero_rows[layer] = stats.n_zero
        mean_norms[layer] = stats.mean_norm
        if on_layer is not None:
            on_layer(layer)

    layer_table = pd.DataFrame(records)
    words = pd.concat(word_frames, ignore_index=True)
    result = ContextualityResult(
        layers=layer_table,
        words=words,
        findings={},
        statements=[],
        settings={
            "min_contexts": min_contexts, "exclude_punct": exclude_punct, "exclude_first_word": exclude_first_word,
            "seed": seed, "n_samples": n_samples,
            "layers": layers, "sampling": "occurrences drawn uniformly without replacement from the analysed rows; "
            "the same rows at every layer",
            "adjusted_baselines": "SelfSim and IntraSim: anisotropy_exact of the layer; MEV: the same MEV variant "
                                  "computed on the sampled occurrences of the layer",
            "anisotropy_threshold": ANISOTROPY_THRESHOLD, "static_variance_threshold": STATIC_VARIANCE_THRESHOLD,
        },
        counts={**selection.counts, "mev_word_groups": int(groups.max()) + 1,
                "zero_vectors_excluded_by_layer": zero_rows, "mean_norm_by_layer": mean_norms},
        store_meta=dict(store.meta),
        store_path=store.path,
    )
    result.findings, result.statements = _findings(result.summary(), words)
    return result
