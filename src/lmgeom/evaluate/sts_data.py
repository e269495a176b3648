"""Readers for sentence-similarity benchmarks: STS Benchmark, SemEval STS 2012-2016, SICK.

Every reader returns an `STSDataset`: parallel lists of sentence pairs, gold scores, and the subset
each pair belongs to (the SemEval years have several; STS-B and SICK-R have one, named after the set).
"""

from __future__ import annotations

import csv
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lmgeom.errors import InputError

SEMEVAL_YEARS = (2012, 2013, 2014, 2015, 2016)
STSB_SPLITS = ("train", "dev", "test")
# SICK's SemEval_set column; "dev" is accepted for TRIAL so one --split value serves STS-B and SICK.
SICK_SPLITS = {"train": "TRAIN", "trial": "TRIAL", "dev": "TRIAL", "test": "TEST"}
# Where `find_datasets` looks, relative to the data folder (first match wins for each set).
STSB_FOLDERS = ("stsbenchmark", ".")
# The raw SemEval text comes before SentEval's tokenized, lowercased copy: models read natural text.
SEMEVAL_FOLDERS = ("STS_raw", "STS", ".")
SICK_FILES = ("SICK/SICK.txt", "SICK.txt")
# STS12 ships an aggregate gold file (STS.gs.ALL.txt) that is not a subset.
_AGGREGATE_SUBSET = re.compile(r"^all$", re.IGNORECASE)


@dataclass(frozen=True)
class STSDataset:
    """Sentence pairs with gold similarity scores; `subsets[i]` names the subset of pair i."""

    name: str
    split: str
    subsets: list[str]
    sentences1: list[str]
    sentences2: list[str]
    scores: np.ndarray
    source: str = ""

    def __post_init__(self) -> None:
        lengths = {len(self.subsets), len(self.sentences1), len(self.sentences2), len(self.scores)}
        if len(lengths) != 1:
            raise InputError(f"{self.name} {self.split}: subsets, sentences1, sentences2 and scores must have one entry per pair")
        if not self.scores.size:
            raise InputError(f"{self.name} {self.split} has no scored pairs ({self.source or 'no source'})")

    def __len__(self) -> int:
        return len(self.scores)

    @property
    def subset_names(self) -> list[str]:
        """Distinct subsets in order of first appearance."""
        return list(dict.fromkeys(self.subsets))

    @property
    def sentences(self) -> list[str]:
        """Distinct sentences of both sides, in order of first appearance."""
        return list(dict.fromkeys(self.sentences1 + self.sentences2))

    def sample(self, n_pairs: int, *, seed: int = 0) -> "STSDataset":
        """`n_pairs` pairs drawn uniformly without replacement (seeded), kept in file order."""
        if n_pairs < 1:
            raise InputError(f"a pair sample needs n_pairs >= 1, got {n_pairs}")
        if n_pairs >= len(self):
            return self
        keep = np.sort(np.random.default_rng(seed).choice(len(self), size=n_pairs, replace=False))
        return STSDataset(
            self.name, self.split, [self.subsets[i] for i in keep], [self.sentences1[i] for i in keep],
            [self.sentences2[i] for i in keep], self.scores[keep], self.source,
        )


def _require_file(path: Path, what: str) -> None:
    if not path.is_file():
        raise FileNotFoundError(f"{what}: {path} does not exist")


def read_stsb(path: str | os.PathLike, split: str = "test") -> STSDataset:
    """STS Benchmark `sts-<split>.csv` from its folder (or the csv itself): tab-separated genre, file,
    year, id, score (0-5), sentence1, sentence2, sometimes 2 more columns. Read without csv quoting,
    since sentences contain unbalanced double quotes."""
    if split not in STSB_SPLITS:
        raise InputError(f"STS-B split must be one of {STSB_SPLITS}, got {split!r}")
    path = Path(path)
    file = path if path.is_file() else path / f"sts-{split}.csv"
    _require_file(file, "STS Benchmark")
    sentences1, sentences2, scores = [], [], []
    with file.open(encoding="utf-8", newline="") as handle:
        for line_number, row in enumerate(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE), start=1):
            if len(row) < 7:
                raise InputError(f"{file}:{line_number}: expected at least 7 tab-separated fields (genre ... sentence2), got {len(row)}")
            scores.append(float(row[4]))
            sentences1.append(row[5])
            sentences2.append(row[6])
    return STSDataset("STS-B", split, ["STS-B"] * len(scores), sentences1, sentences2, np.array(scores), str(file))


def semeval_subsets(folder: str | os.PathLike) -> list[str]:
    """Subsets of one SemEval year folder that have both `STS.input.<subset>.txt` and
    `STS.gs.<subset>.txt`, sorted; aggregate gold files such as `STS.gs.ALL.txt` are not subsets."""
    folder = Path(folder)
    inputs = {p.name[len("STS.input.") : -len(".txt")] for p in folder.glob("STS.input.*.txt")}
    gold = {p.name[len("STS.gs.") : -len(".txt")] for p in folder.glob("STS.gs.*.txt")}
    return sorted(s for s in inputs & gold if not _AGGREGATE_SUBSET.match(s))


def semeval_folder(directory: str | os.PathLike, year: int) -> Path:
    return Path(directory) / f"STS{year % 100:02d}-en-test"


