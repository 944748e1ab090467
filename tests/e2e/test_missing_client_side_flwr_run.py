"""A run whose ServerApp fails makes the launcher fail, with the error's message.

``flwr run --stream`` exits with 0 when the ServerApp raises (Flower logs the
traceback and "Exit Code: 700"); :func:`flwr_importance.tooling.launcher.flwr_run`
reads the run's output and returns :data:`FAILED_RUN_RETURNCODE`, and the
command line prints the error. The slow test runs MD sampling on a plain
FedAvg ClientApp (``tests/plain_fedavg_app.py``) through the
launcher's command line, which streams the run; the fast ones feed the
captured path the output of such a run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from flwr_importance.tooling import launcher
from flwr_importance.tooling.launcher import (
    FAILED_RUN_RETURNCODE,
    server_app_error,
    simulation,
)
from tests.app_variant import REPO_ROOT, app_variant
from tests.e2e.test_compare_flwr_run import processes_under, write_preset

#: What `flwr run --stream` printed at the end of MD sampling's run on the
#: plain FedAvg ClientApp (Flower 1.41, colours and paths kept as printed).
FAILED_RUN_TAIL = """\
\x1b[93mWARNING \x1b[0m:   MDSampling: 3 replies dropped, by message type and reason:
\x1b[93mWARNING \x1b[0m:   \tquery.sizes: 3 x no handler registered for the message type
\x1b[91mERROR \x1b[0m:     Simulation raised an exception
Traceback (most recent call last):
  File "/x/flwr/simulation/app.py", line 337, in run_simulation_process
    simulation_result = _run_simulation(
                        ^^^^^^^^^^^^^^^^
  File "/x/flwr_importance/strategies/replies.py", line 221, in settle
    raise ClientSideMissingError(
flwr_importance.strategies.replies.ClientSideMissingError: MDSampling: every node \
that answered 'query.sizes' lacks the method's client side (no handler registered \
for the message type); see docs/methods.md#4-clustered-sampling-and-md-sampling
\x1b[91mERROR \x1b[0m:     Exit Code: 700

An unhandled exception occurred when running the simulation.
"""


def test_a_failed_run_s_error_is_read_from_its_output() -> None:
    error = server_app_error(FAILED_RUN_TAIL)
    assert error is not None
    assert error.startswith("flwr_importance.strategies.replies.ClientSideMissingError")
    assert error.endswith("md-sampling (Exit Code: 700)")
    assert server_app_error(FAILED_RUN_TAIL.replace("Exit Code: 700", "")) is None


def test_a_captured_run_that_failed_returns_non_zero(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def failed_run(command: list[str], *args: object) -> subprocess.CompletedProcess:
        return subprocess.CompletedProcess(command, 0, FAILED_RUN_TAIL, "")

    monkeypatch.setattr(simulation, "_flwr_run_once", failed_run)
    completed = launcher.flwr_run(
        REPO_ROOT, num_supernodes=2, flwr_home=tmp_path, capture=True
    )
    assert completed.returncode == FAILED_RUN_RETURNCODE


@pytest.mark.slow
def test_the_launcher_exits_non_zero_with_the_missing_client_side_error(
    tmp_path: Path,
) -> None:
    app_dir = app_variant(
        tmp_path / "app",
        REPO_ROOT / "tests" / "plain_fedavg_app.py",
        {"clientapp": "tests.plain_fedavg_app:app"},
    )
    preset = write_preset(
        tmp_path / "md-plain.toml",
        {
            "strategy": "md",
            "num-supernodes": 3,
            "clients-per-round": 2,
            "num-server-rounds": 2,
            "output-dir": str(tmp_path / "out"),
        },
    )
    flwr_home = tmp_path / "flwr-home"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "flwr_importance.tooling.launcher",
            "--app",
            str(app_dir),
            "--run-config",
            str(preset),
            "--flwr-home",
            str(flwr_home),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=500,
        check=False,
    )
    log = completed.stdout[-4000:] + completed.stderr[-4000:]
    assert completed.returncode == FAILED_RUN_RETURNCODE, log
    assert processes_under(flwr_home) == {}
    # The streamed run's own log: the simulation's error replies were the
    # missing handler, and the summary of dropped replies came before the end.
    assert "No query function registered with name 'sizes'" in completed.stdout
    assert "query.sizes: 3 x no handler registered" in completed.stdout
    # The launcher's last word names the method, the missing lines and the docs.
    error = completed.stderr.strip().splitlines()[-1]
    assert error.startswith("error: the run failed: "), log
    for text in (
        "ClientSideMissingError: MDSampling",
        "'query.sizes'",
        "add `add_size_query(app, num_examples=...)`",
        "docs/methods.md#4-clustered-sampling-and-md-sampling",
        "(Exit Code: 700)",
    ):
        assert text in error, error
