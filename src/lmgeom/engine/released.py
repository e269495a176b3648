"""The sampled statistics of Ethayarajh (2019)'s released code (kawine/contextual, `analyze.py`), on
the engine beside lmgeom's exact ones: what `--protocol ethayarajh2019` adds to an analysis.

- `released_sample` (rows): `n_samples` sentences drawn with the options' seed (among the sentences
  with an analysed row), one random analysed word of each; the anisotropy baseline is the mean
  cosine of `n_samples` pairs of those word vectors drawn with replacement (a pair can be a vector
  with itself, as `random.choice` twice draws it); IntraSim is the mean over those sentences of the
  mean cosine between each analysed word and the sentence's mean vector; the MEV baseline is
  TruncatedSVD's explained-variance ratio of the sampled word vectors (`svd_ratio`). Its records
  also give the released MEV of every word: `mev_svd_ratio` of the `mev` statistic clipped at 1.
- `self_similarity_released` (word groups): per word, the mean cosine over at most `n_samples`
  ordered pairs of distinct occurrences drawn without replacement (`sampled_self_similarity`, seeded
  by the options' seed and the word's vocabulary id).
Values are rounded as the released files are: every per-word and per-sentence value and the
baselines to 3 decimals; a layer's value is the mean of the rounded per-word values (as the
released per-word files average).

`svd_ratio` (TruncatedSVD's `explained_variance_ratio_[0]`) is var(X v1) / total variance of X,
both centred, with v1 the first right singular vector of the *uncentred* X; the paper's printed
formula, sigma_1^2 / sum_i sigma_i^2 (`uncentred`), is ||X v1||^2 / ||X||_F^2, uncentred in both:
the ratio subtracts n (mu . v1)^2 from the numerator and n ||mu||^2 from the denominator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from lmgeom.metrics.contextuality import RowSampleAccumulator, WordRowsAccumulator, row_norms, sampled_self_similarity
from lmgeom.metrics.mev import occurrence_spectrum
from lmgeom.engine.statistics import (
    ROWS,
    WORD_GROUPS,
    LayerValues,
    Statistic,
    layer_record,
    mean_defined,
    per_word,
    row_number_labels,
)
from lmgeom.engine.selection import RowSelection

if TYPE_CHECKING:
    from lmgeom.engine.arrays import PlanArrays

DECIMALS = 3  # the released code rounds every value it writes to 3 decimals


def released_rows(selection: RowSelection, n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The released code's sample (seeded): the analysed rows of `n` sentences drawn without
    replacement (all when fewer), one random analysed row of each (`word_rows`, in sentence order),
    and `n` pairs of indexes into `word_rows` drawn with replacement. Returns (sentence rows
    ascending, word rows, pairs of shape (n, 2))."""
    rng = np.random.default_rng(seed)
    rows = selection.rows
    sentence_of_row = selection.sentence_ids[rows]
    sentences, first, counts = np.unique(sentence_of_row, return_index=True, return_counts=True)
    chosen = np.sort(rng.choice(len(sentences), size=min(n, len(sentences)), replace=False))
    word_rows = rows[first[chosen] + rng.integers(0, counts[chosen])]
    sentence_rows = rows[np.isin(sentence_of_row, sentences[chosen])]
    pairs = rng.integers(0, len(chosen), size=(n, 2))
    return sentence_rows, word_rows, pairs


def _sample(arrays: PlanArrays) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return released_rows(arrays.selection, arrays.options.n_samples, arrays.options.seed)


def _sample_accumulator(arrays: PlanArrays, words: np.ndarray | None) -> RowSampleAccumulator:
    return RowSampleAccumulator(_sample(arrays)[0])


def _units(X: np.ndarray) -> np.ndarray:
    norms = row_norms(X)
    return np.divide(X, norms[:, None], out=np.full_like(X, np.nan), where=norms[:, None] > 0)


