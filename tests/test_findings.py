"""The findings of a contextuality analysis as stated tests (lmgeom.stages.findings): the exact
permutation p of Spearman's rho against brute force, the smallest attainable p and the "not
testable" verdict, Holm's correction by hand, the interval tests of a level, and a real tiny run
whose findings, contextuality.json, terminal and report agree."""

from __future__ import annotations

import html
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from lmgeom.errors import InputError
from lmgeom.stages.findings import (
    ALPHA,
    EXACT_MAX_LAYERS,
    MONTE_CARLO_PERMUTATIONS,
    depth_trend,
    finding_records,
    findings,
    holm_verdicts,
    spearman_permutation_test,
    statement,
    statements,
)


def brute_force_p(x: list[float], y: list[float], *, decreasing: bool) -> tuple[float, float]:
    """The one-sided p and the smallest attainable p over every ordering of `y`, each ordering's rho
    from scipy's spearmanr (ties: average ranks)."""
    observed = stats.spearmanr(x, y).statistic
    rhos = np.array([stats.spearmanr(x, [y[i] for i in order]).statistic for order in itertools.permutations(range(len(y)))])
    if decreasing:
        return float(np.mean(rhos <= observed + 1e-12)), float(np.mean(rhos <= rhos.min() + 1e-12))
    return float(np.mean(rhos >= observed - 1e-12)), float(np.mean(rhos >= rhos.max() - 1e-12))


def brute_force_p_vectorised(x: list[float], y: list[float]) -> float:
    """The one-sided (rho < 0) p over every ordering of `y`, rho as the Pearson correlation of ranks."""
    orders = np.array(list(itertools.permutations(range(len(y)))))
    ranks_y = stats.rankdata(np.asarray(y, dtype=float)[orders], axis=1)
    ranks_x = stats.rankdata(x)
    cx, cy = ranks_x - ranks_x.mean(), ranks_y - ranks_y.mean(axis=1, keepdims=True)
    rhos = cy @ cx / np.sqrt((cx @ cx) * (cy * cy).sum(axis=1))
    observed = stats.spearmanr(x, y).statistic
    return float(np.mean(rhos <= observed + 1e-12))


