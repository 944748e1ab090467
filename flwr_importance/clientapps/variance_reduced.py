"""Optimal variance-reduced sampling on the client (OCS, AOCS and MMFL).

One client side serves the single-model strategy
(:class:`~flwr_importance.strategies.ocs.OptimalClientSampling`, the case
``S = 1``) and the multi-model one
(:class:`~flwr_importance.strategies.mmfl.MultiModelSampling`); their
``Client contract`` sections give the messages (``query.norm``,
``query.loss``, ``query.sizes``, ``train``) and the replies. In short, the
node trains at ``query.norm``, keeps each update in ``context.state`` under
the round's number and replies its norm; the round's ``train`` then sends
the kept update, or raises when it is missing or stale (a node that
restarted and lost its state), which Flower turns into an error reply the
strategy skips.

Your own ``@app.train()`` meets this contract unchanged: the query handlers
run it once per model on a message shaped like Flower's FedAvg train message
(the model under ``"arrays"``, the server's config, ``lr`` included, under
``"config"``, plus ``model-index``), and :class:`KeptUpdateMod` turns its
reply (the trained model, ``num-examples`` and a train loss) into the update
reply. With Flower's quickstart::

     app = ClientApp()

    -@app.train()
    +@app.train(mods=[KeptUpdateMod(train_loss_key="train_loss")])
     def train(msg, context):
         ...  # unchanged: load the model, train with your optimizer, reply

    +add_norm_query(app, train, train_loss_key="train_loss")

For MMFL, ``train`` picks its model and data by
``msg.content["config"]["model-index"]``; the loss variant adds
``add_loss_query(app, evaluate, loss_key="eval_loss")`` (:mod:`.loss`, on
your ``@app.evaluate()`` function), the baselines
``add_model_sizes_query(app, num_examples=...)``. The helpers never touch
the model: they read and write ArrayRecords (NumPy, no torch import), and the
user's functions train, so they serve any framework's ClientApp; only the
ready-made ``make_*_handlers`` load torch, when called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import ClientAppCallable

from flwr_importance import protocol
from flwr_importance.clientapps.loss import loss_query_handler
from flwr_importance.clientapps.messages import (
    ClientHandler,
    config_number,
    message_config,
    metrics_reply,
    server_round_of,
)
from flwr_importance.clientapps.sizes import checked_sample_count
from flwr_importance.clientapps.user_functions import (
    message_for_user,
    metric_number,
    received_models,
    user_reply_metrics,
)

if TYPE_CHECKING:
    from flwr_importance.clientapps.local_task import LocalTask, TaskFactory

#: ``(context, model_index) -> LocalTask``: a node's task for each model.
ModelTaskFactory = Callable[[Context, int], "LocalTask"]

#: ``(context, model_index) -> n``: the node's sample count for each model.
ModelSampleCount = Callable[[Context, int], int]

#: ``context.state`` key of the ConfigRecord saying which round the kept
#: updates belong to; update ``s`` is under ``KEPT_UPDATE_PREFIX<s>``, the
#: metrics of its train reply under ``KEPT_METRICS_PREFIX<s>``.
KEPT_ROUND_KEY = "optimal-kept-round"
KEPT_UPDATE_PREFIX = "optimal-kept-update-"
KEPT_METRICS_PREFIX = "optimal-kept-metrics-"


def model_update(global_model: ArrayRecord, local_model: ArrayRecord) -> ArrayRecord:
    """``U = w_local - w_global``, array by array, in float64.

    The difference is taken in the models' own dtype, then widened, so the
    update is exactly what the local training moved.

    Raises
    ------
    ValueError
        If the two records do not have the same keys (in order) and shapes.

    Examples
    --------
    >>> import numpy as np
    >>> start = ArrayRecord([np.array([1.0, 2.0], dtype=np.float32)])
    >>> trained = ArrayRecord([np.array([1.5, 1.0], dtype=np.float32)])
    >>> model_update(start, trained).to_numpy_ndarrays()[0]
    array([ 0.5, -1. ])

    A 0-d array (a BatchNorm's ``num_batches_tracked``) stays an array:

    >>> counts = ArrayRecord([np.array(3)]), ArrayRecord([np.array(5)])
    >>> model_update(*counts).to_numpy_ndarrays()[0]
    array(2.)
    """
    if list(global_model) != list(local_model):
        raise ValueError(
            f"the trained model's arrays {list(local_model)} are not the received "
            f"model's {list(global_model)}"
        )
    update: dict[str, Array] = {}
    for key, start in global_model.items():
        start_values, local_values = start.numpy(), local_model[key].numpy()
        if start_values.shape != local_values.shape:
            raise ValueError(
                f"'{key}': trained shape {local_values.shape}, received "
                f"{start_values.shape}"
            )
        # asarray: a 0-d difference (BatchNorm's num_batches_tracked) is a
        # NumPy scalar, which Array refuses.
        update[key] = Array(np.asarray(local_values - start_values, dtype=np.float64))
    return ArrayRecord(update)


def update_norm(update: ArrayRecord) -> float:
    """``||U||``: the Euclidean norm over all arrays of the update.

    Examples
    --------
    >>> import numpy as np
    >>> update_norm(ArrayRecord([np.array([3.0]), np.array([[4.0]])]))
    5.0
    """
    squared = sum(float(np.sum(np.square(array.numpy()))) for array in update.values())
    return squared**0.5


def _train_update(
    train_fn: ClientAppCallable,
    message: Message,
    context: Context,
    model_index: int,
    global_model: ArrayRecord,
    train_loss_key: str,
) -> tuple[ArrayRecord, MetricRecord]:
    """Run the user's train on model ``s``: the update and the reply's metrics.

    The metrics are the user's, plus ``model-index`` and ``train-loss``
    (copied from ``train_loss_key`` when the user's train reports it: the
    strategy only averages it into the round's metrics).
    """
    reply = train_fn(
        message_for_user(message, MessageType.TRAIN, global_model, model_index),
        context,
    )
    metrics = user_reply_metrics(reply, [protocol.NUM_EXAMPLES], "train")
    local_models = list(reply.content.array_records.values())
    if len(local_models) != 1:
        raise ValueError(
            f"{protocol.CLIENT_SIDE_MISCONFIGURED}: the train reply has "
            f"{len(local_models)} ArrayRecords, not 1 (the model)"
        )
    strategy_metrics = MetricRecord({**metrics, protocol.MODEL_INDEX: model_index})
    if train_loss_key in metrics:
        strategy_metrics[protocol.TRAIN_LOSS] = metric_number(metrics, train_loss_key)
    return model_update(global_model, local_models[0]), strategy_metrics


def _keep_updates(
    context: Context,
    server_round: int,
    kept: dict[int, tuple[ArrayRecord, MetricRecord]],
) -> None:
    """Replace the node's kept updates (and their reply metrics) with this round's."""
    stale = [
        key
        for key in context.state
        if key.startswith((KEPT_UPDATE_PREFIX, KEPT_METRICS_PREFIX))
    ]
    for key in stale:
        del context.state[key]
    for model_index, (update, metrics) in kept.items():
        context.state[f"{KEPT_UPDATE_PREFIX}{model_index}"] = update
        context.state[f"{KEPT_METRICS_PREFIX}{model_index}"] = metrics
    context.state[KEPT_ROUND_KEY] = ConfigRecord({protocol.SERVER_ROUND: server_round})


def kept_update(
    context: Context, server_round: int, model_index: int
) -> tuple[ArrayRecord, MetricRecord]:
    """The round's kept update of ``model_index`` and its reply metrics.

    Raises
    ------
    ValueError
        If the node has no kept update of that model (its state was lost, e.g.
        it restarted) or only an older round's: a stale update is never sent.
    """
    kept_round = context.state.get(KEPT_ROUND_KEY)
    update = context.state.get(f"{KEPT_UPDATE_PREFIX}{model_index}")
    metrics = context.state.get(f"{KEPT_METRICS_PREFIX}{model_index}")
    if not (
        isinstance(kept_round, ConfigRecord)
        and isinstance(update, ArrayRecord)
        and isinstance(metrics, MetricRecord)
    ):
        raise ValueError(
            f"no kept update of model {model_index} for round {server_round} "
            "(node state lost, e.g. the node restarted)"
        )
    kept_server_round = int(kept_round[protocol.SERVER_ROUND])  # type: ignore[arg-type]
    if kept_server_round != server_round:
        raise ValueError(
            f"kept update is from round {kept_server_round}, not "
            f"{server_round}; a stale update is never sent"
        )
    return update, metrics


class KeptUpdateMod:
    """Mod around the user's ``@app.train()`` for OCS, AOCS and MMFL train messages.

    A train message of these strategies either asks for the update kept at
    this round's ``query.norm`` (``kept-update = true``, no model attached):
    the mod replies it without calling the train function; or carries
    ``model-<s>`` to train now (MMFL's loss variant and baselines): the mod
    hands the train function a FedAvg-shaped message (the model under
    ``"arrays"``, the config with ``model-index``) and turns its reply into
    the update ``w_local - w_s``. Other messages (no ``kept-update`` in the
    config, or not ``train``) pass through untouched.

    Parameters
    ----------
    train_loss_key : str (default: ``"train-loss"``)
        The metric of the train function's reply holding its training loss
        (Flower's quickstart replies ``"train_loss"``), passed on as the
        round's ``train-loss`` when the reply has it; the reply must carry
        ``num-examples``.

    Examples
    --------
    Put the mod on the train function only (or on the whole app)::

        app = ClientApp()

        @app.train(mods=[KeptUpdateMod(train_loss_key="train_loss")])
        def train(msg, context): ...

        add_norm_query(app, train, train_loss_key="train_loss")
    """

    def __init__(self, *, train_loss_key: str = protocol.TRAIN_LOSS) -> None:
        self.train_loss_key = train_loss_key

    def __call__(
        self, message: Message, context: Context, call_next: ClientAppCallable
    ) -> Message:
        """Serve an OCS/MMFL train message; pass anything else to ``call_next``."""
        if message.metadata.message_type != MessageType.TRAIN or not any(
            protocol.KEPT_UPDATE in config
            for config in message.content.config_records.values()
        ):
            return call_next(message, context)
        config = message_config(message)
        server_round = server_round_of(message)
        model_index = int(config_number(message, protocol.MODEL_INDEX))
        if config[protocol.KEPT_UPDATE]:
            update, metrics = kept_update(context, server_round, model_index)
        else:
            global_model = received_models(message).get(model_index)
            if global_model is None:
                raise ValueError(
                    f"the message lacks {protocol.model_record_name(model_index)}"
                )
            update, metrics = _train_update(
                call_next,
                message,
                context,
                model_index,
                global_model,
                self.train_loss_key,
            )
        content = RecordDict(
            {protocol.UPDATE_RECORD: update, protocol.METRIC_RECORD: metrics}
        )
        return Message(content, reply_to=message)


def norm_query_handler(
    train_fn: ClientAppCallable, *, train_loss_key: str = protocol.TRAIN_LOSS
) -> ClientHandler:
    """The ``query.norm`` handler: run ``train_fn`` per model, keep, reply norms.

    Every queried node trains, sampled or not: the norm of the update it would
    send is what the server's probabilities need. The update stays in
    ``context.state`` until the round's train message asks for it.

    Parameters
    ----------
    train_fn : callable
        The user's train function, ``(msg, context) -> reply`` with the trained
        model as its one ArrayRecord and ``num-examples`` and the train loss
        in its one MetricRecord.
    train_loss_key : str (default: ``"train-loss"``)
        The reply metric holding the training loss, if the reply has one.
    """

    def query_norm(message: Message, context: Context) -> Message:
        kept: dict[int, tuple[ArrayRecord, MetricRecord]] = {}
        reply: dict[str, float] = {}
        for model_index, global_model in received_models(message).items():
            update, metrics = _train_update(
                train_fn, message, context, model_index, global_model, train_loss_key
            )
            kept[model_index] = (update, metrics)
            reply[protocol.per_model_key(protocol.UPDATE_NORM, model_index)] = (
                update_norm(update)
            )
            for key in (protocol.NUM_EXAMPLES, protocol.TRAIN_LOSS):
                if key in metrics:  # the train loss only where the user's has one
                    reply[protocol.per_model_key(key, model_index)] = metric_number(
                        metrics, key
                    )
        _keep_updates(context, server_round_of(message), kept)
        return metrics_reply(message, reply)

    return query_norm


def add_norm_query(
    app: ClientApp,
    train_fn: ClientAppCallable,
    *,
    train_loss_key: str = protocol.TRAIN_LOSS,
) -> None:
    """Register ``@app.query("norm")``, answered by running ``train_fn``.

    Pair it with :class:`KeptUpdateMod` on the train function, which sends the
    kept update when the node is sampled. Every node trains once per round in
    the query (sampled or not); the sampled ones then upload what they kept.

    Parameters
    ----------
    app : ClientApp
        The user's app.
    train_fn : callable
        The user's train function (what ``@app.train()`` decorated).
    train_loss_key : str (default: ``"train-loss"``)
        The metric of its reply holding the training loss, if it reports one
        (quickstart: ``"train_loss"``).
    """
    app.query(protocol.NORM_QUERY)(
        norm_query_handler(train_fn, train_loss_key=train_loss_key)
    )


def model_sizes_query_handler(num_examples: ModelSampleCount) -> ClientHandler:
    """The ``query.sizes`` handler of MMFL: ``num-examples-<s>`` per model.

    Parameters
    ----------
    num_examples : callable
        ``(context, model_index) -> n``, the node's sample count for task ``s``.
    """

    def query_sizes(message: Message, context: Context) -> Message:
        num_models = int(config_number(message, protocol.NUM_MODELS))
        reply: dict[str, float] = {
            protocol.per_model_key(
                protocol.NUM_EXAMPLES, model_index
            ): checked_sample_count(
                num_examples(context, model_index), source="num_examples"
            )
            for model_index in range(num_models)
        }
        return metrics_reply(message, reply)

    return query_sizes


def add_model_sizes_query(app: ClientApp, *, num_examples: ModelSampleCount) -> None:
    """Register MMFL's ``@app.query("sizes")`` (its random and round-robin baselines).

    Examples
    --------
    >>> from flwr.clientapp import ClientApp
    >>> app = ClientApp()
    >>> add_model_sizes_query(app, num_examples=lambda context, model_index: 600)
    """
    app.query(protocol.SIZES_QUERY)(model_sizes_query_handler(num_examples))


def _for_model(
    make_handler: Callable[[TaskFactory], ClientHandler],
    task_factory: ModelTaskFactory,
) -> ClientHandler:
    """A ready-made FedAvg handler on the task of the message's ``model-index``."""

    def handler(message: Message, context: Context) -> Message:
        model_index = int(config_number(message, protocol.MODEL_INDEX, 0))
        return make_handler(lambda ctx: task_factory(ctx, model_index))(
            message, context
        )

    return handler


def _with_mod(mod: KeptUpdateMod, handler: ClientHandler) -> ClientHandler:
    """``handler`` behind ``mod``, as ``@app.train(mods=[mod])`` would register it."""
    return lambda message, context: mod(message, context, handler)


def make_mmfl_handlers(task_factory: ModelTaskFactory) -> dict[str, ClientHandler]:
    """All handlers of the multi-model contract, keyed by message type.

    Built on the helpers above: FedAvg's ready-made train and evaluate handlers
    on task ``s`` play the user's functions.
    """
    # The ready-made handlers train torch models; the helpers above do not.
    from flwr_importance.clientapps.local_task import (
        make_evaluate_handler,
        make_train_handler,
    )

    train = _for_model(make_train_handler, task_factory)
    evaluate = _for_model(make_evaluate_handler, task_factory)
    return {
        protocol.query_message_type(protocol.NORM_QUERY): norm_query_handler(train),
        protocol.query_message_type(protocol.LOSS_QUERY): loss_query_handler(evaluate),
        protocol.query_message_type(protocol.SIZES_QUERY): model_sizes_query_handler(
            lambda context, model_index: len(task_factory(context, model_index).x)
        ),
        MessageType.TRAIN: _with_mod(KeptUpdateMod(), train),
    }


def make_ocs_handlers(task_factory: TaskFactory) -> dict[str, ClientHandler]:
    """Single-model OCS: the multi-model contract with one model, plus evaluate."""
    from flwr_importance.clientapps.local_task import make_evaluate_handler

    def single_task(context: Context, model_index: int) -> LocalTask:
        if model_index != 0:
            raise ValueError(f"single-model task asked for model {model_index}")
        return task_factory(context)

    handlers = make_mmfl_handlers(single_task)
    return {
        protocol.query_message_type(protocol.NORM_QUERY): handlers[
            protocol.query_message_type(protocol.NORM_QUERY)
        ],
        MessageType.TRAIN: handlers[MessageType.TRAIN],
        MessageType.EVALUATE: make_evaluate_handler(task_factory),
    }
