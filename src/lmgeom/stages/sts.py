"""The STS run: encode every distinct sentence once, pool layers, calibrate, and score.

- A sentence vector is the mean of its tokenizer pieces in one layer (`HFEncoder.sentence_embeddings`;
  special tokens included by default, the sentence-transformers convention); a layer combination
  averages those per-layer vectors, which by linearity equals pooling the layer-averaged tokens.
  `first-last-avg` is layers 1 and L: the first transformer block and the last, as Li et al. (2020)
  and Su et al. (2021) define it (layer 0 is the embedding output).
- Calibrators are fitted "transductively" on all distinct sentences of the set being evaluated,
  or on a separate corpus encoded the same way; records say which in `fit_on`.
- Scoring is `lmgeom.evaluate.sts` (pure: vectors in, Spearman out).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from lmgeom.errors import InputError, OutOfRange
from lmgeom.layerspec import select_layers
from lmgeom.calibrate import METHODS, Calibrator, make_calibrator
from lmgeom.corpus import Corpus, load_corpus
from lmgeom.evaluate.sts import best_calibration, headline_grid, markdown_table, score_dataset, summary_table
from lmgeom.evaluate.sts_data import STSDataset, find_datasets
from lmgeom.metrics.base import as_float64_rows
from lmgeom.progress import NoProgress, Progress
from lmgeom import rundir
from lmgeom.rundir import write_json, write_records_csv, write_text

if TYPE_CHECKING:
    from lmgeom.encoders.hf import HFEncoder

NO_CALIBRATION = "none"
TRANSDUCTIVE = "transductive"
FIRST_LAST_AVG = "first-last-avg"
CALIBRATION_METHODS = (NO_CALIBRATION, *METHODS)
# Sentences per call to the encoder: bounds the (all layers x sentences x dim) array it returns
# before the layers that are not needed are dropped.
ENCODE_CHUNK_SENTENCES = 1024
# The settings every record of one results file shares: a run with other values writes another file.
SHARED_SETTINGS = ("model", "datasets", "split", "limit_pairs", "pooling", "special_tokens", "seed")
# The settings whose values add up when results are merged, and the record keys that name one of them.
MERGED_SETTINGS = ("layers", "methods", "fit_on")
RECORD_KEY = ("layer", "method", "fit_on")



@dataclass(frozen=True)
class LayerSelection:
    """A named set of layer indexes whose sentence vectors are averaged (one index: that layer)."""

    name: str
    indexes: tuple[int, ...]


@dataclass(frozen=True)
class Combined:
    """The average of the layers a layer spec selects (`lmgeom.layerspec`: "0,6", "0,-1", "first,last",
    "every:2"), resolved once the model's number of layers is known; named avg(i,j,...)."""

    spec: str


@dataclass(frozen=True)
class FitSource:
    """Where calibrators are fitted: the evaluated sentences (`sentences` None) or a corpus."""

    name: str
    sentences: tuple[str, ...] | None = None


def resolve_layers(layers: Sequence[int | str | LayerSelection | Combined] | None, n_layers: int) -> list[LayerSelection]:
    """Layer selections from layer specs in the one grammar (`lmgeom.layerspec`: numbers, negative ones
    from the end, ranges, 'first', 'last', 'all', 'every:K'), "first-last-avg" (layers 1 and L, averaged),
    `Combined` specs (the average of the layers a spec selects) or ready `LayerSelection`s, in the order given; None means every layer plus first-last-avg."""
    last = n_layers - 1
    selections: list[LayerSelection] = []
    for item in ["all", FIRST_LAST_AVG] if layers is None else layers:
        if isinstance(item, LayerSelection):
            bad = [index for index in item.indexes if not 0 <= index <= last]
            if bad or not item.indexes:
                raise OutOfRange(f"`layers`: the selection {item.name!r} has layer(s) {bad or '(none)'} outside the model's "
                                 f"0..{last} (0 = embedding output)", param="layers")
            selections.append(item)
        elif isinstance(item, Combined):
            selections.append(combination(select_layers(item.spec, range(n_layers), param="combine")))
        elif item == FIRST_LAST_AVG:
            if last < 1:
                raise InputError("first-last-avg needs at least one transformer layer; this model has only the embedding layer",
                                 param="layers")
            selections.append(LayerSelection(FIRST_LAST_AVG, (1, last)))
        else:
            spec = [item] if isinstance(item, int) else str(item)
            selections.extend(LayerSelection(str(layer), (layer,)) for layer in select_layers(spec, range(n_layers)))
    unique = list(dict.fromkeys(selections))
    if not unique:
        raise InputError("no layers selected; give layers (e.g. 'all', '0,6,-1') or 'first-last-avg'", param="layers")
    return unique


