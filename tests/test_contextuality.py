"""Contextuality metrics against brute-force pairwise references, closed-form cases and sklearn."""

from __future__ import annotations

import json
import tempfile

import numpy as np
import pandas as pd
import pytest
import typer
import zarr
from sklearn.decomposition import PCA, TruncatedSVD
from typer.testing import CliRunner

from lmgeom.cli.analyze import register
from lmgeom.metrics import (
    MEV_VARIANTS,
    AverageCosineAccumulator,
    IntraSentenceAccumulator,
    MEVAccumulator,
    SelfSimilarityAccumulator,
    average_cosine,
    first_principal_direction,
    intra_sentence_similarity,
    mev,
    occurrence_spectrum,
    sampled_average_cosine,
    self_similarity,
)
from lmgeom.metrics.base import load_states, save_states
from lmgeom.metrics.contextuality import sample_indexes
from lmgeom.stages import analyze_store
from lmgeom.store import RepresentationStore, layout, write_store_from_arrays
from helpers import BANK_SENTENCES


# ---- slow, obviously correct references --------------------------------------------------------

def cos(a, b):
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def pairwise_mean_cosine(X):
    X = [x for x in X if np.linalg.norm(x) > 0]
    values = [cos(X[j], X[k]) for j in range(len(X)) for k in range(len(X)) if j != k]
    return float(np.mean(values))


def intra_reference(X):
    X = X[np.linalg.norm(X, axis=1) > 0]
    centre = X.mean(axis=0)
    return float(np.mean([cos(centre, x) for x in X]))


def uncentred_mev_reference(X):
    singular = np.linalg.svd(X, compute_uv=False)
    return singular[0] ** 2 / np.sum(singular**2)


def mev_references(X):
    return {
        "uncentred": uncentred_mev_reference(X),
        "centred": PCA(n_components=1, svd_solver="full").fit(X).explained_variance_ratio_[0],
        "svd_ratio": TruncatedSVD(n_components=1, algorithm="arpack").fit(X).explained_variance_ratio_[0],
    }


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def clustered(rng, n_words=6, n_rows=80, dim=12):
    """Rows near a per-word centre plus a shared offset (anisotropic), with integer word ids."""
    centres = rng.normal(size=(n_words, dim))
    words = rng.integers(0, n_words, n_rows)
    X = centres[words] + 0.7 * rng.normal(size=(n_rows, dim)) + 1.5
    return X, words


# ---- closed forms equal brute force --------------------------------------------------------------

def test_average_cosine_equals_pairwise_and_leaves_out_zero_rows(rng):
    X = rng.normal(size=(40, 7)) + 0.5
    X[5] = 0.0
    assert average_cosine(X) == pytest.approx(pairwise_mean_cosine(X), abs=1e-12)
    accumulator = AverageCosineAccumulator().add(X)
    assert (accumulator.n_points, accumulator.n_zero) == (39, 1)


def test_sampled_average_cosine_is_the_exact_mean_over_a_seeded_sample(rng):
    X = rng.normal(size=(300, 5)) + 1.0
    sample = sample_indexes(np.arange(300), 50, seed=3)
    assert sampled_average_cosine(X, n=50, seed=3) == pytest.approx(pairwise_mean_cosine(X[sample]), abs=1e-12)
    assert sampled_average_cosine(X, n=50, seed=3) != sampled_average_cosine(X, n=50, seed=4)
    assert sampled_average_cosine(X, n=1000, seed=0) == pytest.approx(average_cosine(X), abs=1e-12)


