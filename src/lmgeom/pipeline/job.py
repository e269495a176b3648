"""The main job behind `lmgeom run`: its steps, recorded in run.json, and the per-layer summary."""

from __future__ import annotations

import html
import json
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import pandas as pd

from lmgeom.errors import InputError, MissingInput
from lmgeom.corpus.builtin import DEFAULT_DATA_DIR
from lmgeom.corpus import require_count
from lmgeom.progress import NoProgress, Progress, StderrProgress
from lmgeom.report.data import RunData, load_run
from lmgeom.report.missing_data import skipped_inputs
from lmgeom.stages.analysis import analyze_store
from lmgeom.stages.contextuality import ContextualityResult
from lmgeom.engine import AnalysisOptions
from lmgeom.engine.options import protocol_options
from lmgeom.stages.calibration import DEFAULT_METHODS, CalibrationOptions, calibrate_store, holds_fits
from lmgeom.stages.extraction import extract_model
from lmgeom.stages.geometry import GeometryOptions, measure_geometry
from lmgeom.stages.isotropy import IsotropyOptions, measure_isotropy
from lmgeom.pipeline.reporting import render_report
from lmgeom.stages.similarity import DEFAULT_PERMUTATIONS, SimilarityOptions, similarity_matrix, write_similarity
from lmgeom.evaluate.wordbench import DEFAULT_MIN_COVERAGE
from lmgeom.stages.static import StaticOptions, export_static_embeddings, read_benchmark_records
from lmgeom.layerspec import select_layers
from lmgeom.controlspec import check_control, check_control_seed
from lmgeom.sitespec import parse_sites
from lmgeom import rundir
from lmgeom.rundir import Target, write_json
from lmgeom.store import RepresentationStore, layout


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
        rundir.write_result_set(rundir.SUMMARY.at(store.url), rundir.SUMMARY.kind,
                                {"seed": contextuality.settings["seed"], "layers": records}, store_meta=store.meta,
                                settings=contextuality.options)
    return records


class _Steps:
    """The run's record of finished steps (RUN/run.json). A step is skipped when the run is repeated
    or resumed only if run.json records it with these settings, and each of its outputs is there, reads
    as what it should be (a JSON result of its kind and schema, a CSV table) and, for a result
    document, records the same store generation, the settings expected of it and companions whose
    hashes match (`rundir.provenance_problem`); any other step is redone. Each step also records the
    `device` it computed on, which is not among its settings (the numbers agree on every device).
    Once every result is written, `skipped_inputs` holds what the run did not find
    (`lmgeom.report.missing_data`), recorded in run.json with the steps."""

    def __init__(self, store: RepresentationStore, device: str, protocol: str | None = None) -> None:
        self.store = store
        self.device = device
        self.protocol = protocol
        self.path = rundir.RUN.at(store.url)
        identity = {key: store.meta.get(key) for key in ("model_id", "model_fingerprint", "corpus_fingerprint", "created",
                                                          "generation")}
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
        self.skipped_inputs: list[dict[str, Any]] | None = None

    def _stale(self, relative: str, settings: dict[str, Any] | None) -> str | None:
        problem = rundir.problem(self.store.url, relative)
        spec = rundir.spec_of(relative)
        if problem is None and spec is not None and spec.kind:
            path = rundir.target(self.store.url, relative)
            document = rundir.read_json(path, spec.kind)
            assert document is not None
            issue = rundir.provenance_issue(path, document, store=self.identity, settings=settings)
            if issue is not None and issue[0] == rundir.FOREIGN:
                raise rundir.ResultFileError(
                    f"{path} {issue[1]}: it is not this run's result, and `run` will not replace it; move it out of "
                    f"the run (or give another --out) and run again")
            problem = None if issue is None else issue[1]
        return problem

    def done(self, name: str, settings: dict[str, Any], *, file_settings: dict[str, Any] | None = None,
             holds: Callable[[Any], bool] | None = None) -> bool:
        """Whether step `name` finished with these settings; `file_settings` is what each result
        document of the step records as its settings (default `settings`); `holds` checks what the
        step recorded it left in a file that other commands also write (`record`'s `holds`), whose
        documents' settings are then not compared."""
        step = self.document["steps"].get(name)
        expected = file_settings if file_settings is not None else None if holds is not None else settings
        finished = (step is not None and step["settings"] == json.loads(json.dumps(settings))
                    and all(self._stale(path, expected) is None for path in step["outputs"])
                    and (holds is None or holds(step.get("holds"))))
        if finished:
            self.skipped.append(name)
        return finished

    def record(self, name: str, settings: dict[str, Any], started: float, outputs: Sequence[Target], *,
               file_settings: dict[str, Any] | None = None, holds: Any = None) -> None:
        """Step `name` finished with `settings`; `file_settings`: what its result documents record as
        their settings, when that differs (what `report` expects of them: `rundir.run_settings`)."""
        step = {"settings": settings, "device": self.device, "seconds": round(time.perf_counter() - started, 3),
                "outputs": [rundir.relative_to(self.store.url, path) for path in outputs],
                **({"file_settings": file_settings} if file_settings is not None else {})}
        self.document["steps"][name] = {**step, **({"holds": holds} if holds is not None else {})}
        self.ran.append(name)
        inputs = {} if self.skipped_inputs is None else {"skipped_inputs": self.skipped_inputs}
        write_json(self.path, "run", {"store": self.identity, "device": self.device, "protocol": self.protocol,
                                      "steps": self.document["steps"], **inputs}, store_meta=self.store.meta)


