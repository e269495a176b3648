"""The word benchmarks of Ethayarajh (2019)'s Table 1, scored as the `web` package
(kudkudak/word-embeddings-benchmarks) scores them, in two protocols.

Tasks and metrics:
- similarity (SimLex-999, MEN, WordSim-353, RW): Spearman between the gold scores and the cosines
  of the two words' vectors;
- analogy (Google, MSR): 3CosAdd accuracy: a:b :: c:? is answered by the argmax over the whole
  vocabulary of w . (b - a + c), the three question words excluded;
- relational similarity (SemEval-2012 Task 2): per relation, each rated pair X:Y scores
  (mean of the prototype left words - mean of the prototype right words) . (X - Y); the score
  is the mean over the 79 relations of the Spearman correlation with the gold ratings (a
  constant-score relation counts 0);
- categorisation (BLESS, AP, Battig, ESSLI-2c): the best purity of six clusterings of the words'
  vectors, each with as many clusters as there are categories: agglomerative with
  (euclidean, ward), (cosine, average), (cosine, complete), (euclidean, average),
  (euclidean, complete), and k-means (10 starts). `web` shuffles the rows and seeds k-means with
  `seed=None`, so its purity changes from run to run; here the shuffle and k-means take `seed`
  (default CATEGORISATION_SEED = 0), so a score is reproducible.

Vectors are looked up as `web` does after `load_embedding(..., normalize=True, lower=True)`: keys
lowercased, the first (most frequent, for frequency-ordered vectors) casing of a word kept, rows
L2-normalised (a zero row stays zero). Benchmark words are lowercased; analogy questions and
SemEval's rated pairs also lose every non-alphanumeric character but space, tab, '-' and '_', as
`web.utils.standardize_string` does ("city's" becomes "citys").

The two protocols (`oov`):
- "skip": covered items only (a pair, question or word whose words all have vectors), lmgeom's default;
- "mean": every item, each out-of-vocabulary word replaced by the mean of the L2-normalised rows
  (not itself normalised), as `web` does; an analogy whose answer has no vector counts as wrong.
Coverage (covered / total items) is the same in both.

The headline is the covered-items score: it measures the vectors themselves. The OOV-mean score always
scores every item (the web package's and Ethayarajh (2019)'s protocol), so it is comparable with the
paper, but it also charges a vector set for the words its corpus lacks (an out-of-vocabulary item ties
with every other one). A covered-items score on fewer items than `MinCoverage` asks (default: 50 items
and 10 % of the benchmark; a benchmark smaller than 50 items needs all of them) is "too few items": kept
in the records with `enough_items` false, and shown as `too_few_items_text` instead of a number in
headline tables.
"""

from __future__ import annotations

import csv
import math
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence

import numpy as np
from scipy import stats

from lmgeom.errors import InputError
from lmgeom.evaluate.wordsim import is_analogy_file, read_word_pairs

Oov = Literal["skip", "mean"]
OOV_PROTOCOLS: tuple[Oov, ...] = ("skip", "mean")
CATEGORISATION_SEED = 0  # the clusterings' seed (`web` leaves them unseeded)

# Table 1's benchmarks (plus Battig and ESSLI-2c, which `web` also scores) under the data folder;
# SimLex-999, WordSim-353 and the Google analogies come from gensim's test data (wordsim.GENSIM_BENCHMARKS).
DATA_BENCHMARKS = {
    "men": "word-sim_eval-word-vectors/EN-MEN-TR-3k.txt",
    "rw": "word-sim_eval-word-vectors/EN-RW-STANFORD.txt",
    "msr_analogies": "word-benchmarks/MSR/msr.csv",
    "semeval2012_2": "word-benchmarks/SemEval2012-2",
    "bless": "word-benchmarks/BLESS/bless.csv",
    "ap": "word-benchmarks/AP/ap.csv",
    "battig": "word-benchmarks/Battig/battig.csv",
    "essli_2c": "word-benchmarks/ESSLI-2c/essli-2008.csv",
}
METRICS = {"similarity": "spearman", "analogy": "accuracy_3cosadd", "relational_similarity": "mean_spearman",
           "categorisation": "purity"}
