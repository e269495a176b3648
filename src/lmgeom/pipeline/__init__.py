"""The pipeline: `run`, the main job (extract, then every stage in order, then the report), and the
report's orchestration over a run directory (`render_report`, `render_comparison`, the word explorer).
It is the one layer that imports both the stages and `lmgeom.report`.
"""

from __future__ import annotations

from typing import Any

from lmgeom import _lazy as lazy

_EXPORTS = {
    **dict.fromkeys(["RunResult", "layer_summary", "run"], "lmgeom.pipeline.job"),
    **dict.fromkeys(["render_report", "render_comparison"], "lmgeom.pipeline.reporting"),
}


def __getattr__(name: str) -> Any:
    return lazy.load(__name__, _EXPORTS, name)


__all__ = list(_EXPORTS)
