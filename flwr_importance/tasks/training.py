"""Losses, local SGD (with the FedProx proximal term), gradients and evaluation.

Everything here runs on the model's device (the data it is given, on any
device, is moved there batch by batch, so a model on CUDA trains on CUDA) and
never touches global torch state (random generator, thread count): randomness
comes from the explicit generators the callers pass.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 (the conventional alias)
from torch import Tensor, nn

from flwr_importance import protocol
from flwr_importance.per_sample import (
    model_device,
    norms_of,
    per_sample_grad_norms,
    vmap_per_sample_grads,
    weighted_gradient_and_norms,
)

TaskKind = Literal["classification", "regression"]
TASK_KINDS: tuple[TaskKind, ...] = get_args(TaskKind)

# Rows per forward pass when evaluating or taking a full gradient, so memory stays
# bounded on large local data sets.
EVAL_CHUNK_SIZE = 4096


@dataclass(frozen=True)
class Objective:
    """The per-sample loss of a task, with optional L2 regularization.

    The loss of sample ``n`` is ``Q_n(w) = loss(f(x_n; w), y_n) + l2 ||w||^2``,
    ``||w||^2`` summing the squares of all model parameters; a batch's loss is the
    mean of its samples' losses, so the regularizer enters the batch loss once,
    with weight ``l2``. With ``l2 = 0.001`` and the ``"linear"`` model this is the
    ISFedAvg risk ``(1/N_k) sum_n (d_n - u_n w)^2 + 0.001 ||w||^2`` (eq. 31).

    Parameters
    ----------
    task : {"classification", "regression"}
        Classification: cross-entropy of the logits against integer class labels.
        Regression: squared error ``||y - f(x)||^2`` (summed over outputs, no
        factor 1/2).
    l2 : float
        Weight of ``||w||^2`` in every sample's loss (>= 0).
    """

    task: TaskKind
    l2: float = 0.0

    def __post_init__(self) -> None:
        """Reject an unknown task or a negative ``l2``."""
        if self.task not in TASK_KINDS:
            raise ValueError(
                f"unknown task {self.task!r}; valid tasks: {', '.join(TASK_KINDS)}"
            )
        if not self.l2 >= 0:
            raise ValueError(f"l2 must be >= 0, got {self.l2}")

    def sample_losses(self, outputs: Tensor, targets: Tensor) -> Tensor:
        """Per-sample data losses (without the regularizer), shape ``(B,)``."""
        if self.task == "classification":
            return F.cross_entropy(outputs, targets, reduction="none")
        batch_size = outputs.shape[0]
        errors = targets.reshape(batch_size, -1) - outputs.reshape(batch_size, -1)
        return errors.pow(2).sum(dim=1)

    def penalty(self, parameters: Iterable[Tensor]) -> Tensor:
        """The regularizer ``l2 ||w||^2`` over ``parameters``."""
        return self.l2 * torch.stack([p.pow(2).sum() for p in parameters]).sum()

    def loss(self, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        """Mean per-sample loss over the batch, regularizer included.

        Returns
        -------
        torch.Tensor
            A scalar with a gradient graph to the model's parameters.
        """
        mean_loss = self.sample_losses(model(x), y).mean()
        if self.l2 > 0:
            mean_loss = mean_loss + self.penalty(model.parameters())
        return mean_loss

    def per_sample_grads(
        self, model: nn.Module, x: Tensor, y: Tensor
    ) -> dict[str, Tensor]:
        """Gradient of every sample's loss ``Q_n``, by ``vmap(grad(...))``.

        Returns
        -------
        dict of str to torch.Tensor
            Per parameter name (``model.named_parameters()``), the ``(B,
            *param.shape)`` per-sample gradients.
        """
        return vmap_per_sample_grads(model, x, y, self.sample_losses, self.l2)

    def per_sample_grads_and_norms(
        self, model: nn.Module, x: Tensor, y: Tensor
    ) -> tuple[dict[str, Tensor], Tensor]:
        """Per-sample gradients, as :meth:`per_sample_grads`, and their norms."""
        per_sample = self.per_sample_grads(model, x, y)
        return per_sample, norms_of(per_sample)

    def per_sample_grad_norms(self, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        """``||grad Q_n(w)||`` over all parameters, for every sample; shape ``(B,)``.

        Computed layer by layer without building per-sample gradients when all
        parameters sit in ``nn.Linear``/``nn.Conv2d`` layers (every model of
        :mod:`flwr_importance.tasks.models`), else by torch.func in chunks. Both
        are exact.
        """
        return per_sample_grad_norms(model, x, y, self.sample_losses, self.l2)

    def weighted_gradient_and_norms(
        self, model: nn.Module, x: Tensor, y: Tensor, sample_weights: Tensor
    ) -> tuple[list[Tensor], Tensor]:
        """``sum_b c_b grad Q_b(w)`` and the per-sample norms, in one pass.

        This is what an importance-sampled step needs (ISFedAvg eq. 8): the
        weights ``c_b = 1 / (K p_k E_k B_k N_k p_b)`` and the norms to update the
        sampling probabilities (eq. 29), both at the same iterate.

        Parameters
        ----------
        model : torch.nn.Module
            The model at the current iterate.
        x, y : torch.Tensor
            The mini-batch.
        sample_weights : torch.Tensor
            ``(B,)`` weights ``c_b``.

        Returns
        -------
        tuple of (list of torch.Tensor, torch.Tensor)
            The weighted gradient in ``model.parameters()`` order, and the
            ``(B,)`` per-sample gradient norms.
        """
        return weighted_gradient_and_norms(
            model, x, y, self.sample_losses, self.l2, sample_weights
        )


@dataclass(frozen=True)
class WeightedStep:
    """What :func:`weighted_sgd_step` did.

    Attributes
    ----------
    gradient : list of torch.Tensor
        The weighted gradient ``g`` of the step ``w <- w - lr g``, in
        ``model.parameters()`` order.
    sample_grad_norms : torch.Tensor
        ``(B,)`` per-sample gradient norms at the iterate before the step.
    """

    gradient: list[Tensor]
    sample_grad_norms: Tensor


def weighted_sgd_step(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    objective: Objective,
    *,
    lr: float,
    sample_weights: Tensor,
) -> WeightedStep:
    """One importance-weighted SGD step ``w <- w - lr sum_b c_b grad Q_b(w)``, in place.

    The per-sample gradient norms come out of the same pass, at the iterate where
    the step is made.

    Parameters
    ----------
    model : torch.nn.Module
        Updated in place.
    x, y : torch.Tensor
        The mini-batch.
    objective : Objective
        The per-sample loss.
    lr : float
        Step size.
    sample_weights : torch.Tensor
        ``(B,)`` weights ``c_b`` (``1/B`` each gives a plain SGD step).

    Returns
    -------
    WeightedStep
        The gradient applied and the per-sample gradient norms.
    """
    gradient, norms = objective.weighted_gradient_and_norms(model, x, y, sample_weights)
    with torch.no_grad():
        for parameter, parameter_grad in zip(model.parameters(), gradient, strict=True):
            parameter.sub_(parameter_grad, alpha=lr)
    return WeightedStep(gradient=gradient, sample_grad_norms=norms)


def train_local(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    objective: Objective,
    *,
    lr: float,
    batch_size: int,
    local_steps: int | None = None,
    epochs: int | None = None,
    proximal_mu: float = 0.0,
    generator: torch.Generator,
) -> dict[str, float]:
    """Plain mini-batch SGD on the local data, in place on ``model``.

    Mini-batches come from successive random permutations of the local data (one
    per epoch, drawn from ``generator``), cut into batches of ``batch_size``; an
    epoch's last batch may be smaller, and a ``batch_size`` above the data size
    makes every batch the whole data set.

    Parameters
    ----------
    model : torch.nn.Module
        Trained in place; its weights on entry are the FedProx anchor ``w_global``.
    x, y : torch.Tensor
        Local inputs and targets.
    objective : Objective
        The loss.
    lr : float
        SGD step size (> 0).
    batch_size : int
        Mini-batch size (>= 1).
    local_steps : int or None
        Number of mini-batch steps (>= 1). Exactly one of ``local_steps`` and
        ``epochs`` must be given.
    epochs : int or None
        Number of full passes over the data (>= 1).
    proximal_mu : float
        FedProx weight ``mu``: each step descends ``F_k(w) + (mu/2) ||w -
        w_global||^2``, i.e. adds ``mu (w - w_global)`` to the mini-batch gradient.
    generator : torch.Generator
        Source of the mini-batch permutations; the same seed gives the same
        trained weights.

    Returns
    -------
    dict of str to float
        ``"train-loss"``: mean over the steps of the mini-batch objective loss
        (regularizer included, proximal term excluded, measured before each
        step); ``"num-steps"``: the number of steps done.

    Raises
    ------
    ValueError
        For empty local data (there is nothing to train on, and a silent no-op
        would pass for training), mismatched ``x``/``y`` lengths, or invalid
        settings.
    """
    num_samples = _check_data(x, y)
    if (local_steps is None) == (epochs is None):
        raise ValueError("give exactly one of local_steps and epochs")
    if lr <= 0 or batch_size < 1 or proximal_mu < 0:
        raise ValueError(
            f"need lr > 0, batch_size >= 1, proximal_mu >= 0; got lr={lr}, "
            f"batch_size={batch_size}, proximal_mu={proximal_mu}"
        )
    if local_steps is not None:
        num_steps = local_steps
    else:
        assert epochs is not None
        num_steps = epochs * math.ceil(num_samples / batch_size)
    if num_steps < 1:
        raise ValueError(
            f"need at least one step, got local_steps={local_steps}, epochs={epochs}"
        )
    model.train()
    device = model_device(model)
    parameters = list(model.parameters())
    # w_global of the proximal term: the weights on entry.
    anchors = [p.detach().clone() for p in parameters]
    loss_sum = torch.zeros((), device=device)
    for batch in itertools.islice(
        _minibatches(num_samples, batch_size, generator), num_steps
    ):
        loss = objective.loss(model, x[batch].to(device), y[batch].to(device))
        batch_grads = torch.autograd.grad(
            loss, parameters, allow_unused=True, materialize_grads=True
        )
        with torch.no_grad():
            for parameter, parameter_grad, anchor in zip(
                parameters, batch_grads, anchors, strict=True
            ):
                step = parameter_grad
                if proximal_mu > 0:
                    step = step + proximal_mu * (parameter - anchor)
                parameter.sub_(lr * step)
        loss_sum += loss.detach()
    return {
        protocol.TRAIN_LOSS: float(loss_sum) / num_steps,
        protocol.NUM_STEPS: float(num_steps),
    }


def _minibatches(
    num_samples: int, batch_size: int, generator: torch.Generator
) -> Iterator[Tensor]:
    """Endless mini-batch indices: epoch after epoch of shuffled data."""
    while True:
        permutation = torch.randperm(num_samples, generator=generator)
        yield from permutation.split(batch_size)


def full_gradient(
    model: nn.Module, x: Tensor, y: Tensor, objective: Objective
) -> list[Tensor]:
    """Gradient of the mean loss over all of ``x, y`` (FOLB's ``grad F_k(w^t)``).

    Parameters
    ----------
    model : torch.nn.Module
        The model at which the gradient is taken (not modified).
    x, y : torch.Tensor
        The data, processed in chunks of ``EVAL_CHUNK_SIZE`` rows.
    objective : Objective
        The loss, regularizer included.

    Returns
    -------
    list of torch.Tensor
        Detached gradients in ``model.parameters()`` order, on the model's device.
    """
    _check_data(x, y)
    return mean_gradient(
        model,
        zip(x.split(EVAL_CHUNK_SIZE), y.split(EVAL_CHUNK_SIZE), strict=True),
        objective.loss,
    )


BatchLoss = Callable[[nn.Module, Tensor, Tensor], Tensor]
"""Maps a model, a batch's inputs and its targets to the batch's mean loss."""


def mean_gradient(
    model: nn.Module, batches: Iterable[tuple[Tensor, Tensor]], batch_loss: BatchLoss
) -> list[Tensor]:
    """Gradient of the mean per-sample loss over all samples of ``batches``.

    Each batch's mean loss is weighted by its share of the samples seen so far
    (a running mean), so batches of any sizes give the mean over all samples,
    and a single batch gives exactly its own gradient. Buffers (BatchNorm's
    running statistics) are restored afterwards: taking a gradient does not
    train the model.

    Parameters
    ----------
    model : torch.nn.Module
        The model at which the gradient is taken, in the mode it is in.
    batches : iterable of (torch.Tensor, torch.Tensor)
        Inputs and targets, on any device (moved to the model's).
    batch_loss : BatchLoss
        The batch's mean loss, e.g. :meth:`Objective.loss`.

    Returns
    -------
    list of torch.Tensor
        Detached gradients in ``model.parameters()`` order, on the model's device.

    Raises
    ------
    ValueError
        If ``batches`` holds no sample.
    """
    device = model_device(model)
    parameters = list(model.parameters())
    buffers = [buffer.detach().clone() for buffer in model.buffers()]
    total = [torch.zeros_like(p) for p in parameters]
    num_seen = 0
    with torch.enable_grad():
        for inputs, targets in batches:
            if len(targets) == 0:
                continue
            num_seen += len(targets)
            share = len(targets) / num_seen
            batch_grads = torch.autograd.grad(
                batch_loss(model, inputs.to(device), targets.to(device)) * share,
                parameters,
                allow_unused=True,
                materialize_grads=True,
            )
            for accumulated, batch_grad in zip(total, batch_grads, strict=True):
                if share < 1:
                    accumulated.mul_(1 - share)
                accumulated += batch_grad
    with torch.no_grad():
        for buffer, saved in zip(model.buffers(), buffers, strict=True):
            buffer.copy_(saved)
    if num_seen == 0:
        raise ValueError("no data: need at least one sample")
    return total


def random_local_steps(max_steps: int, rng: np.random.Generator) -> int:
    """A uniform draw from ``1..max_steps`` (FedProx/FOLB straggler simulation)."""
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    return int(rng.integers(1, max_steps, endpoint=True))


def evaluate(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    objective: Objective,
    optimum: Sequence[np.ndarray] | None = None,
) -> dict[str, float]:
    """Loss and accuracy, or mean-square deviation from a known optimum.

    Parameters
    ----------
    model : torch.nn.Module
        The model to evaluate (left in the train/eval mode it came in).
    x, y : torch.Tensor
        Evaluation data, processed in chunks without gradients.
    objective : Objective
        The loss, regularizer included.
    optimum : sequence of numpy.ndarray or None
        The optimal parameters in ``model.parameters()`` order (e.g.
        ``FederatedSplit.optimum``).

    Returns
    -------
    dict of str to float
        ``"loss"``; ``"accuracy"`` for classification; ``"msd"`` when ``optimum``
        is given: ``||w - w^o||^2`` summed over all parameters (ISFedAvg eq. 32).
    """
    num_samples = _check_data(x, y)
    device = model_device(model)
    was_training = model.training
    model.eval()
    loss_sum = 0.0
    correct = 0
    with torch.no_grad():
        for x_chunk, y_chunk in zip(
            x.split(EVAL_CHUNK_SIZE), y.split(EVAL_CHUNK_SIZE), strict=True
        ):
            x_chunk, y_chunk = x_chunk.to(device), y_chunk.to(device)
            outputs = model(x_chunk)
            loss_sum += float(objective.sample_losses(outputs, y_chunk).sum())
            if objective.task == "classification":
                correct += int((outputs.argmax(dim=1) == y_chunk).sum())
        metrics = {"loss": loss_sum / num_samples}
        if objective.l2 > 0:
            metrics["loss"] += float(objective.penalty(model.parameters()))
    model.train(was_training)
    if objective.task == "classification":
        metrics["accuracy"] = correct / num_samples
    if optimum is not None:
        metrics["msd"] = _squared_distance(model, optimum)
    return metrics


def _squared_distance(model: nn.Module, optimum: Sequence[np.ndarray]) -> float:
    """``||w - w^o||^2`` over all parameters."""
    parameters = list(model.parameters())
    if len(optimum) != len(parameters):
        raise ValueError(
            f"optimum has {len(optimum)} arrays, the model {len(parameters)} parameters"
        )
    squared = 0.0
    for index, (parameter, target) in enumerate(zip(parameters, optimum, strict=True)):
        if tuple(parameter.shape) != target.shape:
            raise ValueError(
                f"optimum array {index} has shape {target.shape}, "
                f"the parameter {tuple(parameter.shape)}"
            )
        difference = (
            parameter.detach().cpu().double() - torch.from_numpy(target).double()
        )
        squared += float(difference.pow(2).sum())
    return squared


def get_weights(model: nn.Module) -> list[np.ndarray]:
    """Copies of the model's state (parameters and buffers), in ``state_dict`` order."""
    return [
        value.detach().cpu().numpy().copy() for value in model.state_dict().values()
    ]


def set_weights(model: nn.Module, weights: list[np.ndarray]) -> None:
    """Load arrays from :func:`get_weights` order into the model.

    Raises
    ------
    ValueError
        If the number of arrays or the shape of one differs from the model's
        state; the message names the layer.
    """
    state = model.state_dict()
    if len(weights) != len(state):
        raise ValueError(f"got {len(weights)} arrays for {len(state)} model tensors")
    for (name, current), array in zip(state.items(), weights, strict=True):
        if tuple(current.shape) != tuple(array.shape):
            raise ValueError(
                f"{name}: expected shape {tuple(current.shape)}, got {array.shape}"
            )
    model.load_state_dict(
        {
            name: torch.as_tensor(array, dtype=current.dtype)
            for (name, current), array in zip(state.items(), weights, strict=True)
        }
    )


def _check_data(x: Tensor, y: Tensor) -> int:
    """The number of samples, after checking it is positive and matches ``y``."""
    if len(x) != len(y):
        raise ValueError(f"x has {len(x)} samples, y has {len(y)}")
    if len(x) == 0:
        raise ValueError("no data: need at least one sample")
    return len(x)
