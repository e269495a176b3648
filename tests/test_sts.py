"""Sentence similarity: readers on the real files, Spearman and aggregations against scipy,
pooled vectors against a direct forward pass, calibration fit sources, the CLI end to end."""

from __future__ import annotations

import json
import zlib

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr
from typer.testing import CliRunner

from lmgeom.calibrate import Whitening
from lmgeom.cli.main import app
from lmgeom.corpus import Corpus
from lmgeom.encoders import load_encoder
from lmgeom.evaluate.sts import aggregate_scores, pair_cosines, spearman_x100
from lmgeom.stages.sts import (
    CALIBRATION_METHODS, FIRST_LAST_AVG, LayerSelection, combination, encode_sentences, evaluate_sts, resolve_layers,
)
from lmgeom.evaluate.sts_data import STSDataset, find_datasets, read_semeval_sts, read_sick, read_stsb, semeval_subsets

SEMEVAL_COUNTS = {
    2012: {"MSRpar": 750, "MSRvid": 750, "SMTeuroparl": 459, "surprise.OnWN": 750, "surprise.SMTnews": 399},
    2013: {"FNWN": 189, "headlines": 750, "OnWN": 561},
    2014: {"deft-forum": 450, "deft-news": 300, "headlines": 750, "images": 750, "OnWN": 750, "tweet-news": 750},
    2015: {"answers-forums": 375, "answers-students": 750, "belief": 375, "headlines": 750, "images": 750},
    2016: {"answer-answer": 254, "headlines": 249, "plagiarism": 230, "postediting": 244, "question-question": 209},
}


# ---- readers on the real files --------------------------------------------------------------


def test_stsb_reader_counts_and_nine_field_rows(shared_data):
    counts = {split: len(read_stsb(shared_data / "stsbenchmark", split)) for split in ("train", "dev", "test")}
    assert counts == {"train": 5749, "dev": 1500, "test": 1379}
    test = read_stsb(shared_data / "stsbenchmark", "test")
    assert test.scores.min() >= 0 and test.scores.max() <= 5
    # The first test row, read by hand from the file.
    first = (shared_data / "stsbenchmark" / "sts-test.csv").read_text(encoding="utf-8").splitlines()[0].split("\t")
    assert (test.sentences1[0], test.sentences2[0], test.scores[0]) == (first[5], first[6], float(first[4]))
    # Rows with 2 extra columns keep only sentence2 in sentences2, and no sentence swallowed a tab.
    assert all("\t" not in s for s in test.sentences1 + test.sentences2)


def test_semeval_reader_counts_drop_unscored_and_ignore_aggregates(shared_data):
    for year, expected in SEMEVAL_COUNTS.items():
        dataset = read_semeval_sts(shared_data / "STS_raw", year)
        assert {s: dataset.subsets.count(s) for s in dataset.subset_names} == expected
        assert dataset.name == f"STS{year % 100}" and np.isfinite(dataset.scores).all()
    assert "ALL" not in semeval_subsets(shared_data / "STS_raw" / "STS12-en-test")
    assert (shared_data / "STS_raw" / "STS12-en-test" / "STS.gs.ALL.txt").exists()
    assert sum(len(read_semeval_sts(shared_data / "STS_raw", y)) for y in (2015, 2016)) == 3000 + 1186


def test_sick_reader_counts(shared_data):
    counts = {split: len(read_sick(shared_data / "SICK" / "SICK.txt", split)) for split in ("train", "trial", "test", "all")}
    assert counts == {"train": 4439, "trial": 495, "test": 4906, "all": 9840}
    test = read_sick(shared_data / "SICK", "test")
    assert test.scores.min() >= 1 and test.scores.max() <= 5
    assert not any(s.endswith("\r") for s in test.sentences1 + test.sentences2)


