"""OptimalClientSampling and MultiModelSampling on the in-process grid.

A crafted ClientApp that follows the documented client contract gives each
partition a fixed update ``U_is`` (and so a known norm), a loss and a size; the
strategies' probabilities are compared with the closed forms, and many rounds
from the same global model check that the applied step is unbiased and less
variable than uniform sampling's. Tolerances are ``Z`` standard errors.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from numpy.typing import NDArray

from flwr_importance.aggregation.variance_reduced import size_fractions
from flwr_importance.protocol import (
    UPDATE_RECORD,
)
from flwr_importance.sampling.variance_reduced import (
    aocs_probs,
    mmfl_probs,
    optimal_client_probs,
)
from flwr_importance.strategies.arrays import flatten
from flwr_importance.strategies.mmfl import (
    MultiModelSampling,
    pack_models,
    unpack_models,
)
from flwr_importance.strategies.ocs import OptimalClientSampling
from flwr_importance.tooling.testing import InProcessGrid

Z = 5.0
NUM_CLIENTS = 12
NUM_MODELS = 3
DIMENSION = 4
ROUNDS = 300

rng = np.random.default_rng(2024)
#: U_is: norms spread over two orders of magnitude, so sampling matters.
UPDATES = np.exp(rng.normal(0, 1.5, (NUM_CLIENTS, NUM_MODELS, 1))) * rng.normal(
    size=(NUM_CLIENTS, NUM_MODELS, DIMENSION)
)
SIZES = rng.integers(5, 100, (NUM_CLIENTS, NUM_MODELS))
LOSSES = rng.uniform(0.1, 3.0, (NUM_CLIENTS, NUM_MODELS))


def crafted_app() -> ClientApp:
    """A ClientApp answering the optimal-sampling contract with fixed values."""
    app = ClientApp()

    def partition(context: Context) -> int:
        return int(context.node_config["partition-id"])

    def models_in(message: Message) -> list[int]:
        return [int(name.split("-")[1]) for name in message.content.array_records]

    def reply(message: Message, metrics: dict[str, float]) -> Message:
        return Message(RecordDict({"m": MetricRecord(dict(metrics))}), reply_to=message)

    @app.query("norm")
    def norm(message: Message, context: Context) -> Message:
        i = partition(context)
        metrics: dict[str, float] = {}
        for s in models_in(message):
            metrics[f"update-norm-{s}"] = float(np.linalg.norm(UPDATES[i, s]))
            metrics[f"num-examples-{s}"] = int(SIZES[i, s])
        return reply(message, metrics)

    @app.query("loss")
    def loss(message: Message, context: Context) -> Message:
        i = partition(context)
        metrics: dict[str, float] = {}
        for s in models_in(message):
            metrics[f"loss-{s}"] = float(LOSSES[i, s])
            metrics[f"num-examples-{s}"] = int(SIZES[i, s])
        return reply(message, metrics)

    @app.query("sizes")
    def sizes(message: Message, context: Context) -> Message:
        i = partition(context)
        return reply(
            message, {f"num-examples-{s}": int(SIZES[i, s]) for s in range(NUM_MODELS)}
        )

    @app.train()
    def train(message: Message, context: Context) -> Message:
        config = message.content.config_records["config"]
        s = int(config["model-index"])  # type: ignore[arg-type]
        content = RecordDict(
            {
                UPDATE_RECORD: ArrayRecord(
                    {"w": Array(UPDATES[partition(context), s])}
                ),
                "metrics": MetricRecord(
                    {"num-examples": 1, "train-loss": 0.5, "model-index": s}
                ),
            }
        )
        return Message(content, reply_to=message)

    return app


def zero_model() -> ArrayRecord:
    return ArrayRecord({"w": Array(np.zeros(DIMENSION))})


@pytest.fixture
def grid() -> Iterator[InProcessGrid]:
    yield InProcessGrid(crafted_app(), NUM_CLIENTS, seed=3, serialize=False)


def probs_by_partition(
    grid: InProcessGrid, node_ids: tuple[int, ...], probs: NDArray[np.float64]
) -> NDArray[np.float64]:
    """The plan's probability rows reordered by partition id."""
    ordered = np.zeros_like(probs)
    for row, node_id in enumerate(node_ids):
        ordered[grid.partition_of(node_id)] = probs[row]
    return ordered


def one_round(strategy, grid: InProcessGrid, arrays: ArrayRecord):  # type: ignore[no-untyped-def]
    messages = strategy.configure_train(1, arrays, ConfigRecord(), grid)
    return strategy.aggregate_train(1, grid.send_and_receive(messages))


@pytest.mark.parametrize("approximate", [False, True])
def test_ocs_probabilities_are_the_closed_form_of_the_reported_norms(
    grid: InProcessGrid, approximate: bool
) -> None:
    strategy = OptimalClientSampling(clients_per_round=4, approximate=approximate)
    one_round(strategy, grid, zero_model())
    assert strategy.plan is not None
    fractions = size_fractions(SIZES[:, 0])
    norms = fractions * np.linalg.norm(UPDATES[:, 0], axis=1)
    expected = aocs_probs(norms, 4) if approximate else optimal_client_probs(norms, 4)
    got = probs_by_partition(grid, strategy.plan.node_ids, strategy.plan.probs)
    np.testing.assert_allclose(got[:, 0], expected, rtol=1e-12)


