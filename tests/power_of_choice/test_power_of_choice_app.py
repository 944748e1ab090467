"""The Power-of-Choice preset through the simulation app, in process."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flwr_importance.registry import method
from simulations.inprocess import load_preset, run_inprocess
from simulations.methods import available_methods, load_method


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


#: Power-of-Choice's former app name, kept as a deprecated alias.
FORMER_NAME = "poc"


def test_the_former_name_finds_the_method_with_a_warning() -> None:
    with pytest.warns(FutureWarning, match="use 'power-of-choice'"):
        assert method(FORMER_NAME) is method("power-of-choice")
    assert FORMER_NAME not in method("power-of-choice").app_names
    # The app lists current names only.
    assert FORMER_NAME not in available_methods()


def test_a_run_config_naming_the_former_name_runs_power_of_choice(
    tmp_path: Path,
) -> None:
    # The app loads each strategy name once per process.
    load_method.cache_clear()
    overrides = {
        **load_preset("power-of-choice-digits-dirichlet"),
        "strategy": FORMER_NAME,
        "num-server-rounds": 1,
        "output-dir": str(tmp_path),
    }
    with pytest.warns(FutureWarning, match="use 'power-of-choice'"):
        rows, _ = run_inprocess(overrides, num_clients=20)
    assert rows[-1]["candidates"] == 6
