"""The Ray connection both Ray engines share: the analysis engine's `RayExecutor` and sharded extraction."""

from __future__ import annotations

import logging
import os
from types import ModuleType

from lmgeom.errors import MissingDependency


def connect_ray(address: str | None = None) -> ModuleType:
    """Ray, joined to the cluster at `address` (or RAY_ADDRESS), or a local one started here."""
    try:
        import ray
    except ImportError:
        raise MissingDependency("the ray engine needs Ray: pip install 'lmgeom[ray]' (or use the local engine)") from None
    if not ray.is_initialized():
        ray.init(address=address or os.environ.get("RAY_ADDRESS"), logging_level=logging.WARNING)
    return ray
