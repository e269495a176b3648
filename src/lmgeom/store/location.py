"""Where a store lives: a local folder or any fsspec URL (s3://, gs://, memory://, file://).

Paths stay URLs end to end: a `Location` is an fsspec filesystem plus a root path inside it, and
every file of a store is reached through it (never `pathlib.Path` on an object-store URL). Object
stores have no atomic rename, but a single-object PUT is atomic, so a JSON file written in one
`write_json` call is either the old or the new one; local folders get a temporary file and a rename.
The commit protocol built on this (parts first, manifest last) is in `lmgeom.store.sharded`.
"""

from __future__ import annotations

import io
import json
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
import time
from typing import Any, Callable, Sequence, TypeVar

import fsspec
import pandas as pd
import zarr
from fsspec.implementations.local import LocalFileSystem
from zarr.storage import FsspecStore, LocalStore

from lmgeom.errors import InputError, Unavailable
from lmgeom.atomic import atomic_write
from lmgeom.store.url import RESUME, is_transient, require_url_form

T = TypeVar("T")
RETRY_DELAYS: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0)
"""Seconds waited before each retry of an object-store call that failed transiently (`is_transient`):
six tries over about 15 s, then `Unavailable`."""


def is_url(path: str | os.PathLike[str]) -> bool:
    """Whether `path` names a store by URL (protocol://...) rather than as a local path."""
    return isinstance(path, str) and "://" in path


