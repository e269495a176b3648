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


# ---- the layers of the source: every import runs down them ---------------------------------------

SRC = TESTS.parent / "src" / "lmgeom"
EXECUTORS = SRC / "engine" / "executors.py"

# Each package (or top-level module) and the packages it may import; SHARED modules (errors, progress,
# ...) import no package and may be imported by any. The order is the data flow (docs/architecture.md):
# the data (corpus -> encoders -> store), the pure arithmetic (metrics, calibrate, evaluate), the run
# directory's schema and the analysis engine, the report, the stages, the pipeline, the CLI.
ALLOWED = {
    "corpus": set(),
    "elmo": {"corpus"},
    "encoders": {"corpus", "elmo"},
    "mix": set(),
    "store": {"corpus", "encoders"},
    "metrics": set(),
    "calibrate": {"metrics"},
    "evaluate": {"metrics"},
    "finetune": {"encoders", "calibrate", "metrics"},
    "rundir": {"store"},
    "engine": {"store", "metrics"},
    "report": {"metrics", "evaluate", "rundir", "engine"},
    "stages": {"corpus", "encoders", "elmo", "mix", "store", "metrics", "calibrate", "evaluate", "finetune", "rundir", "engine"},
    "pipeline": {"corpus", "encoders", "store", "metrics", "evaluate", "rundir", "engine", "report", "stages"},
    "plot": {"rundir", "report"},
    "cli": {"corpus", "encoders", "elmo", "mix", "store", "metrics", "calibrate", "evaluate", "finetune", "rundir", "engine",
            "report", "stages", "pipeline"},
}
SHARED = {"_lazy", "_version", "atomic", "controlspec", "device", "errors", "layerspec", "progress", "sitespec", "threads"}
PURE = {"metrics", "calibrate", "evaluate"}


def _top_level_imports(path: Path) -> set[str]:
    """The packages and top-level modules of lmgeom that the module at `path` imports (also inside
    functions and under TYPE_CHECKING: a type is a dependency too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module == "lmgeom":
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lmgeom."):
            names.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            names.update(alias.name.split(".")[1] for alias in node.names if alias.name.startswith("lmgeom."))
    return names


def _members() -> dict[str, list[Path]]:
    """Each package or top-level module of `src/lmgeom` and its files."""
    members = {path.name: sorted(path.rglob("*.py")) for path in SRC.iterdir() if (path / "__init__.py").exists()}
    members |= {path.stem: [path] for path in SRC.glob("*.py") if path.stem != "__init__"}
    return members


def test_the_layers_have_no_cycle() -> None:
    """The allowed arrows themselves form no cycle, so no pair of packages can import each other."""
    order: list[str] = []
    remaining = dict(ALLOWED)
    while remaining:
        ready = sorted(name for name, needs in remaining.items() if needs <= set(order))
        assert ready, f"a cycle among {sorted(remaining)}"
        order += ready
        for name in ready:
            del remaining[name]


def test_every_import_runs_down_the_layers() -> None:
    members = _members()
    assert set(members) - set(ALLOWED) - SHARED == set(), "a new package or module needs its place in ALLOWED"
    offences = []
    for package, paths in members.items():
        allowed = set() if package in SHARED else ALLOWED[package]
        for path in paths:
            used = _top_level_imports(path) - {package} - SHARED
            if used - allowed:
                offences.append(f"{path.relative_to(SRC)} imports {sorted(used - allowed)}")
    assert not offences, "; ".join(offences)
    for package in PURE:  # the arithmetic takes arrays, never a store, a model or a corpus
        for path in members[package]:
            assert not _top_level_imports(path) & {"store", "rundir", "engine", "encoders", "corpus", "stages"}, path


def _module_imports(path: Path) -> set[str]:
    """Every lmgeom module the module at `path` imports, at run time or for types."""
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lmgeom"):
            modules.add(node.module)
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names if alias.name.startswith("lmgeom"))
    return modules


def test_no_module_imports_itself_through_others() -> None:
    """No circle of imports between files, counting the imports made only for type checking."""
    names = {_module_name(path): path for path in SRC.rglob("*.py")}
    graph = {name: {m for m in _module_imports(path) if m in names and m != name and not name.startswith(m + ".")}
             for name, path in names.items()}
    state: dict[str, int] = {}
    circles: list[str] = []

    def visit(name: str, trail: list[str]) -> None:
        state[name] = 1
        for imported in sorted(graph[name]):
            if state.get(imported) == 1:
                circles.append(" -> ".join(trail[trail.index(imported):] + [imported]))
            elif imported not in state:
                visit(imported, trail + [imported])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not circles, "import circles: " + "; ".join(circles)


def _lmgeom_imports(source: str) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every `import`/`from ... import` of an lmgeom module in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lmgeom"):
            found.append((node.lineno, node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, []) for alias in node.names if alias.name.startswith("lmgeom")]
    return found


def test_the_check_sees_private_names_imported_and_used() -> None:
    source = "from lmgeom.stages.analysis import _result, public\nimport lmgeom.engine.loop as tally\ntally._feed_chunk()\n"
    assert _private_uses(source, "lmgeom.pipeline.job") == ["line 1: _result of lmgeom.stages.analysis",
                                                        "line 3: _feed_chunk of lmgeom.engine.loop"]
    assert _private_uses("from lmgeom.pipeline.job import _own\n", "lmgeom.pipeline.job") == []


def _private_uses(source: str, module: str) -> list[str]:
    """The private names (`_x`, not dunders) `source` (the code of `module`) takes from another module:
    imported by name, or read as an attribute of a module it imported."""
    offences = [f"line {line}: {name} of {imported}" for line, imported, names in _lmgeom_imports(source)
                for name in names if imported != module and name.startswith("_") and not name.startswith("__")
                and not _is_module(imported, name)]
    aliases = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("lmgeom") and alias.asname:
                    aliases[alias.asname] = alias.name
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr.startswith("_") and not node.attr.startswith("__") and aliases[node.value.id] != module):
            offences.append(f"line {node.lineno}: {node.attr} of {aliases[node.value.id]}")
    return sorted(offences)


def _is_module(package: str, name: str) -> bool:
    """Whether `name` of `package` is a module of its own (`lmgeom/_lazy.py`: a package's private
    helper module, not a private name of another module)."""
    return (SRC.parent.joinpath(*package.split("."), f"{name}.py")).exists()


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_module_imports_another_modules_private_names() -> None:
    offences = [f"{path.relative_to(SRC)} {use}" for path in sorted(SRC.rglob("*.py"))
                for use in _private_uses(path.read_text(encoding="utf-8"), _module_name(path))]
    assert not offences, "make the name public (and document it) or move the code to its module: " + "; ".join(offences)


def test_executors_only_schedule() -> None:
    """The executors (local, processes, Ray) hold no statistic, no accumulator and no loop over rows,
    and do not know which kind of plan they run: they call a `Work`'s `run` and nothing else."""
    source = EXECUTORS.read_text(encoding="utf-8")
    imported = _lmgeom_imports(source)
    assert not [module for _, module, _ in imported if module.startswith("lmgeom.metrics")], "an executor imports metrics"
    names = {name for _, _, names in imported for name in names}
    assert not {name for name in names if name.endswith("Accumulator")}, names
    assert not names & {"tally", "Feed", "stored_chunks", "layer_chunks", "register_statistic", "statistic", "Statistic"}, names
    used = {node.id for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Name)}
    assert not {name for name in used if name.endswith("Accumulator") or name in ("tally", "Feed")}
    # no dispatch on plan types: nothing of the engine's plans, tasks or pairs is imported
    assert not [module for _, module, _ in imported if module in ("lmgeom.engine.plan", "lmgeom.engine.tasks", "lmgeom.engine.pairs")], imported
    assert "isinstance" not in used, "an executor dispatches on types"


