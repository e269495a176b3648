"""Helpers shared by the CLI commands: the console, progress bars, error reporting, number cells."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import math
import re
import sys
import time
import traceback
import warnings
from types import TracebackType
from typing import Any, Callable, Iterator, TypeVar

import click
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Column
from rich.text import Text
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from lmgeom.errors import InputError, MissingDependency, Unavailable
from lmgeom.progress import visible


class VisibleConsole(Console):
    """A console whose printed text shows control characters visibly (`lmgeom.progress.visible`): a
    file name or corpus word holding a terminal escape sequence (`\\x1b[2J`, an OSC title `\\x1b]0;...\\x07`)
    reaches the terminal as text, in messages, findings, table cells and titles alike (each a string
    rich renders through `render_str`); line ends and tabs are the text's own."""

    def render_str(self, text: str, **options: Any) -> Text:
        return super().render_str(visible(text, keep="\n\t"), **options)


console = VisibleConsole()
"""Where results go: standard output (tables, findings, what was written)."""
err_console = VisibleConsole(stderr=True)
"""Where progress, warnings and errors go: standard error, wrapped to the terminal's width, so that a
command's redirected output holds its results only."""
T = TypeVar("T")


def shown(text: object) -> str:
    """Text from a user's data (a word, a file name, a note about them) as console markup that shows it
    as written: control characters visible, `[...]` never taken for a style."""
    return escape(visible(text))

MIN_CONTEXTS_HELP = "analyse words occurring at least this many times, counted by --count-by (default 5)"
COUNT_BY_HELP = "what --min-contexts counts: sentences (distinct sentences, the default) or occurrences"
PROTOCOL_HELP = ("ethayarajh2019: follows the released code of Ethayarajh (2019) (the sts-scored corpus, WordPiece "
                 "pieces of BERT-style models, words of at least 5 occurrences, its sampled statistics beside lmgeom's)")
BOOTSTRAP_HELP = "bootstrap resamples for the confidence intervals (0: none; below 100: rough, flagged; see docs/metrics.md)"
LAYERS_HELP = "layers: e.g. 0,3,-1 (0 = embedding output, -1 the last), 0-3, first, last, all, every:K"
MIN_COVERAGE_HELP = ("fewest covered items a word-benchmark score needs to be shown as a number: items and/or "
                     "a percentage of the benchmark (default 50,10%; 0: no minimum); below it the score "
                     "reads 'too few items'")
CONFIDENCE_HELP = "level of the percentile bootstrap intervals, between 0 and 1"


def interval_cell(value: float, lo: float, hi: float, digits: int = 3) -> str:
    """A table cell: the value, and its interval below it ("lo–hi"; the value alone without one)."""
    from lmgeom.report.labels import number

    if math.isnan(lo) or math.isnan(hi):
        return number(value, digits)
    return f"{number(value, digits)}\n{number(lo, digits)}–{number(hi, digits)}"


class RichProgress:
    """Progress of each stage, satisfying `lmgeom.progress.Progress`. Use as a context manager.

    On a terminal: a rich bar per stage (its count, elapsed time, ETA and a note such as a rate), fitted
    to the terminal's width (the bar shrinks and the note is cut, so a line never wraps). Elsewhere (output
    piped to a file or a log): plain lines, one when a stage starts, then at most one every
    `interval` seconds and one when it completes, written as they happen (a live bar is drawn only at the
    end when the output is not a terminal)."""

    def __init__(self, *, interval: float = 10.0) -> None:
        self._lines: LineProgress | None = None if err_console.is_terminal else LineProgress(interval=interval)
        narrow = err_console.width < 100
        # counts and times never shrink; the note (a rate, a layer) is cut to what is left of the line
        self._bars = Progress(
            TextColumn("[bold]{task.description}", table_column=Column(no_wrap=True)),
            BarColumn(bar_width=6 if narrow else 16),
            MofNCompleteColumn(table_column=Column(no_wrap=True)),
            TimeElapsedColumn(table_column=Column(no_wrap=True, min_width=7)),
            TextColumn("ETA"),
            TimeRemainingColumn(table_column=Column(no_wrap=True, min_width=7)),
            _NoteColumn(table_column=Column(min_width=0)),
            console=err_console,
            transient=False,
        )
        self._tasks: dict[str, TaskID] = {}

    def __enter__(self) -> RichProgress:
        if self._lines is None:
            self._bars.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        if self._lines is None:
            self._bars.__exit__(kind, error, trace)

    def start(self, stage: str, total: int, *, unit: str = "items") -> None:
        if self._lines is not None:
            self._lines.start(stage, total, unit=unit)
        elif stage in self._tasks:
            self._bars.reset(self._tasks[stage], total=total, note="")
        else:  # the description is markup ("[bold]{task.description}"); a stage may name a user's file
            self._tasks[stage] = self._bars.add_task(shown(f"{stage} ({unit})"), total=total, note="")

    def advance(self, stage: str, n: int = 1, *, note: str = "") -> None:
        if self._lines is not None:
            self._lines.advance(stage, n, note=note)
        else:
            self._bars.update(self._tasks[stage], advance=n, note=visible(note))


