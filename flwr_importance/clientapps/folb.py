"""FOLB on the client: FedProx training plus the gradient FOLB weighs with.

Nguyen et al., "Fast-convergent federated learning" (IEEE JSAC 2021). FOLB's
devices run FedProx (minimize ``F_k(w) + (mu/2)||w - w^t||^2`` from the
received ``w^t``) and report, besides their update ``dw_k = w_k - w^t`` and
their sample count ``n_k``, the full local gradient ``g_k = grad F_k(w^t)`` at
the *received* model and the inexactness ``gamma_k`` of their local solve.
The messages and replies are the ``Client contract`` of
:class:`flwr_importance.strategies.FOLB`; the helpers below meet it.

Your own train function (Flower's quickstart-pytorch shape: ``load_data``'s
DataLoaders of ``{"img", "label"}`` batches, which the helpers read through
``unpack=``), lines added or changed marked ``# FOLB``; your DataLoader,
loss, optimizer, learning rate, epochs and device stay::

    from flwr_importance.clientapps.folb import (
        ProximalTerm, folb_reply, inexactness, local_gradient,
    )

    def unpack(batch):  # FOLB: your batch layout, given once
        return batch["img"], batch["label"]

    @app.train()
    def train(msg, context):
        model = Net()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        model.to(device)
        trainloader, _ = load_data(partition_id, num_partitions, batch_size)
        criterion = torch.nn.CrossEntropyLoss()
        gradient = local_gradient(model, trainloader, criterion, unpack=unpack)  # FOLB
        proximal = ProximalTerm(model, msg)  # FOLB: mu from "proximal-mu"
        optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        for _ in range(epochs):
            for batch in trainloader:
                images, labels = batch["img"].to(device), batch["label"].to(device)
                optimizer.zero_grad()
                loss = criterion(model(images), labels) + proximal(model)  # FOLB
                loss.backward()
                optimizer.step()
        gamma = inexactness(  # FOLB
            model, trainloader, criterion, gradient=gradient, proximal=proximal,
            unpack=unpack,
        )
        return folb_reply(  # FOLB: update, gradient, gamma
            msg, model, gradient=gradient, gamma=gamma,
            metrics={"num-examples": len(trainloader.dataset)},
        )

    @app.query("gradient")  # FOLB two-set mode only
    def gradient(msg, context):
        model = Net()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        trainloader, _ = load_data(partition_id, num_partitions, batch_size)
        return gradient_reply(
            msg,
            local_gradient(
                model, trainloader, torch.nn.CrossEntropyLoss(), unpack=unpack
            ),
            num_examples=len(trainloader.dataset),
        )

Without ``unpack=`` the helpers expect ``(inputs, targets)`` batches (a
``TensorDataset``) and refuse others with a ``TypeError``.
``examples/quickstart-pytorch`` adds the proximal term through its
``task.train``'s ``proximal=`` argument (FedProx's local solve).

The ready-made :func:`make_folb_handlers` are built on the same
functions (their local solve is :func:`make_train_handler`'s FedProx).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from logging import WARNING
from typing import Any

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from torch import Tensor, nn

from flwr_importance import protocol
from flwr_importance.clientapps._device import (
    Criterion,
    Unpack,
    inputs_and_targets,
    mean_loss_gradient,
)
from flwr_importance.clientapps.local_task import (
    ClientHandler,
    TaskFactory,
    make_evaluate_handler,
    make_train_handler,
    received_task,
)
from flwr_importance.clientapps.messages import (
    MetricValue,
    config_number,
    message_arrays,
)
from flwr_importance.tasks import full_gradient


def _received_state(message: Message) -> dict[str, Tensor]:
    """The model the message carries (its single ArrayRecord), as CPU tensors."""
    return message_arrays(message).to_torch_state_dict()


class ProximalTerm:
    """FedProx's proximal term ``(mu/2) ||w - w^t||^2``, to add to your loss.

    ``w^t`` is the model the train message carries and ``mu`` its config's
    ``proximal-mu`` (0, no term, when absent), so the server's ``mu`` reaches
    your loss. The term lives on the model's device.

    Parameters
    ----------
    model : torch.nn.Module
        Your model; its parameter names select ``w^t`` in the message.
    message : Message
        The server's train message.

    Attributes
    ----------
    mu : float
        The proximal weight.
    anchor : list of torch.Tensor
        ``w^t`` in ``model.parameters()`` order, on the model's device.

    """

    def __init__(self, model: nn.Module, message: Message) -> None:
        self.mu = config_number(message, protocol.PROXIMAL_MU, 0.0)
        if self.mu < 0:
            raise ValueError(f"{protocol.PROXIMAL_MU} must be >= 0, got {self.mu}")
        received = _received_state(message)
        missing = [name for name, _ in model.named_parameters() if name not in received]
        if missing:
            raise ValueError(f"the message's model lacks parameters {missing}")
        self.anchor = [
            received[name].to(dtype=parameter.dtype, device=parameter.device)
            for name, parameter in model.named_parameters()
        ]

    def __call__(self, model: nn.Module) -> Tensor:
        """``(mu/2) ||w - w^t||^2`` at the model's current weights."""
        return proximal_penalty(list(model.parameters()), self.anchor, mu=self.mu)


