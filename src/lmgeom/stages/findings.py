"""The findings of a contextuality analysis (Ethayarajh 2019's claims, each a stated one-sided test
on the numbers) and their sentences, as contextuality.json records them.

Each finding is a record with the claim, its statistic, the test, the direction tested, `p_value`,
`p_min` (the smallest p-value the test can give on this run), `p_holm` and the `verdict`:

- a trend over layers (mean self-similarity falls with depth, raw and adjusted): Spearman's rho of
  the value against the layer, one-sided (rho < 0), by an exact permutation test over the n!
  orderings of the values for n <= `EXACT_MAX_LAYERS` non-input layers, else a seeded Monte Carlo
  permutation test of `MONTE_CARLO_PERMUTATIONS` random orderings;
- stopwords among the least self-similar words: the number of stopwords among the
  `N_LEAST_SELF_SIMILAR` words of lowest self-similarity at the last layer, one-sided (more than
  chance), by the exact permutation test of the stopword labels over the analysed words (the
  hypergeometric law);
- a level at every non-input layer (every layer anisotropic; a static embedding explains < 5 % of a
  word's variance): the bootstrap interval of each layer (contextuality.json's `raw_lo`/`raw_hi`,
  `adjusted_lo`/`adjusted_hi`) entirely on the claimed side of the threshold. The interval's outer
  end is a one-sided bound at level (1 - confidence) / 2, and the claim needs every layer to pass
  (an intersection-union test), so it holds at that level; no p-value, outside the Holm family.

Verdicts: "yes" when the Holm-adjusted p-value (Holm across the p-valued findings of one run) is
below `ALPHA`, or, for a level, when every interval is on the claimed side; "no" when tested and not
shown; "not testable" when no outcome of the test could reach `ALPHA` (e.g. 3 layers: the smallest
one-sided exact p is 1/3! = 0.167), or without the numbers the test needs (no bootstrap, undefined
values). A finding whose smallest attainable p exceeds `ALPHA` is not in the Holm family.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Sequence

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike
from scipy.stats import hypergeom, rankdata

from lmgeom.metrics.spectrum import MEV_VARIANTS

ALPHA = 0.05  # a finding is "yes" at a Holm-adjusted p below this
ANISOTROPY_THRESHOLD = 0.05  # a layer is called anisotropic when its exact baseline exceeds this
STATIC_VARIANCE_THRESHOLD = 0.05  # the paper: a static embedding explains < 5% of the variance
N_LEAST_SELF_SIMILAR = 10
EXACT_MAX_LAYERS = 8  # up to 8! = 40,320 orderings, enumerated
MONTE_CARLO_PERMUTATIONS = 100_000  # random orderings above EXACT_MAX_LAYERS
_CHUNK = 10_000

YES, NO, NOT_TESTABLE = "yes", "no", "not testable"
NO_INTERVALS = "no bootstrap intervals in this analysis"


@lru_cache(maxsize=EXACT_MAX_LAYERS)
def _orderings(n: int) -> np.ndarray:
    """Every ordering of range(n), one per row (n! x n)."""
    return np.array(list(itertools.permutations(range(n))), dtype=np.intp).reshape(-1, n)


def spearman_permutation_test(x: ArrayLike, y: ArrayLike, *, decreasing: bool = True, seed: int = 0,
                              n_resamples: int = MONTE_CARLO_PERMUTATIONS) -> dict[str, Any]:
    """Spearman's rho of `y` against `x` (average ranks for ties) and its one-sided permutation
    p-value in the claimed direction (`decreasing`: rho < 0, else rho > 0): the share of the orderings
    of `y` whose rho is at least as far that way as the observed one. Exact over all n! orderings for
    n <= `EXACT_MAX_LAYERS` (`p_min`: the share of orderings that reach the most extreme rho);
    otherwise `n_resamples` seeded random orderings, p = (1 + extreme) / (1 + n_resamples) (`p_min`
    = 1 / (1 + n_resamples)). Fewer than 2 points, or a constant side: rho is None, p and p_min 1."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"x and y must be 1-d of one length, not {a.shape} and {b.shape}")
    n = len(a)
    exact = n <= EXACT_MAX_LAYERS
    orderings = math.factorial(n) if exact else n_resamples
    result: dict[str, Any] = {"rho": None, "p_value": 1.0, "p_min": 1.0, "n_orderings": orderings, "exact": exact}
    if n < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return result
    # twice the average ranks are integers: the statistic sum(rx * ry) is exact, and under a
    # reordering of y (its ranks' mean and spread fixed) rho is increasing in it
    rx, ry = np.rint(2 * rankdata(a)).astype(np.int64), np.rint(2 * rankdata(b)).astype(np.int64)
    observed = int(rx @ ry)
    cx, cy = rx - rx.mean(), ry - ry.mean()
    result["rho"] = float(cx @ cy / math.sqrt(float(cx @ cx) * float(cy @ cy)))
    sign = -1 if decreasing else 1
    if exact:
        statistics = ry[_orderings(n)] @ rx
        extreme = int(np.count_nonzero(sign * statistics >= sign * observed))
        most = statistics.min() if decreasing else statistics.max()
        result["p_value"] = extreme / len(statistics)
        result["p_min"] = int(np.count_nonzero(statistics == most)) / len(statistics)
        return result
    rng = np.random.default_rng(seed)
    extreme = 0
    for start in range(0, n_resamples, _CHUNK):
        drawn = rng.permuted(np.tile(ry, (min(_CHUNK, n_resamples - start), 1)), axis=1)
        extreme += int(np.count_nonzero(sign * (drawn @ rx) >= sign * observed))
    result["p_value"] = (1 + extreme) / (1 + n_resamples)
    result["p_min"] = 1 / (1 + n_resamples)
    return result


