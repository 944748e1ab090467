"""Model, data and training loop: the user's code, as in Flower's quickstart.

Flower's quickstart-pytorch trains this CNN on CIFAR-10 downloaded through
``flwr-datasets``, in batches ``{"img", "label"}``. Nothing may download
here, so the images are scikit-learn's bundled 8x8 digits, upsampled to 32x32
and repeated over 3 channels: the same shapes, batches and ``train()``.
"""

from __future__ import annotations

from collections import OrderedDict
from functools import cache

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 (PyTorch's own convention)
from numpy.typing import NDArray
from torch import nn
from torch.utils.data import DataLoader, Dataset

#: Each partition keeps this share of its images for local validation.
VALIDATION_FRACTION = 0.2
#: Seed of the split of the images over the partitions.
PARTITION_SEED = 42
#: Mini-batch size of the DataLoaders.
BATCH_SIZE = 32


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


class DigitImages(Dataset[dict[str, torch.Tensor]]):
    """Some of the digits as ``{"img": 3x32x32 image, "label": class}`` samples."""

    def __init__(self, indices: NDArray[np.intp]) -> None:
        images, labels = _images()
        self.images = images[indices]
        self.labels = labels[indices]

    def __len__(self) -> int:
        """The number of images."""
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        """One sample, keyed as Flower's CIFAR-10 partitions are."""
        return {"img": self.images[index], "label": self.labels[index]}


@cache
def _images() -> tuple[torch.Tensor, torch.Tensor]:
    """All 1,797 digits as 3x32x32 images in [-1, 1], and their labels."""
    from sklearn.datasets import load_digits  # only the data loader needs sklearn

    digits = load_digits()
    small = torch.tensor(digits.images / 16.0, dtype=torch.float32).unsqueeze(1)
    large = F.interpolate(small, size=(32, 32), mode="bilinear", align_corners=False)
    images = (large.repeat(1, 3, 1, 1) - 0.5) / 0.5
    return images, torch.tensor(digits.target, dtype=torch.long)


def load_data(partition_id: int, num_partitions: int) -> tuple[DataLoader, DataLoader]:
    """The partition's train and validation DataLoaders (an IID split)."""
    order = np.random.default_rng(PARTITION_SEED).permutation(len(_images()[1]))
    mine = np.array_split(order, num_partitions)[partition_id]
    num_validation = int(len(mine) * VALIDATION_FRACTION)
    trainloader = DataLoader(
        DigitImages(mine[num_validation:]), batch_size=BATCH_SIZE, shuffle=True
    )
    valloader = DataLoader(DigitImages(mine[:num_validation]), batch_size=BATCH_SIZE)
    return trainloader, valloader


def train(
    net: nn.Module,
    trainloader: DataLoader,
    epochs: int,
    lr: float,
    device: torch.device,
) -> float:
    """Train the model on the training set; the mean training loss."""
    net.to(device)  # move model to GPU if available
    criterion = torch.nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for batch in trainloader:
            images, labels = batch["img"].to(device), batch["label"].to(device)
            optimizer.zero_grad()
            loss = criterion(net(images), labels)
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
        for batch in testloader:
            images, labels = batch["img"].to(device), batch["label"].to(device)
            outputs = net(images)
            loss += criterion(outputs, labels).item()
            correct += (outputs.argmax(1) == labels).sum().item()
    num_examples = len(testloader.dataset)  # type: ignore[arg-type]
    return loss / len(testloader), correct / num_examples


def get_weights(net: nn.Module) -> list[NDArray[np.float32]]:
    """The model's weights as NumPy arrays, in state-dict order."""
    return [value.cpu().numpy() for value in net.state_dict().values()]


def set_weights(net: nn.Module, parameters: list[NDArray[np.float32]]) -> None:
    """Load NumPy arrays, in state-dict order, into the model."""
    state_dict = OrderedDict(
        (key, torch.tensor(value))
        for key, value in zip(net.state_dict().keys(), parameters, strict=True)
    )
    net.load_state_dict(state_dict, strict=True)
