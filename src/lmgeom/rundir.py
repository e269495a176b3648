"""The run directory: the names, kinds and schema versions of its result files, their reader and
their atomic writers (as `lmgeom.store.layout` is for the store).

```
RUN/                         a store (lmgeom.store.layout) plus the result files written next to it
  run.json                   lmgeom run's finished steps, their settings and outputs
  summary.json               per-layer mean norm and average cosine
  contextuality.json         the analysis: settings, counts, records, findings
  contextuality_layers.csv   its records;  contextuality_words.csv: word x layer
  isotropy.json, .csv        global and local isotropy of every layer
  geometry.json              intrinsic dimension, outlier panel, uniformity/alignment of every layer
  calibration.json, .csv     isotropy before and after each fitted (layer, method)
  calibrators/<method>-L<layer>.npz|.pt
  static/<layer>.benchmarks.json, .csv, and the layer's static vectors
  *.json of kind "sts"       lmgeom sts --out RUN/NAME.json
  experiments/<name>/results.json
  explorer.json              the word explorer's cache
  similarity.json, .csv      lmgeom similarity: layer x layer CKA, Procrustes, RSA, mutual k-NN
  similarity/<other>/        the same against another store of the corpus
  report.html, figures/      the report
```

Every JSON document carries `kind`, `schema_version`, the lmgeom version, the model id, the corpus
fingerprint and the layer-0 note. A result of a step over a store also carries its `provenance`:
the store's generation id (`meta.json`'s, new whenever a store is extracted), the full settings of
the step that wrote it (its options' `to_settings()`) and the SHA-256 of each companion file written
with it (the CSV tables beside it). `write_result_set` writes the companions first and the document
last, so the document is the set's manifest: a write cut short leaves the old document beside new
companions, which `provenance_problem` reports as a mixed set. `read_result` (the reader of `report`,
`compare` and `run`) refuses a document of another store, corpus or settings, or of a mixed set,
naming the file, what differs and the command that writes it again. `read_json` returns a document only when it parses, is of the
expected kind and schema version and holds the keys its readers use; anything else is a
`ResultFileError` naming the file and the command that writes it again. Files are read through
`lmgeom.store.location.Location`, so a run on any fsspec URL (s3://, gs://, memory://, file://) reads
and writes the same way: a file's target (`ResultFile.at`) is a `Path` in a local run and its URL
elsewhere, and the writers write all of a file or nothing (a temporary file renamed into place on a
local disk, one PUT on an object store).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import math
import os
import posixpath
import re
import tempfile
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Union

import pandas as pd

from lmgeom.atomic import is_temporary
from lmgeom.errors import InputError
from lmgeom._version import __version__
from lmgeom.store import layout
from lmgeom.store.layout import LAYER_NOTE
from lmgeom.store.location import Location, is_url
from lmgeom.store.lock import is_lock_file

SCHEMA_VERSION = 1

Target = Union[Path, str]
"""Where a result file is: a local `Path`, or the file's fsspec URL in a run on another filesystem."""
Where = Union[str, "os.PathLike[str]", Location]
"""A run directory (or a result file): a local path, an fsspec URL or a `Location`."""


def layer_name(layer: int) -> str:
    """What layer `layer` is, in words, as result files and the report name it (`LAYER_NOTE`):
    "embedding output" or "block l"."""
    return "embedding output" if layer == 0 else f"block {layer}"


def target(directory: Where, relative: str = "") -> Target:
    """The file `relative` ('/'-separated) in `directory`: a `Path` when the directory is local (a path
    or a file:// URL), else its URL."""
    if isinstance(directory, Location) or is_url(directory):
        location = Location.of(directory)
        if location.is_local:
            directory = location.root
        else:
            return f"{location.url}/{relative}" if relative else location.url
    return Path(directory) / relative if relative else Path(directory)


def relative_to(directory: Where, path: Target) -> str:
    """`path`, a file below the run `directory`, relative to it ('/'-separated)."""
    base, inner = Location.of(target(directory)), Location.of(path)
    return posixpath.relpath(inner.root, base.root)


def exists(path: Where) -> bool:
    """Whether a result file or folder (a path or URL) is there."""
    return Location.of(path).exists()


