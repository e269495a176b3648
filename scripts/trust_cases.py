#!/usr/bin/env python
"""Reproduce the trust cases of lmgeom on real tiny stores and say, case by case, whether each behaves
as expected: stale results (recomputed by `run`), foreign or mixed result files (refused, naming the
file), damaged or edited store files (refused by every reader and by `lmgeom verify`, naming the file),
the user's own files (never replaced or removed), hostile words and file names (escaped in the report,
no raw ESC byte printed), one-line errors (exit 2, no traceback) and the determinism of `geometry` in
fresh processes.

Every case works on a copy of one base run, made once per invocation: tiny-bert (built from a config,
offline) over the first 60 Lee sentences, `--min-contexts 3 --layers 0,3 --num-workers 1 --device cpu
--permutations 20`.
The CLI runs in this process (`typer.testing.CliRunner`); exit code 2 is a user error with one `error:`
line, and "internal error" or a traceback in the output is a failure.

    python scripts/trust_cases.py                 # a table row per case, then the counts
    python scripts/trust_cases.py --markdown      # the same as a Markdown table (docs/robustness.md)
    python scripts/trust_cases.py --only 5,8,13   # some cases
    python scripts/trust_cases.py --workdir DIR   # keep the stores and runs in DIR

Exit status 0 when every case behaves as expected, 1 otherwise. `run_cases(workdir, only)` returns the
`CaseResult`s (tests/test_trust_cases.py calls it)."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

MODEL, CORPUS = "tiny-bert", "lee"
BASE_OPTIONS: dict[str, Any] = {"limit": 60, "device": "cpu", "min_contexts": 3, "layers": "0,3", "num_workers": 1,
                                "permutations": 20}
"""The base run's options (as `lmgeom.pipeline.run` keywords)."""
BASE_ARGS = [word for key, value in BASE_OPTIONS.items() for word in (f"--{key.replace('_', '-')}", str(value))]
"""The same as `lmgeom run` arguments."""
READERS: tuple[tuple[str, ...], ...] = (
    ("analyze", "--min-contexts", "2", "--num-workers", "1", "--device", "cpu"), ("similarity",), ("geometry",))
"""The commands that read a store's layers: each must refuse a damaged or edited store."""
HOSTILE_WORD = "http://x.com/a<!--<script>b"
ESC = "\x1b"
SCREEN_CLEAR = ESC + "[2J"


@dataclass
class CaseResult:
    """One case: its id, defect class, what was done, what was expected, what was observed, whether it
    behaved as expected, and how long it took."""

    id: str
    defect_class: str
    done: str
    expected: str
    observed: str
    passed: bool
    seconds: float = 0.0


# ---- running the CLI and recording what was observed ------------------------------------------------


@dataclass
class Outcome:
    """What a CLI command did: its exit code and everything it printed (stdout and stderr)."""

    args: list[str]
    code: int
    output: str
    exception: BaseException | None = None

    @property
    def flat(self) -> str:
        """The output without the spaces, line breaks and box lines a terminal layout adds."""
        return "".join(self.output.replace("│", " ").split())

    def names(self, text: str | Path) -> bool:
        return "".join(str(text).split()) in self.flat

    @property
    def error_line(self) -> str:
        """The `error:` line, else the end of what was printed (for a command that did not refuse)."""
        lines = [line.strip() for line in self.output.splitlines() if line.strip().startswith(("error:", "internal error:"))]
        return " ".join(lines) if lines else " ".join(self.output.replace("│", " ").split())

    @property
    def internal(self) -> bool:
        """A bug rather than a user's error: a traceback, "internal error", or an uncaught exception."""
        uncaught = self.exception is not None and not isinstance(self.exception, SystemExit)
        return uncaught or "internal error" in self.output or "Traceback" in self.output


def cli(*args: str | Path, cwd: Path | None = None) -> Outcome:
    """`lmgeom ARGS` in this process, in a 200-column terminal."""
    from typer.testing import CliRunner

    from lmgeom.cli.main import app

    words = [str(arg) for arg in args]
    with contextlib.chdir(cwd) if cwd is not None else contextlib.nullcontext():
        result = CliRunner().invoke(app, words, env={"COLUMNS": "200"})
    output = result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        output += f"\n[uncaught {type(result.exception).__name__}: {result.exception}]"
    return Outcome(words, result.exit_code, output, result.exception)


