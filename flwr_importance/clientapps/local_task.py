"""The ready-made handlers' plumbing: the local task and plain training.

A ClientApp handler needs the node's model architecture, its loss, its local data
and its training settings. Users describe those once, as a :class:`LocalTask`
built by a ``TaskFactory`` from the node's ``Context``; every handler factory in
:mod:`flwr_importance.clientapps` takes such a factory::

    from flwr_importance.clientapps.local_task import LocalTask, make_train_handler

    def my_task(context):
        x, y = load_my_partition(context.node_config["partition-id"])
        return LocalTask(model=MyNet(), objective=Objective("classification"),
                         x=x, y=y, lr=0.05, batch_size=32, local_steps=20)

    app = ClientApp()
    app.train()(make_train_handler(my_task))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message

from flwr_importance import protocol
from flwr_importance.clientapps.messages import (
    ClientHandler,
    arrays_reply,
    config_number,
    message_arrays,
    metrics_reply,
    register_handlers,
    server_round_of,
)
from flwr_importance.tasks import (
    Objective,
    evaluate,
    random_local_steps,
    train_local,
)
from flwr_importance.tasks.training import EVAL_CHUNK_SIZE


@dataclass
class LocalTask:
    """A node's learning problem, as the ClientApp handlers need it.

    Parameters
    ----------
    model : torch.nn.Module
        The architecture; its weights are replaced by the received global model.
    objective : Objective
        Per-sample loss (and regularization) of the task.
    x, y : torch.Tensor
        The node's local training data.
    lr : float
        Local SGD learning rate.
    batch_size : int
        Local mini-batch size.
    local_steps : int or None
        Local SGD steps per round (exactly one of this and ``epochs``).
    epochs : int or None
        Local epochs per round.
    heterogeneous_steps : bool
        Draw the number of local steps uniformly from ``1..local_steps`` each
        round (the FedProx/FOLB simulation of stragglers).
    seed : int
        Node-specific seed; each round's randomness derives from it and the round.
    x_val, y_val : torch.Tensor or None
        The node's local validation split (both or neither). When given, the
        ready evaluate handler (:func:`make_evaluate_handler`) scores the
        received model on it; otherwise on the training data ``x, y``.

    Raises
    ------
    ValueError
        If only one of ``x_val`` and ``y_val`` is given, or their numbers of
        rows differ.
    """

    model: torch.nn.Module
    objective: Objective
    x: torch.Tensor
    y: torch.Tensor
    lr: float
    batch_size: int
    local_steps: int | None = None
    epochs: int | None = None
    heterogeneous_steps: bool = False
    seed: int = 0
    x_val: torch.Tensor | None = None
    y_val: torch.Tensor | None = None

    def __post_init__(self) -> None:
        """Check that the validation split is whole: both tensors, same rows."""
        if (self.x_val is None) != (self.y_val is None):
            raise ValueError("give both x_val and y_val, or neither")
        if (
            self.x_val is not None
            and self.y_val is not None
            and len(self.x_val) != len(self.y_val)
        ):
            raise ValueError(
                f"x_val has {len(self.x_val)} rows, y_val {len(self.y_val)}"
            )

    def evaluation_data(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)`` to evaluate on: the validation split if given, else training."""
        if self.x_val is not None and self.y_val is not None:
            return self.x_val, self.y_val
        return self.x, self.y


TaskFactory = Callable[[Context], LocalTask]

__all__ = [
    "LocalTask",
    "TaskFactory",
    "load_global_model",
    "make_evaluate_handler",
    "make_train_handler",
    "model_reply",
    "received_task",
    "register_handlers",
    "round_generators",
    "round_local_steps",
    "task_batches",
    "train_round",
]


def round_generators(
    task: LocalTask, server_round: int
) -> tuple[np.random.Generator, torch.Generator]:
    """NumPy and torch generators for this node and round.

    Seeding by (node seed, round) rather than keeping a generator in the node
    state makes every strategy see the same draws for the same node and round,
    so baselines and methods are compared on identical local randomness.
    """
    seed_sequence = np.random.SeedSequence([task.seed, server_round])
    numpy_rng = np.random.default_rng(seed_sequence)
    torch_rng = torch.Generator().manual_seed(int(seed_sequence.generate_state(1)[0]))
    return numpy_rng, torch_rng


