"""Every library method's tooling declaration, read from its app module.

A method's app module, ``simulations/methods/<name>.py``, declares how the
tests and benchmarks run the method as ``TOOLING = MethodTooling(...)``
(:mod:`flwr_importance.tooling.declarations` defines the classes): its canned
replies, its headline and smoke presets, its equal-work overrides and its
benchmark. This module collects them; ``flwr_importance`` never imports
``simulations``, so the lookups that need every method live here.
``tests/test_registry.py`` fails when a registry method has no ``TOOLING``,
or a ``TOOLING`` belongs to no registry method.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from flwr_importance.method_spec import MethodSpec
from flwr_importance.registry import methods
from flwr_importance.tooling.declarations import CannedVariant, MethodTooling
from simulations.methods import load_method, method_modules

#: The module-level name of a method module's tooling declaration.
TOOLING = "TOOLING"


@functools.cache
def declarations() -> Mapping[str, MethodTooling]:
    """Every method module's ``TOOLING``, by the module's ``strategy`` name.

    Raises
    ------
    TypeError
        A module's ``TOOLING`` is not a :class:`MethodTooling`.
    """
    found: dict[str, MethodTooling] = {}
    for name in method_modules():
        tooling = getattr(load_method(name), TOOLING, None)
        if tooling is None:
            continue
        if not isinstance(tooling, MethodTooling):
            raise TypeError(f"{name}'s {TOOLING} is no MethodTooling: {tooling!r}")
        found[name] = tooling
    return found


def declaration(name: str) -> MethodTooling:
    """How the tests and benchmarks run the registry method ``name``.

    Raises
    ------
    KeyError
        ``name``'s method module has no ``TOOLING``; the message says where to
        add it.
    """
    found = declarations()
    if name not in found:
        module = name.replace("-", "_")
        raise KeyError(
            f"method {name!r} has no {TOOLING} in simulations/methods/{module}.py: "
            "declare its canned replies, presets and benchmark there"
        )
    return found[name]


def canned(spec: MethodSpec) -> tuple[CannedVariant, ...]:
    """The method's canned variants, an unnamed one under the method's names."""
    return declaration(spec.name).variants(spec)


def canned_variants() -> dict[str, tuple[MethodSpec, CannedVariant]]:
    """Every canned variant of every registry method, by variant name.

    Raises
    ------
    RuntimeError
        Two variants share a name.
    """
    variants = [(spec, variant) for spec in methods() for variant in canned(spec)]
    names = [variant.name for _, variant in variants]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise RuntimeError(f"canned variants declared twice: {', '.join(repeated)}")
    return {variant.name: (spec, variant) for spec, variant in variants}
