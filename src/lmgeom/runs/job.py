"""The main job behind `lmgeom run`: its steps, recorded in run.json, and the per-layer summary."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from lmgeom.errors import InputError
from lmgeom.corpus import require_count
from lmgeom.progress import NoProgress, Progress
from lmgeom.runs.analysis import ContextualityResult, analyze_store, require_num_workers
from lmgeom.runs.calibration import calibrate_store, holds_fits
from lmgeom.runs.extraction import extract_model
from lmgeom.runs.isotropy import measure_isotropy
from lmgeom.runs.reporting import render_report
from lmgeom.runs.static import export_static_embeddings
from lmgeom.runs import rundir
from lmgeom.runs.rundir import write_json
from lmgeom.store import RepresentationStore, layout
from lmgeom.store.location import Location, is_url


def layer_summary(store: RepresentationStore, contextuality: ContextualityResult, *, write: bool = True) -> list[dict[str, Any]]:
    """Per layer over the occurrences `contextuality` analysed (no special tokens, no punctuation by
    default): mean norm, the mean cosine of 1,000 random occurrences (seeded, as Ethayarajh 2019
    sampled) and the exact mean over all pairs. Written to STORE/summary.json."""
    table = contextuality.layers.set_index(["layer", "metric"])
    records = [
        {
            "layer": layer,
            "n_occurrences": contextuality.counts["rows_analysed"],
            "mean_norm": contextuality.counts["mean_norm_by_layer"][layer],
            "sampled_average_cosine": float(table.at[(layer, "anisotropy_sampled"), "raw"]),
            "average_cosine": float(table.at[(layer, "anisotropy_exact"), "raw"]),
        }
        for layer in contextuality.settings["layers"]
    ]
    if write:
        write_json(rundir.SUMMARY.at(store.path), "layer_summary", {"seed": contextuality.settings["seed"], "layers": records},
                   store_meta=store.meta)
    return records


DEFAULT_CALIBRATION_METHODS = ("whitening", "abtt")


def run_layers(layers: list[int], spec: str | Sequence[int] = "default") -> list[int]:
    """The layers of the per-layer steps among the stored `layers`: "default" is the first, the middle
    layer and the last (0, L // 2, L when every layer is stored; else the stored layer nearest L // 2),
    "all" every stored layer, or the given layer numbers."""
    if isinstance(spec, str):
        if spec == "default":
            last = layers[-1]
            return sorted({layers[0], min(layers, key=lambda layer: (abs(layer - last // 2), layer)), last})
        if spec == "all":
            return list(layers)
        try:
            spec = [int(item) for item in spec.split(",") if item.strip()]
        except ValueError:
            raise InputError(f"`layers` takes 'default', 'all' or comma-separated layer numbers; got {spec!r}",
                             param="layers") from None
    chosen = sorted(set(int(layer) for layer in spec))
    outside = [layer for layer in chosen if layer not in layers]
    if outside or not chosen:
        raise InputError(f"layers {outside or '(none)'} are not in this store's layers {', '.join(map(str, layers))} "
                         "(0 = embedding output)", param="layers")
    return chosen


class _Steps:
    """The run's record of finished steps (RUN/run.json): a step whose settings are unchanged and
    whose outputs are all there and read as what they should be (a JSON result of its kind and
    schema, a CSV table) is skipped when the run is repeated or resumed; any other step is redone."""

    def __init__(self, store: RepresentationStore) -> None:
        self.store = store
        self.path = rundir.RUN.at(store.path)
        identity = {key: store.meta.get(key) for key in ("model_id", "model_fingerprint", "corpus_fingerprint", "created")}
        self.identity = identity
        self.document: dict[str, Any] = {"steps": {}}
        try:
            previous = rundir.read_json(self.path, "run")
        except rundir.ResultFileError:
            previous = None  # an unreadable record: every step is checked again by running it
        if previous is not None and previous.get("store") == identity:
            self.document = previous
        self.ran: list[str] = []
        self.skipped: list[str] = []

    def done(self, name: str, settings: dict[str, Any], *, holds: Callable[[Any], bool] | None = None) -> bool:
        """Whether step `name` finished with these settings; `holds` checks what the step recorded
        it left in a file that other commands also write (`record`'s `holds`)."""
        step = self.document["steps"].get(name)
        finished = (step is not None and step["settings"] == json.loads(json.dumps(settings))
                    and all(rundir.problem(self.store.path, path) is None for path in step["outputs"])
                    and (holds is None or holds(step.get("holds"))))
        if finished:
            self.skipped.append(name)
        return finished

    def record(self, name: str, settings: dict[str, Any], started: float, outputs: Sequence[Path], *,
               holds: Any = None) -> None:
        step = {"settings": settings, "seconds": round(time.perf_counter() - started, 3),
                "outputs": [str(Path(path).relative_to(self.store.path)) for path in outputs]}
        self.document["steps"][name] = {**step, **({"holds": holds} if holds is not None else {})}
        self.ran.append(name)
        write_json(self.path, "run", {"store": self.identity, "steps": self.document["steps"]}, store_meta=self.store.meta)


@dataclass
class RunResult:
    """What `run` did: the store, the analyses, the files written, and which steps ran or were skipped."""

    store: RepresentationStore
    contextuality: ContextualityResult
    summary: list[dict[str, Any]]
    paths: list[Path]
    steps_run: list[str]
    steps_skipped: list[str]


def run_folder(out: str | os.PathLike[str] | None) -> str | os.PathLike[str] | None:
    """The local folder of a run's `out`: a path, or a file:// URL. Any other URL is refused before
    anything runs, since the steps after extraction write local files next to the store."""
    if out is None or not is_url(out):
        return out
    location = Location.of(out)
    if location.is_local:
        return location.local_path
    raise InputError(
        f"`out` {location.url}: the steps after extraction (run.json, summary, isotropy, calibration, "
        "static embeddings, report.html) write local files next to the store, and this is not a local folder; "
        "give a local folder or a file:// URL as `out` (then copy the finished run to object storage), "
        "or run `lmgeom extract --out URL` and `lmgeom analyze URL`, which read and write object storage in place",
        param="out",
    )


def run(
    model: str = "minilm",
    corpus: str = "lee",
    *,
    out: str | os.PathLike[str] | None = None,
    limit: int | None = None,
    device: str = "auto",
    min_contexts: int = 5,
    seed: int = 0,
    layers: str | Sequence[int] = "default",
    store_layers: str | Sequence[int] | None = None,
    methods: Sequence[str] = DEFAULT_CALIBRATION_METHODS,
    include: Sequence[str | os.PathLike[str]] = (),
    overwrite: bool = False,
    num_workers: int = 2,
    progress: Progress | None = None,
) -> RunResult:
    """The main job: extract every layer of `model` on `corpus`, analyse every layer as Ethayarajh
    (2019) did (contextuality.json, summary.json), measure the isotropy of every layer
    (isotropy.json), calibrate `layers` with `methods` (calibration.json), and distil and score static
    embeddings of `layers` (static/), then render report.html with its figures (experiment results
    under RUN/experiments/ and in `include` folders are shown too). Each step is recorded in run.json
    and skipped when repeated with the same settings; an interrupted extraction resumes. `out` is a
    local folder or a file:// URL (`run_folder`). `num_workers`: layers the contextuality analysis
    runs at once, each in a worker process (`analyze_store`: at most one per CPU, the same numbers,
    about this many times one layer's memory); not a setting of the step, as it changes no number."""
    require_num_workers(num_workers)  # before the extraction, which can take hours
    require_count(limit, "limit")
    progress = progress or NoProgress()
    out = run_folder(out)
    started = time.perf_counter()
    store = extract_model(model, corpus, out=out, limit=limit, store_layers=store_layers, device=device, overwrite=overwrite,
                          progress=progress)
    steps = _Steps(store)
    settings: dict[str, Any] = {"model": model, "corpus": corpus, "limit": limit}
    if not steps.done("extract", settings):  # an extraction resumed or finished just now
        steps.record("extract", settings, started, [store.path / layout.META])
    per_layer = run_layers(store.layers, layers)
    paths: list[Path] = []

    settings = {"min_contexts": min_contexts, "seed": seed}
    if steps.done("contextuality", settings):
        contextuality = ContextualityResult.read(store)
    else:
        started = time.perf_counter()
        contextuality = analyze_store(store, min_contexts=min_contexts, seed=seed, progress=progress, write_to=True,
                                       num_workers=num_workers, device=device)
        steps.record("contextuality", settings, started, list(contextuality.written.values()))
    summary = layer_summary(store, contextuality)
    paths += [rundir.SUMMARY.at(store.path), *(spec.at(store.path) for spec in
              (rundir.CONTEXTUALITY, rundir.CONTEXTUALITY_LAYERS, rundir.CONTEXTUALITY_WORDS))]

    settings = {"seed": seed}
    if not steps.done("isotropy", settings):
        started = time.perf_counter()
        steps.record("isotropy", settings, started, measure_isotropy(store, seed=seed, progress=progress).paths)
    paths.append(rundir.ISOTROPY.at(store.path))

    # calibration.json also takes the fits of `lmgeom calibrate`: the step is done while the file
    # still holds the fits it made (merged, never replaced, by a later calibration of other layers)
    settings = {"layers": per_layer, "methods": list(methods), "seed": seed}
    if not steps.done("calibration", settings, holds=lambda fits: fits is not None and holds_fits(store.path, fits)):
        started = time.perf_counter()
        calibrated = calibrate_store(store, methods=methods, layers=per_layer, seed=seed, progress=progress)
        steps.record("calibration", settings, started, calibrated.paths, holds=calibrated.fits)
    paths.append(rundir.CALIBRATION.at(store.path))

    settings = {"layers": per_layer}
    if not steps.done("static_embeddings", settings):
        started = time.perf_counter()
        written = [path for layer in per_layer
                   for path in export_static_embeddings(store, layer=layer, progress=progress).paths.values()]
        steps.record("static_embeddings", settings, started, written)
    paths += [rundir.STATIC_BENCHMARKS.at(store.path, layer=layer) for layer in per_layer]

    # the explorer caches itself (explorer.json, by its own settings); the page is always re-rendered
    started = time.perf_counter()
    report = render_report(store.path, include=include, progress=progress)
    steps.record("report", {"include": [str(path) for path in include]}, started, [report])
    paths.append(report)
    return RunResult(store, contextuality, summary, paths, steps.ran, steps.skipped)
