"""The Power-of-Choice preset through the simulation app, in process."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flwr_importance.registry import method
from simulations.inprocess import load_preset, run_inprocess
from simulations.methods import available_methods


@pytest.mark.parametrize("variant", ["pow-d", "rpow-d"])
def test_power_of_choice_preset_runs_in_process(variant: str, tmp_path: Path) -> None:
    overrides = {
        **load_preset("power-of-choice-digits-dirichlet"),
        "power-of-choice-variant": variant,
        "num-server-rounds": 2,
        "output-dir": str(tmp_path),
    }
    rows, grid = run_inprocess(overrides, num_clients=20)
    assert [row["round"] for row in rows] == [0, 1, 2]
    for row in rows[1:]:
        assert row["candidates"] == 6
        assert row["selected"] == row["distinct-clients"] == 3
        assert np.isfinite(row["loss"])
    sent = {record.message_type for record in grid.wire_log}
    assert ("query.loss" in sent) == (variant == "pow-d")
    assert (tmp_path / "history.json").exists()


def test_the_former_name_is_unknown() -> None:
    """No deprecated alias before a release: ``poc`` names no method."""
    with pytest.raises(KeyError, match="unknown method 'poc'"):
        method("poc")
    assert "poc" not in available_methods()
