"""The stages: each reads a store (or a model) and writes its result files into the run directory.

`extract` writes the store; `analyze_store` (contextuality.json and CSVs), `export_static_embeddings`
(static/), `calibrate_store` (calibration.json, calibrators/), the isotropy, similarity and geometry
stages and the experiments read it. `run_sts` evaluates sentence similarity straight from a model.
Every analysis of a store runs on the analysis engine (`lmgeom.engine`); the result files' schema is
`lmgeom.rundir`. The main job that runs the stages in order is `lmgeom.pipeline.run`.
"""

from __future__ import annotations

from typing import Any

from lmgeom import _lazy as lazy

# on first use, so that a process that needs one stage (an analysis worker, a CLI command) does not
# load torch, gensim and the report's libraries for the others
_EXPORTS = {
    **dict.fromkeys(["analyze_shard", "analyze_store", "finish_analysis"], "lmgeom.stages.analysis"),
    "ContextualityResult": "lmgeom.stages.contextuality",
    **dict.fromkeys(["CalibrationOptions", "calibrate_store", "fit_store"], "lmgeom.stages.calibration"),
    "ExtractionOptions": "lmgeom.stages.extraction_options",
    **dict.fromkeys(["default_run_dir", "extract", "extract_model", "open_or_extract"], "lmgeom.stages.extraction"),
    **dict.fromkeys(["StaticEmbeddings", "benchmark_static_embeddings", "export_static_embeddings", "static_embeddings"],
                    "lmgeom.stages.static"),
    **dict.fromkeys(["STSRun", "evaluate_sts", "run_sts"], "lmgeom.stages.sts"),
}


def __getattr__(name: str) -> Any:
    return lazy.load(__name__, _EXPORTS, name)


__all__ = list(_EXPORTS)