def proximal_penalty(
    parameters: list[Tensor], anchor: list[Tensor], *, mu: float
) -> Tensor:
    """``(mu/2) ||w - w^t||^2`` over all ``parameters``, with a gradient graph.

    Examples
    --------
    >>> w, w_t = [torch.tensor([1.0, 2.0])], [torch.zeros(2)]
    >>> float(proximal_penalty(w, w_t, mu=0.5))  # 0.5 / 2 * (1 + 4)
    1.25
    >>> float(proximal_penalty(w, w_t, mu=0.0))
    0.0
    """
    if mu == 0:
        return torch.zeros((), device=parameters[0].device)
    squared = torch.stack(
        [
            (parameter - start).pow(2).sum()
            for parameter, start in zip(parameters, anchor, strict=True)
        ]
    ).sum()
    return 0.5 * mu * squared


def gradient_record(model: nn.Module, gradient: list[Tensor]) -> ArrayRecord:
    """``gradient`` (in ``model.parameters()`` order) keyed like the state dict.

    Shaped like the model's ``state_dict`` so the server checks it against the
    global model; buffers (no gradient) get zeros.
    """
    by_name = {
        name: grad
        for (name, _), grad in zip(model.named_parameters(), gradient, strict=True)
    }
    return ArrayRecord(
        {
            key: by_name.get(key, torch.zeros_like(value)).detach()
            for key, value in model.state_dict().items()
        }
    )


def local_gradient(
    model: nn.Module,
    batches: Iterable[Any],
    criterion: Criterion,
    *,
    unpack: Unpack = inputs_and_targets,
) -> ArrayRecord:
    """``g_k = grad F_k(w)``: the gradient of your mean loss over all your data.

    Call it on the received model, before training: it is the ArrayRecord the
    strategy expects under ``"gradient"`` (:data:`~flwr_importance.protocol.\
FOLB_GRADIENT`). The model is not changed (BatchNorm statistics included).

    Parameters
    ----------
    model : torch.nn.Module
        Your model, on any device (the batches are moved to it), in the mode
        you train it in.
    batches : iterable
        Your DataLoader (one pass).
    criterion : Criterion
        Your loss, mean over the batch (e.g. ``torch.nn.CrossEntropyLoss()``);
        the batches' means are weighted by their sizes.
    unpack : Unpack
        Splits a batch into ``(inputs, targets)``.

    Returns
    -------
    ArrayRecord
        Keyed like the model's state dict (zeros for buffers).
    """
    return gradient_record(model, mean_loss_gradient(model, batches, criterion, unpack))


def inexactness_ratio(proximal_gradient_norm: float, initial_norm: float) -> float:
    """``gamma_k = ||grad h_k(w_k; w^t)|| / ||grad F_k(w^t)||``, unclipped.

    A zero ``||grad F_k(w^t)||`` (the received model is already stationary)
    gives 0.

    Examples
    --------
    >>> inexactness_ratio(0.5, 2.0)
    0.25
    >>> inexactness_ratio(0.5, 0.0)
    0.0
    """
    return 0.0 if initial_norm == 0.0 else proximal_gradient_norm / initial_norm


def _gamma(
    model: nn.Module,
    trained_gradient: list[Tensor],
    gradient: ArrayRecord,
    proximal: ProximalTerm,
    node_id: int | None,
) -> float:
    """``gamma_k`` from ``grad F_k`` at the trained model, clipped to [0, 1]."""
    squared = sum(
        float((grad + proximal.mu * (parameter.detach() - start)).pow(2).sum())
        for grad, parameter, start in zip(
            trained_gradient, model.parameters(), proximal.anchor, strict=True
        )
    )
    initial_norm = math.sqrt(
        sum(
            float(torch.from_numpy(gradient[name].numpy()).pow(2).sum())
            for name, _ in model.named_parameters()
        )
    )
    gamma = inexactness_ratio(math.sqrt(squared), initial_norm)
    if gamma > 1.0:
        log(
            WARNING,
            "FOLB node %s: inexactness %.4g > 1 (local solve raised the gradient), "
            "clipped to 1",
            "?" if node_id is None else node_id,
            gamma,
        )
        return 1.0
    return gamma


