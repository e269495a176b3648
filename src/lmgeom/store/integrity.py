"""A complete store's files checked against what its metadata records.

On every open (cheap: meta.json and its digest, each layer's zarr.json, a listing of each layer's
folder, the tables' Parquet footers and the vocabulary's digest): meta.json against the CRC32C in
`meta.json.crc32c`; meta.json's numbers against each other and against the layer arrays the store
holds (`layout_problems`: `n_layers`, `dim`, `stored_layers` as its settings record them, every stored
layer in range, no layer array that `stored_layers` leaves out); each layer's zarr.json against its
CRC32C in `checksums.json` (its own in meta.json), its data type, width and codecs against meta.json's
(`array_problem`); each chunk file a layer's rows lie in exists and has its size (a raw chunk file is
exactly chunk_rows x dim x itemsize bytes in the Zarr 3 format, the last one padded) and a recorded
checksum; the tables have the sizes `meta.json` records and the row counts of its `n_tokens`,
`n_sentences` and `n_vocab`. Zarr reads a missing chunk as zeros and a short one as a reshape error, so
without this a deleted file would be analysed as zero vectors.

On every read: each chunk file's bytes, as Zarr reads them (once: the layer's arrays are opened on a
Zarr store that checks what it hands on, `VerifiedStore`), and each table's bytes (`read_table`)
against their recorded CRC32C, before they are decoded. A mismatch is a `CorruptStore` naming the file.
The check is a CRC32C pass over bytes just read, about 0.1 ms of CPU a MB (docs/performance.md), so it
is made on every read, with nothing cached: a file changed since it was last read is caught. A
mismatch in a store rewritten since it was opened (another generation) says so instead (`rewritten`).

On demand (`verify_store`, `lmgeom verify STORE`): every file the store records a CRC32C of (chunk files
and zarr.json in `checksums.json`, the tables in meta.json's `integrity` entry, meta.json in
`meta.json.crc32c`), recomputed, and every check an open makes, reporting every problem. CRC32C (Zarr's
own checksum, `google-crc32c`, which Zarr requires) detects every burst of up to 32 damaged bits and
misses other damage with odds of 2^-32, at 10-20 GB/s a core (measured): a damage check, not a seal
(whoever can rewrite a chunk can rewrite checksums.json).

A store written before meta.json.crc32c and the zarr.json digests were recorded (its `integrity` has
no `meta_digest`) opens with an `UnverifiedStoreWarning`, once a process: its chunk files and tables
are still checked on every read (where it records their checksums), its metadata only against itself.

Every path read from a store's metadata (a shard part, a checksummed file) must lie inside the
store (`inside`): an absolute path, a URL or a `..` path is refused.
"""

from __future__ import annotations

import io
import itertools
import json
import math
import os
import posixpath
import warnings
from collections.abc import AsyncGenerator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import PureWindowsPath
from typing import Any, Iterable, Iterator, Mapping, Sequence

import google_crc32c
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import zarr
from zarr.abc.store import ByteRequest, Store
from zarr.codecs import BytesCodec, ZstdCodec
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import WrapperStore

from lmgeom.errors import InputError
from lmgeom.store import layout
from lmgeom.store.location import Location
from lmgeom.sitespec import DEFAULT_SITE

DIGEST = "crc32c"
ZARR_JSON = "zarr.json"
_TABLE_COUNTS = ((layout.TOKENS, "n_tokens"), (layout.SENTENCES, "n_sentences"), (layout.VOCAB, "n_vocab"))
_BLOCK = 1 << 22


def reextract(meta: Mapping[str, Any]) -> str:
    """How to get an intact store again, naming what this one was extracted from."""
    what = ", ".join(f"{label} {meta[key]}" for label, key in (("model", "model_id"), ("corpus", "corpus_name"))
                     if meta.get(key) is not None)
    return f"re-extract it: re-run the `lmgeom extract` command that wrote it{f' ({what})' if what else ''} with `overwrite=True`"


