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
    encoding = tokenizer(
        sentence.text,
        add_special_tokens=True,
        return_offsets_mapping=True,
        return_special_tokens_mask=True,
        truncation=False,
        verbose=False,
    )
    ids = encoding["input_ids"]
    special = encoding["special_tokens_mask"]
    offsets = encoding["offset_mapping"]
    content_positions = [i for i, s in enumerate(special) if not s]
    first = content_positions[0] if content_positions else len(ids)
    last = content_positions[-1] + 1 if content_positions else len(ids)
    prefix, content, suffix = list(ids[:first]), list(ids[first:last]), list(ids[last:])
    if prepend_bos and (not prefix or prefix[0] != tokenizer.bos_token_id):
        prefix = [tokenizer.bos_token_id, *prefix]
    starts = np.array([offsets[i][0] for i in range(first, last)], dtype=np.int64)
    ends = np.array([offsets[i][1] for i in range(first, last)], dtype=np.int64)
    word_pieces, kept_words = [], []
    for position, word in enumerate(sentence.words):
        pieces = np.flatnonzero((starts < word.end) & (ends > word.start))
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
