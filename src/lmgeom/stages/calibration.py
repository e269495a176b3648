"""Fitting calibrators on a store's layers and measuring isotropy before and after."""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from lmgeom.errors import InputError
from lmgeom.layerspec import LayerSpec, select_layers
from lmgeom.calibrate import DEFAULT_METHODS, FIT_MAX_ROWS, METHODS, Calibrator, make_calibrator
from lmgeom.calibrate.linear import MomentCalibrator
from lmgeom.metrics.base import as_float64_rows
from lmgeom.metrics.contextuality import sample_indexes
from lmgeom.metrics.isotropy import REPORT_MAX_ROWS, isotropy_report
from lmgeom.stages.extraction import open_or_extract
from lmgeom.progress import NoProgress, Progress
from lmgeom.rundir import (CALIBRATION, CALIBRATION_CSV, CALIBRATOR, CALIBRATORS, ResultFileError, Target, Where,
                                expected_store, provenance_problem, read_json, records_csv, site_results, write_result_set,
                                write_with)
from lmgeom.sitespec import DEFAULT_SITE, check_site
from lmgeom.engine.selection import RowSelection, select_rows
from lmgeom.engine import AnalysisOptions, run_analysis
from lmgeom.engine.loop import DEFAULT_CHUNK_ROWS
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


@dataclass(frozen=True)
class CalibrationOptions:
    """What a calibration fits and measures, as one object (built by `lmgeom calibrate` from its flags
    and by `run` from its keywords, and passed whole).

    `methods` to fit on each of `layers` (default `lmgeom.calibrate.DEFAULT_METHODS`; `layers` a
    `lmgeom.layerspec` spec, resolved against the store's layers when it is calibrated; None: every
    layer of the store); the rows selected as `lmgeom.engine.selection` documents (`include_punct`, `include_special`); isotropy measured on a
    seeded subsample of `eval_rows` rows, the subsampling methods (cie, flow) fitted on `fit_rows`;
    `seed` for subsamples, k-means and the flow. `site`: the capture site whose layers are calibrated
    (`lmgeom.sitespec`; one of the store's `sites`), by default `resid_post`; the settings record it
    when it is another. `device`: where the calibrators that train (the flow) compute, as
    `lmgeom.device.resolve_device` reads it; it changes no recorded setting."""

    methods: tuple[str, ...] = DEFAULT_METHODS
    layers: LayerSpec = None
    include_punct: bool = False
    include_special: bool = False
    eval_rows: int = REPORT_MAX_ROWS
    fit_rows: int = FIT_MAX_ROWS
    seed: int = 0
    site: str = DEFAULT_SITE
    device: str = "cpu"

    def __post_init__(self) -> None:
        check_site(self.site, param="site")
        object.__setattr__(self, "methods", tuple(self.methods))
        if self.layers is not None and not isinstance(self.layers, str):
            object.__setattr__(self, "layers", tuple(int(layer) for layer in self.layers))
        unknown = [method for method in self.methods if method not in METHODS]
        if unknown or not self.methods:
            raise InputError(f"unknown calibration method(s) {unknown or '(none given)'}; choose from {', '.join(METHODS)}",
                             param="methods")
        for name in ("eval_rows", "fit_rows"):
            if int(getattr(self, name)) < 2:
                raise InputError(f"`{name}` must be at least 2, got {getattr(self, name)}", param=name)

    def to_settings(self) -> dict[str, Any]:
        """The options as run.json records them (`device` is not among them: it changes no number; `site`
        only when it is not `resid_post`)."""
        return {"methods": list(self.methods),
                "layers": self.layers if self.layers is None or isinstance(self.layers, str) else list(self.layers),
                "include_punct": self.include_punct, "include_special": self.include_special,
                "eval_rows": self.eval_rows, "fit_rows": self.fit_rows, "seed": self.seed,
                **({"site": self.site} if self.site != DEFAULT_SITE else {})}

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], *, device: str = "cpu") -> CalibrationOptions:
        """The options `to_settings` recorded (those it lacks at their defaults)."""
        known = {name: settings[name] for name in ("methods", "layers", "include_punct", "include_special",
                                                   "eval_rows", "fit_rows", "seed", "site") if name in settings}
        return cls(**known, device=device)


@dataclass
class CalibrationResult:
    """The store calibrated, the tidy before/after records and the fits of this call (one per layer
    and method: its options), and the files written."""

    store: RepresentationStore
    records: list[dict[str, Any]]
    fits: list[dict[str, Any]]
    paths: list[Target]
    device: str = "cpu"  # where the flow trained (resolved: "cpu", "cuda:0")


