"""The server side imports no ML framework, data or plotting library.

A TensorFlow, JAX or scikit-learn Flower project must be able to run the
library's strategies (both APIs) without torch installed; and each import
statement that loads torch costs seconds in every ServerApp process.
"""

from __future__ import annotations

import json
import subprocess
import sys

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
