"""End to end: the ISFedAvg regression preset through a real ``flwr run``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flwr_importance.launcher import flwr_run, processes_mentioning
from simulations.inprocess import load_preset

APP_DIR = Path(__file__).resolve().parent.parent.parent


@pytest.mark.slow
def test_flwr_run_isfedavg_regression_preset(tmp_path: Path) -> None:
    output_dir = tmp_path / "out"
    flwr_home = tmp_path / "flwr-home"
    completed = flwr_run(
        APP_DIR,
        num_supernodes=12,
        run_config={
            **load_preset("isfedavg-regression"),
            "num-server-rounds": 3,
            "clients-per-round": 3,
            "local-lr": 0.05,
            "samples-per-client": 20,
            "output-dir": str(output_dir),
        },
        flwr_home=flwr_home,
        capture=True,
        timeout=300,
    )
    log = completed.stdout[-4000:] + completed.stderr[-4000:]
    assert completed.returncode == 0, log
    rows = json.loads((output_dir / "history.json").read_text())
    assert [row["round"] for row in rows] == [0, 1, 2, 3]
    assert rows[-1]["msd"] < rows[0]["msd"], rows
    assert all(row["isfedavg-sigma2"] >= 0 for row in rows[1:]), rows
    assert processes_mentioning(str(flwr_home.resolve())) == []