def _test_record(claim: str, statistic: str, value: float | None, test: str, alternative: str, *,
                 p_value: float | None = None, p_min: float | None = None, verdict: str | None = None,
                 reason: str | None = None) -> dict[str, Any]:
    """The fields every finding has (`verdict` None: decided by Holm once the run's p-values are known)."""
    return {"claim": claim, "statistic": statistic, "value": value, "test": test, "alternative": alternative,
            "p_value": p_value, "p_min": p_min, "p_holm": None, "verdict": verdict, "reason": reason}


def depth_trend(layers: list[int], values: list[float], *, seed: int = 0, what: str = "mean self-similarity") -> dict[str, Any]:
    """The claim that `values` fall with depth over `layers`: Spearman's rho and its one-sided permutation test."""
    n = len(layers)
    over = f"layers {layers[0]}-{layers[-1]}" if n > 1 else f"layer {layers[0]}" if n else "no layers"
    claim = f"{what} falls with depth over {over}"
    test = (f"exact permutation test of Spearman's rho over the {math.factorial(n):,} orderings of {n} layers"
            if n <= EXACT_MAX_LAYERS else
            f"Monte Carlo permutation test of Spearman's rho, {MONTE_CARLO_PERMUTATIONS:,} random orderings (seed {seed})")
    alternative = "rho < 0"
    undefined = [layer for layer, value in zip(layers, values) if np.isnan(value)]
    if undefined:
        return {**_test_record(claim, "spearman_rho", None, test, alternative, verdict=NOT_TESTABLE,
                               reason=f"undefined at layers {undefined}"),
                "spearman_rho": None, "monotone_decreasing": None}
    array = np.asarray(values, dtype=np.float64)
    if n and np.ptp(array) <= 1e-12 * np.max(np.abs(array)):  # equal to float64 rounding: ranks would be rounding noise
        return {**_test_record(claim, "spearman_rho", None, test, alternative, p_value=1.0, p_min=1.0, verdict=NOT_TESTABLE,
                               reason="the same value at every non-input layer"),
                "spearman_rho": None, "monotone_decreasing": False}
    outcome = spearman_permutation_test(layers, array, decreasing=True, seed=seed)
    record = {**_test_record(claim, "spearman_rho", outcome["rho"], test, alternative,
                             p_value=outcome["p_value"], p_min=outcome["p_min"]),
              "spearman_rho": outcome["rho"], "n_orderings": outcome["n_orderings"], "exact": outcome["exact"],
              "monotone_decreasing": bool(np.all(np.diff(array) < 0)) if n >= 2 else None}
    if outcome["p_min"] > ALPHA:
        record.update(verdict=NOT_TESTABLE, reason=f"with {n} layer{'s' if n != 1 else ''} the smallest attainable "
                                                   f"one-sided p is {outcome['p_min']:.3g} > {ALPHA}")
    return record


