"""docs/methods.md is the catalogue of methods: every registry method is in it,
and its "Use it" snippets run as written (both APIs).

The README's method table (one row per declaration of
``flwr_importance/registry.py``) links each method's section here, and every
relative link of the README, of ``CONTRIBUTING.md`` and of the ``docs/`` pages
resolves, #anchors included (GitHub's anchor rules).
"""

from __future__ import annotations

import functools
import importlib
import itertools
import re
from pathlib import Path

import pytest
from flwr.clientapp import ClientApp
from flwr.server.strategy import FedAvg as LegacyFedAvg
from flwr.serverapp.strategy import FedAvg

from flwr_importance.compat import LegacyStrategyAdapter
from flwr_importance.registry import MethodSpec, methods
from simulations.methods import app_names
from simulations.tooling import declaration

ROOT = Path(__file__).resolve().parents[2]
METHODS_DOC = ROOT / "docs" / "methods.md"
README = ROOT / "README.md"
TEXT = METHODS_DOC.read_text()

PYTHON_BLOCK = re.compile(r"```python\n(.*?)```", re.S)
#: Blocks under a ``<!-- snippet: ... -->`` line quote the examples' own
#: lines, parts of programs the examples' tests run
#: (tests/docs/test_snippets.py keeps them equal).
QUOTED_BLOCK = re.compile(r"^<!-- snippet: [^\n]*-->\n```python\n.*?```\n", re.M | re.S)
BLOCKS = PYTHON_BLOCK.findall(QUOTED_BLOCK.sub("", TEXT))
MESSAGE, LEGACY = "# Message API", "# Legacy API"
SNIPPETS = [code for code in BLOCKS if code.startswith((MESSAGE, LEGACY))]
#: Other blocks are fragments of a larger program (e.g. a ``main`` body).
FRAGMENTS = [code for code in BLOCKS if code not in SNIPPETS]

#: The method sections: ``## <n>. <title>`` up to the next ``## `` heading.
SECTION = re.compile(r"^## (\d+\..*)$", re.M)


def anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def sections() -> dict[str, str]:
    """Each method section's text, by its heading's anchor."""
    starts = list(SECTION.finditer(TEXT))
    ends = [match.start() for match in starts[1:]] + [len(TEXT)]
    return {
        anchor(match.group(1)): TEXT[match.start() : end]
        for match, end in zip(starts, ends, strict=True)
    }


def table_rows() -> list[list[str]]:
    """The cells of the opening table's rows (the page's first table)."""
    first = SECTION.search(TEXT)
    assert first is not None, "docs/methods.md has no '## <n>. <method>' section"
    lines = TEXT[: first.start()].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = itertools.takewhile(lambda line: line.startswith("|"), lines[start:])
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows][2:]


def run_snippet(code: str) -> dict[str, object]:
    """The namespace a snippet leaves behind, run as written.

    ``my_task`` (``Context -> LocalTask``) and ``my_model_task``
    (``(Context, int) -> LocalTask``) are the user's task factories; building
    the handlers must not call them (they run per message, on the node).
    """
    namespace: dict[str, object] = {
        "ClientApp": ClientApp,
        "my_task": print,
        "my_model_task": print,
    }
    exec(code, namespace)
    return namespace


def snippet_id(code: str) -> str:
    """A test id: the snippet's API and the class of its ``strategy``."""
    built = re.search(r"^strategy = (?:compat\.)?(\w+)\(", code, re.M)
    return f"{code.split(':')[0][2:]}-{built.group(1) if built else 'strategy'}"


@pytest.mark.parametrize("code", SNIPPETS, ids=[snippet_id(c) for c in SNIPPETS])
def test_snippet_builds_a_strategy_and_a_client_app(code: str) -> None:
    namespace = run_snippet(code)
    expected = FedAvg if code.startswith(MESSAGE) else LegacyFedAvg
    assert isinstance(namespace["strategy"], expected)
    assert isinstance(namespace["app"], ClientApp)


@pytest.mark.parametrize("code", FRAGMENTS)
def test_fragment_compiles(code: str) -> None:
    compile(code, str(METHODS_DOC), "exec")


@functools.cache
def built_strategies(api: str) -> list[object]:
    """The Message-API strategies the snippets of ``api`` build.

    A legacy strategy counts as the Message-API strategy it runs inside.
    """
    built = []
    for code in SNIPPETS:
        if code.startswith(api):
            for value in run_snippet(code).values():
                if isinstance(value, LegacyStrategyAdapter):
                    built.append(value.strategy)
                elif isinstance(value, FedAvg):
                    built.append(value)
    return built


@pytest.mark.parametrize("spec", methods(), ids=lambda spec: spec.name)
def test_every_method_has_a_message_api_snippet(spec: MethodSpec) -> None:
    assert any(type(s) is spec.strategy for s in built_strategies(MESSAGE)), (
        f"no '{MESSAGE}' snippet of docs/methods.md builds {spec.strategy.__name__}"
    )


@pytest.mark.parametrize(
    "spec", [spec for spec in methods() if spec.legacy_api], ids=lambda s: s.name
)
def test_every_legacy_method_has_a_legacy_api_snippet(spec: MethodSpec) -> None:
    assert any(type(s) is spec.strategy for s in built_strategies(LEGACY)), (
        f"no '{LEGACY}' snippet of docs/methods.md builds "
        f"compat.{spec.strategy.__name__}"
    )


