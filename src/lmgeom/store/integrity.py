"""A complete store's files checked against what its metadata records.

On every open (cheap: a listing of each layer's folder, the tables' Parquet footers and the
vocabulary's digest): each chunk file a layer's rows lie in exists and has its size (a raw chunk
file is exactly chunk_rows x dim x itemsize bytes in the Zarr 3 format, the last one padded), and
the tables have the sizes `meta.json` records and the row counts of its `n_tokens`, `n_sentences`
and `n_vocab`. Zarr reads a missing chunk as zeros and a short one as a reshape error, so without
this a deleted file would be analysed as zero vectors.

On demand (`verify_store`, `lmgeom verify STORE`): every chunk file's and table's CRC32C against
those recorded when the store was written: chunk checksums in `checksums.json` (its own in
`meta.json`), the tables' sizes and checksums in `meta.json`'s `integrity` entry. CRC32C (Zarr's own
checksum, `google-crc32c`, which Zarr requires) detects every burst of up to 32 damaged bits and
misses other damage with odds of 2^-32, at about 20 GB/s a core (measured): a damage check, not a seal (whoever
can rewrite a chunk can rewrite checksums.json).

Every path read from a store's metadata (a shard part, a checksummed file) must lie inside the
store (`inside`): an absolute path, a URL or a `..` path is refused.
"""

from __future__ import annotations

import itertools
import math
import os
import posixpath
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import PureWindowsPath
from typing import Any, Iterable, Iterator, Mapping

import google_crc32c
import numpy as np
import pyarrow.parquet as pq
import zarr
from zarr.codecs import BytesCodec

from lmgeom.errors import InputError
from lmgeom.store import layout
from lmgeom.store.location import Location

DIGEST = "crc32c"
_TABLE_COUNTS = ((layout.TOKENS, "n_tokens"), (layout.SENTENCES, "n_sentences"), (layout.VOCAB, "n_vocab"))
_BLOCK = 1 << 22


def reextract(meta: Mapping[str, Any]) -> str:
    """How to get an intact store again, naming what this one was extracted from."""
    what = ", ".join(f"{label} {meta[key]}" for label, key in (("model", "model_id"), ("corpus", "corpus_name"))
                     if meta.get(key) is not None)
    return f"re-extract it: re-run the `lmgeom extract` command that wrote it{f' ({what})' if what else ''} with `overwrite=True`"


class CorruptStore(InputError):
    """A store file missing, damaged or not the store's: names the file (`problem`) and how to re-extract."""

    def __init__(self, store: Location, problem: str, meta: Mapping[str, Any]) -> None:
        super().__init__(f"corrupt store {store}: {problem}", fix=reextract(meta), param="overwrite")
        self.problem = problem


def inside(store: Location, relative: Any, *, what: str, meta: Mapping[str, Any]) -> str:
    """`relative`, a path read from the store's metadata, normalised; refused unless it lies inside the store."""
    if isinstance(relative, str) and relative and "://" not in relative and "\\" not in relative:
        normal = posixpath.normpath(relative)
        if not (posixpath.isabs(normal) or PureWindowsPath(relative).drive or normal in (".", "..")
                or normal.startswith("../")):
            return normal
    raise CorruptStore(store, f"{what} {relative!r} does not lie inside the store (a store's metadata names only "
                              "paths below its folder, never an absolute path, a URL or '..')", meta)


def chunk_files(array: zarr.Array, folder: str) -> list[tuple[str, int | None]]:
    """The chunk files holding the array's elements (paths below the store, the array at `folder`),
    each with its size when chunks are stored raw (None when they are encoded otherwise)."""
    metadata = array.metadata
    stored = array.shards or array.chunks  # a file per shard when the array is sharded (lmgeom's never are)
    grid = [range(math.ceil(size / chunk)) for size, chunk in zip(array.shape, stored)]
    codecs = tuple(getattr(metadata, "codecs", None) or ())  # Zarr 2 metadata has none: presence checked only
    raw = bool(codecs) and all(isinstance(codec, BytesCodec) for codec in codecs)
    size = math.prod(stored) * array.dtype.itemsize if raw else None
    return [(f"{folder}/{metadata.encode_chunk_key(index)}", size) for index in itertools.product(*grid)]