def test_find_datasets_prefers_raw_semeval_text(shared_data):
    datasets = find_datasets(shared_data)
    assert [d.name for d in datasets] == ["STS-B", "STS12", "STS13", "STS14", "STS15", "STS16", "SICK-R"]
    sts12 = datasets[1]
    assert "STS_raw" in sts12.source
    assert any(any(c.isupper() for c in s) for s in sts12.sentences1[:20])  # the STS/ copy is lowercased
    assert [d.name for d in find_datasets(shared_data, split="dev")] == ["STS-B", "SICK-R"]


# ---- Spearman and aggregations --------------------------------------------------------------


def pearson(a, b) -> float:
    a, b = np.asarray(a, float) - np.mean(a), np.asarray(b, float) - np.mean(b)
    return float((a * b).sum() / np.sqrt((a * a).sum() * (b * b).sum()))


def test_spearman_with_ties_equals_pearson_of_hand_ranks():
    gold = [1.0, 2.0, 2.0, 3.0, 5.0]
    predicted = [0.1, 0.4, 0.3, 0.2, 0.9]
    gold_ranks = [1, 2.5, 2.5, 4, 5]  # the two 2.0s share ranks 2 and 3
    predicted_ranks = [1, 4, 3, 2, 5]
    assert spearman_x100(gold, predicted) == pytest.approx(100 * pearson(gold_ranks, predicted_ranks), abs=1e-9)
    assert spearman_x100([1, 2, 3], [10, 20, 30]) == pytest.approx(100.0)
    assert spearman_x100([1, 2, 3], [3, 2, 1]) == pytest.approx(-100.0)


def two_subset_dataset() -> STSDataset:
    rng = np.random.default_rng(1)
    subsets = ["a"] * 12 + ["b"] * 8
    scores = np.concatenate([rng.uniform(0, 5, 12), rng.uniform(0, 5, 8)]).round(1)
    return STSDataset("fake", "test", subsets, [f"x{i}" for i in range(20)], [f"y{i}" for i in range(20)], scores)


def test_aggregations_against_scipy():
    dataset = two_subset_dataset()
    rng = np.random.default_rng(2)
    # Within each subset the cosine follows the gold score, but subset b sits far higher: pooling
    # the pairs ("all") then ranks differently from the per-subset mean.
    predicted = dataset.scores + rng.normal(0, 1.0, 20) + np.where(np.array(dataset.subsets) == "b", 4.0, 0.0)
    scores = aggregate_scores(dataset, predicted)
    a, b = slice(0, 12), slice(12, 20)
    assert scores["all"] == pytest.approx(100 * spearmanr(dataset.scores, predicted).statistic, abs=1e-9)
    expected_mean = 50 * (spearmanr(dataset.scores[a], predicted[a]).statistic + spearmanr(dataset.scores[b], predicted[b]).statistic)
    assert scores["mean"] == pytest.approx(expected_mean, abs=1e-9)
    assert abs(scores["all"] - scores["mean"]) > 1
    one_subset = STSDataset("one", "test", ["one"] * 20, dataset.sentences1, dataset.sentences2, dataset.scores)
    assert set(aggregate_scores(one_subset, predicted)) == {"all"}


def test_pair_cosines_closed_form():
    A = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0], [3.0, 4.0]])
    B = np.array([[0.0, 2.0], [2.0, 2.0], [1.0, 0.0], [-3.0, -4.0]])
    np.testing.assert_allclose(pair_cosines(A, B), [0.0, 1.0, 0.0, -1.0], atol=1e-12)


def test_sample_is_seeded_and_keeps_file_order():
    dataset = two_subset_dataset()
    sample = dataset.sample(7, seed=3)
    assert len(sample) == 7 and sample.sentences1 == sorted(sample.sentences1, key=lambda s: int(s[1:]))
    assert sample.sentences1 == dataset.sample(7, seed=3).sentences1
    assert dataset.sample(100) is dataset


# ---- a model-free encoder: fixed random vectors per text ------------------------------------


