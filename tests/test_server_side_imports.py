"""The server side imports no ML framework, data or plotting library.

A TensorFlow, JAX or scikit-learn Flower project must be able to run the
library's strategies (both APIs) without torch installed; and each import
statement that loads torch costs seconds in every ServerApp process.
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import flwr_importance

#: What must stay out of ``sys.modules`` after importing the server side.
FORBIDDEN = ("torch", "datasets", "flwr_datasets", "sklearn", "matplotlib", "ray")

PROBE = """
import json, sys
import flwr_importance.strategies
import flwr_importance.compat
from flwr_importance.compat import LegacyOptions, ISFedAvg
print(json.dumps(sorted(name for name in {forbidden!r} if name in sys.modules)))
"""


def loaded_in_fresh_interpreter(code: str) -> list[str]:
    """Run ``code`` in a new interpreter; the JSON list it prints last."""
    completed = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return list(json.loads(completed.stdout.splitlines()[-1]))


def test_server_side_loads_no_ml_framework() -> None:
    assert loaded_in_fresh_interpreter(PROBE.format(forbidden=FORBIDDEN)) == []


def test_probe_sees_a_framework_when_one_is_imported() -> None:
    """The probe itself works: torch imported by the client side is reported."""
    code = PROBE.replace(
        "import flwr_importance.compat\n",
        "import flwr_importance.compat\nflwr_importance.compat.handler_client_fn\n",
    ).format(forbidden=FORBIDDEN)
    assert "torch" in loaded_in_fresh_interpreter(code)


#: The library's server side: every module of these packages, and these modules.
SERVER_PACKAGES = ("strategies", "compat", "sampling", "aggregation")
SERVER_MODULES = ("protocol", "registry", "method_spec", "local_grid", "legacy_wire")


def server_side_modules() -> list[str]:
    """The dotted names of every module of the server side, found on disk."""
    names = [f"flwr_importance.{name}" for name in SERVER_MODULES]
    for package in SERVER_PACKAGES:
        path = [str(flwr_importance.__path__[0] + f"/{package}")]
        names.append(f"flwr_importance.{package}")
        names += [
            f"flwr_importance.{package}.{module.name}"
            for module in pkgutil.iter_modules(path)
        ]
    return sorted(names)


def test_every_server_side_module_loads_no_ml_framework() -> None:
    """Every module of the server side, the legacy API's included, imported.

    One interpreter imports them one after another and names each module
    after whose import a forbidden one appeared.
    """
    code = (
        "import importlib, json, sys\n"
        "culprits = {}\n"
        f"for module in {server_side_modules()!r}:\n"
        "    importlib.import_module(module)\n"
        f"    for name in {FORBIDDEN!r}:\n"
        "        if name in sys.modules:\n"
        "            culprits.setdefault(name, module)\n"
        "print(json.dumps(sorted(f'{n} by {m}' for n, m in culprits.items())))"
    )
    assert loaded_in_fresh_interpreter(code) == []
