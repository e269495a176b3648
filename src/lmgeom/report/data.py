"""A run directory's result files read into tidy frames; every file but the store is optional.

The report depends only on these files (and the store, for the word explorer), so it can be
re-rendered without the model. A missing file becomes a `None` and a note naming the command that
writes it; a file of the wrong kind is an error naming the file.
"""

from __future__ import annotations

import html
import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import pandas as pd

from lmgeom.controlspec import control_label
from lmgeom.errors import MissingInput
from lmgeom import rundir
from lmgeom.rundir import read_json

# Which command writes each optional result (shown in the report where a file is missing).
PRODUCERS = {
    "summary": rundir.SUMMARY.producer,
    "contextuality": rundir.CONTEXTUALITY.producer,
    "words": rundir.CONTEXTUALITY_WORDS.producer,
    "calibration": rundir.CALIBRATION.producer,
    "static": rundir.STATIC.producer,
    "sts": rundir.STS.producer,
    "experiments": rundir.EXPERIMENTS.producer,
    "explorer": rundir.EXPLORER.producer,
    "isotropy": rundir.ISOTROPY.producer,
    "similarity": rundir.SIMILARITY.producer,
    "geometry": rundir.GEOMETRY.producer,
}
LAYER0_MEAN = "layer0_mean"  # the static vectors of layer-0 means (`lmgeom.stages.static.STATIC_KINDS`)


# the results a run directory may hold, as `RunData` attributes (each a DataFrame, None when missing)
RESULTS = ("contextuality", "words", "isotropy", "calibration", "static", "similarity", "geometry", "sts", "experiments")
# the per-layer headline numbers of `RunData.headline`: (column, result, measure); contextuality's raw value
HEADLINE = (("anisotropy", "contextuality", "anisotropy_exact"), ("self_similarity", "contextuality", "self_similarity"),
            ("intra_sentence_similarity", "contextuality", "intra_sentence_similarity"),
            ("mev", "contextuality", "mev_uncentred"), ("isoscore", "isotropy", "isoscore"),
            ("intrinsic_dimension", "geometry", "id_twonn"))


