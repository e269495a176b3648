"""A run directory's result files read into tidy frames; every file but the store is optional.

The report depends only on these files (and the store, for the word explorer), so it can be
re-rendered without the model. A missing file becomes a `None` and a note naming the command that
writes it; a file of the wrong kind is an error naming the file.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

# Which command writes each optional result (shown in the report where a file is missing).
PRODUCERS = {
    "summary": "lmgeom run (writes summary.json)",
    "contextuality": "lmgeom analyze RUN (or lmgeom run)",
    "words": "lmgeom analyze RUN (writes contextuality_words.csv)",
    "calibration": "lmgeom calibrate RUN --method whitening,abtt",
    "static": "lmgeom static-embeddings RUN --layer L",
    "sts": "lmgeom sts MODEL --data DIR --out RUN/sts.json",
    "experiments": "an experiment that writes RUN/experiments/NAME/results.json",
    "explorer": "lmgeom report RUN on a run whose store is present",
    "isotropy": "lmgeom run (writes isotropy.json: global and local isotropy of every layer)",
}

# result files of other kinds at the top of a run directory (the explorer cache can be tens of MB)
OTHER_RESULT_FILES = {"meta.json", "progress.json", "summary.json", "contextuality.json", "calibration.json", "explorer.json",
                      "isotropy.json", "run.json"}
EXPERIMENT_KEYS = ("experiment", "task", "model", "regime", "features", "method", "head", "pooling", "split", "metric")


def layer_label(layer: int) -> str:
    return "embedding output" if layer == 0 else f"block {layer}"


def read_result_json(path: Path, *, kind: str | None = None) -> dict[str, Any] | None:
    """A result JSON document, or None if the file does not exist."""
    if not path.exists():
        return None
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON ({error}); re-run the command that wrote it") from error
    if kind is not None and document.get("kind") != kind:
        raise ValueError(f"{path} holds kind {document.get('kind')!r}, expected {kind!r}; was it overwritten by another command?")
    return document


@dataclass
class RunData:
    """Everything the report shows about one run directory."""

    path: Path
    meta: dict[str, Any]
    summary: pd.DataFrame | None  # layer, n_occurrences, mean_norm, sampled_average_cosine, average_cosine
    contextuality: dict[str, Any] | None  # the JSON document (settings, counts, findings, statements)
    layers: pd.DataFrame | None  # contextuality records: layer x metric (raw, baseline, adjusted)
    words: pd.DataFrame | None  # contextuality_words.csv: word x layer
    calibration: pd.DataFrame | None  # layer x method x measure: before, after
    calibration_settings: dict[str, Any]
    isotropy: pd.DataFrame | None  # layer x measure: value (isotropy.json)
    static: pd.DataFrame | None  # static-embedding benchmark records of every distilled layer
    sts: pd.DataFrame | None  # STS records of every STS results JSON in the run directory
    experiments: pd.DataFrame | None  # tidy experiment records
    experiment_tests: pd.DataFrame | None  # per-configuration tests against the baseline (p-values)
    notes: dict[str, str] = field(default_factory=dict)  # section -> why it is empty

    @property
    def model_id(self) -> str:
        for source in (self.meta, self.contextuality or {}):
            if source.get("model_id"):
                return str(source["model_id"])
        return self.path.name

    @property
    def corpus(self) -> str:
        return str(self.meta.get("corpus_name") or "unknown corpus")

    @property
    def label(self) -> str:
        """model on corpus, the name of a run in charts and tables."""
        return f"{self.model_id} on {self.corpus}"

    @property
    def counts(self) -> dict[str, Any]:
        return dict((self.contextuality or {}).get("counts", {}))

    @property
    def layer_numbers(self) -> list[int]:
        if self.layers is not None:
            return sorted(int(layer) for layer in self.layers["layer"].unique())
        if self.summary is not None:
            return sorted(int(layer) for layer in self.summary["layer"])
        return list(range(int(self.meta.get("n_layers", 0))))

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
        if self.layers is None:
            return pd.Series(dtype=float)
        rows = self.layers.loc[self.layers["metric"] == metric].sort_values("layer")
        return pd.Series(rows[column].to_numpy(dtype=float), index=rows["layer"].to_numpy(dtype=int), name=metric)


def _frame(records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    # JSON writes non-finite floats as null; a frame wants NaN
    return pd.DataFrame(list(records)).fillna(value=math.nan) if records else pd.DataFrame(list(records))


def _read_meta(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "meta.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def _read_static(run_dir: Path) -> pd.DataFrame | None:
    frames = []
    for path in sorted((run_dir / "static").glob("*.benchmarks.json")):
        document = read_result_json(path, kind="static_embedding_benchmarks")
        assert document is not None
        frames.append(_frame(document.get("records", [])))
    return pd.concat(frames, ignore_index=True).sort_values(["layer", "vectors", "benchmark"], kind="stable") if frames else None


def _read_sts(run_dir: Path) -> pd.DataFrame | None:
    """Records of every JSON of kind 'sts' at the top of the run directory."""
    frames = []
    for path in sorted(run_dir.glob("*.json")):
        if path.name in OTHER_RESULT_FILES:
            continue
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(document, dict) and document.get("kind") == "sts":
            frame = _frame(document.get("records", []))
            frame.insert(0, "file", path.name)
            frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else None


def experiment_result_files(run_dir: Path, include: Sequence[str | os.PathLike] = ()) -> list[Path]:
    """RUN/experiments/*/results.json plus, per included folder, its results.json or */results.json."""
    files = sorted((run_dir / "experiments").glob("*/results.json"))
    for directory in map(Path, include):
        if not directory.is_dir():
            raise FileNotFoundError(f"--include {directory}: no such directory (give a folder holding results.json files)")
        direct = directory / "results.json"
        files.extend([direct] if direct.exists() else sorted(directory.glob("*/results.json")))
    return list(dict.fromkeys(files))


def read_experiments(files: Sequence[Path], *, part: str = "records") -> pd.DataFrame | None:
    """Tidy experiment records (a list, or a document with `records`); unreadable files are skipped.

    `part="summaries"` reads a document's per-configuration summaries instead: the records whose
    `p_value` (and `p_holm`, `significant`) test a configuration against its baseline."""
    frames = []
    for path in files:
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if part == "summaries":
            records = document.get("summaries", []) if isinstance(document, dict) else []
            frame = pd.DataFrame([r for r in records if isinstance(r, dict) and "p_value" in r])
            if not frame.empty:
                if "experiment" not in frame:
                    frame["experiment"] = path.parent.name
                frames.append(frame)
            continue
        records = document.get("records", []) if isinstance(document, dict) else document
        if not isinstance(records, list):
            continue
        frame = pd.DataFrame([r for r in records if isinstance(r, dict) and "value" in r])
        if frame.empty:
            continue
        if "experiment" not in frame:
            frame["experiment"] = path.parent.name
        frame["source"] = str(path)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True) if frames else None


def summarise_experiments(records: pd.DataFrame, tests: pd.DataFrame | None = None) -> pd.DataFrame:
    """Mean, standard deviation (ddof 1; 0 for one seed) and seed count of `value` per configuration,
    with the configuration's test against its baseline where `tests` (the experiments' summaries)
    give one: `p` (Holm-adjusted when `p_holm` is given) and `significant`."""
    keys = [key for key in EXPERIMENT_KEYS if key in records]
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


def _read_records(run_dir: Path, name: str, kind: str, notes: dict[str, str], *, section: str,
                  part: str = "records") -> tuple[dict[str, Any] | None, pd.DataFrame | None]:
    """(document, its `part` as a frame) of an optional result file; a missing one is noted with the
    command that writes it."""
    document = read_result_json(run_dir / name, kind=kind)
    if document is None:
        notes[section] = f"no {name} in {run_dir}; run `{PRODUCERS[section]}`"
        return None, None
    return document, _frame(document[part])


def load_run(run_dir: str | os.PathLike, *, include: Sequence[str | os.PathLike] = ()) -> RunData:
    """Read every result file of a run directory; missing ones are noted with the command that writes them."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir} is not a directory; give a run directory written by `lmgeom run`")
    notes: dict[str, str] = {}

    _, summary = _read_records(run_dir, "summary.json", "layer_summary", notes, section="summary", part="layers")

    contextuality = read_result_json(run_dir / "contextuality.json", kind="contextuality")
    layers = _frame(contextuality["records"]) if contextuality else None
    if contextuality is None:
        notes["contextuality"] = f"no contextuality.json in {run_dir}; run `{PRODUCERS['contextuality']}`"

    words_path = run_dir / "contextuality_words.csv"
    words = pd.read_csv(words_path, keep_default_na=False, na_values=[""]) if words_path.exists() else None
    if words is None:
        notes["words"] = f"no contextuality_words.csv in {run_dir}; run `{PRODUCERS['words']}`"
    elif len(words):
        words["word"] = words["word"].astype(str)

    calibration_doc, calibration = _read_records(run_dir, "calibration.json", "calibration", notes, section="calibration")

    _, isotropy = _read_records(run_dir, "isotropy.json", "isotropy", notes, section="isotropy")

    static = _read_static(run_dir)
    if static is None:
        notes["static"] = f"no static/<layer>.benchmarks.json in {run_dir}; run `{PRODUCERS['static']}`"
    sts = _read_sts(run_dir)
    if sts is None:
        notes["sts"] = f"no STS results JSON in {run_dir}; run `{PRODUCERS['sts']}`"
    experiment_files = experiment_result_files(run_dir, include)
    experiments = read_experiments(experiment_files)
    experiment_tests = read_experiments(experiment_files, part="summaries")
    if experiments is None:
        notes["experiments"] = f"no readable experiments/*/results.json in {run_dir} (nor in --include folders)"

    return RunData(
        path=run_dir,
        meta=_read_meta(run_dir),
        summary=summary,
        contextuality=contextuality,
        layers=layers,
        words=words,
        calibration=calibration,
        calibration_settings=dict((calibration_doc or {}).get("settings", {})),
        isotropy=isotropy,
        static=static,
        sts=sts,
        experiments=experiments,
        experiment_tests=experiment_tests,
        notes=notes,
    )


def context_specific_words(words: pd.DataFrame, layer: int, *, n: int = 10) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(most context-specific = lowest self-similarity, least = highest) words at a layer."""
    at_layer = words.loc[(words["layer"] == layer) & words["self_similarity"].notna()]
    columns = ["word", "count", "contexts", "self_similarity", "self_similarity_adjusted"]
    most = at_layer.sort_values(["self_similarity", "word"], kind="stable").head(n)[columns]
    least = at_layer.sort_values(["self_similarity", "word"], ascending=[False, True], kind="stable").head(n)[columns]
    return most.reset_index(drop=True), least.reset_index(drop=True)


def step_seconds(run_dir: Path) -> dict[str, float]:
    """Seconds each step of `lmgeom run` took, as RUN/run.json records them (empty without it)."""
    document = read_result_json(run_dir / "run.json", kind="run")
    if document is None:
        return {}
    return {name: float(step["seconds"]) for name, step in document.get("steps", {}).items()}
