"""The bootstrap of the per-layer contextuality numbers: replicates against brute force on explicitly
resampled occurrences, coverage of a closed-form value, seeding, the paired adjacent-layer test, and
the intervals in contextuality.json, the layers CSV and the terminal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lmgeom import rundir
from lmgeom.metrics.bootstrap import (
    draws,
    pair_mean,
    paired_test,
    percentile_interval,
    resampled_mev,
    self_similarity_replicates,
    unit_totals,
    weighted_means,
)
from lmgeom.metrics.contextuality import UnitSumsAccumulator
from lmgeom.metrics.mev import occurrence_spectrum
from lmgeom.stages.analysis import analyze_store
from lmgeom.store.arrays import write_store_from_arrays

SRC = Path(__file__).resolve().parents[1] / "src"


def _unit(X: np.ndarray) -> np.ndarray:
    return X / np.linalg.norm(X, axis=1, keepdims=True)


def _brute_pair_mean(U: np.ndarray, origin: np.ndarray) -> float:
    """Mean cosine over ordered pairs of resampled occurrences that are not copies of one original."""
    cos = U @ U.T
    distinct = origin[:, None] != origin[None, :]
    return float(cos[distinct].mean()) if distinct.any() else float("nan")


def _sentences(rng: np.random.Generator, n_sentences: int, n_words: int, dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, sentence of each row, word of each row): sentences of 2-6 words, a word may repeat."""
    lengths = rng.integers(2, 7, size=n_sentences)
    sentence = np.repeat(np.arange(n_sentences), lengths)
    word = rng.integers(0, n_words, size=len(sentence))
    return rng.normal(size=(len(sentence), dim)) + 0.5, sentence, word


@pytest.mark.parametrize("dim", [3, 40])  # 3: the (B, d) resampled sums; 40: the Gram of a word's units
def test_resampled_selfsim_and_baseline_equal_brute_force_on_the_resampled_occurrences(dim):
    rng = np.random.default_rng(1)
    X, sentence, word = _sentences(rng, 30, 6, dim)
    n_units = 30
    # rows fed in two chunks, cut inside a sentence, and merged from two accumulators
    cut = int(np.flatnonzero(sentence == 14)[1])
    first = UnitSumsAccumulator(n_units).add(X[:cut], unit_ids=sentence[:cut], word_ids=word[:cut])
    second = UnitSumsAccumulator(n_units).add(X[cut:], unit_ids=sentence[cut:], word_ids=word[cut:])
    summaries = first.merge(UnitSumsAccumulator.from_state_dict(second.state_dict())).result()
    m = draws(n_units, 5, seed=3, stream="sentences")
    keys, sums, counts = summaries["unit"]
    anisotropy = pair_mean(m[:, keys], sums, counts)
    selfsim = self_similarity_replicates(m, *summaries["pair"], n_units)
    U = _unit(X)
    for b in range(len(m)):
        # the resample written out: sentence j copied m[b, j] times, each copy's rows tagged with their original row
        rows = np.concatenate([np.flatnonzero(sentence == j) for j in range(n_units) for _ in range(m[b, j])])
        assert anisotropy[b] == pytest.approx(_brute_pair_mean(U[rows], rows), rel=1e-12)
        per_word = [_brute_pair_mean(U[rows[word[rows] == w]], rows[word[rows] == w]) for w in range(6)]
        assert selfsim[b] == pytest.approx(np.nanmean(per_word), rel=1e-12)
    # all ones: the point estimate (the mean over pairs of distinct occurrences)
    ones = np.ones((1, n_units), dtype=np.int32)
    assert pair_mean(ones[:, keys], sums, counts)[0] == pytest.approx(_brute_pair_mean(U, np.arange(len(U))), rel=1e-12)


