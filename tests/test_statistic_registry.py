"""A statistic declared once, with its measures, reaches the analysis, the CLI, the report and
`compare`: shown with the effective rank of each word's occurrences (declared in
engine/statistics.py alone), checked against numpy's SVD."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from lmgeom.cli.main import app
from lmgeom.engine import AnalysisOptions
from lmgeom.engine.options import CONTEXTUALITY_STATISTICS
from lmgeom.engine.registry import measure, measures, registered_statistics, statistic
from lmgeom.report.compare import COMPARED
from lmgeom.report.labels import LABELS
from lmgeom.stages import analyze_store
from lmgeom.store import RepresentationStore, write_store_from_arrays

DATA = Path(__file__).parent / "data"
WITH_RANK = (*CONTEXTUALITY_STATISTICS, "word_effective_rank")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> RepresentationStore:
    """The fixed store of the tests: 36 sentences with CLS/SEP and punctuation, 4 layers x 12, a
    duplicated row and a zero row."""
    arrays = np.load(DATA / "fixed_store.npz")
    words = json.loads((DATA / "fixed_store_words.json").read_text())
    layers = [arrays[f"layer{layer}"] for layer in range(len(arrays.files))]
    return write_store_from_arrays(tmp_path_factory.mktemp("fixed") / "store", layers, words["sentences"],
                                   is_special=words["is_special"], model_id="fixed")


def _effective_rank(X: np.ndarray) -> float:
    """exp(entropy) of the normalised singular values of the centred non-zero rows, by numpy's SVD."""
    X = X[np.linalg.norm(X, axis=1) > 0].astype(np.float64)
    if len(X) < 2:
        return math.nan
    singular = np.linalg.svd(X - X.mean(axis=0), compute_uv=False)
    p = singular / singular.sum()
    p = p[p > 0]
    return float(np.exp(-(p * np.log(p)).sum()))


def test_every_statistic_is_registered_without_an_import_for_its_side_effect() -> None:
    """The registry gathers the declaring modules' lists: the released code's and the bootstrap's
    statistics are there without anything importing those modules first."""
    names = registered_statistics()
    assert {"baseline", "self_similarity", "mev", "released_sample", "self_similarity_released", "bootstrap",
            "word_effective_rank"} <= set(names)
    assert len(names) == len(set(names))
    assert [m.name for m in statistic("mev").measures] == ["mev_uncentred", "mev_centred", "mev_svd_ratio"]


def test_labels_units_and_compared_charts_come_from_the_declared_measures() -> None:
    from lmgeom.engine.bootstrap import UNITS
    from lmgeom.report.figures import ESTIMATORS, RESAMPLED

    for m in measures():
        assert LABELS[m.name] == m.label and ESTIMATORS[m.name] == m.estimator
        if m.baseline:
            assert LABELS[f"{m.name}_adjusted"] == m.adjusted
    assert LABELS["mev_svd_ratio_adjusted"] == "MEV adj" and LABELS["self_similarity_adjusted"] == "SelfSim adj"
    assert UNITS == {"anisotropy_exact": "sentences", "self_similarity": "sentences", "intra_sentence_similarity": "sentences",
                     "anisotropy_sampled": "sampled occurrences"}
    assert RESAMPLED["mev_centred"] == "words"
    compared = {name: (metric, column) for name, metric, column, _ in COMPARED}
    assert compared["word_effective_rank"] == ("word_effective_rank", "raw") and "word_effective_rank_adjusted" not in compared
    assert compared["self_similarity_adjusted"] == ("self_similarity", "adjusted") and "anisotropy_sampled" not in compared
    with pytest.raises(ValueError, match="no registered statistic has the measure 'nope'"):
        measure("nope")


def test_word_effective_rank_equals_numpy_svd(store: RepresentationStore) -> None:
    result = analyze_store(store, AnalysisOptions(statistics=WITH_RANK, min_contexts=2, bootstrap=0))
    tokens = store.token_columns("word_id", "is_punct", "is_special")
    selected = ~(tokens["is_punct"].to_numpy() | tokens["is_special"].to_numpy())
    word_ids = tokens["word_id"].to_numpy()
    checked = 0
    for layer in store.layers:
        X = np.asarray(store.layer(layer)[:])
        rows = result.words.loc[result.words["layer"] == layer]
        expected = [_effective_rank(X[selected & (word_ids == word_id)]) for word_id in rows["word_id"]]
        # lmgeom's effective rank reads the singular values off the Gram matrix's eigenvalues: a singular value
        # that is exactly 0 (the store's duplicated row) comes out near sqrt(eps) of the largest, which moves
        # the entropy by ~1e-7; elsewhere the two agree to 1e-12
        np.testing.assert_allclose(rows["word_effective_rank"].to_numpy(), expected, rtol=1e-6, equal_nan=True)
        record = result.layers.loc[(result.layers["layer"] == layer) & (result.layers["metric"] == "word_effective_rank")]
        assert record["raw"].item() == pytest.approx(np.nanmean(rows["word_effective_rank"]), rel=1e-12)
        assert record["n"].item() == int(np.count_nonzero(~np.isnan(expected)))
        checked += int(np.count_nonzero(~np.isnan(expected)))
    assert checked > 20
    # the other statistics' numbers do not move when it is added
    plain = analyze_store(store, AnalysisOptions(min_contexts=2, bootstrap=0))
    merged = result.layers.merge(plain.layers, on=["layer", "metric"], suffixes=("", "_plain"))
    assert len(merged) == len(plain.layers)
    np.testing.assert_array_equal(merged["raw"].to_numpy(), merged["raw_plain"].to_numpy())


def test_the_cli_and_the_report_show_a_statistic_asked_for(store: RepresentationStore, tmp_path: Path) -> None:
    from lmgeom.report import build_report

    out = tmp_path / "run"
    outcome = CliRunner().invoke(app, ["analyze", str(store.path), "--min-contexts", "2", "--bootstrap", "0",
                                       "--statistics", "word_effective_rank", "--out", str(out)], env={"COLUMNS": "100"})
    assert outcome.exit_code == 0, outcome.output
    assert "more statistics" in outcome.output and "eff. rank" in outcome.output
    layers = pd.read_csv(out / "contextuality_layers.csv")
    assert (layers["metric"] == "word_effective_rank").sum() == len(store.layers)
    bad = CliRunner().invoke(app, ["analyze", str(store.path), "--statistics", "word_rank", "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "unknown statistic 'word_rank'" in bad.output and "--statistics" in bad.output
    # the report: a section and a chart of its own, from its measure's title and estimator
    page = build_report(out, out=tmp_path / "report.html").read_text()
    assert "Effective rank of a word&#x27;s occurrences" in page or "Effective rank of a word's occurrences" in page
