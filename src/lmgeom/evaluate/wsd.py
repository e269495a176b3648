"""All-words word sense disambiguation as Peters et al. (2018, Table 5) evaluate a biLM's layers.

- Data: Raganato, Camacho-Collados & Navigli's (2017) unified framework: `<name>.data.xml` (texts of
  sentences of `<wf>` and `<instance>` tokens, each with a lemma and a Universal POS tag) and
  `<name>.gold.key.txt` (`<instance id> <sense key> [<sense key> ...]`, WordNet 3.0 sense keys;
  any of them counts as correct). `read_wsd_dataset` reads both.
- Method (Peters et al.): a sense's vector is the mean of the vectors of its tagged training
  occurrences (an occurrence tagged with several keys counts for each); a test instance takes the
  sense of its lemma and POS whose vector is nearest by cosine (`SenseVectors.predict`); an instance
  whose lemma and POS no training occurrence has gets WordNet's first sense (`FirstSense`). The
  lemma's most frequent training sense (`SenseVectors.most_frequent`) is the baseline without vectors.
- Scoring as the framework's `Scorer.java`: an instance answered with k keys earns (its keys in the
  gold set) / k; P = earned / answered, R = earned / gold instances, F1 = 2PR / (P + R) (`score`).
- Paired comparison of two systems on the same instances: the exact McNemar test (a two-sided
  binomial test on the instances exactly one of them gets right; `mcnemar_exact`).

WordNet's first senses come from the database files of WordNet 3.0 (Debian's `wordnet-base`:
`index.{noun,verb,adj,adv}` list a lemma's synsets most frequent first; the sense key of the lemma
in the first synset follows from `data.*`, as WordNet's senseidx(5WN) defines it).
"""

from __future__ import annotations

import math
import os
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
from scipy import stats as scipy_stats

from lmgeom.errors import InputError, MissingInput

# Universal POS tags of the framework -> WordNet's parts of speech
WORDNET_POS = {"NOUN": "n", "VERB": "v", "ADJ": "a", "ADV": "r"}
_WORDNET_FILES = {"n": "noun", "v": "verb", "a": "adj", "r": "adv"}
# ss_type letter -> the number a sense key writes for it
_SS_TYPE_NUMBER = {"n": 1, "v": 2, "a": 3, "r": 4, "s": 5}
DEFAULT_WORDNET_DIRS = ("/usr/share/wordnet",)  # where Debian's wordnet-base installs WordNet 3.0


@dataclass(frozen=True)
class Instance:
    """One tagged token: its id, gold lemma and POS, and where it is (sentence, word position)."""

    id: str
    lemma: str
    pos: str
    sentence: int
    position: int

    @property
    def lemma_key(self) -> tuple[str, str]:
        return (self.lemma.lower(), self.pos)


@dataclass
class WSDDataset:
    """A framework dataset: its sentences (lists of words), instances in document order, gold keys."""

    name: str
    sentences: list[list[str]]
    instances: list[Instance]
    gold: dict[str, frozenset[str]]


def read_wsd_dataset(directory: str | os.PathLike[str], name: str | None = None) -> WSDDataset:
    """Read `<directory>/<name>.data.xml` and `<name>.gold.key.txt` (`name` defaults to the folder's
    name, e.g. `Evaluation_Datasets/senseval2`). Every instance must have a gold line and the reverse."""
    folder = Path(directory)
    name = name or folder.name
    xml_path, gold_path = folder / f"{name}.data.xml", folder / f"{name}.gold.key.txt"
    for path in (xml_path, gold_path):
        if not path.is_file():
            raise MissingInput(f"`directory` {str(folder)!r} has no {path.name}: give a folder of the WSD evaluation "
                               "framework (Evaluation_Datasets/<name>)", param="directory")
    sentences: list[list[str]] = []
    instances: list[Instance] = []
    try:
        root = ElementTree.parse(xml_path).getroot()  # expat's own limits guard against entity expansion
    except ElementTree.ParseError as error:
        raise InputError(f"{xml_path} is not well-formed XML ({error})", param="directory") from None
    for sentence in root.iter("sentence"):
        words: list[str] = []
        for token in sentence:
            if token.tag not in ("wf", "instance"):
                continue
            text = (token.text or "").strip()
            if not text:
                raise InputError(f"{xml_path}: an empty <{token.tag}> in sentence {sentence.get('id')}", param="directory")
            if token.tag == "instance":
                instances.append(Instance(id=token.get("id", ""), lemma=token.get("lemma", ""), pos=token.get("pos", ""),
                                          sentence=len(sentences), position=len(words)))
            words.append(text)
        sentences.append(words)
    gold: dict[str, frozenset[str]] = {}
    for number, line in enumerate(gold_path.read_text(encoding="utf-8").splitlines(), start=1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) < 2:
            raise InputError(f"{gold_path}, line {number}: expected an instance id and at least one sense key, got {line!r}",
                             param="directory")
        gold[parts[0]] = frozenset(parts[1:])
    ids = {instance.id for instance in instances}
    missing, extra = ids - set(gold), set(gold) - ids
    if missing or extra:
        example = sorted(missing or extra)[0]
        raise InputError(f"{name}: {len(missing)} instances have no gold key and {len(extra)} gold keys no instance "
                         f"(e.g. {example!r})", param="directory")
    return WSDDataset(name, sentences, instances, gold)


