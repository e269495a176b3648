"""Downstream tasks read from local files, and their metrics (pure: file paths in, data out).

Sentence tasks (GLUE, as shipped in `../shared/data/GLUE`, see its SOURCES.md):
- `cola`: train `in_domain_train.tsv`; evaluated on the 527 in-domain dev sentences (`dev`) and,
  separately, the 516 out-of-domain ones (`dev_out_of_domain`); Matthews correlation.
- `sst2`: `train.tsv` / `dev.tsv` (header `sentence<TAB>label`); accuracy.
- `mrpc`: `train.tsv` / `dev.tsv`, and the labelled test file `msr_paraphrase_test.txt` (`test`);
  F1 of the paraphrase class and accuracy.
- `rte`: the GLUE/HF export `glue_hf_export/{train,dev}.tsv` (csv-quoted, label 0 = entailment),
  else the SuperGLUE `superglue_jsonl/{train,val}.jsonl`; accuracy.
- `stsb`: GLUE `train.tsv` / `dev.tsv` (score in the last column); Pearson and Spearman.
- `sicke`: SICK's entailment labels (SICK-E, SemEval-2014 Task 1; three classes: entailment,
  neutral, contradiction) from the full release `SICK.txt` (`../shared/data/SICK`): trained on
  SemEval_set TRAIN (4,439 pairs), evaluated on TRIAL (`dev`, 495) and TEST (`test`, 4,906); accuracy.

Tagging tasks (one tag per word):
- `pos`: universal POS tags of UD English-EWT. Only dev and test are shipped, so the tagger is
  trained on `en_ewt-ud-dev.conllu` and evaluated on `en_ewt-ud-test.conllu`. The words are UD's
  syntactic words: a multiword token such as "don't" (range row 1-2) counts as its word rows
  "do" + "n't", as UD splits it; the range rows and the empty nodes (8.1) are left out.
- `brown`: Brown tags reduced to their base tag (`base_brown_tag`); the test set is the held-out
  Brown files the caller names (lmgeom's ELMo split, `lmgeom.corpus.splits.brown_heldout_files`),
  the training set is every other file.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Collection, Literal, Sequence, TypeVar, Union

import numpy as np
import numpy.typing as npt
from scipy import stats

from lmgeom.errors import InputError, MissingInput

TextInput = Union[str, tuple[str, str]]

# The split that a task's metric is first reported on, and its metrics in GLUE's order.
TASK_METRICS: dict[str, tuple[str, ...]] = {
    "cola": ("matthews",),
    "sst2": ("accuracy",),
    "mrpc": ("f1", "accuracy"),
    "rte": ("accuracy",),
    "stsb": ("pearson", "spearman"),
    "sicke": ("accuracy",),
    "pos": ("accuracy",),
    "brown": ("accuracy",),
}
SENTENCE_TASKS = ("cola", "sst2", "mrpc", "rte", "stsb", "sicke")
TAGGING_TASKS = ("pos", "brown")
TASKS = SENTENCE_TASKS + TAGGING_TASKS


@dataclass
class SentenceSplit:
    """Inputs (a sentence, or a (sentence1, sentence2) pair) and their labels (ints, or floats for regression)."""

    inputs: list[TextInput]
    labels: np.ndarray


@dataclass
class TaggedSplit:
    """Sentences as their words, with one tag per word."""

    sentences: list[list[str]]
    tags: list[list[str]]

    @property
    def n_tokens(self) -> int:
        return sum(len(words) for words in self.sentences)


@dataclass
class SentenceTask:
    name: str
    kind: str  # "classification" or "regression"
    pairs: bool
    splits: dict[str, SentenceSplit]
    metrics: tuple[str, ...]
    classes: list[str] = field(default_factory=list)  # what each integer label means
    train_split: str = "train"

    @property
    def eval_splits(self) -> list[str]:
        return [name for name in self.splits if name != self.train_split]


@dataclass
class TaggingTask:
    name: str
    splits: dict[str, TaggedSplit]
    tagset: list[str]
    metrics: tuple[str, ...] = ("accuracy",)
    train_split: str = "train"
    note: str = ""

    @property
    def eval_splits(self) -> list[str]:
        return [name for name in self.splits if name != self.train_split]


Task = Union[SentenceTask, TaggingTask]


# ---- GLUE ------------------------------------------------------------------------------------


def _need(directory: Path, names: Sequence[str], task: str) -> list[Path]:
    paths = [directory / name for name in names]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise MissingInput(
            f"{directory} is not a {task} folder in the layout lmgeom reads: missing {', '.join(missing)}; "
            f"point `data` at the folder with {', '.join(names)} (see docs/experiments.md)", param="data"
        )
    return paths


def _tsv_rows(path: Path, *, header: bool, quoting: Literal[0, 1, 2, 3] = csv.QUOTE_NONE) -> list[list[str]]:
    with path.open(encoding="utf-8-sig", newline="") as handle:
        rows = [row for row in csv.reader(handle, delimiter="\t", quoting=quoting) if row]
    return rows[1:] if header else rows


def _column(rows: list[list[str]], index: int, path: Path) -> list[str]:
    short = [i for i, row in enumerate(rows) if len(row) <= index]
    if short:
        raise InputError(f"{path}: row {short[0] + 1} has {len(rows[short[0]])} fields, expected more than {index}")
    return [row[index] for row in rows]


def _int_labels(values: list[str], path: Path) -> np.ndarray:
    try:
        return np.array([int(v) for v in values], dtype=np.int64)
    except ValueError as error:
        raise InputError(f"{path}: a label is not an integer ({error})") from None


def read_cola(directory: str | os.PathLike[str]) -> SentenceTask:
    directory = Path(directory)
    paths = _need(directory, ["in_domain_train.tsv", "in_domain_dev.tsv", "out_of_domain_dev.tsv"], "CoLA")
    splits = {}
    for name, path in zip(("train", "dev", "dev_out_of_domain"), paths):
        rows = _tsv_rows(path, header=False)
        splits[name] = SentenceSplit(list(_column(rows, 3, path)), _int_labels(_column(rows, 1, path), path))
    return _checked(SentenceTask("cola", "classification", False, splits, TASK_METRICS["cola"], ["unacceptable", "acceptable"]))


def read_sst2(directory: str | os.PathLike[str]) -> SentenceTask:
    directory = Path(directory)
    paths = _need(directory, ["train.tsv", "dev.tsv"], "SST-2")
    splits = {}
    for name, path in zip(("train", "dev"), paths):
        rows = _tsv_rows(path, header=True)
        splits[name] = SentenceSplit([s.strip() for s in _column(rows, 0, path)], _int_labels(_column(rows, 1, path), path))
    return _checked(SentenceTask("sst2", "classification", False, splits, TASK_METRICS["sst2"], ["negative", "positive"]))


def read_mrpc(directory: str | os.PathLike[str]) -> SentenceTask:
    directory = Path(directory)
    paths = _need(directory, ["train.tsv", "dev.tsv", "msr_paraphrase_test.txt"], "MRPC")
    splits = {}
    for name, path in zip(("train", "dev", "test"), paths):
        rows = _tsv_rows(path, header=True)
        pairs = list(zip(_column(rows, 3, path), _column(rows, 4, path)))
        splits[name] = SentenceSplit(pairs, _int_labels(_column(rows, 0, path), path))  # type: ignore[arg-type]
    return _checked(SentenceTask("mrpc", "classification", True, splits, TASK_METRICS["mrpc"], ["not_paraphrase", "paraphrase"]))


RTE_CLASSES = ["entailment", "not_entailment"]


def read_rte(directory: str | os.PathLike[str]) -> SentenceTask:
    directory = Path(directory)
    splits = {}
    if (directory / "glue_hf_export").is_dir():
        paths = _need(directory / "glue_hf_export", ["train.tsv", "dev.tsv"], "RTE (GLUE/HF export)")
        for name, path in zip(("train", "dev"), paths):
            rows = _tsv_rows(path, header=True, quoting=csv.QUOTE_MINIMAL)
            pairs = list(zip(_column(rows, 0, path), _column(rows, 1, path)))
            splits[name] = SentenceSplit(pairs, _int_labels(_column(rows, 2, path), path))  # type: ignore[arg-type]
    elif (directory / "superglue_jsonl").is_dir():
        paths = _need(directory / "superglue_jsonl", ["train.jsonl", "val.jsonl"], "RTE (SuperGLUE jsonl)")
        for name, path in zip(("train", "dev"), paths):
            records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
            unknown = sorted({r["label"] for r in records} - set(RTE_CLASSES))
            if unknown:
                raise InputError(f"{path}: unknown RTE labels {unknown}; expected {RTE_CLASSES}")
            splits[name] = SentenceSplit([(r["premise"], r["hypothesis"]) for r in records],
                                         np.array([RTE_CLASSES.index(r["label"]) for r in records], dtype=np.int64))
    else:
        raise MissingInput(f"{directory} is not an RTE folder lmgeom reads: it needs glue_hf_export/ (train.tsv, "
                           "dev.tsv) or superglue_jsonl/ (train.jsonl, val.jsonl); pass `data='GLUE/RTE'`", param="data")
    return _checked(SentenceTask("rte", "classification", True, splits, TASK_METRICS["rte"], RTE_CLASSES))


def read_stsb_task(directory: str | os.PathLike[str]) -> SentenceTask:
    directory = Path(directory)
    paths = _need(directory, ["train.tsv", "dev.tsv"], "STS-B (GLUE)")
    splits = {}
    for name, path in zip(("train", "dev"), paths):
        rows = _tsv_rows(path, header=True)
        pairs = list(zip(_column(rows, 7, path), _column(rows, 8, path)))
        try:
            scores = np.array([float(row[-1]) for row in rows])
        except ValueError as error:
            raise InputError(f"{path}: a score is not a number ({error})") from None
        splits[name] = SentenceSplit(pairs, scores)  # type: ignore[arg-type]
    return _checked(SentenceTask("stsb", "regression", True, splits, TASK_METRICS["stsb"]))


SICK_ENTAILMENT_CLASSES = ["entailment", "neutral", "contradiction"]
SICK_ENTAILMENT_SPLITS = {"train": "TRAIN", "dev": "TRIAL", "test": "TEST"}  # lmgeom's split: SemEval_set


def read_sick_entailment(directory: str | os.PathLike[str]) -> SentenceTask:
    """SICK-E: the entailment label of each SICK pair (sentence_A, sentence_B), split by SemEval_set."""
    directory = Path(directory)
    (path,) = _need(directory, ["SICK.txt"], "SICK")
    lines = path.read_text(encoding="utf-8").splitlines()  # splitlines drops the CR of CRLF
    rows = list(csv.DictReader(lines, delimiter="\t", quoting=csv.QUOTE_NONE))
    missing = {"sentence_A", "sentence_B", "entailment_label", "SemEval_set"} - set(rows[0] if rows else ())
    if missing:
        raise InputError(f"{path} lacks the column(s) {sorted(missing)}; expected the full SICK release with a header line",
                         param="data")
    unknown = sorted({r["entailment_label"] for r in rows} - {c.upper() for c in SICK_ENTAILMENT_CLASSES})
    if unknown:
        raise InputError(f"{path}: unknown entailment labels {unknown}; expected "
                         f"{[c.upper() for c in SICK_ENTAILMENT_CLASSES]}", param="data")
    splits = {}
    for name, semeval_set in SICK_ENTAILMENT_SPLITS.items():
        chosen = [r for r in rows if r["SemEval_set"] == semeval_set]
        splits[name] = SentenceSplit(
            [(r["sentence_A"], r["sentence_B"]) for r in chosen],
            np.array([SICK_ENTAILMENT_CLASSES.index(r["entailment_label"].lower()) for r in chosen], dtype=np.int64))
    return _checked(SentenceTask("sicke", "classification", True, splits, TASK_METRICS["sicke"], SICK_ENTAILMENT_CLASSES))


# ---- tagging ---------------------------------------------------------------------------------


def read_conllu_upos(path: str | os.PathLike[str]) -> TaggedSplit:
    """Words and universal POS tags of a .conllu file: the word rows (integer ids); multiword-token
    range rows (1-2) and empty nodes (8.1) are left out, so a contraction counts as UD's split words."""
    path = Path(path)
    sentences: list[list[str]] = []
    tags: list[list[str]] = []
    words: list[str] = []
    upos: list[str] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            if words:
                sentences.append(words)
                tags.append(upos)
                words, upos = [], []
            continue
        if line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) != 10:
            raise InputError(f"{path}:{number}: a CoNLL-U row has 10 tab-separated fields, this one has {len(fields)}")
        if fields[0].isdigit():
            words.append(fields[1])
            upos.append(fields[3])
    if words:
        sentences.append(words)
        tags.append(upos)
    return TaggedSplit(sentences, tags)


