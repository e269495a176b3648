"""Contextuality of a representation store (Ethayarajh 2019): baselines, SelfSim, IntraSim, MEV.

The drivers of the analysis engine (`lmgeom.engine`) for contextuality: `analyze_store` runs
the whole analysis on an executor (this process, worker processes or Ray: the same tasks and the
same numbers); `analyze_shard` computes the accumulator states of a range of rows, which are saved,
loaded elsewhere, merged (`AnalysisState.merge`) and finished (`finish_analysis`) into the result of
one `analyze_store` pass (closed-form statistics to float64 rounding).

Rows are chosen by the one row selection of `lmgeom.engine.selection`; self-similarity and MEV use
every selected occurrence of each word with at least `min_contexts` distinct sentences, and the
baselines use the same rows. Memory is per-word state only: a d-vector per analysed word, and one
MEV word group's state at a time (at most `mev_memory_mb`; the other groups' rows wait in scratch
files, `lmgeom.engine.spool`); with a bootstrap (`AnalysisOptions.bootstrap`), also the per-sentence
and per-(word, sentence) sums of unit vectors its intervals resample (`lmgeom.engine.bootstrap`).
"""

from __future__ import annotations

import os
from typing import Any

from lmgeom.progress import Progress
from lmgeom.stages.contextuality import ContextualityResult, contextuality_result
from lmgeom.engine import Analysis, AnalysisOptions, AnalysisState, Executor, plan_analysis, run_analysis, run_task
from lmgeom.engine.plan import store_identity
from lmgeom.engine.tasks import finish_states
from lmgeom.engine.loop import row_range
from lmgeom.errors import InputError
from lmgeom.store import RepresentationStore


def analyze_store(
    store: RepresentationStore | str | os.PathLike[str],
    options: AnalysisOptions | None = None,
    *,
    executor: Executor | None = None,
    progress: Progress | None = None,
    write_to: str | os.PathLike[str] | bool = False,
    **keywords: Any,
) -> ContextualityResult:
    """Anisotropy baselines, self-similarity, intra-sentence similarity and MEV for every layer.

    Every executor gives the same numbers (processes: bit for bit; Ray, which merges in another
    order: to float64 rounding).

    Parameters
    ----------
    store : RepresentationStore or str or os.PathLike
        The store, or its folder or URL (opened with `RepresentationStore.open`).
    options : AnalysisOptions or None, default None
        What the analysis computes and how it runs (None: the defaults). `device` is where the
        closed-form statistics compute (see `lmgeom.engine.loop.tally`; MEV runs on the CPU),
        recorded resolved in the settings.
    executor : Executor or None, default None
        Runs the analysis's tasks. None: `executor_for(options)`: `engine="local"` one task after
        another here, `"processes"` (or `"auto"` with `num_workers` > 1) worker processes (at most
        one per layer and one per CPU; a memory:// store and layers of fewer than
        `POOL_MIN_LAYER_VALUES` analysed values stay in this process), `"ray"` Ray tasks.
    progress : Progress or None, default None
        Told of each finished task (None: `NoProgress`).
    write_to : str or os.PathLike or bool, default False
        True writes the result files (contextuality.json, contextuality_layers.csv,
        contextuality_words.csv) next to the store, a path writes them there, False writes nothing
        (`result.written` names the files written).
    **keywords : Any
        Fields of `AnalysisOptions` by name, replacing those of `options` (`min_contexts=2,
        num_workers=4`).

    Returns
    -------
    ContextualityResult
        The per-layer tidy records (`layers`), the per word x layer values (`words`), the computed
        findings, counts and settings.

    Raises
    ------
    InputError
        A bad option value (`AnalysisOptions`), e.g. `min_contexts` or `num_workers` below 1, an
        unknown `count_by` or `engine`, or `confidence` outside (0, 1).
    TypeError
        A keyword that is not a field of `AnalysisOptions`.
    """
    options = (options or AnalysisOptions()).replace(**keywords)
    store = _open(store)
    result = contextuality_result(store, run_analysis(store, options, executor=executor, progress=progress,
                                                      label="analyze layers"))
    if write_to is not False:
        result.write(None if write_to is True else write_to)
    return result


def analyze_shard(
    store: RepresentationStore | str | os.PathLike[str],
    rows: range | tuple[int, int],
    options: AnalysisOptions | None = None,
    **keywords: Any,
) -> AnalysisState:
    """The accumulator states of the analysis over store rows [start, stop), every word group at once
    (a task per layer over those rows whose states are kept).

    Shards over disjoint row ranges that cover the store, merged (`AnalysisState.merge`) and finished
    (`finish_analysis`), give the result of `analyze_store` with the same options. A shard holds the
    MEV state of its own rows (at most its rows x dim per word group)."""
    options = (options or AnalysisOptions()).replace(**keywords)
    store = _open(store)
    span = row_range(store, rows)
    plan, plan_rows = plan_analysis(store, options, rows=span)
    state = AnalysisState(options.replace(layers=plan.layers).analysis_settings(), plan.store_identity,
                          [(span.start, span.stop)])
    for task in plan.tasks:
        state.states.update(run_task(store, plan, plan_rows, task, finish=False).states)
    return state


def finish_analysis(store: RepresentationStore | str | os.PathLike[str], state: AnalysisState) -> ContextualityResult:
    """The result of merged shard states that together cover every row of `store` once."""
    store = _open(store)
    if state.store_identity != store_identity(store):
        raise InputError(f"these analysis states were computed on another store than {store.url}")
    covered = sorted(state.row_ranges)
    ends = [0] + [stop for _, stop in covered]
    if any(start != end for (start, _), end in zip(covered, ends)) or ends[-1] != store.n_tokens:
        raise InputError(f"the merged shards cover rows {covered}, not every row of the store [0, {store.n_tokens}) once; "
                         "analyse the missing ranges and merge them in")
    plan, rows = plan_analysis(store, AnalysisOptions.from_settings(state.settings))
    layers = finish_states(plan, rows, state.states)
    store.check_unchanged()
    return contextuality_result(store, Analysis(plan, rows, layers, "shards"))


def _open(store: RepresentationStore | str | os.PathLike[str]) -> RepresentationStore:
    return store if isinstance(store, RepresentationStore) else RepresentationStore.open(store)