@dataclass(repr=False)
class RunResult:
    """What `run` did: the store, the analyses, the files written (local paths, or URLs for a run on
    another filesystem), which steps ran or were skipped, the device they computed on, and the inputs
    it did not find (`skipped_inputs`: run.json's entries, each with the `message` `lmgeom run` prints).

    `run` holds every result of the run as pandas DataFrames, read back from its files as
    `lmgeom.load_run` reads them (`RunData`: `contextuality`, `words`, `isotropy`, `calibration`,
    `static`, `similarity`, `geometry`, `settings`, `store`); a notebook shows its summary."""

    store: RepresentationStore
    contextuality: ContextualityResult
    summary: list[dict[str, Any]]
    paths: list[Target]
    steps_run: list[str]
    steps_skipped: list[str]
    device: str = "cpu"
    skipped_inputs: list[dict[str, Any]] = field(default_factory=list)
    benchmarks: pd.DataFrame | None = None  # the static step's records of every distilled layer (static/<layer>.benchmarks.json)
    run: RunData | None = None  # the run's results as DataFrames (`lmgeom.load_run`)

    def __repr__(self) -> str:
        steps = (f"RunResult: steps run {', '.join(self.steps_run) or 'none'}; skipped {', '.join(self.steps_skipped) or 'none'}; "
                 f"on {self.device}")
        return steps + ("" if self.run is None else "\n" + repr(self.run))

    def _repr_html_(self) -> str:
        steps = html.escape(f"steps run: {', '.join(self.steps_run) or 'none'}; skipped: "
                            f"{', '.join(self.steps_skipped) or 'none'}; on {self.device}")
        return f"<div>{steps}</div>" + ("" if self.run is None else self.run._repr_html_())


def protocol_extraction(protocol: str | None, model: str, corpus: str | None) -> tuple[str, str | None]:
    """The corpus and piece pooling of `protocol` (None: `corpus`, default lee, and the encoder's
    default pooling). `ethayarajh2019`: the STS sentences as the released code reads them
    (`sts-scored[:DIR]`, the default; `sts[:DIR]`, the distinct sentences, is refused; any other corpus
    is that corpus, a deviation the run records), and no pooling (each WordPiece piece a row) for a
    model whose tokenizer is WordPiece."""
    if protocol is None:
        return corpus or "lee", None
    protocol_options(protocol)  # an unknown protocol is refused here
    name, _, argument = (corpus or "sts-scored").partition(":")
    if name == "sts":
        raise InputError(f"`protocol={protocol!r}` reads the STS sentences as the released code does (`corpus='sts-scored"
                         f"{':' + argument if argument else ''}'`: scored pairs, duplicates kept); got `corpus={corpus!r}` "
                         "(every distinct sentence): leave `corpus` out or give sts-scored", param=("protocol", "corpus"))
    from lmgeom.encoders.registry import uses_wordpiece

    return corpus or "sts-scored", "none" if uses_wordpiece(model) else None


