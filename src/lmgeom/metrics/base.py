"""The mergeable streaming-statistics protocol every metric follows (after baukit's runningstats).

An accumulator takes rows in any number of `add(X, /, **ids)` calls (`ids` are per-row labels the
statistic needs, such as `word_ids` or `sentence_ids`), can be `merge`d with an accumulator of the
same kind that saw a disjoint shard, and yields the same `result()` as one pass over all rows.

State is float64. `state_dict()` returns copies as plain numpy arrays and Python numbers, so it can
be saved without pickle (`save_states` / `load_states` write and read `.npz` files), and
`from_state_dict(state)` / `load_state_dict(state)` rebuild an accumulator from it: shards can be
computed in other processes or on other machines and merged later.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Protocol, TypeVar, Union, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from typing_extensions import Self

StateValue = Union[np.ndarray, int, float, bool, str]
StateDict = dict[str, StateValue]

_ACCUMULATORS: dict[str, type["StatefulAccumulator"]] = {}
_CLASS_KEY = "__class__"

A = TypeVar("A", bound="StatefulAccumulator")


@runtime_checkable
class Accumulator(Protocol):
    """What every streaming statistic implements."""

    def add(self, X: Any, /, **ids: np.ndarray) -> Self: ...

    def merge(self, other: Self) -> Self: ...

    def result(self) -> Any: ...

    def state_dict(self) -> StateDict: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


def register_accumulator(cls: type[A]) -> type[A]:
    """Class decorator: lets `load_states` rebuild instances of `cls` by name."""
    _ACCUMULATORS[cls.__name__] = cls
    return cls


def _plain(value: Any) -> StateValue:
    """A copy of `value` as a numpy array or a Python scalar (0-d arrays from .npz become scalars)."""
    if isinstance(value, np.ndarray):
        return value.item() if value.ndim == 0 else value.copy()
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, str):
        return value
    raise TypeError(f"accumulator state must be numpy arrays or numbers, got {type(value).__name__}")


class StatefulAccumulator:
    """`state_dict` / `load_state_dict` / `from_state_dict` for accumulators whose state is the
    attributes named in `_state_fields`, each a numpy array or a number (never None)."""

    _state_fields: ClassVar[tuple[str, ...]] = ()

    def state_dict(self) -> StateDict:
        return {name: _plain(getattr(self, name)) for name in self._state_fields}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        missing = [name for name in self._state_fields if name not in state]
        if missing:
            raise ValueError(f"state of {type(self).__name__} lacks {', '.join(missing)}; was it saved by another accumulator?")
        for name in self._state_fields:
            setattr(self, name, _plain(state[name]))
        self._after_load()

    def _after_load(self) -> None:
        """Rebuild derived attributes after `load_state_dict` (most accumulators have none)."""

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> Self:
        accumulator = cls.__new__(cls)
        accumulator.load_state_dict(state)
        return accumulator


def save_states(path: str | os.PathLike, states: Mapping[str, Accumulator], *, header: Mapping[str, Any] | None = None) -> Path:
    """Write named accumulators (and a JSON-able `header`) to one `.npz` file, without pickle.

    Each array is stored under `<name>/<field>`; the class name under `<name>/__class__`."""
    path = Path(path)
    arrays: dict[str, Any] = {"__header__": np.array(json.dumps(dict(header or {})))}
    for name, accumulator in states.items():
        if "/" in name:
            raise ValueError(f"accumulator names may not contain '/': {name!r}")
        arrays[f"{name}/{_CLASS_KEY}"] = np.array(type(accumulator).__name__)
        for field, value in accumulator.state_dict().items():
            arrays[f"{name}/{field}"] = np.asarray(value)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as handle:
        np.savez(handle, **arrays)
    os.replace(tmp, path)
    return path


def load_states(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, Any]]:
    """(header, named accumulators) from a file written by `save_states`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no accumulator state file at {path}")
    try:
        with np.load(path, allow_pickle=False) as arrays:
            contents = {key: arrays[key] for key in arrays.files}
    except (OSError, ValueError) as error:
        raise ValueError(f"corrupt accumulator state file {path} ({error}); compute that shard again") from None
    header = json.loads(str(contents.pop("__header__", np.array("{}"))))
    fields: dict[str, dict[str, Any]] = {}
    for key, value in contents.items():
        name, _, field = key.partition("/")
        fields.setdefault(name, {})[field] = value
    states: dict[str, Any] = {}
    for name, state in fields.items():
        class_name = str(state.pop(_CLASS_KEY))
        cls = _ACCUMULATORS.get(class_name)
        if cls is None:
            raise ValueError(f"{path}: {name} holds a {class_name}, which is not a known accumulator ({sorted(_ACCUMULATORS)})")
        states[name] = cls.from_state_dict(state)
    return header, states


def as_float64_rows(X: Any, *, name: str = "X", layer: int | None = None, row_offset: int = 0) -> np.ndarray:
    """A 2-D float64 copy of `X` (numpy or torch); NaN/inf rows are an error naming layer and row."""
    if hasattr(X, "detach"):
        X = X.detach().cpu().numpy()
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"{name} must be a 2-D (n_points, dim) array, got shape {X.shape}")
    finite = np.isfinite(X).all(axis=1)
    if not finite.all():
        bad = int(np.flatnonzero(~finite)[0]) + row_offset
        where = f"layer {layer}, " if layer is not None else ""
        raise ValueError(
            f"{name} holds NaN or inf values ({where}row {bad}); this usually means float16 overflow "
            "during extraction: re-extract with --dtype float32"
        )
    return X


def row_ids(ids: Mapping[str, np.ndarray], required: tuple[str, ...], n_rows: int, owner: str) -> list[np.ndarray]:
    """The per-row label arrays an accumulator's `add` needs, checked: each named one present and one
    entry per row, and no others (a misspelt name would otherwise be ignored silently)."""
    unexpected = sorted(set(ids) - set(required))
    if unexpected:
        raise TypeError(f"{owner}.add got unexpected ids {unexpected}; it takes {list(required) or 'none'}")
    arrays = []
    for name in required:
        if name not in ids:
            raise TypeError(f"{owner}.add needs {name}= (one label per row of X)")
        array = np.asarray(ids[name])
        if array.shape != (n_rows,):
            raise ValueError(f"{name} must have one entry per row of X ({n_rows}), got shape {array.shape}")
        arrays.append(array)
    return arrays


def unit_rows(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows scaled to unit length, and the mask of non-zero rows (zero rows have no direction)."""
    norms = np.linalg.norm(X, axis=1)
    nonzero = norms > 0
    U = np.zeros_like(X)
    U[nonzero] = X[nonzero] / norms[nonzero, None]
    return U, nonzero