def round_local_steps(task: LocalTask, numpy_rng: np.random.Generator) -> int | None:
    """The round's number of local steps (random when ``heterogeneous_steps``)."""
    if task.local_steps is None or not task.heterogeneous_steps:
        return task.local_steps
    return random_local_steps(task.local_steps, numpy_rng)


def load_global_model(task: LocalTask, message: Message) -> None:
    """Load the message's model (its single ArrayRecord) into ``task.model``."""
    task.model.load_state_dict(message_arrays(message).to_torch_state_dict())


def received_task(
    task_factory: TaskFactory, message: Message, context: Context
) -> LocalTask:
    """The node's task from ``task_factory``, holding the message's model.

    Parameters
    ----------
    task_factory : TaskFactory
        Builds the node's :class:`LocalTask` from its ``Context``.
    message : Message
        The server's message; its single ArrayRecord is the global model.
    context : Context
        The node's context.

    Returns
    -------
    LocalTask
        A new task whose ``model`` holds the received weights
        (:func:`load_global_model`).
    """
    task = task_factory(context)
    load_global_model(task, message)
    return task


def model_reply(
    message: Message, model: torch.nn.Module, metrics: Mapping[str, float | int]
) -> Message:
    """Reply with the model's weights under ``arrays`` and ``metrics``."""
    return arrays_reply(message, ArrayRecord(model.state_dict()), metrics)


def train_round(
    task: LocalTask, server_round: int, proximal_mu: float = 0.0
) -> dict[str, float]:
    """The round's local SGD on ``task.model``, from the weights it holds now.

    Uses the node's round randomness (:func:`round_generators`), so every method
    that trains locally sees the same mini-batches and step counts for the same
    node and round. Returns ``train_local``'s metrics.
    """
    numpy_rng, torch_rng = round_generators(task, server_round)
    local_steps = round_local_steps(task, numpy_rng)
    return train_local(
        task.model,
        task.x,
        task.y,
        task.objective,
        lr=task.lr,
        batch_size=task.batch_size,
        local_steps=local_steps,
        epochs=None if local_steps is not None else task.epochs,
        proximal_mu=proximal_mu,
        generator=torch_rng,
    )


def task_batches(
    task: LocalTask, indices: Sequence[int]
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The task's samples at ``indices``, as ``(x, y)`` batches of bounded size.

    What a user's ``DataLoader`` over a ``Subset`` gives (and, like it,
    re-iterable), for the helpers that take one; chunks of ``EVAL_CHUNK_SIZE``
    rows keep each forward pass's memory bounded.
    """
    rows = torch.as_tensor(indices, dtype=torch.long)
    return [(task.x[chunk], task.y[chunk]) for chunk in rows.split(EVAL_CHUNK_SIZE)]


def make_train_handler(task_factory: TaskFactory) -> ClientHandler:
    """FedAvg/FedProx local training: SGD from the global model.

    Reads ``proximal-mu`` from the config (Flower's ``FedProx`` sends it; absent
    means plain FedAvg). Replies with the trained model, ``train-loss``,
    ``num-steps`` and ``num-examples`` (the weight Flower's ``FedAvg`` uses).
    """

    def train(message: Message, context: Context) -> Message:
        task = received_task(task_factory, message, context)
        proximal_mu = config_number(message, protocol.PROXIMAL_MU, 0.0)
        result = train_round(task, server_round_of(message), proximal_mu)
        return model_reply(
            message, task.model, {**result, protocol.NUM_EXAMPLES: len(task.x)}
        )

    return train


def make_evaluate_handler(task_factory: TaskFactory) -> ClientHandler:
    """Federated evaluation of the received model on the node's local data.

    The data are the task's validation split (``x_val``, ``y_val``) when it
    has one, else its training data; ``num-examples`` counts the rows scored.
    """

    def evaluate_handler(message: Message, context: Context) -> Message:
        task = received_task(task_factory, message, context)
        x, y = task.evaluation_data()
        metrics = evaluate(task.model, x, y, task.objective)
        return metrics_reply(message, {**metrics, protocol.NUM_EXAMPLES: len(x)})

    return evaluate_handler
