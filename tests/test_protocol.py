"""Ethayarajh (2019)'s protocol as one option: the sts-scored corpus, the word threshold's unit, WordPiece
pieces as rows, the released code's sampled statistics, and `--protocol ethayarajh2019` setting them all."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from lmgeom.cli.main import app
from lmgeom.corpus import load_corpus
from lmgeom.errors import InputError
from lmgeom.metrics.contextuality import sampled_self_similarity
from lmgeom.metrics.mev import occurrence_spectrum
from lmgeom.stages.analysis import analyze_store
from lmgeom.engine import AnalysisOptions, plan_analysis
from lmgeom.engine.options import protocol_options
from lmgeom.engine.released import released_rows
from lmgeom.engine.selection import select_rows
from lmgeom.store import RepresentationStore
from lmgeom.store.arrays import write_store_from_arrays


def sts_folder(root: Path) -> Path:
    """Two STS files: a scored pair, an unscored one, a duplicate sentence, quotes."""
    year = root / "sts" / "STS12-en-test"
    year.mkdir(parents=True)
    (year / "STS.input.a.txt").write_text('A man eats.\tA "woman" eats.\nA dog runs.\tA cat runs.\nA man eats.\tA dog runs.\n')
    (year / "STS.gs.a.txt").write_text("4.0\n\n1.5\n")
    (year / "STS.input.b.txt").write_text("A man eats.\tBirds fly.\tsource-x\n")
    (year / "STS.gs.b.txt").write_text("2\n")
    return root / "sts"


def test_sts_scored_reads_the_scored_pairs_with_duplicates_and_no_quotes(tmp_path: Path) -> None:
    folder = sts_folder(tmp_path)
    scored = [sentence.text for sentence in load_corpus(f"sts-scored:{folder}")]
    assert scored == ["A man eats.", "A woman eats.", "A man eats.", "A dog runs.", "A man eats.", "Birds fly."]
    # `sts` is every distinct sentence of every pair, scored or not, quotes kept
    assert [s.text for s in load_corpus(f"sts:{folder}")] == ["A man eats.", 'A "woman" eats.', "A dog runs.", "A cat runs.",
                                                              "Birds fly."]
    (folder / "STS12-en-test" / "STS.gs.b.txt").unlink()
    with pytest.raises(FileNotFoundError, match="no gold-score file STS.gs.b.txt"):
        load_corpus(f"sts-scored:{folder}")


def test_sts_scored_counts_on_the_shared_data(shared_data: Path) -> None:
    folder = shared_data / "STS_raw"
    if not folder.is_dir():
        pytest.skip("no STS_raw in the shared data")
    corpus = load_corpus(f"sts-scored:{folder}")
    assert len(corpus) == 2 * 12_544  # the scored pairs of STS 2012-2016, both sentences, duplicates kept
    assert not any('"' in sentence.text for sentence in corpus)


def count_store(tmp_path: Path) -> RepresentationStore:
    """`a` 4 times in 2 sentences, `b` 3 times in 3 sentences, `c` once."""
    words = [["a", "a", "a", "b"], ["a", "b"], ["b", "c"]]
    rng = np.random.default_rng(0)
    n = sum(map(len, words))
    return write_store_from_arrays(tmp_path / "count", [rng.normal(size=(n, 4)) for _ in range(2)], words)


@pytest.mark.parametrize(("count_by", "expected"), [("sentences", ["b"]), ("occurrences", ["a", "b"])])
def test_min_contexts_counts_sentences_or_occurrences(tmp_path: Path, count_by: str, expected: list[str]) -> None:
    store = count_store(tmp_path)
    _, rows = plan_analysis(store, AnalysisOptions(min_contexts=3, count_by=count_by))
    assert rows.words.words["word"].tolist() == expected
    table = rows.words.words.set_index("word")
    counted = {word: (int(table.at[word, "count"]), int(table.at[word, "contexts"])) for word in expected}
    assert counted == ({"a": (4, 2), "b": (3, 3)} if count_by == "occurrences" else {"b": (3, 3)})


def test_count_by_through_the_cli_and_recorded(tmp_path: Path) -> None:
    store = count_store(tmp_path)
    outcome = CliRunner().invoke(app, ["analyze", str(store.path), "--min-contexts", "3", "--count-by", "occurrences",
                                       "--num-workers", "1", "--device", "cpu"])
    assert outcome.exit_code == 0, outcome.output
    document = json.loads((store.path / "contextuality.json").read_text())
    assert document["settings"]["count_by"] == "occurrences" and document["settings"]["min_contexts"] == 3
    assert "2 words of ≥ 3 occurrences" in " ".join(outcome.output.split())
    bad = CliRunner().invoke(app, ["analyze", str(store.path), "--count-by", "lines"])
    assert bad.exit_code == 2 and "unknown --count-by 'lines'" in bad.output and "sentences, occurrences" in bad.output


def test_pieces_are_rows_of_their_own(tmp_path: Path) -> None:
    import torch

    from lmgeom.stages.extraction import extract_model

    text = tmp_path / "pieces.txt"
    sentences = ["The unbelievable cat sat quietly.", "Dogs bark loudly."]
    text.write_text("\n".join(sentences) + "\n")
    store = extract_model("tiny-bert", str(text), out=tmp_path / "store", pooling="none", device="cpu")
    assert store.meta["pooling"] == "none"
    from lmgeom.encoders.tiny import tiny_model

    encoder_model, tokenizer = tiny_model("tiny-bert")
    tokens = store.tokens
    row = 0
    for sentence in sentences:
        batch = tokenizer(sentence, return_tensors="pt")
        with torch.no_grad():
            hidden = torch.stack(encoder_model(**batch, output_hidden_states=True).hidden_states)[:, 0, 1:-1].numpy()
        pieces = tokenizer.convert_ids_to_tokens(batch["input_ids"][0][1:-1])
        assert tokens["word"].iloc[row:row + len(pieces)].tolist() == pieces  # keyed by the piece string
        for layer in store.layers:
            np.testing.assert_allclose(np.asarray(store.layer(layer)[row:row + len(pieces)]), hidden[layer], atol=1e-5)
        row += len(pieces)
    assert row == store.n_tokens
    assert any(word.startswith("##") for word in store.vocab["word"])


def test_released_sample_sizes_replacement_and_seed(tmp_path: Path) -> None:
    words = [["w"] * (1 + k % 3) for k in range(40)]  # 40 sentences of 1-3 words
    n = sum(map(len, words))
    store = write_store_from_arrays(tmp_path / "s", [np.arange(n * 2, dtype=float).reshape(n, 2)], words)
    selection = select_rows(store.token_columns("sentence_id", "word_id", "is_punct", "is_special"))
    sentence_rows, word_rows, pairs = released_rows(selection, 25, seed=3)
    sentence_of = selection.sentence_ids
    assert len(word_rows) == 25 and len(np.unique(sentence_of[word_rows])) == 25  # one word of each of 25 sentences
    assert set(sentence_of[sentence_rows]) == set(sentence_of[word_rows])  # every row of the sampled sentences
    assert np.isin(word_rows, sentence_rows).all()
    assert pairs.shape == (25, 2) and pairs.min() >= 0 and pairs.max() < 25
    many = released_rows(selection, 1000, seed=3)
    assert len(many[1]) == 40 and many[2].shape == (1000, 2)  # all 40 sentences; 1,000 pairs of them
    assert (many[2][:, 0] == many[2][:, 1]).any()  # drawn with replacement: a vector can pair with itself
    again = released_rows(selection, 25, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip((sentence_rows, word_rows, pairs), again))
    other = released_rows(selection, 25, seed=4)
    assert not np.array_equal(other[2], pairs)


def brute_self_similarity(X: np.ndarray, pairs: list[tuple[int, int]]) -> float:
    units = X / np.linalg.norm(X, axis=1, keepdims=True)
    return float(np.mean([units[i] @ units[j] for i, j in pairs]))


def test_sampled_self_similarity_draws_at_most_n_distinct_ordered_pairs() -> None:
    rng = np.random.default_rng(0)
    small = rng.normal(size=(6, 5))
    every = [(i, j) for i in range(6) for j in range(6) if i != j]
    assert sampled_self_similarity(small, 1000, np.random.default_rng(1)) == pytest.approx(brute_self_similarity(small, every))
    large = rng.normal(size=(40, 5)) + 0.5
    k = np.random.default_rng(7).choice(40 * 39, size=100, replace=False)
    drawn = [(int(a // 39), int(a % 39 + (a % 39 >= a // 39))) for a in k]
    assert len(set(drawn)) == 100 and all(i != j for i, j in drawn)
    assert sampled_self_similarity(large, 100, np.random.default_rng(7)) == pytest.approx(brute_self_similarity(large, drawn))
    assert np.isnan(sampled_self_similarity(large[:1], 100, np.random.default_rng(0)))


def test_released_statistics_equal_a_brute_force_of_the_sample(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    words = [["a", "b", "c", "a"], ["b", "a", "d"], ["c", "d", "a", "b", "e"], ["a", "b"]] * 6
    n = sum(map(len, words))
    X = rng.normal(size=(n, 6)) + 1.0
    store = write_store_from_arrays(tmp_path / "s", [X], words)
    result = analyze_store(store, AnalysisOptions(**protocol_options("ethayarajh2019"), num_workers=1))
    records = result.layers.set_index("metric")
    selection = select_rows(store.token_columns("sentence_id", "word_id", "is_punct", "is_special"))
    sentence_rows, word_rows, pairs = released_rows(selection, 1000, seed=0)
    units = X / np.linalg.norm(X, axis=1, keepdims=True)
    baseline = round(float(np.mean(np.sum(units[word_rows[pairs[:, 0]]] * units[word_rows[pairs[:, 1]]], axis=1))), 3)
    assert records.at["anisotropy_released", "raw"] == baseline
    intra = []
    for sentence in np.unique(selection.sentence_ids[sentence_rows]):
        rows = sentence_rows[selection.sentence_ids[sentence_rows] == sentence]
        centre = X[rows].mean(axis=0)
        intra.append(round(float(np.mean(units[rows] @ (centre / np.linalg.norm(centre)))), 3))
    assert records.at["intra_sentence_similarity_released", "raw"] == round(float(np.mean(intra)), 3)
    assert records.at["intra_sentence_similarity_released", "baseline"] == baseline
    from sklearn.decomposition import TruncatedSVD

    mev_baseline = TruncatedSVD(n_components=1, algorithm="arpack").fit(X[word_rows]).explained_variance_ratio_[0]
    assert records.at["mev_svd_ratio_released", "baseline"] == min(1.0, round(float(mev_baseline), 3))
    # every word has at most 24 occurrences: at most 552 ordered pairs, all of them used (< 1,000)
    per_word = result.words.set_index("word")
    for word in ("a", "d"):
        rows = np.flatnonzero(np.array([w for sentence in words for w in sentence]) == word)
        pairs_all = [(i, j) for i in range(len(rows)) for j in range(len(rows)) if i != j]
        expected = round(brute_self_similarity(X[rows], pairs_all), 3)
        assert per_word.loc[(per_word["layer"] == 0).to_numpy() & (per_word.index == word), "self_similarity_released"].item() \
            == pytest.approx(expected, abs=1e-12)
        mev = TruncatedSVD(n_components=1, algorithm="arpack").fit(X[rows]).explained_variance_ratio_[0]
        assert per_word.loc[(per_word["layer"] == 0).to_numpy() & (per_word.index == word), "mev_svd_ratio_released"].item() \
            == pytest.approx(min(1.0, round(float(mev), 3)), abs=1e-12)


def test_svd_ratio_is_truncated_svds_ratio_not_sigma1_share() -> None:
    from sklearn.decomposition import TruncatedSVD

    rng = np.random.default_rng(5)
    X = rng.normal(size=(50, 8)) @ np.diag([4, 2, 1, 1, 0.5, 0.5, 0.2, 0.1]) + np.linspace(1, 2, 8)
    spectrum = occurrence_spectrum(X)
    ratio = TruncatedSVD(n_components=1, random_state=0).fit(X).explained_variance_ratio_[0]
    assert spectrum.mev("svd_ratio") == pytest.approx(ratio, rel=1e-6)
    # sigma_1^2 / sum sigma_i^2 is the uncentred share; TruncatedSVD's ratio centres both sides
    sigma = np.linalg.svd(X, compute_uv=False)
    assert spectrum.mev("uncentred") == pytest.approx(sigma[0] ** 2 / np.sum(sigma**2), rel=1e-9)
    v1 = np.linalg.svd(X)[2][0]
    assert ratio == pytest.approx(np.var(X @ v1) / np.var(X, axis=0).sum(), rel=1e-6)
    assert abs(spectrum.mev("svd_ratio") - spectrum.mev("uncentred")) > 0.01


def test_protocol_sets_every_analysis_option_and_refuses_contradictions() -> None:
    chosen = protocol_options("ethayarajh2019")
    options = AnalysisOptions(**chosen)
    assert (options.protocol, options.min_contexts, options.count_by, options.n_samples) == ("ethayarajh2019", 5, "occurrences", 1000)
    assert not options.include_punct and not options.include_special and not options.exclude_first_word
    assert {"released_sample", "self_similarity_released", "mev", "baseline"} <= set(options.statistics)
    assert AnalysisOptions.from_settings(options.to_settings()) == options
    assert AnalysisOptions(**protocol_options("ethayarajh2019", min_contexts=5)) == options  # equal to the protocol's: kept
    with pytest.raises(InputError, match=r"`protocol='ethayarajh2019'` sets `count_by='occurrences'`; got `count_by='sentences'`"):
        protocol_options("ethayarajh2019", count_by="sentences")
    with pytest.raises(InputError, match="sets `min_contexts=5`"):
        AnalysisOptions(protocol="ethayarajh2019", count_by="occurrences", min_contexts=3)
    with pytest.raises(InputError, match="unknown `protocol` 'nope'"):
        protocol_options("nope")
    assert AnalysisOptions() == AnalysisOptions(**protocol_options(None))  # the defaults stay lmgeom's
    assert AnalysisOptions().count_by == "sentences" and AnalysisOptions().protocol is None


def test_cli_refuses_flags_the_protocol_sets_otherwise(tmp_path: Path) -> None:
    store = count_store(tmp_path)
    outcome = CliRunner().invoke(app, ["analyze", str(store.path), "--protocol", "ethayarajh2019", "--count-by", "sentences"])
    assert outcome.exit_code == 2
    line = " ".join(outcome.output.split())
    assert "--protocol ethayarajh2019" in line and "--count-by occurrences" in line and "--count-by sentences" in line
    outcome = CliRunner().invoke(app, ["analyze", str(store.path), "--protocol", "ethayarajh2019", "--include-punct"])
    assert outcome.exit_code == 2 and "--include-punct" in outcome.output
    outcome = CliRunner().invoke(app, ["static-embeddings", str(store.path), "--layer", "1", "--protocol", "ethayarajh2019",
                                       "--min-contexts", "2"])
    line = " ".join(outcome.output.split())
    assert outcome.exit_code == 2 and "--min-contexts 5" in line and "--min-contexts 2" in line
    assert not (store.path / "static").exists()  # refused before anything is written
    outcome = CliRunner().invoke(app, ["run", "--protocol", "ethayarajh2019", "--model", "tiny-bert", "--corpus", "sts",
                                       "--out", str(tmp_path / "run")])
    line = " ".join(outcome.output.split())
    assert outcome.exit_code == 2 and "--protocol ethayarajh2019" in line and "--corpus sts" in line and "sts-scored" in line
    assert not (tmp_path / "run").exists()


def test_run_protocol_sets_everything_and_records_it(tmp_path: Path) -> None:
    folder = sts_folder(tmp_path)
    for k in range(30):  # enough sentences for words of 5 occurrences
        with open(folder / "STS12-en-test" / "STS.input.a.txt", "a") as lines, \
                open(folder / "STS12-en-test" / "STS.gs.a.txt", "a") as scores:
            lines.write(f"A man eats bread {k}.\tA dog eats unbelievable meat.\n")
            scores.write("3\n")
    run = tmp_path / "run"
    outcome = CliRunner().invoke(app, ["run", "--protocol", "ethayarajh2019", "--model", "tiny-bert", "--corpus",
                                       f"sts-scored:{folder}", "--out", str(run), "--device", "cpu", "--num-workers", "1",
                                       "--methods", "abtt"])
    assert outcome.exit_code == 0, outcome.output
    store = RepresentationStore.open(run)
    assert store.meta["n_sentences"] == 2 * 33 and store.meta["corpus_name"] == "sts-scored"  # the unscored pair left out
    assert any(word.startswith("##") for word in store.vocab["word"])  # WordPiece pieces, not words
    contextuality = json.loads((run / "contextuality.json").read_text())["settings"]
    assert (contextuality["protocol"], contextuality["count_by"], contextuality["min_contexts"]) == ("ethayarajh2019", "occurrences", 5)
    assert "self_similarity_released" in contextuality["statistics"]
    assert json.loads((run / "isotropy.json").read_text())["settings"]["protocol"] == "ethayarajh2019"
    for path in (run / "static").glob("*.benchmarks.json"):
        settings = json.loads(path.read_text())["settings"]
        assert (settings["protocol"], settings["count_by"], settings["min_contexts"]) == ("ethayarajh2019", "occurrences", 5)
    assert json.loads((run / "run.json").read_text())["protocol"] == "ethayarajh2019"
    layers = {record["metric"] for record in json.loads((run / "contextuality.json").read_text())["records"]}
    assert {"anisotropy_released", "self_similarity_released", "intra_sentence_similarity_released",
            "mev_svd_ratio_released", "anisotropy_exact"} <= layers


def test_released_statistics_merge_from_saved_shards(tmp_path: Path) -> None:
    from lmgeom.stages.analysis import analyze_shard, finish_analysis
    from lmgeom.engine import AnalysisState

    rng = np.random.default_rng(4)
    words = [["a", "b", "c", "a"], ["b", "a", "d"], ["c", "d", "a", "b", "e"], ["a", "b"]] * 12  # `a` 48 times: sampled pairs
    n = sum(map(len, words))
    store = write_store_from_arrays(tmp_path / "s", [rng.normal(size=(n, 5)) + 0.5 for _ in range(2)], words)
    options = AnalysisOptions(**protocol_options("ethayarajh2019"), num_workers=1)
    cut = int(store.sentences["first_row"].iloc[20])
    for part, rows in enumerate(((0, cut), (cut, store.n_tokens))):
        analyze_shard(store, rows, options).save(tmp_path / f"shard{part}.npz")
    merged = AnalysisState.load(tmp_path / "shard0.npz").merge(AnalysisState.load(tmp_path / "shard1.npz"))
    sharded = finish_analysis(store, merged).layers.set_index(["layer", "metric"])
    whole = analyze_store(store, options).layers.set_index(["layer", "metric"])
    released = [key for key in whole.index if "released" in key[1]]
    assert len(released) == 8
    np.testing.assert_allclose(sharded.loc[released, ["raw", "baseline", "adjusted"]].to_numpy(dtype=float),
                               whole.loc[released, ["raw", "baseline", "adjusted"]].to_numpy(dtype=float), rtol=0, atol=1e-12)


def test_analyze_protocol_prints_the_released_statistics(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    words = [["a", "b", "c", "a"], ["b", "a", "d"], ["c", "d", "a", "b", "e"]] * 5
    n = sum(map(len, words))
    store = write_store_from_arrays(tmp_path / "s", [rng.normal(size=(n, 4)) + 1 for _ in range(2)], words)
    outcome = CliRunner().invoke(app, ["analyze", str(store.path), "--protocol", "ethayarajh2019", "--num-workers", "1",
                                       "--device", "cpu"], env={"COLUMNS": "80"})
    assert outcome.exit_code == 0, outcome.output
    assert "the released code's statistics" in outcome.output and "SelfSim*" in outcome.output
    assert all(len(line) <= 80 for line in outcome.output.splitlines())
    layers = json.loads((store.path / "contextuality.json").read_text())
    assert layers["settings"]["protocol"] == "ethayarajh2019"
    released = {(r["layer"], r["metric"]): r for r in layers["records"] if r["metric"] == "anisotropy_released"}
    assert all(record["raw"] == round(record["raw"], 3) for record in released.values())  # rounded as released
