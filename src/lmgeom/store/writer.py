"""`StoreWriter`: chunked, atomically committed, resumable writing of a representation store."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import numpy as np
import pandas as pd
import zarr
from zarr.codecs import BytesCodec
from zarr.storage import LocalStore

from lmgeom.errors import InputError
from lmgeom._version import __version__
from lmgeom.corpus.corpus import Vocabulary
from lmgeom.atomic import atomic_write, atomic_write_text, is_temporary
from lmgeom.store import layout
from lmgeom.store.integrity import ZARR_JSON, checksum, chunk_files, digests, record, write_meta
from lmgeom.store.location import Location
from lmgeom.store.lock import HoldsLock, StoreLock, is_lock_file

if TYPE_CHECKING:
    from lmgeom.encoders.base import EncodedSentence


class StoreExistsError(InputError):
    """The output directory holds another run, or files that are not a store."""


Foreign = Callable[[Location], list[str]]
"""What, at the top of a store's folder, lmgeom did not write: `foreign_entries` (the store's own
names) or, from the stages, `lmgeom.rundir.foreign_entries` (also a run's result files)."""


def foreign_entries(location: Location) -> list[str]:
    """The names at the top of `location` that are not the store's (`layout.STORE_NAMES`, the
    writer's lock, an interrupted atomic write's temporary files), sorted."""
    return sorted(name for name in location.listdir()
                  if not (name in layout.STORE_NAMES or is_lock_file(name) or is_temporary(name)))


def claim_out(location: Location, *, overwrite: bool, foreign: Foreign = foreign_entries) -> StoreLock:
    """The lock on a writer's `--out` (`lmgeom.store.lock`), once what is there may be written: a
    folder holding anything but an lmgeom store is refused, with or without `overwrite`, before anything
    is written to it; with `overwrite`, a store there (complete or interrupted) is removed with what
    lmgeom wrote next to it under the lock, and refused, removing nothing, while the folder holds
    anything `foreign` names (the stages pass `lmgeom.rundir.foreign_entries`, which counts a
    run's results as lmgeom's)."""
    _require_claimable(location, overwrite=overwrite, foreign=foreign)
    lock = StoreLock.acquire(location)
    try:
        _require_claimable(location, overwrite=overwrite, foreign=foreign)  # again, now that no other writer can change it
        if overwrite and location.exists(layout.META):
            _remove_store(location, foreign)
    except BaseException:
        lock.release()
        raise
    return lock


def require_store_or_empty(location: Location) -> None:
    """Nothing but a store whose meta.json lmgeom wrote, or a writer's lock, may be at `location`."""
    entries = [name for name in location.listdir() if not is_lock_file(name)]
    if not entries or _holds_lmgeom_meta(location):
        return
    shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
    why = f"its {layout.META} is not one lmgeom wrote" if layout.META in entries else f"no {layout.META}"
    raise StoreExistsError(f"{location} is not empty and holds no lmgeom store ({why}): it holds {shown}; nothing "
                           "was changed there. Choose another `out` (a new or empty folder)", param="out")


def _require_claimable(location: Location, *, overwrite: bool, foreign: Foreign) -> None:
    """`require_store_or_empty`; and with `overwrite`, which would remove the store, nothing at
    `location` but what lmgeom wrote."""
    require_store_or_empty(location)
    if not overwrite or not location.exists(layout.META):
        return
    found = foreign(location)
    if found:
        shown = ", ".join(found[:10]) + (f" and {len(found) - 10} more" if len(found) > 10 else "")
        raise StoreExistsError(f"{location} holds files lmgeom did not write next to its store: {shown}; `overwrite=True` "
                               "removes only a store and a run's result files, so nothing was removed. Move them elsewhere "
                               "(or choose another `out`) and run again", param=("overwrite", "out"))


def _holds_lmgeom_meta(location: Location) -> bool:
    try:
        meta = json.loads(location.read_bytes(layout.META).decode("utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and "lmgeom_version" in meta


def _remove_store(location: Location, foreign: Foreign) -> None:
    """Remove the store at `location` whole, but for its lock. Its meta.json is first replaced by the
    meta of no run (readers find the store incomplete and of another generation; writers resume nothing
    from it) and removed last, so a removal cut short leaves a store that `--overwrite` removes."""
    location.write_json({"schema_version": layout.STORE_SCHEMA_VERSION, "lmgeom_version": __version__,
                         "generation": uuid.uuid4().hex, "complete": False, "settings": {}}, layout.META)
    keep = set(foreign(location))  # none, once `_require_claimable` passed: never a user's file
    for name in location.listdir():
        if name != layout.META and not is_lock_file(name) and name not in keep:
            location.remove(name)
    location.remove(layout.META)


class StoreWriter(HoldsLock):
    """Append chunks of encoded sentences; each `commit` is atomic, so a killed run resumes.

    `settings` are what makes two runs the same run (model, pooling, corpus fingerprint, chunking,
    dtype, ...): re-opening a directory with other settings is refused unless `overwrite`. The writer
    holds the store's lock (`claim_out`) until `finalize` or `close` (use it in a `with` block).
    `expected_rows` (an upper bound of the rows the store will hold, `layout.expected_rows`) fits the
    chunks of a small store (`layout.chunk_rows`); `settings["compressor"]`, when present, compresses
    the layers (`layout.compressors`, written through zarr), else they are stored raw.
    """

    def __init__(self, path: str | Path, *, settings: dict[str, Any], overwrite: bool = False,
                 expected_rows: int | None = None, foreign: Foreign = foreign_entries,
                 layer_note: str = layout.LAYER_NOTE) -> None:
        self.path = Path(path)
        self.settings = dict(settings)
        self.layer_note = layer_note  # what layer 0 and layer l are, in the encoder's words (not a setting)
        self.expected_rows = expected_rows
        if self.settings.get("dtype") not in layout.STORAGE_DTYPES:
            raise InputError(f"storage dtype must be one of {layout.STORAGE_DTYPES}, got {self.settings.get('dtype')!r}")
        layout.compressors(self.settings.get("compressor"))  # an unknown codec is refused before anything is written
        self.n_layers = int(self.settings["n_layers"])
        self.layers = layout.stored_layers(self.settings)
        self.settings["stored_layers"] = self.layers  # recorded always: every layer unless given
        # (site, layer, folder) of every array, in the order the encoder hands them out: the stored layers
        # of resid_post (in layers/), then each other capture site's (settings["sites"])
        self.slots = layout.stored_arrays(self.settings)
        self.dim = int(self.settings["dim"])
        self._hold(claim_out(Location.of(self.path), overwrite=overwrite, foreign=foreign), self._open)

    def _open(self) -> None:
        meta_path = self.path / layout.META
        if meta_path.exists():
            existing = layout.read_store_json(meta_path)
            stored = stored_settings(existing, self.settings)
            if stored != self.settings:
                raise StoreExistsError(settings_mismatch(self.path, stored, self.settings, complete=bool(existing.get("complete"))),
                                       param=("overwrite", "out"))
            self.complete = bool(existing.get("complete"))
            self.created = existing.get("created")
            self.generation = existing.get("generation") or uuid.uuid4().hex
        else:
            self.complete = False
            self.created = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            self.generation = uuid.uuid4().hex
            self._write_meta()
            for _, _, folder in self.slots:
                _create_layer_array(self.path / folder, rows=self.chunk_rows, dim=self.dim,
                                    dtype=self.settings["dtype"], compressor=self.settings.get("compressor"))
        self._recover()

    @property
    def chunk_rows(self) -> int:
        """Rows per zarr chunk of the layers this writer creates (`layout.chunk_rows`)."""
        return layout.chunk_rows(self.dim, self.expected_rows)

    @property
    def sentences_done(self) -> int:
        return self.progress["n_sentences"]

    def _recover(self) -> None:
        """Return to the last committed chunk: drop rows and parts written after it."""
        progress_path = self.path / layout.PROGRESS
        # the tables of the chunks this writer commits, kept for `finalize` (a few MB per million words)
        self._tables: dict[int, tuple[pd.DataFrame, pd.DataFrame]] = {}
        self._open_chunks: list[OpenChunk | None] = [None] * len(self.slots)
        # CRC32C of the chunk files this writer wrote whole, by stored layer and chunk index, for checksums.json
        self._checksums: list[dict[int, str]] = [{} for _ in self.slots]
        self.progress = layout.read_store_json(progress_path) if progress_path.exists() else {"chunks": 0, "n_sentences": 0, "n_tokens": 0}
        if self.complete:
            return
        self.arrays = []
        for site, layer, folder in self.slots:
            try:
                array = zarr.open_array(str(self.path / folder), mode="r+")
            except Exception as error:  # zarr raises several types for a missing or broken array
                raise InputError(f"corrupt store: {layout.array_label(site, layer)} of {self.path} cannot be opened ({error}); re-run with `overwrite=True`", param="overwrite") from None
            if array.shape[0] != self.progress["n_tokens"]:
                array.resize((self.progress["n_tokens"], self.dim))
            self.arrays.append(_without_empty_chunk_scan(array))
        for stale in self.path.rglob("*.partial"):
            stale.unlink()
        parts = self.path / layout.PARTS
        if parts.exists():
            for part in parts.glob("*.parquet"):
                if int(part.stem.rsplit("-", 1)[1]) >= self.progress["chunks"]:
                    part.unlink()

    def commit(self, encoded: Sequence[EncodedSentence], texts: Sequence[str]) -> None:
        """Append one chunk (rows to every layer, then its tables), then record it as committed."""
        with disk_space(self.path):
            self._commit(encoded, texts)

    def _commit(self, encoded: Sequence[EncodedSentence], texts: Sequence[str]) -> None:
        if self.complete:
            raise InputError(f"{self.path} is complete; nothing more can be appended")
        self.lock.require_held()
        first_sentence, first_row = self.progress["n_sentences"], self.progress["n_tokens"]
        n_rows = sum(len(e.words) for e in encoded)
        labels = [layout.array_label(site, layer).removeprefix("layer ") for site, layer, _ in self.slots]
        require_storable(encoded, self.settings["dtype"], first_sentence=first_sentence,
                         layers=self.layers if len(self.slots) == len(self.layers) else labels)
        n_vectors = encoded[0].vectors.shape[0] if encoded else len(self.slots)  # every layer, or the stored arrays
        blocks = stored_blocks(_chunk_rows(encoded, n_vectors, self.dim), [layer for _, layer, _ in self.slots], self.n_layers)
        for index, (label, array, block) in enumerate(zip(labels, self.arrays, blocks)):
            if not np.isfinite(block).all():
                bad = first_row + int(np.flatnonzero(~np.isfinite(block).all(axis=1))[0])
                raise InputError(f"layer {label}, row {bad}: the model produced NaN/inf; use `compute_dtype='float32'`", param="compute_dtype")
            array.resize((first_row + n_rows, self.dim))
            self._open_chunks[index] = _write_rows(array, first_row, block.astype(self.settings["dtype"], copy=False),
                                                   self._open_chunks[index], self._checksums[index])
        tokens = pd.DataFrame({
            "sentence_id": np.repeat(np.arange(first_sentence, first_sentence + len(encoded), dtype=np.int64),
                                     [len(e.words) for e in encoded]),
            "position": np.concatenate([np.arange(len(e.words), dtype=np.int32) for e in encoded]),
            "word": [w for e in encoded for w in e.words],
            "is_special": np.concatenate([e.is_special for e in encoded]),
            "n_pieces": np.concatenate([e.n_pieces for e in encoded]).astype(np.int16),
        })
        row_starts = first_row + np.concatenate([[0], np.cumsum([len(e.words) for e in encoded])[:-1]]).astype(np.int64)
        sentences = pd.DataFrame({
            "sentence_id": np.arange(first_sentence, first_sentence + len(encoded), dtype=np.int64),
            "text": list(texts),
            "n_words": [int((~e.is_special).sum()) for e in encoded],
            "n_tokens": [len(e.words) for e in encoded],
            "n_windows": [e.n_windows for e in encoded],
            "n_unaligned": [e.n_unaligned for e in encoded],
            "n_truncated": [e.n_truncated for e in encoded],
            "first_row": row_starts,
        })
        chunk = self.progress["chunks"]
        (self.path / layout.PARTS).mkdir(exist_ok=True)
        for kind, table in (("tokens", tokens), ("sentences", sentences)):
            _write_parquet_atomic(table, layout.part_path(self.path, kind, chunk))
        self._tables[chunk] = (tokens, sentences)
        self.progress = {"chunks": chunk + 1, "n_sentences": first_sentence + len(encoded), "n_tokens": first_row + n_rows}
        atomic_write_text(self.path / layout.PROGRESS, json.dumps(self.progress))

    def finalize(self, **extra_meta: Any) -> None:
        """Merge the chunk tables, build the vocabulary, mark the store complete, and release its lock."""
        with disk_space(self.path):
            self._finalize(**extra_meta)

    def _finalize(self, **extra_meta: Any) -> None:
        if self.complete:
            self.close()
            return
        self.lock.require_held()
        parts = [self._tables.get(c) or self._read_tables(c) for c in range(self.progress["chunks"])]
        tokens = pd.concat([part[0] for part in parts], ignore_index=True)
        sentences = pd.concat([part[1] for part in parts], ignore_index=True)
        vocab, counts = index_words(tokens, sentences)
        _write_parquet_atomic(tokens, self.path / layout.TOKENS)
        _write_parquet_atomic(sentences, self.path / layout.SENTENCES)
        _write_parquet_atomic(vocab, self.path / layout.VOCAB)
        # chunk files written whole by this writer were checksummed as written; others (an earlier,
        # interrupted run's, or written through Zarr) and the layers' zarr.json are read once here
        location, chunks, unread = Location.of(self.path), {}, [f"{folder}/{ZARR_JSON}" for _, _, folder in self.slots]
        for (_, _, folder), array, written in zip(self.slots, self.arrays, self._checksums):
            for index, (path, _) in enumerate(chunk_files(array, folder)):
                if index in written:
                    chunks[path] = written[index]
                else:
                    unread.append(path)
        integrity = record(location, {**chunks, **digests(location, unread)})
        self.complete = True
        self._write_meta(**counts, integrity=integrity, **extra_meta)
        shutil.rmtree(self.path / layout.PARTS, ignore_errors=True)
        (self.path / layout.PROGRESS).unlink(missing_ok=True)
        self.close()

    def _read_tables(self, chunk: int) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The tokens and sentences tables of a chunk committed by an earlier (interrupted) run."""
        return (pd.read_parquet(layout.part_path(self.path, "tokens", chunk)),
                pd.read_parquet(layout.part_path(self.path, "sentences", chunk)))

    def _write_meta(self, **counts: Any) -> None:
        meta = {
            "schema_version": layout.STORE_SCHEMA_VERSION,
            "lmgeom_version": __version__,
            "layer_note": self.layer_note,
            **self.settings,
            "settings": self.settings,
            "created": self.created,
            "generation": self.generation,
            "complete": self.complete,
            **counts,
        }
        write_meta(Location.of(self.path), meta)


def stored_blocks(blocks: list[np.ndarray], layers: Sequence[int], n_layers: int) -> list[np.ndarray]:
    """The rows of the stored `layers` among a chunk's per-layer `blocks`: an encoder hands out every
    layer of the model (`n_layers` blocks, picked from here) or the stored layers only (one block each)."""
    if len(blocks) == len(layers):
        return blocks
    if len(blocks) != n_layers:
        raise ValueError(f"the encoder gave {len(blocks)} layers; the store holds {len(layers)} of the model's {n_layers}")
    return [blocks[layer] for layer in layers]


def require_storable(encoded: Sequence[EncodedSentence], dtype: str, *, first_sentence: int,
                     layers: Sequence[Any] | None = None) -> None:
    """Refuse float16 storage of a chunk holding values beyond float16's range (|x| > 65,504), which
    it would store as inf, naming the first such layer (in the model's numbering: `layers`, when the
    chunk holds only the stored layers), its largest absolute value and its sentence."""
    if dtype != "float16" or not encoded:
        return
    limit = float(np.finfo(np.float16).max)
    n_vectors = encoded[0].vectors.shape[0]
    names = list(layers) if layers is not None and len(layers) == n_vectors else list(range(n_vectors))
    peaks = np.stack([np.abs(e.vectors).max(axis=(1, 2)) if e.vectors.size else np.zeros(n_vectors) for e in encoded])
    if layers is not None and len(layers) != n_vectors:  # every layer of the model: only the stored ones count
        peaks, names = peaks[:, list(layers)], list(layers)
    beyond = np.flatnonzero((peaks > limit).any(axis=0))
    if not len(beyond):
        return
    column = int(beyond[0])
    layer = names[column]
    sentence = int(np.argmax(peaks[:, column]))
    more = [names[i] for i in beyond[1:6]]
    others = f" (and {len(beyond) - 1} more layers: {', '.join(map(str, more))}{', ...' if len(beyond) > 6 else ''})"
    raise InputError(
        f"`storage_dtype='float16'` cannot store layer {layer}: its largest absolute value, {peaks[sentence, column]:,.1f} "
        f"(sentence {first_sentence + sentence}), is beyond float16's range (65,504) and would be stored as inf"
        f"{others if len(beyond) > 1 else ''}; store float32 (`storage_dtype='float32'`, with `overwrite=True` to replace "
        "this unfinished float16 store)", param=("storage_dtype", "overwrite"),
    )


def stored_settings(meta: dict[str, Any], requested: dict[str, Any]) -> dict[str, Any]:
    """A store's recorded settings, as a writer compares them with its own: a store written before
    `last_layer` was recorded holds the model's own last hidden state, so it matches a request for
    that (any position but "before final norm", which such a store cannot hold); one written before
    `stored_layers` were recorded holds every layer of its model, and one written before `sort_window`
    was sorted each chunk on its own."""
    stored = dict(meta.get("settings", {}))
    if stored and "stored_layers" not in stored and "n_layers" in stored:
        stored["stored_layers"] = layout.stored_layers(stored)
    if "sort_window" in requested and "sort_window" not in stored and "chunk_sentences" in stored:
        stored["sort_window"] = stored["chunk_sentences"]
    last = requested.get("last_layer")
    if "last_layer" not in stored and isinstance(last, dict) and last.get("position") != "before final norm":
        stored["last_layer"] = last
    return stored


# Settings that identify the model itself: when one differs, the stored vectors came from another model.
_MODEL_SETTINGS = ("model_id", "model_class", "model_fingerprint", "n_layers", "dim")


_SHORT_WRITE = re.compile(r"\d+ requested and \d+ written")  # numpy's tofile on a full disk (no errno)


@contextlib.contextmanager
def disk_space(folder: str | os.PathLike[str]) -> Iterator[None]:
    """A full disk or quota while writing into `folder` is an OSError (ENOSPC) that says which folder and
    that the extraction resumes once space is freed (what was committed before stays)."""
    try:
        yield
    except OSError as error:
        if error.errno not in (errno.ENOSPC, errno.EDQUOT) and not (error.errno is None and _SHORT_WRITE.search(str(error))):
            raise
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: the disk holding {folder} is full ({error}); "
                      "free space there (or give another folder) and run the same extraction again: it resumes "
                      "after the last chunk it committed") from None


def settings_mismatch(path: Path | str, stored: dict[str, Any], requested: dict[str, Any], *, complete: bool) -> str:
    if not stored:  # the mark `_remove_store` leaves while it removes a store
        return (f"{path} holds what is left of a store whose removal (`overwrite=True`) was interrupted; pass `overwrite=True` "
                "again to remove the rest, or choose another `out`")
    changed = sorted(k for k in set(stored) | set(requested) if stored.get(k) != requested.get(k))
    run = "finished" if complete else "interrupted"
    if not any(key in _MODEL_SETTINGS for key in changed):
        layers = (f": it stores layers {_layer_list(stored.get('stored_layers'))}, and these settings ask for "
                  f"{_layer_list(requested.get('stored_layers'))} (`store_layers`)" if "stored_layers" in changed else "")
        return (f"{path} holds another run (different {', '.join(changed)}){layers}; pass `overwrite=True` to replace it, "
                "or choose another `out`")
    parts = _fingerprint_parts(stored.get("model_fingerprint")), _fingerprint_parts(requested.get("model_fingerprint"))
    differing = [name for name in parts[0] if name in parts[1] and parts[0][name] != parts[1][name]]
    detail = f" (its {' and '.join(differing)} differ)" if differing else ""
    return (
        f"{path} holds an {run} run made with another model (different {', '.join(changed)}): the model "
        f"(weights, tokenizer or config) differs from the one the {run} run used{detail}, so its vectors cannot "
        f"be continued or mixed with this model's. Re-run with the model the {run} run used to resume it, "
        "pass `overwrite=True` to discard it and start again, or choose another `out`"
    )


def _layer_list(layers: Any) -> str:
    return ", ".join(map(str, layers)) if isinstance(layers, list) else str(layers)


def _fingerprint_parts(fingerprint: Any) -> dict[str, str]:
    """{"weights": ..., "tokenizer": ..., "config": ...} from "weights:W tokenizer:T config:C"; {} for other forms."""
    if not isinstance(fingerprint, str):
        return {}
    parts = dict(item.partition(":")[::2] for item in fingerprint.split())
    return parts if set(parts) == {"weights", "tokenizer", "config"} else {}


def _create_layer_array(path: Path, *, rows: int, dim: int, dtype: str, compressor: str | None = None) -> None:
    """An empty (0, dim) array chunked by rows, raw unless `compressor` names one of `layout.COMPRESSORS`
    (activations compress little and reading compressed chunks costs time: docs/performance.md)."""
    zarr.create_array(str(path), shape=(0, dim), chunks=(rows, dim), dtype=dtype, compressors=layout.compressors(compressor),
                      overwrite=True)


def _chunk_rows(encoded: Sequence[EncodedSentence], n_layers: int, dim: int) -> list[np.ndarray]:
    """Each layer's rows of a chunk's sentences, stacked: views, not copies, when the sentences'
    vectors lie back to back in one (n_layers, rows, dim) array (both encoders hand out views of one
    block per chunk), since a chunk of a 30-layer model is hundreds of MB."""
    filled = [e.vectors for e in encoded if e.vectors.shape[1]]  # an empty slice's address need not be where it was cut
    if not filled:
        return [np.empty((0, dim), dtype=encoded[0].vectors.dtype if encoded else np.float32) for _ in range(n_layers)]
    first = filled[0]
    addresses = [part.__array_interface__["data"][0] for part in filled]
    back_to_back = all(
        part.base is not None and part.base is first.base and part.dtype == first.dtype and part.strides == first.strides
        and part.strides[1:] == (dim * first.itemsize, first.itemsize)
        for part in filled
    ) and all(address + part.shape[1] * part.strides[1] == following
              for address, part, following in zip(addresses, filled, addresses[1:]))
    if not back_to_back:
        return [np.concatenate([part[layer] for part in filled], axis=0) for layer in range(n_layers)]
    block = np.lib.stride_tricks.as_strided(
        first, shape=(n_layers, sum(part.shape[1] for part in filled), dim), strides=first.strides, writeable=False
    )
    return list(block)


def _without_empty_chunk_scan(array: Any) -> Any:
    """The array set to store every chunk it is given: by default zarr 3 first scans each chunk for
    being all fill value (to skip storing it), a pass over every row that finds nothing in activations.
    zarr 2 stores every chunk already."""
    return array.with_config({"write_empty_chunks": True}) if hasattr(array, "with_config") else array


OpenChunk = tuple[int, np.ndarray]
"""The last, partly filled chunk of a layer: its index and the rows written to it so far."""


def _write_rows(array: Any, start: int, block: np.ndarray, open_chunk: OpenChunk | None,
                checksums: dict[int, str]) -> OpenChunk | None:
    """Write `block` at row `start`, chunk by chunk, and return the layer's open (partly filled) chunk;
    `checksums` gets the CRC32C of each chunk file written whole (by chunk index).

    A raw local array (`_raw_chunk_path`) gets whole chunk files: a commit's first chunk is completed
    from `open_chunk` (the rows the previous commit left in it; read back once when another run
    wrote them), its last is padded with the fill value (zeros) as zarr stores an edge chunk. Zarr's
    own write takes about twice the CPU for a whole chunk (a hop to its event loop and another to a
    thread pool per chunk) and reads, copies and re-writes a partly written one; a wide model's
    commit pays that for every 4 MiB. Other arrays are written through zarr, piece by piece."""
    chunk_rows = int(array.chunks[0])
    chunk_path = _raw_chunk_path(array, block.dtype)
    done = 0
    while done < len(block):
        row = start + done
        index, offset = divmod(row, chunk_rows)
        piece = min(len(block) - done, chunk_rows - offset)
        rows = block[done : done + piece]
        done += piece
        if chunk_path is None:
            array[row : row + piece] = rows
            continue
        if offset:
            if open_chunk is None or open_chunk[0] != index or len(open_chunk[1]) != offset:
                open_chunk = (index, np.asarray(array[index * chunk_rows : row]))
            rows = np.concatenate([open_chunk[1], rows])
        if len(rows) < chunk_rows:
            open_chunk = (index, rows.copy())  # the next commit completes this chunk
            rows = np.concatenate([rows, np.zeros((chunk_rows - len(rows), *rows.shape[1:]), dtype=rows.dtype)])
        path = chunk_path(index)
        path.parent.mkdir(parents=True, exist_ok=True)
        # a temporary file renamed over the chunk, as zarr writes; `_recover` removes leftovers
        partial = path.with_name(f"{path.name}.partial")
        contiguous = np.ascontiguousarray(rows)
        try:
            contiguous.tofile(partial)
            os.replace(partial, path)
        except BaseException:  # a full disk: no half chunk left behind
            partial.unlink(missing_ok=True)
            raise
        checksums[index] = checksum(contiguous)
    return open_chunk


def _raw_chunk_path(array: Any, dtype: np.dtype[Any]) -> Callable[[int], Path] | None:
    """Where the file of row-chunk i lies, for a zarr 3 array in a local folder whose chunks are
    stored raw (only the little-endian bytes codec, as `_create_layer_array` makes them): such a
    chunk's file is, by the zarr 3 format, exactly its rows' bytes in C order. None otherwise."""
    metadata = array.metadata
    raw = (BytesCodec(endian="little"),)
    if (not isinstance(array.store, LocalStore) or getattr(metadata, "codecs", None) != raw
            or dtype != array.dtype or dtype.byteorder == ">" or (dtype.byteorder == "=" and sys.byteorder != "little")):
        return None
    folder = Path(array.store.root) / array.store_path.path
    return lambda index: folder / metadata.encode_chunk_key((index, 0))


def _write_parquet_atomic(table: pd.DataFrame, path: Path) -> None:
    atomic_write(path, lambda tmp: table.to_parquet(tmp, index=False))


def index_words(tokens: pd.DataFrame, sentences: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, int]]:
    """The vocabulary of a finished store's token table, and the table's counts for meta.json.

    Inserts `word_id` and `is_punct` into `tokens` (in place), so word ids are global over every
    chunk or shard the table was joined from."""
    words = tokens["word"].to_numpy()
    vocab = Vocabulary.from_words(words, tokens["sentence_id"].to_numpy()).table
    # each distinct word is looked up in the vocabulary once, not once per token
    codes, distinct = pd.factorize(words)
    distinct_ids = vocab["word_id"].to_numpy()[pd.Index(vocab["word"].to_numpy()).get_indexer(distinct)]
    tokens.insert(3, "word_id", distinct_ids[codes])
    # the vocabulary flags each distinct word once; a token takes its word's flag
    is_punct = vocab["is_punct"].to_numpy(dtype=bool)[tokens["word_id"].to_numpy()]
    tokens.insert(4, "is_punct", is_punct & ~tokens["is_special"].to_numpy())
    counts = dict(
        n_tokens=len(tokens), n_sentences=len(sentences), n_words=int((~tokens["is_special"]).sum()),
        n_vocab=len(vocab), n_windows=int(sentences["n_windows"].sum()),
        n_long_sentences=int((sentences["n_windows"] > 1).sum()),
        n_unaligned_words=int(sentences["n_unaligned"].sum()),
        n_truncated_words=int(sentences["n_truncated"].sum()) if "n_truncated" in sentences else 0,
    )
    return vocab, counts
