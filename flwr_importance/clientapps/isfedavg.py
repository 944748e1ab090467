"""ISFedAvg on the client: importance-sampled batches, eq. 8 weights, eq. 29.

Rizk, Vlaski, Sayed, "Optimal Importance Sampling for Federated Learning"
(ICASSP 2021). The node keeps a probability ``p_n`` per local sample in its
``context.state`` across rounds, draws each of its ``E_k`` mini-batches of
``B_k`` distinct samples with ``P(n in B) = B_k p_n``, weighs every sample's
loss as in eq. 8, moves the batch's probabilities towards the per-sample
gradient norms (eq. 29) and reports the two statistics the server needs for
eq. 28: ``sigma2_k`` (eq. 22) and ``||grad P_k||^2`` (eq. 14).

**ISFedAvg decides the number of local steps ``E_k`` and the batch size
``B_k`` on the server**, per node: with this method they replace your epochs
and batch size. :class:`ImportanceSampler` is the batch sampler that draws
exactly ``E_k`` batches of ``B_k``; its ``local_steps`` and ``batch_size`` say
what they are this round (the server's ``local_steps_range`` and
``batch_size_range`` can fix them to yours). Your optimizer, loss and device
stay; eq. 8 divides each step by ``E_k`` unless the server's
``ISFedAvg(keep_app_step_size=True)`` keeps your learning rate's own step.

Your own train function (Flower's quickstart-pytorch shape: ``load_data``'s
DataLoaders of ``{"img", "label"}`` batches), lines added or changed marked
``# ISFedAvg``::

    from flwr_importance.clientapps.isfedavg import ImportanceSampler

    @app.train()
    def train(msg, context):
        model = Net()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        model.to(device)
        trainloader, _ = load_data(partition_id, num_partitions, batch_size)
        trainset = trainloader.dataset  # ISFedAvg
        sampler = ImportanceSampler.from_message(  # ISFedAvg
            msg, context, num_samples=len(trainset)
        )
        trainloader = DataLoader(trainset, batch_sampler=sampler)  # ISFedAvg: E_k x B_k
        criterion = torch.nn.CrossEntropyLoss(reduction="none")  # ISFedAvg
        optimizer = torch.optim.SGD(
            model.parameters(), lr=msg.content["config"]["lr"], momentum=0.9
        )
        for batch in trainloader:
            images, labels = batch["img"].to(device), batch["label"].to(device)
            sampler.observe(model, images, labels, criterion)  # ISFedAvg
            optimizer.zero_grad()
            loss = sampler.weighted_loss(criterion(model(images), labels))  # ISFedAvg
            loss.backward()
            optimizer.step()
        metrics = {**sampler.finish(context), "num-examples": len(trainset)}  # ISFedAvg
        return Message(
            RecordDict({"arrays": ArrayRecord(model.state_dict()),
                        "metrics": MetricRecord(metrics)}),
            reply_to=msg,
        )

``examples/quickstart-pytorch`` keeps the loop in its ``task.py`` as
``train_isfedavg(net, trainloader, sampler, lr, device)``, a variant of
Flower's ``train``, and the sampler in its ClientApp's ``train_isfedavg``.

The ready-made :func:`make_isfedavg_handlers` run the same sampler on a
:class:`~flwr_importance.clientapps.LocalTask` with plain SGD (the paper's
step). Only its ``model``, ``objective``, ``x``, ``y``, ``lr`` and ``seed``
are used: ``E_k`` and ``B_k`` come from the server.

The sampler, the round's settings and the node's per-sample state live in
:mod:`.isfedavg_sampler`; this module exports them with the helpers and
handlers built on them.
"""

from __future__ import annotations

import torch
from flwr.app import Context, Message
from torch import Tensor, nn

from flwr_importance import per_sample, protocol
from flwr_importance.clientapps._device import model_device
from flwr_importance.clientapps.isfedavg_sampler import (
    SAMPLE_STATE_KEY,
    ImportanceSampler,
    RoundSettings,
    SampleState,
    importance_loss_weights,
)
from flwr_importance.clientapps.local_task import (
    ClientHandler,
    LocalTask,
    TaskFactory,
    make_evaluate_handler,
    model_reply,
    received_task,
    round_generators,
)
from flwr_importance.clientapps.messages import server_round_of
from flwr_importance.per_sample import (
    SampleLoss,
    SampleMixingLayerError,
    replace_batchnorm,
)

