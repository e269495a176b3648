"""Contextuality of a representation store (Ethayarajh 2019): baselines, SelfSim, IntraSim, MEV.

One streaming read per layer feeds every accumulator (`lmgeom.runs.tally`). Words whose occurrence
matrices do not fit in `mev_memory_mb` at once are solved a group of words at a time: the read keeps
the first group's MEV state in memory and writes every other group's rows to a scratch file of its
own (`lmgeom.runs.spool`), from which each group is solved in turn (`solve_word_groups`), so the
store is read once per layer whatever the number of groups. Memory is per-word state only: a
d-vector per analysed word, and one word group's MEV state at a time (at most `mev_memory_mb`:
`mev_state_bytes` of the rows as stored, float32 for a float32 or float16 store).
Rows are chosen by the one row selection of `lmgeom.runs.selection`; self-similarity and MEV use
every selected occurrence of each word with at least `min_contexts` distinct sentences, and the
baselines use the same rows.

With `num_workers` > 1, `analyze_store` analyses several layers at once, each in a worker process
running the same per-layer function (identical numbers; memory about `num_workers` times a layer's).

Shards: `analyze_shard` runs the same accumulators over a range of rows and returns their state,
which can be saved (`.npz`, no pickle), loaded in another process, merged, and finished with
`finish_analysis`; the result equals one `analyze_store` pass (closed-form statistics to float64
rounding).
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from lmgeom.errors import InputError
from lmgeom.metrics.base import load_states, save_states
from lmgeom.metrics.contextuality import (
    MEV_VARIANTS,
    AverageCosineAccumulator,
    IntraSentenceAccumulator,
    MeanNormAccumulator,
    MEVAccumulator,
    OccurrenceSpectrum,
    RowSampleAccumulator,
    SelfSimilarityAccumulator,
    average_cosine,
    mev_state_bytes,
    occurrence_spectrum,
    row_norms,
    sample_indexes,
)
from lmgeom.progress import NoProgress, Progress
from lmgeom.runs import rundir
from lmgeom.runs.rundir import LAYER_NOTE, write_json, write_records_csv
from lmgeom.runs.selection import SELECTION_COLUMNS, RowSelection, WordSelection, select_rows, select_words
from lmgeom.runs.spool import RowSpool, scratch_folder
from lmgeom.runs.tally import DEFAULT_CHUNK_ROWS, Feed, RowSink, row_range, stored_row_bytes, tally
from lmgeom.runs.workers import die_with_parent
from lmgeom.store import RepresentationStore

ANISOTROPY_THRESHOLD = 0.05  # a layer is called anisotropic when its exact baseline exceeds this
STATIC_VARIANCE_THRESHOLD = 0.05  # the paper: a static embedding explains < 5% of the variance
N_LEAST_SELF_SIMILAR = 10
DEFAULT_MEV_MEMORY_MB = 512

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
# the plan every pass and every shard shares


@dataclass(frozen=True)
class AnalysisOptions:
    """What a contextuality analysis is asked for; every shard of one analysis uses the same options.
    Rows follow `lmgeom.runs.selection`; `n_samples` occurrences (seeded) make the sampled baselines;
    `mev_memory_mb` bounds the per-word occurrence matrices held at once."""

    min_contexts: int = 5
    include_special: bool = False
    include_punct: bool = False
    exclude_first_word: bool = False
    seed: int = 0
    n_samples: int = 1000
    layers: tuple[int, ...] | None = None
    mev_memory_mb: float = DEFAULT_MEV_MEMORY_MB


@dataclass(frozen=True)
class AnalysisPlan:
    """What a whole analysis (or each of its shards) agrees on: settings, rows, words, the seeded
    sample of occurrences and the word groups of the MEV passes."""

    options: AnalysisOptions
    settings: dict[str, Any]  # the options as contextuality.json records them
    layers: list[int]
    selection: RowSelection
    words: WordSelection
    sampled_rows: np.ndarray
    groups: np.ndarray  # MEV word group of each analysed word
    store_identity: dict[str, Any]

    @property
    def n_groups(self) -> int:
        return int(self.groups.max(initial=-1)) + 1

    def mev_accumulator(self) -> MEVAccumulator:
        """An MEV accumulator of the analysed words that knows their counts (the words that will
        outgrow the row budget go to X^T X from their first rows; the others' rows are never copied again)."""
        return MEVAccumulator(len(self.words), expected_counts=self.words.words["count"].to_numpy())


def plan_analysis(store: RepresentationStore, options: AnalysisOptions = AnalysisOptions()) -> AnalysisPlan:
    """Select rows and words, draw the sampled occurrences and plan the MEV word groups."""
    if options.min_contexts < 1:
        raise InputError(f"`min_contexts` must be at least 1; got {options.min_contexts}", param="min_contexts")
    layers = list(store.layers if options.layers is None else options.layers)
    for layer in layers:
        store.layer(layer)  # an unknown layer is an IndexError naming the range
    # only the columns the selection reads (not the per-row words: the vocabulary names the words)
    tokens = store.token_columns(*SELECTION_COLUMNS)
    selection = select_rows(tokens, include_special=options.include_special, include_punct=options.include_punct,
                            exclude_first_word=options.exclude_first_word)
    del tokens  # the selection keeps its own arrays
    words = select_words(store.vocab, selection, min_contexts=options.min_contexts)
    settings = {
        "min_contexts": options.min_contexts, "exclude_punct": not options.include_punct,
        "exclude_first_word": options.exclude_first_word, "include_special": options.include_special,
        "seed": options.seed, "n_samples": options.n_samples, "layers": layers, "mev_memory_mb": options.mev_memory_mb,
        "sampling": "occurrences drawn uniformly without replacement from the analysed rows; the same rows at every layer",
        "adjusted_baselines": "SelfSim and IntraSim: anisotropy_exact of the layer; MEV: the same MEV variant "
                              "computed on the sampled occurrences of the layer",
        "anisotropy_threshold": ANISOTROPY_THRESHOLD, "static_variance_threshold": STATIC_VARIANCE_THRESHOLD,
    }
    return AnalysisPlan(
        options=options,
        settings=settings,
        layers=layers,
        selection=selection,
        words=words,
        sampled_rows=sample_indexes(selection.rows, options.n_samples, options.seed),
        groups=plan_word_groups(words.words["count"].to_numpy(), store.dim, memory_mb=options.mev_memory_mb,
                                row_bytes=stored_row_bytes(store)),
        store_identity=_store_identity(store),
    )


def _store_identity(store: RepresentationStore) -> dict[str, Any]:
    meta = store.meta
    return {key: meta.get(key) for key in ("model_id", "model_fingerprint", "corpus_fingerprint", "n_tokens", "n_layers", "dim")}


def plan_word_groups(counts: np.ndarray, dim: int, *, memory_mb: float, row_bytes: int = 8) -> np.ndarray:
    """Group number per word so that each group's MEV state (`mev_state_bytes` of rows of `row_bytes`
    a value: 4 for the float32 rows a float32 or float16 store hands MEV) fits the budget."""
    cost = mev_state_bytes(counts, dim, row_bytes=row_bytes)
    budget = memory_mb * 2**20
    groups = np.zeros(len(cost), dtype=np.int64)
    group, used = 0, 0.0
    for word, bytes_needed in enumerate(cost):
        if used > 0 and used + bytes_needed > budget:
            group, used = group + 1, 0.0
        groups[word] = group
        used += bytes_needed
    return groups


# ---------------------------------------------------------------------------------------------
# the accumulators of one layer


@dataclass
class LayerAccumulators:
    """Every streaming statistic of one layer; `mev` holds one accumulator per word group kept."""

    baseline: AverageCosineAccumulator
    norms: MeanNormAccumulator
    intra: IntraSentenceAccumulator
    self_similarity: SelfSimilarityAccumulator
    sample: RowSampleAccumulator
    mev: dict[int, MEVAccumulator]

    @classmethod
    def empty(cls, plan: AnalysisPlan, groups: Iterable[int]) -> LayerAccumulators:
        n_words = len(plan.words)
        return cls(AverageCosineAccumulator(), MeanNormAccumulator(), IntraSentenceAccumulator(),
                   SelfSimilarityAccumulator(n_words), RowSampleAccumulator(plan.sampled_rows),
                   {group: plan.mev_accumulator() for group in groups})

    def named(self) -> dict[str, Any]:
        return {"baseline": self.baseline, "norms": self.norms, "intra": self.intra,
                "self_similarity": self.self_similarity, "sample": self.sample,
                **{f"mev{group}": accumulator for group, accumulator in self.mev.items()}}

    @classmethod
    def from_named(cls, named: dict[str, Any]) -> LayerAccumulators:
        mev = {int(name.removeprefix("mev")): acc for name, acc in named.items() if name.startswith("mev")}
        return cls(named["baseline"], named["norms"], named["intra"], named["self_similarity"], named["sample"], mev)

    def merge(self, other: LayerAccumulators) -> None:
        self.baseline.merge(other.baseline)
        self.norms.merge(other.norms)
        self.intra.merge(other.intra)
        self.self_similarity.merge(other.self_similarity)
        self.sample.merge(other.sample)
        for group, accumulator in other.mev.items():
            if group in self.mev:
                self.mev[group].merge(accumulator)
            else:
                self.mev[group] = accumulator

    def feeds(self, plan: AnalysisPlan) -> list[Feed]:
        selection, word_index = plan.selection, plan.words.word_index
        known = word_index >= 0
        feeds = [
            Feed(self.baseline, selection.mask),
            Feed(self.norms, selection.mask),
            Feed(self.intra, selection.mask, {"sentence_ids": selection.sentence_ids}),
            Feed(self.self_similarity, known, {"word_ids": word_index}),
            Feed(self.sample, selection.mask, {"rows": np.arange(len(selection.mask))}),
        ]
        return feeds + mev_feeds(plan, self.mev)


def mev_feeds(plan: AnalysisPlan, accumulators: Mapping[int, RowSink]) -> list[Feed]:
    """Feeds of each word group's rows into that group's MEV accumulator (or its `RowSpool`)."""
    word_index = plan.words.word_index
    group_of_row = np.where(word_index >= 0, plan.groups[np.maximum(word_index, 0)], -1)
    # MEV keeps float32 rows as float32 (half the bytes of float64, exact results): it gets the rows as stored
    return [Feed(accumulator, group_of_row == group, {"word_ids": word_index}, stored_rows=True)
            for group, accumulator in accumulators.items()]


def solve_word_groups(store: RepresentationStore, layer: int, plan: AnalysisPlan, *, groups: Sequence[int],
                      record: Callable[[dict[int, OccurrenceSpectrum]], None], feeds: Sequence[Feed] = (),
                      rows: range | tuple[int, int] | None = None, chunk_rows: int = DEFAULT_CHUNK_ROWS,
                      device: str = "cpu") -> None:
    """MEV spectra of the words of `groups` at `layer`, handed to `record` a group at a time, from one
    read of the layer (over `rows`) that also feeds `feeds` (the pass's other accumulators, on `device`).

    The first group's MEV state fills in memory during the read; every other group's rows (as stored:
    float32 for a float32 or float16 store) go to a `RowSpool` of their own. Then each group is solved
    in turn, the later ones from their own file in one sequential read, and dropped before the next:
    memory holds one group's state at a time (`mev_memory_mb`), the local disk the other groups' rows
    until each is solved (at most the analysed rows as stored). The spools live in a fresh folder of
    the system's temporary directory (`lmgeom.runs.spool.scratch_folder`: TMPDIR), removed when this
    returns or raises; the folder of a killed process is removed by the next one made on its host."""
    with ExitStack() as cleanup:
        in_memory = {group: plan.mev_accumulator() for group in groups[:1]}
        spools: dict[int, RowSpool] = {}
        if len(groups) > 1:
            scratch = Path(cleanup.enter_context(scratch_folder()))
            spools = {group: cleanup.enter_context(RowSpool(scratch / f"group-{group}.rows")) for group in groups[1:]}
        tally(store, layer, [*feeds, *mev_feeds(plan, {**in_memory, **spools})], rows=rows, chunk_rows=chunk_rows, device=device)
        for group in groups:
            if group in in_memory:
                accumulator = in_memory.pop(group)
            else:
                accumulator = plan.mev_accumulator()
                spools[group].drain(accumulator)
            record(accumulator.result())
            del accumulator  # before the next group's rows are read: one group's state at a time


def word_spectra(store: RepresentationStore, layer: int, plan: AnalysisPlan, *, groups: Iterable[int],
                 rows: range | tuple[int, int] | None = None, chunk_rows: int = DEFAULT_CHUNK_ROWS) -> dict[int, OccurrenceSpectrum]:
    """Spectra of the analysed words' occurrence matrices at `layer`, from one read of the layer
    (`solve_word_groups`: one word group's matrices in memory at a time). MEV runs on the CPU, so
    this read never moves rows to a GPU."""
    spectra: dict[int, OccurrenceSpectrum] = {}
    solve_word_groups(store, layer, plan, groups=list(groups), record=spectra.update, rows=rows, chunk_rows=chunk_rows)
    return spectra


# ---------------------------------------------------------------------------------------------
# one layer's numbers


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


def empty_mev(n_words: int) -> dict[str, np.ndarray]:
    """Each MEV variant per analysed word, NaN until `record_mev` fills it."""
    return {variant: np.full(n_words, np.nan) for variant in MEV_VARIANTS}


def record_mev(mev: dict[str, np.ndarray], spectra: Mapping[int, OccurrenceSpectrum], words: np.ndarray | None = None) -> None:
    """Each variant's value of each word's spectrum into `mev` (at `words[key]` when given, else at
    `key`). Only these numbers are kept: a spectrum's direction and mean (2d floats a word) are not."""
    for key, spectrum in spectra.items():
        word = key if words is None else int(words[key])
        for variant in MEV_VARIANTS:
            mev[variant][word] = spectrum.mev(variant)


def _layer_stats(layer: int, accumulators: LayerAccumulators, mev: dict[str, np.ndarray], *,
                 self_similarity: tuple[np.ndarray, np.ndarray] | None = None) -> _LayerStats:
    """`mev`: each variant per word (`empty_mev`, `record_mev`). `self_similarity`: (values, non-zero
    counts) per word when computed by word group elsewhere (`lmgeom.runs.distributed`) instead of by
    `accumulators.self_similarity`."""
    sample = accumulators.sample.result()
    sample = sample[row_norms(sample) > 0]
    sample_spectrum = occurrence_spectrum(sample)
    return _LayerStats(
        layer=layer,
        mean_norm=accumulators.norms.result(),
        anisotropy_exact=accumulators.baseline.result(),
        n_points=accumulators.baseline.n_points,
        n_zero=accumulators.baseline.n_zero,
        anisotropy_sampled=average_cosine(sample),
        n_sampled=len(sample),
        mev_baseline={variant: sample_spectrum.mev(variant) for variant in MEV_VARIANTS},
        intra=accumulators.intra.result(),
        self_similarity=accumulators.self_similarity.result() if self_similarity is None else self_similarity[0],
        nonzero_counts=accumulators.self_similarity.counts if self_similarity is None else self_similarity[1],
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
    store_path: str | os.PathLike[str] | None = None  # where the store is: a local path or an fsspec URL
    written: dict[str, rundir.Target] = field(default_factory=dict)

    @property
    def records(self) -> list[dict[str, Any]]:
        """One record per layer x metric: raw, baseline, adjusted."""
        return self.layers.to_dict("records")

    def summary(self) -> pd.DataFrame:
        """One row per layer, one column per metric (raw, and adjusted beside it for a metric with a
        baseline); NaN where a value is undefined (e.g. a centred MEV of words without spread)."""
        wide = self.layers.pivot(index="layer", columns="metric", values=["raw", "adjusted"])
        columns = {}
        for metric in self.layers["metric"].unique():
            columns[metric] = wide[("raw", metric)]
            if (self.layers.loc[self.layers["metric"] == metric, "baseline_source"] != "").any():
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

    @classmethod
    def read(cls, store: RepresentationStore, directory: str | os.PathLike[str] | None = None) -> ContextualityResult:
        """The result written by `write` for `store` (default: next to the store)."""
        target = directory if directory is not None else store.url
        document, words = rundir.read_json(rundir.CONTEXTUALITY.at(target), "contextuality"), rundir.read_words(target)
        if document is None or words is None:
            raise FileNotFoundError(f"no {rundir.CONTEXTUALITY.name} and {rundir.CONTEXTUALITY_WORDS.name} in {target}; "
                                    f"run `{rundir.CONTEXTUALITY.producer}`")
        counts = dict(document["counts"])
        for key in ("zero_vectors_excluded_by_layer", "mean_norm_by_layer"):
            counts[key] = {int(layer): value for layer, value in counts[key].items()}
        records = pd.DataFrame(document["records"]).astype({"raw": float, "baseline": float, "adjusted": float})
        return cls(
            layers=records,
            words=words,
            findings=document["findings"],
            statements=document["statements"],
            settings=document["settings"],
            counts=counts,
            store_meta=dict(store.meta),
            store_path=store.url,
        )

    def write(self, directory: str | os.PathLike[str] | None = None) -> dict[str, rundir.Target]:
        """contextuality.json, contextuality_layers.csv, contextuality_words.csv (default: next to the store)."""
        if directory is not None:
            target = directory
        elif self.store_path is not None:
            target = self.store_path
        else:
            raise InputError("give a directory to write to (this result has no store path)")
        self.written = {
            "json": write_json(rundir.CONTEXTUALITY.at(target), "contextuality", self.to_json(), store_meta=self.store_meta),
            "layers_csv": write_records_csv(rundir.CONTEXTUALITY_LAYERS.at(target), self.records),
            "words_csv": write_records_csv(rundir.CONTEXTUALITY_WORDS.at(target), self.words.to_dict("records")),
        }
        return self.written


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
    undefined = [layer for layer, value in zip(layers, values) if np.isnan(value)]
    if undefined:
        return {"spearman_rho": None, "p_value": None, "falls_with_depth": None, "monotone_decreasing": None,
                "note": f"undefined at layers {undefined}"}
    if np.ptp(values) <= 1e-12 * np.max(np.abs(values)):  # equal to float64 rounding: ranks would be rounding noise
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
    # imported here: importing gensim takes about a second, which every layer worker would pay for nothing
    from gensim.parsing.preprocessing import STOPWORDS

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
        if trend.get("note", "").startswith("undefined"):
            statements.append(f"Mean self-similarity ({kind}) falls with depth: {trend['note']}")
        elif trend["spearman_rho"] is not None:
            statements.append(
                f"Mean self-similarity ({kind}) falls with depth over layers {layers[0]}-{layers[-1]}: "
                f"{'yes' if trend['falls_with_depth'] else 'no'} (Spearman rho {trend['spearman_rho']:+.2f}, "
                f"p {trend['p_value']:.2g}; strictly decreasing: {'yes' if trend['monotone_decreasing'] else 'no'})"
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
        # undefined where no analysed word's occurrences vary (centred variants) or the sampled ones do not
        undefined = adjusted.index[adjusted.isna()].tolist()
        defined = adjusted.dropna()
        question = (f"A static embedding explains < {STATIC_VARIANCE_THRESHOLD:.0%} of a word's variance after adjustment "
                    f"(MEV {variant}) in every non-input layer")
        raw_max = upper[f"mev_{variant}"].max()
        cause = ("every occurrence of each analysed word is the same vector" if np.isnan(raw_max)
                 else "the sampled occurrences do not vary")
        findings["static_embedding_variance"][variant] = {
            "threshold": STATIC_VARIANCE_THRESHOLD,
            "adjusted_mev_below_threshold_every_non_input_layer": bool((defined < STATIC_VARIANCE_THRESHOLD).all())
            if defined.size else None,
            "max_adjusted_mev": float(defined.max()) if defined.size else None,
            "max_adjusted_mev_layer": int(defined.idxmax()) if defined.size else None,
            "max_raw_mev": None if np.isnan(raw_max) else float(raw_max),
            "undefined_layers": undefined,
        }
        if not defined.size:
            statements.append(f"{question}: undefined (MEV {variant} is undefined at every non-input layer: {cause})")
            continue
        below = bool((defined < STATIC_VARIANCE_THRESHOLD).all())
        statements.append(
            f"{question}: {'yes' if below else 'no'} "
            f"(mean adjusted MEV at most {defined.max():.3f}, layer {defined.idxmax()}"
            + (f"; undefined at layers {undefined}" if undefined else "") + ")"
        )
    return findings, statements



# ---------------------------------------------------------------------------------------------
# drivers: one pass, or shards whose states merge


def analyze_store(
    store: RepresentationStore | str | os.PathLike[str],
    *,
    min_contexts: int = 5,
    include_special: bool = False,
    include_punct: bool = False,
    exclude_first_word: bool = False,
    seed: int = 0,
    n_samples: int = 1000,
    layers: Sequence[int] | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    mev_memory_mb: float = DEFAULT_MEV_MEMORY_MB,
    progress: Progress | None = None,
    write_to: str | os.PathLike[str] | bool = False,
    device: str = "cpu",
    num_workers: int = 1,
) -> ContextualityResult:
    """Anisotropy baselines, self-similarity, intra-sentence similarity and MEV for every layer.

    `write_to`: True writes the result files next to the store, a path writes them there
    (`result.written` names them); rows are chosen as `lmgeom.runs.selection` documents.
    `device`: where the closed-form statistics compute (see `lmgeom.runs.tally.tally`; MEV runs on
    the CPU); the numbers agree to float64 rounding on every device.
    `num_workers`: layers analysed at once, each in a worker process of its own (at most one per
    layer and one per CPU, `os.cpu_count()`; 1, a memory:// store, and layers of fewer than
    `POOL_MIN_LAYER_VALUES` analysed values: one layer after another in this process). A worker
    runs the same code on the same rows, so the numbers are identical to one process's, bit for bit.
    Each worker holds one layer's accumulators and one MEV word group (`mev_memory_mb`) and spools
    its layer's other groups to a scratch folder of its own: peak memory and scratch disk are about
    `num_workers` times those of one process, plus the libraries each worker imports before its
    first layer (about 0.2 GB and 1-2 s of CPU: worth it when a layer takes longer)."""
    require_num_workers(num_workers)
    store = _open(store)
    progress = progress or NoProgress()
    _require_two_contexts(min_contexts)
    plan = plan_analysis(store, AnalysisOptions(
        min_contexts=min_contexts, include_special=include_special, include_punct=include_punct,
        exclude_first_word=exclude_first_word, seed=seed, n_samples=n_samples,
        layers=None if layers is None else tuple(layers), mev_memory_mb=mev_memory_mb))
    progress.start("analyze layers", len(plan.layers), unit="layers")
    pool_size = _layer_pool_size(store, plan, num_workers)
    if pool_size > 1:
        stats = _analyze_layers_in_pool(store, plan, pool_size=pool_size, chunk_rows=chunk_rows, device=device,
                                        progress=progress)
    else:
        stats = []
        for layer in plan.layers:
            stats.append(_analyze_layer(store, plan, layer, chunk_rows=chunk_rows, device=device))
            progress.advance("analyze layers", note=f"layer {layer}")
    result = _result(store, plan, stats)
    if write_to is not False:
        result.write(None if write_to is True else write_to)
    return result


# a layer of fewer analysed values (rows x d) than this is analysed in the calling process: at 2^26
# (175,000 rows at d = 384) one layer takes about as long as starting a worker process (1.2-1.5 s of
# CPU measured: importing numpy, pandas, scipy and zarr), so below it a pool costs more than it saves
POOL_MIN_LAYER_VALUES = 2**26


def _layer_pool_size(store: RepresentationStore, plan: AnalysisPlan, num_workers: int) -> int:
    """How many worker processes analyse the layers: 1 (none) for a memory:// store (it lives in this
    process) or layers too small to pay for a worker's start; else at most one a layer and one a CPU."""
    if store.url.startswith("memory://") or int(plan.selection.mask.sum()) * store.dim < POOL_MIN_LAYER_VALUES:
        return 1
    return min(num_workers, len(plan.layers), os.cpu_count() or 1)


def _analyze_layer(store: RepresentationStore, plan: AnalysisPlan, layer: int, *, chunk_rows: int, device: str) -> _LayerStats:
    """Every statistic of one layer, from one read of it that feeds every accumulator and every MEV
    word group (the groups after the first spooled to disk: `solve_word_groups`)."""
    accumulators = LayerAccumulators.empty(plan, groups=[])
    mev = empty_mev(len(plan.words))
    solve_word_groups(store, layer, plan, groups=range(plan.n_groups), record=partial(record_mev, mev),
                      feeds=accumulators.feeds(plan), chunk_rows=chunk_rows, device=device)
    return _layer_stats(layer, accumulators, mev)


# A worker process's share of a parallel analysis: the store and the plan every layer of its pool
# needs, handed over once per process by the pool's initializer rather than pickled with each layer
# (the plan holds arrays of one value per store row: pickled, about 26 bytes a row)
_worker_analysis: tuple[str, AnalysisPlan] | None = None


def _start_layer_worker(store_url: str, plan: AnalysisPlan) -> None:
    global _worker_analysis
    die_with_parent()  # a killed caller leaves no worker behind
    _worker_analysis = (store_url, plan)


def _analyze_layer_in_worker(layer: int, *, chunk_rows: int, device: str) -> _LayerStats:
    assert _worker_analysis is not None, "a layer worker runs in a pool started by _analyze_layers_in_pool"
    store_url, plan = _worker_analysis
    # opening a store reads its meta.json and checks its files, nothing next to a layer's read; opened
    # here, not in the initializer, an error (the store moved, object storage unreachable) reaches the
    # caller with its message instead of breaking the pool
    return _analyze_layer(RepresentationStore.open(store_url), plan, layer, chunk_rows=chunk_rows, device=device)


def _analyze_layers_in_pool(store: RepresentationStore, plan: AnalysisPlan, *, pool_size: int, chunk_rows: int,
                            device: str, progress: Progress) -> list[_LayerStats]:
    """`_analyze_layer` of each layer of `plan` in `pool_size` worker processes, in layer order."""
    if device == "auto":  # resolved here, once: a worker told `cpu` never imports torch (1-2 s of its start)
        from lmgeom.device import resolve_analysis_device

        target = resolve_analysis_device(device)
        device = "cpu" if target is None else str(target)
    # spawn, not fork: this process has threads (BLAS, the tally's read-ahead), which a fork copies mid-state
    with ProcessPoolExecutor(max_workers=pool_size, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_start_layer_worker, initargs=(store.url, plan)) as pool:
        try:
            layer_of = {pool.submit(_analyze_layer_in_worker, layer, chunk_rows=chunk_rows, device=device): layer
                        for layer in plan.layers}
            stats: dict[int, _LayerStats] = {}
            for finished in as_completed(layer_of):
                stats[layer_of[finished]] = finished.result()  # a worker's exception is raised here, message and all
                progress.advance("analyze layers", note=f"layer {layer_of[finished]}")
        except BaseException:
            # layers not started are dropped; running ones finish and remove their scratch spools (on
            # Ctrl-C the workers, in the terminal's process group, are interrupted too)
            pool.shutdown(cancel_futures=True)
            raise
    return [stats[layer] for layer in plan.layers]


@dataclass
class AnalysisState:
    """The accumulator states of an analysis over some rows of a store (one shard, or merged shards)."""

    settings: dict[str, Any]
    store_identity: dict[str, Any]
    row_ranges: list[tuple[int, int]]
    layers: dict[int, LayerAccumulators] = field(default_factory=dict)

    def merge(self, other: AnalysisState) -> AnalysisState:
        """Add the states of a shard over other rows of the same store, analysed with the same settings."""
        if other.settings != self.settings or other.store_identity != self.store_identity:
            raise InputError("cannot merge analysis states of different stores or settings")
        overlap = [(a, b) for a in self.row_ranges for b in other.row_ranges if a[0] < b[1] and b[0] < a[1]]
        if overlap:
            raise InputError(f"shards overlap (rows {overlap[0][0]} and {overlap[0][1]}); each row may be analysed once")
        for layer, accumulators in other.layers.items():
            self.layers[layer].merge(accumulators)
        self.row_ranges = sorted(self.row_ranges + other.row_ranges)
        return self

    def save(self, path: str | os.PathLike[str]) -> Path:
        """One `.npz` file (no pickle) holding every accumulator's state and the settings."""
        states = {f"L{layer}.{name}": accumulator for layer, accumulators in self.layers.items()
                  for name, accumulator in accumulators.named().items()}
        header = {"kind": "contextuality_state", "settings": self.settings, "store": self.store_identity,
                  "row_ranges": self.row_ranges}
        return save_states(path, states, header=header)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> AnalysisState:
        header, states = load_states(path)
        if header.get("kind") != "contextuality_state":
            raise InputError(f"{path} is not a saved contextuality analysis state (it holds {header.get('kind')!r})")
        named: dict[int, dict[str, Any]] = {}
        for key, accumulator in states.items():
            layer, _, name = key.partition(".")
            named.setdefault(int(layer.removeprefix("L")), {})[name] = accumulator
        return cls(header["settings"], header["store"], [(int(start), int(stop)) for start, stop in header["row_ranges"]],
                   {layer: LayerAccumulators.from_named(parts) for layer, parts in sorted(named.items())})


def analyze_shard(
    store: RepresentationStore | str | os.PathLike[str],
    rows: range | tuple[int, int],
    options: AnalysisOptions = AnalysisOptions(),
    *,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    device: str = "cpu",
) -> AnalysisState:
    """The accumulator states of the analysis over store rows [start, stop), every word group at once.

    Shards over disjoint row ranges that cover the store, merged (`AnalysisState.merge`) and finished
    (`finish_analysis`), give the result of `analyze_store` with the same settings. A shard holds the
    MEV state of its own rows (at most its rows x dim per word group). `device` as for `analyze_store`."""
    store = _open(store)
    _require_two_contexts(options.min_contexts)
    plan = plan_analysis(store, options)
    span = row_range(store, rows)
    state = AnalysisState(plan.settings, plan.store_identity, [(span.start, span.stop)])
    for layer in plan.layers:
        accumulators = LayerAccumulators.empty(plan, groups=range(plan.n_groups))
        tally(store, layer, accumulators.feeds(plan), rows=span, chunk_rows=chunk_rows, device=device)
        state.layers[layer] = accumulators
    return state


def finish_analysis(store: RepresentationStore | str | os.PathLike[str], state: AnalysisState) -> ContextualityResult:
    """The result of merged shard states that together cover every row of `store` once."""
    store = _open(store)
    if state.store_identity != _store_identity(store):
        raise InputError(f"these analysis states were computed on another store than {store.url}")
    covered = sorted(state.row_ranges)
    ends = [0] + [stop for _, stop in covered]
    if any(start != end for (start, _), end in zip(covered, ends)) or ends[-1] != store.n_tokens:
        raise InputError(f"the merged shards cover rows {covered}, not every row of the store [0, {store.n_tokens}) once; "
                         "analyse the missing ranges and merge them in")
    settings = state.settings
    plan = plan_analysis(store, AnalysisOptions(
        min_contexts=settings["min_contexts"], include_special=settings["include_special"],
        include_punct=not settings["exclude_punct"], exclude_first_word=settings["exclude_first_word"],
        seed=settings["seed"], n_samples=settings["n_samples"], layers=tuple(settings["layers"]),
        mev_memory_mb=settings["mev_memory_mb"]))
    stats = []
    for layer in plan.layers:
        accumulators = state.layers[layer]
        mev = empty_mev(len(plan.words))
        for accumulator in accumulators.mev.values():
            record_mev(mev, accumulator.result())
        stats.append(_layer_stats(layer, accumulators, mev))
    return _result(store, plan, stats)


def require_num_workers(num_workers: int) -> None:
    """`analyze_store`'s `num_workers` (`--num-workers`) is at least 1."""
    if num_workers < 1:
        raise InputError(f"`num_workers` must be at least 1 (1 analyses one layer after another in this process); "
                         f"got {num_workers}", param="num_workers")


def _require_two_contexts(min_contexts: int) -> None:
    if min_contexts < 2:
        raise InputError(f"`min_contexts` must be at least 2 (self-similarity needs two occurrences); got {min_contexts}",
                         param="min_contexts")


def _open(store: RepresentationStore | str | os.PathLike[str]) -> RepresentationStore:
    return store if isinstance(store, RepresentationStore) else RepresentationStore.open(store)


def _result(store: RepresentationStore, plan: AnalysisPlan, stats: list[_LayerStats]) -> ContextualityResult:
    store.check_unchanged()  # every layer is read: the numbers are of the store opened, not of one rewritten since
    records = [record for layer_stats in stats for record in _layer_records(layer_stats)]
    words = pd.concat([_word_frame(layer_stats, plan.words.words) for layer_stats in stats], ignore_index=True)
    result = ContextualityResult(
        layers=pd.DataFrame(records),
        words=words,
        findings={},
        statements=[],
        settings=plan.settings,
        counts={**plan.selection.counts, **plan.words.counts, "mev_word_groups": plan.n_groups,
                "zero_vectors_excluded_by_layer": {s.layer: s.n_zero for s in stats},
                "mean_norm_by_layer": {s.layer: s.mean_norm for s in stats}},
        store_meta=dict(store.meta),
        store_path=store.url,
    )
    result.findings, result.statements = _findings(result.summary(), words)
    return result
