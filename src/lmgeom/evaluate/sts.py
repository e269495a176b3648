"""Sentence similarity (STS): Spearman x 100 between gold scores and the cosine of pooled sentence
vectors, per layer or layer combination, raw or after an isotropy calibration.

- A sentence vector is the mean of its tokenizer pieces in one layer (`HFEncoder.sentence_embeddings`;
  special tokens included by default, the sentence-transformers convention); a layer combination
  averages those per-layer vectors, which by linearity equals pooling the layer-averaged tokens.
  `first-last-avg` is layers 1 and L: the first transformer block and the last, as Li et al. (2020)
  and Su et al. (2021) define it (layer 0 is the embedding output).
- Calibrators are fitted "transductively" on all distinct sentences of the set being evaluated,
  or on a separate corpus encoded the same way; records say which in `fit_on`.
- Aggregations: "all" is the Spearman of the pooled pairs of all subsets; "mean" is the unweighted
  mean of the per-subset Spearman values (SentEval's "mean"; its "wmean" weights by subset size
  and is not reported). "mean" exists only for sets with more than one subset (the SemEval years).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
from scipy.stats import spearmanr

from lmgeom.calibrate import METHODS, make_calibrator
from lmgeom.corpus import Corpus, load_corpus
from lmgeom.encoders import HFEncoder
from lmgeom.evaluate.sts_data import STSDataset
from lmgeom.metrics.base import as_float64_rows, unit_rows
from lmgeom.metrics.contextuality import average_cosine
from lmgeom.metrics.isotropy import isoscore, log_partition_isotropy

NO_CALIBRATION = "none"
TRANSDUCTIVE = "transductive"
FIRST_LAST_AVG = "first-last-avg"
CALIBRATION_METHODS = (NO_CALIBRATION, *METHODS)
ISOTROPY_MEASURES = ("log_partition_isotropy", "isoscore", "average_cosine")
# Sentences per call to the encoder: bounds the (all layers x sentences x dim) array it returns
# before the layers that are not needed are dropped.
ENCODE_CHUNK_SENTENCES = 1024

# (stage, items done since the last call, total items of the stage); stages "encode" and "evaluate".
ProgressCallback = Callable[[str, int, int], None]


@dataclass(frozen=True)
class LayerSelection:
    """A named set of layer indexes whose sentence vectors are averaged (one index: that layer)."""

    name: str
    indexes: tuple[int, ...]


@dataclass(frozen=True)
class FitSource:
    """Where calibrators are fitted: the evaluated sentences (`sentences` None) or a corpus."""

    name: str
    sentences: tuple[str, ...] | None = None


def resolve_layers(layers: Sequence[int | str | LayerSelection] | None, n_layers: int) -> list[LayerSelection]:
    """Layer selections from ints, "all" (every layer 0..L), "first-last-avg" (layers 1 and L) or
    ready `LayerSelection`s; None means every layer plus first-last-avg."""
    last = n_layers - 1
    selections: list[LayerSelection] = []
    for item in ["all", FIRST_LAST_AVG] if layers is None else layers:
        if isinstance(item, LayerSelection):
            selection = item
        elif item == "all":
            selections.extend(LayerSelection(str(layer), (layer,)) for layer in range(n_layers))
            continue
        elif item == FIRST_LAST_AVG:
            if last < 1:
                raise ValueError("first-last-avg needs at least one transformer layer; this model has only the embedding layer")
            selection = LayerSelection(FIRST_LAST_AVG, (1, last))
        else:
            try:
                selection = LayerSelection(str(int(item)), (int(item),))
            except (TypeError, ValueError):
                raise ValueError(f"unknown layer {item!r}; give layer numbers 0..{last}, 'all' or '{FIRST_LAST_AVG}'") from None
        bad = [index for index in selection.indexes if not 0 <= index <= last]
        if bad or not selection.indexes:
            raise ValueError(
                f"layer selection {selection.name!r} has layer(s) {bad or '(none)'} outside 0..{last} "
                f"(layer 0 is the embedding output, {last} the last block)"
            )
        selections.append(selection)
    unique = list(dict.fromkeys(selections))
    if not unique:
        raise ValueError("no layers selected; give layer numbers, 'all' or 'first-last-avg'")
    return unique


def combination(indexes: Sequence[int]) -> LayerSelection:
    """The average of the given layers' sentence vectors, named avg(i,j,...)."""
    indexes = tuple(int(i) for i in indexes)
    return LayerSelection(f"avg({','.join(map(str, indexes))})", indexes)


