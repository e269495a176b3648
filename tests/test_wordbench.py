"""Ethayarajh (2019)'s Table 1 benchmarks: readers on the real files, every metric against a hand
computation on tiny vectors, both OOV protocols, and (where installed) the `web` package itself."""

from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
import pytest
from gensim.models import KeyedVectors
from typer.testing import CliRunner

from lmgeom.errors import InputError
from lmgeom.evaluate import evaluate_analogies, evaluate_word_pairs
from lmgeom.evaluate.wordbench import (
    DATA_BENCHMARKS,
    AnalogyQuestions,
    MinCoverage,
    Categories,
    Relation,
    WordLookup,
    analogy_accuracy,
    benchmark_task,
    categorisation_purity,
    find_word_benchmarks,
    purity,
    read_categories,
    read_google_analogies,
    read_msr_analogies,
    read_semeval_2012_2,
    read_word_benchmark,
    semeval_2012_2_score,
    similarity_score,
    standardize,
    too_few_items_text,
)
from lmgeom.evaluate.wordsim import GENSIM_BENCHMARKS, read_word_pairs


def unit(v) -> np.ndarray:
    v = np.asarray(v, dtype=float)
    return v / np.linalg.norm(v)


def spearman_by_hand(x, y) -> float:
    """1 - 6 sum d^2 / (n (n^2 - 1)), for values without ties."""
    assert len(set(x)) == len(x) and len(set(y)) == len(y)
    rank = lambda v: {value: r for r, value in enumerate(sorted(v))}  # noqa: E731
    rx, ry = rank(x), rank(y)
    n = len(x)
    return 1 - 6 * sum((rx[a] - ry[b]) ** 2 for a, b in zip(x, y)) / (n * (n * n - 1))


VECTORS = {"Cat": [1, 0.2, 0], "dog": [0.9, 0.4, 0.1], "car": [0, 1, 0.3], "bus": [0.1, 0.8, 0.6],
           "tree": [0.3, 0.1, 1], "CAT": [0, 0, 1]}  # "CAT" comes after "Cat": the first casing wins


def lookup() -> WordLookup:
    return WordLookup.from_arrays(list(VECTORS), np.array(list(VECTORS.values())))


# ---- vectors and strings -----------------------------------------------------------------------------

def test_lookup_lowercases_keeps_the_first_casing_and_normalises():
    lk = lookup()
    assert lk.words == ["cat", "dog", "car", "bus", "tree"]
    np.testing.assert_allclose(lk.unit[lk.index["cat"]], unit(VECTORS["Cat"]))
    np.testing.assert_allclose(lk.mean, np.mean([unit(VECTORS[k]) for k in ("Cat", "dog", "car", "bus", "tree")], axis=0))
    assert np.linalg.norm(lk.mean) < 1  # the mean of the unit rows, not renormalised (as `web`)


def test_standardize_is_webs_standardize_string():
    assert standardize("City's") == "citys"
    assert standardize("New_York-ish") == "new_york-ish"
    assert standardize("café!") == "café"


# ---- similarity --------------------------------------------------------------------------------------

PAIRS = [("cat", "dog", 9.0), ("car", "bus", 8.0), ("cat", "tree", 1.0), ("dog", "car", 5.0), ("bus", "tree", 4.0),
         ("cat", "unicorn", 9.5)]


def test_similarity_spearman_by_hand_in_both_protocols():
    lk = lookup()
    vec = {k.lower(): unit(v) for k, v in VECTORS.items() if k != "CAT"}
    covered = PAIRS[:5]
    skip = similarity_score(lk, PAIRS, "skip")
    cosines = [float(vec[a] @ vec[b]) for a, b, _ in covered]
    assert skip.score == pytest.approx(spearman_by_hand(cosines, [g for *_, g in covered])) == pytest.approx(0.9)
    assert (skip.covered, skip.total) == (5, 6)
    # oov="mean": unicorn is the mean of the five unit rows, and its pair counts (the cosine with the mean)
    mean_vector = np.mean(list(vec.values()), axis=0)
    mean = similarity_score(lk, PAIRS, "mean")
    scores = cosines + [float(vec["cat"] @ unit(mean_vector))]
    assert mean.score == pytest.approx(spearman_by_hand(scores, [g for *_, g in PAIRS]))
    assert (mean.covered, mean.total) == (5, 6)
    assert mean.score != pytest.approx(skip.score)


