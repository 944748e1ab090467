"""Fill docs/methods.md from the example regions, and other pages' tables from it.

The examples under ``examples/`` mark the lines each method adds to a Flower
app with whole-line comments::

    # --8<-- [start:ocs-client]
    add_norm_query(app, train, train_loss_key="train_loss")
    # --8<-- [end:ocs-client]

A region name is ``<method>-server`` or ``<method>-client``; one name may mark
several places of an app (its parts are shown joined by ``...``; parts with
nothing but blank and marker lines between them read as one), and lines
several methods need carry all their names, comma-separated
(``[start:md-client,clustered-client]``). In the docs,
a marker line names an example and a region, and the fenced block under it is
that region's code::

    <!-- snippet: quickstart-pytorch#ocs-client -->

A marker may join several regions with ``+``
(``quickstart-pytorch#sizes-query-client+loss-query-client``): their parts in
file order, as one region. A method whose nodes only answer the standard
queries marks no client region of its own: its lines are those of the regions
``<query>-query-client`` of the queries its strategy declares
(``MethodSpec.client_queries``), which one app of the example serves for every
such method.

The examples in :data:`DIFF_SHAPES` keep Flower's own app's files and names,
and their regions are shown as a diff against Flower's app: every line of a
region is added (``+``), except a comment ``# replaces: <line>``, which is
Flower's line the region removes (``-``) at that place, and a comment
``# after: <line>``, Flower's line the part follows (context). A part that
only removes lines is followed by the file's next line, as context.

Between ``<!-- lines-table:start -->`` and ``<!-- lines-table:end -->`` the
docs hold the table of lines each method adds, per app shape, counted from the
same regions.

Between ``<!-- methods-table:start -->`` and ``<!-- methods-table:end -->``
the README holds the table of methods: the table atop docs/methods.md, one
row per method there (``tests/docs/test_methods.py`` checks one per
declaration of ``flwr_importance.registry.methods()``), with its paper up to
the colon and without its benchmark column.

A table that lists every method on another page (which protection applies,
what the server sees: docs/privacy.md; a dishonest node's reach:
docs/deployment.md) is written once per method, in its section of
docs/methods.md, under a marker line that names the table::

    <!-- rows: protection -->
    | strategy | `CentralDP` | SecAgg+ | local DP |
    |---|---|---|---|
    | `PowerOfChoice` | refused: ... | not offered | none |

and the page holds the table under ``<!-- table: protection -->``: its
header, then every section's rows, in page order.

``python scripts/docs_snippets.py`` rewrites docs/methods.md, the README and
the pages of those tables; ``--check`` only says whether they are up to date
(tests/docs/test_snippets.py runs the check), so the docs cannot drift from
code that runs or from each other.

Why a script and not ``pymdownx.snippets`` (whose region markers the examples
use): that extension inserts a region as it is, when mkdocs builds the site.
These pages are read on the repository too, where an include line shows as
itself; the snippets are shown as diffs against Flower's app, with the
replaced lines, which an include cannot render; and the lines table and the
README's table are computed, not included.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
DOCS = ROOT / "docs"
METHODS_DOC = DOCS / "methods.md"
README = ROOT / "README.md"

#: The app shapes of the lines table: example folder and column title.
SHAPES = {
    "quickstart-pytorch": (
        "Flower's `quickstart-pytorch`, Message API (`examples/quickstart-pytorch`)"
    ),
    "quickstart-pytorch-legacy": (
        "PyTorch `NumPyClient`, legacy API (`examples/quickstart-pytorch-legacy`)"
    ),
    "quickstart-sklearn": "scikit-learn, Message API (`examples/quickstart-sklearn`)",
}

#: The examples whose regions the docs show as a diff against Flower's own app
#: of the same files and names, and that app's name.
DIFF_SHAPES = {"quickstart-pytorch": "quickstart-pytorch"}
#: The comment that names, in a region, the line of Flower's app it removes.
REPLACES = "# replaces: "
#: The comment that names, in a region, the line of Flower's app it follows.
AFTER = "# after: "

#: A marker line may end in ruff's line-length exemption (E501) when its
#: names make it long.
REGION_MARKER = re.compile(
    r"^\s*# --8<-- \[(start|end):([\w,-]+)\](?:\s+# noqa: E501)?\s*$"
)
SNIPPET_MARKER = re.compile(
    r"^<!-- snippet: (?P<example>[\w-]+)#(?P<region>[\w+-]+) -->\n"
    r"(?:```(?:python|diff)\n.*?```\n)?",
    re.M | re.S,
)
TABLE = re.compile(r"(<!-- lines-table:start -->\n).*?(<!-- lines-table:end -->)", re.S)
METHODS_TABLE = re.compile(
    r"(<!-- methods-table:start -->\n).*?(<!-- methods-table:end -->)", re.S
)


def marked_table(kind: str) -> re.Pattern[str]:
    """A ``<!-- <kind>: <table name> -->`` line and the table under it."""
    return re.compile(
        rf"^<!-- {kind}: (?P<table>[\w-]+) -->\n(?P<body>(?:\|.*\n)+)", re.M
    )


#: A method's rows of a table that lists every method (in its section of
#: docs/methods.md), and that table (on another page).
ROWS_MARKER = marked_table("rows")
TABLE_MARKER = marked_table("table")
#: Shown between two parts of one region.
PART_SEPARATOR = "..."
#: Joins the regions of a marker shown as one.
REGION_JOIN = "+"
#: The suffix of a standard query's client region, after the query's action.
QUERY_REGION_SUFFIX = "-query-client"


@dataclass
class Part:
    """One part of a region: its code, and the file's next line of code."""

    code: str
    #: The first line after the part that is neither blank nor a marker.
    next_line: str | None
    #: The file's line number of the part's end marker.
    end: int


