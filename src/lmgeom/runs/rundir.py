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
fingerprint and the layer-0 note. `read_json` returns a document only when it parses, is of the
expected kind and schema version and holds the keys its readers use; anything else is a
`ResultFileError` naming the file and the command that writes it again. Files are read through
`lmgeom.store.location.Location`, so a run on any fsspec URL reads the same way; the writers write
local files, all of a file or nothing.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import posixpath
import re
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any, Iterable, Mapping

import pandas as pd

from lmgeom.errors import InputError
from lmgeom._version import __version__
from lmgeom.atomic import atomic_write_text
from lmgeom.store import layout
from lmgeom.store.layout import LAYER_NOTE
from lmgeom.store.location import Location

SCHEMA_VERSION = 1


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

    def at(self, directory: str | os.PathLike[str], **parts: Any) -> Path:
        """The file's path in the run `directory` (`parts` fill `{layer}`, `{name}`, ...)."""
        return Path(directory) / self.name.format(**parts)

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
CALIBRATION = ResultFile("calibration.json", "lmgeom calibrate RUN --method whitening,abtt", "calibration",
                         ("settings", "records"))
CALIBRATION_CSV = ResultFile("calibration.csv", CALIBRATION.producer)
CALIBRATORS = ResultFile("calibrators", CALIBRATION.producer)
CALIBRATOR = ResultFile("calibrators/{method}-L{layer}", CALIBRATION.producer)  # + the calibrator's suffix
STATIC = ResultFile("static", "lmgeom static-embeddings RUN --layer L")
STATIC_BENCHMARKS = ResultFile("static/{layer}.benchmarks.json", STATIC.producer, "static_embedding_benchmarks", ("records",))
STATIC_BENCHMARKS_CSV = ResultFile("static/{layer}.benchmarks.csv", STATIC.producer)
GEOMETRY = ResultFile("geometry.json", "lmgeom geometry RUN", "geometry", ("settings", "counts", "layers"))
STS = ResultFile("sts.json", "lmgeom sts MODEL --data DIR --out RUN/sts.json", "sts", ("settings", "records"))
EXPERIMENTS = ResultFile("experiments", "an experiment that writes RUN/experiments/NAME/results.json")
EXPERIMENT_RESULTS = ResultFile("experiments/{name}/results.json", EXPERIMENTS.producer)
EXPLORER = ResultFile("explorer.json", "lmgeom report RUN on a run whose store is present", "word_explorer",
                      ("settings", "data"))
SIMILARITY = ResultFile("similarity.json", "lmgeom similarity STORE [STORE2] --out DIR", "similarity",
                        ("settings", "counts", "records"))
SIMILARITY_CSV = ResultFile("similarity.csv", SIMILARITY.producer)
SIMILARITY_PAIRS = ResultFile("similarity", "lmgeom similarity STORE STORE2 (writes STORE/similarity/<STORE2 name>/)")
REPORT = ResultFile("report.html", "lmgeom report RUN")
FIGURES = ResultFile("figures", REPORT.producer)

RESULT_FILES = (RUN, SUMMARY, CONTEXTUALITY, CONTEXTUALITY_LAYERS, CONTEXTUALITY_WORDS, ISOTROPY, ISOTROPY_CSV, GEOMETRY,
                CALIBRATION, CALIBRATION_CSV, CALIBRATORS, STATIC, STATIC_BENCHMARKS, STATIC_BENCHMARKS_CSV,
                EXPERIMENTS, EXPLORER, SIMILARITY, SIMILARITY_CSV, SIMILARITY_PAIRS, REPORT, FIGURES)
KINDS = {spec.kind: spec for spec in (*RESULT_FILES, STS) if spec.kind}
# names at the top of a run that hold something other than STS results: the store's and the run's own
RESERVED_NAMES = frozenset({layout.META, layout.PROGRESS, layout.PARTS, layout.LAYERS, layout.TOKENS,
                            layout.SENTENCES, layout.VOCAB, *(spec.name.split("/")[0] for spec in RESULT_FILES)})
