"""Evaluation on benchmarks, as pure functions of given vectors.

`wordsim`: word similarity (Spearman) and analogies (3CosAdd) of static word vectors, with gensim.
`sts_data` / `sts`: sentence-similarity readers and scoring of given sentence vectors.
"""

from __future__ import annotations

from lmgeom.evaluate.wordsim import (
    GENSIM_BENCHMARKS,
    evaluate_analogies,
    evaluate_benchmarks,
    evaluate_word_pairs,
    load_static_vectors,
    read_word_pairs,
)

__all__ = [
    "GENSIM_BENCHMARKS",
    "evaluate_analogies",
    "evaluate_benchmarks",
    "evaluate_word_pairs",
    "load_static_vectors",
    "read_word_pairs",
]