def region_parts(path: Path, joined: str | None = None) -> dict[str, list[Part]]:
    """The regions marked in one file: each name's parts, in order.

    A part that follows the name's previous part with only blank and marker
    lines between them extends it. ``joined`` (names joined with ``+``) reads
    every one of its names as ``joined`` itself: their union, a line marked
    with several of them once.

    Raises
    ------
    ValueError
        On a region that is not closed, closed without being opened, or opened
        inside another.
    """
    file_lines = path.read_text().splitlines()
    parts: dict[str, list[Part]] = defaultdict(list)
    open_names: str | None = None
    opened = 0
    lines: list[str] = []
    for number, line in enumerate(file_lines, start=1):
        marker = REGION_MARKER.match(line)
        if marker is None:
            if open_names is not None:
                lines.append(line)
            continue
        kind, names = marker.groups()
        if kind == "start":
            if open_names is not None:
                raise ValueError(
                    f"{path}:{number}: '{names}' opens inside '{open_names}'"
                )
            open_names, opened, lines = names, number, []
            continue
        if names != open_names:
            raise ValueError(f"{path}:{number}: '{names}' closes but is not open")
        code = "\n".join(lines).strip("\n")
        following = (
            rest
            for rest in file_lines[number:]
            if rest.strip() and not REGION_MARKER.match(rest)
        )
        next_line = next(following, None)
        for name in marked_names(names, joined):
            previous = parts[name][-1] if parts[name] else None
            if previous is not None and all(
                not between.strip() or REGION_MARKER.match(between)
                for between in file_lines[previous.end : opened - 1]
            ):
                previous.code += "\n" + code
                previous.next_line, previous.end = next_line, number
            else:
                parts[name].append(Part(code, next_line, number))
        open_names = None
    if open_names is not None:
        raise ValueError(f"{path}: region '{open_names}' is never closed")
    return dict(parts)


def marked_names(names: str, joined: str | None) -> list[str]:
    """The region names of a marker's comma-separated ``names``.

    >>> marked_names("a-client,b-client,c-client", "a-client+b-client")
    ['a-client+b-client', 'c-client']
    """
    members = joined.split(REGION_JOIN) if joined else []
    return list(
        dict.fromkeys(joined if name in members else name for name in names.split(","))
    )