@pytest.mark.parametrize("spec", methods(), ids=lambda spec: spec.name)
def test_every_method_has_a_row_and_a_section(spec: MethodSpec) -> None:
    name = spec.strategy.__name__
    rows = [row for row in table_rows() if f"`{name}`" in row[2]]
    assert len(rows) == 1, f"docs/methods.md's table has no single row for {name}"
    (row,) = rows
    assert re.findall(r"`([\w-]+)`", row[3]) == list(app_names(spec.name))
    benchmark = declaration(spec.name).benchmark
    if benchmark:
        assert row[4] == f"`{benchmark}`"
    links = re.findall(r"\]\(#([\w-]+)\)", row[-1])
    assert len(links) == 1, row[-1]
    section = sections().get(links[0])
    assert section is not None, f"{name}'s row links to no section: #{links[0]}"
    assert name in section
    assert "### Use it" in section


def test_every_row_is_a_method() -> None:
    declared = {spec.strategy.__name__ for spec in methods()}
    listed = {re.findall(r"`(\w+)`", row[2])[0] for row in table_rows()}
    assert listed == declared


def test_readme_links_the_catalogue() -> None:
    readme = README.read_text()
    assert "(docs/methods.md)" in readme
    # The snippets live in docs/methods.md only.
    assert not re.search(rf"```python\n(?:{MESSAGE}|{LEGACY})", readme)


#: The pages whose relative links must resolve: the README, every docs page
#: and the contributor guide.
LINKED_PAGES = [README, ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCED = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$", re.M)
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def prose(text: str) -> str:
    """``text`` without fenced code blocks (their ``#`` lines are no headings)."""
    return FENCED.sub("", text)


@functools.cache
def anchors(path: Path) -> frozenset[str]:
    """Every anchor GitHub gives ``path``: its headings' and its HTML anchors.

    A heading's link text counts, not its target; a repeated heading's anchor
    gets ``-1``, ``-2``, ... as on GitHub.
    """
    text = prose(path.read_text())
    found, seen = set(HTML_ANCHOR.findall(text)), dict[str, int]()
    for match in HEADING.finditer(text):
        base = anchor(re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", match.group(1)))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(f"{base}-{count}" if count else base)
    return frozenset(found)


def relative_links(path: Path) -> list[str]:
    """The links of ``path`` to files of the repository, outside any code."""
    text = INLINE_CODE.sub("", prose(path.read_text()))
    return [
        target
        for target in LINK.findall(text)
        if not re.match(r"[a-z][a-z+.-]*:", target)  # https:, mailto: ...
    ]


def test_the_anchor_rules_are_githubs() -> None:
    assert anchor("5. Optimal client sampling (OCS, AOCS)") == (
        "5-optimal-client-sampling-ocs-aocs"
    )
    assert anchor("The mechanism: each sampler's error") == (
        "the-mechanism-each-samplers-error"
    )
    assert anchor("`make run` and the launcher") == "make-run-and-the-launcher"


@pytest.mark.parametrize("page", LINKED_PAGES, ids=lambda p: p.name)
def test_relative_links_and_anchors_resolve(page: Path) -> None:
    for target in relative_links(page):
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name} links to a missing {target}"
        if fragment and linked.suffix == ".md":
            assert fragment in anchors(linked), (
                f"{page.name} links to {target}: no such heading in {linked.name}"
            )


def test_every_docs_page_is_one_click_from_the_readme() -> None:
    linked = {
        (ROOT / target.partition("#")[0]).resolve() for target in relative_links(README)
    }
    unlinked = [
        page.name for page in sorted((ROOT / "docs").glob("*.md")) if page not in linked
    ]
    assert unlinked == [], f"the README links no {unlinked}"


def readme_table_rows() -> list[list[str]]:
    """The cells of the rows of the README's method table (under ``## Methods``)."""
    text = README.read_text().split("\n## Methods\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in text.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows][2:]


@pytest.mark.parametrize("spec", methods(), ids=lambda spec: spec.name)
def test_the_readme_table_has_every_method(spec: MethodSpec) -> None:
    name = spec.strategy.__name__
    rows = [row for row in readme_table_rows() if f"`{name}`" in row[2]]
    assert len(rows) == 1, f"the README's method table has no single row for {name}"
    (row,) = rows
    assert re.findall(r"`([\w-]+)`", row[3]) == list(app_names(spec.name))
    links = re.findall(r"\]\(docs/methods\.md#([\w-]+)\)", row[-1])
    assert len(links) == 1, row[-1]
    assert name in sections().get(links[0], ""), f"{name}'s row: #{links[0]}"


def test_every_readme_row_is_a_method() -> None:
    declared = {spec.strategy.__name__ for spec in methods()}
    listed = {re.findall(r"`(\w+)`", row[2])[0] for row in readme_table_rows()}
    assert listed == declared


def test_the_readme_snippet_imports_what_exists() -> None:
    code = "\n".join(re.findall(r"^```\w*\n(.*?)^```", README.read_text(), re.M | re.S))
    imports = re.findall(r"^[+ ]?from (flwr_importance[\w.]*) import (.+)$", code, re.M)
    assert imports, "the README's snippet imports nothing from flwr_importance"
    for module, names in imports:
        for name in names.split(","):
            assert hasattr(importlib.import_module(module), name.strip()), (
                f"the README imports {name.strip()} from {module}, which has none"
            )


@pytest.mark.parametrize(
    "page", [page for page in LINKED_PAGES if page != METHODS_DOC], ids=lambda p: p.name
)
def test_python_blocks_of_the_other_pages_compile(page: Path) -> None:
    for code in PYTHON_BLOCK.findall(page.read_text()):
        compile(code, str(page), "exec")