def test_min_coverage_reads_items_and_a_share_and_caps_items_at_the_benchmark():
    rule = MinCoverage.parse("50,10%")
    assert rule == MinCoverage() and str(rule) == "50,10%"
    # 10 % of 3,500 is 350 > 50; a 45-word benchmark needs all 45; 10 % of 200 is 20 < 50
    assert [rule.needed(n) for n in (3500, 45, 200, 501)] == [350, 45, 50, 51]
    assert not rule.enough(4, 3500) and not rule.enough(349, 3500) and rule.enough(350, 3500)
    assert rule.enough(45, 45) and not rule.enough(44, 45)
    assert MinCoverage.parse("10%") == MinCoverage(0, 0.1) and MinCoverage.parse("20") == MinCoverage(20, 0.0)
    off = MinCoverage.parse("0")
    assert off.enough(1, 3500) and not off.enough(0, 3500)  # no item scored is never a score
    for bad in ("x", "1,2,3", "-1", "150%", ""):
        with pytest.raises(InputError, match="min_coverage"):
            MinCoverage.parse(bad)
    assert too_few_items_text(4, 3500) == "too few items (4 of 3,500)"


def test_records_flag_a_covered_score_on_too_few_items(tmp_path):
    from lmgeom.evaluate.wordbench import evaluate_word_benchmarks

    rng = np.random.default_rng(3)
    words = [f"w{i}" for i in range(120)]
    pairs = [(words[2 * i], words[2 * i + 1], float(rng.random())) for i in range(60)]
    (tmp_path / "pairs.txt").write_text("".join(f"{a}\t{b}\t{g}\n" for a, b, g in pairs))
    benchmark = read_word_benchmark("pairs", tmp_path / "pairs.txt")
    few = WordLookup.from_arrays(words[:8], rng.normal(size=(8, 4)))  # 4 of 60 pairs covered
    every = WordLookup.from_arrays(words, rng.normal(size=(120, 4)))
    [record] = evaluate_word_benchmarks(few, [benchmark])
    assert (record["covered"], record["total"], record["enough_items"]) == (4, 60, False)
    assert record["score"] == pytest.approx(similarity_score(few, benchmark.data.pairs, "skip").score)  # kept
    [record] = evaluate_word_benchmarks(few, [benchmark], min_coverage="4")
    assert record["enough_items"] is True
    [record] = evaluate_word_benchmarks(every, [benchmark])
    assert (record["covered"], record["enough_items"]) == (60, True)


def test_skip_protocol_equals_gensim(tmp_path):
    kv = KeyedVectors(vector_size=3)
    kv.add_vectors(list(VECTORS), np.array(list(VECTORS.values()), dtype=np.float32))
    path = tmp_path / "pairs.txt"
    path.write_text("".join(f"{a}\t{b}\t{g}\n" for a, b, g in PAIRS))
    ours = similarity_score(WordLookup.from_keyed_vectors(kv), read_word_pairs(path).pairs, "skip")
    theirs = evaluate_word_pairs(kv, path)
    assert ours.score == pytest.approx(theirs["score"], abs=1e-6) and ours.covered == theirs["covered"]


# ---- analogies ---------------------------------------------------------------------------------------

def brute_force_3cosadd(vec: dict[str, np.ndarray], questions, oov: str) -> float:
    mean_vector = np.mean(list(vec.values()), axis=0)
    get = lambda w: vec.get(w, mean_vector)  # noqa: E731
    right = n = 0
    for a, b, c, d in questions:
        if oov == "skip" and not all(w in vec for w in (a, b, c, d)):
            continue
        n += 1
        target = get(b) - get(a) + get(c)
        best = max((w for w in vec if w not in (a, b, c)), key=lambda w: float(vec[w] @ target))
        right += best == d
    return right / n


