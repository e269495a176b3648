"""The local-isotropy thesis test (`lmgeom experiment thesis`): each statistic against brute force on
small synthetic data: the cluster bootstrap (its draws enumerated), the cluster permutation p (every
permutation listed), the standardisation within configurations, the trivial-baseline filter, the
level test and the command's output."""

from __future__ import annotations

import itertools
import json
from collections import Counter

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from lmgeom.evaluate.stats import spearman_bootstrap
from lmgeom.evaluate.tasks import spearman
from lmgeom.stages.experiments.thesis import (
    CONFIG_KEYS,
    cluster_bootstrap_spearman,
    cluster_permutation_p,
    drop_uninformative,
    level_points,
    level_test,
    standardise,
    standardised_pairs,
    thesis_analysis,
    thesis_pairs,
    thesis_pairs_with_drops,
    thesis_test,
    trivial_verdicts,
)


def brute_spearman(x, y) -> float:
    return float(scipy_stats.spearmanr(x, y).statistic)


def test_spearman_is_scipys_with_ties_and_nan_on_a_constant_side():
    x = [1.0, 1.0, 2.0, 3.0, 3.0, 4.0]
    y = [0.5, 0.1, 0.1, 0.9, 0.3, 0.7]
    assert spearman(x, y) == pytest.approx(brute_spearman(x, y))
    assert np.isnan(spearman([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))


# ---- the cluster bootstrap ----------------------------------------------------------------------


def three_clusters():
    # x constant within a cluster (as a frozen method's Δ isotropy is over seeds), y varies
    x = np.array([0.1, 0.1, 0.5, 0.5, 0.5, 0.9, 0.9])
    y = np.array([0.3, 0.0, 0.2, 0.6, 0.4, 0.8, 0.5])
    clusters = ["a", "a", "b", "b", "b", "c", "c"]
    return x, y, clusters


def test_cluster_bootstrap_draws_whole_clusters_and_matches_the_enumerated_distribution():
    x, y, clusters = three_clusters()
    members = {"a": [0, 1], "b": [2, 3, 4], "c": [5, 6]}
    result = cluster_bootstrap_spearman(x, y, clusters, n_resamples=6000, seed=1)
    assert result.rho == pytest.approx(brute_spearman(x, y)) and result.n_clusters == 3 and result.n == 7
    # every used draw is the rho of whole drawn clusters
    names = ["a", "b", "c"]
    for pick, rho in zip(result.picks[:300], result.draws[:300]):
        rows = [r for c in pick for r in members[names[c]]]
        assert rho == pytest.approx(brute_spearman(x[rows], y[rows]))
    # the 27 equally likely ordered draws, enumerated: the 3 that repeat one cluster have a constant x
    # and are skipped, the other 24 give the bootstrap distribution
    exact = Counter()
    for pick in itertools.product(range(3), repeat=3):
        rows = [r for c in pick for r in members[names[c]]]
        if np.ptp(x[rows]) > 0:
            exact[tuple(sorted(pick))] += 1 / 24
    assert result.n_resamples == pytest.approx(6000 * 24 / 27, rel=0.03)
    observed = Counter(tuple(sorted(p)) for p in result.picks)
    assert set(observed) == set(exact)
    for key, probability in exact.items():
        assert observed[key] / result.n_resamples == pytest.approx(probability, abs=0.02)
    # the interval is the percentile interval of the draws, and every draw is a value the enumeration takes
    assert (result.low, result.high) == pytest.approx(tuple(np.quantile(result.draws, [0.025, 0.975])))
    support = set()
    for pick in itertools.product(range(3), repeat=3):
        rows = [r for c in pick for r in members[names[c]]]
        if len(set(pick)) > 1:
            support.add(round(brute_spearman(x[rows], y[rows]), 9))
    assert set(np.round(result.draws, 9)) <= support


def test_cluster_bootstrap_of_singletons_is_the_pair_bootstrap():
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=30), rng.normal(size=30)
    clustered = cluster_bootstrap_spearman(x, y, list(range(30)), n_resamples=400, seed=7)
    pooled = spearman_bootstrap(x, y, n_resamples=400, seed=7)
    assert (clustered.rho, clustered.low, clustered.high) == pytest.approx((pooled.rho, pooled.low, pooled.high))