ITEMS = {"similarity": "pairs", "analogy": "questions", "relational_similarity": "pairs", "categorisation": "words"}

_DELETED = "".join(c for c in map(chr, range(256)) if not c.isalnum() and c not in " \t-_")
_DELETE_TABLE = str.maketrans("", "", _DELETED)


def standardize(word: str) -> str:
    """`web.utils.standardize_string`: lowercase, and delete every non-alphanumeric character of
    code point < 256 except space, tab, '-' and '_'."""
    return word.lower().translate(_DELETE_TABLE)


@dataclass(frozen=True)
class MinCoverage:
    """The fewest covered items a covered-items score needs to be a headline number: at least `items`
    items (or every item of a smaller benchmark) and at least `fraction` of the benchmark."""

    items: int = 50
    fraction: float = 0.10

    def __post_init__(self) -> None:
        if isinstance(self.items, bool) or not isinstance(self.items, int) or self.items < 0:
            raise InputError(f"`min_coverage` needs a whole number of items >= 0; got {self.items!r}", param="min_coverage")
        if not 0 <= self.fraction <= 1:
            raise InputError(f"`min_coverage` needs a fraction of the benchmark between 0 % and 100 %; got {self.fraction:.4g}",
                             param="min_coverage")

    @classmethod
    def parse(cls, text: "str | MinCoverage") -> "MinCoverage":
        """`"50,10%"` (items and percentage, either alone: `"50"` is 50 items and no fraction,
        `"10%"` is 10 % and no count); `"0"` turns the rule off."""
        if isinstance(text, MinCoverage):
            return text
        items, fraction = 0, 0.0
        parts = [part.strip() for part in str(text).split(",") if part.strip()]
        fix = 'give items and/or a percentage of the benchmark, e.g. "50,10%", "50", "10%" or "0" (no minimum)'
        if not parts or len(parts) > 2:
            raise InputError(f"`min_coverage` {text!r} does not read; {fix}", param="min_coverage")
        for part in parts:
            try:
                if part.endswith("%"):
                    fraction = float(part[:-1]) / 100
                else:
                    items = int(part)
            except ValueError:
                raise InputError(f"`min_coverage` {text!r} does not read ({part!r}); {fix}", param="min_coverage") from None
        return cls(items, fraction)

    def __str__(self) -> str:
        return f"{self.items},{self.fraction * 100:g}%"

    def needed(self, total: int) -> int:
        """The covered items a benchmark of `total` items needs."""
        return max(min(self.items, total), math.ceil(self.fraction * total - 1e-9))

    def enough(self, covered: int, total: int) -> bool:
        return total > 0 and covered > 0 and covered >= self.needed(total)


DEFAULT_MIN_COVERAGE = MinCoverage()


def too_few_items_text(covered: int, total: int) -> str:
    """What a headline table shows for a covered-items score on too few items."""
    return f"too few items ({covered:,} of {total:,})"


def covered_score_text(record: Mapping[str, Any], number: Callable[[Any], str]) -> str:
    """A benchmark record's covered-items score as a headline table shows it: `number(score)`, or
    `too_few_items_text` when the score rests on too few items (`enough_items` false)."""
    if record.get("enough_items") is False:
        return too_few_items_text(int(record["covered"]), int(record["total"]))
    return number(record["score"])


def coverage_text(covered: int, total: int) -> str:
    return f"{covered:,}/{total:,}"


# ---- vectors ---------------------------------------------------------------------------------------

