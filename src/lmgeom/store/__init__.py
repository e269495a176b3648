"""Store stage: the on-disk representation store, its resumable writer and lazy reader."""

from lmgeom.store.extract import DEFAULT_CHUNK_SENTENCES, extract, write_store_from_arrays
from lmgeom.store.reader import RepresentationStore
from lmgeom.store.writer import StoreExistsError, StoreWriter

__all__ = ["DEFAULT_CHUNK_SENTENCES", "RepresentationStore", "StoreExistsError", "StoreWriter", "extract", "write_store_from_arrays"]
