"""Reading a run directory: whether a folder is a run, its STS results, and each result document or
table, parsed and checked for its kind, schema version and keys (`ResultFileError` otherwise)."""

from __future__ import annotations

import json
import posixpath
from io import BytesIO
from pathlib import Path
from typing import Any

import pandas as pd

from lmgeom.errors import InputError
from lmgeom.store import layout
from lmgeom.store.location import Location
from lmgeom.rundir.files import CONTEXTUALITY, CONTEXTUALITY_WORDS, EXPERIMENT_RESULTS, KINDS, RESERVED_NAMES, RUN_MARKERS, ResultFile, SCHEMA_VERSION, STS, STS_CSV_SUFFIX, Target, Where, spec_of, target

class ResultFileError(InputError):
    """A result file that does not parse, is of another kind or schema, or lacks what its readers use."""


def regenerate_hint(spec: ResultFile | None) -> str:
    """How to write the result file `spec` again, for an error message."""
    return f"run `{spec.producer}` to write it again" if spec else "write it again with the command that made it"


def is_run(directory: Where) -> bool:
    """Whether `directory` is a run: it holds a store's meta.json, a result file of a stage, or
    STS results (`lmgeom sts --out DIR/NAME.json`)."""
    location = Location.of(directory)
    return any(location.exists(name) for name in RUN_MARKERS) or bool(sts_files(location))


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
        raise ResultFileError(f"{path} is truncated or not JSON ({error}); {regenerate_hint(spec)}") from None


def read_experiment_results(path: Where) -> dict[str, Any] | list[Any] | None:
    """An experiment's results.json: a document with `records` (and `summaries`), or a list of
    records; None when there is none."""
    document = _parse(path, EXPERIMENT_RESULTS)
    if document is not None and not isinstance(document, (dict, list)):
        raise ResultFileError(f"{path} holds neither a JSON object nor a list of records; {regenerate_hint(EXPERIMENT_RESULTS)}")
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
        raise ResultFileError(f"{path} holds no JSON object; {regenerate_hint(spec)}")
    if not kind:
        return document
    if document.get("kind") != kind:
        raise ResultFileError(f"{path} holds kind {document.get('kind')!r}, expected {kind!r}; was it overwritten "
                              f"by another command? {regenerate_hint(spec)}")
    version = spec.schema_version if spec else SCHEMA_VERSION
    if document.get("schema_version") != version:
        raise ResultFileError(f"{path} has schema version {document.get('schema_version')!r}; this lmgeom reads "
                              f"version {version}: {regenerate_hint(spec)}")
    missing = [key for key in (spec.required if spec else ()) if key not in document]
    if missing:
        raise ResultFileError(f"{path} lacks {', '.join(missing)}; {regenerate_hint(spec)}")
    return document


def read_store_meta(directory: Where) -> dict[str, Any]:
    """The meta.json of the store in a run directory ({} when the store is not there)."""
    location = Location.of(directory)
    return location.read_json(layout.META) if location.exists(layout.META) else {}


def read_csv(path: Where, spec: ResultFile | None = None, **options: Any) -> pd.DataFrame | None:
    """The table at `path` (options as for `pandas.read_csv`), or None when there is none. Numbers read
    back exactly as written (pandas' default parser is off by up to ~1e-13 of a value in pandas 3)."""
    location = Location.of(path)
    if not location.exists():
        return None
    options.setdefault("float_precision", "round_trip")
    try:
        return pd.read_csv(BytesIO(location.read_bytes()), **options)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as error:
        raise ResultFileError(f"{path} is truncated or not CSV ({error}); {regenerate_hint(spec)}") from None


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
                              f"{regenerate_hint(CONTEXTUALITY_WORDS)}")
    bad = [column for column in WORDS_COLUMNS[1:] if len(words) and not pd.api.types.is_numeric_dtype(words[column])]
    if bad:
        raise ResultFileError(f"{path}: column(s) {', '.join(bad)} hold values that are not numbers; "
                              f"{regenerate_hint(CONTEXTUALITY_WORDS)}")
    return words


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
