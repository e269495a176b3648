"""Shared by the `reproduce_<paper>.py` scripts: generated blocks of a doc between marker comments.

A doc marks each generated block as

    <!-- table:NAME -->
    ...generated markdown...
    <!-- /table -->

A script builds `{doc path: {NAME: markdown}}` from the committed files under
docs/reproduction/results/ and either writes the blocks into the docs (`--write`, the default) or
checks that the docs hold exactly them (`--check`, exit 1 naming the first block that differs).
tests/test_reproduction_docs.py runs the check for every script.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "reproduction" / "results"
MARKED = re.compile(r"<!-- table:(?P<name>[\w.-]+) -->\n(?P<body>.*?)<!-- /table -->", re.S)

Documents = dict[str, dict[str, str]]  # doc path relative to the repository root -> block name -> markdown


def marked_blocks(text: str) -> dict[str, str]:
    """The generated blocks of a doc, by name; a name used twice is an error."""
    blocks: dict[str, str] = {}
    for match in MARKED.finditer(text):
        name = match.group("name")
        if name in blocks:
            raise ValueError(f"block {name!r} is marked twice")
        blocks[name] = match.group("body")
    return blocks


def fill(text: str, blocks: dict[str, str], doc: str) -> str:
    """`text` with every marked block replaced by its generated markdown; every block of the doc
    must be generated and every generated block must be marked in the doc."""
    present = marked_blocks(text)
    unmarked = sorted(set(blocks) - set(present))
    stale = sorted(set(present) - set(blocks))
    if unmarked or stale:
        raise ValueError(f"{doc}: blocks generated but not marked {unmarked}, marked but not generated {stale}")

    def body(match: re.Match[str]) -> str:
        content = blocks[match.group("name")].rstrip("\n") + "\n"
        return f"<!-- table:{match.group('name')} -->\n{content}<!-- /table -->"

    return MARKED.sub(body, text)


def differences(documents: Documents) -> list[str]:
    """One line per generated block that differs from the doc's text (empty when all agree)."""
    problems = []
    for doc, blocks in documents.items():
        present = marked_blocks((ROOT / doc).read_text(encoding="utf-8"))
        for name in sorted(set(blocks) | set(present)):
            if name not in present:
                problems.append(f"{doc}: block {name!r} is generated but not marked")
            elif name not in blocks:
                problems.append(f"{doc}: block {name!r} is marked but not generated")
            elif present[name].rstrip("\n") != blocks[name].rstrip("\n"):
                problems.append(f"{doc}: block {name!r} differs from what the results give")
    return problems


def main(build: Callable[[], Documents], argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=sys.modules["__main__"].__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only check that the docs hold the generated blocks")
    args = parser.parse_args(argv)
    documents = build()
    if args.check:
        problems = differences(documents)
        for line in problems:
            print(line)
        return 1 if problems else 0
    for doc, blocks in documents.items():
        path = ROOT / doc
        path.write_text(fill(path.read_text(encoding="utf-8"), blocks, doc), encoding="utf-8")
        print(f"{doc}: {len(blocks)} blocks written")
    return 0


# ---- reading and formatting -------------------------------------------------------------------
def results(run: str) -> dict[str, Any]:
    """docs/reproduction/results/<run>/results.json."""
    return load_json(RESULTS / run / "results.json")


def load_json(path: Path, kind: str | None = None) -> Any:
    """The JSON at `path`; with `kind`, an lmgeom result document of that kind, checked as lmgeom's readers
    check it (`rundir.read_json`)."""
    if not path.exists():
        raise SystemExit(f"{path.relative_to(ROOT)} does not exist: its run's command is in docs/reproduction/results/COMMANDS.md")
    if kind is not None:
        from lmgeom import rundir

        return rundir.read_json(path, kind)
    return json.loads(path.read_text(encoding="utf-8"))


def number(value: float | None, digits: int = 3, *, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def p_text(p: float | None, significant: bool | None = None) -> str:
    if p is None:
        return ""
    return f"{p:.3g}{' *' if significant else ''}"


def markdown(header: Sequence[str], rows: Iterable[Sequence[Any]], *, align: str | None = None) -> str:
    """A pipe table; `align` is one letter per column (l or r), numbers right-aligned by default."""
    header = list(header)
    rules = ["---" if (align or "l" + "r" * (len(header) - 1))[i] == "l" else "---:" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(rules) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)