class CorruptStore(InputError):
    """A store file missing, damaged or not the store's: names the file (`problem`; `path`, below the
    store, when it is one file) and how to re-extract."""

    def __init__(self, store: Location, problem: str, meta: Mapping[str, Any], *, path: str | None = None) -> None:
        super().__init__(f"corrupt store {store}: {problem}", fix=reextract(meta), param="overwrite")
        self.problem = problem
        self.path = path


def rewritten(store: Location, meta: Mapping[str, Any]) -> InputError | None:
    """The error for a store that is no longer the one opened (`meta`): a writer created it anew since
    (another `generation` in meta.json, as `--overwrite` writes), or it is no longer complete; None
    while it is. Whatever was read from it before may then mix two stores."""
    try:
        now = store.read_json(layout.META) if store.exists(layout.META) else {"generation": "none (removed)"}
    except ValueError:
        now = {"generation": "none (unreadable)"}
    before, after = meta.get("generation"), now.get("generation")
    if after == before and now.get("complete"):
        return None
    change = f"generation {before} → {after}" if after != before else f"generation {before}, now incomplete"
    return InputError(f"{store.url} was rewritten while it was being read ({change}); re-run the command")


def mismatch(store: Location, meta: Mapping[str, Any], problem: str, path: str) -> InputError:
    """The error for a file read from the store that is not what it recorded: the store rewritten since
    it was opened (`rewritten`), else a `CorruptStore` naming the file."""
    return rewritten(store, meta) or CorruptStore(store, problem, meta, path=path)


class UnverifiedStoreWarning(UserWarning):
    """A store written before its metadata (meta.json, each layer's zarr.json) was checksummed."""


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
                   layer: int | str, recorded: Mapping[str, str] | None = None) -> Iterator[tuple[str, str]]:
    """(path, problem) for each chunk file of a layer's array that is missing, not its size, or (when
    the store records checksums: `recorded`) without a recorded checksum."""
    for path, size in chunk_files(array, folder):
        found = files.get(path)
        if found is None:
            yield path, f"layer {layer}: chunk file {store.child(path)} is missing (Zarr would read its rows as zeros)"
        elif size is not None and found != size:
            yield path, (f"layer {layer}: chunk file {store.child(path)} is {found:,} bytes, not {size:,} "
                         "(truncated or damaged)")
        elif recorded is not None and path not in recorded:
            yield path, (f"layer {layer}: chunk file {store.child(path)} has no checksum in {layout.CHECKSUMS}: it is "
                         "not one this store was written with (its zarr.json changed?) or checksums.json is damaged")


def table_problems(store: Location, meta: Mapping[str, Any], files: Mapping[str, int]) -> Iterator[tuple[str, str]]:
    """(name, problem) for each table that is missing, is not the size meta.json records, has other
    row counts than meta.json's, or (the vocabulary, small) has another digest."""
    recorded = _recorded_tables(meta)
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


