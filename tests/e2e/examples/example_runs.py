"""``flwr run`` of an example app, checked: it succeeds, logs no error, leaves nothing.

The example apps run several methods one after another in one ``flwr run``
(their run config's ``strategy``, comma-separated): one Ray start-up serves
every method, and each test checks its app's history files and log lines.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from flwr_importance.tooling.launcher import flwr_run, processes_mentioning

#: Ray prints a line repeated by several actors once, with a count, unless
#: told not to: the tests count the examples' own log lines per node.
UNDEDUPLICATED_LOGS = {"RAY_DEDUP_LOGS": "0"}


def checked_run(
    app_dir: Path,
    *,
    num_supernodes: int,
    run_config: Mapping[str, object],
    flwr_home: Path,
    extra_env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``flwr run`` of an example, which must succeed, log no error, leave nothing.

    Nothing may be left running even when the run failed: the check comes
    before the outcome's.
    """
    completed = flwr_run(
        app_dir,
        num_supernodes=num_supernodes,
        run_config=dict(run_config),
        flwr_home=flwr_home,
        capture=True,
        timeout=600,
        federation_config={"client-resources-num-cpus": 1},
        extra_env=extra_env,
    )
    assert processes_mentioning(str(flwr_home.resolve())) == []
    log = completed.stdout[-4000:] + completed.stderr[-4000:]
    assert completed.returncode == 0, log
    assert "ERROR" not in completed.stdout + completed.stderr, log
    return completed


def run_methods(
    app_dir: Path,
    tmp_path: Path,
    *,
    methods: Sequence[str],
    num_supernodes: int,
    run_config: Mapping[str, object],
) -> tuple[str, Path]:
    """One checked ``flwr run`` of ``methods`` in turn: its output and output folder.

    Every ClientApp log line is kept (:data:`UNDEDUPLICATED_LOGS`); the app
    writes its per-method results under the returned folder.
    """
    output_dir = tmp_path / "out"
    completed = checked_run(
        app_dir,
        num_supernodes=num_supernodes,
        run_config={
            **run_config,
            "strategy": ",".join(methods),
            "output-dir": str(output_dir),
        },
        flwr_home=tmp_path / "flwr-home",
        extra_env=UNDEDUPLICATED_LOGS,
    )
    return completed.stdout + completed.stderr, output_dir
