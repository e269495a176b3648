"""Attribution of each layer's geometry (its mean direction, its outlier dimensions' variance, its
largest activations) to the terms its model's sum rule writes it from (`lmgeom.metrics.attribution`),
read from a store holding those capture sites and written to attribution.json and attribution.csv.

Each (layer, sum) reads its sum's site and its terms' sites chunk by chunk at identical rows (every
site of a store has the same rows) into one `TermMomentAccumulator`: every term of a row is needed
at once, for the values at the largest entries and the residual of the sum rule, so the layer's
K + 1 streams are read together rather than as pairs of sides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from lmgeom.errors import InputError
from lmgeom.engine.options import StepOptions
from lmgeom.layerspec import select_layers
from lmgeom.metrics.attribution import TOP_VARIANCE_DIMENSIONS, TermMomentAccumulator, attribution_summary
from lmgeom.metrics.outliers import OUTLIER_SIGMAS, TOP_ACTIVATIONS
from lmgeom.progress import Progress
from lmgeom.rundir import ATTRIBUTION, ATTRIBUTION_CSV, Target, Where, records_csv, write_result_set
from lmgeom.sitespec import DEFAULT_SITE
from lmgeom.store import RepresentationStore

BERT_LN1 = "encoder.layer.{i}.attention.output.LayerNorm:input"
BERT_LN2 = "encoder.layer.{i}.output.LayerNorm:input"
PRE_LN = (("block", DEFAULT_SITE, ("resid_pre", "attn_out", "mlp_out")),)
# each family's exact sums (`lmgeom.encoders.sites.FAMILIES`' rules): (name, the sum's site, its terms' sites)
DECOMPOSITIONS: dict[str, tuple[tuple[str, str, tuple[str, ...]], ...]] = {
    "gpt2": PRE_LN, "llama": PRE_LN, "gemma3": PRE_LN,
    "bert": (("attention", BERT_LN1, ("resid_pre", "attn_out")), ("mlp", BERT_LN2, ("resid_mid", "mlp_out"))),
}
CHUNK_ROWS = 4096


@dataclass(frozen=True)
class AttributionOptions(StepOptions):
    """The attribution step's options: `layers` (a `lmgeom.layerspec` spec among the layers holding
    every site a sum needs; None: all), `top_k` largest |x| entries per layer, `n_sigma` for the
    magnitude outlier dimensions, `top_variance` dimensions of largest variance, and `chunk_rows`
    rows read per site at a time (it does not change the numbers)."""

    ANALYSIS_FIELDS: ClassVar[tuple[str, ...]] = ()
    layers: str | None = None
    top_k: int = TOP_ACTIVATIONS
    n_sigma: float = OUTLIER_SIGMAS
    top_variance: int = TOP_VARIANCE_DIMENSIONS
    chunk_rows: int = CHUNK_ROWS

    def to_settings(self) -> dict[str, Any]:
        return {"layers": self.layers, "top_k": self.top_k, "n_sigma": self.n_sigma, "top_variance": self.top_variance}


@dataclass
class AttributionResult:
    """The document written (`layers`: one entry per (layer, sum)), its tidy records and the files."""

    document: dict[str, Any]
    records: list[dict[str, Any]]
    paths: list[Target]


def decompositions_of(store: RepresentationStore) -> list[tuple[str, str, tuple[str, ...]]]:
    """The sums of the store's model family (meta.json's `site_family`) whose sites the store holds.

    Parameters
    ----------
    store : RepresentationStore
        A store extracted with capture sites.

    Returns
    -------
    list of (str, str, tuple of str)
        (name, the sum's site, its terms' sites) for each sum the store can decompose.

    Raises
    ------
    InputError
        A store of no known family, or one lacking a site each sum needs, naming the `sites` to extract.
    """
    family = store.meta.get("site_family")
    if family not in DECOMPOSITIONS:
        raise InputError(f"the store's model family is {family!r}: attribution knows the sum rules of "
                         f"{', '.join(DECOMPOSITIONS)} (extract one of those with `sites`)", param="sites")
    rules = DECOMPOSITIONS[family]
    held = set(store.sites)
    found = [rule for rule in rules if {rule[1], *rule[2]} <= held]
    if not found:
        needed = sorted({site for rule in rules for site in (rule[1], *rule[2]) if site != DEFAULT_SITE})
        raise InputError(f"the store holds the sites {', '.join(store.sites)}; attributing a {family} layer needs "
                         f"{', '.join(needed)}: extract again with `sites`={','.join(needed)!r}", param="sites")
    return found


def attribute_store(store: RepresentationStore, options: AttributionOptions = AttributionOptions(), *, write: bool = True,
                    out: Where | None = None, progress: Progress | None = None) -> AttributionResult:
    """Each chosen layer's mean direction, variance (trace, outlier and top-variance dimensions) and
    largest |x| entries attributed to the terms of its model's sum rule, over every stored row;
    written to STORE/attribution.json and attribution.csv (or OUT's).

    Parameters
    ----------
    store : RepresentationStore
        A store holding the sites of its family's sum (`decompositions_of`).
    options : AttributionOptions
        Layers, top entries, outlier thresholds.
    write : bool
        Write the result files.
    out : str, path or Location, optional
        The folder for them (None: the store's).
    progress : Progress, optional
        Reports each (layer, sum) done.

    Returns
    -------
    AttributionResult
        The document, its records and the files written.

    Raises
    ------
    InputError
        A store without the sites (`sites`), or `layers` naming no layer that holds them all.
    """
    if options.chunk_rows < 1:
        raise InputError(f"`chunk_rows` must be at least 1, got {options.chunk_rows}", param="chunk_rows")
    rules = decompositions_of(store)
    jobs: list[tuple[int, str, str, tuple[str, ...]]] = []
    for name, total, terms in rules:
        available = sorted(set.intersection(*(set(store.site_layers(site)) for site in (total, *terms))))
        if available:
            for layer in select_layers(options.layers, available, n_layers=store.n_model_layers):
                if layer in available:
                    jobs.append((layer, name, total, terms))
    if not jobs:
        raise InputError(f"`layers` {options.layers!r} names no layer holding every site of a sum; the sites' layers are "
                         f"{store.site_layers(rules[0][2][0])}", param="layers")
    jobs.sort()
    if progress is not None:
        progress.start("attribution", len(jobs), unit="sums")
    layers: list[dict[str, Any]] = []
    for layer, name, total, terms in jobs:
        accumulator = TermMomentAccumulator(len(terms), top_k=options.top_k)
        arrays = [store.layer(layer, site=site) for site in (total, *terms)]
        for start in range(0, store.n_tokens, options.chunk_rows):
            stop = min(start + options.chunk_rows, store.n_tokens)
            chunks = [array[start:stop] for array in arrays]
            accumulator.add_terms(chunks[0], chunks[1:], rows=range(start, stop))
        summary = attribution_summary(accumulator.result(), terms, n_sigma=options.n_sigma, top_variance=options.top_variance)
        layers.append({"layer": layer, "sum": name, "sum_site": total, "terms": list(terms), **summary})
        if progress is not None:
            progress.advance("attribution", note=f"layer {layer} {name}")
    tokens = store.token_columns("word", "position") if any(entry["massive"] for entry in layers) else None
    if tokens is not None:
        for entry in layers:
            for massive in entry["massive"]:
                massive["word"] = str(tokens["word"].iloc[massive["row"]])
                massive["position"] = int(tokens["position"].iloc[massive["row"]])
    records = attribution_records(layers)
    document = {"settings": {**options.to_settings(), "layers": sorted({entry["layer"] for entry in layers}),
                             "rows": "every stored row"},
                "family": store.meta.get("site_family"), "rule": store.meta.get("site_rule"),
                "last_layer": store.meta.get("site_last_layer"),
                "sums": [{"name": name, "sum": total, "terms": list(terms)} for name, total, terms in rules],
                "layers": layers}
    paths: list[Target] = []
    if write:
        folder = store.url if out is None else out
        paths = write_result_set(ATTRIBUTION.at(folder), ATTRIBUTION.kind, document, store_meta=store.meta,
                                 settings=options.to_settings(), companions=[(ATTRIBUTION_CSV.at(folder), records_csv(records))])
    return AttributionResult(document, records, paths)


def attribution_records(layers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tidy records (layer, sum, part, dimension, term, share, own, cross) of attribution.json's layers:
    part `mean`, `variance` (the trace), `outlier` and `top_variance` (one dimension), `massive` (one entry)."""
    records: list[dict[str, Any]] = []
    for entry in layers:
        base = {"layer": entry["layer"], "sum": entry["sum"]}
        for term, share in entry["mean_shares"].items():
            records.append({**base, "part": "mean", "dimension": None, "term": term, "share": share})
        for term, parts in entry["variance_shares"].items():
            records.append({**base, "part": "variance", "dimension": None, "term": term, "share": parts["total"],
                            "own": parts["own"], "cross": parts["cross"]})
        for part, key in (("outlier", "outlier_dimensions"), ("top_variance", "top_variance_dimensions")):
            for dim in entry[key]:
                for term, parts in dim["shares"].items():
                    records.append({**base, "part": part, "dimension": dim["dimension"], "term": term,
                                    "share": parts["total"], "own": parts["own"], "cross": parts["cross"]})
        for massive in entry["massive"]:
            for term, share in massive["shares"].items():
                records.append({**base, "part": "massive", "dimension": massive["dimension"], "row": massive["row"],
                                "term": term, "share": share})
    return records