@dataclass(frozen=True)
class Location:
    """A folder on some filesystem: `fs` and the folder's `root` path inside it; `url` as given."""

    fs: fsspec.AbstractFileSystem
    root: str
    url: str

    @classmethod
    def of(cls, path: str | os.PathLike[str] | Location) -> Location:
        """The location of a local path or an fsspec URL (file:// URLs are local folders)."""
        if isinstance(path, Location):
            return path
        require_url_form(path)
        if not is_url(path):
            local = str(Path(path).absolute())
            return cls(LocalFileSystem(), local, local)
        url = str(path).rstrip("/")
        try:
            fs, root = fsspec.core.url_to_fs(url)
        except (ImportError, ValueError) as error:
            raise InputError(f"cannot open {url}: {error}; install the fsspec package for its protocol "
                             "(s3fs for s3://, gcsfs for gs://)") from None
        return cls(fs, root.rstrip("/"), url)

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, LocalFileSystem)

    @property
    def local_path(self) -> Path:
        """The folder as a local path; an object-store location has none."""
        if not self.is_local:
            raise InputError(f"{self.url} is not a local folder; use its URL (`url`), or give a local folder as `out`", param="out")
        return Path(self.root)

    def path(self, *parts: str) -> str:
        """The path of `parts` below the root inside `fs`."""
        return posixpath.join(self.root, *parts) if parts else self.root

    def child(self, *parts: str) -> Location:
        url = self.url if not parts else f"{self.url}/{'/'.join(parts)}"
        return Location(self.fs, self.path(*parts), url)

    def __str__(self) -> str:
        return self.url

    def _io(self, what: str, call: Callable[[], T]) -> T:
        """`call()`, an operation on the object store; retried after each of `RETRY_DELAYS` while it fails
        transiently (the endpoint does not answer), then `Unavailable`, one line naming the store and
        saying how to resume. A local disk's calls are made once."""
        if self.is_local:
            return call()
        for delay in (*RETRY_DELAYS, None):
            try:
                return call()
            except Exception as error:
                if not is_transient(error):
                    raise
                if delay is None:
                    raise Unavailable(f"{self.url}: the object store did not answer ({what}: {type(error).__name__}: "
                                      f"{' '.join(str(error).split())}) in {len(RETRY_DELAYS) + 1} tries over {sum(RETRY_DELAYS):g} s; "
                                      f"{RESUME}") from None
                time.sleep(delay)
        raise AssertionError("unreachable")

    # ---- files ------------------------------------------------------------------------------
    def exists(self, *parts: str) -> bool:
        return bool(self._io("check", lambda: self.fs.exists(self.path(*parts))))

    def listdir(self, *parts: str) -> list[str]:
        """Names directly below `parts` (empty when it does not exist)."""
        if not self.exists(*parts):
            return []
        listing = self._io("list", lambda: self.fs.ls(self.path(*parts), detail=False))
        return sorted(posixpath.basename(entry.rstrip("/")) for entry in listing)

    def files(self, *, recursive: bool = True) -> dict[str, int]:
        """Every file below the folder (or only directly in it): its path relative to the folder
        ('/'-separated) -> its size in bytes, in one listing (a walk on a local disk, one listing
        request, paged, on an object store); empty when the folder does not exist."""
        if not self.is_local:
            if not self.exists():
                return {}
            prefix = self.fs._strip_protocol(self.root).rstrip("/") + "/"
            entries = self._io("list", lambda: self.fs.find(self.root, detail=True) if recursive else {
                entry["name"]: entry for entry in self.fs.ls(self.root, detail=True)})
            return {path[len(prefix):]: int(info["size"]) for path, info in entries.items()
                    if info.get("type") == "file" and path.startswith(prefix)}
        found: dict[str, int] = {}
        folders = [""]
        while folders:
            folder = folders.pop()
            try:
                listing = os.scandir(os.path.join(self.root, folder))
            except FileNotFoundError:
                continue
            with listing as entries:
                for entry in entries:
                    path = f"{folder}/{entry.name}" if folder else entry.name
                    if entry.is_dir(follow_symlinks=False):
                        if recursive:
                            folders.append(path)
                    elif entry.is_file():
                        found[path] = entry.stat().st_size
        return found

    def remove(self, name: str, *parts: str) -> None:
        """Delete a file or a folder (recursively) below the root; nothing if it does not exist. The root
        itself is never removed here: what may be removed is the caller's to decide, entry by entry."""
        if self.exists(name, *parts):
            self._io("remove", lambda: self.fs.rm(self.path(name, *parts), recursive=True) if self.fs.exists(self.path(name, *parts)) else None)

    def write_bytes(self, data: bytes, *parts: str) -> None:
        """All of `data` or nothing: a rename on a local disk, one PUT on an object store."""
        if self.is_local:
            atomic_write(self.path(*parts), lambda tmp: tmp.write_bytes(data))
        else:
            self._io("write", lambda: self.fs.pipe_file(self.path(*parts), data))

    def read_bytes(self, *parts: str) -> bytes:
        return bytes(self._io("read", lambda: self.fs.cat_file(self.path(*parts))))

    def write_json(self, document: dict[str, Any], *parts: str) -> None:
        self.write_bytes((json.dumps(document, indent=2) + "\n").encode("utf-8"), *parts)

    def read_json(self, *parts: str) -> dict[str, Any]:
        """A JSON document; an unreadable one is a corrupt store."""
        return self.read_json_bytes(*parts)[1]

    def read_json_bytes(self, *parts: str) -> tuple[bytes, dict[str, Any]]:
        """A JSON file's bytes, read once, and its document (to check the bytes against a digest)."""
        try:
            data = self.read_bytes(*parts)
        except OSError as error:
            raise self.unreadable(error, *parts) from None
        return data, self.parse_json(data, *parts)

    def parse_json(self, data: bytes, *parts: str) -> dict[str, Any]:
        """The JSON document `data`, read from `parts`; an unreadable one is a corrupt store."""
        try:
            document = json.loads(data.decode("utf-8"))
        except ValueError as error:
            raise self.unreadable(error, *parts) from None
        if not isinstance(document, dict):
            raise InputError(f"corrupt store: {self.child(*parts)} holds no JSON object; re-run the extraction with `overwrite=True`", param="overwrite")
        return document

    def unreadable(self, error: Exception, *parts: str) -> InputError:
        """The error for the file at `parts` that cannot be read or parsed (`error`): a corrupt store."""
        return InputError(f"corrupt store: cannot read {self.child(*parts)} ({error}); "
                          "re-run the extraction with `overwrite=True`", param="overwrite")

    def write_parquet(self, table: pd.DataFrame, *parts: str) -> None:
        buffer = io.BytesIO()
        table.to_parquet(buffer, index=False)
        self.write_bytes(buffer.getvalue(), *parts)

    def read_parquet(self, *parts: str, columns: Sequence[str] | None = None) -> pd.DataFrame:
        """The table at `parts` (only `columns`, when given: parquet reads just those)."""
        selected = None if columns is None else list(columns)
        if self.is_local:
            return pd.read_parquet(self.path(*parts), columns=selected)
        def read() -> pd.DataFrame:
            with self.fs.open(self.path(*parts), "rb") as handle:
                return pd.read_parquet(handle, columns=selected)

        return self._io("read", read)

    # ---- zarr ---------------------------------------------------------------------------------
    def zarr_store(self, *parts: str, read_only: bool) -> LocalStore | FsspecStore:
        """A zarr 3 store for the array at `parts`: the local store on a disk, fsspec elsewhere."""
        if self.is_local:
            return LocalStore(self.path(*parts), read_only=read_only)
        return FsspecStore.from_url(self.child(*parts).url, read_only=read_only)

    def open_array(self, *parts: str, mode: str = "r") -> zarr.Array:
        return zarr.open_array(self.zarr_store(*parts, read_only=mode == "r"), mode=mode)
