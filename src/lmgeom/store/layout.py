"""The on-disk layout of a representation store, shared by its writer and its reader.

```
RUN/
  meta.json            settings, counts, "complete", "generation"; written first, completed last (then also
                       "integrity": the tables' sizes and CRC32C, checksums.json's CRC32C, and
                       "meta_digest": the name of the file holding meta.json's own CRC32C)
  meta.json.crc32c     the CRC32C of the complete meta.json's bytes (8 hex digits): written just before
                       the complete meta.json, so a complete meta.json always has it
  lock.json            the writer's lock while one writes: host, pid, start (`lmgeom.store.lock`)
  checksums.json       CRC32C of every chunk file and of each layer's zarr.json (its array metadata: shape,
                       data type, chunks, codecs), by its path below RUN (written when complete)
  progress.json        committed chunks while an extraction runs (removed when complete)
  parts/               per-chunk token and sentence tables while an extraction runs
  layers/<l>/          one zarr array per stored layer (meta.json's "stored_layers"), in the model's numbering:
                       rows = stored tokens, layer 0 = embedding output (the capture site resid_post)
  sites/<site>/<l>/    the other capture sites' arrays, when meta.json's "sites" names them (`lmgeom.sitespec`):
                       the same rows, layers 1..L (each site's "layers"), in the folder its entry records
  tokens.parquet       sentence_id, position, word, word_id, is_punct, is_special, n_pieces
  sentences.parquet    sentence_id, text, n_words, n_tokens, n_windows, first_row
  vocab.parquet        word_id, word, count, n_contexts, is_punct
```

Every read checks what it reads against these digests (`lmgeom.store.integrity`): meta.json on open,
each layer's zarr.json when its array is opened, each chunk file and table as it is read. A store
written before meta.json.crc32c and the zarr.json digests were recorded opens with a warning.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from lmgeom.errors import InputError
from lmgeom.sitespec import DEFAULT_SITE, SITES_FOLDER, site_folder

STORE_SCHEMA_VERSION = 1
LAYER_NOTE = "layer 0 is the embedding output; layer l >= 1 is the output of transformer block l"
META = "meta.json"
PROGRESS = "progress.json"
LOCK = "lock.json"
PARTS = "parts"
LAYERS = "layers"
TOKENS = "tokens.parquet"
SENTENCES = "sentences.parquet"
VOCAB = "vocab.parquet"
CHECKSUMS = "checksums.json"
META_DIGEST = "meta.json.crc32c"
SHARDS = "shards"
SITES = SITES_FOLDER
STORE_NAMES = frozenset({META, META_DIGEST, PROGRESS, LOCK, PARTS, LAYERS, SITES, TOKENS, SENTENCES, VOCAB, CHECKSUMS, SHARDS})
"""The names a store's writer puts at the top of its folder (the lock's temporary files aside:
`lmgeom.store.lock.is_lock_file`)."""
STORAGE_DTYPES = ("float32", "float16")
COMPRESSORS = ("zstd",)
"""Codecs a store's layers may be compressed with (`--compress`); by default they are stored raw."""
MIN_CHUNK_ROWS = 16



def chunk_rows(dim: int, expected_rows: int | None = None) -> int:
    """Rows per zarr chunk of a layer: about 4 MiB of float32 (at least 1,024 rows); a store expected to
    hold fewer rows (`expected_rows`, from the corpus the writer is given) gets that count rounded up to a
    power of two (at least MIN_CHUNK_ROWS), so a small store does not write 4 MiB chunks of padding.
    Fixed when a layer's array is created; a resumed extraction keeps the chunks of the arrays it finds."""
    full = max(1024, (1 << 20) // dim)
    if expected_rows is None:
        return full
    return min(full, max(MIN_CHUNK_ROWS, 1 << max(0, int(expected_rows) - 1).bit_length()))


def expected_rows(sentences: Any) -> int:
    """An upper bound of the rows sentences (`lmgeom.corpus.Sentence`s) take in a store: their words
    plus two special tokens each (CLS and SEP, or BOS), which a store keeps with `--keep-special`."""
    return sum(len(sentence.words) + 2 for sentence in sentences)


def compressors(name: str | None) -> tuple[Any, ...] | None:
    """The zarr compressors of `--compress name` (None: raw chunks)."""
    if name is None:
        return None
    if name not in COMPRESSORS:
        raise InputError(f"unknown `compress` {name!r}; use one of {', '.join(COMPRESSORS)}, or leave it out for raw chunks",
                         param="compress")
    from zarr.codecs import ZstdCodec

    return (ZstdCodec(level=3),)


def stored_layers(meta: Mapping[str, Any]) -> list[int]:
    """The layers a store holds, in the model's numbering: its "stored_layers" (every layer, 0..n_layers - 1,
    for a store written before they were recorded)."""
    recorded = meta.get("stored_layers")
    return [int(layer) for layer in recorded] if recorded is not None else list(range(int(meta["n_layers"])))


def stored_sites(meta: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The capture sites a store holds, by name, each with its `folder` (below the store) and its
    `layers`: meta.json's "sites", or `resid_post` alone (in `layers/`, every stored layer) for a store
    that records none, as every store written before sites and every store of `resid_post` only."""
    recorded = meta.get("sites")
    if isinstance(recorded, dict):
        return {str(name): dict(entry) for name, entry in recorded.items()}
    return {DEFAULT_SITE: {"folder": site_folder(DEFAULT_SITE), "layers": stored_layers(meta)}}


def stored_arrays(meta: Mapping[str, Any]) -> list[tuple[str, int, str]]:
    """(site, layer, folder below the store) of every layer array a store holds, site after site
    (`stored_sites`' order, `resid_post` first), layers ascending: the order an encoder hands them out."""
    return [(site, int(layer), f"{entry['folder']}/{int(layer)}")
            for site, entry in stored_sites(meta).items() for layer in entry["layers"]]


def array_label(site: str, layer: int) -> str:
    """How messages name a stored array: "layer 3", or "layer 3 (attn_out)" for a site but `resid_post`."""
    return f"layer {layer}" if site == DEFAULT_SITE else f"layer {layer} ({site})"


def layer_path(root: Path, layer: int) -> Path:
    return root / LAYERS / str(layer)


def part_path(root: Path, kind: str, chunk: int) -> Path:
    return root / PARTS / f"{kind}-{chunk:06d}.parquet"


def is_store(path: str | Path) -> bool:
    """Whether `path` (a folder or an fsspec URL) is a store (complete or not): it holds the store's meta.json."""
    from lmgeom.store.location import Location

    return Location.of(path).exists(META)


def read_store_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise InputError(f"corrupt store: cannot read {path} ({error}); re-run the extraction with `overwrite=True`", param="overwrite") from None
