"""FOLB's gradient, FedSampling's ``G_c`` and OCS/MMFL's kept update on users' models.

The models of :mod:`flwr_importance.tasks.architectures` at small sizes, and
the BatchNorm ResNet: these methods need no per-sample gradient, so BatchNorm
in training mode is allowed, and its running statistics are left as they
were by the gradient helpers (float64, CPU, a few samples each).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import pytest
import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from torch import Tensor, nn
from torch.utils.data import DataLoader, Subset, TensorDataset

from flwr_importance.clientapps.fedsampling import (
    FedSamplingRound,
    fedsampling_gradient,
)
from flwr_importance.clientapps.folb import local_gradient
from flwr_importance.clientapps.variance_reduced import KeptUpdateMod, add_norm_query
from flwr_importance.protocol import UPDATE_RECORD, model_record_name
from flwr_importance.strategies.arrays import flatten
from flwr_importance.strategies.ocs import OptimalClientSampling
from flwr_importance.tasks.architectures import (
    CharLSTM,
    CharTransformer,
    QuickstartCNN,
    resnet18,
)
from flwr_importance.tooling.testing import InProcessGrid

NUM_SAMPLES = 7
NUM_CLASSES = 3
RTOL, ATOL = 1e-9, 1e-11

#: Per model: the builder and one input per sample.
MODELS: dict[
    str, tuple[Callable[[], nn.Module], Callable[[torch.Generator], Tensor]]
] = {
    "quickstart-cnn": (
        lambda: QuickstartCNN(NUM_CLASSES),
        lambda g: torch.randn(NUM_SAMPLES, 3, 32, 32, generator=g),
    ),
    "resnet18-groupnorm": (
        lambda: resnet18(num_classes=NUM_CLASSES, width=4),
        lambda g: torch.randn(NUM_SAMPLES, 3, 16, 16, generator=g),
    ),
    "resnet18-batchnorm": (
        lambda: resnet18(num_classes=NUM_CLASSES, width=4, norm="batch"),
        lambda g: torch.randn(NUM_SAMPLES, 3, 16, 16, generator=g),
    ),
    "char-lstm": (
        lambda: CharLSTM(vocab_size=NUM_CLASSES, embedding_dim=3, hidden_size=5),
        lambda g: torch.randint(0, NUM_CLASSES, (NUM_SAMPLES, 6), generator=g),
    ),
    "char-transformer": (
        lambda: CharTransformer(
            vocab_size=NUM_CLASSES, d_model=8, num_heads=2, num_layers=2
        ),
        lambda g: torch.randint(0, NUM_CLASSES, (NUM_SAMPLES, 6), generator=g),
    ),
}


def model_and_data(name: str) -> tuple[nn.Module, TensorDataset]:
    make_model, make_inputs = MODELS[name]
    torch.manual_seed(0)
    model = make_model().double()
    generator = torch.Generator().manual_seed(1)
    inputs = make_inputs(generator)
    if inputs.is_floating_point():
        inputs = inputs.double()
    labels = torch.randint(0, NUM_CLASSES, (NUM_SAMPLES,), generator=generator)
    return model, TensorDataset(inputs, labels)


def has_batchnorm(model: nn.Module) -> bool:
    return any(isinstance(m, nn.BatchNorm2d) for m in model.modules())


def batch_mean_gradients(
    model: nn.Module, batches: list[tuple[Tensor, Tensor]]
) -> list[Tensor]:
    """``sum_i (n_i / N) grad(mean loss of batch i)``, each batch on a fresh copy.

    A per-sample loop where samples are independent (batches of one), the
    batches' own gradients where BatchNorm mixes them.
    """
    total_samples = sum(len(y) for _, y in batches)
    total = [torch.zeros_like(p) for p in model.parameters()]
    for x, y in batches:
        copied = copy.deepcopy(model)
        loss = nn.functional.cross_entropy(copied(x), y)
        grads = torch.autograd.grad(loss, list(copied.parameters()))
        for accumulated, grad in zip(total, grads, strict=True):
            accumulated += grad * len(y) / total_samples
    return total


def reference_batches(
    model: nn.Module, dataset: TensorDataset, indices: list[int]
) -> list[tuple[Tensor, Tensor]]:
    """One batch of all ``indices`` with BatchNorm, else one per sample."""
    x, y = dataset.tensors
    if has_batchnorm(model):
        return [(x[indices], y[indices])]
    return [(x[i : i + 1], y[i : i + 1]) for i in indices]


def state_of(model: nn.Module) -> list[Tensor]:
    return [value.clone() for value in model.state_dict().values()]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_folb_gradient_is_the_mean_loss_gradient_and_leaves_the_model(
    name: str,
) -> None:
    model, dataset = model_and_data(name)
    before = state_of(model)
    # BatchNorm: one batch, its statistics over all samples; otherwise batches
    # of 3 (3, 3, 1), whose size-weighted mean is the per-sample mean.
    batch_size = NUM_SAMPLES if has_batchnorm(model) else 3
    record = local_gradient(
        model, DataLoader(dataset, batch_size=batch_size), nn.CrossEntropyLoss()
    )
    expected = batch_mean_gradients(
        model, reference_batches(model, dataset, list(range(NUM_SAMPLES)))
    )
    got = record.to_torch_state_dict()
    for (parameter_name, _), want in zip(
        model.named_parameters(), expected, strict=True
    ):
        torch.testing.assert_close(got[parameter_name], want, rtol=RTOL, atol=ATOL)
    for old, new in zip(before, model.state_dict().values(), strict=True):
        assert torch.equal(old, new)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_fedsampling_g_c_is_the_kept_gradient_sum_over_k(name: str) -> None:
    model, dataset = model_and_data(name)
    before = state_of(model)
    kept = [0, 2, 3, 6]
    plan = FedSamplingRound(
        indices=tuple(kept), keep_probability=0.5, samples_per_round=10, local_steps=1
    )
    batch_size = len(kept) if has_batchnorm(model) else 3
    gradient = fedsampling_gradient(
        model,
        DataLoader(Subset(dataset, kept), batch_size=batch_size),
        nn.CrossEntropyLoss(),
        plan=plan,
    )
    mean = batch_mean_gradients(model, reference_batches(model, dataset, kept))
    for (parameter_name, _), want in zip(model.named_parameters(), mean, strict=True):
        torch.testing.assert_close(
            gradient[parameter_name],
            want * len(kept) / plan.samples_per_round,
            rtol=RTOL,
            atol=ATOL,
        )
    for old, new in zip(before, model.state_dict().values(), strict=True):
        assert torch.equal(old, new)


def user_train_fn(name: str) -> Callable[[Message, Context], Message]:
    """The user's train: one epoch of momentum SGD from the received model."""

    def train(msg: Message, context: Context) -> Message:
        model, dataset = model_and_data(name)
        arrays = msg.content.array_records["arrays"]
        model.load_state_dict(arrays.to_torch_state_dict())
        train_epoch(model, dataset)
        content = RecordDict(
            {
                "arrays": ArrayRecord(model.state_dict()),
                "metrics": MetricRecord(
                    {"num-examples": NUM_SAMPLES, "train_loss": 1.0}
                ),
            }
        )
        return Message(content, reply_to=msg)

    return train


