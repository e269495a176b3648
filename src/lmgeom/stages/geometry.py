"""Geometry of every layer beyond contextuality: intrinsic dimension, outlier dimensions and massive
activations, uniformity and alignment; and whether the intrinsic-dimension profile over depth picks
the best probing layer.

Two analyses on the engine (`lmgeom.engine`; every executor), each one read of every layer:
1. the statistics `geometry_sample` (one seeded sample of `geometry_rows` selected rows, the same
   rows at every layer: intrinsic dimension, median |h|, anisotropy with and without the outlier
   and rogue dimensions), `magnitudes` (per-dimension mean, std and mean |h| of the selected rows:
   3-sigma outliers), `top_activations` (the `top_activations` largest |h| over *every* stored row,
   special tokens and first positions included: massive activations sit there) and
   `sentence_means` (each sentence's mean selected row: uniformity on at most `max_sentences` seeded
   sentences and, where the corpus holds STS-B pairs with gold >= 4, alignment);
2. from the first's per-dimension moments (`run_analysis(..., inputs=)`), self-similarity (words in
   at least `min_contexts` sentences) and intra-sentence similarity of the rows without the 3-sigma
   outlier dimensions and of the rows standardised per dimension (z-scores with the selected rows'
   mean and population std), beside the raw ones in contextuality.json.
The sample's intrinsic dimension (`lmgeom.metrics.intrinsic`) is computed on the analysis's device,
with every thread pool at one thread (`lmgeom.threads.one_thread`): its k-NN products then add in one
order in every process, so geometry.json is the same, bit for bit, in a fresh or resumed process
whatever its thread settings (MKL's multithreaded products differed in the last bits between
processes).
LayerNorm-weight outliers need the model's weights, not the store (`layernorm_outliers`).
Written to RUN/geometry.json and geometry.csv.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np
import pandas as pd

from lmgeom.errors import InputError
from lmgeom.metrics.alignment import ALIGNMENT_ALPHA, UNIFORMITY_T, alignment, uniformity
from lmgeom.metrics.contextuality import average_cosine, sample_indexes
from lmgeom.metrics.intrinsic import (
    CONFIDENCE,
    GRIDE_SCALES,
    MLE_NEIGHBOURS,
    N_BOOT,
    TWONN_DISCARD_FRACTION,
    hit_rate_test,
    intrinsic_dimension,
    minimum_after_peak,
    peak_layer,
)
from lmgeom.metrics.isotropy import rogue_dimensions
from lmgeom.metrics.outliers import (
    MASSIVE_MIN_MAGNITUDE,
    MASSIVE_MIN_RATIO,
    OUTLIER_SIGMAS,
    Magnitudes,
    is_massive,
    magnitude_outliers,
    weight_outliers,
)
from lmgeom.progress import Progress
from lmgeom.engine import Executor, LayerValues, run_analysis
from lmgeom.engine.options import ROW_FIELDS, WORD_FIELDS, StepOptions
from lmgeom.engine.statistics import TRANSFORMED_VARIANTS
from lmgeom.rundir import GEOMETRY, GEOMETRY_CSV, LENS_JOIN, Target, records_csv, write_result_set
from lmgeom.store import RepresentationStore
from lmgeom.threads import one_thread

MAX_SENTENCES = 10_000


@dataclass(frozen=True)
class GeometryOptions(StepOptions):
    """The geometry step's options: the rows and words (`analysis`: its selection, word threshold,
    seed, `geometry_rows` sampled rows for the intrinsic dimension, `top_activations` located; how it
    runs), `n_boot` bootstrap resamples of the intrinsic dimension, `max_sentences` sentence vectors
    for uniformity, `data_dir` the folder holding stsbenchmark/ for alignment (None: ../shared/data
    or LMGEOM_DATA), and `model_weights` the model whose LayerNorm weights are screened (a name or
    folder, True for the store's own model; None: not computed)."""

    n_boot: int = N_BOOT
    max_sentences: int = MAX_SENTENCES
    data_dir: str | None = None
    model_weights: str | bool | None = None
    ANALYSIS_FIELDS: ClassVar[tuple[str, ...]] = (*ROW_FIELDS, *WORD_FIELDS, "seed", "geometry_rows", "top_activations")

    def __post_init__(self) -> None:
        if self.max_sentences < 2:
            raise InputError(f"`max_sentences` must be at least 2, got {self.max_sentences}", param="max_sentences")
        if self.n_boot < 0:
            raise InputError(f"`n_boot` must be at least 0, got {self.n_boot}", param="n_boot")
        if self.data_dir is not None and not isinstance(self.data_dir, str):
            object.__setattr__(self, "data_dir", str(self.data_dir))
ALIGNMENT_MIN_GOLD = 4.0
ROGUE_TOP_K = 3
# the first analysis's statistics; the second's are the TRANSFORMED_VARIANTS of intra (and self-similarity)
GEOMETRY_STATISTICS = ("geometry_sample", "magnitudes", "top_activations", "sentence_means")


@dataclass
class GeometryResult:
    """Per-layer records, the settings and counts, and the files written."""

    layers: list[dict[str, Any]]
    settings: dict[str, Any]
    counts: dict[str, Any]
    store_meta: dict[str, Any] = field(repr=False)
    layernorm_weights: dict[str, Any] = field(default_factory=dict)  # `layernorm_outliers`, or why not computed
    paths: list[Target] = field(default_factory=list)

    def profile(self, method: str = "twonn", n2: int | None = None) -> np.ndarray:
        """The intrinsic dimension of every layer by `method` (GRIDE at neighbour `n2`)."""
        return np.array([next(e["dimension"] for e in layer["intrinsic_dimension"]
                              if e["method"] == method and (n2 is None or e["n2"] == n2)) for layer in self.layers])


def _mean_defined(values: np.ndarray) -> float | None:
    defined = values[~np.isnan(values)]
    return float(defined.mean()) if len(defined) else None


def _sentence_text_index(store: RepresentationStore) -> dict[str, int]:
    texts = store.sentences["text"].tolist()
    return {text: index for index, text in enumerate(texts)}


def positive_pairs(store: RepresentationStore, data_dir: str | Path | None = None) -> tuple[np.ndarray, str | None]:
    """(pairs of store sentence ids, None) for the STS-B pairs with gold >= 4 whose two sentences are
    both sentences of the store (every split found under `data_dir`, default ../shared/data or
    LMGEOM_DATA), or (empty, why there are none)."""
    from lmgeom.corpus.builtin import DEFAULT_DATA_DIR
    from lmgeom.evaluate.sts_data import STSB_FOLDERS, STSB_SPLITS, read_stsb

    root = Path(DEFAULT_DATA_DIR if data_dir is None else data_dir)
    folder = next((root / name for name in STSB_FOLDERS if any((root / name / f"sts-{s}.csv").is_file() for s in STSB_SPLITS)), None)
    none = np.zeros((0, 2), dtype=np.int64)
    if folder is None:
        return none, f"no STS Benchmark (stsbenchmark/sts-*.csv) under {root}"
    index = _sentence_text_index(store)
    pairs = []
    for split in STSB_SPLITS:
        if not (folder / f"sts-{split}.csv").is_file():
            continue
        data = read_stsb(folder, split)
        for first, second, score in zip(data.sentences1, data.sentences2, data.scores):
            if score >= ALIGNMENT_MIN_GOLD and first in index and second in index and index[first] != index[second]:
                pairs.append((index[first], index[second]))
    if not pairs:
        return none, (f"the store's corpus ({store.meta.get('corpus_name')}) holds no STS-B pair with gold >= {ALIGNMENT_MIN_GOLD:g} "
                      "(alignment needs positive pairs: extract a corpus of STS-B sentences)")
    return np.array(pairs, dtype=np.int64), None


def _located(store: RepresentationStore, tokens: pd.DataFrame, values: np.ndarray, rows: np.ndarray, dims: np.ndarray,
             median: float) -> list[dict[str, Any]]:
    """The top activations with their token, sentence, position and ratio to the median |h|."""
    first_rows = store.sentences["first_row"].to_numpy()
    located = []
    for value, row, dim in zip(values, rows, dims):
        token = tokens.iloc[int(row)]
        sentence = int(token["sentence_id"])
        ratio = float(abs(value) / median) if median > 0 else float("inf")
        located.append({"value": float(value), "ratio_to_median": ratio, "massive": is_massive(abs(float(value)), ratio),
                        "row": int(row), "dimension": int(dim), "word": str(token["word"]), "is_special": bool(token["is_special"]),
                        "sentence_id": sentence, "position": int(token["position"]),
                        "first_row_of_sentence": bool(int(row) == int(first_rows[sentence]))})
    return located


def special_rows_note(store: RepresentationStore) -> str | None:
    """None when the store kept its special-token rows (BOS, CLS: where massive activations sit), else why they are not read."""
    if store.meta.get("special_tokens") == "stored":
        return None
    return (f"the store kept no special-token rows (special_tokens: {store.meta.get('special_tokens')}): the top |h| are "
            "over its word rows only; massive activations on BOS/CLS need a store extracted with `keep_special=True`")


def model_spec(model_id: str | None) -> str:
    """The name `load_encoder` takes from a store's `model_id` ("minilm (sentence-transformers/...)" -> "minilm")."""
    return str(model_id or "").split(" ")[0]


def _not_at_hand(model: str) -> str | None:
    """None when `model` loads without the network (a built-in name, a local folder, a Hub id in the
    local Hugging Face cache), else why not."""
    from huggingface_hub import try_to_load_from_cache

    from lmgeom.encoders.named import NAMED_MODELS
    from lmgeom.encoders.registry import TINY_MODELS

    if model in NAMED_MODELS or model in TINY_MODELS or Path(model).expanduser().exists():
        return None
    try:
        cached = try_to_load_from_cache(model, "config.json")
    except ValueError:  # not a valid Hub id
        cached = None
    return None if isinstance(cached, str) else (
        f"the model {model!r} is neither built in, a local folder nor a Hub id in the local Hugging Face cache")


def layernorm_outliers(model: Any, *, n_sigma: float = OUTLIER_SIGMAS) -> dict[str, Any]:
    """The `n_sigma` outliers of every LayerNorm (and RMSNorm) weight vector of `model` (a name
    `load_encoder` takes: built-in, local folder, Hub id; or a loaded torch module), Kovaleva et al.
    (2021); `computed` False with the reason (`note`) when the model cannot be loaded or has no
    LayerNorm. Gemma-style RMSNorms scale by 1 + weight: their z-scores are the same."""
    base = {"n_sigma": n_sigma, "rule": "|w - mean(w)| > n_sigma x std(w) within each norm's weight vector (population std)",
            "model": model if isinstance(model, str) else type(model).__name__}
    if isinstance(model, str):
        from lmgeom.encoders import load_encoder

        unreachable = _not_at_hand(model)
        if unreachable:
            return {**base, "computed": False, "note": f"not computed: {unreachable}", "modules": []}
        try:
            module = getattr(load_encoder(model, device="cpu"), "model", None)
        except (InputError, OSError, ImportError, ValueError) as error:
            return {**base, "computed": False, "note": f"not computed: the model {model!r} could not be loaded ({error})",
                    "modules": []}
    else:
        module = model
    norms = [] if module is None else [
        (name, part.weight) for name, part in module.named_modules()
        if "norm" in type(part).__name__.lower() and getattr(part, "weight", None) is not None and part.weight.ndim == 1]
    if not norms:
        return {**base, "computed": False, "note": f"not computed: {base['model']} has no LayerNorm weights", "modules": []}
    modules = []
    for name, weight in norms:
        values = weight.detach().float().cpu().numpy()
        dims, z = weight_outliers(values, n_sigma=n_sigma)
        block = next((int(part) for part in name.split(".") if part.isdigit()), None)
        modules.append({"module": name, "block": block, "dim": int(values.size), "mean": float(values.mean()),
                        "std": float(values.std()), "outliers": [{"dimension": int(d), "weight": float(values[d]), "z": float(v)}
                                                               for d, v in zip(dims, z)]})
    return {**base, "computed": True, "note": None, "modules": modules}


def measure_geometry(
    store: RepresentationStore,
    options: GeometryOptions = GeometryOptions(),
    *,
    out: str | Path | None = None,
    write: bool = True,
    executor: Executor | None = None,
    progress: Progress | None = None,
) -> GeometryResult:
    """Every layer's intrinsic dimension, outlier panel, uniformity and alignment (module docstring),
    with `options` (`GeometryOptions`; the rows and how it runs are `options.analysis`) on `executor`
    (default: the options'); with `options.model_weights` the LayerNorm-weight outliers too
    (`layernorm_outliers`), else stated as not computed. Written to OUT/geometry.json and
    geometry.csv (OUT defaults to the store's location) with the options' settings."""
    step, analysis_options = options, options.analysis
    n_boot, max_sentences, data_dir, model_weights = step.n_boot, step.max_sentences, step.data_dir, step.model_weights
    first = run_analysis(store, analysis_options.replace(statistics=GEOMETRY_STATISTICS), executor=executor, progress=progress,
                         label="geometry")
    rows = first.rows
    try:
        n_words: int | None = len(rows.words)
    except InputError:  # no word in min_contexts sentences: no self-similarity, the rest stands
        n_words = None
    tokens = store.token_columns("sentence_id", "word_id", "is_punct", "is_special", "position", "word")
    pairs, alignment_note = positive_pairs(store, data_dir)
    device = first.plan.device
    with one_thread():  # the same bits in every process: a resumed run's geometry.json is an uninterrupted one's
        records = {layer: _layer_record(store, tokens, layer, values, pairs, alignment_note, n_boot=n_boot,
                                        max_sentences=max_sentences, seed=analysis_options.seed, device=device)
                   for layer, values in first.layers.items()}
    inputs = {layer: {"kept": np.setdiff1d(np.arange(store.dim), [d["dimension"] for d in record["outlier_dimensions"]]),
                      "mean": first.layers[layer]["magnitudes"].mean, "std": first.layers[layer]["magnitudes"].std}
              for layer, record in records.items()}
    second_statistics = tuple(f"{kind}_{variant}" for variant in TRANSFORMED_VARIANTS
                              for kind in (("intra", "self_similarity") if n_words is not None else ("intra",)))
    second = run_analysis(store, analysis_options.replace(statistics=second_statistics), executor=executor, progress=progress,
                          label="geometry cosines", inputs=inputs)
    for layer, values in second.layers.items():
        for variant in TRANSFORMED_VARIANTS:
            name = f"self_similarity_{variant}"
            records[layer][name] = _mean_defined(values[name]) if name in values else None
            records[layer][f"intra_sentence_similarity_{variant}"] = _mean_defined(
                values[f"intra_{variant}"].to_numpy(dtype=np.float64))
    special_note = special_rows_note(store)
    if model_weights is None or model_weights is False:
        layernorm: dict[str, Any] = {"n_sigma": OUTLIER_SIGMAS, "computed": False, "modules": [],
                                     "note": "not computed: a store holds activations, not weights (ask with `model_weights`)"}
    elif (store.meta.get("control") or {}).get("name") == "random-init":  # the named model's weights are not the store's
        layernorm = {"n_sigma": OUTLIER_SIGMAS, "computed": False, "modules": [],
                     "note": "not computed: the store is the random-init control, whose norm weights are the "
                             "initialisation's, not those of the model it names"}
    else:
        layernorm = layernorm_outliers(model_spec(store.meta.get("model_id")) if model_weights is True else model_weights)
    settings = {
        "layers": list(first.plan.layers), "n_points": len(rows.sample(analysis_options.geometry_rows)), "seed": analysis_options.seed,
        **rows.selection.options(), "min_contexts": analysis_options.min_contexts, "device": device,
        "intrinsic_dimension": {"twonn_discard_fraction": TWONN_DISCARD_FRACTION, "mle_k": MLE_NEIGHBOURS,
                                "mle_combination": "MacKay-Ghahramani (inverse of the mean of the inverse estimates)",
                                "gride_n2": [2**s for s in range(1, GRIDE_SCALES + 1)], "n_boot": n_boot,
                                "interval": f"bootstrap percentile, {CONFIDENCE:.0%}", "knn": "exact, blocked, float64",
                                "rows": "one seeded sample of the selected rows, the same at every layer; exact duplicates removed per layer"},
        "outliers": {"n_sigma": OUTLIER_SIGMAS, "over": "selected rows: mean |h| per dimension vs mean and std over dimensions",
                     "top_k": analysis_options.top_activations,
                     "top_over": "every stored row (special tokens and first positions included)",
                     "special_rows": special_note or "stored and read",
                     "median": "median |h| over the sampled rows and all dimensions",
                     "massive": f"|h| > {MASSIVE_MIN_MAGNITUDE:g} and >= {MASSIVE_MIN_RATIO:g} x median (Sun et al. 2024)",
                     "rogue_top_k": ROGUE_TOP_K,
                     "cosines": (f"self-similarity (words in >= {analysis_options.min_contexts} sentences) and intra-sentence similarity "
                                 "without the outlier dimensions and standardised (selected rows' mean and population std): "
                                 "a second read of each layer")},
        "uniformity": {"t": UNIFORMITY_T, "vectors": "sentence vectors (mean of the sentence's selected rows), normalised",
                       "max_sentences": max_sentences},
        "alignment": {"alpha": ALIGNMENT_ALPHA, "pairs": f"STS-B pairs with gold >= {ALIGNMENT_MIN_GOLD:g}", "n_pairs": len(pairs),
                      "note": alignment_note},
        "plan": first.to_json(),
    }
    counts = {**rows.selection.counts, "sentences": len(store.sentences), "words_analysed": n_words or 0}
    result = GeometryResult([records[layer] for layer in first.plan.layers], settings, counts, dict(store.meta), layernorm)
    if write:
        target = store.url if out is None else out
        document = {"settings": settings, "device": device, "counts": counts, "layers": result.layers,
                    "layernorm_weights": layernorm}
        result.paths = write_result_set(GEOMETRY.at(target), GEOMETRY.kind, document, store_meta=store.meta,
                                        settings=step.to_settings(),
                                        companions=[(GEOMETRY_CSV.at(target), records_csv(geometry_records(result.layers)))])
        from lmgeom.stages.lens import join_lens, lens_joinable

        if lens_joinable(target):  # the run's logit lens, joined to this geometry (lens_join.json)
            join_lens(str(target))
            result.paths.append(LENS_JOIN.at(target))
    return result


def geometry_records(layers: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Tidy (layer, measure, value, low, high) rows of geometry.json's per-layer numbers (geometry.csv)."""
    records: list[dict[str, Any]] = []
    for layer in layers:
        for estimate in layer["intrinsic_dimension"]:
            name = estimate["method"] + (f"_{estimate['n2']}" if estimate.get("n2") is not None and estimate["method"] == "gride" else "")
            records.append({"layer": layer["layer"], "measure": f"id_{name}", "value": estimate["dimension"],
                            "low": estimate.get("low"), "high": estimate.get("high")})
        scalars = {key: value for key, value in layer.items() if isinstance(value, (int, float)) and not isinstance(value, bool)
                   and key != "layer"}
        scalars["n_outlier_dimensions"] = len(layer["outlier_dimensions"])
        scalars["top_abs_activation"] = abs(layer["top_activations"][0]["value"])
        scalars["top_ratio_to_median"] = layer["top_activations"][0]["ratio_to_median"]
        records += [{"layer": layer["layer"], "measure": key, "value": value, "low": None, "high": None}
                    for key, value in scalars.items()]
    return records


def _layer_record(store: RepresentationStore, tokens: pd.DataFrame, layer: int, values: LayerValues, pairs: np.ndarray,
                  alignment_note: str | None, *, n_boot: int, max_sentences: int, seed: int, device: str) -> dict[str, Any]:
    X: np.ndarray = values["geometry_sample"]
    # a small store has fewer distinct rows than the largest neighbour asked for: fewer GRIDE scales, a smaller MLE k
    n_distinct = len(np.unique(X, axis=0))
    scales = min(GRIDE_SCALES, int(np.log2(max(n_distinct - 1, 1))))
    if n_distinct < 3:
        raise InputError(f"layer {layer} has {n_distinct} distinct sampled rows; the intrinsic dimension needs at least 3 "
                         "(raise `geometry_rows` or use a bigger corpus)", param="geometry_rows")
    dimension = intrinsic_dimension(X, n_boot=n_boot, seed=seed, device=device, mle_k=min(MLE_NEIGHBOURS, n_distinct - 1),
                                    gride_scales=max(1, scales))
    median = float(np.median(np.abs(X)))
    top: Magnitudes = values["top_activations"]
    moments: Magnitudes = values["magnitudes"]
    outliers = magnitude_outliers(moments.mean_abs)
    rogue = rogue_dimensions(X, top_k=ROGUE_TOP_K) if X.shape[1] > ROGUE_TOP_K else None
    kept = np.setdiff1d(np.arange(X.shape[1]), outliers.dimensions)
    counts = values["sentence_rows"]
    present = np.flatnonzero(counts > 0)
    means = values["sentence_means"][present]
    chosen = sample_indexes(np.arange(len(present)), max_sentences, seed)
    aligned = None
    if len(pairs):
        position = np.full(len(store.sentences), -1)
        position[present] = np.arange(len(present))
        usable = (position[pairs[:, 0]] >= 0) & (position[pairs[:, 1]] >= 0)
        if usable.any():
            aligned = alignment(means[position[pairs[usable, 0]]], means[position[pairs[usable, 1]]])
    return {
        "layer": layer,
        "n_rows": dimension.n_rows,
        "n_duplicates": dimension.n_duplicates,
        "intrinsic_dimension": [estimate.record() for estimate in dimension.estimates],
        "outlier_dimensions": [{"dimension": int(d), "mean_abs": float(m), "z": float(z)}
                               for d, m, z in zip(outliers.dimensions, outliers.mean_abs, outliers.z_scores)],
        "rogue_dimensions": [] if rogue is None else [int(d) for d in rogue.top_dimensions],
        "rogue_share": None if rogue is None else rogue.top_share,
        "median_abs": median,
        "top_activations": _located(store, tokens, top.top_values, top.top_rows, top.top_dims, median),
        "anisotropy_sampled": average_cosine(X),
        "anisotropy_without_outlier_dimensions": average_cosine(X[:, kept]) if len(kept) else None,
        "uniformity": uniformity(means[chosen]) if len(chosen) >= 2 else None,
        "uniformity_sentences": int(len(chosen)),
        "alignment": aligned,
        "alignment_note": alignment_note,
    }


# --------------------------------------------------------------------------------------------
# does the intrinsic-dimension profile pick the best probing layer?
# --------------------------------------------------------------------------------------------

# the split and metric that rank a task's layers, first match (the dev split where the task has one)
PROBE_SCORES = (("dev", "matthews"), ("dev", "accuracy"), ("test", "accuracy"))


def best_probe_layer(results: Mapping[str, Any]) -> tuple[int, str, str, list[float]]:
    """(the layer whose linear probe scores highest, split, metric, every layer's mean score) from a
    layer experiment's results.json (its `summaries`, features `layer:L`)."""
    summaries = [s for s in results["summaries"] if str(s["features"]).startswith("layer:")]
    for split, metric in PROBE_SCORES:
        chosen = [s for s in summaries if s["split"] == split and s["metric"] == metric]
        if chosen:
            by_layer = {int(str(s["features"]).split(":")[1]): float(s["mean"]) for s in chosen}
            scores = [by_layer[layer] for layer in sorted(by_layer)]
            return int(np.argmax(scores)), split, metric, scores
    raise InputError(f"no per-layer probe scores on {PROBE_SCORES} in these results")


def model_layernorm_outliers(geometry_file: str | Path) -> dict[str, Any]:
    """The LayerNorm-weight outliers of the model of a geometry.json: those it holds, else computed
    by loading the model its `model_id` names (`layernorm_outliers`)."""
    document = _read_geometry(geometry_file)
    held = document.get("layernorm_weights") or {}
    return held if held.get("computed") else layernorm_outliers(model_spec(document.get("model_id")))


def _read_geometry(path: str | Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(Path(path).read_text())
    if document.get("kind") != GEOMETRY.kind:
        raise InputError(f"{path} is not a geometry.json (kind {document.get('kind')!r}); write one with `lmgeom geometry STORE`")
    return document


def probe_layer_test(geometry_files: Sequence[str | Path], results_files: Sequence[str | Path], *,
                     method: str = "twonn") -> dict[str, Any]:
    """For each (model, task) with a geometry.json of the model and a layer experiment of that task:
    does the intrinsic-dimension peak (Cheng et al. 2025) or the minimum after it (Valeriani et al.
    2023) name the best probing layer? Hits against chance (1 / number of layers per case) with an
    exact one-sided Poisson-binomial test, for each rule."""
    if method not in ("twonn", "mle"):
        raise InputError(f"unknown method {method!r}; use twonn or mle", param="method")
    profiles: dict[str, list[float]] = {}
    for path in geometry_files:
        document = _read_geometry(path)
        profiles[model_spec(document.get("model_id"))] = [
            next(e["dimension"] for e in layer["intrinsic_dimension"] if e["method"] == method) for layer in document["layers"]]
    cases: list[dict[str, Any]] = []
    missing: list[str] = []
    for path in results_files:
        results = json.loads(Path(path).read_text())
        model, task = results["settings"]["model"], results["settings"]["task"]
        if model not in profiles:
            missing.append(f"{model} × {task}")
            continue
        profile = np.array(profiles[model])
        best, split, metric, scores = best_probe_layer(results)
        if len(scores) != len(profile):
            raise InputError(f"{path}: {len(scores)} probed layers, but the {model} geometry has {len(profile)}")
        after = minimum_after_peak(profile)
        cases.append({"model": model, "task": task, "split": split, "metric": metric, "best_layer": best,
                      "n_layers": len(profile), "peak_layer": peak_layer(profile), "minimum_after_peak": after,
                      "probe_scores": scores, "profile": profile.tolist()})
    tests = {}
    for rule, key in (("peak (Cheng et al. 2025)", "peak_layer"), ("minimum after the peak (Valeriani et al. 2023)", "minimum_after_peak")):
        hits = [case[key] == case["best_layer"] for case in cases]
        tests[rule] = hit_rate_test(hits, [1 / case["n_layers"] for case in cases])
    return {"method": method, "cases": cases, "tests": tests, "missing": missing,
            "test": "exact one-sided Poisson-binomial: P(hits >= observed) when each case's rule hits with chance 1 / n_layers"}
