"""Every public name of the legacy API is visible without importing it.

IDEs and type checkers read ``flwr_importance/compat/__init__.py`` without
running it: a class that only a module ``__getattr__`` returns is invisible
to them. Each legacy class (hand-written or generated) must be imported or
assigned at the module's top level.
"""

from __future__ import annotations

import ast
from pathlib import Path

from flwr_importance import compat
from flwr_importance.compat import legacy_class
from flwr_importance.registry import methods

COMPAT_INIT = Path(compat.__file__)


def statically_bound_names(source: str) -> set[str]:
    """The names a module's top-level imports and assignments bind."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.ImportFrom | ast.Import):
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Assign):
            names.update(
                target.id for target in node.targets if isinstance(target, ast.Name)
            )
    return names


def test_every_legacy_class_is_bound_at_the_top_level() -> None:
    bound = statically_bound_names(COMPAT_INIT.read_text(encoding="utf-8"))
    legacy_names = {
        legacy_class(spec.name).__name__ for spec in methods() if spec.legacy_api
    }
    assert legacy_names - bound == set()
    assert legacy_names <= set(compat.__all__)


def test_each_bound_legacy_class_is_the_registry_class() -> None:
    for spec in methods():
        if spec.legacy_api:
            cls = legacy_class(spec.name)
            assert vars(compat)[cls.__name__] is cls
