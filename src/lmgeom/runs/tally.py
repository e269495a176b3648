"""The one loop that streams a store layer, or a range of its rows, through accumulators.

After baukit's `tally`: each `Feed` names an accumulator, the rows it takes (a boolean mask over the
store's rows) and its per-row labels (arrays over the store's rows, e.g. `word_ids`); `tally` reads
the layer once, chunk by chunk in float64, and hands every accumulator its rows of each chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Mapping, Sequence

import numpy as np

from lmgeom.metrics.base import Accumulator, as_float64_rows
from lmgeom.store import RepresentationStore

# rows per chunk read from the store: 16k x 768 float64 is 100 MB, and a few masked copies of it exist at once
DEFAULT_CHUNK_ROWS = 16384


@dataclass
class Feed:
    """An accumulator, the store rows it takes (None: every row), and its labels per store row."""

    accumulator: Accumulator
    mask: np.ndarray | None = None
    ids: Mapping[str, np.ndarray] = field(default_factory=dict)


def row_range(store: RepresentationStore, rows: range | tuple[int, int] | None) -> range:
    """A checked range of store rows (all rows when None)."""
    if rows is None:
        return range(store.n_tokens)
    start, stop = (rows.start, rows.stop) if isinstance(rows, range) else rows
    if not 0 <= start <= stop <= store.n_tokens:
        raise ValueError(f"row range [{start}, {stop}) is outside the store's rows [0, {store.n_tokens})")
    return range(start, stop)


def layer_chunks(store: RepresentationStore, layer: int, *, rows: range | tuple[int, int] | None = None,
                 chunk_rows: int = DEFAULT_CHUNK_ROWS) -> Iterator[tuple[int, np.ndarray]]:
    """(start_row, float64 rows) of a layer over `rows`; NaN/inf is an error naming the layer and store row."""
    span = row_range(store, rows)
    array = store.layer(layer)
    for start in range(span.start, span.stop, chunk_rows):
        chunk = np.asarray(array[start : min(start + chunk_rows, span.stop)])
        yield start, as_float64_rows(chunk, name=f"layer {layer} of {store.url}", layer=layer, row_offset=start)


def tally(store: RepresentationStore, layer: int, feeds: Sequence[Feed], *, rows: range | tuple[int, int] | None = None,
          chunk_rows: int = DEFAULT_CHUNK_ROWS) -> None:
    """Stream `layer` (over `rows`, default all) once through every feed's accumulator."""
    for start, X in layer_chunks(store, layer, rows=rows, chunk_rows=chunk_rows):
        stop = start + len(X)
        selected: dict[int, tuple[np.ndarray | None, np.ndarray]] = {}  # feeds sharing a mask share its rows
        for feed in feeds:
            if feed.mask is None:
                keep, X_kept = None, X
            else:
                if id(feed.mask) not in selected:
                    chunk_mask = feed.mask[start:stop]
                    selected[id(feed.mask)] = (chunk_mask, X if chunk_mask.all() else X[chunk_mask])
                keep, X_kept = selected[id(feed.mask)]
            if len(X_kept) == 0:
                continue
            ids = {name: (labels[start:stop] if keep is None else labels[start:stop][keep]) for name, labels in feed.ids.items()}
            feed.accumulator.add(X_kept, **ids)
