"""FOLB's client helpers in the train function of :mod:`.quickstart_user`.

The real :class:`~flwr_importance.strategies.folb.FOLB` drives it on the
in-process grid; ``-k cuda`` selects the variants with the model on the GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from torch import Tensor, nn
from torch.utils.data import DataLoader

from flwr_importance.clientapps import register_handlers
from flwr_importance.clientapps.folb import (
    ProximalTerm,
    folb_reply,
    gradient_reply,
    inexactness,
    local_gradient,
    make_folb_handlers,
)
from flwr_importance.protocol import (
    FOLB_GAMMA,
    FOLB_GRADIENT,
    FOLB_UPDATE,
    NUM_EXAMPLES,
    PROXIMAL_MU,
)
from flwr_importance.strategies.folb import FOLB
from flwr_importance.tooling.testing import InProcessGrid
from tests.clientapps.quickstart_user import (
    BATCH_SIZE,
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
    unpack,
    user_sgd,
    wire_messages,
)

MU = 0.3


@dataclass(frozen=True)
class Round:
    """What one run of the user's train function saw and did."""

    partition_id: int
    received: dict[str, Tensor]
    trained: dict[str, Tensor]
    proximal_mu: float
    loss_calls: int
    momentum_buffers: int
    device: str


def folb_strategy(mode: str) -> FOLB:
    """FOLB drawing 3 of the nodes a round, with the proximal term ``MU``."""
    return FOLB(
        clients_per_round=3,
        proximal_mu=MU,
        mode=mode,  # type: ignore[arg-type]
        seed=0,
        fraction_evaluate=0.0,
    )


def folb_app(rounds: list[Round]) -> ClientApp:
    """The quickstart's train function with the FOLB lines added."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        device = device_of(context)
        model = received_model(msg, context)
        partition_id = int(context.node_config["partition-id"])
        trainloader = DataLoader(load_partition(partition_id), batch_size=BATCH_SIZE)
        criterion = CountingLoss(nn.CrossEntropyLoss())
        gradient = local_gradient(model, trainloader, criterion, unpack=unpack)
        proximal = ProximalTerm(model, msg)
        optimizer = user_sgd(model, msg)
        for batch in trainloader:
            images, labels = batch["img"].to(device), batch["label"].to(device)
            optimizer.zero_grad()
            loss = criterion(model(images), labels) + proximal(model)
            loss.backward()
            optimizer.step()
        gamma = inexactness(
            model,
            trainloader,
            criterion,
            gradient=gradient,
            proximal=proximal,
            unpack=unpack,
            node_id=context.node_id,
        )
        rounds.append(
            Round(
                partition_id=partition_id,
                received=msg.content["arrays"].to_torch_state_dict(),
                trained={k: v.detach().cpu() for k, v in model.state_dict().items()},
                proximal_mu=proximal.mu,
                loss_calls=criterion.calls,
                momentum_buffers=momentum_buffers(optimizer),
                device=next(model.parameters()).device.type,
            )
        )
        return folb_reply(
            msg,
            model,
            gradient=gradient,
            gamma=gamma,
            metrics={"train_loss": loss.item(), NUM_EXAMPLES: len(trainloader.dataset)},  # type: ignore[arg-type]
        )

    @app.query("gradient")
    def gradient(msg: Message, context: Context) -> Message:
        model = received_model(msg, context)
        trainset = load_partition(int(context.node_config["partition-id"]))
        trainloader = DataLoader(trainset, batch_size=BATCH_SIZE)
        return gradient_reply(
            msg,
            local_gradient(model, trainloader, nn.CrossEntropyLoss(), unpack=unpack),
            num_examples=len(trainset),
        )

    return app


def full_batch_gradient(state: dict[str, Tensor], partition_id: int) -> list[Tensor]:
    """``grad F_k`` in one autograd call over the whole partition, on the CPU."""
    model = Net()
    model.load_state_dict(state)
    images, labels = load_trainset(partition_id).tensors
    loss = nn.functional.cross_entropy(model(images), labels)
    return list(torch.autograd.grad(loss, list(model.parameters())))


def flat(tensors: list[Tensor]) -> Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["single-set", "two-set"])
def test_user_train_function_meets_the_strategy_contract(
    device: str, mode: str
) -> None:
    rounds: list[Round] = []
    grid = InProcessGrid(folb_app(rounds), 5, {"device": device}, seed=0)
    strategy = folb_strategy(mode)
    initial = initial_arrays()
    result = run_rounds(strategy, grid, initial)

    train_replies = wire_messages(grid, "to-server", "train")
    assert len(rounds) == len(train_replies) == 6
    for user_round, reply in zip(rounds, train_replies, strict=True):
        assert not reply.has_error()
        # The server's mu reached the user's loss; their loss and momentum SGD ran.
        assert user_round.proximal_mu == MU
        # One pass each for g_k, the epoch of training and gamma_k.
        num_batches = math.ceil(
            len(load_trainset(user_round.partition_id)) / BATCH_SIZE
        )
        assert user_round.loss_calls == 3 * num_batches
        assert user_round.momentum_buffers == len(list(Net().parameters()))
        assert user_round.device == device
        content = reply.content
        parameter_names = [name for name, _ in Net().named_parameters()]
        # g_k: the gradient at the received model over all the partition.
        gradient = full_batch_gradient(user_round.received, user_round.partition_id)
        sent_gradient = content.array_records[FOLB_GRADIENT].to_torch_state_dict()
        torch.testing.assert_close(
            flat([sent_gradient[name] for name in parameter_names]),
            flat(gradient),
            rtol=1e-4,
            atol=1e-6,
        )
        # dw_k = w_k - w^t.
        update = content.array_records[FOLB_UPDATE].to_torch_state_dict()
        for key, value in user_round.trained.items():
            torch.testing.assert_close(
                user_round.received[key] + update[key], value, rtol=0, atol=1e-6
            )
        # gamma_k = ||grad F_k(w_k) + mu (w_k - w^t)|| / ||grad F_k(w^t)||, clipped.
        trained_gradient = full_batch_gradient(
            user_round.trained, user_round.partition_id
        )
        drift = flat([update[name] for name in parameter_names])
        expected_gamma = min(
            float((flat(trained_gradient) + MU * drift).norm())
            / float(flat(gradient).norm()),
            1.0,
        )
        metrics = content.metric_records["metrics"]
        assert metrics[FOLB_GAMMA] == pytest.approx(expected_gamma, rel=1e-4)
        assert metrics[NUM_EXAMPLES] == len(load_trainset(user_round.partition_id))
    gradient_replies = wire_messages(grid, "to-server", "query.gradient")
    assert bool(gradient_replies) == (mode == "two-set")
    assert not any(reply.has_error() for reply in gradient_replies)
    assert_trained(result, initial)


def train_message(
    grid: InProcessGrid, arrays: ArrayRecord, config: dict[str, float]
) -> Message:
    """A train message to the grid's first node (the grid sets the run identity)."""
    node_id = next(iter(grid.get_node_ids()))
    content = RecordDict({"arrays": arrays, "config": ConfigRecord(config)})
    return Message(content, node_id, "train")