def read_ud_pos(directory: str | os.PathLike[str]) -> TaggingTask:
    """UD English-EWT universal POS: trained on dev, evaluated on test (the train file is not shipped)."""
    directory = Path(directory)
    dev, test = _need(directory, ["en_ewt-ud-dev.conllu", "en_ewt-ud-test.conllu"], "UD English-EWT")
    splits = {"train": read_conllu_upos(dev), "test": read_conllu_upos(test)}
    tagset = sorted({tag for tags in splits["train"].tags for tag in tags})
    return _checked(TaggingTask("pos", splits, tagset, note="UD English-EWT: trained on en_ewt-ud-dev, evaluated on en_ewt-ud-test"))


_BROWN_PUNCTUATION = set("()*,--.:'`$")


def base_brown_tag(tag: str) -> str:
    """A Brown tag without its modifiers: -tl (title), -hl (headline), -nc (cited), fw- (foreign
    word) and the trailing * (negation) and $ (possessive); np-tl -> np, np$ -> np, dod* -> dod,
    fw-in -> in. A contraction's compound tag keeps its first part (ppss+bem -> ppss), so the test
    files hold no tag the training files lack. Punctuation tags ("--", "*", "'", "(") are kept."""
    tag = tag.lower()
    if "+" in tag and not set(tag) <= _BROWN_PUNCTUATION:
        tag = tag.split("+")[0]
    if set(tag) <= _BROWN_PUNCTUATION:
        return tag
    parts = [part for part in tag.split("-") if part not in ("tl", "hl", "nc", "fw")]
    base = "-".join(parts) if parts else tag
    stripped = base.rstrip("*$")
    return stripped or base