def file_regions(path: Path) -> dict[str, list[str]]:
    """The regions marked in one file: each name's parts' code, in order.

    Raises
    ------
    ValueError
        As :func:`region_parts`.
    """
    return {
        name: [part.code for part in parts]
        for name, parts in region_parts(path).items()
    }


def example_regions(example: str) -> dict[str, dict[Path, list[Part]]]:
    """Every region of an example app: name -> file (relative) -> parts."""
    folder = EXAMPLES / example
    if not folder.is_dir():
        raise ValueError(f"no example app '{example}' under {EXAMPLES}")
    regions: dict[str, dict[Path, list[Part]]] = defaultdict(dict)
    for path in sorted(folder.rglob("*.py")):
        for name, parts in region_parts(path).items():
            regions[name][path.relative_to(folder)] = parts
    return dict(regions)


def indentation(line: str) -> int:
    """The number of leading spaces of ``line``."""
    return len(line) - len(line.lstrip())


def region_code(example: str, region: str) -> str:
    """A region as the docs show it: each file's parts under its path.

    Each part loses its own indentation and keeps the rest, so the lines of
    one function read at their depths. An example of :data:`DIFF_SHAPES` gives
    :func:`region_diff` instead.
    """
    if example in DIFF_SHAPES:
        return region_diff(example, region)
    blocks = []
    for path, parts in region_files(example, region).items():
        dedented = ["\n".join(dedent(part.code.splitlines())) for part in parts]
        blocks.append(f"# {path.as_posix()}\n" + f"\n{PART_SEPARATOR}\n".join(dedented))
    return "\n\n".join(blocks) + "\n"


def dedent(lines: list[str]) -> list[str]:
    """``lines`` less the indentation their non-blank lines share."""
    shared = min(indentation(line) for line in lines if line.strip())
    return [line[shared:] for line in lines]


def region_files(example: str, region: str) -> dict[Path, list[Part]]:
    """The files of ``example`` that mark ``region``, with their parts.

    ``region`` may join several names with ``+``: their union, as one region
    (:func:`region_parts`).

    Raises
    ------
    ValueError
        If no file of the example marks ``region`` (each of its names).
    """
    regions = example_regions(example)
    for name in region.split(REGION_JOIN):
        if name not in regions:
            raise ValueError(f"examples/{example} marks no region '{name}'")
    if REGION_JOIN not in region:
        return regions[region]
    folder = EXAMPLES / example
    files = {
        path.relative_to(folder): region_parts(path, region).get(region)
        for path in sorted(folder.rglob("*.py"))
    }
    return {path: parts for path, parts in files.items() if parts}


def client_region(example: str, method: str) -> str | None:
    """The region(s) of ``method``'s client lines in ``example``, or None.

    Its own ``<method>-client`` region, else the query regions of the standard
    queries its strategy declares, joined with ``+``, when the example marks
    them all.
    """
    regions = example_regions(example)
    if f"{method}-client" in regions:
        return f"{method}-client"
    sys.path.insert(0, str(ROOT))
    from flwr_importance.registry import method as method_spec
    from flwr_importance.registry import methods

    if method not in {spec.name for spec in methods()}:
        return None
    names = [
        f"{query}{QUERY_REGION_SUFFIX}" for query in method_spec(method).client_queries
    ]
    if not names or any(name not in regions for name in names):
        return None
    return REGION_JOIN.join(names)


