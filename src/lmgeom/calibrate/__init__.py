"""Isotropy calibrators as scikit-learn transformers, and fitting them on a representation store.

`AllButTheTop`, `Whitening`, `Standardize` (mean/covariance only: `partial_fit` and `fit_moments`),
`ClusterIsotropy` (CIE) and `FlowCalibrator` (Glow-style normalizing flow). Each takes numpy or
torch input (torch in, torch out), and saves with `.save(path)` / loads with `load_calibrator(path)`
or `<Class>.load(path)`. Method notes: docs/calibration.md.
"""

from lmgeom.calibrate._base import Calibrator
from lmgeom.calibrate.cluster import ClusterIsotropy
from lmgeom.calibrate.flow import FlowCalibrator
from lmgeom.calibrate.io import load_calibrator, save_calibrator
from lmgeom.calibrate.linear import AllButTheTop, Standardize, Whitening
from lmgeom.calibrate.pipeline import FIT_MAX_ROWS, METHODS, calibrate_store, fit_store, make_calibrator

__all__ = [
    "FIT_MAX_ROWS",
    "METHODS",
    "AllButTheTop",
    "Calibrator",
    "ClusterIsotropy",
    "FlowCalibrator",
    "Standardize",
    "Whitening",
    "calibrate_store",
    "fit_store",
    "load_calibrator",
    "make_calibrator",
    "save_calibrator",
]
