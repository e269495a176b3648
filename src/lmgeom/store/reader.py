"""`RepresentationStore`: lazy reading of a complete store."""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pandas as pd
import zarr

from lmgeom.errors import InputError, OutOfRange
from lmgeom.sitespec import DEFAULT_SITE
from lmgeom.store import layout
from lmgeom.store.integrity import (CorruptStore, Manifest, layout_problems, load_manifest, open_checked_layer, read_meta,
                                    read_table, rewritten, table_problems)
from lmgeom.store.location import Location
from lmgeom.store.lock import describe, live_holder
from lmgeom.store.sharded import ShardedArray, open_sharded_layer


class RepresentationStore:
    """A complete store: per-layer lazy arrays plus token, sentence and vocabulary tables.

    Row i of every layer is token i of `tokens`. Layers keep the model's numbering (layer 0 is the
    embedding output, the last is `n_model_layers - 1`); `layers` are those stored. The store is a
    local folder or any fsspec URL (`url`); `path` is the local folder (object stores have none).
    Everything read is checked against the checksums the store records (`lmgeom.store.integrity`):
    meta.json on `open`, each layer's zarr.json when it is opened, each chunk file and table as it is
    read; a mismatch is a `CorruptStore` naming the file.

    A store may hold several capture sites (`sites`, `lmgeom.sitespec`): `layer(l, site="attn_out")`
    reads one; `at_site(site)` is the same store read at another site by default (its `layers`,
    `layer`, `rows` and `iter_chunks`), which is how an analysis reads a site.
    """

    def __init__(self, path: Path | Location, meta: dict[str, Any], site: str = DEFAULT_SITE) -> None:
        self.location = Location.of(path)
        self.meta = meta
        self.site = site

    @property
    def path(self) -> Path:
        """The store's local folder; a store on an object store has none (see `url`)."""
        return self.location.local_path

    @property
    def url(self) -> str:
        """Where the store lives: a local path or an fsspec URL."""
        return self.location.url

    @classmethod
    def of(cls, store: "RepresentationStore | str | os.PathLike[str] | Location") -> "RepresentationStore":
        """`store` itself when it is an open store, else the store opened at that path or URL."""
        return store if isinstance(store, RepresentationStore) else cls.open(store)

    @classmethod
    def open(cls, path: str | os.PathLike[str] | Location) -> "RepresentationStore":
        location = Location.of(path)
        if not location.exists(layout.META):
            raise FileNotFoundError(f"{location} is not an lmgeom store (no {layout.META}); create one with `lmgeom extract`")
        meta = read_meta(location)
        if not meta.get("complete"):
            if (writer := live_holder(location)) is not None:
                raise InputError(f"{location} is being written ({describe(writer)}); open it once that extraction has finished")
            done = location.read_json(layout.PROGRESS)["n_sentences"] if location.exists(layout.PROGRESS) else 0
            raise InputError(
                f"{location} is an unfinished extraction ({done or 'some'} sentences committed); re-run the same "
                "`lmgeom extract` command to resume it"
            )
        store = cls(location, meta)
        store._check()
        return store

    def _check(self) -> None:
        """meta.json against the layer arrays, the tables against meta.json, and every layer's metadata
        and chunk files (each present at its size)."""
        for path, problem in layout_problems(self.location, self.meta):
            raise CorruptStore(self.location, problem, self.meta, path=path)
        for name, problem in table_problems(self.location, self.meta, self.location.files(recursive=False)):
            raise CorruptStore(self.location, problem, self.meta, path=name)
        for site, layer, _ in layout.stored_arrays(self.meta):
            shape = self.layer(layer, site=site).shape
            if shape != (self.n_tokens, self.dim):
                raise CorruptStore(self.location, f"{layout.array_label(site, layer)} has shape {shape}, expected "
                                   f"({self.n_tokens}, {self.dim})", self.meta)

    # ---- shape ------------------------------------------------------------------------------
    @property
    def layers(self) -> list[int]:
        """The stored layers of this store's site (`site`, by default `resid_post`), ascending, in the model's
        numbering (every layer unless the extraction chose some; a site but resid_post has no layer 0)."""
        return self.site_layers(self.site)

    @property
    def sites(self) -> list[str]:
        """The capture sites the store holds, `resid_post` first (`lmgeom.sitespec`)."""
        return list(layout.stored_sites(self.meta))

    def site_layers(self, site: str) -> list[int]:
        """The stored layers of capture site `site`, ascending.

        Parameters
        ----------
        site : str
            One of `sites`.

        Returns
        -------
        list of int
            Its layers in the model's numbering.

        Raises
        ------
        InputError
            A site the store does not hold, naming those it holds.
        """
        sites = layout.stored_sites(self.meta)
        if site not in sites:
            raise InputError(f"`site` {site!r} is not stored: this store holds the sites {', '.join(sites)}; choose one of "
                             "those, or extract again capturing it (`sites`)", param=("site", "sites"))
        return [int(layer) for layer in sites[site]["layers"]]

    def at_site(self, site: str) -> RepresentationStore:
        """This store read at capture site `site` by default: a store object of the same files, whose
        `layers`, `layer`, `rows` and `iter_chunks` are the site's (itself when it is at `site` already).

        Parameters
        ----------
        site : str
            One of `sites`.

        Returns
        -------
        RepresentationStore
            The store at that site; its tables are shared once read.

        Raises
        ------
        InputError
            A site the store does not hold.
        """
        if site == self.site:
            return self
        self.site_layers(site)  # an unknown site is refused here
        view = RepresentationStore(self.location, self.meta, site)
        for name in ("tokens", "sentences", "vocab", "_manifest", "_arrays"):
            if name in self.__dict__:
                view.__dict__[name] = self.__dict__[name]
        return view

    @property
    def n_model_layers(self) -> int:
        """The model's layers, stored or not (the embedding output and each block's output)."""
        return int(self.meta["n_layers"])

    @property
    def n_tokens(self) -> int:
        return int(self.meta["n_tokens"])

    @property
    def dim(self) -> int:
        return int(self.meta["dim"])

    def __repr__(self) -> str:
        sites = f", sites={','.join(self.sites)}, site={self.site}" if self.sites != [DEFAULT_SITE] else ""
        return (f"RepresentationStore({self.url!r}, model={self.meta.get('model_id')!r}, "
                f"layers={describe_layers(self.layers, self.n_model_layers)} (0 = embeddings), tokens={self.n_tokens}, "
                f"dim={self.dim}{sites})")

    # ---- arrays -----------------------------------------------------------------------------
    def layer(self, layer: int, site: str | None = None) -> zarr.Array | ShardedArray:
        """Lazy (n_tokens, dim) array of a layer at a capture site (None: the store's `site`, by default
        `resid_post`); slicing reads only the chunks it touches, each checked against its recorded CRC32C
        as it is read. Opening it checks its zarr.json (digest, data type, width, codecs) and that each of
        its chunk files exists and has its size (Zarr would read a missing one as zeros). A negative
        `layer` counts from the model's last layer (-1 is the last), as everywhere in lmgeom."""
        site = self.site if site is None else site
        if -self.n_model_layers <= layer < 0:
            layer += self.n_model_layers
        stored = self.site_layers(site)
        if layer not in stored:
            if site != DEFAULT_SITE and 0 <= layer < self.n_model_layers:
                raise OutOfRange(f"layer {layer} of site {site} is not stored: the store holds it at layers "
                                 f"{describe_layers(stored, self.n_model_layers)} (layer 0, the embedding output, holds "
                                 "resid_post only); choose one of those", param="layer")
            if 0 <= layer < self.n_model_layers:
                raise OutOfRange(f"layer {layer} is not stored: this store holds layers {describe_layers(self.layers, self.n_model_layers)} "
                                 f"of the model's 0..{self.n_model_layers - 1} (0 = embeddings); choose one of those, or extract "
                                 "again storing it (`store_layers`)", param="layer")
            raise OutOfRange(f"layer {layer} out of range: this store holds layers "
                             f"{describe_layers(self.layers, self.n_model_layers)} (0 = embeddings)", param="layer")
        key = (site, layer)
        if key not in self._arrays:
            if "shards" in self.meta:  # written in shards: the parts the shard index names
                self._arrays[key] = open_sharded_layer(self.location, self.meta, layer, self._manifest)
            else:
                self._arrays[key] = open_checked_layer(self.location, self.meta, layer, self._manifest, site)[0]
        return self._arrays[key]

    @cached_property
    def _arrays(self) -> dict[tuple[str, int], zarr.Array | ShardedArray]:
        return {}

    @cached_property
    def _manifest(self) -> Manifest:
        """checksums.json (checked against meta.json), read once: what each layer's reads are checked against."""
        return load_manifest(self.location, self.meta)

    def iter_chunks(self, layer: int, *, chunk_rows: int = 65536, site: str | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """(start_row, rows) in bounded-memory blocks, in row order (of `site`; None: the store's)."""
        array = self.layer(layer, site)
        for start in range(0, self.n_tokens, chunk_rows):
            yield start, np.asarray(array[start : start + chunk_rows])

    def rows(self, layer: int, rows: np.ndarray, site: str | None = None) -> np.ndarray:
        """The given rows of a layer (of `site`; None: the store's), in the given order."""
        rows = np.asarray(rows, dtype=np.int64)
        array = self.layer(layer, site)
        if rows.size == 0:
            return np.empty((0, self.dim), dtype=array.dtype)
        order = np.argsort(rows, kind="stable")
        sorted_rows = rows[order]
        out = np.empty((rows.size, self.dim), dtype=array.dtype)
        out[order] = array.get_orthogonal_selection((sorted_rows, slice(None)))
        return out

    # ---- tables -----------------------------------------------------------------------------
    @cached_property
    def tokens(self) -> pd.DataFrame:
        return read_table(self.location, self.meta, layout.TOKENS)

    def token_columns(self, *columns: str) -> pd.DataFrame:
        """Only these columns of the token table, read afresh and not kept (from `tokens` if that is
        already loaded): the whole table, its words as Python strings, takes many times their bytes.
        The file's bytes are read whole, to check them, and only these columns parsed."""
        if "tokens" in self.__dict__:
            return self.tokens.loc[:, list(columns)]
        return read_table(self.location, self.meta, layout.TOKENS, columns)

    @cached_property
    def sentences(self) -> pd.DataFrame:
        return read_table(self.location, self.meta, layout.SENTENCES)

    @cached_property
    def vocab(self) -> pd.DataFrame:
        return read_table(self.location, self.meta, layout.VOCAB)

    @cached_property
    def _rows_by_word_id(self) -> dict[int, np.ndarray]:
        word_ids = self.tokens["word_id"].to_numpy()
        order = np.argsort(word_ids, kind="stable")
        bounds = np.searchsorted(word_ids[order], np.arange(len(self.vocab) + 1))
        return {w: order[bounds[w] : bounds[w + 1]] for w in range(len(self.vocab))}

    def occurrences(self, word: str) -> np.ndarray:
        """Row indexes where `word` occurs (exact match), in corpus order."""
        matches = self.vocab.index[self.vocab["word"] == word]
        if len(matches) == 0:
            raise InputError(f"word {word!r} does not occur in {self.url}")
        return self._rows_by_word_id[int(self.vocab.at[matches[0], "word_id"])]

    # ---- generation -------------------------------------------------------------------------
    def check_unchanged(self) -> None:
        """Raise if the store is no longer the one opened: a writer created it anew since (another
        `generation` in meta.json, as `--overwrite` writes), or it is no longer complete. Whatever was
        read from it before may then mix two stores; call this once the reading is done."""
        if (error := rewritten(self.location, self.meta)) is not None:
            raise error

    def sentence_rows(self, sentence_id: int) -> np.ndarray:
        """Row indexes of one sentence's stored tokens."""
        if not 0 <= sentence_id < len(self.sentences):
            raise OutOfRange(f"sentence {sentence_id} out of range 0..{len(self.sentences) - 1}")
        record = self.sentences.iloc[sentence_id]
        return np.arange(record["first_row"], record["first_row"] + record["n_tokens"], dtype=np.int64)


def describe_layers(layers: list[int], n_model_layers: int) -> str:
    """"0..6" for every layer of a model, else the stored layers listed ("0, 3, 6")."""
    if layers == list(range(n_model_layers)):
        return f"0..{n_model_layers - 1}"
    return ", ".join(map(str, layers))
