"""Bad input, damaged files and a full disk: exit 2 with one `error:` line naming the option or file and
the fix, no traceback; a bug (any other exception) shows its traceback and asks for a report (exit 1);
`lmgeom.errors.InputError` names the Python parameter, the CLI its option."""

from __future__ import annotations

import errno
import json
import os
import pickle
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from lmgeom.cli.common import cli_message
from lmgeom.cli.main import app
from lmgeom.errors import InputError, MissingInput
from lmgeom.store import layout
from lmgeom.store.arrays import write_store_from_arrays

WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran"]


def invoke(*args: str | Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    return result.exit_code, result.output


def one_error(code: int, output: str) -> str:
    """The `error:` line of a refused command (exit 2, one line, no traceback), its text joined."""
    assert code == 2, output
    assert "Traceback" not in output and output.count("error:") == 1, output
    return " ".join(output.split())


def small_store(path: Path, *, dim: int = 6, n_layers: int = 3, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    sentences = [[WORDS[i] for i in rng.integers(0, len(WORDS), size=5)] for _ in range(30)]
    n_rows = sum(map(len, sentences))
    write_store_from_arrays(path, [rng.standard_normal((n_rows, dim)).astype(np.float32) for _ in range(n_layers)],
                            sentences)
    return path


# ---- the exception type and the CLI's words for its parameters ---------------------------------

def test_input_error_names_python_parameters_and_the_cli_writes_its_flags() -> None:
    error = InputError("`min_contexts` must be at least 1; got 0", param="min_contexts",
                       fix="lower it, or pass `overwrite=True`, `device='cpu'` or `include_punct=False`")
    assert isinstance(error, ValueError) and error.params == ("min_contexts",)
    assert str(error) == ("`min_contexts` must be at least 1; got 0; lower it, or pass `overwrite=True`, "
                          "`device='cpu'` or `include_punct=False`")
    # only the parameters the error names are rewritten
    assert cli_message(error) == ("--min-contexts must be at least 1; got 0; lower it, or pass `overwrite=True`, "
                                  "`device='cpu'` or `include_punct=False`")
    every = InputError("`overwrite=True`, `device='cpu'`, `include_punct=False`, `include_punct=True`, `seed`",
                       param=("overwrite", "device", "include_punct"))
    assert cli_message(every) == "--overwrite, --device cpu, --exclude-punct, --include-punct, `seed`"


def test_input_errors_keep_their_parameters_through_pickle() -> None:
    # an error raised in a worker process reaches the parent whole
    for error in (InputError("`data` is empty", param="data", fix="give files"),
                  MissingInput("no `data` folder", param="data")):
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is type(error) and str(again) == str(error) and again.params == ("data",)
    assert isinstance(MissingInput("x"), FileNotFoundError)


def test_a_library_error_names_the_parameter_and_the_cli_its_option(tmp_path: Path) -> None:
    from lmgeom.runs.analysis import analyze_store

    store = small_store(tmp_path / "s")
    with pytest.raises(InputError, match="`min_contexts` must be at least 2") as raised:
        analyze_store(store, min_contexts=0)
    assert "--" not in str(raised.value) and raised.value.params == ("min_contexts",)


def test_a_bug_shows_its_traceback_and_asks_for_a_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import lmgeom.runs

    def broken(*args: Any, **kwargs: Any) -> None:
        raise KeyError("words")  # an internal error, not the user's input

    monkeypatch.setattr(lmgeom.runs, "analyze_store", broken, raising=False)
    result = CliRunner().invoke(app, ["analyze", str(small_store(tmp_path / "s"))], env={"COLUMNS": "200"})
    assert result.exit_code == 1
    assert "Traceback" in result.output and "KeyError: 'words'" in result.output
    assert "bug in lmgeom" in result.output and "please report it" in result.output
    assert "error: 'words'" not in result.output