def combination(indexes: Sequence[int]) -> LayerSelection:
    """The average of the given layers' sentence vectors, named avg(i,j,...)."""
    indexes = tuple(int(i) for i in indexes)
    return LayerSelection(f"avg({','.join(map(str, indexes))})", indexes)


def resolve_methods(methods: Sequence[str]) -> list[str]:
    """"none" first (the uncalibrated baseline is always measured), then the requested calibrators."""
    unknown = [m for m in methods if m not in CALIBRATION_METHODS]
    if unknown:
        raise InputError(f"unknown calibration method(s) {unknown}; choose from {', '.join(CALIBRATION_METHODS)}")
    return list(dict.fromkeys([NO_CALIBRATION, *methods]))


FitOn = str | Corpus | FitSource


def resolve_fit_sources(fit_on: FitOn | Sequence[FitOn]) -> list[FitSource]:
    """"transductive", a corpus spec for `load_corpus` (lee, brown, a file, ...), a `Corpus` or a
    `FitSource`, or a list of them."""
    items = [fit_on] if isinstance(fit_on, (str, Corpus, FitSource)) else list(fit_on)
    if not items:
        raise InputError(f"fit_on is empty; give '{TRANSDUCTIVE}' or a corpus (e.g. lee)")
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


def encode_sentences(
    encoder: HFEncoder,
    texts: Sequence[str],
    *,
    layer_indexes: Sequence[int],
    include_special: bool = True,
    progress: Progress | None = None,
) -> np.ndarray:
    """Mean-pooled sentence vectors of the given layers, (len(layer_indexes), n_texts, dim) float32.

    Texts go to the model shortest first, so batches hold similar lengths and little padding."""
    layer_indexes = list(layer_indexes)
    out = np.empty((len(layer_indexes), len(texts), encoder.dim), dtype=np.float32)
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    reporter = progress or NoProgress()
    reporter.start("encode sentences", len(texts), unit="sentences")

    def on_batch(n: int) -> None:
        reporter.advance("encode sentences", n)

    for start in range(0, len(order), ENCODE_CHUNK_SENTENCES):
        rows = order[start : start + ENCODE_CHUNK_SENTENCES]
        vectors = encoder.sentence_embeddings([texts[i] for i in rows], include_special=include_special, on_batch=on_batch)
        out[:, rows] = vectors[layer_indexes]
    return out


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
    layers: Sequence[int | str | LayerSelection | Combined] | None = None,
    methods: Sequence[str] = (NO_CALIBRATION,),
    fit_on: FitOn | Sequence[FitOn] = TRANSDUCTIVE,
    include_special: bool = True,
    seed: int = 0,
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
    """Spearman x 100 of every (dataset, layer selection, method, fit source, aggregation), as tidy
    records that also carry the isotropy of the (calibrated) sentence vectors of that dataset.

    Every distinct sentence (of all datasets and fit corpora) runs through the model once; only the
    layers the selections use are kept. The "none" baseline is always included; its `fit_on` is "none"."""
    if not datasets:
        raise InputError("no datasets to evaluate; read some with find_datasets(data_dir)")
    selections = resolve_layers(layers, encoder.n_layers)
    methods = resolve_methods(methods)
    sources = resolve_fit_sources(fit_on) if len(methods) > 1 else []
    corpora = {s.name: s.sentences for s in sources if s.sentences is not None}
    texts = list(dict.fromkeys([*(t for d in datasets for t in d.sentences), *(t for c in corpora.values() for t in c)]))
    layer_indexes = sorted({i for s in selections for i in s.indexes})
    cache = _VectorCache(
        texts, layer_indexes,
        encode_sentences(encoder, texts, layer_indexes=layer_indexes, include_special=include_special, progress=progress),
    )
    reporter = progress or NoProgress()
    context = {"pooling": "mean", "special_tokens": "included" if include_special else "excluded"}
    reporter.start("evaluate", len(selections) * len(datasets) * (1 + (len(methods) - 1) * len(sources)), unit="scores")
    records: list[dict[str, Any]] = []
    for selection in selections:
        corpus_vectors = {name: cache.pooled(selection, sentences, name=f"{name} sentence vectors") for name, sentences in corpora.items()}
        fitted: dict[tuple[str, str], Calibrator] = {}  # calibrators fitted on a corpus serve every dataset
        for dataset in datasets:
            X = cache.pooled(selection, dataset.sentences, name=f"{dataset.name} sentence vectors")
            settings = {**context, "layer": selection.name, "layer_indexes": list(selection.indexes)}
            records.extend(score_dataset(dataset, X, {**settings, "method": NO_CALIBRATION, "fit_on": NO_CALIBRATION, "n_fit_sentences": 0,
                                                      "few_fit_rows": False}))
            reporter.advance("evaluate")
            for method in methods[1:]:
                for source in sources:
                    if source.sentences is None:
                        calibrator, n_fit = make_calibrator(method, seed=seed).fit(X), len(X)
                    else:
                        key = (method, source.name)
                        if key not in fitted:
                            fitted[key] = make_calibrator(method, seed=seed).fit(corpus_vectors[source.name])
                        calibrator, n_fit = fitted[key], len(corpus_vectors[source.name])
                    # fewer than 2 sentences per dimension: the calibrator warned, and the tables mark the cell
                    fit_settings = {**settings, "method": method, "fit_on": source.name, "n_fit_sentences": n_fit,
                                    "few_fit_rows": calibrator.too_few_rows(n_fit, X.shape[1])}
                    records.extend(score_dataset(dataset, calibrator.transform(X), fit_settings))
                    reporter.advance("evaluate")
    return records


