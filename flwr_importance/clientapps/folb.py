"""FOLB's ClientApp handlers: FedProx training plus the gradient FOLB weighs with.

Two message types (see :class:`flwr_importance.strategies.folb.FOLB` for the
whole client contract):

- ``train`` (set ``S``/``S1``): the full local gradient ``g_k = grad F_k(w^t)`` at
  the received model, then the FedProx local solve of ``F_k(w) + (mu/2)||w -
  w^t||^2`` (``proximal-mu`` from the config) with this node's number of local
  steps, then the inexactness ``gamma_k``. Reply: ArrayRecords ``"update"``
  (``dw_k = w_k - w^t``) and ``"gradient"`` (``g_k``), metrics ``gamma``,
  ``train-loss``, ``num-steps``, ``num-examples``.
- ``query.gradient`` (set ``S2`` of the two-set rule): only ``g_k``, no training.
  Reply: ArrayRecord ``"gradient"``, metric ``num-examples``.

Use them in your own ClientApp with your own :class:`LocalTask` factory::

    app = ClientApp()
    app.train()(make_folb_train_handler(my_task))
    app.query("gradient")(make_folb_gradient_handler(my_task))
"""

from __future__ import annotations

import math
from logging import WARNING

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.common.logger import log

from flwr_importance.clientapps.common import (
    ClientHandler,
    LocalTask,
    TaskFactory,
    config_number,
    load_global_model,
    make_evaluate_handler,
    make_train_handler,
)
from flwr_importance.protocol import (
    FOLB_GAMMA,
    FOLB_GRADIENT,
    FOLB_UPDATE,
)
from flwr_importance.tasks import full_gradient


def gradient_record(
    model: torch.nn.Module, gradient: list[torch.Tensor]
) -> ArrayRecord:
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


def inexactness(
    task: LocalTask,
    anchor: list[torch.Tensor],
    initial_gradient: list[torch.Tensor],
    proximal_mu: float,
    node_id: int,
) -> float:
    """``gamma_k = ||grad h_k(w_k; w^t)|| / ||grad F_k(w^t)||``, clipped to [0, 1].

    ``grad h_k(w; w^t) = grad F_k(w) + mu (w - w^t)`` is the gradient of the
    FedProx local objective at the trained model ``task.model``; ``anchor`` holds
    ``w^t`` and ``initial_gradient`` ``g_k``, both in ``parameters()`` order. The
    paper assumes ``gamma_k in [0, 1]`` (a solver that makes progress); a few
    noisy SGD steps can leave the gradient larger than it found it, which is
    clipped to 1 with a log line. A zero ``g_k`` (already stationary) gives 0.
    """
    trained_gradient = full_gradient(task.model, task.x, task.y, task.objective)
    parameters = list(task.model.parameters())
    squared = sum(
        float((grad + proximal_mu * (param.detach() - start)).pow(2).sum())
        for grad, param, start in zip(trained_gradient, parameters, anchor, strict=True)
    )
    initial_norm = math.sqrt(sum(float(g.pow(2).sum()) for g in initial_gradient))
    if initial_norm == 0.0:
        return 0.0
    gamma = math.sqrt(squared) / initial_norm
    if gamma > 1.0:
        log(
            WARNING,
            "FOLB node %d: inexactness %.4g > 1 (local solve raised the gradient), "
            "clipped to 1",
            node_id,
            gamma,
        )
        return 1.0
    return gamma


def make_folb_train_handler(task_factory: TaskFactory) -> ClientHandler:
    """FOLB training: ``g_k`` at the received model, FedProx solve, ``gamma_k``.

    The local solve *is* :func:`make_train_handler`'s (same seeds per node and
    round, same random number of local steps), so FOLB, FedProx and FedAvg runs
    differ only in their aggregation. The reply carries the update ``dw_k``
    rather than the trained model: FOLB aggregates updates (eq. 13), and an
    update is as large as a model on the wire.
    """
    fedprox_train = make_train_handler(task_factory)

    def train(message: Message, context: Context) -> Message:
        task = task_factory(context)
        load_global_model(task, message)
        received_state = {
            key: value.detach().clone()
            for key, value in task.model.state_dict().items()
        }
        anchor = [parameter.detach().clone() for parameter in task.model.parameters()]
        gradient = full_gradient(task.model, task.x, task.y, task.objective)

        trained_reply = fedprox_train(message, context)
        trained_state = trained_reply.content.array_records["arrays"]
        task.model.load_state_dict(trained_state.to_torch_state_dict())
        gamma = inexactness(
            task,
            anchor,
            gradient,
            config_number(message, "proximal-mu", 0.0),
            context.node_id,
        )
        update = ArrayRecord(
            {
                key: value.detach() - received_state[key]
                for key, value in task.model.state_dict().items()
            }
        )
        metrics = dict(trained_reply.content.metric_records["metrics"])
        content = RecordDict(
            {
                FOLB_UPDATE: update,
                FOLB_GRADIENT: gradient_record(task.model, gradient),
                "metrics": MetricRecord({**metrics, FOLB_GAMMA: gamma}),
            }
        )
        return Message(content, reply_to=message)

    return train


def make_folb_gradient_handler(task_factory: TaskFactory) -> ClientHandler:
    """FOLB's ``query.gradient``: ``g_k`` at the received model, no training."""

    def gradient_handler(message: Message, context: Context) -> Message:
        task = task_factory(context)
        load_global_model(task, message)
        gradient = full_gradient(task.model, task.x, task.y, task.objective)
        content = RecordDict(
            {
                FOLB_GRADIENT: gradient_record(task.model, gradient),
                "metrics": MetricRecord({"num-examples": len(task.x)}),
            }
        )
        return Message(content, reply_to=message)

    return gradient_handler


def make_folb_handlers(task_factory: TaskFactory) -> dict[str, ClientHandler]:
    """FOLB's handler set: ``train``, ``query.gradient`` and ``evaluate``."""
    return {
        "train": make_folb_train_handler(task_factory),
        "query.gradient": make_folb_gradient_handler(task_factory),
        "evaluate": make_evaluate_handler(task_factory),
    }
