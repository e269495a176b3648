"""The driver: everything that reads or writes a run directory.

A run directory is a representation store (written by `extract`) plus the result files the other
drivers write next to it: `analyze_store` (contextuality.json and CSVs), `export_static_embeddings`
(static/), `calibrate_store` (calibration.json, calibrators/), and `run`, the main job. `run_sts`
evaluates sentence similarity straight from a model. Every driver chooses rows with the one row
selection (`selection.py`) and streams a store layer through accumulators with the one loop
(`tally.py`); the metrics, calibrators and benchmark scorers it calls are pure.
"""

from __future__ import annotations

from lmgeom.runs.analysis import (
    AnalysisOptions,
    AnalysisState,
    ContextualityResult,
    analyze_shard,
    analyze_store,
    finish_analysis,
    plan_analysis,
)
from lmgeom.runs.calibration import calibrate_store, fit_store
from lmgeom.runs.extraction import default_run_dir, extract, extract_model, open_or_extract
from lmgeom.runs.reporting import render_report
from lmgeom.runs.job import RunResult, layer_summary, run
from lmgeom.progress import NoProgress, Progress
from lmgeom.runs.selection import RowSelection, WordSelection, select_rows, select_words
from lmgeom.runs.static import StaticEmbeddings, benchmark_static_embeddings, export_static_embeddings, static_embeddings
from lmgeom.runs.sts import STSRun, evaluate_sts, run_sts
from lmgeom.runs.tally import Feed, tally

__all__ = [
    "AnalysisOptions",
    "AnalysisState",
    "ContextualityResult",
    "Feed",
    "NoProgress",
    "Progress",
    "RowSelection",
    "RunResult",
    "STSRun",
    "StaticEmbeddings",
    "WordSelection",
    "analyze_shard",
    "analyze_store",
    "benchmark_static_embeddings",
    "calibrate_store",
    "default_run_dir",
    "evaluate_sts",
    "export_static_embeddings",
    "extract",
    "extract_model",
    "finish_analysis",
    "fit_store",
    "layer_summary",
    "open_or_extract",
    "plan_analysis",
    "render_report",
    "run",
    "run_sts",
    "select_rows",
    "select_words",
    "static_embeddings",
    "tally",
]
