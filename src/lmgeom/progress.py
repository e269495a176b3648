"""How driver functions report progress: `start` a stage with its total, then `advance` it; and
`visible`, which shows the control characters of text bound for a terminal.

The CLI passes a rich progress bar (`lmgeom.cli.common.RichProgress`); Python callers may pass
their own object with these two methods, or nothing.
"""

from __future__ import annotations

import re
from typing import Protocol

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
