"""The maths documents itself: every public maths function has an example.

pytest runs the examples themselves (``--doctest-modules`` over
``flwr_importance``, set in ``pyproject.toml``).
"""

from __future__ import annotations

import inspect

import pytest

from flwr_importance import aggregation, sampling
from flwr_importance.aggregation import fedsampling, folb, isfedavg, variance_reduced


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


def test_the_package_examples_run_as_doctests(pytestconfig: pytest.Config) -> None:
    """The settings that make pytest run every example of the package."""
    assert pytestconfig.getoption("doctestmodules")
    assert "flwr_importance" in pytestconfig.getini("testpaths")
