"""Mapping tokenizer pieces to words through character offsets, and splitting long inputs into windows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from lmgeom.corpus.corpus import Sentence


@dataclass(frozen=True)
class TokenizedSentence:
    """A sentence as the model reads it: `prefix` and `suffix` special-token ids around the content
    pieces, and for each word the content pieces whose spans overlap it."""

    prefix: list[int]
    content: list[int]
    suffix: list[int]
    word_pieces: list[np.ndarray]  # per kept word: indexes into `content`
    kept_words: list[int]  # indexes of the sentence's words that have pieces


def tokenize_sentence(
    tokenizer: Any, sentence: Sentence, *, prepend_bos: bool, sentence_index: int, skip_unaligned: bool = False
) -> TokenizedSentence:
    """Tokenize the natural text with the tokenizer's defaults and map pieces to words.

    A piece belongs to every word its character span overlaps (byte-level BPE spans include the
    leading space, which overlaps no word). Special tokens have empty spans and are split off as
    prefix/suffix so that long inputs can be re-wrapped window by window.
    """
    return tokenize_sentences(
        tokenizer, [sentence], prepend_bos=prepend_bos, first_index=sentence_index, skip_unaligned=skip_unaligned
    )[0]


def tokenize_sentences(
    tokenizer: Any, sentences: Sequence[Sentence], *, prepend_bos: bool, first_index: int, skip_unaligned: bool = False
) -> list[TokenizedSentence]:
    """`tokenize_sentence` of each sentence (numbered from `first_index` in errors), the texts
    tokenized in one call of the tokenizer rather than one call each."""
    if not sentences:
        return []
    encoding = tokenizer(
        [sentence.text for sentence in sentences],
        add_special_tokens=True,
        return_offsets_mapping=True,
        return_special_tokens_mask=True,
        truncation=False,
        verbose=False,
    )
    return [
        _align(tokenizer, sentence, ids, special, offsets, prepend_bos=prepend_bos, sentence_index=first_index + index,
               skip_unaligned=skip_unaligned)
        for index, (sentence, ids, special, offsets) in enumerate(
            zip(sentences, encoding["input_ids"], encoding["special_tokens_mask"], encoding["offset_mapping"])
        )
    ]


def _align(
    tokenizer: Any, sentence: Sentence, ids: list[int], special: list[int], offsets: list[tuple[int, int]], *,
    prepend_bos: bool, sentence_index: int, skip_unaligned: bool,
) -> TokenizedSentence:
    content_positions = [i for i, s in enumerate(special) if not s]
    first = content_positions[0] if content_positions else len(ids)
    last = content_positions[-1] + 1 if content_positions else len(ids)
    prefix, content, suffix = list(ids[:first]), list(ids[first:last]), list(ids[last:])
    if prepend_bos and (not prefix or prefix[0] != tokenizer.bos_token_id):
        prefix = [tokenizer.bos_token_id, *prefix]
    spans = np.array(offsets[first:last], dtype=np.int64).reshape(-1, 2)
    word_spans = np.array([(word.start, word.end) for word in sentence.words], dtype=np.int64).reshape(-1, 2)
    # every (word, piece) pair whose spans overlap, in one comparison; row-major order groups them by
    # word with each word's pieces ascending
    overlap = (spans[None, :, 0] < word_spans[:, 1:]) & (spans[None, :, 1] > word_spans[:, :1])
    word_of_pair, piece_of_pair = np.nonzero(overlap)
    bounds = np.searchsorted(word_of_pair, np.arange(len(sentence.words) + 1))
    word_pieces, kept_words = [], []
    for position, word in enumerate(sentence.words):
        pieces = piece_of_pair[bounds[position] : bounds[position + 1]]
        if pieces.size == 0:
            if skip_unaligned:
                continue
            raise ValueError(
                f"sentence {sentence_index}, word {position} ({word.text!r}) yields no tokenizer pieces: the "
                "tokenizer drops its characters; remove or replace them in the corpus, or pass --skip-unaligned "
                "to leave such words out (they are counted in the store's meta.json)"
            )
        word_pieces.append(pieces)
        kept_words.append(position)
    return TokenizedSentence(prefix, content, suffix, word_pieces, kept_words)


def plan_windows(n_content: int, capacity: int) -> list[tuple[int, int]]:
    """Overlapping windows [start, stop) over content pieces, half a window apart, covering all pieces."""
    if capacity < 2:
        raise ValueError(f"max length leaves room for {capacity} content pieces per window; it must leave at least 2")
    if n_content <= capacity:
        return [(0, n_content)]
    stride = max(1, capacity // 2)
    starts = list(range(0, n_content - capacity, stride)) + [n_content - capacity]
    return [(s, s + capacity) for s in starts]


def choose_windows(units: Sequence[np.ndarray], windows: Sequence[tuple[int, int]]) -> np.ndarray:
    """For each unit (a set of piece indexes), the window holding all its pieces where it has most
    context: the largest min(pieces before it, pieces after it) in that window; ties go to the earlier."""
    if len(windows) == 1 and units and all(pieces.size for pieces in units):
        # a sentence in one window (nearly all of them): its only window, if it holds every piece
        pieces = np.concatenate(units)
        if windows[0][0] <= pieces.min() and pieces.max() < windows[0][1]:
            return np.zeros(len(units), dtype=np.int64)
    choice = np.empty(len(units), dtype=np.int64)
    for u, pieces in enumerate(units):
        lo, hi = int(pieces.min()), int(pieces.max())
        best, best_score = -1, -1
        for w, (start, stop) in enumerate(windows):
            if start <= lo and hi < stop:
                score = min(lo - start, stop - 1 - hi)
                if score > best_score:
                    best, best_score = w, score
        if best < 0:
            raise ValueError(f"a word spans {hi - lo + 1} pieces, more than one window holds; raise --max-length")
        choice[u] = best
    return choice
