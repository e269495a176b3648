"""Word sense disambiguation (Peters et al. 2018, Table 5): Raganato's reader and scorer, sense
vectors, WordNet's first sense, the exact McNemar test and the experiment end to end."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from lmgeom.errors import InputError, MissingInput
from lmgeom.evaluate.wsd import FirstSense, Instance, SenseVectors, correct, mcnemar_exact, read_wsd_dataset, score


# ---- scorer ------------------------------------------------------------------------------------
def _brute_force(answers: dict[str, list[str] | None], gold: dict[str, set[str]]) -> tuple[float, float, float]:
    earned = answered = 0.0
    for instance in gold:
        keys = answers.get(instance)
        if not keys:
            continue
        answered += 1
        earned += sum(1 for key in keys if key in gold[instance]) / len(keys)
    p, r = earned / answered, earned / len(gold)
    return p, r, 2 * p * r / (p + r) if p + r else 0.0


def test_score_matches_raganatos_rule_on_a_hand_made_set() -> None:
    gold = {"a": {"x%1"}, "b": {"y%1", "y%2"}, "c": {"z%1"}, "d": {"w%1"}, "e": {"v%1"}}
    answers: dict[str, list[str] | None] = {"a": ["x%1"], "b": ["y%2", "y%3"], "c": ["z%9"], "d": None, "e": ["v%1", "v%1", "v%2"],
                                            "not-in-gold": ["q%1"]}
    result = score(answers, gold)
    p, r, f1 = _brute_force(answers, gold)
    # by hand: earned 1 + 1/2 + 0 + 2/3 = 13/6 over 4 answered and 5 instances
    assert result.precision == pytest.approx(13 / 24) == pytest.approx(p)
    assert result.recall == pytest.approx(13 / 30) == pytest.approx(r)
    assert result.f1 == pytest.approx(f1)
    assert (result.answered, result.instances) == (4, 5)
    # a single key per instance, everything answered: P = R = F1 = accuracy
    single = score({"a": "x%1", "b": "y%1", "c": "z%2", "d": "w%1", "e": "u%1"}, gold)
    assert single.precision == single.recall == single.f1 == pytest.approx(3 / 5)


def test_every_small_answer_set_agrees_with_brute_force() -> None:
    gold = {"a": {"k1"}, "b": {"k1", "k2"}, "c": {"k3"}}
    choices: list[list[str] | None] = [None, ["k1"], ["k2"], ["k1", "k2"], ["k3", "k1"]]
    for combination in itertools.product(choices, repeat=3):
        answers = dict(zip("abc", combination))
        if not any(combination):
            assert score(answers, gold).f1 == 0.0
            continue
        p, r, f1 = _brute_force(answers, gold)
        result = score(answers, gold)
        assert (result.precision, result.recall, result.f1) == pytest.approx((p, r, f1))


# ---- reader ------------------------------------------------------------------------------------
def test_reader_on_semeval2007(shared_data: Path) -> None:
    folder = shared_data / "WSD_Evaluation_Framework" / "Evaluation_Datasets" / "semeval2007"
    dataset = read_wsd_dataset(folder)
    assert (dataset.name, len(dataset.sentences), len(dataset.instances)) == ("semeval2007", 135, 455)
    first = dataset.instances[0]
    assert first == Instance(id="d000.s000.t000", lemma="refer", pos="VERB", sentence=0, position=9)
    assert dataset.sentences[0][:10] == ["Your", "Oct.", "6", "editorial", "``", "The", "Ill", "Homeless", "``", "referred"]
    assert dataset.gold["d000.s000.t000"] == {"refer%2:32:01::"}
    assert sum(len(keys) > 1 for keys in dataset.gold.values()) > 0  # some instances have several gold keys


def test_reader_refuses_a_gold_file_that_does_not_match(tmp_path: Path) -> None:
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "tiny.data.xml").write_text('<corpus><text id="d0"><sentence id="d0.s0"><wf lemma="a" pos="DET">A</wf>'
                                          '<instance id="d0.s0.t0" lemma="bank" pos="NOUN">bank</instance></sentence></text></corpus>')
    (folder / "tiny.gold.key.txt").write_text("d0.s0.t9 bank%1:17:01::\n")
    with pytest.raises(InputError, match="1 instances have no gold key"):
        read_wsd_dataset(folder)
    with pytest.raises(MissingInput, match="no other.data.xml"):
        read_wsd_dataset(folder, "other")


# ---- sense vectors -----------------------------------------------------------------------------
def test_sense_vectors_are_means_and_the_nearest_sense_of_the_lemma_wins() -> None:
    train = [Instance("t0", "bank", "NOUN", 0, 0), Instance("t1", "bank", "NOUN", 1, 0), Instance("t2", "bank", "NOUN", 2, 0),
             Instance("t3", "run", "VERB", 3, 0)]
    gold = {"t0": {"bank%river"}, "t1": {"bank%river"}, "t2": {"bank%money", "bank%river"}, "t3": {"run%go"}}
    vectors = np.array([[1.0, 0.0], [3.0, 2.0], [0.0, 4.0], [5.0, 5.0]])
    senses = SenseVectors.fit(vectors, train, gold)
    mean = dict(zip(senses.keys, senses.vectors))
    np.testing.assert_allclose(mean["bank%river"], [4 / 3, 2.0])  # t0, t1 and t2 (tagged with both)
    np.testing.assert_allclose(mean["bank%money"], [0.0, 4.0])
    assert dict(zip(senses.keys, senses.counts.tolist())) == {"bank%river": 3, "bank%money": 1, "run%go": 1}
    test = [Instance("x0", "bank", "NOUN", 0, 0), Instance("x1", "bank", "NOUN", 0, 1), Instance("x2", "bank", "VERB", 0, 2),
            Instance("x3", "Bank", "NOUN", 0, 3)]
    # cosines to river (4/3, 2) and money (0, 4): (1, 0.1) is nearer river; (0.1, 1) nearer money
    answers = senses.predict(np.array([[1.0, 0.1], [0.1, 1.0], [1.0, 0.0], [0.1, 1.0]]), test)
    assert answers == ["bank%river", "bank%money", None, "bank%money"]  # bank as a verb is not covered; lemma case ignored
    assert [senses.covers(i) for i in test] == [True, True, False, True]
    assert senses.most_frequent(test) == ["bank%river", "bank%river", None, "bank%river"]  # 3 occurrences against 1


# ---- WordNet's first sense ---------------------------------------------------------------------
def _write_wordnet(folder: Path) -> None:
    """A WordNet in miniature, in the database format: data lines found by their byte offsets."""
    folder.mkdir(parents=True, exist_ok=True)
    def data(lines: list[str]) -> tuple[str, list[int]]:
        header = "  1 This is a miniature of WordNet 3.0's database files, for a test.\n"
        text, offsets = header, []
        for line in lines:
            offsets.append(len(text.encode()))
            text += line.replace("OFFSET", f"{len(text.encode()):08d}") + "\n"
        return text, offsets

    noun, (river, money) = data(["OFFSET 17 n 01 bank 1 000 | sloping land",
                                 "OFFSET 06 n 02 depository_financial_institution 0 bank 0 000 | a financial institution"])
    (folder / "data.noun").write_text(noun)
    (folder / "index.noun").write_text("  1 licence header\n"
                                       f"bank n 2 0 2 1 {money:08d} {river:08d}\n")  # money listed first: the first sense
    adjective, (dense, thick) = data(["OFFSET 00 a 01 dense(a) 0 000 | crowded",
                                      "OFFSET 00 s 02 heavy 2 thick 1 001 & 00000000 a 0000 | dense"])
    adjective = adjective.replace("& 00000000 a", f"& {dense:08d} a")
    (folder / "data.adj").write_text(adjective)
    (folder / "index.adj").write_text(f"dense a 1 0 1 0 {dense:08d}\nthick a 1 0 1 0 {thick:08d}\n")
    for stem in ("verb", "adv"):
        (folder / f"data.{stem}").write_text("  1 empty\n")
        (folder / f"index.{stem}").write_text("  1 empty\n")


def test_first_sense_keys_from_database_files(tmp_path: Path) -> None:
    _write_wordnet(tmp_path)
    first = FirstSense.load(tmp_path)
    assert first.key("bank", "NOUN") == "bank%1:06:00::"  # the first synset of the index line, its lex_id for bank
    assert first.key("Bank", "n") == "bank%1:06:00::"
    assert first.key("dense", "ADJ") == "dense%3:00:00::"  # the (a) marker is not part of the lemma
    assert first.key("thick", "ADJ") == "thick%5:00:01:dense:00"  # a satellite names its head word and head id
    assert first.key("bank", "VERB") is None and first.key("river", "NOUN") is None and first.key("bank", "X") is None


def test_first_sense_says_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(MissingInput, match="apt-get install wordnet-base"):
        FirstSense.load(tmp_path)


@pytest.fixture
def wordnet() -> FirstSense:
    try:
        return FirstSense.load()
    except MissingInput:
        pytest.skip("WordNet 3.0 database files not installed (apt-get install wordnet-base)")


def test_first_sense_baseline_on_raganatos_sets(wordnet: FirstSense, shared_data: Path) -> None:
    """WordNet's first sense scores what Raganato et al. (2017, Table 3) report for it on each set."""
    root = shared_data / "WSD_Evaluation_Framework" / "Evaluation_Datasets"
    assert wordnet.key("bank", "NOUN") == "bank%1:17:01::"
    for name, expected in (("semeval2007", 55.2), ("semeval2015", 67.8)):
        dataset = read_wsd_dataset(root / name)
        answers = {i.id: wordnet.key(i.lemma, i.pos) for i in dataset.instances}
        assert None not in answers.values()
        assert round(100 * score(answers, dataset.gold).f1, 1) == expected


