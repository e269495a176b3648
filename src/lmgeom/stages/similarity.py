"""Layer x layer similarity within one store, or between two stores of the same corpus
(`lmgeom similarity`): the measures of `lmgeom.metrics.similarity` on rows matched by word occurrence.

Rows are matched across stores by corpus word occurrence: each stored word is located in its
sentence's text (the words of a store are spans of the text, in order), and its key is its
character offset in the corpus (the sentences' texts back to back). Two stores of one corpus
(equal `corpus_fingerprint` in meta.json) share the texts, so equal keys are the same word
occurrence whatever each model's tokenizer made of it. The rows of each store are first those of
the analysis's row selection (`lmgeom.engine.selection.select_rows`: words, no punctuation, no
special tokens by default); a word one store lacks (one its tokenizer could not align, or a row
another selection left out) is dropped from both sides, and the dropped rows are counted.

CKA and the Procrustes distance run on the analysis engine: a pair plan
(`lmgeom.engine.pairs`) streams every matched row through the registered pair statistics
(`CrossMoments`), one accumulator per pair of layers and one per layer (its self pair); pairs are
grouped so that a task's states stay under `max_state_bytes`, each task one aligned read of its
layers, on the executor the options name. RSA, mutual k-NN and the permutation nulls run on one
seeded subsample of `sample` matched rows, read once (`lmgeom.metrics.similarity.permutation_nulls`):
every measure is computed there as well, unshuffled and with the rows of the second side shuffled
`permutations` times (`procrustes_permutations` for the Procrustes distance, whose shuffles need an
SVD each), and its p-value compares the two on the subsample.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lmgeom.errors import InputError
from lmgeom.layerspec import LayerSpec, select_layers
from lmgeom.metrics.contextuality import sample_indexes
from lmgeom.metrics.similarity import (
    DEFAULT_K,
    DEFAULT_PERMUTATIONS,
    DEFAULT_PROCRUSTES_PERMUTATIONS,
    LOWER_IS_CLOSER,
    MEASURES,
    STREAMED_MEASURES,
    knn_chance,
    permutation_nulls,
    permutations,
    summarise_null,
)
from lmgeom.progress import NoProgress, Progress
from lmgeom import rundir
from lmgeom.engine.selection import SELECTION_COLUMNS, select_rows
from lmgeom.engine import AnalysisOptions, LocalExecutor, executor_for
from lmgeom.engine.options import ENGINES
from lmgeom.engine.pairs import Job, PairMerger, PairPlan, PairWork, plan_pairs
from lmgeom.engine.loop import DEFAULT_CHUNK_ROWS, read_rows
from lmgeom.sitespec import DEFAULT_SITE, check_site
from lmgeom.store import RepresentationStore

DEFAULT_SAMPLE = 2000
DEFAULT_MAX_STATE_BYTES = 2 << 30
CORPUS_FIELDS = ("corpus_fingerprint", "corpus_name", "n_corpus_sentences", "pretokenized")
"""The meta.json fields that say which corpus a store holds; the fingerprint decides."""


@dataclass(frozen=True)
class SimilarityOptions:
    """What `similarity_matrix` computes: `measures` (of `MEASURES`), on `layers` (a `lmgeom.layerspec`
    spec; None: all) of the first store and `layers_b` of the second (None: the same as `layers`), RSA, mutual k-NN (`k`
    neighbours) and the permutation nulls on a seeded subsample of `sample` rows, on the analysis's
    row selection. The null of CKA, RSA and mutual k-NN has `permutations` shuffles (default 200:
    each indexes the subsample's Gram matrices, ranks and neighbour lists, one m x m gather per
    layer and one matrix product; the smallest p-value is 1/201); the Procrustes distance's has
    `procrustes_permutations` (default 20: each needs an SVD of a cross-covariance of the layers'
    dimension per pair of layers, so 20 cost 20 values on the subsample; the smallest p-value,
    1/21, is below 0.05). 0 shuffles: no null and no p-value (None in the files). How the streamed
    measures run (the analysis engine's terms,
    `lmgeom.engine.AnalysisOptions`): `chunk_rows` matched rows read at a time, tasks holding
    at most `max_state_bytes` of accumulator states, `row_parts` row ranges each, on `engine` with
    `num_workers` at once (`ray_address`: the Ray cluster), computing on `device`. `site`: the capture
    site whose layers are compared (`lmgeom.sitespec`), the same site of both stores, which must both
    hold it; by default `resid_post`; the settings record it when it is another."""

    measures: tuple[str, ...] = MEASURES
    layers: LayerSpec = None
    layers_b: LayerSpec = None
    sample: int = DEFAULT_SAMPLE
    seed: int = 0
    k: int = DEFAULT_K
    permutations: int = DEFAULT_PERMUTATIONS
    procrustes_permutations: int = DEFAULT_PROCRUSTES_PERMUTATIONS
    include_punct: bool = False
    include_special: bool = False
    exclude_first_word: bool = False
    site: str = DEFAULT_SITE
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    max_state_bytes: int = DEFAULT_MAX_STATE_BYTES
    device: str = "cpu"
    engine: str = "auto"
    num_workers: int = 1
    row_parts: int = 1
    ray_address: str | None = None

    def __post_init__(self) -> None:
        check_site(self.site, param="site")
        unknown = [measure for measure in self.measures if measure not in MEASURES]
        if unknown or not self.measures:
            raise InputError(f"unknown `measures` {unknown or '(none given)'}; choose from {', '.join(MEASURES)}",
                             param="measures")
        for name, low in (("sample", 4), ("k", 1), ("permutations", 0), ("procrustes_permutations", 0), ("chunk_rows", 1),
                          ("seed", 0), ("num_workers", 1), ("row_parts", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise InputError(f"`{name}` must be a whole number, got {value!r}", param=name)
            if value < low:
                raise InputError(f"`{name}` must be at least {low}, got {value}", param=name)

        if self.engine not in ENGINES:
            raise InputError(f"unknown `engine` {self.engine!r}; use one of {', '.join(ENGINES)}", param="engine")

    def to_settings(self) -> dict[str, Any]:
        """What the options compute (not how: the chunks, tasks, executor and device change no
        number beyond rounding), as run.json records a step's settings."""
        return {"measures": list(self.measures), "layers": _spec_setting(self.layers),
                "layers_b": _spec_setting(self.layers_b), "sample": self.sample, "seed": self.seed,
                "k": self.k, "permutations": self.permutations, "procrustes_permutations": self.procrustes_permutations,
                "include_punct": self.include_punct,
                "include_special": self.include_special, "exclude_first_word": self.exclude_first_word,
                **({"site": self.site} if self.site != DEFAULT_SITE else {})}

    def shuffles(self, measure: str) -> int:
        """The shuffles of `measure`'s null: `procrustes_permutations` for the Procrustes distance,
        `permutations` for the others."""
        return self.procrustes_permutations if measure == "procrustes" else self.permutations


