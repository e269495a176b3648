"""Fitting calibrators on a store's layers and measuring isotropy before and after."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from lmgeom.calibrate import FIT_MAX_ROWS, METHODS, Calibrator, make_calibrator
from lmgeom.calibrate.linear import MomentCalibrator
from lmgeom.metrics.base import as_float64_rows
from lmgeom.metrics.contextuality import sample_indexes
from lmgeom.metrics.isotropy import REPORT_MAX_ROWS, MomentAccumulator, isotropy_report
from lmgeom.runs.extraction import open_or_extract
from lmgeom.progress import NoProgress, Progress
from lmgeom.runs.results import write_json, write_records_csv
from lmgeom.runs.selection import RowSelection, select_rows
from lmgeom.runs.tally import DEFAULT_CHUNK_ROWS, Feed, tally
from lmgeom.store import RepresentationStore

# The measures recorded before/after; counts (n_points, dim) are settings, not measures.
REPORT_MEASURES = (
    "log_partition_isotropy",
    "log_partition_isotropy_centered",
    "partition_isotropy",
    "partition_isotropy_centered",
    "isoscore",
    "average_cosine",
    "effective_rank",
    "participation_ratio",
    "top1_variance_share",
    "top10_variance_share",
    "rogue_top_share",
    "average_cosine_without_rogue",
    "average_cosine_standardized",
)


@dataclass
class CalibrationResult:
    """The store calibrated, the tidy before/after records, and the files written."""

    store: RepresentationStore
    records: list[dict[str, Any]]
    paths: list[Path]


def fit_store(
    estimator: Calibrator,
    store: RepresentationStore,
    layer: int,
    *,
    include_punct: bool = False,
    include_special: bool = False,
    max_rows: int = FIT_MAX_ROWS,
    seed: int = 0,
    selection: RowSelection | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> Calibrator:
    """Fit `estimator` in place on the selected rows of one store layer and return it.

    Calibrators that need only mean and covariance (whitening, abtt, standardize) stream over every
    selected row in one pass (float64 moments); the others fit on a seeded subsample of `max_rows`."""
    if selection is None:
        selection = select_rows(store.tokens, include_special=include_special, include_punct=include_punct)
    if isinstance(estimator, MomentCalibrator):
        moments = MomentAccumulator(full_covariance=estimator.full_covariance)
        tally(store, layer, [Feed(moments, selection.mask)], chunk_rows=chunk_rows)
        return estimator.fit_moments(moments)
    sample = sample_indexes(selection.rows, max_rows, seed)
    return estimator.fit(as_float64_rows(store.rows(layer, sample), name="store rows", layer=layer))


def calibrate_store(
    store: RepresentationStore | str,
    *,
    corpus: str = "lee",
    device: str = "auto",
    methods: Sequence[str] = tuple(METHODS),
    layers: Sequence[int] | None = None,
    include_punct: bool = False,
    include_special: bool = False,
    eval_rows: int = REPORT_MAX_ROWS,
    fit_rows: int = FIT_MAX_ROWS,
    seed: int = 0,
    save: bool = True,
    progress: Progress | None = None,
) -> CalibrationResult:
    """Fit each method on each layer and measure isotropy before and after, as tidy records.

    One record per (layer, method, measure) with the value `before` and `after` calibration, both
    measured on the same seeded subsample of `eval_rows` selected rows. With `save`, fitted
    calibrators go to STORE/calibrators/<method>-L<layer>.npz|.pt and the records to
    STORE/calibration.json and calibration.csv.

    `store` may be a store, a store's path, or a model name (then `corpus` is extracted with it into
    runs/<model>-<corpus> first, or resumed there; `device` is where that model runs)."""
    if not isinstance(store, RepresentationStore):
        store = open_or_extract(store, corpus=corpus, device=device, progress=progress)
    unknown = [method for method in methods if method not in METHODS]
    if unknown or not methods:
        raise ValueError(f"unknown calibration method(s) {unknown or '(none given)'}; choose from {', '.join(METHODS)}")
    progress = progress or NoProgress()
    layers = list(store.layers if layers is None else layers)
    for layer in layers:
        store.layer(layer)  # raises a clear IndexError for a layer the store lacks
    selection = select_rows(store.tokens, include_special=include_special, include_punct=include_punct)
    eval_sample = sample_indexes(selection.rows, eval_rows, seed)
    n_selected = len(selection.rows)
    n_fit = {method: n_selected if issubclass(METHODS[method], MomentCalibrator) else min(n_selected, fit_rows)
             for method in methods}
    progress.start("calibrate", len(layers) * len(methods), unit="fits")
    records: list[dict[str, Any]] = []
    for layer in layers:
        X_eval = as_float64_rows(store.rows(layer, eval_sample), name="store rows", layer=layer)
        before = isotropy_report(X_eval, seed=seed, max_rows=None)
        for method in methods:
            estimator = fit_store(make_calibrator(method, seed=seed), store, layer, max_rows=fit_rows, seed=seed,
                                  selection=selection)
            after = isotropy_report(estimator.transform(X_eval), seed=seed, max_rows=None)
            if save:
                estimator.save(store.path / "calibrators" / f"{method}-L{layer}")
            records.extend(
                {
                    "layer": layer,
                    "method": method,
                    "measure": measure,
                    "before": before.get(measure, float("nan")),
                    "after": after.get(measure, float("nan")),
                    "n_fit_rows": n_fit[method],
                    "n_eval_rows": len(eval_sample),
                }
                for measure in REPORT_MEASURES
            )
            progress.advance("calibrate", note=f"done: L{layer} {method}")
    store.check_unchanged()
    paths: list[Path] = []
    if save:
        settings = {
            "methods": list(methods), "layers": layers, **selection.options(),
            "eval_rows": len(eval_sample), "fit_rows_subsampled_methods": fit_rows, "seed": seed,
        }
        paths = [
            write_json(store.path / "calibration.json", "calibration", {"settings": settings, "records": records}, store_meta=store.meta),
            write_records_csv(store.path / "calibration.csv", records),
            store.path / "calibrators",
        ]
    return CalibrationResult(store, records, paths)