def test_self_similarity_equals_pairwise_with_two_occurrences_and_duplicates(rng):
    X, words = clustered(rng)
    words[:2] = 9  # a word with exactly 2 occurrences
    words[2:5] = 10
    X[2:5] = X[2]  # a word whose occurrences are duplicates
    X[5] = X[6]  # duplicate rows across words
    words[7] = 11  # a word with a single occurrence: no self-similarity
    values = self_similarity(X, words)
    assert 11 not in values.index
    assert set(values.index) == {w for w in np.unique(words) if (words == w).sum() >= 2}
    for word, value in values.items():
        assert value == pytest.approx(pairwise_mean_cosine(X[words == word]), abs=1e-9)
    assert values[10] == pytest.approx(1.0, abs=1e-12)
    assert self_similarity(X, words, min_count=20).index.isin([w for w in np.unique(words) if (words == w).sum() >= 20]).all()


def test_self_similarity_takes_any_labels(rng):
    X = rng.normal(size=(6, 4))
    labels = np.array(["bank", "river", "bank", "river", "bank", "sea"])
    values = self_similarity(X, labels)
    assert list(values.index) == ["bank", "river"]
    assert values["bank"] == pytest.approx(pairwise_mean_cosine(X[labels == "bank"]), abs=1e-12)


def test_intra_sentence_similarity_equals_reference_including_one_sentence_corpus(rng):
    X = rng.normal(size=(30, 6)) + 0.3
    sentences = np.repeat(np.arange(5), [1, 9, 4, 10, 6])
    values = intra_sentence_similarity(X, sentences)
    assert list(values.index) == [0, 1, 2, 3, 4]
    for sentence, value in values.items():
        assert value == pytest.approx(intra_reference(X[sentences == sentence]), abs=1e-9)
    assert values[0] == pytest.approx(1.0)  # one word: it is its own mean
    single = intra_sentence_similarity(X, np.zeros(30, dtype=int))
    assert single[0] == pytest.approx(intra_reference(X), abs=1e-9)


# ---- known cases ---------------------------------------------------------------------------------

def test_identical_vectors_have_self_similarity_and_uncentred_mev_one(rng):
    X = np.tile(rng.normal(size=8), (5, 1))
    assert self_similarity(X, np.zeros(5, dtype=int))[0] == pytest.approx(1.0, abs=1e-12)
    spectrum = occurrence_spectrum(X)
    assert spectrum.mev("uncentred") == pytest.approx(1.0, abs=1e-12)
    # no spread about the mean: the centred variants are undefined, not noise
    assert np.isnan(spectrum.mev("centred")) and np.isnan(spectrum.mev("svd_ratio"))


def test_orthogonal_and_isotropic_sets_have_zero_baseline(rng):
    assert average_cosine(np.eye(6)) == pytest.approx(0.0, abs=1e-15)
    gaussian = rng.normal(size=(2000, 1000))
    assert abs(average_cosine(gaussian)) < 1e-3
    assert abs(sampled_average_cosine(gaussian, n=500, seed=1)) < 5e-3
    assert average_cosine(gaussian + 3.0) > 0.8  # a common offset makes the cloud anisotropic


# ---- MEV variants against SVD / sklearn --------------------------------------------------------

@pytest.mark.parametrize("n_rows", [4, 9, 30])  # fewer rows than dims (Gram route), and more (X^T X route)
def test_mev_variants_equal_svd_pca_and_truncated_svd(rng, n_rows):
    X = rng.normal(size=(n_rows, 9)) * np.linspace(0.5, 3, 9) + rng.normal(size=9)
    references = mev_references(X)
    spectrum = occurrence_spectrum(X)
    for variant in MEV_VARIANTS:
        assert spectrum.mev(variant) == pytest.approx(references[variant], abs=1e-9), variant
    randomized = TruncatedSVD(n_components=1, algorithm="randomized", n_iter=30, random_state=0).fit(X)
    assert spectrum.mev("svd_ratio") == pytest.approx(randomized.explained_variance_ratio_[0], abs=1e-9)


def test_mev_per_word_and_unknown_variant(rng):
    X, words = clustered(rng, n_rows=60, dim=5)
    for variant in MEV_VARIANTS:
        values = mev(X, words, variant=variant)
        for word, value in values.items():
            assert value == pytest.approx(mev_references(X[words == word])[variant], abs=1e-9)
    with pytest.raises(ValueError, match="unknown MEV variant"):
        mev(X, words, variant="pca")


