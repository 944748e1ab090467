"""End to end: a FOLB preset through a real ``flwr run`` (two-set, eq. 18)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from flwr_importance.launcher import flwr_run, processes_mentioning
from simulations.inprocess import load_preset

APP_DIR = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_flwr_run_folb_preset_learns_and_leaves_nothing_running(
    tmp_path: Path,
) -> None:
    output_dir = tmp_path / "out"
    flwr_home = tmp_path / "flwr-home"
    completed = flwr_run(
        APP_DIR,
        num_supernodes=6,
        run_config={
            **load_preset("folb-digits"),
            "partitioning": "iid",  # a learning signal within 3 rounds
            "num-server-rounds": 3,
            "clients-per-round": 3,
            "folb-mode": "two-set",  # query.gradient messages through the runtime
            "folb-psi": 0.01,
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
    assert all(math.isfinite(row["loss"]) for row in rows), rows
    assert rows[-1]["loss"] < rows[0]["loss"], rows
    assert processes_mentioning(str(flwr_home.resolve())) == []
