"""A result's provenance: the store generation, settings and companion digests a step's result set
records (`write_result_set`), and the checks every reader makes of them (`provenance_issue`,
`read_result`): foreign, mixed and stale results are named, never read silently."""

from __future__ import annotations

import posixpath
from typing import Any, Iterable, Mapping


from lmgeom.errors import InputError
from lmgeom.store.location import Location
from lmgeom.rundir.files import RUN, RUN_STEPS, ResultFile, Target, Where
from lmgeom.rundir.read import ResultFileError, read_json, read_store_meta, regenerate_hint
from lmgeom.rundir.write import digest, jsonable, write_bytes, write_json

PROVENANCE = "provenance"
"""The key of a result document's provenance block (`write_result_set`)."""


def write_result_set(path: Target, kind: str, payload: Mapping[str, Any], *, store_meta: Mapping[str, Any] | None,
                     settings: Mapping[str, Any] | None, companions: Iterable[tuple[Target, bytes]] = (),
                     compact: bool = False) -> list[Target]:
    """A step's result files as one set: each companion (a file beside `path`, with its bytes)
    written first, then the document of `kind` at `path` with its provenance (the store's
    generation, the step's `settings`, each companion's digest). Returns the document's target,
    then the companions'."""
    refuse_foreign_folder(path, store_meta)
    written, digests = [], {}
    for target_, data in companions:
        written.append(write_bytes(target_, data))
        digests[posixpath.relpath(Location.of(target_).root, folder_of(path).root)] = digest(data)
    block = {"store_generation": (store_meta or {}).get("generation"),
             "settings": None if settings is None else jsonable(settings), "companions": digests}
    return [write_json(path, kind, {**payload, PROVENANCE: block}, store_meta=store_meta, compact=compact), *written]


def folder_of(path: Target) -> Location:
    """The folder a result file is in."""
    location = Location.of(path)
    return Location(location.fs, posixpath.dirname(location.root), location.url.rsplit("/", 1)[0])


def expected_store(directory: Where) -> dict[str, Any]:
    """What the results in a run directory must come from: the generation and corpus fingerprint of
    its store's meta.json, or (a run whose store is gone) of run.json's record of it; {} when neither."""
    meta = read_store_meta(directory)
    if not meta:
        try:
            run = read_json(RUN.at(directory), RUN.kind)
        except ResultFileError:
            run = None
        meta = dict((run or {}).get("store") or {})
    return {key: meta.get(key) for key in ("generation", "corpus_fingerprint") if meta.get(key) is not None}


def _differences(recorded: Mapping[str, Any], expected: Mapping[str, Any]) -> str:
    keys = sorted(set(recorded) | set(expected))
    changed = [f"{key} {recorded.get(key)!r} (expected {expected.get(key)!r})" for key in keys
               if recorded.get(key) != expected.get(key)]
    return ", ".join(changed[:4]) + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")


FOREIGN, MIXED, STALE = "foreign", "mixed", "stale"
"""The kinds of `provenance_issue`: a result of another store (refused by every reader, `run`
included: it will not replace what is not its own); a mixed set, what a write cut short leaves, and a
result this store wrote with other settings or without provenance (refused by `report` and `compare`,
recomputed by `run`, which resumes)."""