def link(page: Target, path: Target) -> str:
    """The relative link from the page `page` to the file `path` on the same filesystem."""
    return posixpath.relpath(Location.of(path).root, posixpath.dirname(Location.of(page).root))


def name_of(path: Target) -> str:
    """The last part of a result file's path or URL."""
    return posixpath.basename(str(path).rstrip("/"))


@dataclass(frozen=True)
class ResultFile:
    """One file (or folder) of a run directory: its path relative to the run (`{layer}`, `{name}`,
    `{method}` stand for parts that vary), the `kind` of a JSON document, the keys a document must hold, its
    schema version, and the command that writes it."""

    name: str
    producer: str
    kind: str = ""  # "" for a file that is not a JSON result document
    required: tuple[str, ...] = ()
    schema_version: int = SCHEMA_VERSION

    def at(self, directory: Where, **parts: Any) -> Target:
        """The file's target in the run `directory` (`parts` fill `{layer}`, `{name}`, ...): a `Path`
        in a local run, else its URL."""
        return target(directory, self.name.format(**parts))

    def find(self, directory: Where) -> list[Target]:
        """The files of this kind in the run `directory` (its `{...}` parts any value), sorted."""
        location = Location.of(target(directory))
        return [target(directory, relative) for relative in sorted(location.files())
                if fnmatch.fnmatchcase(relative, self.pattern)]

    @property
    def pattern(self) -> str:
        """The relative path as a glob (`{layer}` -> `*`)."""
        return re.sub(r"\{[a-z]+\}", "*", self.name)


RUN = ResultFile("run.json", "lmgeom run", "run", ("store", "steps"))
SUMMARY = ResultFile("summary.json", "lmgeom run (writes summary.json)", "layer_summary", ("layers",))
CONTEXTUALITY = ResultFile("contextuality.json", "lmgeom analyze RUN (or lmgeom run)", "contextuality",
                           ("settings", "counts", "records", "findings", "statements"))
CONTEXTUALITY_LAYERS = ResultFile("contextuality_layers.csv", CONTEXTUALITY.producer)
CONTEXTUALITY_WORDS = ResultFile("contextuality_words.csv", "lmgeom analyze RUN (writes contextuality_words.csv)")
ISOTROPY = ResultFile("isotropy.json", "lmgeom run (writes isotropy.json: global and local isotropy of every layer)",
                      "isotropy", ("settings", "records"))
ISOTROPY_CSV = ResultFile("isotropy.csv", ISOTROPY.producer)
CALIBRATION = ResultFile("calibration.json", "lmgeom calibrate RUN --methods whitening,abtt", "calibration",
                         ("settings", "records"))
CALIBRATION_CSV = ResultFile("calibration.csv", CALIBRATION.producer)
CALIBRATORS = ResultFile("calibrators", CALIBRATION.producer)
CALIBRATOR = ResultFile("calibrators/{method}-L{layer}", CALIBRATION.producer)  # + the calibrator's suffix
STATIC = ResultFile("static", "lmgeom static-embeddings RUN --layer L")
STATIC_VECTORS = ResultFile("static/{layer}.kv", STATIC.producer)  # gensim KeyedVectors of the first-PC vectors
STATIC_TEXT = ResultFile("static/{layer}.txt", STATIC.producer)  # the same in word2vec text
STATIC_BENCHMARKS = ResultFile("static/{layer}.benchmarks.json", STATIC.producer, "static_embedding_benchmarks", ("records",))
STATIC_BENCHMARKS_CSV = ResultFile("static/{layer}.benchmarks.csv", STATIC.producer)
GEOMETRY = ResultFile("geometry.json", "lmgeom geometry RUN (or lmgeom run)", "geometry", ("settings", "counts", "layers"))
GEOMETRY_CSV = ResultFile("geometry.csv", GEOMETRY.producer)
STS_CSV_SUFFIX = ".csv"  # an STS results JSON's records as a table beside it: NAME.json -> NAME.csv
STS = ResultFile("sts.json", "lmgeom sts MODEL --data-dir DIR --out RUN/sts.json", "sts", ("settings", "records"))
EXPERIMENTS = ResultFile("experiments", "an experiment that writes RUN/experiments/NAME/results.json")
EXPERIMENT_RESULTS = ResultFile("experiments/{name}/results.json", EXPERIMENTS.producer)
EXPERIMENT_CONFIG_KEYS = ("experiment", "task", "model", "regime", "features", "method", "head", "pooling", "split", "metric")
"""The keys of an experiment record that name its configuration (the others are its value, seed, ...)."""
# the files of one experiment folder (RUN/experiments/NAME, or any folder given as `out`)
EXPERIMENT_JSON = ResultFile("results.json", EXPERIMENTS.producer)
EXPERIMENT_TABLE = ResultFile("results.md", EXPERIMENTS.producer)
EXPERIMENT_FIGURE = ResultFile("{name}", EXPERIMENTS.producer)  # <split>_<metric>.png|svg in the folder
WSD_PREDICTIONS = ResultFile("predictions.csv", "lmgeom experiment wsd")  # one row an instance: gold and each system's answer
STATIC_BASELINE_VECTORS = ResultFile("vectors/{name}.bin", "lmgeom experiment static-baselines")  # word2vec binary
EXPLORER = ResultFile("explorer.json", "lmgeom report RUN on a run whose store is present", "word_explorer",
                      ("settings", "data"))
