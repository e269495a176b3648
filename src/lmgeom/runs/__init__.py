"""The driver: everything that reads or writes a run directory.

A run directory is a representation store (written by `extract`) plus the result files the other
drivers write next to it: `analyze_store` (contextuality.json and CSVs), `export_static_embeddings`
(static/), `calibrate_store` (calibration.json, calibrators/), and `run`, the main job. `run_sts`
evaluates sentence similarity straight from a model. Every analysis of a store runs on the analysis
engine (`engine/`: plan, tasks, executors), which chooses rows with the one row selection
(`selection.py`) and streams a store layer through accumulators with the one loop (`tally.py`);
the metrics, calibrators and benchmark scorers it calls are pure.
"""

from __future__ import annotations

from typing import Any

from lmgeom import _lazy as lazy
from lmgeom.progress import NoProgress, Progress
# imported now: the function `tally` must shadow its module's name before anything imports the module
from lmgeom.runs.tally import Feed, tally

# the rest on first use, so that a process that needs one driver (an analysis worker, a CLI command)
# does not load torch, gensim and the report's libraries for the others
_EXPORTS = {
    **dict.fromkeys(["analyze_shard", "analyze_store", "finish_analysis"], "lmgeom.runs.analysis"),
    **dict.fromkeys(["AnalysisOptions", "AnalysisState", "Statistic", "plan_analysis", "register_statistic", "run_analysis"],
                    "lmgeom.runs.engine"),
    "ContextualityResult": "lmgeom.runs.contextuality",
    **dict.fromkeys(["CalibrationOptions", "calibrate_store", "fit_store"], "lmgeom.runs.calibration"),
    "ExtractionOptions": "lmgeom.runs.extraction_options",
    **dict.fromkeys(["default_run_dir", "extract", "extract_model", "open_or_extract"], "lmgeom.runs.extraction"),
    "render_report": "lmgeom.runs.reporting",
    "render_comparison": "lmgeom.runs.reporting",
    **dict.fromkeys(["RunResult", "layer_summary", "run"], "lmgeom.runs.job"),
    **dict.fromkeys(["RowSelection", "WordSelection", "select_rows", "select_words"], "lmgeom.runs.selection"),
    **dict.fromkeys(["StaticEmbeddings", "benchmark_static_embeddings", "export_static_embeddings", "static_embeddings"],
                    "lmgeom.runs.static"),
    **dict.fromkeys(["STSRun", "evaluate_sts", "run_sts"], "lmgeom.runs.sts"),
}


def __getattr__(name: str) -> Any:
    return lazy.load(__name__, _EXPORTS, name)


__all__ = ["Feed", "NoProgress", "Progress", "tally", *_EXPORTS]
