"""The mergeable streaming-statistics protocol every metric follows (after baukit's runningstats).

An accumulator takes rows in any number of `add(X, /, **ids)` calls (`ids` are per-row labels the
statistic needs, such as `word_ids` or `sentence_ids`), can be `merge`d with an accumulator of the
same kind that saw a disjoint shard, and yields the same `result()` as one pass over all rows.

State is float64. `state_dict()` returns copies as plain numpy arrays and Python numbers (also for
state held as torch tensors on a GPU), so it can be saved without pickle (`save_states` / `load_states` write and read `.npz` files), and
`from_state_dict(state)` / `load_state_dict(state)` rebuild an accumulator from it: shards can be
computed in other processes or on other machines and merged later.

Array API: the closed-form accumulators are written once against the array API standard
(`array_api_compat`), so `add` takes numpy arrays or torch tensors on any device and computes in
that array's own library and device, in float64. `RowBlock` is a block of rows with its norms
computed once; accumulators with `add_block` read subsets of it by row index, so a driver that
feeds one block to several statistics neither recomputes the norms nor copies the rows.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Protocol, TypeVar, Union, runtime_checkable

import array_api_compat
import numpy as np

from lmgeom.errors import InputError
from lmgeom.atomic import atomic_write

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


@runtime_checkable
class BlockAccumulator(Accumulator, Protocol):
    """An accumulator that can also read a subset of a shared `RowBlock`: `keep` is a numpy bool
    mask over the block's rows (None: every row) and `ids` label the kept rows only (numpy)."""

    def add_block(self, block: RowBlock, keep: np.ndarray | None, /, **ids: np.ndarray) -> Self: ...


def register_accumulator(cls: type[A]) -> type[A]:
    """Class decorator: lets `load_states` rebuild instances of `cls` by name."""
    _ACCUMULATORS[cls.__name__] = cls
    return cls


def accumulator_class(name: str) -> type[StatefulAccumulator]:
    """The registered accumulator class called `name` (`register_accumulator`)."""
    if name not in _ACCUMULATORS:
        raise InputError(f"{name} is not a known accumulator ({sorted(_ACCUMULATORS)})")
    return _ACCUMULATORS[name]


def _plain(value: Any) -> StateValue:
    """A copy of `value` as a numpy array or a Python scalar (0-d arrays from .npz become scalars)."""
    if array_api_compat.is_array_api_obj(value) and not isinstance(value, np.ndarray):
        value = to_numpy(value)
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
            raise InputError(f"state of {type(self).__name__} lacks {', '.join(missing)}; was it saved by another accumulator?")
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

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as handle:  # a handle, so numpy does not append ".npz" to the temporary name
            np.savez(handle, **arrays)

    return atomic_write(path, write)


def load_states(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, Any]]:
    """(header, named accumulators) from a file written by `save_states`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no accumulator state file at {path}")
    try:
        with np.load(path, allow_pickle=False) as arrays:
            contents = {key: arrays[key] for key in arrays.files}
    except (OSError, ValueError) as error:
        raise InputError(f"corrupt accumulator state file {path} ({error}); compute that shard again") from None
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
            raise InputError(f"{path}: {name} holds a {class_name}, which is not a known accumulator ({sorted(_ACCUMULATORS)})")
        states[name] = cls.from_state_dict(state)
    return header, states


class NonFiniteRows(InputError):
    """Rows holding NaN or inf: `rows` are the first few (indexes into the caller's rows, offset as it
    asked), `count` how many there are, `layer` the layer they belong to (None when not given)."""

    def __init__(self, name: str, bad: np.ndarray, *, layer: int | None = None) -> None:
        self.rows = [int(row) for row in bad[:5]]
        self.count = int(len(bad))
        self.layer = layer
        where = f"layer {layer}, " if layer is not None else ""
        shown = ", ".join(map(str, self.rows)) + (f" and {self.count - len(self.rows)} more" if self.count > len(self.rows) else "")
        super().__init__(f"{name} holds non-finite values (NaN or inf) in {where}row{'s' if self.count > 1 else ''} {shown}")


def as_float64_rows(X: Any, *, name: str = "X", layer: int | None = None, row_offset: int = 0) -> np.ndarray:
    """A 2-D float64 copy of `X` (numpy or torch); NaN/inf rows are an error naming layer and row."""
    if hasattr(X, "detach"):
        X = X.detach().cpu().numpy()
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"{name} must be a 2-D (n_points, dim) array, got shape {X.shape}")
    finite = np.isfinite(X).all(axis=1)
    if not finite.all():
        raise NonFiniteRows(name, np.flatnonzero(~finite) + row_offset, layer=layer)
    return X


# ---------------------------------------------------------------------------------------------
# the array API: numpy or torch (any device), float64


def to_numpy(array: Any) -> np.ndarray:
    """A numpy array from a numpy array or a torch tensor on any device (a copy only when needed)."""
    if array_api_compat.is_torch_array(array):
        return array.detach().cpu().numpy()
    return np.asarray(array)


def float64_array(X: Any, *, name: str = "X") -> tuple[Any, Any]:
    """(namespace, X as 2-D float64) in X's own array library and device: a torch tensor stays a
    tensor on its device, anything that is not an array API object becomes numpy."""
    if not array_api_compat.is_array_api_obj(X) or isinstance(X, np.generic):
        X = np.asarray(X)
    xp = array_api_compat.array_namespace(X)
    X = xp.asarray(X, dtype=xp.float64)
    if X.ndim != 2:
        raise ValueError(f"{name} must be a 2-D (n_points, dim) array, got shape {tuple(X.shape)}")
    return xp, X


def in_namespace_of(reference: Any, values: Any) -> Any:
    """`values` (numpy or any array library) as an array of `reference`'s library and device."""
    xp = array_api_compat.array_namespace(reference)
    if array_api_compat.array_namespace(values) is not xp:
        values = to_numpy(values)
    return xp.asarray(values, device=array_api_compat.device(reference))


