"""Static embeddings from a store, and word-similarity / analogy scoring with gensim."""

from __future__ import annotations

import json

import numpy as np
import pytest
import typer
from gensim.models import KeyedVectors
from scipy.stats import spearmanr
from typer.testing import CliRunner

from lmgeom.cli.analyze import register
from lmgeom.evaluate import evaluate_analogies, evaluate_word_pairs, load_static_vectors, read_word_pairs
from lmgeom.stages import benchmark_static_embeddings, static_embeddings
from lmgeom.store import write_store_from_arrays


def keyed(vectors: dict[str, np.ndarray]) -> KeyedVectors:
    kv = KeyedVectors(vector_size=len(next(iter(vectors.values()))))
    kv.add_vectors(list(vectors), np.stack(list(vectors.values())).astype(np.float32))
    return kv


def cosine(a, b):
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


# ---- reading benchmark files ---------------------------------------------------------------------

@pytest.mark.parametrize(
    "text, expected_column",
    [
        ("# comment\nold\tnew\t1.5\nsmart\tclever\t9\n", 2),
        ("word1 word2 score\nold new 1.5\nsmart clever 9\n", 2),
        ("old,new,1.5\r\nsmart,clever,9\r\n", 2),
        ("word1\tword2\tPOS\tSimLex999\tconc(w1)\r\nold\tnew\tA\t1.5\t2.72\r\nsmart\tclever\tA\t9\t1.75\r\n", 3),
        ("old\tnew\tV\t1.5\tANTONYMS\nsmart\tclever\tV\t9\tSYNONYMS\n", 3),
    ],
)
def test_read_word_pairs_formats(tmp_path, text, expected_column):
    path = tmp_path / "pairs.txt"
    path.write_bytes(text.encode())
    pairs = read_word_pairs(path)
    assert pairs.pairs == [("old", "new", 1.5), ("smart", "clever", 9.0)]
    assert pairs.score_column == expected_column


