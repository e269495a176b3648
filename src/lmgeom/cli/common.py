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
from typing import Any, Callable, ClassVar, Iterable, Iterator, Mapping, Sequence, TypeVar

import click
import typer
from typer.core import TyperCommand
from rich.console import Console
from rich.markup import escape
from rich.table import Column, Table
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
from lmgeom.progress import progress_line, visible


class VisibleConsole(Console):
    """A console whose printed text shows control characters visibly (`lmgeom.progress.visible`): a
    file name or corpus word holding a terminal escape sequence (`\\x1b[2J`, an OSC title `\\x1b]0;...\\x07`)
    reaches the terminal as text, in messages, findings, table cells and titles alike (each a string
    rich renders through `render_str`); line ends and tabs are the text's own."""

    def __init__(self, *args: Any, **options: Any) -> None:
        super().__init__(*args, **options)
        # rich fixes COLUMNS/LINES as they are when the console is made (here: when lmgeom.cli is first
        # imported); read them when printing instead, so a command honours the COLUMNS it runs under
        if options.get("width") is None:
            self._width = None
        if options.get("height") is None:
            self._height = None

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
ROWS_HELP = "seeded subsample of rows (word occurrences of the store)"
DATA_DIR_HELP = "the data folder (default ../shared/data or LMGEOM_DATA)"
MODEL_OPTION_HELP = "the model, as MODEL (give one of the two)"
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
        # a note without an advance says what the stage does now (a flow starting its fit): shown at once
        if not finished and not (n == 0 and note) and now - state.printed < self.interval:
            return
        state.printed = now
        line = visible(progress_line(stage, state.done, state.total, state.unit, now - state.started))
        note = visible(note)
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


SITES_READ_HELP = ("the capture site to read, one of those the store holds (resid_post, the default; see "
                   "`lmgeom extract --sites`); another site's results go to STORE/site_results/<site>/")

_NEGATED_FLAGS = {"include_punct": "--exclude-punct", "include_special": "--exclude-special",
                  "exclude_first_word": "--exclude-first-word"}
"""Parameters whose False is a flag of its own rather than `--no-NAME` (`exclude_first_word=False` is
the default: leaving out `--exclude-first-word`)."""
_FLAGS = {"include_punct": "--include-punct", "site": "--sites", "explorer_neighbours": "--neighbours", "text_path": "--out",
          "benchmarks": "--benchmark", "n_samples": "--rows", "geometry_rows": "--rows", "n_boot": "--bootstrap",
          "n_resamples": "--bootstrap", "keep_special": "--include-special", "workers": "--num-workers"}
"""Parameters whose option is not `--` + the name with dashes (`min_contexts` -> `--min-contexts`)."""
_PARAMETER = re.compile(r"`(\w+)(?:=([^`]*))?`")
_USER_OS_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.ENAMETOOLONG, errno.EACCES, errno.EPERM})
"""OSErrors that are the user's to mend (a full disk or quota, a read-only or forbidden place), besides
the subclasses naming a path (FileNotFoundError, PermissionError, FileExistsError, ...)."""
_PATH_ERRORS = (FileNotFoundError, PermissionError, FileExistsError, IsADirectoryError, NotADirectoryError)
BUG_REPORT = ("this is a bug in lmgeom, not a problem with your input: please report it with the command you ran "
              "and the traceback above")


def flag(param: str, value: str | None = None, names: Mapping[str, str] | None = None) -> str:
    """The CLI's words for the Python parameter `param` (set to `value`, as written in a message):
    `min_contexts` -> `--min-contexts`, `overwrite=True` -> `--overwrite`, `device='cpu'` -> `--device cpu`,
    `include_punct=False` -> `--exclude-punct`; `names` maps a command's own parameters to their options
    where they differ from every other command's (`similarity`'s `sample` is `--rows`)."""
    name = (names or {}).get(param) or _FLAGS.get(param, "--" + param.replace("_", "-"))
    if value is None or value in ("True", "None"):
        return name
    if value == "False":
        return _NEGATED_FLAGS.get(param, "--no-" + param.replace("_", "-"))
    return f"{name} {value.strip(chr(39) + chr(34))}"


def cli_message(error: InputError, names: Mapping[str, str] | None = None) -> str:
    """`error`'s message with each Python parameter it names (in backticks) written as the CLI's option
    (`names`: a command's own, as `flag` takes them)."""
    return cli_text(str(error), error.params, names)


def cli_text(text: str, params: tuple[str, ...], names: Mapping[str, str] | None = None) -> str:
    """`text` with each of the Python parameters `params` it names in backticks written as the CLI's option
    (`names`: a command's own, as `flag` takes them)."""
    return _PARAMETER.sub(lambda match: flag(match[1], match[2], names) if match[1] in params else match[0], text)


def is_user_error(error: BaseException) -> bool:
    """Whether `error` is the user's to mend (bad input, a missing file or package, a full disk, an object
    store that does not answer), not a bug."""
    from lmgeom.store.url import is_transient

    return (isinstance(error, (InputError, MissingDependency, Unavailable, *_PATH_ERRORS))
            or isinstance(error, OSError) and error.errno in _USER_OS_ERRNOS or is_transient(error))