SIMILARITY = ResultFile("similarity.json", "lmgeom run (its similarity step), or lmgeom similarity STORE [STORE2] --out DIR", "similarity",
                        ("settings", "counts", "records"))
SIMILARITY_CSV = ResultFile("similarity.csv", SIMILARITY.producer)
SIMILARITY_PAIRS = ResultFile("similarity", "lmgeom similarity STORE STORE2 (writes STORE/similarity/<STORE2 name>/)")
REPORT = ResultFile("report.html", "lmgeom report RUN")
FIGURES = ResultFile("figures", REPORT.producer)
FIGURE = ResultFile("figures/{name}", REPORT.producer)  # <chart>.png|svg
# `lmgeom report RUN1 RUN2 --out DIR`: the comparison's folder (its figures in DIR/figures/)
COMPARE_PAGE = ResultFile("compare.html", "lmgeom report RUN1 RUN2 --out DIR")
COMPARE_CSV = ResultFile("compare.csv", COMPARE_PAGE.producer)
# the similarity of runs i and j (numbered from 1 as given): similarity.json and .csv in the folder
COMPARE_SIMILARITY = ResultFile("similarity/{name}", "lmgeom compare RUN1 RUN2 --out DIR (runs of one corpus)")

RESULT_FILES = (RUN, SUMMARY, CONTEXTUALITY, CONTEXTUALITY_LAYERS, CONTEXTUALITY_WORDS, ISOTROPY, ISOTROPY_CSV, GEOMETRY,
                GEOMETRY_CSV, CALIBRATION, CALIBRATION_CSV, CALIBRATORS, STATIC, STATIC_BENCHMARKS, STATIC_BENCHMARKS_CSV,
                EXPERIMENTS, EXPLORER, SIMILARITY, SIMILARITY_CSV, SIMILARITY_PAIRS, REPORT, FIGURES)
KINDS = {spec.kind: spec for spec in (*RESULT_FILES, STS) if spec.kind}
# the step of `lmgeom run` whose settings each of its result files records (`run_settings`)
RUN_STEPS = {CONTEXTUALITY.name: "contextuality", SUMMARY.name: "contextuality", ISOTROPY.name: "isotropy",
             SIMILARITY.name: "similarity", GEOMETRY.name: "geometry", STATIC_BENCHMARKS.name: "static_embeddings"}
# names at the top of a run that hold something other than STS results: the store's and the run's own
RESERVED_NAMES = frozenset({*layout.STORE_NAMES, *(spec.name.split("/")[0] for spec in RESULT_FILES)})
# what makes a folder a run: the store's meta.json or any result file a stage writes
_RUN_MARKERS = (layout.META, RUN.name, SUMMARY.name, CONTEXTUALITY.name, ISOTROPY.name, CALIBRATION.name,
                EXPLORER.name, STATIC.name, EXPERIMENTS.name)


class ResultFileError(InputError):
    """A result file that does not parse, is of another kind or schema, or lacks what its readers use."""


def _regenerate(spec: ResultFile | None) -> str:
    return f"run `{spec.producer}` to write it again" if spec else "write it again with the command that made it"


def is_run(directory: Where) -> bool:
    """Whether `directory` is a run: it holds a store's meta.json, a result file of a stage, or
    STS results (`lmgeom sts --out DIR/NAME.json`)."""
    location = Location.of(directory)
    return any(location.exists(name) for name in _RUN_MARKERS) or bool(sts_files(location))


