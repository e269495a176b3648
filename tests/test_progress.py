"""The CLI's progress: plain lines for logs (not a terminal), bars that fit an 80-column terminal."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from lmgeom.cli import common


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def captured(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    out = io.StringIO()
    monkeypatch.setattr(common, "err_console", Console(file=out, width=80, force_terminal=False, color_system=None))
    return out


def test_lines_at_start_every_interval_and_at_the_end(captured: io.StringIO) -> None:
    clock = FakeClock()
    lines = common.LineProgress(interval=10.0, clock=clock)
    lines.start("extract", 4000, unit="sentences")
    for _ in range(3):  # 3 s: no line before the interval has passed
        clock.now += 1.0
        lines.advance("extract", 100, note="100 sentences/s")
    clock.now += 8.0  # 11 s after the start: a line with the count, the share, the elapsed time and the ETA
    lines.advance("extract", 100, note="36 words/s")
    clock.now += 1.0
    lines.advance("extract", 3600, note="done")  # complete: a line at once
    assert captured.getvalue().splitlines() == [
        "extract: started, 4,000 sentences",
        "extract: 400/4,000 sentences (10 %), 0:00:11 elapsed, ETA 0:01:39; 36 words/s",
        "extract: 4,000/4,000 sentences (100 %), 0:00:12 elapsed; done",
    ]


def test_rich_progress_writes_lines_when_not_a_terminal(captured: io.StringIO) -> None:
    with common.RichProgress() as progress:
        progress.start("calibrate", 2, unit="fits")
        progress.advance("calibrate", note="L0 whitening [x]")
        progress.advance("calibrate", note="L0 abtt")
    text = captured.getvalue().splitlines()
    assert text[0] == "calibrate: started, 2 fits"
    assert text[-1].startswith("calibrate: 2/2 fits (100 %), 0:00:")
    assert text[-1].endswith("; L0 abtt")
    assert not any("━" in line for line in text)  # no bar in a log


def test_lines_fit_the_console_width(captured: io.StringIO) -> None:
    lines = common.LineProgress(interval=10.0, clock=FakeClock())
    lines.start("extract lee[:60]", 60, unit="sentences")
    lines.advance("extract lee[:60]", 60, note="351 sentences/s, 8,140 words/s, 3 chunks committed, 2 windows split")
    assert captured.getvalue().splitlines()[-2:] == [
        "extract lee[:60]: 60/60 sentences (100 %), 0:00:00 elapsed",
        "  351 sentences/s, 8,140 words/s, 3 chunks committed, 2 windows split",
    ]  # the note on a line of its own, not past 80 columns and not cut


def test_bars_fit_an_80_column_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(common, "err_console", Console(file=out, width=80, force_terminal=True, color_system=None))
    with common.RichProgress() as progress:
        progress.start("extract lee", 2680, unit="sentences")
        progress.advance("extract lee", 1024, note="47 sentences/s, 1,172 words/s, 3 chunks committed")
    rendered = [line for line in out.getvalue().replace("\r", "\n").splitlines() if "extract" in line]
    final = rendered[-1]
    assert "1024/2680" in final and "47 sentences/s" in final  # the rate is kept, cut only at its end
    # one line (nothing wrapped onto the next), at most 80 columns once the terminal's control codes are removed
    import re
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert all(len(line) <= 80 for line in plain.replace("\r", "\n").splitlines())
    assert not any(line.strip().startswith(("1,172", "words/s")) for line in plain.splitlines())


def test_help_imports_no_heavy_library() -> None:
    """`lmgeom --help` builds every command without loading torch, scikit-learn, zarr or pandas (each
    command imports what it needs when it runs), so it answers in well under a second."""
    import subprocess
    import sys

    code = ("import sys, lmgeom.cli.main; "
            "print(sorted(m for m in ('torch', 'sklearn', 'zarr', 'pandas', 'transformers', 'scipy') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]"


def test_help_defaults_match_the_library() -> None:
    from lmgeom.calibrate import METHOD_NAMES, METHODS
    from lmgeom.cli import calibrate
    from lmgeom.metrics.isotropy import REPORT_MAX_ROWS

    assert calibrate.EVAL_ROWS_DEFAULT == f"{REPORT_MAX_ROWS:,}"
    assert tuple(METHODS) == METHOD_NAMES


# ---- text from a user's data on a terminal -----------------------------------------------------

ESCAPES = {"\x1b[2J": "\\x1b[2J", "\x1b]0;pwned\x07": "\\x1b]0;pwned\\x07", "\x9b31m": "\\x9b31m",
           "\u202eevil": "\\u202eevil", "a\tb\nc": "a\\tb\\nc"}
"""Text holding control characters (clear screen, an OSC window title, an 8-bit CSI, a bidi override,
a tab and a line end), and how it is shown."""


def test_control_characters_are_shown_as_escapes_and_other_text_is_kept() -> None:
    from lmgeom.progress import visible

    for raw, shown in ESCAPES.items():
        assert visible(raw) == shown
    assert visible("a\nb", keep="\n") == "a\nb"
    assert visible("bank — naïve 東京 [x]") == "bank — naïve 東京 [x]"


def test_console_and_progress_show_a_users_control_characters(monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.table import Table

    for terminal in (False, True):
        out = io.StringIO()
        console = common.VisibleConsole(file=out, width=200, force_terminal=terminal, color_system=None)
        monkeypatch.setattr(common, "console", console)
        monkeypatch.setattr(common, "err_console", console)  # progress goes to standard error: here the same buffer
        with common.RichProgress() as progress:
            for raw in ESCAPES:
                progress.start(f"extract {raw}.txt", 2, unit="sentences")
                progress.advance(f"extract {raw}.txt", 2, note=f"word {raw}")
        table = Table(title="\x1b[2J title")
        table.add_column("word")
        table.add_row("cell \x1b]0;pwned\x07")
        console.print(table)
        console.print(f"  • {common.shown('least self-similar: [/], bank' + chr(27) + '[31m')}")
        text = out.getvalue()
        if terminal:  # rich's own cursor codes (hide, show, erase line) are all the ESCs left
            text = re.sub(r"\x1b\[(\?25[lh]|2K|1A|[0-9;]*m)", "", text)
        assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text and "\u202e" not in text
        for shown in ESCAPES.values():
            assert f"extract {shown}.txt" in text and f"word {shown}" in text
        assert "\\x1b[2J title" in text and "cell \\x1b]0;pwned\\x07" in text
        assert "least self-similar: [/], bank\\x1b[31m" in text


def test_cli_prints_a_corpus_files_name_and_words_with_control_characters_visibly(tmp_path: Path) -> None:
    """tiny-gpt2 (byte-level pieces keep every character) on a JSONL corpus named and worded with escapes."""
    from typer.testing import CliRunner

    from lmgeom.cli.main import app

    corpus = tmp_path / "w\x1b[2J.jsonl"
    sentences = [["the", "bank\x1b]0;pwned\x07", "of", "the", "river", "flows", "x\x1b[31mred"],
                 ["a", "bank\x1b]0;pwned\x07", "gave", "x\x1b[31mred", "loans", "today"]]
    corpus.write_text("".join(json.dumps({"text": words}) + "\n" for _ in range(6) for words in sentences))
    store = tmp_path / "store"
    extract = CliRunner().invoke(app, ["extract", "tiny-gpt2", "--corpus", str(corpus), "--out", str(store)])
    assert extract.exit_code == 0, extract.output
    assert "\x1b" not in extract.output and "w\\x1b[2J" in extract.output  # the progress and the store's header
    analyze = CliRunner().invoke(app, ["analyze", str(store), "--min-contexts", "2"], env={"COLUMNS": "300"})
    assert analyze.exit_code == 0, analyze.output
    assert "\x1b" not in analyze.output and "\x07" not in analyze.output
    assert "bank\\x1b]0;pwned\\x07" in analyze.output and "x\\x1b[31mred" in analyze.output  # in the findings
