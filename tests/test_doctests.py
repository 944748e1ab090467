"""Every docstring example of the package runs, and the maths documents itself.

One case per module of ``flwr_importance``, found on disk (so a module that no
longer imports fails its own case, not the collection): the module is imported
and each of its docstrings' ``>>>`` examples is run as a doctest.
"""

from __future__ import annotations

import doctest
import importlib
import inspect
from pathlib import Path
from types import ModuleType

import pytest

import flwr_importance
from flwr_importance import aggregation, sampling
from flwr_importance.aggregation import fedsampling, folb, isfedavg, variance_reduced

PACKAGE_DIR = Path(flwr_importance.__file__).parent


def module_names() -> list[str]:
    """The dotted names of every module under ``flwr_importance``, sorted."""
    names = []
    for path in PACKAGE_DIR.rglob("*.py"):
        parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.append(".".join(parts))
    return sorted(names)


def run_doctests(module: ModuleType) -> tuple[int, int, str]:
    """``(failures, examples tried, report)`` of the module's doctests."""
    runner = doctest.DocTestRunner()
    report: list[str] = []
    for test in doctest.DocTestFinder().find(module):
        runner.run(test, out=report.append)
    return runner.failures, runner.tries, "".join(report)


@pytest.mark.parametrize("name", module_names())
def test_module_doctests_pass(name: str) -> None:
    failures, _, report = run_doctests(importlib.import_module(name))
    assert failures == 0, report


def test_a_broken_example_fails() -> None:
    module = ModuleType("broken")
    module.__doc__ = ">>> 1 + 1\n3\n"
    failures, tried, report = run_doctests(module)
    assert (failures, tried) == (1, 1)
    assert "Expected:\n    3\nGot:\n    2" in report


def test_public_maths_functions_have_examples() -> None:
    functions = [getattr(sampling, name) for name in sampling.__all__]
    for module in (aggregation, fedsampling, folb, isfedavg, variance_reduced):
        functions += [
            function
            for name, function in inspect.getmembers(module, inspect.isfunction)
            if function.__module__ == module.__name__
            and not name.startswith("_")
            and name != "check_options"  # input validation, not maths
        ]
    functions = [function for function in functions if inspect.isfunction(function)]
    assert len(functions) > 30
    missing = [
        f"{function.__module__}.{function.__name__}"
        for function in functions
        if ">>>" not in (function.__doc__ or "")
    ]
    assert not missing, f"public maths functions without Examples: {missing}"