def test_3cosadd_accuracy_by_hand_both_protocols():
    e = np.eye(6)
    raw = {"man": e[0] + e[2], "king": e[0] + e[1], "woman": e[3] + e[2], "queen": e[3] + e[1],
           "paris": e[4] + 0.1 * e[5], "france": e[5], "rome": e[4] - 0.1 * e[5], "prince": e[0] + e[1] + 0.9 * e[3]}
    vec = {w: unit(v) for w, v in raw.items()}
    questions = AnalogyQuestions([
        ("man", "king", "woman", "queen"),      # right
        ("king", "man", "queen", "woman"),      # right
        ("paris", "france", "rome", "italy"),   # answer has no vector: wrong under "mean", skipped under "skip"
        ("man", "king", "girl", "queen"),       # girl is the mean vector under "mean"
        ("woman", "queen", "man", "prince"),    # the nearest word is "king": wrong
    ], ["a"] * 5)
    lk = WordLookup.from_arrays(list(raw), np.array(list(raw.values())))
    skip, mean = analogy_accuracy(lk, questions, "skip"), analogy_accuracy(lk, questions, "mean", batch_size=2)
    assert (skip.covered, skip.total) == (3, 5)
    assert skip.score == pytest.approx(2 / 3) == pytest.approx(brute_force_3cosadd(vec, questions.questions, "skip"))
    assert mean.score == pytest.approx(brute_force_3cosadd(vec, questions.questions, "mean"))
    assert mean.covered == 3


def test_3cosadd_excludes_the_question_words_and_equals_gensim(tmp_path, rng=np.random.default_rng(0)):
    words = [f"w{i}" for i in range(40)]
    raw = rng.normal(size=(40, 8))
    vec = {w: unit(v) for w, v in zip(words, raw)}
    questions = [tuple(rng.choice(words, 4, replace=False)) for _ in range(60)] + [("w1", "w2", "w3", "nope")]
    lk = WordLookup.from_arrays(words, raw)
    for oov in ("skip", "mean"):
        assert analogy_accuracy(lk, AnalogyQuestions(questions, [""] * 61), oov).score == \
            pytest.approx(brute_force_3cosadd(vec, questions, oov))
    # a question whose answer is its own word c is never right: c is excluded
    assert analogy_accuracy(lk, AnalogyQuestions([("w1", "w2", "w3", "w3")], [""]), "skip").score == 0
    kv = KeyedVectors(vector_size=8)
    kv.add_vectors(words, raw.astype(np.float32))
    path = tmp_path / "q.txt"
    path.write_text(": s\n" + "".join(" ".join(q) + "\n" for q in questions))
    theirs = evaluate_analogies(kv, path)
    ours = analogy_accuracy(WordLookup.from_keyed_vectors(kv), read_google_analogies(path), "skip")
    assert (ours.score, ours.covered) == (pytest.approx(theirs["score"]), theirs["covered"])


# ---- SemEval-2012 Task 2 ---------------------------------------------------------------------------

def test_semeval_score_by_hand_both_protocols():
    raw = {"a": [1, 0, 0], "b": [0, 1, 0], "c": [0, 0, 1], "d": [1, 1, 0], "e": [0, 1, 1], "f": [1, 0, 1],
           "g": [2, 1, 0.5]}
    vec = {w: unit(v) for w, v in raw.items()}
    lk = WordLookup.from_arrays(list(raw), np.array(list(raw.values())))
    mean_vector = np.mean(list(vec.values()), axis=0)
    get = lambda w: vec.get(w, mean_vector)  # noqa: E731
    one = Relation("1a", "X", [("a", "b"), ("d", "zz")],
                   [("a", "c"), ("d", "e"), ("f", "b"), ("g", "a"), ("c", "qq")],
                   np.array([10.0, -4.0, 2.0, 30.0, -12.0]), ["10.0", "-4.0", "2.0", "30.0", "-12.0"])
    two = Relation("2b", "Y", [("yy", "zz")], [("a", "b"), ("c", "d"), ("e", "f")],
                   np.array([1.0, 2.0, 3.0]), ["1.0", "2.0", "3.0"])

    def rho(relation, prototypes, pairs):
        direction = np.mean([get(x) for x, _ in prototypes], axis=0) - np.mean([get(y) for _, y in prototypes], axis=0)
        scores = [float(direction @ (get(x) - get(y))) for x, y in pairs]
        gold = [g for p, g in zip(relation.pairs, relation.gold) if p in pairs]
        return spearman_by_hand(scores, gold)

    # skip: relation one on its covered prototype (a:b) and 4 covered pairs; two has no covered prototype
    skip = semeval_2012_2_score(lk, [one, two], "skip")
    assert skip.score == pytest.approx(rho(one, [("a", "b")], one.pairs[:4]))
    assert (skip.covered, skip.total) == (4, 8)
    # mean: every prototype and pair; two's prototype difference is mean - mean = 0, so its rho is NaN -> 0
    mean = semeval_2012_2_score(lk, [one, two], "mean")
    assert mean.score == pytest.approx((rho(one, one.prototypes, one.pairs) + 0.0) / 2)
    assert mean.covered == 4