@pytest.mark.parametrize(("dim", "top"), [(8, 3), (80, 3), (160, 1.05)])
def test_resampled_mev_equals_the_spectrum_of_the_explicitly_resampled_rows(dim, top):
    """8: every resample solved densely; 80: by Lanczos; 160 with a nearly flat spectrum (top axis 1.05
    times the next): the resamples' top eigenvectors turn far from the start, and each runs to the most
    steps or is solved exactly, with the same numbers."""
    rng = np.random.default_rng(2)
    X = rng.normal(size=(120, dim)) * np.linspace(top, 1, dim) + 0.7
    m = draws(len(X), 4, seed=5, stream="sampled occurrences")
    variants = ("uncentred", "centred", "svd_ratio")
    resampled = resampled_mev(X, m, variants)
    for b in range(len(m)):
        spectrum = occurrence_spectrum(np.repeat(X, m[b], axis=0))
        for variant in variants:
            assert resampled[variant][b] == pytest.approx(spectrum.mev(variant), rel=1e-8)


def test_weighted_means_of_resampled_values_equal_the_mean_of_the_resampled_items():
    rng = np.random.default_rng(4)
    values = rng.normal(size=50)
    values[[3, 17]] = np.nan
    units = np.repeat(np.arange(10), 5)
    totals, counts = unit_totals(values, units, 10)
    m = draws(10, 6, seed=1, stream="sentences")
    replicates = weighted_means(m, totals, counts)
    for b in range(len(m)):
        drawn = np.concatenate([values[units == j] for j in range(10) for _ in range(m[b, j])])
        assert replicates[b] == pytest.approx(np.nanmean(drawn), rel=1e-12)


def test_intervals_cover_the_closed_form_anisotropy_in_about_95_percent_of_repetitions():
    """Unit vectors in the plane at angles N(0, s^2), independent: the mean cosine of two is exp(-s^2).
    200 samples of 80 sentences of 4 occurrences; a 95% interval misses it in 10 +- 3 of them, so
    [180, 197] covered holds for a correct interval (a miss of 4 standard deviations otherwise) and
    fails for one of the wrong width (half as wide: ~68% covered) or place."""
    rng = np.random.default_rng(7)
    s, n_sentences, per_sentence = 0.9, 80, 4
    truth = np.exp(-s**2)
    m = draws(n_sentences, 500, seed=0, stream="sentences")
    covered = 0
    for _ in range(200):
        angles = rng.normal(0, s, size=(n_sentences, per_sentence))
        sums = np.stack([np.cos(angles).sum(axis=1), np.sin(angles).sum(axis=1)], axis=1)
        lo, hi = percentile_interval(pair_mean(m, sums, np.full(n_sentences, per_sentence)), 0.95)
        covered += lo <= truth <= hi
    assert 180 <= covered <= 197, covered


def test_the_paired_test_detects_a_real_layer_difference_and_not_a_null_one():
    """Two layers of the same distribution (independent rows): about 5% of 100 repetitions reject at
    0.05 (at most 12: a correct test exceeds that with probability < 0.001); a layer whose vectors
    share a stronger common direction is told apart every time."""
    rng = np.random.default_rng(11)
    n_sentences, per_sentence, dim = 60, 5, 6
    m = draws(n_sentences, 400, seed=2, stream="sentences")
    counts = np.full(n_sentences, per_sentence)

    def layer(shift: float) -> np.ndarray:
        U = _unit(rng.normal(size=(n_sentences * per_sentence, dim)) + shift)
        return U.reshape(n_sentences, per_sentence, dim).sum(axis=1)

    def test(first: np.ndarray, second: np.ndarray) -> float:
        point = pair_mean(np.ones((1, n_sentences)), second, counts)[0] - pair_mean(np.ones((1, n_sentences)), first, counts)[0]
        return paired_test(pair_mean(m, second, counts), pair_mean(m, first, counts), point, 0.95)["p_value"]

    null_rejections = sum(test(layer(0.3), layer(0.3)) < 0.05 for _ in range(100))
    assert null_rejections <= 12
    assert all(test(layer(0.3), layer(0.6)) < 0.01 for _ in range(20))


# ---------------------------------------------------------------------------------------------
# through the engine: a synthetic store


