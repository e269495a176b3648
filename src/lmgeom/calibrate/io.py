"""Saving and loading fitted calibrators.

Array-based calibrators are one `.npz` file: every fitted attribute as an array plus a JSON header
(class name, constructor parameters, lmgeom version). The flow is one `.pt` file: the same header
and the module's state dict, read back with `torch.load(weights_only=True)` so loading never runs
pickled code.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from lmgeom.errors import InputError
from lmgeom._version import __version__
from lmgeom.atomic import atomic_write

if TYPE_CHECKING:
    from lmgeom.calibrate._base import Calibrator

FORMAT_VERSION = 1
SUFFIXES = {"npz": ".npz", "torch": ".pt"}
_REGISTRY: dict[str, type["Calibrator"]] = {}


def register(cls: type["Calibrator"]) -> type["Calibrator"]:
    """Class decorator: lets `load_calibrator` rebuild instances of `cls` by name."""
    _REGISTRY[cls.__name__] = cls
    return cls


def calibrator_path(estimator: "Calibrator", path: str | os.PathLike) -> Path:
    """`path` with the suffix the estimator's file format needs (added when missing)."""
    path = Path(path)
    suffix = SUFFIXES[estimator._save_format]
    return path if path.suffix == suffix else path.with_name(path.name + suffix)


def save_calibrator(estimator: "Calibrator", path: str | os.PathLike) -> Path:
    """Write a fitted calibrator; returns the path written (suffix added when missing)."""
    path = calibrator_path(estimator, path)
    header = {
        "class": type(estimator).__name__,
        "params": estimator.get_params(),
        "lmgeom_version": __version__,
        "format_version": FORMAT_VERSION,
    }
    state = estimator._fitted_state()

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as handle:
            if estimator._save_format == "torch":
                torch.save({"header": header, "state": state}, handle)
            else:
                np.savez(handle, __header__=np.array(json.dumps(header)), **state)

    return atomic_write(path, write)


def load_calibrator(path: str | os.PathLike) -> "Calibrator":
    """Rebuild a fitted calibrator written by `save_calibrator` (either format)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no saved calibrator at {path}")
    if path.suffix == SUFFIXES["torch"]:
        bundle = torch.load(path, map_location="cpu", weights_only=True)
        header, state = bundle["header"], bundle["state"]
    else:
        with np.load(path, allow_pickle=False) as arrays:
            header = json.loads(str(arrays["__header__"]))
            state = {name: arrays[name] for name in arrays.files if name != "__header__"}
    if header.get("format_version") != FORMAT_VERSION:
        raise InputError(f"{path} has calibrator format {header.get('format_version')}, this lmgeom reads {FORMAT_VERSION}")
    cls = _REGISTRY.get(header["class"])
    if cls is None:
        raise InputError(f"{path} holds a {header['class']}, which is not a known calibrator ({sorted(_REGISTRY)})")
    estimator = cls(**header["params"])
    estimator._set_fitted_state(state)
    return estimator


def scalar_or_array(value: Any) -> Any:
    """0-d arrays back to Python scalars (npz stores every value as an array)."""
    return value.item() if isinstance(value, np.ndarray) and value.ndim == 0 else value