class StubEncoder:
    """Deterministic per-text vectors (n_layers, dim); counts how often each text is encoded."""

    model_id = "stub"

    def __init__(self, n_layers: int = 3, dim: int = 6) -> None:
        self.n_layers, self.dim = n_layers, dim
        self.encoded: list[str] = []

    def vectors(self, text: str) -> np.ndarray:
        rng = np.random.default_rng(zlib.crc32(text.encode()))
        return (rng.normal(size=(self.n_layers, self.dim)) + np.arange(self.n_layers)[:, None]).astype(np.float32)

    def sentence_embeddings(self, texts, *, include_special=True, on_batch=None):
        self.encoded.extend(texts)
        if on_batch is not None:
            on_batch(len(texts))
        return np.stack([self.vectors(t) for t in texts], axis=1)


def stub_dataset(name: str, n_pairs: int, *, shared: int = 0) -> STSDataset:
    """Pairs over a small vocabulary of sentences (so sentences repeat), gold = random scores."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    pool = [f"{name} sentence {i}" for i in range(n_pairs)] + [f"shared {i}" for i in range(shared)]
    first = rng.integers(0, len(pool), n_pairs)
    # No sentence paired with itself: its cosine of 1 would tie with rounding-dependent neighbours.
    second = (first + rng.integers(1, len(pool), n_pairs)) % len(pool)
    return STSDataset(name, "test", [name] * n_pairs, [pool[i] for i in first], [pool[i] for i in second], rng.uniform(0, 5, n_pairs))


def test_each_sentence_encoded_once_and_layer_combinations_average():
    encoder = StubEncoder()
    datasets = [stub_dataset("d1", 30, shared=5), stub_dataset("d2", 25, shared=5)]
    records = evaluate_sts(encoder, datasets, layers=["all", FIRST_LAST_AVG, combination([0, 2])], methods=["whitening", "abtt"])
    distinct = {t for d in datasets for t in d.sentences}
    assert sorted(encoder.encoded) == sorted(distinct)  # every distinct sentence once, for all layers and methods
    for dataset in datasets:
        vectors = np.stack([encoder.vectors(t) for t in dataset.sentences], axis=1).astype(np.float64)
        index = {t: i for i, t in enumerate(dataset.sentences)}
        left, right = [index[t] for t in dataset.sentences1], [index[t] for t in dataset.sentences2]
        for name, X in {"1": vectors[1], FIRST_LAST_AVG: (vectors[1] + vectors[2]) / 2, "avg(0,2)": (vectors[0] + vectors[2]) / 2}.items():
            (record,) = [r for r in records if r["dataset"] == dataset.name and r["layer"] == name and r["method"] == "none"]
            cos = np.sum(X[left] * X[right], axis=1) / np.linalg.norm(X[left], axis=1) / np.linalg.norm(X[right], axis=1)
            assert record["spearman"] == pytest.approx(100 * spearmanr(dataset.scores, cos).statistic, abs=1e-9)
    assert {r["layer"] for r in records} == {"0", "1", "2", FIRST_LAST_AVG, "avg(0,2)"}
    assert len(records) == 2 * 5 * 3  # datasets x layers x (none, whitening, abtt), one aggregation each


def test_transductive_and_corpus_fits_are_recorded_and_computed_as_named():
    encoder = StubEncoder()
    dataset = stub_dataset("d", 40)
    corpus = Corpus.from_list([f"corpus sentence number {i}" for i in range(30)], name="mycorpus")
    records = evaluate_sts(encoder, [dataset], layers=[1], methods=["whitening"], fit_on=["transductive", corpus])
    by_fit = {r["fit_on"]: r for r in records}
    assert set(by_fit) == {"none", "transductive", "mycorpus"}
    assert by_fit["none"]["method"] == "none" and by_fit["none"]["n_fit_sentences"] == 0
    assert by_fit["transductive"]["n_fit_sentences"] == len(dataset.sentences)
    assert by_fit["mycorpus"]["n_fit_sentences"] == 30
    X = np.stack([encoder.vectors(t)[1] for t in dataset.sentences]).astype(np.float64)
    C = np.stack([encoder.vectors(s.text)[1] for s in corpus]).astype(np.float64)
    index = {t: i for i, t in enumerate(dataset.sentences)}
    left, right = [index[t] for t in dataset.sentences1], [index[t] for t in dataset.sentences2]
    for fit_name, fit_rows in (("transductive", X), ("mycorpus", C)):
        Z = Whitening().fit(fit_rows).transform(X)
        expected = spearman_x100(dataset.scores, pair_cosines(Z[left], Z[right]))
        assert by_fit[fit_name]["spearman"] == pytest.approx(expected, abs=1e-9)
    # Transductive whitening makes the evaluated vectors' covariance the identity: IsoScore 1.
    assert by_fit["transductive"]["isoscore"] == pytest.approx(1.0, abs=1e-6)
    assert by_fit["mycorpus"]["isoscore"] < 0.99


def test_layer_and_method_errors():
    with pytest.raises(IndexError, match=r"layer 3 is not among the model's layers 0\.\.2"):
        resolve_layers([3], 3)
    with pytest.raises(ValueError, match="`layers` takes 'all', 'first', 'last'"):
        resolve_layers(["lats"], 3)
    # the one grammar of layers: 'last', negative numbers and ranges, in the order given
    assert [s.name for s in resolve_layers(["last", "-3", "0-1", FIRST_LAST_AVG], 3)] == ["2", "0", "1", FIRST_LAST_AVG]
    assert resolve_layers(None, 3) == [LayerSelection("0", (0,)), LayerSelection("1", (1,)), LayerSelection("2", (2,)),
                                       LayerSelection(FIRST_LAST_AVG, (1, 2))]
    with pytest.raises(ValueError, match="whitening, abtt"):
        evaluate_sts(StubEncoder(), [stub_dataset("d", 5)], methods=["pca"])


# ---- tiny-bert: pooled vectors against a direct forward pass --------------------------------

TEXTS = ["A girl is styling her hair.", "Unbelievably, the antidisestablishmentarian ate 3.14 pies!", "A"]


@pytest.fixture(scope="module")
def tiny_bert():
    return load_encoder("tiny-bert", device="cpu")


def manual_sentence_vectors(encoder, text: str, *, include_special: bool) -> np.ndarray:
    """Every layer's mean over the pieces of one text, with or without [CLS]/[SEP]."""
    ids = encoder.tokenizer(text)["input_ids"]
    assert ids[0] == encoder.tokenizer.cls_token_id and ids[-1] == encoder.tokenizer.sep_token_id
    with torch.no_grad():
        hidden = encoder.model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    states = torch.stack(hidden)[:, 0].double().numpy()  # (n_layers, n_pieces, dim)
    return states.mean(axis=1) if include_special else states[:, 1:-1].mean(axis=1)