def run_device(device: str) -> str:
    """The device every step of `run` computes on, resolved once (`auto`: CUDA when present), as
    results record it: "cpu", "cuda:0", ..."""
    from lmgeom.device import device_name, resolve_device  # torch: a run loads a model anyway

    return device_name(resolve_device(device))


STEPS = ("extract", "contextuality", "isotropy", "calibration", "static_embeddings", "similarity", "geometry", "report")
"""The steps of `run`, in order (run.json's names)."""
_ANY_LAYERS = 1_000_000  # a layer count no model reaches: `layers` checked for its grammar before the model is known


def run(
    model: str = "minilm",
    corpus: str | None = None,
    *,
    out: str | os.PathLike[str] | None = None,
    limit: int | None = None,
    sample: int | None = None,
    device: str = "auto",
    min_contexts: int | None = None,
    count_by: str | None = None,
    protocol: str | None = None,
    seed: int = 0,
    layers: str | Sequence[int] = "default",
    store_layers: str | Sequence[int] | None = None,
    methods: Sequence[str] = DEFAULT_METHODS,
    include: Sequence[str | os.PathLike[str]] = (),
    overwrite: bool = False,
    num_workers: int = 2,
    bootstrap: int = 1000,
    confidence: float = 0.95,
    data_dir: str | os.PathLike[str] | None = None,
    min_coverage: str = str(DEFAULT_MIN_COVERAGE),
    permutations: int = DEFAULT_PERMUTATIONS,
    control: str | None = None,
    control_seed: int = 0,
    sites: str | Sequence[str] | None = None,
    progress: bool | Progress | None = True,
) -> RunResult:
    """The main job behind `lmgeom run`: extract a model's layers on a corpus, analyse, calibrate and report.

    The steps, in order: extract the layers of `model` (every layer, or `store_layers`) on `corpus`;
    analyse every stored layer as Ethayarajh (2019) did (contextuality.json, summary.json); measure
    the isotropy of every layer (isotropy.json); calibrate `layers` with `methods`
    (calibration.json); distil and score static embeddings of `layers` (static/); measure the
    similarity of every pair of layers (similarity.json: CKA, Procrustes, RSA, mutual k-NN with their
    permutation nulls and p-values); measure the intrinsic dimension, outlier panel and uniformity of
    every layer (geometry.json, with the LayerNorm-weight outliers of `model`); then render
    report.html with its figures (experiment results under RUN/experiments/ and in `include` folders
    are shown too). Each step is recorded in run.json and skipped when repeated with the same
    settings; an interrupted run resumes (the extraction from its last committed chunk).

    Parameters
    ----------
    model : str, default "minilm"
        A named model (`lmgeom.encoders.named.NAMED_MODELS`: minilm, smollm2, gemma3, elmo-brown,
        tiny-bert, tiny-gpt2, tiny-llama), a Hugging Face id or a local model folder.
    corpus : str or None, default None
        The corpus spec, as for `lmgeom extract --corpus`. None: lee, or sts-scored under a
        `protocol` (`protocol_extraction`).
    out : str or os.PathLike or None, default None
        A local folder or any fsspec URL (s3://, gs://, memory://, file://): every file of the run is
        written there. None: `lmgeom.stages.extraction.default_run_dir`,
        runs/<model>-<corpus>[-limitN][-sampleN[-seedS]].
    limit : int or None, default None
        Use only the first `limit` sentences of the corpus (at least 1; None: all).
    sample : int or None, default None
        Keep a seeded sample (`seed`) of that many of the corpus's sentences (at least 1; None: all).
    device : str, default "auto"
        Resolved once (`run_device`; "auto": CUDA when present) and recorded in run.json: the model,
        the analysis, isotropy, calibration, the static embeddings, the similarity and geometry compute
        there. A resolved device other than the CPU or CUDA (mps) runs the model and the calibration
        there and leaves the statistics of the other steps on the CPU.
    min_contexts : int or None, default None
        Words analysed are those of at least `min_contexts` distinct sentences or occurrences
        (`count_by`). None: 5, or the `protocol`'s.
    count_by : str or None, default None
        What `min_contexts` counts: "sentences" (distinct sentences) or "occurrences". None:
        sentences, or the `protocol`'s.
    protocol : str or None, default None
        "ethayarajh2019" follows the paper's released code in one switch (`protocol_extraction`:
        the corpus, default sts-scored, and the units; `protocol_options`: the word threshold and the
        released code's sampled statistics beside lmgeom's, the static vectors' words), recorded in
        run.json and every result file; a given option it sets otherwise is refused, naming both.
        None: lmgeom's defaults. The differences that remain are in docs/reproduction/ethayarajh2019.md.
    seed : int, default 0
        The seed of the run's random draws, given to every step: the corpus `sample`; the analysis's
        sampled statistics, bootstrap and the rows isotropy and geometry draw; the calibration's
        subsamples, k-means and flow; the similarity's subsample and shuffles.
    layers : str or sequence of int, default "default"
        The layers to calibrate and distil static embeddings of (`lmgeom.layerspec.select_layers`
        among the stored layers): "default" (the first, middle and last), or e.g. "0,3,-1", "0-3",
        "first", "last", "all", "every:K", or layer numbers (0 = embedding output).
    store_layers : str or sequence of int or None, default None
        The layers the extraction stores (`ExtractionOptions.store_layers`, a
        `lmgeom.layerspec.select_layers` spec such as "all", "last", "0,6,12", "0-3,last", "every:K",
        or layer numbers; None: every layer).
    methods : sequence of str, default ("whitening", "abtt")
        The calibrators fitted on `layers` (`lmgeom.calibrate.METHOD_NAMES`: whitening, abtt, cie,
        flow, standardize, conceptor).
    include : sequence of str or os.PathLike, default ()
        Folders of experiment results (a results.json, or */results.json) shown in the report beside
        those under RUN/experiments/.
    overwrite : bool, default False
        Remove a store already in `out` (complete or interrupted, whatever its settings) with the
        result files lmgeom wrote next to it, and start afresh. Without it, a store of other settings
        there is refused and one of the same settings is resumed.
    num_workers : int, default 2
        Layers the contextuality analysis runs at once, each in a worker process (`analyze_store`: at
        most one per CPU, the same numbers, about this many times one layer's memory); also the
        similarity step's tasks at once. Not a setting of the steps, as it changes no number.
    bootstrap : int, default 1000
        Bootstrap resamples for the contextuality numbers' confidence intervals (0: none; below 100:
        rough, flagged).
    confidence : float, default 0.95
        The level of the percentile bootstrap intervals, strictly between 0 and 1.
    data_dir : str or os.PathLike or None, default None
        The folder holding the word benchmarks of the static embeddings and stsbenchmark/ for
        geometry's alignment (None: LMGEOM_DATA, else ../shared/data). A given one that is not a
        folder is refused before any work. What the run did not find there is in
        `RunResult.skipped_inputs` and run.json (`lmgeom.report.missing_data`).
    min_coverage : str, default "50,10%"
        The fewest covered items a word-benchmark score needs to be a headline number
        (`lmgeom.evaluate.MinCoverage`: items and/or a percentage of the benchmark; "0": no minimum);
        below it the records keep the score with `enough_items` false.
    permutations : int, default 200
        Shuffles of the similarity's permutation nulls of CKA, RSA and mutual k-NN (0: no null and no
        p-value); Procrustes takes `SimilarityOptions`' default (20).
    control : str or None, default None
        A control run instead of the model's (`lmgeom.controlspec`): "random-init" (the model's
        configuration and tokenizer with seeded random weights) or "shuffled" (each sentence's words
        shuffled, seeded, before tokenisation). The store records it (meta.json's ``control``, a
        different model or corpus fingerprint), every result file and the report say it, and the
        default `out` gets -<control>-seedS. Compare it with the model's run in `lmgeom report RUN
        --control CONTROL_RUN` or `lmgeom compare`. None: the model itself.
    control_seed : int, default 0
        The seed of the control's random weights or shuffles (at least 0).
    sites : str or sequence of str or None, default None
        Capture sites to extract besides resid_post (`lmgeom.sitespec.parse_sites`: "attn_out,mlp_out",
        a local extraction only); each is analysed too: its contextuality and isotropy (the analysis's
        options at that site) in RUN/site_results/<site>/ (`rundir.SITE_RESULTS`), recorded in
        run.json as the steps contextuality@<site> and isotropy@<site>, and drawn in the report's
        "Capture sites" section. The other steps read resid_post. None: resid_post only.
    progress : bool or Progress or None, default True
        True: each step's progress on standard error (`lmgeom.progress.StderrProgress`: bars in a
        notebook or on a terminal, a line every 10 s in a log), Hugging Face's own bars off while a
        model loads; False or None: nothing reported; or any object with the `Progress` methods
        (`start`, `advance`), told of each step's progress.

    Returns
    -------
    RunResult
        The store, the contextuality analysis, the per-layer summary, the files written, the steps run
        and skipped, the device they computed on, the inputs not found, the static embeddings'
        benchmark records, and `run`: every result as pandas DataFrames (`lmgeom.load_run`).

    Raises
    ------
    InputError
        Before the extraction: a `data_dir` that is not a folder (`MissingInput`), an unknown
        `protocol` or a given option it sets otherwise, `corpus="sts[:DIR]"` with a protocol, a
        `limit` or `sample` below 1, an unknown `count_by`, `min_contexts` or `num_workers` below 1,
        `bootstrap` below 0, `confidence` outside (0, 1), `permutations` below 0, an unknown calibration
        method in `methods`, a `min_coverage` that does not read, `layers` outside the layer grammar, an
        `include` folder that does not exist (`MissingInput`), a `progress` that is neither a bool nor a
        `Progress`, an unknown `control` or a `control_seed` below 0, `control='random-init'` of an ELMo
        model; a store of other settings in `out` without
        `overwrite`, or files there that lmgeom did not write (`StoreExistsError`). A layer the model
        does not have is refused after the extraction, when the model's layers are known.
    """
    # checked before the extraction, which can take hours
    if data_dir is not None and not Path(data_dir).is_dir():
        raise MissingInput(f"`data_dir` {data_dir} is not a folder; give the folder holding the word benchmarks and "
                           f"stsbenchmark/ (as {DEFAULT_DATA_DIR} does), or leave it out", param="data_dir")
    data = None if data_dir is None else str(data_dir)
    analysis = AnalysisOptions(**protocol_options(protocol, min_contexts=min_contexts, count_by=count_by), seed=seed,
                               num_workers=num_workers, device=device,
                               bootstrap=bootstrap, confidence=confidence)
    # options refused here, not after the extraction: the counts, the calibration methods, the word
    # benchmarks' coverage rule, the grammar of `layers` (which layers exist is known after it), `include`
    SimilarityOptions(permutations=permutations)
    CalibrationOptions(methods=tuple(methods), seed=seed)
    StaticOptions(analysis, min_coverage=min_coverage)
    select_layers(layers, range(_ANY_LAYERS), n_layers=_ANY_LAYERS, param="layers", default="default")
    for folder in include:
        if "://" not in str(folder) and not Path(folder).is_dir():
            raise MissingInput(f"`include` {folder} is not a folder; give folders of experiment results, or leave it out",
                               param="include")
    check_control(control)
    check_control_seed(control_seed)
    requested_sites = parse_sites(sites)
    corpus, pooling = protocol_extraction(protocol, model, corpus)
    require_count(limit, "limit")
    shown = run_progress(progress)
    try:
        with hub_bars_off_while(shown is not None):
            return _run(model, corpus, pooling, out=out, limit=limit, sample=sample, device=device, analysis=analysis,
                        protocol=protocol, seed=seed, layers=layers, store_layers=store_layers, methods=methods,
                        include=include, overwrite=overwrite, num_workers=num_workers, data=data,
                        min_coverage=min_coverage, permutations=permutations, control=control,
                        control_seed=control_seed, requested_sites=requested_sites, progress=shown or NoProgress())
    finally:
        if isinstance(shown, StderrProgress):
            shown.close()