def _store(path: Path) -> object:
    rng = np.random.default_rng(0)
    vocab = [f"w{i}" for i in range(30)]
    sentences = [[vocab[j] for j in rng.integers(0, 30, size=rng.integers(4, 10))] for _ in range(120)]
    n = sum(map(len, sentences))
    base = rng.normal(size=(n, 12))
    # layer 1 = layer 0 plus a common direction: anisotropy rises; layer 2 = layer 1 doubled (exactly, in
    # floating point): every cosine the same
    direction = np.zeros(12)
    direction[0] = 1.5
    hidden = [base, base + direction, 2 * (base + direction)]
    return write_store_from_arrays(path, hidden, sentences)


def test_the_engine_writes_intervals_and_adjacent_layer_tests_and_keeps_every_point_estimate(tmp_path):
    store = _store(tmp_path / "store")
    with_intervals = analyze_store(store, min_contexts=2, bootstrap=300, engine="local", write_to=tmp_path / "a")
    without = analyze_store(store, min_contexts=2, bootstrap=0, engine="local")
    # point estimates bit-identical with and without the bootstrap
    columns = ["layer", "metric", "raw", "baseline", "adjusted", "n"]
    pd.testing.assert_frame_equal(with_intervals.layers[columns], without.layers[columns], check_exact=True)
    assert "raw_lo" not in without.layers and not without.bootstrap

    records = with_intervals.layers
    for kind in ("raw", "adjusted"):
        defined = records[f"{kind}_lo"].notna()
        assert (records.loc[defined, f"{kind}_lo"] <= records.loc[defined, f"{kind}_hi"]).all()
    assert records[["raw_lo", "raw_hi"]].notna().all().all()  # every metric has a raw interval
    adjusted = records["baseline_source"] != ""
    assert records.loc[adjusted, ["adjusted_lo", "adjusted_hi"]].notna().all().all()
    assert set(records["resampled"]) >= {"sentences", "sampled occurrences", "words (MEV); baseline: sampled occurrences"}

    document = json.loads((tmp_path / "a" / "contextuality.json").read_text())
    design = document["bootstrap"]
    assert (design["B"], design["level"], design["seed"], design["interval"]) == (300, 0.95, 0, "percentile")
    tests = {(t["metric"], t["value"], t["layer"]): t for t in design["adjacent_layers"]}
    rise = tests[("anisotropy_exact", "raw", 1)]
    assert rise["difference"] > 0.1 and rise["lo"] > 0 and rise["p_value"] < 0.01
    for metric in ("anisotropy_exact", "self_similarity", "intra_sentence_similarity"):
        doubled = tests[(metric, "raw", 2)]  # the same cosines: no difference in any resample
        assert doubled["difference"] == 0 and doubled["p_value"] == 1.0
    layers_csv = rundir.read_csv(tmp_path / "a" / "contextuality_layers.csv")
    assert {"raw_lo", "raw_hi", "adjusted_lo", "adjusted_hi"} <= set(layers_csv.columns)
    np.testing.assert_allclose(layers_csv["raw_lo"], records["raw_lo"], rtol=1e-15)

    # the report: error bands on the per-layer figures, the adjacent-layer tests in its findings
    from lmgeom.report.build import adjacent_layer_findings
    from lmgeom.report.data import load_run
    from lmgeom.report.figures import plotly_figure, run_charts

    charts = {chart.name: chart for chart in run_charts(load_run(tmp_path / "a"))}
    selfsim = charts["self_similarity"]
    lo, hi = selfsim.series[0].band
    np.testing.assert_array_equal(lo, records.loc[records["metric"] == "self_similarity", "raw_lo"])
    np.testing.assert_array_equal(hi, records.loc[records["metric"] == "self_similarity", "raw_hi"])
    assert selfsim.subtitle.endswith("bands: 95% percentile bootstrap, 300 resamples of sentences")
    traces = plotly_figure(selfsim)["data"]
    assert [t.get("fill") for t in traces[:3]] == [None, "none", "tonexty"] and traces[2]["y"] == list(lo)
    findings = adjacent_layer_findings(document)
    assert findings[0].startswith("SelfSim (raw) from layer to layer (paired bootstrap, B = 300") and "1→2" in findings[0]


