"""End to end: a FedSampling preset through a real ``flwr run``."""

from __future__ import annotations

import pytest

from simulations.inprocess import load_preset
from tests.conftest import FlwrSimulation


@pytest.mark.slow
def test_flwr_run_fedsampling_preset(flwr_simulation: FlwrSimulation) -> None:
    run_config = {
        **load_preset("fedsampling-lognormal-sigma2"),
        "num-supernodes": 5,
        "num-server-rounds": 2,
    }
    rows = flwr_simulation(run_config, num_supernodes=5)
    assert [row["round"] for row in rows] == [0, 1, 2]
    for row in rows[1:]:
        assert row["num-size-replies"] == 5
        samples_per_round = run_config["fedsampling-samples-per-round"]
        assert row["estimated-total-size"] >= samples_per_round