def read_brown_file(path: str | os.PathLike[str]) -> TaggedSplit:
    """One NLTK-format Brown file (lines of `word/tag`), tags reduced by `base_brown_tag`."""
    path = Path(path)
    sentences, tags = [], []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        tokens = line.split()
        if not tokens:
            continue
        pairs = [token.rsplit("/", 1) for token in tokens]
        bad = [token for token, pair in zip(tokens, pairs) if len(pair) != 2]
        if bad:
            raise InputError(f"{path}:{number}: token {bad[0]!r} is not word/tag")
        sentences.append([word for word, _ in pairs])
        tags.append([base_brown_tag(tag) for _, tag in pairs])
    return TaggedSplit(sentences, tags)


def read_brown_tags(directory: str | os.PathLike[str], *, test_files: Collection[str]) -> TaggingTask:
    """Brown base tags: `test_files` (file names such as "ca10") are the test split, all other files
    of cats.txt the training split."""
    directory = Path(directory)
    (cats,) = _need(directory, ["cats.txt"], "Brown (NLTK format)")
    names = [line.split()[0] for line in cats.read_text(encoding="utf-8").splitlines() if line.strip()]
    unknown = sorted(set(test_files) - set(names))
    if unknown:
        raise InputError(f"test files {unknown[:5]} are not Brown files listed in {cats}")
    splits = {"train": TaggedSplit([], []), "test": TaggedSplit([], [])}
    for name in names:
        part = read_brown_file(directory / name)
        target = splits["test" if name in test_files else "train"]
        target.sentences.extend(part.sentences)
        target.tags.extend(part.tags)
    tagset = sorted({tag for tags in splits["train"].tags for tag in tags})
    return _checked(TaggingTask("brown", splits, tagset, note=f"Brown base tags; test = {len(test_files)} held-out files"))


