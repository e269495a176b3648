"""Downstream experiments with seeds and paired tests: `run_calibration` (does isotropy calibration
help a task? Ding et al. 2022) and `run_layers` (which layer or learned layer mix serves a task?
Peters et al. 2018), and `run_wsd` (Peters et al.'s word sense disambiguation per layer). The first two write results.json (records + summaries), results.md and figures to their
folder, cache frozen features there, and skip finished (configuration, seed) cells when re-run.
See docs/experiments.md."""

from __future__ import annotations

from lmgeom.stages.experiments.calibration import run_calibration
from lmgeom.stages.experiments.core import ExperimentOptions, ExperimentResult
from lmgeom.stages.experiments.layers import run_layers
from lmgeom.stages.experiments.wsd import run_wsd

__all__ = ["ExperimentOptions", "ExperimentResult", "run_calibration", "run_layers", "run_wsd"]