# ---- sense vectors -----------------------------------------------------------------------------
@dataclass
class SenseVectors:
    """Mean vectors of senses, grouped by the (lemma, POS) of the occurrences that built them."""

    keys: list[str]
    vectors: np.ndarray  # (n_senses, dim) float64, the means (not normalised)
    counts: np.ndarray  # (n_senses,) occurrences behind each mean
    by_lemma: dict[tuple[str, str], list[int]] = field(default_factory=dict)

    @classmethod
    def fit(cls, vectors: np.ndarray, instances: Sequence[Instance], gold: Mapping[str, Iterable[str]]) -> SenseVectors:
        """`vectors[i]` is the vector of `instances[i]`; each gold key of an instance gets its vector."""
        vectors = np.asarray(vectors, dtype=np.float64)
        if len(vectors) != len(instances):
            raise InputError(f"`vectors` has {len(vectors)} rows for {len(instances)} instances", param="vectors")
        index: dict[str, int] = {}
        sums: list[np.ndarray] = []
        counts: list[int] = []
        by_lemma: dict[tuple[str, str], list[int]] = defaultdict(list)
        for row, instance in zip(vectors, instances):
            for key in sorted(gold[instance.id]):
                if key not in index:
                    index[key] = len(sums)
                    sums.append(np.zeros_like(row))
                    counts.append(0)
                    by_lemma[instance.lemma_key].append(index[key])
                elif index[key] not in by_lemma[instance.lemma_key]:
                    by_lemma[instance.lemma_key].append(index[key])
                sums[index[key]] += row
                counts[index[key]] += 1
        dim = vectors.shape[1] if vectors.ndim == 2 else 0
        total = np.array(sums).reshape(len(sums), dim)
        count = np.array(counts, dtype=np.int64)
        return cls(list(index), total / np.maximum(count, 1)[:, None], count, dict(by_lemma))

    def covers(self, instance: Instance) -> bool:
        return instance.lemma_key in self.by_lemma

    def predict(self, vectors: np.ndarray, instances: Sequence[Instance]) -> list[str | None]:
        """The nearest sense (cosine) of each instance's lemma and POS; None where the lemma has none."""
        vectors = np.asarray(vectors, dtype=np.float64)
        unit = self.vectors / np.maximum(np.linalg.norm(self.vectors, axis=1, keepdims=True), 1e-300)
        answers: list[str | None] = []
        for row, instance in zip(vectors, instances):
            candidates = self.by_lemma.get(instance.lemma_key)
            if not candidates:
                answers.append(None)
                continue
            cosines = unit[candidates] @ (row / max(float(np.linalg.norm(row)), 1e-300))
            answers.append(self.keys[candidates[int(np.argmax(cosines))]])  # ties: the first sense seen
        return answers

    def most_frequent(self, instances: Sequence[Instance]) -> list[str | None]:
        """The sense of each instance's lemma and POS with the most training occurrences (a baseline
        that uses no vectors); None where the lemma has none."""
        answers: list[str | None] = []
        for instance in instances:
            candidates = self.by_lemma.get(instance.lemma_key)
            answers.append(None if not candidates else self.keys[max(candidates, key=lambda j: self.counts[j])])
        return answers


