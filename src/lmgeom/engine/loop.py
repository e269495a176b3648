"""The one loop that streams a store layer, or a range of its rows, through accumulators.

After baukit's `tally`: each `Feed` names an accumulator, the rows it takes (a boolean mask over the
store's rows) and its per-row labels (arrays over the store's rows, e.g. `word_ids`); `tally` reads
the layer once, chunk by chunk, and hands every accumulator its rows of each chunk.

Each chunk becomes one float64 `RowBlock` (norms computed and NaN/inf checked once) in a reused
buffer, on the CPU with numpy or on a torch device (`device`). Accumulators that read blocks
(`add_block`) take their rows of it by mask, without a copy; any other accumulator gets a float64
numpy copy of its rows, or, when its feed says `stored_rows` (MEV), a copy of its rows as stored:
float32 (float16 widened to float32, exactly), half the bytes of float64. Accumulators must not keep
references to the rows they are handed. A pass whose feeds all take stored rows builds no float64
block; it checks the chunk for NaN/inf instead.

`aligned_tally` streams several aligned `Stream`s at once (two layers of one store, or layers of
two stores at matched rows: row i of each is the same point) into accumulators of pairs of them.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Protocol, Sequence

import numpy as np
from threadpoolctl import threadpool_limits

from lmgeom.errors import InputError
from lmgeom.metrics.base import BlockAccumulator, NonFiniteRows, RowBlock, as_float64_rows
from lmgeom.store import RepresentationStore

# rows per chunk read from the store: 16k x 768 float64 is 100 MB, held once (the block) plus each
# non-block accumulator's masked copy
DEFAULT_CHUNK_ROWS = 16384


class RowSink(Protocol):
    """What `tally` hands rows to: an `Accumulator`, or anything else that takes rows and their
    labels (`lmgeom.engine.spool.RowSpool`, which keeps them on disk for a later step)."""

    def add(self, X: Any, /, **ids: np.ndarray) -> Any: ...


@dataclass
class Feed:
    """An accumulator (or any `RowSink`), the store rows it takes (None: every row), and its labels
    per store row. `stored_rows`: it gets its rows as stored (`stored_float_rows`) instead of float64;
    only for sinks that do not read blocks and keep float32 rows exact (MEV, and its spools)."""

    accumulator: RowSink
    mask: np.ndarray | None = None
    ids: Mapping[str, np.ndarray] = field(default_factory=dict)
    stored_rows: bool = False


def row_range(store: RepresentationStore, rows: range | tuple[int, int] | None) -> range:
    """A checked range of store rows (all rows when None)."""
    if rows is None:
        return range(store.n_tokens)
    start, stop = (rows.start, rows.stop) if isinstance(rows, range) else rows
    if not 0 <= start <= stop <= store.n_tokens:
        raise InputError(f"row range [{start}, {stop}) is outside the store's rows [0, {store.n_tokens})")
    return range(start, stop)


def stored_chunks(store: RepresentationStore, layer: int, *, rows: range | tuple[int, int] | None = None,
                  chunk_rows: int = DEFAULT_CHUNK_ROWS, read_ahead: bool = True) -> Iterator[tuple[int, np.ndarray]]:
    """(start_row, rows as stored: float32 or float16) of a layer over `rows`: one streaming read.

    Chunks end on the store's own chunk boundaries (`chunk_rows` rounded to a multiple of them), so
    no stored chunk is read twice; with `read_ahead` the next chunk is read in a thread while the
    caller works on this one."""
    span = row_range(store, rows)
    array = store.layer(layer)
    stored_rows = int(array.chunks[0])
    step = max(stored_rows, chunk_rows // stored_rows * stored_rows)
    edges = [span.start, *range((span.start // step + 1) * step, span.stop, step), span.stop]
    bounds = list(zip(edges[:-1], edges[1:])) if len(span) else []

    def read(bound: tuple[int, int]) -> np.ndarray:
        return np.asarray(array[bound[0] : bound[1]])

    if not read_ahead:
        for bound in bounds:
            yield bound[0], read(bound)
        return
    with ThreadPoolExecutor(max_workers=1) as reader:
        pending = reader.submit(read, bounds[0]) if bounds else None
        for index, bound in enumerate(bounds):
            assert pending is not None
            chunk = pending.result()
            pending = reader.submit(read, bounds[index + 1]) if index + 1 < len(bounds) else None
            yield bound[0], chunk


def _stored_float_dtype(dtype: np.dtype) -> type[np.floating]:
    """float32 for float16 (widened exactly) and float32 stores, float64 for anything else."""
    return np.float32 if dtype in (np.float16, np.float32) else np.float64


def stored_float_rows(chunk: np.ndarray) -> np.ndarray:
    """Rows as stored, for accumulators that keep float32 exact: float32 as it is, float16 widened to
    float32 (exact), anything else float64."""
    return chunk.astype(_stored_float_dtype(chunk.dtype), copy=False)


def require_finite(store: RepresentationStore, layer: int, chunk: np.ndarray, row_offset: int) -> None:
    """NaN/inf in stored rows is an error naming the layer and store rows (`damaged_rows`), without a
    float64 copy of rows that have none."""
    if not np.isfinite(chunk).all():
        with blaming(store, layer):
            as_float64_rows(chunk, name=f"layer {layer} of {store.url}", layer=layer, row_offset=row_offset)


@contextmanager
def blaming(store: RepresentationStore, layer: int) -> Iterator[None]:
    """Non-finite rows read from `store` are `damaged_rows`: the model's NaN/inf never reaches a
    store (its writer refuses them), so they come from a damaged chunk file (or float16 overflow)."""
    try:
        yield
    except NonFiniteRows as error:
        raise damaged_rows(store, layer, error) from None


def damaged_rows(store: RepresentationStore, layer: int, error: NonFiniteRows) -> InputError:
    """The error for non-finite values in stored rows: which rows, and what to do."""
    shown = ", ".join(map(str, error.rows)) + (f" and {error.count - len(error.rows)} more" if error.count > len(error.rows) else "")
    message = (f"non-finite values (NaN or inf) in layer {layer} row{'s' if error.count > 1 else ''} {shown} of {store.url}: "
               f"the store's chunk file may be damaged; run `lmgeom verify {store.url}` (lmgeom.store.verify_store)")
    if store.layer(layer).dtype == np.float16:
        message += ("; in this float16 store a value may also have overflowed float16 during extraction: "
                    "re-extract with `dtype='float32'`")
    return InputError(message, param="dtype")


def stored_row_bytes(store: RepresentationStore) -> int:
    """Bytes of one value of a row of `store` as `stored_float_rows` hands it on (4 or 8)."""
    return np.dtype(_stored_float_dtype(store.layer(store.layers[0]).dtype)).itemsize


def layer_chunks(store: RepresentationStore, layer: int, *, rows: range | tuple[int, int] | None = None,
                 chunk_rows: int = DEFAULT_CHUNK_ROWS) -> Iterator[tuple[int, np.ndarray]]:
    """(start_row, float64 rows) of a layer over `rows`; NaN/inf is an error naming the layer and store row."""
    for start, chunk in stored_chunks(store, layer, rows=rows, chunk_rows=chunk_rows):
        with blaming(store, layer):
            rows_64 = as_float64_rows(chunk, name=f"layer {layer} of {store.url}", layer=layer, row_offset=start)
        yield start, rows_64


class _Float64Rows:
    """Stored rows as float64 on the analysis device, in one buffer reused across chunks (a fresh
    100 MB array per chunk costs more in page faults than the conversion itself)."""

    def __init__(self, device: str) -> None:
        self.target: Any = None
        if device != "cpu":
            from lmgeom.device import resolve_analysis_device

            self.target = resolve_analysis_device(device)
        self.buffer: Any = None

    def __call__(self, chunk: np.ndarray) -> Any:
        if self.target is None:
            if self.buffer is None or self.buffer.shape[0] < len(chunk) or self.buffer.shape[1] != chunk.shape[1]:
                self.buffer = np.empty(chunk.shape, dtype=np.float64)
            rows = self.buffer[: len(chunk)]
            np.copyto(rows, chunk)
            return rows
        import torch

        return torch.from_numpy(chunk).to(self.target).to(torch.float64)


def tally(store: RepresentationStore, layer: int, feeds: Sequence[Feed], *, rows: range | tuple[int, int] | None = None,
          chunk_rows: int = DEFAULT_CHUNK_ROWS, device: str = "cpu") -> None:
    """Stream `layer` (over `rows`, default all) once through every feed's accumulator.

    `device`: where block-reading accumulators compute: `cpu` (numpy), `cuda`/`cuda:N` (torch,
    float64 on that GPU), `auto` (CUDA when present, else numpy), `torch:cpu` (the GPU's code path
    on the CPU). Other accumulators always get numpy rows."""
    to_float64 = _Float64Rows(device)
    name = f"layer {layer} of {store.url}"
    needs_block = not all(feed.stored_rows for feed in feeds)
    # BLAS threads gain nothing on these memory-bound products and lose much to contention on a busy machine
    with threadpool_limits(limits=1, user_api="blas"):
        for start, chunk in stored_chunks(store, layer, rows=rows, chunk_rows=chunk_rows):
            block: RowBlock | None = None
            if needs_block:
                with blaming(store, layer):
                    block = RowBlock(to_float64(chunk), name=name, layer=layer, row_offset=start)
            else:
                require_finite(store, layer, chunk, start)
            _feed_chunk(feeds, start, chunk, block, on_host=to_float64.target is None)


def _feed_chunk(feeds: Sequence[Feed], start: int, chunk: np.ndarray, block: RowBlock | None, *, on_host: bool) -> None:
    """Every feed's rows of one stored chunk: block readers read `block` (the chunk as float64, None
    only when every feed takes stored rows); the others get numpy rows, float64 (from `block` when it
    is on the host) or as stored (`stored_float_rows`), as their feed asks."""
    stop = start + len(chunk)
    keeps: dict[int, np.ndarray | None] = {}  # feeds sharing a mask share its chunk slice
    host_rows: dict[tuple[int, bool], np.ndarray] = {}  # and, per row type, their rows
    for feed in feeds:
        if feed.mask is None:
            keep = None
        else:
            if id(feed.mask) not in keeps:
                chunk_mask = feed.mask[start:stop]
                keeps[id(feed.mask)] = None if chunk_mask.all() else chunk_mask
            keep = keeps[id(feed.mask)]
        n_kept = len(chunk) if keep is None else int(np.count_nonzero(keep))
        if n_kept == 0:
            continue
        ids = {name: (labels[start:stop] if keep is None else labels[start:stop][keep]) for name, labels in feed.ids.items()}
        if isinstance(feed.accumulator, BlockAccumulator) and not feed.stored_rows:
            assert block is not None
            feed.accumulator.add_block(block, keep, **ids)
            continue
        key = (id(feed.mask), feed.stored_rows)
        if key not in host_rows:
            if feed.stored_rows:
                X = stored_float_rows(chunk if keep is None else chunk[keep])
            else:
                assert block is not None
                X = block.X if on_host else chunk.astype(np.float64)
                X = X if keep is None else X[keep]
            host_rows[key] = X
        feed.accumulator.add(host_rows[key], **ids)


# ---------------------------------------------------------------------------------------------
# aligned streams: rows of several layers (of one store or of two) that hold the same points


def read_rows(store: RepresentationStore, layer: int, rows: np.ndarray) -> np.ndarray:
    """Float64 rows `rows` (ascending store rows) of a layer: dense rows (a chunk of matched rows)
    in one contiguous read, sparse ones (a subsample) from only the chunks they touch; NaN/inf is an
    error naming the layer and row."""
    span = int(rows[-1]) - int(rows[0]) + 1
    if span <= 2 * len(rows):
        block = np.asarray(store.layer(layer)[int(rows[0]) : int(rows[-1]) + 1])[rows - rows[0]]
    else:
        block = store.rows(layer, rows)
    with blaming(store, layer):
        return as_float64_rows(block, name=f"layer {layer} of {store.url}", layer=layer)


@dataclass
class Stream:
    """The rows `rows` (ascending store rows) of one layer of a store, less `shift` (None: as they
    are); the streams of one `aligned_tally` hold as many rows, row i of each the same point."""

    store: RepresentationStore
    layer: int
    rows: np.ndarray
    shift: np.ndarray | None = None


@dataclass
class AlignedFeed:
    """An accumulator fed `add(X, **paired, **options)`: X the chunk of stream `x`, each `paired`
    keyword the same points' chunk of another stream."""

    accumulator: Any
    x: int
    paired: Mapping[str, int] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)