class Checks:
    """The observations of one case; the case passes when every one is as expected. A observation not
    as expected is marked "(x)"."""

    def __init__(self, workdir: Path | None = None) -> None:
        self.parts: list[str] = []
        self.passed = True
        self.workdir = workdir

    def excerpt(self, outcome: Outcome) -> str:
        """The command's error line (else the end of what it printed), without this machine's folders, clipped."""
        text = anonymous(outcome.error_line, self.workdir)
        if outcome.error_line.startswith(("error:", "internal error:")):
            return text[:240]
        return "… " + text[-160:]

    def add(self, ok: Any, text: str) -> bool:
        self.passed = self.passed and bool(ok)
        self.parts.append(text if ok else f"(x) {text}")
        return bool(ok)

    def succeeded(self, label: str, outcome: Outcome) -> bool:
        ok = outcome.code == 0 and not outcome.internal
        return self.add(ok, f"{label}: exit 0" if ok else f"{label}: exit {outcome.code}: {self.excerpt(outcome)}")

    def refused(self, label: str, outcome: Outcome, *, naming: Sequence[str | Path] = (),
                naming_any: Sequence[str | Path] = (), one_line: bool = True) -> bool:
        """Exit 2, no traceback or "internal error", one `error:` line (when `one_line`), naming each of
        `naming` and at least one of `naming_any`."""
        problems = []
        if outcome.code != 2:
            problems.append(f"exit {outcome.code}")
        if outcome.internal:
            problems.append("internal error")
        if one_line and outcome.code == 2 and outcome.output.count("error:") != 1:
            problems.append(f"{outcome.output.count('error:')} error: lines")
        missing = [short(name) for name in naming if not outcome.names(name)]
        if missing:
            problems.append("does not name " + ", ".join(missing))
        named_any = [name for name in naming_any if outcome.names(name)]
        if naming_any and not named_any:
            problems.append("names none of " + ", ".join(map(str, naming_any)))
        if problems:
            return self.add(False, f"{label}: {'; '.join(problems)}: {self.excerpt(outcome)}")
        shown = [short(name) for name in (*naming, *named_any[:1])]
        return self.add(True, f"{label}: exit 2" + (", one error line" if one_line else "")
                        + (f" naming {', '.join(shown)}" if shown else ""))

    @property
    def observed(self) -> str:
        return "; ".join(self.parts)


def short(name: str | Path) -> str:
    """What a message names, as the table shows it: a file by its path inside a run or store
    (layers/1/c/0/0) or its name; anything else as given."""
    if not isinstance(name, Path):
        return name
    text = str(name)
    match = re.search(r"(layers/.*|static/.*)$", text)
    return match.group(1) if match else Path(text).name


# ---- the stores, runs and damage the cases share ------------------------------------------------


class Lab:
    """The working folder of one invocation: the base run (made once), a second store of the same model
    and corpus (made once, when a case needs it), and a folder per case."""

    def __init__(self, workdir: Path, base: Path | None = None) -> None:
        self.workdir = Path(workdir)
        self._given = base
        self._base: Path | None = None
        self._other: Path | None = None

    @property
    def base(self) -> Path:
        if self._base is None:
            from lmgeom.pipeline import run

            path = self.workdir / "base-run"
            if path.exists():
                shutil.rmtree(path)
            if self._given is not None:  # a run made with BASE_OPTIONS already (the tests' session run)
                shutil.copytree(self._given, path)
                result = run(MODEL, CORPUS, out=path, **BASE_OPTIONS)
                assert set(result.steps_run) <= {"explorer", "report"}, f"the given base run is not one of {BASE_OPTIONS}: {result.steps_run}"
            else:
                result = run(MODEL, CORPUS, out=path, **BASE_OPTIONS)
                assert result.steps_run[-1] == "report", result.steps_run
            self._base = path
        return self._base

    @property
    def other_store(self) -> Path:
        """Another tiny extraction: `lmgeom extract tiny-bert --corpus lee --limit 30`."""
        if self._other is None:
            path = self.workdir / "other-store"
            if path.exists():
                shutil.rmtree(path)
            outcome = cli("extract", MODEL, "--corpus", CORPUS, "--limit", "30", "--out", path)
            assert outcome.code == 0, outcome.output
            self._other = path
        return self._other

    def copy_other(self, case: str, name: str) -> Path:
        """A copy of the other store, as `name` in the case's folder (emptied first: call it before `copy`)."""
        return Path(shutil.copytree(self.other_store, self.folder(case) / name))

    def folder(self, case: str) -> Path:
        path = self.workdir / f"case-{case}"
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        return path

    def copy(self, case: str, name: str = "run") -> Path:
        """A copy of the base run in the case's folder."""
        folder = self.workdir / f"case-{case}"
        folder.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copytree(self.base, folder / name))


def provenance(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())["provenance"]


def rewrite_json(path: Path, edit: Callable[[Any], Any]) -> None:
    document = json.loads(path.read_text())
    edit(document)
    path.write_text(json.dumps(document, indent=2))


