"""FedSampling with the user's own model, DataLoader, loss and device.

The quickstart-shaped app answers the size query with
``add_private_size_query`` and, in its train function, keeps this round's
samples (``fedsampling_round``), takes ``G_c`` over a DataLoader of them with
its own loss (``fedsampling_gradient``) and replies it alone
(``fedsampling_reply``). The real strategy runs through the in-process grid.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest
import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    Metadata,
    RecordDict,
)
from flwr.app.message import make_message
from flwr.clientapp import ClientApp
from torch import nn
from torch.utils.data import DataLoader, Subset

from flwr_importance.clientapps import LocalTask, register_handlers
from flwr_importance.clientapps.fedsampling import (
    FedSamplingRound,
    add_private_size_query,
    fedsampling_gradient,
    fedsampling_reply,
    fedsampling_round,
    make_fedsampling_handlers,
)
from flwr_importance.sampling.fedsampling import bernoulli_keep
from flwr_importance.strategies.arrays import flatten
from flwr_importance.strategies.fedsampling import FedSampling
from flwr_importance.strategies.replies import ClientSideFailedError
from flwr_importance.tasks import Objective
from flwr_importance.tooling.testing import InProcessGrid
from tests.clientapps.quickstart_user import (
    BATCH_SIZE,
    CUDA,
    DEVICES,
    LR,
    Net,
    assert_trained,
    initial_arrays,
    load_trainset,
    partition_size,
    received_model,
    run_rounds,
    wire_messages,
)

NUM_NODES = 6
MAX_SIZE = partition_size(NUM_NODES - 1) + 10  # above every partition's size


def fedsampling_train(msg: Message, context: Context) -> Message:
    """The quickstart's train function with FedSampling's lines."""
    model = received_model(msg, context)
    trainset = load_trainset(int(context.node_config["partition-id"]))
    plan = fedsampling_round(msg, num_examples=len(trainset))
    loader = DataLoader(Subset(trainset, plan.indices), batch_size=BATCH_SIZE)
    lr = msg.content.config_records["config"]["lr"]
    assert isinstance(lr, float)
    gradient = fedsampling_gradient(
        model, loader, nn.CrossEntropyLoss(), plan=plan, lr=lr
    )
    return fedsampling_reply(msg, gradient)


def user_app(max_epsilon: float = 10.0) -> ClientApp:
    app = ClientApp()
    add_private_size_query(
        app,
        num_examples=lambda context: partition_size(
            int(context.node_config["partition-id"])
        ),
        max_epsilon=max_epsilon,
    )
    app.train()(fedsampling_train)
    return app


def train_message(config: Mapping[str, int | float], arrays: ArrayRecord) -> Message:
    """A train message as a node receives it."""
    metadata = Metadata(0, "m", 0, 1, "", "1", 0.0, 3600.0, "train")
    content = RecordDict({"arrays": arrays, "config": ConfigRecord(dict(config))})
    return make_message(metadata=metadata, content=content)


def run_fedsampling(device: str, local_steps: int) -> InProcessGrid:
    grid = InProcessGrid(user_app(), NUM_NODES, {"device": device}, seed=7)
    strategy = FedSampling(
        samples_per_round=16,
        max_size=MAX_SIZE,
        epsilon=8.0,
        server_lr=0.5,
        local_steps=local_steps,
        min_available_nodes=1,
    )
    arrays = initial_arrays()
    result = run_rounds(strategy, grid, arrays)
    for server_round in (1, 2):
        assert result.train_metrics_clientapp[server_round]["num-updates"] == NUM_NODES
    assert_trained(result, arrays)
    return grid


@pytest.mark.parametrize("local_steps", [1, 3])
def test_fedsampling_runs_on_the_users_code_and_sends_no_count(
    local_steps: int,
) -> None:
    grid = run_fedsampling("cpu", local_steps)
    replies = wire_messages(grid, "to-server")
    train_replies = [r for r in replies if r.metadata.message_type == "train"]
    size_replies = [r for r in replies if r.metadata.message_type == "query.sizes"]
    assert len(train_replies) == len(size_replies) == 2 * NUM_NODES
    for reply in train_replies:
        assert not reply.has_error()
        assert list(reply.content.metric_records) == []
        assert list(reply.content.array_records) == ["arrays"]
    for reply in size_replies:
        metrics = reply.content.metric_records["metrics"]
        # The randomized size and the node's own ledger, which counts only
        # what the server asked: answers, epsilon spent and the coins' kind.
        assert list(metrics) == [
            "size-response",
            "node-size-answers",
            "node-epsilon-spent",
            "node-reproducible-coins",
        ]
        assert metrics["node-reproducible-coins"] == 0


@CUDA
def test_fedsampling_runs_on_the_users_code_on_cuda() -> None:
    run_fedsampling("cuda", 1)


def per_sample_sum(
    model: nn.Module, trainset: Subset, samples_per_round: int
) -> np.ndarray:
    """``(1/K) sum_s grad Q_s``, one sample at a time."""
    parameters = list(model.parameters())
    device = parameters[0].device
    total = [torch.zeros_like(p) for p in parameters]
    for index in range(len(trainset)):
        image, label = trainset[index]
        loss = nn.CrossEntropyLoss()(
            model(image[None].to(device)), label[None].to(device)
        )
        for accumulated, gradient in zip(
            total, torch.autograd.grad(loss, parameters), strict=True
        ):
            accumulated += gradient / samples_per_round
    return np.concatenate([t.detach().cpu().numpy().ravel() for t in total])


def keep_plan(num_examples: int, seed: int) -> FedSamplingRound:
    message = train_message(
        {"samples-per-round": 10, "estimated-total-size": 25.0, "lr": LR},
        initial_arrays(),
    )
    return fedsampling_round(
        message, num_examples=num_examples, rng=np.random.default_rng(seed)
    )


def gradient_vector(gradient: dict[str, torch.Tensor]) -> np.ndarray:
    return np.concatenate([g.detach().cpu().numpy().ravel() for g in gradient.values()])


@pytest.mark.parametrize("device", DEVICES)
def test_g_c_is_the_kept_gradient_sum_over_k_whatever_the_batches(
    device: str,
) -> None:
    trainset = load_trainset(3)
    plan = keep_plan(len(trainset), seed=1)
    assert 0 < len(plan.indices) < len(trainset)
    kept = Subset(trainset, plan.indices)
    cpu_model = Net()
    cpu_model.load_state_dict(initial_arrays().to_torch_state_dict())
    expected = per_sample_sum(cpu_model, kept, plan.samples_per_round)
    assert np.linalg.norm(expected) > 0
    model = cpu_model.to(device)  # the same code on the user's device: the CPU's G_c
    for batch_size in (1, 5, len(trainset)):
        gradient = fedsampling_gradient(
            model,
            DataLoader(kept, batch_size=batch_size),
            nn.CrossEntropyLoss(),
            plan=plan,
        )
        assert {t.device.type for t in gradient.values()} == {device}
        np.testing.assert_allclose(
            gradient_vector(gradient), expected, rtol=1e-4, atol=1e-7
        )


def test_dictionary_batches_as_flowers_quickstart_yields_them() -> None:
    trainset = load_trainset(1)
    plan = keep_plan(len(trainset), seed=4)
    kept = Subset(trainset, plan.indices)
    as_dicts = [
        {"img": kept[index][0], "label": kept[index][1]} for index in range(len(kept))
    ]
    model = Net()
    model.load_state_dict(initial_arrays().to_torch_state_dict())
    gradient = fedsampling_gradient(
        model,
        DataLoader(as_dicts, batch_size=BATCH_SIZE),  # type: ignore[arg-type]
        nn.CrossEntropyLoss(),
        plan=plan,
        unpack=lambda batch: (batch["img"], batch["label"]),
    )
    np.testing.assert_allclose(
        gradient_vector(gradient),
        per_sample_sum(model, kept, plan.samples_per_round),
        rtol=1e-4,
        atol=1e-7,
    )


def test_local_steps_move_the_model_and_sum_the_gradients() -> None:
    """``G_c = (|S_c| / K)(w_0 - w_E) / lr``: E - 1 steps taken, E summed."""
    trainset = load_trainset(2)
    plan = keep_plan(len(trainset), seed=2)
    steps = FedSamplingRound(
        indices=plan.indices,
        keep_probability=plan.keep_probability,
        samples_per_round=plan.samples_per_round,
        local_steps=3,
    )
    model = Net()
    model.load_state_dict(initial_arrays().to_torch_state_dict())
    start = flatten(ArrayRecord(model.state_dict()))
    loader = DataLoader(Subset(trainset, steps.indices), batch_size=BATCH_SIZE)
    with pytest.raises(ValueError, match="needs a positive lr"):
        fedsampling_gradient(model, loader, nn.CrossEntropyLoss(), plan=steps)
    gradient = fedsampling_gradient(
        model, loader, nn.CrossEntropyLoss(), plan=steps, lr=LR
    )
    scale = len(steps.indices) / steps.samples_per_round
    # The model was left at w_2; the third step, w_3 = w_2 - lr g(w_2), is the
    # one the reply counts without taking.
    last = gradient_vector(
        fedsampling_gradient(model, loader, nn.CrossEntropyLoss(), plan=plan)
    )
    end = flatten(ArrayRecord(model.state_dict())) - LR * last / scale
    assert np.linalg.norm(end - start) > 0
    np.testing.assert_allclose(
        gradient_vector(gradient),
        scale * (start - end) / LR,
        rtol=1e-4,
        atol=1e-6,
    )


def test_nothing_kept_gives_zeros_for_every_array() -> None:
    model = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    plan = FedSamplingRound(
        indices=(), keep_probability=0.1, samples_per_round=10, local_steps=1
    )
    gradient = fedsampling_gradient(
        model,
        DataLoader(Subset(load_trainset(0), ())),
        nn.CrossEntropyLoss(),
        plan=plan,
    )
    assert list(gradient) == list(model.state_dict())
    assert all(not value.any() for value in gradient.values())


def test_the_plan_reads_the_servers_config_and_draws_bernoulli() -> None:
    plan = keep_plan(40, seed=3)
    expected = np.flatnonzero(bernoulli_keep(40, 10 / 25, np.random.default_rng(3)))
    assert plan.indices == tuple(expected)
    assert (plan.samples_per_round, plan.local_steps) == (10, 1)
    assert plan.keep_probability == pytest.approx(0.4)
    message = train_message(
        {"samples-per-round": 10, "estimated-total-size": 25.0, "local-steps": 0},
        initial_arrays(),
    )
    with pytest.raises(ValueError, match="local-steps must be >= 1"):
        fedsampling_round(message, num_examples=40)


def test_the_reply_carries_g_c_alone_under_the_models_name() -> None:
    message = train_message({"lr": LR}, initial_arrays())
    gradient = {key: torch.ones(3) for key in ("a", "b")}
    reply = fedsampling_reply(message, gradient)
    assert list(reply.content.array_records) == ["arrays"]
    assert list(reply.content.metric_records) == []


def test_a_node_refuses_an_epsilon_above_its_cap() -> None:
    grid = InProcessGrid(user_app(max_epsilon=2.0), 2, {}, seed=8)
    strategy = FedSampling(
        samples_per_round=16, max_size=MAX_SIZE, epsilon=3.0, min_available_nodes=1
    )
    # Every node refuses: nothing can train, the run stops quoting the node.
    with pytest.raises(ClientSideFailedError, match="allows at most 2"):
        strategy.configure_train(1, initial_arrays(), ConfigRecord(), grid)
    errors = wire_messages(grid, "to-server")
    assert len(errors) == 2 and all(reply.has_error() for reply in errors)
    assert "allows at most 2" in str(errors[0].error.reason)


def ready_made_g_c(device: str) -> np.ndarray:
    """``G_c`` of the ready-made FedSampling handler, the task's model on ``device``."""

    def task(context: Context) -> LocalTask:
        images, labels = load_trainset(4).tensors
        return LocalTask(
            model=Net().to(device),
            objective=Objective("classification", l2=0.01),
            x=images,
            y=labels,
            lr=LR,
            batch_size=BATCH_SIZE,
            local_steps=1,
            seed=4,
        )

    app = register_handlers(ClientApp(), make_fedsampling_handlers(task))
    # Both devices keep the same samples: the seeded coins (unsafe for privacy).
    grid = InProcessGrid(
        app, 1, {"fedsampling-unsafe-reproducible-coins": True}, seed=0
    )
    (node_id,) = grid.get_node_ids()
    config = ConfigRecord(
        {
            "server-round": 2,
            "samples-per-round": 10,
            "estimated-total-size": 30.0,
            "local-steps": 2,
        }
    )
    message = Message(
        RecordDict({"arrays": initial_arrays(), "config": config}),
        node_id,
        "train",
    )
    (reply,) = grid.send_and_receive([message])
    assert not reply.has_error() and list(reply.content.metric_records) == []
    return flatten(reply.content.array_records["arrays"])


@pytest.mark.parametrize("device", DEVICES)
def test_the_ready_made_handler_runs_on_the_models_device(device: str) -> None:
    g_c = ready_made_g_c(device)
    assert np.linalg.norm(g_c) > 0
    np.testing.assert_allclose(g_c, ready_made_g_c("cpu"), rtol=1e-4, atol=1e-6)