def sts_files(directory: Where) -> list[Target]:
    """The STS results JSONs at the top of a run (`lmgeom sts --out RUN/NAME.json`: any name not
    reserved for another file), sorted."""
    location = Location.of(directory)
    return [target(directory, name) for name in location.listdir()
            if name.endswith(".json") and name not in RESERVED_NAMES and _is_sts(location.child(name).url)]


def sts_table(path: Target) -> Target:
    """The CSV table beside an STS results JSON (NAME.json -> NAME.csv)."""
    return path.with_suffix(STS_CSV_SUFFIX) if isinstance(path, Path) else f"{posixpath.splitext(path)[0]}{STS_CSV_SUFFIX}"


def _is_sts(path: str) -> bool:
    try:
        document = read_json(path)
    except ResultFileError:
        return False
    return document is not None and document.get("kind") == STS.kind


def require_run(directory: Where) -> None:
    """Raise a clear error unless `directory` is a run (`is_run`)."""
    location = Location.of(directory)
    if not location.exists():
        raise FileNotFoundError(f"{directory}: no such directory; give a run directory written by `lmgeom run`")
    if not is_run(directory):
        raise InputError(f"{directory} is not a run directory: a run is a folder written by `lmgeom run` (or a store "
                         f"from `lmgeom extract`), holding {layout.META} or result files such as {CONTEXTUALITY.name}")