def resolve_methods(methods: Sequence[str]) -> list[str]:
    """"none" first (the uncalibrated baseline is always measured), then the requested calibrators."""
    unknown = [m for m in methods if m not in CALIBRATION_METHODS]
    if unknown:
        raise ValueError(f"unknown calibration method(s) {unknown}; choose from {', '.join(CALIBRATION_METHODS)}")
    return list(dict.fromkeys([NO_CALIBRATION, *methods]))


FitOn = str | Corpus | FitSource


def resolve_fit_sources(fit_on: FitOn | Sequence[FitOn]) -> list[FitSource]:
    """"transductive", a corpus spec for `load_corpus` (lee, brown, a file, ...), a `Corpus` or a
    `FitSource`, or a list of them."""
    items = [fit_on] if isinstance(fit_on, (str, Corpus, FitSource)) else list(fit_on)
    if not items:
        raise ValueError(f"fit_on is empty; give '{TRANSDUCTIVE}' or a corpus (e.g. lee)")
    sources = []
    for item in items:
        if isinstance(item, FitSource):
            sources.append(item)
            continue
        if isinstance(item, str) and item == TRANSDUCTIVE:
            sources.append(FitSource(TRANSDUCTIVE))
            continue
        corpus = item if isinstance(item, Corpus) else load_corpus(item)
        sources.append(FitSource(corpus.name, tuple(s.text for s in corpus.sentences)))
    return list(dict.fromkeys(sources))


def spearman(gold: Sequence[float], predicted: Sequence[float]) -> float:
    """Spearman rank correlation x 100 (ties take their average rank)."""
    gold, predicted = np.asarray(gold, dtype=np.float64), np.asarray(predicted, dtype=np.float64)
    if gold.shape != predicted.shape or gold.ndim != 1:
        raise ValueError(f"gold and predicted must be 1-D of equal length, got {gold.shape} and {predicted.shape}")
    if len(gold) < 2:
        return float("nan")
    return float(spearmanr(gold, predicted).statistic * 100)


def pair_cosines(vectors1: np.ndarray, vectors2: np.ndarray) -> np.ndarray:
    """Row-wise cosine of two (n, dim) arrays; a zero vector has cosine 0 with anything."""
    units1, _ = unit_rows(np.asarray(vectors1, dtype=np.float64))
    units2, _ = unit_rows(np.asarray(vectors2, dtype=np.float64))
    return np.einsum("ij,ij->i", units1, units2)


def aggregate_scores(dataset: STSDataset, predicted: np.ndarray) -> dict[str, float]:
    """{"all": Spearman of all pairs} plus, for several subsets, {"mean": unweighted mean over subsets}."""
    scores = {"all": spearman(dataset.scores, predicted)}
    names = dataset.subset_names
    if len(names) > 1:
        subsets = np.asarray(dataset.subsets)
        scores["mean"] = float(np.mean([spearman(dataset.scores[subsets == s], predicted[subsets == s]) for s in names]))
    return scores


def encode_sentences(
    encoder: HFEncoder,
    texts: Sequence[str],
    *,
    layer_indexes: Sequence[int],
    include_special: bool = True,
    on_progress: ProgressCallback | None = None,
) -> np.ndarray:
    """Mean-pooled sentence vectors of the given layers, (len(layer_indexes), n_texts, dim) float32.

    Texts go to the model shortest first, so batches hold similar lengths and little padding."""
    layer_indexes = list(layer_indexes)
    out = np.empty((len(layer_indexes), len(texts), encoder.dim), dtype=np.float32)
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))

    def on_batch(n: int) -> None:
        if on_progress is not None:
            on_progress("encode", n, len(texts))

    for start in range(0, len(order), ENCODE_CHUNK_SENTENCES):
        rows = order[start : start + ENCODE_CHUNK_SENTENCES]
        vectors = encoder.sentence_embeddings([texts[i] for i in rows], include_special=include_special, on_batch=on_batch)
        out[:, rows] = vectors[layer_indexes]
    return out


