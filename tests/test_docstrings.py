"""The public entry points document every parameter, in order, in a numpydoc `Parameters` section.

A parameter added to a signature without an entry (or an entry left behind by a removed or renamed
parameter) fails here, naming the callable and both lists."""

from __future__ import annotations

import importlib
import inspect
import re
from typing import Any, Callable

import pytest

ENTRY_POINTS = [
    "lmgeom.pipeline.job.run",
    "lmgeom.stages.extraction.extract",
    "lmgeom.stages.extraction.extract_model",
    "lmgeom.stages.analysis.analyze_store",
    "lmgeom.report.data.load_run",
    "lmgeom.plot.contextuality",
    "lmgeom.plot.isotropy",
    "lmgeom.plot.calibration",
    "lmgeom.plot.similarity",
    "lmgeom.plot.geometry",
]
CALIBRATORS = [
    "lmgeom.calibrate.linear.Whitening",
    "lmgeom.calibrate.linear.AllButTheTop",
    "lmgeom.calibrate.linear.Standardize",
    "lmgeom.calibrate.conceptor.ConceptorNegation",
    "lmgeom.calibrate.cluster.ClusterIsotropy",
    "lmgeom.calibrate.flow.FlowCalibrator",
]

_UNDERLINE = re.compile(r"-{3,}")
# `name : type`, `name` alone, or `x1, x2 : type`; `*args` and `**kwargs` as written
_ENTRY = re.compile(r"(?P<names>\*{0,2}[A-Za-z_]\w*(?:\s*,\s*\*{0,2}[A-Za-z_]\w*)*)\s*(?::\s*(?P<type>.*))?")


def load(dotted: str) -> Any:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def section_entries(doc: str | None, title: str) -> list[str] | None:
    """The names of the entries of numpydoc section `title` in `doc`, in order; None when there is no
    such section. The section runs from its underline to the next section's header (a line followed
    by an underline at the section's indentation) or the end; an entry is a line at the section's
    indentation, its description the lines indented below it."""
    lines = (doc or "").expandtabs().splitlines()
    start = next((i for i in range(len(lines) - 1)
                  if lines[i].strip() == title and _UNDERLINE.fullmatch(lines[i + 1].strip())
                  and _indent(lines[i + 1]) == _indent(lines[i])), None)
    if start is None:
        return None
    indent = _indent(lines[start])
    names: list[str] = []
    body = lines[start + 2:]
    for i, line in enumerate(body):
        if not line.strip():
            continue
        if (i + 1 < len(body) and _UNDERLINE.fullmatch(body[i + 1].strip()) and _indent(body[i + 1]) == indent
                and _indent(line) == indent):
            break  # the next section's header
        if _indent(line) < indent:
            break  # the docstring's own text again (or its closing quotes)
        if _indent(line) > indent:
            continue  # an entry's description
        match = _ENTRY.fullmatch(line.strip())
        assert match is not None, f"{title} entry {line.strip()!r} is not `name : type`"
        names += [name.strip() for name in match["names"].split(",")]
    return names


def documented_parameters(obj: Callable[..., Any]) -> list[str]:
    return section_entries(obj.__doc__, "Parameters") or []


def signature_parameters(obj: Callable[..., Any]) -> list[str]:
    """The parameter names as numpydoc writes them (`*args`, `**kwargs`); a class's are its `__init__`'s,
    without `self`."""
    parameters = list(inspect.signature(obj.__init__).parameters.values())[1:] if inspect.isclass(obj) else \
        list(inspect.signature(obj).parameters.values())
    stars = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    return [stars.get(parameter.kind, "") + parameter.name for parameter in parameters]


@pytest.mark.parametrize("dotted", ENTRY_POINTS + CALIBRATORS)
def test_parameters_section_matches_signature(dotted: str) -> None:
    obj = load(dotted)
    expected = signature_parameters(obj)
    documented = documented_parameters(obj)
    missing = [name for name in expected if name not in documented]
    extra = [name for name in documented if name not in expected]
    assert documented == expected, (
        f"{dotted}: the docstring's Parameters section {documented} is not the signature's {expected}"
        + (f"; undocumented: {missing}" if missing else "") + (f"; documented but not parameters: {extra}" if extra else "")
        + ("" if missing or extra else "; same names in another order"))


@pytest.mark.parametrize("dotted", ENTRY_POINTS)
def test_functions_document_returns(dotted: str) -> None:
    assert section_entries(load(dotted).__doc__, "Returns"), f"{dotted}: no numpydoc Returns section"


@pytest.mark.parametrize("dotted", ENTRY_POINTS + CALIBRATORS)
def test_summary_is_one_short_line(dotted: str) -> None:
    doc = inspect.getdoc(load(dotted)) or ""
    summary = doc.split("\n\n", 1)[0]
    assert summary and "\n" not in summary, f"{dotted}: the summary paragraph is more than one line: {summary!r}"


@pytest.mark.parametrize("dotted", CALIBRATORS)
def test_calibrators_document_their_fitted_attributes(dotted: str) -> None:
    """Every fitted attribute (a public name ending in `_`) that `fit` sets is in the Attributes section."""
    numpy = pytest.importorskip("numpy")
    cls = load(dotted)
    documented = section_entries(cls.__doc__, "Attributes")
    assert documented, f"{dotted}: no numpydoc Attributes section"
    X = numpy.random.default_rng(0).normal(size=(64, 4))
    options: dict[str, Any] = {}
    if cls.__name__ == "ClusterIsotropy":
        options = {"n_clusters": 2, "n_components": 2}
    elif cls.__name__ == "FlowCalibrator":
        options = {"n_steps": 1, "hidden_size": 4, "n_epochs": 1, "batch_size": 64, "device": "cpu"}
    fitted = cls(**options).fit(X)
    attributes = sorted(name for name in vars(fitted) if name.endswith("_") and not name.startswith("_"))
    undocumented = [name for name in attributes if name not in documented]
    assert not undocumented, f"{dotted}: fitted attributes {undocumented} are not in its Attributes section {documented}"


def test_parser_reads_entries_and_stops_at_the_next_section() -> None:
    doc = """Summary.

        Parameters
        ----------
        a : int, default 1
            The first.

            More about it: b : not an entry.
        b, c
            Two at once.
        *args : Any
        **kwargs : Any
            The rest.

        Returns
        -------
        int
            What comes back.
        """
    assert section_entries(doc, "Parameters") == ["a", "b", "c", "*args", "**kwargs"]
    assert section_entries(doc, "Returns") == ["int"]
    assert section_entries(doc, "Raises") is None
