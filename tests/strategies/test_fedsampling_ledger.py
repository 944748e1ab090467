"""FedSampling's privacy ledger in ``history.json``, against the nodes' own count.

The test's ClientApp counts, per node, the size replies it sent; the run's
``history.json`` must charge each node exactly that many times epsilon.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from flwr.app import ConfigRecord, Context, Message, Metadata, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import Result

from flwr_importance import compat
from flwr_importance.clientapps.fedsampling import (
    make_fedsampling_train_handler,
    make_size_query_handler,
)
from flwr_importance.clientapps.private_sizes import NodeLedger, private_size_reply
from flwr_importance.protocol import FEDSAMPLING_SIZE_RESPONSE, SERVER_ROUND
from flwr_importance.sampling.privacy import advanced_composition_epsilon
from flwr_importance.strategies import FedSampling
from flwr_importance.tooling.testing import InProcessGrid
from simulations.client_app import app as simulation_client_app
from simulations.config import ExperimentConfig
from simulations.inprocess import resolve_run_config
from simulations.report import PRIVACY_LEDGER, history_rows, privacy_ledger_of
from simulations.server_app import run_experiment
from simulations.task import local_task

NUM_NODES, ROUNDS, EPSILON = 4, 3, 0.2


def counting_app(sent: Counter[int]) -> ClientApp:
    """Partition 0 replies an impossible size (dropped by the server, but
    sent); partition 1 fails round 2's query (an error reply carries no size).
    ``sent`` counts each node's size replies."""
    size_query = make_size_query_handler(local_task)
    train = make_fedsampling_train_handler(local_task)

    def query(message: Message, context: Context) -> Message:
        partition = context.node_config["partition-id"]
        if (
            partition == 1
            and message.content.config_records["config"][SERVER_ROUND] == 2
        ):
            raise RuntimeError("size query failed on purpose")
        sent[context.node_id] += 1
        if partition == 0:
            content = RecordDict(
                {"metrics": MetricRecord({FEDSAMPLING_SIZE_RESPONSE: 5000})}
            )
            return Message(content, reply_to=message)
        return size_query(message, context)

    app = ClientApp()
    app.query("sizes")(query)
    app.train()(train)
    return app


def test_history_charges_each_node_its_answered_size_queries(tmp_path: Path) -> None:
    run_config = resolve_run_config(
        {
            "strategy": "fedsampling",
            "dataset": "digits",
            "partitioning": "lognormal",
            "model": "logreg",
            "num-supernodes": NUM_NODES,
            "num-server-rounds": ROUNDS,
            "fedsampling-epsilon": EPSILON,
            "output-dir": str(tmp_path),
        }
    )
    sent: Counter[int] = Counter()
    grid = InProcessGrid(counting_app(sent), NUM_NODES, run_config)
    run_experiment(
        grid, ExperimentConfig.from_run_config(run_config), num_clients=NUM_NODES
    )
    rows = json.loads((tmp_path / "history.json").read_text())
    assert [row["round"] for row in rows] == list(range(ROUNDS + 1))
    # The failing node answered one query fewer than the others.
    assert sorted(sent.values()) == [ROUNDS - 1] + [ROUNDS] * (NUM_NODES - 1)
    for row in rows:
        ledger = row[PRIVACY_LEDGER]
        assert (ledger["size-query-epsilon"], ledger["delta-prime"]) == (EPSILON, 1e-6)
        answered = dict(zip(ledger["node-ids"], ledger["size-queries"], strict=True))
        if row["round"] == 0:
            assert answered == {}
            continue
        # By the last round, the ledger holds exactly what the nodes sent.
        if row["round"] == ROUNDS:
            assert answered == dict(sent)
        assert ledger["basic-epsilon"] == pytest.approx(
            [EPSILON * count for count in ledger["size-queries"]]
        )
        assert ledger["advanced-epsilon"] == pytest.approx(
            [
                min(EPSILON * k, float(advanced_composition_epsilon(EPSILON, k, 1e-6)))
                for k in ledger["size-queries"]
            ]
        )
    # Round by round: everyone's count grows by one, but the failing node's in round 2.
    assert [sorted(row[PRIVACY_LEDGER]["size-queries"]) for row in rows[1:]] == [
        [1] * NUM_NODES,
        [1] + [2] * (NUM_NODES - 1),
        [2] + [3] * (NUM_NODES - 1),
    ]


def test_rows_carry_central_dp_and_no_ledger_without_privacy() -> None:
    result = Result(
        evaluate_metrics_serverapp={
            0: MetricRecord({"loss": 1.0}),
            1: MetricRecord({"loss": 0.5}),
        },
        train_metrics_clientapp={
            1: MetricRecord({"dp-epsilon": 1.5, "dp-delta": 1e-5, "num-updates": 3})
        },
    )
    rows = history_rows(result)
    assert PRIVACY_LEDGER not in rows[0]
    assert rows[1][PRIVACY_LEDGER] == {"dp-epsilon": 1.5, "dp-delta": 1e-5}


def test_the_ledger_is_found_through_wrappers_and_on_the_legacy_api() -> None:
    legacy = compat.FedSampling(samples_per_round=8, epsilon=0.5, delta_prime=1e-9)
    assert legacy.privacy_ledger is legacy.strategy.privacy_ledger
    assert legacy.privacy_ledger.delta_prime == 1e-9
    # A wrapper (central DP, the legacy adapter) holds the strategy as .strategy.
    wrapped = FedSampling(samples_per_round=8)
    wrapper = SimpleNamespace(strategy=SimpleNamespace(strategy=wrapped))
    assert privacy_ledger_of(wrapper) is wrapped.privacy_ledger
    assert privacy_ledger_of(SimpleNamespace(strategy=None)) is None
    with pytest.raises(ValueError, match="delta_prime"):
        FedSampling(samples_per_round=8, delta_prime=0.0)


