"""End to end: a FedSampling preset through a real ``flwr run``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flwr_importance.launcher import flwr_run, processes_mentioning
from simulations.inprocess import load_preset

APP_DIR = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_flwr_run_fedsampling_preset(tmp_path: Path) -> None:
    output_dir = tmp_path / "out"
    flwr_home = tmp_path / "flwr-home"
    run_config = {
        **load_preset("fedsampling-lognormal-sigma2"),
        "num-server-rounds": 2,
        "output-dir": str(output_dir),
    }
    completed = flwr_run(
        APP_DIR,
        num_supernodes=5,
        run_config=run_config,
        flwr_home=flwr_home,
        capture=True,
        timeout=300,
    )
    log = completed.stdout[-4000:] + completed.stderr[-4000:]
    assert completed.returncode == 0, log
    rows = json.loads((output_dir / "history.json").read_text())
    assert [row["round"] for row in rows] == [0, 1, 2]
    for row in rows[1:]:
        assert row["num-size-replies"] == 5
        samples_per_round = run_config["fedsampling-samples-per-round"]
        assert row["estimated-total-size"] >= samples_per_round
    assert processes_mentioning(str(flwr_home.resolve())) == []
