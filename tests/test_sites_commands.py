"""`--sites SITE` on calibrate, similarity and static-embeddings: each reads that site's layers (its numbers
equal the same computation by hand on the site's rows), writes into STORE/site_results/<site>/ with the site
in its settings, leaves resid_post's results where they were, and refuses a site the store does not hold."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from lmgeom.cli.main import app
from lmgeom.engine.selection import select_rows
from lmgeom.metrics.contextuality import sample_indexes
from lmgeom.metrics.isotropy import REPORT_MAX_ROWS, isotropy_report
from lmgeom.stages.extraction import extract_model
from lmgeom.store import RepresentationStore

runner = CliRunner()
SITE = "attn_out"


def flat(output: str) -> str:
    return " ".join(output.split())


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """A store of resid_post and attn_out, and one of resid_post only, of the same 30 Lee sentences."""
    folder = tmp_path_factory.mktemp("sites")
    with_site = extract_model("tiny-gpt2", "lee", out=folder / "sites", limit=30, device="cpu", sites=SITE)
    plain = extract_model("tiny-gpt2", "lee", out=folder / "plain", limit=30, device="cpu")
    assert with_site.sites == ["resid_post", SITE] and plain.sites == ["resid_post"]
    return with_site.url, plain.url


@pytest.fixture()
def store_copy(stores, tmp_path):
    """A fresh copy of the store with attn_out (the commands write into it)."""
    path = tmp_path / "store"
    shutil.copytree(stores[0], path)
    return path


def selected(store: RepresentationStore) -> np.ndarray:
    return select_rows(store.tokens).rows  # the default selection: words, no punctuation or special tokens


def site_rows(store: RepresentationStore, layer: int, rows: np.ndarray, site: str = SITE) -> np.ndarray:
    return np.asarray(store.layer(layer, site=site)[:], dtype=np.float64)[rows]


def hand_cka(X: np.ndarray, Y: np.ndarray) -> float:
    """Linear CKA by its definition: ||Yc' Xc||_F^2 / (||Xc' Xc||_F ||Yc' Yc||_F), columns centred."""
    X, Y = X - X.mean(axis=0), Y - Y.mean(axis=0)
    return float(np.linalg.norm(Y.T @ X) ** 2 / (np.linalg.norm(X.T @ X) * np.linalg.norm(Y.T @ Y)))


# ---- calibrate ------------------------------------------------------------------------------------------------

