"""Confidence intervals on every per-layer contextuality number: a seeded percentile bootstrap from
summaries collected in the analysis's one read of each layer (`lmgeom.metrics.bootstrap`).

Units resampled:
- sentences, for the cosine measures (anisotropy_exact, self_similarity, intra_sentence_similarity,
  and their adjusted values: the baseline is recomputed on the same resample). The read keeps each
  sentence's sum of unit vectors, and each analysed word's per-sentence sums (`UnitSumsAccumulator`,
  the "bootstrap" statistic); IntraSim is a per-sentence value already. When those sums would take
  more than `STATE_MB` (or there are more than `MAX_UNITS` sentences), the unit is a block of
  consecutive sentences, the fewest per block that fit (at least `MIN_UNITS` blocks);
- words, for MEV (each variant; the per-word values exist);
- the sampled occurrences, for the sampled baselines (anisotropy_sampled and the MEV baselines that
  MEV is adjusted by; the "bootstrap_sample" statistic keeps its own copy of the sample). Each MEV
  baseline replicate needs the top eigenvalue of a resampled scatter (`resampled_mev`), which costs the
  same whatever the corpus size; the baselines are resampled for the first `MEV_BASELINE_RESAMPLES`
  resamples only, and adjusted replicate b subtracts baseline replicate b mod `MEV_BASELINE_RESAMPLES`
  (the words and the sampled occurrences are independent draws, so this pairs a word resample with a
  baseline resample as the full bootstrap does, from fewer distinct baseline resamples).
The draws (`lmgeom.metrics.bootstrap.draws`) follow from the options' seed alone and are the same at
every layer, so adjacent layers are compared by a paired bootstrap of their difference.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from lmgeom.metrics.bootstrap import (
    INTERVAL,
    draws,
    pair_mean,
    paired_test,
    percentile_interval,
    resampled_mev,
    self_similarity_replicates,
    unit_totals,
    weighted_means,
)
from lmgeom.metrics.contextuality import RowSampleAccumulator, UnitSumsAccumulator, row_norms
from lmgeom.engine.options import AnalysisOptions
from lmgeom.engine.statistics import ROWS, LayerValues, Statistic
from lmgeom.engine.statistics import STATISTICS as DECLARED

if TYPE_CHECKING:
    from lmgeom.engine.arrays import PlanArrays

STATE_MB = 256  # the most memory the per-(word, unit) sums of one layer take
MAX_UNITS = 8192  # the most resampling units (the draws take B x units int32)
MIN_UNITS = 100
MEV_BASELINE_RESAMPLES = 200  # the distinct resamples of the MEV baselines (module docstring)
DUPLICATE_RULE = ("a unit drawn k times counts k times, and every pair of two distinct original occurrences counts "
                  "m_a m_b times (m: their units' multiplicities); an occurrence is never paired with its own copy, so "
                  "no pair of cosine 1 is added that the data do not have")
# the unit each cosine record's bootstrap resamples, as its measure declares it (MEV: `resampled_unit`)
UNITS = {measure.name: measure.resampled for stat in DECLARED for measure in stat.measures
         if measure.resampled and not measure.name.startswith("mev_")}


def bootstrap_statistics(options: AnalysisOptions) -> tuple[str, ...]:
    """The bootstrap statistics a plan of `options` adds: with `bootstrap` > 0, the unit sums where
    the cosine baselines are computed and the resampled sample where the sampled ones are."""
    if not options.bootstrap:
        return ()
    return (("bootstrap",) if "baseline" in options.statistics else ()) + (("bootstrap_sample",) if "sample" in options.statistics else ())


@dataclass
class BootstrapDesign:
    """The resampling units of a plan (`unit_of_row`: each store row's unit) and the seeded draws."""

    options: AnalysisOptions
    unit_of_row: np.ndarray
    sentences: np.ndarray  # the sentences with selected rows, ascending
    n_units: int
    sentences_per_unit: int
    n_words: int
    n_sampled: int

    def unit_of(self, sentence_ids: np.ndarray) -> np.ndarray:
        """The unit of each of `sentence_ids` (sentences with selected rows)."""
        return np.searchsorted(self.sentences, sentence_ids) // self.sentences_per_unit

    @cached_property
    def unit_draws(self) -> np.ndarray:
        return draws(self.n_units, self.options.bootstrap, self.options.seed, "sentences")

    @cached_property
    def word_draws(self) -> np.ndarray:
        return draws(self.n_words, self.options.bootstrap, self.options.seed, "words")

    @cached_property
    def sample_draws(self) -> np.ndarray:
        return draws(self.n_sampled, self.options.bootstrap, self.options.seed, "sampled occurrences")

    def to_json(self) -> dict[str, Any]:
        return {"B": self.options.bootstrap, "level": self.options.confidence, "interval": INTERVAL, "seed": self.options.seed,
                "units": {"sentences": self.n_units, "words": self.n_words, "sampled occurrences": self.n_sampled},
                "sentences_per_unit": self.sentences_per_unit, "duplicate_rule": DUPLICATE_RULE,
                "mev_baseline_resamples": min(self.options.bootstrap, MEV_BASELINE_RESAMPLES),
                "state_cap_mb": STATE_MB, "max_units": MAX_UNITS}


def bootstrap_design(arrays: PlanArrays) -> BootstrapDesign:
    """The units of `rows`: sentences with selected rows, in blocks of consecutive sentences when their
    sums would not fit `STATE_MB` or `MAX_UNITS` (module docstring)."""
    options = arrays.options
    mask = arrays.selection.mask
    sentences = arrays.selection.sentence_ids
    distinct, index = np.unique(sentences[mask], return_inverse=True)
    words = arrays.words.word_index[mask] if "self_similarity" in options.statistics else np.full(int(mask.sum()), -1)
    per_unit = 1
    while True:
        n_units = -(-len(distinct) // per_unit)
        units = index // per_unit
        pairs = len(np.unique(words[words >= 0] * max(n_units, 1) + units[words >= 0]))
        fits = (pairs + n_units) * arrays.dim * 8 <= STATE_MB * 2**20 and n_units <= MAX_UNITS
        if fits or n_units <= MIN_UNITS:
            break
        per_unit *= 2
    unit_of_row = np.zeros(len(mask), dtype=np.int64)
    unit_of_row[mask] = units
    n_words = len(arrays.words) if "mev" in options.statistics else 0
    return BootstrapDesign(options, unit_of_row, distinct, n_units,
                           per_unit, n_words, len(arrays.sample(options.n_samples)) if "sample" in options.statistics else 0)


def design_of(arrays: PlanArrays) -> BootstrapDesign:
    """The bootstrap design of `rows`, made once and kept with them (every task of a worker shares it)."""
    return arrays.derived("bootstrap", bootstrap_design)


# ---------------------------------------------------------------------------------------------
# the statistics: what the one read keeps for the bootstrap, and each layer's replicates


def _unit_labels(arrays: PlanArrays) -> dict[str, np.ndarray]:
    words = arrays.words.word_index if "self_similarity" in arrays.options.statistics else np.full(len(arrays.selection.mask), -1)
    return {"unit_ids": design_of(arrays).unit_of_row, "word_ids": words}


def _unit_accumulator(arrays: PlanArrays, words: np.ndarray | None) -> UnitSumsAccumulator:
    return UnitSumsAccumulator(design_of(arrays).n_units)


def _unit_replicates(acc: UnitSumsAccumulator, arrays: PlanArrays, words: np.ndarray | None) -> LayerValues:
    """The anisotropy baseline's and SelfSim's replicates (B each): SelfSim's is the mean over the
    words defined in the resample (two distinct occurrences drawn)."""
    design = design_of(arrays)
    m = design.unit_draws
    summaries = acc.result()
    keys, sums, counts = summaries["unit"]
    replicates = {"anisotropy_exact": pair_mean(m[:, keys], sums, counts)}
    if "self_similarity" in arrays.options.statistics:
        replicates["self_similarity"] = self_similarity_replicates(m, *summaries["pair"], design.n_units)
    return {"bootstrap_replicates": replicates}


# the statistics this module declares (`lmgeom.engine.registry` gathers them)
STATISTICS: list[Statistic] = []


STATISTICS.append(Statistic(
    "bootstrap", ROWS, _unit_accumulator, _unit_replicates,
    description="the sentence bootstrap of the cosine measures", labels=_unit_labels,
))


def _sample_accumulator(arrays: PlanArrays, words: np.ndarray | None) -> RowSampleAccumulator:
    return RowSampleAccumulator(arrays.sample(arrays.options.n_samples))


def _sample_labels(arrays: PlanArrays) -> dict[str, np.ndarray]:
    return {"rows": arrays.row_numbers}


def _sample_replicates(acc: RowSampleAccumulator, arrays: PlanArrays, words: np.ndarray | None) -> LayerValues:
    """The sampled baselines' replicates: the sampled occurrences resampled (a row that is a zero
    vector at this layer is left out, its draws with it)."""
    sample = acc.result()
    nonzero = row_norms(sample) > 0
    sample = sample[nonzero]
    m = design_of(arrays).sample_draws[:, nonzero]
    units = sample / row_norms(sample)[:, None]
    return {"bootstrap_sample_replicates": {
        "anisotropy_sampled": pair_mean(m, units, np.ones(len(units))),
        "mev_baseline": resampled_mev(sample, m[:MEV_BASELINE_RESAMPLES], arrays.options.mev_variants),
    }}


STATISTICS.append(Statistic(
    "bootstrap_sample", ROWS, _sample_accumulator, _sample_replicates,
    description="the bootstrap of the sampled baselines", labels=_sample_labels,
))


# ---------------------------------------------------------------------------------------------
# intervals and the adjacent-layer tests


def layer_replicates(values: LayerValues, arrays: PlanArrays) -> dict[str, dict[str, np.ndarray]]:
    """Each record metric's replicates of its raw value and, where it has a baseline, of its adjusted
    value (the baseline's replicates from the same resample, or for MEV from the resampled sample)."""
    design = design_of(arrays)
    cosine = values.get("bootstrap_replicates", {})
    sampled = values.get("bootstrap_sample_replicates", {})
    out: dict[str, dict[str, np.ndarray]] = {}
    for metric in ("anisotropy_exact", "self_similarity"):
        if metric in cosine:
            out[metric] = {"raw": cosine[metric]}
    if "intra" in values and "anisotropy_exact" in cosine:
        intra = values["intra"]
        units = design.unit_of(intra.index.to_numpy())
        totals, counts = unit_totals(intra.to_numpy(dtype=np.float64), units, design.n_units)
        out["intra_sentence_similarity"] = {"raw": weighted_means(design.unit_draws, totals, counts)}
    for metric in ("self_similarity", "intra_sentence_similarity"):
        if metric in out:
            out[metric]["adjusted"] = out[metric]["raw"] - cosine["anisotropy_exact"]
    if "anisotropy_sampled" in sampled:
        out["anisotropy_sampled"] = {"raw": sampled["anisotropy_sampled"]}
    for variant, baseline in sampled.get("mev_baseline", {}).items():
        word_values = values.get(f"mev_{variant}")
        if word_values is None:
            continue
        word_values = np.asarray(word_values, dtype=np.float64)
        defined = ~np.isnan(word_values)
        raw = weighted_means(design.word_draws, np.where(defined, word_values, 0.0), defined.astype(np.float64))
        out[f"mev_{variant}"] = {"raw": raw, "adjusted": raw - baseline[np.arange(len(raw)) % len(baseline)]}
    return out


def resampled_unit(metric: str) -> str:
    return "words (MEV); baseline: sampled occurrences" if metric.startswith("mev_") else UNITS[metric]


def add_intervals(records: list[dict[str, Any]], replicates: dict[int, dict[str, dict[str, np.ndarray]]],
                  level: float) -> None:
    """`raw_lo`, `raw_hi`, `adjusted_lo`, `adjusted_hi` and `resampled` on each record (layer, metric)
    that has replicates (NaN for an adjusted value without a baseline)."""
    for record in records:
        reps = replicates.get(record["layer"], {}).get(record["metric"])
        if reps is None:
            continue
        for kind in ("raw", "adjusted"):
            lo, hi = percentile_interval(reps[kind], level) if kind in reps else (float("nan"), float("nan"))
            record[f"{kind}_lo"], record[f"{kind}_hi"] = lo, hi
        record["resampled"] = resampled_unit(record["metric"])


def adjacent_layer_tests(records: list[dict[str, Any]], replicates: dict[int, dict[str, dict[str, np.ndarray]]],
                         level: float) -> list[dict[str, Any]]:
    """For each metric and value (raw, adjusted), layer l against the analysed layer before it: the
    difference, its paired percentile interval and two-sided p-value (the same resamples at both)."""
    by_key = {(r["layer"], r["metric"]): r for r in records}
    layers = sorted({r["layer"] for r in records})
    tests = []
    for metric in dict.fromkeys(r["metric"] for r in records):
        for previous, layer in zip(layers[:-1], layers[1:]):
            now, before = replicates.get(layer, {}).get(metric), replicates.get(previous, {}).get(metric)
            if now is None or before is None:
                continue
            for kind in ("raw", "adjusted"):
                if kind in now and kind in before:
                    difference = float(by_key[(layer, metric)][kind] - by_key[(previous, metric)][kind])
                    tests.append({"metric": metric, "value": kind, "layer": layer, "previous_layer": previous,
                                  **paired_test(now[kind], before[kind], difference, level)})
    return tests