def zero_chunk_rows(run: Path, layer: int = 1, rows: int = 500) -> tuple[Path, str]:
    """Zero `rows` rows' worth of bytes in the middle of the largest chunk file of `layer`, its size kept."""
    array = json.loads((run / "layers" / str(layer) / "zarr.json").read_text())
    row_bytes = int(array["shape"][-1]) * {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}[array["data_type"]]
    chunks = [path for path in (run / "layers" / str(layer) / "c").rglob("*") if path.is_file()]
    path = max(chunks, key=lambda chunk: chunk.stat().st_size)
    data = bytearray(path.read_bytes())
    span = min(rows * row_bytes, len(data) // 2 // row_bytes * row_bytes)
    start = (len(data) - span) // 2 // row_bytes * row_bytes
    data[start:start + span] = bytes(span)
    path.write_bytes(bytes(data))
    return path, f"bytes {start}..{start + span} of {path.relative_to(run)} zeroed ({span // row_bytes} rows), size kept"


def flip_token_bits(run: Path) -> tuple[Path, str]:
    path = run / "tokens.parquet"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x0F
    path.write_bytes(bytes(data))
    return path, "4 bits flipped in the middle of tokens.parquet"


def retype_layer(run: Path) -> tuple[Path, str]:
    path = run / "layers" / "2" / "zarr.json"
    rewrite_json(path, lambda array: array.update(data_type="int32"))
    return path, "layers/2/zarr.json data_type float32 -> int32"


def drop_stored_layer(run: Path) -> tuple[Path, str]:
    def edit(meta: dict[str, Any]) -> None:
        for record in (meta, meta.get("settings", {})):
            if "stored_layers" in record:
                record["stored_layers"] = [layer for layer in record["stored_layers"] if layer != 2]

    path = run / "meta.json"
    rewrite_json(path, edit)
    return path, "meta.json stored_layers without layer 2"


def change_n_layers(run: Path) -> tuple[Path, str]:
    path = run / "meta.json"
    rewrite_json(path, lambda meta: meta.update(n_layers=meta["n_layers"] + 1))
    return path, "meta.json n_layers + 1"


DAMAGE: dict[str, Callable[[Path], tuple[Path, str]]] = {
    "8": zero_chunk_rows, "9": flip_token_bits, "10": retype_layer, "11": drop_stored_layer, "12": change_n_layers}


def with_matching_digest(run: Path) -> None:
    """meta.json's digest (meta.json.crc32c) rewritten to match its edited text, as lmgeom's writer would
    (what tests/helpers.py `rewrite_meta` does): only the checks of meta.json against the rest of the
    store can catch the edit."""
    from lmgeom.store.integrity import write_meta
    from lmgeom.store.location import Location

    write_meta(Location.of(run), json.loads((run / "meta.json").read_text()))


def every_reader_refuses(checks: Checks, run: Path, named: Path) -> None:
    for command in READERS:
        checks.refused(command[0], cli(command[0], run, *command[1:]), naming=[named])


# ---- the cases ----------------------------------------------------------------------------------------


@dataclass
class Case:
    id: str
    defect_class: str
    done: str
    expected: str
    check: Callable[[Lab, Checks], None]


CASES: list[Case] = []


def case(id: str, defect_class: str, done: str, expected: str) -> Callable[[Callable[[Lab, Checks], None]], Callable[[Lab, Checks], None]]:
    def register(check: Callable[[Lab, Checks], None]) -> Callable[[Lab, Checks], None]:
        CASES.append(Case(id, defect_class, done, expected, check))
        return check
    return register


STALE, FOREIGN, CORRUPT, USER, ESCAPING, ONE_LINE, DETERMINISM = (
    "stale", "foreign/mixed", "corruption", "user files", "escaping", "one-line errors", "determinism")


@case("1", STALE, "`analyze RUN --min-contexts 2`, `report RUN`, then `run` with the run's own options",
      "report exits 2 naming contextuality.json (or summary.json); run recomputes contextuality "
      "(steps_run has it), its provenance min_contexts back to 3")
def stale_analysis(lab: Lab, checks: Checks) -> None:
    from lmgeom.pipeline import run

    path = lab.copy("1")
    checks.succeeded("analyze --min-contexts 2", cli("analyze", path, "--min-contexts", "2", "--num-workers", "1", "--device", "cpu"))
    page = path.parent / "r.html"
    checks.refused("report", cli("report", path, "--out", page), naming_any=["contextuality.json", "summary.json"])
    checks.add(not page.exists(), "no report written" if not page.exists() else "a report was written")
    result = run(MODEL, CORPUS, out=path, **BASE_OPTIONS)
    checks.add("contextuality" in result.steps_run, f"run re-ran {', '.join(result.steps_run)}")
    recorded = provenance(path / "contextuality.json")["settings"]["min_contexts"]
    checks.add(recorded == 3, f"contextuality.json min_contexts {recorded}")


@case("2", STALE, "`run --min-contexts 2` on a run made with 3",
      "contextuality, static_embeddings and geometry re-run, similarity (which reads every row) not; "
      "`static/<layer>.benchmarks.json` provenance min_contexts 2")
def stale_min_contexts(lab: Lab, checks: Checks) -> None:
    from lmgeom.pipeline import run

    path = lab.copy("2")
    result = run(MODEL, CORPUS, out=path, **{**BASE_OPTIONS, "min_contexts": 2})
    missing = {"contextuality", "static_embeddings", "geometry"} - set(result.steps_run)
    checks.add(not missing, f"run re-ran {', '.join(result.steps_run)}" + (f", not {', '.join(sorted(missing))}" if missing else ""))
    checks.add("similarity" in result.steps_skipped, "similarity skipped" if "similarity" in result.steps_skipped
               else "similarity re-run")
    for name in ("static/0.benchmarks.json", "static/3.benchmarks.json", "contextuality.json", "geometry.json"):
        recorded = provenance(path / name)["settings"]["min_contexts"]
        checks.add(recorded == 2, f"{name} min_contexts {recorded}")


@case("3", STALE, "`run --count-by occurrences` on a run counted by sentences",
      "geometry and contextuality re-run, their provenance count_by occurrences")
def stale_count_by(lab: Lab, checks: Checks) -> None:
    from lmgeom.pipeline import run

    path = lab.copy("3")
    result = run(MODEL, CORPUS, out=path, **{**BASE_OPTIONS, "count_by": "occurrences"})
    missing = {"contextuality", "geometry"} - set(result.steps_run)
    checks.add(not missing, f"run re-ran {', '.join(result.steps_run)}" + (f", not {', '.join(sorted(missing))}" if missing else ""))
    for name in ("contextuality.json", "geometry.json"):
        recorded = provenance(path / name)["settings"]["count_by"]
        checks.add(recorded == "occurrences", f"{name} count_by {recorded}")


@case("4", FOREIGN, "`analyze STORE_B --out RUN_A` (STORE_B: another tiny extraction, 30 Lee sentences)",
      "exit 2 naming RUN_A as another store's folder; RUN_A/contextuality.json unchanged byte for byte")
def foreign_out(lab: Lab, checks: Checks) -> None:
    path = lab.copy("4", "RUN_A")
    before = (path / "contextuality.json").read_bytes()
    outcome = cli("analyze", lab.other_store, "--out", path, "--min-contexts", "3", "--num-workers", "1", "--device", "cpu")
    checks.refused("analyze", outcome, naming=[path])
    checks.add((path / "contextuality.json").read_bytes() == before,
               "contextuality.json unchanged" if (path / "contextuality.json").read_bytes() == before else "contextuality.json changed")


@case("5", FOREIGN, "contextuality.json and its CSVs copied from STORE_B's analysis into RUN_A; "
      "`report RUN_A`, `compare RUN_A RUN_A`, `run` on RUN_A",
      "each refuses (exit 2 / ResultFileError) naming contextuality.json; the file is not replaced")
def foreign_result(lab: Lab, checks: Checks) -> None:
    from lmgeom.pipeline import run
    from lmgeom.rundir import ResultFileError

    other = lab.copy_other("5", "store-b")
    folder = other.parent
    checks.succeeded("analyze STORE_B", cli("analyze", other, "--min-contexts", "3", "--num-workers", "1", "--device", "cpu"))
    path = lab.copy("5", "RUN_A")
    for name in ("contextuality.json", "contextuality_layers.csv", "contextuality_words.csv"):
        shutil.copy(other / name, path / name)
    foreign = (other / "contextuality.json").read_bytes()
    checks.refused("report", cli("report", path, "--out", folder / "r.html"), naming=["contextuality.json"])
    checks.refused("compare", cli("compare", path, path, "--out", folder / "compare"), naming=["contextuality.json"])
    try:
        result = run(MODEL, CORPUS, out=path, **BASE_OPTIONS)
        checks.add(False, f"run: no error, re-ran {', '.join(result.steps_run)}")
    except ResultFileError as error:
        checks.add("contextuality.json" in str(error), f"run: ResultFileError {'naming' if 'contextuality.json' in str(error) else 'not naming'} contextuality.json")
    replaced = (path / "contextuality.json").read_bytes() != foreign
    checks.add(not replaced, "contextuality.json replaced" if replaced else "contextuality.json not replaced")
    checks.add(not (folder / "r.html").exists(), "no report written" if not (folder / "r.html").exists() else "a report was written")


@case("6", FOREIGN, "a row appended to contextuality_words.csv after the write (what a kill between files leaves); "
      "`report`, then `run`",
      "report exits 2 naming contextuality.json and contextuality_words.csv; run recomputes contextuality")
def mixed_set(lab: Lab, checks: Checks) -> None:
    from lmgeom.pipeline import run
    from lmgeom.rundir import digest

    path = lab.copy("6")
    words = path / "contextuality_words.csv"
    words.write_text(words.read_text() + words.read_text().splitlines()[-1] + "\n")
    checks.refused("report", cli("report", path, "--out", path.parent / "r.html"),
                   naming=["contextuality.json", "contextuality_words.csv"])
    result = run(MODEL, CORPUS, out=path, **BASE_OPTIONS)
    checks.add("contextuality" in result.steps_run, f"run re-ran {', '.join(result.steps_run)}")
    recorded = provenance(path / "contextuality.json")["companions"]["contextuality_words.csv"]
    checks.add(recorded == digest(words.read_bytes()), "contextuality_words.csv one set with contextuality.json again"
               if recorded == digest(words.read_bytes()) else "contextuality_words.csv still not the recorded one")


@case("7", FOREIGN, "`static-embeddings RUN --layer 3 --data-dir /nonexistent`",
      "exit 2; static/3.benchmarks.json unchanged")
def static_without_benchmarks(lab: Lab, checks: Checks) -> None:
    path = lab.copy("7")
    record = path / "static" / "3.benchmarks.json"
    before = record.read_bytes()
    checks.refused("static-embeddings", cli("static-embeddings", path, "--layer", "3", "--min-contexts", "3",
                                            "--data-dir", "/nonexistent"))
    checks.add(record.read_bytes() == before, "static/3.benchmarks.json unchanged" if record.read_bytes() == before
               else "static/3.benchmarks.json changed")


@case("8", CORRUPT, "500 rows' worth of bytes zeroed in the middle of a layers/1 chunk file, its size kept; "
      "`analyze`, `similarity`, `geometry`, `report`",
      "each reader of the layers exits 2 with one error line naming the chunk file (`report` with "
      "`--explorer-words 50`, which reads the layers for its word explorer, included); `report` alone reads no "
      "layer and renders the results computed before the damage, unchanged")
def zeroed_chunk(lab: Lab, checks: Checks) -> None:
    path = lab.copy("8")
    results = {name: (path / name).read_bytes() for name in ("contextuality.json", "isotropy.json", "geometry.json")}
    damaged, what = zero_chunk_rows(path)
    checks.parts.append(what)
    every_reader_refuses(checks, path, damaged)
    checks.refused("report --explorer-words 50 (its word explorer read from the layers again)",
                   cli("report", path, "--out", path.parent / "r2.html", "--explorer-words", "50"), naming=[damaged])
    checks.succeeded("report (result files only)", cli("report", path, "--out", path.parent / "r.html"))
    kept = all((path / name).read_bytes() == data for name, data in results.items())
    checks.add(kept, "the results computed before the damage are unchanged" if kept else "a result file changed")


@case("9", CORRUPT, "4 bits flipped in tokens.parquet; `analyze`, `similarity`, `geometry`",
      "each exits 2 with one error line naming tokens.parquet")
def flipped_tokens(lab: Lab, checks: Checks) -> None:
    path = lab.copy("9")
    damaged, _ = flip_token_bits(path)
    every_reader_refuses(checks, path, damaged)


@case("10", CORRUPT, "layers/2/zarr.json data_type float32 -> int32 (valid JSON); `analyze`, `similarity`, `geometry`",
      "each exits 2 with one error line naming layers/2/zarr.json")
def retyped_layer(lab: Lab, checks: Checks) -> None:
    path = lab.copy("10")
    damaged, _ = retype_layer(path)
    every_reader_refuses(checks, path, damaged)


@case("11", CORRUPT, "meta.json stored_layers edited to leave out layer 2 (in a text editor; and again with "
      "meta.json.crc32c rewritten to match); `analyze`, `similarity`, `geometry`",
      "each exits 2 with one error line naming meta.json")
def dropped_layer(lab: Lab, checks: Checks) -> None:
    edited_meta_refused(lab, checks, "11", drop_stored_layer)


@case("12", CORRUPT, "meta.json n_layers changed (in a text editor; and again with meta.json.crc32c rewritten "
      "to match); `analyze`, `similarity`, `geometry`",
      "each exits 2 with one error line naming meta.json")
def changed_n_layers(lab: Lab, checks: Checks) -> None:
    edited_meta_refused(lab, checks, "12", change_n_layers)


def edited_meta_refused(lab: Lab, checks: Checks, case: str, edit: Callable[[Path], tuple[Path, str]]) -> None:
    """meta.json edited by `edit`: every reader refuses it, and `analyze` still does once its digest
    file is rewritten to match (the edit itself contradicts the layer arrays)."""
    path = lab.copy(case)
    damaged, _ = edit(path)
    every_reader_refuses(checks, path, damaged)
    forged = lab.copy(case, "forged")
    edit(forged)
    with_matching_digest(forged)
    checks.refused("with its digest matched, analyze", cli("analyze", forged, *READERS[0][1:]), naming=["meta.json"])


@case("13", CORRUPT, "`lmgeom verify` on each store damaged as in cases 8-12",
      "exit 2 naming the damaged file, for each")
def verify_damaged(lab: Lab, checks: Checks) -> None:
    for number, damage in DAMAGE.items():
        path = lab.copy("13", f"run-{number}")
        damaged, _ = damage(path)
        checks.refused(f"verify ({number})", cli("verify", path), naming=[damaged], one_line=False)


@case("14", USER, "`NOTES.md` and `mydata/` added to a store's folder; `extract --out FOLDER --overwrite` "
      "(other settings: --limit 25)",
      "refused, exit 2 naming NOTES.md and mydata; both still there, the store untouched")
def user_files_in_store(lab: Lab, checks: Checks) -> None:
    store = lab.copy_other("14", "st")
    (store / "NOTES.md").write_text("mine\n")
    (store / "mydata").mkdir()
    meta = (store / "meta.json").read_bytes()
    outcome = cli("extract", MODEL, "--corpus", CORPUS, "--limit", "25", "--out", store, "--overwrite")
    checks.refused("extract --overwrite", outcome, naming=["NOTES.md", "mydata"])
    kept = (store / "NOTES.md").exists() and (store / "NOTES.md").read_text() == "mine\n" and (store / "mydata").is_dir()
    checks.add(kept, "NOTES.md and mydata kept" if kept else "NOTES.md or mydata removed or changed")
    checks.add((store / "meta.json").read_bytes() == meta, "store untouched" if (store / "meta.json").read_bytes() == meta
               else "store rewritten")


@case("15", USER, "`report RUN --out thesis.tex`, thesis.tex an existing file lmgeom did not write",
      "exit 2 naming thesis.tex; the file unchanged")
def user_file_report(lab: Lab, checks: Checks) -> None:
    path = lab.copy("15")
    thesis = path.parent / "thesis.tex"
    text = "\\documentclass{article}\n\\begin{document}Mine.\\end{document}\n"
    thesis.write_text(text)
    checks.refused("report", cli("report", path, "--out", thesis), naming=["thesis.tex"])
    checks.add(thesis.read_text() == text, "thesis.tex unchanged" if thesis.read_text() == text else "thesis.tex changed")


@case("16", USER, "`static-embeddings RUN --layer 3 --out notes.txt`, notes.txt an existing file lmgeom did not write",
      "exit 2 naming notes.txt; the file unchanged")
def user_file_static(lab: Lab, checks: Checks) -> None:
    path = lab.copy("16")
    notes = path.parent / "notes.txt"
    notes.write_text("my notes\n")
    checks.refused("static-embeddings", cli("static-embeddings", path, "--layer", "3", "--min-contexts", "3", "--out", notes),
                   naming=["notes.txt"])
    checks.add(notes.read_text() == "my notes\n", "notes.txt unchanged" if notes.read_text() == "my notes\n" else "notes.txt changed")


def script_elements(page: str) -> list[tuple[str, str]]:
    """Each `<script ...>` element's start tag and text, its text ending where a browser ends it (the first `</script`)."""
    elements = []
    for start in re.finditer(r"<script\b[^>]*>", page, re.I):
        end = page.lower().find("</script", start.end())
        elements.append((start.group(0), page[start.end():end if end >= 0 else len(page)]))
    return elements


def is_data(tag: str, text: str) -> bool:
    """A script element that carries data (JSON, or a JavaScript constant assigned a JSON literal)."""
    return "application/json" in tag or re.match(r"\s*(const|let|var)\s+\w+\s*=\s*[\[{]", text) is not None


@case("17", ESCAPING, f"a corpus file of 40 Lee sentences, every other one with the word `{HOSTILE_WORD}`; `run`, then `report`",
      "every script element of report.html free of `<!--` and `<script`, its data elements (JSON) of any `</`; "
      "the word present (escaped) in its data")
def hostile_word(lab: Lab, checks: Checks) -> None:
    from lmgeom.corpus import load_corpus

    folder = lab.folder("17")
    corpus = folder / "hostile.txt"
    sentences = [sentence.text for sentence in load_corpus(CORPUS, limit=40).sentences]
    corpus.write_text("".join(f"{text} see {HOSTILE_WORD} here\n" if index % 2 == 0 else f"{text}\n"
                              for index, text in enumerate(sentences)))
    path = folder / "run"
    checks.succeeded("run", cli("run", "--model", MODEL, "--corpus", corpus, "--min-contexts", "3", "--layers", "0,3",
                                "--num-workers", "1", "--device", "cpu", "--permutations", "20", "--out", path))
    checks.succeeded("report", cli("report", path, "--out", folder / "report2.html"))
    for page_path in (path / "report.html", folder / "report2.html"):
        if not page_path.exists():
            checks.add(False, f"{page_path.name} missing")
            continue
        page = page_path.read_text()
        elements = script_elements(page)
        bad = [(tag, marker) for tag, text in elements for marker in ("<!--", "<script")
               if marker in text.lower()]
        bad += [(tag, "</") for tag, text in elements if is_data(tag, text) and "</" in text]
        carrying = [tag for tag, text in elements if is_data(tag, text) and "x.com" in text]
        balanced = len(elements) == len(re.findall(r"</script\s*>", page, re.I))
        checks.add(not bad, f"{page_path.name}: {len(elements)} script elements clean" if not bad
                   else f"{page_path.name}: {', '.join(f'{marker!r} inside {tag}' for tag, marker in bad)}")
        checks.add(carrying, f"the word in {len(carrying)} data element(s)" if carrying else "the word in no data element")
        checks.add(balanced, "every script element ends at its own `</script>`" if balanced else "script elements unbalanced")


@case("18", ESCAPING, "a corpus file named `esc\\x1b[2J.txt` with the word `a\\x1b[2Jb` (--pretokenized): "
      "`extract`, `analyze`, `static-embeddings`; `extract` of a missing file so named",
      "no raw ESC byte in anything printed")
def escape_bytes(lab: Lab, checks: Checks) -> None:
    folder = lab.folder("18")
    corpus = folder / f"esc{SCREEN_CLEAR}.txt"
    word = f"a{SCREEN_CLEAR}b"
    corpus.write_text("".join(f"the {word} sat on the mat number {index % 5} .\n" for index in range(20)))
    store = folder / "store"
    outcomes = [
        ("extract", cli("extract", MODEL, "--corpus", corpus, "--pretokenized", "--out", store)),
        ("analyze", cli("analyze", store, "--min-contexts", "2", "--num-workers", "1", "--device", "cpu")),
        ("static-embeddings", cli("static-embeddings", store, "--layer", "1", "--min-contexts", "2", "--data-dir", "/nonexistent")),
        ("extract (missing file)", cli("extract", MODEL, "--corpus", folder / f"missing{SCREEN_CLEAR}.txt", "--out", folder / "none")),
    ]
    from lmgeom.store import RepresentationStore

    stored = store.exists() and word in set(RepresentationStore.open(store).vocab["word"])
    checks.add(stored, "the word stored with its ESC byte" if stored else "the word not stored as given")
    for label, outcome in outcomes:
        raw = ESC in outcome.output
        shown = "\\x1b" in outcome.output  # the name printed with its ESC byte written out
        checks.add(not raw and not outcome.internal,
                   f"{label}: exit {outcome.code}, " + ("a raw ESC byte printed" if raw else "no raw ESC byte")
                   + (", the name shown with \\x1b" if shown and not raw else "")
                   + (" (internal error)" if outcome.internal else ""))


@case("19", ONE_LINE, "`run --model DIR`, DIR holding tiny-bert's config.json and weights but no tokenizer",
      "exit 2, one error line naming the folder and its missing tokenizer; no run folder made")
def model_without_tokenizer(lab: Lab, checks: Checks) -> None:
    from lmgeom.encoders.tiny import tiny_model

    folder = lab.folder("19")
    model = folder / "model"
    tiny_model(MODEL)[0].save_pretrained(model)
    out = folder / "run"
    checks.refused("run", cli("run", "--model", model, "--corpus", CORPUS, "--limit", "5", "--out", out),
                   naming=[model, "tokenizer"])
    checks.add(not out.exists(), "no run folder" if not out.exists() else "a run folder was made")


@case("20", ONE_LINE, "`run --model \"\"`", "exit 2, one error line naming --model; no run folder made")
def empty_model(lab: Lab, checks: Checks) -> None:
    folder = lab.folder("20")
    out = folder / "run"
    checks.refused("run", cli("run", "--model", "", "--corpus", CORPUS, "--out", out), naming=["--model"])
    checks.add(not out.exists(), "no run folder" if not out.exists() else "a run folder was made")


@case("21", ONE_LINE, "`experiment calibration --model tiny-bert --task pos --data DIR --seeds -1,2 --out OUT`",
      "exit 2, one error line naming --seeds; OUT not made")
def negative_seeds(lab: Lab, checks: Checks) -> None:
    folder = lab.folder("21")
    out = folder / "out"
    checks.refused("experiment calibration", cli("experiment", "calibration", "--model", MODEL, "--task", "pos", "--data",
                                                 folder, "--seeds", "-1,2", "--out", out), naming=["--seeds"])
    checks.add(not out.exists(), "OUT not made" if not out.exists() else "OUT was made")


@case("22", ONE_LINE, "`extract`/`run --out s3:/bucket/x` and `--out s3:x`, in an empty folder",
      "each exit 2 naming --out and the URL meant; no folder `s3:` made")
def url_without_slashes(lab: Lab, checks: Checks) -> None:
    folder = lab.folder("22")
    for out, meant in (("s3:/bucket/x", "s3://bucket/x"), ("s3:x", "s3://x")):
        for command in (["extract", MODEL, "--corpus", CORPUS, "--limit", "5", "--out", out],
                        ["run", "--model", MODEL, "--corpus", CORPUS, "--limit", "5", "--out", out]):
            checks.refused(f"{command[0]} --out {out}", cli(*command, cwd=folder), naming=["--out", meant], one_line=False)
    left = sorted(entry.name for entry in folder.iterdir())
    checks.add(not left, "nothing made in the folder" if not left else f"made {', '.join(left)}")


@case("23", ONE_LINE, "`static-embeddings RUN --layer 3 --benchmark some.bin`, some.bin a binary file",
      "exit 2, one error line naming some.bin; static/ unchanged")
def binary_benchmark(lab: Lab, checks: Checks) -> None:
    path = lab.copy("23")
    binary = path.parent / "some.bin"
    binary.write_bytes(bytes(range(256)) * 8)
    before = {entry.name: entry.read_bytes() for entry in (path / "static").iterdir()}
    checks.refused("static-embeddings", cli("static-embeddings", path, "--layer", "3", "--min-contexts", "3",
                                            "--benchmark", binary), naming=["some.bin"])
    after = {entry.name: entry.read_bytes() for entry in (path / "static").iterdir()}
    checks.add(after == before, "static/ unchanged" if after == before else "static/ changed")


def intervals(document: dict[str, Any]) -> Iterator[tuple[str, float, float, float]]:
    """(what, estimate, low, high) of every interval in contextuality.json: each record's raw and adjusted
    value, each difference between adjacent layers."""
    for record in document["records"]:
        for value in ("raw", "adjusted"):
            estimate, low, high = (record.get(key) for key in (value, f"{value}_lo", f"{value}_hi"))
            if None not in (estimate, low, high):
                yield f"layer {record['layer']} {record['metric']} {value}", estimate, low, high
    for record in document.get("bootstrap", {}).get("adjacent_layers") or []:
        if None not in (record.get("difference"), record.get("lo"), record.get("hi")):
            yield (f"layer {record['layer']}-{record['previous_layer']} {record['metric']} difference",
                   record["difference"], record["lo"], record["hi"])


@case("24", ONE_LINE, "`analyze RUN --bootstrap 1`",
      "exit 0 with a warning that the intervals are rough, and contextuality.json flags them rough "
      "(`bootstrap.rough`, `bootstrap_rough`); each end is a replicate of the estimate's own statistic")
def one_resample(lab: Lab, checks: Checks) -> None:
    path = lab.copy("24")
    outcome = cli("analyze", path, "--bootstrap", "1", "--min-contexts", "3", "--num-workers", "1", "--device", "cpu")
    checks.succeeded("analyze", outcome)
    warned = "warning:" in outcome.output and "rough" in outcome.output
    checks.add(warned, "warns the intervals are rough" if warned else "no warning that the intervals are rough")
    document = json.loads((path / "contextuality.json").read_text())
    flagged = bool(document.get("bootstrap", {}).get("rough")) and bool(document.get("settings", {}).get("bootstrap_rough"))
    checks.add(flagged, "contextuality.json flags the intervals rough" if flagged else "the intervals are not flagged rough")
    found = [item for item in intervals(document)
             if all(isinstance(number, (int, float)) and math.isfinite(number) for number in item[1:])]
    near = [item for item in found if abs(item[2] - item[1]) <= 0.05 * max(1.0, abs(item[1]))]
    checks.add(bool(found) and len(near) == len(found),
               f"{len(near)} of {len(found)} single-replicate ends within 5 % of their estimate (one statistic)")


def numbers(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(where, repr) of every number in a JSON document."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from numbers(item, f"{path}/{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from numbers(item, f"{path}[{index}]")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield path, repr(value)


def lmgeom_command() -> list[str]:
    script = Path(sys.executable).with_name("lmgeom")
    return [str(script)] if script.exists() else [sys.executable, "-c", "from lmgeom.cli.main import app; app()"]


@case("25", DETERMINISM, "`lmgeom geometry RUN --out DIR` in two fresh processes, one with OMP_NUM_THREADS=1, one without",
      "the same numbers in both geometry.json, byte for byte")
def geometry_determinism(lab: Lab, checks: Checks) -> None:
    path = lab.copy("25")
    documents = []
    for label, threads in (("OMP_NUM_THREADS=1", "1"), ("OMP_NUM_THREADS unset", None)):
        env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
        env["COLUMNS"] = "200"
        if threads is not None:
            env["OMP_NUM_THREADS"] = threads
        out = path.parent / f"geometry-{'1' if threads else 'default'}"
        done = subprocess.run([*lmgeom_command(), "geometry", str(path), "--out", str(out)], env=env,
                              capture_output=True, text=True, timeout=900)
        ok = done.returncode == 0 and (out / "geometry.json").exists()
        checks.add(ok, f"{label}: exit {done.returncode}" + ("" if ok else f": {(done.stdout + done.stderr)[-200:]}"))
        if ok:
            documents.append(json.loads((out / "geometry.json").read_text()))
    if len(documents) == 2:
        first, second = (list(numbers(document)) for document in documents)
        differ = [(where, a, b) for (where, a), (_, b) in zip(first, second) if a != b]
        same = len(first) == len(second) and not differ
        checks.add(same, f"all {len(first)} numbers identical" if same else
                   f"{len(differ)} of {len(first)} numbers differ" + (f" (e.g. {differ[0][0]}: {differ[0][1]} vs {differ[0][2]})" if differ else ""))


# ---- running them ----------------------------------------------------------------------------------


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """Tiny models on shared cores: intra-op threads only add contention."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def run_cases(workdir: Path, only: Sequence[str] | None = None, *, progress: Callable[[str], None] | None = None,
              base: Path | None = None) -> list[CaseResult]:
    """Run the cases (all, or those whose ids are in `only`) in `workdir`, each on a copy of one base run
    made there (or copied from `base`, a run made with BASE_OPTIONS: checked by re-running it, which
    must skip every step); a case that raises is a case not as expected, with the exception as what was observed."""
    wanted = [str(id) for id in only] if only else [case.id for case in CASES]
    unknown = set(wanted) - {case.id for case in CASES}
    if unknown:
        raise ValueError(f"no case {', '.join(sorted(unknown))}: the cases are 1..{len(CASES)}")
    Path(workdir).mkdir(parents=True, exist_ok=True)
    lab = Lab(Path(workdir), base)
    results = []
    with one_torch_thread():
        for case in CASES:
            if case.id not in wanted:
                continue
            if lab._base is None and progress:
                progress("building the base run (tiny-bert, 60 Lee sentences) ...")
            _ = lab.base
            started = time.monotonic()
            checks = Checks(lab.workdir)
            try:
                case.check(lab, checks)
            except Exception as error:  # noqa: BLE001 - a case that raises is reported, not fatal
                checks.add(False, f"raised {type(error).__name__}: {' '.join(str(error).split())[:300]}")
            result = CaseResult(case.id, case.defect_class, case.done, case.expected, anonymous(checks.observed, lab.workdir),
                                checks.passed, time.monotonic() - started)
            results.append(result)
            if progress:
                progress(f"case {result.id:>2} {'as expected' if result.passed else 'NOT as expected'} ({result.seconds:.0f} s)")
    return results


def anonymous(text: str, workdir: Path | None) -> str:
    """`text` without this machine's folders: the working folder as WORKDIR, the repository's parent as .."""
    if workdir is not None:
        text = text.replace(str(Path(workdir).resolve()), "WORKDIR").replace(str(workdir), "WORKDIR")
    return text.replace(str(Path(__file__).resolve().parents[2]), "..")


def counts(results: Sequence[CaseResult]) -> list[str]:
    """A line per defect class, then the total: "25 cases: 25 as expected"."""
    lines = []
    for defect_class in dict.fromkeys(result.defect_class for result in results):
        group = [result for result in results if result.defect_class == defect_class]
        lines.append(f"{defect_class}: {len(group)} cases, {sum(r.passed for r in group)} as expected")
    failed = [result.id for result in results if not result.passed]
    total = f"{len(results)} cases: {len(results) - len(failed)} as expected"
    lines.append(total + (f", {len(failed)} not (case {', '.join(failed)})" if failed else ""))
    return lines


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(results: Sequence[CaseResult]) -> str:
    rows = ["| # | class | done | expected | observed | result |", "|---|---|---|---|---|---|"]
    rows += [f"| {r.id} | {r.defect_class} | {cell(r.done)} | {cell(r.expected)} | {cell(r.observed)} | "
             f"{'pass' if r.passed else 'FAIL'} |" for r in results]
    tally = Counter(result.defect_class for result in results)
    passed = Counter(result.defect_class for result in results if result.passed)
    rows += ["", "| class | cases | as expected |", "|---|---|---|"]
    rows += [f"| {name} | {tally[name]} | {passed[name]} |" for name in tally]
    rows += [f"| all | {len(results)} | {sum(passed.values())} |", "", counts(results)[-1]]
    return "\n".join(rows)


def plain(results: Sequence[CaseResult]) -> str:
    rows = []
    for r in results:
        rows.append(f"{r.id:>2}  {r.defect_class:<15}  {'pass' if r.passed else 'FAIL'}  {r.done} | expected: {r.expected} "
                    f"| observed: {r.observed}")
    return "\n".join([*rows, "", *counts(results)])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated case ids (default: all)")
    parser.add_argument("--workdir", type=Path, help="folder for the stores and runs, kept (default: a temporary folder)")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on standard error")
    options = parser.parse_args(argv)
    only = [item.strip() for item in options.only.split(",") if item.strip()] if options.only else None
    progress = None if options.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    started = time.monotonic()
    if options.workdir is not None:
        results = run_cases(options.workdir, only, progress=progress)
    else:
        with tempfile.TemporaryDirectory(prefix="lmgeom-trust-") as workdir:
            results = run_cases(Path(workdir), only, progress=progress)
    print(markdown(results) if options.markdown else plain(results))
    if progress:
        progress(f"{time.monotonic() - started:.0f} s in all")
    return 0 if all(result.passed for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