@dataclass
class STSRun:
    """What `run_sts` did: the tidy records, the settings, the terminal's headline grid and best calibration
    per layer (`headline_grid`, `best_calibration`) and the files written."""

    records: list[dict[str, Any]]
    settings: dict[str, Any]
    model_id: str
    summary: tuple[list[str], list[list[str]]]
    paths: list[rundir.Target]
    best: tuple[list[str], list[list[str]]]


def run_sts(
    model: str,
    data: str | os.PathLike[str],
    *,
    layers: Sequence[int | str | LayerSelection | Combined] = ("all", FIRST_LAST_AVG),
    methods: Sequence[str] = (NO_CALIBRATION,),
    fit_on: Sequence[str] = (TRANSDUCTIVE,),
    split: str = "test",
    limit_pairs: int | None = None,
    include_special: bool = True,
    seed: int = 0,
    device: str = "auto",
    out: str | os.PathLike[str] | None = None,
    markdown: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> STSRun:
    """`lmgeom sts`: read every STS set found under `data`, load `model`, evaluate, and write the
    records (`out`: JSON + a CSV beside it) and the summary table (`markdown`) when asked.

    An `out` that already holds STS results of the same model, datasets and options takes these
    records merged in by (layer, method, fit_on): a re-evaluated one replaces its records, the others
    stay (so a run directory's STS file gathers several calls); a file of other results is refused, and
    so is any other file lmgeom did not write at `out`, at the CSV beside it or at `markdown`
    (`rundir.claim_file`) unless `overwrite`."""
    from lmgeom.encoders.hf import HFEncoder
    from lmgeom.encoders.registry import load_encoder

    previous = _previous_results(out, overwrite=overwrite) if out is not None else None  # before the model loads
    if out is not None and previous is None:
        rundir.claim_file(rundir.sts_table(Path(out)), overwrite=overwrite)
    if markdown is not None:
        rundir.claim_file(Path(markdown), overwrite=overwrite, param="markdown")
    methods = resolve_methods(methods)
    # corpora load (and a bad spec fails) before the model does
    sources = resolve_fit_sources(list(fit_on)) if len(methods) > 1 else []
    datasets = find_datasets(data, split=split)
    if limit_pairs is not None:
        datasets = [d.sample(limit_pairs, seed=seed) for d in datasets]
    shared = {
        "model": model,
        "datasets": [{"name": d.name, "split": d.split, "n_pairs": len(d), "source": d.source} for d in datasets],
        "split": split, "limit_pairs": limit_pairs, "pooling": "mean",
        "special_tokens": "included" if include_special else "excluded", "seed": seed,
    }
    if previous is not None and out is not None:
        _require_shared(previous, shared, path=out)  # before the model runs
    encoder = load_encoder(model, device=device)
    if not isinstance(encoder, HFEncoder):
        raise InputError(f"{model} is not a transformers model; the STS evaluation pools tokenizer pieces, which ELMo has not")
    selections = resolve_layers(layers, encoder.n_layers)
    records = evaluate_sts(encoder, datasets, layers=selections, methods=methods, fit_on=sources or TRANSDUCTIVE,
                           include_special=include_special, seed=seed, progress=progress)
    settings = {
        **shared, "data": str(data),
        "layers": [{"name": s.name, "indexes": list(s.indexes)} for s in selections], "methods": methods,
        "fit_on": [{"name": f.name, "n_sentences": len(f.sentences) if f.sentences else None} for f in sources],
    }
    paths: list[rundir.Target] = []
    if out is not None:
        out = Path(out)
        merged = merge_sts(previous, settings, records, path=out)
        paths.append(write_json(out, rundir.STS.kind, merged, store_meta={"model_id": encoder.model_id}))
        paths.append(write_records_csv(rundir.sts_table(out), merged["records"]))
    if markdown is not None:
        paths.append(write_text(Path(markdown), rundir.markdown_mark("lmgeom sts") + markdown_table(*summary_table(records))))
    return STSRun(records, settings, encoder.model_id, headline_grid(records), paths, best_calibration(records))


def _previous_results(out: str | os.PathLike[str], *, overwrite: bool = False) -> dict[str, Any] | None:
    """The STS results already at `out` (None when there are none); a result file of a run, or another
    lmgeom result document, is refused rather than overwritten, and so is a file lmgeom did not write
    unless `overwrite` (then None: it is replaced)."""
    out = Path(out)
    if out.name in rundir.RESERVED_NAMES and rundir.is_run(out.parent):
        raise InputError(f"`out` {out}: {out.name} is a file of the run in {out.parent}; give another name, "
                         f"such as {out.parent / rundir.STS.name}", param="out")
    rundir.claim_file(out, overwrite=overwrite)
    try:
        document = rundir.read_json(out)
    except rundir.ResultFileError as error:
        if overwrite:
            return None
        raise InputError(f"`out` {out} exists and is not STS results ({error}); give another `out`, or pass "
                         "`overwrite=True` to replace it", param=("out", "overwrite")) from None
    if document is not None and document.get("kind") != rundir.STS.kind:
        if document.get("kind") not in rundir.KINDS and overwrite:
            return None
        raise InputError(f"`out` {out} holds results of kind {document.get('kind')!r}, not STS results; "
                         "give another `out`", param="out")
    return document


def merge_sts(document: dict[str, Any] | None, settings: dict[str, Any], records: list[dict[str, Any]], *,
              path: str | os.PathLike[str] = "the results file") -> dict[str, Any]:
    """The payload of an STS results file with `records` merged into `document`'s by (layer, method,
    fit_on); `document` must share `SHARED_SETTINGS` with `settings`."""
    if document is None:
        return {"settings": settings, "records": records}
    _require_shared(document, settings, path=path)
    held = document["settings"]

    def key(record: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(record[name] for name in RECORD_KEY)

    replaced = {key(record) for record in records}
    kept = [record for record in document["records"] if key(record) not in replaced]
    union = {name: list({_settings_key(item): item for item in [*held[name], *settings[name]]}.values())
             for name in MERGED_SETTINGS}
    return {"settings": {**settings, **union}, "records": [*kept, *records]}


def _require_shared(document: dict[str, Any], settings: dict[str, Any], *, path: str | os.PathLike[str]) -> None:
    """Refuse to merge into results made with other `SHARED_SETTINGS` (those in `settings`)."""
    held = document["settings"]
    differ = [name for name in SHARED_SETTINGS if name in settings and held.get(name) != rundir.jsonable(settings[name])]
    if differ:
        values = "; ".join(f"{name} {held.get(name)!r} there, {settings[name]!r} here" for name in differ)
        raise InputError(f"{path} holds STS results with other settings ({values}); give another `out` to keep "
                         "both, or delete it", param="out")


def _settings_key(item: Any) -> str:
    """An item of a settings list as a key (dicts are not hashable)."""
    return json.dumps(rundir.jsonable(item), sort_keys=True)