@dataclass(repr=False)
class RunData:
    """One run directory's results as pandas DataFrames: what `lmgeom.load_run` returns and what the
    report shows. Layer 0 is the embedding output everywhere.

    A result the run does not hold is None, and `notes` names the command that writes it; `present`
    lists the results that are there. Every frame is read through `lmgeom.rundir`'s checked readers
    (`load_run`), so a result of another store, corpus or settings is refused, never shown.

    Attributes
    ----------
    path : Path or str
        The run directory: a local `Path`, or its fsspec URL.
    meta : dict
        The store's meta.json ({} when the store is not in the directory); `store` is its summary.
    summary : DataFrame or None
        summary.json: layer, n_occurrences, mean_norm, sampled_average_cosine, average_cosine.
    contextuality : DataFrame or None
        contextuality.json's records, one row per layer and measure: layer, layer_name, metric, raw,
        baseline, adjusted (raw - baseline), n, and the bootstrap interval of each (`raw_lo`, `raw_hi`,
        `adjusted_lo`, `adjusted_hi`) when the analysis had one.
    contextuality_document : dict or None
        contextuality.json itself: settings, counts, findings, statements, bootstrap design.
    words : DataFrame or None
        contextuality_words.csv: one row per analysed word and layer (word, layer, count, contexts,
        self_similarity, ...).
    calibration : DataFrame or None
        calibration.json's records: layer, method, measure, before, after, n_fit_rows, n_eval_rows.
    calibration_settings : dict
        calibration.json's settings ({} without it).
    isotropy : DataFrame or None
        isotropy.json's records: layer, measure, value, n_rows.
    static : DataFrame or None
        The static-embedding benchmark records of every distilled layer (static/<layer>.benchmarks.json):
        layer, vectors, benchmark, score, coverage, ...
    sts : DataFrame or None
        The records of every STS results JSON at the top of the run directory.
    experiments : DataFrame or None
        Tidy experiment records (RUN/experiments/*/results.json and `include` folders).
    experiment_tests : DataFrame or None
        Each experiment configuration's test against its baseline (p-values).
    theses : list of (path, dict)
        Each thesis.json (`lmgeom experiment thesis`) in RUN/experiments/*/ and the `include` folders,
        with its path: Ding et al.'s local-isotropy thesis tested over experiments' results.
    notes : dict
        Section -> why it is empty (the command that writes the missing file).
    similarity : DataFrame or None
        similarity.json's records, tidy: layer_a, layer_b, measure, value, sample_value, null,
        null_sd, p_value, permutations, chance.
    geometry : DataFrame or None
        geometry.csv, tidy: layer, measure (id_twonn, id_mle, id_gride_<n2>, uniformity, median_abs,
        ...), value, low, high.
    settings : dict
        Each step's settings: run.json's record of the steps of `lmgeom run` (extract, contextuality,
        isotropy, calibration, static_embeddings, similarity, geometry, report), else what each result
        document's provenance records.
    """

    path: rundir.Target  # the run directory: a local Path, or its fsspec URL
    meta: dict[str, Any]
    summary: pd.DataFrame | None  # layer, n_occurrences, mean_norm, sampled_average_cosine, average_cosine
    contextuality_document: dict[str, Any] | None  # the JSON document (settings, counts, findings, statements)
    contextuality: pd.DataFrame | None  # contextuality records: layer x metric (raw, baseline, adjusted)
    words: pd.DataFrame | None  # contextuality_words.csv: word x layer
    calibration: pd.DataFrame | None  # layer x method x measure: before, after
    calibration_settings: dict[str, Any]
    isotropy: pd.DataFrame | None  # layer x measure: value (isotropy.json)
    static: pd.DataFrame | None  # static-embedding benchmark records of every distilled layer
    sts: pd.DataFrame | None  # STS records of every STS results JSON in the run directory
    experiments: pd.DataFrame | None  # tidy experiment records
    experiment_tests: pd.DataFrame | None  # per-configuration tests against the baseline (p-values)
    notes: dict[str, str] = field(default_factory=dict)  # section -> why it is empty
    similarity: pd.DataFrame | None = None  # similarity.json's records: layer_a x layer_b x measure
    geometry: pd.DataFrame | None = None  # geometry.csv: layer x measure (value, low, high)
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)  # step -> its settings
    theses: list[tuple[rundir.Target, dict[str, Any]]] = field(default_factory=list)  # thesis.json files

    @property
    def model_id(self) -> str:
        for source in (self.meta, self.contextuality_document or {}):
            if source.get("model_id"):
                return str(source["model_id"])
        return self.name

    @property
    def name(self) -> str:
        """The run directory's own name."""
        return rundir.name_of(self.path)

    @property
    def corpus(self) -> str:
        return str(self.meta.get("corpus_name") or "unknown corpus")

    @property
    def control(self) -> dict[str, Any] | None:
        """The control this run is (`lmgeom.controlspec`: its store's, or its contextuality
        document's, ``control``), or None for a run of the model itself."""
        for source in (self.meta, self.contextuality_document or {}):
            if isinstance(source.get("control"), dict):
                return dict(source["control"])
        return None

    @property
    def label(self) -> str:
        """model on corpus, the name of a run in charts and tables; a control's says so
        ("..., control: random-init (seed 0)")."""
        control = control_label(self.control)
        return f"{self.model_id} on {self.corpus}" + (f", {control}" if control else "")

    @property
    def counts(self) -> dict[str, Any]:
        return dict((self.contextuality_document or {}).get("counts", {}))

    @property
    def layer_numbers(self) -> list[int]:
        if self.contextuality is not None:
            return sorted(int(layer) for layer in self.contextuality["layer"].unique())
        if self.summary is not None:
            return sorted(int(layer) for layer in self.summary["layer"])
        return list(range(int(self.meta.get("n_layers", 0))))

    @property
    def store(self) -> dict[str, Any]:
        """What the run's store is: model_id, corpus, corpus_fingerprint, n_layers (the model's, layer 0
        included), layers (those stored), dim, n_sentences, n_tokens, n_vocab and layer_note (layer 0
        is the embedding output); None for what meta.json does not record (no store in the folder)."""
        meta = self.meta
        return {"model_id": self.model_id, "corpus": self.corpus,
                "corpus_fingerprint": meta.get("corpus_fingerprint") or (self.contextuality_document or {}).get("corpus_fingerprint"),
                "n_layers": meta.get("n_layers"), "layers": meta.get("stored_layers", self.layer_numbers or None),
                "dim": meta.get("dim"), "n_sentences": meta.get("n_sentences"), "n_tokens": meta.get("n_tokens"),
                "n_vocab": meta.get("n_vocab"), "layer_note": meta.get("layer_note") or rundir.LAYER_NOTE}

    @property
    def present(self) -> list[str]:
        """The results (`RESULTS`) this run holds, in that order."""
        return [name for name in RESULTS if getattr(self, name) is not None]

    @property
    def missing(self) -> dict[str, str]:
        """The results this run does not hold, each with why (the command that writes it)."""
        return {name: self.notes.get(name, "not read") for name in RESULTS if getattr(self, name) is None}

    def counts_caption(self) -> str:
        """'N words, M tokens, S sentences' of the analysis (or of the store when not analysed)."""
        counts = self.counts
        parts = []
        if "words_analysed" in counts:
            parts.append(f"{counts['words_analysed']:,} words")
        tokens = counts.get("rows_analysed", self.meta.get("n_tokens"))
        if tokens is not None:
            parts.append(f"{int(tokens):,} tokens")
        sentences = counts.get("sentences", self.meta.get("n_sentences"))
        if sentences is not None:
            parts.append(f"{int(sentences):,} sentences")
        return ", ".join(parts)

    def metric(self, metric: str, column: str = "raw") -> pd.Series:
        """One contextuality metric by layer (empty when the run was not analysed)."""
        if self.contextuality is None:
            return pd.Series(dtype=float)
        rows = self.contextuality.loc[self.contextuality["metric"] == metric].sort_values("layer")
        return pd.Series(rows[column].to_numpy(dtype=float), index=rows["layer"].to_numpy(dtype=int), name=metric)

    def headline(self) -> pd.DataFrame:
        """One row per layer (the index; 0 = embedding output) of the run's headline numbers, where it
        has them: anisotropy (exact mean cosine), self_similarity, intra_sentence_similarity, mev
        (uncentred), all raw; isoscore (isotropy.json); intrinsic_dimension (TwoNN, geometry.csv)."""
        columns: dict[str, pd.Series] = {}
        for column, result, measure in HEADLINE:
            frame = getattr(self, result)
            if frame is None or frame.empty:
                continue
            if result == "contextuality":
                values = self.metric(measure)
            else:
                rows = frame.loc[frame["measure"] == measure]
                values = pd.Series(rows["value"].to_numpy(dtype=float), index=rows["layer"].to_numpy(dtype=int))
            if not values.empty:
                columns[column] = values
        table = pd.DataFrame(columns)
        table.index.name = "layer"
        return table.sort_index()

    def __repr__(self) -> str:
        store = self.store
        layers = store["layers"]
        lines = [f"RunData: {self.label} ({rundir.target(self.path)})",
                 f"  layers: {_layer_list(layers)} ({store['layer_note']})",
                 f"  results: {', '.join(self.present) or 'none'}"]
        lines += [f"  missing {name}: {why}" for name, why in self.missing.items()]
        headline = self.headline()
        if not headline.empty:
            lines += ["", headline.to_string(float_format=lambda v: f"{v:.3f}")]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        """The run in a notebook: model, corpus, layers, the results present and missing, the headline numbers."""
        store = self.store
        missing = "".join(f"<li><code>{html.escape(name)}</code>: {html.escape(why)}</li>" for name, why in self.missing.items())
        headline = self.headline()
        return (f"<div><strong>{html.escape(self.label)}</strong> <small>({html.escape(str(self.path))})</small><br>"
                f"layers {html.escape(_layer_list(store['layers']))} ({html.escape(store['layer_note'])})<br>"
                f"results: {html.escape(', '.join(self.present) or 'none')}"
                + (f"<details><summary>missing</summary><ul>{missing}</ul></details>" if missing else "")
                + (headline.to_html(float_format=lambda v: f"{v:.3f}", na_rep="—") if not headline.empty else "")
                + "</div>")


