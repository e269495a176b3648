"""Corpus input is read as written or refused with an error naming the option: `limit`/`sample` at
least 1, JSONL values that are strings, built-in names over files of the same name, lines that end
only at \\n; and a corpus of identical sentences analyses with its spread-less measures undefined."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from lmgeom.cli import common
from lmgeom.cli.main import app
from lmgeom.corpus import Corpus, CorpusStream, load_corpus, open_corpus, segment_words
from lmgeom.corpus.builtin import gensim_test_data

runner = CliRunner()


def one_error_line(result: Any) -> str:
    """The CLI's one `error:` line (exit 2, no traceback)."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


@pytest.fixture()
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common.err_console, "width", 10_000)  # so the terminal width does not wrap the line


def lee_first_sentences(n: int) -> list[str]:
    return [s.text for s in load_corpus("lee")][:n]


# ---- limit and sample ---------------------------------------------------------------------------

BAD_COUNTS = [("limit", 0), ("limit", -1), ("sample", 0), ("sample", -3), ("limit", 2.5), ("sample", True)]


@pytest.mark.parametrize(("option", "value"), BAD_COUNTS)
@pytest.mark.parametrize("reader", [load_corpus, open_corpus])
def test_limit_and_sample_below_one_are_refused(reader: Any, option: str, value: Any) -> None:
    with pytest.raises(ValueError) as raised:
        reader("lee", **{option: value})
    message = str(raised.value)
    assert f"`{option}` must be a number of sentences, at least 1" in message
    assert "left out (None) for the whole corpus" in message and message.endswith(f"got {value!r}")


def test_the_corpus_methods_refuse_them_too() -> None:
    corpus = Corpus.from_list(["One two.", "Three four.", "Five six."])
    stream = CorpusStream("three", lambda: ["One two.", "Three four.", "Five six."])
    for call, option in ((lambda: corpus.head(0), "limit"), (lambda: corpus.head(-1), "limit"),
                         (lambda: corpus.sample(-3), "sample"), (lambda: stream.head(0), "limit"),
                         (lambda: stream.sample(0), "sample"), (lambda: corpus.select(limit=-1), "limit")):
        with pytest.raises(ValueError, match=rf"`{option}` must be a number of sentences, at least 1"):
            call()


def test_valid_limits_and_samples_keep_what_they_say() -> None:
    first = lee_first_sentences(3)
    assert [s.text for s in load_corpus("lee", limit=1)] == first[:1]
    assert [s.text for s in open_corpus("lee", limit=3)] == first
    assert load_corpus("lee", limit=1).name == "lee[:1]" and len(load_corpus("lee", limit=None)) == 2680
    drawn = load_corpus("lee", sample=4, seed=7)
    order = [s.text for s in load_corpus("lee")]
    positions = [order.index(s.text) for s in drawn]
    assert len(drawn) == 4 and positions == sorted(positions) and drawn.name == "lee[sample 4, seed 7]"
    assert [s.text for s in load_corpus("lee", sample=4, seed=7, limit=2)] == [s.text for s in drawn][:2]
    assert [s.text for s in open_corpus("lee", sample=4, seed=7)] == [s.text for s in drawn]


def test_extract_model_and_run_refuse_them_before_writing(tmp_path: Path) -> None:
    from lmgeom.stages import extract_model
    from lmgeom.pipeline import run

    with pytest.raises(ValueError, match=r"`limit` must be"):
        extract_model("tiny-bert", "lee", out=tmp_path / "e", limit=0, device="cpu")
    with pytest.raises(ValueError, match=r"`sample` must be"):
        extract_model("tiny-bert", "lee", out=tmp_path / "e", sample=-3, device="cpu", engine="ray")
    with pytest.raises(ValueError, match=r"`limit` must be"):
        run("tiny-bert", "lee", out=tmp_path / "r", limit=-1, device="cpu")
    assert not (tmp_path / "e").exists() and not (tmp_path / "r").exists()