@dataclass
class SimilarityResult:
    """Per measure layers_a x layers_b matrices: `values` (CKA and Procrustes over every matched
    row, RSA and mutual k-NN on the subsample), `sample_values` (on the subsample: RSA, mutual k-NN
    and every measure with a null, what the null is compared with), the permutation null's mean (`null`) and standard deviation
    (`null_sd`) and the p-value (`p_values`), the latter three for the measures with shuffles
    (`permutations`: their number per measure); `chance`: the chance level of mutual k-NN,
    k / (m - 1) on m sampled rows; tidy `records`, and the `counts` of the row matching."""

    stores: list[dict[str, Any]]
    layers_a: list[int]
    layers_b: list[int]
    values: dict[str, np.ndarray]
    null: dict[str, np.ndarray]
    counts: dict[str, int]
    settings: dict[str, Any]
    paths: list[rundir.Target] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)  # `SimilarityOptions.to_settings()`: the files' provenance
    sample_values: dict[str, np.ndarray] = field(default_factory=dict)
    null_sd: dict[str, np.ndarray] = field(default_factory=dict)
    p_values: dict[str, np.ndarray] = field(default_factory=dict)
    permutations: dict[str, int] = field(default_factory=dict)
    chance: dict[str, float] = field(default_factory=dict)

    @property
    def records(self) -> list[dict[str, Any]]:
        """One per measure and pair of layers: value, sample_value, null (mean), null_sd, p_value,
        permutations and chance (None where a measure has none)."""
        def cell(tables: dict[str, np.ndarray], measure: str, i: int, j: int) -> float | None:
            return float(tables[measure][i, j]) if measure in tables else None

        return [{"layer_a": la, "layer_b": lb, "measure": measure, "value": float(self.values[measure][i, j]),
                 "sample_value": cell(self.sample_values, measure, i, j), "null": cell(self.null, measure, i, j),
                 "null_sd": cell(self.null_sd, measure, i, j), "p_value": cell(self.p_values, measure, i, j),
                 "permutations": self.permutations.get(measure, 0), "chance": self.chance.get(measure)}
                for measure in self.values for i, la in enumerate(self.layers_a) for j, lb in enumerate(self.layers_b)]