def isotropy_of(X: np.ndarray) -> dict[str, float]:
    """log I(W) (Mu & Viswanath), IsoScore and the average cosine of sentence vectors."""
    return {
        "log_partition_isotropy": log_partition_isotropy(X),
        "isoscore": isoscore(X),
        "average_cosine": average_cosine(X),
    }


class _VectorCache:
    """Sentence vectors of every distinct text, encoded once, pooled per layer selection on demand."""

    def __init__(self, texts: Sequence[str], layer_indexes: list[int], vectors: np.ndarray) -> None:
        self.row = {text: i for i, text in enumerate(texts)}
        self.position = {layer: i for i, layer in enumerate(layer_indexes)}
        self.vectors = vectors

    def pooled(self, selection: LayerSelection, texts: Sequence[str], *, name: str) -> np.ndarray:
        rows = np.array([self.row[t] for t in texts])
        total = np.zeros((len(rows), self.vectors.shape[2]), dtype=np.float64)
        for layer in selection.indexes:
            total += self.vectors[self.position[layer], rows]
        return as_float64_rows(total / len(selection.indexes), name=name, layer=selection.indexes[0])


def evaluate_sts(
    encoder: HFEncoder,
    datasets: Sequence[STSDataset],
    *,
    layers: Sequence[int | str | LayerSelection] | None = None,
    methods: Sequence[str] = (NO_CALIBRATION,),
    fit_on: FitOn | Sequence[FitOn] = TRANSDUCTIVE,
    include_special: bool = True,
    seed: int = 0,
    on_progress: ProgressCallback | None = None,
) -> list[dict[str, Any]]:
    """Spearman x 100 of every (dataset, layer selection, method, fit source, aggregation), as tidy
    records that also carry the isotropy of the (calibrated) sentence vectors of that dataset.

    Every distinct sentence (of all datasets and fit corpora) runs through the model once; only the
    layers the selections use are kept. The "none" baseline is always included; its `fit_on` is "none"."""
    if not datasets:
        raise ValueError("no datasets to evaluate; read some with find_datasets(data_dir)")
    selections = resolve_layers(layers, encoder.n_layers)
    methods = resolve_methods(methods)
    sources = resolve_fit_sources(fit_on) if len(methods) > 1 else []
    corpora = [s for s in sources if s.sentences is not None]
    texts = list(dict.fromkeys([*(t for d in datasets for t in d.sentences), *(t for s in corpora for t in s.sentences)]))
    layer_indexes = sorted({i for s in selections for i in s.indexes})
    cache = _VectorCache(
        texts, layer_indexes,
        encode_sentences(encoder, texts, layer_indexes=layer_indexes, include_special=include_special, on_progress=on_progress),
    )
    context = {"pooling": "mean", "special_tokens": "included" if include_special else "excluded"}
    n_steps = len(selections) * len(datasets) * (1 + (len(methods) - 1) * len(sources))
    records: list[dict[str, Any]] = []
    for selection in selections:
        corpus_vectors = {s.name: cache.pooled(selection, s.sentences, name=f"{s.name} sentence vectors") for s in corpora}
        fitted: dict[tuple[str, str], Any] = {}  # calibrators fitted on a corpus serve every dataset
        for dataset in datasets:
            X = cache.pooled(selection, dataset.sentences, name=f"{dataset.name} sentence vectors")
            settings = {**context, "layer": selection.name, "layer_indexes": list(selection.indexes)}
            records.extend(_score(dataset, X, {**settings, "method": NO_CALIBRATION, "fit_on": NO_CALIBRATION, "n_fit_sentences": 0}))
            if on_progress is not None:
                on_progress("evaluate", 1, n_steps)
            for method in methods[1:]:
                for source in sources:
                    if source.sentences is None:
                        calibrator, n_fit = make_calibrator(method, seed=seed).fit(X), len(X)
                    else:
                        key = (method, source.name)
                        if key not in fitted:
                            fitted[key] = make_calibrator(method, seed=seed).fit(corpus_vectors[source.name])
                        calibrator, n_fit = fitted[key], len(corpus_vectors[source.name])
                    fit_settings = {**settings, "method": method, "fit_on": source.name, "n_fit_sentences": n_fit}
                    records.extend(_score(dataset, calibrator.transform(X), fit_settings))
                    if on_progress is not None:
                        on_progress("evaluate", 1, n_steps)
    return records


