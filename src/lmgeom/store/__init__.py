"""Store stage: the on-disk representation store, its resumable writer and lazy reader.

`extract` and `write_store_from_arrays` load the encoder stack (torch) on first use only.
"""

from __future__ import annotations

from typing import Any

from lmgeom.store.reader import RepresentationStore
from lmgeom.store.writer import StoreExistsError, StoreWriter

__all__ = ["RepresentationStore", "StoreExistsError", "StoreWriter", "extract", "write_store_from_arrays"]


def __getattr__(name: str) -> Any:
    if name in ("extract", "write_store_from_arrays"):
        import importlib

        return getattr(importlib.import_module("lmgeom.store.extraction"), name)
    raise AttributeError(f"module 'lmgeom.store' has no attribute {name!r}")