@dataclass(frozen=True)
class MatchedRows:
    """The rows of two stores (or one store twice) that hold the same word occurrences, in corpus order."""

    rows_a: np.ndarray
    rows_b: np.ndarray
    counts: dict[str, int]


# ---------------------------------------------------------------------------------------------
# row matching


def require_same_corpus(a: RepresentationStore, b: RepresentationStore) -> None:
    """Refuse two stores of different corpora, naming the meta.json fields that differ."""
    if a.meta.get("corpus_fingerprint") == b.meta.get("corpus_fingerprint"):
        return
    differ = [f"{name} {a.meta.get(name)!r} against {b.meta.get(name)!r}" for name in (*CORPUS_FIELDS, "corpus_source")
              if a.meta.get(name) != b.meta.get(name)]
    raise InputError(f"{a.url} and {b.url} hold different corpora ({'; '.join(differ)}): rows can be matched only "
                     "within one corpus; extract both models from the same corpus (the same --corpus, --limit and --sample)")


def corpus_offsets(store: RepresentationStore) -> tuple[np.ndarray, np.ndarray]:
    """Per store row, the character offset of its word in the corpus (the sentence texts back to
    back; -1 for special tokens) and the word's length: each stored word is found in its sentence's
    text after the one before it."""
    tokens = store.token_columns("sentence_id", "word", "is_special")
    texts = store.sentences["text"].tolist()
    first = np.concatenate([[0], np.cumsum([len(text) for text in texts])]).astype(np.int64)
    offsets = np.full(len(tokens), -1, dtype=np.int64)
    lengths = np.zeros(len(tokens), dtype=np.int64)
    sentence_ids = tokens["sentence_id"].to_numpy()
    special = tokens["is_special"].to_numpy(dtype=bool)
    current, cursor = -1, 0
    for row, (sentence, word) in enumerate(zip(sentence_ids.tolist(), tokens["word"].tolist())):
        if sentence != current:
            current, cursor = sentence, 0
        if special[row]:
            continue
        found = texts[sentence].find(word, cursor)
        if found < 0:
            raise InputError(f"{store.url}: row {row}'s word {word!r} is not in sentence {sentence}'s text after "
                             f"character {cursor}; the store's tables are damaged: run `lmgeom verify {store.url}`")
        offsets[row], lengths[row] = first[sentence] + found, len(word)
        cursor = found + len(word)
    return offsets, lengths


def match_rows(a: RepresentationStore, b: RepresentationStore | None, options: SimilarityOptions) -> MatchedRows:
    """The selected rows of `a` and, for a second store `b`, of `b` at the same word occurrences."""
    selection_a = _selection(a, options)
    if b is None:
        rows = selection_a.rows
        return MatchedRows(rows, rows, {"rows_matched": len(rows), **{f"a_{k}": v for k, v in selection_a.counts.items()}})
    require_same_corpus(a, b)
    selection_b = _selection(b, options)
    (offsets_a, lengths_a), (offsets_b, lengths_b) = corpus_offsets(a), corpus_offsets(b)
    rows_a, rows_b = selection_a.rows, selection_b.rows
    words_a, words_b = rows_a[offsets_a[rows_a] >= 0], rows_b[offsets_b[rows_b] >= 0]  # special tokens are no corpus words
    _, in_a, in_b = np.intersect1d(offsets_a[words_a], offsets_b[words_b], assume_unique=True, return_indices=True)
    matched_a, matched_b = words_a[in_a], words_b[in_b]
    if (lengths_a[matched_a] != lengths_b[matched_b]).any():
        bad = int(np.flatnonzero(lengths_a[matched_a] != lengths_b[matched_b])[0])
        raise InputError(f"{a.url} row {matched_a[bad]} and {b.url} row {matched_b[bad]} start at the same corpus "
                         "character but hold words of different lengths: the two stores segment the corpus differently")
    if not len(matched_a):
        raise InputError(f"{a.url} and {b.url} share no selected word occurrence")
    counts = {"rows_matched": len(matched_a),
              **{f"a_{k}": v for k, v in selection_a.counts.items()}, "a_rows_unmatched": len(rows_a) - len(matched_a),
              **{f"b_{k}": v for k, v in selection_b.counts.items()}, "b_rows_unmatched": len(rows_b) - len(matched_b)}
    return MatchedRows(matched_a, matched_b, counts)


