"""End to end: every library strategy inside the examples, through a real ``flwr run``.

The quickstart-pytorch example is Flower's own app shape (its CNN, its
momentum-SGD ``train()``, its DataLoaders); the legacy example uses Flower's
``server_fn``/``NumPyClient`` API. Each strategy must run there to completion,
report central evaluation every round and leave nothing running.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from flwr_importance.launcher import flwr_run, processes_mentioning
from flwr_importance.registry import methods

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "examples"
QUICKSTART_DIR = EXAMPLES_DIR / "quickstart-pytorch"
LEGACY_DIR = EXAMPLES_DIR / "legacy"
ROUNDS = 2

#: ``(app_dir, run_config, num_supernodes) -> history.json``.
ExampleRun = Callable[[Path, dict[str, object], int], Any]


def quickstart_strategies() -> list[str]:
    """The strategies the quickstart's server knows, from its own table.

    The table adds every registry method itself: a test below checks it.
    """
    sys.path.insert(0, str(QUICKSTART_DIR))
    try:
        from quickstart_pytorch.server_app import STRATEGIES
    finally:
        sys.path.remove(str(QUICKSTART_DIR))
    return sorted(STRATEGIES)


@pytest.fixture
def run_example(tmp_path: Path) -> Iterator[ExampleRun]:
    """``(app_dir, run_config, num_supernodes) -> history``, nothing left running."""
    flwr_home = tmp_path / "flwr-home"

    def run(
        app_dir: Path, run_config: dict[str, object], num_supernodes: int
    ) -> object:
        output_dir = tmp_path / "out"
        completed = flwr_run(
            app_dir,
            num_supernodes=num_supernodes,
            run_config={**run_config, "output-dir": str(output_dir)},
            flwr_home=flwr_home,
            capture=True,
            timeout=300,
            federation_config={"client-resources-num-cpus": 1},
        )
        log = completed.stdout[-4000:] + completed.stderr[-4000:]
        assert completed.returncode == 0, log
        assert "ERROR" not in completed.stdout + completed.stderr, log
        return json.loads((output_dir / "history.json").read_text())

    yield run
    assert processes_mentioning(str(flwr_home.resolve())) == []


@pytest.mark.slow
@pytest.mark.parametrize("strategy", quickstart_strategies())
def test_quickstart_example_runs_every_strategy(
    strategy: str, run_example: ExampleRun
) -> None:
    history = run_example(
        QUICKSTART_DIR, {"strategy": strategy, "num-server-rounds": ROUNDS}, 10
    )
    # Round 0 is the initial model; then one central evaluation per round.
    assert sorted(int(server_round) for server_round in history) == list(
        range(ROUNDS + 1)
    )
    assert all(0.0 <= row["accuracy"] <= 1.0 for row in history.values())


#: Under ``flwr run``: the example's own FedSampling settings, and a generated
#: legacy class whose query carries the model (``ClientProxy.fit``). Every
#: method on the legacy API runs the example in process, through Flower's
#: legacy server loop (tests/compat/test_legacy_example.py), and OCS also under
#: ``flwr run`` (tests/compat/test_compat_e2e_legacy.py): a Ray start per
#: method here would only repeat them.
LEGACY_STRATEGIES = ["fedsampling", "poc"]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", LEGACY_STRATEGIES)
def test_legacy_example_runs_under_flwr_run(
    strategy: str, run_example: ExampleRun
) -> None:
    history = run_example(
        LEGACY_DIR,
        {"strategy": strategy, "num-server-rounds": ROUNDS, "num-supernodes": 10},
        10,
    )
    assert [row["round"] for row in history] == list(range(ROUNDS + 1))


def test_quickstart_example_knows_every_method() -> None:
    assert {spec.name for spec in methods()} <= set(quickstart_strategies())
