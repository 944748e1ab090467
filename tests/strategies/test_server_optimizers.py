"""Server optimizers: Flower's four steps, and the seam every strategy has.

The reference is Flower 1.41 itself: its ``FedAdam``, ``FedYogi``,
``FedAdagrad`` and ``FedAvgM`` strategies are driven through their own
``configure_train`` and ``aggregate_train`` with one reply whose model is
``x_t + Delta_t`` (FedAvg's average of one reply is that model), and ours are
fed the same pseudo-gradient sequence.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAdagrad, FedAdam, FedAvgM, FedYogi, Strategy

from flwr_importance import compat
from flwr_importance.aggregation.server_optimizers import (
    OptimizerState,
    ServerAdagrad,
    ServerAdam,
    ServerMomentum,
    ServerOptimizer,
    ServerYogi,
)
from flwr_importance.strategies import OptimalClientSampling
from flwr_importance.strategies.arrays import optimizer_step
from flwr_importance.tooling.testing import InProcessGrid
from simulations.config import ExperimentConfig
from simulations.inprocess import resolve_run_config
from tests.tooling.testing.test_grid import app as echo_app

ROUNDS = 8
FLOWER_SAMPLING = {
    "fraction_train": 1.0,
    "min_train_nodes": 1,
    "min_available_nodes": 1,
}

#: Ours and Flower's with the same non-default settings.
PAIRS: dict[str, tuple[ServerOptimizer, Callable[[], Strategy]]] = {
    "adam": (
        ServerAdam(eta=0.05, beta_1=0.8, beta_2=0.95, tau=1e-2),
        lambda: FedAdam(eta=0.05, beta_1=0.8, beta_2=0.95, tau=1e-2, **FLOWER_SAMPLING),
    ),
    "yogi": (
        ServerYogi(eta=0.05, beta_1=0.8, beta_2=0.95, tau=1e-2),
        lambda: FedYogi(eta=0.05, beta_1=0.8, beta_2=0.95, tau=1e-2, **FLOWER_SAMPLING),
    ),
    "adagrad": (
        ServerAdagrad(eta=0.05, tau=1e-2),
        lambda: FedAdagrad(eta=0.05, tau=1e-2, **FLOWER_SAMPLING),
    ),
    "momentum": (
        ServerMomentum(lr=0.7, momentum=0.9),
        lambda: FedAvgM(
            server_learning_rate=0.7, server_momentum=0.9, **FLOWER_SAMPLING
        ),
    ),
}


@pytest.fixture(autouse=True)
def _task_identity() -> None:
    # Messages can only be built once Flower's TaskIdentity is set.
    InProcessGrid(echo_app, num_nodes=1)


def model_record(values: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({key: Array(value) for key, value in values.items()})


def as_arrays(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {key: array.numpy() for key, array in record.items()}


def flower_round(
    strategy: Strategy, server_round: int, model: ArrayRecord, aggregated: ArrayRecord
) -> ArrayRecord:
    """Flower's new model after one round whose FedAvg average is ``aggregated``."""
    grid = InProcessGrid(echo_app, num_nodes=1)
    (instruction,) = list(
        strategy.configure_train(server_round, model, ConfigRecord(), grid)
    )
    reply = Message(
        RecordDict(
            {"arrays": aggregated, "metrics": MetricRecord({"num-examples": 1})}
        ),
        reply_to=instruction,
    )
    new_model, _ = strategy.aggregate_train(server_round, [reply])
    assert new_model is not None
    return new_model


@pytest.mark.parametrize("name", list(PAIRS))
def test_same_models_as_flowers_strategy_on_the_same_updates(name: str) -> None:
    ours, make_flower = PAIRS[name]
    flower = make_flower()
    rng = np.random.default_rng(7)
    start = {
        "weight": rng.normal(size=(4, 3)).astype(np.float32),
        "bias": rng.normal(size=3).astype(np.float32),
    }
    flower_model = our_model = model_record(start)
    state = OptimizerState()
    for server_round in range(1, ROUNDS + 1):
        # Updates that change sign and scale, so each moment rule matters.
        delta = {
            key: (rng.normal(size=value.shape) * 0.5**server_round).astype(np.float32)
            for key, value in start.items()
        }
        flower_start = as_arrays(flower_model)
        flower_model = flower_round(
            flower,
            server_round,
            flower_model,
            model_record({k: v + delta[k] for k, v in flower_start.items()}),
        )
        our_start = as_arrays(our_model)
        our_model, state = optimizer_step(
            ours,
            state,
            our_model,
            model_record({k: v + delta[k] for k, v in our_start.items()}),
            server_round,
        )
        for key in start:
            np.testing.assert_allclose(
                our_model[key].numpy(),
                flower_model[key].numpy(),
                rtol=1e-5,
                atol=1e-6,
                err_msg=f"{name}, round {server_round}, array {key}",
            )
            # Flower's Adam returns float64 (its bias-corrected eta is a NumPy
            # float64); ours keeps the model's dtype.
            assert our_model[key].dtype == "float32"


