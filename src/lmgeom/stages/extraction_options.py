"""The extraction stage's options (`ExtractionOptions`) and the defaults that depend on the model
and the corpus; `lmgeom.stages.extraction` and the sharded engine (`lmgeom.stages.distributed`) both
take them."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Mapping

import numpy as np

from lmgeom.corpus import require_count
from lmgeom.errors import InputError
from lmgeom.store import layout
from lmgeom.layerspec import select_layers
from lmgeom.sitespec import DEFAULT_SITE, parse_sites
from lmgeom.controlspec import check_control, check_control_seed, control_settings


@dataclass(frozen=True)
class ExtractionOptions:
    """The extraction stage's options, built once (by the CLI from its flags, by `run` from keywords)
    and passed whole to `extract`, `extract_model` and the sharded engine (the model's own options
    are `EncoderOptions`).

    Which sentences: `field`, `pretokenized`, `limit`, `sample`, `seed` (as `load_corpus`). What is
    stored: `storage_dtype` (float32 or float16: the dtype of the stored vectors; the model computes in
    `EncoderOptions.compute_dtype`), `store_layers` (`lmgeom.layerspec.select_layers`: None or "all", "last",
    "0,6,12", "0-3,last", "every:K"; the model's numbering, layer 0 = embedding output), `sites` (where
    in each block the vectors are taken, `lmgeom.sitespec.parse_sites`: "resid_post", the default, or
    several, "resid_pre,attn_out,mlp_out"; `resid_post` is always stored), `compress`; `control` (None: the
    model itself; "random-init": the model's configuration with random weights; "shuffled": each
    sentence's words shuffled; `lmgeom.controlspec`) with its `control_seed`.
    How: `chunk_sentences` (sentences per committed chunk, the unit of resuming; default
    `default_chunk_sentences`), `sort_window` (sentences sorted by length together into the forward
    batches, a multiple of `chunk_sentences`; default `default_sort_window`: the whole corpus when its
    vectors fit the memory budget), `engine` with `ray_address`, `num_workers`, `gpus_per_worker` and
    `shard_sentences` (`lmgeom.stages.distributed`). `to_settings` is what a store records of them once
    resolved for a model and corpus (`resolve`); `from_settings` rebuilds them from a store's meta."""

    field: str = "text"
    pretokenized: bool = False
    limit: int | None = None
    sample: int | None = None
    seed: int = 0
    storage_dtype: str = "float32"
    store_layers: str | tuple[int, ...] | None = None
    sites: str | tuple[str, ...] | None = None
    compress: str | None = None
    chunk_sentences: int | None = None
    sort_window: int | None = None
    engine: str = "local"
    ray_address: str | None = None
    num_workers: int = 1
    gpus_per_worker: float = 0.0
    shard_sentences: int | None = None
    control: str | None = None
    control_seed: int = 0

    def __post_init__(self) -> None:
        check_control(self.control)
        check_control_seed(self.control_seed)
        require_count(self.limit, "limit")
        require_count(self.sample, "sample")
        if self.storage_dtype not in layout.STORAGE_DTYPES:
            raise InputError(f"`storage_dtype` must be one of {', '.join(layout.STORAGE_DTYPES)}; got {self.storage_dtype!r}",
                             param="storage_dtype")
        layout.compressors(self.compress)  # an unknown codec is refused before the model loads
        for name in ("chunk_sentences", "sort_window", "shard_sentences"):
            require_count(getattr(self, name), name)
        if self.chunk_sentences and self.sort_window and self.sort_window % self.chunk_sentences:
            raise InputError(f"`sort_window` ({self.sort_window}) must be a multiple of `chunk_sentences` "
                             f"({self.chunk_sentences})", param=("sort_window", "chunk_sentences"))
        object.__setattr__(self, "sites", parse_sites(self.sites))
        if not isinstance(self.store_layers, (str, type(None))):
            object.__setattr__(self, "store_layers", tuple(int(layer) for layer in self.store_layers))

    @classmethod
    def of(cls, options: ExtractionOptions | None = None, **keywords: Any) -> ExtractionOptions:
        """`options` (default: the defaults) with the fields given as keywords replaced."""
        unknown = sorted(set(keywords) - set(EXTRACTION_OPTIONS))
        if unknown:
            raise InputError(f"unknown extraction option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; the options "
                             f"are {', '.join(EXTRACTION_OPTIONS)}", param=tuple(unknown))
        return replace(options or cls(), **keywords)

    def resolve(self, n_layers: int, dim: int, n_sentences: int, *, sort_window: int | str | None = None) -> ExtractionOptions:
        """These options with the defaults that depend on the model (`n_layers` × `dim`) and the corpus
        size filled in: the stored layers as a tuple, `chunk_sentences` and `sort_window` (`sort_window`
        "chunk" here: one chunk)."""
        layers = tuple(select_layers(self.store_layers, range(n_layers), n_layers=n_layers, param="store_layers"))
        chunk = self.chunk_sentences or default_chunk_sentences(len(layers), dim, n_sentences)
        window = (chunk if sort_window == "chunk" else int(sort_window) if sort_window else
                  self.sort_window or default_sort_window(len(layers), dim, n_sentences, chunk))
        if window % chunk:
            raise InputError(f"`sort_window` ({window}) must be a multiple of `chunk_sentences` ({chunk})",
                             param=("sort_window", "chunk_sentences"))
        return replace(self, store_layers=layers, chunk_sentences=chunk, sort_window=window)

    def to_settings(self) -> dict[str, Any]:
        """What a store records of these (resolved) options: those that change what it holds."""
        return {
            "dtype": self.storage_dtype,
            "stored_layers": list(self.store_layers) if isinstance(self.store_layers, tuple) else self.store_layers,
            "chunk_sentences": self.chunk_sentences,
            "sort_window": self.sort_window,
            **({"compressor": self.compress} if self.compress is not None else {}),
            **({"shard_sentences": self.shard_sentences} if self.shard_sentences is not None else {}),
            **({"control": control_settings(self.control, self.control_seed)} if self.control is not None else {}),
        }

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], **keywords: Any) -> ExtractionOptions:
        """The resolved options a store's settings record (its meta.json), with `keywords` for the
        rest (which sentences: the store records the corpus's fingerprint, not how it was chosen)."""
        window = settings.get("sort_window", settings.get("chunk_sentences"))  # stores written before windows: one chunk
        recorded = cls(pretokenized=bool(settings.get("pretokenized", False)), storage_dtype=str(settings["dtype"]),
                       store_layers=tuple(layout.stored_layers(settings)), compress=settings.get("compressor"),
                       chunk_sentences=settings.get("chunk_sentences"), sort_window=window,
                       shard_sentences=settings.get("shard_sentences"),
                       sites=tuple(settings["sites"]) if isinstance(settings.get("sites"), dict) else None,
                       **({"control": control["name"], "control_seed": int(control["seed"])}
                          if isinstance(control := settings.get("control"), dict) else {}))
        return cls.of(recorded, **keywords)


    @property
    def captures_sites(self) -> bool:
        """Whether these options store sites besides `resid_post` (a store of `resid_post` only is
        written, and records its settings, as it always was)."""
        return self.sites != (DEFAULT_SITE,)