def user_message(error: BaseException, names: Mapping[str, str] | None = None) -> str:
    """The one line `user_errors` prints for a user's error: an `InputError` with the CLI's option names
    (`names`: the command's own, as `flag` takes them); a transient object-store error that escaped the
    retries of `Location` (one raised inside zarr's own I/O) with how to resume."""
    from lmgeom.store.url import RESUME, is_transient

    if isinstance(error, InputError):
        return cli_message(error, names)
    if not isinstance(error, Unavailable) and is_transient(error):
        return f"the object store or network endpoint did not answer ({type(error).__name__}: {' '.join(str(error).split())}); {RESUME}"
    return str(error)


def show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None,
                 line: str | None = None) -> None:
    """A warning as a `warning:` paragraph on standard error, naming the options of the parameters it
    names in backticks (a warning class's `params`), instead of Python's two lines of file and source."""
    params = tuple(getattr(category, "params", ()))
    err_console.print(f"[yellow]warning:[/] {escape(cli_text(str(message), params))}", highlight=False)


CLI_EXITS: tuple[type[BaseException], ...] = (
    click.exceptions.Exit, click.ClickException, click.exceptions.Abort, typer.Exit, typer.Abort,
    *(kind for kind in typer.BadParameter.__mro__ if kind.__name__ == "ClickException"))
"""The exits and usage errors of the CLI itself, click's and typer's (whose click may be a copy of its own)."""


@contextlib.contextmanager
def user_errors(names: Mapping[str, str] | None = None) -> Iterator[None]:
    """Show a user's error (`is_user_error`) as one `error:` line, with the CLI's option names (`names`: the
    command's own Python parameters whose option differs from other commands', as `flag` takes them), and
    exit 2; anything else is a bug: its traceback, one line asking for a report, and exit 1. Warnings
    meanwhile are a `warning:` paragraph each (`show_warning`)."""
    try:
        with warnings.catch_warnings():
            warnings.showwarning = show_warning
            yield
    except CLI_EXITS:
        raise  # the CLI's own exits and usage errors
    except Exception as error:
        if not is_user_error(error):
            traceback.print_exc(file=sys.stderr)
            err_console.print(f"[bold red]internal error:[/] {escape(BUG_REPORT)}", soft_wrap=True)
            raise typer.Exit(code=1) from None
        line = " ".join(part.strip() for part in user_message(error, names).splitlines() if part.strip())
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


def table_columns(header: Sequence[str], rows: Sequence[Sequence[str]], width: int, *, labels: int = 1) -> list[list[int]]:
    """The indexes of the columns after the first `labels` (the row labels), split into consecutive groups
    such that the label columns and one group, drawn by `grid_table`, fit in `width` characters (a column
    wider than that alone is a group of its own)."""
    widths = [max(len(header[i]), *(len(row[i]) for row in rows)) for i in range(len(header))]
    # a boxed rich table: each column is its text, a space either side and one border; plus the left border
    start = 1 + sum(widths[i] + 3 for i in range(labels))
    groups: list[list[int]] = []
    used = start
    for index in range(labels, len(header)):
        if groups and groups[-1] and used + widths[index] + 3 <= width:
            groups[-1].append(index)
        else:
            groups.append([index])
            used = start
        used += widths[index] + 3
    return groups


