"""Corpora: segmentation rules, loaders, built-ins, vocabulary, bad input."""

from __future__ import annotations

import json

import pytest

from lmgeom.corpus import Corpus, Vocabulary, is_punctuation, load_corpus, segment_words, split_sentences


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("I don't think Poor's 500 rose.", ["I", "do", "n't", "think", "Poor", "'s", "500", "rose", "."]),
        ("O'Brien's south-west e-mail", ["O'Brien", "'s", "south-west", "e-mail"]),
        ("At 4:00pm, 1,650 rose 0.11%.", ["At", "4:00", "pm", ",", "1,650", "rose", "0.11", "%", "."]),
        ('He said "No!" (twice)', ["He", "said", '"', "No", "!", '"', "(", "twice", ")"]),
        ("see https://x.org/a?b=1. or a.b@c.com", ["see", "https://x.org/a?b=1", ".", "or", "a.b@c.com"]),
        ("naïve café — déjà vu", ["naïve", "café", "—", "déjà", "vu"]),
        ("control\x12chars and zero\u200bwidth", ["control", "chars", "and", "zero", "width"]),
    ],
)
def test_segmentation_rules(text, words):
    segmented = segment_words(text)
    assert [w.text for w in segmented] == words
    assert all(text[w.start : w.end] == w.text for w in segmented)


def test_punctuation_flags():
    assert is_punctuation(",") and is_punctuation("—") and is_punctuation("%") and is_punctuation("''")
    assert not is_punctuation("n't") and not is_punctuation("500") and not is_punctuation("")


def test_sentence_splitter_keeps_abbreviations_and_initials():
    paragraph = "Mr. Smith met J. Edgar at 5 p.m. in the U.S. on Monday. He left! Did she? 500 people stayed."
    assert split_sentences(paragraph) == [
        "Mr. Smith met J. Edgar at 5 p.m. in the U.S. on Monday.", "He left!", "Did she?", "500 people stayed.",
    ]


def test_pretokenized_words_are_kept_as_is_and_joined_by_spaces():
    corpus = Corpus.from_list([["New", "York", "'s", "mayor", "."]])
    sentence = corpus.sentences[0]
    assert sentence.text == "New York 's mayor ."
    assert [w.text for w in sentence.words] == ["New", "York", "'s", "mayor", "."]
    assert corpus.pretokenized


def test_text_and_jsonl_files(tmp_path):
    text = tmp_path / "s.txt"
    text.write_text("The cat sat.\n\nA dog ran .\n", encoding="utf-8")
    corpus = load_corpus(str(text))
    assert len(corpus) == 2 and [w.text for w in corpus.sentences[1].words] == ["A", "dog", "ran", "."]
    pretok = load_corpus(str(text), pretokenized=True)
    assert [w.text for w in pretok.sentences[0].words] == ["The", "cat", "sat."]
    jsonl = tmp_path / "s.jsonl"
    jsonl.write_text(json.dumps({"sentence": "One two."}) + "\n" + json.dumps({"sentence": ["x", "y"]}) + "\n")
    corpus = load_corpus(str(jsonl), field="sentence")
    assert [w.text for w in corpus.sentences[0].words] == ["One", "two", "."] and corpus.sentences[1].text == "x y"
    with pytest.raises(ValueError, match="line 1 has no field 'text'"):
        load_corpus(str(jsonl))


def test_fingerprint_changes_with_content_and_sampling_is_seeded():
    a = Corpus.from_list(["a b", "c d", "e f", "g h"])
    assert a.fingerprint == Corpus.from_list(["a b", "c d", "e f", "g h"]).fingerprint
    assert a.fingerprint != Corpus.from_list(["a b", "c d", "e f", "g i"]).fingerprint
    first, again = a.sample(2, seed=3), a.sample(2, seed=3)
    assert [s.text for s in first] == [s.text for s in again]
    order = [s.text for s in a]
    assert sorted(order.index(s.text) for s in first) == [order.index(s.text) for s in first]


def test_vocabulary_counts_occurrences_and_distinct_contexts():
    vocab = Vocabulary.from_corpus(Corpus.from_list(["the cat and the dog", "the end", "a cat"])).table.set_index("word")
    assert vocab.at["the", "count"] == 3 and vocab.at["the", "n_contexts"] == 2
    assert vocab.at["cat", "count"] == 2 and vocab.at["cat", "n_contexts"] == 2
    assert vocab.at["end", "count"] == 1 and list(vocab["word_id"]) == list(range(len(vocab)))


def test_builtin_corpora(shared_data):
    lee = load_corpus("lee")
    assert len(lee) > 2000 and lee.n_words > 60_000
    brown = load_corpus("brown", limit=None)
    assert len(brown) == 57_340  # SOURCES.md: 57,340 sentences
    assert [w.text for w in brown.sentences[0].words][:4] == ["The", "Fulton", "County", "Grand"]
    sts = load_corpus(f"sts:{shared_data / 'STS_raw'}")
    assert sts.sentences[0].text.startswith("The problem likely will mean corrective changes")
    assert len({s.text for s in sts}) == len(sts)


def test_bad_input_messages(tmp_path):
    with pytest.raises(ValueError, match="is empty"):
        Corpus.from_list([])
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(ValueError, match="is empty"):
        load_corpus(str(empty))
    latin = tmp_path / "latin.txt"
    latin.write_bytes("fine line\ncaf\xe9 here\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"line 2 is not valid UTF-8 .*iconv"):
        load_corpus(str(latin))
    with pytest.raises(FileNotFoundError, match="neither a built-in"):
        load_corpus("no-such-corpus.txt")
    with pytest.raises(ValueError, match="hf:NAME"):
        load_corpus("hf:only-a-name")