@dataclass
class WordLookup:
    """Lowercased vocabulary (first casing kept), unit rows, and `web`'s out-of-vocabulary vector."""

    words: list[str]
    unit: np.ndarray  # (n_words, dim) float64, L2-normalised rows
    index: dict[str, int]
    mean: np.ndarray  # mean of the unit rows

    @classmethod
    def from_arrays(cls, keys: Sequence[str], vectors: np.ndarray) -> "WordLookup":
        vectors = np.asarray(vectors, dtype=np.float64)
        if vectors.ndim != 2 or len(keys) != len(vectors):
            raise ValueError(f"vectors must be (n_words, dim) with one row per key; got {vectors.shape} for {len(keys)} keys")
        if not len(keys):
            raise InputError("no vectors to score: the vocabulary is empty")
        index: dict[str, int] = {}
        rows: list[int] = []
        for row, key in enumerate(keys):
            word = key.lower()
            if word not in index:
                index[word] = len(rows)
                rows.append(row)
        kept = vectors[rows]
        norms = np.linalg.norm(kept, axis=1, keepdims=True)
        unit = kept / np.where(norms > 0, norms, 1.0)
        return cls(words=list(index), unit=unit, index=index, mean=unit.mean(axis=0))

    @classmethod
    def from_keyed_vectors(cls, vectors: Any) -> "WordLookup":
        """From gensim KeyedVectors, in their key order."""
        return cls.from_arrays(list(vectors.index_to_key), vectors.vectors)

    def covers(self, words: Iterable[str]) -> bool:
        return all(word in self.index for word in words)

    def rows(self, words: Sequence[str]) -> np.ndarray:
        """Unit rows of `words`, the mean vector for a word without one."""
        return np.stack([self.unit[self.index[w]] if w in self.index else self.mean for w in words]) \
            if len(words) else np.empty((0, self.unit.shape[1]))


@dataclass
class Score:
    score: float
    covered: int
    total: int


def _check_oov(oov: str) -> None:
    if oov not in OOV_PROTOCOLS:
        raise InputError(f"oov must be one of {', '.join(OOV_PROTOCOLS)}; got {oov!r}")


def _spearman(x: np.ndarray, y: Any) -> float:
    if len(x) < 2:
        return math.nan
    with warnings.catch_warnings():  # constant scores (e.g. every word out of vocabulary): NaN
        warnings.simplefilter("ignore", stats.ConstantInputWarning)
        return float(stats.spearmanr(x, y).statistic)


# ---- similarity --------------------------------------------------------------------------------------

def similarity_score(lookup: WordLookup, pairs: Sequence[tuple[str, str, float]], oov: Oov = "skip") -> Score:
    """Spearman between gold scores and the cosines of the two words' rows (with the mean vector for
    a word without one, so its cosine is with the mean's direction, as in `web`'s evaluate_similarity)."""
    _check_oov(oov)
    pairs = [(a.lower(), b.lower(), gold) for a, b, gold in pairs]
    covered = [p for p in pairs if lookup.covers(p[:2])]
    used = covered if oov == "skip" else pairs
    left, right = lookup.rows([p[0] for p in used]), lookup.rows([p[1] for p in used])
    norms = np.linalg.norm(left, axis=1) * np.linalg.norm(right, axis=1)
    scores = np.einsum("ij,ij->i", left, right) / np.where(norms > 0, norms, 1.0)
    return Score(_spearman(scores, np.array([p[2] for p in used])), len(covered), len(pairs))


# ---- analogies ---------------------------------------------------------------------------------------

@dataclass
class AnalogyQuestions:
    questions: list[tuple[str, str, str, str]]  # a, b, c, answer: a is to b as c is to answer
    categories: list[str]


def read_google_analogies(path: str | os.PathLike[str]) -> AnalogyQuestions:
    """Google format: ': section' lines, then 'a b c d' lines."""
    questions, categories, section = [], [], ""
    for line in Path(path).read_text(encoding="utf-8-sig").splitlines():
        if line.startswith(":"):
            section = line[1:].strip().lower()
        elif len(words := standardize(line).split()) == 4:
            questions.append((words[0], words[1], words[2], words[3]))
            categories.append(section)
    if not questions:
        raise InputError(f"{path} holds no analogy questions: expected ': section' lines and 'a b c d' lines")
    return AnalogyQuestions(questions, categories)


