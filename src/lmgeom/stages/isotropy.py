"""Global and local isotropy of every layer of a store, measured on one seeded sample of rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from lmgeom.progress import Progress
from lmgeom.engine import run_analysis
from lmgeom.engine.options import ROW_FIELDS, StepOptions
from lmgeom.rundir import ISOTROPY, ISOTROPY_CSV, Target, Where, records_csv, write_result_set
from lmgeom.store import RepresentationStore


@dataclass(frozen=True)
class IsotropyOptions(StepOptions):
    """The isotropy step's options: the rows (`analysis`' selection), the seeded sample of
    `analysis.isotropy_rows` rows and `analysis.isotropy_clusters` k-means clusters."""

    ANALYSIS_FIELDS: ClassVar[tuple[str, ...]] = (*ROW_FIELDS, "seed", "isotropy_rows", "isotropy_clusters")


@dataclass
class IsotropyResult:
    """Tidy records (layer, measure, value) and the files written."""

    records: list[dict[str, Any]]
    settings: dict[str, Any]
    paths: list[Target]
    device: str = "cpu"  # where the global measures computed ("cpu", "cuda:0")


def measure_isotropy(
    store: RepresentationStore,
    options: IsotropyOptions = IsotropyOptions(),
    *,
    write: bool = True,
    out: Where | None = None,
    progress: Progress | None = None,
) -> IsotropyResult:
    """Every global measure of `isotropy_report` (I(W) raw and centred, IsoScore, average cosine,
    spectra, rogue dimensions) and the size-weighted local isotropy inside `isotropy_clusters` k-means
    clusters (`local_*`), per layer, on the same seeded sample of `isotropy_rows` selected rows
    (`options.analysis`; the `isotropy` statistic of the analysis engine). Written to
    STORE/isotropy.json and isotropy.csv (or OUT's, a folder of this store's run: a capture site's
    results) with the options' settings."""
    analysis_options = options.analysis.replace(statistics=("isotropy",))
    analysis = run_analysis(store, analysis_options, progress=progress, label="isotropy")
    records: list[dict[str, Any]] = [
        {"layer": layer, "measure": name, "value": value, "n_rows": values["isotropy_rows"]}
        for layer, values in analysis.layers.items() for name, value in values["isotropy"].items()]
    settings = {"layers": list(analysis.plan.layers), "eval_rows": len(analysis.rows.sample(analysis_options.isotropy_rows)),
                "n_clusters": analysis_options.isotropy_clusters, "seed": analysis_options.seed,
                **analysis.rows.selection.options(), "device": analysis.plan.device,
                "protocol": analysis_options.protocol, "plan": analysis.to_json()}
    resolved = analysis.plan.device
    paths: list[Target] = []
    if write:
        folder = store.url if out is None else out
        paths = write_result_set(ISOTROPY.at(folder), ISOTROPY.kind,
                                 {"settings": settings, "device": resolved, "records": records}, store_meta=store.meta,
                                 settings=options.to_settings(), companions=[(ISOTROPY_CSV.at(folder), records_csv(records))])
    return IsotropyResult(records, settings, paths, resolved)