def _selection(store: RepresentationStore, options: SimilarityOptions) -> Any:
    return select_rows(store.token_columns(*SELECTION_COLUMNS), include_special=options.include_special,
                       include_punct=options.include_punct, exclude_first_word=options.exclude_first_word)


# ---------------------------------------------------------------------------------------------
# the driver


def _spec_setting(spec: LayerSpec) -> str | list[int] | None:
    return spec if spec is None or isinstance(spec, str) else [int(layer) for layer in spec]


def _layers(store: RepresentationStore, layers: LayerSpec, param: str = "layers") -> list[int]:
    """The store's layers that `layers` names (`lmgeom.layerspec`; None: every stored layer)."""
    return select_layers(layers, store.layers, n_layers=store.n_model_layers, param=param)




def similarity_matrix(store_a: str | os.PathLike[str] | RepresentationStore,
                      store_b: str | os.PathLike[str] | RepresentationStore | None = None,
                      options: SimilarityOptions | None = None, *, progress: Progress | None = None) -> SimilarityResult:
    """Layer x layer similarity of `store_a` with itself, or with `store_b` over the same word
    occurrences (see the module docstring), at the capture site `options.site` of each (a store that
    does not hold it is an `InputError` naming the sites it holds); nothing is written
    (`write_similarity` writes it)."""
    options = options or SimilarityOptions()
    progress = progress or NoProgress()
    a = _at_site(RepresentationStore.of(store_a), options.site, None if store_b is None else "first")
    b = None if store_b is None else _at_site(RepresentationStore.of(store_b), options.site, "second")
    stores = [a, b if b is not None else a]
    if b is None and options.layers_b is not None:
        raise InputError("`layers_b` names the second store's layers; give a second store, or use `layers` alone",
                         param="layers_b")
    layers_a = _layers(a, options.layers)
    layers_b = (_layers(stores[1], options.layers) if options.layers_b is None
                else _layers(stores[1], options.layers_b, "layers_b"))
    matched = match_rows(a, b, options)
    rows = [matched.rows_a, matched.rows_b]
    n = len(rows[0])
    if n < 4:
        raise InputError(f"only {n} matched rows: similarity needs at least 4; use a bigger corpus")
    within = b is None
    pairs = [(i, j) for i in range(len(layers_a)) for j in range(len(layers_b)) if not within or j >= i]
    streamed = [m for m in options.measures if m in STREAMED_MEASURES]
    values = {m: np.full((len(layers_a), len(layers_b)), np.nan) for m in options.measures}

    engine: dict[str, Any] = {}
    if streamed:
        sides = [((0, layers_a[i]), (0 if within else 1, layers_b[j])) for i, j in pairs]
        merger, plan, executor = _stream(stores, matched, sides, options, progress)
        for (i, j), (side_x, side_y) in zip(pairs, sides):
            measures = merger.measures(side_x, side_y)
            for measure in streamed:
                values[measure][i, j] = measures[measure]
        engine = {"plan": plan.to_json(), "executor": executor}

    tests = _subsample_measures(stores, rows, layers_a, layers_b, pairs, options, values, progress)
    if within:
        lower = np.tril_indices(len(layers_a), -1)
        for table in (*values.values(), *(t for kind in tests.tables.values() for t in kind.values())):
            table[lower] = table.T[lower]
    sample = min(options.sample, n)
    for store in {id(s): s for s in stores}.values():
        store.check_unchanged()
    settings = {"measures": list(options.measures), "layers_a": layers_a, "layers_b": layers_b,
                **({"site": options.site} if options.site != DEFAULT_SITE else {}),
                "sample": sample, "seed": options.seed, "k": options.k,
                "permutations": options.permutations, "procrustes_permutations": options.procrustes_permutations,
                "include_punct": options.include_punct,
                "include_special": options.include_special, "exclude_first_word": options.exclude_first_word,
                "rows": "matched by corpus word occurrence (character offset in the corpus)" if not within else "the row selection",
                "streamed": "cka, cka_debiased and procrustes over every matched row",
                "subsample": "rsa and knn, and every null, on the seeded subsample of `sample` matched rows",
                "sample_values": "every measure on the subsample, unshuffled: what its null is compared with",
                "null": ("each measure with the rows of the column side (store b) shuffled on the subsample, "
                         "`permutations` seeded shuffles (`procrustes_permutations` for procrustes); "
                         "`null` is their mean, `null_sd` their standard deviation"),
                "p_value": ("one-sided permutation p-value (1 + #null values at least as similar as the sample value) / "
                            "(1 + shuffles): null >= value for cka, cka_debiased, rsa and knn, null <= value for procrustes "
                            "(a distance); none without shuffles"),
                "knn_chance": "expected mutual k-NN overlap of unrelated neighbour lists: k / (sample - 1)",
                "procrustes_unit": "radians", **engine,
                **({"knn_not_computed": f"mutual k-NN with k = {options.k} needs more than {options.k} sampled rows; "
                                        f"this corpus gives {sample}"}
                   if "knn" in options.measures and not options.k < sample else {})}
    described = [{"url": s.url, "model_id": s.meta.get("model_id"), "corpus_fingerprint": s.meta.get("corpus_fingerprint"),
                  "generation": s.meta.get("generation")} for s in ([a] if within else stores)]
    return SimilarityResult(described, layers_a, layers_b, values, tests.tables["null"], {**matched.counts, "sample": sample},
                            settings, options=options.to_settings(), sample_values=tests.tables["sample_values"],
                            null_sd=tests.tables["null_sd"], p_values=tests.tables["p_values"],
                            permutations=tests.permutations, chance=tests.chance)


