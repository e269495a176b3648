"""The writer's lock on a store: one writer at a time per `--out`.

A writer creates STORE/lock.json (`layout.LOCK`) exclusively before it changes anything there: its
host, pid, start time and a token of its own. It removes the file when it finishes or stops
(`StoreLock.release`: at finalize, `close`, on an exception, or when the writer is garbage collected
or its interpreter exits). A second writer finds the file and is refused, naming the first. A lock is
stale, and taken over, when its process is gone: same host, and no process has its pid (as after a
kill -9), that process is a zombie, or it started after the lock was taken (the pid was reused). A
lock taken on another host cannot be checked from here: it is refused, naming the file to delete
once that writer is known to be gone.

How exclusive the create is depends on the filesystem:
- a local folder (and file:// URLs): the fully written lock is hard-linked into place, which fails
  when the lock exists (POSIX `link`: atomic on local disks and NFS);
- memory://: the filesystem's create-if-absent (`pipe_file(mode="create")`), atomic in its process;
- object stores: `pipe_file(mode="create")` too, a conditional PUT where the backend has one (s3fs on
  S3) and an existence check before the PUT elsewhere; so the lock is read back `SETTLE_S` later and
  the writer whose token is not the one there backs off. Two writers then both proceed only if one's
  PUT takes longer than `SETTLE_S` to become visible to the other (S3, GCS and Azure Blob Storage read
  their own and others' writes at once).
Taking over a stale lock re-reads it and removes it only if it is still the stale one, then creates
the new one as above: two writers taking over the same stale lock within one removal of each other
can both proceed. The lock is advisory: readers do not take it; they are told a live writer holds it
when the store is incomplete (`live_holder`), and check the store's generation when they are done
(`RepresentationStore.check_unchanged`).
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
import weakref
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import psutil
from typing_extensions import Self

from lmgeom.errors import InputError
from lmgeom.store import layout
from lmgeom.store.location import Location

SETTLE_S = 1.0
"""Seconds an object-store writer waits before reading its lock back."""

_PID_REUSE_SLACK_S = 2.0  # process start times are known to about a second; the lock's to one second
_HELD: set[str] = set()  # tokens of the locks this process holds


class StoreLockedError(InputError):
    """Another writer holds the store's lock."""


def is_lock_file(name: str) -> bool:
    """Whether a name in a store folder is the lock, or a lock a writer was creating (`lock.json.<token>.tmp`)."""
    return name == layout.LOCK or (name.startswith(f"{layout.LOCK}.") and name.endswith(".tmp"))


class StoreLock:
    """A writer's lock on the store at `location`: `holder` is what lock.json holds (host, pid,
    started, token). Take one with `acquire`; `release` it (idempotent)."""

    def __init__(self, location: Location, holder: dict[str, Any]) -> None:
        self.location = location
        self.holder = holder
        _HELD.add(holder["token"])
        self._release = weakref.finalize(self, _release, location, holder["token"], os.getpid())

    @classmethod
    def acquire(cls, location: Location) -> StoreLock:
        """The lock on `location` (a folder is created if there is none); a `StoreLockedError` naming
        the holder while a live writer holds it; a stale lock is taken over."""
        holder: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid(),
                  "started": datetime.now().astimezone().isoformat(timespec="seconds"), "token": uuid.uuid4().hex}
        if location.is_local:
            location.local_path.mkdir(parents=True, exist_ok=True)
        data = (json.dumps(holder, indent=2) + "\n").encode("utf-8")
        for _ in range(5):  # each turn: another writer released or took over the lock in between
            try:
                _create(location, data, holder["token"])
            except FileExistsError:
                current = read_holder(location)
                if current is not None:
                    if not is_stale(current):
                        raise StoreLockedError(_held_message(location, current)) from None
                    _remove_if_still(location, current)
                continue
            lock = cls(location, holder)
            if not _creates_exclusively(location):
                time.sleep(SETTLE_S)
                current = read_holder(location)
                if current is None or current.get("token") != holder["token"]:
                    lock.release()
                    raise StoreLockedError(_held_message(location, current or {}))
            return lock
        raise StoreLockedError(f"{location}: other writers kept taking and releasing its lock ({layout.LOCK}); "
                               "re-run when they are done")

    @property
    def held(self) -> bool:
        return self._release.alive

    def release(self) -> None:
        """Remove lock.json if it is still this lock's (nothing the second time)."""
        self._release()

    def require_held(self) -> None:
        if not self.held:
            raise InputError(f"the writer of {self.location} is closed; open a new one to write there")