class _NoteColumn(ProgressColumn):
    """A stage's note on one line, cut with an ellipsis to the width the other columns leave: the
    column itself may shrink (rich shrinks wrappable columns first), its text never wraps."""

    def render(self, task: Task) -> Text:
        return Text(str(task.fields.get("note", "")), no_wrap=True, overflow="ellipsis")


class LineProgress:
    """Progress as plain lines (for logs): `stage: done/total unit (percent), elapsed, ETA; note`, one when a
    stage starts, at most one every `interval` seconds while it runs, and one when it completes."""

    def __init__(self, *, interval: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self._clock = clock
        self._stages: dict[str, _LineStage] = {}

    def start(self, stage: str, total: int, *, unit: str = "items") -> None:
        now = self._clock()
        self._stages[stage] = _LineStage(total=total, unit=unit, started=now, printed=now)
        err_console.print(f"{shown(stage)}: started, {total:,} {shown(unit)}", soft_wrap=True, highlight=False)

    def advance(self, stage: str, n: int = 1, *, note: str = "") -> None:
        state = self._stages[stage]
        state.done += n
        now = self._clock()
        finished = state.total > 0 and state.done >= state.total
        if not finished and now - state.printed < self.interval:
            return
        state.printed = now
        elapsed = now - state.started
        parts = [f"{state.done:,}/{state.total:,} {state.unit}"]
        if state.total > 0:
            parts[0] += f" ({100 * min(state.done / state.total, 1):.0f} %)"
        parts.append(f"{_clock_time(elapsed)} elapsed")
        if not finished and state.done > 0 and state.total > state.done:
            parts.append(f"ETA {_clock_time(elapsed * (state.total - state.done) / state.done)}")
        line, note = visible(f"{stage}: " + ", ".join(parts)), visible(note)
        if note and len(line) + 2 + len(note) <= err_console.width:
            line, note = f"{line}; {note}", ""
        err_console.print(escape(line), soft_wrap=True, highlight=False)
        if note:  # the note (a rate, a layer) on a line of its own rather than past the console's width
            err_console.print(escape(f"  {note}"), soft_wrap=True, highlight=False)


@dataclasses.dataclass
class _LineStage:
    total: int
    unit: str
    started: float
    printed: float
    done: int = 0


def _clock_time(seconds: float) -> str:
    """h:mm:ss, as rich's bars show times."""
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


_NEGATED_FLAGS = {"include_punct": "--exclude-punct"}
"""Parameters whose False is a flag of its own rather than `--no-NAME`."""
_FLAGS = {"include_punct": "--include-punct", "site": "--sites", "explorer_neighbours": "--neighbours", "text_path": "--out", "benchmarks": "--benchmark"}
"""Parameters whose option is not `--` + the name with dashes (`min_contexts` -> `--min-contexts`)."""
_PARAMETER = re.compile(r"`(\w+)(?:=([^`]*))?`")
_USER_OS_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.ENAMETOOLONG, errno.EACCES, errno.EPERM})
"""OSErrors that are the user's to mend (a full disk or quota, a read-only or forbidden place), besides
the subclasses naming a path (FileNotFoundError, PermissionError, FileExistsError, ...)."""
_PATH_ERRORS = (FileNotFoundError, PermissionError, FileExistsError, IsADirectoryError, NotADirectoryError)
BUG_REPORT = ("this is a bug in lmgeom, not a problem with your input: please report it with the command you ran "
              "and the traceback above")


