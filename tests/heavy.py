"""One heavy run at a time across the pytest-xdist workers.

A deployment of SuperLink and SuperNodes, a two-node Ray cluster and 1,000
virtual SuperNodes each start many processes at once; on two cores, two of
them side by side took 300-320 s each and starved Ray's start-up in the tests
beside them. The example apps' runs of every method in one ``flwr run`` load
Ray for minutes: beside the deployment its SuperLink's database locked and
the run failed, so they take turns too. Their tests hold
:func:`heavy_run_slot` while they run (the ``heavy_run`` fixture of
``tests/conftest.py``).
(``--dist loadgroup`` would do it, but with pytest 9.2 xdist's groups no
longer take effect: pytest-dev/pytest-xdist#1386.)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from filelock import FileLock


def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of this test session that every xdist worker sees."""
    base = tmp_path_factory.getbasetemp()
    # Under xdist each worker's base is popen-gwN inside the session's folder.
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextmanager
def heavy_run_slot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Hold the session-wide lock of the heavy runs while the block runs."""
    with FileLock(shared_dir(tmp_path_factory) / "heavy-run.lock"):
        yield
