"""Which rows of a store an analysis uses: the one row selection of every driver function.

A store row is a stored token: a word of the corpus, or a special token (CLS/SEP/BOS) when the
store was extracted with `--include-special`.
- Special tokens are left out unless `include_special` (they are not words of the corpus).
- Punctuation (every character a Unicode punctuation mark or symbol) is left out unless
  `include_punct`, as Ethayarajh (2019) did.
- With `exclude_first_word`, each sentence's first word (not its special tokens) is left out:
  decoders without BOS put outlier activations on the first position (see docs/metrics.md).
- Zero vectors stay selected but have no direction: every cosine-based statistic (baselines,
  self-similarity, intra-sentence similarity, MEV) leaves them out and counts them, while
  covariance-based ones (IsoScore, calibrator fits) use them as points.
Word statistics then use the selected rows of the words that occur at least `min_contexts` times,
counted by `count_by`: in distinct sentences (`sentences`, the default), or as occurrences
(`occurrences`: two in one sentence, or one in each copy of a repeated sentence, count twice, as the
released code of Ethayarajh 2019 counts). Either way a word's statistics use every occurrence.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from lmgeom.errors import InputError

# the units a word threshold counts in (`select_words`' `count_by`)
COUNT_UNITS = ("sentences", "occurrences")

# the token table's columns `select_rows` reads
SELECTION_COLUMNS = ("sentence_id", "word_id", "is_punct", "is_special")


@dataclass(frozen=True)
class RowSelection:
    """The selected rows of a store (`mask`, one bool per row) and what was left out (`counts`)."""

    include_special: bool
    include_punct: bool
    exclude_first_word: bool
    mask: np.ndarray
    sentence_ids: np.ndarray  # per row
    word_ids: np.ndarray  # per row: the store's vocabulary id
    counts: dict[str, int]

    @property
    def rows(self) -> np.ndarray:
        """Indexes of the selected rows, ascending."""
        return np.flatnonzero(self.mask)

    def options(self) -> dict[str, bool]:
        return {"include_special": self.include_special, "include_punct": self.include_punct,
                "exclude_first_word": self.exclude_first_word}


def select_rows(
    tokens: pd.DataFrame, *, include_special: bool = False, include_punct: bool = False, exclude_first_word: bool = False,
) -> RowSelection:
    """The selected rows of a store's token table (its `SELECTION_COLUMNS` are enough; see the
    module docstring); no row left is an error."""
    special = tokens["is_special"].to_numpy(dtype=bool)
    punct = tokens["is_punct"].to_numpy(dtype=bool) & ~special
    mask = np.ones(len(tokens), dtype=bool)
    if not include_special:
        mask &= ~special
    if not include_punct:
        mask &= ~punct
    sentence_ids = tokens["sentence_id"].to_numpy()
    first_word = ~special & (pd.Series(~special).groupby(sentence_ids).cumsum().to_numpy() == 1)
    first_word_excluded = 0
    if exclude_first_word:
        first_word_excluded = int((first_word & mask).sum())
        mask &= ~first_word
    if not mask.any():
        raise InputError(
            f"no rows left to analyse out of {len(tokens)} (special tokens {'in' if include_special else 'out'}, "
            f"punctuation {'in' if include_punct else 'out'}, first words {'out' if exclude_first_word else 'in'}); "
            "include punctuation or special tokens, or use a bigger corpus"
        )
    counts = {
        "rows": len(tokens),
        "rows_analysed": int(mask.sum()),
        "rows_special_excluded": 0 if include_special else int(special.sum()),
        "rows_punctuation_excluded": 0 if include_punct else int(punct.sum()),
        "rows_first_word_excluded": first_word_excluded,
    }
    return RowSelection(include_special, include_punct, exclude_first_word, mask, sentence_ids,
                        tokens["word_id"].to_numpy(), counts)


@dataclass(frozen=True)
class WordSelection:
    """The words whose selected rows number at least `min_contexts` (`count_by`: distinct sentences or occurrences)."""

    min_contexts: int
    words: pd.DataFrame  # word_id, word, count, contexts: over the selected rows, ordered by word_id
    word_index: np.ndarray  # per store row: index into `words`, -1 for rows not selected or of other words
    counts: dict[str, int]

    def __len__(self) -> int:
        return len(self.words)


def select_words(vocab: pd.DataFrame, selection: RowSelection, *, min_contexts: int,
                 count_by: str = "sentences") -> WordSelection:
    """The words of the selected rows that occur at least `min_contexts` times, counted in distinct
    sentences or occurrences (`count_by`, see the module docstring).
    `vocab`: the store's vocabulary (`word_id`, `word`), which names them; rows are counted from the
    selection's own per-row ids, so no per-row table of words is needed."""
    rows = pd.DataFrame({"word_id": selection.word_ids[selection.mask], "sentence_id": selection.sentence_ids[selection.mask]})
    table = rows.groupby("word_id", sort=True).agg(count=("sentence_id", "size"), contexts=("sentence_id", "nunique")).reset_index()
    names = vocab["word"].to_numpy()[pd.Index(vocab["word_id"]).get_indexer(table["word_id"])]
    table.insert(1, "word", names)
    if count_by not in COUNT_UNITS:
        raise InputError(f"unknown `count_by` {count_by!r}; use one of {', '.join(COUNT_UNITS)}", param="count_by")
    counted = table["contexts" if count_by == "sentences" else "count"]
    words = table.loc[counted >= min_contexts].reset_index(drop=True)
    if words.empty:
        raise InputError(_no_word_message(counted, min_contexts, int(selection.mask.sum()), count_by), param="min_contexts")
    index_of_word_id = np.full(int(selection.word_ids.max()) + 1, -1, dtype=np.int64)
    index_of_word_id[words["word_id"].to_numpy()] = np.arange(len(words))
    word_index = np.where(selection.mask, index_of_word_id[selection.word_ids], -1)
    counts = {
        "sentences": int(pd.unique(selection.sentence_ids[selection.mask]).size),
        "distinct_words": len(table),
        "words_analysed": len(words),
        "words_below_min_contexts": len(table) - len(words),
        "rows_of_analysed_words": int(words["count"].sum()),
    }
    return WordSelection(min_contexts, words, word_index, counts)


def _no_word_message(contexts: pd.Series, min_contexts: int, n_rows: int, count_by: str = "sentences") -> str:
    histogram = contexts.value_counts().sort_index()
    unit = "sentence" if count_by == "sentences" else "occurrence"
    shown = ", ".join(f"{n} word{'s' if n != 1 else ''} in {c} {unit}{'s' if c != 1 else ''}" for c, n in histogram.items())
    where = "in at least {} distinct sentences" if count_by == "sentences" else "at least {} times"
    return (
        f"no word occurs {where.format(min_contexts)} ({n_rows} analysed tokens; {shown or 'no words'}); "
        "lower `min_contexts` (2 is the least that defines self-similarity) or use a bigger corpus"
    )

