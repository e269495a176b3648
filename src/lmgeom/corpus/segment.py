"""Rule-based word segmentation with character spans, and punctuation flags.

The model always sees natural text; words are character spans of that text, so pieces map to
words through the tokenizer's offsets whatever the tokenizer family.

Rules of `segment_words`, in order of priority:
1. URLs and e-mail addresses are one word.
2. Numbers keep internal separators: ``4:00``, ``1,650``, ``0.11``, ``2-3``.
3. Words keep internal hyphens and apostrophes (``south-west``, ``O'Brien``); English clitics
   are split off as in the Penn Treebank: ``don't`` -> ``do`` ``n't``, ``Poor's`` -> ``Poor`` ``'s``.
4. Every other non-space character that is not a letter, digit or mark is its own word (so
   punctuation is kept, and flagged by `is_punctuation`).
5. Control and format characters (Unicode Cc, Cf: ``\x12``, zero-width space) separate words
   like spaces: tokenizers drop them, so they could never have a vector.
Spaces are what `str.isspace` calls whitespace: the line and paragraph separators a line of a
corpus file may hold (VT, FF, ``\x1c``-``\x1e``, ``\x85``, U+2028, U+2029) included.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

_CLITIC_RE = re.compile(r"(?i)(?:n['’]t|['’](?:s|re|ve|ll|d|m))$")
_WORD_RE = re.compile(
    r"""
    (?:https?://|www\.)\S+[^\s.,;:!?)\]}'"]     # URL
  | [\w.+-]+@[\w-]+\.[\w.-]*\w                 # e-mail address
  | \d+(?:[.,:/-]\d+)+                          # number with separators
  | [^\W_]+(?:[-'’][^\W_]+)*                    # word with inner hyphens/apostrophes
  | \S                                           # any other character
    """,
    re.VERBOSE,
)


@dataclass(frozen=True, slots=True)
class Word:
    text: str
    start: int
    end: int


def is_punctuation(word: str) -> bool:
    """True when every character is Unicode punctuation or a symbol (P* or S* categories)."""
    return bool(word) and all(unicodedata.category(ch)[0] in "PS" for ch in word)


def segment_words(text: str) -> list[Word]:
    """Split natural text into words with their character spans (see the module rules)."""
    words: list[Word] = []
    for match in _WORD_RE.finditer(text):
        token, start, end = match.group(), match.start(), match.end()
        if all(unicodedata.category(ch) in ("Cc", "Cf") for ch in token):
            continue
        clitic = _CLITIC_RE.search(token)
        if clitic and clitic.start() > 0 and token[clitic.start() - 1].isalpha():
            split = start + clitic.start()
            words.append(Word(token[: clitic.start()], start, split))
            words.append(Word(token[clitic.start() :], split, end))
        else:
            words.append(Word(token, start, end))
    return words


def join_pretokenized(words: list[str]) -> tuple[str, list[Word]]:
    """Pre-tokenized input: the model sees the words joined by single spaces."""
    spans: list[Word] = []
    pos = 0
    for word in words:
        spans.append(Word(word, pos, pos + len(word)))
        pos += len(word) + 1
    return " ".join(words), spans


_SENTENCE_END_RE = re.compile(r"""(?<=[.!?])["'”’)\]]*\s+(?=["'“‘(\[]?[A-Z0-9])""")
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st mt gen col lt sgt capt gov sen rep rev fr no vs etc inc ltd co corp jan feb mar apr "
    "jun jul aug sep sept oct nov dec u.s u.k u.n e.g i.e".split()
)


def split_sentences(paragraph: str) -> list[str]:
    """Split a paragraph after . ! ? followed by space and an upper-case letter or digit,
    unless the full stop ends a known abbreviation or a single initial (``J. Smith``)."""
    sentences: list[str] = []
    start = 0
    for match in _SENTENCE_END_RE.finditer(paragraph):
        candidate = paragraph[start : match.start()].rstrip()
        last_token = candidate.rsplit(None, 1)[-1] if candidate.split() else ""
        stem = last_token.rstrip(".\"'”’)]").lower()
        if last_token.endswith(".") and (stem in _ABBREVIATIONS or (len(stem) == 1 and stem.isalpha())):
            continue
        if candidate:
            sentences.append(candidate.strip())
        start = match.end()
    tail = paragraph[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences
