"""The optimal-sampling ClientApp handlers with real local training.

Nodes run the simulation's ClientApp on the offline digits (logistic
regression, a few local steps) through the in-process grid.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from flwr_importance.protocol import (
    UPDATE_RECORD,
    model_record_name,
)
from flwr_importance.strategies.arrays import flatten
from flwr_importance.strategies.mmfl import MultiModelSampling
from flwr_importance.strategies.ocs import OptimalClientSampling
from flwr_importance.tooling.testing import InProcessGrid
from simulations.client_app import app as client_app
from simulations.config import ExperimentConfig
from simulations.inprocess import (
    PRESETS_DIR,
    load_preset,
    resolve_run_config,
    run_inprocess,
)
from simulations.methods import load_method
from simulations.methods.mmfl import parse_tasks
from simulations.task import federated_data, global_model

NUM_NODES = 6
OVERRIDES: dict[str, bool | int | float | str] = {
    "strategy": "ocs",
    "model": "logreg",
    "local-steps": 3,
    "num-server-rounds": 1,
    "clients-per-round": 3,
}


@pytest.fixture
def grid() -> InProcessGrid:
    return InProcessGrid(client_app, NUM_NODES, resolve_run_config(OVERRIDES), seed=1)


def initial_model() -> ArrayRecord:
    config = ExperimentConfig.from_run_config(resolve_run_config(OVERRIDES))
    return ArrayRecord(
        global_model(config, federated_data(config, NUM_NODES)).state_dict()
    )


def test_a_restarted_node_without_its_kept_update_is_skipped(
    grid: InProcessGrid,
) -> None:
    # m = N: every node that reports a positive norm is sampled surely.
    strategy = OptimalClientSampling(clients_per_round=NUM_NODES)
    arrays = initial_model()
    messages = list(strategy.configure_train(1, arrays, ConfigRecord(), grid))
    assert len(messages) == NUM_NODES
    restarted = messages[0].metadata.dst_node_id
    state = grid.node_state(restarted)
    for key in list(state.keys()):
        del state[key]
    replies = list(grid.send_and_receive(messages))
    failed = [reply for reply in replies if reply.has_error()]
    assert [reply.metadata.src_node_id for reply in failed] == [restarted]
    assert "no kept update" in failed[0].error.reason
    new_arrays, metrics = strategy.aggregate_train(1, replies)
    assert new_arrays is not None and metrics is not None
    assert metrics["num-received"] == NUM_NODES - 1
    step = flatten(new_arrays) - flatten(arrays)
    assert np.all(np.isfinite(step)) and np.linalg.norm(step) > 0


def test_kept_update_matches_the_reported_norm_and_is_never_sent_stale(
    grid: InProcessGrid,
) -> None:
    node_id = next(iter(grid.get_node_ids()))
    arrays = initial_model()
    query = Message(
        RecordDict(
            {
                "config": ConfigRecord({"server-round": 1}),
                model_record_name(0): arrays,
            }
        ),
        node_id,
        "query.norm",
    )
    (norm_reply,) = grid.send_and_receive([query])
    reported = norm_reply.content.metric_records["metrics"]["update-norm-0"]

    def fetch(server_round: int) -> Message:
        config = {"server-round": server_round, "model-index": 0, "kept-update": True}
        message = Message(
            RecordDict({"config": ConfigRecord(config)}), node_id, "train"
        )
        (reply,) = grid.send_and_receive([message])
        return reply

    sent = fetch(1)
    assert not sent.has_error()
    update = flatten(sent.content.array_records[UPDATE_RECORD])
    assert np.linalg.norm(update) == pytest.approx(reported, rel=1e-9)
    stale = fetch(2)
    assert stale.has_error() and "stale" in stale.error.reason


def test_mmfl_history_has_per_model_metrics_and_their_means(tmp_path) -> None:  # type: ignore[no-untyped-def]
    rows, _ = run_inprocess(
        {
            **OVERRIDES,
            "strategy": "mmfl",
            "mmfl-variant": "loss",
            "mmfl-tasks": "digits:iid,synthetic-1-1:::mlp",
            "num-server-rounds": 2,
            "output-dir": str(tmp_path),
        },
        NUM_NODES,
    )
    assert [row["round"] for row in rows] == [0, 1, 2]
    for row in rows:
        assert row["accuracy"] == pytest.approx(
            (row["accuracy-0"] + row["accuracy-1"]) / 2
        )
        assert row["loss"] == pytest.approx((row["loss-0"] + row["loss-1"]) / 2)
    assert (tmp_path / "history.json").exists()


def test_parse_tasks_reads_dataset_partitioning_parameter_and_model() -> None:
    assert parse_tasks(
        "digits:pathological:3, digits:lognormal:1.8,synthetic-1-1:::mlp"
    ) == [
        {"dataset": "digits", "partitioning": "pathological", "classes-per-client": 3},
        {"dataset": "digits", "partitioning": "lognormal", "lognormal-sigma": 1.8},
        {"dataset": "synthetic-1-1", "model": "mlp"},
    ]
    with pytest.raises(ValueError, match="takes no parameter"):
        parse_tasks("digits:iid:3")
    with pytest.raises(ValueError, match="dataset"):
        parse_tasks("digits:iid::mlp:extra")


@pytest.mark.parametrize(
    "preset",
    sorted(
        path.stem
        for pattern in ("ocs-*.toml", "mmfl-*.toml")
        for path in PRESETS_DIR.glob(pattern)
    ),
)
def test_presets_are_valid_run_configs(preset: str) -> None:
    run_config = resolve_run_config(load_preset(preset))
    config = ExperimentConfig.from_run_config(run_config)
    strategy = load_method(config.strategy).build_strategy(config, 100)
    if config.strategy == "mmfl":
        assert isinstance(strategy, MultiModelSampling)
        assert strategy.num_models == len(parse_tasks(str(run_config["mmfl-tasks"])))