def test_calibrate_reads_a_site_into_its_folder(store_copy):
    from lmgeom.calibrate import make_calibrator

    result = runner.invoke(app, ["calibrate", str(store_copy), "--sites", SITE, "--methods", "whitening,abtt",
                                 "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert f"site {SITE}: layers 1, 2, 3" in flat(result.output)
    folder = store_copy / "site_results" / SITE
    assert not (store_copy / "calibration.json").exists() and not (store_copy / "calibrators").exists()
    document = json.loads((folder / "calibration.json").read_text())
    assert (folder / "calibration.csv").exists()
    assert sorted(p.name for p in (folder / "calibrators").iterdir()) == sorted(
        f"{m}-L{layer}.npz" for m in ("whitening", "abtt") for layer in (1, 2, 3))
    assert document["provenance"]["settings"]["site"] == SITE and document["settings"]["site"] == SITE
    assert all(fit["site"] == SITE for fit in document["fits"])
    assert document["settings"]["layers"] == [1, 2, 3]

    # before: the isotropy of the site's rows; after whitening: of those rows whitened by a fit on all of them
    store = RepresentationStore.open(store_copy)
    rows = selected(store)
    evaluated = sample_indexes(rows, REPORT_MAX_ROWS, 0)
    records = {(r["layer"], r["method"], r["measure"]): r for r in document["records"]}
    for layer in (1, 2, 3):
        X = site_rows(store, layer, evaluated)
        before = isotropy_report(X, seed=0, max_rows=None)
        whitened = isotropy_report(make_calibrator("whitening").fit(site_rows(store, layer, rows)).transform(X),
                                   seed=0, max_rows=None)
        for measure in ("log_partition_isotropy", "isoscore", "average_cosine", "effective_rank"):
            assert records[layer, "whitening", measure]["before"] == pytest.approx(before[measure], rel=1e-9, abs=1e-12)
            assert records[layer, "whitening", measure]["after"] == pytest.approx(whitened[measure], rel=1e-6, abs=1e-9)
        resid = isotropy_report(site_rows(store, layer, evaluated, "resid_post"), seed=0, max_rows=None)
        assert records[layer, "whitening", "average_cosine"]["before"] != pytest.approx(resid["average_cosine"], rel=1e-3)

    # resid_post stays the default and writes where it always did, with no site in its settings
    plain = runner.invoke(app, ["calibrate", str(store_copy), "--methods", "whitening", "--layers", "0,2", "--device", "cpu"])
    assert plain.exit_code == 0, plain.output
    main = json.loads((store_copy / "calibration.json").read_text())
    assert "site" not in main["provenance"]["settings"] and "site" not in main["settings"]
    assert main["settings"]["layers"] == [0, 2] and (store_copy / "calibrators" / "whitening-L2.npz").exists()
    X = site_rows(store, 2, evaluated, "resid_post")
    before = isotropy_report(X, seed=0, max_rows=None)
    record = next(r for r in main["records"] if (r["layer"], r["measure"]) == (2, "isoscore"))
    assert record["before"] == pytest.approx(before["isoscore"], rel=1e-9)
    # the site's folder is untouched by resid_post's calibration
    assert json.loads((folder / "calibration.json").read_text()) == document


def test_calibrate_store_reads_the_site_of_its_options(store_copy):
    from lmgeom.stages.calibration import CalibrationOptions, calibrate_store

    store = RepresentationStore.open(store_copy)
    options = CalibrationOptions(methods=("abtt",), layers="2", site=SITE)
    assert options.to_settings()["site"] == SITE and "site" not in CalibrationOptions().to_settings()
    assert CalibrationOptions.from_settings(options.to_settings()) == options
    viewed = calibrate_store(store.at_site(SITE), CalibrationOptions(methods=("abtt",), layers="2", site=SITE), save=False)
    direct = calibrate_store(store, options, save=False)
    assert viewed.records == direct.records and direct.store.site == SITE


# ---- similarity ------------------------------------------------------------------------------------------------

def test_similarity_reads_a_site_into_its_folder(store_copy):
    result = runner.invoke(app, ["similarity", str(store_copy), "--sites", SITE, "--measures", "cka,procrustes,rsa",
                                 "--permutations", "0", "--procrustes-permutations", "0", "--rows", "200"])
    assert result.exit_code == 0, result.output
    assert f"site {SITE}" in flat(result.output)
    assert not (store_copy / "similarity.json").exists()
    document = json.loads((store_copy / "site_results" / SITE / "similarity.json").read_text())
    assert (store_copy / "site_results" / SITE / "similarity.csv").exists()
    assert document["provenance"]["settings"]["site"] == SITE and document["settings"]["site"] == SITE
    assert document["layers_a"] == document["layers_b"] == [1, 2, 3]
    store = RepresentationStore.open(store_copy)
    rows = selected(store)
    cka = np.asarray(document["matrices"]["cka"])
    for i, a in enumerate((1, 2, 3)):
        for j, b in enumerate((1, 2, 3)):
            assert cka[i, j] == pytest.approx(hand_cka(site_rows(store, a, rows), site_rows(store, b, rows)), rel=1e-9)

    plain = runner.invoke(app, ["similarity", str(store_copy), "--measures", "cka", "--permutations", "0",
                                "--procrustes-permutations", "0", "--rows", "200"])
    assert plain.exit_code == 0, plain.output
    main = json.loads((store_copy / "similarity.json").read_text())
    assert "site" not in main["provenance"]["settings"] and "site" not in main["settings"]
    assert main["layers_a"] == [0, 1, 2, 3]
    resid = np.asarray(main["matrices"]["cka"])
    assert resid[1, 2] == pytest.approx(hand_cka(site_rows(store, 1, rows, "resid_post"), site_rows(store, 2, rows, "resid_post")),
                                         rel=1e-9)
    assert resid[1, 2] != pytest.approx(cka[0, 1], rel=1e-3)


def test_similarity_of_two_stores_reads_the_site_of_both(stores, store_copy, tmp_path):
    from lmgeom.stages.similarity import SimilarityOptions, similarity_matrix

    store = RepresentationStore.open(store_copy)
    options = SimilarityOptions(measures=("cka",), site=SITE, permutations=0, procrustes_permutations=0, sample=100)
    across = similarity_matrix(store_copy, stores[0], options)
    assert across.layers_a == across.layers_b == [1, 2, 3] and across.settings["site"] == SITE
    rows = selected(store)
    for i, a in enumerate((1, 2, 3)):
        assert across.values["cka"][i, i] == pytest.approx(1, abs=1e-9)
        assert across.values["cka"][i, 2] == pytest.approx(hand_cka(site_rows(store, a, rows), site_rows(store, 3, rows)), rel=1e-9)
    # the command writes it in the site's folder, below similarity/<the second store's name>/
    result = runner.invoke(app, ["similarity", str(store_copy), stores[0], "--sites", SITE, "--measures", "cka",
                                 "--permutations", "0", "--procrustes-permutations", "0", "--rows", "100"])
    assert result.exit_code == 0, result.output
    written = store_copy / "site_results" / SITE / "similarity" / "sites" / "similarity.json"
    assert json.loads(written.read_text())["settings"]["site"] == SITE
    # a second store without the site is refused, naming the option, the store and the sites it holds
    for first, second, which in ((store_copy, stores[1], "second"), (stores[1], store_copy, "first")):
        refused = runner.invoke(app, ["similarity", str(first), str(second), "--sites", SITE, "--out", str(tmp_path / "x")])
        assert refused.exit_code == 2, refused.output
        text = flat(refused.output)
        assert "--sites" in text and f"{which} store" in text and "holds the sites resid_post" in text
    assert not (tmp_path / "x").exists()


def test_pair_tasks_in_a_worker_read_the_plans_site(store_copy):
    """A worker opens the store by its URL (at resid_post): the plan's sites say which to read."""
    from lmgeom.engine.pairs import PairMerger, plan_pairs, run_pair_task

    store = RepresentationStore.open(store_copy)
    view = store.at_site(SITE)
    rows = selected(store)
    plan, plan_rows = plan_pairs([view], (rows, rows), [((0, 1), (0, 3))], measures=("cka",), chunk_rows=100,
                                 max_state_bytes=1 << 30, row_parts=2)
    assert plan.sites == (SITE, SITE) and plan.to_json()["sites"] == [SITE, SITE]
    merger = PairMerger(plan)
    for task in plan.tasks:
        merger.add(run_pair_task(RepresentationStore.open(store.url), plan, plan_rows, task))
    assert merger.measures((0, 1), (0, 3))["cka"] == pytest.approx(hand_cka(site_rows(store, 1, rows), site_rows(store, 3, rows)),
                                                                   rel=1e-9)


# ---- static embeddings ------------------------------------------------------------------------------------------

def test_static_embeddings_read_a_site_into_its_folder(store_copy, tmp_path):
    from gensim.models import KeyedVectors

    data = tmp_path / "data"
    data.mkdir()
    common = ["--layer", "2", "--min-contexts", "2", "--data-dir", str(data)]
    result = runner.invoke(app, ["static-embeddings", str(store_copy), "--sites", SITE, *common])
    assert result.exit_code == 0, result.output
    assert f"layer 2 of site {SITE}" in flat(result.output)
    folder = store_copy / "site_results" / SITE / "static"
    assert sorted(p.name for p in folder.iterdir()) == ["2.benchmarks.csv", "2.benchmarks.json", "2.kv", "2.txt"]
    assert not (store_copy / "static").exists()
    document = json.loads((folder / "2.benchmarks.json").read_text())
    assert document["provenance"]["settings"]["site"] == SITE and document["settings"]["site"] == SITE

    # each word's vector: the first right singular vector of its occurrences at the site's layer 2, sign with the mean
    store = RepresentationStore.open(store_copy)
    vectors = KeyedVectors.load(str(folder / "2.kv"))
    rows = selected(store)
    words = store.tokens["word"].to_numpy()[rows]
    site_layer = site_rows(store, 2, rows)
    for word in vectors.index_to_key[:5]:
        X = site_layer[words == word]
        first = np.linalg.svd(X, full_matrices=False)[2][0]
        first = first if first @ X.mean(axis=0) >= 0 else -first
        assert np.abs(vectors[word] - first).max() < 1e-5, word

    # the layer-0 baseline is the embedding output (resid_post's layer 0) at every site
    from lmgeom.engine import AnalysisOptions
    from lmgeom.stages.static import static_embeddings

    distilled = static_embeddings(store, AnalysisOptions(min_contexts=2, site=SITE), layer=2)
    assert distilled.site == SITE and distilled.words[:5] == vectors.index_to_key[:5]
    embedding = site_rows(store, 0, rows, "resid_post")
    for index, word in enumerate(distilled.words[:5]):
        assert np.abs(distilled.vectors["layer0_mean"][index] - embedding[words == word].mean(axis=0)).max() < 1e-6
        assert np.abs(distilled.vectors["mean"][index] - site_layer[words == word].mean(axis=0)).max() < 1e-6

    # resid_post stays the default and writes where it always did
    plain = runner.invoke(app, ["static-embeddings", str(store_copy), *common])
    assert plain.exit_code == 0, plain.output
    main = json.loads((store_copy / "static" / "2.benchmarks.json").read_text())
    assert "site" not in main["provenance"]["settings"] and "site" not in main["settings"]
    resid = KeyedVectors.load(str(store_copy / "static" / "2.kv"))
    word = resid.index_to_key[0]
    assert np.abs(resid[word] - vectors[word]).max() > 1e-3

    # layer 0 holds resid_post only
    zero = runner.invoke(app, ["static-embeddings", str(store_copy), "--sites", SITE, "--layer", "0", "--data-dir", str(data)])
    assert zero.exit_code == 2 and "layer 0" in flat(zero.output) and SITE in flat(zero.output)


def test_a_sites_result_files_are_read_as_those_at_the_top(tmp_path):
    from pathlib import Path

    from lmgeom import rundir

    assert rundir.site_results(tmp_path, "resid_post") == tmp_path
    assert rundir.site_results(tmp_path, SITE) == tmp_path / "site_results" / SITE
    assert rundir.site_results("memory://run", "h.{i}.mlp") == "memory://run/site_results/h._i_.mlp"
    for relative, spec in (("calibration.json", rundir.CALIBRATION), ("calibrators/abtt-L2.npz", rundir.CALIBRATOR),
                           ("static/2.benchmarks.json", rundir.STATIC_BENCHMARKS), ("similarity.csv", rundir.SIMILARITY_CSV)):
        assert rundir.spec_of(relative) is spec and rundir.spec_of(f"site_results/{SITE}/{relative}") is spec, relative
    assert rundir.spec_of(str(Path("site_results") / SITE / "notes.txt")) is None


# ---- refusals ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", [["calibrate"], ["similarity"], ["static-embeddings", "--layer", "1"], ["analyze"],
                                     ["geometry"]])
def test_a_site_the_store_lacks_is_refused_naming_the_option_and_the_sites(stores, command):
    store = stores[0]
    name, *rest = command
    missing = runner.invoke(app, [name, store, *rest, "--sites", "mlp_out"])
    assert missing.exit_code == 2, missing.output
    text = flat(missing.output)
    assert "--sites" in text and "'mlp_out' is not stored" in text and f"resid_post, {SITE}" in text
    several = runner.invoke(app, [name, store, *rest, "--sites", f"{SITE},resid_post"])
    assert several.exit_code == 2 and "one site at a time" in flat(several.output) and "--sites" in flat(several.output)
    unknown = runner.invoke(app, [name, store, *rest, "--sites", "attn"])
    assert unknown.exit_code == 2 and "--sites" in flat(unknown.output) and "attn_out" in flat(unknown.output)
    assert not (RepresentationStore.open(store).location.local_path / "site_results").exists()