EXTRACTION_OPTIONS = tuple(field.name for field in fields(ExtractionOptions))


def split_options(keywords: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Keywords of `extract_model` and `run` as (extraction options, encoder options), by field name."""
    from lmgeom.encoders.options import OPTION_NAMES

    extraction = {key: value for key, value in keywords.items() if key in EXTRACTION_OPTIONS}
    encoder = {key: value for key, value in keywords.items() if key not in EXTRACTION_OPTIONS}
    unknown = sorted(set(encoder) - set(OPTION_NAMES))
    if unknown:
        raise InputError(f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; the extraction options are "
                         f"{', '.join(EXTRACTION_OPTIONS)} and the encoder options {', '.join(OPTION_NAMES)}",
                         param=tuple(unknown))
    return extraction, encoder


def default_chunk_sentences(n_layers: int, dim: int, n_sentences: int, *, budget_mb: int = 512) -> int:
    """Sentences per committed chunk (the unit of resuming) so that a chunk's float32 vectors (about 32
    words a sentence) take about `budget_mb`, as a power of two in [64, 4096]; a small corpus still
    gets about 4 chunks (the smallest power of two >= n_sentences / 4), so an interrupted run loses
    little. The forward batches are sorted across a wider window (`default_sort_window`)."""
    by_memory = min(4096, max(64, 2 ** int(np.log2(budget_mb * 2**20 / (n_layers * dim * 4 * 32)))))
    four_chunks = max(64, 2 ** int(np.ceil(np.log2(max(1, -(-n_sentences // 4))))))
    return int(min(by_memory, four_chunks))


def default_sort_window(n_layers: int, dim: int, n_sentences: int, chunk_sentences: int, *, budget_mb: int = 1024) -> int:
    """Sentences sorted by length together into forward batches: the whole corpus when its float32
    vectors (about 32 words a sentence) take at most `budget_mb`, else as many whole chunks as do
    (at least one). Wider windows pad less (on 300 Lee sentences in batches of 64, chunks of 128 pad
    SmolLM2's inputs to 1.69 times their pieces, one window to 1.27; on all 2,680, 1.63 against 1.04);
    extraction holds the vectors of two windows at a time (one encoded, one being committed)."""
    fits = int(budget_mb * 2**20 / (n_layers * dim * 4 * 32))
    chunks = max(1, min(-(-n_sentences // chunk_sentences), fits // chunk_sentences))
    return int(chunks * chunk_sentences)
