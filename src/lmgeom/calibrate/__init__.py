"""Isotropy calibrators as scikit-learn transformers.

`AllButTheTop`, `Whitening`, `Standardize`, `ConceptorNegation` (mean/covariance only: `partial_fit`
and `fit_moments`),
`ClusterIsotropy` (CIE) and `FlowCalibrator` (Glow-style normalizing flow). Each takes numpy or
torch input (torch in, torch out), and saves with `.save(path)` / loads with `load_calibrator(path)`
or `<Class>.load(path)`. Fitting them on a store is `lmgeom.stages.calibrate_store`.
Method notes: docs/calibration.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lmgeom import _lazy as lazy

if TYPE_CHECKING:
    from lmgeom.calibrate._base import Calibrator, load_calibrator, save_calibrator
    from lmgeom.calibrate.cluster import ClusterIsotropy
    from lmgeom.calibrate.conceptor import ConceptorNegation
    from lmgeom.calibrate.flow import FlowCalibrator
    from lmgeom.calibrate.linear import AllButTheTop, Standardize, Whitening
    from lmgeom.calibrate.registry import METHODS, make_calibrator

METHOD_NAMES = ("whitening", "abtt", "cie", "flow", "standardize", "conceptor")
"""The calibrators' CLI names, in the order `METHODS` holds them (known without importing torch)."""

DEFAULT_METHODS = ("whitening", "abtt")
"""The calibrators fitted when none are named (`lmgeom run`, `lmgeom calibrate`, `CalibrationOptions`):
the two that stream over every row and fit in seconds a layer; cie, flow, standardize and conceptor
are asked for by name (or all of them with `all`)."""

FIT_MAX_ROWS = 100_000
"""Rows (a seeded subsample) that the calibrators which do not stream (cie, flow) fit on by default."""

# the calibrators on first use: the CLI lists METHOD_NAMES without loading torch and scikit-learn
_EXPORTS = {
    **dict.fromkeys(["Calibrator", "load_calibrator", "save_calibrator"], "lmgeom.calibrate._base"),
    "ClusterIsotropy": "lmgeom.calibrate.cluster",
    "ConceptorNegation": "lmgeom.calibrate.conceptor",
    "FlowCalibrator": "lmgeom.calibrate.flow",
    **dict.fromkeys(["AllButTheTop", "Standardize", "Whitening"], "lmgeom.calibrate.linear"),
    **dict.fromkeys(["METHODS", "make_calibrator"], "lmgeom.calibrate.registry"),
}


def __getattr__(name: str) -> Any:
    return lazy.load(__name__, _EXPORTS, name)


__all__ = ["FIT_MAX_ROWS", "METHOD_NAMES", *_EXPORTS]
