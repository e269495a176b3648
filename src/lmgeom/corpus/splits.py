"""A fixed train / held-out split of the Brown corpus by file, for language-model training and as
a Brown test set: the held-out files are every tenth file in sorted order (the 10th, 20th, ...,
500th: ca10, ca20, ca30, ca40, cb06, ..., 50 files, about 10 % of the sentences of every genre
in proportion)."""

from __future__ import annotations

import os
from pathlib import Path

from lmgeom.errors import InputError
from lmgeom.corpus.builtin import DEFAULT_DATA_DIR, brown_files, brown
from lmgeom.corpus.corpus import Corpus, Sentence

HELD_OUT_EVERY = 10


def brown_heldout_files(directory: str | os.PathLike | None = None) -> list[str]:
    """Names of the held-out Brown files: positions 10, 20, ... of the sorted file names."""
    files = sorted(path.name for path in brown_files(Path(directory) if directory else DEFAULT_DATA_DIR / "brown"))
    return files[HELD_OUT_EVERY - 1 :: HELD_OUT_EVERY]


def brown_split(directory: str | os.PathLike | None = None) -> tuple[Corpus, Corpus]:
    """(train, held-out) Brown corpora: sentences of the held-out files (`brown_heldout_files`)
    and of all the others, each in corpus order."""
    root = Path(directory) if directory else DEFAULT_DATA_DIR / "brown"
    corpus = brown(root)
    heldout_names = set(brown_heldout_files(root))
    train: list[Sentence] = []
    heldout: list[Sentence] = []
    start = 0
    for path in brown_files(root):
        # brown() makes one sentence of each line holding tokens, file after file
        count = sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.split())
        (heldout if path.name in heldout_names else train).extend(corpus.sentences[start : start + count])
        start += count
    if start != len(corpus):
        raise InputError(f"{root}: counted {start} sentences in the files but the corpus has {len(corpus)}")
    return (
        Corpus("brown-train", train, pretokenized=True, source=corpus.source),
        Corpus("brown-heldout", heldout, pretokenized=True, source=corpus.source),
    )


def brown_test(directory: str | os.PathLike | None = None) -> Corpus:
    """The held-out Brown files as a corpus (the Brown test set)."""
    return brown_split(directory)[1]