def test_first_principal_direction_is_top_right_singular_vector_aligned_with_mean(rng):
    for n_rows in (3, 40):
        X = rng.normal(size=(n_rows, 6)) - 2.0  # the mean points away from the positive orthant
        direction = first_principal_direction(X)
        top = np.linalg.svd(X)[2][0]
        assert abs(direction @ top) == pytest.approx(1.0, abs=1e-9)
        assert direction @ X.mean(axis=0) > 0
        assert np.linalg.norm(direction) == pytest.approx(1.0)


# ---- streaming and merging ----------------------------------------------------------------------

def _state_round_trip(accumulator):
    """Through an .npz file without pickle, as shards move between processes."""
    with tempfile.TemporaryDirectory() as directory:
        path = save_states(f"{directory}/state.npz", {"acc": accumulator})
        _, states = load_states(path)
    return states["acc"]


def test_word_accumulators_stream_and_merge_like_one_pass(rng):
    X, words = clustered(rng, n_words=4, n_rows=90, dim=6)  # some words pass d=6 rows mid-stream
    X[17] = 0.0
    one_self = SelfSimilarityAccumulator(4).add(X, word_ids=words)
    one_mev = MEVAccumulator(4).add(X, word_ids=words).result()
    pieces = np.array_split(np.arange(90), [7, 11, 50, 52])
    streamed_self, streamed_mev = SelfSimilarityAccumulator(4), MEVAccumulator(4)
    shards_self, shards_mev = [], []
    for rows in pieces:
        streamed_self.add(X[rows], word_ids=words[rows])
        streamed_mev.add(X[rows], word_ids=words[rows])
        shards_self.append(_state_round_trip(SelfSimilarityAccumulator(4).add(X[rows], word_ids=words[rows])))
        shards_mev.append(_state_round_trip(MEVAccumulator(4).add(X[rows], word_ids=words[rows])))
    merged_self, merged_mev = shards_self[3], shards_mev[3]
    for shard_self, shard_mev in zip(shards_self[:3] + shards_self[4:], shards_mev[:3] + shards_mev[4:]):
        merged_self.merge(shard_self)
        merged_mev.merge(shard_mev)
    for candidate in (streamed_self, merged_self):
        np.testing.assert_allclose(candidate.result(), one_self.result(), atol=1e-12)
        assert candidate.n_zero == 1
    for spectra in (streamed_mev.result(), merged_mev.result()):
        assert spectra.keys() == one_mev.keys()
        for word, spectrum in spectra.items():
            for variant in MEV_VARIANTS:
                assert spectrum.mev(variant) == pytest.approx(one_mev[word].mev(variant), abs=1e-9)
            np.testing.assert_allclose(spectrum.direction, one_mev[word].direction, atol=1e-9)


def test_intra_sentence_accumulator_streams_and_merges_split_sentences(rng):
    X = rng.normal(size=(50, 5)) + 0.2
    sentences = np.repeat(np.arange(8), [3, 9, 1, 12, 5, 7, 2, 11])
    X[20] = 0.0
    reference = intra_sentence_similarity(X, sentences)
    cuts = [2, 4, 13, 14, 30, 31, 49]  # cuts inside sentences, at their edges, and 1-row chunks
    pieces = np.split(np.arange(50), cuts)
    streamed = IntraSentenceAccumulator()
    shards = []
    for rows in pieces:
        streamed.add(X[rows], sentence_ids=sentences[rows])
        shards.append(_state_round_trip(IntraSentenceAccumulator().add(X[rows], sentence_ids=sentences[rows])))
    merged = shards[5]
    for shard in shards[:5] + shards[6:]:
        merged.merge(shard)
    for candidate in (streamed, merged):
        pd.testing.assert_series_equal(candidate.result(), reference, atol=1e-12)
    assert streamed.n_zero == 1
    for sentence, value in reference.items():
        assert value == pytest.approx(intra_reference(X[sentences == sentence]), abs=1e-9)