# ---- WordNet's first sense ---------------------------------------------------------------------
class FirstSense:
    """WordNet 3.0's first (most frequent) sense key of a lemma and POS, from its database files."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._first: dict[str, dict[str, int]] = {}  # wordnet pos -> lemma -> offset of its first synset
        self._data: dict[str, bytes] = {}
        for pos, stem in _WORDNET_FILES.items():
            first: dict[str, int] = {}
            for line in (directory / f"index.{stem}").read_text(encoding="utf-8").splitlines():
                if not line or line.startswith(" "):  # the licence header
                    continue
                fields = line.split()
                synset_count, pointer_count = int(fields[2]), int(fields[3])
                offsets = fields[4 + pointer_count + 2:]
                if len(offsets) != synset_count:
                    raise InputError(f"{directory / f'index.{stem}'}: a line with {len(offsets)} synsets where it says "
                                     f"{synset_count}: {line[:60]!r}", param="wordnet")
                first[fields[0]] = int(offsets[0])
            self._first[pos] = first
            self._data[pos] = (directory / f"data.{stem}").read_bytes()

    @classmethod
    def load(cls, directory: str | os.PathLike[str] | None = None) -> FirstSense:
        """From `directory`, else $WNSEARCHDIR (WordNet's own variable), else Debian's location."""
        candidates = [Path(directory)] if directory else \
            [Path(p) for p in ([os.environ["WNSEARCHDIR"]] if os.environ.get("WNSEARCHDIR") else []) + list(DEFAULT_WORDNET_DIRS)]
        for folder in candidates:
            if all((folder / f"{kind}.{stem}").is_file() for stem in _WORDNET_FILES.values() for kind in ("index", "data")):
                return cls(folder)
        raise MissingInput(
            "WordNet 3.0's database files (index.noun, data.noun, ... for noun, verb, adj, adv) were not found in "
            + ", ".join(str(c) for c in candidates) + ": the first-sense back-off needs them. Install them with "
            "`apt-get install wordnet-base` (Debian, Ubuntu) or give their folder as `wordnet`", param="wordnet")

    def _synset(self, pos: str, offset: int) -> list[str]:
        data = self._data[pos]
        end = data.index(b"\n", offset)
        return data[offset:end].decode("utf-8").split()

    @staticmethod
    def _words(fields: list[str]) -> list[tuple[str, int]]:
        count = int(fields[3], 16)
        words = []
        for i in range(count):
            word, lex_id = fields[4 + 2 * i], int(fields[5 + 2 * i], 16)
            if word.endswith(")") and "(" in word:  # adjective markers: (a), (p), (ip)
                word = word[: word.index("(")]
            words.append((word.lower(), lex_id))
        return words

    def key(self, lemma: str, pos: str) -> str | None:
        """The sense key of `lemma` (any case, spaces or underscores) in its first synset of `pos`
        (a Universal tag NOUN, VERB, ADJ, ADV or WordNet's n, v, a, r); None if WordNet lacks it."""
        wn_pos = WORDNET_POS.get(pos, pos)
        if wn_pos not in self._first:
            return None
        lemma = lemma.lower().replace(" ", "_")
        offset = self._first[wn_pos].get(lemma)
        if offset is None:
            return None
        fields = self._synset(wn_pos, offset)
        lex_filenum, ss_type = int(fields[1]), fields[2]
        lex_id = next((i for w, i in self._words(fields) if w == lemma), None)
        if lex_id is None:
            return None
        head = ""
        if ss_type == "s":  # a satellite names the first word of its head synset (the '&' pointer)
            count = int(fields[3], 16)
            pointer_start = 4 + 2 * count
            for j in range(int(fields[pointer_start])):
                symbol, target, target_pos = fields[pointer_start + 1 + 4 * j: pointer_start + 4 + 4 * j]
                if symbol == "&" and target_pos == "a":
                    head_word, head_id = self._words(self._synset("a", int(target)))[0]
                    head = f"{head_word}:{head_id:02d}"
                    break
        return f"{lemma}%{_SS_TYPE_NUMBER[ss_type]}:{lex_filenum:02d}:{lex_id:02d}:{head or ':'}"


# ---- scoring -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Score:
    precision: float
    recall: float
    f1: float
    answered: int
    instances: int


def score(answers: Mapping[str, Sequence[str] | str | None], gold: Mapping[str, Iterable[str]]) -> Score:
    """Raganato et al.'s scorer: `answers` maps instance ids to a key, a list of keys or None (not
    answered); ids not in `gold` are ignored."""
    earned, answered = 0.0, 0
    for instance, answer in answers.items():
        if instance not in gold or answer is None:
            continue
        keys = [answer] if isinstance(answer, str) else list(answer)
        if not keys:
            continue
        answered += 1
        earned += sum(key in set(gold[instance]) for key in keys) / len(keys)
    precision = earned / answered if answered else 0.0
    recall = earned / len(gold) if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return Score(precision, recall, f1, answered, len(gold))


def correct(answers: Sequence[str | None], gold_keys: Sequence[Iterable[str]]) -> np.ndarray:
    """Per instance: does its one answer lie in its gold set (an unanswered instance is wrong)."""
    return np.array([a is not None and a in set(g) for a, g in zip(answers, gold_keys)], dtype=bool)


@dataclass(frozen=True)
class McNemar:
    n: int
    only_first: int
    only_second: int
    p_value: float


def mcnemar_exact(first: np.ndarray, second: np.ndarray) -> McNemar:
    """Exact McNemar test of two systems' per-instance correctness: two-sided binomial test of the
    instances only the first gets right among those exactly one gets right (p 1 when there are none)."""
    first, second = np.asarray(first, dtype=bool), np.asarray(second, dtype=bool)
    if first.shape != second.shape:
        raise InputError(f"`first` has {first.shape} and `second` {second.shape}: give one flag per instance to both",
                         param=("first", "second"))
    b, c = int(np.sum(first & ~second)), int(np.sum(~first & second))
    p = 1.0 if b + c == 0 else float(scipy_stats.binomtest(b, b + c, 0.5).pvalue)
    return McNemar(len(first), b, c, min(1.0, p) if not math.isnan(p) else 1.0)