# ---- paired test -------------------------------------------------------------------------------
def test_exact_mcnemar_by_hand() -> None:
    first = np.array([True] * 8 + [False] * 2 + [True] * 5 + [False] * 3)
    second = np.array([False] * 8 + [True] * 2 + [True] * 5 + [False] * 3)
    result = mcnemar_exact(first, second)
    assert (result.n, result.only_first, result.only_second) == (18, 8, 2)
    assert result.p_value == pytest.approx(2 * (1 + 10 + 45) / 2**10)  # two-sided binomial, 10 discordant pairs
    assert mcnemar_exact(first, first).p_value == 1.0
    assert correct(["a", None, "c"], [{"a"}, {"b"}, {"d"}]).tolist() == [True, False, False]


# ---- the experiment ----------------------------------------------------------------------------
def _write_framework(root: Path) -> None:
    """Five tiny datasets on which a lemma's senses repeat across sets (so some instances are covered)."""
    sentences = [("the bank of the river", 1, "bank%1:17:01::"), ("the bank lent money", 1, "bank%1:06:00::"),
                 ("a thick fog", 1, "thick%5:00:01:dense:00")]
    for k, name in enumerate(("senseval2", "senseval3", "semeval2007", "semeval2013", "semeval2015")):
        folder = root / "Evaluation_Datasets" / name
        folder.mkdir(parents=True)
        body, keys = [], []
        for s, (text, position, key) in enumerate(sentences[: 2 + k % 2]):
            tokens = []
            for w, word in enumerate(text.split()):
                if w == position:
                    tokens.append(f'<instance id="d0.s{s}.t0" lemma="{word}" pos="{"ADJ" if word == "thick" else "NOUN"}">{word}</instance>')
                    keys.append(f"d0.s{s}.t0 {key}")
                else:
                    tokens.append(f'<wf lemma="{word}" pos="X">{word}</wf>')
            body.append(f'<sentence id="d0.s{s}">{"".join(tokens)}</sentence>')
        (folder / f"{name}.data.xml").write_text(f'<corpus lang="en"><text id="d0">{"".join(body)}</text></corpus>')
        (folder / f"{name}.gold.key.txt").write_text("\n".join(keys) + "\n")


