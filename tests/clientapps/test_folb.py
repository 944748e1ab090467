"""FOLB's ClientApp handlers and a whole in-process run of ``strategy = "folb"``."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from flwr_importance.clientapps import LocalTask
from flwr_importance.clientapps.folb import (
    make_folb_gradient_handler,
    make_folb_train_handler,
)
from flwr_importance.clientapps.local_task import make_train_handler
from flwr_importance.strategies.arrays import flatten
from flwr_importance.tasks import Objective, build_model, full_gradient, load_dataset
from flwr_importance.tooling.testing import InProcessGrid
from simulations.inprocess import load_preset, run_inprocess

DATA = load_dataset("synthetic-1-1", 4, seed=0)
MU = 0.5


def task_factory(context: Context) -> LocalTask:
    partition_id = int(context.node_config["partition-id"])
    partition = DATA.partitions[partition_id]
    return LocalTask(
        model=build_model("logreg", DATA.input_shape, DATA.num_outputs, seed=0),
        objective=Objective("classification"),
        x=partition.x,
        y=partition.y,
        lr=0.05,
        batch_size=10,
        local_steps=8,
        heterogeneous_steps=True,
        seed=partition_id,
    )


def client_app(train_handler_factory: object) -> ClientApp:
    app = ClientApp()
    app.train()(train_handler_factory(task_factory))  # type: ignore[operator]
    app.query("gradient")(make_folb_gradient_handler(task_factory))
    return app


def global_model() -> torch.nn.Module:
    model = build_model("logreg", DATA.input_shape, DATA.num_outputs, seed=1)
    return model


def ask(grid: InProcessGrid, message_type: str, node_id: int) -> Message:
    content = RecordDict(
        {
            "arrays": ArrayRecord(global_model().state_dict()),
            "config": ConfigRecord({"server-round": 3, "proximal-mu": MU}),
        }
    )
    (reply,) = grid.send_and_receive([Message(content, node_id, message_type)])
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    return reply


@pytest.mark.parametrize("partition_id", [0, 1])
def test_train_reply_is_fedprox_update_gradient_and_gamma(partition_id: int) -> None:
    folb_grid = InProcessGrid(client_app(make_folb_train_handler), 4, seed=0)
    fedprox_grid = InProcessGrid(client_app(make_train_handler), 4, seed=0)
    node = sorted(folb_grid.get_node_ids(), key=folb_grid.partition_of)[partition_id]
    reply = ask(folb_grid, "train", node)
    fedprox_reply = ask(fedprox_grid, "train", node)

    start = global_model()
    partition = DATA.partitions[partition_id]
    objective = Objective("classification")
    gradient = full_gradient(start, partition.x, partition.y, objective)
    trained = flatten(fedprox_reply.content.array_records["arrays"])
    initial = flatten(ArrayRecord(start.state_dict()))
    # The local solve is FedProx's, step for step: w^t + dw_k == FedProx's model.
    update = flatten(reply.content.array_records["update"])
    np.testing.assert_allclose(initial + update, trained, atol=1e-6)
    np.testing.assert_allclose(
        flatten(reply.content.array_records["gradient"]),
        np.concatenate([g.numpy().ravel() for g in gradient]),
        atol=1e-6,
    )
    # gamma_k = ||grad F_k(w_k) + mu (w_k - w^t)|| / ||grad F_k(w^t)||, clipped.
    model = global_model()
    model.load_state_dict(
        fedprox_reply.content.array_records["arrays"].to_torch_state_dict()
    )
    trained_gradient = full_gradient(model, partition.x, partition.y, objective)
    flat_trained_gradient = np.concatenate(
        [g.numpy().ravel() for g in trained_gradient]
    )
    numerator = np.linalg.norm(flat_trained_gradient + MU * update)
    denominator = math.sqrt(sum(float(g.pow(2).sum()) for g in gradient))
    metrics = reply.content.metric_records["metrics"]
    assert metrics["gamma"] == pytest.approx(
        min(numerator / denominator, 1.0), rel=1e-5
    )
    assert metrics["num-examples"] == len(partition.x)
    assert (
        metrics["num-steps"]
        == fedprox_reply.content.metric_records["metrics"]["num-steps"]
    )


def test_gradient_query_only_computes_the_gradient() -> None:
    grid = InProcessGrid(client_app(make_folb_train_handler), 4, seed=0)
    node = sorted(grid.get_node_ids(), key=grid.partition_of)[2]
    reply = ask(grid, "query.gradient", node)
    assert set(reply.content.array_records) == {"gradient"}
    partition = DATA.partitions[2]
    gradient = full_gradient(
        global_model(), partition.x, partition.y, Objective("classification")
    )
    np.testing.assert_allclose(
        flatten(reply.content.array_records["gradient"]),
        np.concatenate([g.numpy().ravel() for g in gradient]),
        atol=1e-6,
    )


@pytest.mark.parametrize("mode", ["single-set", "two-set"])
def test_folb_preset_learns_in_process(mode: str, tmp_path: object) -> None:
    overrides = {
        **load_preset("folb-digits"),
        "num-server-rounds": 4,
        "clients-per-round": 4,
        "partitioning": "iid",  # a learning signal within 4 rounds
        "folb-mode": mode,
        "folb-psi": 0.01,
        "output-dir": str(tmp_path),
    }
    rows, grid = run_inprocess(overrides, num_clients=8)
    assert [row["round"] for row in rows] == list(range(5))
    assert rows[-1]["loss"] < rows[0]["loss"]
    query_messages = [
        rec for rec in grid.wire_log if rec.message_type == "query.gradient"
    ]
    assert bool(query_messages) == (mode == "two-set")