def _sample_values(acc: RowSampleAccumulator, arrays: PlanArrays, words: np.ndarray | None) -> LayerValues:
    sentence_rows, word_rows, pairs = _sample(arrays)
    X = acc.result()  # the sampled sentences' rows, in row order = sentence_rows
    sentences = arrays.selection.sentence_ids[sentence_rows]
    units = _units(X)
    intra = []
    for sentence in np.unique(sentences):
        members = sentences == sentence
        centre = _units(X[members].mean(axis=0, keepdims=True))[0]
        cosines = units[members] @ centre
        if np.isfinite(cosines).any():
            intra.append(round(float(np.nanmean(cosines)), DECIMALS))
    words_X = X[np.searchsorted(sentence_rows, word_rows)]
    word_units = _units(words_X)
    cosines = np.einsum("ij,ij->i", word_units[pairs[:, 0]], word_units[pairs[:, 1]])
    nonzero = row_norms(words_X) > 0
    mev = occurrence_spectrum(words_X[nonzero]).mev("svd_ratio") if nonzero.any() else float("nan")
    return {"anisotropy_released": round(float(np.nanmean(cosines)), DECIMALS), "n_released_pairs": int(np.isfinite(cosines).sum()),
            "intra_released": round(float(np.mean(intra)), DECIMALS) if intra else float("nan"), "n_released_sentences": len(intra),
            "mev_baseline_released": min(1.0, round(mev, DECIMALS))}


def released_mev(values: np.ndarray) -> np.ndarray:
    """The released code's per-word MEV: `svd_ratio` rounded to 3 decimals, clipped at 1."""
    return np.minimum(1.0, np.round(values, DECIMALS))


def _sample_records(v: LayerValues) -> list[dict[str, Any]]:
    records = [layer_record("anisotropy_released", v["anisotropy_released"], v["n_released_pairs"]),
               layer_record("intra_sentence_similarity_released", v["intra_released"], v["n_released_sentences"],
                            baseline=v["anisotropy_released"], source="anisotropy_released")]
    if "mev_svd_ratio" in v:
        mev = released_mev(v["mev_svd_ratio"])
        records.append(layer_record("mev_svd_ratio_released", mean_defined(mev), int(np.count_nonzero(~np.isnan(mev))),
                                    baseline=v["mev_baseline_released"], source="mev_svd_ratio of the released sample's words"))
    return records


def _sample_columns(v: LayerValues) -> dict[str, np.ndarray]:
    return {"mev_svd_ratio_released": released_mev(v["mev_svd_ratio"])} if "mev_svd_ratio" in v else {}


# the statistics this module declares (`lmgeom.engine.registry` gathers them)
STATISTICS: list[Statistic] = []


STATISTICS.append(Statistic(
    "released_sample", ROWS, _sample_accumulator, _sample_values,
    description="the released code's sampled baselines and IntraSim", labels=row_number_labels,
    records=_sample_records, word_columns=_sample_columns,
    definitions={
        "anisotropy_released": "mean cosine of n pairs, drawn with replacement, of n word vectors: one random word of each of "
                               "n sampled sentences (the released code's baseline; rounded to 3 decimals)",
        "intra_sentence_similarity_released": "mean over the n sampled sentences of the mean cosine between each word and the "
                                              "sentence's mean vector (per sentence rounded to 3 decimals); baseline = "
                                              "anisotropy_released",
        "mev_svd_ratio_released": "mean over words of mev_svd_ratio rounded to 3 decimals and clipped at 1 (the released "
                                  "variance_explained.csv); baseline = svd_ratio of the n sampled word vectors",
    },
))


def _self_similarity_values(acc: WordRowsAccumulator, arrays: PlanArrays, words: np.ndarray | None) -> LayerValues:
    assert words is not None
    word_ids = arrays.words.words["word_id"].to_numpy()[words]
    n_pairs, seed = arrays.options.n_samples, arrays.options.seed
    values = np.array([sampled_self_similarity(X, n_pairs, np.random.default_rng([seed, int(word_id)]))
                       for X, word_id in zip(acc.result(), word_ids)])
    return {"self_similarity_released": np.round(values, DECIMALS)}


def _self_similarity_records(v: LayerValues) -> list[dict[str, Any]]:
    values = v["self_similarity_released"]
    return [layer_record("self_similarity_released", mean_defined(values), int(np.count_nonzero(~np.isnan(values))),
                         baseline=v["anisotropy_released"], source="anisotropy_released")]


def _self_similarity_columns(v: LayerValues) -> dict[str, np.ndarray]:
    return {"self_similarity_released": v["self_similarity_released"]}


STATISTICS.append(Statistic(
    "self_similarity_released", WORD_GROUPS, per_word(WordRowsAccumulator), _self_similarity_values,
    description="the released code's self-similarity needs two occurrences", stored_rows=True, spool=True,
    requires=("released_sample",), min_contexts=2, records=_self_similarity_records, word_columns=_self_similarity_columns,
    definitions={"self_similarity_released": "mean over words of the mean cosine over at most n sampled ordered pairs of a "
                                             "word's distinct occurrences (per word rounded to 3 decimals); baseline = "
                                             "anisotropy_released"},
))
