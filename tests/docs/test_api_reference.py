"""The docs site and its API reference build without a warning.

``mkdocs build --strict`` (``mkdocs.yml``: the pages of ``docs/`` and, under
``docs/reference/``, mkdocstrings' pages of each public package, read from the
NumPy-style docstrings) fails on any warning: a docstring mkdocstrings cannot
parse, a page missing from the navigation, a broken anchor. The built
strategies page then holds every exported class and function.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from flwr_importance import strategies

ROOT = Path(__file__).resolve().parents[2]


def test_the_site_builds_strictly_with_every_strategy(tmp_path: Path) -> None:
    site = tmp_path / "site"
    completed = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", site],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    page = (site / "reference" / "strategies" / "index.html").read_text()
    for name in strategies.__all__:
        if callable(getattr(strategies, name)):
            assert f'id="flwr_importance.strategies.{name}"' in page, name
