"""End to end: the ISFedAvg regression preset through a real ``flwr run``."""

from __future__ import annotations

import pytest

from simulations.inprocess import load_preset
from tests.conftest import FlwrSimulation


@pytest.mark.slow
def test_flwr_run_isfedavg_regression_preset(flwr_simulation: FlwrSimulation) -> None:
    rows = flwr_simulation(
        {
            **load_preset("isfedavg-regression"),
            "num-supernodes": 12,
            "num-server-rounds": 3,
            "clients-per-round": 3,
            "local-lr": 0.05,
            "samples-per-client": 20,
        },
        num_supernodes=12,
    )
    assert [row["round"] for row in rows] == [0, 1, 2, 3]
    assert rows[-1]["msd"] < rows[0]["msd"], rows
    assert all(row["isfedavg-sigma2"] >= 0 for row in rows[1:]), rows
