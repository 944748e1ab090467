"""The tables that list every method are written once, in each method's section.

docs/privacy.md (which protection applies, what the server sees) and
docs/deployment.md (a dishonest node's reach) show every method's row; each
row lives in its method's section of docs/methods.md, and
``scripts/docs_snippets.py`` copies them (``test_snippets.py`` checks the
pages are up to date). Here: every declared method has its rows in its own
section, a "refused" gives the constructor's own reason, and the script
refuses tables whose headers disagree.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flwr_importance.method_spec import MethodSpec
from flwr_importance.registry import methods
from scripts import docs_snippets

#: The tables, and how a row's first cell names a method (in code spans:
#: ``OptimalClientSampling(uniform=True)``, ``ClusteredSampling``, ``md``).
TABLES = {
    "protection": lambda spec: spec.strategy.__name__,
    "server-sees": lambda spec: spec.strategy.__name__,
    "dishonest-node": lambda spec: spec.name,
}
#: A cell boundary: a pipe that is not escaped.
CELL_BOUNDARY = re.compile(r"(?<!\\)\|")


def cells(row: str) -> list[str]:
    """The cells of a table row, unescaped."""
    return [cell.strip().replace("\\|", "|") for cell in CELL_BOUNDARY.split(row)[1:-1]]


def names(first_cell: str) -> list[str]:
    """The class or method names a row's first cell opens code spans with."""
    return re.findall(r"`([\w-]+)", first_cell)


def section_of(spec: MethodSpec) -> str:
    """The text of the method's section of docs/methods.md.

    The section its row of the table atop the page links to (``[§6](#...)``).
    """
    rows = docs_snippets.methods_doc_rows()
    link = next(row[-1] for row in rows if row[2] == f"`{spec.strategy.__name__}`")
    number = re.fullmatch(r"\[§(\d+)\]\(#.+\)", link)
    assert number is not None, link
    text = docs_snippets.METHODS_DOC.read_text()
    start = text.index(f"\n## {number[1]}. ")
    return text[start : text.find("\n## ", start + 1)]


def rows_naming(text: str, table: str, spec: MethodSpec) -> list[list[str]]:
    """The rows of ``text``'s marked tables ``table`` whose first cell names it."""
    name = TABLES[table](spec)
    return [
        row
        for match in docs_snippets.ROWS_MARKER.finditer(text)
        if match["table"] == table
        for row in map(cells, match["body"].splitlines()[2:])
        if name in names(row[0])
    ]


@pytest.mark.parametrize("spec", methods(), ids=lambda spec: spec.name)
@pytest.mark.parametrize("table", list(TABLES))
def test_each_method_has_its_rows_in_its_own_section(
    spec: MethodSpec, table: str
) -> None:
    assert rows_naming(section_of(spec), table, spec), (
        f"docs/methods.md: the section of {spec.name} has no row of the "
        f"'<!-- rows: {table} -->' table"
    )


@pytest.mark.parametrize("table", list(TABLES))
def test_each_table_is_on_one_page_with_every_method(table: str) -> None:
    shown = [
        match
        for page in docs_snippets.DOCS.glob("*.md")
        for match in docs_snippets.TABLE_MARKER.finditer(page.read_text())
        if match["table"] == table
    ]
    assert len(shown) == 1, f"'<!-- table: {table} -->' is on {len(shown)} pages"
    first_cells = [cells(row)[0] for row in shown[0]["body"].splitlines()[2:]]
    for spec in methods():
        name = TABLES[table](spec)
        assert any(name in names(cell) for cell in first_cells), (table, spec.name)


@pytest.mark.parametrize("spec", methods(), ids=lambda spec: spec.name)
def test_a_refusal_in_the_table_is_the_constructors_reason(spec: MethodSpec) -> None:
    """A refused method's rows give ``MethodSpec.central_dp_refusal`` verbatim.

    ``CentralDP`` raises with that reason (its tests check the raise); a
    method it accepts in some configuration has a row saying so.
    """
    central_dp = [
        row[1]
        for row in rows_naming(
            docs_snippets.METHODS_DOC.read_text(), "protection", spec
        )
    ]
    if spec.central_dp_refusal is None:
        assert any(cell.startswith("accepted") for cell in central_dp), spec.name
        return
    assert central_dp, spec.name
    for cell in central_dp:
        assert cell.startswith(f"refused: {spec.central_dp_refusal}"), (
            f"{spec.name}: the table says {cell!r}, the constructor "
            f"{spec.central_dp_refusal!r}"
        )


def test_the_script_copies_the_rows_and_refuses_a_mismatch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    header = "| a | b |\n|---|---|\n"
    methods_doc = tmp_path / "methods.md"
    methods_doc.write_text(
        f"## 1. X\n<!-- rows: t -->\n{header}| x | 1 |\n\n"
        f"## 2. Y\n<!-- rows: t -->\n{header}| y | 2 |\n"
    )
    monkeypatch.setattr(docs_snippets, "METHODS_DOC", methods_doc)
    page = f"Intro.\n\n<!-- table: t -->\n{header}| stale | 0 |\n\nAfter.\n"
    assert docs_snippets.render_tables(page) == (
        f"Intro.\n\n<!-- table: t -->\n{header}| x | 1 |\n| y | 2 |\n\nAfter.\n"
    )
    with pytest.raises(ValueError, match="header differs"):
        docs_snippets.render_tables("<!-- table: t -->\n| a | c |\n|---|---|\n")
    with pytest.raises(ValueError, match="no '<!-- rows: u -->' table"):
        docs_snippets.render_tables(f"<!-- table: u -->\n{header}")
    methods_doc.write_text(
        methods_doc.read_text() + "<!-- rows: t -->\n| a | z |\n|---|---|\n| w | 3 |\n"
    )
    with pytest.raises(ValueError, match="'t' table's header differs"):
        docs_snippets.render_tables(page)
