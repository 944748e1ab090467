"""End to end: the README's main job through a real ``flwr run``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flwr_importance.launcher import flwr_run, processes_mentioning

APP_DIR = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_flwr_run_default_experiment_learns_and_leaves_nothing_running(
    tmp_path: Path,
) -> None:
    output_dir = tmp_path / "out"
    flwr_home = tmp_path / "flwr-home"
    completed = flwr_run(
        APP_DIR,
        num_supernodes=10,
        # IID partitions: this test checks the plumbing learns, not a method.
        run_config={
            "partitioning": "iid",
            "num-server-rounds": 4,
            "clients-per-round": 5,
            "output-dir": str(output_dir),
        },
        flwr_home=flwr_home,
        capture=True,
        timeout=400,
    )
    log = completed.stdout[-4000:] + completed.stderr[-4000:]
    assert completed.returncode == 0, log
    rows = json.loads((output_dir / "history.json").read_text())
    assert [row["round"] for row in rows] == [0, 1, 2, 3, 4]
    assert rows[-1]["accuracy"] > rows[0]["accuracy"] + 0.4, rows
    assert (output_dir / "convergence.png").stat().st_size > 0
    assert processes_mentioning(str(flwr_home.resolve())) == []
