"""lmgeom: how contextual are a language model's representations, and how is their space shaped?

Top-level names are imported on first use, so `import lmgeom.metrics` does not load torch, and
`from lmgeom import load_run` (a run's results as DataFrames) loads neither torch nor matplotlib.
"""

from __future__ import annotations

import importlib
from typing import Any

from lmgeom import _lazy as lazy
from lmgeom._version import __version__

_EXPORTS = {
    "Corpus": "lmgeom.corpus",
    "Vocabulary": "lmgeom.corpus",
    "load_corpus": "lmgeom.corpus",
    "HFEncoder": "lmgeom.encoders",
    "load_encoder": "lmgeom.encoders",
    "RepresentationStore": "lmgeom.store",
    "write_store_from_arrays": "lmgeom.store",
    "extract": "lmgeom.stages",
    "run": "lmgeom.pipeline",
    "RunResult": "lmgeom.pipeline",
    "load_run": "lmgeom.report.data",
    "RunData": "lmgeom.report.data",
    "analyze_store": "lmgeom.stages",
    "run_calibration": "lmgeom.stages.experiments",
    "run_layers": "lmgeom.stages.experiments",
}
# the sub-packages a user reaches for by name: `lmgeom.experiments.run_calibration(...)`
_MODULES = {"experiments": "lmgeom.stages.experiments", "plot": "lmgeom.plot"}

__all__ = ["__version__", *_EXPORTS, *_MODULES]


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    return lazy.load(__name__, _EXPORTS, name)


def __dir__() -> list[str]:
    """The public names (`dir(lmgeom)`, tab completion), not the module's own imports."""
    return sorted(__all__)