@pytest.mark.parametrize("args", [
    ["extract", "tiny-bert", "--limit", "0"], ["extract", "tiny-bert", "--limit", "-1"],
    ["extract", "tiny-bert", "--sample", "0"], ["extract", "tiny-bert", "--sample", "-3"],
    ["run", "--model", "tiny-bert", "--limit", "0"], ["run", "--model", "tiny-bert", "--limit", "-1"],
])
def test_cli_names_the_option(tmp_path: Path, wide_console: None, args: list[str]) -> None:
    option, value = args[-2], args[-1]
    line = one_error_line(runner.invoke(app, [*args, "--out", str(tmp_path / "out"), "--device", "cpu"]))
    assert line.startswith(f"error: {option} must be a number of sentences, at least 1")
    assert line.endswith(f"got {value}")
    assert not (tmp_path / "out").exists()


# ---- JSONL values -------------------------------------------------------------------------------

BAD_VALUES = [
    ({"a": 1}, 'an object ({"a": 1})'),
    (5, "a number (5)"),
    (2.5, "a number (2.5)"),
    (None, "null"),
    (True, "a boolean (true)"),
    (["two", 2, "words"], "a list whose item 1 is a number (2)"),
    ([["nested"]], 'a list whose item 0 is a list (["nested"])'),
]


def jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records), encoding="utf-8")
    return path


@pytest.mark.parametrize(("value", "described"), BAD_VALUES)
def test_a_jsonl_value_that_is_not_a_string_names_file_line_and_field(tmp_path: Path, value: Any, described: str) -> None:
    path = jsonl(tmp_path / "c.jsonl", [{"text": "Fine."}, {"text": ["pre", "tokenized"]}, {"text": value}])
    expected = (f"{path}: line 3: field 'text' holds {described}; it must be a string (the sentence), "
                "or a list of strings (a pre-tokenized sentence's words)")
    with pytest.raises(ValueError) as loaded:
        load_corpus(str(path))
    with pytest.raises(ValueError) as streamed:
        open_corpus(str(path)).summary()
    assert str(loaded.value) == str(streamed.value) == expected


def test_the_cli_shows_a_bad_jsonl_value_as_one_line(tmp_path: Path, wide_console: None) -> None:
    path = jsonl(tmp_path / "c.jsonl", [{"text": "Fine."}, {"text": {"a": 1}}])
    line = one_error_line(runner.invoke(app, ["extract", "tiny-bert", "--corpus", str(path), "--out", str(tmp_path / "o")]))
    assert line == (f"error: {path}: line 2: field 'text' holds an object ({{\"a\": 1}}); it must be a string (the "
                    "sentence), or a list of strings (a pre-tokenized sentence's words)")
    bad_field = one_error_line(runner.invoke(app, ["extract", "tiny-bert", "--corpus", str(path), "--field", "body",
                                                   "--out", str(tmp_path / "o")]))
    assert bad_field == f"error: {path}: line 1 has no field 'body'; pass --field with one of ['text']"
    assert not (tmp_path / "o").exists()


def test_field_lines_that_are_not_objects_and_good_files(tmp_path: Path) -> None:
    path = jsonl(tmp_path / "f.jsonl", [{"sentence": "One two.", "id": 1}, {"id": 2}])
    with pytest.raises(ValueError, match=r"line 2 has no field 'sentence'; pass `field` with one of \['id'\]"):
        load_corpus(str(path), field="sentence")
    with pytest.raises(ValueError, match=r"line 1 has no field 'text'; pass `field` with one of \['id', 'sentence'\]"):
        load_corpus(str(path))
    empty = jsonl(tmp_path / "e.jsonl", [{"text": "A b."}, {}])
    with pytest.raises(ValueError, match="line 2 has no field 'text'; the line is an empty object"):
        load_corpus(str(empty))
    array = jsonl(tmp_path / "a.jsonl", [{"text": "A b."}, ["A", "b"]])
    with pytest.raises(ValueError, match=r"line 2 holds a list \(\[\"A\", \"b\"\]\), not a JSON object; give one object"):
        load_corpus(str(array))
    good = jsonl(tmp_path / "g.jsonl", [{"text": "Dogs bark."}, {"text": ["New", "York", "'s"]}, {"text": "Line\u2028break."}])
    corpus = load_corpus(str(good))
    assert [[w.text for w in s.words] for s in corpus] == [["Dogs", "bark", "."], ["New", "York", "'s"], ["Line", "break", "."]]
    assert corpus.pretokenized and corpus.sentences[1].text == "New York 's"


