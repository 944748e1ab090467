"""End to end: a multi-model MMFL run through a real ``flwr run``.

The run also takes a server optimizer (FedAdam's step on the packed models),
the combination of issue 26 that goes through ``flwr run``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import FlwrSimulation


@pytest.mark.slow
def test_flwr_run_mmfl_with_fedadam_writes_per_model_history(
    flwr_simulation: FlwrSimulation, tmp_path: Path
) -> None:
    rows = flwr_simulation(
        {
            "strategy": "mmfl",
            "mmfl-variant": "gradnorm",
            "mmfl-tasks": "digits:pathological:2,synthetic-1-1",
            "model": "logreg",
            "num-server-rounds": 2,
            "clients-per-round": 3,
            "local-steps": 3,
            "server-optimizer": "adam",
            "server-optimizer-eta": 0.01,
        },
        num_supernodes=6,
        timeout=300,
    )
    assert [row["round"] for row in rows] == [0, 1, 2]
    for row in rows:
        per_model = [row["accuracy-0"], row["accuracy-1"]]
        assert row["accuracy"] == pytest.approx(sum(per_model) / 2)
    assert rows[-1]["num-received"] >= 1
    log = (tmp_path / "flwr-run.log").read_text()
    assert "Server optimizer: ServerAdam (Flower's FedAdam step)" in log
