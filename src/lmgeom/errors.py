"""The exceptions lmgeom raises for problems in what its user gave it, importable from every layer.

`InputError` is bad input: a parameter out of range or inconsistent with another, a file or folder
that is not what the parameter promised (a damaged store, a garbage result file). Its message names
the Python parameter(s) in backticks (`` `min_contexts` ``, `` `device='cpu'` ``, `` `overwrite=True` ``)
and says how to fix it; `params` lists those names, so a front end can name its own options instead
(`lmgeom.cli.common.user_errors` writes `--min-contexts`, `--device cpu`, `--overwrite`).
`MissingInput` and `OutOfRange` are `InputError`s that are also a `FileNotFoundError` or an `IndexError` (a folder a parameter names that
does not exist or lacks its files; a layer or row outside the store); `MissingDependency` is an optional package a feature needs and the
environment lacks; `Unavailable` is an object store that did not answer after retries (the message says
how to resume).

Any other exception out of lmgeom is a bug (or a third-party library's), not the user's mistake."""

from __future__ import annotations

from typing import Any, Iterable


class InputError(ValueError):
    """Bad input: `message` says what is wrong (naming the parameters in backticks) and `fix` how to
    mend it; `params` are the Python parameter names the message refers to."""

    def __init__(self, message: str, *, param: str | Iterable[str] = (), fix: str = "") -> None:
        super().__init__(f"{message}; {fix}" if fix else message)
        self.params: tuple[str, ...] = (param,) if isinstance(param, str) else tuple(param)
        self.fix = fix

    def __reduce__(self) -> tuple[Any, ...]:
        # pickled whole (a worker process's error reaches the parent with its params), whatever the
        # subclass's __init__ takes
        return _restore, (type(self), self.args, self.__dict__)


def _restore(cls: type[InputError], args: tuple[Any, ...], state: dict[str, Any]) -> InputError:
    # the __new__ of the builtin base that lays out the instance (OSError's for MissingInput), not __init__
    error = next(made for made in (_new(base, cls, args) for base in cls.__mro__ if base.__module__ == "builtins") if made)
    error.args = args
    error.__dict__.update(state)
    return error


def _new(base: type, cls: type[InputError], args: tuple[Any, ...]) -> InputError | None:
    try:
        return base.__new__(cls, *args)
    except TypeError:  # "not safe": a base whose layout is not the instance's
        return None


class MissingDependency(ImportError):
    """An optional package a feature needs is not installed; the message says what to install."""


class MissingInput(InputError, FileNotFoundError):
    """A file or folder a parameter names that does not exist, or lacks the files it must hold."""


class OutOfRange(InputError, IndexError):
    """An index a parameter gives (a layer, a sentence, a row range) outside what exists."""


class Unavailable(Exception):
    """An object store (or other endpoint) that did not answer, after bounded retries; the message names
    it and says that the same command, run again, resumes. Not an `OSError`, so that no handler of a
    missing or unreadable file takes it for one (a store's meta.json that "does not read")."""
