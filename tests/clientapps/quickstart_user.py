"""A user's ClientApp code in the shape of Flower's quickstart-pytorch.

Its own ``Net``, a DataLoader over the node's partition (tuple batches, or
the ``{"img", "label"}`` dictionaries of Flower's current quickstart from
:func:`load_partition`, split by :func:`unpack`), momentum SGD with
the learning rate the server sends, ``CrossEntropyLoss`` and a device chosen
by the user (here the run config's ``device``, so a test can put it on CUDA).
Every call of the user's training loop is recorded in ``TRAIN_CALLS``, so a
test can check that the method's helpers ran the user's own code.

Below the user's code, what the tests of this folder share around it: the
devices they run on, the user's loss counting its calls, the momentum SGD
their train functions build, the ready-made ``LocalTask`` on the same data and
the server's rounds at the user's learning rate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from flwr_importance.clientapps import LocalTask
from flwr_importance.strategies.arrays import flatten
from flwr_importance.tasks import Objective
from flwr_importance.tooling.testing import InProcessGrid

NUM_CLASSES = 4
BATCH_SIZE = 8
LR = 0.05


class Net(nn.Module):
    """A small CNN on 3x8x8 images."""

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, width, 3)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(width * 3 * 3, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of shape ``(B, NUM_CLASSES)``."""
        return self.fc(torch.flatten(self.pool(torch.relu(self.conv(x))), 1))


def partition_size(partition_id: int) -> int:
    """Unequal partitions: 12, 19, 26, ... samples."""
    return 12 + 7 * partition_id


def load_trainset(partition_id: int) -> TensorDataset:
    """The partition's images and labels (seeded by the partition)."""
    generator = torch.Generator().manual_seed(100 + partition_id)
    size = partition_size(partition_id)
    images = torch.randn(size, 3, 8, 8, generator=generator)
    labels = torch.randint(NUM_CLASSES, (size,), generator=generator)
    return TensorDataset(images, labels)


class ImageDicts(Dataset[dict[str, torch.Tensor]]):
    """A partition as Flower's quickstart-pytorch batches it: ``{"img", "label"}``."""

    def __init__(self, partition_id: int) -> None:
        self.images, self.labels = load_trainset(partition_id).tensors

    def __len__(self) -> int:
        """The partition's size."""
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        """One image and its label."""
        return {"img": self.images[index], "label": self.labels[index]}


def load_partition(partition_id: int) -> ImageDicts:
    """The partition of :func:`load_trainset`, as dictionaries."""
    return ImageDicts(partition_id)


def unpack(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """A dictionary batch as ``(images, labels)``: the helpers' ``unpack=``."""
    return batch["img"], batch["label"]


@dataclass(frozen=True)
class TrainCall:
    """What one run of the user's training loop used."""

    optimizer: str
    momentum: float
    lr: float
    device: str
    criterion: str


TRAIN_CALLS: list[TrainCall] = []


def train(
    net: nn.Module, trainloader: DataLoader, epochs: int, lr: float, device: str
) -> float:
    """The quickstart's loop: momentum SGD on CrossEntropyLoss."""
    net.to(device)
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    TRAIN_CALLS.append(
        TrainCall("SGD", 0.9, lr, str(next(net.parameters()).device), "CrossEntropy")
    )
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for images, labels in trainloader:
            optimizer.zero_grad()
            loss = criterion(net(images.to(device)), labels.to(device))
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
    return running_loss / (epochs * len(trainloader))


def test(net: nn.Module, testloader: DataLoader, device: str) -> tuple[float, float]:
    """Mean loss and accuracy."""
    net.to(device)
    criterion = nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for images, labels in testloader:
            outputs = net(images.to(device))
            loss += criterion(outputs, labels.to(device)).item() * len(labels)
            correct += int((outputs.argmax(1) == labels.to(device)).sum())
    size = len(testloader.dataset)  # type: ignore[arg-type]
    return loss / size, correct / size


def device_of(context: Context) -> str:
    """The user's device choice (the run config's ``device``, CPU by default)."""
    return str(context.run_config.get("device", "cpu"))


def model_width(msg: Message) -> int:
    """MMFL users pick their model by ``model-index``; OCS sends 0 or nothing."""
    config = msg.content.config_records.get("config", ConfigRecord())
    model_index = config.get("model-index", 0)
    assert isinstance(model_index, int)
    return 4 + 2 * model_index


def received_model(msg: Message, context: Context) -> Net:
    """The server's model in the message, on the user's device."""
    model = Net(model_width(msg))
    model.load_state_dict(msg.content.array_records["arrays"].to_torch_state_dict())
    return model.to(device_of(context))


def user_train(msg: Message, context: Context) -> Message:
    """The quickstart's ``@app.train()`` function, unchanged."""
    model = received_model(msg, context)
    trainset = load_trainset(int(context.node_config["partition-id"]))
    trainloader = DataLoader(trainset, batch_size=BATCH_SIZE)
    train_loss = train(
        model,
        trainloader,
        1,
        float(msg.content.config_records["config"]["lr"]),  # type: ignore[arg-type]
        device_of(context),
    )
    content = RecordDict(
        {
            "arrays": ArrayRecord(model.state_dict()),
            "metrics": MetricRecord(
                {"train_loss": train_loss, "num-examples": len(trainset)}
            ),
        }
    )
    return Message(content=content, reply_to=msg)


def user_evaluate(msg: Message, context: Context) -> Message:
    """The quickstart's ``@app.evaluate()`` function, unchanged."""
    model = received_model(msg, context)
    testset = load_trainset(int(context.node_config["partition-id"]))
    eval_loss, eval_acc = test(
        model, DataLoader(testset, batch_size=BATCH_SIZE), device_of(context)
    )
    metrics: dict[str, int | float | list[int] | list[float]] = {
        "eval_loss": eval_loss,
        "eval_acc": eval_acc,
        "num-examples": len(testset),
    }
    return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)


