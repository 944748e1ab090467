"""The clustered presets through the simulation app: in process and by `flwr run`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from simulations.inprocess import load_preset, run_inprocess
from tests.conftest import FlwrSimulation


@pytest.mark.parametrize(
    "preset", ["clustered-digits", "clustered-digits-size", "clustered-digits-md"]
)
def test_clustered_presets_run_in_process(preset: str, tmp_path: Path) -> None:
    overrides = {
        **load_preset(preset),
        "num-server-rounds": 2,
        "output-dir": str(tmp_path),
    }
    rows, _ = run_inprocess(overrides, num_clients=20)
    assert [row["round"] for row in rows] == [0, 1, 2]
    for row in rows[1:]:
        assert 1 <= row["distinct-clients"] <= row["aggregated-draws"] == 10
        assert np.isfinite(row["loss"])
    assert (tmp_path / "history.json").exists()


@pytest.mark.slow
def test_flwr_run_clustered_preset(flwr_simulation: FlwrSimulation) -> None:
    rows = flwr_simulation(
        {
            **load_preset("clustered-digits"),
            "num-supernodes": 12,
            "num-server-rounds": 2,
        },
        num_supernodes=12,
    )
    assert [row["round"] for row in rows] == [0, 1, 2]
    assert all(row["aggregated-draws"] == 10 for row in rows[1:]), rows
