"""Model, data and training loop: the user's code, as in Flower's quickstart.

Flower's quickstart-pytorch trains this CNN on CIFAR-10 downloaded through
``flwr-datasets``. Nothing may download here, so the images are scikit-learn's
bundled 8x8 digits, upsampled to 32x32 and repeated over 3 channels: the same
shapes, the same DataLoaders of ``{"img", "label"}`` batches, the same
``train()`` and ``test()``.

Two methods change the training loop itself: FOLB adds FedProx's proximal
term to ``train``'s loss, ISFedAvg trains on importance-sampled batches with
weighted losses (:func:`train_isfedavg`).
"""

from __future__ import annotations

from functools import cache
from logging import INFO

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 (PyTorch's own convention)
from flwr.common.logger import log
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

# isort: off
# --8<-- [start:folb-client]
from flwr_importance.clientapps.folb import ProximalTerm

# --8<-- [end:folb-client]
# --8<-- [start:isfedavg-client]
from flwr_importance.clientapps.isfedavg import ImportanceSampler
# --8<-- [end:isfedavg-client]
# isort: on

#: Each partition keeps this share of its images for local evaluation.
TEST_FRACTION = 0.2
#: Seed of the split of the images over the partitions (``+ task`` for task > 0).
PARTITION_SEED = 42
#: Batch size of the server's central test set (Flower's).
CENTRAL_BATCH_SIZE = 128


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

    def forward(self, x: Tensor) -> Tensor:
        """Class scores of a batch of 3x32x32 images."""
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 5 * 5)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class DigitImages(Dataset[dict[str, Tensor]]):
    """Images and labels as Flower's datasets give them: ``{"img", "label"}``."""

    def __init__(self, images: Tensor, labels: Tensor) -> None:
        self.images = images
        self.labels = labels

    def __len__(self) -> int:
        """The number of images."""
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        """One image and its label."""
        return {"img": self.images[index], "label": self.labels[index]}


# --8<-- [start:folb-client,fedsampling-client]
def unpack(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch as ``(images, labels)``: the ``unpack=`` of the library helpers."""
    return batch["img"], batch["label"]


# --8<-- [end:folb-client,fedsampling-client]


@cache
def _images() -> tuple[Tensor, Tensor]:
    """All 1,797 digits as 3x32x32 images in [-1, 1], and their labels."""
    from sklearn.datasets import load_digits  # only the data loader needs sklearn

    digits = load_digits()
    small = torch.tensor(digits.images / 16.0, dtype=torch.float32).unsqueeze(1)
    large = F.interpolate(small, size=(32, 32), mode="bilinear", align_corners=False)
    images = (large.repeat(1, 3, 1, 1) - 0.5) / 0.5
    return images, torch.tensor(digits.target, dtype=torch.long)


def load_data(
    partition_id: int, num_partitions: int, batch_size: int, *, task: int = 0
) -> tuple[DataLoader, DataLoader]:
    """Load the partition's data: train and test DataLoaders (an IID split).

    ``task`` picks another split of the same images: the multi-model method
    (MMFL) trains one model per task.
    """
    images, labels = _images()
    order = np.random.default_rng(PARTITION_SEED + task).permutation(len(labels))
    mine = torch.from_numpy(np.array_split(order, num_partitions)[partition_id])
    num_test = int(len(mine) * TEST_FRACTION)
    test_part, train_part = mine[:num_test], mine[num_test:]
    trainloader = DataLoader(
        DigitImages(images[train_part], labels[train_part]),
        batch_size=batch_size,
        shuffle=True,
    )
    testloader = DataLoader(
        DigitImages(images[test_part], labels[test_part]), batch_size=batch_size
    )
    return trainloader, testloader


def load_centralized_dataset() -> DataLoader:
    """Load the server's test set: every image."""
    return DataLoader(DigitImages(*_images()), batch_size=CENTRAL_BATCH_SIZE)


# --8<-- [start:folb-client]
# replaces: def train(net, trainloader, epochs, lr, device):
def train(
    net: nn.Module,
    trainloader: DataLoader,
    epochs: int,
    lr: float,
    device: torch.device,
    proximal: ProximalTerm | None = None,
) -> float:
    # --8<-- [end:folb-client]
    """Train the model on the training set; the mean training loss.

    FOLB's local solve is FedProx's: ``proximal`` adds ``(mu/2) ||w - w^t||^2``
    to the loss.
    """
    log(INFO, "quickstart-pytorch train: %d batches", epochs * len(trainloader))
    net.to(device)  # move model to GPU if available
    criterion = torch.nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for batch in trainloader:
            images = batch["img"].to(device)
            labels = batch["label"].to(device)
            optimizer.zero_grad()
            loss = criterion(net(images), labels)
            # --8<-- [start:folb-client]
            # after: loss = criterion(net(images), labels)
            if proximal is not None:
                loss = loss + proximal(net)
            # --8<-- [end:folb-client]
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
    return running_loss / (epochs * len(trainloader))


# --8<-- [start:isfedavg-client]
def train_isfedavg(
    net: nn.Module,
    trainloader: DataLoader,
    sampler: ImportanceSampler,
    lr: float,
    device: torch.device,
) -> float:
    """``train`` on the batches ``sampler`` draws, each loss weighted by eq. 8.

    ``trainloader`` iterates ``batch_sampler=sampler``: its ``E_k`` batches
    of ``B_k`` samples, both the server's, replace the epochs and the batch size.
    """
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss(reduction="none").to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    running_loss = 0.0
    for batch in trainloader:
        images = batch["img"].to(device)
        labels = batch["label"].to(device)
        sampler.observe(net, images, labels, criterion)  # before the step
        optimizer.zero_grad()
        sample_losses = criterion(net(images), labels)
        loss = sampler.weighted_loss(sample_losses)
        loss.backward()
        optimizer.step()
        running_loss += sample_losses.mean().item()
    return running_loss / len(trainloader)


# --8<-- [end:isfedavg-client]


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
            images = batch["img"].to(device)
            labels = batch["label"].to(device)
            outputs = net(images)
            loss += criterion(outputs, labels).item()
            correct += (outputs.argmax(1) == labels).sum().item()
    num_examples = len(testloader.dataset)  # type: ignore[arg-type]
    return loss / len(testloader), correct / num_examples