def test_read_word_pairs_rejects_files_without_scores(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("a b c\nd e f\n")
    with pytest.raises(ValueError, match="numeric"):
        read_word_pairs(path)


# ---- scoring ---------------------------------------------------------------------------------------

def test_word_pair_spearman_equals_scipy_with_coverage_and_case(tmp_path, rng=np.random.default_rng(3)):
    words = ["Cat", "dog", "car", "bus", "tree", "leaf"]
    vectors = {w: rng.normal(size=5) for w in words}
    gold = [("cat", "dog", 8.0), ("car", "bus", 7.5), ("tree", "leaf", 6.0), ("cat", "car", 1.0),
            ("dog", "leaf", 2.5), ("bus", "tree", 0.5), ("cat", "unicorn", 3.0)]
    path = tmp_path / "tiny.tsv"
    path.write_text("w1\tw2\tscore\n" + "".join(f"{a.upper()}\t{b}\t{s}\n" for a, b, s in gold))
    record = evaluate_word_pairs(keyed(vectors), path)
    covered = gold[:-1]
    lookup = {w.lower(): v for w, v in vectors.items()}
    expected = spearmanr([s for _, _, s in covered], [cosine(lookup[a], lookup[b]) for a, b, _ in covered])
    assert record["score"] == pytest.approx(expected.statistic, abs=1e-6)
    assert (record["covered"], record["total"]) == (6, 7)
    assert record["coverage"] == pytest.approx(6 / 7)
    nothing = evaluate_word_pairs(keyed({"zebra": np.ones(5)}), path)
    assert nothing["covered"] == 0 and np.isnan(nothing["score"])


def test_analogies_3cosadd_accuracy_and_coverage(tmp_path):
    e = np.eye(6)
    vectors = {"king": e[0] + e[1], "man": e[0] + e[2], "woman": e[3] + e[2], "queen": e[3] + e[1],
               "paris": e[4], "france": e[5]}
    path = tmp_path / "questions.txt"
    path.write_text(": royalty\nman king woman queen\nman woman king queen\n: capitals\nparis france rome italy\n")
    record = evaluate_analogies(keyed(vectors), path)
    assert (record["covered"], record["total"]) == (2, 3)
    assert record["score"] == pytest.approx(1.0)


def test_load_static_vectors_word2vec_and_glove(tmp_path):
    (tmp_path / "w2v.txt").write_text("2 3\ncat 1 0 0\ndog 0 1 0\n")
    (tmp_path / "glove.txt").write_text("cat 1 0 0\ndog 0 1 0\n")
    for name in ("w2v.txt", "glove.txt"):
        vectors = load_static_vectors(tmp_path / name)
        assert vectors.index_to_key == ["cat", "dog"]
        np.testing.assert_array_equal(vectors["dog"], [0, 1, 0])


# ---- static embeddings from a store ----------------------------------------------------------------

SENTENCES = [
    "The cat sat on the mat".split(),
    "the dog sat by the cat .".split(),
    "a dog and a cat".split(),
    "the car passed the bus".split(),
    "a bus and a car".split(),
]


@pytest.fixture
def store(tmp_path):
    rng = np.random.default_rng(5)
    words = [w for sentence in SENTENCES for w in sentence]
    hidden = [rng.normal(size=(len(words), 6)) - layer for layer in range(3)]
    return write_store_from_arrays(tmp_path / "store", hidden, SENTENCES), hidden, np.array(words)


def test_static_embeddings_are_top_singular_vectors_aligned_with_the_mean(store):
    store, hidden, words = store
    embeddings = static_embeddings(store, layer=2, min_contexts=1)
    assert "." not in embeddings.words and {"The", "the"} <= set(embeddings.words)  # cased, punctuation out
    assert list(embeddings.counts) == sorted(embeddings.counts, reverse=True)
    X2 = hidden[2].astype(np.float32).astype(np.float64)
    X0 = hidden[0].astype(np.float32).astype(np.float64)
    for index, word in enumerate(embeddings.words):
        rows = words == word
        top = np.linalg.svd(X2[rows])[2][0]
        direction = embeddings.vectors["first_pc"][index]
        assert abs(direction @ top) == pytest.approx(1.0, abs=1e-9)
        assert direction @ X2[rows].mean(axis=0) >= 0
        np.testing.assert_allclose(embeddings.vectors["mean"][index], X2[rows].mean(axis=0), atol=1e-12)
        np.testing.assert_allclose(embeddings.vectors["layer0_mean"][index], X0[rows].mean(axis=0), atol=1e-12)
    # "a" occurs 4 times but in 2 sentences: contexts, not occurrences, decide
    assert static_embeddings(store, layer=2, min_contexts=3).words == ["the", "cat"]


def test_benchmark_table_covers_every_vector_set(store, tmp_path):
    store, _, _ = store
    embeddings = static_embeddings(store, layer=1, min_contexts=1)
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("cat dog 8\ncar bus 7\ncat car 2\ndog bus 1\nmat unicorn 3\n")
    embeddings.save(tmp_path)  # the run directory: STATIC/1.kv and 1.txt under it
    scores = benchmark_static_embeddings(embeddings, benchmarks={"tiny": pairs}, static_vectors=[tmp_path / "static" / "1.txt"])
    assert list(scores["vectors"]) == ["first_pc (layer 1)", "mean (layer 1)", "layer0_mean (layer 0)", "static: 1.txt"]
    assert (scores["covered"] == 4).all() and (scores["total"] == 5).all()
    # the exported first-PC vectors score exactly like the in-memory ones
    assert scores["score"].iloc[3] == pytest.approx(scores["score"].iloc[0], abs=1e-6)
    kv = embeddings.keyed_vectors("mean")
    expected = spearmanr([8, 7, 2, 1], [kv.similarity(a, b) for a, b in [("cat", "dog"), ("car", "bus"), ("cat", "car"), ("dog", "bus")]])
    assert scores["score"].iloc[1] == pytest.approx(expected.statistic, abs=1e-6)


@pytest.fixture
def cli(store, tmp_path):
    """The store, a word-pairs benchmark beside it and the CLI with `static-embeddings`."""
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("cat\tdog\t8\ncar\tbus\t7\ncat\tcar\t2\n")
    app = typer.Typer()
    register(app)
    return store[0], pairs, app


def test_cli_static_embeddings(cli, tmp_path):
    store, pairs, app = cli
    out = tmp_path / "vectors.txt"
    outcome = CliRunner().invoke(app, ["static-embeddings", str(store.path), "--layer", "2", "--min-contexts", "1", "--out", str(out),
                                       "--benchmark", str(pairs), "--data-dir", str(tmp_path)], env={"COLUMNS": "200"})
    assert outcome.exit_code == 0, outcome.output
    assert out.exists() and (store.path / "static" / "2.kv").exists()
    document = json.loads((store.path / "static" / "2.benchmarks.json").read_text())
    assert document["kind"] == "static_embedding_benchmarks"
    assert {r["benchmark"] for r in document["records"]} == {"simlex999", "wordsim353", "google_analogies", "pairs"}
    assert KeyedVectors.load(str(store.path / "static" / "2.kv")).index_to_key == load_static_vectors(out).index_to_key
    missing = CliRunner().invoke(app, ["static-embeddings", str(store.path), "--layer", "2", "--benchmark", "nope.txt"])
    assert missing.exit_code == 2 and "does not exist" in missing.output


def test_cli_static_embeddings_never_replaces_richer_scores_or_a_users_file(cli, tmp_path):
    store, pairs, app = cli

    def invoke(*extra: str) -> tuple[int, str]:
        outcome = CliRunner().invoke(app, ["static-embeddings", str(store.path), "--layer", "2", "--min-contexts", "1", *extra])
        return outcome.exit_code, " ".join(outcome.output.split())

    richer = ["--benchmark", str(pairs), "--data-dir", str(tmp_path)]
    assert invoke(*richer)[0] == 0
    record = store.path / "static" / "2.benchmarks.json"
    before = record.read_bytes()
    # fewer benchmarks (one not given again; a data folder that is not there): refused, nothing written
    code, output = invoke("--data-dir", str(tmp_path))
    assert code == 2 and output.startswith("error:") and f"{record} holds scores on the benchmark(s) pairs" in output
    assert "--data-dir" in output and "--benchmark" in output and "--overwrite" in output
    code, output = invoke("--benchmark", str(pairs), "--data-dir", str(tmp_path / "nonexistent"))
    assert code == 2 and "--data-dir" in output and "nonexistent is not a folder" in output
    assert record.read_bytes() == before
    # a file of the user's at --out: refused unless --overwrite; the run's own text file is rewritten
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    code, output = invoke(*richer, "--out", str(notes))
    assert code == 2 and f"--out {notes} exists and lmgeom did not write it" in output and "--overwrite" in output
    assert notes.read_text() == "mine"
    assert invoke(*richer, "--out", str(notes), "--overwrite")[0] == 0
    assert load_static_vectors(notes).index_to_key == KeyedVectors.load(str(store.path / "static" / "2.kv")).index_to_key
    assert invoke(*richer)[0] == 0
    # --overwrite replaces the scores with fewer
    assert invoke("--data-dir", str(tmp_path), "--overwrite")[0] == 0
    assert {r["benchmark"] for r in json.loads(record.read_text())["records"]} == {"simlex999", "wordsim353", "google_analogies"}