def grid_table(header: Sequence[str], rows: Sequence[Sequence[str]], *, left: Sequence[int] = (0,),
               title: str | None = None) -> Table:
    """A table whose cells are never cut: the `left` columns left-aligned, the others right; a table wider
    than the terminal (a column name such as `whitening@corpus` longer than the line) folds its text."""
    table = Table(title=title)
    for index, column in enumerate(header):
        table.add_column(column, justify="left" if index in left else "right", overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table


def print_grouped(title: str, header: Sequence[str], rows: Sequence[Sequence[str]], *, labels: int = 1,
                  left: Sequence[int] = (0,)) -> None:
    """A table of `rows` under `header` on `console`, its columns after the first `labels` (repeated in each
    part) split into as many tables as the terminal's width needs, so that no cell is cut; each part's
    title says which columns it holds."""
    groups = table_columns(header, rows, console.width, labels=labels)
    for number, group in enumerate(groups, start=1):
        part = f" ({number} of {len(groups)}: {header[group[0]]} to {header[group[-1]]})" if len(groups) > 1 else ""
        shown_columns = [*range(labels), *group]
        console.print(grid_table([header[i] for i in shown_columns], [[row[i] for i in shown_columns] for row in rows],
                                 left=[position for position, i in enumerate(shown_columns) if i in left],
                                 title=title + part))


DEPRECATED = "it still works in this release and goes in the next"


class OldSpellings(TyperCommand):
    """A command that still takes the old spellings of its options (`old_spellings`: old -> current; an
    empty current spelling: the old one asked for the default, so it is dropped), hidden from its help:
    each is rewritten to its current spelling before the arguments are parsed, with a warning on standard
    error naming the current one. The values of an old spelling whose current spelling is in `joined` are
    joined with commas into one (`--layer 0 --layer 3` -> `--layers 0,3`). An option given under both its
    old and its current spelling is refused. Make one with `old_spellings(...)`."""

    old_spellings: ClassVar[Mapping[str, str]] = {}
    joined: ClassVar[frozenset[str]] = frozenset()

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:
            args = respell(self, args, self.old_spellings, self.joined)
        except BothSpellings as error:
            ctx.fail(str(error))
        return super().parse_args(ctx, args)


class BothSpellings(Exception):
    """An option given under its old and its current spelling."""


def old_spellings(spellings: Mapping[str, str], *, joined: Iterable[str] = ()) -> type[TyperCommand]:
    """The command class (`cls=` of `app.command`) of a command that still takes the old spellings
    `spellings` (old -> current; see `OldSpellings`)."""
    return type("OldSpellings", (OldSpellings,), {"old_spellings": dict(spellings), "joined": frozenset(joined)})


def respell(command: Any, args: Sequence[str], spellings: Mapping[str, str], joined: Iterable[str] = ()) -> list[str]:
    """`args` with each old spelling of `spellings` (old -> current, `--old=value` and a short `-xVALUE`
    included) written as its current one, warning on standard error once per old spelling used; the
    values of an option in `joined` given under an old spelling several times joined with commas. Raises
    `BothSpellings` for an option given under both spellings."""
    options = {name: param for param in command.params if param.param_type_name == "option"
               for name in (*param.opts, *param.secondary_opts)}
    takes_value = {name for name, param in options.items() if not param.is_flag and not param.count}
    joined = frozenset(joined)
    result: list[str] = []
    current: set[str | None] = set()  # the parameters given under a current spelling
    used: dict[str, str] = {}  # old spelling -> the parameter it set ('' for a dropped default)
    joins: dict[str, tuple[int, list[str]]] = {}  # current spelling -> where its joined value is, and the values
    index = 0
    while index < len(args):
        arg = args[index]
        index += 1
        if arg == "--":
            result.extend(args[index - 1:])
            break
        name, equals, attached = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        old = name if name in spellings else next(  # a short spelling with its value attached: -l0
            (short for short in spellings if re.fullmatch(r"-\w", short) and len(arg) > 2 and arg.startswith(short)), None)
        if old is None:
            result.append(arg)
            if name in options:
                current.add(options[name].name)
                if name in takes_value and not equals and index < len(args):
                    result.append(args[index])
                    index += 1
            continue
        new = spellings[old]
        if not new:  # --no-include-punct: the default; it still contradicts --include-punct
            negated = options.get("--" + old.removeprefix("--no-")) if old.startswith("--no-") else None
            used[old] = "" if negated is None else f"not {negated.name}"
            continue
        if new not in options:
            raise AssertionError(f"the old spelling {old} names {new}, which the command lacks")
        used[old] = str(options[new].name)
        if new not in takes_value:
            result.append(new)
            continue
        if old != name:  # -l0
            value: str | None = arg[len(old):]
        elif equals:
            value = attached
        elif index < len(args):
            value, index = args[index], index + 1
        else:
            value = None
        if value is None:
            result.append(new)  # click says the value is missing, naming the current spelling
        elif new in joins:
            position, values = joins[new]
            values.append(value)
            result[position] = ",".join(values)
        else:
            if new in joined:
                joins[new] = (len(result) + 1, [value])
            result.extend([new, value])
    for old, parameter in used.items():
        if parameter.startswith("not ") and parameter.removeprefix("not ") in current:
            raise BothSpellings(f"give {old.replace('--no-', '--', 1)} or leave it out: {old} is the old spelling of "
                                "leaving it out")
        if parameter and parameter in current:
            raise BothSpellings(f"give {spellings[old]} only: {old} is its old spelling")
    for old, parameter in used.items():
        new = spellings[old]
        if not new:
            note = f"{old} asks for the default; leave it out ({DEPRECATED})"
        elif new in joins and len(joins[new][1]) > 1:
            note = (f"{old} is the old spelling of {new}, which takes them all in one value: read as {new} "
                    f"{result[joins[new][0]]}; write that ({DEPRECATED})")
        else:
            note = f"{old} is the old spelling of {new}; write {new} ({DEPRECATED})"
        err_console.print(f"[yellow]warning:[/] {escape(note)}", highlight=False)
    return result


def one_model(positional: str | None, option: str | None, command: str) -> str:
    """The model of a command that takes it as its MODEL argument or as `--model` (as `lmgeom run` does):
    exactly one of the two, or both the same."""
    if positional is not None and option is not None and positional != option:
        raise typer.BadParameter(f"give the model once, as MODEL or as --model (got {positional!r} and {option!r})",
                                 param_hint="--model")
    model = option if positional is None else positional
    if model is None:
        raise typer.BadParameter(f"give a model: lmgeom {command} MODEL, or lmgeom {command} --model MODEL",
                                 param_hint="MODEL")
    return model
