"""Static word vectors trained here, standing in for the GloVe and FastText rows of Ethayarajh (2019)'s
Table 1 (the published vectors cannot be downloaded on these machines).

`run_static_baselines` trains gensim's skip-gram word2vec and gensim's fastText (skip-gram, character
n-grams) on a corpus and scores each vector set on the word benchmarks exactly as
`lmgeom static-embeddings` scores a model's static vectors: `default_word_benchmarks`, both
out-of-vocabulary protocols with coverage (`lmgeom.evaluate.wordbench.evaluate_word_benchmarks`).

Words are the corpus's words as the model's store segments them (`Corpus` sentences), punctuation
dropped as the store's analysis drops it (`is_punctuation`), lowercased (the benchmarks are matched
lowercased). With `workers=1` and a fixed `seed` gensim's training is deterministic: the same corpus and
settings give the same vectors in any process (gensim seeds its vectors from `seed`, not from Python's
string hash). These are stand-ins, not the published vectors: GloVe and FastText were trained on
billions of tokens, a corpus here has thousands to a million.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from lmgeom.corpus import Corpus, is_punctuation, load_corpus
from lmgeom.errors import InputError
from lmgeom.evaluate.wordbench import (CATEGORISATION_SEED, WordLookup, evaluate_word_benchmarks, read_word_benchmarks,
                                       covered_score_text)
from lmgeom.progress import NoProgress, Progress
from lmgeom import rundir
from lmgeom.rundir import write_json, write_text
from lmgeom.stages.static import default_word_benchmarks

KIND = "experiment-static-baselines"
METHODS = ("word2vec", "fasttext")
LABELS = {"word2vec": "word2vec SG", "fasttext": "fastText SG"}
# the corpus-dependent defaults: Lee (about 60,000 words) needs more passes; words of at least 5
# occurrences everywhere (the model's static vectors keep words of at least 5 sentences)
SMALL_CORPUS_DEFAULTS = {"lee": {"epochs": 20}}
USUAL_DEFAULTS = {"min_count": 5, "epochs": 5}


@dataclass(frozen=True)
class StaticBaselineSettings:
    """gensim's hyper-parameters for both methods (`sg=1`: skip-gram; `bucket` and n-gram lengths are
    fastText's only; fastText's own default bucket is 2,000,000, 2.4 GB at 300 dimensions)."""

    dim: int = 300
    window: int = 5
    min_count: int = 5
    epochs: int = 5
    negative: int = 5
    sample: float = 1e-3
    alpha: float = 0.025
    seed: int = 0
    workers: int = 1
    min_n: int = 3
    max_n: int = 6
    bucket: int = 200_000

    def __post_init__(self) -> None:
        for name in ("dim", "window", "min_count", "epochs", "workers", "min_n", "bucket"):
            if getattr(self, name) < 1:
                raise InputError(f"`{name}` must be at least 1, got {getattr(self, name)}", param=name)
        if self.max_n < self.min_n:
            raise InputError(f"`max_n` ({self.max_n}) must be at least `min_n` ({self.min_n})", param="max_n")


def default_settings(corpus: str, **overrides: Any) -> StaticBaselineSettings:
    """The settings for `corpus` (its spec: `lee`, `brown`, `brown:DIR`, ...), with `overrides` (None values ignored)."""
    name = corpus.partition(":")[0]
    given = {key: value for key, value in overrides.items() if value is not None}
    return StaticBaselineSettings(**{**USUAL_DEFAULTS, **SMALL_CORPUS_DEFAULTS.get(name, {}), **given})


def training_sentences(corpus: Corpus) -> list[list[str]]:
    """Each sentence's words, lowercased, punctuation dropped (sentences left empty are dropped)."""
    sentences = [[word.text.lower() for word in sentence.words if not is_punctuation(word.text)] for sentence in corpus]
    return [sentence for sentence in sentences if sentence]


def train_vectors(method: str, sentences: Sequence[Sequence[str]], settings: StaticBaselineSettings) -> Any:
    """gensim KeyedVectors of `method` (word2vec or fasttext, both skip-gram) trained on `sentences`."""
    from gensim.models import FastText, Word2Vec

    common = dict(vector_size=settings.dim, window=settings.window, min_count=settings.min_count, epochs=settings.epochs,
                  negative=settings.negative, sample=settings.sample, alpha=settings.alpha, seed=settings.seed,
                  workers=settings.workers, sg=1)
    if method == "word2vec":
        model: Any = Word2Vec(sentences=list(sentences), **common)
    elif method == "fasttext":
        model = FastText(sentences=list(sentences), min_n=settings.min_n, max_n=settings.max_n, bucket=settings.bucket, **common)
    else:
        raise InputError(f"unknown method {method!r}; choose from {', '.join(METHODS)}", param="methods")
    if not len(model.wv):
        raise InputError(f"no word occurs at least {settings.min_count} times (min_count): lower it", param="min_count")
    return model.wv


@dataclass
class StaticBaselineResult:
    document: dict[str, Any]
    paths: list[rundir.Target]


