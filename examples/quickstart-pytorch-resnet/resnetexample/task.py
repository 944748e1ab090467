"""Model, data and training loop: Flower's quickstart ``task.py`` with a ResNet-18.

The quickstart's CNN becomes a ResNet-18 for 32x32 images. Its BatchNorm
layers normalize each image by the statistics of its whole batch, so an
image has no gradient of its own, which ISFedAvg's sampling needs: the one
line in :func:`Net` swaps them for GroupNorm. Nothing may download here, so
the images are scikit-learn's 8x8 digits (through flwr-importance's offline
split), upsampled and repeated over 3 channels.
"""

from __future__ import annotations

from logging import INFO

import torch
import torch.nn.functional as F  # noqa: N812 (PyTorch's own convention)
from flwr.common.logger import log
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from flwr_importance.clientapps.isfedavg import ImportanceSampler, replace_batchnorm
from flwr_importance.tasks import load_dataset
from flwr_importance.tasks.architectures import resnet18

NUM_CLASSES = 10
CENTRAL_BATCH_SIZE = 128


def Net(norm: str = "group", width: int = 64) -> nn.Module:  # noqa: N802 (Flower's name)
    """ResNet-18 for 32x32 images, in place of the quickstart's CNN."""
    model = resnet18(num_classes=NUM_CLASSES, norm="batch", width=width)
    if norm == "group":
        model = replace_batchnorm(model)  # ISFedAvg: each BatchNorm -> GroupNorm
    return model


class DigitImages(Dataset[dict[str, Tensor]]):
    """Images and labels as Flower's datasets give them: ``{"img", "label"}``."""

    def __init__(self, images: Tensor, labels: Tensor, image_size: int) -> None:
        upsampled = F.interpolate(
            images, size=(image_size, image_size), mode="bilinear"
        )
        self.images = (upsampled.repeat(1, 3, 1, 1) - 0.5) / 0.5
        self.labels = labels

    def __len__(self) -> int:
        """The number of images."""
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        """One image and its label."""
        return {"img": self.images[index], "label": self.labels[index]}


def load_data(
    partition_id: int, num_partitions: int, image_size: int
) -> tuple[DataLoader, DataLoader]:
    """The partition's train set (batches drawn by ISFedAvg) and test DataLoader."""
    split = load_dataset("digits", num_partitions)
    part = split.partitions[partition_id]
    num_test = len(part.y) // 5
    trainset = DigitImages(part.x[num_test:], part.y[num_test:], image_size)
    testset = DigitImages(part.x[:num_test], part.y[:num_test], image_size)
    return DataLoader(trainset, batch_size=32), DataLoader(testset, batch_size=32)


def load_centralized_dataset(image_size: int) -> DataLoader:
    """The server's test set: the split's held-out images."""
    test = load_dataset("digits", 1).test
    return DataLoader(
        DigitImages(test.x, test.y, image_size), batch_size=CENTRAL_BATCH_SIZE
    )


def train(
    net: nn.Module,
    trainloader: DataLoader,
    sampler: ImportanceSampler,
    lr: float,
    device: torch.device,
) -> float:
    """Flower's ``train`` on the batches ``sampler`` draws, losses weighted (eq. 8)."""
    log(INFO, "resnet example train: %d batches", len(trainloader))
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
        sampler.weighted_loss(sample_losses).backward()
        optimizer.step()
        running_loss += sample_losses.mean().item()
    return running_loss / len(trainloader)


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