def test_cluster_bootstrap_is_wider_than_the_pair_bootstrap_when_seeds_share_their_cluster():
    # 8 clusters of 25 seeds: x and y each carry a cluster effect and no relation within clusters, so
    # the 200 pairs hold the information of about 8; treating them as independent understates the width
    rng = np.random.default_rng(11)
    k, m = 8, 25
    a, b = rng.normal(size=k), rng.normal(size=k)
    x = np.repeat(a, m) + 0.05 * rng.normal(size=k * m)
    y = np.repeat(b, m) + 0.05 * rng.normal(size=k * m)
    clusters = np.repeat(np.arange(k), m)
    clustered = cluster_bootstrap_spearman(x, y, clusters, n_resamples=1000, seed=0)
    pooled = spearman_bootstrap(x, y, n_resamples=1000, seed=0)
    assert clustered.rho == pytest.approx(pooled.rho)
    assert clustered.high - clustered.low > 3 * (pooled.high - pooled.low)
    # with independent pairs (no cluster effect) the two widths agree roughly
    x0, y0 = rng.normal(size=k * m), rng.normal(size=k * m)
    c0 = cluster_bootstrap_spearman(x0, y0, clusters, n_resamples=1000, seed=0)
    p0 = spearman_bootstrap(x0, y0, n_resamples=1000, seed=0)
    assert 0.6 < (c0.high - c0.low) / (p0.high - p0.low) < 1.6


# ---- the cluster permutation test ---------------------------------------------------------------


def brute_permutation_p(x, y, blocks):
    """Every assignment of x blocks to clusters of the same size (rows in order), |rho| >= observed."""
    observed = abs(brute_spearman(x, y))
    by_size = {}
    for c, rows in enumerate(blocks):
        by_size.setdefault(len(rows), []).append(c)
    strata = list(by_size.values())
    count = total = 0
    for orders in itertools.product(*(itertools.permutations(s) for s in strata)):
        new_x = np.array(x, dtype=float)
        for s, order in zip(strata, orders):
            for target, origin in zip(s, order):
                new_x[blocks[target]] = np.asarray(x)[blocks[origin]]
        total += 1
        count += abs(brute_spearman(new_x, y)) >= observed - 1e-12
    return count / total, total


def test_cluster_permutation_p_is_the_share_of_all_block_permutations():
    rng = np.random.default_rng(3)
    # clusters of sizes 2, 2, 2, 3, 3, 2 (the sizes-3 pair can only swap between themselves)
    sizes = [2, 2, 2, 3, 3, 2]
    clusters = np.repeat(np.arange(len(sizes)), sizes)
    blocks = [np.flatnonzero(clusters == c) for c in range(len(sizes))]
    x = np.repeat(rng.normal(size=len(sizes)), sizes) + 0.1 * rng.normal(size=len(clusters))
    y = x + rng.normal(size=len(clusters))
    expected, total = brute_permutation_p(x, y, blocks)
    result = cluster_permutation_p(x, y, clusters, n_permutations=10000)
    assert result.exact and result.n_permutations == total == 4 * 3 * 2 * 1 * 2
    assert result.p_value == pytest.approx(expected)
    assert result.rho == pytest.approx(brute_spearman(x, y))


def test_cluster_permutation_monte_carlo_approaches_the_exact_p():
    rng = np.random.default_rng(5)
    clusters = np.repeat(np.arange(7), 2)
    blocks = [np.flatnonzero(clusters == c) for c in range(7)]
    x = rng.normal(size=14)
    y = 0.4 * x + rng.normal(size=14)
    expected, total = brute_permutation_p(x, y, blocks)
    assert total == 5040
    sampled = cluster_permutation_p(x, y, clusters, n_permutations=3000, seed=2)
    assert not sampled.exact and sampled.p_value == pytest.approx(expected, abs=0.03)