def run_static_baselines(
    corpus: str,
    *,
    out: str | os.PathLike[str],
    settings: StaticBaselineSettings | None = None,
    methods: Sequence[str] = METHODS,
    benchmarks: Mapping[str, str | os.PathLike[str]] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    progress: Progress | None = None,
) -> StaticBaselineResult:
    """Train each of `methods` on `corpus` (a corpus spec), score it on `benchmarks` (default: every
    set of `default_word_benchmarks(data_dir)`), and write OUT/results.json, OUT/results.md and each
    method's vectors (OUT/vectors/<method>.bin, word2vec binary: vocabulary words only, fastText's
    n-grams are not kept). Re-run into the same folder, finished methods are kept; a folder holding
    results of other settings is an error."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise InputError(f"`methods`: choose from {', '.join(METHODS)}; got {', '.join(methods) or 'none'}", param="methods")
    settings = settings or default_settings(corpus)
    progress = progress or NoProgress()
    skipped: dict[str, str] = {}
    if benchmarks is None:
        found, skipped = default_word_benchmarks(data_dir)
        benchmarks = dict(found)
    loaded = read_word_benchmarks(benchmarks)
    text = load_corpus(corpus)
    sentences = training_sentences(text)
    out = Path(out)
    described = {"corpus": corpus, "corpus_fingerprint": text.fingerprint, "sentences": len(sentences),
                 "tokens": sum(map(len, sentences)), "benchmarks": {b.name: shown_path(b.path) for b in loaded},
                 "gensim": _gensim_version(), **asdict(settings)}
    document = _previous(out, described)
    finished = {record["method"] for record in document["records"]}
    paths: list[rundir.Target] = []
    progress.start("static baselines", len(methods), unit="vector sets")
    for method in methods:
        if method in finished:
            progress.advance("static baselines", note=f"{method} (finished before)")
            continue
        vectors = train_vectors(method, sentences, settings)
        paths.append(rundir.write_with(rundir.STATIC_BASELINE_VECTORS.at(out, name=method), _saver(vectors)))
        for record in evaluate_word_benchmarks(WordLookup.from_keyed_vectors(vectors), loaded):
            document["records"].append({"vectors": LABELS[method], "method": method, "n_vectors": len(vectors), **record,
                                        "path": shown_path(record["path"])})
        document["skipped"] = skipped
        paths.append(write_json(rundir.EXPERIMENT_JSON.at(out), KIND, document))
        progress.advance("static baselines", note=method)
    paths.append(write_text(rundir.EXPERIMENT_TABLE.at(out), results_table(document)))
    return StaticBaselineResult(document, paths)


def shown_path(path: str | os.PathLike[str]) -> str:
    """A benchmark's path as result files name it: gensim's test data from the gensim package
    (gensim/test/test_data/...), any other as given (../shared/data/... when the data folder is given so)."""
    import gensim

    package = Path(gensim.__file__).resolve().parent
    resolved = Path(path).resolve()
    if resolved.is_relative_to(package):
        return str(Path("gensim") / resolved.relative_to(package))
    return str(path)


def _gensim_version() -> str:
    import gensim

    return str(gensim.__version__)


def _saver(vectors: Any) -> Callable[[Path], Path]:
    def save(path: Path) -> Path:
        vectors.save_word2vec_format(str(path), binary=True)
        return path
    return save


def _previous(out: Path, settings: dict[str, Any]) -> dict[str, Any]:
    """The results document to extend: the one in `out` when its settings are these, else a new one."""
    fresh: dict[str, Any] = {
        "settings": settings,
        "protocols": {"score": "oov=skip: covered items only",
                      "score_oov_mean": "oov=mean: every item, out-of-vocabulary words as the mean of the "
                                        "L2-normalised vectors (the web package's protocol)"},
        "note": "trained here as stand-ins for GloVe and FastText; not the published vectors, and a far smaller corpus",
        "categorisation_seed": CATEGORISATION_SEED,
        "skipped": {},
        "records": [],
    }
    path = rundir.EXPERIMENT_JSON.at(out)
    previous = rundir.read_json(path)
    if previous is None:
        return fresh
    if previous.get("kind") != KIND:
        raise InputError(f"{path} holds another experiment's results ({previous.get('kind')!r}); give another --out", param="out")
    if previous.get("settings") != settings:
        changed = sorted(k for k in {*settings, *previous.get("settings", {})}
                         if settings.get(k) != previous.get("settings", {}).get(k))
        raise InputError(f"{path} holds results of other settings ({', '.join(changed)} differ); give another --out "
                         "or remove the folder", param="out")
    return {**fresh, **{k: v for k, v in previous.items() if k in fresh}}


def results_table(document: Mapping[str, Any]) -> str:
    """results.md: one row per vector set and benchmark, both protocols and coverage."""
    settings = document["settings"]
    lines = [f"# Static baselines trained on {settings['corpus']}", "",
             f"{settings['sentences']:,} sentences, {settings['tokens']:,} words; skip-gram, {settings['dim']} dimensions, "
             f"window {settings['window']}, min_count {settings['min_count']}, {settings['epochs']} epochs, seed "
             f"{settings['seed']}, workers {settings['workers']}; gensim {settings['gensim']}.", "",
             "| vectors | words | benchmark | metric | all items (OOV = mean) | covered items only | coverage |",
             "|---|---:|---|---|---:|---:|---:|"]
    for record in document["records"]:
        lines.append(f"| {record['vectors']} | {record['n_vectors']:,} | {record['benchmark']} | {record['metric']} | "
                     f"{_cell(record['score_oov_mean'])} | {covered_score(record)} | {record['covered']:,}/{record['total']:,} |")
    return "\n".join(lines) + "\n"


def covered_score(record: Mapping[str, Any]) -> str:
    """A record's covered-items score as a table shows it (`covered_score_text`)."""
    return covered_score_text(record, _cell)


def _cell(value: Any) -> str:
    return "n/a" if value is None or value != value else f"{value:.3f}"