def test_a_hugging_face_value_that_is_not_a_string_names_its_record(monkeypatch: pytest.MonkeyPatch) -> None:
    records = [{"text": "Fine."}, {"text": ["two", "words"]}, {"text": 7}]

    def load_dataset(name: str, config: str | None, *, split: str, streaming: bool) -> Iterator[dict[str, Any]]:
        return iter(records)

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    with pytest.raises(ValueError, match=r"^dataset wiki test, record 2: column 'text' holds a number \(7\); it must be a string"):
        list(open_corpus("hf:wiki:test:text"))


def test_a_python_list_of_non_strings_is_refused() -> None:
    with pytest.raises(ValueError, match=r"a sentence is a string \(natural text\) or a list of strings \(its words\), "
                                         r"not an object \(\{\"a\": 1\}\)"):
        Corpus.from_list([{"a": 1}])  # type: ignore[list-item]


# ---- built-in names over files of the same name -----------------------------------------------------


@pytest.fixture()
def shadowing_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory holding a file `lee`, a Brown-format folder `brown` and a file `sts.txt`."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lee").write_text("My own sentence.\nAnd a second one.\n", encoding="utf-8")
    (tmp_path / "brown").mkdir()
    (tmp_path / "brown" / "cats.txt").write_text("ca01 news\n")
    (tmp_path / "brown" / "ca01").write_text("Local/at words/nns ./.\n")
    (tmp_path / "sts.txt").write_text("A local sentence.\n")
    (tmp_path / "sub").mkdir()
    return tmp_path


def test_builtin_names_win_over_files_of_the_same_name(shadowing_folder: Path, shared_data: Path) -> None:
    lee = load_corpus("lee", limit=2)
    assert [s.text for s in lee] == lee_first_sentences(2)
    assert lee.name == "lee[:2]" and lee.source == str((gensim_test_data() / "lee_background.cor").resolve())
    brown = load_corpus("brown", limit=1)
    assert [w.text for w in brown.sentences[0].words][:4] == ["The", "Fulton", "County", "Grand"]
    assert Path(brown.source).is_absolute() and Path(brown.source) != shadowing_folder / "brown"
    # written as a path, the local file or folder is read
    own = load_corpus("./lee")
    assert [s.text for s in own] == ["My own sentence.", "And a second one."]
    assert own.name == "lee (file)" and own.source == str(shadowing_folder / "lee")
    local_brown = open_corpus("./brown")
    assert [[w.text for w in s.words] for s in local_brown] == [["Local", "words", "."]]
    assert local_brown.name == "brown" and local_brown.source == str(shadowing_folder / "brown")
    sts_file = load_corpus("sts.txt")
    assert sts_file.name == "sts.txt (file)" and sts_file.source == str(shadowing_folder / "sts.txt")
    other = load_corpus("./sub/../lee")  # any path separator: a path, recorded resolved
    assert other.source == str(shadowing_folder / "lee")


def test_the_store_records_the_resolved_source(shadowing_folder: Path, wide_console: None) -> None:
    from lmgeom.store import RepresentationStore

    built_in = runner.invoke(app, ["extract", "tiny-bert", "--corpus", "lee", "--limit", "3", "--out", "b", "--device", "cpu"])
    assert built_in.exit_code == 0, built_in.output
    meta = RepresentationStore.open(shadowing_folder / "b").meta
    assert meta["corpus_name"] == "lee[:3]" and meta["n_sentences"] == 3
    assert meta["corpus_source"] == str((gensim_test_data() / "lee_background.cor").resolve())
    own = runner.invoke(app, ["extract", "tiny-bert", "--corpus", "./lee", "--out", "f", "--device", "cpu"])
    assert own.exit_code == 0, own.output
    meta = RepresentationStore.open(shadowing_folder / "f").meta
    assert (meta["corpus_name"], meta["corpus_source"], meta["n_sentences"]) == ("lee (file)", str(shadowing_folder / "lee"), 2)