class HoldsLock:
    """A writer holding a `StoreLock` (`lock`): `close` releases it, as does leaving a `with` block."""

    lock: StoreLock

    def _hold(self, lock: StoreLock, open_store: Callable[[], None]) -> None:
        """Keep `lock` and open the store under it; the lock is released if opening fails."""
        self.lock = lock
        try:
            open_store()
        except BaseException:
            lock.release()
            raise

    def close(self) -> None:
        self.lock.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def read_holder(location: Location) -> dict[str, Any] | None:
    """What the lock of `location` holds; None when there is no lock."""
    try:
        document = json.loads(location.read_bytes(layout.LOCK).decode("utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise StoreLockedError(f"the lock {location.child(layout.LOCK)} cannot be read ({error}); if no writer "
                               "writes this store any more, delete that file and re-run") from None
    if not isinstance(document, dict):
        raise StoreLockedError(f"the lock {location.child(layout.LOCK)} holds no lock; if no writer writes this "
                               "store any more, delete that file and re-run")
    return document


def live_holder(location: Location) -> dict[str, Any] | None:
    """The holder of a lock on `location` that is not stale (one from another host counts as live)."""
    try:
        holder = read_holder(location)
    except StoreLockedError:
        return None
    return None if holder is None or is_stale(holder) else holder


def describe(holder: dict[str, Any]) -> str:
    """A lock's holder, as "host H, pid P, started S"."""
    return f"host {holder.get('host')}, pid {holder.get('pid')}, started {holder.get('started')}"


def is_stale(holder: dict[str, Any]) -> bool:
    """Whether the process that took this lock is gone; a lock from another host is never judged stale."""
    if holder.get("host") != socket.gethostname():
        return False
    try:
        pid = int(holder["pid"])
        started = datetime.fromisoformat(str(holder["started"])).timestamp()
    except (KeyError, TypeError, ValueError):
        return False  # not a lock this module wrote: leave it to a person
    if pid == os.getpid():  # an earlier writer of this process, released or dropped without `close`
        return holder.get("token") not in _HELD
    try:
        process = psutil.Process(pid)
        return process.status() == psutil.STATUS_ZOMBIE or process.create_time() > started + _PID_REUSE_SLACK_S
    except psutil.NoSuchProcess:
        return True
    except psutil.AccessDenied:
        return False


def _held_message(location: Location, holder: dict[str, Any]) -> str:
    lock = location.child(layout.LOCK)
    if holder.get("host") == socket.gethostname() and holder.get("pid") == os.getpid():
        return (f"{location} is being written by another writer of this process ({describe(holder)}); "
                "close that writer (writer.close(), or use it in a `with` block) before opening another")
    message = (f"{location} is being written by another process ({describe(holder)}; its lock is {lock}); "
               "wait for it to finish, or stop it, and re-run")
    if holder.get("host") != socket.gethostname():
        message += f"; this host cannot tell whether it still runs: if it does not, delete {lock} and re-run"
    return message


def _create(location: Location, data: bytes, token: str) -> None:
    """lock.json with `data`, or a `FileExistsError` when there is one."""
    if not location.is_local:
        location.fs.pipe_file(location.path(layout.LOCK), data, mode="create")
        return
    path = Path(location.path(layout.LOCK))
    written = path.with_name(f"{path.name}.{token}.tmp")
    written.write_bytes(data)
    try:
        os.link(written, path)  # fails if the lock exists; a reader never sees a half-written lock
    finally:
        written.unlink()


def _creates_exclusively(location: Location) -> bool:
    protocols = location.fs.protocol if isinstance(location.fs.protocol, tuple) else (location.fs.protocol,)
    return location.is_local or "memory" in protocols


def _remove_if_still(location: Location, stale: dict[str, Any]) -> None:
    current = read_holder(location)
    if current is not None and current.get("token") == stale.get("token"):
        location.remove(layout.LOCK)


def _release(location: Location, token: str, pid: int) -> None:
    _HELD.discard(token)
    if os.getpid() != pid:  # a forked child inherits the finalizer, not the lock
        return
    try:
        _remove_if_still(location, {"token": token})
    except (OSError, StoreLockedError):
        pass  # the lock is gone or unreadable: nothing of this writer's is left to remove