def test_the_ray_executor_imports_no_accumulator_or_loop_of_its_own() -> None:
    tree = ast.parse(EXECUTORS.read_text(encoding="utf-8"))
    ray = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "RayExecutor")
    imports = [node for node in ast.walk(ray) if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert [(node.module, [alias.name for alias in node.names]) for node in imports if isinstance(node, ast.ImportFrom)] == [
        ("lmgeom.engine.ray", ["connect_ray"])]
    # its only code that touches rows is the work's `run`, through the module's `_run_on_ray`
    calls = {node.func.id for node in ast.walk(ray) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    assert calls <= {"connect_ray", "_bounded"}, calls
    distributed = (SRC / "stages" / "distributed.py").read_text(encoding="utf-8")
    assert "Accumulator" not in distributed and "tally" not in distributed  # no second analysis path beside the engine


def test_only_the_run_directory_module_spells_a_result_file_name() -> None:
    """A result file's name as a path in code (a string without spaces, or a piece of an f-string)
    appears in `lmgeom.rundir` alone; messages and docstrings may name files."""
    from lmgeom import rundir

    specs = [*rundir.RESULT_FILES, *rundir.KINDS.values(), rundir.EXPERIMENT_JSON, rundir.EXPERIMENT_TABLE,
             rundir.COMPARE_PAGE, rundir.COMPARE_CSV, rundir.STATIC_VECTORS]
    names = {re.sub(r"\{[a-z]+\}", "", spec.name).rsplit("/", 1)[-1] for spec in specs}
    names = {name for name in names if "." in name and len(name) > 5} | {f"{folder}/" for folder in
                                                                           ("figures", "static", "calibrators", "experiments")}
    source_root = TESTS.parent / "src" / "lmgeom"
    offences = []
    for path in sorted(source_root.rglob("*.py")):
        if path.parent == source_root / "rundir":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                    and not re.search(r"\s", node.value) and any(name in node.value for name in names)):
                offences.append(f"{path.relative_to(source_root)}:{node.lineno} {node.value!r}")
    assert not offences, "name result files through lmgeom.rundir: " + "; ".join(offences)
