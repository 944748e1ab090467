"""The scikit-learn example runs every method it lists, its own train included.

``examples/quickstart-sklearn`` is Flower's quickstart-sklearn (a
``LogisticRegression`` on the Message API) with the torch-free client helpers.
Every method of its server's ``METHODS`` must run there: the server's one-line
swap of ``FedAvg``, the client's few lines around the example's own ``train``
and ``evaluate``. Only ``examples/quickstart-pytorch`` must know every
registry method (tests/e2e/examples/test_examples.py); a method here needs no
gradients. Its ``train`` logs ``sklearn-example train: partition <p>,
<n> examples``, so the tests see that the example's own training ran on the
nodes the methods sampled.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import joblib
import numpy as np
import pytest
from flwr.app import Context, RecordDict, UserConfig, UserConfigValue
from flwr.common.logger import FLOWER_LOGGER

from tests.e2e.examples.example_runs import run_methods

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

EXAMPLE_DIR = Path(__file__).resolve().parents[3] / "examples" / "quickstart-sklearn"

#: The example's methods (its server's ``METHODS``): FedAvg, both algorithms
#: of clustered sampling and model-agnostic methods of the library.
METHODS = (
    "fedavg",
    "md",
    "clustered",
    "clustered-size",
    "ocs",
    "aocs",
    "power-of-choice",
    "mmfl",
)

#: Registry methods whose clients need gradients or per-sample quantities,
#: which a scikit-learn ``LogisticRegression`` does not give.
NOT_APPLICABLE = {"fedsampling", "isfedavg", "folb"}

#: Methods whose train metrics are Flower's weighted mean of the sampled
#: nodes' replies, so they hold the key only the example's train writes.
USER_METRIC_METHODS = ("fedavg", "md", "clustered", "clustered-size", "power-of-choice")
EXAMPLE_TRAIN_METRIC = "train_accuracy"

ROUNDS = 2
NUM_NODES = 10
TRAIN_LOG = re.compile(r"sklearn-example train: partition (\d+), \d+ examples")


def example_config(overrides: dict[str, UserConfigValue] | None = None) -> UserConfig:
    """The example's run config with ``overrides``."""
    with (EXAMPLE_DIR / "pyproject.toml").open("rb") as file:
        config: UserConfig = tomllib.load(file)["tool"]["flwr"]["app"]["config"]
    return {**config, **(overrides or {})}


@pytest.fixture(scope="module")
def example() -> Iterator[dict[str, ModuleType]]:
    """The example's ``client_app`` and ``server_app`` modules."""
    sys.path.insert(0, str(EXAMPLE_DIR))
    try:
        from sklearnexample import client_app, server_app
    finally:
        sys.path.remove(str(EXAMPLE_DIR))
    yield {"client_app": client_app, "server_app": server_app}


def check_history(history: dict[str, dict[str, dict[str, float]]]) -> None:
    """Central evaluation of the initial model and after every round; train rounds."""
    central = history["central-evaluation"]
    assert sorted(int(server_round) for server_round in central) == list(
        range(ROUNDS + 1)
    )
    assert all(0.0 <= row["accuracy"] <= 1.0 for row in central.values())
    assert sorted(int(server_round) for server_round in history["train"]) == list(
        range(1, ROUNDS + 1)
    )


class TrainLog(logging.Handler):
    """Keeps the partition of every ``sklearn-example train`` log record."""

    def __init__(self) -> None:
        super().__init__()
        self.partitions: list[int] = []

    def emit(self, record: logging.LogRecord) -> None:
        """Record the partition of an example train line."""
        match = TRAIN_LOG.search(record.getMessage())
        if match:
            self.partitions.append(int(match.group(1)))


def test_example_knows_the_methods_it_lists(
    example: dict[str, ModuleType],
) -> None:
    """Every method the example lists builds; the tests below run each of them."""
    assert tuple(example["server_app"].METHODS) == METHODS
    context = Context(0, 0, {}, RecordDict(), example_config())
    make_strategy = example["server_app"].make_strategy
    for method in METHODS:
        make_strategy(method, context)
    for method in NOT_APPLICABLE:
        with pytest.raises(ValueError, match="unknown strategy"):
            make_strategy(method, context)


