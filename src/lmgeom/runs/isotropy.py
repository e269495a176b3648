"""Global and local isotropy of every layer of a store, measured on one seeded sample of rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from lmgeom.metrics.base import as_float64_rows
from lmgeom.metrics.contextuality import sample_indexes
from lmgeom.metrics.isotropy import REPORT_MAX_ROWS, isotropy_report, local_isotropy
from lmgeom.progress import NoProgress, Progress
from lmgeom.runs.rundir import ISOTROPY, ISOTROPY_CSV, Target, write_json, write_records_csv
from lmgeom.runs.selection import select_rows
from lmgeom.store import RepresentationStore


@dataclass
class IsotropyResult:
    """Tidy records (layer, measure, value) and the files written."""

    records: list[dict[str, Any]]
    settings: dict[str, Any]
    paths: list[Target]
    device: str = "cpu"  # where the global measures computed ("cpu", "cuda:0")


def measure_isotropy(
    store: RepresentationStore,
    *,
    layers: Sequence[int] | None = None,
    eval_rows: int = REPORT_MAX_ROWS,
    n_clusters: int = 8,
    include_punct: bool = False,
    include_special: bool = False,
    seed: int = 0,
    device: str = "cpu",
    write: bool = True,
    progress: Progress | None = None,
) -> IsotropyResult:
    """Every global measure of `isotropy_report` (I(W) raw and centred, IsoScore, average cosine,
    spectra, rogue dimensions) and the size-weighted local isotropy inside `n_clusters` k-means
    clusters (`local_*`), per layer, on the same seeded sample of `eval_rows` selected rows.
    `device`: where the global measures compute (`lmgeom.device.resolve_analysis_device`: `cpu` with
    numpy, `cuda`/`cuda:N` on that GPU; the k-means of the local ones runs on the CPU), recorded as
    the file's `device`. Written to STORE/isotropy.json and isotropy.csv."""
    target = None
    if device != "cpu":  # torch only where it is asked for
        from lmgeom.device import device_name, resolve_analysis_device

        target = resolve_analysis_device(device)
    resolved = "cpu" if target is None else device_name(target)
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
        measures: dict[str, float] = dict(isotropy_report(X if target is None else _on(X, target), seed=seed, max_rows=None))
        local = local_isotropy(X, n_clusters=min(n_clusters, len(X)), seed=seed)
        measures.update({f"local_{name}": value for name, value in local.weighted_mean.items()})
        records.extend({"layer": layer, "measure": name, "value": value, "n_rows": len(sample)}
                       for name, value in measures.items() if name not in ("n_points", "n_used", "dim"))
        progress.advance("isotropy", note=f"layer {layer}")
    store.check_unchanged()
    settings = {"layers": layers, "eval_rows": len(sample), "n_clusters": n_clusters, "seed": seed, **selection.options()}
    paths: list[Target] = []
    if write:
        paths = [write_json(ISOTROPY.at(store.url), "isotropy", {"settings": settings, "device": resolved, "records": records},
                            store_meta=store.meta),
                 write_records_csv(ISOTROPY_CSV.at(store.url), records)]
    return IsotropyResult(records, settings, paths, resolved)


def _on(X: Any, device: Any) -> Any:
    import torch

    return torch.from_numpy(X).to(device)