# ---- checks ----------------------------------------------------------------------------------


TaskT = TypeVar("TaskT", SentenceTask, TaggingTask)


def _checked(task: TaskT) -> TaskT:
    """Refuse empty splits and evaluation labels the training split never shows."""
    for name, split in task.splits.items():
        size = len(split.inputs) if isinstance(split, SentenceSplit) else split.n_tokens
        if size == 0:
            raise InputError(f"task {task.name}: split {name!r} is empty; check the files under `data`", param="data")
    if isinstance(task, SentenceTask):
        if task.kind == "classification":
            seen = set(task.splits[task.train_split].labels.tolist())
            for name in task.eval_splits:
                unseen = sorted(set(task.splits[name].labels.tolist()) - seen)
                if unseen:
                    raise InputError(f"task {task.name}: labels {unseen} of split {name!r} never occur in the training split; "
                                     "a classifier cannot predict them (check the files under `data`)", param="data")
    else:
        seen_tags = set(task.tagset)
        for name in task.eval_splits:
            unseen_tags = sorted({t for tags in task.splits[name].tags for t in tags} - seen_tags)
            if unseen_tags:
                raise InputError(f"task {task.name}: tags {unseen_tags[:8]} of split {name!r} never occur in the training "
                                 "split; a tagger cannot predict them (check the files under `data`)", param="data")
    return task