def test_intra_sentence_rejects_sentences_out_of_order(rng):
    X = rng.normal(size=(6, 3))
    with pytest.raises(ValueError, match="contiguous"):
        intra_sentence_similarity(X, np.array([0, 0, 1, 1, 0, 2]))
    accumulator = IntraSentenceAccumulator().add(X[:4], sentence_ids=np.array([0, 1, 1, 2]))
    with pytest.raises(ValueError, match="sentence 1 appears again"):
        accumulator.add(X[4:], sentence_ids=np.array([1, 3]))


def test_average_cosine_accumulator_merges(rng):
    X = rng.normal(size=(30, 4)) + 1
    merged = _state_round_trip(AverageCosineAccumulator().add(X[:10])).merge(AverageCosineAccumulator().add(X[10:]))
    assert merged.result() == pytest.approx(average_cosine(X), abs=1e-12)


# ---- bad input -----------------------------------------------------------------------------------

def test_nan_rows_name_the_row(rng):
    X = rng.normal(size=(5, 3))
    X[3, 1] = np.nan
    with pytest.raises(ValueError, match="row 3"):
        self_similarity(X, np.zeros(5, dtype=int))
    with pytest.raises(ValueError, match="at least 2 non-zero rows"):
        average_cosine(np.zeros((4, 3)))


# ---- the store-level driver --------------------------------------------------------------------

SENTENCES = BANK_SENTENCES


def synthetic_layers(rng, n_layers=3, dim=8):
    words = [w for sentence in SENTENCES for w in sentence]
    vocab = sorted(set(words))
    centres = rng.normal(size=(len(vocab), dim))
    index = np.array([vocab.index(w) for w in words])
    drift = rng.normal(size=dim)
    return [centres[index] + layer * (0.5 * rng.normal(size=(len(words), dim)) + drift) for layer in range(n_layers)], words


@pytest.fixture
def small_store(tmp_path, rng):
    hidden, _ = synthetic_layers(rng)
    hidden[1][4] = 0.0  # a zero vector in layer 1 ("river" of sentence 0)
    return write_store_from_arrays(tmp_path / "store", hidden, SENTENCES), hidden


