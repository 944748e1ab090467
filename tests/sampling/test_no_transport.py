"""The sampling core is pure maths: importing it loads neither Flower nor torch."""

from __future__ import annotations

import subprocess
import sys


def test_sampling_core_imports_no_flower_and_no_torch() -> None:
    code = (
        "import sys, flwr_importance.sampling, flwr_importance.aggregation;"
        "print(sorted(m for m in ('flwr', 'torch') if m in sys.modules))"
    )
    output = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert output.stdout.strip() == "[]"
