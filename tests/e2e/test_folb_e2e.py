"""End to end: a FOLB preset through a real ``flwr run`` (two-set, eq. 18)."""

from __future__ import annotations

import math

import pytest

from simulations.inprocess import load_preset
from tests.conftest import FlwrSimulation


@pytest.mark.slow
def test_flwr_run_folb_preset_learns_and_leaves_nothing_running(
    flwr_simulation: FlwrSimulation,
) -> None:
    rows = flwr_simulation(
        {
            **load_preset("folb-digits"),
            "num-supernodes": 6,
            "partitioning": "iid",  # a learning signal within 2 rounds
            # Two rounds: with seed 0, round 1's reference set lies inside its
            # training set, so round 2 is the first to send query.gradient (to
            # one node). 1..5 local epochs per device and round (the preset's
            # 1..20 take 5x the time) bring the loss from 2.31 to 2.13.
            "num-server-rounds": 2,
            "local-epochs": 5,
            "clients-per-round": 3,
            "folb-mode": "two-set",  # query.gradient messages through the runtime
            "folb-psi": 0.01,
        },
        num_supernodes=6,
    )
    assert [row["round"] for row in rows] == [0, 1, 2]
    assert all(math.isfinite(row["loss"]) for row in rows), rows
    assert rows[-1]["loss"] < rows[0]["loss"], rows
