"""Global and local isotropy of every layer of a store, measured on one seeded sample of rows."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from lmgeom.metrics.base import as_float64_rows
from lmgeom.metrics.contextuality import sample_indexes
from lmgeom.metrics.isotropy import REPORT_MAX_ROWS, isotropy_report, local_isotropy
from lmgeom.progress import NoProgress, Progress
from lmgeom.runs.rundir import ISOTROPY, ISOTROPY_CSV, write_json, write_records_csv
from lmgeom.runs.selection import select_rows
from lmgeom.store import RepresentationStore


@dataclass
class IsotropyResult:
    """Tidy records (layer, measure, value) and the files written."""

    records: list[dict[str, Any]]
    settings: dict[str, Any]
    paths: list[Path]


def measure_isotropy(
    store: RepresentationStore,
    *,
    layers: Sequence[int] | None = None,
    eval_rows: int = REPORT_MAX_ROWS,
    n_clusters: int = 8,
    include_punct: bool = False,
    include_special: bool = False,
    seed: int = 0,
    write: bool = True,
    progress: Progress | None = None,
) -> IsotropyResult:
    """Every global measure of `isotropy_report` (I(W) raw and centred, IsoScore, average cosine,
    spectra, rogue dimensions) and the size-weighted local isotropy inside `n_clusters` k-means
    clusters (`local_*`), per layer, on the same seeded sample of `eval_rows` selected rows.
    Written to STORE/isotropy.json and isotropy.csv."""
    progress = progress or NoProgress()
    layers = list(store.layers if layers is None else layers)
    for layer in layers:
        store.layer(layer)
    selection = select_rows(store.tokens, include_special=include_special, include_punct=include_punct)
    sample = sample_indexes(selection.rows, eval_rows, seed)
    progress.start("isotropy", len(layers), unit="layers")
    records: list[dict[str, Any]] = []
    for layer in layers:
        X = as_float64_rows(store.rows(layer, sample), name="store rows", layer=layer)
        measures: dict[str, float] = dict(isotropy_report(X, seed=seed, max_rows=None))
        local = local_isotropy(X, n_clusters=min(n_clusters, len(X)), seed=seed)
        measures.update({f"local_{name}": value for name, value in local.weighted_mean.items()})
        records.extend({"layer": layer, "measure": name, "value": value, "n_rows": len(sample)}
                       for name, value in measures.items() if name not in ("n_points", "n_used", "dim"))
        progress.advance("isotropy", note=f"layer {layer}")
    store.check_unchanged()
    settings = {"layers": layers, "eval_rows": len(sample), "n_clusters": n_clusters, "seed": seed, **selection.options()}
    paths: list[Path] = []
    if write:
        paths = [write_json(ISOTROPY.at(store.path), "isotropy", {"settings": settings, "records": records}, store_meta=store.meta),
                 write_records_csv(ISOTROPY_CSV.at(store.path), records)]
    return IsotropyResult(records, settings, paths)
