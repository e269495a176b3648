"""Corpus stage: sentences, word segmentation, vocabulary, built-in corpora."""

from lmgeom.corpus.builtin import BUILTIN_CORPORA, brown, lee, load_corpus, open_corpus, sts
from lmgeom.corpus.corpus import Corpus, CorpusStream, Sentence, Vocabulary, require_count
from lmgeom.corpus.segment import Word, is_punctuation, segment_words, split_sentences

__all__ = [
    "BUILTIN_CORPORA", "Corpus", "CorpusStream", "Sentence", "Vocabulary", "Word",
    "brown", "is_punctuation", "lee", "load_corpus", "open_corpus", "require_count", "segment_words", "split_sentences", "sts",
]
