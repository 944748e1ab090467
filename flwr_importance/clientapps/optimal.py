"""ClientApp handlers of optimal variance-reduced sampling (OCS, AOCS and MMFL).

One client contract serves the single-model strategy
(:class:`~flwr_importance.strategies.ocs.OptimalClientSampling`, which is the
case ``S = 1``) and the multi-model one
(:class:`~flwr_importance.strategies.mmfl.MultiModelSampling`). Models are
numbered ``0..S-1`` and travel as ArrayRecords named ``model-<s>``; metric keys
carry the model index (``update-norm-0``). An update ``U`` is the local model
delta ``w_local - w_global``, sent as the ArrayRecord ``update``.

Message types handled:

``query.norm``
    One ArrayRecord per model to train (``model-<s>``); config ``server-round``.
    The client trains every model it received from that model's global weights,
    keeps each update in ``context.state`` under the round's number (an older
    round's updates are dropped first) and replies with metrics
    ``update-norm-<s>`` (``||U_s||``), ``num-examples-<s>`` and
    ``train-loss-<s>``. It reveals the norm and its sample count, not the update.
``query.loss``
    One ArrayRecord per model; replies ``loss-<s>`` (mean loss of global model
    ``s`` on the local data of task ``s``, a forward pass, no training) and
    ``num-examples-<s>``.
``query.sizes``
    Config ``num-models``; replies ``num-examples-<s>`` for every model.
``train``
    Config ``server-round``, ``model-index`` and ``kept-update``. With
    ``kept-update = true`` no model is attached and the client sends the update
    it kept from this round's ``query.norm``; a missing or stale one (the node
    restarted and lost its state) raises, which Flower turns into an error reply
    the strategy skips. Otherwise the message carries ``model-<s>`` and the
    client trains it now. Either way the reply holds the ArrayRecord ``update``
    and metrics ``num-examples``, ``train-loss`` and ``model-index``.
``evaluate`` (single model, from :func:`make_ocs_handlers` only)
    Flower's usual local evaluation of the ArrayRecord it receives.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping

import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)

from flwr_importance.clientapps.common import (
    ClientHandler,
    LocalTask,
    TaskFactory,
    config_number,
    make_evaluate_handler,
    server_round_of,
    train_round,
)
from flwr_importance.protocol import (
    MODEL_RECORD_PREFIX,
    UPDATE_RECORD,
    model_record_name,
)
from flwr_importance.tasks import evaluate

#: ``(context, model_index) -> LocalTask``: a node's task for each model.
ModelTaskFactory = Callable[[Context, int], LocalTask]

#: ``context.state`` key of the ConfigRecord saying which round the kept
#: updates belong to; the updates themselves are under ``KEPT_UPDATE_PREFIX<s>``.
KEPT_ROUND_KEY = "optimal-kept-round"
KEPT_UPDATE_PREFIX = "optimal-kept-update-"


def received_models(message: Message) -> dict[int, ArrayRecord]:
    """The message's ArrayRecords by model index (names ``model-<s>``).

    Raises
    ------
    ValueError
        If the message carries no model or an ArrayRecord named otherwise.
    """
    models: dict[int, ArrayRecord] = {}
    for name, record in message.content.array_records.items():
        index = name.removeprefix(MODEL_RECORD_PREFIX)
        if not name.startswith(MODEL_RECORD_PREFIX) or not index.isdigit():
            raise ValueError(f"unexpected ArrayRecord '{name}' (expected model-<s>)")
        models[int(index)] = record
    if not models:
        raise ValueError("the message carries no model")
    return models


def local_update(
    task: LocalTask, global_model: ArrayRecord, server_round: int
) -> tuple[ArrayRecord, dict[str, float]]:
    """Train ``task.model`` from ``global_model``; return ``U = w_local - w_global``.

    The local randomness comes from :func:`train_round`, so the update does
    not depend on whether it is computed in the query or in the train message.

    Returns
    -------
    tuple
        The update as an ArrayRecord with the model's keys, and the metrics
        ``train-loss``, ``num-steps`` and ``update-norm`` (``||U||``).
    """
    start = global_model.to_torch_state_dict()
    task.model.load_state_dict(start)
    result = train_round(task, server_round)
    trained = task.model.state_dict()
    delta = OrderedDict(
        (key, (trained[key].detach() - start[key]).to(torch.float64)) for key in start
    )
    squared = sum(float(torch.sum(value**2)) for value in delta.values())
    return ArrayRecord(delta), {**result, "update-norm": squared**0.5}


def _keep_updates(
    context: Context,
    server_round: int,
    updates: dict[int, ArrayRecord],
    train_losses: dict[int, float],
) -> None:
    """Replace the node's kept updates (and their training losses) with this round's."""
    for key in [key for key in context.state if key.startswith(KEPT_UPDATE_PREFIX)]:
        del context.state[key]
    for model_index, update in updates.items():
        context.state[f"{KEPT_UPDATE_PREFIX}{model_index}"] = update
    context.state[KEPT_ROUND_KEY] = ConfigRecord(
        {
            "server-round": server_round,
            **{f"train-loss-{index}": loss for index, loss in train_losses.items()},
        }
    )


def _kept_update(
    context: Context, server_round: int, model_index: int
) -> tuple[ArrayRecord, float]:
    """This round's kept update of ``model_index`` and its training loss.

    Raises
    ------
    ValueError
        If the node has no kept update of that model (its state was lost, e.g.
        it restarted) or only an older round's: a stale update is never sent.
    """
    kept_round = context.state.get(KEPT_ROUND_KEY)
    update = context.state.get(f"{KEPT_UPDATE_PREFIX}{model_index}")
    if not isinstance(kept_round, ConfigRecord) or not isinstance(update, ArrayRecord):
        raise ValueError(
            f"no kept update of model {model_index} for round {server_round} "
            "(node state lost, e.g. the node restarted)"
        )
    kept_server_round = int(kept_round["server-round"])  # type: ignore[arg-type]
    if kept_server_round != server_round:
        raise ValueError(
            f"kept update is from round {kept_server_round}, not "
            f"{server_round}; a stale update is never sent"
        )
    return update, float(kept_round[f"train-loss-{model_index}"])  # type: ignore[arg-type]


def _reply(message: Message, metrics: Mapping[str, float]) -> Message:
    return Message(
        RecordDict({"metrics": MetricRecord(dict(metrics))}), reply_to=message
    )


def make_norm_handler(task_factory: ModelTaskFactory) -> ClientHandler:
    """``query.norm``: train every received model, keep the updates, send norms."""

    def query_norm(message: Message, context: Context) -> Message:
        server_round = server_round_of(message)
        updates: dict[int, ArrayRecord] = {}
        train_losses: dict[int, float] = {}
        metrics: dict[str, float] = {}
        for model_index, global_model in received_models(message).items():
            task = task_factory(context, model_index)
            updates[model_index], result = local_update(
                task, global_model, server_round
            )
            metrics[f"update-norm-{model_index}"] = result["update-norm"]
            train_losses[model_index] = result["train-loss"]
            metrics[f"train-loss-{model_index}"] = result["train-loss"]
            metrics[f"num-examples-{model_index}"] = len(task.x)
        _keep_updates(context, server_round, updates, train_losses)
        return _reply(message, metrics)

    return query_norm


def make_loss_handler(task_factory: ModelTaskFactory) -> ClientHandler:
    """``query.loss``: each received model's mean loss on its local data."""

    def query_loss(message: Message, context: Context) -> Message:
        metrics: dict[str, float] = {}
        for model_index, global_model in received_models(message).items():
            task = task_factory(context, model_index)
            task.model.load_state_dict(global_model.to_torch_state_dict())
            loss = evaluate(task.model, task.x, task.y, task.objective)["loss"]
            metrics[f"loss-{model_index}"] = loss
            metrics[f"num-examples-{model_index}"] = len(task.x)
        return _reply(message, metrics)

    return query_loss