# what makes a folder a run: the store's meta.json or any result file the driver writes
_RUN_MARKERS = (layout.META, RUN.name, SUMMARY.name, CONTEXTUALITY.name, ISOTROPY.name, CALIBRATION.name,
                EXPLORER.name, STATIC.name, EXPERIMENTS.name)


class ResultFileError(InputError):
    """A result file that does not parse, is of another kind or schema, or lacks what its readers use."""


def _regenerate(spec: ResultFile | None) -> str:
    return f"run `{spec.producer}` to write it again" if spec else "write it again with the command that made it"


def is_run(directory: str | os.PathLike[str]) -> bool:
    """Whether `directory` is a run: it holds a store's meta.json, a result file of the driver, or
    STS results (`lmgeom sts --out DIR/NAME.json`)."""
    location = Location.of(directory)
    return any(location.exists(name) for name in _RUN_MARKERS) or any(
        _is_sts(location.child(name).url) for name in location.listdir() if name.endswith(".json"))


def _is_sts(path: str) -> bool:
    try:
        document = read_json(path)
    except ResultFileError:
        return False
    return document is not None and document.get("kind") == STS.kind


def require_run(directory: str | os.PathLike[str]) -> None:
    """Raise a clear error unless `directory` is a run (`is_run`)."""
    location = Location.of(directory)
    if not location.exists():
        raise FileNotFoundError(f"{directory}: no such directory; give a run directory written by `lmgeom run`")
    if not is_run(directory):
        raise InputError(f"{directory} is not a run directory: a run is a folder written by `lmgeom run` (or a store "
                         f"from `lmgeom extract`), holding {layout.META} or result files such as {CONTEXTUALITY.name}")


def _parse(path: str | os.PathLike[str], spec: ResultFile | None) -> Any:
    location = Location.of(path)
    if not location.exists():
        return None
    try:
        return json.loads(location.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ResultFileError(f"{path} is truncated or not JSON ({error}); {_regenerate(spec)}") from None


def read_experiment_results(path: str | os.PathLike[str]) -> dict[str, Any] | list[Any] | None:
    """An experiment's results.json: a document with `records` (and `summaries`), or a list of
    records; None when there is none."""
    document = _parse(path, EXPERIMENT_RESULTS)
    if document is not None and not isinstance(document, (dict, list)):
        raise ResultFileError(f"{path} holds neither a JSON object nor a list of records; {_regenerate(EXPERIMENT_RESULTS)}")
    return document


def read_json(path: str | os.PathLike[str], kind: str | None = None) -> dict[str, Any] | None:
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


def read_store_meta(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The meta.json of the store in a run directory ({} when the store is not there)."""
    location = Location.of(directory)
    return location.read_json(layout.META) if location.exists(layout.META) else {}


def read_csv(path: str | os.PathLike[str], spec: ResultFile | None = None, **options: Any) -> pd.DataFrame | None:
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


def read_words(directory: str | os.PathLike[str]) -> pd.DataFrame | None:
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


def problem(directory: str | os.PathLike[str], relative: str) -> str | None:
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


def write_json(path: str | os.PathLike[str], kind: str, payload: Mapping[str, Any], *,
               store_meta: Mapping[str, Any] | None = None, compact: bool = False) -> Path:
    """A result document of `kind` with its provenance, written atomically; `compact` drops the
    indentation (for large caches)."""
    document = jsonable({"kind": kind, **provenance(store_meta, kind=kind), **payload})
    text = json.dumps(document, separators=(",", ":")) if compact else json.dumps(document, indent=2)
    return atomic_write_text(path, text + "\n")


def write_records_csv(path: str | os.PathLike[str], records: Iterable[Mapping[str, Any]]) -> Path:
    """Tidy records as a CSV table, written atomically."""
    return atomic_write_text(path, pd.DataFrame(list(records)).to_csv(index=False))


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    return atomic_write_text(path, text)