def _score(dataset: STSDataset, X: np.ndarray, settings: dict[str, Any]) -> list[dict[str, Any]]:
    """Records of one dataset's vectors X (rows in `dataset.sentences` order), one per aggregation."""
    index = {text: i for i, text in enumerate(dataset.sentences)}
    left = np.array([index[t] for t in dataset.sentences1])
    right = np.array([index[t] for t in dataset.sentences2])
    predicted = pair_cosines(X[left], X[right])
    isotropy = isotropy_of(X)
    identity = {"dataset": dataset.name, "split": dataset.split}
    sizes = {"n_pairs": len(dataset), "n_subsets": len(dataset.subset_names), "n_sentences": len(X)}
    return [
        {**identity, **settings, "aggregation": aggregation, "spearman": value, **sizes, **isotropy}
        for aggregation, value in aggregate_scores(dataset, predicted).items()
    ]


# ---- summaries ------------------------------------------------------------------------------


def summary_table(records: Sequence[dict[str, Any]], *, compact: bool = False) -> tuple[list[str], list[list[str]]]:
    """(header, rows): one row per (layer, method, fit_on) with Spearman x 100 per dataset and
    aggregation, their average over datasets ("all" aggregation), and the isotropy of the sentence
    vectors averaged over datasets. `compact` puts a multi-subset set's "all" and "mean" in one cell."""
    datasets = list(dict.fromkeys(r["dataset"] for r in records))
    multi = {r["dataset"] for r in records if r["n_subsets"] > 1}
    if compact:
        score_columns = [f"{d} all/mean" if d in multi else d for d in datasets]
    else:
        score_columns = [c for d in datasets for c in ([f"{d} all", f"{d} mean"] if d in multi else [d])]
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for record in records:
        row = rows.setdefault((record["layer"], record["method"], record["fit_on"]), {"all": {}, "mean": {}, "isotropy": {}})
        row[record["aggregation"]][record["dataset"]] = record["spearman"]
        if record["aggregation"] == "all":
            row["isotropy"][record["dataset"]] = [record[m] for m in ISOTROPY_MEASURES]

    def cells(row: dict[str, Any], dataset: str) -> list[str]:
        values = [row[a].get(dataset) for a in (("all", "mean") if dataset in multi else ("all",))]
        texts = ["" if v is None else f"{v:.{1 if compact else 2}f}" for v in values]
        return ["/".join(texts)] if compact else texts

    header = ["layer", "method", "fit_on", *score_columns, "avg (all)", "log I(W)", "IsoScore", "avg cos"]
    body = []
    for (layer, method, fit_name), row in rows.items():
        scores = [cell for d in datasets for cell in cells(row, d)]
        average = f"{np.mean(list(row['all'].values())):.2f}" if len(row["all"]) == len(datasets) else ""
        isotropy = np.mean(list(row["isotropy"].values()), axis=0)
        body.append([layer, method, fit_name, *scores, average, f"{isotropy[0]:.2f}", f"{isotropy[1]:.3f}", f"{isotropy[2]:.3f}"])
    return header, body


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    lines.extend("| " + " | ".join(row) + " |" for row in rows)
    return "\n".join(lines) + "\n"
