"""Atomic file writes: a crash never leaves half a file (used by the store and the driver)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable


def atomic_write(path: str | os.PathLike[str], write: Callable[[Path], object]) -> Path:
    """`write(tmp)` a temporary file beside `path`, then rename it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    os.replace(tmp, path)
    return path


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