def test_example_apps_import_no_torch() -> None:
    completed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, sklearnexample.client_app, sklearnexample.server_app; "
            "print('torch' in sys.modules)",
        ],
        cwd=EXAMPLE_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.split() == ["False"]


@pytest.mark.parametrize("method", METHODS)
def test_method_trains_with_the_example_train_in_process(
    method: str, example: dict[str, ModuleType], tmp_path: Path
) -> None:
    """Each sampled node's train reply follows the example's own training."""
    from flwr_importance.tooling.testing import InProcessGrid

    config = example_config(
        {"strategy": method, "num-server-rounds": ROUNDS, "output-dir": str(tmp_path)}
    )
    grid = InProcessGrid(example["client_app"].app, NUM_NODES, run_config=config)
    train_log = TrainLog()
    FLOWER_LOGGER.addHandler(train_log)
    try:
        example["server_app"].main(grid, Context(0, 0, {}, RecordDict(), config))
    finally:
        FLOWER_LOGGER.removeHandler(train_log)

    history = json.loads((tmp_path / f"{method}.json").read_text())
    check_history(history)
    trained_partitions = {
        grid.partition_of(record.node_id)
        for record in grid.wire_log
        if record.direction == "to-server" and record.message_type == "train"
    }
    assert trained_partitions
    assert trained_partitions <= set(train_log.partitions)
    if method in USER_METRIC_METHODS:
        assert all(EXAMPLE_TRAIN_METRIC in row for row in history["train"].values())


def test_mmfl_evaluates_and_saves_each_model_on_its_own(
    example: dict[str, ModuleType], tmp_path: Path
) -> None:
    """Each task's model is evaluated on its task and saved, as the app saves one."""
    from flwr_importance.tooling.testing import InProcessGrid

    config = example_config(
        {"strategy": "mmfl", "num-server-rounds": 1, "output-dir": str(tmp_path)}
    )
    grid = InProcessGrid(example["client_app"].app, NUM_NODES, run_config=config)
    example["server_app"].main(grid, Context(0, 0, {}, RecordDict(), config))

    central = json.loads((tmp_path / "mmfl.json").read_text())["central-evaluation"]
    assert all(len(row["accuracy-per-model"]) == 2 for row in central.values())
    saved = sorted((tmp_path / "mmfl").glob("logreg_model*.pkl"))
    assert [path.name for path in saved] == ["logreg_model-0.pkl", "logreg_model-1.pkl"]
    models = [joblib.load(path) for path in saved]
    assert not np.array_equal(models[0].coef_, models[1].coef_)
    for task, model in enumerate(models):
        x_test, y_test = example["server_app"].load_centralized_data(task)
        accuracy = central["1"]["accuracy-per-model"][task]
        assert model.score(x_test, y_test) == pytest.approx(accuracy)


@pytest.mark.slow
# Every method in one run: minutes of Ray load, which beside a deployment
# starved the SuperLink (its database locked, the run failed): a heavy run.
@pytest.mark.usefixtures("heavy_run")
def test_one_flwr_run_runs_every_method(tmp_path: Path) -> None:
    output, output_dir = run_methods(
        EXAMPLE_DIR,
        tmp_path,
        methods=METHODS,
        num_supernodes=NUM_NODES,
        run_config={"num-server-rounds": ROUNDS},
    )
    for method in METHODS:
        history = json.loads((output_dir / f"{method}.json").read_text())
        check_history(history)
        if method in USER_METRIC_METHODS:
            assert all(
                EXAMPLE_TRAIN_METRIC in row for row in history["train"].values()
            ), method
    # The example's own train ran on the nodes, at least once per round of
    # every method (OCS, AOCS and MMFL train every node in their query).
    partitions = [int(match) for match in TRAIN_LOG.findall(output)]
    assert len(partitions) >= ROUNDS * len(METHODS), output[-6000:]
    assert set(partitions) <= set(range(NUM_NODES))