def read_semeval_sts(directory: str | os.PathLike, year: int) -> STSDataset:
    """One SemEval STS year (2012-2016) from a folder holding `STS1X-en-test/` (or that year folder
    itself). A blank gold line marks a pair that was not scored; it is dropped, as SentEval does."""
    if year < 100:
        year += 2000
    if year not in SEMEVAL_YEARS:
        raise InputError(f"SemEval STS years are {SEMEVAL_YEARS}, got {year}")
    directory = Path(directory)
    folder = directory if directory.name == semeval_folder(directory, year).name else semeval_folder(directory, year)
    subsets = semeval_subsets(folder) if folder.is_dir() else []
    if not subsets:
        raise FileNotFoundError(f"no STS.input.<subset>.txt with a matching STS.gs.<subset>.txt in {folder}")
    names, sentences1, sentences2, scores = [], [], [], []
    for subset in subsets:
        input_file, gold_file = folder / f"STS.input.{subset}.txt", folder / f"STS.gs.{subset}.txt"
        pairs = input_file.read_text(encoding="utf-8").splitlines()
        gold = gold_file.read_text(encoding="utf-8").splitlines()
        if len(pairs) != len(gold):
            raise InputError(f"{input_file} has {len(pairs)} lines but {gold_file} has {len(gold)}; they must pair up line by line")
        for line_number, (pair, score) in enumerate(zip(pairs, gold), start=1):
            if not score.strip():
                continue
            fields = pair.split("\t")
            if len(fields) < 2:
                raise InputError(f"{input_file}:{line_number}: expected 'sentence1<TAB>sentence2', got {len(fields)} field(s)")
            names.append(subset)
            sentences1.append(fields[0])
            sentences2.append(fields[1])
            scores.append(float(score))
    return STSDataset(f"STS{year % 100}", "test", names, sentences1, sentences2, np.array(scores), str(folder))


def read_sick(path: str | os.PathLike, split: str = "test") -> STSDataset:
    """SICK relatedness (SICK-R) from the full release `SICK.txt` (or its folder): tab-separated with
    a header, CRLF; `split` selects SemEval_set (train, trial or dev, test; "all" keeps every pair)."""
    if split != "all" and split not in SICK_SPLITS:
        raise InputError(f"SICK split must be one of {[*SICK_SPLITS, 'all']}, got {split!r}")
    path = Path(path)
    file = path / "SICK.txt" if path.is_dir() else path
    _require_file(file, "SICK")
    lines = file.read_text(encoding="utf-8").splitlines()  # splitlines drops the CR of CRLF
    rows = list(csv.DictReader(lines, delimiter="\t", quoting=csv.QUOTE_NONE))
    needed = {"sentence_A", "sentence_B", "relatedness_score", "SemEval_set"}
    missing = needed - set(rows[0] if rows else ())
    if missing:
        raise InputError(f"{file} lacks the column(s) {sorted(missing)}; expected the full SICK release with a header line")
    if split != "all":
        rows = [row for row in rows if row["SemEval_set"] == SICK_SPLITS[split]]
    return STSDataset(
        "SICK-R", split, ["SICK-R"] * len(rows), [r["sentence_A"] for r in rows], [r["sentence_B"] for r in rows],
        np.array([float(r["relatedness_score"]) for r in rows]), str(file),
    )


def looked_for() -> str:
    """What `find_datasets` looks for, for error messages."""
    return (
        f"STS Benchmark sts-<split>.csv in {' or '.join(STSB_FOLDERS)}; "
        f"SemEval STS{{12..16}}-en-test/STS.input.<subset>.txt + STS.gs.<subset>.txt in {' or '.join(SEMEVAL_FOLDERS)}; "
        f"SICK in {' or '.join(SICK_FILES)}"
    )


def find_datasets(data_dir: str | os.PathLike, *, split: str = "test") -> list[STSDataset]:
    """Every supported set found in `data_dir`, read for `split`.

    SemEval STS 2012-2016 exist only as test sets, so they are read only when split is "test". Of
    the two SemEval copies in the shared data, `STS_raw/` (original text) is preferred over SentEval's
    tokenized, lowercased `STS/`."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise FileNotFoundError(f"data folder {data_dir} does not exist; give a folder holding any of: {looked_for()}")
    datasets: list[STSDataset] = []
    stsb = next((data_dir / f for f in STSB_FOLDERS if (data_dir / f / f"sts-{split}.csv").is_file()), None)
    if stsb is not None:
        datasets.append(read_stsb(stsb, split))
    if split == "test":
        for year in SEMEVAL_YEARS:
            folder = next(
                (data_dir / f for f in SEMEVAL_FOLDERS if semeval_subsets(semeval_folder(data_dir / f, year))), None
            )
            if folder is not None:
                datasets.append(read_semeval_sts(folder, year))
    sick = next((data_dir / f for f in SICK_FILES if (data_dir / f).is_file()), None)
    if sick is not None and split in SICK_SPLITS:
        datasets.append(read_sick(sick, split))
    if not datasets:
        raise InputError(f"no supported sentence-similarity set for split {split!r} in {data_dir}; looked for {looked_for()}")
    return datasets