def test_semeval_text_ranks_reproduce_webs_string_ratings():
    lk = WordLookup.from_arrays(["a", "b", "c", "d"], np.array([[1, 0.0], [0.2, 1], [-1, 0.3], [0.5, -0.5]]))
    relation = Relation("1a", "X", [("a", "b")], [("a", "b"), ("b", "a"), ("c", "d"), ("d", "c"), ("a", "c")],
                        np.array([50.0, -12.0, 8.0, 6.0, -2.0]), ["50.0", "-12.0", "8.0", "6.0", "-2.0"])
    numeric = semeval_2012_2_score(lk, [relation], "mean").score
    text = semeval_2012_2_score(lk, [relation], "mean", rank_gold_as_text=True).score
    direction = lk.unit[0] - lk.unit[1]
    scores = [float(direction @ (lk.unit[lk.index[x]] - lk.unit[lk.index[y]])) for x, y in relation.pairs]
    assert numeric == pytest.approx(spearman_by_hand(scores, list(relation.gold)))
    # scipy stacks the scores with the strings: both columns are then ranked as text
    assert text == pytest.approx(spearman_by_hand([str(s) for s in scores], relation.gold_text))
    assert text != pytest.approx(numeric)


# ---- categorisation ----------------------------------------------------------------------------------

def test_purity_by_hand():
    labels = np.array(["A", "A", "A", "B", "B", "C"])
    clusters = np.array([0, 0, 1, 1, 1, 1])
    # cluster 0: A x2 -> 2; cluster 1: A, B, B, C -> 2
    assert purity(labels, clusters) == pytest.approx(4 / 6)
    brute = sum(max(Counter(labels[clusters == k]).values()) for k in set(clusters)) / len(labels)
    assert purity(labels, clusters) == pytest.approx(brute)


def test_categorisation_purity_by_hand_both_protocols():
    # two tight groups; b1 sits in group one, so every clustering into two gets 4 of 5 right
    raw = {"a1": [1, 0.01], "a2": [1, -0.01], "b1": [1, 0.02], "b2": [0.01, 1], "b3": [-0.01, 1]}
    lk = WordLookup.from_arrays(list(raw), np.array(list(raw.values())))
    categories = Categories(["a1", "a2", "b1", "b2", "b3", "gone"], ["A", "A", "B", "B", "B", "A"])
    skip = categorisation_purity(lk, categories, "skip")
    assert skip.score == pytest.approx(4 / 5) and (skip.covered, skip.total) == (5, 6)
    # "gone" is the mean vector, (0.6, 0.4) roughly: it joins group one, an A there; B's largest cluster
    # is still {b2, b3}: (3 + 2) / 6 at best
    mean = categorisation_purity(lk, categories, "mean")
    assert mean.score == pytest.approx(5 / 6)
    assert categorisation_purity(lk, categories, "mean", seed=7).score == pytest.approx(5 / 6)
    too_few = Categories(["a1", "b2"], ["A", "B"])
    assert math.isnan(categorisation_purity(lk, too_few, "skip").score)


# ---- readers and the data folder ---------------------------------------------------------------------

def test_readers_on_small_files(tmp_path):
    (tmp_path / "m.csv").write_text(",type,word1,word2,word3,target\n0,NN_NNPOS,city,city's,man,man's\n")
    msr = read_msr_analogies(tmp_path / "m.csv")
    assert msr.questions == [("city", "citys", "man", "mans")] and msr.categories == ["NN_NNPOS"]
    (tmp_path / "c.csv").write_text(",category,word\n0,bird,Robin\n1,bird,\n2,tool,saw\n")
    assert read_categories(tmp_path / "c.csv") == Categories(["Robin", "saw"], ["bird", "tool"])
    assert benchmark_task(tmp_path / "m.csv") == "analogy" and benchmark_task(tmp_path / "c.csv") == "categorisation"
    (tmp_path / "bad.csv").write_text(",x,y\n0,1,2\n")
    with pytest.raises(ValueError, match="category and word"):
        read_categories(tmp_path / "bad.csv")
    found, skipped = find_word_benchmarks(tmp_path)
    assert found == {} and set(skipped) == set(DATA_BENCHMARKS)
    assert "not found in" in skipped["men"]