def test_the_cluster_permutation_p_is_not_fooled_by_seeds_of_one_cluster():
    # 5 clusters of 20 seeds whose x and y share a cluster effect: one p per block arrangement (5! = 120),
    # so no p below 1/120 however many pairs; scipy's p, which counts 100 pairs, claims far more
    rng = np.random.default_rng(8)
    effect = np.arange(5.0)
    x = np.repeat(effect, 20) + 0.01 * rng.normal(size=100)
    y = np.repeat(effect, 20) + 0.01 * rng.normal(size=100)
    result = cluster_permutation_p(x, y, np.repeat(np.arange(5), 20))
    assert result.exact and result.n_permutations == 120
    assert result.p_value >= 1 / 120 - 1e-12
    assert scipy_stats.spearmanr(x, y).pvalue < 1e-20


# ---- records, pairs, the filter, the standardisation --------------------------------------------


def record(method, seed, value, iso, local, *, source="s1", task="cola", model="m", head="logreg", regime="frozen",
           split="dev", metric="matthews", level=0.1, **extra):
    return {"source": source, "regime": regime, "task": task, "model": model, "head": head, "features": "top",
            "pooling": "mean", "method": method, "seed": seed, "split": split, "metric": metric, "value": value,
            "isoscore_after": iso, "local_isoscore_after": local, "local_isoscore_before": level, **extra}


def none_summary(beats, *, source="s1", task="cola", model="m", head="logreg", regime="frozen", split="dev",
                 metric="matthews"):
    summary = {"source": source, "regime": regime, "task": task, "model": model, "head": head, "features": "top",
               "pooling": "mean", "method": "none", "split": split, "metric": metric, "mean": 0.3}
    if beats is not None:
        summary["trivial"] = {"baseline": "majority class", "value": 0.0, "p_value": 0.01 if beats else 0.4,
                              "beats": beats}
    return summary


def test_pairs_stay_within_their_source_and_count_what_degenerate_cells_remove():
    records = []
    for source, offset in (("a.json", 0.0), ("b.json", 0.5)):
        for seed in range(2):
            records.append(record("none", seed, 0.2 + offset, 0.1, 0.1, source=source))
            records.append(record("cie", seed, 0.3 + offset, 0.4, 0.2, source=source))
    records.append(record("flow", 0, 0.9, 0.9, 0.9, source="a.json", degenerate=True))
    records.append(record("flow", 1, 0.9, 0.9, 0.9, source="c.json"))  # no none in c.json
    pairs, drops = thesis_pairs_with_drops(records)
    assert len(pairs) == 4 and pairs["delta_score"].tolist() == pytest.approx([0.1] * 4)
    assert sorted(pairs["source"]) == ["a.json", "a.json", "b.json", "b.json"]
    reasons = {d["reason"]: d["n_pairs"] for d in drops}
    assert reasons == {"the method's cell is degenerate": 1, "no none cell of that seed": 1}
    assert thesis_pairs(records)["level_none"].tolist() == pytest.approx([0.1] * 4)


def planted_records():
    """Configurations (model, head): m1/logreg and m2/logreg informative, m1/mlp uninformative, m3/logreg
    without a verdict; 3 methods x 3 seeds each."""
    rng = np.random.default_rng(0)
    records = []
    for model, head in (("m1", "logreg"), ("m1", "mlp"), ("m2", "logreg"), ("m3", "logreg")):
        for seed in range(3):
            records.append(record("none", seed, 0.3, 0.1, 0.1, model=model, head=head))
            for method in ("abtt", "cie", "whitening"):
                records.append(record(method, seed, 0.3 + 0.01 * rng.normal(), float(rng.random()), float(rng.random()),
                                      model=model, head=head))
    summaries = [none_summary(True, model="m1"), none_summary(False, model="m1", head="mlp"), none_summary(True, model="m2"),
                 none_summary(None, model="m3"),
                 {**none_summary(False, model="m2"), "method": "cie"}]  # a method's own verdict does not count
    return records, summaries


