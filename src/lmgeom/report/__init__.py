"""Reports of runs: figures (PNG, SVG), a self-contained HTML page per run, and comparisons of runs.

Names are imported on first use, so that reading a run (`load_run`) loads no plotting library.
"""

from __future__ import annotations

from typing import Any

from lmgeom import _lazy as lazy

_EXPORTS = {
    "build_report": "lmgeom.report.build",
    "build_comparison": "lmgeom.report.compare",
    "RunData": "lmgeom.report.data",
    "load_run": "lmgeom.report.data",
}


def __getattr__(name: str) -> Any:
    return lazy.load(__name__, _EXPORTS, name)


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = ["RunData", "build_comparison", "build_report", "load_run"]