# ---- line ends ----------------------------------------------------------------------------------

SEPARATORS = "\u2028\u2029\x0b\x0c\x1c\x1d\x1e\x85\r"


def test_only_newline_ends_a_line_of_a_text_corpus(tmp_path: Path) -> None:
    path = tmp_path / "lines.txt"
    path.write_bytes(("First part\u2028second part\u2029third\x0bfour\x0cfive\x1csix\x1dseven\x1eeight\x85nine\rten.\r\n"
                      "Next line.\n\n").encode("utf-8"))
    corpus = load_corpus(str(path))
    assert len(corpus) == 2
    assert [w.text for w in corpus.sentences[0].words] == [
        "First", "part", "second", "part", "third", "four", "five", "six", "seven", "eight", "nine", "ten", "."]
    assert corpus.sentences[0].text == "First part\u2028second part\u2029third\x0bfour\x0cfive\x1csix\x1dseven\x1eeight\x85nine\rten."
    assert corpus.sentences[1].text == "Next line."  # \r\n accepted as a line end
    stream = open_corpus(str(path))
    assert [(s.text, s.words) for s in stream] == [(s.text, s.words) for s in corpus]
    assert stream.summary().fingerprint == corpus.fingerprint
    words = load_corpus(str(path), pretokenized=True)
    assert len(words) == 2 and [w.text for w in words.sentences[0].words][:3] == ["First", "part", "second"]


@pytest.mark.parametrize("separator", list(SEPARATORS))
def test_each_separator_is_a_space_to_word_segmentation(separator: str) -> None:
    text = f"A dog{separator}ran."
    assert [(w.text, w.start, w.end) for w in segment_words(text)] == [("A", 0, 1), ("dog", 2, 5), ("ran", 6, 9), (".", 9, 10)]


def test_the_builtin_readers_keep_separators_inside_a_line(tmp_path: Path) -> None:
    sts = tmp_path / "sts" / "STS12-en-test"
    sts.mkdir(parents=True)
    (sts / "STS.input.x.txt").write_text("A man\u2028eats.\tA dog\x85runs.\r\nA man\u2028eats.\tBirds fly.\n", encoding="utf-8")
    assert [s.text for s in load_corpus(f"sts:{tmp_path / 'sts'}")] == ["A man\u2028eats.", "A dog\x85runs.", "Birds fly."]
    brown = tmp_path / "brown"
    brown.mkdir()
    (brown / "cats.txt").write_text("ca01 news\n")
    (brown / "ca01").write_text("The/at dog/nn\u2028ran/vbd ./.\r\nIt/pps barked/vbd ./.\n", encoding="utf-8")
    assert [[w.text for w in s.words] for s in open_corpus(f"brown:{brown}")] == [["The", "dog", "ran", "."], ["It", "barked", "."]]


# ---- a corpus of identical sentences -------------------------------------------------------------


def cosines(rows: np.ndarray) -> np.ndarray:
    unit = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    return unit @ unit.T


def mean_distinct_pair_cosine(rows: np.ndarray) -> float:
    similarity, n = cosines(rows), len(rows)
    return float((similarity.sum() - np.trace(similarity)) / (n * (n - 1)))


