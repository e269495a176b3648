"""What an fsspec URL must look like (the one check of a path that means a URL but lacks its `//`) and
which errors of an object store are transient (worth a retry); light enough for the CLI's option
callbacks and error reporting (fsspec's registry is read only when a path is checked)."""

from __future__ import annotations

import os
import re

from lmgeom.errors import InputError

_SCHEME = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]+):(?!:)/*(?P<rest>.*)$")


def require_url_form(path: str | os.PathLike[str], *, param: str | None = None) -> None:
    """Refuse a path that is an fsspec protocol and a colon without the `//` (`s3:/bucket/x`, `s3:bucket/x`,
    `gs:/b`), which as a local path would silently make a folder named `s3:`, naming the URL meant
    (`param`: the parameter that gave it). A local file or folder of that name that exists is taken."""
    from fsspec.registry import known_implementations

    text = os.fspath(path)
    match = _SCHEME.match(text) if "://" not in text else None
    if match is None or match["scheme"].lower() not in known_implementations or os.path.exists(text):
        return
    scheme = match["scheme"]
    named = f"`{param}` {text!r}" if param else repr(text)
    raise InputError(f"{named} lacks the '//' of a {scheme}:// URL (as a local path it would make a folder named "
                     f"'{scheme}:'); write {scheme}://{match['rest']}", param=param or ())


_TRANSIENT_NAMES = frozenset({
    # botocore (s3fs)
    "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError",
    "ProxyConnectionError", "ResponseStreamingError", "IncompleteReadError",
    # aiohttp (s3fs, gcsfs, http) and urllib3
    "ClientConnectionError", "ClientOSError", "ServerDisconnectedError", "ServerTimeoutError", "ProtocolError",
})
"""Errors of an object store's client that say the endpoint did not answer (or stopped answering) rather
than that the request was wrong; named rather than imported, so that no client library must be installed."""


def is_transient(error: BaseException) -> bool:
    """Whether `error` (or an error it was raised from) is an object store or network endpoint that did
    not answer: a connection refused, reset or timed out (`_TRANSIENT_NAMES`, `ConnectionError`, `TimeoutError`)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (ConnectionError, TimeoutError)) or any(
                cls.__name__ in _TRANSIENT_NAMES for cls in type(current).__mro__):
            return True
        current = current.__cause__ or current.__context__
    return False


RESUME = "what was committed is kept: run the same command again to resume once it answers"