@pytest.mark.parametrize("include_special", [True, False])
def test_sentence_vectors_equal_manual_mean_over_pieces(tiny_bert, include_special):
    layers = list(range(tiny_bert.n_layers))
    vectors = encode_sentences(tiny_bert, TEXTS, layer_indexes=layers, include_special=include_special)
    expected = np.stack([manual_sentence_vectors(tiny_bert, t, include_special=include_special) for t in TEXTS], axis=1)
    np.testing.assert_allclose(vectors, expected, atol=1e-5)
    other = np.stack([manual_sentence_vectors(tiny_bert, t, include_special=not include_special) for t in TEXTS], axis=1)
    assert np.abs(vectors - other).max() > 1e-3  # the choice matters


def test_pooled_cosine_spearman_equals_direct_computation(tiny_bert):
    sentences1 = ["A girl is styling her hair.", "The cat sat.", "Stocks fell sharply today.", "A man plays guitar."]
    sentences2 = ["A girl is brushing her hair.", "A dog ran.", "Markets dropped on Monday.", "A man is playing a guitar."]
    dataset = STSDataset("tiny", "test", ["tiny"] * 4, sentences1, sentences2, np.array([4.0, 1.0, 3.2, 4.6]))
    records = evaluate_sts(tiny_bert, [dataset], layers=[2, FIRST_LAST_AVG])
    last = tiny_bert.n_layers - 1
    for layer_name, layers in (("2", [2]), (FIRST_LAST_AVG, [1, last])):
        cosines = []
        for a, b in zip(sentences1, sentences2):
            u = manual_sentence_vectors(tiny_bert, a, include_special=True)[layers].mean(axis=0)
            v = manual_sentence_vectors(tiny_bert, b, include_special=True)[layers].mean(axis=0)
            cosines.append(u @ v / np.linalg.norm(u) / np.linalg.norm(v))
        (record,) = [r for r in records if r["layer"] == layer_name]
        assert record["spearman"] == pytest.approx(100 * spearmanr(dataset.scores, cosines).statistic, abs=1e-6)
        assert record["special_tokens"] == "included" and record["pooling"] == "mean"