def _parse(path: Where, spec: ResultFile | None) -> Any:
    location = Location.of(path)
    if not location.exists():
        return None
    try:
        return json.loads(location.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ResultFileError(f"{path} is truncated or not JSON ({error}); {_regenerate(spec)}") from None


def read_experiment_results(path: Where) -> dict[str, Any] | list[Any] | None:
    """An experiment's results.json: a document with `records` (and `summaries`), or a list of
    records; None when there is none."""
    document = _parse(path, EXPERIMENT_RESULTS)
    if document is not None and not isinstance(document, (dict, list)):
        raise ResultFileError(f"{path} holds neither a JSON object nor a list of records; {_regenerate(EXPERIMENT_RESULTS)}")
    return document


def read_json(path: Where, kind: str | None = None) -> dict[str, Any] | None:
    """The result document at `path` (a local path or an fsspec URL), or None when there is none.

    With `kind`, the document must be of that kind, at the schema version this lmgeom reads, and hold
    the keys its readers use; without it, any JSON object is returned."""
    spec = KINDS.get(kind) if kind else None
    document = _parse(path, spec)
    if document is None:
        return None
    if not isinstance(document, dict):
        raise ResultFileError(f"{path} holds no JSON object; {_regenerate(spec)}")
    if not kind:
        return document
    if document.get("kind") != kind:
        raise ResultFileError(f"{path} holds kind {document.get('kind')!r}, expected {kind!r}; was it overwritten "
                              f"by another command? {_regenerate(spec)}")
    version = spec.schema_version if spec else SCHEMA_VERSION
    if document.get("schema_version") != version:
        raise ResultFileError(f"{path} has schema version {document.get('schema_version')!r}; this lmgeom reads "
                              f"version {version}: {_regenerate(spec)}")
    missing = [key for key in (spec.required if spec else ()) if key not in document]
    if missing:
        raise ResultFileError(f"{path} lacks {', '.join(missing)}; {_regenerate(spec)}")
    return document


def read_store_meta(directory: Where) -> dict[str, Any]:
    """The meta.json of the store in a run directory ({} when the store is not there)."""
    location = Location.of(directory)
    return location.read_json(layout.META) if location.exists(layout.META) else {}


def read_csv(path: Where, spec: ResultFile | None = None, **options: Any) -> pd.DataFrame | None:
    """The table at `path` (options as for `pandas.read_csv`), or None when there is none."""
    location = Location.of(path)
    if not location.exists():
        return None
    try:
        return pd.read_csv(BytesIO(location.read_bytes()), **options)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as error:
        raise ResultFileError(f"{path} is truncated or not CSV ({error}); {_regenerate(spec)}") from None


WORDS_COLUMNS = ("word", "layer", "count", "contexts")
"""The columns of contextuality_words.csv its readers rely on (one row per word and layer)."""


def read_words(directory: Where) -> pd.DataFrame | None:
    """contextuality_words.csv of a run (words as text, empty cells as NaN), or None when there is none;
    a table without its columns (`WORDS_COLUMNS`) or with a non-numeric layer or count is an error naming it."""
    path = CONTEXTUALITY_WORDS.at(directory)
    words = read_csv(path, CONTEXTUALITY_WORDS, keep_default_na=False, na_values=[""], dtype={"word": str})
    if words is None:
        return None
    missing = [column for column in WORDS_COLUMNS if column not in words.columns]
    if missing:
        raise ResultFileError(f"{path} lacks the column(s) {', '.join(missing)} (it has {', '.join(map(str, words.columns))}); "
                              f"{_regenerate(CONTEXTUALITY_WORDS)}")
    bad = [column for column in WORDS_COLUMNS[1:] if len(words) and not pd.api.types.is_numeric_dtype(words[column])]
    if bad:
        raise ResultFileError(f"{path}: column(s) {', '.join(bad)} hold values that are not numbers; "
                              f"{_regenerate(CONTEXTUALITY_WORDS)}")
    return words


def spec_of(relative: str) -> ResultFile | None:
    """The result file a path relative to the run directory is (None for any other file)."""
    relative = posixpath.normpath(str(relative).replace(os.sep, "/"))
    return next((spec for spec in (*RESULT_FILES, CALIBRATOR) if fnmatch.fnmatchcase(relative, spec.pattern)), None)


def problem(directory: Where, relative: str) -> str | None:
    """Why the output `relative` of a run in `directory` is not a finished result (None when it is):
    it is missing, or a JSON result file or CSV table of the run that does not read as one."""
    location = Location.of(directory)
    if not location.exists(*Path(relative).parts):
        return f"{relative} is missing"
    spec = spec_of(relative)
    path = location.child(*Path(relative).parts).url
    try:
        if spec is not None and spec.kind:
            read_json(path, spec.kind)
        elif relative.endswith(".csv"):
            read_csv(path, spec)
    except ResultFileError as error:
        return str(error)
    return None


# ---- writers ----------------------------------------------------------------------------------

def jsonable(value: Any) -> Any:
    """`value` as plain JSON: numpy scalars and arrays as numbers and lists, non-finite floats as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return jsonable(value.item())
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "tolist"):
        return jsonable(value.tolist())
    return value


def provenance(store_meta: Mapping[str, Any] | None = None, *, kind: str | None = None) -> dict[str, Any]:
    """The fields every result document carries (its schema version is that of `kind`)."""
    meta = dict(store_meta or {})
    spec = KINDS.get(kind) if kind is not None else None
    return {
        "schema_version": spec.schema_version if spec else SCHEMA_VERSION,
        "lmgeom_version": __version__,
        "model_id": meta.get("model_id"),
        "corpus_fingerprint": meta.get("corpus_fingerprint"),
        "layer_note": LAYER_NOTE,
    }


PROVENANCE = "provenance"
"""The key of a result document's provenance block (`write_result_set`)."""


def digest(data: bytes) -> str:
    """The content hash a result document records for a companion file."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def records_csv(records: Iterable[Mapping[str, Any]]) -> bytes:
    """Tidy records as the bytes of a CSV table (what `write_records_csv` writes)."""
    return pd.DataFrame(list(records)).to_csv(index=False).encode("utf-8")


def write_result_set(path: Target, kind: str, payload: Mapping[str, Any], *, store_meta: Mapping[str, Any] | None,
                     settings: Mapping[str, Any] | None, companions: Iterable[tuple[Target, bytes]] = (),
                     compact: bool = False) -> list[Target]:
    """A step's result files as one set: each companion (a file beside `path`, with its bytes)
    written first, then the document of `kind` at `path` with its provenance (the store's
    generation, the step's `settings`, each companion's digest). Returns the document's target,
    then the companions'."""
    refuse_foreign_folder(path, store_meta)
    written, digests = [], {}
    for target_, data in companions:
        written.append(write_bytes(target_, data))
        digests[posixpath.relpath(Location.of(target_).root, _folder_of(path).root)] = digest(data)
    block = {"store_generation": (store_meta or {}).get("generation"),
             "settings": None if settings is None else jsonable(settings), "companions": digests}
    return [write_json(path, kind, {**payload, PROVENANCE: block}, store_meta=store_meta, compact=compact), *written]


def _folder_of(path: Target) -> Location:
    """The folder a result file is in."""
    location = Location.of(path)
    return Location(location.fs, posixpath.dirname(location.root), location.url.rsplit("/", 1)[0])


def expected_store(directory: Where) -> dict[str, Any]:
    """What the results in a run directory must come from: the generation and corpus fingerprint of
    its store's meta.json, or (a run whose store is gone) of run.json's record of it; {} when neither."""
    meta = read_store_meta(directory)
    if not meta:
        try:
            run = read_json(RUN.at(directory), RUN.kind)
        except ResultFileError:
            run = None
        meta = dict((run or {}).get("store") or {})
    return {key: meta.get(key) for key in ("generation", "corpus_fingerprint") if meta.get(key) is not None}


def _differences(recorded: Mapping[str, Any], expected: Mapping[str, Any]) -> str:
    keys = sorted(set(recorded) | set(expected))
    changed = [f"{key} {recorded.get(key)!r} (expected {expected.get(key)!r})" for key in keys
               if recorded.get(key) != expected.get(key)]
    return ", ".join(changed[:4]) + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")


FOREIGN, MIXED, STALE = "foreign", "mixed", "stale"
"""The kinds of `provenance_issue`: a result of another store (refused by every reader, `run`
included: it will not replace what is not its own); a mixed set, what a write cut short leaves, and a
result this store wrote with other settings or without provenance (refused by `report` and `compare`,
recomputed by `run`, which resumes)."""


def provenance_issue(path: Target, document: Mapping[str, Any], *, store: Mapping[str, Any] | None = None,
                     settings: Mapping[str, Any] | None = None) -> tuple[str, str] | None:
    """Why the result `document` read from `path` is not the run's, as (kind, reason), or None when
    it is. FOREIGN: it comes from another store generation or corpus than `store` (`expected_store`).
    MIXED: a companion file is missing or not the one written with it. STALE: it records
    no provenance, or was written with other `settings` (a step's `to_settings()`; None: not compared)."""
    block = document.get(PROVENANCE)
    if not isinstance(block, Mapping):
        return STALE, "records no provenance (written by an lmgeom that did not record the store and settings behind a result)"
    store = store or {}
    if store.get("generation") and block.get("store_generation") != store["generation"]:
        return FOREIGN, (f"was written from another store (store generation {block.get('store_generation')}; the store "
                         f"here is generation {store['generation']})")
    if store.get("corpus_fingerprint") and document.get("corpus_fingerprint") != store["corpus_fingerprint"]:
        return FOREIGN, (f"was written from another corpus (fingerprint {document.get('corpus_fingerprint')}; the "
                         f"store's is {store['corpus_fingerprint']})")
    for name, recorded in (block.get("companions") or {}).items():
        companion = _folder_of(path).child(*name.split("/"))
        if not companion.exists():
            return MIXED, f"is missing its companion {name}"
        if digest(companion.read_bytes()) != recorded:
            return MIXED, (f"and {name} are not one set: {name} was not written with it (a write cut short, or a "
                             "file copied from another run)")
    if settings is not None:
        expected = jsonable(settings)
        if block.get("settings") != expected:
            return STALE, f"was written with other settings: {_differences(block.get('settings') or {}, expected)}"
    return None


def provenance_problem(path: Target, document: Mapping[str, Any], *, store: Mapping[str, Any] | None = None,
                       settings: Mapping[str, Any] | None = None) -> str | None:
    """`provenance_issue`'s reason, whatever its kind."""
    issue = provenance_issue(path, document, store=store, settings=settings)
    return None if issue is None else issue[1]


def refuse_foreign_folder(path: Target, store_meta: Mapping[str, Any] | None) -> None:
    """Refuse to write a result of the store `store_meta` into a folder that holds another store or a
    run of another store (`expected_store`): its results would sit beside ones they do not belong with."""
    generation = (store_meta or {}).get("generation")
    folder = _folder_of(path)
    here = expected_store(folder.url) or expected_store(_folder_of(folder.url).url)  # static/ is one level down
    if generation and here.get("generation") and here["generation"] != generation:
        raise InputError(f"{folder.url} holds another store's results (store generation {here['generation']}; this "
                         f"store is generation {generation}); write these results to a folder of their own with "
                         "`--out`", param="out")


def check_result(directory: Where, path: Target, spec: ResultFile, document: Mapping[str, Any], *,
                 settings: Mapping[str, Any] | None = None) -> None:
    """Raise a `ResultFileError` naming `path`, what differs and how to write it again unless the
    result `document` read from it is the run `directory`'s (`provenance_problem` against
    `expected_store(directory)` and the `settings` expected of it, None: not compared)."""
    problem = provenance_problem(path, document, store=expected_store(directory), settings=settings)
    if problem is not None:
        raise ResultFileError(f"{path} {problem}; {_regenerate(spec)}")


def read_result(directory: Where, spec: ResultFile, *, settings: Mapping[str, Any] | None = None,
                **parts: Any) -> dict[str, Any] | None:
    """The result document `spec` of the run `directory` (`parts` fill its name), checked by
    `check_result` against `settings` (default: what run.json records of the step that writes it,
    `run_settings`); None when there is none."""
    path = spec.at(directory, **parts)
    document = read_json(path, spec.kind)
    if document is not None:
        check_result(directory, path, spec, document, settings=settings if settings is not None else run_settings(directory, spec))
    return document


def run_settings(directory: Where, spec: ResultFile) -> dict[str, Any] | None:
    """The settings a result file of `lmgeom run`'s step (`RUN_STEPS`) must record, as the run's
    run.json records that step; None when the folder has no run.json, the step is not recorded
    there, or the file is one several commands add to (calibration.json)."""
    step_name = RUN_STEPS.get(spec.name)
    if step_name is None:
        return None
    try:
        run = read_json(RUN.at(directory), RUN.kind)
    except ResultFileError:
        return None
    step = ((run or {}).get("steps") or {}).get(step_name)
    if not isinstance(step, Mapping):
        return None
    recorded = step.get("file_settings", step.get("settings"))
    return dict(recorded) if isinstance(recorded, Mapping) else None


def write_bytes(path: Target, data: bytes) -> Target:
    """All of `data` at `path` or nothing (a rename on a local disk, one PUT on an object store)."""
    Location.of(path).write_bytes(data)
    return path


def figure_bytes(figure: Any, fmt: str, dpi: int) -> bytes:
    """The matplotlib `figure` as `fmt` ("png" or "svg") bytes that depend on the figure alone: no
    creation date, and the SVG's element ids from a fixed salt, so a regenerated figure of the same
    results is the same file."""
    import matplotlib

    buffer = BytesIO()
    metadata = {"Date": None} if fmt == "svg" else None
    with matplotlib.rc_context({"svg.hashsalt": "lmgeom"}):
        figure.savefig(buffer, format=fmt, dpi=dpi, metadata=metadata)
    return buffer.getvalue()


def write_json(path: Target, kind: str, payload: Mapping[str, Any], *,
               store_meta: Mapping[str, Any] | None = None, compact: bool = False) -> Target:
    """A result document of `kind` with its provenance, written atomically; `compact` drops the
    indentation (for large caches)."""
    document = jsonable({"kind": kind, **provenance(store_meta, kind=kind), **payload})
    text = json.dumps(document, separators=(",", ":")) if compact else json.dumps(document, indent=2)
    return write_text(path, text + "\n")


def write_records_csv(path: Target, records: Iterable[Mapping[str, Any]]) -> Target:
    """Tidy records as a CSV table, written atomically."""
    return write_bytes(path, records_csv(records))


def write_text(path: Target, text: str) -> Target:
    return write_bytes(path, text.encode("utf-8"))


def write_with(path: Target, save: Callable[[Path], Path]) -> Target:
    """The file a local writer `save(local_path) -> path written` makes (matplotlib's savefig, a
    calibrator's save, which may add a suffix), at `path`: in place on a local disk (`save` writes
    atomically there), else written into a temporary folder and put whole. The target written."""
    if isinstance(path, Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        return save(path)
    with tempfile.TemporaryDirectory(prefix="lmgeom-put-") as scratch:
        written = save(Path(scratch) / name_of(path))
        url = f"{str(path).rsplit('/', 1)[0]}/{written.name}"
        return write_bytes(url, written.read_bytes())


# ---- what lmgeom wrote ------------------------------------------------------------------------

GENERATOR = "lmgeom"
"""The mark of a page or table lmgeom wrote: `<meta name="generator" content="lmgeom ...">` in an HTML
page's head, `<!-- generator: lmgeom ... -->` as a markdown table's first line."""
_MARKS = (re.compile(rb'<meta name="generator" content="lmgeom[ "]'), re.compile(rb"\A<!-- generator: lmgeom[ -]"))
_KIND = re.compile(rb'\A\s*\{\s*"kind"\s*:\s*"([^"\\]+)"')  # write_json puts `kind` first
_HEAD_BYTES = 4096
_PLACED = (STATIC_VECTORS, STATIC_TEXT, FIGURE, EXPERIMENT_RESULTS)
"""Files a run holds in its folders besides `spec_of`'s."""


def generator_mark(version: str = __version__) -> str:
    """The generator `<meta>` element an HTML page lmgeom writes carries in its head."""
    return f'<meta name="generator" content="{GENERATOR} {version}">'


def markdown_mark(command: str) -> str:
    """The first line of a markdown table lmgeom writes (an HTML comment: invisible when rendered)."""
    return f"<!-- generator: {GENERATOR} {__version__} ({command}) -->\n"


def foreign_entries(directory: Where) -> list[str]:
    """The names at the top of the folder `directory` that are not lmgeom's, sorted; what
    `overwrite=True` of a store's writer removes is the rest, and it removes nothing while any is there.

    lmgeom's own: the store's files and folders (`layout.STORE_NAMES`, the writer's lock), the run's
    result files and the folders it writes whole (`RESERVED_NAMES`: figures/, static/, calibrators/,
    experiments/, similarity/, with whatever is in them), STS results JSONs (kind "sts") with the CSV
    table beside each, and the temporary files of an interrupted atomic write."""
    location = Location.of(directory)
    names = location.listdir()
    sts = {name_of(path) for path in sts_files(location)}
    tables = {f"{posixpath.splitext(name)[0]}{STS_CSV_SUFFIX}" for name in sts}
    return [name for name in names if not (name in RESERVED_NAMES or name in sts or name in tables
                                           or is_lock_file(name) or is_temporary(name))]


def written_by_lmgeom(path: Target) -> bool:
    """Whether lmgeom wrote the file at `path`, as far as the file tells: a JSON result document (its
    `kind`, the first key lmgeom writes, one of lmgeom's kinds), a page or table carrying lmgeom's
    generator mark (`GENERATOR`), or a result file in its place in a run (`spec_of` its path below a
    run directory: RUN/report.html, RUN/static/3.txt). A file at any other place that bears no mark (a
    word2vec text file written to `--out vectors.txt`) cannot be told from a user's."""
    location = Location.of(path)
    with location.fs.open(location.root, "rb") as handle:
        head = handle.read(_HEAD_BYTES)
    kind = _KIND.match(head)
    if kind and kind[1].decode("utf-8", "replace") in KINDS or any(mark.search(head) for mark in _MARKS):
        return True
    parts = location.root.rstrip("/").split("/")
    for depth in range(1, min(4, len(parts))):  # the deepest result files: experiments/NAME/results.json
        parent = "/".join(parts[:-depth]) or "/"
        relative = "/".join(parts[-depth:])
        if (any(fnmatch.fnmatchcase(relative, spec.pattern) for spec in _PLACED) or spec_of(relative) is not None) \
                and is_run(Location(location.fs, parent, parent)):
            return True
    return False


def claim_file(path: Target, *, overwrite: bool, param: str = "out") -> None:
    """Refuse, before any work, to write the file `path` over one that lmgeom did not write
    (`written_by_lmgeom`) unless `overwrite`; a folder at `path` is refused either way. `param` names the
    parameter that gave `path`."""
    location = Location.of(path)
    if not location.exists():
        return
    if location.fs.isdir(location.root):
        raise InputError(f"`{param}` {path} is a folder; give the name of a file to write", param=param)
    if overwrite or written_by_lmgeom(path):
        return
    raise InputError(f"`{param}` {path} exists and lmgeom did not write it (it is neither an lmgeom result document nor a "
                     f"result file in a run); nothing was written. Give another `{param}`, or pass `overwrite=True` to "
                     "replace it", param=(param, "overwrite"))
