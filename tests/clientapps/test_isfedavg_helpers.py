"""ISFedAvg's client helpers in the train function of :mod:`.quickstart_user`.

The real :class:`~flwr_importance.strategies.isfedavg.ISFedAvg` drives it on the
in-process grid; ``-k cuda`` selects the variants with the model on the GPU.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from flwr.app import (
    ArrayRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from torch import nn
from torch.utils.data import DataLoader

from flwr_importance.clientapps import LocalTask, register_handlers
from flwr_importance.clientapps.isfedavg import (
    SAMPLE_STATE_KEY,
    ImportanceSampler,
    RoundSettings,
    SampleState,
    importance_sampled_sgd,
    make_isfedavg_handlers,
    per_sample_grad_norms,
)
from flwr_importance.protocol import (
    ISFEDAVG_BATCH_SIZE,
    ISFEDAVG_GRADIENT_SQ_NORM,
    ISFEDAVG_LOCAL_STEPS,
    ISFEDAVG_SIGMA2,
)
from flwr_importance.strategies.isfedavg import ISFedAvg
from flwr_importance.tasks import Objective
from flwr_importance.tooling.testing import InProcessGrid
from tests.clientapps.quickstart_user import (
    CUDA,
    DEVICES,
    LR,
    CountingLoss,
    Net,
    assert_trained,
    device_of,
    initial_arrays,
    load_partition,
    load_trainset,
    momentum_buffers,
    ready_made_task,
    received_model,
    run_rounds,
    user_sgd,
    wire_messages,
)


@dataclass(frozen=True)
class Round:
    """What one run of the user's train function saw and did."""

    local_steps: int
    batch_size: int
    batch_sizes: list[int]
    loss_calls: int
    momentum_buffers: int
    device: str


def isfedavg_strategy() -> ISFedAvg:
    """ISFedAvg drawing 3 nodes a round, ``E_k`` in 2..4 and ``B_k`` in 3..6."""
    return ISFedAvg(
        clients_per_round=3,
        local_steps_range=(2, 4),
        batch_size_range=(3, 6),
        seed=0,
        fraction_evaluate=0.0,
    )


