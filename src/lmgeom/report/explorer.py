"""The word explorer's data file, as the report reads it (the driver computes it: `lmgeom.pipeline.explorer`)."""

from __future__ import annotations

from typing import Any

from lmgeom.metrics.spectrum import MEV_VARIANTS
from lmgeom.rundir import EXPLORER, Where, read_json

# the per-word metrics the explorer shows across layers (columns of contextuality_words.csv)
WORD_COLUMNS = ("self_similarity", "self_similarity_adjusted",
                *(f"mev_{v}{suffix}" for v in MEV_VARIANTS for suffix in ("", "_adjusted")))
# the ones its chart of a word draws across layers
CHART_COLUMNS = ("self_similarity", "self_similarity_adjusted", *(f"mev_{v}" for v in MEV_VARIANTS))


def read_explorer(run_dir: Where) -> dict[str, Any] | None:
    """The explorer payload cached in RUN/explorer.json, or None when there is none."""
    document = read_json(EXPLORER.at(run_dir), EXPLORER.kind)
    return None if document is None else dict(document["data"])
