"""The package's shape: a core apart from the tooling, no cycle.

What a user imports into a Flower app (strategies, protocol, maths, client
helpers, the legacy API) is the core of ``flwr_importance``; the launcher, the
comparison of runs and the test doubles are the tooling, in
``flwr_importance.tooling``, which the core never imports. The client side
(``flwr_importance.clientapps``) never imports the legacy API's server layer
(``flwr_importance.compat``): what both ends of the legacy transport share
sits below both, in ``flwr_importance.legacy_wire``. Every module is read from
disk and its imports parsed with :mod:`ast` (function-level and
``TYPE_CHECKING`` imports included); nothing is imported.
"""

from __future__ import annotations

import ast
import pkgutil
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = "flwr_importance"
PACKAGE_DIR = Path(__file__).resolve().parents[1] / PACKAGE
TOOLING = f"{PACKAGE}.tooling"
CLIENT_SIDE = f"{PACKAGE}.clientapps"
LEGACY_SERVER_SIDE = f"{PACKAGE}.compat"
LEGACY_WIRE = f"{PACKAGE}.legacy_wire"


def walk_modules(path: Path, prefix: str) -> Iterator[tuple[str, Path]]:
    """Every module under ``path`` (packages as their ``__init__``), by name.

    :func:`pkgutil.iter_modules` on each folder: unlike
    :func:`pkgutil.walk_packages`, it imports no package to find its children.
    """
    yield prefix, path / "__init__.py"
    for module in pkgutil.iter_modules([str(path)]):
        name = f"{prefix}.{module.name}"
        if module.ispkg:
            yield from walk_modules(path / module.name, name)
        else:
            yield name, path / f"{module.name}.py"


MODULES = dict(walk_modules(PACKAGE_DIR, PACKAGE))


def in_package(name: str, package: str) -> bool:
    """Whether module ``name`` is ``package`` or one of its modules."""
    return name == package or name.startswith(f"{package}.")


def is_tooling(name: str) -> bool:
    """Whether module ``name`` belongs to the tooling subpackage."""
    return in_package(name, TOOLING)


CORE = sorted(name for name in MODULES if not is_tooling(name))


def imported_modules(name: str) -> set[str]:
    """The package's modules that module ``name`` imports, anywhere in it.

    ``from a import b`` imports module ``a.b`` when there is one, else ``a``
    itself; relative imports are resolved against the module's package.
    """
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in MODULES else base)
    return {module for module in found if module in MODULES and module != name}


GRAPH = {name: imported_modules(name) for name in MODULES}


def test_the_walk_finds_the_core_and_the_tooling() -> None:
    assert f"{PACKAGE}.strategies.base" in CORE
    assert f"{PACKAGE}.protocol" in CORE
    assert f"{TOOLING}.launcher.cli" in MODULES
    assert f"{TOOLING}.testing.grid" in MODULES


def test_the_core_holds_no_launcher_comparison_or_test_double() -> None:
    tooling_names = ("launcher", "comparison", "testing", "canned", "fault_injection")
    misplaced = [
        name
        for name in CORE
        if any(part in tooling_names for part in name.split(".")[1:])
    ]
    assert misplaced == [], f"tooling modules outside {TOOLING}: {misplaced}"


@pytest.mark.parametrize("name", CORE)
def test_no_core_module_imports_the_tooling(name: str) -> None:
    tooling = sorted(module for module in GRAPH[name] if is_tooling(module))
    assert tooling == [], f"{name} imports the tooling: {tooling}"


@pytest.mark.parametrize(
    "name", sorted(name for name in MODULES if in_package(name, CLIENT_SIDE))
)
def test_no_client_module_imports_the_legacy_server_side(name: str) -> None:
    legacy = sorted(
        module for module in GRAPH[name] if in_package(module, LEGACY_SERVER_SIDE)
    )
    assert legacy == [], f"{name} imports the legacy server side: {legacy}"


def test_the_legacy_wire_format_imports_neither_end() -> None:
    ends = sorted(
        module
        for module in GRAPH[LEGACY_WIRE]
        if in_package(module, CLIENT_SIDE) or in_package(module, LEGACY_SERVER_SIDE)
    )
    assert ends == [], f"{LEGACY_WIRE} imports an end of the transport: {ends}"


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as ``[a, b, ..., a]``, or None if acyclic.

    Depth-first search; a module met again while on the current path closes a
    cycle.

    Examples
    --------
    >>> find_cycle({"a": {"b"}, "b": {"a"}})
    ['a', 'b', 'a']
    >>> find_cycle({"a": {"b"}, "b": set()}) is None
    True
    """
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(node: str) -> list[str] | None:
        path.append(node)
        on_path.add(node)
        for target in sorted(graph.get(node, ())):
            if target in on_path:
                return [*path[path.index(target) :], target]
            if target not in done:
                cycle = visit(target)
                if cycle is not None:
                    return cycle
        path.pop()
        on_path.discard(node)
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done:
            cycle = visit(start)
            if cycle is not None:
                return cycle
    return None


def test_the_cycle_finder_reports_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"b"}, "d": set()}
    assert find_cycle(graph) == ["b", "c", "b"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_package_has_no_import_cycle() -> None:
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_registry_and_strategies_do_not_import_each_other() -> None:
    strategies = {name for name in MODULES if name.startswith(f"{PACKAGE}.strategies")}
    assert any(module in strategies for module in GRAPH[f"{PACKAGE}.registry"])
    assert not any(f"{PACKAGE}.registry" in GRAPH[name] for name in strategies)
