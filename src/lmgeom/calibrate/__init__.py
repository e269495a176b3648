"""Isotropy calibrators as scikit-learn transformers.

`AllButTheTop`, `Whitening`, `Standardize`, `ConceptorNegation` (mean/covariance only: `partial_fit`
and `fit_moments`),
`ClusterIsotropy` (CIE) and `FlowCalibrator` (Glow-style normalizing flow). Each takes numpy or
torch input (torch in, torch out), and saves with `.save(path)` / loads with `load_calibrator(path)`
or `<Class>.load(path)`. Fitting them on a store is `lmgeom.runs.calibrate_store`.
Method notes: docs/calibration.md.
"""

from __future__ import annotations

from lmgeom.calibrate._base import Calibrator
from lmgeom.calibrate.cluster import ClusterIsotropy
from lmgeom.calibrate.conceptor import ConceptorNegation
from lmgeom.calibrate.flow import FlowCalibrator
from lmgeom.calibrate.io import load_calibrator, save_calibrator
from lmgeom.calibrate.linear import AllButTheTop, Standardize, Whitening

METHODS: dict[str, type[Calibrator]] = {
    "whitening": Whitening,
    "abtt": AllButTheTop,
    "cie": ClusterIsotropy,
    "flow": FlowCalibrator,
    "standardize": Standardize,
    "conceptor": ConceptorNegation,
}


def make_calibrator(method: str, *, seed: int = 0) -> Calibrator:
    """A calibrator with its default settings by CLI name (whitening, abtt, cie, flow, standardize, conceptor)."""
    if method not in METHODS:
        raise ValueError(f"unknown calibration method {method!r}; choose from {', '.join(METHODS)}")
    estimator = METHODS[method]()
    if "random_state" in estimator.get_params():
        estimator.set_params(random_state=seed)
    return estimator


__all__ = [
    "METHODS",
    "AllButTheTop",
    "Calibrator",
    "ClusterIsotropy",
    "ConceptorNegation",
    "FlowCalibrator",
    "Standardize",
    "Whitening",
    "load_calibrator",
    "make_calibrator",
    "save_calibrator",
]
