"""Every public class and function documents exactly the parameters it takes.

The numpydoc ``Parameters`` and ``Other Parameters`` sections of each public
name (the ``__all__`` of every package and of every client-helper module) list
the signature's parameters, no more and no fewer: a docstring that names a
parameter the code lacks, or leaves out one it has, fails here. A class is
read through its ``__init__``: every public class whose constructor (its own,
not a dataclass's) takes parameters documents them. A function may go
without a ``Parameters`` section (a one-line helper); one that has it lists
them all. A legacy-API class inherits the adapter's constructor (``legacy``,
``**options``); every keyword its ``**options`` entry names must be one its
Message-API strategy or Flower's legacy ``FedAvg`` takes.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import re
import sys
import typing
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import flwr_importance
from tests.docstrings import entries, sections

#: numpydoc sections that list parameters.
PARAMETER_SECTIONS = ("Parameters", "Other Parameters")
#: A ``**options: Unpack[SomeTypedDict]`` annotation.
UNPACKED = re.compile(r"Unpack\[(\w+)\]")


def public_names() -> Iterator[tuple[str, Any]]:
    """``(dotted name, object)`` of every name in a module's ``__all__``."""
    seen: set[int] = set()
    for module_info in pkgutil.walk_packages(
        flwr_importance.__path__, "flwr_importance."
    ):
        module = importlib.import_module(module_info.name)
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            if id(obj) in seen or not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            if not getattr(obj, "__module__", "").startswith("flwr_importance"):
                continue
            seen.add(id(obj))
            yield f"{obj.__module__}.{obj.__qualname__}", obj


def documented(docstring: str | None) -> list[str] | None:
    """The names the parameter sections list; None without such a section."""
    lines = inspect.cleandoc(docstring or "").splitlines()
    found = [body for name, body in sections(lines) if name in PARAMETER_SECTIONS]
    if not found:
        return None
    names: list[str] = []
    for body in found:
        for entry in entries(body):
            # "name : type", "a, b : type" or "**options": the names before ":".
            before_type = entry.partition(":")[0]
            names += [name.strip().lstrip("*") for name in before_type.split(",")]
    return names


def signature_names(target: Callable[..., Any]) -> list[str]:
    """The parameters a caller passes (no ``self``)."""
    parameters = inspect.signature(target).parameters
    return [name for name in parameters if name not in ("self", "cls")]


def unpacked_keys(target: Callable[..., Any]) -> list[str]:
    """The keys of a ``**options: Unpack[SomeTypedDict]`` parameter, if any.

    A docstring may list them (numpydoc's ``Other Parameters``) beside
    ``**options`` instead of linking to where they are documented.
    """
    for parameter in inspect.signature(target).parameters.values():
        unpacked = UNPACKED.fullmatch(str(parameter.annotation))
        if parameter.kind is parameter.VAR_KEYWORD and unpacked:
            # The annotation is a string (postponed evaluation): the TypedDict
            # is a name of the function's module, unless imported for type
            # checking only (then its keys are documented where it is).
            options = vars(sys.modules[target.__module__]).get(unpacked.group(1))
            return list(typing.get_type_hints(options)) if options else []
    return []


def own_constructor(cls: type) -> bool:
    """Whether ``cls`` defines ``__init__`` in this library, not a dataclass's."""
    init = cls.__dict__.get("__init__")
    return (
        init is not None
        and not dataclasses.is_dataclass(cls)
        and getattr(init, "__module__", "").startswith("flwr_importance")
    )


CASES = sorted(public_names())


@pytest.mark.parametrize(("name", "obj"), CASES, ids=[name for name, _ in CASES])
def test_docstring_lists_the_signatures_parameters(name: str, obj: Any) -> None:
    if inspect.isclass(obj):
        if not own_constructor(obj):
            return
        target = obj.__init__
    else:
        target = obj
    expected = signature_names(target)
    listed = documented(obj.__doc__)
    if listed is None:
        assert not (expected and inspect.isclass(obj)), (
            f"{name} takes {expected} but has no Parameters section"
        )
        return
    if set(listed) - set(expected):
        expected += unpacked_keys(target)
    assert sorted(listed) == sorted(expected), (
        f"{name}: documented only {sorted(set(listed) - set(expected))}, "
        f"undocumented {sorted(set(expected) - set(listed))}"
    )


def legacy_classes() -> list[type]:
    """The legacy-API classes: every registry method's, and ``compat``'s own."""
    from flwr.server.strategy import Strategy as LegacyStrategy

    from flwr_importance import compat
    from flwr_importance.registry import methods

    found = {compat.legacy_class(spec.name) for spec in methods() if spec.legacy_api}
    for name in compat.__all__:
        value = vars(compat).get(name)
        if isinstance(value, type) and issubclass(value, LegacyStrategy):
            found.add(value)
    return sorted(found, key=lambda cls: cls.__name__)


def accepted_keywords(cls: type) -> set[str]:
    """What a legacy class's ``**options`` take: its method's and legacy ones."""
    from flwr_importance.compat import LegacyOptions
    from flwr_importance.strategies.base import StrategyOptions

    strategy = getattr(cls, "message_strategy_class", None)
    own = set(signature_names(strategy.__init__)) if strategy is not None else set()
    return (
        own
        | set(StrategyOptions.__annotations__)
        | {field.name for field in dataclasses.fields(LegacyOptions)}
    )


@pytest.mark.parametrize("cls", legacy_classes(), ids=lambda cls: cls.__name__)
def test_a_legacy_class_names_only_keywords_its_options_take(cls: type) -> None:
    # A legacy class inherits the adapter's constructor (``legacy``,
    # ``**options``), which the test above reads; the keywords its
    # ``**options`` description names must be ones the method takes.
    lines = inspect.cleandoc(cls.__doc__ or "").splitlines()
    bodies = [body for name, body in sections(lines) if name == "Other Parameters"]
    # Every double-backquoted word, but class names (``FedAvg``).
    named = {
        literal
        for body in bodies
        for literal in re.findall(r"``(\w+)``", "\n".join(body))
        if not re.fullmatch(r"[A-Z][a-z]\w*", literal)
    }
    unknown = sorted(named - accepted_keywords(cls))
    assert not unknown, f"{cls.__name__}'s **options names {unknown}, not taken"


def test_the_legacy_check_catches_a_parameter_that_does_not_exist() -> None:
    class Drifted(legacy_classes()[0]):  # type: ignore[misc,valid-type]
        """Drifted.

        Other Parameters
        ----------------
        **options
            ``clients_per_round`` and ``m``.
        """

    with pytest.raises(AssertionError, match=r"\['m'\]"):
        test_a_legacy_class_names_only_keywords_its_options_take(Drifted)
