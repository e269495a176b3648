"""Trivial baselines of a task, computed from its training data and scored on an evaluation split,
and the tests of a model's predictions against them.

- majority class (classification): the training split's most frequent label for every example
  (accuracy = that label's share, Matthews 0);
- all positive (binary classification with F1, e.g. MRPC): label 1 for every example;
- most frequent tag (tagging): each word's most frequent training tag, words lowercased; a word the
  training data never shows gets the training split's most frequent tag (NOUN on UD English-EWT).
  Ties go to the tag more frequent in the whole training split, then to the first in sorted order.

A regression task has no trivial baseline here: a constant prediction has no correlation.

Tests (one-sided: does the model beat the baseline?): accuracy by an exact binomial test of the
model's correct count against the baseline's accuracy; Matthews by a label-permutation test (the
evaluation labels shuffled against the predictions, the null of a tagger that ignores its input,
whose Matthews is 0); any other metric (F1) by the paired permutation test of `stats` against the
baseline's predictions, beating it when the difference is positive and p < 0.05.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from scipy import stats as scipy_stats

from lmgeom.evaluate.stats import paired_permutation_test
from lmgeom.evaluate.tasks import METRICS, SentenceTask, TaggingTask, Task, score

MAJORITY_RULE = "the training split's most frequent label for every example (ties: the smallest label)"
ALL_POSITIVE_RULE = "label 1 (the positive class) for every example"
MFT_RULE = ("each word's most frequent training tag, words lowercased; unseen words get the training split's most "
            "frequent tag; ties: the tag more frequent overall, then alphabetical")
ALPHA = 0.05


@dataclass(frozen=True)
class TrivialBaseline:
    name: str  # "majority class", "all positive", "most frequent tag"
    rule: str
    predictions: dict[str, np.ndarray]  # per evaluation split, in the task's label indexes
    scores: dict[str, dict[str, float]]  # split -> metric -> value


def majority_class(labels: np.ndarray) -> int:
    """The most frequent label (the smallest on a tie)."""
    labels = np.asarray(labels, dtype=np.int64)
    if labels.size == 0:
        raise ValueError("a majority class needs at least one training label")
    return int(np.argmax(np.bincount(labels)))


@dataclass(frozen=True)
class MostFrequentTagger:
    best: dict[str, str]  # lowercased word -> its most frequent training tag
    unseen: str

    def tag(self, sentences: Sequence[Sequence[str]]) -> list[list[str]]:
        return [[self.best.get(word.lower(), self.unseen) for word in words] for words in sentences]


def most_frequent_tagger(sentences: Sequence[Sequence[str]], tags: Sequence[Sequence[str]]) -> MostFrequentTagger:
    """Each lowercased word's most frequent tag in the training sentences; unseen words get the most
    frequent tag overall. Ties: the tag more frequent overall, then alphabetical."""
    overall: Counter[str] = Counter(tag for sentence_tags in tags for tag in sentence_tags)
    if not overall:
        raise ValueError("a most-frequent-tag baseline needs at least one tagged training word")
    per_word: defaultdict[str, Counter[str]] = defaultdict(Counter)
    for words, sentence_tags in zip(sentences, tags):
        if len(words) != len(sentence_tags):
            raise ValueError(f"a training sentence has {len(words)} words and {len(sentence_tags)} tags")
        for word, tag in zip(words, sentence_tags):
            per_word[word.lower()][tag] += 1

    def rank(counts: Counter[str]) -> str:
        return min(counts, key=lambda tag: (-counts[tag], -overall[tag], tag))

    return MostFrequentTagger({word: rank(counts) for word, counts in per_word.items()}, rank(overall))


def trivial_baselines(task: Task, train_rows: np.ndarray, eval_rows: dict[str, np.ndarray]) -> list[TrivialBaseline]:
    """The task's trivial baselines fitted on `train_rows` of its training split and scored on the
    chosen rows of each evaluation split (sentences for tagging)."""
    results = []
    if isinstance(task, TaggingTask):
        train = task.splits[task.train_split]
        tagger = most_frequent_tagger([train.sentences[r] for r in train_rows], [train.tags[r] for r in train_rows])
        index = {tag: i for i, tag in enumerate(task.tagset)}
        predictions, scores = {}, {}
        for split, rows in eval_rows.items():
            part = task.splits[split]
            guessed = tagger.tag([part.sentences[r] for r in rows])
            predictions[split] = np.array([index[t] for words in guessed for t in words], dtype=np.int64)
            truth = np.array([index[t] for r in rows for t in part.tags[r]], dtype=np.int64)
            scores[split] = score(task, truth, predictions[split])
        return [TrivialBaseline("most frequent tag", MFT_RULE, predictions, scores)]
    assert isinstance(task, SentenceTask)
    if task.kind != "classification":
        return []
    constants = [("majority class", MAJORITY_RULE, majority_class(task.splits[task.train_split].labels[train_rows]))]
    n_classes = len(task.classes) if task.classes else int(task.splits[task.train_split].labels.max()) + 1
    if n_classes == 2 and "f1" in task.metrics:
        constants.append(("all positive", ALL_POSITIVE_RULE, 1))
    for name, rule, label in constants:
        predictions = {split: np.full(len(rows), label, dtype=np.int64) for split, rows in eval_rows.items()}
        scores = {split: score(task, task.splits[split].labels[rows], predictions[split]) for split, rows in eval_rows.items()}
        results.append(TrivialBaseline(name, rule, predictions, scores))
    return results


@dataclass(frozen=True)
class TrivialTest:
    p_value: float  # one-sided: the model beats the baseline
    test: str


def binomial_test(y_true: np.ndarray, y_pred: np.ndarray, baseline_accuracy: float) -> TrivialTest:
    """Exact one-sided binomial test: P(X >= correct) for X ~ Binomial(n, baseline_accuracy)."""
    correct = int(np.sum(np.asarray(y_true) == np.asarray(y_pred)))
    n = len(y_true)
    p = scipy_stats.binomtest(correct, n, min(max(baseline_accuracy, 0.0), 1.0), alternative="greater").pvalue
    return TrivialTest(float(p), "exact one-sided binomial test of the correct count against the baseline's accuracy")


def label_permutation_test(y_true: np.ndarray, y_pred: np.ndarray, metric: Callable[[np.ndarray, np.ndarray], float],
                           *, n_resamples: int = 2000, seed: int = 0) -> TrivialTest:
    """One-sided permutation test of metric(y_true, y_pred) against the evaluation labels shuffled:
    p = (1 + #{metric(shuffled, y_pred) >= observed}) / (1 + n_resamples)."""
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    observed = metric(y_true, y_pred)
    rng = np.random.default_rng(seed)
    null = np.array([metric(rng.permutation(y_true), y_pred) for _ in range(n_resamples)])
    tolerance = 1e-12 * max(1.0, abs(observed))
    p = (1 + int(np.sum(null >= observed - tolerance))) / (1 + n_resamples)
    return TrivialTest(float(p), f"one-sided label-permutation test ({n_resamples} resamples)")


def beats_baseline(metric_name: str, y_true: np.ndarray, y_pred: np.ndarray, baseline: np.ndarray, baseline_value: float,
                 *, n_resamples: int = 2000, seed: int = 0) -> tuple[bool, TrivialTest]:
    """(beats, test) of one seed's predictions against a trivial baseline's on the same examples."""
    metric = METRICS[metric_name]
    if metric_name == "accuracy":
        test = binomial_test(y_true, y_pred, baseline_value)
        return bool(test.p_value < ALPHA), test
    if metric_name == "matthews":
        test = label_permutation_test(y_true, y_pred, metric, n_resamples=n_resamples, seed=seed)
        return bool(test.p_value < ALPHA and metric(y_true, y_pred) > baseline_value), test
    paired = paired_permutation_test(y_true, baseline, y_pred, metric, n_resamples=n_resamples, seed=seed)
    return (bool(paired.difference > 0 and paired.p_value < ALPHA),
            TrivialTest(paired.p_value, f"two-sided paired {paired.method} test against the baseline's predictions "
                                        f"({paired.n_resamples} resamples; beating: difference > 0 and p < {ALPHA})"))
