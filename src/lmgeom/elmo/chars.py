"""ELMo's character input, in the published convention (bilm-tf `UnicodeCharsVocabulary`,
AllenNLP `ELMoCharacterMapper`).

A token is `max_characters` ids: begin-of-word, its UTF-8 bytes truncated to `max_characters - 2`,
end-of-word, then padding. Sentence boundaries are tokens of their own: `<S>` is
begin-of-word, begin-of-sentence, end-of-word, padding (likewise `</S>`). Every id is shifted by +1
so that 0 marks positions that hold no token (batch padding); the character vocabulary therefore
has 262 symbols: 0, the 256 bytes, and the five markers below (before the shift).

Unlike AllenNLP, a word spelled ``<S>`` or ``</S>`` inside a sentence is an ordinary word here;
only the boundaries the model adds get the sentence-marker ids.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from lmgeom.errors import InputError

MAX_CHARACTERS = 50
BOS_CHAR = 256
EOS_CHAR = 257
BOW_CHAR = 258
EOW_CHAR = 259
PAD_CHAR = 260
N_CHARACTERS = 262  # 256 bytes + 5 markers + the 0 "no token" id
STORED_CHARACTERS = 261  # rows of `char_embed` in a weights file: the 0 row is added on load

BOS_TOKEN = "<S>"
EOS_TOKEN = "</S>"

CHAR_VOCABULARY = (
    f"elmo-chars: utf-8 bytes 0-255, bos={BOS_CHAR}, eos={EOS_CHAR}, bow={BOW_CHAR}, eow={EOW_CHAR}, "
    f"pad={PAD_CHAR}, shift=+1, 0=no token"
)
"""What the ids mean; part of a model's fingerprint."""


def _marker_token(marker: int, max_characters: int) -> np.ndarray:
    ids = np.full(max_characters, PAD_CHAR, dtype=np.int64)
    ids[:3] = (BOW_CHAR, marker, EOW_CHAR)
    return ids + 1


def bos_ids(max_characters: int = MAX_CHARACTERS) -> np.ndarray:
    """Character ids of the begin-of-sentence token (shifted)."""
    return _marker_token(BOS_CHAR, max_characters)


def eos_ids(max_characters: int = MAX_CHARACTERS) -> np.ndarray:
    """Character ids of the end-of-sentence token (shifted)."""
    return _marker_token(EOS_CHAR, max_characters)


def word_ids(word: str, max_characters: int = MAX_CHARACTERS) -> np.ndarray:
    """Character ids of one word (shifted). Longer words keep their first `max_characters - 2`
    UTF-8 bytes, even when that cuts a multi-byte character (as the published models were trained)."""
    return words_ids([word], max_characters)[0]


def words_ids(words: Sequence[str], max_characters: int = MAX_CHARACTERS) -> np.ndarray:
    """(len(words), max_characters) character ids, `word_ids` of each word, spelled in a few array
    operations over all the words' bytes at once (one Python step per word, not several)."""
    if max_characters < 3:
        raise InputError(f"max_characters must be at least 3 (begin, end and one byte), got {max_characters}")
    encoded = [word.encode("utf-8", "ignore")[: max_characters - 2] for word in words]
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    ids = np.full((len(encoded), max_characters), PAD_CHAR + 1, dtype=np.int64)
    ids[:, 0] = BOW_CHAR + 1
    columns = np.arange(max_characters)
    # row-major order of the mask is the order of the joined bytes
    ids[(columns >= 1) & (columns <= lengths[:, None])] = np.frombuffer(b"".join(encoded), dtype=np.uint8) + 1
    ids[np.arange(len(encoded)), lengths + 1] = EOW_CHAR + 1
    return ids


def batch_to_ids(sentences: Sequence[Sequence[str]], max_characters: int = MAX_CHARACTERS) -> torch.Tensor:
    """(n_sentences, longest + 2, max_characters) ids: each sentence as ``<S> words </S>``,
    shorter sentences padded with all-zero tokens."""
    if isinstance(sentences, str) or any(isinstance(s, str) for s in sentences):
        raise TypeError("batch_to_ids takes a list of sentences, each a list of word strings")
    lengths = np.array([len(s) for s in sentences], dtype=np.int64)
    ids = np.zeros((len(sentences), int(lengths.max(initial=0)) + 2, max_characters), dtype=np.int64)
    ids[:, 0] = bos_ids(max_characters)
    ids[np.arange(len(sentences)), lengths + 1] = eos_ids(max_characters)
    flat = [word for sentence in sentences for word in sentence]
    if flat:
        rows = np.repeat(np.arange(len(sentences)), lengths)
        positions = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths) + 1
        ids[rows, positions] = words_ids(flat, max_characters)
    return torch.from_numpy(ids)