@pytest.mark.parametrize("variant", ["gradnorm", "loss"])
def test_mmfl_probabilities_are_the_closed_form(
    grid: InProcessGrid, variant: str
) -> None:
    strategy = MultiModelSampling(
        num_models=NUM_MODELS, clients_per_round=5, variant=variant
    )  # type: ignore[arg-type]
    one_round(strategy, grid, pack_models([zero_model()] * NUM_MODELS))
    assert strategy.plan is not None
    scores = np.linalg.norm(UPDATES, axis=2) if variant == "gradnorm" else LOSSES
    expected = mmfl_probs(size_fractions(SIZES) * scores, 5)
    got = probs_by_partition(grid, strategy.plan.node_ids, strategy.plan.probs)
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    assert all(
        strategy.plan.probs[strategy.plan.row_of(node), model] > 0
        for node, model in strategy.plan.assigned.items()
    )


def repeated_steps(
    strategy, grid: InProcessGrid, num_models: int
) -> NDArray[np.float64]:  # type: ignore[no-untyped-def]
    """``ROUNDS`` applied steps from the same zero models, shape (R, S, dim)."""
    start = [zero_model() for _ in range(num_models)]
    arrays = start[0] if num_models == 1 else pack_models(start)
    steps = np.zeros((ROUNDS, num_models, DIMENSION))
    for round_index in range(ROUNDS):
        new_arrays, _ = one_round(strategy, grid, arrays)
        if new_arrays is None:
            continue
        models = [new_arrays] if num_models == 1 else unpack_models(new_arrays)
        steps[round_index] = [flatten(model) for model in models]
    return steps


def assert_unbiased(steps: NDArray[np.float64], full: NDArray[np.float64]) -> None:
    standard_error = steps.std(axis=0) / np.sqrt(len(steps))
    assert np.all(np.abs(steps.mean(axis=0) - full) <= Z * standard_error + 1e-12)


def squared_errors(
    steps: NDArray[np.float64], full: NDArray[np.float64]
) -> NDArray[np.float64]:
    return np.sum((steps - full) ** 2, axis=(1, 2))


def test_ocs_step_is_unbiased_with_the_reported_variance_below_uniform(
    grid: InProcessGrid,
) -> None:
    strategy = OptimalClientSampling(clients_per_round=3, seed=1)
    fractions = size_fractions(SIZES[:, 0])
    full = (fractions @ UPDATES[:, 0])[None, :]
    steps = repeated_steps(strategy, grid, 1)
    assert_unbiased(steps, full)
    errors = squared_errors(steps, full)
    _, metrics = one_round(strategy, grid, zero_model())
    assert metrics is not None
    assert abs(errors.mean() - metrics["variance"]) <= Z * errors.std() / np.sqrt(
        ROUNDS
    )
    assert metrics["variance"] < metrics["uniform-variance"]


def test_mmfl_gradnorm_step_is_unbiased_and_less_variable_than_random(
    grid: InProcessGrid,
) -> None:
    full = np.einsum("is,isd->sd", size_fractions(SIZES), UPDATES)
    optimal = repeated_steps(
        MultiModelSampling(num_models=NUM_MODELS, clients_per_round=5, seed=1),
        grid,
        NUM_MODELS,
    )
    random = repeated_steps(
        MultiModelSampling(
            num_models=NUM_MODELS, clients_per_round=5, variant="random", seed=1
        ),
        grid,
        NUM_MODELS,
    )
    assert_unbiased(optimal, full)
    assert_unbiased(random, full)
    optimal_errors, random_errors = (
        squared_errors(optimal, full),
        squared_errors(random, full),
    )
    gap_error = np.sqrt((optimal_errors.var() + random_errors.var()) / ROUNDS)
    assert random_errors.mean() - optimal_errors.mean() > Z * gap_error


def test_round_robin_rotates_each_clients_model(grid: InProcessGrid) -> None:
    strategy = MultiModelSampling(
        num_models=NUM_MODELS, clients_per_round=NUM_CLIENTS, variant="round-robin"
    )
    arrays = pack_models([zero_model()] * NUM_MODELS)
    strategy.configure_train(1, arrays, ConfigRecord(), grid)
    assert strategy.plan is not None
    first = dict(strategy.plan.assigned)
    strategy.configure_train(2, arrays, ConfigRecord(), grid)
    second = dict(strategy.plan.assigned)
    assert set(first) == set(second) == set(grid.get_node_ids())
    assert all(second[node] == (first[node] + 1) % NUM_MODELS for node in first)


def test_bad_and_unexpected_replies_are_skipped_without_nan(
    grid: InProcessGrid,
) -> None:
    strategy = MultiModelSampling(num_models=NUM_MODELS, clients_per_round=6, seed=4)
    arrays = pack_models([zero_model()] * NUM_MODELS)
    messages = list(strategy.configure_train(1, arrays, ConfigRecord(), grid))
    replies = list(grid.send_and_receive(messages))
    poisoned = replies[0]
    poisoned.content[UPDATE_RECORD] = ArrayRecord(
        {"w": Array(np.full(DIMENSION, np.nan))}
    )
    outsider = Message(replies[1].content, reply_to=messages[1])
    outsider.metadata.__dict__["_src_node_id"] = 999
    new_arrays, metrics = strategy.aggregate_train(1, [*replies, outsider])
    assert new_arrays is not None and metrics is not None
    assert metrics["num-received"] == len(replies) - 1
    assert all(
        np.all(np.isfinite(flatten(model))) for model in unpack_models(new_arrays)
    )


def test_pack_and_unpack_models_round_trip() -> None:
    models = [zero_model(), ArrayRecord({"a": Array(np.ones((2, 3)))})]
    unpacked = unpack_models(pack_models(models))
    assert [list(model.keys()) for model in unpacked] == [["w"], ["a"]]
    np.testing.assert_array_equal(flatten(unpacked[1]), np.ones(6))
    with pytest.raises(ValueError, match="packed model key"):
        unpack_models(zero_model())
