"""Global and local isotropy of every layer of a store, measured on one seeded sample of rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmgeom.progress import Progress
from lmgeom.runs.engine import AnalysisOptions, run_analysis
from lmgeom.runs.rundir import ISOTROPY, ISOTROPY_CSV, Target, write_json, write_records_csv
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
    options: AnalysisOptions | None = None,
    *,
    write: bool = True,
    progress: Progress | None = None,
    **keywords: Any,
) -> IsotropyResult:
    """Every global measure of `isotropy_report` (I(W) raw and centred, IsoScore, average cosine,
    spectra, rogue dimensions) and the size-weighted local isotropy inside `isotropy_clusters` k-means
    clusters (`local_*`), per layer, on the same seeded sample of `isotropy_rows` selected rows
    (`options`, or its fields as `keywords`; the `isotropy` statistic of the analysis engine).
    Written to STORE/isotropy.json and isotropy.csv."""
    options = (options or AnalysisOptions()).replace(**keywords, statistics=("isotropy",))
    analysis = run_analysis(store, options, progress=progress, label="isotropy")
    records: list[dict[str, Any]] = [
        {"layer": layer, "measure": name, "value": value, "n_rows": values["isotropy_rows"]}
        for layer, values in analysis.layers.items() for name, value in values["isotropy"].items()]
    settings = {"layers": list(analysis.plan.layers), "eval_rows": len(analysis.rows.sample(options.isotropy_rows)),
                "n_clusters": options.isotropy_clusters, "seed": options.seed, **analysis.rows.selection.options(),
                "device": analysis.plan.device, "protocol": options.protocol, "plan": analysis.to_json()}
    resolved = analysis.plan.device
    paths: list[Target] = []
    if write:
        paths = [write_json(ISOTROPY.at(store.url), "isotropy", {"settings": settings, "device": resolved, "records": records},
                            store_meta=store.meta),
                 write_records_csv(ISOTROPY_CSV.at(store.url), records)]
    return IsotropyResult(records, settings, paths, resolved)