def inexactness(
    model: nn.Module,
    batches: Iterable[Any],
    criterion: Criterion,
    *,
    gradient: ArrayRecord,
    proximal: ProximalTerm,
    unpack: Unpack = inputs_and_targets,
    node_id: int | None = None,
) -> float:
    """FOLB's ``gamma_k`` of your local solve, after training.

    ``gamma_k = ||grad F_k(w_k) + mu (w_k - w^t)|| / ||grad F_k(w^t)||``: the
    gradient of the FedProx objective at the trained model over the one at
    the received model. The paper assumes ``gamma_k in [0, 1]`` (a solver that
    makes progress); a few noisy steps can leave the gradient larger than
    they found it, which is clipped to 1 with a log line.

    Parameters
    ----------
    model : torch.nn.Module
        Your trained model (not changed).
    batches, criterion, unpack
        As for :func:`local_gradient` (the same data and loss).
    gradient : ArrayRecord
        ``g_k`` from :func:`local_gradient` before training.
    proximal : ProximalTerm
        Your proximal term (``w^t`` and ``mu``).
    node_id : int or None
        Named in the log line (e.g. ``context.node_id``).

    Returns
    -------
    float
        ``gamma_k`` in ``[0, 1]``.
    """
    trained_gradient = mean_loss_gradient(model, batches, criterion, unpack)
    return _gamma(model, trained_gradient, gradient, proximal, node_id)


def folb_reply(
    message: Message,
    model: nn.Module,
    *,
    gradient: ArrayRecord,
    gamma: float,
    metrics: Mapping[str, MetricValue],
) -> Message:
    """FOLB's train reply: the update, ``g_k``, ``gamma_k`` and your metrics.

    The update ``dw_k = w_k - w^t`` (``w^t`` from the message) replaces the
    model: FOLB aggregates updates (eq. 13), and an update is as large as a
    model on the wire.

    Parameters
    ----------
    message : Message
        The server's train message.
    model : torch.nn.Module
        Your trained model (on any device).
    gradient : ArrayRecord
        ``g_k`` from :func:`local_gradient`.
    gamma : float
        ``gamma_k`` from :func:`inexactness`.
    metrics : mapping
        Your metrics; must hold ``num-examples`` (``n_k``, FOLB's weight).

    Raises
    ------
    ValueError
        If ``metrics`` lacks ``num-examples``.
    """
    if protocol.NUM_EXAMPLES not in metrics:
        raise ValueError(
            f"FOLB weighs devices by '{protocol.NUM_EXAMPLES}': add it to metrics"
        )
    received = _received_state(message)
    update = ArrayRecord(
        {
            key: value.detach().cpu() - received[key].to(dtype=value.dtype)
            for key, value in model.state_dict().items()
        }
    )
    content = RecordDict(
        {
            protocol.FOLB_UPDATE: update,
            protocol.FOLB_GRADIENT: gradient,
            protocol.METRIC_RECORD: MetricRecord(
                {**metrics, protocol.FOLB_GAMMA: gamma}
            ),
        }
    )
    return Message(content, reply_to=message)


def gradient_reply(
    message: Message, gradient: ArrayRecord, *, num_examples: int
) -> Message:
    """The ``query.gradient`` reply (two-set FOLB): ``g_k`` and ``n_k``."""
    content = RecordDict(
        {
            protocol.FOLB_GRADIENT: gradient,
            protocol.METRIC_RECORD: MetricRecord({protocol.NUM_EXAMPLES: num_examples}),
        }
    )
    return Message(content, reply_to=message)


def make_folb_train_handler(task_factory: TaskFactory) -> ClientHandler:
    """FOLB training: ``g_k`` at the received model, FedProx solve, ``gamma_k``.

    The local solve *is* :func:`make_train_handler`'s (same seeds per node and
    round, same number of local steps), so FOLB, FedProx and FedAvg runs
    differ only in their aggregation; the gradient, ``gamma_k`` and the reply
    are the user-facing helpers', on the task's data and objective.
    """
    fedprox_train = make_train_handler(task_factory)

    def train(message: Message, context: Context) -> Message:
        task = received_task(task_factory, message, context)
        gradient = gradient_record(
            task.model, full_gradient(task.model, task.x, task.y, task.objective)
        )
        trained_reply = fedprox_train(message, context)
        trained_state = trained_reply.content.array_records[protocol.ARRAY_RECORD]
        task.model.load_state_dict(trained_state.to_torch_state_dict())
        gamma = _gamma(
            task.model,
            full_gradient(task.model, task.x, task.y, task.objective),
            gradient,
            ProximalTerm(task.model, message),
            context.node_id,
        )
        return folb_reply(
            message,
            task.model,
            gradient=gradient,
            gamma=gamma,
            metrics=dict(trained_reply.content.metric_records[protocol.METRIC_RECORD]),
        )

    return train


def make_folb_gradient_handler(task_factory: TaskFactory) -> ClientHandler:
    """FOLB's ``query.gradient``: ``g_k`` at the received model, no training."""

    def gradient_handler(message: Message, context: Context) -> Message:
        task = received_task(task_factory, message, context)
        gradient = full_gradient(task.model, task.x, task.y, task.objective)
        return gradient_reply(
            message, gradient_record(task.model, gradient), num_examples=len(task.x)
        )

    return gradient_handler


def make_folb_handlers(task_factory: TaskFactory) -> dict[str, ClientHandler]:
    """FOLB's handler set: ``train``, ``query.gradient`` and ``evaluate``."""
    return {
        "train": make_folb_train_handler(task_factory),
        "query.gradient": make_folb_gradient_handler(task_factory),
        "evaluate": make_evaluate_handler(task_factory),
    }
