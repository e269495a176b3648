"""Store stage: the on-disk representation store, its resumable writer and lazy reader.

Extraction (corpus -> encoder -> store) is driven by `lmgeom.runs.extract`.
"""

from __future__ import annotations

from lmgeom.store.arrays import write_store_from_arrays
from lmgeom.store.integrity import CorruptStore, Verification, verify_store
from lmgeom.store.reader import RepresentationStore
from lmgeom.store.writer import StoreExistsError, StoreWriter

__all__ = [
    "CorruptStore", "RepresentationStore", "StoreExistsError", "StoreWriter", "Verification", "verify_store",
    "write_store_from_arrays",
]