def _at_site(store: RepresentationStore, site: str, which: str | None) -> RepresentationStore:
    """`store` read at capture site `site`; one that does not hold it is refused naming the sites it
    holds (and, of two stores, `which` one it is)."""
    if site in store.sites or which is None:
        return store.at_site(site)  # one store: its own refusal names the sites it holds
    raise InputError(f"`site` {site!r} is not stored in the {which} store {store.url}, which holds the sites "
                     f"{', '.join(store.sites)}: similarity compares the same site of both stores; choose a site both "
                     "hold, or extract that store again capturing it (`sites`)", param=("site", "sites"))


def _stream(stores: list[RepresentationStore], matched: MatchedRows, pairs: list[Job], options: SimilarityOptions,
            progress: Progress) -> tuple[PairMerger, PairPlan, str]:
    """The pair statistics of every pair of sides (and every side's self pair) over every matched
    row: a pair plan (`lmgeom.engine.pairs`) run on the options' executor and merged."""
    plan, rows = plan_pairs(stores, (matched.rows_a, matched.rows_b), pairs,
                            measures=options.measures, chunk_rows=options.chunk_rows,
                            max_state_bytes=options.max_state_bytes, row_parts=options.row_parts, device=options.device)
    how = AnalysisOptions(engine=options.engine, num_workers=options.num_workers, ray_address=options.ray_address)
    # a memory:// store lives in this process: its tasks run here
    in_memory = any(store.url.startswith("memory://") for store in stores)
    executor = LocalExecutor() if in_memory else executor_for(how)
    merger = PairMerger(plan)
    progress.start("similarity", len(plan.tasks), unit="tasks")
    for output in executor.run(stores[0], PairWork(plan, rows), plan.tasks):
        merger.add(output)
        progress.advance("similarity")
    return merger, plan, executor.name


@dataclass
class _SubsampleTests:
    """The driver's tables from the subsample: `tables` holds sample_values, null (mean), null_sd and
    p_values, each measure -> layers_a x layers_b; `permutations` per measure with a null."""

    tables: dict[str, dict[str, np.ndarray]]
    permutations: dict[str, int]
    chance: dict[str, float]


