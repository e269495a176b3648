"""Evaluation on benchmarks.

`wordsim`: word similarity (Spearman) and analogies (3CosAdd) of static word vectors, with gensim.
"""

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