def provenance_issue(path: Target, document: Mapping[str, Any], *, store: Mapping[str, Any] | None = None,
                     settings: Mapping[str, Any] | None = None) -> tuple[str, str] | None:
    """Why the result `document` read from `path` is not the run's, as (kind, reason), or None when
    it is. FOREIGN: it comes from another store generation or corpus than `store` (`expected_store`).
    MIXED: a companion file is missing or not the one written with it. STALE: it records
    no provenance, or was written with other `settings` (a step's `to_settings()`; None: not compared)."""
    block = document.get(PROVENANCE)
    if not isinstance(block, Mapping):
        return STALE, "records no provenance (written by an lmgeom that did not record the store and settings behind a result)"
    store = store or {}
    if store.get("generation") and block.get("store_generation") != store["generation"]:
        return FOREIGN, (f"was written from another store (store generation {block.get('store_generation')}; the store "
                         f"here is generation {store['generation']})")
    if store.get("corpus_fingerprint") and document.get("corpus_fingerprint") != store["corpus_fingerprint"]:
        return FOREIGN, (f"was written from another corpus (fingerprint {document.get('corpus_fingerprint')}; the "
                         f"store's is {store['corpus_fingerprint']})")
    for name, recorded in (block.get("companions") or {}).items():
        companion = folder_of(path).child(*name.split("/"))
        if not companion.exists():
            return MIXED, f"is missing its companion {name}"
        if digest(companion.read_bytes()) != recorded:
            return MIXED, (f"and {name} are not one set: {name} was not written with it (a write cut short, or a "
                             "file copied from another run)")
    if settings is not None:
        expected = jsonable(settings)
        if block.get("settings") != expected:
            return STALE, f"was written with other settings: {_differences(block.get('settings') or {}, expected)}"
    return None


def provenance_problem(path: Target, document: Mapping[str, Any], *, store: Mapping[str, Any] | None = None,
                       settings: Mapping[str, Any] | None = None) -> str | None:
    """`provenance_issue`'s reason, whatever its kind."""
    issue = provenance_issue(path, document, store=store, settings=settings)
    return None if issue is None else issue[1]


def refuse_foreign_folder(path: Target, store_meta: Mapping[str, Any] | None) -> None:
    """Refuse to write a result of the store `store_meta` into a folder that holds another store or a
    run of another store (`expected_store`): its results would sit beside ones they do not belong with."""
    generation = (store_meta or {}).get("generation")
    folder = folder_of(path)
    here = expected_store(folder.url) or expected_store(folder_of(folder.url).url)  # static/ is one level down
    if generation and here.get("generation") and here["generation"] != generation:
        raise InputError(f"{folder.url} holds another store's results (store generation {here['generation']}; this "
                         f"store is generation {generation}); write these results to a folder of their own with "
                         "`--out`", param="out")


def check_result(directory: Where, path: Target, spec: ResultFile, document: Mapping[str, Any], *,
                 settings: Mapping[str, Any] | None = None) -> None:
    """Raise a `ResultFileError` naming `path`, what differs and how to write it again unless the
    result `document` read from it is the run `directory`'s (`provenance_problem` against
    `expected_store(directory)` and the `settings` expected of it, None: not compared)."""
    problem = provenance_problem(path, document, store=expected_store(directory), settings=settings)
    if problem is not None:
        raise ResultFileError(f"{path} {problem}; {regenerate_hint(spec)}")


def read_result(directory: Where, spec: ResultFile, *, settings: Mapping[str, Any] | None = None,
                **parts: Any) -> dict[str, Any] | None:
    """The result document `spec` of the run `directory` (`parts` fill its name), checked by
    `check_result` against `settings` (default: what run.json records of the step that writes it,
    `run_settings`); None when there is none."""
    path = spec.at(directory, **parts)
    document = read_json(path, spec.kind)
    if document is not None:
        check_result(directory, path, spec, document, settings=settings if settings is not None else run_settings(directory, spec))
    return document


def run_settings(directory: Where, spec: ResultFile) -> dict[str, Any] | None:
    """The settings a result file of `lmgeom run`'s step (`RUN_STEPS`) must record, as the run's
    run.json records that step; None when the folder has no run.json, the step is not recorded
    there, or the file is one several commands add to (calibration.json)."""
    step_name = RUN_STEPS.get(spec.name)
    if step_name is None:
        return None
    try:
        run = read_json(RUN.at(directory), RUN.kind)
    except ResultFileError:
        return None
    step = ((run or {}).get("steps") or {}).get(step_name)
    if not isinstance(step, Mapping):
        return None
    recorded = step.get("file_settings", step.get("settings"))
    return dict(recorded) if isinstance(recorded, Mapping) else None
