"""The one writer of result files: JSON documents with provenance, and tidy CSV records, atomically.

Every JSON carries `kind`, `schema_version`, the lmgeom version, the model id, the corpus fingerprint
and the layer-0 note.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

import pandas as pd

from lmgeom._version import __version__
from lmgeom.atomic import atomic_write_text
from lmgeom.store.layout import LAYER_NOTE

SCHEMA_VERSION = 1


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return _jsonable(value.item())
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "tolist"):
        return _jsonable(value.tolist())
    return value


def provenance(store_meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    meta = dict(store_meta or {})
    return {
        "schema_version": SCHEMA_VERSION,
        "lmgeom_version": __version__,
        "model_id": meta.get("model_id"),
        "corpus_fingerprint": meta.get("corpus_fingerprint"),
        "layer_note": LAYER_NOTE,
    }


def write_json(path: str | os.PathLike[str], kind: str, payload: Mapping[str, Any], *,
               store_meta: Mapping[str, Any] | None = None) -> Path:
    document = {"kind": kind, **provenance(store_meta), **payload}
    return atomic_write_text(path, json.dumps(_jsonable(document), indent=2) + "\n")


def write_records_csv(path: str | os.PathLike[str], records: Iterable[Mapping[str, Any]]) -> Path:
    return atomic_write_text(path, pd.DataFrame(list(records)).to_csv(index=False))


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    return atomic_write_text(path, text)