def test_the_trivial_baseline_filter_drops_exactly_the_planted_configurations():
    records, summaries = planted_records()
    pairs = thesis_pairs(records)
    verdicts = trivial_verdicts(summaries)
    kept, table, drops = drop_uninformative(pairs, verdicts)
    assert sorted(set(zip(kept["model"], kept["head"]))) == [("m1", "logreg"), ("m2", "logreg")]
    assert len(kept) == 2 * 9
    assert {d["reason"]: (d["n_pairs"], d["n_configurations"]) for d in drops} == {
        "none does not beat the strongest trivial baseline": (9, 1),
        "no trivial-baseline verdict in its results.json": (9, 1)}
    status = {(t["model"], t["head"]): t["status"] for t in table}
    assert status == {("m1", "logreg"): "informative", ("m1", "mlp"): "uninformative", ("m2", "logreg"): "informative",
                      ("m3", "logreg"): "unverified"}
    kept_too, _, drops_too = drop_uninformative(pairs, verdicts, keep_unverified=True)
    assert sorted(set(kept_too["model"] + "/" + kept_too["head"])) == ["m1/logreg", "m2/logreg", "m3/logreg"]
    assert [d["reason"] for d in drops_too] == ["none does not beat the strongest trivial baseline"]


def test_standardise_is_the_z_score_within_each_configuration():
    frame = pd.DataFrame({k: "x" for k in CONFIG_KEYS}, index=range(7))
    frame["metric"] = ["f1", "f1", "f1", "acc", "acc", "acc", "one"]
    frame["d"] = [0.1, 0.2, 0.6, 10.0, 10.0, 10.0, 3.0]
    z = standardise(frame, ["d"])["z_d"].to_numpy()
    f1 = np.array([0.1, 0.2, 0.6])
    assert z[:3] == pytest.approx((f1 - f1.mean()) / f1.std(ddof=1))
    assert np.isnan(z[3:]).all()  # sd 0, and a single row


def test_standardised_rho_ignores_the_scale_and_offset_of_each_metric():
    # two configurations with the same within-configuration relation, one on a 100 x scale and shifted:
    # the raw pooled rho mixes the scales, the standardised one is the within-configuration rho
    rng = np.random.default_rng(1)
    records = []
    for metric, scale, shift in (("matthews", 1.0, 0.0), ("accuracy", 100.0, 50.0)):
        task = "cola" if metric == "matthews" else "pos"
        for seed in range(3):
            records.append(record("none", seed, shift, 0.0, 0.0, task=task, metric=metric))
            for method in ("abtt", "cie", "whitening", "flow"):
                local = float(rng.normal())
                # the accuracy configuration: Δ isotropy shifted up, Δ score shifted down
                records.append(record(method, seed, shift + scale * 0.1 * local + (0.5 if metric == "matthews" else -50.0),
                                      -local, local + 3 * (metric == "accuracy"), task=task, metric=metric))
    pairs = thesis_pairs(records)
    z = standardised_pairs(pairs)
    for name in ("score", "global", "local"):
        for _, group in z.groupby("task"):
            raw = group[f"delta_{name}"]
            assert group[f"z_delta_{name}"].to_numpy() == pytest.approx(((raw - raw.mean()) / raw.std(ddof=1)).to_numpy())
    results = {r["measure"]: r for r in thesis_test(pairs, regimes=("frozen",), n_resamples=200, n_permutations=200)}
    assert results["local"]["rho"] == pytest.approx(1.0) and results["global"]["rho"] == pytest.approx(-1.0)
    assert brute_spearman(pairs["delta_local"], pairs["delta_score"]) < 0
    assert results["local"]["n_clusters"] == 8 and results["local"]["n_configurations"] == 2


def test_thesis_test_counts_clusters_and_gives_no_interval_below_three():
    records = []
    for seed in range(4):
        records.append(record("none", seed, 0.3, 0.1, 0.1, regime="finetune"))
        for method, slope in (("isobn", 0.1), ("cie", -0.1)):
            records.append(record(method, seed, 0.3 + slope * seed, 0.1 + 0.05 * seed, 0.1 + 0.02 * seed, regime="finetune"))
    results = {r["measure"]: r for r in thesis_test(thesis_pairs(records), regimes=("finetune",), n_resamples=200)}
    local = results["local"]
    assert local["n_pairs"] == 8 and local["n_clusters"] == 2 and local["rho"] is None and "fewer than 3" in local["note"]
    assert "low" not in local and "p_value" not in local and np.isfinite(local["rho_ignoring_clusters"])