@pytest.fixture(scope="module")
def identical_store(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from lmgeom.encoders.registry import load_encoder
    from lmgeom.stages import extract

    corpus = Corpus.from_list(["The cat sat on the mat."] * 30, name="same")
    return extract(load_encoder("tiny-bert", device="cpu"), corpus, tmp_path_factory.mktemp("same") / "store")


def test_identical_sentences_analyse_with_the_spread_less_measures_undefined(identical_store: Any, tmp_path: Path) -> None:
    from lmgeom.stages import analyze_store
    from lmgeom.stages.analysis import ContextualityResult

    result = analyze_store(identical_store, min_contexts=5, write_to=tmp_path)
    summary = result.summary().set_index("layer")
    tokens = identical_store.tokens
    analysed = ~tokens["is_punct"].to_numpy()
    assert int(analysed.sum()) == 180 and sorted(set(tokens.loc[analysed, "word"])) == ["The", "cat", "mat", "on", "sat", "the"]
    for layer in identical_store.layers:
        rows = np.asarray(identical_store.layer(layer)[:], dtype=np.float64)[analysed]
        row = summary.loc[layer]
        # every occurrence of a word is the same vector: self-similarity and uncentred MEV are 1
        assert row["self_similarity"] == pytest.approx(1.0, abs=1e-9)
        assert row["mev_uncentred"] == pytest.approx(1.0, abs=1e-9)
        # and the centred MEV (no variance about the mean) and the svd_ratio (centred denominator) are undefined
        for column in ("mev_centred", "mev_centred_adjusted", "mev_svd_ratio", "mev_svd_ratio_adjusted"):
            assert np.isnan(row[column]), column
        baseline = mean_distinct_pair_cosine(rows)  # fewer than n_samples occurrences: the sample is all of them
        assert row["anisotropy_exact"] == pytest.approx(baseline, abs=1e-9)
        assert row["anisotropy_sampled"] == pytest.approx(baseline, abs=1e-9)
        assert row["self_similarity_adjusted"] == pytest.approx(1.0 - baseline, abs=1e-9)
        sentence = rows[:6]  # every sentence holds the same six word vectors
        mean = sentence.mean(axis=0)
        intra = float(np.mean(sentence @ mean / (np.linalg.norm(sentence, axis=1) * np.linalg.norm(mean))))
        assert row["intra_sentence_similarity"] == pytest.approx(intra, abs=1e-9)
        singular = np.linalg.svd(rows, compute_uv=False)
        mev_baseline = float(singular[0] ** 2 / np.sum(singular ** 2))
        assert row["mev_uncentred_adjusted"] == pytest.approx(1.0 - mev_baseline, abs=1e-9)
    words = result.words
    assert words["mev_centred"].isna().all() and (words["self_similarity"] - 1).abs().max() < 1e-9
    centred = result.findings["static_embedding_variance"]["centred"]
    assert centred["max_adjusted_mev"] is None and centred["undefined_layers"] == [1, 2, 3]
    assert centred["verdict"] == "not testable" and "undefined at every non-input layer" in centred["reason"]
    assert any("(MEV centred) in every non-input layer: not testable, MEV centred is undefined" in s and "same vector" in s
               for s in result.statements)
    assert result.findings["static_embedding_variance"]["uncentred"]["undefined_layers"] == []
    # null in JSON, empty in CSV, read back as NaN
    records = json.loads((tmp_path / "contextuality.json").read_text())["records"]
    centred_records = [r for r in records if r["metric"] == "mev_centred"]
    assert len(centred_records) == 4 and all(r["raw"] is None and r["adjusted"] is None for r in centred_records)
    assert all(r["baseline"] is not None for r in centred_records)  # the sampled occurrences of six words do vary
    table = pd.read_csv(tmp_path / "contextuality_layers.csv", keep_default_na=False)
    assert (table.loc[table["metric"] == "mev_centred", "raw"] == "").all()
    read = ContextualityResult.read(identical_store, tmp_path).summary()
    assert read["mev_centred_adjusted"].isna().all() and read["self_similarity"].sub(1).abs().max() < 1e-9


def test_analyze_and_run_on_identical_sentences_exit_0(identical_store: Any, tmp_path: Path) -> None:
    analyzed = runner.invoke(app, ["analyze", str(identical_store.path), "--out", str(tmp_path / "a")])
    assert analyzed.exit_code == 0, analyzed.output
    assert "—" in analyzed.output and "undefined" in analyzed.output
    corpus = tmp_path / "same.txt"
    corpus.write_text("The cat sat on the mat.\n" * 30, encoding="utf-8")
    ran = runner.invoke(app, ["run", "--model", "tiny-bert", "--corpus", str(corpus), "--out", str(tmp_path / "r"),
                              "--device", "cpu", "--layers", "1", "--methods", "standardize", "--num-workers", "1"])
    assert ran.exit_code == 0, ran.output
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert (tmp_path / "r" / "report.html").exists() and summary["layers"][1]["n_occurrences"] == 180
