"""Helpers shared by the CLI commands: the console, progress bars, error reporting, number cells."""

from __future__ import annotations

import contextlib
import math
from types import TracebackType
from typing import Iterator

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Column
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

console = Console()

LAYER_WORKERS_HELP = ("layers analysed at once, each in a worker process of its own (at most one per CPU; 1, or layers of "
                      "fewer than 2^26 analysed values (rows x d), which cost less than starting a worker: one after another "
                      "in this process; the numbers are the same either way); peak memory and scratch disk are about this "
                      "many times one layer's (its statistics and one MEV word group of --mev-memory-mb, default 512 MB), "
                      "plus about 0.2 GB of libraries a worker imports in a second or two before its first layer")


class RichProgress:
    """A rich progress bar per stage (with its count, a note such as a rate, elapsed time and ETA),
    satisfying `lmgeom.progress.Progress`. Use as a context manager."""

    def __init__(self) -> None:
        # only the note (a rate, a layer) may wrap onto a second line on a narrow terminal; counts and times never shrink
        self._bars = Progress(
            TextColumn("[bold]{task.description}", table_column=Column(no_wrap=True)),
            BarColumn(bar_width=16),
            MofNCompleteColumn(table_column=Column(no_wrap=True)),
            TimeElapsedColumn(table_column=Column(no_wrap=True, min_width=7)),
            TextColumn("ETA"),
            TimeRemainingColumn(table_column=Column(no_wrap=True, min_width=7)),
            TextColumn("{task.fields[note]}", table_column=Column(overflow="fold")),
            console=console,
            transient=False,
        )
        self._tasks: dict[str, TaskID] = {}

    def __enter__(self) -> RichProgress:
        self._bars.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self._bars.__exit__(kind, error, trace)

    def start(self, stage: str, total: int, *, unit: str = "items") -> None:
        if stage in self._tasks:
            self._bars.reset(self._tasks[stage], total=total, note="")
        else:
            self._tasks[stage] = self._bars.add_task(f"{stage} ({unit})", total=total, note="")

    def advance(self, stage: str, n: int = 1, *, note: str = "") -> None:
        self._bars.update(self._tasks[stage], advance=n, note=note)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Show bad-input errors as one clear line and exit 2, instead of a traceback."""
    try:
        yield
    except (ValueError, FileNotFoundError, ImportError, OSError, IndexError) as error:
        console.print(f"[bold red]error:[/] {escape(str(error))}")
        raise typer.Exit(code=2) from None


def number(value: float | None, digits: int = 4) -> str:
    """A table cell: the value to `digits` decimals, or a dash for a missing (None/NaN) one."""
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def split_list(text: str) -> list[str]:
    """Items of a comma-separated option."""
    return [item.strip() for item in text.split(",") if item.strip()]