# ---- CLI ------------------------------------------------------------------------------------


def write_tiny_data(root) -> None:
    """Small files in each supported format: a 9-field STS-B row and a stray quote, an aggregate
    gold file and an unscored pair in STS12, CRLF in SICK."""
    stsb = root / "stsbenchmark"
    stsb.mkdir()
    rows = [
        ("main-captions", "MSRvid", "2012test", "0001", "5.000", "A man is playing a guitar.", "A man plays the guitar."),
        ("main-news", "headlines", "2013", "0002", "1.200", 'He said "no to the plan.', "Stocks fell on Monday."),
        ("main-forums", "deft", "2014", "0003", "3.000", "The cat sat on the mat.", "A cat is sitting on a mat.", "extra", "cols"),
        ("main-captions", "MSRvid", "2012test", "0004", "0.400", "A woman is slicing onions.", "A boy rides a bike."),
    ]
    (stsb / "sts-test.csv").write_text("".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")
    year = root / "STS_raw" / "STS12-en-test"
    year.mkdir(parents=True)
    subsets = {
        "MSRvid": (["A dog runs.\tA dog is running.", "A man cooks.\tA woman sings.", "Kids play.\tChildren are playing."], ["4.8", "0.5", "4.2"]),
        "OnWN": (["a small house\ta little home", "to run fast\tto eat slowly", "red car\tblue sky"], ["4.5", "", "0.2"]),
    }
    for name, (pairs, gold) in subsets.items():
        (year / f"STS.input.{name}.txt").write_text("\n".join(pairs) + "\n", encoding="utf-8")
        (year / f"STS.gs.{name}.txt").write_text("\n".join(gold) + "\n", encoding="utf-8")
    (year / "STS.gs.ALL.txt").write_text("4.8\n0.5\n4.2\n4.5\n0.2\n", encoding="utf-8")
    sick = root / "SICK"
    sick.mkdir()
    header = "pair_ID\tsentence_A\tsentence_B\tentailment_label\trelatedness_score\tSemEval_set"
    lines = [header, "1\tA boy runs\tA kid is running\tENTAILMENT\t4.7\tTEST", "2\tA cat eats\tA man reads\tNEUTRAL\t1.1\tTEST",
             "3\tA girl sings\tA woman is singing\tENTAILMENT\t4.1\tTEST", "4\tTwo dogs play\tDogs are playing\tENTAILMENT\t4.6\tTRAIN"]
    (sick / "SICK.txt").write_bytes("\r\n".join(lines).encode("utf-8"))


def test_cli_end_to_end_on_tiny_data(tmp_path, tiny_bert):
    write_tiny_data(tmp_path)
    out = tmp_path / "sts.json"
    result = CliRunner().invoke(app, [
        "sts", "tiny-bert", "--data-dir", str(tmp_path), "--out", str(out), "--layers", "0,first-last-avg",
        "--methods", "whitening,abtt,standardize", "--markdown", str(tmp_path / "sts.md"), "--device", "cpu",
    ], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    # readable at 80 columns: no cell cut short, and the grid's numbers are the records' means
    assert "…" not in result.output and all(len(line) <= 80 for line in result.output.splitlines())
    grid_row = next(line for line in result.output.splitlines() if line.startswith("│ first-last-avg"))
    whitening_all = [r["spearman"] for r in json.loads(out.read_text())["records"]
                     if r["layer"] == "first-last-avg" and r["method"] == "whitening" and r["aggregation"] == "all"]
    assert f"{np.mean(whitening_all):.1f}" in grid_row
    document = json.loads(out.read_text())
    assert document["kind"] == "sts" and document["model_id"] == "tiny-bert" and "layer 0" in document["layer_note"]
    records = document["records"]
    # (STS-B, SICK-R: "all"; STS12: "all" and "mean") x 2 layers x (none + 3 calibrators, transductive)
    assert len(records) == 4 * 2 * 4
    pairs = {(r["dataset"], r["aggregation"]): r["n_pairs"] for r in records}
    assert pairs == {("STS-B", "all"): 4, ("STS12", "all"): 5, ("STS12", "mean"): 5, ("SICK-R", "all"): 3}
    assert {r["fit_on"] for r in records if r["method"] == "whitening"} == {"transductive"}
    assert all(np.isfinite(r[m]) for r in records for m in ("log_partition_isotropy", "isoscore", "average_cosine"))
    # One value checked against a direct computation: STS-B, layer 0, uncalibrated.
    stsb = read_stsb(tmp_path / "stsbenchmark", "test")
    assert stsb.sentences1[1] == 'He said "no to the plan.' and stsb.sentences2[2] == "A cat is sitting on a mat."
    cosines = []
    for a, b in zip(stsb.sentences1, stsb.sentences2):
        u, v = (manual_sentence_vectors(tiny_bert, t, include_special=True)[0] for t in (a, b))
        cosines.append(u @ v / np.linalg.norm(u) / np.linalg.norm(v))
    (record,) = [r for r in records if r["dataset"] == "STS-B" and r["layer"] == "0" and r["method"] == "none"]
    assert record["spearman"] == pytest.approx(100 * spearmanr(stsb.scores, cosines).statistic, abs=1e-6)
    assert "STS12 mean" in (tmp_path / "sts.md").read_text()
    assert (tmp_path / "sts.csv").exists()


def test_cli_bad_data_folder_and_unknown_method(tmp_path):
    result = CliRunner().invoke(app, ["sts", "tiny-bert", "--data-dir", str(tmp_path)])
    assert result.exit_code == 2
    for looked_for in ("sts-<split>.csv", "STS.input.<subset>.txt", "SICK"):
        assert looked_for in result.output.replace("\n", "")
    result = CliRunner().invoke(app, ["sts", "tiny-bert", "--data-dir", str(tmp_path), "--methods", "whitening,pca"])
    assert result.exit_code == 2
    assert all(m in result.output for m in CALIBRATION_METHODS)


def test_combined_layers_take_the_one_layer_grammar() -> None:
    """`--combine` specs are layer specs, resolved against the model's layers: "first,last", negative
    numbers and ranges name the layers averaged; a layer the model lacks is refused naming `combine`."""
    from lmgeom.errors import InputError
    from lmgeom.stages.sts import Combined, LayerSelection, resolve_layers

    got = resolve_layers([Combined("first,last"), Combined("0,-1"), Combined("1-3")], n_layers=7)
    assert got == [LayerSelection("avg(0,6)", (0, 6)), LayerSelection("avg(1,2,3)", (1, 2, 3))]  # the first two coincide
    with pytest.raises(InputError, match="combine"):
        resolve_layers([Combined("0,9")], n_layers=7)