def _subsample_measures(stores: list[RepresentationStore], rows: list[np.ndarray], layers_a: list[int], layers_b: list[int],
                        pairs: list[tuple[int, int]], options: SimilarityOptions, values: dict[str, np.ndarray],
                        progress: Progress) -> _SubsampleTests:
    """RSA and mutual k-NN (into `values`), and every measure's permutation test on the subsample."""
    n = len(rows[0])
    picked = sample_indexes(np.arange(n), options.sample, options.seed)
    m = len(picked)
    wants = [measure for measure in options.measures if measure not in STREAMED_MEASURES or options.shuffles(measure)]
    if "knn" in wants and not options.k < m:  # k neighbours need more than k points: the measure is undefined here
        wants.remove("knn")
    counts = {measure: options.shuffles(measure) for measure in wants}
    shuffles = permutations(m, max(counts.values(), default=0), options.seed + 1)
    within = stores[0] is stores[1] and layers_a == layers_b
    sample_a = [read_rows(stores[0], layer, rows[0][picked]) for layer in layers_a]
    sample_b = None if within else [read_rows(stores[1], layer, rows[1][picked]) for layer in layers_b]
    progress.start("similarity nulls", len(shuffles) + 1, unit="shuffles")
    tests = permutation_nulls(sample_a, sample_b, pairs, shuffles, measures=wants, counts=counts, k=options.k,
                              progress=lambda: progress.advance("similarity nulls"))
    progress.advance("similarity nulls")
    shape = (len(layers_a), len(layers_b))
    tables: dict[str, dict[str, np.ndarray]] = {kind: {} for kind in ("sample_values", "null", "null_sd", "p_values")}
    for measure in wants:
        tables["sample_values"][measure] = np.full(shape, np.nan)
        if counts[measure]:
            for kind in ("null", "null_sd", "p_values"):
                tables[kind][measure] = np.full(shape, np.nan)
        for index, (i, j) in enumerate(pairs):
            observed = float(tests.observed[measure][index])
            tables["sample_values"][measure][i, j] = observed
            if measure in ("rsa", "knn"):
                values[measure][i, j] = observed
            if counts[measure]:
                summary = summarise_null(observed, tests.null[measure][index], lower=measure in LOWER_IS_CLOSER)
                tables["null"][measure][i, j] = summary.mean
                tables["null_sd"][measure][i, j] = summary.sd
                tables["p_values"][measure][i, j] = summary.p_value
    chance = {"knn": knn_chance(m, options.k)} if "knn" in wants else {}
    return _SubsampleTests(tables, {measure: n for measure, n in counts.items() if n}, chance)




# ---------------------------------------------------------------------------------------------
# writing


def default_out(store_a: str | os.PathLike[str], store_b: str | os.PathLike[str] | None,
                site: str = DEFAULT_SITE) -> rundir.Target:
    """Where `lmgeom similarity` writes by default: the first store's folder for one store, its
    `similarity/<second store's name>/` folder for two; at a capture site but `resid_post`, the same
    inside the site's results folder, STORE/site_results/<site>/ (`rundir.site_results`)."""
    base = rundir.site_results(store_a, site)
    if store_b is None:
        return base
    return rundir.target(base, f"{rundir.SIMILARITY_PAIRS.name}/{Path(store_b).resolve().name}")


def write_similarity(result: SimilarityResult, out: rundir.Where) -> list[rundir.Target]:
    """similarity.json (settings, counts, stores, records, matrices) and similarity.csv (the records)
    in `out` (a folder or an fsspec URL); the document's provenance is the first store's."""
    store_meta = {key: result.stores[0].get(key) for key in ("model_id", "corpus_fingerprint", "generation")}
    payload = {"settings": result.settings, "counts": result.counts, "stores": result.stores, "records": result.records,
               "layers_a": result.layers_a, "layers_b": result.layers_b,
               "matrices": {measure: table for measure, table in result.values.items()},
               "sample_matrices": dict(result.sample_values), "null": dict(result.null), "null_sd": dict(result.null_sd),
               "p_values": dict(result.p_values), "permutations": dict(result.permutations), "chance": dict(result.chance)}
    paths = rundir.write_result_set(rundir.SIMILARITY.at(out), rundir.SIMILARITY.kind, payload, store_meta=store_meta,
                                    settings=result.options,
                                    companions=[(rundir.SIMILARITY_CSV.at(out), rundir.records_csv(result.records))])
    result.paths = paths
    return paths