def test_experiment_end_to_end_on_a_tiny_model(tmp_path: Path) -> None:
    from lmgeom.cli.main import app

    _write_framework(tmp_path / "wsd")
    _write_wordnet(tmp_path / "wn")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["experiment", "wsd", "--model", "tiny-bert", "--data", str(tmp_path / "wsd"),
                                      "--wordnet", str(tmp_path / "wn"), "--layers", "0,1", "--device", "cpu", "--out", str(out)])
    assert result.exit_code == 0, result.output
    document = json.loads((out / "results.json").read_text())
    assert document["kind"] == "experiment-wsd"
    # every set has bank twice (both senses), senseval3 and semeval2013 also thick: all covered by the other four
    assert document["coverage"]["ALL"] == {"covered": 12, "instances": 12}
    first = next(row for row in document["scores"] if row["label"] == "WordNet first sense")
    # first sense of bank is bank%1:06:00:: (money) in the miniature WordNet; thick's is right
    expected = {"senseval2": 1 / 2, "senseval3": 2 / 3, "semeval2007": 1 / 2, "semeval2013": 2 / 3, "semeval2015": 1 / 2, "ALL": 7 / 12}
    assert first["f1"] == pytest.approx(expected)
    rows = [line.split(",") for line in (out / "predictions.csv").read_text().splitlines()]
    header, body = rows[0], rows[1:]
    assert len(body) == 12 and header[:4] == ["dataset", "id", "covered", "gold"]
    layer0 = [row[header.index("layer 0")] == row[3] for row in body]
    layer_row = next(row for row in document["scores"] if row["label"] == "layer 0")
    assert layer_row["f1"]["ALL"] == pytest.approx(sum(layer0) / 12)
    test = next(t for t in document["tests"] if t["comparison"] == "layer 0 vs layer 1")
    assert test["n"] == 12 and math.isfinite(test["p_value"])
    bad = CliRunner().invoke(app, ["experiment", "wsd", "--model", "tiny-bert", "--data", str(tmp_path / "wsd"),
                                   "--wordnet", str(tmp_path / "missing"), "--out", str(tmp_path / "o2")])
    assert bad.exit_code == 2 and "wordnet-base" in bad.output
