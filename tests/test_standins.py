"""Static baselines trained here (lmgeom.stages.experiments.standins): determinism across processes,
scores against a hand computation, the CLI, resuming and refusing other settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gensim.models import KeyedVectors
from typer.testing import CliRunner

from lmgeom.cli.main import app
from lmgeom.corpus import load_corpus
from lmgeom.errors import InputError
from lmgeom.stages.experiments.standins import (StaticBaselineSettings, default_settings, run_static_baselines,
                                              train_vectors, training_sentences)

WORDS = ["cat", "dog", "mouse", "horse", "car", "bus", "train", "road", "red", "green", "blue", "small", "big"]
TINY = StaticBaselineSettings(dim=8, window=2, min_count=1, epochs=3)


@pytest.fixture
def corpus_file(tmp_path: Path) -> Path:
    rng = np.random.default_rng(3)
    lines = [" ".join(rng.choice(WORDS, size=8)).capitalize() + "." for _ in range(60)]
    path = tmp_path / "tiny.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_training_sentences_are_lowercased_words_without_punctuation(corpus_file: Path) -> None:
    corpus = load_corpus(str(corpus_file))
    sentences = training_sentences(corpus)
    assert len(sentences) == 60
    assert all(len(s) == 8 and all(w in WORDS for w in s) for s in sentences)
    first = [w.text for w in corpus.sentences[0].words]
    assert first[-1] == "." and sentences[0] == [w.lower() for w in first[:-1]]


def test_seeded_training_gives_identical_vectors_in_a_new_process(corpus_file: Path, tmp_path: Path) -> None:
    sentences = training_sentences(load_corpus(str(corpus_file)))
    here = {method: train_vectors(method, sentences, TINY) for method in ("word2vec", "fasttext")}
    script = (  # one process for both methods: importing lmgeom.stages takes most of the time
        "import sys, numpy as np\n"
        "from lmgeom.corpus import load_corpus\n"
        "from lmgeom.stages.experiments.standins import StaticBaselineSettings, train_vectors, training_sentences\n"
        "sentences = training_sentences(load_corpus(sys.argv[1]))\n"
        "for method in ('word2vec', 'fasttext'):\n"
        "    wv = train_vectors(method, sentences, StaticBaselineSettings(dim=8, window=2, min_count=1, epochs=3))\n"
        "    np.save(f'{sys.argv[2]}/{method}.npy', wv.vectors)\n"
        "    open(f'{sys.argv[2]}/{method}.txt', 'w').write('\\n'.join(wv.index_to_key))\n"
    )
    environment = {**os.environ, "PYTHONHASHSEED": "12345", "OMP_NUM_THREADS": "1"}  # another string hash than this process's
    subprocess.run([sys.executable, "-c", script, str(corpus_file), str(tmp_path)], check=True, env=environment)
    for method, vectors in here.items():
        assert (tmp_path / f"{method}.txt").read_text().split("\n") == list(vectors.index_to_key)
        np.testing.assert_array_equal(np.load(tmp_path / f"{method}.npy"), vectors.vectors)
        other = train_vectors(method, sentences, StaticBaselineSettings(dim=8, window=2, min_count=1, epochs=3, seed=1))
        assert not np.array_equal(other.vectors, vectors.vectors)  # the seed matters
    assert not np.array_equal(here["word2vec"].vectors, here["fasttext"].vectors)


def _spearman_by_hand(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson of the ranks (no ties in x or y)."""
    rx, ry = np.argsort(np.argsort(x)).astype(float), np.argsort(np.argsort(y)).astype(float)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    return float(rx @ ry / np.sqrt((rx @ rx) * (ry @ ry)))


