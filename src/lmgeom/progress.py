"""How driver functions report progress: `start` a stage with its total, then `advance` it; and
`visible`, which shows the control characters of text bound for a terminal.

The CLI passes a rich progress bar (`lmgeom.cli.common.RichProgress`); `lmgeom.run` shows
`StderrProgress` by default (bars in a notebook or on a terminal, plain lines in a log); Python
callers may pass their own object with these two methods, or nothing. `advance(stage, 0, note=...)`
says what a stage is doing now (a flow starting its fit): shown at once.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol, TextIO

_UNSEEN = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""Control characters (C0, DEL, C1: the terminal's escape sequences begin with ESC or CSI) and the
bidirectional-text controls, which reorder what a terminal shows after them."""


def visible(text: object, *, keep: str = "") -> str:
    """`text` with each control character shown as its escape, as Python's repr writes it (ESC as the
    four characters `\\x1b`, a line end as `\\n`, U+202E as `\\u202e`), so that text from a user's
    data (a corpus file's name, a word of a JSONL corpus) printed to a terminal cannot clear the
    screen, move the cursor, set the window title or reorder the rest of the line; `keep` lists characters left as they are (a message's own line ends).
    The one place text bound for a terminal is made visible: the CLI's console and progress use it."""
    return _UNSEEN.sub(lambda match: match[0] if match[0] in keep else _escape(match[0]), str(text))


_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(character: str) -> str:
    if character in _NAMED:
        return _NAMED[character]
    code = ord(character)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


class Progress(Protocol):
    def start(self, stage: str, total: int, *, unit: str = "items") -> None: ...

    def advance(self, stage: str, n: int = 1, *, note: str = "") -> None: ...


class NoProgress:
    """Reports nothing."""

    def start(self, stage: str, total: int, *, unit: str = "items") -> None:
        pass

    def advance(self, stage: str, n: int = 1, *, note: str = "") -> None:
        pass


def clock_time(seconds: float) -> str:
    """h:mm:ss, as rich's bars show times."""
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def progress_line(stage: str, done: int, total: int, unit: str, elapsed: float) -> str:
    """`stage: done/total unit (percent), elapsed, ETA`: a progress line of a log (the ETA while unfinished)."""
    finished = total > 0 and done >= total
    parts = [f"{done:,}/{total:,} {unit}"]
    if total > 0:
        parts[0] += f" ({100 * min(done / total, 1):.0f} %)"
    parts.append(f"{clock_time(elapsed)} elapsed")
    if not finished and done > 0 and total > done:
        parts.append(f"ETA {clock_time(elapsed * (total - done) / done)}")
    return f"{stage}: " + ", ".join(parts)


@dataclass
class _Stage:
    total: int
    unit: str
    started: float
    printed: float
    done: int = 0
    bar: Any = None


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (IPython with a kernel)."""
    shell = sys.modules.get("IPython")
    get = getattr(shell, "get_ipython", None)
    return get is not None and getattr(get(), "kernel", None) is not None


class StderrProgress:
    """Progress on standard error, where tools expect it (standard output keeps results only): a
    `tqdm.auto` bar per stage in a notebook or on a terminal (`bars`), else plain lines (logs, pipes):
    one when a stage starts, one when `advance` gives a note without advancing (what the stage is
    doing now), at most one every `interval` seconds while it runs, and one when it completes.

    Parameters
    ----------
    interval : float, default 10.0
        The fewest seconds between two lines of a running stage (plain lines only).
    bars : bool or None, default None
        Bars (True) or plain lines (False); None: bars in a Jupyter kernel or when standard error is
        a terminal.
    file : file object or None, default None
        Where to write (None: `sys.stderr` as it is at each write, so a captured stream is honoured).
    clock : callable, default time.monotonic
        The clock the lines' times are read from.
    """

    def __init__(self, *, interval: float = 10.0, bars: bool | None = None, file: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self._file = file
        self._clock = clock
        self.bars = (in_notebook() or _isatty(self.file)) if bars is None else bars
        self._stages: dict[str, _Stage] = {}

    @property
    def file(self) -> TextIO:
        return self._file if self._file is not None else sys.stderr

    def start(self, stage: str, total: int, *, unit: str = "items") -> None:
        now = self._clock()
        previous = self._stages.get(stage)
        if previous is not None and previous.bar is not None:
            previous.bar.close()
        state = self._stages[stage] = _Stage(total=total, unit=unit, started=now, printed=now)
        if self.bars:
            from tqdm.auto import tqdm

            state.bar = tqdm(total=total, desc=visible(stage), unit=f" {visible(unit)}", file=self.file, leave=True,
                             dynamic_ncols=True)
        else:
            self._write(f"{stage}: started, {total:,} {unit}")

    def advance(self, stage: str, n: int = 1, *, note: str = "") -> None:
        state = self._stages[stage]
        state.done += n
        finished = state.total > 0 and state.done >= state.total
        if state.bar is not None:
            if note:
                state.bar.set_postfix_str(visible(note), refresh=False)
            state.bar.update(n) if n else state.bar.refresh()
            if finished:
                state.bar.close()
            return
        now = self._clock()
        if not finished and not (n == 0 and note) and now - state.printed < self.interval:
            return
        state.printed = now
        line = progress_line(stage, state.done, state.total, state.unit, now - state.started)
        self._write(f"{line}; {note}" if note else line)

    def close(self) -> None:
        """Close the bars still open (a stage stopped before its total)."""
        for state in self._stages.values():
            if state.bar is not None:
                state.bar.close()

    def __enter__(self) -> StderrProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self, line: str) -> None:
        self.file.write(visible(line) + "\n")
        self.file.flush()


def _isatty(file: TextIO) -> bool:
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError):  # a closed or unusual stream
        return False
