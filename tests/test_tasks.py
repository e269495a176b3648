from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from lmgeom.corpus.splits import brown_heldout_files
from lmgeom.evaluate.tasks import (
    SentenceTask,
    TaggingTask,
    base_brown_tag,
    load_task,
    matthews,
    read_conllu_upos,
    score,
)


def sizes(task: SentenceTask) -> dict[str, int]:
    return {name: len(split.inputs) for name, split in task.splits.items()}


def test_glue_readers_give_the_shipped_row_counts(shared_data: Path) -> None:
    glue = shared_data / "GLUE"
    cola = load_task("cola", glue / "CoLA")
    assert isinstance(cola, SentenceTask)
    assert sizes(cola) == {"train": 8551, "dev": 527, "dev_out_of_domain": 516}
    assert cola.splits["dev"].inputs[0] == "The sailors rode the breeze clear of the rocks."
    assert sizes(load_task("sst2", glue / "SST-2")) == {"train": 67349, "dev": 872}  # type: ignore[arg-type]
    mrpc = load_task("mrpc", glue / "MRPC")
    assert isinstance(mrpc, SentenceTask) and mrpc.pairs
    assert sizes(mrpc) == {"train": 3668, "dev": 408, "test": 1725}
    # a quote that opens and never closes stays in the text (csv quoting off)
    assert mrpc.splits["dev"].inputs[0][1].startswith('"The foodservice pie business')
    rte = load_task("rte", glue / "RTE")
    assert isinstance(rte, SentenceTask)
    assert sizes(rte) == {"train": 2490, "dev": 277}
    assert rte.splits["dev"].labels[:2].tolist() == [1, 0]  # not_entailment, entailment (HF export: 0 = entailment)
    stsb = load_task("stsb", glue / "STS-B")
    assert isinstance(stsb, SentenceTask) and stsb.kind == "regression"
    assert sizes(stsb) == {"train": 5749, "dev": 1500}
    assert stsb.splits["dev"].labels[:2].tolist() == [5.0, 4.75]


def test_rte_from_the_superglue_copy_has_the_same_labels(shared_data: Path, tmp_path: Path) -> None:
    (tmp_path / "superglue_jsonl").symlink_to(shared_data / "GLUE" / "RTE" / "superglue_jsonl")
    superglue = load_task("rte", tmp_path)
    export = load_task("rte", shared_data / "GLUE" / "RTE")
    assert isinstance(superglue, SentenceTask) and isinstance(export, SentenceTask)
    for split in ("train", "dev"):
        np.testing.assert_array_equal(superglue.splits[split].labels, export.splits[split].labels)


def test_sick_entailment_counts_and_labels(shared_data: Path, tmp_path: Path) -> None:
    sick = load_task("sick-e", shared_data / "SICK")
    assert isinstance(sick, SentenceTask) and sick.pairs and sick.name == "sicke"
    assert sizes(sick) == {"train": 4439, "dev": 495, "test": 4906}  # SemEval-2014 Task 1's TRAIN, TRIAL, TEST
    assert sick.classes == ["entailment", "neutral", "contradiction"]
    # the full release of 9,840 pairs (its SemEval_set split; the separate SemEval-2014 files are not shipped)
    assert np.bincount(sick.splits["train"].labels).tolist() == [1274, 2524, 641]
    assert np.bincount(sick.splits["test"].labels).tolist() == [1404, 2790, 712]
    assert sick.splits["train"].inputs[0] == ("A group of kids is playing in a yard and an old man is standing in the background",
                                              "A group of boys in a yard is playing and a man is standing in the background")
    header = "pair_ID\tsentence_A\tsentence_B\tentailment_label\trelatedness_score\tSemEval_set\n"
    (tmp_path / "SICK.txt").write_text(header + "1\tA b.\tC d.\tNEUTRAL\t3.0\tTRAIN\n2\tE f.\tG h.\tUNKNOWN\t1.0\tTEST\n")
    with pytest.raises(ValueError, match=r"unknown entailment labels \['UNKNOWN'\]"):
        load_task("sicke", tmp_path)
    (tmp_path / "SICK.txt").write_text(header.replace("entailment_label\t", "") + "1\tA b.\tC d.\t3.0\tTRAIN\n")
    with pytest.raises(ValueError, match=r"lacks the column\(s\) \['entailment_label'\]"):
        load_task("sicke", tmp_path)


def test_ud_pos_counts_the_word_rows(shared_data: Path) -> None:
    task = load_task("pos", shared_data / "UD_English-EWT")
    assert isinstance(task, TaggingTask)
    assert {name: len(split.sentences) for name, split in task.splits.items()} == {"train": 2001, "test": 2077}
    path = shared_data / "UD_English-EWT" / "en_ewt-ud-test.conllu"
    word_rows = sum(1 for line in path.read_text().splitlines() if line.split("\t")[0].isdigit())
    assert task.splits["test"].n_tokens == word_rows == 25094
    assert len(task.tagset) == 17 and "PROPN" in task.tagset