def test_scores_equal_a_hand_computation(corpus_file: Path, tmp_path: Path) -> None:
    pairs = [("cat", "dog", 9.0), ("car", "bus", 8.0), ("red", "blue", 7.5), ("cat", "road", 2.0),
             ("horse", "mouse", 6.0), ("green", "train", 1.0), ("Big", "small", 5.0), ("cat", "zebra", 3.0)]
    benchmark = tmp_path / "pairs.txt"
    benchmark.write_text("".join(f"{a}\t{b}\t{g}\n" for a, b, g in pairs), encoding="utf-8")
    out = tmp_path / "out"
    result = run_static_baselines(str(corpus_file), out=out, settings=TINY, methods=["word2vec"],
                                  benchmarks={"pairs": benchmark})
    [record] = result.document["records"]
    vectors = KeyedVectors.load_word2vec_format(str(out / "vectors" / "word2vec.bin"), binary=True)
    unit = {w: vectors[w].astype(np.float64) / np.linalg.norm(vectors[w]) for w in vectors.index_to_key}
    mean = np.mean(list(unit.values()), axis=0)  # web's vector for a word without one

    def cosine(a: str, b: str) -> float:
        u, v = unit.get(a.lower(), mean), unit.get(b.lower(), mean)
        return float(u @ v / (np.linalg.norm(u) * np.linalg.norm(v)))

    covered = pairs[:-1]  # zebra is not in the corpus
    assert record["covered"] == 7 and record["total"] == 8
    assert record["score"] == pytest.approx(_spearman_by_hand(np.array([cosine(a, b) for a, b, _ in covered]),
                                                              np.array([g for *_, g in covered])), abs=1e-12)
    assert record["score_oov_mean"] == pytest.approx(_spearman_by_hand(np.array([cosine(a, b) for a, b, _ in pairs]),
                                                                       np.array([g for *_, g in pairs])), abs=1e-12)
    assert record["n_vectors"] == len(WORDS) and record["vectors"] == "word2vec SG"
    written = json.loads((out / "results.json").read_text())
    assert written["kind"] == "experiment-static-baselines" and written["settings"]["min_count"] == 1
    assert written["records"][0]["score"] == pytest.approx(record["score"])
    assert "| word2vec SG | 13 | pairs | spearman |" in (out / "results.md").read_text()


def test_default_settings_per_corpus() -> None:
    assert (default_settings("lee").min_count, default_settings("lee").epochs) == (5, 20)
    assert (default_settings("brown:/x").min_count, default_settings("brown").epochs) == (5, 5)
    assert default_settings("lee", min_count=3, epochs=None).min_count == 3
    with pytest.raises(InputError, match="`dim`"):
        StaticBaselineSettings(dim=0)


def test_cli_runs_resumes_and_refuses_other_settings(corpus_file: Path, tmp_path: Path) -> None:
    out, empty = tmp_path / "cli", tmp_path / "no-benchmarks"
    empty.mkdir()
    command = ["experiment", "static-baselines", "--corpus", str(corpus_file), "--out", str(out), "--methods", "word2vec",
               "--dim", "8", "--window", "2", "--min-count", "1", "--epochs", "2", "--data-dir", str(empty)]
    runner = CliRunner()
    first = runner.invoke(app, command)
    assert first.exit_code == 0, first.output
    document = json.loads((out / "results.json").read_text())
    assert {r["benchmark"] for r in document["records"]} == {"simlex999", "wordsim353", "google_analogies"}
    assert "men" in document["skipped"]
    both = runner.invoke(app, [*command[:7], "word2vec,fasttext", *command[8:]])
    assert both.exit_code == 0, both.output
    again = json.loads((out / "results.json").read_text())
    assert again["records"][:3] == document["records"]  # word2vec kept, not retrained
    assert [r["method"] for r in again["records"]].count("fasttext") == 3
    changed = runner.invoke(app, [*command[:-4], "--epochs", "3", *command[-2:]])
    assert changed.exit_code == 2 and "other settings (epochs differ)" in changed.output
    bad = runner.invoke(app, [*command[:7], "glove", *command[8:]])
    assert bad.exit_code == 2 and "methods" in bad.output
