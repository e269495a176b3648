"""The report of a run: the word explorer's data computed from the store, then the page rendered."""

from __future__ import annotations

import os
from typing import Sequence

from lmgeom.errors import InputError
from lmgeom.progress import NoProgress, Progress
from lmgeom.report import build_report, load_run
from lmgeom.runs import rundir
from lmgeom.runs.explorer import DEFAULT_NEIGHBOURS, DEFAULT_TOP_WORDS, explorer_data


def render_report(
    run_dir: rundir.Where,
    *,
    include: Sequence[str | os.PathLike[str]] = (),
    out: str | os.PathLike[str] | None = None,
    explorer_words: int = DEFAULT_TOP_WORDS,
    explorer_neighbours: int = DEFAULT_NEIGHBOURS,
    progress: Progress | None = None,
) -> rundir.Target:
    """`lmgeom report`: compute (or reuse the cached) word explorer of RUN, then render RUN/report.html
    (or `out`) and RUN/figures/ from the run's result files (read once). No model is needed; the run
    may be a local folder or an fsspec URL."""
    if explorer_words < 1 or explorer_neighbours < 1:
        raise InputError("`explorer_words` and `explorer_neighbours` must be at least 1",
                         param=("explorer_words", "explorer_neighbours"))
    run = load_run(run_dir, include=include)
    if run.words is not None and not run.words.empty:
        explorer_data(run, top_n=explorer_words, k=explorer_neighbours, progress=progress)
    progress = progress or NoProgress()
    progress.start("report", 1, unit="pages")
    path = build_report(run, out=out)
    progress.advance("report")
    return path