def _interval_test(confidence: float | None, resamples: int | None, side: str, threshold: float) -> str:
    level = f"{confidence:.0%}" if confidence is not None else "the"
    one_sided = f"{(1 - confidence) / 2:.3g}" if confidence is not None else "(1 - confidence) / 2"
    draws = f" (B = {resamples:,})" if resamples else ""
    return (f"each non-input layer's {level} percentile bootstrap interval{draws} {side} {threshold} (one-sided, level "
            f"{one_sided} per layer; every layer must pass: an intersection-union test)")


def _bounds(intervals: pd.DataFrame | None, column: str, layers: list[int]) -> pd.Series | None:
    """The interval bound `column` at `layers`, or None when the analysis has none (no bootstrap)."""
    if intervals is None or intervals.empty or column not in intervals:
        return None
    bounds = intervals.set_index("layer")[column].reindex(layers).astype(float)
    return None if bounds.isna().any() else bounds


def holm_verdicts(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Holm's correction across the records still without a verdict (those with a p-value whose
    smallest attainable value is at most `ALPHA`): their `p_holm` and verdicts; returns that family."""
    from lmgeom.evaluate.stats import holm  # imported here: lmgeom.evaluate imports gensim's models

    family = [r for r in records if r["verdict"] is None and r["p_value"] is not None]
    for record, adjusted in zip(family, holm([r["p_value"] for r in family])):
        record["p_holm"] = float(adjusted)
        record["verdict"] = YES if adjusted < ALPHA else NO
    return family


def _stopwords() -> frozenset[str]:
    # imported here: importing gensim takes about a second, which every layer worker would pay for nothing
    from gensim.parsing.preprocessing import STOPWORDS

    return STOPWORDS


@dataclass(frozen=True)
class StopwordCounts:
    """What the stopword finding needs of the per-word values at its `layer`: the least self-similar
    `words` (lowest first) with their `self_similarity`, and among the `n_words` analysed words with a
    self-similarity there, `n_stop` stopwords."""

    layer: int
    words: list[str]
    self_similarity: list[float]
    n_words: int
    n_stop: int

    @classmethod
    def of(cls, words: pd.DataFrame, layer: int) -> StopwordCounts:
        at_layer = words.loc[(words["layer"] == layer) & words["self_similarity"].notna()]
        least = at_layer.nsmallest(N_LEAST_SELF_SIMILAR, "self_similarity")
        return cls(layer, least["word"].tolist(), least["self_similarity"].tolist(), len(at_layer),
                   int(at_layer["word"].str.lower().isin(_stopwords()).sum()))


def findings(summary: pd.DataFrame, words: pd.DataFrame, *, variants: Sequence[str] = MEV_VARIANTS,
             intervals: pd.DataFrame | None = None, confidence: float | None = None, resamples: int | None = None,
             seed: int = 0) -> tuple[dict[str, Any], list[str]]:
    """The findings of a contextuality analysis (its `summary`, per-word values and, with a bootstrap,
    `intervals` at `confidence` from `resamples` draws) and their sentences (`statements`)."""
    upper = summary.loc[summary["layer"] >= 1]
    if upper.empty:
        note = "this store has only layer 0 (the embedding output): no findings about contextual layers"
        return {"note": note}, [note]
    return tested_findings(summary, StopwordCounts.of(words, int(upper["layer"].max())), variants=variants,
                           intervals=intervals, confidence=confidence, resamples=resamples, seed=seed)


def tested_findings(summary: pd.DataFrame, stopwords_at_last: StopwordCounts, *, variants: Sequence[str] = MEV_VARIANTS,
                    intervals: pd.DataFrame | None = None, confidence: float | None = None, resamples: int | None = None,
                    seed: int = 0) -> tuple[dict[str, Any], list[str]]:
    """`findings` from the per-word values' `StopwordCounts` at the last layer instead of the values."""
    STOPWORDS = _stopwords()
    upper = summary.loc[summary["layer"] >= 1]
    layers = upper["layer"].tolist()
    by_layer = upper.set_index("layer")
    result: dict[str, Any] = {}

    baseline = by_layer["anisotropy_exact"]
    lower = _bounds(intervals, "anisotropy_exact_lo", layers)
    anisotropy = _test_record(f"every non-input layer anisotropic (exact baseline > {ANISOTROPY_THRESHOLD})",
                              "lowest lower interval bound of the exact baseline",
                              None if lower is None else float(lower.min()), _interval_test(confidence, resamples, "above", ANISOTROPY_THRESHOLD),
                              f"baseline > {ANISOTROPY_THRESHOLD} at every non-input layer")
    if lower is None:
        anisotropy.update(verdict=NOT_TESTABLE, reason=NO_INTERVALS)
    else:
        anisotropy["verdict"] = YES if bool((lower > ANISOTROPY_THRESHOLD).all()) else NO
    result["anisotropy"] = {
        **anisotropy, "threshold": ANISOTROPY_THRESHOLD, "confidence": confidence,
        "min_baseline": float(baseline.min()), "min_baseline_layer": int(baseline.idxmin()),
        "max_baseline": float(baseline.max()), "max_baseline_layer": int(baseline.idxmax()),
        "min_lower_bound_layer": None if lower is None else int(lower.idxmin()),
    }

    result["self_similarity_depth"] = {"layers": layers, **{
        kind: depth_trend(layers, upper[column].tolist(), seed=seed, what=f"mean self-similarity ({kind})")
        for kind, column in (("raw", "self_similarity"), ("adjusted", "self_similarity_adjusted"))}}

    last = stopwords_at_last.layer
    is_stop = np.array([word.lower() in STOPWORDS for word in stopwords_at_last.words], dtype=bool)
    n_words, n_stop = stopwords_at_last.n_words, stopwords_at_last.n_stop
    n_least, stop_least = len(is_stop), int(is_stop.sum())
    stopwords = _test_record(
        f"stopwords over-represented among the {n_least or N_LEAST_SELF_SIMILAR} least self-similar words at layer {last}",
        f"stopwords among the {n_least} least self-similar words", stop_least,
        "hypergeometric test (exact: the stopword labels permuted over the analysed words)",
        "more stopwords than chance",
        p_value=float(hypergeom.sf(stop_least - 1, n_words, n_stop, n_least)) if n_words else None,
        p_min=float(hypergeom.sf(min(n_least, n_stop) - 1, n_words, n_stop, n_least)) if n_words else None)
    if stopwords["p_min"] is None or stopwords["p_min"] > ALPHA:
        stopwords.update(verdict=NOT_TESTABLE, reason=(
            f"{n_words} analysed word{'s' if n_words != 1 else ''} at layer {last}, {n_stop} of them stopwords: "
            f"the smallest attainable p is {stopwords['p_min'] if stopwords['p_min'] is not None else 1:.3g} > {ALPHA}"))
    result["least_self_similar"] = {
        **stopwords,
        "layer": last,
        "words": list(stopwords_at_last.words),
        "self_similarity": list(stopwords_at_last.self_similarity),
        "stopword_share": float(is_stop.mean()) if n_least else None,
        "stopword_share_among_all_analysed_words": n_stop / n_words if n_words else None,
        "n_analysed_words": n_words, "n_analysed_stopwords": n_stop,
        "stopword_list": f"gensim.parsing.preprocessing.STOPWORDS ({len(STOPWORDS)} words, lowercase match)",
    }

    result["static_embedding_variance"] = {}
    for variant in variants:
        adjusted = by_layer[f"mev_{variant}_adjusted"]
        # undefined where no analysed word's occurrences vary (centred variants) or the sampled ones do not
        undefined = adjusted.index[adjusted.isna()].tolist()
        defined = adjusted.dropna()
        upper_bound = _bounds(intervals, f"mev_{variant}_adjusted_hi", defined.index.tolist()) if defined.size else None
        raw_max = upper[f"mev_{variant}"].max()
        record = _test_record(
            f"a static embedding explains < {STATIC_VARIANCE_THRESHOLD:.0%} of a word's variance after adjustment "
            f"(MEV {variant}) in every non-input layer", "highest upper interval bound of the mean adjusted MEV",
            None if upper_bound is None else float(upper_bound.max()), _interval_test(confidence, resamples, "below", STATIC_VARIANCE_THRESHOLD),
            f"adjusted MEV < {STATIC_VARIANCE_THRESHOLD} at every non-input layer")
        if not defined.size:
            cause = ("every occurrence of each analysed word is the same vector" if np.isnan(raw_max)
                     else "the sampled occurrences do not vary")
            record.update(verdict=NOT_TESTABLE, reason=f"MEV {variant} is undefined at every non-input layer: {cause}")
        elif upper_bound is None:
            record.update(verdict=NOT_TESTABLE, reason=NO_INTERVALS)
        else:
            record["verdict"] = YES if bool((upper_bound < STATIC_VARIANCE_THRESHOLD).all()) else NO
        result["static_embedding_variance"][variant] = {
            **record, "threshold": STATIC_VARIANCE_THRESHOLD, "confidence": confidence,
            "max_adjusted_mev": float(defined.max()) if defined.size else None,
            "max_adjusted_mev_layer": int(defined.idxmax()) if defined.size else None,
            "max_upper_bound_layer": None if upper_bound is None else int(upper_bound.idxmax()),
            "max_raw_mev": None if np.isnan(raw_max) else float(raw_max),
            "undefined_layers": undefined,
        }

    family = holm_verdicts(finding_records(result))
    result["alpha"] = ALPHA
    result["multiple_testing"] = {"method": "holm", "family": [record["claim"] for record in family]}
    return result, statements(result)


