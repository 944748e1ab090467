"""The library's methods, each declared once, next to its strategy.

Every strategy module of :mod:`flwr_importance.strategies` that holds a
method ends with a module-level ``METHOD = MethodSpec(...)``
(:mod:`flwr_importance.method_spec`): its strategy class, its legacy-API
class, its ready-made client side.
:func:`methods` collects them; the simulation app, the legacy API, the
examples, the tests and the benchmarks iterate over it, so a new method takes
part in all of them by declaring itself (the tests and benchmarks also read
the ``TOOLING`` of its app module, ``simulations/methods/<name>.py``, a
:class:`~flwr_importance.tooling.declarations.MethodTooling`).
``tests/test_registry.py`` fails when a strategy module, an app method, a
preset, a legacy class, a tooling declaration or a benchmark exists that no
declaration accounts for.

The strategies import :class:`MethodSpec` from its own module, never this
one, so the two packages do not import each other. This module is
torch-free: importing it loads the strategies (Flower, NumPy), nothing of the
client side. Client-side and legacy parts are named by ``"module:attribute"``
and loaded on use (:func:`load_attribute`).
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from typing import Any

from flwr_importance import strategies
from flwr_importance.method_spec import MethodSpec, RunConfigValue

__all__ = [
    "DECLARATION",
    "MethodSpec",
    "RunConfigValue",
    "load_attribute",
    "method",
    "methods",
]

#: The attribute a strategy module declares its method under.
DECLARATION = "METHOD"


@functools.cache
def methods() -> tuple[MethodSpec, ...]:
    """Every declared method, sorted by name.

    Examples
    --------
    >>> "md" in [spec.name for spec in methods()]
    True
    """
    declared = []
    for module_info in pkgutil.iter_modules(strategies.__path__):
        module = importlib.import_module(f"{strategies.__name__}.{module_info.name}")
        spec = getattr(module, DECLARATION, None)
        if spec is not None:
            declared.append(spec)
    specs = tuple(sorted(declared, key=lambda spec: spec.name))
    _check_unique(specs)
    return specs


def _check_unique(specs: tuple[MethodSpec, ...]) -> None:
    """Raise if two declarations share a name."""
    names = [spec.name for spec in specs]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise RuntimeError(f"methods declared twice: {', '.join(repeated)}")


def method(name: str) -> MethodSpec:
    """The method named ``name``.

    Raises
    ------
    KeyError
        No method has that name; the message lists the known ones.

    Examples
    --------
    >>> method("md").strategy.__name__
    'MDSampling'
    """
    for spec in methods():
        if spec.name == name:
            return spec
    known = ", ".join(spec.name for spec in methods())
    raise KeyError(f"unknown method {name!r}; known: {known}")


def load_attribute(path: str) -> Any:
    """The object a ``"module:attribute"`` path names, importing its module.

    Examples
    --------
    >>> load_attribute("flwr_importance.protocol:NUM_EXAMPLES")
    'num-examples'
    """
    module_name, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module_name), attribute)