def test_analyze_store_matches_brute_force(small_store):
    store, hidden = small_store
    words = np.array([w for sentence in SENTENCES for w in sentence])
    sentence_of_row = np.repeat(np.arange(len(SENTENCES)), [len(s) for s in SENTENCES])
    kept = ~np.isin(words, [".", ","])
    result = analyze_store(store, min_contexts=3, n_samples=20, seed=1, chunk_rows=7)
    table = result.layers.set_index(["layer", "metric"])
    assert set(result.words["word"]) == {"the", "bank", "river", "a"}  # the words in >= 3 sentences
    for layer, X in enumerate(hidden):
        X = X.astype(np.float32).astype(np.float64)
        nonzero = np.linalg.norm(X, axis=1) > 0
        baseline = pairwise_mean_cosine(X[kept])
        assert table.loc[(layer, "anisotropy_exact"), "raw"] == pytest.approx(baseline, abs=1e-9)
        per_word = result.words.loc[result.words["layer"] == layer].set_index("word")
        for word in per_word.index:
            rows = (words == word) & nonzero
            assert per_word.loc[word, "self_similarity"] == pytest.approx(pairwise_mean_cosine(X[rows]), abs=1e-9)
            assert per_word.loc[word, "self_similarity_adjusted"] == pytest.approx(pairwise_mean_cosine(X[rows]) - baseline, abs=1e-9)
            assert per_word.loc[word, "mev_uncentred"] == pytest.approx(uncentred_mev_reference(X[rows]), abs=1e-9)
            for variant in ("centred", "svd_ratio"):
                if layer == 0:  # a word's layer-0 vectors are identical here: no spread, so undefined
                    assert np.isnan(per_word.loc[word, f"mev_{variant}"])
                else:
                    assert per_word.loc[word, f"mev_{variant}"] == pytest.approx(mev_references(X[rows])[variant], abs=1e-9)
        intra = np.mean([intra_reference(X[kept & (sentence_of_row == s)]) for s in range(len(SENTENCES))])
        assert table.loc[(layer, "intra_sentence_similarity"), "raw"] == pytest.approx(intra, abs=1e-9)
        assert table.loc[(layer, "intra_sentence_similarity"), "adjusted"] == pytest.approx(intra - baseline, abs=1e-9)
        sample = sample_indexes(np.flatnonzero(kept), 20, seed=1)
        sample = sample[nonzero[sample]]
        assert table.loc[(layer, "anisotropy_sampled"), "raw"] == pytest.approx(pairwise_mean_cosine(X[sample]), abs=1e-9)
        for variant in MEV_VARIANTS:
            row = table.loc[(layer, f"mev_{variant}")]
            assert row["baseline"] == pytest.approx(mev_references(X[sample])[variant], abs=1e-9)
            assert row["adjusted"] == pytest.approx(row["raw"] - row["baseline"], abs=1e-12, nan_ok=True)
    assert result.counts["zero_vectors_excluded_by_layer"] == {0: 0, 1: 1, 2: 0}
    assert result.counts["rows_punctuation_excluded"] == 2
    assert (result.layers.loc[result.layers["layer"] == 0, "layer_name"] == "embedding output").all()
    # a tiny memory budget splits the words into groups, one pass each: same numbers
    grouped = analyze_store(store, min_contexts=3, n_samples=20, seed=1, mev_memory_mb=1e-4)
    assert grouped.counts["mev_word_groups"] == 4
    pd.testing.assert_frame_equal(grouped.words, result.words, atol=1e-12)


def test_analyze_store_findings_and_files(tmp_path, rng):
    # self-similarity falls with depth by construction: per-occurrence noise grows with the layer
    hidden, words = synthetic_layers(rng, n_layers=5)
    store = write_store_from_arrays(tmp_path / "store", hidden, SENTENCES)
    result = analyze_store(store, min_contexts=2)
    findings = result.findings
    raw = findings["self_similarity_depth"]["raw"]
    assert raw["spearman_rho"] < 0 and raw["p_min"] == pytest.approx(1 / 24)  # 4 layers: one ordering of 4! reaches rho = -1
    assert raw["verdict"] == ("yes" if raw["p_holm"] < 0.05 else "no")
    least = findings["least_self_similar"]
    assert least["layer"] == 4 and len(least["words"]) == min(10, result.counts["words_analysed"])
    stop_share = np.mean([w in {"the", "a", "of", "and", "from", "by", "on", "she", "was"} for w in least["words"]])
    assert least["stopword_share"] == pytest.approx(stop_share)
    baseline = result.summary().set_index("layer")["anisotropy_exact"]
    lower = result.intervals().set_index("layer")["anisotropy_exact_lo"]
    assert findings["anisotropy"]["verdict"] == ("yes" if (lower.loc[1:] > 0.05).all() else "no")
    assert (baseline.loc[1:] >= lower.loc[1:]).all()
    paths = result.write(tmp_path / "out")
    document = json.loads(paths["json"].read_text())
    assert document["kind"] == "contextuality" and "layer 0 is the embedding output" in document["layer_note"]
    assert document["findings"]["self_similarity_depth"]["raw"]["verdict"] == raw["verdict"]
    layers_csv = pd.read_csv(paths["layers_csv"])
    assert {"layer", "layer_name", "metric", "raw", "baseline", "adjusted"} <= set(layers_csv.columns)
    assert len(layers_csv) == 5 * 7
    words_csv = pd.read_csv(paths["words_csv"])
    assert {"word", "count", "contexts", "self_similarity", "mev_svd_ratio_adjusted"} <= set(words_csv.columns)