def test_reader_counts_on_the_real_files(shared_data):
    """The sizes the data READMEs and SOURCES.md give."""
    found, skipped = find_word_benchmarks(shared_data)
    assert set(found) == set(DATA_BENCHMARKS) - {"battig"} and set(skipped) == {"battig"}
    men = read_word_pairs(found["men"]).pairs
    rw = read_word_pairs(found["rw"]).pairs
    assert (len(men), len(rw)) == (3000, 2034)
    assert men[0] == ("sun", "sunlight", 50.0)
    msr = read_msr_analogies(found["msr_analogies"])
    assert len(msr.questions) == 8000 and set(Counter(msr.categories).values()) == {500} and len(set(msr.categories)) == 16
    relations = read_semeval_2012_2(found["semeval2012_2"])
    assert len(relations) == 79 and sum(len(r.pairs) for r in relations) == 3218
    assert all(len(r.prototypes) >= 3 for r in relations)
    assert relations[0].prototypes == [("flower", "tulip"), ("emotion", "rage"), ("poem", "sonnet")]
    assert Counter(r.category for r in relations)["CLASS-INCLUSION"] == 5
    bless = read_categories(found["bless"])
    assert (len(bless.words), len(set(bless.labels))) == (200, 17)
    assert Counter(bless.labels)["ground_mammal"] == 21 and Counter(bless.labels)["amphibian_reptile"] == 5
    ap = read_categories(found["ap"])
    assert (len(ap.words), len(set(ap.labels)), len(set(ap.words))) == (402, 21, 402)
    assert Counter(ap.labels)["feeling"] == 13 and Counter(ap.labels)["vehicle"] == 14
    battig = read_categories(shared_data / DATA_BENCHMARKS["battig"])
    assert (len(battig.words), len(set(battig.labels)), len(set(battig.words))) == (5231, 56, 4668)
    essli = read_categories(found["essli_2c"])
    assert (len(essli.words), len(set(essli.labels))) == (45, 9)
    google = read_word_benchmark("google", GENSIM_BENCHMARKS["google_analogies"])
    assert google.task == "analogy" and len(google.data.questions) == 19544


def test_cli_scores_every_benchmark_found_in_both_protocols(shared_data, tmp_path):
    from lmgeom.cli.main import app
    from lmgeom.store import write_store_from_arrays

    sentences = ["the cat saw a dog".split(), "a good car and a better bus".split(), "the king met the queen".split()]
    rng = np.random.default_rng(1)
    n = sum(map(len, sentences))
    store = write_store_from_arrays(tmp_path / "store", [rng.normal(size=(n, 5)) for _ in range(2)], sentences)
    outcome = CliRunner().invoke(app, ["static-embeddings", str(store.path), "--layer", "1", "--min-contexts", "1"], env={"COLUMNS": "80"})
    assert outcome.exit_code == 0, outcome.output
    assert max(len(line) for line in outcome.output.splitlines()) <= 80
    assert "all (OOV mean)" in outcome.output and "skipped battig" in outcome.output
    # three sentences cover almost nothing: every covered-items score reads "too few items", never a number
    document = json.loads((store.path / "static" / "1.benchmarks.json").read_text())
    assert document["provenance"]["settings"]["min_coverage"] == "50,10%"
    assert not any(r["enough_items"] for r in document["records"])
    # each of them reads "too few items" in the table (and the note above the tables names the rule once)
    assert outcome.output.count("too few items") == len(document["records"]) + 1
    names = {r["benchmark"] for r in document["records"]}
    assert names == {"simlex999", "wordsim353", "google_analogies", *DATA_BENCHMARKS} - {"battig"}
    assert set(document["skipped"]) == {"battig"}
    men = next(r for r in document["records"] if r["benchmark"] == "men" and r["vectors"].startswith("first_pc"))
    assert men["total"] == 3000 and men["metric"] == "spearman" and men["score_oov_mean"] is not None
    outcome = CliRunner().invoke(app, ["static-embeddings", str(store.path), "--layer", "1", "--min-contexts", "1",
                                       "--min-coverage", "0", "--overwrite"], env={"COLUMNS": "80"})
    assert outcome.exit_code == 0, outcome.output
    assert "too few items (" not in outcome.output
    outcome = CliRunner().invoke(app, ["static-embeddings", str(store.path), "--layer", "1", "--min-coverage", "ten"],
                                 env={"COLUMNS": "80"})
    assert outcome.exit_code != 0 and "--min-coverage" in outcome.output