@pytest.mark.parametrize("n", range(3, 9))
def test_the_exact_p_is_the_share_of_orderings_by_brute_force_ties_included(n: int) -> None:
    rng = np.random.default_rng(n)
    layers = sorted(rng.choice(40, size=n, replace=False).tolist())  # distinct, not consecutive
    cases = [
        rng.normal(size=n).tolist(),  # no ties
        (rng.permutation(n) // 2).astype(float).tolist(),  # ties in pairs
        [0.0, 0.0, 0.0, *rng.normal(size=n - 3)],  # a tie of three
        (np.arange(n)[::-1] + 0.0).tolist(),  # strictly falling: the most extreme ordering
    ]
    for values in cases:
        result = spearman_permutation_test(layers, values, decreasing=True)
        assert result["exact"] and result["n_orderings"] == math.factorial(n)
        if np.ptp(values) == 0:  # every ordering the same: rho undefined, nothing to test
            assert result["rho"] is None and result["p_value"] == result["p_min"] == 1.0
            continue
        assert result["rho"] == pytest.approx(stats.spearmanr(layers, values).statistic, abs=1e-12)
        if n <= 6:  # scipy's spearmanr for each of the n! orderings
            p, p_min = brute_force_p(layers, values, decreasing=True)
            assert result["p_value"] == pytest.approx(p, abs=1e-12) and result["p_min"] == pytest.approx(p_min, abs=1e-12)
            rising = spearman_permutation_test(layers, values, decreasing=False)
            assert (rising["p_value"], rising["p_min"]) == pytest.approx(brute_force_p(layers, values, decreasing=False), abs=1e-12)
        else:
            assert result["p_value"] == pytest.approx(brute_force_p_vectorised(layers, values), abs=1e-12)
    # ties on both sides, against scipy's own exact permutation test
    x, y = [1.0, 2.0, 2.0, 4.0, 5.0], [3.0, 1.0, 3.0, 0.0, 0.0]
    scipy_p = stats.permutation_test((y,), lambda v: stats.spearmanr(x, v).statistic, permutation_type="pairings",
                                     alternative="less", n_resamples=np.inf).pvalue
    assert spearman_permutation_test(x, y)["p_value"] == pytest.approx(scipy_p, abs=1e-12)


def test_three_layers_cannot_reach_005_and_are_not_testable() -> None:
    falling = spearman_permutation_test([1, 2, 3], [0.9, 0.8, 0.7])
    # one of the 3! = 6 orderings reaches rho = -1: one-sided p 1/6 (two-sided it would be 2/6)
    assert falling["rho"] == -1.0 and falling["p_value"] == pytest.approx(1 / 6) and falling["p_min"] == pytest.approx(1 / 6)
    rising = spearman_permutation_test([1, 2, 3], [0.7, 0.8, 0.9])
    assert rising["rho"] == 1.0 and rising["p_value"] == 1.0  # not p 0: the claim is that it falls
    record = depth_trend([1, 2, 3], [0.9, 0.8, 0.7])
    assert record["verdict"] == "not testable" and record["p_holm"] is None
    assert record["reason"] == "with 3 layers the smallest attainable one-sided p is 0.167 > 0.05"
    assert statement(record).startswith("Mean self-similarity falls with depth over layers 1-3: not testable, with 3 layers")
    # 4 layers: 1/4! = 0.042 can reach 0.05; ties raise the smallest attainable p (2! x 2! orderings of 24)
    assert depth_trend([1, 2, 3, 4], [4.0, 3.0, 2.0, 1.0])["verdict"] is None  # tested: Holm decides
    tied = depth_trend([1, 2, 3, 4], [2.0, 2.0, 1.0, 1.0])
    assert tied["p_min"] == pytest.approx(4 / 24) and tied["verdict"] == "not testable"
    for few in ([1], [1, 2]):
        assert depth_trend(few, [0.5, 0.4][:len(few)])["verdict"] == "not testable"
    assert depth_trend([1, 2, 3], [0.5, float("nan"), 0.4])["reason"] == "undefined at layers [2]"


def test_more_layers_than_the_exact_limit_take_a_seeded_monte_carlo_test() -> None:
    n = EXACT_MAX_LAYERS + 1
    layers = list(range(1, n + 1))
    values = (np.arange(n)[::-1] + np.random.default_rng(3).normal(0, 2.5, n)).tolist()
    result = spearman_permutation_test(layers, values, seed=5)
    assert not result["exact"] and result["n_orderings"] == MONTE_CARLO_PERMUTATIONS
    assert result == spearman_permutation_test(layers, values, seed=5)  # seeded
    assert result["p_min"] == pytest.approx(1 / (1 + MONTE_CARLO_PERMUTATIONS))
    exact = brute_force_p_vectorised(layers, values)  # 9! orderings
    assert abs(result["p_value"] - exact) < 4 * math.sqrt(exact * (1 - exact) / MONTE_CARLO_PERMUTATIONS) + 2e-5
    record = depth_trend(layers, values, seed=5)
    assert f"{MONTE_CARLO_PERMUTATIONS:,} random orderings (seed 5)" in record["test"]


def test_holm_adjusts_the_family_as_by_hand() -> None:
    def record(p: float | None, verdict: str | None = None) -> dict:
        return {"p_value": p, "verdict": verdict, "p_holm": None}

    records = [record(0.01), record(0.04), record(0.03), record(0.2, "not testable"), record(0.02)]
    family = holm_verdicts(records)
    assert family == [records[i] for i in (0, 1, 2, 4)]  # the untestable one is not in the family: m = 4
    # sorted 0.01, 0.02, 0.03, 0.04 times 4, 3, 2, 1: 0.04, 0.06, 0.06, 0.04 -> running max 0.04, 0.06, 0.06, 0.06
    assert [r["p_holm"] for r in records] == pytest.approx([0.04, 0.06, 0.06, None, 0.06])
    assert [r["verdict"] for r in records] == ["yes", "no", "no", "not testable", "no"]


def _analysis(n_layers: int, raw: list[float], adjusted: list[float], *, stop_least: int, n_words: int = 20, n_stop: int = 5,
              baseline_lo: float = 0.3, mev_hi: float = 0.04) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """A summary (layer 0 and `n_layers` non-input layers), per-word values at the last layer (the
    10 lowest holding `stop_least` of the `n_stop` stopwords) and intervals."""
    layers = list(range(n_layers + 1))
    summary = pd.DataFrame({"layer": layers, "anisotropy_exact": 0.4, "self_similarity": [1.0, *raw],
                            "self_similarity_adjusted": [1.0, *adjusted], "mev_centred": 0.2, "mev_centred_adjusted": 0.02})
    stop = ["the"] * stop_least + ["bank"] * (10 - stop_least) + ["of"] * (n_stop - stop_least)
    stop += ["river"] * (n_words - len(stop))
    words = pd.DataFrame({"layer": n_layers, "word": stop, "self_similarity": np.arange(n_words) / n_words})
    intervals = pd.DataFrame({"layer": layers, "anisotropy_exact_lo": baseline_lo, "mev_centred_adjusted_hi": mev_hi})
    return summary, words, intervals


def test_a_run_s_findings_are_holm_adjusted_together_with_their_tests_stated() -> None:
    # 5 layers: raw strictly falls (p = 1/120); adjusted one adjacent swap from falling (rho -0.9: 5/120);
    # 5 of the 5 stopwords among the 10 lowest of 20 words: p = C(15, 5) / C(20, 10)
    summary, words, intervals = _analysis(5, [0.9, 0.8, 0.7, 0.6, 0.5], [0.9, 0.8, 0.7, 0.5, 0.6], stop_least=5)
    document, sentences = findings(summary, words, variants=("centred",), intervals=intervals, confidence=0.95, resamples=1000)
    raw, adjusted = document["self_similarity_depth"]["raw"], document["self_similarity_depth"]["adjusted"]
    stop = document["least_self_similar"]
    p_stop = math.comb(15, 5) / math.comb(20, 10)
    assert raw["p_value"] == pytest.approx(1 / 120) and adjusted["p_value"] == pytest.approx(5 / 120)
    assert stop["p_value"] == pytest.approx(p_stop) and stop["value"] == 5 and stop["p_min"] == pytest.approx(p_stop)
    # Holm by hand over m = 3: 1/120 x 3, then p_stop x 2, then 5/120 x 1, each at least the one before
    assert raw["p_holm"] == pytest.approx(3 / 120)
    assert stop["p_holm"] == pytest.approx(max(3 / 120, 2 * p_stop))
    assert adjusted["p_holm"] == pytest.approx(max(3 / 120, 2 * p_stop, 5 / 120))
    assert [raw["verdict"], adjusted["verdict"], stop["verdict"]] == ["yes", "yes", "yes"]
    assert document["multiple_testing"]["family"] == [raw["claim"], adjusted["claim"], stop["claim"]]
    # the levels: every layer's interval on the claimed side
    assert document["anisotropy"]["verdict"] == "yes" and document["static_embedding_variance"]["centred"]["verdict"] == "yes"
    assert document["anisotropy"]["p_value"] is None and document["anisotropy"]["p_holm"] is None
    for record in finding_records(document):
        assert {"claim", "statistic", "value", "test", "alternative", "p_value", "p_min", "p_holm", "verdict"} <= set(record)
    assert sentences == statements(document) and len(sentences) == len(finding_records(document)) + 1
    assert "one-sided (rho < 0) exact permutation test of Spearman's rho over the 120 orderings of 5 layers: p 0.0083" in sentences[1]
    assert sentences[1].startswith("Mean self-similarity (raw) falls with depth over layers 1-5: yes (")
    assert "Holm p 0.025" in sentences[1]
    json.dumps(document, allow_nan=False)  # no NaN: the findings are compared with == across executors

    # a weaker stopword result pushes the adjusted trend over 0.05 after Holm; intervals that cross the threshold
    summary, words, intervals = _analysis(5, [0.9, 0.8, 0.7, 0.6, 0.5], [0.9, 0.8, 0.7, 0.5, 0.6], stop_least=3,
                                          baseline_lo=0.04, mev_hi=0.06)
    document, _ = findings(summary, words, variants=("centred",), intervals=intervals, confidence=0.95, resamples=1000)
    stop = document["least_self_similar"]
    assert stop["p_value"] == pytest.approx(stats.hypergeom.sf(2, 20, 5, 10))
    adjusted = document["self_similarity_depth"]["adjusted"]
    assert adjusted["p_holm"] == pytest.approx(max(3 / 120, 2 * 5 / 120)) and adjusted["verdict"] == "no"
    assert stop["p_holm"] == pytest.approx(stop["p_value"]) and stop["verdict"] == "no"
    assert document["anisotropy"]["verdict"] == "no" and document["static_embedding_variance"]["centred"]["verdict"] == "no"

    # no bootstrap: a level is not testable; the p-valued findings are tested as before
    document, sentences = findings(summary, words, variants=("centred",))
    assert document["anisotropy"]["verdict"] == "not testable" and "bootstrap" in document["anisotropy"]["reason"]
    assert document["static_embedding_variance"]["centred"]["verdict"] == "not testable"
    assert document["self_similarity_depth"]["raw"]["verdict"] == "yes"


def _check_consistent(document: dict, records: pd.DataFrame, words: pd.DataFrame) -> None:
    """Every finding's p-value recomputed from the run's numbers, and its verdict following from p,
    p_min, Holm's p or the intervals."""
    findings_ = document["findings"]
    upper = records.loc[records["layer"] >= 1]
    layers = sorted(upper["layer"].unique().tolist())
    tested = [r for r in finding_records(findings_) if r["p_holm"] is not None]
    adjusted = dict(zip(map(id, tested), holm_p([r["p_value"] for r in tested])))
    for record in finding_records(findings_):
        assert record["verdict"] in ("yes", "no", "not testable")
        if record["p_holm"] is not None:
            assert record["p_holm"] == pytest.approx(adjusted[id(record)])
            assert record["verdict"] == ("yes" if record["p_holm"] < ALPHA else "no")
        elif record["p_value"] is not None:
            assert record["verdict"] == "not testable" and record["p_min"] > ALPHA
    for kind in ("raw", "adjusted"):
        trend = findings_["self_similarity_depth"][kind]
        values = upper.loc[upper["metric"] == "self_similarity"].set_index("layer")[kind].loc[layers].tolist()
        if len(layers) <= 6:
            p, p_min = brute_force_p(layers, values, decreasing=True)
            assert trend["p_value"] == pytest.approx(p) and trend["p_min"] == pytest.approx(p_min)
    least = findings_["least_self_similar"]
    from gensim.parsing.preprocessing import STOPWORDS

    last = words.loc[(words["layer"] == layers[-1]) & words["self_similarity"].notna()]
    is_stop = last["word"].str.lower().isin(STOPWORDS)
    in_least = is_stop.loc[last.nsmallest(10, "self_similarity").index]
    assert least["value"] == int(in_least.sum())
    assert least["p_value"] == pytest.approx(stats.hypergeom.sf(int(in_least.sum()) - 1, len(last), int(is_stop.sum()), len(in_least)))
    by_metric = upper.set_index(["metric", "layer"])
    lower = by_metric.loc["anisotropy_exact", "raw_lo"]
    assert findings_["anisotropy"]["verdict"] == ("yes" if (lower > 0.05).all() else "no")
    for variant, record in findings_["static_embedding_variance"].items():
        highs = by_metric.loc[f"mev_{variant}", "adjusted_hi"].dropna()
        assert record["verdict"] == ("yes" if (highs < 0.05).all() else "no")
        assert record["value"] == pytest.approx(highs.max())


def holm_p(p_values: list[float]) -> list[float]:
    """Holm's adjusted p-values, by the definition: max over j <= i of (m - j) p_(j), capped at 1."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


def test_a_tiny_run_s_findings_carry_p_values_and_verdicts_that_follow_from_them(tiny_cli_run: tuple[Path, str]) -> None:
    out, output = tiny_cli_run  # `lmgeom run --model tiny-bert` on 60 Lee sentences, at 80 columns
    document = json.loads((out / "contextuality.json").read_text())
    records = pd.DataFrame(document["records"])
    words = pd.read_csv(out / "contextuality_words.csv", keep_default_na=False, na_values=[""])
    _check_consistent(document, records, words)
    findings_ = document["findings"]
    # tiny-bert has 3 blocks: the trends over 3 layers cannot reach 0.05
    for kind in ("raw", "adjusted"):
        trend = findings_["self_similarity_depth"][kind]
        assert trend["verdict"] == "not testable" and trend["p_min"] == pytest.approx(1 / 6) and trend["n_orderings"] == 6
    assert findings_["least_self_similar"]["p_holm"] is not None  # the one finding in the Holm family
    # one home: the sentences of contextuality.json are those of its findings, printed and in the report
    assert document["statements"] == statements(findings_)
    flat = " ".join(output.split())
    report = (out / "report.html").read_text()
    for sentence in document["statements"]:
        assert " ".join(sentence.split()) in flat
        assert html.escape(sentence) in report


def test_findings_re_derived_from_a_written_document_are_the_ones_it_holds(tiny_cli_run: tuple[Path, str]) -> None:
    """`retest_findings` rebuilds the findings of a contextuality.json from its own records, intervals and
    stopword counts: on a document written today, exactly its findings and statements; on one that
    records only the stopword share (as older results do), the same tests."""
    from lmgeom.stages.contextuality import retest_findings

    out, _ = tiny_cli_run
    document = json.loads((out / "contextuality.json").read_text())
    again, sentences = retest_findings(document)
    assert sentences == document["statements"]
    assert json.loads(json.dumps(again)) == document["findings"]
    older = json.loads(json.dumps(document))
    least = older["findings"]["least_self_similar"]
    least.pop("n_analysed_stopwords")
    least.pop("n_analysed_words")
    older["counts"]["words_analysed"] = least_words = document["findings"]["least_self_similar"]["n_analysed_words"]
    assert retest_findings(older)[1] == document["statements"]
    least["stopword_share_among_all_analysed_words"] = 0.5 / least_words  # half a word: not a count
    with pytest.raises(InputError, match="no whole number"):
        retest_findings(older)
