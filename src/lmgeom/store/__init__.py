"""Store stage: the on-disk representation store, its resumable writer and lazy reader.

Extraction (corpus -> encoder -> store) is driven by `lmgeom.stages.extract`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lmgeom import _lazy as lazy

if TYPE_CHECKING:
    from lmgeom.store.arrays import write_store_from_arrays
    from lmgeom.store.integrity import CorruptStore, Verification, verify_store
    from lmgeom.store.lock import StoreLockedError
    from lmgeom.store.reader import RepresentationStore
    from lmgeom.store.writer import StoreExistsError, StoreWriter

# on first use: `lmgeom.store.layout` (file names, the layer-0 note) is read without zarr and pandas
_EXPORTS = {
    "write_store_from_arrays": "lmgeom.store.arrays",
    **dict.fromkeys(["CorruptStore", "Verification", "verify_store"], "lmgeom.store.integrity"),
    "StoreLockedError": "lmgeom.store.lock",
    "RepresentationStore": "lmgeom.store.reader",
    **dict.fromkeys(["StoreExistsError", "StoreWriter"], "lmgeom.store.writer"),
}


def __getattr__(name: str) -> Any:
    return lazy.load(__name__, _EXPORTS, name)


__all__ = list(_EXPORTS)