# ---- the `web` package itself ------------------------------------------------------------------------

@pytest.fixture
def web_and_vectors(shared_data):
    """`web` (PyPI word-embeddings-benchmarks) and random vectors for 70 % of the benchmark words."""
    web_evaluate = pytest.importorskip("web.evaluate")
    from web.embedding import Embedding

    found, _ = find_word_benchmarks(shared_data)
    benchmarks = {name: read_word_benchmark(name, path) for name, path in found.items()}
    words = set()
    for b in benchmarks.values():
        if b.task == "similarity":
            words |= {w.lower() for p in b.data.pairs for w in p[:2]}
        elif b.task == "analogy":
            words |= {w for q in b.data.questions[:600] for w in q}
        elif b.task == "categorisation":
            words |= {w.lower() for w in b.data.words}
        else:
            words |= {w for r in b.data for p in r.pairs + r.prototypes for w in p}
    rng = np.random.default_rng(0)
    vocabulary = sorted(w for w in words if rng.random() < 0.7)
    lk = WordLookup.from_arrays(vocabulary, rng.normal(size=(len(vocabulary), 16)))
    embedding = Embedding.from_dict(dict(zip(lk.words, lk.unit)))
    return web_evaluate, embedding, lk, benchmarks


def test_mean_protocol_equals_web(web_and_vectors, monkeypatch):
    web_evaluate, embedding, lk, benchmarks = web_and_vectors
    from sklearn.cluster import AgglomerativeClustering
    from sklearn.utils import Bunch

    for name in ("men", "rw"):
        pairs = benchmarks[name].data.pairs
        X = np.array([(a.lower(), b.lower()) for a, b, _ in pairs], dtype=object)
        theirs = web_evaluate.evaluate_similarity(embedding, X, np.array([g for *_, g in pairs]))
        assert similarity_score(lk, pairs, "mean").score == pytest.approx(theirs, abs=1e-12)

    msr = benchmarks["msr_analogies"].data
    subset = AnalogyQuestions(msr.questions[:600], msr.categories[:600])
    X = np.array([q[:3] for q in subset.questions], dtype=object)
    y = np.array([q[3] for q in subset.questions], dtype=object)
    assert analogy_accuracy(lk, subset, "mean").score == pytest.approx(web_evaluate.evaluate_analogy(embedding, X, y))

    relations = benchmarks["semeval2012_2"].data
    for as_text in (False, True):
        bunch = Bunch(X_prot={r.id: np.array(r.prototypes, dtype=object) for r in relations},
                      X={r.id: np.array(r.pairs, dtype=object) for r in relations},
                      y={r.id: list(r.gold_text) if as_text else r.gold for r in relations},
                      categories_names={r.id: f"{r.category}_x" for r in relations})
        monkeypatch.setattr(web_evaluate, "fetch_semeval_2012_2", lambda: bunch)
        theirs = web_evaluate.evaluate_on_semeval_2012_2(embedding)["all"]
        ours = semeval_2012_2_score(lk, relations, "mean", rank_gold_as_text=as_text).score
        assert ours == pytest.approx(theirs, abs=1e-12)

    # scikit-learn >= 1.4 calls `web`'s `affinity` argument `metric`
    monkeypatch.setattr(web_evaluate, "AgglomerativeClustering",
                        lambda affinity, **kwargs: AgglomerativeClustering(metric=affinity, **kwargs))
    for name in ("bless", "ap", "essli_2c"):
        categories = benchmarks[name].data
        X = np.array([w.lower() for w in categories.words], dtype=object)
        theirs = web_evaluate.evaluate_categorization(embedding, X, np.array(categories.labels), seed=0)
        assert categorisation_purity(lk, categories, "mean", seed=0).score == pytest.approx(theirs)


def test_spearman_by_hand_helper_agrees_with_scipy():
    from scipy.stats import spearmanr

    x, y = [0.3, -0.2, 0.1, 0.5, -0.6], [5.0, 1.0, 2.0, 4.0, 3.0]
    assert spearman_by_hand(x, y) == pytest.approx(spearmanr(x, y).statistic)
