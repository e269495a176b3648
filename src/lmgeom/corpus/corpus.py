"""Corpora: sentences as the model sees them (natural text) plus their words as character spans."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np
import pandas as pd

from lmgeom.corpus.segment import Word, is_punctuation, join_pretokenized, segment_words


@dataclass(frozen=True, slots=True)
class Sentence:
    """One sentence: `text` is what the model reads, `words` are spans of it."""

    text: str
    words: tuple[Word, ...]

    @classmethod
    def from_text(cls, text: str) -> "Sentence":
        return cls(text, tuple(segment_words(text)))

    @classmethod
    def from_words(cls, words: Sequence[str]) -> "Sentence":
        text, spans = join_pretokenized(list(words))
        return cls(text, tuple(spans))


@dataclass
class Corpus:
    """An ordered list of sentences with a name and a content fingerprint."""

    name: str
    sentences: list[Sentence]
    pretokenized: bool = False
    source: str = ""
    _fingerprint: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.sentences:
            raise ValueError(f"corpus {self.name!r} is empty ({self.source or 'no source'}); give at least one sentence")
        for index, sentence in enumerate(self.sentences):
            if not sentence.words:
                raise ValueError(
                    f"corpus {self.name!r}: sentence {index} has no words ({sentence.text!r}); remove blank or whitespace-only lines"
                )

    def __len__(self) -> int:
        return len(self.sentences)

    def __iter__(self) -> Iterator[Sentence]:
        return iter(self.sentences)

    @property
    def n_words(self) -> int:
        return sum(len(s.words) for s in self.sentences)

    @property
    def fingerprint(self) -> str:
        """sha256 over the texts and word spans: equal fingerprints mean the same input to the model."""
        if self._fingerprint is None:
            digest = hashlib.sha256()
            for sentence in self.sentences:
                digest.update(sentence.text.encode("utf-8"))
                digest.update(b"\x00")
                digest.update(",".join(f"{w.start}:{w.end}" for w in sentence.words).encode())
                digest.update(b"\x01")
            self._fingerprint = digest.hexdigest()
        return self._fingerprint

    def head(self, n: int) -> "Corpus":
        """The first `n` sentences (for quick runs and demos)."""
        return Corpus(f"{self.name}[:{n}]", self.sentences[:n], self.pretokenized, self.source)

    def sample(self, n: int, *, seed: int = 0) -> "Corpus":
        """`n` sentences drawn uniformly without replacement (seeded), kept in corpus order."""
        if n >= len(self.sentences):
            return self
        keep = np.sort(np.random.default_rng(seed).choice(len(self.sentences), size=n, replace=False))
        return Corpus(f"{self.name}[sample {n}, seed {seed}]", [self.sentences[i] for i in keep], self.pretokenized, self.source)

    # ---- constructors ------------------------------------------------------------------
    @classmethod
    def from_list(cls, items: Iterable[str | Sequence[str]], *, name: str = "list") -> "Corpus":
        """Strings are natural text; lists of strings are pre-tokenized sentences kept as is."""
        sentences: list[Sentence] = []
        pretokenized = False
        for item in items:
            if isinstance(item, str):
                sentences.append(Sentence.from_text(item))
            else:
                pretokenized = True
                sentences.append(Sentence.from_words(list(item)))
        return cls(name, sentences, pretokenized, source="python list")

    @classmethod
    def from_text_file(cls, path: str | os.PathLike, *, pretokenized: bool = False, name: str | None = None) -> "Corpus":
        """One sentence per line; blank lines are skipped. `pretokenized`: words separated by spaces."""
        path = Path(path)
        sentences = [
            Sentence.from_words(line.split()) if pretokenized else Sentence.from_text(line.strip())
            for line in _read_lines(path)
            if line.strip()
        ]
        return cls(name or path.stem, sentences, pretokenized, source=str(path))

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike, *, field: str = "text", name: str | None = None) -> "Corpus":
        """One JSON object per line; `field` holds a string (natural text) or a list of words."""
        path = Path(path)
        items: list[str | list[str]] = []
        for number, line in enumerate(_read_lines(path), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}: line {number} is not valid JSON ({error.msg})") from None
            if field not in record:
                raise ValueError(f"{path}: line {number} has no field {field!r}; pass --field with one of {sorted(record)}")
            items.append(record[field])
        corpus = cls.from_list(items, name=name or path.stem)
        corpus.source = str(path)
        return corpus

    @classmethod
    def from_hf_dataset(cls, dataset: str, *, split: str = "train", column: str = "text", config: str | None = None) -> "Corpus":
        """A Hugging Face dataset column (needs `pip install datasets` and network or a local cache)."""
        try:
            import datasets
        except ImportError:
            raise ImportError("reading a Hugging Face dataset needs the datasets package: pip install 'lmgeom[hf]'") from None
        table = datasets.load_dataset(dataset, config, split=split)
        if column not in table.column_names:
            raise ValueError(f"dataset {dataset} has no column {column!r}; columns: {table.column_names}")
        # strings are natural text (blank ones skipped), lists of strings are pre-tokenized sentences
        items = [item for item in table[column] if not isinstance(item, str) or item.strip()]
        corpus = cls.from_list(items, name=f"{dataset}:{split}:{column}")
        corpus.source = f"hf://{dataset}/{config or ''}/{split}/{column}"
        return corpus


def _read_lines(path: Path) -> list[str]:
    if not path.exists():
        raise FileNotFoundError(f"corpus file not found: {path}")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ValueError(
            f"{path}: line {line} is not valid UTF-8 (byte {data[error.start]:#04x} at offset {error.start}); "
            "re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        ) from None
    return text.splitlines()


@dataclass(frozen=True)
class Vocabulary:
    """Occurrence counts and distinct-context (sentence) counts per word."""

    table: pd.DataFrame  # word_id, word, count, n_contexts, is_punct

    @classmethod
    def from_words(cls, words: Sequence[str], sentence_ids: Sequence[int]) -> "Vocabulary":
        codes, uniques = pd.factorize(pd.Series(words, dtype=object))
        distinct = pd.DataFrame({"code": codes, "sid": np.asarray(sentence_ids, dtype=np.int64)}).drop_duplicates()
        table = pd.DataFrame({
            "word_id": np.arange(len(uniques), dtype=np.int64),
            "word": np.asarray(uniques, dtype=object),
            "count": np.bincount(codes, minlength=len(uniques)).astype(np.int64),
            "n_contexts": np.bincount(distinct["code"].to_numpy(), minlength=len(uniques)).astype(np.int64),
        })
        table["is_punct"] = table["word"].map(is_punctuation).astype(bool)
        return cls(table)

    @classmethod
    def from_corpus(cls, corpus: Corpus) -> "Vocabulary":
        words, sentence_ids = [], []
        for sid, sentence in enumerate(corpus.sentences):
            for word in sentence.words:
                words.append(word.text)
                sentence_ids.append(sid)
        return cls.from_words(words, sentence_ids)

    def __len__(self) -> int:
        return len(self.table)
