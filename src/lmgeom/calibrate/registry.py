"""The calibrators by CLI name, and `make_calibrator`."""

from __future__ import annotations

from lmgeom.errors import InputError
from lmgeom.calibrate import METHOD_NAMES
from lmgeom.calibrate._base import Calibrator
from lmgeom.calibrate.cluster import ClusterIsotropy
from lmgeom.calibrate.conceptor import ConceptorNegation
from lmgeom.calibrate.flow import FlowCalibrator
from lmgeom.calibrate.linear import AllButTheTop, Standardize, Whitening

METHODS: dict[str, type[Calibrator]] = dict(zip(
    METHOD_NAMES, (Whitening, AllButTheTop, ClusterIsotropy, FlowCalibrator, Standardize, ConceptorNegation), strict=True,
))


def make_calibrator(method: str, *, seed: int = 0) -> Calibrator:
    """A calibrator with its default settings by CLI name (whitening, abtt, cie, flow, standardize, conceptor)."""
    if method not in METHODS:
        raise InputError(f"unknown calibration method {method!r}; choose from {', '.join(METHODS)}")
    estimator = METHODS[method]()
    if "random_state" in estimator.get_params():
        estimator.set_params(random_state=seed)
    return estimator
