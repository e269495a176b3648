"""How the test suite is laid out: no test module imports another (shared pieces live in
tests/helpers.py, fixtures in tests/conftest.py), also not in the code a test runs in a fresh
interpreter; and the markers the fast inner loop deselects are registered."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

TESTS = Path(__file__).resolve().parent
TEST_MODULES = {path.stem for path in TESTS.glob("test_*.py")} | {"conftest"}
# an import statement inside a string: the code of `python -c` or of a spawned script
IMPORT_IN_TEXT = re.compile(r"(?:^|[;\n])\s*(?:from\s+([\w.]+)\s+import|import\s+([\w.]+))")


def imported_modules(source: str) -> list[tuple[int, str]]:
    """(line, module) for every import statement of `source`, and for every one inside its strings."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [(node.lineno, a or b) for a, b in IMPORT_IN_TEXT.findall(node.value)]
    return found


def test_the_check_sees_imports_in_code_and_in_strings() -> None:
    source = 'import test_a\nfrom tests.test_b import x\ncode = "import sys; from test_c import y"\nimport helpers\n'
    assert sorted(imported_modules(source)) == [(1, "test_a"), (2, "tests.test_b"), (3, "sys"), (3, "test_c"), (4, "helpers")]


def test_no_test_module_imports_another() -> None:
    offences = []
    for path in sorted(TESTS.glob("*.py")):
        for line, module in imported_modules(path.read_text(encoding="utf-8")):
            parts = module.split(".")
            name = parts[1] if parts[0] == "tests" and len(parts) > 1 else parts[0]
            if name in TEST_MODULES:
                offences.append(f"{path.name}:{line} imports {module}")
    assert not offences, "move what they share into tests/helpers.py or a fixture in tests/conftest.py: " + "; ".join(offences)


def test_the_markers_of_the_fast_loop_are_registered() -> None:
    options = tomllib.loads((TESTS.parent / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["pytest"]["ini_options"]
    registered = {marker.split(":")[0] for marker in options["markers"]}
    assert {"slow", "ray", "browser", "processes"} <= registered


def test_only_the_run_directory_module_spells_a_result_file_name() -> None:
    """A result file's name as a path in code (a string without spaces, or a piece of an f-string)
    appears in `lmgeom.runs.rundir` alone; messages and docstrings may name files."""
    from lmgeom.runs import rundir

    specs = [*rundir.RESULT_FILES, *rundir.KINDS.values(), rundir.EXPERIMENT_JSON, rundir.EXPERIMENT_TABLE,
             rundir.COMPARE_PAGE, rundir.COMPARE_CSV, rundir.STATIC_VECTORS]
    names = {re.sub(r"\{[a-z]+\}", "", spec.name).rsplit("/", 1)[-1] for spec in specs}
    names = {name for name in names if "." in name and len(name) > 5} | {f"{folder}/" for folder in
                                                                           ("figures", "static", "calibrators", "experiments")}
    source_root = TESTS.parent / "src" / "lmgeom"
    offences = []
    for path in sorted(source_root.rglob("*.py")):
        if path == source_root / "runs" / "rundir.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                    and not re.search(r"\s", node.value) and any(name in node.value for name in names)):
                offences.append(f"{path.relative_to(source_root)}:{node.lineno} {node.value!r}")
    assert not offences, "name result files through lmgeom.runs.rundir: " + "; ".join(offences)
