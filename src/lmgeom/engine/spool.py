"""Rows kept on local disk between the read of a layer and the step that uses them.

The analysis engine bounds MEV's memory by solving the analysed words in groups (`plan_word_groups`,
`mev_memory_mb`). Reading the layer again for every group would make the time quadratic in the
corpus (the number of groups grows with the rows, and so does each read); instead, the one read of a
layer hands the rows of every group it does not hold in memory to a `RowSpool`, a file of that
group's rows alone, and each group is then solved from its own file in one sequential read
(`lmgeom.engine.tasks.run_task`).

The spools of a layer live in a scratch folder of the system's temporary directory (TMPDIR),
`lmgeom-mev-<pid>@<host>-<random>` (`scratch_folder`), removed when the layer is done; a folder
whose process was killed is removed by the next `scratch_folder` of any process on that host.
"""

from __future__ import annotations

import io
import re
import shutil
import tempfile
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

import numpy as np

from lmgeom.errors import InputError
from lmgeom.atomic import owner_tag, remove_abandoned
from lmgeom.engine.loop import RowSink

SCRATCH_PREFIX = "lmgeom-mev-"
_SCRATCH = re.compile(rf"^{SCRATCH_PREFIX}(?P<pid>\d+)@(?P<host>[A-Za-z0-9._-]+)-[a-z0-9_]+$")


def scratch_folder() -> tempfile.TemporaryDirectory[str]:
    """A fresh scratch folder in TMPDIR named for this process (a context manager: the folder and
    its files go when it exits, also on an error), after removing the scratch folders of this host's
    processes that have ended (killed mid-layer, they never removed their own)."""
    remove_abandoned(Path(tempfile.gettempdir()), _SCRATCH, partial(shutil.rmtree, ignore_errors=True))
    return tempfile.TemporaryDirectory(prefix=f"{SCRATCH_PREFIX}{owner_tag()}-")


class RowSpool:
    """Rows and their labels appended to one file as `tally` hands them (`add`), then handed back in
    the same pieces and order to an accumulator (`drain`), which so sees exactly what the read would
    have handed it: its result is the same bit for bit.

    Each piece is written raw (its labels, then its rows: no headers, no pickle); the spool keeps
    each piece's length, dtypes and label names in memory (a few numbers per chunk of the layer).
    `close` (or leaving a `with` block) closes the file; `drain` deletes it once read.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: BinaryIO | None = open(path, "xb")  # a fresh file: two spools never share one
        self._pieces: list[tuple[int, int, np.dtype[Any], tuple[tuple[str, np.dtype[Any]], ...]]] = []

    def add(self, X: np.ndarray, /, **ids: np.ndarray) -> RowSpool:
        if self._file is None:
            raise InputError(f"{self.path} was closed; a spool takes rows only until it is drained")
        rows = np.ascontiguousarray(X)
        labels = {name: np.ascontiguousarray(values) for name, values in ids.items()}
        for name, values in labels.items():
            if len(values) != len(rows):
                raise InputError(f"{len(values)} {name} for {len(rows)} rows")
            self._file.write(values.data)
        self._file.write(rows.data)
        self._pieces.append((len(rows), rows.shape[1], rows.dtype, tuple((name, values.dtype) for name, values in labels.items())))
        return self

    def drain(self, accumulator: RowSink) -> None:
        """Hand every piece, in the order it came, to `accumulator.add`, one piece in memory at a time;
        then delete the file."""
        self.close()
        with open(self.path, "rb") as spooled:
            for n_rows, dim, dtype, label_types in self._pieces:
                labels = {name: _read(spooled, self.path, np.empty(n_rows, dtype=label_dtype)) for name, label_dtype in label_types}
                accumulator.add(_read(spooled, self.path, np.empty((n_rows, dim), dtype=dtype)), **labels)
        self.path.unlink()
        self._pieces = []

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> RowSpool:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self.close()


def _read(spooled: io.BufferedReader, path: Path, into: np.ndarray) -> np.ndarray:
    """`into`, filled from the next bytes of `spooled` (an error if the file ends first)."""
    got = spooled.readinto(into.data.cast("B"))
    if got != into.nbytes:
        raise OSError(f"{path} ended after {got} of {into.nbytes} bytes; was the scratch file truncated?")
    return into