def test_conllu_multiword_tokens_split_as_ud_and_empty_nodes_dropped(tmp_path: Path) -> None:
    rows = [
        "# text = I don't.", "1\tI\tI\tPRON\t_\t_\t3\tnsubj\t_\t_", "2-3\tdon't\t_\t_\t_\t_\t_\t_\t_\t_",
        "2\tdo\tdo\tAUX\t_\t_\t3\taux\t_\t_", "3\tn't\tnot\tPART\t_\t_\t0\troot\t_\t_",
        "3.1\tgo\tgo\tVERB\t_\t_\t_\t_\t_\t_", "4\t.\t.\tPUNCT\t_\t_\t3\tpunct\t_\t_", "",
    ]
    (tmp_path / "a.conllu").write_text("\n".join(rows) + "\n")
    split = read_conllu_upos(tmp_path / "a.conllu")
    assert split.sentences == [["I", "do", "n't", "."]]
    assert split.tags == [["PRON", "AUX", "PART", "PUNCT"]]


def test_brown_base_tags_and_held_out_files(shared_data: Path) -> None:
    assert [base_brown_tag(t) for t in ("np-tl", "NN-HL", "np$", "dod*", "fw-in", "ppss+bem", "--", "*", "pp$$", "nns$-tl")] == [
        "np", "nn", "np", "dod", "in", "ppss", "--", "*", "pp", "nns"]
    directory = shared_data / "brown"
    held_out = brown_heldout_files(directory)
    task = load_task("brown", directory, brown_test_files=held_out)
    assert isinstance(task, TaggingTask)
    assert len(held_out) == 50
    expected = sum(len(line.split()) for name in held_out for line in (directory / name).read_text().splitlines())
    assert task.splits["test"].n_tokens == expected
    listed = [line.split()[0] for line in (directory / "cats.txt").read_text().splitlines() if line.strip()]
    total = sum(len(line.split()) for name in listed for line in (directory / name).read_text().splitlines())
    assert task.splits["train"].n_tokens + expected == total
    assert not any(c in tag for tag in task.tagset for c in "$+") and "np-tl" not in task.tagset


def test_bad_input_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="missing in_domain_train.tsv"):
        load_task("cola", tmp_path)
    with pytest.raises(FileNotFoundError, match="glue_hf_export"):
        load_task("rte", tmp_path)
    with pytest.raises(ValueError, match="unknown task 'qqp'"):
        load_task("qqp", tmp_path)
    for name, text in (("in_domain_train.tsv", "s\t1\t\tA b.\ns\t1\t\tC d.\n"), ("in_domain_dev.tsv", "s\t0\t\tE f.\n"),
                       ("out_of_domain_dev.tsv", "s\t1\t\tG h.\n")):
        (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=r"labels \[0\] of split 'dev' never occur in the training split"):
        load_task("cola", tmp_path)
    (tmp_path / "out_of_domain_dev.tsv").write_text("")
    (tmp_path / "in_domain_dev.tsv").write_text("s\t1\t\tE f.\n")
    with pytest.raises(ValueError, match="split 'dev_out_of_domain' is empty"):
        load_task("cola", tmp_path)


def test_metrics_equal_scikit_learn_and_scipy(shared_data: Path) -> None:
    rng = np.random.default_rng(0)
    cola = load_task("cola", shared_data / "GLUE" / "CoLA")
    mrpc = load_task("mrpc", shared_data / "GLUE" / "MRPC")
    stsb = load_task("stsb", shared_data / "GLUE" / "STS-B")
    truth = rng.integers(0, 2, 200)
    guess = np.where(rng.random(200) < 0.7, truth, 1 - truth)
    assert score(cola, truth, guess) == {"matthews": pytest.approx(matthews_corrcoef(truth, guess), abs=1e-15)}
    assert score(mrpc, truth, guess) == {"f1": pytest.approx(f1_score(truth, guess), abs=1e-15),
                                         "accuracy": pytest.approx(accuracy_score(truth, guess), abs=1e-15)}
    # closed form: TP=2 TN=1 FP=1 FN=0 -> MCC = (2*1 - 1*0) / sqrt(3*2*2*1)
    assert score(cola, np.array([1, 1, 0, 0]), np.array([1, 1, 0, 1]))["matthews"] == pytest.approx(2 / np.sqrt(12))
    many, guessed = rng.integers(0, 5, 300), rng.integers(0, 5, 300)
    assert matthews(many, guessed) == pytest.approx(matthews_corrcoef(many, guessed), abs=1e-12)
    for constant in (np.zeros(200, dtype=int), np.ones(200, dtype=int)):
        assert score(cola, truth, constant)["matthews"] == matthews_corrcoef(truth, constant) == 0.0
        assert score(mrpc, truth, constant)["f1"] == pytest.approx(f1_score(truth, constant, zero_division=0.0))
    gold = rng.random(50) * 5
    pred = gold + rng.normal(size=50)
    result = score(stsb, gold, pred)
    assert result["pearson"] == pytest.approx(stats.pearsonr(gold, pred).statistic, abs=1e-12)
    assert result["spearman"] == pytest.approx(stats.spearmanr(gold, pred).statistic, abs=1e-12)
