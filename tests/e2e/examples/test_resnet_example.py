"""The ResNet example: ISFedAvg on Flower's quickstart with a GroupNorm ResNet-18.

In process (the example's own ServerApp ``main`` and ClientApp on the
in-process grid) at tiny sizes: the GroupNorm network trains round after
round; the same network with its BatchNorm layers (run config ``norm =
"batch"``) is refused by every node at round 1, with the error that names
each layer and the fix (the server logs it with each dropped reply). One
``flwr run`` (slow) checks the app as Flower runs it.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import tomllib
from flwr.app import Context, RecordDict

from flwr_importance.strategies import ClientSideFailedError
from flwr_importance.tooling.testing import InProcessGrid
from tests.e2e.examples.example_runs import checked_run

EXAMPLE_DIR = (
    Path(__file__).resolve().parents[3] / "examples" / "quickstart-pytorch-resnet"
)
#: Tiny images and network, so that a round takes a fraction of a second.
TINY = {"image-size": 8, "resnet-width": 4, "num-server-rounds": 2, "num-supernodes": 3}


def example_module(name: str) -> ModuleType:
    """A module of the example's package, imported from its folder."""
    sys.path.insert(0, str(EXAMPLE_DIR))
    try:
        return importlib.import_module(f"resnetexample.{name}")
    finally:
        sys.path.remove(str(EXAMPLE_DIR))


def run_config(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    with (EXAMPLE_DIR / "pyproject.toml").open("rb") as file:
        defaults = tomllib.load(file)["tool"]["flwr"]["app"]["config"]
    return {**defaults, **TINY, "output-dir": str(tmp_path), **overrides}


def run_in_process(config: dict[str, Any]) -> None:
    client_app = example_module("client_app")
    server_app = example_module("server_app")
    grid = InProcessGrid(client_app.app, config["num-supernodes"], config, seed=0)
    context = Context(
        run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=config
    )
    server_app.main(grid, context)


def check_history(output_dir: Path, rounds: int) -> None:
    history = json.loads((output_dir / "history.json").read_text())
    central = history["central-evaluation"]
    assert sorted(central, key=int) == [str(r) for r in range(rounds + 1)]
    assert all(0.0 <= row["accuracy"] <= 1.0 for row in central.values())
    trained = history["train"]
    assert sorted(trained, key=int) == [str(r) for r in range(1, rounds + 1)]
    for row in trained.values():
        assert {"train_loss", "isfedavg-sigma2", "isfedavg-g2"} <= set(row)


def test_the_groupnorm_resnet_trains_with_isfedavg(tmp_path: Path) -> None:
    run_in_process(run_config(tmp_path))
    check_history(tmp_path, TINY["num-server-rounds"])


def test_the_batchnorm_resnet_is_refused_at_round_one_with_the_fix(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Every node fails ISFedAvg's train and none ever succeeded: the run stops
    # in round 1 (ClientSideFailedError), quoting the first node's refusal.
    with (
        caplog.at_level(logging.WARNING, logger="flwr"),
        pytest.raises(ClientSideFailedError, match="SampleMixingLayerError") as stop,
    ):
        run_in_process(run_config(tmp_path, norm="batch", **{"num-server-rounds": 1}))
    assert "replace_batchnorm(model)" in str(stop.value)
    refusals = [
        record.getMessage()
        for record in caplog.records
        if "SampleMixingLayerError" in record.getMessage()
    ]
    # Every node sampled in round 1 refused, naming the layers and the fix.
    assert len(refusals) == run_config(tmp_path)["clients-per-round"]
    for refusal in refusals:
        assert "layer1.0.bn1 (BatchNorm2d)" in refusal
        assert "replace_batchnorm(model)" in refusal


@pytest.mark.slow
def test_the_example_runs_under_flwr_run(tmp_path: Path) -> None:
    config = run_config(tmp_path / "out", **{"num-server-rounds": 1})
    checked_run(
        EXAMPLE_DIR,
        num_supernodes=config["num-supernodes"],
        run_config=config,
        flwr_home=tmp_path / "flwr-home",
    )
    check_history(tmp_path / "out", 1)