def group_sums(xp: Any, X: Any, rows: Any, groups: Any, n_groups: int, weights: Any | None = None) -> Any:
    """(n_groups, dim) sums of the rows `X[rows]` (times `weights`) within each group; `groups` is
    non-decreasing (each group's entries contiguous), one per entry of `rows`.

    The array API has no scatter-add, so this is the one place that dispatches on the library: a
    sparse CSR product on numpy (one pass over X, no copy of its rows), `index_add_` on torch."""
    if array_api_compat.is_torch_namespace(xp):
        source = X[rows] if weights is None else X[rows] * weights[:, None]
        out = xp.zeros((n_groups, X.shape[1]), dtype=X.dtype, device=array_api_compat.device(X))
        return out.index_add_(0, groups, source)
    import scipy.sparse

    indptr = np.searchsorted(groups, np.arange(n_groups + 1))
    data = np.ones(len(rows)) if weights is None else weights
    membership = scipy.sparse.csr_matrix((data, rows, indptr), shape=(n_groups, X.shape[0]))
    return np.asarray(membership @ X)


class RowBlock:
    """A block of float64 rows (numpy, or torch on any device) with squared norms computed once;
    a non-finite value is an error naming the row (and the layer, when given)."""

    def __init__(self, X: Any, *, name: str = "X", layer: int | None = None, row_offset: int = 0) -> None:
        self.xp, self.X = float64_array(X, name=name)
        self.squared_norms = self.xp.linalg.vecdot(self.X, self.X)
        finite = self.xp.isfinite(self.squared_norms)
        if not bool(self.xp.all(finite)):
            raise NonFiniteRows(name, np.flatnonzero(~to_numpy(finite)) + row_offset, layer=layer)

    def __len__(self) -> int:
        return int(self.X.shape[0])

    @property
    def dim(self) -> int:
        return int(self.X.shape[1])

    @cached_property
    def norms(self) -> Any:
        return self.xp.sqrt(self.squared_norms)

    @cached_property
    def nonzero(self) -> Any:
        return self.squared_norms > 0

    @cached_property
    def inverse_norms(self) -> Any:
        """1 / ||x|| per row, 0 for zero rows: sums of unit vectors are weighted sums of the rows."""
        xp = self.xp
        return xp.where(self.nonzero, 1.0 / xp.where(self.nonzero, self.norms, 1.0), 0.0)

    @cached_property
    def nonzero_on_host(self) -> np.ndarray:
        """`nonzero` as numpy: labels and counts are bookkept on the host, only sums run on the device."""
        return to_numpy(self.nonzero)

    def on_device(self, array: np.ndarray) -> Any:
        """A host array (indexes, weights) in the block's library and device."""
        return self.xp.asarray(array, device=array_api_compat.device(self.X))

    def unit_weights(self, keep: np.ndarray | None) -> Any:
        """1 / ||x|| on the kept rows, 0 elsewhere: weighted sums over the block then read only kept rows."""
        return self.inverse_norms if keep is None else self.xp.where(self.on_device(keep), self.inverse_norms, 0.0)

    def rows(self, keep: np.ndarray | None) -> Any:
        """The kept rows themselves (a copy unless every row is kept)."""
        return self.X if keep is None else self.X[self.on_device(keep)]

    def zeros(self, shape: tuple[int, ...]) -> Any:
        return self.xp.zeros(shape, dtype=self.xp.float64, device=array_api_compat.device(self.X))

    def kept(self, keep: np.ndarray | None) -> np.ndarray:
        """Indexes of the kept rows (every row for None), on the host."""
        return np.arange(len(self)) if keep is None else np.flatnonzero(keep)


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
        array = to_numpy(ids[name])
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
