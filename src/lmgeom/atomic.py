"""Atomic file writes: a crash never leaves half a file (used by the store and the stages).

Temporary files and scratch folders carry their owner (`owner_tag`: pid and host) in their name, so
that what a killed process left behind can be told from what a running one is writing:
`remove_abandoned` deletes the first and keeps the second.
"""

from __future__ import annotations

import os
import re
import socket
import tempfile
from pathlib import Path
from typing import Callable

from lmgeom.errors import InputError

_HOST = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "host"
# `.<name>.<pid>@<host>.tmp`, beside the file being written
_TEMPORARY = re.compile(r"^\..+\.(?P<pid>\d+)@(?P<host>[A-Za-z0-9._-]+)\.tmp$")
_swept: set[tuple[int, Path]] = set()  # (pid, folder) whose abandoned temporary files were removed


def owner_tag() -> str:
    """`<pid>@<host>` of this process, as temporary files and scratch folders carry it."""
    return f"{os.getpid()}@{_HOST}"


def is_temporary(name: str) -> bool:
    """Whether a file name is one of `atomic_write`'s temporary files (`.<name>.<pid>@<host>.tmp`)."""
    return bool(_TEMPORARY.match(name))


def process_alive(pid: int) -> bool:
    """Whether process `pid` of this host is running (a zombie is not). Where that cannot be asked
    safely (Windows: `os.kill` ends the process), every process counts as running."""
    if pid == os.getpid() or os.name == "nt":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except (OverflowError, ValueError):  # no such pid
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # no /proc: kill(pid, 0) said it exists
        return True
    return stat[stat.rindex(")") + 2:][:1] not in ("Z", "X")


def remove_abandoned(folder: Path, pattern: re.Pattern[str], remove: Callable[[Path], object]) -> list[Path]:
    """`remove` each entry of `folder` whose name matches `pattern` (groups `pid` and `host`) and whose
    owner, a process of this host, has ended; entries of other hosts' processes are kept (their
    liveness cannot be told from here). The removed paths."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        match = pattern.match(entry.name)
        if match and match["host"] == _HOST and not process_alive(int(match["pid"])):
            remove(Path(entry.path))
            removed.append(Path(entry.path))
    return removed


def _unlink(path: Path) -> None:
    path.unlink(missing_ok=True)


def require_writable(folder: str | os.PathLike[str], *, param: str = "out") -> Path:
    """`folder`, created if need be, once a file could be written into it: a long job checks where its
    results go before its work, not after (`param` names the parameter that gave the folder)."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(dir=folder, prefix=f".lmgeom-probe.{owner_tag()}.", suffix=".tmp")
        os.close(handle)
        os.unlink(probe)
    except OSError as error:
        raise InputError(f"`{param}` {folder} cannot be written ({error.strerror or error}); give a folder you can "
                         "write to", param=param) from None
    return folder


def atomic_write(path: str | os.PathLike[str], write: Callable[[Path], object]) -> Path:
    """`write(tmp)` a temporary file beside `path`, then rename it over `path`. A `write` that raises
    (a full disk) leaves no temporary file; the first write of a process into a folder also removes
    the temporary files that killed processes left there."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if (os.getpid(), path.parent) not in _swept:
        remove_abandoned(path.parent, _TEMPORARY, _unlink)
        _swept.add((os.getpid(), path.parent))
    tmp = path.with_name(f".{path.name}.{owner_tag()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
