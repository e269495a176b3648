"""How driver functions report progress: `start` a stage with its total, then `advance` it.

The CLI passes a rich progress bar (`lmgeom.cli.common.RichProgress`); Python callers may pass
their own object with these two methods, or nothing.
"""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    def start(self, stage: str, total: int, *, unit: str = "items") -> None: ...

    def advance(self, stage: str, n: int = 1, *, note: str = "") -> None: ...


class NoProgress:
    """Reports nothing."""

    def start(self, stage: str, total: int, *, unit: str = "items") -> None:
        pass

    def advance(self, stage: str, n: int = 1, *, note: str = "") -> None:
        pass
