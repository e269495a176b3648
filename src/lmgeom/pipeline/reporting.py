"""The report of a run (the word explorer's data computed from the store, then the page rendered),
and the comparison of runs (with the similarity of their stores)."""

from __future__ import annotations

import os
from typing import Any, Sequence

from lmgeom.errors import InputError
from lmgeom.progress import NoProgress, Progress
from lmgeom.report import build_comparison, build_report, load_run
from lmgeom.report.build import require_control_of
from lmgeom import rundir
from lmgeom.pipeline.explorer import DEFAULT_NEIGHBOURS, DEFAULT_TOP_WORDS, explorer_data
from lmgeom.stages.similarity import SimilarityOptions, require_same_corpus, similarity_matrix, write_similarity
from lmgeom.store import RepresentationStore

# the measures of the model x model matrix: the streamed ones (every matched row), with their null
COMPARE_SIMILARITY = SimilarityOptions(measures=("cka", "cka_debiased", "procrustes"))


def render_report(
    run_dir: rundir.Where,
    *,
    include: Sequence[str | os.PathLike[str]] = (),
    out: str | os.PathLike[str] | None = None,
    explorer_words: int = DEFAULT_TOP_WORDS,
    explorer_neighbours: int = DEFAULT_NEIGHBOURS,
    overwrite: bool = False,
    control: rundir.Where | None = None,
    progress: Progress | None = None,
) -> rundir.Target:
    """`lmgeom report`: compute (or reuse the cached) word explorer of RUN, then render RUN/report.html
    (or `out`) and RUN/figures/ from the run's result files (read once). No model is needed; the run
    may be a local folder or an fsspec URL. An existing `out` that lmgeom did not write
    (`rundir.written_by_lmgeom`) is refused unless `overwrite`. `control`: a control run of the same
    model (`lmgeom.controlspec`), drawn beside the run in the contextuality and isotropy figures
    (`lmgeom.report.build_report`)."""
    if explorer_words < 1 or explorer_neighbours < 1:
        raise InputError("`explorer_words` and `explorer_neighbours` must be at least 1",
                         param=("explorer_words", "explorer_neighbours"))
    if out is not None:
        rundir.claim_file(rundir.target(out), overwrite=overwrite)
    run = load_run(run_dir, include=include)
    compared = None if control is None else load_run(control)
    if compared is not None:
        require_control_of(run, compared)  # before the explorer's work
    if run.words is not None and not run.words.empty:
        explorer_data(run, top_n=explorer_words, k=explorer_neighbours, progress=progress)
    progress = progress or NoProgress()
    progress.start("report", 1, unit="pages")
    path = build_report(run, out=out, control=compared)
    progress.advance("report")
    return path


def render_comparison(run_dirs: Sequence[rundir.Where], out: str | os.PathLike[str], *,
                      options: SimilarityOptions = COMPARE_SIMILARITY, progress: Progress | None = None) -> rundir.Target:
    """`lmgeom compare`: the runs side by side (`build_comparison`) and, when their stores hold the
    same corpus, the similarity of every pair of runs (layer x layer, rows matched by word
    occurrence: `lmgeom.stages.similarity`), written to OUT/similarity/<i>-<j>/ (runs numbered from 1
    as given) and shown as a model x model matrix; otherwise a sentence says why there is none."""
    runs = [load_run(run_dir) for run_dir in run_dirs]
    pairs: list[dict[str, Any]] = []
    note: str | None = None
    stores: list[RepresentationStore] = []
    for run in runs:
        try:
            stores.append(RepresentationStore.open(run.path))
        except (OSError, InputError) as error:
            note = f"no model × model matrix: {run.path} holds no readable store ({error})"
            break
    if note is None and len(stores) < 2:
        note = "no model × model matrix: it compares two runs or more"
    if note is None:
        try:
            for other in stores[1:]:
                require_same_corpus(stores[0], other)
        except InputError as error:
            note = f"no model × model matrix: {error}"
    if note is None:
        for i, a in enumerate(stores):
            for j in range(i + 1, len(stores)):
                result = similarity_matrix(a, stores[j], options, progress=progress)
                written = write_similarity(result, rundir.COMPARE_SIMILARITY.at(out, name=f"{i + 1}-{j + 1}"))
                pairs.append({"a": i, "b": j, "document": rundir.read_json(written[0], rundir.SIMILARITY.kind)})
    return build_comparison(runs, out, models=pairs, models_note=note)