def isfedavg_app(rounds: list[Round]) -> ClientApp:
    """The quickstart's train function with the ISFedAvg lines added."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        device = device_of(context)
        model = received_model(msg, context)
        trainset = load_partition(int(context.node_config["partition-id"]))
        sampler = ImportanceSampler.from_message(
            msg, context, num_samples=len(trainset)
        )
        loader = DataLoader(trainset, batch_sampler=sampler)
        criterion = CountingLoss(nn.CrossEntropyLoss(reduction="none"))
        optimizer = user_sgd(model, msg)
        batch_sizes = []
        for batch in loader:
            images, labels = batch["img"].to(device), batch["label"].to(device)
            sampler.observe(model, images, labels, criterion)
            optimizer.zero_grad()
            sampler.weighted_loss(criterion(model(images), labels)).backward()
            optimizer.step()
            batch_sizes.append(len(labels))
        metrics = {**sampler.finish(context), "num-examples": len(trainset)}
        rounds.append(
            Round(
                local_steps=sampler.local_steps,
                batch_size=sampler.batch_size,
                batch_sizes=batch_sizes,
                loss_calls=criterion.calls,
                momentum_buffers=momentum_buffers(optimizer),
                device=next(model.parameters()).device.type,
            )
        )
        content = RecordDict(
            {
                "arrays": ArrayRecord(model.state_dict()),
                "metrics": MetricRecord(metrics),
            }
        )
        return Message(content, reply_to=msg)

    return app


@pytest.mark.parametrize("device", DEVICES)
def test_user_train_function_meets_the_strategy_contract(device: str) -> None:
    rounds: list[Round] = []
    grid = InProcessGrid(isfedavg_app(rounds), 5, {"device": device}, seed=0)
    strategy = isfedavg_strategy()
    initial = initial_arrays()
    result = run_rounds(strategy, grid, initial, num_rounds=3)

    assert len(rounds) == 9  # 3 nodes a round, every reply used
    sent = [m.content["config"] for m in wire_messages(grid, "to-node", "train")]
    for user_round, config in zip(rounds, sent, strict=True):
        # The server's E_k and B_k, not the user's epochs and batch size.
        assert user_round.local_steps == config[ISFEDAVG_LOCAL_STEPS]
        assert user_round.batch_sizes == [config[ISFEDAVG_BATCH_SIZE]] * int(
            config[ISFEDAVG_LOCAL_STEPS]  # type: ignore[call-overload]
        )
        # The user's loss ran for every batch and their momentum SGD stepped.
        assert user_round.loss_calls >= user_round.local_steps
        assert user_round.momentum_buffers == len(list(Net().parameters()))
        assert user_round.device == device
    replies = [m.content["metrics"] for m in wire_messages(grid, "to-server", "train")]
    assert all(
        r[ISFEDAVG_SIGMA2] > 0 and r[ISFEDAVG_GRADIENT_SQ_NORM] > 0 for r in replies
    )
    # Eq. 28 moved the client probabilities from the statistics it received.
    assert len(set(np.round(list(strategy.client_probs.values()), 12))) > 1
    # The sample probabilities live on in the nodes' state, moved by eq. 29.
    for node_id in grid.get_node_ids():
        state = grid.node_state(node_id)
        if SAMPLE_STATE_KEY in state:
            probs = state[SAMPLE_STATE_KEY]["probs"].numpy()
            assert probs.sum() == pytest.approx(1.0)
            assert not np.allclose(probs, 1 / probs.size)
    assert_trained(result, initial)


def round_settings(batch_size: int = 4) -> RoundSettings:
    return RoundSettings(
        client_prob=0.2,
        num_clients=4,
        local_steps=3,
        batch_size=batch_size,
        adapt_sample_probs=True,
        min_relative_sample_prob=0.1,
    )


@pytest.mark.parametrize("device", DEVICES)
def test_weighted_loss_with_plain_sgd_is_the_papers_step(device: str) -> None:
    """The user's loop with plain SGD takes the ready-made handler's steps."""
    trainset = load_trainset(2)
    images, labels = trainset.tensors
    torch.manual_seed(3)
    user_model = Net().to(device)
    reference_model = copy.deepcopy(user_model).cpu()
    lr = 0.1

    user_sampler = ImportanceSampler(
        round_settings(),
        SampleState.uniform(len(trainset)),
        rng=np.random.default_rng(5),
    )
    criterion = nn.CrossEntropyLoss(reduction="none")
    optimizer = torch.optim.SGD(user_model.parameters(), lr=lr)
    for batch_images, batch_labels in DataLoader(trainset, batch_sampler=user_sampler):
        batch_images, batch_labels = batch_images.to(device), batch_labels.to(device)
        step = user_sampler.observe(user_model, batch_images, batch_labels, criterion)
        torch.testing.assert_close(
            step.sample_grad_norms,
            per_sample_grad_norms(user_model, batch_images, batch_labels, criterion),
        )
        optimizer.zero_grad()
        user_sampler.weighted_loss(
            criterion(user_model(batch_images), batch_labels)
        ).backward()
        # The weighted loss's gradient is the eq. 8 gradient observe computed.
        for parameter, expected in zip(
            user_model.parameters(), step.gradient, strict=True
        ):
            assert parameter.grad is not None
            torch.testing.assert_close(parameter.grad, expected, rtol=1e-4, atol=1e-6)
        optimizer.step()

    reference_sampler = ImportanceSampler(
        round_settings(),
        SampleState.uniform(len(trainset)),
        rng=np.random.default_rng(5),
    )
    task = LocalTask(
        model=reference_model,
        objective=Objective("classification"),
        x=images,
        y=labels,
        lr=lr,
        batch_size=1,
    )
    importance_sampled_sgd(task, reference_sampler)

    for got, want in zip(
        user_model.parameters(), reference_model.parameters(), strict=True
    ):
        torch.testing.assert_close(
            got.detach().cpu(), want.detach(), rtol=1e-4, atol=1e-6
        )
    np.testing.assert_allclose(
        user_sampler.sample_state.probs, reference_sampler.sample_state.probs, rtol=1e-4
    )
    user_metrics, reference_metrics = (
        user_sampler.metrics(),
        reference_sampler.metrics(),
    )
    for key in (ISFEDAVG_SIGMA2, ISFEDAVG_GRADIENT_SQ_NORM):
        assert user_metrics[key] == pytest.approx(reference_metrics[key], rel=1e-4)


def per_sample_loop(
    model: nn.Module, images: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """One backward pass per sample: the slow, obviously right norms."""
    norms = []
    for index in range(len(labels)):
        model.zero_grad()
        nn.functional.cross_entropy(
            model(images[index : index + 1]), labels[index : index + 1]
        ).backward()
        norms.append(
            torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters()))  # type: ignore[union-attr, misc]
        )
    return torch.stack(norms)


class WithLayerNorm(nn.Module):
    """A model outside the layer-wise path (LayerNorm): torch.func serves it."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Flatten(), nn.Linear(3 * 8 * 8, 8), nn.LayerNorm(8), nn.Tanh()
        )
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("model_class", [Net, WithLayerNorm])
def test_per_sample_grad_norms_of_the_users_model(
    device: str, model_class: type[nn.Module]
) -> None:
    images, labels = load_trainset(1).tensors
    torch.manual_seed(0)
    model = model_class().to(device)
    norms = per_sample_grad_norms(
        model, images, labels, nn.CrossEntropyLoss(reduction="none")
    )
    assert norms.device.type == device
    torch.testing.assert_close(
        norms.cpu(),
        per_sample_loop(model.cpu(), images, labels),
        rtol=1e-4,
        atol=1e-6,
    )


