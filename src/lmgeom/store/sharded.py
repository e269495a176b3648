"""A store written in shards of whole sentences (by many workers, or one on an object store).

```
RUN/
  meta.json                 the manifest: settings and "complete"; once complete also the shard index
  shards/<k>.json           shard k's manifest: its part folder, first sentence, sentences and rows
  shards/<k>-<attempt>/     shard k's part, in the layout of a store: layers/<l>, tokens.parquet,
                            sentences.parquet (sentence ids global, first_row within the part)
  tokens.parquet            every token in corpus order, with global word ids (written when finishing)
  sentences.parquet         first_row global
  vocab.parquet
```

The commit protocol writes parts first and a manifest last, and trusts only what a manifest names,
so it needs no atomic rename (object stores have none) and a crash leaves a readable store:
- a shard attempt writes its part into a folder of its own (`<k>-<attempt>`), then `shards/<k>.json`;
  a worker killed mid-shard leaves a part that no manifest names, and a resume writes shard k afresh;
- finishing reads the shards their manifests name, writes the global tables, then `meta.json` with
  `complete` and the shard index (each shard's part and first row); readers open only the parts in
  that index, so stray parts of crashed attempts are never read, and finishing removes them.
Word ids are global: the vocabulary is built from all shards' token tables when finishing.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import pandas as pd
import zarr

from lmgeom.errors import InputError, OutOfRange
from lmgeom._version import __version__
from lmgeom.store import layout
from lmgeom.store.integrity import (CorruptStore, Manifest, chunk_files, digests, inside, layer_metadata_files,
                                    open_checked_layer, record, write_meta)
from lmgeom.store.location import Location
from lmgeom.store.lock import HoldsLock
from lmgeom.store.writer import (Foreign, StoreExistsError, claim_out, foreign_entries, index_words, require_storable,
                                 settings_mismatch, stored_settings)

if TYPE_CHECKING:
    from lmgeom.encoders.base import EncodedSentence

SHARDS = layout.SHARDS
LAYOUT_NAME = "sharded"


def shard_manifest_name(shard: int) -> str:
    return f"{shard:06d}.json"


def shard_ranges(n_sentences: int, shard_sentences: int) -> list[range]:
    """Sentence ranges of the shards: whole sentences, in corpus order."""
    return [range(first, min(first + shard_sentences, n_sentences)) for first in range(0, n_sentences, shard_sentences)]


def store_meta(settings: dict[str, Any], *, created: str, generation: str, complete: bool,
               layer_note: str = layout.LAYER_NOTE, **extra: Any) -> dict[str, Any]:
    return {
        "schema_version": layout.STORE_SCHEMA_VERSION, "lmgeom_version": __version__, "layer_note": layer_note,
        "layout": LAYOUT_NAME, **settings, "settings": settings, "created": created, "generation": generation,
        "complete": complete, **extra,
    }


class ShardPartWriter:
    """Writes one attempt at shard `shard`: rows appended chunk by chunk, then its tables, then its manifest.
    Its layers are chunked by `layout.chunk_rows(dim, expected_rows)` (the shard's rows bound) and
    compressed by `compressor` (`layout.compressors`)."""

    def __init__(self, location: Location, shard: int, *, first_sentence: int, n_layers: int, dim: int, dtype: str,
                 expected_rows: int | None = None, compressor: str | None = None, layers: Sequence[int] | None = None) -> None:
        self.location = location
        self.n_layers = n_layers
        self.layers = list(range(n_layers)) if layers is None else list(layers)  # stored, in the model's numbering
        self.shard = shard
        self.first_sentence = first_sentence
        self.dim = dim
        self.dtype = dtype
        self.part = f"{shard:06d}-{uuid.uuid4().hex[:12]}"
        self.n_rows = 0
        self.tokens: list[pd.DataFrame] = []
        self.sentences: list[pd.DataFrame] = []
        part = location.child(SHARDS, self.part)
        self.arrays = [
            zarr.create_array(part.zarr_store(layout.LAYERS, str(layer), read_only=False), shape=(0, dim),
                              chunks=(layout.chunk_rows(dim, expected_rows), dim), dtype=dtype,
                              compressors=layout.compressors(compressor), overwrite=True,
                              config={"write_empty_chunks": True})  # every chunk has its file, as the reader checks
            for layer in self.layers
        ]

    @property
    def n_sentences(self) -> int:
        return sum(len(table) for table in self.sentences)

    def append(self, encoded: Sequence[EncodedSentence], texts: Sequence[str]) -> None:
        """Rows of the next sentences of the shard to every layer; their tables are kept until `commit`."""
        first_sentence, first_row = self.first_sentence + self.n_sentences, self.n_rows
        n_rows = sum(len(e.words) for e in encoded)
        require_storable(encoded, self.dtype, first_sentence=first_sentence, layers=self.layers)
        # an encoder hands out every layer of the model or the stored ones only (`stored_blocks`)
        every = bool(encoded) and encoded[0].vectors.shape[0] != len(self.layers)
        for index, (layer, array) in enumerate(zip(self.layers, self.arrays)):
            block = (np.concatenate([e.vectors[layer if every else index] for e in encoded], axis=0) if encoded
                     else np.empty((0, self.dim)))
            if not np.isfinite(block).all():
                bad = int(np.flatnonzero(~np.isfinite(block).all(axis=1))[0])
                raise InputError(f"layer {layer}, sentence {first_sentence + bad}: the model produced NaN/inf; "
                                 "use a float32 compute dtype")
            array.resize((first_row + n_rows, self.dim))
            array[first_row:] = block.astype(self.dtype, copy=False)
        sizes = [len(e.words) for e in encoded]
        ids = np.arange(first_sentence, first_sentence + len(encoded), dtype=np.int64)
        self.tokens.append(pd.DataFrame({
            "sentence_id": np.repeat(ids, sizes),
            "position": np.concatenate([np.arange(size, dtype=np.int32) for size in sizes]),
            "word": [w for e in encoded for w in e.words],
            "is_special": np.concatenate([e.is_special for e in encoded]),
            "n_pieces": np.concatenate([e.n_pieces for e in encoded]).astype(np.int16),
        }))
        self.sentences.append(pd.DataFrame({
            "sentence_id": ids,
            "text": list(texts),
            "n_words": [int((~e.is_special).sum()) for e in encoded],
            "n_tokens": sizes,
            "n_windows": [e.n_windows for e in encoded],
            "n_unaligned": [e.n_unaligned for e in encoded],
            "n_truncated": [e.n_truncated for e in encoded],
            "first_row": first_row + np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64),
        }))
        self.n_rows += n_rows

    def commit(self) -> dict[str, Any]:
        """Write the part's tables, then the shard's manifest (last: until then no reader trusts the part)."""
        part = self.location.child(SHARDS, self.part)
        part.write_parquet(pd.concat(self.tokens, ignore_index=True), layout.TOKENS)
        part.write_parquet(pd.concat(self.sentences, ignore_index=True), layout.SENTENCES)
        manifest = {"shard": self.shard, "part": self.part, "first_sentence": self.first_sentence,
                    "n_sentences": self.n_sentences, "n_rows": self.n_rows, "chunks": part_digests(part, self.arrays, self.layers)}
        self.location.write_json(manifest, SHARDS, shard_manifest_name(self.shard))
        return manifest


class ShardedStoreWriter(HoldsLock):
    """The driver's side of a sharded store: its meta.json, which shards are done, and finishing.

    `settings` identify the run as for `StoreWriter` (they include `shard_sentences` and
    `n_corpus_sentences`, which fix the shards); re-opening with other settings is refused unless `overwrite`.
    The driver holds the store's lock (`claim_out`) until `finalize` or `close`; shard workers write parts under it."""

    def __init__(self, location: Location, *, settings: dict[str, Any], overwrite: bool = False,
                 foreign: Foreign = foreign_entries, layer_note: str = layout.LAYER_NOTE) -> None:
        if settings.get("dtype") not in layout.STORAGE_DTYPES:
            raise InputError(f"storage dtype must be one of {layout.STORAGE_DTYPES}, got {settings.get('dtype')!r}")
        self.location = location
        self.layer_note = layer_note
        self.settings = {**settings, "stored_layers": layout.stored_layers(settings)}
        self._hold(claim_out(location, overwrite=overwrite, foreign=foreign), self._open)

    def _open(self) -> None:
        location = self.location
        if location.exists(layout.META):
            existing = location.read_json(layout.META)
            stored = stored_settings(existing, self.settings)
            if stored != self.settings:
                raise StoreExistsError(settings_mismatch(location.url, stored, self.settings,
                                                          complete=bool(existing.get("complete"))),
                                       param=("overwrite", "out"))
            self.complete = bool(existing.get("complete"))
            self.created = str(existing.get("created"))
            self.generation = str(existing.get("generation") or uuid.uuid4().hex)
        else:
            self.complete = False
            self.created = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            self.generation = uuid.uuid4().hex
            location.write_json(store_meta(self.settings, created=self.created, generation=self.generation, complete=False,
                                           layer_note=self.layer_note),
                                layout.META)

    @property
    def shards(self) -> list[range]:
        return shard_ranges(int(self.settings["n_corpus_sentences"]), int(self.settings["shard_sentences"]))

    def finished(self) -> dict[int, dict[str, Any]]:
        """The manifests of the shards already written (a shard without one is redone)."""
        names = set(self.location.listdir(SHARDS))
        return {shard: self.location.read_json(SHARDS, shard_manifest_name(shard))
                for shard in range(len(self.shards)) if shard_manifest_name(shard) in names}

    def finalize(self, **extra_meta: Any) -> None:
        """Global tables from the shards their manifests name, then meta.json with the shard index; releases the lock."""
        if self.complete:
            self.close()
            return
        self.lock.require_held()
        manifests = self.finished()
        missing = [shard for shard in range(len(self.shards)) if shard not in manifests]
        if missing:
            raise InputError(f"{self.location}: shards {missing[:5]} are not written yet; re-run the extraction to write them")
        index, tokens, sentences, first_row = [], [], [], 0
        chunks: dict[str, str] = {}
        for shard in range(len(self.shards)):
            manifest = manifests[shard]
            name = inside(self.location, manifest["part"], what="shard part", meta=self.settings)
            part = self.location.child(SHARDS, name)
            tokens.append(part.read_parquet(layout.TOKENS))
            table = part.read_parquet(layout.SENTENCES)
            table["first_row"] += first_row
            sentences.append(table)
            index.append({"part": manifest["part"], "first_row": first_row, "n_rows": manifest["n_rows"],
                          "first_sentence": manifest["first_sentence"], "n_sentences": manifest["n_sentences"]})
            first_row += int(manifest["n_rows"])
            # digested by the worker that wrote the part; a part written without them is read once here
            layers = layout.stored_layers(self.settings)
            part_chunks = manifest.get("chunks") or part_digests(part, [part.open_array(layout.LAYERS, str(layer))
                                                                        for layer in layers], layers)
            # a worker of an earlier version recorded its chunk files only
            part_chunks = {**digests(part, set(layer_metadata_files(layers)) - set(part_chunks)), **part_chunks}
            chunks.update({f"{SHARDS}/{name}/{path}": digest for path, digest in part_chunks.items()})
        token_table = pd.concat(tokens, ignore_index=True)
        sentence_table = pd.concat(sentences, ignore_index=True)
        vocab, counts = index_words(token_table, sentence_table)
        self.location.write_parquet(token_table, layout.TOKENS)
        self.location.write_parquet(sentence_table, layout.SENTENCES)
        self.location.write_parquet(vocab, layout.VOCAB)
        integrity = record(self.location, chunks)
        self.complete = True
        write_meta(self.location, store_meta(
            self.settings, created=self.created, generation=self.generation, complete=True, layer_note=self.layer_note,
            shards=index, **counts,
            integrity=integrity, **extra_meta,
        ))
        named = {entry["part"] for entry in index} | {shard_manifest_name(shard) for shard in manifests}
        for stray in set(self.location.listdir(SHARDS)) - named:
            self.location.remove(SHARDS, stray)
        self.close()


def part_digests(part: Location, arrays: Sequence[zarr.Array], layers: Sequence[int]) -> dict[str, str]:
    """{path below the part: CRC32C} of every chunk file and the zarr.json of a part's arrays of `layers`."""
    return digests(part, [*(path for layer, array in zip(layers, arrays)
                            for path, _ in chunk_files(array, f"{layout.LAYERS}/{layer}")),
                          *layer_metadata_files(layers)])


class ShardedArray:
    """The rows of one layer over the parts of a sharded store, read like one (n_tokens, dim) zarr array."""

    def __init__(self, parts: Sequence[zarr.Array], first_rows: Sequence[int], dim: int) -> None:
        self.parts = list(parts)
        self.bounds = np.append(np.asarray(first_rows, dtype=np.int64), sum(part.shape[0] for part in parts))
        self.shape = (int(self.bounds[-1]), dim)
        self.dtype = self.parts[0].dtype if self.parts else np.dtype("float32")
        # readers step in whole stored chunks; the parts share one chunk shape (boundaries between
        # parts need not fall on it, which costs at most one partial chunk per part)
        self.chunks = (int(self.parts[0].chunks[0]) if self.parts else 1, dim)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key: Any) -> np.ndarray:
        rows, columns = key if isinstance(key, tuple) else (key, slice(None))
        if isinstance(rows, slice):
            start, stop, step = rows.indices(self.shape[0])
            if step != 1:
                return self.get_orthogonal_selection((np.arange(start, stop, step), columns))
            blocks = []
            for part, (first, last) in zip(self.parts, zip(self.bounds[:-1], self.bounds[1:])):
                if first < stop and start < last:
                    blocks.append(np.asarray(part[max(start, first) - first : min(stop, last) - first, columns]))
            return np.concatenate(blocks) if blocks else np.empty((0, self.shape[1]), dtype=self.dtype)[:, columns]
        if np.isscalar(rows):
            return self.get_orthogonal_selection((np.asarray([rows]), columns))[0]
        return self.get_orthogonal_selection((np.asarray(rows), columns))

    def get_orthogonal_selection(self, selection: tuple[Any, Any]) -> np.ndarray:
        """Rows (any order, negative counted from the end) and columns, as zarr's orthogonal selection."""
        rows, columns = selection
        rows = np.asarray(rows, dtype=np.int64)
        rows = np.where(rows < 0, rows + self.shape[0], rows)
        if rows.size and (rows.min() < 0 or rows.max() >= self.shape[0]):
            raise OutOfRange(f"rows out of range [0, {self.shape[0]})")
        width = len(range(self.shape[1])[columns]) if isinstance(columns, slice) else len(np.atleast_1d(columns))
        out = np.empty((rows.size, width), dtype=self.dtype)
        owner = np.searchsorted(self.bounds, rows, side="right") - 1
        for part in np.unique(owner):
            here = np.flatnonzero(owner == part)
            out[here] = self.parts[part].get_orthogonal_selection((rows[here] - self.bounds[part], columns))
        return out


def open_sharded_layer(location: Location, meta: dict[str, Any], layer: int, manifest: Manifest) -> ShardedArray:
    """Layer `layer` of a complete sharded store, over the parts its shard index names (each inside
    the store, checked as `open_checked_layer` checks it, and its rows as many as the index says)."""
    index = meta["shards"]
    parts = open_checked_layer(location, meta, layer, manifest)
    for entry, part in zip(index, parts):
        if part.shape[0] != int(entry["n_rows"]):
            raise CorruptStore(location, f"layer {layer} of shard part {entry['part']} has {part.shape[0]:,} rows, the "
                                         f"shard index {int(entry['n_rows']):,}", meta)
    return ShardedArray(parts, [int(entry["first_row"]) for entry in index], int(meta["dim"]))
