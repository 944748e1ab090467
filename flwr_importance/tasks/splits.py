"""The containers a federated data set is handed out in."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from flwr_importance.tasks.training import TaskKind


@dataclass(frozen=True)
class ClientData:
    """One client's samples (or a test set).

    Attributes
    ----------
    x : torch.Tensor
        Inputs, ``float32``, shaped ``(n, *input_shape)``.
    y : torch.Tensor
        Targets: ``int64`` class labels ``(n,)`` or ``float32`` regression
        targets ``(n,)``.
    """

    x: torch.Tensor
    y: torch.Tensor

    def __post_init__(self) -> None:
        """Reject inputs and targets of different lengths."""
        if len(self.x) != len(self.y):
            raise ValueError(f"x has {len(self.x)} samples, y has {len(self.y)}")

    def __len__(self) -> int:
        """The number of samples."""
        return len(self.x)


@dataclass(frozen=True)
class FederatedSplit:
    """A data set split over clients, with a pooled test set.

    The tensors are shared by every caller of the memoized loaders: treat them
    as read-only.

    Attributes
    ----------
    partitions : tuple of ClientData
        Client ``i``'s training data is ``partitions[i]``.
    test : ClientData
        The held-out test set.
    task : {"classification", "regression"}
        What :class:`~flwr_importance.tasks.training.Objective` to use.
    input_shape : tuple of int
        Shape of one input sample.
    num_outputs : int
        Number of classes, or of regression targets.
    optimum : tuple of numpy.ndarray or None
        For a regression with a known minimizer, that minimizer in the
        parameter order of the ``"linear"`` model; None otherwise.
    """

    partitions: tuple[ClientData, ...]
    test: ClientData
    task: TaskKind
    input_shape: tuple[int, ...]
    num_outputs: int
    optimum: tuple[np.ndarray, ...] | None = None

    @property
    def partition_sizes(self) -> np.ndarray:
        """The number of training samples of every client."""
        return np.array([len(partition) for partition in self.partitions])