def _csv_rows(path: str | os.PathLike[str]) -> tuple[list[str], list[list[str]]]:
    with open(path, encoding="utf-8-sig", newline="") as handle:
        rows = list(csv.reader(handle))
    if not rows:
        raise InputError(f"{path} is empty")
    return rows[0], rows[1:]


def read_msr_analogies(path: str | os.PathLike[str]) -> AnalogyQuestions:
    """MSR analogies as CSV with columns type, word1, word2, word3, target (word1 : word2 :: word3 : target)."""
    header, rows = _csv_rows(path)
    wanted = ["type", "word1", "word2", "word3", "target"]
    if not set(wanted) <= set(header):
        raise InputError(f"{path}: expected the CSV columns {', '.join(wanted)}; found {', '.join(header)}")
    column = {name: header.index(name) for name in wanted}
    questions = [tuple(standardize(row[column[name]]) for name in wanted[1:]) for row in rows if row]
    return AnalogyQuestions([(q[0], q[1], q[2], q[3]) for q in questions],
                            [row[column["type"]] for row in rows if row])


def analogy_accuracy(lookup: WordLookup, questions: AnalogyQuestions, oov: Oov = "skip", *,
                     batch_size: int = 256) -> Score:
    """3CosAdd accuracy over the whole vocabulary, the question words excluded (`web`'s
    SimpleAnalogySolver(method="add")); ties go to the earlier word of the vocabulary. With oov="mean"
    a question whose answer has no vector is wrong whatever the search finds, so it is not searched."""
    _check_oov(oov)
    items = questions.questions
    covered = [q for q in items if lookup.covers(q)]
    searched = covered if oov == "skip" else [q for q in items if q[3] in lookup.index]
    n_scored = len(covered) if oov == "skip" else len(items)
    correct = 0
    for start in range(0, len(searched), batch_size):
        batch = searched[start:start + batch_size]
        a, b, c = (lookup.rows([q[i] for q in batch]) for i in range(3))
        scores = lookup.unit @ (b - a + c).T  # (n_words, batch)
        for column, question in enumerate(batch):
            excluded = [lookup.index[w] for w in question[:3] if w in lookup.index]
            scores[excluded, column] = -np.inf
        predicted = scores.argmax(axis=0)
        correct += sum(lookup.words[p] == q[3] for p, q in zip(predicted, batch))
    return Score(correct / n_scored if n_scored else math.nan, len(covered), len(items))


# ---- SemEval-2012 Task 2 -----------------------------------------------------------------------------

@dataclass
class Relation:
    """One SemEval-2012 Task 2 relation: its prototype (paradigm) pairs and its rated pairs."""

    id: str  # e.g. "1a"
    category: str  # broad class, e.g. "CLASS-INCLUSION"
    prototypes: list[tuple[str, str]]
    pairs: list[tuple[str, str]]
    gold: np.ndarray
    gold_text: list[str]  # the ratings as written in the file


SEMEVAL_PARADIGMS = "SemEval-2012-Complete-Data-Package/subcategories-paradigms.txt"
SEMEVAL_GOLD = "SemEval-2012-Gold-Ratings"
_GOLD_LINE = re.compile(r'^\s*(\S+)\s+"([^"]*):([^"]*)"\s*$')