def _layer_list(layers: Sequence[int] | None) -> str:
    """'0-3' for consecutive layers, else '0, 6, 12'."""
    if not layers:
        return "none"
    values = sorted(int(layer) for layer in layers)
    if values == list(range(values[0], values[-1] + 1)) and len(values) > 2:
        return f"{values[0]}-{values[-1]}"
    return ", ".join(map(str, values))


def _frame(records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    # JSON writes non-finite floats as null; a frame wants NaN
    return pd.DataFrame(list(records)).fillna(value=math.nan) if records else pd.DataFrame(list(records))


def _static_documents(run_dir: rundir.Where) -> list[tuple[rundir.Target, dict[str, Any]]]:
    """(path, document) of every static/<layer>.benchmarks.json of the run, each checked (`rundir.check_result`)."""
    documents = []
    for path in rundir.STATIC_BENCHMARKS.find(run_dir):
        document = read_json(path, rundir.STATIC_BENCHMARKS.kind)
        assert document is not None
        rundir.check_result(run_dir, path, rundir.STATIC_BENCHMARKS, document,
                            settings=rundir.run_settings(run_dir, rundir.STATIC_BENCHMARKS))
        documents.append((path, document))
    return documents


def read_static(run_dir: rundir.Where, documents: Sequence[tuple[rundir.Target, dict[str, Any]]] | None = None) -> pd.DataFrame | None:
    """The static-embedding benchmark records of every distilled layer of a run (the layer-0 means
    once, under layer 0), or None when it has none; `documents`: those already read (`_static_documents`)."""
    frames = []
    for _, document in _static_documents(run_dir) if documents is None else documents:
        settings = (document.get(rundir.PROVENANCE) or {}).get("settings") or {}
        frame = _frame(document.get("records", []))
        if "min_coverage" in settings:  # the rule `enough_items` applied
            frame["min_coverage"] = settings["min_coverage"]
        frames.append(frame)
    if not frames:
        return None
    static = pd.concat(frames, ignore_index=True)
    # every layer's file scores the layer-0 means again (the same vectors): they are layer 0's, shown once
    layer0 = static["vectors"].astype(str).str.startswith(f"{LAYER0_MEAN} ")
    static.loc[layer0, "layer"] = 0
    static = static.loc[~(layer0 & static.drop(columns=["path"], errors="ignore").duplicated())]
    return static.sort_values(["layer", "vectors", "benchmark"], kind="stable").reset_index(drop=True)


def _read_sts(run_dir: rundir.Where) -> pd.DataFrame | None:
    """Records of every JSON of kind 'sts' at the top of the run directory."""
    frames = []
    for path in rundir.sts_files(run_dir):
        document = read_json(path)
        if document is not None:
            frame = _frame(document.get("records", []))
            frame.insert(0, "file", rundir.name_of(path))
            frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else None


def _experiment_files(run_dir: rundir.Where, in_run: rundir.ResultFile, in_folder: rundir.ResultFile,
                      include: Sequence[str | os.PathLike]) -> list[rundir.Target]:
    """The files `in_run` names in the run plus, per included folder, its `in_folder` file or the
    `in_folder` files one level down; a missing included folder is an error naming `include`."""
    files = in_run.find(run_dir)
    for directory in include:
        if not rundir.exists(directory):
            raise MissingInput(f"`include` {directory}: no such directory (give a folder holding {in_folder.name} files)",
                               param="include")
        direct = in_folder.at(directory)
        files.extend([direct] if rundir.exists(direct) else
                     rundir.ResultFile(f"*/{in_folder.name}", in_folder.producer).find(directory))
    return list(dict.fromkeys(files))


def experiment_result_files(run_dir: rundir.Where, include: Sequence[str | os.PathLike] = ()) -> list[rundir.Target]:
    """RUN/experiments/*/results.json plus, per included folder, its results.json or */results.json."""
    return _experiment_files(run_dir, rundir.EXPERIMENT_RESULTS, rundir.EXPERIMENT_JSON, include)


def thesis_files(run_dir: rundir.Where, include: Sequence[str | os.PathLike] = ()) -> list[rundir.Target]:
    """RUN/experiments/*/thesis.json plus, per included folder, its thesis.json or */thesis.json."""
    return _experiment_files(run_dir, rundir.EXPERIMENT_THESIS, rundir.THESIS, include)


def read_theses(files: Sequence[rundir.Target]) -> list[tuple[rundir.Target, dict[str, Any]]]:
    """Each thesis.json with its path, checked as a document of kind "thesis" (one that is not is an
    error naming the file and the command that writes it)."""
    documents = [(path, read_json(path, rundir.THESIS.kind)) for path in files]
    return [(path, document) for path, document in documents if document is not None]


def read_experiments(files: Sequence[rundir.Target], *, part: str = "records") -> pd.DataFrame | None:
    """Tidy experiment records (a list, or a document with `records`); unreadable files are skipped.

    `part="summaries"` reads a document's per-configuration summaries instead: the records whose
    `p_value` (and `p_holm`, `significant`) test a configuration against its baseline."""
    frames = []
    for path in files:
        try:
            document = rundir.read_experiment_results(path)
        except rundir.ResultFileError:
            continue
        if part == "summaries":
            records = document.get("summaries", []) if isinstance(document, dict) else []
            frame = pd.DataFrame([r for r in records if isinstance(r, dict) and "p_value" in r])
            if not frame.empty:
                if "experiment" not in frame:
                    frame["experiment"] = _folder_name(path)
                frames.append(frame)
            continue
        records = document.get("records", []) if isinstance(document, dict) else document
        if not isinstance(records, list):
            continue
        frame = pd.DataFrame([r for r in records if isinstance(r, dict) and "value" in r])
        if frame.empty:
            continue
        if "experiment" not in frame:
            frame["experiment"] = _folder_name(path)
        frame["source"] = str(path)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else None


def _folder_name(path: rundir.Target) -> str:
    """The name of the experiment folder a results.json is in."""
    return rundir.name_of(str(path).replace(os.sep, "/").rsplit("/", 1)[0])


def summarise_experiments(records: pd.DataFrame, tests: pd.DataFrame | None = None) -> pd.DataFrame:
    """Mean, standard deviation (ddof 1; 0 for one seed) and seed count of `value` per configuration,
    with the configuration's test against its baseline where `tests` (the experiments' summaries)
    give one: `p` (Holm-adjusted when `p_holm` is given) and `significant`."""
    keys = [key for key in rundir.EXPERIMENT_CONFIG_KEYS if key in records]
    frame = records.copy()
    frame["value"] = pd.to_numeric(frame["value"], errors="coerce")
    for key in keys:
        frame[key] = frame[key].astype(str)
    grouped = frame.groupby(keys, sort=True, dropna=False)["value"]
    table = grouped.agg(mean="mean", std="std", n="count").reset_index()
    table["std"] = table["std"].fillna(0.0)
    if tests is not None and not tests.empty:
        on = [key for key in keys if key in tests]
        tested = tests.copy()
        for key in on:
            tested[key] = tested[key].astype(str)
        tested["p"] = pd.to_numeric(tested["p_holm"] if "p_holm" in tested else tested["p_value"], errors="coerce")
        if "significant" not in tested:
            tested["significant"] = tested["p"] < 0.05
        table = table.merge(tested[[*on, "p", "significant"]], on=on, how="left")
    return table


def _read_records(run_dir: rundir.Where, spec: rundir.ResultFile, notes: dict[str, str], *, section: str,
                  part: str = "records") -> tuple[dict[str, Any] | None, pd.DataFrame | None]:
    """(document, its `part` as a frame) of an optional result file; a missing one is noted with the
    command that writes it; one that is not the run's is refused (`rundir.read_result`)."""
    document = rundir.read_result(run_dir, spec)
    if document is None:
        notes[section] = f"no {spec.name} in {run_dir}; run `{PRODUCERS[section]}`"
        return None, None
    return document, _frame(document[part])


def load_run(run_dir: rundir.Where, *, include: Sequence[str | os.PathLike] = ()) -> RunData:
    """A run directory's results as pandas DataFrames (`RunData`).

    A missing result is None, noted with the command that writes it.

    Every file is read through `lmgeom.rundir`'s checked readers: a result of another store
    generation or corpus, one written with other settings than run.json records for its step, or
    one whose companion tables are not those written with it is refused (`ResultFileError`). Reading
    a run loads neither torch nor a model.

    Parameters
    ----------
    run_dir : str or os.PathLike or Location
        The run directory: a local path, an fsspec URL or a `Location` (`rundir.Where`).
    include : sequence of str or os.PathLike, default ()
        Folders of experiment results (each holding a results.json, or */results.json) read beside
        RUN/experiments/*/results.json (`experiment_result_files`), and of thesis tests (thesis.json,
        or */thesis.json: `thesis_files`).

    Returns
    -------
    RunData
        The run's results as frames (`contextuality`, `words`, `isotropy`, `calibration`, `static`,
        `similarity`, `geometry`, ...), each step's `settings` and the `store`'s description; a
        missing result is None, with a note naming the command that writes it in `notes`.

    Examples
    --------
    >>> run = lmgeom.load_run("runs/minilm-lee")  # doctest: +SKIP
    >>> run.contextuality.query("metric == 'self_similarity'")[["layer", "raw"]]  # doctest: +SKIP

    Raises
    ------
    FileNotFoundError
        `run_dir` does not exist.
    InputError
        `run_dir` is not a run directory (`rundir.require_run`); a result file that does not parse,
        is of another kind or is not this run's (`ResultFileError`); an `include` folder that does
        not exist (`MissingInput`).
    """
    run_dir = rundir.target(run_dir)
    if not rundir.exists(run_dir):
        raise FileNotFoundError(f"{run_dir} is not a directory; give a run directory written by `lmgeom run`")
    rundir.require_run(run_dir)
    notes: dict[str, str] = {}

    summary_doc, summary = _read_records(run_dir, rundir.SUMMARY, notes, section="summary", part="layers")

    contextuality, layers = _read_records(run_dir, rundir.CONTEXTUALITY, notes, section="contextuality")
    if summary_doc is not None and contextuality is not None:  # the summary is made from that analysis
        rundir.check_result(run_dir, rundir.SUMMARY.at(run_dir), rundir.SUMMARY, summary_doc,
                            settings=contextuality[rundir.PROVENANCE]["settings"])

    words = rundir.read_words(run_dir)
    if words is None:
        notes["words"] = f"no {rundir.CONTEXTUALITY_WORDS.name} in {run_dir}; run `{PRODUCERS['words']}`"

    calibration_doc, calibration = _read_records(run_dir, rundir.CALIBRATION, notes, section="calibration")

    isotropy_doc, isotropy = _read_records(run_dir, rundir.ISOTROPY, notes, section="isotropy")

    static_documents = _static_documents(run_dir)
    static = read_static(run_dir, static_documents)
    if static is None:
        notes["static"] = f"no {rundir.STATIC_BENCHMARKS.name} in {run_dir}; run `{PRODUCERS['static']}`"
    sts = _read_sts(run_dir)
    if sts is None:
        notes["sts"] = f"no STS results JSON in {run_dir}; run `{PRODUCERS['sts']}`"
    experiment_files = experiment_result_files(run_dir, include)
    experiments = read_experiments(experiment_files)
    experiment_tests = read_experiments(experiment_files, part="summaries")
    if experiments is None:
        notes["experiments"] = f"no readable {rundir.EXPERIMENT_RESULTS.pattern} in {run_dir} (nor in --include folders)"

    similarity_doc, similarity = _read_records(run_dir, rundir.SIMILARITY, notes, section="similarity")

    geometry_doc = rundir.read_result(run_dir, rundir.GEOMETRY)
    geometry = None
    if geometry_doc is None:
        notes["geometry"] = f"no {rundir.GEOMETRY.name} in {run_dir}; run `{PRODUCERS['geometry']}`"
    else:  # its companion, whose digest the document records (checked by `read_result`)
        geometry = rundir.read_csv(rundir.GEOMETRY_CSV.at(run_dir), rundir.GEOMETRY_CSV)
        if geometry is None:
            notes["geometry"] = f"no {rundir.GEOMETRY_CSV.name} beside {rundir.GEOMETRY.name}; run `{PRODUCERS['geometry']}`"

    documents = {"contextuality": contextuality, "isotropy": isotropy_doc, "calibration": calibration_doc,
                 "static_embeddings": static_documents[0][1] if static_documents else None,
                 "similarity": similarity_doc, "geometry": geometry_doc}
    return RunData(
        path=run_dir,
        meta=rundir.read_store_meta(run_dir),
        summary=summary,
        contextuality_document=contextuality,
        contextuality=layers,
        words=words,
        calibration=calibration,
        calibration_settings=dict((calibration_doc or {}).get("settings", {})),
        isotropy=isotropy,
        static=static,
        sts=sts,
        experiments=experiments,
        experiment_tests=experiment_tests,
        notes=notes,
        similarity=similarity,
        geometry=geometry,
        settings=step_settings(run_dir, documents),
        theses=read_theses(thesis_files(run_dir, include)),
    )


def step_settings(run_dir: rundir.Where,
                  documents: Mapping[str, Mapping[str, Any] | None] | None = None) -> dict[str, dict[str, Any]]:
    """Each step's settings: what RUN/run.json records for the steps of `lmgeom run`, and for a step it
    does not record (a result written by `lmgeom analyze`, `calibrate`, ...) what the result document
    `documents[step]` records in its provenance."""
    try:
        run = read_json(rundir.RUN.at(run_dir), rundir.RUN.kind)
    except rundir.ResultFileError:
        run = None
    settings: dict[str, dict[str, Any]] = {}
    for step, record in ((run or {}).get("steps") or {}).items():
        if isinstance(record, Mapping) and isinstance(record.get("settings"), Mapping):
            settings[step] = dict(record["settings"])
    for step, document in (documents or {}).items():
        recorded = ((document or {}).get(rundir.PROVENANCE) or {}).get("settings")
        if step not in settings and isinstance(recorded, Mapping):
            settings[step] = dict(recorded)
    return settings


def context_specific_words(words: pd.DataFrame, layer: int, *, n: int = 10) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(most context-specific = lowest self-similarity, least = highest) words at a layer."""
    at_layer = words.loc[(words["layer"] == layer) & words["self_similarity"].notna()]
    columns = ["word", "count", "contexts", "self_similarity", "self_similarity_adjusted"]
    most = at_layer.sort_values(["self_similarity", "word"], kind="stable").head(n)[columns]
    least = at_layer.sort_values(["self_similarity", "word"], ascending=[False, True], kind="stable").head(n)[columns]
    return most.reset_index(drop=True), least.reset_index(drop=True)


def step_seconds(run_dir: rundir.Where) -> dict[str, float]:
    """Seconds each step of `lmgeom run` took, as RUN/run.json records them (empty without it)."""
    document = read_json(rundir.RUN.at(run_dir), rundir.RUN.kind)
    if document is None:
        return {}
    return {name: float(step["seconds"]) for name, step in document.get("steps", {}).items()}
