"""What lmgeom wrote: the generator marks of its pages and tables, the names in a folder that are not
lmgeom's (`foreign_entries`), and the refusal to overwrite a file a user wrote (`claim_file`)."""

from __future__ import annotations

import fnmatch
import posixpath
import re


from lmgeom.atomic import is_temporary
from lmgeom.errors import InputError
from lmgeom._version import __version__
from lmgeom.store.location import Location
from lmgeom.store.lock import is_lock_file
from lmgeom.rundir.files import EXPERIMENT_RESULTS, FIGURE, KINDS, RESERVED_NAMES, STATIC_TEXT, STATIC_VECTORS, STS_CSV_SUFFIX, Target, Where, name_of, spec_of
from lmgeom.rundir.read import is_run, sts_files

GENERATOR = "lmgeom"
"""The mark of a page or table lmgeom wrote: `<meta name="generator" content="lmgeom ...">` in an HTML
page's head, `<!-- generator: lmgeom ... -->` as a markdown table's first line."""
_MARKS = (re.compile(rb'<meta name="generator" content="lmgeom[ "]'), re.compile(rb"\A<!-- generator: lmgeom[ -]"))
_KIND = re.compile(rb'\A\s*\{\s*"kind"\s*:\s*"([^"\\]+)"')  # write_json puts `kind` first
_HEAD_BYTES = 4096
_PLACED = (STATIC_VECTORS, STATIC_TEXT, FIGURE, EXPERIMENT_RESULTS)
"""Files a run holds in its folders besides `spec_of`'s."""


def generator_mark(version: str = __version__) -> str:
    """The generator `<meta>` element an HTML page lmgeom writes carries in its head."""
    return f'<meta name="generator" content="{GENERATOR} {version}">'


def markdown_mark(command: str) -> str:
    """The first line of a markdown table lmgeom writes (an HTML comment: invisible when rendered)."""
    return f"<!-- generator: {GENERATOR} {__version__} ({command}) -->\n"


def foreign_entries(directory: Where) -> list[str]:
    """The names at the top of the folder `directory` that are not lmgeom's, sorted; what
    `overwrite=True` of a store's writer removes is the rest, and it removes nothing while any is there.

    lmgeom's own: the store's files and folders (`layout.STORE_NAMES`, the writer's lock), the run's
    result files and the folders it writes whole (`RESERVED_NAMES`: figures/, static/, calibrators/,
    experiments/, similarity/, with whatever is in them), STS results JSONs (kind "sts") with the CSV
    table beside each, and the temporary files of an interrupted atomic write."""
    location = Location.of(directory)
    names = location.listdir()
    sts = {name_of(path) for path in sts_files(location)}
    tables = {f"{posixpath.splitext(name)[0]}{STS_CSV_SUFFIX}" for name in sts}
    return [name for name in names if not (name in RESERVED_NAMES or name in sts or name in tables
                                           or is_lock_file(name) or is_temporary(name))]


def written_by_lmgeom(path: Target) -> bool:
    """Whether lmgeom wrote the file at `path`, as far as the file tells: a JSON result document (its
    `kind`, the first key lmgeom writes, one of lmgeom's kinds), a page or table carrying lmgeom's
    generator mark (`GENERATOR`), or a result file in its place in a run (`spec_of` its path below a
    run directory: RUN/report.html, RUN/static/3.txt). A file at any other place that bears no mark (a
    word2vec text file written to `--out vectors.txt`) cannot be told from a user's."""
    location = Location.of(path)
    with location.fs.open(location.root, "rb") as handle:
        head = handle.read(_HEAD_BYTES)
    kind = _KIND.match(head)
    if kind and kind[1].decode("utf-8", "replace") in KINDS or any(mark.search(head) for mark in _MARKS):
        return True
    parts = location.root.rstrip("/").split("/")
    for depth in range(1, min(4, len(parts))):  # the deepest result files: experiments/NAME/results.json
        parent = "/".join(parts[:-depth]) or "/"
        relative = "/".join(parts[-depth:])
        if (any(fnmatch.fnmatchcase(relative, spec.pattern) for spec in _PLACED) or spec_of(relative) is not None) \
                and is_run(Location(location.fs, parent, parent)):
            return True
    return False


def claim_file(path: Target, *, overwrite: bool, param: str = "out") -> None:
    """Refuse, before any work, to write the file `path` over one that lmgeom did not write
    (`written_by_lmgeom`) unless `overwrite`; a folder at `path` is refused either way. `param` names the
    parameter that gave `path`."""
    location = Location.of(path)
    if not location.exists():
        return
    if location.fs.isdir(location.root):
        raise InputError(f"`{param}` {path} is a folder; give the name of a file to write", param=param)
    if overwrite or written_by_lmgeom(path):
        return
    raise InputError(f"`{param}` {path} exists and lmgeom did not write it (it is neither an lmgeom result document nor a "
                     f"result file in a run); nothing was written. Give another `{param}`, or pass `overwrite=True` to "
                     "replace it", param=(param, "overwrite"))