def region_diff(example: str, region: str) -> str:
    """A region as a diff against Flower's app: each file's parts under its path.

    Each part loses its own indentation; a region's line is added (``+``),
    a ``# replaces: <line>`` comment is Flower's ``<line>`` removed (``-``),
    and a part that only removes lines shows the file's next line as context.
    """
    blocks = []
    for path, parts in region_files(example, region).items():
        rendered = []
        for part in parts:
            lines = part.code.splitlines()
            shared = indentation(lines[0]) - indentation(dedent(lines)[0])
            diff = [diff_line(line) for line in dedent(lines)]
            if all(line.startswith("-") for line in diff) and part.next_line:
                diff.append(" " + part.next_line[shared:])
            rendered.append("\n".join(diff))
        blocks.append(
            f" # {path.as_posix()}\n" + f"\n {PART_SEPARATOR}\n".join(rendered)
        )
    return "\n\n".join(blocks) + "\n"


def diff_line(line: str) -> str:
    """A dedented region line as a diff line: Flower's line removed, or one added."""
    depth = " " * indentation(line)
    if line.lstrip().startswith(REPLACES):
        return "-" + depth + line.lstrip().removeprefix(REPLACES)
    if line.lstrip().startswith(AFTER):
        return " " + depth + line.lstrip().removeprefix(AFTER)
    return "+" + line if line.strip() else "+"


def added_lines(code: str) -> int:
    """Lines of code in a snippet: not blank, not a comment, not a separator."""
    return sum(
        1
        for line in code.splitlines()
        if line.strip() and not line.strip().startswith("#")
        if line.strip() != PART_SEPARATOR
    )


def diff_counts(diff: str) -> tuple[int, int]:
    r"""Lines of code a diff adds and removes: not blank, not a comment.

    >>> diff_counts(" # app.py\n+import x\n+# why\n-y = 1\n+y = x.f()\n ...\n")
    (2, 1)
    """
    added = added_lines(
        "\n".join(line[1:] for line in diff.splitlines() if line[:1] == "+")
    )
    removed = added_lines(
        "\n".join(line[1:] for line in diff.splitlines() if line[:1] == "-")
    )
    return added, removed


