"""Corpora: sentences as the model sees them (natural text) plus their words as character spans.

A `Corpus` holds its sentences in memory; a `CorpusStream` reads them from their source one at a
time, every pass afresh, for corpora larger than memory (sharded extraction streams the corpus).
Both are built from the same readers, so a stream yields exactly the sentences of its `Corpus`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import operator
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence, Union

import numpy as np
import pandas as pd

from lmgeom.errors import InputError, MissingDependency
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


Item = Union[str, Sequence[str]]  # natural text, or a pre-tokenized sentence's words


def to_sentence(item: Item) -> Sentence:
    """Strings are natural text; lists of strings are pre-tokenized sentences kept as is."""
    if isinstance(item, str):
        return Sentence.from_text(item)
    if not is_words(item):
        raise InputError(f"a sentence is a string (natural text) or a list of strings (its words), not {_json_kind(item)}")
    return Sentence.from_words(list(item))


def is_words(item: object) -> bool:
    """A pre-tokenized sentence: a sequence (not a string) of strings."""
    return isinstance(item, Sequence) and not isinstance(item, (str, bytes)) and all(isinstance(word, str) for word in item)


def _json_kind(value: object, *, words: bool = True) -> str:
    """What a value is, in JSON's words, with a short excerpt of it: `an object ({"a": 1})`; with
    `words`, a list is described by its first item that is not a string."""
    kinds = ((bool, "a boolean"), (type(None), "null"), (str, "a string"), ((int, float), "a number"),
             (dict, "an object"), ((list, tuple), "a list"))
    kind = next((name for types, name in kinds if isinstance(value, types)), f"a {type(value).__name__}")
    if words and isinstance(value, (list, tuple)):
        bad = next((i for i, word in enumerate(value) if not isinstance(word, str)), None)
        if bad is not None:
            return f"{kind} whose item {bad} is {_json_kind(value[bad])}"
    if value is None:
        return kind
    try:
        excerpt = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        excerpt = repr(value)
    return f"{kind} ({excerpt[:40]}{'…' if len(excerpt) > 40 else ''})"


def require_count(value: int | None, name: str) -> None:
    """`limit` and `sample` (`--limit`, `--sample`) count sentences: at least 1, or None for the whole corpus."""
    if value is None:
        return
    try:
        count = operator.index(value) if not isinstance(value, bool) else None
    except TypeError:
        count = None
    if count is None or count < 1:
        raise InputError(f"`{name}` must be a number of sentences, at least 1, or left out (None) for the "
                         f"whole corpus; got {value!r}", param=name)


def _no_words_error(name: str, index: int, sentence: Sentence) -> InputError:
    return InputError(f"corpus {name!r}: sentence {index} has no words ({sentence.text!r}); remove blank or whitespace-only lines")


class Fingerprint:
    """sha256 over the texts and word spans of sentences in order: equal fingerprints mean the same input to the model."""

    def __init__(self) -> None:
        self.digest = hashlib.sha256()
        self.n_sentences = 0

    def add(self, sentence: Sentence) -> None:
        self.digest.update(sentence.text.encode("utf-8"))
        self.digest.update(b"\x00")
        self.digest.update(",".join(f"{w.start}:{w.end}" for w in sentence.words).encode())
        self.digest.update(b"\x01")
        self.n_sentences += 1

    def hexdigest(self) -> str:
        return self.digest.hexdigest()


@dataclass(frozen=True)
class CorpusSummary:
    """What one pass over a corpus tells: its length, fingerprint and whether it is pre-tokenized."""

    n_sentences: int
    fingerprint: str
    pretokenized: bool


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
            raise InputError(f"corpus {self.name!r} is empty ({self.source or 'no source'}); give at least one sentence")
        for index, sentence in enumerate(self.sentences):
            if not sentence.words:
                raise _no_words_error(self.name, index, sentence)

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
            digest = Fingerprint()
            for sentence in self.sentences:
                digest.add(sentence)
            self._fingerprint = digest.hexdigest()
        return self._fingerprint

    def summary(self) -> CorpusSummary:
        return CorpusSummary(len(self), self.fingerprint, self.pretokenized)

    def head(self, n: int) -> "Corpus":
        """The first `n` (at least 1) sentences (for quick runs and demos)."""
        require_count(n, "limit")
        return Corpus(f"{self.name}[:{n}]", self.sentences[:n], self.pretokenized, self.source)

    def sample(self, n: int, *, seed: int = 0) -> "Corpus":
        """`n` (at least 1) sentences drawn uniformly without replacement (seeded), kept in corpus order."""
        require_count(n, "sample")
        if n >= len(self.sentences):
            return self
        keep = np.sort(np.random.default_rng(seed).choice(len(self.sentences), size=n, replace=False))
        return Corpus(f"{self.name}[sample {n}, seed {seed}]", [self.sentences[i] for i in keep], self.pretokenized, self.source)

    def select(self, *, limit: int | None = None, sample: int | None = None, seed: int = 0) -> "Corpus":
        """The first `limit` sentences of a seeded uniform `sample` of them (None: all), as `load_corpus` keeps them."""
        corpus = self if sample is None else self.sample(sample, seed=seed)
        return corpus if limit is None else corpus.head(limit)

    def shuffle_words(self, seed: int = 0) -> "Corpus":
        """The `shuffled` control's corpus: each sentence's words (as this corpus segments them) in a
        seeded random order, joined by single spaces, as a pre-tokenized corpus.

        Sentence `i` is permuted by `numpy.random.default_rng([seed, i])`, uniformly among all orders
        (so a sentence may keep its order, a one-word sentence always does), the same in every process
        and whatever the other sentences are. Each sentence keeps its multiset of words, so the
        word-level statistics (self-similarity, MEV) still apply; the word order, and the text's own
        spacing, are gone.

        Parameters
        ----------
        seed : int, default 0
            The seed of the shuffles (at least 0).

        Returns
        -------
        Corpus
            The shuffled sentences, named ``<name>[words shuffled, seed S]``, pre-tokenized, with the
            source of this corpus.
        """
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise InputError(f"`control_seed` must be a whole number of at least 0; got {seed!r}", param="control_seed")
        shuffled = []
        for index, sentence in enumerate(self.sentences):
            words = [word.text for word in sentence.words]
            order = np.random.default_rng([int(seed), index]).permutation(len(words))
            shuffled.append(Sentence.from_words([words[i] for i in order]))
        return Corpus(f"{self.name}[words shuffled, seed {seed}]", shuffled, True, self.source)

    # ---- constructors ------------------------------------------------------------------
    @classmethod
    def from_list(cls, items: Iterable[Item], *, name: str = "list") -> "Corpus":
        """Strings are natural text; lists of strings are pre-tokenized sentences kept as is."""
        return CorpusStream(name, lambda: items, source="python list").materialize()

    @classmethod
    def from_text_file(cls, path: str | os.PathLike, *, pretokenized: bool = False, name: str | None = None) -> "Corpus":
        """One sentence per line; blank lines are skipped. `pretokenized`: words separated by spaces."""
        return CorpusStream.from_text_file(path, pretokenized=pretokenized, name=name).materialize()

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike, *, field: str = "text", name: str | None = None) -> "Corpus":
        """One JSON object per line; `field` holds a string (natural text) or a list of words."""
        return CorpusStream.from_jsonl(path, field=field, name=name).materialize()

    @classmethod
    def from_hf_dataset(cls, dataset: str, *, split: str = "train", column: str = "text", config: str | None = None) -> "Corpus":
        """A Hugging Face dataset column (needs `pip install datasets` and network or a local cache)."""
        return CorpusStream.from_hf_dataset(dataset, split=split, column=column, config=config, streaming=False).materialize()


@dataclass(frozen=True)
class CorpusStream:
    """A corpus read from its source one sentence at a time, never held whole.

    `read` returns a fresh iterable of items (a string is natural text, a list of strings a
    pre-tokenized sentence) each time it is called, so every pass reads the source anew and sees
    the same sentences. `pretokenized`: as the source declares it, or (None) whether any item is a
    list of words. Validation is as for `Corpus`, as the sentences go by."""

    name: str
    read: Callable[[], Iterable[Item]]
    source: str = ""
    pretokenized: bool | None = None

    def __iter__(self) -> Iterator[Sentence]:
        for index, item in enumerate(self.read()):
            sentence = to_sentence(item)
            if not sentence.words:
                raise _no_words_error(self.name, index, sentence)
            yield sentence

    def summary(self) -> CorpusSummary:
        """One pass: the number of sentences, the fingerprint (as `Corpus.fingerprint`) and whether
        any sentence is pre-tokenized; an empty corpus is refused as `Corpus` refuses it."""
        digest, pretokenized = Fingerprint(), False
        for index, item in enumerate(self.read()):
            sentence = to_sentence(item)
            if not sentence.words:
                raise _no_words_error(self.name, index, sentence)
            digest.add(sentence)
            pretokenized = pretokenized or not isinstance(item, str)
        if not digest.n_sentences:
            raise InputError(f"corpus {self.name!r} is empty ({self.source or 'no source'}); give at least one sentence")
        return CorpusSummary(digest.n_sentences, digest.hexdigest(), pretokenized if self.pretokenized is None else self.pretokenized)

    def materialize(self) -> Corpus:
        """The sentences in memory, as a `Corpus`."""
        items = list(self.read())
        pretokenized = any(not isinstance(item, str) for item in items) if self.pretokenized is None else self.pretokenized
        return Corpus(self.name, [to_sentence(item) for item in items], pretokenized, self.source)

    def head(self, n: int) -> CorpusStream:
        """The first `n` (at least 1) sentences (named as `Corpus.head` names them)."""
        require_count(n, "limit")
        return CorpusStream(f"{self.name}[:{n}]", lambda: itertools.islice(self.read(), n), self.source, self.pretokenized)

    def sample(self, n: int, *, seed: int = 0) -> CorpusStream:
        """The sentences `Corpus.sample` draws (seeded, in corpus order); costs one counting pass."""
        require_count(n, "sample")
        total = sum(1 for _ in self.read())
        if n >= total:
            return self
        keep = np.sort(np.random.default_rng(seed).choice(total, size=n, replace=False))

        def read() -> Iterator[Item]:
            kept = iter(keep)
            wanted = next(kept)
            for index, item in enumerate(self.read()):
                if index == wanted:
                    yield item
                    wanted = next(kept, -1)
                    if wanted < 0:
                        return
        return CorpusStream(f"{self.name}[sample {n}, seed {seed}]", read, self.source, self.pretokenized)

    def select(self, *, limit: int | None = None, sample: int | None = None, seed: int = 0) -> CorpusStream:
        """The sentences `Corpus.select` keeps."""
        stream = self if sample is None else self.sample(sample, seed=seed)
        return stream if limit is None else stream.head(limit)

    # ---- sources ------------------------------------------------------------------------
    @classmethod
    def from_text_file(cls, path: str | os.PathLike, *, pretokenized: bool = False, name: str | None = None) -> CorpusStream:
        """One sentence per line (`iter_lines`); blank lines are skipped. `pretokenized`: words separated by spaces."""
        path = _existing(Path(path))

        def read() -> Iterator[Item]:
            for line in iter_lines(path):
                if line.strip():
                    yield line.split() if pretokenized else line.strip()
        return cls(name or path.stem, read, source=str(path.resolve()), pretokenized=pretokenized)

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike, *, field: str = "text", name: str | None = None) -> CorpusStream:
        """One JSON object per line (`iter_lines`); `field` holds a string (natural text) or a list of
        strings (a pre-tokenized sentence's words); anything else is an error naming its line."""
        path = _existing(Path(path))

        def read() -> Iterator[Item]:
            for number, line in enumerate(iter_lines(path), start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise InputError(f"{path}: line {number} is not valid JSON ({error.msg})") from None
                if not isinstance(record, dict):
                    raise InputError(f"{path}: line {number} holds {_json_kind(record, words=False)}, not a JSON object; "
                                     f"give one object per line, e.g. {{{json.dumps(field)}: \"A sentence.\"}}")
                if field not in record:
                    fields = f"pass `field` with one of {sorted(record)}" if record else "the line is an empty object"
                    raise InputError(f"{path}: line {number} has no field {field!r}; {fields}", param="field")
                yield checked_item(record[field], f"{path}: line {number}: field {field!r}")
        return cls(name or path.stem, read, source=str(path.resolve()))

    @classmethod
    def from_hf_dataset(cls, dataset: str, *, split: str = "train", column: str = "text", config: str | None = None,
                        streaming: bool = True) -> CorpusStream:
        """A Hugging Face dataset column (needs `pip install datasets` and network or a local cache);
        `streaming`: read record by record (`load_dataset(streaming=True)`) instead of loading the split."""
        try:
            import datasets
        except ImportError:
            raise MissingDependency("reading a Hugging Face dataset needs the datasets package: pip install 'lmgeom[hf]'") from None

        def read() -> Iterator[Item]:
            table = datasets.load_dataset(dataset, config, split=split, streaming=streaming)
            for index, record in enumerate(table):
                if column not in record:
                    raise InputError(f"dataset {dataset} has no column {column!r}; columns: {sorted(record)}")
                # strings are natural text (blank ones skipped), lists of strings are pre-tokenized sentences
                item = checked_item(record[column], f"dataset {dataset} {split}, record {index}: column {column!r}")
                if not isinstance(item, str) or item.strip():
                    yield item
        return cls(f"{dataset}:{split}:{column}", read, source=f"hf://{dataset}/{config or ''}/{split}/{column}")


def checked_item(value: Any, where: str) -> Item:
    """`value` as a corpus item: a string, or a list of strings; else an error naming `where` it was."""
    if isinstance(value, str) or is_words(value):
        return value
    raise InputError(f"{where} holds {_json_kind(value)}; it must be a string (the sentence), "
                     "or a list of strings (a pre-tokenized sentence's words)")


def _existing(path: Path) -> Path:
    if not path.exists():
        raise FileNotFoundError(f"corpus file not found: {path}")
    return path


def iter_lines(path: Path, *, encoding: str = "utf-8") -> Iterator[str]:
    r"""The lines of a text file, read one at a time. A line ends at ``\n`` (``\r\n`` too, both
    dropped); the other characters `str.splitlines` breaks at (a lone ``\r``, VT, FF, ``\x1c``-``\x1e``,
    ``\x85``, U+2028, U+2029) stay in their line, where word segmentation reads them as spaces. A
    leading UTF-8 BOM is dropped; invalid UTF-8 names its line and byte offset."""
    offset = 0
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8-sig" if number == 1 and encoding == "utf-8" else encoding)
            except UnicodeDecodeError as error:
                start = offset + error.start
                raise InputError(
                    f"{path}: line {number} is not valid UTF-8 (byte {raw[error.start]:#04x} at offset {start}); "
                    "re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
                ) from None
            offset += len(raw)
            yield text.removesuffix("\n").removesuffix("\r") if text.endswith("\n") else text


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
