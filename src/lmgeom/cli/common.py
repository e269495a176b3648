"""Helpers shared by the CLI commands: the console, progress bars, error reporting."""

from __future__ import annotations

import contextlib
from typing import Iterator

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

console = Console()


def progress_bar(*, unit: str = "items") -> Progress:
    """A progress bar with throughput and ETA; `rate` fields are filled by the caller."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Show bad-input errors as one clear line and exit 2, instead of a traceback."""
    try:
        yield
    except (ValueError, FileNotFoundError, ImportError, OSError, IndexError) as error:
        console.print(f"[bold red]error:[/] {error}")
        raise typer.Exit(code=2) from None