def aligned_tally(streams: Sequence[Stream], feeds: Sequence[AlignedFeed], *, chunk_rows: int = DEFAULT_CHUNK_ROWS,
                  device: str = "cpu") -> None:
    """Stream aligned `streams` together, `chunk_rows` points at a time, through every feed: each
    chunk of each stream is read once, shifted once and handed to every feed that takes it (numpy
    float64 on `cpu`, else a torch float64 tensor on the device `resolve_analysis_device` names)."""
    if len({len(stream.rows) for stream in streams}) > 1:
        raise ValueError(f"aligned streams hold as many rows; got {[len(stream.rows) for stream in streams]}")
    target: Any = None
    if device != "cpu":
        from lmgeom.device import resolve_analysis_device

        target = resolve_analysis_device(device)
    n = len(streams[0].rows) if streams else 0
    # BLAS keeps its threads (unlike `tally`): the d x d products of pairs are compute-bound
    for start in range(0, n, chunk_rows):
        blocks: list[Any] = []
        for stream in streams:
            X = read_rows(stream.store, stream.layer, stream.rows[start : start + chunk_rows])
            if stream.shift is not None:
                X -= stream.shift
            if target is None:
                blocks.append(X)
            else:
                import torch

                blocks.append(torch.from_numpy(X).to(target))
        for feed in feeds:
            feed.accumulator.add(blocks[feed.x], **{name: blocks[index] for name, index in feed.paired.items()},
                                 **feed.options)
