"""The model, the data files and the training loop, with torch and numpy only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

#: 8x8 grayscale digits, ten classes.
INPUT_SIZE = 64
NUM_CLASSES = 10


class Net(nn.Module):
    """An MLP with two hidden layers of 200 units (the simulation app's ``mlp``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(INPUT_SIZE, 200)
        self.fc2 = nn.Linear(200, 200)
        self.fc3 = nn.Linear(200, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class scores of a batch of images."""
        x = torch.flatten(x, start_dim=1)
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


def load_arrays(data_dir: str, name: str) -> TensorDataset:
    """``<data_dir>/<name>.npz`` (arrays ``x`` and ``y``) as a dataset."""
    if not data_dir:
        raise ValueError("set the run config's data-dir to the benchmark's data folder")
    with np.load(Path(data_dir) / f"{name}.npz") as arrays:
        return TensorDataset(
            torch.from_numpy(arrays["x"]), torch.from_numpy(arrays["y"])
        )


def train(
    model: nn.Module, loader: DataLoader, steps: int, lr: float, seed: int
) -> float:
    """``steps`` SGD steps on batches from ``loader``; the mean training loss."""
    torch.manual_seed(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    criterion = nn.CrossEntropyLoss()
    model.train()
    losses = []
    batches = iter(loader)
    for _ in range(steps):
        try:
            images, labels = next(batches)
        except StopIteration:  # a new epoch
            batches = iter(loader)
            images, labels = next(batches)
        optimizer.zero_grad()
        loss = criterion(model(images), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return float(np.mean(losses))


def test(model: nn.Module, dataset: TensorDataset) -> tuple[float, float]:
    """Mean loss and accuracy of ``model`` on ``dataset``."""
    images, labels = dataset.tensors
    model.eval()
    with torch.no_grad():
        scores = model(images)
        loss = nn.functional.cross_entropy(scores, labels).item()
        accuracy = (scores.argmax(dim=1) == labels).float().mean().item()
    return loss, accuracy
