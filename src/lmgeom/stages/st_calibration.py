"""A fitted lmgeom calibrator as a sentence-transformers module (the `st` extra).

`CalibrationModule` sits after a model's Pooling module and replaces `sentence_embedding` with the
calibrator's transform of it, so `SentenceTransformer(folder).encode(...)` returns calibrated
vectors. Saved as the module's `config.json` (method, constructor parameters, the layout of the
fitted state) plus `model.safetensors` (the fitted arrays): no pickle anywhere. Any calibrator of
`lmgeom.calibrate.METHODS` works; the module never looks at which one it holds.

sentence-transformers >= 6 imports a module class from outside its own package only with
`trust_remote_code=True`, so an exported model loads with
`SentenceTransformer(folder, trust_remote_code=True)` wherever lmgeom is installed.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from typing_extensions import Self

from lmgeom.errors import InputError, MissingDependency
from lmgeom._version import __version__
from lmgeom.calibrate import METHODS, Calibrator

ST_EXTRA_HINT = "pip install lmgeom[st]"

try:
    from safetensors.numpy import load_file, save_file
    from sentence_transformers.base.modules import Module
except ImportError as error:  # the optional `st` extra
    raise MissingDependency(f"exporting to sentence-transformers needs the sentence-transformers package: {ST_EXTRA_HINT} ({error})") from None

STATE_FILE = "model.safetensors"
FORMAT_VERSION = 1


def method_name(calibrator: Calibrator) -> str:
    """The `METHODS` name of a calibrator's class (what the module records to rebuild it)."""
    names = [name for name, cls in METHODS.items() if type(calibrator) is cls]
    if not names:
        raise InputError(
            f"a {type(calibrator).__name__} cannot be exported: CalibrationModule holds the calibrators of "
            f"lmgeom.calibrate.METHODS ({', '.join(METHODS)})"
        )
    return names[0]


def flatten_state(state: dict[str, Any], prefix: str = "") -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A calibrator's fitted state (nested dicts of numpy arrays, torch tensors and plain scalars)
    as (a JSON layout that rebuilds the nesting and the kinds, the arrays by flat key)."""
    layout: dict[str, Any] = {}
    arrays: dict[str, np.ndarray] = {}
    for name, value in state.items():
        key = f"{prefix}{name}"
        if isinstance(value, dict):
            inner_layout, inner_arrays = flatten_state(value, prefix=f"{key}/")
            layout[name] = {"dict": inner_layout}
            arrays.update(inner_arrays)
        elif isinstance(value, (torch.Tensor, np.ndarray, np.generic)):
            is_torch = isinstance(value, torch.Tensor)
            if isinstance(value, torch.Tensor):
                value = value.detach().cpu().numpy()
            # order="C": safetensors needs contiguous data (np.ascontiguousarray would turn 0-d into 1-d)
            array = np.asarray(value, order="C")
            if array.dtype.kind not in "biuf":
                raise TypeError(f"fitted attribute {key} is a {array.dtype} array, which safetensors cannot hold; fit on a numeric array, not a DataFrame")
            layout[name] = {"array": key, "torch": is_torch}
            arrays[key] = array
        elif value is None or isinstance(value, (bool, int, float, str)):
            layout[name] = {"value": value}
        else:
            raise TypeError(f"fitted attribute {key} is a {type(value).__name__}, which CalibrationModule cannot save")
    return layout, arrays


def unflatten_state(layout: dict[str, Any], arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """The inverse of `flatten_state`: each value comes back as the kind it was saved from."""
    state: dict[str, Any] = {}
    for name, entry in layout.items():
        if "dict" in entry:
            state[name] = unflatten_state(entry["dict"], arrays)
        elif "array" in entry:
            array = arrays[entry["array"]]
            state[name] = torch.from_numpy(array) if entry["torch"] else array
        else:
            state[name] = entry["value"]
    return state


class CalibrationModule(Module):
    """A fitted calibrator applied to `sentence_embedding` (the pooled vector), in float64 inside the
    calibrator, returned in the input's dtype on the input's device. A fixed transform: it has no
    trainable parameters, and gradients do not flow through it."""

    def __init__(self, calibrator: Calibrator) -> None:
        super().__init__()
        self.method = method_name(calibrator)
        self.calibrator = calibrator
        # One zero row through the calibrator gives its output width (whitening may keep fewer directions).
        self.n_features_in = int(calibrator.n_features_in_)
        self.n_features_out = int(np.shape(calibrator.transform(np.zeros((1, self.n_features_in))))[1])

    def forward(self, features: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        features["sentence_embedding"] = self.calibrator.transform(features["sentence_embedding"])
        return features

    def get_embedding_dimension(self) -> int:
        return self.n_features_out

    def _state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        # The same fitted state `Calibrator.save` writes, here as safetensors arrays plus a JSON layout.
        return flatten_state(self.calibrator._fitted_state())

    def get_config_dict(self) -> dict[str, Any]:
        layout, _ = self._state()
        return {
            "method": self.method,
            "params": self.calibrator.get_params(),
            "n_features_in": self.n_features_in,
            "n_features_out": self.n_features_out,
            "state_layout": layout,
            "lmgeom_version": __version__,
            "format_version": FORMAT_VERSION,
        }

    def save(self, output_path: str, *args: Any, safe_serialization: bool = True, **kwargs: Any) -> None:
        self.save_config(output_path)
        _, arrays = self._state()
        save_file(arrays, os.path.join(output_path, STATE_FILE))

    @classmethod
    def load(
        cls,
        model_name_or_path: str,
        subfolder: str = "",
        token: bool | str | None = None,
        cache_folder: str | None = None,
        revision: str | None = None,
        local_files_only: bool = False,
        init_defaults: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Self:
        hub: dict[str, Any] = {"subfolder": subfolder, "token": token, "cache_folder": cache_folder, "revision": revision, "local_files_only": local_files_only}
        config = cls.load_config(model_name_or_path, **hub)
        where = os.path.join(model_name_or_path, subfolder)
        if config.get("format_version") != FORMAT_VERSION:
            raise InputError(f"{where} holds calibration module format {config.get('format_version')}; this lmgeom reads {FORMAT_VERSION}")
        if config["method"] not in METHODS:
            raise InputError(f"{where} holds a {config['method']!r} calibrator, which this lmgeom does not have ({', '.join(METHODS)}); upgrade lmgeom")
        state_path = cls.load_file_path(model_name_or_path, STATE_FILE, **hub)
        if state_path is None:
            raise FileNotFoundError(f"{where} has no {STATE_FILE}: the calibration module's fitted arrays are missing; export the model again")
        calibrator = METHODS[config["method"]](**config["params"])
        calibrator._set_fitted_state(unflatten_state(config["state_layout"], load_file(state_path)))
        return cls(calibrator)

    def __repr__(self) -> str:
        return f"CalibrationModule(method={self.method!r}, dimensions={self.n_features_in}->{self.n_features_out})"

