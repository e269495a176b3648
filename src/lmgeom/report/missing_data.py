"""What a run could not measure for want of input data, read from its result files: the word
benchmarks the static step did not find (static/<layer>.benchmarks.json's `skipped`) and geometry's
alignment without STS-B pairs (geometry.json's `settings.alignment`: `n_pairs` 0 and its `note`).

The report shows each in a "Not measured" box of its section; `run` prints one message per kind
(`Skipped.message`) and records them in run.json (`skipped_inputs`). Both read the result files, not
run.json, so a step that `run` found done, or a file that `lmgeom static-embeddings` or `lmgeom
geometry` wrote, is told the same.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from lmgeom import rundir

DATA_FIX = "give --data-dir or set LMGEOM_DATA"
# `lmgeom.stages.geometry.positive_pairs`' note when the data folder holds no STS Benchmark
NO_STSB = "no STS Benchmark (stsbenchmark/sts-*.csv) under "
# `lmgeom.evaluate.wordbench.find_word_benchmarks`' reason for a set the data folder lacks
_NOT_FOUND = re.compile(r"^(?P<relative>.+) not found in (?P<folder>.+)$")


@dataclass(frozen=True)
class Skipped:
    """One kind of input a run did not find: `step` (the step of `lmgeom run` whose result lacks it),
    `what` it is, the `inputs` skipped (benchmark names; for alignment, the STS-B pairs), the folder
    `looked_in` (None when it is the store's corpus that lacks them), `paths` looked for there,
    `reason` and `fix`."""

    step: str
    what: str
    inputs: tuple[str, ...]
    looked_in: str | None
    reason: str
    fix: str
    paths: tuple[str, ...] = ()

    @property
    def message(self) -> str:
        """The line `lmgeom run` prints."""
        return f"skipped: {self.what}, {self.reason}" + (f": {self.fix}" if self.fix else "")

    def record(self) -> dict[str, Any]:
        """The entry of run.json's `skipped_inputs`."""
        return {"step": self.step, "inputs": list(self.inputs), "looked_in": self.looked_in, "reason": self.reason,
                "fix": self.fix, "message": self.message}


def missing_benchmarks(documents: Iterable[Mapping[str, Any]]) -> list[Skipped]:
    """The word benchmarks not found in the data folder, from static benchmark documents (one per
    layer; their `skipped`: name -> reason), one entry per folder looked in. A set skipped for another
    reason (scored only on request, `wordbench.ON_REQUEST`) is not missing."""
    by_folder: dict[str, dict[str, str]] = {}
    for document in documents:
        skipped = document.get("skipped")
        for name, reason in (skipped.items() if isinstance(skipped, Mapping) else ()):
            found = _NOT_FOUND.match(str(reason))
            if found:
                by_folder.setdefault(found["folder"], {}).setdefault(str(name), found["relative"])
    entries = []
    for folder, names in by_folder.items():
        count = f"{len(names)} word benchmark{'s' if len(names) != 1 else ''}"
        entries.append(Skipped("static_embeddings", f"{count} ({', '.join(names)})", tuple(names), folder,
                               f"not found in {folder}", DATA_FIX, tuple(names.values())))
    return entries


def missing_alignment(document: Mapping[str, Any] | None) -> list[Skipped]:
    """Geometry's alignment when geometry.json records no STS-B pair (`settings.alignment`)."""
    alignment = ((document or {}).get("settings") or {}).get("alignment")
    if not isinstance(alignment, Mapping) or alignment.get("n_pairs") or not alignment.get("note"):
        return []
    note = str(alignment["note"])
    if note.startswith(NO_STSB):
        folder = note.removeprefix(NO_STSB)
        return [Skipped("geometry", "geometry alignment", ("STS-B pairs",), folder, note, DATA_FIX)]
    return [Skipped("geometry", "geometry alignment", ("STS-B pairs",), None, note, "")]


def _documents(paths: Iterable[rundir.Target], kind: str | None) -> list[dict[str, Any]]:
    documents = []
    for path in paths:
        try:
            document = rundir.read_json(path, kind)
        except rundir.ResultFileError:
            continue  # an unreadable file: the report says so where it reads it
        if document is not None:
            documents.append(document)
    return documents


def skipped_inputs(run_dir: rundir.Where) -> list[Skipped]:
    """Every kind of input the run `run_dir` did not find, from its result files: the word benchmarks of
    every static/<layer>.benchmarks.json, then geometry.json's alignment."""
    static = _documents(rundir.STATIC_BENCHMARKS.find(run_dir), rundir.STATIC_BENCHMARKS.kind)
    geometry = _documents([rundir.GEOMETRY.at(run_dir)], rundir.GEOMETRY.kind)
    return missing_benchmarks(static) + missing_alignment(geometry[0] if geometry else None)
