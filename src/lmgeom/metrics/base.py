"""The mergeable streaming-statistics protocol every metric follows (after baukit's runningstats).

An accumulator takes rows in any number of `add` calls, can be `merge`d with another accumulator
that saw a disjoint shard, and yields the same `result()` as one pass over all rows. State is
float64 and serialisable with `state_dict()` / `from_state_dict()`, so shards can be computed
on different machines and combined later.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, TypeVar, runtime_checkable

import numpy as np

A = TypeVar("A", bound="Accumulator")


@runtime_checkable
class Accumulator(Protocol):
    def add(self, X: np.ndarray, /, **ids: np.ndarray) -> "Accumulator": ...

    def merge(self, other: "Accumulator") -> "Accumulator": ...

    def result(self) -> Any: ...

    def state_dict(self) -> dict[str, Any]: ...


class StateDictMixin:
    """`state_dict` / `from_state_dict` for accumulators whose state is named attributes."""

    _state_fields: ClassVar[tuple[str, ...]] = ()

    def state_dict(self) -> dict[str, Any]:
        state = {name: getattr(self, name) for name in self._state_fields}
        state["__class__"] = type(self).__name__
        return state

    @classmethod
    def from_state_dict(cls: type[A], state: dict[str, Any]) -> A:
        if state.get("__class__") not in (None, cls.__name__):
            raise ValueError(f"state_dict of {state['__class__']} cannot be loaded into {cls.__name__}")
        obj = cls.__new__(cls)
        for name in cls._state_fields:  # type: ignore[attr-defined]
            setattr(obj, name, state[name])
        return obj


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


def unit_rows(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows scaled to unit length, and the mask of non-zero rows (zero rows have no direction)."""
    norms = np.linalg.norm(X, axis=1)
    nonzero = norms > 0
    U = np.zeros_like(X)
    U[nonzero] = X[nonzero] / norms[nonzero, None]
    return U, nonzero
