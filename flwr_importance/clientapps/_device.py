"""Running client helpers on the user's own model, DataLoader and loss.

The helpers of :mod:`flwr_importance.clientapps` take the model as the user
holds it (on the CPU or a GPU) and batches as the user's DataLoader yields
them; the data go to the model's device, never the other way round.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from torch import Tensor, nn

from flwr_importance.per_sample import model_device
from flwr_importance.tasks.training import BatchLoss, mean_gradient

#: Splits one batch of the user's DataLoader into ``(inputs, targets)``.
Unpack = Callable[[Any], tuple[Tensor, Tensor]]

#: The user's loss: outputs and targets to the batch's mean loss (PyTorch's
#: default ``reduction="mean"``), e.g. ``torch.nn.CrossEntropyLoss()``.
Criterion = Callable[[Tensor, Tensor], Tensor]

__all__ = [
    "Criterion",
    "Unpack",
    "criterion_batch_loss",
    "inputs_and_targets",
    "mean_loss_gradient",
    "model_device",
    "unpacked",
]


def inputs_and_targets(batch: Any) -> tuple[Tensor, Tensor]:
    """A ``(inputs, targets)`` batch, as a ``TensorDataset`` or torchvision yields.

    Raises
    ------
    TypeError
        For any other batch shape, e.g. the dictionaries of Flower's
        quickstart-pytorch, which need
        ``unpack=lambda batch: (batch["img"], batch["label"])``.

    Examples
    --------
    >>> import torch
    >>> inputs, targets = inputs_and_targets([torch.zeros(2, 3), torch.ones(2)])
    >>> tuple(inputs.shape), tuple(targets.shape)
    ((2, 3), (2,))
    """
    if isinstance(batch, tuple | list) and len(batch) == 2:
        return batch[0], batch[1]
    raise TypeError(
        f"cannot split a {type(batch).__name__} batch into (inputs, targets); "
        'pass unpack=, e.g. unpack=lambda batch: (batch["img"], batch["label"])'
    )


def unpacked(
    batches: Iterable[Any], unpack: Unpack = inputs_and_targets
) -> Iterator[tuple[Tensor, Tensor]]:
    """The user's batches as ``(inputs, targets)`` pairs, lazily."""
    return (unpack(batch) for batch in batches)


def criterion_batch_loss(criterion: Criterion) -> BatchLoss:
    """The user's ``criterion(outputs, targets)`` as ``(model, x, y) -> loss``."""

    def batch_loss(model: nn.Module, inputs: Tensor, targets: Tensor) -> Tensor:
        return criterion(model(inputs), targets)

    return batch_loss


def mean_loss_gradient(
    model: nn.Module,
    batches: Iterable[Any],
    criterion: Criterion,
    unpack: Unpack = inputs_and_targets,
) -> list[Tensor]:
    """The gradient of the user's mean loss over all samples of ``batches``.

    :func:`~flwr_importance.tasks.training.mean_gradient` on the user's
    DataLoader and loss: one value per parameter, the model unchanged.
    """
    return mean_gradient(
        model, unpacked(batches, unpack), criterion_batch_loss(criterion)
    )