def finding_records(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The findings of a `findings` document, in the order of its sentences."""
    records = [document[key] for key in ("anisotropy",) if key in document]
    depth = document.get("self_similarity_depth", {})
    records += [depth[kind] for kind in ("raw", "adjusted") if kind in depth]
    records += [document[key] for key in ("least_self_similar",) if key in document]
    records += list(document.get("static_embedding_variance", {}).values())
    return records


def _p(value: float) -> str:
    return f"{value:.2g}"


def statement(record: dict[str, Any]) -> str:
    """One finding as a sentence: the claim, its verdict (and why, when not testable), the statistic,
    the one-sided test, p and Holm's p."""
    parts: list[str] = []
    tested = f"one-sided ({record['alternative']}) {record['test']}"
    if "spearman_rho" in record:
        if record["value"] is not None:
            parts += [f"Spearman rho {record['value']:+.2f}", f"{tested}: p {_p(record['p_value'])}"
                      + (f", smallest attainable {_p(record['p_min'])}" if record["verdict"] != NOT_TESTABLE else "")]
    elif "stopword_share" in record:
        if record["n_analysed_words"]:
            parts += [f"{', '.join(record['words'])}: {record['value']} of {len(record['words'])} stopwords, against "
                      f"{record['stopword_share_among_all_analysed_words']:.0%} of the {record['n_analysed_words']:,} "
                      "analysed words", f"{tested}: p {_p(record['p_value'])}"]
    elif "min_baseline" in record:
        parts.append(f"baseline {record['min_baseline']:.3f} at layer {record['min_baseline_layer']} to "
                     f"{record['max_baseline']:.3f} at layer {record['max_baseline_layer']}")
        if record["value"] is not None:
            parts += [f"lowest lower bound {record['value']:.3f}, layer {record['min_lower_bound_layer']}", f"test: {record['test']}"]
    elif record["max_adjusted_mev"] is not None:
        parts.append(f"mean adjusted MEV at most {record['max_adjusted_mev']:.3f}, layer {record['max_adjusted_mev_layer']}"
                     + (f"; undefined at layers {record['undefined_layers']}" if record["undefined_layers"] else ""))
        if record["value"] is not None:
            parts += [f"highest upper bound {record['value']:.3f}, layer {record['max_upper_bound_layer']}", f"test: {record['test']}"]
    if record["p_holm"] is not None:
        parts.append(f"Holm p {_p(record['p_holm'])}")
    if record.get("monotone_decreasing") is not None:
        parts.append("strictly decreasing: " + ("yes" if record["monotone_decreasing"] else "no"))
    head = f"{record['claim'][0].upper()}{record['claim'][1:]}: {record['verdict']}"
    if record["verdict"] == NOT_TESTABLE and record["reason"]:
        head += f", {record['reason']}"
    return f"{head} ({'; '.join(parts)})" if parts else head


def statements(document: dict[str, Any]) -> list[str]:
    """The sentences of a `findings` document: one per finding, then how the verdicts were reached."""
    if "note" in document:
        return [document["note"]]
    family = document["multiple_testing"]["family"]
    alpha = document["alpha"]
    holm = (f"Holm's p (across the {len(family)} finding{'s' if len(family) != 1 else ''} of this run whose p can reach "
            f"{alpha}) is below {alpha}" if family else f"Holm's p is below {alpha} (no p of this run can reach {alpha})")
    rule = (f"Verdicts: yes when {holm}, or for a level when every layer's bootstrap interval lies on the claimed side; "
            f"no: tested, not shown; not testable: no outcome of the test could reach {alpha}, or the numbers it needs "
            "are missing")
    return [statement(record) for record in finding_records(document)] + [rule]
