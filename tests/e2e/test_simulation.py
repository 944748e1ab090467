"""End to end: the README's main job through a real ``flwr run``."""

from __future__ import annotations

import pytest

from tests.conftest import FlwrSimulation


@pytest.mark.slow
def test_flwr_run_default_experiment_learns_and_leaves_nothing_running(
    flwr_simulation: FlwrSimulation,
) -> None:
    # IID partitions: this test checks the plumbing learns, not a method.
    rows = flwr_simulation(
        {"partitioning": "iid", "num-server-rounds": 4, "clients-per-round": 5},
        num_supernodes=10,
    )
    assert [row["round"] for row in rows] == [0, 1, 2, 3, 4]
    assert rows[-1]["accuracy"] > rows[0]["accuracy"] + 0.4, rows
