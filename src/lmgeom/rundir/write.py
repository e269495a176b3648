"""Writing result files: all of a file or nothing (`write_bytes`), JSON documents with the fields
every result carries (`write_json`), tidy CSV tables and figures whose bytes depend on the figure alone."""

from __future__ import annotations

import hashlib
import json
import math
import tempfile
from io import BytesIO
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import pandas as pd

from lmgeom._version import __version__
from lmgeom.store.layout import LAYER_NOTE
from lmgeom.store.location import Location
from lmgeom.rundir.files import KINDS, SCHEMA_VERSION, Target, name_of

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


def header_fields(store_meta: Mapping[str, Any] | None = None, *, kind: str | None = None) -> dict[str, Any]:
    """The fields every result document carries (its schema version is that of `kind`)."""
    meta = dict(store_meta or {})
    spec = KINDS.get(kind) if kind is not None else None
    return {
        "schema_version": spec.schema_version if spec else SCHEMA_VERSION,
        "lmgeom_version": __version__,
        "model_id": meta.get("model_id"),
        "corpus_fingerprint": meta.get("corpus_fingerprint"),
        "layer_note": meta.get("layer_note") or LAYER_NOTE,
        # a control's store (`lmgeom.controlspec`): every document of it says so
        **({"control": meta["control"]} if meta.get("control") else {}),
    }


def digest(data: bytes) -> str:
    """The content hash a result document records for a companion file."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def records_csv(records: Iterable[Mapping[str, Any]]) -> bytes:
    """Tidy records as the bytes of a CSV table (what `write_records_csv` writes)."""
    return pd.DataFrame(list(records)).to_csv(index=False).encode("utf-8")


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
    document = jsonable({"kind": kind, **header_fields(store_meta, kind=kind), **payload})
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
