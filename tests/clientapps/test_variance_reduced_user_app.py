"""OCS, AOCS and MMFL with the user's own quickstart-shaped train function.

The user's ``@app.train()`` gets ``KeptUpdateMod`` and the app
``add_norm_query`` (MMFL: also ``add_loss_query`` and
``add_model_sizes_query``); the real strategies run through the in-process
grid, every message crossing the wire as protobuf.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import Result
from torch.utils.data import DataLoader

from flwr_importance.clientapps import register_handlers
from flwr_importance.clientapps.loss import add_loss_query
from flwr_importance.clientapps.variance_reduced import (
    KeptUpdateMod,
    add_model_sizes_query,
    add_norm_query,
    make_ocs_handlers,
)
from flwr_importance.protocol import UPDATE_RECORD, model_record_name
from flwr_importance.strategies.arrays import flatten
from flwr_importance.strategies.mmfl import (
    MultiModelSampling,
    pack_models,
    unpack_models,
)
from flwr_importance.strategies.ocs import OptimalClientSampling
from flwr_importance.tasks import Objective
from flwr_importance.tooling.testing import InProcessGrid
from tests.clientapps import quickstart_user
from tests.clientapps.quickstart_user import (
    BATCH_SIZE,
    CUDA,
    DEVICES,
    LR,
    TRAIN_CALLS,
    Net,
    assert_trained,
    initial_arrays,
    load_trainset,
    partition_size,
    ready_made_task,
    run_rounds,
    user_evaluate,
    user_train,
)

NUM_NODES = 5


def optimal_app() -> ClientApp:
    """The quickstart app plus the OCS/MMFL lines."""
    app = ClientApp()
    app.train(mods=[KeptUpdateMod(train_loss_key="train_loss")])(user_train)
    app.evaluate()(user_evaluate)
    add_norm_query(app, user_train, train_loss_key="train_loss")
    add_loss_query(app, user_evaluate, loss_key="eval_loss")
    add_model_sizes_query(
        app,
        num_examples=lambda context, model_index: partition_size(
            int(context.node_config["partition-id"])
        ),
    )
    return app


def make_grid(device: str = "cpu") -> InProcessGrid:
    return InProcessGrid(optimal_app(), NUM_NODES, {"device": device}, seed=4)


def norm_query(
    node_id: int, arrays: ArrayRecord, config: dict[str, int | float]
) -> Message:
    """OCS's norm query of model 0 at ``arrays``."""
    content = RecordDict(
        {"config": ConfigRecord(dict(config)), model_record_name(0): arrays}
    )
    return Message(content, node_id, "query.norm")


def kept_update_train(node_id: int, server_round: int) -> Message:
    """The train message asking a sampled node for its kept update of model 0."""
    config = {"server-round": server_round, "model-index": 0, "kept-update": True}
    return Message(RecordDict({"config": ConfigRecord(config)}), node_id, "train")


def user_update(partition_id: int, arrays: ArrayRecord, device: str) -> np.ndarray:
    """What the user's own loop moves the model by, run here directly."""
    model = Net()
    model.load_state_dict(arrays.to_torch_state_dict())
    loader = DataLoader(load_trainset(partition_id), batch_size=BATCH_SIZE)
    quickstart_user.train(model, loader, 1, LR, device)
    trained = ArrayRecord(model.state_dict())
    return flatten(trained) - flatten(arrays)


def ocs_rounds(grid: InProcessGrid) -> tuple[Result, ArrayRecord]:
    """Two OCS rounds on ``grid``, every sampled node's reply used each round."""
    arrays = initial_arrays()
    strategy = OptimalClientSampling(clients_per_round=2, seed=0)
    result = run_rounds(strategy, grid, arrays)
    for server_round in (1, 2):
        metrics = result.train_metrics_clientapp[server_round]
        assert metrics["num-received"] == metrics["num-sampled"]
    return result, arrays


def run_ocs(device: str) -> None:
    TRAIN_CALLS.clear()
    result, arrays = ocs_rounds(make_grid(device))
    for server_round in (1, 2):
        assert result.train_metrics_clientapp[server_round]["num-sampled"] > 0  # type: ignore[operator]
    assert_trained(result, arrays)
    # Each node trained once per round, in the norm query, with the user's
    # optimizer, the server's lr, on the user's device; sampled nodes did not
    # train again to send their kept update.
    assert len(TRAIN_CALLS) == 2 * NUM_NODES
    assert {call.lr for call in TRAIN_CALLS} == {LR}
    assert {(call.optimizer, call.momentum) for call in TRAIN_CALLS} == {("SGD", 0.9)}
    assert {call.device.split(":")[0] for call in TRAIN_CALLS} == {device}


def test_ocs_runs_on_the_users_train_function() -> None:
    run_ocs("cpu")


@CUDA
def test_ocs_runs_on_the_users_train_function_on_cuda() -> None:
    run_ocs("cuda")