def flag(param: str, value: str | None = None) -> str:
    """The CLI's words for the Python parameter `param` (set to `value`, as written in a message):
    `min_contexts` -> `--min-contexts`, `overwrite=True` -> `--overwrite`, `device='cpu'` -> `--device cpu`,
    `include_punct=False` -> `--exclude-punct`."""
    name = _FLAGS.get(param, "--" + param.replace("_", "-"))
    if value is None or value in ("True", "None"):
        return name
    if value == "False":
        return _NEGATED_FLAGS.get(param, "--no-" + param.replace("_", "-"))
    return f"{name} {value.strip(chr(39) + chr(34))}"


def cli_message(error: InputError) -> str:
    """`error`'s message with each Python parameter it names (in backticks) written as the CLI's option."""
    return cli_text(str(error), error.params)


def cli_text(text: str, params: tuple[str, ...]) -> str:
    """`text` with each of the Python parameters `params` it names in backticks written as the CLI's option."""
    return _PARAMETER.sub(lambda match: flag(match[1], match[2]) if match[1] in params else match[0], text)


def is_user_error(error: BaseException) -> bool:
    """Whether `error` is the user's to mend (bad input, a missing file or package, a full disk, an object
    store that does not answer), not a bug."""
    from lmgeom.store.url import is_transient

    return (isinstance(error, (InputError, MissingDependency, Unavailable, *_PATH_ERRORS))
            or isinstance(error, OSError) and error.errno in _USER_OS_ERRNOS or is_transient(error))


def user_message(error: BaseException) -> str:
    """The one line `user_errors` prints for a user's error: an `InputError` with the CLI's option names;
    a transient object-store error that escaped the retries of `Location` (one raised inside zarr's own
    I/O) with how to resume."""
    from lmgeom.store.url import RESUME, is_transient

    if isinstance(error, InputError):
        return cli_message(error)
    if not isinstance(error, Unavailable) and is_transient(error):
        return f"the object store or network endpoint did not answer ({type(error).__name__}: {' '.join(str(error).split())}); {RESUME}"
    return str(error)


def show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None,
                 line: str | None = None) -> None:
    """A warning as a `warning:` paragraph on standard error, naming the options of the parameters it
    names in backticks (a warning class's `params`), instead of Python's two lines of file and source."""
    params = tuple(getattr(category, "params", ()))
    err_console.print(f"[yellow]warning:[/] {escape(cli_text(str(message), params))}", highlight=False)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Show a user's error (`is_user_error`) as one `error:` line, with the CLI's option names, and exit 2;
    anything else is a bug: its traceback, one line asking for a report, and exit 1. Warnings meanwhile
    are a `warning:` paragraph each (`show_warning`)."""
    try:
        with warnings.catch_warnings():
            warnings.showwarning = show_warning
            yield
    except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort):
        raise  # the CLI's own exits and usage errors
    except Exception as error:
        if not is_user_error(error):
            traceback.print_exc(file=sys.stderr)
            err_console.print(f"[bold red]internal error:[/] {escape(BUG_REPORT)}", soft_wrap=True)
            raise typer.Exit(code=1) from None
        line = " ".join(part.strip() for part in user_message(error).splitlines() if part.strip())
        err_console.print(f"[bold red]error:[/] {escape(line)}", soft_wrap=True)  # one line, for logs and grep
        raise typer.Exit(code=2) from None


def below(high: float) -> Callable[[float | None], float | None]:
    """An option's callback refusing values of `high` or more (typer's `max` admits `high` itself)."""

    def check(value: float | None) -> float | None:
        if value is not None and not value < high:
            raise typer.BadParameter(f"{value} is not below {high}")
        return value

    return check


def above(low: float) -> Callable[[float | None], float | None]:
    """An option's callback refusing values of `low` or less (typer's `min` admits `low` itself)."""

    def check(value: float | None) -> float | None:
        if value is not None and not value > low:
            raise typer.BadParameter(f"{value} is not above {low}")
        return value

    return check


def url_form(value: T) -> T:
    """The callback of every `--out`: a path that means an fsspec URL but lacks its `//` (`s3:/bucket/x`)
    is refused naming the URL meant (`lmgeom.store.url.require_url_form`), before anything runs."""
    from lmgeom.store.url import require_url_form

    if value is not None:
        try:
            require_url_form(value)  # type: ignore[arg-type]
        except InputError as error:
            raise typer.BadParameter(str(error)) from None
    return value


def split_list(text: str) -> list[str]:
    """Items of a comma-separated option."""
    return [item.strip() for item in text.split(",") if item.strip()]