def chunk_problems(store: Location, files: Mapping[str, int], array: zarr.Array, folder: str, *,
                   layer: int) -> Iterator[tuple[str, str]]:
    """(path, problem) for each chunk file of a layer's array that is missing or not its size."""
    for path, size in chunk_files(array, folder):
        found = files.get(path)
        if found is None:
            yield path, f"layer {layer}: chunk file {store.child(path)} is missing (Zarr would read its rows as zeros)"
        elif size is not None and found != size:
            yield path, (f"layer {layer}: chunk file {store.child(path)} is {found:,} bytes, not {size:,} "
                         "(truncated or damaged)")


def table_problems(store: Location, meta: Mapping[str, Any], files: Mapping[str, int]) -> Iterator[tuple[str, str]]:
    """(name, problem) for each table that is missing, is not the size meta.json records, has other
    row counts than meta.json's, or (the vocabulary, small) has another digest."""
    integrity = meta.get("integrity")
    recorded = integrity.get("tables", {}) if isinstance(integrity, dict) else {}
    for name, count in _TABLE_COUNTS:
        if name not in files:
            yield name, f"{name} is missing"
            continue
        expected = recorded.get(name, {})
        if "size" in expected and files[name] != expected["size"]:
            yield name, (f"{store.child(name)} is {files[name]:,} bytes, but meta.json records {expected['size']:,}: "
                         "it is not this store's table (copied from another store?) or it is damaged")
            continue
        try:
            with store.fs.open(store.path(name), "rb") as handle:
                rows = pq.read_metadata(handle).num_rows
        except (OSError, ValueError) as error:
            yield name, f"{store.child(name)} cannot be read as Parquet ({error})"
            continue
        if count in meta and rows != int(meta[count]):
            yield name, (f"{store.child(name)} holds {rows:,} rows, but meta.json records {count} = {int(meta[count]):,}: "
                         "it is not this store's table (copied from another store?)")
            continue
        if name == layout.VOCAB and "digest" in expected and file_digest(store, name) != expected["digest"]:
            yield name, (f"{store.child(name)} differs from the vocabulary this store was written with ({DIGEST} "
                         "mismatch): it is not this store's table (copied from another store?) or it is damaged")


def checksum(data: np.ndarray) -> str:
    """The CRC32C of an array's bytes in C order, as 8 hex digits (no copy of a C-contiguous array)."""
    return f"{google_crc32c.value(np.ascontiguousarray(data).reshape(-1).view(np.uint8)):08x}"


def file_digest(store: Location, path: str) -> str:
    """The CRC32C of the file at `path` below the store, read in blocks."""
    crc = 0
    with store.fs.open(store.path(path), "rb") as handle:
        for block in iter(lambda: handle.read(_BLOCK), b""):
            crc = google_crc32c.extend(crc, block)
    return f"{crc:08x}"


def digests(store: Location, paths: Iterable[str]) -> dict[str, str]:
    """{path: CRC32C} of files below the store, read by a few threads (object stores answer slowly)."""
    paths = list(paths)
    with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1))) as pool:
        return dict(zip(paths, pool.map(lambda path: file_digest(store, path), paths)))


def record(store: Location, chunks: Mapping[str, str]) -> dict[str, Any]:
    """Write `checksums.json` (the chunk files' CRC32C) and return meta.json's `integrity` entry:
    the checksum's name, the tables' sizes and checksums, and checksums.json's checksum."""
    store.write_json(dict(sorted(chunks.items())), layout.CHECKSUMS)
    names = [name for name, _ in _TABLE_COUNTS]
    sizes = {name: int(store.fs.size(store.path(name))) for name in names}
    table_digests = digests(store, names)
    return {
        "algorithm": DIGEST,
        "tables": {name: {"size": sizes[name], "digest": table_digests[name]} for name in names},
        "checksums": file_digest(store, layout.CHECKSUMS),
    }