def _key(item: dict[str, Any]) -> tuple[int, str]:
    return int(item["layer"]), str(item["method"])


def _method_order(method: str) -> int:
    return list(METHODS).index(method) if method in METHODS else len(METHODS)


def _order(item: dict[str, Any]) -> tuple[int, int]:
    layer, method = _key(item)
    return layer, _method_order(method)


def read_calibration(directory: Where) -> dict[str, Any] | None:
    """DIR/calibration.json with its `fits` (for a file written without them: the file's settings
    for each of its (layer, method)), or None when there is none."""
    document = read_json(CALIBRATION.at(directory), "calibration")
    if document is not None and "fits" not in document:
        shared = {key: value for key, value in document["settings"].items() if key not in ("layers", "methods")}
        keys = dict.fromkeys(_key(record) for record in document["records"])
        document["fits"] = [{"layer": layer, "method": method, **shared} for layer, method in keys]
    return document


def holds_fits(directory: Where, fits: Sequence[dict[str, Any]]) -> bool:
    """Whether DIR/calibration.json still holds each of these fits (a later fit of the same layer and
    method with other options replaces one)."""
    try:
        document = read_calibration(directory)
    except ResultFileError:
        return False
    if document is None:
        return False
    held = [_options(fit) for fit in document["fits"]]
    return all(_options(fit) in held for fit in fits)


def _options(fit: dict[str, Any]) -> dict[str, Any]:
    """A fit's layer, method and options: what makes two fits the same (its `seconds` does not)."""
    return {key: value for key, value in fit.items() if key != "seconds"}


def merge_calibration(document: dict[str, Any] | None, fits: list[dict[str, Any]],
                      records: list[dict[str, Any]]) -> dict[str, Any]:
    """The payload of calibration.json with these fits and records merged into `document`'s by
    (layer, method): a fit of a (layer, method) replaces that one's fit and records, the others stay.
    `settings` holds the layers and methods of every fit, and each option all the fits share."""
    replaced = {_key(fit) for fit in fits}
    kept_fits = [fit for fit in (document or {}).get("fits", []) if _key(fit) not in replaced]
    kept_records = [record for record in (document or {}).get("records", []) if _key(record) not in replaced]
    all_fits = sorted([*kept_fits, *fits], key=_order)
    options = [{key: value for key, value in _options(fit).items() if key not in ("layer", "method")} for fit in all_fits]
    shared = {key: value for key, value in options[0].items() if all(option.get(key) == value for option in options)}
    settings = {"methods": sorted({str(fit["method"]) for fit in all_fits}, key=_method_order),
                "layers": sorted({int(fit["layer"]) for fit in all_fits}), **shared}
    return {"settings": settings, "fits": all_fits, "records": sorted([*kept_records, *records], key=_order)}


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
    """Fit `estimator` in place on the selected rows of one store layer (of the store's `site`) and return it.

    Calibrators that need only mean and covariance (whitening, abtt, standardize) stream over every
    selected row in one pass (float64 moments); the others fit on a seeded subsample of `max_rows`."""
    if selection is None:
        selection = select_rows(store.tokens, include_special=include_special, include_punct=include_punct)
    if isinstance(estimator, MomentCalibrator):
        statistic = "moments" if estimator.full_covariance else "variances"
        options = AnalysisOptions(include_special=selection.include_special, include_punct=selection.include_punct,
                                  exclude_first_word=selection.exclude_first_word, layers=(layer,), statistics=(statistic,),
                                  chunk_rows=chunk_rows, device="cpu", site=store.site)
        return estimator.fit_moments(run_analysis(store, options).layers[layer][statistic])
    sample = sample_indexes(selection.rows, max_rows, seed)
    return estimator.fit(as_float64_rows(store.rows(layer, sample), name="store rows", layer=layer))