def test_mev_baselines_are_resampled_a_fixed_number_of_times_and_paired_cyclically(tmp_path, monkeypatch):
    """Adjusted MEV replicate b is raw replicate b minus baseline replicate b mod MEV_BASELINE_RESAMPLES;
    the design records how many baseline resamples there were."""
    import lmgeom.engine.bootstrap as engine_bootstrap

    monkeypatch.setattr(engine_bootstrap, "MEV_BASELINE_RESAMPLES", 7)
    kept = {}
    original = engine_bootstrap.layer_replicates

    def keep(values, rows):
        out = original(values, rows)
        kept[len(kept)] = (values, out)
        return out

    import lmgeom.stages.contextuality as contextuality

    monkeypatch.setattr(contextuality, "layer_replicates", keep)
    result = analyze_store(_store(tmp_path / "store"), min_contexts=2, bootstrap=120, engine="local")
    assert result.bootstrap["mev_baseline_resamples"] == 7
    checked = 0
    for values, out in kept.values():
        for variant, baseline in values["bootstrap_sample_replicates"]["mev_baseline"].items():
            if f"mev_{variant}" not in out:
                continue
            assert len(baseline) == 7
            reps = out[f"mev_{variant}"]
            np.testing.assert_array_equal(reps["adjusted"], reps["raw"] - baseline[np.arange(120) % 7])
            checked += 1
    assert checked >= 3