def test_level_test_relates_the_standardised_mean_gain_to_nones_local_isotropy():
    # 5 models x 2 heads: calibration helps more where none's local IsoScore is lower
    rng = np.random.default_rng(6)
    records = []
    levels = {"m0": 0.05, "m1": 0.1, "m2": 0.2, "m3": 0.3, "m4": 0.4}
    for model, level in levels.items():
        for head in ("logreg", "mlp"):
            for seed in range(3):
                records.append(record("none", seed, 0.5, 0.1, 0.1, model=model, head=head, level=level))
                for method in ("abtt", "cie", "whitening"):
                    gain = (0.4 - level) * 0.1 + 0.01 * rng.normal()
                    records.append(record(method, seed, 0.5 + gain, float(rng.random()), float(rng.random()), model=model,
                                          head=head, level=level))
    pairs = thesis_pairs(records)
    points = level_points(pairs)
    assert len(points) == 10
    for _, point in points.iterrows():
        mine = pairs[(pairs["model"] == point["model"]) & (pairs["head"] == point["head"])]["delta_score"]
        assert point["standardised_mean_delta_score"] == pytest.approx(mine.mean() / mine.std(ddof=1))
        assert point["level"] == pytest.approx(levels[point["model"]])
    (frozen,) = level_test(pairs, regimes=("frozen",), n_resamples=300)
    assert frozen["n_configurations"] == 10 and frozen["n_clusters"] == 5  # the two heads share their input
    assert frozen["rho"] == pytest.approx(brute_spearman(points["level"], points["standardised_mean_delta_score"]))
    assert frozen["rho"] < -0.8 and frozen["high"] < 0
    ordered = points.sort_values(["model", "head"])
    blocks = [np.flatnonzero(ordered["model"].to_numpy() == model) for model in levels]
    expected, total = brute_permutation_p(ordered["level"].to_numpy(), ordered["standardised_mean_delta_score"].to_numpy(),
                                          blocks)
    assert frozen["p_exact"] and frozen["n_permutations"] == 120 == total and frozen["p_value"] == pytest.approx(expected)
    assert frozen["p_value"] < 0.05


# ---- the whole analysis and the command ---------------------------------------------------------


def test_thesis_analysis_reports_every_drop_and_the_settings(tmp_path):
    records, summaries = planted_records()
    records.append(record("flow", 0, 0.9, 0.9, 0.9, model="m1", degenerate=True))
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"records": [{k: v for k, v in r.items() if k != "source"} for r in records],
                                "summaries": [{k: v for k, v in s.items() if k != "source"} for s in summaries]}))
    document, kept = thesis_analysis([path], n_resamples=200, n_permutations=1000)
    assert document["n_pairs_formed"] == 36 and document["n_pairs_kept"] == 18 == len(kept) == len(document["pairs"])
    reasons = {d["reason"]: d["n_pairs"] for d in document["dropped"]}
    assert reasons == {"the method's cell is degenerate": 1, "none does not beat the strongest trivial baseline": 9,
                       "no trivial-baseline verdict in its results.json": 9}
    assert "z-score within each configuration" in document["settings"]["standardisation"]
    assert document["settings"]["keep_unverified"] is False
    frozen_local = next(t for t in document["tests"] if t["regime"] == "frozen" and t["measure"] == "local")
    assert frozen_local["n_pairs"] == 18 and frozen_local["n_clusters"] == 6 and frozen_local["n_configurations"] == 2
    used = document["pairs"]
    assert frozen_local["rho"] == pytest.approx(brute_spearman([p["z_delta_local"] for p in used],
                                                               [p["z_delta_score"] for p in used]))
    assert frozen_local["p_exact"] and frozen_local["n_permutations"] == 720