def _recorded_tables(meta: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    integrity = meta.get("integrity")
    tables = integrity.get("tables") if isinstance(integrity, dict) else None
    return tables if isinstance(tables, dict) else {}


def read_table(store: Location, meta: Mapping[str, Any], name: str, columns: Sequence[str] | None = None) -> pd.DataFrame:
    """The table `name` (only `columns`, when given), its bytes read once and checked against the
    CRC32C meta.json records (where it records one) before they are parsed."""
    data = store.read_bytes(name)
    expected = _recorded_tables(meta).get(name, {}).get("digest")
    if expected is not None and (found := crc32c(data)) != expected:
        raise mismatch(store, meta, f"{store.child(name)} is damaged or not this store's: its {DIGEST} {found} is not "
                                    f"the {expected} meta.json records", name)
    try:
        return pd.read_parquet(io.BytesIO(data), columns=None if columns is None else list(columns))
    except (pa.ArrowException, OSError) as error:  # a damaged page in a table recorded without a digest
        raise CorruptStore(store, f"{name} cannot be read ({type(error).__name__}: {error})", meta) from None


def crc32c(data: Any) -> str:
    """The CRC32C of a bytes-like object (bytes, a C-contiguous uint8 array), as 8 hex digits."""
    return f"{google_crc32c.value(data):08x}"


def checksum(data: np.ndarray) -> str:
    """The CRC32C of an array's bytes in C order, as 8 hex digits (no copy of a C-contiguous array)."""
    return crc32c(np.ascontiguousarray(data).reshape(-1).view(np.uint8))


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


def record(store: Location, files: Mapping[str, str]) -> dict[str, Any]:
    """Write `checksums.json` (the CRC32C of the chunk files and the layers' zarr.json) and return
    meta.json's `integrity` entry: the checksum's name, the tables' sizes and checksums,
    checksums.json's checksum, and where meta.json's own lies (`write_meta` writes it)."""
    store.write_json(dict(sorted(files.items())), layout.CHECKSUMS)
    names = [name for name, _ in _TABLE_COUNTS]
    sizes = {name: int(store.fs.size(store.path(name))) for name in names}
    table_digests = digests(store, names)
    return {
        "algorithm": DIGEST,
        "tables": {name: {"size": sizes[name], "digest": table_digests[name]} for name in names},
        "checksums": file_digest(store, layout.CHECKSUMS),
        "meta_digest": layout.META_DIGEST,
    }


def layer_metadata_files(layers: Iterable[int]) -> list[str]:
    """The zarr.json of each of `layers`' arrays, below a store (or a shard part)."""
    return [f"{layout.LAYERS}/{layer}/{ZARR_JSON}" for layer in layers]


# ---- meta.json ------------------------------------------------------------------------------------


def write_meta(store: Location, meta: Mapping[str, Any]) -> None:
    """Write meta.json; a complete one with its CRC32C in meta.json.crc32c, written first: a complete
    meta.json is never without it (a crash in between leaves the incomplete meta.json, which an
    extraction resumes and no reader checks)."""
    data = (json.dumps(meta, indent=2) + "\n").encode("utf-8")
    if meta.get("complete"):
        store.write_bytes(f"{crc32c(data)}\n".encode("ascii"), layout.META_DIGEST)
    store.write_bytes(data, layout.META)


def records_metadata_digests(meta: Mapping[str, Any]) -> bool:
    """Whether the store records meta.json's digest and each layer's zarr.json's (stores written since)."""
    integrity = meta.get("integrity")
    return isinstance(integrity, dict) and integrity.get("meta_digest") == layout.META_DIGEST


def meta_problem(store: Location, meta: Mapping[str, Any], data: bytes) -> str | None:
    """What is wrong with a complete meta.json (its bytes `data`) against meta.json.crc32c; None when it
    matches or the store predates the digest."""
    try:
        recorded = store.read_bytes(layout.META_DIGEST).decode("ascii", errors="replace").strip()
    except FileNotFoundError:
        if records_metadata_digests(meta):
            return f"{store.child(layout.META_DIGEST)} is missing: {store.child(layout.META)} cannot be checked"
        return None
    found = crc32c(data)
    if found != recorded:
        return (f"{store.child(layout.META)} is damaged or was edited: its {DIGEST} {found} is not the {recorded!r} "
                f"{layout.META_DIGEST} records")
    return None


_warned: set[str] = set()


def read_meta(store: Location) -> dict[str, Any]:
    """meta.json, read once; a complete one checked against its digest (`meta_problem`), or, written
    before digests of the metadata were recorded, opened with an `UnverifiedStoreWarning` (once a process)."""
    data, meta = store.read_json_bytes(layout.META)
    if not meta.get("complete"):
        return meta
    if (problem := meta_problem(store, meta, data)) is not None:
        raise CorruptStore(store, problem, meta, path=layout.META)
    if not records_metadata_digests(meta) and store.url not in _warned:
        _warned.add(store.url)
        checked = "its chunk files and tables are checked as they are read" if isinstance(meta.get("integrity"), dict) \
            else "it records no checksums at all, so nothing read from it is checked"
        warnings.warn(UnverifiedStoreWarning(
            f"{store} was written before lmgeom recorded checksums of meta.json and the layers' zarr.json, so an edit "
            f"or damage there is caught only where it contradicts the rest of the store ({checked}); check it with "
            f"`lmgeom verify {store}`, or {reextract(meta)} to record them"), stacklevel=3)
    return meta


def layout_problems(store: Location, meta: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(path, problem) for each way meta.json's numbers disagree with each other or with the layer
    arrays the store holds: `n_layers`, `dim`, `dtype` and `stored_layers` against the settings it
    records, every stored layer a distinct one of the model's 0..n_layers - 1, and no layer array in
    the store that `stored_layers` does not list (one folder listing a part)."""
    where = store.child(layout.META)
    try:
        n_layers, dim, n_tokens = (int(meta[key]) for key in ("n_layers", "dim", "n_tokens"))
        layers = layout.stored_layers(meta)
    except (KeyError, TypeError, ValueError) as error:
        yield layout.META, f"{where} lacks a valid n_layers, dim, n_tokens or stored_layers ({type(error).__name__}: {error})"
        return
    settings = meta.get("settings")
    for key in ("n_layers", "dim", "dtype", "stored_layers"):
        if isinstance(settings, dict) and key in settings and settings[key] != meta.get(key):
            yield layout.META, (f"{where} records {key} = {meta.get(key)!r}, but its settings {key} = {settings[key]!r} "
                                "(edited or damaged)")
    if n_layers < 1 or dim < 1 or n_tokens < 0:
        yield layout.META, f"{where} records n_layers = {n_layers}, dim = {dim}, n_tokens = {n_tokens}"
    if not layers or layers != sorted(set(layers)) or not 0 <= layers[0] <= layers[-1] < n_layers:
        yield layout.META, (f"{where} records stored_layers {layers}, not distinct layers among the model's "
                            f"0..{n_layers - 1} (n_layers = {n_layers})")
    sites = layout.stored_sites(meta)
    for site, entry in sites.items():
        site_layers = [int(layer) for layer in entry.get("layers", [])]
        if site != DEFAULT_SITE and (not site_layers or not set(site_layers) <= set(layers) - {0}):
            yield layout.META, (f"{where} records the layers {site_layers} for site {site}, not stored layers from 1 "
                                f"(stored_layers {layers})")
        listed = {str(layer) for layer in site_layers}
        what = "the layers meta.json's stored_layers" if site == DEFAULT_SITE else f"the layers meta.json's sites records for {site}"
        try:
            folders = layers_folders(store, meta, site)
        except CorruptStore as error:
            yield error.path or layout.META, error.problem
            return
        for folder in folders:
            for name in sorted(set(store.listdir(*folder.split("/"))) - listed):
                yield f"{folder}/{name}", (f"{store.child(folder, name)} is not among {what} {site_layers} lists: meta.json "
                                           "was edited or damaged, or the folder is not the store's")
    recorded_sites = {str(entry.get("folder", "")).split("/", 1)[-1] for site, entry in sites.items() if site != DEFAULT_SITE}
    if store.exists(layout.SITES):
        for name in sorted(set(store.listdir(layout.SITES)) - recorded_sites):
            yield f"{layout.SITES}/{name}", (f"{store.child(layout.SITES, name)} is not among the sites meta.json records "
                                             f"({', '.join(sites)}): meta.json was edited or damaged, or the folder is not the store's")


def array_problem(store: Location, meta: Mapping[str, Any], array: zarr.Array, folder: str, *, layer: int | str) -> str | None:
    """What in a layer's array metadata (its zarr.json) disagrees with meta.json or with how lmgeom
    stores layers: the data type, the row width, and the codecs (raw little-endian bytes, optionally
    zstd-compressed: `layout.COMPRESSORS`); None when nothing does."""
    where = f"layer {layer}: {store.child(folder, ZARR_JSON)}"
    if "dtype" in meta and str(array.dtype) != meta["dtype"]:
        return f"{where} gives data type {array.dtype}, but meta.json {meta['dtype']}"
    if len(array.shape) != 2 or "dim" in meta and (array.shape[1], array.chunks[1]) != (int(meta["dim"]),) * 2:
        return f"{where} gives shape {array.shape} in chunks of {array.chunks}, not rows of meta.json's dim = {meta.get('dim')}"
    codecs = getattr(array.metadata, "codecs", None)  # Zarr 2 metadata has none
    if codecs is not None and not (codecs and codecs[0] == BytesCodec(endian="little")
                                   and all(isinstance(codec, ZstdCodec) for codec in codecs[1:])):
        names = ", ".join(type(codec).__name__ for codec in codecs)
        return f"{where} gives the codecs {names or 'none'}; a store's layers are little-endian bytes, optionally zstd-compressed"
    return None


# ---- reading layers -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Manifest:
    """The CRC32C checksums.json records, by path below the store (empty for a store written without)."""

    files: Mapping[str, str]
    metadata: bool = False  # whether each layer's zarr.json is among them (`records_metadata_digests`)

    def below(self, folder: str) -> dict[str, str]:
        """The digests of the files below `folder`, by their path below it."""
        prefix = folder.rstrip("/") + "/"
        return {path[len(prefix):]: digest for path, digest in self.files.items() if path.startswith(prefix)}


def load_manifest(store: Location, meta: Mapping[str, Any]) -> Manifest:
    """checksums.json, checked against the digest meta.json records of it (a store written without
    checksums has an empty manifest)."""
    integrity = meta.get("integrity")
    if not isinstance(integrity, dict):
        return Manifest({})
    try:
        data = store.read_bytes(layout.CHECKSUMS)
    except FileNotFoundError:
        raise CorruptStore(store, f"{store.child(layout.CHECKSUMS)} is missing: the chunk files cannot be checked",
                           meta, path=layout.CHECKSUMS) from None
    if crc32c(data) != integrity.get("checksums"):
        raise CorruptStore(store, f"{store.child(layout.CHECKSUMS)} is damaged (its {DIGEST} differs from the one "
                                  "meta.json records): the chunk files cannot be checked", meta, path=layout.CHECKSUMS)
    recorded = store.parse_json(data, layout.CHECKSUMS)
    return Manifest({inside(store, name, what="checksummed file", meta=meta): str(digest) for name, digest in recorded.items()},
                    metadata=records_metadata_digests(meta))


class VerifiedStore(WrapperStore[Store]):
    """A Zarr store that hands on a file (a chunk file, zarr.json) only once its bytes, read once, match
    the CRC32C recorded for it (`digests`, by key below the array); files without one pass unchecked.
    A recorded file that is missing is refused too (Zarr would read a missing chunk as zeros)."""

    def __init__(self, store: Store, *, location: Location, folder: str, digests: Mapping[str, str],
                 meta: Mapping[str, Any], layer: int | str) -> None:
        super().__init__(store)
        self._where = (location, folder, digests, meta, layer)

    def _with_store(self, store: Store) -> VerifiedStore:
        location, folder, digests, meta, layer = self._where
        return VerifiedStore(store, location=location, folder=folder, digests=digests, meta=meta, layer=layer)

    async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None) -> Buffer | None:
        location, folder, digests, meta, layer = self._where
        expected = digests.get(key)
        if expected is None:
            return await self._store.get(key, prototype, byte_range)
        buffer = await self._store.get(key, prototype)
        path = f"{folder}/{key}"
        what = f"{location.child(path)}" if key == ZARR_JSON else f"chunk file {location.child(path)}"
        if buffer is None:
            raise mismatch(location, meta, f"layer {layer}: {what} is missing", path)
        found = crc32c(buffer.as_numpy_array())
        if found != expected:
            raise mismatch(location, meta, f"layer {layer}: {what} is damaged or was edited: its {DIGEST} {found} is not "
                                           f"the {expected} {layout.CHECKSUMS} records", path)
        return buffer if byte_range is None else await self._store.get(key, prototype, byte_range)

    async def get_partial_values(self, prototype: BufferPrototype,
                                 key_ranges: Iterable[tuple[str, ByteRequest | None]]) -> list[Buffer | None]:
        return [await self.get(key, prototype, byte_range) for key, byte_range in key_ranges]

    async def _get_many(self, requests: Iterable[tuple[str, BufferPrototype, ByteRequest | None]]
                        ) -> AsyncGenerator[tuple[str, Buffer | None], None]:
        for key, prototype, byte_range in requests:
            yield key, await self.get(key, prototype, byte_range)


def layers_folders(store: Location, meta: Mapping[str, Any], site: str = DEFAULT_SITE) -> list[str]:
    """The folders (below the store) holding a site's layer arrays: `layers` (`resid_post`), the site's
    recorded folder, or each shard part's `layers` (a store written in shards holds `resid_post` only)."""
    if "shards" not in meta:
        if site == DEFAULT_SITE:
            return [layout.LAYERS]
        folder = layout.stored_sites(meta)[site].get("folder")
        return [inside(store, folder, what=f"folder of site {site}", meta=meta)]
    parts = [inside(store, entry["part"], what="shard part", meta=meta) for entry in meta["shards"]]
    return [posixpath.join(layout.SHARDS, part, layout.LAYERS) for part in parts]


def layer_arrays(location: Location, meta: Mapping[str, Any], layer: int, manifest: Manifest,
                 site: str = DEFAULT_SITE) -> list[tuple[str, zarr.Array]]:
    """(folder below the store, array) of each array holding layer `layer` of `site`: one, or one per
    shard part, each opened on a `VerifiedStore` of the digests the store's `manifest` records: its
    zarr.json is checked as it is opened, its chunk files as they are read."""
    arrays = []
    label = layout.array_label(site, layer).removeprefix("layer ")
    for folder in (posixpath.join(layers, str(layer)) for layers in layers_folders(location, meta, site)):
        recorded = manifest.below(folder)
        if manifest.metadata and ZARR_JSON not in recorded:
            raise CorruptStore(location, f"layer {label}: {location.child(folder, ZARR_JSON)} has no checksum in "
                                         f"{layout.CHECKSUMS}", meta, path=f"{folder}/{ZARR_JSON}")
        zarr_store = VerifiedStore(location.zarr_store(*folder.split("/"), read_only=True), location=location,
                                   folder=folder, digests=recorded, meta=meta, layer=label)
        try:
            arrays.append((folder, zarr.open_array(zarr_store, mode="r")))
        except CorruptStore:
            raise
        except Exception as error:  # zarr raises several types for a missing or broken array
            raise CorruptStore(location, f"layer {label} ({location.child(folder)}) cannot be opened ({error})", meta,
                               path=f"{folder}/{ZARR_JSON}") from None
    return arrays


def open_checked_layer(location: Location, meta: Mapping[str, Any], layer: int, manifest: Manifest,
                       site: str = DEFAULT_SITE) -> list[zarr.Array]:
    """The arrays of layer `layer` of `site` (as `layer_arrays`, reading through the `manifest`'s
    checks), refused when their metadata disagrees with meta.json (`array_problem`) or a chunk file is
    missing, not its size, or without a recorded checksum: one listing of each array's folder, no read
    of a chunk."""
    arrays = layer_arrays(location, meta, layer, manifest, site)
    recorded = manifest.files if isinstance(meta.get("integrity"), dict) else None
    label = layout.array_label(site, layer).removeprefix("layer ")
    for folder, array in arrays:
        if (problem := array_problem(location, meta, array, folder, layer=label)) is not None:
            raise CorruptStore(location, problem, meta, path=f"{folder}/{ZARR_JSON}")
        files = {f"{folder}/{name}": size for name, size in location.child(*folder.split("/")).files().items()}
        for path, problem in chunk_problems(location, files, array, folder, layer=label, recorded=recorded):
            raise CorruptStore(location, problem, meta, path=path)
    return [array for _, array in arrays]


# ---- verify -----------------------------------------------------------------------------------------


@dataclass
class Verification:
    """What `verify_store` found: `problems` has one line per damaged or missing file."""

    store: str
    checksums: bool  # whether the store records checksums (stores written without them are checked for sizes only)
    metadata: bool = False  # whether it records those of meta.json and the layers' zarr.json (stores written since)
    checked: int = 0  # files whose digest was compared
    problems: list[str] = field(default_factory=list)
    advice: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems


def verify_store(path: str | os.PathLike[str] | Location) -> Verification:
    """Recompute every recorded digest and compare; also every check an open makes (meta.json against
    its digest and the layer arrays, each zarr.json, each chunk file present at its size, the tables
    against meta.json), reporting every problem, not the first."""
    location = Location.of(path)
    if not location.exists(layout.META):
        raise FileNotFoundError(f"{location} is not an lmgeom store (no {layout.META}); create one with `lmgeom extract`")
    data, meta = location.read_json_bytes(layout.META)
    if not meta.get("complete"):
        raise InputError(f"{location} is an unfinished extraction; re-run the same `lmgeom extract` command to finish it")
    integrity = meta.get("integrity")
    result = Verification(location.url, checksums=isinstance(integrity, dict), metadata=records_metadata_digests(meta),
                          advice=reextract(meta))
    files = location.files()
    found: dict[str, str] = {}  # path -> its first problem
    if (problem := meta_problem(location, meta, data)) is not None:
        found[layout.META] = problem
    for name, problem in itertools.chain(layout_problems(location, meta), table_problems(location, meta, files)):
        found.setdefault(name, problem)
    try:
        manifest = load_manifest(location, meta)
    except CorruptStore as error:
        found[layout.CHECKSUMS] = error.problem
        manifest = Manifest({})
    recorded_chunks = manifest.files if layout.CHECKSUMS not in found and result.checksums else None
    try:
        arrays_of_sites = layout.stored_arrays(meta)
    except (KeyError, TypeError, ValueError) as error:
        found.setdefault(layout.META, f"{location.child(layout.META)} records unreadable sites ({error})")
        arrays_of_sites = []
    for site, layer, site_folder in arrays_of_sites:
        label = layout.array_label(site, layer).removeprefix("layer ")
        try:
            arrays = layer_arrays(location, meta, layer, manifest, site)
        except CorruptStore as error:
            found.setdefault(error.path or site_folder, error.problem)
            continue
        for folder, array in arrays:
            if (problem := array_problem(location, meta, array, folder, layer=label)) is not None:
                found.setdefault(f"{folder}/{ZARR_JSON}", problem)
            for chunk, problem in chunk_problems(location, files, array, folder, layer=label, recorded=recorded_chunks):
                found.setdefault(chunk, problem)
    if result.checksums:
        recorded = {inside(location, name, what="checksummed file", meta=meta): str(entry["digest"])
                    for name, entry in _recorded_tables(meta).items()}
        recorded.update(manifest.files)
        for name in recorded:
            if name not in files:
                found.setdefault(name, f"{location.child(name)} is missing")
        present = [name for name in recorded if name in files and name not in found]
        for name, digest in digests(location, present).items():
            if digest != recorded[name]:
                found[name] = f"{location.child(name)} is damaged (its {DIGEST} differs from the one recorded)"
        result.checked = len(present) + (layout.META_DIGEST in files)  # meta.json's compared above (`meta_problem`)
    result.problems = list(found.values())
    return result