def run_progress(progress: bool | Progress | None) -> Progress | None:
    """What `run(progress=...)` reports to: a `StderrProgress` for True, None (nothing) for False or
    None, the object itself when it has the `Progress` methods; anything else is refused."""
    if progress is True:
        return StderrProgress()
    if progress is False or progress is None:
        return None
    if callable(getattr(progress, "start", None)) and callable(getattr(progress, "advance", None)):
        return progress
    raise InputError(f"`progress={progress!r}` is neither True, False nor an object with the `start` and `advance` methods "
                     "of `lmgeom.progress.Progress`; pass True (progress on standard error), False (none) or such an object",
                     param="progress")


@contextmanager
def hub_bars_off_while(shown: bool) -> Iterator[None]:
    """Hugging Face's own progress bars off (`hub_progress_bars_off`) while ours are shown."""
    if not shown:
        yield
        return
    from lmgeom.encoders.registry import hub_progress_bars_off  # transformers: a run loads a model anyway

    with hub_progress_bars_off():
        yield


def _run(model: str, corpus: str, pooling: str | None, *, out: str | os.PathLike[str] | None, limit: int | None,
         sample: int | None, device: str, analysis: AnalysisOptions, protocol: str | None, seed: int,
         layers: str | Sequence[int], store_layers: str | Sequence[int] | None, methods: Sequence[str],
         include: Sequence[str | os.PathLike[str]], overwrite: bool, num_workers: int, data: str | None,
         min_coverage: str, permutations: int, control: str | None, control_seed: int,
         requested_sites: Sequence[str], progress: Progress) -> RunResult:
    """`run` once its arguments are checked: every step, in order, each announced on the "run" stage
    of `progress` as it begins (`STEPS`)."""
    progress.start("run", len(STEPS), unit="steps")

    def begin(step: str) -> None:  # the previous step done, this one shown as it begins
        if step != STEPS[0]:
            progress.advance("run")
        progress.advance("run", 0, note=step)

    begin("extract")
    resolved = run_device(device)
    # the statistics compute on the CPU or a CUDA device; a model on another device (mps) leaves them on the CPU
    analysis_device = resolved if resolved.startswith(("cpu", "cuda")) else "cpu"
    analysis = analysis.replace(device=analysis_device)
    started = time.perf_counter()
    extraction: dict[str, Any] = {"pooling": pooling} if pooling else {}
    if sample is not None:
        extraction.update(sample=sample, seed=seed)
    if control is not None:
        extraction.update(control=control, control_seed=control_seed)
    if len(requested_sites) > 1:
        extraction.update(sites=requested_sites)
    store = extract_model(model, corpus, out=out, limit=limit, store_layers=store_layers, device=resolved, overwrite=overwrite,
                          progress=progress, **extraction)
    steps = _Steps(store, resolved, protocol)
    settings: dict[str, Any] = {"model": model, "corpus": corpus, "limit": limit, **extraction}
    if not steps.done("extract", settings):  # an extraction resumed or finished just now
        steps.record("extract", settings, started, [rundir.target(store.url, layout.META)])
    per_layer = select_layers(layers, store.layers, n_layers=store.n_model_layers, param="layers", default="default")
    paths: list[Target] = []

    # one options object per step, built once from the arguments and passed whole; each step's
    # settings (its `to_settings()`) are what run.json and its result files record
    isotropy = IsotropyOptions(analysis)
    calibration = CalibrationOptions(methods=tuple(methods), layers=tuple(per_layer), seed=seed, device=resolved)
    static = StaticOptions(analysis, data_dir=data, min_coverage=min_coverage)
    similarity = SimilarityOptions(seed=seed, device=analysis_device, num_workers=num_workers,  # layer x layer, every layer
                                   permutations=permutations)
    geometry = GeometryOptions(analysis, data_dir=data, model_weights=model)
    # the folder looked in, in run.json's settings of the steps that read it: data found there since
    # (LMGEOM_DATA set, or another folder given) redoes them
    looked_in = {"data_folder": str(Path(DEFAULT_DATA_DIR if data is None else data).resolve())}

    begin("contextuality")
    settings = analysis.analysis_settings()
    contextuality: ContextualityResult | None = None
    if steps.done("contextuality", settings):
        try:
            contextuality = ContextualityResult.read(store, options=settings)
        except (rundir.ResultFileError, FileNotFoundError):
            steps.skipped.remove("contextuality")
    if contextuality is None:
        started = time.perf_counter()
        contextuality = analyze_store(store, analysis, progress=progress, write_to=True)
        steps.record("contextuality", settings, started, list(contextuality.written.values()))
    summary = layer_summary(store, contextuality)
    paths += [spec.at(store.url) for spec in
              (rundir.SUMMARY, rundir.CONTEXTUALITY, rundir.CONTEXTUALITY_LAYERS, rundir.CONTEXTUALITY_WORDS)]

    begin("isotropy")
    settings = isotropy.to_settings()
    if not steps.done("isotropy", settings):
        started = time.perf_counter()
        steps.record("isotropy", settings, started, measure_isotropy(store, isotropy, progress=progress).paths)
    paths.append(rundir.ISOTROPY.at(store.url))

    begin("calibration")
    # calibration.json also takes the fits of `lmgeom calibrate`: the step is done while the file
    # still holds the fits it made (merged, never replaced, by a later calibration of other layers)
    settings = calibration.to_settings()
    if not steps.done("calibration", settings, holds=lambda fits: fits is not None and holds_fits(store.url, fits)):
        started = time.perf_counter()
        calibrated = calibrate_store(store, calibration, progress=progress)
        steps.record("calibration", settings, started, calibrated.paths, holds=calibrated.fits)
    paths.append(rundir.CALIBRATION.at(store.url))

    begin("static_embeddings")
    settings = {**static.to_settings(), "layers": per_layer, **looked_in}
    if not steps.done("static_embeddings", settings, file_settings=static.to_settings()):
        started = time.perf_counter()
        written = [path for layer in per_layer for path in
                   export_static_embeddings(store, static, layer=layer, progress=progress).paths.values()]
        steps.record("static_embeddings", settings, started, written, file_settings=static.to_settings())
    paths += [rundir.STATIC_BENCHMARKS.at(store.url, layer=layer) for layer in per_layer]
    benchmarks = read_benchmark_records(store.url, per_layer)

    begin("similarity")
    settings = similarity.to_settings()
    if not steps.done("similarity", settings):
        started = time.perf_counter()
        steps.record("similarity", settings, started,
                     write_similarity(similarity_matrix(store, None, similarity, progress=progress), store.url))
    paths.append(rundir.SIMILARITY.at(store.url))
    begin("geometry")
    settings = {**geometry.to_settings(), **looked_in}
    if not steps.done("geometry", settings, file_settings=geometry.to_settings()):
        started = time.perf_counter()
        steps.record("geometry", settings, started, measure_geometry(store, geometry, progress=progress).paths,
                     file_settings=geometry.to_settings())
    paths += [rundir.GEOMETRY.at(store.url), rundir.GEOMETRY_CSV.at(store.url)]
    for site in requested_sites[1:]:  # each capture site: its contextuality and isotropy in a folder of its own
        folder = rundir.site_results(store.url, site)
        at_site = analysis.replace(site=site)
        settings = at_site.analysis_settings()
        if not steps.done(f"contextuality@{site}", settings):
            started = time.perf_counter()
            analysed = analyze_store(store, at_site, progress=progress, write_to=str(folder))
            steps.record(f"contextuality@{site}", settings, started, list(analysed.written.values()))
        settings = IsotropyOptions(at_site).to_settings()
        if not steps.done(f"isotropy@{site}", settings):
            started = time.perf_counter()
            steps.record(f"isotropy@{site}", settings, started,
                         measure_isotropy(store, IsotropyOptions(at_site), out=folder, progress=progress).paths)
        paths += [spec.at(folder) for spec in (rundir.CONTEXTUALITY, rundir.ISOTROPY)]
    # read from the result files: the same whether the steps ran now or were found done
    steps.skipped_inputs = [entry.record() for entry in skipped_inputs(store.url)]

    begin("report")
    # the explorer caches itself (explorer.json, by its own settings); the page is always re-rendered
    started = time.perf_counter()
    report = render_report(store.url, include=include, progress=progress)
    steps.record("report", {"include": [str(path) for path in include]}, started, [report])
    paths.append(report)
    progress.advance("run", note="done")
    return RunResult(store, contextuality, summary, paths, steps.ran, steps.skipped, resolved, steps.skipped_inputs,
                     benchmarks, load_run(store.url, include=include))