def calibrate_store(
    store: RepresentationStore | str,
    options: CalibrationOptions | None = None,
    *,
    corpus: str = "lee",
    save: bool = True,
    progress: Progress | None = None,
) -> CalibrationResult:
    """Fit each method on each layer and measure isotropy before and after, as tidy records
    (`options`: what to fit and measure, `CalibrationOptions`).

    One record per (layer, method, measure) with the value `before` and `after` calibration, both
    measured on the same seeded subsample of `eval_rows` selected rows, of the layers of capture site
    `options.site` (a site the store does not hold is an `InputError` naming the sites it holds). With
    `save`, fitted calibrators go to STORE/calibrators/<method>-L<layer>.npz|.pt and the records are
    merged into STORE/calibration.json and calibration.csv by (layer, method) — for a site but
    `resid_post`, into its folder STORE/site_results/<site>/ (`rundir.site_results`) instead: a re-fit of
    a (layer, method) replaces that one's records and calibrator, the others (such as those `run` wrote) stay. The
    file's `fits` record the options of each (layer, method) it holds, and `seconds`, the wall time its
    fit took (the progress note names the fit running and the time of each done); the file records
    the device the flow trained on (`device`).

    `store` may be a store, a store's path or URL, or a model name (then `corpus` is extracted with it
    into runs/<model>-<corpus> first, or resumed there, on `options.device`)."""
    from lmgeom.device import device_name, resolve_device  # torch: only where a calibration runs

    options = options or CalibrationOptions()
    device = device_name(resolve_device(options.device))
    if not isinstance(store, RepresentationStore):
        store = open_or_extract(store, corpus=corpus, device=device, progress=progress)
    store = store.at_site(options.site)  # a site the store does not hold is refused here
    folder = site_results(store.url, options.site)
    methods, seed, fit_rows = options.methods, options.seed, options.fit_rows
    progress = progress or NoProgress()
    layers = select_layers(options.layers, store.layers, n_layers=store.n_model_layers)
    options = replace(options, layers=tuple(layers))  # the layers fitted, as the files record them
    previous = _previous_calibration(store, folder) if save else None
    selection = select_rows(store.tokens, include_special=options.include_special, include_punct=options.include_punct)
    eval_sample = sample_indexes(selection.rows, options.eval_rows, seed)
    n_selected = len(selection.rows)
    n_fit = {method: n_selected if issubclass(METHODS[method], MomentCalibrator) else min(n_selected, fit_rows)
             for method in methods}
    fit_options = {**selection.options(), "eval_rows": len(eval_sample), "fit_rows_subsampled_methods": fit_rows, "seed": seed,
                   **({"site": options.site} if options.site != DEFAULT_SITE else {})}
    progress.start("calibrate", len(layers) * len(methods), unit="fits")
    records: list[dict[str, Any]] = []
    fits: list[dict[str, Any]] = []
    for layer in layers:
        progress.advance("calibrate", 0, note=f"isotropy of L{layer} before calibration")
        X_eval = as_float64_rows(store.rows(layer, eval_sample), name="store rows", layer=layer)
        before = isotropy_report(X_eval, seed=seed, max_rows=None)
        for method in methods:
            progress.advance("calibrate", 0, note=f"fitting L{layer} {method}")
            started = time.perf_counter()
            estimator = make_calibrator(method, seed=seed)
            if "device" in estimator.get_params():
                estimator.set_params(device=device)
            estimator = fit_store(estimator, store, layer, max_rows=fit_rows, seed=seed, selection=selection)
            seconds = time.perf_counter() - started
            after = isotropy_report(estimator.transform(X_eval), seed=seed, max_rows=None)
            if save:
                write_with(CALIBRATOR.at(folder, method=method, layer=layer), estimator.save)
            fits.append({"layer": layer, "method": method, **fit_options, "seconds": round(seconds, 3)})
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
            progress.advance("calibrate", note=f"L{layer} {method} fitted in {seconds:.1f} s")
    store.check_unchanged()
    paths: list[Target] = []
    if save:
        merged = merge_calibration(previous, fits, records)
        # the document's settings are the last calibration's; `fits` records the options of each (layer, method)
        paths = [*write_result_set(CALIBRATION.at(folder), CALIBRATION.kind, {**merged, "device": device},
                                   store_meta=store.meta, settings=options.to_settings(),
                                   companions=[(CALIBRATION_CSV.at(folder), records_csv(merged["records"]))]),
                 CALIBRATORS.at(folder)]
    return CalibrationResult(store, records, fits, paths, device)



def _previous_calibration(store: RepresentationStore, folder: Where) -> dict[str, Any] | None:
    """The calibration.json in `folder` (the store's, or its site's results folder) to merge into; one
    that does not read, or is not this store's (another store generation, a mixed set), holds nothing
    to keep, and is replaced (with a warning naming it)."""
    try:
        document = read_calibration(folder)
        if document is not None:
            path = CALIBRATION.at(folder)
            problem = provenance_problem(path, document, store=expected_store(store.url))
            if problem is not None:
                raise ResultFileError(f"{path} {problem}")
        return document
    except ResultFileError as error:
        warnings.warn(f"{error}; it is replaced by this calibration's records", stacklevel=3)
        return None