def test_thesis_command_writes_the_tests_and_the_plot(tmp_path):
    from typer.testing import CliRunner

    from lmgeom.cli.main import app

    rng = np.random.default_rng(2)
    records = []
    for head in ("logreg", "mlp"):
        for seed in range(3):
            records.append({"regime": "frozen", "task": "cola", "model": "m", "head": head, "method": "none", "seed": seed,
                            "split": "dev", "metric": "matthews", "value": 0.2, "isoscore_after": 0.1,
                            "local_isoscore_after": 0.1, "local_isoscore_before": 0.1})
            none = records[-1]
            for method in ("abtt", "cie", "whitening"):
                records.append({**none, "method": method, "value": float(rng.random()),
                                "isoscore_after": float(rng.random()), "local_isoscore_after": float(rng.random())})
    summaries = [{"regime": "frozen", "task": "cola", "model": "m", "head": head, "method": "none", "split": "dev",
                  "metric": "matthews", "mean": 0.2, "trivial": {"baseline": "majority class", "value": 0.0, "beats": beats}}
                 for head, beats in (("logreg", True), ("mlp", False))]
    source = tmp_path / "results.json"
    source.write_text(json.dumps({"records": records, "summaries": summaries}))
    result = CliRunner().invoke(app, ["experiment", "thesis", str(source), "--out", str(tmp_path / "thesis"),
                                      "--bootstrap", "200"])
    assert result.exit_code == 0, result.output
    document = json.loads((tmp_path / "thesis" / "thesis.json").read_text())
    frozen_local = next(t for t in document["tests"] if t["regime"] == "frozen" and t["measure"] == "local")
    pairs = document["pairs"]
    assert frozen_local["n_pairs"] == 9 == len(pairs) and {p["head"] for p in pairs} == {"logreg"}
    assert frozen_local["n_clusters"] == 3 and frozen_local["low"] is not None and frozen_local["p_exact"]
    # one configuration: the z-score is linear, so the rho is the raw one
    expected = brute_spearman([p["delta_local"] for p in pairs], [p["delta_score"] for p in pairs])
    assert frozen_local["rho"] == pytest.approx(expected)
    assert (tmp_path / "thesis" / "thesis.png").stat().st_size > 1000
    assert "dropped 9 pairs (1 configurations): none does not beat" in result.output
    assert "finetune local: Spearman n/a over 0 pairs" in result.output
    # a result document of its own kind, which the report's reader checks
    from lmgeom import rundir

    assert rundir.read_json(tmp_path / "thesis" / "thesis.json", "thesis")["tests"] == document["tests"]
    assert document["kind"] == "thesis" and document["lmgeom_version"]
    # a folder holding someone else's thesis.json (or a thesis.png without lmgeom's thesis.json) is refused
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "thesis.json").write_text('{"mine": 1}')
    refused = CliRunner().invoke(app, ["experiment", "thesis", str(source), "--out", str(foreign), "--bootstrap", "200"])
    assert refused.exit_code == 2 and "lmgeom did not write it" in refused.output
    assert json.loads((foreign / "thesis.json").read_text()) == {"mine": 1}
    (foreign / "thesis.json").unlink()
    (foreign / "thesis.png").write_bytes(b"a user's picture")
    refused = CliRunner().invoke(app, ["experiment", "thesis", str(source), "--out", str(foreign), "--bootstrap", "200"])
    assert refused.exit_code == 2 and "thesis.png" in refused.output and not (foreign / "thesis.json").exists()
    replaced = CliRunner().invoke(app, ["experiment", "thesis", str(source), "--out", str(foreign), "--bootstrap", "200",
                                        "--overwrite"])
    assert replaced.exit_code == 0, replaced.output
    assert (foreign / "thesis.png").read_bytes() != b"a user's picture"
    # run again over its own files: replaced without a word
    again = CliRunner().invoke(app, ["experiment", "thesis", str(source), "--out", str(tmp_path / "thesis"),
                                     "--bootstrap", "200"])
    assert again.exit_code == 0, again.output
