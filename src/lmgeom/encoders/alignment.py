"""Mapping tokenizer pieces to words through character offsets, and splitting long inputs into windows.

A chunk of sentences is tokenized in one call and kept as flat arrays (`TokenizedChunk`): every
sentence's ids back to back, and each word's pieces as ranges of one array, so that aligning a
chunk of thousands of sentences is a few array operations instead of Python work per sentence
and per word.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from lmgeom.errors import InputError
from lmgeom.corpus.corpus import Sentence


def concat_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The ranges [start, start + length) back to back: `np.concatenate([np.arange(s, s + n) ...])`
    in two vectorised operations."""
    lengths = np.asarray(lengths, dtype=np.int64)
    ends = np.cumsum(lengths)
    shifts = np.asarray(starts, dtype=np.int64) - (ends - lengths)
    return np.arange(int(ends[-1]) if len(ends) else 0, dtype=np.int64) + np.repeat(shifts, lengths)


@dataclass(frozen=True)
class TokenizedChunk:
    """Sentences as the model reads them, as flat arrays over the chunk: each sentence's ids are
    `prefix` special tokens, content pieces and `suffix` special tokens; each word that has pieces
    keeps the content pieces whose character spans overlap it (indexes counted from the sentence's
    first content piece, ascending)."""

    ids: np.ndarray  # (n_ids,) every sentence's ids back to back
    bounds: np.ndarray  # (n_sentences + 1,) sentence s is ids[bounds[s]:bounds[s + 1]]
    n_prefix: np.ndarray  # (n_sentences,) special tokens before the content pieces
    n_suffix: np.ndarray  # (n_sentences,) special tokens after them
    word_bounds: np.ndarray  # (n_sentences + 1,) sentence s's kept words are kept_words[word_bounds[s]:word_bounds[s + 1]]
    kept_words: np.ndarray  # (n_kept,) position of each word with pieces in its sentence's words
    piece_bounds: np.ndarray  # (n_kept + 1,) kept word k's pieces are pieces[piece_bounds[k]:piece_bounds[k + 1]]
    pieces: np.ndarray  # content pieces of the kept words

    @property
    def n_content(self) -> np.ndarray:
        return np.diff(self.bounds) - self.n_prefix - self.n_suffix


def tokenize_chunk(
    tokenizer: Any, sentences: Sequence[Sentence], *, prepend_bos: bool, first_index: int, skip_unaligned: bool = False
) -> TokenizedChunk:
    """Tokenize the natural texts with the tokenizer's defaults, in one call, and map pieces to words.

    A piece belongs to every word its character span overlaps (byte-level BPE spans include the
    leading space, which overlaps no word). Special tokens have empty spans and are split off as
    prefix/suffix so that long inputs can be re-wrapped window by window. Sentences are numbered
    from `first_index` in errors.
    """
    # only the fields used are asked for: transformers turns every field of every sentence into Python lists
    encoding = tokenizer(
        [sentence.text for sentence in sentences],
        add_special_tokens=True,
        return_offsets_mapping=True,
        return_special_tokens_mask=True,
        return_attention_mask=False,
        return_token_type_ids=False,
        truncation=False,
        verbose=False,
    )
    lengths = np.fromiter(map(len, encoding["input_ids"]), dtype=np.int64, count=len(sentences))
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    n = int(bounds[-1])
    chain = itertools.chain.from_iterable
    ids = np.fromiter(chain(encoding["input_ids"]), dtype=np.int64, count=n)
    special = np.fromiter(chain(encoding["special_tokens_mask"]), dtype=bool, count=n)
    spans = np.fromiter(chain(chain(encoding["offset_mapping"])), dtype=np.int64, count=2 * n).reshape(n, 2)
    # content: a sentence's ids from its first to its last that is not a special token (none: all prefix)
    content = np.append(np.flatnonzero(~special), n)
    first = np.minimum(content[np.searchsorted(content, bounds[:-1])], bounds[1:])
    last = np.where(first < bounds[1:], content[np.searchsorted(content, bounds[1:]) - 1] + 1, bounds[1:])
    n_prefix, n_suffix = first - bounds[:-1], bounds[1:] - last
    if prepend_bos:
        bos = tokenizer.bos_token_id
        added = (n_prefix == 0) | (np.append(ids, -1)[bounds[:-1]] != bos)
        ids = np.insert(ids, bounds[:-1][added], bos)
        spans = np.insert(spans, bounds[:-1][added], 0, axis=0)
        n_prefix = n_prefix + added
        bounds = bounds + np.concatenate([[0], np.cumsum(added)])
    n_content = np.diff(bounds) - n_prefix - n_suffix
    piece_spans = spans[concat_ranges(bounds[:-1] + n_prefix, n_content)]
    word_counts = np.fromiter((len(sentence.words) for sentence in sentences), dtype=np.int64, count=len(sentences))
    all_word_bounds = np.concatenate([[0], np.cumsum(word_counts)])
    word_spans = np.fromiter(chain((word.start, word.end) for sentence in sentences for word in sentence.words),
                             dtype=np.int64, count=2 * int(all_word_bounds[-1])).reshape(-1, 2)
    counts, pieces = overlapping_pieces(piece_spans, np.concatenate([[0], np.cumsum(n_content)]), word_spans, all_word_bounds)
    kept = np.flatnonzero(counts)
    if len(kept) < len(counts) and not skip_unaligned:
        word = int(np.flatnonzero(counts == 0)[0])
        index = int(np.searchsorted(all_word_bounds, word, side="right")) - 1
        position = word - int(all_word_bounds[index])
        raise InputError(
            f"sentence {first_index + index}, word {position} ({sentences[index].words[position].text!r}) yields no "
            "tokenizer pieces: the tokenizer drops its characters; remove or replace them in the corpus, or pass "
            "`skip_unaligned=True` to leave such words out (they are counted in the store's meta.json)",
            param="skip_unaligned",
        )
    word_bounds = np.searchsorted(kept, all_word_bounds)
    kept_words = kept - np.repeat(all_word_bounds[:-1], np.diff(word_bounds))
    piece_bounds = np.concatenate([[0], np.cumsum(counts[kept])])
    return TokenizedChunk(ids, bounds, n_prefix, n_suffix, word_bounds, kept_words, piece_bounds, pieces)


