"""Model, data and training loop: the user's code, as in Flower's quickstart.

Flower's quickstart-pytorch trains this CNN on CIFAR-10 downloaded through
``flwr-datasets``. Nothing may download here, so the images are scikit-learn's
bundled 8x8 digits, upsampled to 32x32 and repeated over 3 channels: the same
shapes, the same DataLoaders, the same ``train()``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 (PyTorch's own convention)
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

#: Each partition keeps this share of its images for local evaluation.
TEST_FRACTION = 0.2
#: Seed of the split of the images over the partitions (``+ task`` for task > 0).
PARTITION_SEED = 42

#: ``(net, images, labels) -> loss``: what ``train()`` minimizes on one batch.
BatchLoss = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


class Net(nn.Module):
    """Model (simple CNN adapted from 'PyTorch: A 60 Minute Blitz')."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class scores of a batch of 3x32x32 images."""
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 5 * 5)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


@cache
def _images() -> tuple[torch.Tensor, torch.Tensor]:
    """All 1,797 digits as 3x32x32 images in [-1, 1], and their labels."""
    from sklearn.datasets import load_digits  # only the data loader needs sklearn

    digits = load_digits()
    small = torch.tensor(digits.images / 16.0, dtype=torch.float32).unsqueeze(1)
    large = F.interpolate(small, size=(32, 32), mode="bilinear", align_corners=False)
    images = (large.repeat(1, 3, 1, 1) - 0.5) / 0.5
    return images, torch.tensor(digits.target, dtype=torch.long)


def load_data(
    partition_id: int, num_partitions: int, batch_size: int, task: int = 0
) -> tuple[DataLoader, DataLoader]:
    """The partition's train and test DataLoaders (an IID split of the digits).

    ``task`` picks another split of the same images: the multi-model strategy
    trains one model per task.
    """
    images, labels = _images()
    order = np.random.default_rng(PARTITION_SEED + task).permutation(len(labels))
    mine = torch.from_numpy(np.array_split(order, num_partitions)[partition_id])
    num_test = int(len(mine) * TEST_FRACTION)
    test, train = mine[:num_test], mine[num_test:]
    trainloader = DataLoader(
        TensorDataset(images[train], labels[train]), batch_size=batch_size, shuffle=True
    )
    testloader = DataLoader(
        TensorDataset(images[test], labels[test]), batch_size=batch_size
    )
    return trainloader, testloader


def load_centralized_dataset() -> DataLoader:
    """Every image, for the server's evaluation of the global model."""
    images, labels = _images()
    return DataLoader(TensorDataset(images, labels), batch_size=128)


def train(
    net: nn.Module,
    trainloader: DataLoader,
    epochs: int,
    lr: float,
    device: torch.device,
    batch_loss: BatchLoss | None = None,
) -> float:
    """Train the model on the training set; the mean training loss.

    ``batch_loss`` replaces the plain cross-entropy of a batch, for a method
    that changes the loss (a proximal term, importance weights) but not the
    loop.
    """
    net.to(device)  # move model to GPU if available
    criterion = torch.nn.CrossEntropyLoss().to(device)

    def cross_entropy(
        net: nn.Module, images: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        return criterion(net(images), labels)

    loss_of = batch_loss if batch_loss is not None else cross_entropy
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for images, labels in trainloader:
            images, labels = images.to(device), labels.to(device)
            optimizer.zero_grad()
            loss = loss_of(net, images, labels)
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
    return running_loss / (epochs * len(trainloader))


def test(
    net: nn.Module, testloader: DataLoader, device: torch.device
) -> tuple[float, float]:
    """Validate the model on the test set: mean loss and accuracy."""
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    net.eval()
    with torch.no_grad():
        for images, labels in testloader:
            images, labels = images.to(device), labels.to(device)
            outputs = net(images)
            loss += criterion(outputs, labels).item()
            correct += (outputs.argmax(1) == labels).sum().item()
    num_examples = len(testloader.dataset)  # type: ignore[arg-type]
    return loss / len(testloader), correct / num_examples
