"""The findings of a contextuality analysis (Ethayarajh 2019's claims, tested on the numbers) and
their sentences, as contextuality.json records them."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from lmgeom.metrics.spectrum import MEV_VARIANTS

ANISOTROPY_THRESHOLD = 0.05  # a layer is called anisotropic when its exact baseline exceeds this
STATIC_VARIANCE_THRESHOLD = 0.05  # the paper: a static embedding explains < 5% of the variance
N_LEAST_SELF_SIMILAR = 10




def depth_trend(layers: list[int], values: list[float]) -> dict[str, Any]:
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


def findings(summary: pd.DataFrame, words: pd.DataFrame, *, variants: Sequence[str] = MEV_VARIANTS) -> tuple[dict[str, Any], list[str]]:
    """The findings of a contextuality analysis (its `summary` and per-word values) and their sentences."""
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

    trends = {kind: depth_trend(layers, upper[column].tolist())
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
    for variant in variants:
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