def overlapping_pieces(
    piece_spans: np.ndarray, piece_bounds: np.ndarray, word_spans: np.ndarray, word_bounds: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """For each word, the pieces of its sentence whose character span overlaps the word's (piece
    start < word end and piece end > word start): the count per word, and the pieces back to back,
    word by word, ascending, numbered from the sentence's first piece. Sentence s owns pieces
    piece_bounds[s]:piece_bounds[s + 1] and words word_bounds[s]:word_bounds[s + 1].

    Where neither the starts nor the ends of a sentence's pieces ever decrease (the tokenizers we
    know), a word's pieces are one range, found by binary search over the whole chunk at once; a
    sentence whose spans go back is compared pair by pair."""
    n_sentences = len(piece_bounds) - 1
    piece_sentence = np.repeat(np.arange(n_sentences), np.diff(piece_bounds))
    word_sentence = np.repeat(np.arange(n_sentences), np.diff(word_bounds))
    goes_back = (np.diff(piece_spans, axis=0) < 0).any(axis=1) & (piece_sentence[1:] == piece_sentence[:-1])
    dense = np.zeros(n_sentences, dtype=bool)
    dense[piece_sentence[1:][goes_back]] = True
    # sentence * scale + offset orders the chunk's spans by sentence, then offset; a dense sentence's
    # pieces all get offset 0, which no word overlaps (a word ends after 0)
    scale = int(max(piece_spans.max(initial=0), word_spans.max(initial=0))) + 1
    keys = np.where(dense[piece_sentence, None], 0, piece_spans) + piece_sentence[:, None] * scale
    word_keys = word_spans + word_sentence[:, None] * scale
    lo = np.searchsorted(keys[:, 1], word_keys[:, 0], side="right")  # the first piece that ends after the word starts
    hi = np.searchsorted(keys[:, 0], word_keys[:, 1], side="left")  # the first piece that starts where it ends, or later
    ranged = np.maximum(hi - lo, 0)
    if not dense.any():
        return ranged, concat_ranges(lo - piece_bounds[word_sentence], ranged)
    counts = ranged.copy()
    dense_pieces = []
    for s in np.flatnonzero(dense):
        spans = piece_spans[piece_bounds[s] : piece_bounds[s + 1]]
        words = word_spans[word_bounds[s] : word_bounds[s + 1]]
        word_of_pair, piece_of_pair = np.nonzero((spans[None, :, 0] < words[:, 1:]) & (spans[None, :, 1] > words[:, :1]))
        counts[word_bounds[s] : word_bounds[s + 1]] = np.bincount(word_of_pair, minlength=len(words))
        dense_pieces.append(piece_of_pair)
    starts = np.cumsum(counts) - counts
    pieces = np.empty(int(counts.sum()), dtype=np.int64)
    pieces[concat_ranges(starts, ranged)] = concat_ranges(lo - piece_bounds[word_sentence], ranged)
    dense_words = dense[word_sentence]
    pieces[concat_ranges(starts[dense_words], counts[dense_words])] = np.concatenate(dense_pieces)
    return counts, pieces


def plan_windows(n_content: int, capacity: int) -> list[tuple[int, int]]:
    """Overlapping windows [start, stop) over content pieces, half a window apart, covering all pieces."""
    if capacity < 2:
        raise InputError(f"max length leaves room for {capacity} content pieces per window; it must leave at least 2")
    if n_content <= capacity:
        return [(0, n_content)]
    stride = max(1, capacity // 2)
    starts = list(range(0, n_content - capacity, stride)) + [n_content - capacity]
    return [(s, s + capacity) for s in starts]


def choose_windows(units: Sequence[np.ndarray], windows: Sequence[tuple[int, int]]) -> np.ndarray:
    """For each unit (a set of piece indexes), the window holding all its pieces where it has most
    context: the largest min(pieces before it, pieces after it) in that window; ties go to the earlier.
    A unit longer than any window (a word of more pieces than a window holds) takes the window holding
    most of its pieces (ties: the earlier); the pieces outside it are left out of its vector (the encoder
    counts such words as truncated)."""
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
            held = [int(((pieces >= start) & (pieces < stop)).sum()) for start, stop in windows]
            best = int(np.argmax(held))
        choice[u] = best
    return choice


@dataclass(frozen=True)
class ChunkWindows:
    """A chunk's model inputs: each sentence's content pieces in windows (`plan_windows`), with the
    sentence's prefix and suffix special tokens around each window."""

    ids: np.ndarray  # every window's input ids, back to back
    bounds: np.ndarray  # (n_windows + 1,) window w is ids[bounds[w]:bounds[w + 1]]
    start: np.ndarray  # (n_windows,) each window's content pieces are start:stop of its sentence's
    stop: np.ndarray
    first: np.ndarray  # (n_sentences + 1,) sentence s is read in windows first[s]:first[s + 1]

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.bounds)


def chunk_windows(chunk: TokenizedChunk, max_length: int) -> ChunkWindows:
    """Each sentence of `chunk` in inputs of at most `max_length` ids: one window when its content
    fits (nearly always), else the overlapping windows of `plan_windows`."""
    n_content = chunk.n_content
    capacity = max_length - chunk.n_prefix - chunk.n_suffix
    planned = {int(s): plan_windows(int(n_content[s]), int(capacity[s]))
               for s in np.flatnonzero((n_content > capacity) | (capacity < 2))}
    n_windows = np.ones(len(n_content), dtype=np.int64)
    for s, spans in planned.items():
        n_windows[s] = len(spans)
    first = np.concatenate([[0], np.cumsum(n_windows)])
    sentence = np.repeat(np.arange(len(n_content)), n_windows)
    start, stop = np.zeros(len(sentence), dtype=np.int64), n_content[sentence]
    for s, spans in planned.items():
        start[first[s] : first[s + 1]], stop[first[s] : first[s + 1]] = np.array(spans, dtype=np.int64).T
    # each window: the sentence's prefix ids, its content ids start:stop, its suffix ids
    segment_starts = np.stack([chunk.bounds[:-1][sentence], (chunk.bounds[:-1] + chunk.n_prefix)[sentence] + start,
                               chunk.bounds[1:][sentence] - chunk.n_suffix[sentence]], axis=1)
    segment_lengths = np.stack([chunk.n_prefix[sentence], stop - start, chunk.n_suffix[sentence]], axis=1)
    ids = chunk.ids[concat_ranges(segment_starts.ravel(), segment_lengths.ravel())]
    return ChunkWindows(ids, np.concatenate([[0], np.cumsum(segment_lengths.sum(axis=1))]), start, stop, first)


def unit_windows(windows: ChunkWindows, unit_sentence: np.ndarray, piece_bounds: np.ndarray, pieces: np.ndarray) -> np.ndarray:
    """The window each unit (content pieces of one sentence: unit u is pieces[piece_bounds[u]:piece_bounds[u + 1]]
    of sentence unit_sentence[u], ascending in u) is read from: its sentence's window, or for a
    sentence in several windows the one `choose_windows` picks."""
    window = windows.first[unit_sentence]
    for s in np.flatnonzero(np.diff(windows.first) > 1):
        lo, hi = np.searchsorted(unit_sentence, [s, s + 1])
        if lo == hi:
            continue
        own = slice(windows.first[s], windows.first[s + 1])
        spans = list(zip(windows.start[own].tolist(), windows.stop[own].tolist()))
        units = np.split(pieces[piece_bounds[lo] : piece_bounds[hi]], piece_bounds[lo + 1 : hi] - piece_bounds[lo])
        window[lo:hi] += choose_windows(units, spans)
    return window