def train_epoch(model: nn.Module, dataset: TensorDataset) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model.train()
    for x, y in DataLoader(dataset, batch_size=4):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_ocs_and_mmfl_kept_update_is_the_users_training_step(name: str) -> None:
    app = ClientApp()
    train = user_train_fn(name)
    app.train(mods=[KeptUpdateMod(train_loss_key="train_loss")])(train)
    add_norm_query(app, train, train_loss_key="train_loss")
    grid = InProcessGrid(app, 1, {}, seed=0)
    node_id = next(iter(grid.get_node_ids()))
    model, dataset = model_and_data(name)
    received = ArrayRecord(model.state_dict())
    query = Message(
        RecordDict(
            {
                "config": ConfigRecord({"server-round": 1, "lr": 0.1}),
                model_record_name(0): received,
            }
        ),
        node_id,
        "query.norm",
    )
    (norm_reply,) = grid.send_and_receive([query])
    assert not norm_reply.has_error(), norm_reply.error
    config = ConfigRecord({"server-round": 1, "model-index": 0, "kept-update": True})
    train_message = Message(RecordDict({"config": config}), node_id, "train")
    (train_reply,) = grid.send_and_receive([train_message])
    assert not train_reply.has_error(), train_reply.error
    update = flatten(train_reply.content.array_records[UPDATE_RECORD])
    train_epoch(model, dataset)  # the same step, here
    expected = flatten(ArrayRecord(model.state_dict())) - flatten(received)
    assert np.linalg.norm(expected) > 0
    np.testing.assert_allclose(update, expected, rtol=1e-12, atol=1e-12)
    norm = norm_reply.content.metric_records["metrics"]["update-norm-0"]
    assert norm == pytest.approx(float(np.linalg.norm(update)))


def test_ocs_rounds_run_on_the_batchnorm_resnet() -> None:
    """The server adds kept updates holding BatchNorm's 0-d integer counters."""
    app = ClientApp()
    train = user_train_fn("resnet18-batchnorm")
    app.train(mods=[KeptUpdateMod(train_loss_key="train_loss")])(train)
    add_norm_query(app, train, train_loss_key="train_loss")
    model, _ = model_and_data("resnet18-batchnorm")
    initial = ArrayRecord(model.state_dict())
    strategy = OptimalClientSampling(clients_per_round=2, seed=0, fraction_evaluate=0.0)
    result = strategy.start(
        grid=InProcessGrid(app, 3, {}, seed=0),
        initial_arrays=initial,
        train_config=ConfigRecord({"lr": 0.1}),
        num_rounds=2,
    )
    for metrics in result.train_metrics_clientapp.values():
        assert metrics["num-received"] == metrics["num-sampled"]
    final = result.arrays.to_torch_state_dict()
    start = initial.to_torch_state_dict()
    assert final["layer1.0.bn1.num_batches_tracked"].dtype == torch.int64
    assert not torch.equal(
        final["layer1.0.bn1.running_mean"], start["layer1.0.bn1.running_mean"]
    )
    assert not torch.equal(final["fc.weight"], start["fc.weight"])
