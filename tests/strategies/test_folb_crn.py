"""Common random numbers: FOLB and its baselines see the same devices and work.

Within a seed, FOLB, FedProx and FedAvg (and FedProx at FOLB's mu) must train
the same devices each round, each with the same drawn local epochs, so that
the aggregation is the only difference. Checked on the benchmark's own runs
(the simulation app on the in-process grid) from the train messages the nodes
received and the local steps they reported; and, with crafted identical
gradients, FOLB's model must be FedProx's.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from benchmarks import folb as benchmark
from flwr_importance.strategies.arrays import flatten
from flwr_importance.strategies.folb import FOLB
from flwr_importance.tooling.testing import InProcessGrid
from simulations.config import ExperimentConfig
from simulations.inprocess import load_preset, resolve_run_config
from simulations.methods.fedprox import ScheduledFedProx
from simulations.task import federated_data

DATASET = "synthetic-1-1"
ROUNDS = 3
MAX_EPOCHS = 3


@pytest.fixture(scope="module")
def schedules() -> dict[tuple[str, int], list[dict[int, int]]]:
    """Per method and seed, each round's partition -> reported local steps."""
    scale = benchmark.Scale({DATASET: ROUNDS}, MAX_EPOCHS, (0,))
    runs = benchmark.Runs(DATASET, scale)
    return {
        (name, seed): runs.get(overrides, seed).schedule
        for name, overrides in benchmark.methods(DATASET).items()
        for seed in (0, 1)
    }


@pytest.mark.parametrize("seed", [0, 1])
def test_every_method_trains_the_same_devices_with_the_same_epochs(
    schedules: dict[tuple[str, int], list[dict[int, int]]], seed: int
) -> None:
    folb = schedules[(benchmark.FOLB, seed)]
    assert len(folb) == ROUNDS
    assert all(len(round_steps) == 10 for round_steps in folb)  # K distinct
    for name in benchmark.methods(DATASET):
        assert schedules[(name, seed)] == folb, name


def test_the_schedule_is_drawn_anew_per_seed_and_round(
    schedules: dict[tuple[str, int], list[dict[int, int]]],
) -> None:
    first, second = schedules[(benchmark.FOLB, 0)], schedules[(benchmark.FOLB, 1)]
    assert [set(r) for r in first] != [set(r) for r in second]
    assert len({frozenset(r) for r in first}) == ROUNDS


def test_local_work_is_whole_epochs_drawn_per_device_and_round(
    schedules: dict[tuple[str, int], list[dict[int, int]]],
) -> None:
    run_config = resolve_run_config({**load_preset(f"folb-{DATASET}"), "seed": 0})
    config = ExperimentConfig.from_run_config(run_config)
    sizes = [
        len(partition.x)
        for partition in federated_data(config, benchmark.NUM_CLIENTS).partitions
    ]
    epochs = [
        steps / math.ceil(sizes[partition] / config.batch_size)
        for round_steps in schedules[(benchmark.FOLB, 0)]
        for partition, steps in round_steps.items()
    ]
    assert all(value.is_integer() and 1 <= value <= MAX_EPOCHS for value in epochs)
    assert len(set(epochs)) > 1  # drawn, not fixed


# -- identical gradients: FOLB's rule is FedProx's sample-weighted mean ----------
NUM_NODES = 8
INITIAL = np.array([0.5, -1.0, 2.0])
UPDATES = np.random.default_rng(5).normal(size=(NUM_NODES, 3))
SAMPLES = np.array([3, 50, 7, 12, 1, 30, 9, 22])
GRADIENT = np.array([0.2, -0.4, 1.0])


def record(vector: np.ndarray) -> ArrayRecord:
    """A one-array record holding ``vector``."""
    return ArrayRecord.from_array_dict({"w": Array(vector.copy())})


def crafted_app(reply: str) -> ClientApp:
    """Node ``k`` replies ``UPDATES[k]`` as FOLB's update or FedProx's model."""
    app = ClientApp()

    @app.train()
    def train(message: Message, context: Context) -> Message:
        k = int(context.node_config["partition-id"])
        metrics = MetricRecord({"num-examples": int(SAMPLES[k]), "gamma": 0.5})
        if reply == "folb":
            content = RecordDict(
                {
                    "update": record(UPDATES[k]),
                    "gradient": record(GRADIENT),
                    "metrics": metrics,
                }
            )
        else:
            content = RecordDict(
                {"arrays": record(INITIAL + UPDATES[k]), "metrics": metrics}
            )
        return Message(content, reply_to=message)

    return app


@pytest.mark.parametrize("seed", [0, 3])
def test_with_identical_gradients_folb_gives_fedprox_model(seed: int) -> None:
    models, trained = [], []
    for name, strategy in (
        ("folb", FOLB(clients_per_round=4, seed=seed, fraction_evaluate=0.0)),
        (
            "fedprox",
            ScheduledFedProx(
                seed=seed,
                proximal_mu=1.0,
                fraction_train=0.5,
                min_train_nodes=4,
                fraction_evaluate=0.0,
            ),
        ),
    ):
        grid = InProcessGrid(crafted_app(name), NUM_NODES, seed=11)
        result = strategy.start(grid, record(INITIAL), num_rounds=1)
        models.append(flatten(result.arrays))
        trained.append(
            sorted(
                grid.partition_of(rec.node_id)
                for rec in grid.wire_log
                if rec.direction == "to-node" and rec.message_type == "train"
            )
        )
    assert trained[0] == trained[1] and len(set(trained[0])) == 4
    weights = SAMPLES[trained[0]] / SAMPLES[trained[0]].sum()
    np.testing.assert_allclose(models[0], INITIAL + weights @ UPDATES[trained[0]])
    np.testing.assert_allclose(models[0], models[1], rtol=1e-12, atol=1e-12)