def make_sizes_handler(task_factory: ModelTaskFactory) -> ClientHandler:
    """``query.sizes``: the local sample count of each of ``num-models`` tasks."""

    def query_sizes(message: Message, context: Context) -> Message:
        num_models = int(config_number(message, "num-models"))
        metrics: dict[str, float] = {
            f"num-examples-{model_index}": len(task_factory(context, model_index).x)
            for model_index in range(num_models)
        }
        return _reply(message, metrics)

    return query_sizes


def make_update_train_handler(task_factory: ModelTaskFactory) -> ClientHandler:
    """``train``: send the kept update of ``model-index``, or train it now."""

    def train(message: Message, context: Context) -> Message:
        server_round = server_round_of(message)
        model_index = int(config_number(message, "model-index"))
        task = task_factory(context, model_index)
        config = message.content.config_records.get("config", ConfigRecord())
        if config.get("kept-update", False):
            update, train_loss = _kept_update(context, server_round, model_index)
        else:
            global_model = received_models(message).get(model_index)
            if global_model is None:
                raise ValueError(f"the message lacks {model_record_name(model_index)}")
            update, result = local_update(task, global_model, server_round)
            train_loss = result["train-loss"]
        metrics: dict[str, int | float | list[int] | list[float]] = {
            "num-examples": len(task.x),
            "train-loss": train_loss,
            "model-index": model_index,
        }
        content = RecordDict({UPDATE_RECORD: update, "metrics": MetricRecord(metrics)})
        return Message(content, reply_to=message)

    return train


def make_mmfl_handlers(task_factory: ModelTaskFactory) -> dict[str, ClientHandler]:
    """All handlers of the multi-model contract, keyed by message type."""
    return {
        "query.norm": make_norm_handler(task_factory),
        "query.loss": make_loss_handler(task_factory),
        "query.sizes": make_sizes_handler(task_factory),
        "train": make_update_train_handler(task_factory),
    }


def make_ocs_handlers(task_factory: TaskFactory) -> dict[str, ClientHandler]:
    """Single-model OCS: the multi-model contract with one model, plus evaluate."""

    def single_task(context: Context, model_index: int) -> LocalTask:
        if model_index != 0:
            raise ValueError(f"single-model task asked for model {model_index}")
        return task_factory(context)

    return {
        "query.norm": make_norm_handler(single_task),
        "train": make_update_train_handler(single_task),
        "evaluate": make_evaluate_handler(task_factory),
    }