# ---- metrics ---------------------------------------------------------------------------------


# The metrics run thousands of times in a paired test, so they are computed from a confusion matrix
# (numpy) rather than through scikit-learn's input validation; tests check them against scikit-learn.


def _confusion(y_true: np.ndarray, y_pred: np.ndarray) -> np.ndarray:
    y_true = np.asarray(y_true, dtype=np.int64)
    y_pred = np.asarray(y_pred, dtype=np.int64)
    k = int(max(y_true.max(initial=0), y_pred.max(initial=0))) + 1
    return np.bincount(y_true * k + y_pred, minlength=k * k).reshape(k, k).astype(np.float64)


def matthews(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Matthews correlation (Gorodkin's multi-class form, scikit-learn's): 0 when undefined."""
    confusion = _confusion(y_true, y_pred)
    true_sum, pred_sum = confusion.sum(axis=1), confusion.sum(axis=0)
    correct, samples = np.trace(confusion), confusion.sum()
    cov_tp = correct * samples - pred_sum @ true_sum
    cov_pp = samples**2 - pred_sum @ pred_sum
    cov_tt = samples**2 - true_sum @ true_sum
    denominator = cov_tt * cov_pp
    return float(cov_tp / np.sqrt(denominator)) if denominator > 0 else 0.0


def accuracy(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    return float(np.mean(np.asarray(y_true) == np.asarray(y_pred)))


def f1(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """F1 of the positive class (1), GLUE's MRPC F1; 0 when there is no positive label or prediction."""
    truth, guess = np.asarray(y_true) == 1, np.asarray(y_pred) == 1
    true_positive = float(np.sum(truth & guess))
    denominator = float(truth.sum() + guess.sum())
    return 2 * true_positive / denominator if denominator else 0.0


def pearson(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    if np.ptp(y_pred) == 0:
        return float("nan")
    return float(stats.pearsonr(y_true, y_pred).statistic)


def spearman(x: npt.ArrayLike, y: npt.ArrayLike) -> float:
    """Spearman's rho (average ranks for ties, Pearson of the ranks, as scipy's); nan when a side is
    constant or there are fewer than 2 values."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(a) < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    ranks_a, ranks_b = stats.rankdata(a), stats.rankdata(b)
    ranks_a, ranks_b = ranks_a - ranks_a.mean(), ranks_b - ranks_b.mean()
    return float(ranks_a @ ranks_b / np.sqrt(float(ranks_a @ ranks_a) * float(ranks_b @ ranks_b)))


METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "matthews": matthews, "accuracy": accuracy, "f1": f1, "pearson": pearson, "spearman": spearman,
}


def score(task: Task, y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float]:
    """Every metric of `task` for the predictions."""
    if len(y_true) != len(y_pred):
        raise ValueError(f"{len(y_pred)} predictions for {len(y_true)} labels")
    return {name: METRICS[name](np.asarray(y_true), np.asarray(y_pred)) for name in task.metrics}


def load_task(name: str, directory: str | os.PathLike[str], *, brown_test_files: Collection[str] = ()) -> Task:
    """The task `name` (one of TASKS) from its folder; `brown` needs `brown_test_files`."""
    readers: dict[str, Callable[[str | os.PathLike[str]], Task]] = {
        "cola": read_cola, "sst2": read_sst2, "mrpc": read_mrpc, "rte": read_rte, "stsb": read_stsb_task,
        "sicke": read_sick_entailment, "pos": read_ud_pos,
    }
    key = name.lower().replace("-", "")
    if key == "brown":
        if not brown_test_files:
            raise InputError("the brown task needs its held-out test files (lmgeom.corpus.splits.brown_heldout_files)")
        return read_brown_tags(directory, test_files=brown_test_files)
    if key not in readers:
        raise InputError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")
    return readers[key](directory)
