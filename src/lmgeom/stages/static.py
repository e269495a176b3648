"""Static word embeddings distilled from a store (Ethayarajh 2019, section 5), and their benchmark scores.

The static embedding of a word at layer l is v1, the first right singular vector of its *uncentred*
occurrence matrix (the first principal component in the paper's uncentred sense), as a unit
vector with its sign chosen so that v1 . mean >= 0 (a singular vector's sign is arbitrary). The
paper's released code saves `TruncatedSVD.components_[0]`, the same direction (a
later PCA version kept the direction of largest spread about the word's mean, which does not point
at the word at all when occurrences form a tight cluster).
Baselines: the mean of the word's occurrences at layer l, and the mean of its layer-0
(embedding output) occurrences.

A store of several capture sites distils the layers of one (`AnalysisOptions.site`): the first-PC
and mean vectors are the site's; the layer-0 baseline is the embedding output, `resid_post`'s layer
0, at every site (no other site has a layer 0).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
from gensim.models import KeyedVectors

from lmgeom.errors import InputError, MissingInput
from lmgeom.corpus.builtin import DEFAULT_DATA_DIR
from lmgeom.evaluate.wordbench import (CATEGORISATION_SEED, DEFAULT_MIN_COVERAGE, MinCoverage, WordLookup,
                                       evaluate_word_benchmarks, find_word_benchmarks, read_word_benchmarks)
from lmgeom.evaluate.wordsim import GENSIM_BENCHMARKS, load_static_vectors, static_vectors_format
from lmgeom.engine import AnalysisOptions, run_analysis
from lmgeom.engine.options import ROW_FIELDS, WORD_FIELDS, StepOptions, protocol_options
from lmgeom.engine.plan import resolved_device
from lmgeom.progress import NoProgress, Progress
from lmgeom import rundir
from lmgeom.rundir import records_csv, write_result_set
from lmgeom.sitespec import DEFAULT_SITE
from lmgeom.store import RepresentationStore

STATIC_KINDS = ("first_pc", "mean", "layer0_mean")


@dataclass
class StaticEmbeddings:
    """Per-word vectors of one layer, words ordered by frequency (most frequent first)."""

    layer: int
    words: list[str]
    counts: np.ndarray
    vectors: dict[str, np.ndarray]  # kind -> (n_words, dim)
    store_meta: dict[str, Any]
    device: str = "cpu"  # where the layer-0 means summed ("cpu", "cuda:0")
    selection: dict[str, Any] = field(default_factory=dict)  # which words have vectors: WORD_SELECTION of the options
    site: str = DEFAULT_SITE  # the capture site of `layer` (`lmgeom.sitespec`)

    def keyed_vectors(self, kind: str = "first_pc") -> KeyedVectors:
        if kind not in self.vectors:
            raise InputError(f"unknown static embedding kind {kind!r}; choose one of {', '.join(self.vectors)}")
        vectors = KeyedVectors(vector_size=self.vectors[kind].shape[1])
        vectors.add_vectors(self.words, self.vectors[kind].astype(np.float32))
        for word, count in zip(self.words, self.counts):
            vectors.set_vecattr(word, "count", int(count))
        return vectors

    def save(self, run: rundir.Where, *, text_path: str | os.PathLike[str] | None = None) -> dict[str, rundir.Target]:
        """STATIC/`<layer>.kv` (gensim) and word2vec text (default STATIC/`<layer>.txt`) of the first-PC
        vectors, in the run directory `run` (a local folder or an fsspec URL)."""
        vectors = self.keyed_vectors("first_pc")
        kv_path = rundir.STATIC_VECTORS.at(run, layer=self.layer)
        text = Path(text_path) if text_path is not None else rundir.STATIC_TEXT.at(run, layer=self.layer)

        def save_kv(path: Path) -> Path:
            vectors.save(str(path))
            return path

        def save_text(path: Path) -> Path:
            vectors.save_word2vec_format(str(path), binary=False)
            return path

        return {"kv": rundir.write_with(kv_path, save_kv), "word2vec_text": rundir.write_with(text, save_text)}


@dataclass
class LayerVectors:
    """The first-PC vectors of the analysed words of one layer that have one (a word whose
    occurrences are all zero vectors has no direction), most frequent first."""

    words: pd.DataFrame  # the analysed words (word_id, word, count, contexts)
    order: np.ndarray  # indexes into `words`, most frequent first
    first_pc: np.ndarray  # (len(order), dim)
    mean: np.ndarray  # (len(order), dim): each word's mean occurrence


def first_pc_vectors(store: RepresentationStore, layer: int, options: AnalysisOptions) -> LayerVectors:
    """The first-PC vectors and means at `layer` of the words `options` analyses (`statistics`
    `first_pc`, from one read of the layer on the engine: one MEV word group in memory at a time)."""
    analysis = run_analysis(store, options.replace(layers=(layer,), statistics=("first_pc",)))
    values, words = analysis.layers[layer], analysis.rows.words.words
    present = np.flatnonzero(values["has_vector"])
    order = present[np.argsort(-words["count"].to_numpy()[present], kind="stable")]
    return LayerVectors(words, order, values["first_pc"][order], values["first_pc_mean"][order])


# the options that say which words have vectors (recorded in the benchmark files)
WORD_SELECTION = ("min_contexts", "count_by", "include_punct", "include_special", "exclude_first_word", "protocol")


@dataclass(frozen=True)
class StaticOptions(StepOptions):
    """The static-embeddings step's options: the words that get vectors (`analysis`' word threshold
    and rows; by default those the contextuality analysis keeps), the capture site distilled
    (`analysis.site`, by default `resid_post`; the settings record another) and `data_dir`, the folder whose
    word benchmarks are scored (None: ../shared/data or LMGEOM_DATA), and `min_coverage`, the fewest
    covered items a covered-items score needs to be a headline number (`MinCoverage`: "50,10%" by
    default; a score below it is kept with `enough_items` false and shown as "too few items")."""

    data_dir: str | None = None
    min_coverage: str = str(DEFAULT_MIN_COVERAGE)
    ANALYSIS_FIELDS: ClassVar[tuple[str, ...]] = (*ROW_FIELDS, *WORD_FIELDS)

    def __post_init__(self) -> None:
        object.__setattr__(self, "min_coverage", str(MinCoverage.parse(self.min_coverage)))

    @classmethod
    def of(cls, *, min_contexts: int | None = None, count_by: str | None = None, include_punct: bool | None = None,
           protocol: str | None = None, data_dir: str | os.PathLike[str] | None = None, device: str = "cpu",
           min_coverage: str | MinCoverage = DEFAULT_MIN_COVERAGE, site: str = DEFAULT_SITE) -> StaticOptions:
        """The options from the flags of `lmgeom static-embeddings`: `protocol` sets the words as that
        protocol does (`PROTOCOLS`), and a given option it sets otherwise is refused; `site` the capture
        site distilled."""
        chosen = protocol_options(protocol, min_contexts=min_contexts, count_by=count_by, include_punct=include_punct)
        chosen.pop("statistics", None)  # the distillation computes its own
        return cls(AnalysisOptions(**chosen, device=device, site=site), data_dir=None if data_dir is None else str(data_dir),
                   min_coverage=str(MinCoverage.parse(min_coverage)))


def static_embeddings(
    store: RepresentationStore | str | os.PathLike[str],
    options: AnalysisOptions = AnalysisOptions(),
    *,
    layer: int,
    **keywords: Any,
) -> StaticEmbeddings:
    """First-PC, mean and layer-0-mean vectors at `layer` (of the capture site `options.site`) for the
    words `options` (or its fields as `keywords`) analyses: by default the words the analysis keeps
    (`min_contexts` `DEFAULT_MIN_CONTEXTS` sentences; rows chosen by the row selection of
    `lmgeom.engine.selection`); the layer-0 means are the embedding output's (`resid_post`) at every
    site, and none come from a store without layer 0."""
    options = options.replace(**keywords)
    store = RepresentationStore.of(store).at_site(options.site)  # a site the store does not hold is refused here
    store.layer(layer)  # an unknown layer is an IndexError naming the range
    layer = layer + store.n_model_layers if layer < 0 else layer
    vectors = first_pc_vectors(store, layer, options)
    kinds = {"first_pc": vectors.first_pc, "mean": vectors.mean}
    if layer == 0:
        kinds["layer0_mean"] = vectors.mean
    elif 0 in store.site_layers(DEFAULT_SITE):
        means = run_analysis(store, options.replace(layers=(0,), statistics=("word_mean",), site=DEFAULT_SITE))
        kinds["layer0_mean"] = means.layers[0]["word_mean"][vectors.order]
    device = resolved_device(options.device)
    return StaticEmbeddings(
        layer=layer,
        words=vectors.words["word"].to_numpy()[vectors.order].tolist(),
        counts=vectors.words["count"].to_numpy()[vectors.order],
        vectors=kinds,
        store_meta=dict(store.meta),
        device=device,
        selection={name: getattr(options, name) for name in WORD_SELECTION},
        site=options.site,
    )


def restrict_to_words(vectors: KeyedVectors, words: Sequence[str]) -> KeyedVectors:
    """The vectors of `vectors` whose key lowercases to one of `words` (lowercased), in their order."""
    wanted = {word.lower() for word in words}
    keys = [key for key in vectors.index_to_key if key.lower() in wanted]
    restricted = KeyedVectors(vector_size=vectors.vector_size)
    if keys:
        restricted.add_vectors(keys, np.stack([vectors[key] for key in keys]))
    return restricted


def _restricted_vectors(path: str | os.PathLike[str], words: Sequence[str], trust_pickle: bool) -> KeyedVectors:
    return restrict_to_words(load_static_vectors(path, trust_pickle=trust_pickle), words)


def default_word_benchmarks(data_dir: str | os.PathLike[str] | None = None) -> tuple[dict[str, Path], dict[str, str]]:
    """gensim's SimLex-999, WordSim-353 and Google analogies plus every set of Ethayarajh (2019)'s Table 1
    found under `data_dir` (default ../shared/data or LMGEOM_DATA); and why each other set is not scored."""
    found, skipped = find_word_benchmarks(DEFAULT_DATA_DIR if data_dir is None else data_dir)
    return {**GENSIM_BENCHMARKS, **found}, skipped


def benchmark_static_embeddings(
    embeddings: StaticEmbeddings,
    *,
    benchmarks: Mapping[str, str | os.PathLike[str]] | None = None,
    static_vectors: Sequence[str | os.PathLike[str]] = (),
    trust_pickle: bool = False,
    min_coverage: MinCoverage | str = DEFAULT_MIN_COVERAGE,
    progress: Progress | None = None,
) -> pd.DataFrame:
    """Scores of first-PC, mean, layer-0 and any given static vectors, on the store's vocabulary, in
    both protocols (`score`: covered items only; `score_oov_mean`: every item, out-of-vocabulary
    words as the mean unit vector; see `lmgeom.evaluate.wordbench`).

    `benchmarks` defaults to `default_word_benchmarks()`. Given static vectors are restricted to the
    words the store covers, so every row has the same vocabulary. Categorisation clusterings are
    seeded with CATEGORISATION_SEED. `enough_items` says whether a covered-items score rests on the items
    `min_coverage` asks.
    Given static vectors are read by `lmgeom.evaluate.load_static_vectors` (a gensim `.kv` is a pickle,
    which can run code: refused unless `trust_pickle`).
    """
    loaded = read_word_benchmarks(default_word_benchmarks()[0] if benchmarks is None else benchmarks)
    candidates: dict[str, Callable[[], KeyedVectors]] = {
        f"{kind} (layer {embeddings.layer if kind != 'layer0_mean' else 0})": partial(embeddings.keyed_vectors, kind)
        for kind in STATIC_KINDS if kind in embeddings.vectors
    }
    for path in static_vectors:
        candidates[_static_label(path)] = partial(_restricted_vectors, path, embeddings.words, trust_pickle)
    progress = progress or NoProgress()
    progress.start("score vectors", len(candidates), unit="vector sets")
    records = []
    for label, load in candidates.items():
        vectors = load()
        for record in evaluate_word_benchmarks(WordLookup.from_keyed_vectors(vectors), loaded, min_coverage=min_coverage):
            records.append({"vectors": label, "layer": embeddings.layer, "n_vectors": len(vectors), **record})
        progress.advance("score vectors", note=label)
    return pd.DataFrame(records)


def _static_label(path: str | os.PathLike[str]) -> str:
    """The `vectors` label of the scores of given static vectors."""
    return f"static: {Path(path).name}"


def _keep_richer_scores(run: rundir.Where, layer: int, *, benchmarks: set[str], skipped: Mapping[str, str], vectors: set[str]) -> None:
    """Refuse to replace the benchmarks record of `layer` in `run` with one scoring fewer `benchmarks`
    or fewer given static `vectors` than it holds (a record that does not read is replaced)."""
    path = rundir.STATIC_BENCHMARKS.at(run, layer=layer)
    try:
        document = rundir.read_json(path, rundir.STATIC_BENCHMARKS.kind)
    except rundir.ResultFileError:
        return
    records = [record for record in (document or {}).get("records", []) if isinstance(record, Mapping)]
    lost_benchmarks = sorted({str(record.get("benchmark")) for record in records} - benchmarks)
    lost_vectors = sorted({str(record.get("vectors")) for record in records
                           if str(record.get("vectors")).startswith(_static_label(""))} - vectors)
    if not lost_benchmarks and not lost_vectors:
        return
    lost = []
    if lost_benchmarks:
        reasons = "; ".join(f"{name}: {skipped[name]}" for name in lost_benchmarks if name in skipped)
        lost.append(f"the benchmark(s) {', '.join(lost_benchmarks)}{f' ({reasons})' if reasons else ''}")
    if lost_vectors:
        lost.append(f"the static vectors {', '.join(label.removeprefix(_static_label('')) for label in lost_vectors)}")
    raise InputError(f"{path} holds scores on {' and '.join(lost)}, which this export would not score again; nothing "
                     "was written. Give the `data_dir` (and `benchmarks`, `static_vectors`) the earlier export had, "
                     "or pass `overwrite=True` to replace it with fewer scores",
                     param=("data_dir", "benchmarks", "static_vectors", "overwrite"))


def write_benchmarks(scores: pd.DataFrame, embeddings: StaticEmbeddings, run: rundir.Where, *,
                     skipped: Mapping[str, str] | None = None, settings: Mapping[str, Any] | None = None) -> dict[str, rundir.Target]:
    """STATIC/`<layer>.benchmarks.json` (with why any benchmark was `skipped`; `settings`: the step's,
    `StaticOptions.to_settings()`, recorded as its provenance) and `.csv` in the run `run`."""
    payload = {
        "layer": embeddings.layer,
        "n_words": len(embeddings.words),
        "static_embedding": "first right singular vector of the uncentred occurrence matrix, unit length, sign with the mean",
        "case": "benchmarks matched case-insensitively to the most frequent casing in the store",
        "protocols": {"score": "oov=skip: covered items only",
                      "score_oov_mean": "oov=mean: every item, out-of-vocabulary words as the mean of the "
                                        "L2-normalised vectors (the web package's protocol)"},
        "categorisation_seed": CATEGORISATION_SEED,
        "headline": "score (covered items): it measures the vectors themselves; score_oov_mean scores every item "
                    "(the paper's protocol) but also charges the vectors for the words the corpus lacks",
        "settings": {**embeddings.selection, **({"site": embeddings.site} if embeddings.site != DEFAULT_SITE else {})},
        "skipped": dict(skipped or {}),
        "device": embeddings.device,
        "records": scores.to_dict("records"),
    }
    table = rundir.STATIC_BENCHMARKS_CSV.at(run, layer=embeddings.layer)
    document, csv = write_result_set(rundir.STATIC_BENCHMARKS.at(run, layer=embeddings.layer), rundir.STATIC_BENCHMARKS.kind,
                                     payload, store_meta=embeddings.store_meta, settings=settings,
                                     companions=[(table, records_csv(scores.to_dict("records")))])
    return {"json": document, "csv": csv}


def read_benchmark_records(run: rundir.Where, layers: Iterable[int]) -> pd.DataFrame:
    """The records of STATIC/`<layer>.benchmarks.json` of each of `layers` in the run `run` (a layer
    without one is left out), one frame."""
    frames = []
    for layer in layers:
        document = rundir.read_json(rundir.STATIC_BENCHMARKS.at(run, layer=layer), rundir.STATIC_BENCHMARKS.kind)
        if document is not None:
            frames.append(pd.DataFrame(list(document.get("records", []))))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


@dataclass
class StaticEmbeddingRun:
    embeddings: StaticEmbeddings
    scores: pd.DataFrame
    paths: dict[str, rundir.Target]
    skipped: dict[str, str]  # benchmark -> why it was not scored


def export_static_embeddings(
    store: RepresentationStore | str | os.PathLike[str],
    options: StaticOptions = StaticOptions(),
    *,
    layer: int,
    text_path: str | os.PathLike[str] | None = None,
    benchmarks: Sequence[str | os.PathLike[str]] = (),
    static_vectors: Sequence[str | os.PathLike[str]] = (),
    trust_pickle: bool = False,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> StaticEmbeddingRun:
    """Distil a layer's static embeddings, save them under STORE/static/ (gensim `.kv` and word2vec text,
    or `text_path`), and score them on `default_word_benchmarks(options.data_dir)` plus `benchmarks` next to
    `static_vectors`, in both protocols; the scores go to STORE/static/<layer>.benchmarks.json and .csv.
    A layer of another capture site than `resid_post` (`options.analysis.site`) is distilled and its
    files written alike in the site's results folder, STORE/site_results/<site>/static/
    (`rundir.site_results`); a site the store does not hold is refused before any work.
    A benchmark missing from the data folder is skipped, its reason kept in the JSON. A `.kv` among
    `static_vectors` is a pickle, loaded only with `trust_pickle` (see `benchmark_static_embeddings`).
    Words: those `options` keep (`StaticOptions`: by default the analysis's, words of at least
    `DEFAULT_MIN_CONTEXTS` distinct sentences, no punctuation; `StaticOptions.of` builds them from
    the command's flags and a protocol).

    Before any work, and unless `overwrite`: an existing `text_path` lmgeom did not write
    (`rundir.claim_file`) is refused, and so is a run whose benchmarks record of `layer` holds scores this
    export would not write again (benchmarks the data folder lacks, static vectors not given): nothing is
    replaced by less. A `data_dir` that is not a folder is refused."""
    store = RepresentationStore.of(store).at_site(options.analysis.site)  # a site the store lacks is refused here
    folder = rundir.site_results(store.url, options.analysis.site)
    for path in [*benchmarks, *static_vectors]:
        if not Path(path).exists():
            raise FileNotFoundError(f"{path} does not exist")
    data_dir = options.data_dir
    if data_dir is not None and not Path(data_dir).is_dir():
        raise MissingInput(f"`data_dir` {data_dir} is not a folder; give the folder holding the word benchmarks "
                           f"(as {DEFAULT_DATA_DIR} does), or leave it out", param="data_dir")
    for path in static_vectors:  # before the distillation: a refused file fails at once
        static_vectors_format(path, trust_pickle=trust_pickle)
    if text_path is not None:
        rundir.claim_file(rundir.target(text_path), overwrite=overwrite, param="text_path")
    found, skipped = default_word_benchmarks(data_dir)
    given = {Path(path).stem: path for path in benchmarks}
    skipped = {name: reason for name, reason in skipped.items() if name not in given}
    read_word_benchmarks(given)  # a given benchmark that does not read fails before the distillation
    if not overwrite:
        _keep_richer_scores(folder, layer, benchmarks={*found, *given}, skipped=skipped,
                            vectors={_static_label(path) for path in static_vectors})
    progress = progress or NoProgress()
    progress.start(f"distil layer {layer}", 1, unit="layers")
    embeddings = static_embeddings(store, options.analysis, layer=layer)
    progress.advance(f"distil layer {layer}")
    saved = embeddings.save(folder, text_path=text_path)
    scores = benchmark_static_embeddings(embeddings, benchmarks={**found, **given}, static_vectors=static_vectors,
                                         trust_pickle=trust_pickle, min_coverage=options.min_coverage, progress=progress)
    written = write_benchmarks(scores, embeddings, folder, skipped=skipped, settings=options.to_settings())
    return StaticEmbeddingRun(embeddings, scores, {**saved, **written}, skipped)
