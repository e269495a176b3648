"""Names of a package imported on first use (PEP 562), so that importing the package, or a light
module of it, does not load torch, scikit-learn or transformers for names the caller never uses."""

from __future__ import annotations

import importlib
from typing import Any, Mapping


def load(package: str, exports: Mapping[str, str], name: str) -> Any:
    """`name` of `package`, imported from the module `exports` maps it to: a package's `__getattr__`."""
    if name not in exports:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return getattr(importlib.import_module(exports[name]), name)