def test_analyze_store_bad_input(tmp_path, small_store):
    store, hidden = small_store
    with pytest.raises(ValueError, match=r"no word occurs in at least 7 distinct sentences .*`min_contexts`"):
        analyze_store(store, min_contexts=7)
    with pytest.raises(ValueError, match="in 6 sentences"):  # the counts are in the message
        analyze_store(store, min_contexts=7)
    with pytest.raises(ValueError, match="at least 2"):
        analyze_store(store, min_contexts=1)
    array = zarr.open_array(str(layout.layer_path(store.path, 2)), mode="r+")
    array[9, 3] = np.inf
    with pytest.raises(ValueError, match=r"corrupt store .*layer 2: chunk file .* is damaged"):  # its checksum tells
        analyze_store(store, min_contexts=3)
    unchecked = RepresentationStore(store.path, {key: value for key, value in store.meta.items() if key != "integrity"})
    with pytest.raises(ValueError, match=r"non-finite values \(NaN or inf\) in layer 2 row 9 of .*chunk file may be damaged"):
        analyze_store(unchecked, min_contexts=3)  # a store written without checksums: the values tell


def test_special_tokens_are_never_analysed(tmp_path, rng):
    hidden, _ = synthetic_layers(rng, n_layers=2)
    special = [[position == 0 for position in range(len(sentence))] for sentence in SENTENCES]
    store = write_store_from_arrays(tmp_path / "store", hidden, SENTENCES, is_special=special)
    result = analyze_store(store, min_contexts=2, include_punct=True)
    kept = ~np.concatenate(special)
    X = hidden[1].astype(np.float32).astype(np.float64)
    assert result.counts["rows_special_excluded"] == len(SENTENCES)
    assert result.layers.set_index(["layer", "metric"]).loc[(1, "anisotropy_exact"), "raw"] == pytest.approx(
        pairwise_mean_cosine(X[kept]), abs=1e-9)


def test_cli_analyze(small_store, tmp_path):
    store, _ = small_store
    app = typer.Typer()
    register(app)
    runner = CliRunner()
    arguments = ["analyze", str(store.path), "--min-contexts", "3", "--rows", "10", "--out", str(tmp_path / "o")]
    outcome = runner.invoke(app, arguments, env={"COLUMNS": "200"})
    assert outcome.exit_code == 0, outcome.output
    assert "Findings" in outcome.output and "layer 0 = embedding output" in outcome.output
    assert (tmp_path / "o" / "contextuality.json").exists() and (tmp_path / "o" / "contextuality_words.csv").exists()
    failed = runner.invoke(app, ["analyze", str(store.path), "--min-contexts", "50"])
    assert failed.exit_code == 2 and "--min-contexts" in failed.output


def test_exclude_first_word_drops_each_sentences_first_word_not_its_special_tokens(tmp_path):
    from lmgeom.engine import select_rows

    sentences = [["<s>", "The", "cat", "sat"], ["<s>", "A", "dog", "."], ["<s>", "cat", "ran"]]
    special = [[True, False, False, False], [True, False, False, False], [True, False, False]]
    n = sum(map(len, sentences))
    store = write_store_from_arrays(tmp_path / "s", [np.random.default_rng(0).normal(size=(n, 4))], sentences, is_special=special)
    kept = store.tokens["word"][select_rows(store.tokens, exclude_first_word=True).mask]
    assert kept.tolist() == ["cat", "sat", "dog", "ran"]
    selection = select_rows(store.tokens, include_punct=True)
    assert store.tokens["word"][selection.mask].tolist() == ["The", "cat", "sat", "A", "dog", ".", "cat", "ran"]
    assert selection.counts["rows_first_word_excluded"] == 0
