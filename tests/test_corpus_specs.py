"""Every malformed corpus spec is a clear error naming the spec and the accepted forms, in the API and the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from lmgeom.cli import common
from lmgeom.cli.main import app
from lmgeom.corpus import load_corpus

BAD_SPECS = [
    ("lee:x", ValueError, "takes no argument"),
    ("brown:/no/such/dir", FileNotFoundError, "no cats.txt"),
    ("sts:/no/such", FileNotFoundError, "no STS.input"),
    ("hf:a:b", ValueError, "hf:NAME"),
    ("hf:", ValueError, "hf:NAME"),
    ("hf:::", ValueError, "hf:NAME"),
    ("hf:name::text", ValueError, "hf:NAME"),
    ("", ValueError, "empty corpus spec"),
    ("   ", ValueError, "empty corpus spec"),
    ("no_such_file.txt", FileNotFoundError, "neither a built-in corpus nor an existing file"),
]


@pytest.mark.parametrize(("spec", "error", "problem"), BAD_SPECS)
def test_bad_spec_names_itself_and_the_accepted_forms(spec: str, error: type[Exception], problem: str) -> None:
    with pytest.raises(error) as raised:
        load_corpus(spec)
    message = str(raised.value)
    assert f"corpus {spec!r}" in message and problem in message
    for form in ("lee", "brown:DIR", "sts:DIR", "hf:NAME:SPLIT:COLUMN", "hf:NAME/CONFIG:SPLIT:COLUMN", ".jsonl"):
        assert form in message


def test_folder_that_is_neither_brown_nor_sts(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("A sentence.\n")
    with pytest.raises(ValueError, match=r"neither an NLTK Brown corpus \(no cats.txt\) nor STS data") as raised:
        load_corpus(str(tmp_path))
    assert repr(str(tmp_path)) in str(raised.value)


def test_good_folders_still_load(tmp_path: Path) -> None:
    brown = tmp_path / "brown"
    brown.mkdir()
    (brown / "cats.txt").write_text("ca01 news\n")
    (brown / "ca01").write_text("The/at dog/nn ran/vbd ./.\n\nIt/pps barked/vbd ./.\n")
    corpus = load_corpus(str(brown))
    assert [[word.text for word in s.words] for s in corpus] == [["The", "dog", "ran", "."], ["It", "barked", "."]]
    sts = tmp_path / "sts" / "STS12-en-test"
    sts.mkdir(parents=True)
    (sts / "STS.input.x.txt").write_text("A man eats.\tA woman eats.\nA man eats.\tA dog runs.\n")
    assert [s.text for s in load_corpus(f"sts:{tmp_path / 'sts'}")] == ["A man eats.", "A woman eats.", "A dog runs."]


def test_cli_reports_a_bad_corpus_in_one_line_with_exit_code_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common.err_console, "width", 10_000)  # so the terminal width does not wrap the line
    result = CliRunner().invoke(app, ["extract", "tiny-bert", "--corpus", "lee:x", "--out", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, TypeError)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: corpus 'lee:x': the lee corpus takes no argument")
    assert not (tmp_path / "run").exists()


def test_cli_reports_a_bad_hf_spec_without_markup_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common.err_console, "width", 10_000)
    result = CliRunner().invoke(app, ["extract", "tiny-bert", "--corpus", "hf:a:b", "--out", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [result.output.strip()]
    assert "hf:NAME/CONFIG:SPLIT:COLUMN" in result.output
