"""Evaluation on benchmarks, as pure functions of given vectors.

`wordsim`: word-pair files and gensim's shipped word benchmarks; similarity (Spearman) and analogies
(3CosAdd) of static word vectors with gensim, on covered items.
`wordbench`: every benchmark of Ethayarajh (2019)'s Table 1 (similarity, analogies, SemEval-2012
Task 2, categorisation) scored as the `web` package scores them, in two protocols (`oov="skip"|"mean"`).
`sts_data` / `sts`: sentence-similarity readers and scoring of given sentence vectors.
"""

from __future__ import annotations

from lmgeom.evaluate.wordbench import (
    OOV_PROTOCOLS,
    MinCoverage,
    WordLookup,
    evaluate_word_benchmarks,
    find_word_benchmarks,
    read_word_benchmarks,
)
from lmgeom.evaluate.wordsim import (
    GENSIM_BENCHMARKS,
    evaluate_analogies,
    evaluate_word_pairs,
    load_static_vectors,
    read_word_pairs,
)

__all__ = [
    "GENSIM_BENCHMARKS",
    "OOV_PROTOCOLS",
    "MinCoverage",
    "WordLookup",
    "evaluate_analogies",
    "evaluate_word_benchmarks",
    "evaluate_word_pairs",
    "find_word_benchmarks",
    "load_static_vectors",
    "read_word_benchmarks",
    "read_word_pairs",
]
