"""End to end: a FedSampling preset through a real ``flwr run``."""

from __future__ import annotations

import pytest

from simulations.inprocess import load_preset
from simulations.report import PRIVACY_LEDGER
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
    epsilon = run_config["fedsampling-epsilon"]
    node_ids = rows[-1][PRIVACY_LEDGER]["node-ids"]
    assert len(set(node_ids)) == 5
    assert all(isinstance(node_id, int) for node_id in node_ids)
    assert rows[0][PRIVACY_LEDGER]["node-ids"] == []
    for row in rows[1:]:
        assert row["num-size-replies"] == 5
        samples_per_round = run_config["fedsampling-samples-per-round"]
        assert row["estimated-total-size"] >= samples_per_round
        # All 5 nodes answered every round so far: each spent round * eps, and
        # at eps = 3 > ln 2 advanced composition never improves on that.
        ledger = row[PRIVACY_LEDGER]
        assert ledger["node-ids"] == node_ids
        assert ledger["size-queries"] == [row["round"]] * 5
        assert ledger["basic-epsilon"] == [row["round"] * epsilon] * 5
        assert ledger["advanced-epsilon"] == ledger["basic-epsilon"]