@dataclass
class Verification:
    """What `verify_store` found: `problems` has one line per damaged or missing file."""

    store: str
    checksums: bool  # whether the store records checksums (stores written without them are checked for sizes only)
    checked: int = 0  # files whose digest was compared
    problems: list[str] = field(default_factory=list)
    advice: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_store(path: str | os.PathLike[str] | Location) -> Verification:
    """Recompute every recorded digest and compare; also every check an open makes (each chunk file
    present at its size, the tables against meta.json), reporting every problem, not the first."""
    location = Location.of(path)
    if not location.exists(layout.META):
        raise FileNotFoundError(f"{location} is not an lmgeom store (no {layout.META}); create one with `lmgeom extract`")
    meta = location.read_json(layout.META)
    if not meta.get("complete"):
        raise InputError(f"{location} is an unfinished extraction; re-run the same `lmgeom extract` command to finish it")
    integrity = meta.get("integrity")
    result = Verification(location.url, checksums=isinstance(integrity, dict), advice=reextract(meta))
    files = location.files()
    found: dict[str, str] = {}  # path -> its first problem
    for name, problem in table_problems(location, meta, files):
        found.setdefault(name, problem)
    for layer in layout.stored_layers(meta):
        try:
            arrays = layer_arrays(location, meta, layer)
        except CorruptStore as error:
            found.setdefault(f"{layout.LAYERS}/{layer}", error.problem)
            continue
        for folder, array in arrays:
            for chunk, problem in chunk_problems(location, files, array, folder, layer=layer):
                found.setdefault(chunk, problem)
    if isinstance(integrity, dict):
        recorded = _recorded_digests(location, meta, files, found)
        present = [name for name in recorded if name in files and name not in found]
        for name in recorded:
            if name not in files:
                found.setdefault(name, f"{location.child(name)} is missing")
        for name, digest in digests(location, present).items():
            if digest != recorded[name]:
                found[name] = f"{location.child(name)} is damaged (its {DIGEST} differs from the one recorded)"
        result.checked = len(present)
    result.problems = list(found.values())
    return result


def layer_arrays(location: Location, meta: Mapping[str, Any], layer: int) -> list[tuple[str, zarr.Array]]:
    """(folder below the store, array) of each array holding layer `layer`: one, or one per shard part."""
    if "shards" in meta:
        parts = [inside(location, entry["part"], what="shard part", meta=meta) for entry in meta["shards"]]
        folders = [posixpath.join(layout.SHARDS, part, layout.LAYERS, str(layer)) for part in parts]
    else:
        folders = [posixpath.join(layout.LAYERS, str(layer))]
    arrays = []
    for folder in folders:
        try:
            arrays.append((folder, location.open_array(*folder.split("/"))))
        except Exception as error:  # zarr raises several types for a missing or broken array
            raise CorruptStore(location, f"layer {layer} ({location.child(folder)}) cannot be opened ({error})", meta) from None
    return arrays


def open_checked_layer(location: Location, meta: Mapping[str, Any], layer: int) -> list[zarr.Array]:
    """The arrays of layer `layer` (as `layer_arrays`), refused when a chunk file is missing or not its
    size: one listing of each array's folder, no read of a chunk."""
    arrays = layer_arrays(location, meta, layer)
    for folder, array in arrays:
        files = {f"{folder}/{name}": size for name, size in location.child(*folder.split("/")).files().items()}
        for _, problem in chunk_problems(location, files, array, folder, layer=layer):
            raise CorruptStore(location, problem, meta)
    return [array for _, array in arrays]


def _recorded_digests(location: Location, meta: Mapping[str, Any], files: Mapping[str, int],
                      found: dict[str, str]) -> dict[str, str]:
    """{path: digest} of every file the store records a digest of (checksums.json's own digest checked first)."""
    integrity = meta["integrity"]
    recorded = {inside(location, name, what="checksummed file", meta=meta): str(entry["digest"])
                for name, entry in integrity.get("tables", {}).items()}
    if layout.CHECKSUMS not in files:
        found[layout.CHECKSUMS] = f"{location.child(layout.CHECKSUMS)} is missing: the chunk files cannot be verified"
        return recorded
    if file_digest(location, layout.CHECKSUMS) != integrity.get("checksums"):
        found[layout.CHECKSUMS] = (f"{location.child(layout.CHECKSUMS)} is damaged (its {DIGEST} differs from the one "
                                   "meta.json records): the chunk files cannot be verified")
        return recorded
    chunks = location.read_json(layout.CHECKSUMS)
    return {**recorded, **{inside(location, name, what="checksummed file", meta=meta): str(digest)
                           for name, digest in chunks.items()}}