def initial_arrays(width: int = 4) -> ArrayRecord:
    """The server's initial model."""
    torch.manual_seed(0)
    return ArrayRecord(Net(width).state_dict())


# -- shared by the tests around the user's code -----------------------------------
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]


class CountingLoss(nn.Module):
    """The user's loss, counting its calls."""

    def __init__(self, loss: nn.Module) -> None:
        super().__init__()
        self.loss = loss
        self.calls = 0

    def forward(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.loss(outputs, targets)


def user_sgd(model: nn.Module, msg: Message) -> torch.optim.SGD:
    """The quickstart's momentum SGD at the learning rate the server sent."""
    lr = msg.content.config_records["config"]["lr"]
    return torch.optim.SGD(model.parameters(), lr=float(lr), momentum=0.9)  # type: ignore[arg-type]


def momentum_buffers(optimizer: torch.optim.Optimizer) -> int:
    """How many parameters the optimizer holds a momentum buffer for."""
    return sum("momentum_buffer" in state for state in optimizer.state.values())


def ready_made_task(
    device: str, objective: Objective | None = None, **settings: object
) -> Callable[[Context], LocalTask]:
    """The library's ``LocalTask`` on the node's partition, the model on ``device``.

    ``settings`` are the rest of :class:`LocalTask`'s fields (``lr``,
    ``batch_size``, ...); the seed is the partition.
    """

    def task(context: Context) -> LocalTask:
        partition_id = int(context.node_config["partition-id"])
        images, labels = load_trainset(partition_id).tensors
        return LocalTask(
            model=Net().to(device),
            objective=objective or Objective("classification"),
            x=images,
            y=labels,
            seed=partition_id,
            **settings,  # type: ignore[arg-type]
        )

    return task


def run_rounds(
    strategy: Strategy, grid: Grid, arrays: ArrayRecord, num_rounds: int = 2
) -> Result:
    """The server's rounds from ``arrays``, every train message carrying ``LR``."""
    return strategy.start(
        grid=grid,
        initial_arrays=arrays,
        num_rounds=num_rounds,
        train_config=ConfigRecord({"lr": LR}),
    )


def assert_trained(result: Result, arrays: ArrayRecord) -> None:
    """The rounds moved the model from ``arrays`` and left it finite."""
    step = flatten(result.arrays) - flatten(arrays)
    assert np.all(np.isfinite(step)) and np.linalg.norm(step) > 0


def wire_messages(
    grid: InProcessGrid, direction: str, message_type: str | None = None
) -> list[Message]:
    """The messages that crossed the grid's wire ``direction``, of one type."""
    return [
        record.message()
        for record in grid.wire_log
        if record.direction == direction and message_type in (None, record.message_type)
    ]