def test_seeded_intervals_are_the_same_in_a_new_process(tmp_path):
    store = _store(tmp_path / "store")
    here = analyze_store(store, min_contexts=2, bootstrap=200, seed=4, engine="local")
    script = ("import json, sys; from lmgeom.stages.analysis import analyze_store; "
              "r = analyze_store(sys.argv[1], min_contexts=2, bootstrap=200, seed=4, engine='local'); "
              "print(json.dumps(r.layers[['raw_lo', 'raw_hi', 'adjusted_lo', 'adjusted_hi']].to_numpy().tolist()))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "store")], capture_output=True, text=True, env=env, check=True)
    there = np.array(json.loads(out.stdout.strip().splitlines()[-1]), dtype=float)
    np.testing.assert_array_equal(there, here.layers[["raw_lo", "raw_hi", "adjusted_lo", "adjusted_hi"]].to_numpy(dtype=float))
    other_seed = analyze_store(store, min_contexts=2, bootstrap=200, seed=5, engine="local")
    assert not np.array_equal(other_seed.layers["raw_lo"].to_numpy(), here.layers["raw_lo"].to_numpy())


def test_analyze_prints_the_intervals_within_80_columns_and_refuses_a_bad_level(tmp_path):
    from typer.testing import CliRunner

    from lmgeom.cli.main import app

    _store(tmp_path / "store")
    outcome = CliRunner().invoke(app, ["analyze", str(tmp_path / "store"), "--min-contexts", "2", "--bootstrap", "200",
                                       "--confidence", "0.9", "--engine", "local", "--out", str(tmp_path / "a")],
                                 env={"COLUMNS": "80"})
    assert outcome.exit_code == 0, outcome.output
    assert "90% intervals: percentile bootstrap, B=200" in outcome.output
    assert max(map(len, outcome.output.splitlines())) <= 80 and "…" not in outcome.output
    written = pd.read_csv(tmp_path / "a" / "contextuality_layers.csv").set_index(["layer", "metric"])
    lo, hi = written.loc[(1, "self_similarity"), ["adjusted_lo", "adjusted_hi"]]
    assert f"{lo:.3f}–{hi:.3f}" in outcome.output
    refused = CliRunner().invoke(app, ["analyze", str(tmp_path / "store"), "--confidence", "1.5"])
    assert refused.exit_code == 2 and "confidence" in refused.output


def test_every_replicate_of_the_identity_resample_is_its_estimate(tmp_path, monkeypatch):
    """Each interval resamples the statistic its estimate is: drawn with every unit once, every replicate
    (raw and adjusted, of every metric) equals the estimate."""
    import lmgeom.engine.bootstrap as engine_bootstrap

    monkeypatch.setattr(engine_bootstrap, "draws", lambda n_units, n_resamples, seed, stream: np.ones((n_resamples, n_units), dtype=np.int32))
    from lmgeom.metrics.bootstrap import RoughIntervalsWarning

    with pytest.warns(RoughIntervalsWarning):
        records = analyze_store(_store(tmp_path / "store"), min_contexts=2, bootstrap=3, engine="local").layers
    for kind in ("raw", "adjusted"):
        defined = records[f"{kind}_lo"].notna()
        assert defined.sum() >= (len(records) if kind == "raw" else 1)
        for end in ("lo", "hi"):
            np.testing.assert_allclose(records.loc[defined, f"{kind}_{end}"], records.loc[defined, kind], rtol=0, atol=1e-12)


def test_fewer_than_100_resamples_warn_once_and_are_flagged_rough(tmp_path):
    from typer.testing import CliRunner

    from lmgeom.cli.main import app
    from lmgeom.metrics.bootstrap import RoughIntervalsWarning

    store = _store(tmp_path / "store")
    with pytest.warns(RoughIntervalsWarning, match="`bootstrap=1` resamples, fewer than 100: both ends are the one") as caught:
        rough = analyze_store(store, min_contexts=2, bootstrap=1, engine="local", write_to=tmp_path / "a")
    assert len([w for w in caught if issubclass(w.category, RoughIntervalsWarning)]) == 1
    document = json.loads((tmp_path / "a" / "contextuality.json").read_text())
    assert document["settings"]["bootstrap_rough"] is True and "rough intervals" in document["bootstrap"]["rough"]
    assert rough.bootstrap["rough"] == document["bootstrap"]["rough"]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", RoughIntervalsWarning)  # none at 100 resamples
        enough = analyze_store(store, min_contexts=2, bootstrap=100, engine="local", write_to=tmp_path / "b")
    assert "rough" not in enough.bootstrap
    assert json.loads((tmp_path / "b" / "contextuality.json").read_text())["settings"]["bootstrap_rough"] is False

    outcome = CliRunner().invoke(app, ["analyze", str(tmp_path / "store"), "--min-contexts", "2", "--bootstrap", "5",
                                       "--engine", "local", "--out", str(tmp_path / "c")], env={"COLUMNS": "200"})
    assert outcome.exit_code == 0, outcome.output
    flat = " ".join(outcome.stderr.split())  # standard error: the progress lines and the warning
    warning = ("warning: rough intervals: --bootstrap 5 resamples, fewer than 100: each end is one of only 5 "
               "replicates, not a quantile of the bootstrap distribution; give --bootstrap 1000 or more for "
               "intervals to report")
    assert flat.count("warning:") == 1 and warning in flat  # once
    assert "B=5 — rough, fewer than 100 resamples" in outcome.stdout
    assert any(line.startswith("note: rough intervals: --bootstrap 5") for line in outcome.stdout.splitlines())


def test_lanczos_that_reaches_its_last_step_ends_with_the_exact_top_eigenpair() -> None:
    """Rows whose spectrum is nearly flat (a random-init model's): no resample converges before the last
    Lanczos step, which must end the iteration (not index a basis vector past it) and hand the resamples
    to the exact solution."""
    from lmgeom.metrics.bootstrap import DENSE_DIM, _scatter, _top_eigenpairs

    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, DENSE_DIM + 16))
    m = rng.poisson(1.0, size=(3, len(X))).astype(np.float64)
    values, vectors = _top_eigenpairs(X, m, X.sum(axis=0), centred=False, max_steps=5)
    for b in range(len(m)):
        eigenvalues, eigenvectors = np.linalg.eigh(_scatter(X, m[b], False))
        assert values[b] == pytest.approx(eigenvalues[-1], rel=1e-10)
        assert abs(vectors[b] @ eigenvectors[:, -1]) == pytest.approx(1.0, abs=1e-8)