@pytest.mark.parametrize("device", DEVICES)
def test_the_kept_update_is_the_users_training_step(device: str) -> None:
    grid = make_grid(device)
    node_id = next(iter(grid.get_node_ids()))
    arrays = initial_arrays()
    query = norm_query(node_id, arrays, {"server-round": 1, "lr": LR})
    (norm_reply,) = grid.send_and_receive([query])
    norm_metrics = norm_reply.content.metric_records["metrics"]
    partition_id = grid.partition_of(node_id)
    assert norm_metrics["num-examples-0"] == partition_size(partition_id)
    assert np.isfinite(norm_metrics["train-loss-0"])
    train = kept_update_train(node_id, server_round=1)
    (train_reply,) = grid.send_and_receive([train])
    assert not train_reply.has_error()
    update = flatten(train_reply.content.array_records[UPDATE_RECORD])
    expected = user_update(partition_id, arrays, "cpu")
    assert np.linalg.norm(expected) > 0
    # Momentum SGD from the same start on the same batches: the same step,
    # on the CPU or on the user's GPU.
    np.testing.assert_allclose(update, expected, rtol=1e-4, atol=1e-6)
    assert np.linalg.norm(update) == pytest.approx(norm_metrics["update-norm-0"])
    metrics = train_reply.content.metric_records["metrics"]
    assert (
        metrics["train-loss"] == metrics["train_loss"] == norm_metrics["train-loss-0"]
    )
    assert metrics["model-index"] == 0
    assert metrics["num-examples"] == partition_size(partition_id)


@pytest.mark.parametrize("variant", ["gradnorm", "loss", "random"])
def test_mmfl_trains_each_model_with_the_users_functions(variant: str) -> None:
    widths = [4, 6]  # model s is Net(4 + 2 s), as the user's code picks it
    grid = make_grid()
    strategy = MultiModelSampling(
        num_models=len(widths), clients_per_round=3, variant=variant, seed=1
    )  # type: ignore[arg-type]
    start = [initial_arrays(width) for width in widths]
    result = run_rounds(strategy, grid, pack_models(start))
    for server_round in (1, 2):
        metrics = result.train_metrics_clientapp[server_round]
        assert metrics["num-received"] == metrics["num-sampled"]
        assert metrics["num-sampled"] > 0  # type: ignore[operator]
    final = unpack_models(result.arrays)
    moved = [
        np.linalg.norm(flatten(after) - flatten(before))
        for before, after in zip(start, final, strict=True)
    ]
    assert all(np.isfinite(moved)) and max(moved) > 0


def test_plain_train_messages_pass_through_the_mod() -> None:
    """A FedAvg train message (no kept-update) reaches the user's function as is."""
    grid = make_grid()
    node_id = next(iter(grid.get_node_ids()))
    message = Message(
        RecordDict({"arrays": initial_arrays(), "config": ConfigRecord({"lr": LR})}),
        node_id,
        "train",
    )
    (reply,) = grid.send_and_receive([message])
    assert not reply.has_error()
    assert set(reply.content.array_records) == {"arrays"}
    assert set(reply.content.metric_records["metrics"]) == {
        "train_loss",
        "num-examples",
    }


def test_the_lines_the_missing_client_side_error_names_run_ocs_as_they_are() -> None:
    """``KeptUpdateMod()`` and ``add_norm_query(app, train)``, defaults and all.

    The quickstart's train replies ``train_loss``, not ``train-loss``: the
    train loss is then not reported, and everything else works.
    """
    app = ClientApp()
    app.train(mods=[KeptUpdateMod()])(user_train)
    add_norm_query(app, user_train)
    result, arrays = ocs_rounds(InProcessGrid(app, NUM_NODES, {}, seed=4))
    for server_round in (1, 2):
        assert "train-loss" not in result.train_metrics_clientapp[server_round]
    assert np.linalg.norm(flatten(result.arrays) - flatten(arrays)) > 0


def test_a_lost_kept_update_is_refused() -> None:
    mod = KeptUpdateMod(train_loss_key="train_loss")
    context = Context(0, 1, {"partition-id": 0}, RecordDict(), {})
    grid = make_grid()
    node_id = next(iter(grid.get_node_ids()))
    message = kept_update_train(node_id, server_round=3)
    (reply,) = grid.send_and_receive([message])
    assert reply.has_error() and "no kept update" in str(reply.error.reason)
    with pytest.raises(ValueError, match="no kept update"):
        mod(message, context, user_train)


def ready_made_ocs_update(device: str) -> np.ndarray:
    """The kept update of the ready-made OCS handlers on one node."""
    task = ready_made_task(
        device,
        Objective("classification", l2=0.01),
        lr=LR,
        batch_size=BATCH_SIZE,
        local_steps=3,
    )
    app = register_handlers(ClientApp(), make_ocs_handlers(task))
    grid = InProcessGrid(app, 1, {}, seed=0)
    (node_id,) = grid.get_node_ids()
    query = norm_query(node_id, initial_arrays(), {"server-round": 1})
    train = kept_update_train(node_id, server_round=1)
    (norm_reply,) = grid.send_and_receive([query])
    (train_reply,) = grid.send_and_receive([train])
    assert not norm_reply.has_error() and not train_reply.has_error()
    return flatten(train_reply.content.array_records[UPDATE_RECORD])


@pytest.mark.parametrize("device", DEVICES)
def test_the_ready_made_handlers_train_on_the_models_device(device: str) -> None:
    update = ready_made_ocs_update(device)
    assert np.linalg.norm(update) > 0
    np.testing.assert_allclose(
        update, ready_made_ocs_update("cpu"), rtol=1e-4, atol=1e-6
    )
