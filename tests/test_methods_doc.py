"""docs/methods.md is the catalogue of methods: every registry method is in it,
and its "Use it" snippets run as written (both APIs).

The README points there instead of listing the methods, so a new method's
declaration (``flwr_importance/registry.py``) is checked against this page
alone.
"""

from __future__ import annotations

import functools
import itertools
import re
from pathlib import Path

import pytest
from flwr.clientapp import ClientApp
from flwr.server.strategy import FedAvg as LegacyFedAvg
from flwr.serverapp.strategy import FedAvg

from flwr_importance.compat import LegacyStrategyAdapter
from flwr_importance.registry import MethodSpec, methods

ROOT = Path(__file__).resolve().parent.parent
METHODS_DOC = ROOT / "docs" / "methods.md"
README = ROOT / "README.md"
TEXT = METHODS_DOC.read_text()

PYTHON_BLOCK = re.compile(r"```python\n(.*?)```", re.S)
#: Blocks under a ``<!-- snippet: ... -->`` line quote the examples' own
#: lines, parts of programs the examples' tests run
#: (tests/test_docs_snippets.py keeps them equal).
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
    assert re.findall(r"`([\w-]+)`", row[3]) == list(spec.app_names)
    if spec.benchmark:
        assert row[4] == f"`{spec.benchmark}`"
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


def test_readme_links_the_catalogue_and_its_links_resolve() -> None:
    readme = README.read_text()
    assert "(docs/methods.md)" in readme
    # The snippets live in docs/methods.md only.
    assert not re.search(rf"```python\n(?:{MESSAGE}|{LEGACY})", readme)
    for target in re.findall(r"\]\((?!https?://|#)([^)#]+)", readme):
        assert (ROOT / target).exists(), f"README links to a missing {target}"
