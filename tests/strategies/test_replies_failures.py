"""Per-node state and unbiasedness of the strategies when 30% of replies fail.

Complements ``test_reliability_completion.py`` (every strategy completes its
rounds, names the failed nodes and improves the model under
:func:`~flwr_importance.tooling.testing.fault_injection.fault_injection_mod`):

* **State**: after a faulty run of the real app, each strategy's per-node
  tables hold exactly the nodes the wire log shows answering (a node whose
  size or norm query failed is not in them), with consistent values.
* **Unbiasedness** (Monte Carlo, fixed seeds, tolerance ``Z`` standard errors
  of the mean over the rounds): a crafted ClientApp behind the same fault mod
  returns a fixed update ``u_k`` per node, so the expected step is known.

  - ISFedAvg (mean of the models that arrived) stays unbiased for
    ``(1/K) sum_k u_k``: failures strike independently of the node, so the
    arrived replies are a uniform subset of the selected ones. The same draws
    with the missing updates counted as zero are shown biased (the test can
    fail).
  - MD sampling (FedSampling's size-weighted baseline: mean over the arrived
    draws) stays unbiased for the size-weighted mean over the nodes whose size
    is known.
  - OCS (Horvitz-Thompson over the arrived updates) accepts a bias, as its
    docstring says: nothing is made up for a missing term, so the expected
    step shrinks to ``(1 - rate)`` times the full-participation step.

Rounds in which no reply arrives leave the model unchanged; the unbiasedness
statements are conditional on at least one reply, and those rounds are left
out of the means (there are few: ``rate ** clients_per_round``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

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
from flwr.serverapp.strategy import Strategy
from numpy.typing import NDArray

from flwr_importance import registry
from flwr_importance.protocol import (
    ISFEDAVG_CLIENT_PROB,
    ISFEDAVG_GRADIENT_SQ_NORM,
    ISFEDAVG_NUM_CLIENTS,
    ISFEDAVG_SIGMA2,
    UPDATE_RECORD,
)
from flwr_importance.strategies._multiset import MultisetSampling
from flwr_importance.strategies.arrays import flatten
from flwr_importance.strategies.isfedavg import ISFedAvg
from flwr_importance.strategies.md import MDSampling
from flwr_importance.strategies.ocs import OptimalClientSampling
from flwr_importance.tooling.testing import InProcessGrid
from flwr_importance.tooling.testing.fault_injection import fault_injection_mod
from simulations import methods
from simulations.inprocess import run_inprocess

Z = 4.0
FAULT_RATE = 0.3
NUM_NODES = 10
DIMENSION = 3
#: Fault-mod settings: every kind, timeouts lost at once (no waiting in process).
FAULTS: dict[str, bool | int | float | str] = {
    "fault-rate": FAULT_RATE,
    "fault-kinds": "raise,timeout,silent",
    "fault-seed": 11,
    "fault-delay": 0.0,
}

_rng = np.random.default_rng(2026)
#: u_k, each node's fixed update, and its size n_k (by partition id).
UPDATES = _rng.normal(size=(NUM_NODES, DIMENSION)) * _rng.lognormal(
    0, 1, (NUM_NODES, 1)
)
SIZES = _rng.integers(5, 200, NUM_NODES)


# -- the wire log: which nodes really answered -----------------------------------
def good_replies(grid: InProcessGrid, message_type: str) -> list[tuple[int, Message]]:
    """``(server round, reply)`` of every non-error, non-empty reply of a type."""
    rounds: dict[str, int] = {}
    replies = []
    for record in grid.wire_log:
        if record.message_type != message_type:
            continue
        message = record.message()
        if record.direction == "to-node":
            config = message.content.config_records.get("config", ConfigRecord())
            rounds[message.metadata.message_id] = int(config.get("server-round", 0))  # type: ignore[arg-type]
        elif not message.has_error() and message.content.metric_records:
            replies.append((rounds[message.metadata.reply_to_message_id], message))
    return replies


def answered(grid: InProcessGrid, message_type: str, server_round: int) -> set[int]:
    """Nodes with a good reply of ``message_type`` in ``server_round``."""
    return {
        reply.metadata.src_node_id
        for round_, reply in good_replies(grid, message_type)
        if round_ == server_round
    }


# -- state after a faulty run of the real app -----------------------------------------
@pytest.fixture
def faulty_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Callable[..., tuple[Strategy, InProcessGrid]]:
    """Run a method of the app with 30% faults; return its strategy and grid."""

    def run(strategy_name: str, **overrides: bool | int | float | str) -> tuple:
        method = methods.load_method(strategy_name)
        built: list[Strategy] = []
        build = method.build_strategy

        def keep(config, num_clients):  # type: ignore[no-untyped-def]
            built.append(build(config, num_clients))
            return built[-1]

        monkeypatch.setattr(method, "build_strategy", keep)
        rows, grid = run_inprocess(
            {
                "strategy": strategy_name,
                "num-server-rounds": 3,
                "clients-per-round": 5,
                "local-steps": 2,
                "output-dir": str(tmp_path),
                **FAULTS,
                **overrides,
            },
            num_clients=NUM_NODES,
        )
        assert len(rows) == 4 and np.isfinite(rows[-1]["loss"])
        return built[0], grid

    return run


def test_isfedavg_tables_cover_the_connected_nodes_and_stay_normalized(
    faulty_run: Callable[..., tuple[ISFedAvg, InProcessGrid]],
) -> None:
    strategy, grid = faulty_run("isfedavg")
    connected = set(grid.get_node_ids())
    for table in (strategy.client_probs, strategy.local_steps, strategy.batch_sizes):
        assert set(table) == connected
    probs = np.array(list(strategy.client_probs.values()))
    assert np.isclose(probs.sum(), 1.0)
    floor = strategy.min_relative_client_prob / len(connected)
    assert np.all(np.isfinite(probs)) and probs.min() >= floor * (1 - 1e-9)
    # Failures happened, yet the probabilities moved off uniform (eq. 28 ran).
    assert len(answered(grid, "train", 3)) < 5
    assert probs.max() > 1.0 / len(connected) + 1e-6


#: Every method keeping a size table (MD, clustered: Algorithm 2, which also
#: keeps representative gradients; Power-of-Choice).
SIZE_TABLE_RUNS = [
    (spec.name, {"clustered-method": "similarity"} if spec.name == "clustered" else {})
    for spec in registry.methods()
    if issubclass(spec.strategy, MultisetSampling)
]


@pytest.mark.parametrize(("strategy_name", "overrides"), SIZE_TABLE_RUNS)
def test_size_tables_hold_exactly_the_nodes_that_reported_a_size(
    faulty_run: Callable[..., tuple[Strategy, InProcessGrid]],
    strategy_name: str,
    overrides: dict[str, str],
) -> None:
    strategy, grid = faulty_run(strategy_name, **overrides)
    reported = {
        reply.metadata.src_node_id: int(reply.content["metrics"]["num-examples"])  # type: ignore[arg-type]
        for _, reply in good_replies(grid, "query.sizes")
    }
    assert 0 < len(reported) < NUM_NODES, "30% faults should hit some size query"
    assert isinstance(strategy, MultisetSampling)
    assert strategy.sizes == reported
    drawn = set(strategy.drawn_counts)
    assert drawn <= set(reported), "only nodes with a known size are drawn"
    if strategy_name == "clustered":
        gradients = strategy.gradients  # type: ignore[attr-defined]
        assert gradients.node_ids == sorted(reported)
        trained = {
            reply.metadata.src_node_id for _, reply in good_replies(grid, "train")
        }
        for node_id in reported:
            has_gradient = bool(np.any(gradients.gradient(node_id)))
            assert has_gradient == (node_id in trained), node_id
        distances = gradients.distances()
        assert np.all(np.isfinite(distances))
        np.testing.assert_array_equal(distances, distances.T)


def test_ocs_plan_covers_exactly_the_nodes_whose_norm_query_arrived(
    faulty_run: Callable[..., tuple[OptimalClientSampling, InProcessGrid]],
) -> None:
    strategy, grid = faulty_run("ocs")
    plan = strategy.plan
    assert plan is not None and plan.server_round == 3
    assert set(plan.node_ids) == answered(grid, "query.norm", 3)
    assert len(plan.node_ids) < NUM_NODES
    assert set(plan.assigned) <= set(plan.node_ids)
    np.testing.assert_allclose(plan.fractions.sum(axis=0), 1.0)
    assert np.all((plan.probs >= 0) & (plan.probs <= 1))


def test_fedsampling_estimate_counts_only_the_size_replies_that_arrived(
    faulty_run: Callable[..., tuple[Strategy, InProcessGrid]],
) -> None:
    strategy, grid = faulty_run("fedsampling")
    plan = strategy.plan  # type: ignore[attr-defined]
    size_replies = answered(grid, "query.sizes", 3)
    assert plan.num_size_replies == len(size_replies) < NUM_NODES
    assert np.isfinite(plan.estimated_total_size)


def test_folb_round_draws_only_connected_nodes(
    faulty_run: Callable[..., tuple[Strategy, InProcessGrid]],
) -> None:
    strategy, grid = faulty_run("folb")
    draws = strategy.plan  # type: ignore[attr-defined]
    assert draws.server_round == 3
    assert set(draws.train_draws) <= set(grid.get_node_ids())
    assert all(np.all(np.isfinite(a.numpy())) for a in draws.arrays.values())


# -- Monte Carlo: the reweighting by what arrived ---------------------------------
def crafted_app() -> ClientApp:
    """Fixed per-partition replies behind the fault mod (the contracts' keys)."""
    app = ClientApp(mods=[fault_injection_mod])

    def partition(context: Context) -> int:
        return int(context.node_config["partition-id"])

    def metrics(values: dict[str, float]) -> RecordDict:
        return RecordDict({"metrics": MetricRecord(dict(values))})

    @app.train()
    def train(message: Message, context: Context) -> Message:
        k = partition(context)
        config = message.content.config_records["config"]
        if "kept-update" in config:  # OCS: send the update kept from the query
            content = metrics({"num-examples": 1, "train-loss": 0.5, "model-index": 0})
            content[UPDATE_RECORD] = ArrayRecord({"w": Array(UPDATES[k])})
            return Message(content, reply_to=message)
        step = UPDATES[k]
        if ISFEDAVG_CLIENT_PROB in config:  # ISFedAvg: the client scales by 1/(K p_k)
            num_clients = float(config[ISFEDAVG_NUM_CLIENTS])  # type: ignore[arg-type]
            step = step / (num_clients * float(config[ISFEDAVG_CLIENT_PROB]))  # type: ignore[arg-type]
        content = metrics(
            {
                ISFEDAVG_SIGMA2: 1.0,
                ISFEDAVG_GRADIENT_SQ_NORM: 1.0,
                # The size query's value: MD sampling refreshes sizes from it.
                "num-examples": int(SIZES[k]),
            }
        )
        received = message.content.array_records["arrays"]["w"].numpy()
        content["arrays"] = ArrayRecord({"w": Array(received + step)})
        return Message(content, reply_to=message)

    @app.query("sizes")
    def sizes(message: Message, context: Context) -> Message:
        size = int(SIZES[partition(context)])
        return Message(metrics({"num-examples": size}), reply_to=message)

    @app.query("norm")
    def norm(message: Message, context: Context) -> Message:
        k = partition(context)
        values = {
            "update-norm-0": float(np.linalg.norm(UPDATES[k])),
            "num-examples-0": int(SIZES[k]),
        }
        return Message(metrics(values), reply_to=message)

    return app


@pytest.fixture
def grid() -> Iterator[InProcessGrid]:
    yield InProcessGrid(crafted_app(), NUM_NODES, FAULTS, seed=5, serialize=False)


def steps(
    strategy: Strategy, grid: InProcessGrid, rounds: int
) -> tuple[NDArray[np.float64], list[int]]:
    """The step of each round with at least one usable reply, from ``w = 0``.

    Also returns, per kept round, how many selected nodes' replies arrived.
    """
    zero = ArrayRecord({"w": Array(np.zeros(DIMENSION))})
    kept, arrived = [], []
    for server_round in range(1, rounds + 1):
        messages = list(
            strategy.configure_train(server_round, zero, ConfigRecord(), grid)
        )
        replies = list(grid.send_and_receive(messages))
        arrays, _ = strategy.aggregate_train(server_round, replies)
        if arrays is not None:
            kept.append(flatten(arrays))
            arrived.append(len(answered_now(replies)))
    return np.array(kept), arrived


def answered_now(replies: list[Message]) -> list[Message]:
    """The replies that are neither errors nor empty."""
    return [r for r in replies if not r.has_error() and r.content.metric_records]


def assert_mean_is(samples: NDArray[np.float64], expected: NDArray[np.float64]) -> None:
    """``|mean - expected| <= Z`` standard errors, coordinate-wise."""
    standard_error = samples.std(axis=0, ddof=1) / np.sqrt(len(samples))
    np.testing.assert_array_less(
        np.abs(samples.mean(axis=0) - expected), Z * standard_error
    )


def test_isfedavg_mean_of_the_arrived_models_stays_unbiased(
    grid: InProcessGrid,
) -> None:
    clients_per_round, rounds = 4, 1500
    strategy = ISFedAvg(
        clients_per_round=clients_per_round, seed=1, min_available_nodes=1
    )
    estimates, arrived = steps(strategy, grid, rounds)
    assert rounds - len(estimates) < 3 * FAULT_RATE**clients_per_round * rounds + 3
    assert np.mean(arrived) < clients_per_round * (1 - FAULT_RATE / 2)
    assert_mean_is(estimates, UPDATES.mean(axis=0))
    # Counting the missing updates as zero (a sum / L) would be biased by M/L.
    zero_filled = estimates * (np.array(arrived) / clients_per_round)[:, None]
    standard_error = zero_filled.std(axis=0, ddof=1) / np.sqrt(len(zero_filled))
    bias = np.abs(zero_filled.mean(axis=0) - UPDATES.mean(axis=0))
    assert np.any(bias > Z * standard_error)


def test_md_mean_of_the_arrived_draws_stays_unbiased(grid: InProcessGrid) -> None:
    strategy = MDSampling(clients_per_round=4, seed=2)
    estimates, _ = steps(strategy, grid, 1500)
    known = [grid.partition_of(node_id) for node_id in strategy.sizes]
    assert known
    weights = SIZES[known] / SIZES[known].sum()
    assert_mean_is(estimates, weights @ UPDATES[known])


def test_ocs_step_shrinks_by_the_arrival_rate_as_documented(
    grid: InProcessGrid,
) -> None:
    strategy = OptimalClientSampling(clients_per_round=4, seed=3, min_available_nodes=1)
    full_participation, estimates = [], []
    for server_round in range(1, 1201):
        zero = ArrayRecord({"w": Array(np.zeros(DIMENSION))})
        messages = strategy.configure_train(server_round, zero, ConfigRecord(), grid)
        plan = strategy.plan
        assert plan is not None
        replies = grid.send_and_receive(messages)
        arrays, _ = strategy.aggregate_train(server_round, replies)
        assert arrays is not None  # OCS keeps the model when nothing arrives
        rows = [grid.partition_of(node_id) for node_id in plan.node_ids]
        # The full-participation step over the nodes whose norm arrived.
        full_participation.append(plan.fractions[:, 0] @ UPDATES[rows])
        estimates.append(flatten(arrays))
    errors = np.array(estimates) - (1 - FAULT_RATE) * np.array(full_participation)
    assert_mean_is(errors, np.zeros(DIMENSION))
    unbiased_errors = np.array(estimates) - np.array(full_participation)
    standard_error = unbiased_errors.std(axis=0, ddof=1) / np.sqrt(len(estimates))
    assert np.any(np.abs(unbiased_errors.mean(axis=0)) > Z * standard_error)