def test_adam_bias_correction_is_keyed_on_the_server_round() -> None:
    adam = ServerAdam(eta=1.0, beta_1=0.9, beta_2=0.99)
    for server_round in (1, 5):
        expected = np.sqrt(1 - 0.99 ** (server_round + 1)) / (
            1 - 0.9 ** (server_round + 1)
        )
        assert adam.step_size(server_round) == pytest.approx(expected)


def test_non_float_arrays_take_the_aggregated_value() -> None:
    current = {"w": np.zeros(2, np.float32), "count": np.array([3], np.int64)}
    aggregated = {"w": np.ones(2, np.float32), "count": np.array([5], np.int64)}
    new, state = ServerAdam().step(current, aggregated, OptimizerState(), 1)
    assert new["count"].dtype == np.int64
    np.testing.assert_array_equal(new["count"], [5])
    assert set(state.first) == {"w"}


def test_mismatched_models_are_refused() -> None:
    current = {"w": np.zeros(2)}
    with pytest.raises(ValueError, match="names differ"):
        ServerAdam().step(current, {"v": np.zeros(2)}, OptimizerState(), 1)
    with pytest.raises(ValueError, match="shape"):
        ServerAdam().step(current, {"w": np.zeros(3)}, OptimizerState(), 1)


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda: ServerAdam(eta=0.0), ValueError, "eta"),
        (lambda: ServerYogi(tau=-1.0), ValueError, "tau"),
        (lambda: ServerAdam(beta_1=1.0), ValueError, "beta_1"),
        (lambda: ServerAdam(beta_2=-0.1), ValueError, "beta_2"),
        (lambda: ServerAdam(beta_1=True), TypeError, "beta_1"),
        (lambda: ServerMomentum(momentum=1.5), ValueError, "momentum"),
        (lambda: ServerMomentum(lr="1"), TypeError, "lr"),
    ],
)
def test_bad_settings_fail_at_construction(
    build: Callable[[], object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        build()


def test_a_flower_strategy_in_place_of_an_optimizer_is_refused() -> None:
    flower = FedAdam()
    with pytest.raises(TypeError, match="ServerAdam"):
        OptimalClientSampling(clients_per_round=2, server_optimizer=flower)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ServerAdam"):
        compat.OptimalClientSampling(clients_per_round=2, server_optimizer=flower)


def test_legacy_class_takes_the_same_option() -> None:
    legacy = compat.OptimalClientSampling(
        clients_per_round=2, server_optimizer=ServerYogi(eta=0.02)
    )
    assert legacy.strategy.server_optimizer == ServerYogi(eta=0.02)


def test_one_optimizer_can_configure_several_strategies() -> None:
    adam = ServerAdam()
    first = OptimalClientSampling(clients_per_round=2, server_optimizer=adam)
    second = OptimalClientSampling(clients_per_round=2, server_optimizer=adam)
    first.optimizer_state = OptimizerState(first={"w": np.ones(1)})
    assert second.optimizer_state.first == {}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("none", None),
        ("adam", ServerAdam(eta=0.1, beta_1=0.9, beta_2=0.99, tau=1e-3)),
        ("yogi", ServerYogi(eta=0.1, beta_1=0.9, beta_2=0.99, tau=1e-3)),
        ("adagrad", ServerAdagrad(eta=0.1, tau=1e-3)),
        ("momentum", ServerMomentum(lr=0.1, momentum=0.9)),
    ],
)
def test_run_config_names_the_optimizer(
    name: str, expected: ServerOptimizer | None
) -> None:
    config = ExperimentConfig.from_run_config(
        resolve_run_config({"server-optimizer": name})
    )
    assert config.server_optimizer() == expected


def test_unknown_run_config_optimizer_names_the_known_ones() -> None:
    config = ExperimentConfig.from_run_config(
        resolve_run_config({"server-optimizer": "sgd"})
    )
    with pytest.raises(ValueError, match="adam, yogi, adagrad, momentum"):
        config.server_optimizer()
