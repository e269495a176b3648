"""Fitting calibrators on a representation store and measuring isotropy before and after."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from lmgeom.calibrate._base import Calibrator
from lmgeom.calibrate.cluster import ClusterIsotropy
from lmgeom.calibrate.flow import FlowCalibrator
from lmgeom.calibrate.linear import AllButTheTop, Standardize, Whitening
from lmgeom.metrics.base import as_float64_rows
from lmgeom.metrics.contextuality import sample_indexes
from lmgeom.metrics.isotropy import REPORT_MAX_ROWS, MomentAccumulator, isotropy_report
from lmgeom.results import write_json, write_records_csv
from lmgeom.store import RepresentationStore

METHODS: dict[str, type[Calibrator]] = {
    "whitening": Whitening,
    "abtt": AllButTheTop,
    "cie": ClusterIsotropy,
    "flow": FlowCalibrator,
    "standardize": Standardize,
}
# Calibrators without partial_fit (k-means, the flow) fit on a seeded subsample of this many rows.
FIT_MAX_ROWS = 100_000
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


def make_calibrator(method: str, *, seed: int = 0) -> Calibrator:
    """A calibrator with its default settings by CLI name (whitening, abtt, cie, flow, standardize)."""
    if method not in METHODS:
        raise ValueError(f"unknown calibration method {method!r}; choose from {', '.join(METHODS)}")
    estimator = METHODS[method]()
    if "random_state" in estimator.get_params():
        estimator.set_params(random_state=seed)
    return estimator


def included_rows(store: RepresentationStore, *, exclude_punct: bool = True, exclude_special: bool = True) -> np.ndarray:
    """Row indexes of the store's tokens that take part (punctuation / special tokens left out by default)."""
    keep = np.ones(store.n_tokens, dtype=bool)
    if exclude_punct:
        keep &= ~store.tokens["is_punct"].to_numpy(dtype=bool)
    if exclude_special:
        keep &= ~store.tokens["is_special"].to_numpy(dtype=bool)
    rows = np.flatnonzero(keep)
    if len(rows) == 0:
        raise ValueError(f"{store.path} has no rows left after excluding punctuation/special tokens; include them")
    return rows


def fit_store(
    estimator: Calibrator,
    store: RepresentationStore,
    layer: int,
    *,
    exclude_punct: bool = True,
    exclude_special: bool = True,
    max_rows: int = FIT_MAX_ROWS,
    seed: int = 0,
    chunk_rows: int = 65536,
) -> Calibrator:
    """Fit `estimator` in place on one store layer and return it.

    Calibrators that need only mean and covariance (whitening, abtt, standardize) stream over every
    included row in one pass (float64 moments); the others fit on a seeded subsample of `max_rows`."""
    rows = included_rows(store, exclude_punct=exclude_punct, exclude_special=exclude_special)
    if hasattr(estimator, "fit_moments"):
        keep = np.zeros(store.n_tokens, dtype=bool)
        keep[rows] = True
        accumulator = MomentAccumulator(full_covariance=estimator._full_covariance)
        for start, chunk in store.iter_chunks(layer, chunk_rows=chunk_rows):
            chunk = as_float64_rows(chunk, name="store rows", layer=layer, row_offset=start)
            accumulator.add(chunk[keep[start : start + len(chunk)]])
        return estimator.fit_moments(accumulator)
    sample = sample_indexes(rows, max_rows, seed)
    return estimator.fit(as_float64_rows(store.rows(layer, sample), name="store rows", layer=layer))


def calibrate_store(
    store: RepresentationStore,
    *,
    methods: Sequence[str] = tuple(METHODS),
    layers: Sequence[int] | None = None,
    exclude_punct: bool = True,
    exclude_special: bool = True,
    eval_rows: int = REPORT_MAX_ROWS,
    fit_rows: int = FIT_MAX_ROWS,
    seed: int = 0,
    save: bool = True,
    on_step: Callable[[int, str], None] | None = None,
) -> list[dict[str, Any]]:
    """Fit each method on each layer and measure isotropy before and after, as tidy records.

    One record per (layer, method, measure) with the value `before` and `after` calibration, both
    measured on the same seeded subsample of `eval_rows` included rows. With `save`, fitted
    calibrators go to STORE/calibrators/<method>-L<layer>.npz|.pt and the records to
    STORE/calibration.json and calibration.csv. `on_step(layer, method)` is called after each fit."""
    unknown = [method for method in methods if method not in METHODS]
    if unknown or not methods:
        raise ValueError(f"unknown calibration method(s) {unknown or '(none given)'}; choose from {', '.join(METHODS)}")
    layers = list(store.layers if layers is None else layers)
    for layer in layers:
        store.layer(layer)  # raises a clear IndexError for a layer the store lacks
    rows = included_rows(store, exclude_punct=exclude_punct, exclude_special=exclude_special)
    eval_sample = sample_indexes(rows, eval_rows, seed)
    n_fit = {method: len(rows) if hasattr(METHODS[method], "fit_moments") else min(len(rows), fit_rows) for method in methods}
    records: list[dict[str, Any]] = []
    for layer in layers:
        X_eval = as_float64_rows(store.rows(layer, eval_sample), name="store rows", layer=layer)
        before = isotropy_report(X_eval, seed=seed, max_rows=None)
        for method in methods:
            estimator = fit_store(
                make_calibrator(method, seed=seed), store, layer,
                exclude_punct=exclude_punct, exclude_special=exclude_special, max_rows=fit_rows, seed=seed,
            )
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
            if on_step is not None:
                on_step(layer, method)
    if save:
        settings = {
            "methods": list(methods), "layers": layers, "exclude_punct": exclude_punct, "exclude_special": exclude_special,
            "eval_rows": len(eval_sample), "fit_rows_subsampled_methods": fit_rows, "seed": seed,
        }
        write_json(store.path / "calibration.json", "calibration", {"settings": settings, "records": records}, store_meta=store.meta)
        write_records_csv(store.path / "calibration.csv", records)
    return records