def lines_table(methods: list[str]) -> str:
    """The table of lines each method adds, server and client, per app shape.

    A method an app does not run shows "n/a" (see the method's section); its
    client lines are those of :func:`client_region`.
    """
    header = "| method | " + " | ".join(SHAPES.values()) + " |"
    rows = [header, "|---" * (len(SHAPES) + 1) + "|"]
    for method in methods:
        cells = []
        for example in SHAPES:
            if f"{method}-server" not in example_regions(example):
                cells.append("n/a")
                continue
            sides = {
                "server": f"{method}-server",
                "client": client_region(example, method),
            }
            if example in DIFF_SHAPES:
                cells.append(
                    ", ".join(
                        "{} +{}/-{}".format(
                            side,
                            *(
                                diff_counts(region_code(example, region))
                                if region
                                else (0, 0)
                            ),
                        )
                        for side, region in sides.items()
                    )
                )
                continue
            counts = [
                added_lines(region_code(example, region)) if region else 0
                for region in sides.values()
            ]
            cells.append(f"{counts[0]} server + {counts[1]} client")
        rows.append(f"| `{method}` | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def render(text: str, methods: list[str]) -> str:
    """``text`` with every snippet block and the lines table regenerated."""
    text = render_snippets(text)
    return TABLE.sub(lambda m: m.group(1) + lines_table(methods) + m.group(2), text)


def methods_table() -> str:
    """The README's table of methods, from the table atop docs/methods.md.

    Its rows in its order: the method, its paper up to the colon (the
    authors and venue), the strategy, its ``strategy =`` names, and its
    section's link.
    """
    rows = [
        "| method | paper | strategy | `strategy =` in the run config | section |",
        "|---|---|---|---|---|",
    ]
    for method, paper, strategy, names, _benchmark, section in methods_doc_rows():
        link = section.replace("](#", "](docs/methods.md#")
        authors = paper.split(":", 1)[0]
        rows.append(f"| {method} | {authors} | {strategy} | {names} | {link} |")
    # The blank line ends the table before the end marker.
    return "\n".join(rows) + "\n\n"


def methods_doc_rows() -> list[list[str]]:
    """The cells of the rows of the table atop docs/methods.md."""
    text = METHODS_DOC.read_text().split("\n| method |", 1)[1].split("\n\n", 1)[0]
    lines = [line for line in text.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[1:]]


def method_rows() -> dict[str, tuple[str, list[str]]]:
    """Each cross-method table's header and rows, from docs/methods.md.

    The rows of every ``<!-- rows: <table> -->`` table of the page, in page
    order, under the header (first two lines) they all share.
    """
    tables: dict[str, tuple[str, list[str]]] = {}
    for match in ROWS_MARKER.finditer(METHODS_DOC.read_text()):
        lines = match["body"].splitlines(keepends=True)
        header, rows = "".join(lines[:2]), lines[2:]
        known_header, known_rows = tables.setdefault(match["table"], (header, []))
        if header != known_header:
            raise ValueError(
                f"docs/methods.md: a '{match['table']}' table's header differs "
                f"from its first one:\n{header}"
            )
        known_rows.extend(rows)
    return tables


def render_tables(text: str) -> str:
    """``text`` with every ``<!-- table: <name> -->`` table regenerated.

    Its header stays; its rows are the methods' rows of that table in
    docs/methods.md (:func:`method_rows`), whose header must be the same.
    """
    tables = method_rows()

    def table(match: re.Match[str]) -> str:
        name = match["table"]
        header = "".join(match["body"].splitlines(keepends=True)[:2])
        if name not in tables:
            raise ValueError(f"docs/methods.md has no '<!-- rows: {name} -->' table")
        if tables[name][0] != header:
            raise ValueError(f"the '{name}' table's header differs in docs/methods.md")
        return f"<!-- table: {name} -->\n{header}{''.join(tables[name][1])}"

    return TABLE_MARKER.sub(table, text)


def render_snippets(text: str) -> str:
    """``text`` with the block under every snippet marker regenerated."""

    def snippet(match: re.Match[str]) -> str:
        code = region_code(match["example"], match["region"])
        marker = match.group(0).split("\n", 1)[0]
        language = "diff" if match["example"] in DIFF_SHAPES else "python"
        return f"{marker}\n```{language}\n{code}```\n"

    return SNIPPET_MARKER.sub(snippet, text)


def render_readme(text: str) -> str:
    """``text`` (the README) with its snippets and table of methods regenerated."""
    if not METHODS_TABLE.search(text):
        raise ValueError("the README has no <!-- methods-table:start --> marker")
    table = methods_table()
    text = render_snippets(text)
    return METHODS_TABLE.sub(lambda m: m.group(1) + table + m.group(2), text)


def table_methods() -> list[str]:
    """The lines table's rows, one per method.

    The registry's methods in its order, then the other methods the examples
    mark (AOCS, a variant of OCS).
    """
    sys.path.insert(0, str(ROOT))
    from flwr_importance.registry import methods

    names = [spec.name for spec in methods()]
    marked = {
        name.rsplit("-", 1)[0]
        for example in SHAPES
        for name in example_regions(example)
        if not name.endswith(QUERY_REGION_SUFFIX)
    }
    return names + sorted(marked - set(names))


def main(argv: list[str] | None = None) -> int:
    """Rewrite the docs' generated parts, or ``--check`` whether they are stale."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--check", action="store_true", help="only check, exit 1 if stale"
    )
    args = parser.parse_args(argv)
    pages = {
        METHODS_DOC: lambda text: render(text, table_methods()),
        README: render_readme,
    }
    for page in sorted(DOCS.glob("*.md")):
        if TABLE_MARKER.search(page.read_text()):
            pages[page] = render_tables
    stale = []
    for page, rendered_from in pages.items():
        text = page.read_text()
        rendered = rendered_from(text)
        if rendered == text:
            continue
        stale.append(page.relative_to(ROOT).as_posix())
        if not args.check:
            page.write_text(rendered)
    if args.check and stale:
        print(f"{', '.join(stale)} stale: run python scripts/docs_snippets.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
