"""The clustered presets through the simulation app: in process and by `flwr run`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from flwr_importance.launcher import flwr_run, processes_mentioning
from simulations.inprocess import APP_DIR, load_preset, run_inprocess


@pytest.mark.parametrize(
    "preset", ["clustered-digits", "clustered-digits-size", "clustered-digits-md"]
)
def test_clustered_presets_run_in_process(preset: str, tmp_path: Path) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        overrides = {
            **load_preset(preset),
            "num-server-rounds": 2,
            "output-dir": str(tmp_path),
        }
        rows, _ = run_inprocess(overrides, num_clients=20)
    finally:
        torch.set_num_threads(threads)
    assert [row["round"] for row in rows] == [0, 1, 2]
    for row in rows[1:]:
        assert 1 <= row["distinct-clients"] <= row["aggregated-draws"] == 10
        assert np.isfinite(row["loss"])
    assert (tmp_path / "history.json").exists()


@pytest.mark.slow
def test_flwr_run_clustered_preset(tmp_path: Path) -> None:
    output_dir = tmp_path / "out"
    flwr_home = tmp_path / "flwr-home"
    completed = flwr_run(
        APP_DIR,
        num_supernodes=12,
        run_config={
            **load_preset("clustered-digits"),
            "num-supernodes": 12,
            "num-server-rounds": 2,
            "output-dir": str(output_dir),
        },
        flwr_home=flwr_home,
        capture=True,
        timeout=300,
    )
    log = completed.stdout[-4000:] + completed.stderr[-4000:]
    assert completed.returncode == 0, log
    rows = json.loads((output_dir / "history.json").read_text())
    assert [row["round"] for row in rows] == [0, 1, 2]
    assert all(row["aggregated-draws"] == 10 for row in rows[1:]), rows
    assert processes_mentioning(str(flwr_home.resolve())) == []