@pytest.mark.parametrize(
    ("epsilon", "said"),
    [(3.0, "never below k eps at this epsilon"), (0.1, "below k eps from k=35")],
)
def test_summary_says_when_the_advanced_column_pays_off(
    epsilon: float, said: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        FedSampling(samples_per_round=8, epsilon=epsilon).summary()
    assert f"Privacy ledger delta': 1e-06 (advanced composition {said})" in caplog.text


def simulation_history(tmp_path: Path, **overrides: object) -> list[dict]:  # type: ignore[type-arg]
    """history.json of a FedSampling run of the simulation app, in process."""
    run_config = resolve_run_config(
        {
            "strategy": "fedsampling",
            "dataset": "digits",
            "partitioning": "lognormal",
            "model": "logreg",
            "num-supernodes": NUM_NODES,
            "num-server-rounds": ROUNDS,
            "fedsampling-epsilon": EPSILON,
            "output-dir": str(tmp_path),
            **overrides,
        }
    )
    grid = InProcessGrid(simulation_client_app, NUM_NODES, run_config)
    run_experiment(
        grid, ExperimentConfig.from_run_config(run_config), num_clients=NUM_NODES
    )
    history: list[dict] = json.loads((tmp_path / "history.json").read_text())  # type: ignore[type-arg]
    # The client-side count: each node's ledger in its own state.
    own = {
        node_id: NodeLedger.load(
            Context(0, node_id, {}, grid.node_state(node_id), {})
        ).answers
        for node_id in grid.get_node_ids()
    }
    assert history[-1][PRIVACY_LEDGER]["node-ledger-answers"] == [
        own[node_id] for node_id in history[-1][PRIVACY_LEDGER]["node-ledger-ids"]
    ]
    return history


def test_history_carries_each_nodes_own_ledger(tmp_path: Path) -> None:
    rows = simulation_history(tmp_path)
    for row in rows[1:]:
        ledger = row[PRIVACY_LEDGER]
        assert ledger["node-ledger-ids"] == ledger["node-ids"]
        # The nodes' own count equals the server's when every reply arrives.
        assert ledger["node-ledger-answers"] == ledger["size-queries"]
        assert ledger["node-ledger-epsilon"] == pytest.approx(ledger["basic-epsilon"])
        assert ledger["reproducible-coins"] == 0.0 and "note" not in ledger


def test_history_says_when_the_coins_were_reproducible(tmp_path: Path) -> None:
    rows = simulation_history(
        tmp_path, **{"fedsampling-unsafe-reproducible-coins": True}
    )
    for row in rows[1:]:
        ledger = row[PRIVACY_LEDGER]
        assert ledger["reproducible-coins"] == 1.0
        assert "not a privacy guarantee" in ledger["note"]


def test_a_node_refuses_a_query_above_its_cap_or_its_budget() -> None:
    handler = make_size_query_handler(local_task)
    run_config = resolve_run_config({"strategy": "fedsampling"})

    def ask(epsilon: float, node_config: dict, state: RecordDict) -> MetricRecord:  # type: ignore[type-arg]
        context = Context(
            0,
            1,
            {"partition-id": 0, "num-partitions": 4, **node_config},
            state,
            run_config,
        )
        config = ConfigRecord({"max-size": 100, "epsilon": epsilon, SERVER_ROUND: 1})
        metadata = Metadata(0, "m", 0, 1, "", "1", 0.0, 3600.0, "query.sizes")
        message = Message(metadata=metadata, content=RecordDict({"config": config}))
        return handler(message, context).content.metric_records["metrics"]

    app_epsilon = float(run_config["fedsampling-epsilon"])
    # Default cap: the app's epsilon; a server asking for more is refused.
    with pytest.raises(ValueError, match="allows at most"):
        ask(app_epsilon + 1, {}, RecordDict())
    # The node's own cap wins over the app's.
    with pytest.raises(ValueError, match="allows at most 1"):
        ask(2.0, {"fedsampling-max-epsilon": 1.0}, RecordDict())
    # A budget: two replies at 1.0 fit in 2.5, the third is refused uncounted.
    state, budget = RecordDict(), {"fedsampling-epsilon-budget": 2.5}
    assert ask(1.0, budget, state)["node-epsilon-spent"] == 1.0
    assert ask(1.0, budget, state)["node-size-answers"] == 2
    with pytest.raises(ValueError, match="above this node's budget"):
        ask(1.0, budget, state)
    assert NodeLedger.load(Context(0, 1, {}, state, {})) == NodeLedger(
        answers=2, epsilon_spent=2.0
    )


def test_the_users_helper_needs_a_cap() -> None:
    state = RecordDict()
    context = Context(0, 1, {}, state, {})
    config = ConfigRecord({"max-size": 100, "epsilon": 1.0, SERVER_ROUND: 1})
    metadata = Metadata(0, "m", 0, 1, "", "1", 0.0, 3600.0, "query.sizes")
    message = Message(metadata=metadata, content=RecordDict({"config": config}))
    with pytest.raises(ValueError, match="client side misconfigured: no epsilon cap"):
        private_size_reply(message, context, num_examples=10)
    reply = private_size_reply(message, context, num_examples=10, max_epsilon=1.0)
    assert reply.content.metric_records["metrics"]["node-size-answers"] == 1