__all__ = [
    "SAMPLE_STATE_KEY",
    "ImportanceSampler",
    "RoundSettings",
    "SampleMixingLayerError",
    "SampleState",
    "importance_loss_weights",
    "importance_sampled_sgd",
    "make_isfedavg_handlers",
    "make_isfedavg_train_handler",
    "per_sample_grad_norms",
    "replace_batchnorm",
]


def per_sample_grad_norms(
    model: nn.Module, inputs: Tensor, targets: Tensor, sample_loss: SampleLoss
) -> Tensor:
    """``||grad_w loss(model(x_n), y_n)||`` for every sample, on the model's device.

    Exact per-sample gradient norms of your model, layer by layer for the
    layers :mod:`flwr_importance.per_sample` serves (torch.func's
    ``vmap(grad(...))`` for others), at its current weights and in its
    current train/eval mode. Samples must not interact: BatchNorm in train
    mode raises :class:`SampleMixingLayerError` (fix: :func:`replace_batchnorm`).

    Parameters
    ----------
    model : torch.nn.Module
        Your model (on any device; the data are moved to it).
    inputs, targets : torch.Tensor
        One batch.
    sample_loss : SampleLoss
        Your loss with ``reduction="none"``, e.g.
        ``torch.nn.CrossEntropyLoss(reduction="none")``.

    Returns
    -------
    torch.Tensor
        Shape ``(B,)``.
    """
    return per_sample.per_sample_grad_norms(model, inputs, targets, sample_loss, 0.0)


def importance_sampled_sgd(
    task: LocalTask, sampler: ImportanceSampler
) -> dict[str, float]:
    """ISFedAvg's local steps (Algorithm 1, inner loop), in place on ``task.model``.

    Plain SGD, the paper's step: each of the sampler's batches moves the
    model by ``-lr sum_b c_b grad Q_b`` (eq. 8), on the model's device, with
    the gradient :meth:`ImportanceSampler.observe` computes together with the
    per-sample norms (one pass, at the iterate where the step is made).

    Parameters
    ----------
    task : LocalTask
        Model (updated in place), objective, data (on any device) and ``lr``.
    sampler : ImportanceSampler
        This round's sampler over ``task.x``; consumed.

    Returns
    -------
    dict of str to float
        ``train-loss`` (mean over the steps of the unweighted batch loss before
        the step) and ``num-steps``; the ISFedAvg statistics come from
        :meth:`ImportanceSampler.metrics`.
    """
    device = model_device(task.model)
    loss_sum = 0.0
    for batch in sampler:
        x_batch, y_batch = task.x[batch].to(device), task.y[batch].to(device)
        with torch.no_grad():
            loss_sum += float(task.objective.loss(task.model, x_batch, y_batch))
        step = sampler.observe(
            task.model,
            x_batch,
            y_batch,
            task.objective.sample_losses,
            l2=task.objective.l2,
        )
        with torch.no_grad():
            for parameter, parameter_grad in zip(
                task.model.parameters(), step.gradient, strict=True
            ):
                parameter.sub_(task.lr * parameter_grad)
    return {
        protocol.TRAIN_LOSS: loss_sum / sampler.local_steps,
        protocol.NUM_STEPS: float(sampler.local_steps),
    }


def make_isfedavg_train_handler(task_factory: TaskFactory) -> ClientHandler:
    """ISFedAvg local training: importance-sampled batches, eq. 8 steps.

    Builds an :class:`ImportanceSampler` from the message and the node's
    ``context.state`` (batch draws seeded by the task's seed and the round,
    :func:`round_generators`), trains with :func:`importance_sampled_sgd` on
    the model's device and replies with the model under ``arrays`` and the
    metrics ``isfedavg-sigma2``, ``isfedavg-g2``, ``train-loss``,
    ``num-steps`` and ``num-examples``.
    """

    def train(message: Message, context: Context) -> Message:
        task = received_task(task_factory, message, context)
        numpy_rng, _ = round_generators(task, server_round_of(message))
        sampler = ImportanceSampler.from_message(
            message, context, num_samples=len(task.x), rng=numpy_rng, model=task.model
        )
        train_metrics = importance_sampled_sgd(task, sampler)
        return model_reply(
            message,
            task.model,
            {
                **train_metrics,
                **sampler.finish(context),
                protocol.NUM_EXAMPLES: len(task.x),
            },
        )

    return train


def make_isfedavg_handlers(task_factory: TaskFactory) -> dict[str, ClientHandler]:
    """ISFedAvg's handler set by message type: ``train`` and ``evaluate``."""
    return {
        "train": make_isfedavg_train_handler(task_factory),
        "evaluate": make_evaluate_handler(task_factory),
    }
