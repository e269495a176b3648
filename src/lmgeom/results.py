"""Writing results: every JSON carries schema_version, lmgeom version, model id and corpus fingerprint."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import pandas as pd

from lmgeom._version import __version__

SCHEMA_VERSION = 1
LAYER_NOTE = "layer 0 is the embedding output; layer l >= 1 is the output of transformer block l"


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


def atomic_write(path: str | os.PathLike, write: Callable[[Path], object]) -> Path:
    """`write(tmp)` a temporary file beside `path`, then rename it: a crash never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    os.replace(tmp, path)
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_json(path: str | os.PathLike, kind: str, payload: Mapping[str, Any], *, store_meta: Mapping[str, Any] | None = None) -> Path:
    document = {"kind": kind, **provenance(store_meta), **payload}
    return atomic_write_text(path, json.dumps(_jsonable(document), indent=2) + "\n")


def write_records_csv(path: str | os.PathLike, records: Iterable[Mapping[str, Any]]) -> Path:
    path = Path(path)
    frame = pd.DataFrame(list(records))
    return atomic_write_text(path, frame.to_csv(index=False))
