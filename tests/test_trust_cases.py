"""The trust cases of scripts/trust_cases.py, each on real tiny stores of tiny-bert over Lee: stale
results recomputed, foreign or mixed result files refused, damaged or edited store files refused by
every reader, the user's own files kept, hostile words and names escaped, one-line errors, and the
geometry's numbers the same in fresh processes. docs/robustness.md holds the table the script prints."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load() -> ModuleType:
    name = "trust_cases"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its dataclasses look their module up by name
        spec.loader.exec_module(module)
    return sys.modules[name]


trust_cases = _load()
CASE_IDS = [case.id for case in trust_cases.CASES]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory, tiny_cli_run: tuple[Path, str]) -> dict[str, object]:
    """Every case, run once on copies of one base run: the session's `lmgeom run` of tiny-bert with
    `helpers.TINY_RUN`, the script's BASE_OPTIONS (several minutes on two shared cores)."""
    from helpers import TINY_RUN

    assert TINY_RUN == trust_cases.BASE_OPTIONS
    return {result.id: result for result in trust_cases.run_cases(tmp_path_factory.mktemp("trust-cases"),
                                                                   base=tiny_cli_run[0])}


@pytest.mark.slow
@pytest.mark.processes  # case 25 runs `lmgeom geometry` in fresh interpreters
@pytest.mark.parametrize("case", CASE_IDS)
def test_each_trust_case_behaves_as_expected(results: dict[str, object], case: str) -> None:
    result = results[case]
    assert result.passed, (f"case {result.id} ({result.defect_class}): {result.done}\n"  # type: ignore[attr-defined]
                           f"expected: {result.expected}\nobserved: {result.observed}")  # type: ignore[attr-defined]


def test_the_counts_and_the_markdown_table() -> None:
    make = trust_cases.CaseResult
    results = [make("1", "stale", "a | b", "x", "y", True), make("2", "stale", "c", "x", "(x) z", False),
               make("3", "escaping", "d", "x", "y", True)]
    assert trust_cases.counts(results) == ["stale: 2 cases, 1 as expected", "escaping: 1 cases, 1 as expected",
                                           "3 cases: 2 as expected, 1 not (case 2)"]
    table = trust_cases.markdown(results)
    assert "| 1 | stale | a \\| b | x | y | pass |" in table and "| 2 | stale | c | x | (x) z | FAIL |" in table
    assert table.endswith("3 cases: 2 as expected, 1 not (case 2)")
    with pytest.raises(ValueError, match="no case 99"):
        trust_cases.run_cases(Path("unused"), ["99"])


def test_the_docs_list_every_case_as_the_script_describes_it() -> None:
    """docs/robustness.md's table has a row per case with the script's class, action and expectation."""
    text = (ROOT / "docs" / "robustness.md").read_text(encoding="utf-8")
    rows = {match[1]: match[0] for match in re.finditer(r"^\| (\d+) \|.*$", text, re.M)}
    assert sorted(rows, key=int) == CASE_IDS
    for case in trust_cases.CASES:
        cells = [trust_cases.cell(text) for text in (case.defect_class, case.done, case.expected)]
        assert rows[case.id].startswith(f"| {case.id} | {' | '.join(cells)} |"), case.id