def read_semeval_2012_2(folder: str | os.PathLike[str]) -> list[Relation]:
    """The 79 relations (10 training + 69 testing) of the official release, with the gold ratings.

    Prototypes are the three paradigm pairs of `subcategories-paradigms.txt`, lowercased; rated pairs
    are standardised as `web` does. Layout: SEMEVAL_PARADIGMS and SEMEVAL_GOLD/{Training,Testing}/GoldRatings-<id>.txt."""
    folder = Path(folder)
    paradigms = folder / SEMEVAL_PARADIGMS
    if not paradigms.is_file():
        raise FileNotFoundError(f"{paradigms} does not exist: give the SemEval-2012 Task 2 release folder")
    gold_files = {p.stem.removeprefix("GoldRatings-"): p
                  for p in sorted((folder / SEMEVAL_GOLD).glob("*/GoldRatings-*.txt"))}
    relations = []
    for line in paradigms.read_text(encoding="utf-8").splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 5:
            continue
        relation_id = f"{fields[0]}{fields[1]}"
        if relation_id not in gold_files:
            raise FileNotFoundError(f"no GoldRatings-{relation_id}.txt under {folder / SEMEVAL_GOLD}")
        # separators between the paradigm pairs vary (", ", ". ", " "): split as web splits its own copy
        listed = ",".join(fields[4:]).replace(": ", ":").replace(" ", ",").replace(".", "").split(",")
        prototypes = [(x.lower(), y.lower()) for x, y in (p.split(":", 1) for p in listed if ":" in p)]
        pairs, gold_text = [], []
        for gold_line in gold_files[relation_id].read_text(encoding="utf-8").splitlines():
            if gold_line.startswith("#") or not (match := _GOLD_LINE.match(gold_line)):
                continue
            gold_text.append(match.group(1))
            pairs.append((standardize(match.group(2)), standardize(match.group(3))))
        relations.append(Relation(relation_id, fields[2], prototypes, pairs,
                                  np.array([float(g) for g in gold_text]), gold_text))
    if not relations:
        raise InputError(f"{paradigms} lists no relations: expected lines '1, a, CLASS-INCLUSION, Taxonomic, x:y, ...'")
    return relations


def semeval_2012_2_score(lookup: WordLookup, relations: Sequence[Relation], oov: Oov = "skip", *,
                         rank_gold_as_text: bool = False) -> Score:
    """Mean over relations of Spearman(prototype-difference . pair-difference, gold), NaN counted as 0
    (`web`'s evaluate_on_semeval_2012_2, which="all", golden ratings).

    With oov="skip" a relation uses its covered prototype pairs and covered rated pairs, and one
    with no covered prototype or fewer than two covered pairs is left out of the mean; `covered`
    counts the rated pairs used. `rank_gold_as_text=True` hands scipy the ratings as the file's
    strings, as `web` does (its fetcher never converts them to numbers): scipy then ranks both
    columns as text, so a negative score ranks by its digits. False ranks numbers."""
    _check_oov(oov)
    rhos, covered = [], 0
    for relation in relations:
        covered_prototypes = [p for p in relation.prototypes if lookup.covers(p)]
        keep = np.array([lookup.covers(p) for p in relation.pairs], dtype=bool)
        scored_when_skipping = bool(covered_prototypes) and keep.sum() >= 2
        covered += int(keep.sum()) if scored_when_skipping else 0
        if oov == "skip" and not scored_when_skipping:
            continue
        prototypes = covered_prototypes if oov == "skip" else relation.prototypes
        if oov == "mean":
            keep[:] = True
        used = [p for p, k in zip(relation.pairs, keep) if k]
        direction = lookup.rows([p[0] for p in prototypes]).mean(axis=0) - lookup.rows([p[1] for p in prototypes]).mean(axis=0)
        scores = (lookup.rows([p[0] for p in used]) - lookup.rows([p[1] for p in used])) @ direction
        gold: Any = [g for g, k in zip(relation.gold_text, keep) if k] if rank_gold_as_text else relation.gold[keep]
        rho = _spearman(scores, gold)
        rhos.append(0.0 if math.isnan(rho) else rho)
    total = sum(len(r.pairs) for r in relations)
    return Score(float(np.mean(rhos)) if rhos else math.nan, covered, total)


# ---- categorisation ----------------------------------------------------------------------------------

