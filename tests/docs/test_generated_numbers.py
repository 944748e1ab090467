"""Every interval a reader sees is generated (rule 9 of the project's evidence).

The presets' comments, the README and the docs pages (the report aside)
outside their generated blocks and every
docstring of the package, the benchmarks and the app quote no confidence
interval and no "xN.NN" ratio by hand: such numbers come from the report's
generated files (``python -m benchmarks.report``), which mark their blocks in
the README. Doctest examples are code, not quotes: their lines are skipped.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from benchmarks.report import hand_written

ROOT = Path(__file__).resolve().parents[2]
#: ``0.71 [0.63, 0.84]``: a hand-written ratio and interval; ``x0.71``: a
#: hand-written ratio (``x1.00``, a baseline against itself, is no measurement;
#: ``U[0.5, 1.5]`` alone is a distribution's range, not an interval).
QUOTED_NUMBER = re.compile(r"\d\.\d+ \(?\[\d+\.\d+, \d+\.\d+\]|\bx(?!1\.00)\d\.\d\d\b")
CODE_DIRS = ("flwr_importance", "benchmarks", "simulations", "examples")


def quoted_numbers(text: str) -> list[str]:
    """The lines of ``text`` quoting an interval or ratio (doctest lines skipped)."""
    lines, in_example = [], False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith((">>>", "...")):
            in_example = True
            continue
        # A doctest's expected output runs until a blank line.
        if in_example and stripped:
            continue
        in_example = False
        if QUOTED_NUMBER.search(line):
            lines.append(stripped)
    return lines


def docstrings(path: Path) -> list[str]:
    """Every docstring of a module: its own, its classes' and functions'."""
    tree = ast.parse(path.read_text())
    nodes = [tree, *ast.walk(tree)]
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return [
        text
        for node in nodes
        if isinstance(node, kinds) and (text := ast.get_docstring(node))
    ]


def test_the_check_finds_a_quoted_interval_and_skips_doctests() -> None:
    assert quoted_numbers("ratio 0.71 [0.63, 0.84] here") != []
    assert quoted_numbers("| clustered | 12 | x0.71 |") != []
    assert quoted_numbers(">>> f()\n0.7 [0.5, 0.9]\n\nplain text") == []
    assert quoted_numbers("sigma ~ U[0.5, 1.5]; | md (baseline) | x1.00 |") == []


@pytest.mark.parametrize(
    "path", sorted((ROOT / "simulations" / "presets").glob("*.toml")), ids=str
)
def test_presets_quote_no_numbers(path: Path) -> None:
    comments = "\n".join(
        line for line in path.read_text().splitlines() if line.startswith("#")
    )
    assert quoted_numbers(comments) == []


#: The pages a reader follows: the README and every docs page but the report.
HAND_WRITTEN_PAGES = [
    ROOT / "README.md",
    ROOT / "CONTRIBUTING.md",
    *(
        path
        for path in sorted((ROOT / "docs").glob("*.md"))
        if path.name != "results.md"
    ),
]


@pytest.mark.parametrize("path", HAND_WRITTEN_PAGES, ids=lambda path: path.name)
def test_pages_quote_numbers_only_in_generated_blocks(path: Path) -> None:
    assert quoted_numbers(hand_written(path.read_text())) == []


def test_docstrings_quote_no_numbers() -> None:
    found = {
        str(path.relative_to(ROOT)): quoted
        for folder in CODE_DIRS
        for path in sorted((ROOT / folder).rglob("*.py"))
        for text in docstrings(path)
        if (quoted := quoted_numbers(text))
    }
    assert found == {}