def test_misuse_is_an_error_not_a_silent_wrong_round() -> None:
    trainset = load_trainset(0)
    images, labels = trainset.tensors
    model = Net()
    sampler = ImportanceSampler(
        round_settings(),
        SampleState.uniform(len(trainset)),
        rng=np.random.default_rng(0),
    )
    with pytest.raises(RuntimeError, match="no batch drawn"):
        sampler.loss_weights()
    batches = iter(sampler)
    batch = next(batches)
    # A DataLoader with workers asks for the next batch before this one is
    # observed: the probabilities it would be drawn by are not known yet.
    with pytest.raises(RuntimeError, match="num_workers"):
        next(batches)
    with pytest.raises(ValueError, match="reduction='none'"):
        sampler.weighted_loss(
            nn.CrossEntropyLoss()(model(images[batch]), labels[batch])
        )
    sampler = ImportanceSampler(
        round_settings(),
        SampleState.uniform(len(trainset)),
        rng=np.random.default_rng(0),
    )
    batch = next(iter(sampler))
    sampler.observe(
        model, images[batch], labels[batch], nn.CrossEntropyLoss(reduction="none")
    )
    with pytest.raises(RuntimeError, match="1 of 3 batches"):
        sampler.metrics()


def test_the_server_batch_size_is_capped_at_the_dataset_and_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    trainset = load_trainset(0)
    sampler = ImportanceSampler(
        round_settings(batch_size=50),
        SampleState.uniform(len(trainset)),
        rng=np.random.default_rng(0),
    )
    assert sampler.batch_size == len(trainset)
    assert f"exceeds the node's {len(trainset)} samples" in caplog.text


def ready_made_app(device: str) -> ClientApp:
    """The library's ISFedAvg handlers on a task whose model is on ``device``."""
    # batch_size 1: ISFedAvg's B_k comes from the server.
    task = ready_made_task(device, lr=LR, batch_size=1)
    return register_handlers(ClientApp(), make_isfedavg_handlers(task))


@CUDA
def test_cuda_ready_made_handlers_match_the_cpu() -> None:
    results = []
    for device in ("cpu", "cuda"):
        strategy = isfedavg_strategy()
        grid = InProcessGrid(ready_made_app(device), 5, seed=0)
        result = strategy.start(grid, initial_arrays(), num_rounds=2)
        results.append((result.arrays.to_torch_state_dict(), strategy.client_probs))
    (cpu_arrays, cpu_probs), (cuda_arrays, cuda_probs) = results
    for key, value in cpu_arrays.items():
        torch.testing.assert_close(cuda_arrays[key], value, rtol=1e-4, atol=1e-6)
    assert list(cuda_probs.values()) == pytest.approx(
        list(cpu_probs.values()), rel=1e-4
    )