@dataclass
class Categories:
    words: list[str]
    labels: list[str]


def read_categories(path: str | os.PathLike[str]) -> Categories:
    """A categorisation CSV with columns category and word (one row per word; a word may repeat in
    several categories). Rows with an empty word are dropped (conversion artefacts of bless.csv and ap.csv)."""
    header, rows = _csv_rows(path)
    if not {"category", "word"} <= set(header):
        raise InputError(f"{path}: expected the CSV columns category and word; found {', '.join(header)}")
    category, word = header.index("category"), header.index("word")
    kept = [row for row in rows if len(row) > max(category, word) and row[word].strip()]
    return Categories([row[word].strip() for row in kept], [row[category].strip() for row in kept])


def purity(labels: np.ndarray, clusters: np.ndarray) -> float:
    """(1/N) * sum over predicted clusters of the size of its largest true class."""
    from sklearn.metrics.cluster import contingency_matrix

    return float(contingency_matrix(labels, clusters).max(axis=0).sum() / len(labels))


CLUSTERINGS = (("euclidean", "ward"), ("cosine", "average"), ("cosine", "complete"),
               ("euclidean", "average"), ("euclidean", "complete"))


def categorisation_purity(lookup: WordLookup, categories: Categories, oov: Oov = "skip", *, seed: int = CATEGORISATION_SEED) -> Score:
    """Best purity of `web`'s six clusterings (evaluate_categorization, method="all"), with as many
    clusters as there are categories among the words clustered. The rows are shuffled by
    np.random.RandomState(seed) and k-means gets random_state=seed (`web` leaves both unseeded)."""
    from sklearn.cluster import AgglomerativeClustering, KMeans
    from sklearn.exceptions import ConvergenceWarning

    _check_oov(oov)
    words = [w.lower() for w in categories.words]
    is_covered = np.array([w in lookup.index for w in words], dtype=bool)
    keep = is_covered if oov == "skip" else np.ones(len(words), dtype=bool)
    vectors = lookup.rows([w for w, k in zip(words, keep) if k])
    labels = np.array([label for label, k in zip(categories.labels, keep) if k])
    n_clusters = len(set(labels.tolist()))
    if len(labels) <= n_clusters or n_clusters < 2:
        return Score(math.nan, int(is_covered.sum()), len(words))
    order = np.random.RandomState(seed).choice(range(len(labels)), len(labels), replace=False)
    vectors, labels = vectors[order], labels[order]
    best = 0.0
    for metric, linkage in CLUSTERINGS:
        clusters = AgglomerativeClustering(n_clusters=n_clusters, metric=metric, linkage=linkage).fit_predict(vectors)
        best = max(best, purity(labels, clusters))
    with warnings.catch_warnings():  # out-of-vocabulary words share one row: fewer distinct points than clusters
        warnings.simplefilter("ignore", ConvergenceWarning)
        clusters = KMeans(n_clusters=n_clusters, n_init=10, random_state=seed).fit_predict(vectors)
    return Score(max(best, purity(labels, clusters)), int(is_covered.sum()), len(words))


# ---- finding, reading and scoring benchmarks ---------------------------------------------------------

@dataclass
class WordBenchmark:
    name: str
    task: str  # similarity | analogy | relational_similarity | categorisation
    path: Path
    data: Any  # WordPairs | AnalogyQuestions | list[Relation] | Categories


# Sets scored only when asked for by path, and why
ON_REQUEST = {"battig": "not in Table 1, and its 5,231 words take about a minute per vector set and protocol "
                        "at 384 dimensions on one core; give its path as a benchmark to score it"}


def find_word_benchmarks(data_dir: str | os.PathLike[str]) -> tuple[dict[str, Path], dict[str, str]]:
    """(name -> path of each DATA_BENCHMARKS set found under `data_dir` and not in ON_REQUEST,
    name -> why each other one is not scored)."""
    data_dir = Path(data_dir)
    found, skipped = {}, {}
    for name, relative in DATA_BENCHMARKS.items():
        path = data_dir / relative
        if not path.exists():
            skipped[name] = f"{relative} not found in {data_dir}"
        elif name in ON_REQUEST:
            skipped[name] = ON_REQUEST[name]
        else:
            found[name] = path
    return found, skipped


