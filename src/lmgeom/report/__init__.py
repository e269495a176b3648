"""Reports of runs: figures (PNG, SVG), a self-contained HTML page per run, and comparisons of runs."""

from __future__ import annotations

from lmgeom.report.build import build_report
from lmgeom.report.compare import build_comparison
from lmgeom.report.data import RunData, load_run

__all__ = ["RunData", "build_comparison", "build_report", "load_run"]