def test_a_reply_without_num_examples_is_an_error_on_the_node() -> None:
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        model = Net()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        trainloader = DataLoader(load_trainset(0), batch_size=BATCH_SIZE)
        gradient = local_gradient(model, trainloader, nn.CrossEntropyLoss())
        return folb_reply(msg, model, gradient=gradient, gamma=0.5, metrics={})

    grid = InProcessGrid(app, 1)
    (reply,) = grid.send_and_receive(
        [train_message(grid, initial_arrays(), {PROXIMAL_MU: MU})]
    )
    assert reply.has_error() and NUM_EXAMPLES in reply.error.reason


@pytest.mark.parametrize("device", DEVICES)
def test_proximal_term_pulls_towards_the_received_model(device: str) -> None:
    grid = InProcessGrid(ClientApp(), 1)
    received = initial_arrays()
    model = Net().to(device)
    model.load_state_dict(received.to_torch_state_dict())
    proximal = ProximalTerm(model, train_message(grid, received, {PROXIMAL_MU: MU}))
    absent = ProximalTerm(model, train_message(grid, received, {}))
    assert absent.mu == 0.0 and float(absent(model)) == 0.0
    assert proximal(model).item() == 0.0  # at w^t
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter))
    term = proximal(model)
    assert term.device.type == device
    gradients = torch.autograd.grad(term, list(model.parameters()))
    for gradient, parameter, start in zip(
        gradients,
        model.parameters(),
        received.to_torch_state_dict().values(),
        strict=True,
    ):
        # d/dw (mu/2)||w - w^t||^2 = mu (w - w^t)
        torch.testing.assert_close(
            gradient.cpu(),
            MU * (parameter.detach().cpu() - start),
            rtol=1e-5,
            atol=1e-6,
        )


@pytest.mark.parametrize("device", DEVICES)
def test_local_gradient_over_dictionary_batches_needs_unpack(device: str) -> None:
    model = Net().to(device)
    model.load_state_dict(initial_arrays().to_torch_state_dict())
    trainloader = DataLoader(load_partition(3), batch_size=BATCH_SIZE)
    with pytest.raises(TypeError, match="unpack="):
        local_gradient(model, trainloader, nn.CrossEntropyLoss())
    record = local_gradient(model, trainloader, nn.CrossEntropyLoss(), unpack=unpack)
    gradient = record.to_torch_state_dict()
    expected = full_batch_gradient(initial_arrays().to_torch_state_dict(), 3)
    names = [name for name, _ in Net().named_parameters()]
    assert list(gradient) == list(Net().state_dict())
    torch.testing.assert_close(
        flat([gradient[name] for name in names]), flat(expected), rtol=1e-4, atol=1e-6
    )


def ready_made_app(device: str) -> ClientApp:
    """The library's FOLB handlers on a task whose model is on ``device``."""
    task = ready_made_task(
        device, lr=LR, batch_size=BATCH_SIZE, local_steps=4, heterogeneous_steps=True
    )
    return register_handlers(ClientApp(), make_folb_handlers(task))


@CUDA
@pytest.mark.parametrize("mode", ["single-set", "two-set"])
def test_cuda_ready_made_handlers_match_the_cpu(mode: str) -> None:
    results = []
    for device in ("cpu", "cuda"):
        strategy = folb_strategy(mode)
        grid = InProcessGrid(ready_made_app(device), 5, seed=0)
        result = strategy.start(grid, initial_arrays(), num_rounds=2)
        results.append(result.arrays.to_torch_state_dict())
    cpu_arrays, cuda_arrays = results
    for key, value in cpu_arrays.items():
        torch.testing.assert_close(cuda_arrays[key], value, rtol=1e-4, atol=1e-6)