def benchmark_task(path: str | os.PathLike[str]) -> str:
    """The task of a benchmark file or folder, from its layout: a folder is SemEval-2012 Task 2, a CSV
    with columns word1..target an analogy set, one with category and word a categorisation set, a file
    with ': section' lines Google analogies, anything else word pairs."""
    path = Path(path)
    if path.is_dir():
        return "relational_similarity"
    if path.suffix.lower() == ".csv":
        header = _csv_rows(path)[0]
        if {"word1", "word2", "word3", "target"} <= set(header):
            return "analogy"
        if {"category", "word"} <= set(header):
            return "categorisation"
    return "analogy" if is_analogy_file(path) else "similarity"


def read_word_benchmark(name: str, path: str | os.PathLike[str]) -> WordBenchmark:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"benchmark {name}: {path} does not exist")
    try:
        task = benchmark_task(path)
        data: Any
        if task == "relational_similarity":
            data = read_semeval_2012_2(path)
        elif task == "categorisation":
            data = read_categories(path)
        elif task == "analogy":
            data = read_msr_analogies(path) if path.suffix.lower() == ".csv" else read_google_analogies(path)
        else:
            data = read_word_pairs(path)
    except UnicodeDecodeError as error:
        raise InputError(f"benchmark {name}: {path} is not a text file (byte {error.start} does not decode as UTF-8); "
                         "give word pairs, Google-format analogies, a CSV laid out as msr.csv or bless.csv, or the "
                         "SemEval2012-2 folder", param="benchmarks") from None
    return WordBenchmark(name, task, path, data)


def score_word_benchmark(lookup: WordLookup, benchmark: WordBenchmark, oov: Oov, *, seed: int = CATEGORISATION_SEED) -> Score:
    if benchmark.task == "similarity":
        return similarity_score(lookup, benchmark.data.pairs, oov)
    if benchmark.task == "analogy":
        return analogy_accuracy(lookup, benchmark.data, oov)
    if benchmark.task == "relational_similarity":
        return semeval_2012_2_score(lookup, benchmark.data, oov)
    return categorisation_purity(lookup, benchmark.data, oov, seed=seed)


def evaluate_word_benchmarks(lookup: WordLookup, benchmarks: Sequence[WordBenchmark], *,
                             seed: int = CATEGORISATION_SEED,
                             min_coverage: MinCoverage | str = DEFAULT_MIN_COVERAGE) -> list[dict[str, Any]]:
    """One record per benchmark: `score` (oov="skip", covered items only) and `score_oov_mean`
    (oov="mean", every item), with the coverage both share and `enough_items`: whether `score` rests on
    the items `min_coverage` asks (`MinCoverage`)."""
    rule = MinCoverage.parse(min_coverage)
    records = []
    for benchmark in benchmarks:
        skip, mean = (score_word_benchmark(lookup, benchmark, oov, seed=seed) for oov in OOV_PROTOCOLS)
        records.append({
            "benchmark": benchmark.name,
            "task": benchmark.task,
            "metric": METRICS[benchmark.task],
            "score": skip.score,
            "score_oov_mean": mean.score,
            "covered": skip.covered,
            "total": skip.total,
            "coverage": skip.covered / skip.total if skip.total else math.nan,
            "enough_items": rule.enough(skip.covered, skip.total),
            "items": ITEMS[benchmark.task],
            "path": str(benchmark.path),
        })
    return records


def read_word_benchmarks(benchmarks: Mapping[str, str | os.PathLike[str]]) -> list[WordBenchmark]:
    return [read_word_benchmark(name, path) for name, path in benchmarks.items()]
