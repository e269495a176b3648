"""The per-layer statistics: each is declared once, here (`STATISTICS`; the released code's in
`released.py`, the bootstrap's in `bootstrap.py`), with its presentation (`Measure`), and gathered by
`lmgeom.engine.registry`, where a caller adds its own (`register_statistic`). Every executor
computes a statistic the same way.

A `Statistic` names its accumulator (in `lmgeom.metrics`), which rows it takes, how the merged
accumulator becomes values (`finish`), and its section of the result files: its `records` in
contextuality.json / contextuality_layers.csv, its `word_columns` in contextuality_words.csv and its
per-layer `counts`. Scopes:
- `rows`: one accumulator over a layer's selected rows (labels per row from `labels`);
- `word_groups`: one accumulator per word group, over the rows of the group's words, labelled
  `word_ids` = each row's word index within the group; its values are arrays over the group's words,
  which the engine places into arrays over every analysed word. With `spool`, the accumulator of
  every group but the first waits in a scratch file during a layer's one read (MEV: one group's
  occurrence matrices in memory at a time).
`finish` and the result hooks get the layer's values: a dict of every statistic's values by name.

Pair statistics (`PairStatistic`, `PAIR_STATISTICS`) are the statistics of two aligned row
streams that similarity measures need (CKA and the Procrustes distance: `CrossMoments`); the tasks
of `lmgeom.engine.pairs` compute them.

A `rows` statistic with `every_row` takes every stored row (special tokens, punctuation and first
words included) instead of the selection. A statistic with `takes_inputs` is of a second stage: its
accumulator is made from its layer's values of an earlier analysis (`run_analysis(..., inputs=)`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

from lmgeom.errors import InputError
from lmgeom.metrics.contextuality import (
    AverageCosineAccumulator,
    IntraSentenceAccumulator,
    MeanNormAccumulator,
    RowSampleAccumulator,
    SelfSimilarityAccumulator,
    WordMeanAccumulator,
    WordRowsAccumulator,
    average_cosine,
    row_norms,
)
from lmgeom.metrics.mev import MEVAccumulator, occurrence_spectrum
from lmgeom.metrics.isotropy import MomentAccumulator, effective_rank, isotropy_report, local_isotropy
from lmgeom.metrics.similarity import STREAMED_MEASURES, CrossMoments, streamed_measures
from lmgeom.metrics.outliers import MagnitudeAccumulator, TransformedAccumulator, standardizing
from lmgeom.metrics.spectrum import MEV_VARIANTS

if TYPE_CHECKING:
    from lmgeom.engine.arrays import PlanArrays

ROWS = "rows"
WORD_GROUPS = "word_groups"
LayerValues = dict[str, Any]


@dataclass(frozen=True)
class Measure:
    """How one per-layer number of a statistic (a `metric` of its records) is named and shown, declared
    with the statistic and read by the CLI's tables, the report's charts, `compare` and the bootstrap:
    `label` (a table column; `adjusted_label`, default label + " adj", for raw − baseline), `title` and
    `estimator` (a chart's title: what is averaged over what), `y_label`, what its records' `n` counts
    (`counted`: "words", "sentences", "anisotropy" for the analysed occurrences), what its adjusted
    value subtracts (`baseline`; None: no adjusted value), the unit the bootstrap resamples for its
    interval (`resampled`; None: no interval), and whether `compare` and the report chart it (`chart`)."""

    name: str
    label: str
    title: str
    estimator: str
    counted: str
    y_label: str = ""
    baseline: str | None = None
    adjusted_label: str = ""
    resampled: str | None = None
    chart: bool = True

    @property
    def adjusted(self) -> str:
        """The label of its adjusted value."""
        return self.adjusted_label or f"{self.label} adj"


@dataclass(frozen=True)
class Statistic:
    """One per-layer statistic (see the module docstring). `accumulator(rows, words)`: a fresh
    accumulator (`words`: the group's words, indexes into the analysed words; None for `rows`
    scope), `accumulator(rows, words, inputs)` with `takes_inputs` (`inputs`: the layer's entry of
    `PlanArrays.inputs`); `finish(accumulator, rows, words)`: its values."""

    name: str
    scope: str
    accumulator: Callable[..., Any]
    finish: Callable[[Any, PlanArrays, np.ndarray | None], LayerValues]
    description: str = ""
    labels: Callable[[PlanArrays], Mapping[str, np.ndarray]] | None = None  # rows scope: labels per store row
    stored_rows: bool = False  # rows as stored (float32 exact) instead of float64 (`lmgeom.engine.loop.Feed`)
    spool: bool = False
    requires: tuple[str, ...] = ()  # statistics whose values its result hooks read
    min_contexts: int = 1
    every_row: bool = False  # rows scope: every stored row, not the selection
    takes_inputs: bool = False  # its accumulator takes the layer's inputs from an earlier analysis
    records: Callable[[LayerValues], list[dict[str, Any]]] | None = None
    word_columns: Callable[[LayerValues], dict[str, np.ndarray]] | None = None
    counts: Callable[[LayerValues], dict[str, Any]] | None = None
    definitions: dict[str, str] = field(default_factory=dict)  # metric -> what it is (contextuality.json)
    measures: tuple[Measure, ...] = ()  # how each metric of its records is named and shown

    def __post_init__(self) -> None:
        if self.scope not in (ROWS, WORD_GROUPS):
            raise InputError(f"unknown statistic scope {self.scope!r}; use {ROWS!r} or {WORD_GROUPS!r}", param="scope")
        if self.spool and not self.stored_rows:
            raise InputError("a spooled statistic takes its rows as stored (`stored_rows=True`)", param="spool")
        if self.every_row and self.scope != ROWS:
            raise InputError("only a `rows` statistic reads every stored row (`every_row=True`)", param="every_row")

    def new_accumulator(self, arrays: PlanArrays, words: np.ndarray | None, layer: int) -> Any:
        """A fresh accumulator of this statistic for `layer` (`words`: the group's, None for `rows` scope)."""
        if self.takes_inputs:
            if layer not in arrays.inputs:
                raise InputError(f"the statistic {self.name!r} needs layer {layer}'s values of an earlier analysis "
                                 "(`run_analysis(..., inputs={layer: ...})`)", param="inputs")
            return self.accumulator(arrays, words, arrays.inputs[layer])
        return self.accumulator(arrays, words)


# every statistic declared in this module, in order (`lmgeom.engine.registry` gathers them)
STATISTICS: list[Statistic] = []


def layer_record(metric: str, raw: float, n: int, *, baseline: float = float("nan"), source: str = "") -> dict[str, Any]:
    """One record of contextuality_layers.csv (the engine adds `layer` and `layer_name` before it):
    with a baseline `source`, `adjusted` is raw minus baseline."""
    return {"metric": metric, "raw": raw, "baseline": baseline, "adjusted": raw - baseline if source else float("nan"),
            "baseline_source": source, "n": n}


def mean_defined(values: np.ndarray) -> float:
    defined = values[~np.isnan(values)]
    return float(defined.mean()) if len(defined) else float("nan")


def _n_defined(values: np.ndarray) -> int:
    return int(np.count_nonzero(~np.isnan(values)))


# accumulator factories and finishers for the common cases (module-level functions and partials:
# a plan's statistics are pickled to worker processes)


def _fresh(cls: type, arrays: PlanArrays, words: np.ndarray | None) -> Any:
    return cls()


def fresh(cls: type) -> Callable[[PlanArrays, np.ndarray | None], Any]:
    """`accumulator` of a statistic whose accumulator takes no arguments."""
    return partial(_fresh, cls)


def _per_word(cls: type, arrays: PlanArrays, words: np.ndarray | None) -> Any:
    assert words is not None, f"{cls.__name__} counts by word: register it with scope {WORD_GROUPS!r}"
    return cls(len(words))


def per_word(cls: type) -> Callable[[PlanArrays, np.ndarray | None], Any]:
    """`accumulator` of a word statistic whose accumulator takes the number of words."""
    return partial(_per_word, cls)


def result_as(name: str, acc: Any, arrays: PlanArrays, words: np.ndarray | None) -> LayerValues:
    """`finish` (as `partial(result_as, name)`) keeping the accumulator's result under `name`."""
    return {name: acc.result()}


# ---------------------------------------------------------------------------------------------
# the contextuality statistics (Ethayarajh 2019)


def _baseline_values(acc: AverageCosineAccumulator, arrays: PlanArrays, words: np.ndarray | None) -> LayerValues:
    return {"anisotropy_exact": acc.result(), "n_points": acc.n_points, "n_zero": acc.n_zero}


def _baseline_records(v: LayerValues) -> list[dict[str, Any]]:
    return [layer_record("anisotropy_exact", v["anisotropy_exact"], v["n_points"])]


def _baseline_counts(v: LayerValues) -> dict[str, Any]:
    return {"zero_vectors_excluded_by_layer": v["n_zero"]}


STATISTICS.append(Statistic(
    "baseline", ROWS, fresh(AverageCosineAccumulator), _baseline_values,
    description="the exact anisotropy baseline", records=_baseline_records, counts=_baseline_counts,
    definitions={"anisotropy_exact": "mean cosine over all ordered pairs of distinct analysed occurrences (closed form, exact)"},
    measures=(Measure("anisotropy_exact", "anisotropy (exact)", "Anisotropy baseline, exact",
                      "mean cosine over all pairs of occurrences", "anisotropy", y_label="mean cosine similarity",
                      resampled="sentences"),),
))

def _norms_counts(v: LayerValues) -> dict[str, Any]:
    return {"mean_norm_by_layer": v["mean_norm"]}


STATISTICS.append(Statistic(
    "norms", ROWS, fresh(MeanNormAccumulator), partial(result_as, "mean_norm"),
    description="the mean norm of the analysed rows", counts=_norms_counts,
))


def _sample_values(acc: RowSampleAccumulator, arrays: PlanArrays, words: np.ndarray | None) -> LayerValues:
    sample = acc.result()
    sample = sample[row_norms(sample) > 0]
    spectrum = occurrence_spectrum(sample)
    return {"anisotropy_sampled": average_cosine(sample), "n_sampled": len(sample),
            "mev_baseline": {variant: spectrum.mev(variant) for variant in arrays.options.mev_variants}}


def _sample_accumulator(arrays: PlanArrays, words: np.ndarray | None) -> RowSampleAccumulator:
    return RowSampleAccumulator(arrays.sample(arrays.options.n_samples))


def row_number_labels(arrays: PlanArrays) -> dict[str, np.ndarray]:
    """`rows` labels: each row's number in the store (what a row sample keeps)."""
    return {"rows": arrays.row_numbers}


def _sample_records(v: LayerValues) -> list[dict[str, Any]]:
    return [layer_record("anisotropy_sampled", v["anisotropy_sampled"], v["n_sampled"])]


STATISTICS.append(Statistic(
    "sample", ROWS, _sample_accumulator, _sample_values,
    description="the sampled baselines", labels=row_number_labels, records=_sample_records,
    definitions={"anisotropy_sampled": "the same mean over the pairs of n uniformly sampled occurrences (the paper's estimate; seeded)"},
    measures=(Measure("anisotropy_sampled", "anisotropy (sampled)", "Anisotropy baseline, sampled",
                      "mean cosine over the pairs of a seeded sample of occurrences", "anisotropy",
                      y_label="mean cosine similarity", resampled="sampled occurrences", chart=False),),
))


def _self_similarity_values(acc: SelfSimilarityAccumulator, arrays: PlanArrays, words: np.ndarray | None) -> LayerValues:
    return {"self_similarity": acc.result(), "nonzero_occurrences": acc.counts}


def _self_similarity_columns(v: LayerValues) -> dict[str, np.ndarray]:
    return {"nonzero_occurrences": v["nonzero_occurrences"], "self_similarity": v["self_similarity"],
            "self_similarity_adjusted": v["self_similarity"] - v["anisotropy_exact"]}


def _self_similarity_records(v: LayerValues) -> list[dict[str, Any]]:
    return [layer_record("self_similarity", mean_defined(v["self_similarity"]), _n_defined(v["self_similarity"]),
                         baseline=v["anisotropy_exact"], source="anisotropy_exact")]


STATISTICS.append(Statistic(
    "self_similarity", WORD_GROUPS, per_word(SelfSimilarityAccumulator), _self_similarity_values,
    description="self-similarity needs two occurrences", requires=("baseline",), min_contexts=2,
    records=_self_similarity_records, word_columns=_self_similarity_columns,
    definitions={"self_similarity": "mean over words of the mean cosine between a word's occurrences; baseline = anisotropy_exact"},
    measures=(Measure("self_similarity", "SelfSim", "Self-similarity",
                      "mean pairwise cosine of a word's occurrences, averaged over words", "words", y_label="mean SelfSim",
                      baseline="exact anisotropy", resampled="sentences"),),
))

def sentence_labels(arrays: PlanArrays) -> dict[str, np.ndarray]:
    """`rows` labels: each row's sentence."""
    return {"sentence_ids": arrays.selection.sentence_ids}


def _intra_records(v: LayerValues) -> list[dict[str, Any]]:
    return [layer_record("intra_sentence_similarity", mean_defined(v["intra"].to_numpy()), int(v["intra"].notna().sum()),
                         baseline=v["anisotropy_exact"], source="anisotropy_exact")]


STATISTICS.append(Statistic(
    "intra", ROWS, fresh(IntraSentenceAccumulator), partial(result_as, "intra"),
    description="intra-sentence similarity", labels=sentence_labels, requires=("baseline",), records=_intra_records,
    definitions={"intra_sentence_similarity": "mean over sentences of the mean cosine between each word and the sentence's "
                                              "mean vector; baseline = anisotropy_exact"},
    measures=(Measure("intra_sentence_similarity", "IntraSim", "Intra-sentence similarity",
                      "mean cosine of each word to its sentence's mean vector, averaged over sentences", "sentences",
                      y_label="mean IntraSim", baseline="exact anisotropy", resampled="sentences"),),
))


def _mev_accumulator(arrays: PlanArrays, words: np.ndarray | None, *, variants: tuple[str, ...] | None = None) -> MEVAccumulator:
    """An MEV accumulator of a group's words that knows their counts (the words that will outgrow the
    row budget go to X^T X from their first rows; the others' rows are never copied again), solving
    `variants` (default: the plan's)."""
    assert words is not None
    counts = arrays.words.words["count"].to_numpy()[words]
    return MEVAccumulator(len(words), expected_counts=counts, variants=arrays.options.mev_variants if variants is None else variants)


def _mev_values(acc: MEVAccumulator, arrays: PlanArrays, words: np.ndarray | None) -> LayerValues:
    """Each MEV variant of each word (NaN for a word without a non-zero occurrence); only these
    numbers are kept, not a spectrum's direction and mean (2d floats a word)."""
    spectra = acc.result()
    values = {}
    for variant in acc.variants:
        column = np.full(acc.n_words, np.nan)
        for word, spectrum in spectra.items():
            column[word] = spectrum.mev(variant)
        values[f"mev_{variant}"] = column
    return values


def _mev_records(v: LayerValues) -> list[dict[str, Any]]:
    return [layer_record(f"mev_{variant}", mean_defined(v[f"mev_{variant}"]), _n_defined(v[f"mev_{variant}"]),
                         baseline=baseline, source=f"mev_{variant} of the sampled occurrences")
            for variant, baseline in v["mev_baseline"].items()]


def _mev_columns(v: LayerValues) -> dict[str, np.ndarray]:
    columns = {}
    for variant, baseline in v["mev_baseline"].items():
        columns[f"mev_{variant}"] = v[f"mev_{variant}"]
        columns[f"mev_{variant}_adjusted"] = v[f"mev_{variant}"] - baseline
    return columns


STATISTICS.append(Statistic(
    "mev", WORD_GROUPS, _mev_accumulator, _mev_values,
    description="maximum explainable variance", stored_rows=True, spool=True, requires=("sample",),
    records=_mev_records, word_columns=_mev_columns,
    definitions={
        "mev_uncentred": "mean over words of sigma_1^2 / sum_i sigma_i^2 of the raw occurrence matrix (the paper's formula); "
                         "baseline = the same on the sampled occurrences",
        "mev_centred": "mean over words of the first principal component's share of variance after removing the word's mean "
                       "(PCA; a later version of the original code); baseline = the same on the sampled occurrences",
        "mev_svd_ratio": "mean over words of var(X v1) / total centred variance, v1 = first uncentred singular vector "
                         "(TruncatedSVD explained_variance_ratio_[0], computed by the code the paper's released statistics come from); baseline = the "
                         "same on the sampled occurrences",
    },
    measures=tuple(
        Measure(f"mev_{variant}", f"MEV {label}", f"MEV {name}",
                "share of a word's occurrence variance on its first principal component, averaged over words", "words",
                y_label="mean MEV (0 to 1)", baseline="the same on sampled occurrences",
                adjusted_label="MEV adj" if variant == "svd_ratio" else "", resampled="words")
        for variant, label, name in (("uncentred", "uncentred", "uncentred (paper's formula)"),
                                     ("centred", "centred", "centred (PCA share)"),
                                     ("svd_ratio", "SVD ratio", "SVD ratio (released code)"))),
))



def _word_effective_rank_values(acc: WordRowsAccumulator, arrays: PlanArrays, words: np.ndarray | None) -> LayerValues:
    """Each word's effective rank (Roy & Vetterli 2007) of its centred occurrence matrix: exp of the
    entropy of its normalised singular values, between 1 (the occurrences on one line about their
    mean) and n − 1; NaN for a word with fewer than two non-zero occurrences."""
    values = np.full(acc.n_words, np.nan)
    for word, X in enumerate(acc.result()):
        X = X[row_norms(X) > 0].astype(np.float64)
        if len(X) >= 2:
            values[word] = effective_rank(X, centered=True)
    return {"word_effective_rank": values}


def _word_effective_rank_records(v: LayerValues) -> list[dict[str, Any]]:
    values = v["word_effective_rank"]
    return [layer_record("word_effective_rank", mean_defined(values), _n_defined(values))]


def _word_effective_rank_columns(v: LayerValues) -> dict[str, np.ndarray]:
    return {"word_effective_rank": v["word_effective_rank"]}


STATISTICS.append(Statistic(
    "word_effective_rank", WORD_GROUPS, per_word(WordRowsAccumulator), _word_effective_rank_values,
    description="the effective rank of each word's occurrences needs two occurrences", stored_rows=True, spool=True,
    min_contexts=2, records=_word_effective_rank_records, word_columns=_word_effective_rank_columns,
    definitions={"word_effective_rank": "mean over words of exp(entropy of the normalised singular values) of the word's "
                                        "centred occurrence matrix (Roy & Vetterli 2007); 1 = its occurrences on one line"},
    measures=(Measure("word_effective_rank", "eff. rank", "Effective rank of a word's occurrences",
                      "exp of the entropy of the normalised singular values of a word's centred occurrences, averaged "
                      "over words", "words", y_label="mean effective rank"),),
))

# ---------------------------------------------------------------------------------------------
# static vectors (Ethayarajh 2019, section 5) and the word explorer's neighbours


def _first_pc_values(acc: MEVAccumulator, arrays: PlanArrays, words: np.ndarray | None) -> LayerValues:
    """Each word's first principal direction and mean (NaN rows, and `has_vector` False, for a word
    whose occurrences are all zero vectors: it has no direction)."""
    spectra = acc.result()
    directions = np.full((acc.n_words, arrays.dim), np.nan)
    means = np.full((acc.n_words, arrays.dim), np.nan)
    for word, spectrum in spectra.items():
        directions[word], means[word] = spectrum.direction, spectrum.mean
    has_vector = np.zeros(acc.n_words, dtype=bool)
    has_vector[list(spectra)] = True
    return {"first_pc": directions, "first_pc_mean": means, "has_vector": has_vector}


STATISTICS.append(Statistic(
    "first_pc", WORD_GROUPS, partial(_mev_accumulator, variants=MEV_VARIANTS), _first_pc_values,
    description="each word's first principal direction (its static vector)", stored_rows=True, spool=True,
))

STATISTICS.append(Statistic(
    "word_mean", WORD_GROUPS, per_word(WordMeanAccumulator), partial(result_as, "word_mean"),
    description="each word's mean vector",
))


# ---------------------------------------------------------------------------------------------
# isotropy (isotropy.json): every global measure of `isotropy_report` and the size-weighted local
# isotropy inside k-means clusters, on one seeded sample of selected rows


def _on_device(X: np.ndarray, device: str) -> Any:
    """`X` where the global isotropy measures compute: numpy on `cpu`, else a torch tensor on the
    resolved device (the k-means of the local measures stays on the CPU)."""
    if device == "cpu":
        return X
    from lmgeom.device import resolve_analysis_device

    target = resolve_analysis_device(device)
    if target is None:
        return X
    import torch

    return torch.from_numpy(X).to(target)


def _isotropy_accumulator(arrays: PlanArrays, words: np.ndarray | None) -> RowSampleAccumulator:
    return RowSampleAccumulator(arrays.sample(arrays.options.isotropy_rows))


def _isotropy_values(acc: RowSampleAccumulator, arrays: PlanArrays, words: np.ndarray | None) -> LayerValues:
    X = acc.result()
    seed = arrays.options.seed
    measures: dict[str, float] = dict(isotropy_report(_on_device(X, arrays.options.device), seed=seed, max_rows=None))
    local = local_isotropy(X, n_clusters=min(arrays.options.isotropy_clusters, len(X)), seed=seed)
    measures.update({f"local_{name}": value for name, value in local.weighted_mean.items()})
    return {"isotropy": {name: value for name, value in measures.items() if name not in ("n_points", "n_used", "dim")},
            "isotropy_rows": len(X)}


STATISTICS.append(Statistic(
    "isotropy", ROWS, _isotropy_accumulator, _isotropy_values, description="global and local isotropy of a row sample",
    labels=row_number_labels,
))


# ---------------------------------------------------------------------------------------------
# moments of the selected rows (the calibrators that need only mean and covariance fit on them)


def _moments_accumulator(full_covariance: bool, arrays: PlanArrays, words: np.ndarray | None) -> MomentAccumulator:
    return MomentAccumulator(full_covariance=full_covariance)


def _keep_accumulator(name: str, acc: Any, arrays: PlanArrays, words: np.ndarray | None) -> LayerValues:
    return {name: acc}


STATISTICS.append(Statistic(
    "moments", ROWS, partial(_moments_accumulator, True), partial(_keep_accumulator, "moments"),
    description="count, mean and covariance of the selected rows",
))
STATISTICS.append(Statistic(
    "variances", ROWS, partial(_moments_accumulator, False), partial(_keep_accumulator, "variances"),
    description="count, mean and per-dimension variances of the selected rows",
))


# ---------------------------------------------------------------------------------------------
# pair statistics: of two aligned row streams (`lmgeom.engine.pairs`), layer x layer within a
# store or store x store over the same word occurrences


@dataclass(frozen=True)
class PairStatistic:
    """A statistic of pairs of aligned row streams ("sides"). `accumulator(shift_x, shift_y)`: a
    fresh accumulator of a pair of sides (`shift_y` None: a side's self pair), fed each chunk less
    its side's shift as `add(X, Y=rows, shifted=True)` (a self pair: `add(X, shifted=True)`);
    `finish(xy, xx, yy)`: the `measures` of a pair from the results of its merged accumulator and of
    both sides' self pairs; `state_bytes(dim_x, dim_y)`: one accumulator's size (a task holds pairs
    whose states fit the plan's budget)."""

    name: str
    measures: tuple[str, ...]
    accumulator: Callable[[np.ndarray, np.ndarray | None], Any]
    finish: Callable[[Any, Any, Any], dict[str, float]]
    state_bytes: Callable[[int, int], int]


PAIR_STATISTICS: list[PairStatistic] = []


def _cross_moments(shift_x: np.ndarray, shift_y: np.ndarray | None) -> CrossMoments:
    return CrossMoments(paired=False, shift_x=shift_x) if shift_y is None else CrossMoments(shift_x=shift_x, shift_y=shift_y)


def _cross_moments_bytes(dim_x: int, dim_y: int) -> int:
    return 8 * dim_x * dim_y  # X^T Y in float64; the sums are vectors


PAIR_STATISTICS.append(PairStatistic(
    "cross_moments", STREAMED_MEASURES, _cross_moments, streamed_measures, _cross_moments_bytes,
))


# geometry (geometry.json, `lmgeom.stages.geometry`): a seeded row sample for the intrinsic dimension,
# per-dimension magnitudes of the selected rows, the largest |h| over every stored row (massive
# activations sit on special tokens and first positions), sentence means for uniformity and
# alignment; then, from the first stage's moments, the cosines without the outlier dimensions and
# standardised


def _geometry_sample_accumulator(arrays: PlanArrays, words: np.ndarray | None) -> RowSampleAccumulator:
    return RowSampleAccumulator(arrays.sample(arrays.options.geometry_rows))


def _magnitude_accumulator(arrays: PlanArrays, words: np.ndarray | None) -> MagnitudeAccumulator:
    return MagnitudeAccumulator(arrays.options.top_activations)


def _sentence_mean_accumulator(arrays: PlanArrays, words: np.ndarray | None) -> WordMeanAccumulator:
    return WordMeanAccumulator(int(arrays.selection.sentence_ids.max(initial=-1)) + 1)


def _sentence_mean_values(acc: WordMeanAccumulator, arrays: PlanArrays, words: np.ndarray | None) -> LayerValues:
    return {"sentence_means": acc.result(), "sentence_rows": acc.counts}


def sentence_word_labels(arrays: PlanArrays) -> dict[str, np.ndarray]:
    """`rows` labels: each row's sentence, as the `word_ids` of a per-key accumulator."""
    return {"word_ids": arrays.selection.sentence_ids}


STATISTICS.append(Statistic(
    "geometry_sample", ROWS, _geometry_sample_accumulator, partial(result_as, "geometry_sample"),
    description="a seeded sample of selected rows (intrinsic dimension)", labels=row_number_labels,
))
STATISTICS.append(Statistic(
    "magnitudes", ROWS, _magnitude_accumulator, partial(result_as, "magnitudes"),
    description="per-dimension mean, std and mean |h| of the selected rows", labels=row_number_labels,
))
STATISTICS.append(Statistic(
    "top_activations", ROWS, _magnitude_accumulator, partial(result_as, "top_activations"),
    description="the largest |h| over every stored row, located", labels=row_number_labels, every_row=True,
))
STATISTICS.append(Statistic(
    "sentence_means", ROWS, _sentence_mean_accumulator, _sentence_mean_values,
    description="each sentence's mean selected row", labels=sentence_word_labels,
))


def _transformed_keywords(variant: str, dim: int, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The transform of `variant` from a layer's first-stage `inputs` (`kept` dimensions, `mean`, `std`)."""
    if variant == "without_outlier_dimensions":
        return {"dim": dim, "kept": inputs["kept"]}
    return standardizing(dim, inputs["mean"], inputs["std"])


def _transformed_self_similarity(variant: str, arrays: PlanArrays, words: np.ndarray | None,
                                 inputs: Mapping[str, Any]) -> TransformedAccumulator:
    assert words is not None
    return TransformedAccumulator(SelfSimilarityAccumulator(len(words)), **_transformed_keywords(variant, arrays.dim, inputs))


def _transformed_intra(variant: str, arrays: PlanArrays, words: np.ndarray | None, inputs: Mapping[str, Any]) -> TransformedAccumulator:
    return TransformedAccumulator(IntraSentenceAccumulator(), **_transformed_keywords(variant, arrays.dim, inputs))


TRANSFORMED_VARIANTS = ("without_outlier_dimensions", "standardized")
for _variant in TRANSFORMED_VARIANTS:
    STATISTICS.append(Statistic(
        f"self_similarity_{_variant}", WORD_GROUPS, partial(_transformed_self_similarity, _variant),
        partial(result_as, f"self_similarity_{_variant}"), description=f"self-similarity, {_variant.replace('_', ' ')}",
        min_contexts=2, takes_inputs=True,
    ))
    STATISTICS.append(Statistic(
        f"intra_{_variant}", ROWS, partial(_transformed_intra, _variant), partial(result_as, f"intra_{_variant}"),
        description=f"intra-sentence similarity, {_variant.replace('_', ' ')}", labels=sentence_labels, takes_inputs=True,
    ))
